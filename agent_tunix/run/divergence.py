"""Divergence: keeps diverged training states out of checkpoints.

An update can leave LoRA parameters that are still finite but so large that
the next forward pass overflows (a learning rate of 1e30 gives values near
3e29; the loss only turns NaN one step later). A checkpoint of such a state
poisons every resume. So before a step is saved, `check_state` requires

  * every LoRA and optimizer array to be finite, and
  * the policy's log-probs of the step's own batch, under the new
    parameters, to be finite (one forward pass per saved step, not per step).

A failed check raises `DivergenceError` and nothing is saved. Its message,
like that of a non-finite step scalar (`check_scalars`), names the step, the
last checkpoint on disk (where a rerun resumes) and a hint that fits the
config: a non-finite reward points at the reward functions, a diverged
update at the learning rate, warmup and clipping actually configured.
"""

import jax
import jax.numpy as jnp
import numpy as np

from agent_tunix.observe import metrics as metrics_lib
from agent_tunix.rl import grpo
from agent_tunix.run import checkpoint


class DivergenceError(FloatingPointError):
  """The training state or a step's scalars are no longer finite."""


def hint(config, names=()):
  """What to try, given the config and the names of the non-finite values."""
  names = list(names)
  if names and all(n.startswith('reward') for n in names):
    return ('a reward function returned NaN or inf; fix it (see '
            'config.rewards.functions) and rerun')
  opt = config.optimizer
  tips = [f'lower config.optimizer.learning_rate (now {opt.learning_rate:g}, '
          'e.g. by 10x)']
  if opt.max_grad_norm <= 0:
    tips.append('set config.optimizer.max_grad_norm > 0 (gradient clipping '
                'is off)')
  if opt.warmup_ratio <= 0:
    tips.append('set config.optimizer.warmup_ratio > 0 (no warmup now)')
  return ', or '.join(tips)


def last_good(ckpt):
  """Where a rerun would resume, in words."""
  step = ckpt.latest_step()
  if step is None:
    return ('no checkpoint was saved, so a rerun starts from scratch in '
            f'{ckpt.directory}')
  return (f'the last checkpoint is step {step} in {ckpt.directory}, where a '
          'rerun resumes')


def check_scalars(step, scalars, config, ckpt):
  """`metrics.check_finite`, raising `DivergenceError` with the run's context.

  Returns:
    {name: float} as `metrics.check_finite` does.
  """
  bad = [name for name, value in scalars.items()
         if not np.all(np.isfinite(np.asarray(jax.device_get(value),
                                              np.float64)))]
  try:
    return metrics_lib.check_finite(step, scalars, hint=hint(config, bad))
  except FloatingPointError as e:
    raise DivergenceError(
        f'{e} Nothing from step {step} on was saved; {last_good(ckpt)}.'
    ) from None


@jax.jit
def _all_finite(tree):
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def state_is_finite(tree):
  """True iff every floating-point array of a pytree is finite."""
  return bool(jax.device_get(_all_finite(tree)))


def check_state(step, model, optimizer, batch, hp, config, ckpt):
  """Raises `DivergenceError` unless the state after `step` is fit to save.

  Args:
    step: The step just completed.
    model: The policy (LoRA params after the step).
    optimizer: Its nnx.Optimizer.
    batch: The step's `grpo.UpdateBatch` (as given to grpo.train_step);
      None skips the forward check.
    hp: grpo.StepHParams of the run.
    config: The full config (for the hint).
    ckpt: The run's checkpoint.Checkpointer (for the last good step).
  """
  problem = None
  if not state_is_finite(checkpoint.lora_state(model)):
    problem = 'LoRA parameters are NaN or infinite'
  elif not state_is_finite(checkpoint.optimizer_state(optimizer)):
    problem = 'the optimizer state is NaN or infinite'
  elif batch is not None:
    logps = grpo.policy_logps(model, batch, hp)
    mask = batch.completion_mask > 0
    ok = jnp.all(jnp.where(mask, jnp.isfinite(logps), True))
    if not bool(np.asarray(jax.device_get(ok))):
      problem = ("the policy's log-probs of the step's batch are NaN or "
                 'infinite under the updated LoRA parameters (they blew up)')
  if problem is not None:
    raise DivergenceError(
        f'Training diverged at step {step}: {problem}. Step {step} was not '
        f'saved; {last_good(ckpt)}. To fix: {hint(config)}.'
    )
