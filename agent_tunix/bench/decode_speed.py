"""Section decode: decode tokens/s against bandwidth and roofline bounds."""

import gc

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agent_tunix.bench import context
from agent_tunix.bench import options
from agent_tunix.bench import records
from agent_tunix.models import decode
from agent_tunix.models import tunix_adapter
from agent_tunix.rl import rollout

# Bytes of the array copied to measure memory bandwidth.
_COPY_BYTES = {'cpu': 256 << 20}
_COPY_BYTES_ACCELERATOR = 1 << 30


def tree_bytes(tree):
  """Bytes of the arrays in `tree`."""
  return int(sum(x.nbytes for x in jax.tree.leaves(tree)
                 if hasattr(x, 'nbytes')))


def memory_bandwidth(kind='copy'):
  """(bytes/s, details) of one pass over a large float32 array.

  kind='copy': (read + written bytes) / time of x <- x + 1, in place (the
  jitted pass donates x, so no output buffer is allocated and page-faulted
  in the timed pass: an out-of-place jitted copy times the page faults of a
  fresh 256 MB buffer, measured 2-6 GB/s on a 2-core CPU where the
  in-place pass runs at 47-64 GB/s); on CPU also np.copyto between two
  allocated arrays (one thread). kind='read': bytes read / time of sum(x),
  what a decode step mostly does. Each is the larger of the jitted JAX pass
  and, on CPU, the NumPy one.
  """
  backend = jax.default_backend()
  nbytes = _COPY_BYTES.get(backend, _COPY_BYTES_ACCELERATOR)
  n = nbytes // 4
  repeats = max(3, options.STEPS.value)
  x = [jnp.ones((n,), jnp.float32)]
  src = np.ones((n,), np.float32) if backend == 'cpu' else None
  if kind == 'copy':
    traffic = 2 * nbytes
    update = jax.jit(lambda a: a + 1.0, donate_argnums=0)

    def jax_pass():
      x[0] = update(x[0])
      jax.block_until_ready(x[0])
    dst = np.empty_like(src) if backend == 'cpu' else None
    np_pass = lambda: np.copyto(dst, src)  # pylint: disable=unnecessary-lambda-assignment
  elif kind == 'read':
    traffic = nbytes
    total = jax.jit(jnp.sum)
    jax_pass = lambda: jax.block_until_ready(total(x[0]))  # pylint: disable=unnecessary-lambda-assignment
    np_pass = lambda: np.sum(src)  # pylint: disable=unnecessary-lambda-assignment
  else:
    raise ValueError(f'kind={kind!r}: expected copy or read.')

  def rate(one_pass):
    one_pass()  # Compiles; touches every page.
    times = []
    for _ in range(repeats):
      t0 = records.now()
      one_pass()
      times.append(records.now() - t0)
    return traffic / records.median(times)

  best = rate(jax_pass)
  details = {'kind': kind, 'array_bytes': nbytes, 'jax_bytes_per_s': best}
  x.clear()
  if backend == 'cpu':
    np_bw = rate(np_pass)
    details['numpy_bytes_per_s'] = np_bw
    best = max(best, np_bw)
  details['used_bytes_per_s'] = best
  return best, details


def matmul_flops_per_s(dtype):
  """(FLOP/s, details) of a large jitted square matmul in `dtype`."""
  n = 2048 if jax.default_backend() == 'cpu' else 8192
  a = jnp.ones((n, n), dtype)
  matmul = jax.jit(
      lambda x: jnp.matmul(x, x, preferred_element_type=jnp.float32)
  )
  jax.block_until_ready(matmul(a))
  times = []
  for _ in range(max(3, options.STEPS.value)):
    t0 = records.now()
    jax.block_until_ready(matmul(a))
    times.append(records.now() - t0)
  rate = 2 * n**3 / records.median(times)
  return rate, {'matmul_size': n, 'dtype': jnp.dtype(dtype).name,
                'flops_per_s': rate}


def decode_flops_per_step(model, batch_size, kv_len):
  """Matmul FLOPs of one decode step: weights (the tied embedding once, as
  the output projection) plus attention over the whole KV cache."""
  cfg = model.config
  matrix_params = sum(
      x.size for x in jax.tree.leaves(nnx.state(model)) if x.ndim >= 2
  )
  attention = 2 * 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * kv_len
  return 2 * batch_size * matrix_params + batch_size * attention


def timed_sample(sampler, prompt_tokens, steps, seed, gen):
  """Prefill + decode like Rollout.generate, timed separately.

  Returns:
    (prefill seconds, decode seconds, decode steps run, KV cache bytes).
  """
  inner = sampler.sampler
  sampling = rollout.sampling_args(gen.temperature, gen.top_k, gen.top_p)
  total = prompt_tokens.shape[1] + steps
  if hasattr(sampler, 'init_state'):  # Places the state on the mesh.
    state = sampler.init_state(prompt_tokens, total, seed, **sampling)
  else:
    state = inner.init_sample_state(
        jnp.asarray(prompt_tokens), total_sampling_steps=total,
        include_logits=False, forbidden_token_ids=None,
        seed=jax.random.PRNGKey(seed), beam_size=None, **sampling,
    )
  params = tunix_adapter.flattened_state(inner)
  t0 = records.now()
  state = tunix_adapter.prefill_fn(inner)(params, state, None, echo=False)
  jax.block_until_ready(state.token_buffer)
  t1 = records.now()
  start = int(state.decoding_step)
  state = tunix_adapter.decode_fn(inner)(params, state)
  jax.block_until_ready(state.token_buffer)
  t2 = records.now()
  kv_bytes = int(sum(x.nbytes for x in jax.tree.leaves(state.cache)
                     if getattr(x, 'ndim', 0) >= 3))
  return t1 - t0, t2 - t1, int(state.decoding_step) - start, kv_bytes


def decode_measurements(ctx, batch_sizes):
  """One measurement per batch size: decode tokens/s vs bandwidth bound."""
  config = ctx.config
  gen = config.generation
  model = ctx.session.model
  weight_bytes = tree_bytes(nnx.state(model))
  bandwidth, bw_details = memory_bandwidth('copy')
  read_bw, read_details = memory_bandwidth('read')
  flops_rate, flops_details = matmul_flops_per_s(
      model.embedder.input_embedding[...].dtype
  )
  prompt_len = options.DECODE_PROMPT_LENGTH.value
  steps = gen.max_generation_steps
  sampler = rollout.Rollout(
      model, ctx.tokenizer, prompt_len + steps,
      cpu_decode_graph=config.generation.cpu_decode_graph,
  )
  context.disable_end_tokens(sampler)
  results = []
  for b in batch_sizes:
    _, tokens, _ = context.make_prompts(ctx.tokenizer, b, prompt_len)
    timed_sample(sampler, tokens, steps, 0, gen)  # Warm-up: compiles.
    prefill, decode_s, kv_bytes, runs = [], [], 0, []
    for rep in range(options.STEPS.value):
      p, d, n, kv_bytes = timed_sample(sampler, tokens, steps, rep + 1, gen)
      prefill.append(p)
      decode_s.append(d)
      runs.append(n)
    decode_steps = runs[0]
    bytes_per_step = weight_bytes + kv_bytes
    bound_step_s = bytes_per_step / bandwidth
    med = records.median(decode_s)
    tok_s = b * decode_steps / med
    bound_tok_s = b / bound_step_s
    flops = decode_flops_per_step(model, b, prompt_len + steps)
    roofline_step_s = max(bound_step_s, flops / flops_rate)
    settings = {
        'batch_size': b,
        'prompt_length': prompt_len,
        'decode_steps': decode_steps,
        'kv_cache_size': prompt_len + steps,
        'weight_bytes': weight_bytes,
        'kv_cache_bytes': kv_bytes,
        'bytes_per_step': bytes_per_step,
        'copy_bandwidth': bw_details,
        'read_bandwidth': read_details,
        'flops_per_step': flops,
        'matmul_throughput': flops_details,
        'temperature': gen.temperature,
        'top_k': gen.top_k,
        'cpu_decode_graph': sampler.cpu_decode_graph,
        'column_decode_rows': [decode.COLUMN_DECODE_MIN_ROWS,
                               decode.COLUMN_DECODE_MAX_ROWS],
    }
    ours = {
        'name': 'tunix Sampler decode loop via rollout.Rollout',
        'median_s': med,
        'steps_s': [round(x, 6) for x in decode_s],
        'prefill_median_s': records.median(prefill),
        'tokens_per_s': tok_s,
        'fraction_of_bound': tok_s / bound_tok_s,
        'roofline_tokens_per_s': b / roofline_step_s,
        'fraction_of_roofline': tok_s * roofline_step_s / b,
        'read_bound_tokens_per_s': b * read_bw / bytes_per_step,
        'fraction_of_read_bound': tok_s * bytes_per_step / (b * read_bw),
    }
    peer = {
        'name': 'memory-bandwidth bound (bytes_per_step / copy bandwidth)',
        'median_s': bound_step_s * decode_steps,
        'steps_s': [],
        'tokens_per_s': bound_tok_s,
    }
    results.append(records.measurement(f'decode_batch_{b}', ['decode'],
                                       settings, ours, peer))
    logging.info('decode b=%d: %.1f tok/s, bandwidth bound %.1f tok/s '
                 '(%.0f%%), roofline %.1f tok/s (%.0f%%)', b, tok_s,
                 bound_tok_s, 100 * tok_s / bound_tok_s, b / roofline_step_s,
                 100 * tok_s * roofline_step_s / b)
  del sampler
  gc.collect()
  return results
