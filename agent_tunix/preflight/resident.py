"""The resident check: frozen weights and rollout KV cache against a chip's HBM.

Both live on the chips for the whole rollout, so their per-chip sum is a
lower bound of the largest program; a run over it is refused before any
compile. Imports models/, tpu/ and the modules beside it.
"""

import math

from flax import nnx
import jax.numpy as jnp

from agent_tunix.models import gemma
from agent_tunix.preflight import abstract
from agent_tunix.preflight import compiler
from agent_tunix.tpu import sharding


class ResidentOverflow(ValueError):
  """The arrays that must be resident together overflow a chip's HBM."""


def rollout_cache_shapes(model, rows, cache_len):
  """[(shape, dtype)] of the rollout's KV cache: K and V of each cached layer.

  Gemma 3 caches every layer with the config's KV heads and head dim; Gemma
  4 only the layers that compute K/V (KV-shared layers read their donor's),
  each with its own KV heads and head dim (global layers: wider heads,
  their own KV-head count).
  """
  cfg = model.config
  if hasattr(model, 'kv_cache_sharing_patterns'):
    layers = [layer.attn for i, layer in enumerate(model.layers)
              if model.kv_cache_sharing_patterns[i] == i]
    dims = [(a.num_kv_heads, a.head_dim) for a in layers]
    dtype = cfg.dtype
  else:
    dims = [(cfg.num_kv_heads, cfg.head_dim)] * cfg.num_layers
    dtype = cfg.param_dtype
  return [((rows, cache_len, k, h), dtype) for k, h in dims for _ in 'kv']


def check_resident(config, mesh, spec, usable):
  """Refuses a run whose frozen weights and rollout KV cache overflow a chip.

  Both live on the chips together for the whole rollout, so their per-chip
  sum (the weights' sharding as the trainer places them; the cache's as
  `sharding.kv_cache_sharding` gives it, for training.batch_size x
  grpo.num_generations rows of generation.kv_cache_size) is a lower bound of
  the largest program. Computed from shapes only: a model too big to fit is
  refused in seconds, before any compile (a 31B compile would also need
  more host RAM than a small machine has).

  Raises:
    ResidentOverflow: with a one-line reason naming the bytes per chip.
  """
  def frozen_bytes(model_cfg):
    model = gemma.abstract_model(gemma.model_config(model_cfg))
    state = nnx.state(model, nnx.Param)
    return model, compiler.per_chip_bytes(abstract.with_shardings(
        state, nnx.get_named_sharding(state, mesh)))

  model, weights = frozen_bytes(config.model)
  cfg = model.config
  judge_cfg = abstract.judge_model_config(config)
  if judge_cfg is not None:  # The judge's weights stay on the chips too.
    weights += frozen_bytes(judge_cfg)[1]
  rows = config.training.batch_size * config.grpo.num_generations
  heads_spec = tuple(cfg.shd_config.act_btnh)
  cache = 0
  for shape, dtype in rollout_cache_shapes(
      model, rows, config.generation.kv_cache_size):
    per_chip = sharding.kv_cache_sharding(mesh, shape, heads_spec).shard_shape(
        shape)
    cache += math.prod(per_chip) * jnp.dtype(dtype).itemsize
  if weights + cache <= usable:
    return
  frozen = ('its frozen weights' if judge_cfg is None
            else "its and the judge's frozen weights")
  raise ResidentOverflow(
      f'{config.model.preset} does not fit {spec.name} ({spec.num_chips} '
      f'chips): {frozen} ({compiler.gib(weights)} GiB per chip) and the '
      f'rollout KV cache ({rows} rows x {config.generation.kv_cache_size} '
      f'tokens: {compiler.gib(cache)} GiB per chip) need '
      f'{compiler.gib(weights + cache)} GiB of HBM per chip, more than the '
      f'{compiler.gib(usable)} GiB a program may use, before any '
      'activation; use a slice with more chips or HBM '
      '(e.g. v5p), or fewer rollout rows / a shorter '
      'generation.kv_cache_size.'
  )
