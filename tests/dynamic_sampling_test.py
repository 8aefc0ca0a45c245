"""Dynamic sampling's selection, drawing and batch assembly (NumPy only).

The end-to-end runs are in train_test.py (2 steps, scalars logged) and
resume_test.py (killed and resumed, bit for bit).
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import pytest

from agent_tunix.rl import advantages
from agent_tunix.rl import dynamic_sampling
from agent_tunix.rl import objectives
from agent_tunix.rl import rollout
from agent_tunix.run import train

G = 2
# Group rewards [B=4, G] of three rounds; groups 1 and 3 of round 0 and
# group 0 of round 1 and 2 have no spread.
_ROUNDS = [
    np.array([[1.0, 2.0], [3.0, 3.0], [0.0, -1.0], [5.0, 5.0]], np.float32),
    np.array([[7.0, 7.0], [0.5, 0.0], [2.0, 2.5], [1.0, 0.0]], np.float32),
    np.array([[4.0, 4.0], [1.0, 9.0], [0.0, 0.0], [0.0, 0.0]], np.float32),
]


def test_has_spread_is_max_above_min():
  rewards = np.array([[1, 1, 1], [1, 1, 2], [-3, 0, -3], [0, 0, 0]])
  np.testing.assert_array_equal(dynamic_sampling.has_spread(rewards),
                                [False, True, True, False])


def test_select_takes_groups_with_spread_in_sampling_order():
  selection = dynamic_sampling.select(_ROUNDS[:2], 4)
  # Round 0: groups 0, 2; round 1: groups 1, 2 fill the batch (1, 3 unused).
  np.testing.assert_array_equal(selection.picks,
                                [[0, 0], [0, 2], [1, 1], [1, 2]])
  assert selection.num_kept == 4
  assert selection.num_rounds == 2
  assert selection.dropped_groups == 3  # Round 0: 1, 3; round 1: 0.


def test_select_fills_with_the_earliest_groups_without_spread():
  selection = dynamic_sampling.select(_ROUNDS[:1], 4)
  np.testing.assert_array_equal(selection.picks,
                                [[0, 0], [0, 2], [0, 1], [0, 3]])
  assert selection.num_kept == 2
  assert selection.dropped_groups == 2
  scalars = dynamic_sampling.step_scalars(selection, 4)
  assert scalars == {
      'dynamic_sampling/dropped_groups': 2.0,
      'dynamic_sampling/extra_prompts': 0.0,
      'dynamic_sampling/rounds': 1.0,
      'dynamic_sampling/masked_groups': 2.0,
  }


def test_select_refuses_too_few_groups():
  with pytest.raises(ValueError, match='cannot fill a batch of 5'):
    dynamic_sampling.select(_ROUNDS[:1], 5)


class _Sampled:

  def __init__(self, rewards):
    self.group_rewards = rewards


def _collect(rounds, max_rounds, batch_size=4):
  """Runs `collect` over `rounds` as the data; returns (results, selection,
  the batches drawn, the rounds sampled)."""
  data = iter(range(len(rounds)))
  drawn, sampled = [], []

  def draw():
    drawn.append(next(data))
    return drawn[-1]

  def sample(batch, sampling_round):
    sampled.append((batch, sampling_round))
    return _Sampled(rounds[batch])

  first = next(data)
  results, selection = dynamic_sampling.collect(
      first, draw, sample, batch_size, max_rounds)
  return results, selection, drawn, sampled


def test_collect_draws_until_the_batch_is_full():
  results, selection, drawn, sampled = _collect(_ROUNDS, max_rounds=5)
  # Round 0 has 2 groups with spread, rounds 0 + 1 have 5 >= 4: stop.
  assert drawn == [1]
  assert sampled == [(0, 0), (1, 1)]
  assert [r.group_rewards is _ROUNDS[i] for i, r in enumerate(results)] == [
      True, True]
  assert selection.num_kept == 4 and selection.num_rounds == 2
  assert dynamic_sampling.step_scalars(selection, 4)[
      'dynamic_sampling/extra_prompts'] == 4.0


def test_collect_stops_at_the_cap():
  flat = [np.zeros((4, G), np.float32)] * 5
  _, selection, drawn, sampled = _collect(flat, max_rounds=3)
  assert drawn == [1, 2]
  assert [r for _, r in sampled] == [0, 1, 2]
  assert selection.num_kept == 0
  assert selection.dropped_groups == 12
  scalars = dynamic_sampling.step_scalars(selection, 4)
  assert scalars['dynamic_sampling/extra_prompts'] == 8.0
  assert scalars['dynamic_sampling/masked_groups'] == 4.0


def test_collect_with_one_round_never_draws():
  _, selection, drawn, _ = _collect(_ROUNDS, max_rounds=1)
  assert drawn == []
  assert selection.num_kept == 2


def test_collect_stops_when_the_data_ends():
  flat = [np.zeros((4, G), np.float32)] * 2
  _, selection, drawn, _ = _collect(flat, max_rounds=5)
  assert drawn == [1]  # The third draw hit the end of the data.
  assert selection.num_rounds == 2 and selection.num_kept == 0


def _round(index, rewards, prompt_len=3, completion_len=4):
  """A `Round` whose tokens encode (round, row) so rows can be traced."""
  b = len(rewards)
  n = b * G
  prompts = np.arange(b)[:, None] * 10 + index * 1000 + np.arange(prompt_len)
  tokens = (np.arange(n)[:, None] * 10 + index * 1000 + 500
            + np.arange(completion_len)).astype(np.int32)
  mask = np.ones((n, completion_len), np.float32)
  mask[:, -1] = 0  # Every completion ends one token early.
  tokens[:, -1] = 0
  logps = -np.arange(n * completion_len, dtype=np.float32).reshape(
      n, completion_len) / 100 - index
  out = rollout.Completions(tokens, mask, mask.sum(1).astype(np.int32),
                            np.zeros(n, bool), [''] * n, logps)
  return dynamic_sampling.Round(
      prompt_tokens=prompts.astype(np.int32),
      prompt_mask=np.ones((b, prompt_len), bool), completions=out,
      group_rewards=rewards, per_fn={}, samples=([], [], []))


@pytest.mark.parametrize('scale_rewards', ['group', 'batch', 'none'])
def test_assemble_on_one_process(scale_rewards):
  rounds = [_round(i, r) for i, r in enumerate(_ROUNDS)]
  # Round 2's group 1 is the only kept one there; rounds 0 + 2: 3 kept.
  selection = dynamic_sampling.select([_ROUNDS[0], _ROUNDS[2]], 4)
  rounds = [rounds[0], rounds[2]]
  update = dynamic_sampling.assemble(
      rounds, selection, dynamic_sampling.own_places(4, 0, 1), G)
  np.testing.assert_array_equal(selection.picks,
                                [[0, 0], [0, 2], [1, 1], [0, 1]])
  assert update.tokens.shape == (8, 7)
  for place, (r, j) in enumerate(selection.picks):
    rows = slice(place * G, (place + 1) * G)
    np.testing.assert_array_equal(
        update.tokens[rows, :3],
        np.repeat(rounds[r].prompt_tokens[j][None], G, 0))
    np.testing.assert_array_equal(
        update.tokens[rows, 3:],
        rounds[r].completions.tokens[j * G:(j + 1) * G])
    np.testing.assert_array_equal(
        update.sampler_logps[rows],
        rounds[r].completions.logps[j * G:(j + 1) * G])
  kept_rewards = np.concatenate(
      [_ROUNDS[0][0], _ROUNDS[0][2], _ROUNDS[2][1]])
  # The update's advantages: the kept groups' among themselves, and 0 for
  # the filling group (round 0, group 1), which is out of the loss.
  assert update.advantages is None
  np.testing.assert_array_equal(update.rewards[:6], kept_rewards)
  got, _ = advantages.estimate(
      advantages.GroupRelative(G, scale_rewards), update.rewards, None,
      update.completion_mask)
  np.testing.assert_allclose(
      got[:6], objectives.group_advantages(kept_rewards, G, scale_rewards),
      rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(got[6:], 0.0)
  np.testing.assert_array_equal(update.completion_mask[6:], 0.0)
  np.testing.assert_array_equal(update.completion_mask[:6, :3], 1.0)
  np.testing.assert_array_equal(update.completion_mask[:, 3], 0.0)
  # The filling group's tokens still feed the forward pass.
  assert update.input_mask.dtype == bool
  np.testing.assert_array_equal(update.input_mask[6:, :6], True)
  np.testing.assert_array_equal(update.input_mask[:, 6], False)


def test_processes_split_the_one_process_batch():
  """Two processes' parts are the one-process batch's places 0, 2 / 1, 3."""
  rounds = [_round(i, r) for i, r in enumerate(_ROUNDS[:2])]
  selection = dynamic_sampling.select(_ROUNDS[:2], 4)
  one = dynamic_sampling.assemble(rounds, selection, [0, 1, 2, 3], G)
  for p in range(2):
    places = dynamic_sampling.own_places(4, p, 2)
    np.testing.assert_array_equal(places, [p, p + 2])
    part = dynamic_sampling.assemble(rounds, selection, places, G)
    rows = np.concatenate([np.arange(k * G, (k + 1) * G) for k in places])
    jax.tree.map(lambda got, want: np.testing.assert_array_equal(
        got, want[rows]), part, one)


def test_step_seed_round_zero_is_the_plain_step_seed():
  plain = int(np.random.SeedSequence([42, 7]).generate_state(1)[0])
  assert train.step_seed(42, 7) == plain == train.step_seed(42, 7, 0)
  seeds = {train.step_seed(42, 7, r) for r in range(4)}
  assert len(seeds) == 4
  assert train.step_seed(42, 7, 1) != train.step_seed(42, 8, 1)
