"""The optimizer: AdamW with warmup and cosine decay, optional clipping."""

from typing import Any

import optax


def make_optimizer(
    learning_rate: float,
    warmup_ratio: float,
    num_steps: int,
    b1: float = 0.9,
    b2: float = 0.99,
    weight_decay: float = 0.1,
    max_grad_norm: float = 0.0,
    start: int = 0,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """AdamW with linear warmup then cosine decay to 0, optional norm clipping.

  Args:
    learning_rate: peak learning rate.
    warmup_ratio: fraction of num_steps spent warming up linearly from 0.
    num_steps: optimizer steps the warmup + decay spans (the schedule
      reaches 0 there).
    b1: AdamW beta1.
    b2: AdamW beta2.
    weight_decay: decoupled weight decay.
    max_grad_norm: clip the global gradient norm to this; 0 = no clipping.
    start: the optimizer step where the warmup begins (a schedule started
      again on a resume); before it the rate is 0.

  Returns:
    (optax transformation, learning-rate schedule).
  """
  if num_steps < 1:
    raise ValueError(f'num_steps must be >= 1, got {num_steps}.')
  if not 0.0 <= warmup_ratio < 1.0:
    raise ValueError(f'warmup_ratio must be in [0, 1), got {warmup_ratio}.')
  if max_grad_norm < 0:
    raise ValueError(
        f'max_grad_norm must be >= 0 (0 = off), got {max_grad_norm}.'
    )
  if start < 0:
    raise ValueError(f'start must be >= 0, got {start}.')
  warmup_steps = int(warmup_ratio * num_steps)
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=learning_rate,
      warmup_steps=warmup_steps,
      decay_steps=num_steps,
      end_value=0.0,
  )
  if start:
    schedule = optax.join_schedules(
        [optax.constant_schedule(0.0), schedule], boundaries=[start])
  adamw = optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay)
  if max_grad_norm > 0:
    clip = optax.clip_by_global_norm(max_grad_norm)
    return optax.chain(clip, adamw), schedule
  return adamw, schedule


def optimizer_from_config(config: Any, span: tuple[int, int] | None = None):
  """`make_optimizer` for a run: (optax transformation, schedule).

  The optimizer steps grpo.num_iterations (mu) times per training step, so
  by default the schedule spans training.num_steps * mu optimizer updates
  from the first.

  Args:
    config: the full config (optimizer, training, grpo sections).
    span: (start, length) in optimizer updates: where the warmup begins and
      how many updates the warmup + decay spans (agent_tunix/run/schedule.py
      keeps a run's span across resumes); None: (0, num_steps * mu).
  """
  opt = config.optimizer
  start, length = span or (
      0, config.training.num_steps * config.grpo.num_iterations)
  return make_optimizer(
      learning_rate=opt.learning_rate,
      warmup_ratio=opt.warmup_ratio,
      num_steps=length,
      b1=opt.b1,
      b2=opt.b2,
      weight_decay=opt.weight_decay,
      max_grad_norm=opt.max_grad_norm,
      start=start,
  )
