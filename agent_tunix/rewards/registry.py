"""The built-in reward names: `register` and the names taken.

A registered name can be written in `config.rewards.functions` without a
module path. The built-in rewards (format_exact, format_approx, answer,
numbers, tool_steps, call_numbers, tool_result, rubric_judge,
rubric_overlap) are registered when this module is imported, which
importing `agent_tunix.rewards` does.
"""

from collections.abc import Callable, Sequence

from agent_tunix.rewards import call_numbers as call_numbers_lib
from agent_tunix.rewards import format as format_lib
from agent_tunix.rewards import math as math_lib
from agent_tunix.rewards import rubric as rubric_lib
from agent_tunix.rewards import tool_result as tool_result_lib
from agent_tunix.rewards import tool_steps as tool_steps_lib

RewardFn = Callable[..., Sequence[float]]

# Name under which the length penalty is reported; set through
# rewards.length_penalty, never listed in rewards.functions.
LENGTH_PENALTY = 'length_penalty'
# Name under which DAPO's overlong penalty is reported; set through
# rewards.overlong_buffer and rewards.overlong_penalty.
OVERLONG_PENALTY = 'overlong_penalty'
# Names set by their own config fields, never listed in rewards.functions.
_RESERVED = {
    LENGTH_PENALTY: 'rewards.length_penalty',
    OVERLONG_PENALTY: 'rewards.overlong_buffer',
}

_REGISTRY: dict[str, RewardFn] = {}
# The functions whose NaN scores mark completions to mask (a failed judge
# call), not errors.
_MASKABLE: set[RewardFn] = set()


def register(name: str, *,
             maskable: bool = False) -> Callable[[RewardFn], RewardFn]:
  """Decorator that makes a reward function available under `name`.

  Args:
    name: The name used in `config.rewards.functions`.
    maskable: the function may score NaN for a completion to mask (its
      group's advantages are zeroed; see `RewardSet`).

  Returns:
    A decorator that registers the function and returns it unchanged.

  Raises:
    ValueError: if the name is malformed, reserved, or already taken by
      another function.
  """
  if not name or not name.isidentifier():
    raise ValueError(
        f'Reward name {name!r} is not a Python identifier; use letters, '
        'digits and underscores, e.g. "my_reward".'
    )
  if name in _RESERVED:
    raise ValueError(
        f'Reward name {name!r} is reserved for {_RESERVED[name]}; pick '
        'another name.'
    )

  def decorator(fn: RewardFn) -> RewardFn:
    if not callable(fn):
      raise ValueError(f'register({name!r}) was given {fn!r}, not a function.')
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not fn:
      raise ValueError(
          f'Reward name {name!r} is already registered for {existing!r}; '
          'pick another name.'
      )
    _REGISTRY[name] = fn
    if maskable:
      _MASKABLE.add(fn)
    return fn

  return decorator


def registered_names() -> list[str]:
  """The built-in (registered) reward names, sorted."""
  return sorted(_REGISTRY)


def lookup(name: str) -> RewardFn | None:
  """The function registered as `name`, or None."""
  return _REGISTRY.get(name)


def is_maskable(fn: RewardFn) -> bool:
  """Whether `fn` was registered with maskable=True."""
  return fn in _MASKABLE


register('format_exact')(format_lib.format_exact)
register('format_approx')(format_lib.format_approx)
register('answer')(math_lib.answer_match)
register('numbers')(math_lib.number_match)
register('tool_steps')(tool_steps_lib.tool_steps)
register('call_numbers')(call_numbers_lib.call_numbers)
register('tool_result')(tool_result_lib.tool_result)
register('rubric_judge', maskable=True)(rubric_lib.rubric_judge)
register('rubric_overlap')(rubric_lib.rubric_overlap)
