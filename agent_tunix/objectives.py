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
    rewards: jax.Array, num_generations: int, scale_rewards: str = 'group'
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
    centred = centred / (rewards.std(ddof=1) + _STD_EPS)
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
