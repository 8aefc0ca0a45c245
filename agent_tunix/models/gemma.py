"""Builds a Gemma 3 or Gemma 4 policy (tunix NNX modules) from `config.model`.

Sources: 'gguf' (offline default), 'hf', 'kaggle', 'orbax', 'random'. Weights
are created directly sharded on the mesh: the module tree is built abstractly
with `nnx.eval_shape`, and every parameter array is assembled shard by shard
with `jax.make_array_from_callback`, so no host ever holds a replicated copy
on device.
"""

import dataclasses
import os
import re

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from tunix.models.gemma3 import model as model_lib

from agent_tunix import storage
from agent_tunix.models import gemma4 as gemma4_lib
from agent_tunix.models import gemma4_gguf
from agent_tunix.models import gguf as gguf_lib
from agent_tunix.models import tokenizer as tokenizer_lib

# Preset name -> tunix ModelConfig factory.
PRESETS = {
    'gemma3_270m': model_lib.ModelConfig.gemma3_270m,
    'gemma3_270m_it': model_lib.ModelConfig.gemma3_270m_it,
    'gemma3_1b_pt': model_lib.ModelConfig.gemma3_1b_pt,
    'gemma3_1b_it': model_lib.ModelConfig.gemma3_1b_it,
    'gemma3_4b_pt': model_lib.ModelConfig.gemma3_4b_pt,
    'gemma3_4b_it': model_lib.ModelConfig.gemma3_4b_it,
    'gemma3_12b_pt': model_lib.ModelConfig.gemma3_12b_pt,
    'gemma3_12b_it': model_lib.ModelConfig.gemma3_12b_it,
    'gemma3_27b_pt': model_lib.ModelConfig.gemma3_27b_pt,
    'gemma3_27b_it': model_lib.ModelConfig.gemma3_27b_it,
    'tiny': None,  # See tiny_config().
    **gemma4_lib.PRESETS,
    **{name: None for name in gemma4_lib.TINY_PRESETS},
}
SOURCES = ('gguf', 'hf', 'kaggle', 'orbax', 'random')
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
# The Gemma 3 vocabulary; the tiny model keeps it so the real tokenizer works.
VOCAB_SIZE = 262144


def tiny_config(**kwargs):
  """A 2-layer random Gemma 3 with the real vocabulary, for tests."""
  return model_lib.ModelConfig(
      num_layers=2,
      num_embed=VOCAB_SIZE,
      embed_dim=32,
      hidden_dim=64,
      num_heads=2,
      head_dim=16,
      num_kv_heads=1,
      sliding_window_size=16,
      global_base_frequency=1_000_000,
      **kwargs,
  )


def is_instruction_tuned(preset):
  return preset.endswith('_it')


def is_gemma4(preset):
  """Whether `config.model.preset` names a Gemma 4 architecture."""
  return preset.startswith(('gemma4_', 'tiny_gemma4'))


def model_config(model_cfg):
  """The tunix ModelConfig for `config.model` (preset and dtype).

  `config.model.remat` is not part of it: the loaded model serves the sampler
  too, so remat is switched on only inside the update (remat.apply_remat).
  """
  if model_cfg.preset not in PRESETS:
    raise ValueError(
        f'config.model.preset={model_cfg.preset!r} is unknown; choose one of '
        f'{sorted(PRESETS)}.'
    )
  if is_gemma4(model_cfg.preset):
    return gemma4_lib.model_config(model_cfg.preset, DTYPES[model_cfg.dtype])
  overrides = dict(param_dtype=DTYPES[model_cfg.dtype])
  if model_cfg.preset == 'tiny':
    return tiny_config(**overrides)
  return dataclasses.replace(PRESETS[model_cfg.preset](), **overrides)


def model_class(cfg):
  """The NNX model class of a tunix ModelConfig (Gemma 3 or Gemma 4)."""
  return gemma4_lib.Gemma4 if gemma4_lib.is_gemma4_config(cfg) else (
      model_lib.Gemma3)


def abstract_model(cfg):
  return nnx.eval_shape(lambda: model_class(cfg)(cfg, rngs=nnx.Rngs(0)))


def _flat_state(tree):
  """{dotted path: Variable} for the Params of a module or a State."""
  state = tree if isinstance(tree, nnx.State) else nnx.state(tree, nnx.Param)
  return {
      '.'.join(str(k) for k in path): var
      for path, var in nnx.to_flat_state(state)
  }


def place_params(cfg, flat, mesh, source_name):
  """Creates the model with `flat` {dotted path: array} sharded on `mesh`.

  Every parameter of the architecture must be present with the preset's
  shape; otherwise nothing is loaded and a ValueError names the source, the
  parameter, the expected and the found shape.
  """
  model = abstract_model(cfg)
  abstract = _flat_state(model)
  missing = sorted(set(abstract) - set(flat))
  extra = sorted(set(flat) - set(abstract))
  if missing or extra:
    raise ValueError(
        f'{source_name}: parameters do not match the preset. Missing: '
        f'{missing[:5]}{"..." if len(missing) > 5 else ""}; unexpected: '
        f'{extra[:5]}{"..." if len(extra) > 5 else ""}.'
    )
  for name, var in abstract.items():
    want = tuple(var.value.shape)
    found = tuple(np.shape(flat[name]))
    if want != found:
      raise ValueError(
          f'{source_name}: parameter {name!r} has shape {found}, the preset '
          f'expects {want}. Pick the config.model.preset matching the '
          'checkpoint.'
      )
  flat_shardings = _flat_state(
      nnx.get_named_sharding(nnx.state(model, nnx.Param), mesh)
  )
  dtype = cfg.param_dtype
  for name, var in abstract.items():
    host = np.asarray(flat[name])
    var.set_value(jax.make_array_from_callback(
        host.shape,
        flat_shardings[name].value,
        lambda idx, host=host: host[idx].astype(dtype),
    ))
  return model


def random_model(cfg, mesh, seed=0):
  """A randomly initialised model, created sharded under jit."""
  abstract = abstract_model(cfg)
  shardings = nnx.get_named_sharding(nnx.state(abstract), mesh)
  graphdef = nnx.graphdef(abstract)

  def init():
    model = model_class(cfg)(cfg, rngs=nnx.Rngs(seed))
    state = nnx.state(model)
    # Gemma's FFN kernels start at zero in tunix; give every weight a small
    # random value so a random model computes something non-trivial.
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    leaves = [
        (0.02 * jax.random.normal(k, x.shape)).astype(x.dtype)
        if x.ndim > 1 else x
        for k, x in zip(keys, leaves)
    ]
    return jax.tree.unflatten(treedef, leaves)

  state = jax.jit(init, out_shardings=shardings)()
  return nnx.merge(graphdef, state)


def resolve_path(model_cfg):
  """The weights path for the configured source ('' -> source default)."""
  if model_cfg.source == 'gguf' and not model_cfg.path:
    return gguf_lib.default_path()
  if model_cfg.source == 'gguf' and storage.is_remote(model_cfg.path):
    return storage.cached_copy(model_cfg.path, model_cfg.cache_dir)
  return model_cfg.path


def load_model(model_cfg, mesh):
  """Loads the frozen base model (no LoRA) described by `config.model`."""
  cfg = model_config(model_cfg)
  source = model_cfg.source
  path = resolve_path(model_cfg)
  if source == 'random':
    return random_model(cfg, mesh)
  if source == 'gguf':
    logging.info('Loading GGUF weights from %s', path)
    if gemma4_lib.is_gemma4_config(cfg):
      layers = gemma4_gguf.Layers(abstract_model(cfg))
      flat = gguf_lib.load_params_cached(
          path, cfg, model_cfg.cache_dir,
          check=lambda reader, file, c: gemma4_gguf.check_architecture(
              reader.metadata, file, c, layers),
          load=lambda file, c, reader: _load_gemma4_gguf(
              file, c, reader, layers))
    else:
      flat = gguf_lib.load_params_cached(path, cfg, model_cfg.cache_dir)
    return place_params(cfg, flat, mesh, path)
  if source == 'hf':
    return _load_hf(cfg, _hf_local_dir(path, model_cfg.cache_dir), mesh)
  if source in ('kaggle', 'orbax'):
    return _load_orbax(cfg, source, path, mesh)
  raise ValueError(
      f'config.model.source={source!r} is unknown; choose one of {SOURCES}.'
  )


def _hf_local_dir(path, cache_dir=''):
  """A local directory for an HF path, a gs:// folder (copied once into
  the cache) or a repo id (downloads if allowed)."""
  if storage.is_remote(path):
    return storage.cached_copy(path, cache_dir)
  if os.path.isdir(path):
    return path
  if os.path.exists(path) or path.startswith(('/', '.')):
    raise FileNotFoundError(
        f'Hugging Face model directory not found: {path!r}. Set '
        'config.model.path to a local directory or a repo id.'
    )
  import huggingface_hub  # pylint: disable=g-import-not-at-top
  try:
    return huggingface_hub.snapshot_download(
        path, allow_patterns=['*.safetensors', '*.json', 'tokenizer.model']
    )
  except Exception as e:
    raise RuntimeError(
        f'Could not download Hugging Face repo {path!r} ({e}). Without '
        'network access, download it elsewhere and set config.model.path to '
        'the local directory.'
    ) from e


def _load_hf(cfg, path, mesh):
  """A Hugging Face Gemma 3 or 4 directory of safetensors via tunix's loader."""
  local = _hf_local_dir(path)  # Already local: load_model copied it.
  if not any(f.endswith('.safetensors') for f in os.listdir(local)):
    raise FileNotFoundError(
        f'{local!r} has no *.safetensors files; expected a Hugging Face '
        'Gemma checkpoint directory.'
    )
  if gemma4_lib.is_gemma4_config(cfg):
    flat = gemma4_flat(_read_gemma4_safetensors(local), cfg, local)
    return place_params(cfg, flat, mesh, local)
  from tunix.models.gemma3 import params_safetensors  # pylint: disable=g-import-not-at-top
  model = params_safetensors.create_model_from_safe_tensors(
      local, cfg, mesh=mesh, dtype=cfg.param_dtype
  )
  _check_shapes(model, cfg, local)
  return model


def _read_gemma4_safetensors(directory):
  """Yields (name, array) of every tensor in a directory's safetensors."""
  import safetensors  # pylint: disable=g-import-not-at-top
  for name in sorted(os.listdir(directory)):
    if not name.endswith('.safetensors'):
      continue
    with safetensors.safe_open(os.path.join(directory, name),
                               framework='numpy') as f:
      for key in f.keys():
        yield key, f.get_tensor(key)


def gemma4_flat(hf_pairs, cfg, source_name):
  """{tunix path: host array} of Gemma 4 tensors in Hugging Face's layout.

  Names and layouts are tunix's Gemma 4 mapping (`params_safetensors`);
  tensors it does not map (the vision and audio towers) are skipped. A
  KV-shared layer computes no K/V: Hugging Face checkpoints written by
  transformers (and GGUF files) leave out its K/V projection and key norm,
  which tunix's module still has (unused); those get zeros (ones for the
  norm).

  Args:
    hf_pairs: (Hugging Face name, array) pairs (safetensors, or a GGUF
      file's tensors renamed by `gemma4_gguf`).
    cfg: the tunix Gemma 4 ModelConfig.
    source_name: the checkpoint's path (for the log).
  """
  # pylint: disable=g-import-not-at-top,protected-access
  from tunix.models.gemma4 import params_safetensors as g4_safetensors
  from tunix.utils import torch_utils
  mapping = g4_safetensors._get_key_and_transform_mapping(cfg)
  raw, skipped = {}, 0
  for key, value in hf_pairs:
    try:
      target, transform = torch_utils.torch_key_to_jax_key(mapping, key)
    except ValueError:
      skipped += 1
      continue
    if transform is not None:
      permute, reshape = transform
      value = value.transpose(permute) if permute else value
      value = value.reshape(reshape) if reshape else value
    raw[target] = value
  flat = {k.removesuffix('.value'): v for k, v in
          g4_safetensors._make_preprocess_fn(cfg)(raw).items()}
  # pylint: enable=g-import-not-at-top,protected-access
  if skipped:
    logging.info('%s: skipped %d tensors outside the text decoder.',
                 source_name, skipped)
  model = abstract_model(cfg)
  abstract = _flat_state(model)
  sharing = model.kv_cache_sharing_patterns
  filled = []
  for path, var in abstract.items():
    m = re.fullmatch(r'layers\.(\d+)\.attn\.(kv_einsum\.w|k_einsum\.w|'
                     r'_key_norm\.scale)', path)
    if path in flat or not m or sharing[int(m.group(1))] == int(m.group(1)):
      continue
    fill = np.ones if m.group(2) == '_key_norm.scale' else np.zeros
    flat[path] = fill(var.value.shape, np.float32)
    filled.append(path)
  if filled:
    logging.info('%s: %d unused parameters of KV-shared layers set to '
                 'constants (not in the checkpoint).', source_name,
                 len(filled))
  return flat


def _load_gemma4_gguf(path, cfg, reader, layers):
  """{tunix path: array} of a 'gemma4' GGUF file (see gemma4_gguf)."""
  return gemma4_flat(
      gemma4_gguf.hf_tensors(gguf_lib.dequantized(reader), path, cfg, layers),
      cfg, path)


def _load_orbax(cfg, source, path, mesh):
  """The official Flax/Orbax Gemma checkpoint (kagglehub or a path)."""
  if gemma4_lib.is_gemma4_config(cfg):
    from tunix.models.gemma4 import params as params_lib  # pylint: disable=g-import-not-at-top
  else:
    from tunix.models.gemma3 import params as params_lib  # pylint: disable=g-import-not-at-top
  if source == 'kaggle':
    import kagglehub  # pylint: disable=g-import-not-at-top
    if not path:
      raise ValueError(
          "config.model.path must be a kagglehub handle for source='kaggle', "
          "e.g. 'google/gemma-3/flax/gemma3-1b-it'."
      )
    path = kagglehub.model_download(path)
    subdirs = [
        os.path.join(path, d) for d in sorted(os.listdir(path))
        if os.path.isdir(os.path.join(path, d))
    ]
    path = subdirs[0] if len(subdirs) == 1 else path
  elif not path.startswith('gs://') and not os.path.exists(path):
    raise FileNotFoundError(
        f'Orbax checkpoint not found: {path!r}. Set config.model.path to a '
        'local or gs:// Gemma 3 checkpoint directory.'
    )
  model = params_lib.create_model_from_checkpoint(
      path, cfg, mesh=mesh, dtype=cfg.param_dtype
  )
  if gemma4_lib.is_gemma4_config(cfg):
    # tunix built its own class; the same variables go into ours.
    ours = abstract_model(cfg)
    nnx.update(ours, nnx.state(model))
    model = ours
  _check_shapes(model, cfg, path)
  return model


def _check_shapes(model, cfg, source_name):
  expected = _flat_state(abstract_model(cfg))
  for name, var in _flat_state(model).items():
    if not isinstance(var.value, jax.Array):
      # tunix's safetensors loader skips names it does not know, which
      # leaves their parameters unloaded.
      raise ValueError(
          f'{source_name}: no tensor was loaded for parameter {name!r}; '
          'the checkpoint does not hold it under a name the loader knows.'
      )
    want = tuple(expected[name].value.shape)
    if tuple(var.value.shape) != want:
      raise ValueError(
          f'{source_name}: parameter {name!r} has shape '
          f'{tuple(var.value.shape)}, the preset expects {want}.'
      )


def load_tokenizer(model_cfg):
  """The tokenizer that matches `config.model`.

  SentencePiece (model.tokenizer_path, a GGUF's vocabulary, or the
  checkpoint's tokenizer.model); a tokenizer.json (model.tokenizer_path
  ending in .json, or a Hugging Face directory without tokenizer.model)
  gets `tokenizer.JsonTokenizer`.
  """
  source = model_cfg.source
  tokenizer_path = storage.cached_copy(model_cfg.tokenizer_path,
                                       model_cfg.cache_dir) if (
                                           model_cfg.tokenizer_path) else ''
  if tokenizer_path.endswith('.json'):
    return tokenizer_lib.JsonTokenizer(tokenizer_path)
  if tokenizer_path:
    return tokenizer_lib.load_sentencepiece(tokenizer_path)
  if source in ('gguf', 'random'):
    path = resolve_path(model_cfg) if source == 'gguf' else (
        gguf_lib.default_path()
    )
    return tokenizer_lib.load_gguf_tokenizer(path, model_cfg.cache_dir)
  if source == 'hf':
    local = _hf_local_dir(model_cfg.path, model_cfg.cache_dir)
    if (not os.path.exists(os.path.join(local, 'tokenizer.model'))
        and os.path.exists(os.path.join(local, 'tokenizer.json'))):
      # Gemma 4's repos ship only tokenizer.json.
      return tokenizer_lib.JsonTokenizer(os.path.join(local, 'tokenizer.json'))
    return tokenizer_lib.load_sentencepiece(
        os.path.join(local, 'tokenizer.model')
    )
  base = model_cfg.path
  if storage.is_remote(base):  # An Orbax checkpoint on gs://.
    return tokenizer_lib.load_sentencepiece(storage.cached_copy(
        f'{base.rstrip("/").rsplit("/", 1)[0]}/tokenizer.model',
        model_cfg.cache_dir))
  if source == 'kaggle':
    import kagglehub  # pylint: disable=g-import-not-at-top
    base = kagglehub.model_download(model_cfg.path)
  return tokenizer_lib.load_sentencepiece(
      os.path.join(base if os.path.isdir(base) else os.path.dirname(base),
                   'tokenizer.model')
  )
