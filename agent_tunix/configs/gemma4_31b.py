"""Gemma 4 31B on a TPU slice (fsdp over chips), GSM8K from Hugging Face.

Derived from the E2B preset; the model and the batch differ. Check that it
fits the slice before starting it:

  python -m agent_tunix.preflight --config=configs/gemma4_31b.py \
      --topology=v5p-16
  python -m agent_tunix.main --config=configs/gemma4_31b.py \
      --workdir=gs://bucket/run1

31B dense: 60 layers, 30.7B parameters (61 GB in bfloat16). On a small
slice the preflight refuses it before compiling when the weights and the
rollout's KV cache alone overflow a chip's HBM.
"""

from agent_tunix.configs import base
from agent_tunix.configs import gemma4_e2b


def get_config(arg=None):
  config = gemma4_e2b.get_config()
  config.model.preset = 'gemma4_31b'
  config.model.path = 'google/gemma-4-31B'
  config.training.batch_size = 8
  config.training.micro_batch_size = 1
  config = base.apply_arg(config, arg)
  if config.model.preset.endswith('_it') and config.model.path == (
      'google/gemma-4-31B'):
    config.model.path += '-it'
  return config
