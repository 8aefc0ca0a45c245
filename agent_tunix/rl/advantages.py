"""Advantage estimators by name: a row's rewards -> its advantage.

An estimator is a small frozen dataclass (hashable: it rides in the
update's static hyperparameters) registered under a name; `from_config`
builds the one grpo.advantage_estimator names (grpo.maxent_tau > 0 names
'maxent'), and `estimate` is the one function the update calls, on the
whole batch, after the reference pass and before the gradient function.
Estimators are pure array functions over `objectives`' math; they import
nothing from the model side.

Rows come in groups of G contiguous completions of one prompt. A group with
no completion token to train on (dynamic sampling's filling groups, masked
out of the loss) gets zero advantages and stays out of batch statistics.
"""

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from agent_tunix.rl import objectives

# name -> estimator class.
ESTIMATORS: dict[str, type] = {}


def register(name: str):
  """Class decorator: the estimator `grpo.advantage_estimator=name` picks."""

  def add(cls):
    if name in ESTIMATORS:
      raise ValueError(f'Advantage estimator {name!r} is registered twice.')
    cls.name = name
    ESTIMATORS[name] = cls
    return cls

  return add


def _live_rows(mask: jax.Array, num_generations: int) -> jax.Array:
  """[N] bool: the row's group has a completion token that counts."""
  tokens = mask.astype(jnp.float32).sum(axis=-1).reshape(-1, num_generations)
  live = tokens.sum(axis=-1, keepdims=True) > 0
  return jnp.broadcast_to(live, tokens.shape).reshape(-1)


@register('grpo')
@dataclasses.dataclass(frozen=True)
class GroupRelative:
  """GRPO's advantages: reward minus its group's mean, scaled.

  scale_rewards: 'group' (divide by the group's std), 'batch' (by the std
  of the live rows' rewards) or 'none' (Dr. GRPO: centred only);
  `objectives.group_advantages`.
  """

  name: ClassVar[str]
  needs_reference: ClassVar[bool] = False
  num_generations: int
  scale_rewards: str = 'group'

  def __call__(self, rewards, ref_logps, mask):
    del ref_logps  # Rewards only.
    live = _live_rows(mask, self.num_generations)
    batch_std = None
    if self.scale_rewards == 'batch':
      count = live.sum()
      mean = jnp.sum(jnp.where(live, rewards, 0.0)) / jnp.maximum(count, 1)
      spread = jnp.sum(jnp.where(live, (rewards - mean) ** 2, 0.0))
      batch_std = jnp.sqrt(spread / jnp.maximum(count - 1, 1))
    advantages = objectives.group_advantages(
        rewards, self.num_generations, self.scale_rewards, batch_std)
    return jnp.where(live, advantages, 0.0), {}


@register('rloo')
@dataclasses.dataclass(frozen=True)
class LeaveOneOut:
  """RLOO: reward minus the mean of the group's other G - 1 rewards.

  A_i = r_i - (sum_j r_j - r_i) / (G - 1) = G / (G - 1) (r_i - mean):
  the baseline of each completion does not depend on its own reward
  (Ahmadian et al. 2024, arXiv:2402.14740); unscaled.
  """

  name: ClassVar[str]
  needs_reference: ClassVar[bool] = False
  num_generations: int

  def __call__(self, rewards, ref_logps, mask):
    del ref_logps  # Rewards only.
    g = self.num_generations
    centred = objectives.group_advantages(rewards, g, 'none')
    live = _live_rows(mask, g)
    return jnp.where(live, centred * (g / (g - 1)), 0.0), {}


@register('maxent')
@dataclasses.dataclass(frozen=True)
class MaxEnt:
  """MaxEnt-GRPO: A = G w - 1 toward each group's target w
  (`objectives.maxent_advantages`); reads the reference log-probs.

  Adds the metric maxent/target_entropy: the entropy of each group's w,
  mean over groups.
  """

  name: ClassVar[str]
  needs_reference: ClassVar[bool] = True
  num_generations: int
  tau: float
  q_temperature: float = 1.0
  q_epsilon: float = 0.05
  length_normalize_ref: bool = True

  def __call__(self, rewards, ref_logps, mask):
    g = self.num_generations
    advantages = objectives.maxent_advantages(
        rewards, ref_logps, mask, g, self.tau, self.q_temperature,
        self.q_epsilon, self.length_normalize_ref)
    weights = (advantages + 1.0) / g
    entropy = -jnp.sum(weights * jnp.log(jnp.maximum(weights, 1e-30))) / (
        weights.shape[0] // g)
    return advantages, {'maxent/target_entropy': entropy}


def name_of(config: Any) -> str:
  """The estimator a config names: grpo.advantage_estimator, or 'maxent'
  when grpo.maxent_tau > 0 (the field that turns MaxEnt-GRPO on)."""
  g = config.grpo
  return 'maxent' if g.maxent_tau > 0 else g.advantage_estimator


def from_config(config: Any):
  """The estimator of a full agent_tunix config (fields: grpo.*)."""
  g = config.grpo
  name = name_of(config)
  if name == 'maxent':
    return MaxEnt(
        num_generations=int(g.num_generations), tau=float(g.maxent_tau),
        q_temperature=float(g.maxent_q_temperature),
        q_epsilon=float(g.maxent_q_epsilon),
        length_normalize_ref=bool(g.maxent_length_normalize_ref))
  if name == 'grpo':
    return GroupRelative(int(g.num_generations), g.scale_rewards)
  return ESTIMATORS[name](int(g.num_generations))


def estimate(estimator, rewards: jax.Array, ref_logps: jax.Array | None,
             completion_mask: jax.Array) -> tuple[jax.Array, dict]:
  """([N] float32 advantages, metrics): the one place they are computed.

  Args:
    estimator: a registered estimator (`from_config`).
    rewards: [N] total reward of each row.
    ref_logps: [N, C] reference log-probs; read only when
      estimator.needs_reference.
    completion_mask: [N, C].
  """
  if estimator.needs_reference and ref_logps is None:
    raise ValueError(
        f'The {estimator.name!r} advantages need the reference log-probs '
        '(batch.ref_logps); compute them with grpo.reference_logps.')
  advantages, metrics = estimator(
      jnp.asarray(rewards, jnp.float32), ref_logps, completion_mask)
  return jax.lax.stop_gradient(advantages.astype(jnp.float32)), metrics
