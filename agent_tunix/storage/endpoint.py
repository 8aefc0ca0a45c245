"""Which Cloud Storage endpoint the storage clients use, set once for all.

On a real bucket nothing is configured: gcsfs, google-cloud-storage and
tensorstore find Application Default Credentials (a TPU VM's service
account). With STORAGE_EMULATOR_HOST set (the variable Google's client
libraries and gcsfs read), `configure()` points the others at the same
emulator: tensorstore (Orbax's array writes) through TENSORSTORE_GCS_HTTP_URL
with a test token instead of credentials, and gcsfs without its
hierarchical-namespace probe (a gRPC call no emulator answers).
tensorstore goes through `emulator_bridge`, which adds what
gcp-storage-emulator leaves out and tensorstore needs. Imports nothing of
agent_tunix but this package.
"""

import os
import sys
import threading

from absl import logging

from agent_tunix.storage import emulator_bridge
from agent_tunix.storage import retries

EMULATOR_VAR = 'STORAGE_EMULATOR_HOST'
_lock = threading.Lock()
_configured_for = object()  # The emulator URL configure() last applied.
_bridge = None


def emulator_url():
  """The emulator's base URL ('http://host:port'), or None for the service."""
  value = os.environ.get(EMULATOR_VAR, '').strip()
  if value in ('', 'default'):
    return None
  if not value.startswith(('http://', 'https://')):
    value = f'http://{value}'
  return value.rstrip('/')


def configure():
  """Points tensorstore and gcsfs at STORAGE_EMULATOR_HOST, if set.

  Idempotent and cheap; every function of this package calls it first.
  Variables the user set are kept. If the emulator changed since the last
  call (tests), gcsfs's cached file systems are dropped.
  """
  global _configured_for, _bridge
  url = emulator_url()
  if url == _configured_for:
    return
  with _lock:
    if url == _configured_for:
      return
    retries.install()
    if _bridge is not None:
      _bridge.close()
      _bridge = None
    if url is not None:
      _bridge = emulator_bridge.start(url)
      os.environ['TENSORSTORE_GCS_HTTP_URL'] = _bridge.url
      os.environ.setdefault('GOOGLE_AUTH_TOKEN_FOR_TESTING', 'emulator')
      os.environ.setdefault('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'false')
      if 'gcsfs' in sys.modules and os.environ[
          'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT'].lower() in ('true', '1'):
        logging.warning(
            'gcsfs was imported before %s was read: its hierarchical-'
            'namespace probe may wait 60 s on the emulator.', EMULATOR_VAR)
    if 'gcsfs' in sys.modules and _configured_for is not _UNSET:
      sys.modules['gcsfs'].GCSFileSystem.clear_instance_cache()
    _configured_for = url


_UNSET = _configured_for
