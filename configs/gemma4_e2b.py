"""`--config=configs/gemma4_e2b.py` in a checkout: the preset agent_tunix/configs/gemma4_e2b.py."""

from agent_tunix.configs.gemma4_e2b import get_config  # pylint: disable=unused-import
