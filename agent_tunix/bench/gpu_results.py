r"""results.json and results.md of the GPU check, written after every stage.

  python -m agent_tunix.bench.gpu_results --out=DIR --stage=smoke \
      --status=error --reason='...'
  python -m agent_tunix.bench.gpu_results --out=DIR --finish=grpo,decode

Layer: commands (bench), but standard library only: launch/gpu_check.sh
calls this to record a stage its Python process could not (killed at its
time limit, a failed smoke test) without paying for the trainer's imports.

`record`, `start`, `update` and `finish` rewrite both files; `load` reads
results.json (`HEADLINE` fields stay null until their stage has run).

The fields of results.json: docs/benchmarks.md, 'results.json'.
"""

import json
import os
import sys
import time

HEADLINE = (
    'device', 'platform', 'jax_version', 'shapes', 'grpo_step_s',
    'rollout_s', 'update_s', 'compile_s', 'tokens_per_s',
    'decode_tokens_per_s', 'decode_bound_fraction', 'update_mfu',
    'tunix_step_s', 'step_ratio_vs_tunix', 'big_step_s',
)
STATUSES = ('ok', 'error', 'timeout', 'skipped')
JSON_NAME = 'results.json'
MARKDOWN_NAME = 'results.md'


def load(out):
  """The results so far in directory `out` (an empty record if none)."""
  path = os.path.join(out, JSON_NAME)
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  results = {key: None for key in HEADLINE}
  results['stages'] = {}
  results['running'] = None
  return results


def _write_atomically(path, text):
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    f.write(text)
  os.replace(tmp, path)


def save(out, results):
  """Writes results.json and results.md into `out`."""
  os.makedirs(out, exist_ok=True)
  _write_atomically(os.path.join(out, JSON_NAME),
                    json.dumps(results, indent=2, default=str) + '\n')
  _write_atomically(os.path.join(out, MARKDOWN_NAME), markdown(results))


def record(out, stage, status, seconds=None, reason=None, fields=None,
           **details):
  """Adds one stage's outcome (and headline `fields`) to the results."""
  if status not in STATUSES:
    raise ValueError(f'status={status!r}: expected one of {STATUSES}.')
  results = load(out)
  entry = {'status': status, 'seconds': seconds, 'reason': reason}
  entry.update(details)
  results['stages'][stage] = entry
  results['running'] = None
  for key, value in (fields or {}).items():
    results[key] = value
  save(out, results)
  return results


def update(out, fields):
  """Sets headline (or other top-level) fields before a stage has ended."""
  results = load(out)
  results.update(fields)
  save(out, results)


def start(out, stage):
  """Marks `stage` as under way (its entry, if any, is dropped)."""
  results = load(out)
  results['stages'].pop(stage, None)
  results['running'] = stage
  save(out, results)


def finish(out, stages):
  """Records each of `stages` without an outcome as skipped."""
  results = load(out)
  for stage in stages:
    if stage not in results['stages']:
      results['stages'][stage] = {
          'status': 'skipped', 'seconds': 0.0,
          'reason': 'not reached before the deadline'}
  results['running'] = None
  save(out, results)
  return results


def _cell(value):
  if value is None:
    return '-'
  if isinstance(value, float):
    return f'{value:.4g}'
  return str(value).replace('|', '/').replace('\n', ' ')


def markdown(results):
  """The headline and per-stage tables, as Markdown."""
  lines = ['| field | value |', '|---|---|']
  for key in HEADLINE:
    lines.append(f'| {key} | {_cell(results.get(key))} |')
  lines += ['', '| stage | status | seconds | reason |', '|---|---|---|---|']
  for stage, entry in results.get('stages', {}).items():
    reason = entry.get('reason') or ''
    if len(reason) > 160:
      reason = reason[:157] + '...'
    lines.append(f"| {stage} | {entry['status']} | "
                 f"{_cell(entry.get('seconds'))} | {_cell(reason)} |")
  return '\n'.join(lines) + '\n'


def main(argv):
  args = dict(a[2:].split('=', 1) for a in argv[1:]
              if a.startswith('--') and '=' in a)
  unknown = set(args) - {'out', 'stage', 'status', 'reason', 'seconds',
                         'finish'}
  if 'out' in args and 'finish' in args and not unknown:
    finish(args['out'], [s for s in args['finish'].split(',') if s])
    return 0
  if unknown or not {'out', 'stage', 'status'} <= set(args):
    print('usage: python -m agent_tunix.bench.gpu_results --out=DIR '
          '(--stage=NAME --status=STATUS [--reason=TEXT] [--seconds=S] | '
          '--finish=STAGE,...)', file=sys.stderr)
    return 2
  seconds = float(args['seconds']) if 'seconds' in args else None
  record(args['out'], args['stage'], args['status'], seconds,
         args.get('reason'), recorded_at=time.time())
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
