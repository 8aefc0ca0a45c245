"""The run's resolved config, stored in its workdir and checked on resume.

At a run's first start (no checkpoint yet) process 0 writes the resolved
config to `<workdir>/config.json`. A later start in the same workdir compares
its own config with it, field by field:

  * fields that only say how long, how often or how (memory, layout) the run
    goes, and the learning rate, warmup and clipping (the usual fixes after
    a divergence) may change: `SAFE_FIELDS`; each change is logged;
  * any other change (model, LoRA, data, rewards, GRPO and optimizer
    settings, seeds, ...) would make the resumed run something other than
    what was trained, and is refused with the old and new values and the fix.

A workdir without checkpoints has trained nothing: its stored config is
replaced. A field only one side has (a run saved by an older or newer
version of the code) is logged, not refused. A workdir with checkpoints but no config.json
(made before this check existed) is resumed unchecked, with a warning.
"""

import json

from absl import logging
import jax
import ml_collections

from agent_tunix import storage
from agent_tunix.config import validation
from agent_tunix.observe import metrics

FILENAME = 'config.json'
# Fields (or 'section.' prefixes) that may differ between starts of one run.
SAFE_FIELDS = (
    'training.num_steps',
    'training.reset_schedule',
    'training.micro_batch_size',
    'training.stop_on_alarm',
    'alarms.',
    'eval.',
    'logging.',
    'checkpoint.',
    'mesh.',
    'model.cache_dir',
    'model.remat',
    'generation.cpu_decode_graph',
    'grpo.logps_chunk_size',
    'grpo.share_prompts',
    'grpo.pack_sequences',
    'data.worker_count',
    # Where and how the judge is reached, not what it judges.
    'judge.base_url',
    'judge.api_key_env',
    'judge.max_concurrency',
    'judge.timeout_s',
    'judge.max_retries',
    'judge.cache',
    'judge.canary',
    'judge.on_failure',
    'judge.max_failure_fraction',
    'judge.batch_size',
    # What a divergence error suggests changing before a rerun.
    'optimizer.learning_rate',
    'optimizer.warmup_ratio',
    'optimizer.max_grad_norm',
)
# At most this many refused fields are listed, each value cut to _WIDTH.
_MAX_LISTED = 8
_WIDTH = 60


class ConfigChangedError(validation.ConfigError):
  """A resume with a config that changes what the run trains."""


def flatten(config):
  """{'section.field': JSON value} of a ConfigDict or nested dict."""
  if isinstance(config, (ml_collections.ConfigDict,
                         ml_collections.FrozenConfigDict)):
    config = config.to_dict()
  return metrics.flatten_config(
      json.loads(json.dumps(config, default=str)), leaf=lambda value: value
  )


def is_safe(field):
  return any(field == safe or (safe.endswith('.') and field.startswith(safe))
             for safe in SAFE_FIELDS)


def _short(value):
  text = json.dumps(value)
  return text if len(text) <= _WIDTH else text[:_WIDTH - 3] + '...'


def path(workdir):
  return storage.path(workdir) / FILENAME


def load(workdir):
  """The stored config of a run as a flat dict, or None if there is none."""
  file = path(workdir)
  if not file.exists():
    return None
  return json.loads(file.read_text())


def compare(stored, config):
  """Returns (refused, allowed, one_sided) lists of (field, old, new)."""
  current = flatten(config)
  refused, allowed, one_sided = [], [], []
  for field in sorted(set(stored) | set(current)):
    old, new = stored.get(field, '<absent>'), current.get(field, '<absent>')
    if old == new:
      continue
    if field not in stored or field not in current:
      one_sided.append((field, old, new))
    elif is_safe(field):
      allowed.append((field, old, new))
    else:
      refused.append((field, old, new))
  return refused, allowed, one_sided


def check_and_store(config, workdir, has_checkpoints):
  """Refuses a changed config on resume; stores the config at the start.

  Args:
    config: The run's resolved config.
    workdir: The run directory (local or gs://).
    has_checkpoints: Whether the workdir already holds checkpoints.

  Raises:
    ConfigChangedError: naming each field that changes what was trained.
  """
  stored = load(workdir)
  if stored is None and has_checkpoints:
    logging.warning('%s has checkpoints but no %s (made by an older '
                    'version): the config cannot be compared; resuming '
                    'unchecked.', workdir, FILENAME)
    return
  if not has_checkpoints:
    # Nothing trained yet (or a run that failed before its first save):
    # this start is the run's first, and its config is the one to keep.
    if stored is not None and stored != flatten(config):
      logging.info('%s had no checkpoint; replacing its config.',
                   path(workdir))
    if jax.process_index() == 0:
      # Whole or not at all: a temporary renamed into place locally; an
      # object on gs:// is replaced whole by nature (no rename there).
      storage.write_text(str(path(workdir)),
                         json.dumps(flatten(config), indent=1,
                                    sort_keys=True))
    return
  refused, allowed, one_sided = compare(stored, config)
  for field, old, new in allowed:
    logging.info('Resuming with config.%s changed: %s -> %s.', field,
                 _short(old), _short(new))
  for field, old, new in one_sided:
    logging.warning('config.%s is only in one of the stored and the current '
                    'config (%s -> %s); assuming it does not matter.', field,
                    _short(old), _short(new))
  if refused:
    lines = [f'  config.{field}: {_short(old)} (trained) -> {_short(new)} '
             '(now)' for field, old, new in refused[:_MAX_LISTED]]
    if len(refused) > _MAX_LISTED:
      lines.append(f'  ... and {len(refused) - _MAX_LISTED} more')
    raise ConfigChangedError(
        f'The config differs from the one this run was trained with '
        f'({path(workdir)}) in fields that change what is trained:\n'
        + '\n'.join(lines) + '\nRevert those overrides to resume this run, '
        'or use a new --workdir to start a new one.'
    )
