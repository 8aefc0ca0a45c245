"""The built-in calculator tool: exact arithmetic on a parsed expression.

The expression is parsed with `ast.parse(mode='eval')` and only a whitelist
of nodes is evaluated, on `fractions.Fraction`s; nothing the model writes is
ever run as code. Allowed:
  * integer and decimal literals (`12`, `0.5`, `.5`, `1e3`); a decimal is
    read from its source text, so `0.1 + 0.2` is exactly `0.3`;
  * binary `+ - * / // % **`, unary `+ -`, parentheses;
  * the spellings `×` (for `*`), `÷` (for `/`) and `−` (U+2212, for `-`).
Everything else is refused with a `CalculatorError` whose short message
tells the model what to fix: names, calls, attributes, strings, comparisons,
booleans, complex numbers, subscripts, lambdas, `^` (use `**`), and commas
(so `1,000` is refused; write `1000`).

Caps, each refused with a `CalculatorError`: the input length
(`MAX_INPUT_CHARS`), the size of every literal and intermediate result
(`MAX_ABS`: |x| < 10**30, and denominators up to `MAX_DENOMINATOR`), the
exponent of `**` (a whole number with |exp| <= `MAX_EXPONENT`; the result's
size is estimated before it is computed), and division or modulo by zero.

The result is written without scientific notation:
  * an integer as plain digits: '3432', '-7';
  * a fraction whose denominator has no prime factors but 2 and 5 as its
    exact decimal: '0.3', '2.5', '-0.125';
  * any other fraction rounded (half to even) to `SIGNIFICANT_DIGITS`
    significant digits, keeping every digit of the integer part and at
    least one decimal, trailing zeros dropped: '0.333333333333',
    '3.33333333333', '33333333333333.3'.
"""

import ast
from collections.abc import Callable
import fractions
import math
import re

Fraction = fractions.Fraction

# The longest expression accepted, in characters.
MAX_INPUT_CHARS = 200
# Every literal and intermediate result must satisfy |x| < MAX_ABS.
MAX_ABS = 10**30
# Every literal and intermediate result must have a denominator <= this.
MAX_DENOMINATOR = 10**30
# The largest |exponent| accepted by `**`.
MAX_EXPONENT = 64
# Significant digits of a result that has no exact decimal form.
SIGNIFICANT_DIGITS = 12
# The largest |e| in a literal's exponent ('1e30'); larger ones are refused
# before the literal is converted (converting '1e99999999' exactly would be
# slow).
_MAX_LITERAL_EXPONENT = 40

# Spellings accepted besides Python's operators.
_SPELLINGS = {'×': '*', '÷': '/', '−': '-'}
_EXPONENT_RE = re.compile(r'[eE]([+-]?\d+)$')

_BINARY: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: Fraction(a // b),
    ast.Mod: lambda a, b: a % b,
}
_SYMBOLS = {
    ast.Add: '+', ast.Sub: '-', ast.Mult: '*', ast.Div: '/',
    ast.FloorDiv: '//', ast.Mod: '%', ast.Pow: '**',
}
# Refusal messages for nodes that a model plausibly writes.
_REFUSALS = {
    ast.Name: 'names are not allowed: use numbers only',
    ast.Call: 'function calls are not allowed: use + - * / // % ** only',
    ast.Attribute: 'attributes are not allowed: use numbers only',
    ast.Subscript: 'indexing is not allowed: use numbers only',
    ast.Compare: 'comparisons are not allowed: use + - * / // % ** only',
    ast.BoolOp: "'and'/'or' are not allowed: use + - * / // % ** only",
    ast.Tuple: 'commas are not allowed: write 1000, not 1,000, and one '
               'expression only',
    ast.Lambda: 'lambda is not allowed: use numbers only',
}


class CalculatorError(ValueError):
  """The expression is refused; the message is shown to the model."""


def calculator(expression: str) -> str:
  """Evaluates an arithmetic expression exactly.

  Args:
    expression: Numbers with + - * / // % ** and parentheses, for example
      "(286 * 12) / 4".

  Returns:
    The exact result as plain digits ('3432', '0.3'); a result with no
    exact decimal form is rounded to 12 significant digits.

  Raises:
    CalculatorError: when the expression is malformed, uses anything but
      numbers and arithmetic, or exceeds a size cap.
  """
  return format_number(evaluate(expression))


def evaluate(expression: str) -> Fraction:
  """The exact value of `expression` (see the module docstring).

  Args:
    expression: The arithmetic expression.

  Returns:
    Its value as a Fraction.

  Raises:
    CalculatorError: see `calculator`.
  """
  source = _clean(expression)
  return _Evaluator(source).value(_parse(source))


def step_values(expression: str) -> list[Fraction]:
  """The value of every operation in `expression`, in the order evaluated.

  `'5000 - 15 * 241'` gives `[3615, 1385]`: the product, then the
  difference (the last is the whole expression's value). Checked and
  refused exactly like `evaluate`; a tool-aware reward reads a call's
  intermediate results from it.
  """
  source = _clean(expression)
  evaluator = _Evaluator(source)
  evaluator.steps = []
  evaluator.value(_parse(source))
  return evaluator.steps


def operands(expression: str) -> list[Fraction]:
  """The numbers written in `expression`, in order (`'5000 - 15 * 241'`
  gives `[5000, 15, 241]`). Checked and refused exactly like `evaluate`."""
  source = _clean(expression)
  evaluator = _Evaluator(source)
  evaluator.literals = []
  evaluator.value(_parse(source))
  return evaluator.literals


def read_calls(calls, read):
  """`read(expression)` of each calculator call that ran, in order.

  For tool-aware rewards: `calls` are an episode's call records ({name,
  arguments, result, error}); failed calls, calls to other tools, calls
  without a text `expression` argument and expressions `read` refuses
  (CalculatorError) are skipped.
  """
  values = []
  for call in calls or ():
    expression = (call.get('arguments') or {}).get('expression')
    if call.get('name') != 'calculator' or call.get('error') is not None:
      continue
    if not isinstance(expression, str):
      continue
    try:
      values.append(read(expression))
    except CalculatorError:
      continue
  return values


def _clean(expression: str) -> str:
  """`expression` with its spellings normalised, or CalculatorError."""
  if not isinstance(expression, str):
    raise CalculatorError(
        f'the expression must be text, got {type(expression).__name__}')
  if len(expression) > MAX_INPUT_CHARS:
    raise CalculatorError(
        f'expression too long ({len(expression)} characters, at most '
        f'{MAX_INPUT_CHARS})')
  source = expression
  for spelling, operator in _SPELLINGS.items():
    source = source.replace(spelling, operator)
  source = source.strip()
  if not source:
    raise CalculatorError('empty expression')
  return source


def _parse(source: str) -> ast.AST:
  """The body of `source` parsed as one expression, or CalculatorError."""
  try:
    return ast.parse(source, mode='eval').body
  except SyntaxError as e:
    raise CalculatorError(
        f'not a valid arithmetic expression ({e.msg})') from None
  except (ValueError, MemoryError, RecursionError):
    raise CalculatorError('not a valid arithmetic expression') from None


class _Evaluator:
  """Evaluates whitelisted nodes of one parsed expression; with `steps` a
  list, appends each binary operation's value to it, and with `literals` a
  list, each number written in the expression."""

  def __init__(self, source: str):
    self._source = source
    self.steps = None
    self.literals = None

  def value(self, node: ast.AST) -> Fraction:
    """The checked value of `node`."""
    if isinstance(node, ast.Constant):
      value = _check(self._literal(node))
      if self.literals is not None:
        self.literals.append(value)
      return value
    if isinstance(node, ast.UnaryOp):
      if isinstance(node.op, ast.USub):
        return -self.value(node.operand)
      if isinstance(node.op, ast.UAdd):
        return self.value(node.operand)
      raise CalculatorError(
          f"'{'not' if isinstance(node.op, ast.Not) else '~'}' is not "
          'allowed: use + - * / // % ** only')
    if isinstance(node, ast.BinOp):
      return self._binary(node)
    for kind, message in _REFUSALS.items():
      if isinstance(node, kind):
        raise CalculatorError(message)
    raise CalculatorError(
        f'{type(node).__name__} is not allowed: use numbers with '
        '+ - * / // % ** and parentheses only')

  def _literal(self, node: ast.Constant) -> Fraction:
    value = node.value
    # bool is an int subclass: True must not pass as 1.
    if isinstance(value, bool) or value is None:
      raise CalculatorError(f'{value} is not allowed: use numbers only')
    if isinstance(value, int):
      return Fraction(value)
    if isinstance(value, float):
      text = ast.get_source_segment(self._source, node) or ''
      exponent = _EXPONENT_RE.search(text)
      if exponent and abs(int(exponent.group(1))) > _MAX_LITERAL_EXPONENT:
        raise CalculatorError(f'number out of range: {text}')
      try:
        return Fraction(text)
      except ValueError:
        raise CalculatorError(f'not a number: {text!r}') from None
    if isinstance(value, complex):
      raise CalculatorError('complex numbers are not allowed')
    raise CalculatorError(
        f'{type(value).__name__} literals are not allowed: use numbers only')

  def _binary(self, node: ast.BinOp) -> Fraction:
    op = type(node.op)
    if op is ast.BitXor:
      raise CalculatorError("'^' is not supported: use ** for powers")
    if op not in _SYMBOLS:
      raise CalculatorError(
          f'operator {type(node.op).__name__} is not allowed: use '
          '+ - * / // % ** only')
    left = self.value(node.left)
    right = self.value(node.right)
    if op is ast.Pow:
      result = _check(_power(left, right))
    else:
      if op in (ast.Div, ast.FloorDiv, ast.Mod) and right == 0:
        raise CalculatorError(
            'division by zero' if op is not ast.Mod else 'modulo by zero')
      result = _check(_BINARY[op](left, right))
    if self.steps is not None:
      self.steps.append(result)
    return result


def _power(base: Fraction, exponent: Fraction) -> Fraction:
  """base ** exponent, refused before computing when it would be too big."""
  if exponent.denominator != 1:
    raise CalculatorError('the exponent must be a whole number')
  e = exponent.numerator
  if abs(e) > MAX_EXPONENT:
    raise CalculatorError(
        f'exponent {e} too large (at most {MAX_EXPONENT} in size)')
  if base == 0:
    if e < 0:
      raise CalculatorError('division by zero (0 to a negative power)')
    return Fraction(int(e == 0))
  if e < 0:
    base, e = 1 / base, -e
  numerator, denominator = abs(base.numerator), base.denominator
  # Estimated decimal digits, before anything large is computed.
  size = e * (math.log10(numerator) - math.log10(denominator))
  if size > math.log10(MAX_ABS) + 1:
    raise CalculatorError(
        f'result too large (|x| must stay below 10**{_digits(MAX_ABS) - 1})')
  if e * math.log10(denominator) > math.log10(MAX_DENOMINATOR) + 1:
    raise CalculatorError('result too small or too many decimal places')
  return base**e


def _check(value: Fraction) -> Fraction:
  """Refuses a value outside the caps."""
  if abs(value) >= MAX_ABS:
    raise CalculatorError(
        f'number too large (|x| must stay below 10**{_digits(MAX_ABS) - 1})')
  if value.denominator > MAX_DENOMINATOR:
    raise CalculatorError('number too small or too many decimal places')
  return value


def _digits(n: int) -> int:
  return len(str(n))


def format_number(value: Fraction) -> str:
  """`value` as text, by the rules in the module docstring.

  Args:
    value: A number within the caps.

  Returns:
    Plain digits with an optional sign and decimal point.
  """
  sign = '-' if value < 0 else ''
  numerator, denominator = abs(value.numerator), value.denominator
  if denominator == 1:
    return f'{sign}{numerator}'
  twos = fives = 0
  rest = denominator
  while rest % 2 == 0:
    rest //= 2
    twos += 1
  while rest % 5 == 0:
    rest //= 5
    fives += 1
  if rest == 1:  # An exact decimal.
    places = max(twos, fives)
    scaled = numerator * 10**places // denominator
  else:
    whole = numerator // denominator
    if whole:
      places = max(SIGNIFICANT_DIGITS - _digits(whole), 1)
    else:
      # The first significant digit is at decimal place `first`.
      first = 1
      while numerator * 10**first < denominator:
        first += 1
      places = first + SIGNIFICANT_DIGITS - 1
    scaled = round(Fraction(numerator * 10**places, denominator))
  digits = str(scaled).rjust(places + 1, '0')
  whole_part, fraction_part = digits[:-places], digits[-places:]
  fraction_part = fraction_part.rstrip('0') or '0'
  if scaled == 0:
    sign = ''
  return f'{sign}{whole_part}.{fraction_part}'
