"""Cloud Storage objects with generation preconditions, and one-line errors.

What gcsfs does not give: an exclusive create (a write with the
precondition ifGenerationMatch=0, refused with 412 if the object exists)
and updates and deletes conditional on the generation a process holds.
The run lock and the other files two processes may race on use these.
Calls go through google-cloud-storage (which reads STORAGE_EMULATOR_HOST
itself) with `retries.policy()`: conditional calls are safe to repeat.

Errors from any client are turned into one line by `describe`: 403 names
the bucket, the missing permission and the role to grant; a missing
bucket says so. Imports nothing of agent_tunix but this package.
"""

import functools
import os
import re
import threading
import uuid

from absl import logging

from agent_tunix.storage import endpoint
from agent_tunix.storage import retries

# The role that holds every permission a run needs on its bucket.
ROLE = 'roles/storage.objectAdmin'
_PERMISSION = re.compile(r'storage\.[a-zA-Z]+\.[a-zA-Z]+')
_client_lock = threading.Lock()


class StorageError(RuntimeError):
  """A Cloud Storage call failed in a way the user must fix (one line)."""


class PreconditionFailed(Exception):
  """The object's generation was not the one the call was conditional on."""


def split(url):
  """'gs://bucket/a/b' -> ('bucket', 'a/b')."""
  rest = str(url).split('://', 1)[1]
  bucket, _, name = rest.partition('/')
  return bucket, name


@functools.lru_cache(maxsize=4)
def _client_for(emulator):
  del emulator  # The cache key: a new client when the endpoint changes.
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  project = (os.environ.get('GOOGLE_CLOUD_PROJECT')
             or os.environ.get('CLOUDSDK_CORE_PROJECT'))
  if endpoint.emulator_url() is not None:
    return storage.Client(project=project or 'emulator')
  return storage.Client(project=project)


def _client():
  endpoint.configure()
  with _client_lock:
    return _client_for(endpoint.emulator_url())


def _blob(url):
  bucket, name = split(url)
  return _client().bucket(bucket).blob(name)


def _list_one(url):
  """Lists at most one object under `url` (API errors propagate)."""
  bucket, name = split(url)
  list(_client().list_blobs(bucket, prefix=name, max_results=1,
                            retry=retries.policy()))


def _api_errors():
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  return exceptions


def create(url, data):
  """Writes `data` (bytes) to `url` only if no object is there.

  Returns:
    The new object's generation, or None if an object already exists.
  """
  blob = _blob(url)
  try:
    blob.upload_from_string(data, if_generation_match=0,
                            retry=retries.policy())
  except _api_errors().PreconditionFailed:
    return None
  except _api_errors().NotFound as e:  # An upload: only the bucket can be.
    raise StorageError(describe(e, url, missing_bucket=True)) from e
  except _api_errors().GoogleAPICallError as e:
    raise StorageError(describe(e, url)) from e
  return int(blob.generation)


def replace(url, data, generation):
  """Overwrites `url` only if it is still at `generation`.

  Returns:
    The new generation.

  Raises:
    PreconditionFailed: the object changed (or went) since `generation`.
  """
  blob = _blob(url)
  try:
    blob.upload_from_string(data, if_generation_match=int(generation),
                            retry=retries.policy())
  except _api_errors().PreconditionFailed as e:
    raise PreconditionFailed(url) from e
  except _api_errors().NotFound as e:  # An upload: only the bucket can be.
    raise StorageError(describe(e, url, missing_bucket=True)) from e
  except _api_errors().GoogleAPICallError as e:
    raise StorageError(describe(e, url)) from e
  return int(blob.generation)


def read(url):
  """(data bytes, generation) of `url`, or (None, None) if there is none."""
  blob = _blob(url)
  exceptions = _api_errors()
  for _ in range(5):
    try:
      blob.reload(retry=retries.policy())  # Its generation, then that version.
      generation = int(blob.generation)
      return blob.download_as_bytes(if_generation_match=generation,
                                    retry=retries.policy()), generation
    except exceptions.NotFound:
      return None, None
    except exceptions.PreconditionFailed:
      continue  # Replaced between the two calls; read the new one.
    except exceptions.GoogleAPICallError as e:
      raise StorageError(describe(e, url)) from e
  raise StorageError(f'{url} kept changing while being read; try again.')


def delete(url, generation):
  """Deletes `url` if it is still at `generation`; returns whether it did."""
  blob = _blob(url)
  try:
    blob.delete(if_generation_match=int(generation), retry=retries.policy())
  except (_api_errors().PreconditionFailed, _api_errors().NotFound):
    return False
  except _api_errors().GoogleAPICallError as e:
    raise StorageError(describe(e, url)) from e
  return True


_enforced = {}


def preconditions_enforced(url):
  """Whether the store behind `url` applies generation preconditions.

  Cloud Storage does (documented); an emulator may not: gcp-storage-emulator
  ignores them. With STORAGE_EMULATOR_HOST set, this probes once per
  emulator and bucket: an exclusive create of a fresh object, twice; the
  second must be refused.
  """
  emulator = endpoint.emulator_url()
  if emulator is None:
    return True
  bucket, name = split(url)
  key = (emulator, bucket)
  if key not in _enforced:
    probe = (f'gs://{bucket}/{name.rstrip("/")}/.precondition-probe-'
             f'{uuid.uuid4().hex}')
    create(probe, b'1')
    _enforced[key] = create(probe, b'2') is None
    try:
      _blob(probe).delete(retry=retries.policy())
    except _api_errors().GoogleAPICallError:
      pass
    if not _enforced[key]:
      logging.warning(
          'The Cloud Storage emulator at %s ignores generation '
          'preconditions: exclusive creates there are not exact.', emulator)
  return _enforced[key]


def check_access(url):
  """Lists one object under `url`: raises StorageError (one line) if the
  bucket does not exist or cannot be listed. Needs storage.objects.list
  only (in ROLE), not the bucket permissions a VM's account may lack."""
  try:
    _list_one(url)
  except _api_errors().NotFound as e:
    raise StorageError(describe(e, url, missing_bucket=True)) from e
  except _api_errors().GoogleAPICallError as e:
    raise StorageError(describe(e, url)) from e


def _status(error):
  for attribute in ('code', 'status'):
    value = getattr(error, attribute, None)
    if isinstance(value, int):
      return value
  if str(error).startswith('Forbidden'):  # gcsfs's 403.
    return 403
  match = re.search(r'\b(403|404)\b', str(error))
  return int(match.group(1)) if match else None


def bucket_missing(url):
  """Whether the bucket of `url` does not exist (a listing says 404)."""
  bucket, _ = split(url)
  try:
    _list_one(f'gs://{bucket}/')
  except _api_errors().NotFound:
    return True
  except _api_errors().GoogleAPICallError:
    return False
  return False


def describe(error, url, missing_bucket=None):
  """One line for a failed call on `url` (any client's error).

  `missing_bucket`: whether the bucket is known to be missing; by default a
  404 whose message names the bucket counts.
  """
  bucket, _ = split(url)
  text = str(error)
  status = _status(error)
  if missing_bucket is None:
    missing_bucket = status == 404 and 'bucket' in text.lower()
  if status == 403 or isinstance(error, PermissionError):
    found = _PERMISSION.search(text)
    missing = found.group(0) if found else 'a storage permission'
    return (f'gs://{bucket}: permission denied ({missing} is missing) '
            f'writing or reading {url}. Grant the account this runs as '
            f'(on a TPU VM, its service account) {ROLE} on the bucket: '
            f'gcloud storage buckets add-iam-policy-binding gs://{bucket} '
            f'--member=serviceAccount:ACCOUNT --role={ROLE}')
  if missing_bucket:
    return (f'The bucket gs://{bucket} does not exist (from {url}). Create '
            f'it (gcloud storage buckets create gs://{bucket} '
            '--location=REGION) or fix the path.')
  first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
  return f'Cloud Storage call on {url} failed: {first[:300]}'


_BUCKET_IN_TEXT = re.compile(r'gs://([a-z0-9][-a-z0-9_.]{1,220})|/b/'
                             r'([a-z0-9][-a-z0-9_.]{1,220})/o\b|^b/'
                             r'([a-z0-9][-a-z0-9_.]{1,220})/o\b')


def failure_line(error):
  """One line for a Cloud Storage 403 found in `error` or its causes (as
  gcsfs raises it from inside a library, e.g. an Orbax save), or None."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, StorageError):
      return str(error)
    text = str(error)
    if _status(error) == 403 or text.startswith('Forbidden'):
      found = _BUCKET_IN_TEXT.search(text.split('Forbidden: ', 1)[-1])
      if found:
        bucket = next(g for g in found.groups() if g)
        return describe(error, f'gs://{bucket}/')
    error = error.__cause__ or error.__context__
  return None
