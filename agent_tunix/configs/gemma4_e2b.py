"""Gemma 4 E2B on a TPU slice, GSM8K from Hugging Face, Hugging Face weights.

  python -m agent_tunix.preflight --config=configs/gemma4_e2b.py \
      --topology=v5litepod-8
  python -m agent_tunix.main --config=configs/gemma4_e2b.py \
      --workdir=gs://bucket/run1

The TPU default for Gemma 4: E2B (35 layers, 1.9B non-embedding parameters
per token, 4.65B stored with the per-layer embedding table) in bfloat16,
LoRA rank 16 on every projection (k_einsum included), each decoder layer
recomputed in the backward pass; data, lengths and batch as
configs/gemma3_1b.py. Weights: the Hugging Face repo id in model.path
(downloaded where the network allows; otherwise a local directory), the
tokenizer from the same directory (tokenizer.model, else tokenizer.json).

The mesh splits heads over 2 chips ('tp') and the rest over fsdp: with
fsdp over all 8 chips of a v5litepod-8 the TPU compile of the rollout
prefill outgrew 22 GB of host RAM (2 prompt rows per chip; 1 row compiled
in 3.4 GB), and the update needed 100 MB more than a chip's HBM.

`:it` picks the instruction-tuned checkpoint (google/gemma-4-E2B-it) and
the Gemma 4 chat turns; data.thinking=True turns thinking on. Other sizes:
`--config.model.preset=gemma4_e4b` (with model.path to its checkpoint), or
configs/gemma4_31b.py.
"""

from agent_tunix.configs import base
from agent_tunix.configs import gemma3_1b

_PATH = 'google/gemma-4-E2B'


def get_config(arg=None):
  config = gemma3_1b.get_config()
  config.model.source = 'hf'
  config.model.preset = 'gemma4_e2b'
  config.model.path = _PATH
  config.model.lora_module_path = base.GEMMA4_LORA_MODULES
  config.mesh.shape = (-1, 2)
  # With agent.tools: Gemma 4's own turns and tool tokens.
  config.agent.format = 'gemma4'
  config = base.apply_arg(config, arg)
  if config.model.preset.endswith('_it') and config.model.path == _PATH:
    config.model.path += '-it'
  return config
