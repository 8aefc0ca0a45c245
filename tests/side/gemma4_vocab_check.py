"""Side check, not run by CI: Gemma 4's real tokenizer and chat template.

Needs a llama.cpp source tree (no build): the one vendored in the
llama-cpp-python sdist has what this reads, all written by llama.cpp from
Google's Hugging Face Gemma 4 repos:

  models/ggml-vocab-gemma-4.gguf       Gemma 4's vocabulary (no weights) and
                                       the chat template it shipped with
  models/ggml-vocab-gemma-4.gguf.inp   test texts, and the ids Hugging
  models/ggml-vocab-gemma-4.gguf.out   Face's tokenizer gives them
  models/templates/google-gemma-4-31B-it.jinja   the current chat template

  LLAMA_CPP=/path/to/llama.cpp python tests/side/gemma4_vocab_check.py

Checks, each printed with its count of mismatches (all 0 is a pass; the
exit status is 1 otherwise):
1. our tokenizer rebuilt from the GGUF gives the reference ids for every
   test text and decodes them back to the text;
2. the vocabulary it exports (pieces, merges, token types) equals the file's;
3. every control piece our Gemma 4 prompts and tool format write is one id;
4. our Gemma 4 prompts (chat and tools, thinking on and off, declarations
   of three tools: one with parameters declared out of alphabetical order,
   a capitalised and optional undescribed one, one without parameters)
   equal what the chat templates render for the same
   messages, and a tool episode's completion equals the template's model
   turn. Templates are rendered as Hugging Face renders them (Jinja's
   sandbox with trim_blocks and lstrip_blocks). The template inside the
   GGUF is an older version that writes no newline after <|think|>; that
   one difference is allowed for it.
"""
import json
import os
import sys

from jinja2 import sandbox

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))
# pylint: disable=g-import-not-at-top,wrong-import-position
from agent_tunix.agent import formats
from agent_tunix.agent import tools as tools_lib
from agent_tunix.data import prompts
from agent_tunix.models import tokenizer as tokenizer_lib

root = os.environ['LLAMA_CPP']
vocab_path = os.path.join(root, 'models', 'ggml-vocab-gemma-4.gguf')
failures = 0


def report(name, bad, total, example=''):
  global failures
  failures += bool(bad)
  print(f'{name}: {bad} of {total} differ' + (f' (first: {example})'
                                                 if bad else ''))


# 1. Reference ids.
tok = tokenizer_lib.load_gguf_tokenizer(vocab_path)
with open(vocab_path + '.inp', encoding='utf-8') as f:
  texts = f.read().split('\n__ggml_vocab_test__\n')
with open(vocab_path + '.out', encoding='utf-8') as f:
  wanted = [[int(t) for t in line.split()] for line in f.read().split('\n')]
bad = [(t, tok.encode(t), w) for t, w in zip(texts, wanted)
       if tok.encode(t) != w]
report('reference ids', len(bad), len(texts), bad[:1])
bad = [t for t in texts if tok.decode(tok.encode(t)) != t]
report('decode(encode(text)) == text', len(bad), len(texts), bad[:1])

# 2. The exported vocabulary.
source, written = tokenizer_lib.read_gguf_vocab(vocab_path), tok.gguf_vocab()
for field in ('tokens', 'merges'):
  mine, theirs = getattr(written, field), getattr(source, field)
  report(f'exported {field}', sum(a != b for a, b in zip(mine, theirs))
         + abs(len(mine) - len(theirs)), len(theirs))
report('exported token types',
       int((written.token_types != source.token_types).sum()),
       len(source.token_types))
report('special ids', sum(written.special_ids[k] != source.special_ids[k]
                          for k in source.special_ids), 4)

# 3. Control pieces are single ids.
pieces = set(formats.Gemma4Format.required_pieces) | {
    prompts.THINK, '<|channel>', '<channel|>'}
bad = [p for p in sorted(pieces) if len(tok.encode(p)) != 1]
report('pieces that are one id', len(bad), len(pieces), bad[:1])

# 4. Chat templates.
templates = {}
template_file = os.path.join(root, 'models', 'templates',
                             'google-gemma-4-31B-it.jinja')
with open(template_file, encoding='utf-8') as f:
  templates['google-gemma-4-31B-it.jinja'] = f.read()


def gguf_chat_template(path):
  import mmap  # pylint: disable=import-outside-toplevel
  from agent_tunix.models import gguf as gguf_lib  # pylint: disable=import-outside-toplevel
  with open(path, 'rb') as f, mmap.mmap(f.fileno(), 0,
                                        access=mmap.ACCESS_READ) as buf:
    parser = gguf_lib.MetadataParser(buf, path)
    for _ in range(parser.header()):
      key = parser.string()
      (value_type,) = parser.unpack('I')
      value = parser.value(value_type, key == 'tokenizer.chat_template')
      if key == 'tokenizer.chat_template':
        return value
  raise ValueError(f'{path}: no tokenizer.chat_template')


templates["the GGUF's tokenizer.chat_template"] = gguf_chat_template(
    vocab_path)
environment = sandbox.ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=['jinja2.ext.loopcontrols'])


def multiply(price: float, count: int, Label: str = 'total') -> str:  # pylint: disable=invalid-name
  """Multiplies a count by a price.

  Args:
    price: Price of one.
    count: How many.
  """
  return f'{Label}: {count * price}'


def today() -> str:
  """Today's date."""
  return '2026-11-26'


_SCHEMA_TYPES = {int: 'integer', float: 'number', str: 'string',
                 bool: 'boolean'}


def schema(tool):
  """The OpenAI-style function declaration chat templates read."""
  properties = {}
  for p in tool.parameters:
    properties[p.name] = {'type': _SCHEMA_TYPES[p.type]}
    if p.description:
      properties[p.name]['description'] = p.description
  return {'type': 'function', 'function': {
      'name': tool.name, 'description': tool.description,
      'parameters': {'type': 'object', 'properties': properties,
                     'required': [p.name for p in tool.parameters
                                  if p.required]}}}


gemma4 = formats.get('gemma4')
calculator = tools_lib.resolve('calculator')
both = calculator + (tools_lib.from_callable(multiply),
                     tools_lib.from_callable(today))
system_prompt = 'Answer in <answer></answer> tags.'
question = 'A van carries 312 crates of 24 cans. How many cans?'
calls = [formats.Call('calculator', {'expression': '312 * 24'}),
         formats.Call('multiply', {'price': 0.5, 'count': 7, 'Label': 'x'})]
results = ['7488', 'x: 3.5']
answer = '<answer>7488</answer>'
episode = (gemma4.render_calls(calls) + gemma4.call_end
           + gemma4.render_results([formats.Result(c.name, r)
                                    for c, r in zip(calls, results)]) + answer)
history = [{'role': 'assistant', 'content': answer,
            'tool_calls': [{'type': 'function', 'function': {
                'name': c.name, 'arguments': c.arguments}} for c in calls],
            'tool_responses': [{'name': c.name, 'response': r}
                               for c, r in zip(calls, results)]}]

cases = []  # (name, messages, tools, thinking, ours, generation prompt)
for thinking in (False, True):
  for system in ('', system_prompt):
    messages = ([{'role': 'system', 'content': system}] if system else []
                ) + [{'role': 'user', 'content': question}]
    cases.append((f'chat, thinking={thinking}, system={bool(system)}',
                  messages, None, thinking,
                  prompts.chat_prompt(question, system, turns='gemma4',
                                      thinking=thinking), True))
  for name, tools in (('calculator', calculator),
                      ('calculator+multiply+today', both)):
    messages = [{'role': 'system', 'content': system_prompt},
                {'role': 'user', 'content': question}]
    ours = prompts.tools_prompt(question, system_prompt, gemma4, tools,
                                few_shot=False, thinking=thinking,
                                no_thoughts=not thinking)
    cases.append((f'tools {name}, thinking={thinking}', messages,
                  [schema(t) for t in tools], thinking, ours, True))
# The whole episode: the template's model turn after the prompt holds the
# calls, the results and the answer, as our rollout writes them (the empty
# thought block belongs to the generation prompt only).
prompt = prompts.tools_prompt(question, system_prompt, gemma4, both,
                              few_shot=False)
cases.append(('tool episode', [{'role': 'system', 'content': system_prompt},
                               {'role': 'user', 'content': question}]
              + history, [schema(t) for t in both], False,
              prompt + episode + gemma4.turn_end + '\n', False))

for label, text in templates.items():
  template = environment.from_string(text)
  bad = []
  for name, messages, tools, thinking, ours, generation in cases:
    rendered = template.render(
        messages=messages, tools=tools, bos_token='',
        add_generation_prompt=generation, enable_thinking=thinking)
    if label.startswith('the GGUF'):
      # An older version of the template: no newline after <|think|>.
      ours = ours.replace(prompts.THINK_LINE, prompts.THINK)
    if rendered != ours:
      bad.append(f'{name}: template {json.dumps(rendered)} ours '
                 f'{json.dumps(ours)}')
  report(f'prompts vs {label}', len(bad), len(cases), '\n  '.join(bad))

sys.exit(1 if failures else 0)
