"""`--config=configs/tiny_gemma4.py` in a checkout: the preset agent_tunix/configs/tiny_gemma4.py."""

from agent_tunix.configs.tiny_gemma4 import get_config  # pylint: disable=unused-import
