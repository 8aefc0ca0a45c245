"""A 2-layer random Gemma 3 with the real tokenizer: tests and benchmarks.

  python -m agent_tunix.main --config=configs/tiny.py --workdir=/tmp/tiny
"""

from agent_tunix.configs import base


def get_config(arg=None):
  config = base.get_config()
  config.model.source = 'random'
  config.model.preset = 'tiny'
  config.model.lora_rank = 4
  config.model.lora_alpha = 8.0
  config.data.num_train_examples = 32
  config.data.num_eval_examples = 2
  config.data.template = 'chat'
  # Room for a tool prompt too (`--config.agent.tools=calculator`: the
  # system prompt, the calculator's instructions and a question, 184-210
  # tokens with BOS); plain chat prompts are 73-99.
  config.generation.max_prompt_length = 224
  config.generation.max_generation_steps = 8
  config.generation.kv_cache_size = 256
  config.eval.max_generation_steps = 8
  config.eval.batch_size = 2
  config.eval.pass_at_k = 2
  config.eval.eval_every_n_steps = 0
  config.training.num_steps = 2
  config.training.batch_size = 2
  config.training.micro_batch_size = 1
  config.grpo.num_generations = 2
  config.grpo.logps_chunk_size = 8
  config.checkpoint.save_interval_steps = 1
  config.logging.num_sample_texts = 1
  config.optimizer.learning_rate = 1e-3
  return base.apply_arg(config, arg)
