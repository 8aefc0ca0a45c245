r"""Trains a grid of runs one after another and compares their evaluations.

  python -m agent_tunix.sweep --config=configs/tiny.py --workdir=/tmp/sweep \
      --sweep=optimizer.learning_rate=1e-4,1e-3 [--sweep=grpo.beta=0,0.04] \
      [--config.training.num_steps=20 ...]

The grid is the cartesian product of the --sweep flags (`FIELD=V1,V2,...`,
one flag per config field); the --config.* overrides apply to every run.
Each point trains in `WORKDIR/<name>/` (e.g. `learning_rate=0.0001,beta=0.04`)
as `python -m agent_tunix.main --workdir=WORKDIR/<name>` would; a rerun
skips finished runs and resumes the others. The table of final
evaluations is printed and written to WORKDIR/sweep.md and
WORKDIR/sweep.json. Exit status 1 when a run failed, 2 for a bad flag or
config (one line naming it and the fix).

Layer: commands; may import any layer of agent_tunix.
Design notes: docs/sweeps.md.
"""

import copy
import dataclasses
import difflib
import itertools
import json
import math
import re
import shlex
import sys
import time

from absl import app
from absl import flags
from absl import logging
import ml_collections

from agent_tunix import cli
from agent_tunix import plot
from agent_tunix import storage
from agent_tunix.config import validation
from agent_tunix.data import opening
from agent_tunix.observe import metrics
from agent_tunix.run import checkpoint
from agent_tunix.run import errors

JSON_FILE = 'sweep.json'
TABLE_FILE = 'sweep.md'
# Longest run directory name (file systems allow 255 bytes).
MAX_NAME = 200
_UNSAFE = re.compile(r'[^A-Za-z0-9._+-]')
_TYPES = {bool: 'boolean (true or false)', int: 'integer', float: 'number',
          str: 'text'}
# Eval metrics shown in the table: (column, tag without 'eval/').
_COLUMNS = (('accuracy', 'accuracy'), ('format accuracy', 'format_accuracy'),
            ('pass@k', 'pass_at_k'))


class SweepError(validation.ConfigError):
  """A --sweep flag that cannot be run."""


@dataclasses.dataclass(frozen=True)
class Axis:
  """One --sweep flag: a config field and the values it takes."""

  field: str
  values: tuple


@dataclasses.dataclass
class Point:
  """One run of the grid."""

  name: str
  values: dict  # {field: value}
  workdir: str
  config: ml_collections.ConfigDict


def _fields(config):
  return sorted(metrics.flatten_config(config))


def _lookup(config, field, spec):
  """The current value of config.<field>; SweepError if there is none."""
  node = config
  for depth, part in enumerate(field.split('.')):
    if not hasattr(node, 'keys') or part not in node.keys():
      close = difflib.get_close_matches(field, _fields(config), n=3)
      hint = (f'did you mean {" or ".join(close)}?' if close else
              'see --print_config of agent_tunix.main for the fields.')
      where = '.'.join(field.split('.')[:depth]) or 'the config'
      raise SweepError(
          f'--sweep={spec}: config.{field} does not exist ({where} has no '
          f'{part!r}); {hint}'
      )
    node = node[part]
  if hasattr(node, 'keys'):
    raise SweepError(
        f'--sweep={spec}: config.{field} is a section, not a field; name one '
        f'of its fields, e.g. {field}.{sorted(node.keys())[0]}.'
    )
  return node


def parse_value(field, text, current, spec):
  """Parses `text` as a value of the type of config.<field>'s `current`."""
  kind = type(current)
  if kind not in _TYPES:
    raise SweepError(
        f'--sweep={spec}: config.{field} holds a {kind.__name__} '
        f'({current!r}); only boolean, integer, number and text fields can '
        'be swept. Run one sweep per value with --config.'
        f'{field}=... instead.'
    )
  try:
    if kind is bool:
      lower = text.lower()
      if lower not in ('true', 'false'):
        raise ValueError(text)
      return lower == 'true'
    if kind is float:
      value = float(text)
      if not math.isfinite(value):
        raise ValueError(text)
      return value
    return kind(text)
  except ValueError:
    raise SweepError(
        f'--sweep={spec}: {text!r} is not a valid {_TYPES[kind]} for '
        f'config.{field} (now {current!r}); give {_TYPES[kind]} values.'
    ) from None


def parse_sweep(spec, config):
  """Parses one --sweep flag, `FIELD=V1,V2,...`, into an Axis."""
  field, equals, listed = spec.partition('=')
  field = field.strip()
  if field.startswith('config.'):
    field = field[len('config.'):]
  if not equals or not field:
    raise SweepError(
        f'--sweep={spec}: expected FIELD=V1,V2,... (e.g. '
        '--sweep=optimizer.learning_rate=1e-5,3e-5).'
    )
  current = _lookup(config, field, spec)
  texts = [t.strip() for t in listed.split(',')]
  if not listed.strip() or any(not t for t in texts):
    raise SweepError(
        f'--sweep={spec}: {"no" if not listed.strip() else "an empty"} '
        f'value for config.{field}; list one or more values separated by '
        f"',' (e.g. --sweep={field}={current})."
    )
  values = []
  for text in texts:
    value = parse_value(field, text, current, spec)
    if value in values:
      raise SweepError(
          f'--sweep={spec}: {text!r} gives config.{field}={value!r}, listed '
          'already; list each value once.'
      )
    values.append(value)
  return Axis(field, tuple(values))


def parse_sweeps(specs, config, overrides=()):
  """The axes of the grid from the --sweep flags.

  Args:
    specs: the --sweep flag values, `FIELD=V1,V2,...` each.
    config: the config the sweep starts from (with --config.* applied).
    overrides: the fields given as --config.* flags.

  Raises:
    SweepError: naming the bad flag or value and the fix.
  """
  if not specs:
    raise SweepError(
        'No --sweep flag: give at least one, e.g. '
        '--sweep=optimizer.learning_rate=1e-5,3e-5.'
    )
  axes = []
  for spec in specs:
    axis = parse_sweep(spec, config)
    if any(a.field == axis.field for a in axes):
      raise SweepError(
          f'config.{axis.field} is swept by two --sweep flags; list all its '
          f'values in one: --sweep={axis.field}=V1,V2,...'
      )
    if axis.field in overrides:
      raise SweepError(
          f'config.{axis.field} is given both as --sweep={spec} and as '
          f'--config.{axis.field}={overrides[axis.field]}; drop one of them.'
      )
    axes.append(axis)
  return axes


def format_value(value):
  """A value as a --config flag takes it (floats as short as Python writes
  them, their exponent without leading zeros: 3e-06 -> 3e-6)."""
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, float):
    text = repr(value)
    if 'e' in text:
      mantissa, exponent = text.split('e')
      text = f'{mantissa}e{int(exponent)}'
    return text
  if isinstance(value, (tuple, list)):
    return repr(tuple(value))
  return str(value)


def _short_names(axes):
  """{field: name in run names}: the last part unless two axes share it."""
  last = [a.field.rsplit('.', 1)[-1] for a in axes]
  return {a.field: (short if last.count(short) == 1 else a.field)
          for a, short in zip(axes, last)}


def run_name(values, axes):
  """The directory name of the point with `values` ({field: value})."""
  short = _short_names(axes)
  return ','.join(
      f'{short[a.field]}={_UNSAFE.sub("_", format_value(values[a.field]))}'
      for a in axes)


def grid(config, workdir, axes):
  """Every point of the grid, the last axis changing fastest.

  Raises:
    SweepError: two points would share a directory, or a name is too long.
  """
  points = []
  seen = {}
  for combo in itertools.product(*(a.values for a in axes)):
    values = {a.field: v for a, v in zip(axes, combo)}
    name = run_name(values, axes)
    if name in seen:
      raise SweepError(
          f'The values {seen[name]} and {values} both name the run '
          f'directory {name!r} (characters other than letters, digits and '
          "'._+-' become '_'); make the text values differ in those "
          'characters.'
      )
    if len(name.encode()) > MAX_NAME:
      raise SweepError(
          f'The run directory name {name[:60]!r}... is longer than '
          f'{MAX_NAME} bytes; sweep fewer fields or shorter values.'
      )
    seen[name] = values
    point_config = copy.deepcopy(config)
    for field, value in values.items():
      *parents, last = field.split('.')
      node = point_config
      for part in parents:
        node = node[part]
      node[last] = value
    points.append(Point(name, values, f'{workdir.rstrip("/")}/{name}',
                        point_config))
  return points


def run_state(workdir, num_steps):
  """What a run directory holds: checkpoints, evaluations, finished or not.

  Returns:
    {'step': the latest checkpoint step (0 if none), 'evals': {step:
    {metric: value}} of every evaluation in the event files (metric without
    'eval/'), 'finished': a checkpoint at num_steps or later whose step was
    evaluated}.
  """
  steps = checkpoint.steps_on_disk(workdir)
  try:
    scalars = plot.read_scalars(workdir)
  except FileNotFoundError:
    scalars = {}
  evals = {}
  for tag, series in scalars.items():
    if tag.startswith('eval/'):
      for step, value in series.items():
        evals.setdefault(step, {})[tag[len('eval/'):]] = value
  last = steps[-1] if steps else 0
  finished = bool(steps) and last >= num_steps and 'accuracy' in evals.get(
      last, {})
  return {'step': last, 'evals': evals, 'finished': finished}


def summarize(point, status=None, error=None):
  """The run's row of the comparison (JSON-ready).

  Args:
    point: the run, from `grid`.
    status: what became of an unfinished run ('failed', 'running
      elsewhere', 'stopped'); None: 'stopped at step N' when it has a
      checkpoint, else 'not started'. A finished run is 'finished'.
    error: the error of a failed run.
  """
  num_steps = point.config.training.num_steps
  state = run_state(point.workdir, num_steps)
  if status is None:
    status = (f'stopped at step {state["step"]}' if state['step'] else
              'not started')
  evals = state['evals']
  scored = {s: e['accuracy'] for s, e in evals.items() if 'accuracy' in e}
  if state['finished']:
    eval_step = state['step']
  else:  # The latest evaluation so far.
    eval_step = max(scored) if scored else None
  best = (min(scored, key=lambda s: (-scored[s], s)) if scored else None)
  row = {
      'name': point.name,
      'workdir': point.workdir,
      'values': point.values,
      'status': 'finished' if state['finished'] else status,
      'step': state['step'],
      'num_steps': num_steps,
      'eval_step': eval_step,
      'eval': evals.get(eval_step, {}),
      'best_step': best,
      'best_accuracy': scored.get(best),
  }
  if error:
    row['error'] = error
  return row


def _with_stderr(metrics_at, name):
  if name not in metrics_at:
    return ''
  text = f'{metrics_at[name]:.3f}'
  if f'{name}_stderr' in metrics_at:
    text += f' ± {metrics_at[name + "_stderr"]:.3f}'
  return text


def format_table(rows):
  """The rows as a Markdown table."""
  columns = [(label, tag) for label, tag in _COLUMNS
             if any(tag in r['eval'] for r in rows)]
  header = (['run', 'status', 'step', 'eval step'] +
            [label for label, _ in columns] + ['best step (accuracy)'])
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '|'.join('---' for _ in header) + '|']
  for r in rows:
    best = ('' if r['best_step'] is None else
            f'{r["best_step"]} ({r["best_accuracy"]:.3f})')
    cells = ([r['name'], r['status'], f'{r["step"]}/{r["num_steps"]}',
              '' if r['eval_step'] is None else str(r['eval_step'])] +
             [_with_stderr(r['eval'], tag) for _, tag in columns] + [best])
    lines.append('| ' + ' | '.join(c.replace('|', '/') for c in cells)
                 + ' |')
  return '\n'.join(lines)


def write_summary(workdir, rows, description):
  """Writes WORKDIR/sweep.json and WORKDIR/sweep.md; returns the table."""
  table = format_table(rows)
  failed = [r for r in rows if 'error' in r]
  notes = ''.join(f'\n- {r["name"]}: {r["error"]}' for r in failed)
  root = storage.path(workdir)
  root.mkdir(parents=True, exist_ok=True)
  stamp = time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())
  (root / TABLE_FILE).write_text(
      f'# Sweep {description}\n\n{stamp}. TensorBoard: tensorboard '
      f'--logdir={workdir}\n\n{table}\n' + (f'\nErrors:{notes}\n'
                                             if notes else ''))
  (root / JSON_FILE).write_text(json.dumps(
      {'sweep': description, 'written': stamp, 'runs': rows}, indent=1) + '\n')
  return table


def point_args(point, config_filename, overrides):
  """The --config, --workdir and --config.* flags that train `point` with
  agent_tunix.main (or launch/run.sh), shell-quoted on one line."""
  args = [f'--config={config_filename}', f'--workdir={point.workdir}']
  args += [f'--config.{f}={format_value(v)}' for f, v in overrides.items()]
  args += [f'--config.{f}={format_value(v)}' for f, v in point.values.items()]
  return ' '.join(shlex.quote(a) for a in args)


def run(points, train=True, say=print):
  """Trains the points that are not finished (if `train`); returns the rows.

  Args:
    points: from `grid`.
    train: False only reads what the run directories hold.
    say: prints one progress line.

  Raises:
    validation.ConfigError: a point's config is invalid (checked for every
      point before any run trains), or a run refuses the config it was
      trained with (run_config).
  """
  if train:
    for point in points:
      validation.validate(point.config, workdir=point.workdir)
    # Each distinct data section opens once, before any point trains.
    for config in {p.config.data.to_json(sort_keys=True): p.config
                 for p in points}.values():
      opening.exit_on_error(config)
    # pylint: disable=g-import-not-at-top
    from agent_tunix import rewards
    from agent_tunix.run import divergence
    from agent_tunix.run import lock as run_lock
    from agent_tunix.run import train as train_lib
    # pylint: enable=g-import-not-at-top
    failures = (divergence.DivergenceError, FloatingPointError,
                rewards.RewardError, checkpoint.RestoreError)
  statuses, errors_of = {}, {}
  for i, point in enumerate(points):
    num_steps = point.config.training.num_steps
    state = run_state(point.workdir, num_steps)
    where = f'[{i + 1}/{len(points)}] {point.name}'
    if state['finished']:
      say(f'{where}: finished at step {state["step"]}'
          + ('; skipped.' if train else '.'))
      continue
    if not train:
      continue
    if state['step']:
      say(f'{where}: resuming from step {state["step"]} of {num_steps}.')
    else:
      say(f'{where}: training {num_steps} steps.')
    try:
      result = train_lib.train_and_evaluate(point.config, point.workdir)
    except run_lock.LockedError as e:
      say(f'{where}: running elsewhere; skipped ({e}).')
      statuses[point.name] = 'running elsewhere'
      continue
    except failures as e:
      say(f'{where}: failed: {e}')
      statuses[point.name] = 'failed'
      errors_of[point.name] = str(e)
      continue
    if result['preempted']:
      say(f'{where}: stopped at step {result["step"]}; rerun the same '
          'command to go on.')
      break
    if result.get('alarms'):
      names = ', '.join(result['alarms'])
      say(f'{where}: stopped at step {result["step"]} by alarm {names} '
          '(training.stop_on_alarm); the sweep goes on.')
      statuses[point.name] = f'stopped by alarm {names}'
      continue
    if result['step'] < num_steps:
      say(f'{where}: out of data at step {result["step"]} of {num_steps}; '
          'raise data.num_epochs to train further.')
      statuses[point.name] = f'out of data at step {result["step"]}'
      continue
    say(f'{where}: finished at step {result["step"]}.')
  return [summarize(p, statuses.get(p.name), errors_of.get(p.name))
          for p in points]


def _define_flags():
  """The command-line flags, defined only when this module is the program
  (the test suite imports other CLIs that define --config too)."""
  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags
  # pylint: enable=g-import-not-at-top
  config_flags.DEFINE_config_file(
      'config', None, 'Config file (a get_config() module); --config.x.y=v '
      'overrides apply to every run.', lock_config=True)
  flags.DEFINE_string(
      'workdir', None, 'Sweep directory (local or gs://): each run trains in '
      'WORKDIR/<name>; the table goes to WORKDIR/sweep.md and sweep.json.')
  flags.DEFINE_multi_string(
      'sweep', None, 'FIELD=V1,V2,...: a config field and its values '
      '(no commas inside a value); repeat for more fields, the grid is the '
      'product. A run is named field=value,... (the last part of the '
      "field's name, the whole name where two fields end alike; a float's "
      "value as Python writes it, exponent without leading zeros; in text "
      "other characters than letters, digits and '._+-' become '_'), e.g. "
      'learning_rate=0.0001,beta=0.04.')
  flags.DEFINE_bool(
      'summarize_only', False, 'Train nothing: read the run directories '
      '(e.g. trained by launch/run.sh on several TPU VMs) and write the '
      'table.')
  flags.DEFINE_bool(
      'print_points', False, 'Train nothing: print, one line per run, the '
      '--config, --workdir and --config.* flags that train it with '
      'agent_tunix.main or launch/run.sh (shell-quoted).')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags
  # pylint: enable=g-import-not-at-top
  fv = flags.FLAGS
  if not fv.workdir:
    raise app.UsageError('--workdir is required (local path or gs://).')
  if fv.summarize_only and fv.print_points:
    raise app.UsageError('Pass one of --summarize_only and --print_points.')
  config = fv.config
  overrides = config_flags.get_override_values(fv['config'])
  axes = parse_sweeps(fv.sweep or [], config, overrides)
  points = grid(config, fv.workdir, axes)
  if fv.print_points:
    filename = config_flags.get_config_filename(fv['config'])
    for point in points:
      print(point_args(point, filename, overrides))
    return
  rows = run(points, train=not fv.summarize_only)
  description = ' '.join(f'--sweep={a.field}='
                         + ','.join(format_value(v) for v in a.values)
                         for a in axes)
  table = write_summary(fv.workdir, rows, description)
  print(table)
  print(f'Written to {fv.workdir.rstrip("/")}/{TABLE_FILE} and {JSON_FILE}; '
        f'compare the curves with: tensorboard --logdir={fv.workdir}')
  failed = [r['name'] for r in rows if r['status'] == 'failed']
  if failed:
    sys.exit(f'error: {len(failed)} run(s) failed: {", ".join(failed)} '
             f'(see {TABLE_FILE}).')


if __name__ == '__main__':
  _define_flags()
  flags.mark_flags_as_required(['config', 'workdir'])
  cli.run(errors.cli(main))
