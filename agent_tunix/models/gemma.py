"""Builds a Gemma 3 or Gemma 4 policy (tunix NNX modules) from `config.model`.

Sources: 'gguf' (offline default), 'hf', 'kaggle', 'orbax', 'random'. Weights
are created directly sharded on the mesh: the module tree is built abstractly
with `nnx.eval_shape`, and every parameter array is assembled shard by shard
with `jax.make_array_from_callback`, so no host ever holds a replicated copy
on device (`weights`). The preset's family (`families`) gives the config,
the model class and the loader of each source.
"""

import os

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp

from agent_tunix import storage
from agent_tunix.models import families
from agent_tunix.models import gemma3
from agent_tunix.models import gguf as gguf_lib
from agent_tunix.models import tokenizer as tokenizer_lib
from agent_tunix.models import weights

# Every preset name, family by family (`families.PRESETS`).
PRESETS = families.PRESETS
SOURCES = ('gguf', 'hf', 'kaggle', 'orbax', 'random')
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
# The Gemma 3 vocabulary; the tiny model keeps it so the real tokenizer works.
VOCAB_SIZE = gemma3.VOCAB_SIZE
tiny_config = gemma3.tiny_config


def is_instruction_tuned(preset):
  return preset.endswith('_it')


def model_config(model_cfg):
  """The tunix ModelConfig for `config.model` (preset and dtype).

  `config.model.remat` is not part of it: the loaded model serves the sampler
  too, so remat is switched on only inside the update (remat.apply_remat).
  """
  family = families.of_preset(model_cfg.preset)
  return family.model_config(model_cfg.preset, DTYPES[model_cfg.dtype])


def model_class(cfg):
  """The NNX model class of a tunix ModelConfig (its family's)."""
  return families.of_config(cfg).model_class


def abstract_model(cfg):
  return weights.abstract_model(model_class(cfg), cfg)


def place_params(cfg, flat, mesh, source_name):
  """Creates the model with `flat` {dotted path: array} sharded on `mesh`
  (`weights.place_params`)."""
  return weights.place_params(model_class(cfg), cfg, flat, mesh, source_name)


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
  family = families.of_config(cfg)
  source = model_cfg.source
  path = resolve_path(model_cfg)
  if source == 'random':
    return random_model(cfg, mesh)
  if source == 'gguf':
    logging.info('Loading GGUF weights from %s', path)
    flat = family.load_gguf(path, cfg, model_cfg.cache_dir)
    return place_params(cfg, flat, mesh, path)
  if source == 'hf':
    return _load_hf(family, cfg, _hf_local_dir(path, model_cfg.cache_dir),
                    mesh)
  if source in ('kaggle', 'orbax'):
    return _load_orbax(family, cfg, source, path, mesh)
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


def _load_hf(family, cfg, path, mesh):
  """A Hugging Face Gemma 3 or 4 directory of safetensors (the family's
  loader)."""
  local = _hf_local_dir(path)  # Already local: load_model copied it.
  if not any(f.endswith('.safetensors') for f in os.listdir(local)):
    raise FileNotFoundError(
        f'{local!r} has no *.safetensors files; expected a Hugging Face '
        'Gemma checkpoint directory.'
    )
  return family.load_hf(local, cfg, mesh)


def _load_orbax(family, cfg, source, path, mesh):
  """The official Flax/Orbax Gemma checkpoint (kagglehub or a path)."""
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
  model = family.load_orbax(path, cfg, mesh)
  weights.check_shapes(model, family.model_class, cfg, path)
  return model


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
