"""Telling a full disk from other errors, and saying so in one line.

A full disk reaches the trainer wrapped in other errors: an OSError with
errno ENOSPC from our own writes, TensorStore's RESOURCE_EXHAUSTED ('...
No space left on device') from inside an Orbax save, TensorBoard's
ResourceExhaustedError from a metrics flush, or a user's reward function
raising. `no_space_error` finds it in the chain of causes; `message` says
what was being written and what to do. The trainer uses the first to save
nothing more (a save on a full disk only leaves a partial step behind); the
CLIs use both for their last line (errors.py).
"""

import errno
import re


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


def message(error):
  """One line for the full-disk `error` (from `no_space_error`)."""
  path = _written_path(error)
  where = f' writing {path}' if path else ''
  return (f'No space left on device{where}. Free space on that disk (or '
          'use another --workdir) and rerun the same command: training '
          'resumes from the newest complete checkpoint.')
