"""The least HBM traffic each program must move, from its layout.

Each function returns (bytes, {term: bytes}) for one call, per chip, from
the per-chip bytes of what the program reads (the abstract arrays' shards)
and the config's shapes. They are floors under the layout, not estimates:

  * decode step (mean over the max_generation_steps steps of a loop): the
    weights a chip holds, read once per token; the live KV cache of its
    rows, read (a global layer: the prompt bucket plus the tokens so far;
    a sliding-window layer: at most its window); the new token's K and V,
    written;
  * prefill: the weights, read once; the prompt's K and V, written;
  * log-prob pass: the weights, read once per micro-batch;
  * update: the weights, read by the forward, the backward and (with
    remat) the recomputed forward of each micro-batch; the layer inputs
    remat keeps, written and read back; the LoRA weights, gradients and
    optimizer state, read and written once.

Imports nothing of the project.
"""


def attention_windows(model):
  """Per layer: its sliding window (columns), or None for a global layer."""
  windows = []
  for layer in getattr(model, 'layers', []):
    attn = getattr(layer, 'attn', None)
    kind = str(getattr(attn, 'attn_type', '')).upper()
    window = getattr(attn, 'sliding_window_size', None)
    windows.append(window if 'LOCAL' in kind and window else None)
  return windows


def decode_step(weight_bytes, kv_bytes, windows, cache_size, prompt_len,
                steps):
  """Mean per-step floor of a decode loop of `steps` steps.

  Args:
    weight_bytes: the sampler's weights one chip holds.
    kv_bytes: the KV cache (all layers, keys and values) one chip holds.
    windows: `attention_windows` of the model.
    cache_size: columns of the cache.
    prompt_len: the prompt bucket (columns filled before the first step).
    steps: decode steps of the loop.
  """
  layers = max(len(windows), 1)
  column = kv_bytes / (layers * cache_size)  # one layer's K and V column
  read = 0.0
  for t in range(steps):
    live = prompt_len + t  # columns before this step's token
    read += sum(min(live, w or cache_size, cache_size) for w in windows)
  read = read * column / max(steps, 1)
  written = column * layers
  terms = {'weights': float(weight_bytes), 'kv_read': read,
           'kv_written': written}
  return sum(terms.values()), terms


def prefill(weight_bytes, kv_bytes, cache_size, prompt_len):
  """Floor of the prefill: weights read, the prompt's K and V written."""
  terms = {'weights': float(weight_bytes),
           'kv_written': kv_bytes * prompt_len / cache_size}
  return sum(terms.values()), terms


def logps(weight_bytes, micro_batches):
  """Floor of a log-prob pass: the weights read once per micro-batch."""
  terms = {'weights': float(weight_bytes) * micro_batches}
  return sum(terms.values()), terms


def update(weight_bytes, trained_bytes, micro_batches, remat, saved_bytes):
  """Floor of the update.

  Args:
    weight_bytes: the frozen weights one chip holds.
    trained_bytes: the LoRA weights and optimizer state one chip holds.
    micro_batches: forward/backward passes.
    remat: the config's model.remat ('none' keeps every activation).
    saved_bytes: per micro-batch, the layer inputs remat keeps on a chip.
  """
  passes = 2 if remat == 'none' else 3
  terms = {
      'weights': float(weight_bytes) * micro_batches * passes,
      'remat_saved': (2.0 * saved_bytes * micro_batches
                      if remat != 'none' else 0.0),
      # LoRA weights and optimizer state read, gradients and new ones
      # written.
      'trained': 2.0 * trained_bytes,
  }
  return sum(terms.values()), terms
