"""A 6-layer random Gemma 4 (every dense Gemma 4 feature): tests on CPU.

  python -m agent_tunix.main --config=configs/tiny_gemma4.py --workdir=/tmp/t4

Local and global layers (global: wider heads, fewer KV heads, K=V), per-layer
embeddings and KV-shared layers (agent_tunix/models/gemma4.py,
`tiny_config`). There is no offline Gemma 4 tokenizer: the packaged Gemma 3
tokenizer stands in (the same 262,144 ids; `<turn|>` is id 106 in both).
`:model.preset=tiny_gemma4_moe` picks the 3-layer mixture-of-experts twin.
"""

from agent_tunix.configs import base
from agent_tunix.configs import tiny


def get_config(arg=None):
  config = tiny.get_config()
  config.model.preset = 'tiny_gemma4'
  config.model.lora_module_path = base.GEMMA4_LORA_MODULES
  # With agent.tools: Gemma 4's own turns and tool tokens.
  config.agent.format = 'gemma4'
  return base.apply_arg(config, arg)
