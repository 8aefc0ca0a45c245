"""A training step's rollout: prompts -> scored, masked groups -> one batch.

Layer: rl; may import agent, data, models, rewards, tpu, storage and cli.

  sampler = step_rollout.make_sampler(config, model, tokenizer)
  rollout = step_rollout.StepRollout(config, sampler, reward_set, stage)
  batch = rollout(prompts, step, kl_coeff, more_prompts)  # RolloutBatch

One call samples G completions per prompt (`rollout.Rollout`, or with
tools or an environment `episodes.EpisodeRollout`), scores them with the
reward set (which owns the run's judge), masks what the loss must not see
and returns a `RolloutBatch`: the host update batch (rewards; the update
computes the advantages, `grpo.prepare`), its sequences staged on the mesh
(`staging`), the step's scalars and its sample texts. The log-prob passes
need no reward: they are dispatched before scoring, so they run on the
devices while the host scores. With grpo.dynamic_sampling the call samples
further batches from `more_prompts` until enough groups have a reward
spread (dynamic_sampling.py).

Several processes: the prompt rows are gathered so that every process
holds the whole batch, in the order one process would have read it; the
sampler runs once over the mesh and every process decodes and scores only
its own rows. Groups never straddle processes; step scalars are means over
every process's rows. With dynamic sampling every process keeps every
sampled row and gathers every process's rewards, so all take the same
decision to draw more prompts.
"""

import dataclasses
import json

import jax
import numpy as np

from agent_tunix.data import prompts as prompts_lib
from agent_tunix.rl import dynamic_sampling
from agent_tunix.rl import episode_stats
from agent_tunix.rl import episodes
from agent_tunix.rl import grpo
from agent_tunix.rl import rollout as rollout_lib
from agent_tunix.rl import staging
from agent_tunix.tpu import sharding


def step_seed(base_seed, step, sampling_round=0):
  """Sampling seed of a step (and round): independent of restarts.

  Round 0 is the step's first batch; dynamic sampling's further batches of
  the step are rounds 1, 2, ...
  """
  entropy = [base_seed, step] + ([sampling_round] if sampling_round else [])
  return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def make_sampler(config, model, tokenizer):
  """The run's sampler: a `rollout.Rollout`, wrapped in an
  `episodes.EpisodeRollout` when the config samples episodes (tools)."""
  gen = config.generation
  sampler = rollout_lib.Rollout(
      model, tokenizer, gen.kv_cache_size,
      cpu_decode_graph=gen.cpu_decode_graph,
      stop_sequences=rollout_lib.stop_sequences_from_config(config),
      decode_chunk_steps=gen.decode_chunk_steps,
      shared_prefix=gen.shared_prefix,
  )
  if episodes.enabled(config):
    sampler = episodes.from_config(config, sampler)
  return sampler


@dataclasses.dataclass(frozen=True)
class RolloutBatch:
  """What a step's rollout hands the update and the books.

  Attributes:
    update: the `grpo.UpdateBatch` of this process's rows, host arrays.
    staged: its sequences on the mesh with the log-prob passes dispatched
      (`staging.StagedBatch`).
    scalars: per-step scalars over all processes' rows.
    reward_means: {reward name: mean unweighted score} over all processes'
      rows (the names as the reward set and the bonus give them; the
      metrics writer makes tags of them).
    samples: (prompts, texts, total rewards) of this process's rows, for
      the sample texts.
    gen_tokens: completion tokens over all processes.
  """

  update: grpo.UpdateBatch
  staged: staging.StagedBatch
  scalars: dict[str, float]
  reward_means: dict[str, float]
  samples: tuple[list, list, object]
  gen_tokens: int


class _SingleTurn:
  """What a step adds to single-turn completions: nothing."""

  def generate_args(self, batch):
    del batch
    return {}

  def reward_fields(self, completions):
    del completions
    return {}

  def with_bonus(self, completions, total, per_fn):
    del completions
    return total, per_fn

  def trained(self, completions):
    return completions

  def sample_texts(self, completions):
    return completions.texts

  def scalars(self, completions, gathered):
    del completions, gathered
    return {}


@dataclasses.dataclass(frozen=True)
class _Episodes:
  """What a step adds to episodes (config.agent): examples for the
  environments, transcripts and calls for the rewards, the tool-use bonus,
  no loss on cut episodes (cut_episodes='mask'), agent/* scalars."""

  tool_use_bonus: float
  mask_cut: bool

  def generate_args(self, batch):
    """Every row's episode starts from its example (question, answer)."""
    questions = sharding.gather_texts([str(q) for q in batch['question']])
    answers = sharding.gather_texts([str(a) for a in batch['answer']])
    return {'examples': [{'question': q, 'answer': a}
                         for q, a in zip(questions, answers)]}

  def reward_fields(self, completions):
    return {'transcript': [e.transcript for e in completions.episodes],
            'tool_calls': [e.tool_calls for e in completions.episodes]}

  def with_bonus(self, completions, total, per_fn):
    """agent.tool_use_bonus added (logged as reward/tool_use_bonus)."""
    if self.tool_use_bonus <= 0:
      return total, per_fn
    bonus = episode_stats.tool_use_bonus(completions.episodes,
                                         self.tool_use_bonus)
    per_fn['tool_use_bonus'] = bonus
    return np.asarray(total, np.float32) + bonus, per_fn

  def trained(self, completions):
    """No loss on episodes a limit ended, with cut_episodes='mask' (their
    rewards still count)."""
    if not self.mask_cut:
      return completions
    mask = np.where(completions.truncated[:, None], 0.0, completions.mask)
    return dataclasses.replace(completions, mask=mask.astype(np.float32))

  def sample_texts(self, completions):
    return [e.transcript for e in completions.episodes]

  def scalars(self, completions, gathered):
    """agent/* scalars of `completions` (a list); gathered: they hold
    every process's rows already, else this process's."""
    rows = episode_stats.row_stats(
        [e for c in completions for e in c.episodes])
    return episode_stats.scalars(
        rows if gathered else sharding.allgather_concat(rows))


def _row_kind(config):
  if episodes.enabled(config):
    return _Episodes(float(config.agent.tool_use_bonus),
                     config.agent.cut_episodes == 'mask')
  return _SingleTurn()


@dataclasses.dataclass(frozen=True)
class StepRollout:
  """Samples, scores and masks a step's groups (see the module docstring).

  Attributes:
    config: the run's config.
    sampler: `make_sampler`'s.
    reward_set: the run's `rewards.RewardSet` (its judge included).
    stage: sequences -> `staging.StagedBatch` (the run's model and mesh).
    row_kind: what a step adds to the sampler's rows (episodes: tools).
  """

  config: object
  sampler: object
  reward_set: object
  stage: object
  row_kind: object

  @classmethod
  def from_config(cls, config, sampler, reward_set, stage):
    return cls(config, sampler, reward_set, stage, _row_kind(config))

  def __call__(self, batch, step, kl_coeff, more_prompts):
    """The `RolloutBatch` of step `step` from this process's `batch` of
    prompts (pipeline layout); dynamic sampling draws from `more_prompts`
    (an iterator of such batches)."""
    if self.config.grpo.dynamic_sampling:
      return self._dynamic(batch, step, kl_coeff, more_prompts)
    return self._one_batch(batch, step, kl_coeff)

  def _sample(self, batch, seed, every_row):
    """(Every process's prompt tokens, the sampled rows: every row when
    `every_row`, else this process's, and this process's rows of them)."""
    gen = self.config.generation
    g = self.config.grpo.num_generations
    prompt_tokens = sharding.gather_rows(batch['prompt_tokens'])
    local_rows = sharding.own_rows(len(prompt_tokens), g)
    sampled = self.sampler.generate(
        prompt_tokens, gen.max_generation_steps, seed, gen.temperature,
        gen.top_k, gen.top_p, rows=None if every_row else local_rows,
        num_generations=g, **self.row_kind.generate_args(batch))
    return prompt_tokens, sampled, (sampled.subset(local_rows) if every_row
                                    else sampled)

  def _score(self, rows, completions):
    """(total, per_fn, samples) of this process's `completions` of the
    prompt rows `rows` (repeated G times)."""
    config = self.config
    kind = self.row_kind
    fields = _example_fields(config, rows)
    fields.update(kind.reward_fields(completions))
    total, per_fn = self.reward_set.score_groups(
        list(rows['prompt']),
        prompts_lib.scored_texts(completions.texts, config),
        config.grpo.num_generations,
        answer=list(rows['answer']),
        question=list(rows['question']),
        reasoning=list(rows.get('reasoning', [''] * len(rows['question']))),
        completion_lengths=completions.lengths.tolist(),
        completion_tokens=[row[m > 0].tolist() for row, m in
                           zip(completions.tokens, completions.mask)],
        **fields,
    )
    total, per_fn = kind.with_bonus(completions, total, per_fn)
    texts = self.reward_set.annotate(kind.sample_texts(completions))
    return total, per_fn, (list(rows['prompt']), texts, total)

  def _one_batch(self, batch, step, kl_coeff):
    """Samples G completions per prompt and scores this process's rows."""
    config = self.config
    g = config.grpo.num_generations
    rows = rollout_lib.repeat_groups(batch, g)
    _, sampled, _ = self._sample(batch, step_seed(config.training.seed, step),
                             every_row=False)
    sequences = grpo.Sequences(
        tokens=np.concatenate([rows['prompt_tokens'], sampled.tokens], axis=1),
        input_mask=np.concatenate(
            [rows['prompt_mask'], sampled.attended > 0], axis=1),
        completion_mask=self.row_kind.trained(sampled).mask,
        # The update logs sampler/logp_abs_diff from these.
        sampler_logps=sampled.logps,
    )
    staged = self.stage(sequences)  # Runs while the host scores.
    total, per_fn, samples = self._score(rows, sampled)
    scalars, means, gen_tokens = _row_scalars(sharding.allgather_concat(
        _reward_rows(total, per_fn, sampled.lengths, sampled.truncated)), g)
    scalars.update(self.row_kind.scalars([sampled], gathered=False))
    update = grpo.update_batch(config, sequences, total, kl_coeff)
    return RolloutBatch(update, staged, scalars, means, samples, gen_tokens)

  def _round(self, batch, step, sampling_round):
    """One batch of prompts sampled and scored for dynamic sampling: every
    process's sampled rows and rewards (`dynamic_sampling.Round`)."""
    config = self.config
    g = config.grpo.num_generations
    prompt_mask = sharding.gather_rows(batch['prompt_mask'])
    prompt_tokens, sampled, local = self._sample(
        batch, step_seed(config.training.seed, step, sampling_round),
        every_row=True)
    total, per_fn, samples = self._score(
        rollout_lib.repeat_groups(batch, g), local)
    names = list(per_fn)
    local = np.stack([total] + [per_fn[k] for k in names], axis=-1)
    every = sharding.gather_rows(
        local.astype(np.float32).reshape(len(batch['prompt_tokens']), g, -1))
    return dynamic_sampling.Round(
        prompt_tokens=prompt_tokens,
        prompt_mask=prompt_mask,
        completions=self.row_kind.trained(sampled),
        group_rewards=every[..., 0],
        per_fn={k: every[..., i + 1].reshape(-1) for i, k in enumerate(names)},
        samples=samples,
    )

  def _dynamic(self, batch, step, kl_coeff, more_prompts):
    """Rounds until enough groups have a reward spread; the scalars cover
    every completion sampled in the step, plus dynamic_sampling/ counts."""
    config = self.config
    g = config.grpo.num_generations
    batch_size = config.training.batch_size
    rounds, selection = dynamic_sampling.collect(
        batch, lambda: next(more_prompts),
        lambda b, r: self._round(b, step, r), batch_size,
        config.grpo.max_sampling_rounds)
    assembled = dynamic_sampling.assemble(
        rounds, selection,
        dynamic_sampling.own_places(batch_size, jax.process_index(),
                                    jax.process_count()),
        g)
    update = grpo.update_batch(config, assembled.sequences,
                               assembled.rewards, kl_coeff)
    scalars, means, gen_tokens = _row_scalars(_concatenated([
        _reward_rows(r.group_rewards.reshape(-1), r.per_fn,
                     r.completions.lengths, r.completions.truncated)
        for r in rounds]), g)
    scalars.update(dynamic_sampling.step_scalars(selection, batch_size))
    scalars.update(self.row_kind.scalars([r.completions for r in rounds],
                                      gathered=True))
    samples = tuple(
        [x for r in rounds for x in r.samples[i]] for i in range(3))
    # The rows are chosen by their rewards: staged once they are known.
    return RolloutBatch(update, self.stage(update.sequences), scalars,
                        means, samples, gen_tokens)


def _example_fields(config, rows):
  """Per-row reward fields of rubric rows: `rubric` (items), `reference`."""
  if config.data.task != 'rubric':
    return {}
  return {'rubric': [json.loads(r) for r in rows['rubric']],
          'reference': [str(r) for r in rows['reference']]}


def _reward_rows(total, per_fn, lengths, truncated):
  """The per-row numbers the reward and length scalars are computed from."""
  return {
      'total': np.asarray(total, np.float32),
      'per_fn': {k: np.asarray(v, np.float32) for k, v in per_fn.items()},
      'lengths': np.asarray(lengths),
      'truncated': np.asarray(truncated, np.float32),
  }


def _concatenated(parts):
  """`_reward_rows` of several rounds as one."""
  return {
      'total': np.concatenate([p['total'] for p in parts]),
      'per_fn': {k: np.concatenate([p['per_fn'][k] for p in parts])
                 for k in parts[0]['per_fn']},
      'lengths': np.concatenate([p['lengths'] for p in parts]),
      'truncated': np.concatenate([p['truncated'] for p in parts]),
  }


def _row_scalars(rows, g):
  """(Reward and length scalars, each reward's mean, completion tokens) of
  gathered rows."""
  total = rows['total']
  grouped = total.reshape(-1, g)
  scalars = {
      'reward/mean': float(total.mean()),
      'reward/std': float(total.std()),
      'frac_reward_zero_std': float((grouped.std(axis=1) == 0).mean()),
      'completion/mean_length': float(rows['lengths'].mean()),
      'completion/clipped_ratio': float(rows['truncated'].mean()),
  }
  means = {name: float(v.mean()) for name, v in rows['per_fn'].items()}
  return scalars, means, int(rows['lengths'].sum())
