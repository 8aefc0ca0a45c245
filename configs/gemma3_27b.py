"""`--config=configs/gemma3_27b.py` in a checkout: the preset agent_tunix/configs/gemma3_27b.py."""

from agent_tunix.configs.gemma3_27b import get_config  # pylint: disable=unused-import
