"""Gemma 3 and 4 policies: weights by source, tokenizer, LoRA, CPU decode graph.

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
