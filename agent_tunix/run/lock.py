"""One training run per workdir: a lock file naming its owner, with a heartbeat.

`hold(workdir)` (a context manager) creates `<workdir>/RUN_LOCK.json`:

  {"host": ..., "pid": ..., "started": ..., "heartbeat": ..., "token": ...}

and a daemon thread rewrites "heartbeat" (UTC seconds) every `HEARTBEAT_S`.
A second run on the same workdir is refused at once with `LockedError`,
naming the other run's host, pid, start time and last heartbeat. A lock
left by a run that died (SIGKILL, a lost VM) is stale, and taken over with
a warning, when its pid is not running on this same host, or when its
heartbeat is older than `STALE_AFTER_S` (any host). The lock is removed
when the run ends, also on errors.

Exact on both kinds of store: of N runs starting together exactly one gets
the lock. Locally the file is created with O_CREAT | O_EXCL and rewritten
by rename. On gs:// it is an object created with the precondition
ifGenerationMatch=0; the heartbeat, a stale takeover and the removal are
conditional on the generation the run holds, so a run that lost its lock
(its heartbeat stopped for `STALE_AFTER_S` and another run took over)
learns it at its next heartbeat and logs an error instead of writing over
the new owner. An emulator that ignores preconditions (gcp-storage-emulator;
probed once, with a warning) gets the weaker protocol: write, wait
`SETTLE_S`, read back, keep the lock only if it is still ours.

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
import jax
from jax.experimental import multihost_utils
import numpy as np

from agent_tunix import storage
from agent_tunix.storage import objects

FILENAME = 'RUN_LOCK.json'
HEARTBEAT_S = 60.0
STALE_AFTER_S = 600.0
# With an emulator that ignores preconditions: how long a new lock object
# is left before it is read back (see _GcsObject.create).
SETTLE_S = 1.0


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


def _parse(data):
  try:
    return json.loads(data)
  except (TypeError, ValueError):
    return None


class _LocalFile:
  """The lock as a local file: O_EXCL create, rename to rewrite."""

  def __init__(self, path):
    self.path = path

  def create(self, text):
    return storage.create_exclusive(self.path, text.encode())

  def read(self):
    """(owner dict or None, version) — the version is unused locally."""
    try:
      return _parse(storage.path(self.path).read_text()), None
    except FileNotFoundError:
      return None, None

  def take_over(self, text, unused_version):
    """Moves the stale file aside, then creates ours; False if another run
    moved it first."""
    stale = f'{self.path}.stale-{uuid.uuid4().hex}'
    try:
      os.rename(self.path, stale)
      os.unlink(stale)
    except OSError:
      return False
    return self.create(text)

  def update(self, text):
    storage.write_text(self.path, text)
    return True

  def remove(self, token):
    owner, _ = self.read()
    if (owner or {}).get('token') == token:
      os.unlink(self.path)


class _GcsObject:
  """The lock as a Cloud Storage object, every write conditional on its
  generation."""

  def __init__(self, path):
    self.path = path
    self._generation = None

  def create(self, text):
    token = json.loads(text)['token']
    exact = objects.preconditions_enforced(self.path)
    if not exact and self.read()[0] is not None:
      return False
    generation = objects.create(self.path, text.encode())
    if generation is None or not exact:
      # A retried create whose first try went through finds our own lock.
      # Where preconditions are ignored (an emulator), the last of racing
      # writers wins: each reads back after SETTLE_S and keeps only its own.
      if not exact:
        time.sleep(SETTLE_S)
      owner, generation = self.read()
      if (owner or {}).get('token') != token:
        return False
    self._generation = generation
    return True

  def read(self):
    data, generation = objects.read(self.path)
    return (_parse(data) if data is not None else None), generation

  def take_over(self, text, version):
    try:
      self._generation = objects.replace(self.path, text.encode(), version)
    except objects.PreconditionFailed:
      return False  # Another run took it over, or its owner came back.
    return True

  def update(self, text):
    try:
      self._generation = objects.replace(self.path, text.encode(),
                                         self._generation)
    except objects.PreconditionFailed:
      return False
    return True

  def remove(self, unused_token):
    if self._generation is not None:
      objects.delete(self.path, self._generation)


class Lock:
  """The lock of one workdir (see the module docstring)."""

  def __init__(self, workdir):
    self.path = str(storage.path(workdir) / FILENAME)
    self._store = (_GcsObject(self.path) if storage.is_gcs(workdir)
                   else _LocalFile(self.path))
    self._owner = None
    self._stop = threading.Event()
    self._thread = None
    self.lost = False

  def acquire(self):
    """Takes the lock or raises LockedError naming the other run."""
    if not storage.is_remote(self.path):
      os.makedirs(os.path.dirname(self.path), exist_ok=True)
    now = _now()
    self._owner = {'host': socket.gethostname(), 'pid': os.getpid(),
                   'started': now, 'heartbeat': now,
                   'token': uuid.uuid4().hex}
    text = json.dumps(self._owner)
    for _ in range(5):
      if self._store.create(text):
        break
      other, version = self._store.read()
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
      if self._store.take_over(text, version):
        break
    else:
      raise LockedError(f'Could not take {self.path}; try again.')
    self._thread = threading.Thread(target=self._beat, daemon=True,
                                    name='run_lock_heartbeat')
    self._thread.start()
    return self

  def heartbeat(self):
    """Rewrites the heartbeat; False (and an error logged) if the lock was
    taken over by another run meanwhile."""
    self._owner['heartbeat'] = _now()
    if self._store.update(json.dumps(self._owner)):
      return True
    if not self.lost:
      self.lost = True
      logging.error('Lost the lock %s: another run took it over (this run '
                    'was silent for over %.0f minutes). Two runs may now '
                    'write to this workdir; stop one.', self.path,
                    STALE_AFTER_S / 60)
    return False

  def _beat(self):
    while not self._stop.wait(HEARTBEAT_S):
      try:
        if not self.heartbeat():
          return
      except Exception as e:  # pylint: disable=broad-exception-caught
        logging.warning('Could not refresh %s: %s', self.path, e)

  def release(self):
    """Stops the heartbeat and removes the lock if it is still ours."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self._owner and not self.lost:
      self._store.remove(self._owner['token'])
    self._owner = None


@contextlib.contextmanager
def hold(workdir):
  """Holds `workdir`'s lock for the block (process 0 takes it)."""
  lock, error = None, None
  if jax.process_index() == 0:
    try:
      lock = Lock(workdir).acquire()
    except (LockedError, storage.StorageError) as e:
      error = e
  if jax.process_count() > 1:
    refused = multihost_utils.broadcast_one_to_all(
        np.asarray(error is not None))
    if bool(refused) and error is None:
      raise LockedError(
          f'Process 0 could not take the lock of {workdir} (another run, or '
          'the store refused; its log says which).')
  if error is not None:
    raise error
  try:
    yield lock
  finally:
    if lock is not None:
      lock.release()
