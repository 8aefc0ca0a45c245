"""The optional Weights & Biases writer.

Two kinds of tests: against a fake `wandb` module object (always run; wandb
is not a requirement), and, where wandb is installed, against the real
package in its offline mode, reading back the run file it writes (no
network: WANDB_MODE=offline, WANDB_DIR in a temporary directory).
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import collections  # pylint: disable=g-import-not-at-top
import importlib.machinery
import json
import pathlib
import struct
import sys
import types

import jax
import numpy as np
import pytest
import tb_events

from agent_tunix.config import validation
from agent_tunix.observe import metrics
from agent_tunix.observe import wandb_writer
from agent_tunix.configs import tiny


class _FakeRun:

  def __init__(self):
    self.logged = []  # (step, {key: value})
    self.config = types.SimpleNamespace(updates=[])
    self.config.update = (
        lambda d, allow_val_change: self.config.updates.append(dict(d)))
    self.finished = False

  def log(self, data, step):
    self.logged.append((step, dict(data)))

  def finish(self):
    self.finished = True


def _fake_wandb():
  """A module object with the part of wandb's API the writer uses."""
  module = types.ModuleType('wandb')
  module.__spec__ = importlib.machinery.ModuleSpec('wandb', None)
  module.runs = []
  module.inits = []

  def init(**kwargs):
    module.inits.append(kwargs)
    module.runs.append(_FakeRun())
    return module.runs[-1]

  module.init = init
  module.Html = lambda text: ('html', text)
  module.Image = lambda array: ('image', np.asarray(array).shape)
  module.Histogram = lambda values, num_bins: ('histogram', len(values),
                                               num_bins)
  return module


def _config(project='proj'):
  config = tiny.get_config()
  config.logging.wandb_project = project
  return config


def _tb_scalars(workdir):
  found = collections.defaultdict(dict)
  for path in sorted(pathlib.Path(workdir).glob('events.out.tfevents.*')):
    for event in tb_events.iterate(str(path)):
      for value in event.summary.value:
        found[value.tag][event.step] = tb_events.make_ndarray(value.tensor)
  return found


def test_writer_sends_scalars_texts_hparams_and_keeps_tensorboard(
    tmp_path, monkeypatch):
  fake = _fake_wandb()
  monkeypatch.setitem(sys.modules, 'wandb', fake)
  workdir = tmp_path / 'my_run'
  writer = metrics.create_writer(str(workdir), asynchronous=False,
                                 config=_config())
  metrics.write_hparams(writer, _config())
  writer.write_scalars(1, {'reward/mean': np.float32(0.5), 'loss': 2})
  metrics.write_samples(writer, 1, ['q <b>'], ['a & b'], [1.0], 1)
  writer.close()
  (run,) = fake.runs
  init = fake.inits[0]
  assert init['project'] == 'proj' and init['name'] == 'my_run'
  assert init['entity'] is None and init['resume'] == 'allow'
  assert run.config.updates[0]['training.num_steps'] == 2
  assert run.config.updates[0]['logging.wandb_project'] == 'proj'
  (step, scalars), (text_step, texts) = run.logged
  assert step == 1 and scalars == {'reward/mean': 0.5, 'loss': 2}
  assert text_step == 1
  kind, html = texts['samples']
  assert kind == 'html' and html.startswith('<pre>')
  assert 'q &lt;b&gt;' in html and 'a &amp; b' in html  # Shown literally.
  assert run.finished
  # TensorBoard still gets everything.
  assert float(_tb_scalars(workdir)['reward/mean'][1]) == 0.5
  # A resume continues the same W&B run.
  metrics.create_writer(str(workdir), asynchronous=False,
                        config=_config()).close()
  assert fake.inits[1]['id'] == init['id']
  assert (workdir / wandb_writer.RUN_ID_FILE).read_text().strip() == (
      init['id'])


def test_no_wandb_without_a_project_or_off_process_0(tmp_path, monkeypatch):
  fake = _fake_wandb()
  monkeypatch.setitem(sys.modules, 'wandb', fake)
  metrics.create_writer(str(tmp_path / 'a'), asynchronous=False,
                        config=_config(project='')).close()
  metrics.create_writer(str(tmp_path / 'b'), asynchronous=False).close()
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  metrics.create_writer(str(tmp_path / 'c'), asynchronous=False,
                        config=_config()).close()
  assert not fake.inits


def test_a_project_without_wandb_is_a_config_error(monkeypatch):
  monkeypatch.setitem(sys.modules, 'wandb', None)  # Not importable.
  with pytest.raises(validation.ConfigError) as error:
    validation.validate(_config(project='p'))
  message = str(error.value)
  assert message.startswith("config.logging.wandb_project='p' needs the "
                            'wandb package')
  assert 'pip install wandb' in message and '\n' not in message
  validation.validate(_config(project=''))  # Off: no wandb needed.


def test_a_run_wandb_cannot_open_is_one_clear_error(tmp_path, monkeypatch):
  fake = _fake_wandb()

  def init(**kwargs):
    del kwargs
    raise RuntimeError('api_key not configured (no-tty)')

  fake.init = init
  monkeypatch.setitem(sys.modules, 'wandb', fake)
  with pytest.raises(validation.ConfigError) as error:
    metrics.create_writer(str(tmp_path), asynchronous=False,
                          config=_config())
  message = str(error.value)
  assert "config.logging.wandb_project='proj'" in message
  assert 'api_key not configured' in message and 'wandb login' in message


def _wandb_records(path):
  """The records of a W&B run file (.wandb: LevelDB log blocks)."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=g-import-not-at-top
  data = path.read_bytes()
  assert data[:4] == b':W&B'
  pos, block, pending, records = 7, 32768, b'', []
  while pos + 7 <= len(data):
    left = block - pos % block
    if left < 7:  # Block trailer padding.
      pos += left
      continue
    _, length, kind = struct.unpack('<IHB', data[pos:pos + 7])
    chunk = data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (1, 2):  # FULL, FIRST.
      pending = chunk
    elif kind in (3, 4):  # MIDDLE, LAST.
      pending += chunk
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(pending)
      records.append(record)
  return records


def test_real_wandb_offline_run_holds_the_scalars(tmp_path, monkeypatch):
  wandb = pytest.importorskip('wandb')
  monkeypatch.setenv('WANDB_MODE', 'offline')
  monkeypatch.setenv('WANDB_DIR', str(tmp_path / 'wandb_dir'))
  monkeypatch.setenv('WANDB_SILENT', 'true')
  (tmp_path / 'wandb_dir').mkdir()
  config = _config(project='agent_tunix_test')
  validation.validate(config)
  workdir = tmp_path / 'run'
  writer = metrics.create_writer(str(workdir), asynchronous=False,
                                 config=config)
  metrics.write_hparams(writer, config)
  writer.write_scalars(0, {'eval/accuracy': 0.25})
  writer.write_scalars(1, {'reward/mean': 0.5, 'alarm/length_limit': 0.0})
  writer.write_scalars(2, {'reward/mean': 0.75, 'alarm/length_limit': 1.0})
  metrics.write_samples(writer, 2, ['q'], ['a'], [1.0], 1)
  writer.close()
  # finish() can return before wandb's service process has written the
  # whole run file; shutting the service down waits for it.
  wandb.teardown()
  run_id = (workdir / wandb_writer.RUN_ID_FILE).read_text().strip()
  (run_file,) = (tmp_path / 'wandb_dir').glob(f'wandb/offline-run-*/'
                                               f'run-{run_id}.wandb')
  history, config_items = {}, {}
  records = _wandb_records(run_file)
  assert records[-1].WhichOneof('record_type') == 'exit'  # Complete.
  for record in records:
    kind = record.WhichOneof('record_type')
    if kind == 'history':
      step = record.history.step.num
      for item in record.history.item:
        key = '/'.join(item.nested_key) or item.key
        history.setdefault(step, {})[key] = json.loads(item.value_json)
    elif kind == 'config':
      for item in record.config.update:
        config_items[item.key or '/'.join(item.nested_key)] = json.loads(
            item.value_json)
  assert history.get(0, {}).get('eval/accuracy') == 0.25, history
  assert history[1]['reward/mean'] == 0.5
  assert history[2]['reward/mean'] == 0.75
  assert history[1]['alarm/length_limit'] == 0
  assert history[2]['alarm/length_limit'] == 1
  assert history[2]['samples/_type'] == 'html-file'
  assert config_items['training.num_steps'] == 2
  assert config_items['logging.wandb_project'] == 'agent_tunix_test'
