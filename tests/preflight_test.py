"""Tests for agent_tunix.preflight (the package) and tpu_topology.

libtpu (from jax[tpu]) compiles for TPU slices on this CPU machine, so the
tiny model's training programs are compiled here for real TPU topologies:
one host (v5e:2x2) and four hosts (v5e:4x4). The abstract model the
preflight compiles is checked against the trainer's own placement on fake
CPU devices, and its update batch against a real rollout's.
"""

import json
import os
import pathlib
import subprocess
import sys
import types

import jax
from jax._src.interpreters import partial_eval
import jax.numpy as jnp
import numpy as np
import pytest

from agent_tunix.models import gemma
from agent_tunix.models import weights
from agent_tunix.preflight import abstract
from agent_tunix.preflight import child
from agent_tunix.preflight import command
from agent_tunix.preflight import compiler
from agent_tunix.preflight import programs as programs_lib
from agent_tunix.preflight import report
from agent_tunix.preflight import resident
from agent_tunix.tpu import sharding
from agent_tunix.tpu import topology as tpu_topology
from agent_tunix.configs import tiny

_REPO = pathlib.Path(__file__).resolve().parents[1]


def _tiny(**fields):
  config = tiny.get_config()
  with config.unlocked():
    for dotted, value in fields.items():
      section, name = dotted.split('.')
      config[section][name] = value
  return config


@pytest.mark.parametrize('name, topology, chips, hosts, generation', [
    ('v5litepod-1', 'v5e:1x1', 1, 1, 'v5e'),
    ('v5litepod-8', 'v5e:2x4', 8, 1, 'v5e'),
    ('v5e-8', 'v5e:2x4', 8, 1, 'v5e'),
    ('v5litepod-16', 'v5e:4x4', 16, 4, 'v5e'),
    ('v6e-8', 'v6e:2x4', 8, 1, 'v6e'),
    ('v6e-16', 'v6e:4x4', 16, 4, 'v6e'),
    ('v5p-8', 'v5p:2x2x1', 4, 1, 'v5p'),
    ('v5p-16', 'v5p:2x2x2', 8, 2, 'v5p'),
    ('v4-8', 'v4:2x2x1', 4, 1, 'v4'),
    ('v5e:2x2', 'v5e:2x2', 4, 1, 'v5e'),
    ('v5e:4x4', 'v5e:4x4', 16, 4, 'v5e'),
])
def test_accelerator_types_map_to_slices(name, topology, chips, hosts,
                                         generation):
  spec = tpu_topology.parse(name)
  assert (spec.topology, spec.num_chips, spec.num_hosts) == (
      topology, chips, hosts)
  assert spec.chip.generation == generation


@pytest.mark.parametrize('name, devices, processes', [
    ('v5litepod-8', 8, 1),  # One host of 8 chips, as a real v5litepod-8.
    ('v5litepod-16', 16, 4),
    ('v5p-8', 4, 1),
    ('v4-8', 8, 1),  # libtpu's v4: one device per TensorCore.
])
def test_slice_devices(name, devices, processes):
  found = tpu_topology.devices(tpu_topology.parse(name))
  assert len(found) == devices
  assert len({d.process_index for d in found}) == processes
  assert {d.platform for d in found} == {'tpu'}


@pytest.mark.parametrize('name', ['v5litepod-3', 'v7x-8', 'tpu', 'v5e:2'])
def test_unknown_slice_is_refused_with_the_choices(name):
  with pytest.raises(ValueError, match='v5litepod-16'):
    tpu_topology.parse(name)


def _by_name(result):
  return {p['name']: p for p in result['programs']}


def test_the_gemma_judge_compiles_with_the_policy_programs():
  config = _tiny(**{'training.batch_size': 4,
                    'training.micro_batch_size': 2,
                    'data.task': 'rubric', 'data.source': 'jsonl',
                    'data.path': str(_REPO / 'agent_tunix/configs/rubrics' /
                                     '{split}.jsonl'),
                    'rewards.functions': 'rubric_judge=1',
                    'judge.backend': 'gemma', 'judge.batch_size': 8})
  assert 'judge' in programs_lib.runs(config)
  result = command.run(config, 'v5e:2x2', programs=('judge',))
  (judge,) = result['programs']
  assert judge['name'] == 'judge' and judge['fits']
  assert judge['function'] == 'gemma_backend.answer_logps_program'
  assert judge['flops'] > 0 and judge['argument_bytes'] > 0
  # 4 prompts x 2 completions x 8 items, 8 pairs a call.
  assert judge['calls_per_step'] == 8
  # Without the Gemma judge there is no such program.
  assert 'judge' not in programs_lib.runs(_tiny())
  # A judge with its own preset: its program reads its weights, and they
  # stay resident beside the policy's (here the same tiny shapes).
  config.judge.preset = 'tiny'
  assert 'judge' in programs_lib.runs(config)
  own = _by_name(command.run(config, 'v5e:2x2', programs=('judge',)))
  assert own['judge']['fits']
  assert own['judge']['argument_bytes'] == judge['argument_bytes']
  assert own['judge']['resident_bytes'] > judge['resident_bytes']


def test_a_judge_preset_counts_in_the_resident_bound():
  from agent_tunix.configs import gemma3_1b  # pylint: disable=g-import-not-at-top
  config = gemma3_1b.get_config()
  config.data.task, config.rewards.functions = 'rubric', 'rubric_judge=1'
  config.data.source = 'jsonl'
  config.data.path = str(_REPO / 'agent_tunix/configs/rubrics/{split}.jsonl')
  config.judge.backend = 'gemma'
  spec, devices = command.prepare(config, 'v5e:2x2')
  mesh = sharding.make_mesh(config.mesh, devices=devices)
  resident.check_resident(config, mesh, spec, 8 * 2**30)
  config.judge.preset = 'gemma3_27b_pt'
  with pytest.raises(resident.ResidentOverflow,
                     match="its and the judge's frozen weights"):
    resident.check_resident(config, mesh, spec, 8 * 2**30)


def test_tiny_programs_compile_for_one_host():
  config = _tiny(**{'training.batch_size': 4,
                    'training.micro_batch_size': 2})
  result = command.run(config, 'v5e:2x2')
  programs = _by_name(result)
  assert set(programs) == {'rollout_prefill', 'rollout_decode',
                           'reference_logps', 'policy_logps', 'update'}
  for p in programs.values():
    assert p['argument_bytes'] > 0 and p['total_bytes'] > 0, p
    assert p['flops'] > 0 and p['bytes_accessed'] > 0, p
    assert p['fits'] and p['time_bound_s'] > 0
  assert programs['rollout_decode']['calls_per_step'] == 8
  # No agent.tools: the single-turn sampler's loop.
  assert programs['rollout_decode']['function'] == 'rollout.Rollout.decode_fn'
  assert result['config']['agent_tools'] == ''
  assert result['config']['agent_environment'] == ''
  # tiny saves every step: the check before each save runs once a step.
  assert programs['policy_logps']['calls_per_step'] == 1
  # The optimizer state lives through the rollout without being its input.
  assert programs['rollout_prefill']['resident_bytes'] > 0
  assert programs['update']['resident_bytes'] == 0
  assert result['fits'] and result['topology']['chips'] == 4
  expected_step = sum(p['time_bound_s'] * p['calls_per_step']
                      for p in programs.values())
  assert result['step_time_bound_s'] == pytest.approx(expected_step)
  for p in programs.values():
    # The floor for its layout, what it counts, and where the bytes went.
    assert 0 < p['analytic_min_bytes'] and p['analytic_terms'], p['name']
    assert p['breakdown']['categories'] and p['breakdown']['top']
    assert p['compiler_bytes_accessed'] > 0
  decode = programs['rollout_decode']
  assert set(decode['analytic_terms']) == {'weights', 'kv_read',
                                           'kv_written'}
  assert decode['breakdown']['unknown_trip_loops']  # the decode loop
  assert set(result['calibration']) == {'matmul', 'kv_row', 'stream'}
  # tunix's own step, compiled for the same slice.
  side = result['tunix']
  names = {p['name'] for p in side['programs']}
  assert names >= {'tunix_prefill', 'tunix_decode', 'tunix_train_step'}
  assert ('tunix_reference_logps' in names) == (config.grpo.beta > 0)
  assert side['step_time_bound_s'] == pytest.approx(sum(
      p['time_bound_s'] * p['calls_per_step'] for p in side['programs']))
  assert side['step_time_bound_s'] > 0 and not side['why_not']
  assert 'rollout_decode:' in report.format_breakdown(result)
  json.dumps(result)  # The --output file.
  text = report.format_report(result)
  assert 'update' in text and 'FITS' in text
  assert 'episode decode loop' not in text
  row = report.summary_table([result]).splitlines()[-1]
  assert row.startswith(f"| tiny | v5e:2x2 | 4 (1) | {result['largest_program']} |")
  assert '| yes |' in row


def test_tools_compile_the_episode_decode_loop(monkeypatch):
  # In this process: the decode program is the EpisodeRollout's own loop,
  # built by episodes.from_config over the preflight's Rollout, with its
  # forced-token buffers, turn starts and cap as inputs.
  from agent_tunix.rl import episodes  # pylint: disable=g-import-not-at-top
  config = _tiny(**{'agent.tools': 'calculator',
                    'training.batch_size': 4,
                    'training.micro_batch_size': 2})
  built, seen = [], {}
  from_config = episodes.from_config
  monkeypatch.setattr(
      episodes, 'from_config',
      lambda *a: built.append(from_config(*a)) or built[-1])
  call = compiler.Compiler.__call__

  def spy(self, name, fn, args, *rest, **kwargs):
    seen[name] = (fn, args)
    return call(self, name, fn, args, *rest, **kwargs)

  monkeypatch.setattr(compiler.Compiler, '__call__', spy)
  spec, devices = command.prepare(config, 'v5e:2x2')
  mesh = sharding.make_mesh(config.mesh, devices=devices)
  programs, skipped = programs_lib.compile_programs(
      config, mesh, tpu_topology.available_hbm_bytes(devices[0]),
      programs=('rollout_prefill', 'rollout_decode'))
  assert not skipped and len(built) == 1
  fn, args = seen['rollout_decode']
  assert fn is built[0].decode_fn
  rows = config.training.batch_size * config.grpo.num_generations
  width = (config.generation.max_prompt_length +
           config.generation.max_generation_steps)
  forced_tokens, forced, turn_start, cap = args[2:]
  assert [(a.shape, a.dtype) for a in args[2:]] == [
      ((rows, width), jnp.int32), ((rows, width), jnp.bool_),
      ((rows,), jnp.int32), ((), jnp.int32)]
  # Placed like the sampler's rows (8 rows on 4 devices: two each).
  assert forced.sharding.shard_shape(forced.shape) == (2, width)
  assert args[1].token_buffer.shape == (rows, width)
  lowered = fn.lower(*args).as_text()
  assert f'tensor<{rows}x{width}xi1>' in lowered  # The forced flags.
  by_name = {p.name: p for p in programs}
  decode = by_name['rollout_decode']
  assert decode.function == programs_lib.EPISODE_DECODE
  assert by_name['rollout_prefill'].function == 'rollout.Rollout.prefill_fn'
  assert decode.calls_per_step == config.generation.max_generation_steps
  assert decode.argument_bytes >= compiler.per_chip_bytes(args)
  # The format's stop piece joined the end ids the programs read.
  assert 106 in built[0].rollout.sampler.eos_ids


def test_episodes_report_names_the_episode_decode_loop():
  # Any multi-turn task (tools: the test above compiles the same loop) is
  # sampled by the same loop; the report names it and the task.
  field, value = 'environment', 'tests.episode_fixtures:ScriptedEnvironment'
  config = _tiny(**{f'agent.{field}': value,
                    'training.batch_size': 4,
                    'training.micro_batch_size': 2})
  result = command.run(config, 'v5e:2x2',
                         programs=('rollout_prefill', 'rollout_decode'))
  programs = _by_name(result)
  assert set(programs) == {'rollout_prefill', 'rollout_decode'}
  decode = programs['rollout_decode']
  assert decode['function'] == 'episodes.EpisodeRollout.decode_fn'
  assert decode['fits'] and decode['argument_bytes'] > 0
  assert decode['temp_bytes'] > 0 and decode['flops'] > 0
  assert result['config'][f'agent_{field}'] == value
  json.dumps(result)
  text = report.format_report(result)
  assert ('rollout_decode is the episode decode loop '
          f'(episodes.EpisodeRollout.decode_fn, agent.{field}={value!r})'
          in text)
  assert text.splitlines()[-1] == 'FITS'


def test_tiny_programs_compile_for_four_hosts():
  # v5litepod-16: 16 chips on 4 hosts, compiled as one global program.
  config = _tiny(**{'training.batch_size': 8,
                    'training.micro_batch_size': 4,
                    'grpo.beta': 0.0,
                    'mesh.shape': (-1, 2)})
  # The sampler and the update (tunix's side and the other
  # programs are checked on one host, above).
  programs = ('rollout_prefill', 'rollout_decode', 'update')
  result = command.run(config, 'v5litepod-16', programs=programs)
  assert result['topology']['hosts'] == 4
  assert set(_by_name(result)) == set(programs)
  assert result['fits']


def test_per_chip_weights_fall_as_fsdp_grows():
  args = {}
  for fsdp in (1, 4):
    config = _tiny(**{'mesh.shape': (fsdp, 1),
                      'training.batch_size': 4,
                      'training.micro_batch_size': 2})
    result = command.run(config, 'v5e:2x2', programs=('reference_logps',))
    args[fsdp] = _by_name(result)['reference_logps']['argument_bytes']
  # The 262144 x 32 embedding dominates and is split over fsdp.
  assert args[4] < 0.35 * args[1], args


def test_a_config_that_cannot_fit_is_named_with_fixes():
  # 64 rows x 512-position log-prob chunks of a 262144-word vocabulary:
  # 128 GiB of float32 logits per micro-batch.
  cmd = [
      sys.executable, '-m', 'agent_tunix.preflight',
      '--config=configs/tiny.py', '--topology=v5e:2x2',
      '--programs=reference_logps,update',
      '--config.training.batch_size=64', '--config.training.micro_batch_size=64',
      '--config.grpo.logps_chunk_size=512',
      '--config.generation.max_prompt_length=128',
      '--config.generation.max_generation_steps=512',
      '--config.eval.max_generation_steps=512',
      '--config.generation.kv_cache_size=640',
  ]
  out = subprocess.run(cmd, cwd=_REPO, capture_output=True, text=True,
                       timeout=600, env=dict(os.environ))
  assert out.returncode == 1, out.stderr[-2000:]
  assert 'DOES NOT FIT: reference_logps' in out.stdout
  assert 'micro_batch_size=32' in out.stdout
  # It stops there: the update is not compiled, and says so.
  assert 'Not compiled after that: update' in out.stdout


@pytest.mark.parametrize('keep_going', [False, True])
def test_a_compile_killed_by_the_kernel_is_reported(monkeypatch, keep_going):
  # The compile child kills itself (SIGKILL) as reference_logps starts, as
  # the kernel does out of host memory; the preflight lives on to say so.
  monkeypatch.setenv(child.KILL_AT_ENV, 'reference_logps')
  config = _tiny(**{'training.batch_size': 4,
                    'training.micro_batch_size': 2})
  result = command.run(config, 'v5e:2x2',
                         programs=('reference_logps', 'update'),
                         keep_going=keep_going)
  programs = _by_name(result)
  killed = programs['reference_logps']
  assert killed['killed'] and not killed['fits']
  assert 'killed by the kernel' in killed['error']
  assert 'out of host memory' in killed['error']
  # The child had imported JAX and built the model: hundreds of MB.
  assert killed['host_peak_bytes'] > 100 * 2**20
  gib = f"{killed['host_peak_bytes'] / tpu_topology.GiB:.2f} GiB"
  assert f'had reached {gib} of host RAM' in killed['error']
  assert any('more host RAM' in f for f in killed['fixes'])
  assert '--programs=reference_logps' in ' '.join(killed['fixes'])
  assert 'killed' not in programs.get('update', {})  # Rows stay as they were.
  text = report.format_report(result)
  assert f"KILLED: reference_logps was {killed['error']}" in text
  assert report.verdict(result).startswith('NOT KNOWN')
  assert not result['fits']
  json.dumps(result)
  if keep_going:  # A new child compiles the rest.
    assert programs['update']['fits'] and result['skipped'] == []
  else:
    assert set(programs) == {'reference_logps'}
    assert result['skipped'] == ['update']
    assert 'Not compiled after that: update' in text


def test_fixes_suggest_only_a_tp_size_the_model_allows():
  program = types.SimpleNamespace(name='rollout_prefill')
  spec = tpu_topology.parse('v5litepod-8')
  # The tiny model has 2 attention heads: tp=2 is the widest.
  config = _tiny(**{'mesh.shape': (-1, 1)})
  text = ' '.join(report.fixes(config, program, spec))
  assert "--config.mesh.shape='(-1, 2)'" in text
  config = _tiny(**{'mesh.shape': (-1, 2)})
  text = ' '.join(report.fixes(config, program, spec))
  assert "'tp'" not in text
  assert 'a bigger slice than v5litepod-8' in text


def test_abstract_build_skips_the_tracer_origin_search(monkeypatch):
  # It must be active with the installed JAX (else a 27B build takes
  # minutes again), keep getattr's AttributeError, and undo itself.
  original = partial_eval.DynamicJaxprTracer._origin_msg
  seen = {}

  def probe(x):
    with weights.cheap_tracer_attribute_errors():
      seen['message'] = type(x)._origin_msg(x)
      seen['default'] = getattr(x, 'sharding', 'missing')
    return x

  jax.eval_shape(probe, jnp.ones(3))
  assert seen == {'message': '', 'default': 'missing'}
  assert partial_eval.DynamicJaxprTracer._origin_msg is original
  # Every abstract model build (loading weights, the preflight) skips it.
  searched = []
  monkeypatch.setattr(partial_eval.DynamicJaxprTracer, '_origin_msg',
                      lambda self: searched.append(1) or '')
  cfg = gemma.model_config(tiny.get_config().model)
  weights.abstract_model(gemma.model_class(cfg), cfg)
  assert not searched


def test_a_bad_topology_exits_2_with_one_line():
  cmd = [sys.executable, '-m', 'agent_tunix.preflight',
         '--config=configs/tiny.py', '--topology=v5litepod-3']
  out = subprocess.run(cmd, cwd=_REPO, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ))
  assert out.returncode == 2
  assert "preflight: --topology='v5litepod-3'" in out.stderr


@pytest.mark.parametrize('fields', [
    {},
    # MaxEnt reads the rows' rewards; adaptive KL the step's coefficient.
    {'grpo.maxent_tau': 0.5, 'grpo.kl_target': 0.01},
])
def test_update_batch_matches_a_real_rollout(fields):
  from agent_tunix.run import train  # pylint: disable=g-import-not-at-top
  config = _tiny(**fields)
  session = train.setup(config, '/unused', with_data=True)
  update = session.rollout(next(session.train_iter), 1,
                           session.state.kl_coeff, session.train_iter).update
  update = update.replace(ref_logps=np.zeros_like(update.completion_mask))
  expected = abstract.update_batch(config, session.mesh)
  # Fields, shapes and dtypes (a field None in one is None in the other).
  assert (jax.tree.structure(update) ==
          jax.tree.structure(expected)), (update, expected)
  for got, sds in zip(jax.tree.leaves(update), jax.tree.leaves(expected)):
    assert got.shape == sds.shape
    assert np.dtype(got.dtype) == np.dtype(sds.dtype)


_PLACEMENT_CHILD = r'''
import json, sys
import jax
from flax import nnx
from agent_tunix.preflight import abstract
from agent_tunix.run import train
from agent_tunix.tpu import sharding
from agent_tunix.configs import tiny

config = tiny.get_config()
config.mesh.shape = (2, 2)
session = train.setup(config, '/unused', with_data=False)
model, optimizer = abstract.abstract_policy(config, session.mesh)

def specs(obj):
  return {'/'.join(map(str, path)): [str(v.get_value().sharding.spec),
                                     list(v.get_value().shape)]
          for path, v in nnx.to_flat_state(nnx.state(obj))}

json.dump({'trainer': [specs(session.model), specs(session.optimizer)],
           'preflight': [specs(model), specs(optimizer)]}, sys.stdout)
'''


def test_abstract_policy_is_placed_like_the_trainer():
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env['XLA_FLAGS'] = (env.get('XLA_FLAGS', '') +
                      ' --xla_force_host_platform_device_count=4')
  out = subprocess.run([sys.executable, '-c', _PLACEMENT_CHILD], cwd=_REPO,
                       capture_output=True, text=True, timeout=600, env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  found = json.loads(out.stdout.strip().splitlines()[-1])
  trainer_model, trainer_opt = found['trainer']
  model, opt = found['preflight']
  assert trainer_model == model
  assert trainer_opt == opt
  # The check can fail: some weights are really sharded on this mesh.
  assert any("'fsdp'" in spec for spec, _ in model.values())


def test_hbm_refusals_in_both_compiler_wordings():
  old = ('RESOURCE_EXHAUSTED: Ran out of memory on HBM: program needs '
         'more (17.25G) exceeds available HBM (15.75G)')
  new = ('RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile '
         'permanent error. Ran out of memory in memory space hbm. Used '
         '15.84G of 15.75G hbm. Exceeded hbm capacity by 99.69M.')
  assert compiler.hbm_refusal_bytes(old) == tpu_topology.parse_bytes(
      '17.25', 'G')
  assert compiler.hbm_refusal_bytes(new) == tpu_topology.parse_bytes(
      '15.84', 'G')
  assert compiler.hbm_refusal_bytes('INTERNAL: something else') is None


def test_gemma4_31b_on_a_small_slice_is_refused_before_compiling():
  cmd = [sys.executable, '-m', 'agent_tunix.preflight',
         '--config=configs/gemma4_e2b.py', '--config.model.preset=gemma4_31b',
         '--topology=v5e:2x2']
  out = subprocess.run(cmd, cwd=_REPO, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ))
  assert out.returncode == 1, out.stderr[-2000:]
  reason = [line for line in out.stderr.splitlines()
            if line.startswith('preflight: ')]
  assert len(reason) == 1, out.stderr[-2000:]
  assert 'gemma4_31b does not fit v5e:2x2' in reason[0]
  assert 'GiB of HBM per chip' in reason[0]
  assert 'Compiling' not in out.stderr


def test_tiny_gemma4_programs_compile():
  from agent_tunix.configs import tiny_gemma4  # pylint: disable=g-import-not-at-top
  config = tiny_gemma4.get_config(
      'training.batch_size=4,training.micro_batch_size=2')
  config.mesh.shape = (2, 2)  # Heads over 'tp' too.
  # The sampler and the update (its forward is the log-prob passes').
  wanted = ('rollout_prefill', 'rollout_decode', 'update')
  result = command.run(config, 'v5e:2x2', programs=wanted)
  programs = _by_name(result)
  assert set(programs) == set(wanted)
  for p in programs.values():
    assert p['fits'] and p['argument_bytes'] > 0 and p['flops'] > 0, p
  assert result['fits'] and result['config']['preset'] == 'tiny_gemma4'
  assert result['moe'] is None  # Dense.


def test_moe_routing_cost_is_in_the_report():
  from agent_tunix.models import gemma4  # pylint: disable=g-import-not-at-top
  from agent_tunix.configs import tiny_gemma4  # pylint: disable=g-import-not-at-top
  config = tiny_gemma4.get_config(
      'model.preset=tiny_gemma4_moe,training.batch_size=4,'
      'training.micro_batch_size=2')
  config.model.lora_experts = True
  result = command.run(config, 'v5e:2x2', programs=('reference_logps',))
  moe = result['moe']
  # tiny_gemma4_moe: D 32, 4 experts of H 16, top 2; LoRA rank 4.
  assert moe['router_flops'] == 2 * 32 * 4
  assert moe['expert_flops'] == 6 * 32 * 16 * 2
  assert moe['expert_lora_flops'] == 2 * 2 * 4 * (2 * 32 + 3 * 16)
  assert moe['dispatch_elements'] == 2 * 2 * 32
  assert moe == gemma4.moe_costs(
      gemma4.model_config('tiny_gemma4_moe', None), 4)
  text = report.format_report(result)
  assert ('MoE: 3 layers, top 2 of 4 experts, exact top-k (jax.lax.top_k), '
          'dropless (ragged dot). Per token and layer') in text
  assert '4.17% of the routed experts' in text


def test_activation_sharding_constrains_tunix_activations_meanwhile():
  from tunix.utils import sharding_utils  # pylint: disable=g-import-not-at-top
  from agent_tunix.models import tunix_adapter  # pylint: disable=g-import-not-at-top
  chips = tpu_topology.devices(tpu_topology.parse('v5e:2x2'))
  mesh = jax.sharding.Mesh(np.array(chips).reshape(4, 1), ('fsdp', 'tp'))
  x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
  original = sharding_utils.shard

  def traced():
    return jax.make_jaxpr(
        lambda v: sharding_utils.shard(v, ('fsdp', 'other')))(x)

  # Off: tunix drops the constraint on a CPU process without a mesh.
  assert 'sharding_constraint' not in str(traced())
  with tunix_adapter.activation_sharding(mesh):
    text = str(traced())
  assert 'sharding_constraint' in text and "'fsdp'" in text
  assert 'other' not in text  # an axis the mesh lacks is dropped
  assert sharding_utils.shard is original
