"""How the training and evaluation CLIs report errors and quiet other logs.

`cli(main)` wraps an absl main:

  * a user error (a bad config, a workdir in use, a run that diverged, a
    checkpoint that cannot be restored, a missing file, a bad data row, a
    failing reward function) prints one line, `error: <message>`, on
    stderr and exits with status 1; its traceback goes to the log at
    verbosity 1 (`-v 1`), or is raised whole with `--traceback`;
  * an error caused by a full disk, whatever wrapped it (an OSError, or
    TensorStore's RESOURCE_EXHAUSTED from inside an Orbax save), logs the
    original message and ends with one line: `error: No space left on
    device writing <path>.` and what to do;
  * anything else (a bug) raises with its full traceback, as before.

It also drops INFO lines of Orbax from the log, and the tracebacks of
Orbax's and CLU's warnings and errors (the line itself stays), unless the
verbosity is 1 or more, so the console shows the run's own progress.
"""

import errno
import logging as py_logging
import re
import sys

from absl import flags
from absl import logging

from agent_tunix import checkpoint
from agent_tunix import config_lib
from agent_tunix import divergence
from agent_tunix import rewards
from agent_tunix import run_lock
from agent_tunix.data import gsm8k

_TRACEBACK = flags.DEFINE_bool(
    'traceback', False,
    'Show the full traceback of user errors (bad config, workdir in use, '
    'divergence, ...) instead of one line.',
)
USER_ERRORS = (
    config_lib.ConfigError,
    checkpoint.RestoreError,
    run_lock.LockedError,
    divergence.DivergenceError,
    rewards.RewardError,
    gsm8k.DataError,
    FileNotFoundError,
)
# Loggers' source paths whose INFO lines are dropped at verbosity 0.
_QUIET_SOURCES = ('/orbax/',)
# Source paths whose warnings and errors lose their tracebacks at verbosity
# 0 (CLU's INFO lines stay: its progress report is one).
_NO_TRACEBACK_SOURCES = ('/orbax/', '/clu/')


def _chain(error):
  """The error and its causes / contexts, outermost first."""
  seen = []
  while error is not None and error not in seen:
    seen.append(error)
    error = error.__cause__ or error.__context__
  return seen


def no_space_error(error):
  """The ENOSPC OSError in `error`'s chain (or one saying so), else None."""
  chain = _chain(error)
  for e in chain:
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
      return e
  for e in chain:
    if 'No space left on device' in str(e):
      return e
  return None


def _written_path(error):
  """The file or directory a full-disk `error` was writing, or None."""
  if isinstance(error, OSError) and error.filename:
    return str(error.filename)
  text = str(error)
  quoted = re.search(r'(["\'])((?:/|gs://).+?)\1', text)
  if quoted:
    return quoted.group(2)
  bare = re.search(r'(?:^|\s)((?:/|gs://)[^\s;:\'"]+)', text)
  return bare.group(1) if bare else None


def no_space_message(error):
  """One line for the full-disk `error` (from `no_space_error`)."""
  path = _written_path(error)
  where = f' writing {path}' if path else ''
  return (f'No space left on device{where}. Free space on that disk (or '
          'use another --workdir) and rerun the same command: training '
          'resumes from the newest complete checkpoint.')


class _QuietThirdParty(py_logging.Filter):
  """Quiets third-party logs at verbosity 0.

  Orbax's INFO lines go; Orbax's and CLU's warnings and errors stay, one
  line each, without their tracebacks (~30 lines each: e.g. every writer
  thread of a save, or every metrics flush, on a full disk).
  """

  def filter(self, record):
    if logging.get_verbosity() >= logging.DEBUG:
      return True
    path = record.pathname.replace('\\', '/')
    if record.levelno < py_logging.WARNING:
      return not any(source in path for source in _QUIET_SOURCES)
    if any(source in path for source in _NO_TRACEBACK_SOURCES):
      record.exc_info, record.exc_text = None, None
    return True


def quiet_third_party_logs():
  """Quiets Orbax's log (see _QuietThirdParty) unless the verbosity is >= 1."""
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _QuietThirdParty) for f in handler.filters):
    handler.addFilter(_QuietThirdParty())


def cli(main):
  """Wraps an absl `main(argv)` as described in the module docstring."""

  def wrapped(argv):
    quiet_third_party_logs()
    try:
      return main(argv)
    except Exception as e:  # pylint: disable=broad-exception-caught
      full = no_space_error(e)
      if full is None and not isinstance(e, USER_ERRORS):
        raise
      if _TRACEBACK.value:
        raise
      logging.debug('Traceback of the error below:', exc_info=True)
      if full is not None:
        logging.error('Out of disk space: %s', full)
        shown = no_space_message(full)
      else:
        shown = e
      sys.stderr.write(f'error: {shown}\n')
      sys.stderr.flush()
      sys.exit(1)

  return wrapped
