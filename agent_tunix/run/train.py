"""The GRPO train loop: mesh -> models -> data -> restore -> steps.

Each step: a batch of prompts -> G sampled completions each (rollout) ->
reference log-probs (if beta > 0) dispatched to the devices -> rewards on
the host meanwhile -> group-relative advantages -> num_iterations jitted
LoRA updates -> metrics, checkpoint, evaluation. The math lives in grpo.py;
this module only wires the pieces and keeps the books.

Reproducibility: the sampling seed of step s is derived from
(training.seed, s) (and the round, for dynamic sampling's extra batches:
dynamic_sampling.py) and everything else that changes between steps (LoRA
params, optimizer state, data iterator) is checkpointed, so a run resumed
from step k repeats the uninterrupted run step for step.

Several processes (multi-host): every process runs this same loop on global
arrays. Each reads its own share of every batch. For the rollout the prompt
rows are gathered so that every process holds the whole batch, in the order
one process would have read it; the sampler then runs once, sharded over
the mesh like the update (not once per host), and every process decodes and
scores only its own rows. Groups of G completions never straddle processes,
so advantages are computed locally. The update batch is assembled from the
processes' rows (`sharding.shard_batch`); step scalars are means over all
processes' rows. Gathering the prompts and the sampled token ids costs a
host all-gather of a few integers per row; in exchange the sampled batch,
and so the run, does not depend on the number of processes. Only process 0
writes metric files and logs sample texts; checkpoints are written by all
processes together (Orbax). With grpo.dynamic_sampling every process keeps
every sampled row and gathers every process's rewards, so all take the same
decision to draw more prompts and assemble their share of the chosen groups
(`rollout_dynamic`, dynamic_sampling.py).
"""

import contextlib
import dataclasses
import time

from absl import logging
from flax import nnx
import grain
import jax
import ml_collections
import numpy as np
import optax
import sentencepiece as spm

from agent_tunix import models
from agent_tunix import rewards
from agent_tunix.config import validation
from agent_tunix.judge import judge as judge_lib
from agent_tunix.data import pipeline
from agent_tunix.data import prompts
from agent_tunix.models import families
from agent_tunix.models import gemma4 as gemma4_lib
from agent_tunix.models import tokenizer as tokenizer_lib
from agent_tunix.observe import machine
from agent_tunix.observe import metrics as metrics_lib
from agent_tunix.rl import dynamic_sampling
from agent_tunix.rl import episode_stats
from agent_tunix.rl import episodes
from agent_tunix.rl import evaluation
from agent_tunix.rl import grpo
from agent_tunix.rl import objectives
from agent_tunix.rl import optimizer as optimizer_lib
from agent_tunix.rl import rollout
from agent_tunix.run import alarms as alarms_lib
from agent_tunix.run import checkpoint
from agent_tunix.run import divergence
from agent_tunix.run import full_disk
from agent_tunix.run import judging
from agent_tunix.run import lock as run_lock
from agent_tunix.run import preemption
from agent_tunix.run import resolved_config
from agent_tunix.run import schedule as schedule_lib
from agent_tunix.storage import retries as storage_retries
from agent_tunix.tpu import sharding


@dataclasses.dataclass
class RunState:
  """What a run reassigns as it goes; the rest of its `Session` stays.

  Attributes:
    kl_coeff: the KL coefficient the next update uses (grpo.kl_target > 0
      adapts it; checkpointed in the step's meta).
    schedule: the learning-rate schedule; a resumed run keeps the span it
      started with (`resume_schedule`).
    span: the schedule's span (schedule_lib; saved in each step's meta);
      None: schedule_lib.first_span(config), which `setup` builds.
    alarms: made by `run`; its state is saved.
    last_batch: the last update batch on the mesh (for divergence checks).
    judge_masked_groups: groups masked since the last step's log.
  """

  kl_coeff: float
  schedule: optax.Schedule
  span: schedule_lib.Span | None = None
  alarms: alarms_lib.Monitor | None = None
  last_batch: grpo.UpdateBatch | None = None
  judge_masked_groups: int = 0


@dataclasses.dataclass(frozen=True)
class Session:
  """What a run builds once: model, tokenizer, data, optimizer, judge.

  The fields stay for the run (the model's and optimizer's arrays, the data
  iterator's position and the judge's cache change inside them); what the
  run reassigns is its `state`.
  """

  config: ml_collections.ConfigDict
  workdir: str
  mesh: jax.sharding.Mesh
  model: nnx.Module
  tokenizer: spm.SentencePieceProcessor | tokenizer_lib.JsonTokenizer
  sampler: rollout.Rollout | episodes.EpisodeRollout
  reward_set: rewards.RewardSet
  optimizer: nnx.Optimizer
  hp: grpo.StepHParams
  eval_set: list[dict]
  state: RunState
  # The rubric_judge reward's judge (judging.build); None without one.
  judge: judge_lib.Judge | None = None
  # The train batches (`setup` with_data) and their counts.
  train_iter: grain.DatasetIterator | None = None
  data_stats: dict | None = None


def step_seed(base_seed, step, sampling_round=0):
  """Sampling seed of a step (and round): independent of restarts.

  Round 0 is the step's first batch; dynamic sampling's further batches of
  the step are rounds 1, 2, ...
  """
  entropy = [base_seed, step] + ([sampling_round] if sampling_round else [])
  return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def setup(config, workdir, with_data=True):
  """Validates the config and builds the session (no training).

  Without `with_data` only the eval split is read (evaluate scores a test
  file with no train file beside it).
  """
  validation.validate(config, process_count=jax.process_count(),
                      splits=pipeline.SPLITS if with_data else ('eval',))
  if with_data and config.model.lora_rank < 1:
    raise validation.ConfigError(
        f'config.model.lora_rank={config.model.lora_rank}: training updates '
        'only LoRA adapters, so it needs a rank >= 1.'
    )
  if with_data and workdir:
    resolved_config.check_and_store(config, workdir, checkpoint.has_steps(workdir))
  mesh = sharding.make_mesh(config.mesh)
  model, tokenizer = models.build(config, mesh)
  sampler = rollout.Rollout(
      model, tokenizer, config.generation.kv_cache_size,
      cpu_decode_graph=config.generation.cpu_decode_graph,
      stop_sequences=rollout.stop_sequences_from_config(config),
      decode_chunk_steps=config.generation.decode_chunk_steps,
      shared_prefix=config.generation.shared_prefix,
  )
  if episodes.enabled(config):  # Multi-turn episodes (tools).
    sampler = episodes.from_config(config, sampler)
  tx, schedule = optimizer_lib.optimizer_from_config(config)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.LoRAParam)
  sharding.place_optimizer(optimizer, mesh)
  # The prompts are written in the turns of the model's family.
  turns = families.of_preset(config.model.preset).tool_format
  session = Session(
      config=config,
      workdir=workdir,
      mesh=mesh,
      model=model,
      tokenizer=tokenizer,
      sampler=sampler,
      reward_set=rewards.RewardSet.from_config(
          config.rewards, config.generation.max_generation_steps),
      optimizer=optimizer,
      hp=grpo.hparams_from_config(config),
      eval_set=pipeline.eval_examples(config, tokenizer, turns=turns),
      state=RunState(kl_coeff=grpo.initial_kl_coeff(config),
                     schedule=schedule),
      judge=judging.build(config, workdir, model, tokenizer),
  )
  if with_data:
    train_iter, data_stats = pipeline.make_train_iterator(
        config, tokenizer, jax.process_index(), jax.process_count(),
        turns=turns,
    )
    session = dataclasses.replace(session, train_iter=train_iter,
                                  data_stats=data_stats)
  return session


@dataclasses.dataclass(frozen=True)
class RolloutResult:
  """What a step's rollout hands the update and the books.

  Attributes:
    update: the `grpo.UpdateBatch` of this process's rows, host arrays.
    scalars: per-step scalars over all processes' rows.
    samples: (prompts, texts, total rewards) of this process's rows, for
      the sample texts.
    gen_tokens: completion tokens over all processes.
    staged: the batch's `stage_update`, dispatched before the rewards were
      computed; None: `update_policy` stages it.
  """

  update: grpo.UpdateBatch
  scalars: dict[str, float]
  samples: tuple[list, list, object]
  gen_tokens: int
  staged: 'Staged | None' = None


def rollout_batch(session, batch, step):
  """Samples G completions per prompt and scores this process's rows.

  Args:
    session: the run's `Session`.
    batch: this process's batch of prompts (pipeline layout).
    step: the step number (picks the sampling seed).

  Returns:
    A `RolloutResult`: its update has the optional inputs the config's
    update reads (`grpo.update_batch`); its staged log-prob passes were
    dispatched before the rewards were computed.
  """
  config = session.config
  g = config.grpo.num_generations
  rows = rollout.repeat_groups(batch, g)
  prompt_tokens, out = _generate(
      session, batch, step_seed(config.training.seed, step), own=True)
  prompts = list(rows['prompt'])
  trained = _mask_cut_episodes(session, out)
  sequences = grpo.Sequences(
      tokens=np.concatenate([rows['prompt_tokens'], out.tokens], axis=1),
      input_mask=np.concatenate(
          [rows['prompt_mask'], out.attended > 0], axis=1
      ),
      completion_mask=trained.mask,
      # The update logs sampler/logp_abs_diff from these.
      sampler_logps=out.logps,
  )
  # The log-prob passes need no reward: dispatched now, they run on the
  # devices while the host scores (a judge's requests included).
  staged = stage_update(session, sequences)
  total, per_fn = _score(session, rows, out)
  advantages = np.asarray(
      objectives.group_advantages(total, g, config.grpo.scale_rewards)
  )
  scalars, gen_tokens = _rollout_scalars(
      total, per_fn, out.lengths, out.truncated, g
  )
  if out.episodes is not None:
    scalars.update(episode_stats.scalars(sharding.allgather_concat(
        episode_stats.row_stats(out.episodes))))
  update = grpo.update_batch(config, sequences, advantages, total,
                             session.state.kl_coeff)
  samples = (prompts, judging.annotate(session, _sample_texts(out)), total)
  return RolloutResult(update, scalars, samples, gen_tokens, staged)


def _generate(session, batch, seed, own):
  """(Every process's prompt tokens, their completions): this process's
  rows when `own`, else all. With tools, every row's episode starts from
  its example (question and answer)."""
  config = session.config
  gen = config.generation
  g = config.grpo.num_generations
  prompt_tokens = sharding.gather_rows(batch['prompt_tokens'])
  extra = {}
  if isinstance(session.sampler, episodes.EpisodeRollout):
    extra['examples'] = [
        {'question': q, 'answer': a} for q, a in zip(
            sharding.gather_texts([str(q) for q in batch['question']]),
            sharding.gather_texts([str(a) for a in batch['answer']]))]
  out = session.sampler.generate(
      prompt_tokens, gen.max_generation_steps, seed, gen.temperature,
      gen.top_k, gen.top_p,
      rows=sharding.own_rows(len(prompt_tokens), g) if own else None,
      num_generations=g, **extra,
  )
  return prompt_tokens, out


def _score(session, rows, out):
  """(total, per_fn) rewards of completions `out` of prompt rows `rows`.

  With tools, reward functions also get each episode's `transcript` and
  `tool_calls` ({name, arguments, result, error} per call), and
  agent.tool_use_bonus is added (logged as reward/tool_use_bonus).
  """
  fields = judging.reward_fields(session, rows)
  if out.episodes is not None:
    fields['transcript'] = [e.transcript for e in out.episodes]
    fields['tool_calls'] = [e.tool_calls for e in out.episodes]
  total, per_fn = session.reward_set(
      list(rows['prompt']), prompts.scored_texts(out.texts, session.config),
      answer=list(rows['answer']),
      question=list(rows['question']),
      reasoning=list(rows.get('reasoning', [''] * len(rows['question']))),
      completion_lengths=out.lengths.tolist(),
      completion_tokens=[
          row[m > 0].tolist() for row, m in zip(out.tokens, out.mask)
      ],
      judge=session.judge,
      **fields,
  )
  total, per_fn, masked = judging.mask_failed_groups(
      total, per_fn, session.config.grpo.num_generations)
  session.state.judge_masked_groups += masked
  bonus = session.config.agent.tool_use_bonus
  if out.episodes is not None and bonus > 0:
    per_fn['tool_use_bonus'] = episode_stats.tool_use_bonus(out.episodes, bonus)
    total = np.asarray(total, np.float32) + per_fn['tool_use_bonus']
  return total, per_fn


def _mask_cut_episodes(session, out):
  """`out` with no loss on episodes a limit ended, when
  agent.cut_episodes='mask' (after scoring: their rewards still count)."""
  if out.episodes is None or session.config.agent.cut_episodes != 'mask':
    return out
  return dataclasses.replace(
      out, mask=np.where(out.truncated[:, None], 0.0, out.mask).astype(
          np.float32))


def _sample_texts(out):
  """What TensorBoard shows of each row: the transcript with tools."""
  if out.episodes is None:
    return out.texts
  return [e.transcript for e in out.episodes]


def _rollout_scalars(total, per_fn, lengths, truncated, g):
  """Reward and length statistics over every process's rows."""
  return _scalars_of_rows(sharding.allgather_concat({
      'total': np.asarray(total, np.float32),
      'per_fn': {k: np.asarray(v, np.float32) for k, v in per_fn.items()},
      'lengths': np.asarray(lengths),
      'truncated': np.asarray(truncated, np.float32),
  }), g)


def _scalars_of_rows(rows, g):
  """(Reward and length scalars, completion tokens) of gathered rows."""
  total = rows['total']
  grouped = total.reshape(-1, g)
  scalars = {
      'reward/mean': float(total.mean()),
      'reward/std': float(total.std()),
      'frac_reward_zero_std': float((grouped.std(axis=1) == 0).mean()),
      'completion/mean_length': float(rows['lengths'].mean()),
      'completion/clipped_ratio': float(rows['truncated'].mean()),
  }
  for name, values in rows['per_fn'].items():
    scalars[f'reward/{metrics_lib.sanitize_name(name)}/mean'] = float(
        values.mean()
    )
  return scalars, int(rows['lengths'].sum())


def _take(out, rows):
  """The completions of `rows` (indices) of `out`."""
  pick = lambda x: None if x is None else x[rows]
  return rollout.Completions(
      out.tokens[rows], out.mask[rows], out.lengths[rows],
      out.truncated[rows], [out.texts[i] for i in rows], pick(out.logps),
      pick(out.input_mask),
      None if out.episodes is None else [out.episodes[i] for i in rows])


def sample_round(session, batch, step, sampling_round):
  """Samples and scores one batch of prompts for dynamic sampling.

  Unlike `rollout_batch` it keeps every process's sampled rows (the sampler
  gathers them anyway) and gathers every process's rewards, so that any
  sampled group can go to any process's part of the update batch.

  Args:
    session: the run's `Session`.
    batch: this process's batch of prompts (pipeline layout).
    step: the step number.
    sampling_round: 0 for the step's first batch, then 1, 2, ...

  Returns:
    `dynamic_sampling.Round`.
  """
  config = session.config
  g = config.grpo.num_generations
  prompt_mask = sharding.gather_rows(batch['prompt_mask'])
  prompt_tokens, out = _generate(
      session, batch, step_seed(config.training.seed, step, sampling_round),
      own=False)
  own = _take(out, sharding.own_rows(len(prompt_tokens), g))
  rows = rollout.repeat_groups(batch, g)
  total, per_fn = _score(session, rows, own)
  out = _mask_cut_episodes(session, out)
  names = list(per_fn)
  local = np.stack([total] + [per_fn[k] for k in names], axis=-1)
  every = sharding.gather_rows(
      local.astype(np.float32).reshape(len(batch['prompt_tokens']), g, -1))
  return dynamic_sampling.Round(
      prompt_tokens=prompt_tokens,
      prompt_mask=prompt_mask,
      completions=out,
      group_rewards=every[..., 0],
      per_fn={k: every[..., i + 1].reshape(-1) for i, k in enumerate(names)},
      samples=(list(rows['prompt']), _sample_texts(own), total),
  )


def rollout_dynamic(session, batch, step):
  """`rollout_batch` with dynamic sampling (dynamic_sampling.py).

  Draws further batches from `session.train_iter` while too few groups
  have a reward spread. The scalars cover every completion sampled in the
  step (all rounds), plus the dynamic_sampling/ counts.
  """
  config = session.config
  g = config.grpo.num_generations
  batch_size = config.training.batch_size
  rounds, selection = dynamic_sampling.collect(
      batch, lambda: next(session.train_iter),
      lambda b, r: sample_round(session, b, step, r), batch_size,
      config.grpo.max_sampling_rounds)
  assembled = dynamic_sampling.assemble(
      rounds, selection,
      dynamic_sampling.own_places(batch_size, jax.process_index(),
                                  jax.process_count()),
      g, config.grpo.scale_rewards)
  update = grpo.update_batch(config, assembled.sequences,
                             assembled.advantages, assembled.rewards,
                             session.state.kl_coeff)
  scalars, gen_tokens = _scalars_of_rows({
      'total': np.concatenate([r.group_rewards.reshape(-1) for r in rounds]),
      'per_fn': {k: np.concatenate([r.per_fn[k] for r in rounds])
                 for k in rounds[0].per_fn},
      'lengths': np.concatenate([r.completions.lengths for r in rounds]),
      'truncated': np.concatenate(
          [r.completions.truncated for r in rounds]).astype(np.float32),
  }, g)
  scalars.update(dynamic_sampling.step_scalars(selection, batch_size))
  if rounds[0].completions.episodes is not None:  # Every process's rows.
    scalars.update(episode_stats.scalars(episode_stats.row_stats(
        [e for r in rounds for e in r.completions.episodes])))
  samples = tuple(
      [x for r in rounds for x in r.samples[i]] for i in range(3))
  # The rows are chosen by their rewards: nothing to stage before scoring.
  return RolloutResult(update, scalars, samples, gen_tokens)


# Tokens per expert of a Gemma 4 mixture of experts on the update batch
# (one more forward; MoE presets only).
_ROUTER_STATS = nnx.jit(gemma4_lib.router_stats)


@dataclasses.dataclass(frozen=True)
class Staged:
  """A batch's sequences on the mesh, trimmed to the bucket of its longest
  completion, and the log-prob passes dispatched on them (`stage_update`).

  Attributes:
    sequences: the trimmed `grpo.Sequences`, global arrays.
    ref_logps: the reference pass's log-probs, when the loss needs them.
    old_logps: the old policy's, when grpo.num_iterations > 1.
  """

  sequences: grpo.Sequences
  ref_logps: jax.Array | None = None
  old_logps: jax.Array | None = None


def stage_update(session, sequences):
  """The sequences of an update batch, trimmed and on the mesh, with the
  reference (and old-policy) log-prob passes dispatched.

  The passes run on the batch's completion columns cut to the bucket of its
  longest completion over all processes (`grpo.completion_bucket`): the
  columns dropped are all masked out, so the update is the same at the cost
  of the tokens that exist. JAX dispatches the passes asynchronously, so a
  caller that stages before scoring overlaps them with the reward functions
  (a judge's requests above all); `update_policy` adds the per-row inputs.

  Args:
    session: the run's `Session`.
    sequences: this process's rows, host `grpo.Sequences` (from a rollout,
      with sampler_logps).

  Returns:
    `Staged`.
  """
  config = session.config
  # Completion columns up to each row's last real token (with tools, the
  # inserts between turns are read though not trained on).
  width = sequences.completion_mask.shape[1]
  attended = sequences.input_mask[:, -width:]
  lengths = np.where(attended.any(axis=1),
                     width - np.argmax(attended[:, ::-1], axis=1), 0)
  longest = int(sharding.allgather_concat(
      np.array([lengths.max(initial=0)])).max())
  bucket = grpo.completion_bucket(longest, width)
  on_mesh = sharding.shard_batch(
      grpo.trim_completions(sequences, bucket), session.mesh)
  ref_logps = old_logps = None
  if session.hp.needs_reference:
    ref_logps = grpo.reference_logps(session.model, on_mesh, session.hp)
  if config.grpo.num_iterations > 1:
    old_logps = grpo.policy_logps(session.model, on_mesh, session.hp)
  return Staged(on_mesh, ref_logps=ref_logps, old_logps=old_logps)


def update_policy(session, update, staged=None):
  """Reference/old log-probs as needed, then num_iterations updates.

  Args:
    session: the run's `Session`.
    update: the host `grpo.UpdateBatch` (`rollout_batch`'s).
    staged: `stage_update(session, update.sequences)` if the caller
      dispatched it already; None stages it here.

  Returns:
    The update's scalars.
  """
  config = session.config
  if staged is None:
    staged = stage_update(session, update.sequences)
  per_row = sharding.shard_batch(
      {'advantages': update.advantages, 'rewards': update.rewards,
       'kl_coeff': update.kl_coeff}, session.mesh)
  batch = grpo.UpdateBatch.of(staged.sequences, ref_logps=staged.ref_logps,
                              old_logps=staged.old_logps, **per_row)
  session.state.last_batch = batch
  for _ in range(config.grpo.num_iterations):
    step_metrics = grpo.train_step(
        session.model, session.optimizer, batch, session.hp
    )
  scalars = {k: float(sharding.to_host(v)) for k, v in step_metrics.items()}
  if getattr(session.model.config, 'enable_moe', False):
    counts = _ROUTER_STATS(session.model, batch.tokens, batch.input_mask)
    scalars.update(gemma4_lib.load_scalars(sharding.to_host(counts)))
  if session.hp.beta > 0:
    scalars['kl_coeff'] = session.state.kl_coeff
  if config.grpo.kl_target > 0:
    # Every process sees the same global KL, so they all agree.
    session.state.kl_coeff = objectives.adaptive_kl_coeff(
        session.state.kl_coeff, scalars['kl'], config.grpo.kl_target,
        config.grpo.kl_horizon,
        config.training.batch_size * config.grpo.num_generations,
    )
  return scalars


def last_learning_rate(session):
  """The learning rate of the optimizer's latest update.

  Read from the optimizer's own update counter (checkpointed), so it is the
  rate the update actually used, whatever grpo.num_iterations is.
  """
  updates = int(sharding.to_host(session.optimizer.step.get_value()))
  return float(session.state.schedule(max(updates - 1, 0)))


def resume_schedule(session, meta):
  """Keeps the learning-rate schedule of the run resumed from (or starts a
  new one: training.reset_schedule), and logs the rate change in one line.

  Raises:
    ConfigError: training.num_steps goes past the schedule's end.
  """
  config = session.config
  updates = int(sharding.to_host(session.optimizer.step.get_value()))
  stored = None
  if schedule_lib.META_KEY not in meta:
    stored = resolved_config.load(session.workdir)
  old, _ = schedule_lib.saved_span(config, meta, stored)
  new, _ = schedule_lib.resumed_span(config, meta, updates, stored)
  old_schedule = optimizer_lib.optimizer_from_config(
      config, (old.start, old.length))[1]
  if new != schedule_lib.first_span(config):  # Not what `setup` built.
    tx, session.state.schedule = optimizer_lib.optimizer_from_config(
        config, (new.start, new.length))
    session.optimizer.tx = tx
  session.state.span = new
  logging.info('%s', schedule_lib.describe(
      config, old, new, float(old_schedule(max(updates - 1, 0))),
      float(session.state.schedule(updates)), updates))


def save(ckpt, session, step, force=False):
  """Saves `step` when due (or forced), never a diverged state."""
  if not ckpt.will_save(step, force):
    return
  state = session.state
  divergence.check_state(step, session.model, session.optimizer,
                         state.last_batch, session.hp, session.config, ckpt)
  span = state.span or schedule_lib.first_span(session.config)
  meta = {'kl_coeff': state.kl_coeff,
          schedule_lib.META_KEY: span.to_meta()}
  if state.alarms is not None:
    meta['alarms'] = state.alarms.state()
  ckpt.save(step, checkpoint.lora_state(session.model),
            checkpoint.optimizer_state(session.optimizer),
            session.train_iter, meta, force=force)


def restore_lora(session, workdir, step=None):
  """Loads a run's LoRA params (latest or `step`); returns the step or None."""
  return checkpoint.restore_lora(
      session.model, workdir, session.config.checkpoint, step
  )


def run_eval(session, writer, step):
  scores, texts, transcripts = evaluation.evaluate(
      session.sampler, session.tokenizer, session.eval_set, session.config,
      seed=step_seed(session.config.training.seed + 1, step),
      judge=session.judge,
  )
  scalars = {f'eval/{k}': v for k, v in scores.items()}
  if session.judge is not None:  # The evaluation's judge calls.
    scalars.update({f'eval/{k}': v
                    for k, v in session.judge.take_metrics().items()})
  if session.state.alarms is not None:
    scalars.update(session.state.alarms.after_eval(step, scores))
  writer.write_scalars(step, scalars)
  if texts and jax.process_index() == 0:
    metrics_lib.write_samples(
        writer, step, [e['prompt'] for e in session.eval_set],
        transcripts or texts,
        [float(evaluation.is_correct(t, e['answer']))
         for t, e in zip(texts, session.eval_set)],
        session.config.logging.num_sample_texts,
    )
  return scores


def train_and_evaluate(config, workdir):
  """Trains (resuming from workdir's latest checkpoint) and evaluates.

  Returns:
    Dict with the final step, the last step's scalars, the final eval scores
    (None when stopped early), 'preempted' (SIGTERM/SIGINT ended it) and
    'alarms' (the alarms that stopped the run under
    training.stop_on_alarm; empty otherwise).
  """
  validation.validate(config, process_count=jax.process_count(),
                      workdir=workdir)
  with run_lock.hold(workdir):  # One run per workdir.
    return run(setup(config, workdir))


def run(session):
  """`train_and_evaluate` on a session already built by `setup`."""
  ckpt = checkpoint.Checkpointer(session.workdir, session.config.checkpoint)
  # However the loop ends (an error included), the checkpoint being written
  # in the background and the queued metrics are finished before this
  # returns or raises.
  with ckpt, contextlib.ExitStack() as closing:
    if isinstance(session.sampler, episodes.EpisodeRollout):
      closing.callback(session.sampler.close)
    return _train(session, ckpt, closing)


def _train(session, ckpt, closing):
  """The train loop of `run`: checkpoints with `ckpt`, closes via `closing`."""
  config, workdir = session.config, session.workdir
  model, optimizer, state = session.model, session.optimizer, session.state
  start = 0
  state.alarms = alarms_lib.Monitor(config)
  restored = ckpt.restore_into(model, optimizer, session.train_iter)
  ckpt.set_aside_damaged()
  if restored is not None:
    meta, start = restored
    if config.grpo.kl_target > 0 and 'kl_coeff' in meta:
      state.kl_coeff = float(meta['kl_coeff'])
    state.alarms.load(meta.get('alarms'))
    logging.info('Resumed from step %d in %s', start, workdir)
    resume_schedule(session, meta)
  writer = closing.enter_context(
      metrics_lib.closing(metrics_lib.create_writer(workdir, config=config)))
  if start == 0:
    metrics_lib.write_hparams(writer, config)
  num_steps = config.training.num_steps
  report = metrics_lib.progress_hook(config, num_steps, writer)
  guard = preemption.PreemptionGuard()
  logging.info(
      'Training %s for %d steps (%d prompts x %d generations); data: %s',
      config.model.preset, num_steps, config.training.batch_size,
      config.grpo.num_generations, session.data_stats,
  )
  # At every start: a resumed run may be on another kind of machine.
  machine_line = machine.summary(machine.describe())
  logging.info('Machine: %s', machine_line)
  if jax.process_index() == 0:  # Texts, like samples, from process 0 only.
    writer.write_texts(start, {'machine': machine_line})
  if start == 0:
    writer.write_scalars(0, {
        'data/dropped_long_prompts':
            session.data_stats['dropped_long_prompts']
    })
    run_eval(session, writer, 0)
  scalars = {}
  step = start

  def save_now(done):
    save(ckpt, session, done, force=True)
    ckpt.wait()  # Written before SaveOnError says so; the error goes on.

  def skip_reason(error):
    if isinstance(error, divergence.DivergenceError):
      return 'the diverged state is not known to be good'
    if full_disk.no_space_error(error) is not None:
      return 'the disk is full'
    return None

  keeper = preemption.SaveOnError(save_now, session.train_iter, start,
                                  skip=skip_reason)
  with guard, keeper:
    for step in range(start + 1, num_steps + 1):
      keeper.begin(step)
      try:
        batch = next(session.train_iter)
      except StopIteration:
        logging.info('Data exhausted after step %d.', step - 1)
        step -= 1
        break
      t0 = time.perf_counter()
      rollout_fn = (rollout_dynamic if config.grpo.dynamic_sampling
                    else rollout_batch)
      result = rollout_fn(session, batch, step)
      scalars = result.scalars
      t1 = time.perf_counter()
      keeper.updating()
      scalars.update(update_policy(session, result.update, result.staged))
      keeper.done(step)
      t2 = time.perf_counter()
      scalars['learning_rate'] = last_learning_rate(session)
      scalars['time/rollout_s'] = t1 - t0
      scalars['time/update_s'] = t2 - t1
      scalars['tokens_per_s'] = result.gen_tokens / (t2 - t0)
      # Retries of the storage clients so far (429/5xx/lost connections).
      scalars['storage/retries'] = float(storage_retries.count())
      scalars.update(judging.step_scalars(session, t2 - t0))
      divergence.check_scalars(step, scalars, config, ckpt)
      scalars.update(state.alarms.update(step, scalars))
      writer.write_scalars(step, scalars)
      if jax.process_index() == 0:
        metrics_lib.write_samples(
            writer, step, *result.samples, config.logging.num_sample_texts
        )
      report(step)
      every = config.eval.eval_every_n_steps
      if every and step % every == 0 and step < num_steps:
        run_eval(session, writer, step)
      # After the evaluation, so that the checkpoint's alarm state has seen
      # it (reward_hacking compares consecutive evaluations).
      save(ckpt, session, step)
      preempted = guard.should_stop(step)
      alarmed = (state.alarms.fired(step)
                 if config.training.stop_on_alarm else [])
      if preempted or alarmed:
        save(ckpt, session, step, force=True)
        if alarmed:
          logging.warning(
              'Stopped after step %s by alarm %s (training.stop_on_alarm); '
              'saved in %s. %s', step, ', '.join(alarmed), ckpt.directory,
              ' '.join(state.alarms.message(a) for a in alarmed))
        else:
          logging.warning('Stopped after step %s, saved in %s; rerun the '
                          'same command to resume.', step, ckpt.directory)
        ckpt.close()
        return {'step': step, 'scalars': scalars, 'eval': None,
                'preempted': preempted, 'alarms': alarmed}
  if step > start:
    save(ckpt, session, step, force=True)
  final = run_eval(session, writer, step)
  return {'step': step, 'scalars': scalars, 'eval': final,
          'preempted': False, 'alarms': []}
