"""Gemma 3 and 4 policies: weights by source, tokenizer, LoRA, CPU decode graph.

  families     one record per model family (Gemma 3, Gemma 4): its presets,
               model class, loaders, layouts, tool format, turn markers,
               softcap and remat unit; the one place that decides the family
  gemma        builds and loads the policy by family and source (gguf, hf,
               kaggle, orbax, random)
  weights      the abstract model, weights placed shard by shard, shape checks
  gguf         Gemma 3 weights from a GGUF file; the GGUF reader
  gemma3       Gemma 3's presets, block remat and weight loaders
  gemma3_hf    Gemma 3 in Hugging Face's layout: tensor names, config.json,
               chat template
  gemma3_gguf  Gemma 3 in llama.cpp's GGUF layout, and the GGUF file writer
  gemma4       Gemma 4's presets, model class, routing, block remat and
               weight loaders
  gemma4_hf    Gemma 4 in Hugging Face's layout
  gemma4_gguf  Gemma 4 in llama.cpp's GGUF layout
  tokenizer    SentencePiece (Gemma 3) and BPE (Gemma 4) tokenizers, also
               from GGUF
  lora         qwix LoRA on the policy
  decode       the sampler's graph on CPU
  packed_attention  Gemma 3 attention for packed rows (the window in
               positions)
  tunix_adapter  every use of tunix's private names, and the check that
               the installed tunix is the tested version

A bottom layer: modules here import only each other, never another part of
agent_tunix.
"""

from absl import logging

from agent_tunix.models import gemma
from agent_tunix.models import lora


def build(config, mesh):
  """Loads base weights on `mesh`, adds LoRA and loads the tokenizer.

  Args:
    config: the full config (uses config.model and config.training.seed).
    mesh: the device mesh.

  Returns:
    (model, tokenizer): the policy (LoRA adapters trainable, backbone frozen)
    and its SentencePiece tokenizer.
  """
  tokenizer = gemma.load_tokenizer(config.model)
  model = gemma.load_model(config.model, mesh)
  model = lora.apply_lora(model, config.model, seed=config.training.seed)
  logging.info(
      'Built %s from %s: %d trainable LoRA parameters (rank %d)',
      config.model.preset, config.model.source,
      lora.num_params(lora.lora_state(model)), config.model.lora_rank,
  )
  return model, tokenizer
