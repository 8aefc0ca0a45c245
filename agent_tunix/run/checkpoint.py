"""Checkpoints for resumable GRPO training.

Layer: run; may import every layer but the commands, and imports only
storage.

`Checkpointer(workdir, config.checkpoint)` wraps an Orbax
`CheckpointManager` at `<workdir>/checkpoints` (local or gs://). A step
holds 'lora' and 'opt' (pure dicts of the LoRA parameters and the
optimizer state), 'data' (each process's Grain iterator position) and
'meta' (the step, what the trainer passes, a checksum of the arrays).
`save` never overwrites a step; `restore` falls back from a damaged step
to older ones (`RestoreError` when none restores), and the trainer then
calls `set_aside_damaged()`. Signals and errors: preemption.py.

Design notes: docs/resuming.md, 'How checkpoints are saved and restored'.
"""

import logging as logging_lib
import sys
import time
from typing import Any, NamedTuple

from absl import logging
from flax import nnx
import grain
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

from agent_tunix import storage

CHECKPOINT_SUBDIR = 'checkpoints'
# What Orbax writes last into a step saved on an object store.
_COMMIT_FILE = 'commit_success.txt'
# Meta key holding the checksums of the 'lora' and 'opt' arrays.
CHECKSUMS_KEY = 'checksums'
# Name of a damaged step's directory once set aside (in the checkpoint dir).
DAMAGED_PREFIX = 'damaged-step-'


class RestoreError(RuntimeError):
  """No checkpoint step could be restored."""


def _is_abandoned_read(unraisable):
  """Whether an unraisable error is the aftermath of a failed Orbax read.

  Two kinds (docs/resuming.md): a TensorStore read finishing after
  Orbax closed its event loop (RuntimeError raised by the loop's
  call_soon_threadsafe, called from C: no Python frame above it), and an
  Orbax read coroutine that raised as it was thrown away unfinished.

  Args:
    unraisable: The sys.UnraisableHookArgs.
  """
  error = unraisable.exc_value
  if (isinstance(error, RuntimeError)
      and str(error) == 'Event loop is closed'
      and unraisable.exc_traceback is not None
      and unraisable.exc_traceback.tb_frame.f_code.co_name
      == 'call_soon_threadsafe'):
    return True
  code = getattr(unraisable.object, 'cr_code', None)
  return _is_orbax_file(getattr(code, 'co_filename', ''))


def _is_orbax_file(filename):
  """Whether a code object's file is Orbax's checkpoint code."""
  return '/orbax/checkpoint/' in filename.replace('\\', '/')


def _drop_abandoned_reads(previous):
  """A sys.unraisablehook: drops `_is_abandoned_read` errors, else previous."""

  def hook(unraisable):
    if _is_abandoned_read(unraisable):
      logging.debug('Late error of an abandoned checkpoint read (its '
                    'restore already failed): %s: %s',
                    type(unraisable.exc_value).__name__,
                    _shorten(str(unraisable.exc_value)))
      return
    previous(unraisable)

  hook.drops_abandoned_reads = True
  return hook


# How asyncio's default exception handler ends the first line of the message
# it logs for a finished task or future whose exception no one read; the
# line opens with the class name: 'Task', 'Future', '_GatheringFuture' (the
# future of an asyncio.gather whose reads failed).
_UNREAD_EXCEPTION_MESSAGE = ' exception was never retrieved'


def _raised_in_orbax(traceback):
  """Whether a traceback passes through an Orbax checkpoint frame."""
  while traceback is not None:
    if _is_orbax_file(traceback.tb_frame.f_code.co_filename):
      return True
    traceback = traceback.tb_next
  return False


class _UnreadAbandonedReads(logging_lib.Filter):
  """Drops asyncio's 'exception was never retrieved' for Orbax's reads.

  The third kind (docs/resuming.md): a read that failed in the same loop
  iteration as the one that ended the restore; the exception of its task,
  or of the asyncio.gather future over its reads, is never read, and
  asyncio logs its traceback when that object is collected.
  """

  drops_abandoned_reads = True

  def filter(self, record):
    exc_info = record.exc_info
    if (isinstance(record.msg, str)
        and record.msg.split('\n', 1)[0].endswith(_UNREAD_EXCEPTION_MESSAGE)
        and exc_info and exc_info[2] is not None
        and _raised_in_orbax(exc_info[2])):
      logging.debug('Late error of an abandoned checkpoint read (its '
                    'restore already failed): %s: %s',
                    exc_info[0].__name__, _shorten(str(exc_info[1])))
      return False
    return True


def quiet_abandoned_reads():
  """Installs the abandoned-read filters (once each).

  `_drop_abandoned_reads` as sys.unraisablehook, and `_UnreadAbandonedReads`
  on the 'asyncio' logger.
  """
  if not getattr(sys.unraisablehook, 'drops_abandoned_reads', False):
    sys.unraisablehook = _drop_abandoned_reads(sys.unraisablehook)
  asyncio_logger = logging_lib.getLogger('asyncio')
  if not any(getattr(f, 'drops_abandoned_reads', False)
             for f in asyncio_logger.filters):
    asyncio_logger.addFilter(_UnreadAbandonedReads())


class Restored(NamedTuple):
  """What `Checkpointer.restore` returns."""

  lora_state: Any
  opt_state: Any
  meta: dict[str, Any]
  step: int


def lora_state(model):
  """Returns the model's trainable LoRA parameters as an nnx.State."""
  return nnx.state(model, nnx.LoRAParam)


def optimizer_state(optimizer):
  """Returns an nnx.Optimizer's state (step counter + optax state)."""
  return nnx.state(optimizer, nnx.optimizer.OptState)


def _to_pure(tree):
  """nnx.State -> nested dict of arrays; other pytrees are returned as is."""
  if isinstance(tree, nnx.State):
    return nnx.to_pure_dict(tree)
  return tree


def _abstract(tree):
  """Restore target for a pytree: arrays keep their shape, dtype, sharding."""

  def leaf(x):
    if isinstance(x, jax.Array):
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return x

  return jax.tree.map(leaf, tree)


def _like_target(target, restored):
  """Puts restored arrays into the target's container type."""
  if isinstance(target, nnx.State):
    out = jax.tree.map(lambda x: x, target)  # New State, same Variables types.
    nnx.replace_by_pure_dict(out, restored)
    return out
  return restored


_MISMATCH = 'in the checkpoint but'
# How our and Orbax's errors say that a checkpoint holds other shapes or
# another tree than the target (a good checkpoint of another config).
_MISMATCH_MARKERS = (_MISMATCH, 'not compatible with the stored shape',
                     'tree structures do not match')
# Failure texts in RestoreError are cut to this many characters (Orbax can
# print whole parameter trees).
_FAILURE_WIDTH = 400


def _is_mismatch(error):
  return any(marker in error for marker in _MISMATCH_MARKERS)


def _shorten(text):
  text = ' '.join(str(text).split())
  if len(text) <= _FAILURE_WIDTH:
    return text
  return text[:_FAILURE_WIDTH - 5] + ' ...'


def _check_shapes(name, abstract, restored):
  """Raises ValueError if restored leaves differ from the target's shapes."""
  expected = jax.tree_util.tree_flatten_with_path(abstract)[0]
  got = jax.tree.leaves(restored)
  if len(expected) != len(got):
    raise ValueError(
        f'{name!r} has {len(got)} arrays {_MISMATCH} {len(expected)} in the '
        'model; was it saved with a different model or LoRA config?'
    )
  for (path, want), have in zip(expected, got):
    want_shape = tuple(np.shape(want))
    if tuple(np.shape(have)) != want_shape:
      raise ValueError(
          f'{name!r} {jax.tree_util.keystr(path)} has shape '
          f'{tuple(np.shape(have))} {_MISMATCH} {want_shape} in '
          'the model; was it saved with a different model or LoRA config?'
      )


def _words(x):
  """An array's bits as uint32 words (8/16-bit values are widened)."""
  x = jnp.asarray(x)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  bits = x.dtype.itemsize * 8
  if bits == 32 or bits == 64:  # 64-bit values give two words each.
    return jax.lax.bitcast_convert_type(x, jnp.uint32)
  unsigned = {8: jnp.uint8, 16: jnp.uint16}[bits]
  return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _linear_index(shape):
  """uint32 array of each element's row-major position."""
  index = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(len(shape))):
    index += jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * stride
    stride *= shape[axis]
  return index


@jax.jit
def _leaf_checksums(leaves):
  """Per leaf: (sum of words, sum of words * odd position weights) mod 2**32.

  The weighted sum makes moved or swapped elements count, not only changed
  ones; odd weights keep any single changed word visible.
  """
  sums = []
  for leaf in leaves:
    w = _words(leaf)
    weights = 2 * _linear_index(w.shape) + 1
    sums.append(jnp.stack([jnp.sum(w, dtype=jnp.uint32),
                           jnp.sum(w * weights, dtype=jnp.uint32)]))
  return jnp.stack(sums) if sums else jnp.zeros((0, 2), jnp.uint32)


def checksum(tree):
  """A 32-bit checksum of every array in a pytree (order-sensitive).

  Computed on device (works for arrays sharded over several processes), so
  it costs one small reduction, not a copy to the host. It detects flipped or
  zeroed bytes in checkpoint data, which Orbax itself may read back silently.
  """
  leaves = jax.tree.leaves(_to_pure(tree))
  per_leaf = np.asarray(jax.device_get(_leaf_checksums(leaves)), np.uint64)
  total = 0
  for i, (s, q) in enumerate(per_leaf.tolist()):
    total = (total * 1000003 + (2 * i + 1) * s + q) % 2**32
  return int(total)


def _to_json(meta):
  """Converts NumPy / JAX values in a meta dict to Python numbers and lists."""

  def convert(x):
    if isinstance(x, (np.generic, np.ndarray, jax.Array)):
      return np.asarray(x).tolist()
    return x

  return jax.tree.map(convert, dict(meta))


def _all_processes(flag):
  """True iff `flag` is True on every process (a no-op on one process)."""
  if jax.process_count() == 1:
    return bool(flag)
  flags = multihost_utils.process_allgather(np.asarray(bool(flag)))
  return bool(np.all(flags))


def _save_policy(interval):
  policies = [ocp.checkpoint_managers.PreemptionCheckpointingPolicy()]
  if interval > 0:
    policies.append(ocp.checkpoint_managers.FixedIntervalPolicy(interval))
  return ocp.checkpoint_managers.AnySavePolicy(policies)


class Checkpointer:
  """Saves and restores LoRA params, optimizer, data position and metadata.

  Every process must call every method (Orbax synchronises them); only the
  primary process writes shared files.
  """

  def __init__(self, workdir, config, read_only=False):
    """Opens (creating if needed, unless read_only) `<workdir>/checkpoints`.

    Args:
      workdir: The run directory, local or gs://.
      config: The `checkpoint` section of the config (save_interval_steps,
        max_to_keep, async_save).
      read_only: Create nothing (for readers: evaluate, export, generate).

    Raises:
      ValueError: on a negative save interval or max_to_keep < 1.
    """
    if config.save_interval_steps < 0:
      raise ValueError(
          'checkpoint.save_interval_steps must be >= 0 (0 = save only at the '
          f'end and on SIGTERM), got {config.save_interval_steps}.'
      )
    if config.max_to_keep < 1:
      raise ValueError(
          f'checkpoint.max_to_keep must be >= 1, got {config.max_to_keep}.'
      )
    self.directory = storage.path(workdir) / CHECKPOINT_SUBDIR
    # A reader saves and deletes nothing: saying so up front spares two
    # Orbax warnings ('read_only=True, setting ...') on every evaluate.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None if read_only else config.max_to_keep,
        save_interval_steps=0 if read_only else 1,
        save_decision_policy=(None if read_only
                              else _save_policy(config.save_interval_steps)),
        enable_async_checkpointing=config.async_save,
        create=not read_only,
        read_only=read_only,
    )
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=options,
        item_handlers={
            'lora': ocp.StandardCheckpointHandler(),
            'opt': ocp.StandardCheckpointHandler(),
            'data': grain.checkpoint.CheckpointHandler(),
            'meta': ocp.JsonCheckpointHandler(),
        },
    )
    # Steps that failed in the last `restore`, as {step: error message}.
    self.failed_steps = {}
    self._saved_steps = set()
    self._closed = False

  def all_steps(self):
    """Returns the steps on disk, ascending (damaged ones included)."""
    return sorted(self._manager.all_steps())

  def latest_step(self):
    """Returns the newest step on disk, or None (it may be damaged)."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def should_save(self, step):
    """True if a non-forced `save(step, ...)` would write a checkpoint."""
    step = int(step)
    return (step not in self._manager.all_steps()
            and self._manager.should_save(step))

  def will_save(self, step, force=False):
    """True if `save(step, ..., force=force)` would do more than return.

    That is: write the step, or warn that it exists on disk already.
    """
    step = int(step)
    if step in self._saved_steps:
      return False
    if step in self._manager.all_steps():
      return True
    return force or self._manager.should_save(step)

  def save(self, step, lora_state, opt_state, data_iter, meta, force=False):  # pylint: disable=redefined-outer-name
    """Saves one step if the save policy (or `force`) says so.

    Args:
      step: The training step (the number of completed updates).
      lora_state: nnx.State of the LoRA params (see `lora_state()`) or its
        pure dict.
      opt_state: nnx.State of the optimizer (see `optimizer_state()`) or its
        pure dict.
      data_iter: The Grain DatasetIterator, positioned after this step's batch.
      meta: JSON-serialisable dict of small values (NumPy/JAX scalars and
        arrays become numbers and lists); 'step' is added, 'checksums' is
        reserved.
      force: Save even when the step is not on the save interval.

    Returns:
      True if a save was started; False if skipped (not due, or the step
      already exists on disk).

    Raises:
      ValueError: if meta uses the reserved key 'checksums'.
    """
    step = int(step)
    if CHECKSUMS_KEY in meta:
      raise ValueError(
          f'meta key {CHECKSUMS_KEY!r} is reserved for the checkpointer.'
      )
    if step in self._saved_steps:
      return False  # Saved by this Checkpointer already (e.g. then forced).
    if step in self._manager.all_steps():
      logging.warning(
          'Not saving step %s: a checkpoint for it already exists in %s '
          '(existing checkpoints are never overwritten).', step,
          self.directory,
      )
      return False
    if not force and not self._manager.should_save(step):
      return False
    lora_tree, opt_tree = _to_pure(lora_state), _to_pure(opt_state)
    meta = _to_json({
        **meta,
        'step': step,
        CHECKSUMS_KEY: {'lora': checksum(lora_tree), 'opt': checksum(opt_tree)},
    })
    args = ocp.args.Composite(
        lora=ocp.args.StandardSave(lora_tree),
        opt=ocp.args.StandardSave(opt_tree),
        data=grain.checkpoint.CheckpointSave(data_iter),
        meta=ocp.args.JsonSave(meta),
    )
    saved = self._manager.save(step, args=args, force=force)
    if saved:
      self._saved_steps.add(step)
      logging.info('Saving checkpoint for step %s in %s.', step,
                   self.directory)
    return saved

  def _restore_step(self, step, lora_target, opt_target, data_iter):
    """Restores one step; raises on any failure."""
    items = {'meta': ocp.args.JsonRestore()}
    abstract = {}
    for name, target in (('lora', lora_target), ('opt', opt_target)):
      if target is not None:
        abstract[name] = _abstract(_to_pure(target))
        items[name] = ocp.args.StandardRestore(abstract[name])
    if data_iter is not None:
      items['data'] = grain.checkpoint.CheckpointRestore(data_iter)
    restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    meta = restored['meta']
    if not isinstance(meta, dict) or meta.get('step') != step:
      raise ValueError(
          f"'meta' of step {step} is {meta!r}; expected a dict with "
          f"'step': {step}."
      )
    states = {}
    for name, target in (('lora', lora_target), ('opt', opt_target)):
      if target is None:
        states[name] = None
        continue
      _check_shapes(name, abstract[name], restored[name])
      expected = meta.get(CHECKSUMS_KEY, {}).get(name)
      if expected is not None and checksum(restored[name]) != expected:
        raise ValueError(
            f'{name!r} of step {step} does not match the checksum written '
            'with it: its files are corrupted.'
        )
      states[name] = _like_target(target, restored[name])
    meta = {k: v for k, v in meta.items() if k != CHECKSUMS_KEY}
    return Restored(states['lora'], states['opt'], meta, step)

  def restore(self, lora_target, opt_target=None, data_iter=None, step=None):
    """Restores the newest good checkpoint (or `step`), falling back if bad.

    Args:
      lora_target: The current LoRA state (nnx.State or pure dict); gives the
        structure, dtypes and shardings to restore into. Not modified.
      opt_target: The current optimizer state, likewise; None skips it.
      data_iter: A Grain DatasetIterator to reposition in place; None skips
        it.
      step: Restore exactly this step (no fallback); None = newest good one.

    Returns:
      None if there is no checkpoint at all; otherwise Restored(lora_state,
      opt_state, meta, step), states in the targets' types (None where the
      target was None).

    Raises:
      RestoreError: if no step (or the requested `step`) can be restored.
    """
    self.failed_steps = {}
    quiet_abandoned_reads()
    self._manager.reload()
    steps = self.all_steps()
    if not steps:
      logging.info('No checkpoint in %s.', self.directory)
      return None
    if step is not None:
      if step not in steps:
        raise RestoreError(
            f'No checkpoint for step {step} in {self.directory}; it has '
            f'steps {steps}.'
        )
      steps = [step]
    for candidate in reversed(steps):
      error, result = None, None
      try:
        result = self._restore_step(candidate, lora_target, opt_target,
                                    data_iter)
      except Exception as e:  # pylint: disable=broad-exception-caught
        error = f'{type(e).__name__}: {e}'
      if _all_processes(error is None):
        logging.info('Restored checkpoint step %s from %s.', candidate,
                     self.directory)
        return result
      error = error or 'failed on another process'
      self.failed_steps[candidate] = error
      logging.warning(
          'Checkpoint step %s in %s could not be restored (%s); it is left '
          'on disk untouched. Trying an older step.', candidate,
          self.directory, _shorten(error),
      )
    failures = '\n'.join(
        f'  step {s}: {_shorten(e)}' for s, e in self.failed_steps.items()
    )
    if all(_is_mismatch(e) for e in self.failed_steps.values()):
      fix = ('The checkpoints are not damaged: they hold a different model '
             'or LoRA shape than this config builds. Use the config they '
             'were saved with, or a new workdir.')
    else:
      fix = ('Move the damaged step directories away (or use a new workdir) '
             'to start from scratch.')
    raise RestoreError(
        f'No checkpoint in {self.directory} could be restored:\n{failures}\n'
        + fix
    )

  def set_aside_damaged(self):
    """Moves the steps that failed in the last `restore` out of the way.

    Each goes to `<checkpoints>/damaged-step-<N>-<UTC time>/` (one warning
    line each), so later saves of those step numbers work. Only process 0
    moves; every process must call this.

    Returns:
      {step: new path} of the moved steps.
    """
    moved = {}
    stamp = time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())
    for step in sorted(self.failed_steps):
      moved[step] = self.directory / f'{DAMAGED_PREFIX}{step}-{stamp}'
      if jax.process_index() == 0:
        _move_dir(self.directory / str(step), moved[step])
        logging.warning(
            'Damaged checkpoint step %s moved aside to %s (kept for '
            'inspection; delete it when done); this run saves step %s anew.',
            step, moved[step], step,
        )
    if moved:
      if jax.process_count() > 1:
        multihost_utils.sync_global_devices('agent_tunix_set_aside_damaged')
      self._manager.reload()
      self.failed_steps = {}
    return moved

  def restore_into(self, model, optimizer=None, data_iter=None, step=None):
    """`restore`, then nnx.update of the model (and optimizer) in place.

    Returns:
      None if there is no checkpoint, else (meta, step).
    """
    restored = self.restore(
        lora_state(model),
        None if optimizer is None else optimizer_state(optimizer),
        data_iter,
        step=step,
    )
    if restored is None:
      return None
    nnx.update(model, restored.lora_state)
    if optimizer is not None:
      nnx.update(optimizer, restored.opt_state)
    return restored.meta, restored.step

  def wait(self):
    """Blocks until any asynchronous save has finished writing."""
    self._manager.wait_until_finished()

  def close(self):
    """Waits for pending saves and releases the manager (once)."""
    if not self._closed:
      self._closed = True
      self._manager.close()

  def __enter__(self):
    return self

  def __exit__(self, kind, error, traceback):
    """Closes; when leaving on an error, a failing close is only logged.

    A process that exits on an error does not wait for Orbax's background
    writes: a step being saved asynchronously would be left as a
    `<step>.orbax-checkpoint-tmp` directory, and lost.
    """
    if error is None:
      self.close()
      return False
    try:
      self.close()
    except Exception as e:  # pylint: disable=broad-exception-caught
      logging.error('Could not finish writing checkpoints after %s: %s',
                    kind.__name__, e)
    return False


def steps_on_disk(workdir):
  """The sorted checkpoint steps in `workdir` (reads only; creates nothing).

  A step counts once Orbax has finalised it: locally its directory has the
  step's number as its name (a save in progress is named otherwise); on
  gs:// it also holds commit_success.txt. Nothing is restored: a damaged
  step is listed too.
  """
  directory = storage.path(workdir) / CHECKPOINT_SUBDIR
  if not directory.exists():
    return []
  steps = [p for p in directory.iterdir() if p.name.isdigit()]
  if storage.is_remote(workdir):
    # An object store has no rename: Orbax writes a step in place and marks
    # it complete with this file last.
    steps = [p for p in steps if (p / _COMMIT_FILE).exists()]
  return sorted(int(p.name) for p in steps)


def has_steps(workdir):
  """True if `workdir` holds checkpoint steps (reads only; creates nothing)."""
  return bool(steps_on_disk(workdir))


def _move_dir(source, target):
  """Moves a directory (rename; copy and delete where rename cannot)."""
  source, target = storage.path(source), storage.path(target)
  try:
    source.rename(target)
    return
  except Exception:  # pylint: disable=broad-exception-caught
    if not source.exists() or target.exists():
      raise
  # Object stores (gs://) cannot rename a directory: copy, then delete.
  for path in sorted(source.rglob('*')):
    relative = path.relative_to(source)
    if path.is_dir():
      (target / relative).mkdir(parents=True, exist_ok=True)
    else:
      (target / relative).parent.mkdir(parents=True, exist_ok=True)
      path.copy(target / relative)
  source.rmtree()


def restore_lora(model, workdir, checkpoint_config, step=None):
  """Loads the LoRA of `workdir`'s checkpoint `step` (None: latest) into model.

  Returns:
    The restored step, or None if there is no checkpoint.
  """
  ckpt = Checkpointer(workdir, checkpoint_config, read_only=True)
  try:
    restored = ckpt.restore_into(model, step=step)
  finally:
    ckpt.close()
  return None if restored is None else restored[1]
