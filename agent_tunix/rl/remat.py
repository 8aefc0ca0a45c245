"""Rematerialisation of the update's forward pass (model.remat).

'block' is tunix's own RematConfig.BLOCK; 'layer' stores only each decoder
layer's input and recomputes the layer in the backward pass, with a data
dependency that keeps XLA from scheduling the recomputation early
(`remat_after_cotangent`).
"""

import functools

from flax import nnx
import jax
import jax.numpy as jnp

from agent_tunix.models import families

# 'block' is tunix's RematConfig.BLOCK; 'layer' is ours
# (`_layer_remat`), not tunix's DECODER, whose jax.checkpoint
# recomputation XLA CPU schedules early (no memory saved).
REMAT_MODES = ('none', 'block', 'layer')


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


@functools.cache
def _layer_remat(layer_class):
  """`layer_class` recomputed whole in the backward pass.

  Only the layer's inputs (its activations, KV cache and any further
  inputs: Gemma 4's per-layer input and a KV-shared layer's donor K/V) are
  kept for the backward pass; see `remat_after_cotangent`. They are all
  differentiable inputs of the recomputation, so gradients reach a donor
  layer and the per-layer embeddings; the layer's outputs (its K/V, which
  later layers may read, included) are outputs of it. Installed by
  `apply_remat(..., 'layer')` on the model copy the update differentiates.
  """

  class LayerRemat(layer_class):

    def __call__(self, x, segment_pos, cache, attn_mask, **inputs):
      graphdef, lora, rest = nnx.split(self, nnx.LoRAParam, ...)

      def block(diff, frozen):
        lora_state, layer_x, layer_cache, layer_inputs = diff
        layer = nnx.merge(graphdef, lora_state, frozen, copy=True)
        return layer_class.block(layer, layer_x, segment_pos, layer_cache,
                                 attn_mask, **layer_inputs)

      return remat_after_cotangent(block, (lora, x, cache, inputs), rest)

  LayerRemat.__name__ = LayerRemat.__qualname__ = (
      f'LayerRemat{layer_class.__name__}')
  return LayerRemat


def apply_remat(module: nnx.Module, mode: str) -> None:
  """Sets a remat mode on a model merged inside the update's trace.

  'block' is tunix's own (the family's `remat_blocks`); 'layer' recomputes
  each of the family's decoder layers whole (`_layer_remat`). The change is
  made only on the copy the update differentiates; the sampler and the
  log-prob passes keep the model as loaded (tunix's sampler cannot run a
  remat model).

  Args:
    module: a tunix Gemma 3 or Gemma 4 merged with `copy=True` inside the
      current trace.
    mode: one of REMAT_MODES.
  """
  if mode == 'none':
    return
  family = families.of_config(getattr(module, 'config', None))
  if mode == 'layer':
    found = 0
    for _, sub in nnx.iter_modules(module):
      if isinstance(sub, family.decoder_layer):
        sub.__class__ = _layer_remat(family.decoder_layer)
        found += 1
    unit = family.decoder_layer.__name__
  else:
    found = family.remat_blocks(module)
    unit = 'Attention/FeedForward'
  if not found:
    raise ValueError(
        f'remat={mode!r} needs tunix {family.title} {unit} modules; '
        f'{type(module).__name__} has none. Use remat=\'none\'.'
    )
