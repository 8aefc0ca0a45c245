"""Side check, not run by CI: our Gemma 4 GGUF export loaded by llama.cpp.

Needs a llama.cpp build with its shared library (libllama) and headers; no
llama.cpp is installed by this project. Build one, e.g. from the source
vendored in the llama-cpp-python sdist:

  cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=ON
  cmake --build build --target llama
  LLAMA_CPP=/path/to/llama.cpp python tests/side/gemma4_llamacpp_check.py

For the tiny dense and MoE configs with random LoRA adapters: exports the
merged model as a 'gemma4' GGUF (f32), compiles tests/side/llamacpp_logps.cpp
against libllama, and prints the largest difference between llama.cpp's
and our log-probs of a 14-token sequence, next to how much the LoRA itself
moves them (the scale a layout mistake would show at).
"""
import os
import subprocess
import sys
import tempfile

os.environ['JAX_PLATFORMS'] = 'cpu'
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))
import numpy as np, jax, jax.numpy as jnp
from flax import nnx
from agent_tunix import export, models
from agent_tunix.models import lora
from agent_tunix.rl import logprobs
from agent_tunix.tpu import sharding
from agent_tunix.configs import tiny_gemma4

root = os.environ['LLAMA_CPP']
work = tempfile.mkdtemp()
binary = os.path.join(work, 'llamacpp_logps')
subprocess.run(
    ['g++', '-O1', '-std=c++17', os.path.join(_HERE, 'llamacpp_logps.cpp'),
     f'-I{root}/include', f'-I{root}/ggml/include', f'-L{root}/build/bin',
     '-lllama', '-lggml', '-lggml-base', f'-Wl,-rpath,{root}/build/bin',
     '-o', binary], check=True)

for preset in sys.argv[1:] or ['tiny_gemma4', 'tiny_gemma4_moe']:
  config = tiny_gemma4.get_config(f'model.preset={preset},model.lora_rank=3')
  model, tok = models.build(config, sharding.make_mesh(config.mesh))
  keys = iter(jax.random.split(jax.random.key(3), 1000))
  nnx.update(model, jax.tree.map(
      lambda x: 0.1 * jax.random.normal(next(keys), x.shape, x.dtype),
      lora.lora_state(model)))
  path = export.export(model, tok, config, 'gguf',
                       os.path.join(work, f'{preset}.gguf'))
  ids = [tok.bos_id()] + np.random.default_rng(0).integers(3, 5000, 13).tolist()
  tokens = jnp.asarray([ids], jnp.int32)
  mask = jnp.ones(tokens.shape, bool)

  def logps(use_lora=True):
    return np.asarray(logprobs.per_token_logps(
        model, tokens, mask, len(ids) - 1, 4, use_lora=use_lora)[0])[0]

  ours = logps()
  out = subprocess.run([binary, path] + [str(i) for i in ids],
                       capture_output=True, text=True, check=True)
  theirs = np.array([float(line.split()[1])
                     for line in out.stdout.strip().splitlines()])
  print(f'{preset}: largest |llama.cpp - ours| log-prob '
        f'{np.abs(theirs - ours).max():.2e}; LoRA on vs off moves them by '
        f'up to {np.abs(ours - logps(False)).max():.2f}')
