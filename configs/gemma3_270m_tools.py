"""`--config=configs/gemma3_270m_tools.py` in a checkout: the preset agent_tunix/configs/gemma3_270m_tools.py."""

from agent_tunix.configs.gemma3_270m_tools import get_config  # pylint: disable=unused-import
