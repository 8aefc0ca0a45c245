"""`--config=configs/tiny.py` in a checkout: the preset agent_tunix/configs/tiny.py."""

from agent_tunix.configs.tiny import get_config  # pylint: disable=unused-import
