r"""Compiles a run's training programs for a TPU slice, on any machine.

  python -m agent_tunix.preflight --config=configs/gemma3_1b.py \
      --topology=v5litepod-8 [--output=preflight.json]

libtpu compiles for a TPU topology without a TPU. The preflight builds the
run's model from shapes and shardings (no weight or tokenizer file is
read), places it on the slice's devices as the trainer does, and compiles
the trainer's own programs in a child process: rollout_prefill,
rollout_decode, reference_logps, policy_logps, update and judge (those the
config runs). For each it reports the TPU compiler's bytes per chip against
the HBM a program may use, and roofline lower bounds of its time.

Exit status 0 when every program fits, 1 when one does not (the report
names it, the bytes over and the fixes that apply), 2 on a bad flag or
config, 3 when none is known not to fit but a compile was killed.
docs/preflight.md has what each program is and where each figure comes
from.

This file is the program: it defines command.py's flags and runs its main.
"""

from absl import flags

from agent_tunix import cli
from agent_tunix.preflight import command

if __name__ == '__main__':
  command.define_flags()
  flags.adopt_module_key_flags(command)  # --help lists them.
  cli.run(command.main)
