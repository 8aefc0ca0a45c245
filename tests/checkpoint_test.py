"""Tests for agent_tunix.run.checkpoint (jax on CPU, tiny models)."""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import asyncio  # pylint: disable=g-import-not-at-top
import gc
import logging
import pathlib
import signal
import subprocess
import sys
import textwrap
import time
import types
from unittest import mock

from flax import nnx
import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import qwix
from tunix.models.gemma3 import model as gemma3_lib

from agent_tunix.run import checkpoint
from agent_tunix.run import preemption


class TinyLora(nnx.Module):
  """Two LoRA-adapted linear layers (nnx.LoRAParam leaves)."""

  def __init__(self, seed=0, rank=2, width=8):
    rngs = nnx.Rngs(seed)
    self.first = nnx.LoRA(4, rank, width,
                          base_module=nnx.Linear(4, width, rngs=rngs),
                          rngs=rngs)
    self.layers = nnx.List([nnx.LoRA(width, rank, 3, rngs=rngs)])

  def __call__(self, x):
    return self.layers[0](self.first(x))


def _randomize(model, optimizer, seed):
  """Gives every LoRA and optimizer array distinct values (NumPy, no jit)."""
  rng = np.random.default_rng(seed)

  def fill(x):
    if np.issubdtype(x.dtype, np.integer):
      return jnp.full(x.shape, rng.integers(1, 1000), x.dtype)
    return jnp.asarray(rng.normal(size=x.shape), x.dtype)

  nnx.update(model, jax.tree.map(fill, checkpoint.lora_state(model)))
  nnx.update(optimizer, jax.tree.map(fill,
                                     checkpoint.optimizer_state(optimizer)))


def _make(seed=0, rank=2, width=8):
  model = TinyLora(seed, rank, width)
  optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.LoRAParam)
  _randomize(model, optimizer, seed)
  return model, optimizer


def _data_iter():
  return iter(grain.MapDataset.range(40).batch(2).to_iter_dataset())


def _config(interval=1, keep=5, async_save=False):
  return ml_collections.ConfigDict(
      dict(save_interval_steps=interval, max_to_keep=keep,
           async_save=async_save)
  )


def _pure(state):
  return nnx.to_pure_dict(state)


def _assert_trees_equal(a, b):
  a_leaves, a_def = jax.tree.flatten(a)
  b_leaves, b_def = jax.tree.flatten(b)
  assert a_def == b_def
  for x, y in zip(a_leaves, b_leaves):
    assert np.asarray(x).dtype == np.asarray(y).dtype
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _save(ckpt, step, model, optimizer, it, force=False, **meta):
  return ckpt.save(step, checkpoint.lora_state(model),
                   checkpoint.optimizer_state(optimizer), it, meta,
                   force=force)


def _save_steps(workdir, steps, model=None, optimizer=None):
  """Saves the given steps synchronously; returns (model, optimizer)."""
  if model is None:
    model, optimizer = _make()
  ckpt = checkpoint.Checkpointer(workdir, _config())
  it = _data_iter()
  for step in steps:
    next(it)
    assert _save(ckpt, step, model, optimizer, it)
  ckpt.close()
  return model, optimizer


def _step_dir(workdir, step):
  return pathlib.Path(workdir) / 'checkpoints' / str(step)


def _truncate_manifest(workdir, step):
  path = _step_dir(workdir, step) / 'lora' / 'manifest.ocdbt'
  path.write_bytes(path.read_bytes()[:20])


def test_restore_without_checkpoint_returns_none(tmp_path):
  model, optimizer = _make()
  ckpt = checkpoint.Checkpointer(str(tmp_path), _config())
  assert ckpt.latest_step() is None
  assert ckpt.all_steps() == []
  assert ckpt.restore(checkpoint.lora_state(model),
                      checkpoint.optimizer_state(optimizer)) is None
  assert ckpt.restore_into(model, optimizer) is None
  ckpt.close()


def _tiny_gemma_with_lora():
  """A 1-layer tunix Gemma 3 with qwix LoRA, built under jit (faster)."""
  cfg = gemma3_lib.ModelConfig(
      num_layers=1, num_embed=64, embed_dim=16, hidden_dim=32, num_heads=2,
      head_dim=8, num_kv_heads=1, sliding_window_size=8,
      param_dtype=jnp.float32,
  )
  provider = qwix.LoraProvider(
      module_path='.*q_einsum|.*gate_proj', rank=2, alpha=4.0
  )

  @nnx.jit
  def build():
    model = gemma3_lib.Gemma3(cfg, rngs=nnx.Rngs(0))
    return qwix.apply_lora_to_model(
        model, provider, **model.get_model_input(), rngs=nnx.Rngs(1)
    )

  return build()


def test_roundtrip_gemma_lora_async(tmp_path):
  model = _tiny_gemma_with_lora()
  optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.LoRAParam)
  _randomize(model, optimizer, seed=1)
  lora = _pure(checkpoint.lora_state(model))
  opt = _pure(checkpoint.optimizer_state(optimizer))
  assert 'q_einsum' in str(lora) and 'gate_proj' in str(lora)
  it = _data_iter()
  for _ in range(3):
    next(it)
  ckpt = checkpoint.Checkpointer(str(tmp_path), _config(async_save=True))
  assert ckpt.save(3, checkpoint.lora_state(model),
                   checkpoint.optimizer_state(optimizer), it,
                   {'rng_seed': np.int64(42), 'dropped': 2})
  # save() captured the arrays and the data position; moving on is harmless.
  _randomize(model, optimizer, seed=2)
  next(it)
  ckpt.wait()
  ckpt.close()
  assert (_step_dir(tmp_path, 3) / 'commit_success.txt').exists()

  # Restore into the (changed) model and optimizer, and a fresh iterator.
  it2 = _data_iter()
  ckpt2 = checkpoint.Checkpointer(str(tmp_path), _config())
  assert ckpt2.latest_step() == 3
  meta, step = ckpt2.restore_into(model, optimizer, it2)
  assert step == 3
  assert meta == {'rng_seed': 42, 'dropped': 2, 'step': 3}
  _assert_trees_equal(_pure(checkpoint.lora_state(model)), lora)
  _assert_trees_equal(_pure(checkpoint.optimizer_state(optimizer)), opt)
  assert int(optimizer.step[...]) == int(opt['step'])
  np.testing.assert_array_equal(next(it2), [6, 7])
  ckpt2.close()


def test_restore_returns_states_and_keeps_target_and_sharding(tmp_path):
  model, optimizer = _save_steps(str(tmp_path), [1])
  mesh = jax.make_mesh((1,), ('x',))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  fresh, fresh_opt = _make(seed=3)
  target = jax.tree.map(lambda x: jax.device_put(x, replicated),
                        checkpoint.lora_state(fresh))
  before = _pure(target)
  ckpt = checkpoint.Checkpointer(str(tmp_path), _config())
  restored = ckpt.restore(target, _pure(checkpoint.optimizer_state(
      fresh_opt)))
  assert restored.step == 1 and restored.meta == {'step': 1}
  assert isinstance(restored.lora_state, nnx.State)
  assert isinstance(restored.opt_state, dict)
  _assert_trees_equal(_pure(restored.lora_state),
                      _pure(checkpoint.lora_state(model)))
  _assert_trees_equal(restored.opt_state,
                      _pure(checkpoint.optimizer_state(optimizer)))
  _assert_trees_equal(_pure(target), before)  # The target is not modified.
  for leaf in jax.tree.leaves(_pure(restored.lora_state)):
    assert leaf.sharding == replicated
  ckpt.close()


def test_save_interval_max_to_keep_and_force(tmp_path):
  model, optimizer = _make()
  ckpt = checkpoint.Checkpointer(str(tmp_path), _config(interval=2, keep=2))
  it = _data_iter()
  saved = [_save(ckpt, step, model, optimizer, it) for step in range(1, 8)]
  assert saved == [False, True, False, True, False, True, False]
  assert _save(ckpt, 7, model, optimizer, it, force=True)
  # Forcing a step this Checkpointer just saved is a quiet no-op.
  with mock.patch.object(checkpoint.logging, 'warning') as warning:
    assert not _save(ckpt, 6, model, optimizer, it, force=True)
  warning.assert_not_called()
  ckpt.wait()
  assert ckpt.all_steps() == [6, 7]
  assert sorted(p.name for p in (tmp_path / 'checkpoints').iterdir()
                if p.name.isdigit()) == ['6', '7']
  ckpt.close()


def test_zero_interval_saves_only_when_forced(tmp_path):
  model, optimizer = _make()
  ckpt = checkpoint.Checkpointer(str(tmp_path), _config(interval=0))
  it = _data_iter()
  assert not any(_save(ckpt, s, model, optimizer, it) for s in range(1, 5))
  assert _save(ckpt, 5, model, optimizer, it, force=True)
  assert ckpt.all_steps() == [5]
  ckpt.close()


def test_existing_step_is_not_overwritten(tmp_path, caplog):
  model, optimizer = _save_steps(str(tmp_path), [2])
  meta_file = _step_dir(tmp_path, 2) / 'meta' / 'metadata'
  before = meta_file.read_bytes()
  ckpt = checkpoint.Checkpointer(str(tmp_path), _config())
  assert not _save(ckpt, 2, model, optimizer, _data_iter(), force=True,
                   marker=1)
  assert 'already exists' in caplog.text
  assert meta_file.read_bytes() == before
  ckpt.close()


def test_damaged_latest_falls_back_and_later_saves_work(tmp_path, caplog):
  workdir = str(tmp_path)
  model, optimizer = _make()
  ckpt = checkpoint.Checkpointer(workdir, _config())
  it = _data_iter()
  snapshots = {}
  for step in (1, 2, 3, 4):
    _randomize(model, optimizer, step)
    next(it)
    snapshots[step] = _pure(checkpoint.lora_state(model))
    if step != 3:
      _save(ckpt, step, model, optimizer, it)
  ckpt.close()
  _truncate_manifest(workdir, 4)

  fresh, fresh_opt = _make(seed=9)
  it2 = _data_iter()
  ckpt = checkpoint.Checkpointer(workdir, _config())
  assert ckpt.restore_into(fresh, fresh_opt, it2) == ({'step': 2}, 2)
  _assert_trees_equal(_pure(checkpoint.lora_state(fresh)), snapshots[2])
  np.testing.assert_array_equal(next(it2), [4, 5])
  assert 'step 4' in caplog.text and 'could not be restored' in caplog.text
  assert list(ckpt.failed_steps) == [4]
  assert 'DATA_LOSS' in ckpt.failed_steps[4] or 'manifest' in (
      ckpt.failed_steps[4])
  # The damaged step stays on disk; it is neither rewritten nor deleted.
  assert _step_dir(workdir, 4).is_dir()
  assert ckpt.latest_step() == 4
  # Training goes on from step 2: step 3 is below the damaged step, so only
  # a forced save writes it; step 4 is never overwritten; step 5 saves.
  assert not _save(ckpt, 3, fresh, fresh_opt, it2)
  assert _save(ckpt, 3, fresh, fresh_opt, it2, force=True)
  assert not _save(ckpt, 4, fresh, fresh_opt, it2, force=True)
  assert 'already exists' in caplog.text
  assert _save(ckpt, 5, fresh, fresh_opt, it2)
  ckpt.close()
  assert sorted(int(p.name) for p in (tmp_path / 'checkpoints').iterdir()
                if p.name.isdigit()) == [1, 2, 3, 4, 5]
  ckpt = checkpoint.Checkpointer(workdir, _config())
  assert ckpt.all_steps() == [1, 2, 3, 4, 5]
  assert ckpt.restore_into(*_make())[1] == 5
  _truncate_manifest(workdir, 5)
  assert ckpt.restore_into(*_make())[1] == 3
  assert list(ckpt.failed_steps) == [5, 4]
  ckpt.close()


@pytest.mark.parametrize('damage', ['flip_data', 'truncate_meta',
                                    'remove_data_item'])
def test_damage_kinds_are_detected(tmp_path, damage):
  workdir = str(tmp_path)
  # Wide enough that the LoRA arrays live in their own data file.
  model, optimizer = _make(rank=8, width=64)
  _save_steps(workdir, [1, 2], model, optimizer)
  step_dir = _step_dir(workdir, 2)
  if damage == 'flip_data':
    # Orbax reads flipped bytes back silently; the stored checksum catches it.
    files = [p for p in (step_dir / 'lora').rglob('*') if p.is_file()]
    largest = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(largest.read_bytes())
    assert len(data) > 2048, largest
    middle = len(data) // 2
    data[middle:middle + 16] = bytes(b ^ 0xFF for b in data[middle:middle + 16])
    largest.write_bytes(bytes(data))
  elif damage == 'truncate_meta':
    path = step_dir / 'meta' / 'metadata'
    path.write_bytes(path.read_bytes()[:5])
  else:
    for path in sorted((step_dir / 'data').rglob('*'), reverse=True):
      path.unlink() if path.is_file() else path.rmdir()
    (step_dir / 'data').rmdir()
  fresh, fresh_opt = _make(rank=8, width=64, seed=4)
  ckpt = checkpoint.Checkpointer(workdir, _config())
  assert ckpt.restore_into(fresh, fresh_opt, _data_iter())[1] == 1
  assert list(ckpt.failed_steps) == [2]
  ckpt.close()


def test_all_damaged_raises_with_every_failure(tmp_path):
  workdir = str(tmp_path)
  _save_steps(workdir, [1, 2])
  _truncate_manifest(workdir, 1)
  _truncate_manifest(workdir, 2)
  ckpt = checkpoint.Checkpointer(workdir, _config())
  with pytest.raises(checkpoint.RestoreError) as e:
    ckpt.restore_into(*_make(), _data_iter())
  assert 'step 2:' in str(e.value) and 'step 1:' in str(e.value)
  assert _step_dir(workdir, 1).is_dir() and _step_dir(workdir, 2).is_dir()
  ckpt.close()


def test_mismatched_model_names_shapes(tmp_path):
  _save_steps(str(tmp_path), [1])
  other = TinyLora(rank=3)
  ckpt = checkpoint.Checkpointer(str(tmp_path), _config())
  with pytest.raises(checkpoint.RestoreError, match=r'step 1:.*shape'):
    ckpt.restore_into(other)
  ckpt.close()


def test_restore_named_step_and_lora_only(tmp_path):
  model, _ = _save_steps(str(tmp_path), [1, 2])
  ckpt = checkpoint.Checkpointer(str(tmp_path), _config())
  restored = ckpt.restore(checkpoint.lora_state(TinyLora(seed=7)), step=1)
  assert restored.step == 1 and restored.opt_state is None
  with pytest.raises(checkpoint.RestoreError, match='step 5'):
    ckpt.restore(checkpoint.lora_state(model), step=5)
  ckpt.close()


def test_read_only_restores_creates_nothing_and_warns_nothing(tmp_path,
                                                             caplog):
  _save_steps(str(tmp_path), [1, 2])
  before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob('*'))
  ckpt = checkpoint.Checkpointer(str(tmp_path), _config(), read_only=True)
  assert ckpt.restore(checkpoint.lora_state(TinyLora(seed=7))).step == 2
  ckpt.close()
  assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob('*')) == before
  assert 'read_only=True, setting' not in caplog.text
  ckpt = checkpoint.Checkpointer(str(tmp_path / 'none'), _config(),
                                 read_only=True)
  assert ckpt.restore({}) is None
  ckpt.close()
  assert not (tmp_path / 'none').exists()


def test_reserved_meta_key_and_bad_config(tmp_path):
  model, optimizer = _make()
  ckpt = checkpoint.Checkpointer(str(tmp_path), _config())
  with pytest.raises(ValueError, match='reserved'):
    _save(ckpt, 1, model, optimizer, _data_iter(), checksums=1)
  ckpt.close()
  with pytest.raises(ValueError, match='max_to_keep'):
    checkpoint.Checkpointer(str(tmp_path), _config(keep=0))
  with pytest.raises(ValueError, match='save_interval_steps'):
    checkpoint.Checkpointer(str(tmp_path), _config(interval=-1))


def test_checksum_sees_every_leaf_and_dtype():
  tree = {'a': jnp.arange(6, dtype=jnp.float32).reshape(2, 3),
          'b': jnp.array(3, jnp.uint32),
          'c': jnp.ones((4,), jnp.bfloat16),
          'd': np.array([True, False])}
  base = checkpoint.checksum(tree)
  assert base == checkpoint.checksum(jax.tree.map(np.asarray, tree))
  for key, changed in (('a', tree['a'].at[1, 2].set(-0.0)),
                       ('b', jnp.array(4, jnp.uint32)),
                       ('c', tree['c'].at[0].set(2)),
                       ('d', np.array([True, True]))):
    assert checkpoint.checksum({**tree, key: changed}) != base, key
  # Moving elements within a leaf, or swapping two leaves, changes it too.
  assert checkpoint.checksum({**tree, 'a': tree['a'][::-1]}) != base
  pair = {'x': jnp.zeros(3), 'y': jnp.ones(3)}
  assert checkpoint.checksum(pair) != checkpoint.checksum(
      {'x': pair['y'], 'y': pair['x']})


def test_install_sigterm_handler_returns_previous():
  calls = []
  handler = lambda signum, frame: calls.append(signum)
  previous = preemption.install_sigterm_handler(handler)
  try:
    assert signal.getsignal(signal.SIGTERM) is handler
    os.kill(os.getpid(), signal.SIGTERM)
    assert calls == [signal.SIGTERM]
  finally:
    assert preemption.install_sigterm_handler(previous) is handler
  assert signal.getsignal(signal.SIGTERM) is previous


def test_preemption_guard_sets_flag_and_restores_handler():
  before = signal.getsignal(signal.SIGTERM)
  with preemption.PreemptionGuard() as guard:
    assert not guard.use_jax_sync  # No jax.distributed in tests.
    assert not guard.requested() and not guard.should_stop(1)
    os.kill(os.getpid(), signal.SIGTERM)  # Would kill pytest if unhandled.
    assert guard.requested()
    assert guard.should_stop(2)
  assert signal.getsignal(signal.SIGTERM) is before


def test_sigint_is_handled_like_sigterm_and_a_second_one_interrupts():
  # Python's own SIGINT handler underneath, as in an interactive run
  # (pytest-xdist workers ignore SIGINT).
  outer = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    with preemption.PreemptionGuard() as guard:
      os.kill(os.getpid(), signal.SIGINT)
      assert guard.requested() and guard.should_stop(3)
      assert guard.signal_name == 'SIGINT'
      with pytest.raises(KeyboardInterrupt):  # The previous handler.
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # The handler runs between bytecodes.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  finally:
    signal.signal(signal.SIGINT, outer)


def test_second_sigterm_goes_to_previous_handler():
  calls = []
  handler = lambda signum, frame: calls.append(signum)
  previous = preemption.install_sigterm_handler(handler)
  try:
    guard = preemption.PreemptionGuard().install()
    os.kill(os.getpid(), signal.SIGTERM)
    assert guard.requested() and calls == []
    os.kill(os.getpid(), signal.SIGTERM)
    assert calls == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is handler  # Put back.
  finally:
    signal.signal(signal.SIGTERM, previous)


_SHARDED_SCRIPT = textwrap.dedent("""
    import sys
    import grain, jax, numpy as np, ml_collections
    from jax.sharding import NamedSharding, PartitionSpec as P
    from agent_tunix.run import checkpoint

    def data_iter():
      return iter(grain.MapDataset.range(10).to_iter_dataset())

    mesh = jax.make_mesh((4,), ('x',))
    mesh2 = jax.make_mesh((2, 2), ('a', 'b'))
    value = np.arange(64, dtype=np.float32).reshape(8, 8)
    tree = {'w': jax.device_put(value, NamedSharding(mesh, P('x')))}
    cfg = ml_collections.ConfigDict(
        dict(save_interval_steps=1, max_to_keep=2, async_save=True))
    ckpt = checkpoint.Checkpointer(sys.argv[1], cfg)
    it = data_iter()
    next(it)
    opt = {'n': jax.device_put(value[0], NamedSharding(mesh, P()))}
    assert ckpt.save(1, tree, opt, it, {})
    ckpt.close()
    target_sharding = NamedSharding(mesh2, P('b', 'a'))
    target = {'w': jax.device_put(np.zeros((8, 8), np.float32),
                                  target_sharding)}
    opt_target = {'n': jax.device_put(np.zeros(8, np.float32),
                                      NamedSharding(mesh2, P()))}
    ckpt = checkpoint.Checkpointer(sys.argv[1], cfg)
    it = data_iter()
    restored = ckpt.restore(target, opt_target, it)
    assert restored.lora_state['w'].sharding == target_sharding
    np.testing.assert_array_equal(np.asarray(restored.lora_state['w']), value)
    np.testing.assert_array_equal(np.asarray(restored.opt_state['n']),
                                  value[0])
    assert next(it) == 1
    print('SHARDED_OK')
""")


def test_sharded_save_restores_into_other_sharding(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=4')
  root = pathlib.Path(__file__).resolve().parents[1]
  result = subprocess.run(
      [sys.executable, '-c', _SHARDED_SCRIPT, str(tmp_path)], env=env,
      cwd=root, capture_output=True, text=True, timeout=300, check=False,
  )
  assert 'SHARDED_OK' in result.stdout, result.stderr[-3000:]


_ABANDONED_READS_SCRIPT = textwrap.dedent("""
    import pathlib, sys
    import grain, jax, numpy as np, ml_collections
    from agent_tunix.run import checkpoint

    def tree(seed):
      rng = np.random.default_rng(seed)
      return {f'w{i}': jax.numpy.asarray(rng.normal(size=(64, 8)), 'float32')
              for i in range(32)}

    def data_iter():
      return iter(grain.MapDataset.range(10).to_iter_dataset())

    cfg = ml_collections.ConfigDict(
        dict(save_interval_steps=1, max_to_keep=5, async_save=False))
    ckpt = checkpoint.Checkpointer(sys.argv[1], cfg)
    it = data_iter()
    for step in (1, 2):
      next(it)
      assert ckpt.save(step, tree(step), {'n': np.zeros(2)}, it, {})
    ckpt.close()
    lora = pathlib.Path(sys.argv[1]) / 'checkpoints' / '2' / 'lora'
    # OCDBT spreads the 64 KiB of arrays over a varying number of data
    # files: cut every one of them short, so that many reads fail.
    data = [p for p in lora.rglob('*')
            if p.is_file() and p.parent.name == 'd' and p.stat().st_size > 1000]
    assert sum(p.stat().st_size for p in data) > 60000, data
    for p in data:
      p.write_bytes(p.read_bytes()[:100])
    ckpt = checkpoint.Checkpointer(sys.argv[1], cfg)
    restored = ckpt.restore(tree(0), {'n': np.zeros(2)}, data_iter())
    assert restored.step == 1 and list(ckpt.failed_steps) == [2]
    ckpt.close()
    print('RESTORED', restored.step)
""")


def test_failed_restore_prints_no_tracebacks(tmp_path):
  # The 32 reads of step 2 are in flight when one fails; without the hook,
  # the rest print ~50 'Event loop is closed' / 'Exception ignored in:
  # <coroutine ...>' tracebacks.
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  root = pathlib.Path(__file__).resolve().parents[1]
  result = subprocess.run(
      [sys.executable, '-c', _ABANDONED_READS_SCRIPT, str(tmp_path)], env=env,
      cwd=root, capture_output=True, text=True, timeout=300, check=False,
  )
  output = result.stdout + result.stderr
  assert 'RESTORED 1' in result.stdout, output[-3000:]
  assert 'Checkpoint step 2' in output and 'could not be restored' in output
  for noise in ('Event loop is closed', 'Traceback', 'Exception ignored'):
    assert noise not in output, output[-3000:]


def _unraisable(error, obj=None):
  """Like sys.UnraisableHookArgs, for `error` raised here (with traceback)."""
  try:
    raise error
  except type(error) as e:
    return types.SimpleNamespace(exc_type=type(e), exc_value=e,
                                 exc_traceback=e.__traceback__, err_msg=None,
                                 object=obj)


def test_abandoned_read_hook_passes_other_errors_on(monkeypatch):
  seen = []
  monkeypatch.setattr(sys, 'unraisablehook', seen.append)
  checkpoint.quiet_abandoned_reads()
  hook = sys.unraisablehook
  checkpoint.quiet_abandoned_reads()
  assert sys.unraisablehook is hook  # Installed once, not wrapped again.
  # Raised by our code, not by the loop's call_soon_threadsafe: kept.
  closed = _unraisable(RuntimeError('Event loop is closed'))
  hook(closed)

  async def not_orbax():
    pass

  coroutine = not_orbax()
  other = _unraisable(ValueError('x'), obj=coroutine)
  hook(other)
  coroutine.close()
  assert seen == [closed, other]
  # What a TensorStore callback into a closed loop raises: dropped.
  loop = asyncio.new_event_loop()
  loop.close()
  try:
    loop.call_soon_threadsafe(print)
  except RuntimeError as e:
    hook(types.SimpleNamespace(exc_type=RuntimeError, exc_value=e,
                               exc_traceback=e.__traceback__.tb_next,
                               err_msg=None, object=None))
  assert seen == [closed, other]


def _leave_exception_unread(read, gather=False):
  """Runs `read()` to its exception, in a task or in a gather; no one reads it.

  Args:
    read: An async function that raises.
    gather: Wrap the task in asyncio.gather: then the gather's future, not
      the task, holds the unread exception.
  """
  loop = asyncio.new_event_loop()

  async def start():
    task = asyncio.ensure_future(read())
    return asyncio.gather(task) if gather else task

  future = loop.run_until_complete(start())
  loop.run_until_complete(asyncio.sleep(0.01))
  assert future.done()
  loop.close()
  del future
  # Its __del__ logs 'Task exception was never retrieved' (or
  # '_GatheringFuture exception ...').
  gc.collect()


def test_unread_exceptions_of_abandoned_reads_are_not_logged(caplog):
  checkpoint.quiet_abandoned_reads()
  checkpoint.quiet_abandoned_reads()
  asyncio_logger = logging.getLogger('asyncio')
  assert sum(getattr(f, 'drops_abandoned_reads', False)
             for f in asyncio_logger.filters) == 1  # Installed once.

  async def orbax_read():
    raise ValueError('read cut short')

  # A frame in Orbax's reading code, as in a real abandoned read.
  orbax_read.__code__ = orbax_read.__code__.replace(
      co_filename='/venv/lib/python3.11/site-packages/orbax/checkpoint/'
      '_src/serialization/serialization.py')

  async def other_read():
    raise ValueError('some other failure')

  with caplog.at_level(logging.ERROR, logger='asyncio'):
    _leave_exception_unread(orbax_read)
    _leave_exception_unread(orbax_read, gather=True)
    _leave_exception_unread(other_read)
    _leave_exception_unread(other_read, gather=True)
  # The other read's errors are still logged, with their tracebacks.
  assert sorted(r.getMessage().split('\n')[0] for r in caplog.records) == [
      'Task exception was never retrieved',
      '_GatheringFuture exception was never retrieved']
  assert all('some other failure' in str(r.exc_info[1])
             for r in caplog.records)
  assert 'Traceback' in caplog.text
  assert 'read cut short' not in caplog.text


def test_leaving_on_an_error_finishes_the_background_write(tmp_path):
  # A process exiting on an error does not wait for Orbax's background
  # thread; `with ckpt:` does, so no '1.orbax-checkpoint-tmp' is left.
  ckpt = checkpoint.Checkpointer(str(tmp_path), _config(async_save=True))
  tree = {'w': jnp.ones((2048, 2048), jnp.float32)}  # 16 MB: a slow write.
  with pytest.raises(KeyError):
    with ckpt:
      assert ckpt.save(1, tree, {'n': jnp.zeros(2)}, _data_iter(), {})
      raise KeyError('a reward function failed')
  assert [p.name for p in (tmp_path / 'checkpoints').iterdir()] == ['1']
  ckpt.close()  # A second close does nothing.
  ckpt = checkpoint.Checkpointer(str(tmp_path), _config())
  restored = ckpt.restore({'w': jnp.zeros((2048, 2048), jnp.float32)})
  np.testing.assert_array_equal(np.asarray(restored.lora_state['w']), 1.0)
  ckpt.close()


def test_damaged_steps_set_aside_and_saved_anew(tmp_path, caplog):
  workdir = str(tmp_path)
  model, optimizer = _save_steps(workdir, [1, 2, 3])
  _truncate_manifest(workdir, 3)
  damaged = {p.relative_to(_step_dir(workdir, 3)): p.read_bytes()
             for p in _step_dir(workdir, 3).rglob('*') if p.is_file()}
  ckpt = checkpoint.Checkpointer(workdir, _config())
  assert ckpt.restore_into(*_make(), _data_iter())[1] == 2
  moved = ckpt.set_aside_damaged()
  assert list(moved) == [3]
  aside = pathlib.Path(str(moved[3]))
  assert aside.parent == tmp_path / 'checkpoints'
  assert aside.name.startswith('damaged-step-3-')
  # Moved byte for byte, said in one line, out of Orbax's steps.
  assert {p.relative_to(aside): p.read_bytes() for p in aside.rglob('*')
          if p.is_file()} == damaged
  assert 'moved aside to' in caplog.text and str(aside) in caplog.text
  assert ckpt.all_steps() == [1, 2]
  # The rerun's step 3 (periodic, not forced) is saved and restores.
  it = _data_iter()
  next(it)
  assert _save(ckpt, 3, model, optimizer, it)
  ckpt.close()
  ckpt = checkpoint.Checkpointer(workdir, _config())
  assert ckpt.restore_into(*_make(), _data_iter())[1] == 3
  assert ckpt.set_aside_damaged() == {}
  ckpt.close()


def test_on_gcs_a_step_whose_objects_vanish_is_set_aside(tmp_path, caplog):
  """gs://: objects of the newest step deleted by someone else under a
  running job (a lifecycle rule, a stray `gcloud storage rm`): the next
  start restores the step before, moves the damaged one aside on the
  bucket, and saves that step number anew."""
  import gcs_emulator  # pylint: disable=g-import-not-at-top
  from agent_tunix import storage  # pylint: disable=g-import-not-at-top
  with gcs_emulator.emulator('agent-tunix-ckpt') as gcs, mock.patch.dict(
      os.environ, gcs.env):
    workdir = f'gs://{gcs.bucket}/run'
    model, optimizer = _save_steps(workdir, [1, 2, 3])
    lora = [n for n in gcs.list('run/checkpoints/3/lora/')]
    assert lora, gcs.list('run/checkpoints/3/')
    for name in lora:
      gcs.delete(name)
    ckpt = checkpoint.Checkpointer(workdir, _config())
    assert ckpt.restore_into(*_make(), _data_iter())[1] == 2
    assert list(ckpt.failed_steps) == [3]
    moved = ckpt.set_aside_damaged()
    aside = str(moved[3])
    assert aside.startswith(f'{workdir}/checkpoints/damaged-step-3-'), aside
    assert 'moved aside to' in caplog.text
    assert not gcs.list('run/checkpoints/3/')
    kept = gcs.list(aside.removeprefix(f'gs://{gcs.bucket}/') + '/')
    assert any(n.endswith('/meta/metadata') for n in kept), kept
    assert ckpt.all_steps() == [1, 2]
    it = _data_iter()
    next(it)
    assert _save(ckpt, 3, model, optimizer, it)
    ckpt.close()
    assert storage.exists(f'{workdir}/checkpoints/3/commit_success.txt')
    ckpt = checkpoint.Checkpointer(workdir, _config())
    assert ckpt.restore_into(*_make(), _data_iter())[1] == 3
    ckpt.close()
