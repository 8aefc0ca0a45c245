"""CLI errors: one line for user errors, 'No space left' kept visible."""

import errno
import logging as py_logging
import os
import pathlib
import subprocess
import sys

from absl import logging

from agent_tunix import errors

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
  assert out.returncode == 1
  assert 'Traceback' not in out.stderr, out.stderr[-3000:]
  assert out.stderr.strip().splitlines()[-1] == (
      'error: config.optimizer.learning_rate=inf must be a finite number.')
  assert not (tmp_path / 'run').exists()
  out = _main(*args, '--traceback')
  assert out.returncode == 1 and 'Traceback' in out.stderr


def test_a_bad_data_row_is_one_line_naming_file_and_line(tmp_path):
  data = tmp_path / 'train.jsonl'
  data.write_text('{"question": "Ann has 3 pens.", "answer": "#### 3"}\n'
                  '{"question": "How many?", "answer": "seven"}\n')
  out = _main(f'--workdir={tmp_path / "run"}', '--config.data.source=jsonl',
              f'--config.data.path={data}')
  assert out.returncode == 1
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
    found = errors.no_space_error(outer)
  assert found is not None and found.errno == errno.ENOSPC
  assert 'No space left on device' in str(found)
  assert errors.no_space_error(ValueError('other')) is None


def test_orbax_info_lines_are_quiet_unless_verbose():
  quiet = errors._QuietThirdParty()

  def record(path, level):
    return py_logging.LogRecord('absl', level, path, 1, 'msg', (), None)

  orbax = '/venv/site-packages/orbax/checkpoint/checkpoint_manager.py'
  assert not quiet.filter(record(orbax, py_logging.INFO))
  assert quiet.filter(record(orbax, py_logging.WARNING))
  assert quiet.filter(record('/w/agent_tunix/train.py', py_logging.INFO))
  before = logging.get_verbosity()
  logging.set_verbosity(logging.DEBUG)
  try:
    assert quiet.filter(record(orbax, py_logging.INFO))
  finally:
    logging.set_verbosity(before)
