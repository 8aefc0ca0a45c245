"""The run's reward set, with its judge when a listed reward asks one.

  reward_set = judging.reward_set(config, workdir, model, tokenizer)
  judge = judging.build(config, workdir, model, tokenizer)  # or None

The reward set owns the judge (rubric_judge gets it; its metrics and
verdicts are read through the set), so the train loop knows only rewards.
"""

from absl import logging

from agent_tunix import rewards
from agent_tunix.judge import judge as judge_lib


def reward_set(config, workdir, model, tokenizer):
  """The `rewards.RewardSet` of `config.rewards`, built with the run's
  judge (`build`) when a listed reward needs one."""
  return rewards.RewardSet.from_config(
      config.rewards, config.generation.max_generation_steps,
      judge=build(config, workdir, model, tokenizer))


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
