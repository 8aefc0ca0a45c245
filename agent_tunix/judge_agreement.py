r"""How often the configured judge agrees with labelled verdicts, as JSON.

  python -m agent_tunix.judge_agreement --config=configs/gemma3_270m_rubrics.py

Reads the rubric rows of data.path's eval split that carry `labels`, a
list of {"response": ..., "met": [bool per rubric item]} (the shipped
agent_tunix/configs/rubrics rows have three each: a right answer, a right
answer with the important fact, a wrong answer), asks the judge about
every labelled response, and prints {"item_agreement": share of item
verdicts equal to the label, "item_agreement_by_category": {...},
"ranking_accuracy": share of rows whose highest-labelled response the
judge also scores highest (ties count as misses), "num_rows",
"num_verdicts"}. The judge's own
verdicts (P(yes) > 0.5 for the Gemma judge) are compared; nothing is
written.
"""

import json
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from agent_tunix import cli
from agent_tunix.data import pipeline
from agent_tunix.judge import agreement
from agent_tunix.judge import judge as judge_lib
from agent_tunix.run import errors

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file (a get_config() module).', lock_config=True)
_SPLIT = flags.DEFINE_enum('split', 'eval', pipeline.SPLITS,
                           'Which split of data.path to read.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  config = _CONFIG.value
  model = tokenizer = None
  if config.judge.backend == 'gemma' and not config.judge.preset:
    from agent_tunix import models  # pylint: disable=g-import-not-at-top
    from agent_tunix.tpu import sharding  # pylint: disable=g-import-not-at-top
    model, tokenizer = models.build(config, sharding.make_mesh(config.mesh))
  judge = judge_lib.from_config(config, None, model, tokenizer)
  report = agreement.agreement(
      judge, agreement.labelled_rows(config, _SPLIT.value))
  judge.close()
  sys.stdout.write(json.dumps(report) + '\n')


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  cli.run(errors.cli(main))
