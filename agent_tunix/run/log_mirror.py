r"""Mirrors a worker's log file to the run's workdir while the run goes.

  python -m agent_tunix.run.log_mirror --log=~/agent_tunix_logs/worker_0.log \
      --workdir=gs://BUCKET/run --worker=0 [--every_s=30] \
      [--done_marker='exited with status']

copies the whole log to `<workdir>/logs/worker_<N>.log` (local or gs://,
through agent_tunix.storage) every --every_s seconds when it has changed,
and once more, then exits 0, when a line containing --done_marker is
appended to the log after the mirror started, or when it is told to stop
(SIGTERM, SIGHUP or SIGINT). launch/run.sh starts it beside the trainer on
every worker and waits for it after writing the trainer's last line (which
holds the marker), so the whole log outlives a preempted VM. A failed copy
is reported on stderr once (and once when copies work again) and never
stops the mirror, nor the run. Imports only storage.
"""

import os
import signal
import sys
import threading
import time

from absl import app
from absl import flags

from agent_tunix import cli
from agent_tunix import storage

_LOG = _WORKDIR = _WORKER = _EVERY_S = _DONE_MARKER = None  # Flags, below.


def _define_flags():
  """Defines the flags only when this module runs as a program (other
  commands imported in the same process define --workdir too)."""
  global _LOG, _WORKDIR, _WORKER, _EVERY_S, _DONE_MARKER
  _LOG = flags.DEFINE_string('log', None, 'The log file to mirror.')
  _WORKDIR = flags.DEFINE_string(
      'workdir', None, 'The run directory (local or gs://).')
  _WORKER = flags.DEFINE_string(
      'worker', None, 'The worker number N: the copy is logs/worker_N.log.')
  _EVERY_S = flags.DEFINE_float(
      'every_s', 30.0, 'Seconds between copies (only when the log changed).')
  _DONE_MARKER = flags.DEFINE_string(
      'done_marker', '', 'Copy once more and exit when a line holding this '
      'is appended to the log ("" = only on a signal).')


# How often the log is looked at for the marker (a stat, and a read of the
# new bytes when it grew).
_POLL_S = 0.5


def target(workdir, worker):
  """Where a worker's log is mirrored: `<workdir>/logs/worker_<N>.log`."""
  return f'{workdir.rstrip("/")}/logs/worker_{worker}.log'


class Mirror:
  """Copies `log` to `dest` when it changed since the last copy."""

  def __init__(self, log, dest, done_marker='', err=sys.stderr):
    self.log, self.dest, self._err = log, dest, err
    self._marker = done_marker.encode()
    self._copied = None  # (size, mtime) of the last copied version.
    self._failing = False
    # Where the marker is looked for: bytes appended after the start.
    self._seen = self._size()

  def _size(self):
    try:
      return os.stat(self.log).st_size
    except FileNotFoundError:
      return 0

  def copy(self, force=False):
    """Copies the log if it changed (or `force`); True when it is there."""
    try:
      stat = os.stat(self.log)
    except FileNotFoundError:
      return False
    version = (stat.st_size, stat.st_mtime_ns)
    if version == self._copied and not force:
      return True
    try:
      with open(self.log, 'rb') as f:
        data = f.read()
      storage.write_bytes(self.dest, data)
    except Exception as e:  # pylint: disable=broad-exception-caught
      if not self._failing:
        self._err.write(f'log_mirror: could not copy {self.log} to '
                        f'{self.dest} ({type(e).__name__}: {e}); '
                        'retrying\n')
        self._err.flush()
      self._failing = True
      return False
    if self._failing:
      self._err.write(f'log_mirror: copying to {self.dest} works again\n')
      self._err.flush()
    self._failing = False
    self._copied = version
    return True

  def done(self):
    """Whether a line with the marker was appended since the last look."""
    if not self._marker:
      return False
    size = self._size()
    if size <= self._seen:
      return False
    with open(self.log, 'rb') as f:
      # Back by the marker's length, so one split across looks is found.
      start = max(0, self._seen - len(self._marker))
      f.seek(start)
      new = f.read(size - start)
    self._seen = size
    return self._marker in new

  def run(self, every_s, stop, poll_s=_POLL_S):
    """Copies every `every_s` seconds until `stop` is set or the marker is
    appended, then once more."""
    next_copy = time.monotonic() + every_s
    while not stop.wait(min(poll_s, every_s)):
      if self.done():
        break
      if time.monotonic() >= next_copy:
        self.copy()
        next_copy = time.monotonic() + every_s
    self.copy(force=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not (_LOG.value and _WORKDIR.value and _WORKER.value):
    raise app.UsageError('--log, --workdir and --worker are required.')
  if _EVERY_S.value <= 0:
    raise app.UsageError(f'--every_s must be > 0, got {_EVERY_S.value}.')
  stop = threading.Event()
  for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(signum, lambda *_: stop.set())
  Mirror(_LOG.value, target(_WORKDIR.value, _WORKER.value),
         _DONE_MARKER.value).run(_EVERY_S.value, stop)


if __name__ == '__main__':
  _define_flags()
  cli.run(main)
