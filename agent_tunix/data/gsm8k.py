"""GSM8K and GSM8K-shaped question/answer data.

Three places to read it from:
  * TFDS: `load_tfds(split, data_dir)` (`tfds.load('gsm8k')`, downloads on
    first use unless `data_dir` already holds the prepared dataset).
  * Hugging Face: `load_hf(split, path=...)` (`load_dataset('openai/gsm8k',
    'main')`, or the same parquet files in a local copy); no TensorFlow.
  * A local JSONL or parquet file: `load_file(path, ...)`, with any column
    names for the question and the answer.

Every loader returns a list of {'question': str, 'answer': str} dicts. GSM8K
answers hold a worked solution followed by '#### <final value>'; only the final
value is kept, with thousands separators and whitespace removed. Answers
without '####' are kept whole (stripped).
"""

import importlib.util
import json
import re

from absl import logging

from agent_tunix import storage


class HubUnreachable(RuntimeError):
  """openai/gsm8k could not be read from the Hub (no network or no cache):
  a property of this machine, not of the config."""


class DataError(ValueError):
  """A data file or row that cannot be used; the message names it and the fix."""

# Split names of GSM8K itself for our 'train' / 'eval' splits.
_GSM8K_SPLITS = {'train': 'train', 'eval': 'test', 'test': 'test'}
_OFFLINE_HINT = (
    "If this machine is offline, point data.path at a local copy of "
    "openai/gsm8k's files (data.source='gsm8k_hf'), use data.source='jsonl' "
    "(or 'parquet') with data.path pointing to a local file, or "
    "data.source='synthetic'."
)


def parse_answer(value):
  """Returns the final answer string of a GSM8K-style answer.

  Args:
    value: The answer field: 'steps... #### 1,234' gives '1234'; text without
      '####' is returned stripped; integers (and integral floats) become their
      decimal string.
  """
  if isinstance(value, bytes):
    value = value.decode('utf-8')
  if isinstance(value, float) and value.is_integer():
    value = int(value)
  text = str(value)
  if '####' in text:
    return text.rsplit('####', 1)[1].replace(',', '').strip()
  return text.strip()


def _as_text(value):
  if isinstance(value, bytes):
    return value.decode('utf-8')
  return str(value)


def example(question, answer):
  """{'question', 'answer'}, plus 'reasoning' when the answer text holds a
  worked solution before its '####' (GSM8K's, with `<<48/2=24>>` steps):
  tool-aware rewards compare a call's results with its steps."""
  row = {
      'question': _as_text(question).strip(),
      'answer': parse_answer(answer),
  }
  text = _as_text(answer)
  if '####' in text and text.rsplit('####', 1)[0].strip():
    row['reasoning'] = text.rsplit('####', 1)[0].strip()
  return row


def _gsm8k_split(split):
  if split not in _GSM8K_SPLITS:
    raise ValueError(
        f'Unknown split {split!r}; expected one of {sorted(_GSM8K_SPLITS)}.'
    )
  return _GSM8K_SPLITS[split]


def _take(rows, limit):
  return rows[:limit] if limit else rows


def load_tfds(split, data_dir=None, limit=0):
  """Loads GSM8K through TensorFlow Datasets.

  Args:
    split: 'train', or 'eval' / 'test' (GSM8K's test split).
    data_dir: TFDS data directory; None for the TFDS default.
    limit: Keep the first `limit` examples (0 = all).

  Returns:
    A list of {'question', 'answer'} dicts.

  Raises:
    RuntimeError: if TFDS cannot load (e.g. no network to download it).
  """
  tfds_split = _gsm8k_split(split)
  if importlib.util.find_spec('tensorflow') is None:
    raise DataError(
        "data.source='gsm8k_tfds' reads GSM8K through TensorFlow Datasets, "
        'which needs TensorFlow (not installed by requirements.txt): pip '
        "install tensorflow-cpu==2.21.0, or use data.source='gsm8k_hf'.")
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  if limit:
    tfds_split = f'{tfds_split}[:{limit}]'
  try:
    ds = tfds.load('gsm8k', split=tfds_split, data_dir=data_dir or None)
    rows = [example(r['question'], r['answer']) for r in tfds.as_numpy(ds)]
  except Exception as e:  # Download / preparation errors vary by TFDS version.
    raise RuntimeError(
        f"Could not load GSM8K from TFDS (tfds.load('gsm8k', split="
        f"{tfds_split!r}, data_dir={data_dir or None!r})): {e}. "
        + _OFFLINE_HINT
    ) from e
  logging.info('Loaded %s GSM8K %s examples from TFDS.', len(rows), split)
  return rows


def _hf_files(path, hf_split):
  """The parquet files of `hf_split` in a local copy of openai/gsm8k."""
  pattern = f'main/{hf_split}-*.parquet'
  files = storage.glob(path, pattern) if storage.exists(path) else []
  if not files:
    raise FileNotFoundError(
        f'data.path={path!r} holds no GSM8K {hf_split} files ({pattern}); '
        'point it at a copy of the Hugging Face dataset (hf download '
        'openai/gsm8k --repo-type=dataset --local-dir=DIR), or leave it empty '
        'to read openai/gsm8k from the Hub.')
  return files


def load_hf(split, limit=0, path=''):
  """Loads GSM8K ('main' config) through Hugging Face `datasets`.

  Args:
    split: 'train', or 'eval' / 'test' (GSM8K's test split).
    limit: Keep the first `limit` examples (0 = all).
    path: A copy of the dataset's files, as the Hub lays them out
      (`main/train-*.parquet`, `main/test-*.parquet`); '' reads
      'openai/gsm8k' from the Hub (or its cache, also offline).

  Returns:
    A list of {'question', 'answer'} dicts.

  Raises:
    FileNotFoundError: `path` holds no parquet files of the split.
    DataError: the files have no question or answer column.
    RuntimeError: if the dataset cannot be loaded; HubUnreachable (a
      RuntimeError) when it is read from the Hub (`path` empty).
  """
  hf_split = _gsm8k_split(split)
  import datasets  # pylint: disable=g-import-not-at-top

  where = "load_dataset('openai/gsm8k', 'main')"
  selected = f'{hf_split}[:{limit}]' if limit else hf_split
  try:
    if path:
      where = f'the parquet files of {path!r}'
      ds = datasets.load_dataset(
          'parquet', data_files={hf_split: _hf_files(path, hf_split)},
          split=selected)
    else:
      ds = datasets.load_dataset('openai/gsm8k', 'main', split=selected)
  except FileNotFoundError:
    raise
  except Exception as e:  # Hub, network and cache errors vary by version.
    raise (RuntimeError if path else HubUnreachable)(
        f'Could not load GSM8K from Hugging Face ({where}, split='
        f'{selected!r}): {e}. ' + _OFFLINE_HINT
    ) from e
  missing = [c for c in ('question', 'answer') if c not in ds.column_names]
  if missing:
    raise DataError(
        f'GSM8K from {where} has no column(s) {missing}; it has '
        f'{ds.column_names}. Point data.path at a copy of openai/gsm8k.')
  rows = [example(r['question'], r['answer']) for r in ds]
  logging.info('Loaded %s GSM8K %s examples from Hugging Face.', len(rows),
               split)
  return rows


def read_jsonl(path):
  """Returns ([row, ...], ['line N', ...])."""
  rows, where = [], []
  with storage.open_file(path, 'r', encoding='utf-8') as f:
    for line_number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      where.append(f'line {line_number}')
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise ValueError(
            f'{path}:{line_number} is not valid JSON ({e}); every line of a '
            'JSONL file must be one JSON object.'
        ) from e
  return rows, where


def read_parquet(path):
  """Returns ([row, ...], ['row N', ...])."""
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  with storage.open_file(path, 'rb') as f:
    rows = pq.read_table(f).to_pylist()
  return rows, [f'row {i}' for i in range(len(rows))]


BAD_ROWS = ('error', 'skip')
# Not a config value: `main --print_prompts` shows every row's prompt, also
# rows a run refuses (their answers are not what it shows), and every row of
# a single file too small for its held-out rows (pipeline._load_local).
KEEP_BAD_ROWS = 'keep'
_DIGIT = re.compile(r'[0-9]')


def row_problem(row):
  """Why an example cannot train (a phrase), or '' if it can."""
  if not row['question'] or row['question'] == 'None':
    return 'its question is empty'
  if not _DIGIT.search(row['answer']):
    return (f"its answer {row['answer'][:40]!r} has no number (no reward "
            'could ever score it)')
  return ''


def load_file(path, file_format='jsonl', prompt_column='question',
              answer_column='answer', limit=0, bad_rows='error'):
  """Loads question/answer rows from a local JSONL or parquet file.

  Args:
    path: The file.
    file_format: 'jsonl' or 'parquet'.
    prompt_column: Field holding the question.
    answer_column: Field holding the answer (GSM8K style or a plain value).
    limit: Keep the first `limit` rows (0 = all).
    bad_rows: A row whose question is empty (or null) or whose answer has no
      digit: 'error' refuses the file naming the row, 'skip' drops such
      rows and logs how many.

  Returns:
    A list of {'question', 'answer'} dicts, with 'type' where the row has a
    'type' field (evaluate --by_type groups by it).

  Raises:
    FileNotFoundError: if `path` does not exist.
    ValueError: on an unknown format, a missing column or (with
      bad_rows='error') a bad row.
  """
  readers = {'jsonl': read_jsonl, 'parquet': read_parquet}
  if file_format not in readers:
    raise ValueError(
        f'Unknown file format {file_format!r}; expected one of '
        f'{sorted(readers)}.'
    )
  if not path:
    raise ValueError(
        f"data.source '{file_format}' needs data.path set to a "
        f'{file_format} file (local or gs://).'
    )
  if not storage.exists(path):
    raise FileNotFoundError(
        f'No {file_format} file at data.path={path!r}; check the path.'
    )
  if bad_rows not in BAD_ROWS + (KEEP_BAD_ROWS,):
    raise ValueError(f'bad_rows={bad_rows!r} is not one of {BAD_ROWS}.')
  rows, where = readers[file_format](path)
  examples, skipped = [], 0
  for index, row in enumerate(_take(rows, limit)):
    if not isinstance(row, dict):
      raise DataError(
          f'Row {index} of {path} is a {type(row).__name__}, not an object '
          'with named columns.'
      )
    missing = [c for c in (prompt_column, answer_column) if c not in row]
    if missing:
      raise DataError(
          f'Row {index} of {path} has no column(s) {missing}; it has '
          f'{sorted(row)}. Set data.prompt_column / data.answer_column to the '
          'question and answer columns.'
      )
    question, answer = row[prompt_column], row[answer_column]
    loaded = example('' if question is None else question,
                     '' if answer is None else answer)
    problem = row_problem(loaded)
    if problem and bad_rows == 'error':
      raise DataError(
          f'{path} {where[index]}: {problem}. Fix or remove the row, or set '
          "data.bad_rows='skip' to drop such rows (they are counted)."
      )
    if problem and bad_rows != KEEP_BAD_ROWS:
      skipped += 1
      continue
    if row.get('type') is not None:  # Grouped by evaluate --by_type.
      loaded['type'] = str(row['type'])
    examples.append(loaded)
  if skipped:
    logging.warning(
        'Skipped %s of %s rows of %s with an empty question or an answer '
        "without a number (data.bad_rows='skip').", skipped,
        skipped + len(examples), path)
  logging.info('Loaded %s examples from %s.', len(examples), path)
  return examples
