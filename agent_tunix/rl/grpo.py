"""The GRPO update: hyperparameters, micro-batching and the jitted programs.

The objective's math is in `objectives` (pure array functions), the model
passes that produce log-probs in `logprobs`, rematerialisation in `remat`
and the optimizer in `optimizer`. This module puts them together into three
jitted entry points for the train loop:

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

The update batch is an `UpdateBatch` (N rows = prompts x generations,
groups contiguous), a pytree the jitted programs take whole; a field the
update does not read is None, and each combination of present fields
compiles once:

  tokens           int32   [N, P + C]  left-padded prompt, then completion
  input_mask       bool    [N, P + C]  True on real (non-pad) tokens
  completion_mask  float32 [N, C]      1 on completion tokens that count
  advantages       float32 [N]
  old_logps        float32 [N, C]      optional; absent = current policy
  ref_logps        float32 [N, C]      needed only when hp.beta > 0
  sampler_logps    float32 [N, C]      optional; the sampler's log-probs of
                                       the completion tokens (rollout.py)
  rewards          float32 [N]         needed only when hp.maxent_tau > 0
  kl_coeff         float32 [N]         optional; the KL coefficient of each
                                       row (the adaptive controller's
                                       value); absent = hp.beta

`update_batch` builds one from a rollout's `Sequences` (its first three
fields and sampler_logps: what the log-prob passes read, before any
reward exists) and its rewards.

The reference policy is the base model: LoRA switched off on the same
weights (`logprobs.final_hidden_states`).
"""

import dataclasses
import functools
from typing import Any

from flax import nnx
from flax import struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agent_tunix.rl import logprobs
from agent_tunix.rl import objectives
from agent_tunix.rl import remat

# Metric: mean |sampler log-prob - trainer log-prob| over completion tokens.
SAMPLER_GAP = 'sampler/logp_abs_diff'

# An [N, ...] array: numpy on the host, a global jax.Array on the mesh (a
# ShapeDtypeStruct in the preflight).
Rows = jax.Array | np.ndarray


@struct.dataclass
class Sequences:
  """A batch's sampled sequences: what a log-prob pass reads.

  Attributes:
    tokens: int32 [N, P + C], the left-padded prompt, then the completion.
    input_mask: bool [N, P + C], True on real (non-pad) tokens.
    completion_mask: float32 [N, C], 1 on completion tokens that count.
    sampler_logps: float32 [N, C], the sampler's log-probs of the
      completion tokens; None when the batch was not sampled (benchmarks).
      The log-prob passes do not read it.
  """

  tokens: Rows
  input_mask: Rows
  completion_mask: Rows
  sampler_logps: Rows | None = None


@struct.dataclass
class UpdateBatch:
  """One update's inputs (the module docstring's layout); None: absent.

  `update_batch` builds the host batch of a run; `of` puts one together
  from parts already on the mesh.
  """

  tokens: Rows
  input_mask: Rows
  completion_mask: Rows
  advantages: Rows
  old_logps: Rows | None = None
  ref_logps: Rows | None = None
  sampler_logps: Rows | None = None
  rewards: Rows | None = None
  kl_coeff: Rows | None = None

  @classmethod
  def of(cls, sequences: Sequences, advantages: Rows,
         **optional: Rows | None) -> 'UpdateBatch':
    """The batch of `sequences` with these advantages and optional fields."""
    return cls(tokens=sequences.tokens, input_mask=sequences.input_mask,
               completion_mask=sequences.completion_mask,
               sampler_logps=sequences.sampler_logps, advantages=advantages,
               **optional)

  @property
  def sequences(self) -> Sequences:
    return Sequences(self.tokens, self.input_mask, self.completion_mask,
                     self.sampler_logps)


@dataclasses.dataclass(frozen=True)
class StepHParams:
  """Static hyperparameters of the GRPO update (hashable, for jit).

  Attributes:
    beta: KL coefficient (the starting one with an adaptive controller,
      whose current value comes in batch.kl_coeff); 0 means no KL term.
    epsilon: lower PPO clip range (and upper, unless epsilon_high > 0);
      > 0: at 0 every update is clipped away (`config.validation`).
    epsilon_high: upper clip range; negative means equal to epsilon.
    kl_estimator: 'k1' or 'k3'.
    loss_agg_mode: one of objectives.LOSS_AGG_MODES.
    chunk_size: sequence chunk for log-probs (bounds the [B, chunk, vocab]
      logits buffer).
    micro_batch_size: rows per forward/backward pass; 0 means the whole batch.
      Must divide the number of rows in a batch.
    remat: one of remat.REMAT_MODES; 'block' recomputes each attention and MLP
      block in the backward pass of the update instead of storing its
      activations; 'layer' stores only each decoder layer's input and
      recomputes the whole layer.
    prompt_group: G when rows i*G .. i*G + G - 1 of every batch share their
      prompt (the train loop's batches); each prompt then runs through the
      model once per pass (see `logprobs.per_token_logps`). 1 = no sharing. Must
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
      sampler's (batch.sampler_logps, required). It corrects for a
      sampler whose numerics differ from the trainer's (bfloat16, other
      kernels, a remote sampler); the KL term is not weighted.
    completion_norm: the tokens per sequence 'sequence-mean-token-sum-norm'
      (Dr. GRPO) divides by; 0 = the batch's completion length C. The train
      loop sets generation.max_generation_steps, so trimming a batch to a
      shorter bucket (`trim_completions`) leaves the loss unchanged.
    importance_sampling_level: 'token' (PPO/GRPO's per-token ratio,
      `objectives.clipped_surrogate`) or 'sequence' (GSPO,
      `objectives.sequence_clipped_surrogate`).
    entropy_coeff: c of the entropy bonus (`objectives.entropy_bonus`);
      0 = off.
    num_generations: G, rows per group (contiguous); needed by MaxEnt.
    maxent_tau: > 0 turns MaxEnt-GRPO on: the advantages are
      `objectives.maxent_advantages` of batch.rewards and
      batch.ref_logps instead of batch.advantages.
    maxent_q_temperature: see `objectives.maxent_target_weights`.
    maxent_q_epsilon: see `objectives.maxent_target_weights`.
    maxent_length_normalize_ref: see `objectives.maxent_advantages`.
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
  importance_sampling_level: str = 'token'
  entropy_coeff: float = 0.0
  num_generations: int = 1
  maxent_tau: float = 0.0
  maxent_q_temperature: float = 1.0
  maxent_q_epsilon: float = 0.05
  maxent_length_normalize_ref: bool = True

  def __post_init__(self):
    # The update's invariants, for StepHParams built by hand (tests, code
    # calling this module). A config is checked before `hparams_from_config`
    # builds these, each field with its fix, by `config.validation` (the one
    # home of user-input checks); a config that passes it keeps all of them.
    for name, allowed in (
        ('kl_estimator', objectives.KL_ESTIMATORS),
        ('remat', remat.REMAT_MODES),
        ('loss_agg_mode', objectives.LOSS_AGG_MODES),
        ('importance_sampling_level', objectives.IMPORTANCE_SAMPLING_LEVELS),
    ):
      objectives.check_choice(name, getattr(self, name), allowed)
    maxent = self.maxent_tau > 0
    for name, ok, bound in (
        ('beta', self.beta >= 0, '>= 0'),
        ('epsilon', self.epsilon > 0, '> 0'),
        ('epsilon_high', self.epsilon_high != 0, '> 0, or < 0 for epsilon'),
        ('temperature', self.temperature > 0, '> 0; greedy rollouts use 1'),
        ('tis_cap', self.tis_cap >= 0, '>= 0 (0 = off)'),
        ('chunk_size', self.chunk_size >= 1, '>= 1'),
        ('micro_batch_size', self.micro_batch_size >= 0,
         '>= 0 (0 = whole batch)'),
        ('prompt_group', self.prompt_group >= 1
         and self.micro_batch_size % self.prompt_group == 0,
         f'>= 1 and divide micro_batch_size={self.micro_batch_size}'),
        ('maxent_tau', self.maxent_tau >= 0, '>= 0 (0 = off)'),
        ('num_generations', not maxent or self.num_generations >= 2,
         '>= 2 for MaxEnt-GRPO'),
        ('maxent_q_temperature', not maxent or self.maxent_q_temperature > 0,
         '> 0'),
        ('maxent_q_epsilon', not maxent or 0 <= self.maxent_q_epsilon <= 1,
         'in [0, 1]'),
    ):
      if not ok:
        raise ValueError(
            f'StepHParams {name}={getattr(self, name)!r} must be {bound}.')

  @property
  def needs_reference(self) -> bool:
    """Whether the update reads batch.ref_logps (KL or MaxEnt)."""
    return self.beta > 0 or self.maxent_tau > 0

  @property
  def upper_epsilon(self) -> float:
    return self.epsilon if self.epsilon_high < 0 else self.epsilon_high


def initial_kl_coeff(config: Any) -> float:
  """The KL coefficient of step 1.

  grpo.beta, fixed, when grpo.kl_target is 0; with an adaptive controller
  (kl_target > 0) grpo.init_kl_coeff, or grpo.beta when that is 0.
  """
  g = config.grpo
  if g.kl_target > 0 and g.init_kl_coeff > 0:
    return float(g.init_kl_coeff)
  return float(g.beta)


def optional_inputs(config: Any) -> tuple[str, ...]:
  """The optional per-row inputs the update of `config` reads.

  'rewards' with MaxEnt-GRPO (grpo.maxent_tau > 0: its advantages come from
  them) and 'kl_coeff' with the adaptive KL controller (grpo.kl_target > 0:
  the step's coefficient, which the static `StepHParams` cannot carry).
  The host batches of the train loop and the benchmarks get these and only
  these (`update_batch`); the preflight's abstract batch likewise.
  """
  g = config.grpo
  return ((('rewards',) if g.maxent_tau > 0 else ()) +
          (('kl_coeff',) if g.kl_target > 0 else ()))


def update_batch(config: Any, sequences: Sequences, advantages: Any,
                 rewards: Any, kl_coeff: float) -> UpdateBatch:
  """The host update batch of `config`: the one place that builds one.

  Args:
    config: the run's config; its `optional_inputs` are set, the other
      optional fields left None (old and reference log-probs come later,
      on the mesh).
    sequences: the rows' host arrays.
    advantages: [N] advantage of each row.
    rewards: [N] total reward of each row.
    kl_coeff: the KL coefficient of this update (every row gets it).

  Returns:
    The `UpdateBatch`, float32 per-row arrays.
  """
  wanted = optional_inputs(config)
  advantages = np.asarray(advantages, np.float32)
  rows = len(advantages)
  return UpdateBatch.of(
      sequences, advantages,
      rewards=(np.asarray(rewards, np.float32) if 'rewards' in wanted
               else None),
      kl_coeff=(np.full(rows, kl_coeff, np.float32) if 'kl_coeff' in wanted
                else None),
  )


def hparams_from_config(config: Any) -> StepHParams:
  """Builds StepHParams from a full agent_tunix config.

  `training.micro_batch_size` counts prompts; each prompt gives
  `grpo.num_generations` rows, so the row count is their product. The
  temperature is `generation.temperature` (1 when it is 0: greedy rollouts).

  Args:
    config: the ml_collections config (see agent_tunix/configs/base.py).

  Returns:
    The static hyperparameters of the update.
  """
  return StepHParams(
      beta=initial_kl_coeff(config),
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
      importance_sampling_level=config.grpo.importance_sampling_level,
      entropy_coeff=float(config.grpo.entropy_coeff),
      num_generations=int(config.grpo.num_generations),
      maxent_tau=float(config.grpo.maxent_tau),
      maxent_q_temperature=float(config.grpo.maxent_q_temperature),
      maxent_q_epsilon=float(config.grpo.maxent_q_epsilon),
      maxent_length_normalize_ref=bool(
          config.grpo.maxent_length_normalize_ref),
  )


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


# The fields of an UpdateBatch or Sequences with one column per completion
# token ([N, C]); tokens and input_mask end with them ([N, P + C]).
_COMPLETION_COLUMNS = ('completion_mask', 'old_logps', 'ref_logps',
                       'sampler_logps')


def trim_completions(batch, length: int):
  """The batch with its completion columns cut to the first `length`.

  tokens and input_mask [N, P + C] keep P + length columns; the [N, C]
  arrays (completion_mask, old/ref/sampler log-probs) keep `length`. The
  columns dropped must be masked out (completion_mask 0): then loss,
  gradients and metrics are those of the full batch (with
  hp.completion_norm set for Dr. GRPO).

  Args:
    batch: an `UpdateBatch` or `Sequences`, host or device arrays.
    length: completion columns to keep (`completion_bucket`).

  Returns:
    A batch of the same type; the per-row fields are passed through.
  """
  completion_len = batch.completion_mask.shape[1]
  if not 0 < length <= completion_len:
    raise ValueError(
        f'length={length} must be in (0, {completion_len}].'
    )
  cut = completion_len - length
  if not cut:
    return batch
  trimmed = {}
  for field in dataclasses.fields(batch):
    value = getattr(batch, field.name)
    if value is None:
      continue
    if field.name in ('tokens', 'input_mask'):
      trimmed[field.name] = value[:, :value.shape[1] - cut]
    elif field.name in _COMPLETION_COLUMNS:
      trimmed[field.name] = value[:, :length]
  return batch.replace(**trimmed)


# ------------------------------------------------------------------ update

def _micro_batches(batch, size: int, group: int = 1):
  """Splits every [N, ...] array into [N // size, size, ...] micro-batches.

  Micro-batch k takes groups of `group` contiguous rows k, k + K, k + 2K, ...
  (K micro-batches; group 1 = single rows), so when the batch is sharded
  over devices in contiguous blocks of rows, every micro-batch has rows on
  every device, and a group (one prompt's rows) stays in one micro-batch.
  `_merge_micro_batches` inverts it.

  Args:
    batch: a pytree of arrays of N rows each (an `UpdateBatch`, a dict).
    size: rows per micro-batch; 0 means N (a single micro-batch).
    group: rows kept together; divides size.

  Returns:
    The same pytree of reshaped arrays.
  """
  rows = jax.tree.leaves(batch)[0].shape[0]
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

  return jax.tree.map(split, batch)


def _merge_micro_batches(value: jax.Array, group: int = 1) -> jax.Array:
  """[K, size, ...] per-micro-batch results back to [N, ...] row order."""
  count, size, *rest = value.shape
  value = value.reshape(count, size // group, group, *rest).swapaxes(0, 1)
  return value.reshape(count * size, *rest)


def _grads_and_metrics(model: nnx.Module, batch: UpdateBatch,
                       hp: StepHParams, logps_fn=None):
  """Full-batch loss gradient w.r.t. LoRA params, accumulated over micros.

  Args:
    model: the LoRA model.
    batch: see the module docstring.
    hp: static hyperparameters.
    logps_fn: replaces `logprobs.per_token_logps` (same arguments); the
      benchmark passes a naive full-logits version.

  Returns:
    (LoRA grads State, metrics dict).
  """
  logps_fn = logps_fn or logprobs.per_token_logps
  if hp.tis_cap > 0 and batch.sampler_logps is None:
    raise ValueError(
        f'tis_cap={hp.tis_cap} needs batch.sampler_logps (the sampler\'s '
        'log-probs of the completion tokens); pass them or set tis_cap=0.'
    )
  if hp.needs_reference and batch.ref_logps is None:
    raise ValueError(
        f'beta={hp.beta} / maxent_tau={hp.maxent_tau} needs '
        'batch.ref_logps; compute them with grpo.reference_logps or set '
        'both to 0.'
    )
  extra_metrics = {}
  if hp.maxent_tau > 0:
    if batch.rewards is None:
      raise ValueError(
          f'maxent_tau={hp.maxent_tau} needs batch.rewards (the rows\' '
          'total rewards); pass them or set maxent_tau=0.'
      )
    batch = batch.replace(advantages=objectives.maxent_advantages(
        batch.rewards, batch.ref_logps, batch.completion_mask,
        hp.num_generations, hp.maxent_tau, hp.maxent_q_temperature,
        hp.maxent_q_epsilon, hp.maxent_length_normalize_ref,
    ))
    # Entropy of each group's target w = (A + 1) / G, mean over groups.
    weights = (batch.advantages + 1.0) / hp.num_generations
    extra_metrics['maxent/target_entropy'] = -jnp.sum(
        weights * jnp.log(jnp.maximum(weights, 1e-30))
    ) / (weights.shape[0] // hp.num_generations)
  graphdef, lora, rest = nnx.split(model, nnx.LoRAParam, ...)
  mask = batch.completion_mask.astype(jnp.float32)
  completion_len = mask.shape[1]
  total = jnp.maximum(objectives.agg_count(mask, hp.loss_agg_mode), 1.0)
  total_tokens = jnp.maximum(mask.sum(), 1.0)

  def loss_fn(lora_state, micro):
    # copy=True: fresh Variables and modules owned by this trace. With the
    # outer ones, tunix's nnx.remat fails writing its outputs back (flax
    # TraceContextError), and _apply_remat would change the caller's model.
    module = nnx.merge(graphdef, lora_state, rest, copy=True)
    remat.apply_remat(module, hp.remat)
    logps, entropy = logps_fn(
        module,
        micro.tokens,
        micro.input_mask,
        completion_len,
        hp.chunk_size,
        use_lora=True,
        compute_entropy=True,
        group=hp.prompt_group,
        temperature=hp.temperature,
    )
    micro_mask = micro.completion_mask.astype(jnp.float32)
    old_logps = micro.old_logps
    if old_logps is None:
      old_logps = jax.lax.stop_gradient(logps)
    if hp.importance_sampling_level == 'sequence':
      per_token, is_clipped = objectives.sequence_clipped_surrogate(
          logps, old_logps, micro.advantages, micro_mask, hp.epsilon,
          hp.upper_epsilon,
      )
    else:
      per_token, is_clipped = objectives.clipped_surrogate(
          logps, old_logps, micro.advantages, hp.epsilon,
          hp.upper_epsilon,
      )
    if hp.tis_cap > 0:
      per_token = per_token * objectives.tis_weights(
          old_logps, micro.sampler_logps, hp.tis_cap
      )
    sums = {
        'clip_ratio': (is_clipped * micro_mask).sum(),
        'entropy': (jax.lax.stop_gradient(entropy) * micro_mask).sum(),
    }
    if micro.sampler_logps is not None:
      # The trainer's log-probs of the policy that sampled: the old ones,
      # or this pass's own (num_iterations = 1).
      gap = jnp.abs(jax.lax.stop_gradient(old_logps) - micro.sampler_logps)
      sums[SAMPLER_GAP] = (gap * micro_mask).sum()
    if hp.beta > 0:
      kl = objectives.kl_divergence(
          logps, micro.ref_logps, hp.kl_estimator
      )
      coeff = hp.beta if micro.kl_coeff is None else micro.kl_coeff[:, None]
      per_token = per_token + coeff * kl
      sums['kl'] = (jax.lax.stop_gradient(kl) * micro_mask).sum()
    if hp.entropy_coeff:
      per_token = objectives.entropy_bonus(per_token, entropy,
                                          hp.entropy_coeff)
    # Weight each micro-batch by its share of the full-batch normaliser so
    # that the sum over micro-batches is the full-batch loss for every mode.
    weight = objectives.agg_count(micro_mask, hp.loss_agg_mode) / total
    loss = objectives.aggregate_loss(per_token, micro_mask, hp.loss_agg_mode,
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
  if micros.sampler_logps is not None:
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
  if hp.entropy_coeff:
    # What the bonus takes off the loss, per completion token (token-mean).
    metrics['entropy_bonus'] = hp.entropy_coeff * metrics['entropy']
  metrics.update(extra_metrics)
  return grads, metrics


@functools.partial(nnx.jit, static_argnames=('hp',))
def compute_grads(model: nnx.Module, batch: UpdateBatch, hp: StepHParams):
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
    batch: UpdateBatch,
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
    batch: the `UpdateBatch`, on the mesh.
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
    batch: the `UpdateBatch`.

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


def _logps(graphdefs, state, batch: Sequences, hp, use_lora):
  """[N, C] log-probs of the model (graphdefs[0], state), micro-batched."""
  completion_len = batch.completion_mask.shape[1]
  micros = _micro_batches(
      {'tokens': batch.tokens, 'input_mask': batch.input_mask},
      hp.micro_batch_size,
      hp.prompt_group,
  )

  def one(micro):
    # copy=True: see _grads_and_metrics.
    module = nnx.merge(graphdefs[0], state, copy=True)
    logps, _ = logprobs.per_token_logps(
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
  """(jitted fn, model state): fn(state, sequences, hp=, use_lora=) -> [N, C].

  The program `reference_logps` and `policy_logps` run, on `logps_inputs`;
  the preflight compiles it from the same pieces.
  """
  graphdef, state = nnx.split(model)
  return _LOGPS((graphdef,)), state


def logps_inputs(batch: Sequences | UpdateBatch) -> Sequences:
  """What the log-prob program reads of a batch: its tokens, input and
  completion masks (so one program serves every batch of those shapes)."""
  return Sequences(batch.tokens, batch.input_mask, batch.completion_mask)


def _model_logps(model, batch, hp, use_lora):
  fn, state = logps_program(model)
  return fn(state, logps_inputs(batch), hp=hp, use_lora=use_lora)


def reference_logps(model: nnx.Module, batch: Sequences | UpdateBatch,
                    hp: StepHParams) -> jax.Array:
  """[N, C] completion log-probs under the base model (LoRA off)."""
  return _model_logps(model, batch, hp, use_lora=False)


def policy_logps(model: nnx.Module, batch: Sequences | UpdateBatch,
                 hp: StepHParams) -> jax.Array:
  """[N, C] completion log-probs under the current policy (LoRA on), no grad."""
  return _model_logps(model, batch, hp, use_lora=True)
