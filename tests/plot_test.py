"""Tests for agent_tunix.plot on event files written by the run's metric writer."""

import os
import pathlib
import shutil
import subprocess
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import pytest

from agent_tunix import plot
from agent_tunix.observe import metrics

_REPO = pathlib.Path(__file__).resolve().parents[1]

# What a training run writes (metrics.create_writer, as train.run does),
# with a user reward 'pkg.mod:fn' (tag reward/pkg.mod_fn/mean) and no KL
# (grpo.beta = 0).
_STEPS = {
    1: {'reward/mean': -1.5, 'reward/format_exact/mean': 0.0,
        'reward/pkg.mod_fn/mean': 0.25, 'reward/std': 0.5,
        'completion/mean_length': 120.0, 'entropy': 2.5, 'loss': 0.1},
    2: {'reward/mean': 0.5, 'reward/format_exact/mean': 1.5,
        'reward/pkg.mod_fn/mean': 0.5, 'reward/std': 0.4,
        'completion/mean_length': 80.0, 'entropy': 2.0, 'loss': 0.2},
    3: {'reward/mean': 2.0, 'reward/format_exact/mean': 3.0,
        'reward/pkg.mod_fn/mean': 0.75, 'reward/std': 0.3,
        'completion/mean_length': 60.0, 'entropy': 1.5, 'loss': 0.3},
}
_EVAL = {
    0: {'eval/accuracy': 0.125, 'eval/accuracy_stderr': 0.04,
        'eval/format_accuracy': 0.0, 'eval/format_accuracy_stderr': 0.0},
    3: {'eval/accuracy': 0.25, 'eval/accuracy_stderr': 0.05,
        'eval/format_accuracy': 0.875, 'eval/format_accuracy_stderr': 0.04},
}


def _write_run(workdir, steps, evals):
  writer = metrics.create_writer(str(workdir), asynchronous=False)
  writer.write_hparams({'grpo.beta': 0.0})
  for step, scalars in evals.items():
    writer.write_scalars(step, scalars)
  for step, scalars in steps.items():
    writer.write_scalars(step, scalars)
    writer.write_texts(step, {'samples': f'sample of step {step}'})
  writer.close()


def _expected(tag, table):
  steps = sorted(s for s in table if tag in table[s])
  return steps, [table[s][tag] for s in steps]


def test_plot_draws_what_the_run_wrote(tmp_path):
  _write_run(tmp_path, _STEPS, _EVAL)
  output = tmp_path / 'curves.png'

  drawn = plot.plot(str(tmp_path), str(output))

  with open(output, 'rb') as f:
    png = f.read()
  assert png.startswith(b'\x89PNG\r\n\x1a\n') and len(png) > 10_000
  assert drawn == {
      'Reward': {
          'total': _expected('reward/mean', _STEPS),
          'format_exact': _expected('reward/format_exact/mean', _STEPS),
          'pkg.mod_fn': _expected('reward/pkg.mod_fn/mean', _STEPS),
      },
      'Eval accuracy': {
          'accuracy': _expected('eval/accuracy', _EVAL),
          'format accuracy': _expected('eval/format_accuracy', _EVAL),
      },
      'Completion length': {
          'mean': _expected('completion/mean_length', _STEPS)},
      'KL to the reference': {},  # Not logged with beta = 0.
      'Entropy': {'entropy': _expected('entropy', _STEPS)},
  }
  assert drawn['Reward']['total'] == ([1, 2, 3], [-1.5, 0.5, 2.0])


def test_a_resumed_run_rewrites_steps(tmp_path):
  _write_run(tmp_path, _STEPS, _EVAL)
  # The resumed run writes step 3 again (and 4) in a later event file.
  _write_run(tmp_path, {3: {'kl': 0.01, 'reward/mean': 9.0},
                        4: {'kl': 0.02, 'reward/mean': 10.0}}, {})
  drawn = plot.plot(str(tmp_path), str(tmp_path / 'x.png'))
  assert drawn['Reward']['total'] == ([1, 2, 3, 4], [-1.5, 0.5, 9.0, 10.0])
  assert drawn['KL to the reference'] == {
      'kl': ([3, 4], [pytest.approx(0.01), pytest.approx(0.02)])}


def test_event_files_are_read_in_creation_order(tmp_path):
  # Writer numbers 9 and 10 of one second: as text, '10' sorts before '9'.
  for name, value in (('first', 2.0), ('second', 9.0)):
    _write_run(tmp_path / name, {3: {'reward/mean': value}}, {})
  run = tmp_path / 'run'
  run.mkdir()
  for name, number in (('first', 9), ('second', 10)):
    (source,) = (tmp_path / name).glob(plot.EVENT_GLOB)
    shutil.copy(source, run / f'events.out.tfevents.100.host.7.{number}.v2')
  assert plot.read_scalars(str(run))['reward/mean'] == {3: 9.0}


def test_workdir_without_events_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match='No TensorBoard event files'):
    plot.plot(str(tmp_path / 'missing'), str(tmp_path / 'x.png'))
  assert not (tmp_path / 'x.png').exists()


def test_events_without_training_metrics_are_a_clear_error(tmp_path):
  writer = metrics.create_writer(str(tmp_path), asynchronous=False)
  writer.write_scalars(1, {'something/else': 1.0})
  writer.close()
  with pytest.raises(ValueError, match='none of the plotted metrics'):
    plot.plot(str(tmp_path), str(tmp_path / 'x.png'))


def test_cli(tmp_path):
  _write_run(tmp_path, _STEPS, _EVAL)
  output = tmp_path / 'cli.png'

  def run(workdir):
    return subprocess.run(
        [sys.executable, '-m', 'agent_tunix.plot', f'--workdir={workdir}',
         f'--output={output}'], cwd=_REPO, capture_output=True, text=True,
        timeout=300, check=False)

  done = run(tmp_path)
  assert done.returncode == 0, done.stderr[-2000:]
  assert output.stat().st_size > 10_000
  assert f'Wrote {output}: 7 curves' in done.stdout
  missing = run(tmp_path / 'none')
  assert missing.returncode == 1
  assert 'error: No TensorBoard event' in missing.stderr