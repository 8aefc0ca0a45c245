"""The worked examples a plain (pretrained) prompt shows before the question.

`data.few_shot` names them, one of `KINDS`:

  * 'auto': 'arithmetic' for arithmetic sources (synthetic, GSM8K), 'none'
    for a user's own data (jsonl, parquet, hf_rubrics) and rubric rows;
  * 'none': no worked examples;
  * 'arithmetic': the two built-in arithmetic problems
    (`prompts.FEW_SHOT_EXAMPLES`);
  * 'train:K': K rows drawn (by data.seed) from the run's own train split,
    which then trains without them;
  * a path ending in '.jsonl' (local or gs://): one example a line, with
    the question and answer columns of data.prompt_column /
    data.answer_column, and an optional 'reasoning'.

An example is (question, reasoning, answer). The reasoning is a row's
'reasoning' column, else its worked solution (a GSM8K answer's text before
'####'), else '' (a rubric row's answer is its reference answer).

With agent.tools the worked tool episodes are built in: 'auto' and
'arithmetic' show them (when the calculator is a tool), 'none' leaves them
out, and the other kinds are refused (`problem`).
"""

import functools
import json
import os

import ml_collections
import numpy as np

from agent_tunix import storage
from agent_tunix.data import gsm8k

KINDS = ('auto', 'none', 'arithmetic', 'train:K', 'PATH.jsonl')
# Sources whose rows are arithmetic word problems, like the built-in shots.
ARITHMETIC_SOURCES = ('synthetic', 'synthetic_unseen', 'gsm8k_tfds',
                      'gsm8k_hf')
# The built-in examples, as (question, reasoning, answer).
ARITHMETIC = (
    (
        'Ann has 3 bags with 4 pens in each. She gives away 5 pens. How many '
        'pens does she have left?',
        '3 * 4 = 12 pens. 12 - 5 = 7 pens are left.',
        '7',
    ),
    (
        'A bus drives at 40 km per hour for 2 hours. How far does it go?',
        'Distance is 40 * 2 = 80 km.',
        '80',
    ),
)


def spec_of(config):
  """data.few_shot ('auto' in a config from before the field)."""
  return config.data.get('few_shot', 'auto').strip()


def _source_names(source):
  return [part.partition(':')[0].strip() for part in source.split(',')]


def kind(config):
  """data.few_shot with 'auto' resolved: 'none', 'arithmetic', 'train' or
  'file'.

  Raises:
    ValueError: data.few_shot is none of `KINDS`.
  """
  spec = spec_of(config)
  if spec == 'auto':
    arithmetic = config.data.task == 'math' and all(
        n in ARITHMETIC_SOURCES for n in _source_names(config.data.source))
    return 'arithmetic' if arithmetic else 'none'
  if spec in ('none', 'arithmetic'):
    return spec
  if spec.startswith('train:'):
    train_count(spec)
    return 'train'
  if spec.endswith('.jsonl'):
    return 'file'
  raise ValueError(
      f'data.few_shot={spec!r} is not one of {KINDS}: use \'none\', '
      "'arithmetic', 'train:2' (two rows of the train split) or a JSONL file "
      'of examples.')


def train_count(spec):
  """K of 'train:K' (>= 1)."""
  count = spec.partition(':')[2].strip()
  if not count.isdigit() or int(count) < 1:
    raise ValueError(
        f"data.few_shot={spec!r}: 'train:K' needs a whole number K >= 1 of "
        "train rows to show, e.g. 'train:2'.")
  return int(count)


def drawn_indices(num_rows, count, seed):
  """The sorted indices of the `count` train rows shown as examples."""
  if count >= num_rows:
    raise ValueError(
        f'data.few_shot=\'train:{count}\' takes {count} of the {num_rows} '
        'train rows, leaving none to train on; lower K or add rows.')
  rng = np.random.default_rng([seed, 2])
  return sorted(int(i) for i in rng.choice(num_rows, count, replace=False))


def hold_out(config, rows):
  """The train rows without those shown as examples ('train:K')."""
  if kind(config) != 'train':
    return rows
  drawn = set(drawn_indices(len(rows), train_count(spec_of(config)),
                            config.data.seed))
  return [row for i, row in enumerate(rows) if i not in drawn]


def _shot(row):
  """(question, reasoning, answer) of a loaded row."""
  answer = row.get('answer', row.get('reference', ''))
  if not str(answer).strip():
    raise gsm8k.DataError(
        f'A few-shot row has no answer to show ({row["question"][:60]!r}); '
        'rubric rows need data.reference_column, or set data.few_shot to '
        "'none' or a JSONL file of examples.")
  return (row['question'], str(row.get('reasoning', '')), str(answer))


def _from_file(path, prompt_column, answer_column):
  rows, _ = gsm8k.read_jsonl(path)
  shots = []
  for number, row in enumerate(rows, start=1):
    missing = [c for c in (prompt_column, answer_column)
               if not isinstance(row, dict) or c not in row]
    if missing:
      raise gsm8k.DataError(
          f'data.few_shot={path!r}: example {number} has no column(s) '
          f'{missing}; each line needs {prompt_column!r} and '
          f"{answer_column!r} (and optionally 'reasoning').")
    example = gsm8k.example(row[prompt_column], row[answer_column])
    if row.get('reasoning'):
      example['reasoning'] = str(row['reasoning']).strip()
    shots.append(_shot(example))
  if not shots:
    raise gsm8k.DataError(f'data.few_shot={path!r} holds no examples.')
  return tuple(shots)


def _version(path):
  """A local file's (inode, size, mtime), so an edited file is read anew."""
  try:
    stat = os.stat(path)
  except (OSError, ValueError):
    return None  # Remote, or missing (the loader says so).
  return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _cached(data_json, version):
  """The examples of a data section (as sorted JSON: a cache key) whose
  file is at `version`."""
  del version  # Only part of the cache key.
  # pipeline imports prompts, which imports this module.
  from agent_tunix.data import pipeline  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({'data': json.loads(data_json)})
  data = config.data
  resolved = kind(config)
  if resolved == 'none':
    return ()
  if resolved == 'arithmetic':
    return ARITHMETIC
  if resolved == 'file':
    if not storage.exists(data.few_shot):
      raise FileNotFoundError(
          f'data.few_shot: no JSONL file of examples at {data.few_shot!r}; '
          'check the path.')
    return _from_file(data.few_shot, data.prompt_column, data.answer_column)
  rows = pipeline.load_split(config, 'train')
  indices = drawn_indices(len(rows), train_count(data.few_shot), data.seed)
  return tuple(_shot(rows[i]) for i in indices)


def examples(config):
  """The (question, reasoning, answer) examples of data.few_shot."""
  resolved = kind(config)
  path = {'file': spec_of(config), 'train': config.data.path}.get(resolved, '')
  if resolved == 'train' and '{split}' in path:
    path = path.replace('{split}', 'train')
  return _cached(json.dumps(config.data.to_dict(), sort_keys=True),
                 _version(path) if path else None)


def problem(config, template):
  """Why data.few_shot cannot apply to `template` ('chat' / 'plain'), or
  '' if it can."""
  spec = spec_of(config)
  resolved = kind(config)
  if resolved in ('train', 'file') and config.agent.tools:
    return (f'data.few_shot={spec!r}: with agent.tools the worked examples '
            "are the built-in tool episodes; use 'auto', 'arithmetic' or "
            "'none'.")
  if spec not in ('auto', 'none') and template == 'chat':
    return (f'data.few_shot={spec!r} applies to the plain template only (the '
            'chat template shows no worked examples); set '
            "data.few_shot='none', or data.template='plain'.")
  return ''
