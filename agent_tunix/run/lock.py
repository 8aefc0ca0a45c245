"""One training run per workdir: a lock file naming its owner, with a heartbeat.

`hold(workdir)` (a context manager) creates `<workdir>/RUN_LOCK.json`:

  {"host": ..., "pid": ..., "started": ..., "heartbeat": ..., "token": ...}

and a daemon thread rewrites "heartbeat" (UTC seconds) every `HEARTBEAT_S`.
A second run on the same workdir is refused at once with `LockedError`,
naming the other run's host, pid, start time and last heartbeat. A lock
left by a run that died (SIGKILL, a lost VM) is not stuck forever: it is
stale, and taken over with a warning, when its pid is not running on this
same host, or when its heartbeat is older than `STALE_AFTER_S` (any host).
The lock is removed when the run ends, also on errors.

Guarantees. On a local or NFS-like file system the lock file is created
with O_CREAT | O_EXCL, so of two runs starting together exactly one gets
it. On gs:// (no exclusive create through tf.io.gfile / epath) the lock is
written, then read back after `_SETTLE_S` seconds and kept only if it is
still ours: a run started while another holds the lock is always refused,
and of two runs that both found no lock the one overwritten before its
read-back is refused; but a run taking more than `_SETTLE_S` between
finding no lock and writing its own can overwrite a lock the other has
already read back, and both go on. A live run whose heartbeat stops for
`STALE_AFTER_S` (a suspended VM) loses its lock to the next start, on any
file system.

Multi-host runs: only process 0 takes the lock; the others learn the result
from it, so every process refuses together.
"""

import contextlib
import datetime
import json
import os
import socket
import threading
import time
import uuid

from absl import logging
from etils import epath
import jax
from jax.experimental import multihost_utils
import numpy as np

FILENAME = 'RUN_LOCK.json'
HEARTBEAT_S = 60.0
STALE_AFTER_S = 600.0
_SETTLE_S = 1.0


class LockedError(RuntimeError):
  """The workdir is in use by another run."""


def _now():
  return time.time()


def _stamp(seconds):
  return datetime.datetime.fromtimestamp(
      seconds, datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')


def _pid_running(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def is_stale(owner, now=None):
  """Why a lock owner is stale (a reason string), or '' if it is live."""
  now = _now() if now is None else now
  age = now - float(owner.get('heartbeat', 0))
  if age > STALE_AFTER_S:
    return f'its heartbeat is {age / 60:.0f} minutes old'
  if owner.get('host') == socket.gethostname() and not _pid_running(
      int(owner.get('pid', -1))):
    return f"its pid {owner.get('pid')} is not running on this host"
  return ''


def describe(owner, path):
  age = _now() - float(owner.get('heartbeat', 0))
  return (f"{path} is held by pid {owner.get('pid')} on host "
          f"{owner.get('host')}, started {_stamp(float(owner['started']))}, "
          f'last heartbeat {age:.0f} s ago')


class Lock:
  """The lock of one workdir (see the module docstring)."""

  def __init__(self, workdir):
    self.path = epath.Path(workdir) / FILENAME
    self._local = not str(workdir).startswith(('gs://', 's3://'))
    self._owner = None
    self._stop = threading.Event()
    self._thread = None

  def _read(self):
    try:
      return json.loads(self.path.read_text())
    except (FileNotFoundError, ValueError):
      return None

  def _create(self, text):
    """Writes the lock file if none exists; returns True if it did."""
    if self._local:
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        return False
      with os.fdopen(fd, 'w') as f:
        f.write(text)
      return True
    if self.path.exists():
      return False
    self.path.write_text(text)
    time.sleep(_SETTLE_S)
    return (self._read() or {}).get('token') == self._owner['token']

  def _write(self):
    self._owner['heartbeat'] = _now()
    text = json.dumps(self._owner)
    if self._local:
      partial = self.path.with_name(FILENAME + f'.{self._owner["token"]}')
      partial.write_text(text)
      os.replace(partial, self.path)
    else:
      self.path.write_text(text)

  def acquire(self):
    """Takes the lock or raises LockedError naming the other run."""
    self.path.parent.mkdir(parents=True, exist_ok=True)
    now = _now()
    self._owner = {'host': socket.gethostname(), 'pid': os.getpid(),
                   'started': now, 'heartbeat': now,
                   'token': uuid.uuid4().hex}
    for _ in range(3):
      if self._create(json.dumps(self._owner)):
        break
      other = self._read()
      if other is None:
        continue  # Removed (or half-written) meanwhile; try again.
      reason = is_stale(other)
      if not reason:
        raise LockedError(
            f'Another run is using this workdir: {describe(other, self.path)}.'
            ' Wait for it to end or stop it, or use another --workdir. If '
            f'that run is gone, delete {self.path} (a lock is also taken '
            f'over by itself once its heartbeat is {STALE_AFTER_S / 60:.0f} '
            'minutes old).'
        )
      logging.warning('Taking over the stale lock %s (%s): %s.', self.path,
                      reason, describe(other, self.path))
      stale = self.path.with_name(f'{FILENAME}.stale-{self._owner["token"]}')
      try:
        self.path.rename(stale)
        stale.unlink()
      except (FileNotFoundError, OSError):
        continue  # Another run took it over first; look again.
    else:
      raise LockedError(f'Could not take {self.path}; try again.')
    self._thread = threading.Thread(target=self._beat, daemon=True,
                                    name='run_lock_heartbeat')
    self._thread.start()
    return self

  def _beat(self):
    while not self._stop.wait(HEARTBEAT_S):
      try:
        self._write()
      except Exception as e:  # pylint: disable=broad-exception-caught
        logging.warning('Could not refresh %s: %s', self.path, e)

  def release(self):
    """Stops the heartbeat and removes the lock if it is still ours."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self._owner and (self._read() or {}).get('token') == (
        self._owner['token']):
      self.path.unlink()
    self._owner = None


@contextlib.contextmanager
def hold(workdir):
  """Holds `workdir`'s lock for the block (process 0 takes it)."""
  lock, error = None, None
  if jax.process_index() == 0:
    try:
      lock = Lock(workdir).acquire()
    except LockedError as e:
      error = e
  if jax.process_count() > 1:
    refused = multihost_utils.broadcast_one_to_all(
        np.asarray(error is not None))
    if bool(refused) and error is None:
      raise LockedError(
          f'Process 0 found the workdir {workdir} in use by another run.')
  if error is not None:
    raise error
  try:
    yield lock
  finally:
    if lock is not None:
      lock.release()
