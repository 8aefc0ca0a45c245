"""Gemma 4 E2B on a TPU slice, GSM8K from TFDS, Hugging Face weights.

  python -m agent_tunix.preflight --config=configs/gemma4_e2b.py \
      --topology=v5litepod-8
  python -m agent_tunix.main --config=configs/gemma4_e2b.py \
      --workdir=gs://bucket/run1

The TPU default for Gemma 4: E2B (35 layers, 1.9B non-embedding parameters
per token, 4.65B stored with the per-layer embedding table) in bfloat16,
LoRA rank 16 on every projection (k_einsum included), each decoder layer
recomputed in the backward pass. Weights: the Hugging Face repo id in
model.path (downloaded where the network allows; otherwise a local
directory), read by tunix's Gemma 4 loader; the tokenizer comes from the
same directory (tokenizer.model, else tokenizer.json).

`:it` picks the instruction-tuned checkpoint (google/gemma-4-E2B-it) and
the Gemma 4 chat turns; data.thinking=True turns thinking on. Other sizes:
`--config.model.preset=gemma4_e4b` (with model.path to its checkpoint), or
configs/gemma4_31b.py.
"""

from configs import base


def get_config(arg=None):
  config = base.get_config()
  config.model.source = 'hf'
  config.model.preset = 'gemma4_e2b'
  config.model.path = 'google/gemma-4-E2B'
  config.model.dtype = 'bfloat16'
  config.model.remat = 'layer'
  config.model.lora_module_path = base.GEMMA4_LORA_MODULES
  config.data.source = 'gsm8k_tfds'
  config.data.num_train_examples = 0
  config.data.num_eval_examples = 256
  config.generation.max_prompt_length = 384
  config.generation.max_generation_steps = 512
  config.eval.max_generation_steps = 512
  config.generation.kv_cache_size = 1024
  config.training.batch_size = 16
  config.training.micro_batch_size = 4
  config.training.num_steps = 1000
  config.grpo.num_generations = 8
  config.optimizer.learning_rate = 3e-6
  config = base.apply_arg(config, arg)
  if config.model.preset.endswith('_it') and config.model.path == (
      'google/gemma-4-E2B'):
    config.model.path += '-it'
  return config
