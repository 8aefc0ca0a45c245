"""Tests for agent_tunix.rl.packing: packed passes equal the padded ones."""

import contextlib
import dataclasses
import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# pylint: disable=g-import-not-at-top
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import qwix
from tunix.models.gemma3 import model as model_lib

from agent_tunix.models import packed_attention
from agent_tunix.rl import grpo
from agent_tunix.rl import logprobs
from agent_tunix.rl import packing
from agent_tunix.rl import staging
import update_helpers
# pylint: enable=g-import-not-at-top

_VOCAB = 128
_G = 3
_LOSS_HP = dict(beta=0.1, epsilon=0.2, epsilon_high=0.3)


def _model(sliding_window_size, seed=0):
  """A tiny Gemma 3 with LoRA (random B), float32."""
  config = model_lib.ModelConfig(
      num_layers=2, num_embed=_VOCAB, embed_dim=32, hidden_dim=64,
      num_heads=2, head_dim=16, num_kv_heads=1,
      sliding_window_size=sliding_window_size, param_dtype=jnp.float32)

  def build():
    base = model_lib.Gemma3(config, rngs=nnx.Rngs(0))
    provider = qwix.LoraProvider(
        module_path='.*einsum|.*proj', rank=4, alpha=8.0)
    return qwix.apply_lora_to_model(base, provider, **base.get_model_input(),
                                    rngs=nnx.Rngs(0))

  graphdef, state = nnx.split(nnx.eval_shape(build))
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    if 'scale' in jax.tree_util.keystr(path):
      return jnp.zeros(leaf.shape, leaf.dtype)
    return jnp.asarray(rng.normal(0.0, 0.3, leaf.shape).astype(leaf.dtype))

  return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(fill, state))


@pytest.fixture(scope='module')
def narrow_model():
  """Window 6: shorter than the test rows, so the window cuts keys."""
  return _model(6)


@pytest.fixture(scope='module')
def wide_model():
  return _model(64)


def _batch(num_prompts=4, group=_G, prompt_len=6, completion_len=5,
           inserts=False, seed=0):
  """Groups of `group` rows sharing a left-padded prompt; completions of
  mixed lengths (one empty). With `inserts`, each completion has inserted
  tokens (real, not counted) in its middle, as a tool episode has."""
  rng = np.random.default_rng(seed)
  rows = num_prompts * group
  prompt = rng.integers(1, _VOCAB, (num_prompts, prompt_len))
  prompt_mask = np.ones((num_prompts, prompt_len), bool)
  for i in range(num_prompts):
    prompt[i, :i % (prompt_len - 1)] = 0
    prompt_mask[i, :i % (prompt_len - 1)] = False
  completion = rng.integers(1, _VOCAB, (rows, completion_len))
  real = np.zeros((rows, completion_len), bool)
  for row in range(rows):
    real[row, :(row * 2) % (completion_len + 1)] = True
  completion[~real] = 0
  counted = real.copy()
  if inserts:
    counted[:, 1:3] = False  # a tool result between two model turns
  shape = (rows, completion_len)
  return grpo.UpdateBatch(
      tokens=jnp.asarray(np.concatenate(
          [np.repeat(prompt, group, axis=0), completion], 1), jnp.int32),
      input_mask=jnp.asarray(np.concatenate(
          [np.repeat(prompt_mask, group, axis=0), real], 1)),
      completion_mask=jnp.asarray(counted, jnp.float32),
      advantages=jnp.asarray(rng.normal(size=rows), jnp.float32),
      old_logps=jnp.asarray(-3 + 0.3 * rng.normal(size=shape), jnp.float32),
      ref_logps=jnp.asarray(-3 + 0.3 * rng.normal(size=shape), jnp.float32),
  )


def _packed(batch, group):
  return batch.replace(packing=packing.for_batch(
      np.asarray(batch.input_mask), np.asarray(batch.completion_mask), group))


def test_bucket_sizes():
  assert [packing.bucket(n, 10_000) for n in (1, 16, 17, 128, 129, 200)] == [
      16, 16, 32, 128, 160, 224]
  assert packing.bucket(1000, 600) == 600
  # At most a quarter over, and few sizes an octave.
  sizes = {packing.bucket(n, 10_000) for n in range(129, 257)}
  assert sizes == {160, 192, 224, 256}


def test_for_batch_counts_real_and_counted_tokens():
  batch = _batch()
  mask = np.asarray(batch.input_mask)
  counted = np.asarray(batch.completion_mask)
  width, slots = packing.needs(mask, counted, _G)
  per_group = [mask[g * _G:(g + 1) * _G, 6:].sum() for g in range(4)]
  assert width == max(per_group)
  assert slots == max(counted[g * _G:(g + 1) * _G].sum() for g in range(4))
  got = packing.for_batch(mask, counted, _G)
  assert got.width >= width and got.slots >= slots and got.slots % _G == 0


@pytest.mark.parametrize('group', [1, _G])
@pytest.mark.parametrize('inserts', [False, True])
@pytest.mark.parametrize('use_lora', [True, False])
def test_packed_logps_equal_padded(narrow_model, group, inserts, use_lora):
  batch = _batch(inserts=inserts)
  packed = _packed(batch, group)
  c = batch.completion_mask.shape[1]
  args = (narrow_model, batch.tokens, batch.input_mask, c, 4)
  want = logprobs.per_token_logps(*args, use_lora=use_lora,
                                  compute_entropy=True)
  got = logprobs.per_token_logps(
      *args, use_lora=use_lora, compute_entropy=True, group=group,
      completion_mask=batch.completion_mask, packing=packed.packing)
  counted = np.asarray(batch.completion_mask) > 0
  for w, g in zip(want, got):
    np.testing.assert_allclose(np.asarray(g)[counted], np.asarray(w)[counted],
                               rtol=1e-5, atol=2e-5)
    assert not np.asarray(g)[~counted].any()


def test_window_is_counted_in_positions(narrow_model, monkeypatch):
  """Packed, a group's later completions lie further from the prompt in
  columns than in positions: tunix's column band would cut keys."""
  batch = _batch()
  packed = _packed(batch, _G)
  c = batch.completion_mask.shape[1]
  args = (narrow_model, batch.tokens, batch.input_mask, c, 4)
  kwargs = dict(group=_G, completion_mask=batch.completion_mask,
                packing=packed.packing)
  want = np.asarray(logprobs.per_token_logps(*args)[0])
  ours = np.asarray(logprobs.per_token_logps(*args, **kwargs)[0])
  # The same packed rows through tunix's own attention (band in columns).
  monkeypatch.setattr(packed_attention, 'packed_attention_graph',
                      contextlib.nullcontext)
  banded = np.asarray(logprobs.per_token_logps(*args, **kwargs)[0])
  counted = np.asarray(batch.completion_mask) > 0
  np.testing.assert_allclose(ours[counted], want[counted], rtol=1e-5,
                             atol=2e-5)
  assert np.abs(banded - want)[counted].max() > 1e-3


@pytest.mark.parametrize('remat, inserts', [
    ('none', False), ('none', True), ('block', True), ('layer', True)])
def test_packed_update_equals_padded(narrow_model, remat, inserts):
  batch = _batch(inserts=inserts)
  hp = update_helpers.hparams(micro_batch_size=2 * _G, prompt_group=_G,
                              chunk_size=3, remat=remat, **_LOSS_HP)
  want_grads, want = update_helpers.compute_grads(
      narrow_model, batch, dataclasses.replace(hp, prompt_group=1))
  got_grads, got = update_helpers.compute_grads(
      narrow_model, _packed(batch, _G), hp)
  for key in want:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-6)
  # The two sum the same terms in different orders: float32 rounding grows
  # with a leaf's scale (leaves here reach |g| ~ 4), and how it falls
  # depends on the CPU's vector width (an Intel Xeon's result differed by
  # 1.2e-5 on one element of a leaf that reaches 4.3).
  for w, g in zip(jax.tree.leaves(want_grads), jax.tree.leaves(got_grads)):
    scale = max(1.0, float(np.abs(w).max()))
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * scale)


def test_packed_reference_and_policy_passes(wide_model):
  batch = _batch(inserts=True)
  hp = update_helpers.hparams(micro_batch_size=2 * _G, prompt_group=_G,
                              **_LOSS_HP)
  counted = np.asarray(batch.completion_mask) > 0
  for fn in (grpo.reference_logps, grpo.policy_logps):
    got = np.asarray(fn(wide_model, _packed(batch, _G), hp))
    want = np.asarray(fn(wide_model, batch, hp))
    np.testing.assert_allclose(got[counted], want[counted], rtol=1e-5,
                               atol=2e-5)


def test_padding_share():
  # 2 groups of 2 rows, C = 64: completions of 10, 20 | 30, 4 tokens.
  lengths = [10, 20, 30, 4]
  completion_mask = np.zeros((4, 64), np.float32)
  for row, n in enumerate(lengths):
    completion_mask[row, :n] = 1
  input_mask = np.concatenate([np.ones((4, 8), bool), completion_mask > 0], 1)
  assert packing.for_batch(input_mask, completion_mask, 2) == packing.Packing(
      width=48, slots=48)  # 34 tokens a group at most, in 16s
  share = packing.padding_share(input_mask, completion_mask, 2)
  assert share['padded'] == pytest.approx(1 - 64 / 256)
  assert share['packed'] == pytest.approx(1 - 64 / 96)


def test_stage_prepares_packed_rows_where_they_split(narrow_model):
  batch = _batch(inserts=True)
  host = jax.tree.map(np.asarray, batch)
  hp = update_helpers.hparams(micro_batch_size=2 * _G, prompt_group=_G,
                              **_LOSS_HP)
  one = jax.make_mesh((1,), ('fsdp',))
  packed = staging.prepare(narrow_model, one, hp, host, pack=True)
  assert packed.packing == packing.for_batch(
      packed.input_mask, packed.completion_mask, _G)
  assert staging.prepare(narrow_model, one, hp, host, pack=False).packing is None
  # Two packed rows a micro-batch do not split over 4 batch shards.
  assert staging.prepare(narrow_model, _FourWayMesh(), hp, host,
                         pack=True).packing is None
  # Only a tunix Gemma 3 packs.
  assert not packing.supported(object())


class _FourWayMesh:
  """What staging reads of a mesh whose batch axes are 4-way."""

  shape = {'fsdp': 4}
  axis_names = ('fsdp',)
