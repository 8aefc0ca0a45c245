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
          advantages, grpo.reference_logps (when the update needs it: beta
          > 0 or MaxEnt) and grpo.train_step.
  tunix   The same step with tunix's GRPOLearner on an RLCluster (same model
          weights, tokenizer, mesh, G, lengths, beta, micro-batch, LoRA rank,
          optimizer and reward; skipped under MaxEnt-GRPO, which it lacks).
          Its step is timed from the start of RLCluster.generate to the end
          of the step's last RLCluster.update_actor; the three calls are
          wrapped (on the instance) to give the breakdown.
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
  episodes
          A multi-turn rollout against a single-turn one of the same length
          (bench/episode_speed.py): the same prompts, G and C completion
          columns (--episode_steps; default generation.max_generation_steps,
          64 with --quick), rollout.Rollout.generate (one turn) against
          episodes.EpisodeRollout.generate over the same sampler, where every
          row's episode has agent.max_tool_calls inserts (fewer when C is
          short) of a fixed tool result from a scripted environment, between
          model turns that end at a per-turn cap chosen so that turns and
          inserts fill the C columns. Tokens are every column, sampled and
          inserted. Goal: the multi-turn seconds per column at most 1.3x the
          single-turn ones (set for CPU).
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
  preflight
          agent_tunix.preflight.command.run on the same config for the TPU
          slice --preflight_topology (v5litepod-8; v5litepod-4 with --quick):
          the trainer's programs (rollout prefill, decode loop, log-prob
          passes, update) compiled with libtpu on this machine, no TPU
          needed. Per-device memory is the TPU compiler's; time figures
          are roofline lower bounds from the chip's published peak FLOP/s
          and HBM bandwidth, not measurements. config.mesh is the bench
          machine's: it is kept when it spans the slice and its
          data-parallel axes split a micro-batch's completions, else the
          slice is laid out as (fsdp, tp) with the widest fsdp that does
          (settings["mesh_source"] = "config" or "fitted"). Tens of
          seconds for the tiny model; minutes for real presets.
  storage Checkpoint save and restore of the LoRA + optimizer state with
          the trainer's Checkpointer (bench/checkpoint_io.py): a local
          folder, and --checkpoint_url (gs://) when given. `blocking_s` is
          how long a save holds the loop (saves are async), `total_s` until
          it is complete on the store, `restore_s` a resume's restore.

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
                "cpu_count": int, "cpu_model": str, "cpu_isa": [str],
                "load_average": [float], "platform": str,
                "versions": {package: str}},
    "settings": {...},            # the shared workload (see above)
    "measurements": [measurement],
    "goals": {name: {"target": str, "value": float|null, "met": bool|null,
                     "note": str}},
  }

  measurement = {
    "name": str,                  # grpo_step_vs_tunix, grpo_step_vs_trl,
                                  # decode_batch_<b>, episode_rollout,
                                  # update_memory, tpu_preflight,
                                  # checkpoint_io
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

episode_rollout: ours is the multi-turn rollout, peer the single-turn one
(both GRPO-style sides: steps_s, warmup_steps_s, compile_s, tokens_per_s
counting every completion column, and "columns_per_step"), so ratio is the
multi-turn seconds over the single-turn ones; ours["slowdown"] is the
single-turn tokens/s over the multi-turn tokens/s (the goal's value; equal
to ratio when both fill every column). Ours also carries "host_median_s"
and breakdown_s["host"] (seconds in the environments and the inserts,
EpisodeRollout.last_host_seconds), "decode_calls" (calls of the compiled
decode loop in a generate call, last_decode_calls), "decode_program" and
"decode_compiles" (XLA compiles of the episode decode loop over the warm-up
and timed calls, counted with jax.monitoring; 1 when its shapes hold),
"compiles_during_timed_steps" (of any program, both sides: 0 when the
timing excludes compiles), "turns_mean", "model_tokens_mean",
"insert_tokens_mean" and "finish" (episodes per finish). Its settings give
the layout: "columns", "inserts", "insert_tokens", "insert_text",
"turn_tokens" (the per-turn cap), "last_turn_tokens".

tpu_preflight has no peer and times nothing ("ok" when it compiled; ours
median_s and ratio null). Its settings name the slice ("topology",
"tpu_topology", "chips", "hosts", "devices", "chip", "usable_hbm_bytes":
HBM one program may use per device) and the mesh compiled for
("mesh_axis_names", "mesh_shape", "mesh_source"); ours carries
"largest_program" and "largest_total_bytes" (its bytes per device), "fits"
(every program fits; false also when a program was not compiled after one
that does not), "step_time_bound_s" (prefill + one decode step per generated
token + log-prob passes + updates, lower bounds), "programs": {name:
{"total_bytes" (per device), "time_bound_s" (one call), "calls_per_step",
"fits", "flops", "bytes_accessed", "compile_s"}}, "not_compiled" and
"preflight_s" (its wall time here).
"""

import json
import os
import sys
import tempfile

from absl import app
from absl import flags
from absl import logging

from agent_tunix import cli
from agent_tunix.bench import checkpoint_io
from agent_tunix.bench import context
from agent_tunix.bench import decode_speed
from agent_tunix.bench import episode_speed
from agent_tunix.bench import grpo_step
from agent_tunix.bench import options
from agent_tunix.bench import records
from agent_tunix.bench import report
from agent_tunix.bench import tpu_preflight
from agent_tunix.bench import trl_step
from agent_tunix.bench import tunix_step
from agent_tunix.bench import update_memory
from agent_tunix.config import validation
from agent_tunix.tpu import topology as tpu_topology


def run(config, skip, decode_batch_sizes, preflight_topology,
        episode_steps=0):
  """Runs the sections not in `skip`; returns the result dict."""
  with tempfile.TemporaryDirectory(prefix='bench_') as workdir:
    return _run(context.build_context(config, workdir), skip,
                decode_batch_sizes, preflight_topology, episode_steps)


def _run(ctx, skip, decode_batch_sizes, preflight_topology, episode_steps):
  settings = ctx.settings
  measurements = []

  ours, ours_reason, ours_err = records.run_section(
      'grpo', skip, grpo_step.ours_grpo, ctx
  )
  for section, fn, name in (
      ('tunix', tunix_step.tunix_grpo, 'grpo_step_vs_tunix'),
      ('trl', trl_step.trl_grpo, 'grpo_step_vs_trl'),
  ):
    peer, peer_reason, peer_err = records.run_section(section, skip, fn, ctx)
    measurements.append(records.measurement(
        name, ['grpo', section], settings, ours, peer,
        records.join_reasons(ours_reason, peer_reason), ours_err or peer_err,
    ))

  decoded, reason, err = records.run_section(
      'decode', skip, decode_speed.decode_measurements, ctx, decode_batch_sizes
  )
  if decoded:
    measurements.extend(decoded)
  else:
    measurements.append(records.measurement(
        'decode', ['decode'], {'batch_sizes': decode_batch_sizes},
        reason=reason, error=err,
    ))

  episode, reason, err = records.run_section(
      'episodes', skip, episode_speed.episode_measurement, ctx, episode_steps
  )
  measurements.append(episode or records.measurement(
      episode_speed.NAME, ['episodes'],
      {'columns': episode_steps or settings['generation_length']},
      reason=reason, error=err,
  ))

  mem, reason, err = records.run_section(
      'memory', skip, update_memory.memory_measurement, ctx
  )
  measurements.append(mem or records.measurement(
      'update_memory', ['memory'], settings, reason=reason, error=err
  ))

  pre, reason, err = records.run_section(
      'preflight', skip, tpu_preflight.preflight_measurement, ctx,
      preflight_topology,
  )
  measurements.append(pre or records.measurement(
      tpu_preflight.NAME, ['preflight'], {'topology': preflight_topology},
      reason=reason, error=err,
  ))
  stored, reason, err = records.run_section(
      'storage', skip, checkpoint_io.checkpoint_measurement, ctx,
      options.CHECKPOINT_URL.value,
  )
  measurements.append(stored or records.measurement(
      checkpoint_io.NAME, ['storage'], {}, reason=reason, error=err,
  ))
  return {
      'schema_version': records.SCHEMA_VERSION,
      'argv': sys.argv,
      'machine': records.machine_info(),
      'settings': settings,
      'measurements': measurements,
      'goals': report.goals(measurements),
  }


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  skip = {s.strip() for s in options.SKIP.value if s.strip()}
  unknown = sorted(skip - set(options.SECTIONS))
  if unknown:
    raise app.UsageError(
        f'--skip has unknown sections {unknown}; choose from '
        f'{",".join(options.SECTIONS)}.'
    )
  if options.STEPS.value < 1:
    raise app.UsageError(f'--steps={options.STEPS.value} must be >= 1.')
  sizes = options.DECODE_BATCH_SIZES.value
  topology = options.PREFLIGHT_TOPOLOGY.value
  episode_steps = options.EPISODE_STEPS.value
  if episode_steps < 0:
    raise app.UsageError(f'--episode_steps={episode_steps} must be >= 0.')
  if options.QUICK.value:
    config = context.quick_config()
    if not flags.FLAGS['decode_batch_sizes'].present:
      sizes = ['1', '4']
    if not flags.FLAGS['episode_steps'].present:
      episode_steps = options.QUICK_EPISODE_STEPS
    if not flags.FLAGS['preflight_topology'].present:
      topology = options.QUICK_PREFLIGHT_TOPOLOGY
  else:
    config = options.CONFIG.value
  try:
    tpu_topology.parse(topology)
  except ValueError as e:
    raise app.UsageError(
        str(e).replace('--topology=', '--preflight_topology=', 1)
    ) from e
  try:
    batch_sizes = [int(s) for s in sizes]
  except ValueError as e:
    raise app.UsageError(
        f'--decode_batch_sizes={",".join(sizes)} must be integers.'
    ) from e
  if any(b < 1 for b in batch_sizes):
    raise app.UsageError(f'--decode_batch_sizes={sizes} must be >= 1.')
  try:
    result = run(config, skip, batch_sizes, topology, episode_steps)
  except validation.ConfigError as e:
    raise SystemExit(f'bench: {e}') from e
  report.print_table(result)
  if options.OUTPUT.value:
    directory = os.path.dirname(options.OUTPUT.value)
    if directory:
      os.makedirs(directory, exist_ok=True)
    with open(options.OUTPUT.value, 'w') as f:
      json.dump(result, f, indent=2)
    logging.info('Wrote %s', options.OUTPUT.value)
  if any(m['status'] == 'error' for m in result['measurements']):
    sys.exit(1)


if __name__ == '__main__':
  options.define_flags()
  flags.adopt_module_key_flags(options)  # --help lists them.
  cli.run(main)
