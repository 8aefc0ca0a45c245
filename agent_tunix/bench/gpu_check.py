r"""The accelerator check's stages: one process runs them in order.

  python -m agent_tunix.bench.gpu_check --out=DIR --shapes=gpu \
      --tokenizer=.whl/gpu_bundle/tokenizer.model --deadline=EPOCH_SECONDS

launch/gpu_check.sh is the command: it installs the bundle and runs the
smoke stage first. `STAGES`, most wanted first: smoke, grpo, mfu, decode,
tunix, grpo_tools, big. Each stage writes DIR/results.json and
DIR/results.md when it ends (bench/gpu_results.py) and runs under its own
time limit (`LIMITS_S`, cut to what is left before --deadline): past it
the stage is recorded as "timeout" and the process exits 124; run again,
it goes on with the next stage. --shapes: gpu (`WORKLOADS`: the 270M and
the 1B, random weights, bfloat16) or tiny (the CPU rehearsal).

Layer: commands (bench); may import any layer of agent_tunix.
Design notes: docs/benchmarks.md, the section on launch/gpu_check.sh.
"""

import dataclasses
import gc
import importlib
import importlib.metadata
import os
import sys
import tempfile
import threading
import time
import traceback

from absl import app
from absl import flags
from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agent_tunix import cli
from agent_tunix.bench import context
from agent_tunix.bench import decode_speed
from agent_tunix.bench import gpu_results
from agent_tunix.bench import grpo_step
from agent_tunix.bench import options
from agent_tunix.bench import records
from agent_tunix.bench import tunix_step
from agent_tunix.rl import grpo
from agent_tunix.tpu import sharding

STAGES = ('smoke', 'grpo', 'mfu', 'decode', 'tunix', 'grpo_tools', 'big')
# Seconds each stage may take at most (--shapes=gpu); the tiny shapes get
# the same. See docs/benchmarks.md for how they were estimated.
LIMITS_S = {'smoke': 90, 'grpo': 180, 'mfu': 75, 'decode': 120,
            'tunix': 180, 'grpo_tools': 120, 'big': 240}
# A stage that would get less than this before the deadline is skipped.
MIN_STAGE_S = 20
EXIT_TIMEOUT = 124
# Published dense bf16 peak FLOP/s and HBM bandwidth (bytes/s), by a
# substring of jax's device_kind; the first match wins.
DEVICE_PEAKS = (
    ('H100 PCIe', 756e12, 2.0e12),
    ('H100 NVL', 835e12, 3.9e12),
    ('H100', 989e12, 3.35e12),  # SXM5, "NVIDIA H100 80GB HBM3".
    ('GH200', 989e12, 4.0e12),
    ('H200', 989e12, 4.8e12),
    ('A100-SXM4-80GB', 312e12, 2.039e12),
    ('A100', 312e12, 1.555e12),
    ('L4', 121e12, 0.3e12),
)
# The modules whose versions are printed and recorded.
VERSIONED = ('jax', 'jaxlib', 'jax-cuda13-plugin', 'jax-cuda12-plugin',
             'flax', 'optax', 'orbax-checkpoint', 'google-tunix', 'qwix',
             'grain', 'clu', 'ml-collections', 'numpy', 'protobuf',
             'tensorstore', 'sentencepiece', 'tensorboard')

FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class Workload:
  """One GRPO workload: the config file and what is changed in it.

  A shape field left None keeps the config file's own value, so that a
  workload named after a preset follows the preset when it changes.
  """

  config_file: str
  preset: str
  batch_size: int | None
  num_generations: int | None
  prompt_length: int | None
  generation_length: int | None
  micro_batch_size: int | None
  dtype: str


WORKLOADS = {
    'gpu': {
        'main': Workload('gemma3_270m', 'gemma3_270m', 64, 8, 128, 256, 4,
                         'bfloat16'),
        # The tools preset's own batch, group size and lengths.
        'tools': Workload('gemma3_270m_tools', 'gemma3_270m', None, None,
                          None, None, None, 'bfloat16'),
        'big': Workload('gemma3_270m', 'gemma3_1b_pt', 64, 8, 128, 256, 4,
                        'bfloat16'),
    },
    'tiny': {
        'main': Workload('tiny', 'tiny', 2, 2, 32, 8, 1, 'float32'),
        'tools': Workload('tiny', 'tiny', 2, 4, 48, 8, 1, 'float32'),
        'big': Workload('tiny', 'gemma3_270m', 1, 2, 32, 4, 1, 'float32'),
    },
}
DECODE_BATCH_SIZES = {'gpu': (16, 64, 256), 'tiny': (1, 4)}
# Timed steps after context.WARMUP_STEPS untimed ones.
TIMED_STEPS = 2


def versions():
  """{distribution: version} of `VERSIONED` that are installed."""
  found = {}
  for name in VERSIONED:
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  return found


def device_peaks():
  """(peak FLOP/s, HBM bytes/s, source) of device 0.

  Published figures for a known accelerator; on a CPU (the rehearsal) the
  large-matmul rate and read bandwidth measured here, marked 'measured'.
  """
  kind = jax.devices()[0].device_kind
  for name, flops, bandwidth in DEVICE_PEAKS:
    if name in kind:
      return flops, bandwidth, f'published ({name})'
  flops, _ = decode_speed.matmul_flops_per_s(jnp.float32)
  bandwidth, _ = decode_speed.memory_bandwidth('read')
  return flops, bandwidth, f'measured on {kind}'


def workload_config(workload, tokenizer):
  """The benchmark config of a `Workload`: random weights, no end tokens."""
  if options.REPO_ROOT not in sys.path:
    sys.path.insert(0, options.REPO_ROOT)
  config = importlib.import_module(
      f'configs.{workload.config_file}').get_config()
  m, gen = config.model, config.generation
  m.source, m.preset, m.dtype = 'random', workload.preset, workload.dtype
  m.tokenizer_path = tokenizer
  config.agent.tools = ''  # Single-turn completions at the preset's shapes.
  gen.stop_sequences = ''
  t = config.training

  def given(value, default):
    return default if value is None else value

  gen.max_prompt_length = given(workload.prompt_length, gen.max_prompt_length)
  gen.max_generation_steps = given(workload.generation_length,
                                   gen.max_generation_steps)
  gen.kv_cache_size = gen.max_prompt_length + gen.max_generation_steps
  config.eval.max_generation_steps = gen.max_generation_steps
  t.batch_size = given(workload.batch_size, t.batch_size)
  t.micro_batch_size = given(workload.micro_batch_size, t.micro_batch_size)
  config.grpo.num_generations = given(workload.num_generations,
                                      config.grpo.num_generations)
  config.data.num_eval_examples = 2
  config.eval.batch_size = 2
  config.eval.pass_at_k = 0
  return config


class Check:
  """Runs the stages into one results directory."""

  def __init__(self, out, shapes, tokenizer, deadline):
    self.out = out
    self.shapes = shapes
    self.tokenizer = tokenizer
    self.deadline = deadline
    self.workloads = WORKLOADS[shapes]
    self._lock = threading.Lock()
    self._stage = None
    self._workdir = tempfile.mkdtemp(prefix='gpu_check_')
    options.STEPS.value = TIMED_STEPS

  # --------------------------------------------------------- bookkeeping

  def _record(self, stage, status, start, reason=None, fields=None,
              **details):
    with self._lock:
      if self._stage != stage:  # The watchdog has recorded it already.
        return
      gpu_results.record(self.out, stage, status,
                         round(time.time() - start, 2), reason, fields,
                         **details)
      self._stage = None
    logging.info('stage %s: %s (%.1f s)%s', stage, status,
                 time.time() - start, f': {reason}' if reason else '')

  def _timeout(self, stage, start, limit):
    with self._lock:
      if self._stage != stage:
        return
      gpu_results.record(
          self.out, stage, 'timeout', round(time.time() - start, 2),
          f'stopped at its limit of {limit:.0f} s')
      self._stage = None
    logging.error('stage %s: stopped at its limit of %.0f s', stage, limit)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_TIMEOUT)  # pylint: disable=protected-access

  def run(self, stages, rerun=False):
    """Runs `stages` that have no outcome yet (all with `rerun`)."""
    done = gpu_results.load(self.out)['stages']
    for stage in stages:
      if stage in done and not rerun:
        continue
      start = time.time()
      limit = LIMITS_S[stage]
      if stage != 'smoke':  # The smoke test always runs: it gates the rest.
        limit = min(limit, self.deadline - start)
      if limit < MIN_STAGE_S:
        gpu_results.record(
            self.out, stage, 'skipped', 0.0,
            f'{int(max(0.0, self.deadline - start))} s left before the '
            f'deadline (a stage needs {MIN_STAGE_S})')
        continue
      gpu_results.start(self.out, stage)
      self._stage = stage
      watchdog = threading.Timer(limit, self._timeout, (stage, start, limit))
      watchdog.daemon = True
      watchdog.start()
      try:
        fields, details = getattr(self, f'stage_{stage}')()
        self._record(stage, 'ok', start, fields=fields, **details)
      except records.Skipped as e:
        self._record(stage, 'skipped', start, str(e))
      except Exception as e:  # pylint: disable=broad-except
        logging.error('stage %s failed:\n%s', stage, traceback.format_exc())
        self._record(stage, 'error', start, f'{type(e).__name__}: {e}',
                     traceback=traceback.format_exc()[-4000:])
      finally:
        watchdog.cancel()
        gc.collect()
        jax.clear_caches()

  def _context(self, name):
    config = workload_config(self.workloads[name], self.tokenizer)
    return context.build_context(config, self._workdir)

  def _ours(self, name):
    """Our GRPO step on workload `name`: (side, workload settings)."""
    ctx = self._context(name)
    side = grpo_step.ours_grpo(ctx)
    settings = ctx.settings
    del ctx
    return side, settings

  # -------------------------------------------------------------- stages

  def stage_smoke(self):
    found = versions()
    devices = jax.devices()
    print('versions:', ' '.join(f'{k}={v}' for k, v in found.items()))
    print('devices:', devices)
    if self.shapes == 'gpu' and jax.default_backend() == 'cpu':
      raise RuntimeError(
          f'JAX found no accelerator (devices {devices}): its CUDA plugin '
          'did not load; the log above says why.')
    x = jnp.ones((256, 256), jnp.bfloat16)
    total = float(jax.jit(lambda a: (a @ a).astype(jnp.float32).sum())(x))
    if total != 256.0**3:
      raise RuntimeError(f'A 256x256 matmul of ones summed to {total}.')
    layer = nnx.Linear(8, 4, rngs=nnx.Rngs(0))
    if layer(jnp.ones((2, 8))).shape != (2, 4):
      raise RuntimeError('An NNX Linear layer gave the wrong shape.')
    fields = {
        'device': devices[0].device_kind,
        'platform': jax.default_backend(),
        'jax_version': jax.__version__,
        'shapes': self.shapes,
        'versions': found,
    }
    return fields, {'devices': [str(d) for d in devices]}

  def stage_grpo(self):
    side, settings = self._ours('main')
    parts = side['breakdown_s']
    fields = {
        'grpo_step_s': side['median_s'],
        'rollout_s': parts['rollout'],
        'update_s': parts['update'],
        'compile_s': side['compile_s'],
        'tokens_per_s': side['tokens_per_s'],
    }
    return fields, {'workload': settings, 'ours': side}

  def stage_grpo_tools(self):
    side, settings = self._ours('tools')
    return {}, {'workload': settings, 'ours': side}

  def stage_big(self):
    side, settings = self._ours('big')
    return {'big_step_s': side['median_s']}, {'workload': settings,
                                              'ours': side}

  def stage_tunix(self):
    ctx = self._context('main')
    side = tunix_step.tunix_grpo(ctx)
    ours = gpu_results.load(self.out).get('grpo_step_s')
    ratio = ours / side['median_s'] if ours and side['median_s'] else None
    fields = {'tunix_step_s': side['median_s'], 'step_ratio_vs_tunix': ratio}
    return fields, {'workload': ctx.settings, 'tunix': side}

  def stage_decode(self):
    ctx = self._context('main')
    _, bandwidth, source = device_peaks()
    options.DECODE_PROMPT_LENGTH.value = ctx.config.generation.max_prompt_length
    per_batch, fields = {}, {}
    for size in DECODE_BATCH_SIZES[self.shapes]:
      # One batch size at a time, its numbers saved at once: a stage stopped
      # at its limit keeps the sizes it finished.
      [measurement] = decode_speed.decode_measurements(ctx, [size])
      s, ours = measurement['settings'], measurement['ours']
      bound = size * bandwidth / s['bytes_per_step']
      per_batch[str(size)] = {
          'tokens_per_s': ours['tokens_per_s'],
          'bound_tokens_per_s': bound,
          'bound_fraction': ours['tokens_per_s'] / bound,
          'bytes_per_step': s['bytes_per_step'],
          'weight_bytes': s['weight_bytes'],
          'kv_cache_bytes': s['kv_cache_bytes'],
          'decode_steps': s['decode_steps'],
          'prefill_s': ours['prefill_median_s'],
          'fraction_of_measured_copy_bound': ours['fraction_of_bound'],
      }
      fields = {'decode_tokens_per_s': ours['tokens_per_s'],
                'decode_bound_fraction': ours['tokens_per_s'] / bound,
                'decode_batches': per_batch}
      gpu_results.update(self.out, fields)
    return fields, {'bandwidth_bytes_per_s': bandwidth,
                    'bandwidth_source': source}

  def stage_mfu(self):
    ctx = self._context('main')
    config, session = ctx.config, ctx.session
    model, optimizer, hp = session.model, session.optimizer, session.hp
    batch = synthetic_update(ctx)
    flops, unit_rows = update_flops(ctx, batch)
    jax.block_until_ready(grpo.train_step(model, optimizer, batch, hp))
    times = []
    for _ in range(max(3, TIMED_STEPS)):
      t0 = records.now()
      jax.block_until_ready(grpo.train_step(model, optimizer, batch, hp))
      times.append(records.now() - t0)
    update_s = records.median(times)
    peak, _, source = device_peaks()
    mfu = flops / update_s / peak
    return {'update_mfu': mfu}, {
        'update_flops': flops, 'update_s': update_s, 'steps_s': times,
        'flops_counted_per_rows': unit_rows, 'peak_flops_per_s': peak,
        'peak_source': source, 'model_dtype': config.model.dtype,
    }


def synthetic_update(ctx):
  """An update batch of the workload's shapes, sharded on the mesh.

  The update's time and FLOPs depend on shapes only: full prompts and
  completions, random tokens and advantages.
  """
  config = ctx.config
  gen, g, t = config.generation, config.grpo, config.training
  rows = t.batch_size * g.num_generations
  length = gen.max_prompt_length + gen.max_generation_steps
  rng = np.random.default_rng(0)
  vocab = ctx.tokenizer.get_piece_size()
  rewards = rng.random(rows, dtype=np.float32)
  tokens = rng.integers(4, vocab, (rows, length), dtype=np.int32)
  # The G rows of a group share their prompt, as in a rollout's batch.
  prompts = tokens[::g.num_generations, :gen.max_prompt_length]
  tokens[:, :gen.max_prompt_length] = np.repeat(prompts, g.num_generations, 0)
  sequences = grpo.Sequences(
      tokens=tokens,
      input_mask=np.ones((rows, length), bool),
      completion_mask=np.ones((rows, gen.max_generation_steps), np.int32),
  )
  update = grpo.update_batch(config, sequences, rewards,
                             ctx.session.hp.beta).replace(
                                 advantages=rewards - rewards.mean())
  batch = sharding.shard_batch(update, ctx.mesh)
  if ctx.session.hp.needs_reference:
    batch = batch.replace(ref_logps=jax.block_until_ready(
        grpo.reference_logps(ctx.session.model, batch, ctx.session.hp)))
  return batch


def update_flops(ctx, batch):
  """(the compiler's FLOP count of one update, the count's unit in rows).

  XLA counts a loop's body once, whatever its trip count, and the update
  loops over micro-batches and, inside, over log-prob chunks. So the count
  is taken from the update of one unit of rows (a prompt's group when the
  update shares prompts, else one row) with the whole sequence as one chunk
  (no rematerialised logits: model FLOPs), times the units in the batch.
  Counted on the lowered program (XLA's cost analysis before the GPU
  compiler turns matmuls into library calls); nothing is compiled or run.
  """
  session = ctx.session
  hp = session.hp
  rows = batch.tokens.shape[0]
  unit = hp.prompt_group if rows % hp.prompt_group == 0 else 1
  length = batch.tokens.shape[1]
  one = dataclasses.replace(hp, chunk_size=length, micro_batch_size=0)
  micro = jax.tree.map(lambda v: v[:unit], batch)
  graphdefs, arrays = grpo.train_step_inputs(session.model, session.optimizer)
  lowered = grpo.TRAIN_STEP(graphdefs).lower(*arrays, micro, hp=one)
  cost = lowered.cost_analysis()
  cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
  flops = float(cost.get('flops', 0.0))
  if flops <= 0:
    raise RuntimeError('The compiler reported no FLOP count for the update.')
  return flops * (rows // unit), unit


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  stages = [s.strip() for s in FLAGS.stages if s.strip()]
  unknown = sorted(set(stages) - set(STAGES))
  if unknown:
    raise app.UsageError(f'--stages has unknown {unknown}; choose from '
                         f'{",".join(STAGES)}.')
  if not os.path.exists(FLAGS.tokenizer):
    raise app.UsageError(
        f'--tokenizer={FLAGS.tokenizer} does not exist (the bundle has it: '
        'bash launch/gpu_check.sh --bundle=DIR).')
  deadline = FLAGS.deadline or time.time() + sum(LIMITS_S.values())
  check = Check(FLAGS.out, FLAGS.shapes, os.path.abspath(FLAGS.tokenizer),
                deadline)
  check.run([s for s in STAGES if s in stages], rerun=FLAGS.rerun)
  results = gpu_results.load(FLAGS.out)
  print(gpu_results.markdown(results))
  if stages == ['smoke'] and results['stages']['smoke']['status'] != 'ok':
    sys.exit(1)


if __name__ == '__main__':
  flags.DEFINE_string('out', None, 'Results directory.', required=True)
  flags.DEFINE_enum('shapes', 'gpu', list(WORKLOADS),
                    'gpu: the real workloads; tiny: the CPU rehearsal.')
  flags.DEFINE_string('tokenizer', '.whl/gpu_bundle/tokenizer.model',
                      'The SentencePiece model (in the bundle).')
  flags.DEFINE_list('stages', list(STAGES), 'Stages to run, in their order.')
  flags.DEFINE_bool('rerun', False,
                    'Run the stages even when DIR has their outcome.')
  flags.DEFINE_float('deadline', 0.0,
                     'Unix time by which every stage must have ended; 0 = '
                     'now + the sum of the stage limits.')
  cli.run(main)
