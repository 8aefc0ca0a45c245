"""Tool-call formats: how a model family writes calls and reads results.

Layer: agent (bottom); imports only the standard library and agent.tools.

`get(name)` returns the `ToolFormat` 'gemma3', 'functiongemma' or 'gemma4'.
A format reads a finished model turn into `Call`s (`parse`: read as data,
never evaluated), writes the text the host inserts after it
(`render_results`), tells the model how to call (`instructions`) and
renders worked examples for few-shot prompts (`example_turns`). `sanitize`
removes control tokens from tool output, so that a tool cannot open or
close turns.

Design notes: docs/agent.md, 'Call formats'.
"""

import abc
import ast
from collections.abc import Mapping, Sequence
import dataclasses
import json
import re
from typing import Any, Protocol

from agent_tunix.agent import tools as tools_lib

# Gemma 3's and Gemma 4's control tokens, the image tokens, FunctionGemma's
# and Gemma 4's tool tokens and the 'gemma3' format's response tags: none
# may come from a tool. Any '<unusedN>' piece is removed as well.
CONTROL_TOKENS = (
    '<bos>', '<eos>', '<pad>', '<unk>', '<mask>', '[multimodal]',
    '<start_of_turn>', '<end_of_turn>',
    '<start_of_image>', '<end_of_image>', '<image_soft_token>',
    '<start_function_declaration>', '<end_function_declaration>',
    '<start_function_call>', '<end_function_call>',
    '<start_function_response>', '<end_function_response>', '<escape>',
    '<tool_response>', '</tool_response>',
    '<|turn>', '<turn|>', '<|tool>', '<tool|>', '<|tool_call>',
    '<tool_call|>', '<|tool_response>', '<tool_response|>', '<|"|>',
    '<|think|>', '<|channel>', '<channel|>', '<|image>', '<image|>',
    '<|image|>', '<|audio>', '<audio|>', '<|audio|>', '<|video|>',
)
_CONTROL_RE = re.compile(
    '|'.join([re.escape(t) for t in sorted(CONTROL_TOKENS, key=len,
                                           reverse=True)]
             + [r'<unused\d+>']))

START_OF_TURN = '<start_of_turn>'
END_OF_TURN = '<end_of_turn>'
GEMMA4_START_OF_TURN = '<|turn>'
GEMMA4_END_OF_TURN = '<turn|>'


class ToolParseError(ValueError):
  """A turn ends like a tool call but is malformed.

  The message is shown to the model, so it names no control token (the
  inserted text would be tokenized into one).
  """


@dataclasses.dataclass
class Call:
  """One tool call read from a model turn.

  Attributes:
    name: The tool's name as written.
    arguments: Keyword arguments: str, int, float, bool, None, and lists and
      dicts of these.
    source: The call's text as the model wrote it.
  """

  name: str
  arguments: dict[str, Any]
  source: str = ''


@dataclasses.dataclass(frozen=True)
class Result:
  """A tool result to render: what `render_results` reads.

  `executor.CallResult` has the same two attributes and may be passed
  instead.

  Attributes:
    name: The tool called (None or '' when the call could not be read).
    text: What the model sees: the output, or 'error: ...'.
  """

  name: str | None
  text: str


class HasNameAndText(Protocol):
  """What `render_results` reads from a result."""

  name: str | None
  text: str


def sanitize(text: str) -> tuple[str, int]:
  """Removes control tokens and format markers from tool output.

  Removal repeats until none is left, so that removing one cannot join
  the pieces around it into another ('<start_of<eos>_turn>').

  Args:
    text: Tool output.

  Returns:
    (clean text, number of markers removed).
  """
  removed = 0
  while True:
    text, count = _CONTROL_RE.subn('', text)
    if not count:
      return text, removed
    removed += count


class ToolFormat(abc.ABC):
  """How one model family writes tool calls and reads their results.

  Attributes:
    name: The format's name in `FORMATS`.
    stop_pieces: Token pieces that end a call turn: the rollout stops the
      row when it samples one, and the text given to `parse` leaves it out.
    required_pieces: Control tokens the tokenizer must have as single
      pieces for this format to work (check at start-up).
    missing_pieces_fix: What to do when the tokenizer lacks some of them.
    call_end: What the model writes right after its calls: the stop piece
      at which the host inserts `render_results`.
    turn_start: What opens a turn (the role name follows).
    turn_end: What ends a model turn (a final answer).
    system_role: The turn role that carries `instructions`: 'user' means
      the first user turn (Gemma 3 has no system role).
    instructions_joiner: What joins the system prompt and `instructions`
      in that turn.
  """

  name: str = ''
  stop_pieces: tuple[str, ...] = ()
  required_pieces: tuple[str, ...] = ()
  missing_pieces_fix: str = "use agent.format='gemma3'"
  call_end: str = ''
  turn_start: str = START_OF_TURN
  turn_end: str = END_OF_TURN
  system_role: str = 'user'
  instructions_joiner: str = '\n\n'

  @abc.abstractmethod
  def parse(self, turn_text: str) -> list[Call] | None:
    """Reads the calls that end a model turn.

    Args:
      turn_text: The turn's text, without the stop piece that ended it.

    Returns:
      None when the turn makes no call (a final answer); else the calls in
      the order written.

    Raises:
      ToolParseError: when the turn ends like a call but is malformed.
    """

  @abc.abstractmethod
  def render_calls(self, calls: Sequence[Call], reasoning: str = '') -> str:
    """A call turn's text (without `call_end`): what `parse` reads back.

    Args:
      calls: The calls; only name and arguments are used.
      reasoning: Text before the calls.
    """

  @abc.abstractmethod
  def render_results(self, results: Sequence[HasNameAndText]) -> str:
    """The text the host inserts after `call_end`, up to where the model
    writes next.

    Args:
      results: One per call, in call order (`Result` or
        `executor.CallResult`); error texts start with 'error: '.
    """

  @abc.abstractmethod
  def instructions(self, tools: Sequence[tools_lib.Tool],
                   example: Call | None = None) -> str:
    """The prompt text that lists the tools and says how to call them.

    Args:
      tools: The tools the model may call.
      example: A call shown as an example; default: the first tool with
        placeholder values.
    """

  def sanitize(self, text: str) -> tuple[str, int]:
    """`sanitize(text)`: (clean text, number of markers removed)."""
    return sanitize(text)

  def example_turns(self, calls: Sequence[Call | tuple[str, Mapping]],
                    results: Sequence[str], answer: str,
                    reasoning: str = '') -> str:
    """The model's side of a worked example, for few-shot prompts.

    From the start of the model's first turn to the end of its final
    answer, exactly as a rollout holds it: the call turn, `call_end`, the
    inserted results, then the final turn's text. The final turn's own end
    (`turn_end`, or the next few-shot example) is left to the prompt
    template, as is the question before it.

    Args:
      calls: `Call`s or (name, arguments) pairs.
      results: Each call's result text, in order.
      answer: The final turn's text.
      reasoning: Text before the calls.

    Returns:
      The text.
    """
    calls = [c if isinstance(c, Call) else Call(c[0], dict(c[1]))
             for c in calls]
    if len(calls) != len(results) or not calls:
      raise ValueError(
          f'example_turns needs one result per call and at least one call; '
          f'got {len(calls)} calls and {len(results)} results.')
    rendered = [Result(c.name, str(r)) for c, r in zip(calls, results)]
    return (self.render_calls(calls, reasoning) + self.call_end
            + self.render_results(rendered) + answer)


def _example_call(tools: Sequence[tools_lib.Tool],
                  example: Call | None) -> Call:
  if not tools:
    raise ValueError('instructions need at least one tool.')
  if example is not None:
    return example
  tool = tools[0]
  return Call(tool.name, {p.name: tools_lib.EXAMPLE_VALUES[p.type]
                          for p in tool.parameters if p.required})


_TYPE_WORDS = {str: 'str', int: 'int', float: 'float', bool: 'bool'}


class Gemma3Format(ToolFormat):
  """Gemma 3: a Python-style call list at the end of the model turn."""

  name = 'gemma3'
  stop_pieces = (END_OF_TURN,)
  required_pieces = (START_OF_TURN, END_OF_TURN)
  call_end = END_OF_TURN
  system_role = 'user'
  # How many '[name(' starts in one turn are tried as the call list.
  max_candidates = 64

  _START_RE = re.compile(r'\[\s*[A-Za-z_][\w.]*\s*\(')
  _LANGUAGE_RE = re.compile(r'[A-Za-z_][\w-]*[ \t]*\n')

  def parse(self, turn_text: str) -> list[Call] | None:
    text = turn_text.rstrip()
    if text.endswith(END_OF_TURN):
      text = text[:-len(END_OF_TURN)].rstrip()
    text = self._unfence(text)
    if not text.endswith(']'):
      return None
    starts = [m.start() for m in self._START_RE.finditer(text)]
    if not starts:
      return None
    syntax_error = value_error = None
    # The earliest start that reads as a whole list is the call list (a
    # later one would be nested inside it).
    for start in starts[:self.max_candidates]:
      try:
        return self._read_list(text[start:])
      except _SyntaxProblem as e:
        syntax_error = syntax_error or e
      except ToolParseError as e:
        value_error = value_error or e
    error = value_error or syntax_error
    raise ToolParseError(str(error))

  def _unfence(self, text: str) -> str:
    """Drops a Markdown code fence around a trailing call list."""
    if not text.endswith('```'):
      return text
    inner = text[:-3].rstrip()
    opening = inner.rfind('```')
    if opening < 0:
      return text
    body = inner[opening + 3:]
    language = self._LANGUAGE_RE.match(body)
    if language:
      body = body[language.end():]
    return inner[:opening] + '\n' + body.strip()

  def _read_list(self, source: str) -> list[Call]:
    try:
      tree = ast.parse(source, mode='eval')
    except SyntaxError as e:
      raise _SyntaxProblem(
          f'the call list is not valid ({e.msg}); write '
          '[name(key=value, ...)] at the end of the turn') from None
    except (ValueError, MemoryError, RecursionError):
      raise _SyntaxProblem('the call list is not valid') from None
    if not isinstance(tree.body, ast.List):
      raise ToolParseError(
          'end the turn with a list of calls: [name(key=value, ...)]')
    calls = []
    for node in tree.body.elts:
      if not isinstance(node, ast.Call):
        raise ToolParseError(
            'every item of the call list must be a call: name(key=value)')
      if not isinstance(node.func, ast.Name):
        raise ToolParseError(
            f'call the tool by its plain name, not '
            f'{ast.get_source_segment(source, node.func)!r}')
      name = node.func.id
      if node.args:
        raise ToolParseError(
            f'{name}: use keyword arguments, e.g. {name}(key=value), not '
            'positional ones')
      arguments = {}
      for kw in node.keywords:
        if kw.arg is None:
          raise ToolParseError(f'{name}: **arguments are not allowed')
        if kw.arg in arguments:  # The parser lets a repeated keyword pass.
          raise ToolParseError(f'{name}: {kw.arg!r} is given twice')
        arguments[kw.arg] = _python_literal(name, kw.arg, kw.value)
      calls.append(Call(name, arguments,
                        ast.get_source_segment(source, node) or ''))
    if not calls:
      raise ToolParseError('the call list is empty')
    return calls

  def render_calls(self, calls: Sequence[Call], reasoning: str = '') -> str:
    listed = ', '.join(
        f'{c.name}('
        + ', '.join(f'{k}={_python_text(v)}' for k, v in c.arguments.items())
        + ')' for c in calls)
    prefix = f'{reasoning}\n' if reasoning else ''
    return f'{prefix}[{listed}]'

  def render_results(self, results: Sequence[HasNameAndText]) -> str:
    if not results:
      raise ValueError('render_results needs at least one result.')
    if len(results) == 1:
      body = results[0].text
    else:
      body = '\n'.join(f'{r.name or "error"}: {r.text}' for r in results)
    return (f'\n{START_OF_TURN}user\n<tool_response>\n{body}\n'
            f'</tool_response>{END_OF_TURN}\n{START_OF_TURN}model\n')

  def instructions(self, tools: Sequence[tools_lib.Tool],
                   example: Call | None = None) -> str:
    example_text = self.render_calls([_example_call(tools, example)])
    lines = [
        'You can call tools. To call, end your reply with a Python list of '
        'calls with keyword arguments and nothing after it, for example:',
        example_text,
        'Each result comes back in a <tool_response> block. When you know '
        'the final answer, reply without a call.',
        '',
        'Tools:',
    ]
    for tool in tools:
      signature = ', '.join(
          f'{p.name}: {_TYPE_WORDS[p.type]}'
          + ('' if p.required else ' (optional)') for p in tool.parameters)
      lines.append(f'{tool.name}({signature}): {tool.description}')
      for p in tool.parameters:
        if p.description:
          lines.append(f'  {p.name}: {p.description}')
    return '\n'.join(lines)


class _SyntaxProblem(ToolParseError):
  """A call-list candidate is not Python syntax."""


def _python_literal(name: str, key: str, node: ast.AST) -> Any:
  """The value of a literal node: constants, lists, tuples and dicts."""
  if isinstance(node, ast.Constant) and isinstance(
      node.value, (str, int, float, bool, type(None))):
    return node.value
  if (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub,
                                                             ast.UAdd))
      and isinstance(node.operand, ast.Constant)
      and type(node.operand.value) in (int, float)):
    value = node.operand.value
    return -value if isinstance(node.op, ast.USub) else value
  if isinstance(node, (ast.List, ast.Tuple)):
    return [_python_literal(name, key, e) for e in node.elts]
  if isinstance(node, ast.Dict) and None not in node.keys:
    out = {}
    for k, v in zip(node.keys, node.values):
      item = _python_literal(name, key, k)
      if not isinstance(item, (str, int, float, bool)):
        break
      out[item] = _python_literal(name, key, v)
    else:
      return out
  raise ToolParseError(
      f'{name}: the value of {key!r} must be a literal (a "string", a '
      'number, True/False, or a list of them), not an expression')


def _python_text(value: Any) -> str:
  """A literal as Python source, strings in double quotes."""
  if isinstance(value, str):
    return json.dumps(value, ensure_ascii=False)
  if isinstance(value, (list, tuple)):
    return '[' + ', '.join(_python_text(v) for v in value) + ']'
  if isinstance(value, dict):
    return '{' + ', '.join(f'{_python_text(k)}: {_python_text(v)}'
                           for k, v in value.items()) + '}'
  return repr(value)


class FunctionGemmaFormat(ToolFormat):
  """FunctionGemma: tool tokens, results inside the same model turn."""

  name = 'functiongemma'
  CALL_START = '<start_function_call>'
  CALL_END = '<end_function_call>'
  RESPONSE_START = '<start_function_response>'
  RESPONSE_END = '<end_function_response>'
  DECLARATION_START = '<start_function_declaration>'
  DECLARATION_END = '<end_function_declaration>'
  ESCAPE = '<escape>'
  DECLARATIONS_INTRO = ('You are a model that can do function calling with '
                        'the following functions')
  stop_pieces = (RESPONSE_START,)
  required_pieces = (START_OF_TURN, END_OF_TURN, CALL_START, CALL_END,
                     RESPONSE_START, RESPONSE_END, DECLARATION_START,
                     DECLARATION_END, ESCAPE)
  call_end = RESPONSE_START
  system_role = 'developer'
  # Gemma 4's chat template writes keys (declared parameters, call
  # arguments) sorted as Jinja's dictsort does (ignoring case), keeps the
  # required list in declared order, and leaves out an empty description,
  # required list or properties; FunctionGemma's layout here keeps the
  # declared order and writes all of them always.
  sorted_keys = False

  _TYPES = {str: 'STRING', int: 'INTEGER', float: 'NUMBER', bool: 'BOOLEAN'}

  def parse(self, turn_text: str) -> list[Call] | None:
    text = turn_text.rstrip()
    if text.endswith(self.RESPONSE_START):
      text = text[:-len(self.RESPONSE_START)].rstrip()
    last = text.rfind(self.CALL_START)
    if last < 0:
      return None
    if text.find(self.CALL_END, last) < 0:
      raise ToolParseError(_UNFINISHED)
    if not text.endswith(self.CALL_END):
      return None  # Calls followed by more text: not a call turn.
    calls = []
    position = 0
    while True:
      start = text.find(self.CALL_START, position)
      if start < 0:
        break
      body_start = start + len(self.CALL_START)
      end = text.find(self.CALL_END, body_start)
      if end < 0:
        raise ToolParseError(_UNFINISHED)
      body = text[body_start:end]
      calls.append(_FunctionCallReader(body, self.ESCAPE).call(
          text[start:end + len(self.CALL_END)]))
      position = end + len(self.CALL_END)
    return calls

  def render_calls(self, calls: Sequence[Call], reasoning: str = '') -> str:
    return reasoning + ''.join(
        f'{self.CALL_START}call:{c.name}{self._value(c.arguments)}'
        f'{self.CALL_END}' for c in calls)

  def _items(self, mapping: Mapping[str, Any]) -> list[tuple[str, Any]]:
    items = list(mapping.items())
    if not self.sorted_keys:
      return items
    return sorted(items, key=lambda kv: kv[0].lower())

  def render_results(self, results: Sequence[HasNameAndText]) -> str:
    if not results:
      raise ValueError('render_results needs at least one result.')
    parts = [
        f'response:{r.name or "error"}{{value:{self.ESCAPE}{r.text}'
        f'{self.ESCAPE}}}{self.RESPONSE_END}' for r in results]
    # The model sampled the first RESPONSE_START; the others are inserted.
    return self.RESPONSE_START.join(parts)

  def instructions(self, tools: Sequence[tools_lib.Tool],
                   example: Call | None = None) -> str:
    del example  # FunctionGemma knows its call syntax.
    if not tools:
      raise ValueError('instructions need at least one tool.')
    e = self.ESCAPE
    declarations = []
    for tool in tools:
      parameters = self._items({p.name: p for p in tool.parameters})
      properties = ','.join(
          f'{name}:{{'
          + (f'description:{e}{p.description}{e},'
             if p.description or not self.sorted_keys else '')
          + f'type:{e}{self._TYPES[p.type]}{e}}}' for name, p in parameters)
      required = ','.join(f'{e}{p.name}{e}' for p in tool.parameters
                          if p.required)
      required = (f'required:[{required}],'
                  if required or not self.sorted_keys else '')
      properties = (f'properties:{{{properties}}},'
                    if properties or not self.sorted_keys else '')
      declarations.append(
          f'{self.DECLARATION_START}declaration:{tool.name}'
          f'{{description:{e}{tool.description}{e},parameters:{{'
          f'{properties}{required}'
          f'type:{e}OBJECT{e}}}}}{self.DECLARATION_END}')
    return self.DECLARATIONS_INTRO + ''.join(declarations)

  def _value(self, value: Any) -> str:
    if isinstance(value, str):
      return f'{self.ESCAPE}{value}{self.ESCAPE}'
    if isinstance(value, bool):
      return 'true' if value else 'false'
    if value is None:
      return 'null'
    if isinstance(value, (list, tuple)):
      return '[' + ','.join(self._value(v) for v in value) + ']'
    if isinstance(value, Mapping):
      return '{' + ','.join(f'{k}:{self._value(v)}'
                            for k, v in self._items(value)) + '}'
    return repr(value)


class Gemma4Format(FunctionGemmaFormat):
  """Gemma 4's native tool tokens: FunctionGemma's layout with Gemma 4's
  pieces, declarations right after the system text in the system turn,
  `<|turn>`/`<turn|>` turns, keys sorted, as Gemma 4's chat template writes
  them (tests/side/gemma4_vocab_check.py compares the two)."""

  name = 'gemma4'
  CALL_START = '<|tool_call>'
  CALL_END = '<tool_call|>'
  RESPONSE_START = '<|tool_response>'
  RESPONSE_END = '<tool_response|>'
  DECLARATION_START = '<|tool>'
  DECLARATION_END = '<tool|>'
  ESCAPE = '<|"|>'
  DECLARATIONS_INTRO = ''
  stop_pieces = (RESPONSE_START,)
  required_pieces = (GEMMA4_START_OF_TURN, GEMMA4_END_OF_TURN, CALL_START,
                     CALL_END, RESPONSE_START, RESPONSE_END,
                     DECLARATION_START, DECLARATION_END, ESCAPE)
  missing_pieces_fix = ("use Gemma 4's own tokenizer (model.tokenizer_path, "
                        "or the checkpoint's tokenizer.json)")
  call_end = RESPONSE_START
  turn_start = GEMMA4_START_OF_TURN
  turn_end = GEMMA4_END_OF_TURN
  system_role = 'system'
  instructions_joiner = ''
  sorted_keys = True


_UNFINISHED = 'unfinished call: close it with the end-of-call token'


class _FunctionCallReader:
  """Reads 'call:NAME{key:value,...}' (the call body of FunctionGemma and
  Gemma 4; strings are wrapped in `escape`)."""

  _NAME_RE = re.compile(r'[A-Za-z_]\w*')
  _KEY_RE = re.compile(r'\s*([A-Za-z_][\w.-]*)\s*:')
  _NUMBER_RE = re.compile(r'-?\d+(\.\d+)?([eE][+-]?\d+)?(?=\s*[,}\]])')
  _WORDS = {'true': True, 'false': False, 'null': None}
  _MAX_DEPTH = 32

  def __init__(self, text: str, escape: str):
    self._text = text
    self._escape = escape
    self._pos = 0

  def call(self, source: str) -> Call:
    self._expect('call:')
    match = self._NAME_RE.match(self._text, self._pos)
    if not match:
      raise ToolParseError('write a call as call:NAME{key:value,...}')
    self._pos = match.end()
    if self._peek() != '{':
      raise ToolParseError(
          f'{match.group()}: write the arguments as {{key:value,...}} right '
          'after the name')
    arguments = self._object(0)
    if self._text[self._pos:].strip():
      raise ToolParseError(
          f'{match.group()}: unexpected text after the arguments')
    return Call(match.group(), arguments, source)

  def _peek(self) -> str:
    while self._pos < len(self._text) and self._text[self._pos].isspace():
      self._pos += 1
    return self._text[self._pos:self._pos + 1]

  def _expect(self, literal: str) -> None:
    self._peek()
    if not self._text.startswith(literal, self._pos):
      raise ToolParseError('write a call as call:NAME{key:value,...}')
    self._pos += len(literal)

  def _object(self, depth: int) -> dict[str, Any]:
    self._expect('{')
    out = {}
    if self._peek() == '}':
      self._pos += 1
      return out
    while True:
      match = self._KEY_RE.match(self._text, self._pos)
      if not match:
        raise ToolParseError('write arguments as key:value, separated by ,')
      self._pos = match.end()
      if match.group(1) in out:
        raise ToolParseError(f'{match.group(1)!r} is given twice')
      out[match.group(1)] = self._value(depth + 1)
      following = self._peek()
      self._pos += 1
      if following == '}':
        return out
      if following != ',':
        raise ToolParseError("separate arguments with ',' and close with '}'")

  def _list(self, depth: int) -> list[Any]:
    self._expect('[')
    out = []
    if self._peek() == ']':
      self._pos += 1
      return out
    while True:
      out.append(self._value(depth + 1))
      following = self._peek()
      self._pos += 1
      if following == ']':
        return out
      if following != ',':
        raise ToolParseError("separate list items with ',' and close with ']'")

  def _value(self, depth: int) -> Any:
    if depth > self._MAX_DEPTH:
      raise ToolParseError('arguments nested too deeply')
    head = self._peek()
    escape = self._escape
    if self._text.startswith(escape, self._pos):
      start = self._pos + len(escape)
      end = self._text.find(escape, start)
      if end < 0:
        raise ToolParseError('unclosed string: close it with the escape token')
      self._pos = end + len(escape)
      return self._text[start:end]
    if head == '{':
      return self._object(depth)
    if head == '[':
      return self._list(depth)
    number = self._NUMBER_RE.match(self._text, self._pos)
    if number:
      self._pos = number.end()
      if number.group(1) or number.group(2):
        return float(number.group())
      return int(number.group())
    for word, value in self._WORDS.items():
      if re.match(word + r'(?=\s*[,}\]])', self._text[self._pos:]):
        self._pos += len(word)
        return value
    raise ToolParseError(
        'write each value as an escaped string, a number, true/false, '
        'or {...} / [...]')


FORMATS: Mapping[str, ToolFormat] = {
    f.name: f
    for f in (Gemma3Format(), FunctionGemmaFormat(), Gemma4Format())}


def get(name: str) -> ToolFormat:
  """The format called `name` ('gemma3', 'functiongemma' or 'gemma4').

  Raises:
    ValueError: for an unknown name, listing the known ones.
  """
  if name not in FORMATS:
    raise ValueError(
        f'Unknown tool-call format {name!r}; expected one of '
        f'{", ".join(sorted(FORMATS))}.')
  return FORMATS[name]
