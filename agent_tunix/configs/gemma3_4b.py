"""Gemma 3 4B on a TPU slice (fsdp over chips), GSM8K from Hugging Face.

Derived from the 1B preset; only the model and the per-device batch differ.

  python -m agent_tunix.main --config=configs/gemma3_4b.py:it \
      --workdir=gs://bucket/run1
"""

from agent_tunix.configs import base
from agent_tunix.configs import gemma3_1b


def get_config(arg=None):
  config = gemma3_1b.get_config()
  config.model.preset = 'gemma3_4b_pt'
  config.model.path = 'google/gemma-3/flax/gemma3-4b'
  # Smaller micro-batches: the 4B activations are 2.5x wider.
  config.training.micro_batch_size = 2
  config = base.apply_arg(config, arg)
  return base.kaggle_it_path(config, 'google/gemma-3/flax/gemma3-4b')
