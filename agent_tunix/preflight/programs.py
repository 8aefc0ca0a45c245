"""The trainer's programs compiled for a mesh, in this process.

`compile_programs` calls the trainer's own functions (rollout.Rollout,
episodes.EpisodeRollout, grpo, gemma_backend) on the abstract model of
`abstract` and compiles them with `compiler.Compiler`, in PROGRAMS order.
Imports judge/, rl/, tpu/ and the modules beside it.
"""

import math

from flax import nnx
import jax
import jax.numpy as jnp

from agent_tunix.judge import gemma_backend
from agent_tunix.preflight import abstract
from agent_tunix.preflight import analytic
from agent_tunix.preflight import compiler as compiler_lib
from agent_tunix.preflight import standins
from agent_tunix.preflight import tunix_programs
from agent_tunix.rl import episodes
from agent_tunix.rl import grpo
from agent_tunix.rl import rollout as rollout_lib
from agent_tunix.tpu import sharding

PROGRAMS = ('rollout_prefill', 'rollout_decode', 'reference_logps',
            'policy_logps', 'update', 'judge', 'tunix')
# Rubric items per row the judge program's calls per step assume.
JUDGE_ITEMS_PER_ROW = 8
# Tokens of a judge prompt besides the question and the response: the
# item, the reference answer and the fixed text.
_JUDGE_OVERHEAD_TOKENS = 128
# The `function` of the rollout_decode row with episodes (agent.tools or
# agent.environment).
EPISODE_DECODE = 'episodes.EpisodeRollout.decode_fn'


def _compile_rollout(config, mesh, sampler, episode, compiler, programs,
                     opt_bytes, windows):
  """Compiles the prefill and the decode loop (`episode`'s when not None)."""
  g, gen = config.grpo, config.generation
  prompts = config.training.batch_size
  prompt_len = gen.max_prompt_length
  total = prompt_len + gen.max_generation_steps
  template = sampler.state_template(
      prompt_len, total, 0,
      **rollout_lib.sampling_args(gen.temperature, gen.top_k, gen.top_p))
  prompt_sds = jax.ShapeDtypeStruct(
      (prompts, prompt_len), jnp.int32,
      sharding=sharding.batch_sharding(mesh, 2, rows=prompts),
  )
  key_sds = jax.ShapeDtypeStruct(
      (2,), jnp.uint32, sharding=sharding.replicated(mesh)
  )
  init_lowered = sampler.init_arrays_fn.lower(
      prompt_sds, key_sds, total_steps=total
  )
  arrays = compiler_lib.sharded_outputs(init_lowered, init_lowered.compile())
  state = template.replace(**arrays)
  weights = compiler_lib.per_chip_bytes(sampler.params)
  # The cache of the N x G rows the prefill returns.
  kv_bytes = (compiler_lib.per_chip_bytes(state.cache)
              * g.num_generations)
  state = compiler(
      'rollout_prefill', sampler.prefill_fn, (sampler.params, state),
      {'num_generations': g.num_generations}, 1, opt_bytes,
      function='rollout.Rollout.prefill_fn',
      analytic=analytic.prefill(weights, kv_bytes, total, prompt_len),
  )
  if 'rollout_decode' not in programs:
    return
  if state is None:
    compiler.skip('rollout_decode')
    return
  steps = gen.max_generation_steps
  step_floor = analytic.decode_step(
      weights, compiler_lib.per_chip_bytes(state.cache),
      windows, total,
      prompt_len, steps)
  if episode is None:
    compiler(
        'rollout_decode', sampler.decode_fn, (sampler.params, state), {},
        steps, opt_bytes, open_loop_trips=steps,
        function='rollout.Rollout.decode_fn', analytic=step_floor,
    )
  else:
    # Every column, inserted or sampled, is one step of the loop.
    inputs = abstract.episode_decode_inputs(
        mesh, prompts * g.num_generations, total)
    compiler(
        'rollout_decode', episode.decode_fn,
        (sampler.params, state, *inputs), {}, steps, opt_bytes,
        open_loop_trips=steps, function=EPISODE_DECODE,
        analytic=step_floor,
    )


def _compile_learner(config, mesh, model, optimizer, compiler, programs,
                     opt_bytes):
  """Compiles the log-prob passes and the update, with their floors."""
  hp = grpo.hparams_from_config(config)
  g = config.grpo
  micro_batches = config.training.batch_size // config.training.micro_batch_size
  batch = abstract.update_batch(config, mesh)
  logps_fn, model_state = grpo.logps_program(model)
  logps_batch = grpo.logps_inputs(batch)
  graphdefs, (lora, frozen, opt_state) = grpo.train_step_inputs(
      model, optimizer)
  weights = compiler_lib.per_chip_bytes(frozen)
  logps_floor = analytic.logps(weights, micro_batches)
  if 'reference_logps' in programs and hp.needs_reference:
    compiler('reference_logps', logps_fn, (model_state, logps_batch),
             {'hp': hp, 'use_lora': False}, 1, opt_bytes,
             function='grpo.logps_program', analytic=logps_floor)
  if 'policy_logps' in programs:
    # Once per step with num_iterations > 1; otherwise only before saves.
    every = config.checkpoint.save_interval_steps
    calls = 1 if g.num_iterations > 1 else (1 / every if every else 0)
    compiler('policy_logps', logps_fn, (model_state, logps_batch),
             {'hp': hp, 'use_lora': True}, calls, opt_bytes,
             function='grpo.logps_program', analytic=logps_floor)
  if 'update' in programs:
    # remat keeps each layer's input: tokens of a micro-batch on a chip x
    # the model width, per layer.
    tokens = compiler_lib.per_chip_bytes(batch.tokens) / 4 / micro_batches
    saved = (tokens * model.config.embed_dim * model.config.num_layers
             * jnp.dtype(config.model.dtype).itemsize)
    compiler('update', grpo.TRAIN_STEP(graphdefs),
             (lora, frozen, opt_state, batch), {'hp': hp},
             g.num_iterations, 0, function='grpo.TRAIN_STEP',
             analytic=analytic.update(
                 weights,
                 compiler_lib.per_chip_bytes((lora, opt_state)),
                 micro_batches, config.model.remat, saved))


def compile_programs(config, mesh, usable, programs=PROGRAMS,
                     keep_going=False, listener=None):
  """Compiles the trainer's programs for `mesh`, in this process.

  Args:
    config: the run's config (validated).
    mesh: a mesh of TPU (compile-only) devices.
    usable: HBM bytes a program may use on one device.
    programs: the subset of PROGRAMS to compile (those the config runs).
    keep_going: go on after a program that does not fit.
    listener: told of each compile as it starts and ends (`Compiler`).

  Returns:
    ([Program], [names of programs skipped after a misfit]).
  """
  model, optimizer = abstract.abstract_policy(config, mesh)
  gen = config.generation
  judge = abstract.abstract_judge(config, mesh)
  # Live through every program without being its argument: the optimizer
  # state, and a judge with its own weights.
  judge_bytes = (compiler_lib.per_chip_bytes(nnx.state(judge))
                 if judge is not None else 0)
  opt_bytes = (compiler_lib.per_chip_bytes(nnx.state(optimizer, nnx.OptState))
               + judge_bytes)
  compiler = compiler_lib.Compiler(usable, keep_going, listener)

  if {'rollout_prefill', 'rollout_decode'} & set(programs):
    multi_turn = episodes.enabled(config)
    sampler = rollout_lib.Rollout(
        model,
        (standins.EpisodeSpecialTokens(model.config.num_embed) if multi_turn
         else standins.GemmaSpecialTokens()),
        gen.kv_cache_size,
        cpu_decode_graph=gen.cpu_decode_graph,
    )
    if sampler.cpu_decode_graph:
      raise RuntimeError(
          'The sampler took the CPU decode graph on a TPU mesh; the '
          'preflight would compile a program the TPU never runs.'
      )
    # As the trainer builds it: its format's stop pieces join the end ids
    # the prefill and both decode loops read.
    episode = episodes.from_config(config, sampler) if multi_turn else None
    try:
      _compile_rollout(config, mesh, sampler, episode, compiler, programs,
                       opt_bytes, analytic.attention_windows(model))
    finally:
      if episode is not None:
        episode.close()

  _compile_learner(config, mesh, model, optimizer, compiler, programs,
                   opt_bytes)
  if 'judge' in programs and abstract.uses_gemma_judge(config):
    if judge is None:
      _compile_judge(config, mesh, model, compiler, opt_bytes)
    else:  # The policy's weights are resident while the judge runs.
      _compile_judge(config, mesh, judge, compiler, opt_bytes - judge_bytes
                     + compiler_lib.per_chip_bytes(nnx.state(model)))
  if 'tunix' in programs and not tunix_programs.why_not(config):
    if compiler.stopped:
      compiler.skip('tunix')
    else:  # tunix's own step for the same slice and shapes.
      compiler.listener('start', 'tunix', 1, 0, 0, 'tunix_programs')
      compiler.listener('tunix', tunix_programs.compile_all(
          config, mesh, model, optimizer, usable, opt_bytes))
  results = [p for p in compiler.programs if p.name in programs]
  return results, compiler.skipped


def _compile_judge(config, mesh, model, compiler, resident_bytes):
  """The Gemma judge's forward: judge.batch_size prompts of the longest
  bucket a prompt + completion + item can reach, replicated as the
  judge's host arrays are."""
  gen, j = config.generation, config.judge
  length = gemma_backend.bucket_length(
      gen.max_prompt_length + gen.max_generation_steps
      + _JUDGE_OVERHEAD_TOKENS)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype,
                                                   sharding=replicated)
  fn, state = gemma_backend.answer_logps_program(model)
  rows = config.training.batch_size * config.grpo.num_generations
  calls = math.ceil(rows * JUDGE_ITEMS_PER_ROW / j.batch_size)
  compiler('judge', fn,
           (state, spec((j.batch_size, length), jnp.int32),
            spec((j.batch_size, length), jnp.bool_), spec((4,), jnp.int32)),
           {'use_lora': False}, calls, resident_bytes,
           function='gemma_backend.answer_logps_program')


def runs(config, programs=PROGRAMS):
  """The `programs` the config runs, in PROGRAMS order."""
  hp = grpo.hparams_from_config(config)
  return [p for p in PROGRAMS if p in programs and
          (p != 'reference_logps' or hp.needs_reference) and
          (p != 'judge' or abstract.uses_gemma_judge(config)) and
          (p != 'tunix' or not tunix_programs.why_not(config))]
