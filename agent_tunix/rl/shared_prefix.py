"""Prefill a prompt batch's common leading tokens once, not once per row.

Layer: rl; may import models.

A tool prompt opens with the same few hundred tokens in every row (the tool
list and the worked episodes, 351 of the tools preset's 388-420), and
the sampler's prefill ran them through the model for every row of every
batch. Here the prompts' longest common leading run (rounded down to a
multiple of `BLOCK` columns, so a run compiles for few lengths) is computed
on the host, the batch is laid out with that run first in every row:

    left-padded (as the pipeline gives it)   [pad pad | prefix | question]
    for the sampler                          [prefix | pad pad | question]

and the prefill runs the prefix on one row (on a mesh, one row per shard
of the rows: each device computes it once), copies its KV cache to every
row, then runs the remaining columns of all rows against it.

It is the same computation as the full prefill: a token's key and value
depend on the tokens before it and their positions, and the positions come
from the mask (`build_positions_from_mask`), not from the columns, so the
prefix has the same positions in both layouts and the pad between it and
the question is masked out like the left pad was. Attention sums over the
same keys in another column order (float rounding only). Two limits
(`usable`): tunix's Gemma 3 sliding-window layers count the window in
columns, and the moved pad widens the distance in columns between question
and prefix, so every column of the run (prompt and completion) must fit in
the window, where the window excludes nothing; and Gemma 4 is left out.
On the tools preset, whose prompts share a 344-column prefix, this about
halves an evaluation batch's prefill, with the same greedy episodes.
"""

import jax
import jax.numpy as jnp
import numpy as np

from agent_tunix.models import families

# The shared run is rounded down to a multiple of this many columns (and is
# not used below it): a batch compiles the prefill for its run's length.
BLOCK = 8


def usable(model_config, total_columns):
  """Whether a run of `total_columns` (prompt + completion) may share its
  prefix: a Gemma 3 whose sliding window (if any) every column fits in.

  Not Gemma 4: its local layers keep a ring-buffer KV cache of the window,
  which a prefill continued from a cache does not match (its completions
  differed from the full prefill's on the tiny Gemma 4).
  """
  if families.of_config(model_config) is not families.GEMMA3:
    return False
  window = getattr(model_config, 'sliding_window_size', None)
  return window is None or total_columns <= window


def _first_tokens(prompt_tokens, pad_id):
  """Index of each row's first non-pad column (its width when all pad)."""
  real = prompt_tokens != pad_id
  return np.where(real.any(axis=1), real.argmax(axis=1),
                  prompt_tokens.shape[1])


def prefix_columns(prompt_tokens, pad_id, block=BLOCK):
  """Length of the leading run every row shares, as the prefill uses it.

  Args:
    prompt_tokens: int [N, P] left-padded prompt rows.
    pad_id: the pad token id.
    block: the run is rounded down to a multiple of this.

  Returns:
    The shared run's columns: a multiple of `block`, short enough that
    every row keeps at least one token after it (the last prompt position,
    whose logits give the first completion token); 0 = nothing to share.
  """
  prompt_tokens = np.asarray(prompt_tokens)
  if len(prompt_tokens) < 2:
    return 0
  starts = _first_tokens(prompt_tokens, pad_id)
  width = prompt_tokens.shape[1]
  shortest = int(width - starts.max())
  if shortest < 2:
    return 0
  first = prompt_tokens[0, starts[0]:starts[0] + shortest]
  same = shortest - 1
  for row, start in zip(prompt_tokens[1:], starts[1:]):
    differs = np.flatnonzero(row[start:start + same] != first[:same])
    if differs.size:
      same = int(differs[0])
  return same // block * block


def prefix_first(prompt_tokens, pad_id, columns):
  """Rows with their first `columns` tokens moved to the front.

  [pad * k, prefix, rest] -> [prefix, pad * k, rest]: the rest stays in its
  columns (so every row still ends at the last column).
  """
  prompt_tokens = np.asarray(prompt_tokens)
  out = np.full_like(prompt_tokens, pad_id)
  for i, start in enumerate(_first_tokens(prompt_tokens, pad_id)):
    out[i, :columns] = prompt_tokens[i, start:start + columns]
    out[i, start + columns:] = prompt_tokens[i, start + columns:]
  return out


def prefill(run, tokens, positions, cache, attention_mask, columns,
            constrain_rows, prefix_rows=1):
  """The prompt forward with the first `columns` columns run on one row
  (or one row per row shard of a mesh: `prefix_rows`).

  Args:
    run: (tokens, positions, cache, attention_mask) -> (cache, hidden of
      the last position): the model's prompt forward.
    tokens, positions: [N, P] prompt rows laid out by `prefix_first`.
    cache: the empty KV cache of the N rows.
    attention_mask: the prompt's prefill mask [N, P, cache size].
    columns: the shared run's length (`prefix_columns`).
    constrain_rows: places a per-row array on the mesh.
    prefix_rows: rows the shared run is computed on: the number of shards
      the rows are split in (each device computes it once; a single row
      would not split over the batch axes). Divides N.

  Returns:
    What `run` on the whole prompt returns: the filled cache and the last
    position's hidden state of every row.
  """
  rows, k = tokens.shape[0], prefix_rows
  shared, _ = run(tokens[:k, :columns], positions[:k, :columns],
                  jax.tree.map(lambda x: constrain_rows(x[:k]), cache),
                  attention_mask[:k, :columns])
  # The k rows are equal: row shard i repeats its own row.
  every_row = jax.tree.map(
      lambda x: constrain_rows(jnp.repeat(x, rows // k, axis=0)), shared)
  return run(tokens[:, columns:], positions[:, columns:], every_row,
             attention_mask[:, columns:])
