"""`tool_result`: an answer that is the calculator's last result.

Layer: rewards (bottom); imports only agent.calculator (its parser) and
its own package's answer reading.

A tool-aware reward (it reads the `tool_calls` field that training passes
with tools on). Per episode, 1.0 when its answer block is exactly one
number and that number is the value of the last calculator call that ran;
0.0 otherwise:

  call calculator(expression='12 * 12 + 1000') -> 1144
  <answer>1144</answer>                          -> 1.0
  <answer>1200</answer>                          -> 0.0 (edited)
  <answer>1144 apples</answer>                   -> 0.0 (not a number)

It pays for carrying the tool's result into the answer, not for the
right answer: a right answer is almost always such a copy too, so the
outcome rewards still rank a right episode above every wrong one, and
among episodes that are all wrong it ranks a copied result above an
edited one. The call's value is recomputed from its expression with the
calculator's own parser (exact, never run as code), so the rounding of
the result text does not matter. Failed calls, calls to other tools and
calls without an `expression` argument are skipped; an episode without a
call that ran, or a run without tools, scores 0.0.

Opt-in (rewards.functions `tool_result=W`); why it exists and what it did
on configs/gemma3_270m_tools.py: docs/rewards.md.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from agent_tunix.agent import calculator
from agent_tunix.rewards import format as format_lib
from agent_tunix.rewards import math as math_lib


def last_result(calls: Sequence[Mapping[str, Any]]):
  """The exact value of the last calculator call that ran, or None."""
  values = calculator.read_calls(calls, calculator.evaluate)
  return values[-1] if values else None


def tool_result(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    tool_calls: Sequence[Sequence[Mapping[str, Any]]] | None = None,
    **unused: Any,
) -> list[float]:
  """Per episode, 1.0 when its answer is its last calculator result.

  Args:
    prompts: The prompts (unused).
    completions: The final turns' texts; their answer blocks are read.
    tool_calls: Each episode's calls ({name, arguments, result, error});
      absent without tools.
    **unused: Other example fields (ignored).

  Returns:
    One score (1.0 or 0.0) per completion.
  """
  del prompts, unused
  if tool_calls is None:
    return [0.0] * len(completions)
  scores = []
  for completion, calls in zip(completions, tool_calls, strict=True):
    result = last_result(calls)
    block = format_lib.extract_answer(completion)
    guess = None if block is None else math_lib.parse_number(block)
    scores.append(1.0 if result is not None and guess == result else 0.0)
  return scores
