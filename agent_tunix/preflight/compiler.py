"""The compiler's figures: program records and the compile of one program.

`Compiler` compiles the programs in turn, stopping at the first that does
not fit, and keeps a `Program` (or a `Killed`) per program with the TPU
compiler's memory figures and the flops and HBM bytes of its optimized HLO
(`hlo_cost`). Imports tpu/ and hlo_cost only.
"""

import dataclasses
import gc
import math
import re
import time

from absl import logging
import jax
import jax.numpy as jnp

from agent_tunix.preflight import hlo_cost
from agent_tunix.tpu import topology as tpu_topology

# The TPU compiler's refusal of a program larger than the HBM, in the two
# wordings libtpu has used ('... (17.2G) exceeds available HBM' and
# 'Ran out of memory in memory space hbm. Used 15.84G of 15.75G hbm.').
_OUT_OF_HBM = re.compile(
    r'RESOURCE_EXHAUSTED: Ran out of memory on HBM.*? \(([\d.]+)([KMGT]?)\) '
    r'exceeds available HBM'
    r'|Ran out of memory in memory space hbm\. Used ([\d.]+)([KMGT]?) of'
)


def hbm_refusal_bytes(message):
  """Bytes the compiler said a refused program needs, or None."""
  match = _OUT_OF_HBM.search(message)
  if not match:
    return None
  groups = match.groups()
  value, unit = groups[:2] if groups[0] is not None else groups[2:]
  return tpu_topology.parse_bytes(value, unit)


@dataclasses.dataclass
class Program:
  """One compiled program's per-chip figures."""

  name: str
  calls_per_step: float  # Amortised: policy_logps runs once per save.
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  code_bytes: int
  resident_bytes: int  # live state that is not an argument
  flops: float
  bytes_accessed: float
  compile_s: float
  # When the compiler refused the program for want of HBM: its message and
  # the bytes it said the program needs.
  error: str = ''
  required_bytes: int = 0
  # The trainer's function compiled, e.g. 'rollout.Rollout.decode_fn' or,
  # with episodes, 'episodes.EpisodeRollout.decode_fn'.
  function: str = ''
  # XLA's own cost_analysis() figures, which count a loop body once and
  # every byte in the chip's on-chip memory too; flops and bytes_accessed
  # above are the HLO count's (`hlo_cost`): HBM bytes, loops with trips.
  compiler_flops: float = 0.0
  compiler_bytes_accessed: float = 0.0
  # The least HBM traffic of one call for its layout (`analytic`), and
  # what it counts.
  analytic_min_bytes: float = 0.0
  analytic_terms: dict = dataclasses.field(default_factory=dict)
  # Where the flops and bytes go (`hlo_cost.Count.breakdown`).
  breakdown: dict = dataclasses.field(default_factory=dict)

  @property
  def total_bytes(self):
    own = (self.argument_bytes + self.output_bytes - self.alias_bytes +
           self.temp_bytes + self.code_bytes)
    return max(own, self.required_bytes) + self.resident_bytes

  def time_bound_s(self, chip, devices_per_chip=1):
    """Roofline lower bound of one call on one device, in seconds."""
    return max(self.flops * devices_per_chip / chip.peak_bf16_flops,
               self.bytes_accessed * devices_per_chip / chip.hbm_bandwidth)


@dataclasses.dataclass
class Killed(Program):
  """A program whose compile the kernel killed (SIGKILL): no figures.

  A kernel out of host memory kills the largest process; compiling a big
  model's program can take tens of GiB of host RAM.
  """

  killed: bool = True
  host_peak_bytes: int = 0  # Peak resident memory of the compiling process.


def per_chip_bytes(tree):
  """Bytes one chip holds of the (abstract, sharded) arrays of `tree`."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    if not hasattr(leaf, 'shape'):  # Python scalars of the sampler state.
      continue
    shape = leaf.shape
    if getattr(leaf, 'sharding', None) is not None:
      shape = leaf.sharding.shard_shape(shape)
    total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
  return total


def sharded_outputs(lowered, compiled):
  """The compiled program's outputs as sharded ShapeDtypeStructs."""
  return jax.tree.map(
      lambda info, s: jax.ShapeDtypeStruct(info.shape, info.dtype,
                                           sharding=s),
      lowered.out_info, compiled.output_shardings,
  )


class Compiler:
  """Compiles programs in turn, stopping at the first that does not fit.

  Attributes:
    usable: HBM bytes a program may use on one device.
    keep_going: compile every program even after one did not fit.
    programs: the `Program`s so far.
    skipped: names of programs not compiled (after a misfit).
    listener: called as each thing happens: ('start', name, calls_per_step,
      argument bytes, resident bytes, function) as a compile starts,
      ('program', Program) as one is done, ('skipped', name).
  """

  def __init__(self, usable, keep_going=False, listener=None):
    self.usable = usable
    self.keep_going = keep_going
    self.programs = []
    self.skipped = []
    self.listener = listener or (lambda *event: None)

  def skip(self, name):
    self.skipped.append(name)
    self.listener('skipped', name)

  def _add(self, program):
    self.programs.append(program)
    self.listener('program', program)

  @property
  def stopped(self):
    return not self.keep_going and any(
        p.error or p.total_bytes > self.usable for p in self.programs)

  def __call__(self, name, fn, args, kwargs, calls_per_step, resident_bytes,
               open_loop_trips=1, function='', analytic=None):
    """Compiles `fn(*args, **kwargs)`; returns its sharded outputs or None.

    Args:
      name: the program's name (programs.PROGRAMS).
      fn: a jitted function.
      args: its positional arguments (sharded ShapeDtypeStructs).
      kwargs: its static keyword arguments.
      calls_per_step: calls per training step.
      resident_bytes: per-device bytes of live state outside its arguments.
      open_loop_trips: trips of a loop whose trip count the compiler does
        not know, which calls_per_step counts (the decode loop: one call
        per generated token); the figures are then per trip, the work
        outside the loop shared among the trips.
      function: the trainer's function `fn` is, for the report.
      analytic: (min bytes, {term: bytes}) of one call, or None.

    Returns:
      The outputs as ShapeDtypeStructs, or None when not compiled.
    """
    if self.stopped:
      self.skip(name)
      return None
    start = time.perf_counter()
    arg_bytes = per_chip_bytes(args)
    if arg_bytes + resident_bytes > self.usable:
      # The inputs alone overflow: no need to ask the compiler.
      self._add(_refused(
          name, calls_per_step, arg_bytes, resident_bytes, start,
          f'its arguments alone take {gib(arg_bytes)} GiB per device',
          arg_bytes, function))
      return None
    self.listener('start', name, calls_per_step, arg_bytes, resident_bytes,
                  function)
    logging.info('Compiling %s ...', name)
    lowered = fn.lower(*args, **kwargs)
    try:
      compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
      needed = hbm_refusal_bytes(str(e))
      if needed is None:
        raise
      self._add(_refused(
          name, calls_per_step, arg_bytes, resident_bytes, start,
          str(e).strip().splitlines()[0], needed, function))
      return None
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    count = hlo_cost.count(compiled.as_text(), open_loop_trips)
    min_bytes, terms = analytic or (0.0, {})
    program = Program(
        name=name,
        calls_per_step=calls_per_step,
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        code_bytes=int(memory.generated_code_size_in_bytes),
        resident_bytes=int(resident_bytes),
        flops=count.flops / open_loop_trips,
        bytes_accessed=count.bytes / open_loop_trips,
        compile_s=seconds,
        function=function,
        compiler_flops=float(cost.get('flops', 0.0)),
        compiler_bytes_accessed=float(cost.get('bytes accessed', 0.0)),
        analytic_min_bytes=float(min_bytes),
        analytic_terms=dict(terms),
        breakdown=count.breakdown(),
    )
    logging.info('Compiled %s in %.1f s: %s GiB per device', name, seconds,
                 gib(program.total_bytes))
    self._add(program)
    outputs = sharded_outputs(lowered, compiled)
    # Free the executable and JAX's tracing caches before the next compile:
    # kept, they added up (the 4B on a v5litepod-8 grew to 24 GiB of host
    # RAM and was killed compiling its update, which alone peaks at 13.5).
    del lowered, compiled
    jax.clear_caches()
    gc.collect()
    return outputs


def _refused(name, calls_per_step, arg_bytes, resident_bytes, start, error,
             required, function=''):
  logging.info('%s does not fit: %s', name, error)
  return Program(
      name=name, calls_per_step=calls_per_step, argument_bytes=arg_bytes,
      output_bytes=0, alias_bytes=0, temp_bytes=0, code_bytes=0,
      resident_bytes=int(resident_bytes), flops=0.0, bytes_accessed=0.0,
      compile_s=time.perf_counter() - start, error=error,
      required_bytes=required, function=function,
  )


def gib(n):
  """`n` bytes in GiB with two decimals, as the report prints them."""
  return f'{n / tpu_topology.GiB:.2f}'
