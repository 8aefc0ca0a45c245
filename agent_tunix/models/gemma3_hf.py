"""Gemma 3 in Hugging Face's layout: tensor names, shapes and config.json.

The inverse of the safetensors mapping tunix's Gemma 3 loader reads, so an
exported directory loads back with `config.model.source='hf'`; also the
Hugging Face checkpoint of each preset (a PEFT adapter's base model), the
LoRA products of the adapted weights and the chat template. Imports tunix
only.

qwix adds (lora_alpha / lora_rank) * x A B to the output of every adapted
weight W, where A spans the dims of W contracted with the input and B the
rest (N heads, D model dim, H head dim, K kv heads, F hidden dim, r rank):

  tunix weight                  LoRA A, B             Hugging Face weight
  q_einsum.w [N, D, H]          [D, r], [r, N, H]     q_proj [N*H, D]
  kv_einsum.w [2, K, D, H]      [D, r], [r, 2, K, H]  k_proj, v_proj [K*H, D]
  attn_vec_einsum.w [N, H, D]   [N, H, r], [r, D]     o_proj [D, N*H]
  {gate,up}_proj.kernel [D, F]  [D, r], [r, F]        {gate,up}_proj [F, D]
  down_proj.kernel [F, D]       [F, r], [r, D]        down_proj [D, F]

with q_proj[n*H + h, d] = q_einsum.w[n, d, h] and o_proj[d, n*H + h] =
attn_vec_einsum.w[n, h, d]. So the merged weight is W + (alpha / r) * A B in
the tunix layout, mapped like any other weight. PEFT stores lora_A [r, in]
and lora_B [out, r] and adds (lora_alpha / r) * B A to the [out, in] weight:
the same scale, with A and B transposed and flattened into those layouts (k
and v share the LoRA A of kv_einsum). Hugging Face stores RMSNorm weights as
tunix does (the layer multiplies by 1 + w); llama.cpp stores 1 + w for Gemma
3 (gemma3_gguf.py) and w for Gemma 4 (gemma4_gguf.py).
"""

import itertools
import re

from tunix.models.gemma3 import model as model_lib


class LayoutError(ValueError):
  """A Gemma 3 weight or model with no Hugging Face (or llama.cpp) layout."""


# The Hugging Face checkpoint of each preset: a PEFT adapter's base model.
HF_REPOS = {
    'gemma3_270m': 'google/gemma-3-270m',
    'gemma3_270m_it': 'google/gemma-3-270m-it',
    'gemma3_1b_pt': 'google/gemma-3-1b-pt',
    'gemma3_1b_it': 'google/gemma-3-1b-it',
    'gemma3_4b_pt': 'google/gemma-3-4b-pt',
    'gemma3_4b_it': 'google/gemma-3-4b-it',
    'gemma3_12b_pt': 'google/gemma-3-12b-pt',
    'gemma3_12b_it': 'google/gemma-3-12b-it',
    'gemma3_27b_pt': 'google/gemma-3-27b-pt',
    'gemma3_27b_it': 'google/gemma-3-27b-it',
}
# Presets whose Hugging Face checkpoint is Gemma3ForConditionalGeneration
# (text and vision); its text layers are model.language_model.layers.N
# (transformers >= 4.52).
MULTIMODAL = ('gemma3_4b_pt', 'gemma3_4b_it', 'gemma3_12b_pt',
              'gemma3_12b_it', 'gemma3_27b_pt', 'gemma3_27b_it')
# Presets with a 32k context; the others have 128k.
_SHORT_CONTEXT = ('gemma3_270m', 'gemma3_270m_it', 'gemma3_1b_pt',
                  'gemma3_1b_it', 'tiny')
RMS_NORM_EPS = 1e-6  # tunix's RMSNorm.
# Gemma 3's chat template (Jinja, as Hugging Face and llama.cpp read it): a
# system message is put in front of the next user turn, as
# data/prompts.chat_prompt does.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set pending = namespace(system='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- set pending.system = message['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}"
    "{{ '<start_of_turn>' + role + '\n' + pending.system"
    " + message['content'] + '<end_of_turn>\n' }}"
    "{%- set pending.system = '' -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}"
    "{%- endif -%}"
)

# Adapted tunix weight (path below layers.N) -> einsum of its LoRA delta
# 'A,B->W' (see the module docstring).
LORA_DELTA_EINSUM = {
    'attn.q_einsum.w': 'dr,rnh->ndh',
    'attn.kv_einsum.w': 'dr,rckh->ckdh',
    'attn.qkv_einsum.w': 'dr,rsnh->sndh',
    'attn.attn_vec_einsum.w': 'nhr,rd->nhd',
    'mlp.gate_proj.kernel': 'ir,ro->io',
    'mlp.up_proj.kernel': 'ir,ro->io',
    'mlp.down_proj.kernel': 'ir,ro->io',
}
# tunix RMSNorm (path below layers.N) -> Hugging Face module.
_NORMS = {
    'pre_attention_norm.scale': 'input_layernorm',
    'post_attention_norm.scale': 'post_attention_layernorm',
    'pre_ffw_norm.scale': 'pre_feedforward_layernorm',
    'post_ffw_norm.scale': 'post_feedforward_layernorm',
    'attn._query_norm.scale': 'self_attn.q_norm',
    'attn._key_norm.scale': 'self_attn.k_norm',
}
_LAYER_RE = re.compile(r'layers\.(\d+)\.(.+)')


def split_layer(name):
  """'layers.3.attn.q_einsum.w' -> (3, 'attn.q_einsum.w')."""
  m = _LAYER_RE.fullmatch(name)
  if not m:
    raise LayoutError(f'Parameter {name!r} is not in a decoder layer.')
  return int(m.group(1)), m.group(2)


def _heads_to_rows(w):
  """[X, D, H] (tunix q/k/v) -> [X*H, D] (HF q/k/v_proj)."""
  x, d, h = w.shape
  return w.transpose(0, 2, 1).reshape(x * h, d)


def hf_tensors(name, w):
  """Hugging Face Gemma 3 (name, array) pairs of one tunix parameter."""
  if name == 'embedder.input_embedding':
    return [('model.embed_tokens.weight', w)]
  if name == 'final_norm.scale':
    return [('model.norm.weight', w)]
  layer, sub = split_layer(name)
  pre = f'model.layers.{layer}.'
  if sub == 'attn.q_einsum.w':
    return [(pre + 'self_attn.q_proj.weight', _heads_to_rows(w))]
  if sub in ('attn.kv_einsum.w', 'attn.qkv_einsum.w'):
    parts = ('k', 'v') if sub == 'attn.kv_einsum.w' else ('q', 'k', 'v')
    return [(f'{pre}self_attn.{p}_proj.weight', _heads_to_rows(x))
            for p, x in zip(parts, w)]
  if sub == 'attn.attn_vec_einsum.w':
    n, h, d = w.shape
    return [(pre + 'self_attn.o_proj.weight', w.reshape(n * h, d).T)]
  m = re.fullmatch(r'mlp\.(gate|up|down)_proj\.kernel', sub)
  if m:
    return [(f'{pre}mlp.{m.group(1)}_proj.weight', w.T)]
  if sub in _NORMS:
    return [(pre + _NORMS[sub] + '.weight', w)]
  raise LayoutError(f'No Hugging Face name for parameter {name!r}.')


def is_multimodal(preset):
  """Whether the preset's checkpoint nests its text layers in
  model.language_model (Gemma3ForConditionalGeneration)."""
  return preset in MULTIMODAL


def context_length(preset):
  """max_position_embeddings of a Gemma 3 preset: 32k or 128k."""
  return 32768 if preset in _SHORT_CONTEXT else 131072


def layer_types(cfg):
  """'sliding_attention' / 'full_attention' per layer, as tunix builds them."""
  pattern = itertools.cycle(model_lib.GEMMA3_ATTENTION_PATTERN)
  return [
      'sliding_attention' if kind == model_lib.AttentionType.LOCAL_SLIDING
      else 'full_attention'
      for _, kind in zip(range(cfg.num_layers), pattern)
  ]


def query_pre_attn_scalar(cfg):
  """HF scales queries by this**-0.5; tunix's QueryPreAttentionNormalisation."""
  norm = model_lib.QueryPreAttentionNormalisation
  if cfg.query_pre_attn_norm == norm.BY_ONE_OVER_SQRT_HEAD_DIM:
    return cfg.head_dim
  if cfg.query_pre_attn_norm == norm.BY_ONE_OVER_SQRT_EMBED_DIM_DIV_NUM_HEADS:
    return cfg.embed_dim // cfg.num_heads
  raise LayoutError(f'Unknown query_pre_attn_norm {cfg.query_pre_attn_norm}.')


def check_exportable(cfg):
  """Raises LayoutError for a Gemma 3 that Hugging Face or llama.cpp cannot
  hold."""
  if cfg.local_scale_factor != 1.0:
    raise LayoutError(
        f'local_scale_factor={cfg.local_scale_factor}: Hugging Face and '
        'llama.cpp Gemma 3 only scale the RoPE of global layers.'
    )
  if cfg.vision_config is not None:
    raise LayoutError('Only text-only Gemma 3 models can be exported.')


def hf_config(cfg, context, token_ids, dtype='float32'):
  """config.json of a text-only Gemma 3 (Gemma3ForCausalLM).

  Args:
    cfg: the tunix Gemma 3 ModelConfig.
    context: max_position_embeddings.
    token_ids: {'bos_token_id', 'eos_token_id', 'pad_token_id'}.
    dtype: the stored dtype's name.
  """
  check_exportable(cfg)
  rope_scaling = None
  if cfg.global_scale_factor != 1.0:
    rope_scaling = {'rope_type': 'linear',
                    'factor': float(cfg.global_scale_factor)}
  return {
      'architectures': ['Gemma3ForCausalLM'],
      'model_type': 'gemma3_text',
      'vocab_size': cfg.num_embed,
      'hidden_size': cfg.embed_dim,
      'intermediate_size': cfg.hidden_dim,
      'num_hidden_layers': cfg.num_layers,
      'num_attention_heads': cfg.num_heads,
      'num_key_value_heads': cfg.num_kv_heads,
      'head_dim': cfg.head_dim,
      'hidden_activation': 'gelu_pytorch_tanh',
      'max_position_embeddings': context,
      'rms_norm_eps': RMS_NORM_EPS,
      'rope_theta': float(cfg.global_base_frequency),
      'rope_local_base_freq': float(cfg.local_base_frequency),
      'rope_scaling': rope_scaling,
      'sliding_window': cfg.sliding_window_size,
      'layer_types': layer_types(cfg),
      'query_pre_attn_scalar': query_pre_attn_scalar(cfg),
      'attention_bias': False,
      'attention_dropout': 0.0,
      'attn_logit_softcapping': None,
      'final_logit_softcapping': None,
      'tie_word_embeddings': True,
      'initializer_range': 0.02,
      'use_cache': True,
      **token_ids,
      'torch_dtype': dtype,
  }
