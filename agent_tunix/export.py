r"""Exports a policy for other tools: PEFT adapter, merged HF model, or GGUF.

  python -m agent_tunix.export --config=configs/gemma3_270m.py \
      --workdir=/tmp/run --format=merged --output=/tmp/run/hf

--format:
  peft    A PEFT LoRA adapter directory (adapter_model.safetensors,
          adapter_config.json) for the preset's Hugging Face checkpoint:
          Gemma3ForCausalLM names for 270m and 1b, the language model of
          Gemma3ForConditionalGeneration for 4b, 12b and 27b.
  merged  A Hugging Face Gemma 3 text model directory (config.json,
          model.safetensors, tokenizer.model, tokenizer_config.json,
          special_tokens_map.json, generation_config.json) with the LoRA
          merged into the weights, for transformers.AutoModelForCausalLM.
  gguf    One GGUF file of the merged model for llama.cpp ('gemma3' or
          'gemma4' architecture, tokenizer vocabulary included); --gguf_dtype
          f32, f16 or q8_0 (RMSNorm weights and other 1-D tensors stay f32).

Both 'merged' (tokenizer_config.json) and 'gguf' (tokenizer.chat_template)
carry the run's training prompt as their chat template
(export_template.py): a user message, the question, gets exactly the
prompt the policy was trained on.

The LoRA comes from the latest checkpoint in --workdir (or --step). A workdir
without any checkpoint is an error, because exporting the untrained base model
by mistake is easy to miss; --allow_base exports the base model on purpose
(with or without --workdir), e.g. to turn the packaged GGUF into a Hugging
Face directory. An existing --output is replaced only with --overwrite. The
result is written next to --output under a temporary name and renamed into
place when complete, so an interrupted export leaves no partial output.
Export runs in one process and writes local paths only.

Layouts. models/gemma3_hf.py holds Gemma 3's Hugging Face layout (and how
qwix's LoRA factors map to it and to PEFT's),
models/gemma3_gguf.py its GGUF layout and the GGUF file writer;
models/gemma4_hf.py and models/gemma4_gguf.py hold Gemma 4's. The preset's
family (models/families.py) names its two layouts. This module merges the
LoRA into the weights (W + (alpha / r) * A B in the tunix layout), maps
every weight through the family's layout and writes the files. A model or weight the
layouts cannot hold raises their `gemma3_hf.LayoutError`, which the command
reports as it does an ExportError.

Caveat for 'peft': the adapter was trained on the base weights this project
loaded. With the default GGUF source those are Q4_K_M-quantized, so applying
the adapter to the bf16 Hugging Face checkpoint is close to, not exactly, the
trained policy; 'merged' and 'gguf' contain exactly the weights trained on.
"""

import contextlib
import json
import os
import re
import shutil
import tempfile

from absl import logging
from flax import nnx
import jax
import ml_dtypes
import numpy as np
import safetensors.numpy
from sentencepiece import sentencepiece_model_pb2

from agent_tunix import cli
from agent_tunix import export_template
from agent_tunix import models
from agent_tunix import storage
from agent_tunix.config import validation
from agent_tunix.models import families
from agent_tunix.models import gemma
from agent_tunix.models import gemma3_gguf
from agent_tunix.models import gemma3_hf
from agent_tunix.models import gguf as gguf_lib
from agent_tunix.models import lora
from agent_tunix.models import tokenizer as tokenizer_lib
from agent_tunix.rl import rollout
from agent_tunix.run import checkpoint
from agent_tunix.tpu import sharding

FORMATS = ('peft', 'merged', 'gguf')
HF_DTYPES = {
    'float32': np.float32,
    'float16': np.float16,
    'bfloat16': ml_dtypes.bfloat16,
}
# Safetensors files are split into shards of at most this many bytes.
MAX_SHARD_BYTES = 4 << 30

# Adapted tunix weight (path below layers.N) -> einsum of its LoRA delta
# 'A,B->W' (models/gemma3_hf.py).
_DELTA_EINSUM = {
    name: einsum for family in families.FAMILIES
    for name, einsum in family.hf_layout.LORA_DELTA_EINSUM.items()
}


class ExportError(ValueError):
  """An export that cannot be done as asked; the message says how to fix it."""


# ------------------------------------------------------------ the policy


def checkpoint_steps(config, workdir):
  """The checkpoint steps of a run ([] if none), creating nothing.

  Raises:
    ExportError: `workdir` does not exist.
  """
  if not storage.path(workdir).exists():
    raise ExportError(
        f'workdir {workdir!r} does not exist; pass the --workdir of a '
        'training run.'
    )
  if not (storage.path(workdir) / checkpoint.CHECKPOINT_SUBDIR).exists():
    return []
  ckpt = checkpoint.Checkpointer(workdir, config.checkpoint, read_only=True)
  try:
    return ckpt.all_steps()
  finally:
    ckpt.close()


def restore_lora(model, config, workdir, step=None):
  """Loads a run's LoRA params into `model`.

  Args:
    model: the policy built from `config` (models.build).
    config: the run's config (model and checkpoint sections).
    workdir: the run directory.
    step: the checkpoint step; None means the latest good one.

  Returns:
    The restored step, or None if the workdir has no checkpoint.

  Raises:
    ExportError: `workdir` does not exist, or no (or not that) step could
      be restored.
  """
  if not checkpoint_steps(config, workdir):
    return None
  try:
    return checkpoint.restore_lora(model, workdir, config.checkpoint, step)
  except checkpoint.RestoreError as e:
    raise ExportError(
        f'{e}\nIf the run was trained with other config overrides (e.g. '
        'model.lora_rank, model.lora_module_path, model.lora_experts, '
        'model.preset), pass the '
        'same ones here: the LoRA shapes must match.'
    ) from e


def load_policy(config, workdir=None, step=None, allow_base=False):
  """Builds the policy of `config` with a run's trained LoRA.

  The workdir is checked before any weight is loaded.

  Args:
    config: the run's config.
    workdir: the training run; None means the base model.
    step: checkpoint step (default: the latest).
    allow_base: if True, a missing workdir or checkpoint gives the base model
      (fresh LoRA, which leaves it unchanged) instead of an error.

  Returns:
    (model, tokenizer, step): step is None for the base model.

  Raises:
    ExportError: no workdir or no checkpoint (and not allow_base), or the
      checkpoint (or `step`) cannot be restored into this config's model.
  """
  if step is not None and not workdir:
    raise ExportError('--step needs --workdir (the run to take it from).')
  if not workdir and not allow_base:
    raise ExportError(
        'No --workdir given: pass the training run to export its LoRA, or '
        '--allow_base to export the base model.'
    )
  steps = checkpoint_steps(config, workdir) if workdir else []
  if workdir and not steps:
    if not allow_base:
      raise ExportError(
          f'{workdir!r} has no checkpoint (nothing in '
          f'{os.path.join(workdir, checkpoint.CHECKPOINT_SUBDIR)}). Train '
          'first, or pass --allow_base to use the base model.'
      )
    logging.warning('No checkpoint in %s: using the base model.', workdir)
  if step is not None and step not in steps:
    raise ExportError(
        f'--step={step}: {workdir!r} has checkpoints for steps {steps}.'
    )
  validation.validate(config)
  mesh = sharding.make_mesh(config.mesh)
  model, tokenizer = models.build(config, mesh)
  restored = restore_lora(model, config, workdir, step) if steps else None
  if restored is not None:
    logging.info('Loaded the LoRA of step %d from %s', restored, workdir)
  return model, tokenizer, restored


# ------------------------------------------------------------ LoRA math


def lora_scale(model_cfg):
  """qwix's (and PEFT's) scale of the LoRA product: alpha / rank."""
  return model_cfg.lora_alpha / model_cfg.lora_rank


def _host(x):
  return np.asarray(jax.device_get(x), dtype=np.float32)


def lora_pairs(model):
  """{adapted weight path: (A, B)} of a model's LoRA, float32 on the host."""
  flat = {
      '.'.join(map(str, path)): var
      for path, var in nnx.to_flat_state(lora.lora_state(model))
  }
  pairs = {}
  for name in sorted(flat):
    if not name.endswith('_lora_a'):
      continue
    weight = name[:-len('_lora_a')]
    _, sub = gemma3_hf.split_layer(weight)
    if sub not in _DELTA_EINSUM:
      raise ExportError(
          f'LoRA on {weight!r} cannot be exported: only '
          f'{sorted(_DELTA_EINSUM)} have a known layout. Narrow '
          'config.model.lora_module_path.'
      )
    pairs[weight] = (_host(flat[name][...]),
                     _host(flat[weight + '_lora_b'][...]))
  return pairs


def lora_delta(weight, a, b):
  """The unscaled LoRA product A B of `weight`, in the weight's layout."""
  _, sub = gemma3_hf.split_layer(weight)
  return np.einsum(_DELTA_EINSUM[sub], a, b)


def merged_params(model, model_cfg):
  """Yields (tunix path, float32 array): base weights plus scaled LoRA."""
  pairs = lora_pairs(model) if model_cfg.lora_rank > 0 else {}
  scale = lora_scale(model_cfg) if pairs else 0.0
  base = nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))
  for path, var in nnx.to_flat_state(base):
    name = '.'.join(map(str, path))
    w = _host(var[...])
    if name in pairs:
      delta = lora_delta(name, *pairs[name])
      if delta.shape != w.shape:
        raise ExportError(
            f'LoRA of {name!r} gives shape {delta.shape}, the weight has '
            f'{w.shape}: an unknown qwix layout.'
        )
      w = w + np.float32(scale) * delta
    yield name, w


# ------------------------------------------------------ Hugging Face names


def hf_state(model, model_cfg):
  """Yields the merged model as Hugging Face (name, float32 array) pairs."""
  to_hf = families.of_preset(model_cfg.preset).hf_layout.hf_tensors
  for name, w in merged_params(model, model_cfg):
    for hf_name, x in to_hf(name, w):
      yield hf_name, np.ascontiguousarray(x)


def peft_factors(weight, a, b):
  """[(HF module, lora_A [r, in], lora_B [out, r])] of one tunix LoRA."""
  _, sub = gemma3_hf.split_layer(weight)
  rank = a.shape[-1]
  if sub in ('attn.q_einsum.w', 'attn.kv_einsum.w', 'attn.qkv_einsum.w'):
    # A [D, r]; B [r, N, H], or [r, 2|3, X, H] for the stacked ones.
    parts = {'attn.q_einsum.w': ('q',), 'attn.kv_einsum.w': ('k', 'v'),
             'attn.qkv_einsum.w': ('q', 'k', 'v')}[sub]
    bs = [b] if len(parts) == 1 else [b[:, i] for i in range(len(parts))]
    return [(f'self_attn.{p}_proj', a.T, x.reshape(rank, -1).T)
            for p, x in zip(parts, bs)]
  if sub == 'attn.k_einsum.w':  # Gemma 4 K = V: A [D, r], B [r, K, H].
    return [('self_attn.k_proj', a.T, b.reshape(rank, -1).T)]
  if sub == 'attn.attn_vec_einsum.w':  # A [N, H, r], B [r, D]
    return [('self_attn.o_proj', a.reshape(-1, rank).T, b.T)]
  proj = sub.split('.')[1]  # mlp.X_proj.kernel: A [in, r], B [r, out]
  return [(f'mlp.{proj}', a.T, b.T)]


def peft_prefix(preset):
  """Where a preset's decoder layers are in PEFT's names of the HF model."""
  if families.of_preset(preset).hf_layout.is_multimodal(preset):
    return 'base_model.model.model.language_model.layers.'
  return 'base_model.model.model.layers.'


def peft_target_modules(preset, modules):
  """PEFT target_modules for adapted `modules` ('self_attn.q_proj', ...).

  Module names for the text-only checkpoints; for the multimodal ones a
  regex over the language model's layers, since the vision tower has
  q_proj etc. too.
  """
  if not families.of_preset(preset).hf_layout.is_multimodal(preset):
    return sorted({m.split('.')[-1] for m in modules})
  alternatives = '|'.join(re.escape(m) for m in sorted(modules))
  return rf'model\.language_model\.layers\.\d+\.({alternatives})'


def peft_state(model, prefix='base_model.model.model.layers.'):
  """Yields the PEFT adapter's (name, float32 array) pairs."""
  for weight, (a, b) in lora_pairs(model).items():
    layer, _ = gemma3_hf.split_layer(weight)
    for module, lora_a, lora_b in peft_factors(weight, a, b):
      base = f'{prefix}{layer}.{module}'
      yield base + '.lora_A.weight', np.ascontiguousarray(lora_a)
      yield base + '.lora_B.weight', np.ascontiguousarray(lora_b)


# -------------------------------------------------------------- configs


def context_length(preset):
  """max_position_embeddings of a preset (its family's HF layout)."""
  return families.of_preset(preset).hf_layout.context_length(preset)


def hf_config(config, tokenizer, dtype='float32'):
  """config.json (the family's: gemma3_hf.hf_config, gemma4_hf's)."""
  cfg = gemma.model_config(config.model)
  token_ids = {'bos_token_id': tokenizer.bos_id(),
               'eos_token_id': tokenizer.eos_id(),
               'pad_token_id': max(tokenizer.pad_id(), 0)}
  layout = families.of_preset(config.model.preset).hf_layout
  return layout.hf_config(
      cfg, context_length(config.model.preset), token_ids, dtype)


def peft_config(config, target_modules):
  """adapter_config.json for the LoRA of `config`."""
  m = config.model
  alpha = m.lora_alpha
  return {
      'peft_type': 'LORA',
      'task_type': 'CAUSAL_LM',
      'base_model_name_or_path': (gemma3_hf.HF_REPOS.get(m.preset) or m.path
                                  or None),
      'r': m.lora_rank,
      'lora_alpha': int(alpha) if float(alpha).is_integer() else alpha,
      'target_modules': target_modules,
      'lora_dropout': 0.0,
      'bias': 'none',
      'fan_in_fan_out': False,
      'inference_mode': True,
      'init_lora_weights': True,
      'use_rslora': False,
      'use_dora': False,
      'modules_to_save': None,
      'layers_to_transform': None,
      'layers_pattern': None,
      'rank_pattern': {},
      'alpha_pattern': {},
  }


def _piece(tokenizer, token_id):
  return tokenizer.id_to_piece(token_id) if token_id >= 0 else None


def tokenizer_files(config, tokenizer):
  """{file name: JSON-able dict} of the Hugging Face tokenizer config."""
  special = {
      'bos_token': _piece(tokenizer, tokenizer.bos_id()),
      'eos_token': _piece(tokenizer, tokenizer.eos_id()),
      'unk_token': _piece(tokenizer, tokenizer.unk_id()),
      'pad_token': _piece(tokenizer, tokenizer.pad_id()),
  }
  special = {k: v for k, v in special.items() if v is not None}
  tok_config = {
      'tokenizer_class': 'GemmaTokenizer',
      **special,
      'add_bos_token': True,
      'add_eos_token': False,
      'clean_up_tokenization_spaces': False,
      'spaces_between_special_tokens': False,
      'model_max_length': context_length(config.model.preset),
      'sp_model_kwargs': {},
  }
  tok_config['chat_template'] = export_template.chat_template(config)
  generation = {
      'bos_token_id': tokenizer.bos_id(),
      'eos_token_id': rollout.end_token_ids(tokenizer),
      'pad_token_id': max(tokenizer.pad_id(), 0),
  }
  return {
      'tokenizer_config.json': tok_config,
      'special_tokens_map.json': special,
      'generation_config.json': generation,
  }


def gguf_vocab(model_cfg, tokenizer):
  """The tokenizer.GGUFVocab to write into a GGUF.

  Copied from the source GGUF when a SentencePiece tokenizer was read from
  one (exactly llama.cpp's own conversion), otherwise taken from the
  SentencePiece model, whose piece types use the same numbers as GGUF token
  types; a Gemma 4 tokenizer (a tokenizer.json, or rebuilt from a 'gemma4'
  GGUF) gives a BPE vocabulary with its merges (for a rebuilt one: the
  file's pieces, merges and token types again).
  """
  if isinstance(tokenizer, tokenizer_lib.JsonTokenizer):
    return tokenizer.gguf_vocab()
  if not model_cfg.tokenizer_path and model_cfg.source in ('gguf', 'random'):
    path = (gemma.resolve_path(model_cfg) if model_cfg.source == 'gguf'
            else gguf_lib.default_path())
    return tokenizer_lib.read_gguf_vocab(path)
  proto = sentencepiece_model_pb2.ModelProto.FromString(
      tokenizer.serialized_model_proto()
  )
  special = {'pad': tokenizer.pad_id(), 'eos': tokenizer.eos_id(),
             'bos': tokenizer.bos_id(), 'unk': tokenizer.unk_id()}
  return tokenizer_lib.GGUFVocab(
      tokens=[p.piece for p in proto.pieces],
      scores=np.array([p.score for p in proto.pieces], np.float32),
      token_types=np.array([int(p.type) for p in proto.pieces], np.int32),
      special_ids={k: v for k, v in special.items() if v >= 0},
      digest='',
  )


def _readme(config, fmt, step, extra=''):
  m = config.model
  origin = (f'LoRA of checkpoint step {step}' if step is not None
            else 'the base model (no trained LoRA)')
  return (
      f'# {m.preset} exported by agent_tunix ({fmt})\n\n'
      f'Weights: {origin}, on the base weights of source {m.source!r}'
      f'{" (" + m.path + ")" if m.path else ""}; LoRA rank {m.lora_rank}, '
      f'alpha {m.lora_alpha}.\n{extra}'
  )


# --------------------------------------------------------------- writers


def _write_json(path, obj):
  with open(path, 'w') as f:
    json.dump(obj, f, indent=2, sort_keys=False)
    f.write('\n')


def write_safetensors(directory, tensors, dtype, basename='model',
                      max_shard_bytes=MAX_SHARD_BYTES):
  """Writes (name, array) pairs as safetensors, in shards if they are big.

  One shard is <basename>.safetensors; more are
  <basename>-0000i-of-0000n.safetensors plus the Hugging Face index
  <basename>.safetensors.index.json. Only the shard being filled is held in
  memory.

  Args:
    directory: where to write.
    tensors: iterable of (name, np.ndarray).
    dtype: the stored dtype (a numpy or ml_dtypes type).
    basename: file name stem.
    max_shard_bytes: shard size limit.

  Returns:
    The names of the safetensors files written.
  """
  parts = []  # [(temporary file name, tensor names)]
  pending = {}
  size = total = 0

  def flush():
    part = f'.{basename}.part{len(parts)}.safetensors'
    safetensors.numpy.save_file(
        pending, os.path.join(directory, part), metadata={'format': 'pt'}
    )
    parts.append((part, list(pending)))
    pending.clear()

  for name, x in tensors:
    x = np.ascontiguousarray(np.asarray(x).astype(dtype))
    if pending and size + x.nbytes > max_shard_bytes:
      flush()
      size = 0
    pending[name] = x
    size += x.nbytes
    total += x.nbytes
  if pending or not parts:
    flush()
  if len(parts) == 1:
    final = [f'{basename}.safetensors']
  else:
    final = [f'{basename}-{i + 1:05d}-of-{len(parts):05d}.safetensors'
             for i in range(len(parts))]
  for (part, _), name in zip(parts, final):
    os.rename(os.path.join(directory, part), os.path.join(directory, name))
  if len(parts) > 1:
    weight_map = {key: name for (_, keys), name in zip(parts, final)
                  for key in keys}
    _write_json(
        os.path.join(directory, f'{basename}.safetensors.index.json'),
        {'metadata': {'total_size': total}, 'weight_map': weight_map},
    )
  return final


def write_peft(directory, model, config, step=None):
  """Writes the PEFT LoRA adapter of `model` into `directory`."""
  if config.model.lora_rank <= 0:
    raise ExportError(
        'config.model.lora_rank is 0: the model has no LoRA adapter to '
        'export. Use --format=merged or --format=gguf.'
    )
  if config.model.get('lora_experts', False):
    raise ExportError(
        'config.model.lora_experts=True: the per-expert adapters have no '
        'PEFT layout here. Use --format=merged or --format=gguf (both hold '
        'the experts with their LoRA merged in).'
    )
  modules = set()

  def tensors():
    for name, x in peft_state(model, peft_prefix(config.model.preset)):
      modules.add('.'.join(name.split('.')[-4:-2]))
      yield name, x

  write_safetensors(directory, tensors(), np.float32,
                    basename='adapter_model', max_shard_bytes=float('inf'))
  _write_json(
      os.path.join(directory, 'adapter_config.json'),
      peft_config(config,
                  peft_target_modules(config.model.preset, modules)),
  )
  caveat = ''
  if config.model.source == 'gguf':
    caveat = (
        '\nThe adapter was trained on dequantized GGUF weights; on the '
        'full-precision base model it is close to, not exactly, the trained '
        'policy. The merged export holds exactly the trained weights.\n'
    )
  with open(os.path.join(directory, 'README.md'), 'w') as f:
    f.write(_readme(config, 'PEFT LoRA adapter', step, caveat))


def write_merged(directory, model, tokenizer, config, dtype='float32',
                 step=None):
  """Writes the merged Hugging Face Gemma 3 model into `directory`."""
  if dtype not in HF_DTYPES:
    raise ExportError(
        f'--dtype={dtype!r} is not one of {sorted(HF_DTYPES)}.'
    )
  write_safetensors(directory, hf_state(model, config.model),
                    HF_DTYPES[dtype])
  _write_json(os.path.join(directory, 'config.json'),
              hf_config(config, tokenizer, dtype))
  if hasattr(tokenizer, 'to_json'):  # A tokenizer.json (Gemma 4 from HF).
    with open(os.path.join(directory, 'tokenizer.json'), 'w') as f:
      f.write(tokenizer.to_json())
  else:
    with open(os.path.join(directory, 'tokenizer.model'), 'wb') as f:
      f.write(tokenizer.serialized_model_proto())
  for name, content in tokenizer_files(config, tokenizer).items():
    _write_json(os.path.join(directory, name), content)
  with open(os.path.join(directory, 'README.md'), 'w') as f:
    f.write(_readme(config, 'merged Hugging Face model', step))


def write_gguf(path, model, tokenizer, config, gguf_dtype='f32', step=None):
  """Writes the merged model as one llama.cpp GGUF file ('gemma3' or
  'gemma4')."""
  m = config.model
  cfg = gemma.model_config(m)
  context = context_length(m.preset)
  family = families.of_preset(m.preset)
  tensors, arch_args = family.gguf_layout.file_parts(
      hf_state(model, m), cfg, model, context)
  gemma3_gguf.write_gguf_file(
      path, cfg, tensors, gguf_vocab(m, tokenizer), gguf_dtype,
      name=(f'{m.preset} (agent_tunix'
            f'{"" if step is None else f", step {step}"})'),
      description=_readme(config, 'GGUF', step).strip(),
      context=context,
      chat_template=export_template.chat_template(config),
      **arch_args)


# ------------------------------------------------------------------ output


GGUF_MAGIC = b'GGUF'  # The first bytes of every GGUF file.


def check_output(output, fmt, overwrite):
  """Raises ExportError if `output` exists and may not be replaced."""
  if not output:
    raise ExportError('--output is empty; name the file or directory to '
                      'write.')
  if storage.is_remote(output):
    if storage.exists(output) and not overwrite:
      raise ExportError(
          f'{output!r} already exists; pass --overwrite to replace it.')
    return
  if not os.path.lexists(output):
    return
  if not overwrite:
    raise ExportError(
        f'{output!r} already exists; pass --overwrite to replace it.'
    )
  if fmt == 'gguf':
    if os.path.isdir(output):
      raise ExportError(
          f'--output={output!r} is a directory, but --format=gguf writes one '
          'file; name a file, e.g. --output=model.gguf.'
      )
    with open(output, 'rb') as f:
      magic = f.read(4)
    if magic != GGUF_MAGIC:
      raise ExportError(
          f'--output={output!r} is not an earlier gguf export (no GGUF '
          'header); --overwrite only replaces those. Pick another --output '
          'or move the file away.'
      )
    return
  if not os.path.isdir(output):
    raise ExportError(
        f'--output={output!r} is a file, but --format={fmt} writes a '
        'directory.'
    )
  marker = 'adapter_config.json' if fmt == 'peft' else 'config.json'
  if os.listdir(output) and not os.path.exists(os.path.join(output, marker)):
    raise ExportError(
        f'--output={output!r} is a non-empty directory without {marker}, so '
        f'not an earlier {fmt} export; --overwrite only replaces those. Pick '
        'another --output or remove it yourself.'
    )


@contextlib.contextmanager
def _staged_remote(output, fmt, overwrite):
  """Yields a local temporary path; uploads it to `output` (gs://) after."""
  check_output(output, fmt, overwrite)
  with tempfile.TemporaryDirectory(prefix='agent_tunix_export_') as staging:
    target = os.path.join(staging, os.path.basename(output.rstrip('/')))
    if fmt != 'gguf':
      os.mkdir(target)
    yield target
    check_output(output, fmt, overwrite)
    old = storage.path(output)
    if old.exists():
      if old.is_dir():
        old.rmtree()
      else:
        old.unlink()
    storage.upload(target, output)


@contextlib.contextmanager
def _staged(output, fmt, overwrite):
  """Yields a temporary path next to `output`; renames it into place."""
  if storage.is_remote(output):
    with _staged_remote(output, fmt, overwrite) as target:
      yield target
    return
  check_output(output, fmt, overwrite)
  output = os.path.abspath(output)
  parent = os.path.dirname(output)
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(
      dir=parent, prefix=f'.{os.path.basename(output)}.partial-'
  )
  try:
    target = os.path.join(staging, os.path.basename(output))
    if fmt != 'gguf':
      os.mkdir(target)
    yield target
    check_output(output, fmt, overwrite)
    if os.path.isdir(output) and not os.path.islink(output):
      shutil.rmtree(output)
    elif os.path.lexists(output):
      os.remove(output)
    os.rename(target, output)
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def export(model, tokenizer, config, fmt, output, overwrite=False, step=None,
           dtype='float32', gguf_dtype='f32'):
  """Writes a policy in one of FORMATS.

  Args:
    model: the policy (tunix Gemma 3 with qwix LoRA, as models.build makes).
    tokenizer: its SentencePiece tokenizer.
    config: the config it was built from.
    fmt: 'peft', 'merged' or 'gguf'.
    output: the directory (peft, merged) or file (gguf) to write.
    overwrite: replace an existing output (an earlier export).
    step: the checkpoint step, for the README / GGUF description.
    dtype: 'merged' safetensors dtype: 'float32', 'bfloat16' or 'float16'.
    gguf_dtype: 'gguf' tensor type: 'f32', 'f16' or 'q8_0'.

  Returns:
    The absolute output path.

  Raises:
    ExportError: bad arguments or an existing output (nothing is written).
    gemma3_hf.LayoutError: a model the layout of `fmt` cannot hold.
  """
  if fmt not in FORMATS:
    raise ExportError(f'--format={fmt!r} is not one of {list(FORMATS)}.')
  if dtype not in HF_DTYPES:
    raise ExportError(f'--dtype={dtype!r} is not one of {sorted(HF_DTYPES)}.')
  if gguf_dtype not in gemma3_gguf.GGUF_DTYPES:
    raise ExportError(f'--gguf_dtype={gguf_dtype!r} is not one of '
                      f'{list(gemma3_gguf.GGUF_DTYPES)}.')
  if jax.process_count() > 1:
    raise ExportError('Export runs in a single process; start it without '
                      'jax.distributed (one host).')
  with _staged(output, fmt, overwrite) as target:
    if fmt == 'peft':
      write_peft(target, model, config, step)
    elif fmt == 'merged':
      write_merged(target, model, tokenizer, config, dtype, step)
    else:
      write_gguf(target, model, tokenizer, config, gguf_dtype, step)
  if not storage.is_remote(output):
    output = os.path.abspath(output)
  logging.info('Exported %s to %s', fmt, output)
  return output


# --------------------------------------------------------------------- CLI


def _define_flags():
  """Defines the CLI's flags.

  Called only when this module runs as a program, so that importing it (as
  api.py and generate.py do) defines no flags that would clash with another
  CLI's --config in the same process.

  Returns:
    {name: FlagHolder}.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  return {
      'config': config_flags.DEFINE_config_file(
          'config', None, 'Config file of the run (a get_config() module).',
          lock_config=True),
      'workdir': flags.DEFINE_string(
          'workdir', None, 'Training run whose LoRA is exported.'),
      'format': flags.DEFINE_enum(
          'format', None, FORMATS, 'What to write (see the module doc).'),
      'output': flags.DEFINE_string(
          'output', None, 'Directory (peft, merged) or file (gguf) to write.'),
      'step': flags.DEFINE_integer(
          'step', None, 'Checkpoint step (default: the latest).'),
      'overwrite': flags.DEFINE_bool(
          'overwrite', False, 'Replace an existing --output.'),
      'allow_base': flags.DEFINE_bool(
          'allow_base', False,
          'Export the base model when there is no --workdir or checkpoint.'),
      'dtype': flags.DEFINE_enum(
          'dtype', 'float32', sorted(HF_DTYPES),
          'Weight dtype of --format=merged.'),
      'gguf_dtype': flags.DEFINE_enum(
          'gguf_dtype', 'f32', gemma3_gguf.GGUF_DTYPES,
          'Tensor type of --format=gguf (1-D tensors stay f32).'),
  }


def main(argv, flag_values):
  """Runs the export; user errors exit with their message."""
  from absl import app  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  f = {name: holder.value for name, holder in flag_values.items()}
  try:
    check_output(f['output'], f['format'], f['overwrite'])
    model, tokenizer, step = load_policy(
        f['config'], f['workdir'], f['step'], f['allow_base']
    )
    path = export(model, tokenizer, f['config'], f['format'], f['output'],
                  overwrite=f['overwrite'], step=step, dtype=f['dtype'],
                  gguf_dtype=f['gguf_dtype'])
  except (ExportError, gemma3_hf.LayoutError, export_template.TemplateError,
          validation.ConfigError) as e:
    raise SystemExit(f'export: {e}') from e
  print(path, flush=True)


if __name__ == '__main__':
  import functools  # pylint: disable=g-import-not-at-top
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  _FLAG_VALUES = _define_flags()
  flags.mark_flags_as_required(['config', 'format', 'output'])
  cli.run(functools.partial(main, flag_values=_FLAG_VALUES))
