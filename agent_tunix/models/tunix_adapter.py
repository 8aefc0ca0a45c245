"""The one door to tunix's private names, and the check of its version.

Tunix is used for its models, loaders and compiled KV-cache `Sampler`
(docs/architecture.md). A few things this project needs of them are private
in tunix 0.1.7: the sampler's jitted prefill and decode loop, its flattened
model state and graph definition and its sampling step (`rl.rollout`,
`rl.episodes`, `bench.decode_speed`), Gemma 4's expert dispatch and
collection (`models.gemma4`'s mixture of experts with LoRA) and the Hugging
Face key mapping of its safetensors loader. Every reach into them goes
through this module, so that a tunix release that moves one changes this
file only; importing it checks that the installed tunix is a tested one and
refuses another with one line that names it and the fix.
"""

import contextlib
import importlib.metadata
from typing import Any

import jax
from tunix.generate import sampler as sampler_lib
from tunix.models.gemma4 import moe as moe_lib
from tunix.utils import sharding_utils

# The distribution (the PyPI name `tunix` is an unrelated placeholder).
DISTRIBUTION = 'google-tunix'
# The releases whose private names this module was written and tested for.
TESTED_VERSIONS = ('0.1.7',)


class TunixVersionError(ImportError):
  """The installed tunix is not one of `TESTED_VERSIONS`."""


def check_version(installed: str | None = None) -> str:
  """The installed tunix version, or `TunixVersionError` if untested.

  Args:
    installed: the version to check; None reads the installed one.

  Returns:
    The version.

  Raises:
    TunixVersionError: a version other than `TESTED_VERSIONS`, or none.
  """
  if installed is None:
    try:
      installed = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
      installed = 'none'
  if installed not in TESTED_VERSIONS:
    raise TunixVersionError(
        f'agent_tunix needs {DISTRIBUTION} {" or ".join(TESTED_VERSIONS)} '
        f'(it uses private parts of its sampler and models), but '
        f'{DISTRIBUTION} {installed} is installed; fix: pip install '
        f'{DISTRIBUTION}=={TESTED_VERSIONS[-1]}')
  return installed


VERSION = check_version()

# pylint: disable=protected-access

# ------------------------------------------------- activation sharding


@contextlib.contextmanager
def activation_sharding(mesh):
  """tunix's activation sharding constraints, applied on `mesh` meanwhile.

  tunix's models constrain their activations (`sharding_utils.shard`: rows
  over 'fsdp', features over 'tp') only inside a legacy `with mesh:` block
  and never when the process's first device is a CPU, so a program traced
  without one (the trainer's, and every program the preflight compiles
  for a TPU from a CPU process) had none, and XLA laid the activations out
  after the weights: with FSDP, the model dimension split over the chips
  and every row of a micro-batch on every chip. While this is active the
  constraints apply on `mesh` whatever the process's devices; axes the
  mesh lacks are dropped. Programs traced meanwhile keep them.
  """
  original = sharding_utils.shard
  names = set(mesh.axis_names)
  _ACTIVE_MESHES.append(mesh)

  def shard(x, spec, eager=False):
    del eager  # Only traced values pass through here.
    spec = jax.sharding.PartitionSpec(
        *(axis if axis in names else None for axis in spec))
    return jax.lax.with_sharding_constraint(
        x, jax.sharding.NamedSharding(mesh, spec))

  sharding_utils.shard = shard
  try:
    yield
  finally:
    sharding_utils.shard = original
    _ACTIVE_MESHES.pop()


# The meshes of the `activation_sharding` blocks now open, innermost last.
_ACTIVE_MESHES = []


def active_mesh():
  """The mesh of the innermost open `activation_sharding`, or None: the
  mesh a program traced now runs on (the passes' own layout choices, such
  as `rl.logprobs`' vocabulary-parallel projection, read it)."""
  return _ACTIVE_MESHES[-1] if _ACTIVE_MESHES else None


# ------------------------------------------------------------ the sampler


def flattened_state(sampler: sampler_lib.Sampler) -> Any:
  """The sampler's model state, the jitted programs' first argument."""
  return sampler._flattened_transformer_state


def transformer_graphdef(sampler: sampler_lib.Sampler) -> Any:
  """The graph definition that merges with `flattened_state`."""
  return sampler._transformer_graphdef


def prefill_fn(sampler: sampler_lib.Sampler):
  """Jitted (params, state, logits_buffer, echo=) -> state after prefill."""
  return sampler._compiled_prefill_fn


def decode_loop(sampler: sampler_lib.Sampler):
  """The decode loop before jit: (params, state) -> final state."""
  return sampler._decode_fn


def decode_fn(sampler: sampler_lib.Sampler):
  """The jitted decode loop the sampler runs: (params, state) -> state."""
  return sampler._compiled_decode_fn


def set_decode_fn(sampler: sampler_lib.Sampler, fn) -> None:
  """Makes `fn` the jitted decode loop the sampler runs."""
  sampler._compiled_decode_fn = fn


def sample(sampler: sampler_lib.Sampler, **kwargs) -> Any:
  """One sampling step from logits (`Sampler._sample`): the next state."""
  return sampler._sample(**kwargs)


# ------------------------------------------------- Gemma 4's experts


def expert_dispatch(x, expert_choices, expert_weights):
  """(group sizes, tokens sorted by expert, reverse order, combine weights)
  of `MoERagged`'s routing."""
  return moe_lib._expert_dispatch(x, expert_choices, expert_weights)


def expert_collect(out, reverse, combine):
  """The experts' outputs back in token order, [B, L, k, D]."""
  return moe_lib._expert_collect(out, reverse, combine)


# -------------------------------------- Gemma 4's safetensors loader


def gemma4_key_mapping(cfg) -> Any:
  """tunix's Hugging Face -> tunix key mapping of a Gemma 4 config."""
  # Imported here: the loader module pulls in its checkpoint libraries.
  from tunix.models.gemma4 import params_safetensors  # pylint: disable=g-import-not-at-top
  return params_safetensors._get_key_and_transform_mapping(cfg)


def gemma4_preprocess_fn(cfg):
  """tunix's preprocessing of the mapped Gemma 4 tensors (a function of
  the flat {key: array} dict)."""
  from tunix.models.gemma4 import params_safetensors  # pylint: disable=g-import-not-at-top
  return params_safetensors._make_preprocess_fn(cfg)

# pylint: enable=protected-access
