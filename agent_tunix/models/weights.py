"""Weights on the mesh, for every family: the abstract model, placement
shard by shard, and the shape check of a loaded model.

Each function takes the family's NNX model class (`families.Family.
model_class`) with its tunix ModelConfig, so the family modules (gemma3,
gemma4) can place what their loaders read without importing `gemma`.
"""

import contextlib

from flax import nnx
import jax
from jax._src.interpreters import partial_eval  # pylint: disable=g-direct-jax-import
import numpy as np


def flat_state(tree):
  """{dotted path: Variable} for the Params of a module or a State."""
  state = tree if isinstance(tree, nnx.State) else nnx.state(tree, nnx.Param)
  return {
      '.'.join(str(k) for k in path): var
      for path, var in nnx.to_flat_state(state)
  }


@contextlib.contextmanager
def cheap_tracer_attribute_errors():
  """Tracers raise AttributeError without searching where they came from.

  flax probes `getattr(x, 'sharding', None)` on every Variable it creates,
  and qwix on every weight while LoRA is applied; on a tracer that raises
  an AttributeError whose message JAX builds by searching the whole traced
  program for the value's origin. Tracing the model abstractly makes that
  quadratic in its size (the bare Gemma 3 27B: 9.0 s, 0.9 s without; with
  LoRA, the 4B took 73 s, 66 of them here). Only the message is dropped;
  the error is the same. Private JAX API: skipped if it is not there.
  """
  tracer = getattr(partial_eval, 'DynamicJaxprTracer', None)
  original = tracer and tracer.__dict__.get('_origin_msg')
  if original is None:
    yield
    return
  tracer._origin_msg = lambda self: ''  # pylint: disable=protected-access
  try:
    yield
  finally:
    tracer._origin_msg = original  # pylint: disable=protected-access


def abstract_model(model_class, cfg):
  """The model's module tree with shapes only (`nnx.eval_shape`)."""
  with cheap_tracer_attribute_errors():
    return nnx.eval_shape(lambda: model_class(cfg, rngs=nnx.Rngs(0)))


def place_params(model_class, cfg, flat, mesh, source_name):
  """Creates the model with `flat` {dotted path: array} sharded on `mesh`.

  Every parameter of the architecture must be present with the preset's
  shape; otherwise nothing is loaded and a ValueError names the source, the
  parameter, the expected and the found shape.
  """
  model = abstract_model(model_class, cfg)
  abstract = flat_state(model)
  missing = sorted(set(abstract) - set(flat))
  extra = sorted(set(flat) - set(abstract))
  if missing or extra:
    raise ValueError(
        f'{source_name}: parameters do not match the preset. Missing: '
        f'{missing[:5]}{"..." if len(missing) > 5 else ""}; unexpected: '
        f'{extra[:5]}{"..." if len(extra) > 5 else ""}.'
    )
  for name, var in abstract.items():
    want = tuple(var.value.shape)
    found = tuple(np.shape(flat[name]))
    if want != found:
      raise ValueError(
          f'{source_name}: parameter {name!r} has shape {found}, the preset '
          f'expects {want}. Pick the config.model.preset matching the '
          'checkpoint.'
      )
  flat_shardings = flat_state(
      nnx.get_named_sharding(nnx.state(model, nnx.Param), mesh)
  )
  dtype = cfg.param_dtype
  for name, var in abstract.items():
    host = np.asarray(flat[name])
    var.set_value(jax.make_array_from_callback(
        host.shape,
        flat_shardings[name].value,
        lambda idx, host=host: host[idx].astype(dtype),
    ))
  return model


def check_shapes(model, model_class, cfg, source_name):
  """Raises ValueError if a loaded parameter is missing or misshapen."""
  expected = flat_state(abstract_model(model_class, cfg))
  for name, var in flat_state(model).items():
    if not isinstance(var.value, jax.Array):
      # tunix's safetensors loader skips names it does not know, which
      # leaves their parameters unloaded.
      raise ValueError(
          f'{source_name}: no tensor was loaded for parameter {name!r}; '
          'the checkpoint does not hold it under a name the loader knows.'
      )
    want = tuple(expected[name].value.shape)
    if tuple(var.value.shape) != want:
      raise ValueError(
          f'{source_name}: parameter {name!r} has shape '
          f'{tuple(var.value.shape)}, the preset expects {want}.'
      )
