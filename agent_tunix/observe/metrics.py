"""Metric writing (CLU / TensorBoard), progress reports and sanity checks.

Process 0 writes TensorBoard event files into the workdir (local or gs://,
through the storage layer, without TensorFlow: `events`); every other
process only logs its metrics to its own absl log. A typical loop:

  writer = metrics.create_writer(workdir)
  metrics.write_hparams(writer, config)
  report = metrics.progress_hook(config, num_steps, writer)
  for step in ...:
    with metrics.Timer() as rollout_timer:
      ...
    scalars = metrics.check_finite(step, scalars)
    writer.write_scalars(step, {**scalars,
                                'time/rollout_s': rollout_timer.elapsed})
    report(step)
  writer.close()
"""

import contextlib
import re
import time

from absl import logging
import jax
import ml_collections
import numpy as np

from agent_tunix.observe import events
from agent_tunix.observe import writers

# What to try when the loss or gradients stop being finite.
NON_FINITE_HINT = (
    'lower optimizer.learning_rate or set optimizer.max_grad_norm > 0 '
    '(gradient clipping)'
)
_TAG_BAD_CHARS = re.compile(r'[^A-Za-z0-9_.\-/]+')


def create_writer(workdir, asynchronous=True, config=None):
  """Returns the run's MetricWriter (log lines + TensorBoard [+ W&B]).

  Args:
    workdir: Run directory (local or gs://); TensorBoard event files go here.
    asynchronous: Write from a background thread (call `writer.flush()` or
      `writer.close()` before reading the files).
    config: The run's config; when config.logging.wandb_project is set,
      process 0 also writes to Weights & Biases (`wandb_writer`).

  On processes other than 0 the writer only logs (no files), so a multi-host
  run has one set of event files (and one W&B run).
  """
  chosen = [writers.LoggingWriter()]
  if jax.process_index() == 0:
    chosen.append(events.TensorBoardWriter(workdir))
    if config is not None and config.logging.wandb_project:
      from agent_tunix.observe import wandb_writer  # pylint: disable=g-import-not-at-top
      chosen.append(wandb_writer.create(config.logging, workdir))
  writer = writers.MultiWriter(chosen)
  return writers.AsyncWriter(writer) if asynchronous else writer


@contextlib.contextmanager
def closing(writer):
  """Closes `writer` however the block ends; on an error, quietly.

  Closing waits for an asynchronous writer's queued writes, so that none of
  their errors is logged after the error that ends the run is reported. On
  an error, a failing close is logged and the block's error goes on.
  """
  try:
    yield writer
  except BaseException as error:
    try:
      writer.close()
    except Exception as e:  # pylint: disable=broad-exception-caught
      logging.error('Could not finish writing metrics after %s: %s',
                    type(error).__name__, e)
    raise
  writer.close()


def _hparam_value(value):
  if value is None:
    return 'None'
  if isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, np.generic):
    return value.item()
  return str(value)


def flatten_config(config, leaf=_hparam_value):
  """ConfigDict (or nested dict) -> {'section.field': leaf(value)}.

  By default (hparams) tuples, lists and other values become strings and
  None becomes 'None'; `leaf` maps each value otherwise.
  """
  if isinstance(config, (ml_collections.ConfigDict,
                         ml_collections.FrozenConfigDict)):
    config = config.to_dict()
  flat = {}

  def visit(prefix, node):
    if isinstance(node, dict):
      for key in sorted(node):
        visit(f'{prefix}{key}.', node[key])
    else:
      flat[prefix[:-1]] = leaf(node)

  visit('', config)
  return flat


def write_hparams(writer, config):
  """Writes the flattened config as TensorBoard hyper-parameters."""
  writer.write_hparams(flatten_config(config))


def sanitize_name(name):
  """Makes a safe TensorBoard tag from a free-form name.

  Keeps letters, digits, '_', '.', '-' and '/'; every other run of characters
  becomes one '_' (so 'pkg.mod:fn' -> 'pkg.mod_fn'). Leading and trailing '/'
  are dropped and '//' collapses; an empty result is '_'.
  """
  tag = _TAG_BAD_CHARS.sub('_', str(name).strip())
  tag = re.sub('/+', '/', tag).strip('/')
  return tag or '_'


def check_finite(step, scalars, hint=NON_FINITE_HINT):
  """Returns {name: float}, or raises if any value is NaN or infinite.

  Args:
    step: The training step, for the message.
    scalars: {name: number or array}. A 0-d value becomes a float; larger
      arrays are returned as float64 NumPy arrays and count as non-finite if
      any element is.
    hint: What to try, appended to the message.

  Raises:
    FloatingPointError: naming the step and every non-finite value, e.g.
      'loss=nan at step 12; lower optimizer.learning_rate ...'.
  """
  values, bad = {}, []
  for name, value in scalars.items():
    array = np.asarray(jax.device_get(value), dtype=np.float64)
    values[name] = float(array) if array.ndim == 0 else array
    if not np.all(np.isfinite(array)):
      shown = values[name] if array.ndim == 0 else f'{array.tolist()}'
      bad.append(f'{name}={shown}')
  if bad:
    raise FloatingPointError(
        f'{", ".join(bad)} at step {step}; {hint}.'
    )
  return values


def _duration(seconds):
  """'1h05m' / '7m' (whole minutes), like CLU's ETA."""
  hours, minutes = divmod(int(seconds // 60), 60)
  return f'{hours}h{minutes:02d}m' if hours else f'{minutes}m'


class _Progress:
  """Logs the pace, percent done and ETA every `every_steps` steps.

  Below one step per second the pace reads '30.0 s/step', not
  '0.0 steps/s'. Returns from each call whether it reported.
  """

  def __init__(self, num_train_steps, writer, every_steps):
    self._num_train_steps = num_train_steps
    self._writer = writer
    self._every = every_steps
    self._t0 = time.monotonic()
    self._previous_step = None
    self._previous_time = None

  def __call__(self, step, t=None):
    t = time.monotonic() if t is None else t
    if self._previous_step is None:
      self._previous_step, self._previous_time = step, t
      return False
    if step % self._every and step != self._num_train_steps:
      return False
    if step <= self._previous_step:
      return False
    self._report(step, t)
    self._previous_step, self._previous_time = step, t
    return True

  def _report(self, step, t):
    seconds_per_step = (t - self._previous_time) / (step - self._previous_step)
    steps_per_sec = 1 / seconds_per_step if seconds_per_step > 0 else 0.0
    pace = (f'{steps_per_sec:.1f} steps/s' if steps_per_sec >= 1
            else f'{seconds_per_step:.1f} s/step')
    total = self._num_train_steps
    logging.info('Progress: %s, %.1f%% (%d/%d), ETA: %s', pace,
                 100 * step / total, step, total,
                 _duration((total - step) * seconds_per_step))
    if self._writer is not None:
      self._writer.write_scalars(step, {
          'steps_per_sec': steps_per_sec,
          'uptime': time.monotonic() - self._t0,
      })


def progress_hook(config, num_steps, writer):
  """Returns a progress hook: call it with the step after each step.

  It logs the pace (steps/s, or s/step when slower than one step a second),
  percent done and ETA every config.logging.report_every_n_steps steps (and
  at `num_steps`) and writes 'steps_per_sec' and 'uptime' scalars. Call it
  after every step, with consecutive steps; the first call only starts the
  clock (so after a resume the pace is measured from the first new step).

  Raises:
    ValueError: if logging.report_every_n_steps < 1.
  """
  every = config.logging.report_every_n_steps
  if every < 1:
    raise ValueError(
        f'logging.report_every_n_steps must be >= 1, got {every}.'
    )
  return _Progress(num_train_steps=num_steps, writer=writer,
                   every_steps=every)


def _fence(text):
  """A backtick fence longer than any backtick run in `text`."""
  longest = max((len(run) for run in re.findall('`+', text)), default=0)
  return '`' * max(3, longest + 1)


def _code_block(text):
  fence = _fence(text)
  return f'{fence}\n{text}\n{fence}'


def _truncate_tail(text, max_chars):
  """Keeps the first max_chars characters."""
  if len(text) <= max_chars:
    return text
  return f'{text[:max_chars]}... [{len(text) - max_chars} more characters]'


def _truncate_head(text, max_chars):
  """Keeps the last max_chars characters (a prompt's question is last)."""
  if len(text) <= max_chars:
    return text
  return f'[{len(text) - max_chars} characters before] ...{text[-max_chars:]}'


def _reward_line(rewards, i):
  """Inline code with sample i's reward(s), e.g. `answer=1, format=0.5`."""
  if isinstance(rewards, dict):
    text = ', '.join(f'{k}={float(np.asarray(v)[i]):.3g}'
                     for k, v in rewards.items())
  else:
    text = f'{float(np.asarray(rewards)[i]):.4g}'
  return '`' + text.replace('`', "'") + '`'


def format_samples(prompts, completions, rewards, n, max_chars=1500):
  """Markdown for the first `n` samples (TensorBoard's text dashboard).

  Prompts and completions go in fenced code blocks, so model output (tags
  like <answer>, '*', '#', newlines) is shown literally, not rendered.

  Args:
    prompts: Sequence of prompt strings, one per completion.
    completions: Sequence of completion strings.
    rewards: Sequence of total rewards, or {reward name: sequence}.
    n: How many samples to show (the first n).
    max_chars: Prompts keep their last, completions their first, max_chars
      characters.
  """
  n = min(n, len(completions))
  sections = []
  for i in range(n):
    sections.append(
        f'**sample {i}** reward: {_reward_line(rewards, i)}\n\n'
        f'prompt:\n\n{_code_block(_truncate_head(str(prompts[i]), max_chars))}'
        f'\n\ncompletion:\n\n'
        f'{_code_block(_truncate_tail(str(completions[i]), max_chars))}'
    )
  return '\n\n---\n\n'.join(sections)


def write_samples(writer, step, prompts, completions, rewards, n,
                  max_chars=1500):
  """Writes the first `n` samples as one text summary, tag 'samples'.

  See `format_samples` for the arguments. Does nothing when n <= 0 or there
  are no completions.
  """
  if n <= 0 or not len(completions):  # pylint: disable=g-explicit-length-test
    return
  writer.write_texts(
      step, {'samples': format_samples(prompts, completions, rewards, n,
                                       max_chars)}
  )


class Timer:
  """Wall-clock timer: `with Timer() as t: ...`, then `t.elapsed` seconds.

  Inside the block `elapsed` is the time so far. JAX dispatches work
  asynchronously: block on the results inside the block (e.g.
  `jax.block_until_ready`) to time the computation, not its dispatch.
  """

  def __init__(self):
    self._start = None
    self._stop = None

  def __enter__(self):
    self._start = time.perf_counter()
    self._stop = None
    return self

  def __exit__(self, *exc_info):
    self._stop = time.perf_counter()

  @property
  def elapsed(self):
    """Seconds between enter and exit (or now, while running); 0 if unused."""
    if self._start is None:
      return 0.0
    end = time.perf_counter() if self._stop is None else self._stop
    return end - self._start

