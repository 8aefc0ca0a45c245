"""`tool_steps`: partial credit for calculator calls that compute the
reference solution's intermediate results.

Layer: rewards (bottom); imports only agent.calculator (its parser).

`tool_steps(prompts, completions, reasoning=..., tool_calls=...)` scores
each episode in [0, 1]: the share of `reference_results(reasoning)` (the
numbers right after an '=' in the worked solution) that `call_steps` (the
values of every operation in the calls that ran) contains. Opt-in
(rewards.functions `tool_steps=W`): on the 270M tools preset it paid the
copied call shape, not the steps.

Design notes: docs/rewards.md, `tool_steps`.
"""

from collections.abc import Mapping, Sequence
import fractions
import re
from typing import Any

from agent_tunix.agent import calculator

# A number right after '=' (optional '$' and spaces; thousands commas).
_RESULT_RE = re.compile(r'=\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)')


def reference_results(reasoning: str) -> set[fractions.Fraction]:
  """The numbers written right after an '=' in a worked solution."""
  results = set()
  for match in _RESULT_RE.finditer(reasoning or ''):
    text = match.group(1).replace(',', '')
    try:
      results.add(fractions.Fraction(text))
    except (ValueError, ZeroDivisionError):
      continue
  return results


def call_steps(calls: Sequence[Mapping[str, Any]]) -> set[fractions.Fraction]:
  """The values of every operation in the calculator calls that ran."""
  return {v for steps in calculator.read_calls(calls, calculator.step_values)
          for v in steps}


def tool_steps(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    reasoning: Sequence[str] | None = None,
    tool_calls: Sequence[Sequence[Mapping[str, Any]]] | None = None,
    **unused: Any,
) -> list[float]:
  """Per episode, the share of the reference results its calls computed.

  Args:
    prompts: The prompts (unused).
    completions: The final turns' texts (only their count is used).
    reasoning: Each example's worked solution ('' when it has none).
    tool_calls: Each episode's calls ({name, arguments, result, error});
      absent without tools.
    **unused: Other example fields (ignored).

  Returns:
    One score in [0, 1] per completion.
  """
  del prompts, unused
  n = len(completions)
  if reasoning is None or tool_calls is None:
    return [0.0] * n
  scores = []
  for text, calls in zip(reasoning, tool_calls, strict=True):
    wanted = reference_results(text)
    if not wanted:
      scores.append(0.0)
      continue
    scores.append(len(wanted & call_steps(calls)) / len(wanted))
  return scores
