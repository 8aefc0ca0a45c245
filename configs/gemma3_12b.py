"""`--config=configs/gemma3_12b.py` in a checkout: the preset agent_tunix/configs/gemma3_12b.py."""

from agent_tunix.configs.gemma3_12b import get_config  # pylint: disable=unused-import
