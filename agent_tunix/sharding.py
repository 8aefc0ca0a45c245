"""Device mesh from the config, batch sharding and multi-host helpers.

The mesh axes are named after tunix's Gemma 3 ShardingConfig: 'fsdp' shards
weights and the batch, 'tp' shards heads and hidden features; an optional
'data' axis shards only the batch. Axis types are Auto: tunix's embedder
gather fails under explicit sharding.
"""

import math

from absl import logging
import jax
import numpy as np

AXIS_NAMES = ('data', 'fsdp', 'tp')
BATCH_AXES = ('data', 'fsdp')


def resolve_shape(shape, num_devices):
  """Replaces a -1 in `shape` by the devices left over; validates the rest."""
  shape = tuple(int(s) for s in shape)
  if shape.count(-1) > 1:
    raise ValueError(
        f'config.mesh.shape={shape} has more than one -1; at most one axis '
        'can take "the rest of the devices".'
    )
  if any(s == 0 or s < -1 for s in shape):
    raise ValueError(
        f'config.mesh.shape={shape} has a size that is not positive; use '
        'positive sizes and at most one -1.'
    )
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if num_devices % known:
      raise ValueError(
          f'config.mesh.shape={shape}: {num_devices} devices do not divide '
          f'into axes of fixed size {known}. Choose sizes whose product '
          f'divides {num_devices}.'
      )
    shape = tuple(num_devices // known if s == -1 else s for s in shape)
  if math.prod(shape) > num_devices:
    raise ValueError(
        f'config.mesh.shape={shape} needs {math.prod(shape)} devices, but '
        f'only {num_devices} are available. Use -1 for one axis or a smaller '
        'shape.'
    )
  return shape


def make_mesh(mesh_cfg, devices=None):
  """Builds the jax Mesh described by `config.mesh` (Auto axis types)."""
  devices = jax.devices() if devices is None else devices
  shape = resolve_shape(mesh_cfg.shape, len(devices))
  names = tuple(mesh_cfg.axis_names)
  n = math.prod(shape)
  mesh = jax.make_mesh(
      shape,
      names,
      axis_types=(jax.sharding.AxisType.Auto,) * len(names),
      devices=devices[:n],
  )
  logging.info('Mesh %s over %d of %d devices', dict(mesh.shape), n,
               len(devices))
  return mesh


def batch_axes(mesh):
  """Mesh axes the batch dimension is split over."""
  return tuple(a for a in BATCH_AXES if a in mesh.axis_names)


def batch_parallelism(mesh):
  return math.prod(mesh.shape[a] for a in batch_axes(mesh))


def batch_sharding(mesh, ndim=1):
  spec = (batch_axes(mesh) or None,) + (None,) * (ndim - 1)
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))


def shard_batch(batch, mesh):
  """Global arrays from this process's rows of a batch (leading axis).

  Every process passes its own local rows; on one process this is a sharded
  device_put. Non-numeric leaves (strings) are returned unchanged.
  """
  def put(x):
    x = np.asarray(x)
    if x.dtype == object:
      return x
    return jax.make_array_from_process_local_data(
        batch_sharding(mesh, x.ndim), x
    )
  return jax.tree.map(put, batch)


def replicated(mesh):
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def initialize_distributed():
  """jax.distributed.initialize() for multi-host pods; fails loudly."""
  try:
    jax.distributed.initialize()
  except Exception as e:
    raise RuntimeError(
        'jax.distributed.initialize() failed: ' + str(e) + '. --multihost '
        'needs a TPU pod (or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and '
        'JAX_PROCESS_ID set); drop --multihost for a single host.'
    ) from e
  logging.info('Process %d of %d, %d local / %d global devices',
               jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())
