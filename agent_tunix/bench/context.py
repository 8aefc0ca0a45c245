"""The shared workload: config, settings, prompts, our session (`Context`).

Every section gets the same `Context`: our model, sampler and optimizer set
up exactly as training sets them up (`train.setup`), the bench prompts, and
the workload settings read from the config.
"""

import dataclasses
import sys

from absl import logging
import numpy as np

from agent_tunix.bench import options
from agent_tunix.bench import records
from agent_tunix.config import validation
from agent_tunix.data import pipeline
from agent_tunix.rl import grpo
from agent_tunix.rl import optimizer as optimizer_lib
from agent_tunix.run import train

# Untimed steps before the timed ones: the first compiles; the second can
# compile again when the first update returns state in new shardings.
WARMUP_STEPS = 2
# An id no sampler ever produces: used as the only end token, so that every
# completion runs the full generation length.
NO_END_TOKEN = -1


def toy_reward(prompts, completions, **kwargs):
  """Cheap, non-constant reward (distinct characters mod 5), any framework."""
  del prompts, kwargs
  return [float(len(set(str(c))) % 5) for c in completions]


def quick_config():
  """configs/tiny.py shrunk for a smoke run."""
  if options.REPO_ROOT not in sys.path:
    sys.path.insert(0, options.REPO_ROOT)
  from agent_tunix.configs import tiny  # pylint: disable=g-import-not-at-top
  config = tiny.get_config()
  config.generation.max_prompt_length = 32
  config.generation.max_generation_steps = 8
  config.generation.kv_cache_size = 40
  config.grpo.num_generations = 2
  config.training.batch_size = 2
  config.training.micro_batch_size = 1
  # The memory section then also compiles the naive update with this remat.
  config.model.remat = 'layer'
  return config



def workload(config):
  """The shared workload settings, read from the config."""
  gen, g, t, m = (config.generation, config.grpo, config.training,
                  config.model)
  if t.batch_size % t.micro_batch_size:
    raise ValueError(
        f'config.training.micro_batch_size={t.micro_batch_size} must divide '
        f'config.training.batch_size={t.batch_size}.'
    )
  return {
      'model_preset': m.preset,
      'model_source': m.source,
      'model_dtype': m.dtype,
      'prompt_length': gen.max_prompt_length,
      'generation_length': gen.max_generation_steps,
      'kv_cache_size': gen.kv_cache_size,
      'num_generations': g.num_generations,
      'batch_size': t.batch_size,
      'micro_batch_size': t.micro_batch_size,
      'rows': t.batch_size * g.num_generations,
      'lora_rank': m.lora_rank,
      'lora_alpha': m.lora_alpha,
      'beta': g.beta,
      'epsilon': g.epsilon,
      'kl_estimator': g.kl_estimator,
      'loss_agg_mode': g.loss_agg_mode,
      'logps_chunk_size': g.logps_chunk_size,
      'temperature': gen.temperature,
      'top_k': gen.top_k,
      'top_p': gen.top_p,
      'end_tokens': 'disabled: every completion is generation_length tokens',
      'warmup_steps': WARMUP_STEPS,
      'timed_steps': options.STEPS.value,
      'reward': 'toy: distinct characters of the completion mod 5',
  }


def make_prompts(tokenizer, count, length):
  """`count` distinct prompt strings whose BOS + tokens fit `length`.

  Returns:
    (list of str, int32 [count, length] left-padded tokens, bool mask).
  """
  filler = (
      'A farmer has some apples and oranges. He sells a third of the apples '
      'at the market, gives two oranges to each neighbour and keeps the rest '
      'in a basket by the door. '
  )
  texts, tokens, masks = [], [], []
  for i in range(count):
    text = f'Question {i}: ' + filler * (1 + length // 16)
    ids = [int(x) for x in tokenizer.encode(text)]
    budget = max(1, (3 * length) // 4 - 1)
    text = tokenizer.decode(ids[:budget]) + f' What is {i} + {i + 3}?'
    encoded = pipeline.encode_prompt(text, tokenizer, length)
    while encoded is None:
      budget -= 4
      if budget < 1:
        raise ValueError(
            f'Prompt bucket {length} is too short for a benchmark prompt; '
            'raise config.generation.max_prompt_length (>= 16).'
        )
      text = tokenizer.decode(ids[:budget]) + f' What is {i} + {i + 3}?'
      encoded = pipeline.encode_prompt(text, tokenizer, length)
    texts.append(text)
    tokens.append(encoded[0])
    masks.append(encoded[1])
  return texts, np.stack(tokens), np.stack(masks)


def disable_end_tokens(sampler):
  """Makes a rollout.Rollout decode every row for the full length."""
  sampler.end_ids = [NO_END_TOKEN]
  sampler.sampler.eos_ids = np.array([NO_END_TOKEN], np.int32)



@dataclasses.dataclass
class Context:
  """What every section shares: config, our session, prompts."""

  config: object
  settings: dict
  session: train.Session  # our model, sampler, optimizer, hp, mesh
  prompts: list
  prompt_tokens: np.ndarray
  prompt_mask: np.ndarray
  # Our last update batch, host arrays (the memory section's input).
  last_update: grpo.UpdateBatch = None

  @property
  def mesh(self):
    return self.session.mesh

  @property
  def tokenizer(self):
    return self.session.tokenizer


def build_context(config, workdir):
  """Builds our side exactly as training does: train.setup (no data), on
  a validated config."""
  validation.validate(config, splits=('eval',))
  settings = workload(config)
  t0 = records.now()
  session = train.setup(config, workdir, with_data=False)
  logging.info('Set up %s in %.1f s', config.model.preset, records.now() - t0)
  prompts, tokens, mask = make_prompts(
      session.tokenizer, config.training.batch_size,
      config.generation.max_prompt_length,
  )
  return Context(config, settings, session, prompts, tokens, mask)


def peer_hparams(ctx, peer):
  """Our update's `grpo.StepHParams`, for a peer that must match its work.

  A peer runs KL at hp.beta (grpo.beta; with an adaptive controller
  grpo.init_kl_coeff, the starting value our side holds) and takes the
  reference pass when ours does (hp.needs_reference). A peer computes
  GRPO's advantages: with another estimator (MaxEnt-GRPO, which also needs
  the reference pass at beta 0, or RLOO) the peer is skipped.

  Args:
    ctx: the bench's `Context`.
    peer: the peer's name, for the reason.

  Returns:
    ctx.session.hp.

  Raises:
    records.Skipped: the advantage estimator is not GRPO's.
  """
  hp = ctx.session.hp
  estimator = hp.objective.advantages.name
  if estimator != 'grpo':
    raise records.Skipped(
        f'{peer} has no MaxEnt-GRPO or RLOO, only GRPO\'s advantages (our '
        f'estimator is {estimator!r}; MaxEnt-GRPO also takes a reference '
        "pass); benchmark with grpo.maxent_tau=0 and "
        "grpo.advantage_estimator='grpo'."
    )
  return hp


def make_tx(config, num_steps):
  """The training optimizer (no warm-up) for a run of `num_steps`."""
  o = config.optimizer
  tx, _ = optimizer_lib.make_optimizer(
      learning_rate=o.learning_rate, warmup_ratio=0.0, num_steps=num_steps,
      b1=o.b1, b2=o.b2, weight_decay=o.weight_decay,
      max_grad_norm=o.max_grad_norm,
  )
  return tx
