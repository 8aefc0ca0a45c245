"""`--config=configs/quick_test.py` in a checkout: the preset agent_tunix/configs/quick_test.py."""

from agent_tunix.configs.quick_test import get_config  # pylint: disable=unused-import
