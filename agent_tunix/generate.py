r"""Generates text from a policy: the base model or a trained run.

  python -m agent_tunix.generate --config=configs/gemma3_270m.py \
      --prompt="The capital of France is" --max_new_tokens=16 --temperature=0

  python -m agent_tunix.generate --config=configs/gemma3_270m.py \
      --workdir=/tmp/run --interactive

--workdir loads the run's trained LoRA (latest checkpoint, or --step); a
workdir without a checkpoint is an error. Without --workdir the base model
generates. Sampling is greedy at --temperature=0 (the default).

--prompt is continued as given (BOS is prepended) and the continuation is
printed as one line. --interactive reads one question or prompt per line from
stdin and prints each answer as one line (a newline inside an answer is
written as '\n', a backslash as '\\'), until end of input or a line 'exit'.

--template: 'auto' (default) formats interactive lines with the run's
prompt template (system prompt included) when the config uses chat turns
(-it presets, data.template=chat) and passes --prompt and other lines as
given; 'train' always formats with the run's template (the few-shot prompt
for pretrained presets); 'raw' never does. With tools
(`--config.agent.tools`) every input is an episode: 'auto' formats it with
the tool prompt and the answer is the transcript, one line per turn
('model: ...', 'tool: name(args) -> result'; docs/agent.md);
--max_new_tokens bounds the whole episode.

Layer: commands; may import any layer of agent_tunix.
"""

import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from agent_tunix import cli
from agent_tunix import export
from agent_tunix.config import validation
from agent_tunix.data import prompts
from agent_tunix.models import families
from agent_tunix.models import tokenizer as tokenizer_lib
from agent_tunix.rl import episodes
from agent_tunix.rl import rollout

TEMPLATES = ('auto', 'train', 'raw')

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file (a get_config() module).', lock_config=True
)
_PROMPT = flags.DEFINE_string('prompt', None, 'Text to continue.')
_MAX_NEW_TOKENS = flags.DEFINE_integer(
    'max_new_tokens', 64, 'Tokens to generate.'
)
_TEMPERATURE = flags.DEFINE_float(
    'temperature', 0.0, 'Sampling temperature; 0 is greedy.'
)
_TOP_K = flags.DEFINE_integer('top_k', 0, 'Top-k cut (0 = off).')
_TOP_P = flags.DEFINE_float('top_p', 1.0, 'Nucleus cut (1.0 = off).')
_SEED = flags.DEFINE_integer('seed', 0, 'Sampling seed.')
_WORKDIR = flags.DEFINE_string(
    'workdir', None,
    'Training run whose LoRA to use (latest checkpoint); default: the base '
    'model.',
)
_STEP = flags.DEFINE_integer(
    'step', None, 'Checkpoint step of --workdir (default: the latest).'
)
_INTERACTIVE = flags.DEFINE_bool(
    'interactive', False,
    "Answer stdin line by line until end of input or 'exit'.",
)
_TEMPLATE = flags.DEFINE_enum(
    'template', 'auto', TEMPLATES,
    'How input text becomes the model input (see the module doc).',
)

flags.mark_flags_as_required(['config'])


class Generator:
  """Continues prompts with one policy, reusing compiled samplers.

  Prompts are left-padded to a power-of-two bucket (at least 16 tokens); one
  sampler per (bucket, max_new_tokens) is kept, so a session of many prompts
  compiles once per bucket.
  """

  def __init__(self, model, tokenizer, config=None):
    """`config` with agent.tools (or agent.environment) set makes every
    prompt an episode."""
    self.model = model
    self.tokenizer = tokenizer
    self.config = (config if config is not None and episodes.enabled(config)
                   else None)
    self._samplers = {}

  def __call__(self, prompt, max_new_tokens, temperature=0.0, top_k=0,
               top_p=1.0, seed=0):
    """Returns (continuation text, its token ids) for one prompt; with
    tools, (the episode's transcript, the ids the model and tools wrote)."""
    ids = tokenizer_lib.encode_with_bos(self.tokenizer, prompt)
    bucket = max(16, 1 << (len(ids) - 1).bit_length())
    tokens = [[0] * (bucket - len(ids)) + ids]
    key = (bucket, max_new_tokens)
    if key not in self._samplers:
      self._samplers[key] = rollout.Rollout(
          self.model, self.tokenizer, bucket + max_new_tokens
      )
      if self.config is not None:
        self._samplers[key] = episodes.from_config(self.config,
                                                   self._samplers[key])
    out = self._samplers[key].generate(
        tokens, max_new_tokens, seed, temperature, top_k, top_p
    )
    if out.episodes is not None:
      return (episodes.format_transcript(out.episodes[0]),
              out.tokens[0][out.attended[0] > 0])
    return out.texts[0], out.tokens[0, :out.lengths[0]]


def model_input(text, config, template, interactive):
  """The model input for one line of user text under `template`."""
  if template == 'raw':
    return text
  if template == 'train' or config.agent.tools or (
      interactive and prompts.resolve_template(config) == 'chat'
  ):
    return prompts.format_prompt(
        text, config, families.of_preset(config.model.preset).tool_format)
  return text


def interact(generate_fn, lines, out, config, template='auto'):
  """Answers `lines` one by one with `generate_fn(text) -> str`.

  Empty lines are skipped; a line 'exit' (or the end of `lines`) stops.

  Args:
    generate_fn: maps a model input to its continuation.
    lines: iterable of input lines (e.g. sys.stdin).
    out: text stream the answers go to, one line each.
    config: the run's config (prompt template).
    template: one of TEMPLATES.

  Returns:
    The number of answers written.
  """
  count = 0
  for line in lines:
    text = line.strip()
    if text == 'exit':
      break
    if not text:
      continue
    answer = generate_fn(model_input(text, config, template, True))
    out.write(answer.replace('\\', '\\\\').replace('\n', '\\n') + '\n')
    out.flush()
    count += 1
  return count


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if _INTERACTIVE.value == (_PROMPT.value is not None):
    raise app.UsageError('Pass exactly one of --prompt and --interactive.')
  config = _CONFIG.value
  try:
    model, tokenizer, step = export.load_policy(
        config, _WORKDIR.value, _STEP.value, allow_base=not _WORKDIR.value
    )
  except (export.ExportError, validation.ConfigError) as e:
    raise SystemExit(f'generate: {e}') from e
  if step is not None:
    logging.info('Generating with the LoRA of step %d', step)
  generator = Generator(model, tokenizer, config)

  def continuation(text):
    answer, ids = generator(text, _MAX_NEW_TOKENS.value, _TEMPERATURE.value,
                            _TOP_K.value, _TOP_P.value, _SEED.value)
    logging.info('Token ids: %s', ' '.join(str(int(t)) for t in ids))
    return answer

  if _INTERACTIVE.value:
    if sys.stdin.isatty():
      sys.stderr.write("One question per line; 'exit' or Ctrl-D ends.\n")
    interact(continuation, sys.stdin, sys.stdout, config, _TEMPLATE.value)
    return
  text = model_input(_PROMPT.value, config, _TEMPLATE.value, False)
  sys.stdout.write(continuation(text) + '\n')
  sys.stdout.flush()


if __name__ == '__main__':
  cli.run(main)
