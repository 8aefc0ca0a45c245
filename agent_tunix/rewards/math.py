"""Rewards for the correctness of a numeric final answer, and number parsing.

Numbers are read with a regular expression and exact `fractions.Fraction`
arithmetic. Model output is never handed to eval, sympy or any other
interpreter.

What counts as a number (the same grammar for a whole answer and for numbers
found inside text):

* ASCII digits, optionally with a decimal part: `72`, `3.50`, `007`.
* Thousands separators in groups of three: `1,234` and `1,234,567.5`;
  `1,5` is not a decimal comma, it reads as the two numbers 1 and 5.
* A sign: `-3`, `+7`, and the Unicode minus `\u22123`.
* A currency symbol before the digits, either side of the sign: `$12`, `-$12`,
  `$-12` (also euro and pound signs).
* A simple fraction of two integers: `1/2` is one half, `-3/4` minus three
  quarters; a zero denominator is not a fraction (`1/0` reads as 1 and 0).
* No exponents (`1e3` reads as 1 and 3), no words, no spaces inside a number,
  no digits other than 0-9. Numbers with more than `MAX_DIGITS` digits are
  ignored.

`parse_number` reads a whole answer and also accepts surrounding whitespace,
a leading-dot decimal (`.5`), a trailing percent sign (`12%` reads as 12, the
way GSM8K writes percentages) and one trailing full stop (`72.`).
"""

import fractions
import re
from typing import Any, Sequence

from agent_tunix.rewards import format as format_lib

# Numbers with more digits than this are ignored (not answers, and very long
# digit strings are slow to convert).
MAX_DIGITS = 300

# `answer` reward values.
EXACT_ANSWER_SCORE = 3.0  # Same text as the true answer.
CLOSE_ANSWER_SCORE = 1.5  # Same up to whitespace, or the same number.
WITHIN_10_PERCENT_SCORE = 0.5  # guess / true in [0.9, 1.1].
WITHIN_20_PERCENT_SCORE = 0.25  # guess / true in [0.8, 1.2].
WRONG_ANSWER_SCORE = -1.0  # A number, but not close (or true answer is 0).
# Answer block present, but not exactly one number: below a wrong number, or
# units/words in the block become a safer bet than computing (the 270M
# default run learned `<answer>5 cars</answer>` when this was -0.5).
NOT_A_NUMBER_SCORE = -1.5
NO_ANSWER_SCORE = 0.0  # No complete <answer>...</answer> block.

# `numbers` reward value for a number equal to the true answer.
NUMBER_MATCH_SCORE = 1.5

_SIGN = '[-+\u2212]'
_CURRENCY = '[$\u20ac\u00a3]'
_MINUS_SIGNS = ('-', '\u2212')


def _number_pattern(whole: bool) -> str:
  """The number grammar; `whole` adds what only a whole answer may have."""
  # A sign is not taken from between a digit or letter and the number
  # ("10-3" reads as 10 and 3, not 10 and -3).
  sign_guard = '' if whole else r'(?<![0-9A-Za-z)\]])'
  prefix = (
      rf'(?:{sign_guard}(?P<sign1>{_SIGN}){_CURRENCY}?'
      rf'|{_CURRENCY}(?P<sign2>{_SIGN})?)?'
  )
  fraction = (
      r'(?P<num>[0-9]+)/(?P<den>[0-9]*[1-9][0-9]*)(?![0-9]|\.[0-9])'
  )
  grouped = r'[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])'
  decimal = rf'(?P<int>{grouped}|[0-9]+)(?P<frac>\.[0-9]+)?'
  if whole:
    decimal += r'|(?P<lead>\.[0-9]+)'
  return rf'{prefix}(?:{fraction}|{decimal})'


_NUMBER_RE = re.compile(_number_pattern(whole=False))
_WHOLE_NUMBER_RE = re.compile(
    r'\s*' + _number_pattern(whole=True) + r'\s*%?\.?\s*'
)


def _to_fraction(match: re.Match[str]) -> fractions.Fraction | None:
  """The value of a number matched by one of the patterns above."""
  sign = match['sign1'] or match['sign2']
  negative = sign in _MINUS_SIGNS
  if match['den'] is not None:
    if len(match['num']) + len(match['den']) > MAX_DIGITS:
      return None
    value = fractions.Fraction(int(match['num']), int(match['den']))
  else:
    if match.groupdict().get('lead') is not None:
      whole_digits, decimals = '0', match['lead'][1:]
    else:
      whole_digits = match['int'].replace(',', '')
      decimals = match['frac'][1:] if match['frac'] else ''
    if len(whole_digits) + len(decimals) > MAX_DIGITS:
      return None
    value = fractions.Fraction(
        int(whole_digits + decimals), 10 ** len(decimals)
    )
  return -value if negative else value


def parse_number(text: str) -> fractions.Fraction | None:
  """Reads `text` as one number (see the module docstring for the grammar).

  Args:
    text: For example the contents of an answer block, or a true answer.

  Returns:
    The exact value, or None when `text` is not exactly one number.
  """
  match = _WHOLE_NUMBER_RE.fullmatch(str(text))
  return None if match is None else _to_fraction(match)


def find_numbers(text: str) -> list[fractions.Fraction]:
  """Every number in `text`, in order of appearance.

  Args:
    text: Any text.

  Returns:
    The exact values; empty when there are none.
  """
  values = []
  for match in _NUMBER_RE.finditer(text):
    value = _to_fraction(match)
    if value is not None:
      values.append(value)
  return values


def guess_number(completion: str) -> fractions.Fraction | None:
  """The number a completion gives as its answer, for the `numbers` reward.

  With an `<answer>` tag: what follows the first `<answer>`, up to
  `</answer>` or, when the completion was cut off, the end of the text, when
  that is exactly one number (as evaluation.is_correct reads it): a wordy
  block such as `<answer>5 cars</answer>` gives None. Paying for the first
  number of a wordy block taught the 270M to write units in the block,
  which evaluation counts wrong (accuracy 24.6% -> 2.0% in 23 steps).
  Without an `<answer>` tag: the last number in the completion, so a model
  that has not learned the tags yet still gets a signal for a correct
  result (the format rewards tell the two cases apart).

  Args:
    completion: The generated text.

  Returns:
    The number, or None when there is none where it was looked for.
  """
  start = completion.find(format_lib.ANSWER_START)
  if start < 0:
    numbers = find_numbers(completion)
    return numbers[-1] if numbers else None
  segment = completion[start + len(format_lib.ANSWER_START) :]
  end = segment.find(format_lib.ANSWER_END)
  if end >= 0:
    segment = segment[:end]
  return parse_number(segment.strip())


def question_numbers(
    prompts: Sequence[str], question: Sequence[Any] | None
) -> list[frozenset[fractions.Fraction]]:
  """Per completion, the numbers of its question (else of its prompt).

  Partial credit never pays for one of these: a number copied from the
  question is no evidence of having solved it.

  Args:
    prompts: The prompts, one per completion.
    question: The `question` example field, one per completion, or None
      when the caller has none (the prompt's numbers are used then).

  Returns:
    One set of exact values per completion.
  """
  texts = prompts if question is None else question
  return [frozenset(find_numbers(str(text))) for text in texts]


def score_answer(
    guess: str | None,
    true_answer: str,
    copied: frozenset[fractions.Fraction] = frozenset(),
) -> float:
  """The `answer` reward for one extracted answer; see `answer_match`.

  Args:
    guess: The text of the answer block, or None when there is none.
    true_answer: The true final answer.
    copied: Numbers of the question; a guess among them earns no partial
      (ratio) credit.

  Returns:
    The score.
  """
  if guess is None:
    return NO_ANSWER_SCORE
  if guess == true_answer:
    return EXACT_ANSWER_SCORE
  if guess.strip() == true_answer.strip():
    return CLOSE_ANSWER_SCORE
  guess_value = parse_number(guess)
  if guess_value is None:
    return NOT_A_NUMBER_SCORE
  true_value = parse_number(true_answer)
  if true_value is None:
    return WRONG_ANSWER_SCORE
  if guess_value == true_value:
    return CLOSE_ANSWER_SCORE
  if true_value == 0 or guess_value in copied:
    return WRONG_ANSWER_SCORE
  ratio = guess_value / true_value
  if fractions.Fraction(9, 10) <= ratio <= fractions.Fraction(11, 10):
    return WITHIN_10_PERCENT_SCORE
  if fractions.Fraction(8, 10) <= ratio <= fractions.Fraction(12, 10):
    return WITHIN_20_PERCENT_SCORE
  return WRONG_ANSWER_SCORE


def answer_match(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    answer: Sequence[Any],
    question: Sequence[Any] | None = None,
    **unused: Any,
) -> list[float]:
  """Scores the text of the first `<answer>...</answer>` block.

  Per completion, the first rule that applies:

  * no complete answer block: 0.0;
  * the block's text equals the true answer: 3.0;
  * equal after stripping whitespace: 1.5;
  * the text is not a number (`parse_number`): -1.5 (below a wrong
    number: evaluation counts it wrong too);
  * the true answer is not a number: -1.0;
  * the same number written differently (`72.0`, `$72`, `1,234`): 1.5;
  * the true answer is 0 (no ratio), or the number occurs in the question
    (copied, not computed): -1.0;
  * guess / true in [0.9, 1.1]: 0.5; in [0.8, 1.2]: 0.25; otherwise -1.0.

  The tiers follow the tunix Gemma GRPO demo; the "same number" tier, the
  zero true answer and the copied numbers are this project's choice.

  Args:
    prompts: The prompts; their numbers stand for the question's when
      `question` is not given.
    completions: The generated texts.
    answer: The true final answer of each completion's example, as text (other
      values are converted with `str`).
    question: The question of each completion's example (optional).
    **unused: Other example fields (ignored).

  Returns:
    One score per completion.
  """
  del unused
  copied = question_numbers(prompts, question)
  return [
      score_answer(format_lib.extract_answer(c), str(a), q)
      for c, a, q in zip(completions, answer, copied, strict=True)
  ]


def number_match(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    answer: Sequence[Any],
    question: Sequence[Any] | None = None,
    **unused: Any,
) -> list[float]:
  """1.5 when the completion's number (`guess_number`) equals the true answer.

  This is the lenient correctness reward: it reads the number without the
  tags too (not inside a wordy answer block, which evaluation counts
  wrong). It pays nothing for a number that
  occurs in the question, even when that number is the true answer: copying
  cannot be told from solving there (the `answer` reward still pays an exact
  tagged answer in full).

  Args:
    prompts: The prompts; their numbers stand for the question's when
      `question` is not given.
    completions: The generated texts.
    answer: The true final answer of each completion's example, as text. A
      true answer that is not a number gives 0.0.
    question: The question of each completion's example (optional).
    **unused: Other example fields (ignored).

  Returns:
    One score (1.5 or 0.0) per completion.
  """
  del unused
  copied = question_numbers(prompts, question)
  scores = []
  for completion, true_answer, numbers in zip(
      completions, answer, copied, strict=True
  ):
    guess = guess_number(completion)
    true_value = parse_number(str(true_answer))
    matched = guess is not None and guess == true_value
    scores.append(
        NUMBER_MATCH_SCORE if matched and guess not in numbers else 0.0
    )
  return scores
