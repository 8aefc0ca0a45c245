"""Prompts -> G completions each, with tunix's JIT-compiled KV-cache sampler.

Prompts arrive as token ids left-padded to one bucket length
(`generation.max_prompt_length`) and completions are sampled for at most
`max_steps` positions, so prefill and decode compile once per
(batch, bucket, length, temperature) and never per step. The decode loop
exits early once every row has produced an end token.

Stop sequences (`generation.stop_sequences`): a completion also ends at the
token that completes the first stop text (kept in tokens and mask, like an
end token; left out of the text). The sampler cannot see text, so with stop
sequences the decode loop runs `decode_chunk_steps` steps at a time (the
same compiled loop: only the step limit it reads changes), and between
chunks the host decodes the rows and stops once every row has ended.

The sampler's public `__call__` takes strings and drops the end token it
stopped on; GRPO trains on that token too (it is how the policy learns to
stop), so this module drives the sampler's prefill and decode functions on
token ids directly and reads the raw token and log-prob buffers (the
sampler's log-prob of every sampled token; see `Rollout.generate`).

Shared prompts: GRPO samples G completions of every prompt. With
`num_generations=G`, `generate` takes each prompt once, runs the prefill on
the distinct prompts only, repeats the KV cache and the state G times, and
samples the first token (and every later one) per row. Prefill costs 1/G of
running it on the repeated rows, and the result is the same computation:
the repeated rows' prefills were identical. With `shared_prefix` the
leading tokens that all prompts of a batch share are prefilled once too
(`shared_prefix`).

CPU: the sampler is built from `models.decode`'s graph (same computation,
without the KV cache and weight copies XLA CPU puts in every decode step of
tunix's graph), and its decode loop is compiled with
`decode.DECODE_COMPILER_OPTIONS`. TPU and GPU: tunix's graph with
`models.decode`'s step attention (the KV cache updated in place, a sliding
window read alone). The caller's model keeps tunix's graph.

Sharding: the sampler runs as one program over the model's mesh. Prompt rows
are split over the batch axes and the KV cache over rows and kv heads
(`sharding.kv_cache_sharding`); tunix would create both whole on one device.
On several processes every process passes the same global prompt batch and
gets the completions of the rows it asks for (see `Rollout.generate`).
"""

import contextlib
import dataclasses
import functools
import math
import re

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from tunix.generate import sampler as sampler_lib
from tunix.generate import utils as sampler_utils

from agent_tunix.data import pipeline
from agent_tunix.data import prompts as prompts_lib
from agent_tunix.models import decode
from agent_tunix.models import families
from agent_tunix.models import gemma4 as gemma4_lib
from agent_tunix.models import tunix_adapter
from agent_tunix.rl import shared_prefix as shared_prefix_lib
from agent_tunix.tpu import sharding


@dataclasses.dataclass
class Completions:
  """Sampled completions for a batch of N rows (prompts already repeated)."""

  tokens: np.ndarray  # int32 [N, C], pad after the end token
  mask: np.ndarray  # float32 [N, C], 1 up to and including the end token
  lengths: np.ndarray  # int32 [N], tokens incl. the end token
  truncated: np.ndarray  # bool [N], no end token or stop text within C
  texts: list  # str [N], decoded, end token and stop text excluded
  # float32 [N, C]: the sampler's log-prob of each kept token (0 after the
  # end), under the temperature-scaled distribution before the top-k /
  # top-p cut (see `Rollout.generate`); None when not given.
  logps: np.ndarray | None = None
  # Multi-turn episodes (`episodes.EpisodeRollout`): float32 [N, C], 1 on
  # every real token up to the episode's end, inserted tool results
  # included (what the model attends to), while `mask` is 1 on the policy's
  # own tokens only; None for single-turn completions, where both agree.
  input_mask: np.ndarray | None = None
  episodes: list | None = None  # episodes.Episode per row, or None.

  @property
  def attended(self):
    """float32 [N, C]: 1 on the tokens the model reads (`input_mask`)."""
    return self.mask if self.input_mask is None else self.input_mask

  def subset(self, rows):
    """The completions of `rows` (indices), in that order."""
    pick = lambda x: None if x is None else x[rows]
    return Completions(
        self.tokens[rows], self.mask[rows], self.lengths[rows],
        self.truncated[rows], [self.texts[i] for i in rows],
        pick(self.logps), pick(self.input_mask),
        None if self.episodes is None else [self.episodes[i] for i in rows])


def end_token_ids(tokenizer):
  """<eos> and the end of a turn (Gemma 3 `<end_of_turn>`, Gemma 4 `<turn|>`):
  either one ends a completion."""
  ids = [tokenizer.eos_id()]
  for piece in ('<end_of_turn>', '<turn|>'):
    token = tokenizer.piece_to_id(piece)
    if token != tokenizer.unk_id() and token not in ids:
      ids.append(token)
  return ids


_STOP_ESCAPES = {'n': '\n', 't': '\t', '|': '|', '\\': '\\'}


def parse_stop_sequences(text):
  """Stop texts from `generation.stop_sequences`' format.

  Texts are separated by '|'; a backslash escapes '\\n' (newline), '\\t'
  (tab), '\\|' and '\\\\'. '' means none. The format needs no comma or
  quotes, so it passes through command-line overrides and preset
  arguments as is: `--config.generation.stop_sequences='\\nQuestion:|###'`.

  Args:
    text: the config string (not 'auto'; see `stop_sequences_from_config`).

  Returns:
    Tuple of non-empty stop strings.

  Raises:
    ValueError: on an unknown escape or an empty stop text.
  """
  if not text:
    return ()
  texts, current = [], []
  parts = re.split(r'(\\.?|\|)', text, flags=re.DOTALL)
  for part in parts:
    if part == '|':
      texts.append(''.join(current))
      current = []
    elif part.startswith('\\'):
      if part[1:] not in _STOP_ESCAPES:
        raise ValueError(
            f'generation.stop_sequences={text!r}: unknown escape {part!r}; '
            'use \\n, \\t, \\| or \\\\.'
        )
      current.append(_STOP_ESCAPES[part[1:]])
    else:
      current.append(part)
  texts.append(''.join(current))
  if not all(texts):
    raise ValueError(
        f'generation.stop_sequences={text!r} has an empty stop text; '
        "separate texts with single '|' and write none at either end."
    )
  return tuple(texts)


def stop_sequences_from_config(config):
  """`generation.stop_sequences` resolved: 'auto' is the template's own
  (none with tools: every turn of a tool prompt ends at <end_of_turn>)."""
  text = config.generation.stop_sequences
  if text == 'auto' and config.agent.tools:
    return ()
  if text == 'auto':
    template = prompts_lib.resolve_template(config)
    return prompts_lib.TEMPLATE_STOP_SEQUENCES[template]
  return parse_stop_sequences(text)


def repeat_groups(batch, num_generations):
  """Repeats every prompt row G times (groups are contiguous)."""
  return {k: np.repeat(v, num_generations, axis=0) for k, v in batch.items()}


def sampling_args(temperature, top_k, top_p):
  """`init_sample_state`'s sampling arguments: temperature 0 is greedy
  (no cut), top_k 0 and top_p 1 are off."""
  greedy = temperature <= 0
  return dict(temperature=float(temperature),
              top_p=None if greedy else float(top_p),
              top_k=None if greedy or not top_k else int(top_k))


def compile_decode_loop(loop, cpu_decode_graph):
  """`jax.jit` of a decode loop (params, state, ...) -> state, its state
  donated; on models.decode's CPU graph traced with its sampling and
  compiled with `decode.DECODE_COMPILER_OPTIONS`."""
  if not cpu_decode_graph:
    return jax.jit(loop, donate_argnums=(1,))

  @functools.wraps(loop)  # Compiled under the loop's own name.
  def decode_with_cpu_sampling(*args):
    with decode.cpu_sampling():
      return loop(*args)

  return jax.jit(decode_with_cpu_sampling, donate_argnums=(1,),
                 compiler_options=decode.DECODE_COMPILER_OPTIONS)


def _platform(model):
  mesh = sharding.model_mesh(model)
  return (mesh.devices.flat[0].platform if mesh is not None
          else jax.default_backend())


def uses_cpu_decode_graph(model):
  """True when the sampler should run models.decode's CPU graph: on CPU,
  for a tunix Gemma 3 (on TPU/GPU the sampler runs tunix's graph with
  `decode.step_attention_graph`)."""
  return decode.uses_cpu_decode_graph(model, _platform(model))


class Rollout:
  """Samples completions from the current policy (LoRA included)."""

  def __init__(self, model, tokenizer, cache_size, cpu_decode_graph=True,
               stop_sequences=(), decode_chunk_steps=16, shared_prefix=False):
    """Builds tunix's sampler over `model`.

    Args:
      model: the policy (LoRA included); the sampler follows its variables.
      tokenizer: its SentencePiece tokenizer.
      cache_size: KV cache length (prompt bucket + completion length).
      cpu_decode_graph: on CPU, build the sampler from models.decode's graph
        (`config.generation.cpu_decode_graph`); ignored elsewhere.
      stop_sequences: texts that end a completion (`stop_sequences_from_
        config`); () = end tokens only.
      decode_chunk_steps: with stop sequences, decode steps between the
        host's checks whether every row has ended.
      shared_prefix: prefill the leading tokens that every prompt row of a
        batch shares once (`shared_prefix`; `generation.shared_prefix`).
    """
    if decode_chunk_steps < 1:
      raise ValueError(
          f'decode_chunk_steps={decode_chunk_steps} must be >= 1.'
      )
    cfg = model.config
    self.tokenizer = tokenizer
    self.stop_sequences = (*stop_sequences,)
    self.decode_chunk_steps = int(decode_chunk_steps)
    self.shared_prefix = bool(shared_prefix)
    self._model_config = cfg
    cache_config = sampler_lib.CacheConfig(
        cache_size=cache_size,
        num_layers=cfg.num_layers,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
    )
    # The sampler keeps the graph it is built from, so on CPU it is built
    # from models.decode's graph, swapped in only meanwhile: the caller's
    # model keeps tunix's classes.
    self.cpu_decode_graph = bool(cpu_decode_graph and
                                 uses_cpu_decode_graph(model))
    self._on_accelerator = _platform(model) != 'cpu'
    if self.cpu_decode_graph:
      graph = decode.cpu_decode_graph(model)
    elif decode.uses_step_attention(model) and self._on_accelerator:
      graph = decode.step_attention_graph(model)
    else:
      graph = contextlib.nullcontext()
    with graph:
      self.sampler = sampler_lib.Sampler(model, tokenizer, cache_config)
    if self.cpu_decode_graph:
      # tunix's decode loop, with the CPU compile options, traced with
      # models.decode's sampling.
      tunix_adapter.set_decode_fn(self.sampler, compile_decode_loop(
          tunix_adapter.decode_loop(self.sampler), cpu_decode_graph=True))
    self._embedding = getattr(getattr(model, 'embedder', None),
                              'input_embedding', None)
    self._laid_out = None  # (embedding value, its sampling-layout Variable)
    self.end_ids = end_token_ids(tokenizer)
    # NumPy, not a jax array on one device: a constant in every program.
    self.sampler.eos_ids = np.array(self.end_ids, np.int32)
    self.mesh = sharding.model_mesh(model)
    self._heads_spec = tuple(cfg.shd_config.act_btnh)
    self._init_arrays = jax.jit(
        self._sharded_arrays, static_argnames=('total_steps',)
    )
    # No donation: the state grows from N to N x G rows, nothing to reuse.
    self._grouped_prefill = jax.jit(
        self._prefill_groups,
        static_argnames=('num_generations', 'prefix_columns'),
    )

  def generate(self, prompt_tokens, max_steps, seed, temperature=0.0,
               top_k=0, top_p=1.0, rows=None, num_generations=1):
    """Samples `max_steps` tokens after each left-padded prompt row.

    On several processes every process must call this with the same
    arguments: the rows are sampled once, split over the mesh, and each
    process gets back the completions of `rows`.

    Args:
      prompt_tokens: int32 [N, P], left-padded with the pad id (0); the
        whole (global) batch.
      max_steps: completion length C.
      seed: int; the same seed and prompts give the same completions.
      temperature: 0 for greedy decoding.
      top_k: top-k cut when sampling (0 = off).
      top_p: nucleus cut when sampling (1.0 = off).
      rows: indices of the rows to return (of the N x num_generations
        sampled); None means all.
      num_generations: G; each prompt row is sampled G times (rows i*G ..
        i*G + G - 1 of the result) with one shared prefill. The same as
        passing every prompt row repeated G times, at 1/G of the prefill.

    Returns:
      `Completions` of the chosen rows, with the sampler's log-prob of each
      sampled token (`Completions.logps`): log softmax(logits / temperature)
      of the token, before the top-k / top-p cut (greedy: of the plain
      logits). That is the distribution the trainer's log-probs refer to
      (it never applies the cut), so the two differ only by numerics
      (kernels, dtype, cache vs. full forward), which is what
      `sampler/logp_abs_diff` measures and truncated importance sampling
      corrects; the truncated distribution's log-prob would also differ
      by its renormalisation, for every token.
    """
    prompt_tokens = np.asarray(prompt_tokens, dtype=np.int32)
    num_prompt = prompt_tokens.shape[1]
    if num_generations < 1:
      raise ValueError(f'num_generations={num_generations} must be >= 1.')
    state = self.start(prompt_tokens, num_prompt + max_steps, seed,
                       num_generations,
                       **sampling_args(temperature, top_k, top_p))
    state = self._decode(self.params, state, num_prompt + max_steps)
    buffer = sharding.to_host(state.token_buffer)[:, num_prompt:]
    logps = sharding.to_host(state.logprobs_buffer)[:, num_prompt:]
    if rows is not None:
      buffer, logps = buffer[np.asarray(rows)], logps[np.asarray(rows)]
    return self.completions_from_tokens(buffer, logps)

  def _decode(self, params, state, total_steps):
    """Runs the decode loop until every row has ended or `total_steps`.

    Without stop sequences the compiled loop runs once (it exits early
    when every row has an end token). With them it runs
    `decode_chunk_steps` steps at a time: the loop's step limit is a
    traced value of the state (`total_sampling_steps`), so every chunk runs
    the same compiled program; between chunks the host decodes the tokens
    so far and stops when each row has an end token or a stop text.

    Args:
      params: the sampler's flattened transformer state.
      state: the sampling state after the prefill.
      total_steps: prompt bucket + completion length.

    Returns:
      The final sampling state.
    """
    decode_loop = tunix_adapter.decode_fn(self.sampler)
    if not self.stop_sequences:
      return decode_loop(params, state)
    num_prompt = int(state.num_input_tokens)
    step = num_prompt  # The prefill wrote position num_prompt.
    while step < total_steps:
      step = min(step + self.decode_chunk_steps, total_steps)
      state = decode_loop(params, state.replace(total_sampling_steps=step))
      # The loop writes position s + 1 at step s: up to `step` now.
      raw = sharding.to_host(state.token_buffer)[:, num_prompt:step + 1]
      ends = ending_tokens(raw, self.end_ids, self.tokenizer,
                           self.stop_sequences)
      if (ends < raw.shape[1]).all():
        break
    return state

  def close(self):
    """Nothing to release (an `episodes.EpisodeRollout` stops its tools)."""

  def start(self, prompt_tokens, total_steps, seed, num_generations,
            **sampling):
    """The sampling state after the prefill: the first completion token
    of every row drawn, N x G rows (`num_generations` = G).

    Every prefill, G = 1 too, computes the logits of the last prompt
    position only. tunix's own prefill computes them at every position,
    [N, P, vocab]: at 32 greedy eval rows of 320 tokens on the 270M, 10 GiB
    and ~1.7 TFLOP per batch, which made a 256-question eval on 2 CPU cores
    take over 12 minutes.

    With `shared_prefix` the leading run every prompt row shares is
    prefilled once (`shared_prefix`); the prompt columns of the state's
    token buffer then hold the rows in that module's layout (the
    completion columns are the same).

    Args:
      prompt_tokens: int32 numpy [N, P], left-padded, the whole batch.
      total_steps: P + completion length.
      seed: int sampling seed.
      num_generations: G rows per prompt.
      **sampling: `sampling_args`.
    """
    pad_id = self.sampler.tokenizer.pad_id()
    columns = 0
    if self.shared_prefix and shared_prefix_lib.usable(self._model_config,
                                                       total_steps):
      columns = shared_prefix_lib.prefix_columns(prompt_tokens, pad_id)
    if columns:
      prompt_tokens = shared_prefix_lib.prefix_first(prompt_tokens, pad_id,
                                                     columns)
    state = self.init_state(prompt_tokens, total_steps, seed, **sampling)
    return self._grouped_prefill(self.params, state,
                                 num_generations=int(num_generations),
                                 prefix_columns=columns)

  def init_state(self, prompt_tokens, total_steps, seed, **sampling):
    """tunix's initial sampling state, with its arrays placed on the mesh.

    `init_sample_state` fills a token buffer and a KV cache for all rows
    with eager ops on one device. Here its fields that do not depend on the
    rows (sampling mode and parameters) come from a zero-row call, and the
    per-row arrays are built by the same function under jit, sharded.

    Args:
      prompt_tokens: int32 numpy [N, P], the whole batch (every process
        passes the same).
      total_steps: P + completion length.
      seed: int sampling seed.
      **sampling: temperature, top_p and top_k as `init_sample_state` takes
        them (None = off).

    Returns:
      The sampler's state, ready for its prefill function.
    """
    template = self.state_template(
        prompt_tokens.shape[1], total_steps, seed, **sampling
    )
    if self.mesh is None:
      prompts = jnp.asarray(prompt_tokens)
      key = jax.random.PRNGKey(seed)
    else:
      prompts = sharding.put_global(
          prompt_tokens,
          sharding.batch_sharding(self.mesh, 2, rows=len(prompt_tokens)),
      )
      key = sharding.put_global(
          np.asarray(jax.random.PRNGKey(seed)), sharding.replicated(self.mesh)
      )
    arrays = self._init_arrays(prompts, key, total_steps=total_steps)
    return template.replace(**arrays)

  def state_template(self, prompt_len, total_steps, seed, **sampling):
    """The sampling state's fields that do not depend on the rows.

    A zero-row `init_sample_state`: sampling mode and parameters, step
    counters. `init_state` (and the preflight, with abstract arrays) fills
    in the per-row arrays built by `init_arrays_fn`.
    """
    return self._init_sample_state(
        jnp.zeros((0, prompt_len), jnp.int32), total_steps,
        jax.random.PRNGKey(seed), **sampling)

  def _init_sample_state(self, prompts, total_steps, key, temperature=0.0,
                         top_p=None, top_k=None):
    """tunix's `init_sample_state` as this module calls it: log-probs on,
    no logits buffer, forbidden tokens or beam search."""
    return self.sampler.init_sample_state(
        prompts,
        total_sampling_steps=total_steps,
        include_logits=False,
        forbidden_token_ids=None,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=key,
        beam_size=None,
        include_logprobs=True,
    )

  @property
  def init_arrays_fn(self):
    """Jitted (prompts, key, total_steps=) -> the per-row state arrays."""
    return self._init_arrays

  @property
  def prefill_fn(self):
    """Jitted (params, state, num_generations=G, prefix_columns=0) ->
    state after prefill (`start` picks prefix_columns)."""
    return self._grouped_prefill

  @property
  def decode_fn(self):
    """Jitted (params, state) -> state after the decode loop."""
    return tunix_adapter.decode_fn(self.sampler)

  @property
  def params(self):
    """The sampler's flattened model state (the programs' first argument),
    its embedding in the sampling layout (`_sampling_embedding`)."""
    params = list(tunix_adapter.flattened_state(self.sampler))
    for i, variable in enumerate(params):
      if variable is self._embedding:
        params[i] = self._sampling_embedding(variable)
    return params

  def _sampling_embedding(self, variable):
    """The embedding's Variable with its rows (the vocabulary) split over
    every mesh axis, re-laid out once per new value (it is frozen).

    Trained, the [V, D] table is split along D over 'fsdp'; a decode step
    then computed every row's partial logits over its share of D and
    reduce-scattered [rows, V] (67 MB per step on the 1B at 128 rows).
    Split along V, a chip reads its share of the table and writes its
    share of the logits. None of this on one device or CPU.
    """
    value = variable.get_value()
    spec = sharding.vocab_sharding(self.mesh, value.shape)
    if spec is None or not self._on_accelerator:
      return variable
    if isinstance(value, jax.ShapeDtypeStruct):  # The preflight's.
      return variable.copy(jax.ShapeDtypeStruct(value.shape, value.dtype,
                                                sharding=spec))
    if self._laid_out is None or self._laid_out[0] is not value:
      self._laid_out = (value, variable.copy(jax.device_put(value, spec)))
    return self._laid_out[1]

  def _sharded_arrays(self, prompts, key, total_steps):
    """The per-row arrays of the initial state, with sharding constraints."""
    state = self._init_sample_state(prompts, total_steps, key)
    arrays = {
        'token_buffer': state.token_buffer,
        'logprobs_buffer': state.logprobs_buffer,
        'positions': state.positions,
        'cache': state.cache,
        'done': state.done,
        'seed': state.seed,
    }
    if self.mesh is None:
      return arrays
    mesh = self.mesh

    seed = arrays.pop('seed')
    arrays = jax.tree.map(self._constrain_rows, arrays)
    arrays['seed'] = jax.lax.with_sharding_constraint(
        seed, sharding.replicated(mesh)
    )
    return arrays

  def _constrain_rows(self, x):
    """Row-sharding constraint for a per-row state array (no mesh: as is)."""
    if self.mesh is None:
      return x
    if x.ndim == 4:  # KV cache [B, S, K, H].
      target = sharding.kv_cache_sharding(self.mesh, x.shape, self._heads_spec)
    else:  # Token buffer, positions, done flags, cache end indices.
      target = sharding.batch_sharding(self.mesh, x.ndim, rows=x.shape[0])
    return jax.lax.with_sharding_constraint(x, target)

  def _row_shards(self, rows):
    """How many shards `rows` prompt rows are split in on the mesh."""
    if self.mesh is None:
      return 1
    axes = sharding.batch_sharding(self.mesh, 1, rows=rows).spec[0]
    axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
    return math.prod(self.mesh.shape[a] for a in axes)

  def _prefill_groups(self, params, state, num_generations, prefix_columns=0):
    """tunix's prefill on the distinct prompts, then G rows per prompt.

    Mirrors `Sampler._prefill_fn` (no echo, logits buffer or beam search):
    the prompts run through the model once to fill the KV cache, the cache,
    token buffer, positions and done flags are repeated G times, and the
    first completion token is drawn per row from the repeated last-position
    logits with the sampler's own `_sample` (each row its own draw).

    Args:
      params: the sampler's flattened transformer state.
      state: the initial sampling state of the N distinct prompt rows.
      num_generations: G.
      prefix_columns: > 0: the rows share their first `prefix_columns`
        columns, which run on one row (`shared_prefix.prefill`).

    Returns:
      The sampling state of N x G rows after the first sampled token.
    """
    sampler = self.sampler
    length = state.num_input_tokens
    tokens = state.token_buffer[:, :length]
    positions = state.positions[:, :length]
    input_mask = tokens != sampler.tokenizer.pad_id()
    transformer = nnx.merge(tunix_adapter.transformer_graphdef(sampler),
                            params)
    cache_size = sampler.cache_config.cache_size
    if hasattr(transformer, 'get_attention_mask'):
      attention_mask = transformer.get_attention_mask(
          tokens, inputs_mask=input_mask
      )
      padding = cache_size - attention_mask.shape[-1]
      attention_mask = jnp.pad(
          attention_mask,
          (*((0, 0),) * (attention_mask.ndim - 1), (0, padding)),
      )
    else:
      attention_mask = sampler_utils.make_causal_attn_mask(
          input_mask, cache_size
      )
    # Logits of the last prompt position only: the model's own logits cover
    # every position, [N, P, vocab] (XLA keeps them whole even when only the
    # last is read); discarded, that matmul is removed.
    def run(tokens, positions, cache, attention_mask):
      def forward(module):
        return module(tokens, positions, cache, attention_mask,
                      output_hidden_states=True)[1]

      cache, sown = nnx.capture(forward, nnx.Intermediate)(transformer)
      return cache, sown['all_hidden_states'].get_value()[-1][:, -1:]

    if prefix_columns:
      cache, hidden = shared_prefix_lib.prefill(
          run, tokens, positions, state.cache, attention_mask,
          prefix_columns, self._constrain_rows,
          prefix_rows=self._row_shards(tokens.shape[0]))
    else:
      cache, hidden = run(tokens, positions, state.cache, attention_mask)
    logits = gemma4_lib.apply_softcap(
        transformer.embedder.decode(hidden),
        families.of_config(transformer.config).final_logit_softcap)
    repeat = functools.partial(
        jnp.repeat, repeats=num_generations, axis=0
    )
    grouped = lambda x: self._constrain_rows(repeat(x))
    cache = jax.tree.map(grouped, cache)
    state = state.replace(
        token_buffer=grouped(state.token_buffer),
        logprobs_buffer=grouped(state.logprobs_buffer),
        positions=grouped(state.positions),
        done=grouped(state.done),
        cache=cache,
    )
    return tunix_adapter.sample(
        sampler,
        logits=repeat(logits),
        eos=sampler.eos_ids,
        cache=cache,
        sampler_state=state,
    )

  def completions_from_tokens(self, raw, logps=None):
    """Cuts raw sampled tokens [N, C] at the first end token or stop."""
    return completions_from_tokens(raw, self.end_ids, self.tokenizer, logps,
                                   self.stop_sequences)


def _first_stop(text, stop_sequences):
  """Where the earliest stop text starts in `text`, or None."""
  found = [i for i in (text.find(s) for s in stop_sequences) if i >= 0]
  return min(found) if found else None


def _stop_token(row, tokenizer, stop_sequences):
  """Index of the token of `row` that completes the first stop text.

  The smallest t whose prefix row[:t + 1] decodes to a text holding a stop
  text (a prefix's text only grows with t), found by bisection; None when
  the whole row holds none.
  """
  decode_has_stop = lambda t: _first_stop(
      tokenizer.decode(row[:t + 1].tolist()), stop_sequences) is not None
  if not len(row) or not decode_has_stop(len(row) - 1):
    return None
  lo, hi = 0, len(row) - 1
  while lo < hi:
    mid = (lo + hi) // 2
    if decode_has_stop(mid):
      hi = mid
    else:
      lo = mid + 1
  return lo


def ending_tokens(raw, end_ids, tokenizer, stop_sequences=()):
  """Per row of raw [N, C]: the index of its last token, C if unended.

  A row ends at its first end token, or earlier at the token that completes
  its first stop text.

  Args:
    raw: int [N, C] sampled token ids.
    end_ids: token ids that end a completion (see `end_token_ids`).
    tokenizer: has `decode(list[int]) -> str`.
    stop_sequences: stop texts.

  Returns:
    int [N] indices in [0, C].
  """
  raw = np.asarray(raw, dtype=np.int32)
  n, c = raw.shape
  is_end = np.isin(raw, end_ids)
  last = np.where(is_end.any(axis=1), is_end.argmax(axis=1), c)
  if stop_sequences:
    for i in range(n):
      stop = _stop_token(raw[i, :last[i]], tokenizer, stop_sequences)
      if stop is not None:
        last[i] = stop
  return last


def completions_from_tokens(raw, end_ids, tokenizer, logps=None,
                            stop_sequences=()):
  """Cuts raw sampled tokens [N, C] at each row's end.

  A row ends at its first end token, or earlier at the token that completes
  its first stop text (`ending_tokens`).

  Args:
    raw: int [N, C] sampled token ids (whatever follows the end is
      ignored).
    end_ids: token ids that end a completion (see `end_token_ids`).
    tokenizer: has `decode(list[int]) -> str`.
    logps: float [N, C] the sampler's log-probs of `raw`, or None.
    stop_sequences: stop texts (see `parse_stop_sequences`).

  Returns:
    `Completions`: the end token, or the tokens of the stop text, are kept
    in tokens, mask and lengths (the policy learns to stop from them) but
    not in the texts, which rewards score; positions after the end hold the
    pad id (and log-prob 0), out of rewards, log-probs and loss.
  """
  raw = np.asarray(raw, dtype=np.int32)
  n, c = raw.shape
  last = ending_tokens(raw, end_ids, tokenizer, stop_sequences)
  ended = last < c
  lengths = np.where(ended, last + 1, c).astype(np.int32)
  positions = np.arange(c)[None, :]
  mask = (positions < lengths[:, None]).astype(np.float32)
  tokens = np.where(mask > 0, raw, pipeline.PAD_ID).astype(np.int32)
  texts = []
  for i in range(n):
    if ended[i] and np.isin(raw[i, last[i]], end_ids):
      texts.append(tokenizer.decode(raw[i, :last[i]].tolist()))
      continue
    text = tokenizer.decode(raw[i, :lengths[i]].tolist())
    stop = _first_stop(text, stop_sequences) if ended[i] else None
    texts.append(text if stop is None else text[:stop])
  if logps is not None:
    logps = np.where(mask > 0, logps, 0.0).astype(np.float32)
  return Completions(tokens, mask, lengths, ~ended, texts, logps)
