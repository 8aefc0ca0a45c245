"""Reward functions by name, and their weighted sum over a batch.

Layer: rewards (bottom); may import agent, data, models, tpu, storage and
cli; outside its own package it imports only agent.calculator.

A reward function is `fn(prompts, completions, **example_fields) ->
list[float]`, one score per completion; `example_fields` holds one list
per field aligned with `completions` (at least `answer`), and a function
takes the fields it needs and ignores the rest through `**kwargs`.

  reward_set = rewards.RewardSet.from_config(config.rewards)
  total, per_fn = reward_set(prompts, completions, answer=answers)

Modules: registry (`register`, `registered_names`), spec (`parse_spec`,
`resolve`), reward_set (`RewardSet`) and blame (`RewardError`), whose
names are re-exported here; format and math (the tag format, length and
numeric-answer rewards), call_numbers, tool_steps and tool_result
(calculator calls), rubric (`rubric_judge`, `rubric_overlap`).

Design notes: docs/rewards.md.
"""

from agent_tunix.rewards import blame
from agent_tunix.rewards import registry
from agent_tunix.rewards import reward_set
from agent_tunix.rewards import spec

RewardFn = registry.RewardFn
LENGTH_PENALTY = registry.LENGTH_PENALTY
OVERLONG_PENALTY = registry.OVERLONG_PENALTY
register = registry.register
registered_names = registry.registered_names

parse_spec = spec.parse_spec
resolve = spec.resolve

RewardSet = reward_set.RewardSet
RewardError = blame.RewardError
