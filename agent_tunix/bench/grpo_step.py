"""Section grpo: our GRPO step, timed with its breakdown."""

from absl import logging
import jax
import numpy as np

from agent_tunix.bench import context
from agent_tunix.bench import options
from agent_tunix.bench import records
from agent_tunix.rl import grpo
from agent_tunix.rl import rollout
from agent_tunix.run import train
from agent_tunix.tpu import sharding


def ours_grpo(ctx):
  """Times our GRPO step; returns a measurement side."""
  config = ctx.config
  gen, g = config.generation, config.grpo
  num_g = g.num_generations
  session = ctx.session
  model, optimizer, hp = session.model, session.optimizer, session.hp
  sampler = session.sampler
  context.disable_end_tokens(sampler)
  total_steps = context.WARMUP_STEPS + options.STEPS.value
  rows = rollout.repeat_groups(
      {'prompt_tokens': ctx.prompt_tokens, 'prompt_mask': ctx.prompt_mask},
      num_g,
  )
  prompts = [p for p in ctx.prompts for _ in range(num_g)]
  parts = {'rollout': [], 'other': [], 'reference_logps': [], 'update': []}
  steps, warmup = [], []
  for step in range(1, total_steps + 1):
    t0 = records.now()
    out = sampler.generate(
        ctx.prompt_tokens, gen.max_generation_steps,
        train.step_seed(config.training.seed, step), gen.temperature,
        gen.top_k, gen.top_p, num_generations=num_g,
    )
    t1 = records.now()
    rewards = np.asarray(context.toy_reward(prompts, out.texts), np.float32)
    sequences = grpo.Sequences(
        tokens=np.concatenate([rows['prompt_tokens'], out.tokens], axis=1),
        input_mask=np.concatenate(
            [rows['prompt_mask'], out.mask > 0], axis=1
        ),
        completion_mask=out.mask,
    )
    # The bench holds an adaptive KL coefficient at its starting value.
    update = grpo.update_batch(config, sequences, rewards, hp.beta)
    batch = sharding.shard_batch(update, ctx.mesh)
    t2 = records.now()
    if hp.needs_reference:
      batch = batch.replace(ref_logps=jax.block_until_ready(
          grpo.reference_logps(model, batch, hp)
      ))
    t3 = records.now()
    metrics = jax.device_get(grpo.train_step(model, optimizer, batch, hp))
    t4 = records.now()
    if not np.isfinite(metrics['loss']):
      raise FloatingPointError(f'Non-finite loss at step {step}: {metrics}')
    if step <= context.WARMUP_STEPS:
      warmup.append(t4 - t0)
      logging.info('ours: warm-up step %.2f s', t4 - t0)
      continue
    steps.append(t4 - t0)
    for key, value in (('rollout', t1 - t0), ('other', t2 - t1),
                       ('reference_logps', t3 - t2), ('update', t4 - t3)):
      parts[key].append(value)
    logging.info('ours: step %d %.2f s', step, t4 - t0)
  ctx.last_update = update
  if hp.needs_reference:
    ctx.last_update = update.replace(
        ref_logps=np.asarray(batch.ref_logps))
  tokens = config.training.batch_size * num_g * gen.max_generation_steps
  side = records.step_summary(
      'agent_tunix (train.setup; rollout.Rollout.generate + '
      'grpo.reference_logps + grpo.train_step)', steps, warmup, tokens, parts,
      note='breakdown: rollout = Rollout.generate; other = reward, '
      'advantages, batch assembly and sharding; reference_logps; update = '
      'train_step (all micro-batches, optimizer step)',
  )
  return side
