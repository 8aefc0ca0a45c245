"""`--config=configs/gemma3_1b.py` in a checkout: the preset agent_tunix/configs/gemma3_1b.py."""

from agent_tunix.configs.gemma3_1b import get_config  # pylint: disable=unused-import
