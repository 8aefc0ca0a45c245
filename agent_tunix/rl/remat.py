"""Rematerialisation of the update's forward pass (model.remat).

'block' is tunix's own RematConfig.BLOCK; 'layer' stores only each decoder
layer's input and recomputes the layer in the backward pass, with a data
dependency that keeps XLA from scheduling the recomputation early
(`remat_after_cotangent`).
"""

import dataclasses

from flax import nnx
import jax
import jax.numpy as jnp
from tunix.models.gemma3 import model as gemma3_lib
from tunix.models.gemma4 import model as gemma4_lib

from agent_tunix.models import gemma4 as gemma4_policy

# 'block' is tunix's RematConfig.BLOCK; 'layer' is ours
# (`_LayerRematDecoderLayer`), not tunix's DECODER, whose jax.checkpoint
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


class _LayerRematDecoderLayer(gemma3_lib.DecoderLayer):
  """A tunix DecoderLayer recomputed whole in the backward pass.

  Only its input (and KV cache, when given) is kept for the backward pass;
  see `remat_after_cotangent`. Installed by `apply_remat(..., 'layer')` on
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


class _LayerRematGemma4DecoderLayer(gemma4_lib.DecoderLayer):
  """A tunix Gemma 4 DecoderLayer recomputed whole in the backward pass.

  Like `_LayerRematDecoderLayer`. A KV-shared layer's donor K/V
  (`kv_shared_cache`) and its per-layer input are differentiable inputs of
  the recomputation, so their gradients reach the donor layer and the
  per-layer embeddings; the layer's own K/V output (which later layers may
  read) is an output of it.
  """

  def __call__(self, x, segment_pos, cache, attn_mask, per_layer_input=None,
               kv_shared_cache=None):
    graphdef, lora, rest = nnx.split(self, nnx.LoRAParam, ...)

    def block(diff, frozen):
      lora_state, inputs, layer_cache, per_layer, shared = diff
      layer = nnx.merge(graphdef, lora_state, frozen, copy=True)
      return gemma4_policy.decoder_block(
          layer, inputs, segment_pos, layer_cache, attn_mask, per_layer,
          shared,
      )

    return remat_after_cotangent(
        block, (lora, x, cache, per_layer_input, kv_shared_cache), rest
    )


def _gemma4_targets(mode):
  if mode == 'layer':
    return (gemma4_lib.DecoderLayer,)
  return (gemma4_lib.Attention, gemma4_lib.FeedForward)


def apply_remat(module: nnx.Module, mode: str) -> None:
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
  targets += _gemma4_targets(mode)
  found = 0
  for _, sub in nnx.iter_modules(module):
    if not isinstance(sub, targets):
      continue
    if mode == 'layer':
      sub.__class__ = (_LayerRematGemma4DecoderLayer
                       if isinstance(sub, gemma4_lib.DecoderLayer)
                       else _LayerRematDecoderLayer)
    elif isinstance(sub, (gemma4_lib.Attention, gemma4_lib.FeedForward)):
      # Gemma 4's modules read remat_config from their (shared) config.
      sub.config = dataclasses.replace(
          sub.config, remat_config=gemma4_lib.RematConfig.BLOCK
      )
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
        f'remat={mode!r} needs tunix Gemma {names} modules; '
        f'{type(module).__name__} has none. Use remat=\'none\'.'
    )
