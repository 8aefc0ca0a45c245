"""Gemma 3 12B on a TPU slice (fsdp over chips), GSM8K from Hugging Face.

Derived from the 4B preset; only the model and the per-device batch differ.
Check that it fits the slice before starting it:

  python -m agent_tunix.preflight --config=configs/gemma3_12b.py \
      --topology=v5p-8
  python -m agent_tunix.main --config=configs/gemma3_12b.py \
      --workdir=gs://bucket/run1
"""

from agent_tunix.configs import base
from agent_tunix.configs import gemma3_4b


def get_config(arg=None):
  config = gemma3_4b.get_config()
  config.model.preset = 'gemma3_12b_pt'
  config.model.path = 'google/gemma-3/flax/gemma3-12b'
  # One prompt (its G completions) per forward/backward pass.
  config.training.micro_batch_size = 1
  config = base.apply_arg(config, arg)
  return base.kaggle_it_path(config, 'google/gemma-3/flax/gemma3-12b')
