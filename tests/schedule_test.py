"""The learning-rate schedule on a resume (agent_tunix/run/schedule.py).

Table tests of the rule, then one tiny run on CPU: 2 steps, a resume asking
for 4 is refused, and with training.reset_schedule=True steps 3 and 4 train
with a new warmup + cosine decay.
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import logging  # pylint: disable=g-import-not-at-top

import pytest

from agent_tunix.config import validation
from agent_tunix.rl import optimizer as optimizer_lib
from agent_tunix.run import schedule
from agent_tunix.run import train
from agent_tunix.configs import tiny


def _config(num_steps, reset=False, mu=1):
  config = tiny.get_config()
  config.training.num_steps = num_steps
  config.training.reset_schedule = reset
  config.grpo.num_iterations = mu
  return config


def _meta(start, length):
  return {'step': 1, schedule.META_KEY: {'start': start, 'length': length}}


@pytest.mark.parametrize('num_steps, reset, mu, meta, updates, span', [
    # The same num_steps: the saved span, whatever reset says.
    (10, False, 1, _meta(0, 10), 4, schedule.Span(0, 10)),
    (10, True, 1, _meta(0, 10), 4, schedule.Span(0, 10)),
    # A span begun by an earlier reset is kept by a rerun of that command.
    (20, True, 1, _meta(10, 10), 15, schedule.Span(10, 10)),
    # Fewer steps: the same curve, stopped early.
    (6, False, 1, _meta(0, 10), 4, schedule.Span(0, 10)),
    # Fewer steps with reset: a new, shorter decay from the resumed update.
    (6, True, 1, _meta(0, 10), 4, schedule.Span(4, 2)),
    # More steps with reset: a new warmup and decay to the new end.
    (20, True, 1, _meta(0, 10), 10, schedule.Span(10, 10)),
    (20, True, 2, _meta(0, 20), 20, schedule.Span(20, 20)),
    # Nothing left to train: the saved span.
    (4, True, 1, _meta(0, 10), 4, schedule.Span(0, 10)),
])
def test_resumed_span(num_steps, reset, mu, meta, updates, span):
  assert schedule.resumed_span(_config(num_steps, reset, mu), meta,
                               updates)[0] == span


def test_more_steps_without_reset_are_refused_naming_the_fix():
  with pytest.raises(validation.ConfigError) as error:
    schedule.resumed_span(_config(20), _meta(0, 10), 10)
  assert str(error.value) == (
      'config.training.num_steps=20 goes past the end of the learning-rate '
      'schedule this run trains with (warmup + cosine decay to 0 over steps '
      '1-10): steps after 10 would train at rate 0. Add '
      '--config.training.reset_schedule=true for a new warmup and decay over '
      'steps 11-20, or keep num_steps <= 10.')


def test_a_checkpoint_without_a_span_has_the_first_starts():
  config = _config(20, mu=2)
  meta = {'step': 5}
  assert schedule.saved_span(config, meta, {'training.num_steps': 10})[0] == (
      schedule.Span(0, 20))
  assert schedule.saved_span(config, meta, None)[0] == schedule.Span(0, 40)
  with pytest.raises(validation.ConfigError):
    schedule.resumed_span(config, meta, 10, {'training.num_steps': 10})


def test_a_longer_resume_keeps_its_schedule_or_resets_it(tmp_path, caplog):
  workdir = str(tmp_path / 'run')
  config = _config(2)
  config.eval.pass_at_k = 0
  train.train_and_evaluate(config, workdir)
  longer = _config(4)
  longer.eval.pass_at_k = 0
  with pytest.raises(validation.ConfigError, match='reset_schedule=true'):
    train.train_and_evaluate(longer, workdir)
  longer.training.reset_schedule = True
  caplog.set_level(logging.INFO)
  result = train.train_and_evaluate(longer, workdir)
  assert result['step'] == 4
  lines = [r.getMessage() for r in caplog.records
           if r.getMessage().startswith('Learning rate:')]
  # The old schedule's last update (update 1 of a cosine over 2: no warmup
  # at 2 steps) and the new one's first (update 0 of a cosine over 2).
  assert lines == [
      'Learning rate: a new warmup + cosine decay over steps 3-4 '
      '(training.reset_schedule=True, num_steps 2 -> 4): 0.0005 at step 2 '
      '-> 0.001 at step 3.']
  # Step 4 used update 3 of the new schedule (updates 2..4), not of the
  # old rule's warmup + decay over updates 0..4.
  new = optimizer_lib.optimizer_from_config(longer, (2, 2))[1]
  old = optimizer_lib.optimizer_from_config(longer)[1]
  assert result['scalars']['learning_rate'] == pytest.approx(
      float(new(3)), rel=1e-6)
  assert float(new(3)) != pytest.approx(float(old(3)))
  # A rerun of the same command has nothing left to do and keeps the span.
  caplog.clear()
  assert train.train_and_evaluate(longer, workdir)['step'] == 4
  assert [r.getMessage() for r in caplog.records
          if r.getMessage().startswith('Learning rate:')] == [
              'Learning rate: resuming the schedule over steps 3-4: 0.0005 '
              'at step 4 -> 0 at step 5.']
