"""Checkpoint save and restore times of the run's LoRA + optimizer state on
a local folder and on gs:// (the 'storage' section of `agent_tunix.bench`).

A save goes through the trainer's own `checkpoint.Checkpointer` with the
config's checkpoint settings (async by default): `blocking_s` is how long
`save` holds the training loop (the device-to-host copy and the start of
the write), `total_s` until the step is complete on the store (`wait`).
`restore_s` is a fresh read-only Checkpointer restoring the newest step
into the same structure (checksums verified, as a resume does). With
--checkpoint_url unset only the local folder is measured.
"""

import os
import tempfile

import grain
import jax
import numpy as np

from agent_tunix.bench import records
from agent_tunix.run import checkpoint

NAME = 'checkpoint_io'


def _nbytes(tree):
  return int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree)))


def _measure(session, directory):
  config = session.config.checkpoint
  lora = checkpoint.lora_state(session.model)
  opt = checkpoint.optimizer_state(session.optimizer)
  data = iter(grain.MapDataset.range(4).to_iter_dataset())
  ckpt = checkpoint.Checkpointer(directory, config)
  try:
    t0 = records.now()
    ckpt.save(1, lora, opt, data, {}, force=True)
    blocking = records.now() - t0
    ckpt.wait()
    total = records.now() - t0
  finally:
    ckpt.close()
  reader = checkpoint.Checkpointer(directory, config, read_only=True)
  try:
    t0 = records.now()
    restored = reader.restore(lora, opt)
    restore = records.now() - t0
  finally:
    reader.close()
  assert restored is not None and restored.step == 1
  return {'blocking_s': blocking, 'total_s': total, 'restore_s': restore,
          'state_bytes': _nbytes(lora) + _nbytes(opt),
          'async_save': bool(config.async_save)}


def checkpoint_measurement(ctx, url):
  """The measurement record: ours = local, peer = `url` (gs://)."""
  settings = {'url': url or None}
  with tempfile.TemporaryDirectory(prefix='bench_ckpt_') as local:
    ours = {'name': 'local folder',
            **_measure(ctx.session, os.path.join(local, 'run'))}
  ours['median_s'] = ours['total_s']
  peer = None
  if url:
    peer = {'name': url, **_measure(ctx.session, url.rstrip('/') + '/run')}
    peer['median_s'] = peer['total_s']
  return records.measurement(
      NAME, ['storage'], settings, ours, peer,
      reason=None if url else 'storage: no --checkpoint_url (local only)',
      one_sided=not url)
