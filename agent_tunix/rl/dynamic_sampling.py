"""Dynamic sampling (DAPO, Yu et al. 2025): train on groups that differ.

Layer: rl; may import agent, data, models, rewards, tpu, storage and cli.

`step_rollout.StepRollout` (grpo.dynamic_sampling) calls `collect` (sample
rounds of B prompts until B groups have a reward spread, `grpo.max_sampling_rounds` batches
were sampled, or the data ends; it returns the rounds and their
`Selection`), `assemble` with `own_places` (this process's rows of the
update batch, B groups of G rows: the groups without a spread that fill
it have a zero completion mask, so the update gives them zero advantages) and `step_scalars` (the
`dynamic_sampling/*` metrics).

Design notes: docs/how_it_works.md, 'Dynamic sampling'.
"""

import dataclasses
from typing import Any

from absl import logging
import numpy as np

from agent_tunix.rl import grpo


def has_spread(group_rewards):
  """Bool [n]: whether each group's rewards are not all equal.

  Args:
    group_rewards: [n, G] rewards, one row per group.
  """
  group_rewards = np.asarray(group_rewards)
  return group_rewards.max(axis=1) > group_rewards.min(axis=1)


@dataclasses.dataclass(frozen=True)
class Selection:
  """Which sampled groups make up a step's update batch.

  Attributes:
    picks: int [B, 2]: (round, group index within the round) of each place
      of the update batch.
    num_kept: places 0 .. num_kept - 1 hold groups with a reward spread;
      the rest hold groups without one (masked out of the loss).
    num_rounds: batches of prompts sampled this step.
    dropped_groups: groups without a reward spread over all rounds.
  """

  picks: np.ndarray
  num_kept: int
  num_rounds: int
  dropped_groups: int


def num_with_spread(round_rewards):
  """Groups with a reward spread over all rounds ([B, G] arrays)."""
  return sum(int(has_spread(r).sum()) for r in round_rewards)


def needs_more(round_rewards, batch_size, max_rounds):
  """Whether to sample another batch: too few groups with a spread so far
  and fewer than `max_rounds` batches sampled."""
  return (num_with_spread(round_rewards) < batch_size
          and len(round_rewards) < max_rounds)


def select(round_rewards, batch_size):
  """Picks the B groups of the update batch.

  Args:
    round_rewards: per round, the total rewards of every group [B, G], in
      stream order (the same on every process).
    batch_size: B, groups in the update batch.

  Returns:
    `Selection`: the first B groups with a spread in (round, position)
    order, then the earliest groups without one to fill the batch.

  Raises:
    ValueError: if the rounds hold fewer than B groups in all.
  """
  kept, flat = [], []
  for r, rewards in enumerate(round_rewards):
    spread = has_spread(rewards)
    for j in range(len(spread)):
      (kept if spread[j] else flat).append((r, j))
  if len(kept) + len(flat) < batch_size:
    raise ValueError(
        f'{len(kept) + len(flat)} sampled groups cannot fill a batch of '
        f'{batch_size}.'
    )
  num_kept = min(len(kept), batch_size)
  picks = np.array((kept[:batch_size] + flat)[:batch_size], np.int64)
  return Selection(picks=picks.reshape(batch_size, 2), num_kept=num_kept,
                   num_rounds=len(round_rewards), dropped_groups=len(flat))


def collect(first_batch, draw, sample, batch_size, max_rounds):
  """Samples round after round until the batch is full or the cap is hit.

  Args:
    first_batch: the step's batch of prompts (round 0).
    draw: () -> the next batch of prompts from the data iterator; raises
      StopIteration when the data is exhausted (then the step trains on
      what it has).
    sample: (batch, round) -> a round's result with attribute
      `group_rewards`: [B, G] total rewards of every process's groups, in
      stream order.
    batch_size: B (global prompts per batch).
    max_rounds: most batches to sample (>= 1).

  Returns:
    (list of the rounds' results, `Selection`).
  """
  rounds = [sample(first_batch, 0)]
  while needs_more([r.group_rewards for r in rounds], batch_size,
                   max_rounds):
    try:
      batch = draw()
    except StopIteration:
      logging.info('Dynamic sampling: the data ended after %d rounds; '
                   'training on what they found.', len(rounds))
      break
    rounds.append(sample(batch, len(rounds)))
  return rounds, select([r.group_rewards for r in rounds], batch_size)


def own_places(batch_size, process_index, process_count):
  """This process's places of the update batch: p, p + P, p + 2P, ..."""
  return np.arange(process_index, batch_size, process_count)


@dataclasses.dataclass
class Round:
  """One sampled batch, as every process holds it (stream order).

  Attributes:
    prompt_tokens: int32 [B, P] every process's prompts, left-padded.
    prompt_mask: bool [B, P].
    completions: the B * G sampled rows (`rollout.Completions`, all rows).
    group_rewards: float32 [B, G] total rewards.
    per_fn: {reward name: float32 [B * G]} unweighted scores.
    samples: (prompts, texts, totals) of this process's rows, for the
      sample-text log.
  """

  prompt_tokens: np.ndarray
  prompt_mask: np.ndarray
  completions: Any
  group_rewards: np.ndarray
  per_fn: dict
  samples: tuple


def assemble(rounds, selection, places, num_generations):
  """This process's rows of the update batch.

  Args:
    rounds: the `Round`s of the step.
    selection: their `Selection`.
    places: this process's places of the batch (`own_places`), ascending.
    num_generations: G.

  Returns:
    A `grpo.UpdateBatch` of len(places) * G rows with sampler_logps and
    rewards (the rows' total rewards) and no advantages: the update
    computes them (`grpo.prepare`), and the filling groups' rows, whose
    completion mask is zero, get zero advantages and stay out of batch
    statistics (`advantages.estimate`).
  """
  g = num_generations
  places = np.asarray(places)
  kept = places < selection.num_kept
  if not np.all(kept[:kept.sum()]):
    raise ValueError(f'places {places} must be ascending.')
  parts = {key: [] for key in ('tokens', 'input_mask', 'completion_mask',
                               'sampler_logps', 'rewards')}
  for r, j in selection.picks[places]:
    one = rounds[r]
    rows = slice(j * g, (j + 1) * g)
    out = one.completions
    prompt = np.repeat(one.prompt_tokens[j][None], g, axis=0)
    prompt_mask = np.repeat(one.prompt_mask[j][None], g, axis=0)
    parts['tokens'].append(np.concatenate([prompt, out.tokens[rows]], 1))
    parts['input_mask'].append(
        np.concatenate([prompt_mask, out.attended[rows] > 0], axis=1))
    parts['completion_mask'].append(out.mask[rows])
    parts['sampler_logps'].append(out.logps[rows])
    parts['rewards'].append(one.group_rewards[j])
  joined = {k: np.concatenate(v) for k, v in parts.items()}
  rewards = joined['rewards'].astype(np.float32)
  num_kept_rows = int(kept.sum()) * g
  mask = joined['completion_mask'].copy()
  mask[num_kept_rows:] = 0
  return grpo.UpdateBatch(
      tokens=joined['tokens'],
      input_mask=joined['input_mask'].astype(bool),
      completion_mask=mask,
      sampler_logps=joined['sampler_logps'],
      rewards=rewards,
  )


def step_scalars(selection, batch_size):
  """The step's dynamic-sampling scalars."""
  return {
      'dynamic_sampling/dropped_groups': float(selection.dropped_groups),
      'dynamic_sampling/extra_prompts':
          float((selection.num_rounds - 1) * batch_size),
      'dynamic_sampling/rounds': float(selection.num_rounds),
      'dynamic_sampling/masked_groups':
          float(batch_size - selection.num_kept),
  }

