"""Alarms: warnings when a run stops learning, or learns the wrong thing.

Layer: run; may import every layer but the commands, and imports nothing
of agent_tunix.

`Monitor(config)` reads the scalars the train loop already logs:
`update(step, scalars)` returns the windowed `alarm/<name>` scalars
(entropy_collapse, zero_reward_spread, length_limit), `after_eval(step,
scores)` the reward_hacking one; each is 1 while it fires and 0 otherwise,
with a warning (what is wrong, `hint`) when it starts. `fired(step)` and
`message(name)` serve training.stop_on_alarm; `state()` / `load()` carry
the windows through a checkpoint's metadata.

Design notes: docs/alarms_and_wandb.md, 'Alarms'.
"""

import dataclasses
import math

from absl import logging

ENTROPY_COLLAPSE = 'entropy_collapse'
ZERO_REWARD_SPREAD = 'zero_reward_spread'
LENGTH_LIMIT = 'length_limit'
REWARD_HACKING = 'reward_hacking'
# The tag prefix of the alarms' scalars.
PREFIX = 'alarm/'


@dataclasses.dataclass(frozen=True)
class Window:
  """An alarm on one step scalar staying past a threshold for some steps."""

  name: str
  metric: str  # The step scalar watched.
  threshold_field: str  # alarms.<field>: the threshold.
  steps_field: str  # alarms.<field>: the window in steps; 0 = off.
  below: bool  # Fires below the threshold (else at or above it).

  def hit(self, value, threshold):
    return value < threshold if self.below else value >= threshold


WINDOWS = (
    Window(ENTROPY_COLLAPSE, 'entropy', 'entropy_min', 'entropy_steps',
           below=True),
    Window(ZERO_REWARD_SPREAD, 'frac_reward_zero_std', 'zero_std_frac',
           'zero_std_steps', below=False),
    Window(LENGTH_LIMIT, 'completion/clipped_ratio', 'clipped_frac',
           'clipped_steps', below=False),
)
NAMES = tuple(w.name for w in WINDOWS) + (REWARD_HACKING,)
# Running sums of the least-squares fit of reward/mean on the step.
_EMPTY_FIT = {'n': 0, 'first': 0, 'last': 0, 'sx': 0.0, 'sy': 0.0,
              'sxx': 0.0, 'sxy': 0.0}


def hint(name, config):
  """What to try when alarm `name` fires."""
  if name == ENTROPY_COLLAPSE:
    return ('try a lower optimizer.learning_rate (now '
            f'{config.optimizer.learning_rate:g}), a higher '
            'generation.temperature (now '
            f'{config.generation.temperature:g}) or a larger grpo.beta '
            f'(now {config.grpo.beta:g}; it holds the policy near the '
            'reference)')
  if name == ZERO_REWARD_SPREAD:
    return ('the prompts are too hard or too easy for the model, or the '
            'rewards too coarse: change the data (data.source, '
            'data.difficulty), raise grpo.num_generations (now '
            f'{config.grpo.num_generations}) or add graded rewards to '
            'rewards.functions')
  if name == LENGTH_LIMIT:
    return ('raise generation.max_generation_steps (now '
            f'{config.generation.max_generation_steps}), or make long '
            'answers cost something (rewards.length_penalty)')
  return ('the policy may be exploiting the reward functions: read the '
          "samples' texts in TensorBoard, check rewards.functions against "
          'what the evaluation counts as correct, and consider a checkpoint '
          'from before this interval')


class Monitor:
  """Watches a run's scalars (docs/alarms_and_wandb.md).

  In the train loop:

    monitor = alarms.Monitor(config)
    monitor.load(meta.get('alarms'))  # On resume.
    ...
    writer.write_scalars(step, {**scalars, **monitor.update(step, scalars)})
    writer.write_scalars(step, monitor.after_eval(step, scores))  # If eval.
    if config.training.stop_on_alarm and monitor.fired(step): ...
    ckpt.save(..., meta={'alarms': monitor.state()})
  """

  def __init__(self, config):
    self._config = config
    self._alarms = config.alarms
    self._recent = {w.name: [] for w in WINDOWS}
    # reward_hacking: the last evaluation [step, accuracy] and the running
    # sums of the fit of reward/mean on the step since then.
    self._last_eval = None
    self._fit = dict(_EMPTY_FIT)
    # name -> (step, message) of the latest verdict that fired.
    self._fired = {}
    self._firing = set()  # Alarms whose latest verdict was to fire.

  def state(self):
    """A small JSON-serialisable dict that `load` restores."""
    return {
        'recent': {k: list(v) for k, v in self._recent.items()},
        'last_eval': self._last_eval,
        'fit': dict(self._fit),
    }

  def load(self, state):
    """Restores `state()`'s output; None (an older checkpoint) starts afresh.

    Which alarms fired is not state: the windows are judged again at the
    next step and reward_hacking at the next evaluation.
    """
    if state is None:
      logging.info('The checkpoint holds no alarm state; the alarms start '
                   'counting from this step.')
      return
    for name in self._recent:
      self._recent[name] = [float(v) for v in state['recent'].get(name, [])]
    last = state['last_eval']
    self._last_eval = None if last is None else [int(last[0]),
                                                 float(last[1])]
    self._fit = {k: type(v)(state['fit'][k]) for k, v in _EMPTY_FIT.items()}

  def fired(self, step):
    """Names of the alarms whose verdict at `step` was to fire."""
    return [name for name in NAMES
            if name in self._fired and self._fired[name][0] == step]

  def message(self, name):
    """Why alarm `name` last fired and what to try ('' if it never did)."""
    return self._fired[name][1] if name in self._fired else ''

  def _verdict(self, name, step, why):
    """Records alarm `name`'s verdict at `step`; logs when it changes."""
    was = name in self._firing
    if why:
      text = (f'Alarm {name} at step {step}: {why}; '
              f'{hint(name, self._config)}.')
      self._fired[name] = (step, text)
      self._firing.add(name)
      if not was:
        logging.warning('%s', text)
    else:
      self._firing.discard(name)
      if was:
        logging.info('Alarm %s cleared at step %s.', name, step)
    return {PREFIX + name: float(bool(why))}

  def update(self, step, scalars):
    """Takes a training step's scalars; returns the windowed alarm scalars.

    Args:
      step: the training step.
      scalars: {name: float} of the step. A step without a watched scalar
        empties that alarm's window.

    Returns:
      {'alarm/<name>': 0.0 or 1.0} for each windowed alarm.
    """
    out = {}
    for w in WINDOWS:
      window = int(self._alarms[w.steps_field])
      threshold = float(self._alarms[w.threshold_field])
      recent = self._recent[w.name]
      if w.metric in scalars:
        recent.append(float(scalars[w.metric]))
      else:
        recent.clear()
      del recent[:max(len(recent) - max(window, 1), 0)]
      why = ''
      if 0 < window <= len(recent) and all(
          w.hit(v, threshold) for v in recent):
        relation = 'below' if w.below else 'at or above'
        why = (f'{w.metric} was {relation} alarms.{w.threshold_field}='
               f'{threshold:g} at each of the last {window} steps (now '
               f'{recent[-1]:.4g})')
      out.update(self._verdict(w.name, step, why))
    if 'reward/mean' in scalars:
      fit = self._fit
      if fit['n'] == 0:
        fit['first'] = int(step)
      fit['last'] = int(step)
      x = float(step - fit['first'])  # Centred: small sums, exact enough.
      y = float(scalars['reward/mean'])
      fit['n'] += 1
      fit['sx'] += x
      fit['sy'] += y
      fit['sxx'] += x * x
      fit['sxy'] += x * y
    return out

  def reward_rise(self):
    """The training reward's fitted rise since the last evaluation, or None.

    b * (last step - first step), b the least-squares slope of reward/mean
    on the step; None with fewer than two steps.
    """
    fit = self._fit
    n = fit['n']
    spread = n * fit['sxx'] - fit['sx'] ** 2
    if n < 2 or spread <= 0:
      return None
    slope = (n * fit['sxy'] - fit['sx'] * fit['sy']) / spread
    return slope * (fit['last'] - fit['first'])

  def after_eval(self, step, scores):
    """Takes an evaluation's scores; returns {'alarm/reward_hacking': 0/1}.

    Args:
      step: the step the evaluation ran after (0: before training).
      scores: the evaluation's metrics ('rubric_score' is read when
        present, else 'accuracy').
    """
    metric = 'rubric_score' if 'rubric_score' in scores else 'accuracy'
    accuracy = float(scores[metric])
    if not math.isfinite(accuracy):
      accuracy = 0.0 if self._last_eval is None else self._last_eval[1]
    rise = self.reward_rise()
    why = ''
    if (self._alarms.hacking and self._last_eval is not None
        and rise is not None):
      before = self._last_eval[1]
      if (rise >= self._alarms.hacking_reward_rise
          and before - accuracy >= self._alarms.hacking_accuracy_drop):
        why = (f'the training reward rose by {rise:.4g} (fitted) over steps '
               f'{self._fit["first"]}-{self._fit["last"]} while eval '
               f'{metric} fell from {before:.4g} to {accuracy:.4g} '
               '(alarms.hacking_reward_rise='
               f'{self._alarms.hacking_reward_rise:g}, '
               'alarms.hacking_accuracy_drop='
               f'{self._alarms.hacking_accuracy_drop:g})')
    self._last_eval = [int(step), accuracy]
    self._fit = dict(_EMPTY_FIT)
    return self._verdict(REWARD_HACKING, step, why)
