"""Rewards for the shape of a completion: the tag format and the length.

The model is asked to answer as

  <reasoning>...</reasoning>
  <answer>...</answer>

with any whitespace between and around the two blocks. Every function here
has the reward signature `fn(prompts, completions, **example_fields)` and
returns one float per completion; unknown fields are ignored.

The score values follow the Gemma GRPO demo that ships with tunix
(`tunix/cli/reward_fn/gsm8k.py`): 3.0 for the exact format, +-0.5 per tag for
the approximate one.
"""

import re
from typing import Any, Sequence

REASONING_START = '<reasoning>'
REASONING_END = '</reasoning>'
ANSWER_START = '<answer>'
ANSWER_END = '</answer>'
TAGS = (REASONING_START, REASONING_END, ANSWER_START, ANSWER_END)

# Reward for a completion in exactly the expected format.
EXACT_FORMAT_SCORE = 3.0
# Per tag: added when the tag occurs exactly once, subtracted otherwise.
TAG_SCORE = 0.5

# The whole completion: a reasoning block, then an answer block, nothing but
# whitespace outside them. Whether each tag occurs only once is checked
# separately (a lazy group could otherwise swallow a repeated tag).
_EXACT_RE = re.compile(
    r'\s*'
    + re.escape(REASONING_START)
    + r'(?P<reasoning>.*?)'
    + re.escape(REASONING_END)
    + r'\s*'
    + re.escape(ANSWER_START)
    + r'(?P<answer>.*?)'
    + re.escape(ANSWER_END)
    + r'\s*',
    flags=re.DOTALL,
)

# The first complete answer block anywhere in the text.
_ANSWER_RE = re.compile(
    re.escape(ANSWER_START) + r'(.*?)' + re.escape(ANSWER_END),
    flags=re.DOTALL,
)


def is_exact_format(completion: str) -> bool:
  """Whether `completion` is exactly one reasoning block then one answer block.

  Only whitespace may surround or separate the blocks, each of the four tags
  occurs once, and both blocks hold some non-whitespace text.

  Args:
    completion: The generated text.

  Returns:
    True when the completion has the expected format.
  """
  match = _EXACT_RE.fullmatch(completion)
  if match is None:
    return False
  if any(completion.count(tag) != 1 for tag in TAGS):
    return False
  return bool(match['reasoning'].strip()) and bool(match['answer'].strip())


def extract_answer(completion: str) -> str | None:
  """Returns the text inside the first `<answer>...</answer>` block.

  The text is returned as written, whitespace included, so that callers can
  tell an exact answer from a padded one. No reasoning block is required here;
  the format rewards score that.

  Args:
    completion: The generated text.

  Returns:
    The answer text, or None when there is no complete answer block (for
    example a completion cut off before `</answer>`).
  """
  match = _ANSWER_RE.search(completion)
  return None if match is None else match.group(1)


def format_exact(
    prompts: Sequence[str], completions: Sequence[str], **unused: Any
) -> list[float]:
  """3.0 for each completion in exactly the expected format, else 0.0."""
  del prompts, unused
  return [
      EXACT_FORMAT_SCORE if is_exact_format(c) else 0.0 for c in completions
  ]


def format_approx(
    prompts: Sequence[str], completions: Sequence[str], **unused: Any
) -> list[float]:
  """Per tag, +0.5 when it occurs exactly once, -0.5 otherwise.

  Four tags give scores from -2.0 (no tag, or every tag repeated) to 2.0. The
  order of the tags is not checked; `format_exact` does that.

  Args:
    prompts: The prompts (unused).
    completions: The generated texts.
    **unused: Other example fields (ignored).

  Returns:
    One score per completion.
  """
  del prompts, unused
  scores = []
  for completion in completions:
    score = 0.0
    for tag in TAGS:
      score += TAG_SCORE if completion.count(tag) == 1 else -TAG_SCORE
    scores.append(score)
  return scores


def length_penalty(
    prompts: Sequence[str],
    completions: Sequence[str],
    completion_lengths: Sequence[int],
    coef: float,
    target: int,
    **unused: Any,
) -> list[float]:
  """`-coef * max(0, length - target)` per completion, length in tokens.

  Args:
    prompts: The prompts (unused).
    completions: The generated texts (only their number is used).
    completion_lengths: Token count of each completion.
    coef: Penalty per token beyond `target`; not negative.
    target: Length in tokens up to which there is no penalty.
    **unused: Other example fields (ignored).

  Returns:
    One penalty (zero or negative) per completion.
  """
  del prompts, unused
  if len(completion_lengths) != len(completions):
    raise ValueError(
        f'completion_lengths has {len(completion_lengths)} values for '
        f'{len(completions)} completions; give one token count per completion.'
    )
  return [
      0.0 - float(coef) * max(0.0, float(length) - float(target))
      for length in completion_lengths
  ]


def overlong_penalty(
    prompts: Sequence[str],
    completions: Sequence[str],
    completion_lengths: Sequence[int],
    max_length: int,
    buffer: int,
    factor: float,
    **unused: Any,
) -> list[float]:
  """DAPO's soft overlong punishment (Yu et al. 2025), length in tokens.

  With L the completion's length, L_max = `max_length` and
  b = `buffer`, the score is

    0                                 if L <= L_max - b,
    ((L_max - b) - L) / b * factor    if L_max - b < L <= L_max,
    -factor                           if L > L_max,

  so it falls linearly from 0 at the start of the buffer to -factor at the
  limit.

  Args:
    prompts: The prompts (unused).
    completions: The generated texts (only their number is used).
    completion_lengths: Token count of each completion (end token included).
    max_length: L_max, the completion length limit in tokens.
    buffer: b, tokens before the limit over which the penalty grows; >= 1
      and <= max_length.
    factor: The penalty at the limit; not negative.
    **unused: Other example fields (ignored).

  Returns:
    One penalty (zero or negative) per completion.

  Raises:
    ValueError: on a wrong number of lengths, or a buffer outside
      [1, max_length].
  """
  del prompts, unused
  if len(completion_lengths) != len(completions):
    raise ValueError(
        f'completion_lengths has {len(completion_lengths)} values for '
        f'{len(completions)} completions; give one token count per completion.'
    )
  if not 1 <= buffer <= max_length:
    raise ValueError(
        f'overlong buffer={buffer} must be between 1 and the length limit '
        f'{max_length} tokens.'
    )
  start = max_length - buffer
  scores = []
  for length in completion_lengths:
    over = min(max(float(length) - start, 0.0), float(buffer))
    scores.append(0.0 - over / buffer * float(factor))
  return scores
