"""What machine a run is on: its CPU, the vector instructions XLA can use.

The same seed can end differently on two machines (XLA's CPU sums depend
on the CPU and the thread count), and the CPU sets a step's time. A run
logs `summary()` at every start, and writes it into its event file, so
that two runs' logs say whether they ran on the same kind of machine.
"""

import os
import platform

import jax

# The x86 flags that change what XLA's CPU backend emits (and how fast).
ISA_FLAGS = ('avx2', 'fma', 'avx512f', 'avx512_bf16', 'avx512_vnni',
             'amx_bf16', 'amx_tile')
CPUINFO = '/proc/cpuinfo'


def parse_cpuinfo(text):
  """(CPU model name, [ISA_FLAGS present]) from /proc/cpuinfo's text.

  Reads the first processor's block; a field it lacks gives '' or [].
  """
  model, flags = '', set()
  for line in text.splitlines():
    if not line.strip():
      if model or flags:
        break  # The end of the first processor's block.
      continue
    key, _, value = line.partition(':')
    key = key.strip()
    if key == 'model name':
      model = value.strip()
    elif key in ('flags', 'Features'):  # x86 / arm64.
      flags = set(value.split())
  return model, [f for f in ISA_FLAGS if f in flags]


def usable_cpus():
  """The CPUs this process may run on (what XLA sizes its threads by)."""
  try:
    return len(os.sched_getaffinity(0))
  except (AttributeError, OSError):  # Not Linux.
    return os.cpu_count() or 1


def describe(cpuinfo=CPUINFO):
  """The machine as a dict: backend, devices, CPUs, CPU model and ISA."""
  try:
    with open(cpuinfo) as f:
      model, isa = parse_cpuinfo(f.read())
  except OSError:  # Not Linux: no /proc.
    model, isa = platform.processor(), []
  devices = jax.devices()
  return {
      'backend': jax.default_backend(),
      'device_kind': devices[0].device_kind,
      'device_count': len(devices),
      'cpu_model': model or 'unknown',
      'usable_cpus': usable_cpus(),
      'cpu_isa': isa,
      'jax': jax.__version__,
  }


def summary(info):
  """One line for the log, from `describe()`'s dict."""
  isa = ' '.join(info['cpu_isa']) or 'none of ' + '/'.join(ISA_FLAGS)
  return (f"{info['device_count']} x {info['device_kind']} "
          f"({info['backend']}); CPU {info['cpu_model']}, "
          f"{info['usable_cpus']} usable, ISA: {isa}; jax {info['jax']}")
