"""Gemma 3 4B on a TPU slice (fsdp over chips), GSM8K from TFDS.

  python -m agent_tunix.main --config=configs/gemma3_4b.py:it \
      --workdir=gs://bucket/run1
"""

from configs import base


def get_config(arg=None):
  config = base.get_config()
  config.model.source = 'kaggle'
  config.model.preset = 'gemma3_4b_pt'
  config.model.path = 'google/gemma-3/flax/gemma3-4b'
  config.model.dtype = 'bfloat16'
  config.model.remat = 'block'
  config.data.source = 'gsm8k_tfds'
  config.data.num_train_examples = 0
  config.data.num_eval_examples = 256
  config.generation.max_prompt_length = 384
  config.generation.max_generation_steps = 512
  config.eval.max_generation_steps = 512
  config.generation.kv_cache_size = 1024
  config.training.batch_size = 16
  config.training.micro_batch_size = 2
  config.training.num_steps = 1000
  config.grpo.num_generations = 8
  config.mesh.shape = (-1, 1)
  config = base.apply_arg(config, arg)
  if config.model.preset.endswith('_it'):
    config.model.path = 'google/gemma-3/flax/gemma3-4b-it'
  return config
