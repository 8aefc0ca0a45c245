"""Prompts -> G completions each, with tunix's JIT-compiled KV-cache sampler.

Prompts arrive as token ids left-padded to one bucket length
(`generation.max_prompt_length`) and completions are sampled for exactly
`max_steps` positions, so prefill and decode compile once per
(batch, bucket, length, temperature) and never per step. The decode loop
exits early once every row has produced an end token.

The sampler's public `__call__` takes strings and drops the end token it
stopped on; GRPO trains on that token too (it is how the policy learns to
stop), so this module drives the sampler's prefill and decode functions on
token ids directly and reads the raw token buffer.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from tunix.generate import sampler as sampler_lib

from agent_tunix.data import pipeline


@dataclasses.dataclass
class Completions:
  """Sampled completions for a batch of N rows (prompts already repeated)."""

  tokens: np.ndarray  # int32 [N, C], pad after the end token
  mask: np.ndarray  # float32 [N, C], 1 up to and including the end token
  lengths: np.ndarray  # int32 [N], tokens incl. the end token
  truncated: np.ndarray  # bool [N], no end token within C
  texts: list  # str [N], decoded, end token excluded


def end_token_ids(tokenizer):
  """<eos> and <end_of_turn>: either one ends a completion."""
  ids = [tokenizer.eos_id()]
  end_of_turn = tokenizer.piece_to_id('<end_of_turn>')
  if end_of_turn != tokenizer.unk_id():
    ids.append(end_of_turn)
  return ids


def repeat_groups(batch, num_generations):
  """Repeats every prompt row G times (groups are contiguous)."""
  return {k: np.repeat(v, num_generations, axis=0) for k, v in batch.items()}


class Rollout:
  """Samples completions from the current policy (LoRA included)."""

  def __init__(self, model, tokenizer, cache_size):
    cfg = model.config
    self.tokenizer = tokenizer
    self.sampler = sampler_lib.Sampler(
        model,
        tokenizer,
        sampler_lib.CacheConfig(
            cache_size=cache_size,
            num_layers=cfg.num_layers,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
        ),
    )
    self.end_ids = end_token_ids(tokenizer)
    self.sampler.eos_ids = jnp.array(self.end_ids)

  def generate(self, prompt_tokens, max_steps, seed, temperature=0.0,
               top_k=0, top_p=1.0):
    """Samples `max_steps` tokens after each left-padded prompt row.

    Args:
      prompt_tokens: int32 [N, P], left-padded with the pad id (0).
      max_steps: completion length C.
      seed: int; the same seed and prompts give the same completions.
      temperature: 0 for greedy decoding.
      top_k: top-k cut when sampling (0 = off).
      top_p: nucleus cut when sampling (1.0 = off).

    Returns:
      `Completions`.
    """
    prompt_tokens = np.asarray(prompt_tokens, dtype=np.int32)
    num_prompt = prompt_tokens.shape[1]
    sampler = self.sampler
    greedy = temperature <= 0
    state = sampler.init_sample_state(
        jnp.asarray(prompt_tokens),
        total_sampling_steps=num_prompt + max_steps,
        include_logits=False,
        forbidden_token_ids=None,
        temperature=float(temperature),
        top_p=None if greedy else float(top_p),
        top_k=None if greedy or not top_k else int(top_k),
        seed=jax.random.PRNGKey(seed),
        beam_size=None,
    )
    params = sampler._flattened_transformer_state  # pylint: disable=protected-access
    state = sampler._compiled_prefill_fn(params, state, None, echo=False)  # pylint: disable=protected-access
    state = sampler._compiled_decode_fn(params, state)  # pylint: disable=protected-access
    buffer = np.asarray(jax.device_get(state.token_buffer))
    return self.completions_from_tokens(buffer[:, num_prompt:])

  def completions_from_tokens(self, raw):
    """Cuts raw sampled tokens [N, C] at the first end token."""
    raw = np.asarray(raw, dtype=np.int32)
    n, c = raw.shape
    is_end = np.isin(raw, self.end_ids)
    has_end = is_end.any(axis=1)
    first_end = np.where(has_end, is_end.argmax(axis=1), c)
    lengths = np.where(has_end, first_end + 1, c).astype(np.int32)
    positions = np.arange(c)[None, :]
    mask = (positions < lengths[:, None]).astype(np.float32)
    tokens = np.where(mask > 0, raw, pipeline.PAD_ID).astype(np.int32)
    texts = [
        self.tokenizer.decode(raw[i, :first_end[i]].tolist()) for i in range(n)
    ]
    return Completions(tokens, mask, lengths, ~has_end, texts)
