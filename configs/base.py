"""`--config=configs/base.py` in a checkout: the preset agent_tunix/configs/base.py."""

from agent_tunix.configs.base import get_config  # pylint: disable=unused-import
