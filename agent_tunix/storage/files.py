"""Paths, reads, writes and local copies for local and gs:// locations.

Every file a run reads or writes goes through here (or through Orbax,
which writes through the same clients: etils.epath on gcsfs, tensorstore).
`path(p)` is an etils.epath.Path; without TensorFlow installed epath takes
gs:// (and s3:// where s3fs is installed) through fsspec. For libraries
that want a local file or folder (safetensors, SentencePiece, the GGUF
writer) `local_copy` downloads one and `staged_dir` uploads a folder
written locally. Imports nothing of agent_tunix but this package.
"""

import contextlib
import os
import shutil
import tempfile

from etils import epath

from agent_tunix.storage import endpoint
from agent_tunix.storage import objects


def is_remote(location):
  """Whether `location` is a URL (gs://, s3://, ...) rather than a path."""
  text = os.fspath(location) if not isinstance(location, str) else location
  return '://' in text and not text.startswith('file://')


def is_gcs(location):
  return str(location).startswith('gs://')


def path(location):
  """An etils.epath.Path for a local path or a gs:// URL."""
  endpoint.configure()
  return epath.Path(location)


def _wrap_errors(location, error):
  """A one-line StorageError for a Cloud Storage failure, else None: a 403,
  or a missing bucket (what a 404 on a path in it may mean)."""
  if not is_gcs(location):
    return None
  text = str(error)
  if isinstance(error, PermissionError) or text.startswith('Forbidden') or (
      getattr(error, 'code', None) == 403):
    return objects.StorageError(objects.describe(error, str(location)))
  if isinstance(error, FileNotFoundError) and objects.bucket_missing(
      str(location)):
    return objects.StorageError(
        objects.describe(error, str(location), missing_bucket=True))
  return None


@contextlib.contextmanager
def translated_errors(location):
  """Turns a 403 or a missing bucket under `location` into StorageError."""
  try:
    yield
  except OSError as e:
    wrapped = _wrap_errors(location, e)
    if wrapped is None:
      raise
    raise wrapped from e


def read_bytes(location):
  with translated_errors(location):
    return path(location).read_bytes()


def read_text(location, encoding='utf-8'):
  with translated_errors(location):
    return path(location).read_text(encoding=encoding)


def write_bytes(location, data):
  """Writes a whole file: a local one atomically (a temporary beside it,
  then a rename); an object on gs:// is replaced whole by nature."""
  target = path(location)
  with translated_errors(location):
    if is_remote(location):
      target.write_bytes(data)
      return
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f'.{target.name}.{os.getpid()}.partial')
    partial.write_bytes(data)
    os.replace(partial, target)


def write_text(location, text, encoding='utf-8'):
  write_bytes(location, text.encode(encoding))


def open_file(location, mode='r', **kwargs):
  """A file object for `location` (text or binary, as `mode` says)."""
  return path(location).open(mode, **kwargs)


def exists(location):
  with translated_errors(location):
    return path(location).exists()


def glob(directory, pattern):
  """Sorted paths (as strings) under `directory` matching `pattern`."""
  with translated_errors(directory):
    return sorted(str(p) for p in path(directory).glob(pattern))


def _download(source, target):
  """Copies the file or folder `source` (any location) to local `target`."""
  if source.is_dir():
    os.makedirs(target, exist_ok=True)
    for child in source.iterdir():
      _download(child, os.path.join(target, child.name))
  else:
    with source.open('rb') as fin, open(target, 'wb') as fout:
      shutil.copyfileobj(fin, fout, 8 << 20)


@contextlib.contextmanager
def local_copy(location):
  """Yields a local path holding `location` (a file or a folder).

  A local path is yielded as it is; a remote one is downloaded into a
  temporary folder, removed when the block ends.
  """
  if not is_remote(location):
    yield os.fspath(location)
    return
  source = path(location)
  with translated_errors(location):
    if not source.exists():
      raise FileNotFoundError(f'No file or folder at {location}.')
    with tempfile.TemporaryDirectory(prefix='agent_tunix_copy_') as tmp:
      target = os.path.join(tmp, source.name or 'copy')
      _download(source, target)
      yield target


def upload(local, location):
  """Copies the local file or folder `local` to `location` (any)."""
  target = path(location)
  with translated_errors(location):
    if os.path.isdir(local):
      target.mkdir(parents=True, exist_ok=True)
      for name in sorted(os.listdir(local)):
        upload(os.path.join(local, name), str(target / name))
    else:
      with open(local, 'rb') as fin, target.open('wb') as fout:
        shutil.copyfileobj(fin, fout, 8 << 20)


@contextlib.contextmanager
def staged_dir(location):
  """Yields a local folder to write into; its files end up at `location`.

  A local `location` is yielded as it is (created). A remote one is staged
  in a temporary folder and uploaded when the block ends without error.
  """
  if not is_remote(location):
    os.makedirs(location, exist_ok=True)
    yield os.fspath(location)
    return
  with tempfile.TemporaryDirectory(prefix='agent_tunix_stage_') as tmp:
    yield tmp
    upload(tmp, location)


@contextlib.contextmanager
def staged_file(location):
  """Yields a local file path to write; it ends up at `location`."""
  if not is_remote(location):
    parent = os.path.dirname(os.fspath(location))
    if parent:
      os.makedirs(parent, exist_ok=True)
    yield os.fspath(location)
    return
  with tempfile.TemporaryDirectory(prefix='agent_tunix_stage_') as tmp:
    local = os.path.join(tmp, os.path.basename(location.rstrip('/')))
    yield local
    upload(local, location)


def create_exclusive(location, data):
  """Writes `data` to `location` only if nothing is there; returns whether
  it did. Exact when processes race: O_CREAT | O_EXCL on a local (or NFS)
  path, a write with ifGenerationMatch=0 on gs://."""
  if is_gcs(location):
    return objects.create(str(location), data) is not None
  if is_remote(location):
    raise ValueError(f'{location}: an exclusive create needs a local path or '
                     'gs://.')
  os.makedirs(os.path.dirname(os.fspath(location)) or '.', exist_ok=True)
  try:
    fd = os.open(location, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
  except FileExistsError:
    return False
  with os.fdopen(fd, 'wb') as f:
    f.write(data)
  return True


_CACHE_DIR = os.path.join('~', '.cache', 'agent_tunix', 'remote')


def cached_copy(location, cache_dir=''):
  """A local copy of a remote file or folder, downloaded once.

  For weights and tokenizers on gs:// that libraries read from local paths
  (safetensors, SentencePiece, GGUF). The copy lives under
  `cache_dir/<scheme>/<bucket>/<path>` (default ~/.cache/agent_tunix/remote)
  and counts only once complete (a `.complete` marker beside it, written
  last), so an interrupted download is made again. A local path is
  returned as it is.
  """
  if not is_remote(location):
    return os.fspath(location)
  scheme, rest = str(location).rstrip('/').split('://', 1)
  root = os.path.expanduser(cache_dir or _CACHE_DIR)
  target = os.path.join(root, scheme, *rest.split('/'))
  marker = f'{target}.complete'
  if os.path.exists(marker):
    return target
  source = path(location)
  with translated_errors(location):
    if not source.exists():
      raise FileNotFoundError(f'No file or folder at {location}.')
    if os.path.isdir(target):
      shutil.rmtree(target)
    elif os.path.exists(target):
      os.remove(target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    _download(source, target)
  with open(marker, 'w') as f:
    f.write(str(location))
  return target
