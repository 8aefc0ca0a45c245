"""Tests for agent_tunix.agent: calculator, tools, formats, executor and
environments of multi-turn tool rollouts."""

import fractions
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import hypothesis
from hypothesis import strategies as st
import pytest

from agent_tunix.agent import calculator as calc
from agent_tunix.agent import environment as env_lib
from agent_tunix.agent import executor as exec_lib
from agent_tunix.agent import formats
from agent_tunix.agent import tools as tools_lib

_REPO = pathlib.Path(__file__).resolve().parents[1]
_FUZZ = hypothesis.settings(deadline=None, database=None, max_examples=200)
# No test here may run longer than this (seconds).
_TEST_LIMIT_S = 30

GEMMA3 = formats.get('gemma3')
FUNCTIONGEMMA = formats.get('functiongemma')
GEMMA4 = formats.get('gemma4')
CALCULATOR = tools_lib.BUILTINS['calculator']


@pytest.fixture(autouse=True)
def _time_limit():
  """Fails a test that runs past _TEST_LIMIT_S instead of hanging."""

  def expire(signum, frame):
    del signum, frame
    raise TimeoutError(f'test ran longer than {_TEST_LIMIT_S} s')

  previous = signal.signal(signal.SIGALRM, expire)
  signal.alarm(_TEST_LIMIT_S)
  yield
  signal.alarm(0)
  signal.signal(signal.SIGALRM, previous)


# ----------------------------------------------------------------- calculator


@pytest.mark.parametrize('expression, expected', [
    ('286*12', '3432'),
    ('286 * 12', '3432'),
    ('0.1+0.2', '0.3'),
    ('7/2', '3.5'),
    ('1/3', '0.333333333333'),
    ('2/3', '0.666666666667'),
    ('10/3', '3.33333333333'),
    ('10**20/3', '33333333333333333333.3'),
    ('0.000001/3', '0.000000333333333333'),
    ('-1/8', '-0.125'),
    ('2+3*4', '14'),
    ('(2+3)*4', '20'),
    ('2*3**2', '18'),
    ('-7', '-7'),
    ('-(3-10)', '7'),
    ('--3', '3'),
    ('+5', '5'),
    ('-2**2', '-4'),
    ('(-2)**3', '-8'),
    ('2**10', '1024'),
    ('2**-2', '0.25'),
    ('2**2**3', '256'),
    ('0**0', '1'),
    ('7//2', '3'),
    ('-7//2', '-4'),
    ('7%3', '1'),
    ('-7%3', '2'),
    ('7.5%2', '1.5'),
    ('1e3/8', '125'),
    ('.5+5.', '5.5'),
    ('3 × 4 ÷ 8', '1.5'),
    ('5 − 7', '-2'),
    ('  ( 1 )  ', '1'),
    ('9' * 29, '9' * 29),
])
def test_calculator_results(expression, expected):
  assert calc.calculator(expression) == expected


@pytest.mark.parametrize('expression, steps', [
    ('5000 - 15 * 241', [3615, 1385]),
    ('(2 + 3) * 4', [5, 20]),
    ('2 ** 3 - 4 / 8', [8, fractions.Fraction(1, 2), fractions.Fraction(15, 2)]),
    ('-7 % 3', [2]),
    ('42', []),
])
def test_calculator_step_values_in_evaluation_order(expression, steps):
  assert calc.step_values(expression) == steps


def test_calculator_step_values_refuses_like_evaluate():
  for bad in ('1/0', '2**65', 'x + 1', '__import__("os")'):
    with pytest.raises(calc.CalculatorError):
      calc.step_values(bad)


@pytest.mark.parametrize('expression, message', [
    ('1/0', 'division by zero'),
    ('5//0', 'division by zero'),
    ('5%0', 'modulo by zero'),
    ('0**-1', 'division by zero'),
    ('2**0.5', 'whole number'),
    ('2**(1/2)', 'whole number'),
    ('2**65', 'exponent 65 too large'),
    ('2**-65', 'exponent -65 too large'),
    ('9**64', 'too large'),
    ('9**64**64', 'result too large'),
    ('10**30', 'too large'),
    ('10**29*10', 'too large'),
    ('-(10**29)*10', 'too large'),
    ('1' * 31, 'too large'),
    ('1e31', 'too large'),
    ('1e99999999', 'out of range'),
    ('1e-99999999', 'out of range'),
    ('0.1**40', 'too small'),
    ('1/10**29/10**29', 'too small'),
    ('1' * (calc.MAX_INPUT_CHARS + 1), 'too long'),
    ('', 'empty'),
    ('   ', 'empty'),
    ('1+', 'not a valid arithmetic expression'),
    ('(1', 'not a valid arithmetic expression'),
    ('286*12=', 'not a valid arithmetic expression'),
    ('x+1', 'names are not allowed'),
    ('pi', 'names are not allowed'),
    ('abs(-1)', 'function calls are not allowed'),
    ('(1).real', 'attributes are not allowed'),
    ('"1"+"2"', 'str literals are not allowed'),
    ("b'1'", 'bytes literals are not allowed'),
    ('lambda: 1', 'lambda is not allowed'),
    ('1<2', 'comparisons are not allowed'),
    ('1 and 2', "'and'/'or' are not allowed"),
    ('not 1', "'not' is not allowed"),
    ('~1', "'~' is not allowed"),
    ('True+1', 'True is not allowed'),
    ('None', 'None is not allowed'),
    ('1j', 'complex numbers are not allowed'),
    ('[1][0]', 'indexing is not allowed'),
    ('[1, 2]', 'List is not allowed'),
    ('1,000', 'commas are not allowed'),
    ('2^3', 'use ** for powers'),
    ('1<<3', 'operator LShift is not allowed'),
    ('1 if 1 else 2', 'IfExp is not allowed'),
    ('(x:=1)', 'NamedExpr is not allowed'),
    ('[x for x in (1,)]', 'ListComp is not allowed'),
])
def test_calculator_refuses(expression, message):
  with pytest.raises(calc.CalculatorError, match=_escape(message)):
    calc.calculator(expression)


def _escape(text):
  return re.escape(text)


def test_calculator_error_is_a_value_error():
  assert issubclass(calc.CalculatorError, ValueError)
  with pytest.raises(calc.CalculatorError, match='must be text'):
    calc.calculator(5)


def test_calculator_runs_nothing_it_reads(tmp_path):
  marker = tmp_path / 'ran'
  for expression in [
      f'__import__("os").system("touch {marker}")',
      f'open("{marker}", "w")',
      f'(lambda: open("{marker}", "w"))()',
  ]:
    with pytest.raises(calc.CalculatorError):
      calc.calculator(expression)
  assert not marker.exists()


def test_calculator_caps_are_fast():
  started = time.monotonic()
  for expression in ['9**64**64', '(10**29)**64', '(1/3)**64', '1e40**64',
                     '((((2**64)**64)**64)**64)', '(' * 90 + '1' + ')' * 90]:
    try:
      calc.calculator(expression)
    except calc.CalculatorError:
      pass
  assert time.monotonic() - started < 1.0


@_FUZZ
@hypothesis.given(st.text(alphabet='0123456789.+-*/%() eE^,x', max_size=40))
def test_calculator_only_ever_raises_calculator_error(expression):
  try:
    result = calc.calculator(expression)
  except calc.CalculatorError:
    return
  assert 'e' not in result.lower()  # Never scientific notation.


@pytest.mark.parametrize('numerator, denominator, expected', [
    (3, 1, '3'),
    (-7, 1, '-7'),
    (1, 8, '0.125'),
    (-5, 2, '-2.5'),
    (1, 3, '0.333333333333'),
    (-1, 3, '-0.333333333333'),
    (1, 7 * 10**6, '0.000000142857142857'),
    (10**12 + 1, 3, '333333333333.7'),
])
def test_format_number(numerator, denominator, expected):
  assert calc.format_number(calc.Fraction(numerator, denominator)) == expected


# ---------------------------------------------------------------------- tools


def _lookup(city: str, year: int = 2024, scale: float = 1.0,
            exact: bool = False) -> str:
  """Returns the population of a city.

  More detail that is not part of the description.

  Args:
    city: The city's English name,
      possibly with its country.
    year: The census year.
    scale: A factor.
    exact (bool): Whether to round.

  Returns:
    The population.
  """
  return f'{city} {year} {scale} {exact}'


def test_from_callable_reads_signature_and_docstring():
  tool = tools_lib.from_callable(_lookup)
  assert tool.name == '_lookup'
  assert tool.description == 'Returns the population of a city.'
  assert tool.parameters == (
      tools_lib.Parameter('city', str, True,
                          "The city's English name, possibly with its "
                          'country.'),
      tools_lib.Parameter('year', int, False, 'The census year.'),
      tools_lib.Parameter('scale', float, False, 'A factor.'),
      tools_lib.Parameter('exact', bool, False, 'Whether to round.'),
  )
  assert tool.fn is _lookup
  assert tools_lib.from_callable(_lookup, name='lookup').name == 'lookup'


def test_builtin_calculator_tool():
  assert CALCULATOR.name == 'calculator'
  assert CALCULATOR.description == 'Evaluates an arithmetic expression exactly.'
  (parameter,) = CALCULATOR.parameters
  assert (parameter.name, parameter.type, parameter.required) == (
      'expression', str, True)
  assert parameter.description.startswith('Numbers with + - * / // % **')


def _no_annotation(x):
  """Does something."""
  return x


def _list_annotation(x: list) -> str:
  """Does something."""
  return str(x)


def _star_args(*args: int) -> str:
  """Does something."""
  return str(args)


def _no_docstring(x: int) -> str:
  return str(x)


@pytest.mark.parametrize('fn, message', [
    (_no_annotation, "_no_annotation, parameter 'x' has no type annotation"),
    (_list_annotation, "_list_annotation, parameter 'x' is annotated "
                       "<class 'list'>"),
    (_star_args, "_star_args, parameter 'args': *args and **kwargs"),
    (_no_docstring, '_no_docstring has no docstring'),
    (len, 'positional-only'),
    (42, 'is not callable'),
])
def test_from_callable_refuses(fn, message):
  with pytest.raises(tools_lib.ToolConfigError, match=_escape(message)):
    tools_lib.from_callable(fn)


def test_from_callable_refuses_a_name_that_is_not_an_identifier():
  with pytest.raises(tools_lib.ToolConfigError, match='not a Python identi'):
    tools_lib.from_callable(_lookup, name='look-up')


@pytest.fixture(name='user_module')
def _user_module(tmp_path, monkeypatch):
  """A module of user tools on sys.path, under a unique name."""
  name = f'agent_test_tools_{uuid.uuid4().hex[:8]}'
  (tmp_path / f'{name}.py').write_text(textwrap.dedent('''
      RATE = 3


      def lookup(city: str, year: int = 2024) -> str:
        """Returns the population of a city.

        Args:
          city: The city.
          year: The year.
        """
        return f'{city}:{year}'


      def calculator(expression: str) -> str:
        """Another calculator."""
        return expression


      def untyped(city):
        """No annotation."""
        return city
  '''))
  (tmp_path / f'{name}_broken.py').write_text('raise RuntimeError("boom")\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  yield name
  for module in (name, f'{name}_broken'):
    sys.modules.pop(module, None)


def test_resolve_builtins_and_user_functions(user_module):
  assert tools_lib.resolve('') == ()
  assert tools_lib.resolve(' calculator ') == (CALCULATOR,)
  tools = tools_lib.resolve(f'calculator, {user_module}:lookup')
  assert [t.name for t in tools] == ['calculator', 'lookup']
  assert tools[1].fn(city='Paris') == 'Paris:2024'
  assert tools[1].parameters[0] == tools_lib.Parameter(
      'city', str, True, 'The city.')


@pytest.mark.parametrize('spec, message', [
    ('nope', "agent.tools: unknown tool 'nope'. Built-in tools: calculator; "
             'for your own function write "package.module:function".'),
    ('calculator,', "agent.tools: entry 2 of 'calculator,' is empty; remove "
                    'the extra comma.'),
    (',calculator', "agent.tools: entry 1 of ',calculator' is empty"),
    ('calculator,calculator', "agent.tools: 'calculator' is a second tool "
                              "named 'calculator'"),
    ('no_such_pkg_xyz.tools:lookup',
     "agent.tools: cannot import 'no_such_pkg_xyz.tools' for "
     "'no_such_pkg_xyz.tools:lookup' (ModuleNotFoundError: No module named "
     "'no_such_pkg_xyz'). Check the module path, or that its package is "
     'installed.'),
    ('{m}_broken:f', "agent.tools: cannot import '{m}_broken' for "
                     "'{m}_broken:f' (RuntimeError: boom)."),
    ('{m}:missing', "agent.tools: module '{m}' has no attribute 'missing' "
                    "(from '{m}:missing'). Check the function name after "
                    'the colon.'),
    ('{m}:RATE', "agent.tools: '{m}:RATE' is a int, not a function."),
    ('{m}:untyped', "agent.tools: '{m}:untyped': untyped, parameter 'city' "
                    'has no type annotation'),
    ('calculator,{m}:calculator', "agent.tools: '{m}:calculator' is a second "
                                  "tool named 'calculator' (the first came "
                                  "from 'calculator')"),
    ('a b:c', "agent.tools: 'a b:c' is not of the form "
              '"package.module:function".'),
])
def test_resolve_refuses_with_one_message(user_module, spec, message):
  spec = spec.format(m=user_module)
  message = message.format(m=user_module)
  with pytest.raises(tools_lib.ToolConfigError) as raised:
    tools_lib.resolve(spec)
  assert str(raised.value).startswith(message), str(raised.value)


_LOOKUP = tools_lib.from_callable(_lookup, name='lookup')


@pytest.mark.parametrize('arguments, expected', [
    ({'city': 'Oslo'}, {'city': 'Oslo'}),
    ({'city': 'Oslo', 'year': 2000, 'scale': 2, 'exact': True},
     {'city': 'Oslo', 'year': 2000, 'scale': 2.0, 'exact': True}),
    ({'city': 'Oslo', 'scale': 0.5}, {'city': 'Oslo', 'scale': 0.5}),
])
def test_check_arguments_accepts(arguments, expected):
  checked = tools_lib.check_arguments(_LOOKUP, arguments)
  assert checked == expected
  assert [type(v) for v in checked.values()] == [
      type(v) for v in expected.values()]


@pytest.mark.parametrize('arguments, message', [
    ({}, "lookup needs 'city', e.g. lookup(city='...')"),
    ({'year': 1}, "lookup needs 'city'"),
    ({'city': 'Oslo', 'town': 'x'},
     "lookup has no parameter 'town' (its parameters: city, year, scale, "
     'exact)'),
    ({'city': 5}, "lookup: 'city' must be a string, got an integer"),
    ({'city': 'Oslo', 'year': True},
     "lookup: 'year' must be an integer, got true or false"),
    ({'city': 'Oslo', 'year': 2000.0},
     "lookup: 'year' must be an integer, got a number"),
    ({'city': 'Oslo', 'scale': False}, "lookup: 'scale' must be a number"),
    ({'city': 'Oslo', 'exact': 1}, "lookup: 'exact' must be true or false"),
    ({'city': ['a']}, "lookup: 'city' must be a string, got a list"),
    ('city=Oslo', 'lookup takes keyword arguments'),
])
def test_check_arguments_refuses(arguments, message):
  with pytest.raises(tools_lib.ToolArgumentError) as raised:
    tools_lib.check_arguments(_LOOKUP, arguments)
  assert str(raised.value).startswith(message), str(raised.value)


# -------------------------------------------------------------------- formats


def _calls(*pairs):
  return [(c.name, c.arguments) for c in pairs]


@pytest.mark.parametrize('text, expected', [
    ('[calculator(expression="286 * 12")]',
     [('calculator', {'expression': '286 * 12'})]),
    ('I need 286 times 12.\n[calculator(expression="286 * 12")]',
     [('calculator', {'expression': '286 * 12'})]),
    ('[calculator(expression="1+1"), calculator(expression="2*3")]  \n',
     [('calculator', {'expression': '1+1'}),
      ('calculator', {'expression': '2*3'})]),
    ('[ lookup (city=\'Oslo\', year=-2, scale=1.5, exact=True) ]',
     [('lookup', {'city': 'Oslo', 'year': -2, 'scale': 1.5, 'exact': True})]),
    ('[f(a=[1, "x", None], b={"k": [2.5]}, c=(1, 2))]',
     [('f', {'a': [1, 'x', None], 'b': {'k': [2.5]}, 'c': [1, 2]})]),
    ('[f()]', [('f', {})]),
    ('[calculator(expression="1")]<end_of_turn>',
     [('calculator', {'expression': '1'})]),
    ('Sure.\n```tool_code\n[calculator(expression="3")]\n```',
     [('calculator', {'expression': '3'})]),
    ('See [1] and [note(x=1) earlier.\n[calculator(expression="a[0]")]',
     [('calculator', {'expression': 'a[0]'})]),
    ('[calculator(expression="[f(x=1)]")]',
     [('calculator', {'expression': '[f(x=1)]'})]),
    # No call: a final answer.
    ('The answer is 3432.', None),
    ('', None),
    ('The list is [1, 2]', None),
    ('I called [calculator(expression="1")] and got 1. The answer is 1.',
     None),
    ('calculator(expression="1")', None),
])
def test_gemma3_parse(text, expected):
  calls = GEMMA3.parse(text)
  assert (None if calls is None else _calls(*calls)) == expected


def test_gemma3_parse_keeps_each_call_source():
  (first, second) = GEMMA3.parse(
      'ok [calculator(expression="1"), f(x=[1, 2])]')
  assert first.source == 'calculator(expression="1")'
  assert second.source == 'f(x=[1, 2])'


@pytest.mark.parametrize('text, message', [
    ('[calculator("1+1")]', 'calculator: use keyword arguments'),
    ('[calculator(expression=x)]',
     "calculator: the value of 'expression' must be a literal"),
    ('[calculator(expression=1+1)]', "the value of 'expression' must be a"),
    ('[calculator(expression=open("f"))]', "the value of 'expression'"),
    ('[calculator(expression=f"{x}")]', "the value of 'expression'"),
    ('[calculator(expression={1, 2})]', "the value of 'expression'"),
    ('[calculator(expression="1"]', 'the call list is not valid'),
    ('[calculator(expression="1")', None),  # No closing ']': not a call.
    ('[calculator(expression="1"))]', 'the call list is not valid'),
    ('[math.sqrt(x=2)]', "call the tool by its plain name, not 'math.sqrt'"),
    ('[calculator(expression="1"), 5]', 'every item of the call list must'),
    ('[calculator(**{"expression": "1"})]', 'calculator: **arguments are'),
    ('[calculator(expression="1", expression="2")]',
     "calculator: 'expression' is given twice"),
    ('[calc(x=1)][0]', 'end the turn with a list of calls'),
])
def test_gemma3_parse_refuses_malformed_calls(text, message):
  if message is None:
    assert GEMMA3.parse(text) is None
    return
  with pytest.raises(formats.ToolParseError, match=_escape(message)):
    GEMMA3.parse(text)


def test_gemma3_parse_runs_nothing(tmp_path):
  marker = tmp_path / 'ran'
  text = (f'[calculator(expression=__import__("os").system('
          f'"touch {marker}"))]')
  with pytest.raises(formats.ToolParseError):
    GEMMA3.parse(text)
  assert not marker.exists()


@_FUZZ
@hypothesis.given(st.text(alphabet='[](){}=,"\'abc1 .*\n', max_size=60))
def test_gemma3_parse_only_ever_raises_tool_parse_error(text):
  try:
    GEMMA3.parse(text)
  except formats.ToolParseError:
    pass


def test_gemma3_render_calls_round_trips():
  calls = [formats.Call('calculator', {'expression': 'say "hi"\n'}),
           formats.Call('f', {'a': [1, 2.5, None, True], 'b': {'k': 'v'}})]
  text = GEMMA3.render_calls(calls, reasoning='Thinking.')
  assert text.startswith('Thinking.\n[calculator(expression="say \\"hi\\"')
  assert _calls(*GEMMA3.parse(text)) == _calls(*calls)


def test_gemma3_render_results():
  one = GEMMA3.render_results([formats.Result('calculator', '3432')])
  assert one == ('\n<start_of_turn>user\n<tool_response>\n3432\n'
                 '</tool_response><end_of_turn>\n<start_of_turn>model\n')
  two = GEMMA3.render_results([
      formats.Result('calculator', '3432'),
      exec_lib.CallResult('lookup', {}, 'error: boom', 'exception'),
  ])
  assert two == ('\n<start_of_turn>user\n<tool_response>\n'
                 'calculator: 3432\nlookup: error: boom\n'
                 '</tool_response><end_of_turn>\n<start_of_turn>model\n')
  with pytest.raises(ValueError):
    GEMMA3.render_results([])


def test_gemma3_instructions():
  text = GEMMA3.instructions([CALCULATOR, _LOOKUP])
  assert '[calculator(expression="...")]' in text
  assert 'calculator(expression: str): Evaluates an arithmetic' in text
  assert ('lookup(city: str, year: int (optional), scale: float (optional), '
          'exact: bool (optional)): Returns the population of a city.') in text
  assert "  city: The city's English name, possibly with its country." in text
  assert '<tool_response>' in text
  example = formats.Call('calculator', {'expression': '286 * 12'})
  assert '[calculator(expression="286 * 12")]' in GEMMA3.instructions(
      [CALCULATOR], example)
  with pytest.raises(ValueError):
    GEMMA3.instructions([])


def test_gemma3_example_turns():
  text = GEMMA3.example_turns(
      [('calculator', {'expression': '286 * 12'})], ['3432'],
      'The answer is 3432.', reasoning='I multiply.')
  assert text == (
      'I multiply.\n[calculator(expression="286 * 12")]<end_of_turn>\n'
      '<start_of_turn>user\n<tool_response>\n3432\n</tool_response>'
      '<end_of_turn>\n<start_of_turn>model\nThe answer is 3432.')
  with pytest.raises(ValueError):
    GEMMA3.example_turns([], [], 'x')


def test_format_attributes():
  assert formats.get('gemma3') is GEMMA3
  assert GEMMA3.stop_pieces == ('<end_of_turn>',)
  assert FUNCTIONGEMMA.stop_pieces == ('<start_function_response>',)
  assert set(GEMMA3.required_pieces) == {'<start_of_turn>', '<end_of_turn>'}
  assert {'<start_function_call>', '<end_function_call>',
          '<start_function_response>', '<end_function_response>',
          '<escape>'} <= set(FUNCTIONGEMMA.required_pieces)
  assert sorted(formats.FORMATS) == ['functiongemma', 'gemma3', 'gemma4']
  with pytest.raises(ValueError, match='functiongemma, gemma3, gemma4'):
    formats.get('gemma5')
  # Gemma 4: its own turns, a system role, the row stops at <|tool_response>.
  assert GEMMA4.stop_pieces == ('<|tool_response>',) == (GEMMA4.call_end,)
  assert (GEMMA4.turn_start, GEMMA4.turn_end, GEMMA4.system_role) == (
      '<|turn>', '<turn|>', 'system')
  assert {'<|turn>', '<turn|>', '<|tool_call>', '<tool_call|>',
          '<|tool_response>', '<tool_response|>', '<|tool>', '<tool|>',
          '<|"|>'} == set(GEMMA4.required_pieces)
  assert (GEMMA3.turn_start, FUNCTIONGEMMA.turn_start) == (
      '<start_of_turn>', '<start_of_turn>')


_FG_CALL = ('<start_function_call>call:calculator{expression:<escape>'
            '286 * 12<escape>}<end_function_call>')


@pytest.mark.parametrize('text, expected', [
    (_FG_CALL, [('calculator', {'expression': '286 * 12'})]),
    (_FG_CALL + '<start_function_response>',
     [('calculator', {'expression': '286 * 12'})]),
    ('Let me compute. ' + _FG_CALL + _FG_CALL.replace('286', '3'),
     [('calculator', {'expression': '286 * 12'}),
      ('calculator', {'expression': '3 * 12'})]),
    ('<start_function_call>call:f{n:5,x:-1.5,b:true,z:null,l:[1,<escape>a'
     '<escape>],d:{k:<escape>v, w<escape>}}<end_function_call>',
     [('f', {'n': 5, 'x': -1.5, 'b': True, 'z': None, 'l': [1, 'a'],
             'd': {'k': 'v, w'}})]),
    ('<start_function_call>call:f{}<end_function_call>', [('f', {})]),
    ('The answer is 5.', None),
    (_FG_CALL + ' so the answer is 3432.', None),
])
def test_functiongemma_parse(text, expected):
  calls = FUNCTIONGEMMA.parse(text)
  assert (None if calls is None else _calls(*calls)) == expected


@pytest.mark.parametrize('text, message', [
    ('<start_function_call>call:calculator{expression:<escape>1',
     'unfinished call'),
    ('<start_function_call>call:f{a:foo}<end_function_call>',
     'write each value as an escaped string'),
    ('<start_function_call>call:f{a:<escape>x}<end_function_call>',
     'unclosed string'),
    ('<start_function_call>f{a:1}<end_function_call>', 'write a call as'),
    ('<start_function_call>call:f{a:<escape>x<escape><end_function_call>',
     "separate arguments with ','"),
    ('<start_function_call>call:f{a:<escape>x<escape> b:1}'
     '<end_function_call>', "separate arguments with ','"),
    ('<start_function_call>call:f{a:1,a:2}<end_function_call>',
     "'a' is given twice"),
    ('<start_function_call>call:f{a:[1 2]}<end_function_call>',
     'write each value as'),
    ('<start_function_call>call:f{a:[<escape>x<escape> 2]}'
     '<end_function_call>', "separate list items with ','"),
    ('<start_function_call>call:f(a=1)<end_function_call>',
     'write the arguments as'),
    ('<start_function_call>call:f{a:1} x<end_function_call>',
     'unexpected text after'),
    ('<start_function_call>call:f{a:' + '[' * 40 + '1' + ']' * 40
     + '}<end_function_call>', 'nested too deeply'),
])
def test_functiongemma_parse_refuses_malformed_calls(text, message):
  with pytest.raises(formats.ToolParseError, match=_escape(message)) as e:
    FUNCTIONGEMMA.parse(text)
  assert '<' not in str(e.value)  # No control token in a model-facing text.


def test_functiongemma_render():
  calls = [formats.Call('calculator', {'expression': '1+1', 'n': 5,
                                       'x': [1.5, True, None]})]
  text = FUNCTIONGEMMA.render_calls(calls)
  assert text == ('<start_function_call>call:calculator{expression:<escape>'
                  '1+1<escape>,n:5,x:[1.5,true,null]}<end_function_call>')
  assert _calls(*FUNCTIONGEMMA.parse(text)) == _calls(*calls)
  assert FUNCTIONGEMMA.render_results(
      [formats.Result('calculator', '2')]) == (
          'response:calculator{value:<escape>2<escape>}'
          '<end_function_response>')
  assert FUNCTIONGEMMA.render_results(
      [formats.Result('a', '1'), formats.Result(None, 'error: x')]) == (
          'response:a{value:<escape>1<escape>}<end_function_response>'
          '<start_function_response>response:error{value:<escape>error: x'
          '<escape>}<end_function_response>')
  example = FUNCTIONGEMMA.example_turns(
      [('calculator', {'expression': '1+1'})], ['2'], 'It is 2.')
  assert example == (
      '<start_function_call>call:calculator{expression:<escape>1+1<escape>}'
      '<end_function_call><start_function_response>response:calculator'
      '{value:<escape>2<escape>}<end_function_response>It is 2.')
  instructions = FUNCTIONGEMMA.instructions([CALCULATOR])
  assert instructions.startswith(
      'You are a model that can do function calling with the following '
      'functions<start_function_declaration>declaration:calculator'
      '{description:<escape>Evaluates an arithmetic expression exactly.'
      '<escape>,parameters:{properties:{expression:{description:<escape>')
  assert instructions.endswith(
      'type:<escape>STRING<escape>}},required:[<escape>expression<escape>],'
      'type:<escape>OBJECT<escape>}}<end_function_declaration>')


_G4_CALL = ('<|tool_call>call:calculator{expression:<|"|>286 * 12<|"|>}'
            '<tool_call|>')


def test_gemma4_parse_render_and_instructions():
  assert _calls(*GEMMA4.parse(_G4_CALL)) == [
      ('calculator', {'expression': '286 * 12'})]
  assert _calls(*GEMMA4.parse(_G4_CALL + '<|tool_response>')) == [
      ('calculator', {'expression': '286 * 12'})]
  assert GEMMA4.parse('The answer is 5.') is None
  assert GEMMA4.parse(_G4_CALL + ' so it is 3432.') is None
  # FunctionGemma's escape is plain text here, not a string delimiter.
  with pytest.raises(formats.ToolParseError, match='escaped string'):
    GEMMA4.parse('<|tool_call>call:f{a:<escape>x<escape>}<tool_call|>')
  with pytest.raises(formats.ToolParseError, match='unfinished call'):
    GEMMA4.parse('<|tool_call>call:calculator{expression:<|"|>1')
  calls = [formats.Call('calculator', {'expression': '1+1', 'n': 5})]
  text = GEMMA4.render_calls(calls)
  assert text == ('<|tool_call>call:calculator{expression:<|"|>1+1<|"|>,'
                  'n:5}<tool_call|>')
  assert _calls(*GEMMA4.parse(text)) == _calls(*calls)
  assert GEMMA4.render_results(
      [formats.Result('a', '1'), formats.Result(None, 'error: x')]) == (
          'response:a{value:<|"|>1<|"|>}<tool_response|><|tool_response>'
          'response:error{value:<|"|>error: x<|"|>}<tool_response|>')
  assert GEMMA4.example_turns(
      [('calculator', {'expression': '1+1'})], ['2'], 'It is 2.') == (
          '<|tool_call>call:calculator{expression:<|"|>1+1<|"|>}<tool_call|>'
          '<|tool_response>response:calculator{value:<|"|>2<|"|>}'
          '<tool_response|>It is 2.')
  instructions = GEMMA4.instructions([CALCULATOR])
  assert instructions.startswith(
      '<|tool>declaration:calculator{description:<|"|>Evaluates an '
      'arithmetic expression exactly.<|"|>,parameters:{properties:'
      '{expression:{description:<|"|>')
  assert instructions.endswith(
      'required:[<|"|>expression<|"|>],type:<|"|>OBJECT<|"|>}}<tool|>')


def _multiply(price: float, count: int, Label: str = 'total') -> str:  # pylint: disable=invalid-name
  """Multiplies a count by a price.

  Args:
    price: Price of one.
    count: How many.
  """
  return f'{Label}: {count * price}'


def _today() -> str:
  """Today's date."""
  return '2026-11-26'


def test_gemma4_writes_keys_as_its_chat_template_does():
  """Parameters and arguments sorted ignoring case, the required list in
  declared order, an empty description, required list or properties left
  out: the strings Gemma 4's chat template renders for the same
  declarations and call (checked by tests/side/gemma4_vocab_check.py)."""
  tool = tools_lib.from_callable(_multiply, name='multiply')
  today = tools_lib.from_callable(_today, name='today')
  assert GEMMA4.instructions([tool, today]) == (
      '<|tool>declaration:multiply{description:<|"|>Multiplies a count by a '
      'price.<|"|>,parameters:{properties:{count:{description:<|"|>How '
      'many.<|"|>,type:<|"|>INTEGER<|"|>},Label:{type:<|"|>STRING<|"|>},'
      'price:{description:<|"|>Price of one.<|"|>,type:<|"|>NUMBER<|"|>}},'
      'required:[<|"|>price<|"|>,<|"|>count<|"|>],type:<|"|>OBJECT<|"|>}}'
      '<tool|><|tool>declaration:today{description:<|"|>Today\'s date.<|"|>,'
      'parameters:{type:<|"|>OBJECT<|"|>}}<tool|>')
  optional = tools_lib.Tool(
      name='f', description='D.', fn=lambda x=1: x, parameters=(
          tools_lib.Parameter(name='x', type=int, required=False,
                              description=''),))
  assert GEMMA4.instructions([optional]) == (
      '<|tool>declaration:f{description:<|"|>D.<|"|>,parameters:{properties:'
      '{x:{type:<|"|>INTEGER<|"|>}},type:<|"|>OBJECT<|"|>}}<tool|>')
  call = formats.Call('multiply', {'price': 0.5, 'count': 7, 'Label': 'x'})
  assert GEMMA4.render_calls([call]) == (
      '<|tool_call>call:multiply{count:7,Label:<|"|>x<|"|>,price:0.5}'
      '<tool_call|>')
  # FunctionGemma keeps the declared order and writes every field.
  functiongemma = formats.get('functiongemma')
  assert functiongemma.instructions([optional]).endswith(
      '{x:{description:<escape><escape>,type:<escape>INTEGER<escape>}},'
      'required:[],type:<escape>OBJECT<escape>}}<end_function_declaration>')
  assert functiongemma.instructions([today]).endswith(
      'parameters:{properties:{},required:[],type:<escape>OBJECT<escape>}}'
      '<end_function_declaration>')
  assert functiongemma.render_calls([call]) == (
      '<start_function_call>call:multiply{price:0.5,count:7,'
      'Label:<escape>x<escape>}<end_function_call>')


def test_environment_with_gemma4(make_env):
  env = make_env(fmt=GEMMA4)
  assert env.ends_turn(_G4_CALL) == '<|tool_response>'
  reply = env.step(_G4_CALL)
  assert reply.text == ('response:calculator{value:<|"|>3432<|"|>}'
                        '<tool_response|>')
  assert env.step('The answer is 3432.').finish == 'answer'


@pytest.mark.parametrize('text, expected, count', [
    ('plain text', 'plain text', 0),
    ('a<turn|>\n<|turn>user\nb', 'a\nuser\nb', 2),
    ('<|tool_call>call:f{}<tool_call|><|tool_response><tool_response|>'
     '<|tool><tool|><|"|>', 'call:f{}', 7),
    ('<|think|><|channel>thought<channel|><|image><|image|><image|>'
     '<|audio><|audio|><audio|><|video|>', 'thought', 10),
    ('a<end_of_turn>\n<start_of_turn>user\nb', 'a\nuser\nb', 2),
    ('<bos><eos><pad><unk><mask>[multimodal]', '', 6),
    ('<start_of_image><image_soft_token><end_of_image>', '', 3),
    ('x<start_function_call>call:f{}<end_function_call>', 'xcall:f{}', 2),
    ('<start_function_declaration><end_function_declaration>'
     '<start_function_response><end_function_response><escape>', '', 5),
    ('</tool_response><tool_response>', '', 2),
    ('<unused0><unused98>ok<unused>', 'ok<unused>', 2),
    ('<start_of<eos>_turn>', '', 2),
    ('<<escape>eos<escape>>', '', 3),
])
def test_sanitize(text, expected, count):
  assert formats.sanitize(text) == (expected, count)
  assert GEMMA3.sanitize(text) == (expected, count)


@_FUZZ
@hypothesis.given(st.lists(st.sampled_from(
    ['<', '>', 'eos', 'start_of_turn', '_', 'unused', '7', 'x', '<eos>',
     '<end_of_turn>']), max_size=30))
def test_sanitize_leaves_no_marker(pieces):
  text, _ = formats.sanitize(''.join(pieces))
  assert formats.sanitize(text) == (text, 0)


# ------------------------------------------------------------------- executor


def _echo(text: str) -> str:
  """Returns the text."""
  return text


def _fail(message: str) -> str:
  """Raises."""
  raise ValueError('\n'.join(['first line', message]))


def _exit(code: int) -> str:
  """Exits."""
  sys.exit(code)


def _big(n: int) -> str:
  """Returns n characters."""
  return 'a' * (n // 2) + 'b' * (n - n // 2)


_RELEASE = threading.Event()


def _hang(seconds: float) -> str:
  """Waits until released (or for `seconds`)."""
  _RELEASE.wait(seconds)
  return 'released'


_BARRIER = threading.Barrier(2, timeout=5)


def _meet(name: str) -> str:
  """Returns only when two calls run at once."""
  _BARRIER.wait()
  return name


_TOOLS = tuple(tools_lib.from_callable(f, name=f.__name__.lstrip('_'))
               for f in (_echo, _fail, _exit, _big, _hang, _meet))


@pytest.fixture(name='executor')
def _executor():
  _RELEASE.clear()
  _BARRIER.reset()
  executor = exec_lib.Executor(_TOOLS + (CALCULATOR,), timeout_s=0.2,
                               max_output_chars=100, max_abandoned=2)
  yield executor
  _RELEASE.set()  # Lets abandoned threads end.
  executor.close()


def _call(tool_name, /, **arguments):
  return formats.Call(tool_name, arguments)


@pytest.mark.parametrize('call, text, error', [
    (_call('echo', text='hi'), 'hi', None),
    (_call('calculator', expression='286*12'), '3432', None),
    (_call('calculator', expression='1/0'),
     'error: CalculatorError: division by zero', 'exception'),
    (_call('fail', message='last line'), 'error: ValueError: last line',
     'exception'),
    (_call('exit', code=3), 'error: SystemExit: 3', 'exception'),
    (_call('nope', x=1), "error: unknown tool 'nope' (tools: big, calculator, "
                         'echo, exit, fail, hang, meet)', 'unknown_tool'),
    (_call('echo'), "error: echo needs 'text', e.g. echo(text='...')",
     'arguments'),
    (_call('echo', text=5), "error: echo: 'text' must be a string, got an "
                            'integer', 'arguments'),
    (_call('echo', text='a<end_of_turn><start_of_turn>b'), 'ab', None),
])
def test_executor_results(executor, call, text, error):
  (result,) = executor.run([call])
  assert (result.name, result.arguments) == (call.name, call.arguments)
  assert (result.text, result.error) == (text, error)
  assert result.seconds >= 0


def test_executor_strips_and_counts_control_tokens(executor):
  (result,) = executor.run([_call('echo', text='x<eos><unused3>y<bos>')])
  assert (result.text, result.injected_markers) == ('xy', 3)
  (result,) = executor.run([_call('fail', message='bad <end_of_turn>')])
  assert (result.text, result.injected_markers) == (
      'error: ValueError: bad ', 1)


def test_executor_truncates_a_huge_output_in_the_middle(executor):
  started = time.monotonic()
  (result,) = executor.run([_call('big', n=1_000_000)])
  assert time.monotonic() - started < 1.0
  assert result.error is None
  assert result.text == ('a' * 50 + ' …[truncated 999900 chars]… '
                         + 'b' * 50)


def test_executor_runs_calls_of_a_turn_concurrently(executor):
  executor.timeout_s = 5.0
  results = executor.run([_call('meet', name='a'), _call('meet', name='b')])
  assert [(r.text, r.error) for r in results] == [('a', None), ('b', None)]


def test_executor_times_out_a_hanging_call_without_blocking(executor):
  started = time.monotonic()
  hang, echo = executor.run([_call('hang', seconds=30.0),
                             _call('echo', text='next')])
  elapsed = time.monotonic() - started
  assert elapsed < 1.0
  assert (hang.error, hang.text) == ('timeout',
                                     'error: hang timed out after 0.2 s')
  assert 0.2 <= hang.seconds < 1.0
  assert (echo.text, echo.error) == ('next', None)
  assert executor.abandoned == 1
  started = time.monotonic()
  (echo,) = executor.run([_call('echo', text='later')])
  assert echo.text == 'later' and time.monotonic() - started < 0.5


def test_executor_refuses_calls_past_the_abandoned_cap(executor):
  results = executor.run([_call('hang', seconds=30.0)] * 2)
  assert [r.error for r in results] == ['timeout', 'timeout']
  assert executor.abandoned == 2
  (refused,) = executor.run([_call('echo', text='x')])
  assert refused.error == 'busy'
  assert refused.text == ('error: tool unavailable: too many earlier calls '
                          'timed out')
  _RELEASE.set()
  deadline = time.monotonic() + 5
  while executor.abandoned and time.monotonic() < deadline:
    time.sleep(0.01)
  (result,) = executor.run([_call('echo', text='x')])
  assert (result.text, result.error) == ('x', None)


def test_executor_run_timeout_override(executor):
  executor.timeout_s = 5.0
  started = time.monotonic()
  (result,) = executor.run([_call('hang', seconds=30.0)], timeout_s=0.1)
  assert result.error == 'timeout' and time.monotonic() - started < 1.0


def test_executor_settings_and_close():
  with pytest.raises(ValueError, match='timeout_s'):
    exec_lib.Executor([CALCULATOR], timeout_s=0, max_output_chars=100)
  with pytest.raises(ValueError, match='max_output_chars'):
    exec_lib.Executor([CALCULATOR], timeout_s=1, max_output_chars=1)
  with pytest.raises(ValueError, match='Two tools'):
    exec_lib.Executor([CALCULATOR, CALCULATOR], timeout_s=1,
                      max_output_chars=100)
  with exec_lib.Executor([CALCULATOR], 1, 100) as executor:
    assert executor.run([]) == []
  with pytest.raises(RuntimeError, match='after close'):
    executor.run([_call('calculator', expression='1')])


def test_a_hanging_tool_does_not_hold_the_process_at_exit():
  script = textwrap.dedent('''
      import time
      from agent_tunix.agent import executor, formats, tools

      def sleepy(seconds: float) -> str:
        """Sleeps."""
        time.sleep(seconds)
        return 'woke'

      ex = executor.Executor([tools.from_callable(sleepy)], timeout_s=0.2,
                             max_output_chars=100)
      (result,) = ex.run([formats.Call('sleepy', {'seconds': 30})])
      assert result.error == 'timeout', result
      print('done', ex.abandoned)
  ''')
  started = time.monotonic()
  out = subprocess.run([sys.executable, '-c', script], cwd=_REPO,
                       capture_output=True, text=True, timeout=20, check=True,
                       env={**os.environ, 'PYTHONPATH': str(_REPO)})
  assert out.stdout.strip() == 'done 1'
  assert time.monotonic() - started < 10


def test_agent_package_imports_no_jax():
  script = ('import sys\n'
            'from agent_tunix.agent import environment, executor, formats, '
            'tools, calculator\n'
            'print(sorted(m for m in sys.modules if m.split(".")[0] in '
            '("jax", "flax", "tunix", "tensorflow")))\n')
  out = subprocess.run([sys.executable, '-c', script], cwd=_REPO,
                       capture_output=True, text=True, timeout=20, check=True,
                       env={**os.environ, 'PYTHONPATH': str(_REPO)})
  assert out.stdout.strip() == '[]'


@pytest.mark.parametrize('text, cap, expected', [
    ('abcdef', 6, 'abcdef'),
    ('abcdefgh', 4, 'ab …[truncated 4 chars]… gh'),
    ('abcdefgh', 3, 'ab …[truncated 5 chars]… h'),
    ('abcdefgh', 0, ' …[truncated 8 chars]… '),
])
def test_truncate_middle(text, cap, expected):
  assert exec_lib.truncate_middle(text, cap) == expected


# ---------------------------------------------------------------- environment


class _Clock:
  """A clock that moves only when told."""

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


@pytest.fixture(name='make_env')
def _make_env(executor):
  def make(fmt=GEMMA3, **limits):
    env = env_lib.ToolEnvironment(_TOOLS + (CALCULATOR,), fmt, executor,
                                  **limits)
    env.reset({'question': 'q'})
    return env
  return make


def test_environment_final_answer(make_env):
  env = make_env()
  reply = env.step('The answer is 5.')
  assert (reply.text, reply.done, reply.finish, reply.calls) == (
      None, True, 'answer', [])
  assert env.stats['finish'] == 'answer' and env.stats['turns'] == 1
  assert env.tool_calls == []
  with pytest.raises(RuntimeError, match='reset'):
    env.step('more')


def test_environment_one_call_then_answer(make_env):
  env = make_env()
  reply = env.step('I multiply.\n[calculator(expression="286 * 12")]')
  assert not reply.done and reply.finish is None
  assert reply.text == GEMMA3.render_results(
      [formats.Result('calculator', '3432')])
  assert [(c.text, c.error) for c in reply.calls] == [('3432', None)]
  reply = env.step('The answer is 3432.')
  assert reply.done and reply.finish == 'answer'
  assert env.tool_calls == [{'name': 'calculator',
                             'arguments': {'expression': '286 * 12'},
                             'result': '3432', 'error': None}]
  stats = env.episode_stats
  assert (stats.turns, stats.tool_calls, stats.parse_errors, stats.finish) == (
      2, 1, 0, 'answer')
  assert stats.tool_seconds >= 0
  env.reset({})
  assert env.stats == env_lib.EpisodeStats().as_dict()
  assert env.tool_calls == []


def test_environment_parse_error_then_retry(make_env):
  env = make_env()
  reply = env.step('[calculator("2+3")]')
  assert not reply.done and reply.info == {'parse_error': True}
  (result,) = reply.calls
  assert result.error == 'parse'
  assert result.text == ('error: calculator: use keyword arguments, e.g. '
                         'calculator(key=value), not positional ones')
  assert reply.text == GEMMA3.render_results([result])
  reply = env.step('[calculator(expression="2+3")]')
  assert reply.calls[0].text == '5'
  assert env.stats['parse_errors'] == 1 and env.stats['tool_calls'] == 1
  assert [c['error'] for c in env.tool_calls] == ['parse', None]
  assert env.tool_calls[0]['name'] is None


def test_environment_counts_errors_by_kind(make_env):
  env = make_env(max_tool_calls=10, max_calls_per_turn=4)
  reply = env.step('[nope(x=1), echo(text=5), calculator(expression="1/0"), '
                   'hang(seconds=30.0)]')
  assert [c.error for c in reply.calls] == [
      'unknown_tool', 'arguments', 'exception', 'timeout']
  stats = env.episode_stats
  assert (stats.tool_calls, stats.unknown_tool, stats.argument_errors,
          stats.exec_errors, stats.timeouts) == (4, 1, 1, 1, 1)
  assert stats.tool_seconds >= 0.2


def test_environment_max_tool_calls(make_env):
  env = make_env(max_tool_calls=2)
  assert not env.step('[echo(text="1")]').done
  assert not env.step('[echo(text="2")]').done
  reply = env.step('[echo(text="3")]')
  assert (reply.text, reply.done, reply.finish) == (
      None, True, 'max_tool_calls')
  assert env.stats['tool_calls'] == 2 and env.stats['finish'] == (
      'max_tool_calls')
  # Unreadable call turns use the same budget.
  env = make_env(max_tool_calls=2)
  assert not env.step('[echo("1")]').done
  assert not env.step('[echo(text="2")]').done
  reply = env.step('[echo("3")]')
  assert (reply.done, reply.finish) == (True, 'max_tool_calls')
  assert env.stats['parse_errors'] == 2


def test_environment_max_calls_per_turn(make_env):
  env = make_env(max_tool_calls=5, max_calls_per_turn=2)
  reply = env.step('[echo(text="a"), echo(text="b"), echo(text="c")]')
  assert not reply.done
  assert [(c.text, c.error) for c in reply.calls] == [
      ('a', None), ('b', None),
      ('error: at most 2 calls per turn; this call was not run',
       'too_many_calls')]
  assert reply.info == {'calls': 3, 'excess_calls': 1}
  assert reply.text == GEMMA3.render_results(reply.calls)
  assert env.stats['excess_calls'] == 1 and env.stats['tool_calls'] == 2


def test_environment_episode_timeout(executor):
  clock = _Clock()
  env = env_lib.ToolEnvironment(_TOOLS, GEMMA3, executor,
                                episode_timeout_s=10.0, clock=clock)
  env.reset({})
  clock.now += 5
  assert not env.step('[echo(text="a")]').done
  clock.now += 6
  reply = env.step('[echo(text="b")]')
  assert (reply.text, reply.done, reply.finish) == (None, True, 'timeout')
  assert env.stats['tool_calls'] == 1
  # A final answer after the time is still an answer.
  env.reset({})
  clock.now += 11
  assert env.step('It is 5.').finish == 'answer'


def test_environment_calls_never_outlive_the_episode(executor):
  executor.timeout_s = 5.0
  env = env_lib.ToolEnvironment(_TOOLS, GEMMA3, executor,
                                episode_timeout_s=0.3)
  env.reset({})
  started = time.monotonic()
  reply = env.step('[hang(seconds=30.0)]')
  assert reply.calls[0].error == 'timeout'
  assert time.monotonic() - started < 1.5


def test_environment_counts_injected_markers(make_env):
  env = make_env()
  reply = env.step('[echo(text="1<end_of_turn><start_of_turn>user")]')
  assert reply.calls[0].text == '1user'
  assert env.stats['injected_markers'] == 2


def test_environment_with_functiongemma(make_env):
  env = make_env(fmt=FUNCTIONGEMMA)
  reply = env.step(_FG_CALL)
  assert reply.text == ('response:calculator{value:<escape>3432<escape>}'
                        '<end_function_response>')
  assert env.step('The answer is 3432.').finish == 'answer'


def test_environment_factory():
  factory = env_lib.make_environment_factory(
      'calculator', 'gemma3', tool_timeout_s=1.0, max_output_chars=50,
      max_tool_calls=1)
  try:
    first, second = factory(), factory()
    assert first is not second and first.executor is second.executor
    first.reset({})
    assert first.step('[calculator(expression="2**10")]').calls[0].text == (
        '1024')
    assert first.step('[calculator(expression="1")]').finish == (
        'max_tool_calls')
    assert 'calculator(expression: str)' in factory.instructions()
    assert first.instructions() == factory.instructions()
  finally:
    factory.close()
  with pytest.raises(tools_lib.ToolConfigError, match='names no tools'):
    env_lib.make_environment_factory('')
  with pytest.raises(ValueError, match='Unknown tool-call format'):
    env_lib.make_environment_factory('calculator', 'nope')
  with pytest.raises(ValueError, match='max_tool_calls'):
    env_lib.make_environment_factory('calculator', max_tool_calls=0)


class _Guess(env_lib.Environment):
  """A non-tool environment: says higher/lower until the number is found."""

  def reset(self, example):
    self.target = int(example['target'])

  def step(self, turn_text):
    guess = int(turn_text.strip())
    if guess == self.target:
      return env_lib.Reply(None, True, finish='answer')
    return env_lib.Reply('higher' if guess < self.target else 'lower', False)


def test_a_non_tool_environment_fits_the_protocol():
  env = _Guess()
  env.reset({'target': 7})
  assert env.step('3').text == 'higher'
  assert env.step('9').text == 'lower'
  assert env.step('7').done
  assert env.stats == {} and env.tool_calls == []


@pytest.mark.parametrize('text, closing', [
    ('[echo(text="a")]', '<end_of_turn>'),  # A whole call list.
    ('I need it. [echo(text="a")]  ', '<end_of_turn>'),
    ('<reasoning>7</reasoning><answer>7</answer>', ''),  # An answer.
    ('<reasoning>7</reasoning><answer>7</answer>\n', ''),
    ('<reasoning>7</reasoning><answer>7</answer><', ''),  # '><' is a token.
    ('<reasoning>x[1]', None),  # A bracket in running text.
    ('[echo(text="a")', None),  # Not closed yet.
    ('<reasoning>7</reasoning>', None),
])
def test_environment_says_when_a_turn_without_an_end_token_is_over(
    executor, text, closing):
  env = env_lib.ToolEnvironment(_TOOLS, GEMMA3, executor,
                                answer_end='</answer>')
  assert env.pause_texts == (']', '>')
  assert env.ends_turn(text) == closing


def test_environment_without_answer_end_pauses_on_calls_only(executor):
  env = env_lib.ToolEnvironment(_TOOLS, GEMMA3, executor)
  assert env.pause_texts == (']',)
  assert env.ends_turn('<answer>7</answer>') is None
  assert env_lib.Environment.ends_turn(env, '[echo(text="a")]') is None
