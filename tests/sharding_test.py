"""Tests for agent_tunix.tpu.sharding: specs, multi-host row bookkeeping, and one
GRPO step of the tiny model on fake CPU device meshes.

The mesh tests start two subprocesses side by side, one with 4 fake CPU
devices (meshes (2, 2) and (1, 1)) and one with 8 ((8, 1), FSDP alone),
because the device count is fixed when jax starts. Each builds the tiny model
(`train.setup`: models.build on its first mesh), re-places the same initial
weights on its other meshes, runs `train.update_policy` on one fixed rollout
batch, and reports losses, LoRA params and where every array lives (also the
sampler's initial KV cache on (2, 2)). The (1, 1) mesh is the one-device
reference. Sampling itself on a sharded mesh is compared in
tests/multihost_test.py (a whole run on 2 processes against 1).

Tolerances: the loss and step metrics within rtol 1e-5; updated LoRA params
within atol 1e-6 (the step moves them by ~1e-3; sharded sums differ from
one device's by ~3e-8).
"""

import json
import os
import pathlib
import pickle
import subprocess
import sys
import time

import jax
from jax.experimental import multihost_utils
import numpy as np
import pytest

from agent_tunix.tpu import sharding

_REPO = pathlib.Path(__file__).resolve().parents[1]
_TIMEOUT_S = 900  # Generous: the three children take ~2 min on 2 idle cores.
_LOSS_RTOL = 1e-5
_LORA_ATOL = 1e-6
# The MoE model's first Adam step (g / (|g| + eps)) turns summation-order
# noise in its experts' tiny gradients into up to ~1e-6 of a ~1e-3 move.
_MOE_LORA_ATOL = 5e-6

# Runs in a subprocess: argv = [meshes as JSON, meshes whose KV cache layout
# to report as JSON, output pickle path, model tag]. Tag '' is configs/tiny.py
# (Gemma 3); 'moe' the tiny Gemma 4 mixture of experts with LoRA on its
# experts too (model.lora_experts). Results are keyed tag + mesh.
_CHILD = r'''
import dataclasses
import json
import pickle
import re
import sys

import jax
from flax import nnx
import numpy as np

from agent_tunix.rl import grpo
from agent_tunix.rl import optimizer as optimizer_lib
from agent_tunix.rl import rollout
from agent_tunix.rl import staging
from agent_tunix.run import train
from agent_tunix.tpu import sharding
from agent_tunix.configs import tiny
from agent_tunix.configs import tiny_gemma4

TAG = sys.argv[4]
shapes = [tuple(s) for s in json.loads(sys.argv[1])]
cache_on = [tuple(s) for s in json.loads(sys.argv[2])]
PROMPT, COMPLETION, PROMPTS, G = 16, 8, 4, 2
ROWS = PROMPTS * G


def config_for(shape):
  if TAG == 'moe':
    config = tiny_gemma4.get_config('model.preset=tiny_gemma4_moe')
    config.model.lora_experts = True
  else:
    config = tiny.get_config()
  config.mesh.shape = shape
  config.training.batch_size = PROMPTS
  # Micro-batch rows must split over the data-parallel devices.
  config.training.micro_batch_size = 2 if shape[0] <= 4 else PROMPTS
  config.grpo.beta = 0.04
  # The [2, 2] mesh also recomputes each layer in the backward pass: its
  # update must still equal the one-device update (remat 'none').
  config.model.remat = 'layer' if tuple(shape) == (2, 2) else 'none'
  return config


def fixed_update():
  """A rollout batch: random tokens, ragged prompts and completions."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 5000, (ROWS, PROMPT + COMPLETION)).astype(np.int32)
  mask = np.ones(tokens.shape, bool)
  for i, n in enumerate(rng.integers(3, PROMPT + 1, PROMPTS).repeat(G)):
    tokens[i, :PROMPT - n] = 0
    mask[i, :PROMPT - n] = False
  lengths = rng.integers(1, COMPLETION + 1, ROWS)
  completion = (np.arange(COMPLETION) < lengths[:, None]).astype(np.float32)
  mask[:, PROMPT:] = completion > 0
  tokens[:, PROMPT:] *= completion.astype(np.int32)
  return grpo.UpdateBatch(
      tokens=tokens, input_mask=mask, completion_mask=completion,
      advantages=rng.normal(size=ROWS).astype(np.float32))


def spec_of(x):
  spec = list(getattr(x.sharding, 'spec', ()))
  spec += [None] * (x.ndim - len(spec))
  return [e if e is None or isinstance(e, str) else list(e) for e in spec]


def layout(tree):
  """{'a/b/c': {shape, spec, shard, mesh}} of the arrays in a State/dict."""
  out = {}
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    keys = [getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k)))
            for k in path]
    name = '/'.join(str(k) for k in keys if k != 'value')
    out[name] = {
        'shape': list(x.shape), 'spec': spec_of(x),
        'shard': list(x.sharding.shard_shape(x.shape)),
        'on_mesh': isinstance(x.sharding, jax.sharding.NamedSharding),
    }
  return out


GATHER = re.compile(r'= \(?\w+\[([\d,]*)\][^=]* all-gather(-start)?\(')


def table_gathers(session, batch):
  """Result shapes of the all-gathers in the compiled reference log-prob
  pass that hold a tenth of the [V, D] embedding table or more."""
  fn, state = grpo.logps_program(session.model)
  text = fn.lower(state, grpo.logps_inputs(batch), hp=session.hp,
                  use_lora=False).compile().as_text()
  table = session.model.embedder.input_embedding[...].size
  found = []
  for line in text.splitlines():
    match = GATHER.search(line)
    dims = [int(d) for d in match.group(1).split(',') if d] if match else []
    if match and np.prod(dims) * 10 >= table:
      found.append(match.group(1))
  return found


def lora_values(model):
  return {'/'.join(map(str, p)): np.asarray(jax.device_get(v.get_value()))
          for p, v in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))}


update = fixed_update()
results = {}
first = None
for shape in shapes:
  config = config_for(shape)
  if first is None:
    session = train.setup(config, '', with_data=False)
    graphdef, state = nnx.split(session.model)
    first = session, graphdef, jax.device_get(state)
  else:
    session, graphdef, host = first
    mesh = sharding.make_mesh(config.mesh)
    model = nnx.merge(graphdef, jax.device_put(
        host, nnx.get_named_sharding(host, mesh)))
    tx, schedule = optimizer_lib.make_optimizer(
        config.optimizer.learning_rate, config.optimizer.warmup_ratio,
        config.training.num_steps, config.optimizer.b1, config.optimizer.b2,
        config.optimizer.weight_decay, config.optimizer.max_grad_norm)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.LoRAParam)
    sharding.place_optimizer(optimizer, mesh)
    session = dataclasses.replace(
        session, config=config, mesh=mesh, model=model, optimizer=optimizer,
        state=dataclasses.replace(session.state, schedule=schedule),
        hp=grpo.hparams_from_config(config),
        sampler=rollout.Rollout(
            model, session.tokenizer, config.generation.kv_cache_size,
            cpu_decode_graph=config.generation.cpu_decode_graph))
  mesh, model = session.mesh, session.model
  result = {
      'devices': len(mesh.devices.flat),
      'lora_before': lora_values(model),
      'params': layout(nnx.state(model, nnx.Param)),
      'batch': layout(sharding.shard_batch(update, mesh)),
  }
  if shape in cache_on:
    state = session.sampler.init_state(
        update.tokens[:, :PROMPT], PROMPT + COMPLETION, 0,
        temperature=1.0, top_p=1.0, top_k=None)
    result['cache'] = layout(state.cache)
  staged = staging.stage(session.model, mesh, session.hp, update.sequences,
                         config.grpo.num_iterations)
  result['metrics'] = train.update_policy(session, update, staged)
  result['table_gathers'] = table_gathers(
      session, sharding.shard_batch(update, mesh))
  result['lora_after'] = lora_values(model)
  result['lora'] = layout(nnx.state(model, nnx.LoRAParam))
  result['opt'] = layout(nnx.state(session.optimizer, nnx.OptState))
  results[TAG + str(list(shape))] = result
  print('done', shape, result['metrics'], flush=True)

with open(sys.argv[3], 'wb') as f:
  pickle.dump(results, f)
'''


def _start(devices, shapes, cache_on, out, log, tag):
  env = dict(os.environ)
  env['XLA_FLAGS'] = (
      env.get('XLA_FLAGS', '') +
      f' --xla_force_host_platform_device_count={devices}').strip()
  env['JAX_PLATFORMS'] = 'cpu'
  env['PYTHONPATH'] = os.pathsep.join(
      [str(_REPO)] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
  with open(log, 'wb') as f:
    return subprocess.Popen(
        [sys.executable, '-c', _CHILD, json.dumps(shapes),
         json.dumps(cache_on), str(out), tag],
        cwd=_REPO, env=env, stdout=f, stderr=subprocess.STDOUT)


def _tail(path, lines=30):
  return '\n'.join(pathlib.Path(path).read_text(errors='replace')
                   .splitlines()[-lines:])


@pytest.fixture(scope='module')
def meshes(tmp_path_factory):
  """{'[f, t]': child result} for the meshes on 4 and on 8 devices.

  'moe[f, t]': the tiny Gemma 4 mixture of experts, on its own 4 devices.
  """
  root = tmp_path_factory.mktemp('meshes')
  jobs = [
      (4, [[2, 2], [1, 1]], [[2, 2]], ''),
      (8, [[8, 1]], [], ''),
      (4, [[1, 1], [2, 2]], [], 'moe'),
  ]
  procs = []
  try:
    for devices, shapes, cache_on, tag in jobs:
      out, log = root / f'{tag}{devices}.pkl', root / f'{tag}{devices}.log'
      procs.append(
          (_start(devices, shapes, cache_on, out, log, tag), out, log))
    deadline = time.monotonic() + _TIMEOUT_S
    for proc, _, log in procs:
      try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        pytest.fail(f'{log.name} timed out:\n{_tail(log)}')
      assert proc.returncode == 0, (
          f'{log.name} exited with {proc.returncode}:\n{_tail(log)}')
  finally:
    for proc, _, _ in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  results = {}
  for _, out, _ in procs:
    with open(out, 'rb') as f:
      results.update(pickle.load(f))
  return results


_SHARDED = ['[2, 2]', '[8, 1]', 'moe[2, 2]']


def _shape(mesh):
  return json.loads(mesh[mesh.index('['):])


def _full_step(ref, name):
  """The largest move of `name` in the one-device step (Adam's full step)."""
  return float(np.abs(np.asarray(ref['lora_after'][name])
                      - ref['lora_before'][name]).max())


@pytest.mark.parametrize('mesh', _SHARDED)
def test_one_grpo_step_matches_one_device(meshes, mesh):
  tag = mesh[:mesh.index('[')]
  ref, got = meshes[tag + '[1, 1]'], meshes[mesh]
  assert got['devices'] == int(np.prod(_shape(mesh)))
  for name, value in ref['metrics'].items():
    np.testing.assert_allclose(
        got['metrics'][name], value, rtol=_LOSS_RTOL, atol=1e-7,
        err_msg=f'{name} on mesh {mesh} differs from one device')
  assert ref['metrics']['loss'] != 0
  assert sorted(got['lora_after']) == sorted(ref['lora_after'])
  for name, value in ref['lora_after'].items():
    # Same start (also for the 8-device child's own models.build) ...
    np.testing.assert_allclose(
        got['lora_before'][name], ref['lora_before'][name], rtol=0,
        atol=1e-7, err_msg=f'initial {name} on mesh {mesh}')
    # ... and the same update.
    after = np.asarray(got['lora_after'][name])
    full = _full_step(ref, name)
    if not tag or full == 0 or not name.endswith('lora_b'):
      np.testing.assert_allclose(
          after, value, rtol=0, atol=_MOE_LORA_ATOL if tag else _LORA_ATOL,
          err_msg=f'updated {name} on mesh {mesh}')
      continue
    # B factors start at 0, so their first move is Adam's alone: a full step
    # for every element unless its gradient is as small as Adam's eps; there the move is as much noise as signal
    # (summation order on another mesh, or another CPU's kernels, changed
    # one such element by 9% of a step). Those must be rare and within a
    # tenth of a step; every other element within _MOE_LORA_ATOL.
    moved = np.abs(value - ref['lora_before'][name])
    partial = moved < 0.9 * full
    assert partial.mean() < 0.01, (name, partial.mean())
    np.testing.assert_allclose(
        after[~partial], value[~partial], rtol=0, atol=_MOE_LORA_ATOL,
        err_msg=f'updated {name} on mesh {mesh}')
    np.testing.assert_allclose(
        after[partial], value[partial], rtol=0, atol=0.1 * full,
        err_msg=f'updated {name} on mesh {mesh} (eps-sized gradients)')
  moved = max(np.abs(ref['lora_after'][n] - ref['lora_before'][n]).max()
              for n in ref['lora_after'])
  assert moved > 100 * _LORA_ATOL, f'the step barely moved LoRA ({moved})'


def _check_valid(name, entry, mesh_shape):
  """A spec's axes exist, are used once, divide their dimension, and the
  shard shape is the shape divided by them."""
  sizes = dict(zip(('fsdp', 'tp'), mesh_shape))
  used = []
  for dim, shard, axes in zip(entry['shape'], entry['shard'], entry['spec']):
    axes = [] if axes is None else [axes] if isinstance(axes, str) else axes
    split = int(np.prod([sizes[a] for a in axes]))
    assert dim % split == 0 and shard == dim // split, (name, entry)
    used += axes
  assert len(entry['spec']) == len(entry['shape']), (name, entry)
  assert len(used) == len(set(used)), (name, entry)


@pytest.mark.parametrize('mesh', ['[1, 1]', 'moe[1, 1]'] + _SHARDED)
def test_lora_and_optimizer_specs_are_valid(meshes, mesh):
  got, shape = meshes[mesh], _shape(mesh)
  for group in ('params', 'lora', 'opt', 'batch'):
    for name, entry in got[group].items():
      assert entry['on_mesh'], f'{group} {name} is not on the mesh: {entry}'
      _check_valid(name, entry, shape)
  # The Adam moments are split like the LoRA param they follow (a mesh axis
  # of size 1 splits nothing: on one device the compiler may drop it).
  sizes = dict(zip(('fsdp', 'tp'), shape))

  def split(spec):
    return [None if isinstance(axis, (str, type(None)))
            and sizes.get(axis, 1) == 1 else axis for axis in spec]

  for name, entry in got['lora'].items():
    for moment in ('mu', 'nu'):
      (opt_name,) = [n for n in got['opt']
                     if n.endswith(f'/{moment}/{name}')]
      assert split(got['opt'][opt_name]['spec']) == split(entry['spec']), (
          opt_name, name)


# Shard shapes that show the arrays are split, not replicated.
_EXPECTED_SHARDS = {
    '[2, 2]': {
        ('lora', 'layers/0/attn/q_einsum/w_lora_a'): [16, 4],
        ('lora', 'layers/0/attn/q_einsum/w_lora_b'): [4, 1, 16],
        ('lora', 'layers/1/mlp/gate_proj/kernel_lora_b'): [4, 32],
        ('params', 'embedder/input_embedding'): [131072, 16],
        ('params', 'layers/0/attn/q_einsum/w'): [1, 16, 16],
        ('batch', 'tokens'): [4, 24],
        # KV cache [B, S, K, H]: rows over fsdp; one kv head, so no tp.
        ('cache', 'layer_0/k'): [4, 256, 1, 16],
        ('cache', 'layer_1/end_index'): [4],
    },
    '[8, 1]': {
        ('lora', 'layers/0/attn/q_einsum/w_lora_a'): [4, 4],
        ('lora', 'layers/0/mlp/down_proj/kernel_lora_b'): [4, 4],
        ('params', 'embedder/input_embedding'): [262144, 4],
        ('opt', 'mu/layers/0/attn/q_einsum/w_lora_a'): [4, 4],
        ('batch', 'advantages'): [1],
    },
    # 4 experts over fsdp; A's input side (D = 32) over tp like the
    # experts' D, B's output side unsplit like theirs; rank 4 whole.
    'moe[2, 2]': {
        ('params', 'layers/0/moe/gating_einsum'): [2, 2, 16, 16],
        ('lora', 'layers/0/moe/gating_einsum_lora_a'): [2, 16, 4],
        ('lora', 'layers/0/moe/gating_einsum_lora_b'): [2, 4, 2, 16],
        ('lora', 'layers/0/moe/linear_lora_a'): [2, 8, 4],
        ('lora', 'layers/0/moe/linear_lora_b'): [2, 4, 32],
        ('opt', 'mu/layers/0/moe/linear_lora_a'): [2, 8, 4],
    },
}


@pytest.mark.parametrize('mesh', _SHARDED)
def test_arrays_are_really_sharded(meshes, mesh):
  got = meshes[mesh]
  for (group, name), shard in _EXPECTED_SHARDS[mesh].items():
    matches = [e for n, e in got[group].items()
               if n == name or n.endswith('/' + name)]
    assert matches, f'no {group} array {name}; have {sorted(got[group])}'
    assert matches[0]['shard'] == shard, (mesh, group, name, matches[0])
  split = [n for n, e in got['lora'].items() if e['shard'] != e['shape']]
  assert len(split) >= len(got['lora']) // 2, split


@pytest.mark.parametrize('mesh', _SHARDED)
def test_log_prob_passes_never_gather_the_embedding_table(meshes, mesh):
  # The projection runs split along V (logprobs.vocab_parallel): the
  # chunks gather hidden states, not the table (which XLA gathered once per
  # chunk when the table was split along D).
  assert meshes[mesh]['table_gathers'] == [], meshes[mesh]['table_gathers']


# ------------------------------------------------------ in-process helpers


def test_fit_spec_keeps_only_dividing_axes():
  mesh = jax.sharding.AbstractMesh((2, 4), ('fsdp', 'tp'))
  p = jax.sharding.PartitionSpec
  assert sharding.fit_spec(mesh, (8, 2, 12), (('data', 'fsdp'), 'tp', 'tp')
                           ) == p('fsdp', None, 'tp')
  assert sharding.fit_spec(mesh, (8, 3), (('fsdp', 'tp'),)) == p(
      ('fsdp', 'tp'), None)
  assert sharding.fit_spec(mesh, (6,), (('fsdp', 'tp'),)) == p('fsdp')
  assert sharding.batch_sharding(mesh, 2, rows=3).spec == p(None, None)
  with_data = jax.sharding.AbstractMesh((2, 2, 1), ('data', 'fsdp', 'tp'))
  assert sharding.batch_sharding(with_data, 2).spec == p(('data', 'fsdp'),
                                                         None)
  assert sharding.batch_sharding(with_data, 1, rows=2).spec == p('data')
  assert sharding.kv_cache_sharding(mesh, (4, 16, 4, 8)).spec == p(
      'fsdp', None, 'tp', None)
  assert sharding.kv_cache_sharding(mesh, (4, 16, 1, 8)).spec == p(
      'fsdp', None, None, None)


def _fake_processes(monkeypatch, index, count, locals_by_process):
  """Pretends to be process `index` of `count` for the row helpers."""
  monkeypatch.setattr(jax, 'process_index', lambda: index)
  monkeypatch.setattr(jax, 'process_count', lambda: count)

  def allgather(x, tiled=False):
    parts = [np.asarray(locals_by_process[p]) for p in range(count)]
    np.testing.assert_array_equal(parts[index], x)
    return np.concatenate(parts) if tiled else np.stack(parts)
  monkeypatch.setattr(multihost_utils, 'process_allgather', allgather)


@pytest.mark.parametrize('count', [1, 2, 4])
def test_gathered_rows_are_the_stream_and_own_rows_find_the_local_ones(
    monkeypatch, count):
  stream = np.arange(8 * 3).reshape(8, 3)  # One global batch of 8 prompts.
  # The pipeline's split: process p reads positions p, p + P, ...
  local = {p: stream[p::count] for p in range(count)}
  g = 2
  for p in range(count):
    _fake_processes(monkeypatch, p, count, local)
    gathered = sharding.gather_rows(local[p])
    np.testing.assert_array_equal(gathered, stream)
    own = sharding.own_rows(len(gathered), g)
    np.testing.assert_array_equal(
        np.repeat(gathered, g, axis=0)[own], np.repeat(local[p], g, axis=0))


def test_allgather_concat_keeps_process_order(monkeypatch):
  parts = {0: np.array([1.0, 2.0]), 1: np.array([3.0, 4.0])}
  _fake_processes(monkeypatch, 1, 2, parts)
  out = sharding.allgather_concat({'r': parts[1]})
  np.testing.assert_array_equal(out['r'], [1.0, 2.0, 3.0, 4.0])


def test_initialize_distributed_failure_names_the_fix(monkeypatch):
  def fail(**kwargs):
    raise ValueError(f'no coordinator ({sorted(kwargs)})')
  monkeypatch.setattr(jax.distributed, 'initialize', fail)
  with pytest.raises(RuntimeError) as e:
    sharding.initialize_distributed('10.0.0.1:1234', 2, 1)
  message = str(e.value)
  assert "'coordinator_address': '10.0.0.1:1234'" in message
  assert 'no coordinator' in message
  assert '--coordinator_address=HOST:PORT' in message
  assert 'drop --multihost' in message
  with pytest.raises(RuntimeError, match=r'initialize\(\) failed'):
    sharding.initialize_distributed()


def test_coordinator_stops_its_service_after_everyone_left(monkeypatch):
  # Process 0 holds the coordination service: jax.distributed.shutdown()
  # (the shutdown barrier, with the service detached) comes first, then a
  # pause, then the service. Elsewhere there is no service to stop.
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  events = []

  class Service:
    def shutdown(self):
      events.append('service')

  def barrier():
    events.append(('barrier', distributed.global_state.service))

  monkeypatch.setattr(jax.distributed, 'shutdown', barrier)
  monkeypatch.setattr(sharding.time, 'sleep',
                      lambda s: events.append(('sleep', s)))
  monkeypatch.setattr(distributed.global_state, 'service', Service())
  sharding.shutdown_distributed()
  assert events == [('barrier', None), ('sleep', sharding._SERVICE_GRACE_S),
                    'service']
  assert distributed.global_state.service is None
  events.clear()
  sharding.shutdown_distributed()
  assert events == [('barrier', None)]


def test_multi_process_mesh_must_use_every_device(monkeypatch):
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  cfg = type('Mesh', (), {'shape': (1, 1), 'axis_names': ('fsdp', 'tp')})
  with pytest.raises(ValueError, match='must use all devices'):
    sharding.make_mesh(cfg, devices=jax.devices() * 2)


def test_replicate_unplaced_puts_loose_arrays_on_the_mesh():
  mesh = jax.make_mesh((1, 1), ('fsdp', 'tp'))
  placed = jax.device_put(np.ones((2, 2)), jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec('fsdp')))
  loose = jax.numpy.zeros(())
  out = sharding.replicate_unplaced({'a': placed, 'b': loose, 'c': 3}, mesh)
  assert out['a'] is placed
  assert out['b'].sharding == sharding.replicated(mesh)
  assert out['c'] == 3
