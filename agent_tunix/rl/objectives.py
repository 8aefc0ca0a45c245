"""The GRPO objective as pure array functions: advantages, ratios, KL, losses.

Nothing here runs a model: every function maps arrays to arrays and can be
checked against a formula (tests/objectives_test.py checks each against
NumPy). The model passes that produce log-probs are in `logprobs`; the
update that combines them is `grpo`.

Notation: a batch has N rows = prompts x G completions (groups contiguous),
each with C completion tokens; logp is the policy's log-prob of a sampled
token, old_logp that of the policy that sampled it, ref_logp the
reference's; A is a row's advantage and m the completion mask.
"""

import jax
import jax.numpy as jnp

SCALE_REWARDS_MODES = ('group', 'batch', 'none')
KL_ESTIMATORS = ('k1', 'k3')
# The policy-gradient ratio: per token (PPO/GRPO) or per sequence (GSPO).
IMPORTANCE_SAMPLING_LEVELS = ('token', 'sequence')
LOSS_AGG_MODES = (
    'token-mean',
    'sequence-mean-token-mean',
    'sequence-mean-token-sum-norm',
)
# Rematerialisation in the update: 'block' is tunix's RematConfig.BLOCK;

# Added to the reward standard deviation so constant groups do not divide by 0.
_STD_EPS = 1e-4


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise ValueError(
        f'Unknown {name} {value!r}; expected one of {", ".join(allowed)}.'
    )


# ------------------------------------------------------------- advantages


def group_advantages(
    rewards: jax.Array, num_generations: int, scale_rewards: str = 'group',
    batch_std: jax.Array | None = None,
) -> jax.Array:
  """Group-relative advantages.

  Rows g*G .. g*G+G-1 are the G completions of one prompt. Each reward is
  centred on its group's mean, then divided by (std + 1e-4) of its group
  ('group'), of the whole batch ('batch'), or not scaled ('none'). The std is
  the unbiased one (ddof=1), as in TRL and tunix.

  Args:
    rewards: [N] rewards, N = num_prompts * num_generations.
    num_generations: G, completions per prompt.
    scale_rewards: 'group', 'batch' or 'none'.
    batch_std: with 'batch', the std to divide by (a caller's statistic
      over some of the rows); None: that of all rows.

  Returns:
    [N] float32 advantages.
  """
  check_choice('scale_rewards', scale_rewards, SCALE_REWARDS_MODES)
  rewards = jnp.asarray(rewards, jnp.float32)
  if rewards.ndim != 1 or rewards.shape[0] % num_generations:
    raise ValueError(
        f'rewards must be a vector whose length is a multiple of '
        f'num_generations={num_generations}; got shape {rewards.shape}.'
    )
  if num_generations < 2:
    raise ValueError(
        f'num_generations must be >= 2 for group advantages, got '
        f'{num_generations}.'
    )
  grouped = rewards.reshape(-1, num_generations)
  centred = grouped - grouped.mean(axis=1, keepdims=True)
  if scale_rewards == 'group':
    centred = centred / (grouped.std(axis=1, ddof=1, keepdims=True) + _STD_EPS)
  elif scale_rewards == 'batch':
    std = rewards.std(ddof=1) if batch_std is None else batch_std
    centred = centred / (std + _STD_EPS)
  return centred.reshape(-1)

# ------------------------------------------------------------------- loss


def kl_divergence(
    logps: jax.Array, ref_logps: jax.Array, estimator: str = 'k3'
) -> jax.Array:
  """Per-token KL(policy || reference) estimate.

  Args:
    logps: policy log-probs of the sampled tokens.
    ref_logps: reference log-probs of the same tokens.
    estimator: 'k1' (logp - ref) or 'k3' (exp(ref - logp) - (ref - logp) - 1,
      non-negative, low variance).

  Returns:
    Per-token estimates, same shape as logps.
  """
  check_choice('kl_estimator', estimator, KL_ESTIMATORS)
  if estimator == 'k1':
    return logps - ref_logps
  delta = ref_logps - logps
  return jnp.exp(delta) - delta - 1.0


def clipped_surrogate(
    logps: jax.Array,
    old_logps: jax.Array,
    advantages: jax.Array,
    epsilon: float,
    epsilon_high: float,
) -> tuple[jax.Array, jax.Array]:
  """PPO clipped surrogate loss per token.

  Args:
    logps: [B, C] current log-probs.
    old_logps: [B, C] log-probs of the policy that sampled the tokens.
    advantages: [B] advantages, one per sequence.
    epsilon: lower clip range (ratio >= 1 - epsilon).
    epsilon_high: upper clip range (ratio <= 1 + epsilon_high).

  Returns:
    (loss [B, C], clipped [B, C] bool). `clipped` marks tokens whose clipped
    term is the active one, i.e. the ratio left the trust region in the
    direction the advantage pushes (so the token gets no gradient).
  """
  ratio = jnp.exp(logps - old_logps)
  adv = advantages[:, None]
  unclipped = ratio * adv
  clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon_high) * adv
  loss = -jnp.minimum(unclipped, clipped)
  is_clipped = ((ratio < 1.0 - epsilon) & (adv < 0)) | (
      (ratio > 1.0 + epsilon_high) & (adv > 0)
  )
  return loss, is_clipped


def tis_weights(
    trainer_logps: jax.Array, sampler_logps: jax.Array, cap: float
) -> jax.Array:
  """Truncated importance sampling weights, no gradient.

  w = stop_gradient(min(exp(trainer_logps - sampler_logps), cap)): the
  ratio of the trainer's probability of each sampled token to the
  sampler's, capped so that a token the sampler found unlikely cannot blow
  up the update.

  Args:
    trainer_logps: [B, C] the trainer's log-probs of the sampling policy.
    sampler_logps: [B, C] the sampler's log-probs of the same tokens.
    cap: upper bound of the weight (> 0).

  Returns:
    [B, C] float32 weights in (0, cap].
  """
  ratio = jnp.exp(trainer_logps - sampler_logps)
  return jax.lax.stop_gradient(jnp.minimum(ratio, cap))


def agg_count(mask: jax.Array, mode: str) -> jax.Array:
  """What `aggregate_loss` averages over: tokens, or non-empty sequences."""
  if mode == 'token-mean':
    return mask.sum()
  return (mask.sum(axis=-1) > 0).sum().astype(mask.dtype)


def aggregate_loss(
    per_token_loss: jax.Array,
    mask: jax.Array,
    mode: str,
    max_len: int | None = None,
) -> jax.Array:
  """Reduces a [B, C] per-token loss to a scalar.

  Modes:
    'token-mean': sum over all masked tokens / number of masked tokens.
    'sequence-mean-token-mean': per-sequence token mean, then mean over
      sequences.
    'sequence-mean-token-sum-norm' (Dr. GRPO): per-sequence token sum /
      max_len, then mean over sequences.
  Sequences with no masked token are left out of the sequence means.

  Args:
    per_token_loss: [B, C].
    mask: [B, C], 1 where a token counts.
    mode: one of LOSS_AGG_MODES.
    max_len: Dr. GRPO normaliser; None means C.

  Returns:
    Scalar float32 loss.
  """
  check_choice('loss_agg_mode', mode, LOSS_AGG_MODES)
  mask = mask.astype(jnp.float32)
  masked = per_token_loss.astype(jnp.float32) * mask
  count = jnp.maximum(agg_count(mask, mode), 1.0)
  if mode == 'token-mean':
    return masked.sum() / count
  if mode == 'sequence-mean-token-mean':
    per_seq = masked.sum(axis=-1) / jnp.maximum(mask.sum(axis=-1), 1.0)
  else:
    norm = per_token_loss.shape[-1] if max_len is None else max_len
    per_seq = masked.sum(axis=-1) / norm
  return per_seq.sum() / count


def entropy_bonus(per_token_loss: jax.Array, entropy: jax.Array,
                  coeff: float) -> jax.Array:
  """The per-token loss minus coeff * H: l_t - c H(pi_theta(. | y_<t)).

  H is the entropy of the policy's (tempered) next-token distribution at
  each completion position (`logprobs.chunked_token_logps`); with c > 0 the
  update is rewarded for keeping it high, which slows entropy collapse.
  The gradient flows through H.

  Args:
    per_token_loss: [B, C].
    entropy: [B, C] per-token entropies, with their gradient.
    coeff: c.

  Returns:
    [B, C].
  """
  return per_token_loss - coeff * entropy


# ------------------------------------------- sequence-level ratio (GSPO)


def sequence_clipped_surrogate(
    logps: jax.Array,
    old_logps: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    epsilon: float,
    epsilon_high: float,
) -> tuple[jax.Array, jax.Array]:
  """GSPO's clipped surrogate: one length-normalised ratio per sequence.

  Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071)
  replaces the per-token ratio by the geometric mean of a sequence's
  token ratios,

    s_i = exp( sum_t m_it (logp_it - old_logp_it) / sum_t m_it ),

  and clips it as PPO clips a token's:

    l_i = -min( s_i A_i, clip(s_i, 1 - epsilon, 1 + epsilon_high) A_i ).

  l_i is returned on every token of row i, so `aggregate_loss` with
  'sequence-mean-token-mean' gives the paper's (1/G) sum_i l_i per group
  ('token-mean' weighs each sequence by its length). The gradient of s_i is
  s_i times the mean of its tokens' log-prob gradients. The paper clips at
  ~3e-4 / 4e-4: a sequence ratio moves far less than a token's.

  Args:
    logps: [B, C] current log-probs.
    old_logps: [B, C] log-probs of the policy that sampled the tokens.
    advantages: [B] advantages.
    mask: [B, C], 1 on completion tokens that count.
    epsilon: lower clip range.
    epsilon_high: upper clip range.

  Returns:
    (loss [B, C], clipped [B, C] bool): each row's l_i and whether its
    clipped term is the active one, repeated over the row's C columns.
  """
  mask = mask.astype(jnp.float32)
  length = jnp.maximum(mask.sum(axis=-1), 1.0)
  log_ratio = ((logps - old_logps) * mask).sum(axis=-1) / length
  ratio = jnp.exp(log_ratio)
  unclipped = ratio * advantages
  clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon_high) * advantages
  loss = -jnp.minimum(unclipped, clipped)
  is_clipped = ((ratio < 1.0 - epsilon) & (advantages < 0)) | (
      (ratio > 1.0 + epsilon_high) & (advantages > 0)
  )
  columns = logps.shape[-1]
  return (jnp.repeat(loss[:, None], columns, axis=1),
          jnp.repeat(is_clipped[:, None], columns, axis=1))


# ------------------------------------------------------------ adaptive KL


def adaptive_kl_coeff(coeff: float, kl: float, target: float, horizon: float,
                      num_samples: int) -> float:
  """The next KL coefficient of Ziegler et al.'s adaptive controller.

  Fine-Tuning Language Models from Human Preferences (Ziegler et al. 2019,
  arXiv:1909.08593, section 2.2) keeps the measured KL near a target with
  a proportional controller:

    e = clip(kl / target - 1, -0.2, 0.2)
    beta' = beta * (1 + e * n / horizon)

  where n is the number of samples (completions) the step trained on and
  horizon is in samples too, so the coefficient's rate of change does not
  depend on the batch size. Computed on the host in float64 (the value is
  checkpointed, so a resumed run continues the same sequence).

  Args:
    coeff: beta, the current coefficient (> 0).
    kl: the step's measured KL (mean per completion token).
    target: the KL to hold (> 0).
    horizon: samples over which an error of 20% changes beta by ~e-fold.
    num_samples: n, completions in the step.

  Returns:
    The next coefficient, a Python float.
  """
  error = min(max(kl / target - 1.0, -0.2), 0.2)
  return float(coeff) * (1.0 + error * num_samples / horizon)


# ------------------------------------------------------------ MaxEnt-GRPO


def maxent_target_weights(
    rewards: jax.Array,
    ref_scores: jax.Array,
    num_generations: int,
    tau: float,
    q_temperature: float,
    q_epsilon: float,
) -> jax.Array:
  """Each group's maximum-entropy target distribution over its completions.

  For one prompt with completions y_1..y_G, rewards r_i and reference
  scores l_i (the reference's log-prob of y_i, or its mean per token; see
  `maxent_advantages`):

    q_i = (1 - q_epsilon) softmax(r / q_temperature)_i + q_epsilon / G
    w   = argmax over distributions p on the group of
            sum_i p_i log q_i - tau KL(p || softmax(l))
        = softmax(l + log(q) / tau)

  (the maximiser, from the Lagrangian: log p_i = l_i + log(q_i) / tau +
  const). q is a listwise target that ranks completions by reward, kept
  away from 0 by q_epsilon; tau weighs the regulariser
  -KL(p || reference) = H(p) + sum_i p_i log softmax(l)_i, entropy plus
  closeness to the reference: large tau keeps w near the reference's
  preferences within the group, small tau follows q. w is a tempered
  geometric mean of q and the reference.

  Args:
    rewards: [N] rewards, groups of G contiguous rows.
    ref_scores: [N] reference scores l.
    num_generations: G.
    tau: > 0.
    q_temperature: > 0.
    q_epsilon: in [0, 1].

  Returns:
    [N] float32 weights; each group's sum to 1.
  """
  rewards = rewards.astype(jnp.float32).reshape(-1, num_generations)
  scores = ref_scores.astype(jnp.float32).reshape(-1, num_generations)
  q = ((1.0 - q_epsilon) * jax.nn.softmax(rewards / q_temperature, axis=-1)
       + q_epsilon / num_generations)
  return jax.nn.softmax(scores + jnp.log(q) / tau, axis=-1).reshape(-1)


def maxent_advantages(
    rewards: jax.Array,
    ref_logps: jax.Array,
    mask: jax.Array,
    num_generations: int,
    tau: float,
    q_temperature: float,
    q_epsilon: float,
    length_normalize_ref: bool,
) -> jax.Array:
  """MaxEnt-GRPO's advantages: A_i = G w_i - 1, no gradient.

  The policy is moved toward each group's target w
  (`maxent_target_weights`) by minimising the cross-entropy
  -sum_i w_i log p_theta(y_i) of the target against the policy's
  distribution over the group. At the sampling policy that distribution is
  the group's empirical one, 1/G on each of the G draws, where the
  gradient is

    -sum_i (w_i - 1/G) grad log pi_theta(y_i)
      = -(1/G) sum_i (G w_i - 1) grad log pi_theta(y_i):

  the policy gradient with advantage A_i = G w_i - 1 (mean 0 in each
  group; a completion the target weighs above uniform is pushed up). These
  advantages then enter the usual clipped surrogate in place of the
  reward-normalised ones.

  Args:
    rewards: [N] rewards.
    ref_logps: [N, C] reference log-probs of the completion tokens.
    mask: [N, C] completion mask.
    num_generations: G.
    tau: see `maxent_target_weights`.
    q_temperature: see `maxent_target_weights`.
    q_epsilon: see `maxent_target_weights`.
    length_normalize_ref: reference score l_i is the mean log-prob per
      completion token instead of the sum (a sum makes the reference prefer
      the shortest completion by tens of nats).

  Returns:
    [N] float32 advantages.
  """
  mask = mask.astype(jnp.float32)
  scores = (ref_logps.astype(jnp.float32) * mask).sum(axis=-1)
  if length_normalize_ref:
    scores = scores / jnp.maximum(mask.sum(axis=-1), 1.0)
  weights = maxent_target_weights(rewards, scores, num_generations, tau,
                                  q_temperature, q_epsilon)
  return jax.lax.stop_gradient(num_generations * weights - 1.0)
