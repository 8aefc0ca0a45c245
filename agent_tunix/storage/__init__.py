"""Where a run's files live: local paths and Cloud Storage (gs://) alike.

Modules:
  endpoint: which Cloud Storage endpoint every client uses (the service, or
    an emulator named by STORAGE_EMULATOR_HOST), set once for all of them.
  files: paths, reads, writes and local copies for any location.
  objects: Cloud Storage objects with generation preconditions (exclusive
    create, conditional update and delete) and one-line errors.
  retries: counts the retries the storage clients make.
  emulator_bridge: with STORAGE_EMULATOR_HOST set, a loopback bridge that
    gives tensorstore what the emulator leaves out (generation headers and
    preconditions); never used on the real service.

The bottom layer: it imports nothing else of agent_tunix.
"""

from agent_tunix.storage.files import cached_copy
from agent_tunix.storage.files import create_exclusive
from agent_tunix.storage.files import exists
from agent_tunix.storage.files import glob
from agent_tunix.storage.files import is_gcs
from agent_tunix.storage.files import is_remote
from agent_tunix.storage.files import local_copy
from agent_tunix.storage.files import open_file
from agent_tunix.storage.files import path
from agent_tunix.storage.files import read_bytes
from agent_tunix.storage.files import read_text
from agent_tunix.storage.files import staged_dir
from agent_tunix.storage.files import staged_file
from agent_tunix.storage.files import translated_errors
from agent_tunix.storage.files import upload
from agent_tunix.storage.files import write_bytes
from agent_tunix.storage.files import write_text
from agent_tunix.storage.objects import StorageError
