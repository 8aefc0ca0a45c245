"""`tool_steps`: partial credit for calculator calls that compute the
reference solution's intermediate results.

A tool-aware reward (it reads the `tool_calls` and `reasoning` fields that
training passes with tools on). The outcome reward (`answer`) pays only a
right final number, and a small model's first calls are seldom exactly
right, so most of its groups score alike and teach nothing. This one pays,
in [0, 1], the share of the worked solution's results that the episode's
calculator calls computed anywhere inside their expressions:

  reference 'The posters cost 15 * 241 = 3615 dollars. The change is
             5000 - 3615 = 1385 dollars.'            -> results {3615, 1385}
  call calculator(expression='5000 - 15 * 241')      -> steps [3615, 1385]: 1.0
  call calculator(expression='15 * 241 + 5000')      -> steps [3615, 8615]: 0.5
  call calculator(expression='241 * 89 - 15')        -> steps [21449, 21434]: 0.0

The reference results are the numbers written right after an '=' in the
example's `reasoning` (the synthetic generator's `a * b = c` steps and
GSM8K's `<<48/2=24>>` annotations alike). A call's steps are the values of
every operation in its expression, read with the calculator's own parser
(`agent.calculator.step_values`: parsed, never run). Calls that failed,
calls to other tools and calls without an `expression` argument add
nothing. An example without a worked solution, or an episode without
tools, scores 0.0.

Opt-in (rewards.functions `tool_steps=W`). Measured on
configs/gemma3_270m_tools.py with weight 2: every group then had a reward
spread, but held-out accuracy fell from 8.2% to 1.2% in 36 steps, because
the 270M copies the prompt's `a * b + c * d` call shape and that shape's
first product is often a reference step: the partial credit paid the
template (docs/rewards.md).
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
