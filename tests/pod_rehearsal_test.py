"""The life of a TPU VM pod, rehearsed on this machine with the real launch/.

The unchanged launch/*.sh scripts drive tests/fake_gcloud/gcloud (first on
PATH), whose TPU VM is two local workers: HOME folders under tmp_path, each
with its own tmux server, reached by `tpu-vm ssh --worker=all` and filled by
`tpu-vm scp` (see its docstring). The workdir is gs:// on the Cloud Storage
emulator (tests/gcs_emulator.py). As docs/tpu.md "Your first pod run" says:

  create.sh --spot -> setup.sh -> run.sh (configs/tiny.py; the two workers
  train as one 2-process jax.distributed job on CPU) -> logs.sh -> SIGTERM
  to both trainers (a preemption notice) -> run.sh again, which resumes
  from the checkpoint on gs:// -> tensorboard.sh --tunnel reads the events
  -> stop.sh -> delete.sh (answering its question)

and checks that the final checkpoint equals that of an uninterrupted
2-process run (the checksums in meta/metadata of the last step), that
plot (a PNG to gs://) reads the bucket afterwards, that the
worker logs are mirrored to <workdir>/logs/worker_N.log, and that the
Kaggle key and HF token set in the scripts' environment appear in no
gcloud argument, no script output and no file on the workers or in the
bucket (configs/tiny.py needs neither, so neither is sent).

What the stand-in VM image provides instead of what a TPU VM has:
- The virtualenv. setup.sh makes ~/agent_tunix_venv with pip from PyPI
  unless it exists; here the image's HOME holds ~/agent_tunix_venv as a link
  to this interpreter's environment (which has requirements.txt installed,
  jax[tpu] and libtpu included), so setup.sh skips the venv and runs its
  real pip commands, which find everything satisfied. PIP_NO_INDEX=1 in the
  image makes sure pip can neither download nor change anything: a
  requirement not satisfied fails setup.sh instead. (The alternatives fake
  more: a venv of its own would need the packages from the network, a
  stand-in pip would test nothing.) Its python3 is this machine's (>= 3.11),
  so setup.sh installs no Python; the image's `sudo` refuses.
- The pod's cluster. On a TPU VM jax.distributed.initialize() finds its
  peers in the metadata server; here run.sh is told the coordinator with
  its documented --coordinator-address=127.0.0.1:PORT --num-processes=2,
  and each worker passes its worker number (TPU_WORKER_ID, set by the fake
  ssh) as --process_id. The image's environment holds what the CPU job
  needs: JAX_PLATFORMS=cpu, gloo collectives, this suite's XLA_FLAGS, the
  emulator's STORAGE_EMULATOR_HOST (a VM reaches the real service with its
  service account) and a JAX compilation cache shared with the
  uninterrupted run, so that the three runs compile once.
- The port forward of tensorboard.sh --tunnel: the workers share this
  machine's loopback, so TensorBoard on worker 0 is asked directly.
Both workers assemble the packaged GGUF for the tokenizer in their own HOME
on their first run, as a fresh VM does.
"""

import http.client
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid

import portpicker
import pytest

import gcs_emulator

_REPO = pathlib.Path(__file__).resolve().parents[1]
_FAKE_GCLOUD_DIR = _REPO / 'tests' / 'fake_gcloud'
_WORKERS = 2
_NUM_STEPS = 4
_CONFIG = 'configs/tiny.py'
_OVERRIDES = (f'--config.training.num_steps={_NUM_STEPS}',
              '--config.checkpoint.save_interval_steps=1',
              '--config.eval.pass_at_k=0')
_SETTINGS = {
    'TPU_NAME': 'rehearsal',
    'ZONE': 'us-central2-b',
    'PROJECT': 'rehearsal-project',
    'ACCELERATOR_TYPE': 'v4-16',  # Two hosts.
    'RUNTIME_VERSION': 'tpu-ubuntu2204-base',
}
# Set in the scripts' environment; must reach no argument, log or file.
# Made at each run, so that no copy of this file (the workers get the
# tracked files) holds them.
_SECRETS = {
    'KAGGLE_USERNAME': f'kaggle-user-{uuid.uuid4().hex[:12]}',
    'KAGGLE_KEY': f'kaggle-key-{uuid.uuid4().hex}',
    'HF_TOKEN': f'hf_{uuid.uuid4().hex}',
}
_TIMEOUT_S = 600
_SESSION = 'agent_tunix'


def _wait_for(what, check, deadline, detail=lambda: ''):
  while not check():
    if time.monotonic() > deadline:
      pytest.fail(f'timed out waiting for {what}\n{detail()}')
    time.sleep(0.3)


def _read_object(gcs, name):
  """An object's bytes, straight from the emulator."""
  conn = http.client.HTTPConnection('127.0.0.1', gcs.emulator_port,
                                    timeout=30)
  conn.request('GET', f'/storage/v1/b/{gcs.bucket}/o/'
               f'{urllib.parse.quote(name, safe="")}?alt=media')
  response = conn.getresponse()
  data = response.read()
  conn.close()
  assert response.status == 200, (name, response.status)
  return data


class _Pod:
  """The stand-in cloud (fake gcloud state) and the scripts' environment."""

  def __init__(self, root, gcs, jax_cache):
    self.root = root
    self.gcs = gcs
    self.state = root / 'cloud'
    self.state.mkdir()
    image_home = root / 'image_home'
    image_home.mkdir()
    (image_home / 'agent_tunix_venv').symlink_to(sys.prefix)
    self.image_env = {
        'JAX_PLATFORMS': 'cpu',
        'JAX_CPU_COLLECTIVES_IMPLEMENTATION': 'gloo',
        'JAX_COMPILATION_CACHE_DIR': str(jax_cache),
        'XLA_FLAGS': os.environ.get('XLA_FLAGS', ''),
        'PIP_NO_INDEX': '1',
        'PIP_DISABLE_PIP_VERSION_CHECK': '1',
        **gcs.env,
    }
    (self.state / 'image.json').write_text(json.dumps({
        'workers': _WORKERS, 'env': self.image_env, 'home': str(image_home),
    }))
    local_home = root / 'local_home'
    local_home.mkdir()
    self.env = {
        'PATH': os.pathsep.join([str(_FAKE_GCLOUD_DIR),
                                 str(pathlib.Path(sys.executable).parent),
                                 '/usr/bin', '/bin']),
        'HOME': str(local_home),
        'LANG': 'C.UTF-8',
        'TMPDIR': str(root),
        'PYTHON': sys.executable,
        'JAX_PLATFORMS': 'cpu',
        'RETRY_DELAY': '1',
        'FAKE_GCLOUD_STATE': str(self.state),
        **_SETTINGS,
        **_SECRETS,
    }
    self.outputs = []  # (script, stdout, stderr) of every script run.

  def script(self, name, *args, stdin=''):
    """Runs launch/NAME; returns the CompletedProcess."""
    proc = subprocess.run(['bash', str(_REPO / 'launch' / name), *args],
                          cwd=_REPO, env=self.env, input=stdin,
                          capture_output=True, text=True, timeout=_TIMEOUT_S,
                          check=False)
    self.outputs.append((name, proc.stdout, proc.stderr))
    return proc

  def expect(self, name, *args, stdin=''):
    proc = self.script(name, *args, stdin=stdin)
    assert proc.returncode == 0, (
        f'{name} exited {proc.returncode}\n{proc.stdout[-3000:]}\n'
        f'{proc.stderr[-3000:]}')
    return proc

  def gcloud(self, verb, *args):
    """`gcloud compute tpus tpu-vm VERB ARGS` in the zone; its stdout."""
    return subprocess.run(
        ['gcloud', 'compute', 'tpus', 'tpu-vm', verb, *args,
         f'--zone={_SETTINGS["ZONE"]}', f'--project={_SETTINGS["PROJECT"]}'],
        env=self.env, capture_output=True, text=True, check=True).stdout

  def worker_root(self, i):
    return self.state / 'vms' / _SETTINGS['TPU_NAME'] / f'worker_{i}'

  def home(self, i):
    return self.worker_root(i) / 'home'

  def log(self, i):
    path = self.home(i) / 'agent_tunix_logs' / f'worker_{i}.log'
    return path.read_text(errors='replace') if path.exists() else ''

  def logs_tail(self):
    return '\n'.join(f'--- worker {i}:\n' + self.log(i)[-2500:]
                     for i in range(_WORKERS))

  def stop_workers(self):
    """Stops every worker's tmux server (and so what it runs)."""
    for tmp in self.state.glob('vms/*/worker_*/tmp'):
      subprocess.run(['tmux', 'kill-server'],
                     env={'PATH': '/usr/bin:/bin', 'TMUX_TMPDIR': str(tmp)},
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     check=False)

  def session_running(self, i):
    """Whether worker i's tmux has the agent_tunix session."""
    env = {'PATH': '/usr/bin:/bin',
           'TMUX_TMPDIR': str(self.worker_root(i) / 'tmp')}
    return subprocess.run(['tmux', 'has-session', '-t', _SESSION], env=env,
                          stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL,
                          check=False).returncode == 0

  def wait_ended(self, runs, deadline):
    """Waits until every worker's `runs`-th run has ended, mirror and all."""
    def ended():
      return all(self.log(i).count('exited with status') >= runs
                 and not (self.home(i) / 'agent_tunix_logs' / 'pid').exists()
                 and not self.session_running(i) for i in range(_WORKERS))
    _wait_for(f'run {runs} to end on every worker', ended, deadline,
              self.logs_tail)

  def trainer_pids(self):
    pids = []
    for i in range(_WORKERS):
      pid = int((self.home(i) / 'agent_tunix_logs' / 'pid').read_text())
      cmdline = pathlib.Path(f'/proc/{pid}/cmdline').read_bytes()
      assert b'agent_tunix.main' in cmdline, cmdline
      pids.append(pid)
    return pids

  def run_args(self, workdir):
    return (f'--config={_CONFIG}', f'--workdir={workdir}', *_OVERRIDES,
            '--skip-preflight',
            f'--coordinator-address=127.0.0.1:{portpicker.pick_unused_port()}',
            f'--num-processes={_WORKERS}')


def _uninterrupted_run(root, pod, workdir, deadline):
  """The reference: the same 2-process job, never stopped, run directly."""
  port = portpicker.pick_unused_port()
  env = dict(os.environ, **pod.image_env)
  procs = []
  for i in range(_WORKERS):
    with open(root / f'reference_{i}.log', 'wb') as log:
      procs.append(subprocess.Popen(
          [sys.executable, '-m', 'agent_tunix.main', f'--config={_CONFIG}',
           f'--workdir={workdir}', *_OVERRIDES, '--multihost',
           f'--coordinator_address=127.0.0.1:{port}',
           f'--num_processes={_WORKERS}', f'--process_id={i}'],
          cwd=_REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
  try:
    for i, proc in enumerate(procs):
      proc.wait(timeout=max(1.0, deadline - time.monotonic()))
      assert proc.returncode == 0, (
          (root / f'reference_{i}.log').read_text()[-3000:])
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()


def _tensorboard_steps(pod, workdir, deadline):
  """Starts tensorboard.sh --tunnel; returns the steps of its `loss`."""
  port = portpicker.pick_unused_port()
  proc = subprocess.Popen(
      ['bash', str(_REPO / 'launch' / 'tensorboard.sh'),
       f'--workdir={workdir}', '--tunnel', f'--port={port}'],
      cwd=_REPO, env=pod.env, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, start_new_session=True)

  def get(path):
    conn = http.client.HTTPConnection('localhost', port, timeout=10)
    try:
      conn.request('GET', path)
      response = conn.getresponse()
      return response.status, response.read()
    finally:
      conn.close()

  steps = []

  def loss_read():
    nonlocal steps
    assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
    try:
      status, body = get('/data/plugin/scalars/scalars?run=.&tag=loss')
    except OSError:
      return False
    if status != 200:
      return False
    steps = [point[1] for point in json.loads(body)]
    return len(steps) == _NUM_STEPS

  try:
    _wait_for('TensorBoard on worker 0 to read the loss of every step',
              loss_read, deadline, lambda: str(steps))
    status, body = get('/data/runs')
    assert status == 200 and json.loads(body) == ['.'], body
  finally:
    os.killpg(proc.pid, signal.SIGTERM)
    output = proc.communicate(timeout=30)[0].decode(errors='replace')
    pod.outputs.append(('tensorboard.sh', output, ''))
  return steps


@pytest.fixture(name='gcs')
def _gcs():
  with gcs_emulator.emulator('pod-rehearsal') as emulator:
    yield emulator


@pytest.fixture(name='pod')
def _pod(tmp_path, gcs):
  pod = _Pod(tmp_path, gcs, tmp_path / 'jax_cache')
  try:
    yield pod
  finally:
    pod.stop_workers()  # What a failed test left running.


def test_pod_life_on_local_workers(tmp_path, gcs, pod):
  deadline = time.monotonic() + _TIMEOUT_S
  workdir = f'gs://{gcs.bucket}/run'

  # The uninterrupted run first: it also fills the compilation cache.
  _uninterrupted_run(tmp_path, pod, f'gs://{gcs.bucket}/reference', deadline)

  pod.expect('create.sh', '--spot')
  assert pod.gcloud('describe', _SETTINGS['TPU_NAME'],
                    '--format=value(state,spot)') == 'READY\tTrue\n'
  setup = pod.expect('setup.sh')
  assert 'code to send to every worker:' in setup.stderr
  assert setup.stdout.count('setup done on') == _WORKERS, setup.stdout
  tracked = set(subprocess.run(
      ['git', 'ls-files'], cwd=_REPO, capture_output=True, text=True,
      check=True).stdout.splitlines())
  tracked = {p for p in tracked if (_REPO / p).exists()}
  for i in range(_WORKERS):
    code = pod.home(i) / 'agent_tunix'
    sent = {p.relative_to(code).as_posix() for p in code.rglob('*')
            if p.is_file() or p.is_symlink()}
    assert sent == tracked, sorted(sent ^ tracked)[:20]

  # First run, preempted after its first checkpoint.
  run = pod.expect('run.sh', *pod.run_args(workdir))
  assert run.stdout.count('started agent_tunix on') == _WORKERS, run.stdout
  _wait_for('worker 0 to start training',
            lambda: 'Training tiny for' in pod.log(0), deadline,
            pod.logs_tail)
  logs = pod.expect('logs.sh', '--worker=all', '--no-follow')
  for i in range(_WORKERS):
    assert f'worker {i} on t1v-n-rehearsal-w-{i}' in logs.stdout, logs.stdout
  assert 'Training tiny for' in logs.stdout
  _wait_for('the first checkpoint on gs://',
            lambda: 'run/checkpoints/1/commit_success.txt' in gcs.list(
                'run/checkpoints/'), deadline, pod.logs_tail)
  for pid in pod.trainer_pids():
    os.kill(pid, signal.SIGTERM)  # The preemption notice, on every worker.
  pod.wait_ended(1, deadline)
  for i in range(_WORKERS):
    # One job: worker i was process i of 2.
    assert f'Process {i} of {_WORKERS}, 1 local / {_WORKERS} global' in (
        pod.log(i)), pod.logs_tail()
    assert 'exited with status 3' in pod.log(i), pod.logs_tail()
  said = [line for line in pod.log(0).splitlines()
          if 'Stopped after step' in line]
  assert said, pod.logs_tail()
  step = int(said[-1].split('Stopped after step ')[1].split(',')[0])
  assert step < _NUM_STEPS, said

  # The same command again resumes from the checkpoint on gs://.
  pod.expect('run.sh', *pod.run_args(workdir))
  pod.wait_ended(2, deadline)
  resumed = pod.log(0).rsplit('=== ', 2)[1]
  assert f'Resumed from step {step} in {workdir}' in resumed, resumed[-3000:]
  for i in range(_WORKERS):
    assert pod.log(i).rstrip().endswith('exited with status 0'), (
        pod.logs_tail())

  assert _tensorboard_steps(pod, workdir, deadline) == list(
      range(1, _NUM_STEPS + 1))

  stop = pod.expect('stop.sh')
  assert stop.stdout.count('agent_tunix is not running on') == _WORKERS

  # The final checkpoint is the uninterrupted run's.
  last = f'checkpoints/{_NUM_STEPS}/meta/metadata'
  assert (json.loads(_read_object(gcs, f'run/{last}'))
          == json.loads(_read_object(gcs, f'reference/{last}')))

  # The curves of the run, drawn into a PNG on gs:// (evaluate and the
  # other readers of a gs:// workdir: tests/gcs_commands_test.py).
  env = dict(os.environ, **gcs.env)
  png = f'gs://{gcs.bucket}/plots/run.png'
  plotted = subprocess.run(
      [sys.executable, '-m', 'agent_tunix.plot', f'--workdir={workdir}',
       f'--output={png}'], cwd=_REPO, env=env, capture_output=True,
      text=True, timeout=_TIMEOUT_S, check=False)
  assert plotted.returncode == 0, plotted.stderr[-3000:]
  assert gcs.list('plots/') == ['plots/run.png']

  # Worker logs mirrored to <workdir>/logs/, the last lines included.
  for i in range(_WORKERS):
    mirrored = _read_object(gcs, f'run/logs/worker_{i}.log').decode(
        errors='replace')
    assert 'exited with status 3' in mirrored
    assert mirrored.rstrip().endswith('exited with status 0'), mirrored[-500:]
    assert pod.log(i).startswith(mirrored)

  # No credential in any gcloud argument, script output, worker file or
  # object in the bucket; none was sent (the tiny config needs none).
  texts = {'gcloud arguments': (pod.state / 'calls.jsonl').read_text()}
  for name, out, err in pod.outputs:
    texts[f'{name} output'] = out + err
  for i in range(_WORKERS):
    assert not (pod.home(i) / '.kaggle').exists()
    assert not (pod.home(i) / '.cache' / 'huggingface').exists()
    for path in pod.worker_root(i).rglob('*'):
      if (path.is_file() and not path.is_symlink()
          and path.stat().st_size < 2**21):
        texts[str(path)] = path.read_text(errors='replace')
  for name in gcs.list('run/logs/'):
    texts[name] = _read_object(gcs, name).decode(errors='replace')
  for what, text in texts.items():
    for key, secret in _SECRETS.items():
      assert secret not in text, f'{key} leaked into {what}'

  pod.expect('delete.sh', stdin='y\n')
  assert not (pod.state / 'vms' / _SETTINGS['TPU_NAME']).exists()
  assert pod.gcloud('list') == ''
  # Nothing was renamed on the store (Cloud Storage has no rename: gcsfs's
  # move is a copy and a delete, and gcp-storage-emulator answers its
  # moveTo with 501, which gcsfs retries for about 30 s).
  assert not [r for r in gcs.proxy.requests if '/moveTo/' in r[1]]


def test_queued_resource_create_and_delete(pod):
  """create.sh --queued --spot --wait and delete.sh --queued on the fake."""
  created = pod.expect('create.sh', '--queued', '--spot', '--wait')
  assert 'rehearsal is ACTIVE' in created.stderr
  assert (pod.home(_WORKERS - 1) / 'agent_tunix_venv').is_symlink()
  pod.expect('delete.sh', '--queued', '--yes')
  assert not (pod.state / 'vms' / _SETTINGS['TPU_NAME']).exists()
  assert not list((pod.state / 'queued').glob('*.json'))
