"""models/families.py: one record per model family, looked up once.

Each record's fields must say what the scattered tests said before the
records existed: a preset is Gemma 4's when its name starts with 'gemma4_'
or 'tiny_gemma4' (`_OLD_IS_GEMMA4`), and then it has Gemma 4's layouts,
tool format, turns, softcap and decoder layer.
"""

import jax.numpy as jnp
import pytest

from agent_tunix.agent import formats
from agent_tunix.models import families
from agent_tunix.models import gemma
from agent_tunix.models import gemma3_gguf
from agent_tunix.models import gemma3_hf
from agent_tunix.models import gemma4
from agent_tunix.models import gemma4_gguf
from agent_tunix.models import gemma4_hf
from agent_tunix.models import weights
from agent_tunix.configs import base


def _old_is_gemma4(preset):
  """models/gemma.py's and data/prompts.py's test before the records."""
  return preset.startswith(('gemma4_', 'tiny_gemma4'))


def test_every_preset_is_in_exactly_one_family():
  assert families.PRESETS == tuple(gemma.PRESETS)
  assert len(set(families.PRESETS)) == len(families.PRESETS)
  for preset in families.PRESETS:
    owners = [f for f in families.FAMILIES if preset in f.presets]
    assert owners == [families.of_preset(preset)], preset
  assert base.get_config().model.preset in families.PRESETS


def test_an_unknown_preset_is_one_clear_error():
  with pytest.raises(ValueError) as raised:
    families.of_preset('gemma5_1b')
  message = str(raised.value)
  assert '\n' not in message
  assert "config.model.preset='gemma5_1b' is unknown" in message
  for preset in families.PRESETS:
    assert repr(preset) in message
  with pytest.raises(ValueError, match='is unknown'):
    families.of_preset(None)


@pytest.mark.parametrize('preset', families.PRESETS)
def test_fields_say_what_the_old_tests_said(preset):
  family = families.of_preset(preset)
  new = _old_is_gemma4(preset)
  assert (family is families.GEMMA4) == new
  assert family.name == ('gemma4' if new else 'gemma3')
  assert family.hf_layout is (gemma4_hf if new else gemma3_hf)
  assert family.gguf_layout is (gemma4_gguf if new else gemma3_gguf)
  # rl/episodes and config/validation: 'gemma4' writes Gemma 4's turns.
  assert family.tool_format == ('gemma4' if new else 'gemma3')
  assert families.of_tool_format(family.tool_format) is family
  # config/validation: data.thinking needs a Gemma 4 preset.
  assert family.thinking == new
  # rl/logprobs: Gemma 4's prompts are never run once and shared.
  assert family.prefill_reads_cache == (not new)
  cfg = family.model_config(preset, jnp.float32)
  assert families.of_config(cfg) is family
  assert gemma.model_class(cfg) is (gemma4.Gemma4 if new else
                                    family.model_class)
  # The softcap the model applies (None: Gemma 3 has none).
  assert family.final_logit_softcap == getattr(cfg, 'final_logit_softcap',
                                               None)
  assert family.final_logit_softcap == (30.0 if new else None)


def test_turn_markers_are_those_of_the_tool_format():
  for family in families.FAMILIES:
    turn_format = formats.get(family.tool_format)
    assert family.turn_markers == (turn_format.turn_start,
                                   turn_format.turn_end)
    for name in family.tool_formats:
      assert families.of_tool_format(name) is family
      assert formats.get(name).turn_start == family.turn_markers[0]
  assert families.of_tool_format('functiongemma') is families.GEMMA3
  # Every agent.format writes the turns of one family.
  assert sorted(formats.FORMATS) == sorted(
      f for family in families.FAMILIES for f in family.tool_formats)
  with pytest.raises(ValueError, match="agent.format='qwen'"):
    families.of_tool_format('qwen')


@pytest.mark.parametrize('preset', ['tiny', 'tiny_gemma4', 'tiny_gemma4_moe'])
def test_the_remat_unit_is_every_decoder_layer(preset):
  family = families.of_preset(preset)
  cfg = family.model_config(preset, jnp.float32)
  model = weights.abstract_model(family.model_class, cfg)
  assert len(model.layers) == cfg.num_layers
  for layer in model.layers:
    assert isinstance(layer, family.decoder_layer)
  assert callable(family.decoder_layer.block)
  assert family.remat_blocks(model) == 2 * cfg.num_layers


def test_a_config_of_no_family_is_refused():
  with pytest.raises(ValueError, match='not the config of a known model'):
    families.of_config(object())
  with pytest.raises(ValueError, match='not the config of a known model'):
    families.of_config(None)
