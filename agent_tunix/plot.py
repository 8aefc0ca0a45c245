r"""Draws a run's training curves from its TensorBoard event files.

  python -m agent_tunix.plot --workdir=/tmp/run --output=/tmp/run.png

One PNG with a panel each for the reward (the weighted total and every
reward function), eval accuracy and format accuracy (error bars: +- 1.96
standard errors, when logged), completion length, KL and entropy, against
the training step. The workdir may be local or gs://. Where a run resumed
and wrote a step again, the later event file wins.
"""

import collections
import io
import sys

from absl import app
from absl import flags
from matplotlib import figure
from matplotlib import ticker

from agent_tunix import cli
from agent_tunix import storage
from agent_tunix.observe import events


def _define_flags():
  """The command-line flags, defined only when this module is the program
  (other CLIs imported in the same process define --workdir too)."""
  flags.DEFINE_string(
      'workdir', None, 'Run directory holding the TensorBoard event files.'
  )
  flags.DEFINE_string('output', None, 'PNG file to write (local or gs://).')

EVENT_GLOB = events.EVENT_GLOB

# (panel title, y label, [(series label, tag)]); the reward panel adds one
# series per 'reward/<fn>/mean' tag found.
PANELS = (
    ('Reward', 'reward (mean over completions)',
     [('total', 'reward/mean')]),
    ('Eval accuracy', 'fraction of held-out questions',
     [('accuracy', 'eval/accuracy'),
      ('format accuracy', 'eval/format_accuracy')]),
    ('Completion length', 'tokens', [('mean', 'completion/mean_length')]),
    ('KL to the reference', 'per token', [('kl', 'kl')]),
    ('Entropy', 'nats per token', [('entropy', 'entropy')]),
)


def read_scalars(workdir):
  """{tag: {step: value}} of every scalar in workdir's event files.

  Args:
    workdir: the run directory (local or gs://).

  Returns:
    The scalars; event files are read in the order they were created (the
    second and then the writer number in each name), so a step written
    again by a resumed run takes the later value.

  Raises:
    FileNotFoundError: workdir has no event files.
  """
  if not events.event_files(workdir):
    raise FileNotFoundError(
        f'No TensorBoard event files ({EVENT_GLOB}) in --workdir={workdir!r}. '
        'Pass the --workdir of a training run (agent_tunix.main writes them '
        'there).'
    )
  return events.read_scalars(workdir)


def _series(scalars, tag):
  """(steps, values) of a tag, in step order."""
  steps = sorted(scalars[tag])
  return steps, [scalars[tag][s] for s in steps]


def panel_series(scalars):
  """{panel title: {series label: (steps, values)}}, only what was logged."""
  panels = {}
  for title, _, series in PANELS:
    if title == 'Reward':
      series = series + [
          (tag[len('reward/'):-len('/mean')], tag) for tag in sorted(scalars)
          if tag.startswith('reward/') and tag.endswith('/mean')
          and tag != 'reward/mean'
      ]
    panels[title] = {
        label: _series(scalars, tag) for label, tag in series
        if tag in scalars
    }
  return panels


def plot(workdir, output):
  """Draws workdir's curves into the PNG `output`.

  Args:
    workdir: the run directory (local or gs://).
    output: the PNG path (local or gs://).

  Returns:
    What was drawn: {panel title: {series label: (steps, values)}}; a panel
    whose metrics were not logged (KL when grpo.beta = 0) is empty and says
    so in the image.

  Raises:
    FileNotFoundError: workdir has no event files.
    ValueError: the event files hold none of the plotted metrics.
  """
  scalars = read_scalars(workdir)
  panels = panel_series(scalars)
  if not any(panels.values()):
    raise ValueError(
        f'The event files in --workdir={workdir!r} hold none of the plotted '
        f'metrics ({", ".join(t for _, _, s in PANELS for _, t in s)}); is '
        'it the workdir of an agent_tunix training run?'
    )
  fig = figure.Figure(figsize=(15, 8), layout='constrained')
  axes = fig.subplots(2, 3).ravel()
  for ax, (title, ylabel, _) in zip(axes, PANELS):
    ax.set_title(title)
    ax.set_xlabel('step')
    ax.set_ylabel(ylabel)
    drawn = panels[title]
    if not drawn:
      ax.text(0.5, 0.5, 'not logged', ha='center', va='center',
              transform=ax.transAxes)
      continue
    for label, (steps, values) in drawn.items():
      errors = _eval_errors(scalars, title, label, steps)
      if errors is None:
        ax.plot(steps, values, label=label,
                marker='o' if len(steps) < 30 else None)
      else:
        ax.errorbar(steps, values, yerr=errors, label=label, marker='o',
                    capsize=3)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if len(drawn) > 1:
      ax.legend(fontsize='small')
  axes[-1].set_visible(False)
  fig.suptitle(workdir)
  buf = io.BytesIO()
  fig.savefig(buf, format='png', dpi=80)
  storage.write_bytes(output, buf.getvalue())
  return panels


def _eval_errors(scalars, title, label, steps):
  """1.96 x the logged standard errors of an eval series, or None."""
  if title != 'Eval accuracy':
    return None
  tag = 'eval/' + label.replace(' ', '_') + '_stderr'
  if tag not in scalars or any(s not in scalars[tag] for s in steps):
    return None
  return [1.96 * scalars[tag][s] for s in steps]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  workdir, output = flags.FLAGS.workdir, flags.FLAGS.output
  try:
    panels = plot(workdir, output)
  except (FileNotFoundError, ValueError) as e:
    sys.exit(f'error: {e}')
  drawn = sum(len(p) for p in panels.values())
  print(f'Wrote {output}: {drawn} curves from {workdir}')


if __name__ == '__main__':
  _define_flags()
  flags.mark_flags_as_required(['workdir', 'output'])
  cli.run(main)
