"""Section memory: one update's memory and time against the naive update."""

import dataclasses
import functools
import gc

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agent_tunix.bench import context
from agent_tunix.bench import options
from agent_tunix.bench import records
from agent_tunix.rl import grpo
from agent_tunix.rl import logprobs
from agent_tunix.tpu import sharding


def naive_token_logps(model, tokens, input_mask, completion_len,
                      chunk_size=None, use_lora=True, compute_entropy=True,
                      group=1, temperature=1.0):
  """logprobs.per_token_logps from the model's full [B, T, V] logits.

  Same arguments as logprobs.per_token_logps; chunk_size is unused, LoRA is
  always applied (the update's use) and every row runs in full (the memory
  section sets prompt_group=1 on both sides).
  """
  del chunk_size, use_lora, compute_entropy, group
  logits, _ = model(
      tokens,
      logprobs.positions_from_mask(input_mask),
      None,
      logprobs.causal_attention_mask(input_mask),
  )
  length = tokens.shape[1]
  logits = logits[:, length - completion_len - 1 : length - 1]
  logp_all = jax.nn.log_softmax(
      logits.astype(jnp.float32) / temperature, axis=-1
  )
  targets = tokens[:, length - completion_len :]
  logps = jnp.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  return logps, entropy


# grpo's own update (loss, micro-batching, remat, optimizer) with the naive
# log-probs in place of the chunked ones.
# pylint: disable=protected-access
NAIVE_TRAIN_STEP = grpo.make_train_step(
    functools.partial(grpo._grads_and_metrics, logps_fn=naive_token_logps)
)
# pylint: enable=protected-access


def memory_stats(compiled):
  """memory_analysis() fields of an nnx/jax compiled executable, in bytes."""
  inner = getattr(compiled, 'compiled', compiled)
  stats = inner.memory_analysis()
  if stats is None:
    raise records.Skipped(
        f'{jax.default_backend()} gives no memory_analysis().'
    )
  fields = {
      name: int(getattr(stats, name + '_in_bytes'))
      for name in ('temp_size', 'argument_size', 'output_size', 'alias_size',
                   'generated_code_size')
  }
  fields['temp_bytes'] = fields['temp_size']
  fields['peak_bytes'] = (fields['temp_size'] + fields['argument_size'] +
                          fields['output_size'] - fields['alias_size'])
  return fields


def synthetic_update(ctx):
  """An update batch shaped like the GRPO step's (when it did not run)."""
  config = ctx.config
  g = config.grpo
  rows = config.training.batch_size * g.num_generations
  c = config.generation.max_generation_steps
  rng = np.random.default_rng(0)
  prompt_tokens = np.repeat(ctx.prompt_tokens, g.num_generations, axis=0)
  prompt_mask = np.repeat(ctx.prompt_mask, g.num_generations, axis=0)
  completion = rng.integers(3, 1000, (rows, c)).astype(np.int32)
  sequences = grpo.Sequences(
      tokens=np.concatenate([prompt_tokens, completion], axis=1),
      input_mask=np.concatenate(
          [prompt_mask, np.ones((rows, c), bool)], axis=1
      ),
      completion_mask=np.ones((rows, c), np.float32),
  )
  advantages = rng.standard_normal(rows).astype(np.float32)
  hp = ctx.session.hp
  ref_logps = None
  if hp.needs_reference:
    ref_logps = -np.abs(rng.standard_normal((rows, c))).astype(
        np.float32
    ) - 5.0
  return grpo.update_batch(
      config, sequences, rng.standard_normal(rows), hp.beta,
  ).replace(advantages=advantages, ref_logps=ref_logps)


def memory_measurement(ctx):
  """Our update vs the naive full-logits one: memory and time."""
  # Both sides run every row in full (no shared prompt forward).
  hp = dataclasses.replace(ctx.session.hp, prompt_group=1)
  naive_hp = dataclasses.replace(hp, remat='none')
  update = ctx.last_update or synthetic_update(ctx)
  model = ctx.session.model
  batch = sharding.shard_batch(update, ctx.mesh)
  # Both sides start from the same LoRA values, so their first losses and
  # entropies must agree: a check that the naive update computes the same
  # thing.
  start = jax.tree.map(jnp.copy, nnx.state(model, nnx.LoRAParam))
  sides = {}
  for name, step_fn, step_hp in (('ours', grpo.TRAIN_STEP, hp),
                                 ('peer', NAIVE_TRAIN_STEP, naive_hp)):
    nnx.update(model, jax.tree.map(jnp.copy, start))
    sides[name] = dict(
        name=(f'grpo.train_step (chunked log-probs, chunk {hp.chunk_size}, '
              f'remat {hp.remat})' if name == 'ours' else
              'naive: full [B, T, V] logits, log_softmax, gather; remat none'),
        **_time_side(ctx, batch, step_fn, step_hp),
    )
  nnx.update(model, start)
  ours, peer = sides['ours'], sides['peer']
  _check_same_computation(ours, peer)
  for key in ('temp_bytes', 'peak_bytes'):
    ours[key + '_ratio'] = ours[key] / max(peer[key], 1)
  if hp.remat != 'none':
    # The naive log-probs under our remat, compiled only: how much of the
    # saving is the chunked log-probs' alone.
    optimizer, compiled, _ = _compile_step(ctx, batch, NAIVE_TRAIN_STEP, hp)
    stats = memory_stats(compiled)
    del optimizer, compiled
    gc.collect()
    peer['same_remat'] = {'remat': hp.remat, **stats}
    for key in ('temp_bytes', 'peak_bytes'):
      ours[key + '_ratio_same_remat'] = ours[key] / max(stats[key], 1)
  rows = int(update.tokens.shape[0])
  micro_rows = hp.micro_batch_size or rows
  settings = {
      'rows': rows,
      'micro_batch_rows': micro_rows,
      'sequence_length': int(update.tokens.shape[1]),
      'completion_length': int(update.completion_mask.shape[1]),
      'vocab_size': int(model.embedder.input_embedding.shape[0]),
      'logps_chunk_size': hp.chunk_size,
      'beta': hp.beta,
      'remat': hp.remat,
      'peer_remat': naive_hp.remat,
      'prompt_group': hp.prompt_group,
      'memory_note': 'temp_bytes = XLA temp buffers; peak_bytes = temp + '
                     'argument + output - alias (weights included)',
      'input': 'last GRPO step batch' if ctx.last_update else 'synthetic',
  }
  return records.measurement('update_memory', ['memory'], settings, ours, peer)


def _compile_step(ctx, batch, step_fn, step_hp):
  """(a fresh optimizer, the compiled update, compile seconds)."""
  model = ctx.session.model
  optimizer = nnx.Optimizer(
      model, context.make_tx(ctx.config, 1 + options.STEPS.value),
      wrt=nnx.LoRAParam,
  )
  graphdefs, arrays = grpo.train_step_inputs(model, optimizer)
  t0 = records.now()
  compiled = step_fn(graphdefs).lower(*arrays, batch, hp=step_hp).compile()
  return optimizer, compiled, records.now() - t0


def _time_side(ctx, batch, step_fn, step_hp):
  """One side's update: compiled, its memory, a first step (loss and
  entropy kept), then --steps timed ones."""
  model = ctx.session.model
  optimizer, compiled, compile_s = _compile_step(ctx, batch, step_fn, step_hp)
  stats = memory_stats(compiled)
  times, first = [], None
  for step in range(1 + options.STEPS.value):
    t0 = records.now()
    metrics = jax.device_get(grpo.run_train_step(
        lambda _: compiled, model, optimizer, batch
    ))
    if step:
      times.append(records.now() - t0)
    else:
      first = {k: float(metrics[k]) for k in ('loss', 'entropy')}
  del optimizer, compiled
  gc.collect()
  return dict(
      median_s=records.median(times),
      steps_s=[round(x, 6) for x in times],
      compile_s=compile_s,
      first_loss=first['loss'],
      first_entropy=first['entropy'],
      **stats,
  )


def _check_same_computation(ours, peer):
  """Raises ValueError unless both sides' first loss and entropy agree."""
  for key in ('first_loss', 'first_entropy'):
    if not abs(ours[key] - peer[key]) <= 1e-3 * (1.0 + abs(peer[key])):
      raise ValueError(
          f'The naive update is not the same computation: {key} '
          f'{peer[key]} vs ours {ours[key]}.'
      )
