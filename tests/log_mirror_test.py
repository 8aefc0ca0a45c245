"""Tests of agent_tunix.run.log_mirror: a worker's log copied to the workdir.

Local copies in-process; the command as launch/run.sh runs it (ended by
its marker line, or by SIGTERM), locally and on gs:// through the Cloud
Storage emulator (tests/gcs_emulator.py).
"""

import http.client
import io
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

from agent_tunix.run import log_mirror
import gcs_emulator

_REPO = pathlib.Path(__file__).resolve().parents[1]
_MARKER = 'exited with status'


def test_copies_when_changed_and_reports_failures_once(tmp_path):
  log = tmp_path / 'worker_0.log'
  dest = log_mirror.target(str(tmp_path / 'run') + '/', 0)
  assert dest == f'{tmp_path}/run/logs/worker_0.log'
  err = io.StringIO()
  mirror = log_mirror.Mirror(str(log), dest, err=err)
  assert not mirror.copy()  # No log yet.
  log.write_text('one\n')
  assert mirror.copy()
  assert pathlib.Path(dest).read_text() == 'one\n'
  pathlib.Path(dest).write_text('changed there')
  assert mirror.copy()  # The log did not change: no copy.
  assert pathlib.Path(dest).read_text() == 'changed there'
  with open(log, 'a') as f:
    f.write('two\n')
  good = mirror.dest
  mirror.dest = str(log / 'not_a_dir' / 'worker_0.log')  # Cannot be made.
  assert not mirror.copy() and not mirror.copy()
  assert err.getvalue().count('log_mirror: could not copy') == 1
  mirror.dest = good
  assert mirror.copy()
  assert 'works again' in err.getvalue()
  assert pathlib.Path(dest).read_text() == 'one\ntwo\n'


def test_the_marker_counts_only_after_the_start(tmp_path):
  log = tmp_path / 'w.log'
  log.write_text(f'=== old run {_MARKER} 0\n=== new run\n')
  mirror = log_mirror.Mirror(str(log), str(tmp_path / 'd'), _MARKER)
  assert not mirror.done()
  with open(log, 'a') as f:
    f.write('step 1\n=== exited with sta')
  assert not mirror.done()
  with open(log, 'a') as f:
    f.write('tus 3\n')  # Split across two looks.
  assert mirror.done()


def test_run_copies_periodically_and_once_at_the_end(tmp_path):
  log = tmp_path / 'w.log'
  log.write_text('a\n')
  dest = tmp_path / 'd.log'
  mirror = log_mirror.Mirror(str(log), str(dest), _MARKER)
  stop = threading.Event()
  thread = threading.Thread(target=mirror.run, args=(0.05, stop, 0.01))
  thread.start()
  deadline = time.monotonic() + 10
  while not dest.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
  assert dest.read_text() == 'a\n'
  with open(log, 'a') as f:
    f.write(f'b\n=== {_MARKER} 0\n')
  thread.join(timeout=10)
  assert not thread.is_alive()
  assert dest.read_text() == f'a\nb\n=== {_MARKER} 0\n'


def _start(log, workdir, env=None, every_s='60'):
  return subprocess.Popen(
      [sys.executable, '-m', 'agent_tunix.run.log_mirror', f'--log={log}',
       f'--workdir={workdir}', '--worker=1', f'--every_s={every_s}',
       f'--done_marker={_MARKER}'],
      cwd=_REPO, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)


def test_command_stops_on_sigterm_after_a_last_copy(tmp_path):
  log = tmp_path / 'w.log'
  log.write_text('start\n')
  proc = _start(log, tmp_path / 'run', every_s='0.2')
  dest = tmp_path / 'run' / 'logs' / 'worker_1.log'
  deadline = time.monotonic() + 60
  while not dest.exists() and time.monotonic() < deadline:
    time.sleep(0.1)
  with open(log, 'a') as f:
    f.write('last words\n')
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=60) == 0, proc.stderr.read()
  assert dest.read_text() == 'start\nlast words\n'


def _read_object(gcs, name):
  conn = http.client.HTTPConnection('127.0.0.1', gcs.emulator_port,
                                    timeout=30)
  conn.request('GET', f'/storage/v1/b/{gcs.bucket}/o/'
               f'{urllib.parse.quote(name, safe="")}?alt=media')
  response = conn.getresponse()
  body = response.read()
  conn.close()
  assert response.status == 200, (response.status, body)
  return body.decode()


def test_command_mirrors_to_gcs_until_the_marker(tmp_path):
  log = tmp_path / 'w.log'
  log.write_text(f'=== previous run {_MARKER} 0\n=== this run\n')
  with gcs_emulator.emulator() as gcs:
    proc = _start(log, f'gs://{gcs.bucket}/run', env=gcs.env)
    time.sleep(1)
    assert proc.poll() is None  # The old run's marker does not count.
    with open(log, 'a') as f:
      f.write(f'step 1\n=== {_MARKER} 0\n')
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    assert gcs.list('run/') == ['run/logs/worker_1.log']
    assert _read_object(gcs, 'run/logs/worker_1.log') == log.read_text()
