r"""How often the configured judge agrees with labelled verdicts, as JSON.

  python -m agent_tunix.judge_agreement --config=configs/gemma3_270m_rubrics.py

Reads the rubric rows of data.path's eval split that carry `labels`, a
list of {"response": ..., "met": [bool per rubric item]} (the shipped
data/rubrics rows have three each: a right answer, a right answer with
the important fact, a wrong answer), asks the judge about every labelled
response, and prints {"item_agreement": share of item verdicts equal to
the label, "item_agreement_by_category": {...}, "ranking_accuracy": share
of rows whose highest-labelled response the judge also scores highest
(ties count as misses), "num_rows", "num_verdicts"}. The judge's own
verdicts (P(yes) > 0.5 for the Gemma judge) are compared; nothing is
written.
"""

import collections
import json
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from agent_tunix import cli
from agent_tunix.data import gsm8k
from agent_tunix.data import pipeline
from agent_tunix.data import rubrics
from agent_tunix.judge import judge as judge_lib
from agent_tunix.judge import prompts
from agent_tunix.run import errors

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file (a get_config() module).', lock_config=True)
_SPLIT = flags.DEFINE_enum('split', 'eval', pipeline.SPLITS,
                           'Which split of data.path to read.')


def labelled_rows(config, split):
  """[(question, reference, items, [(response, met), ...]), ...]."""
  path = pipeline.split_path(config.data.path, split)
  rows, _ = gsm8k.read_jsonl(path)
  out = []
  for row in rows:
    if not row.get('labels'):
      continue
    items = rubrics.normalise(row[config.data.rubric_column])
    column = config.data.reference_column
    reference = str(row.get(column) or '') if column else ''
    labels = [(l['response'], [bool(m) for m in l['met']])
              for l in row['labels']]
    out.append((row[config.data.prompt_column], reference, items, labels))
  if not out:
    raise gsm8k.DataError(f'{path} has no rows with "labels".')
  return out


def agreement(judge, rows):
  """The agreement report (see the module docstring)."""
  tasks, wanted = [], []
  for question, reference, items, labels in rows:
    for response, met in labels:
      tasks.append(judge.task(question, reference, response, items))
      wanted.append(met)
  verdicts = judge.verdicts(tasks)
  by_category = collections.Counter()
  agree = collections.Counter()
  for task, verdict, met in zip(tasks, verdicts, wanted):
    if verdict.failure:
      raise judge_lib.JudgeError(f'Judge {verdict.failure}: {verdict.detail}')
    for item, got, label in zip(task['items'], verdict.met, met):
      for name in (item['category'] or 'uncategorised', 'overall'):
        by_category[name] += 1
        agree[name] += int(got == label)
  ranked, offset = 0, 0
  for _, _, items, labels in rows:
    scores = [v.score for v in verdicts[offset:offset + len(labels)]]
    truth = [prompts.explicit_score(items, met) for _, met in labels]
    offset += len(labels)
    best = max(range(len(labels)), key=lambda i: truth[i])
    ranked += int(all(scores[best] > s for i, s in enumerate(scores)
                      if i != best))
  return {
      'item_agreement': agree['overall'] / by_category['overall'],
      'item_agreement_by_category': {
          k: agree[k] / n for k, n in sorted(by_category.items())
          if k != 'overall'},
      'ranking_accuracy': ranked / len(rows),
      'num_rows': len(rows),
      'num_verdicts': by_category['overall'],
  }


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
  report = agreement(judge, labelled_rows(config, _SPLIT.value))
  judge.close()
  sys.stdout.write(json.dumps(report) + '\n')


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  cli.run(errors.cli(main))
