"""Section tunix: the same GRPO step with tunix's GRPOLearner on RLCluster."""

import gc

from flax import nnx
import jax
import numpy as np

from agent_tunix.bench import context
from agent_tunix.bench import options
from agent_tunix.bench import records
from agent_tunix.models import gemma
from agent_tunix.models import lora
from agent_tunix.tpu import sharding


_CALLS = ('generate', 'get_ref_per_token_logps', 'update_actor')


def tunix_grpo(ctx):
  """Times tunix's GRPOLearner on the same workload; a measurement side."""
  config = ctx.config
  gen, g, t = config.generation, config.grpo, config.training
  if g.loss_agg_mode == 'sequence-mean-token-sum-norm':
    raise records.Skipped(
        "tunix's GRPOLearner has no 'sequence-mean-token-sum-norm' loss "
        'mode; benchmark with token-mean or sequence-mean-token-mean.'
    )
  hp = context.peer_hparams(ctx, "tunix's GRPOLearner")
  total_steps = context.WARMUP_STEPS + options.STEPS.value
  # Its own copy of the same weights: the backbone (tunix's reference) and a
  # LoRA policy over it, as tunix's examples build them.
  base = gemma.load_model(config.model, ctx.mesh)
  actor = lora.apply_lora(base, config.model, seed=config.training.seed)
  cluster = _cluster(ctx, actor, base if hp.needs_reference else None,
                     total_steps)
  learner = _learner(ctx, cluster, hp)
  events = []  # (name, start, end, rows)
  for name in _CALLS:
    _time_calls(cluster, name, events)
  dataset = [{'prompts': np.array(ctx.prompts)} for _ in range(total_steps)]
  learner.train(dataset)

  steps, warmup, parts = _split_steps(
      events, total_steps, t.batch_size * g.num_generations)
  tokens = t.batch_size * g.num_generations * gen.max_generation_steps
  side = records.step_summary(
      'tunix GRPOLearner + RLCluster (vanilla rollout, shared backbone)',
      steps, warmup, tokens, parts,
      note='step = start of RLCluster.generate to end of the last '
      'update_actor; breakdown from wrapping generate, '
      'get_ref_per_token_logps and update_actor (one call per '
      'micro-batch); other = rewards, advantages, queueing, metrics. tunix '
      'divides logits by the sampling temperature in its log-probs.',
  )
  side['update_calls_per_step'] = len(
      [e for e in events if e[0] == 'update_actor']) // total_steps
  del learner, cluster, actor, base
  gc.collect()
  return side


def _cluster(ctx, actor, reference, total_steps):
  """tunix's RLCluster on the bench mesh, at the workload's shapes."""
  # pylint: disable=g-import-not-at-top
  from tunix.rl import rl_cluster as rl_cluster_lib
  from tunix.rl.rollout import base_rollout
  # pylint: enable=g-import-not-at-top
  config = ctx.config
  gen, t = config.generation, config.training
  roles = (rl_cluster_lib.Role.ACTOR, rl_cluster_lib.Role.REFERENCE,
           rl_cluster_lib.Role.ROLLOUT)
  rollout_config = base_rollout.RolloutConfig(
      max_tokens_to_generate=gen.max_generation_steps,
      max_prompt_length=gen.max_prompt_length,
      kv_cache_size=gen.kv_cache_size,
      temperature=gen.temperature,
      top_p=gen.top_p,
      top_k=gen.top_k or None,
      eos_tokens=[context.NO_END_TOKEN],
  )
  training_config = rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=context.make_tx(config, total_steps),
      eval_every_n_steps=10**9,
      max_steps=total_steps,
      mini_batch_size=t.batch_size,
      train_micro_batch_size=t.micro_batch_size,
      rollout_micro_batch_size=t.batch_size,
      compute_logps_micro_batch_size=t.micro_batch_size,
      data_sharding_axis=sharding.batch_axes(ctx.mesh),
  )
  return rl_cluster_lib.RLCluster(
      actor=actor,
      reference=reference,
      tokenizer=ctx.tokenizer,
      cluster_config=rl_cluster_lib.ClusterConfig(
          role_to_mesh={role: ctx.mesh for role in roles},
          rollout_engine='vanilla',
          offload_to_cpu=False,
          training_config=training_config,
          rollout_config=rollout_config,
      ),
  )


def _learner(ctx, cluster, hp):
  """tunix's GRPOLearner with the workload's GRPO settings and toy reward."""
  from tunix.rl.grpo import grpo_learner  # pylint: disable=g-import-not-at-top
  g = ctx.config.grpo
  kl_modes = {'k1': 'kl', 'k3': 'low_var_kl'}
  return grpo_learner.GRPOLearner(
      rl_cluster=cluster,
      algo_config=grpo_learner.GRPOConfig(
          num_generations=g.num_generations,
          num_iterations=1,
          beta=hp.beta,
          epsilon=g.epsilon,
          loss_agg_mode=g.loss_agg_mode,
          kl_loss_mode=kl_modes[g.kl_estimator],
      ),
      reward_fns=[context.toy_reward],
  )


def _time_calls(cluster, name, events):
  """Wraps `cluster.<name>` to append (name, start, end, rows) to `events`,
  its results ready before the end is read."""
  fn = getattr(cluster, name)

  def wrapper(*args, **kwargs):
    start = records.now()
    result = fn(*args, **kwargs)
    if name == 'update_actor':
      jax.block_until_ready(
          nnx.state(cluster.actor_trainer.model, nnx.LoRAParam)
      )
      rows = None
    elif name == 'generate':
      rows = len(result.tokens)
    else:
      result = jax.block_until_ready(result)
      rows = int(result.shape[0])
    events.append((name, start, records.now(), rows))
    return result

  setattr(cluster, name, wrapper)


def _split_steps(events, total_steps, expected_rows):
  """Cuts the timed calls into steps at each rollout.

  Returns:
    (timed step seconds, warm-up step seconds, {part: seconds per timed
    step}) with parts rollout, reference_logps, update and other.
  """
  starts = [i for i, e in enumerate(events) if e[0] == 'generate']
  if len(starts) != total_steps:
    raise RuntimeError(
        f'tunix ran {len(starts)} rollouts for {total_steps} steps; the '
        'learner did not run one rollout per step as configured.'
    )
  if events[starts[0]][3] != expected_rows:
    raise RuntimeError(
        f'tunix generated {events[starts[0]][3]} rows per step, expected '
        f'{expected_rows} (batch_size x num_generations).'
    )
  parts = {'rollout': [], 'reference_logps': [], 'update': [], 'other': []}
  steps, warmup = [], []
  for k, begin in enumerate(starts):
    end = starts[k + 1] if k + 1 < len(starts) else len(events)
    chunk = events[begin:end]
    updates = [e for e in chunk if e[0] == 'update_actor']
    if not updates:
      raise RuntimeError(f'tunix step {k + 1} ran no update_actor call.')
    step_s = updates[-1][2] - chunk[0][1]
    if k < context.WARMUP_STEPS:
      warmup.append(step_s)
      continue
    steps.append(step_s)
    sums = {
        'rollout': sum(e[2] - e[1] for e in chunk if e[0] == 'generate'),
        'reference_logps': sum(
            e[2] - e[1] for e in chunk if e[0] == 'get_ref_per_token_logps'
        ),
        'update': sum(e[2] - e[1] for e in updates),
    }
    sums['other'] = step_s - sum(sums.values())
    for key, value in sums.items():
      parts[key].append(value)
  return steps, warmup, parts
