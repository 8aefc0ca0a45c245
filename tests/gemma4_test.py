"""Gemma 4 on tiny random configs, checked against tunix's own forward.

The tiny configs exercise local and global layers (global: a wider head,
fewer KV heads, K = V), per-layer embeddings, KV-shared layers and (the MoE
twin) experts. The reference is tunix's `Gemma4.__call__` (which applies
the final-logit softcap) on the same weights.
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# pylint: disable=g-import-not-at-top
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tunix.models.gemma4 import model as tunix_gemma4

from agent_tunix import models
from agent_tunix.config import validation
from agent_tunix.data import pipeline
from agent_tunix.data import prompts
from agent_tunix.models import families
from agent_tunix.models import gemma
from agent_tunix.models import gemma4
from agent_tunix.models import lora
from agent_tunix.rl import logprobs
from agent_tunix.rl import remat
from agent_tunix.rl import rollout
from agent_tunix.tpu import sharding
from agent_tunix.configs import tiny_gemma4
# pylint: enable=g-import-not-at-top

_LEN = 12
_COMPLETION = 5


def _config(preset='tiny_gemma4', arg=None):
  config = tiny_gemma4.get_config(arg)
  config.model.preset = preset
  return config


@pytest.fixture(scope='module', params=['tiny_gemma4',
                                        'tiny_gemma4_moe+experts'])
def policy(request):
  """(config, LoRA policy with non-zero adapters, tokenizer).

  '+experts': the MoE model with per-expert LoRA too (model.lora_experts),
  whose forward runs every path of the MoE without it and the experts'
  adapters besides; the MoE without them is checked for its adapters
  alone (test_moe_without_expert_lora_has_no_expert_adapters).
  """
  preset, _, experts = request.param.partition('+')
  config = _config(preset)
  config.model.lora_experts = bool(experts)
  model, tokenizer = models.build(config, sharding.make_mesh(config.mesh))
  # qwix starts lora_b at zero; random adapters make the LoRA path visible.
  state = lora.lora_state(model)
  keys = iter(jax.random.split(jax.random.key(1), 1000))
  nnx.update(model, jax.tree.map(
      lambda x: 0.05 * jax.random.normal(next(keys), x.shape, x.dtype),
      state))
  return config, model, tokenizer


@pytest.fixture(scope='module')
def batch():
  rng = np.random.RandomState(0)
  tokens = rng.randint(1, 5000, size=(4, _LEN)).astype(np.int32)
  mask = np.ones_like(tokens, bool)
  mask[1, :3] = False  # A left-padded row.
  tokens[1, :3] = 0
  # Rows 2 and 3 share their prompt (for the grouped path).
  tokens[3, :_LEN - _COMPLETION] = tokens[2, :_LEN - _COMPLETION]
  return jnp.asarray(tokens), jnp.asarray(mask)


def _tunix_logps(model, tokens, mask, use_lora=True):
  """Log-probs of the completion from tunix's plain forward (softcapped).

  With LoRA, qwix's wrapped __call__ runs (our class); the LoRA-free
  reference runs tunix's own Gemma4 class on the same variables.
  """
  attn = logprobs.causal_attention_mask(mask)
  positions = logprobs.positions_from_mask(mask)
  if use_lora:
    logits, _ = model(tokens, positions, None, attn)
  else:
    plain = nnx.eval_shape(
        lambda: tunix_gemma4.Gemma4(model.config, rngs=nnx.Rngs(0)))
    nnx.update(plain, nnx.state(model, nnx.All(nnx.Param,
                                                nnx.Not(nnx.LoRAParam))))
    logits, _ = plain(tokens, positions, None, attn)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  length = tokens.shape[1]
  picked = jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1)[..., 0]
  return picked[:, length - _COMPLETION - 1:]


@pytest.mark.parametrize('use_lora', [True, False])
def test_logps_equal_the_softcapped_forward(policy, batch, use_lora):
  _, model, _ = policy
  tokens, mask = batch
  want = _tunix_logps(model, tokens, mask, use_lora)
  for chunk in (3, 64):
    got, _ = logprobs.per_token_logps(
        model, tokens, mask, _COMPLETION, chunk, use_lora=use_lora)
    np.testing.assert_allclose(got, want, atol=2e-5)
  # Shared prompts are off for Gemma 4: group=2 is the plain path.
  assert not logprobs.can_share_prompts(model, _LEN, _COMPLETION)
  grouped, _ = logprobs.per_token_logps(
      model, tokens, mask, _COMPLETION, 64, use_lora=use_lora, group=2)
  np.testing.assert_allclose(grouped, want, atol=2e-5)


def test_the_softcap_matters(policy, batch):
  """Without the softcap the log-probs differ: the check above can fail."""
  _, model, _ = policy
  tokens, mask = batch
  hidden = logprobs.final_hidden_states(model, tokens, mask)[:, :-1]
  embedding = model.embedder.input_embedding[...]
  targets = tokens[:, 1:]
  # Scale the hidden states up so some logits pass the softcap's knee.
  capped, _ = logprobs.chunked_token_logps(
      8 * hidden, embedding, targets, 8, softcap=gemma4.SOFTCAP)
  plain, _ = logprobs.chunked_token_logps(8 * hidden, embedding, targets, 8)
  assert float(jnp.abs(capped - plain).max()) > 1e-3


@pytest.mark.parametrize('mode', ['layer', 'block'])
def test_remat_gradients_equal_the_plain_ones(policy, batch, mode):
  _, model, _ = policy
  tokens, mask = batch
  graphdef, lora_params, rest = nnx.split(model, nnx.LoRAParam, ...)

  def loss(params, remat_mode):
    module = nnx.merge(graphdef, params, rest, copy=True)
    remat.apply_remat(module, remat_mode)
    logps, _ = logprobs.per_token_logps(module, tokens, mask, _COMPLETION, 4)
    return -jnp.sum(logps)

  want = jax.grad(loss)(lora_params, 'none')
  got = jax.grad(loss)(lora_params, mode)
  flat_want = dict(nnx.to_flat_state(want))
  flat_got = dict(nnx.to_flat_state(got))
  assert flat_want.keys() == flat_got.keys()
  for path, var in flat_want.items():
    np.testing.assert_allclose(flat_got[path][...], var[...], atol=2e-5,
                               err_msg=str(path))
  # The donor layers' adapters get gradient from the KV-shared layers too:
  # a donor's K/V projection has a non-zero gradient.
  donors = sorted(model.shared_layer_origins)
  for layer in donors:
    kv = [v for p, v in flat_want.items()
          if p[:2] == ('layers', layer) and 'k' in str(p[3])]
    assert any(float(jnp.abs(v[...]).max()) > 0 for v in kv), layer


def test_lora_targets(policy):
  config, model, _ = policy
  paths = {'/'.join(map(str, p[:-1]))
           for p, _ in nnx.to_flat_state(lora.lora_state(model))}
  shared = [i for i, d in enumerate(model.kv_cache_sharing_patterns) if d != i]
  for i, layer in enumerate(model.layers):
    attn = layer.attn
    if i in shared:  # Its K/V projection is never called: no adapter.
      assert not any(p.startswith(f'layers/{i}/attn/k') for p in paths)
      assert f'layers/{i}/attn/q_einsum' in paths
    elif hasattr(attn, 'k_einsum'):  # K = V global layer.
      assert f'layers/{i}/attn/k_einsum' in paths
    else:
      assert f'layers/{i}/attn/kv_einsum' in paths
  assert config.model.lora_module_path == tiny_gemma4.base.GEMMA4_LORA_MODULES
  experts = {p for p in paths if '/moe' in p}
  if config.model.lora_experts:
    assert experts == {f'layers/{i}/moe' for i in range(len(model.layers))}
  else:
    assert not experts


def test_moe_without_expert_lora_has_no_expert_adapters():
  config = _config('tiny_gemma4_moe')
  assert not config.model.lora_experts
  model, _ = models.build(config, sharding.make_mesh(config.mesh))
  paths = {'/'.join(map(str, p[:-1]))
           for p, _ in nnx.to_flat_state(lora.lora_state(model))}
  assert paths and not {p for p in paths if '/moe' in p}
  assert any(p.endswith('/attn/q_einsum') for p in paths)


def test_expert_lora_factors():
  """Per-expert factors: shapes, sharding, a zero start, refusals."""
  config = _config('tiny_gemma4_moe')
  config.model.lora_experts = True
  validation.validate(config)
  model, _ = models.build(config, sharding.make_mesh(config.mesh))
  moe = model.layers[0].moe
  e, h, d, r = (moe.num_experts, moe.hidden_dim, moe.features,
                config.model.lora_rank)
  assert moe.gating_einsum_lora_a.shape == (e, d, r)
  assert moe.gating_einsum_lora_b.shape == (e, r, 2, h)
  assert moe.linear_lora_a.shape == (e, h, r)
  assert moe.linear_lora_b.shape == (e, r, d)
  assert moe.lora_scale == config.model.lora_alpha / r
  # B starts at zero: the policy equals the base model until it trains.
  assert not np.any(np.asarray(moe.gating_einsum_lora_b[...]))
  # The expert axis keeps the experts' sharding, the rank axis none.
  gate_spec = moe.gating_einsum.get_metadata()['out_sharding']
  assert moe.gating_einsum_lora_a.get_metadata()['out_sharding'] == (
      gate_spec[0], gate_spec[3], None)
  assert moe.linear_lora_b.get_metadata()['out_sharding'] == (
      moe.linear.get_metadata()['out_sharding'][0], None,
      moe.linear.get_metadata()['out_sharding'][2])
  dense = _config('tiny_gemma4')
  dense.model.lora_experts = True
  with pytest.raises(validation.ConfigError, match='lora_experts=True'):
    validation.validate(dense)


def test_lora_on_each_target_changes_the_output(policy, batch):
  _, model, _ = policy
  tokens, mask = batch
  base = np.asarray(logprobs.per_token_logps(
      model, tokens, mask, _COMPLETION, 64, use_lora=False)[0])
  flat = dict(nnx.to_flat_state(lora.lora_state(model)))
  targets = sorted(p for p in flat if str(p[-1]).endswith('lora_b'))
  assert targets
  for target in targets:
    # Only this target's adapter on; every other lora_b zeroed.
    only = {p: (v[...] if p == target else jnp.zeros_like(v[...]))
            for p, v in flat.items() if str(p[-1]).endswith('lora_b')}
    saved = {p: flat[p][...] for p in only}
    for p, value in only.items():
      flat[p].set_value(value)
    try:
      got = np.asarray(logprobs.per_token_logps(
          model, tokens, mask, _COMPLETION, 64)[0])
    finally:
      for p, value in saved.items():
        flat[p].set_value(value)
    assert np.abs(got - base).max() > 1e-6, target


def test_greedy_sampling_equals_the_full_forward(policy):
  """The KV-cache sampler's greedy tokens and log-probs match full forwards."""
  _, model, tokenizer = policy
  rows = [pipeline.encode_prompt(t, tokenizer, 10)[0]
          for t in ('What is 2 + 3?', 'Name a colour.')]
  prompt = np.stack(rows)
  sampler = rollout.Rollout(model, tokenizer, cache_size=16)
  assert prompt.shape[1] + 6 <= 16
  steps = 6
  out = sampler.generate(prompt, steps, seed=0)
  assert not sampler.cpu_decode_graph  # A Gemma 3 only graph.
  # Full forwards over a fixed-width buffer (one compile): causal attention
  # keeps the zeros after position i out of the logits at i.
  width = prompt.shape[1] + steps
  tokens = jnp.zeros((len(rows), width), jnp.int32).at[
      :, :prompt.shape[1]].set(prompt)
  mask = tokens != 0

  @nnx.jit
  def forward(model, tokens, mask):
    attn = logprobs.causal_attention_mask(mask)
    return model(tokens, logprobs.positions_from_mask(mask), None, attn)[0]

  for i in range(prompt.shape[1], width):
    nxt = jnp.argmax(forward(model, tokens, mask)[:, i - 1], axis=-1)
    tokens = tokens.at[:, i].set(nxt)
    mask = mask.at[:, i].set(True)
  full = np.asarray(tokens[:, prompt.shape[1]:])
  for row in range(len(rows)):
    n = int(out.lengths[row])
    np.testing.assert_array_equal(out.tokens[row, :n], full[row, :n])
  # The sampler's log-probs are the trainer's.
  seq = jnp.concatenate([jnp.asarray(prompt), jnp.asarray(out.tokens)], 1)
  seq_mask = jnp.concatenate(
      [jnp.asarray(prompt) != 0, jnp.ones(out.tokens.shape, bool)], 1)
  trainer, _ = logprobs.per_token_logps(model, seq, seq_mask, steps, 64)
  np.testing.assert_allclose(
      np.asarray(trainer) * out.mask, out.logps * out.mask, atol=1e-4)


def test_moe_router_statistics():
  config = _config('tiny_gemma4_moe')
  cfg = gemma.model_config(config.model)
  model = gemma.random_model(cfg, sharding.make_mesh(config.mesh))
  tokens = jnp.asarray(np.arange(1, 17, dtype=np.int32).reshape(2, 8))
  mask = jnp.ones_like(tokens, bool).at[0, :3].set(False)
  counts = np.asarray(gemma4.router_stats(model, tokens, mask))
  assert counts.shape == (cfg.num_layers, cfg.num_experts)
  np.testing.assert_array_equal(counts.sum(axis=1),
                                13 * cfg.num_experts_per_tok)
  scalars = gemma4.load_scalars(counts)
  assert scalars['moe/max_load'] >= 1.0 >= scalars['moe/min_load']
  assert gemma4.load_scalars([[4, 4], [8, 0]]) == {
      'moe/max_load': 2.0, 'moe/min_load': 0.0, 'moe/idle_experts': 1.0,
      'moe/dropped_tokens': 0.0}
  # tunix 0.1.7's router reads the experts' normed input; ours (like Hugging
  # Face's) the residual. With the norm's weights at 1 both agree (and the
  # exact top-k equals approx_max_k on CPU); with other weights they differ.
  plain = nnx.eval_shape(lambda: tunix_gemma4.Gemma4(cfg, rngs=nnx.Rngs(0)))
  attn = logprobs.causal_attention_mask(jnp.ones_like(tokens, bool))

  def both():
    nnx.update(plain, nnx.state(model))
    return (np.asarray(model(tokens, None, None, attn)[0]),
            np.asarray(plain(tokens, None, None, attn)[0]))

  ours, theirs = both()
  np.testing.assert_allclose(ours, theirs, atol=1e-5)
  norm = model.layers[0].moe_pre_ffw_norm.scale
  norm.set_value(jnp.linspace(0.2, 3.0, norm[...].shape[0]))
  ours, theirs = both()
  assert np.abs(ours - theirs).max() > 1e-4


def test_gemma4_chat_prompt_and_thinking():
  config = _config()
  config.data.system_prompt = 'Be brief.'
  # As Gemma 4's chat template renders these messages
  # (tests/side/gemma4_vocab_check.py): thinking off opens the model turn
  # with an empty thought block; thinking on puts <|think|> and a newline
  # in the system turn, which it writes even with no system prompt.
  text = prompts.format_prompt('2 + 2?', config, 'gemma4')
  assert text == ('<|turn>system\nBe brief.<turn|>\n'
                  '<|turn>user\n2 + 2?<turn|>\n<|turn>model\n'
                  '<|channel>thought\n<channel|>')
  config.data.thinking = True
  assert prompts.format_prompt('2 + 2?', config, 'gemma4') == (
      '<|turn>system\n<|think|>\nBe brief.<turn|>\n'
      '<|turn>user\n2 + 2?<turn|>\n<|turn>model\n')
  config.data.system_prompt = ''
  assert prompts.format_prompt(' 2 + 2? ', config, 'gemma4') == (
      '<|turn>system\n<|think|>\n<turn|>\n'
      '<|turn>user\n2 + 2?<turn|>\n<|turn>model\n')
  config.data.thinking = False
  assert prompts.format_prompt('2 + 2?', config, 'gemma4') == (
      '<|turn>user\n2 + 2?<turn|>\n<|turn>model\n'
      '<|channel>thought\n<channel|>')
  config.data.thinking = True
  done = '<|channel>thought\nadd them<channel|><answer>4</answer>'
  assert prompts.scored_texts([done, '<|channel>thought cut'], config) == [
      '<answer>4</answer>', '']
  config.rewards.see_thoughts = True
  assert prompts.scored_texts([done], config) == [done]


def test_exported_chat_template_renders_the_training_prompts():
  """The chat template a merged Gemma 4 export writes renders exactly the
  prompts we train on, thinking on and off, with and without a system
  prompt (Hugging Face renders templates with trim_blocks/lstrip_blocks)."""
  import jinja2  # pylint: disable=g-import-not-at-top
  template = jinja2.Environment(
      trim_blocks=True, lstrip_blocks=True).from_string(
          families.GEMMA4.hf_layout.CHAT_TEMPLATE)
  config = _config()
  for thinking in (False, True):
    for system in ('', ' Be brief. '):
      config.data.system_prompt, config.data.thinking = system, thinking
      messages = [{'role': 'system', 'content': system}] if system else []
      rendered = template.render(
          messages=messages + [{'role': 'user', 'content': 'What is 2 + 3?'}],
          add_generation_prompt=True, bos_token='<bos>',
          enable_thinking=thinking)
      assert rendered == '<bos>' + prompts.format_prompt(
          'What is 2 + 3?', config, 'gemma4')


def test_presets_and_refusals():
  for size in ('e2b', 'e4b', '12b', '26b_a4b', '31b'):
    for name in (f'gemma4_{size}', f'gemma4_{size}_it'):
      assert name in gemma.PRESETS
      assert families.of_preset(name) is families.GEMMA4
  config = _config('gemma4_e2b')
  cfg = gemma.model_config(config.model)
  assert cfg.final_logit_softcap == 30.0 and cfg.num_layers == 35
  assert not cfg.use_sliding_window_kv_cache
  assert cfg.dtype == cfg.param_dtype
  config.model.source = 'gguf'
  with pytest.raises(validation.ConfigError, match='packaged Gemma 3 270M'):
    validation.validate(config)
  config.model.path = '/m/gemma-4-e2b-q8_0.gguf'
  validation.validate(config)
  config = tiny_gemma4.get_config()
  config.model.preset = 'tiny'
  config.data.thinking = True
  with pytest.raises(validation.ConfigError, match='data.thinking'):
    validation.validate(config)
