"""Measurement records of the bench's JSON: sides, measurements, status.

A section returns a side (`step_summary`) or whole measurements
(`measurement`); `run_section` runs one, turning `Skipped` and errors into
a reason. The record layout is documented in `python -m agent_tunix.bench
--help`.
"""

import os
import platform
import statistics
import sys
import time
import traceback

from absl import logging

from agent_tunix.observe import machine

SCHEMA_VERSION = 1


class Skipped(Exception):
  """A section cannot run here; the message says why."""



def now():
  """Seconds of a monotonic clock."""
  return time.perf_counter()


def median(values):
  """The median as a float, or None for no values."""
  return float(statistics.median(values)) if values else None



def machine_info():
  versions = {}
  for name in ('jax', 'flax', 'tunix', 'qwix', 'optax', 'torch', 'trl',
               'transformers'):
    module = sys.modules.get(name)
    if module is not None:
      versions[name] = str(getattr(module, '__version__', 'unknown'))
  described = machine.describe()
  return {
      'jax_backend': described['backend'],
      'device_kind': described['device_kind'],
      'device_count': described['device_count'],
      'cpu_count': os.cpu_count(),
      'cpu_model': described['cpu_model'],
      'cpu_isa': described['cpu_isa'],
      'load_average': [round(x, 2) for x in os.getloadavg()],
      'platform': platform.platform(),
      'versions': versions,
  }



def step_summary(name, steps_s, warmup_s, tokens, breakdown=None,
                 note=None):
  """A measurement side from per-step times.

  Args:
    name: what ran.
    steps_s: the timed steps' seconds.
    warmup_s: the warm-up steps' seconds; their excess over the median is
      reported as compile_s (compilation and one-time setup).
    tokens: completion tokens per step.
    breakdown: {part: [seconds per timed step]}.
    note: how the times were taken.

  Returns:
    The side's dict (see the module docstring).
  """
  med = median(steps_s)
  side = {
      'name': name,
      'median_s': med,
      'steps_s': [round(s, 6) for s in steps_s],
      'warmup_steps_s': [round(s, 6) for s in warmup_s],
      'compile_s': max(0.0, sum(warmup_s) - len(warmup_s) * med),
      'tokens_per_s': tokens / med if med else None,
  }
  if breakdown is not None:
    side['breakdown_s'] = {k: median(v) for k, v in breakdown.items()}
  if note:
    side['note'] = note
  return side


def measurement(name, sections, settings, ours=None, peer=None, reason=None,
                error=False, one_sided=False):
  """A measurement record; one_sided: it has no peer by design."""
  if error:
    status = 'error'
  elif ours is not None and (peer is not None or one_sided):
    status = 'ok'
  elif ours is not None or peer is not None:
    status = 'partial'
  else:
    status = 'skipped'
  ratio = None
  if ours and peer and ours.get('median_s') and peer.get('median_s'):
    ratio = ours['median_s'] / peer['median_s']
  return {
      'name': name,
      'sections': list(sections),
      'status': status,
      'reason': reason,
      'settings': settings,
      'ours': ours,
      'peer': peer,
      'ratio': ratio,
  }


def run_section(section, skip, fn, *args):
  """Runs fn unless skipped; returns (result or None, reason or None, err)."""
  if section in skip:
    return None, f'{section}: skipped by --skip', False
  try:
    return fn(*args), None, False
  except Skipped as e:
    logging.warning('Section %s skipped: %s', section, e)
    return None, f'{section}: {e}', False
  except Exception as e:  # pylint: disable=broad-except
    logging.error('Section %s failed:\n%s', section, traceback.format_exc())
    return None, f'{section}: {type(e).__name__}: {e}', True


def join_reasons(*reasons):
  text = '; '.join(r for r in reasons if r)
  return text or None
