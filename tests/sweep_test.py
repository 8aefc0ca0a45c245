"""Tests for agent_tunix.sweep: the grid, its run names and its errors; the
summary read from run directories; a real 2-point sweep of the tiny model
(trained, skipped on a rerun, an interrupted run resumed); the CLI."""

import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import pytest
import tb_events
from tensorboard.backend.event_processing import plugin_event_multiplexer

from agent_tunix import sweep
from agent_tunix.config import validation
from agent_tunix.observe import metrics
from agent_tunix.configs import tiny

_REPO = pathlib.Path(__file__).resolve().parents[1]
_LR = 'optimizer.learning_rate=1e-4,1e-3'


def _config(**fields):
  """The tiny config, locked as the CLI's --config is, with `fields` set."""
  config = tiny.get_config()
  for dotted, value in fields.items():
    section, name = dotted.split('__')
    config[section][name] = value
  config.lock()
  return config


def _grid(specs, workdir='/sweep', config=None, overrides=()):
  config = config or _config()
  return sweep.grid(config, workdir,
                    sweep.parse_sweeps(specs, config, dict(overrides)))


def test_grid_is_the_product_in_flag_order_with_readable_names():
  config = _config()
  points = _grid(['optimizer.learning_rate=1e-4,3e-6', 'grpo.beta=0,0.04'],
                 workdir='gs://b/s/', config=config)

  assert [p.name for p in points] == [
      'learning_rate=0.0001,beta=0.0', 'learning_rate=0.0001,beta=0.04',
      'learning_rate=3e-6,beta=0.0', 'learning_rate=3e-6,beta=0.04']
  assert [p.workdir for p in points] == [
      f'gs://b/s/{p.name}' for p in points]
  assert [(p.config.optimizer.learning_rate, p.config.grpo.beta)
          for p in points] == [(1e-4, 0.0), (1e-4, 0.04), (3e-6, 0.0),
                               (3e-6, 0.04)]
  assert isinstance(points[0].config.grpo.beta, float)
  assert points[1].values == {'optimizer.learning_rate': 1e-4,
                              'grpo.beta': 0.04}
  # Each point has its own copy; the base config is left alone.
  assert config.optimizer.learning_rate == 1e-3
  assert config.grpo.beta == tiny.get_config().grpo.beta


def test_names_of_clashing_fields_booleans_and_text():
  points = _grid(['eval.max_generation_steps=8',
                  'generation.max_generation_steps=4,8',
                  'generation.cpu_decode_graph=True,false',
                  'model.cache_dir=/tmp/a b'])
  assert [p.name for p in points] == [
      'eval.max_generation_steps=8,generation.max_generation_steps=4,'
      'cpu_decode_graph=true,cache_dir=_tmp_a_b',
      'eval.max_generation_steps=8,generation.max_generation_steps=4,'
      'cpu_decode_graph=false,cache_dir=_tmp_a_b',
      'eval.max_generation_steps=8,generation.max_generation_steps=8,'
      'cpu_decode_graph=true,cache_dir=_tmp_a_b',
      'eval.max_generation_steps=8,generation.max_generation_steps=8,'
      'cpu_decode_graph=false,cache_dir=_tmp_a_b']
  assert points[1].config.generation.cpu_decode_graph is False
  assert points[0].config.model.cache_dir == '/tmp/a b'


@pytest.mark.parametrize('specs, overrides, expected', [
    (['optimizer.learnin_rate=1e-4'], {},
     ['config.optimizer.learnin_rate does not exist',
      'did you mean optimizer.learning_rate']),
    (['optimizer=1'], {}, ['config.optimizer is a section, not a field']),
    (['optimizer.learning_rate=fast'], {},
     ["'fast' is not a valid number for config.optimizer.learning_rate"]),
    (['optimizer.learning_rate=nan'], {}, ["'nan' is not a valid number"]),
    (['training.num_steps=1.5'], {},
     ["'1.5' is not a valid integer for config.training.num_steps"]),
    (['grpo.share_prompts=maybe'], {},
     ["'maybe' is not a valid boolean (true or false)"]),
    (['mesh.shape=1'], {}, ['config.mesh.shape holds a tuple',
                            'only boolean, integer, number and text']),
    (['optimizer.learning_rate='], {},
     ['no value for config.optimizer.learning_rate']),
    (['optimizer.learning_rate=1e-4,,1e-3'], {}, ['an empty value']),
    (['optimizer.learning_rate=1e-4,0.0001'], {},
     ["'0.0001' gives config.optimizer.learning_rate=0.0001, listed "
      'already']),
    (['optimizer.learning_rate'], {}, ['expected FIELD=V1,V2,...']),
    ([_LR, 'optimizer.learning_rate=1e-5'], {},
     ['swept by two --sweep flags']),
    ([_LR], {'optimizer.learning_rate': 1e-5},
     ['config.optimizer.learning_rate is given both as --sweep=' + _LR,
      '--config.optimizer.learning_rate=1e-05', 'drop one of them']),
    ([], {}, ['No --sweep flag']),
    (['model.cache_dir=a/b,a_b'], {},
     ["both name the run directory 'cache_dir=a_b'"]),
])
def test_bad_sweeps_are_one_clear_error(specs, overrides, expected):
  with pytest.raises(sweep.SweepError) as raised:
    _grid(specs, overrides=overrides)
  message = str(raised.value)
  assert isinstance(raised.value, validation.ConfigError)  # One line in CLIs.
  assert '\n' not in message
  for text in expected:
    assert text in message


def _write_events(workdir, evals, train_steps=()):
  writer = metrics.create_writer(str(workdir), asynchronous=False)
  for step in train_steps:
    writer.write_scalars(step, {'reward/mean': float(step)})
  for step, scores in evals.items():
    writer.write_scalars(step, {f'eval/{k}': v for k, v in scores.items()})
  writer.close()


def _checkpoints(workdir, *steps):
  for step in steps:
    (workdir / 'checkpoints' / str(step)).mkdir(parents=True)
  # A save in progress is not a step yet.
  (workdir / 'checkpoints' / '9.orbax-checkpoint-tmp-1').mkdir()


def test_summary_of_finished_stopped_and_new_runs(tmp_path):
  config = _config(training__num_steps=4)
  a, b, c = sweep.grid(config, str(tmp_path), sweep.parse_sweeps(
      ['optimizer.learning_rate=1e-4,2e-4,3e-4'], config))
  finished, halted = pathlib.Path(a.workdir), pathlib.Path(b.workdir)
  _write_events(finished, {
      0: {'accuracy': 0.25, 'accuracy_stderr': 0.1},
      2: {'accuracy': 0.5, 'accuracy_stderr': 0.125},
      4: {'accuracy': 0.5, 'accuracy_stderr': 0.09375,
          'format_accuracy': 0.75, 'format_accuracy_stderr': 0.046875,
          'pass_at_k': 0.625, 'pass_at_k_stderr': 0.125}},
      train_steps=range(1, 5))
  _checkpoints(finished, 2, 4)
  _write_events(halted, {0: {'accuracy': 0.25}, 2: {'accuracy': 0.125}})
  _checkpoints(halted, 2)

  said = []

  rows = sweep.run([a, b, c], train=False, say=said.append)

  assert said == ['[1/3] learning_rate=0.0001: finished at step 4.']

  assert [r['status'] for r in rows] == [
      'finished', 'stopped at step 2', 'not started']
  assert rows[0]['eval'] == {
      'accuracy': 0.5, 'accuracy_stderr': 0.09375, 'format_accuracy': 0.75,
      'format_accuracy_stderr': 0.046875, 'pass_at_k': 0.625,
      'pass_at_k_stderr': 0.125}
  # Best: the highest accuracy, the earliest of the tied steps 2 and 4.
  assert (rows[0]['step'], rows[0]['eval_step'], rows[0]['best_step'],
          rows[0]['best_accuracy']) == (4, 4, 2, 0.5)
  assert (rows[1]['step'], rows[1]['eval_step'], rows[1]['best_step']) == (
      2, 2, 0)
  assert (rows[2]['step'], rows[2]['eval_step'], rows[2]['eval']) == (
      0, None, {})

  table = sweep.write_summary(str(tmp_path), rows, 'test')
  assert table.splitlines()[2:] == [
      '| learning_rate=0.0001 | finished | 4/4 | 4 | 0.500 ± 0.094 | '
      '0.750 ± 0.047 | 0.625 ± 0.125 | 2 (0.500) |',
      '| learning_rate=0.0002 | stopped at step 2 | 2/4 | 2 | 0.125 |  |  | '
      '0 (0.250) |',
      '| learning_rate=0.0003 | not started | 0/4 |  |  |  |  |  |']
  assert table in (tmp_path / sweep.TABLE_FILE).read_text()
  written = json.loads((tmp_path / sweep.JSON_FILE).read_text())
  assert written['runs'] == json.loads(json.dumps(rows))


def test_a_run_killed_in_its_final_evaluation_is_not_finished(tmp_path):
  _write_events(tmp_path, {0: {'accuracy': 0.25}})
  _checkpoints(tmp_path, 1, 2)
  assert not sweep.run_state(str(tmp_path), 2)['finished']
  _write_events(tmp_path, {2: {'accuracy': 0.5}})
  assert sweep.run_state(str(tmp_path), 2)['finished']
  assert not sweep.run_state(str(tmp_path), 3)['finished']


def test_failed_locked_out_of_data_and_stopped_runs(tmp_path, monkeypatch):
  """What the sweep does with each outcome of the trainer (faked here; the
  real trainer runs in the last test)."""
  # pylint: disable=g-import-not-at-top
  from agent_tunix.run import divergence
  from agent_tunix.run import lock as run_lock
  from agent_tunix.run import train
  # pylint: enable=g-import-not-at-top
  config = _config()
  points = sweep.grid(config, str(tmp_path), sweep.parse_sweeps(
      ['optimizer.learning_rate=1e-1,2e-1,3e-1,35e-2,4e-1,5e-1'], config))
  outcomes = {
      0.1: divergence.DivergenceError('loss=nan at step 1; lower it.'),
      0.2: run_lock.LockedError('held by pid 7'),
      0.3: {'step': 1, 'preempted': False},
      0.35: {'step': 1, 'preempted': False, 'alarms': ['entropy_collapse']},
      0.4: {'step': 1, 'preempted': True},
  }
  trained = []

  def fake_train(point_config, workdir):
    lr = point_config.optimizer.learning_rate
    trained.append((lr, workdir))
    if isinstance(outcomes[lr], Exception):
      raise outcomes[lr]
    return {**outcomes[lr], 'scalars': {}, 'eval': None}

  monkeypatch.setattr(train, 'train_and_evaluate', fake_train)
  said = []

  rows = sweep.run(points, say=said.append)

  assert trained == [(p.config.optimizer.learning_rate, p.workdir)
                     for p in points[:5]]  # The sweep stops after 0.4.
  assert said[1::2] == [
      '[1/6] learning_rate=0.1: failed: loss=nan at step 1; lower it.',
      '[2/6] learning_rate=0.2: running elsewhere; skipped (held by pid 7).',
      '[3/6] learning_rate=0.3: out of data at step 1 of 2; raise '
      'data.num_epochs to train further.',
      '[4/6] learning_rate=0.35: stopped at step 1 by alarm entropy_collapse '
      '(training.stop_on_alarm); the sweep goes on.',
      '[5/6] learning_rate=0.4: stopped at step 1; rerun the same command to '
      'go on.']
  assert [r['status'] for r in rows] == [
      'failed', 'running elsewhere', 'out of data at step 1',
      'stopped by alarm entropy_collapse', 'not started', 'not started']
  assert rows[0]['error'] == 'loss=nan at step 1; lower it.'
  assert all('error' not in r for r in rows[1:])


def _cli(*args, module='agent_tunix.sweep'):
  return subprocess.run(
      [sys.executable, '-m', module, *args], cwd=_REPO, capture_output=True,
      text=True, check=False, timeout=600)


def test_print_points_gives_flags_that_train_the_point(tmp_path):
  out = _cli('--config=configs/tiny.py', f'--workdir={tmp_path}',
             '--sweep=optimizer.learning_rate=1e-4,3e-6',
             '--config.training.num_steps=3', '--print_points')
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert len(lines) == 2
  args = shlex.split(lines[1])
  assert args == ['--config=configs/tiny.py',
                  f'--workdir={tmp_path}/learning_rate=3e-6',
                  '--config.training.num_steps=3',
                  '--config.optimizer.learning_rate=3e-6']
  assert not list(tmp_path.iterdir())  # Nothing trained or written.
  # The trainer's own flags read them back.
  printed = _cli(*args, '--print_config', module='agent_tunix.main')
  assert printed.returncode == 0, printed.stderr
  config = json.loads(printed.stdout)
  assert config['optimizer']['learning_rate'] == 3e-6
  assert config['training']['num_steps'] == 3


def test_cli_bad_sweep_is_one_line(tmp_path):
  out = _cli('--config=configs/tiny.py', f'--workdir={tmp_path}',
             f'--sweep={_LR}', '--config.optimizer.learning_rate=1e-5')
  assert out.returncode == 2
  assert out.stderr.strip().splitlines()[-1] == (
      f'error: config.optimizer.learning_rate is given both as --sweep={_LR}'
      ' and as --config.optimizer.learning_rate=1e-05; drop one of them.')
  assert not list(tmp_path.iterdir())


def _event_steps(path):
  """{step: set of scalar tags} in one event file."""
  steps = {}
  for event in tb_events.iterate(str(path)):
    for value in event.summary.value:
      if value.metadata.plugin_data.plugin_name == 'scalars':
        steps.setdefault(event.step, set()).add(value.tag)
  return steps


def _files(root):
  return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in sorted(root.rglob('*')) if p.is_file()}


def test_sweep_trains_skips_finished_and_resumes_interrupted(tmp_path):
  config = _config(eval__pass_at_k=0)  # num_steps = 2, checkpoint each step.
  points = sweep.grid(config, str(tmp_path), sweep.parse_sweeps([_LR],
                                                               config))
  said = []

  rows = sweep.run(points, say=said.append)

  assert said == ['[1/2] learning_rate=0.0001: training 2 steps.',
                  '[1/2] learning_rate=0.0001: finished at step 2.',
                  '[2/2] learning_rate=0.001: training 2 steps.',
                  '[2/2] learning_rate=0.001: finished at step 2.']
  first, second = (tmp_path / p.name for p in points)
  for run_dir, lr in ((first, 1e-4), (second, 1e-3)):
    assert sorted(os.listdir(run_dir / 'checkpoints')) == ['1', '2']
    stored = json.loads((run_dir / 'config.json').read_text())
    assert stored['optimizer.learning_rate'] == lr
  for row in rows:
    assert (row['status'], row['step'], row['eval_step']) == (
        'finished', 2, 2)
    assert set(row['eval']) == {'accuracy', 'accuracy_stderr',
                                'format_accuracy', 'format_accuracy_stderr'}
    assert row['best_step'] in (0, 2)
  # TensorBoard on the sweep directory sees one run per grid point.
  tensorboard = plugin_event_multiplexer.EventMultiplexer()
  tensorboard.AddRunsFromDirectory(str(tmp_path)).Reload()
  assert sorted(tensorboard.Runs()) == sorted(p.name for p in points)
  assert [e.step for e in tensorboard.Tensors(points[1].name,
                                              'eval/accuracy')] == [0, 2]

  # An interruption after step 1 of the first run: its last checkpoint is 1.
  shutil.rmtree(first / 'checkpoints' / '2')
  events_before = set(first.glob('events.out.tfevents.*'))
  second_files = _files(second)
  said.clear()

  sweep.run(points, say=said.append)

  assert said == ['[1/2] learning_rate=0.0001: resuming from step 1 of 2.',
                  '[1/2] learning_rate=0.0001: finished at step 2.',
                  '[2/2] learning_rate=0.001: finished at step 2; skipped.']
  assert sorted(os.listdir(first / 'checkpoints')) == ['1', '2']
  (resumed,) = set(first.glob('events.out.tfevents.*')) - events_before
  steps = _event_steps(resumed)
  # Resumed, not restarted: the new events start after step 1.
  assert sorted(steps) == [2]
  assert {'reward/mean', 'eval/accuracy'} <= steps[2]
  assert _files(second) == second_files

  # The CLI rerun trains nothing and prints the comparison.
  files = _files(tmp_path)
  out = _cli('--config=configs/tiny.py', f'--workdir={tmp_path}',
             f'--sweep={_LR}', '--config.eval.pass_at_k=0')
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert lines[:2] == [
      '[1/2] learning_rate=0.0001: finished at step 2; skipped.',
      '[2/2] learning_rate=0.001: finished at step 2; skipped.']
  table = [line for line in lines if line.startswith('| learning_rate=')]
  assert [line.split(' | ')[:4] for line in table] == [
      ['| learning_rate=0.0001', 'finished', '2/2', '2'],
      ['| learning_rate=0.001', 'finished', '2/2', '2']]
  assert '\n'.join(table) in (tmp_path / sweep.TABLE_FILE).read_text()
  now = _files(tmp_path)
  for name in (sweep.TABLE_FILE, sweep.JSON_FILE):
    now.pop(name)
    files.pop(name, None)
  assert now == files
