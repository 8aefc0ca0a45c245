"""Gemma 3 27B on a TPU slice (fsdp over chips), GSM8K from Hugging Face.

Derived from the 12B preset; only the model differs. Check that it fits
the slice before starting it:

  python -m agent_tunix.preflight --config=configs/gemma3_27b.py \
      --topology=v5p-8
  python -m agent_tunix.main --config=configs/gemma3_27b.py \
      --workdir=gs://bucket/run1
"""

from agent_tunix.configs import base
from agent_tunix.configs import gemma3_12b


def get_config(arg=None):
  config = gemma3_12b.get_config()
  config.model.preset = 'gemma3_27b_pt'
  config.model.path = 'google/gemma-3/flax/gemma3-27b'
  config = base.apply_arg(config, arg)
  return base.kaggle_it_path(config, 'google/gemma-3/flax/gemma3-27b')
