"""The GRPO objective's array functions against NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agent_tunix import objectives


@pytest.mark.parametrize('mode', ['group', 'batch', 'none'])
def test_group_advantages_matches_numpy(mode):
  rewards = np.array([1.0, 0.0, 2.0, 3.0, 5.0, 5.0, 4.0, 1.0], np.float32)
  grouped = rewards.reshape(2, 4)
  want = grouped - grouped.mean(axis=1, keepdims=True)
  if mode == 'group':
    want = want / (grouped.std(axis=1, ddof=1, keepdims=True) + 1e-4)
  elif mode == 'batch':
    want = want / (rewards.std(ddof=1) + 1e-4)
  # Jitted, with the static arguments marked, as the train loop may use it.
  advantages = jax.jit(objectives.group_advantages, static_argnums=(1, 2))
  got = advantages(jnp.asarray(rewards), 4, mode)
  np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-5, atol=1e-6)


def test_group_advantages_constant_group_is_zero():
  got = objectives.group_advantages(jnp.array([2.0, 2.0, 0.0, 1.0]), 2, 'group')
  np.testing.assert_allclose(got[:2], [0.0, 0.0])
  assert float(got[3]) > 0.0


def test_group_advantages_rejects_bad_input():
  with pytest.raises(ValueError, match=r"'median'.*group, batch, none"):
    objectives.group_advantages(jnp.ones(4), 2, 'median')
  with pytest.raises(ValueError, match='num_generations=3'):
    objectives.group_advantages(jnp.ones(4), 3, 'group')


# ------------------------------------------------------------------- loss


def test_kl_divergence_estimators():
  logps = np.array([[-1.0, -2.0, -0.5]], np.float32)
  ref = np.array([[-1.5, -2.0, -0.1]], np.float32)
  np.testing.assert_allclose(
      objectives.kl_divergence(logps, ref, 'k1'), logps - ref, rtol=1e-6
  )
  delta = ref - logps
  np.testing.assert_allclose(
      objectives.kl_divergence(logps, ref, 'k3'),
      np.exp(delta) - delta - 1.0,
      rtol=1e-5,
      atol=1e-7,
  )
  with pytest.raises(ValueError, match="'k2'"):
    objectives.kl_divergence(logps, ref, 'k2')


@pytest.mark.parametrize('epsilon_high', [0.2, 0.5])
def test_clipped_surrogate_matches_numpy(epsilon_high):
  epsilon = 0.2
  rng = np.random.default_rng(0)
  logps = rng.normal(-2.0, 0.5, size=(4, 6)).astype(np.float32)
  old = rng.normal(-2.0, 0.5, size=(4, 6)).astype(np.float32)
  adv = np.array([1.0, -1.0, 0.5, -2.0], np.float32)
  ratio = np.exp(logps - old)
  a = adv[:, None]
  want = -np.minimum(
      ratio * a, np.clip(ratio, 1 - epsilon, 1 + epsilon_high) * a
  )
  want_clipped = ((ratio < 1 - epsilon) & (a < 0)) | (
      (ratio > 1 + epsilon_high) & (a > 0)
  )
  loss, clipped = objectives.clipped_surrogate(
      jnp.asarray(logps), jnp.asarray(old), jnp.asarray(adv), epsilon,
      epsilon_high,
  )
  np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(clipped, want_clipped)
  # The data must exercise both branches for the test to mean something.
  assert 0 < want_clipped.sum() < want_clipped.size


def test_clip_higher_widens_only_the_upper_bound():
  logps = jnp.log(jnp.array([[1.4, 0.6]]))
  old = jnp.zeros((1, 2))
  for adv, expect_tight, expect_wide in ((1.0, [1, 0], [0, 0]),
                                         (-1.0, [0, 1], [0, 1])):
    advantages = jnp.array([adv])
    _, tight = objectives.clipped_surrogate(logps, old, advantages, 0.2, 0.2)
    _, wide = objectives.clipped_surrogate(logps, old, advantages, 0.2, 0.5)
    np.testing.assert_array_equal(tight[0], np.array(expect_tight, bool))
    np.testing.assert_array_equal(wide[0], np.array(expect_wide, bool))


def _numpy_aggregate(loss, mask, mode):
  rows = [r for r in range(loss.shape[0]) if mask[r].sum() > 0]
  if mode == 'token-mean':
    return (loss * mask).sum() / mask.sum()
  if mode == 'sequence-mean-token-mean':
    return np.mean([(loss[r] * mask[r]).sum() / mask[r].sum() for r in rows])
  return np.mean([(loss[r] * mask[r]).sum() / loss.shape[1] for r in rows])


@pytest.mark.parametrize('mode', objectives.LOSS_AGG_MODES)
def test_aggregate_loss_matches_numpy(mode):
  rng = np.random.default_rng(0)
  loss = rng.normal(size=(4, 5)).astype(np.float32)
  mask = np.array(
      [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]],
      np.float32,
  )
  got = objectives.aggregate_loss(jnp.asarray(loss), jnp.asarray(mask), mode)
  np.testing.assert_allclose(got, _numpy_aggregate(loss, mask, mode),
                             rtol=1e-5)


def test_aggregate_loss_dr_grpo_max_len_and_bad_mode():
  loss = jnp.ones((2, 4))
  mask = jnp.array([[1, 1, 0, 0], [1, 1, 1, 1]], jnp.float32)
  got = objectives.aggregate_loss(loss, mask, 'sequence-mean-token-sum-norm', 8)
  np.testing.assert_allclose(got, (2 / 8 + 4 / 8) / 2)
  with pytest.raises(ValueError, match="'seq-mean'.*token-mean"):
    objectives.aggregate_loss(loss, mask, 'seq-mean')


def test_tis_weights_match_numpy():
  rng = np.random.default_rng(3)
  trainer = rng.normal(-2, 1, (3, 6)).astype(np.float32)
  sampler = (trainer + rng.normal(0, 0.7, (3, 6))).astype(np.float32)
  cap = 1.5
  want = np.minimum(np.exp(trainer.astype(np.float64) - sampler), cap)
  assert (want == cap).any() and (want < 1).any()  # Both sides of the cap.
  got = objectives.tis_weights(jnp.asarray(trainer), jnp.asarray(sampler), cap)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  # A weight, not a term to optimise: no gradient flows through it.
  grad = jax.grad(lambda t: objectives.tis_weights(t, sampler, cap).sum())(
      jnp.asarray(trainer))
  np.testing.assert_array_equal(grad, np.zeros_like(trainer))
