"""Tests for agent_tunix.rewards: built-in rewards, parsing and the registry."""

import decimal
import fractions
import importlib.util
import pathlib
import textwrap

import hypothesis
from hypothesis import strategies as st
import ml_collections
import numpy as np
import pytest

from agent_tunix import rewards
from agent_tunix.rewards import call_numbers as call_numbers_rewards
from agent_tunix.rewards import format as format_rewards
from agent_tunix.rewards import math as math_rewards
from agent_tunix.rewards import registry
from agent_tunix.rewards import tool_result as tool_result_rewards
from agent_tunix.rewards import tool_steps as tool_steps_rewards
from agent_tunix.rl import evaluation

F = fractions.Fraction
_FUZZ = hypothesis.settings(deadline=None, database=None, max_examples=150)

GOOD = '<reasoning>6 * 12 = 72</reasoning>\n<answer>72</answer>'

# A synthetic-style problem whose question holds a number within 20% of
# the answer (100 vs 90) and one equal to a wrong guess (10).
_QUESTION = 'A shop had 100 apples and sold 10 of them. How many are left?'
_ANSWER = '90'


def _one(fn, completion, **fields):
  """Calls a reward function on a single completion."""
  fields = {k: [v] for k, v in fields.items()}
  (score,) = fn(['prompt'], [completion], **fields)
  return score


# --------------------------------------------------------------- format_exact


@pytest.mark.parametrize(
    'completion, expected',
    [
        (GOOD, 3.0),
        ('<reasoning>r</reasoning><answer>1</answer>', 3.0),
        ('\n  <reasoning>\nr\n</reasoning>\n\n<answer> 1 </answer>\n', 3.0),
        ('Sure! ' + GOOD, 0.0),  # Text before.
        (GOOD + ' Hope this helps.', 0.0),  # Text after.
        ('<reasoning>r</reasoning> so <answer>1</answer>', 0.0),  # Between.
        ('<answer>72</answer>', 0.0),  # No reasoning.
        ('<reasoning>r</reasoning>', 0.0),  # No answer.
        ('<answer>1</answer><reasoning>r</reasoning>', 0.0),  # Wrong order.
        (GOOD + '<answer>72</answer>', 0.0),  # Answer block twice.
        ('<reasoning>a</reasoning><reasoning>b</reasoning><answer>1</answer>',
         0.0),
        ('<reasoning>a<reasoning>b</reasoning><answer>1</answer>', 0.0),
        ('<reasoning> </reasoning><answer>1</answer>', 0.0),  # Empty.
        ('<reasoning>r</reasoning><answer>\n</answer>', 0.0),  # Blank answer.
        ('<reasoning>r</reasoning><answer>72', 0.0),  # Cut off.
        ('<Reasoning>r</Reasoning><Answer>1</Answer>', 0.0),  # Case matters.
        ('', 0.0),
    ],
)
def test_format_exact(completion, expected):
  assert _one(format_rewards.format_exact, completion) == expected


# -------------------------------------------------------------- format_approx


@pytest.mark.parametrize(
    'completion, expected',
    [
        (GOOD, 2.0),
        ('no tags at all', -2.0),
        ('<answer>1</answer><reasoning>r</reasoning>', 2.0),  # Order ignored.
        ('<answer>72</answer>', 0.0),
        ('<reasoning>r</reasoning><answer>72', 1.0),  # Cut off.
        (GOOD + '<answer>72</answer>', 0.0),  # Answer tags twice.
        (GOOD + GOOD, -2.0),
        ('<reasoning><reasoning></reasoning><answer></answer>', 1.0),
    ],
)
def test_format_approx(completion, expected):
  assert _one(format_rewards.format_approx, completion) == expected


# ------------------------------------------------------------- extract_answer


@pytest.mark.parametrize(
    'completion, expected',
    [
        (GOOD, '72'),
        ('<answer> 7 2 \n</answer>', ' 7 2 \n'),
        ('text <answer>5</answer> more <answer>6</answer>', '5'),
        ('<answer></answer>', ''),
        ('<answer>72', None),
        ('72</answer>', None),
        ('', None),
    ],
)
def test_extract_answer(completion, expected):
  assert format_rewards.extract_answer(completion) == expected


# --------------------------------------------------------------------- answer


def _tagged(answer_text):
  return f'<reasoning>work</reasoning><answer>{answer_text}</answer>'


@pytest.mark.parametrize(
    'completion, true_answer, expected',
    [
        (_tagged('72'), '72', 3.0),
        (_tagged(' 72 '), '72', 1.5),  # Whitespace only.
        (_tagged('72'), ' 72', 1.5),
        (_tagged('72.0'), '72', 1.5),  # Same number, other text.
        (_tagged('$72'), '72', 1.5),
        (_tagged('72%'), '72', 1.5),
        (_tagged('1,234'), '1234', 1.5),
        (_tagged('1234'), '1,234', 1.5),
        (_tagged('1/2'), '0.5', 1.5),
        (_tagged('1.50'), '1.5', 1.5),
        (_tagged('-3'), '-3', 3.0),
        (_tagged('\u22123'), '-3', 1.5),  # Unicode minus.
        (_tagged('-3'), '3', -1.0),
        (_tagged('75'), '72', 0.5),  # Ratio 1.04.
        (_tagged('90'), '100', 0.5),  # Boundaries are inclusive.
        (_tagged('110'), '100', 0.5),
        (_tagged('80'), '100', 0.25),
        (_tagged('120'), '100', 0.25),
        (_tagged('79.99'), '100', -1.0),
        (_tagged('120.01'), '100', -1.0),
        (_tagged('-1.05'), '-1', 0.5),  # Negative answers.
        (_tagged('0'), '0', 3.0),  # True answer zero.
        (_tagged('0.0'), '0', 1.5),
        (_tagged('0.001'), '0', -1.0),
        (_tagged('seventy-two'), '72', -1.5),  # Not a number.
        (_tagged('72 apples'), '72', -1.5),
        (_tagged(''), '72', -1.5),
        (_tagged('5'), 'blue', -1.0),  # True answer not a number.
        (_tagged('blue'), 'blue', 3.0),
        ('72', '72', 0.0),  # No tags.
        ('<reasoning>r</reasoning><answer>72', '72', 0.0),  # Cut off.
        ('<answer>72</answer> extra text', '72', 3.0),  # Reasoning not needed.
    ],
)
def test_answer(completion, true_answer, expected):
  assert _one(math_rewards.answer_match, completion,
              answer=true_answer) == expected


def test_answer_accepts_non_string_answers_and_ignores_other_fields():
  scores = math_rewards.answer_match(
      ['p', 'p'], [_tagged('72'), _tagged('1.5')], answer=[72, 1.5],
      question=['q', 'q'], completion_lengths=[3, 4])
  assert scores == [3.0, 3.0]


_DISTRACTED = ('Grace had 55 cards and gave 33 of them to Diego. The bus '
               'ride takes 22 minutes. How many cards does Grace have left?')


@pytest.mark.parametrize(
    'fn, completion, true_answer, question, expected',
    [
        # Ratio ladder: 100 / 90 is within 20%, but 100 is in the question.
        (math_rewards.answer_match, _tagged('100'), '90', _QUESTION, -1.0),
        (math_rewards.answer_match, _tagged('100'), '90', 'No numbers.',
         0.25),
        (math_rewards.answer_match, _tagged('89'), '90', _QUESTION, 0.5),
        # The exact answer pays in full even when the question holds it.
        (math_rewards.answer_match, _tagged('22'), '22', _DISTRACTED, 3.0),
        # numbers: no credit for a number the question holds, even when it
        # is the true answer (copying cannot be told from solving).
        (math_rewards.number_match, '55 - 33 = 22', '22', _DISTRACTED, 0.0),
        (math_rewards.number_match, '55 - 33 = 22', '22', 'Cards: 55, 33.',
         1.5),
        (math_rewards.number_match, _tagged('90'), '90', _QUESTION, 1.5),
    ],
)
def test_partial_credit_ignores_numbers_copied_from_the_question(
    fn, completion, true_answer, question, expected):
  assert _one(fn, completion, answer=true_answer,
              question=question) == expected


def test_without_a_question_field_the_prompt_numbers_count_as_copied():
  for fn, expected in ((math_rewards.answer_match, -1.0),
                       (math_rewards.number_match, 0.0)):
    (score,) = fn([_QUESTION], [_tagged('100')],
                  answer=['100' if fn is math_rewards.number_match else '90'])
    assert score == expected, fn


# -------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    'completion, true_answer, expected',
    [
        (_tagged('72'), '72', 1.5),
        # A block that is not exactly one number pays nothing, as
        # evaluation counts it wrong.
        (_tagged('The answer is 72 dollars.'), '72', 0.0),
        (_tagged(' 72 '), '72', 1.5),
        (_tagged('72.00'), '72', 1.5),
        (_tagged('$1,234'), '1234', 1.5),
        (_tagged('-3'), '-3', 1.5),
        (_tagged('3'), '-3', 0.0),
        (_tagged('0'), '0', 1.5),
        (_tagged('71 or 72'), '72', 0.0),
        ('<reasoning>it is 72</reasoning><answer>?</answer>', '72', 0.0),
        ('<reasoning>r</reasoning><answer>so 72', '72', 0.0),  # Cut off.
        ('<reasoning>r</reasoning><answer>72', '72', 1.5),
        ('5 + 3 = 8', '8', 1.5),  # No tags: last number.
        ('5 + 3 = 8', '5', 0.0),
        ('no numbers', '8', 0.0),
        (_tagged('8'), 'eight', 0.0),  # True answer not a number.
    ],
)
def test_numbers(completion, true_answer, expected):
  assert _one(math_rewards.number_match, completion,
              answer=true_answer) == expected


# ------------------------------------------------------------- length penalty


def test_length_penalty():
  scores = format_rewards.length_penalty(
      ['p'] * 4, ['c'] * 4, completion_lengths=[0, 256, 257, 300],
      coef=0.01, target=256, answer=['1'] * 4)
  np.testing.assert_allclose(scores, [0.0, 0.0, -0.01, -0.44])


def test_length_penalty_rejects_wrong_number_of_lengths():
  with pytest.raises(ValueError, match='2 values for 3 completions'):
    format_rewards.length_penalty(
        ['p'] * 3, ['c'] * 3, completion_lengths=[1, 2], coef=1.0, target=0)


def _overlong_reference(lengths, max_length, buffer, factor):
  """DAPO's R_length (Yu et al. 2025, eq. 13), piecewise, times factor."""
  lengths = np.asarray(lengths, np.float64)
  start = max_length - buffer
  inside = (start - lengths) / buffer * factor
  return np.where(lengths <= start, 0.0,
                  np.where(lengths <= max_length, inside, -factor))


@pytest.mark.parametrize('max_length, buffer, factor', [
    (8, 4, 1.0), (256, 64, 0.5), (10, 10, 2.0), (5, 1, 1.0), (300, 37, 0.3),
])
def test_overlong_penalty_matches_numpy(max_length, buffer, factor):
  lengths = np.arange(0, max_length + 3)
  scores = format_rewards.overlong_penalty(
      [''] * len(lengths), [''] * len(lengths), completion_lengths=lengths,
      max_length=max_length, buffer=buffer, factor=factor, answer=[''])
  np.testing.assert_allclose(
      scores, _overlong_reference(lengths, max_length, buffer, factor),
      rtol=1e-12, atol=1e-12)
  # 0 up to the start of the buffer, -factor at the limit and beyond.
  assert scores[max_length - buffer] == 0.0
  assert scores[max_length] == pytest.approx(-factor)
  assert np.all(np.diff(scores) <= 0)


def test_overlong_penalty_errors():
  with pytest.raises(ValueError, match='2 values for 3 completions'):
    format_rewards.overlong_penalty(
        ['p'] * 3, ['c'] * 3, completion_lengths=[1, 2], max_length=8,
        buffer=2, factor=1.0)
  with pytest.raises(ValueError, match='buffer=9 must be between 1 and'):
    format_rewards.overlong_penalty(
        ['p'], ['c'], completion_lengths=[1], max_length=8, buffer=9,
        factor=1.0)


# ------------------------------------------------------------- number parsing


@pytest.mark.parametrize(
    'text, expected',
    [
        ('72', F(72)),
        ('  72\n', F(72)),
        ('007', F(7)),
        ('-3', F(-3)),
        ('+7', F(7)),
        ('\u22125', F(-5)),
        ('3.50', F(7, 2)),
        ('.5', F(1, 2)),
        ('72.', F(72)),
        ('1,234', F(1234)),
        ('1,234,567.25', F(4938269, 4)),
        ('$12', F(12)),
        ('-$12', F(-12)),
        ('$-12', F(-12)),
        ('\u20ac5', F(5)),
        ('12%', F(12)),
        ('1/2', F(1, 2)),
        ('-3/4', F(-3, 4)),
        ('1,5', None),
        ('1,2345', None),
        ('1e3', None),
        ('1/0', None),
        ('--3', None),
        ('3-', None),
        ('1 000', None),
        ('72 apples', None),
        ('\u0663', None),  # Arabic-Indic digit three.
        ('inf', None),
        ('nan', None),
        ('', None),
        ('.', None),
        ('9' * 301, None),  # More than MAX_DIGITS digits.
    ],
)
def test_parse_number(text, expected):
  assert math_rewards.parse_number(text) == expected


@pytest.mark.parametrize(
    'text, expected',
    [
        ('no numbers here', []),
        ('10-3=7', [F(10), F(3), F(7)]),
        ('from -2 to +3', [F(-2), F(3)]),
        ('costs $1,234.50 each', [F(246900, 200)]),
        ('3/4 of 20 is 15.', [F(3, 4), F(20), F(15)]),
        ('1/0', [F(1), F(0)]),
        ('1e3', [F(1), F(3)]),
        ('1,2345', [F(1), F(2345)]),
        ('x2 and 3x', [F(2), F(3)]),
        ('1.2.3', [F(6, 5), F(3)]),
    ],
)
def test_find_numbers(text, expected):
  assert math_rewards.find_numbers(text) == expected


# ----------------------------------------------------------------- parse_spec


def test_parse_spec_default_config():
  assert rewards.parse_spec(
      'format_exact=1,format_approx=1,answer=1,numbers=1') == [
          ('format_exact', 1.0), ('format_approx', 1.0), ('answer', 1.0),
          ('numbers', 1.0)]


@pytest.mark.parametrize(
    'spec, expected',
    [
        (' answer = 2 , numbers=0.5 ', [('answer', 2.0), ('numbers', 0.5)]),
        ('answer', [('answer', 1.0)]),  # Bare name: weight 1.
        ('answer=0,numbers=-1', [('answer', 0.0), ('numbers', -1.0)]),
        ('my.pkg.mod:fn=0.5,answer=1e-1',
         [('my.pkg.mod:fn', 0.5), ('answer', 0.1)]),
        ('mod:Class.method', [('mod:Class.method', 1.0)]),
    ],
)
def test_parse_spec(spec, expected):
  assert rewards.parse_spec(spec) == expected


@pytest.mark.parametrize(
    'spec, message',
    [
        ('', 'rewards.functions is empty'),
        ('  ', 'rewards.functions is empty'),
        ('answer=1,,numbers=1', 'entry 2 is empty; remove the extra comma'),
        ('answer=1,', 'entry 2 is empty'),
        ('anwser=1', "unknown reward 'anwser'.*Did you mean 'answer'"),
        ('bogus=1', 'Built-in rewards: answer, call_numbers, format_approx, '
                    'format_exact, numbers, rubric_judge, rubric_overlap, '
                    'tool_result, tool_steps; for '
                    'your own function'),
        ('answer=abc', "'answer=abc': weight 'abc' is not a finite number"),
        ('answer=nan', "weight 'nan' is not a finite number"),
        ('answer=inf', "weight 'inf' is not a finite number"),
        ('answer=', "weight '' is not a finite number"),
        ('=1', "entry '=1' has no name"),
        ('answer=1,numbers=1,answer=2', "'answer' is listed twice"),
        ('length_penalty=1', 'set rewards.length_penalty'),
        ('overlong_penalty=1', 'set rewards.overlong_buffer'),
        ('mod:=1', 'not of the form "package.module:function"'),
        (':fn=1', 'not of the form'),
        ('my mod:fn=1', 'not of the form'),
        ('mod:fn:x=1', 'not of the form'),
    ],
)
def test_parse_spec_errors(spec, message):
  with pytest.raises(ValueError, match=message):
    rewards.parse_spec(spec)


# -------------------------------------------------------------------- resolve


@pytest.fixture
def user_module(tmp_path, monkeypatch):
  """A module `user_rewards_fixture` on sys.path with a few reward fns."""
  (tmp_path / 'user_rewards_fixture.py').write_text(textwrap.dedent("""
      NOT_A_FUNCTION = 3

      def brevity(prompts, completions, **kwargs):
        return [-len(c) / 10 for c in completions]

      def boom_on_bad(prompts, completions, **kwargs):
        for c in completions:
          if 'bad' in c:
            raise ZeroDivisionError('cannot score ' + c[:10])
        return [1.0] * len(completions)

      def batch_only_failure(prompts, completions, **kwargs):
        if len(completions) > 1:
          raise RuntimeError('only fails on batches')
        return [1.0]

      def wrong_length(prompts, completions, **kwargs):
        return [1.0] * (len(completions) + 1)

      def nan_on_bad(prompts, completions, **kwargs):
        return [float('nan') if 'bad' in c else 1.0 for c in completions]

      def huge(prompts, completions, **kwargs):
        return [1e39 for _ in completions]

      def words(prompts, completions, **kwargs):
        return ['one' for _ in completions]

      def needs_question(prompts, completions, question, **kwargs):
        return [float(len(q)) for q in question]

      class Scorer:
        @staticmethod
        def score(prompts, completions, **kwargs):
          return [2.0] * len(completions)
  """))
  (tmp_path / 'broken_rewards_fixture.py').write_text(
      'import module_that_does_not_exist_anywhere\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  return 'user_rewards_fixture'


def test_resolve_builtins():
  assert rewards.resolve('answer') is math_rewards.answer_match
  assert rewards.resolve('numbers') is math_rewards.number_match
  assert rewards.resolve('format_exact') is format_rewards.format_exact
  assert rewards.resolve('format_approx') is format_rewards.format_approx


def test_resolve_user_function(user_module):
  fn = rewards.resolve(f'{user_module}:brevity')
  assert fn(['p'], ['abcd']) == [-0.4]
  assert rewards.resolve(f'{user_module}:Scorer.score')(['p'], ['x']) == [2.0]


@pytest.mark.parametrize(
    'name, message',
    [
        ('no_such_module_xyz:fn', "no module named 'no_such_module_xyz'"),
        ('user_rewards_fixture:missing',
         "has no attribute 'missing'; check the function name"),
        ('user_rewards_fixture:NOT_A_FUNCTION', 'is a int, not a function'),
        ('broken_rewards_fixture:fn',
         "importing 'broken_rewards_fixture' failed.*"
         'module_that_does_not_exist_anywhere'),
        ('nope', "unknown reward 'nope'"),
    ],
)
def test_resolve_errors(user_module, name, message):
  del user_module
  with pytest.raises(ValueError, match=message):
    rewards.resolve(name)


def test_register(monkeypatch):
  monkeypatch.setattr(registry, '_REGISTRY', dict(registry._REGISTRY))

  @rewards.register('always_one')
  def always_one(prompts, completions, **kwargs):
    del prompts, kwargs
    return [1.0] * len(completions)

  assert 'always_one' in rewards.registered_names()
  assert rewards.resolve('always_one') is always_one
  assert rewards.parse_spec('always_one=2') == [('always_one', 2.0)]
  with pytest.raises(ValueError, match='already registered'):
    rewards.register('always_one')(lambda p, c, **k: [])
  with pytest.raises(ValueError, match='reserved'):
    rewards.register('length_penalty')
  with pytest.raises(ValueError, match='reserved for rewards.overlong_buffer'):
    rewards.register('overlong_penalty')
  with pytest.raises(ValueError, match='not a Python identifier'):
    rewards.register('a:b')


# ------------------------------------------------------------------ RewardSet


def test_reward_set_total_is_weighted_sum(user_module):
  reward_set = rewards.RewardSet(
      f'format_exact=1,format_approx=0.5,answer=2,numbers=0,'
      f'{user_module}:brevity=-1')
  completions = [GOOD, 'the answer is 72', _tagged('70'), _tagged('x')]
  total, per_fn = reward_set(['p'] * 4, completions, answer=['72'] * 4,
                             question=['q'] * 4)
  assert list(per_fn) == ['format_exact', 'format_approx', 'answer',
                          'numbers', f'{user_module}:brevity']
  np.testing.assert_array_equal(per_fn['answer'], [3.0, 0.0, 0.5, -1.5])
  np.testing.assert_array_equal(per_fn['numbers'], [1.5, 1.5, 0.0, 0.0])
  weights = reward_set.weights
  expected = sum(weights[n] * per_fn[n].astype(np.float64) for n in per_fn)
  assert total.dtype == np.float32 and total.shape == (4,)
  assert all(v.dtype == np.float32 for v in per_fn.values())
  np.testing.assert_allclose(total, expected, rtol=1e-6)


def _base_config():
  path = pathlib.Path(__file__).parents[1] / 'agent_tunix' / 'configs' / 'base.py'
  spec = importlib.util.spec_from_file_location('base_config', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def test_reward_set_from_base_config():
  config = _base_config()
  reward_set = rewards.RewardSet.from_config(config.rewards)
  assert reward_set.names == ['format_exact', 'format_approx', 'answer',
                              'numbers']
  total, _ = reward_set(['p', 'p'], [GOOD, 'nothing'], answer=['72', '72'])
  np.testing.assert_array_equal(
      total, [0.5 * 3.0 + 0.25 * 2.0 + 3.0 + 3 * 1.5, 0.25 * -2.0])



def _exact(reasoning, answer_text):
  return f'<reasoning>{reasoning}</reasoning>\n<answer>{answer_text}</answer>'


# (case, completion, default total): the exact format with a wrong answer.
_EXACT_FORMAT_WRONG = [
    ('copied_near_number', _exact('100 - 10 = 100', '100'), 1.0),
    ('copied_other_number', _exact('100 - 10 = 10', '10'), 1.0),
    ('within_10_percent', _exact('100 - 10 = 91', '91'), 2.5),
    ('within_20_percent', _exact('100 - 10 = 80', '80'), 2.25),
    ('far_off', _exact('100 + 10 = 110 + 5', '7'), 1.0),
    ('not_a_number', _exact('100 - 10', 'ninety'), 0.5),
    # Units in the block: evaluation counts it wrong, so no reward reads the
    # 90 in it (the 270M learned to write these when `numbers` paid them).
    ('units_in_answer_block', _exact('100 - 10 = 90', '90 apples'), 0.5),
]
# (case, completion, default total): the right answer, imperfect format.
_RIGHT_IMPERFECT_FORMAT = [
    ('no_tags', '100 - 10 = 90', 4.0),
    ('no_tags_words', 'The shop sold 10, so 90 apples are left.', 4.0),
    ('answer_block_only', '<answer>90</answer>', 7.5),
    ('reasoning_then_plain', '<reasoning>100 - 10</reasoning> It is 90.',
     4.5),
    ('cut_off_answer', '<reasoning>100 - 10</reasoning><answer>90', 4.75),
    ('repeated_tags', _exact('100 - 10 = 90', '90') + '\nQuestion: Ann has '
     '3 pens and buys 2. ' + _exact('3 + 2 = 5', '5'), 7.0),
    ('padded_answer', '<answer> 90 </answer> extra', 6.0),
]


def _default_totals(completions):
  reward_set = rewards.RewardSet.from_config(_base_config().rewards)
  n = len(completions)
  total, _ = reward_set(['prompt'] * n, completions, answer=[_ANSWER] * n,
                        question=[_QUESTION] * n)
  return total


@pytest.mark.parametrize(
    'completion, expected', [c[1:] for c in _EXACT_FORMAT_WRONG],
    ids=[c[0] for c in _EXACT_FORMAT_WRONG])
def test_default_reward_exact_format_wrong_answer(completion, expected):
  assert format_rewards.is_exact_format(completion)
  assert math_rewards.guess_number(completion) != F(90)
  (total,) = _default_totals([completion])
  assert total == pytest.approx(expected)


@pytest.mark.parametrize(
    'completion, expected', [c[1:] for c in _RIGHT_IMPERFECT_FORMAT],
    ids=[c[0] for c in _RIGHT_IMPERFECT_FORMAT])
def test_default_reward_right_answer_imperfect_format(completion, expected):
  assert not format_rewards.is_exact_format(completion)
  assert math_rewards.guess_number(completion) == F(90)
  (total,) = _default_totals([completion])
  assert total == pytest.approx(expected)


@pytest.mark.parametrize('completion', [
    c[1] for c in _EXACT_FORMAT_WRONG + _RIGHT_IMPERFECT_FORMAT
    if '</answer>' in c[1]] + ['<answer>90 apples</answer>',
                               '<answer>90</answer> apples'])
def test_numbers_reward_agrees_with_evaluation_on_answer_blocks(completion):
  (score,) = math_rewards.number_match(
      ['p'], [completion], answer=['90'], question=[_QUESTION])
  assert (score > 0) == evaluation.is_correct(completion, '90'), completion


def test_default_reward_pays_for_being_right_first():
  # Every right answer, in whatever format, above every wrong answer in the
  # exact format: the rewards cannot be gamed by format alone.
  wrong = _default_totals([c[1] for c in _EXACT_FORMAT_WRONG])
  right = _default_totals([c[1] for c in _RIGHT_IMPERFECT_FORMAT])
  assert right.min() > wrong.max(), (right, wrong)
  # Right in the exact format is the best of all; format still ranks wrong
  # answers (an untagged wrong answer is below a formatted one).
  best, untagged_wrong = _default_totals(
      [_exact('100 - 10 = 90', '90'), '100 - 10 = 80'])
  assert best > right.max()
  assert untagged_wrong < wrong.min()
  # Units in the answer block (counted wrong by the evaluation, even with
  # the right number) score below a plain wrong number: otherwise writing
  # units is a safer bet than computing (the 270M default run learned it).
  units, wrong_number = _default_totals([
      _exact('100 - 10 = 90', '90 apples'), _exact('100 - 10 = 80', '80')])
  assert units < wrong_number


def test_reward_set_length_penalty():
  config = ml_collections.ConfigDict(dict(
      functions='answer=1', length_penalty=0.5, length_penalty_target=10,
      overlong_buffer=0, overlong_penalty=1.0))
  reward_set = rewards.RewardSet.from_config(config)
  assert reward_set.names == ['answer', 'length_penalty']
  total, per_fn = reward_set(['p'] * 2, [GOOD, GOOD], answer=['72', '72'],
                             completion_lengths=np.array([10, 14]))
  np.testing.assert_array_equal(per_fn['length_penalty'], [0.0, -2.0])
  np.testing.assert_array_equal(total, [3.0, 1.0])
  with pytest.raises(ValueError, match='needs the completion_lengths field'):
    reward_set(['p'], [GOOD], answer=['72'])


def test_reward_set_overlong_penalty():
  config = ml_collections.ConfigDict(dict(
      functions='answer=1', length_penalty=0.5, length_penalty_target=10,
      overlong_buffer=4, overlong_penalty=2.0))
  reward_set = rewards.RewardSet.from_config(config, max_completion_length=16)
  assert reward_set.names == ['answer', 'length_penalty', 'overlong_penalty']
  lengths = np.array([10, 12, 14, 16])
  total, per_fn = reward_set(['p'] * 4, [GOOD] * 4, answer=['72'] * 4,
                             completion_lengths=lengths)
  overlong = _overlong_reference(lengths, 16, 4, 2.0)
  np.testing.assert_allclose(per_fn['overlong_penalty'], overlong)
  np.testing.assert_array_equal(overlong, [0.0, 0.0, -1.0, -2.0])
  np.testing.assert_allclose(
      total, 3.0 - 0.5 * np.maximum(lengths - 10, 0) + overlong)
  # Off by default.
  config.overlong_buffer = 0
  assert 'overlong_penalty' not in rewards.RewardSet.from_config(config).names


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(functions='answer=1', overlong_buffer=-1),
         'overlong_buffer=-1 must be >= 0'),
        (dict(functions='answer=1', overlong_buffer=4),
         'needs the completion length limit'),
        (dict(functions='answer=1', overlong_buffer=9,
              max_completion_length=8),
         'overlong_buffer=9 is longer than the completion limit'),
        (dict(functions='answer=1', overlong_buffer=4, overlong_penalty=-1.0,
              max_completion_length=8),
         'overlong_penalty=-1.0 must be a finite number >= 0'),
        (dict(functions='answer=1', length_penalty=-0.1),
         'length_penalty=-0.1 must be a finite number >= 0'),
        (dict(functions='answer=1', length_penalty_target=-1),
         'length_penalty_target=-1 must be >= 0'),
        (dict(functions='answer=1,nope=2'), "unknown reward 'nope'"),
        (dict(functions=[]), 'at least one reward'),
        (dict(functions=[('answer', float('nan'))]), 'not a finite number'),
        (dict(functions='no_such_module_xyz:fn'), 'no module named'),
    ],
)
def test_reward_set_config_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    rewards.RewardSet(**kwargs)


def test_reward_set_checks_batch_fields():
  reward_set = rewards.RewardSet([('answer', 1.0)])
  with pytest.raises(ValueError, match='1 prompts for 2 completions'):
    reward_set(['p'], [GOOD, GOOD], answer=['72', '72'])
  with pytest.raises(ValueError, match="'answer' has 1 values for 2"):
    reward_set(['p', 'p'], [GOOD, GOOD], answer=['72'])


def test_reward_error_names_function_and_completion(user_module):
  reward_set = rewards.RewardSet(f'answer=1,{user_module}:boom_on_bad=1')
  completions = [GOOD, 'a bad completion ' + 'x' * 500, 'bad too']
  with pytest.raises(rewards.RewardError) as info:
    reward_set(['p'] * 3, completions, answer=['72'] * 3)
  error = info.value
  message = str(error)
  assert f"'{user_module}:boom_on_bad'" in message
  assert 'ZeroDivisionError: cannot score a bad comp' in message
  assert "completion 1: 'a bad completion xxx" in message
  assert '[517 chars]' in message and len(message) < 400
  assert error.fn_name == f'{user_module}:boom_on_bad'
  assert error.index == 1 and error.completion == completions[1]
  assert isinstance(error.__cause__, ZeroDivisionError)


def test_reward_error_missing_field(user_module):
  reward_set = rewards.RewardSet(f'{user_module}:needs_question=1')
  with pytest.raises(rewards.RewardError, match='needs_question.*question'):
    reward_set(['p'], [GOOD], answer=['72'])
  total, _ = reward_set(['p'], [GOOD], answer=['72'], question=['abc'])
  np.testing.assert_array_equal(total, [3.0])


@pytest.mark.parametrize(
    'fn, message',
    [
        ('batch_only_failure', 'only fails on batches.*not on any single one'),
        ('wrong_length', r'shape \(3,\) for 2 completions'),
        ('nan_on_bad', "non-finite score.*completion 1: 'bad one'"),
        ('huge', "too large for float32.*completion 0: 'good'"),
        ('words', 'not a list of numbers'),
    ],
)
def test_reward_error_bad_scores(user_module, fn, message):
  reward_set = rewards.RewardSet(f'{user_module}:{fn}=1')
  with pytest.raises(rewards.RewardError, match=message) as info:
    reward_set(['p', 'p'], ['good', 'bad one'], answer=['1', '1'])
  assert info.value.fn_name == f'{user_module}:{fn}'


# -------------------------------------------------------------------- fuzzing

_TOKENS = st.sampled_from(list(format_rewards.TAGS) + [
    '-', '+', '\u2212', ',', '.', '/', '$', '%', ' ', '\n', '0', '7', '1,000',
    '1e9', 'abc'])
_TAGGY_TEXT = st.one_of(
    st.text(),
    st.lists(st.one_of(_TOKENS, st.text(max_size=4),
                       st.integers().map(str)), max_size=30).map(''.join),
)


@_FUZZ
@hypothesis.given(text=_TAGGY_TEXT, true_answer=_TAGGY_TEXT)
def test_fuzz_never_raises(text, true_answer):
  value = math_rewards.parse_number(text)
  assert value is None or isinstance(value, F)
  assert all(isinstance(v, F) for v in math_rewards.find_numbers(text))
  math_rewards.guess_number(text)
  extracted = format_rewards.extract_answer(text)
  assert extracted is None or extracted in text
  # Every registered reward on the fields of its rows (rubric_judge asks a
  # judge: tests/judge_test.py fuzzes nothing over HTTP).
  rubric = [{'text': true_answer or 'x', 'weight': 1.0, 'category': ''}]
  for name in rewards.registered_names():
    if name == 'rubric_judge':
      continue
    (score,) = rewards.resolve(name)(
        ['p'], [text], answer=[true_answer], rubric=[rubric],
        reference=[true_answer], question=['q'])
    assert np.isfinite(score)
  assert _one(math_rewards.answer_match, text, answer=true_answer) in (
      3.0, 1.5, 0.5, 0.25, 0.0, -1.0, -1.5)
  assert -2.0 <= _one(format_rewards.format_approx, text) <= 2.0


@_FUZZ
@hypothesis.given(n=st.integers(min_value=-(10**30), max_value=10**30))
def test_fuzz_integers_round_trip(n):
  minus = '\u2212' if n < 0 else ''
  for text in (str(n), f'{n:,}', f'{minus}{abs(n)}', f'${n}', f'{n}%',
               f' {n:,}.'):
    assert math_rewards.parse_number(text) == n, text
  assert math_rewards.find_numbers(f'so {n:,} and {n}.') == [n, n]
  assert _one(math_rewards.answer_match, _tagged(f'{n:,}'),
              answer=str(n)) == (3.0 if abs(n) < 1000 else 1.5)
  assert _one(math_rewards.number_match, _tagged(f'{n:,}'),
              answer=str(n)) == 1.5


@_FUZZ
@hypothesis.given(d=st.decimals(min_value=-(10**12), max_value=10**12,
                                places=4, allow_nan=False,
                                allow_infinity=False))
def test_fuzz_decimals_round_trip(d):
  expected = F(d)
  for text in (f'{d:f}', f'{d:,f}', f'{d:.2f}'):
    want = F(decimal.Decimal(text.replace(',', '')))
    assert math_rewards.parse_number(text) == want, text
  assert math_rewards.parse_number(f'{d:f}') == expected
  assert math_rewards.find_numbers(f'x = {d:f} ok') == [expected]


@_FUZZ
@hypothesis.given(num=st.integers(min_value=-(10**9), max_value=10**9),
                  den=st.integers(min_value=1, max_value=10**9))
def test_fuzz_fractions_round_trip(num, den):
  assert math_rewards.parse_number(f'{num}/{den}') == F(num, den)
  assert math_rewards.find_numbers(f'take {num}/{den} of it') == [F(num, den)]


@_FUZZ
@hypothesis.given(
    reasoning=st.text(min_size=1).filter(
        lambda s: s.strip() and '<' not in s),
    answer=st.text(min_size=1).filter(lambda s: s.strip() and '<' not in s),
    spaces=st.lists(st.sampled_from(['', ' ', '\n', '\t']), min_size=3,
                    max_size=3),
)
def test_fuzz_exact_format_and_extraction(reasoning, answer, spaces):
  completion = (f'{spaces[0]}<reasoning>{reasoning}</reasoning>{spaces[1]}'
                f'<answer>{answer}</answer>{spaces[2]}')
  assert format_rewards.is_exact_format(completion)
  assert format_rewards.extract_answer(completion) == answer
  assert _one(format_rewards.format_approx, completion) == 2.0
  assert _one(math_rewards.answer_match, completion, answer=answer) == 3.0


# ------------------------------------------------------------- tool_steps

_SOLUTION = ('The posters cost 15 * 241 = 3615 dollars. The change is '
             '5000 - 3615 = 1385 dollars. The answer is 1385.')


def _call(expression, name='calculator', error=None):
  return {'name': name, 'arguments': {'expression': expression},
          'result': None if error else 'r', 'error': error}


@pytest.mark.parametrize('calls, expected', [
    ([_call('5000 - 15 * 241')], 1.0),
    ([_call('15 * 241'), _call('5000 - 3615')], 1.0),
    ([_call('15 * 241 + 5000')], 0.5),
    ([_call('241 * 89 - 15')], 0.0),
    ([], 0.0),
    # Failed calls, other tools and calls without an expression add nothing.
    ([_call('5000 - 15 * 241', error='timeout')], 0.0),
    ([_call('5000 - 15 * 241', name='search')], 0.0),
    ([{'name': 'calculator', 'arguments': {'x': '15 * 241'}, 'error': None}],
     0.0),
    ([_call('15 * 241 +')], 0.0),
])
def test_tool_steps_pays_the_share_of_reference_steps(calls, expected):
  score = _one(tool_steps_rewards.tool_steps, 'done', reasoning=_SOLUTION,
               tool_calls=calls)
  assert score == expected


def test_tool_steps_is_zero_without_reasoning_or_tools():
  fn = tool_steps_rewards.tool_steps
  assert _one(fn, 'x', reasoning='', tool_calls=[_call('15 * 241')]) == 0.0
  assert _one(fn, 'x', reasoning=_SOLUTION) == 0.0
  assert fn(['p'], ['x']) == [0.0]
  assert rewards.resolve('tool_steps') is fn


# ----------------------------------------------------------- call_numbers

_CALL_QUESTION = ('Mia has 125 cards. She buys 4 packs of 25 cards, then '
                  'gives 38 away. How many cards are left?')


@pytest.mark.parametrize('calls, expected', [
    ([_call('125 + 4 * 25 - 38')], 1.0),
    ([_call('125 + 4 * 25 - 900')], 0.75),
    # A worked episode's call copied from the prompt.
    ([_call('35 * 8 * 12 - 900')], 0.0),
    ([_call('4 * 25'), _call('125 + 100 - 38')], 4 / 5),
    ([_call('(125 + 4 * 25) - 38.0')], 1.0),
    ([], 0.0),
    ([_call('125 + 4 * 25 - 38', error='timeout')], 0.0),
    ([_call('125 + 4 * 25 - 38', name='search')], 0.0),
    ([{'name': 'calculator', 'arguments': {'x': '125'}, 'error': None}], 0.0),
    ([_call('125 +')], 0.0),
])
def test_call_numbers_pays_calls_built_from_the_question(calls, expected):
  score = _one(call_numbers_rewards.call_numbers, 'done',
               question=_CALL_QUESTION, tool_calls=calls)
  assert score == pytest.approx(expected)


def test_call_numbers_reads_the_question_as_written():
  numbers = call_numbers_rewards.question_numbers(
      'Pay $1,200 for 3.5 kg, then 7, 8. Page 2.')
  assert numbers == {1200, fractions.Fraction(7, 2), 7, 8, 2}
  fn = call_numbers_rewards.call_numbers
  assert fn(['p'], ['x']) == [0.0]  # No tools.
  assert _one(fn, 'x', question='Sam pays $1,200.',
              tool_calls=[_call('1200 - 1_200')]) == 1.0
  assert rewards.resolve('call_numbers') is fn


def test_tool_steps_reads_gsm8k_annotations():
  results = tool_steps_rewards.reference_results(
      'She sold 48/2 = <<48/2=24>>24 clips, then $1,200 = 1,200 more.')
  assert results == {24, 1200}


# ------------------------------------------------------------ tool_result


@pytest.mark.parametrize('completion, calls, expected', [
    ('<answer>1144</answer>', [_call('12 * 12 + 1000')], 1.0),
    # The answer edits the call's result: no credit.
    ('<answer>1200</answer>', [_call('12 * 12 + 1000')], 0.0),
    ('<answer> 1,144 </answer>', [_call('12 * 12 + 1000')], 1.0),
    ('<answer>1144 apples</answer>', [_call('12 * 12 + 1000')], 0.0),
    ('The total is 1144.', [_call('12 * 12 + 1000')], 0.0),
    # The last call that ran counts, not an earlier one.
    ('<answer>144</answer>', [_call('12 * 12'), _call('144 + 1000')], 0.0),
    ('<answer>1144</answer>', [_call('12 * 12'), _call('144 + 1000')], 1.0),
    ('<answer>144</answer>',
     [_call('12 * 12'), _call('144 + 1000', error='timeout')], 1.0),
    # Recomputed exactly: 10 / 3 is not its 12-digit rounding.
    ('<answer>3.33333333333</answer>', [_call('10 / 3')], 0.0),
    ('<answer>2.5</answer>', [_call('10 / 4')], 1.0),
    ('<answer>1144</answer>', [_call('12 * 12 + 1000', name='search')], 0.0),
    ('<answer>1144</answer>', [], 0.0),
])
def test_tool_result_pays_an_answer_that_is_the_last_result(
    completion, calls, expected):
  assert _one(tool_result_rewards.tool_result, completion,
              tool_calls=calls) == expected


def test_tool_result_is_zero_without_tools_and_is_registered():
  fn = tool_result_rewards.tool_result
  assert fn(['p'], ['<answer>4</answer>']) == [0.0]
  assert rewards.resolve('tool_result') is fn
  # In a weighted set beside the preset's rewards, an all-wrong group
  # that copied the result scores above one that edited it, and a right
  # answer above both.
  config = _base_config().rewards
  config.functions += ',tool_result=1'
  reward_set = rewards.RewardSet.from_config(config)
  done = '<reasoning>r</reasoning><answer>{}</answer>'
  total, per_fn = reward_set(
      ['p'] * 3, [done.format(1144), done.format(1200), done.format(2000)],
      answer=['2000'] * 3, question=['q'] * 3,
      tool_calls=[[_call('12 * 12 + 1000')], [_call('12 * 12 + 1000')],
                  [_call('1000 + 1000')]])
  assert list(per_fn['tool_result']) == [1.0, 0.0, 1.0]
  assert total[2] > total[0] > total[1]
