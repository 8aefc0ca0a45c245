"""Prompt templates: Gemma chat turns and a plain few-shot prompt.

`data.template` picks one:
  * 'chat': the Gemma turn format, for instruction-tuned (`*_it`) presets:

      <start_of_turn>user
      {system_prompt}

      {question}<end_of_turn>
      <start_of_turn>model

  * 'plain': for pretrained presets, which know no turn markers. The system
    prompt, the worked examples of data.few_shot (`few_shot`: by default
    two built-in arithmetic ones for synthetic and GSM8K data, none for a
    user's own files) in the exact answer format
    `<reasoning>...</reasoning><answer>...</answer>`, then the question and
    'Answer:' followed by a newline, so the natural continuation starts with
    `<reasoning>`. (A newline rather than a trailing space keeps the
    continuation tokenised the same way as in the examples.)
  * 'auto': 'chat' when model.preset ends with '_it', else 'plain'.

The turns are those of the model's family, which the caller names
(`turns`: the family's `tool_format`, an `agent.formats` name; this package
does not import models/). Gemma 4's have their own markers and give the
system prompt its own turn, as Gemma 4's chat template does
(tests/side/gemma4_vocab_check.py renders that template and compares):

      <|turn>system
      {system_prompt}<turn|>
      <|turn>user
      {question}<turn|>
      <|turn>model
      <|channel>thought
      <channel|>

Thinking is off unless `data.thinking` is true: with 'chat' the model turn
then opens with an empty thought block (the last two lines above), as the
template writes it for thinking off. `data.thinking` puts `<|think|>` and a
newline at the start of the system turn and leaves out the empty block; the
model then writes its thoughts in a `<|channel>thought ... <channel|>`
block, which rewards do not see unless `rewards.see_thoughts` is true
(`strip_thoughts`).

Where a completion ends (`generation.stop_sequences='auto'`): with 'chat',
at `<end_of_turn>` (an end token; no stop text needed); with 'plain', at
the start of the next few-shot example (`TEMPLATE_STOP_SEQUENCES`): a
pretrained model that has answered goes on with the next 'Question:'.

With tools (`agent.tools`), prompts are Gemma chat turns in either template,
since calls and results are turns (`agent_tunix.agent.formats`): the system
prompt and the format's tool instructions open the first user turn (or a
turn of the format's system role). 'plain' (pretrained presets) puts three
worked episodes before the question, each a calculator call, its result and
the final answer (`TOOL_FEW_SHOT_EXAMPLES`; only when the calculator is one
of the tools and data.few_shot is 'arithmetic', as 'auto' is for synthetic
and GSM8K data), after a short tool list in place of the system prompt and
the format's instructions (the episodes show both); 'chat' gives the
instructions alone. Every model turn ends at `<end_of_turn>`, so no stop
text is needed.
"""

import functools
import re

from agent_tunix.agent import formats
from agent_tunix.agent import tools as tools_lib
from agent_tunix.data import few_shot as few_shot_lib

TEMPLATES = ('auto', 'chat', 'plain')

# The built-in worked examples of the plain template: (question, reasoning,
# answer). Kept short: with digits tokenised one by one, the plain prompt's
# fixed part must leave room for the question within
# generation.max_prompt_length. data.few_shot picks which examples a run
# shows (`few_shot.examples`).
FEW_SHOT_EXAMPLES = few_shot_lib.ARITHMETIC


# Worked tool episodes for the few-shot prompt with tools: (question,
# calls as (tool, arguments), their results, reasoning, answer). One call
# each, with a whole expression, in three shapes (a + b * c - d,
# a * b + c * d, a * b * c - d), kept short (small numbers, a terse final
# turn) so that the 270M preset's prompts fit 424 tokens. Measured with
# greedy episodes of the 270M on 96 held-out difficulty-4 problems: 8.3% with
# the first two of these, 20.8% with all three; two longer examples in the
# first two shapes gave 12.5% (they solve only the a * b + c * d problems),
# and one example alone let the model copy its numbers into answers.
TOOL_FEW_SHOT_EXAMPLES = (
    (
        'Mia has 125 cards. She buys 4 packs of 25 cards, then gives 38 '
        'away. How many cards are left?',
        (('calculator', {'expression': '125 + 4 * 25 - 38'}),),
        ('187',),
        '187 cards.',
        '187',
    ),
    (
        'A car goes 64 km per hour for 3 hours, then 58 km per hour for 9 '
        'hours. How far does it go?',
        (('calculator', {'expression': '64 * 3 + 58 * 9'}),),
        ('714',),
        '714 km.',
        '714',
    ),
    (
        'Sam earns $35 an hour, 8 hours a day for 12 days, and pays $900 '
        'rent. How many dollars are left?',
        (('calculator', {'expression': '35 * 8 * 12 - 900'}),),
        ('2460',),
        '2460 dollars.',
        '2460',
    ),
)


def few_shot_tool_instructions(tools):
  """The short tool list that opens a few-shot tool prompt: one line per
  tool (its signature and the first line of its description); the worked
  episodes show how calls and answers are written."""
  lines = ['Tools (each result comes back in the next turn):']
  for tool in tools:
    signature = ', '.join(p.name for p in tool.parameters)
    lines.append(f'{tool.name}({signature}): '
                 f'{tool.description.splitlines()[0]}')
  return '\n'.join(lines)


# Stop texts per resolved template: what starts the next example.
TEMPLATE_STOP_SEQUENCES = {'chat': (), 'plain': ('\nQuestion:',)}


def format_answer(reasoning, answer):
  """Returns a completion in the exact target format."""
  return f'<reasoning>{reasoning}</reasoning><answer>{answer}</answer>'


def resolve_template(config):
  """Returns 'chat' or 'plain' for a config (resolving 'auto').

  Args:
    config: The full config; reads data.template and model.preset.

  Raises:
    ValueError: on an unknown data.template.
  """
  template = config.data.template
  if template not in TEMPLATES:
    raise ValueError(
        f'Unknown data.template {template!r}; expected one of {TEMPLATES}.'
    )
  if template == 'auto':
    return 'chat' if config.model.preset.endswith('_it') else 'plain'
  return template


THINK = '<|think|>'
# What opens a Gemma 4 system turn with thinking on, and what opens its
# model turn with thinking off (an empty thought block).
THINK_LINE = THINK + '\n'
NO_THOUGHTS = '<|channel>thought\n<channel|>'
_THOUGHT = re.compile(r'<\|channel>thought.*?(?:<channel\|>|$)', re.DOTALL)


def strip_thoughts(text):
  """`text` without Gemma 4 thought blocks (an unclosed one to the end)."""
  return _THOUGHT.sub('', text)


def scored_texts(texts, config):
  """What rewards and evaluation read of completions `texts`.

  With Gemma 4 thinking on (`data.thinking`), the thought blocks are removed
  unless `rewards.see_thoughts`; otherwise the texts as they are.
  """
  if not config.data.thinking or config.rewards.see_thoughts:
    return list(texts)
  return [strip_thoughts(t) for t in texts]


def chat_prompt(question, system_prompt, turns='gemma3', thinking=False):
  """Formats one user turn and opens the model turn.

  In the turns of the `agent.formats` format named `turns` (the model
  family's). Gemma 3's have no system role: the system prompt opens the
  user turn. Gemma 4's give it a system turn, where `thinking` adds the
  `<|think|>` switch; without it the model turn opens with an empty thought
  block. Gemma 4's texts are stripped of surrounding whitespace, as its
  template does.
  """
  turn_format = formats.get(turns)
  start, end = turn_format.turn_start, turn_format.turn_end
  if turn_format.system_role == 'user':
    user = f'{system_prompt}\n\n{question}' if system_prompt else question
    return f'{start}user\n{user}{end}\n{start}model\n'
  system = system_prompt.strip()
  parts = []
  if system or thinking:
    think = THINK_LINE if thinking else ''
    parts.append(f'{start}{turn_format.system_role}\n{think}{system}{end}\n')
  parts.append(f'{start}user\n{question.strip()}{end}\n{start}model\n')
  if not thinking:
    parts.append(NO_THOUGHTS)
  return ''.join(parts)


def plain_prompt(question, system_prompt, examples=FEW_SHOT_EXAMPLES):
  """Formats the few-shot prompt ending where the model's answer begins.

  `examples`: the worked (question, reasoning, answer) examples shown
  first (`few_shot.examples(config)` gives a run's; () = none).
  """
  parts = [system_prompt] if system_prompt else []
  for shot_question, reasoning, answer in examples:
    parts.append(
        f'Question: {shot_question}\nAnswer:\n'
        + format_answer(reasoning, answer)
    )
  parts.append(f'Question: {question}\nAnswer:\n')
  return '\n\n'.join(parts)


@functools.lru_cache(maxsize=8)
def _tools_and_format(spec, format_name):
  return tools_lib.resolve(spec), formats.get(format_name)


def tools_prompt(question, system_prompt, tool_format, tools, few_shot,
                 thinking=False, no_thoughts=False):
  """Chat turns for a tool-using episode, ending where the model begins.

  The turn markers are the format's (Gemma 3's, or Gemma 4's for 'gemma4').

  Args:
    question: The problem text.
    system_prompt: Instruction text ('' = none).
    tool_format: an `agent.formats.ToolFormat`.
    tools: the `agent.tools.Tool`s the model may call.
    few_shot: add `TOOL_FEW_SHOT_EXAMPLES` as earlier turns.
    thinking: open the system turn with Gemma 4's `<|think|>` (a format
      with a system role only).
    no_thoughts: open the model turn with Gemma 4's empty thought block.
  """
  if few_shot:
    # The worked episodes show the answer format, so the system prompt and
    # the format's long instructions give way to a short tool list: the
    # 270M preset's prompts then fit 424 tokens (see TOOL_FEW_SHOT_EXAMPLES).
    intro = few_shot_tool_instructions(tools)
  else:
    intro = tool_format.instructions_joiner.join(
        p for p in (system_prompt, tool_format.instructions(tools)) if p)
  start, end = tool_format.turn_start, tool_format.turn_end
  turns = []
  if tool_format.system_role != 'user':
    think = THINK_LINE if thinking else ''
    turns.append(f'{start}{tool_format.system_role}\n{think}{intro}{end}\n')
    intro = ''
  questions = []
  for shot_question, calls, results, reasoning, answer in (
      TOOL_FEW_SHOT_EXAMPLES if few_shot else ()):
    questions.append((shot_question, tool_format.example_turns(
        calls, results, format_answer(reasoning, answer))))
  if start == formats.GEMMA4_START_OF_TURN:
    question = question.strip()  # As Gemma 4's template does.
  questions.append((question, None))
  for text, model_side in questions:
    user = f'{intro}\n\n{text}' if intro else text
    intro = ''
    turns.append(f'{start}user\n{user}{end}\n{start}model\n')
    if model_side is not None:
      turns.append(f'{model_side}{end}\n')
  if no_thoughts:
    turns.append(NO_THOUGHTS)
  return ''.join(turns)


def format_prompt(question, config, turns):
  """Returns the model input for `question` under the configured template.

  Args:
    question: The problem text.
    config: The full config; reads data.template, data.system_prompt,
      model.preset and agent.tools / agent.format.
    turns: the `agent.formats` name of the model family's turns (its
      `families.Family.tool_format`), for the chat template without tools.
  """
  system_prompt = config.data.system_prompt.strip()
  template = resolve_template(config)
  if config.agent.tools:
    tools, tool_format = _tools_and_format(config.agent.tools,
                                           config.agent.format)
    few_shot = (template == 'plain'
                and few_shot_lib.kind(config) == 'arithmetic'
                and any(t.name == 'calculator' for t in tools))
    # Gemma 4's chat template opens the model turn with an empty thought
    # block when thinking is off; the pretrained few-shot prompt does not.
    no_thoughts = (template == 'chat' and not config.data.thinking
                   and tool_format.turn_start == formats.GEMMA4_START_OF_TURN)
    return tools_prompt(question, system_prompt, tool_format, tools,
                        few_shot, thinking=config.data.thinking,
                        no_thoughts=no_thoughts)
  if template == 'chat':
    return chat_prompt(question, system_prompt, turns=turns,
                       thinking=config.data.thinking)
  return plain_prompt(question, system_prompt,
                      few_shot_lib.examples(config))
