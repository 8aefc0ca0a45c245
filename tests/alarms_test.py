"""Alarms on synthetic metric streams, and stop_on_alarm in a tiny run."""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import json  # pylint: disable=g-import-not-at-top
import logging as py_logging
import pathlib
import subprocess
import sys

from absl import logging
import numpy as np
import pytest

from agent_tunix.config import validation
from agent_tunix.run import alarms
from agent_tunix.run import checkpoint
from agent_tunix.run import train
from agent_tunix.configs import base
from agent_tunix.configs import tiny

_REPO = pathlib.Path(__file__).resolve().parents[1]


def _config(**overrides):
  config = base.get_config()
  for key, value in overrides.items():
    section, field = key.split('.')
    config[section][field] = value
  return config


def _normal(step, rng):
  """Scalars of a healthy step: no alarm should fire."""
  return {
      'entropy': float(rng.uniform(0.3, 1.2)),
      'frac_reward_zero_std': float(rng.uniform(0.2, 0.7)),
      'completion/clipped_ratio': float(rng.uniform(0.0, 0.3)),
      'reward/mean': 1.0 + 0.01 * step + float(rng.normal(0, 0.05)),
  }


def test_a_normal_stream_raises_no_alarm():
  monitor = alarms.Monitor(_config())
  rng = np.random.default_rng(0)
  written = [monitor.after_eval(0, {'accuracy': 0.2})]
  for step in range(1, 201):
    written.append(monitor.update(step, _normal(step, rng)))
    if step % 20 == 0:  # Accuracy climbs with the reward.
      written.append(monitor.after_eval(step, {'accuracy': 0.2 + step / 1e3}))
  names = {name for scalars in written for name in scalars}
  assert names == {alarms.PREFIX + n for n in alarms.NAMES}
  assert all(v == 0.0 for scalars in written for v in scalars.values())
  assert not any(monitor.fired(step) for step in range(201))


# (alarm, watched scalar, value that hits, value that misses, config).
_WINDOWED = [
    (alarms.ENTROPY_COLLAPSE, 'entropy', 0.01, 0.05,
     {'alarms.entropy_min': 0.05, 'alarms.entropy_steps': 3}),
    (alarms.ZERO_REWARD_SPREAD, 'frac_reward_zero_std', 0.9, 0.85,
     {'alarms.zero_std_frac': 0.9, 'alarms.zero_std_steps': 3}),
    (alarms.LENGTH_LIMIT, 'completion/clipped_ratio', 0.75, 0.4,
     {'alarms.clipped_frac': 0.5, 'alarms.clipped_steps': 3}),
]


class _Records(py_logging.Handler):
  """Collects the absl logger's records (it may not propagate to caplog)."""

  def __init__(self):
    super().__init__(py_logging.INFO)
    self.records = []

  def emit(self, record):
    self.records.append(record)


@pytest.mark.parametrize('name,metric,hit,miss,overrides', _WINDOWED)
def test_windowed_alarm_fires_after_its_window_only(name, metric, hit, miss,
                                                    overrides):
  absl_logger = py_logging.getLogger('absl')
  handler = _Records()
  absl_logger.addHandler(handler)
  try:
    monitor = alarms.Monitor(_config(**overrides))
    rng = np.random.default_rng(1)
    # Two hits, a miss (the window starts again), then five hits.
    values = [hit, hit, miss, hit, hit, hit, hit, hit]
    fired = []
    for step, value in enumerate(values, start=1):
      scalars = {**_normal(step, rng), metric: value}
      out = monitor.update(step, scalars)
      fired.append(out[alarms.PREFIX + name])
      # The other windowed alarms stay quiet.
      assert all(v == 0.0 for k, v in out.items()
                 if k != alarms.PREFIX + name), (step, out)
      assert monitor.fired(step) == ([name] if fired[-1] else [])
  finally:
    absl_logger.removeHandler(handler)
  assert fired == [0, 0, 0, 0, 0, 1, 1, 1]
  # One warning when it starts firing (not one per step), naming the alarm,
  # the field and what to try.
  warnings = [r.getMessage() for r in handler.records
              if r.levelno == py_logging.WARNING]
  assert len(warnings) == 1, warnings
  assert warnings[0].startswith(f'Alarm {name} at step 6: {metric} was ')
  assert f'alarms.{list(overrides)[0].split(".")[1]}=' in warnings[0]
  assert alarms.hint(name, _config()) in warnings[0]
  # message() is the latest firing verdict's.
  assert monitor.message(name) == warnings[0].replace('step 6', 'step 8')
  # A miss clears it.
  out = monitor.update(9, {**_normal(9, rng), metric: miss})
  assert out[alarms.PREFIX + name] == 0.0 and not monitor.fired(9)


@pytest.mark.parametrize('name,metric,hit,miss,overrides', _WINDOWED)
def test_a_window_of_zero_turns_an_alarm_off(name, metric, hit, miss,
                                             overrides):
  del miss
  steps_field = [k for k in overrides if k.endswith('_steps')][0]
  monitor = alarms.Monitor(_config(**{**overrides, steps_field: 0}))
  for step in range(1, 20):
    assert monitor.update(step, {metric: hit})[alarms.PREFIX + name] == 0.0


def test_a_step_without_the_scalar_empties_the_window():
  monitor = alarms.Monitor(_config(**{'alarms.entropy_steps': 2}))
  assert monitor.update(1, {'entropy': 0.0})['alarm/entropy_collapse'] == 0
  assert monitor.update(2, {})['alarm/entropy_collapse'] == 0
  assert monitor.update(3, {'entropy': 0.0})['alarm/entropy_collapse'] == 0
  assert monitor.update(4, {'entropy': 0.0})['alarm/entropy_collapse'] == 1


def _hacking_stream(monitor, rewards, accuracy_before, accuracy_after,
                    first=1):
  """Eval, training steps with `rewards`, eval; returns the second verdict."""
  before = monitor.after_eval(first - 1, {'accuracy': accuracy_before})
  assert before == {'alarm/reward_hacking': 0.0}
  for i, reward in enumerate(rewards):
    monitor.update(first + i, {'reward/mean': reward})
  return monitor.after_eval(first + len(rewards) - 1,
                            {'accuracy': accuracy_after})


def test_reward_hacking_fires_when_reward_rises_and_accuracy_falls():
  config = _config(**{'alarms.hacking_reward_rise': 0.5,
                      'alarms.hacking_accuracy_drop': 0.05})
  rng = np.random.default_rng(2)
  rewards = 1.0 + 0.1 * np.arange(10) + rng.normal(0, 0.02, 10)
  monitor = alarms.Monitor(config)
  out = _hacking_stream(monitor, rewards, 0.40, 0.30, first=11)
  assert out == {'alarm/reward_hacking': 1.0}
  assert monitor.fired(20) == [alarms.REWARD_HACKING]
  assert 'fell from 0.4 to 0.3' in monitor.message(alarms.REWARD_HACKING)
  assert 'steps 11-20' in monitor.message(alarms.REWARD_HACKING)
  # The next interval is judged afresh: accuracy recovers, quiet again.
  for step in range(21, 31):
    monitor.update(step, {'reward/mean': 2.0 + 0.1 * step})
  assert monitor.after_eval(30, {'accuracy': 0.5}) == {
      'alarm/reward_hacking': 0.0}
  assert not monitor.fired(30)


def test_reward_hacking_on_rubric_rows_watches_the_rubric_score():
  config = _config(**{'alarms.hacking_reward_rise': 0.5,
                      'alarms.hacking_accuracy_drop': 0.05})
  monitor = alarms.Monitor(config)
  # Accuracy means nothing on rubric rows (always 0 there): the judge's
  # score of the held-out answers is what the reward stands for.
  monitor.after_eval(0, {'accuracy': 0.0, 'rubric_score': 0.6})
  for step in range(1, 11):
    monitor.update(step, {'reward/mean': 0.1 * step})
  assert monitor.after_eval(10, {'accuracy': 0.0, 'rubric_score': 0.4}) == {
      'alarm/reward_hacking': 1.0}
  assert 'rubric_score fell from 0.6 to 0.4' in monitor.message(
      alarms.REWARD_HACKING)


def test_reward_rise_is_the_least_squares_line_over_the_interval():
  monitor = alarms.Monitor(_config())
  monitor.after_eval(100, {'accuracy': 0.5})
  rng = np.random.default_rng(3)
  steps = np.arange(101, 131)
  rewards = rng.normal(0, 1, steps.size) + 0.03 * steps
  for step, reward in zip(steps, rewards):
    monitor.update(int(step), {'reward/mean': float(reward)})
  slope = np.polyfit(steps, rewards, 1)[0]
  np.testing.assert_allclose(monitor.reward_rise(),
                             slope * (steps[-1] - steps[0]), rtol=1e-9)


@pytest.mark.parametrize('rewards,before,after,why', [
    (np.linspace(1, 2, 10), 0.40, 0.45, 'accuracy rose'),
    (np.linspace(1, 2, 10), 0.40, 0.38, 'accuracy fell by less than 0.05'),
    (np.full(10, 1.5), 0.40, 0.10, 'reward flat'),
    (np.linspace(2, 1, 10), 0.40, 0.10, 'reward fell'),
    (np.array([1.0]), 0.40, 0.10, 'one step: no line'),
])
def test_reward_hacking_stays_quiet(rewards, before, after, why):
  monitor = alarms.Monitor(_config())
  assert _hacking_stream(monitor, rewards, before, after) == {
      'alarm/reward_hacking': 0.0}, why


def test_reward_hacking_off_and_first_evaluation():
  monitor = alarms.Monitor(_config(**{'alarms.hacking': False}))
  assert _hacking_stream(monitor, np.linspace(1, 3, 10), 0.9, 0.0) == {
      'alarm/reward_hacking': 0.0}
  # The first evaluation has nothing to compare with.
  monitor = alarms.Monitor(_config())
  for step in range(1, 11):
    monitor.update(step, {'reward/mean': float(step)})
  assert monitor.after_eval(10, {'accuracy': 0.0}) == {
      'alarm/reward_hacking': 0.0}


def _stream(step):
  """A stream on which windows fill, empty and the hacking alarm fires."""
  low = step % 7 not in (0, 1)
  return {
      'entropy': 0.01 if low else 0.5,
      'frac_reward_zero_std': 1.0 if step % 5 else 0.0,
      'completion/clipped_ratio': 0.9 if step > 4 else 0.1,
      'reward/mean': 0.2 * step,
  }


def _drive(monitor, steps, every=6):
  """Feeds steps (and an evaluation every `every` steps); returns outputs."""
  out = []
  for step in steps:
    out.append(monitor.update(step, _stream(step)))
    if step % every == 0:
      out.append(monitor.after_eval(step, {'accuracy': 1.0 / step}))
  return out


def test_state_round_trip_repeats_the_uninterrupted_verdicts():
  config = _config(**{'alarms.entropy_steps': 3, 'alarms.zero_std_steps': 3,
                      'alarms.clipped_steps': 3})
  whole = alarms.Monitor(config)
  whole.after_eval(0, {'accuracy': 1.0})
  expected = _drive(whole, range(1, 31))
  assert any(v == 1.0 for out in expected for v in out.values())
  for cut in (3, 5, 6, 10, 11, 17):
    first = alarms.Monitor(config)
    first.after_eval(0, {'accuracy': 1.0})
    got = _drive(first, range(1, cut + 1))
    # Through JSON, as in a checkpoint's metadata.
    state = json.loads(json.dumps(first.state()))
    resumed = alarms.Monitor(config)
    resumed.load(state)
    got += _drive(resumed, range(cut + 1, 31))
    assert got == expected, cut


def test_config_validation_names_the_field():
  config = tiny.get_config()
  config.alarms.clipped_frac = 1.5
  with pytest.raises(validation.ConfigError, match='alarms.clipped_frac'):
    validation.validate(config)
  config = tiny.get_config()
  config.alarms.entropy_steps = -1
  with pytest.raises(validation.ConfigError, match='alarms.entropy_steps'):
    validation.validate(config)


def test_stop_on_alarm_saves_names_the_alarm_and_resumes(tmp_path):
  """The CLI stops with a checkpoint and a message; a rerun keeps the state.

  The entropy threshold is huge, so entropy_collapse fires as soon as its
  2-step window is full: at step 2 of 4.
  """
  workdir = tmp_path / 'run'
  args = ['--config.alarms.entropy_min=1e9',
          '--config.alarms.entropy_steps=2',
          '--config.training.stop_on_alarm=true',
          '--config.training.num_steps=4',
          '--config.checkpoint.save_interval_steps=0',
          '--config.checkpoint.async_save=false']
  proc = subprocess.run(
      [sys.executable, '-m', 'agent_tunix.main', '--config=configs/tiny.py',
       f'--workdir={workdir}', *args], cwd=_REPO,
      env=dict(os.environ, PYTHONPATH=str(_REPO), JAX_PLATFORMS='cpu'),
      capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 1, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('stopped after step 2 by alarm entropy_collapse'), (
      last)
  assert 'Alarm entropy_collapse at step 2: entropy was below ' in proc.stderr
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result['step'] == 2 and result['alarms'] == ['entropy_collapse']
  assert result['preempted'] is False
  ckpt = checkpoint.Checkpointer(str(workdir), tiny.get_config().checkpoint,
                                 read_only=True)
  assert ckpt.all_steps() == [2]  # Saved only because of the stop.
  ckpt.close()
  # Resumed in the same process: the restored window [1, 2] -> [2, 3] is
  # full again after one step, so it stops at 3 (a fresh window would not
  # fire before step 4). Step 3 is also evaluated and saved on schedule
  # (both may change on resume).
  config = tiny.get_config()
  config.alarms.entropy_min = 1e9
  config.alarms.entropy_steps = 2
  config.training.stop_on_alarm = True
  config.training.num_steps = 4
  config.eval.eval_every_n_steps = 3
  config.checkpoint.save_interval_steps = 3
  config.checkpoint.async_save = False
  logging.set_verbosity(logging.INFO)
  resumed = train.train_and_evaluate(config, str(workdir))
  assert resumed['step'] == 3 and resumed['alarms'] == ['entropy_collapse']
  assert resumed['scalars']['alarm/entropy_collapse'] == 1.0
  # The checkpoint of step 3 was saved after step 3's evaluation, so its
  # alarm state holds that evaluation (reward_hacking's next baseline).
  ckpt = checkpoint.Checkpointer(str(workdir), config.checkpoint,
                                 read_only=True)
  meta = ckpt.restore(None, step=3).meta
  ckpt.close()
  assert meta['alarms']['last_eval'][0] == 3
  window = meta['alarms']['recent']['entropy_collapse']
  assert len(window) == 2
  assert window[-1] == pytest.approx(resumed['scalars']['entropy'])
