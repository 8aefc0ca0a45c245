"""Tests for agent_tunix.cli: every command's --help exits 0."""

import os
import json
import pathlib
import signal
import subprocess
import sys

import pytest

from agent_tunix import cli

_REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize('argv, asked', [
    (['prog', '--help'], True),
    (['prog', '-?'], True),
    (['prog', '--helpfull'], True),
    (['prog', '--helpshort'], True),
    (['prog', '-help'], True),
    (['prog', '--config=c.py', '--help'], True),
    (['prog'], False),
    (['prog', '--config=help.py'], False),
    (['prog', '--', '--help'], False),  # After '--': not a flag.
    (['prog', '--helper=1'], False),
])
def test_asked_for_help(argv, asked):
  assert cli.asked_for_help(argv) is asked


def test_help_exits_zero_and_a_bad_flag_does_not():
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  run = lambda *args: subprocess.run(
      [sys.executable, '-m', 'agent_tunix.plot', *args], cwd=_REPO, env=env,
      capture_output=True, text=True, timeout=300, check=False)
  shown = run('--help')
  assert shown.returncode == 0, shown.stderr[-2000:]
  assert '--workdir' in shown.stdout
  bad = run('--no_such_flag')
  assert bad.returncode != 0


# A command built on cli.run: one flag, a config file, and a main that does
# what $WHAT says.
_COMMAND = r'''
import os, sys
from absl import app, flags
from ml_collections import config_flags
from agent_tunix import cli
config_flags.DEFINE_config_file('config', None, 'c', lock_config=True)
flags.DEFINE_string('workdir', None, 'w')
def main(argv):
  what = os.environ['WHAT']
  if what == 'usage':
    raise app.UsageError('--workdir is required.')
  if what == 'interrupt':
    raise KeyboardInterrupt
  if what == 'fail':
    sys.exit(1)
  print(flags.FLAGS.config.training.num_steps)
cli.run(main)
'''


def _command(*args, what='print'):
  return subprocess.run(
      [sys.executable, '-c', _COMMAND, *args], cwd=_REPO,
      env=dict(os.environ, WHAT=what, PYTHONPATH=str(_REPO)),
      capture_output=True, text=True, timeout=120, check=False)


def _one_error_line(out):
  assert 'Traceback' not in out.stderr, out.stderr[-3000:]
  lines = [l for l in out.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, out.stderr[-3000:]
  assert lines[0].startswith('error: ')
  return lines[0]


def test_exit_statuses_are_the_documented_ones():
  assert (cli.OK, cli.FAILED, cli.USAGE, cli.KILLED) == (0, 1, 2, 3)
  ok = _command('--config=configs/tiny.py', '--config.training.num_steps=5')
  assert ok.returncode == 0, ok.stderr[-3000:]
  assert ok.stdout.strip() == '5'
  assert _command('--config=configs/tiny.py', what='fail').returncode == 1
  interrupted = _command('--config=configs/tiny.py', what='interrupt')
  assert interrupted.returncode == 3
  assert _one_error_line(interrupted) == 'error: interrupted (Ctrl-C)'


@pytest.mark.parametrize('args, line', [
    (['--config.traning.num_steps=5'],
     "error: --config.traning.num_steps: the config has no field 'traning'; "
     "did you mean 'training' (--config.training.num_steps)?"),
    (['--config.training.num_stpes=5'],
     "error: --config.training.num_stpes: config.training has no field "
     "'num_stpes'; did you mean 'num_steps' (--config.training.num_steps)?"),
    (['--config.training.num_steps=abc'],
     'error: flag --config.training.num_steps=abc: invalid literal for int()'
     " with base 10: 'abc'"),
    (['--workdirr=x'],
     "error: Unknown command line flag 'workdirr'. Did you mean: workdir ?"),
    (['--config=configs/no_such.py'],
     "error: --config: cannot load the config file: [Errno 2] No such file "
     "or directory: 'configs/no_such.py' (a path is relative to the working "
     'directory; a preset goes by name from anywhere: --config=NAME[:ARG], '
     f'one of {", ".join(cli.preset_names())})'),
    (['--config=no_such:quick'],
     "error: --config=no_such:quick: no such config file and no preset "
     f"'no_such'; the presets: {', '.join(cli.preset_names())} (NAME[:ARG]); "
     'or give the path of a get_config() file'),
    (['--config=configs/tiny.py:bogus'],
     'error: flag --config=configs/tiny.py:bogus: Error whilst parsing config'
     " file: ValueError: Unknown preset argument 'bogus'; use 'quick', 'it' "
     "or 'section.field=value'."),
])
def test_bad_flags_and_config_fields_are_one_line_and_exit_2(args, line):
  out = _command('--config=configs/tiny.py', *args)
  assert out.returncode == 2
  assert _one_error_line(out) == line


def test_a_usage_error_in_main_is_one_line_and_exits_2():
  out = _command('--config=configs/tiny.py', what='usage')
  assert out.returncode == 2
  assert _one_error_line(out) == (
      'error: --workdir is required. (--help lists the flags)')


@pytest.mark.parametrize('module, args', [
    ('agent_tunix.main', ['--print_config']),
    ('agent_tunix.preflight', ['--topology=v5litepod-8']),
])
def test_a_misspelled_field_exits_2_with_one_line_naming_the_field(
    module, args):
  out = subprocess.run(
      [sys.executable, '-m', module, '--config=configs/tiny.py',
       '--config.traning.num_steps=5', *args], cwd=_REPO,
      env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True,
      text=True, timeout=300, check=False)
  assert out.returncode == 2, out.stderr[-3000:]
  line = _one_error_line(out)
  assert "did you mean 'training'" in line, line


def test_unknown_field_message_needs_an_override_naming_it():
  error = KeyError('\'nope\'\nDid you mean "note" instead of "nope"?')
  assert cli.unknown_field_message(error, ['p', '--config.a=1']) is None
  assert cli.unknown_field_message(
      error, ['p', '--', '--config.nope=1']) is None
  assert cli.unknown_field_message(error, ['p', '--config.nope=1']) == (
      "--config.nope: the config has no field 'nope'; did you mean 'note' "
      '(--config.note)?')
  # Without a suggestion.
  assert cli.unknown_field_message(
      KeyError('nope'), ['p', '--config.x.nope.y=1']) == (
          "--config.x.nope.y: config.x has no field 'nope'")


_SIGNALLED = []


def sigterm_once(prompts, completions, **unused):
  """A reward that sends its own process SIGTERM once (a preemption)."""
  del prompts, unused
  if not _SIGNALLED:
    _SIGNALLED.append(True)
    os.kill(os.getpid(), signal.SIGTERM)
  return [0.0] * len(completions)


def test_a_run_stopped_by_sigterm_exits_3_after_its_checkpoint(tmp_path):
  out = subprocess.run(
      [sys.executable, '-m', 'agent_tunix.main', '--config=configs/tiny.py',
       f'--workdir={tmp_path / "run"}', '--config.training.num_steps=3',
       '--config.eval.pass_at_k=0',
       '--config.rewards.functions=answer=1,cli_test:sigterm_once=1'],
      cwd=_REPO, capture_output=True, text=True, timeout=600, check=False,
      env=dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=os.pathsep.join(
          [str(_REPO), str(_REPO / 'tests')])))
  assert out.returncode == 3, out.stderr[-3000:]
  assert json.loads(out.stdout.splitlines()[-1])['preempted'] is True
  assert out.stderr.strip().splitlines()[-1].startswith(
      'stopped after step 1 by a signal (SIGTERM or Ctrl-C), with a '
      'checkpoint of that step in --workdir')


def test_every_command_runs_through_cli_run():
  """A module's `__main__` block calls `cli.run`, never absl's `app.run`
  (whose `--help` exits 1 and whose usage errors print the whole usage)."""
  package = _REPO / 'agent_tunix'
  bare = []
  for path in sorted(package.rglob('*.py')):
    if path == package / 'cli.py':
      continue
    text = path.read_text()
    if "__name__ == '__main__'" in text and 'app.run(' in text:
      bare.append(str(path.relative_to(_REPO)))
  assert not bare, f'app.run instead of cli.run in {bare}'
