"""Gemma 4 policies on tunix's NNX Gemma 4 (text decoder).

tunix 0.1.7 ships the modules (`tunix.models.gemma4.model`); this module adds
what the rest of agent_tunix needs from them:

* Presets for E2B, E4B, 12B, 26B-A4B and 31B, pretrained and instruction
  tuned (the same architecture), and two tiny random configs for tests. The
  12B is written from its published numbers (tunix 0.1.7 lacks it).
* `Gemma4`, tunix's model with the Gemma 3 interface the update and the
  sampler rely on: `output_hidden_states=True` sows the final-normed hidden
  states ('all_hidden_states'), so the log-prob passes project them onto the
  vocabulary in chunks instead of materialising [B, L, V] logits. The
  layer loop is tunix's: KV-shared layers read their donor's K/V from the
  same forward (prefill) or the donor's cache (decode).
* Mixture-of-experts routing as Hugging Face's reference computes it
  (`ExactTopKMoE`, `decoder_block`): the router reads the layer's residual
  stream, not the experts' normed input (tunix 0.1.7 passes the normed
  input; tunix fixed it after 0.1.7), and takes the exact top-k: tunix
  0.1.7 uses `jax.lax.approx_max_k`, whose TPU result may differ from the
  exact top-k, so the sampler and the trainer could route some tokens to
  different experts and the importance ratio would carry that error.
  Routing statistics (tokens per expert) come from `router_stats`.
* The family's weight loaders (`load_gguf`, `load_hf`, `load_orbax`) and
  tunix's block remat switched on in place (`remat_blocks`), which
  `families.GEMMA4` points at.

Everything GRPO computes from logits applies Gemma 4's final-logit softcap
(`apply_softcap` with the family's `final_logit_softcap`, `SOFTCAP`):
tanh(logits / 30) * 30.

The sliding-window layers keep a full-length KV cache
(`use_sliding_window_kv_cache=False`): tunix's ring cache cannot be combined
with a prefill that is not the first one, and GRPO's sequences (prompt +
completion, at most a few thousand tokens) make the saving small.
"""

import dataclasses
import os
import re

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from tunix.generate import utils as sampler_utils
from tunix.models.gemma4 import model as model_lib
from tunix.models.gemma4 import moe as moe_lib

from agent_tunix.models import gemma4_gguf
from agent_tunix.models import gguf as gguf_lib
from agent_tunix.models import lora as lora_lib
from agent_tunix.models import tunix_adapter
from agent_tunix.models import weights

ModelConfig = model_lib.ModelConfig
_L = model_lib.AttentionType.LOCAL_SLIDING
_G = model_lib.AttentionType.GLOBAL


def _gemma4_12b():
  """Gemma 4 12B from its published configuration (not in tunix 0.1.7)."""
  return ModelConfig(
      num_layers=48,
      num_embed=262144,
      embed_dim=3840,
      hidden_dim=15360,
      num_heads=16,
      head_dim=256,
      num_kv_heads=8,
      num_global_kv_heads=1,
      sliding_window_size=1024,
      k_eq_v_global=True,
      attention_pattern=(_L, _L, _L, _L, _L, _G),
  )


_FACTORIES = {
    'e2b': ModelConfig.gemma4_e2b,
    'e4b': ModelConfig.gemma4_e4b,
    '12b': _gemma4_12b,
    '26b_a4b': ModelConfig.gemma4_26b_a4b,
    '31b': ModelConfig.gemma4_31b,
}
# Preset name -> ModelConfig factory; '_it' names are the instruction-tuned
# checkpoints of the same architecture.
PRESETS = {f'gemma4_{size}{suffix}': factory
           for size, factory in _FACTORIES.items() for suffix in ('', '_it')}
VOCAB_SIZE = 262144
SOFTCAP = 30.0


def tiny_config(**kwargs):
  """A 6-layer random Gemma 4 that exercises every dense feature.

  Local and global layers (global: a wider head and fewer KV heads, K=V),
  per-layer embeddings, and KV sharing (the last 3 layers read layers 1 and
  2's K/V). The real vocabulary, so the Gemma 3 tokenizer's ids (the same
  262,144-entry space, with `<turn|>` at 106) can stand in offline.
  """
  fields = dict(
      num_layers=6,
      num_embed=VOCAB_SIZE,
      embed_dim=32,
      hidden_dim=64,
      num_heads=4,
      head_dim=16,
      num_kv_heads=2,
      num_global_kv_heads=1,
      global_key_size=24,
      sliding_window_size=16,
      per_layer_input_dim=4,
      frac_shared_layers=0.5,
      override_kv_shared_ffw_hidden=128,
      k_eq_v_global=True,
      attention_pattern=(_L, _L, _G),
  )
  fields.update(kwargs)
  return ModelConfig(**fields)


def tiny_moe_config(**kwargs):
  """A 3-layer random Gemma 4 mixture of experts (26B-A4B's layout)."""
  fields = dict(
      num_layers=3,
      hidden_dim=32,
      per_layer_input_dim=0,
      frac_shared_layers=0.0,
      override_kv_shared_ffw_hidden=None,
      enable_moe=True,
      num_experts=4,
      num_experts_per_tok=2,
      expert_dim=16,
      moe_dense_hidden_dim=32,
  )
  fields.update(kwargs)
  return tiny_config(**fields)


TINY_PRESETS = {'tiny_gemma4': tiny_config, 'tiny_gemma4_moe': tiny_moe_config}


def model_config(preset, dtype):
  """The ModelConfig of a Gemma 4 preset with parameters and compute in dtype.

  tunix's Gemma 4 defaults both `param_dtype` and `dtype` to float32; both
  follow `config.model.dtype` here, as Gemma 3's do.
  """
  factory = TINY_PRESETS.get(preset) or PRESETS[preset]
  return dataclasses.replace(
      factory(), param_dtype=dtype, dtype=dtype,
      use_sliding_window_kv_cache=False,
  )


def apply_softcap(logits, softcap):
  """tanh(logits / softcap) * softcap, in float32 (softcap None: as is)."""
  if softcap is None:
    return logits
  logits = logits.astype(jnp.float32)
  return jnp.tanh(logits / softcap) * softcap


class ExactTopKMoE(moe_lib.MoERagged):
  """tunix's ragged-dot experts, routed by the exact top-k of the residual.

  With `record_stats` set (`router_stats`), each call sows its expert
  choices ([..., top_k] int32) as 'moe_choices'. Routing is dropless (ragged
  dot, no capacity): no token is dropped.
  """

  def __call__(self, x, router_input=None):
    r = x if router_input is None else router_input
    var = jnp.mean(jnp.square(r.astype(jnp.float32)), axis=-1, keepdims=True)
    r = r * jax.lax.rsqrt(var + 1e-6).astype(r.dtype)
    r = r * jax.lax.rsqrt(jnp.array(self.features, r.dtype)) * (
        self.router_scale[...].astype(r.dtype))
    logits = jnp.einsum('gsd,de->gse', r,
                        self.router_logits[...].astype(r.dtype))
    weights, choices = self._router(logits)
    return self._run_ffw_and_routing(x, choices, weights)

  def add_lora(self, rank, scale, rngs):
    """Adds per-expert LoRA factors to `gating_einsum` and `linear`.

    Each expert e gets its own pair: gating_einsum [E, 2, H, D] gains
    A [E, D, r] and B [E, r, 2, H] (delta[e] = A[e] B[e], in the weight's
    (2, H, D) order), linear [E, H, D] gains A [E, H, r] and B [E, r, D].
    A starts He-uniform, B at zero (the model is unchanged until trained),
    as qwix initialises the dense adapters. Each factor keeps the expert
    axis's and its own input- or output-side axis's sharding from the
    weight it adapts; the rank axis is unsharded.
    """
    self.lora_scale = float(scale)
    e, h, d = self.num_experts, self.hidden_dim, self.features
    # (weight, A shape, B shape, the weight's axis behind each factor axis)
    factors = (
        ('gating_einsum', (e, d, rank), (e, rank, 2, h), (0, 3, None),
         (0, None, 1, 2)),
        ('linear', (e, h, rank), (e, rank, d), (0, 1, None), (0, None, 2)),
    )
    for name, a_shape, b_shape, a_axes, b_axes in factors:
      weight = getattr(self, name)
      dtype = weight.dtype
      a = jax.nn.initializers.he_uniform(in_axis=1, out_axis=2, batch_axis=0)(
          rngs.params(), a_shape, dtype)
      b = jnp.zeros(b_shape, dtype)
      for suffix, value, axes in (('_lora_a', a, a_axes),
                                  ('_lora_b', b, b_axes)):
        spec = _factor_spec(weight, axes)
        value = _place_like(weight, value, spec)
        kwargs = {} if spec is None else {'out_sharding': spec}
        setattr(self, name + suffix, nnx.LoRAParam(value, **kwargs))

  def _expert_lora(self, name, xs, sizes):
    """scale * (xs A[e]) B[e] for the rows of each expert, or None."""
    a = getattr(self, name + '_lora_a', None)
    if a is None or not lora_lib.adapters_on():
      return None
    b = getattr(self, name + '_lora_b')
    dtype = self.config.dtype
    b = b[...].reshape(b.shape[0], b.shape[1], -1).astype(dtype)
    low = jax.lax.ragged_dot(xs, a[...].astype(dtype), group_sizes=sizes)
    return jax.lax.ragged_dot(low, b, group_sizes=sizes) * jnp.asarray(
        self.lora_scale, dtype)

  def _run_ffw_and_routing(self, x, expert_choices, expert_weights):
    """The experts' gated FFN on the routed tokens, with their LoRA if any.

    The same computation as tunix 0.1.7's `MoERagged` (tokens sorted by
    expert, one ragged dot per projection, per-expert scale, weighted
    sum over the top-k), plus each expert's low-rank delta as two more
    ragged dots (`_expert_lora`): the merged [E, D, 2H] weights are never
    formed.
    """
    sizes, xs, reverse, combine = tunix_adapter.expert_dispatch(
        x, expert_choices, expert_weights)
    e, h, d = self.num_experts, self.hidden_dim, self.features
    dtype = self.config.dtype
    gate = jnp.transpose(self.gating_einsum[...], (0, 3, 1, 2))
    hidden = jax.lax.ragged_dot(
        xs, gate.reshape(e, d, 2 * h).astype(dtype), group_sizes=sizes)
    delta = self._expert_lora('gating_einsum', xs, sizes)
    if delta is not None:
      hidden = hidden + delta
    hidden = hidden.reshape(hidden.shape[0], 2, h)
    act = nnx.gelu(hidden[:, 0, :]) * hidden[:, 1, :]
    out = jax.lax.ragged_dot(act, self.linear[...].astype(dtype),
                             group_sizes=sizes)
    delta = self._expert_lora('linear', act, sizes)
    if delta is not None:
      out = out + delta
    expert_of_row = jnp.repeat(jnp.arange(e), sizes,
                               total_repeat_length=out.shape[0])
    out = out * self.per_expert_scale[...].astype(out.dtype)[expert_of_row,
                                                             None]
    out = tunix_adapter.expert_collect(out, reverse, combine)
    return jnp.einsum('blkd,blk->bld', out, combine,
                      preferred_element_type=out.dtype)

  def _router(self, router_logits):
    router_logits = router_logits.astype(jnp.float32)
    probs = jax.nn.softmax(router_logits, axis=-1)
    top, choices = jax.lax.top_k(probs, self.num_experts_per_datapoint)
    weights = jnp.zeros_like(probs)
    weights = jnp.put_along_axis(
        weights, choices, top / jnp.sum(top, -1, keepdims=True), axis=-1,
        inplace=False,
    )
    if getattr(self, 'record_stats', False):
      self.sow(nnx.Intermediate, 'moe_choices', choices)
    return weights, choices


def _factor_spec(weight, axes):
  """A LoRA factor's sharding: the weight's entry for each mapped axis."""
  spec = weight.get_metadata().get('out_sharding')
  if not spec:
    return None
  spec = tuple(spec) + (None,) * (len(weight.shape) - len(spec))
  return tuple(None if i is None else spec[i] for i in axes)


def _place_like(weight, value, spec):
  """`value` on the weight's mesh with `spec` when the weight is placed."""
  sharding = getattr(weight[...], 'sharding', None)
  if spec is None or not isinstance(sharding, jax.sharding.NamedSharding):
    return value
  return jax.device_put(value, jax.sharding.NamedSharding(
      sharding.mesh, jax.sharding.PartitionSpec(*spec)))


def decoder_block(layer, x, segment_pos, cache, attn_mask,
                  per_layer_input=None, kv_shared_cache=None):
  """One Gemma 4 decoder layer: (cache, output, (K, V)).

  tunix 0.1.7's `DecoderLayer.block`, except that the experts' router reads
  the residual stream (as Hugging Face's Gemma 4 does).
  """
  cache, attn, kv = layer.attn(layer.pre_attention_norm(x), segment_pos,
                               cache, attn_mask,
                               kv_shared_cache=kv_shared_cache)
  residual = layer.post_attention_norm(attn) + x
  ffw = layer.mlp(layer.pre_ffw_norm(residual))
  if layer.config.enable_moe:
    experts = layer.moe(layer.moe_pre_ffw_norm(residual),
                        router_input=residual)
    ffw = (layer.dense_post_ffw_norm(ffw)
           + layer.moe_post_ffw_norm(experts))
  out = layer.post_ffw_norm(ffw) + residual
  if layer.config.per_layer_input_dim > 0 and per_layer_input is not None:
    mapped = jax.nn.gelu(layer.per_layer_input_gate(out)) * per_layer_input
    out = out + layer.post_per_layer_input_norm(
        layer.per_layer_projection(mapped))
  return cache, out * layer.skip_scale[...], kv


class DecoderLayer(model_lib.DecoderLayer):
  """tunix's Gemma 4 decoder layer computing `decoder_block`."""

  block = decoder_block


class Gemma4(model_lib.Gemma4):
  """tunix's Gemma 4 that can return its final hidden states.

  Built with `DecoderLayer`s (`decoder_block`) and `ExactTopKMoE` experts.
  `output_hidden_states=True` sows the
  final-normed hidden states [B, L, D] as 'all_hidden_states' (tunix's Gemma
  3 convention); the logits are still returned, softcapped (unused, XLA
  removes their matmul under jit).
  """

  def __init__(self, config, *, rngs):
    super().__init__(config, rngs=rngs)
    for layer in self.layers:
      layer.__class__ = DecoderLayer
      if hasattr(layer, 'moe'):
        layer.moe.__class__ = ExactTopKMoE
    _unshard_unit_dims(self)

  def add_expert_lora(self, rank, scale, seed=0):
    """Per-expert LoRA (`ExactTopKMoE.add_lora`) on every MoE layer.

    Returns the number of layers adapted (0 for a dense model).
    """
    moes = [layer.moe for layer in self.layers if hasattr(layer, 'moe')]
    rngs = nnx.Rngs(seed)
    for moe in moes:
      moe.add_lora(rank, scale, rngs)
    return len(moes)

  def __call__(self, tokens, positions=None, cache=None, attention_mask=None,
               decode_only_last_token=False, segment_ids=None,
               output_hidden_states=False):
    del segment_ids
    if positions is None:
      batch, length = tokens.shape
      positions = jnp.tile(jnp.arange(length)[None, :], (batch, 1))
    x = self.embedder.encode(tokens)
    per_layer = None
    if self.config.per_layer_input_dim > 0:
      per_layer = self.embedder.encode_per_layer_input(x, tokens)
    prefill = tokens.shape[1] > 1
    new_cache, donors_kv = {}, {}
    for i, layer in enumerate(self.layers):
      donor = self.kv_cache_sharing_patterns[i]
      if donor != i:  # A KV-shared layer: the donor's K/V, no cache.
        layer_cache = None
        if prefill:
          k, v = donors_kv[donor]
          shared = {'k': k, 'v': v}
        else:
          shared = new_cache[f'layer_{donor}']
      else:
        layer_cache = cache[f'layer_{i}'] if cache else None
        shared = None
      with jax.named_scope(f'layer_{i}'):
        layer_cache, x, kv = layer(
            x, positions, layer_cache, attention_mask,
            per_layer_input=(per_layer[:, :, i, :] if per_layer is not None
                             else None),
            kv_shared_cache=shared,
        )
      if prefill and i in self.shared_layer_origins:
        donors_kv[i] = kv
      if donor == i:
        new_cache[f'layer_{i}'] = layer_cache
    x = self.final_norm(x)
    if output_hidden_states:
      self.sow(nnx.Intermediate, 'all_hidden_states', x)
    if decode_only_last_token:
      x = x[:, -1:, :]
    logits = apply_softcap(self.embedder.decode(x),
                           self.config.final_logit_softcap)
    return logits, (None if cache is None else new_cache)


def _unshard_unit_dims(model):
  """Drops mesh axes from the sharding of parameter dimensions of size 1.

  tunix shards the K = V projection `k_einsum` [K, D, H] over 'tp' on its
  KV-head axis, which has size 1 on the 12B's global layers (and the tiny
  models'): any 'tp' > 1 then fails to place it. A size-1 dimension is
  never split; its entry becomes None (qwix's LoRA factors inherit this).
  """
  for _, var in nnx.iter_graph(model):
    if not isinstance(var, nnx.Param):
      continue
    spec = var.get_metadata().get('out_sharding')
    if not spec or len(spec) != len(var.shape):
      continue
    fixed = tuple(None if size == 1 else axis
                  for axis, size in zip(spec, var.shape))
    if fixed != tuple(spec):
      var.set_metadata('out_sharding', fixed)


def moe_costs(cfg, lora_rank=0):
  """Per token and MoE layer: what routing costs beside the experts' work.

  Counted from the config (not measured): the router's matmul
  (2 D E FLOPs), the top-k experts' gated FFN (6 D H k: gate/up [D, 2H]
  and down [H, D] for each of the k), their LoRA factors when adapted
  (`lora_rank` > 0: 2 k r (2D + 3H)), and the activations the dropless
  dispatch copies (each token's D values to its k experts and back:
  2 k D elements). None for a dense config.
  """
  if not getattr(cfg, 'enable_moe', False):
    return None
  d, e, h, k = (cfg.embed_dim, cfg.num_experts, cfg.expert_dim,
                cfg.num_experts_per_tok)
  router = 2 * d * e
  experts = 6 * d * h * k
  return {
      'moe_layers': cfg.num_layers,  # Every Gemma 4 MoE layer has experts.
      'num_experts': e,
      'top_k': k,
      'routing': 'exact top-k (jax.lax.top_k), dropless (ragged dot)',
      'router_flops': router,
      'expert_flops': experts,
      'expert_lora_flops': 2 * k * lora_rank * (2 * d + 3 * h),
      'router_share': router / experts,
      'dispatch_elements': 2 * k * d,
  }


def router_stats(model, tokens, input_mask):
  """[MoE layers, experts] int32: real tokens routed to each expert.

  Runs the model once with the routers recording their choices; padding
  positions are not counted. Each real token counts once per expert among
  its top-k, so every row sums to (real tokens) x top_k.
  """
  moes = [layer.moe for layer in model.layers if hasattr(layer, 'moe')]
  for m in moes:
    m.record_stats = True
  try:
    def forward(module):
      module(tokens, None, None, sampler_utils.make_causal_attn_mask(
          input_mask, tokens.shape[1]))

    _, sown = nnx.capture(forward, nnx.Intermediate)(model)
  finally:
    for m in moes:
      m.record_stats = False
  real = input_mask.astype(jnp.int32)
  counts = []
  for _, var in sorted(nnx.to_flat_state(sown),
                       key=lambda item: int(item[0][1])):
    choices = var.get_value()[0]  # [B, L, k]
    one_hot = jax.nn.one_hot(choices, moes[0].num_experts, dtype=jnp.int32)
    counts.append(jnp.einsum('blke,bl->e', one_hot, real))
  return jnp.stack(counts)


def load_scalars(counts):
  """Logged load-balance figures of `router_stats` counts (host numpy).

  moe/max_load and moe/min_load: the busiest and idlest expert's tokens
  over the mean per expert (1 = balanced), worst layer; moe/idle_experts:
  experts that got no token, summed over layers; moe/dropped_tokens: 0,
  the routing is dropless.
  """
  counts = np.asarray(counts, np.float64)
  mean = np.maximum(counts.mean(axis=1, keepdims=True), 1e-9)
  share = counts / mean
  return {
      'moe/max_load': float(share.max(axis=1).max()),
      'moe/min_load': float(share.min(axis=1).min()),
      'moe/idle_experts': float((counts == 0).sum()),
      'moe/dropped_tokens': 0.0,
  }


def remat_blocks(module):
  """Sets tunix's RematConfig.BLOCK on every Attention and FeedForward of
  `module` (they read it from their shared config); returns how many."""
  found = 0
  for _, sub in nnx.iter_modules(module):
    if isinstance(sub, (model_lib.Attention, model_lib.FeedForward)):
      sub.config = dataclasses.replace(
          sub.config, remat_config=model_lib.RematConfig.BLOCK
      )
      found += 1
  return found


# ------------------------------------------------------------ weight loaders


def hf_params(hf_pairs, cfg, source_name):
  """{tunix path: host array} of Gemma 4 tensors in Hugging Face's layout.

  Names and layouts are tunix's Gemma 4 mapping (`params_safetensors`);
  tensors it does not map (the vision and audio towers) are skipped. A
  KV-shared layer computes no K/V: Hugging Face checkpoints written by
  transformers (and GGUF files) leave out its K/V projection and key norm,
  which tunix's module still has (unused); those get zeros (ones for the
  norm).

  Args:
    hf_pairs: (Hugging Face name, array) pairs (safetensors, or a GGUF
      file's tensors renamed by `gemma4_gguf`).
    cfg: the tunix Gemma 4 ModelConfig.
    source_name: the checkpoint's path (for the log).
  """
  from tunix.utils import torch_utils  # pylint: disable=g-import-not-at-top
  mapping = tunix_adapter.gemma4_key_mapping(cfg)
  raw, skipped = {}, 0
  for key, value in hf_pairs:
    try:
      target, transform = torch_utils.torch_key_to_jax_key(mapping, key)
    except ValueError:
      skipped += 1
      continue
    if transform is not None:
      permute, reshape = transform
      value = value.transpose(permute) if permute else value
      value = value.reshape(reshape) if reshape else value
    raw[target] = value
  flat = {k.removesuffix('.value'): v for k, v in
          tunix_adapter.gemma4_preprocess_fn(cfg)(raw).items()}
  if skipped:
    logging.info('%s: skipped %d tensors outside the text decoder.',
                 source_name, skipped)
  model = weights.abstract_model(Gemma4, cfg)
  abstract = weights.flat_state(model)
  sharing = model.kv_cache_sharing_patterns
  filled = []
  for path, var in abstract.items():
    m = re.fullmatch(r'layers\.(\d+)\.attn\.(kv_einsum\.w|k_einsum\.w|'
                     r'_key_norm\.scale)', path)
    if path in flat or not m or sharing[int(m.group(1))] == int(m.group(1)):
      continue
    fill = np.ones if m.group(2) == '_key_norm.scale' else np.zeros
    flat[path] = fill(var.value.shape, np.float32)
    filled.append(path)
  if filled:
    logging.info('%s: %d unused parameters of KV-shared layers set to '
                 'constants (not in the checkpoint).', source_name,
                 len(filled))
  return flat


def _read_safetensors(directory):
  """Yields (name, array) of every tensor in a directory's safetensors."""
  import safetensors  # pylint: disable=g-import-not-at-top
  for name in sorted(os.listdir(directory)):
    if not name.endswith('.safetensors'):
      continue
    with safetensors.safe_open(os.path.join(directory, name),
                               framework='numpy') as f:
      for key in f.keys():
        yield key, f.get_tensor(key)


def load_gguf(path, cfg, cache_dir):
  """{tunix path: array} of a Gemma 4 GGUF file (see `gemma4_gguf`)."""
  layers = gemma4_gguf.Layers(weights.abstract_model(Gemma4, cfg))
  return gguf_lib.load_params_cached(
      path, cfg, cache_dir,
      check=lambda reader, file, c: gemma4_gguf.check_architecture(
          reader.metadata, file, c, layers),
      load=lambda file, c, reader: hf_params(
          gemma4_gguf.hf_tensors(gguf_lib.dequantized(reader), file, c,
                                 layers),
          c, file))


def load_hf(directory, cfg, mesh):
  """The model from a local Hugging Face directory (`hf_params`)."""
  flat = hf_params(_read_safetensors(directory), cfg, directory)
  return weights.place_params(Gemma4, cfg, flat, mesh, directory)


def load_orbax(path, cfg, mesh):
  """The model from an official Flax/Orbax checkpoint, by tunix's loader."""
  from tunix.models.gemma4 import params as params_lib  # pylint: disable=g-import-not-at-top
  model = params_lib.create_model_from_checkpoint(
      path, cfg, mesh=mesh, dtype=cfg.param_dtype
  )
  # tunix built its own class; the same variables go into ours.
  ours = weights.abstract_model(Gemma4, cfg)
  nnx.update(ours, nnx.state(model))
  return ours
