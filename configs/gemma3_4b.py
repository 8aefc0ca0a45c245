"""`--config=configs/gemma3_4b.py` in a checkout: the preset agent_tunix/configs/gemma3_4b.py."""

from agent_tunix.configs.gemma3_4b import get_config  # pylint: disable=unused-import
