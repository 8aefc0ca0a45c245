r"""The TPU compile check: a run's training programs compiled for a slice.

  python -m agent_tunix.preflight --config=configs/gemma3_1b.py \
      --topology=v5litepod-8

What it compiles, the figures it reports and why: docs/preflight.md.
Modules, from the command down:

  __main__  `python -m agent_tunix.preflight`: defines the flags, runs main
  command   the preflight as a function (prepare, run) and its flags and main
  report    the JSON report, the table, the verdict and the fixes per program
  resident  the check of frozen weights + rollout KV cache against HBM
  child     compiles in a child process the kernel may kill (host RAM)
  programs  the trainer's programs (rollout, log-probs, update, judge)
            compiled for a mesh
  tunix_programs  tunix's own GRPO step compiled alike (the tunix section)
  abstract  the model, optimizer, judge and batches as sharded shapes
  compiler  the compile of one program and its records (Program, Killed)
  hlo_cost  flops and HBM bytes counted from the optimized HLO, by cause
  calibration  the count on programs whose traffic is known
  analytic  the least traffic each program must move for its layout
  standins  stand-in tokenizers: the special ids the programs need

A command: modules here import each other, cli and every layer below
(docs/architecture.md); nothing outside the commands imports them.
"""
