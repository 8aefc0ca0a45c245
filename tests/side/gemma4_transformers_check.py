"""Side check, not run by CI: our Gemma 4 against transformers' Gemma 4.

Needs torch, which this project does not install (run it where torch is
importable, e.g. a CPU wheel unpacked into a directory on PYTHONPATH):

  PYTHONPATH=/path/to/torch:. python tests/side/gemma4_transformers_check.py

For the tiny dense and MoE configs with random LoRA adapters: our merged
export loaded by transformers (both with and without its KV cache), and a
transformers model with random weights saved by transformers and loaded by
agent_tunix; prints the largest logit difference of each direction.
"""
import os
import sys
import tempfile

os.environ['JAX_PLATFORMS'] = 'cpu'
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
import numpy as np, jax, jax.numpy as jnp
from flax import nnx
import torch, transformers
from agent_tunix import export, models
from agent_tunix.models import gemma, lora
from agent_tunix.rl import logprobs
from agent_tunix.tpu import sharding
from agent_tunix.configs import tiny_gemma4

def ours_logits(model, tokens):
  t = jnp.asarray(tokens); mask = jnp.ones(t.shape, bool)
  return np.asarray(model(t, None, None, logprobs.causal_attention_mask(mask))[0])

for preset in sys.argv[1:] or ['tiny_gemma4', 'tiny_gemma4_moe']:
  config = tiny_gemma4.get_config(f'model.preset={preset},model.lora_rank=3')
  mesh = sharding.make_mesh(config.mesh)
  model, tok = models.build(config, mesh)
  state = lora.lora_state(model)
  keys = iter(jax.random.split(jax.random.key(3), 1000))
  nnx.update(model, jax.tree.map(lambda x: 0.1 * jax.random.normal(next(keys), x.shape, x.dtype), state))
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 5000, (2, 20)); tokens[:, 0] = 2
  want = ours_logits(model, tokens)
  d = tempfile.mkdtemp()
  out = export.export(model, tok, config, 'merged', d + '/m')
  hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
  print(preset, type(hf).__name__)
  with torch.no_grad():
    got = hf(torch.tensor(tokens), use_cache=False).logits.numpy()
    got_cache = hf(torch.tensor(tokens), use_cache=True).logits.numpy()
  print(f'  ours -> HF: max|diff| {np.abs(got - want).max():.3g} (use_cache=False), '
        f'{np.abs(got_cache - want).max():.3g} (use_cache=True), max|logit| {np.abs(want).max():.3g}')
  # Reverse: HF's own random weights, saved by transformers, loaded by us.
  torch.manual_seed(0)
  hf2 = type(hf)(hf.config)
  with torch.no_grad():
    for p in hf2.parameters():
      p.normal_(0, 0.05) if p.ndim > 1 else p.uniform_(0.5, 1.5)
  d2 = d + '/hf'
  hf2.save_pretrained(d2, safe_serialization=True)
  with torch.no_grad():
    ref = hf2(torch.tensor(tokens), use_cache=False).logits.numpy()
  cfg = config.model.copy_and_resolve_references()
  cfg.source, cfg.path, cfg.lora_rank = 'hf', d2, 0
  ours = gemma.load_model(cfg, mesh)
  got2 = ours_logits(ours, tokens)
  print(f'  HF -> ours: max|diff| {np.abs(got2 - ref).max():.3g}, max|logit| {np.abs(ref).max():.3g}')
