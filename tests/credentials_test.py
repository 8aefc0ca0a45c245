"""Tests of agent_tunix.credentials: which keys a config's weights need."""

import os
import pathlib
import subprocess
import sys

import pytest

from agent_tunix import credentials
from agent_tunix.configs import base
from agent_tunix.configs import gemma3_1b
from agent_tunix.configs import gemma4_e2b
from agent_tunix.configs import tiny

_REPO = pathlib.Path(__file__).resolve().parents[1]


def _judged(config, **judge):
  config.rewards.functions = 'rubric_judge=1'
  config.judge.backend = 'gemma'
  for key, value in judge.items():
    config.judge[key] = value
  return config


@pytest.mark.parametrize('config, needs', [
    (base.get_config(), []),  # The offline GGUF default.
    (tiny.get_config(), []),
    (gemma3_1b.get_config(), [('kaggle', 'google/gemma-3/flax/gemma3-1b')]),
    (gemma3_1b.get_config('it'),
     [('kaggle', 'google/gemma-3/flax/gemma3-1b-it')]),
    (gemma4_e2b.get_config(), [('huggingface', 'google/gemma-4-E2B')]),
    # A Gemma judge with weights of its own, from its own source.
    (_judged(tiny.get_config(), preset='gemma3_1b', source='kaggle',
             path='google/gemma-3/flax/gemma3-1b-it'),
     [('kaggle', 'google/gemma-3/flax/gemma3-1b-it')]),
    # The policy's own weights as the judge: asked once.
    (_judged(gemma4_e2b.get_config()),
     [('huggingface', 'google/gemma-4-E2B')]),
])
def test_needed(config, needs):
  assert credentials.needed(config) == needs


def test_a_judge_no_reward_uses_needs_nothing():
  config = _judged(tiny.get_config(), preset='gemma3_1b', source='kaggle',
                   path='h')
  config.rewards.functions = 'answer=1'
  assert credentials.needed(config) == []


@pytest.mark.parametrize('source, path, needs', [
    ('hf', 'google/gemma-4-E2B-it', [('huggingface', 'google/gemma-4-E2B-it')]),
    ('hf', '/models/gemma-4', []),
    ('hf', './gemma-4', []),
    ('hf', 'configs', []),  # A local folder with no owner/ part.
    ('hf', 'tests/side', []),  # owner/name, but a folder here.
    ('orbax', 'gs://b/ckpt', []),
    ('gguf', '/m/gemma.gguf', []),
    ('random', '', []),
])
def test_local_paths_need_nothing(source, path, needs, monkeypatch):
  monkeypatch.chdir(_REPO)
  config = base.get_config()
  config.model.source, config.model.path = source, path
  assert credentials.needed(config) == needs


def test_command_prints_one_line_per_credential():
  out = subprocess.run(
      [sys.executable, '-m', 'agent_tunix.credentials',
       '--config=configs/gemma4_e2b.py', '--config.model.preset=gemma4_e2b_it'],
      cwd=_REPO, capture_output=True, text=True, timeout=120, check=False,
      env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout == 'huggingface google/gemma-4-E2B\n'


def test_a_bad_reward_list_is_a_config_error():
  out = subprocess.run(
      [sys.executable, '-m', 'agent_tunix.credentials',
       '--config=configs/tiny.py', '--config.rewards.functions=anwser=1'],
      cwd=_REPO, capture_output=True, text=True, timeout=120, check=False)
  assert out.returncode == 2
  assert out.stderr.startswith('error: rewards.functions entry')
  assert "Did you mean 'answer'?" in out.stderr
