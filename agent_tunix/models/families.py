"""The model families (Gemma 3, Gemma 4): one record each, one place to ask.

Code that depends on the family looks the record up once, from the preset
(`of_preset(config.model.preset)`) or from a built model's tunix config
(`of_config(model.config)`), and reads its fields; nothing else tests a
preset's name or a config's class. A new family is a new `Family` here,
its presets, model class and loaders in a module of its own (as `gemma3`
and `gemma4`), and its Hugging Face and GGUF layouts (`gemma3_hf`,
`gemma3_gguf`, `gemma4_hf`, `gemma4_gguf`).
"""

import dataclasses
import types
from typing import Any, Callable

from tunix.models.gemma3 import model as gemma3_model
from tunix.models.gemma4 import model as gemma4_model

from agent_tunix.models import gemma3
from agent_tunix.models import gemma3_gguf
from agent_tunix.models import gemma3_hf
from agent_tunix.models import gemma4
from agent_tunix.models import gemma4_gguf
from agent_tunix.models import gemma4_hf


@dataclasses.dataclass(frozen=True)
class Family:
  """What the rest of agent_tunix needs to know of one model family.

  Attributes:
    name: 'gemma3', 'gemma4'.
    title: how messages name it ('Gemma 3').
    presets: its config.model.preset names.
    config_class: its tunix ModelConfig class (`of_config` reads it).
    model_class: its NNX model class, built as model_class(cfg, rngs=...).
    model_config: (preset, dtype) -> the preset's tunix ModelConfig.
    hf_layout: its Hugging Face layout module: hf_tensors, hf_config,
      context_length, is_multimodal, CHAT_TEMPLATE, LORA_DELTA_EINSUM.
    gguf_layout: its llama.cpp GGUF layout module: file_parts.
    tool_format: the agent.formats format written in its turns, the one
      the prompts of its chat template use (`data.prompts`).
    tool_formats: every agent.format that writes its turns.
    turn_markers: (what opens a turn, what ends it).
    thinking: whether it has a thinking switch (data.thinking).
    final_logit_softcap: tanh(logits / c) * c on its logits; None: none.
    decoder_layer: the class of its decoder layers, the unit of
      model.remat='layer'; `decoder_layer.block(layer, x, segment_pos,
      cache, attn_mask, **inputs)` is one layer's computation.
    remat_blocks: (model) -> how many of its modules now use tunix's
      block remat (model.remat='block').
    prefill_reads_cache: whether a multi-token call attends to what the KV
      cache already holds (a prompt run once can then be extended).
    load_gguf: (path, cfg, cache_dir) -> {tunix path: array} of a GGUF file.
    load_hf: (local directory, cfg, mesh) -> the model from safetensors.
    load_orbax: (path, cfg, mesh) -> the model from an Orbax checkpoint.
  """

  name: str
  title: str
  presets: tuple[str, ...]
  config_class: type
  model_class: type
  model_config: Callable[[str, Any], Any]
  hf_layout: types.ModuleType
  gguf_layout: types.ModuleType
  tool_format: str
  tool_formats: tuple[str, ...]
  turn_markers: tuple[str, str]
  thinking: bool
  final_logit_softcap: float | None
  decoder_layer: type
  remat_blocks: Callable[[Any], int]
  prefill_reads_cache: bool
  load_gguf: Callable[..., dict]
  load_hf: Callable[..., Any]
  load_orbax: Callable[..., Any]


GEMMA3 = Family(
    name='gemma3',
    title='Gemma 3',
    presets=tuple(gemma3.PRESETS),
    config_class=gemma3_model.ModelConfig,
    model_class=gemma3_model.Gemma3,
    model_config=gemma3.model_config,
    hf_layout=gemma3_hf,
    gguf_layout=gemma3_gguf,
    tool_format='gemma3',
    tool_formats=('gemma3', 'functiongemma'),
    turn_markers=('<start_of_turn>', '<end_of_turn>'),
    thinking=False,
    final_logit_softcap=None,
    decoder_layer=gemma3_model.DecoderLayer,
    remat_blocks=gemma3.remat_blocks,
    prefill_reads_cache=True,
    load_gguf=gemma3.load_gguf,
    load_hf=gemma3.load_hf,
    load_orbax=gemma3.load_orbax,
)

GEMMA4 = Family(
    name='gemma4',
    title='Gemma 4',
    presets=tuple(gemma4.PRESETS) + tuple(gemma4.TINY_PRESETS),
    config_class=gemma4_model.ModelConfig,
    model_class=gemma4.Gemma4,
    model_config=gemma4.model_config,
    hf_layout=gemma4_hf,
    gguf_layout=gemma4_gguf,
    tool_format='gemma4',
    tool_formats=('gemma4',),
    turn_markers=('<|turn>', '<turn|>'),
    thinking=True,
    final_logit_softcap=gemma4.SOFTCAP,
    decoder_layer=gemma4.DecoderLayer,
    remat_blocks=gemma4.remat_blocks,
    # Its attention reads only the current chunk's K/V in a multi-token
    # call (the cache is written, not read; KV-shared layers take the
    # donor's K/V from the same call).
    prefill_reads_cache=False,
    load_gguf=gemma4.load_gguf,
    load_hf=gemma4.load_hf,
    load_orbax=gemma4.load_orbax,
)

FAMILIES = (GEMMA3, GEMMA4)
# The family of the packaged offline GGUF (Gemma 3 270M, `gguf.default_path`).
PACKAGED = GEMMA3
# Every config.model.preset, by family.
PRESETS = tuple(p for family in FAMILIES for p in family.presets)
_BY_PRESET = {p: family for family in FAMILIES for p in family.presets}


def of_preset(preset):
  """The family of `config.model.preset`; ValueError naming the known ones."""
  try:
    return _BY_PRESET[preset]
  except (KeyError, TypeError):
    raise ValueError(
        f'config.model.preset={preset!r} is unknown; choose one of '
        f'{sorted(PRESETS)}.'
    ) from None


def of_config(cfg):
  """The family of a tunix ModelConfig (a built model's `config`)."""
  for family in FAMILIES:
    if isinstance(cfg, family.config_class):
      return family
  raise ValueError(
      f'{type(cfg).__module__}.{type(cfg).__name__} is not the config of a '
      f'known model family ({", ".join(f.title for f in FAMILIES)}).'
  )


def of_tool_format(name):
  """The family whose turns agent.format `name` writes."""
  for family in FAMILIES:
    if name in family.tool_formats:
      return family
  raise ValueError(
      f'config.agent.format={name!r} writes the turns of no known model '
      f'family; choose one of {[f for x in FAMILIES for f in x.tool_formats]}.'
  )
