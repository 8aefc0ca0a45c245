"""The preflight's report: the JSON, the table, the verdict and the fixes.

Imports config/, models/, tpu/ and the modules beside it.
"""

import dataclasses

from agent_tunix.config import validation
from agent_tunix.models import gemma
from agent_tunix.models import gemma4 as gemma4_lib
from agent_tunix.preflight import compiler
from agent_tunix.preflight import programs as programs_lib
from agent_tunix.preflight import tunix_programs
from agent_tunix.tpu import topology as tpu_topology


def host_fixes(program):
  """What to do about a program whose compile the kernel killed, as text."""
  return [
      'a machine with more host RAM',
      f'--programs={program.name} (one program per preflight run, so '
      'nothing compiled before it shares its process)',
  ]


def fixes(config, program, spec):
  """Config changes that lower `program`'s per-chip memory, as text."""
  out = []
  m, t, gen = config.model, config.training, config.generation
  if m.dtype == 'float32':
    out.append("--config.model.dtype=bfloat16 (halves the weights)")
  if program.name in ('update', 'reference_logps', 'policy_logps'):
    if t.micro_batch_size > 1:
      out.append(f'--config.training.micro_batch_size='
                 f'{max(1, t.micro_batch_size // 2)} (fewer rows per pass)')
    if program.name == 'update' and m.remat != 'layer':
      out.append("--config.model.remat=layer (keep only each layer's input)")
  else:
    need = gen.max_prompt_length + max(gen.max_generation_steps,
                                       config.eval.max_generation_steps)
    if gen.kv_cache_size > need:
      out.append(f'--config.generation.kv_cache_size={need} '
                 '(prompt + completion)')
    out.append(f'--config.training.batch_size='
               f'{max(1, t.batch_size // 2)} (fewer rows to sample)')
  shape = dict(zip(config.mesh.axis_names, config.mesh.shape))
  tp = shape.get('tp', 1)
  wider = [d for d in validation.tp_sizes(m) if d > tp]
  if wider and spec.num_chips % wider[0] == 0:
    out.append(f"a wider 'tp' mesh axis (now {tp}), e.g. "
               f"--config.mesh.shape='(-1, {wider[0]})' (shards heads and "
               'features)')
  out.append(f'a bigger slice than {spec.name} ({spec.num_chips} chips of '
             f'{spec.chip.hbm_bytes / tpu_topology.GiB:.0f} GiB)')
  return out


def report(config, spec, programs, usable, devices_per_chip=1,
           skipped=(), calibration=None, tunix=None):
  """The JSON-able report of a preflight.

  Args:
    config: the run's config.
    spec: the tpu_topology.Slice compiled for.
    programs: the compiled `Program`s.
    usable: HBM bytes the compiler lets a program use on one device
      (`tpu_topology.available_hbm_bytes`).
    devices_per_chip: JAX devices per chip (2 for libtpu's v4 topologies,
      one per TensorCore): each gets its share of the chip's compute and
      bandwidth.
    skipped: programs not compiled because an earlier one did not fit.
    calibration: `calibration.calibrate`'s cases, or None.
    tunix: the `tunix` section (`tunix_section`), or None.

  Returns:
    A dict of plain values (docs/preflight.md).
  """
  rows, step_s = _rows(programs, spec.chip, usable, devices_per_chip)
  for p, row in zip(programs, rows):
    row['fixes'] = ([] if row['fits'] else host_fixes(p)
                    if getattr(p, 'killed', False) else fixes(config, p, spec))
  return {
      'config': {
          'preset': config.model.preset,
          'dtype': config.model.dtype,
          'lora_rank': config.model.lora_rank,
          'remat': config.model.remat,
          'mesh_shape': list(config.mesh.shape),
          'mesh_axis_names': list(config.mesh.axis_names),
          'batch_size': config.training.batch_size,
          'micro_batch_size': config.training.micro_batch_size,
          'num_generations': config.grpo.num_generations,
          'max_prompt_length': config.generation.max_prompt_length,
          'max_generation_steps': config.generation.max_generation_steps,
          'kv_cache_size': config.generation.kv_cache_size,
          # Either set: rollout_decode is the episode decode loop (its
          # `function`).
          'agent_tools': config.agent.tools,
          'agent_environment': config.agent.environment,
      },
      'topology': {
          'name': spec.name,
          'topology': spec.topology,
          'chips': spec.num_chips,
          'hosts': spec.num_hosts,
          'chip': dataclasses.asdict(spec.chip),
          'devices_per_chip': devices_per_chip,
          'usable_hbm_bytes': usable,
      },
      'programs': rows,
      'moe': gemma4_lib.moe_costs(
          gemma.model_config(config.model),
          config.model.lora_rank if config.model.get('lora_experts') else 0),
      'skipped': list(skipped),
      'largest_program': max(rows, key=lambda r: r['total_bytes'])['name'],
      'largest_total_bytes': max(r['total_bytes'] for r in rows),
      'fits': all(r['fits'] for r in rows) and not skipped,
      'step_time_bound_s': step_s,
      'calibration': calibration or {},
      'tunix': tunix or {},
      'notes': (
          'Memory figures are the TPU compiler\'s (per chip). flops and '
          'bytes_accessed are counted from the optimized HLO: the HBM bytes '
          'each instruction reads and writes (on-chip buffers not '
          'counted), every loop times its trip count; the decode loop, '
          'whose trips the compiler does not know, per step '
          '(max_generation_steps calls). compiler_flops and '
          'compiler_bytes_accessed are XLA\'s cost_analysis(), which '
          'counts a loop body once and on-chip traffic too. Time figures '
          'are lower bounds: max(flops / peak bf16 FLOP/s, bytes / HBM '
          'bandwidth) per call with the published chip figures; the step '
          'bound sums them times calls_per_step. analytic_min_bytes is the '
          'least a call must move for its layout (docs/tpu.md).'
      ),
  }


def _rows(programs, chip, usable, devices_per_chip):
  """([the report's row of each program], the step bound they sum to)."""
  rows, step_s = [], 0.0
  for p in programs:
    bound = p.time_bound_s(chip, devices_per_chip)
    step_s += bound * p.calls_per_step
    row = dataclasses.asdict(p)
    row.update(
        total_bytes=p.total_bytes,
        fits=p.total_bytes <= usable and not p.error,
        bytes_over=max(0, p.total_bytes - usable),
        time_bound_s=bound,
        min_ratio=(p.bytes_accessed / p.analytic_min_bytes
                   if p.analytic_min_bytes else None),
    )
    rows.append(row)
  return rows, step_s


def tunix_section(programs, chip, usable, devices_per_chip=1, reason=''):
  """The report's `tunix` entry: tunix's programs (`tunix_programs`) and
  the step bound they sum to, or why they were not compiled."""
  rows, step_s = _rows(programs, chip, usable, devices_per_chip)
  done = {r['name'] for r in rows}
  return {
      'programs': rows,
      'step_time_bound_s': step_s if rows else None,
      'not_compiled': [n for n in tunix_programs.PROGRAMS if n not in done],
      'why_not': reason,
      'notes': tunix_programs.NOTES,
  }


def format_report(result):
  """Human-readable table of a report."""
  topo = result['topology']
  chip = topo['chip']
  lines = [
      f"Preflight: {result['config']['preset']} "
      f"({result['config']['dtype']}, LoRA r{result['config']['lora_rank']},"
      f" remat {result['config']['remat']}) on {topo['name']} "
      f"({topo['topology']}: {topo['chips']} chips, {topo['hosts']} "
      f"host(s), {chip['hbm_bytes'] / tpu_topology.GiB:.0f} GiB HBM per "
      f"chip, {compiler.gib(topo['usable_hbm_bytes'])} GiB usable per "
      'device)',
      'Per chip, GiB (compiler): args + out - alias + temp + code '
      '+ resident = total; time = roofline lower bound per call',
      f"{'program':16s} {'args':>7s} {'out':>7s} {'temp':>7s} {'code':>6s} "
      f"{'resid':>7s} {'total':>7s}  fits  {'GFLOP':>9s} {'GB acc':>8s} "
      f"{'bound ms':>9s} x calls",
  ]
  for r in result['programs']:
    lines.append(
        f"{r['name']:16s} {compiler.gib(r['argument_bytes']):>7s} "
        f"{compiler.gib(r['output_bytes'] - r['alias_bytes']):>7s} "
        f"{compiler.gib(r['temp_bytes']):>7s} "
        f"{compiler.gib(r['code_bytes']):>6s} "
        f"{compiler.gib(r['resident_bytes']):>7s} "
        f"{compiler.gib(r['total_bytes']):>7s}  "
        f"{_fits_cell(r)}  {r['flops'] / 1e9:9.1f} "
        f"{r['bytes_accessed'] / 1e9:8.2f} {r['time_bound_s'] * 1e3:9.2f} "
        f"x {r['calls_per_step']:g}"
    )
  lines += _bound_lines(result)
  moe = result.get('moe')
  if moe:
    lines.append(
        f"MoE: {moe['moe_layers']} layers, top {moe['top_k']} of "
        f"{moe['num_experts']} experts, {moe['routing']}. Per token and "
        f"layer (counted from the config): router "
        f"{moe['router_flops'] / 1e6:.3g} MFLOP = "
        f"{100 * moe['router_share']:.2f}% of the routed experts' "
        f"{moe['expert_flops'] / 1e6:.3g} MFLOP"
        + (f" (+{moe['expert_lora_flops'] / 1e6:.3g} for their LoRA)"
           if moe['expert_lora_flops'] else '')
        + f"; the dispatch copies {moe['dispatch_elements']} activations "
        '(k x D to the experts and back).')
  for r in result['programs']:
    if r.get('function') == programs_lib.EPISODE_DECODE:
      agent = result['config']
      source = (f"agent.environment={agent['agent_environment']!r}"
                if agent.get('agent_environment')
                else f"agent.tools={agent.get('agent_tools')!r}")
      lines.append(
          f"{r['name']} is the episode decode loop "
          f'({programs_lib.EPISODE_DECODE}, {source}): forced tokens and '
          'turn ends, one program for every turn; compiled without its '
          'pause-token check (no vocabulary read).')
  for r in result['programs']:
    if r.get('killed'):
      lines.append(f"KILLED: {r['name']} was {r['error']}. Fixes: "
                   + '; '.join(r['fixes']) + '.')
    elif not r['fits']:
      lines.append(
          f"DOES NOT FIT: {r['name']} needs "
          f"{compiler.gib(r['total_bytes'])} GiB per "
          f"chip, {compiler.gib(r['bytes_over'])} GiB over the "
          f"{compiler.gib(topo['usable_hbm_bytes'])} GiB usable"
          + (f" (the compiler: {r['error'].rstrip('.')})" if r['error']
             else '')
          + '. Fixes: ' + '; '.join(r['fixes']) + '.'
      )
  if result['skipped']:
    lines.append(f"Not compiled after that: {', '.join(result['skipped'])} "
                 '(--keep_going compiles them too).')
  lines.append(verdict(result))
  return '\n'.join(lines)


def _bound_lines(result):
  """Each program against its floor, the step bound and tunix's."""
  lines = []
  for r in result['programs']:
    if r.get('min_ratio'):
      lines.append(
          f"{r['name']}: {r['bytes_accessed'] / 1e9:.3f} GB per call, "
          f"{r['min_ratio']:.2f}x its analytic minimum "
          f"{r['analytic_min_bytes'] / 1e9:.3f} GB ("
          + ', '.join(f'{k} {v / 1e9:.3f}'
                      for k, v in r['analytic_terms'].items()) + ')')
  lines.append(
      f"Step time lower bound: {result['step_time_bound_s']:.3f} s "
      '(a bound from flops and bytes, not a measurement)'
  )
  side = result.get('tunix') or {}
  if side.get('step_time_bound_s'):
    ratio = result['step_time_bound_s'] / side['step_time_bound_s']
    lines.append(
        f"tunix's step, compiled alike: {side['step_time_bound_s']:.3f} s; "
        f'ours is {ratio:.2f}x of it (the tunix section of the JSON)')
  elif side.get('why_not'):
    lines.append(f"tunix's step not compiled: {side['why_not']}")
  return lines


def format_breakdown(result, top=8):
  """Where each program's bytes go: categories and its top instructions."""
  lines = []
  for r in result['programs']:
    b = r.get('breakdown') or {}
    if not b:
      continue
    per = '' if r['calls_per_step'] <= 1 else ' (whole loop, all trips)'
    lines.append(f"{r['name']}: {b['hlo_bytes'] / 1e9:.3f} GB, "
                 f"{b['hlo_flops'] / 1e12:.3f} TFLOP{per}")
    for name, c in b['categories'].items():
      lines.append(f"  {name:16s} {c['bytes'] / 1e9:10.3f} GB "
                   f"{c['flops'] / 1e12:9.3f} TFLOP")
    for c in b['top'][:top]:
      lines.append(f"    {c['bytes'] / 1e9:8.3f} GB x{c['trips']:g} "
                   f"{c['opcode']} {c['category']}: {c['op_name'][-70:]}")
    if b.get('custom_calls'):
      lines.append('  custom calls (not counted inside): '
                   + ', '.join(b['custom_calls']))
  cal = result.get('calibration') or {}
  for name, c in cal.items():
    lines.append(f"calibration {name}: known {c['known']} bytes; HLO count "
                 f"{c['hlo_ratio']:.3f}x, XLA cost_analysis "
                 f"{c['compiler_ratio']:.3f}x")
  return '\n'.join(lines)


def _fits_cell(row):
  if row.get('killed'):
    return 'kill'
  return 'yes ' if row['fits'] else 'NO  '


def verdict(result):
  """'FITS', 'DOES NOT FIT', or 'NOT KNOWN' when the kernel killed a compile.

  A program that does not fit decides; a killed one leaves the answer open.
  """
  if result['fits']:
    return 'FITS'
  if any(not r['fits'] and not r.get('killed') for r in result['programs']):
    return 'DOES NOT FIT'
  return ('NOT KNOWN: the kernel killed a compile (host memory); see KILLED '
          'above')


def summary_table(reports):
  """A Markdown table of several reports: one row per (config, slice).

  Args:
    reports: report dicts (as `run` returns or --output writes).

  Returns:
    The table as text.
  """
  lines = [
      '| model | slice | chips (hosts) | largest program | GiB per chip '
      '| fits | step time bound |',
      '| --- | --- | --- | --- | --- | --- | --- |',
  ]
  for r in reports:
    topo = r['topology']
    compiled = [p for p in r['programs'] if p['fits']]
    misfits = [p['name'] for p in r['programs']
               if not p['fits'] and not p.get('killed')]
    killed = [p['name'] for p in r['programs'] if p.get('killed')]
    if r['fits']:
      fits = 'yes'
    elif misfits:
      fits = 'no: ' + ', '.join(misfits)
    else:
      fits = 'not known: ' + ', '.join(killed) + ' killed (host RAM)'
    bound = (f"{r['step_time_bound_s']:.3g} s" if r['fits'] and compiled
             else '-')
    lines.append(
        f"| {r['config']['preset']} | {topo['name']} | {topo['chips']} "
        f"({topo['hosts']}) | {r['largest_program']} | "
        f"{compiler.gib(r['largest_total_bytes'])} of "
        f"{compiler.gib(topo['usable_hbm_bytes'])} | {fits} | {bound} |"
    )
  return '\n'.join(lines)
