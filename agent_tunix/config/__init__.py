"""The config: its validation and its generated field reference.

validation (validate(config): one check per config section, run before any
weight is read; ConfigError, the one-message refusal) and field_reference
(docs/configuration.md, generated from the comments in agent_tunix/configs/base.py).
Modules here may import agent_tunix.rl and the layers below it (data,
models, rewards, tpu) to ask what is valid; never observe, run or a command.
"""
