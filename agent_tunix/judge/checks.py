"""Config checks for rubric rows and the judge (called by validation)."""

import os

from agent_tunix.data import pipeline
from agent_tunix.judge import judge as judge_lib
from agent_tunix.judge import prompts

# Rewards that read a numeric answer (meaningless on rubric rows) and those
# that read a rubric (meaningless without one).
_ANSWER_REWARDS = ('answer', 'numbers', 'tool_steps')
_RUBRIC_REWARDS = ('rubric_judge', 'rubric_overlap')


def check(config, names, require):
  """Raises through `require(ok, message)` on the first problem.

  Args:
    config: the full config.
    names: the reward names of rewards.functions.
    require: validation's `_require`.
  """
  d, j = config.data, config.judge
  require(d.task in pipeline.TASKS,
          f'config.data.task={d.task!r} is not one of {list(pipeline.TASKS)}.')
  sources = [n for n, _ in pipeline.parse_source(d.source)]
  if d.task == 'rubric':
    wrong = [s for s in sources if s not in pipeline.RUBRIC_SOURCES]
    require(not wrong,
            f"config.data.task='rubric' reads rubric rows, which "
            f'data.source {wrong} does not have; use one of '
            f'{list(pipeline.RUBRIC_SOURCES)}.')
    listed = [n for n in names if n in _ANSWER_REWARDS]
    require(not listed,
            f'config.rewards.functions lists {listed}, which score a numeric '
            "answer; rubric rows (data.task='rubric') have none: use "
            "rubric_judge (and format rewards) instead.")
  else:
    require('hf_rubrics' not in sources,
            "config.data.source='hf_rubrics' holds rubric rows; set "
            "config.data.task='rubric'.")
    listed = [n for n in names if n in _RUBRIC_REWARDS]
    require(not listed,
            f'config.rewards.functions lists {listed}, which need rubric '
            "rows; set config.data.task='rubric' and a rubric data source.")
  if 'hf_rubrics' in sources:
    require(bool(d.path), "config.data.source='hf_rubrics' needs "
            "config.data.path set to a dataset id, e.g. 'ScaleAI/RaR-Science'.")
  if 'rubric_judge' not in names:
    return
  choices = {'backend': judge_lib.BACKENDS, 'aggregation': prompts.AGGREGATIONS,
             'cache': judge_lib.CACHES, 'on_failure': judge_lib.ON_FAILURE}
  for field, allowed in choices.items():
    require(j[field] in allowed,
            f'config.judge.{field}={j[field]!r} is not one of {list(allowed)}.')
  if j.backend == 'http':
    for field in ('base_url', 'model'):
      require(bool(j[field]),
              f"config.judge.{field} is empty; judge.backend='http' needs the "
              'judge server\'s base URL (e.g. http://127.0.0.1:8000/v1) and '
              'model name.')
    require(j.base_url.startswith(('http://', 'https://')),
            f'config.judge.base_url={j.base_url!r} must start with http:// or '
            'https://.')
  else:
    require(j.aggregation == 'explicit',
            "config.judge.backend='gemma' scores items (P(yes) vs P(no)); set "
            "judge.aggregation='explicit'.")
  for field, low in (('max_concurrency', 1), ('max_retries', 0),
                     ('max_tokens', 1), ('batch_size', 1),
                     ('max_response_chars', 1)):
    require(j[field] >= low, f'config.judge.{field}={j[field]} must be >= '
            f'{low}.')
  require(j.timeout_s > 0,
          f'config.judge.timeout_s={j.timeout_s} must be > 0 seconds.')
  require(0 <= j.max_failure_fraction <= 1,
          f'config.judge.max_failure_fraction={j.max_failure_fraction} must '
          'be between 0 and 1.')
  require(not j.prompt_file or os.path.isfile(j.prompt_file),
          f'config.judge.prompt_file={j.prompt_file!r}: no such file.')
  if j.prompt_file:
    with open(j.prompt_file, encoding='utf-8') as f:
      text = f.read()
    gemma = j.backend == 'gemma'
    items = '{criterion}' if gemma else '{criteria}'
    missing = [field for field in ('{response}', items) if field not in text]
    if gemma:
      why = ("judge.backend='gemma' asks about one item at a time, so its "
             'prompt names {response} and {criterion} (and may name '
             "{question} and {reference}), and ends where the judge's yes or "
             'no comes next.')
    else:
      why = (f"judge.backend='{j.backend}' asks about all of a completion's "
             'items at once, so its prompt names {response} and {criteria} '
             '(and may name {question} and {reference}); a file written for '
             "the gemma judge asks about one {criterion}: set "
             'judge.prompt_file= for the built-in prompt.')
    require(not missing, f'config.judge.prompt_file={j.prompt_file!r} lacks '
            f"{' and '.join(missing)}: {why}")
