"""Test helpers for the GRPO update.

`compute_grads` is the update's gradient program without the optimizer step
(the tests compare its gradients with formulas); `hparams` builds
`grpo.StepHParams` from the flat grpo.* field names a config has.
"""

import functools

from flax import nnx

from agent_tunix.rl import advantages
from agent_tunix.rl import grpo
from agent_tunix.rl import losses

# The StepHParams fields outside the objective.
_PASS_FIELDS = ('chunk_size', 'micro_batch_size', 'remat', 'prompt_group',
                'temperature')


@functools.partial(nnx.jit, static_argnames=('hp',))
def compute_grads(model, batch, hp):
  """(LoRA grads State, metrics) of the full-batch loss; no update."""
  return grpo.update_grads(model, batch, hp)


def hparams(*, beta=0.04, kl_estimator='k3', epsilon=0.2, epsilon_high=-1.0,
            importance_sampling_level='token', tis_cap=0.0,
            entropy_coeff=0.0, loss_agg_mode='token-mean', completion_norm=0,
            num_generations=2, maxent_tau=0.0, maxent_q_temperature=1.0,
            maxent_q_epsilon=0.05, maxent_length_normalize_ref=True,
            **passes):
  """StepHParams of these grpo.* values (StepHParams' own fields in
  `passes`); MaxEnt-GRPO's estimator when maxent_tau > 0, else none (the
  batch brings its advantages)."""
  assert set(passes) <= set(_PASS_FIELDS), passes
  terms = ()
  if beta > 0:
    terms += (losses.KLPenalty(beta, kl_estimator),)
  if entropy_coeff:
    terms += (losses.EntropyBonus(entropy_coeff),)
  estimator = None
  if maxent_tau > 0:
    estimator = advantages.MaxEnt(
        num_generations, maxent_tau, maxent_q_temperature, maxent_q_epsilon,
        maxent_length_normalize_ref)
  objective = losses.Objective(
      policy_loss=losses.POLICY_LOSSES[importance_sampling_level](
          epsilon, epsilon_high),
      correction=losses.TruncatedIS(tis_cap) if tis_cap > 0 else None,
      terms=terms,
      aggregation=losses.Aggregation(loss_agg_mode, completion_norm),
      advantages=estimator,
  )
  return grpo.StepHParams(objective=objective, **passes)
