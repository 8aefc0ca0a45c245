"""The judge's prompts and the strict reading of its replies.

Explicit: one request per completion lists its rubric's items one per
line as `1. <item text>`, puts the completion between `<response>` and
`</response>`, and asks for JSON only:
`{"verdicts": [{"id": 1, "met": true}, ...]}`. Implicit: the same, asking
for `{"rating": N}` with N from 1 to 10. Weights are not shown in explicit
mode (they are applied here), so the judge answers only whether each item
holds.

A reply is read strictly: exactly one verdict per item, ids 1..k, `met`
a boolean; a rating a number from 1 to 10. Anything else (a verdict
missing, an id repeated, rating 11) is unparseable, not clipped.
"""

import json
import math
import re

from agent_tunix.data import rubrics

AGGREGATIONS = ('explicit', 'implicit')

_EXPLICIT_SYSTEM = (
    'You grade one response against a numbered checklist. For each item, '
    'decide only whether the response satisfies it; judge the items '
    'independently. Length, tone and confidence earn nothing unless an item '
    'asks for them. A response that refuses, hedges or does not commit to '
    'an answer does not satisfy items that require content. An item that '
    'describes a mistake is met when the response makes that mistake.\n'
    'Reply with JSON only: {"verdicts": [{"id": 1, "met": true}, ...]}, one '
    'entry per item, in order, and nothing else.')
_IMPLICIT_SYSTEM = (
    'You rate one response against a numbered checklist of what a good '
    'answer does (items that describe a mistake count against it). Rate '
    'the response as a whole from 1 (meets none of it) to 10 (meets all of '
    'it). Length, tone and confidence earn nothing unless an item asks for '
    'them.\n'
    'Reply with JSON only: {"rating": N}, N a whole number from 1 to 10, and '
    'nothing else.')
_USER = ('<question>\n{question}\n</question>\n'
         '<reference_answer>\n{reference}\n</reference_answer>\n'
         '<response>\n{response}\n</response>\n'
         '<criteria>\n{criteria}\n</criteria>')


class Unparseable(ValueError):
  """A reply that is not the JSON asked for (the message says how)."""


def messages(task, aggregation, template=None):
  """The chat messages asking for `task`'s verdicts.

  Args:
    task: {'question', 'reference', 'response', 'items'}.
    aggregation: 'explicit' or 'implicit'.
    template: a user-supplied prompt (judge.prompt_file) with {question},
      {reference}, {response} and {criteria}; None = the built-in prompt.
  """
  fields = dict(question=task['question'],
                reference=task['reference'] or 'none',
                response=task['response'],
                criteria=rubrics.rubric_text(task['items']))
  if template is not None:
    return [{'role': 'user', 'content': fill(template, fields)}]
  system = _EXPLICIT_SYSTEM if aggregation == 'explicit' else _IMPLICIT_SYSTEM
  return [{'role': 'system', 'content': system},
          {'role': 'user', 'content': fill(_USER, fields)}]


def fill(template, fields):
  """`template` with its {name} fields (the keys of `fields`) replaced;
  other braces are kept: a prompt file may show JSON."""
  names = '|'.join(re.escape(name) for name in fields)
  return re.sub(r'\{(' + names + r')\}', lambda m: fields[m.group(1)],
                template)


def _json_object(reply):
  """The reply's JSON object (a ```json fence around it is allowed)."""
  text = (reply or '').strip()
  fence = re.fullmatch(r'```(?:json)?\s*(.*?)\s*```', text, re.S)
  if fence:
    text = fence.group(1)
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    raise Unparseable(f'not JSON ({e.msg})') from None
  if not isinstance(value, dict):
    raise Unparseable(f'a JSON {type(value).__name__}, not an object')
  return value


def parse_verdicts(reply, num_items):
  """[met, ...] for items 1..num_items from an explicit reply.

  Raises:
    Unparseable: unless the reply holds exactly one boolean verdict per
      item, with ids 1..num_items.
  """
  verdicts = _json_object(reply).get('verdicts')
  if not isinstance(verdicts, list):
    raise Unparseable('no "verdicts" list')
  if len(verdicts) != num_items:
    raise Unparseable(f'{len(verdicts)} verdicts for {num_items} items')
  met = {}
  for verdict in verdicts:
    if not isinstance(verdict, dict):
      raise Unparseable('a verdict is not an object')
    item_id, value = verdict.get('id'), verdict.get('met')
    if (isinstance(item_id, bool) or not isinstance(item_id, int)
        or not 1 <= item_id <= num_items or item_id in met):
      raise Unparseable(f'verdict id {item_id!r} is not one of 1..{num_items} '
                        'once each')
    if not isinstance(value, bool):
      raise Unparseable(f'item {item_id}: "met" is {value!r}, not true/false')
    met[item_id] = value
  return [met[i] for i in range(1, num_items + 1)]


def parse_rating(reply):
  """The 1-10 rating of an implicit reply.

  Raises:
    Unparseable: unless "rating" is a number from 1 to 10.
  """
  rating = _json_object(reply).get('rating')
  if isinstance(rating, bool) or not isinstance(rating, (int, float)):
    raise Unparseable(f'"rating" is {rating!r}, not a number')
  if not (math.isfinite(rating) and 1 <= rating <= 10):
    raise Unparseable(f'rating {rating} is outside 1..10')
  return float(rating)


def explicit_score(items, met):
  """S = sum(w * met) / sum(positive w), clipped to [-1, 1] (met: booleans
  or probabilities).

  Without positive weights (only pitfalls) the denominator is sum(|w|).
  """
  weights = [float(item['weight']) for item in items]
  positive = sum(w for w in weights if w > 0)
  denominator = positive if positive > 0 else sum(abs(w) for w in weights)
  if denominator == 0:
    return 0.0
  # `met` may hold probabilities (the Gemma judge): True counts as 1.
  score = sum(w * float(m) for w, m in zip(weights, met)) / denominator
  return min(1.0, max(-1.0, score))


def implicit_score(rating):
  """A 1-10 rating mapped to [0, 1]."""
  return (rating - 1.0) / 9.0
