"""Procedural grade-school arithmetic word problems, generated offline.

Layer: data (bottom); imports only numpy and the standard library.

`generate(split, n, difficulty, seed, unseen=False, templates=None)`
returns n distinct problems of difficulty 1 to 4 (`LEVEL_TEMPLATES`;
`unseen=True` draws the `UNSEEN_TEMPLATES` of the `synthetic_unseen`
source; `templates`, data.synthetic_templates, the named ones); train and
eval never share a problem (`in_eval_part`). Each example names its
template ('type') and expression ('shape'):

  examples = synthetic.generate('train', 100, difficulty=2, seed=0)
  examples[0]  # {'question': ..., 'answer': '42', 'reasoning': ..., ...}

Design notes: docs/data.md, 'The synthetic problems'.
"""

import dataclasses
import hashlib
from typing import Callable

import numpy as np

SPLITS = ('train', 'eval')
# Aliases accepted by `generate` for the held-out split.
_SPLIT_CODES = {'train': 0, 'eval': 1, 'test': 1}
# One key bucket in this many belongs to the eval split.
_EVAL_BUCKETS = 8
# Draw budget per requested example before giving up (problem space too small).
_MAX_DRAWS_PER_EXAMPLE = 200

_NAMES = (
    'Maya', 'Liam', 'Aisha', 'Noah', 'Sofia', 'Kenji', 'Elena', 'Omar',
    'Priya', 'Lucas', 'Zara', 'Mateo', 'Hana', 'Ivan', 'Grace', 'Tariq',
    'Chloe', 'Diego', 'Amara', 'Felix', 'Nina', 'Ravi', 'Lena', 'Kwame',
)
# (singular, plural) things that can be counted, given and collected.
_ITEMS = (
    ('apple', 'apples'), ('marble', 'marbles'), ('sticker', 'stickers'),
    ('pencil', 'pencils'), ('cookie', 'cookies'), ('stamp', 'stamps'),
    ('seashell', 'seashells'), ('trading card', 'trading cards'),
    ('balloon', 'balloons'), ('crayon', 'crayons'), ('bead', 'beads'),
    ('toy car', 'toy cars'), ('button', 'buttons'), ('orange', 'oranges'),
)
# Things bought by the piece.
_GOODS = (
    ('notebook', 'notebooks'), ('pen', 'pens'), ('sandwich', 'sandwiches'),
    ('movie ticket', 'movie tickets'), ('plant', 'plants'),
    ('book', 'books'), ('juice box', 'juice boxes'), ('poster', 'posters'),
    ('bus pass', 'bus passes'), ('puzzle', 'puzzles'),
)
# (traveller, verb) pairs for distance problems.
_TRAVELLERS = (
    ('train', 'travels'), ('cyclist', 'rides'), ('boat', 'sails'),
    ('bus', 'drives'), ('runner', 'runs'), ('truck', 'drives'),
)
_JOBS = (
    'at a bakery', 'at a bookshop', 'as a tutor', 'at a garden centre',
    'at a cafe', 'as a dog walker',
)
_TREATS = ('cookies', 'muffins', 'cupcakes', 'rolls', 'tarts')

# Inclusive (low, high) ranges by difficulty.
_COUNT = {1: (2, 20), 2: (5, 60), 3: (12, 250), 4: (120, 2500)}
_FACTOR = {1: (2, 9), 2: (2, 12), 3: (3, 25), 4: (12, 48)}
_PRICE = {1: (1, 10), 2: (2, 25), 3: (5, 60), 4: (15, 250)}
_SPEED = {1: (3, 15), 2: (10, 80), 3: (20, 120), 4: (45, 180)}
_HOURS_A_DAY = {1: (2, 8), 2: (2, 10), 3: (3, 12), 4: (3, 12)}
_BILLS = (5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)


@dataclasses.dataclass(frozen=True)
class Problem:
  """One generated problem before formatting.

  Attributes:
    key: Template name and the numbers that determine the answer; used to
      keep train and eval apart.
    statements: Sentences that set up the problem (distractors go among them).
    question: The final question sentence.
    steps: Worked solution sentences, each with one `a op b = c` equation.
    answer: The exact integer answer.
  """

  key: tuple[object, ...]
  statements: list[str]
  question: str
  steps: list[str]
  answer: int


def _int(rng, bounds):
  low, high = bounds
  return int(rng.integers(low, high + 1))


def _pick(rng, options):
  return options[int(rng.integers(len(options)))]


def _two_names(rng):
  first = _pick(rng, _NAMES)
  second = _pick(rng, _NAMES)
  while second == first:
    second = _pick(rng, _NAMES)
  return first, second


def _total(rng, level):
  name, friend = _two_names(rng)
  _, things = _pick(rng, _ITEMS)
  a, b = _int(rng, _COUNT[level]), _int(rng, _COUNT[level])
  return Problem(
      key=('total', a, b),
      statements=[
          f'{name} has {a} {things}.',
          f'{friend} gives {name} {b} more {things}.',
      ],
      question=f'How many {things} does {name} have now?',
      steps=[f'{name} starts with {a} and gets {b} more: {a} + {b} = {a + b}.'],
      answer=a + b,
  )


def _difference(rng, level):
  name, friend = _two_names(rng)
  _, things = _pick(rng, _ITEMS)
  a = _int(rng, _COUNT[level]) + 1
  b = int(rng.integers(1, a))
  return Problem(
      key=('difference', a, b),
      statements=[f'{name} had {a} {things} and gave {b} of them to {friend}.'],
      question=f'How many {things} does {name} have left?',
      steps=[f'{name} keeps {a} - {b} = {a - b} {things}.'],
      answer=a - b,
  )


def _compare(rng, level):
  name, friend = _two_names(rng)
  _, things = _pick(rng, _ITEMS)
  a = _int(rng, _COUNT[level]) + 1
  b = int(rng.integers(1, a))
  return Problem(
      key=('compare', a, b),
      statements=[f'{name} has {a} {things}.', f'{friend} has {b} {things}.'],
      question=f'How many more {things} does {name} have than {friend}?',
      steps=[f'The difference is {a} - {b} = {a - b}.'],
      answer=a - b,
  )


def _price_quantity(rng, level):
  name = _pick(rng, _NAMES)
  _, goods = _pick(rng, _GOODS)
  quantity, price = _int(rng, _FACTOR[level]), _int(rng, _PRICE[level])
  cost = quantity * price
  return Problem(
      key=('price_quantity', quantity, price),
      statements=[f'{name} buys {quantity} {goods} that cost ${price} each.'],
      question=f'How many dollars does {name} spend?',
      steps=[f'{quantity} {goods} at ${price} each cost '
             f'{quantity} * {price} = {cost} dollars.'],
      answer=cost,
  )


def _speed_time(rng, level):
  traveller, verb = _pick(rng, _TRAVELLERS)
  speed, hours = _int(rng, _SPEED[level]), _int(rng, _FACTOR[level])
  distance = speed * hours
  return Problem(
      key=('speed_time', speed, hours),
      statements=[
          f'A {traveller} {verb} at {speed} kilometers per hour for {hours} '
          'hours.'
      ],
      question=f'How many kilometers does the {traveller} cover?',
      steps=[f'Distance is speed times time: {speed} * {hours} = '
             f'{distance} kilometers.'],
      answer=distance,
  )


def _share(rng, level):
  name = _pick(rng, _NAMES)
  _, things = _pick(rng, _ITEMS)
  each, friends = _int(rng, _COUNT[level]), _int(rng, _FACTOR[level])
  total = each * friends
  return Problem(
      key=('share', each, friends),
      statements=[
          f'{name} has {total} {things} and shares them equally among '
          f'{friends} friends.'
      ],
      question=f'How many {things} does each friend get?',
      steps=[f'Each friend gets {total} / {friends} = {each} {things}.'],
      answer=each,
  )


def _change(rng, level):
  name = _pick(rng, _NAMES)
  _, goods = _pick(rng, _GOODS)
  quantity, price = _int(rng, _FACTOR[level]), _int(rng, _PRICE[level])
  cost = quantity * price
  bill = next(b for b in _BILLS if b > cost)
  return Problem(
      key=('change', quantity, price),
      statements=[
          f'{name} buys {quantity} {goods} at ${price} each and pays with a '
          f'${bill} bill.'
      ],
      question=f'How much change, in dollars, does {name} get back?',
      steps=[
          f'The {goods} cost {quantity} * {price} = {cost} dollars.',
          f'The change is {bill} - {cost} = {bill - cost} dollars.',
      ],
      answer=bill - cost,
  )


def _packs(rng, level):
  name = _pick(rng, _NAMES)
  _, things = _pick(rng, _ITEMS)
  start = _int(rng, _COUNT[level])
  packs, per_pack = _int(rng, _FACTOR[level]), _int(rng, _FACTOR[level]) + 2
  bought = packs * per_pack
  return Problem(
      key=('packs', start, packs, per_pack),
      statements=[
          f'{name} has {start} {things}.',
          f'Then {name} buys {packs} packs with {per_pack} {things} in each '
          'pack.',
      ],
      question=f'How many {things} does {name} have now?',
      steps=[
          f'The packs hold {packs} * {per_pack} = {bought} {things}.',
          f'In total {start} + {bought} = {start + bought} {things}.',
      ],
      answer=start + bought,
  )


def _packs_give(rng, level):
  name, friend = _two_names(rng)
  _, things = _pick(rng, _ITEMS)
  start = _int(rng, _COUNT[level])
  packs, per_pack = _int(rng, _FACTOR[level]), _int(rng, _FACTOR[level]) + 2
  bought = packs * per_pack
  total = start + bought
  given = int(rng.integers(1, total))
  return Problem(
      key=('packs_give', start, packs, per_pack, given),
      statements=[
          f'{name} has {start} {things}.',
          f'{name} buys {packs} packs of {things} with {per_pack} in each '
          'pack.',
          f'Later {name} gives {given} {things} to {friend}.',
      ],
      question=f'How many {things} does {name} have left?',
      steps=[
          f'The packs hold {packs} * {per_pack} = {bought} {things}.',
          f'Before giving any away {name} has {start} + {bought} = {total}.',
          f'After giving {given} away: {total} - {given} = {total - given}.',
      ],
      answer=total - given,
  )


def _wage(rng, level):
  name = _pick(rng, _NAMES)
  job = _pick(rng, _JOBS)
  wage, hours = _int(rng, _PRICE[level]) + 4, _int(rng, _HOURS_A_DAY[level])
  days = _int(rng, _FACTOR[level])
  per_day = wage * hours
  return Problem(
      key=('wage', wage, hours, days),
      statements=[
          f'{name} works {job} and earns ${wage} per hour.',
          f'{name} works {hours} hours a day for {days} days.',
      ],
      question=f'How many dollars does {name} earn in total?',
      steps=[
          f'Each day {name} earns {wage} * {hours} = {per_day} dollars.',
          f'Over {days} days that is {per_day} * {days} = '
          f'{per_day * days} dollars.',
      ],
      answer=per_day * days,
  )


def _wage_spend(rng, level):
  name = _pick(rng, _NAMES)
  job = _pick(rng, _JOBS)
  _, goods = _pick(rng, _GOODS)
  wage, hours = _int(rng, _PRICE[level]) + 4, _int(rng, _HOURS_A_DAY[level])
  days = _int(rng, _FACTOR[level])
  per_day = wage * hours
  earned = per_day * days
  spent = int(rng.integers(1, earned))
  return Problem(
      key=('wage_spend', wage, hours, days, spent),
      statements=[
          f'{name} earns ${wage} an hour {job}.',
          f'{name} works {hours} hours each day for {days} days.',
          f'Then {name} spends ${spent} on {goods}.',
      ],
      question=f'How many dollars does {name} have left from that pay?',
      steps=[
          f'Pay per day is {wage} * {hours} = {per_day} dollars.',
          f'For {days} days the pay is {per_day} * {days} = {earned} dollars.',
          f'After spending: {earned} - {spent} = {earned - spent} dollars.',
      ],
      answer=earned - spent,
  )


def _trip(rng, level):
  traveller, verb = _pick(rng, _TRAVELLERS)
  speed1, hours1 = _int(rng, _SPEED[level]), _int(rng, _FACTOR[level])
  speed2, hours2 = _int(rng, _SPEED[level]), _int(rng, _FACTOR[level])
  leg1, leg2 = speed1 * hours1, speed2 * hours2
  return Problem(
      key=('trip', speed1, hours1, speed2, hours2),
      statements=[
          f'A {traveller} {verb} at {speed1} kilometers per hour for '
          f'{hours1} hours.',
          f'Then the {traveller} goes at {speed2} kilometers per hour for '
          f'{hours2} more hours.',
      ],
      question=f'How many kilometers does the {traveller} cover altogether?',
      steps=[
          f'The first part is {speed1} * {hours1} = {leg1} kilometers.',
          f'The second part is {speed2} * {hours2} = {leg2} kilometers.',
          f'Altogether {leg1} + {leg2} = {leg1 + leg2} kilometers.',
      ],
      answer=leg1 + leg2,
  )


def _bake_share(rng, level):
  name = _pick(rng, _NAMES)
  treats = _pick(rng, _TREATS)
  trays, per_tray = _int(rng, _FACTOR[level]), _int(rng, _FACTOR[level]) + 4
  baked = trays * per_tray
  friends = _int(rng, _FACTOR[level])
  while baked - 1 < friends:  # Need at least one sold and one to share.
    friends = _int(rng, (2, _FACTOR[level][1]))
  each = int(rng.integers(1, (baked - 1) // friends + 1))
  shared = each * friends
  sold = baked - shared
  return Problem(
      key=('bake_share', trays, per_tray, sold, friends),
      statements=[
          f'{name} bakes {trays} trays of {treats} with {per_tray} on each '
          'tray.',
          f'{name} sells {sold} of the {treats} and shares the rest equally '
          f'among {friends} friends.',
      ],
      question=f'How many {treats} does each friend get?',
      steps=[
          f'{name} bakes {trays} * {per_tray} = {baked} {treats}.',
          f'After selling, {baked} - {sold} = {shared} are left.',
          f'Each friend gets {shared} / {friends} = {each}.',
      ],
      answer=each,
  )


# Shapes no training template and no worked episode of the tools prompt
# (data/prompts.py TOOL_FEW_SHOT_EXAMPLES: a + b * c - d, a * b + c * d,
# a * b * c - d) has: the `synthetic_unseen` source, for measuring whether
# what a run learned carries to problems shaped differently.


def _two_batches(rng, level):
  name = _pick(rng, _NAMES)
  treats = _pick(rng, _TREATS)
  morning, afternoon = _int(rng, _COUNT[level]), _int(rng, _COUNT[level])
  days = _int(rng, _FACTOR[level])
  daily = morning + afternoon
  return Problem(
      key=('two_batches', morning, afternoon, days),
      statements=[
          f'{name} bakes {morning} {treats} every morning and {afternoon} '
          'every afternoon.',
          f'{name} does this for {days} days.',
      ],
      question=f'How many {treats} does {name} bake in all?',
      steps=[
          f'Each day {name} bakes {morning} + {afternoon} = {daily}.',
          f'Over {days} days: {daily} * {days} = {daily * days}.',
      ],
      answer=daily * days,
  )


def _sell_buy(rng, level):
  name = _pick(rng, _NAMES)
  (_, sold_goods), (_, bought_goods) = (_pick(rng, _GOODS),
                                        _pick(rng, _GOODS))
  sold, price = _int(rng, _FACTOR[level]), _int(rng, _PRICE[level])
  bought, cost = _int(rng, _FACTOR[level]), _int(rng, _PRICE[level])
  while bought * cost >= sold * price:  # Something is left.
    bought, cost = _int(rng, _FACTOR[level]), _int(rng, _PRICE[level])
  income, spent = sold * price, bought * cost
  return Problem(
      key=('sell_buy', sold, price, bought, cost),
      statements=[
          f'{name} sells {sold} {sold_goods} at ${price} each.',
          f'With the money {name} buys {bought} {bought_goods} at ${cost} '
          'each.',
      ],
      question=f'How many dollars does {name} have left?',
      steps=[
          f'The sales bring {sold} * {price} = {income} dollars.',
          f'The purchase costs {bought} * {cost} = {spent} dollars.',
          f'Left: {income} - {spent} = {income - spent} dollars.',
      ],
      answer=income - spent,
  )


def _share_more(rng, level):
  name = _pick(rng, _NAMES)
  _, things = _pick(rng, _ITEMS)
  each, friends = _int(rng, _COUNT[level]), _int(rng, _FACTOR[level])
  had = _int(rng, _COUNT[level])
  total = each * friends
  return Problem(
      key=('share_more', each, friends, had),
      statements=[
          f'{name} shares {total} {things} equally among {friends} friends.',
          f'Each friend already had {had} {things}.',
      ],
      question=f'How many {things} does each friend have now?',
      steps=[
          f'Each friend gets {total} / {friends} = {each}.',
          f'With what they had: {each} + {had} = {each + had}.',
      ],
      answer=each + had,
  )


def _savings(rng, level):
  name = _pick(rng, _NAMES)
  start = _int(rng, _COUNT[level])
  spend = _int(rng, _PRICE[level])
  earn = spend + _int(rng, _PRICE[level])
  weeks = _int(rng, _FACTOR[level])
  saved = earn - spend
  return Problem(
      key=('savings', start, earn, spend, weeks),
      statements=[
          f'{name} has ${start} saved.',
          f'Each week {name} earns ${earn} and spends ${spend}.',
      ],
      question=f'How many dollars does {name} have after {weeks} weeks?',
      steps=[
          f'Each week {name} saves {earn} - {spend} = {saved} dollars.',
          f'In {weeks} weeks that is {saved} * {weeks} = {saved * weeks}.',
          f'With the savings: {start} + {saved * weeks} = '
          f'{start + saved * weeks} dollars.',
      ],
      answer=start + saved * weeks,
  )


def _boxes(rng, level):
  name = _pick(rng, _NAMES)
  _, things = _pick(rng, _ITEMS)
  boxes, per_box = _int(rng, _FACTOR[level]), _int(rng, _FACTOR[level])
  kept = _int(rng, _COUNT[level])
  total = kept + boxes * per_box
  return Problem(
      key=('boxes', total, kept, per_box),
      statements=[
          f'{name} has {total} {things} and keeps {kept} of them.',
          f'{name} packs the rest into boxes of {per_box}.',
      ],
      question=f'How many boxes does {name} fill?',
      steps=[
          f'{name} packs {total} - {kept} = {total - kept} {things}.',
          f'That fills {total - kept} / {per_box} = {boxes} boxes.',
      ],
      answer=boxes,
  )


TEMPLATES: dict[str, Callable[[np.random.Generator, int], Problem]] = {
    'total': _total,
    'difference': _difference,
    'compare': _compare,
    'price_quantity': _price_quantity,
    'speed_time': _speed_time,
    'share': _share,
    'change': _change,
    'packs': _packs,
    'packs_give': _packs_give,
    'wage': _wage,
    'wage_spend': _wage_spend,
    'trip': _trip,
    'bake_share': _bake_share,
    'two_batches': _two_batches,
    'sell_buy': _sell_buy,
    'share_more': _share_more,
    'savings': _savings,
    'boxes': _boxes,
}

# The expression each template's answer needs, written the usual way with
# letters for the problem's numbers.
SHAPES = {
    'total': 'a + b',
    'difference': 'a - b',
    'compare': 'a - b',
    'price_quantity': 'a * b',
    'speed_time': 'a * b',
    'share': 'a / b',
    'change': 'a - b * c',
    'packs': 'a + b * c',
    'packs_give': 'a + b * c - d',
    'wage': 'a * b * c',
    'wage_spend': 'a * b * c - d',
    'trip': 'a * b + c * d',
    'bake_share': '(a * b - c) / d',
    'two_batches': '(a + b) * c',
    'sell_buy': 'a * b - c * d',
    'share_more': 'a / b + c',
    'savings': 'a + (b - c) * d',
    'boxes': '(a - b) / c',
}

# Templates drawn at each difficulty.
LEVEL_TEMPLATES = {
    1: ('total', 'difference', 'compare', 'price_quantity', 'speed_time',
        'share'),
    2: ('total', 'difference', 'price_quantity', 'speed_time', 'share',
        'change', 'packs', 'wage'),
    3: ('change', 'packs', 'packs_give', 'wage', 'wage_spend', 'trip',
        'bake_share'),
    4: ('change', 'packs', 'packs_give', 'wage', 'wage_spend', 'trip'),
}
# Templates of the `synthetic_unseen` source, at any difficulty: shapes no
# level above draws and no worked episode shows.
UNSEEN_TEMPLATES = ('two_batches', 'sell_buy', 'share_more', 'savings',
                    'boxes')


def _distractor(rng, context):
  """One sentence with a number unrelated to the question in `context`."""
  other = _pick(rng, _NAMES)
  while other in context:  # A new person, not one of the problem's.
    other = _pick(rng, _NAMES)
  n = _int(rng, (2, 99))
  _, things = _pick(rng, _ITEMS)
  choices = (
      f'{other} is {n} years old.',
      f'{other} has {n} {things} at home.',
      f'The shop down the street opened {n} years ago.',
      f'The bus ride to school takes {n} minutes.',
      f'{other} lives {n} kilometers from the park.',
      f'There are {n} trees along the road.',
  )
  return _pick(rng, choices)


def _num_distractors(rng, level):
  if level == 1:
    return 0
  if level in (2, 4):
    return int(rng.random() < 0.5)
  return _int(rng, (1, 2))


def make_example(rng, template, difficulty, num_distractors=0):
  """Builds one example from a named template.

  Args:
    rng: A `np.random.Generator`.
    template: A key of `TEMPLATES`.
    difficulty: 1 to 4; sets the number ranges.
    num_distractors: Sentences with irrelevant numbers to insert among the
      statements.

  Returns:
    A pair (example dict with 'question', 'answer', 'reasoning', 'type'
    (the template) and 'shape' (its `SHAPES` entry); problem key).
  """
  if template not in TEMPLATES:
    raise ValueError(
        f'Unknown synthetic template {template!r}; expected one of '
        f'{sorted(TEMPLATES)}.'
    )
  _check_difficulty(difficulty)
  problem = TEMPLATES[template](rng, difficulty)
  if problem.answer < 0 or int(problem.answer) != problem.answer:
    raise AssertionError(f'Template {template} made answer {problem.answer}.')
  statements = list(problem.statements)
  context = ' '.join(statements)
  for _ in range(num_distractors):
    position = int(rng.integers(len(statements) + 1))
    statements.insert(position, _distractor(rng, context))
  steps = problem.steps + [f'The answer is {problem.answer}.']
  example = {
      'question': ' '.join(statements + [problem.question]),
      'answer': str(problem.answer),
      'reasoning': ' '.join(steps),
      'type': template,
      'shape': SHAPES[template],
  }
  return example, problem.key


def in_eval_part(key):
  """Whether a problem key belongs to the eval part of the problem space."""
  digest = hashlib.sha256(repr(key).encode()).digest()
  return int.from_bytes(digest[:8], 'little') % _EVAL_BUCKETS == 0


def _check_difficulty(difficulty):
  if difficulty not in LEVEL_TEMPLATES:
    raise ValueError(
        f'Synthetic difficulty must be one of {sorted(LEVEL_TEMPLATES)}, got '
        f'{difficulty!r}; set data.difficulty accordingly.'
    )


def check_templates(templates):
  """Raises ValueError unless every name is a key of `TEMPLATES`."""
  unknown = [t for t in templates if t not in TEMPLATES]
  if unknown:
    raise ValueError(
        f'Unknown synthetic template(s) {unknown!r} in '
        f'data.synthetic_templates; use comma-separated names of '
        f'{sorted(TEMPLATES)}, or \'\' for the difficulty\'s own.'
    )


def generate(split, num_examples, difficulty=2, seed=0, unseen=False,
             templates=None):
  """Generates `num_examples` distinct word problems for a split.

  Args:
    split: 'train', or 'eval' (alias 'test') for the held-out split.
    num_examples: How many examples to return (> 0).
    difficulty: 1 to 4 (docs/data.md, 'The synthetic problems').
    seed: Non-negative integer; same arguments give the same examples.
    unseen: draw from `UNSEEN_TEMPLATES` instead of the difficulty's
      templates (the numbers still follow the difficulty).
    templates: names of `TEMPLATES` to draw from instead of the
      difficulty's (the numbers still follow the difficulty); not with
      `unseen`.

  Returns:
    A list of dicts with 'question', 'answer' (integer as a string),
    'reasoning' (a worked solution ending in 'The answer is N.'), 'type'
    and 'shape' (see `make_example`).

  Raises:
    ValueError: on a bad argument, or when the problem space at this difficulty
      is too small for `num_examples` distinct questions.
  """
  if split not in _SPLIT_CODES:
    raise ValueError(
        f'Unknown split {split!r}; expected one of {sorted(_SPLIT_CODES)}.'
    )
  _check_difficulty(difficulty)
  if num_examples <= 0:
    raise ValueError(
        f'Synthetic data needs a positive number of examples, got '
        f'{num_examples}; set data.num_train_examples / '
        'data.num_eval_examples > 0.'
    )
  if seed < 0:
    raise ValueError(f'data.seed must be >= 0, got {seed}.')
  want_eval = _SPLIT_CODES[split] == 1
  if templates and unseen:
    raise ValueError(
        'The synthetic_unseen source draws its own templates; leave '
        f'data.synthetic_templates empty (got {list(templates)!r}).'
    )
  if unseen:
    rng = np.random.default_rng([seed, _SPLIT_CODES[split], difficulty, 1])
    templates = UNSEEN_TEMPLATES
  else:
    rng = np.random.default_rng([seed, _SPLIT_CODES[split], difficulty])
    check_templates(templates or ())
    templates = templates or LEVEL_TEMPLATES[difficulty]
  examples, seen = [], set()
  budget = _MAX_DRAWS_PER_EXAMPLE * num_examples
  for _ in range(budget):
    if len(examples) == num_examples:
      break
    template = _pick(rng, templates)
    example, key = make_example(
        rng, template, difficulty, _num_distractors(rng, difficulty)
    )
    if in_eval_part(key) != want_eval or example['question'] in seen:
      continue
    seen.add(example['question'])
    examples.append(example)
  if len(examples) < num_examples:
    raise ValueError(
        f'Could only make {len(examples)} distinct {split} problems at '
        f'difficulty {difficulty}, {num_examples} requested; lower '
        'data.num_train_examples / data.num_eval_examples or raise '
        'data.difficulty.'
    )
  return examples
