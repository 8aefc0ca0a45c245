"""Counts the retries the storage clients make (a run logs the count).

gcsfs retries 429, 5xx and dropped connections itself, with backoff, and
says so only in a DEBUG log line; a filter on its logger counts those lines
(and keeps them out of the log unless DEBUG was asked for). Calls through
google-cloud-storage (`objects`) use `policy()`, which counts through its
on_error hook. tensorstore (Orbax's array writes) retries on its own and
is not counted. Imports nothing of agent_tunix.
"""

import functools
import logging as py_logging
import threading

_lock = threading.Lock()
_count = 0
_installed = False


def count():
  """Retries made so far by this process."""
  return _count


def add(n=1):
  global _count
  with _lock:
    _count += n


def _on_error(unused_error):
  add()


@functools.cache
def policy():
  """The retry of google-cloud-storage calls: its own predicate (429, 5xx,
  connection errors), exponential backoff from 1 s up to 32 s, at most 2
  minutes a call, each retry counted. (Imported on first use: a run that
  never touches gs:// never loads the Google client libraries.)"""
  # pylint: disable=g-import-not-at-top
  from google.api_core import retry as api_retry
  from google.cloud.storage import retry as storage_retry
  # pylint: enable=g-import-not-at-top
  return api_retry.Retry(
      predicate=storage_retry._should_retry,  # pylint: disable=protected-access
      initial=1.0, maximum=32.0, multiplier=2.0, timeout=120.0,
      on_error=_on_error)


class _GcsfsRetries(py_logging.Filter):
  """Counts gcsfs's 'retrying after exception' lines; passes on only its
  warnings and errors (or what its logger was set to show before)."""

  def __init__(self, shown_level):
    super().__init__()
    self._shown_level = shown_level

  def filter(self, record):
    if 'retrying after exception' in record.getMessage():
      add()
    return record.levelno >= self._shown_level


def install():
  """Hooks the counter into gcsfs's logger (once)."""
  global _installed
  with _lock:
    if _installed:
      return
    logger = py_logging.getLogger('gcsfs')
    shown = max(logger.getEffectiveLevel(), py_logging.WARNING)
    for child in ('gcsfs.credentials', 'gcsfs.zonal_file', 'fsspec.caching'):
      if py_logging.getLogger(child).level == py_logging.NOTSET:
        py_logging.getLogger(child).setLevel(shown)  # Not DEBUG with ours.
    logger.setLevel(py_logging.DEBUG)
    logger.addFilter(_GcsfsRetries(shown))
    _installed = True
