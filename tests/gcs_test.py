"""The storage layer against a Cloud Storage API on loopback (gcs_emulator):
files, exclusive creates, the run lock, retries, one-line errors, and
TensorBoard event files on gs://."""

import os
import threading

import pytest

import gcs_emulator
import tb_events
from agent_tunix import storage
from agent_tunix.observe import events
from agent_tunix.run import lock as run_lock
from agent_tunix.storage import objects
from agent_tunix.storage import retries

_DENIED = ('sa@p.iam.gserviceaccount.com does not have storage.objects.create '
           'access to the Google Cloud Storage object.')


@pytest.fixture(scope='module')
def gcs():
  with gcs_emulator.emulator('agent-tunix-test') as emulator:
    saved = os.environ.get('STORAGE_EMULATOR_HOST')
    os.environ['STORAGE_EMULATOR_HOST'] = emulator.url
    try:
      yield emulator
    finally:
      if saved is None:
        os.environ.pop('STORAGE_EMULATOR_HOST', None)
      else:
        os.environ['STORAGE_EMULATOR_HOST'] = saved


@pytest.fixture(autouse=True)
def _no_faults_left(gcs):
  yield
  gcs.proxy.clear()


def test_files_roundtrip(gcs, tmp_path):
  root = f'gs://{gcs.bucket}/files'
  storage.write_text(f'{root}/a/x.txt', 'hello')
  storage.write_bytes(f'{root}/a/y.bin', b'\x00\x01')
  assert storage.read_text(f'{root}/a/x.txt') == 'hello'
  assert storage.exists(f'{root}/a/y.bin')
  assert not storage.exists(f'{root}/a/z')
  assert storage.glob(f'{root}/a', '*.txt') == [f'{root}/a/x.txt']
  with storage.local_copy(f'{root}/a') as local:
    assert sorted(os.listdir(local)) == ['x.txt', 'y.bin']
    assert open(os.path.join(local, 'x.txt')).read() == 'hello'
  with storage.staged_dir(f'{root}/out') as local:
    with open(os.path.join(local, 'f.txt'), 'w') as f:
      f.write('up')
  assert gcs.list('files/out/') == ['files/out/f.txt']
  with pytest.raises(FileNotFoundError):
    with storage.local_copy(f'{root}/missing'):
      pass


def test_exclusive_create_and_conditional_updates(gcs):
  url = f'gs://{gcs.bucket}/cond/obj'
  first = objects.create(url, b'a')
  assert first is not None
  assert objects.create(url, b'b') is None  # 412: it exists.
  data, generation = objects.read(url)
  assert (data, generation) == (b'a', first)
  second = objects.replace(url, b'c', generation)
  with pytest.raises(objects.PreconditionFailed):
    objects.replace(url, b'd', generation)  # Not ours any more.
  assert not objects.delete(url, generation)
  assert objects.delete(url, second)
  assert objects.read(url) == (None, None)
  assert objects.preconditions_enforced(url)
  assert storage.create_exclusive(f'gs://{gcs.bucket}/cond/x', b'1')
  assert not storage.create_exclusive(f'gs://{gcs.bucket}/cond/x', b'2')


def _race(workdir, contenders):
  """Starts `contenders` Locks on `workdir` at once; returns the winners."""
  barrier = threading.Barrier(contenders)
  won, refused, errors = [], [], []

  def contend():
    lock = run_lock.Lock(workdir)
    barrier.wait()
    try:
      won.append(lock.acquire())
    except run_lock.LockedError:
      refused.append(lock)
    except Exception as e:  # pylint: disable=broad-exception-caught
      errors.append(e)

  threads = [threading.Thread(target=contend) for _ in range(contenders)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=120)
  assert not errors, errors
  assert len(won) + len(refused) == contenders
  return won


def test_eight_starts_on_one_workdir_exactly_one_wins(gcs):
  for round_number in range(20):
    workdir = f'gs://{gcs.bucket}/race/{round_number}'
    won = _race(workdir, 8)
    assert len(won) == 1, (round_number, len(won))
    holder = won[0]
    assert holder.heartbeat()  # Conditional on the generation it holds.
    holder.release()
    assert not storage.exists(f'{workdir}/{run_lock.FILENAME}')


def test_stale_takeover_and_a_lost_lock(gcs, monkeypatch):
  workdir = f'gs://{gcs.bucket}/stale'
  first = run_lock.Lock(workdir).acquire()
  monkeypatch.setattr(run_lock, 'STALE_AFTER_S', -1.0)  # Everyone is stale.
  second = run_lock.Lock(workdir).acquire()  # Takes over.
  assert not first.heartbeat()  # Its generation is gone: it knows.
  assert first.lost
  first.release()  # Does not remove the new owner's lock.
  assert storage.exists(f'{workdir}/{run_lock.FILENAME}')
  assert second.heartbeat()
  second.release()
  assert not storage.exists(f'{workdir}/{run_lock.FILENAME}')


def test_an_emulator_without_preconditions_still_lets_one_in(gcs,
                                                             monkeypatch):
  # The bare emulator ignores ifGenerationMatch: the lock detects it and
  # falls back to write, settle, read back.
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', gcs.bare_url)
  workdir = f'gs://{gcs.bucket}/bare'
  assert not objects.preconditions_enforced(workdir)
  for round_number in range(3):
    won = _race(f'{workdir}/{round_number}', 4)
    assert len(won) == 1, (round_number, len(won))
    won[0].release()


def test_503_and_429_are_retried_and_counted(gcs):
  url = f'gs://{gcs.bucket}/retry/x.txt'
  storage.write_text(url, 'kept')
  before = retries.count()
  gcs.proxy.fail(503, times=2, method='GET', path='retry')
  assert storage.read_text(url) == 'kept'  # gcsfs
  assert retries.count() - before == 2
  gcs.proxy.fail(429, times=1, method='GET', path='retry')
  assert objects.read(url)[0] == b'kept'  # google-cloud-storage
  assert retries.count() - before == 3


def test_403_is_one_line_naming_bucket_permission_and_role(gcs):
  workdir = f'gs://{gcs.bucket}/denied'
  gcs.proxy.fail(403, times=10, path=gcs.bucket)
  with pytest.raises(storage.StorageError) as error:
    run_lock.Lock(workdir).acquire()
  message = str(error.value)
  assert '\n' not in message
  assert f'gs://{gcs.bucket}' in message
  assert objects.ROLE in message
  gcs.proxy.clear()
  gcs.proxy.fail(403, times=10, path=gcs.bucket)
  with pytest.raises(storage.StorageError, match=objects.ROLE):
    storage.write_text(f'{workdir}/x', 'x')


def test_a_missing_bucket_is_one_line(gcs):
  workdir = 'gs://no-such-bucket-here/run'
  with pytest.raises(storage.StorageError, match='does not exist') as error:
    run_lock.Lock(workdir).acquire()
  assert '\n' not in str(error.value)
  with pytest.raises(storage.StorageError, match='does not exist'):
    storage.write_text(f'{workdir}/x', 'x')
  with pytest.raises(storage.StorageError, match='does not exist'):
    objects.check_access(workdir)


def test_event_files_on_gcs_read_by_tensorboard(gcs):
  logdir = f'gs://{gcs.bucket}/tb'
  writer = events.TensorBoardWriter(logdir)
  writer.write_hparams({'lr': 0.5, 'name': 'x'})
  writer.write_scalars(1, {'loss': 0.25})
  writer.write_texts(1, {'samples': '**hi**'})
  writer.write_scalars(2, {'loss': 0.125})
  writer.flush()
  assert events.read_scalars(logdir) == {'loss': {1: 0.25, 2: 0.125}}
  # TensorBoard's own loader, reading gs:// through gcsfs.
  (path,) = storage.glob(logdir, events.EVENT_GLOB)
  found = {}
  for event in tb_events.iterate(path):
    for value in event.summary.value:
      found[(value.tag, event.step)] = (
          value.metadata.plugin_data.plugin_name,
          tb_events.make_ndarray(value.tensor))
  assert found[('loss', 2)][0] == 'scalars'
  assert float(found[('loss', 2)][1]) == 0.125
  assert found[('samples', 1)][0] == 'text'
  assert found[('_hparams_/session_start_info', 0)][0] == 'hparams'


def test_a_403_from_inside_a_library_is_found_and_named():
  # gcsfs's error as it surfaces from an Orbax save, wrapped by Orbax.
  denied = OSError('Forbidden: b/my-bucket/o\nsa@p does not have '
                   'storage.objects.create access to the object.')
  try:
    try:
      raise denied
    except OSError as e:
      raise RuntimeError('save failed') from e
  except RuntimeError as wrapped:
    line = objects.failure_line(wrapped)
  assert 'gs://my-bucket' in line and 'storage.objects.create' in line
  assert objects.ROLE in line and '\n' not in line
  assert objects.failure_line(ValueError('unrelated')) is None


def test_a_step_without_its_commit_file_is_not_a_saved_step(gcs):
  from agent_tunix.run import checkpoint  # pylint: disable=g-import-not-at-top
  workdir = f'gs://{gcs.bucket}/steps'
  storage.write_text(f'{workdir}/checkpoints/1/commit_success.txt', '')
  storage.write_text(f'{workdir}/checkpoints/1/meta/metadata', '{}')
  # A save cut off before its last file (a lost connection, a kill).
  storage.write_text(f'{workdir}/checkpoints/2/meta/metadata', '{}')
  assert checkpoint.steps_on_disk(workdir) == [1]
