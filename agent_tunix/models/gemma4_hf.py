"""Gemma 4 in Hugging Face's layout: tensor names, shapes and config.json.

The inverse of the safetensors mapping tunix's Gemma 4 loader reads
(`tunix.models.gemma4.params_safetensors`), so an exported directory loads
back with `config.model.source='hf'`. Names carry the
`model.language_model.` prefix of Hugging Face's Gemma 4 checkpoints (the
loader accepts it; it does not accept a bare `model.` prefix).

  tunix parameter (below layers.N)        Hugging Face tensor
  attn.q_einsum.w [N, D, H]                self_attn.q_proj [N*H, D]
  attn.kv_einsum.w [2, K, D, H]            self_attn.k_proj, v_proj [K*H, D]
  attn.k_einsum.w [K, D, H] (K = V)        self_attn.k_proj [K*H, D]
  attn.attn_vec_einsum.w [N, H, D]         self_attn.o_proj [D, N*H]
  mlp.{gate,up,down}_proj.kernel           mlp.{gate,up,down}_proj (transposed)
  per_layer_input_gate.w [D, P]            per_layer_input_gate [P, D]
  per_layer_projection.w [P, D]            per_layer_projection [D, P]
  skip_scale [1]                           layer_scalar [1]
  moe.router_logits [D, E]                 router.proj [E, D]
  moe.router_scale [D]                     router.scale
  moe.per_expert_scale [E]                 router.per_expert_scale
  moe.gating_einsum [E, 2, F, D]           experts.gate_up_proj [E, 2F, D]
  moe.linear [E, F, D]                     experts.down_proj [E, D, F]

and the embedder: input_embedding [V, D] -> embed_tokens, the per-layer
table [V, L, P] -> embed_tokens_per_layer [V, L*P], its projection
[D, L, P] -> per_layer_model_projection [L*P, D]. RMSNorm weights are stored
as they are (Gemma 4 multiplies by w, not 1 + w).

The chat template is Gemma 4's turns (`CHAT_TEMPLATE`). The config.json is
written from the field names in Hugging Face's Gemma 4 configuration
(transformers >= 5.5); no transformers install here checks it.
"""

import itertools
import re

PREFIX = 'model.language_model.'
# Gemma 4's turns (data/prompts.chat_prompt with a Gemma 4 preset): the
# system message has its own turn, `enable_thinking` opens it with
# <|think|> and a newline, texts are stripped, and with thinking off the
# model turn opens with an empty thought block.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set think = enable_thinking is defined and enable_thinking -%}"
    "{%- set system = messages and messages[0]['role'] == 'system' -%}"
    "{%- if think or system -%}"
    "{{ '<|turn>system\n' + ('<|think|>\n' if think else '')"
    " + (messages[0]['content'] | trim if system else '') + '<turn|>\n' }}"
    "{%- endif -%}"
    "{%- for message in (messages[1:] if system else messages) -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' "
    "else message['role'] -%}"
    "{{ '<|turn>' + role + '\n' + message['content'] | trim + '<turn|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|turn>model\n' }}"
    "{%- if not think -%}{{ '<|channel>thought\n<channel|>' }}{%- endif -%}"
    "{%- endif -%}"
)
_NORMS = {
    'pre_attention_norm.scale': 'input_layernorm',
    'post_attention_norm.scale': 'post_attention_layernorm',
    'pre_ffw_norm.scale': 'pre_feedforward_layernorm',
    'post_ffw_norm.scale': 'post_feedforward_layernorm',
    'moe_pre_ffw_norm.scale': 'pre_feedforward_layernorm_2',
    'dense_post_ffw_norm.scale': 'post_feedforward_layernorm_1',
    'moe_post_ffw_norm.scale': 'post_feedforward_layernorm_2',
    'attn._query_norm.scale': 'self_attn.q_norm',
    'attn._key_norm.scale': 'self_attn.k_norm',
    'post_per_layer_input_norm.scale': 'post_per_layer_input_norm',
}
_LAYER = re.compile(r'layers\.(\d+)\.(.+)')
# LoRA delta 'A,B->W' of the Gemma 4 weights Gemma 3 lacks (the others are
# shared with Gemma 3's table in export.py).
# Per-expert adapters (model.lora_experts): gating_einsum [E, 2, H, D] from
# A [E, D, r] and B [E, r, 2, H]; linear [E, H, D] from A [E, H, r], B [E, r, D].
LORA_DELTA_EINSUM = {
    'attn.k_einsum.w': 'dr,rkh->kdh',
    'moe.gating_einsum': 'edr,erch->echd',
    'moe.linear': 'ehr,erd->ehd',
}


def _heads_to_rows(w):
  """[X, D, H] -> [X*H, D]."""
  x, d, h = w.shape
  return w.transpose(0, 2, 1).reshape(x * h, d)


def hf_tensors(name, w):
  """[(Hugging Face name, array)] of one tunix Gemma 4 parameter."""
  if name == 'embedder.input_embedding':
    return [(PREFIX + 'embed_tokens.weight', w)]
  if name == 'embedder.per_layer_input_embedding':
    return [(PREFIX + 'embed_tokens_per_layer.weight',
             w.reshape(w.shape[0], -1))]
  if name == 'embedder.per_layer_model_projection.w':
    return [(PREFIX + 'per_layer_model_projection.weight',
             w.reshape(w.shape[0], -1).T)]
  if name == 'embedder.per_layer_projection_norm.scale':
    return [(PREFIX + 'per_layer_projection_norm.weight', w)]
  if name == 'final_norm.scale':
    return [(PREFIX + 'norm.weight', w)]
  m = _LAYER.fullmatch(name)
  if not m:
    raise ValueError(f'No Hugging Face Gemma 4 name for {name!r}.')
  pre, sub = f'{PREFIX}layers.{m.group(1)}.', m.group(2)
  if sub == 'attn.q_einsum.w':
    return [(pre + 'self_attn.q_proj.weight', _heads_to_rows(w))]
  if sub == 'attn.kv_einsum.w':
    return [(pre + f'self_attn.{p}_proj.weight', _heads_to_rows(x))
            for p, x in zip('kv', w)]
  if sub == 'attn.k_einsum.w':
    return [(pre + 'self_attn.k_proj.weight', _heads_to_rows(w))]
  if sub == 'attn.attn_vec_einsum.w':
    n, h, d = w.shape
    return [(pre + 'self_attn.o_proj.weight', w.reshape(n * h, d).T)]
  proj = re.fullmatch(r'mlp\.(gate|up|down)_proj\.kernel', sub)
  if proj:
    return [(pre + f'mlp.{proj.group(1)}_proj.weight', w.T)]
  if sub in ('per_layer_input_gate.w', 'per_layer_projection.w'):
    return [(pre + sub[:-2] + '.weight', w.T)]
  if sub == 'skip_scale':
    return [(pre + 'layer_scalar', w)]
  if sub == 'moe.router_logits':
    return [(pre + 'router.proj.weight', w.T)]
  if sub == 'moe.router_scale':
    return [(pre + 'router.scale', w)]
  if sub == 'moe.per_expert_scale':
    return [(pre + 'router.per_expert_scale', w)]
  if sub == 'moe.gating_einsum':
    e, _, f, d = w.shape
    return [(pre + 'experts.gate_up_proj', w.reshape(e, 2 * f, d))]
  if sub == 'moe.linear':
    return [(pre + 'experts.down_proj', w.transpose(0, 2, 1))]
  if sub in _NORMS:
    return [(pre + _NORMS[sub] + '.weight', w)]
  raise ValueError(f'No Hugging Face Gemma 4 name for {name!r}.')


def is_multimodal(preset):
  """Whether the preset's checkpoint nests its text layers in
  model.language_model: every Gemma 4's does."""
  del preset
  return True


def context_length(preset):
  """max_position_embeddings of a Gemma 4 preset: 128k for E2B / E4B (and
  the tiny ones), 256k for the others."""
  small = preset.startswith(('gemma4_e2b', 'gemma4_e4b', 'tiny_gemma4'))
  return 131072 if small else 262144


def layer_types(cfg):
  """'sliding_attention' / 'full_attention' per layer, as tunix builds them."""
  from tunix.models.gemma4 import model as model_lib  # pylint: disable=g-import-not-at-top
  pattern = cfg.attention_pattern or model_lib.GEMMA4_ATTENTION_PATTERN
  return [
      'sliding_attention' if kind == model_lib.AttentionType.LOCAL_SLIDING
      else 'full_attention'
      for _, kind in zip(range(cfg.num_layers), itertools.cycle(pattern))
  ]


def num_kv_shared_layers(cfg):
  return cfg.num_layers - int(cfg.num_layers - cfg.frac_shared_layers
                              * cfg.num_layers)


def hf_config(cfg, context_length, token_ids, dtype='float32'):
  """config.json of a text-only Gemma 4 (Gemma4ForConditionalGeneration).

  Args:
    cfg: the tunix Gemma 4 ModelConfig.
    context_length: max_position_embeddings.
    token_ids: {'bos_token_id', 'eos_token_id', 'pad_token_id'}.
    dtype: the stored dtype's name.
  """
  text = {
      'model_type': 'gemma4_text',
      'vocab_size': cfg.num_embed,
      'hidden_size': cfg.embed_dim,
      'intermediate_size': cfg.hidden_dim,
      'num_hidden_layers': cfg.num_layers,
      'num_attention_heads': cfg.num_heads,
      'num_key_value_heads': cfg.num_kv_heads,
      'num_global_key_value_heads': (cfg.num_global_kv_heads
                                     or cfg.num_kv_heads),
      'head_dim': cfg.head_dim,
      'global_head_dim': cfg.global_key_size or cfg.head_dim,
      'attention_k_eq_v': bool(cfg.k_eq_v_global),
      'hidden_activation': 'gelu_pytorch_tanh',
      'max_position_embeddings': context_length,
      'rms_norm_eps': 1e-6,
      'sliding_window': cfg.sliding_window_size,
      'layer_types': layer_types(cfg),
      'rope_parameters': {
          'sliding_attention': {
              'rope_type': 'default',
              'rope_theta': float(cfg.local_base_frequency),
          },
          'full_attention': {
              'rope_type': 'proportional',
              'rope_theta': float(cfg.global_base_frequency),
              'partial_rotary_factor': float(cfg.global_rope_proportion),
          },
      },
      'final_logit_softcapping': cfg.final_logit_softcap,
      'hidden_size_per_layer_input': cfg.per_layer_input_dim,
      'vocab_size_per_layer_input': cfg.num_embed,
      'num_kv_shared_layers': num_kv_shared_layers(cfg),
      'use_double_wide_mlp': cfg.override_kv_shared_ffw_hidden is not None,
      'enable_moe_block': bool(cfg.enable_moe),
      'num_experts': cfg.num_experts,
      'top_k_experts': cfg.num_experts_per_tok,
      'moe_intermediate_size': cfg.expert_dim,
      'tie_word_embeddings': True,
      'attention_bias': False,
      'attention_dropout': 0.0,
      'use_cache': True,
      **token_ids,
      'torch_dtype': dtype,
  }
  return {
      'architectures': ['Gemma4ForConditionalGeneration'],
      'model_type': 'gemma4',
      'text_config': text,
      'vision_config': None,
      'audio_config': None,
      'tie_word_embeddings': True,
      **token_ids,
      'torch_dtype': dtype,
  }
