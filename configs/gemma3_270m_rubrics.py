"""`--config=configs/gemma3_270m_rubrics.py` in a checkout: the preset agent_tunix/configs/gemma3_270m_rubrics.py."""

from agent_tunix.configs.gemma3_270m_rubrics import get_config  # pylint: disable=unused-import
