"""tunix's own GRPO step, compiled for the same slice and shapes.

What tunix 0.1.7's GRPOLearner on an RLCluster runs in one step, compiled
as it would be run: inside its mesh context, so with its models'
activation sharding (`tunix_adapter.activation_sharding`):

  * tunix_prefill: its Sampler's prefill over the N x G rows (tunix repeats
    each prompt G times and prefills them all, logits at every position);
  * tunix_decode: its Sampler's decode loop, on its graph unchanged;
  * tunix_reference_logps: `common.compute_per_token_logps` of the
    reference model over one micro-batch (when beta > 0);
  * tunix_train_step: PeftTrainer's train step with tunix's grpo_loss_fn
    over one micro-batch (its learner runs one per micro-batch).

The sampler's state is placed as this project places it (tunix builds it
on one device). `compile_all` compiles them; `report.tunix_section` makes
the report's `tunix` entry. Imports models/, rl/, tpu/ and the modules beside
it.
"""

import functools
import types

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from tunix.generate import sampler as sampler_lib
from tunix.rl import algo_core
from tunix.rl import common
from tunix.rl.grpo import grpo_learner
from tunix.sft import peft_trainer

from agent_tunix.models import families
from agent_tunix.models import tunix_adapter
from agent_tunix.preflight import compiler as compiler_lib
from agent_tunix.preflight import standins
from agent_tunix.rl import rollout as rollout_lib
from agent_tunix.tpu import sharding

PROGRAMS = ('tunix_prefill', 'tunix_decode', 'tunix_reference_logps',
            'tunix_train_step')
NOTES = (
    "tunix 0.1.7's GRPOLearner step: its sampler's prefill of every row "
    'and decode loop, its reference log-probs (beta > 0) and PeftTrainer '
    'train step once per micro-batch, compiled within its mesh context '
    "(activation sharding on) with this run's shapes, LoRA and optimizer; "
    'the sampling state is placed as this project places it. '
    'tunix_reference_logps is not compiled when beta = 0.')


def _rows_spec(mesh, shape, dtype):
  return jax.ShapeDtypeStruct(
      shape, dtype,
      sharding=sharding.batch_sharding(mesh, len(shape), rows=shape[0]))


def _sampler(config, model, compiler, mesh, opt_bytes):
  """Compiles tunix's prefill and decode loop over N x G rows."""
  gen, g = config.generation, config.grpo
  rows = config.training.batch_size * g.num_generations
  prompt_len = gen.max_prompt_length
  total = prompt_len + gen.max_generation_steps
  cfg = model.config
  tokenizer = standins.GemmaSpecialTokens()
  sampler = sampler_lib.Sampler(model, tokenizer, sampler_lib.CacheConfig(
      cache_size=gen.kv_cache_size, num_layers=cfg.num_layers,
      num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim))
  # What its __call__ sets before the prefill: the tokenizer's end id.
  sampler.eos_ids = np.array([tokenizer.eos_id()], np.int32)
  # This project's placed initial state for the same rows (the arrays do
  # not depend on the graph).
  ours = rollout_lib.Rollout(model, tokenizer, gen.kv_cache_size,
                             cpu_decode_graph=False)
  template = ours.state_template(
      prompt_len, total, 0,
      **rollout_lib.sampling_args(gen.temperature, gen.top_k, gen.top_p))
  lowered = ours.init_arrays_fn.lower(
      _rows_spec(mesh, (rows, prompt_len), jnp.int32),
      jax.ShapeDtypeStruct((2,), jnp.uint32,
                           sharding=sharding.replicated(mesh)),
      total_steps=total)
  state = template.replace(
      **compiler_lib.sharded_outputs(lowered, lowered.compile()))
  params = tunix_adapter.flattened_state(sampler)
  state = compiler('tunix_prefill', tunix_adapter.prefill_fn(sampler),
                   (params, state, None), {'echo': False}, 1, opt_bytes,
                   function='tunix Sampler._prefill_fn')
  if state is not None:
    steps = gen.max_generation_steps
    compiler('tunix_decode', tunix_adapter.decode_fn(sampler),
             (params, state), {}, steps, opt_bytes, open_loop_trips=steps,
             function='tunix Sampler._decode_fn')


def _example(config, mesh, with_reference):
  """One micro-batch as tunix's TrainExample, abstract and placed."""
  gen = config.generation
  m = config.training.micro_batch_size * config.grpo.num_generations
  p, c = gen.max_prompt_length, gen.max_generation_steps
  return common.TrainExample(
      prompt_ids=_rows_spec(mesh, (m, p), jnp.int32),
      prompt_mask=_rows_spec(mesh, (m, p), jnp.int32),
      completion_ids=_rows_spec(mesh, (m, c), jnp.int32),
      completion_mask=_rows_spec(mesh, (m, c), jnp.int32),
      advantages=_rows_spec(mesh, (m,), jnp.float32),
      ref_per_token_logps=(_rows_spec(mesh, (m, c), jnp.float32)
                           if with_reference else None),
      old_per_token_logps=None,
  )


def _algo(config):
  g = config.grpo
  algo = grpo_learner.GRPOConfig(
      num_generations=g.num_generations, num_iterations=g.num_iterations,
      beta=g.beta, epsilon=g.epsilon, loss_agg_mode=g.loss_agg_mode)
  algo.temperature = config.generation.temperature or 1.0
  return algo


def _train_step_fn(graphdefs, algo, lora, rest, opt_state, example):
  """PeftTrainer._train_step with GRPOLearner's loss, as a function."""
  graphdef, opt_graphdef = graphdefs
  model = nnx.merge(graphdef, lora, rest)
  optimizer = nnx.merge(opt_graphdef, opt_state)
  tokens = standins.GemmaSpecialTokens()
  trainer = types.SimpleNamespace(
      gen_model_input_fn=lambda x: {'train_example': x, 'algo_config': algo},
      loss_fn=lambda model, train_example, algo_config: algo_core.grpo_loss_fn(
          model, train_example, algo_config=algo, pad_id=tokens.pad_id(),
          eos_id=tokens.eos_id()),
      _lora_enabled=True, _has_aux=True)
  loss, _, _ = peft_trainer.PeftTrainer._train_step(  # pylint: disable=protected-access
      trainer, model, optimizer, example)
  return nnx.state(model, nnx.LoRAParam), nnx.state(optimizer), loss


def _learner(config, model, optimizer, compiler, mesh, opt_bytes):
  """Compiles the reference log-probs and the train step, per micro-batch."""
  g, t = config.grpo, config.training
  micro_batches = t.batch_size // t.micro_batch_size
  example = _example(config, mesh, g.beta > 0)
  tokens = standins.GemmaSpecialTokens()
  if g.beta > 0:
    graphdef, state = nnx.split(model)
    fn = functools.partial(
        common.compute_per_token_logps.lower, graphdef)
    compiler('tunix_reference_logps',
             types.SimpleNamespace(lower=fn),
             (state, example.prompt_ids, example.completion_ids),
             {'pad_id': tokens.pad_id(), 'eos_id': tokens.eos_id(),
              'stop_gradient': True, 'return_logits': False,
              'temperature': config.generation.temperature or 1.0},
             micro_batches, opt_bytes,
             function='tunix common.compute_per_token_logps')
  graphdef, lora, rest = nnx.split(model, nnx.LoRAParam, ...)
  opt_graphdef, opt_state = nnx.split(optimizer)
  step = jax.jit(functools.partial(_train_step_fn, (graphdef, opt_graphdef),
                                   _algo(config)), donate_argnums=(2,))
  compiler('tunix_train_step', step, (lora, rest, opt_state, example), {},
           micro_batches * g.num_iterations, 0,
           function='tunix PeftTrainer._train_step + grpo_loss_fn')


def why_not(config):
  """Why tunix's step cannot be compiled for `config`, or ''."""
  if families.of_preset(config.model.preset).name != 'gemma3':
    return ("compiled for Gemma 3 only: tunix's Gemma 4 sampler and "
            'trainer are not compiled side by side')
  if config.agent.tools or config.agent.environment:
    return ("tunix's GRPOLearner samples single turns; this run's "
            'rollouts are tool or environment episodes')
  if config.grpo.loss_agg_mode not in _TUNIX_AGGREGATIONS:
    return (f"tunix's grpo_loss_fn has no loss_agg_mode "
            f'{config.grpo.loss_agg_mode!r}')
  return ''


_TUNIX_AGGREGATIONS = ('token-mean', 'sequence-mean-token-mean',
                       'sequence-mean-token-sum')


def compile_all(config, mesh, model, optimizer, usable, opt_bytes):
  """tunix's programs (`compiler.Program`s), compiled in its mesh context."""
  compiler = compiler_lib.Compiler(usable, keep_going=True)
  with tunix_adapter.activation_sharding(mesh):
    _sampler(config, model, compiler, mesh, opt_bytes)
    _learner(config, model, optimizer, compiler, mesh, opt_bytes)
  return compiler.programs
