r"""Generates text from a Gemma 3 policy: the base model or a trained run.

  python -m agent_tunix.generate --config=configs/gemma3_270m.py \
      --prompt="The capital of France is" --max_new_tokens=16 --temperature=0

The prompt is used as given (BOS is prepended). Greedy at temperature 0.
"""

import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from agent_tunix import config_lib
from agent_tunix import models
from agent_tunix import rollout
from agent_tunix import sharding
from agent_tunix.models import tokenizer as tokenizer_lib

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

flags.mark_flags_as_required(['config', 'prompt'])


def generate(model, tokenizer, prompt, max_new_tokens, temperature=0.0,
             top_k=0, top_p=1.0, seed=0):
  """Returns the continuation of `prompt` (a string)."""
  ids = tokenizer_lib.encode_with_bos(tokenizer, prompt)
  bucket = max(16, 1 << (len(ids) - 1).bit_length())
  tokens = [[0] * (bucket - len(ids)) + ids]
  sampler = rollout.Rollout(model, tokenizer, bucket + max_new_tokens)
  out = sampler.generate(tokens, max_new_tokens, seed, temperature, top_k,
                         top_p)
  return out.texts[0], out.tokens[0, :out.lengths[0]]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  config = _CONFIG.value
  config_lib.validate(config)
  mesh = sharding.make_mesh(config.mesh)
  model, tokenizer = models.build(config, mesh)
  text, ids = generate(model, tokenizer, _PROMPT.value, _MAX_NEW_TOKENS.value,
                       _TEMPERATURE.value, _TOP_K.value, _TOP_P.value,
                       _SEED.value)
  logging.info('Token ids: %s', ' '.join(str(int(t)) for t in ids))
  sys.stdout.write(text + '\n')
  sys.stdout.flush()


if __name__ == '__main__':
  app.run(main)
