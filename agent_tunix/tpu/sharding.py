"""Device mesh from the config, array placement and multi-host helpers.

Layer: tpu (bottom); may import agent, data, models, rewards, storage and
cli, and imports nothing of agent_tunix.

`make_mesh(config.mesh)` builds the mesh (axes `AXIS_NAMES`: 'data',
'fsdp', 'tp'); `shard_batch` and `batch_sharding` place a batch by rows,
`kv_cache_sharding` the sampler's KV cache, `place_optimizer` the
optimizer state; `fit_spec` leaves an axis unsharded where it does not
divide. Multi-host: `initialize_distributed`, `gather_rows` (a global
batch on every host, in stream order) and `own_rows` (this process's
rows of it).

Design notes: docs/tpu.md, 'Where arrays live on the mesh'.
"""

import math
import time

from absl import logging
from flax import nnx
import jax
# The coordinator's service handle, for shutdown_distributed.
from jax._src import distributed as jax_distributed
from jax.experimental import multihost_utils
import numpy as np

AXIS_NAMES = ('data', 'fsdp', 'tp')
BATCH_AXES = ('data', 'fsdp')
P = jax.sharding.PartitionSpec


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
  """Builds the jax Mesh described by `config.mesh` (Auto axis types).

  On several processes the mesh must span every device (a mesh over some
  processes' devices only would leave the others with nothing to run).
  """
  devices = jax.devices() if devices is None else devices
  shape = resolve_shape(mesh_cfg.shape, len(devices))
  names = tuple(mesh_cfg.axis_names)
  n = math.prod(shape)
  if jax.process_count() > 1 and n != len(devices):
    raise ValueError(
        f'config.mesh.shape={tuple(mesh_cfg.shape)} resolves to {shape}, '
        f'{n} of the {len(devices)} devices of {jax.process_count()} '
        'processes; a multi-host mesh must use all devices (put -1 on one '
        'axis).'
    )
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


def fit_spec(mesh, shape, spec):
  """`spec` without the axes that do not divide their dimension of `shape`.

  An entry may be one axis name or a tuple of names; from a tuple, the
  longest prefix whose size divides the dimension is kept. Names that are
  not axes of the mesh are dropped.
  """
  fitted = []
  for dim, entry in zip(shape, tuple(spec) + (None,) * len(shape)):
    names = (entry,) if isinstance(entry, str) else tuple(entry or ())
    names = [name for name in names if name in mesh.axis_names]
    kept = ()
    for name in names:
      if dim % (math.prod(mesh.shape[a] for a in kept) * mesh.shape[name]):
        break
      kept += (name,)
    fitted.append(kept[0] if len(kept) == 1 else (kept or None))
  return P(*fitted)


def batch_sharding(mesh, ndim=1, rows=None):
  """Rows over the batch axes, other dimensions replicated.

  Args:
    mesh: the device mesh.
    ndim: rank of the arrays.
    rows: the number of rows, when known; rows that the batch axes do not
      divide are placed on fewer axes (or replicated) instead of failing.

  Returns:
    A NamedSharding.
  """
  spec = P(batch_axes(mesh) or None, *(None,) * (ndim - 1))
  if rows is not None:
    spec = fit_spec(mesh, (rows,) + (1,) * (ndim - 1), spec)
  return jax.sharding.NamedSharding(mesh, spec)


def vocab_sharding(mesh, shape):
  """[V, D] split along V over every mesh axis, or None when the mesh is
  one device or the axes do not divide V."""
  if mesh is None or mesh.devices.size == 1 or shape[0] % mesh.devices.size:
    return None
  return jax.sharding.NamedSharding(mesh, P(tuple(mesh.axis_names), None))


def kv_cache_sharding(mesh, shape, heads_spec=('fsdp', None, 'tp', None)):
  """Sharding of a [B, S, K, H] KV cache array.

  Args:
    mesh: the device mesh.
    shape: the cache array's shape.
    heads_spec: the model's activation spec for [B, T, heads, head_dim]
      (tunix Gemma 3: `config.shd_config.act_btnh`); its batch entry is
      replaced by all batch axes of the mesh.

  Returns:
    A NamedSharding (axes that do not divide a dimension dropped).
  """
  spec = (batch_axes(mesh) or None,) + tuple(
      a if a in mesh.axis_names else None for a in heads_spec[1:]
  )
  return jax.sharding.NamedSharding(mesh, fit_spec(mesh, shape, spec))


def replicated(mesh):
  return jax.sharding.NamedSharding(mesh, P())


def shard_batch(batch, mesh):
  """Global arrays from this process's rows of a batch (leading axis).

  Every process passes its own rows; the global array holds process 0's
  rows first, then process 1's, and so on. On one process this is a sharded
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


def put_global(x, sharding):
  """A global array from a host array that every process holds in full."""
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def to_host(x):
  """The full value of a (possibly multi-process) array, on every process."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def gather_rows(local):
  """Every process's rows of a batch, on every process, in stream order.

  The pipeline gives process p the positions p, p + P, p + 2P, ... of a
  global batch, so this process's row j is global row j * P + p. The result
  is the batch a single process would have read, whatever the process count.

  Args:
    local: numeric array [b, ...], this process's rows (same shape on every
      process).

  Returns:
    numpy array [P * b, ...].
  """
  local = np.asarray(local)
  count = jax.process_count()
  if count == 1:
    return local
  stacked = np.asarray(multihost_utils.process_allgather(local))
  return stacked.swapaxes(0, 1).reshape(count * local.shape[0],
                                        *local.shape[1:])


def gather_texts(local):
  """`gather_rows` for a list of strings (this process's rows)."""
  if jax.process_count() == 1:
    return list(local)
  encoded = [text.encode('utf-8') for text in local]
  lengths = np.array([len(b) for b in encoded], np.int64)
  width = int(allgather_concat(np.array([lengths.max(initial=0)])).max())
  data = np.zeros((len(encoded), max(width, 1)), np.uint8)
  for i, b in enumerate(encoded):
    data[i, :len(b)] = np.frombuffer(b, np.uint8)
  data, lengths = gather_rows(data), gather_rows(lengths)
  return [bytes(row[:n]).decode('utf-8') for row, n in zip(data, lengths)]


def gather_uneven_texts(local):
  """Every process's list of strings, whatever their lengths, in process order.

  Returns:
    (texts, own): the lists of processes 0, 1, ... concatenated (the same on
    every process) and the slice of it that is this process's `local`.
  """
  if jax.process_count() == 1:
    return list(local), slice(0, len(local))
  count = jax.process_count()
  counts = allgather_concat(np.array([len(local)], np.int64))
  most = int(counts.max())
  start = int(counts[:jax.process_index()].sum())
  if most == 0:
    return [], slice(0, 0)
  every = gather_texts(list(local) + [''] * (most - len(local)))
  # gather_texts interleaves: process p's row j is row j * count + p.
  texts = [every[j * count + p]
           for p in range(count) for j in range(int(counts[p]))]
  return texts, slice(start, start + len(local))


def own_rows(num_rows, group=1):
  """Indices of this process's rows in a `gather_rows` batch.

  Args:
    num_rows: rows of the gathered batch of prompts.
    group: rows per prompt after repeating every prompt `group` times (the
      repeats of a prompt are contiguous).

  Returns:
    int array of this process's row indices (whole groups), ascending.
  """
  prompts = np.arange(jax.process_index(), num_rows, jax.process_count())
  return (prompts[:, None] * group + np.arange(group)[None, :]).reshape(-1)


def sum_over_processes(values):
  """[n] numbers summed elementwise over every process (a collective)."""
  values = np.asarray(values, np.float64)
  if jax.process_count() == 1:
    return values
  return allgather_concat(values[None]).sum(axis=0)


def allgather_concat(tree):
  """Concatenates every process's [n, ...] numpy leaves (process order)."""
  if jax.process_count() == 1:
    return jax.tree.map(np.asarray, tree)
  return jax.tree.map(
      lambda x: np.asarray(multihost_utils.process_allgather(
          np.asarray(x), tiled=True)),
      tree,
  )


def model_mesh(model):
  """The mesh the model's parameters live on, or None if not on a mesh."""
  return mesh_of(nnx.state(model))


def mesh_of(tree):
  """The mesh of the first array (or ShapeDtypeStruct) of `tree` placed
  with a NamedSharding, or None."""
  for leaf in jax.tree.leaves(tree):
    sharding = getattr(leaf, 'sharding', None)
    if isinstance(sharding, jax.sharding.NamedSharding):
      return sharding.mesh
  return None


def replicate_unplaced(tree, mesh):
  """Puts leaves that are not global arrays on `mesh` yet, replicated.

  nnx.Optimizer creates its step counter as a plain single-device array;
  this makes it a global array like the rest of the state, so that jit sees
  the same shardings at every step (one compile) and Orbax saves and
  restores it collectively on every process.
  """
  def place(x):
    if not isinstance(x, jax.Array):
      return x
    sharding = x.sharding
    if isinstance(sharding, jax.sharding.NamedSharding) and (
        sharding.mesh == mesh):
      return x
    return jax.device_put(x, replicated(mesh))
  return jax.tree.map(place, tree)


def place_optimizer(optimizer, mesh):
  """Replicates on `mesh` the optimizer state leaves not placed there yet."""
  state = nnx.state(optimizer, nnx.OptState)
  nnx.update(optimizer, replicate_unplaced(state, mesh))


def initialize_distributed(coordinator_address=None, num_processes=None,
                           process_id=None):
  """jax.distributed.initialize() for multi-host runs; fails loudly.

  With no arguments the cluster is detected (TPU pods, Slurm, Open MPI;
  JAX_COORDINATOR_ADDRESS is read when set). Elsewhere, e.g. several
  processes on CPU or GPU machines, pass all three.

  Args:
    coordinator_address: 'host:port' of process 0's coordinator service.
    num_processes: the number of processes.
    process_id: this process's index in [0, num_processes).

  Raises:
    RuntimeError: when initialisation fails, with the arguments used.
  """
  kwargs = {
      'coordinator_address': coordinator_address or None,
      'num_processes': num_processes,
      'process_id': process_id,
  }
  kwargs = {k: v for k, v in kwargs.items() if v is not None}
  try:
    jax.distributed.initialize(**kwargs)
  except Exception as e:
    raise RuntimeError(
        f'jax.distributed.initialize({kwargs or ""}) failed: '
        f'{str(e).rstrip(".")}. Multi-host '
        'runs need a TPU pod (or another cluster JAX detects: Slurm, Open '
        'MPI), or explicit --coordinator_address=HOST:PORT, '
        '--num_processes=N and --process_id=I on every process; drop '
        '--multihost for a single host.'
    ) from e
  logging.info('Process %d of %d, %d local / %d global devices',
               jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


# How long the coordinator waits between the shutdown barrier and stopping
# its service (`shutdown_distributed`).
_SERVICE_GRACE_S = 1.0


def shutdown_distributed():
  """Ends jax.distributed at the end of a multi-host run, service last.

  jax.distributed.shutdown() (also run at exit) stops process 0's
  coordination service as soon as every process has passed the shutdown
  barrier, while the others are still cancelling their last calls to it.
  That race once aborted process 0 of a finished 2-process run at exit
  (grpc: `Check failed: queue.Pop() == nullptr`, exit status -6). Here
  process 0 passes the barrier, gives those calls a moment, then stops the
  service. Does nothing when jax.distributed was not initialized.
  """
  state = jax_distributed.global_state
  service, state.service = state.service, None
  jax.distributed.shutdown()  # The other processes and this one's client.
  if service is not None:
    time.sleep(_SERVICE_GRACE_S)
    service.shutdown()


def canonical_sharding(s):
  """The NamedSharding XLA reports for `s`'s layout on its mesh.

  XLA writes output shardings without mesh axes of size 1 and without
  trailing Nones. jit caches compiled code by input sharding, so a parameter
  placed as P(None, 'tp', None) on a 1x1 mesh and returned by the first
  update as P() would compile every jitted function a second time. Placing
  state in this canonical form up front avoids that.
  """
  if not isinstance(s, jax.sharding.NamedSharding):
    return s
  def keep(entry):
    names = entry if isinstance(entry, tuple) else (entry,)
    names = tuple(n for n in names if n is not None and s.mesh.shape[n] > 1)
    if not names:
      return None
    return names if len(names) > 1 else names[0]
  spec = [keep(e) for e in s.spec]
  while spec and spec[-1] is None:
    spec.pop()
  return s.update(spec=jax.sharding.PartitionSpec(*spec))


def canonicalize(tree):
  """Re-places every array of `tree` with `canonical_sharding`."""
  def put(x):
    if not isinstance(x, jax.Array):
      return x
    target = canonical_sharding(x.sharding)
    return x if target == x.sharding else jax.device_put(x, target)
  return jax.tree.map(put, tree)
