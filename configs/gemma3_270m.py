"""`--config=configs/gemma3_270m.py` in a checkout: the preset agent_tunix/configs/gemma3_270m.py."""

from agent_tunix.configs.gemma3_270m import get_config  # pylint: disable=unused-import
