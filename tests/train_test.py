"""End-to-end tests of the GRPO loop on the tiny random model (CPU).

One 2-step `train_and_evaluate` run is shared by most tests. Its rewards
include `reward_fixtures:text_length` (tests/reward_fixtures.py), which
differs between the random model's completions, so advantages are non-zero
and the LoRA parameters really move.
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import dataclasses  # pylint: disable=g-import-not-at-top
import json
import math

from flax import nnx
import jax
import numpy as np
import pytest
import tb_events
from tensorboard.plugins.hparams import plugin_data_pb2

from agent_tunix import plot
from agent_tunix import rewards
from agent_tunix.run import checkpoint
from agent_tunix.run import train
from agent_tunix.configs import tiny

_REWARDS = 'format_approx=1,answer=1,reward_fixtures:text_length=1'
_PER_STEP_SCALARS = (
    'reward/mean', 'reward/std', 'reward/format_approx/mean',
    'reward/answer/mean', 'reward/reward_fixtures_text_length/mean',
    'frac_reward_zero_std', 'completion/mean_length',
    'completion/clipped_ratio', 'loss', 'kl', 'clip_ratio', 'entropy',
    'grad_norm', 'learning_rate', 'time/rollout_s', 'time/update_s',
    'tokens_per_s', 'storage/retries', 'sampler/logp_abs_diff',
    'alarm/entropy_collapse',
    'alarm/zero_reward_spread', 'alarm/length_limit', 'kl_coeff',
)
_EVAL_SCALARS = (
    'eval/accuracy', 'eval/accuracy_stderr', 'eval/format_accuracy',
    'eval/format_accuracy_stderr', 'eval/pass_at_k', 'eval/pass_at_k_stderr',
)


read_events = tb_events.read_events


def _config(**overrides):
  config = tiny.get_config()
  config.rewards.functions = _REWARDS
  for key, value in overrides.items():
    section, field = key.split('.')
    config[section][field] = value
  return config


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  """(config, workdir, result) of one 2-step training run."""
  workdir = tmp_path_factory.mktemp('train')
  config = _config()
  result = train.train_and_evaluate(config, str(workdir))
  return config, workdir, result


def test_returns_final_step_and_finite_scalars(run):
  _, _, result = run
  assert result['step'] == 2
  assert result['preempted'] is False and result['alarms'] == []
  assert set(result['scalars']) == set(_PER_STEP_SCALARS)
  for name, value in result['scalars'].items():
    assert math.isfinite(value), (name, value)
  assert set(result['eval']) == {t.split('/')[1] for t in _EVAL_SCALARS}
  for value in result['eval'].values():
    assert 0 <= value <= 1


def test_event_file_has_every_metric(run):
  config, workdir, _ = run
  events = read_events(workdir)
  for tag in _PER_STEP_SCALARS:
    assert sorted(events[tag]) == [1, 2], tag
    for step, (value, plugin, _) in events[tag].items():
      assert plugin == 'scalars', (tag, plugin)
      assert np.isfinite(value), (tag, step, value)
  for tag in _EVAL_SCALARS:
    assert sorted(events[tag]) == [0, 2], tag  # Before and after training.
  # No alarm fires in 2 steps with the default windows (10 steps); the
  # reward-hacking verdict comes with each evaluation.
  for tag in ('alarm/entropy_collapse', 'alarm/zero_reward_spread',
              'alarm/length_limit'):
    assert {s: float(v[0]) for s, v in events[tag].items()} == {
        1: 0.0, 2: 0.0}, tag
  assert {s: float(v[0]) for s, v in events['alarm/reward_hacking'].items()
          } == {0: 0.0, 2: 0.0}
  assert sorted(events['samples']) == [0, 1, 2]
  value, plugin, _ = events['samples'][1]
  assert plugin == 'text'
  assert '**sample 0** reward:' in value.item().decode()
  # The machine, once per start (this run started once).
  (value, plugin, _), = events['machine'].values()
  assert plugin == 'text' and sorted(events['machine']) == [0]
  assert 'usable, ISA:' in value.item().decode()
  # Varied rewards: this run trains on non-zero advantages.
  assert events['reward/std'][1][0] > 0
  assert events['grad_norm'][1][0] > 0
  # float32 on CPU: sampler and trainer agree on the sampled tokens.
  assert 0 <= events['sampler/logp_abs_diff'][1][0] < 1e-3
  assert events['learning_rate'][1][0] == pytest.approx(
      config.optimizer.learning_rate)
  (_, plugin, content), = events['_hparams_/session_start_info'].values()
  assert plugin == 'hparams'
  hparams = plugin_data_pb2.HParamsPluginData.FromString(
      content).session_start_info.hparams
  assert hparams['training.num_steps'].number_value == 2
  assert hparams['rewards.functions'].string_value == _REWARDS


def test_plot_draws_the_run(run, tmp_path):
  _, workdir, result = run
  events = read_events(workdir)
  output = tmp_path / 'run.png'
  drawn = plot.plot(str(workdir), str(output))
  assert output.stat().st_size > 10_000

  def logged(tag):
    steps = sorted(events[tag])
    return steps, [pytest.approx(float(events[tag][s][0])) for s in steps]

  assert drawn == {
      'Reward': {
          'total': logged('reward/mean'),
          'format_approx': logged('reward/format_approx/mean'),
          'answer': logged('reward/answer/mean'),
          'reward_fixtures_text_length':
              logged('reward/reward_fixtures_text_length/mean'),
      },
      'Eval accuracy': {
          'accuracy': logged('eval/accuracy'),
          'format accuracy': logged('eval/format_accuracy'),
      },
      'Completion length': {'mean': logged('completion/mean_length')},
      'KL to the reference': {'kl': logged('kl')},
      'Entropy': {'entropy': logged('entropy')},
  }
  assert drawn['Reward']['total'][0] == [1, 2]
  # The last eval point is the final evaluation the run returned.
  steps, values = drawn['Eval accuracy']['accuracy']
  assert steps == [0, 2]
  assert values[-1] == pytest.approx(result['eval']['accuracy'])


def test_checkpoints_written(run):
  _, workdir, _ = run
  steps = sorted(int(p.name) for p in (workdir / 'checkpoints').iterdir()
                 if p.name.isdigit())
  assert steps == [1, 2]


def test_lora_params_move_away_from_their_init(run, tmp_path):
  config, workdir, _ = run
  # A fresh session starts from the same seeded LoRA init as the run did.
  session = train.setup(config, str(tmp_path), with_data=False)
  initial = jax.device_get(
      nnx.to_pure_dict(checkpoint.lora_state(session.model)))
  assert train.restore_lora(session, str(workdir)) == 2
  final = jax.device_get(
      nnx.to_pure_dict(checkpoint.lora_state(session.model)))
  pairs = list(zip(jax.tree.leaves(initial), jax.tree.leaves(final)))
  assert pairs
  changed = [not np.array_equal(a, b) for a, b in pairs]
  assert all(np.all(np.isfinite(b)) for _, b in pairs)
  # Every adapter gets a gradient (B starts at zero, A sees the B gradient
  # after the first update), so every array changes in two steps.
  assert all(changed), f'{changed.count(False)} of {len(pairs)} unchanged'


def test_non_finite_reward_stops_the_run(tmp_path):
  # Greedy rollouts of the same shape as the evaluation, so the sampler is
  # compiled once for both.
  config = _config(**{
      'rewards.functions': 'format_approx=1,reward_fixtures:nan_reward=1',
      'generation.temperature': 0.0,
      'eval.pass_at_k': 0,
      'eval.batch_size': 4,
  })
  with pytest.raises(rewards.RewardError, match='reward_fixtures:nan_reward'):
    train.train_and_evaluate(config, str(tmp_path))
  # Nothing was trained, so nothing was saved.
  assert not list((tmp_path / 'checkpoints').glob('[0-9]*'))


def test_schedule_spans_every_update_with_several_iterations(tmp_path):
  # mu = 2 updates per step: the schedule must span num_steps * mu updates,
  # or the learning rate reaches 0 half-way and the LoRA stops moving.
  config = _config(**{
      'training.num_steps': 4,
      'grpo.num_iterations': 2,
      'checkpoint.max_to_keep': 5,
      'eval.pass_at_k': 0,
  })
  train.train_and_evaluate(config, str(tmp_path / 'run'))
  session = train.setup(config, str(tmp_path / 'fresh'), with_data=False)
  states = []
  for step in range(5):
    if step:
      assert train.restore_lora(session, str(tmp_path / 'run'), step) == step
    states.append(jax.tree.leaves(jax.device_get(
        nnx.to_pure_dict(checkpoint.lora_state(session.model)))))
  for step in range(1, 5):
    moved = [not np.array_equal(a, b)
             for a, b in zip(states[step - 1], states[step])]
    assert any(moved), f'LoRA unchanged by step {step}'
  # The logged rate is the one the step's last update used: update 2s - 1
  # of a cosine over 8 updates (no warmup at 4 steps x ratio 0.1).
  events = read_events(tmp_path / 'run')
  peak = config.optimizer.learning_rate
  for step in range(1, 5):
    expected = 0.5 * peak * (1 + math.cos(math.pi * (2 * step - 1) / 8))
    assert events['learning_rate'][step][0] == pytest.approx(
        expected, rel=1e-5), step


def test_objective_menu_trains_and_logs(tmp_path):
  # GSPO, the entropy bonus, adaptive KL and MaxEnt-GRPO at once: two
  # steps train, each logs its metric, and the KL coefficient follows the
  # controller from the logged KL.
  config = _config(**{
      'training.num_steps': 2,
      'grpo.importance_sampling_level': 'sequence',
      'grpo.epsilon': 3e-4,
      'grpo.epsilon_high': 4e-4,
      'grpo.loss_agg_mode': 'sequence-mean-token-mean',
      'grpo.entropy_coeff': 0.01,
      'grpo.kl_target': 0.01,
      'grpo.init_kl_coeff': 0.2,
      'grpo.kl_horizon': 32.0,
      'grpo.maxent_tau': 0.5,
      # MaxEnt reads the rewards of the batch dynamic sampling assembles.
      'grpo.dynamic_sampling': True,
      'eval.pass_at_k': 0,
  })
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result['step'] == 2
  events = read_events(tmp_path)
  for tag in ('kl_coeff', 'maxent/target_entropy', 'entropy', 'kl',
              'entropy_bonus'):
    assert set(events[tag]) == {1, 2}, tag
    for step in (1, 2):
      assert math.isfinite(float(events[tag][step][0])), (tag, step)
  coeffs = [float(events['kl_coeff'][s][0]) for s in (1, 2)]
  assert coeffs[0] == pytest.approx(0.2)
  n = config.training.batch_size * config.grpo.num_generations
  kl = float(events['kl'][1][0])
  error = min(max(kl / 0.01 - 1, -0.2), 0.2)
  assert coeffs[1] == pytest.approx(0.2 * (1 + error * n / 32.0), rel=1e-6)
  assert coeffs[1] != coeffs[0]
  for step in (1, 2):
    assert float(events['entropy_bonus'][step][0]) == pytest.approx(
        0.01 * float(events['entropy'][step][0]), rel=1e-5)
  # The G target weights of a group have entropy at most log G.
  for step in (1, 2):
    assert 0 < float(events['maxent/target_entropy'][step][0]) <= math.log(
        config.grpo.num_generations) + 1e-6


def test_dynamic_sampling_and_overlong_penalty_train_and_log(tmp_path):
  # Half of the synthetic questions score no spread (reward_fixtures), so
  # steps drop groups and draw more prompts; the tiny model's completions
  # run into the 8-token limit, inside the 4-token overlong buffer.
  config = _config(**{
      'rewards.functions':
          'format_approx=1,answer=1,reward_fixtures:text_length_some_answers=1',
      'rewards.overlong_buffer': 4,
      'rewards.overlong_penalty': 0.5,
      'grpo.dynamic_sampling': True,
      'grpo.max_sampling_rounds': 3,
      'eval.pass_at_k': 0,
  })
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result['step'] == 2
  events = read_events(tmp_path)
  b = config.training.batch_size
  extra = masked_total = 0
  for step in (1, 2):
    value = lambda tag, s=step: float(events[tag][s][0])
    rounds = value('dynamic_sampling/rounds')
    assert rounds in (1, 2, 3)
    assert value('dynamic_sampling/extra_prompts') == (rounds - 1) * b
    extra += value('dynamic_sampling/extra_prompts')
    # Every sampled group is counted: zero-spread share x groups sampled.
    assert value('dynamic_sampling/dropped_groups') == pytest.approx(
        value('frac_reward_zero_std') * rounds * b)
    masked = value('dynamic_sampling/masked_groups')
    assert 0 <= masked < b  # Some group with spread in every step.
    masked_total += masked
    assert value('grad_norm') > 0
    # The overlong penalty is a reward component, in the total.
    overlong = value('reward/overlong_penalty/mean')
    assert -0.5 <= overlong <= 0
    if value('completion/mean_length') == 8:  # All at the limit: -factor.
      assert overlong == -0.5
    parts = sum(value(f'reward/{name}/mean') for name in (
        'format_approx', 'answer', 'reward_fixtures_text_length_some_answers',
        'overlong_penalty'))
    assert value('reward/mean') == pytest.approx(parts, abs=1e-5)
  assert extra > 0, 'no step drew further prompts; the test proves nothing'
  # A step hit the cap: its update masked groups without spread.
  assert masked_total > 0, 'no step reached max_sampling_rounds'
  # The data iterator's saved position covers the extra draws.
  position = json.loads(
      (tmp_path / 'checkpoints' / '2' / 'data' / 'process_0-of-1.json')
      .read_text())['next_index']
  assert position == 2 + extra // b


def test_log_prob_passes_are_dispatched_before_the_rewards(monkeypatch):
  """The reference and old-policy passes need no reward: the step's
  rollout dispatches them first, so they run while the host scores (a
  judge's requests above all); the update then uses them as staged."""
  from agent_tunix.rl import grpo  # pylint: disable=g-import-not-at-top
  config = _config(**{'grpo.beta': 0.04, 'grpo.num_iterations': 2})
  session = train.setup(config, '/unused')
  order = []
  for name in ('reference_logps', 'policy_logps'):
    original = getattr(grpo, name)

    def recorded(*args, _name=name, _original=original, **kwargs):
      order.append(_name)
      return _original(*args, **kwargs)

    monkeypatch.setattr(grpo, name, recorded)

  class RecordedRewards(rewards.RewardSet):

    def __call__(self, *args, **kwargs):
      order.append('rewards')
      return super().__call__(*args, **kwargs)

  step_rollout = dataclasses.replace(
      session.rollout, reward_set=RecordedRewards(_REWARDS))
  result = step_rollout(next(session.train_iter), 1, session.state.kl_coeff,
                        session.train_iter)
  update, staged = result.update, result.staged
  assert order == ['reference_logps', 'policy_logps', 'rewards']
  assert staged.ref_logps is not None and staged.old_logps is not None
  # Rewards, no advantages: the update computes them (grpo.prepare).
  assert update.rewards is not None and update.advantages is None
  scalars = train.update_policy(session, update, staged)
  assert order == ['reference_logps', 'policy_logps', 'rewards']  # No rerun.
  assert math.isfinite(scalars['loss']) and 'kl' in scalars
  assert session.state.last_batch.ref_logps is staged.ref_logps
  assert session.state.last_batch.old_logps is staged.old_logps


def test_tiny_preset_trains_with_the_calculator_as_written(tmp_path):
  """`python -m agent_tunix.main --config=configs/tiny.py --workdir=W
  --config.training.num_steps=2 --config.agent.tools=calculator`: the tool
  prompts fit the preset's lengths, every one of them is kept, and the run
  trains on episodes."""
  config = tiny.get_config()
  config.training.num_steps = 2
  config.agent.tools = 'calculator'
  from agent_tunix.data import pipeline  # pylint: disable=g-import-not-at-top
  from agent_tunix.models import gemma  # pylint: disable=g-import-not-at-top
  _, stats = pipeline.make_train_iterator(
      config, gemma.load_tokenizer(config.model), turns='gemma3')
  assert stats['dropped_long_prompts'] == 0
  assert stats['num_train_examples'] == config.data.num_train_examples
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result['step'] == 2
  assert 'agent/turns_mean' in result['scalars']
  assert 'tool_use_rate' in result['eval']
  events = read_events(tmp_path)
  assert sorted(events['agent/turns_mean']) == [1, 2]
