"""The sampler's graph on CPU: tunix's Gemma 3 modules, rearranged for XLA CPU.

A decode step reads every weight once for a few rows, so its speed is set by
how many bytes XLA CPU moves per step. Compiled as tunix writes it, the
decode loop's body (optimized HLO; tests/decode_test.py checks for these
copies) also copied, every step and in every layer:

  * the KV cache, twice or more: the cache update (dynamic-update-slice)
    fed both the attention dot and the loop's carried cache, so XLA fused
    it twice and copied the buffer it could no longer update in place; and
    the key cache was transposed for the logits dot;
  * the q/kv/qkv and attention-output weights, transposed: their einsums
    contract a middle (or minor-first) axis of the weight, XLA CPU's dot
    wants the contracted axes leading, and the transposes are placed inside
    the loop after loop-invariant code motion has run.

On the 270M at 16 rows and a 512-token cache (302 MB of KV cache, 1.09 GB
of weights) a step took 265 ms with these copies and about 150 ms without
(2-core CPU). This module's classes give the sampler the same computation
without them. `cpu_decode_graph(model)` swaps them into `model` while the
sampler is built (the sampler keeps that graph) and restores the model
after, so the training model keeps tunix's classes. The LoRA adapters stay
the model's own variables, so every update reaches the sampler; only the
transposed copies of the frozen q/kv/qkv weights are the sampler's own
(70 MB on the 270M).

The decode loop also draws each token with this module's sample_top_p:
tunix's top-k / top-p sampling with an exact top-k (block_top_k) that XLA
CPU runs two to six times as fast over the 262144-entry vocabulary (1 to 64
rows); the same tokens for the same key.

The whole graph is used on CPU only. On a TPU or GPU the sampler runs
tunix's graph with DecodeStepAttention alone (`step_attention_graph`): the
compiled TPU decode step wrote every layer's whole KV cache back to HBM
each step (it updated the cache in the chip's on-chip copy), and read all
of a sliding-window layer's cache.
"""

import contextlib

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from tunix.generate import sampler as sampler_lib
from tunix.models.gemma3 import model as gemma3_lib

# Decode steps with this many rows (inclusive) compute the output
# projection as E @ x.T (see ColumnDecodeEmbedder).
COLUMN_DECODE_MIN_ROWS = 2
COLUMN_DECODE_MAX_ROWS = 32

# Compile options of the sampler's decode loop on CPU. XLA's default copy
# insertion copies a loop-carried buffer that is read before its in-place
# update (the KV cache: read by attention, then updated); region analysis
# proves the read comes first and drops the copy.
DECODE_COMPILER_OPTIONS = {'xla_cpu_copy_insertion_use_region_analysis': True}

# block_top_k's block: entries per block whose maximum ranks the block.
TOP_K_BLOCK = 64

_ATTENTION_EINSUMS = ('q_einsum', 'kv_einsum', 'qkv_einsum', 'attn_vec_einsum')


class ColumnDecodeEmbedder(gemma3_lib.Embedder):
  """Embedder whose output projection suits XLA CPU at a few rows.

  A decode step multiplies a few rows x [N, D] by the [V, D] embedding
  (V = 262144). At 2 <= N <= 32, XLA CPU runs x @ E.T more slowly than the
  same product computed as (E @ x.T).T, up to twice as slowly; measured on
  the 270M's embedding, 2-core CPU: 87 vs 44 ms at N = 4, 112 vs 81 ms at
  N = 16, 131 vs 116 ms at N = 32, 238 vs 194 ms at N = 64, 37 vs 36 ms at
  N = 1 (yet a whole decode step at 64 rows was ~7% slower with it in one
  pair of runs, hence the cut at 32; and a whole step at one row, 48-step
  runs on the 270M, took 46-52 ms with x @ E.T against 53 ms with
  E @ x.T, hence one row keeps x @ E.T). The optimization barrier keeps XLA
  from rewriting transpose(E @ x.T) back into x @ E.T. The result is the
  same product; more rows (prefill, log-prob passes) take the parent's path.
  """

  def decode(self, x):
    rows = int(np.prod(x.shape[:-1]))
    if not COLUMN_DECODE_MIN_ROWS <= rows <= COLUMN_DECODE_MAX_ROWS:
      return super().decode(x)
    table = self.input_embedding[...]
    columns = jnp.dot(table, x.reshape(rows, x.shape[-1]).T)
    columns = jax.lax.optimization_barrier(columns)
    return columns.T.reshape(*x.shape[:-1], table.shape[0])


class DecodeStepAttention(gemma3_lib.Attention):
  """Attention whose one-token decode step leaves the KV cache in place.

  tunix writes the new key/value into the cache and then attends over the
  updated cache. Here the step attends over the cache as it was, with the
  new token's own logit and value put in at its slot, and writes the cache
  only for the next step: the updated cache has one reader (the loop), so
  XLA updates it in place. Masks, RoPE, norms, the sliding window and the
  projections are tunix's; the result is the same computation up to the
  order of float sums. The key cache is the left operand of the logits dot,
  contracted on its minor axis, so it is read as stored (not transposed).
  Prefill (several tokens) and cache-less calls run tunix's block.
  """

  def block(self, x, segment_pos, cache, attn_mask):
    if cache is None or x.shape[1] != 1:
      return super().block(x, segment_pos, cache, attn_mask)
    if self.use_qkv_einsum:
      query, key, value = self.qkv_einsum(x)
    else:
      query = self.q_einsum(x)
      key, value = self.kv_einsum(x)
    query = self._query_norm(query)
    key = self._key_norm(key)
    rope = dict(head_dim=self.head_dim, base_frequency=self.rope_base_frequency,
                scale_factor=self.rope_scale_factor)
    query = gemma3_lib.apply_rope(query, segment_pos, **rope)
    query = query * self.query_pre_attn_scalar
    key = gemma3_lib.apply_rope(key, segment_pos, **rope)

    keys, values = cache['k'], cache['v']  # [B, S, K, H], as before the step
    batch, _, num_heads, head_dim = query.shape
    kv_heads = self.num_kv_heads
    groups = num_heads // kv_heads
    full_size = keys.shape[1]
    slot = cache['end_index'][0] % full_size  # Where this token's key goes.
    cache_keys, cache_values, cache_slot = keys, values, slot
    window = (self.sliding_window_size
              if self.attn_type == gemma3_lib.AttentionType.LOCAL_SLIDING
              else None)
    if window:
      attn_mask = attn_mask * gemma3_lib.create_sliding_window_mask(
          attn_mask, sliding_window_size=window)
    if window and window < full_size:
      # Only the window can be attended: read those columns alone (every
      # row's current position is `slot`; tunix's mask, cut the same way,
      # masked the columns left out).
      start = jnp.clip(slot - window + 1, 0, full_size - window)
      keys, values, attn_mask = (
          jax.lax.dynamic_slice_in_dim(x, start, window, axis=axis)
          for x, axis in ((keys, 1), (values, 1), (attn_mask, 2)))
      slot = slot - start
    size = keys.shape[1]
    query = query.reshape(batch, kv_heads, groups, head_dim)
    # [B, K, S, G]: batch (B, K), keys contracted on their minor axis H.
    logits = jax.lax.dot_general(
        keys, query, (((3,), (3,)), ((0, 2), (0, 1)))
    )
    logits = jnp.swapaxes(logits, 2, 3)  # [B, K, G, S]
    own = jnp.einsum('bkgh,bkh->bkg', query, key[:, 0])
    at_slot = jnp.arange(size) == slot
    logits = jnp.where(at_slot, own[..., None], logits)
    # attn_mask [B, 1, S] -> [B, 1, 1, S] against [B, K, G, S].
    logits = jnp.where(attn_mask[:, :, None, :], logits, gemma3_lib.K_MASK)
    probs = jax.nn.softmax(logits, axis=-1).astype(values.dtype)
    own_prob = jnp.sum(jnp.where(at_slot, probs, 0), axis=-1)  # [B, K, G]
    others = jnp.where(at_slot, 0, probs)
    # [B, K, G, H]: batch (B, K), values contracted on their axis S.
    encoded = jax.lax.dot_general(
        others, values, (((3,), (1,)), ((0, 1), (0, 2)))
    )
    encoded = encoded + own_prob[..., None] * value[:, 0, :, None, :]
    output = self.attn_vec_einsum(
        encoded.reshape(batch, 1, num_heads, head_dim)
    )
    index = (0, cache_slot, 0, 0)
    new_cache = {
        'k': jax.lax.dynamic_update_slice(cache_keys, key, index),
        'v': jax.lax.dynamic_update_slice(cache_values, value, index),
        'end_index': cache['end_index'] + 1,
    }
    return new_cache, output


class ContractionMajorEinsum(gemma3_lib.Einsum):
  """tunix's Einsum with its weight stored contracted-axes-first.

  `w` holds the weight transposed so that the axes the einsum contracts come
  first, in their original order, then the others (also in order); the
  einsum is written for that layout with its letters renamed so that
  jnp.einsum contracts the axes in stored order, and the result is
  transposed back to the original output. A dot of x by [contracted...,
  kept...] is what XLA CPU runs without copying the weight. qwix derives
  the LoRA adapter shapes from the weight's contracted and kept axes in
  order, so the model's own adapters fit this einsum unchanged.
  """

  def __call__(self, x):
    y = jnp.einsum(self.einsum_str, x, self.w[...])
    return jnp.transpose(y, self.output_perm)


def contraction_major(einsum_str):
  """(new einsum string, weight permutation, output permutation).

  For tunix's 'x,w->out' einsum: the weight's axes reordered contracted
  first, and the output permutation that restores `out` from the new
  einsum's output (x's kept axes, then the weight's kept axes).
  """
  inputs, out = einsum_str.split('->')
  lhs, rhs = inputs.split(',')
  contracted = [c for c in rhs if c in lhs]
  kept = [c for c in rhs if c not in lhs]
  if any(c in out for c in contracted):
    raise ValueError(f'{einsum_str!r}: batch axes in the weight are not '
                     'supported.')
  new_rhs = ''.join(contracted + kept)
  new_out = ''.join([c for c in lhs if c not in rhs] + kept)
  weight_perm = tuple(rhs.index(c) for c in new_rhs)
  output_perm = tuple(new_out.index(c) for c in out)
  # jnp.einsum contracts shared letters in alphabetical order: rename so
  # that order is the stored one.
  letters = {c: chr(ord('a') + i)
             for i, c in enumerate(dict.fromkeys(new_rhs + lhs))}
  rename = lambda s: ''.join(letters[c] for c in s)
  return (f'{rename(lhs)},{rename(new_rhs)}->{rename(new_out)}',
          weight_perm, output_perm)


def uses_cpu_decode_graph(model, mesh_platform):
  """True on CPU for a tunix Gemma 3 (its embedder and layers' classes)."""
  if mesh_platform != 'cpu':
    return False
  if type(getattr(model, 'embedder', None)) is not gemma3_lib.Embedder:
    return False
  return all(type(layer.attn) is gemma3_lib.Attention and
             all(type(getattr(layer.attn, name, None)) in
                 (gemma3_lib.Einsum, type(None))
                 for name in _ATTENTION_EINSUMS)
             for layer in getattr(model, 'layers', []))


def uses_step_attention(model):
  """True for a tunix Gemma 3 whose layers' attention is tunix's own."""
  layers = getattr(model, 'layers', None) or []
  return bool(layers) and all(type(layer.attn) is gemma3_lib.Attention
                              for layer in layers)


@contextlib.contextmanager
def step_attention_graph(model):
  """Within the block, `model`'s attention is DecodeStepAttention.

  The sampler's graph on a TPU or GPU: the KV cache updated in place (one
  row written per step, not the whole cache copied back) and a sliding
  window layer reading only its window of the cache. The weights and their
  layout are the model's; only the classes change, restored after.
  """
  with attention_class(model, DecodeStepAttention):
    yield model


@contextlib.contextmanager
def attention_class(model, attention):
  """Within the block, every layer's attention is of class `attention`
  (a subclass of tunix's); the classes are restored after."""
  undo = [(layer.attn, type(layer.attn)) for layer in model.layers]
  try:
    for layer in model.layers:
      layer.attn.__class__ = attention
    yield model
  finally:
    for module, cls in undo:
      module.__class__ = cls


@contextlib.contextmanager
def cpu_decode_graph(model):
  """Within the block, `model` is the sampler's CPU graph; restored after.

  Swaps in ColumnDecodeEmbedder, DecodeStepAttention and, for the attention
  einsums, ContractionMajorEinsum with a transposed copy of the weight (an
  unchanged one where the weight is already contracted-first). Build the
  sampler inside: it keeps the graph and variables it was built from.
  """
  undo = []
  try:
    embedder = model.embedder
    undo.append((embedder, type(embedder), {}))
    embedder.__class__ = ColumnDecodeEmbedder
    for layer in model.layers:
      attn = layer.attn
      undo.append((attn, type(attn), {}))
      attn.__class__ = DecodeStepAttention
      for name in _ATTENTION_EINSUMS:
        einsum = getattr(attn, name, None)
        if einsum is None:
          continue
        new_str, weight_perm, output_perm = contraction_major(
            einsum.einsum_str
        )
        undo.append((einsum, type(einsum),
                     {'einsum_str': einsum.einsum_str, 'w': einsum.w}))
        einsum.__class__ = ContractionMajorEinsum
        einsum.einsum_str = new_str
        einsum.output_perm = output_perm
        if weight_perm != tuple(range(len(weight_perm))):
          einsum.w = nnx.Param(jnp.transpose(einsum.w[...], weight_perm))
    yield model
  finally:
    for module, cls, attrs in reversed(undo):
      module.__class__ = cls
      for name, value in attrs.items():
        setattr(module, name, value)
      if 'output_perm' in vars(module):
        del module.output_perm


def block_top_k(x, k, block=TOP_K_BLOCK):
  """jax.lax.top_k over the last axis: the same values and indices, faster.

  XLA CPU's TopK goes through each row serially: over a [N, 262144] row of
  logits it took 0.6 ms at N = 1, 10 ms at N = 16 and 36 ms at N = 64,
  against 0.3, 1.6 and 6.5 ms this way (k = 50, 2-core CPU). The row is cut
  into blocks of `block` entries. A block not among the k with the largest
  maxima (ties: lower block first) cannot hold one of the row's k largest:
  each of those k blocks holds an entry that ranks above every entry of it
  (larger, or equal and at a lower index). So the k largest lie in those k
  blocks; they are gathered in index order and lax.top_k picks among their
  k * block entries, ties going to the lower index as in lax.top_k. Rows
  that do not split into blocks, or where k blocks would be the whole row,
  take lax.top_k.
  """
  *lead, width = x.shape
  if width % block or k * block >= width:
    return jax.lax.top_k(x, k)
  blocks = x.reshape(*lead, width // block, block)
  _, best = jax.lax.top_k(blocks.max(axis=-1), k)
  best = jnp.sort(best, axis=-1)
  candidates = jnp.take_along_axis(blocks, best[..., None], axis=-2)
  values, where = jax.lax.top_k(candidates.reshape(*lead, k * block), k)
  block_start = jnp.take_along_axis(best, where // block, axis=-1) * block
  return values, block_start + where % block


def sample_top_p(logits, key, temperature, top_p, top_k=None,
                 return_logprobs=False):
  """Draws the next token like tunix's sampler.sample_top_p, via block_top_k.

  Takes the same arguments and returns the same (tokens, log-probs or None)
  for the same key: the last position's logits over the temperature, kept to
  the top_k largest (all when top_k is None or <= 0), cut to the smallest set
  whose probability reaches top_p, one categorical draw among what is kept;
  the log-prob is the token's under the full tempered distribution.
  """
  scaled = logits[:, -1].astype(jnp.float32) / temperature
  every_token = top_k is None or top_k <= 0
  if every_token and top_p >= 1.0:
    tokens = jax.random.categorical(key, logits=scaled)
  else:
    k = scaled.shape[-1] if every_token else top_k
    kept, ids = block_top_k(scaled, k)
    probs = jax.nn.softmax(kept, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # Mass ranked above each.
    kept = jnp.where(before > top_p, -jnp.inf, kept)
    pick = jax.random.categorical(key, logits=kept)
    tokens = jnp.take_along_axis(ids, pick[:, None], axis=-1)[:, 0]
  if not return_logprobs:
    return tokens, None
  logp = jax.nn.log_softmax(scaled, axis=-1)
  return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]


@contextlib.contextmanager
def cpu_sampling():
  """Within the block, tunix's sampler draws tokens with sample_top_p.

  tunix's decode step looks sample_top_p up in its module when it is
  traced, so trace (first call of the jitted decode loop) inside the block.
  """
  original = sampler_lib.sample_top_p
  sampler_lib.sample_top_p = sample_top_p
  try:
    yield
  finally:
    sampler_lib.sample_top_p = original
