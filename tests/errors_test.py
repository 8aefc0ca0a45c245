"""CLI errors: one line for user errors, 'No space left' kept visible."""

import errno
import logging as py_logging
import os
import pathlib
import subprocess
import sys

from absl import flags
from absl import logging
import pytest

from agent_tunix.run import errors
from agent_tunix.run import full_disk

_REPO = pathlib.Path(__file__).resolve().parents[1]


def _main(*args):
  return subprocess.run(
      [sys.executable, '-m', 'agent_tunix.main', '--config=configs/tiny.py',
       *args], cwd=_REPO, env=dict(os.environ, PYTHONPATH=str(_REPO)),
      capture_output=True, text=True, timeout=300, check=False)


def test_user_error_is_one_line_and_traceback_on_request(tmp_path):
  args = (f'--workdir={tmp_path / "run"}',
          '--config.optimizer.learning_rate=inf')
  out = _main(*args)
  assert out.returncode == 2  # A config error (agent_tunix/cli.py).
  assert 'Traceback' not in out.stderr, out.stderr[-3000:]
  assert out.stderr.strip().splitlines()[-1] == (
      'error: config.optimizer.learning_rate=inf must be a finite number.')
  assert not (tmp_path / 'run').exists()
  out = _main(*args, '--traceback')
  assert out.returncode != 0 and 'Traceback' in out.stderr


def test_a_bad_data_row_is_one_line_naming_file_and_line(tmp_path):
  data = tmp_path / 'train.jsonl'
  data.write_text('{"question": "Ann has 3 pens.", "answer": "#### 3"}\n'
                  '{"question": "How many?", "answer": "seven"}\n')
  out = _main(f'--workdir={tmp_path / "run"}', '--config.data.source=jsonl',
              f'--config.data.path={data}')
  # The data are opened before any weight: a usage error, exit 2.
  assert out.returncode == 2
  assert 'Traceback' not in out.stderr, out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith(f'error: {data} line 2: ') and 'bad_rows' in last


def test_no_space_left_is_found_in_the_chain():
  try:
    try:
      raise OSError(errno.ENOSPC, 'No space left on device', '/w/ckpt')
    except OSError as e:
      raise RuntimeError('async save failed') from e
  except RuntimeError as outer:
    found = full_disk.no_space_error(outer)
  assert found is not None and found.errno == errno.ENOSPC
  assert 'No space left on device' in str(found)
  assert full_disk.no_space_error(ValueError('other')) is None
  # A wrapper quoting the OSError's text is passed over for the OSError.
  try:
    try:
      raise OSError(errno.ENOSPC, 'No space left on device', '/w/a.json')
    except OSError as e:
      raise RuntimeError(f'reward raised {e}') from e
  except RuntimeError as outer:
    assert full_disk.no_space_error(outer).errno == errno.ENOSPC


# What an Orbax save on a full disk raised (tiny run, 1 MiB tmpfs workdir).
_TENSORSTORE_FULL = (
    'RESOURCE_EXHAUSTED: Error writing "opt_state.1.0.mu.layers.0.attn.'
    'kv_einsum.w_lora_a/0.0" in OCDBT database at local file "/mnt/full/w/'
    'checkpoints/4.orbax-checkpoint-tmp/opt.orbax-checkpoint-tmp/'
    'ocdbt.process_0/": Failed to write 3892 bytes to file 5: No space '
    "left on device [os_error_code='28']")


@pytest.mark.parametrize('error, where', [
    (ValueError(_TENSORSTORE_FULL),
     ' writing /mnt/full/w/checkpoints/4.orbax-checkpoint-tmp/'
     'opt.orbax-checkpoint-tmp/ocdbt.process_0/.'),
    (OSError(errno.ENOSPC, 'No space left on device', '/w/events'),
     ' writing /w/events.'),
    (OSError(errno.ENOSPC, 'No space left on device'), '.'),
    # What TensorBoard's writer raised (48 KiB tmpfs workdir): a bare path.
    (ValueError('{{function_node __wrapped__WriteSummary_device_/job:'
                'localhost/replica:0/task:0/device:CPU:0}} /mnt/full/w/'
                'events.out.tfevents.1.v2; No space left on device'),
     ' writing /mnt/full/w/events.out.tfevents.1.v2.'),
])
def test_a_full_disk_is_one_last_line_naming_the_path(error, where,
                                                      capsys, caplog):
  def main(argv):
    del argv
    try:
      raise error
    except Exception as e:
      raise RuntimeError('async save failed') from e

  flags.FLAGS.mark_as_parsed()
  with pytest.raises(SystemExit) as exit_:
    errors.cli(main)(['main'])
  assert exit_.value.code == 1
  last = capsys.readouterr().err.strip().splitlines()[-1]
  assert last == (
      f'error: No space left on device{where} Free space on that disk (or '
      'use another --workdir) and rerun the same command: training resumes '
      'from the newest complete checkpoint.')
  # The original message is kept in the log.
  assert str(error) in caplog.text


def test_orbax_info_lines_are_quiet_unless_verbose():
  quiet = errors._QuietThirdParty()

  def record(path, level):
    return py_logging.LogRecord('absl', level, path, 1, 'msg', (), None)

  def failed(path):
    try:
      raise ValueError('RESOURCE_EXHAUSTED')
    except ValueError:
      return py_logging.LogRecord('absl', py_logging.ERROR, path, 1, 'failed',
                                  (), sys.exc_info())

  orbax = '/venv/site-packages/orbax/checkpoint/checkpoint_manager.py'
  assert not quiet.filter(record(orbax, py_logging.INFO))
  assert quiet.filter(record(orbax, py_logging.WARNING))
  assert quiet.filter(record('/w/agent_tunix/run/train.py', py_logging.INFO))
  # Orbax's and gcsfs's error lines stay, without their tracebacks; ours
  # keep theirs; gcsfs's INFO lines stay.
  error = failed(orbax)
  assert quiet.filter(error) and error.exc_info is None
  gcsfs = '/venv/site-packages/gcsfs/retry.py'
  error = failed(gcsfs)
  assert quiet.filter(error) and error.exc_info is None
  assert quiet.filter(record('/venv/site-packages/gcsfs/core.py',
                             py_logging.INFO))
  ours = failed('/w/agent_tunix/run/train.py')
  assert quiet.filter(ours) and ours.exc_info is not None
  before = logging.get_verbosity()
  logging.set_verbosity(logging.DEBUG)
  try:
    assert quiet.filter(record(orbax, py_logging.INFO))
    error = failed(orbax)
    assert quiet.filter(error) and error.exc_info is not None
  finally:
    logging.set_verbosity(before)
