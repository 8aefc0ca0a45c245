"""The judge's part of a training step (data.task='rubric').

  judge = judging.build(config, workdir, model, tokenizer)  # Session.judge
  fields = judging.reward_fields(session, rows)     # rubric, reference
  total, per_fn, masked = judging.mask_failed_groups(total, per_fn, g)
  scalars.update(judging.step_scalars(session, step_seconds))
  texts = judging.annotate(session, texts)            # + the verdicts
"""

import json

from absl import logging
import numpy as np

from agent_tunix.judge import judge as judge_lib
from agent_tunix.tpu import sharding


def build(config, workdir, model, tokenizer):
  """The run's judge when a listed reward needs one, else None.

  Runs the canary (judge.canary) before training can start.
  """
  if not judge_lib.uses_judge(config):
    return None
  judge = judge_lib.from_config(config, workdir, model, tokenizer)
  if config.judge.canary:
    try:
      judge.canary()
    except Exception:
      judge.close()
      raise
  else:
    logging.warning(
        'judge.canary=False: the judge at %s was not checked on a known-good '
        'and a known-bad answer before training.', judge.backend.where)
  return judge


def reward_fields(session, rows):
  """Rubric rows' per-row reward fields: `rubric` (items), `reference`.

  The judge goes to the reward set on its own (`RewardSet`'s `judge`).
  """
  fields = {}
  if session.config.data.task == 'rubric':
    fields['rubric'] = [json.loads(r) for r in rows['rubric']]
    fields['reference'] = [str(r) for r in rows['reference']]
  return fields


def mask_failed_groups(total, per_fn, g):
  """Groups with a masked (NaN) completion lose their spread.

  Every completion of such a group gets the group's mean over its scored
  completions (0 when none was scored), in the total and in each reward,
  so its advantages are 0: a failed judge call teaches nothing, and never
  counts as a score of 0.

  Returns:
    (total, per_fn, number of groups masked).
  """
  total = np.asarray(total, np.float32)
  failed = ~np.isfinite(total)
  if not failed.any():
    return total, per_fn, 0
  groups = failed.reshape(-1, g).any(axis=1)

  def fill(values):
    values = np.asarray(values, np.float32).reshape(-1, g).copy()
    for group in np.flatnonzero(groups):
      scored = values[group][np.isfinite(values[group])]
      values[group] = scored.mean() if scored.size else 0.0
    return values.reshape(-1)

  return (fill(total), {k: fill(v) for k, v in per_fn.items()},
          int(groups.sum()))


def annotate(session, texts):
  """Sample texts with the judge's verdicts on each (rubric rows)."""
  judge = session.judge
  if judge is None or len(judge.last_verdicts) != len(texts):
    return texts
  return [f'{t}\n\n[{judge.describe(i)}]' for i, t in enumerate(texts)]


def step_scalars(session, step_seconds):
  """judge/* scalars of the step (empty without a judge): counts over every
  process (a collective), wall time and latencies this process's."""
  judge = session.judge
  if judge is None:
    return {}
  scalars = judge.take_metrics()
  scalars['judge/masked_groups'] = float(  # Every process's groups.
      sharding.sum_over_processes([session.state.judge_masked_groups])[0])
  session.state.judge_masked_groups = 0
  if step_seconds > 0:
    scalars['judge/time_share'] = scalars['judge/wall_s'] / step_seconds
  return scalars
