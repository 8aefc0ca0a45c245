"""Tests of the TPU launch scripts (launch/*.sh) against a fake gcloud.

A fake `gcloud` first on PATH records each call's arguments, one JSON array
per line, and can fail chosen calls. The remote command strings the scripts
hand to `gcloud ... ssh --command=` are also run here, with `bash -c`, against
fake `tmux` and trainer programs in a scratch HOME: that checks the quoting of
config overrides through every shell layer, and what the workers would do.
"""

import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import threading

import pytest

_REPO = pathlib.Path(__file__).resolve().parents[1]
_LAUNCH = _REPO / 'launch'
_SCRIPTS = ('create.sh', 'setup.sh', 'run.sh', 'logs.sh', 'tensorboard.sh',
            'stop.sh', 'delete.sh')
_SETTINGS = {
    'TPU_NAME': 't',
    'ZONE': 'z',
    'PROJECT': 'p',
    'ACCELERATOR_TYPE': 'v5litepod-16',
    'RUNTIME_VERSION': 'r',
}
_FLAGS = {
    'TPU_NAME': '--tpu-name',
    'ZONE': '--zone',
    'PROJECT': '--project',
    'ACCELERATOR_TYPE': '--accelerator-type',
    'RUNTIME_VERSION': '--runtime-version',
}
_BASIC = ('TPU_NAME', 'ZONE', 'PROJECT')
# Settings each script needs.
_NEEDS = {
    'create.sh': tuple(_SETTINGS),
    'setup.sh': _BASIC,
    'run.sh': _BASIC + ('ACCELERATOR_TYPE',),  # For the preflight.
    'logs.sh': _BASIC,
    'tensorboard.sh': _BASIC,  # with --tunnel
    'stop.sh': _BASIC,
    'delete.sh': _BASIC,
}
# Arguments that make each script do its main job.
_ARGS = {
    'create.sh': [],
    'setup.sh': [],
    'run.sh': ['--config=configs/gemma3_1b.py', '--workdir=gs://b/run'],
    'logs.sh': [],
    'tensorboard.sh': ['--workdir=gs://b/run', '--tunnel'],
    'stop.sh': [],
    'delete.sh': ['--yes'],
}
_SSH = ['compute', 'tpus', 'tpu-vm', 'ssh', 't', '--zone=z', '--project=p']
# The code is sent from a private temporary folder, written here as <tmp>.
_SCP = ['compute', 'tpus', 'tpu-vm', 'scp', '--recurse', '<tmp>/agent_tunix',
        't:~/agent_tunix', '--worker=all', '--zone=z', '--project=p']
_TMP = re.compile(r'^.*/agent_tunix_launch\.[A-Za-z0-9]+(?=/|$)')

_FAKE_GCLOUD = r"""#!/bin/bash
# Fake gcloud: appends its arguments to $FAKE_GCLOUD_LOG as a JSON array on
# one line. Call number i (from 0) fails with $FAKE_GCLOUD_FAIL_RC (1) when
# i < $FAKE_GCLOUD_FAIL_FIRST or i is in $FAKE_GCLOUD_FAIL_CALLS (comma
# separated); otherwise prints $FAKE_GCLOUD_STDOUT and exits 0. Written in
# bash rather than Python to keep the tests fast.
json_string() {
  local s="$1"
  s="${s//\\/\\\\}"
  s="${s//\"/\\\"}"
  s="${s//$'\n'/\\n}"
  s="${s//$'\t'/\\t}"
  printf '"%s"' "$s"
}
calls=0
if [[ -f "$FAKE_GCLOUD_LOG" ]]; then
  calls=$(wc -l < "$FAKE_GCLOUD_LOG")
fi
line='[' sep=''
for arg in "$@"; do
  line+="$sep$(json_string "$arg")"
  sep=', '
done
echo "$line]" >> "$FAKE_GCLOUD_LOG"
# An scp's local sources are copied (modes kept) to $FAKE_GCLOUD_SENT/<call>/
# as they are at the time of the call: the scripts remove them at exit.
if [[ "$4" == scp && -n "${FAKE_GCLOUD_SENT:-}" ]]; then
  mkdir -p "$FAKE_GCLOUD_SENT/$calls"
  for arg in "${@:5}"; do
    if [[ "$arg" != -* && "$arg" != *:* && -e "$arg" ]]; then
      cp -pR "$arg" "$FAKE_GCLOUD_SENT/$calls/"
    fi
  done
fi
if ((calls < ${FAKE_GCLOUD_FAIL_FIRST:-0})) ||
  [[ ",${FAKE_GCLOUD_FAIL_CALLS:-}," == *",$calls,"* ]]; then
  echo "fake gcloud: failing call $calls" >&2
  exit "${FAKE_GCLOUD_FAIL_RC:-1}"
fi
printf '%s' "${FAKE_GCLOUD_STDOUT:-}"
"""

# Fake tmux for running remote commands here: the session exists while the
# file $HOME/tmux_session does; new-session runs its command to the end.
_FAKE_TMUX = """#!/bin/bash
echo "$*" >> "$HOME/tmux.log"
case "$1" in
  has-session) [ -e "$HOME/tmux_session" ] ;;
  new-session)
    touch "$HOME/tmux_session"
    sh -c "${@: -1}"
    rm -f "$HOME/tmux_session"
    ;;
  kill-session) rm -f "$HOME/tmux_session" ;;
  *) exit 1 ;;
esac
"""

# Fake python of ~/agent_tunix_venv: records each call, answers `-c` with a
# version number, exits with $FAKE_TRAINER_RC (0).
_FAKE_PYTHON = """#!{python} -S
import json, os, sys
with open(os.path.join(os.environ['HOME'], 'python_calls.jsonl'), 'a') as f:
  f.write(json.dumps({{'argv': sys.argv[1:], 'cwd': os.getcwd()}}) + '\\n')
if sys.argv[1:2] == ['-c']:
  print('0.0.7')
else:
  print('fake trainer output')
sys.exit(int(os.environ.get('FAKE_TRAINER_RC', '0')))
"""


def _write_executable(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  path.chmod(0o755)


class _Result:
  """Exit status, output and gcloud calls of one script run."""

  def __init__(self, proc, calls):
    self.rc = proc.returncode
    self.out = proc.stdout
    self.err = proc.stderr
    self.calls = calls


# Fake local python3 for run.sh's credential check and preflight: records
# its arguments and working directory. `-m agent_tunix.credentials` prints
# $FAKE_CREDENTIALS and exits with $FAKE_CREDENTIALS_RC (0); the preflight
# prints $FAKE_PREFLIGHT_OUT (a report) and exits with $FAKE_PREFLIGHT_RC (0).
_FAKE_LOCAL_PYTHON = """#!{python} -S
import json, os, sys
with open(os.environ['FAKE_PREFLIGHT_LOG'], 'a') as f:
  f.write(json.dumps({{'argv': sys.argv[1:], 'cwd': os.getcwd()}}) + '\\n')
if sys.argv[1:3] == ['-m', 'agent_tunix.credentials']:
  sys.stdout.write(os.environ.get('FAKE_CREDENTIALS', ''))
  sys.exit(int(os.environ.get('FAKE_CREDENTIALS_RC', '0')))
print(os.environ.get('FAKE_PREFLIGHT_OUT', 'fake preflight report'))
sys.exit(int(os.environ.get('FAKE_PREFLIGHT_RC', '0')))
"""


class _Sandbox:
  """Runs launch scripts with a fake gcloud and a clean environment."""

  def __init__(self, root):
    self.root = root
    self.bin = root / 'bin'
    self.log = root / 'gcloud.jsonl'
    self.preflight_log = root / 'preflight.jsonl'
    self.sent = root / 'sent'
    self.tmp = root / 'tmp'
    self.tmp.mkdir()
    _write_executable(self.bin / 'gcloud', _FAKE_GCLOUD)
    _write_executable(self.bin / 'python3',
                      _FAKE_LOCAL_PYTHON.format(python=sys.executable))

  def python_calls(self):
    if not self.preflight_log.exists():
      return []
    return [json.loads(l) for l in self.preflight_log.read_text().splitlines()]

  def preflight_calls(self):
    return [c for c in self.python_calls()
            if c['argv'][:2] == ['-m', 'agent_tunix.preflight']]

  def env(self, settings=None, **extra):
    env = {
        'PATH': f'{self.bin}:/usr/bin:/bin',
        'HOME': str(self.root / 'local_home'),
        'LC_ALL': 'C.UTF-8',
        'FAKE_GCLOUD_LOG': str(self.log),
        'FAKE_PREFLIGHT_LOG': str(self.preflight_log),
        'FAKE_GCLOUD_SENT': str(self.sent),
        'TMPDIR': str(self.tmp),
        'RETRY_DELAY': '0',
    }
    env.update(_SETTINGS if settings is None else settings)
    env.update(extra)
    return env

  def run(self, script, *args, settings=None, stdin='', launch=_LAUNCH,
          **extra):
    if self.log.exists():
      self.log.unlink()
    shutil.rmtree(self.sent, ignore_errors=True)
    proc = subprocess.run(
        ['bash', str(launch / script), *args], input=stdin,
        capture_output=True, text=True, env=self.env(settings, **extra),
        cwd=self.root, timeout=60, check=False)
    calls = []
    if self.log.exists():
      calls = [[_TMP.sub('<tmp>', a) for a in json.loads(l)]
               for l in self.log.read_text().splitlines()]
    # The private temporary folder is gone, whatever happened.
    assert not list(self.tmp.iterdir()), list(self.tmp.iterdir())
    return _Result(proc, calls)


class _Worker:
  """A scratch HOME where remote commands run as on a TPU worker."""

  def __init__(self, root):
    self.home = root / 'worker_home'
    self.bin = root / 'worker_bin'
    (self.home / 'agent_tunix').mkdir(parents=True)
    (self.home / 'agent_tunix' / 'requirements.txt').write_text('jax\n')
    _write_executable(self.bin / 'tmux', _FAKE_TMUX)
    _write_executable(self.bin / 'sudo', '#!/bin/sh\necho "sudo $*" >&2\n'
                      'exit 1\n')
    # The metadata server answers with $FAKE_WORKER_NUMBER, if set.
    _write_executable(self.bin / 'curl', '#!/bin/sh\n'
                      '[ -n "$FAKE_WORKER_NUMBER" ] || exit 7\n'
                      'echo "$FAKE_WORKER_NUMBER"\n')
    _write_executable(self.home / 'agent_tunix_venv' / 'bin' / 'python',
                      _FAKE_PYTHON.format(python=sys.executable))

  def run(self, command, shell='bash', **extra):
    env = {
        'PATH': f'{self.bin}:/usr/bin:/bin',
        'HOME': str(self.home),
        'TPU_WORKER_ID': '3',
        'LC_ALL': 'C.UTF-8',
    }
    env.update(extra)
    return subprocess.run([shell, '-c', command], capture_output=True,
                          text=True, env=env, cwd=self.home, timeout=60,
                          check=False)

  def python_calls(self, module=None):
    """The fake venv python's calls (only those of `-m module`)."""
    path = self.home / 'python_calls.jsonl'
    if not path.exists():
      return []
    calls = [json.loads(l) for l in path.read_text().splitlines()]
    return [c for c in calls
            if module is None or c['argv'][:2] == ['-m', module]]

  def session_running(self, running):
    path = self.home / 'tmux_session'
    if running:
      path.touch()
    elif path.exists():
      path.unlink()


@pytest.fixture
def sandbox(tmp_path):
  return _Sandbox(tmp_path)


@pytest.fixture
def worker(tmp_path):
  return _Worker(tmp_path)


def _remote_command(call):
  """The --command= value of a recorded gcloud ssh call."""
  (command,) = [a[len('--command='):] for a in call
                if a.startswith('--command=')]
  return command


def _split_dry_run(out):
  """Parses dry-run output (shell words) back into gcloud argument lists.

  Lines that are not gcloud commands (run.sh's preflight) are skipped.
  """
  out = '\n'.join(l for l in out.splitlines() if not l.startswith('(cd '))
  commands = []
  for word in shlex.split(out):
    if word == 'gcloud':
      commands.append([])
    else:
      commands[-1].append(_TMP.sub('<tmp>', word))
  return commands


# ------------------------------------------------------------ static checks


@pytest.mark.parametrize('script', _SCRIPTS + ('common.sh',))
def test_bash_syntax(script):
  proc = subprocess.run(['bash', '-n', str(_LAUNCH / script)],
                        capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize('script', _SCRIPTS)
def test_script_starts_with_shebang_and_strict_mode(script):
  lines = (_LAUNCH / script).read_text().splitlines()
  assert lines[0] == '#!/bin/bash'
  assert 'set -euo pipefail' in lines


def test_shellcheck():
  shellcheck = shutil.which('shellcheck')
  if shellcheck is None:
    pytest.skip('shellcheck is not installed')
  proc = subprocess.run(
      [shellcheck, '-x', *(str(_LAUNCH / s) for s in _SCRIPTS + (
          'common.sh',))], capture_output=True, text=True, cwd=_REPO,
      check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr


# ----------------------------------------------------- settings and flags


@pytest.mark.parametrize('script,name',
                         [(s, n) for s in _SCRIPTS for n in _NEEDS[s]])
def test_missing_setting_exits_2_naming_it(sandbox, script, name):
  settings = {k: v for k, v in _SETTINGS.items() if k != name}
  result = sandbox.run(script, *_ARGS[script], settings=settings)
  assert result.rc == 2, result.err
  assert (f'launch/{script}: {name} is not set (export {name}=... or pass '
          f'{_FLAGS[name]}=...)') in result.err
  assert not result.calls


@pytest.mark.parametrize('script', _SCRIPTS)
def test_needs_only_its_settings(sandbox, script):
  settings = {k: _SETTINGS[k] for k in _NEEDS[script]}
  result = sandbox.run(script, *_ARGS[script], settings=settings)
  assert result.rc == 0, result.err
  assert result.calls


@pytest.mark.parametrize('script', _SCRIPTS)
def test_flags_replace_settings(sandbox, script):
  flags = [f'{_FLAGS[k]}={_SETTINGS[k]}' for k in _NEEDS[script]]
  result = sandbox.run(script, *_ARGS[script], *flags, settings={})
  assert result.rc == 0, result.err


def test_flag_overrides_environment(sandbox):
  result = sandbox.run('run.sh', *_ARGS['run.sh'], '--tpu-name=other',
                       '--zone=us-west4-a', '--project=proj')
  assert result.rc == 0, result.err
  assert result.calls[1] == [
      'compute', 'tpus', 'tpu-vm', 'scp', '--recurse', '<tmp>/agent_tunix',
      'other:~/agent_tunix', '--worker=all', '--zone=us-west4-a',
      '--project=proj']


@pytest.mark.parametrize('script', _SCRIPTS)
def test_unknown_argument_exits_2(sandbox, script):
  result = sandbox.run(script, *_ARGS[script], '--no-such-flag')
  assert result.rc == 2
  assert "unknown argument '--no-such-flag'" in result.err
  assert not result.calls


@pytest.mark.parametrize('script', _SCRIPTS)
def test_help(sandbox, script):
  result = sandbox.run(script, '--help', settings={})
  assert result.rc == 0
  assert 'Usage:' in result.out
  assert not result.calls


@pytest.mark.parametrize('script', _SCRIPTS)
def test_dry_run_runs_no_gcloud(sandbox, script):
  result = sandbox.run(script, *_ARGS[script], '--dry-run')
  assert result.rc == 0, result.err
  assert not result.calls
  lines = result.out.splitlines()
  if script == 'run.sh':  # First the local preflight command.
    assert lines[0].startswith('(cd ') and 'agent_tunix.preflight' in lines[0]
    lines = lines[1:]
  assert lines
  assert all(line.startswith('gcloud compute tpus ') for line in lines)


@pytest.mark.parametrize('script', ['create.sh', 'setup.sh', 'run.sh',
                                    'stop.sh', 'delete.sh'])
def test_dry_run_prints_what_a_real_run_does(sandbox, script):
  real = sandbox.run(script, *_ARGS[script])
  dry = sandbox.run(script, *_ARGS[script], '--dry-run')
  assert real.rc == 0 and dry.rc == 0
  assert _split_dry_run(dry.out) == real.calls


# ----------------------------------------------------------------- retries


def test_retry_succeeds_after_failures(sandbox):
  result = sandbox.run('create.sh', FAKE_GCLOUD_FAIL_FIRST='2', RETRIES='3')
  assert result.rc == 0, result.err
  assert len(result.calls) == 3
  assert result.calls[0] == result.calls[1] == result.calls[2]
  assert 'attempt 1/3 failed (exit 1)' in result.err


def test_retry_gives_up_with_gcloud_exit_status(sandbox):
  result = sandbox.run('create.sh', '--retries=2', FAKE_GCLOUD_FAIL_FIRST='9',
                       FAKE_GCLOUD_FAIL_RC='7', RETRIES='5')
  assert result.rc == 7
  assert len(result.calls) == 2
  assert 'giving up after 2 attempt(s)' in result.err


def test_retry_of_copy_starts_clean(sandbox):
  # The scp (call 1) fails: the old copy is removed again before the retry.
  result = sandbox.run('run.sh', *_ARGS['run.sh'],
                       FAKE_GCLOUD_FAIL_CALLS='1')
  assert result.rc == 0, result.err
  kinds = [c[3] for c in result.calls]
  assert kinds == ['ssh', 'scp', 'ssh', 'scp', 'ssh']
  assert _remote_command(result.calls[2]).endswith('rm -rf ~/agent_tunix')


def test_refused_step_is_not_retried(sandbox):
  result = sandbox.run('run.sh', *_ARGS['run.sh'], FAKE_GCLOUD_FAIL_FIRST='1',
                       FAKE_GCLOUD_FAIL_RC='4')
  assert result.rc == 4
  assert len(result.calls) == 1
  assert 'not retrying' in result.err


@pytest.mark.parametrize('name,value', [('RETRIES', '0'), ('RETRIES', 'x'),
                                        ('RETRY_DELAY', '-1')])
def test_bad_retry_setting_exits_2(sandbox, name, value):
  result = sandbox.run('stop.sh', **{name: value})
  assert result.rc == 2
  assert name in result.err
  assert not result.calls


# ------------------------------------------------------------------ create


def test_create_tpu_vm(sandbox):
  result = sandbox.run('create.sh')
  assert result.rc == 0, result.err
  assert result.calls == [[
      'compute', 'tpus', 'tpu-vm', 'create', 't', '--zone=z', '--project=p',
      '--accelerator-type=v5litepod-16', '--version=r']]


@pytest.mark.parametrize('flag', ['--spot', '--preemptible'])
def test_create_tpu_vm_capacity_flags(sandbox, flag):
  result = sandbox.run('create.sh', flag, '--', '--labels=a=b')
  assert result.rc == 0, result.err
  assert result.calls[0][-2:] == [flag, '--labels=a=b']


def test_create_queued_resource(sandbox):
  result = sandbox.run('create.sh', '--queued', '--spot')
  assert result.rc == 0, result.err
  assert result.calls == [[
      'compute', 'tpus', 'queued-resources', 'create', 't', '--node-id=t',
      '--zone=z', '--project=p', '--accelerator-type=v5litepod-16',
      '--runtime-version=r', '--spot']]


def test_create_queued_waits_until_active(sandbox):
  result = sandbox.run('create.sh', '--queued', '--wait',
                       FAKE_GCLOUD_STDOUT='ACTIVE\n')
  assert result.rc == 0, result.err
  assert result.calls[1] == [
      'compute', 'tpus', 'queued-resources', 'describe', 't', '--zone=z',
      '--project=p', '--format=value(state.state)']


def test_create_queued_wait_stops_on_failure(sandbox):
  result = sandbox.run('create.sh', '--queued', '--wait',
                       FAKE_GCLOUD_STDOUT='FAILED\n')
  assert result.rc == 1
  assert 'is FAILED' in result.err


@pytest.mark.parametrize('args', [['--spot', '--preemptible'],
                                  ['--queued', '--preemptible'], ['--wait']])
def test_create_rejects_bad_flag_combinations(sandbox, args):
  result = sandbox.run('create.sh', *args)
  assert result.rc == 2
  assert not result.calls


# ------------------------------------------------------------------- setup


def test_setup_copies_code_then_sets_up_all_workers(sandbox):
  result = sandbox.run('setup.sh')
  assert result.rc == 0, result.err
  assert len(result.calls) == 3
  assert result.calls[0][:8] == _SSH + ['--worker=all']
  assert result.calls[1] == _SCP
  assert result.calls[2][:8] == _SSH + ['--worker=all']
  command = _remote_command(result.calls[2])
  for part in ['ppa:deadsnakes/ppa', 'python3.11-venv',
               '-m venv ~/agent_tunix_venv',
               'pip install -q -r ~/agent_tunix/requirements.txt',
               'jax[tpu]==']:
    assert part in command


def test_setup_on_a_ready_worker_only_runs_pip(sandbox, worker):
  # The worker has tmux, a Python >= 3.11 (this one) and the virtualenv:
  # nothing is installed with apt (the fake sudo fails) or created.
  command = _remote_command(sandbox.run('setup.sh').calls[2])
  proc = worker.run(command)
  assert proc.returncode == 0, proc.stderr
  assert 'sudo' not in proc.stderr
  argvs = [c['argv'] for c in worker.python_calls()]
  requirements = str(worker.home / 'agent_tunix' / 'requirements.txt')
  assert argvs[0] == ['-m', 'pip', 'install', '-q', '-r', requirements]
  assert argvs[2] == ['-m', 'pip', 'install', '-q', 'jax[tpu]==0.0.7']
  assert 'setup done' in proc.stdout


# --------------------------------------------------------------------- run


def test_run_acceptance_dry_run(sandbox):
  result = sandbox.run('run.sh', '--dry-run', '--config=configs/gemma3_1b.py',
                       '--workdir=gs://b/run')
  assert result.rc == 0, result.err
  assert not result.calls
  lines = result.out.splitlines()
  scp = [l for l in lines if 'tpu-vm scp' in l]
  ssh = [l for l in lines if 'tpu-vm ssh' in l and '--worker=all' in l]
  assert len(scp) == 1
  assert ssh
  assert ('python -m agent_tunix.main --multihost '
          '--config=configs/gemma3_1b.py --workdir=gs://b/run') in ssh[-1]


def test_run_gcloud_calls(sandbox):
  result = sandbox.run('run.sh', *_ARGS['run.sh'])
  assert result.rc == 0, result.err
  assert len(result.calls) == 3
  assert result.calls[0][:8] == _SSH + ['--worker=all']
  assert result.calls[1] == _SCP
  assert result.calls[2][:8] == _SSH + ['--worker=all']
  assert len(result.calls[2]) == 9
  assert 'tmux new-session -d -s agent_tunix' in result.calls[2][8]


def test_run_preflights_before_anything_is_copied(sandbox):
  result = sandbox.run('run.sh', *_ARGS['run.sh'], '--config.a.b=1',
                       '--', '--flag=x')
  assert result.rc == 0, result.err
  (call,) = sandbox.preflight_calls()
  assert call['argv'] == [
      '-m', 'agent_tunix.preflight', '--config=configs/gemma3_1b.py',
      '--topology=v5litepod-16', '--config.a.b=1']
  assert call['cwd'] == str(_REPO)
  assert len(result.calls) == 3


@pytest.mark.parametrize('report', [
    'program train_step\nDOES NOT FIT',
    'preflight: gemma3_27b does not fit v5e:4x4 (16 chips): its frozen ...',
])
def test_run_refuses_a_run_that_does_not_fit(sandbox, report):
  result = sandbox.run('run.sh', *_ARGS['run.sh'], FAKE_PREFLIGHT_RC='1',
                       FAKE_PREFLIGHT_OUT=report)
  assert result.rc == 1
  assert 'does not fit v5litepod-16' in result.err
  assert '--skip-preflight' in result.err
  assert not result.calls


@pytest.mark.parametrize('rc, out, message', [
    # A crash exits 1 too: not a verdict.
    ('1', 'Traceback (most recent call last):\nImportError: no libtpu', 
     'the preflight failed (exit status 1, output above) before it could '
     'tell whether the run fits'),
    ('2', "error: --config.traning.num_steps: the config has no field "
     "'traning'; did you mean 'training' (--config.training.num_steps)?",
     'the preflight refused the config or a flag'),
    ('3', 'train_step KILLED', 'the preflight was killed or interrupted'),
    ('7', '', 'the preflight failed with exit status 7'),
])
def test_run_says_truthfully_why_the_preflight_stopped_it(sandbox, rc, out,
                                                          message):
  result = sandbox.run('run.sh', *_ARGS['run.sh'], FAKE_PREFLIGHT_RC=rc,
                       FAKE_PREFLIGHT_OUT=out)
  assert result.rc == {'1': 1, '2': 2, '3': 3, '7': 1}[rc]
  assert message in result.err
  assert 'does not fit' not in result.err
  assert out in result.out  # The preflight's own output is shown.
  assert not result.calls


def test_run_skip_preflight(sandbox):
  settings = {k: _SETTINGS[k] for k in _BASIC}
  result = sandbox.run('run.sh', *_ARGS['run.sh'], '--skip-preflight',
                       FAKE_PREFLIGHT_RC='1', settings=settings)
  assert result.rc == 0, result.err
  assert not sandbox.preflight_calls()
  assert len(result.calls) == 3


def test_run_dry_run_shows_the_preflight(sandbox):
  result = sandbox.run('run.sh', '--dry-run', *_ARGS['run.sh'])
  assert result.rc == 0, result.err
  assert not sandbox.preflight_calls()
  (line,) = [l for l in result.out.splitlines() if 'preflight' in l]
  assert line == (f'(cd {_REPO} && python3 -m agent_tunix.preflight '
                  '--config=configs/gemma3_1b.py --topology=v5litepod-16)')


@pytest.mark.parametrize('args,message', [
    (['--workdir=gs://b/run'], '--config is required'),
    (['--config=configs/gemma3_1b.py'], '--workdir is required'),
    (_ARGS['run.sh'] + ['--grace=soon'], '--grace must be'),
])
def test_run_argument_errors(sandbox, args, message):
  result = sandbox.run('run.sh', *args)
  assert result.rc == 2
  assert message in result.err
  assert not result.calls


def test_run_warns_about_local_workdir(sandbox):
  result = sandbox.run('run.sh', '--config=configs/gemma3_1b.py',
                       '--workdir=/tmp/run')
  assert result.rc == 0
  assert 'is not a gs:// path' in result.err


_OVERRIDES = [
    "--config.data.system_prompt=it's a \"test\"",
    '--config.a=$HOME and ${HOME}',
    '--config.b=`echo no` $(echo no)',
    '--config.c=back\\slash \\n %s *',
    '--config.d=semi;colon|pipe&amp>gt<lt',
    '--config.e=two\nlines',
    '--config.f=',
    "--config.g='",
]


@pytest.mark.parametrize('shell', ['bash', 'sh'])
def test_run_starts_trainer_with_exact_arguments(sandbox, worker, shell):
  extra = ['--flagfile=a b', "it's"]
  result = sandbox.run('run.sh', *_ARGS['run.sh'], *_OVERRIDES, '--', *extra)
  assert result.rc == 0, result.err
  proc = worker.run(_remote_command(result.calls[2]), shell=shell)
  assert proc.returncode == 0, proc.stderr
  assert 'started agent_tunix' in proc.stdout
  (call,) = worker.python_calls('agent_tunix.main')
  assert call['argv'] == [
      '-m', 'agent_tunix.main', '--multihost',
      '--config=configs/gemma3_1b.py', '--workdir=gs://b/run',
      *_OVERRIDES, *extra]
  assert call['cwd'] == str(worker.home / 'agent_tunix')
  log = (worker.home / 'agent_tunix_logs' / 'worker_3.log').read_text()
  assert 'fake trainer output' in log
  assert 'exited with status 0' in log
  assert not (worker.home / 'agent_tunix_logs' / 'pid').exists()
  assert 'new-session -d -s agent_tunix' in (
      worker.home / 'tmux.log').read_text()


def test_run_mirrors_the_worker_log_to_the_workdir(sandbox, worker):
  workdir = "gs://b/it's a run"
  result = sandbox.run('run.sh', '--config=configs/gemma3_1b.py',
                       f'--workdir={workdir}')
  assert result.rc == 0, result.err
  proc = worker.run(_remote_command(result.calls[2]))
  assert proc.returncode == 0, proc.stderr
  (call,) = worker.python_calls('agent_tunix.run.log_mirror')
  log = worker.home / 'agent_tunix_logs' / 'worker_3.log'
  assert call['argv'] == ['-m', 'agent_tunix.run.log_mirror', f'--log={log}',
                          f'--workdir={workdir}', '--worker=3',
                          '--done_marker=exited with status']
  assert 'exited with status 0' in log.read_text()
  assert call['cwd'] == str(worker.home / 'agent_tunix')


def test_run_names_the_coordinator_for_workers_jax_cannot_find(sandbox,
                                                              worker):
  result = sandbox.run('run.sh', *_ARGS['run.sh'],
                       '--coordinator-address=10.0.0.2:8476',
                       '--num-processes=4', '--config.a=1')
  assert result.rc == 0, result.err
  proc = worker.run(_remote_command(result.calls[2]))
  assert proc.returncode == 0, proc.stderr
  (call,) = worker.python_calls('agent_tunix.main')
  assert call['argv'] == [
      '-m', 'agent_tunix.main', '--multihost',
      '--config=configs/gemma3_1b.py', '--workdir=gs://b/run',
      '--coordinator_address=10.0.0.2:8476', '--num_processes=4',
      '--process_id=3', '--config.a=1']


@pytest.mark.parametrize('args', [
    ['--coordinator-address=10.0.0.2:8476'],
    ['--num-processes=2'],
    ['--coordinator-address=10.0.0.2', '--num-processes=2'],
    ['--coordinator-address=10.0.0.2:8476', '--num-processes=0'],
])
def test_run_coordinator_flags_go_together(sandbox, args):
  result = sandbox.run('run.sh', *_ARGS['run.sh'], *args)
  assert result.rc == 2
  assert '--coordinator-address' in result.err
  assert not result.calls


def test_run_dry_run_quoting_round_trips(sandbox):
  overrides = [o for o in _OVERRIDES if '\n' not in o]
  real = sandbox.run('run.sh', *_ARGS['run.sh'], *overrides)
  dry = sandbox.run('run.sh', *_ARGS['run.sh'], *overrides, '--dry-run')
  preflight, *gcloud = dry.out.splitlines()
  assert len(gcloud) == 3
  assert _split_dry_run(dry.out) == real.calls
  # The preflight line too: the same words as the real preflight call.
  prefix = f'(cd {_REPO} && '
  assert preflight.startswith(prefix) and preflight.endswith(')')
  (call,) = sandbox.preflight_calls()
  assert shlex.split(preflight[len(prefix):-1]) == ['python3', *call['argv']]
  assert call['argv'][-len(overrides):] == overrides


@pytest.mark.parametrize('number', ['2', ''])
def test_run_names_log_after_worker_number(sandbox, worker, number):
  result = sandbox.run('run.sh', *_ARGS['run.sh'])
  proc = worker.run(_remote_command(result.calls[2]), TPU_WORKER_ID='',
                    FAKE_WORKER_NUMBER=number)
  assert proc.returncode == 0, proc.stderr
  name = number or subprocess.run(['hostname'], capture_output=True,
                                  text=True, check=True).stdout.strip()
  log = worker.home / 'agent_tunix_logs' / f'worker_{name}.log'
  assert 'fake trainer output' in log.read_text()


def test_run_log_keeps_trainer_exit_status(sandbox, worker):
  result = sandbox.run('run.sh', *_ARGS['run.sh'])
  worker.run(_remote_command(result.calls[2]), FAKE_TRAINER_RC='5')
  log = (worker.home / 'agent_tunix_logs' / 'worker_3.log').read_text()
  assert 'exited with status 5' in log


def test_run_does_not_start_a_second_session(sandbox, worker):
  result = sandbox.run('run.sh', *_ARGS['run.sh'])
  worker.session_running(True)
  proc = worker.run(_remote_command(result.calls[2]))
  assert proc.returncode == 0
  assert 'already started' in proc.stdout
  assert not worker.python_calls()


def test_run_copy_refuses_while_a_run_is_going(sandbox, worker):
  result = sandbox.run('run.sh', *_ARGS['run.sh'])
  guard = _remote_command(result.calls[0])
  worker.session_running(True)
  proc = worker.run(guard)
  assert proc.returncode == 4
  assert 'pass --restart' in proc.stderr
  assert (worker.home / 'agent_tunix').exists()
  worker.session_running(False)
  proc = worker.run(guard)
  assert proc.returncode == 0, proc.stderr
  assert not (worker.home / 'agent_tunix').exists()


def _start_fake_trainer(worker):
  """Starts a process standing in for the trainer; records its pid."""
  proc = subprocess.Popen(['sleep', '60'])
  threading.Thread(target=proc.wait, daemon=True).start()  # Reaps it.
  logs = worker.home / 'agent_tunix_logs'
  logs.mkdir(exist_ok=True)
  (logs / 'pid').write_text(f'{proc.pid}\n')
  worker.session_running(True)
  return proc


def test_run_restart_stops_the_old_run(sandbox, worker):
  result = sandbox.run('run.sh', *_ARGS['run.sh'], '--restart', '--grace=5')
  assert result.rc == 0, result.err
  trainer = _start_fake_trainer(worker)
  proc = worker.run(_remote_command(result.calls[0]))
  assert proc.returncode == 0, proc.stderr
  assert trainer.wait(timeout=10) == -15  # SIGTERM
  assert not (worker.home / 'agent_tunix').exists()


# ----------------------------------------------- what is sent: code, keys


def _tree(root):
  """{relative path: apparent size} of the files under `root`."""
  return {str(p.relative_to(root)): p.lstat().st_size
          for p in root.rglob('*') if p.is_file() or p.is_symlink()}


@pytest.fixture
def checkout(tmp_path):
  """A git checkout of this repository's tracked files (as they are now),
  with what a user's checkout also holds: a 1 GB .venv, a 300 MB run
  folder and an untracked note (sparse files: no disk is used)."""
  root = tmp_path / 'checkout'
  files = subprocess.run(['git', 'ls-files', '-z'], cwd=_REPO, check=True,
                         capture_output=True).stdout.decode().split('\0')
  for name in filter(None, files):
    source = _REPO / name
    if source.is_file():
      (root / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(source, root / name)
  git = ['git', '-c', 'user.name=t', '-c', 'user.email=t@t', '-c',
         'commit.gpgsign=false']
  for args in (['init', '-q'], ['add', '-A'], ['commit', '-q', '-m', 'c']):
    subprocess.run(git + args, cwd=root, check=True, capture_output=True)
  for name, size in (('.venv/lib/big.so', 1 << 30),
                     ('runs/r1/checkpoints/big', 300 << 20)):
    (root / name).parent.mkdir(parents=True)
    with open(root / name, 'wb') as f:
      f.truncate(size)
  (root / 'notes.txt').write_text('untracked\n')
  return root


def test_setup_sends_only_tracked_files(sandbox, checkout):
  (checkout / 'launch' / 'logs.sh').write_text('edited, not committed\n')
  (checkout / 'launch' / 'delete.sh').unlink()  # Deleted, not committed.
  result = sandbox.run('setup.sh', launch=checkout / 'launch')
  assert result.rc == 0, result.err
  assert result.calls[1] == _SCP
  sent = _tree(sandbox.sent / '1' / 'agent_tunix')
  assert sum(sent.values()) < 100 << 20
  assert not [p for p in sent if p.startswith(('.venv', 'runs', '.git/'))]
  assert 'notes.txt' not in sent and 'launch/delete.sh' not in sent
  assert 'launch/setup.sh' in sent and 'requirements.txt' in sent
  assert (sandbox.sent / '1' / 'agent_tunix' / 'launch' / 'logs.sh'
         ).read_text() == 'edited, not committed\n'
  (line,) = [l for l in result.err.splitlines() if 'code to send' in l]
  assert re.search(rf'{len(sent)} files \([0-9.]+ MiB\), the files git '
                   'tracks', line), line


def test_extra_files_are_sent_too(sandbox, checkout):
  (checkout / 'my_data').mkdir()
  (checkout / 'my_data' / 'train.jsonl').write_text('{}\n')
  result = sandbox.run('setup.sh', '--extra-files=notes.txt',
                       launch=checkout / 'launch', EXTRA_FILES='my_data')
  assert result.rc == 0, result.err
  sent = _tree(sandbox.sent / '1' / 'agent_tunix')
  assert 'notes.txt' in sent and 'my_data/train.jsonl' in sent
  assert not [p for p in sent if p.startswith(('.venv', 'runs'))]


@pytest.mark.parametrize('path, message', [
    ('nope.txt', "'nope.txt' not found under"),
    ('../x', 'leaves the repository'),
    ('/etc/hostname', 'is outside'),
])
def test_bad_extra_files_exit_2(sandbox, path, message):
  result = sandbox.run('setup.sh', f'--extra-files={path}')
  assert result.rc == 2
  assert message in result.err
  assert not result.calls


def test_run_refuses_an_untracked_config_file(sandbox, checkout):
  (checkout / 'configs' / 'mine.py').write_text('# untracked\n')
  args = ['--config=configs/mine.py', '--workdir=gs://b/run']
  result = sandbox.run('run.sh', *args, launch=checkout / 'launch')
  assert result.rc == 2
  assert 'configs/mine.py is not tracked by git' in result.err
  assert not result.calls and not sandbox.python_calls()
  result = sandbox.run('run.sh', *args, '--extra-files=configs/mine.py',
                       launch=checkout / 'launch')
  assert result.rc == 0, result.err
  assert 'configs/mine.py' in _tree(sandbox.sent / '1' / 'agent_tunix')


def test_setup_apt_waits_for_the_dpkg_lock(sandbox):
  command = _remote_command(sandbox.run('setup.sh').calls[2])
  calls = re.findall(r'apt-get( [^;&|]*)', command)
  assert len(calls) >= 5, command
  for call in calls:
    assert call.startswith(' -o DPkg::Lock::Timeout=600 '), call


_KAGGLE_KEY = 'k3y-SECRET-4a1b'
_HF_TOKEN = 'hf_SECRET_9z8y'
_SECRETS = {'KAGGLE_USERNAME': 'ann', 'KAGGLE_KEY': _KAGGLE_KEY,
            'HF_TOKEN': _HF_TOKEN}
_BOTH = ('kaggle google/gemma-3/flax/gemma3-1b\n'
         'huggingface google/gemma-4-E2B\n')


def _no_secret_in(*texts):
  for text in texts:
    assert _KAGGLE_KEY not in text and _HF_TOKEN not in text


def test_credentials_go_as_0600_files_never_as_arguments(sandbox, worker):
  dry = sandbox.run('run.sh', *_ARGS['run.sh'], '--config.a=1', '--dry-run',
                    FAKE_CREDENTIALS=_BOTH, **_SECRETS)
  assert dry.rc == 0, dry.err
  result = sandbox.run('run.sh', *_ARGS['run.sh'], '--config.a=1',
                       FAKE_CREDENTIALS=_BOTH, **_SECRETS)
  assert result.rc == 0, result.err
  _no_secret_in(json.dumps(result.calls), result.out, result.err, dry.out,
                dry.err, json.dumps(sandbox.python_calls()))
  assert _split_dry_run(dry.out) == result.calls
  kinds = [c[3] for c in result.calls]
  assert kinds == ['ssh', 'scp', 'scp', 'scp', 'ssh']
  assert result.calls[2] == [
      'compute', 'tpus', 'tpu-vm', 'scp', '<tmp>/kaggle.json',
      't:~/.kaggle/kaggle.json', '--worker=all', '--zone=z', '--project=p']
  assert result.calls[3][4:6] == ['<tmp>/hf_token',
                                  't:~/.cache/huggingface/token']
  kaggle = sandbox.sent / '2' / 'kaggle.json'
  token = sandbox.sent / '3' / 'hf_token'
  assert json.loads(kaggle.read_text()) == {'username': 'ann',
                                            'key': _KAGGLE_KEY}
  assert token.read_text().strip() == _HF_TOKEN
  assert kaggle.stat().st_mode & 0o777 == 0o600
  assert token.stat().st_mode & 0o777 == 0o600
  (check,) = [c for c in sandbox.python_calls()
              if 'agent_tunix.credentials' in c['argv']][:1]
  assert check['argv'] == ['-m', 'agent_tunix.credentials',
                           '--config=configs/gemma3_1b.py', '--config.a=1']
  # On a worker: the folders are made private, the old files removed, and
  # the trainer starts only after the files have mode 0600.
  kaggle_dir = worker.home / '.kaggle'
  kaggle_dir.mkdir(mode=0o755)
  (kaggle_dir / 'kaggle.json').write_text('old')
  proc = worker.run(_remote_command(result.calls[0]))
  assert proc.returncode == 0, proc.stderr
  assert kaggle_dir.stat().st_mode & 0o777 == 0o700
  hf_dir = worker.home / '.cache' / 'huggingface'
  assert hf_dir.stat().st_mode & 0o777 == 0o700
  assert not (kaggle_dir / 'kaggle.json').exists()
  for sent, there in ((kaggle, kaggle_dir / 'kaggle.json'),
                      (token, hf_dir / 'token')):
    shutil.copy(sent, there)
    there.chmod(0o644)
  proc = worker.run(_remote_command(result.calls[4]))
  assert proc.returncode == 0, proc.stderr
  assert (kaggle_dir / 'kaggle.json').stat().st_mode & 0o777 == 0o600
  assert (hf_dir / 'token').stat().st_mode & 0o777 == 0o600


def test_credentials_from_the_users_files(sandbox):
  home = sandbox.root / 'local_home'
  (home / '.kaggle').mkdir(parents=True)
  (home / '.kaggle' / 'kaggle.json').write_text('{"username": "b"}\n')
  (home / '.cache' / 'huggingface').mkdir(parents=True)
  (home / '.cache' / 'huggingface' / 'token').write_text('hf_x\n')
  result = sandbox.run('run.sh', *_ARGS['run.sh'], FAKE_CREDENTIALS=_BOTH)
  assert result.rc == 0, result.err
  assert (sandbox.sent / '2' / 'kaggle.json').read_text() == (
      '{"username": "b"}\n')
  assert (sandbox.sent / '3' / 'hf_token').read_text() == 'hf_x\n'
  assert 'from KAGGLE_USERNAME' not in result.err


def test_no_credentials_sent_when_none_is_needed(sandbox):
  result = sandbox.run('run.sh', *_ARGS['run.sh'], **_SECRETS)
  assert result.rc == 0, result.err
  assert [c[3] for c in result.calls] == ['ssh', 'scp', 'ssh']
  assert '.kaggle' not in json.dumps(result.calls)


@pytest.mark.parametrize('needs, secrets, message', [
    ('kaggle google/gemma-3/flax/gemma3-1b\n', {'HF_TOKEN': 'x'},
     'the weights (google/gemma-3/flax/gemma3-1b) come from Kaggle and no '
     'Kaggle API key was found'),
    ('kaggle h\n', {'KAGGLE_KEY': 'k'}, 'no Kaggle API key was found'),
    ('huggingface google/gemma-4-E2B\n', {'KAGGLE_USERNAME': 'a',
                                         'KAGGLE_KEY': 'k'},
     'the weights (google/gemma-4-E2B) are a gated Hugging Face repo and '
     'HF_TOKEN is not set'),
])
def test_a_missing_credential_is_refused_in_one_line_before_any_copy(
    sandbox, needs, secrets, message):
  result = sandbox.run('run.sh', *_ARGS['run.sh'], FAKE_CREDENTIALS=needs,
                       **secrets)
  assert result.rc == 2
  (line,) = [l for l in result.err.splitlines() if 'not started' in l]
  assert message in line
  assert not result.calls and not sandbox.preflight_calls()


def test_a_config_error_in_the_check_is_not_a_misfit(sandbox):
  result = sandbox.run('run.sh', *_ARGS['run.sh'], FAKE_CREDENTIALS_RC='2')
  assert result.rc == 2
  assert 'the config or an override is wrong' in result.err
  assert 'does not fit' not in result.err
  assert not result.calls and not sandbox.preflight_calls()


def test_a_check_that_cannot_run_sends_the_credentials_there_are(sandbox):
  result = sandbox.run('run.sh', *_ARGS['run.sh'], FAKE_CREDENTIALS_RC='1',
                       HF_TOKEN=_HF_TOKEN)
  assert result.rc == 0, result.err
  assert 'could not ask python3 which credentials' in result.err
  assert [c[4:6] for c in result.calls if c[3] == 'scp'] == [
      ['--recurse', '<tmp>/agent_tunix'],
      ['<tmp>/hf_token', 't:~/.cache/huggingface/token']]


@pytest.mark.parametrize('config, rc, message', [
    ('configs/tiny.py', 0, 'started'),
    # A preset's name, as the trainer takes it.
    ('tiny', 0, 'started'),
    ('gemma3_1b:it', 2, 'come from Kaggle'),
    ('nope', 2, "config file 'nope' not found"),
    ('configs/gemma3_1b.py', 2, 'come from Kaggle'),
    ('configs/gemma4_e2b.py', 2, 'gated Hugging Face repo'),
])
def test_run_asks_the_real_config_what_it_needs(sandbox, config, rc,
                                                message):
  result = sandbox.run('run.sh', f'--config={config}', '--workdir=gs://b/r',
                       '--skip-preflight', PYTHON=sys.executable)
  assert result.rc == rc, result.err
  assert message in result.err


def test_run_acceptance_a_misspelled_field_is_a_config_error(sandbox):
  result = sandbox.run('run.sh', '--config=configs/tiny.py',
                       '--workdir=gs://b/r', '--config.traning.num_steps=1',
                       PYTHON=sys.executable)
  assert result.rc == 2
  assert "did you mean 'training'" in result.err
  assert 'the config or an override is wrong' in result.err
  assert 'does not fit' not in result.err
  assert not result.calls


# -------------------------------------------------------------- stop, logs


def test_stop_sends_sigterm_on_all_workers(sandbox, worker):
  result = sandbox.run('stop.sh', '--grace=5')
  assert result.rc == 0, result.err
  (call,) = result.calls
  assert call[:8] == _SSH + ['--worker=all']
  trainer = _start_fake_trainer(worker)
  proc = worker.run(_remote_command(call))
  assert proc.returncode == 0, proc.stderr
  assert trainer.wait(timeout=10) == -15
  assert 'stopped agent_tunix' in proc.stdout
  assert 'kill-session -t agent_tunix' in (
      worker.home / 'tmux.log').read_text()
  assert not (worker.home / 'agent_tunix_logs' / 'pid').exists()


def test_stop_without_a_run(sandbox, worker):
  result = sandbox.run('stop.sh')
  proc = worker.run(_remote_command(result.calls[0]))
  assert proc.returncode == 0, proc.stderr
  assert 'not running' in proc.stdout


@pytest.mark.parametrize('args,worker_flag,command', [
    ([], '--worker=0', 'tail -n 100 -F ~/agent_tunix_logs/worker_*.log'),
    (['--worker=2', '--lines=5', '--no-follow'], '--worker=2',
     'tail -n 5 ~/agent_tunix_logs/worker_*.log'),
])
def test_logs(sandbox, args, worker_flag, command):
  result = sandbox.run('logs.sh', *args)
  assert result.rc == 0, result.err
  assert result.calls == [_SSH + [worker_flag, '--command=' + command]]


def test_logs_not_retried(sandbox):
  result = sandbox.run('logs.sh', FAKE_GCLOUD_FAIL_FIRST='1')
  assert result.rc == 1
  assert len(result.calls) == 1


@pytest.mark.parametrize('args', [['--worker=one'], ['--lines=-3']])
def test_logs_bad_arguments(sandbox, args):
  result = sandbox.run('logs.sh', *args)
  assert result.rc == 2
  assert not result.calls


# ------------------------------------------------------------- tensorboard


def test_tensorboard_tunnel(sandbox):
  result = sandbox.run('tensorboard.sh', '--workdir=gs://b/run', '--tunnel',
                       '--port=7007')
  assert result.rc == 0, result.err
  (call,) = result.calls
  assert call[:8] == _SSH + ['--worker=0']
  assert call[9:] == ['--', '-L', '7007:localhost:7007']
  assert ('~/agent_tunix_venv/bin/tensorboard --logdir=gs://b/run '
          '--port=7007 --host=localhost') in call[8]


def test_tensorboard_reads_an_emulator_with_the_python_loader(sandbox,
                                                              worker):
  """The fast loader's own gs:// client knows only the real service."""
  result = sandbox.run('tensorboard.sh', '--workdir=gs://b/run', '--tunnel')
  command = _remote_command(result.calls[0])
  _write_executable(worker.home / 'agent_tunix_venv' / 'bin' / 'tensorboard',
                    '#!/bin/sh\necho "tensorboard $*"\n')
  on_service = worker.run(command)
  assert on_service.stdout == (
      'tensorboard --logdir=gs://b/run --port=6006 --host=localhost\n')
  on_emulator = worker.run(command, STORAGE_EMULATOR_HOST='http://e:1')
  assert on_emulator.stdout == ('tensorboard --logdir=gs://b/run --port=6006 '
                                '--host=localhost --load_fast=false\n')
  local = sandbox.run('tensorboard.sh', '--workdir=gs://b/run', '--dry-run',
                      settings={}, STORAGE_EMULATOR_HOST='http://e:1')
  assert local.out == ('tensorboard --logdir=gs://b/run --port=6006 '
                       '--load_fast=false\n')


def test_tensorboard_local_needs_no_settings(sandbox):
  _write_executable(sandbox.bin / 'tensorboard',
                    '#!/bin/sh\necho "tensorboard $*"\n')
  result = sandbox.run('tensorboard.sh', '--workdir=gs://b/run', settings={})
  assert result.rc == 0, result.err
  assert 'tensorboard --logdir=gs://b/run --port=6006' in result.out
  assert not result.calls


def test_tensorboard_local_dry_run(sandbox):
  result = sandbox.run('tensorboard.sh', '--workdir=gs://b/run', '--dry-run',
                       settings={})
  assert result.rc == 0, result.err
  assert result.out == 'tensorboard --logdir=gs://b/run --port=6006\n'


def test_tensorboard_needs_workdir(sandbox):
  result = sandbox.run('tensorboard.sh', '--tunnel')
  assert result.rc == 2
  assert '--workdir is required' in result.err


# ------------------------------------------------------------------ delete


def test_delete_with_yes(sandbox):
  result = sandbox.run('delete.sh', '--yes')
  assert result.rc == 0, result.err
  assert result.calls == [['compute', 'tpus', 'tpu-vm', 'delete', 't',
                           '--zone=z', '--project=p', '--quiet']]


def test_delete_queued(sandbox):
  result = sandbox.run('delete.sh', '--queued', '--yes')
  assert result.rc == 0, result.err
  assert result.calls == [['compute', 'tpus', 'queued-resources', 'delete',
                           't', '--zone=z', '--project=p', '--force',
                           '--quiet']]


@pytest.mark.parametrize('answer,deleted', [('y\n', True), ('yes\n', True),
                                            ('n\n', False), ('', False)])
def test_delete_asks_first(sandbox, answer, deleted):
  result = sandbox.run('delete.sh', stdin=answer)
  assert bool(result.calls) == deleted
  assert result.rc == (0 if deleted else 1)


# ----------------------------------------------------- remote command syntax


@pytest.mark.parametrize('script,args', [
    ('setup.sh', []), ('run.sh', _ARGS['run.sh']),
    ('run.sh', _ARGS['run.sh'] + ['--restart']), ('stop.sh', []),
    ('logs.sh', []), ('tensorboard.sh', _ARGS['tensorboard.sh'])])
def test_remote_commands_parse_in_bash_and_sh(sandbox, script, args):
  result = sandbox.run(script, *args)
  assert result.rc == 0, result.err
  for call in result.calls:
    if call[3] != 'ssh':
      continue
    for shell in ('bash', 'sh'):
      proc = subprocess.run([shell, '-n', '-c', _remote_command(call)],
                            capture_output=True, text=True, check=False)
      assert proc.returncode == 0, (shell, proc.stderr, call)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__, *sys.argv[1:]]))
