"""The run's model, optimizer, judge and batches as shapes, placed as trained.

Every array is a ShapeDtypeStruct with the sharding the trainer gives it:
no weight or tokenizer file is read, so a 27B config is checked on a
laptop. Imports judge/, rl/, models/ and tpu/.
"""

from flax import nnx
import jax
import jax.numpy as jnp

from agent_tunix.judge import judge as judge_lib
from agent_tunix.models import gemma
from agent_tunix.models import lora
from agent_tunix.models import weights
from agent_tunix.rl import grpo
from agent_tunix.rl import optimizer as optimizer_lib
from agent_tunix.tpu import sharding


def with_shardings(tree, shardings):
  """ShapeDtypeStructs of `tree` carrying the matching shardings."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      tree, shardings,
  )


def abstract_policy(config, mesh):
  """The run's LoRA model and optimizer, abstract, placed as training does.

  The model is the preset's architecture with the config's dtype and LoRA
  (`models.lora.apply_lora`) and the optimizer the trainer's
  (`optimizer_lib.optimizer_from_config`), both built under
  `nnx.eval_shape`; every array is a ShapeDtypeStruct with the sharding the
  trainer gives it (`nnx.get_named_sharding` of the modules' sharding
  metadata: what `models.gemma` loads weights with and what qwix and the
  optimizer inherit; tests/preflight_test.py compares the two on fake
  devices).

  Returns:
    (model, optimizer) NNX objects whose arrays are ShapeDtypeStructs.
  """
  cfg = gemma.model_config(config.model)
  tx, _ = optimizer_lib.optimizer_from_config(config)

  def build():
    model = gemma.model_class(cfg)(cfg, rngs=nnx.Rngs(0))
    model = lora.apply_lora(model, config.model, seed=config.training.seed)
    return model, nnx.Optimizer(model, tx, wrt=nnx.LoRAParam)

  with weights.cheap_tracer_attribute_errors():
    model, optimizer = nnx.eval_shape(build)
  for obj in (model, optimizer):
    graphdef, state = nnx.split(obj)
    shardings = nnx.get_named_sharding(state, mesh)
    placed = with_shardings(state, shardings)
    nnx.update(obj, placed)
  return model, optimizer


def update_batch(config, mesh, completion_len=None):
  """Abstract update batch (grpo's layout), sharded as `shard_batch` does.

  Args:
    config: the run's config.
    mesh: the device mesh.
    completion_len: C; default generation.max_generation_steps.

  Returns:
    A `grpo.UpdateBatch` of ShapeDtypeStructs, the fields the update of
    this config reads (the others None).
  """
  g = config.grpo
  rows = config.training.batch_size * g.num_generations
  prompt = config.generation.max_prompt_length
  c = completion_len or config.generation.max_generation_steps
  shapes = {
      'tokens': ((rows, prompt + c), jnp.int32),
      'input_mask': ((rows, prompt + c), jnp.bool_),
      'completion_mask': ((rows, c), jnp.float32),
      'rewards': ((rows,), jnp.float32),
      'sampler_logps': ((rows, c), jnp.float32),
  }
  hp = grpo.hparams_from_config(config)
  if hp.needs_reference:
    shapes['ref_logps'] = ((rows, c), jnp.float32)
  for key in grpo.optional_inputs(config):
    shapes[key] = ((rows,), jnp.float32)
  if g.num_iterations > 1:
    shapes['old_logps'] = ((rows, c), jnp.float32)
  return grpo.UpdateBatch(**{
      key: jax.ShapeDtypeStruct(
          shape, dtype,
          sharding=sharding.batch_sharding(mesh, len(shape)),
      )
      for key, (shape, dtype) in shapes.items()
  })


def episode_decode_inputs(mesh, rows, total_steps):
  """The episode decode loop's inputs after the state, abstract and placed.

  `episodes.EpisodeRollout.generate` passes forced_tokens (int32) and
  forced (bool) [rows, total_steps] and turn_start (int32 [rows]), placed
  like the sampler's rows, and the per-turn cap (an int32 scalar, which
  jit replicates).

  Returns:
    (forced_tokens, forced, turn_start, turn_cap) ShapeDtypeStructs.
  """
  def rows_of(shape, dtype):
    return jax.ShapeDtypeStruct(
        shape, dtype,
        sharding=sharding.batch_sharding(mesh, len(shape), rows=rows))

  return (rows_of((rows, total_steps), jnp.int32),
          rows_of((rows, total_steps), jnp.bool_),
          rows_of((rows,), jnp.int32),
          jax.ShapeDtypeStruct((), jnp.int32,
                               sharding=sharding.replicated(mesh)))


def uses_gemma_judge(config):
  """True when the run's rubric_judge is the in-process Gemma (the judge
  program the preflight compiles)."""
  return judge_lib.uses_judge(config) and config.judge.backend == 'gemma'


def judge_model_config(config):
  """config.model of a Gemma judge with its own preset (no LoRA), or None
  when the judge is the policy's weights or not a Gemma."""
  if not uses_gemma_judge(config) or not config.judge.preset:
    return None
  m = config.model.copy_and_resolve_references()
  m.preset, m.lora_rank = config.judge.preset, 0
  return m


def abstract_judge(config, mesh):
  """The Gemma judge with its own preset, abstract and placed as the
  project's loader places it; None when there is none."""
  judge_cfg = judge_model_config(config)
  if judge_cfg is None:
    return None
  model = gemma.abstract_model(gemma.model_config(judge_cfg))
  _, state = nnx.split(model)
  nnx.update(model, with_shardings(state,
                                   nnx.get_named_sharding(state, mesh)))
  return model
