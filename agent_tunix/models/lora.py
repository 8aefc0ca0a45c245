"""LoRA adapters (qwix) on the frozen Gemma backbone.

Only `nnx.LoRAParam` variables are trainable. qwix wraps the model's
`__call__`; the unwrapped class (`_unquantized_type`) runs the same module
tree without the adapters, which is how the reference policy is computed
without a second copy of the weights.
"""

from flax import nnx
import jax
import qwix


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
  cls = getattr(type(model), '_unquantized_type', type(model))
  return cls.__call__(model, *args, **kwargs)
