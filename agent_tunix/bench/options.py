"""The bench's command-line flags, readable with their defaults on import.

The flags are defined only when the bench is the program (`__main__`
calls `define_flags()`): importing the package (tests do) must not define
--config, which other CLIs in the same process define too. Until then each
holder below carries the flag's default in `.value`.
"""

import os

from absl import flags
from ml_collections import config_flags

SECTIONS = ('grpo', 'tunix', 'trl', 'decode', 'episodes', 'memory',
            'preflight', 'storage')
REPO_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
_DEFAULT_CONFIG = os.path.join(REPO_ROOT, 'agent_tunix', 'configs',
                               'gemma3_270m.py')


class _Value:
  """A flag's default while the bench is imported, not run as a program."""

  def __init__(self, value):
    self.value = value


# Replaced by flag holders in define_flags().
CONFIG = _Value(None)
QUICK = _Value(False)
OUTPUT = _Value('')
STEPS = _Value(3)
DECODE_BATCH_SIZES = _Value(['1', '4', '16', '64'])
DECODE_PROMPT_LENGTH = _Value(32)
SKIP = _Value([])
EPISODE_STEPS = _Value(0)
# --quick's episode columns: its 8 generation steps hold no turns.
QUICK_EPISODE_STEPS = 64
PREFLIGHT_TOPOLOGY = _Value('v5litepod-8')
CHECKPOINT_URL = _Value('')
# --quick's slice: the tiny model's 2 heads and 2-row micro-batches spread
# over at most 4 devices.
QUICK_PREFLIGHT_TOPOLOGY = 'v5litepod-4'


def define_flags():
  """Defines the command-line flags (`python -m agent_tunix.bench --help`)."""
  global CONFIG, QUICK, OUTPUT, STEPS, DECODE_BATCH_SIZES
  global DECODE_PROMPT_LENGTH, SKIP, PREFLIGHT_TOPOLOGY, EPISODE_STEPS
  global CHECKPOINT_URL
  CONFIG = config_flags.DEFINE_config_file(
      'config', _DEFAULT_CONFIG, 'Config file (a get_config() module).',
      lock_config=True,
  )
  QUICK = flags.DEFINE_bool(
      'quick', QUICK.value,
      'Benchmark configs/tiny.py at small sizes (ignores --config); seconds.',
  )
  OUTPUT = flags.DEFINE_string(
      'output', OUTPUT.value, 'Write the JSON results here.'
  )
  STEPS = flags.DEFINE_integer(
      'steps', STEPS.value,
      'Timed repetitions per measurement (after the warm-up).',
  )
  DECODE_BATCH_SIZES = flags.DEFINE_list(
      'decode_batch_sizes', DECODE_BATCH_SIZES.value,
      'Batch sizes for the decode section (default 1,4 with --quick).',
  )
  DECODE_PROMPT_LENGTH = flags.DEFINE_integer(
      'decode_prompt_length', DECODE_PROMPT_LENGTH.value,
      'Prompt bucket of the decode section; its KV cache holds this many '
      'tokens plus generation.max_generation_steps.',
  )
  EPISODE_STEPS = flags.DEFINE_integer(
      'episode_steps', EPISODE_STEPS.value,
      'Completion columns of the episodes section (model turns and inserts '
      'together); 0 = generation.max_generation_steps '
      f'({QUICK_EPISODE_STEPS} with --quick).',
  )
  CHECKPOINT_URL = flags.DEFINE_string(
      'checkpoint_url', CHECKPOINT_URL.value,
      'Where the storage section also saves and restores a checkpoint '
      '(e.g. gs://bucket/bench; an emulator with STORAGE_EMULATOR_HOST); '
      'empty: a local folder only.',
  )
  SKIP = flags.DEFINE_list(
      'skip', SKIP.value,
      f'Sections to skip, comma-separated: {",".join(SECTIONS)}.',
  )
  PREFLIGHT_TOPOLOGY = flags.DEFINE_string(
      'preflight_topology', PREFLIGHT_TOPOLOGY.value,
      'TPU slice the preflight section compiles the workload for: an '
      'accelerator type as gcloud spells it (v5litepod-8, v6e-8, v5p-8, '
      'v4-8) or a topology (v5e:2x2); default '
      f'{QUICK_PREFLIGHT_TOPOLOGY} with --quick.',
  )
