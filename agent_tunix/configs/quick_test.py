"""A few short GRPO steps on the real Gemma 3 270M, on CPU, offline.

  python -m agent_tunix.main --config=configs/quick_test.py --workdir=/tmp/qt
"""

from agent_tunix.configs import gemma3_270m


def get_config(arg=None):
  config = gemma3_270m.get_config()
  config.training.num_steps = 3
  config.training.batch_size = 1
  config.training.micro_batch_size = 1
  config.grpo.num_generations = 2
  config.generation.max_generation_steps = 24
  config.eval.max_generation_steps = 24
  config.eval.eval_every_n_steps = 0
  config.eval.pass_at_k = 2
  config.eval.batch_size = 2
  config.data.num_train_examples = 16
  config.data.num_eval_examples = 2
  config.checkpoint.save_interval_steps = 2
  config.logging.num_sample_texts = 1
  config.optimizer.learning_rate = 1e-5
  return gemma3_270m.base.apply_arg(config, arg)
