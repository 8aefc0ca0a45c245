"""Checkout paths of the presets in agent_tunix/configs (`--config=configs/NAME.py`)."""
