"""An update batch's sequences on the mesh, with its log-prob passes
dispatched before the rewards are known.

Layer: rl; may import agent, data, models, rewards, tpu, storage and cli.

  staged = staging.stage(model, mesh, hparams, sequences, num_iterations)
  batch = grpo.UpdateBatch.of(staged.sequences, ref_logps=staged.ref_logps,
                              old_logps=staged.old_logps, ...)

The passes run on the batch's completion columns cut to the bucket of its
longest completion over all processes (`grpo.completion_bucket`): the
columns dropped are all masked out, so the update is the same at the cost
of the tokens that exist. JAX dispatches the passes asynchronously, so a
rollout that stages before scoring overlaps them with the reward functions
(a judge's requests above all).
"""

import dataclasses

import jax
import numpy as np

from agent_tunix.rl import grpo
from agent_tunix.tpu import sharding


@dataclasses.dataclass(frozen=True)
class StagedBatch:
  """A batch's sequences on the mesh, trimmed to the bucket of its longest
  completion, and the log-prob passes dispatched on them.

  Attributes:
    sequences: the trimmed `grpo.Sequences`, global arrays.
    ref_logps: the reference pass's log-probs, when the loss needs them.
    old_logps: the old policy's, when grpo.num_iterations > 1.
  """

  sequences: grpo.Sequences
  ref_logps: jax.Array | None = None
  old_logps: jax.Array | None = None


def stage(model, mesh, hparams, sequences, num_iterations):
  """The sequences trimmed and on the mesh, with the reference (and
  old-policy) log-prob passes dispatched.

  Args:
    model: the policy (LoRA off gives the reference).
    mesh: the run's mesh.
    hparams: the update's `grpo.StepHParams`.
    sequences: this process's rows, host `grpo.Sequences` (from a rollout,
      with sampler_logps).
    num_iterations: grpo.num_iterations; > 1 needs the old policy's pass.

  Returns:
    `StagedBatch`.
  """
  # Completion columns up to each row's last real token (with tools, the
  # inserts between turns are read though not trained on).
  width = sequences.completion_mask.shape[1]
  attended = sequences.input_mask[:, -width:]
  lengths = np.where(attended.any(axis=1),
                     width - np.argmax(attended[:, ::-1], axis=1), 0)
  longest = int(sharding.allgather_concat(
      np.array([lengths.max(initial=0)])).max())
  bucket = grpo.completion_bucket(longest, width)
  on_mesh = sharding.shard_batch(grpo.trim_completions(sequences, bucket),
                                 mesh)
  ref_logps = old_logps = None
  if hparams.needs_reference:
    ref_logps = grpo.reference_logps(model, on_mesh, hparams)
  if num_iterations > 1:
    old_logps = grpo.policy_logps(model, on_mesh, hparams)
  return StagedBatch(on_mesh, ref_logps=ref_logps, old_logps=old_logps)
