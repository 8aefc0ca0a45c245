"""User reward functions for the end-to-end tests ('reward_fixtures:<fn>').

pytest puts tests/ on sys.path (the directory has no __init__.py), so
`rewards.functions='reward_fixtures:text_length=1'` resolves in tests; tests
that start subprocesses add tests/ to their PYTHONPATH.
"""

import errno
import functools

import numpy as np


def text_length(prompts, completions, **unused):
  """Characters / 10: differs between a random model's completions.

  Varied rewards give non-zero advantages, so the policy actually changes.
  """
  del prompts, unused
  return [len(c) / 10 for c in completions]


def text_length_some_answers(prompts, completions, answer, **unused):
  """text_length for questions whose answer is a multiple of 4, else 0.

  The other questions' groups get no reward spread (about half of the
  synthetic ones): dynamic sampling drops them and draws further prompts.
  """
  del prompts, unused
  return [len(c) / 10 if int(float(a)) % 4 == 0 else 0.0
          for c, a in zip(completions, answer)]


def nan_reward(prompts, completions, **unused):
  """NaN for every completion: must stop training."""
  del prompts, unused
  return [float('nan')] * len(completions)


@functools.cache
def _positive_side():
  """Bool [vocab]: tokens on the positive side of the tiny model's embedding.

  configs/tiny.py's random model (always initialised from seed 0) has tied
  input/output embeddings; a token is on the positive side when the first
  coordinate of its embedding is positive (about half the vocabulary).
  """
  # pylint: disable=g-import-not-at-top
  from agent_tunix.models import gemma
  from agent_tunix.tpu import sharding
  from agent_tunix.configs import tiny
  # pylint: enable=g-import-not-at-top
  config = tiny.get_config()
  model = gemma.random_model(
      gemma.model_config(config.model), sharding.make_mesh(config.mesh)
  )
  return np.asarray(model.embedder.input_embedding[...])[:, 0] > 0


def embedding_side(prompts, completions, completion_tokens, **unused):
  """Share of completion tokens on the positive side (`_positive_side`).

  Learnable by the tiny random model: its output logits are the final hidden
  state times the embeddings, so moving that state along the first
  embedding coordinate moves the top-k candidates to the positive side.
  A single token id is not: the embeddings are so small (std 0.02) that no
  hidden state lifts one token's probability much above uniform over top-k.
  """
  del prompts, completions, unused
  side = _positive_side()
  return [float(side[np.asarray(t, np.int64)].mean()) if len(t) else 0.0
          for t in completion_tokens]


CALLS = {'fail_on_third_call': 0, 'disk_full_on_fourth_call': 0}


def fail_on_third_call(prompts, completions, **unused):
  """Scores like text_length, but raises on its third call (step 3)."""
  CALLS['fail_on_third_call'] += 1
  if CALLS['fail_on_third_call'] == 3:
    raise RuntimeError('fail_on_third_call: reward server went away')
  return text_length(prompts, completions, **unused)


def disk_full_on_fourth_call(prompts, completions, **unused):
  """Scores like text_length; its fourth call (step 4) finds a full disk."""
  CALLS['disk_full_on_fourth_call'] += 1
  if CALLS['disk_full_on_fourth_call'] == 4:
    raise OSError(errno.ENOSPC, 'No space left on device', '/w/scores.json')
  return text_length(prompts, completions, **unused)
