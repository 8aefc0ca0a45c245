"""Which reward function failed, and on which completion: `RewardError`.

When a reward function raises on a batch, `blame_completion` calls it on one
completion at a time to name the first completion it fails on alone; the
error quotes that completion (cut to about `_QUOTE_CHARS` characters).
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from agent_tunix.rewards import registry

# Longest piece of a completion quoted in an error message.
_QUOTE_CHARS = 200


class RewardError(RuntimeError):
  """A reward function failed or returned unusable scores.

  Attributes:
    fn_name: Name of the reward function, as written in the config.
    index: Position of the offending completion in the batch, or None when no
      single completion could be blamed.
    completion: The offending completion, or None.
  """

  def __init__(
      self,
      message: str,
      fn_name: str,
      index: int | None = None,
      completion: str | None = None,
  ):
    super().__init__(message)
    self.fn_name = fn_name
    self.index = index
    self.completion = completion


def quote(completion: Any) -> str:
  """`completion` as a repr, cut to about `_QUOTE_CHARS` characters."""
  text = str(completion)
  if len(text) > _QUOTE_CHARS:
    text = text[:_QUOTE_CHARS] + f'... [{len(text)} chars]'
  return repr(text)


def _slice_fields(
    fields: Mapping[str, Any], index: int, size: int
) -> dict[str, Any]:
  """The fields of one completion: per-completion sequences cut to [index]."""
  one = {}
  for key, value in fields.items():
    if _is_per_completion(value, size):
      value = value[index : index + 1]
    one[key] = value
  return one


def _is_per_completion(value: Any, size: int) -> bool:
  return isinstance(value, (list, tuple, np.ndarray)) and len(value) == size


def blame_completion(
    name: str,
    fn: registry.RewardFn,
    prompts: Sequence[str],
    completions: Sequence[str],
    fields: Mapping[str, Any],
    batch_error: Exception,
) -> tuple[RewardError, Exception]:
  """Finds a completion on which `fn` fails alone, after the batch failed.

  Args:
    name: The reward's name.
    fn: The reward function.
    prompts: The batch's prompts.
    completions: The batch's completions.
    fields: The batch's example fields.
    batch_error: What the call on the whole batch raised.

  Returns:
    (error to raise, its cause): a RewardError naming the first completion
    that fails on its own, or the batch when none does.
  """
  size = len(completions)
  for index in range(size):
    try:
      fn(
          list(prompts[index : index + 1]),
          list(completions[index : index + 1]),
          **_slice_fields(fields, index, size),
      )
    except Exception as error:  # pylint: disable=broad-exception-caught
      return (
          RewardError(
              f'Reward {name!r} raised {type(error).__name__}: {error} on '
              f'completion {index}: {quote(completions[index])}',
              fn_name=name,
              index=index,
              completion=completions[index],
          ),
          error,
      )
  return (
      RewardError(
          f'Reward {name!r} raised {type(batch_error).__name__}: '
          f'{batch_error} on the batch of {size} completions, but not on any '
          'single one.',
          fn_name=name,
      ),
      batch_error,
  )
