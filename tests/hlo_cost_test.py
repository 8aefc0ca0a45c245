"""The HLO count of flops and HBM bytes (preflight.hlo_cost), on TPU programs.

Compiled for one v5e chip by libtpu on this CPU: loops are counted with
their trip counts (a loop and the same program unrolled count the same),
and programs whose traffic is known are counted as known.
"""

import jax
import jax.numpy as jnp
import pytest

from agent_tunix.preflight import calibration
from agent_tunix.preflight import hlo_cost
from agent_tunix.tpu import topology

_ROWS, _WIDTH, _TRIPS = 8, 1024, 6


@pytest.fixture(scope='module')
def chip():
  return topology.devices(topology.parse('v5e:2x2'))[0]


def _spec(shape, chip, dtype=jnp.bfloat16):
  return jax.ShapeDtypeStruct(
      shape, dtype, sharding=jax.sharding.SingleDeviceSharding(chip))


def _count(fn, *args):
  return hlo_cost.count(jax.jit(fn).lower(*args).compile().as_text())


def _step(x, w):
  return jnp.tanh(x @ w)


def _weight(ws, index):
  return jax.lax.dynamic_index_in_dim(ws, index, keepdims=False)


def _looped(x, ws, order):
  return jax.lax.fori_loop(
      0, _TRIPS, lambda i, x: _step(x, _weight(ws, order[i])), x)


def _unrolled(x, ws, order):
  for i in range(_TRIPS):
    x = _step(x, _weight(ws, order[i]))
  return x


def test_a_loop_counts_as_its_unrolled_program(chip):
  # The weight of each step picked by a traced index in both programs.
  args = (_spec((_ROWS, _WIDTH), chip),
          _spec((_TRIPS, _WIDTH, _WIDTH), chip),
          _spec((_TRIPS,), chip, jnp.int32))
  looped, unrolled = _count(_looped, *args), _count(_unrolled, *args)
  assert not looped.unknown_loops
  # Every trip's weight is read from HBM: the loop counts all of them.
  weights = _TRIPS * _WIDTH * _WIDTH * 2
  assert looped.bytes >= weights
  assert looped.bytes == pytest.approx(unrolled.bytes, rel=0.05)
  matmuls = 2 * _ROWS * _WIDTH * _WIDTH * _TRIPS
  assert looped.flops == pytest.approx(unrolled.flops, rel=0.05)
  assert looped.flops >= matmuls
  # XLA's own figure counts the body once.
  cost = jax.jit(_looped).lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  assert cost['flops'] < looped.flops / 2


def test_a_loop_without_a_known_trip_count_is_named_and_scaled(chip):
  def open_loop(x, ws, n):
    def body(carry):
      i, x = carry
      return i + 1, _step(x, ws[i % _TRIPS])
    return jax.lax.while_loop(lambda c: c[0] < n, body, (0, x))[1]

  args = (_spec((_ROWS, _WIDTH), chip),
          _spec((_TRIPS, _WIDTH, _WIDTH), chip), _spec((), chip, jnp.int32))
  text = jax.jit(open_loop).lower(*args).compile().as_text()
  once, twice = hlo_cost.count(text, 1), hlo_cost.count(text, 2)
  assert once.unknown_loops and once.unknown_loops == twice.unknown_loops
  per_trip = sum(c.bytes for c in once.costs if c.in_open_loop)
  assert per_trip >= _WIDTH * _WIDTH * 2  # one weight read per trip
  assert twice.bytes - once.bytes == pytest.approx(per_trip)


@pytest.mark.parametrize('case', ['matmul', 'kv_row', 'stream'])
def test_programs_of_known_traffic_count_as_known(chip, case):
  c = calibration.calibrate(chip)[case]
  assert c['hlo_ratio'] == pytest.approx(1.0, abs=0.01), c


def test_xla_counts_on_chip_copies_of_a_matmul_too(chip):
  # The reason the report's bytes are the HLO count's: XLA's cost analysis
  # counted 2.3x the known traffic of a bf16 matmul.
  c = calibration.calibrate(chip)['matmul']
  assert c['compiler_ratio'] > 1.5


def test_in_place_cache_update_is_one_row():
  text = '''HloModule m
ENTRY %main (cache: bf16[16,1024,1,256], row: bf16[16,1,1,256], i: s32[]) -> bf16[16,1024,1,256] {
  %cache = bf16[16,1024,1,256]{3,2,1,0} parameter(0)
  %row = bf16[16,1,1,256]{3,2,1,0} parameter(1)
  %i = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %dus = bf16[16,1024,1,256]{3,2,1,0} dynamic-update-slice(%cache, %row, %z, %i, %z, %z), metadata={op_name="jit(f)/cache/dynamic_update_slice"}
}
'''
  count = hlo_cost.count(text)
  assert count.bytes == 2 * 16 * 256 * 2
  assert count.costs[0].category == 'KV-cache update'


def test_on_chip_buffers_are_not_hbm_traffic():
  assert hlo_cost.array_bytes('bf16[4,128]{1,0:T(8,128)(2,1)}') == 1024
  assert hlo_cost.array_bytes('bf16[4,128]{1,0:T(8,128)(2,1)S(1)}') == 0
  assert hlo_cost.array_bytes('(f32[2]{0}, u32[]{:S(2)})') == 8
