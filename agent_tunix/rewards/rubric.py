"""Rubric rewards: `rubric_judge` (a judge ticks the checklist) and
`rubric_overlap` (the original pipeline's lexical score).

Both read the rubric rows' fields that training passes with
data.task='rubric': `rubric` (each completion's items, {text, weight,
category}), `reference` (the reference answer, '' when none) and
`question`. `rubric_judge` also gets the run's judge (the reward set's
`judge` argument, built from config.judge). See docs/rubrics.md.
"""

from collections.abc import Mapping, Sequence
import difflib
import re
from typing import Any, Protocol

import numpy as np

_WORD = re.compile(r'[a-z0-9]+')


class Judge(Protocol):
  """What `rubric_judge` asks of the run's judge (judge.Judge)."""

  def task(self, question: str, reference: str, response: str,
           items: list[Mapping[str, Any]]) -> Any:
    """One completion's task for `score`."""

  def score(self, tasks: Sequence[Any]) -> np.ndarray:
    """float32 [N] scores; NaN where a call failed and is to be masked."""


def rubric_judge(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    question: Sequence[str],
    rubric: Sequence[Sequence[Mapping[str, Any]]],
    reference: Sequence[str] | None = None,
    judge: Judge | None = None,
    **unused: Any,
) -> np.ndarray:
  """The judge's score of each completion against its row's rubric.

  Explicit (judge.aggregation): S = sum(w * met) / sum(positive w), clipped
  to [-1, 1]; implicit: (rating - 1) / 9. The whole batch goes to the judge
  at once. A failed call raises `judge.JudgeError` (judge.on_failure=
  'error') or scores NaN ('mask': training zeroes its group's advantage).
  """
  del prompts, unused
  if judge is None:
    raise ValueError(
        "rubric_judge needs the run's judge (RewardSet's `judge`), which "
        'training builds from config.judge.')
  reference = reference or [''] * len(completions)
  tasks = [judge.task(q, r, c, list(items)) for q, r, c, items in zip(
      question, reference, completions, rubric, strict=True)]
  return judge.score(tasks)


def _words(text):
  return {w for w in _WORD.findall(text.lower()) if len(w) > 2}


def rubric_overlap(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    rubric: Sequence[Sequence[Mapping[str, Any]]],
    reference: Sequence[str] | None = None,
    **unused: Any,
) -> list[float]:
  """Lexical overlap with the rubric (and the reference), in [0, 1].

  Coverage is the share of the rubric's distinct words (longer than two
  letters) that the completion contains; with a reference answer the
  score is (10 * coverage + 5 * similarity) / 15, similarity being
  difflib's ratio of completion and reference, as the original pipeline's
  `rar_reward` weighed them. A cheap baseline: a completion that repeats
  the rubric scores 1 on coverage, so with data.rubric_in_prompt=True a
  policy can copy its way to the top.
  """
  del prompts, unused
  reference = reference or [''] * len(completions)
  scores = []
  for text, items, ref in zip(completions, rubric, reference, strict=True):
    wanted = set().union(*(_words(i['text']) for i in items)) if items else set()
    coverage = len(wanted & _words(text)) / len(wanted) if wanted else 0.0
    if ref:
      similarity = difflib.SequenceMatcher(None, ref, text).ratio()
      scores.append((10 * coverage + 5 * similarity) / 15)
    else:
      scores.append(coverage)
  return scores
