"""User reward functions for the end-to-end tests ('reward_fixtures:<fn>').

pytest puts tests/ on sys.path (the directory has no __init__.py), so
`rewards.functions='reward_fixtures:text_length=1'` resolves in tests; tests
that start subprocesses add tests/ to their PYTHONPATH.
"""


def text_length(prompts, completions, **unused):
  """Characters / 10: differs between a random model's completions.

  Varied rewards give non-zero advantages, so the policy actually changes.
  """
  del prompts, unused
  return [len(c) / 10 for c in completions]


def nan_reward(prompts, completions, **unused):
  """NaN for every completion: must stop training."""
  del prompts, unused
  return [float('nan')] * len(completions)


CALLS = {'fail_on_third_call': 0}


def fail_on_third_call(prompts, completions, **unused):
  """Scores like text_length, but raises on its third call (step 3)."""
  CALLS['fail_on_third_call'] += 1
  if CALLS['fail_on_third_call'] == 3:
    raise RuntimeError('fail_on_third_call: reward server went away')
  return text_length(prompts, completions, **unused)
