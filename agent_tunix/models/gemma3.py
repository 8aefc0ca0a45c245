"""Gemma 3 policies on tunix's NNX Gemma 3: presets and weight loaders.

The presets (270M to 27B, pretrained and instruction tuned, and 'tiny', a
2-layer random model for tests), the ModelConfig of each, tunix's block
remat switched on in place, and the family's loaders of Hugging Face
safetensors, Orbax checkpoints and GGUF files (what `families.GEMMA3`
points at; `gemma.load_model` picks the source).
"""

import dataclasses

from flax import nnx
from tunix.models.gemma3 import model as model_lib

from agent_tunix.models import gguf as gguf_lib
from agent_tunix.models import weights

ModelConfig = model_lib.ModelConfig
# Preset name -> tunix ModelConfig factory ('tiny': `tiny_config`).
PRESETS = {
    'gemma3_270m': ModelConfig.gemma3_270m,
    'gemma3_270m_it': ModelConfig.gemma3_270m_it,
    'gemma3_1b_pt': ModelConfig.gemma3_1b_pt,
    'gemma3_1b_it': ModelConfig.gemma3_1b_it,
    'gemma3_4b_pt': ModelConfig.gemma3_4b_pt,
    'gemma3_4b_it': ModelConfig.gemma3_4b_it,
    'gemma3_12b_pt': ModelConfig.gemma3_12b_pt,
    'gemma3_12b_it': ModelConfig.gemma3_12b_it,
    'gemma3_27b_pt': ModelConfig.gemma3_27b_pt,
    'gemma3_27b_it': ModelConfig.gemma3_27b_it,
    'tiny': None,
}
# The Gemma 3 vocabulary; the tiny model keeps it so the real tokenizer works.
VOCAB_SIZE = 262144


def tiny_config(**kwargs):
  """A 2-layer random Gemma 3 with the real vocabulary, for tests."""
  return ModelConfig(
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


def model_config(preset, dtype):
  """The ModelConfig of a Gemma 3 preset with parameters in `dtype`."""
  overrides = dict(param_dtype=dtype)
  if preset == 'tiny':
    return tiny_config(**overrides)
  return dataclasses.replace(PRESETS[preset](), **overrides)


def remat_blocks(module):
  """Sets tunix's RematConfig.BLOCK on every Attention and FeedForward of
  `module`; returns how many."""
  found = 0
  for _, sub in nnx.iter_modules(module):
    if isinstance(sub, model_lib.Attention):
      sub.remat_config = model_lib.RematConfig.BLOCK
    elif isinstance(sub, model_lib.FeedForward):
      # A fresh config: the FeedForwards share the model's ModelConfig.
      sub.config = dataclasses.replace(
          sub.config, remat_config=model_lib.RematConfig.BLOCK
      )
    else:
      continue
    found += 1
  return found


def load_gguf(path, cfg, cache_dir):
  """{tunix path: array} of a 'gemma3' GGUF file (see `gguf`)."""
  return gguf_lib.load_params_cached(path, cfg, cache_dir)


def load_hf(directory, cfg, mesh):
  """The model from a local Hugging Face directory, by tunix's loader."""
  from tunix.models.gemma3 import params_safetensors  # pylint: disable=g-import-not-at-top
  model = params_safetensors.create_model_from_safe_tensors(
      directory, cfg, mesh=mesh, dtype=cfg.param_dtype
  )
  weights.check_shapes(model, model_lib.Gemma3, cfg, directory)
  return model


def load_orbax(path, cfg, mesh):
  """The model from an official Flax/Orbax checkpoint, by tunix's loader."""
  from tunix.models.gemma3 import params as params_lib  # pylint: disable=g-import-not-at-top
  return params_lib.create_model_from_checkpoint(
      path, cfg, mesh=mesh, dtype=cfg.param_dtype
  )
