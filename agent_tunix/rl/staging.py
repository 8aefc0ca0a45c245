"""An update batch's sequences on the mesh, with its log-prob passes
dispatched before the rewards are known.

Layer: rl; may import agent, data, models, rewards, tpu, storage and cli.

  staged = staging.stage(model, mesh, hparams, sequences, num_iterations)
  batch = grpo.UpdateBatch.of(staged.sequences, ref_logps=staged.ref_logps,
                              old_logps=staged.old_logps, ...)

The passes run on the batch's completion columns cut to the bucket of its
longest completion over all processes (`grpo.completion_bucket`): the
columns dropped are all masked out, so the update is the same at the cost
of the tokens that exist. With `pack`, the passes run on packed rows
(`packing`: each prompt group's real tokens in one row) at the batch's
packed shape. JAX dispatches the passes asynchronously, so a
rollout that stages before scoring overlaps them with the reward functions
(a judge's requests above all).
"""

import dataclasses

import jax
import numpy as np

from agent_tunix.rl import grpo
from agent_tunix.rl import packing
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


def stage(model, mesh, hparams, sequences, num_iterations, pack=False):
  """The sequences trimmed and on the mesh, with the reference (and
  old-policy) log-prob passes dispatched.

  Args:
    model: the policy (LoRA off gives the reference).
    mesh: the run's mesh.
    hparams: the update's `grpo.StepHParams`.
    sequences: this process's rows, host `grpo.Sequences` (from a rollout,
      with sampler_logps).
    num_iterations: grpo.num_iterations; > 1 needs the old policy's pass.
    pack: run the passes and the update on packed rows (grpo.pack_sequences)
      where the model supports them (`packing.supported`) and a
      micro-batch's packed rows (one a prompt group) split evenly over the
      mesh's batch axes; padded rows otherwise.

  Returns:
    `StagedBatch`.
  """
  on_mesh = sharding.shard_batch(
      prepare(model, mesh, hparams, sequences, pack), mesh)
  ref_logps = old_logps = None
  if hparams.needs_reference:
    ref_logps = grpo.reference_logps(model, on_mesh, hparams)
  if num_iterations > 1:
    old_logps = grpo.policy_logps(model, on_mesh, hparams)
  return StagedBatch(on_mesh, ref_logps=ref_logps, old_logps=old_logps)


def prepare(model, mesh, hparams, sequences, pack):
  """This process's host rows trimmed to the bucket of the longest
  completion over all processes, with their `packing.Packing` when `pack`
  and `_packable` allow it. `sequences`: `grpo.Sequences` or
  `grpo.UpdateBatch`."""
  # Completion columns up to each row's last real token (with tools, the
  # inserts between turns are read though not trained on).
  width = sequences.completion_mask.shape[1]
  attended = sequences.input_mask[:, -width:]
  lengths = np.where(attended.any(axis=1),
                     width - np.argmax(attended[:, ::-1], axis=1), 0)
  longest = int(sharding.allgather_concat(
      np.array([lengths.max(initial=0)])).max())
  trimmed = grpo.trim_completions(
      sequences, grpo.completion_bucket(longest, width))
  if not (pack and _packable(model, mesh, hparams, len(sequences.tokens))):
    return trimmed
  return trimmed.replace(packing=packing.for_batch(
      trimmed.input_mask, trimmed.completion_mask, hparams.prompt_group,
      reduce_max=lambda x: sharding.allgather_concat(x[None]).max(axis=0)))


def _packable(model, mesh, hparams, local_rows):
  """Whether the batch may run packed: a Gemma 3, and packed rows (one per
  prompt group of a micro-batch) that the mesh's batch axes divide."""
  rows = local_rows * jax.process_count()
  groups = (hparams.micro_batch_size or rows) // hparams.prompt_group
  return (packing.supported(model)
          and groups % sharding.batch_parallelism(mesh) == 0)
