"""TPU topologies without a TPU: names, chip specs and compile-only devices.

libtpu (installed by `jax[tpu]`) describes any TPU slice on a machine that
has none; `devices(spec)` returns that slice's compile-only devices, on which
a Mesh is built and programs are compiled (`jax.jit(...).lower(...)
.compile()`), e.g. by the preflight.

A slice is named either as a topology (`v5e:4x4`: generation, then chips
along each axis) or as an accelerator type as `gcloud compute tpus tpu-vm
create --accelerator-type` spells it:

  v5litepod-N (or v5e-N)  v5e, N chips; 1, 4, 8 chips on one host, larger
                          slices in hosts of 4 chips (2x2)
  v6e-N                   v6e, N chips; hosts as for v5e
  v5p-N                   v5p, N TensorCores = N/2 chips in hosts of 4
                          (2x2x1); one device per chip (megacore)
  v4-N                    v4, N TensorCores = N/2 chips in hosts of 4
                          (2x2x1); libtpu's compile-only v4 topology has
                          one device per TensorCore (2 per chip)

`ACCELERATOR_TYPES` lists the slice shapes this module knows; any
`generation:AxB[xC]` topology is also accepted as is.
"""

import dataclasses
import os
import re

# Published per-chip peak bf16 compute, HBM capacity and HBM bandwidth.
# Sources (Cloud TPU system architecture pages, read 2026-11):
#   v5e https://cloud.google.com/tpu/docs/v5e : 197 TFLOP/s, 16 GB, 819 GB/s
#   v6e https://cloud.google.com/tpu/docs/v6e : 918 TFLOP/s, 32 GB, 1638 GB/s
#   v5p https://cloud.google.com/tpu/docs/v5p : 459 TFLOP/s, 95 GB, 2765 GB/s
#   v4  https://cloud.google.com/tpu/docs/v4  : 275 TFLOP/s, 32 GiB, 1200 GB/s
# HBM capacities are taken as binary units (16 GiB etc.). What one program
# may use is a little less, and is asked of the compiler
# (`available_hbm_bytes`: 15.75 GiB on a v5e, 31.25 on a v6e, 95.74 on a
# v5p, 15.25 per TensorCore device of a v4, with this libtpu).


@dataclasses.dataclass(frozen=True)
class Chip:
  """Published figures of one TPU chip."""

  generation: str
  peak_bf16_flops: float  # FLOP/s
  hbm_bytes: int
  hbm_bandwidth: float  # bytes/s
  source: str


GiB = 1024**3

CHIPS = {
    'v5e': Chip('v5e', 197e12, 16 * GiB, 819e9,
                'https://cloud.google.com/tpu/docs/v5e'),
    'v6e': Chip('v6e', 918e12, 32 * GiB, 1638e9,
                'https://cloud.google.com/tpu/docs/v6e'),
    'v5p': Chip('v5p', 459e12, 95 * GiB, 2765e9,
                'https://cloud.google.com/tpu/docs/v5p'),
    'v4': Chip('v4', 275e12, 32 * GiB, 1200e9,
               'https://cloud.google.com/tpu/docs/v4'),
}

# Accelerator type -> (topology, chips per host). Single-host slices give
# the whole slice as one host.
ACCELERATOR_TYPES = {
    'v5litepod-1': ('v5e:1x1', (1, 1, 1)),
    'v5litepod-4': ('v5e:2x2', (2, 2, 1)),
    'v5litepod-8': ('v5e:2x4', (2, 4, 1)),
    'v5litepod-16': ('v5e:4x4', (2, 2, 1)),
    'v5litepod-32': ('v5e:4x8', (2, 2, 1)),
    'v5litepod-64': ('v5e:8x8', (2, 2, 1)),
    'v5litepod-128': ('v5e:8x16', (2, 2, 1)),
    'v5litepod-256': ('v5e:16x16', (2, 2, 1)),
    'v6e-1': ('v6e:1x1', (1, 1, 1)),
    'v6e-4': ('v6e:2x2', (2, 2, 1)),
    'v6e-8': ('v6e:2x4', (2, 4, 1)),
    'v6e-16': ('v6e:4x4', (2, 2, 1)),
    'v6e-32': ('v6e:4x8', (2, 2, 1)),
    'v6e-64': ('v6e:8x8', (2, 2, 1)),
    'v6e-128': ('v6e:8x16', (2, 2, 1)),
    'v6e-256': ('v6e:16x16', (2, 2, 1)),
    'v5p-8': ('v5p:2x2x1', (2, 2, 1)),
    'v5p-16': ('v5p:2x2x2', (2, 2, 1)),
    'v5p-32': ('v5p:2x2x4', (2, 2, 1)),
    'v5p-64': ('v5p:2x4x4', (2, 2, 1)),
    'v5p-128': ('v5p:4x4x4', (2, 2, 1)),
    'v4-8': ('v4:2x2x1', (2, 2, 1)),
    'v4-16': ('v4:2x2x2', (2, 2, 1)),
    'v4-32': ('v4:2x2x4', (2, 2, 1)),
    'v4-64': ('v4:2x4x4', (2, 2, 1)),
    'v4-128': ('v4:4x4x4', (2, 2, 1)),
}
# v5e-N is accepted for v5litepod-N (the name used in docs and prices).
_ALIASES = {
    f'v5e-{n}': f'v5litepod-{n}' for n in (1, 4, 8, 16, 32, 64, 128, 256)
}
_TOPOLOGY = re.compile(r'^(v4|v5e|v5p|v6e):(\d+)x(\d+)(?:x(\d+))?$')


@dataclasses.dataclass(frozen=True)
class Slice:
  """A TPU slice to compile for."""

  name: str  # what the user asked for
  topology: str  # e.g. 'v5e:2x4'
  chips_per_host: tuple  # (x, y, z) bounds of one host
  chip: Chip

  @property
  def num_chips(self):
    dims = [int(d) for d in self.topology.split(':')[1].split('x')]
    n = 1
    for d in dims:
      n *= d
    return n

  @property
  def num_hosts(self):
    per_host = 1
    for d in self.chips_per_host:
      per_host *= d
    return max(1, self.num_chips // per_host)


def parse(name):
  """A `Slice` from an accelerator type or a topology name.

  Args:
    name: 'v5litepod-16', 'v5e-16', 'v6e-8', 'v5p-8', 'v4-8', or a topology
      such as 'v5e:4x4' / 'v5p:2x2x2'.

  Returns:
    The Slice.

  Raises:
    ValueError: naming the value and what is accepted.
  """
  key = _ALIASES.get(name.strip().lower(), name.strip().lower())
  if key in ACCELERATOR_TYPES:
    topology, per_host = ACCELERATOR_TYPES[key]
    return Slice(name, topology, per_host, CHIPS[topology.split(':')[0]])
  match = _TOPOLOGY.match(key)
  if not match:
    raise ValueError(
        f'--topology={name!r} is neither a TPU topology '
        "(generation:AxB[xC], e.g. 'v5e:2x2', 'v5p:2x2x2') nor a known "
        f'accelerator type ({", ".join(sorted(ACCELERATOR_TYPES))}).'
    )
  generation = match.group(1)
  dims = [int(d) for d in match.groups()[1:] if d]
  chips = 1
  for d in dims:
    chips *= d
  if generation in ('v5e', 'v6e'):
    # One host holds up to 8 chips (2x4); larger slices use hosts of 2x2.
    per_host = (dims[0], dims[1], 1) if chips <= 8 else (2, 2, 1)
  else:
    per_host = (2, 2, 1) if chips >= 4 else tuple(dims + [1] * (3 - len(dims)))
  return Slice(name, key, per_host, CHIPS[generation])


def devices(spec):
  """The slice's compile-only TPU devices (no TPU needed; libtpu is).

  Args:
    spec: a `Slice` (see `parse`).

  Returns:
    list of jax devices, one per TPU device of the slice, over
    `spec.num_hosts` processes.
  """
  # libtpu takes a machine-wide lock when it loads, so a second process (a
  # test, another preflight, a run on this TPU VM) would fail; compiling
  # needs no TPU, so no lock.
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    desc = topologies.get_topology_desc(
        platform='tpu', topology_name=spec.topology,
        chips_per_host_bounds=spec.chips_per_host,
    )
  except Exception as e:  # pylint: disable=broad-exception-caught
    raise ValueError(
        f'libtpu cannot describe TPU topology {spec.topology!r} with '
        f'{spec.chips_per_host} chips per host: {e}'
    ) from e
  return list(desc.devices)


_AVAILABLE = re.compile(r'available HBM \(([\d.]+)([KMGT]?)\)')
_UNITS = {'': 1, 'K': 1024, 'M': 1024**2, 'G': 1024**3, 'T': 1024**4}


def parse_bytes(number, unit):
  """Bytes of an XLA size such as ('15.75', 'G') (binary units)."""
  return int(float(number) * _UNITS[unit])


def available_hbm_bytes(device):
  """HBM the TPU compiler lets one program use on `device`, in bytes.

  Asked of the compiler itself: a program larger than any HBM is compiled
  for the device and its out-of-memory error names the available HBM
  (e.g. 15.75 GiB of a v5e's 16: the runtime keeps the rest).

  Args:
    device: a (compile-only) TPU device.

  Returns:
    int bytes.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  probe = jax.ShapeDtypeStruct(
      (256 * GiB // 4,), jnp.float32,
      sharding=jax.sharding.SingleDeviceSharding(device),
  )
  try:
    jax.jit(lambda x: x + 1).lower(probe).compile()
  except Exception as e:  # pylint: disable=broad-exception-caught
    match = _AVAILABLE.search(str(e))
    if match:
      return parse_bytes(*match.groups())
    raise
  raise RuntimeError(
      f'A 512 GiB program compiled for {device.device_kind}; cannot tell '
      'its available HBM.'
  )
