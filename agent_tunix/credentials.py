r"""Which gated-weight credentials a config needs where it trains.

  python -m agent_tunix.credentials --config=configs/gemma3_1b.py \
      [--config.FIELD=VALUE ...]

prints one line per credential the run's weights need, `NAME WHAT`:
`kaggle <handle>` (a kagglehub handle: the Gemma licence accepted on Kaggle,
and ~/.kaggle/kaggle.json or KAGGLE_USERNAME/KAGGLE_KEY) or `huggingface
<repo id>` (a gated Hugging Face repo: its licence accepted on the model
page, and HF_TOKEN); nothing for weights that are a local path, packaged
(the offline GGUF default) or random. The policy and a Gemma judge with
weights of its own (judge.preset) are both asked. launch/run.sh asks this
before it copies anything and delivers those credentials to the workers as
files. Reads the config only: no weights, no network, no jax.
"""

import os
import re
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from agent_tunix import cli
from agent_tunix.rewards import spec as reward_spec

KAGGLE = 'kaggle'
HUGGINGFACE = 'huggingface'
# A Hugging Face repo id: owner/name, as opposed to a directory path.
_REPO_ID = re.compile(r'^[A-Za-z0-9][\w.-]*/[\w.-]+$')

_CONFIG = None  # The --config flag, defined when this module is the program.


def _define_flags():
  """Defines --config only when this module runs as a program (another
  command imported in the same process defines its own --config)."""
  global _CONFIG
  _CONFIG = config_flags.DEFINE_config_file(
      'config', None, 'Config file (a get_config() module).',
      lock_config=True)


def _weights_need(source, path):
  """(credential, what) for weights of `source` at `path`, or None."""
  if source == 'kaggle':
    return KAGGLE, path or '(no model.path)'
  if (source == 'hf' and _REPO_ID.match(path or '')
      and not os.path.exists(path)):
    return HUGGINGFACE, path
  return None


def needed(config):
  """[(credential, what needs it)] of `config`, policy first, no repeats.

  Args:
    config: a full config (model.*, judge.*, rewards.functions).

  Returns:
    A list of (KAGGLE or HUGGINGFACE, the handle or repo id).
  """
  weights = [(config.model.source, config.model.path)]
  judged = any(name == 'rubric_judge' for name, _ in
               reward_spec.parse_spec(config.rewards.functions))
  if judged and config.judge.backend == 'gemma' and config.judge.preset:
    weights.append((config.judge.source or config.model.source,
                    config.judge.path))
  found = []
  for source, path in weights:
    need = _weights_need(source, path)
    if need and need not in found:
      found.append(need)
  return found


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  try:
    needs = needed(_CONFIG.value)
  except ValueError as e:  # rewards.functions that does not parse.
    cli.usage_exit(e)
  for name, what in needs:
    sys.stdout.write(f'{name} {what}\n')


if __name__ == '__main__':
  _define_flags()
  flags.mark_flags_as_required(['config'])
  cli.run(main)
