"""Tests for agent_tunix.rl.grpo: GRPO math against NumPy, and the update."""

import dataclasses
import functools
import os
import re

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# pylint: disable=g-import-not-at-top
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import qwix
from tunix.models.gemma3 import model as model_lib

from agent_tunix.rl import advantages
from agent_tunix.rl import grpo
from agent_tunix.rl import logprobs
from agent_tunix.rl import losses
from agent_tunix.rl import objectives
from agent_tunix.rl import optimizer as optimizer_lib
from agent_tunix.rl import remat
import update_helpers
# pylint: enable=g-import-not-at-top

_LORA_PATHS = (
    '.*q_einsum|.*kv_einsum|.*qkv_einsum|.*attn_vec_einsum|'
    '.*gate_proj|.*down_proj|.*up_proj'
)
_VOCAB = 128


def _tiny_config(sliding_window_size=8):
  return model_lib.ModelConfig(
      num_layers=2,
      num_embed=_VOCAB,
      embed_dim=32,
      hidden_dim=64,
      num_heads=2,
      head_dim=16,
      num_kv_heads=1,
      sliding_window_size=sliding_window_size,
      param_dtype=jnp.float32,
  )


def _random_state(abstract_state, seed, lora_b_scale):
  """Fills an abstract model state with seeded NumPy values (no compiles)."""
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    name = jax.tree_util.keystr(path)
    if 'scale' in name:  # RMSNorm: (1 + scale), keep it at 1.
      return jnp.zeros(leaf.shape, leaf.dtype)
    std = lora_b_scale if 'lora_b' in name else 0.3
    return jnp.asarray(rng.normal(0.0, std, leaf.shape).astype(leaf.dtype))

  return jax.tree_util.tree_map_with_path(fill, abstract_state)


def _build_lora_model(sliding_window_size=8):
  base = model_lib.Gemma3(
      _tiny_config(sliding_window_size), rngs=nnx.Rngs(0)
  )
  provider = qwix.LoraProvider(module_path=_LORA_PATHS, rank=4, alpha=8.0)
  return qwix.apply_lora_to_model(
      base, provider, **base.get_model_input(), rngs=nnx.Rngs(0)
  )


@pytest.fixture(scope='module')
def abstract_lora_model():
  # eval_shape builds the graph without running any XLA computation, which
  # keeps the test fast; weights are filled in by _random_state.
  return nnx.split(nnx.eval_shape(_build_lora_model))


def _lora_model(abstract, seed=0, lora_b_scale=0.3):
  graphdef, state = abstract
  return nnx.merge(graphdef, _random_state(state, seed, lora_b_scale))


def _tokens_and_masks(num_rows, prompt_len, completion_len, seed=0):
  """Left-padded prompts and right-padded completions of varied lengths."""
  rng = np.random.default_rng(seed)
  length = prompt_len + completion_len
  tokens = rng.integers(1, _VOCAB, size=(num_rows, length)).astype(np.int32)
  input_mask = np.ones((num_rows, length), bool)
  completion_mask = np.ones((num_rows, completion_len), np.float32)
  for row in range(num_rows):
    pad = row % prompt_len  # prompt keeps >= 1 real token
    input_mask[row, :pad] = False
    tokens[row, :pad] = 0
    kept = completion_len - (row * 2) % completion_len
    completion_mask[row, kept:] = 0.0
    input_mask[row, prompt_len + kept :] = False
    tokens[row, prompt_len + kept :] = 0
  return tokens, input_mask, completion_mask


def _batch(num_rows=4, prompt_len=3, completion_len=5, seed=0):
  tokens, input_mask, completion_mask = _tokens_and_masks(
      num_rows, prompt_len, completion_len, seed
  )
  rng = np.random.default_rng(seed + 1)
  shape = (num_rows, completion_len)
  return grpo.UpdateBatch(
      tokens=jnp.asarray(tokens),
      input_mask=jnp.asarray(input_mask),
      completion_mask=jnp.asarray(completion_mask),
      advantages=jnp.asarray(rng.normal(size=num_rows), jnp.float32),
      old_logps=jnp.asarray(
          -3.0 + 0.3 * rng.normal(size=shape), jnp.float32
      ),
      ref_logps=jnp.asarray(
          -3.0 + 0.3 * rng.normal(size=shape), jnp.float32
      ),
  )


# --------------------------------------------------------------- log-probs


def _numpy_logps_and_entropy(hidden, embedding, targets, temperature=1.0):
  logits = np.einsum('btd,vd->btv', hidden, embedding).astype(np.float64)
  logits /= temperature
  logits -= logits.max(axis=-1, keepdims=True)
  logp_all = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
  picked = np.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
  entropy = -(np.exp(logp_all) * logp_all).sum(axis=-1)
  return picked, entropy


@pytest.mark.parametrize('chunk_size, temperature',
                         [(3, 1.0), (5, 1.0), (7, 1.0), (10, 1.0), (3, 0.6),
                          (10, 1.7)])
def test_chunked_token_logps_matches_full_softmax(chunk_size, temperature):
  rng = np.random.default_rng(0)
  hidden = rng.normal(size=(2, 7, 8)).astype(np.float32)
  embedding = rng.normal(size=(11, 8)).astype(np.float32)
  targets = rng.integers(0, 11, size=(2, 7)).astype(np.int32)
  chunked = jax.jit(
      logprobs.chunked_token_logps, static_argnames=('chunk_size',
                                                 'compute_entropy',
                                                 'temperature'))
  logps, entropy = chunked(
      jnp.asarray(hidden),
      jnp.asarray(embedding),
      jnp.asarray(targets),
      chunk_size=chunk_size,
      compute_entropy=True,
      temperature=temperature,
  )
  want_logps, want_entropy = _numpy_logps_and_entropy(
      hidden, embedding, targets, temperature
  )
  if temperature != 1.0:  # The tempered distribution is another one.
    untempered, _ = _numpy_logps_and_entropy(hidden, embedding, targets)
    assert np.abs(untempered - want_logps).max() > 0.1
  assert logps.dtype == jnp.float32 and logps.shape == (2, 7)
  np.testing.assert_allclose(logps, want_logps, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(entropy, want_entropy, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('length, chunk_size, want', [
    (88, 64, (2, 44)),  # Not 2 x 64: 40 positions of padding.
    (88, 128, (1, 88)),
    (64, 64, (1, 64)),
    (65, 64, (2, 33)),
    (7, 3, (3, 3)),
    (7, 5, (2, 4)),
    (1, 64, (1, 1)),
    (5, 1, (5, 1)),
])
def test_chunk_layout_splits_evenly(length, chunk_size, want):
  num_chunks, chunk = logprobs.chunk_layout(length, chunk_size)
  assert (num_chunks, chunk) == want
  assert chunk <= chunk_size and num_chunks * chunk - length < num_chunks


def test_chunked_token_logps_projects_only_the_even_chunks():
  # 88 positions at chunk_size=64: every vocabulary projection, forward and
  # backward, is on 44 positions (2 x 44 = 88, no padded columns).
  hidden = jnp.zeros((1, 88, 4), jnp.float32)
  embedding = jnp.zeros((9, 4), jnp.float32)
  targets = jnp.zeros((1, 88), jnp.int32)

  def loss(h):
    return logprobs.chunked_token_logps(h, embedding, targets, 64)[0].sum()

  text = str(jax.make_jaxpr(jax.grad(loss))(hidden))
  assert 'f32[1,44,9]' in text
  assert 'f32[1,64,9]' not in text and 'f32[1,128' not in text


def test_chunked_token_logps_gradient_matches_full_softmax():
  rng = np.random.default_rng(1)
  hidden = jnp.asarray(rng.normal(size=(2, 5, 4)), jnp.float32)
  embedding = jnp.asarray(rng.normal(size=(9, 4)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 9, size=(2, 5)), jnp.int32)
  weights = jnp.asarray(rng.normal(size=(2, 5)), jnp.float32)

  def chunked(h):
    logps, _ = logprobs.chunked_token_logps(h, embedding, targets, 2)
    return (logps * weights).sum()

  def full(h):
    logp = jax.nn.log_softmax(h @ embedding.T, axis=-1)
    return (jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
            * weights).sum()

  np.testing.assert_allclose(
      jax.jit(jax.grad(chunked))(hidden),
      jax.jit(jax.grad(full))(hidden),
      rtol=1e-5,
      atol=1e-5,
  )
  assert logprobs.chunked_token_logps(hidden, embedding, targets, 2)[1] is None


# -------------------------------------------------------------- optimizer


def test_make_optimizer_schedule_and_clipping():
  _, schedule = optimizer_lib.make_optimizer(1e-3, warmup_ratio=0.1, num_steps=100)
  lrs = jax.jit(jax.vmap(schedule))(jnp.array([0, 5, 10, 55, 100]))
  np.testing.assert_allclose(lrs, [0.0, 5e-4, 1e-3, 5e-4, 0.0], rtol=1e-4,
                             atol=1e-12)
  _, no_warmup = optimizer_lib.make_optimizer(1e-3, 0.0, 10)
  np.testing.assert_allclose(jax.jit(no_warmup)(0), 1e-3, rtol=1e-5)

  def second_update(max_grad_norm):
    tx, _ = optimizer_lib.make_optimizer(1e-3, 0.0, 10, max_grad_norm=max_grad_norm)

    @jax.jit
    def run():
      params = {'w': jnp.ones(2)}
      state = tx.init(params)
      _, state = tx.update({'w': jnp.array([300.0, 400.0])}, state, params)
      return tx.update({'w': jnp.array([-0.3, 0.4])}, state, params)[0]['w']

    return np.asarray(run())

  # Adam is scale-free per coordinate, but the history mixes a big and a small
  # gradient; clipping the big one to norm 1 changes the second step.
  unclipped, clipped = second_update(0.0), second_update(1.0)
  assert np.all(np.isfinite(clipped))
  assert np.abs(clipped - unclipped).max() > 1e-5
  with pytest.raises(ValueError, match='warmup_ratio'):
    optimizer_lib.make_optimizer(1e-3, 1.5, 10)


def test_hparams_invariants_and_defaults():
  """StepHParams and the objective's parts assert their invariants (a
  config's fields are checked, with their fixes, by config.validation)."""
  assert losses.TokenClip(epsilon=0.2).upper_epsilon == 0.2
  assert losses.TokenClip(epsilon_high=0.28).upper_epsilon == 0.28
  assert losses.SequenceClip(1e-6).epsilon == 1e-6
  default = grpo.StepHParams()
  assert default.beta == 0.04 and default.needs_reference
  for bad in (lambda: losses.Aggregation('sum'),
              lambda: losses.KLPenalty(0.1, 'k9'),
              lambda: losses.TokenClip(epsilon=0.0),
              lambda: losses.TokenClip(epsilon_high=0.0),
              lambda: losses.TruncatedIS(-1.0),
              lambda: grpo.StepHParams(remat='decoder'),
              lambda: grpo.StepHParams(temperature=0.0)):
    with pytest.raises(AssertionError):
      bad()


def test_hparams_epsilon_is_a_positive_clip_range():
  """epsilon = 0 does not turn clipping off: the clipped ratio is then the
  constant 1, and a token whose ratio moved the way its advantage pushes
  gets no gradient, so the policy can only move back to the one that
  sampled. config.validation refuses it for configs."""
  logps = jnp.array([[0.01], [-0.01]])
  advantages = jnp.array([1.0, -1.0])

  def grad(epsilon):
    return jax.grad(lambda lp: objectives.clipped_surrogate(
        lp, jnp.zeros_like(lp), advantages, epsilon, epsilon)[0].sum())(
            logps)

  np.testing.assert_array_equal(grad(0.0), 0.0)
  assert (np.abs(grad(0.2)) > 0.9).all()


def _base_config():
  import importlib.util  # pylint: disable=g-import-not-at-top

  path = os.path.join(os.path.dirname(__file__), '..', 'agent_tunix', 'configs', 'base.py')
  spec = importlib.util.spec_from_file_location('base_config', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def test_hparams_from_base_config():
  config = _base_config()
  hp = grpo.hparams_from_config(config)
  assert hp.micro_batch_size == (
      config.training.micro_batch_size * config.grpo.num_generations
  )
  objective = hp.objective
  assert objective.aggregation == losses.Aggregation(
      config.grpo.loss_agg_mode, config.generation.max_generation_steps)
  assert objective.policy_loss == losses.TokenClip(config.grpo.epsilon,
                                                   config.grpo.epsilon_high)
  assert objective.terms == (losses.KLPenalty(config.grpo.beta, 'k3'),)
  assert objective.correction is None and config.grpo.tis_cap == 0.0
  assert objective.advantages == advantages.GroupRelative(
      config.grpo.num_generations, config.grpo.scale_rewards)
  assert hp.chunk_size == config.grpo.logps_chunk_size
  assert hp.remat == config.model.remat
  assert config.grpo.share_prompts
  assert hp.prompt_group == config.grpo.num_generations
  assert hp.temperature == config.generation.temperature == 0.9
  config.grpo.share_prompts = False
  assert grpo.hparams_from_config(config).prompt_group == 1
  config.generation.temperature = 0.0  # Greedy rollouts: the plain logits.
  assert grpo.hparams_from_config(config).temperature == 1.0


def test_config_names_each_variant():
  """Today's grpo.* fields pick the registered parts."""
  config = _base_config()
  config.grpo.update(beta=0.0, entropy_coeff=0.01, tis_cap=2.0,
                     importance_sampling_level='sequence', epsilon=3e-4,
                     epsilon_high=4e-4, maxent_tau=0.5)
  objective = grpo.hparams_from_config(config).objective
  assert objective.policy_loss == losses.SequenceClip(3e-4, 4e-4)
  assert objective.correction == losses.TruncatedIS(2.0)
  assert objective.terms == (losses.EntropyBonus(0.01),)
  assert isinstance(objective.advantages, advantages.MaxEnt)
  assert objective.needs_reference and objective.kl_coeff == 0.0
  config.grpo.update(maxent_tau=0.0, advantage_estimator='rloo')
  objective = grpo.hparams_from_config(config).objective
  assert objective.advantages == advantages.LeaveOneOut(4)
  assert not objective.needs_reference
  assert set(losses.POLICY_LOSSES) == set(objectives.IMPORTANCE_SAMPLING_LEVELS)


def test_update_batch_has_rewards_and_the_config_inputs():
  import ml_collections  # pylint: disable=g-import-not-at-top

  def config(kl_target):
    return ml_collections.ConfigDict({'grpo': {'kl_target': kl_target}})

  sequences = grpo.Sequences(np.zeros((4, 3), np.int32),
                             np.ones((4, 3), bool), np.ones((4, 2)))

  def present(batch):
    return {f.name for f in dataclasses.fields(batch)
            if getattr(batch, f.name) is not None}

  required = {'tokens', 'input_mask', 'completion_mask', 'rewards'}
  assert grpo.optional_inputs(config(0.0)) == ()
  assert present(grpo.update_batch(config(0.0), sequences, [1] * 4,
                                   0.1)) == required
  assert grpo.optional_inputs(config(0.01)) == ('kl_coeff',)
  batch = grpo.update_batch(config(0.01), sequences, [1, 2, 3, 4], 0.25)
  np.testing.assert_array_equal(batch.rewards, [1, 2, 3, 4])
  np.testing.assert_array_equal(batch.kl_coeff, [0.25] * 4)
  assert batch.rewards.dtype == batch.kl_coeff.dtype == np.float32
  assert present(batch) == required | {'kl_coeff'}


def test_update_computes_the_advantages_from_rewards(abstract_lora_model):
  """Without batch.advantages, the update estimates them from the rewards
  (prepare) with the objective's estimator: the same gradients as a batch
  that brings them."""
  model = _lora_model(abstract_lora_model)
  batch = _batch(num_rows=4)
  rewards = jnp.asarray([1.0, 0.0, 0.5, 2.0], jnp.float32)
  hp = update_helpers.hparams(micro_batch_size=2, **_LOSS_HP)
  estimator = advantages.GroupRelative(2, 'group')
  from_rewards = dataclasses.replace(hp, objective=dataclasses.replace(
      hp.objective, advantages=estimator))
  got, _ = update_helpers.compute_grads(
      model, batch.replace(advantages=None, rewards=rewards), from_rewards)
  want, _ = update_helpers.compute_grads(
      model, batch.replace(advantages=objectives.group_advantages(
          rewards, 2)), hp)
  _assert_same_grads(got, want)
  with pytest.raises(ValueError, match='no advantages'):
    update_helpers.compute_grads(model, batch.replace(advantages=None), hp)


# ---------------------------------------------------------------- the model


def test_per_token_logps_matches_model_logits(abstract_lora_model):
  model = _lora_model(abstract_lora_model)
  batch = _batch()
  completion_len = batch.completion_mask.shape[1]

  @nnx.jit
  def both(model, tokens, input_mask):
    logps, entropy = logprobs.per_token_logps(
        model, tokens, input_mask, completion_len, 2, compute_entropy=True
    )
    logits, _ = model(
        tokens,
        logprobs.positions_from_mask(input_mask),
        None,
        logprobs.causal_attention_mask(input_mask),
    )
    return logps, entropy, logits

  logps, entropy, logits = both(
      model, batch.tokens, batch.input_mask
  )
  logits = np.asarray(logits, np.float64)[:, -completion_len - 1 : -1]
  logits -= logits.max(-1, keepdims=True)
  logp_all = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  targets = np.asarray(batch.tokens)[:, -completion_len:]
  want = np.take_along_axis(logp_all, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(logps, want, rtol=1e-4, atol=1e-4)
  want_entropy = -(np.exp(logp_all) * logp_all).sum(-1)
  np.testing.assert_allclose(entropy, want_entropy, rtol=1e-4, atol=1e-4)
  # Hidden states are captured, not left behind on the model.
  assert not nnx.state(model, nnx.Intermediate)


@pytest.mark.parametrize('use_lora', [True, False])
def test_logps_passes_use_the_sampling_temperature(abstract_lora_model,
                                                   use_lora):
  """Policy and reference log-probs: the model's logits / temperature."""
  model = _lora_model(abstract_lora_model)
  batch = _batch()
  completion_len = batch.completion_mask.shape[1]
  temperature = 0.7
  hp = update_helpers.hparams(chunk_size=4, micro_batch_size=2,
                        temperature=temperature)
  passes = grpo.policy_logps if use_lora else grpo.reference_logps
  got = np.asarray(passes(model, batch, hp))
  model_cls = type(model)
  if not use_lora:
    model_cls = model_cls._unquantized_type  # pylint: disable=protected-access
  logits, _ = nnx.jit(lambda m, t, mask: model_cls.__call__(
      m, t, logprobs.positions_from_mask(mask), None,
      logprobs.causal_attention_mask(mask)))(
          model, batch.tokens, batch.input_mask)
  logits = np.asarray(logits, np.float64)[:, -completion_len - 1 : -1]
  targets = np.asarray(batch.tokens)[:, -completion_len:]

  def numpy_logps(t):
    scaled = logits / t
    scaled -= scaled.max(-1, keepdims=True)
    logp_all = scaled - np.log(np.exp(scaled).sum(-1, keepdims=True))
    return np.take_along_axis(logp_all, targets[..., None], -1)[..., 0]

  np.testing.assert_allclose(got, numpy_logps(temperature), rtol=1e-4,
                             atol=1e-4)
  assert np.abs(got - numpy_logps(1.0)).max() > 1e-2


def test_update_entropy_is_the_tempered_distributions(full_batch_reference):
  """The update's entropy metric (and log-probs) follow hp.temperature."""
  model, batch, _ = full_batch_reference
  base = dict(micro_batch_size=2, **_LOSS_HP)
  completion_len = batch.completion_mask.shape[1]
  mask = np.asarray(batch.completion_mask)
  for temperature in (0.5, 2.0):
    hp = update_helpers.hparams(temperature=temperature, **base)
    _, metrics = update_helpers.compute_grads(model, batch, hp)

    @nnx.jit
    def entropy(model, t=temperature):
      return logprobs.per_token_logps(
          model, batch.tokens, batch.input_mask, completion_len, 3,
          compute_entropy=True, temperature=t)[1]

    want = (np.asarray(entropy(model)) * mask).sum() / mask.sum()
    np.testing.assert_allclose(metrics['entropy'], want, rtol=1e-4)
  # Higher temperature: a flatter distribution.
  low = update_helpers.compute_grads(model, batch, update_helpers.hparams(
      temperature=0.5, **base))[1]['entropy']
  high = update_helpers.compute_grads(model, batch, update_helpers.hparams(
      temperature=2.0, **base))[1]['entropy']
  assert float(high) > float(low) + 0.1


def test_sampler_gap_metric(full_batch_reference):
  """sampler/logp_abs_diff: mean |sampler - trainer| over completion tokens,
  the trainer being the old log-probs, or the pass's own without them."""
  model, batch, _ = full_batch_reference
  hp = update_helpers.hparams(micro_batch_size=2, **_LOSS_HP)
  mask = np.asarray(batch.completion_mask)
  rng = np.random.default_rng(5)
  sampler = np.asarray(batch.old_logps) + rng.normal(
      0, 0.1, mask.shape).astype(np.float32)
  sampler = np.where(mask > 0, sampler, 0.0).astype(np.float32)
  with_old = batch.replace(sampler_logps=jnp.asarray(sampler))
  metrics = update_helpers.compute_grads(model, with_old, hp)[1]
  want = (np.abs(np.asarray(batch.old_logps) - sampler) * mask).sum()
  np.testing.assert_allclose(metrics[grpo.SAMPLER_GAP], want / mask.sum(),
                             rtol=1e-5)
  # Without old log-probs (num_iterations = 1): the current policy's.
  current = np.asarray(grpo.policy_logps(model, batch, hp))
  no_old = with_old.replace(old_logps=None,
                            sampler_logps=jnp.asarray(current + 0.25 * mask))
  metrics = update_helpers.compute_grads(model, no_old, hp)[1]
  np.testing.assert_allclose(metrics[grpo.SAMPLER_GAP], 0.25, rtol=1e-3)
  # Without sampler log-probs there is nothing to compare.
  assert grpo.SAMPLER_GAP not in update_helpers.compute_grads(model, batch, hp)[1]


def test_tis_weights_only_the_policy_gradient_term(full_batch_reference):
  """With tis_cap the loss is sum(mask * (w * surrogate + beta * kl)) / n,
  w = min(exp(old - sampler), cap) from NumPy; grads and loss match."""
  model, batch, reference = full_batch_reference
  (plain_loss, _), _ = reference['token-mean']
  mask = np.asarray(batch.completion_mask)
  old = np.asarray(batch.old_logps)
  rng = np.random.default_rng(4)
  sampler = (old + rng.normal(0, 0.5, old.shape)).astype(np.float32)
  cap = 1.3
  weights = np.minimum(np.exp(old.astype(np.float64) - sampler), cap)
  assert ((weights == cap) & (mask > 0)).any()
  graphdef, lora, rest = nnx.split(model, nnx.LoRAParam, ...)
  completion_len = mask.shape[1]

  @jax.jit
  def reference_loss(lora):
    logps, _ = logprobs.per_token_logps(
        nnx.merge(graphdef, lora, rest), batch.tokens, batch.input_mask,
        completion_len, chunk_size=completion_len,
    )
    surrogate, _ = objectives.clipped_surrogate(
        logps, batch.old_logps, batch.advantages, 0.2, 0.3
    )
    kl = objectives.kl_divergence(logps, batch.ref_logps, 'k3')
    per_token = jnp.asarray(weights, jnp.float32) * surrogate + 0.1 * kl
    return (per_token * mask).sum() / mask.sum()

  want_loss, want_grads = jax.value_and_grad(reference_loss)(lora)
  hp = update_helpers.hparams(micro_batch_size=2, tis_cap=cap, **_LOSS_HP)
  tis_batch = batch.replace(sampler_logps=jnp.asarray(sampler))
  grads, metrics = update_helpers.compute_grads(model, tis_batch, hp)
  np.testing.assert_allclose(metrics['loss'], want_loss, rtol=1e-4)
  assert abs(float(metrics['loss']) - float(plain_loss)) > 1e-3
  for want, got in zip(jax.tree.leaves(want_grads), jax.tree.leaves(grads)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match='tis_cap=1.3 needs'):
    update_helpers.compute_grads(model, batch, hp)


def test_reference_is_base_model_without_lora(abstract_lora_model):
  batch = _batch()
  hp = update_helpers.hparams(chunk_size=4, micro_batch_size=2)
  with_zero_b = _lora_model(abstract_lora_model, lora_b_scale=0.0)
  np.testing.assert_allclose(
      grpo.reference_logps(with_zero_b, batch, hp),
      grpo.policy_logps(with_zero_b, batch, hp),
      rtol=1e-5,
      atol=1e-5,
  )
  model = _lora_model(abstract_lora_model)
  ref = grpo.reference_logps(model, batch, hp)
  pol = grpo.policy_logps(model, batch, hp)
  assert ref.shape == pol.shape == batch.completion_mask.shape
  assert np.abs(np.asarray(ref) - np.asarray(pol)).max() > 1e-2
  # The reference only depends on the frozen weights: it is the same for
  # two LoRA models that share them (zero B vs. random B).
  np.testing.assert_allclose(
      ref, grpo.reference_logps(with_zero_b, batch, hp), rtol=1e-5, atol=1e-5
  )


_LOSS_HP = dict(
    beta=0.1, epsilon=0.2, epsilon_high=0.3, kl_estimator='k3', chunk_size=3
)


@pytest.fixture(scope='module')
def full_batch_reference(abstract_lora_model):
  """Model, batch, and per mode the full-batch (loss, kl) and LoRA grads.

  Written directly from the GRPO formula with the (separately tested) pieces,
  in one pass over the whole batch and with a single logits chunk; all three
  modes share one compilation.
  """
  model = _lora_model(abstract_lora_model)
  batch = _batch(num_rows=4)
  graphdef, lora, rest = nnx.split(model, nnx.LoRAParam, ...)
  mask = batch.completion_mask
  completion_len = mask.shape[1]

  def loss_fn(lora, mode):
    logps, _ = logprobs.per_token_logps(
        nnx.merge(graphdef, lora, rest), batch.tokens, batch.input_mask,
        completion_len, chunk_size=completion_len,
    )
    surrogate, _ = objectives.clipped_surrogate(
        logps, batch.old_logps, batch.advantages, 0.2, 0.3
    )
    kl = objectives.kl_divergence(logps, batch.ref_logps, 'k3')
    loss = objectives.aggregate_loss(surrogate + 0.1 * kl, mask, mode)
    return loss, (kl * mask).sum() / mask.sum()

  @jax.jit
  def all_modes(lora):
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    return {mode: grad_fn(lora, mode) for mode in objectives.LOSS_AGG_MODES}

  return model, batch, all_modes(lora)


@pytest.mark.parametrize('mode', objectives.LOSS_AGG_MODES)
def test_micro_batched_grads_equal_full_batch(full_batch_reference, mode):
  model, batch, reference = full_batch_reference
  (want_loss, want_kl), want_grads = reference[mode]
  # Two micro-batches (rows 0, 2 and rows 1, 3) with 6 and 7 tokens.
  hp = update_helpers.hparams(loss_agg_mode=mode, micro_batch_size=2, **_LOSS_HP)
  grads, metrics = update_helpers.compute_grads(model, batch, hp)
  np.testing.assert_allclose(metrics['loss'], want_loss, rtol=1e-4)
  np.testing.assert_allclose(metrics['kl'], want_kl, rtol=1e-4)
  np.testing.assert_allclose(
      metrics['grad_norm'], optax.tree.norm(want_grads), rtol=1e-4
  )
  assert float(metrics['grad_norm']) > 0
  assert 0 < float(metrics['clip_ratio']) < 1
  assert float(metrics['entropy']) > 0
  want_leaves = jax.tree.leaves(want_grads)
  got_leaves = jax.tree.leaves(grads)
  # 2 layers x 6 adapted projections x (A, B).
  assert len(got_leaves) == len(want_leaves) == 24
  for want, got in zip(want_leaves, got_leaves):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('mode', ['block', 'layer'])
def test_remat_update_equals_plain_update(full_batch_reference, mode):
  model, batch, reference = full_batch_reference
  (want_loss, want_kl), want_grads = reference['token-mean']
  hp = update_helpers.hparams(micro_batch_size=2, remat=mode, **_LOSS_HP)
  grads, metrics = update_helpers.compute_grads(model, batch, hp)
  np.testing.assert_allclose(metrics['loss'], want_loss, rtol=1e-4)
  np.testing.assert_allclose(metrics['kl'], want_kl, rtol=1e-4)
  for want, got in zip(jax.tree.leaves(want_grads), jax.tree.leaves(grads)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  # Remat really happens, and only inside the update: the caller's model
  # keeps its plain setting.
  graphdef, state = nnx.split(model)

  def traced(remat_mode):
    hp = update_helpers.hparams(
        micro_batch_size=2, remat=remat_mode, **{**_LOSS_HP, 'chunk_size': 5}
    )
    return str(jax.make_jaxpr(
        lambda s: grpo._grads_and_metrics(nnx.merge(graphdef, s), batch, hp)
    )(state))

  def count(pattern, jaxpr):
    return len(re.findall(pattern, jaxpr))

  plain = traced('none')
  if mode == 'block':
    # jax.checkpoint shows as `remat2[...]` (newer JAX: `checkpoint[...]`):
    # 2 layers x (attention + MLP); chunk_size >= C so log-probs add none.
    assert count(r'\b(?:remat2|checkpoint)\[', plain) == 0
    assert count(r'\b(?:remat2|checkpoint)\[', traced(mode)) == 4
  else:
    # The custom VJP is resolved in the traced gradient; what remains is
    # the layers' forward run a second time in the backward pass.
    extra = (count(r'\bdot_general\[', traced(mode)) -
             count(r'\bdot_general\[', plain))
    assert extra > 0
    # The layer modules of the caller's model keep their class.
  for _, sub in nnx.iter_modules(model):
    if isinstance(sub, model_lib.Attention):
      assert sub.remat_config == model_lib.RematConfig.NONE
    if isinstance(sub, (model_lib.FeedForward, model_lib.DecoderLayer)):
      assert sub.config.remat_config == model_lib.RematConfig.NONE
    if isinstance(sub, model_lib.DecoderLayer):
      assert type(sub) is model_lib.DecoderLayer


def _toy_stack(layers=8, tokens=256, dim=64, hidden=256):
  keys = jax.random.split(jax.random.key(0), 3 * layers + 1)
  shapes = [(dim, hidden), (dim, hidden), (hidden, dim)]
  weights = [
      tuple(0.1 * jax.random.normal(keys[3 * i + j], shape)
            for j, shape in enumerate(shapes))
      for i in range(layers)
  ]
  x = jax.random.normal(keys[-1], (tokens, dim))
  return weights, x


def _toy_layer(lora_scale, frozen, x):
  a, b, c = frozen
  h = jax.nn.gelu(x @ a) * (x @ b) * lora_scale
  return x + h @ c


def _toy_loss(scales, weights, x, mode):
  shift = jnp.tanh(scales[0])  # closed over below: a perturbed closure value
  for scale, frozen in zip(scales, weights):
    if mode == 'none':
      x = _toy_layer(scale, frozen, x) + shift
    elif mode == 'checkpoint':
      x = jax.checkpoint(_toy_layer)(scale, frozen, x) + shift
    else:
      x = remat.remat_after_cotangent(
          lambda d, f: _toy_layer(d[0], f, d[1]) + shift, (scale, x), frozen
      )
  return (x ** 2).mean()


def test_remat_after_cotangent_grads_and_memory():
  weights, x = _toy_stack()
  scales = jnp.linspace(0.5, 1.5, len(weights))
  grad = {
      mode: jax.jit(jax.grad(
          functools.partial(_toy_loss, mode=mode), argnums=(0, 2)
      ))
      for mode in ('none', 'checkpoint', 'cotangent')
  }
  want = grad['none'](scales, weights, x)
  got = grad['cotangent'](scales, weights, x)
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  # What it is for: with the recomputation tied to the cotangent, XLA keeps
  # about one layer's activations alive instead of all of them (CPU drops
  # jax.checkpoint's barriers, so plain checkpointing saves little there).
  temp = {
      mode: fn.lower(scales, weights, x).compile().memory_analysis()
      .temp_size_in_bytes
      for mode, fn in grad.items()
  }
  assert temp['cotangent'] < 0.5 * temp['none'], temp
  assert temp['cotangent'] < temp['checkpoint'], temp


def test_train_step_changes_only_lora_and_reduces_loss(abstract_lora_model):
  model = _lora_model(abstract_lora_model)
  tx, _ = optimizer_lib.make_optimizer(
      3e-2, warmup_ratio=0.0, num_steps=100, weight_decay=0.0,
      max_grad_norm=1.0,
  )
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.LoRAParam)
  batch = _batch(num_rows=4)
  advantages = np.array([1.0, -1.0, 1.0, -1.0], np.float32)
  batch = batch.replace(advantages=jnp.asarray(advantages))
  # Several updates on one batch of rollouts (num_iterations > 1): the old
  # log-probs are those of the policy before the first update. Same hp as in
  # test_reference_is_base_model_without_lora, so it reuses that compile.
  batch = batch.replace(old_logps=grpo.policy_logps(
      model, batch, update_helpers.hparams(chunk_size=4, micro_batch_size=2)
  ))
  hp = update_helpers.hparams(beta=0.0, chunk_size=4, micro_batch_size=2)

  frozen_before = jax.tree.map(
      np.array, nnx.state(model, nnx.Not(nnx.LoRAParam))
  )
  lora_before = jax.tree.map(np.array, nnx.state(model, nnx.LoRAParam))
  step_losses = []
  for step in range(4):
    metrics = grpo.train_step(model, optimizer, batch, hp)
    if step == 0:  # policy == old policy, in the same row order
      assert float(metrics['clip_ratio']) == 0.0
    assert 'kl' not in metrics  # beta == 0: no KL, no reference
    assert all(np.isfinite(v) for v in jax.tree.leaves(metrics))
    step_losses.append(float(metrics['loss']))

  frozen_after = nnx.state(model, nnx.Not(nnx.LoRAParam))
  for before, after in zip(jax.tree.leaves(frozen_before),
                           jax.tree.leaves(frozen_after)):
    np.testing.assert_array_equal(before, after)
  lora_after = nnx.state(model, nnx.LoRAParam)
  changed = [
      not np.array_equal(b, a)
      for b, a in zip(jax.tree.leaves(lora_before), jax.tree.leaves(lora_after))
  ]
  assert all(changed)
  assert int(optimizer.step[...]) == 4
  # First step: ratio 1, so the loss is the token-mean of -advantage.
  mask = np.asarray(batch.completion_mask)
  on_policy = -(advantages[:, None] * mask).sum() / mask.sum()
  np.testing.assert_allclose(step_losses[0], on_policy, rtol=1e-5)
  assert step_losses[-1] < step_losses[0] - 1e-2, step_losses


def test_train_step_rejects_bad_batch(abstract_lora_model):
  model = _lora_model(abstract_lora_model)
  batch = _batch(num_rows=4)
  with pytest.raises(ValueError, match='micro_batch_size=3'):
    update_helpers.compute_grads(model, batch, update_helpers.hparams(micro_batch_size=3))
  batch = batch.replace(ref_logps=None)
  with pytest.raises(ValueError, match='ref_logps'):
    update_helpers.compute_grads(model, batch, update_helpers.hparams(beta=0.1))


# ------------------------------------------------------- shared prompts

_G = 3


@pytest.fixture(scope='module')
def wide_window_model():
  """The tiny LoRA model with a sliding window wider than the test batches."""
  abstract = nnx.split(nnx.eval_shape(lambda: _build_lora_model(64)))
  return _lora_model(abstract)


def _grouped_batch(num_prompts=4, prompt_len=5, completion_len=4, seed=0):
  """G rows per prompt (contiguous), left-padded prompts, ragged ends."""
  rng = np.random.default_rng(seed)
  rows = num_prompts * _G
  prompt = rng.integers(1, _VOCAB, (num_prompts, prompt_len))
  prompt_mask = np.ones((num_prompts, prompt_len), bool)
  for i in range(num_prompts):
    pad = i % (prompt_len - 1)  # keep >= 1 real prompt token
    prompt[i, :pad] = 0
    prompt_mask[i, :pad] = False
  completion = rng.integers(1, _VOCAB, (rows, completion_len))
  completion_mask = np.ones((rows, completion_len), bool)
  for row in range(rows):
    kept = completion_len - row % completion_len
    completion[row, kept:] = 0
    completion_mask[row, kept:] = False
  shape = (rows, completion_len)
  return grpo.UpdateBatch(
      tokens=jnp.asarray(np.concatenate(
          [np.repeat(prompt, _G, axis=0), completion], axis=1), jnp.int32),
      input_mask=jnp.asarray(np.concatenate(
          [np.repeat(prompt_mask, _G, axis=0), completion_mask], axis=1)),
      completion_mask=jnp.asarray(completion_mask, jnp.float32),
      advantages=jnp.asarray(rng.normal(size=rows), jnp.float32),
      old_logps=jnp.asarray(-3.0 + 0.3 * rng.normal(size=shape),
                            jnp.float32),
      ref_logps=jnp.asarray(-3.0 + 0.3 * rng.normal(size=shape),
                            jnp.float32),
  )


def test_micro_batches_keep_groups_together():
  rows = np.arange(12)
  micros = grpo._micro_batches({'tokens': rows}, size=6, group=3)
  # Two micro-batches of two groups each: groups 0, 2 and groups 1, 3.
  np.testing.assert_array_equal(
      micros['tokens'], [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]])
  np.testing.assert_array_equal(
      grpo._merge_micro_batches(micros['tokens'], group=3), rows)
  # group=1 is the row-strided split.
  single = grpo._micro_batches({'tokens': rows}, size=6)['tokens']
  np.testing.assert_array_equal(single[0], [0, 2, 4, 6, 8, 10])
  np.testing.assert_array_equal(grpo._merge_micro_batches(single), rows)


@pytest.mark.parametrize('use_lora', [True, False])
def test_shared_prompt_logps_equal_full_forward(wide_window_model, use_lora):
  model = wide_window_model
  batch = _grouped_batch()
  length, c = batch.tokens.shape[1], batch.completion_mask.shape[1]
  assert logprobs.can_share_prompts(model, length, c)
  args = (model, batch.tokens, batch.input_mask, c, 3)
  want = logprobs.per_token_logps(*args, use_lora=use_lora, compute_entropy=True)
  got = logprobs.per_token_logps(*args, use_lora=use_lora, compute_entropy=True,
                             group=_G)
  for w, g in zip(want, got):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5)
  # The shared path really ran: its hidden states come from two model calls
  # (the prompt once per group, then every row's tail).
  graphdef, state = nnx.split(model)

  def jaxpr(group):
    def logps(state):
      module = nnx.merge(graphdef, state, copy=True)
      return logprobs.per_token_logps(module, batch.tokens,
                                  batch.input_mask, c, 3, group=group)[0]
    return str(jax.make_jaxpr(logps)(state))

  # Writes into the KV cache happen only on the shared path.
  assert 'dynamic_update_slice' in jaxpr(_G)
  assert 'dynamic_update_slice' not in jaxpr(1)


def test_shared_prompts_need_the_sequence_inside_the_window(
    wide_window_model, abstract_lora_model):
  assert logprobs.can_share_prompts(wide_window_model, 64, 4)
  assert not logprobs.can_share_prompts(wide_window_model, 65, 4)
  assert not logprobs.can_share_prompts(wide_window_model, 9, 1)
  assert not logprobs.can_share_prompts(wide_window_model, 5, 4)  # 1-token prompt
  narrow = _lora_model(abstract_lora_model)  # window 8
  assert not logprobs.can_share_prompts(narrow, 9, 4)
  # Too long for the window: group > 1 falls back to the full forward.
  batch = _grouped_batch(prompt_len=6, completion_len=4)  # L = 10 > 8
  args = (narrow, batch.tokens, batch.input_mask, 4, 4)
  np.testing.assert_array_equal(logprobs.per_token_logps(*args, group=_G)[0],
                                logprobs.per_token_logps(*args)[0])


@pytest.mark.parametrize('remat_mode', ['none', 'layer'])
def test_shared_prompt_update_equals_full_update(wide_window_model,
                                                 remat_mode):
  model = wide_window_model
  batch = _grouped_batch()
  base = dict(micro_batch_size=2 * _G, **_LOSS_HP)
  want_grads, want = update_helpers.compute_grads(
      model, batch, update_helpers.hparams(**base))
  # With remat='layer' the layers also run with a KV cache (int end_index)
  # inside the recomputed region.
  got_grads, got = update_helpers.compute_grads(
      model, batch, update_helpers.hparams(prompt_group=_G, remat=remat_mode, **base))
  for key in want:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-6)
  for w, g in zip(jax.tree.leaves(want_grads), jax.tree.leaves(got_grads)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
  hp = update_helpers.hparams(prompt_group=_G, **base)
  for fn in (grpo.reference_logps, grpo.policy_logps):
    np.testing.assert_allclose(
        fn(model, batch, hp), fn(model, batch, update_helpers.hparams(**base)),
        rtol=1e-5, atol=2e-5)


def test_prompt_group_must_divide_the_micro_batch():
  with pytest.raises(AssertionError, match='prompt_group=3 .*micro_batch_size=4'):
    grpo.StepHParams(micro_batch_size=4, prompt_group=3)
  with pytest.raises(AssertionError):
    grpo.StepHParams(prompt_group=0)


# ------------------------------------------------------ completion buckets


def test_completion_bucket():
  table = {0: 16, 1: 16, 16: 16, 17: 32, 64: 64, 100: 128, 129: 192,
           192: 192}
  for longest, want in table.items():
    assert grpo.completion_bucket(longest, 192) == want, longest
  assert {grpo.completion_bucket(n, 192) for n in range(193)} == {
      16, 32, 64, 128, 192}
  assert grpo.completion_bucket(5, 8) == 8
  assert grpo.completion_bucket(3, 8, smallest=2) == 4
  with pytest.raises(ValueError, match='longest=9'):
    grpo.completion_bucket(9, 8)


def _short_completions_batch(longest=3, completion_len=8):
  """A batch whose completions use only the first `longest` of its columns;
  the other columns hold junk tokens, masked out as the rollout masks them."""
  batch = jax.tree.map(np.array, _batch(
      num_rows=4, prompt_len=3, completion_len=completion_len))
  prompt_len = 3
  batch.completion_mask[:, longest:] = 0.0
  batch.completion_mask[1, 1:] = 0.0  # Rows of different lengths.
  batch.input_mask[:, prompt_len:] = batch.completion_mask > 0
  rng = np.random.default_rng(9)
  batch = batch.replace(sampler_logps=(batch.old_logps + rng.normal(
      0, 0.3, batch.old_logps.shape)).astype(np.float32))
  return jax.tree.map(jnp.asarray, batch)


@pytest.mark.parametrize('mode', ['token-mean',
                                  'sequence-mean-token-sum-norm'])
def test_trimmed_batch_gives_the_full_batchs_update(abstract_lora_model,
                                                    mode):
  model = _lora_model(abstract_lora_model)
  batch = _short_completions_batch(longest=3, completion_len=8)
  trimmed = grpo.trim_completions(batch, 4)
  assert trimmed.tokens.shape == (4, 7)
  assert trimmed.completion_mask.shape == (4, 4)
  assert trimmed.sampler_logps.shape == (4, 4)
  np.testing.assert_array_equal(trimmed.advantages, batch.advantages)
  flat = dict(loss_agg_mode=mode, micro_batch_size=2, tis_cap=2.0,
              **_LOSS_HP)
  hp = update_helpers.hparams(completion_norm=8, **flat)
  want_grads, want = update_helpers.compute_grads(model, batch, hp)
  got_grads, got = update_helpers.compute_grads(model, trimmed, hp)
  assert set(got) == set(want)
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)
  assert float(want['grad_norm']) > 0
  for w, g in zip(jax.tree.leaves(want_grads), jax.tree.leaves(got_grads)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
  if mode == 'sequence-mean-token-sum-norm':
    # Dr. GRPO divides by the sampled length: without completion_norm the
    # trimmed batch would change the loss.
    plain = update_helpers.hparams(completion_norm=0, **flat)
    short = update_helpers.compute_grads(model, trimmed, plain)[1]['loss']
    assert abs(float(short) - float(want['loss'])) > 1e-4


def test_only_bucket_shapes_compile(abstract_lora_model):
  model = _lora_model(abstract_lora_model)
  hp = update_helpers.hparams(chunk_size=7, micro_batch_size=2)  # Its own cache.
  jitted = grpo._LOGPS((nnx.split(model)[0],))  # pylint: disable=protected-access
  before = jitted._cache_size()  # pylint: disable=protected-access
  shapes = set()
  for longest in (1, 2, 3, 4, 5, 7, 8, 2):
    batch = _short_completions_batch(longest=longest, completion_len=8)
    mask = np.asarray(batch.completion_mask)
    bucket = grpo.completion_bucket(
        int(mask.sum(axis=1).max()), 8, smallest=2)
    trimmed = grpo.trim_completions(batch, bucket)
    shapes.add(trimmed.tokens.shape)
    logps = np.asarray(grpo.policy_logps(model, trimmed, hp))
    full = np.asarray(grpo.policy_logps(model, batch, hp))
    kept = np.asarray(trimmed.completion_mask) > 0
    np.testing.assert_allclose(logps[kept], full[:, :bucket][kept],
                               rtol=1e-5, atol=1e-6)
  # Buckets 2, 4 and 8 (the last is the full batch's shape, too).
  assert shapes == {(4, 5), (4, 7), (4, 11)}
  assert jitted._cache_size() - before == 3  # pylint: disable=protected-access


# ------------------------------------------ the objective menu in the update


def _direct_grads(model, batch, per_token_fn, mode='sequence-mean-token-mean'):
  """LoRA grads of aggregate(per_token_fn(logps, entropy)), one pass."""
  graphdef, lora, rest = nnx.split(model, nnx.LoRAParam, ...)
  mask = batch.completion_mask

  def loss_fn(lora):
    logps, entropy = logprobs.per_token_logps(
        nnx.merge(graphdef, lora, rest), batch.tokens, batch.input_mask,
        mask.shape[1], chunk_size=mask.shape[1], compute_entropy=True,
    )
    return objectives.aggregate_loss(per_token_fn(logps, entropy), mask, mode)

  return jax.grad(loss_fn)(lora)


def _assert_same_grads(got, want):
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_gspo_entropy_and_row_kl_coeff_in_the_update(abstract_lora_model):
  model = _lora_model(abstract_lora_model)
  batch = _batch(num_rows=4)
  # GSPO-sized clip ranges, with old log-probs close enough to the policy
  # that some sequences are inside the trust region and some outside.
  logps, _ = logprobs.per_token_logps(
      model, batch.tokens, batch.input_mask, 5, chunk_size=5)
  shift = jnp.array([0.0, 0.02, -0.03, 0.001])[:, None]
  batch = batch.replace(old_logps=logps + shift,
                        kl_coeff=jnp.full((4,), 0.3, jnp.float32))
  mode = 'sequence-mean-token-mean'

  def reference(lp, entropy):
    surrogate, _ = objectives.sequence_clipped_surrogate(
        lp, batch.old_logps, batch.advantages,
        batch.completion_mask, 0.01, 0.015)
    kl = objectives.kl_divergence(lp, batch.ref_logps, 'k3')
    return surrogate + 0.3 * kl - 0.05 * entropy

  want = _direct_grads(model, batch, reference, mode)
  flat = dict(epsilon=0.01, epsilon_high=0.015, loss_agg_mode=mode,
              chunk_size=3, micro_batch_size=2)
  hp = update_helpers.hparams(
      beta=0.1,  # The rows' kl_coeff (0.3) replaces it.
      importance_sampling_level='sequence', entropy_coeff=0.05, **flat)
  got, metrics = update_helpers.compute_grads(model, batch, hp)
  _assert_same_grads(got, want)
  assert 0 < float(metrics['clip_ratio']) < 1
  # Old log-probs 0.1 off per token, alternately up and down: the token
  # ratios leave the trust region, the sequences' geometric means barely
  # move, so the two levels give different updates.
  # (Policy-gradient terms only: KL and entropy are the same in both.)
  noisy = batch.replace(old_logps=logps + 0.1 * (-1.0) ** jnp.arange(5))
  seq, _ = update_helpers.compute_grads(model, noisy, update_helpers.hparams(
      beta=0.0, importance_sampling_level='sequence', **flat))
  token, _ = update_helpers.compute_grads(
      model, noisy, update_helpers.hparams(beta=0.0, **flat))
  diff = max(float(jnp.abs(a - b).max()) for a, b in
             zip(jax.tree.leaves(token), jax.tree.leaves(seq)))
  scale = max(float(jnp.abs(a).max()) for a in jax.tree.leaves(seq))
  assert diff > 0.05 * scale


def test_maxent_update_uses_the_target_advantages(abstract_lora_model):
  model = _lora_model(abstract_lora_model)
  batch = _batch(num_rows=4)
  rng = np.random.default_rng(3)
  batch = batch.replace(rewards=jnp.asarray(rng.normal(size=4), jnp.float32),
                        advantages=None)
  flat = dict(beta=0.0, epsilon=0.2, chunk_size=3, micro_batch_size=2)
  hp = update_helpers.hparams(
      num_generations=2, maxent_tau=0.5, maxent_q_temperature=0.7,
      maxent_q_epsilon=0.1, **flat)
  assert hp.needs_reference
  got, metrics = update_helpers.compute_grads(model, batch, hp)
  mask = np.asarray(batch.completion_mask)
  scores = (np.asarray(batch.ref_logps) * mask).sum(-1) / mask.sum(-1)
  r = np.asarray(batch.rewards).reshape(2, 2)
  q = np.exp(r / 0.7) / np.exp(r / 0.7).sum(-1, keepdims=True)
  q = 0.9 * q + 0.05
  logits = scores.reshape(2, 2) + np.log(q) / 0.5
  w = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  plain = batch.replace(advantages=jnp.asarray(2 * w.reshape(-1) - 1,
                                              jnp.float32), rewards=None)
  want, _ = update_helpers.compute_grads(
      model, plain, update_helpers.hparams(**flat))
  _assert_same_grads(got, want)
  want_entropy = -(w * np.log(w)).sum() / 2
  np.testing.assert_allclose(metrics['maxent/target_entropy'], want_entropy,
                             rtol=1e-5)
  with pytest.raises(ValueError, match='rewards'):
    update_helpers.compute_grads(model, batch.replace(rewards=None), hp)
  with pytest.raises(ValueError, match='reference log-probs'):
    update_helpers.compute_grads(model, batch.replace(ref_logps=None), hp)
