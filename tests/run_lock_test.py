"""One run per workdir: the lock refuses a live owner, takes over a dead one."""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import json  # pylint: disable=g-import-not-at-top
import socket
import subprocess
import sys

import pytest

from agent_tunix.run import lock as run_lock
from agent_tunix.run import train
from agent_tunix.configs import tiny


def _write_owner(workdir, **fields):
  owner = {'host': socket.gethostname(), 'pid': os.getpid(),
           'started': 1.7e9, 'heartbeat': run_lock._now(), 'token': 'x'}
  owner.update(fields)
  (workdir / run_lock.FILENAME).write_text(json.dumps(owner))


def _dead_pid():
  proc = subprocess.Popen([sys.executable, '-c', 'pass'])
  proc.wait()
  return proc.pid


def test_second_run_is_refused_at_once_naming_the_first(tmp_path):
  with run_lock.hold(str(tmp_path)):
    with pytest.raises(run_lock.LockedError) as error:
      # Refused before the model is built (no training happens).
      train.train_and_evaluate(tiny.get_config(), str(tmp_path))
  message = str(error.value)
  assert f'pid {os.getpid()}' in message
  assert f'host {socket.gethostname()}' in message
  assert 'started' in message and 'another --workdir' in message
  assert not (tmp_path / 'checkpoints').exists()
  # Released at the end: the next run may take it.
  assert not (tmp_path / run_lock.FILENAME).exists()
  with run_lock.hold(str(tmp_path)):
    pass


def test_lock_of_a_dead_pid_on_this_host_is_taken_over(tmp_path, caplog):
  _write_owner(tmp_path, pid=_dead_pid())
  with run_lock.hold(str(tmp_path)) as lock:
    owner = json.loads((tmp_path / run_lock.FILENAME).read_text())
    assert owner['pid'] == os.getpid() and owner['token'] != 'x'
    assert lock is not None
  assert 'stale lock' in caplog.text and 'not running' in caplog.text


def test_lock_with_an_old_heartbeat_on_another_host_is_taken_over(tmp_path):
  _write_owner(tmp_path, host='elsewhere',
               heartbeat=run_lock._now() - run_lock.STALE_AFTER_S - 5)
  with run_lock.hold(str(tmp_path)):
    pass
  # A fresh heartbeat on another host is live (its pid cannot be checked).
  _write_owner(tmp_path, host='elsewhere', pid=_dead_pid())
  with pytest.raises(run_lock.LockedError, match='host elsewhere'):
    with run_lock.hold(str(tmp_path)):
      pass
  assert json.loads(
      (tmp_path / run_lock.FILENAME).read_text())['host'] == 'elsewhere'


def test_a_live_local_owner_is_refused(tmp_path):
  _write_owner(tmp_path)  # This very process: running.
  with pytest.raises(run_lock.LockedError):
    run_lock.Lock(str(tmp_path)).acquire()
