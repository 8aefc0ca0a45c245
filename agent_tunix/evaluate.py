r"""Evaluates the latest checkpoint of a run (or the base model) as JSON.

  python -m agent_tunix.evaluate --config=configs/gemma3_270m.py \
      --workdir=/tmp/run

Prints {"step": ..., "accuracy": ..., "accuracy_stderr": ...,
"format_accuracy": ..., "format_accuracy_stderr": ..., "pass_at_k": ...,
"pass_at_k_stderr": ..., "num_questions": ...} on stdout. Each _stderr is
the standard error of the accuracy beside it over the num_questions
held-out questions. A --workdir that does not exist is an error; one
without checkpoints (or no --workdir) is an error unless --allow_base asks
for the base model (step is then null). Nothing is written.

--by_type adds "by_type" and "by_shape": for each problem type (a
synthetic template, or a data file's 'type' field) and each expression
shape, {"correct", "count", "accuracy"} of the greedy answers; the same
as a table on stderr.
"""

import json
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from agent_tunix import cli
from agent_tunix import storage
from agent_tunix.config import validation
from agent_tunix.data import opening
from agent_tunix.rl import evaluation
from agent_tunix.run import checkpoint
from agent_tunix.run import errors
from agent_tunix.run import train

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file (a get_config() module).', lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    'workdir', None,
    'Run directory; its latest checkpoint is evaluated. It must exist.',
)
_ALLOW_BASE = flags.DEFINE_bool(
    'allow_base', False,
    'Evaluate the base model when there is no --workdir or it has no '
    'checkpoint (otherwise that is an error).',
)
_STEP = flags.DEFINE_integer(
    'step', None, 'Checkpoint step to evaluate (default: the latest).'
)
_BY_TYPE = flags.DEFINE_bool(
    'by_type', False,
    'Also report accuracy with counts per problem type and per expression '
    'shape ("by_type", "by_shape" in the JSON; a table on stderr).',
)


def check_workdir(workdir, allow_base):
  """Refuses a missing workdir, or one without checkpoints unless allowed."""
  if workdir and not storage.path(workdir).exists():
    raise SystemExit(
        f'evaluate: --workdir={workdir} does not exist; pass the --workdir '
        'of a training run.'
    )
  if not (workdir and checkpoint.has_steps(workdir)) and not allow_base:
    where = (f'--workdir={workdir} has no checkpoint' if workdir
             else 'no --workdir given')
    raise SystemExit(
        f'evaluate: {where}; pass the --workdir of a training run, or '
        '--allow_base to evaluate the base model.'
    )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  config = _CONFIG.value
  workdir = _WORKDIR.value
  check_workdir(workdir, _ALLOW_BASE.value)
  # The eval split is all evaluate reads; its data opens before the model.
  validation.validate(config, splits=('eval',))
  opening.exit_on_error(config, splits=('eval',))
  session = train.setup(config, workdir or '', with_data=False)
  step = None
  if workdir and checkpoint.has_steps(workdir):
    step = train.restore_lora(session, workdir, _STEP.value)
  scores, texts, _ = evaluation.evaluate(
      session.sampler, session.tokenizer, session.eval_set, config,
      judge=session.reward_set.judge,
  )
  result = {'step': step, **scores, 'num_questions': len(session.eval_set)}
  if _BY_TYPE.value:
    for field, key in (('type', 'by_type'), ('shape', 'by_shape')):
      result[key] = evaluation.accuracy_by(field, session.eval_set, texts)
    sys.stderr.write(type_table(result))
  sys.stdout.write(json.dumps(result) + '\n')


def type_table(result):
  """The per-type and per-shape counts as aligned text lines."""
  lines = []
  for key, title in (('by_type', 'type'), ('by_shape', 'shape')):
    groups = result[key]
    width = max([len(title)] + [len(name or '(none)') for name in groups])
    lines.append(f'{title:<{width}}  right / count  accuracy')
    for name, group in groups.items():
      count = f'{group["correct"]:>5} / {group["count"]:<5}'
      lines.append(f'{name or "(none)":<{width}}  {count}  '
                   f'{100 * group["accuracy"]:6.1f}%')
    lines.append('')
  return '\n'.join(lines)


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  cli.run(errors.cli(main))
