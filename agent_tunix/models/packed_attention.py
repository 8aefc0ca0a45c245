"""Gemma 3 attention for packed rows: the sliding window counted in positions.

tunix's Gemma 3 attention cuts a sliding-window layer's keys by a band of
columns (|query column - key column| < window). In a padded row a token's
column and its position differ by the left pad, the same for every token,
so the band is the window. In packed rows (`rl.packing`) a group's
completions follow one another after their shared prompt, so a later
completion's prompt keys lie further away in columns than in positions,
and the band would cut keys the model sees.

Here the mask says it: an int mask with NEAR (visible to every layer: the
key's position is within the window of the query's) and FAR (visible to
global layers only), 0 elsewhere. `PackedAttention` reads it per layer
and lifts tunix's column band; everything else is tunix's block.
Installed only on the model of a packed pass (`packed_attention_graph`).
"""

import jax.numpy as jnp
from tunix.models.gemma3 import model as gemma3_lib

from agent_tunix.models import decode

# Mask values: visible to global layers only; visible to every layer.
FAR, NEAR = 1, 2


def window_mask(visible, query_positions, key_positions, window):
  """The int mask of a [B, T, S] bool `visible`: NEAR where the key is
  less than `window` positions before the query (None: no window), FAR
  where it is further, 0 where not visible."""
  if window is None:
    return jnp.where(visible, NEAR, 0).astype(jnp.int8)
  near = (query_positions[:, :, None] - key_positions[:, None, :]) < window
  return jnp.where(visible, jnp.where(near, NEAR, FAR), 0).astype(jnp.int8)


class PackedAttention(gemma3_lib.Attention):
  """tunix's attention on a `window_mask`: a sliding-window layer sees the
  NEAR keys, a global layer every visible one."""

  def block(self, x, segment_pos, cache, attn_mask):
    if self.attn_type != gemma3_lib.AttentionType.LOCAL_SLIDING:
      return super().block(x, segment_pos, cache, attn_mask >= FAR)
    window = self.sliding_window_size
    # tunix's band then spans the whole row and cuts nothing.
    self.sliding_window_size = max(attn_mask.shape[-2:]) + 1
    try:
      return super().block(x, segment_pos, cache, attn_mask == NEAR)
    finally:
      self.sliding_window_size = window


def packed_attention_graph(model):
  """Within the block, `model`'s attention layers are PackedAttention;
  their classes are restored after."""
  return decode.attention_class(model, PackedAttention)
