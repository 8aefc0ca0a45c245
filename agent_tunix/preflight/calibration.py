"""The HLO count checked on programs whose HBM traffic is known.

`calibrate(device)` compiles, for one chip of the slice:

  * matmul: a bf16 [M, K] x [K, N] product, which reads both operands and
    writes the result once: (MK + KN + MN) x 2 bytes;
  * kv_row: one row written in place into a donated bf16 KV cache
    [B, S, K, H] at a traced position: the row read and written,
    2 x B x K x H x 2 bytes (the cache is neither read nor copied);
  * stream: y = 2x over a bf16 array larger than the chip's on-chip memory:
    read and written once.

and reports, for each, the known bytes, the HLO count's (`hlo_cost`) and
XLA's own `cost_analysis()` bytes, and their ratios to the known. Imports
hlo_cost only.
"""

import functools

import jax
import jax.numpy as jnp

from agent_tunix.preflight import hlo_cost

_MATMUL = (4096, 4096, 4096)
_CACHE = (16, 1024, 1, 256)
_STREAM = (64 * 1024 * 1024,)  # 128 MiB of bf16


def _spec(shape, device, dtype=jnp.bfloat16):
  return jax.ShapeDtypeStruct(
      shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device))


def _row(cache, row, position):
  return jax.lax.dynamic_update_slice(cache, row, (0, position, 0, 0))


def _cases(device):
  m, k, n = _MATMUL
  b, s, heads, h = _CACHE
  return {
      'matmul': (jax.jit(jnp.matmul),
                 (_spec((m, k), device), _spec((k, n), device)),
                 (m * k + k * n + m * n) * 2),
      'kv_row': (jax.jit(_row, donate_argnums=(0,)),
                 (_spec(_CACHE, device), _spec((b, 1, heads, h), device),
                  _spec((), device, jnp.int32)),
                 2 * b * heads * h * 2),
      'stream': (jax.jit(functools.partial(jnp.multiply, 2)),
                 (_spec(_STREAM, device),), 2 * _STREAM[0] * 2),
  }


def calibrate(device):
  """{case: {known, hlo, compiler, hlo_ratio, compiler_ratio}} bytes."""
  out = {}
  for name, (fn, args, known) in _cases(device).items():
    compiled = fn.lower(*args).compile()
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    counted = hlo_cost.count(compiled.as_text()).bytes
    xla = float(cost.get('bytes accessed', 0.0))
    out[name] = {'known': known, 'hlo': counted, 'compiler': xla,
                 'hlo_ratio': counted / known,
                 'compiler_ratio': xla / known}
  return out
