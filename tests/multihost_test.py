"""Two JAX processes train like one: `main --multihost` over loopback (CPU).

Two processes with 2 fake CPU devices each (one 4-device mesh, CPU
collectives over gloo) run 2 GRPO steps of the tiny model through
`python -m agent_tunix.main --multihost --coordinator_address=127.0.0.1:PORT
--num_processes=2 --process_id=I`, next to a reference run of the same
config as one process with 4 devices. Each process reads its own half of
every batch; the sampled completions, rewards, losses and updates must be
those of the single process (within float tolerance: sums over devices of
different processes may round differently).

The rewards include `reward_fixtures:text_length_some_answers`, so
advantages are not all zero, and beta > 0, so the second step's loss (its KL
term) is not zero. That reward gives about half of the questions no spread,
and the runs use dynamic sampling: each step draws further batches (the
same number on every process, decided from every process's rewards), and
the groups chosen from all of them are split over the processes as one
process would order them; the checks below then also cover that the two
processes took the same decisions as the single one.

The runs come in two variants. In one, single-turn rubric rows are judged
by the in-process Gemma judge, whose calls are collectives over both
processes. In the other, multi-turn episodes
(`episode_fixtures:ScriptedEnvironment`: every row pauses, gets text
inserted twice and resumes in its KV cache), so the two processes must
also insert the same tokens and produce the single process's episodes;
there the reward spread is the text-length fixture's, so dynamic sampling
draws further prompts. (A third, plain single-turn variant was a subset of
these two and was dropped to keep the suite's time.)

All three processes start together and are killed if any fails or the
deadline passes. The episode variant's 2-process job's workdir is on gs://
(the Cloud Storage API on loopback, tests/gcs_emulator.py): both processes
write their parts of the checkpoints there, process 0 the lock, the
events and the config; it is copied back to a local folder for the checks.
"""

import collections
import contextlib
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import portpicker
import pytest

import gcs_emulator
from agent_tunix import storage

_REPO = pathlib.Path(__file__).resolve().parents[1]
_TESTS = _REPO / 'tests'
# Generous: the three runs take about 4.5 CPU-minutes in all.
_TIMEOUT_S = 900
_RTOL = 1e-5
_NUM_STEPS = 2
# Wall-clock scalars differ between any two runs.
_TIMING_TAGS = frozenset(
    {'time/rollout_s', 'time/update_s', 'tokens_per_s', 'steps_per_sec',
     'uptime'} | {f'{prefix}judge/{tag}' for prefix in ('', 'eval/')
                  for tag in ('wall_s', 'time_share', 'latency_s/p50',
                              'latency_s/p95')})
_OVERRIDES = (
    f'--config.training.num_steps={_NUM_STEPS}',
    '--config.training.batch_size=4',  # 2 prompts per process.
    '--config.training.micro_batch_size=2',
    '--config.grpo.beta=0.04',
    '--config.eval.pass_at_k=0',
    '--config.rewards.functions='
    'format_approx=1,reward_fixtures:text_length_some_answers=1',
    '--config.grpo.dynamic_sampling=true',
    '--config.grpo.max_sampling_rounds=3',
)


# Extra overrides per variant of the runs.
_VARIANTS = {
    'episodes': (
        '--config.agent.environment=episode_fixtures:ScriptedEnvironment',
        '--config.generation.max_generation_steps=24',
    ),
    # Rubric rows judged by the in-process Gemma judge (the tiny model's
    # base weights): each process judges a different number of items, all
    # of them in the same batches on every process.
    'rubrics': (
        '--config.data.task=rubric', '--config.data.source=jsonl',
        '--config.data.path=agent_tunix/configs/rubrics/{split}.jsonl',
        '--config.data.reference_column=reference_answer',
        '--config.rewards.functions=rubric_judge=1',
        '--config.judge.backend=gemma', '--config.judge.canary=False',
        '--config.judge.batch_size=8',
        # As configs/gemma3_270m_rubrics.py: centred rewards. Scaled by a
        # group's small std, the judge's float round-off between 1 and 2
        # processes (~1e-7) grows past the comparison's tolerance.
        '--config.grpo.scale_rewards=none',
    ),
}


# The variant whose 2-process job writes to gs://.
_ON_GCS = 'episodes'


def _start(name, root, devices, extra, env_extra=None):
  env = dict(os.environ, **(env_extra or {}))
  env['XLA_FLAGS'] = (
      env.get('XLA_FLAGS', '') +
      f' --xla_force_host_platform_device_count={devices}').strip()
  env['JAX_PLATFORMS'] = 'cpu'
  env['JAX_CPU_COLLECTIVES_IMPLEMENTATION'] = 'gloo'
  env['PYTHONPATH'] = os.pathsep.join(
      [str(_REPO), str(_TESTS)] +
      ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
  log = root / f'{name}.log'
  command = [sys.executable, '-m', 'agent_tunix.main',
             '--config=configs/tiny.py', *_OVERRIDES, *extra]
  with open(log, 'wb') as f:
    proc = subprocess.Popen(command, cwd=_REPO, env=env, stdout=f,
                            stderr=subprocess.STDOUT)
  return name, proc, log


def _tail(path, lines=40):
  return '\n'.join(pathlib.Path(path).read_text(errors='replace')
                   .splitlines()[-lines:])


def _wait_all(jobs, deadline):
  """Waits for every job; kills them all when one fails or time runs out."""
  pending = list(jobs)
  while pending:
    for job in list(pending):
      name, proc, log = job
      if proc.poll() is None:
        continue
      pending.remove(job)
      if proc.returncode != 0:
        pytest.fail(f'{name} exited with {proc.returncode}:\n{_tail(log)}')
    if pending and time.monotonic() > deadline:
      pytest.fail(f'{[j[0] for j in pending]} still running after '
                  f'{_TIMEOUT_S} s:\n{_tail(pending[0][2])}')
    time.sleep(0.5)


@pytest.fixture(scope='module', params=sorted(_VARIANTS))
def runs(tmp_path_factory, request):
  """Runs the 2-process job and the 1-process reference side by side."""
  root = tmp_path_factory.mktemp(f'multihost_{request.param}')
  with contextlib.ExitStack() as stack:
    gcs, env = None, {}
    workdir = str(root / 'multi')
    if request.param == _ON_GCS:
      gcs = stack.enter_context(gcs_emulator.emulator('agent-tunix-multi'))
      env = gcs.env
      workdir = f'gs://{gcs.bucket}/multi'
    _run_all(root, list(_VARIANTS[request.param]), workdir, env)
    if gcs is not None:
      stack.enter_context(_env(gcs.env))
      assert gcs.list('multi/RUN_LOCK.json') == []  # Released.
      os.rename(storage.cached_copy(workdir, str(root / 'copy')),
                root / 'multi')
  return root


@contextlib.contextmanager
def _env(values):
  saved = {k: os.environ.get(k) for k in values}
  os.environ.update(values)
  try:
    yield
  finally:
    for key, value in saved.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value


def _run_all(root, variant, workdir, env):
  port = portpicker.pick_unused_port()
  multi = variant + [
      '--multihost', f'--coordinator_address=127.0.0.1:{port}',
      '--num_processes=2', f'--workdir={workdir}',
  ]
  jobs = []
  try:
    for i in range(2):
      jobs.append(_start(f'process_{i}', root, 2,
                         multi + [f'--process_id={i}'], env))
    jobs.append(_start('reference', root, 4,
                       variant + [f'--workdir={root / "one"}']))
    _wait_all(jobs, time.monotonic() + _TIMEOUT_S)
  finally:
    for _, proc, _ in jobs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()


def _read_events(workdir):
  """({tag: {step: float}}, number of event files) of a run's workdir."""
  import tb_events  # pylint: disable=g-import-not-at-top
  files = sorted(pathlib.Path(workdir).glob('events.out.tfevents.*'))
  found = collections.defaultdict(dict)
  for path in files:
    for event in tb_events.iterate(str(path)):
      for value in event.summary.value:
        if value.metadata.plugin_data.plugin_name == 'scalars':
          found[value.tag][event.step] = float(
              tb_events.make_ndarray(value.tensor))
  return found, len(files)


def test_two_processes_train_like_one(runs):
  multi, multi_files = _read_events(runs / 'multi')
  one, one_files = _read_events(runs / 'one')
  assert multi_files == one_files == 1, (multi_files, one_files)
  tags = sorted(set(one) - _TIMING_TAGS)
  assert sorted(set(multi) - _TIMING_TAGS) == tags
  assert sorted(one['loss']) == list(range(1, _NUM_STEPS + 1))
  for tag in tags:
    for step, value in one[tag].items():
      # atol: the policy term of the loss is a sum of O(1) advantages that
      # cancels to ~0, so its round-off is absolute (~1e-8), not relative.
      np.testing.assert_allclose(
          multi[tag][step], value, rtol=_RTOL, atol=1e-7,
          err_msg=f'{tag} at step {step}: 2 processes vs 1')
  # Not a trivially equal run: rewards vary, the policy moves.
  assert one['reward/std'][1] > 0
  assert one['loss'][_NUM_STEPS] != 0
  assert one['kl'][_NUM_STEPS] > 0
  # Dynamic sampling drew further prompts (compared above like every tag);
  # the judge's continuous scores leave no group without a spread.
  if 'judge/requests' not in one:
    assert sum(one['dynamic_sampling/extra_prompts'].values()) > 0
  if 'judge/requests' in one:  # Rubrics: judged (and, compared above,
    # the counts are every process's, not process 0's alone).
    assert one['judge/requests'][1] > 0
    assert 'judge/pass_rate/overall' in one
  if 'agent/turns_mean' in one:  # Episodes: rows paused and got inserts.
    assert max(one['agent/tool_tokens_mean'].values()) > 0
    assert max(one['agent/turns_mean'].values()) > 1


def test_only_process_zero_writes_metrics_and_samples(runs):
  logs = {i: (runs / f'process_{i}.log').read_text(errors='replace')
          for i in range(2)}
  assert 'Got texts' in logs[0]  # Sample completions, through the writer.
  assert 'Got texts' not in logs[1]
  assert 'Process 1 of 2, 2 local / 4 global devices' in logs[1]
  # Metric files only from process 0 (checked in the test above: one file).
  assert list((runs / 'multi').glob('events.out.tfevents.*'))


def test_checkpoint_is_written_by_both_processes(runs):
  step_dir = runs / 'multi' / 'checkpoints' / str(_NUM_STEPS)
  assert step_dir.is_dir(), sorted((runs / 'multi').rglob('*'))
  # The data iterator position is per process.
  data = sorted(p.name for p in (step_dir / 'data').glob('process_*.json'))
  assert data == ['process_0-of-2.json', 'process_1-of-2.json']


def test_multihost_without_a_cluster_fails_and_names_the_fix(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env.pop('JAX_COORDINATOR_ADDRESS', None)
  proc = subprocess.run(
      [sys.executable, '-m', 'agent_tunix.main', '--config=configs/tiny.py',
       f'--workdir={tmp_path}', '--multihost'],
      cwd=_REPO, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  assert 'jax.distributed.initialize() failed' in proc.stderr
  assert '--coordinator_address=HOST:PORT' in proc.stderr
  assert not list(tmp_path.iterdir())  # Failed before writing anything.
