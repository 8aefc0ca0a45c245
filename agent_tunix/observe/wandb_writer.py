"""Weights & Biases as one more MetricWriter (optional).

With config.logging.wandb_project set, `metrics.create_writer` adds a
`WandbWriter` beside the TensorBoard writer on process 0, so the run's
scalars, sample texts and hyperparameters also go to W&B. wandb is not a
requirement of agent_tunix: it is imported only here, only when a project
is set, and config validation refuses a project when the package is
missing (before anything is built).

One W&B run per workdir: its id is written to `<workdir>/wandb_run_id` at
the first start and read back on a resume, which continues the same W&B
run (`resume='allow'`). W&B keeps a run's steps increasing, so steps that a
resume repeats (those after the checkpoint it resumes from) keep the values
first logged for them there, unlike TensorBoard, where the later write
shows. W&B's own settings apply as usual: WANDB_MODE=offline keeps the run
on disk (under WANDB_DIR, default ./wandb) for a later `wandb sync`.
"""

import html
import uuid

from absl import logging
import numpy as np

from agent_tunix import storage
from agent_tunix.config import validation
from agent_tunix.observe import writers

# File in the workdir holding the W&B run id (resumes continue that run).
RUN_ID_FILE = 'wandb_run_id'


def _number(value):
  """A Python number from a number or 0-d array."""
  value = np.asarray(value)
  if value.ndim != 0:
    raise ValueError(f'Expected a scalar, got shape {value.shape}.')
  return value.item()


class WandbWriter(writers.MetricWriter):
  """Writes to one W&B run. Use `create` to open it from the config."""

  def __init__(self, run, module):
    """Wraps an open W&B run.

    Args:
      run: the run `module.init` returned.
      module: the wandb module (for its Html media type).
    """
    self._run = run
    self._wandb = module

  def write_scalars(self, step, scalars):
    self._run.log({k: _number(v) for k, v in scalars.items()}, step=step)

  def write_texts(self, step, texts):
    # The texts are Markdown for TensorBoard; W&B shows them literally.
    self._run.log(
        {k: self._wandb.Html(f'<pre>{html.escape(str(v))}</pre>')
         for k, v in texts.items()},
        step=step,
    )

  def write_hparams(self, hparams):
    self._run.config.update(dict(hparams), allow_val_change=True)

  def flush(self):
    pass  # wandb sends from its own process; nothing is held here.

  def close(self):
    self._run.finish()


def _run_id(workdir):
  """The workdir's W&B run id, made and stored at the first start (with an
  exclusive create: of two starts racing, both use the id that won)."""
  file = str(storage.path(workdir) / RUN_ID_FILE)
  if not storage.exists(file):
    storage.create_exclusive(file, (uuid.uuid4().hex[:16] + '\n').encode())
  return storage.read_text(file).strip()


def create(logging_config, workdir, module=None):
  """Opens (or resumes) the workdir's W&B run; returns its `WandbWriter`.

  Call on process 0 only.

  Raises:
    validation.ConfigError: when wandb cannot open the run.

  Args:
    logging_config: the config's `logging` section (wandb_project,
      wandb_entity, wandb_run_name).
    workdir: the run directory (names the run by default, keeps its id).
    module: the wandb module; None imports it.
  """
  if module is None:
    import wandb as module  # pylint: disable=g-import-not-at-top
  name = (logging_config.wandb_run_name
          or storage.path(workdir).name or str(workdir))
  try:
    run = module.init(
        project=logging_config.wandb_project,
        entity=logging_config.wandb_entity or None,
        name=name,
        id=_run_id(workdir),
        resume='allow',
    )
  except Exception as e:  # pylint: disable=broad-exception-caught
    # wandb's own errors (not logged in, no network, a bad entity) become
    # one line naming the setting, like other start-up errors.
    raise validation.ConfigError(
        f'W&B could not open a run in config.logging.wandb_project='
        f'{logging_config.wandb_project!r}: {type(e).__name__}: {e}. Log in '
        "with `wandb login`, set WANDB_MODE=offline, or set "
        "--config.logging.wandb_project=''."
    ) from e
  logging.info('Logging to W&B project %r, run %r.',
               logging_config.wandb_project, name)
  return WandbWriter(run, module)
