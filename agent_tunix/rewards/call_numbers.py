"""`call_numbers`: calculator calls built from the problem's own numbers.

A tool-aware reward (it reads the `tool_calls` and `question` fields that
training passes with tools on). Per episode, in [0, 1], the share of the
numbers written in its calculator calls that also appear in the question:

  question 'Mia has 125 cards. She buys 4 packs of 25 cards, then gives
            38 away.'                               -> {125, 4, 25, 38}
  call calculator(expression='125 + 4 * 25 - 38')   -> 4 of 4: 1.0
  call calculator(expression='125 + 4 * 25 - 900')  -> 3 of 4: 0.75
  call calculator(expression='35 * 8 * 12 - 900')  -> 0 of 4: 0.0

It pays for grounding, not for the right expression: the outcome reward
(`answer`) decides between two calls that both use the question's numbers.
What it removes is the spread that made a policy drift when no episode of
a group was right: copying a worked episode's call from the prompt (its
numbers are not the question's) or calling the calculator with numbers of
its own. A call's numbers are read with the calculator's own parser
(`agent.calculator.operands`: parsed, never run); the question's are its
digit runs (thousands commas allowed, '$' ignored), so a number written in
words does not count. Calls that failed, calls to other tools and calls
without an `expression` argument add nothing; an episode without such a
call, or a run without tools, scores 0.0.

Opt-in (rewards.functions `call_numbers=W`); configs/gemma3_270m_tools.py
does not use it (docs/rewards.md says what it did there).
"""

from collections.abc import Mapping, Sequence
import fractions
import re
from typing import Any

from agent_tunix.agent import calculator

# A number as written in a problem: digits, optional thousands commas and
# decimals; not the tail of a longer number or decimal.
_NUMBER_RE = re.compile(r'(?<![\d.])\d[\d,]*(?:\.\d+)?')


def question_numbers(question: str) -> set[fractions.Fraction]:
  """The numbers written with digits in a problem."""
  numbers = set()
  for match in _NUMBER_RE.finditer(question or ''):
    text = match.group(0).rstrip(',').replace(',', '')
    try:
      numbers.add(fractions.Fraction(text))
    except (ValueError, ZeroDivisionError):
      continue
  return numbers


def call_operands(calls: Sequence[Mapping[str, Any]]) -> list[fractions.Fraction]:
  """The numbers written in the calculator calls that ran, in order."""
  return [n for numbers in calculator.read_calls(calls, calculator.operands)
          for n in numbers]


def call_numbers(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    question: Sequence[str] | None = None,
    tool_calls: Sequence[Sequence[Mapping[str, Any]]] | None = None,
    **unused: Any,
) -> list[float]:
  """Per episode, the share of its calls' numbers found in the question.

  Args:
    prompts: The prompts (unused: they hold the worked episodes too).
    completions: The final turns' texts (only their count is used).
    question: Each example's problem text.
    tool_calls: Each episode's calls ({name, arguments, result, error});
      absent without tools.
    **unused: Other example fields (ignored).

  Returns:
    One score in [0, 1] per completion.
  """
  del prompts, unused
  if question is None or tool_calls is None:
    return [0.0] * len(completions)
  scores = []
  for text, calls in zip(question, tool_calls, strict=True):
    used = call_operands(calls)
    if not used:
      scores.append(0.0)
      continue
    known = question_numbers(text)
    scores.append(sum(n in known for n in used) / len(used))
  return scores
