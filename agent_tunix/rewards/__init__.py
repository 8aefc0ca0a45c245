"""Reward functions by name, and their weighted sum over a batch.

Every reward function has the signature

  fn(prompts: list[str], completions: list[str], **example_fields)
      -> list[float]

and returns one score per completion. `example_fields` holds one list per
field, aligned with `completions`: at least `answer` (the true final answer as
text), possibly `question`, `completion_lengths` (token counts),
`completion_tokens` (the sampled token ids, end token included) and others. A
function takes the fields it needs as keyword arguments and must accept and
ignore the rest through `**kwargs`.

The config picks the functions and their weights (`config.rewards`):

  functions = 'format_exact=0.5,format_approx=0.25,answer=1,numbers=3'
  functions = 'answer=1,my_project.rewards:brevity=0.5'

Built-in names are registered with `register`; any other function is named
`package.module:function` and imported when the reward set is built.

  reward_set = rewards.RewardSet.from_config(config.rewards)
  total, per_fn = reward_set(prompts, completions, answer=answers,
                             completion_lengths=lengths)

The modules, one idea each (the names below are re-exported here):
  registry: `register`, `registered_names`; the built-in rewards are
    registered on import.
  spec: `parse_spec` (the `rewards.functions` string), `resolve` (a name to
    its function).
  reward_set: `RewardSet`, the weighted sum over a batch.
  blame: `RewardError`, naming the failed function and completion.
  format, math: the built-in reward functions for the tag format, the
    length and a numeric final answer (and number parsing).
  call_numbers, tool_steps: rewards for calculator calls (the problem's
    own numbers; the reference solution's intermediate results).
  rubric: `rubric_judge` (a judge ticks a rubric's items) and
    `rubric_overlap` (the original pipeline's lexical score).
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
