"""RewardSet: the weighted reward functions, applied to a batch.

  reward_set = rewards.RewardSet.from_config(
      config.rewards, config.generation.max_generation_steps, judge=judge)
  total, per_fn = reward_set(prompts, completions, answer=answers,
                             completion_lengths=lengths)
  total, per_fn = reward_set.score_groups(prompts, completions, g, ...)
  scalars.update(reward_set.take_metrics(step_seconds))  # judge/*

The set holds the functions of `rewards.functions` (parsed and resolved by
`spec`) and, when on, the length and overlong penalties; it checks every
function's scores and raises `blame.RewardError` naming the function and, if
one can be blamed, the completion. It owns the run's judge, when a function
asks one (rubric_judge): the functions get it, and the judge's metrics and
verdicts are read through the set.
"""

from collections.abc import Mapping, Sequence
import functools
import math
from typing import Any

from absl import logging
import numpy as np

from agent_tunix.rewards import blame
from agent_tunix.rewards import format as format_lib
from agent_tunix.rewards import registry
from agent_tunix.rewards import rubric as rubric_lib
from agent_tunix.rewards import spec
from agent_tunix.tpu import sharding


class RewardSet:
  """Weighted reward functions, applied to a batch of completions.

  Calling the set returns the weighted total per completion and each
  function's unweighted scores. Any failure of a reward function raises
  `RewardError`, which stops training: a silently wrong reward would train the
  model on garbage.
  """

  def __init__(
      self,
      functions: str | Sequence[tuple[str, float]],
      length_penalty: float = 0.0,
      length_penalty_target: int = 256,
      overlong_buffer: int = 0,
      overlong_penalty: float = 1.0,
      max_completion_length: int | None = None,
      judge: rubric_lib.Judge | None = None,
  ):
    """Builds the set and imports any 'module:function' rewards.

    Args:
      functions: A spec string for `spec.parse_spec`, or (name, weight) pairs.
      length_penalty: Penalty per completion token beyond
        `length_penalty_target`; 0 turns it off.
      length_penalty_target: Token count up to which there is no penalty.
      overlong_buffer: Tokens before `max_completion_length` over which
        DAPO's overlong penalty (`format.overlong_penalty`) falls linearly
        from 0 to -`overlong_penalty`; 0 turns it off.
      overlong_penalty: The overlong penalty at the length limit (>= 0).
      max_completion_length: The completion length limit in tokens
        (generation.max_generation_steps); needed when overlong_buffer > 0.
      judge: The run's judge, for the functions that ask one (rubric_judge
        gets it as its `judge` argument); None: none is passed.

    Raises:
      ValueError: for a bad spec, an unresolvable function, a negative
        length penalty setting, or an overlong buffer that is negative or
        longer than the limit (or given without the limit).
    """
    if isinstance(functions, str):
      pairs = spec.parse_spec(functions)
    else:
      pairs = [(str(n), float(w)) for n, w in functions]
      if not pairs:
        raise ValueError('RewardSet needs at least one reward function.')
      spec.parse_spec(','.join(f'{n}={w!r}' for n, w in pairs))
    if not math.isfinite(length_penalty) or length_penalty < 0:
      raise ValueError(
          f'rewards.length_penalty={length_penalty!r} must be a finite number '
          '>= 0 (0 turns the penalty off).'
      )
    if length_penalty_target < 0:
      raise ValueError(
          f'rewards.length_penalty_target={length_penalty_target!r} must be '
          '>= 0 tokens.'
      )
    _check_overlong(overlong_buffer, overlong_penalty, max_completion_length)
    self._fns: dict[str, registry.RewardFn] = {}
    self._weights: dict[str, float] = {}
    for name, weight in pairs:
      self._fns[name] = spec.resolve(name)
      self._weights[name] = weight
    # The functions that may score NaN (`registry.is_maskable`).
    self._maskable = {name for name, fn in self._fns.items()
                      if registry.is_maskable(fn)}
    self._judge = judge
    # Groups `score_groups` masked since the last step's `take_metrics`.
    self._masked_groups = 0
    self._length_penalty = float(length_penalty)
    if self._length_penalty > 0:
      self._fns[registry.LENGTH_PENALTY] = functools.partial(
          format_lib.length_penalty,
          coef=self._length_penalty,
          target=length_penalty_target,
      )
      self._weights[registry.LENGTH_PENALTY] = 1.0
    if overlong_buffer > 0:
      self._fns[registry.OVERLONG_PENALTY] = functools.partial(
          format_lib.overlong_penalty,
          max_length=int(max_completion_length),
          buffer=int(overlong_buffer),
          factor=float(overlong_penalty),
      )
      self._weights[registry.OVERLONG_PENALTY] = 1.0
    logging.info(
        'Rewards: %s',
        ', '.join(f'{n} x {w:g}' for n, w in self._weights.items()),
    )

  @classmethod
  def from_config(
      cls, rewards_config: Any, max_completion_length: int | None = None,
      judge: rubric_lib.Judge | None = None,
  ) -> 'RewardSet':
    """Builds the set from the config's rewards section (`config.rewards`).

    Args:
      rewards_config: `config.rewards`.
      max_completion_length: the rollouts' completion limit in tokens
        (`config.generation.max_generation_steps`); the overlong penalty
        needs it.
      judge: the run's judge (`judge.from_config`), when a function asks one.
    """
    return cls(
        rewards_config.functions,
        length_penalty=rewards_config.length_penalty,
        length_penalty_target=rewards_config.length_penalty_target,
        overlong_buffer=rewards_config.overlong_buffer,
        overlong_penalty=rewards_config.overlong_penalty,
        max_completion_length=max_completion_length,
        judge=judge,
    )

  @property
  def names(self) -> list[str]:
    """Reward names in order; `length_penalty`, then `overlong_penalty`,
    last when they are on."""
    return list(self._fns)

  @property
  def weights(self) -> dict[str, float]:
    """Weight of each reward in the total."""
    return dict(self._weights)

  @property
  def judge(self) -> rubric_lib.Judge | None:
    """The judge the functions get (None when none asks one)."""
    return self._judge

  def take_metrics(self, step_seconds: float | None = None) -> dict:
    """The judge's judge/* scalars since the last call ({} without one).

    Counts are over every process (a collective: every process calls this
    as often as the others). With `step_seconds` (a training step's wall
    time) also judge/masked_groups (every process's groups that
    `score_groups` masked since the last such call) and judge/time_share.
    """
    if self._judge is None:
      return {}
    scalars = self._judge.take_metrics()
    if step_seconds is None:
      return scalars
    scalars['judge/masked_groups'] = float(
        sharding.sum_over_processes([self._masked_groups])[0])
    self._masked_groups = 0
    if step_seconds > 0:
      scalars['judge/time_share'] = scalars['judge/wall_s'] / step_seconds
    return scalars

  def annotate(self, texts: Sequence[str]) -> list[str]:
    """Sample texts with the judge's verdict on each, when it judged them
    last (rubric rows); else as they are."""
    judge = self._judge
    if judge is None or len(judge.last_verdicts) != len(texts):
      return list(texts)
    return [f'{t}\n\n[{judge.describe(i)}]' for i, t in enumerate(texts)]

  def score_groups(
      self,
      prompts: Sequence[str],
      completions: Sequence[str],
      num_generations: int,
      **fields: Any,
  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Scores a batch of groups of G completions (`__call__`'s arguments).

    A group with a masked (NaN) completion loses its spread: every
    completion of it gets the group's mean over its scored completions (0
    when none was scored), in the total and in each reward, so its
    advantages are 0: a failed judge call teaches nothing, and never counts
    as a score of 0. The masked groups are counted for `take_metrics`.
    """
    total, per_fn = self(prompts, completions, **fields)
    total, per_fn, masked = mask_failed_groups(total, per_fn,
                                               num_generations)
    self._masked_groups += masked
    return total, per_fn

  def __call__(
      self,
      prompts: Sequence[str],
      completions: Sequence[str],
      **fields: Any,
  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Scores a batch.

    Args:
      prompts: One prompt per completion (repeated G times for a group).
      completions: The generated texts.
      **fields: Per-completion example fields, each a sequence as long as
        `completions` (`answer`, `completion_lengths`, ...). Other values are
        passed through unchanged.

    Returns:
      (total, per_fn): `total` is float32 [N], the sum of weight * scores;
      `per_fn` maps each reward name to its unweighted float32 [N] scores.
      A function registered maskable (rubric_judge) may score NaN: the
      completion is to be masked, and its total is NaN too.

    Raises:
      ValueError: if prompts or a list field does not have one entry per
        completion, or the length penalty is on without `completion_lengths`.
      RewardError: if a reward function raises, or returns the wrong number
        of scores or a non-finite score.
    """
    size = len(completions)
    if len(prompts) != size:
      raise ValueError(
          f'Got {len(prompts)} prompts for {size} completions; repeat each '
          'prompt once per completion.'
      )
    for key, value in fields.items():
      if isinstance(value, (list, tuple, np.ndarray)) and len(value) != size:
        raise ValueError(
            f'Reward field {key!r} has {len(value)} values for {size} '
            'completions; repeat each example field once per completion.'
        )
    lengths_given = 'completion_lengths' in fields
    if registry.LENGTH_PENALTY in self._fns and not lengths_given:
      raise ValueError(
          'rewards.length_penalty > 0 needs the completion_lengths field '
          '(token count per completion); pass it, or set '
          'rewards.length_penalty=0.'
      )
    if registry.OVERLONG_PENALTY in self._fns and not lengths_given:
      raise ValueError(
          'rewards.overlong_buffer > 0 needs the completion_lengths field '
          '(token count per completion); pass it, or set '
          'rewards.overlong_buffer=0.'
      )
    if self._judge is not None:
      fields = dict(fields, judge=self._judge)
    total = np.zeros([size], np.float32)
    per_fn = {}
    for name, fn in self._fns.items():
      scores = self._run_one(name, fn, prompts, completions, fields)
      per_fn[name] = scores
      total += np.float32(self._weights[name]) * scores
    masked = np.zeros([size], bool)
    for name in self._maskable:
      masked |= np.isnan(per_fn[name])
    if not np.all(np.isfinite(total) | masked):
      index = int(np.flatnonzero(~(np.isfinite(total) | masked))[0])
      raise blame.RewardError(
          f'The weighted reward total is not finite at completion {index}: '
          f'{blame.quote(completions[index])}; lower the reward weights.',
          fn_name='total',
          index=index,
          completion=completions[index],
      )
    return total, per_fn

  def _run_one(
      self,
      name: str,
      fn: registry.RewardFn,
      prompts: Sequence[str],
      completions: Sequence[str],
      fields: Mapping[str, Any],
  ) -> np.ndarray:
    """Calls one reward function and checks its scores."""
    size = len(completions)
    try:
      raw = fn(list(prompts), list(completions), **fields)
    except blame.RewardError:
      raise  # It names its culprit (a judge: no per-completion re-calls).
    except Exception as batch_error:  # pylint: disable=broad-exception-caught
      error, cause = blame.blame_completion(
          name, fn, prompts, completions, fields, batch_error
      )
      raise error from cause
    try:
      with np.errstate(over='ignore'):
        scores = np.asarray(raw, dtype=np.float32)
    except (TypeError, ValueError) as e:
      raise blame.RewardError(
          f'Reward {name!r} returned {type(raw).__name__} that is not a list '
          f'of numbers: {e}',
          fn_name=name,
      ) from e
    if scores.shape != (size,):
      raise blame.RewardError(
          f'Reward {name!r} returned scores of shape {scores.shape} for '
          f'{size} completions; return one float per completion.',
          fn_name=name,
      )
    bad = np.flatnonzero(~np.isfinite(scores))
    if name in self._maskable:
      # NaN marks a completion to mask (a failed judge call, counted).
      bad = np.flatnonzero(np.isinf(scores))
    if bad.size:
      index = int(bad[0])
      raise blame.RewardError(
          f'Reward {name!r} returned a non-finite score '
          f'({raw[index]!r}, or too large for float32) for completion '
          f'{index}: {blame.quote(completions[index])}',
          fn_name=name,
          index=index,
          completion=completions[index],
      )
    return scores


def mask_failed_groups(total, per_fn, num_generations):
  """Groups with a masked (NaN) completion get their mean (`score_groups`).

  Returns:
    (total, per_fn, number of groups masked).
  """
  total = np.asarray(total, np.float32)
  failed = ~np.isfinite(total)
  if not failed.any():
    return total, per_fn, 0
  g = num_generations
  groups = failed.reshape(-1, g).any(axis=1)

  def fill(values):
    values = np.asarray(values, np.float32).reshape(-1, g).copy()
    for group in np.flatnonzero(groups):
      scored = values[group][np.isfinite(values[group])]
      values[group] = scored.mean() if scored.size else 0.0
    return values.reshape(-1)

  return (fill(total), {k: fill(v) for k, v in per_fn.items()},
          int(groups.sum()))


def _check_overlong(buffer, penalty, max_length):
  """Raises ValueError for unusable overlong-penalty settings."""
  if buffer < 0:
    raise ValueError(
        f'rewards.overlong_buffer={buffer!r} must be >= 0 tokens (0 turns '
        'the overlong penalty off).'
    )
  if not math.isfinite(penalty) or penalty < 0:
    raise ValueError(
        f'rewards.overlong_penalty={penalty!r} must be a finite number >= 0.'
    )
  if buffer == 0:
    return
  if max_length is None:
    raise ValueError(
        f'rewards.overlong_buffer={buffer} needs the completion length limit '
        '(max_completion_length, generation.max_generation_steps).'
    )
  if buffer > max_length:
    raise ValueError(
        f'rewards.overlong_buffer={buffer} is longer than the completion '
        f'limit generation.max_generation_steps={max_length}; use a buffer '
        f'of at most {max_length} tokens.'
    )
