"""Per-token log-probs of completions: the model passes of the update.

`per_token_logps` runs a tunix Gemma 3 (with or without its LoRA
adapters) over prompt + completion and returns the log-prob, and
optionally the entropy, of each completion token, without ever holding the
full [rows, length, vocab] logits: the vocabulary projection runs in
chunks (`chunked_token_logps`), and when G rows share a prompt the prompt
runs through the model once (`shared_prompt_hidden_states`).

The reference policy is the same backbone with LoRA disabled
(`lora.model_call(model, use_lora=False)`): qwix rewrites the model's class
so that only its top-level `__call__` applies the adapters, and keeps the
plain class as `_unquantized_type`. Calling that class's `__call__` on the
same object (with the experts' own adapters switched off too) runs the
frozen weights alone, so no second copy of the weights is needed.
"""

import functools

from flax import nnx
import jax
import jax.numpy as jnp

from agent_tunix.models import families
from agent_tunix.models import gemma4 as gemma4_lib
from agent_tunix.models import lora
from agent_tunix.models import tunix_adapter
from agent_tunix.rl import packing as packing_lib
from agent_tunix.tpu import sharding


def chunk_layout(length: int, chunk_size: int) -> tuple[int, int]:
  """(number of chunks, positions a chunk) for `length` positions.

  As few chunks as `chunk_size` allows, of near-equal size, so that the
  padding is under one position a chunk: 88 positions at chunk_size=64 run
  as 2 x 44, not as 2 x 64 with 40 positions of padding (45% more work for
  the vocabulary projection, in every pass over it).

  Args:
    length: positions to cover (>= 1).
    chunk_size: the most positions a chunk may hold (>= 1).

  Returns:
    (num_chunks, chunk) with num_chunks * chunk >= length.
  """
  num_chunks = -(-length // max(1, min(chunk_size, length)))
  return num_chunks, -(-length // num_chunks)


def chunked_token_logps(
    hidden: jax.Array,
    embedding: jax.Array,
    targets: jax.Array,
    chunk_size: int,
    compute_entropy: bool = False,
    temperature: float = 1.0,
    softcap: float | None = None,
    logits_sharding: jax.sharding.NamedSharding | None = None,
) -> tuple[jax.Array, jax.Array | None]:
  """Log-probabilities of `targets` under logits = hidden @ embedding.T / T.

  The sequence is processed at most `chunk_size` positions at a time with
  `lax.map`, in chunks of near-equal size (`chunk_layout`). With more than
  one chunk, each is rematerialised in the backward pass, so at most one
  [B, chunk_size, V] logits block exists at a time, forward or backward. A
  single chunk is not rematerialised: its backward pass runs right after its
  forward pass, so recomputing the logits would save no memory and cost one
  more [B, T, D] x [D, V] matmul. Logits are accumulated and normalised in
  float32.

  The logits are divided by `temperature` (T) before the softmax, as the
  sampler divides them before drawing a token, so log-probs and entropy are
  those of the distribution the tokens were sampled from. A model with a
  final-logit softcap (Gemma 4: 30) has it applied first, as its own
  forward does: tanh(logits / softcap) * softcap, then / T.

  Args:
    hidden: [B, T, D] final hidden states.
    embedding: [V, D] output embedding (tied input embedding for Gemma).
    targets: [B, T] int token ids.
    chunk_size: the most positions a chunk holds; T need not be a
      multiple of it.
    compute_entropy: also return the per-token entropy of the distribution.
    temperature: T > 0, the sampling temperature (1 = the model's logits).
    softcap: the model's final-logit softcap, or None.
    logits_sharding: the [B, chunk, V] logits' sharding when the
      embedding is split along V (`vocab_parallel`); the target's logit is
      then picked by a masked sum, which each chip does on its share of V.

  Returns:
    (logps [B, T] float32, entropy [B, T] float32 or None).
  """
  if temperature <= 0:
    raise ValueError(f'temperature must be > 0, got {temperature}.')
  batch, length, dim = hidden.shape
  num_chunks, chunk = chunk_layout(length, chunk_size)
  pad = num_chunks * chunk - length
  if pad:
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
  hidden = hidden.reshape(batch, num_chunks, chunk, dim).swapaxes(0, 1)
  targets = targets.reshape(batch, num_chunks, chunk).swapaxes(0, 1)

  def one_chunk(args):
    h, t = args
    if logits_sharding is not None:  # Every row on every chip: a plain dot.
      h = jax.lax.with_sharding_constraint(
          h, sharding.replicated(logits_sharding.mesh))
    logits = jnp.einsum(
        'bcd,vd->bcv', h, embedding, preferred_element_type=jnp.float32
    )
    if logits_sharding is not None:
      logits = jax.lax.with_sharding_constraint(logits, logits_sharding)
    logits = gemma4_lib.apply_softcap(logits, softcap)
    if temperature != 1.0:
      logits = logits / temperature
    lse = jax.nn.logsumexp(logits, axis=-1)
    if logits_sharding is None:
      picked = jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
    else:
      vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2)
      picked = jnp.sum(jnp.where(vocab == t[..., None], logits, 0.0), -1)
    logps = picked - lse
    if compute_entropy:
      probs = jnp.exp(logits - lse[..., None])
      entropy = lse - jnp.sum(probs * logits, axis=-1)
    else:
      entropy = jnp.zeros_like(logps)
    return logps, entropy

  if num_chunks > 1:
    one_chunk = jax.checkpoint(one_chunk)
  logps, entropy = jax.lax.map(one_chunk, (hidden, targets))

  def unchunk(x):
    return x.swapaxes(0, 1).reshape(batch, num_chunks * chunk)[:, :length]

  return unchunk(logps), (unchunk(entropy) if compute_entropy else None)


def positions_from_mask(input_mask: jax.Array) -> jax.Array:
  """[B, L] positions counting real tokens from 0; pads before them get 0."""
  return jnp.maximum(jnp.cumsum(input_mask.astype(jnp.int32), axis=-1) - 1, 0)


def causal_attention_mask(input_mask: jax.Array) -> jax.Array:
  """[B, L, L] mask: query i may attend to real key j <= i."""
  length = input_mask.shape[-1]
  causal = jnp.tril(jnp.ones((length, length), jnp.bool_))
  return causal[None] & input_mask.astype(jnp.bool_)[:, None, :]


def final_hidden_states(
    model: nnx.Module,
    tokens: jax.Array,
    input_mask: jax.Array,
    use_lora: bool = True,
) -> jax.Array:
  """Runs the model and returns its final-normed hidden states [B, L, D].

  The full-vocabulary logits the model returns are discarded (XLA removes
  that matmul under jit). With use_lora=False the plain (pre-qwix) class's
  `__call__` runs on the same object, which skips the LoRA adapters (qwix's
  and the experts' own); for a model without LoRA both settings are the
  same.

  Args:
    model: a tunix Gemma3 (optionally with qwix LoRA applied).
    tokens: [B, L] int token ids.
    input_mask: [B, L] True on real tokens.
    use_lora: apply the LoRA adapters.

  Returns:
    [B, L, D] hidden states in the model's compute dtype.
  """
  call = lora.model_call(model, use_lora)

  def forward(module):
    call(
        module,
        tokens,
        positions_from_mask(input_mask),
        None,
        causal_attention_mask(input_mask),
        output_hidden_states=True,
    )

  _, sown = nnx.capture(forward, nnx.Intermediate)(model)
  return sown['all_hidden_states'].get_value()[-1]


def can_share_prompts(model: nnx.Module, length: int,
                      completion_len: int) -> bool:
  """Whether `shared_prompt_hidden_states` equals the full forward here.

  tunix's multi-token attention with a KV cache places its sliding-window
  band as if the queries started at cache index 0; the band is irrelevant
  (and both paths agree) when the whole sequence fits in the window. A
  single completion token would take tunix's one-token decode path instead.

  Args:
    model: a tunix Gemma3 (optionally with LoRA).
    length: P + C.
    completion_len: C.

  Returns:
    True when the shared-prompt forward may be used.
  """
  cfg = getattr(model, 'config', None)
  if cfg is None or not families.of_config(cfg).prefill_reads_cache:
    # Gemma 4's attention reads only the current chunk's K/V in a
    # multi-token call, so the second, cached forward would not see the
    # prompt. Full forward instead.
    return False
  window = getattr(cfg, 'sliding_window_size', 0)
  return (bool(window) and length <= window and completion_len >= 2
          and length - completion_len >= 2)


def shared_prompt_hidden_states(
    model: nnx.Module,
    tokens: jax.Array,
    input_mask: jax.Array,
    completion_len: int,
    group: int,
    use_lora: bool = True,
) -> jax.Array:
  """Final hidden states that predict the completion, prompts run once.

  Rows i*group .. i*group + group - 1 must share their prompt (the first
  P = L - C tokens and mask). Each distinct prompt but its last token runs
  through the model once, filling a KV cache; the cache is repeated `group`
  times and the last prompt token plus the first C - 1 completion tokens of
  every row run on top of it. This is the computation of
  `final_hidden_states(...)[:, P - 1 : L - 1]` with the prompt's share done
  once instead of `group` times (gradients from every row of a group add up
  in the shared part). Callers check `can_share_prompts` first.

  Args:
    model: a tunix Gemma3 (optionally with qwix LoRA applied).
    tokens: [N, L] left-padded prompts followed by completions.
    input_mask: [N, L] True on real tokens.
    completion_len: C.
    group: rows per prompt (G); divides N.
    use_lora: apply the LoRA adapters.

  Returns:
    [N, C, D] hidden states at positions P - 1 .. L - 2.
  """
  rows, length = tokens.shape
  if rows % group:
    raise ValueError(f'group={group} does not divide the {rows} rows.')
  prompt_len = length - completion_len
  cache_len = length - 1  # The last token predicts nothing here.
  call = lora.model_call(model, use_lora)
  positions = positions_from_mask(input_mask)
  cfg = model.config
  dtype = model.embedder.input_embedding[...].dtype
  num_prompts = rows // group
  shape = (num_prompts, cache_len, cfg.num_kv_heads, cfg.head_dim)
  cache = {
      f'layer_{i}': {
          'k': jnp.zeros(shape, dtype),
          'v': jnp.zeros(shape, dtype),
          'end_index': jnp.zeros((num_prompts,), jnp.int32),
      }
      for i in range(cfg.num_layers)
  }
  # 1. Each prompt without its last token, once: only the cache is kept.
  head = prompt_len - 1
  head_mask = input_mask[::group, :head]
  head_attn = jnp.pad(
      causal_attention_mask(head_mask), ((0, 0), (0, 0), (0, cache_len - head))
  )
  _, cache = call(
      model, tokens[::group, :head], positions[::group, :head], cache,
      head_attn,
  )
  cache = jax.tree.map(lambda x: jnp.repeat(x, group, axis=0), cache)
  # 2. Every row: the last prompt token and the completion but its last
  # token, attending to the cached prompt and to itself causally.
  tail = slice(head, cache_len)
  query_index = jnp.arange(head, cache_len)
  tail_attn = (
      (jnp.arange(cache_len)[None, :] <= query_index[:, None])[None]
      & input_mask[:, None, :cache_len].astype(jnp.bool_)
  )

  def forward(module):
    call(
        module, tokens[:, tail], positions[:, tail], cache, tail_attn,
        output_hidden_states=True,
    )

  _, sown = nnx.capture(forward, nnx.Intermediate)(model)
  return sown['all_hidden_states'].get_value()[-1]


def per_token_logps(
    model: nnx.Module,
    tokens: jax.Array,
    input_mask: jax.Array,
    completion_len: int,
    chunk_size: int,
    use_lora: bool = True,
    compute_entropy: bool = False,
    group: int = 1,
    temperature: float = 1.0,
    completion_mask: jax.Array | None = None,
    packing: packing_lib.Packing | None = None,
) -> tuple[jax.Array, jax.Array | None]:
  """Log-probs of the last `completion_len` tokens given what precedes them.

  Args:
    model: a tunix Gemma3 (optionally with qwix LoRA applied).
    tokens: [B, P + C] left-padded prompt followed by the completion.
    input_mask: [B, P + C] True on real tokens.
    completion_len: C.
    chunk_size: sequence chunk for the vocabulary projection.
    use_lora: apply the LoRA adapters (False = reference policy).
    compute_entropy: also return per-token entropies.
    group: rows per shared prompt (contiguous); above 1, each prompt runs
      through the model once (`shared_prompt_hidden_states`) where
      `can_share_prompts` allows it.
    temperature: the logits are divided by it before the softmax (the
      sampling temperature; see `chunked_token_logps`).
    completion_mask: [B, C], the counted tokens; needed with `packing`.
    packing: the batch's `packing.Packing`: the passes run on packed rows
      (`packing.token_logps`), and positions not counted get 0; None: the
      padded rows.

  Returns:
    (logps [B, C] float32, entropy [B, C] float32 or None).
  """
  embedding, logits_sharding = vocab_parallel(
      model.embedder.input_embedding[...])
  project = functools.partial(
      _project, embedding=embedding, temperature=temperature,
      softcap=families.of_config(model.config).final_logit_softcap,
      logits_sharding=logits_sharding)
  if packing is not None:
    return packing_lib.token_logps(
        model, tokens, input_mask, completion_mask, chunk_size, project,
        packing, use_lora=use_lora, compute_entropy=compute_entropy,
        group=group)
  length = tokens.shape[1]
  if not 0 < completion_len < length:
    raise ValueError(
        f'completion_len={completion_len} must be in (0, {length}): the '
        'sequence needs at least one prompt token.'
    )
  if group > 1 and can_share_prompts(model, length, completion_len):
    hidden = shared_prompt_hidden_states(
        model, tokens, input_mask, completion_len, group, use_lora=use_lora
    )
  else:
    hidden = final_hidden_states(model, tokens, input_mask, use_lora=use_lora)
    # Position t predicts token t + 1.
    hidden = hidden[:, length - completion_len - 1 : length - 1]
  targets = tokens[:, length - completion_len :]
  return project(hidden, targets, chunk_size, compute_entropy)


def vocab_parallel(embedding):
  """(embedding, logits sharding) for the projection of a pass traced on
  a mesh (`tunix_adapter.active_mesh`): the [V, D] table split along V over
  every mesh axis, and its [B, chunk, V] logits split alike.

  Trained, the table is split along D over 'fsdp', and XLA gathered the
  whole table for every chunk, forward and backward (21.7 GB of the 1B's
  reference pass on a v5litepod-8, 38.7 GB of its update). Split along V,
  the table is re-laid out once per micro-batch; each chunk gathers the
  rows' hidden states instead ([B, chunk, D]), each chip computes its share
  of the logits, and the softmax's sums are all-reduced ([B, chunk]).
  (embedding, None) off a mesh, on one device, or when the chips do not
  divide V.
  """
  mesh = tunix_adapter.active_mesh()
  table = sharding.vocab_sharding(mesh, embedding.shape)
  if table is None:
    return embedding, None
  logits = jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec(None, None, table.spec[0]))
  return jax.lax.with_sharding_constraint(embedding, table), logits


def _project(hidden, targets, chunk_size, compute_entropy, *, embedding,
             temperature, softcap, logits_sharding):
  return chunked_token_logps(
      hidden, embedding, targets, chunk_size, compute_entropy=compute_entropy,
      temperature=temperature, softcap=softcap,
      logits_sharding=logits_sharding)
