r"""Benchmarks this trainer against peers on identical workloads, in one run.

  python -m agent_tunix.bench --config=configs/gemma3_270m.py \
      --config.generation.max_prompt_length=128 \
      --config.generation.max_generation_steps=32 \
      --config.generation.kv_cache_size=160 \
      --config.eval.max_generation_steps=32 --output=/tmp/bench.json
  python -m agent_tunix.bench --quick --output=/tmp/quick.json

Everything is built and timed in one process on one machine, so the numbers
compare. GRPO steps run twice untimed to warm up (compilation, and the
recompile a first update can cause; `compile_s` = warm-up time minus twice
the median), other measurements once; then each runs --steps times and the
median is reported.

Sections (--skip takes a comma list of their names):

  grpo    Our GRPO step: rollout.Rollout.generate, a toy reward, group
          advantages, grpo.reference_logps (beta > 0) and grpo.train_step.
  tunix   The same step with tunix's GRPOLearner on an RLCluster (same model
          weights, tokenizer, mesh, G, lengths, beta, micro-batch, LoRA rank,
          optimizer and reward). Its step is timed from the start of
          RLCluster.generate to the end of the step's last
          RLCluster.update_actor; the three calls are wrapped (on the
          instance) to give the breakdown.
  trl     The same step with TRL's GRPOTrainer on the same weights, read by
          transformers from the GGUF file. Needs `torch`, `trl` and `peft`
          importable (optional, not in requirements.txt) and
          model.source='gguf'; skipped with a reason otherwise.
  decode  Sampler decode tokens/s at --decode_batch_sizes, against the
          memory-bandwidth bound: the bytes read per decode step (all model
          weights plus the whole allocated KV cache, which tunix's sampler
          attends over with a mask) divided by the copy bandwidth measured on
          this machine ((read + written bytes) / time of a pass over a 256 MB
          array: the larger of a jitted in-place x + 1 and, on CPU, a NumPy
          copy; see memory_bandwidth). Also
          against a roofline bound, the slower of that and the decode step's
          matmul FLOPs at a measured large-matmul rate: a CPU is compute-bound
          at batch sizes where the bandwidth bound cannot be reached. And
          against a read-bandwidth bound: bytes per step / bytes read per
          second by a sum over a large array. A decode step mostly reads,
          and where reads run faster than copies, decode can pass the copy
          bound; the read bound is the tighter one there.
  memory  One update (grpo.train_step: chunked log-probs, the config's
          model.remat) against the naive update: the same update with
          naive log-probs swapped in (full [B, T, V] logits from the model,
          then log_softmax and gather) and no remat (every activation
          kept). Same loss, micro-batching and optimizer; both run every row
          in full (prompt_group 1, no shared prompt forward). When
          model.remat is not 'none', the naive update with the same remat is
          compiled too (memory only, `peer.same_remat`), which shows the
          chunked log-probs' own share. Memory comes from the compiled
          executable's memory_analysis(): `temp_bytes` (XLA's scratch
          buffers: activations, logits, gradients) and `peak_bytes` = temp +
          argument + output - alias bytes (everything the executable holds
          at once, weights included). Both executables are then timed.

Workload settings come from the config (override any field with
--config.section.field=value): generation.max_prompt_length (prompt bucket
P), generation.max_generation_steps (C), generation.kv_cache_size,
grpo.num_generations (G), training.batch_size (B prompts),
training.micro_batch_size (prompts per micro-batch), model.lora_rank,
grpo.beta, grpo.loss_agg_mode, grpo.kl_estimator and the sampling settings.
End tokens are disabled in every sampler, so each completion is exactly C
tokens and every side decodes and trains on the same number of tokens.

--quick benchmarks configs/tiny.py (a random 2-layer model with the real
vocabulary) at small sizes instead of --config, for smoke tests.

JSON written to --output:

  {
    "schema_version": 1,
    "argv": [str],
    "machine": {"jax_backend": str, "device_kind": str, "device_count": int,
                "cpu_count": int, "load_average": [float], "platform": str,
                "versions": {package: str}},
    "settings": {...},            # the shared workload (see above)
    "measurements": [measurement],
    "goals": {name: {"target": str, "value": float|null, "met": bool|null,
                     "note": str}},
  }

  measurement = {
    "name": str,                  # grpo_step_vs_tunix, grpo_step_vs_trl,
                                  # decode_batch_<b>, update_memory
    "sections": [str],            # the --skip names it depends on
    "status": "ok" | "partial" | "skipped" | "error",
    "reason": str | null,         # why partial/skipped/error
    "settings": {...},            # what was run
    "ours": {"name": str, "median_s": float, "steps_s": [float], ...} | null,
    "peer": {"name": str, "median_s": float, "steps_s": [float], ...} | null,
    "ratio": float | null,        # ours.median_s / peer.median_s
  }

"partial" means one side ran and the other was skipped. For decode, the peer
is the bandwidth bound (its median_s is the bound's time for the same decode
steps), so ours["fraction_of_bound"] = 1 / ratio; ours also carries
"roofline_tokens_per_s" and "fraction_of_roofline", against the larger of
that time and settings["flops_per_step"] (matmul FLOPs: every weight matrix
once, the tied embedding as the output projection, plus attention over the KV
cache) divided by a measured large-matmul FLOP/s in the model dtype
(settings["matmul_throughput"]), and "read_bound_tokens_per_s" /
"fraction_of_read_bound", with settings["read_bandwidth"] in place of the
copy bandwidth. settings["cpu_decode_graph"] says whether the sampler ran
models.decode's CPU graph (no per-step KV cache or weight copies; output
projection as E @ x.T at settings["column_decode_rows"] = [min, max] rows).
GRPO sides carry "compile_s", "breakdown_s" and "tokens_per_s" (completion
tokens per second of step time); the memory sides carry "temp_bytes",
"peak_bytes" and the other memory_analysis() fields.
"""

import dataclasses
import functools
import gc
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback

from absl import app
from absl import flags
from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from agent_tunix import config_lib
from agent_tunix import grpo
from agent_tunix import rollout
from agent_tunix import sharding
from agent_tunix import train
from agent_tunix.data import pipeline
from agent_tunix.models import decode
from agent_tunix.models import gemma
from agent_tunix.models import lora

SECTIONS = ('grpo', 'tunix', 'trl', 'decode', 'memory')
SCHEMA_VERSION = 1
# Untimed steps before the timed ones: the first compiles; the second can
# compile again when the first update returns state in new shardings.
WARMUP_STEPS = 2
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEFAULT_CONFIG = os.path.join(_REPO_ROOT, 'configs', 'gemma3_270m.py')
# Bytes of the array copied to measure memory bandwidth.
_COPY_BYTES = {'cpu': 256 << 20}
_COPY_BYTES_ACCELERATOR = 1 << 30
# An id no sampler ever produces: used as the only end token, so that every
# completion runs the full generation length.
_NO_END_TOKEN = -1

class _Value:
  """A flag's default while the module is imported, not run as a program."""

  def __init__(self, value):
    self.value = value


# Replaced by flag holders in _define_flags(), which runs only when this
# module is the program: importing it (tests do) must not define --config,
# which other CLIs in the same process define too.
_CONFIG = _Value(None)
_QUICK = _Value(False)
_OUTPUT = _Value('')
_STEPS = _Value(3)
_DECODE_BATCH_SIZES = _Value(['1', '4', '16', '64'])
_DECODE_PROMPT_LENGTH = _Value(32)
_SKIP = _Value([])


def _define_flags():
  """Defines the command-line flags (see the module docstring)."""
  global _CONFIG, _QUICK, _OUTPUT, _STEPS, _DECODE_BATCH_SIZES
  global _DECODE_PROMPT_LENGTH, _SKIP
  _CONFIG = config_flags.DEFINE_config_file(
      'config', _DEFAULT_CONFIG, 'Config file (a get_config() module).',
      lock_config=True,
  )
  _QUICK = flags.DEFINE_bool(
      'quick', _QUICK.value,
      'Benchmark configs/tiny.py at small sizes (ignores --config); seconds.',
  )
  _OUTPUT = flags.DEFINE_string(
      'output', _OUTPUT.value, 'Write the JSON results here.'
  )
  _STEPS = flags.DEFINE_integer(
      'steps', _STEPS.value,
      'Timed repetitions per measurement (after the warm-up).',
  )
  _DECODE_BATCH_SIZES = flags.DEFINE_list(
      'decode_batch_sizes', _DECODE_BATCH_SIZES.value,
      'Batch sizes for the decode section (default 1,4 with --quick).',
  )
  _DECODE_PROMPT_LENGTH = flags.DEFINE_integer(
      'decode_prompt_length', _DECODE_PROMPT_LENGTH.value,
      'Prompt bucket of the decode section; its KV cache holds this many '
      'tokens plus generation.max_generation_steps.',
  )
  _SKIP = flags.DEFINE_list(
      'skip', _SKIP.value,
      f'Sections to skip, comma-separated: {",".join(SECTIONS)}.',
  )


class Skipped(Exception):
  """A section cannot run here; the message says why."""


# ---------------------------------------------------------------- helpers


def now():
  return time.perf_counter()


def median(values):
  return float(statistics.median(values)) if values else None


def toy_reward(prompts, completions, **kwargs):
  """Cheap, non-constant reward (distinct characters mod 5), any framework."""
  del prompts, kwargs
  return [float(len(set(str(c))) % 5) for c in completions]


def quick_config():
  """configs/tiny.py shrunk for a smoke run."""
  if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)
  from configs import tiny  # pylint: disable=g-import-not-at-top
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


def machine_info():
  versions = {}
  for name in ('jax', 'flax', 'tunix', 'qwix', 'optax', 'torch', 'trl',
               'transformers'):
    module = sys.modules.get(name)
    if module is not None:
      versions[name] = str(getattr(module, '__version__', 'unknown'))
  device = jax.devices()[0]
  return {
      'jax_backend': jax.default_backend(),
      'device_kind': device.device_kind,
      'device_count': jax.device_count(),
      'cpu_count': os.cpu_count(),
      'load_average': [round(x, 2) for x in os.getloadavg()],
      'platform': platform.platform(),
      'versions': versions,
  }


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
      'timed_steps': _STEPS.value,
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
  sampler.end_ids = [_NO_END_TOKEN]
  sampler.sampler.eos_ids = np.array([_NO_END_TOKEN], np.int32)


def tree_bytes(tree):
  return int(sum(x.nbytes for x in jax.tree.leaves(tree)
                 if hasattr(x, 'nbytes')))


def step_summary(name, steps_s, warmup_s, tokens, breakdown=None,
                 note=None):
  """A measurement side from per-step times.

  Args:
    name: what ran.
    steps_s: the timed steps' seconds.
    warmup_s: the warm-up steps' seconds; their excess over the median is
      reported as compile_s (compilation and one-time setup).
    tokens: completion tokens per step.
    breakdown: {part: [seconds per timed step]}.
    note: how the times were taken.

  Returns:
    The side's dict (see the module docstring).
  """
  med = median(steps_s)
  side = {
      'name': name,
      'median_s': med,
      'steps_s': [round(s, 6) for s in steps_s],
      'warmup_steps_s': [round(s, 6) for s in warmup_s],
      'compile_s': max(0.0, sum(warmup_s) - len(warmup_s) * med),
      'tokens_per_s': tokens / med if med else None,
  }
  if breakdown is not None:
    side['breakdown_s'] = {k: median(v) for k, v in breakdown.items()}
  if note:
    side['note'] = note
  return side


def measurement(name, sections, settings, ours=None, peer=None, reason=None,
                error=False):
  if error:
    status = 'error'
  elif ours is not None and peer is not None:
    status = 'ok'
  elif ours is not None or peer is not None:
    status = 'partial'
  else:
    status = 'skipped'
  ratio = None
  if ours and peer and ours.get('median_s') and peer.get('median_s'):
    ratio = ours['median_s'] / peer['median_s']
  return {
      'name': name,
      'sections': list(sections),
      'status': status,
      'reason': reason,
      'settings': settings,
      'ours': ours,
      'peer': peer,
      'ratio': ratio,
  }


def run_section(section, skip, fn, *args):
  """Runs fn unless skipped; returns (result or None, reason or None, err)."""
  if section in skip:
    return None, f'{section}: skipped by --skip', False
  try:
    return fn(*args), None, False
  except Skipped as e:
    logging.warning('Section %s skipped: %s', section, e)
    return None, f'{section}: {e}', False
  except Exception as e:  # pylint: disable=broad-except
    logging.error('Section %s failed:\n%s', section, traceback.format_exc())
    return None, f'{section}: {type(e).__name__}: {e}', True


def join_reasons(*reasons):
  text = '; '.join(r for r in reasons if r)
  return text or None


# ------------------------------------------------------------------ setup


@dataclasses.dataclass
class Context:
  """What every section shares: config, our session, prompts."""

  config: object
  settings: dict
  session: train.Session  # our model, sampler, optimizer, hp, mesh
  prompts: list
  prompt_tokens: np.ndarray
  prompt_mask: np.ndarray
  last_update: dict = None  # our last update batch (memory section input)

  @property
  def mesh(self):
    return self.session.mesh

  @property
  def tokenizer(self):
    return self.session.tokenizer


def build_context(config, workdir):
  """Builds our side exactly as training does: train.setup (no data)."""
  settings = workload(config)
  t0 = now()
  session = train.setup(config, workdir, with_data=False)
  logging.info('Set up %s in %.1f s', config.model.preset, now() - t0)
  prompts, tokens, mask = make_prompts(
      session.tokenizer, config.training.batch_size,
      config.generation.max_prompt_length,
  )
  return Context(config, settings, session, prompts, tokens, mask)


def make_tx(config, num_steps):
  """The training optimizer (no warm-up) for a run of `num_steps`."""
  o = config.optimizer
  tx, _ = grpo.make_optimizer(
      learning_rate=o.learning_rate, warmup_ratio=0.0, num_steps=num_steps,
      b1=o.b1, b2=o.b2, weight_decay=o.weight_decay,
      max_grad_norm=o.max_grad_norm,
  )
  return tx


# ------------------------------------------------------------- grpo: ours


def ours_grpo(ctx):
  """Times our GRPO step; returns a measurement side."""
  config = ctx.config
  gen, g = config.generation, config.grpo
  num_g = g.num_generations
  session = ctx.session
  model, optimizer, hp = session.model, session.optimizer, session.hp
  sampler = session.sampler
  disable_end_tokens(sampler)
  total_steps = WARMUP_STEPS + _STEPS.value
  rows = rollout.repeat_groups(
      {'prompt_tokens': ctx.prompt_tokens, 'prompt_mask': ctx.prompt_mask},
      num_g,
  )
  prompts = [p for p in ctx.prompts for _ in range(num_g)]
  parts = {'rollout': [], 'other': [], 'reference_logps': [], 'update': []}
  steps, warmup = [], []
  for step in range(1, total_steps + 1):
    t0 = now()
    out = sampler.generate(
        ctx.prompt_tokens, gen.max_generation_steps,
        train.step_seed(config.training.seed, step), gen.temperature,
        gen.top_k, gen.top_p, num_generations=num_g,
    )
    t1 = now()
    rewards = np.asarray(toy_reward(prompts, out.texts), np.float32)
    advantages = np.asarray(
        grpo.group_advantages(rewards, num_g, g.scale_rewards), np.float32
    )
    update = {
        'tokens': np.concatenate([rows['prompt_tokens'], out.tokens], axis=1),
        'input_mask': np.concatenate(
            [rows['prompt_mask'], out.mask > 0], axis=1
        ),
        'completion_mask': out.mask,
        'advantages': advantages,
    }
    batch = sharding.shard_batch(update, ctx.mesh)
    t2 = now()
    if g.beta > 0:
      batch['ref_logps'] = jax.block_until_ready(
          grpo.reference_logps(model, batch, hp)
      )
    t3 = now()
    metrics = jax.device_get(grpo.train_step(model, optimizer, batch, hp))
    t4 = now()
    if not np.isfinite(metrics['loss']):
      raise FloatingPointError(f'Non-finite loss at step {step}: {metrics}')
    if step <= WARMUP_STEPS:
      warmup.append(t4 - t0)
      logging.info('ours: warm-up step %.2f s', t4 - t0)
      continue
    steps.append(t4 - t0)
    for key, value in (('rollout', t1 - t0), ('other', t2 - t1),
                       ('reference_logps', t3 - t2), ('update', t4 - t3)):
      parts[key].append(value)
    logging.info('ours: step %d %.2f s', step, t4 - t0)
  ctx.last_update = update
  if g.beta > 0:
    ctx.last_update = dict(update, ref_logps=np.asarray(batch['ref_logps']))
  tokens = config.training.batch_size * num_g * gen.max_generation_steps
  side = step_summary(
      'agent_tunix (train.setup; rollout.Rollout.generate + '
      'grpo.reference_logps + grpo.train_step)', steps, warmup, tokens, parts,
      note='breakdown: rollout = Rollout.generate; other = reward, '
      'advantages, batch assembly and sharding; reference_logps; update = '
      'train_step (all micro-batches, optimizer step)',
  )
  return side


# ------------------------------------------------------------ grpo: tunix


def tunix_grpo(ctx):
  """Times tunix's GRPOLearner on the same workload; a measurement side."""
  # pylint: disable=g-import-not-at-top
  from tunix.rl import rl_cluster as rl_cluster_lib
  from tunix.rl.grpo import grpo_learner
  from tunix.rl.rollout import base_rollout
  # pylint: enable=g-import-not-at-top
  config = ctx.config
  gen, g, t = config.generation, config.grpo, config.training
  kl_modes = {'k1': 'kl', 'k3': 'low_var_kl'}
  if g.loss_agg_mode == 'sequence-mean-token-sum-norm':
    raise Skipped(
        "tunix's GRPOLearner has no 'sequence-mean-token-sum-norm' loss "
        'mode; benchmark with token-mean or sequence-mean-token-mean.'
    )
  total_steps = WARMUP_STEPS + _STEPS.value
  # Its own copy of the same weights: the backbone (tunix's reference) and a
  # LoRA policy over it, as tunix's examples build them.
  base = gemma.load_model(config.model, ctx.mesh)
  actor = lora.apply_lora(base, config.model, seed=config.training.seed)
  roles = (rl_cluster_lib.Role.ACTOR, rl_cluster_lib.Role.REFERENCE,
           rl_cluster_lib.Role.ROLLOUT)
  rollout_config = base_rollout.RolloutConfig(
      max_tokens_to_generate=gen.max_generation_steps,
      max_prompt_length=gen.max_prompt_length,
      kv_cache_size=gen.kv_cache_size,
      temperature=gen.temperature,
      top_p=gen.top_p,
      top_k=gen.top_k or None,
      eos_tokens=[_NO_END_TOKEN],
  )
  training_config = rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=make_tx(config, total_steps),
      eval_every_n_steps=10**9,
      max_steps=total_steps,
      mini_batch_size=t.batch_size,
      train_micro_batch_size=t.micro_batch_size,
      rollout_micro_batch_size=t.batch_size,
      compute_logps_micro_batch_size=t.micro_batch_size,
      data_sharding_axis=sharding.batch_axes(ctx.mesh),
  )
  cluster = rl_cluster_lib.RLCluster(
      actor=actor,
      reference=base if g.beta > 0 else None,
      tokenizer=ctx.tokenizer,
      cluster_config=rl_cluster_lib.ClusterConfig(
          role_to_mesh={role: ctx.mesh for role in roles},
          rollout_engine='vanilla',
          offload_to_cpu=False,
          training_config=training_config,
          rollout_config=rollout_config,
      ),
  )
  learner = grpo_learner.GRPOLearner(
      rl_cluster=cluster,
      algo_config=grpo_learner.GRPOConfig(
          num_generations=g.num_generations,
          num_iterations=1,
          beta=g.beta,
          epsilon=g.epsilon,
          loss_agg_mode=g.loss_agg_mode,
          kl_loss_mode=kl_modes[g.kl_estimator],
      ),
      reward_fns=[toy_reward],
  )
  events = []  # (name, start, end, rows)

  def timed(name):
    fn = getattr(cluster, name)

    def wrapper(*args, **kwargs):
      start = now()
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
      events.append((name, start, now(), rows))
      return result

    setattr(cluster, name, wrapper)

  for name in ('generate', 'get_ref_per_token_logps', 'update_actor'):
    timed(name)
  dataset = [{'prompts': np.array(ctx.prompts)} for _ in range(total_steps)]
  learner.train(dataset)

  starts = [i for i, e in enumerate(events) if e[0] == 'generate']
  if len(starts) != total_steps:
    raise RuntimeError(
        f'tunix ran {len(starts)} rollouts for {total_steps} steps; the '
        'learner did not run one rollout per step as configured.'
    )
  expected_rows = t.batch_size * g.num_generations
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
    if k < WARMUP_STEPS:
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
  tokens = t.batch_size * g.num_generations * gen.max_generation_steps
  side = step_summary(
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


# -------------------------------------------------------------- grpo: TRL


def trl_grpo(ctx):
  """Times TRL's GRPOTrainer on the same weights (GGUF); a measurement side."""
  config = ctx.config
  needed = ('torch', 'trl', 'peft', 'transformers', 'datasets')
  missing = [n for n in needed if importlib.util.find_spec(n) is None]
  if missing:
    raise Skipped(
        f'needs {", ".join(needed)} importable (torch, trl and peft are '
        f'optional, not in requirements.txt); missing: {", ".join(missing)}'
    )
  # pylint: disable=g-import-not-at-top
  import datasets
  import peft
  import torch
  import transformers
  import trl
  # pylint: enable=g-import-not-at-top
  if config.model.source != 'gguf':
    raise Skipped(
        f"TRL reads the same weights from the GGUF file, so it needs "
        f"model.source='gguf' (got {config.model.source!r})."
    )
  gen, g, t, m = (config.generation, config.grpo, config.training,
                  config.model)
  path = gemma.resolve_path(config.model)
  directory, filename = os.path.split(path)
  dtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16}[m.dtype]
  tokenizer = trl_tokenizer(ctx, transformers)
  model = transformers.AutoModelForCausalLM.from_pretrained(
      directory, gguf_file=filename, dtype=dtype
  )
  total_steps = WARMUP_STEPS + _STEPS.value
  loss_types = {'token-mean': 'bnpo', 'sequence-mean-token-mean': 'grpo',
                'sequence-mean-token-sum-norm': 'dr_grpo'}
  wanted = {
      'output_dir': os.path.join(ctx.session.workdir, 'trl'),
      'per_device_train_batch_size': t.micro_batch_size * g.num_generations,
      'gradient_accumulation_steps': t.batch_size // t.micro_batch_size,
      'num_generations': g.num_generations,
      'max_prompt_length': gen.max_prompt_length,
      'max_completion_length': gen.max_generation_steps,
      'beta': g.beta,
      'epsilon': g.epsilon,
      'num_iterations': 1,
      'loss_type': loss_types[g.loss_agg_mode],
      'temperature': gen.temperature,
      'top_k': gen.top_k or None,
      'top_p': gen.top_p,
      'learning_rate': config.optimizer.learning_rate,
      'max_steps': total_steps,
      'logging_steps': 1,
      'report_to': 'none',
      'save_strategy': 'no',
      'use_cpu': jax.default_backend() == 'cpu',
      'bf16': m.dtype == 'bfloat16',
      'seed': config.training.seed,
      'disable_tqdm': True,
      # Same fixed completion length as the other sides.
      'generation_kwargs': {'min_new_tokens': gen.max_generation_steps},
  }
  known = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
  dropped = sorted(set(wanted) - known)
  args = trl.GRPOConfig(**{k: v for k, v in wanted.items() if k in known})
  lora_config = None
  if m.lora_rank > 0:
    lora_config = peft.LoraConfig(
        r=m.lora_rank, lora_alpha=m.lora_alpha, task_type='CAUSAL_LM',
        target_modules=['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj',
                        'up_proj', 'down_proj'],
    )
  begins, ends = [], []

  class StepTimer(transformers.TrainerCallback):

    def on_step_begin(self, *args, **kwargs):
      begins.append(now())

    def on_step_end(self, *args, **kwargs):
      ends.append(now())

  dataset = datasets.Dataset.from_dict(
      {'prompt': ctx.prompts * total_steps}
  )
  trainer = trl.GRPOTrainer(
      model=model, reward_funcs=[toy_reward], args=args,
      train_dataset=dataset, processing_class=tokenizer,
      peft_config=lora_config, callbacks=[StepTimer()],
  )
  trainer.train()
  times = [e - b for b, e in zip(begins, ends)]
  if len(times) < total_steps:
    raise RuntimeError(f'TRL ran {len(times)} of {total_steps} steps.')
  tokens = t.batch_size * g.num_generations * gen.max_generation_steps
  note = ('step = TrainerCallback on_step_begin to on_step_end (generation, '
          'reference and update inside); total only. Tokenizer: ours (the '
          'same prompt token ids), as a transformers GemmaTokenizer; '
          f'gradient_checkpointing={getattr(args, "gradient_checkpointing", None)}'
          f', torch threads {torch.get_num_threads()}.')
  if dropped:
    note += f' GRPOConfig of this TRL has no {", ".join(dropped)}.'
  side = step_summary(f'TRL GRPOTrainer {trl.__version__} (torch '
                      f'{torch.__version__})', times[WARMUP_STEPS:],
                      times[:WARMUP_STEPS], tokens, note=note)
  del trainer, model
  gc.collect()
  return side


def trl_tokenizer(ctx, transformers):
  """Our SentencePiece model as a transformers GemmaTokenizer (adds BOS).

  transformers' own tokenizer from the GGUF file splits text into about
  twice as many tokens as the SentencePiece model (196 against 104 for the
  bench prompt at bucket 128), so TRL would prefill longer prompts than the
  other sides. This one gives the prompt token ids our side uses; checked.
  """
  directory = os.path.join(ctx.session.workdir, 'trl_tokenizer')
  os.makedirs(directory)
  with open(os.path.join(directory, 'tokenizer.model'), 'wb') as f:
    f.write(ctx.tokenizer.serialized_model_proto())
  tokenizer = transformers.GemmaTokenizer.from_pretrained(
      directory, add_bos_token=True
  )
  for text, tokens, mask in zip(ctx.prompts, ctx.prompt_tokens,
                                ctx.prompt_mask):
    ids = tokenizer(text=[text])['input_ids'][0]
    if list(ids) != [int(x) for x in tokens[mask]]:
      raise RuntimeError(
          f'TRL side: the transformers tokenizer built from our SentencePiece '
          f'model gives {len(ids)} ids for a bench prompt where ours gives '
          f'{int(mask.sum())}; the workloads would differ.'
      )
  return tokenizer


# ----------------------------------------------------------------- decode


def memory_bandwidth(kind='copy'):
  """(bytes/s, details) of one pass over a large float32 array.

  kind='copy': (read + written bytes) / time of x <- x + 1, in place (the
  jitted pass donates x, so no output buffer is allocated and page-faulted
  in the timed pass: an out-of-place jitted copy times the page faults of a
  fresh 256 MB buffer, measured 2-6 GB/s on a 2-core CPU where the
  in-place pass runs at 47-64 GB/s); on CPU also np.copyto between two
  allocated arrays (one thread). kind='read': bytes read / time of sum(x),
  what a decode step mostly does. Each is the larger of the jitted JAX pass
  and, on CPU, the NumPy one.
  """
  backend = jax.default_backend()
  nbytes = _COPY_BYTES.get(backend, _COPY_BYTES_ACCELERATOR)
  n = nbytes // 4
  repeats = max(3, _STEPS.value)
  x = [jnp.ones((n,), jnp.float32)]
  src = np.ones((n,), np.float32) if backend == 'cpu' else None
  if kind == 'copy':
    traffic = 2 * nbytes
    update = jax.jit(lambda a: a + 1.0, donate_argnums=0)

    def jax_pass():
      x[0] = update(x[0])
      jax.block_until_ready(x[0])
    dst = np.empty_like(src) if backend == 'cpu' else None
    np_pass = lambda: np.copyto(dst, src)  # pylint: disable=unnecessary-lambda-assignment
  elif kind == 'read':
    traffic = nbytes
    total = jax.jit(jnp.sum)
    jax_pass = lambda: jax.block_until_ready(total(x[0]))  # pylint: disable=unnecessary-lambda-assignment
    np_pass = lambda: np.sum(src)  # pylint: disable=unnecessary-lambda-assignment
  else:
    raise ValueError(f'kind={kind!r}: expected copy or read.')

  def rate(one_pass):
    one_pass()  # Compiles; touches every page.
    times = []
    for _ in range(repeats):
      t0 = now()
      one_pass()
      times.append(now() - t0)
    return traffic / median(times)

  best = rate(jax_pass)
  details = {'kind': kind, 'array_bytes': nbytes, 'jax_bytes_per_s': best}
  x.clear()
  if backend == 'cpu':
    np_bw = rate(np_pass)
    details['numpy_bytes_per_s'] = np_bw
    best = max(best, np_bw)
  details['used_bytes_per_s'] = best
  return best, details


def matmul_flops_per_s(dtype):
  """(FLOP/s, details) of a large jitted square matmul in `dtype`."""
  n = 2048 if jax.default_backend() == 'cpu' else 8192
  a = jnp.ones((n, n), dtype)
  matmul = jax.jit(
      lambda x: jnp.matmul(x, x, preferred_element_type=jnp.float32)
  )
  jax.block_until_ready(matmul(a))
  times = []
  for _ in range(max(3, _STEPS.value)):
    t0 = now()
    jax.block_until_ready(matmul(a))
    times.append(now() - t0)
  rate = 2 * n**3 / median(times)
  return rate, {'matmul_size': n, 'dtype': jnp.dtype(dtype).name,
                'flops_per_s': rate}


def decode_flops_per_step(model, batch_size, kv_len):
  """Matmul FLOPs of one decode step: weights (the tied embedding once, as
  the output projection) plus attention over the whole KV cache."""
  cfg = model.config
  matrix_params = sum(
      x.size for x in jax.tree.leaves(nnx.state(model)) if x.ndim >= 2
  )
  attention = 2 * 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * kv_len
  return 2 * batch_size * matrix_params + batch_size * attention


def timed_sample(sampler, prompt_tokens, steps, seed, gen):
  """Prefill + decode like Rollout.generate, timed separately.

  Returns:
    (prefill seconds, decode seconds, decode steps run, KV cache bytes).
  """
  # pylint: disable=protected-access
  inner = sampler.sampler
  greedy = gen.temperature <= 0
  sampling = {
      'temperature': float(gen.temperature),
      'top_p': None if greedy else float(gen.top_p),
      'top_k': None if greedy or not gen.top_k else int(gen.top_k),
  }
  total = prompt_tokens.shape[1] + steps
  if hasattr(sampler, 'init_state'):  # Places the state on the mesh.
    state = sampler.init_state(prompt_tokens, total, seed, **sampling)
  else:
    state = inner.init_sample_state(
        jnp.asarray(prompt_tokens), total_sampling_steps=total,
        include_logits=False, forbidden_token_ids=None,
        seed=jax.random.PRNGKey(seed), beam_size=None, **sampling,
    )
  params = inner._flattened_transformer_state
  t0 = now()
  state = inner._compiled_prefill_fn(params, state, None, echo=False)
  jax.block_until_ready(state.token_buffer)
  t1 = now()
  start = int(state.decoding_step)
  state = inner._compiled_decode_fn(params, state)
  jax.block_until_ready(state.token_buffer)
  t2 = now()
  # pylint: enable=protected-access
  kv_bytes = int(sum(x.nbytes for x in jax.tree.leaves(state.cache)
                     if getattr(x, 'ndim', 0) >= 3))
  return t1 - t0, t2 - t1, int(state.decoding_step) - start, kv_bytes


def decode_measurements(ctx, batch_sizes):
  """One measurement per batch size: decode tokens/s vs bandwidth bound."""
  config = ctx.config
  gen = config.generation
  model = ctx.session.model
  weight_bytes = tree_bytes(nnx.state(model))
  bandwidth, bw_details = memory_bandwidth('copy')
  read_bw, read_details = memory_bandwidth('read')
  flops_rate, flops_details = matmul_flops_per_s(
      model.embedder.input_embedding[...].dtype
  )
  prompt_len = _DECODE_PROMPT_LENGTH.value
  steps = gen.max_generation_steps
  sampler = rollout.Rollout(
      model, ctx.tokenizer, prompt_len + steps,
      cpu_decode_graph=config.generation.cpu_decode_graph,
  )
  disable_end_tokens(sampler)
  results = []
  for b in batch_sizes:
    _, tokens, _ = make_prompts(ctx.tokenizer, b, prompt_len)
    timed_sample(sampler, tokens, steps, 0, gen)  # Warm-up: compiles.
    prefill, decode_s, kv_bytes, runs = [], [], 0, []
    for rep in range(_STEPS.value):
      p, d, n, kv_bytes = timed_sample(sampler, tokens, steps, rep + 1, gen)
      prefill.append(p)
      decode_s.append(d)
      runs.append(n)
    decode_steps = runs[0]
    bytes_per_step = weight_bytes + kv_bytes
    bound_step_s = bytes_per_step / bandwidth
    med = median(decode_s)
    tok_s = b * decode_steps / med
    bound_tok_s = b / bound_step_s
    flops = decode_flops_per_step(model, b, prompt_len + steps)
    roofline_step_s = max(bound_step_s, flops / flops_rate)
    settings = {
        'batch_size': b,
        'prompt_length': prompt_len,
        'decode_steps': decode_steps,
        'kv_cache_size': prompt_len + steps,
        'weight_bytes': weight_bytes,
        'kv_cache_bytes': kv_bytes,
        'bytes_per_step': bytes_per_step,
        'copy_bandwidth': bw_details,
        'read_bandwidth': read_details,
        'flops_per_step': flops,
        'matmul_throughput': flops_details,
        'temperature': gen.temperature,
        'top_k': gen.top_k,
        'cpu_decode_graph': sampler.cpu_decode_graph,
        'column_decode_rows': [decode.COLUMN_DECODE_MIN_ROWS,
                               decode.COLUMN_DECODE_MAX_ROWS],
    }
    ours = {
        'name': 'tunix Sampler decode loop via rollout.Rollout',
        'median_s': med,
        'steps_s': [round(x, 6) for x in decode_s],
        'prefill_median_s': median(prefill),
        'tokens_per_s': tok_s,
        'fraction_of_bound': tok_s / bound_tok_s,
        'roofline_tokens_per_s': b / roofline_step_s,
        'fraction_of_roofline': tok_s * roofline_step_s / b,
        'read_bound_tokens_per_s': b * read_bw / bytes_per_step,
        'fraction_of_read_bound': tok_s * bytes_per_step / (b * read_bw),
    }
    peer = {
        'name': 'memory-bandwidth bound (bytes_per_step / copy bandwidth)',
        'median_s': bound_step_s * decode_steps,
        'steps_s': [],
        'tokens_per_s': bound_tok_s,
    }
    results.append(measurement(f'decode_batch_{b}', ['decode'], settings,
                               ours, peer))
    logging.info('decode b=%d: %.1f tok/s, bandwidth bound %.1f tok/s '
                 '(%.0f%%), roofline %.1f tok/s (%.0f%%)', b, tok_s,
                 bound_tok_s, 100 * tok_s / bound_tok_s, b / roofline_step_s,
                 100 * tok_s * roofline_step_s / b)
  del sampler
  gc.collect()
  return results


# ----------------------------------------------------------------- memory


def naive_token_logps(model, tokens, input_mask, completion_len,
                      chunk_size=None, use_lora=True, compute_entropy=True,
                      group=1, temperature=1.0):
  """grpo.per_token_logps from the model's full [B, T, V] logits.

  Same arguments as grpo.per_token_logps; chunk_size is unused, LoRA is
  always applied (the update's use) and every row runs in full (the memory
  section sets prompt_group=1 on both sides).
  """
  del chunk_size, use_lora, compute_entropy, group
  logits, _ = model(
      tokens,
      grpo.positions_from_mask(input_mask),
      None,
      grpo.causal_attention_mask(input_mask),
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
    raise Skipped(f'{jax.default_backend()} gives no memory_analysis().')
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
  update = {
      'tokens': np.concatenate([prompt_tokens, completion], axis=1),
      'input_mask': np.concatenate(
          [prompt_mask, np.ones((rows, c), bool)], axis=1
      ),
      'completion_mask': np.ones((rows, c), np.float32),
      'advantages': rng.standard_normal(rows).astype(np.float32),
  }
  if g.beta > 0:
    update['ref_logps'] = -np.abs(rng.standard_normal((rows, c))).astype(
        np.float32
    ) - 5.0
  return update


def memory_measurement(ctx):
  """Our update vs the naive full-logits one: memory and time."""
  config = ctx.config
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

  def compile_step(step_fn, step_hp):
    optimizer = nnx.Optimizer(model, make_tx(config, 1 + _STEPS.value),
                              wrt=nnx.LoRAParam)
    graphdefs, arrays = grpo.train_step_inputs(model, optimizer)
    t0 = now()
    compiled = step_fn(graphdefs).lower(*arrays, batch, hp=step_hp).compile()
    return optimizer, compiled, now() - t0

  sides = {}
  for name, step_fn, step_hp in (('ours', grpo.TRAIN_STEP, hp),
                                 ('peer', NAIVE_TRAIN_STEP, naive_hp)):
    nnx.update(model, jax.tree.map(jnp.copy, start))
    optimizer, compiled, compile_s = compile_step(step_fn, step_hp)
    stats = memory_stats(compiled)
    times, first = [], None
    for step in range(1 + _STEPS.value):
      t0 = now()
      metrics = jax.device_get(grpo.run_train_step(
          lambda _: compiled, model, optimizer, batch  # pylint: disable=cell-var-from-loop
      ))
      if step:
        times.append(now() - t0)
      else:
        first = {k: float(metrics[k]) for k in ('loss', 'entropy')}
    sides[name] = dict(
        name=(f'grpo.train_step (chunked log-probs, chunk {hp.chunk_size}, '
              f'remat {hp.remat})' if name == 'ours' else
              'naive: full [B, T, V] logits, log_softmax, gather; remat none'),
        median_s=median(times),
        steps_s=[round(x, 6) for x in times],
        compile_s=compile_s,
        first_loss=first['loss'],
        first_entropy=first['entropy'],
        **stats,
    )
    del optimizer, compiled
    gc.collect()
  nnx.update(model, start)
  ours, peer = sides['ours'], sides['peer']
  for key in ('first_loss', 'first_entropy'):
    if not abs(ours[key] - peer[key]) <= 1e-3 * (1.0 + abs(peer[key])):
      raise ValueError(
          f'The naive update is not the same computation: {key} '
          f'{peer[key]} vs ours {ours[key]}.'
      )
  for key in ('temp_bytes', 'peak_bytes'):
    ours[key + '_ratio'] = ours[key] / max(peer[key], 1)
  if hp.remat != 'none':
    # The naive log-probs under our remat, compiled only: how much of the
    # saving is the chunked log-probs' alone.
    optimizer, compiled, _ = compile_step(NAIVE_TRAIN_STEP, hp)
    stats = memory_stats(compiled)
    del optimizer, compiled
    gc.collect()
    peer['same_remat'] = {'remat': hp.remat, **stats}
    for key in ('temp_bytes', 'peak_bytes'):
      ours[key + '_ratio_same_remat'] = ours[key] / max(stats[key], 1)
  rows = int(update['tokens'].shape[0])
  micro_rows = hp.micro_batch_size or rows
  settings = {
      'rows': rows,
      'micro_batch_rows': micro_rows,
      'sequence_length': int(update['tokens'].shape[1]),
      'completion_length': int(update['completion_mask'].shape[1]),
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
  return measurement('update_memory', ['memory'], settings, ours, peer)


# ----------------------------------------------------------------- report


def goals(measurements):
  by_name = {m['name']: m for m in measurements}
  out = {}
  tun = by_name.get('grpo_step_vs_tunix')
  ratio = tun['ratio'] if tun else None
  out['grpo_step_le_0.75x_tunix'] = {
      'target': 'ours.median_s / tunix.median_s <= 0.75',
      'value': ratio,
      'met': None if ratio is None else ratio <= 0.75,
      'note': 'same workload, same machine, one run',
  }
  fractions = {
      m['settings']['batch_size']: m['ours']['fraction_of_bound']
      for m in measurements
      if m['name'].startswith('decode_batch_') and m['ours']
  }
  met_at = sorted(b for b, f in fractions.items() if f >= 0.7)
  out['decode_ge_0.7_of_bandwidth_bound'] = {
      'target': 'decode tokens/s >= 0.7 x bandwidth bound',
      # The smallest fraction: the goal holds at every batch size iff it
      # holds at this one.
      'value': min(fractions.values()) if fractions else None,
      'met': None if not fractions else len(met_at) == len(fractions),
      'note': None if not fractions else (
          f'fraction by batch size: '
          f'{ {b: round(f, 3) for b, f in fractions.items()} }; met at '
          f'batch sizes {met_at}'),
  }
  mem = by_name.get('update_memory')
  ours = mem['ours'] if mem and mem['ours'] else None
  value = ours['peak_bytes_ratio'] if ours else None
  note = None
  if ours:
    note = (f"temp_bytes ratio {ours['temp_bytes_ratio']:.3f}; ours remat "
            f"{mem['settings']['remat']}, naive remat none")
    if 'peak_bytes_ratio_same_remat' in ours:
      note += (f"; against the naive update with our remat: peak "
               f"{ours['peak_bytes_ratio_same_remat']:.3f}, temp "
               f"{ours['temp_bytes_ratio_same_remat']:.3f}")
    note += f"; vocab {mem['settings']['vocab_size']}"
  out['update_memory_le_0.25_naive'] = {
      'target': 'ours.peak_bytes / naive.peak_bytes <= 0.25 (weights '
                'included)',
      'value': value,
      'met': None if value is None else value <= 0.25,
      'note': note,
  }
  return out


def _fmt(x, unit='s'):
  if x is None:
    return '-'
  if unit == 's':
    return f'{x:.3f}'
  return f'{x / 2**20:.1f}M'


def print_table(result):
  lines = []
  header = (f'{"measurement":<22} {"status":<8} {"ours_s":>9} {"peer_s":>9} '
            f'{"ratio":>7}  details')
  lines.append(header)
  lines.append('-' * len(header))
  for m in result['measurements']:
    ours, peer = m['ours'] or {}, m['peer'] or {}
    details = []
    if 'breakdown_s' in ours:
      b = ours['breakdown_s']
      details.append('ours ' + ', '.join(
          f'{k} {_fmt(v)}' for k, v in b.items()))
    if 'breakdown_s' in peer:
      b = peer['breakdown_s']
      details.append('peer ' + ', '.join(
          f'{k} {_fmt(v)}' for k, v in b.items()))
    if 'tokens_per_s' in ours and m['name'].startswith('grpo'):
      details.append(f"tok/s ours {ours['tokens_per_s']:.1f}" + (
          f", peer {peer['tokens_per_s']:.1f}" if peer else ''))
    if 'fraction_of_bound' in ours:
      details.append(
          f"{ours['tokens_per_s']:.1f} tok/s, bound "
          f"{peer['tokens_per_s']:.1f} tok/s, "
          f"{100 * ours['fraction_of_bound']:.1f}% of bound; roofline "
          f"{ours['roofline_tokens_per_s']:.1f} tok/s, "
          f"{100 * ours['fraction_of_roofline']:.1f}%; read-bandwidth "
          f"bound {ours['read_bound_tokens_per_s']:.1f} tok/s, "
          f"{100 * ours['fraction_of_read_bound']:.1f}%")
    if 'temp_bytes' in ours:
      details.append(
          f"temp {_fmt(ours['temp_bytes'], 'b')} vs "
          f"{_fmt(peer['temp_bytes'], 'b')} "
          f"({ours['temp_bytes_ratio']:.3f}); peak "
          f"{_fmt(ours['peak_bytes'], 'b')} vs "
          f"{_fmt(peer['peak_bytes'], 'b')} "
          f"({ours['peak_bytes_ratio']:.3f})")
      same = peer.get('same_remat')
      if same:
        details.append(
            f"naive with remat {same['remat']}: temp "
            f"{_fmt(same['temp_bytes'], 'b')}, peak "
            f"{_fmt(same['peak_bytes'], 'b')}")
    if m['reason']:
      details.append(m['reason'])
    lines.append(
        f"{m['name']:<22} {m['status']:<8} {_fmt(ours.get('median_s')):>9} "
        f"{_fmt(peer.get('median_s')):>9} "
        f"{'-' if m['ratio'] is None else format(m['ratio'], '.3f'):>7}  "
        + ' | '.join(details)
    )
  lines.append('')
  for name, goal in result['goals'].items():
    met = {True: 'MET', False: 'NOT MET', None: 'not measured'}[goal['met']]
    value = '-' if goal['value'] is None else f"{goal['value']:.3f}"
    note = f'; {goal["note"]}' if goal.get('note') else ''
    lines.append(
        f'goal {name}: {met} (value {value}; {goal["target"]}{note})'
    )
  machine = result['machine']
  lines.append(
      f"machine: {machine['jax_backend']} {machine['device_kind']} x"
      f"{machine['device_count']}, {machine['cpu_count']} CPUs, load "
      f"{machine['load_average']}"
  )
  sys.stdout.write('\n'.join(lines) + '\n')
  sys.stdout.flush()


def run(config, skip, decode_batch_sizes):
  """Runs the sections not in `skip`; returns the result dict."""
  with tempfile.TemporaryDirectory(prefix='bench_') as workdir:
    return _run(build_context(config, workdir), skip, decode_batch_sizes)


def _run(ctx, skip, decode_batch_sizes):
  settings = ctx.settings
  measurements = []

  ours, ours_reason, ours_err = run_section('grpo', skip, ours_grpo, ctx)
  for section, fn, name in (('tunix', tunix_grpo, 'grpo_step_vs_tunix'),
                            ('trl', trl_grpo, 'grpo_step_vs_trl')):
    peer, peer_reason, peer_err = run_section(section, skip, fn, ctx)
    measurements.append(measurement(
        name, ['grpo', section], settings, ours, peer,
        join_reasons(ours_reason, peer_reason), ours_err or peer_err,
    ))

  decoded, reason, err = run_section(
      'decode', skip, decode_measurements, ctx, decode_batch_sizes
  )
  if decoded:
    measurements.extend(decoded)
  else:
    measurements.append(measurement(
        'decode', ['decode'], {'batch_sizes': decode_batch_sizes},
        reason=reason, error=err,
    ))

  mem, reason, err = run_section('memory', skip, memory_measurement, ctx)
  measurements.append(mem or measurement(
      'update_memory', ['memory'], settings, reason=reason, error=err
  ))
  return {
      'schema_version': SCHEMA_VERSION,
      'argv': sys.argv,
      'machine': machine_info(),
      'settings': settings,
      'measurements': measurements,
      'goals': goals(measurements),
  }


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  skip = {s.strip() for s in _SKIP.value if s.strip()}
  unknown = sorted(skip - set(SECTIONS))
  if unknown:
    raise app.UsageError(
        f'--skip has unknown sections {unknown}; choose from '
        f'{",".join(SECTIONS)}.'
    )
  if _STEPS.value < 1:
    raise app.UsageError(f'--steps={_STEPS.value} must be >= 1.')
  sizes = _DECODE_BATCH_SIZES.value
  if _QUICK.value:
    config = quick_config()
    if not flags.FLAGS['decode_batch_sizes'].present:
      sizes = ['1', '4']
  else:
    config = _CONFIG.value
  try:
    batch_sizes = [int(s) for s in sizes]
  except ValueError as e:
    raise app.UsageError(
        f'--decode_batch_sizes={",".join(sizes)} must be integers.'
    ) from e
  if any(b < 1 for b in batch_sizes):
    raise app.UsageError(f'--decode_batch_sizes={sizes} must be >= 1.')
  try:
    result = run(config, skip, batch_sizes)
  except config_lib.ConfigError as e:
    raise SystemExit(f'bench: {e}') from e
  print_table(result)
  if _OUTPUT.value:
    directory = os.path.dirname(_OUTPUT.value)
    if directory:
      os.makedirs(directory, exist_ok=True)
    with open(_OUTPUT.value, 'w') as f:
      json.dump(result, f, indent=2)
    logging.info('Wrote %s', _OUTPUT.value)
  if any(m['status'] == 'error' for m in result['measurements']):
    sys.exit(1)


if __name__ == '__main__':
  _define_flags()
  app.run(main)
