"""Rubric rows (data.task='rubric'): one normaliser for every rubric shape.

A rubric is a checklist a judge ticks item by item (Rubrics as Rewards,
arXiv 2507.17746). Whatever the source writes, `normalise` turns it into
items `{'text', 'weight', 'category'}`:

  * RaR's list of {title, description, weight}: the category comes from
    the description's 'Essential/Important/Optional/Pitfall Criteria:'
    prefix (dropped from the text), the weight is kept;
  * OpenRubrics' one numbered string, '1. The response ... [Hard Rule]\n2.
    ... [Principle]': one item per number, the tag gives the category;
  * a list of {text|criterion|description, weight|points, category}
    objects, a list of strings, or one plain string (one item per line);
  * any of these as a JSON string (parquet files often store them so).

Items without a weight get their category's (`CATEGORY_WEIGHTS`: a
pitfall's is negative: the response loses it by making the mistake the
item describes), or 1. A rubric row is {'question', 'answer': '',
'rubric': [items], 'reference': str}.
"""

import json
import math
import re

from absl import logging

from agent_tunix import storage
from agent_tunix.data import gsm8k

CATEGORIES = ('essential', 'important', 'optional', 'pitfall', 'hard_rule',
              'principle', '')
# Weights of items that do not carry one. RaR's data uses 5 / 3-4 / 1-2
# and -1 / -2; OpenRubrics' items carry none.
CATEGORY_WEIGHTS = {'essential': 5.0, 'important': 3.0, 'optional': 1.0,
                    'pitfall': -2.0, 'hard_rule': 1.0, 'principle': 1.0,
                    '': 1.0}
# More items than this is a malformed row, not a rubric.
MAX_ITEMS = 64
_PREFIX = re.compile(
    r'^\s*(essential|important|optional|pitfall)\s+criteri(?:a|on)\s*:\s*',
    re.I)
_TAG = re.compile(r'\s*\[(hard rule|principle)\]\s*$', re.I)
_NUMBERED = re.compile(r'(?m)^\s*\d+[.)]\s+')
_TEXT_KEYS = ('text', 'criterion', 'description', 'criterion_text',
              'requirement', 'title')
_WEIGHT_KEYS = ('weight', 'points', 'score')


class RubricError(ValueError):
  """A rubric that cannot be read as items (the message says why)."""


def _category_of(text, given=''):
  """(category, text without its category prefix or tag)."""
  category = str(given or '').strip().lower().replace(' ', '_')
  match = _PREFIX.match(text)
  if match:
    category = category or match.group(1).lower()
    text = text[match.end():]
  match = _TAG.search(text)
  if match:
    category = category or match.group(1).lower().replace(' ', '_')
    text = text[:match.start()]
  return category, text.strip()


def _item(raw, index):
  """One item from a string or an object."""
  given_category, weight = '', None
  if isinstance(raw, str):
    text = raw
  elif isinstance(raw, dict):
    text = next((raw[k] for k in _TEXT_KEYS
                 if isinstance(raw.get(k), str) and raw[k].strip()), None)
    if text is None:
      raise RubricError(
          f'item {index} has no text (looked for {list(_TEXT_KEYS)}; it has '
          f'{sorted(raw)})')
    weight = next((raw[k] for k in _WEIGHT_KEYS if raw.get(k) is not None),
                  None)
    given_category = raw.get('category') or raw.get('axis') or ''
  else:
    raise RubricError(
        f'item {index} is a {type(raw).__name__}, not a string or an object')
  category, text = _category_of(text, given_category)
  if not text:
    raise RubricError(f'item {index} is empty')
  if category not in CATEGORIES:
    category = ''
  if weight is None:
    weight = CATEGORY_WEIGHTS[category]
  try:
    weight = float(weight)
  except (TypeError, ValueError):
    raise RubricError(f'item {index} has weight {weight!r}, not a number'
                      ) from None
  if not math.isfinite(weight):
    raise RubricError(f'item {index} has weight {weight}, not finite')
  return {'text': ' '.join(text.split()), 'weight': weight,
          'category': category}


def _json_value(text):
  """A string holding a JSON list or object, decoded; else None."""
  stripped = text.strip()
  if not stripped.startswith(('[', '{')):
    return None
  try:
    value = json.loads(stripped)
  except json.JSONDecodeError:
    return None
  return value if isinstance(value, (list, dict)) else None


def _split_string(text):
  """A rubric string's items: numbered parts, else non-empty lines."""
  if _NUMBERED.search(text):
    parts = _NUMBERED.split(text)
    # Text before the first number is a heading, not an item.
    return [p for p in parts[1:] if p.strip()]
  return [line for line in text.splitlines() if line.strip()]


def normalise(rubric):
  """A rubric in any supported shape as a list of items.

  Raises:
    RubricError: when it has no item, too many, or an unreadable one.
  """
  if isinstance(rubric, str):
    parsed = _json_value(rubric)
    if parsed is not None:
      return normalise(parsed)
    raw_items = _split_string(rubric)
  elif isinstance(rubric, dict):
    raw_items = [rubric]
  elif isinstance(rubric, (list, tuple)):
    raw_items = list(rubric)
  elif rubric is None:
    raw_items = []
  else:
    raise RubricError(
        f'the rubric is a {type(rubric).__name__}; expected a string or a '
        'list of items')
  if not raw_items:
    raise RubricError('the rubric has no items')
  if len(raw_items) > MAX_ITEMS:
    raise RubricError(
        f'the rubric has {len(raw_items)} items (more than {MAX_ITEMS})')
  return [_item(raw, i + 1) for i, raw in enumerate(raw_items)]


def rubric_text(items):
  """The items as a numbered list, one per line ('1. <text>')."""
  return '\n'.join(f'{i}. {item["text"]}' for i, item in enumerate(items, 1))


def _example(row, columns):
  """A rubric row as an example, or (None, why) when it cannot train."""
  question = row.get(columns['prompt_column'])
  question = '' if question is None else str(question).strip()
  if not question or question == 'None':
    return None, 'its question is empty'
  try:
    items = normalise(row.get(columns['rubric_column']))
  except RubricError as e:
    return None, f'its rubric cannot be read: {e}'
  reference = ''
  if columns['reference_column']:
    value = row.get(columns['reference_column'])
    reference = '' if value is None else str(value).strip()
  return {'question': question, 'answer': '', 'rubric': items,
          'reference': reference}, ''


def examples_from_rows(rows, where, source, prompt_column='question',
                       rubric_column='rubric', reference_column='',
                       limit=0, bad_rows='error'):
  """Rubric examples from raw rows (dicts), following data.bad_rows.

  Args:
    rows: The rows.
    where: Each row's position for messages ('line 3', 'row 7').
    source: The file or dataset, for messages.
    prompt_column, rubric_column, reference_column: The columns
      (reference_column '' = no reference answer).
    limit: Keep the first `limit` rows (0 = all).
    bad_rows: 'error' refuses a bad row naming it, 'skip' drops and counts.

  Raises:
    gsm8k.DataError: on a row that is not an object, a missing column, or
      (bad_rows='error') a bad row.
  """
  columns = dict(prompt_column=prompt_column, rubric_column=rubric_column,
                 reference_column=reference_column)
  examples, skipped = [], 0
  for index, row in enumerate(rows[:limit] if limit else rows):
    if not isinstance(row, dict):
      raise gsm8k.DataError(
          f'{source} {where[index]} is a {type(row).__name__}, not an object '
          'with named columns.')
    missing = [c for c in (prompt_column, rubric_column) if c not in row]
    if missing:
      raise gsm8k.DataError(
          f'{source} {where[index]} has no column(s) {missing}; it has '
          f'{sorted(row)}. Set data.prompt_column / data.rubric_column to '
          'the question and rubric columns.')
    example, problem = _example(row, columns)
    if problem and bad_rows == 'error':
      raise gsm8k.DataError(
          f'{source} {where[index]}: {problem}. Fix or remove the row, or '
          "set data.bad_rows='skip' to drop such rows (they are counted).")
    if problem:
      skipped += 1
      continue
    examples.append(example)
  if skipped:
    logging.warning("Skipped %s of %s rubric rows of %s (data.bad_rows="
                    "'skip').", skipped, skipped + len(examples), source)
  logging.info('Loaded %s rubric examples from %s.', len(examples), source)
  return examples


def load_file(path, file_format='jsonl', limit=0, bad_rows='error',
              **columns):
  """Rubric examples from a local JSONL or parquet file.

  Raises:
    FileNotFoundError: if `path` does not exist.
    ValueError / gsm8k.DataError: as `gsm8k.load_file` and
      `examples_from_rows`.
  """
  readers = {'jsonl': gsm8k.read_jsonl, 'parquet': gsm8k.read_parquet}
  if file_format not in readers:
    raise ValueError(f'Unknown file format {file_format!r}; expected one of '
                     f'{sorted(readers)}.')
  if not storage.exists(path):
    raise FileNotFoundError(
        f'No {file_format} file at data.path={path!r}; check the path.')
  rows, where = readers[file_format](path)
  return examples_from_rows(rows, where, path, limit=limit,
                            bad_rows=bad_rows, **columns)


# Hugging Face splits tried for each of ours, in order.
_HF_SPLITS = {'train': ('train',), 'eval': ('test', 'validation', 'val')}


def load_hf(dataset_id, split, limit=0, bad_rows='error', **columns):
  """Rubric examples from a Hugging Face dataset (data.source='hf_rubrics').

  Only when a user asks for it: loads `dataset_id` (an exact id such as
  'ScaleAI/RaR-Science' or 'OpenRubrics/OpenRubric-v2') through `datasets`.

  Raises:
    RuntimeError: when the dataset or split cannot be loaded (never an
      empty list).
  """
  if not dataset_id:
    raise ValueError("data.source='hf_rubrics' needs data.path set to a "
                     "dataset id, e.g. 'ScaleAI/RaR-Science'.")
  import datasets  # pylint: disable=g-import-not-at-top
  errors = []
  for hf_split in _HF_SPLITS[split]:
    try:
      ds = datasets.load_dataset(dataset_id, split=hf_split)
      break
    except Exception as e:  # pylint: disable=broad-exception-caught
      errors.append(f'{hf_split}: {e}')
  else:
    raise RuntimeError(
        f'Could not load the {split} split of {dataset_id!r} from Hugging '
        f"Face (tried {list(_HF_SPLITS[split])}): {'; '.join(errors)}")
  rows = list(ds.select(range(min(limit, len(ds)))) if limit else ds)
  if not rows:
    raise RuntimeError(f'{dataset_id!r} split {hf_split!r} has no rows.')
  return examples_from_rows(rows, [f'row {i}' for i in range(len(rows))],
                            dataset_id, bad_rows=bad_rows, **columns)
