"""A tiny training run with its workdir on gs:// (the Cloud Storage API on
loopback, tests/gcs_emulator.py), as a user runs it: main stopped by
SIGTERM, a resume that ends with the uninterrupted run's checkpoint,
evaluate and plot, each a separate process reading the same bucket."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import gcs_emulator
from agent_tunix import storage

_REPO = pathlib.Path(__file__).resolve().parent.parent
_TIMEOUT_S = 600


@pytest.fixture(scope='module')
def gcs():
  with gcs_emulator.emulator('agent-tunix-runs') as emulator:
    yield emulator


def _env(gcs):
  env = dict(os.environ, **gcs.env)
  env['PYTHONPATH'] = os.pathsep.join([str(_REPO), str(_REPO / 'tests')])
  return env


def _command(module, *args):
  return [sys.executable, '-m', f'agent_tunix.{module}', *args]


def _run(gcs, module, *args):
  return subprocess.run(_command(module, *args), cwd=_REPO, env=_env(gcs),
                        capture_output=True, text=True, timeout=_TIMEOUT_S,
                        check=False)


_TRAIN = ('--config=configs/tiny.py', '--config.training.num_steps=3',
          '--config.checkpoint.save_interval_steps=1')


def _meta(gcs, workdir, step):
  """The checksums of a checkpoint's LoRA and optimizer arrays."""
  os.environ.update(gcs.env)
  try:
    return json.loads(storage.read_text(
        f'{workdir}/checkpoints/{step}/meta/metadata'))
  finally:
    os.environ.pop('STORAGE_EMULATOR_HOST', None)


def test_sigterm_resume_evaluate_and_plot_on_gcs(gcs, tmp_path):
  workdir = f'gs://{gcs.bucket}/run'
  local = tmp_path / 'uninterrupted'
  # The uninterrupted run (local) and the one stopped by SIGTERM (gs://).
  with open(tmp_path / 'a.log', 'wb') as log_a, open(tmp_path / 'b.log',
                                                     'wb') as log_b:
    proc_a = subprocess.Popen(_command('main', *_TRAIN, f'--workdir={local}'),
                              cwd=_REPO, env=_env(gcs), stdout=log_a,
                              stderr=subprocess.STDOUT)
    proc_b = subprocess.Popen(_command('main', *_TRAIN,
                                       f'--workdir={workdir}'),
                              cwd=_REPO, env=_env(gcs), stdout=log_b,
                              stderr=subprocess.STDOUT)
    try:
      deadline = time.monotonic() + _TIMEOUT_S
      while 'run/checkpoints/1/commit_success.txt' not in gcs.list('run/'):
        assert proc_b.poll() is None, (tmp_path / 'b.log').read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)
      proc_b.send_signal(signal.SIGTERM)  # A preemption notice.
      proc_b.wait(timeout=_TIMEOUT_S)
      assert proc_a.wait(timeout=_TIMEOUT_S) == 0, (
          (tmp_path / 'a.log').read_text()[-3000:])
    finally:
      for proc in (proc_a, proc_b):
        if proc.poll() is None:
          proc.kill()
          proc.wait()
  stopped = (tmp_path / 'b.log').read_text(errors='replace')
  assert proc_b.returncode != 0 or 'Finished' in stopped, stopped[-3000:]
  names = gcs.list('run/')
  assert any(n.startswith('run/events.out.tfevents.') for n in names), names
  assert 'run/config.json' in names
  assert 'run/RUN_LOCK.json' not in names  # Released on the way out.
  saved = sorted({int(n.split('/')[2]) for n in names
                  if n.endswith('/commit_success.txt')
                  and n.count('/') == 3})

  resumed = _run(gcs, 'main', *_TRAIN, f'--workdir={workdir}')
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  if saved[-1] < 3:
    assert f'Resumed from step {saved[-1]}' in resumed.stderr
  assert 'run/checkpoints/3/commit_success.txt' in gcs.list('run/')
  # The interrupted run on gs:// ends where the uninterrupted one did.
  want = json.loads((local / 'checkpoints' / '3' / 'meta' / 'metadata')
                    .read_text())
  assert _meta(gcs, workdir, 3) == want

  evaluated = _run(gcs, 'evaluate', '--config=configs/tiny.py',
                   f'--workdir={workdir}')
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert json.loads(evaluated.stdout.strip().splitlines()[-1])['step'] == 3

  png = f'gs://{gcs.bucket}/plots/run.png'
  plotted = _run(gcs, 'plot', f'--workdir={workdir}', f'--output={png}')
  assert plotted.returncode == 0, plotted.stderr[-3000:]
  assert 'plots/run.png' in gcs.list('plots/')
