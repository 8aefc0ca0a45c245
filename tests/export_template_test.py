"""Tests for agent_tunix.export_template: the chat template of an export.

Rendered with transformers' own renderer (the one `apply_chat_template`
uses), with Gemma's BOS; each rendering must be exactly what the trainer
builds (data.prompts.format_prompt with BOS in front), and a tool episode
exactly what a rollout holds (the worked episodes' `example_turns`).
tests/export_test.py checks the same on exported directories.
"""

import dataclasses
import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# pylint: disable=g-import-not-at-top
import jinja2
import pytest
from transformers.utils import chat_template_utils

from agent_tunix import export_template
from agent_tunix.agent import formats
from agent_tunix.configs import gemma3_270m
from agent_tunix.configs import gemma3_270m_tools
from agent_tunix.configs import tiny
from agent_tunix.configs import tiny_gemma4
from agent_tunix.data import prompts
from agent_tunix.models import families
# pylint: enable=g-import-not-at-top

_QUESTION = 'Tom has 12 apples and eats 5. How many are left?'


def _render(config, messages, add_generation_prompt=True):
  rendered, _ = chat_template_utils.render_jinja_template(
      [messages], chat_template=export_template.chat_template(config),
      add_generation_prompt=add_generation_prompt, bos_token='<bos>')
  return rendered[0]


def _trained(config, question=_QUESTION):
  turns = families.of_preset(config.model.preset).tool_format
  return '<bos>' + prompts.format_prompt(question, config, turns)


_CONFIGS = {
    'chat': lambda: tiny.get_config(),
    'plain': lambda: tiny.get_config('data.template=plain'),
    'tools': lambda: tiny.get_config('agent.tools=calculator'),
    'plain_tools': lambda: tiny.get_config(
        'data.template=plain,agent.tools=calculator'),
    'default_preset': gemma3_270m.get_config,
    'tools_preset': gemma3_270m_tools.get_config,
    'gemma4_chat': lambda: tiny_gemma4.get_config(),
    'gemma4_tools': lambda: tiny_gemma4.get_config('agent.tools=calculator'),
    'functiongemma_tools': lambda: tiny.get_config(
        'agent.tools=calculator,agent.format=functiongemma'),
}


@pytest.mark.parametrize('name', sorted(_CONFIGS))
def test_a_user_message_gets_the_training_prompt(name):
  config = _CONFIGS[name]()
  messages = [{'role': 'user', 'content': _QUESTION}]
  assert _render(config, messages) == _trained(config)
  parts = export_template.prompt_parts(config)
  # The mapping, explicitly: head, the question, the end of the user's
  # text, and the generation prompt, which only add_generation_prompt adds.
  assert _trained(config) == ('<bos>' + parts.head + _QUESTION
                              + parts.user_end + parts.generation)
  assert _render(config, messages, add_generation_prompt=False) == (
      '<bos>' + parts.head + _QUESTION + parts.user_end)


def test_the_generation_prompt_of_each_prompt_shape():
  generation = {name: export_template.prompt_parts(_CONFIGS[name]()).generation
                for name in ('chat', 'plain', 'tools', 'gemma4_chat')}
  assert generation == {
      'chat': '<start_of_turn>model\n',
      'plain': '\nAnswer:\n',
      'tools': '<start_of_turn>model\n',
      'gemma4_chat': '<|turn>model\n<|channel>thought\n<channel|>',
  }
  thinking = tiny_gemma4.get_config()
  thinking.data.thinking = True
  assert export_template.prompt_parts(thinking).generation == (
      '<|turn>model\n')
  assert _render(thinking, [{'role': 'user', 'content': _QUESTION}]) == (
      _trained(thinking))


def test_the_template_follows_the_prompt_builder():
  """A changed system prompt or few-shot text changes the template: it is
  the builder's output, not a copy of it."""
  config = gemma3_270m.get_config()
  config.data.system_prompt = 'Think {{ step }} by step.'
  assert _render(config, [{'role': 'user', 'content': _QUESTION}]) == (
      _trained(config))
  assert 'Think {{ step }} by step.' in _render(
      config, [{'role': 'user', 'content': 'x'}])


@pytest.mark.parametrize('name', ['tools', 'tools_preset', 'gemma4_tools',
                                  'functiongemma_tools'])
@pytest.mark.parametrize('calls', [1, 2])
def test_a_tool_episode_is_what_the_rollout_holds(name, calls):
  config = _CONFIGS[name]()
  tool_format = formats.get(config.agent.format)
  call_list = [('calculator', {'expression': f'{i + 2} * 3'})
               for i in range(calls)]
  results = [str((i + 2) * 3) for i in range(calls)]
  answer = prompts.format_answer('Done.', '6')
  call_text = tool_format.render_calls(
      [formats.Call(n, a) for n, a in call_list])
  messages = ([{'role': 'user', 'content': _QUESTION},
               {'role': 'assistant', 'content': call_text}]
              + [{'role': 'tool', 'content': r} for r in results])
  episode = _trained(config) + tool_format.example_turns(
      call_list, results, '')
  # After the results the model writes next: its generation prompt is
  # what the format inserts, whatever add_generation_prompt says.
  assert _render(config, messages) == episode
  assert _render(config, messages, add_generation_prompt=False) == episode
  finished = messages + [{'role': 'assistant', 'content': answer}]
  assert _render(config, finished) == (
      episode + answer + tool_format.turn_end + '\n')


def test_tool_messages_take_their_name():
  config = tiny.get_config('agent.tools=calculator')
  tool_format = formats.get(config.agent.format)
  messages = [{'role': 'user', 'content': _QUESTION},
              {'role': 'assistant', 'content': '[a(), b()]'},
              {'role': 'tool', 'content': '1', 'name': 'a'},
              {'role': 'tool', 'content': '2', 'name': 'b'}]
  assert _render(config, messages).endswith(tool_format.render_results(
      [formats.Result('a', '1'), formats.Result('b', '2')]))


def test_a_system_message_goes_before_the_question():
  for name in ('chat', 'plain', 'gemma4_chat'):
    config = _CONFIGS[name]()
    messages = [{'role': 'system', 'content': 'Be brief.'},
                {'role': 'user', 'content': _QUESTION}]
    assert _render(config, messages) == _trained(
        config, 'Be brief.\n\n' + _QUESTION)


def test_a_later_user_turn_and_a_chat_answer():
  config = tiny.get_config()
  messages = [{'role': 'user', 'content': _QUESTION},
              {'role': 'assistant', 'content': '7'},
              {'role': 'user', 'content': 'And 3 more?'}]
  assert _render(config, messages) == (
      _trained(config) + '7<end_of_turn>\n<start_of_turn>user\n'
      'And 3 more?<end_of_turn>\n<start_of_turn>model\n')


@pytest.mark.parametrize('name, messages, error', [
    ('plain', [{'role': 'user', 'content': 'a'},
               {'role': 'assistant', 'content': 'b'},
               {'role': 'user', 'content': 'c'}], 'after the answer'),
    ('plain', [{'role': 'user', 'content': 'a'},
               {'role': 'user', 'content': 'c'}], 'user message after'),
    ('chat', [{'role': 'user', 'content': 'a'},
              {'role': 'tool', 'content': '1'}], 'outside a tool run'),
    ('chat', [{'role': 'assistant', 'content': 'a'}], 'before the question'),
    ('chat', [{'role': 'user', 'content': 'a'},
              {'role': 'critic', 'content': 'b'}], 'another role'),
])
def test_what_the_template_cannot_write_is_refused(name, messages, error):
  with pytest.raises(jinja2.exceptions.TemplateError, match=error):
    _render(_CONFIGS[name](), messages)


def test_several_tools_need_named_results():
  # A run of several tools has no default name for a result.
  parts = dataclasses.replace(export_template.prompt_parts(
      tiny.get_config('agent.tools=calculator')), tool_name=None)
  messages = [{'role': 'user', 'content': _QUESTION},
              {'role': 'assistant', 'content': '[a(), b()]'},
              {'role': 'tool', 'content': '1'},
              {'role': 'tool', 'content': '2'}]
  with pytest.raises(jinja2.exceptions.TemplateError, match='name of its'):
    chat_template_utils.render_jinja_template(
        [messages], chat_template=export_template.template_from_parts(parts),
        bos_token='<bos>')
