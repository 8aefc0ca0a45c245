"""GRPO math: advantages, per-token log-probs, KL, clipped loss, one update.

Everything here is a small pure function of arrays (or of an NNX model and
arrays) that can run under `jax.jit`, plus three jitted entry points for the
train loop:

* `train_step(model, optimizer, batch, hp)`: one LoRA update from a batch of
  rollouts, with gradient accumulation over micro-batches.
* `reference_logps(model, batch, hp)`: log-probs of the completions under the
  base model (LoRA switched off), for the KL term.
* `policy_logps(model, batch, hp)`: log-probs under the current policy, no
  gradient; the "old" log-probs when a batch is reused (num_iterations > 1).

All log-probs here (policy, old and reference) and the entropy come from
the logits divided by the rollouts' sampling temperature (`hp.temperature`),
so ratio, KL and entropy refer to the distribution the completions were
drawn from.

The jitted functions are `jax.jit` over the model split into states, with
the hyperparameters `hp` (a frozen, hashable `StepHParams`) as a static
argument and the graph definitions closed over (`GraphJit`), so each
distinct `hp` compiles once. They
return only what changes (log-probs; new LoRA and optimizer state): `nnx.jit`
would return every weight of the model too, a copy of all of them per call.
Gradients are taken with `jax.value_and_grad` with respect to the LoRA state
only, so the frozen backbone never gets a gradient buffer.

Batch layout (N rows = prompts x generations, groups contiguous):

  tokens           int32   [N, P + C]  left-padded prompt, then completion
  input_mask       bool    [N, P + C]  True on real (non-pad) tokens
  completion_mask  float32 [N, C]      1 on completion tokens that count
  advantages       float32 [N]
  old_logps        float32 [N, C]      optional; absent = current policy
  ref_logps        float32 [N, C]      needed only when hp.beta > 0
  sampler_logps    float32 [N, C]      optional; the sampler's log-probs of
                                       the completion tokens (rollout.py)

The reference policy is the same backbone with LoRA disabled: qwix rewrites
the model's class so that only its top-level `__call__` applies the adapters,
and keeps the plain class as `_unquantized_type`. Calling that class's
`__call__` on the same object runs the frozen weights alone, so no second copy
of the weights is needed.
"""

import dataclasses
import functools
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import optax
from tunix.models.gemma3 import model as gemma3_lib

SCALE_REWARDS_MODES = ('group', 'batch', 'none')
KL_ESTIMATORS = ('k1', 'k3')
LOSS_AGG_MODES = (
    'token-mean',
    'sequence-mean-token-mean',
    'sequence-mean-token-sum-norm',
)
# Rematerialisation in the update: 'block' is tunix's RematConfig.BLOCK;
# 'layer' is ours (`_LayerRematDecoderLayer`), not tunix's DECODER, whose
# jax.checkpoint recomputation XLA CPU schedules early (no memory saved).
REMAT_MODES = ('none', 'block', 'layer')

# Metric: mean |sampler log-prob - trainer log-prob| over completion tokens.
SAMPLER_GAP = 'sampler/logp_abs_diff'

# Added to the reward standard deviation so constant groups do not divide by 0.
_STD_EPS = 1e-4

# Per-row batch arrays the update reads; other keys in a batch are ignored.
_BATCH_KEYS = (
    'tokens',
    'input_mask',
    'completion_mask',
    'advantages',
    'old_logps',
    'ref_logps',
    'sampler_logps',
)


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise ValueError(
        f'Unknown {name} {value!r}; expected one of {", ".join(allowed)}.'
    )


@dataclasses.dataclass(frozen=True)
class StepHParams:
  """Static hyperparameters of the GRPO update (hashable, for jit).

  Attributes:
    beta: KL coefficient; 0 means no KL term and no reference pass.
    epsilon: lower PPO clip range (and upper, unless epsilon_high >= 0).
    epsilon_high: upper clip range; negative means equal to epsilon.
    kl_estimator: 'k1' or 'k3'.
    loss_agg_mode: one of LOSS_AGG_MODES.
    chunk_size: sequence chunk for log-probs (bounds the [B, chunk, vocab]
      logits buffer).
    micro_batch_size: rows per forward/backward pass; 0 means the whole batch.
      Must divide the number of rows in a batch.
    remat: one of REMAT_MODES; 'block' recomputes each attention and MLP
      block in the backward pass of the update instead of storing its
      activations; 'layer' stores only each decoder layer's input and
      recomputes the whole layer.
    prompt_group: G when rows i*G .. i*G + G - 1 of every batch share their
      prompt (the train loop's batches); each prompt then runs through the
      model once per pass (see `per_token_logps`). 1 = no sharing. Must
      divide micro_batch_size.
    temperature: the rollouts' sampling temperature. Policy, old and
      reference log-probs (and the entropy) are computed from the logits
      divided by it, so ratio, KL and entropy refer to the distribution the
      completions were drawn from. 1 = the model's own logits (also used
      for greedy rollouts, which have no tempered distribution).
    tis_cap: truncated importance sampling; 0 = off. Above 0 each token's
      policy-gradient (clipped surrogate) term is multiplied by
      w = stop_gradient(min(exp(old_logp - sampler_logp), tis_cap)), where
      old_logp is the trainer's log-prob of the policy that sampled (the
      batch's old_logps, or this pass's own) and sampler_logp the
      sampler's (batch['sampler_logps'], required). It corrects for a
      sampler whose numerics differ from the trainer's (bfloat16, other
      kernels, a remote sampler); the KL term is not weighted.
    completion_norm: the tokens per sequence 'sequence-mean-token-sum-norm'
      (Dr. GRPO) divides by; 0 = the batch's completion length C. The train
      loop sets generation.max_generation_steps, so trimming a batch to a
      shorter bucket (`trim_completions`) leaves the loss unchanged.
  """

  beta: float = 0.04
  epsilon: float = 0.2
  epsilon_high: float = -1.0
  kl_estimator: str = 'k3'
  loss_agg_mode: str = 'token-mean'
  chunk_size: int = 64
  micro_batch_size: int = 0
  remat: str = 'none'
  prompt_group: int = 1
  temperature: float = 1.0
  tis_cap: float = 0.0
  completion_norm: int = 0

  def __post_init__(self):
    _check_choice('kl_estimator', self.kl_estimator, KL_ESTIMATORS)
    _check_choice('remat', self.remat, REMAT_MODES)
    _check_choice('loss_agg_mode', self.loss_agg_mode, LOSS_AGG_MODES)
    if self.beta < 0:
      raise ValueError(f'beta must be >= 0, got {self.beta}.')
    if self.epsilon < 0:
      raise ValueError(f'epsilon must be >= 0, got {self.epsilon}.')
    if self.temperature <= 0:
      raise ValueError(
          f'temperature must be > 0, got {self.temperature}; greedy rollouts '
          'use 1.'
      )
    if self.tis_cap < 0:
      raise ValueError(f'tis_cap must be >= 0 (0 = off), got {self.tis_cap}.')
    if self.chunk_size < 1:
      raise ValueError(f'chunk_size must be >= 1, got {self.chunk_size}.')
    if self.micro_batch_size < 0:
      raise ValueError(
          f'micro_batch_size must be >= 0 (0 = whole batch), got '
          f'{self.micro_batch_size}.'
      )
    if self.prompt_group < 1 or self.micro_batch_size % self.prompt_group:
      raise ValueError(
          f'prompt_group={self.prompt_group} must be >= 1 and divide '
          f'micro_batch_size={self.micro_batch_size}.'
      )

  @property
  def upper_epsilon(self) -> float:
    return self.epsilon if self.epsilon_high < 0 else self.epsilon_high


def hparams_from_config(config: Any) -> StepHParams:
  """Builds StepHParams from a full agent_tunix config.

  `training.micro_batch_size` counts prompts; each prompt gives
  `grpo.num_generations` rows, so the row count is their product. The
  temperature is `generation.temperature` (1 when it is 0: greedy rollouts).

  Args:
    config: the ml_collections config (see configs/base.py).

  Returns:
    The static hyperparameters of the update.
  """
  return StepHParams(
      beta=float(config.grpo.beta),
      epsilon=float(config.grpo.epsilon),
      epsilon_high=float(config.grpo.epsilon_high),
      kl_estimator=config.grpo.kl_estimator,
      loss_agg_mode=config.grpo.loss_agg_mode,
      chunk_size=int(config.grpo.logps_chunk_size),
      micro_batch_size=int(
          config.training.micro_batch_size * config.grpo.num_generations
      ),
      remat=config.model.remat,
      prompt_group=(
          int(config.grpo.num_generations) if config.grpo.share_prompts else 1
      ),
      temperature=float(config.generation.temperature or 1.0),
      tis_cap=float(config.grpo.tis_cap),
      completion_norm=int(config.generation.max_generation_steps),
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
  _check_choice('scale_rewards', scale_rewards, SCALE_REWARDS_MODES)
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


# --------------------------------------------------------------- log-probs


def chunked_token_logps(
    hidden: jax.Array,
    embedding: jax.Array,
    targets: jax.Array,
    chunk_size: int,
    compute_entropy: bool = False,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array | None]:
  """Log-probabilities of `targets` under logits = hidden @ embedding.T / T.

  The sequence is processed `chunk_size` positions at a time with
  `lax.map`. With more than one chunk, each is rematerialised in the
  backward pass, so at most one [B, chunk_size, V] logits block exists at a
  time, forward or backward. A single chunk is not rematerialised: its
  backward pass runs right after its forward pass, so recomputing the logits
  would save no memory and cost one more [B, T, D] x [D, V] matmul. Logits
  are accumulated and normalised in float32.

  The logits are divided by `temperature` (T) before the softmax, as the
  sampler divides them before drawing a token, so log-probs and entropy are
  those of the distribution the tokens were sampled from.

  Args:
    hidden: [B, T, D] final hidden states.
    embedding: [V, D] output embedding (tied input embedding for Gemma).
    targets: [B, T] int token ids.
    chunk_size: positions per chunk; T need not be a multiple of it.
    compute_entropy: also return the per-token entropy of the distribution.
    temperature: T > 0, the sampling temperature (1 = the model's logits).

  Returns:
    (logps [B, T] float32, entropy [B, T] float32 or None).
  """
  if temperature <= 0:
    raise ValueError(f'temperature must be > 0, got {temperature}.')
  batch, length, dim = hidden.shape
  chunk = max(1, min(chunk_size, length))
  num_chunks = -(-length // chunk)
  pad = num_chunks * chunk - length
  if pad:
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
  hidden = hidden.reshape(batch, num_chunks, chunk, dim).swapaxes(0, 1)
  targets = targets.reshape(batch, num_chunks, chunk).swapaxes(0, 1)

  def one_chunk(args):
    h, t = args
    logits = jnp.einsum(
        'bcd,vd->bcv', h, embedding, preferred_element_type=jnp.float32
    )
    if temperature != 1.0:
      logits = logits / temperature
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
    logps = picked - lse
    if compute_entropy:
      probs = jnp.exp(logits - lse[..., None])
      entropy = lse - jnp.sum(probs * logits, axis=-1)
    else:
      entropy = jnp.zeros_like(logps)
    return logps, entropy

  if num_chunks > 1:
    one_chunk = jax.checkpoint(one_chunk)
  logps, entropy = jax.lax.map(one_chunk, (hidden, targets))

  def unchunk(x):
    return x.swapaxes(0, 1).reshape(batch, num_chunks * chunk)[:, :length]

  return unchunk(logps), (unchunk(entropy) if compute_entropy else None)


def positions_from_mask(input_mask: jax.Array) -> jax.Array:
  """[B, L] positions counting real tokens from 0; pads before them get 0."""
  return jnp.maximum(jnp.cumsum(input_mask.astype(jnp.int32), axis=-1) - 1, 0)


def causal_attention_mask(input_mask: jax.Array) -> jax.Array:
  """[B, L, L] mask: query i may attend to real key j <= i."""
  length = input_mask.shape[-1]
  causal = jnp.tril(jnp.ones((length, length), jnp.bool_))
  return causal[None] & input_mask.astype(jnp.bool_)[:, None, :]


def final_hidden_states(
    model: nnx.Module,
    tokens: jax.Array,
    input_mask: jax.Array,
    use_lora: bool = True,
) -> jax.Array:
  """Runs the model and returns its final-normed hidden states [B, L, D].

  The full-vocabulary logits the model returns are discarded (XLA removes
  that matmul under jit). With use_lora=False the plain (pre-qwix) class's
  `__call__` runs on the same object, which skips the LoRA adapters; for a
  model without LoRA both settings are the same.

  Args:
    model: a tunix Gemma3 (optionally with qwix LoRA applied).
    tokens: [B, L] int token ids.
    input_mask: [B, L] True on real tokens.
    use_lora: apply the LoRA adapters.

  Returns:
    [B, L, D] hidden states in the model's compute dtype.
  """
  model_cls = type(model)
  if not use_lora:
    model_cls = getattr(model_cls, '_unquantized_type', model_cls)

  def forward(module):
    model_cls.__call__(
        module,
        tokens,
        positions_from_mask(input_mask),
        None,
        causal_attention_mask(input_mask),
        output_hidden_states=True,
    )

  _, sown = nnx.capture(forward, nnx.Intermediate)(model)
  return sown['all_hidden_states'].get_value()[-1]


def can_share_prompts(model: nnx.Module, length: int,
                      completion_len: int) -> bool:
  """Whether `shared_prompt_hidden_states` equals the full forward here.

  tunix's multi-token attention with a KV cache places its sliding-window
  band as if the queries started at cache index 0; the band is irrelevant
  (and both paths agree) when the whole sequence fits in the window. A
  single completion token would take tunix's one-token decode path instead.

  Args:
    model: a tunix Gemma3 (optionally with LoRA).
    length: P + C.
    completion_len: C.

  Returns:
    True when the shared-prompt forward may be used.
  """
  window = getattr(getattr(model, 'config', None), 'sliding_window_size', 0)
  return (bool(window) and length <= window and completion_len >= 2
          and length - completion_len >= 2)


def shared_prompt_hidden_states(
    model: nnx.Module,
    tokens: jax.Array,
    input_mask: jax.Array,
    completion_len: int,
    group: int,
    use_lora: bool = True,
) -> jax.Array:
  """Final hidden states that predict the completion, prompts run once.

  Rows i*group .. i*group + group - 1 must share their prompt (the first
  P = L - C tokens and mask). Each distinct prompt but its last token runs
  through the model once, filling a KV cache; the cache is repeated `group`
  times and the last prompt token plus the first C - 1 completion tokens of
  every row run on top of it. This is the computation of
  `final_hidden_states(...)[:, P - 1 : L - 1]` with the prompt's share done
  once instead of `group` times (gradients from every row of a group add up
  in the shared part). Callers check `can_share_prompts` first.

  Args:
    model: a tunix Gemma3 (optionally with qwix LoRA applied).
    tokens: [N, L] left-padded prompts followed by completions.
    input_mask: [N, L] True on real tokens.
    completion_len: C.
    group: rows per prompt (G); divides N.
    use_lora: apply the LoRA adapters.

  Returns:
    [N, C, D] hidden states at positions P - 1 .. L - 2.
  """
  rows, length = tokens.shape
  if rows % group:
    raise ValueError(f'group={group} does not divide the {rows} rows.')
  prompt_len = length - completion_len
  cache_len = length - 1  # The last token predicts nothing here.
  model_cls = type(model)
  if not use_lora:
    model_cls = getattr(model_cls, '_unquantized_type', model_cls)
  positions = positions_from_mask(input_mask)
  cfg = model.config
  dtype = model.embedder.input_embedding[...].dtype
  num_prompts = rows // group
  shape = (num_prompts, cache_len, cfg.num_kv_heads, cfg.head_dim)
  cache = {
      f'layer_{i}': {
          'k': jnp.zeros(shape, dtype),
          'v': jnp.zeros(shape, dtype),
          'end_index': jnp.zeros((num_prompts,), jnp.int32),
      }
      for i in range(cfg.num_layers)
  }
  # 1. Each prompt without its last token, once: only the cache is kept.
  head = prompt_len - 1
  head_mask = input_mask[::group, :head]
  head_attn = jnp.pad(
      causal_attention_mask(head_mask), ((0, 0), (0, 0), (0, cache_len - head))
  )
  _, cache = model_cls.__call__(
      model, tokens[::group, :head], positions[::group, :head], cache,
      head_attn,
  )
  cache = jax.tree.map(lambda x: jnp.repeat(x, group, axis=0), cache)
  # 2. Every row: the last prompt token and the completion but its last
  # token, attending to the cached prompt and to itself causally.
  tail = slice(head, cache_len)
  query_index = jnp.arange(head, cache_len)
  tail_attn = (
      (jnp.arange(cache_len)[None, :] <= query_index[:, None])[None]
      & input_mask[:, None, :cache_len].astype(jnp.bool_)
  )

  def forward(module):
    model_cls.__call__(
        module, tokens[:, tail], positions[:, tail], cache, tail_attn,
        output_hidden_states=True,
    )

  _, sown = nnx.capture(forward, nnx.Intermediate)(model)
  return sown['all_hidden_states'].get_value()[-1]


def per_token_logps(
    model: nnx.Module,
    tokens: jax.Array,
    input_mask: jax.Array,
    completion_len: int,
    chunk_size: int,
    use_lora: bool = True,
    compute_entropy: bool = False,
    group: int = 1,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array | None]:
  """Log-probs of the last `completion_len` tokens given what precedes them.

  Args:
    model: a tunix Gemma3 (optionally with qwix LoRA applied).
    tokens: [B, P + C] left-padded prompt followed by the completion.
    input_mask: [B, P + C] True on real tokens.
    completion_len: C.
    chunk_size: sequence chunk for the vocabulary projection.
    use_lora: apply the LoRA adapters (False = reference policy).
    compute_entropy: also return per-token entropies.
    group: rows per shared prompt (contiguous); above 1, each prompt runs
      through the model once (`shared_prompt_hidden_states`) where
      `can_share_prompts` allows it.
    temperature: the logits are divided by it before the softmax (the
      sampling temperature; see `chunked_token_logps`).

  Returns:
    (logps [B, C] float32, entropy [B, C] float32 or None).
  """
  length = tokens.shape[1]
  if not 0 < completion_len < length:
    raise ValueError(
        f'completion_len={completion_len} must be in (0, {length}): the '
        'sequence needs at least one prompt token.'
    )
  if group > 1 and can_share_prompts(model, length, completion_len):
    hidden = shared_prompt_hidden_states(
        model, tokens, input_mask, completion_len, group, use_lora=use_lora
    )
  else:
    hidden = final_hidden_states(model, tokens, input_mask, use_lora=use_lora)
    # Position t predicts token t + 1.
    hidden = hidden[:, length - completion_len - 1 : length - 1]
  targets = tokens[:, length - completion_len :]
  embedding = model.embedder.input_embedding[...]
  return chunked_token_logps(
      hidden, embedding, targets, chunk_size, compute_entropy=compute_entropy,
      temperature=temperature,
  )


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
  _check_choice('kl_estimator', estimator, KL_ESTIMATORS)
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


def _agg_count(mask: jax.Array, mode: str) -> jax.Array:
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
  _check_choice('loss_agg_mode', mode, LOSS_AGG_MODES)
  mask = mask.astype(jnp.float32)
  masked = per_token_loss.astype(jnp.float32) * mask
  count = jnp.maximum(_agg_count(mask, mode), 1.0)
  if mode == 'token-mean':
    return masked.sum() / count
  if mode == 'sequence-mean-token-mean':
    per_seq = masked.sum(axis=-1) / jnp.maximum(mask.sum(axis=-1), 1.0)
  else:
    norm = per_token_loss.shape[-1] if max_len is None else max_len
    per_seq = masked.sum(axis=-1) / norm
  return per_seq.sum() / count


# ------------------------------------------------------ completion buckets

# The shortest completion bucket (see `completion_bucket`).
SMALLEST_COMPLETION_BUCKET = 16


def completion_bucket(longest: int, max_len: int,
                      smallest: int = SMALLEST_COMPLETION_BUCKET) -> int:
  """Completion columns the update and reference pass run on.

  The smallest of smallest * 2^k (k >= 0) that holds `longest` tokens,
  capped at `max_len` (generation.max_generation_steps): the passes compile
  once per bucket (at most log2(max_len / smallest) + 2 of them) and cost
  what the batch's longest completion needs, not max_len.

  Args:
    longest: the batch's longest completion, in tokens (all processes).
    max_len: the completion length the rollout sampled (the buffer's).
    smallest: the first bucket.

  Returns:
    The bucket, in [1, max_len].
  """
  if not 0 <= longest <= max_len:
    raise ValueError(f'longest={longest} must be in [0, max_len={max_len}].')
  bucket = smallest
  while bucket < longest:
    bucket *= 2
  return max(1, min(bucket, max_len))


def trim_completions(batch: dict[str, Any], length: int) -> dict[str, Any]:
  """The batch with its completion columns cut to the first `length`.

  tokens and input_mask [N, P + C] keep P + length columns; the [N, C]
  arrays (completion_mask, old/ref/sampler log-probs) keep `length`. The
  columns dropped must be masked out (completion_mask 0): then loss,
  gradients and metrics are those of the full batch (with
  hp.completion_norm set for Dr. GRPO).

  Args:
    batch: host or device arrays in the module docstring's layout.
    length: completion columns to keep (`completion_bucket`).

  Returns:
    A new dict; other keys are passed through.
  """
  completion_len = batch['completion_mask'].shape[1]
  if not 0 < length <= completion_len:
    raise ValueError(
        f'length={length} must be in (0, {completion_len}].'
    )
  cut = completion_len - length
  if not cut:
    return dict(batch)
  trimmed = dict(batch)
  for key, value in batch.items():
    if key in ('tokens', 'input_mask'):
      trimmed[key] = value[:, :value.shape[1] - cut]
    elif key in ('completion_mask', 'old_logps', 'ref_logps',
                 'sampler_logps'):
      trimmed[key] = value[:, :length]
  return trimmed


# -------------------------------------------------------------- optimizer


def make_optimizer(
    learning_rate: float,
    warmup_ratio: float,
    num_steps: int,
    b1: float = 0.9,
    b2: float = 0.99,
    weight_decay: float = 0.1,
    max_grad_norm: float = 0.0,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """AdamW with linear warmup then cosine decay to 0, optional norm clipping.

  Args:
    learning_rate: peak learning rate.
    warmup_ratio: fraction of num_steps spent warming up linearly from 0.
    num_steps: total optimizer steps (the schedule reaches 0 there).
    b1: AdamW beta1.
    b2: AdamW beta2.
    weight_decay: decoupled weight decay.
    max_grad_norm: clip the global gradient norm to this; 0 = no clipping.

  Returns:
    (optax transformation, learning-rate schedule).
  """
  if num_steps < 1:
    raise ValueError(f'num_steps must be >= 1, got {num_steps}.')
  if not 0.0 <= warmup_ratio < 1.0:
    raise ValueError(f'warmup_ratio must be in [0, 1), got {warmup_ratio}.')
  if max_grad_norm < 0:
    raise ValueError(
        f'max_grad_norm must be >= 0 (0 = off), got {max_grad_norm}.'
    )
  warmup_steps = int(warmup_ratio * num_steps)
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=learning_rate,
      warmup_steps=warmup_steps,
      decay_steps=num_steps,
      end_value=0.0,
  )
  adamw = optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay)
  if max_grad_norm > 0:
    clip = optax.clip_by_global_norm(max_grad_norm)
    return optax.chain(clip, adamw), schedule
  return adamw, schedule


# ------------------------------------------------------------------ update


def optimizer_from_config(config: Any):
  """`make_optimizer` for a run: (optax transformation, schedule).

  The optimizer steps grpo.num_iterations (mu) times per training step, so
  the schedule spans training.num_steps * mu optimizer updates.

  Args:
    config: the full config (optimizer, training, grpo sections).
  """
  opt = config.optimizer
  return make_optimizer(
      learning_rate=opt.learning_rate,
      warmup_ratio=opt.warmup_ratio,
      num_steps=config.training.num_steps * config.grpo.num_iterations,
      b1=opt.b1,
      b2=opt.b2,
      weight_decay=opt.weight_decay,
      max_grad_norm=opt.max_grad_norm,
  )


def _micro_batches(batch: dict[str, jax.Array], size: int, group: int = 1):
  """Splits every [N, ...] array into [N // size, size, ...] micro-batches.

  Micro-batch k takes groups of `group` contiguous rows k, k + K, k + 2K, ...
  (K micro-batches; group 1 = single rows), so when the batch is sharded
  over devices in contiguous blocks of rows, every micro-batch has rows on
  every device, and a group (one prompt's rows) stays in one micro-batch.
  `_merge_micro_batches` inverts it.

  Args:
    batch: dict of arrays with N rows; keys outside _BATCH_KEYS are dropped.
    size: rows per micro-batch; 0 means N (a single micro-batch).
    group: rows kept together; divides size.

  Returns:
    The dict of reshaped arrays.
  """
  rows = batch['tokens'].shape[0]
  size = size or rows
  if rows % size:
    raise ValueError(
        f'micro_batch_size={size} rows does not divide the batch of {rows} '
        'rows; set training.micro_batch_size (in prompts) to a divisor of '
        'training.batch_size.'
    )
  count = rows // size

  def split(value):
    rest = value.shape[1:]
    value = value.reshape(size // group, count, group, *rest).swapaxes(0, 1)
    return value.reshape(count, size, *rest)

  return {key: split(value) for key, value in batch.items()
          if key in _BATCH_KEYS}


def _merge_micro_batches(value: jax.Array, group: int = 1) -> jax.Array:
  """[K, size, ...] per-micro-batch results back to [N, ...] row order."""
  count, size, *rest = value.shape
  value = value.reshape(count, size // group, group, *rest).swapaxes(0, 1)
  return value.reshape(count * size, *rest)


def remat_after_cotangent(fn, diff_args, const_args):
  """Calls `fn(diff_args, const_args)`, recomputing it in the backward pass.

  Like `jax.checkpoint`, only the inputs are kept for the backward pass and
  `fn` runs again there. Unlike it, the recomputation reads the cotangent of
  the output first, so it cannot start before the backward pass reaches this
  call. XLA's CPU pipeline drops jax.checkpoint's optimization barriers
  before scheduling and is then free to run every recomputation early, which
  keeps all activations alive and saves nothing (measured: 18 rematerialised
  270M layers, same temp memory as none); the data dependency here forces
  the order on every backend.

  `fn` is traced now (`jax.closure_convert`), so whatever the current call
  intercepts (qwix's LoRA adapters) is part of the recomputation.

  Args:
    fn: (diff_args, const_args) -> pytree of arrays.
    diff_args: pytree whose cotangents are returned (activations, LoRA).
    const_args: pytree that gets zero cotangents (frozen weights).

  Returns:
    fn(diff_args, const_args).
  """
  converted, hoisted = jax.closure_convert(fn, diff_args, const_args)

  def run(diff, const, hoisted):
    return converted(diff, const, *hoisted)

  @jax.custom_vjp
  def call(diff, const, hoisted):
    return run(diff, const, hoisted)

  def fwd(diff, const, hoisted):
    return run(diff, const, hoisted), (diff, const, hoisted)

  def bwd(residuals, cotangent):
    diff, const, hoisted = residuals
    # 0 * (first element of every cotangent): a real operand XLA cannot
    # fold away (0 * x is not 0 for x = inf/nan), so the recomputation
    # below depends on the cotangent. Adding it changes no finite value.
    leaves = [c for c in jax.tree.leaves(cotangent)
              if jnp.issubdtype(c.dtype, jnp.inexact) and c.size]
    tie = sum(c.reshape(-1)[0].astype(jnp.float32) for c in leaves) * 0.0

    def tied(a):
      if jnp.issubdtype(a.dtype, jnp.inexact):
        return a + tie.astype(a.dtype)
      return a

    diff = jax.tree.map(tied, diff)
    _, vjp = jax.vjp(lambda d, h: run(d, const, h), diff, hoisted)
    diff_ct, hoisted_ct = vjp(cotangent)
    return diff_ct, jax.tree.map(jnp.zeros_like, const), hoisted_ct

  call.defvjp(fwd, bwd)
  return call(diff_args, const_args, hoisted)


class _LayerRematDecoderLayer(gemma3_lib.DecoderLayer):
  """A tunix DecoderLayer recomputed whole in the backward pass.

  Only its input (and KV cache, when given) is kept for the backward pass;
  see `remat_after_cotangent`. Installed by `_apply_remat(..., 'layer')` on
  the model copy the update differentiates.
  """

  def __call__(self, x, segment_pos, cache, attn_mask):
    graphdef, lora, rest = nnx.split(self, nnx.LoRAParam, ...)

    def block(diff, frozen):
      lora_state, inputs, layer_cache = diff
      layer = nnx.merge(graphdef, lora_state, frozen, copy=True)
      return gemma3_lib.DecoderLayer.block(
          layer, inputs, segment_pos, layer_cache, attn_mask
      )

    return remat_after_cotangent(block, (lora, x, cache), rest)


def _apply_remat(module: nnx.Module, mode: str) -> None:
  """Sets a remat mode on a model merged inside the update's trace.

  'block' is tunix's own (Attention.remat_config and the ModelConfig of
  each FeedForward); 'layer' makes every DecoderLayer a
  `_LayerRematDecoderLayer`. The change is made only on the copy the update
  differentiates; the sampler and the log-prob passes keep the model as
  loaded (tunix's sampler cannot run a remat model).

  Args:
    module: a tunix Gemma3 merged with `copy=True` inside the current trace.
    mode: one of REMAT_MODES.
  """
  if mode == 'none':
    return
  targets = ((gemma3_lib.DecoderLayer,) if mode == 'layer' else
             (gemma3_lib.Attention, gemma3_lib.FeedForward))
  found = 0
  for _, sub in nnx.iter_modules(module):
    if not isinstance(sub, targets):
      continue
    if mode == 'layer':
      sub.__class__ = _LayerRematDecoderLayer
    elif isinstance(sub, gemma3_lib.Attention):
      sub.remat_config = gemma3_lib.RematConfig.BLOCK
    else:
      # A fresh config: the FeedForwards share the model's ModelConfig.
      sub.config = dataclasses.replace(
          sub.config, remat_config=gemma3_lib.RematConfig.BLOCK
      )
    found += 1
  if not found:
    names = '/'.join(t.__name__ for t in targets)
    raise ValueError(
        f'remat={mode!r} needs tunix Gemma 3 {names} modules; '
        f'{type(module).__name__} has none. Use remat=\'none\'.'
    )


def _grads_and_metrics(model: nnx.Module, batch, hp: StepHParams,
                       logps_fn=None):
  """Full-batch loss gradient w.r.t. LoRA params, accumulated over micros.

  Args:
    model: the LoRA model.
    batch: see the module docstring.
    hp: static hyperparameters.
    logps_fn: replaces `per_token_logps` (same arguments); the benchmark
      passes a naive full-logits version.

  Returns:
    (LoRA grads State, metrics dict).
  """
  logps_fn = logps_fn or per_token_logps
  if hp.tis_cap > 0 and 'sampler_logps' not in batch:
    raise ValueError(
        f'tis_cap={hp.tis_cap} needs batch["sampler_logps"] (the sampler\'s '
        'log-probs of the completion tokens); pass them or set tis_cap=0.'
    )
  if hp.beta > 0 and 'ref_logps' not in batch:
    raise ValueError(
        f'beta={hp.beta} needs batch["ref_logps"]; compute them with '
        'grpo.reference_logps or set beta=0.'
    )
  graphdef, lora, rest = nnx.split(model, nnx.LoRAParam, ...)
  mask = batch['completion_mask'].astype(jnp.float32)
  completion_len = mask.shape[1]
  total = jnp.maximum(_agg_count(mask, hp.loss_agg_mode), 1.0)
  total_tokens = jnp.maximum(mask.sum(), 1.0)

  def loss_fn(lora_state, micro):
    # copy=True: fresh Variables and modules owned by this trace. With the
    # outer ones, tunix's nnx.remat fails writing its outputs back (flax
    # TraceContextError), and _apply_remat would change the caller's model.
    module = nnx.merge(graphdef, lora_state, rest, copy=True)
    _apply_remat(module, hp.remat)
    logps, entropy = logps_fn(
        module,
        micro['tokens'],
        micro['input_mask'],
        completion_len,
        hp.chunk_size,
        use_lora=True,
        compute_entropy=True,
        group=hp.prompt_group,
        temperature=hp.temperature,
    )
    micro_mask = micro['completion_mask'].astype(jnp.float32)
    old_logps = micro.get('old_logps')
    if old_logps is None:
      old_logps = jax.lax.stop_gradient(logps)
    per_token, is_clipped = clipped_surrogate(
        logps,
        old_logps,
        micro['advantages'],
        hp.epsilon,
        hp.upper_epsilon,
    )
    if hp.tis_cap > 0:
      per_token = per_token * tis_weights(
          old_logps, micro['sampler_logps'], hp.tis_cap
      )
    sums = {
        'clip_ratio': (is_clipped * micro_mask).sum(),
        'entropy': (jax.lax.stop_gradient(entropy) * micro_mask).sum(),
    }
    if 'sampler_logps' in micro:
      # The trainer's log-probs of the policy that sampled: the old ones,
      # or this pass's own (num_iterations = 1).
      gap = jnp.abs(jax.lax.stop_gradient(old_logps) - micro['sampler_logps'])
      sums[SAMPLER_GAP] = (gap * micro_mask).sum()
    if hp.beta > 0:
      kl = kl_divergence(logps, micro['ref_logps'], hp.kl_estimator)
      per_token = per_token + hp.beta * kl
      sums['kl'] = (jax.lax.stop_gradient(kl) * micro_mask).sum()
    # Weight each micro-batch by its share of the full-batch normaliser so
    # that the sum over micro-batches is the full-batch loss for every mode.
    weight = _agg_count(micro_mask, hp.loss_agg_mode) / total
    loss = aggregate_loss(per_token, micro_mask, hp.loss_agg_mode,
                          max_len=hp.completion_norm or None) * weight
    return loss, sums

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def accumulate(carry, micro):
    (loss, sums), grads = grad_fn(lora, micro)
    return jax.tree.map(jnp.add, carry, (loss, sums, grads)), None

  micros = _micro_batches(batch, hp.micro_batch_size, hp.prompt_group)
  zero_sums = {'clip_ratio': 0.0, 'entropy': 0.0}
  if hp.beta > 0:
    zero_sums['kl'] = 0.0
  if 'sampler_logps' in micros:
    zero_sums[SAMPLER_GAP] = 0.0
  init = (
      jnp.zeros((), jnp.float32),
      jax.tree.map(lambda x: jnp.zeros((), jnp.float32), zero_sums),
      jax.tree.map(jnp.zeros_like, lora),
  )
  (loss, sums, grads), _ = jax.lax.scan(accumulate, init, micros)
  metrics = {key: value / total_tokens for key, value in sums.items()}
  metrics['loss'] = loss
  metrics['grad_norm'] = optax.tree.norm(grads)
  return grads, metrics


@functools.partial(nnx.jit, static_argnames=('hp',))
def compute_grads(model: nnx.Module, batch: dict[str, jax.Array],
                  hp: StepHParams):
  """Returns (LoRA grads State, metrics) of the full-batch loss; no update."""
  return _grads_and_metrics(model, batch, hp)


class GraphJit:
  """`jax.jit` of fn(graphdefs, *args, **static) with the graphdefs closed over.

  The jitted update and log-prob functions take the model split into states,
  so that they return only what changes: `nnx.jit` returns the whole state of
  every module argument, i.e. a copy of all the frozen weights per call.
  tunix's GraphDefs hold its unhashable ModelConfig, so they cannot be static
  arguments; instead each distinct (equal) tuple of graphdefs gets its own
  jitted closure.
  """

  def __init__(self, fn, static_argnames=()):
    self._fn = fn
    self._static_argnames = static_argnames
    self._entries = []

  def __call__(self, graphdefs):
    """The jitted function for these graphdefs (a tuple of nnx.GraphDef)."""
    for known, jitted in self._entries:
      if known == graphdefs:
        return jitted
    jitted = jax.jit(
        functools.partial(self._fn, graphdefs),
        static_argnames=self._static_argnames,
    )
    self._entries.append((graphdefs, jitted))
    return jitted


def train_step(
    model: nnx.Module,
    optimizer: nnx.Optimizer,
    batch: dict[str, jax.Array],
    hp: StepHParams,
) -> dict[str, jax.Array]:
  """One GRPO update of the LoRA parameters (in place on model/optimizer).

  Gradients are summed over micro-batches of hp.micro_batch_size rows, with
  weights that make the result equal to the gradient of the full-batch loss
  for every loss_agg_mode; the optimizer then steps once. The compiled
  program reads the frozen weights and returns only the new LoRA and
  optimizer state (see `GraphJit`).

  Args:
    model: the LoRA model (its nnx.LoRAParam leaves are trained).
    optimizer: nnx.Optimizer(model, tx, wrt=nnx.LoRAParam).
    batch: dict of arrays, see the module docstring.
    hp: static hyperparameters.

  Returns:
    Scalar metrics: loss, clip_ratio (fraction of completion tokens clipped),
    entropy (mean per completion token), grad_norm (before clipping), when
    beta > 0 kl (mean per completion token), and when the batch has
    sampler_logps `sampler/logp_abs_diff`: the mean over completion tokens
    of |sampler log-prob - trainer log-prob of the sampling policy| (the
    old log-probs, or with none given this pass's own, which are the
    policy that sampled when num_iterations = 1).
  """
  return run_train_step(
      lambda graphdefs: functools.partial(TRAIN_STEP(graphdefs), hp=hp),
      model, optimizer, batch,
  )


def run_train_step(step_for, model, optimizer, batch):
  """Runs a functional update on a model/optimizer and writes it back.

  Args:
    step_for: graphdefs -> f(lora, rest, opt_state, batch) returning (new
      LoRA State, new optimizer State, metrics): a `make_train_step`
      function with its hp bound, or an executable compiled from one.
    model: the LoRA model, updated in place.
    optimizer: its nnx.Optimizer, updated in place.
    batch: dict of arrays.

  Returns:
    The step's metrics.
  """
  graphdefs, arrays = train_step_inputs(model, optimizer)
  lora, opt_state, metrics = step_for(graphdefs)(*arrays, batch)
  nnx.update(model, lora)
  nnx.update(optimizer, opt_state)
  return metrics


def train_step_inputs(model: nnx.Module, optimizer: nnx.Optimizer):
  """((graphdef, optimizer graphdef), (lora, rest, optimizer state))."""
  graphdef, lora, rest = nnx.split(model, nnx.LoRAParam, ...)
  opt_graphdef, opt_state = nnx.split(optimizer)
  return (graphdef, opt_graphdef), (lora, rest, opt_state)


def make_train_step(grads_and_metrics) -> GraphJit:
  """A functional update around `grads_and_metrics(model, batch, hp)`.

  Args:
    grads_and_metrics: returns (LoRA grads State, metrics dict).

  Returns:
    A GraphJit: step(graphdefs)(lora, rest, opt_state, batch, hp=hp) ->
    (new LoRA State, new optimizer State, metrics).
  """

  def step(graphdefs, lora, rest, opt_state, batch, hp):
    graphdef, opt_graphdef = graphdefs
    model = nnx.merge(graphdef, lora, rest)
    optimizer = nnx.merge(opt_graphdef, opt_state)
    grads, metrics = grads_and_metrics(model, batch, hp)
    optimizer.update(model, grads)
    return nnx.state(model, nnx.LoRAParam), nnx.state(optimizer), metrics

  return GraphJit(step, static_argnames=('hp',))


TRAIN_STEP = make_train_step(_grads_and_metrics)


def _logps(graphdefs, state, batch, hp, use_lora):
  """[N, C] log-probs of the model (graphdefs[0], state), micro-batched."""
  completion_len = batch['completion_mask'].shape[1]
  micros = _micro_batches(
      {'tokens': batch['tokens'], 'input_mask': batch['input_mask']},
      hp.micro_batch_size,
      hp.prompt_group,
  )

  def one(micro):
    # copy=True: see _grads_and_metrics.
    module = nnx.merge(graphdefs[0], state, copy=True)
    logps, _ = per_token_logps(
        module,
        micro['tokens'],
        micro['input_mask'],
        completion_len,
        hp.chunk_size,
        use_lora=use_lora,
        group=hp.prompt_group,
        temperature=hp.temperature,
    )
    return logps

  logps = _merge_micro_batches(jax.lax.map(one, micros), hp.prompt_group)
  return jax.lax.stop_gradient(logps)


_LOGPS = GraphJit(_logps, static_argnames=('hp', 'use_lora'))


def logps_program(model):
  """(jitted fn, model state): fn(state, batch, hp=, use_lora=) -> [N, C].

  The program `reference_logps` and `policy_logps` run; the preflight
  compiles it from the same pieces.
  """
  graphdef, state = nnx.split(model)
  return _LOGPS((graphdef,)), state


def _model_logps(model, batch, hp, use_lora):
  fn, state = logps_program(model)
  return fn(state, batch, hp=hp, use_lora=use_lora)


def reference_logps(model: nnx.Module, batch: dict[str, jax.Array],
                    hp: StepHParams) -> jax.Array:
  """[N, C] completion log-probs under the base model (LoRA off)."""
  return _model_logps(model, batch, hp, use_lora=False)


def policy_logps(model: nnx.Module, batch: dict[str, jax.Array],
                 hp: StepHParams) -> jax.Array:
  """[N, C] completion log-probs under the current policy (LoRA on), no grad."""
  return _model_logps(model, batch, hp, use_lora=True)
