"""Gemma 4 in llama.cpp's GGUF layout (architecture 'gemma4').

Export and import go through the Hugging Face layout (`gemma4_hf`): a GGUF
tensor is a Hugging Face tensor under another name, with the same numpy
shape (GGUF lists dimensions fastest first, numpy slowest first, so a
[out, in] matrix is stored as it is). Unlike Gemma 3, RMSNorm weights are
stored as they are (Gemma 4 multiplies by w, not 1 + w), and no scale is
folded into any tensor.

  GGUF (blk.N. below a layer)        Hugging Face (model.language_model.)
  token_embd                         embed_tokens
  per_layer_token_embd               embed_tokens_per_layer
  per_layer_model_proj               per_layer_model_projection
  per_layer_proj_norm                per_layer_projection_norm
  output_norm                        norm
  attn_q, attn_k, attn_v             self_attn.{q,k,v}_proj (no attn_v: K = V)
  attn_output                        self_attn.o_proj
  attn_q_norm, attn_k_norm           self_attn.{q,k}_norm
  attn_norm, post_attention_norm     input_layernorm, post_attention_layernorm
  ffn_norm, post_ffw_norm            {pre,post}_feedforward_layernorm
  pre_ffw_norm_2                     pre_feedforward_layernorm_2 (experts)
  post_ffw_norm_1, post_ffw_norm_2   post_feedforward_layernorm_{1,2}
  ffn_gate, ffn_up, ffn_down         mlp.{gate,up,down}_proj
  ffn_gate_inp, ffn_gate_inp.scale   router.proj, router.scale
  ffn_down_exps.scale                router.per_expert_scale
  ffn_gate_up_exps, ffn_down_exps    experts.gate_up_proj, experts.down_proj
  layer_output_scale                 layer_scalar
  inp_gate, proj, post_norm          per_layer_input_gate, per_layer_projection,
                                     post_per_layer_input_norm

KV-shared layers compute no K/V, so their K/V projections and key norm are
not written (as Hugging Face checkpoints leave them out); `rope_freqs` holds
the proportional RoPE of the global layers (1 for the rotated frequency
pairs, 1e30 for the rest, which leaves those dimensions unrotated). On
import, experts stored as separate ffn_gate_exps / ffn_up_exps are joined.

The metadata keys are llama.cpp's for this architecture (read from its
converter and loader; no llama.cpp binary checks the files here).
`file_parts` is what an export writes of a merged model.
"""

import re

import gguf
import numpy as np

from agent_tunix.models import gemma4_hf
from agent_tunix.models import gguf as gguf_lib

ARCH = 'gemma4'
# tokenizer.ggml.model of Gemma 4's BPE vocabulary: the architecture's name.
TOKENIZER_MODEL = ARCH
_PREFIX = gemma4_hf.PREFIX
# GGUF name -> Hugging Face name (after the model.language_model. prefix).
_GLOBAL = {
    'token_embd.weight': 'embed_tokens.weight',
    'per_layer_token_embd.weight': 'embed_tokens_per_layer.weight',
    'per_layer_model_proj.weight': 'per_layer_model_projection.weight',
    'per_layer_proj_norm.weight': 'per_layer_projection_norm.weight',
    'output_norm.weight': 'norm.weight',
}
# Below blk.N. -> below layers.N.
_LAYER = {
    'attn_q.weight': 'self_attn.q_proj.weight',
    'attn_k.weight': 'self_attn.k_proj.weight',
    'attn_v.weight': 'self_attn.v_proj.weight',
    'attn_output.weight': 'self_attn.o_proj.weight',
    'attn_q_norm.weight': 'self_attn.q_norm.weight',
    'attn_k_norm.weight': 'self_attn.k_norm.weight',
    'attn_norm.weight': 'input_layernorm.weight',
    'post_attention_norm.weight': 'post_attention_layernorm.weight',
    'ffn_norm.weight': 'pre_feedforward_layernorm.weight',
    'post_ffw_norm.weight': 'post_feedforward_layernorm.weight',
    'pre_ffw_norm_2.weight': 'pre_feedforward_layernorm_2.weight',
    'post_ffw_norm_1.weight': 'post_feedforward_layernorm_1.weight',
    'post_ffw_norm_2.weight': 'post_feedforward_layernorm_2.weight',
    'ffn_gate.weight': 'mlp.gate_proj.weight',
    'ffn_up.weight': 'mlp.up_proj.weight',
    'ffn_down.weight': 'mlp.down_proj.weight',
    'ffn_gate_inp.weight': 'router.proj.weight',
    'ffn_gate_inp.scale': 'router.scale',
    'ffn_down_exps.scale': 'router.per_expert_scale',
    'ffn_gate_up_exps.weight': 'experts.gate_up_proj',
    'ffn_down_exps.weight': 'experts.down_proj',
    'layer_output_scale.weight': 'layer_scalar',
    'inp_gate.weight': 'per_layer_input_gate.weight',
    'proj.weight': 'per_layer_projection.weight',
    'post_norm.weight': 'post_per_layer_input_norm.weight',
}
_TO_GGUF_GLOBAL = {v: k for k, v in _GLOBAL.items()}
_TO_GGUF_LAYER = {v: k for k, v in _LAYER.items()}
_GGUF_LAYER = re.compile(r'blk\.(\d+)\.(.+)')
_HF_LAYER = re.compile(r'layers\.(\d+)\.(.+)')
# The K/V tensors a KV-shared layer has in tunix but never uses.
_KV_ONLY = ('self_attn.k_proj.weight', 'self_attn.v_proj.weight',
            'self_attn.k_norm.weight')
ROPE_FREQS = 'rope_freqs.weight'
# Special tokens llama.cpp's converter types user-defined (shown in its
# output): the thought channel and the tool-call pieces.
_VISIBLE = ('<|channel>', '<channel|>', '<|tool_call>', '<tool_call|>',
            '<|tool_response>', '<tool_response|>', '<|"|>')
# Tensors llama.cpp keeps in float32 whatever the file type.
_ALWAYS_F32 = ('ffn_gate_inp.weight',)


class Gemma4GGUFError(gguf_lib.GGUFError):
  """A GGUF file that is not the configured Gemma 4 model."""


def gguf_name(hf_name):
  """llama.cpp's name of a Hugging Face Gemma 4 tensor."""
  name = hf_name.removeprefix(_PREFIX)
  if name in _TO_GGUF_GLOBAL:
    return _TO_GGUF_GLOBAL[name]
  m = _HF_LAYER.fullmatch(name)
  if not m or m.group(2) not in _TO_GGUF_LAYER:
    raise ValueError(f'No GGUF name for the Gemma 4 tensor {hf_name!r}.')
  return f'blk.{m.group(1)}.{_TO_GGUF_LAYER[m.group(2)]}'


def hf_name(name):
  """The Hugging Face name of a GGUF Gemma 4 tensor; None if it has none."""
  if name in _GLOBAL:
    return _PREFIX + _GLOBAL[name]
  m = _GGUF_LAYER.fullmatch(name)
  if m and m.group(2) in _LAYER:
    return f'{_PREFIX}layers.{m.group(1)}.{_LAYER[m.group(2)]}'
  return None


def stored_f32(name):
  """Whether llama.cpp keeps this tensor in float32 in any file type."""
  return name.endswith(_ALWAYS_F32) or not name.endswith('.weight')


class Layers:
  """Per-layer facts of a Gemma 4 model, read from its modules."""

  def __init__(self, model):
    self.sharing = list(model.kv_cache_sharing_patterns)
    self.sliding, self.kv_heads, self.head_dims, self.ffn = [], [], [], []
    for layer in model.layers:
      attn = layer.attn
      self.sliding.append(attn.attn_type != attn.attn_type.GLOBAL)
      self.kv_heads.append(int(attn.num_kv_heads))
      self.head_dims.append(int(attn.head_dim))
      self.ffn.append(int(layer.mlp.gate_proj.kernel.shape[-1]))

  def shared(self, i):
    return self.sharing[i] != i

  @property
  def num_shared(self):
    return sum(map(self.shared, range(len(self.sharing))))

  def head_dim(self, sliding):
    dims = {d for d, s in zip(self.head_dims, self.sliding) if s == sliding}
    if not dims:
      return None
    if len(dims) > 1:
      raise ValueError(f'Layers of one kind with head dims {sorted(dims)}.')
    return dims.pop()


def rope_freqs(cfg, layers):
  """The global layers' proportional RoPE as llama.cpp's frequency factors."""
  dim = layers.head_dim(sliding=False)
  rotated = int(dim * cfg.global_rope_proportion / 2)
  return np.array([1.0] * rotated + [1e30] * (dim // 2 - rotated), np.float32)


def _scalar_or_array(values):
  return int(values[0]) if len(set(values)) == 1 else [int(v) for v in values]


def add_hparams(writer, cfg, layers, context):
  """Writes the 'gemma4.*' hyperparameters llama.cpp reads."""
  global_dim = layers.head_dim(sliding=False) or cfg.head_dim
  local_dim = layers.head_dim(sliding=True) or cfg.head_dim
  writer.add_context_length(context)
  writer.add_embedding_length(cfg.embed_dim)
  writer.add_block_count(cfg.num_layers)
  writer.add_feed_forward_length(_scalar_or_array(layers.ffn))
  writer.add_head_count(cfg.num_heads)
  writer.add_head_count_kv(_scalar_or_array(layers.kv_heads))
  writer.add_key_length(global_dim)
  writer.add_value_length(global_dim)
  writer.add_key_length_swa(local_dim)
  writer.add_value_length_swa(local_dim)
  writer.add_layer_norm_rms_eps(1e-6)
  writer.add_sliding_window(cfg.sliding_window_size)
  writer.add_sliding_window_pattern(list(layers.sliding))
  writer.add_shared_kv_layers(layers.num_shared)
  writer.add_embedding_length_per_layer_input(cfg.per_layer_input_dim or 0)
  writer.add_rope_freq_base(float(cfg.global_base_frequency))
  writer.add_rope_freq_base_swa(float(cfg.local_base_frequency))
  writer.add_rope_dimension_count(global_dim)
  writer.add_rope_dimension_count_swa(
      int(local_dim * cfg.local_rope_proportion))
  writer.add_final_logit_softcapping(float(cfg.final_logit_softcap))
  if cfg.enable_moe:
    writer.add_expert_count(cfg.num_experts)
    writer.add_expert_used_count(cfg.num_experts_per_tok)
    writer.add_expert_feed_forward_length(cfg.expert_dim)


def export_tensors(hf_pairs, cfg, layers):
  """(GGUF name, array) of the merged model's Hugging Face tensors.

  Leaves out the K/V tensors of KV-shared layers and appends rope_freqs.
  """
  for name, w in hf_pairs:
    m = _HF_LAYER.fullmatch(name.removeprefix(_PREFIX))
    if m and m.group(2) in _KV_ONLY and layers.shared(int(m.group(1))):
      continue
    yield gguf_name(name), w
  if layers.head_dim(sliding=False) is not None:  # Any global layer.
    yield ROPE_FREQS, rope_freqs(cfg, layers)


def file_parts(hf_pairs, cfg, model, context):
  """(GGUF tensors, `gemma3_gguf.write_gguf_file`'s architecture arguments:
  `ARCH` and its hyperparameters) of a merged Gemma 4 `model`."""
  layers = Layers(model)
  return export_tensors(hf_pairs, cfg, layers), dict(
      arch=ARCH,
      hparams=lambda writer: add_hparams(writer, cfg, layers, context))


def check_architecture(metadata, path, cfg, layers):
  """Checks the file's hyperparameters against the preset."""
  arch = metadata.get('general.architecture')
  if arch != ARCH:
    raise Gemma4GGUFError(
        f'{path!r} holds a {arch!r} model; the configured preset is Gemma 4 '
        f"(architecture '{ARCH}'). Pick the config.model.preset that matches "
        'the file.')
  expected = {
      'block_count': cfg.num_layers,
      'embedding_length': cfg.embed_dim,
      'attention.head_count': cfg.num_heads,
      'attention.key_length': layers.head_dim(sliding=False),
      'attention.key_length_swa': layers.head_dim(sliding=True),
      'embedding_length_per_layer_input': cfg.per_layer_input_dim or 0,
      'attention.shared_kv_layers': layers.num_shared,
      'expert_count': cfg.num_experts if cfg.enable_moe else None,
  }
  for key, want in expected.items():
    found = metadata.get(f'{ARCH}.{key}')
    if want is None or found is None:
      continue
    if int(found) != int(want):
      raise Gemma4GGUFError(
          f'{path!r}: {ARCH}.{key} is {found}, but the configured preset '
          f'({cfg.num_layers} layers) expects {want}. Pick the '
          'config.model.preset that matches the file.')


def hf_tensors(named_arrays, path, cfg, layers):
  """Yields (Hugging Face name, float32 array) of a GGUF file's tensors.

  Args:
    named_arrays: (GGUF name, dequantized float32 array) pairs.
    path: the file (for messages).
    cfg: the preset's tunix ModelConfig.
    layers: its `Layers`.
  """
  split_experts = {}
  for name, w in named_arrays:
    if name == ROPE_FREQS:
      want = rope_freqs(cfg, layers)
      if w.shape != want.shape or not np.array_equal(w > 1e20, want > 1e20):
        raise Gemma4GGUFError(
            f'{path!r}: rope_freqs rotates {int((w <= 1e20).sum())} of '
            f'{w.size} frequency pairs; the preset rotates '
            f'{int((want <= 1e20).sum())} (global_rope_proportion '
            f'{cfg.global_rope_proportion}). Pick the matching preset.')
      continue
    m = _GGUF_LAYER.fullmatch(name)
    if m and m.group(2) in ('ffn_gate_exps.weight', 'ffn_up_exps.weight'):
      split_experts.setdefault(int(m.group(1)), {})[m.group(2)[4:6]] = w
      continue
    target = hf_name(name)
    if target is None:
      raise Gemma4GGUFError(
          f'{path!r}: tensor {name!r} is not part of a Gemma 4 text model.')
    yield target, w
  for layer, parts in sorted(split_experts.items()):
    if set(parts) != {'ga', 'up'}:
      raise Gemma4GGUFError(
          f'{path!r}: layer {layer} has only one of ffn_gate_exps and '
          'ffn_up_exps.')
    # Hugging Face's gate_up_proj [experts, 2 x width, dim]: gate rows first.
    yield (f'{_PREFIX}layers.{layer}.experts.gate_up_proj',
           np.concatenate([parts['ga'], parts['up']], axis=1))


def token_types(tokens, specials, added):
  """GGUF token types of a BPE vocabulary (llama.cpp's numbering).

  Args:
    tokens: the pieces, by id.
    specials: ids of special added tokens (control, except the thought
      channel and tool pieces, which are user-defined so llama.cpp prints
      them).
    added: ids of other added tokens (user-defined).
  """
  types = np.full(len(tokens), gguf.TokenType.NORMAL, np.int32)
  for i, piece in enumerate(tokens):
    if re.fullmatch(r'<0x[0-9A-F]{2}>', piece):
      types[i] = gguf.TokenType.BYTE
  types[list(added)] = gguf.TokenType.USER_DEFINED
  types[list(specials)] = gguf.TokenType.CONTROL
  for i, piece in enumerate(tokens):
    if piece in _VISIBLE:
      types[i] = gguf.TokenType.USER_DEFINED
  return types
