"""Resume after SIGKILL repeats the uninterrupted run bit for bit (CPU).

Four runs of `python -m agent_tunix.main` on the tiny model, 4 steps each,
checkpointing every step:

  A: uninterrupted.
  B: killed with SIGKILL right after checkpoint 2 is complete, then the same
     command again in the same workdir (it resumes).
  C: a copy of A's finished workdir whose newest checkpoint (4) is damaged;
     the same command falls back to checkpoint 3, sets the damaged step
     aside, repeats step 4 and saves it; evaluate then reads step 4.

Every metric except wall-clock timings must equal A's exactly, the
alarms' included (one of them fires across the kill), and the adaptive KL
coefficient `kl_coeff` (it changes every step and lives in the
checkpoint). B starts once A has saved its first checkpoint, so that B
finds A's programs in the suite's JAX compilation cache (tests/conftest.py)
instead of compiling them beside it; then B's resume and C run side by
side.
The rewards include `reward_fixtures:text_length_some_answers` so the
policy really trains (with the default rewards a random model scores the
same on every completion and nothing would change between steps).

The runs use dynamic sampling (grpo.dynamic_sampling): that fixture gives
about half of the questions no reward spread, so steps on both sides of the
kill draw further batches from the data iterator (and some reach
grpo.max_sampling_rounds and mask groups). The resumed run repeats them only
if the checkpointed iterator position covers the extra draws and the extra
rounds' seeds depend only on (seed, step, round). Everything else a step
does is the same code with or without dynamic sampling (the update, the
checkpoint, the first round's sampling seed).

A second pair of runs (A and B only) samples multi-turn episodes
(`episode_fixtures:ScriptedEnvironment`): their resume must be exact too,
transcripts included.
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import collections  # pylint: disable=g-import-not-at-top
import dataclasses
import json
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tb_events

_REPO = pathlib.Path(__file__).resolve().parents[1]
_TESTS = _REPO / 'tests'
_NUM_STEPS = 4
_KILL_AFTER = 2
# Generous: a tiny run is about a minute on an idle machine.
_TIMEOUT_S = 900
# Scalars that measure wall-clock time and so differ between any two runs.
_TIMING_TAGS = frozenset(
    {'time/rollout_s', 'time/update_s', 'tokens_per_s', 'steps_per_sec',
     'uptime'})


# Multi-turn episodes (`episode_fixtures:ScriptedEnvironment`: rows pause,
# get text inserted and resume in their KV cache), for the episode variant.
_EPISODES = (
    '--config.agent.environment=episode_fixtures:ScriptedEnvironment',
    '--config.generation.max_generation_steps=24',
)


def _command(workdir, extra=()):
  return [
      sys.executable, '-m', 'agent_tunix.main',
      '--config=configs/tiny.py',
      f'--workdir={workdir}',
      f'--config.training.num_steps={_NUM_STEPS}',
      '--config.checkpoint.save_interval_steps=1',
      '--config.checkpoint.async_save=false',
      '--config.rewards.functions='
      'format_approx=1,answer=1,reward_fixtures:text_length_some_answers=1',
      '--config.grpo.dynamic_sampling=true',
      '--config.grpo.max_sampling_rounds=3',
      # The adaptive KL coefficient changes every step and is checkpointed:
      # a resume must continue its sequence, not restart it.
      '--config.grpo.kl_target=0.001',
      '--config.grpo.kl_horizon=64',
      # The random model's completions all reach the length limit, so the
      # length_limit alarm fires from step 3 on: a resume must carry its
      # window over the kill (alarm state in the checkpoint).
      '--config.alarms.clipped_steps=3',
      *extra,
  ]


def _start(workdir, log_path, extra=()):
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(
      [str(_REPO), str(_TESTS)] +
      ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
  with open(log_path, 'wb') as log:
    return subprocess.Popen(
        _command(workdir, extra), cwd=_REPO, env=env, stdout=log,
        stderr=subprocess.STDOUT)


def _tail(log_path, lines=40):
  text = pathlib.Path(log_path).read_text(errors='replace').splitlines()
  return '\n'.join(text[-lines:])


def _wait(proc, log_path, deadline):
  try:
    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
    pytest.fail(f'{log_path.name} timed out:\n{_tail(log_path)}')
  assert proc.returncode == 0, (
      f'{log_path.name} exited with {proc.returncode}:\n{_tail(log_path)}')


def _complete_steps(workdir):
  """Checkpoint steps Orbax has finalised (renamed from the tmp name)."""
  directory = workdir / 'checkpoints'
  if not directory.is_dir():
    return []
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _await_checkpoint(proc, workdir, log_path, step, deadline):
  """Returns once checkpoint `step` of `proc`'s run is complete."""
  while step not in _complete_steps(workdir):
    if proc.poll() is not None:
      pytest.fail(f'{log_path.name} ended ({proc.returncode}) before '
                  f'checkpoint {step}:\n{_tail(log_path)}')
    if time.monotonic() > deadline:
      proc.kill()
      proc.wait()
      pytest.fail(f'No checkpoint {step} in time:\n{_tail(log_path)}')
    time.sleep(0.05)


def _kill_after_checkpoint(proc, workdir, log_path, step, deadline):
  """SIGKILLs `proc` once checkpoint `step` is complete; returns the steps."""
  _await_checkpoint(proc, workdir, log_path, step, deadline)
  time.sleep(0.2)  # Let the save return; the kill lands in the next step.
  still_running = proc.poll() is None
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert still_running, f'{log_path.name} finished before it was killed.'
  assert proc.returncode == -signal.SIGKILL
  return _complete_steps(workdir)


def _event_files(workdir):
  return sorted(pathlib.Path(workdir).glob('events.out.tfevents.*'))


def read_events(files):
  """{tag: {step: (value, plugin name)}} from `files`; the last write wins.

  Event file names start with their creation time, so sorted files are in
  run order and a step logged again after a resume overrides the old value.
  """
  found = collections.defaultdict(dict)
  for path in sorted(files):
    for event in tb_events.iterate(str(path)):
      for value in event.summary.value:
        found[value.tag][event.step] = (
            tb_events.make_ndarray(value.tensor),
            value.metadata.plugin_data.plugin_name)
  return found


def _snapshot(directory):
  return {
      str(p.relative_to(directory)): p.read_bytes()
      for p in sorted(directory.rglob('*')) if p.is_file()
  }


def _damage(step_dir):
  """Truncates every file of the step's LoRA arrays to half its size."""
  for path in sorted((step_dir / 'lora').rglob('*')):
    if path.is_file():
      data = path.read_bytes()
      path.write_bytes(data[:len(data) // 2])


@dataclasses.dataclass
class Runs:
  a: pathlib.Path
  b: pathlib.Path
  c: pathlib.Path
  b_killed_files: list  # B's event files when it was killed.
  b_steps_at_kill: list  # B's complete checkpoints when it was killed.
  c_old_files: list  # C's event files before its rerun (copied from A).
  damaged: dict  # {relative path: bytes} of C's damaged checkpoint.
  logs: dict  # {name: log path}


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp('resume')
  a, b, c = root / 'A', root / 'B', root / 'C'
  logs = {name: root / f'{name}.log' for name in ('A', 'B1', 'B2', 'C')}
  procs = []
  try:
    deadline = time.monotonic() + _TIMEOUT_S
    proc_a = _start(a, logs['A'])
    procs.append(proc_a)
    # By its first checkpoint A has compiled every program B needs.
    _await_checkpoint(proc_a, a, logs['A'], 1, deadline)
    proc_b = _start(b, logs['B1'])
    procs.append(proc_b)
    b_steps_at_kill = _kill_after_checkpoint(
        proc_b, b, logs['B1'], _KILL_AFTER, deadline)
    b_killed_files = _event_files(b)
    _wait(proc_a, logs['A'], deadline)

    shutil.copytree(a, c)
    c_old_files = _event_files(c)
    _damage(c / 'checkpoints' / str(_NUM_STEPS))
    damaged = _snapshot(c / 'checkpoints' / str(_NUM_STEPS))

    deadline = time.monotonic() + _TIMEOUT_S
    proc_b2 = _start(b, logs['B2'])
    procs.append(proc_b2)
    proc_c = _start(c, logs['C'])
    procs.append(proc_c)
    _wait(proc_b2, logs['B2'], deadline)
    _wait(proc_c, logs['C'], deadline)
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  return Runs(a, b, c, b_killed_files, b_steps_at_kill, c_old_files,
              damaged, logs)


def _assert_same_scalars(expected, got, steps, what):
  """Every non-timing scalar of `expected` at `steps` is equal in `got`."""
  compared = set()
  for tag, by_step in expected.items():
    if tag in _TIMING_TAGS:
      continue
    for step in steps:
      if step not in by_step or by_step[step][1] != 'scalars':
        continue
      assert step in got[tag], f'{what}: no {tag!r} at step {step}'
      want, have = by_step[step][0], got[tag][step][0]
      assert want.dtype == have.dtype and want.tobytes() == have.tobytes(), (
          f'{what}: {tag!r} at step {step} is {have!r}, uninterrupted run '
          f'has {want!r}')
      compared.add(tag)
  # The comparison covers the quantities that depend on the whole state.
  for tag in ('loss', 'kl', 'grad_norm', 'entropy', 'reward/mean',
              'learning_rate'):
    assert tag in compared, f'{what}: {tag!r} was not compared'
  return compared


def test_killed_run_resumes_from_its_newest_checkpoint(runs):
  resumed_from = max(runs.b_steps_at_kill)
  assert _KILL_AFTER <= resumed_from < _NUM_STEPS, runs.b_steps_at_kill
  log = runs.logs['B2'].read_text(errors='replace')
  assert f'Resumed from step {resumed_from}' in log
  assert _complete_steps(runs.b)[-1] == _NUM_STEPS


def test_resumed_run_repeats_the_uninterrupted_run_exactly(runs):
  resumed_from = max(runs.b_steps_at_kill)
  a = read_events(_event_files(runs.a))
  b = read_events(_event_files(runs.b))
  new_files = [f for f in _event_files(runs.b)
               if f not in runs.b_killed_files]
  b_resumed = read_events(new_files)
  # The values compared after the kill point come from the resumed run.
  after_kill = list(range(resumed_from + 1, _NUM_STEPS + 1))
  assert sorted(b_resumed['loss']) == after_kill
  assert sorted(a['loss']) == list(range(1, _NUM_STEPS + 1))
  # Varied rewards: the policy trains, so the compared state evolves.
  assert all(a['grad_norm'][s][0] > 0 for s in a['grad_norm'])
  assert len({a['loss'][s][0].item() for s in a['loss']}) > 1
  compared = _assert_same_scalars(a, b_resumed, after_kill, 'resumed B')
  assert {'eval/accuracy', 'eval/format_accuracy',
          'eval/pass_at_k'} <= compared  # The final evaluation.
  assert {'dynamic_sampling/extra_prompts',
          'dynamic_sampling/dropped_groups'} <= compared
  # Extra batches were drawn before the kill point and after it, so the
  # resumed run depends on the restored iterator covering them.
  extra = {s: a['dynamic_sampling/extra_prompts'][s][0].item()
           for s in range(1, _NUM_STEPS + 1)}
  assert any(extra[s] > 0 for s in range(1, resumed_from + 1)), extra
  assert any(extra[s] > 0 for s in after_kill), extra
  # An alarm whose window spans the kill fires where it did in A.
  assert {s: float(v[0]) for s, v in a['alarm/length_limit'].items()} == {
      1: 0.0, 2: 0.0, 3: 1.0, 4: 1.0}
  assert 'alarm/length_limit' in compared
  # Before the kill, B was the same run as A.
  _assert_same_scalars(a, b, range(0, resumed_from + 1), 'killed B')
  for step in after_kill:
    assert b_resumed['samples'][step][0] == a['samples'][step][0], step


def test_resumed_checkpoints_match_bit_for_bit(runs):
  for step in range(max(runs.b_steps_at_kill) + 1, _NUM_STEPS + 1):
    for item in ('meta/metadata', 'data/process_0-of-1.json'):
      want = json.loads((runs.a / 'checkpoints' / str(step) / item)
                        .read_text())
      got = json.loads((runs.b / 'checkpoints' / str(step) / item)
                       .read_text())
      # meta holds checksums of every LoRA and optimizer array.
      assert got == want, (step, item)


def test_damaged_checkpoint_is_set_aside_and_the_rerun_saved(runs):
  log = runs.logs['C'].read_text(errors='replace')
  assert f'Checkpoint step {_NUM_STEPS}' in log
  assert 'could not be restored' in log
  assert f'Resumed from step {_NUM_STEPS - 1}' in log
  # The damaged step is kept, byte for byte, in a clearly named folder.
  aside = sorted((runs.c / 'checkpoints').glob(f'damaged-step-{_NUM_STEPS}-*'))
  assert len(aside) == 1, aside
  assert f'moved aside to {aside[0]}' in log
  assert _snapshot(aside[0]) == runs.damaged
  # The rerun's step 4 is saved (not skipped as "already exists") and equals
  # the uninterrupted run's step 4.
  assert 'already exists' not in log
  assert _complete_steps(runs.c) == [2, 3, 4]
  for item in ('meta/metadata', 'data/process_0-of-1.json'):
    want = json.loads((runs.a / 'checkpoints' / str(_NUM_STEPS) / item)
                      .read_text())
    got = json.loads((runs.c / 'checkpoints' / str(_NUM_STEPS) / item)
                     .read_text())
    assert got == want, item
  # Step 4, repeated from checkpoint 3, matches the uninterrupted run.
  a = read_events(_event_files(runs.a))
  new_files = [f for f in _event_files(runs.c) if f not in runs.c_old_files]
  c = read_events(new_files)
  assert sorted(c['loss']) == [_NUM_STEPS]
  _assert_same_scalars(a, c, [_NUM_STEPS], 'rerun C')
  np.testing.assert_equal(c['samples'][_NUM_STEPS][0],
                          a['samples'][_NUM_STEPS][0])
  # evaluate reads the rerun's step 4.
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_REPO), str(_TESTS)]))
  out = subprocess.run(
      [sys.executable, '-m', 'agent_tunix.evaluate',
       '--config=configs/tiny.py', f'--workdir={runs.c}'],
      cwd=_REPO, env=env, capture_output=True, text=True,
      timeout=_TIMEOUT_S, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert json.loads(out.stdout.strip().splitlines()[-1])['step'] == _NUM_STEPS


@pytest.fixture(scope='module')
def episode_runs(tmp_path_factory):
  """(A, B): uninterrupted and killed-then-resumed runs with episodes."""
  root = tmp_path_factory.mktemp('resume_episodes')
  a, b = root / 'A', root / 'B'
  logs = {name: root / f'{name}.log' for name in ('A', 'B1', 'B2')}
  procs = []
  try:
    deadline = time.monotonic() + _TIMEOUT_S
    proc_a = _start(a, logs['A'], _EPISODES)
    procs.append(proc_a)
    _await_checkpoint(proc_a, a, logs['A'], 1, deadline)
    proc_b = _start(b, logs['B1'], _EPISODES)
    procs.append(proc_b)
    steps = _kill_after_checkpoint(proc_b, b, logs['B1'], _KILL_AFTER,
                                   deadline)
    killed_files = _event_files(b)
    _wait(proc_a, logs['A'], deadline)
    proc_b2 = _start(b, logs['B2'], _EPISODES)
    procs.append(proc_b2)
    _wait(proc_b2, logs['B2'], time.monotonic() + _TIMEOUT_S)
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  return a, b, max(steps), killed_files


def test_resumed_episode_run_repeats_the_uninterrupted_run_exactly(
    episode_runs):
  a_dir, b_dir, resumed_from, killed_files = episode_runs
  a = read_events(_event_files(a_dir))
  b_resumed = read_events(
      [f for f in _event_files(b_dir) if f not in killed_files])
  after_kill = list(range(resumed_from + 1, _NUM_STEPS + 1))
  assert sorted(b_resumed['loss']) == after_kill
  compared = _assert_same_scalars(a, b_resumed, after_kill, 'resumed B')
  # Episodes happened (rows got inserts) and their metrics were compared.
  assert {'agent/turns_mean', 'agent/tool_tokens_mean'} <= compared
  assert max(v[0].item() for v in a['agent/tool_tokens_mean'].values()) > 0
  for step in after_kill:  # The transcripts, too.
    assert b_resumed['samples'][step][0] == a['samples'][step][0], step

