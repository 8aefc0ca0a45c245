"""Metric writers: the interface a run writes through, and the writers that
combine others (log lines, a background thread, several at once).

The methods are CLU's MetricWriter's (write_scalars, write_texts,
write_hparams, flush, close), kept so that code written against CLU reads
the same; CLU's own package cannot be imported without TensorFlow. The
TensorBoard writer is in `events`, W&B's in `wandb_writer`.
"""

import abc
import concurrent.futures
import threading

from absl import logging
import numpy as np


def _each_then_raise(calls):
  """Calls every callable, then raises the first error any raised."""
  errors = []
  for call in calls:
    try:
      call()
    except Exception as e:  # pylint: disable=broad-exception-caught
      errors.append(e)
  if errors:
    raise errors[0]


class MetricWriter(abc.ABC):
  """Where a run's metrics go."""

  @abc.abstractmethod
  def write_scalars(self, step, scalars):
    """{name: number or 0-d array} at `step`."""

  @abc.abstractmethod
  def write_texts(self, step, texts):
    """{name: Markdown text} at `step`."""

  @abc.abstractmethod
  def write_hparams(self, hparams):
    """{name: bool, int, float or str}: the run's hyper-parameters."""

  def flush(self):
    """Makes everything written so far durable."""

  def close(self):
    """Flushes and releases the writer."""
    self.flush()


class LoggingWriter(MetricWriter):
  """Writes metrics as absl INFO lines (`[step] name=value, ...`)."""

  def write_scalars(self, step, scalars):
    values = ', '.join(f'{k}={float(np.asarray(v)):.6g}'
                       for k, v in sorted(scalars.items()))
    logging.info('[%d] %s', step, values)

  def write_texts(self, step, texts):
    logging.info('[%d] Got texts: %s.', step, texts)

  def write_hparams(self, hparams):
    logging.info('[Hyperparameters] %s', hparams)


class MultiWriter(MetricWriter):
  """Writes to each writer in turn."""

  def __init__(self, writers):
    self._writers = list(writers)

  def write_scalars(self, step, scalars):
    for writer in self._writers:
      writer.write_scalars(step, scalars)

  def write_texts(self, step, texts):
    for writer in self._writers:
      writer.write_texts(step, texts)

  def write_hparams(self, hparams):
    for writer in self._writers:
      writer.write_hparams(hparams)

  def flush(self):
    for writer in self._writers:
      writer.flush()

  def close(self):
    _each_then_raise(writer.close for writer in self._writers)


class AsyncWriter(MetricWriter):
  """Runs another writer's calls on one background thread, in order.

  Values are copied to host NumPy first, so the caller may reuse its
  arrays. An error in the background is raised by the next `flush` or
  `close` (and by the next write after it happened).
  """

  def __init__(self, writer):
    self._writer = writer
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix='metric_writer')
    self._pending = []
    self._lock = threading.Lock()

  def _submit(self, fn, *args):
    self._raise_finished_errors()
    with self._lock:
      self._pending.append(self._pool.submit(fn, *args))

  def _raise_finished_errors(self):
    with self._lock:
      done = [f for f in self._pending if f.done()]
      self._pending = [f for f in self._pending if not f.done()]
    for future in done:
      future.result()

  def write_scalars(self, step, scalars):
    scalars = {k: np.asarray(v) for k, v in scalars.items()}
    self._submit(self._writer.write_scalars, step, scalars)

  def write_texts(self, step, texts):
    self._submit(self._writer.write_texts, step, dict(texts))

  def write_hparams(self, hparams):
    self._submit(self._writer.write_hparams, dict(hparams))

  def _wait(self):
    with self._lock:
      pending, self._pending = self._pending, []
    _each_then_raise(future.result for future in pending)

  def flush(self):
    self._wait()
    self._writer.flush()

  def close(self):
    try:
      self._wait()
    finally:
      self._pool.shutdown(wait=True)
      self._writer.close()
