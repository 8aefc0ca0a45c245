"""The learning-rate schedule across resumes: its span is kept with the run.

A run's learning rate warms up and then decays to 0 (cosine) over a span of
optimizer updates: at the first start, from update 0 over training.num_steps
x grpo.num_iterations updates. Every checkpoint saves the span (meta key
'schedule') and a resume keeps it, whatever training.num_steps says now:

  * the same num_steps: the same curve, as if the run had never stopped;
  * a smaller num_steps: the same curve, stopped early (the rate never gets
    to 0), logged;
  * a larger num_steps would go on past the span's end, where the rate is
    0 and nothing is learned: refused (ConfigError), naming the fix;
  * with training.reset_schedule=True, a num_steps other than the span's
    end starts a new span at the resumed update, a new warmup and decay to
    the new end; a rerun of the same command (num_steps now the span's end)
    keeps that span.

Each resume logs the rate of the last update and of the next in one line.
A checkpoint from before spans were saved has the span of the run's first
start, read from its stored config (config.json), or of the current config
when there is none. Imports only config.
"""

import dataclasses

from agent_tunix.config import validation

META_KEY = 'schedule'


@dataclasses.dataclass(frozen=True)
class Span:
  """Warmup + decay over optimizer updates start .. start + length."""
  start: int
  length: int

  @property
  def end(self):
    return self.start + self.length

  def to_meta(self):
    return {'start': self.start, 'length': self.length}

  @classmethod
  def from_meta(cls, record):
    return cls(int(record['start']), int(record['length']))


def first_span(config):
  """The span of a run's first start: all of training.num_steps."""
  return Span(0, config.training.num_steps * config.grpo.num_iterations)


def _steps(updates, config):
  """Training steps of a number of optimizer updates."""
  return updates // config.grpo.num_iterations


def saved_span(config, meta, stored_config):
  """The span a checkpoint was trained with.

  Args:
    config: the current config.
    meta: the checkpoint's meta dict.
    stored_config: the run's stored config.json (a flat dict) or None.

  Returns:
    (Span, where it came from: a few words for the log).
  """
  if META_KEY in meta:
    return Span.from_meta(meta[META_KEY]), 'saved with the checkpoint'
  steps = (stored_config or {}).get('training.num_steps')
  if steps is None:
    return first_span(config), 'the current config (no span was saved)'
  return (Span(0, int(steps) * config.grpo.num_iterations),
          "the first start's config.json")


def resumed_span(config, meta, updates, stored_config=None):
  """The span a resumed run trains with (see the module docstring).

  Args:
    config: the current config.
    meta: the meta dict of the checkpoint resumed from.
    updates: optimizer updates done (the restored optimizer's step count).
    stored_config: the run's stored config.json (a flat dict) or None.

  Returns:
    (Span, whether it differs from the saved one).

  Raises:
    ConfigError: when training.num_steps runs past the span's end without
      training.reset_schedule.
  """
  span, _ = saved_span(config, meta, stored_config)
  mu = config.grpo.num_iterations
  end = config.training.num_steps * mu
  if end == span.end or end <= updates:
    return span, False
  if config.training.reset_schedule:
    return Span(updates, end - updates), True
  if end < span.end:
    return span, False
  step = _steps(updates, config)
  raise validation.ConfigError(
      f'config.training.num_steps={config.training.num_steps} goes past the '
      f'end of the learning-rate schedule this run trains with (warmup + '
      f'cosine decay to 0 over steps {_steps(span.start, config) + 1}-'
      f'{_steps(span.end, config)}): steps after '
      f'{_steps(span.end, config)} would train at rate 0. Add '
      '--config.training.reset_schedule=true for a new warmup and decay over '
      f'steps {step + 1}-{config.training.num_steps}, or keep num_steps <= '
      f'{_steps(span.end, config)}.'
  )


def describe(config, old, new, old_rate, new_rate, updates):
  """The one log line of a resume: the span and the rate before and after."""
  step = _steps(updates, config)
  first, last = _steps(new.start, config) + 1, _steps(new.end, config)
  if new != old:
    return (f'Learning rate: a new warmup + cosine decay over steps {first}-'
            f'{last} (training.reset_schedule=True, num_steps '
            f'{_steps(old.end, config)} -> {config.training.num_steps}): '
            f'{old_rate:.3g} at step {step} -> {new_rate:.3g} at step '
            f'{step + 1}.')
  line = (f'Learning rate: resuming the schedule over steps {first}-{last}: '
          f'{old_rate:.3g} at step {step} -> {new_rate:.3g} at step '
          f'{step + 1}')
  if config.training.num_steps < last:
    line += (f'; training.num_steps={config.training.num_steps} stops it '
             f'before its end (step {last})')
  return line + '.'
