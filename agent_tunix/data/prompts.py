"""Prompt templates: Gemma chat turns and a plain few-shot prompt.

`data.template` picks one:
  * 'chat': the Gemma turn format, for instruction-tuned (`*_it`) presets:

      <start_of_turn>user
      {system_prompt}

      {question}<end_of_turn>
      <start_of_turn>model

  * 'plain': for pretrained presets, which know no turn markers. The system
    prompt, two fixed worked examples in the exact answer format
    `<reasoning>...</reasoning><answer>...</answer>`, then the question and
    'Answer:' followed by a newline, so the natural continuation starts with
    `<reasoning>`. (A newline rather than a trailing space keeps the
    continuation tokenised the same way as in the examples.)
  * 'auto': 'chat' when model.preset ends with '_it', else 'plain'.

Where a completion ends (`generation.stop_sequences='auto'`): with 'chat',
at `<end_of_turn>` (an end token; no stop text needed); with 'plain', at
the start of the next few-shot example (`TEMPLATE_STOP_SEQUENCES`): a
pretrained model that has answered goes on with the next 'Question:'.
"""

TEMPLATES = ('auto', 'chat', 'plain')

# Two worked examples for the plain template: (question, reasoning, answer).
# Kept short: with digits tokenised one by one, the plain prompt's fixed part
# must leave room for the question within generation.max_prompt_length.
FEW_SHOT_EXAMPLES = (
    (
        'Ann has 3 bags with 4 pens in each. She gives away 5 pens. How many '
        'pens does she have left?',
        '3 * 4 = 12 pens. 12 - 5 = 7 pens are left.',
        '7',
    ),
    (
        'A bus drives at 40 km per hour for 2 hours. How far does it go?',
        'Distance is 40 * 2 = 80 km.',
        '80',
    ),
)


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


def chat_prompt(question, system_prompt):
  """Formats one user turn and opens the model turn."""
  user = f'{system_prompt}\n\n{question}' if system_prompt else question
  return f'<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n'


def plain_prompt(question, system_prompt):
  """Formats the few-shot prompt ending where the model's answer begins."""
  parts = [system_prompt] if system_prompt else []
  for shot_question, reasoning, answer in FEW_SHOT_EXAMPLES:
    parts.append(
        f'Question: {shot_question}\nAnswer:\n'
        + format_answer(reasoning, answer)
    )
  parts.append(f'Question: {question}\nAnswer:\n')
  return '\n\n'.join(parts)


def format_prompt(question, config):
  """Returns the model input for `question` under the configured template.

  Args:
    question: The problem text.
    config: The full config; reads data.template, data.system_prompt and
      model.preset.
  """
  system_prompt = config.data.system_prompt.strip()
  if resolve_template(config) == 'chat':
    return chat_prompt(question, system_prompt)
  return plain_prompt(question, system_prompt)
