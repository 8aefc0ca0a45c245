"""Tests of the benchmark CLI (`python -m agent_tunix.bench`): JSON schema only.

One quick run in a subprocess (tiny random model, short lengths, two timed
steps) writes the JSON that most tests check; its preflight section compiles
the workload for a v5e slice with libtpu (no TPU). The tunix, TRL and memory
sections are skipped there to keep it short, which also checks that skipped
sections are reported with a reason; a second quick run has only the memory
section. No timing assertions.
"""

import json
import math
import os
import subprocess
import sys
import types

import pytest

import gcs_emulator

from agent_tunix.bench import context
from agent_tunix.bench import episode_speed
from agent_tunix.bench import options
from agent_tunix.bench import records
from agent_tunix.bench import report
from agent_tunix.bench import tpu_preflight
from agent_tunix.bench import tunix_step
from agent_tunix.rl import grpo
from agent_tunix.tpu import sharding
from agent_tunix.configs import tiny

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIPPED = ('tunix', 'trl', 'memory')
MEASUREMENT_KEYS = {
    'name', 'sections', 'status', 'reason', 'settings', 'ours', 'peer',
    'ratio',
}


def _run_bench(*args, timeout=600, env=None):
  return subprocess.run(
      [sys.executable, '-m', 'agent_tunix.bench', *args],
      cwd=REPO, capture_output=True, text=True, timeout=timeout,
      check=False, env=dict(os.environ, **(env or {})),
  )


@pytest.fixture(scope='module')
def quick(tmp_path_factory):
  out = tmp_path_factory.mktemp('bench') / 'bench.json'
  with gcs_emulator.emulator('agent-tunix-bench') as gcs:
    proc = _run_bench('--quick', '--steps=2', '--decode_batch_sizes=2',
                      f'--skip={",".join(SKIPPED)}', f'--output={out}',
                      f'--checkpoint_url=gs://{gcs.bucket}/bench',
                      env=gcs.env)
  assert proc.returncode == 0, proc.stderr[-6000:]
  with open(out) as f:
    result = json.load(f)
  return result, proc.stdout


def _by_name(result):
  return {m['name']: m for m in result['measurements']}


def test_top_level_and_machine(quick):
  result, _ = quick
  assert result['schema_version'] == records.SCHEMA_VERSION
  assert set(result) == {'schema_version', 'argv', 'machine', 'settings',
                         'measurements', 'goals'}
  machine = result['machine']
  assert machine['jax_backend'] == 'cpu'
  assert isinstance(machine['device_kind'], str)
  assert machine['device_count'] >= 1
  assert machine['cpu_count'] >= 1
  assert isinstance(machine['cpu_model'], str) and machine['cpu_model']
  assert isinstance(machine['cpu_isa'], list)
  assert 'jax' in machine['versions']
  settings = result['settings']
  assert settings['model_preset'] == 'tiny'
  assert settings['rows'] == (settings['batch_size'] *
                              settings['num_generations'])
  assert settings['timed_steps'] == 2


def test_every_measurement_has_the_schema(quick):
  result, _ = quick
  names = [m['name'] for m in result['measurements']]
  assert names == ['grpo_step_vs_tunix', 'grpo_step_vs_trl',
                   'decode_batch_2', 'episode_rollout', 'update_memory',
                   'tpu_preflight', 'checkpoint_io']
  for m in result['measurements']:
    assert set(m) == MEASUREMENT_KEYS, m['name']
    assert m['status'] in ('ok', 'partial', 'skipped', 'error')
    assert set(m['sections']) <= set(options.SECTIONS)
    for side in (m['ours'], m['peer']):
      if side is not None:
        assert isinstance(side['name'], str)
        if m['name'] != 'tpu_preflight':  # It times nothing.
          assert side['median_s'] > 0
    if m['name'] == 'tpu_preflight':
      assert m['peer'] is None and m['ratio'] is None
    elif m['ours'] and m['peer']:
      assert math.isclose(
          m['ratio'], m['ours']['median_s'] / m['peer']['median_s'])
    else:
      assert m['ratio'] is None
      assert m['reason'], m['name']


def test_checkpoint_io_times_local_and_gcs(quick):
  result, _ = quick
  m = _by_name(result)['checkpoint_io']
  assert m['status'] == 'ok', m
  assert m['peer']['name'].startswith('gs://agent-tunix-bench/')
  for side in (m['ours'], m['peer']):
    assert side['state_bytes'] > 0
    assert 0 < side['blocking_s'] <= side['total_s']
    assert side['restore_s'] > 0
  assert m['ours']['state_bytes'] == m['peer']['state_bytes']


def test_skipped_sections_say_why(quick):
  result, _ = quick
  by_name = _by_name(result)
  for name, section in (('grpo_step_vs_tunix', 'tunix'),
                        ('grpo_step_vs_trl', 'trl'),
                        ('update_memory', 'memory')):
    assert f'{section}: skipped by --skip' in by_name[name]['reason']
  assert by_name['update_memory']['status'] == 'skipped'
  assert by_name['update_memory']['ours'] is None


def test_grpo_step_side(quick):
  result, _ = quick
  m = _by_name(result)['grpo_step_vs_tunix']
  assert m['status'] == 'partial'
  assert m['peer'] is None
  ours = m['ours']
  assert len(ours['steps_s']) == 2
  assert len(ours['warmup_steps_s']) == context.WARMUP_STEPS
  assert ours['compile_s'] >= 0
  assert set(ours['breakdown_s']) == {'rollout', 'other', 'reference_logps',
                                      'update'}
  settings = m['settings']
  tokens = settings['rows'] * settings['generation_length']
  assert math.isclose(ours['tokens_per_s'], tokens / ours['median_s'])


def test_decode_against_bandwidth_bound(quick):
  result, _ = quick
  m = _by_name(result)['decode_batch_2']
  assert m['status'] == 'ok'
  settings = m['settings']
  assert settings['batch_size'] == 2
  assert settings['bytes_per_step'] == (settings['weight_bytes'] +
                                        settings['kv_cache_bytes'])
  assert settings['kv_cache_bytes'] > 0
  assert settings['copy_bandwidth']['used_bytes_per_s'] > 0
  # The suite runs on CPU: the sampler runs models.decode's graph, and 2
  # rows take the E @ x.T output projection.
  assert settings['cpu_decode_graph'] is True
  low, high = settings['column_decode_rows']
  assert low <= settings['batch_size'] <= high
  ours, peer = m['ours'], m['peer']
  assert math.isclose(ours['fraction_of_bound'], 1 / m['ratio'])
  assert math.isclose(
      ours['tokens_per_s'],
      settings['batch_size'] * settings['decode_steps'] / ours['median_s'])
  assert peer['tokens_per_s'] > 0
  read_bw = settings['read_bandwidth']
  assert read_bw['kind'] == 'read' and read_bw['used_bytes_per_s'] > 0
  assert math.isclose(
      ours['read_bound_tokens_per_s'],
      settings['batch_size'] * read_bw['used_bytes_per_s'] /
      settings['bytes_per_step'])
  assert math.isclose(ours['fraction_of_read_bound'],
                      ours['tokens_per_s'] / ours['read_bound_tokens_per_s'])
  # The roofline bound is the slower of bandwidth and compute.
  compute_s = (settings['flops_per_step'] /
               settings['matmul_throughput']['flops_per_s'])
  roofline_s = max(compute_s, peer['median_s'] / settings['decode_steps'])
  assert math.isclose(ours['roofline_tokens_per_s'],
                      settings['batch_size'] / roofline_s)
  assert math.isclose(ours['fraction_of_roofline'],
                      ours['tokens_per_s'] / ours['roofline_tokens_per_s'])


def test_goals_and_table(quick):
  result, stdout = quick
  goals = result['goals']
  assert set(goals) == {'grpo_step_le_0.75x_tunix',
                        'decode_ge_0.7_of_bandwidth_bound',
                        'episode_rollout_le_1.3x_single_turn',
                        'update_memory_le_0.25_naive'}
  assert goals['grpo_step_le_0.75x_tunix']['met'] is None  # tunix skipped
  assert goals['update_memory_le_0.25_naive']['met'] is None
  assert isinstance(goals['decode_ge_0.7_of_bandwidth_bound']['met'], bool)
  assert 'measurement' in stdout and 'decode_batch_2' in stdout
  assert 'goal grpo_step_le_0.75x_tunix: not measured' in stdout
  episode = _by_name(result)['episode_rollout']
  assert episode['status'] == 'ok', episode['reason']
  assert episode['settings']['columns'] == options.QUICK_EPISODE_STEPS
  assert goals['episode_rollout_le_1.3x_single_turn']['value'] == (
      episode['ours']['slowdown'])
  assert 'multi-turn' in stdout


def test_preflight_section(quick):
  result, stdout = quick
  m = _by_name(result)['tpu_preflight']
  assert m['status'] == 'ok', m['reason']
  assert m['sections'] == ['preflight']
  settings = m['settings']
  assert settings['topology'] == options.QUICK_PREFLIGHT_TOPOLOGY
  assert (settings['tpu_topology'], settings['chip'], settings['chips'],
          settings['hosts'], settings['devices']) == ('v5e:2x2', 'v5e', 4, 1,
                                                      4)
  # A micro-batch's 2 completions do not split 4 ways: fitted, not the
  # config's (-1, 1).
  assert settings['mesh_source'] == 'fitted'
  assert dict(zip(settings['mesh_axis_names'],
                  settings['mesh_shape'])) == {'fsdp': 2, 'tp': 2}
  ours = m['ours']
  assert ours['median_s'] is None
  programs = ours['programs']
  expected = {'rollout_prefill', 'rollout_decode', 'policy_logps', 'update'}
  if result['settings']['beta'] > 0:
    expected.add('reference_logps')
  assert set(programs) == expected
  for name, p in programs.items():
    assert p['total_bytes'] > 0 and p['time_bound_s'] > 0, name
    assert p['flops'] > 0 and p['bytes_accessed'] > 0, name
    assert p['fits'] is True, name
  assert (programs['rollout_decode']['calls_per_step'] ==
          result['settings']['generation_length'])
  largest = max(programs, key=lambda n: programs[n]['total_bytes'])
  assert ours['largest_program'] == largest
  assert ours['largest_total_bytes'] == programs[largest]['total_bytes']
  assert 0 < ours['largest_total_bytes'] < settings['usable_hbm_bytes']
  assert ours['fits'] is True and ours['not_compiled'] == []
  assert math.isclose(
      ours['step_time_bound_s'],
      sum(p['time_bound_s'] * p['calls_per_step'] for p in programs.values()))
  assert ours['preflight_s'] > 0
  assert 'v5litepod-4 (v5e:2x2' in stdout and 'step time bound' in stdout


@pytest.mark.parametrize('columns, insert, inserts, want', [
    (64, 26, 3, (4, 2, 4)),  # 3 inserts do not fit: 2.
    (128, 26, 3, (13, 3, 11)),
    (40, 10, 1, (15, 1, 15)),
])
def test_episode_layout_fills_the_columns(columns, insert, inserts, want):
  turn, k, last = episode_speed.layout(columns, insert, inserts)
  assert (turn, k, last) == want
  assert k * (turn + insert) + last == columns
  assert 2 <= last <= turn


def test_episode_layout_too_short_is_skipped():
  with pytest.raises(records.Skipped, match='--episode_steps'):
    episode_speed.layout(8, 26, 3)


def test_episode_section_measures_both_rollouts(quick):
  """The quick run's episodes section (its columns: QUICK_EPISODE_STEPS)."""
  m = _by_name(quick[0])['episode_rollout']
  config = context.quick_config()
  columns = options.QUICK_EPISODE_STEPS
  assert set(m) == MEASUREMENT_KEYS
  assert (m['name'], m['sections'], m['status']) == (
      'episode_rollout', ['episodes'], 'ok')
  s, ours, peer = m['settings'], m['ours'], m['peer']
  rows = config.training.batch_size * config.grpo.num_generations
  assert s['rows'] == rows and s['columns'] == columns
  assert (s['inserts'] * (s['turn_tokens'] + s['insert_tokens']) +
          s['last_turn_tokens']) == columns
  # Every column counts, sampled and inserted, on both sides.
  assert ours['columns_per_step'] == peer['columns_per_step'] == rows * columns
  for side in (ours, peer):
    assert len(side['steps_s']) == 2 and len(side['warmup_steps_s']) == 1
    assert math.isclose(side['tokens_per_s'],
                        side['columns_per_step'] / side['median_s'])
  # The ratio comes from the two measured rates.
  assert math.isclose(ours['slowdown'],
                      peer['tokens_per_s'] / ours['tokens_per_s'])
  assert math.isclose(m['ratio'], ours['median_s'] / peer['median_s'])
  assert math.isclose(m['ratio'], ours['slowdown'])  # Same columns.
  # The scripted episodes happened: K inserts, K + 1 turns, each turn one
  # exit of the decode loop, which compiled once.
  k = s['inserts']
  assert k >= 1 and ours['turns_mean'] == k + 1
  assert ours['insert_tokens_mean'] == k * s['insert_tokens']
  assert ours['model_tokens_mean'] + ours['insert_tokens_mean'] == columns
  assert ours['decode_calls_steps'] == [k + 1, k + 1]
  assert ours['decode_calls'] == k + 1
  assert ours['decode_compiles'] == 1, ours['decode_program']
  assert ours['compiles_during_timed_steps'] == 0
  assert ours['decode_program'] == 'jit(_decode_loop)'  # The CPU graph's loop.
  assert 0 < ours['host_median_s'] == ours['breakdown_s']['host']
  assert len(ours['host_steps_s']) == 2
  json.dumps(m)
  goal = report.goals([m])['episode_rollout_le_1.3x_single_turn']
  assert goal['value'] == ours['slowdown']
  assert goal['met'] == (ours['slowdown'] <= 1.3)
  assert f"{k + 1} decode calls" in goal['note']


def _tiny_mesh(shape, micro_batch_size):
  config = context.quick_config()
  config.mesh.shape = shape
  config.training.batch_size = 4
  config.training.micro_batch_size = micro_batch_size
  return config


@pytest.mark.parametrize('shape, micro, devices, mesh, source', [
    # 8-way data parallelism does not split 2 x 2 completions: fitted.
    ((-1, 1), 2, 8, (4, 2), 'fitted'),
    ((-1, 1), 2, 4, (4, 1), 'config'),
    ((2, -1), 1, 8, (2, 4), 'config'),
    # The config's 4 devices do not span the slice's 8.
    ((4, 1), 2, 8, (4, 2), 'fitted'),
    ((-1, 1), 1, 4, (2, 2), 'fitted'),
])
def test_preflight_mesh_for_the_slice(shape, micro, devices, mesh, source):
  config = _tiny_mesh(shape, micro)
  names, found, how = tpu_preflight.slice_mesh(config, devices)
  assert (found, how) == (mesh, source)
  assert names == (('fsdp', 'tp') if how == 'fitted'
                   else tuple(config.mesh.axis_names))


def _decode_measurement(batch_size, fraction):
  return {'name': f'decode_batch_{batch_size}',
          'settings': {'batch_size': batch_size},
          'ours': {'fraction_of_bound': fraction}}


@pytest.mark.parametrize('fractions, value, met', [
    ({1: 1.3, 16: 0.45, 64: 0.2}, 0.2, False),
    ({1: 0.9, 4: 0.7}, 0.7, True),
    ({4: 0.69}, 0.69, False),
])
def test_decode_goal_is_judged_by_the_smallest_fraction(fractions, value,
                                                        met):
  result = report.goals(
      [_decode_measurement(b, f) for b, f in fractions.items()])
  goal = result['decode_ge_0.7_of_bandwidth_bound']
  assert goal['value'] == value
  assert goal['met'] is met
  for b in fractions:
    assert f'{b}: {fractions[b]}' in goal['note']


def test_decode_goal_without_decode_measurements_is_undecided():
  goal = report.goals([])['decode_ge_0.7_of_bandwidth_bound']
  assert goal['value'] is None
  assert goal['met'] is None
  assert goal['note'] is None


def test_unknown_section_is_rejected():
  proc = _run_bench('--quick', '--skip=grpo,nonsense', timeout=300)
  assert proc.returncode != 0
  assert "unknown sections ['nonsense']" in proc.stderr


def test_measurement_status_and_ratio():
  ours = {'name': 'a', 'median_s': 2.0}
  peer = {'name': 'b', 'median_s': 4.0}
  ok = records.measurement('x', ['grpo'], {}, ours, peer)
  assert (ok['status'], ok['ratio']) == ('ok', 0.5)
  partial = records.measurement('x', ['grpo'], {}, ours, None, 'tunix: why')
  assert (partial['status'], partial['ratio']) == ('partial', None)
  assert records.measurement('x', [], {}, reason='r')['status'] == 'skipped'
  assert records.measurement('x', [], {}, ours, peer, 'e',
                           error=True)['status'] == 'error'
  # A measurement without a peer by design (the preflight) is ok alone.
  alone = records.measurement('x', ['preflight'], {}, ours, one_sided=True)
  assert (alone['status'], alone['ratio']) == ('ok', None)
  assert records.measurement('x', [], {}, one_sided=True)['status'] == (
      'skipped')


def test_memory_section(tmp_path):
  out = tmp_path / 'memory.json'
  proc = _run_bench('--quick', '--steps=1',
                    '--skip=grpo,tunix,trl,decode,episodes,preflight',
                    f'--output={out}')
  assert proc.returncode == 0, proc.stderr[-6000:]
  with open(out) as f:
    result = json.load(f)
  assert _by_name(result)['tpu_preflight']['reason'] == (
      'preflight: skipped by --skip')
  m = _by_name(result)['update_memory']
  assert m['status'] == 'ok', m['reason']
  settings = m['settings']
  assert settings['vocab_size'] == 262144
  assert settings['remat'] == 'layer'  # --quick's setting
  assert settings['peer_remat'] == 'none'
  ours, peer = m['ours'], m['peer']
  for side in (ours, peer):
    assert len(side['steps_s']) == 1
    assert side['peak_bytes'] >= side['temp_bytes'] > 0
  # Same computation on both sides (the bench checks it too).
  assert math.isclose(ours['first_loss'], peer['first_loss'], rel_tol=1e-3,
                      abs_tol=1e-3)
  for key in ('temp_bytes', 'peak_bytes'):
    assert math.isclose(ours[key + '_ratio'], ours[key] / peer[key])
    same = peer['same_remat'][key]
    assert math.isclose(ours[key + '_ratio_same_remat'], ours[key] / same)
  goal = result['goals']['update_memory_le_0.25_naive']
  assert math.isclose(goal['value'], ours['peak_bytes_ratio'])
  assert goal['met'] == (goal['value'] <= 0.25)
  assert 'naive with remat layer' in proc.stdout


class _Built(Exception):
  """Stops tunix_grpo once it has built tunix's cluster and learner."""


def _tunix_setup(monkeypatch, **grpo_fields):
  """(cluster kwargs, learner algo_config) tunix_grpo builds; no model."""
  from tunix.rl import rl_cluster  # pylint: disable=g-import-not-at-top
  from tunix.rl.grpo import grpo_learner  # pylint: disable=g-import-not-at-top
  config = tiny.get_config()
  for name, value in grpo_fields.items():
    config.grpo[name] = value
  ctx = types.SimpleNamespace(
      config=config, session=types.SimpleNamespace(
          hp=grpo.hparams_from_config(config)),
      mesh=sharding.make_mesh(config.mesh), tokenizer=None, prompts=['x'])
  built = {}
  monkeypatch.setattr(tunix_step.gemma, 'load_model', lambda *a: 'base')
  monkeypatch.setattr(tunix_step.lora, 'apply_lora', lambda *a, **k: 'actor')
  monkeypatch.setattr(rl_cluster, 'RLCluster',
                      lambda **kwargs: built.setdefault('cluster', kwargs))

  def learner(rl_cluster, algo_config, reward_fns):
    del rl_cluster, reward_fns
    built['algo'] = algo_config
    raise _Built()

  monkeypatch.setattr(grpo_learner, 'GRPOLearner', learner)
  with pytest.raises(_Built):
    tunix_step.tunix_grpo(ctx)
  return built['cluster'], built['algo']


def test_tunix_peer_runs_the_kl_our_step_runs(monkeypatch):
  # Adaptive KL from 0.2 with grpo.beta 0: our step has a KL term and a
  # reference pass, held at 0.2 in the bench; so must tunix's.
  cluster, algo = _tunix_setup(monkeypatch, beta=0.0, kl_target=0.01,
                               init_kl_coeff=0.2)
  assert cluster['reference'] == 'base'
  assert algo.beta == pytest.approx(0.2)
  cluster, algo = _tunix_setup(monkeypatch, beta=0.0)
  assert cluster['reference'] is None and algo.beta == 0.0


def test_tunix_peer_is_skipped_under_maxent(monkeypatch):
  # MaxEnt needs our reference pass at beta 0; tunix has no MaxEnt.
  with pytest.raises(records.Skipped, match='no MaxEnt-GRPO'):
    _tunix_setup(monkeypatch, beta=0.0, maxent_tau=0.5)


def test_tunix_calls_are_cut_into_steps_at_each_rollout():
  # The warm-up steps, then one timed step, of (name, start, end, rows)
  # events: each step a rollout, a reference pass and two update calls.
  def step(t):
    return [('generate', t, t + 1.0, 4),
            ('get_ref_per_token_logps', t + 1.0, t + 1.5, 4),
            ('update_actor', t + 2.0, t + 2.5, None),
            ('update_actor', t + 2.5, t + 3.0, None)]
  total = context.WARMUP_STEPS + 1
  events = [e for k in range(total) for e in step(10.0 * k)]
  # pylint: disable=protected-access
  steps, warmup, parts = tunix_step._split_steps(events, total,
                                                 expected_rows=4)
  assert warmup == [3.0] * context.WARMUP_STEPS and steps == [3.0]
  assert parts == {'rollout': [1.0], 'reference_logps': [0.5],
                   'update': [1.0], 'other': [0.5]}
  with pytest.raises(RuntimeError, match=f'{total - 1} rollouts for'):
    tunix_step._split_steps(events[:-4], total, expected_rows=4)
  with pytest.raises(RuntimeError, match='expected 8'):
    tunix_step._split_steps(events, total, expected_rows=8)
  with pytest.raises(RuntimeError, match=f'step {total} ran no update'):
    tunix_step._split_steps(events[:-2], total, expected_rows=4)
