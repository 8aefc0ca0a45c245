"""Tests for agent_tunix.models.decode: the sampler's CPU graph.

The CPU graph must compute what tunix's graph computes (logits of every
prefill and decode step, LoRA included, for plain, grouped-query and fused
qkv attention, through local and global layers), leave the training model as
it was, and compile to a decode loop without the per-step copies it exists
to remove (checked in the optimized HLO, against tunix's graph which has
them). Its sampling must draw the tokens tunix's sampling draws: the block
top-k gives lax.top_k's values and indices, ties included.
"""

import contextlib
import dataclasses
import os
import re

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

from flax import nnx  # pylint: disable=g-import-not-at-top
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tunix.generate import sampler as sampler_lib
from tunix.models.gemma3 import model as gemma3_lib

from agent_tunix.models import decode
from agent_tunix.models import gemma
from agent_tunix.models import lora
from agent_tunix.rl import rollout
from agent_tunix.tpu import sharding
from agent_tunix.configs import tiny

_PROMPT_LEN = 8
_STEPS = 20  # Past the tiny model's 16-token sliding window.


@pytest.mark.parametrize('einsum_str, shapes', [
    ('BTD,NDH->BTNH', ((2, 3, 5), (4, 5, 6))),
    ('BSD,CKDH->CBSKH', ((2, 3, 5), (2, 3, 5, 6))),
    ('BTD,SNDH->SBTNH', ((2, 1, 5), (3, 4, 5, 6))),
    ('BTNH,NHD->BTD', ((2, 1, 4, 6), (4, 6, 5))),
])
def test_contraction_major_einsum_is_the_same_product(einsum_str, shapes):
  rng = np.random.default_rng(0)
  x, w = (rng.standard_normal(s) for s in shapes)
  new_str, weight_perm, output_perm = decode.contraction_major(einsum_str)
  got = np.transpose(
      np.einsum(new_str, x, np.transpose(w, weight_perm)), output_perm
  )
  np.testing.assert_allclose(got, np.einsum(einsum_str, x, w), rtol=1e-12)
  # The stored weight starts with the contracted axes, in their order.
  lhs, rhs = einsum_str.split('->')[0].split(',')
  contracted = [rhs.index(c) for c in rhs if c in lhs]
  assert weight_perm[:len(contracted)] == tuple(contracted)
  # jnp.einsum contracts them in that stored order.
  text = jax.jit(lambda a, b: jnp.einsum(new_str, a, b)).lower(
      x, np.transpose(w, weight_perm)).as_text()
  lhs_axes = ', '.join(str(lhs.index(rhs[i])) for i in contracted)
  rhs_axes = ', '.join(str(i) for i in range(len(contracted)))
  assert f'contracting_dims = [{lhs_axes}] x [{rhs_axes}]' in text, text


def test_contraction_major_refuses_batch_axes():
  with pytest.raises(ValueError, match='batch axes'):
    decode.contraction_major('BND,NDH->BNH')


def _lora_model(num_layers=2, num_heads=2, num_kv_heads=1):
  """A random float32 tiny Gemma 3 with LoRA, every adapter non-zero.

  float32 (the CPU presets' dtype): in bfloat16 the two graphs' different
  orders of summation show up as ties broken differently.
  """
  config = tiny.get_config()
  cfg = dataclasses.replace(gemma.tiny_config(), num_layers=num_layers,
                            num_heads=num_heads, num_kv_heads=num_kv_heads,
                            param_dtype=jnp.float32)
  mesh = sharding.make_mesh(config.mesh)
  model = lora.apply_lora(gemma.random_model(cfg, mesh), config.model)
  state = lora.lora_state(model)
  keys = iter(jax.random.split(jax.random.key(7), 1000))
  nnx.update(model, jax.tree.map(
      lambda x: 0.1 * jax.random.normal(next(keys), x.shape, x.dtype), state))
  return model, gemma.load_tokenizer(config.model)


def _prefilled(sampler, prompts, total, include_logits=False):
  """(params, greedy state after tunix's prefill) with tunix's own state."""
  # pylint: disable=protected-access
  state = sampler.init_sample_state(
      jnp.asarray(prompts), total_sampling_steps=total,
      include_logits=include_logits, forbidden_token_ids=None,
      temperature=0.0, top_p=None, top_k=None, seed=jax.random.PRNGKey(0),
      beam_size=None,
  )
  params = sampler._flattened_transformer_state
  return params, sampler._compiled_prefill_fn(params, state, None, echo=False)


def _sample(sampler, prompts, steps):
  """Greedy prefill + decode; (logits, tokens) of every position."""
  sampler.eos_ids = np.array([-1], np.int32)  # Run every step.
  params, state = _prefilled(sampler, prompts, prompts.shape[1] + steps,
                             include_logits=True)
  state = sampler._compiled_decode_fn(params, state)  # pylint: disable=protected-access
  return np.asarray(state.logits_buffer), np.asarray(state.token_buffer)


def _prompts(rows):
  rng = np.random.default_rng(1)
  prompts = rng.integers(3, 5000, size=(rows, _PROMPT_LEN)).astype(np.int32)
  prompts[0, :3] = 0  # Left padding in one row.
  return prompts


def _cache_config(model, size):
  cfg = model.config
  return sampler_lib.CacheConfig(cache_size=size, num_layers=cfg.num_layers,
                                 num_kv_heads=cfg.num_kv_heads,
                                 head_dim=cfg.head_dim)


@pytest.mark.parametrize('layers, heads, kv_heads', [
    (6, 2, 1),  # Five local layers and a global one; grouped queries.
    (2, 4, 2),  # Two key/value heads with two query heads each.
    (2, 2, 2),  # As many kv heads as heads: tunix's fused qkv_einsum.
])
def test_cpu_graph_computes_what_tunix_computes(layers, heads, kv_heads):
  model, tokenizer = _lora_model(layers, heads, kv_heads)
  prompts = _prompts(3)
  size = _PROMPT_LEN + _STEPS
  ours = rollout.Rollout(model, tokenizer, cache_size=size)
  assert ours.cpu_decode_graph
  graph = ours.sampler.transformer
  assert type(graph.embedder) is decode.ColumnDecodeEmbedder
  assert all(type(l.attn) is decode.DecodeStepAttention for l in graph.layers)
  fused = heads == kv_heads
  assert getattr(graph.layers[0].attn, 'qkv_einsum' if fused else 'q_einsum')
  tunix = sampler_lib.Sampler(model, tokenizer, _cache_config(model, size))
  got_logits, got_tokens = _sample(ours.sampler, prompts, _STEPS)
  want_logits, want_tokens = _sample(tunix, prompts, _STEPS)
  np.testing.assert_array_equal(got_tokens, want_tokens)
  scale = np.abs(want_logits).max()
  assert scale > 0.1  # The random model's logits are not flat.
  np.testing.assert_allclose(got_logits, want_logits, rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize('layers, heads, kv_heads', [(6, 2, 1), (2, 2, 2)])
def test_step_attention_graph_computes_what_tunix_computes(layers, heads,
                                                           kv_heads):
  # The TPU/GPU sampler's graph: tunix's, with DecodeStepAttention alone
  # (in-place cache update; a local layer reads only its 16-column window
  # of the 28-column cache).
  model, tokenizer = _lora_model(layers, heads, kv_heads)
  prompts = _prompts(3)
  size = _PROMPT_LEN + _STEPS
  assert decode.uses_step_attention(model)
  with decode.step_attention_graph(model):
    ours = sampler_lib.Sampler(model, tokenizer, _cache_config(model, size))
  assert all(type(l.attn) is not decode.DecodeStepAttention
             for l in model.layers)  # restored
  graph = ours.transformer
  assert all(type(l.attn) is decode.DecodeStepAttention for l in graph.layers)
  assert type(graph.embedder) is not decode.ColumnDecodeEmbedder
  tunix = sampler_lib.Sampler(model, tokenizer, _cache_config(model, size))
  got_logits, got_tokens = _sample(ours, prompts, _STEPS)
  want_logits, want_tokens = _sample(tunix, prompts, _STEPS)
  np.testing.assert_array_equal(got_tokens, want_tokens)
  scale = np.abs(want_logits).max()
  np.testing.assert_allclose(got_logits, want_logits, rtol=0, atol=1e-5 * scale)


def test_training_model_keeps_tunix_graph_and_shares_adapters():
  model, tokenizer = _lora_model()
  attn = model.layers[0].attn
  before = {name: (type(getattr(attn, name)), getattr(attn, name).einsum_str,
                   getattr(attn, name).w)
            for name in ('q_einsum', 'kv_einsum', 'attn_vec_einsum')}
  sampler = rollout.Rollout(model, tokenizer, cache_size=32)
  assert type(model.embedder) is gemma3_lib.Embedder
  assert all(type(l.attn) is gemma3_lib.Attention for l in model.layers)
  for name, (cls, einsum_str, w) in before.items():
    einsum = getattr(attn, name)
    assert (type(einsum), einsum.einsum_str) == (cls, einsum_str)
    assert einsum.w is w and not hasattr(einsum, 'output_perm')
  graph_attn = sampler.sampler.transformer.layers[0].attn
  # The sampler holds q/kv transposed (contracted axis D first) ...
  assert graph_attn.q_einsum.w[...].shape == (32, 2, 16)
  assert graph_attn.kv_einsum.w[...].shape == (32, 2, 1, 16)
  np.testing.assert_array_equal(
      graph_attn.q_einsum.w[...],
      np.transpose(attn.q_einsum.w[...], (1, 0, 2)))
  # ... and the model's own adapters: an update reaches the sampler.
  new_b = attn.q_einsum.w_lora_b[...] + 1.0
  attn.q_einsum.w_lora_b.set_value(new_b)
  np.testing.assert_array_equal(
      sampler.sampler.transformer.layers[0].attn.q_einsum.w_lora_b[...], new_b)


def _while_body_copies(hlo):
  """Shapes copied inside the decode loop's body (optimized HLO text)."""
  bodies = re.findall(r'while\(.*?body=%([\w.\-]+)', hlo)
  copied = []
  for body in bodies:
    start = hlo.index(f'\n%{body} ')
    text = hlo[start:hlo.index('\n}\n', start)]
    for m in re.finditer(r'%([\w.\-]+) = (\w+\[[\d,]*\])\S* (copy|fusion)\(',
                         text):
      name, shape, op = m.groups()
      if op == 'copy' or name.startswith(('copy', 'transpose')):
        copied.append(shape)
  return copied


def test_decode_loop_copies_no_kv_cache_or_weights():
  model, tokenizer = _lora_model()
  size, rows = 64, 3  # 3: no activation shares a weight's shape.
  prompts = _prompts(rows)
  cfg = model.config
  cache = f'f32[{rows},{size},{cfg.num_kv_heads},{cfg.head_dim}]'
  # The frozen weights (LoRA adapters are a few KB; one is re-laid out).
  frozen = nnx.state(model.layers[0].attn, nnx.Not(nnx.LoRAParam))
  weights = {f'f32[{",".join(map(str, x.shape))}]'
             for x in jax.tree.leaves(frozen) if x.ndim >= 2}
  # Flattened weight copies show up as 2-D: [features, heads x head_dim].
  weights |= {f'f32[{cfg.embed_dim},{cfg.num_heads * cfg.head_dim}]',
              f'f32[{cfg.num_heads * cfg.head_dim},{cfg.embed_dim}]',
              f'f32[{2 * cfg.num_kv_heads * cfg.head_dim},{cfg.embed_dim}]'}

  def loop_copies(sampler):
    sampler.eos_ids = np.array([1], np.int32)
    params, state = _prefilled(sampler, prompts, size)
    hlo = sampler._compiled_decode_fn.lower(  # pylint: disable=protected-access
        params, state).compile().as_text()
    copies = _while_body_copies(hlo)
    return ([s for s in copies if s.startswith(cache[:-1])],
            [s for s in copies if s in weights])

  ours = rollout.Rollout(model, tokenizer, cache_size=size).sampler
  tunix = sampler_lib.Sampler(model, tokenizer, _cache_config(model, size))
  want_cache, want_weights = loop_copies(tunix)
  # tunix's graph copies both every step (the check can see them) ...
  assert want_cache and want_weights
  # ... the CPU graph neither.
  assert loop_copies(ours) == ([], [])


def _tied_logits(shape, seed):
  """Random logits on a coarse grid (many equal values), each row's largest
  value repeated at the middle and last entries (ties at the top)."""
  x = jax.random.normal(jax.random.PRNGKey(seed), shape) * 3
  x = jnp.round(x * 4) / 4
  top = x.max(axis=-1)
  return x.at[..., shape[-1] // 2].set(top).at[..., -1].set(top)


@pytest.mark.parametrize('shape, k, block', [
    ((3, 262144), 50, 64),   # The 270M's vocabulary, as the sampler has it.
    ((2, 3, 4096), 7, 64),   # Leading axes.
    ((4, 4096), 1, 128),
    ((2, 1000), 5, 64),      # Not a multiple of the block: lax.top_k.
    ((2, 512), 10, 64),      # k blocks would be the whole row: lax.top_k.
])
def test_block_top_k_is_lax_top_k(shape, k, block):
  x = _tied_logits(shape, seed=k)
  got = jax.jit(lambda x: decode.block_top_k(x, k, block))(x)
  want = jax.lax.top_k(x, k)
  # Every row ties at its largest value: the lower index must come first.
  assert (np.sum(np.asarray(x) == np.asarray(want[0][..., :1]), axis=-1)
          >= 2).all()
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize('temperature, top_p, top_k, logprobs', [
    (0.9, 1.0, 50, False),   # The presets' setting.
    (0.7, 0.9, 50, True),
    (1.0, 0.8, None, False),  # top-p over the whole vocabulary.
    (1.3, 1.0, 0, True),     # Neither cut: one draw over every token.
    (1.0, 0.95, 3, False),
])
def test_sample_top_p_draws_what_tunix_draws(temperature, top_p, top_k,
                                             logprobs):
  logits = _tied_logits((4, 1, 4096), seed=3)
  for seed in range(8):
    key = jax.random.PRNGKey(seed)
    got = decode.sample_top_p(logits, key, temperature, top_p, top_k,
                              return_logprobs=logprobs)
    want = sampler_lib.sample_top_p(logits, key, temperature, top_p, top_k,
                                    return_logprobs=logprobs)
    np.testing.assert_array_equal(got[0], want[0])
    if logprobs:
      np.testing.assert_array_equal(got[1], want[1])
    else:
      assert got[1] is None and want[1] is None


def test_rollout_samples_with_block_top_k(monkeypatch):
  model, tokenizer = _lora_model()
  prompts = _prompts(3)
  settings = dict(temperature=0.9, top_k=50, top_p=1.0, num_generations=2)
  calls = []
  original = decode.sample_top_p

  def counted(*args, **kwargs):
    calls.append(args[4])
    return original(*args, **kwargs)

  monkeypatch.setattr(decode, 'sample_top_p', counted)
  sampled = rollout.Rollout(model, tokenizer, _PROMPT_LEN + _STEPS)
  assert sampled.cpu_decode_graph
  got = sampled.generate(prompts, _STEPS, seed=5, **settings)
  assert calls == [50]  # Traced once, into the compiled decode loop.
  assert sampler_lib.sample_top_p is not counted  # Restored after tracing.
  # Same graph, tunix's sampling: the same tokens (block_top_k is exact).
  monkeypatch.setattr(decode, 'cpu_sampling', contextlib.nullcontext)
  plain = rollout.Rollout(model, tokenizer, _PROMPT_LEN + _STEPS)
  want = plain.generate(prompts, _STEPS, seed=5, **settings)
  assert len(calls) == 1
  np.testing.assert_array_equal(got.tokens, want.tokens)
  assert len(np.unique(got.tokens)) > 10  # Sampled, not one repeated token.


@pytest.fixture(scope='module')
def lora_model():
  return _lora_model()


@pytest.mark.parametrize('cpu_graph, temperature, top_k', [
    (True, 0.8, 8), (False, 0.8, 8), (True, 0.0, 0)])
def test_sampler_logps_are_the_trainers(lora_model, cpu_graph, temperature,
                                        top_k):
  """Both sampler graphs return each sampled token's log-prob: in float32
  the trainer's log-prob of the token (logits / temperature, before the
  top-k cut; greedy: plain logits), past the sliding window. Measured: at
  most 2e-6 apart."""
  model, tokenizer = lora_model
  prompts = _prompts(2)
  g = 2
  sampler = rollout.Rollout(model, tokenizer, _PROMPT_LEN + _STEPS,
                            cpu_decode_graph=cpu_graph)
  assert sampler.cpu_decode_graph == cpu_graph
  out = sampler.generate(prompts, _STEPS, seed=3, temperature=temperature,
                         top_k=top_k, num_generations=g)
  assert out.logps.shape == out.tokens.shape and out.logps.dtype == np.float32
  rows = np.repeat(prompts, g, axis=0)
  from agent_tunix.rl import grpo  # pylint: disable=g-import-not-at-top
  batch = grpo.Sequences(
      tokens=np.concatenate([rows, out.tokens], axis=1),
      input_mask=np.concatenate([rows != 0, out.mask > 0], axis=1),
      completion_mask=out.mask,
  )
  hp = grpo.StepHParams(chunk_size=8, temperature=temperature or 1.0)
  want = np.asarray(grpo.policy_logps(model, batch, hp))
  kept = out.mask > 0
  assert kept.sum() > 2 * g * 10 and (out.logps[kept] < 0).all()
  np.testing.assert_allclose(out.logps[kept], want[kept], rtol=0, atol=1e-4)
  assert (out.logps[~kept] == 0).all()
  if temperature:  # The tempered distribution, not the model's own.
    plain = np.asarray(grpo.policy_logps(
        model, batch, dataclasses.replace(hp, temperature=1.0)))
    assert np.abs(plain[kept] - out.logps[kept]).max() > 1e-2
