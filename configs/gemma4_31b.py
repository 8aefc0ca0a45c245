"""`--config=configs/gemma4_31b.py` in a checkout: the preset agent_tunix/configs/gemma4_31b.py."""

from agent_tunix.configs.gemma4_31b import get_config  # pylint: disable=unused-import
