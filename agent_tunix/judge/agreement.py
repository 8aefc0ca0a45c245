"""A judge against labelled verdicts: the measure behind
`python -m agent_tunix.judge_agreement` (see that module)."""

import collections

from agent_tunix.data import gsm8k
from agent_tunix.data import pipeline
from agent_tunix.data import rubrics
from agent_tunix.judge import judge as judge_lib
from agent_tunix.judge import prompts


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
