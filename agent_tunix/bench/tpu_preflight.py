"""Section preflight: the TPU compiler's figures for the bench's workload.

`agent_tunix.preflight.command.run` compiles the trainer's own programs (rollout
prefill, decode loop, log-prob passes, update) for a TPU slice with libtpu,
on this machine and without a TPU, for the config every other section runs.
Memory figures are the TPU compiler's, per device; time figures are roofline
lower bounds from the chip's published peak FLOP/s and HBM bandwidth, not
measurements.

config.mesh describes the bench machine's devices. It is kept when it spans
all of the slice's devices and its data-parallel axes split the
micro-batch's completions; otherwise the slice's devices are laid out as
(fsdp, tp) with the widest fsdp axis that divides both (what a run on that
slice would set in config.mesh.shape).
"""

import copy
import importlib.util
import math

from absl import logging

from agent_tunix.bench import records
from agent_tunix.config import validation
from agent_tunix.preflight import command as preflight
from agent_tunix.preflight import programs as preflight_programs
from agent_tunix.tpu import sharding
from agent_tunix.tpu import topology as tpu_topology

NAME = 'tpu_preflight'


def slice_mesh(config, num_devices):
  """(axis names, shape, source) of the mesh compiled for the slice.

  Args:
    config: the bench's config.
    num_devices: the slice's device count.

  Returns:
    (tuple of axis names, tuple of sizes, 'config' or 'fitted').
  """
  names, shape = tuple(config.mesh.axis_names), tuple(config.mesh.shape)
  rows = config.training.micro_batch_size * config.grpo.num_generations
  try:
    resolved = sharding.resolve_shape(shape, num_devices)
  except ValueError:
    resolved = None
  if resolved and math.prod(resolved) == num_devices:
    parallel = math.prod(size for name, size in zip(names, resolved)
                         if name in sharding.BATCH_AXES)
    if rows % parallel == 0:
      return names, tuple(resolved), 'config'
  fsdp = max(d for d in range(1, num_devices + 1)
             if num_devices % d == 0 and rows % d == 0)
  return ('fsdp', 'tp'), (fsdp, num_devices // fsdp), 'fitted'


# The run's own programs: this measurement reports no tunix section, so
# tunix's step is not compiled (the preflight command compiles it).
_PROGRAMS = tuple(p for p in preflight_programs.PROGRAMS if p != 'tunix')


def preflight_measurement(ctx, topology):
  """The preflight's report for the bench's config on `topology`."""
  if importlib.util.find_spec('libtpu') is None:
    raise records.Skipped(
        'compiling for a TPU slice needs libtpu (pip install "jax[tpu]").'
    )
  spec = tpu_topology.parse(topology)
  num_devices = len(tpu_topology.devices(spec))
  names, shape, source = slice_mesh(ctx.config, num_devices)
  config = ctx.config
  if source == 'fitted':
    sizes = validation.tp_sizes(config.model)
    if shape[1] not in sizes:
      rows = config.training.micro_batch_size * config.grpo.num_generations
      raise records.Skipped(
          f'{spec.name} has {num_devices} devices: a micro-batch\'s {rows} '
          f'completions split over fsdp={shape[0]} of them, which leaves '
          f'tp={shape[1]}, and the model\'s heads and widths allow tp in '
          f'{sizes} only. Choose a smaller --preflight_topology or a larger '
          'training.micro_batch_size.'
      )
    config = copy.deepcopy(config)
    config.mesh.axis_names = names
    config.mesh.shape = shape
  t0 = records.now()
  try:
    result = preflight.run(config, topology, programs=_PROGRAMS)
  except validation.ConfigError as e:
    raise records.Skipped(
        f'the workload cannot run on {spec.name}: {e}'
    ) from e
  seconds = records.now() - t0
  logging.info('preflight on %s: %.1f s', topology, seconds)
  topo = result['topology']
  settings = {
      'topology': topo['name'],
      'tpu_topology': topo['topology'],
      'chips': topo['chips'],
      'hosts': topo['hosts'],
      'devices': num_devices,
      'chip': topo['chip']['generation'],
      'usable_hbm_bytes': topo['usable_hbm_bytes'],
      'mesh_axis_names': list(names),
      'mesh_shape': list(shape),
      'mesh_source': source,
      'notes': result['notes'],
  }
  programs = {
      p['name']: {
          'total_bytes': p['total_bytes'],
          'time_bound_s': p['time_bound_s'],
          'calls_per_step': p['calls_per_step'],
          'fits': p['fits'],
          'flops': p['flops'],
          'bytes_accessed': p['bytes_accessed'],
          'compile_s': p['compile_s'],
      }
      for p in result['programs']
  }
  ours = {
      'name': f'agent_tunix training programs compiled for {topo["name"]} '
              '(preflight.command.run)',
      'median_s': None,  # Nothing runs: memory is compiled, time a bound.
      'largest_program': result['largest_program'],
      'largest_total_bytes': result['largest_total_bytes'],
      'fits': result['fits'],
      'step_time_bound_s': result['step_time_bound_s'],
      'programs': programs,
      'not_compiled': result['skipped'],
      'preflight_s': seconds,
  }
  return records.measurement(NAME, ['preflight'], settings, ours,
                             one_sided=True)
