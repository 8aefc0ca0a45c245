"""Tests for agent_tunix.rl.shared_prefix: the prompts' common leading run
prefilled once gives the completions of the full prefill (tiny random
Gemma 3, CPU)."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import numpy as np  # pylint: disable=g-import-not-at-top
import pytest

from agent_tunix import models
from agent_tunix.agent import environment
from agent_tunix.data import pipeline
from agent_tunix.models import gemma3
from agent_tunix.models import gemma4
from agent_tunix.rl import episodes
from agent_tunix.rl import rollout
from agent_tunix.rl import shared_prefix
from agent_tunix.tpu import sharding
from agent_tunix.configs import tiny

PAD = pipeline.PAD_ID
_REPO = pathlib.Path(__file__).resolve().parents[1]
_PROMPT_LEN = 96
_STEPS = 24
_HEAD = 'You are a careful assistant who checks every sum twice. ' * 4


# ------------------------------------------------------------------- host


def test_prefix_columns_is_the_common_run_rounded_down():
  rows = np.array([
      [0, 0, 5, 6, 7, 8, 9, 1],
      [0, 5, 6, 7, 8, 9, 2, 3],
      [5, 6, 7, 8, 9, 4, 4, 4],
  ])
  # Common run 5 6 7 8 9 (5 tokens).
  assert shared_prefix.prefix_columns(rows, PAD, block=1) == 5
  assert shared_prefix.prefix_columns(rows, PAD, block=2) == 4
  assert shared_prefix.prefix_columns(rows, PAD, block=8) == 0
  # A row that is all prefix keeps its last token out of the run.
  rows[0, -1] = 0
  rows[0] = [0, 0, 0, 5, 6, 7, 8, 9]
  assert shared_prefix.prefix_columns(rows, PAD, block=1) == 4
  # Nothing shared, one row, or an all-pad row: 0.
  assert shared_prefix.prefix_columns([[1, 2], [3, 4]], PAD, block=1) == 0
  assert shared_prefix.prefix_columns([[5, 6, 7, 8]], PAD, block=1) == 0
  assert shared_prefix.prefix_columns([[5, 6, 7], [0, 0, 0]], PAD,
                                      block=1) == 0


def test_prefix_first_moves_the_left_pad_after_the_run():
  rows = np.array([
      [0, 0, 5, 6, 7, 1],
      [5, 6, 7, 2, 3, 4],
  ])
  np.testing.assert_array_equal(
      shared_prefix.prefix_first(rows, PAD, 3),
      [[5, 6, 7, 0, 0, 1],
       [5, 6, 7, 2, 3, 4]])


def test_usable_only_when_the_run_fits_in_the_window():
  cfg = gemma3.tiny_config()  # Window 16.
  assert shared_prefix.usable(cfg, 16)
  assert not shared_prefix.usable(cfg, 17)
  assert shared_prefix.usable(dataclasses.replace(
      cfg, sliding_window_size=None), 10_000)
  # Gemma 4 (a ring-buffer cache in its local layers): never.
  assert not shared_prefix.usable(
      gemma4.tiny_config(sliding_window_size=128), 16)


# ------------------------------------------------- sampling with a tiny model


@pytest.fixture(scope='module')
def tiny_model():
  """The tiny model with a window that a prompt and completion fit in."""
  original = gemma3.tiny_config
  wide = lambda **kw: dataclasses.replace(original(**kw),
                                          sliding_window_size=128)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(gemma3, 'tiny_config', wide)
    config = tiny.get_config()
    return models.build(config, sharding.make_mesh(config.mesh))


@pytest.fixture(scope='module')
def prompts(tiny_model):
  _, tokenizer = tiny_model
  rows = np.stack([
      pipeline.encode_prompt(_HEAD + text, tokenizer, _PROMPT_LEN)[0]
      for text in ('What is 2 + 3?', 'Name a colour, please.', 'Why?')
  ])
  assert shared_prefix.prefix_columns(rows, PAD) == 40
  return rows


def _rollouts(tiny_model):
  model, tokenizer = tiny_model
  return [rollout.Rollout(model, tokenizer, _PROMPT_LEN + _STEPS,
                          shared_prefix=shared) for shared in (False, True)]


def _counting_prefill(monkeypatch):
  """Counts the traces of `shared_prefix.prefill`."""
  traced = []
  prefill = shared_prefix.prefill

  def counted(*args, **kwargs):
    traced.append(1)
    return prefill(*args, **kwargs)

  monkeypatch.setattr(shared_prefix, 'prefill', counted)
  return traced


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_shared_prefix_gives_the_full_prefills_completions(
    tiny_model, prompts, temperature, monkeypatch):
  full, shared = _rollouts(tiny_model)
  traced = _counting_prefill(monkeypatch)
  sampling = dict(temperature=temperature, top_k=8, top_p=0.95, seed=3,
                  num_generations=2)
  want = full.generate(prompts, 8, **sampling)
  assert not traced
  got = shared.generate(prompts, 8, **sampling)
  assert traced  # The shared run was prefilled once.
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.mask, want.mask)
  np.testing.assert_allclose(got.logps, want.logps, atol=1e-5)
  # Too little in common (one row), or a window the run does not fit
  # in: the full prefill.
  traced.clear()
  shared.generate(prompts[:1], 8, **sampling)
  assert not traced
  shared.generate(prompts, _STEPS + 40, **sampling)  # 136 > 128 columns.
  assert not traced


class _Calculator:
  """Answers the first turn with a fixed result, then ends the episode."""

  def __init__(self):
    self.turns = 0
    self.tool_calls = []

  def reset(self, example):
    del example

  def step(self, turn_text):
    del turn_text
    self.turns += 1
    if self.turns == 1:
      return environment.Reply('\n<start_of_turn>user\nresult: 42'
                               '<end_of_turn>\n<start_of_turn>model\n',
                               False)
    return environment.Reply(None, True, 'answer')


def test_shared_prefix_episodes_match_the_full_prefill(tiny_model, prompts):
  results = []
  for roll in _rollouts(tiny_model):
    # Every eighth token id ends a turn, so the random model's turns end.
    roll.end_ids = sorted(set(roll.end_ids) | set(range(8, 262144, 8)))
    roll.sampler.eos_ids = np.array(roll.end_ids, np.int32)
    sampler = episodes.EpisodeRollout(roll, _Calculator, max_turn_tokens=8,
                                      max_insert_tokens=32)
    results.append(sampler.generate(prompts, _STEPS, seed=1, temperature=1.0,
                                    num_generations=2))
  want, got = results
  assert any(e.insert_tokens for e in want.episodes)  # A reply went in.
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.input_mask, want.input_mask)
  np.testing.assert_allclose(got.logps, want.logps, atol=1e-5)
  assert ([e.transcript for e in got.episodes]
          == [e.transcript for e in want.episodes])


# ------------------------------------------------------ on a 2-device mesh

# Runs in a subprocess with 2 fake CPU devices (fixed when jax starts):
# prints one JSON line comparing the two prefills on the mesh (fsdp = 2).
_MESH_CHILD = r'''
import dataclasses
import json

import numpy as np

from agent_tunix import models
from agent_tunix.data import pipeline
from agent_tunix.models import gemma3
from agent_tunix.rl import rollout
from agent_tunix.tpu import sharding
from agent_tunix.configs import tiny

original = gemma3.tiny_config
gemma3.tiny_config = lambda **kw: dataclasses.replace(
    original(**kw), sliding_window_size=128)
config = tiny.get_config()
mesh = sharding.make_mesh(config.mesh)
model, tokenizer = models.build(config, mesh)
head = 'You are a careful assistant who checks every sum twice. ' * 4
prompts = np.stack([
    pipeline.encode_prompt(head + text, tokenizer, 96)[0]
    for text in ('What is 2 + 3?', 'Name a colour, please.', 'Why?',
                 'Count to three.')])
full, shared = [rollout.Rollout(model, tokenizer, 120, shared_prefix=s)
                for s in (False, True)]
report = {'devices': int(mesh.devices.size),
          'row_shards': [shared._row_shards(4), shared._row_shards(3)]}
for name, rows, temperature in (('greedy', prompts, 0.0),
                                ('sampled', prompts, 1.0),
                                ('three_rows', prompts[:3], 1.0)):
  want, got = [r.generate(rows, 8, seed=3, temperature=temperature, top_k=8,
                          num_generations=2) for r in (full, shared)]
  report[name] = [bool(np.array_equal(got.tokens, want.tokens)),
                  float(np.abs(got.logps - want.logps).max())]
print('REPORT ' + json.dumps(report), flush=True)
'''


def test_shared_prefix_on_a_two_device_mesh():
  """One prefix row per row shard (2 here; 1 when 3 rows do not split),
  repeated on its shard: the full prefill's completions."""
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env['XLA_FLAGS'] = (env.get('XLA_FLAGS', '') +
                      ' --xla_force_host_platform_device_count=2').strip()
  env['PYTHONPATH'] = os.pathsep.join(
      [str(_REPO)] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
  done = subprocess.run([sys.executable, '-c', _MESH_CHILD], cwd=_REPO,
                        env=env, capture_output=True, text=True,
                        timeout=600, check=False)
  lines = [l for l in done.stdout.splitlines() if l.startswith('REPORT ')]
  assert done.returncode == 0 and lines, done.stderr[-3000:]
  report = json.loads(lines[-1][len('REPORT '):])
  assert report['devices'] == 2
  assert report['row_shards'] == [2, 1]
  for name in ('greedy', 'sampled', 'three_rows'):
    same, logp_diff = report[name]
    assert same, name
    assert logp_diff < 1e-5, name
