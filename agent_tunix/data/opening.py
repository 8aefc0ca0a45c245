"""Opens a command's data before any weight is read or program compiled.

Layer: data; imports data modules and `agent_tunix.cli` only.

`check(config, splits)` loads every split a command reads from each
source of data.source, and the plain template's worked examples
(data.few_shot), so that a missing path, a source whose package is not
installed (gsm8k_tfds without TensorFlow), a file without the question and
answer columns or too few rows is found before a model loads.
`exit_on_error` is what the commands (`main`, `evaluate`, `sweep`,
`preflight`) call right after validating the config: the failure is one
line, `error: ...`, and exit status 2 (`cli.USAGE`). Generated sources
(synthetic) have nothing to open and are not loaded here.
"""

from agent_tunix import cli
from agent_tunix.data import few_shot
from agent_tunix.data import gsm8k
from agent_tunix.data import pipeline
from agent_tunix.data import prompts

# What the loaders raise for data that cannot be read (DataError is a
# ValueError; a missing file an OSError; a failed download a RuntimeError).
_FAILURES = (ValueError, OSError, RuntimeError, ImportError)
_GENERATED = ('synthetic', 'synthetic_unseen')


class DataUnavailable(gsm8k.DataError):
  """The data of a config cannot be opened; the message says why and the
  fix."""


class HubUnreachable(DataUnavailable):
  """The data is read from the Hub and this machine cannot reach it: the
  machine's state, not the config's (the preflight only warns)."""


def _reads_files(config):
  names = [n for n, _ in pipeline.parse_source(config.data.source)]
  return any(n not in _GENERATED for n in names)


def check(config, splits=pipeline.SPLITS):
  """Loads the `splits` and the worked examples `config` reads.

  Raises:
    DataUnavailable: one of them cannot be loaded, or a split is empty.
  """
  try:
    if _reads_files(config):
      for split in splits:
        if not pipeline.load_examples(config, split):
          raise DataUnavailable(
              f'data.source={config.data.source!r} gives no {split} rows; '
              'check data.path and data.num_train_examples / '
              'num_eval_examples.')
    template = prompts.resolve_template(config)
    problem = few_shot.problem(config, template)
    if problem:
      raise DataUnavailable(problem)
    if template == 'plain':
      few_shot.examples(config)
  except DataUnavailable:
    raise
  except gsm8k.HubUnreachable as e:
    raise HubUnreachable(str(e)) from e
  except _FAILURES as e:
    raise DataUnavailable(str(e)) from e


def exit_on_error(config, splits=pipeline.SPLITS):
  """`check`, with a failure as one line `error: ...` and exit status 2."""
  try:
    check(config, splits)
  except DataUnavailable as e:
    cli.usage_exit(e)
