"""Tests for agent_tunix.cli: every command's --help exits 0."""

import os
import pathlib
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
