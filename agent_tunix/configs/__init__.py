"""The presets: get_config(arg=None) modules built on base.py (by name: `--config=gemma3_270m:quick`)."""
