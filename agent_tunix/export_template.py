"""The chat template an export carries: the run's own training prompt.

Every merged Hugging Face export (tokenizer_config.json `chat_template`) and
every GGUF export (`tokenizer.chat_template`) carries `chat_template(config)`,
so that a server's chat endpoint (llama.cpp, vLLM) or transformers'
`apply_chat_template` builds the prompt the policy was trained on, without
this package. The template is made from the prompt builder's own output
(`data.prompts.format_prompt`) for a sentinel question: the text around the
sentinel is written as Jinja literals and the sentinel becomes the user's
message, so whatever the run's prompt is (chat turns, the few-shot plain
prompt of a pretrained preset, the tool list and worked episodes of a tool
run), the template writes it.

How messages map onto the training prompt (`PromptParts`):
  * The first user message is the question: `head`, its text, `user_end`;
    with `add_generation_prompt`, or before an assistant message, then
    `generation`: '<start_of_turn>model\\n' (Gemma 4: '<|turn>model\\n',
    and its empty thought block unless the run thinks) for chat turns and
    tool runs; for the plain prompt 'Answer:' and a newline after the
    question, the whole text after it. The run's `data.system_prompt` is in
    `head` already: a system message the client sends goes before the
    question, joined by a blank line.
  * An assistant message is the model's text as it wrote it (a call list
    included), then `call_end` when tool messages follow, else `turn_end`
    and a newline.
  * Tool messages (a tool run only) are the results of the calls before
    them, rendered as the run's tool-call format inserts them
    (`ToolFormat.render_results`): one result alone, or several, each with
    the tool's name (the message's `name`; the run's tool if it has one).
  * A later user message opens a new user turn (turn formats only).
Gemma 4's builder strips the question; the template then trims it too.
What cannot be written (a tool message outside a tool run, any turn after
the question of the plain prompt, an unknown role) raises an exception in
the template, naming the message.
"""

import dataclasses
import json

from agent_tunix.agent import formats
from agent_tunix.agent import tools as tools_lib
from agent_tunix.data import prompts
from agent_tunix.models import families

# Stand-ins for the user's text and a tool result's name and text: what
# the builders write around them is the template's literal text.
QUESTION = 'AGENT-TUNIX-QUESTION-SLOT'
NAME = 'AGENT-TUNIX-NAME-SLOT'
TEXT = 'AGENT-TUNIX-TEXT-SLOT'


class TemplateError(ValueError):
  """The run's prompt cannot be written as a chat template."""


@dataclasses.dataclass(frozen=True)
class ResultParts:
  """A tool format's result turn as literal text around name/text slots.

  `one` renders a single result; several are `first`, then `item` for
  each, joined by `separator`, then `last` (a format may write the name
  only when there are several). Each text is a list of literals and the
  slot names 'name' and 'text' (`_Slot`).
  """

  one: tuple
  first: tuple
  item: tuple
  separator: tuple
  last: tuple


@dataclasses.dataclass(frozen=True)
class PromptParts:
  """The run's training prompt, cut where the user's messages go.

  `format_prompt(q) == head + q + user_end + generation` (q stripped when
  `trim`). Turn formats (chat and tool runs) also have `user_open` (a
  later user turn), `turn_end`, and for tool runs `call_end` and `results`;
  None means the template refuses that kind of message.
  """

  kind: str  # 'chat', 'plain' or 'tools'
  head: str
  user_end: str
  generation: str
  trim: bool
  user_open: str | None = None
  turn_end: str = ''
  call_end: str | None = None
  results: ResultParts | None = None
  tool_name: str | None = None  # The name of a run's only tool.


class _Slot(str):
  """A slot (a Jinja variable) among literal texts."""


def _split(text, slots):
  """`text` as a tuple of literals and `_Slot`s, cut at each slot."""
  pieces = [text]
  for sentinel, name in slots.items():
    cut = []
    for piece in pieces:
      if isinstance(piece, _Slot):
        cut.append(piece)
        continue
      parts = piece.split(sentinel)
      for i, part in enumerate(parts):
        if i:
          cut.append(_Slot(name))
        cut.append(part)
    pieces = cut
  return tuple(p for p in pieces if p)


def _turn_format(config):
  if config.agent.tools:
    return formats.get(config.agent.format)
  if prompts.resolve_template(config) == 'chat':
    return formats.get(families.of_preset(config.model.preset).tool_format)
  return None


def _build(config, question):
  turns = families.of_preset(config.model.preset).tool_format
  return prompts.format_prompt(question, config, turns)


def _result_parts(tool_format):
  """`ResultParts` of a format, from its own renderings of 1, 2, 3."""
  def render(*pairs):
    return tool_format.render_results(
        [formats.Result(n, t) for n, t in pairs])
  slots = {NAME: 'name', TEXT: 'text'}
  named = [(f'{NAME}{i}', f'{TEXT}{i}') for i in range(3)]
  two = render(*named[:2])
  spans = []
  for name, text in named[:2]:
    found = [two.find(name), two.find(text)]
    if min(found) < 0:
      raise TemplateError(
          f'tool format {tool_format.name!r} drops a name or text of '
          'several results; its results cannot be a chat template.')
    spans.append((min(found), max(found[0] + len(name),
                                  found[1] + len(text))))
  (a1, b1), (a2, b2) = spans
  item = two[a1:b1].replace(named[0][0], NAME).replace(named[0][1], TEXT)
  parts = ResultParts(
      one=_split(render((NAME, TEXT)), slots), first=_split(two[:a1], slots),
      item=_split(item, slots), separator=_split(two[b1:a2], slots),
      last=_split(two[b2:], slots))
  three = two[:a1] + two[b1:a2].join(
      item.replace(NAME, n).replace(TEXT, t) for n, t in named) + two[b2:]
  if three != render(*named):
    raise TemplateError(
        f'tool format {tool_format.name!r} renders three results unlike '
        'two; its results cannot be a chat template.')
  return parts


def prompt_parts(config):
  """The `PromptParts` of a run's config (its builder's own output).

  Raises:
    TemplateError: the prompt does not hold the question once as it is
      (or stripped), so no template can write it.
  """
  prompt = _build(config, QUESTION)
  if prompt.count(QUESTION) != 1:
    raise TemplateError(
        f'the prompt of data.template={config.data.template!r} holds the '
        f'question {prompt.count(QUESTION)} times, not once.')
  head, tail = prompt.split(QUESTION)
  trim = _build(config, f' {QUESTION} ') == prompt
  other = 'AGENT-TUNIX-CHECK'
  if _build(config, other) != head + other + tail:
    raise TemplateError('the prompt changes with the question beyond the '
                        'question itself; no chat template can write it.')
  tool_format = _turn_format(config)
  if tool_format is None:
    return PromptParts('plain', head, '', tail, trim)
  opening = f'{tool_format.turn_start}model\n'
  at = tail.rfind(opening)
  if at < 0:
    raise TemplateError(f'the prompt does not end in a model turn '
                        f'({opening!r}).')
  kind = 'tools' if config.agent.tools else 'chat'
  tools = tools_lib.resolve(config.agent.tools) if config.agent.tools else ()
  return PromptParts(
      kind, head, tail[:at], tail[at:], trim,
      user_open=f'{tool_format.turn_start}user\n',
      turn_end=f'{tool_format.turn_end}\n',
      call_end=tool_format.call_end if tools else None,
      results=_result_parts(tool_format) if tools else None,
      tool_name=tools[0].name if len(tools) == 1 else None)


def _literal(text):
  """A Jinja string literal of `text` (JSON's escapes are Jinja's)."""
  return json.dumps(text, ensure_ascii=False)


def _expression(pieces):
  """A Jinja expression joining literals and slot variables."""
  return ' + '.join(p if isinstance(p, _Slot) else _literal(p)
                    for p in pieces) or "''"


def _refuse(what):
  return '{{ raise_exception(' + _literal(
      f'{what}: this template writes only the prompt shape the policy was '
      'trained on') + ') }}'


def _tool_branch(parts):
  """The Jinja for one tool message, within a run of them."""
  r = parts.results
  if r is None:
    return _refuse('a tool message outside a tool run')
  default = (_literal(parts.tool_name) if parts.tool_name else
             "raise_exception('give each tool message the name of its tool')")
  name = ("{%- set name = message['name'] if message['name'] is defined "
          f"and message['name'] else {default} -%}}")
  return (
      "{%- set text = message['content'] or '' -%}"
      "{%- if previous != 'tool' and following != 'tool' -%}"
      + (name if 'name' in r.one else '') +
      f"{{{{ {_expression(r.one)} }}}}"
      "{%- else -%}" + name +
      f"{{%- if previous != 'tool' -%}}{{{{ {_expression(r.first)} }}}}"
      f"{{%- else -%}}{{{{ {_expression(r.separator)} }}}}{{%- endif -%}}"
      f"{{{{ {_expression(r.item)} }}}}"
      f"{{%- if following != 'tool' -%}}{{{{ {_expression(r.last)} }}}}"
      "{%- endif -%}"
      "{%- endif -%}")


def template_from_parts(parts):
  """The Jinja chat template of `PromptParts` (see the module doc)."""
  content = "(message['content'] or '')"
  trim = ' | trim' if parts.trim else ''
  question = f"(pending.system + {content}){trim}"
  later_user = (
      f"{{{{ {_literal(parts.user_open)} + {content}{trim} + "
      f"{_literal(parts.user_end)} }}}}"
      if parts.user_open is not None
      else _refuse('a user message after the question'))
  assistant = (
      f"{{{{ {content} + ({_literal(parts.call_end)} if following == 'tool' "
      f"else {_literal(parts.turn_end)}) }}}}"
      if parts.call_end is not None
      else f"{{{{ {content} + {_literal(parts.turn_end)} }}}}")
  if parts.kind == 'plain':
    assistant = ("{%- if following -%}" + _refuse(
        'a message after the answer') + "{%- endif -%}{{ " + content + " }}")
  return (
      "{{ bos_token }}"
      "{%- set pending = namespace(system='', asked=false) -%}"
      "{%- for message in messages -%}"
      "{%- set role = message['role'] -%}"
      "{%- set previous = messages[loop.index0 - 1]['role'] "
      "if not loop.first else '' -%}"
      "{%- set following = messages[loop.index0 + 1]['role'] "
      "if not loop.last else '' -%}"
      "{%- if role == 'system' and not pending.asked -%}"
      "{%- set pending.system = pending.system + "
      f"{content} + '\\n\\n' -%}}"
      "{%- elif role == 'user' -%}"
      "{%- if pending.asked -%}" + later_user + "{%- else -%}"
      f"{{{{ {_literal(parts.head)} + {question} + "
      f"{_literal(parts.user_end)} }}}}"
      "{%- set pending.asked = true -%}{%- endif -%}"
      "{%- if following == 'assistant' or (loop.last and "
      "add_generation_prompt) -%}"
      f"{{{{ {_literal(parts.generation)} }}}}{{%- endif -%}}"
      "{%- elif not pending.asked -%}"
      + _refuse('a message before the question') +
      "{%- elif role == 'assistant' -%}" + assistant +
      "{%- elif role == 'tool' -%}" + _tool_branch(parts) +
      "{%- else -%}" + _refuse('a message of another role') +
      "{%- endif -%}"
      "{%- endfor -%}")


def chat_template(config):
  """The Jinja chat template of a run's training prompt."""
  return template_from_parts(prompt_parts(config))
