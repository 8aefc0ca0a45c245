"""Grain input pipeline: examples -> prompts -> token batches.

Layer: data (bottom); may import agent, models, rewards, tpu, storage and
cli, and imports only its own modules.

`load_examples(config, split)` reads question/answer examples from
`data.source` (one of `SOURCES`, or a mixture 'name:weight,...');
`make_train_iterator` turns the train split into this process's
checkpointable Grain iterator (`get_state()` / `set_state()`) of batches;
`eval_examples` gives the held-out split with its prompts.

A batch (training.batch_size // process_count prompts):
  'prompt', 'question', 'answer', 'reasoning' (the worked solution, '' when
    the source has none), 'rubric' (rubric rows' items as a JSON list,
    '[]' otherwise), 'reference' (a rubric row's reference answer, or ''):
    object arrays of str, shape [b].
  'prompt_tokens': int32 [b, generation.max_prompt_length], BOS first, left
    padded with 0.
  'prompt_mask': bool, same shape, True on real tokens.

Design notes: docs/data.md, 'Train and eval splits'.
"""

import functools
import json
import os

from absl import logging
import grain
import numpy as np

from agent_tunix.data import few_shot
from agent_tunix.data import gsm8k
from agent_tunix.data import prompts
from agent_tunix.data import rubrics
from agent_tunix.data import synthetic

SOURCES = ('synthetic', 'synthetic_unseen', 'gsm8k_tfds', 'gsm8k_hf',
           'jsonl', 'parquet', 'hf_rubrics')
# Sources of rubric rows (data.task='rubric').
RUBRIC_SOURCES = ('jsonl', 'parquet', 'hf_rubrics')
TASKS = ('math', 'rubric')
SPLITS = ('train', 'eval')
PAD_ID = 0
# Threads and buffered batches for reading; the data is already in memory.
_READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)


def parse_source(source):
  """Parses data.source into [(name, weight), ...].

  Args:
    source: 'name' or 'name:weight,name:weight,...' (weights > 0; a missing
      weight means 1).

  Raises:
    ValueError: on an unknown name, a bad or non-positive weight, or a repeat.
  """
  components = []
  for part in source.split(','):
    part = part.strip()
    name, _, weight_text = part.partition(':')
    name = name.strip()
    if name not in SOURCES:
      raise ValueError(
          f'Unknown data source {name!r} in data.source={source!r}; expected '
          f"names from {SOURCES}, optionally weighted as 'name:weight,...'."
      )
    try:
      weight = float(weight_text) if weight_text.strip() else 1.0
    except ValueError:
      weight = float('nan')
    if not weight > 0:  # Also catches NaN.
      raise ValueError(
          f'Bad weight {weight_text!r} for {name!r} in data.source='
          f'{source!r}; weights must be positive numbers.'
      )
    if name in (n for n, _ in components):
      raise ValueError(f'Source {name!r} appears twice in {source!r}.')
    components.append((name, weight))
  return components


def proportional_counts(weights, total):
  """Splits `total` into integer counts proportional to `weights`.

  Floors each share and gives the remaining units to the largest fractional
  parts (earlier components first on ties), so the counts sum to `total`.
  """
  weights = np.asarray(weights, dtype=np.float64)
  shares = total * weights / weights.sum()
  counts = np.floor(shares).astype(int)
  order = np.argsort(-(shares - counts), kind='stable')
  counts[order[: total - counts.sum()]] += 1
  return [int(c) for c in counts]


def _split_count(config, split):
  if split == 'train':
    return config.data.num_train_examples
  return config.data.num_eval_examples


def split_path(path, split):
  """The local file data.path `path` holds `split` ('train' or 'eval') in.

  '{split}' in the path becomes 'train' or 'test'; a path without it is one
  file serving both splits.
  """
  if split not in SPLITS:
    raise ValueError(f'Unknown split {split!r}; expected one of {SPLITS}.')
  return path.replace('{split}', 'train' if split == 'train' else 'test')


def _rubric_columns(config):
  return dict(prompt_column=config.data.prompt_column,
              rubric_column=config.data.rubric_column,
              reference_column=config.data.reference_column)


def _load_local(name, config, split, limit):
  """Loads a split of a local JSONL / parquet file."""
  path = config.data.path
  columns = dict(file_format=name, bad_rows=config.data.bad_rows)
  if config.data.task == 'rubric':
    columns.update(_rubric_columns(config), task='rubric')
  else:
    columns.update(prompt_column=config.data.prompt_column,
                   answer_column=config.data.answer_column)
  if '{split}' in path:
    return _load_file(split_path(path, split), limit=limit, **columns)
  rows = _whole_file(path, **columns)
  held_out = config.data.num_eval_examples
  if not 0 < held_out < len(rows) and (
      config.data.bad_rows == gsm8k.KEEP_BAD_ROWS):
    return rows[:limit] if limit else rows  # A preview: every row shown.
  if not 0 < held_out < len(rows):
    raise ValueError(
        f'data.path={path!r} has {len(rows)} rows; to hold out the last '
        f'data.num_eval_examples={held_out} rows for eval it must be between '
        "1 and the row count. Or put '{split}' in data.path for separate "
        'train/test files.'
    )
  rows = rows[:-held_out] if split == 'train' else rows[-held_out:]
  return rows[:limit] if limit else rows


def _whole_file(path, **columns):
  """All rows of a file that serves both splits, read once per version.

  Training reads it for the eval split, then for the train split; the
  second call gets the first's rows (a new list of the same dicts) unless
  the file has changed since, so a big file is parsed once and its
  skipped-rows warning logged once.
  """
  try:
    stat = os.stat(path)
    version = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
  except OSError:
    version = None  # load_file says what is wrong.
  return list(_cached_file(path, version, tuple(sorted(columns.items()))))


@functools.lru_cache(maxsize=2)
def _cached_file(path, version, columns):
  del version  # Only part of the cache key.
  return tuple(_load_file(path, **dict(columns)))


def _load_file(path, task='math', **columns):
  """Math rows (question, answer) or rubric rows of a local file."""
  if task == 'rubric':
    return rubrics.load_file(path, **columns)
  return gsm8k.load_file(path, **columns)


def synthetic_templates(config):
  """data.synthetic_templates as a tuple of names (() = the difficulty's)."""
  names = config.data.get('synthetic_templates', '')
  return tuple(n.strip() for n in names.split(',') if n.strip())


def _load_source(name, config, split, limit):
  """Loads up to `limit` (0 = all) examples of `split` from one source."""
  if name in ('synthetic', 'synthetic_unseen'):
    if limit <= 0:
      raise ValueError(
          'Synthetic data is generated, so it needs a count: set '
          'data.num_train_examples and data.num_eval_examples > 0.'
      )
    return synthetic.generate(
        split, limit, config.data.difficulty, config.data.seed,
        unseen=name == 'synthetic_unseen',
        templates=synthetic_templates(config) if name == 'synthetic' else ())
  if name == 'gsm8k_tfds':
    return gsm8k.load_tfds(split, config.data.path or None, limit)
  if name == 'gsm8k_hf':
    return gsm8k.load_hf(split, limit, config.data.path)
  if name == 'hf_rubrics':
    return rubrics.load_hf(config.data.path, split, limit,
                           config.data.bad_rows, **_rubric_columns(config))
  return _load_local(name, config, split, limit)


def load_examples(config, split):
  """Returns the examples of a split as [{'question', 'answer', ...}, ...].

  The train split without the rows data.few_shot='train:K' shows as worked
  examples (`few_shot.hold_out`).

  Args:
    config: The full config (reads the data section).
    split: 'train' or 'eval'.

  Raises:
    ValueError: on a bad source, split or count, or when a mixture component
      has fewer examples than its share.
  """
  rows = load_split(config, split)
  return few_shot.hold_out(config, rows) if split == 'train' else rows


def load_split(config, split):
  """All examples of a split, few-shot rows included (`load_examples`)."""
  if split not in SPLITS:
    raise ValueError(f'Unknown split {split!r}; expected one of {SPLITS}.')
  components = parse_source(config.data.source)
  total = _split_count(config, split)
  if len(components) == 1:
    return list(_load_source(components[0][0], config, split, total))
  names = [name for name, _ in components]
  weights = [weight for _, weight in components]
  if total > 0:
    counts = proportional_counts(weights, total)
    parts = [_load_source(n, config, split, c) if c else []
             for n, c in zip(names, counts)]
  else:
    parts = [_load_source(n, config, split, 0) for n in names]
    fractions = np.asarray(weights) / np.sum(weights)
    total = int(min(np.floor(len(p) / f) for p, f in zip(parts, fractions)))
    counts = proportional_counts(weights, total)
  mixed = []
  for name, part, count in zip(names, parts, counts):
    if len(part) < count:
      raise ValueError(
          f'Source {name!r} has {len(part)} {split} examples but its share of '
          f'data.source={config.data.source!r} is {count}; lower the number '
          'of examples or its weight.'
      )
    mixed.extend(part[:count])
  logging.info('Mixed %s %s examples: %s.', len(mixed), split,
               dict(zip(names, counts)))
  order = np.random.default_rng([config.data.seed, 1]).permutation(len(mixed))
  return [mixed[i] for i in order]


def encode_prompt(text, tokenizer, max_length):
  """Returns (left-padded int32 tokens, bool mask), or None if too long.

  The token sequence is BOS followed by `tokenizer.encode(text)`.
  """
  ids = [tokenizer.bos_id()] + [int(t) for t in tokenizer.encode(text)]
  if len(ids) > max_length:
    return None
  tokens = np.full((max_length,), PAD_ID, dtype=np.int32)
  mask = np.zeros((max_length,), dtype=bool)
  tokens[max_length - len(ids):] = ids
  mask[max_length - len(ids):] = True
  return tokens, mask


def rubric_question(question, items, config):
  """The question, after its rubric when data.rubric_in_prompt is on.

  The original pipeline's format_prompt(question, rubric): the policy sees
  the checklist its judge applies (hackable, docs/rubrics.md).
  """
  if not (items and config.data.task == 'rubric'
          and config.data.rubric_in_prompt):
    return question
  return f'Rubric:\n{rubrics.rubric_text(items)}\n\n{question}'


def _prepare(examples, config, tokenizer, turns):
  """Formats (in `turns`, see `prompts.format_prompt`) and tokenises;
  returns (records, number dropped as too long)."""
  max_length = config.generation.max_prompt_length
  records, dropped = [], 0
  for example in examples:
    prompt = prompts.format_prompt(
        rubric_question(example['question'], example.get('rubric'), config),
        config, turns)
    encoded = encode_prompt(prompt, tokenizer, max_length)
    if encoded is None:
      dropped += 1
      continue
    records.append({
        'prompt': prompt,
        'question': example['question'],
        'answer': example['answer'],
        # The worked solution where the source has one ('' otherwise).
        'reasoning': str(example.get('reasoning', '')),
        # Rubric rows: the items (as JSON) and the reference answer.
        'rubric': json.dumps(example.get('rubric', [])),
        'reference': str(example.get('reference', '')),
        # Synthetic problems name their template and expression shape
        # (evaluate --by_type); '' for other sources.
        'type': str(example.get('type', '')),
        'shape': str(example.get('shape', '')),
        'prompt_tokens': encoded[0],
        'prompt_mask': encoded[1],
    })
  return records, dropped


def _log_dropped(split, dropped, total, config):
  if dropped:
    logging.warning(
        'Dropped %s of %s %s prompts longer than '
        'generation.max_prompt_length=%s tokens.', dropped, total, split,
        config.generation.max_prompt_length,
    )


# The str fields of a batch.
STR_FIELDS = ('prompt', 'question', 'answer', 'reasoning', 'rubric',
              'reference')


def collate(records):
  """Stacks prompt records into one batch dict (str fields as object arrays)."""
  batch = {}
  for key in STR_FIELDS:
    column = np.empty((len(records),), dtype=object)
    column[:] = [r[key] for r in records]
    batch[key] = column
  for key in ('prompt_tokens', 'prompt_mask'):
    batch[key] = np.stack([r[key] for r in records])
  return batch


def make_train_iterator(config, tokenizer, process_index=0, process_count=1,
                        *, turns):
  """Builds this process's checkpointable iterator over train batches.

  Args:
    config: The full config (data, generation, training sections).
    tokenizer: Has `encode(str) -> list[int]` (no BOS) and `bos_id()`.
    process_index: This process's index (jax.process_index()).
    process_count: Number of processes (jax.process_count()).
    turns: the model family's turns (`prompts.format_prompt`).

  Returns:
    (iterator, stats). The iterator yields batch dicts (see module docstring)
    and supports get_state() / set_state(). stats has 'num_examples' (loaded),
    'dropped_long_prompts', 'num_train_examples' (kept), 'steps_per_epoch',
    'num_batches' (over all epochs) and 'per_process_batch_size'.

  Raises:
    ValueError: on a batch size not divisible by process_count, a bad process
      index, data.num_epochs < 1, or fewer kept examples than one batch.
  """
  global_batch = config.training.batch_size
  if not 0 <= process_index < process_count:
    raise ValueError(
        f'process_index={process_index} is outside [0, {process_count}).'
    )
  if global_batch <= 0 or global_batch % process_count:
    raise ValueError(
        f'training.batch_size={global_batch} must be a positive multiple of '
        f'the process count {process_count}.'
    )
  if config.data.num_epochs < 1:
    raise ValueError(
        f'data.num_epochs must be >= 1, got {config.data.num_epochs}.'
    )
  examples = load_examples(config, 'train')
  records, dropped = _prepare(examples, config, tokenizer, turns)
  _log_dropped('train', dropped, len(examples), config)
  if len(records) < global_batch:
    raise gsm8k.DataError(
        f'Only {len(records)} train prompts (of {len(examples)}) fit in '
        f'generation.max_prompt_length={config.generation.max_prompt_length} '
        f'tokens, fewer than training.batch_size={global_batch}; raise '
        'max_prompt_length or use more or shorter examples.'
    )
  num_batches = len(records) * config.data.num_epochs // global_batch
  per_process = global_batch // process_count
  ds = grain.MapDataset.source(records)
  ds = ds.shuffle(seed=config.data.seed).repeat(config.data.num_epochs)
  ds = ds[: num_batches * global_batch]
  ds = ds[process_index::process_count]
  ds = ds.batch(per_process, drop_remainder=True, batch_fn=collate)
  iter_ds = ds.to_iter_dataset(_READ_OPTIONS)
  if config.data.worker_count > 0:
    iter_ds = iter_ds.mp_prefetch(
        grain.MultiprocessingOptions(num_workers=config.data.worker_count)
    )
  stats = {
      'num_examples': len(examples),
      'dropped_long_prompts': dropped,
      'num_train_examples': len(records),
      'steps_per_epoch': len(records) // global_batch,
      'num_batches': num_batches,
      'per_process_batch_size': per_process,
  }
  logging.info('Train data: %s', stats)
  return iter(iter_ds), stats


def eval_examples(config, tokenizer, *, turns):
  """The held-out split as [{'prompt', 'question', 'answer', 'type',
  'shape'}, ...] (type and shape '' except for synthetic problems; rubric
  rows add 'rubric', their items as JSON, and 'reference').

  Prompts (in the model family's `turns`, see `prompts.format_prompt`)
  longer than generation.max_prompt_length tokens (with BOS) are dropped
  and the count is logged.
  """
  examples = load_examples(config, 'eval')
  records, dropped = _prepare(examples, config, tokenizer, turns)
  _log_dropped('eval', dropped, len(examples), config)
  keys = ('prompt', 'question', 'answer', 'type', 'shape')
  if config.data.task == 'rubric':
    keys += ('rubric', 'reference')
  return [{key: r[key] for key in keys} for r in records]
