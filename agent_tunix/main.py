r"""Trains a Gemma 3 or Gemma 4 policy with GRPO and LoRA.

  python -m agent_tunix.main --config=configs/gemma3_270m.py --workdir=/tmp/run

Any config field can be overridden, e.g. --config.grpo.num_generations=8.
Rerunning the same command resumes from the latest checkpoint in --workdir.
A run stopped by an alarm (--config.training.stop_on_alarm=true) saves a
checkpoint, names the alarm and exits with status 1; one stopped by SIGTERM
or Ctrl-C saves a checkpoint and exits with status 3 (the exit statuses of
every command: agent_tunix/cli.py).
"""

import json
import sys

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from agent_tunix import cli
from agent_tunix.config import validation
from agent_tunix.data import opening
from agent_tunix.run import errors
from agent_tunix.tpu import sharding

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file (a get_config() module).', lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'Directory (local or gs://) for checkpoints and metrics.'
)
_PRINT_CONFIG = flags.DEFINE_bool(
    'print_config', False, 'Print the resolved config and exit.'
)
_PRINT_PROMPTS = flags.DEFINE_integer(
    'print_prompts', 0,
    'Print the first N training prompts as the model sees them, each with '
    'its token count against generation.max_prompt_length, and exit (loads '
    'the tokenizer, no weights; needs no --workdir).', lower_bound=0,
)
_MULTIHOST = flags.DEFINE_bool(
    'multihost', False,
    'Call jax.distributed.initialize() (TPU pods); same as '
    '--config.mesh.multihost=true.',
)
_COORDINATOR_ADDRESS = flags.DEFINE_string(
    'coordinator_address', None,
    'With --multihost outside a TPU pod: HOST:PORT of process 0, where it '
    'starts the coordinator service (the same on every process).',
)
_NUM_PROCESSES = flags.DEFINE_integer(
    'num_processes', None,
    'With --multihost outside a TPU pod: the number of processes.',
)
_PROCESS_ID = flags.DEFINE_integer(
    'process_id', None,
    "With --multihost outside a TPU pod: this process's index, 0 to "
    'num_processes - 1.',
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  config = _CONFIG.value
  if _PRINT_CONFIG.value:
    sys.stdout.write(config.to_json_best_effort(indent=2) + '\n')
    return
  if _PRINT_PROMPTS.value:
    validation.validate(config)
    from agent_tunix.run import preview  # pylint: disable=g-import-not-at-top
    config = preview.every_row(config)
    opening.exit_on_error(config)
    preview.print_prompts(config, _PRINT_PROMPTS.value)
    return
  if not _WORKDIR.value:
    raise app.UsageError('--workdir is required (local path or gs://).')
  if _MULTIHOST.value or config.mesh.multihost:
    sharding.initialize_distributed(
        _COORDINATOR_ADDRESS.value, _NUM_PROCESSES.value, _PROCESS_ID.value
    )
  elif any(f.present for f in (_COORDINATOR_ADDRESS, _NUM_PROCESSES,
                               _PROCESS_ID)):
    raise app.UsageError(
        '--coordinator_address, --num_processes and --process_id only take '
        'effect with --multihost; add it.'
    )
  validation.validate(config, process_count=jax.process_count(),
                      workdir=_WORKDIR.value)
  opening.exit_on_error(config)
  from agent_tunix.run import train  # pylint: disable=g-import-not-at-top
  result = train.train_and_evaluate(config, _WORKDIR.value)
  logging.info('Finished: %s', result)
  if jax.process_index() == 0:
    sys.stdout.write(json.dumps(
        {'step': result['step'], 'eval': result['eval'],
         'preempted': result['preempted'],
         'alarms': result['alarms']}) + '\n')
    sys.stdout.flush()
  if jax.process_count() > 1:
    sharding.shutdown_distributed()
  if result['preempted'] and not result['alarms']:
    sys.stderr.write(
        f'stopped after step {result["step"]} by a signal (SIGTERM or '
        'Ctrl-C), with a checkpoint of that step in --workdir; rerun the '
        'same command to go on.\n')
    sys.exit(cli.KILLED)
  if result['alarms']:
    # Exit status 1 and one line, so that scripts see the run did not finish.
    sys.exit(
        f'stopped after step {result["step"]} by alarm '
        f'{", ".join(result["alarms"])} (training.stop_on_alarm=True; a '
        'checkpoint of that step is in --workdir). See the warning above '
        'for what to try; rerun with --config.training.stop_on_alarm=false '
        'or changed alarms.* thresholds to go on from there.'
    )


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  cli.run(errors.cli(main))
