"""Faults a tester would try, on the tiny model (CPU).

Divergence never reaches a checkpoint; each refusal names the culprit and
the fix.
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import json  # pylint: disable=g-import-not-at-top
import logging as py_logging
import pathlib
import signal
import subprocess
import sys
import time

from absl import logging
import pytest

from agent_tunix.run import checkpoint
from agent_tunix.run import divergence
from agent_tunix.run import full_disk
from agent_tunix.run import resolved_config
from agent_tunix.run import train
from agent_tunix.configs import tiny
import reward_fixtures

_REPO = pathlib.Path(__file__).resolve().parents[1]
_TIMEOUT_S = 600


def _config(**overrides):
  config = tiny.get_config()
  for key, value in overrides.items():
    section, field = key.split('.')
    config[section][field] = value
  return config


def _steps(workdir):
  directory = pathlib.Path(workdir) / 'checkpoints'
  if not directory.is_dir():
    return []
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def test_divergence_saves_nothing_and_a_sane_rerun_trains(tmp_path):
  workdir = str(tmp_path)
  # Padded rows: their forward check overflows after step 1's update; on
  # packed rows it stays finite one step longer (grad_norm at step 2).
  bad = _config(**{'optimizer.learning_rate': 1e30,
                   'grpo.pack_sequences': False,
                   'optimizer.warmup_ratio': 0.0,
                   'training.num_steps': 3,
                   'checkpoint.save_interval_steps': 1,
                   'checkpoint.async_save': False})
  with pytest.raises(FloatingPointError) as error:
    train.train_and_evaluate(bad, workdir)
  message = str(error.value)
  # Step 1's update blew the LoRA params up: it is the diverged step.
  assert 'step 1' in message, message
  assert 'no checkpoint was saved' in message, message
  assert 'learning_rate (now 1e+30' in message, message
  # Clipping is already on (0.1): the hint does not ask for it.
  assert 'max_grad_norm' not in message, message
  assert 'warmup_ratio > 0' in message, message
  assert _steps(workdir) == []
  # A rerun with a sane learning rate is not poisoned by the failed run.
  good = _config(**{'training.num_steps': 2,
                    'checkpoint.async_save': False})
  result = train.train_and_evaluate(good, workdir)
  assert result['step'] == 2
  assert _steps(workdir) == [1, 2]


@pytest.mark.parametrize('clip, warmup, asks_clip, asks_warmup', [
    (0.1, 0.1, False, False),
    (0.0, 0.1, True, False),
    (0.1, 0.0, False, True),
])
def test_divergence_hint_fits_the_config(clip, warmup, asks_clip,
                                         asks_warmup):
  config = _config(**{'optimizer.max_grad_norm': clip,
                      'optimizer.warmup_ratio': warmup})
  text = divergence.hint(config, ['loss'])
  assert 'learning_rate' in text
  assert ('max_grad_norm' in text) == asks_clip
  assert ('warmup_ratio' in text) == asks_warmup
  assert 'reward' in divergence.hint(config, ['reward/mean'])
  assert 'learning_rate' not in divergence.hint(config, ['reward/mean'])


def test_crash_inside_a_step_saves_the_last_completed_step(tmp_path):
  workdir = str(tmp_path)
  reward_fixtures.CALLS['fail_on_third_call'] = 0
  config = _config(**{
      'training.num_steps': 6,
      'checkpoint.save_interval_steps': 0,
      'checkpoint.async_save': True,
      'rewards.functions': 'format_approx=1,'
                           'reward_fixtures:fail_on_third_call=1',
  })
  with pytest.raises(RuntimeError, match='reward server went away'):
    train.train_and_evaluate(config, workdir)
  # Written when the error comes out (a process exiting on it does not wait
  # for Orbax's background write): no '2.orbax-checkpoint-tmp' left.
  assert sorted(p.name for p in (tmp_path / 'checkpoints').iterdir()) == ['2']
  # The saved data position is after step 2's batch (not step 3's): the
  # resumed run reads the batch the crashed step read.
  session = train.setup(config, str(tmp_path / 'fresh'))
  next(session.train_iter)
  next(session.train_iter)
  saved = json.loads(
      (tmp_path / 'checkpoints/2/data/process_0-of-1.json').read_text())
  assert saved == json.loads(json.dumps(session.train_iter.get_state()))


def test_a_full_disk_saves_nothing_more_and_says_so(tmp_path):
  workdir = str(tmp_path)
  reward_fixtures.CALLS['disk_full_on_fourth_call'] = 0
  config = _config(**{
      'training.num_steps': 6,
      'checkpoint.save_interval_steps': 2,
      'rewards.functions': 'format_approx=1,'
                           'reward_fixtures:disk_full_on_fourth_call=1',
  })
  with pytest.raises(Exception) as error:
    train.train_and_evaluate(config, workdir)
  full = full_disk.no_space_error(error.value)
  assert full is not None, error.value
  # Step 2 (the periodic save) is kept whole; step 3 completed, but with
  # the disk full no save of it is tried (it would only leave a partial
  # step and more errors behind).
  assert sorted(p.name for p in (tmp_path / 'checkpoints').iterdir()) == ['2']
  assert full_disk.message(full).startswith(
      'No space left on device writing /w/scores.json. Free space')


def _wait_for(path, text, proc, deadline):
  while text not in path.read_text(errors='replace'):
    assert proc.poll() is None, path.read_text(errors='replace')[-3000:]
    assert time.monotonic() < deadline, 'timed out waiting for ' + text
    time.sleep(0.2)


def test_ctrl_c_finishes_the_step_saves_and_exits_cleanly(tmp_path):
  workdir, log = tmp_path / 'run', tmp_path / 'log.txt'
  env = dict(os.environ, PYTHONPATH=str(_REPO))
  # Python ignores SIGINT if its parent did (background jobs of a
  # non-interactive shell): start the child with the default handler.
  with open(log, 'wb') as out:
    proc = subprocess.Popen(
        [sys.executable, '-m', 'agent_tunix.main', '--config=configs/tiny.py',
         f'--workdir={workdir}', '--config.training.num_steps=100',
         '--config.checkpoint.save_interval_steps=0'],
        cwd=_REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  try:
    _wait_for(log, '] [2] ', proc, time.monotonic() + _TIMEOUT_S)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=_TIMEOUT_S)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  text = log.read_text(errors='replace')
  assert proc.returncode == 3, text[-3000:]  # cli.KILLED, step saved.
  assert 'SIGINT received' in text
  assert 'Traceback' not in text, text[-3000:]
  # Orbax's INFO lines are quiet on the console by default.
  assert 'checkpoint_manager.py' not in text
  # The result's JSON line, then one line saying how to go on.
  lines = text.strip().splitlines()
  assert 'rerun the same command to go on' in lines[-1]
  result = json.loads(lines[-2])
  assert result['preempted'] is True
  stopped = result['step']
  assert 2 <= stopped < 100
  assert f'Stopped after step {stopped}, saved in' in text
  assert _steps(workdir) == [stopped]


def test_resume_refuses_a_config_that_changes_what_was_trained(tmp_path,
                                                                caplog):
  workdir = str(tmp_path)
  first = _config(**{'training.num_steps': 1,
                     'checkpoint.async_save': False})
  assert train.train_and_evaluate(first, workdir)['step'] == 1
  stored = json.loads((tmp_path / 'config.json').read_text())
  assert stored['model.lora_alpha'] == 8.0
  # Twice the LoRA scale and another seed: refused, before any weight is
  # read, with old and new values and the fix.
  changed = _config(**{'training.num_steps': 1, 'model.lora_alpha': 64.0,
                       'training.seed': 7})
  with pytest.raises(resolved_config.ConfigChangedError) as error:
    train.setup(changed, workdir)
  message = str(error.value)
  assert 'config.model.lora_alpha: 8.0 (trained) -> 64.0 (now)' in message
  assert 'config.training.seed: 42 (trained) -> 7 (now)' in message
  assert 'new --workdir' in message and len(message) < 1000
  # A preset change lists a few fields, not a 78 KB dump.
  other = _config(**{'model.preset': 'gemma3_270m', 'model.lora_rank': 8})
  with pytest.raises(resolved_config.ConfigChangedError) as error:
    train.setup(other, workdir)
  assert len(str(error.value)) < 1000
  # Safe fields change and are logged.
  # (A longer run needs a new schedule: run/schedule.py.)
  longer = _config(**{'training.num_steps': 2, 'eval.eval_every_n_steps': 1,
                      'checkpoint.async_save': False,
                      'training.reset_schedule': True})
  # On absl's own logger, at INFO: earlier tests in the same process may
  # have stopped it propagating or raised its level.
  absl_logger = py_logging.getLogger('absl')
  verbosity = logging.get_verbosity()
  absl_logger.addHandler(caplog.handler)
  logging.set_verbosity(logging.INFO)
  try:
    assert train.train_and_evaluate(longer, workdir)['step'] == 2
  finally:
    absl_logger.removeHandler(caplog.handler)
    logging.set_verbosity(verbosity)
  assert 'Resuming with config.training.num_steps changed: 1 -> 2' in (
      caplog.text)


def test_a_good_checkpoint_of_another_shape_is_not_called_damaged(tmp_path):
  workdir = str(tmp_path)
  first = _config(**{'training.num_steps': 1,
                     'checkpoint.async_save': False})
  train.train_and_evaluate(first, workdir)
  (tmp_path / 'config.json').unlink()  # As a run made before config.json.
  session = train.setup(_config(**{'model.lora_rank': 8}), workdir)
  with pytest.raises(checkpoint.RestoreError) as error:
    train.run(session)
  message = str(error.value)
  assert 'damaged' not in message.replace('not damaged', '')
  assert 'different model or LoRA' in message
  assert _steps(workdir) == [1]


def _evaluate(*args):
  return subprocess.run(
      [sys.executable, '-m', 'agent_tunix.evaluate',
       '--config=configs/tiny.py', *args], cwd=_REPO,
      env=dict(os.environ, PYTHONPATH=str(_REPO)), capture_output=True,
      text=True, timeout=_TIMEOUT_S, check=False)


def test_evaluate_refuses_a_workdir_without_checkpoints(tmp_path):
  typo = tmp_path / 'runn'
  out = _evaluate(f'--workdir={typo}')
  assert out.returncode != 0 and out.stdout == ''
  assert f'--workdir={typo} does not exist' in out.stderr
  assert not typo.exists()  # A reader creates nothing.
  empty = tmp_path / 'empty'
  empty.mkdir()
  out = _evaluate(f'--workdir={empty}')
  assert out.returncode != 0
  assert 'has no checkpoint' in out.stderr and '--allow_base' in out.stderr
  assert list(empty.iterdir()) == []
  out = _evaluate()
  assert out.returncode != 0 and 'no --workdir given' in out.stderr
  # Asked for: the base model is scored (step null), nothing is written.
  out = _evaluate(f'--workdir={empty}', '--allow_base')
  assert out.returncode == 0, out.stderr[-3000:]
  assert json.loads(out.stdout.strip().splitlines()[-1])['step'] is None
  assert list(empty.iterdir()) == []


def test_compare_allows_divergence_fixes_and_refuses_the_rest():
  stored = resolved_config.flatten(_config())
  changed = _config(**{'optimizer.learning_rate': 1e-5,
                       'optimizer.max_grad_norm': 0.5,
                       'optimizer.b1': 0.5, 'data.seed': 3})
  refused, allowed, one_sided = resolved_config.compare(stored, changed)
  assert [f for f, _, _ in allowed] == ['optimizer.learning_rate',
                                        'optimizer.max_grad_norm']
  assert [f for f, _, _ in refused] == ['data.seed', 'optimizer.b1']
  assert one_sided == []
