"""Tests for agent_tunix.observe.metrics (TensorBoard files are read back)."""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import collections  # pylint: disable=g-import-not-at-top
import errno
import logging as py_logging
import pathlib
import time


import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tb_events
from tensorboard import plugin_util
from tensorboard.plugins.hparams import plugin_data_pb2

from agent_tunix.observe import metrics
from agent_tunix.observe import writers
from agent_tunix.configs import base


def _events(logdir):
  """{tag: [(step, value, plugin name, metadata content)]} from event files."""
  found = collections.defaultdict(list)
  files = sorted(pathlib.Path(logdir).glob('events.out.tfevents.*'))
  for path in files:
    for event in tb_events.iterate(str(path)):
      for value in event.summary.value:
        plugin = value.metadata.plugin_data
        found[value.tag].append((event.step, tb_events.make_ndarray(value.tensor),
                                 plugin.plugin_name, plugin.content))
  return found


def _small_config():
  config = ml_collections.ConfigDict()
  config.optimizer = ml_collections.ConfigDict(
      dict(learning_rate=3e-6, max_grad_norm=0.1))
  config.mesh = ml_collections.ConfigDict(
      dict(shape=(-1, 1), axis_names=('fsdp', 'tp'), multihost=False))
  config.model = ml_collections.ConfigDict(dict(path='', lora_rank=16))
  config.logging = ml_collections.ConfigDict(
      dict(num_sample_texts=2, report_every_n_steps=2))
  return config


def test_writer_roundtrip_scalars_texts_hparams(tmp_path):
  writer = metrics.create_writer(str(tmp_path))
  metrics.write_hparams(writer, _small_config())
  reward_tag = 'rewards/' + metrics.sanitize_name('my_pkg.rewards:length')
  writer.write_scalars(3, {'loss': 0.25, reward_tag: 1.5})
  writer.write_scalars(4, {'loss': jnp.float32(0.125)})
  metrics.write_samples(writer, 4, ['Q: 1+1?'], ['<answer>2</answer>'],
                        np.array([2.0]), n=1)
  writer.close()

  events = _events(tmp_path)
  assert [(s, float(v)) for s, v, _, _ in events['loss']] == [
      (3, 0.25), (4, 0.125)]
  assert reward_tag == 'rewards/my_pkg.rewards_length'
  assert [(s, float(v)) for s, v, _, _ in events[reward_tag]] == [(3, 1.5)]
  (step, text, plugin, _), = events['samples']
  assert step == 4 and plugin == 'text'
  assert '<answer>2</answer>' in text.item().decode()

  (_, _, plugin, content), = events['_hparams_/session_start_info']
  assert plugin == 'hparams'
  hparams = plugin_data_pb2.HParamsPluginData.FromString(
      content).session_start_info.hparams
  assert hparams['optimizer.learning_rate'].number_value == pytest.approx(
      3e-6)
  assert hparams['mesh.shape'].string_value == '(-1, 1)'
  assert hparams['mesh.multihost'].bool_value is False
  assert hparams['model.path'].string_value == ''
  assert hparams['logging.num_sample_texts'].number_value == 2


def test_other_processes_only_log(tmp_path, monkeypatch):
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  writer = metrics.create_writer(str(tmp_path / 'run'))
  writer.write_scalars(1, {'loss': 1.0})
  metrics.write_hparams(writer, _small_config())
  writer.close()
  assert not (tmp_path / 'run').exists() or not any(
      (tmp_path / 'run').iterdir())


def test_flatten_base_config_gives_hparam_types():
  flat = metrics.flatten_config(base.get_config())
  assert flat['model.lora_rank'] == 16
  assert flat['mesh.axis_names'] == "('fsdp', 'tp')"
  assert flat['checkpoint.async_save'] is True
  assert all(isinstance(v, (bool, int, float, str)) for v in flat.values())
  assert not any(isinstance(v, dict) for v in flat.values())
  assert metrics.flatten_config({'a': {'b': None, 'c': [1, 2]}}) == {
      'a.b': 'None', 'a.c': '[1, 2]'}


@pytest.mark.parametrize('name, tag', [
    ('loss', 'loss'),
    ('rewards/format_exact', 'rewards/format_exact'),
    ('pkg.mod:fn', 'pkg.mod_fn'),
    ('my reward (v2)!', 'my_reward_v2_'),
    ('/a//b/', 'a/b'),
    ('', '_'),
    ('::', '_'),
    ('ünïcode', '_n_code'),
])
def test_sanitize_name(name, tag):
  assert metrics.sanitize_name(name) == tag


def test_check_finite_passes_and_converts():
  values = metrics.check_finite(
      3, {'loss': jnp.float32(0.5), 'kl': np.float64(0.0), 'n': 4,
          'per_group': jnp.array([1.0, 2.0])})
  assert values['loss'] == 0.5 and isinstance(values['loss'], float)
  assert values['n'] == 4.0
  np.testing.assert_array_equal(values['per_group'], [1.0, 2.0])


def test_check_finite_names_every_bad_value():
  with pytest.raises(FloatingPointError) as e:
    metrics.check_finite(12, {'loss': jnp.float32(jnp.nan), 'kl': 0.1,
                              'grad_norm': float('inf'),
                              'adv': np.array([0.0, -np.inf])})
  message = str(e.value)
  assert message.startswith('loss=nan, grad_norm=inf, adv=[0.0, -inf] at '
                            'step 12;')
  assert 'optimizer.learning_rate' in message
  assert 'optimizer.max_grad_norm' in message
  assert 'kl' not in message


def test_samples_markdown_shows_model_output_literally():
  completions = [
      '<answer>6</answer>\n# not a heading *x*',
      'has ``` and ```` fences',
      'not shown',
  ]
  prompts = ['system ' * 100 + 'Question: 2*3?', 'p1', 'p2']
  text = metrics.format_samples(
      prompts, completions, {'answer': [1.0, 0.0, 1.0], 'format': [1, 0, 0]},
      n=2, max_chars=60)
  assert 'not shown' not in text and 'sample 1' in text
  assert '`answer=1, format=1`' in text
  # Prompts keep their last 60 characters (the question).
  assert '[654 characters before] ...' in text
  assert 'system Question: 2*3?\n' in text
  html = plugin_util.markdown_to_safe_html(text)
  assert '&lt;answer&gt;6&lt;/answer&gt;' in html
  assert '# not a heading *x*' in html and '<h1>' not in html
  assert 'has ``` and ```` fences' in html
  assert '<code>' in html


def test_samples_truncation_and_noop():
  long = 'x' * 50
  text = metrics.format_samples(['p'], [long], [0.5], n=5, max_chars=10)
  assert 'x' * 10 + '... [40 more characters]' in text
  assert '`0.5`' in text

  class Recorder(writers.MetricWriter):
    """Keeps write_texts calls; every other method is a no-op."""

    def __init__(self):
      self.texts = []

    def write_texts(self, step, texts):
      self.texts.append((step, texts))

    def write_summaries(self, *a, **k): ...
    def write_scalars(self, *a, **k): ...
    def write_images(self, *a, **k): ...
    def write_videos(self, *a, **k): ...
    def write_audios(self, *a, **k): ...
    def write_histograms(self, *a, **k): ...
    def write_hparams(self, *a, **k): ...
    def flush(self): ...
    def close(self): ...

  writer = Recorder()
  metrics.write_samples(writer, 1, ['p'], ['c'], [1.0], n=0)
  metrics.write_samples(writer, 1, [], [], [], n=2)
  assert writer.texts == []
  metrics.write_samples(writer, 2, ['p'], ['c'], [1.0], n=2)
  assert [s for s, _ in writer.texts] == [2]


def test_progress_hook_reports_every_n_steps_and_last(caplog):
  caplog.set_level(py_logging.INFO)
  scalars = []

  class Recorder(writers.MetricWriter):

    def write_scalars(self, step, values):
      scalars.append((step, dict(values)))

    def write_summaries(self, *a, **k): ...
    def write_texts(self, *a, **k): ...
    def write_images(self, *a, **k): ...
    def write_videos(self, *a, **k): ...
    def write_audios(self, *a, **k): ...
    def write_histograms(self, *a, **k): ...
    def write_hparams(self, *a, **k): ...
    def flush(self): ...
    def close(self): ...

  hook = metrics.progress_hook(_small_config(), 5, Recorder())
  fired = [hook(step, t=0.5 * step) for step in range(1, 6)]
  assert fired == [False, True, False, True, True]
  rates = [(s, v['steps_per_sec']) for s, v in scalars if 'steps_per_sec' in v]
  assert rates == [(2, 2.0), (4, 2.0), (5, 2.0)]
  assert [s for s, v in scalars if 'uptime' in v] == [2, 4, 5]
  assert 'Progress: 2.0 steps/s, 40.0% (2/5), ETA: 0m' in caplog.text
  # A 30 s step on CPU: not '0.0 steps/s'.
  hook = metrics.progress_hook(_small_config(), 200, Recorder())
  assert not hook(10, t=0.0) and not hook(11, t=30.0)
  assert hook(12, t=61.0)
  assert 'Progress: 30.5 s/step, 6.0% (12/200), ETA: 1h35m' in caplog.text
  assert scalars[-1] == (12, {'steps_per_sec': 2 / 61.0,
                              'uptime': scalars[-1][1]['uptime']})

  config = _small_config()
  config.logging.report_every_n_steps = 0
  with pytest.raises(ValueError, match='report_every_n_steps'):
    metrics.progress_hook(config, 5, Recorder())


def test_timer():
  timer = metrics.Timer()
  assert timer.elapsed == 0.0
  with timer:
    time.sleep(0.02)
    assert timer.elapsed > 0
  done = timer.elapsed
  assert done >= 0.02
  time.sleep(0.01)
  assert timer.elapsed == done  # Frozen after the block.


class _Writer:
  """Counts close() calls; its close can fail like a full disk's."""

  def __init__(self, fail=False):
    self.closed = 0
    self.fail = fail

  def close(self):
    self.closed += 1
    if self.fail:
      raise OSError(errno.ENOSPC, 'No space left on device')


def test_closing_closes_on_every_exit_and_keeps_the_error(caplog):
  writer = _Writer()
  with metrics.closing(writer) as w:
    assert w is writer
  assert writer.closed == 1
  # An error in the block: the writer is closed (its queued writes done)
  # before the error goes on, and a failing close does not replace it.
  writer = _Writer(fail=True)
  with pytest.raises(KeyError):
    with metrics.closing(writer):
      raise KeyError('a reward function failed')
  assert writer.closed == 1
  assert 'Could not finish writing metrics after KeyError' in caplog.text
  writer = _Writer(fail=True)
  with pytest.raises(OSError):
    with metrics.closing(writer):
      pass
