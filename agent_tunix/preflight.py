r"""Compiles a run's training programs for a TPU slice, on any machine.

  python -m agent_tunix.preflight --config=configs/gemma3_1b.py \
      --topology=v5litepod-8 [--output=preflight.json]

libtpu compiles for a TPU topology without a TPU (`tpu_topology`). The
preflight builds the run's model abstractly (shapes and shardings: no
weight or tokenizer file is read, so a 27B config is checked on a laptop),
places it on a mesh of the slice's devices exactly as the trainer places
it, and compiles the functions training runs, with the config's mesh,
batch, micro-batching, remat, LoRA and KV cache:

  rollout_prefill  rollout.Rollout.prefill_fn: the distinct prompts through
                   the model into the KV cache, then G rows per prompt
  rollout_decode   rollout.Rollout.decode_fn: the sampler's decode loop
                   (XLA's cost analysis counts the loop body once, so its
                   flops and bytes are those of one decode step). With
                   agent.tools or agent.environment (multi-turn episodes,
                   `episodes.enabled`), the episode decode loop instead:
                   episodes.EpisodeRollout.decode_fn of the EpisodeRollout
                   `episodes.from_config` builds over that Rollout, as the
                   trainer does, with its per-row inputs (forced tokens and
                   flags [B, prompt + completion], turn starts [B], the
                   per-turn cap); it exits at every turn end and is called
                   again with the same shapes, so it is one program. The
                   row keeps its name; its `function` (JSON and report)
                   says which loop was compiled. The preflight reads no
                   vocabulary, so no piece holds a pause text: the loop is
                   compiled without its pause-token check (one comparison
                   of each row's token against a constant list of ids per
                   step; the tool environments' ']' and answer_end's '>'
                   are in 7,356 of Gemma 3's pieces).
  reference_logps  grpo.logps_program (LoRA off), when grpo.beta > 0 or MaxEnt
  policy_logps     the same with LoRA on: the old-policy log-probs when
                   grpo.num_iterations > 1, and the finiteness check before
                   every checkpoint save (divergence.check_state)
  update           grpo.TRAIN_STEP: gradient over the micro-batches and the
                   optimizer step
  judge            gemma_backend.answer_logps_program, when the rubric_judge
                   reward's judge is the in-process Gemma (judge.backend=
                   gemma): the policy's weights (judge.preset '') or the
                   judge's own preset, whose weights then stay on the chips
                   through every program (counted as resident);
                   judge.batch_size prompts of the longest length bucket,
                   called for 8 rubric items per completion a step

For each program, per chip, from the TPU compiler (`memory_analysis()`):
argument, output, temporary and code bytes; their total, plus the state
that lives through the program without being its argument (the optimizer
state during the rollout and the log-prob passes), against the HBM the
compiler lets one program use on the device (asked of the compiler; a
program the compiler refuses for want of HBM is reported with the bytes it
said it needs).
From `cost_analysis()`: flops and bytes accessed per chip. Time figures are
bounds, not measurements: a roofline lower bound per call, max(flops / peak
bf16 FLOP/s, bytes / HBM bandwidth) with the chip's published figures
(`tpu_topology.CHIPS`), and a step estimate summing prefill, one decode
step per generated token, the log-prob passes and num_iterations updates.
XLA counts a loop body once: the update's and the log-prob passes' figures
are one micro-batch's times the number of micro-batches; the log-prob
chunks inside are still counted once, so the bounds stay below the work.
The byte count includes the compiler's copies between HBM and on-chip
memory, so the byte term can be longer than HBM traffic alone takes.
For a mixture-of-experts preset the report adds what routing costs per
token and layer, counted from the config (`gemma4.moe_costs`): the
router's FLOPs against the routed experts' (and their LoRA's with
model.lora_experts), and the activations the dispatch copies.

Programs are compiled in the order above, in a child process (one model
build for all of them), and the preflight stops at the first that does not
fit (its arguments alone overflow, or the compiler refuses it for want of
HBM); `--keep_going` compiles the rest too. A compile can need more host RAM
than the machine has: the kernel then kills the child (SIGKILL), and the
report names the program as KILLED with the peak host RAM the child had
reached and the fixes (a machine with more RAM, or `--programs=<it>` alone);
with `--keep_going` a new child compiles the programs after it. Exit status
0 when every program fits, 1 when one does not (the report names it, the
bytes over and the fixes that apply), 2 on a bad flag or config, 3 when
none is known not to fit but a compile was killed.
"""

import contextlib
import dataclasses
import gc
import json
import math
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import traceback

from absl import app
from absl import flags
from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
from jax._src.interpreters import partial_eval  # pylint: disable=g-direct-jax-import
from ml_collections import config_flags

from agent_tunix import cli
from agent_tunix.config import validation
from agent_tunix.judge import gemma_backend
from agent_tunix.judge import judge as judge_lib
from agent_tunix.models import gemma
from agent_tunix.models import gemma4 as gemma4_lib
from agent_tunix.models import lora
from agent_tunix.rl import episodes
from agent_tunix.rl import grpo
from agent_tunix.rl import optimizer as optimizer_lib
from agent_tunix.rl import rollout as rollout_lib
from agent_tunix.tpu import sharding
from agent_tunix.tpu import topology as tpu_topology

PROGRAMS = ('rollout_prefill', 'rollout_decode', 'reference_logps',
            'policy_logps', 'update', 'judge')
# Rubric items per row the judge program's calls per step assume.
JUDGE_ITEMS_PER_ROW = 8
# Tokens of a judge prompt besides the question and the response: the
# item, the reference answer and the fixed text.
_JUDGE_OVERHEAD_TOKENS = 128
# The `function` of the rollout_decode row with episodes (agent.tools or
# agent.environment).
EPISODE_DECODE = 'episodes.EpisodeRollout.decode_fn'


# The TPU compiler's refusal of a program larger than the HBM, in the two
# wordings libtpu has used ('... (17.2G) exceeds available HBM' and
# 'Ran out of memory in memory space hbm. Used 15.84G of 15.75G hbm.').
_OUT_OF_HBM = re.compile(
    r'RESOURCE_EXHAUSTED: Ran out of memory on HBM.*? \(([\d.]+)([KMGT]?)\) '
    r'exceeds available HBM'
    r'|Ran out of memory in memory space hbm\. Used ([\d.]+)([KMGT]?) of'
)


def hbm_refusal_bytes(message):
  """Bytes the compiler said a refused program needs, or None."""
  match = _OUT_OF_HBM.search(message)
  if not match:
    return None
  groups = match.groups()
  value, unit = groups[:2] if groups[0] is not None else groups[2:]
  return tpu_topology.parse_bytes(value, unit)


class GemmaSpecialTokens:
  """The Gemma 3 vocabulary's special ids, for building the sampler.

  The compiled programs need only these ids (padding, end tokens); the
  preflight reads no tokenizer file. The ids are those of every Gemma 3
  SentencePiece model (models/tokenizer.py rebuilds the same from GGUF).
  """

  _PIECES = {'<pad>': 0, '<eos>': 1, '<bos>': 2, '<unk>': 3,
             '<start_of_turn>': 105, '<end_of_turn>': 106}

  def pad_id(self):
    return 0

  def eos_id(self):
    return 1

  def bos_id(self):
    return 2

  def unk_id(self):
    return 3

  def piece_to_id(self, piece):
    return self._PIECES.get(piece, self.unk_id())

  def encode(self, text, **kwargs):
    raise NotImplementedError('The preflight compiles programs; no text.')

  def decode(self, ids, **kwargs):
    raise NotImplementedError('The preflight compiles programs; no text.')


class EpisodeSpecialTokens(GemmaSpecialTokens):
  """What `episodes.from_config` reads of a tokenizer, still without text.

  The episode sampler looks up its format's control pieces, lists the
  pieces that hold a pause text and tokenizes the marker it puts in cut
  inserts. Only the special pieces are known here, so no id holds a pause
  text (the compiled loop has no pause-token check), and the marker, used
  on the host only, is empty.
  """

  def __init__(self, vocab_size):
    self._size = int(vocab_size)
    self._pieces = {i: p for p, i in self._PIECES.items()}

  def get_piece_size(self):
    return self._size

  def id_to_piece(self, i):
    return self._pieces.get(int(i), '')

  def encode(self, text, **kwargs):
    del text, kwargs
    return []


@dataclasses.dataclass
class Program:
  """One compiled program's per-chip figures."""

  name: str
  calls_per_step: float  # Amortised: policy_logps runs once per save.
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  code_bytes: int
  resident_bytes: int  # live state that is not an argument
  flops: float
  bytes_accessed: float
  compile_s: float
  # When the compiler refused the program for want of HBM: its message and
  # the bytes it said the program needs.
  error: str = ''
  required_bytes: int = 0
  # XLA's cost analysis counts a loop body once; flops and bytes_accessed
  # are its figures times this (the micro-batches of the log-prob passes
  # and the update).
  loop_trips: int = 1
  # The trainer's function compiled, e.g. 'rollout.Rollout.decode_fn' or,
  # with episodes, 'episodes.EpisodeRollout.decode_fn'.
  function: str = ''

  @property
  def total_bytes(self):
    own = (self.argument_bytes + self.output_bytes - self.alias_bytes +
           self.temp_bytes + self.code_bytes)
    return max(own, self.required_bytes) + self.resident_bytes

  def time_bound_s(self, chip, devices_per_chip=1):
    """Roofline lower bound of one call on one device, in seconds."""
    return max(self.flops * devices_per_chip / chip.peak_bf16_flops,
               self.bytes_accessed * devices_per_chip / chip.hbm_bandwidth)


@dataclasses.dataclass
class Killed(Program):
  """A program whose compile the kernel killed (SIGKILL): no figures.

  A kernel out of host memory kills the largest process; compiling a big
  model's program can take tens of GiB of host RAM.
  """

  killed: bool = True
  host_peak_bytes: int = 0  # Peak resident memory of the compiling process.


def _per_chip_bytes(tree):
  """Bytes one chip holds of the (abstract, sharded) arrays of `tree`."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    if not hasattr(leaf, 'shape'):  # Python scalars of the sampler state.
      continue
    shape = leaf.shape
    if getattr(leaf, 'sharding', None) is not None:
      shape = leaf.sharding.shard_shape(shape)
    total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
  return total


def _abstract_placed(tree, shardings):
  """ShapeDtypeStructs of `tree` carrying the matching shardings."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      tree, shardings,
  )


@contextlib.contextmanager
def _cheap_tracer_attribute_errors():
  """Tracers raise AttributeError without searching where they came from.

  qwix and flax probe `getattr(x, 'sharding', None)` on every weight while
  LoRA is applied; on a tracer that raises an AttributeError whose message
  JAX builds by searching the whole traced program for the value's origin.
  Tracing the model abstractly makes that quadratic in its size (4B: 66 of
  the 73 s it took to build, 27B: minutes). Only the message is dropped;
  the error is the same. Private JAX API: skipped if it is not there.
  """
  tracer = getattr(partial_eval, 'DynamicJaxprTracer', None)
  original = tracer and tracer.__dict__.get('_origin_msg')
  if original is None:
    yield
    return
  tracer._origin_msg = lambda self: ''  # pylint: disable=protected-access
  try:
    yield
  finally:
    tracer._origin_msg = original  # pylint: disable=protected-access


def abstract_policy(config, mesh):
  """The run's LoRA model and optimizer, abstract, placed as training does.

  The model is the preset's architecture with the config's dtype and LoRA
  (`models.lora.apply_lora`) and the optimizer the trainer's
  (`optimizer_lib.optimizer_from_config`), both built under `nnx.eval_shape`; every
  array is a ShapeDtypeStruct with the sharding the trainer gives it
  (`nnx.get_named_sharding` of the modules' sharding metadata: what
  `models.gemma` loads weights with and what qwix and the optimizer
  inherit; tests/preflight_test.py compares the two on fake devices).

  Returns:
    (model, optimizer) NNX objects whose arrays are ShapeDtypeStructs.
  """
  cfg = gemma.model_config(config.model)
  tx, _ = optimizer_lib.optimizer_from_config(config)

  def build():
    model = gemma.model_class(cfg)(cfg, rngs=nnx.Rngs(0))
    model = lora.apply_lora(model, config.model, seed=config.training.seed)
    return model, nnx.Optimizer(model, tx, wrt=nnx.LoRAParam)

  with _cheap_tracer_attribute_errors():
    model, optimizer = nnx.eval_shape(build)
  for obj in (model, optimizer):
    graphdef, state = nnx.split(obj)
    shardings = nnx.get_named_sharding(state, mesh)
    placed = _abstract_placed(state, shardings)
    nnx.update(obj, placed)
  return model, optimizer


def update_batch(config, mesh, completion_len=None):
  """Abstract update batch (grpo's layout), sharded as `shard_batch` does.

  Args:
    config: the run's config.
    mesh: the device mesh.
    completion_len: C; default generation.max_generation_steps.

  Returns:
    dict of ShapeDtypeStructs, the keys the update of this config reads.
  """
  g = config.grpo
  rows = config.training.batch_size * g.num_generations
  prompt = config.generation.max_prompt_length
  c = completion_len or config.generation.max_generation_steps
  shapes = {
      'tokens': ((rows, prompt + c), jnp.int32),
      'input_mask': ((rows, prompt + c), jnp.bool_),
      'completion_mask': ((rows, c), jnp.float32),
      'advantages': ((rows,), jnp.float32),
      'sampler_logps': ((rows, c), jnp.float32),
  }
  hp = grpo.hparams_from_config(config)
  if hp.needs_reference:
    shapes['ref_logps'] = ((rows, c), jnp.float32)
  for key in grpo.optional_inputs(config):
    shapes[key] = ((rows,), jnp.float32)
  if g.num_iterations > 1:
    shapes['old_logps'] = ((rows, c), jnp.float32)
  return {
      key: jax.ShapeDtypeStruct(
          shape, dtype,
          sharding=sharding.batch_sharding(mesh, len(shape)),
      )
      for key, (shape, dtype) in shapes.items()
  }


def _outputs(lowered, compiled):
  """The compiled program's outputs as sharded ShapeDtypeStructs."""
  return jax.tree.map(
      lambda info, s: jax.ShapeDtypeStruct(info.shape, info.dtype,
                                           sharding=s),
      lowered.out_info, compiled.output_shardings,
  )


class _Compiler:
  """Compiles programs in turn, stopping at the first that does not fit.

  Attributes:
    usable: HBM bytes a program may use on one device.
    keep_going: compile every program even after one did not fit.
    programs: the `Program`s so far.
    skipped: names of programs not compiled (after a misfit).
    listener: called as each thing happens: ('start', name, calls_per_step,
      argument bytes, resident bytes, function) as a compile starts,
      ('program', Program) as one is done, ('skipped', name).
  """

  def __init__(self, usable, keep_going=False, listener=None):
    self.usable = usable
    self.keep_going = keep_going
    self.programs = []
    self.skipped = []
    self.listener = listener or (lambda *event: None)

  def skip(self, name):
    self.skipped.append(name)
    self.listener('skipped', name)

  def _add(self, program):
    self.programs.append(program)
    self.listener('program', program)

  @property
  def stopped(self):
    return not self.keep_going and any(
        p.error or p.total_bytes > self.usable for p in self.programs)

  def __call__(self, name, fn, args, kwargs, calls_per_step, resident_bytes,
               loop_trips=1, function=''):
    """Compiles `fn(*args, **kwargs)`; returns its sharded outputs or None.

    Args:
      name: the program's name (PROGRAMS).
      fn: a jitted function.
      args: its positional arguments (sharded ShapeDtypeStructs).
      kwargs: its static keyword arguments.
      calls_per_step: calls per training step.
      resident_bytes: per-device bytes of live state outside its arguments.
      loop_trips: trips of the loop that holds nearly all of the program's
        work (the micro-batches); XLA's cost counts its body once.
      function: the trainer's function `fn` is, for the report.

    Returns:
      The outputs as ShapeDtypeStructs, or None when not compiled.
    """
    if self.stopped:
      self.skip(name)
      return None
    start = time.perf_counter()
    arg_bytes = _per_chip_bytes(args)
    if arg_bytes + resident_bytes > self.usable:
      # The inputs alone overflow: no need to ask the compiler.
      self._add(_refused(
          name, calls_per_step, arg_bytes, resident_bytes, start,
          f'its arguments alone take {_gib(arg_bytes)} GiB per device',
          arg_bytes, function))
      return None
    self.listener('start', name, calls_per_step, arg_bytes, resident_bytes,
                  function)
    logging.info('Compiling %s ...', name)
    lowered = fn.lower(*args, **kwargs)
    try:
      compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
      needed = hbm_refusal_bytes(str(e))
      if needed is None:
        raise
      self._add(_refused(
          name, calls_per_step, arg_bytes, resident_bytes, start,
          str(e).strip().splitlines()[0], needed, function))
      return None
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    program = Program(
        name=name,
        calls_per_step=calls_per_step,
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        code_bytes=int(memory.generated_code_size_in_bytes),
        resident_bytes=int(resident_bytes),
        flops=float(cost.get('flops', 0.0)) * loop_trips,
        bytes_accessed=float(cost.get('bytes accessed', 0.0)) * loop_trips,
        compile_s=seconds,
        loop_trips=loop_trips,
        function=function,
    )
    logging.info('Compiled %s in %.1f s: %s GiB per device', name, seconds,
                 _gib(program.total_bytes))
    self._add(program)
    outputs = _outputs(lowered, compiled)
    # Free the executable and JAX's tracing caches before the next compile:
    # kept, they added up (the 4B on a v5litepod-8 grew to 24 GiB of host
    # RAM and was killed compiling its update, which alone peaks at 13.5).
    del lowered, compiled
    jax.clear_caches()
    gc.collect()
    return outputs


def _refused(name, calls_per_step, arg_bytes, resident_bytes, start, error,
             required, function=''):
  logging.info('%s does not fit: %s', name, error)
  return Program(
      name=name, calls_per_step=calls_per_step, argument_bytes=arg_bytes,
      output_bytes=0, alias_bytes=0, temp_bytes=0, code_bytes=0,
      resident_bytes=int(resident_bytes), flops=0.0, bytes_accessed=0.0,
      compile_s=time.perf_counter() - start, error=error,
      required_bytes=required, function=function,
  )


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


def _compile_rollout(config, mesh, sampler, episode, compiler, programs,
                     opt_bytes):
  """Compiles the prefill and the decode loop (`episode`'s when not None)."""
  g, gen = config.grpo, config.generation
  prompts = config.training.batch_size
  prompt_len = gen.max_prompt_length
  total = prompt_len + gen.max_generation_steps
  greedy = gen.temperature <= 0
  template = sampler.state_template(
      prompt_len, total, 0, temperature=float(gen.temperature),
      top_p=None if greedy else float(gen.top_p),
      top_k=None if greedy or not gen.top_k else int(gen.top_k),
  )
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
  arrays = _outputs(init_lowered, init_lowered.compile())
  state = template.replace(**arrays)
  state = compiler(
      'rollout_prefill', sampler.prefill_fn, (sampler.params, state),
      {'num_generations': g.num_generations}, 1, opt_bytes,
      function='rollout.Rollout.prefill_fn',
  )
  if 'rollout_decode' not in programs:
    return
  if state is None:
    compiler.skip('rollout_decode')
  elif episode is None:
    compiler(
        'rollout_decode', sampler.decode_fn, (sampler.params, state), {},
        gen.max_generation_steps, opt_bytes,
        function='rollout.Rollout.decode_fn',
    )
  else:
    # Every column, inserted or sampled, is one step of the loop.
    inputs = episode_decode_inputs(mesh, prompts * g.num_generations, total)
    compiler(
        'rollout_decode', episode.decode_fn,
        (sampler.params, state, *inputs), {}, gen.max_generation_steps,
        opt_bytes, function=EPISODE_DECODE,
    )


def compile_programs(config, mesh, usable, programs=PROGRAMS,
                     keep_going=False, listener=None):
  """Compiles the trainer's programs for `mesh`, in this process.

  Args:
    config: the run's config (validated).
    mesh: a mesh of TPU (compile-only) devices.
    usable: HBM bytes a program may use on one device.
    programs: the subset of PROGRAMS to compile (those the config runs).
    keep_going: go on after a program that does not fit.
    listener: told of each compile as it starts and ends (`_Compiler`).

  Returns:
    ([Program], [names of programs skipped after a misfit]).
  """
  model, optimizer = abstract_policy(config, mesh)
  hp = grpo.hparams_from_config(config)
  g, gen = config.grpo, config.generation
  judge = abstract_judge(config, mesh)
  # Live through every program without being its argument: the optimizer
  # state, and a judge with its own weights.
  judge_bytes = _per_chip_bytes(nnx.state(judge)) if judge is not None else 0
  opt_bytes = _per_chip_bytes(nnx.state(optimizer, nnx.OptState)) + judge_bytes
  compiler = _Compiler(usable, keep_going, listener)
  micro_batches = config.training.batch_size // config.training.micro_batch_size

  if {'rollout_prefill', 'rollout_decode'} & set(programs):
    multi_turn = episodes.enabled(config)
    sampler = rollout_lib.Rollout(
        model,
        (EpisodeSpecialTokens(model.config.num_embed) if multi_turn
         else GemmaSpecialTokens()),
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
                       opt_bytes)
    finally:
      if episode is not None:
        episode.close()

  batch = update_batch(config, mesh)
  logps_fn, model_state = grpo.logps_program(model)
  logps_batch = {k: batch[k] for k in ('tokens', 'input_mask',
                                       'completion_mask')}
  if 'reference_logps' in programs and hp.needs_reference:
    compiler('reference_logps', logps_fn, (model_state, logps_batch),
             {'hp': hp, 'use_lora': False}, 1, opt_bytes, micro_batches,
             function='grpo.logps_program')
  if 'policy_logps' in programs:
    # Once per step with num_iterations > 1; otherwise only before saves.
    every = config.checkpoint.save_interval_steps
    calls = 1 if g.num_iterations > 1 else (1 / every if every else 0)
    compiler('policy_logps', logps_fn, (model_state, logps_batch),
             {'hp': hp, 'use_lora': True}, calls, opt_bytes, micro_batches,
             function='grpo.logps_program')
  if 'update' in programs:
    graphdefs, arrays = grpo.train_step_inputs(model, optimizer)
    compiler('update', grpo.TRAIN_STEP(graphdefs), (*arrays, batch),
             {'hp': hp}, g.num_iterations, 0, micro_batches,
             function='grpo.TRAIN_STEP')
  if 'judge' in programs and uses_gemma_judge(config):
    if judge is None:
      _compile_judge(config, mesh, model, compiler, opt_bytes)
    else:  # The policy's weights are resident while the judge runs.
      _compile_judge(config, mesh, judge, compiler, opt_bytes - judge_bytes
                     + _per_chip_bytes(nnx.state(model)))
  results = [p for p in compiler.programs if p.name in programs]
  return results, compiler.skipped


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
  with _cheap_tracer_attribute_errors():
    model = gemma.abstract_model(gemma.model_config(judge_cfg))
  _, state = nnx.split(model)
  nnx.update(model, _abstract_placed(state,
                                     nnx.get_named_sharding(state, mesh)))
  return model


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


# Compile children run this; argv[1] is the descriptor their events go to.
_CHILD = ('import sys; from agent_tunix import preflight; '
          'preflight.compile_child(int(sys.argv[1]))')
# Tests set it to a program's name: the compile child kills itself (SIGKILL)
# as that program's compile starts, as the kernel's OOM killer would.
KILL_AT_ENV = 'AGENT_TUNIX_PREFLIGHT_TEST_KILL_AT'
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def runs(config, programs=PROGRAMS):
  """The `programs` the config runs, in PROGRAMS order."""
  hp = grpo.hparams_from_config(config)
  return [p for p in PROGRAMS if p in programs and
          (p != 'reference_logps' or hp.needs_reference) and
          (p != 'judge' or uses_gemma_judge(config))]


def compile_isolated(config, topology, usable, programs=PROGRAMS,
                     keep_going=False):
  """`compile_programs` in a child process, which the kernel may kill.

  A program's compile can take more host RAM than the machine has; the
  kernel then kills the compiling process (SIGKILL) and all it printed was
  "Killed". Here that is the child: the program it was compiling comes
  back as a `Killed` with the peak host memory the child reached, the
  programs after it are skipped (or, with `keep_going`, compiled by a new
  child), and the report says so. The child builds the abstract model once
  and compiles the programs in turn, as `compile_programs` in this process
  would, so the report is the same.

  Args:
    config: the run's config (validated).
    topology: the slice (a `tpu_topology.parse` name).
    usable: HBM bytes a program may use on one device.
    programs: the subset of PROGRAMS to compile.
    keep_going: go on after a program that does not fit or was killed.

  Returns:
    ([Program], [names of programs skipped]), as `compile_programs`.
  """
  todo = runs(config, programs)
  done, skipped = [], []
  while todo:
    compiled, more, killed = _compile_in_child(config, topology, usable, todo,
                                               keep_going)
    done += compiled
    skipped += more
    if killed is None:
      break
    done.append(killed)
    order = PROGRAMS.index(killed.name)
    todo = [p for p in todo if PROGRAMS.index(p) > order]
    if killed.name == 'rollout_prefill' and 'rollout_decode' in todo:
      todo.remove('rollout_decode')  # It starts from the prefill's outputs.
      skipped.append('rollout_decode')
    if not keep_going:
      skipped += todo
      break
  return done, skipped


def _compile_in_child(config, topology, usable, programs, keep_going):
  """One compile child's ([Program], [skipped], `Killed` or None)."""
  read_fd, write_fd = os.pipe()
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(
      [_ROOT] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
  try:
    child = subprocess.Popen([sys.executable, '-c', _CHILD, str(write_fd)],
                             stdin=subprocess.PIPE, pass_fds=(write_fd,),
                             env=env)
  finally:
    os.close(write_fd)
  try:
    child.stdin.write(pickle.dumps((config, topology, usable, programs,
                                    keep_going, logging.get_verbosity())))
    child.stdin.close()
  except BrokenPipeError:
    pass  # It died first; its exit status tells.
  compiled, skipped, started, finished, error = [], [], None, False, ''
  with os.fdopen(read_fd, 'rb') as events:
    while True:
      try:
        kind, *args = pickle.load(events)
      except (EOFError, pickle.UnpicklingError):
        break  # It is done or dead.
      if kind == 'start':
        started = (args, time.perf_counter())
      elif kind == 'program':
        compiled.append(args[0])
        started = None
      elif kind == 'skipped':
        skipped.append(args[0])
      elif kind == 'error':
        error = args[0]
      elif kind == 'done':
        finished = True
  _, status, usage = os.wait4(child.pid, 0)
  child.returncode = os.waitstatus_to_exitcode(status)
  if finished and child.returncode == 0:
    return compiled, skipped, None
  # ru_maxrss: kilobytes on Linux, bytes on macOS.
  peak = usage.ru_maxrss * (1 if sys.platform == 'darwin' else 1024)
  doing = f'compiling {started[0][0]}' if started else 'building the model'
  if child.returncode == -signal.SIGKILL:
    if not started:
      raise RuntimeError(
          f'The preflight\'s compile child was killed by the kernel '
          f'(SIGKILL) while {doing}, likely out of host memory, at '
          f'{_gib(peak)} GiB of host RAM (peak resident); run it on a '
          'machine with more RAM.')
    (name, calls_per_step, arg_bytes, resident_bytes,
     function), start = started
    logging.warning('%s: the compile child was killed by the kernel at %s '
                    'GiB of host RAM.', name, _gib(peak))
    killed = Killed(
        name=name, calls_per_step=calls_per_step, argument_bytes=arg_bytes,
        output_bytes=0, alias_bytes=0, temp_bytes=0, code_bytes=0,
        resident_bytes=int(resident_bytes), flops=0.0, bytes_accessed=0.0,
        compile_s=time.perf_counter() - start, function=function,
        error=(f'killed by the kernel (SIGKILL) while compiling, likely out '
               f'of host memory: the compiling process had reached '
               f'{_gib(peak)} GiB of host RAM (peak resident)'),
        host_peak_bytes=peak)
    return compiled, skipped, killed
  how = (f'died of signal {signal.Signals(-child.returncode).name}'
         if child.returncode < 0 else f'exited with status {child.returncode}')
  raise RuntimeError(
      f'The preflight\'s compile child {how} while {doing}'
      + (f':\n{error}' if error else ' (its output is above).'))


def compile_child(events_fd):
  """A compile child's main: `compile_programs` on its parent's payload.

  The payload (config, topology, usable, programs, keep_going, absl
  verbosity) comes pickled on stdin; the events of `_Compiler.listener`,
  then ('done',) or ('error', traceback), go pickled to `events_fd`.
  """
  (config, topology, usable, programs, keep_going,
   verbosity) = pickle.load(sys.stdin.buffer)
  flags.FLAGS(sys.argv[:1])
  logging.use_absl_handler()  # Logs to stderr as the command's own do.
  logging.set_verbosity(verbosity)
  kill_at = os.environ.get(KILL_AT_ENV)
  with os.fdopen(events_fd, 'wb') as out:

    def send(*event):
      pickle.dump(event, out)
      out.flush()
      if event[0] == 'start' and event[1] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

    try:
      spec = tpu_topology.parse(topology)
      mesh = sharding.make_mesh(config.mesh,
                                devices=tpu_topology.devices(spec))
      compile_programs(config, mesh, usable, programs, keep_going, send)
    except Exception:  # pylint: disable=broad-exception-caught
      send('error', traceback.format_exc())  # The parent raises it.
      sys.exit(1)
    send('done')


def host_fixes(program):
  """What to do about a program whose compile the kernel killed, as text."""
  return [
      'a machine with more host RAM',
      f'--programs={program.name} (one program per preflight run, so '
      'nothing compiled before it shares its process)',
  ]


def fixes(config, program, spec):
  """Config changes that lower `program`'s per-chip memory, as text."""
  out = []
  m, t, gen = config.model, config.training, config.generation
  if m.dtype == 'float32':
    out.append("--config.model.dtype=bfloat16 (halves the weights)")
  if program.name in ('update', 'reference_logps', 'policy_logps'):
    if t.micro_batch_size > 1:
      out.append(f'--config.training.micro_batch_size='
                 f'{max(1, t.micro_batch_size // 2)} (fewer rows per pass)')
    if program.name == 'update' and m.remat != 'layer':
      out.append("--config.model.remat=layer (keep only each layer's input)")
  else:
    need = gen.max_prompt_length + max(gen.max_generation_steps,
                                       config.eval.max_generation_steps)
    if gen.kv_cache_size > need:
      out.append(f'--config.generation.kv_cache_size={need} '
                 '(prompt + completion)')
    out.append(f'--config.training.batch_size='
               f'{max(1, t.batch_size // 2)} (fewer rows to sample)')
  shape = dict(zip(config.mesh.axis_names, config.mesh.shape))
  tp = shape.get('tp', 1)
  wider = [d for d in validation.tp_sizes(m) if d > tp]
  if wider and spec.num_chips % wider[0] == 0:
    out.append(f"a wider 'tp' mesh axis (now {tp}), e.g. "
               f"--config.mesh.shape='(-1, {wider[0]})' (shards heads and "
               'features)')
  out.append(f'a bigger slice than {spec.name} ({spec.num_chips} chips of '
             f'{spec.chip.hbm_bytes / tpu_topology.GiB:.0f} GiB)')
  return out


def report(config, spec, programs, usable, devices_per_chip=1,
           skipped=()):
  """The JSON-able report of a preflight.

  Args:
    config: the run's config.
    spec: the tpu_topology.Slice compiled for.
    programs: the compiled `Program`s.
    usable: HBM bytes the compiler lets a program use on one device
      (`tpu_topology.available_hbm_bytes`).
    devices_per_chip: JAX devices per chip (2 for libtpu's v4 topologies,
      one per TensorCore): each gets its share of the chip's compute and
      bandwidth.
    skipped: programs not compiled because an earlier one did not fit.

  Returns:
    A dict of plain values (see the module docstring).
  """
  chip = spec.chip
  rows = []
  step_s = 0.0
  for p in programs:
    bound = p.time_bound_s(chip, devices_per_chip)
    step_s += bound * p.calls_per_step
    fits = p.total_bytes <= usable and not p.error
    row = dataclasses.asdict(p)
    row.update(
        total_bytes=p.total_bytes,
        fits=fits,
        bytes_over=max(0, p.total_bytes - usable),
        time_bound_s=bound,
        fixes=([] if fits else host_fixes(p) if getattr(p, 'killed', False)
               else fixes(config, p, spec)),
    )
    rows.append(row)
  return {
      'config': {
          'preset': config.model.preset,
          'dtype': config.model.dtype,
          'lora_rank': config.model.lora_rank,
          'remat': config.model.remat,
          'mesh_shape': list(config.mesh.shape),
          'mesh_axis_names': list(config.mesh.axis_names),
          'batch_size': config.training.batch_size,
          'micro_batch_size': config.training.micro_batch_size,
          'num_generations': config.grpo.num_generations,
          'max_prompt_length': config.generation.max_prompt_length,
          'max_generation_steps': config.generation.max_generation_steps,
          'kv_cache_size': config.generation.kv_cache_size,
          # Either set: rollout_decode is the episode decode loop (its
          # `function`).
          'agent_tools': config.agent.tools,
          'agent_environment': config.agent.environment,
      },
      'topology': {
          'name': spec.name,
          'topology': spec.topology,
          'chips': spec.num_chips,
          'hosts': spec.num_hosts,
          'chip': dataclasses.asdict(chip),
          'devices_per_chip': devices_per_chip,
          'usable_hbm_bytes': usable,
      },
      'programs': rows,
      'moe': gemma4_lib.moe_costs(
          gemma.model_config(config.model),
          config.model.lora_rank if config.model.get('lora_experts') else 0),
      'skipped': list(skipped),
      'largest_program': max(rows, key=lambda r: r['total_bytes'])['name'],
      'largest_total_bytes': max(r['total_bytes'] for r in rows),
      'fits': all(r['fits'] for r in rows) and not skipped,
      'step_time_bound_s': step_s,
      'notes': (
          'Memory figures are the TPU compiler\'s (per chip). Time figures '
          'are lower bounds: max(flops / peak bf16 FLOP/s, bytes accessed / '
          'HBM bandwidth) per call with the published chip figures. XLA '
          'counts a loop body once: the decode loop\'s figures are one '
          'step\'s; the update\'s and log-prob passes\' are one '
          'micro-batch\'s times the number of micro-batches (loop_trips), '
          'and the log-prob chunks inside are still counted once, so the '
          'bounds stay below the work done. The step bound sums prefill + '
          'max_generation_steps decode steps + log-prob passes + '
          'num_iterations updates. The byte count includes the '
          'compiler\'s copies between HBM and on-chip memory, so the byte '
          'term can exceed what HBM traffic alone needs.'
      ),
  }


def _gib(n):
  return f'{n / tpu_topology.GiB:.2f}'


def format_report(result):
  """Human-readable table of a report."""
  topo = result['topology']
  chip = topo['chip']
  lines = [
      f"Preflight: {result['config']['preset']} "
      f"({result['config']['dtype']}, LoRA r{result['config']['lora_rank']},"
      f" remat {result['config']['remat']}) on {topo['name']} "
      f"({topo['topology']}: {topo['chips']} chips, {topo['hosts']} "
      f"host(s), {chip['hbm_bytes'] / tpu_topology.GiB:.0f} GiB HBM per "
      f"chip, {_gib(topo['usable_hbm_bytes'])} GiB usable per device)",
      'Per chip, GiB (compiler): args + out - alias + temp + code '
      '+ resident = total; time = roofline lower bound per call',
      f"{'program':16s} {'args':>7s} {'out':>7s} {'temp':>7s} {'code':>6s} "
      f"{'resid':>7s} {'total':>7s}  fits  {'GFLOP':>9s} {'GB acc':>8s} "
      f"{'bound ms':>9s} x calls",
  ]
  for r in result['programs']:
    lines.append(
        f"{r['name']:16s} {_gib(r['argument_bytes']):>7s} "
        f"{_gib(r['output_bytes'] - r['alias_bytes']):>7s} "
        f"{_gib(r['temp_bytes']):>7s} {_gib(r['code_bytes']):>6s} "
        f"{_gib(r['resident_bytes']):>7s} {_gib(r['total_bytes']):>7s}  "
        f"{_fits_cell(r)}  {r['flops'] / 1e9:9.1f} "
        f"{r['bytes_accessed'] / 1e9:8.2f} {r['time_bound_s'] * 1e3:9.2f} "
        f"x {r['calls_per_step']:g}"
    )
  lines.append(
      f"Step time lower bound: {result['step_time_bound_s']:.3f} s "
      '(a bound from flops and bytes, not a measurement)'
  )
  moe = result.get('moe')
  if moe:
    lines.append(
        f"MoE: {moe['moe_layers']} layers, top {moe['top_k']} of "
        f"{moe['num_experts']} experts, {moe['routing']}. Per token and "
        f"layer (counted from the config): router "
        f"{moe['router_flops'] / 1e6:.3g} MFLOP = "
        f"{100 * moe['router_share']:.2f}% of the routed experts' "
        f"{moe['expert_flops'] / 1e6:.3g} MFLOP"
        + (f" (+{moe['expert_lora_flops'] / 1e6:.3g} for their LoRA)"
           if moe['expert_lora_flops'] else '')
        + f"; the dispatch copies {moe['dispatch_elements']} activations "
        '(k x D to the experts and back).')
  for r in result['programs']:
    if r.get('function') == EPISODE_DECODE:
      agent = result['config']
      source = (f"agent.environment={agent['agent_environment']!r}"
                if agent.get('agent_environment')
                else f"agent.tools={agent.get('agent_tools')!r}")
      lines.append(
          f"{r['name']} is the episode decode loop ({EPISODE_DECODE}, "
          f'{source}): forced tokens and turn ends, one program for every '
          'turn; compiled without its pause-token check (no vocabulary '
          'read).')
  for r in result['programs']:
    if r.get('killed'):
      lines.append(f"KILLED: {r['name']} was {r['error']}. Fixes: "
                   + '; '.join(r['fixes']) + '.')
    elif not r['fits']:
      lines.append(
          f"DOES NOT FIT: {r['name']} needs {_gib(r['total_bytes'])} GiB per "
          f"chip, {_gib(r['bytes_over'])} GiB over the "
          f"{_gib(topo['usable_hbm_bytes'])} GiB usable"
          + (f" (the compiler: {r['error'].rstrip('.')})" if r['error']
             else '')
          + '. Fixes: ' + '; '.join(r['fixes']) + '.'
      )
  if result['skipped']:
    lines.append(f"Not compiled after that: {', '.join(result['skipped'])} "
                 '(--keep_going compiles them too).')
  lines.append(verdict(result))
  return '\n'.join(lines)


def _fits_cell(row):
  if row.get('killed'):
    return 'kill'
  return 'yes ' if row['fits'] else 'NO  '


def verdict(result):
  """'FITS', 'DOES NOT FIT', or 'NOT KNOWN' when the kernel killed a compile.

  A program that does not fit decides; a killed one leaves the answer open.
  """
  if result['fits']:
    return 'FITS'
  if any(not r['fits'] and not r.get('killed') for r in result['programs']):
    return 'DOES NOT FIT'
  return ('NOT KNOWN: the kernel killed a compile (host memory); see KILLED '
          'above')


class ResidentOverflow(ValueError):
  """The arrays that must be resident together overflow a chip's HBM."""


def rollout_cache_shapes(model, rows, cache_len):
  """[(shape, dtype)] of the rollout's KV cache: K and V of each cached layer.

  Gemma 3 caches every layer with the config's KV heads and head dim; Gemma
  4 only the layers that compute K/V (KV-shared layers read their donor's),
  each with its own KV heads and head dim (global layers: wider heads,
  their own KV-head count).
  """
  cfg = model.config
  if hasattr(model, 'kv_cache_sharing_patterns'):
    layers = [layer.attn for i, layer in enumerate(model.layers)
              if model.kv_cache_sharing_patterns[i] == i]
    dims = [(a.num_kv_heads, a.head_dim) for a in layers]
    dtype = cfg.dtype
  else:
    dims = [(cfg.num_kv_heads, cfg.head_dim)] * cfg.num_layers
    dtype = cfg.param_dtype
  return [((rows, cache_len, k, h), dtype) for k, h in dims for _ in 'kv']


def check_resident(config, mesh, spec, usable):
  """Refuses a run whose frozen weights and rollout KV cache overflow a chip.

  Both live on the chips together for the whole rollout, so their per-chip
  sum (the weights' sharding as the trainer places them; the cache's as
  `sharding.kv_cache_sharding` gives it, for training.batch_size x
  grpo.num_generations rows of generation.kv_cache_size) is a lower bound of
  the largest program. Computed from shapes only: a model too big to fit is
  refused in seconds, before any compile (a 31B compile would also need
  more host RAM than a small machine has).

  Raises:
    ResidentOverflow: with a one-line reason naming the bytes per chip.
  """
  def frozen_bytes(model_cfg):
    model = gemma.abstract_model(gemma.model_config(model_cfg))
    state = nnx.state(model, nnx.Param)
    return model, _per_chip_bytes(_abstract_placed(
        state, nnx.get_named_sharding(state, mesh)))

  model, weights = frozen_bytes(config.model)
  cfg = model.config
  judge_cfg = judge_model_config(config)
  if judge_cfg is not None:  # The judge's weights stay on the chips too.
    weights += frozen_bytes(judge_cfg)[1]
  rows = config.training.batch_size * config.grpo.num_generations
  heads_spec = tuple(cfg.shd_config.act_btnh)
  cache = 0
  for shape, dtype in rollout_cache_shapes(
      model, rows, config.generation.kv_cache_size):
    per_chip = sharding.kv_cache_sharding(mesh, shape, heads_spec).shard_shape(
        shape)
    cache += math.prod(per_chip) * jnp.dtype(dtype).itemsize
  if weights + cache <= usable:
    return
  frozen = ('its frozen weights' if judge_cfg is None
            else "its and the judge's frozen weights")
  raise ResidentOverflow(
      f'{config.model.preset} does not fit {spec.name} ({spec.num_chips} '
      f'chips): {frozen} ({_gib(weights)} GiB per chip) and the '
      f'rollout KV cache ({rows} rows x {config.generation.kv_cache_size} '
      f'tokens: {_gib(cache)} GiB per chip) need {_gib(weights + cache)} '
      f'GiB of HBM per chip, more than the {_gib(usable)} GiB a program may '
      'use, before any activation; use a slice with more chips or HBM '
      '(e.g. v5p), or fewer rollout rows / a shorter '
      'generation.kv_cache_size.'
  )


def prepare(config, topology):
  """Parses the slice and validates `config` for it; nothing is compiled.

  Returns:
    (tpu_topology.Slice, its devices).

  Raises:
    ValueError (ConfigError for the config): a bad topology or config.
  """
  spec = tpu_topology.parse(topology)
  devices = tpu_topology.devices(spec)
  validation.validate(config, num_devices=len(devices),
                      process_count=spec.num_hosts)
  return spec, devices


def summary_table(reports):
  """A Markdown table of several reports: one row per (config, slice).

  Args:
    reports: report dicts (as `run` returns or --output writes).

  Returns:
    The table as text.
  """
  lines = [
      '| model | slice | chips (hosts) | largest program | GiB per chip '
      '| fits | step time bound |',
      '| --- | --- | --- | --- | --- | --- | --- |',
  ]
  for r in reports:
    topo = r['topology']
    compiled = [p for p in r['programs'] if p['fits']]
    misfits = [p['name'] for p in r['programs']
               if not p['fits'] and not p.get('killed')]
    killed = [p['name'] for p in r['programs'] if p.get('killed')]
    if r['fits']:
      fits = 'yes'
    elif misfits:
      fits = 'no: ' + ', '.join(misfits)
    else:
      fits = 'not known: ' + ', '.join(killed) + ' killed (host RAM)'
    bound = (f"{r['step_time_bound_s']:.3g} s" if r['fits'] and compiled
             else '-')
    lines.append(
        f"| {r['config']['preset']} | {topo['name']} | {topo['chips']} "
        f"({topo['hosts']}) | {r['largest_program']} | "
        f"{_gib(r['largest_total_bytes'])} of "
        f"{_gib(topo['usable_hbm_bytes'])} | {fits} | {bound} |"
    )
  return '\n'.join(lines)


def run(config, topology, programs=PROGRAMS, keep_going=False):
  """Validates `config`, compiles its programs for `topology`; the report.

  Args:
    config: the run's config.
    topology: an accelerator type or topology name (see tpu_topology).
    programs: which of PROGRAMS to compile.
    keep_going: compile every program even after one did not fit.

  Returns:
    The report dict (see `report`).
  """
  spec, devices = prepare(config, topology)
  mesh = sharding.make_mesh(config.mesh, devices=devices)
  if mesh.devices.size != len(devices) and spec.num_hosts > 1:
    raise validation.ConfigError(
        f'config.mesh.shape={tuple(config.mesh.shape)} uses '
        f'{mesh.devices.size} of the {len(devices)} devices of {spec.name} '
        f'({spec.num_hosts} hosts); a multi-host mesh must use all of them '
        '(put -1 on one axis).'
    )
  usable = tpu_topology.available_hbm_bytes(devices[0])
  check_resident(config, mesh, spec, usable)
  compiled, skipped = compile_isolated(config, topology, usable, programs,
                                       keep_going)
  return report(config, spec, compiled, usable=usable,
                devices_per_chip=max(1, len(devices) // spec.num_chips),
                skipped=skipped)


# Flag holders, set by _define_flags() only when this module is the program:
# the bench imports it and defines its own --config.
_CONFIG = _TOPOLOGY = _OUTPUT = _KEEP_GOING = _SUMMARIZE = _PROGRAMS = None


def _define_flags():
  """Defines the command-line flags (see the module docstring)."""
  global _CONFIG, _TOPOLOGY, _OUTPUT, _KEEP_GOING, _SUMMARIZE, _PROGRAMS
  _CONFIG = config_flags.DEFINE_config_file(
      'config', None, 'Config file (a get_config() module).', lock_config=True
  )
  _TOPOLOGY = flags.DEFINE_string(
      'topology', None,
      'TPU slice: a topology (v5e:2x2, v5e:4x4, v5p:2x2x2) or an accelerator '
      'type as gcloud spells it (v5litepod-8, v5litepod-16, v6e-8, v5p-8, '
      'v4-8; v5e-N means v5litepod-N).'
  )
  _OUTPUT = flags.DEFINE_string(
      'output', None, 'Also write the full report as JSON to this file.'
  )
  _KEEP_GOING = flags.DEFINE_bool(
      'keep_going', False,
      'Compile every program even after one does not fit or its compile '
      'was killed (by default the preflight stops at the first).'
  )
  _SUMMARIZE = flags.DEFINE_list(
      'summarize', [],
      'Instead of compiling: print a Markdown table of the --output JSON '
      'files given (comma-separated), one row per file.'
  )
  _PROGRAMS = flags.DEFINE_list(
      'programs', list(PROGRAMS),
      'Programs to compile (those the config does not run are skipped).'
  )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if _SUMMARIZE.value:
    reports = []
    for path in _SUMMARIZE.value:
      with open(path) as f:
        reports.append(json.load(f))
    sys.stdout.write(summary_table(reports) + '\n')
    return
  if not _CONFIG.value or not _TOPOLOGY.value:
    raise app.UsageError('--config and --topology are required.')
  unknown = sorted(set(_PROGRAMS.value) - set(PROGRAMS))
  if unknown:
    raise app.UsageError(
        f'--programs: unknown {unknown}; choose from {list(PROGRAMS)}.'
    )
  config = _CONFIG.value
  try:
    prepare(config, _TOPOLOGY.value)
  except ValueError as e:  # ConfigError included.
    sys.stderr.write(f'preflight: {e}\n')
    sys.exit(2)
  try:
    result = run(config, _TOPOLOGY.value, tuple(_PROGRAMS.value),
                 keep_going=_KEEP_GOING.value)
  except ResidentOverflow as e:
    sys.stderr.write(f'preflight: {e}\n')
    sys.exit(1)
  sys.stdout.write(format_report(result) + '\n')
  if _OUTPUT.value:
    with open(_OUTPUT.value, 'w') as f:
      json.dump(result, f, indent=2)
  sys.exit({'FITS': 0, 'DOES NOT FIT': 1}.get(verdict(result), 3))


if __name__ == '__main__':
  _define_flags()
  cli.run(main)
