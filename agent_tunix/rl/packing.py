"""Padding-free log-prob passes: a prompt group's real tokens in one row.

Layer: rl; may import models.

A padded update batch pays for its bucket: every row runs C completion
columns (the bucket of the longest completion), and the vocabulary
projection runs on all of them. A packed pass runs on the tokens that
exist. Each group of G rows that share a prompt (G = 1 without prompt
sharing) runs its prompt once, then its completions' real tokens packed
into one tail row:

    padded    [pad p p p | c1 c1 pad pad]    (G rows of P + C)
              [pad p p p | c2 c2 c2  pad]
    packed    [pad p p p]                    (the prompt once, P columns,
              [c1 c1 c2 c2 c2 | pad]          its KV cache; then the tail)

Each token keeps its padded position (each completion continues from the
prompt), and the tail attends to the prompt's cache and to itself by
segment: a completion token sees the prompt and its own completion before
it. A sliding-window layer counts its window in positions
(`models.packed_attention`). Each counted completion token
(completion_mask > 0) gets a slot; the hidden states that predict the
slots' tokens are gathered ([groups, slots, D]) and only they go through
the vocabulary projection. The log-probs come back in the padded [N, C]
layout (0 where nothing is counted), so the loss, its aggregation and the
metrics are those of the padded batch. It is the padded computation, in
another order of float sums, provided each counted token follows a real
token of its row (true of single-turn completions and of episodes, whose
inserts are real tokens).

The packed shape (`Packing`: tail width, slots a group) is static: the
host computes what a batch needs (`for_batch`) and rounds it up to a few
sizes an octave (`bucket`), and each shape compiles once. A batch carries
its `Packing` (None: padded); Gemma 3 only (`supported`).
"""

import dataclasses
import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agent_tunix.models import decode
from agent_tunix.models import families
from agent_tunix.models import lora
from agent_tunix.models import packed_attention

# Sizes below this are rounded up to a multiple of it; above, to one of
# four sizes an octave (`bucket`).
QUANTUM = 16


@dataclasses.dataclass(frozen=True)
class Packing:
  """The static shape of a packed batch.

  Attributes:
    width: columns of a group's tail row (its completions' real tokens).
    slots: counted completion tokens a group holds; a multiple of the
      group size.
  """

  width: int
  slots: int


def bucket(n: int, limit: int, quantum: int = QUANTUM) -> int:
  """n rounded up to a multiple of `quantum`, and above 8 quanta to a
  quarter of its octave (at most 25% over n), capped at `limit`."""
  step = quantum
  while n > 8 * step:
    step *= 2
  return max(1, min(-(-n // step) * step, limit))


def supported(model) -> bool:
  """Whether packed passes run for `model` (a tunix Gemma 3)."""
  cfg = getattr(model, 'config', None)
  return (cfg is not None and families.of_config(cfg) is families.GEMMA3
          and decode.uses_step_attention(model))


def needs(input_mask, completion_mask, group: int) -> tuple[int, int]:
  """(tail width, counted tokens) the largest group of a host batch needs.

  Args:
    input_mask: [N, P + C] True on real tokens.
    completion_mask: [N, C] 1 on counted completion tokens.
    group: rows per shared prompt (contiguous); divides N.
  """
  completion_len = np.shape(completion_mask)[1]
  real = np.asarray(input_mask, bool)[:, -completion_len:].sum(axis=1)
  counted = (np.asarray(completion_mask) > 0).sum(axis=1)
  return (int(real.reshape(-1, group).sum(axis=1).max(initial=1)),
          int(counted.reshape(-1, group).sum(axis=1).max(initial=1)))


def for_batch(input_mask, completion_mask, group: int,
              reduce_max=lambda x: x) -> Packing:
  """The `Packing` of a host batch: what its largest group needs, bucketed.

  Args:
    input_mask, completion_mask: the batch's host masks.
    group: rows per shared prompt.
    reduce_max: int array -> its maximum over every process (the packed
      shape is the same on all).
  """
  most = group * np.shape(completion_mask)[1]
  width, counted = (int(v) for v in reduce_max(
      np.array(needs(input_mask, completion_mask, group))))
  slots = -(-bucket(counted, most) // group) * group
  return Packing(bucket(width, most), slots)


def padding_share(input_mask, completion_mask, group: int) -> dict:
  """Of a host batch's completion columns, the share that are padding.

  'padded': the padded rows' C columns a row; 'packed': the tail rows at
  this batch's `Packing`. (The prompt runs once a group on both.)
  """
  rows, completion_len = np.shape(completion_mask)
  real = np.asarray(input_mask, bool)[:, -completion_len:].sum()
  packed = rows // group * for_batch(input_mask, completion_mask, group).width
  return {'padded': 1.0 - real / (rows * completion_len),
          'packed': 1.0 - real / packed}


def _group_layout(tokens, real, counted, completion_len, packing, window):
  """One group's rows: tokens/real [G, L], counted [G, C] -> a dict of
  the prompt's and the tail's tokens, positions and masks, the slots'
  sources (columns of [prompt | tail]) and targets [S], and each [G, C]
  position's slot (S = none)."""
  group, length = tokens.shape
  prompt_len = length - completion_len
  width, slots = packing.width, packing.slots
  prompt_real = real[0, :prompt_len]
  comp_real = real[:, prompt_len:].reshape(-1)
  dest = jnp.where(comp_real, jnp.cumsum(comp_real) - 1, width)
  prompt_pos = jnp.maximum(jnp.cumsum(prompt_real) - 1, 0)
  comp_pos = prompt_real.sum() + jnp.cumsum(real[:, prompt_len:], axis=1) - 1
  segments = jnp.repeat(jnp.arange(1, group + 1, dtype=jnp.int32),
                        completion_len)

  def place(values, fill):
    return jnp.full(width, fill, values.dtype).at[dest].set(
        values.astype(jnp.int32), mode='drop')

  tail_pos = place(comp_pos.reshape(-1), 0)
  tail_seg = place(segments, -1)
  # Keys: the prompt's columns, then the tail's.
  key_pos = jnp.concatenate([prompt_pos, tail_pos])
  key_seg = jnp.concatenate([jnp.where(prompt_real, 0, -1), tail_seg])
  columns = jnp.arange(prompt_len + width)
  prompt_sees = (columns[None, :] <= columns[:prompt_len, None]) & (
      key_seg[None, :] == 0)
  tail_sees = (tail_seg[:, None] >= 0) & (
      (key_seg[None, :] == 0) | ((key_seg[None, :] == tail_seg[:, None])
                                 & (columns[None, :] <= columns[prompt_len:,
                                                                None])))
  # For each completion column, the column (of [prompt | tail]) of the
  # last real token before it: its hidden state predicts the token.
  row_column = jnp.concatenate([
      jnp.broadcast_to(jnp.arange(prompt_len), (group, prompt_len)),
      prompt_len + dest.reshape(group, completion_len)], axis=1)
  last = jax.lax.cummax(jnp.where(real, jnp.arange(length), -1), axis=1)
  before = last[:, prompt_len - 1:length - 1]
  source = jnp.take_along_axis(row_column, jnp.maximum(before, 0), axis=1)
  counted = (counted & (before >= 0)).reshape(-1)
  slot = jnp.where(counted, jnp.cumsum(counted) - 1, slots)

  def to_slots(values):
    return jnp.zeros(slots, jnp.int32).at[slot].set(
        values.reshape(-1).astype(jnp.int32), mode='drop')

  def mask(sees, query_pos):
    return packed_attention.window_mask(sees[None], query_pos[None],
                                        key_pos[None], window)[0]

  return {
      'prompt_tokens': tokens[0, :prompt_len],
      'prompt_positions': prompt_pos.astype(jnp.int32),
      'prompt_mask': mask(prompt_sees, prompt_pos),
      'tail_tokens': place(tokens[:, prompt_len:].reshape(-1), 0),
      'tail_positions': tail_pos,
      'tail_mask': mask(tail_sees, tail_pos),
      'source': to_slots(source),
      'target': to_slots(tokens[:, prompt_len:]),
      'slot': slot.reshape(group, completion_len),
  }


def layout(tokens, input_mask, completion_mask, group, packing, window):
  """`_group_layout` of every group of a batch ([N / G, ...] arrays)."""
  rows = tokens.shape[0]

  def grouped(x):
    return x.reshape(rows // group, group, *x.shape[1:])

  return jax.vmap(functools.partial(
      _group_layout, completion_len=completion_mask.shape[1],
      packing=packing, window=window))(
          grouped(tokens), grouped(input_mask.astype(jnp.bool_)),
          grouped(completion_mask > 0))


def hidden_states(model, rows, use_lora=True):
  """[R, P + W, D] final hidden states of the prompts, then the tails.

  The prompt runs once into a KV cache of P + W columns; the tail runs on
  top of it.
  """
  call = lora.model_call(model, use_lora)
  cfg = model.config
  count, prompt_len = rows['prompt_tokens'].shape
  size = prompt_len + rows['tail_tokens'].shape[1]
  dtype = model.embedder.input_embedding[...].dtype
  shape = (count, size, cfg.num_kv_heads, cfg.head_dim)
  cache = {f'layer_{i}': {'k': jnp.zeros(shape, dtype),
                          'v': jnp.zeros(shape, dtype),
                          'end_index': jnp.zeros((count,), jnp.int32)}
           for i in range(cfg.num_layers)}

  def forward(module):
    with packed_attention.packed_attention_graph(module):
      _, filled = call(module, rows['prompt_tokens'],
                       rows['prompt_positions'], cache, rows['prompt_mask'],
                       output_hidden_states=True)
      call(module, rows['tail_tokens'], rows['tail_positions'], filled,
           rows['tail_mask'], output_hidden_states=True)

  _, sown = nnx.capture(forward, nnx.Intermediate)(model)
  prompt, tail = sown['all_hidden_states'].get_value()
  return jnp.concatenate([prompt, tail], axis=1)


def unpack(values, slot, rows):
  """[R, S] slot values -> [N, C] in the padded layout (0: no slot)."""
  padded = jnp.pad(values, ((0, 0), (0, 1)))
  group_rows, group, completion_len = slot.shape
  out = jnp.take_along_axis(padded, slot.reshape(group_rows, -1), axis=1)
  return out.reshape(rows, completion_len)


def token_logps(model, tokens, input_mask, completion_mask, chunk_size,
                logps_of, packing, use_lora=True, compute_entropy=False,
                group=1):
  """Log-probs (and entropy) [N, C] of the counted completion tokens,
  from packed rows; 0 at positions that are not counted.

  Args:
    model: a tunix Gemma 3 (`supported`).
    tokens, input_mask: [N, P + C] the padded batch.
    completion_mask: [N, C].
    chunk_size: chunk of the vocabulary projection.
    logps_of: (hidden [B, T, D], targets [B, T], chunk_size,
      compute_entropy) -> (logps, entropy): the projection.
    packing: the batch's `Packing`.
    use_lora: apply the LoRA adapters.
    compute_entropy: also return the entropy.
    group: rows per shared prompt (contiguous).
  """
  rows = layout(tokens, input_mask, completion_mask, group, packing,
                model.config.sliding_window_size)
  hidden = hidden_states(model, rows, use_lora)
  picked = jnp.take_along_axis(hidden, rows['source'][..., None], axis=1)
  count, slots, dim = picked.shape
  # [groups * G, slots / G]: blocks of the padded pass's [rows, chunk].
  logps, entropy = logps_of(
      picked.reshape(count * group, slots // group, dim),
      rows['target'].reshape(count * group, slots // group),
      chunk_size, compute_entropy)
  batch = tokens.shape[0]
  logps = unpack(logps.reshape(count, slots), rows['slot'], batch)
  if entropy is not None:
    entropy = unpack(entropy.reshape(count, slots), rows['slot'], batch)
  return logps, entropy
