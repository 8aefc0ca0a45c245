"""Tools: plain Python functions described by their signature and docstring.

A tool is any function whose parameters are all annotated with int, float,
str or bool and whose Google-style docstring says what it does:

  def lookup(city: str, year: int = 2024) -> str:
    '''Returns the population of a city.

    Args:
      city: The city's English name.
      year: The census year.
    '''

`from_callable` turns it into a `Tool`: the docstring's first paragraph is
the description shown to the model, the Args section the parameters'
descriptions, and the parameters without a default are required. Calls
come from model output, so every argument is checked against the
parameters first (`check_arguments`).

The config names the tools as a comma-separated list (`resolve`): built-in
names (`BUILTINS`) or 'package.module:function', for example
'calculator,my_pkg.tools:lookup'.
"""

from collections.abc import Callable, Mapping
import dataclasses
import importlib
import inspect
import keyword
import re
import typing
from typing import Any

from absl import logging

from agent_tunix.agent import calculator as calculator_lib

# The config field that names the tools, used in error messages.
CONFIG_FIELD = 'agent.tools'
# Parameter types a tool may take: what model output can express.
PARAMETER_TYPES = (int, float, str, bool)
_TYPE_NAMES = {int: 'an integer', float: 'a number', str: 'a string',
               bool: 'true or false'}
_SECTION_RE = re.compile(r'^([A-Z][A-Za-z ]*):\s*$')
_ARG_RE = re.compile(r'^\*{0,2}([A-Za-z_]\w*)\s*(?:\([^)]*\))?\s*:\s*(.*)$')


class ToolConfigError(ValueError):
  """A tool or the tool list in the config is unusable."""


class ToolArgumentError(ValueError):
  """A call's arguments do not fit the tool; the message is model-facing."""


@dataclasses.dataclass(frozen=True)
class Parameter:
  """One keyword parameter of a tool.

  Attributes:
    name: The keyword.
    type: int, float, str or bool.
    required: Whether a call must give it (it has no default).
    description: From the docstring's Args section ('' when absent).
  """

  name: str
  type: type
  required: bool
  description: str


@dataclasses.dataclass(frozen=True)
class Tool:
  """A function the model may call.

  Attributes:
    name: What the model writes to call it (a Python identifier).
    description: What it does, shown to the model.
    parameters: Its keyword parameters, in signature order.
    fn: The function, called with keyword arguments only.
  """

  name: str
  description: str
  parameters: tuple[Parameter, ...]
  fn: Callable[..., Any]

  def parameter(self, name: str) -> Parameter | None:
    """The parameter called `name`, or None."""
    for parameter in self.parameters:
      if parameter.name == name:
        return parameter
    return None


def from_callable(fn: Callable[..., Any], name: str | None = None) -> Tool:
  """Describes `fn` as a tool from its signature and docstring.

  Args:
    fn: The function. Every parameter must be annotated with int, float, str
      or bool and may be passed by keyword; its docstring must have a first
      paragraph (the description).
    name: The tool's name; default: the function's `__name__`.

  Returns:
    The tool.

  Raises:
    ToolConfigError: naming the function (and parameter) at fault.
  """
  label = getattr(fn, '__qualname__', None) or repr(fn)
  if not callable(fn):
    raise ToolConfigError(f'{label} is not callable.')
  name = name or getattr(fn, '__name__', '')
  if not name.isidentifier() or keyword.iskeyword(name):
    raise ToolConfigError(
        f'Tool name {name!r} (for {label}) is not a Python identifier (or '
        'is a keyword); the model writes it as a call, e.g. '
        'lookup(city="Paris").')
  try:
    signature = inspect.signature(fn)
  except (TypeError, ValueError) as e:
    raise ToolConfigError(
        f'Cannot read the signature of {label}: {e}') from None
  try:
    hints = typing.get_type_hints(fn)
  except Exception as e:  # pylint: disable=broad-exception-caught
    raise ToolConfigError(
        f'Cannot resolve the type annotations of {label} '
        f'({type(e).__name__}: {e}).') from None
  description, arg_docs = parse_docstring(inspect.getdoc(fn) or '')
  if not description:
    raise ToolConfigError(
        f'{label} has no docstring; its first paragraph is the tool '
        'description shown to the model. Add one.')
  parameters = []
  for parameter in signature.parameters.values():
    where = f'{label}, parameter {parameter.name!r}'
    if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
      raise ToolConfigError(
          f'{where}: *args and **kwargs are not allowed; name every '
          'parameter.')
    if parameter.kind is parameter.POSITIONAL_ONLY:
      raise ToolConfigError(
          f'{where}: positional-only parameters are not allowed; tools are '
          'called with keyword arguments.')
    kind = hints.get(parameter.name)
    if kind is None:
      raise ToolConfigError(
          f'{where} has no type annotation; annotate it with int, float, '
          'str or bool.')
    if kind not in PARAMETER_TYPES:
      raise ToolConfigError(
          f'{where} is annotated {kind!r}; tool parameters must be int, '
          'float, str or bool.')
    if parameter.name not in arg_docs:
      logging.warning('Tool %s: parameter %r has no description in the '
                      "docstring's Args section.", name, parameter.name)
    parameters.append(Parameter(
        name=parameter.name, type=kind,
        required=parameter.default is parameter.empty,
        description=arg_docs.get(parameter.name, '')))
  return Tool(name=name, description=description,
              parameters=tuple(parameters), fn=fn)


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
  """Reads a Google-style docstring.

  Args:
    doc: The cleaned docstring (`inspect.getdoc`).

  Returns:
    (description, args): the first paragraph joined into one line, and each
    Args entry's description joined into one line, by parameter name.
  """
  lines = doc.expandtabs().splitlines()
  first = []
  for line in lines:
    if not line.strip():
      if first:
        break
      continue
    if _SECTION_RE.match(line.strip()) and not first:
      break
    first.append(line.strip())
  args = {}
  in_args = False
  section_indent = 0
  entry_indent = None
  current = None
  for line in lines:
    stripped = line.strip()
    indent = len(line) - len(line.lstrip())
    if not in_args:
      if stripped in ('Args:', 'Arguments:'):
        in_args, section_indent, entry_indent = True, indent, None
      continue
    if not stripped:
      continue
    if indent <= section_indent:  # The next section.
      break
    if entry_indent is None:
      entry_indent = indent
    match = _ARG_RE.match(stripped)
    if indent <= entry_indent and match:
      current = match.group(1)
      args[current] = match.group(2).strip()
    elif current is not None:
      args[current] = f'{args[current]} {stripped}'.strip()
  return ' '.join(first), args


BUILTINS: Mapping[str, Tool] = {
    'calculator': from_callable(calculator_lib.calculator),
}


def resolve(spec: str) -> tuple[Tool, ...]:
  """The tools named by the config's comma-separated list.

  Args:
    spec: For example 'calculator' or 'calculator,my_pkg.tools:lookup';
      built-in names (`BUILTINS`) or 'package.module:function'. Whitespace
      around entries is ignored; '' gives no tools.

  Returns:
    The tools, in the order given.

  Raises:
    ToolConfigError: with one message naming the bad entry and the fix: an
      empty entry, an unknown built-in, a module that does not import, a
      missing or non-callable attribute, an unusable function, or two tools
      with the same name.
  """
  if not isinstance(spec, str):
    raise ToolConfigError(
        f'{CONFIG_FIELD} must be a comma-separated string, got {spec!r}.')
  if not spec.strip():
    return ()
  tools = []
  seen = {}
  for position, raw in enumerate(spec.split(','), start=1):
    entry = raw.strip()
    if not entry:
      raise ToolConfigError(
          f'{CONFIG_FIELD}: entry {position} of {spec!r} is empty; remove '
          'the extra comma.')
    tool = _resolve_entry(entry)
    if tool.name in seen:
      raise ToolConfigError(
          f'{CONFIG_FIELD}: {entry!r} is a second tool named {tool.name!r} '
          f'(the first came from {seen[tool.name]!r}); list each tool once '
          'or rename one.')
    seen[tool.name] = entry
    tools.append(tool)
  return tuple(tools)


def import_callable(entry: str, field: str, error: type[Exception]):
  """The callable named 'package.module:name' by config field `field`.

  Raises:
    error: with one message naming the entry and the fix, for a malformed
      entry, a module that does not import, a missing attribute or one that
      is not callable.
  """
  module_name, _, attr = entry.partition(':')
  if not (all(p.isidentifier() for p in module_name.split('.'))
          and attr.isidentifier()):
    raise error(
        f'{field}: {entry!r} is not of the form "package.module:function".')
  try:
    module = importlib.import_module(module_name)
  except Exception as e:  # pylint: disable=broad-exception-caught
    raise error(
        f'{field}: cannot import {module_name!r} for {entry!r} '
        f'({type(e).__name__}: {e}). Check the module path, or that its '
        'package is installed.') from None
  if not hasattr(module, attr):
    raise error(
        f'{field}: module {module_name!r} has no attribute {attr!r} '
        f'(from {entry!r}). Check the function name after the colon.')
  fn = getattr(module, attr)
  if not callable(fn):
    raise error(
        f'{field}: {entry!r} is a {type(fn).__name__}, not a '
        'function. Name a function after the colon.')
  return fn


def _resolve_entry(entry: str) -> Tool:
  """The tool of one config entry."""
  if ':' not in entry:
    if entry in BUILTINS:
      return BUILTINS[entry]
    raise ToolConfigError(
        f'{CONFIG_FIELD}: unknown tool {entry!r}. Built-in tools: '
        f'{", ".join(sorted(BUILTINS))}; for your own function write '
        '"package.module:function".')
  fn = import_callable(entry, CONFIG_FIELD, ToolConfigError)
  attr = entry.partition(':')[2]
  try:
    return from_callable(fn, name=attr)
  except ToolConfigError as e:
    raise ToolConfigError(f'{CONFIG_FIELD}: {entry!r}: {e}') from None


def check_arguments(tool: Tool, arguments: Mapping[str, Any]) -> dict:
  """`arguments` checked against `tool`'s parameters, ints made floats.

  An int is accepted for a float parameter (and converted); a bool is
  never accepted for an int or float parameter, nor a float for an int.

  Args:
    tool: The tool called.
    arguments: The call's keyword arguments.

  Returns:
    The arguments to call `tool.fn` with.

  Raises:
    ToolArgumentError: with a short message for the model, on an unknown
      keyword, a missing required one, or a value of the wrong type.
  """
  if not isinstance(arguments, Mapping):
    raise ToolArgumentError(
        f'{tool.name} takes keyword arguments, e.g. {_example(tool)}')
  checked = {}
  for key, value in arguments.items():
    parameter = tool.parameter(key) if isinstance(key, str) else None
    if parameter is None:
      names = ', '.join(p.name for p in tool.parameters) or 'none'
      raise ToolArgumentError(
          f'{tool.name} has no parameter {key!r} (its parameters: {names})')
    checked[key] = _coerce(tool, parameter, value)
  missing = [p.name for p in tool.parameters
             if p.required and p.name not in checked]
  if missing:
    raise ToolArgumentError(
        f'{tool.name} needs {", ".join(repr(m) for m in missing)}, e.g. '
        f'{_example(tool)}')
  return checked


def _coerce(tool: Tool, parameter: Parameter, value: Any) -> Any:
  kind = parameter.type
  ok = False
  if kind is bool:
    ok = isinstance(value, bool)
  elif kind is int:
    ok = isinstance(value, int) and not isinstance(value, bool)
  elif kind is float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
      value = float(value)
  elif kind is str:
    ok = isinstance(value, str)
  if not ok:
    raise ToolArgumentError(
        f'{tool.name}: {parameter.name!r} must be {_TYPE_NAMES[kind]}, got '
        f'{_type_name(value)}')
  return value


def _type_name(value: Any) -> str:
  if isinstance(value, bool):
    return 'true or false'
  for kind, name in _TYPE_NAMES.items():
    if type(value) is kind:  # pylint: disable=unidiomatic-typecheck
      return name
  return {list: 'a list', dict: 'a dict', type(None): 'None'}.get(
      type(value), type(value).__name__)


# Placeholder values for example calls, by parameter type.
EXAMPLE_VALUES = {str: '...', int: 1, float: 1.5, bool: True}


def _example(tool: Tool) -> str:
  """A Python-style call of `tool` with placeholder required arguments."""
  arguments = ', '.join(f'{p.name}={EXAMPLE_VALUES[p.type]!r}'
                        for p in tool.parameters if p.required)
  return f'{tool.name}({arguments})'
