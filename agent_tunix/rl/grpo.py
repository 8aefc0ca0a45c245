"""The GRPO update: hyperparameters, micro-batching and the jitted programs.

The objective's parts are in `losses` (policy losses, correction, terms,
aggregation) and `advantages` (estimators), both by name over the pure
array math of `objectives`; the model passes that produce log-probs are in
`logprobs`, rematerialisation in `remat` and the optimizer in `optimizer`.
This module puts them together into three jitted entry points for the
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

The update batch is an `UpdateBatch` (N rows = prompts x generations,
groups contiguous), a pytree the jitted programs take whole; a field the
update does not read is None, and each combination of present fields
compiles once:

  tokens           int32   [N, P + C]  left-padded prompt, then completion
  input_mask       bool    [N, P + C]  True on real (non-pad) tokens
  completion_mask  float32 [N, C]      1 on completion tokens that count
  advantages       float32 [N]         optional; absent = computed from
                                       rewards in the update (`prepare`)
  old_logps        float32 [N, C]      optional; absent = current policy
  ref_logps        float32 [N, C]      needed when hp.needs_reference
  sampler_logps    float32 [N, C]      optional; the sampler's log-probs of
                                       the completion tokens (rollout.py)
  rewards          float32 [N]         the rows' total rewards; needed
                                       without advantages
  kl_coeff         float32 [N]         optional; the KL coefficient of each
                                       row (the adaptive controller's
                                       value); absent = hp.beta

`update_batch` builds one from a rollout's `Sequences` (its first three
fields and sampler_logps: what the log-prob passes read, before any
reward exists) and its rewards; the update computes the advantages
(`prepare`).

The reference policy is the base model: LoRA switched off on the same
weights (`logprobs.final_hidden_states`).
"""

import contextlib
import dataclasses
import functools
from typing import Any

from flax import nnx
from flax import struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agent_tunix.models import tunix_adapter
from agent_tunix.rl import advantages as advantages_lib
from agent_tunix.rl import logprobs
from agent_tunix.rl import losses
from agent_tunix.rl import packing as packing_lib
from agent_tunix.rl import remat
from agent_tunix.tpu import sharding

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
    packing: the `packing.Packing` the passes run the batch at (static:
      each distinct shape compiles once); None: padded rows.
  """

  tokens: Rows
  input_mask: Rows
  completion_mask: Rows
  sampler_logps: Rows | None = None
  packing: packing_lib.Packing | None = struct.field(
      pytree_node=False, default=None)


@struct.dataclass
class UpdateBatch:
  """One update's inputs (the module docstring's layout); None: absent.

  `update_batch` builds the host batch of a run; `of` puts one together
  from parts already on the mesh.
  """

  tokens: Rows
  input_mask: Rows
  completion_mask: Rows
  advantages: Rows | None = None
  old_logps: Rows | None = None
  ref_logps: Rows | None = None
  sampler_logps: Rows | None = None
  rewards: Rows | None = None
  kl_coeff: Rows | None = None
  packing: packing_lib.Packing | None = struct.field(
      pytree_node=False, default=None)

  @classmethod
  def of(cls, sequences: Sequences, advantages: Rows | None = None,
         **optional: Rows | None) -> 'UpdateBatch':
    """The batch of `sequences` with these advantages and optional fields."""
    return cls(tokens=sequences.tokens, input_mask=sequences.input_mask,
               completion_mask=sequences.completion_mask,
               sampler_logps=sequences.sampler_logps, advantages=advantages,
               packing=sequences.packing, **optional)

  @property
  def sequences(self) -> Sequences:
    return Sequences(self.tokens, self.input_mask, self.completion_mask,
                     self.sampler_logps, self.packing)


@dataclasses.dataclass(frozen=True)
class StepHParams:
  """Static hyperparameters of the GRPO update (hashable, for jit).

  Attributes:
    objective: the loss's parts and the advantage estimator
      (`losses.Objective`).
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
  """

  objective: losses.Objective = losses.Objective()
  chunk_size: int = 64
  micro_batch_size: int = 0
  remat: str = 'none'
  prompt_group: int = 1
  temperature: float = 1.0

  def __post_init__(self):
    # Invariants only: a config's fields are checked, each with its fix, by
    # `config.validation` before `hparams_from_config` builds these.
    assert self.remat in remat.REMAT_MODES, self.remat
    assert self.temperature > 0 and self.chunk_size >= 1, self
    assert self.micro_batch_size >= 0 and self.prompt_group >= 1, self
    assert self.micro_batch_size % self.prompt_group == 0, (
        f'prompt_group={self.prompt_group} must divide '
        f'micro_batch_size={self.micro_batch_size}')

  @property
  def needs_reference(self) -> bool:
    """Whether the update reads batch.ref_logps (KL or MaxEnt)."""
    return self.objective.needs_reference

  @property
  def beta(self) -> float:
    """The KL term's (starting) coefficient; 0 without a KL term."""
    return self.objective.kl_coeff


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

  'kl_coeff' with the adaptive KL controller (grpo.kl_target > 0: the
  step's coefficient, which the static `StepHParams` cannot carry). The
  host batches of the train loop and the benchmarks get these and only
  these (`update_batch`); the preflight's abstract batch likewise.
  """
  return ('kl_coeff',) if config.grpo.kl_target > 0 else ()


def update_batch(config: Any, sequences: Sequences, rewards: Any,
                 kl_coeff: float) -> UpdateBatch:
  """The host update batch of `config`: the one place that builds one.

  Its advantages are left None: the update computes them from the rewards
  (`prepare`, with the config's estimator).

  Args:
    config: the run's config; its `optional_inputs` are set, the other
      optional fields left None (old and reference log-probs come later,
      on the mesh).
    sequences: the rows' host arrays.
    rewards: [N] total reward of each row.
    kl_coeff: the KL coefficient of this update (every row gets it).

  Returns:
    The `UpdateBatch`, float32 per-row arrays.
  """
  rewards = np.asarray(rewards, np.float32)
  return UpdateBatch.of(
      sequences, None, rewards=rewards,
      kl_coeff=(np.full(len(rewards), kl_coeff, np.float32)
                if 'kl_coeff' in optional_inputs(config) else None),
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
  g = config.grpo
  return StepHParams(
      objective=losses.from_config(config, initial_kl_coeff(config)),
      chunk_size=int(g.logps_chunk_size),
      micro_batch_size=int(config.training.micro_batch_size
                           * g.num_generations),
      remat=config.model.remat,
      prompt_group=int(g.num_generations) if g.share_prompts else 1,
      temperature=float(config.generation.temperature or 1.0),
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


def prepare(batch: UpdateBatch, hp: StepHParams):
  """(The batch with its advantages, metrics of their estimator).

  The one place a run's advantages are computed: on the whole batch, after
  the reference pass (MaxEnt reads its log-probs) and before the gradient
  function, with hp.objective's estimator (`advantages.estimate`). A batch
  that brings advantages (benchmarks, tests) keeps them.
  """
  if batch.advantages is not None:
    return batch, {}
  estimator = hp.objective.advantages
  if estimator is None or batch.rewards is None:
    raise ValueError(
        'The update batch has no advantages; give it batch.rewards and a '
        f'StepHParams objective with an advantage estimator (got '
        f'{estimator!r}), or batch.advantages.')
  values, metrics = advantages_lib.estimate(
      estimator, batch.rewards, batch.ref_logps, batch.completion_mask)
  return batch.replace(advantages=values), metrics


def _sampler_gap(old_logps, micro, mask):
  """{SAMPLER_GAP: masked sum of |trainer - sampler| log-probs} of the
  policy that sampled (old log-probs, or this pass's own); {} without the
  sampler's."""
  if micro.sampler_logps is None:
    return {}
  gap = jnp.abs(jax.lax.stop_gradient(old_logps) - micro.sampler_logps)
  return {SAMPLER_GAP: (gap * mask).sum()}


def _packed(packing, completion_mask):
  """The log-prob pass's packing arguments: none for padded rows (so a
  replacement logps_fn need not know them)."""
  if packing is None:
    return {}
  return {'completion_mask': completion_mask, 'packing': packing}


def _loss_fn(graphdef, rest, hp: StepHParams, completion_len, total,
             logps_fn):
  """loss(lora_state, micro) -> (the micro-batch's share of the full-batch
  loss, its masked per-token sums), for `jax.value_and_grad`."""
  objective = hp.objective

  def loss_fn(lora_state, micro):
    # copy=True: fresh Variables and modules owned by this trace. With the
    # outer ones, tunix's nnx.remat fails writing its outputs back (flax
    # TraceContextError), and _apply_remat would change the caller's model.
    module = nnx.merge(graphdef, lora_state, rest, copy=True)
    remat.apply_remat(module, hp.remat)
    logps, entropy = logps_fn(
        module, micro.tokens, micro.input_mask, completion_len,
        hp.chunk_size, use_lora=True, compute_entropy=True,
        group=hp.prompt_group, temperature=hp.temperature,
        **_packed(micro.packing, micro.completion_mask),
    )
    mask = micro.completion_mask.astype(jnp.float32)
    old_logps = micro.old_logps
    if old_logps is None:
      old_logps = jax.lax.stop_gradient(logps)
    per_token, sums = objective.per_token_loss(
        losses.TokenInputs(logps, old_logps, entropy, mask, micro))
    sums.update(_sampler_gap(old_logps, micro, mask))
    # Weight each micro-batch by its share of the full-batch normaliser so
    # that the sum over micro-batches is the full-batch loss for every mode.
    aggregation = objective.aggregation
    weight = aggregation.count(mask) / total
    return aggregation(per_token, mask) * weight, sums

  return loss_fn


def _grads_and_metrics(model: nnx.Module, batch: UpdateBatch,
                       hp: StepHParams, logps_fn=None):
  """Full-batch loss gradient w.r.t. LoRA params, accumulated over micros.

  Args:
    model: the LoRA model.
    batch: see the module docstring; with its advantages (`prepare`).
    hp: static hyperparameters.
    logps_fn: replaces `logprobs.per_token_logps` (same arguments); the
      benchmark passes a naive full-logits version.

  Returns:
    (LoRA grads State, metrics dict).
  """
  graphdef, lora, rest = nnx.split(model, nnx.LoRAParam, ...)
  mask = batch.completion_mask.astype(jnp.float32)
  total = jnp.maximum(hp.objective.aggregation.count(mask), 1.0)
  grad_fn = jax.value_and_grad(
      _loss_fn(graphdef, rest, hp, mask.shape[1], total,
               logps_fn or logprobs.per_token_logps),
      has_aux=True)

  def accumulate(carry, micro):
    (loss, sums), grads = grad_fn(lora, micro)
    return jax.tree.map(jnp.add, carry, (loss, sums, grads)), None

  micros = _micro_batches(batch, hp.micro_batch_size, hp.prompt_group)
  names = hp.objective.sum_names() + (
      (SAMPLER_GAP,) if micros.sampler_logps is not None else ())
  init = (
      jnp.zeros((), jnp.float32),
      {name: jnp.zeros((), jnp.float32) for name in names},
      jax.tree.map(jnp.zeros_like, lora),
  )
  (loss, sums, grads), _ = jax.lax.scan(accumulate, init, micros)
  total_tokens = jnp.maximum(mask.sum(), 1.0)
  metrics = {key: value / total_tokens for key, value in sums.items()}
  metrics['loss'] = loss
  metrics['grad_norm'] = optax.tree.norm(grads)
  metrics.update(hp.objective.final_metrics(metrics))
  return grads, metrics


def update_grads(model: nnx.Module, batch: UpdateBatch, hp: StepHParams,
                 grads_and_metrics=_grads_and_metrics):
  """(LoRA grads, metrics) of one update: `prepare`, then the gradient
  function (not jitted; `make_train_step` and tests jit it)."""
  batch, estimator_metrics = prepare(batch, hp)
  grads, metrics = grads_and_metrics(model, batch, hp)
  return grads, {**metrics, **estimator_metrics}


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
    jitted = _ShardedActivations(jax.jit(
        functools.partial(self._fn, graphdefs),
        static_argnames=self._static_argnames,
    ))
    self._entries.append((graphdefs, jitted))
    return jitted


class _ShardedActivations:
  """A jitted function traced with the model's activation sharding
  (`tunix_adapter.activation_sharding`) on the mesh of its arguments.

  Without it XLA picks the update's and log-prob passes' activation layout
  from the FSDP weights' and moves several times the bytes (the preflight's
  breakdown shows it). A call on one device, or off a mesh, is unchanged.
  """

  def __init__(self, jitted):
    self._jitted = jitted

  def _context(self, args):
    mesh = sharding.mesh_of(args)
    if mesh is None or mesh.size == 1:
      return contextlib.nullcontext()
    return tunix_adapter.activation_sharding(mesh)

  def __call__(self, *args, **kwargs):
    with self._context(args):
      return self._jitted(*args, **kwargs)

  def lower(self, *args, **kwargs):
    with self._context(args):
      return self._jitted.lower(*args, **kwargs)

  def __getattr__(self, name):  # The jitted function's other attributes.
    return getattr(self._jitted, name)


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
    grads, metrics = update_grads(model, batch, hp, grads_and_metrics)
    optimizer.update(model, grads)
    return nnx.state(model, nnx.LoRAParam), nnx.state(optimizer), metrics

  return GraphJit(step, static_argnames=('hp',))


TRAIN_STEP = make_train_step(_grads_and_metrics)


def _logps(graphdefs, state, batch: Sequences, hp, use_lora):
  """[N, C] log-probs of the model (graphdefs[0], state), micro-batched."""
  completion_len = batch.completion_mask.shape[1]
  micros = _micro_batches(
      {'tokens': batch.tokens, 'input_mask': batch.input_mask,
       'completion_mask': batch.completion_mask},
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
        **_packed(batch.packing, micro['completion_mask']),
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
  return Sequences(batch.tokens, batch.input_mask, batch.completion_mask,
                   packing=batch.packing)


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
