"""The preflight as a function (`run`) and as a program (flags, `main`).

  python -m agent_tunix.preflight --config=configs/gemma3_1b.py \\
      --topology=v5litepod-8 [--output=preflight.json]

Exit status 0 when every program fits, 1 when one does not, 2 on a bad flag
or config, 3 when none is known not to fit but a compile was killed
(docs/preflight.md). Imports every module beside it, config/, tpu/,
data.opening (the run's data, opened before any compile) and cli.
"""

import json
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from agent_tunix import cli
from agent_tunix.config import validation
from agent_tunix.data import opening
from agent_tunix.preflight import calibration
from agent_tunix.preflight import child
from agent_tunix.preflight import programs as programs_lib
from agent_tunix.preflight import report as report_lib
from agent_tunix.preflight import resident
from agent_tunix.preflight import tunix_programs
from agent_tunix.tpu import sharding
from agent_tunix.tpu import topology as tpu_topology


def prepare(config, topology):
  """Parses the slice and validates `config` for it; nothing is compiled.

  Returns:
    (tpu_topology.Slice, its devices).

  Raises:
    ValueError (ConfigError for the config): a bad topology or config.
  """
  spec = tpu_topology.parse(topology)
  devices = tpu_topology.devices(spec)
  validation.validate(config, num_devices=len(devices),
                      process_count=spec.num_hosts)
  return spec, devices


def run(config, topology, programs=programs_lib.PROGRAMS, keep_going=False):
  """Validates `config`, compiles its programs for `topology`; the report.

  Args:
    config: the run's config.
    topology: an accelerator type or topology name (see tpu_topology).
    programs: which of PROGRAMS to compile.
    keep_going: compile every program even after one did not fit.

  Returns:
    The report dict (see `report.report`).

  Raises:
    resident.ResidentOverflow: the weights alone overflow a chip.
    opening.DataUnavailable: the run's data cannot be opened (a Hub this
      machine cannot reach is a warning on stderr).
  """
  spec, devices = prepare(config, topology)
  mesh = sharding.make_mesh(config.mesh, devices=devices)
  if mesh.devices.size != len(devices) and spec.num_hosts > 1:
    raise validation.ConfigError(
        f'config.mesh.shape={tuple(config.mesh.shape)} uses '
        f'{mesh.devices.size} of the {len(devices)} devices of {spec.name} '
        f'({spec.num_hosts} hosts); a multi-host mesh must use all of them '
        '(put -1 on one axis).'
    )
  usable = tpu_topology.available_hbm_bytes(devices[0])
  resident.check_resident(config, mesh, spec, usable)
  # The pod reads this data: opened before any compile (after the HBM
  # arithmetic, so a run too big to fit is told so without a download).
  # A Hub this machine cannot reach is only a warning: the pod reads it.
  try:
    opening.check(config)
  except opening.HubUnreachable as e:
    sys.stderr.write(f'preflight: warning: data not checked here: {e}\n')
  compiled, skipped, theirs = child.compile_isolated(
      config, topology, usable, programs, keep_going)
  per_chip = max(1, len(devices) // spec.num_chips)
  tunix = None
  if 'tunix' in programs:
    tunix = report_lib.tunix_section(theirs, spec.chip, usable, per_chip,
                                     tunix_programs.why_not(config))
  return report_lib.report(
      config, spec, [p for p in compiled if p.name != 'tunix'],
      usable=usable, devices_per_chip=per_chip, skipped=skipped,
      calibration=calibration.calibrate(devices[0]), tunix=tunix)


# Flag holders, set by define_flags() only when the preflight is the program
# (__main__.py): the bench imports this module and defines its own --config.
_CONFIG = _TOPOLOGY = _OUTPUT = _KEEP_GOING = _SUMMARIZE = _PROGRAMS = None
_BREAKDOWN = None


def define_flags():
  """Defines the command-line flags (see the module docstring)."""
  global _CONFIG, _TOPOLOGY, _OUTPUT, _KEEP_GOING, _SUMMARIZE, _PROGRAMS
  global _BREAKDOWN
  _CONFIG = config_flags.DEFINE_config_file(
      'config', None, 'Config file (a get_config() module).', lock_config=True
  )
  _TOPOLOGY = flags.DEFINE_string(
      'topology', None,
      'TPU slice: a topology (v5e:2x2, v5e:4x4, v5p:2x2x2) or an accelerator '
      'type as gcloud spells it (v5litepod-8, v5litepod-16, v6e-8, v5p-8, '
      'v4-8; v5e-N means v5litepod-N).'
  )
  _OUTPUT = flags.DEFINE_string(
      'output', None, 'Also write the full report as JSON to this file.'
  )
  _KEEP_GOING = flags.DEFINE_bool(
      'keep_going', False,
      'Compile every program even after one does not fit or its compile '
      'was killed (by default the preflight stops at the first).'
  )
  _SUMMARIZE = flags.DEFINE_list(
      'summarize', [],
      'Instead of compiling: print a Markdown table of the --output JSON '
      'files given (comma-separated), one row per file.'
  )
  _PROGRAMS = flags.DEFINE_list(
      'programs', list(programs_lib.PROGRAMS),
      'Programs to compile (those the config does not run are skipped; '
      "'tunix' is tunix's own step, compiled alike)."
  )
  _BREAKDOWN = flags.DEFINE_bool(
      'breakdown', False,
      'Also print where each program\'s bytes and flops go (by cause and '
      'the top instructions) and the count\'s calibration; the JSON '
      'always has them.'
  )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if _SUMMARIZE.value:
    reports = []
    for path in _SUMMARIZE.value:
      with open(path) as f:
        reports.append(json.load(f))
    sys.stdout.write(report_lib.summary_table(reports) + '\n')
    return
  if not _CONFIG.value or not _TOPOLOGY.value:
    raise app.UsageError('--config and --topology are required.')
  unknown = sorted(set(_PROGRAMS.value) - set(programs_lib.PROGRAMS))
  if unknown:
    raise app.UsageError(
        f'--programs: unknown {unknown}; choose from '
        f'{list(programs_lib.PROGRAMS)}.'
    )
  config = _CONFIG.value
  try:
    prepare(config, _TOPOLOGY.value)
  except ValueError as e:  # ConfigError included.
    sys.stderr.write(f'preflight: {e}\n')
    sys.exit(2)
  try:
    result = run(config, _TOPOLOGY.value, tuple(_PROGRAMS.value),
                 keep_going=_KEEP_GOING.value)
  except resident.ResidentOverflow as e:
    sys.stderr.write(f'preflight: {e}\n')
    sys.exit(1)
  except opening.DataUnavailable as e:
    cli.usage_exit(e)
  sys.stdout.write(report_lib.format_report(result) + '\n')
  if _BREAKDOWN.value:
    sys.stdout.write(report_lib.format_breakdown(result) + '\n')
  if _OUTPUT.value:
    with open(_OUTPUT.value, 'w') as f:
      json.dump(result, f, indent=2)
  sys.exit({'FITS': 0, 'DOES NOT FIT': 1}.get(report_lib.verdict(result), 3))
