"""Gemma 3 1B on a TPU (or GPU), GSM8K from Hugging Face, weights from Kaggle.

  python -m agent_tunix.main --config=configs/gemma3_1b.py \
      --workdir=gs://bucket/run1

`:it` picks the instruction-tuned model (chat template); set
model.path to a kagglehub handle (default below) or a local checkpoint.
"""

from agent_tunix.configs import base


def get_config(arg=None):
  config = base.get_config()
  config.model.source = 'kaggle'
  config.model.preset = 'gemma3_1b_pt'
  config.model.path = 'google/gemma-3/flax/gemma3-1b'
  config.model.dtype = 'bfloat16'
  # 896-token sequences: recompute each decoder layer in the backward pass.
  config.model.remat = 'layer'
  # openai/gsm8k from the Hub, or data.path to a local copy of its files.
  config.data.source = 'gsm8k_hf'
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
  return base.kaggle_it_path(config, 'google/gemma-3/flax/gemma3-1b')
