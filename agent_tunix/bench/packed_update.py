r"""A config's update on padded rows against packed rows, on its own rollout.

  python -m agent_tunix.bench.packed_update \
      --config=configs/gemma3_270m_tools.py --output=/tmp/packed.json

One batch of training prompts is sampled by the run's own rollout
(train.setup, the data pipeline's first batch, StepRollout: end tokens,
tools and rewards as in training), so the completions have the lengths a
run sees. That batch is then prepared as staging prepares it, once padded
(trimmed to its completion bucket) and once packed (grpo.pack_sequences),
and for each the reference pass (when the loss has a KL term) and
grpo.train_step are compiled, then run --steps times from the same LoRA
start with the same optimizer. Step k of both sides starts from the same
LoRA state as long as their updates agree, so their losses compare step
for step.

JSON written to --output: the batch's shape and "padding_share" (of the
model columns each side runs), the packed shape, and per side
"update_s" / "reference_s" (medians over --steps, compile excluded),
"compile_s", "losses" (one a step); then "loss_max_abs_diff" and
"update_speedup" (padded update_s / packed update_s). With --remat, the
packed update again under each model.remat mode: "packed_by_remat"
{mode: update_s, update_temp_bytes (XLA temp memory), compile_s, losses}.
"""

import dataclasses
import json
import tempfile

from absl import flags
from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from agent_tunix import cli
from agent_tunix.bench import context
from agent_tunix.bench import records
from agent_tunix.config import validation
from agent_tunix.data import pipeline
from agent_tunix.models import families
from agent_tunix.rl import grpo
from agent_tunix.rl import packing
from agent_tunix.rl import staging
from agent_tunix.run import train
from agent_tunix.tpu import sharding

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file.')
_STEPS = flags.DEFINE_integer('steps', 3, 'Timed updates a side.')
_OUTPUT = flags.DEFINE_string('output', '', 'JSON result path.')
_REMAT = flags.DEFINE_list(
    'remat', [], 'model.remat modes to also run the packed update under '
    '(time and XLA temp memory each), e.g. none,block,layer.')


def rollout_batch(session):
  """The host UpdateBatch of one step of `session`'s own rollout."""
  config = session.config
  turns = families.of_preset(config.model.preset).tool_format
  batches, _ = pipeline.make_train_iterator(
      config, session.tokenizer, jax.process_index(), jax.process_count(),
      turns=turns)
  rolled = session.rollout(next(batches), 1, session.state.kl_coeff,
                           batches)
  return rolled.update


def _compiled_logps(session, batch):
  fn, state = grpo.logps_program(session.model)
  compiled = fn.lower(state, grpo.logps_inputs(batch), hp=session.hp,
                      use_lora=False).compile()
  return lambda: compiled(state, grpo.logps_inputs(batch))


def run_side(session, host, pack, steps, remat=None):
  """Reference pass and `steps` updates of the batch prepared padded or
  packed (under `remat`, default the config's); the model's LoRA is
  restored after."""
  model, hp, mesh = session.model, session.hp, session.mesh
  if remat is not None:
    hp = dataclasses.replace(hp, remat=remat)
  prepared = staging.prepare(model, mesh, hp, host, pack)
  batch = sharding.shard_batch(prepared, mesh)
  side = {'packing': (dataclasses.asdict(prepared.packing)
                      if prepared.packing else None),
          'columns': list(np.shape(prepared.tokens))}
  compile_s, reference_s = 0.0, []
  if hp.needs_reference:
    t0 = records.now()
    reference = _compiled_logps(session, batch)
    compile_s += records.now() - t0
    for _ in range(steps):
      t0 = records.now()
      ref = jax.block_until_ready(reference())
      reference_s.append(records.now() - t0)
    batch = batch.replace(ref_logps=ref)
  start = jax.tree.map(jnp.copy, nnx.state(model, nnx.LoRAParam))
  optimizer = nnx.Optimizer(model, context.make_tx(session.config, steps),
                            wrt=nnx.LoRAParam)
  graphdefs, arrays = grpo.train_step_inputs(model, optimizer)
  t0 = records.now()
  compiled = grpo.TRAIN_STEP(graphdefs).lower(*arrays, batch,
                                              hp=hp).compile()
  compile_s += records.now() - t0
  temp_bytes = compiled.memory_analysis().temp_size_in_bytes
  update_s, losses = [], []
  for _ in range(steps):
    t0 = records.now()
    metrics = jax.device_get(grpo.run_train_step(
        lambda _: compiled, model, optimizer, batch))
    update_s.append(records.now() - t0)
    losses.append(float(metrics['loss']))
  nnx.update(model, start)
  return {**side, 'remat': hp.remat, 'update_temp_bytes': int(temp_bytes),
          'compile_s': compile_s, 'losses': losses,
          'update_s': records.median(update_s), 'update_steps_s': update_s,
          'reference_s': records.median(reference_s) if reference_s else None}


def measure(config, steps, remat_modes=()):
  """The result dict (see the module docstring)."""
  validation.validate(config)
  with tempfile.TemporaryDirectory(prefix='packed_') as workdir:
    session = train.setup(config, workdir, with_data=False)
    host = rollout_batch(session)
    sides = {name: run_side(session, host, pack, steps)
             for name, pack in (('padded', False), ('packed', True))}
    by_remat = {mode: run_side(session, host, True, steps, mode)
                for mode in remat_modes}
  trimmed = staging.prepare(session.model, session.mesh, session.hp, host,
                            False)
  padded, packed = sides['padded'], sides['packed']
  return {
      'config': config.model.preset,
      'rows': int(np.shape(host.tokens)[0]),
      'prompt_group': session.hp.prompt_group,
      'completion_tokens_counted': int(np.sum(host.completion_mask > 0)),
      'padding_share': packing.padding_share(
          trimmed.input_mask, trimmed.completion_mask,
          session.hp.prompt_group),
      **sides,
      'loss_max_abs_diff': float(np.max(np.abs(
          np.subtract(padded['losses'], packed['losses'])))),
      'update_speedup': padded['update_s'] / packed['update_s'],
      'packed_by_remat': {
          mode: {k: side[k] for k in ('update_s', 'update_temp_bytes',
                                      'compile_s', 'losses')}
          for mode, side in by_remat.items()},
  }


def main(argv):
  del argv
  if _STEPS.value < 1:
    raise SystemExit(f'--steps={_STEPS.value} must be >= 1.')
  result = measure(_CONFIG.value, _STEPS.value, _REMAT.value)
  text = json.dumps(result, indent=2)
  logging.info('%s', text)
  print(text)
  if _OUTPUT.value:
    with open(_OUTPUT.value, 'w') as f:
      f.write(text)


if __name__ == '__main__':
  cli.run(main)
