r"""Evaluates the latest checkpoint of a run (or the base model) as JSON.

  python -m agent_tunix.evaluate --config=configs/gemma3_270m.py \
      --workdir=/tmp/run

Prints {"step": ..., "accuracy": ..., "accuracy_stderr": ...,
"format_accuracy": ..., "format_accuracy_stderr": ..., "pass_at_k": ...,
"pass_at_k_stderr": ..., "num_questions": ...} on stdout; step is null for
the base model. Each _stderr is the standard error of the accuracy beside it
over the num_questions held-out questions.
"""

import json
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from agent_tunix import evaluation
from agent_tunix import train

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file (a get_config() module).', lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    'workdir', None,
    'Run directory; its latest checkpoint is evaluated. Without one (or '
    'with no checkpoint in it) the base model is evaluated.',
)
_STEP = flags.DEFINE_integer(
    'step', None, 'Checkpoint step to evaluate (default: the latest).'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  config = _CONFIG.value
  session = train.setup(config, _WORKDIR.value or '', with_data=False)
  step = None
  if _WORKDIR.value:
    step = train.restore_lora(session, _WORKDIR.value, _STEP.value)
  scores, _ = evaluation.evaluate(
      session.sampler, session.tokenizer, session.eval_set, config
  )
  sys.stdout.write(json.dumps({
      'step': step, **scores, 'num_questions': len(session.eval_set)
  }) + '\n')


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  app.run(main)
