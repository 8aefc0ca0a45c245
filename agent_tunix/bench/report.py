"""The bench's goals (judged from the measurements) and its printed table."""

import sys


def goals(measurements):
  by_name = {m['name']: m for m in measurements}
  out = {}
  tun = by_name.get('grpo_step_vs_tunix')
  ratio = tun['ratio'] if tun else None
  out['grpo_step_le_0.75x_tunix'] = {
      'target': 'ours.median_s / tunix.median_s <= 0.75',
      'value': ratio,
      'met': None if ratio is None else ratio <= 0.75,
      'note': 'same workload, same machine, one run',
  }
  fractions = {
      m['settings']['batch_size']: m['ours']['fraction_of_bound']
      for m in measurements
      if m['name'].startswith('decode_batch_') and m['ours']
  }
  met_at = sorted(b for b, f in fractions.items() if f >= 0.7)
  out['decode_ge_0.7_of_bandwidth_bound'] = {
      'target': 'decode tokens/s >= 0.7 x bandwidth bound',
      # The smallest fraction: the goal holds at every batch size iff it
      # holds at this one.
      'value': min(fractions.values()) if fractions else None,
      'met': None if not fractions else len(met_at) == len(fractions),
      'note': None if not fractions else (
          f'fraction by batch size: '
          f'{ {b: round(f, 3) for b, f in fractions.items()} }; met at '
          f'batch sizes {met_at}'),
  }
  episode = by_name.get('episode_rollout')
  ours = episode['ours'] if episode and episode['ours'] else None
  value = ours['slowdown'] if ours else None
  out['episode_rollout_le_1.3x_single_turn'] = {
      'target': 'single-turn tokens/s / multi-turn tokens/s <= 1.3 (on '
                'CPU), every column counted',
      'value': value,
      'met': None if value is None else value <= 1.3,
      'note': None if not ours else (
          f"{episode['settings']['backend']}; "
          f"{episode['settings']['inserts']} inserts of "
          f"{episode['settings']['insert_tokens']} tokens per episode, "
          f"turns of {episode['settings']['turn_tokens']}; "
          f"{ours['decode_calls']} decode calls, host "
          f"{ours['host_median_s']:.4f} s, "
          f"{ours['decode_compiles']} compile(s) of the decode loop"),
  }
  mem = by_name.get('update_memory')
  ours = mem['ours'] if mem and mem['ours'] else None
  value = ours['peak_bytes_ratio'] if ours else None
  note = None
  if ours:
    note = (f"temp_bytes ratio {ours['temp_bytes_ratio']:.3f}; ours remat "
            f"{mem['settings']['remat']}, naive remat none")
    if 'peak_bytes_ratio_same_remat' in ours:
      note += (f"; against the naive update with our remat: peak "
               f"{ours['peak_bytes_ratio_same_remat']:.3f}, temp "
               f"{ours['temp_bytes_ratio_same_remat']:.3f}")
    note += f"; vocab {mem['settings']['vocab_size']}"
  out['update_memory_le_0.25_naive'] = {
      'target': 'ours.peak_bytes / naive.peak_bytes <= 0.25 (weights '
                'included)',
      'value': value,
      'met': None if value is None else value <= 0.25,
      'note': note,
  }
  return out


def _fmt(x, unit='s'):
  if x is None:
    return '-'
  if unit == 's':
    return f'{x:.3f}'
  return f'{x / 2**20:.1f}M'


def print_table(result):
  """Prints one row per measurement, then the goals and the machine."""
  lines = []
  header = (f'{"measurement":<22} {"status":<8} {"ours_s":>9} {"peer_s":>9} '
            f'{"ratio":>7}  details')
  lines.append(header)
  lines.append('-' * len(header))
  for m in result['measurements']:
    ours, peer = m['ours'] or {}, m['peer'] or {}
    lines.append(
        f"{m['name']:<22} {m['status']:<8} {_fmt(ours.get('median_s')):>9} "
        f"{_fmt(peer.get('median_s')):>9} "
        f"{'-' if m['ratio'] is None else format(m['ratio'], '.3f'):>7}  "
        + ' | '.join(_details(m, ours, peer))
    )
  lines.append('')
  for name, goal in result['goals'].items():
    met = {True: 'MET', False: 'NOT MET', None: 'not measured'}[goal['met']]
    value = '-' if goal['value'] is None else f"{goal['value']:.3f}"
    note = f'; {goal["note"]}' if goal.get('note') else ''
    lines.append(
        f'goal {name}: {met} (value {value}; {goal["target"]}{note})'
    )
  machine = result['machine']
  lines.append(
      f"machine: {machine['jax_backend']} {machine['device_kind']} x"
      f"{machine['device_count']}, {machine['cpu_count']} CPUs "
      f"({machine.get('cpu_model', 'unknown')}; ISA: "
      f"{' '.join(machine.get('cpu_isa') or ['-'])}), load "
      f"{machine['load_average']}"
  )
  sys.stdout.write('\n'.join(lines) + '\n')
  sys.stdout.flush()


def _details(m, ours, peer):
  """A measurement row's details column, as its ' | '-joined parts."""
  details = []
  for side, record in (('ours', ours), ('peer', peer)):
    if 'breakdown_s' in record:
      details.append(f'{side} ' + ', '.join(
          f'{k} {_fmt(v)}' for k, v in record['breakdown_s'].items()))
  if 'tokens_per_s' in ours and m['name'].startswith('grpo'):
    details.append(f"tok/s ours {ours['tokens_per_s']:.1f}" + (
        f", peer {peer['tokens_per_s']:.1f}" if peer else ''))
  if 'fraction_of_bound' in ours:
    details.append(
        f"{ours['tokens_per_s']:.1f} tok/s, bound "
        f"{peer['tokens_per_s']:.1f} tok/s, "
        f"{100 * ours['fraction_of_bound']:.1f}% of bound; roofline "
        f"{ours['roofline_tokens_per_s']:.1f} tok/s, "
        f"{100 * ours['fraction_of_roofline']:.1f}%; read-bandwidth "
        f"bound {ours['read_bound_tokens_per_s']:.1f} tok/s, "
        f"{100 * ours['fraction_of_read_bound']:.1f}%")
  if 'slowdown' in ours:
    details.append(
        f"multi-turn {ours['tokens_per_s']:.1f} tok/s vs one turn "
        f"{peer['tokens_per_s']:.1f} tok/s (x{ours['slowdown']:.3f}); "
        f"{ours['decode_calls']} decode calls, "
        f"{ours['decode_compiles']} compile(s) of the decode loop")
  if 'temp_bytes' in ours:
    details.extend(_memory_details(ours, peer))
  if 'step_time_bound_s' in ours:
    details.extend(_preflight_details(m['settings'], ours))
  if m['reason']:
    details.append(m['reason'])
  return details


def _memory_details(ours, peer):
  """The memory section's details: temp and peak bytes of both sides."""
  details = [
      f"temp {_fmt(ours['temp_bytes'], 'b')} vs "
      f"{_fmt(peer['temp_bytes'], 'b')} "
      f"({ours['temp_bytes_ratio']:.3f}); peak "
      f"{_fmt(ours['peak_bytes'], 'b')} vs "
      f"{_fmt(peer['peak_bytes'], 'b')} "
      f"({ours['peak_bytes_ratio']:.3f})"]
  same = peer.get('same_remat')
  if same:
    details.append(
        f"naive with remat {same['remat']}: temp "
        f"{_fmt(same['temp_bytes'], 'b')}, peak "
        f"{_fmt(same['peak_bytes'], 'b')}")
  return details


def _preflight_details(s, ours):
  """The TPU preflight section's details: the fit, then each program."""
  return [
      f"{s['topology']} ({s['tpu_topology']}, mesh "
      f"{dict(zip(s['mesh_axis_names'], s['mesh_shape']))}): largest "
      f"{ours['largest_program']} {_fmt(ours['largest_total_bytes'], 'b')}"
      f" per device of {_fmt(s['usable_hbm_bytes'], 'b')}, "
      f"{'fits' if ours['fits'] else 'DOES NOT FIT'}; step time bound "
      f"{ours['step_time_bound_s'] * 1e3:.3f} ms",
      ', '.join(
          f"{name} {_fmt(p['total_bytes'], 'b')} "
          f"{p['time_bound_s'] * 1e3:.3f} ms x{p['calls_per_step']}"
          for name, p in ours['programs'].items()),
  ]
