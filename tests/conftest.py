"""Test-wide settings, applied before jax is imported by any test module.

Tests run on CPU. XLA's backend optimisation level 0 roughly halves compile
time, which dominates this suite's tiny-model tests; it changes speed, not
results that the tests compare (every comparison is made within one run).
Subprocesses started by tests inherit these variables.
"""

import logging
import os
import shutil
import tempfile

import pytest

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
if '--xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (
      os.environ.get('XLA_FLAGS', '') + ' --xla_backend_optimization_level=0'
  ).strip()

# One persistent XLA compilation cache for the whole run, shared by both
# pytest-xdist workers and every subprocess a test starts (they inherit the
# variable): the tiny presets' programs are compiled once, not once per
# `agent_tunix.main` a test runs. The controller creates it before the
# workers start and removes it at the end; a cache set by the caller is
# used as it is and kept.
_OWN_CACHE_VAR = 'AGENT_TUNIX_TEST_OWNS_JAX_CACHE'
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(
      prefix='agent_tunix_test_jax_cache_')
  os.environ[_OWN_CACHE_VAR] = str(os.getpid())
# Every program, however small: a tiny run's model build compiles ~150
# small ones (well under half a second each) that a later process would
# compile again. Caching them too took the fast tier from 588 to 529
# CPU-seconds (measured back to back under the same load), and a warm
# `agent_tunix.main` of configs/tiny.py from about 21 to about 13.
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')

# The longest files (minutes each on 2 cores), longest first. With `-n 2
# --dist loadfile` every file runs whole on one worker, in collection
# order: starting the long ones first keeps both workers busy to the end
# instead of leaving one long file running alone at the tail. They are the
# `slow` tier: `-m 'not slow'` runs the rest (README, "Tests").
_LONG_FILES = (
    'multihost_test.py', 'resume_test.py', 'gemma4_test.py',
    'gemma4_export_test.py', 'bench_test.py', 'pod_rehearsal_test.py',
    'preflight_test.py', 'sharding_test.py',
    'grpo_test.py', 'alarms_test.py', 'train_test.py', 'faults_test.py',
    'sweep_test.py', 'export_test.py', 'judge_run_test.py',
    'schedule_test.py', 'cli_test.py', 'launch_test.py',
    'gcs_commands_test.py',
)


def pytest_configure(config):
  config.addinivalue_line(
      'markers', 'slow: a test of the long files (tests/conftest.py '
      "_LONG_FILES); -m 'not slow' leaves them out")
  # pytest-xdist (3.x) hands out files with the most tests first unless
  # told not to: that put the long files, which have few tests each
  # (resume_test 5, multihost_test 2), at the end of the run, one of them
  # often running alone while the other worker sat idle. Keep the order
  # below (the --no-loadscope-reorder flag, set here so that every
  # command line gets it).
  if hasattr(config.option, 'loadscopereorder'):
    config.option.loadscopereorder = False


@pytest.fixture(autouse=True)
def _absl_logger_level_as_found():
  """Puts absl's logger level back after each test.

  absl's `logging.set_verbosity` sets that logger's own level when absl's
  handler is not installed (as under pytest): a test that sets the
  verbosity and then "restores" it leaves the logger at WARNING (verbosity
  -1), where it was NOTSET, and a later test on the same worker that reads
  INFO lines through caplog sees none. Which tests share a worker depends
  on xdist's scheduling, so such a leak shows up only on some runs.
  """
  absl_logger = logging.getLogger('absl')
  level = absl_logger.level
  yield
  absl_logger.setLevel(level)


def pytest_unconfigure(config):
  del config
  if os.environ.get(_OWN_CACHE_VAR) == str(os.getpid()):
    shutil.rmtree(os.environ['JAX_COMPILATION_CACHE_DIR'], ignore_errors=True)


def pytest_collection_modifyitems(items):
  """Marks the long files slow and runs them first (stable: other files
  keep their order)."""
  rank = {name: i for i, name in enumerate(_LONG_FILES)}
  for item in items:
    if item.path.name in rank:
      item.add_marker('slow')
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
