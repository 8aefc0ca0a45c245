"""How the training and evaluation CLIs report errors and quiet other logs.

`cli(main)` wraps an absl main:

  * a user error (a bad config, a workdir in use, a run that diverged, a
    checkpoint that cannot be restored, a missing file, a bad data row, a
    failing reward function) prints one line, `error: <message>`, on
    stderr and exits with status 2 for a config that validation refuses
    (`cli.USAGE`) and 1 for the rest (`cli.FAILED`); its traceback goes to
    the log at verbosity 1 (`-v 1`), or is raised whole with `--traceback`;
  * Cloud Storage refusing access (a 403 from inside a library, e.g. an
    Orbax save) is one line naming the bucket and the role to grant;
  * an error caused by a full disk, whatever wrapped it (an OSError, or
    TensorStore's RESOURCE_EXHAUSTED from inside an Orbax save), logs the
    original message and ends with one line: `error: No space left on
    device writing <path>.` and what to do;
  * anything else (a bug) raises with its full traceback, as before.

It also drops INFO lines of Orbax from the log, and the tracebacks of
Orbax's and gcsfs's warnings and errors (the line itself stays), unless the
verbosity is 1 or more, so the console shows the run's own progress.
"""

import logging as py_logging
import sys

from absl import flags
from absl import logging

from agent_tunix import cli as cli_lib
from agent_tunix import rewards
from agent_tunix import storage
from agent_tunix.config import validation
from agent_tunix.data import gsm8k
from agent_tunix.run import checkpoint
from agent_tunix.run import divergence
from agent_tunix.run import full_disk
from agent_tunix.run import lock as run_lock
from agent_tunix.storage import objects as storage_objects

_TRACEBACK = flags.DEFINE_bool(
    'traceback', False,
    'Show the full traceback of user errors (bad config, workdir in use, '
    'divergence, ...) instead of one line.',
)
USER_ERRORS = (
    validation.ConfigError,
    checkpoint.RestoreError,
    run_lock.LockedError,
    divergence.DivergenceError,
    rewards.RewardError,
    gsm8k.DataError,
    storage.StorageError,
    FileNotFoundError,
)
# Loggers' source paths whose INFO lines are dropped at verbosity 0.
_QUIET_SOURCES = ('/orbax/',)
# Source paths whose warnings and errors lose their tracebacks at verbosity
# 0.
_NO_TRACEBACK_SOURCES = ('/orbax/', '/gcsfs/')


class _QuietThirdParty(py_logging.Filter):
  """Quiets third-party logs at verbosity 0.

  Orbax's INFO lines go; Orbax's and gcsfs's warnings and errors stay, one
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
      full = full_disk.no_space_error(e)
      denied = None if full is not None else storage_objects.failure_line(e)
      if full is None and denied is None and not isinstance(e, USER_ERRORS):
        raise
      if _TRACEBACK.value:
        raise
      logging.debug('Traceback of the error below:', exc_info=True)
      if full is not None:
        logging.error('Out of disk space: %s', full)
        shown = full_disk.message(full)
      elif denied is not None:
        shown = denied
      else:
        shown = e
      sys.stderr.write(f'error: {shown}\n')
      sys.stderr.flush()
      config_error = full is None and isinstance(e, validation.ConfigError)
      sys.exit(cli_lib.USAGE if config_error else cli_lib.FAILED)

  return wrapped
