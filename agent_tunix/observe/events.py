"""TensorBoard event files, written and read without TensorFlow.

`TensorBoardWriter` is a MetricWriter that writes what TensorFlow's summary
ops write for our metrics, so TensorBoard shows them the same: scalars
(plugin 'scalars'), Markdown texts (plugin 'text') and hyper-parameters
(plugin 'hparams', a session-start record), as framed Event records
(`tensorboard`'s own protos and record framing). Files go through the
storage layer: locally each flush appends; on gs:// (whose objects cannot
be appended to) the file is uploaded whole, at most every `UPLOAD_EVERY_S`
seconds and at each flush, and a new file is started past `ROLL_BYTES`.
`tensorboard --logdir=gs://...` reads them (through gcsfs).

`read_scalars` reads event files back (plot, tests).
"""

import itertools
import os
import socket
import struct
import time

import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.plugins.scalar import summary_v2 as scalar_summary
from tensorboard.plugins.text import summary_v2 as text_summary
from tensorboard.summary.writer import record_writer
from tensorboard.util import tensor_util

from agent_tunix import storage
from agent_tunix.observe import writers

EVENT_GLOB = 'events.out.tfevents.*'
UPLOAD_EVERY_S = 10.0
ROLL_BYTES = 8 << 20
_counter = itertools.count()


class _Buffer:
  """A file-like sink for RecordWriter: keeps the bytes written."""

  def __init__(self):
    self.data = bytearray()
    self.closed = False

  def write(self, data):
    self.data += data

  def flush(self):
    pass

  def close(self):
    self.closed = True


class EventFile:
  """One event file being written (see the module docstring)."""

  def __init__(self, logdir):
    self._logdir = str(logdir).rstrip('/')
    self._remote = storage.is_remote(self._logdir)
    self._start_file()

  def _start_file(self):
    now = time.time()
    name = (f'events.out.tfevents.{int(now):010d}.{socket.gethostname()}.'
            f'{os.getpid()}.{next(_counter)}.v2')
    self.path = f'{self._logdir}/{name}'
    self._buffer = _Buffer()
    self._records = record_writer.RecordWriter(self._buffer)
    self._uploaded_at = 0.0
    self._dirty = False
    if not self._remote:
      os.makedirs(self._logdir, exist_ok=True)
    self.write(event_pb2.Event(wall_time=now, file_version='brain.Event:2'))

  def write(self, event):
    self._records.write(event.SerializeToString())
    self._dirty = True

  def flush(self, force=True):
    if not self._dirty:
      return
    if not self._remote:
      with open(self.path, 'ab') as f:
        f.write(self._buffer.data)
      del self._buffer.data[:]
      self._dirty = False
      return
    now = time.monotonic()
    if not force and now - self._uploaded_at < UPLOAD_EVERY_S:
      return
    storage.write_bytes(self.path, bytes(self._buffer.data))
    self._uploaded_at = now
    self._dirty = False
    if len(self._buffer.data) > ROLL_BYTES:
      self._start_file()


class TensorBoardWriter(writers.MetricWriter):
  """Writes scalars, texts and hparams to an event file in `logdir`."""

  def __init__(self, logdir):
    self._file = EventFile(logdir)

  @property
  def path(self):
    return self._file.path

  def _write(self, step, summary):
    self._file.write(event_pb2.Event(wall_time=time.time(), step=int(step),
                                     summary=summary))
    self._file.flush(force=False)

  def write_scalars(self, step, scalars):
    summary = summary_pb2.Summary()
    for tag, value in scalars.items():
      summary.value.extend(scalar_summary.scalar_pb(
          tag, float(np.asarray(value))).value)
    self._write(step, summary)

  def write_texts(self, step, texts):
    summary = summary_pb2.Summary()
    for tag, text in texts.items():
      summary.value.extend(text_summary.text_pb(tag, str(text)).value)
    self._write(step, summary)

  def write_hparams(self, hparams):
    self._write(0, hparams_summary.hparams_pb(dict(hparams)))

  def flush(self):
    self._file.flush(force=True)


def _records(data):
  """The payloads of the framed records in `data` (a torn last one, from a
  file being written, is left out)."""
  offset = 0
  while offset + 12 <= len(data):
    (length,) = struct.unpack_from('<Q', data, offset)
    end = offset + 12 + length + 4
    if end > len(data):
      return
    yield bytes(data[offset + 12:offset + 12 + length])
    offset = end


def read_events(path):
  """The Event protos of one event file (local or gs://)."""
  for payload in _records(storage.read_bytes(path)):
    yield event_pb2.Event.FromString(payload)


def value_of(value):
  """A Summary.Value's number or text (simple_value or its tensor)."""
  if value.HasField('simple_value'):
    return float(value.simple_value)
  array = tensor_util.make_ndarray(value.tensor)
  if array.dtype == object:
    item = array.reshape(-1)[0] if array.size else b''
    return item.decode('utf-8') if isinstance(item, bytes) else item
  return float(array) if array.ndim == 0 else array


def event_files(workdir):
  """Event files directly in `workdir`, in the order they were created."""
  return sorted(storage.glob(workdir, EVENT_GLOB), key=_creation_order)


def _creation_order(path):
  """Sort key: the creation second in the name, then the writer's number
  (events.out.tfevents.<s>.<host>.<pid>.<n>.v2; as text, n=10 sorts
  before n=9)."""
  parts = path.rsplit('/', 1)[-1].split('.')
  second = int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else 0
  number = int(parts[-2]) if len(parts) > 2 and parts[-2].isdigit() else 0
  return (second, number, path)


def read_scalars(workdir):
  """{tag: {step: value}} of every scalar in workdir's event files; a step
  written again by a later file (a resumed run) takes the later value."""
  scalars = {}
  for path in event_files(workdir):
    for event in read_events(path):
      for value in event.summary.value:
        plugin = value.metadata.plugin_data.plugin_name
        if value.HasField('simple_value') or plugin == 'scalars':
          scalars.setdefault(value.tag, {})[event.step] = value_of(value)
  return scalars
