"""LoRA adapters (qwix) on the frozen Gemma backbone.

Only `nnx.LoRAParam` variables are trainable. qwix wraps the model's
`__call__`; the unwrapped class (`_unquantized_type`) runs the same module
tree without the adapters, which is how the reference policy is computed
without a second copy of the weights (`model_call(model, use_lora=False)`).

Gemma 4's mixture-of-experts layers get their own per-expert adapters
(`model.lora_experts`; `gemma4.ExactTopKMoE.add_lora`): qwix cannot trace
the experts' ragged dots. They read `adapters_on()` while the model is
traced, which `model_call` turns off together with qwix's.
"""

import contextlib
import contextvars

from flax import nnx
import jax
import qwix

_ADAPTERS_OFF = contextvars.ContextVar('agent_tunix_lora_off', default=False)


def adapters_on():
  """False while a `model_call(..., use_lora=False)` is being traced."""
  return not _ADAPTERS_OFF.get()


@contextlib.contextmanager
def _adapters_off():
  token = _ADAPTERS_OFF.set(True)
  try:
    yield
  finally:
    _ADAPTERS_OFF.reset(token)


def model_call(model, use_lora=True):
  """fn(module, *args, **kwargs): `model`'s forward with or without LoRA."""
  cls = type(model)
  if use_lora:
    return cls.__call__
  plain = getattr(cls, '_unquantized_type', cls).__call__

  def call(module, *args, **kwargs):
    with _adapters_off():
      return plain(module, *args, **kwargs)

  return call


def apply_lora(model, model_cfg, seed=0):
  """Adds LoRA (rank, alpha, module regex from `config.model`) to `model`.

  qwix gives each adapter the sharding of the weight it adapts, so a model
  loaded sharded gets sharded adapters.
  """
  if model_cfg.lora_rank <= 0:
    return model
  provider = qwix.LoraProvider(
      module_path=model_cfg.lora_module_path,
      rank=model_cfg.lora_rank,
      alpha=model_cfg.lora_alpha,
  )
  model = qwix.apply_lora_to_model(
      model, provider, **model.get_model_input(), rngs=nnx.Rngs(seed)
  )
  if model_cfg.get('lora_experts', False):
    add = getattr(model, 'add_expert_lora', None)
    if add is None or not add(model_cfg.lora_rank,
                              model_cfg.lora_alpha / model_cfg.lora_rank,
                              seed=seed + 1):
      raise ValueError(
          f'config.model.lora_experts=True, but {model_cfg.preset!r} has no '
          'mixture-of-experts layers. Set it only for a MoE preset (e.g. '
          'gemma4_26b_a4b).'
      )
  if not lora_state(model):
    raise ValueError(
        f'config.model.lora_module_path={model_cfg.lora_module_path!r} '
        'matched no module; nothing would train. Use a regex over paths like '
        "'layers/0/attn/q_einsum' (e.g. '.*q_einsum|.*gate_proj')."
    )
  return model


def lora_state(model):
  return nnx.state(model, nnx.LoRAParam)


def num_params(state):
  return sum(x.size for x in jax.tree.leaves(state))


def base_call(model, *args, **kwargs):
  """Calls `model` with its LoRA adapters switched off."""
  return model_call(model, use_lora=False)(model, *args, **kwargs)
