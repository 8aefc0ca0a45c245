"""Reads TensorBoard event files in tests with TensorBoard's own loader (not
the product's reader), so the writer is checked by an independent reader."""

from tensorboard.backend.event_processing import event_file_loader
from tensorboard.util import tensor_util


def iterate(path):
  """The Event protos of one local event file."""
  return event_file_loader.EventFileLoader(str(path)).Load()


def make_ndarray(tensor):
  return tensor_util.make_ndarray(tensor)
