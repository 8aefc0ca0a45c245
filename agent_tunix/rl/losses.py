"""The update's objective as named parts: policy loss, correction, terms.

A per-token loss is a registered policy loss (the clipped surrogate, per
token for PPO/GRPO/DAPO or per sequence for GSPO), optionally weighted by
a correction (truncated importance sampling), plus additive terms (KL to
the reference, entropy bonus), then reduced by an `Aggregation` (token
mean for DAPO, sequence means for GRPO and Dr. GRPO). Each part is a small
frozen dataclass with its own fields; an `Objective` holds the parts a
config names (`from_config`), and the gradient function calls
`Objective.per_token_loss` without knowing which parts there are.

Pure array math over `objectives`; nothing here runs a model.
"""

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from agent_tunix.rl import advantages as advantages_lib
from agent_tunix.rl import objectives

# grpo.importance_sampling_level -> policy-loss class.
POLICY_LOSSES: dict[str, type] = {}


def register_policy_loss(name: str):
  """Class decorator: the policy loss importance_sampling_level=name picks."""

  def add(cls):
    if name in POLICY_LOSSES:
      raise ValueError(f'Policy loss {name!r} is registered twice.')
    POLICY_LOSSES[name] = cls
    return cls

  return add


@dataclasses.dataclass(frozen=True)
class TokenInputs:
  """What a part of the objective reads of one micro-batch.

  Attributes:
    logps: [B, C] the policy's log-probs (with their gradient).
    old_logps: [B, C] those of the policy that sampled (this pass's own,
      without gradient, when the batch has none).
    entropy: [B, C] the policy's per-token entropy (with its gradient).
    mask: [B, C] float32 completion mask.
    batch: the micro-batch (`grpo.UpdateBatch`): advantages, ref_logps,
      sampler_logps, kl_coeff.
  """

  logps: jax.Array
  old_logps: jax.Array
  entropy: jax.Array
  mask: jax.Array
  batch: Any


@register_policy_loss('token')
@dataclasses.dataclass(frozen=True)
class TokenClip:
  """PPO/GRPO's clipped surrogate, one ratio per token
  (`objectives.clipped_surrogate`); epsilon_high > epsilon is DAPO's
  clip-higher.

  Attributes:
    epsilon: lower clip range (and upper unless epsilon_high > 0); > 0.
    epsilon_high: upper clip range; negative means epsilon.
  """

  epsilon: float = 0.2
  epsilon_high: float = -1.0

  def __post_init__(self):
    assert self.epsilon > 0 and self.epsilon_high != 0, self

  @property
  def upper_epsilon(self) -> float:
    return self.epsilon if self.epsilon_high < 0 else self.epsilon_high

  def __call__(self, x: TokenInputs):
    """(loss [B, C], clipped [B, C] bool)."""
    return objectives.clipped_surrogate(
        x.logps, x.old_logps, x.batch.advantages, self.epsilon,
        self.upper_epsilon)


@register_policy_loss('sequence')
@dataclasses.dataclass(frozen=True)
class SequenceClip(TokenClip):
  """GSPO: one length-normalised ratio per sequence, clipped
  (`objectives.sequence_clipped_surrogate`); clip ranges ~3e-4."""

  def __call__(self, x: TokenInputs):
    return objectives.sequence_clipped_surrogate(
        x.logps, x.old_logps, x.batch.advantages, x.mask, self.epsilon,
        self.upper_epsilon)


@dataclasses.dataclass(frozen=True)
class TruncatedIS:
  """A correction of the policy loss for a sampler whose numerics differ
  from the trainer's: each token's term times
  w = stop_gradient(min(exp(old_logp - sampler_logp), cap))
  (`objectives.tis_weights`); needs batch.sampler_logps.
  """

  cap: float

  def __post_init__(self):
    assert self.cap > 0, self

  def __call__(self, per_token, x: TokenInputs):
    if x.batch.sampler_logps is None:
      raise ValueError(
          f'tis_cap={self.cap} needs batch.sampler_logps (the sampler\'s '
          'log-probs of the completion tokens); pass them or set tis_cap=0.')
    return per_token * objectives.tis_weights(
        x.old_logps, x.batch.sampler_logps, self.cap)


@dataclasses.dataclass(frozen=True)
class KLPenalty:
  """+ beta * KL(policy || reference) per token
  (`objectives.kl_divergence`); beta is each row's batch.kl_coeff when the
  batch has one (the adaptive controller's), else this one. Metric 'kl'.
  """

  metric: ClassVar[str] = 'kl'
  needs_reference: ClassVar[bool] = True
  beta: float
  estimator: str = 'k3'

  def __post_init__(self):
    assert self.beta > 0 and self.estimator in objectives.KL_ESTIMATORS, self

  def __call__(self, per_token, x: TokenInputs):
    if x.batch.ref_logps is None:
      raise ValueError(
          f'beta={self.beta} needs batch.ref_logps; compute them with '
          'grpo.reference_logps or set beta=0.')
    kl = objectives.kl_divergence(x.logps, x.batch.ref_logps, self.estimator)
    coeff = (self.beta if x.batch.kl_coeff is None
             else x.batch.kl_coeff[:, None])
    return per_token + coeff * kl, (jax.lax.stop_gradient(kl) * x.mask).sum()

  def final_metrics(self, metrics):
    del metrics
    return {}


@dataclasses.dataclass(frozen=True)
class EntropyBonus:
  """- coeff * H per token (`objectives.entropy_bonus`). Metric
  'entropy_bonus': what it takes off the loss per completion token."""

  metric: ClassVar[None] = None
  needs_reference: ClassVar[bool] = False
  coeff: float

  def __post_init__(self):
    assert self.coeff > 0, self

  def __call__(self, per_token, x: TokenInputs):
    return objectives.entropy_bonus(per_token, x.entropy, self.coeff), None

  def final_metrics(self, metrics):
    return {'entropy_bonus': self.coeff * metrics['entropy']}


@dataclasses.dataclass(frozen=True)
class Aggregation:
  """How a [B, C] per-token loss becomes a scalar (`objectives.aggregate_loss`).

  Attributes:
    mode: one of objectives.LOSS_AGG_MODES.
    completion_norm: the tokens per sequence 'sequence-mean-token-sum-norm'
      (Dr. GRPO) divides by; 0 = the batch's completion length. The train
      loop sets generation.max_generation_steps, so trimming a batch to a
      shorter bucket leaves the loss unchanged.
  """

  mode: str = 'token-mean'
  completion_norm: int = 0

  def __post_init__(self):
    assert self.mode in objectives.LOSS_AGG_MODES, self

  def count(self, mask):
    """What the mode averages over (tokens or non-empty sequences)."""
    return objectives.agg_count(mask, self.mode)

  def __call__(self, per_token, mask):
    return objectives.aggregate_loss(per_token, mask, self.mode,
                                     max_len=self.completion_norm or None)


@dataclasses.dataclass(frozen=True)
class Objective:
  """The parts of the update's loss (hashable: static under jit).

  Attributes:
    policy_loss: a `POLICY_LOSSES` entry.
    correction: `TruncatedIS`, or None.
    terms: additive terms (`KLPenalty`, `EntropyBonus`), applied in order.
    aggregation: the `Aggregation`.
    advantages: the estimator of advantages the batch does not bring
      (`advantages.from_config`); None: every batch brings its own.
  """

  policy_loss: Any = TokenClip()
  correction: TruncatedIS | None = None
  terms: tuple[Any, ...] = (KLPenalty(0.04),)
  aggregation: Aggregation = Aggregation()
  advantages: Any = None

  @property
  def needs_reference(self) -> bool:
    """Whether the update reads batch.ref_logps (KL, MaxEnt)."""
    return (any(t.needs_reference for t in self.terms) or
            getattr(self.advantages, 'needs_reference', False))

  @property
  def kl_coeff(self) -> float:
    """The KL term's (starting) coefficient; 0 without one."""
    return next((t.beta for t in self.terms if isinstance(t, KLPenalty)), 0.0)

  def sum_names(self) -> tuple[str, ...]:
    """The names of the per-token sums `per_token_loss` returns."""
    return ('clip_ratio', 'entropy') + tuple(
        t.metric for t in self.terms if t.metric)

  def per_token_loss(self, x: TokenInputs):
    """([B, C] loss, {name: masked sum over the micro-batch's tokens})."""
    per_token, is_clipped = self.policy_loss(x)
    if self.correction is not None:
      per_token = self.correction(per_token, x)
    sums = {
        'clip_ratio': (is_clipped * x.mask).sum(),
        'entropy': (jax.lax.stop_gradient(x.entropy) * x.mask).sum(),
    }
    for term in self.terms:
      per_token, total = term(per_token, x)
      if term.metric:
        sums[term.metric] = total
    return per_token, sums

  def final_metrics(self, metrics: dict) -> dict:
    """Metrics the terms derive from the batch's means."""
    extra = {}
    for term in self.terms:
      extra.update(term.final_metrics(metrics))
    return extra


def from_config(config: Any, kl_coeff: float) -> Objective:
  """The objective of a full agent_tunix config (fields: grpo.*).

  Args:
    config: the ml_collections config.
    kl_coeff: the KL coefficient of step 1 (`grpo.initial_kl_coeff`);
      0 = no KL term.
  """
  g = config.grpo
  terms = []
  if kl_coeff > 0:
    terms.append(KLPenalty(float(kl_coeff), g.kl_estimator))
  if g.entropy_coeff:
    terms.append(EntropyBonus(float(g.entropy_coeff)))
  return Objective(
      policy_loss=POLICY_LOSSES[g.importance_sampling_level](
          float(g.epsilon), float(g.epsilon_high)),
      correction=TruncatedIS(float(g.tis_cap)) if g.tis_cap > 0 else None,
      terms=tuple(terms),
      aggregation=Aggregation(
          g.loss_agg_mode, int(config.generation.max_generation_steps)),
      advantages=advantages_lib.from_config(config),
  )
