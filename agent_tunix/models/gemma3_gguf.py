"""Gemma 3 in llama.cpp's GGUF layout (architecture 'gemma3'); the writer.

`write_gguf_file` writes a GGUF file: Gemma 3's by default, Gemma 4's with
that family's architecture and hyperparameters (`gemma4_gguf`). Imports gguf,
gemma3_hf and gemma4_gguf.

Export goes through the Hugging Face layout (`gemma3_hf`): a GGUF tensor is
a Hugging Face tensor under another name, with the same numpy shape. llama.cpp
stores 1 + w for Gemma 3's RMSNorm weights (`NORM_SHIFT`; Hugging Face and
tunix store w).

  GGUF (blk.N. below a layer)        Hugging Face (model.)
  token_embd                         embed_tokens
  output_norm                        norm
  attn_q, attn_k, attn_v             layers.N.self_attn.{q,k,v}_proj
  attn_output                        layers.N.self_attn.o_proj
  attn_q_norm, attn_k_norm           layers.N.self_attn.{q,k}_norm
  attn_norm, post_attention_norm     layers.N.{input,post_attention}_layernorm
  ffn_norm, post_ffw_norm            layers.N.{pre,post}_feedforward_layernorm
  ffn_gate, ffn_up, ffn_down         layers.N.mlp.{gate,up,down}_proj

The 'gemma3.*' metadata keys are those llama.cpp reads (`add_hparams`).
`file_parts` is what an export writes of a merged model (each family's GGUF
layout has one).
"""

import re

import gguf
import numpy as np

from agent_tunix.models import gemma3_hf
from agent_tunix.models import gemma4_gguf

ARCH = 'gemma3'
# Tensor types of the files written (1-D tensors stay f32).
GGUF_DTYPES = ('f32', 'f16', 'q8_0')
# Added to RMSNorm weights: llama.cpp's Gemma 3 multiplies by the stored w.
NORM_SHIFT = 1.0
# Hugging Face module (below model.layers.N) -> llama.cpp tensor (blk.N.*).
_NAMES = {
    'self_attn.q_proj': 'attn_q',
    'self_attn.k_proj': 'attn_k',
    'self_attn.v_proj': 'attn_v',
    'self_attn.o_proj': 'attn_output',
    'mlp.gate_proj': 'ffn_gate',
    'mlp.up_proj': 'ffn_up',
    'mlp.down_proj': 'ffn_down',
    'input_layernorm': 'attn_norm',
    'post_attention_layernorm': 'post_attention_norm',
    'pre_feedforward_layernorm': 'ffn_norm',
    'post_feedforward_layernorm': 'post_ffw_norm',
    'self_attn.q_norm': 'attn_q_norm',
    'self_attn.k_norm': 'attn_k_norm',
}
_HF_LAYER_RE = re.compile(r'model\.layers\.(\d+)\.(.+)\.weight')


def gguf_name(hf_name):
  """llama.cpp's name of a Hugging Face Gemma 3 tensor."""
  if hf_name == 'model.embed_tokens.weight':
    return 'token_embd.weight'
  if hf_name == 'model.norm.weight':
    return 'output_norm.weight'
  m = _HF_LAYER_RE.fullmatch(hf_name)
  if not m or m.group(2) not in _NAMES:
    raise gemma3_hf.LayoutError(f'No GGUF name for {hf_name!r}.')
  return f'blk.{m.group(1)}.{_NAMES[m.group(2)]}.weight'


def file_parts(hf_pairs, cfg, model, context):
  """(GGUF tensors, `write_gguf_file`'s architecture arguments) of a merged
  Gemma 3: its Hugging Face tensors renamed; the defaults are Gemma 3's."""
  del cfg, model, context
  return ((gguf_name(name), w) for name, w in hf_pairs), {}


def add_hparams(writer, cfg, context):
  """The 'gemma3.*' hyperparameters llama.cpp reads."""
  writer.add_context_length(context)
  writer.add_embedding_length(cfg.embed_dim)
  writer.add_block_count(cfg.num_layers)
  writer.add_feed_forward_length(cfg.hidden_dim)
  writer.add_head_count(cfg.num_heads)
  writer.add_head_count_kv(cfg.num_kv_heads)
  writer.add_key_length(cfg.head_dim)
  writer.add_value_length(cfg.head_dim)
  writer.add_layer_norm_rms_eps(gemma3_hf.RMS_NORM_EPS)
  writer.add_rope_freq_base(float(cfg.global_base_frequency))
  writer.add_rope_freq_base_swa(float(cfg.local_base_frequency))
  writer.add_sliding_window(cfg.sliding_window_size)
  if cfg.global_scale_factor != 1.0:
    writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    writer.add_rope_scaling_factor(float(cfg.global_scale_factor))


def _tensor_data(name, w, gguf_dtype, norm_shift=1.0):
  """(data, raw type or None) of one tensor as llama.cpp stores it.

  1-D tensors (norms, Gemma 4's scales and rope_freqs) and Gemma 4's router
  stay float32; Gemma 3's RMSNorm weights get llama.cpp's +1 (`norm_shift`;
  0 for Gemma 4, which stores them as they are).
  """
  if w.ndim == 1:
    if norm_shift and not name.endswith('norm.weight'):
      raise gemma3_hf.LayoutError(f'Unexpected 1-D tensor {name!r}.')
    shift = norm_shift if name.endswith('norm.weight') else 0.0
    return (w + np.float32(shift)).astype(np.float32), None
  if gguf_dtype == 'f32' or gemma4_gguf.stored_f32(name):
    return w.astype(np.float32), None
  if gguf_dtype == 'q8_0' and w.shape[-1] % gguf.GGML_QUANT_SIZES[
      gguf.GGMLQuantizationType.Q8_0][0] == 0:
    q8 = gguf.GGMLQuantizationType.Q8_0
    return gguf.quants.quantize(w, q8), q8
  return w.astype(np.float16), None


def _add_vocab(writer, vocab):
  """tokenizer.ggml.*: SentencePiece ('llama') or BPE ('gemma4', merges)."""
  writer.add_tokenizer_model(vocab.model)
  if vocab.model == 'llama':
    writer.add_tokenizer_pre('default')
  # The 262k-entry arrays, with their item type given: gguf-py would
  # otherwise check the type of every item, which takes seconds.
  arrays = [
      (gguf.Keys.Tokenizer.LIST, list(vocab.tokens), gguf.GGUFValueType.STRING),
      (gguf.Keys.Tokenizer.SCORES,
       np.asarray(vocab.scores, np.float32).tolist(),
       gguf.GGUFValueType.FLOAT32),
      (gguf.Keys.Tokenizer.TOKEN_TYPE,
       np.asarray(vocab.token_types, np.int32).tolist(),
       gguf.GGUFValueType.INT32),
  ]
  if vocab.merges:
    arrays.append((gguf.Keys.Tokenizer.MERGES, list(vocab.merges),
                   gguf.GGUFValueType.STRING))
  for key, values, item_type in arrays:
    writer.add_key_value(key, values, gguf.GGUFValueType.ARRAY,
                         sub_type=item_type)
  special = vocab.special_ids
  for key, add in (('bos', writer.add_bos_token_id),
                   ('eos', writer.add_eos_token_id),
                   ('unk', writer.add_unk_token_id),
                   ('pad', writer.add_pad_token_id)):
    if key in special:
      add(int(special[key]))
  writer.add_add_bos_token(True)
  writer.add_add_eos_token(False)
  writer.add_add_space_prefix(False)


def write_gguf_file(path, cfg, tensors, vocab, gguf_dtype='f32', name='',
                    description='', context=32768, chat_template=None,
                    arch=ARCH, hparams=None):
  """Writes a 'gemma3' (or, with `arch` and `hparams`, 'gemma4') GGUF file.

  Args:
    path: the file to write.
    cfg: the tunix ModelConfig (hyperparameter metadata).
    tensors: iterable of (llama.cpp name, float32 array in the Hugging Face
      layout; RMSNorm weights as tunix stores them, without Gemma 3's +1).
    vocab: a tokenizer.GGUFVocab with one piece per embedding row.
    gguf_dtype: one of GGUF_DTYPES.
    name: general.name.
    description: general.description.
    context: gemma3.context_length.
    chat_template: tokenizer.chat_template, or None.
    arch: general.architecture.
    hparams: writes the architecture's hyperparameters (default Gemma 3's).
  """
  if gguf_dtype not in GGUF_DTYPES:
    raise gemma3_hf.LayoutError(
        f'--gguf_dtype={gguf_dtype!r} is not one of {list(GGUF_DTYPES)}.'
    )
  if hparams is None:
    gemma3_hf.check_exportable(cfg)
  if len(vocab.tokens) != cfg.num_embed:
    raise gemma3_hf.LayoutError(
        f'The tokenizer has {len(vocab.tokens)} pieces, the model '
        f'{cfg.num_embed} embeddings; set config.model.tokenizer_path to '
        'the matching tokenizer.'
    )
  writer = gguf.GGUFWriter(path, arch)
  writer.add_type('model')
  writer.add_name(name)
  writer.add_description(description)
  if hparams is None:
    add_hparams(writer, cfg, context)
  else:
    hparams(writer)
  writer.add_file_type({
      'f32': gguf.LlamaFileType.ALL_F32,
      'f16': gguf.LlamaFileType.MOSTLY_F16,
      'q8_0': gguf.LlamaFileType.MOSTLY_Q8_0,
  }[gguf_dtype])
  if gguf_dtype == 'q8_0':
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
  _add_vocab(writer, vocab)
  if chat_template:
    writer.add_chat_template(chat_template)
  norm_shift = NORM_SHIFT if arch == ARCH else 0.0
  for tensor_name, w in tensors:
    data, raw_dtype = _tensor_data(tensor_name, w, gguf_dtype, norm_shift)
    writer.add_tensor(tensor_name, data, raw_dtype=raw_dtype)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
