"""The GRPO objective's array functions against NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agent_tunix.rl import advantages
from agent_tunix.rl import objectives


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


# ------------------------------------------------------------------ GSPO


def _numpy_gspo(logps, old, adv, mask, eps_low, eps_high):
  length = np.maximum(mask.sum(-1), 1)
  ratio = np.exp(((logps - old) * mask).sum(-1) / length)
  loss = -np.minimum(ratio * adv,
                     np.clip(ratio, 1 - eps_low, 1 + eps_high) * adv)
  clipped = ((ratio < 1 - eps_low) & (adv < 0)) | (
      (ratio > 1 + eps_high) & (adv > 0))
  return ratio, loss, clipped


def test_sequence_clipped_surrogate_matches_numpy():
  rng = np.random.default_rng(5)
  logps = rng.normal(-2.0, 0.5, size=(6, 5)).astype(np.float32)
  old = (logps + rng.normal(0, 0.3, size=(6, 5))).astype(np.float32)
  adv = np.array([1.0, -1.0, 0.5, -2.0, 1.5, -0.3], np.float32)
  mask = np.ones((6, 5), np.float32)
  mask[1, 3:] = 0
  mask[4, 1:] = 0
  ratio, want, want_clipped = _numpy_gspo(logps, old, adv, mask, 0.05, 0.08)
  loss, clipped = objectives.sequence_clipped_surrogate(
      jnp.asarray(logps), jnp.asarray(old), jnp.asarray(adv),
      jnp.asarray(mask), 0.05, 0.08)
  # One value per sequence, repeated over its columns.
  np.testing.assert_allclose(loss, np.repeat(want[:, None], 5, 1), rtol=1e-5)
  np.testing.assert_array_equal(clipped,
                                np.repeat(want_clipped[:, None], 5, 1))
  assert 0 < want_clipped.sum() < 6  # Both branches exercised.
  # Gradient of sum_i l_i w.r.t. logp_it: -A_i s_i m_it / |y_i| where the
  # unclipped term is active, 0 where the clipped one is.
  grad = jax.grad(lambda lp: objectives.sequence_clipped_surrogate(
      lp, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), 0.05,
      0.08)[0][:, 0].sum())(jnp.asarray(logps))
  want_grad = np.where(
      want_clipped[:, None], 0.0,
      -(adv * ratio / mask.sum(-1))[:, None] * mask)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-7)


def test_sequence_and_token_ratios_agree_on_policy():
  """At ratio 1 (old = current) both give -A on every token."""
  logps = jnp.full((2, 3), -1.5)
  adv = jnp.array([0.7, -0.4])
  mask = jnp.ones((2, 3))
  seq, _ = objectives.sequence_clipped_surrogate(logps, logps, adv, mask,
                                                 0.2, 0.2)
  tok, _ = objectives.clipped_surrogate(logps, logps, adv, 0.2, 0.2)
  np.testing.assert_allclose(seq, tok)


# ---------------------------------------------------------------- entropy


def test_entropy_bonus_subtracts_c_times_h():
  loss = np.array([[0.5, -1.0]], np.float32)
  entropy = np.array([[2.0, 0.5]], np.float32)
  got = objectives.entropy_bonus(jnp.asarray(loss), jnp.asarray(entropy), 0.1)
  np.testing.assert_allclose(got, loss - 0.1 * entropy, rtol=1e-6)


# ------------------------------------------------------------ adaptive KL


@pytest.mark.parametrize('kl, want_error', [
    (0.06, 0.2),     # far above target: clipped at +20%
    (0.045, 0.125),  # above: proportional
    (0.035, -0.125),  # below: proportional
    (0.0, -0.2),
])
def test_adaptive_kl_coeff_follows_ziegler(kl, want_error):
  target, horizon, n, coeff = 0.04, 1000.0, 64, 0.1
  error = min(max(kl / target - 1, -0.2), 0.2)
  assert error == pytest.approx(want_error)
  got = objectives.adaptive_kl_coeff(coeff, kl, target, horizon, n)
  assert got == pytest.approx(coeff * (1 + error * n / horizon), rel=1e-12)
  assert isinstance(got, float)


def test_adaptive_kl_coeff_holds_at_target():
  assert objectives.adaptive_kl_coeff(0.3, 0.05, 0.05, 100.0, 16) == 0.3


# ---------------------------------------------------------------- MaxEnt


def _numpy_maxent_weights(rewards, scores, g, tau, q_temp, q_eps):
  r = rewards.reshape(-1, g).astype(np.float64)
  s = scores.reshape(-1, g).astype(np.float64)
  q = np.exp(r / q_temp - (r / q_temp).max(-1, keepdims=True))
  q = (1 - q_eps) * q / q.sum(-1, keepdims=True) + q_eps / g
  logits = s + np.log(q) / tau
  w = np.exp(logits - logits.max(-1, keepdims=True))
  return (w / w.sum(-1, keepdims=True)).reshape(-1)


def test_maxent_target_weights_match_numpy_and_maximise_the_program():
  rng = np.random.default_rng(7)
  g, tau, q_temp, q_eps = 4, 0.5, 0.7, 0.1
  rewards = rng.normal(size=8).astype(np.float32)
  scores = rng.normal(-1.0, 0.3, size=8).astype(np.float32)
  got = np.asarray(objectives.maxent_target_weights(
      jnp.asarray(rewards), jnp.asarray(scores), g, tau, q_temp, q_eps))
  want = _numpy_maxent_weights(rewards, scores, g, tau, q_temp, q_eps)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(got.reshape(-1, g).sum(-1), 1.0, rtol=1e-6)

  # w maximises sum_i p_i log q_i - tau KL(p || softmax(l)) over the
  # simplex: no random distribution does better.
  r = rewards.reshape(-1, g)[0].astype(np.float64)
  q = np.exp(r / q_temp) / np.exp(r / q_temp).sum()
  q = (1 - q_eps) * q + q_eps / g
  ref = np.exp(scores[:g]) / np.exp(scores[:g]).sum()

  def program(p):
    return (p * np.log(q)).sum() - tau * (p * np.log(p / ref)).sum()

  best = program(got[:g].astype(np.float64))
  for p in rng.dirichlet(np.ones(g), size=200):
    assert program(p) <= best + 1e-9


def test_maxent_tau_limits():
  rewards = jnp.array([0.0, 1.0, 3.0, 2.0])
  scores = jnp.array([-0.5, -2.0, -1.0, -0.2])
  # Large tau: the reference's preferences within the group.
  wide = objectives.maxent_target_weights(rewards, scores, 4, 1e6, 1.0, 0.0)
  np.testing.assert_allclose(wide, jax.nn.softmax(scores), rtol=1e-4)
  # Small tau: all weight on the best reward.
  sharp = objectives.maxent_target_weights(rewards, scores, 4, 1e-3, 0.1,
                                           0.0)
  np.testing.assert_allclose(sharp, [0, 0, 1, 0], atol=1e-6)


@pytest.mark.parametrize('normalize', [True, False])
def test_maxent_advantages(normalize):
  rng = np.random.default_rng(11)
  g = 3
  rewards = rng.normal(size=6).astype(np.float32)
  ref = rng.normal(-2.0, 0.5, size=(6, 4)).astype(np.float32)
  mask = np.ones((6, 4), np.float32)
  mask[0, 2:] = 0
  mask[4, 1:] = 0
  scores = (ref * mask).sum(-1)
  if normalize:
    scores = scores / mask.sum(-1)
  want = g * _numpy_maxent_weights(rewards, scores, g, 0.8, 1.0, 0.05) - 1

  def adv(r):
    return objectives.maxent_advantages(
        jnp.asarray(r), jnp.asarray(ref), jnp.asarray(mask), g, 0.8, 1.0,
        0.05, normalize)

  got = np.asarray(adv(rewards))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # Mean 0 in each group, and a target, not a term to optimise.
  np.testing.assert_allclose(got.reshape(-1, g).mean(-1), 0.0, atol=1e-6)
  grad = jax.grad(lambda r: adv(r).sum())(jnp.asarray(rewards))
  np.testing.assert_array_equal(grad, np.zeros(6))


# ------------------------------------------------ advantage estimators


def _grouped_mask(rows, columns=3, empty_groups=()):
  mask = np.ones((rows, columns), np.float32)
  for group in empty_groups:
    mask[group * 4:(group + 1) * 4] = 0.0
  return jnp.asarray(mask)


@pytest.mark.parametrize('mode', ['group', 'batch', 'none'])
def test_grpo_estimator_is_group_advantages(mode):
  rewards = jnp.asarray(np.random.default_rng(0).normal(size=12), jnp.float32)
  got, metrics = advantages.estimate(
      advantages.GroupRelative(4, mode), rewards, None, _grouped_mask(12))
  np.testing.assert_allclose(
      got, objectives.group_advantages(rewards, 4, mode), rtol=1e-6,
      atol=1e-7)
  assert not metrics


def test_groups_without_tokens_get_zero_and_stay_out_of_batch_stats():
  rng = np.random.default_rng(1)
  rewards = rng.normal(size=12).astype(np.float32)
  got, _ = advantages.estimate(advantages.GroupRelative(4, 'batch'),
                               rewards, None, _grouped_mask(12, 3, (2,)))
  kept = rewards[:8]
  want = (kept.reshape(2, 4) - kept.reshape(2, 4).mean(1, keepdims=True))
  want = want.reshape(-1) / (kept.std(ddof=1) + 1e-4)
  np.testing.assert_allclose(got[:8], want, rtol=1e-5)
  np.testing.assert_array_equal(got[8:], 0.0)


def test_rloo_uses_the_other_completions_mean():
  rewards = np.random.default_rng(2).normal(size=8).astype(np.float32)
  got, _ = advantages.estimate(advantages.LeaveOneOut(4), rewards, None,
                               _grouped_mask(8))
  grouped = rewards.reshape(2, 4)
  others = (grouped.sum(1, keepdims=True) - grouped) / 3
  np.testing.assert_allclose(got, (grouped - others).reshape(-1), rtol=1e-5,
                             atol=1e-6)


def test_maxent_estimator_needs_reference_and_logs_target_entropy():
  rng = np.random.default_rng(3)
  rewards = jnp.asarray(rng.normal(size=8), jnp.float32)
  ref = jnp.asarray(-2.0 + rng.normal(size=(8, 3)), jnp.float32)
  mask = _grouped_mask(8)
  estimator = advantages.MaxEnt(4, tau=0.5, q_temperature=0.7, q_epsilon=0.1)
  got, metrics = advantages.estimate(estimator, rewards, ref, mask)
  want = objectives.maxent_advantages(rewards, ref, mask, 4, 0.5, 0.7, 0.1,
                                      True)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  w = (np.asarray(want) + 1) / 4
  np.testing.assert_allclose(metrics['maxent/target_entropy'],
                             -(w * np.log(w)).sum() / 2, rtol=1e-5)
  with pytest.raises(ValueError, match='reference log-probs'):
    advantages.estimate(estimator, rewards, None, mask)


def test_estimators_are_registered_by_name():
  assert set(advantages.ESTIMATORS) == {'grpo', 'rloo', 'maxent'}
  assert advantages.ESTIMATORS['rloo'] is advantages.LeaveOneOut
  with pytest.raises(ValueError, match='twice'):
    advantages.register('grpo')(type('Other', (), {}))
