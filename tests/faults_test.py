"""Faults found by a tester (issue 21), on the tiny model (CPU).

Divergence never reaches a checkpoint; each refusal names the culprit and
the fix.
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import pathlib  # pylint: disable=g-import-not-at-top

import pytest

from agent_tunix import divergence
from agent_tunix import train
from configs import tiny


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
  bad = _config(**{'optimizer.learning_rate': 1e30,
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
