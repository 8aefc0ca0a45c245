"""How the train loop stops with its last step saved: signals and errors.

Layer: run; may import every layer but the commands, and imports nothing
of agent_tunix (checkpoint.py does the saving).

`PreemptionGuard` turns SIGTERM and Ctrl-C into a flag the loop polls once
a step, on every process (all get the same answer for a step):

  guard = preemption.PreemptionGuard().install()
  for step in ...:
    stop = guard.should_stop(step)
    ckpt.save(step, ..., force=stop)
    if stop:
      break
  guard.uninstall()

`SaveOnError` wraps the loop: when a step raises, the last completed step
is saved before the error goes on, unless the parameters were mid-update.

Design notes: docs/resuming.md, 'Stopping on a signal or an error'.
"""

import os
import signal
import threading

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np


def _any_process(flag):
  """True iff `flag` is True on some process (a no-op on one process)."""
  if jax.process_count() == 1:
    return bool(flag)
  flags = multihost_utils.process_allgather(np.asarray(bool(flag)))
  return bool(np.any(flags))


def install_sigterm_handler(callback):
  """Installs `callback(signum, frame)` for SIGTERM; returns the previous one.

  Must be called from the main thread. Pass the returned handler back to
  restore it.
  """
  return signal.signal(signal.SIGTERM, callback)


def jax_preemption_sync_active():
  """True if JAX's distributed preemption service handles SIGTERM."""
  return bool(
      jax.distributed.is_initialized()
      and jax.config.jax_enable_preemption_service
  )


class PreemptionGuard:
  """Turns SIGTERM and SIGINT (Ctrl-C) into a flag the loop polls per step.

  Use `install()` / `uninstall()` or `with PreemptionGuard() as guard:`. The
  handler only sets a flag; the loop saves and exits at the end of the step.
  A second signal of the same kind goes to the previous handler (by
  default: SIGTERM ends the process at once, SIGINT raises
  KeyboardInterrupt), for when the step or the final save hangs.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self, use_jax_sync=None):
    """Args: use_jax_sync: None = ask JAX's preemption service iff active."""
    self.use_jax_sync = use_jax_sync
    self._event = threading.Event()
    self._previous = {}
    self._installed = False
    self.signal_name = None

  def _own_signals(self):
    # JAX's preemption service owns SIGTERM when active; SIGINT is ours.
    if self.use_jax_sync:
      return (signal.SIGINT,)
    return self.SIGNALS

  def install(self):
    """Starts listening for SIGTERM and SIGINT; returns self."""
    if self._installed:
      return self
    if self.use_jax_sync is None:
      self.use_jax_sync = jax_preemption_sync_active()
    if self.use_jax_sync:
      logging.info('SIGTERM is handled by the JAX preemption service.')
    for signum in self._own_signals():
      self._previous[signum] = signal.signal(signum, self._handle)
    self._installed = True
    return self

  def uninstall(self):
    """Puts back the handlers that were there before `install()`."""
    if self._installed:
      for signum in self._own_signals():
        signal.signal(signum, self._previous_or_default(signum))
    self._installed = False

  def __enter__(self):
    return self.install()

  def __exit__(self, *exc_info):
    self.uninstall()

  def _previous_or_default(self, signum):
    # None: the previous handler was not installed from Python.
    previous = self._previous.get(signum)
    return signal.SIG_DFL if previous is None else previous

  def _handle(self, signum, frame):
    if not self._event.is_set():
      self.signal_name = signal.Signals(signum).name
      self._event.set()
      logging.warning(
          '%s received: finishing this step, then saving and exiting '
          '(send it again to stop at once).', self.signal_name,
      )
      return
    # A second signal: hand it to the previous handler.
    previous = self._previous_or_default(signum)
    self.uninstall()
    if callable(previous):
      previous(signum, frame)
    elif previous == signal.SIG_DFL:
      os.kill(os.getpid(), signum)

  def requested(self):
    """True once this process got SIGTERM or SIGINT (no synchronisation)."""
    return self._event.is_set()

  def should_stop(self, step):
    """True if training should save and stop after `step`.

    Call it once per step on every process: all processes get the same
    answer for the same step.
    """
    stop = _any_process(self.requested())
    if self.use_jax_sync:
      stop = multihost_utils.reached_preemption_sync_point(int(step)) or stop
    if stop:
      logging.warning('Stop requested (%s): stopping after step %s.',
                      self.signal_name or 'preemption', step)
    return stop


class SaveOnError:
  """Saves the last completed step when a step fails (a context manager).

  The loop reports its progress: `begin(step)` before reading the step's
  batch, `updating()` right before the parameters change, `done(step)` once
  they have. If an exception (a reward function raising, KeyboardInterrupt
  from a second Ctrl-C, ...) leaves the block, the last completed step is
  saved with `save(step)` before the exception goes on, with the data
  iterator put back to where that step left it; nothing is saved when the
  parameters were mid-update, when `skip(exception)` gives a reason (a
  string, logged; e.g. a divergence, a full disk), or when nothing completed
  since `start`. `save` must have written the step when it returns (wait
  for an asynchronous save). A failure of that save is logged, never raised
  over the original error.
  """

  def __init__(self, save, data_iter, start, skip=lambda e: None):
    self._save = save
    self._data_iter = data_iter
    self._skip = skip
    self._done = start
    self._start = start
    self._data_state = None
    self._updating = False

  def begin(self, step):
    del step
    self._data_state = (None if self._data_iter is None
                        else self._data_iter.get_state())

  def updating(self):
    self._updating = True

  def done(self, step):
    self._done, self._updating, self._data_state = step, False, None

  def __enter__(self):
    return self

  def __exit__(self, kind, error, traceback):
    if error is None or self._done <= self._start:
      return False
    reason = (f'the state after step {self._done} is not known to be good'
              if self._updating else self._skip(error))
    if reason:
      logging.warning('Not saving after %s: %s.', kind.__name__, reason)
      return False
    try:
      if self._data_state is not None:
        self._data_iter.set_state(self._data_state)
      self._save(self._done)
      logging.warning('Saved step %s before stopping on %s; rerun the same '
                      'command to resume.', self._done, kind.__name__)
    except Exception as e:  # pylint: disable=broad-exception-caught
      logging.error('Could not save step %s after %s: %s', self._done,
                    kind.__name__, e)
    return False
