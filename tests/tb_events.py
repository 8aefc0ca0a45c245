"""Reads TensorBoard event files in tests with TensorBoard's own loader (not
the product's reader), so the writer is checked by an independent reader."""

import collections
import pathlib

from tensorboard.backend.event_processing import event_file_loader
from tensorboard.util import tensor_util


def iterate(path):
  """The Event protos of one local event file."""
  return event_file_loader.EventFileLoader(str(path)).Load()


def make_ndarray(tensor):
  return tensor_util.make_ndarray(tensor)


def read_events(workdir):
  """{tag: {step: (value, plugin name, metadata content)}}, last one wins.

  Event files are read in name order (their names start with the creation
  time), so a step written again by a later run overrides the earlier value.
  """
  found = collections.defaultdict(dict)
  for path in sorted(pathlib.Path(workdir).glob('events.out.tfevents.*')):
    for event in iterate(str(path)):
      for value in event.summary.value:
        plugin = value.metadata.plugin_data
        found[value.tag][event.step] = (
            make_ndarray(value.tensor), plugin.plugin_name, plugin.content)
  return found
