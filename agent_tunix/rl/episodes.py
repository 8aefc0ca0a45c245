"""Multi-turn episodes: rows that pause for an environment and resume in the
same KV cache.

Layer: rl; may import agent, data, models, rewards, tpu, storage and cli.

`EpisodeRollout` wraps a single-turn `rollout.Rollout`: its `generate`
returns the same `Completions` with an `Episode` per row, inserted text in
the columns with mask 0 and `input_mask` 1 on every real token.
`from_config(config, rollout)` builds it when `enabled(config)`
(agent.tools or agent.environment); `format_transcript` writes an episode
one line per turn.

Design notes: docs/agent.md, 'How an episode runs'.
"""

import dataclasses
import hashlib
import time

from flax import nnx
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
from tunix.generate import utils as sampler_utils

from agent_tunix.agent import environment
from agent_tunix.agent import formats
from agent_tunix.data import pipeline
from agent_tunix.models import tunix_adapter
from agent_tunix.rl import rollout as rollout_lib
from agent_tunix.tpu import sharding

# How an episode finished. 'answer': the environment ended it (a final
# turn); the others are limits: 'turn_tokens' (a turn reached the per-turn
# cap), 'columns' (no room left in the cache for the next insert or turn),
# and whatever the environment reports ('max_tool_calls', 'timeout').
FINISH_ANSWER = environment.FINISH_ANSWER
FINISH_TURN_TOKENS = 'turn_tokens'
FINISH_COLUMNS = 'columns'


@dataclasses.dataclass
class Episode:
  """What one row did, for rewards, metrics and transcripts."""

  transcript: str  # Model turns and inserts as one text (end tokens out).
  final_text: str  # The last model turn's text: what answer rewards read.
  tool_calls: list  # [{name, arguments, result, error}], in call order.
  finish: str  # FINISH_* or the environment's finish reason.
  turns: int = 0  # Model turns.
  model_tokens: int = 0  # Tokens the policy sampled (mask 1).
  insert_tokens: int = 0  # Tokens inserted (mask 0).
  stats: dict = dataclasses.field(default_factory=dict)  # Environment's.
  # [(role, text)]: 'model' turns and the 'tool' (environment) replies
  # between them, for people to read (`format_transcript`).
  segments: list = dataclasses.field(default_factory=list)

  @property
  def cut(self):
    """Whether a limit ended the episode (not a final answer)."""
    return self.finish != FINISH_ANSWER


def format_transcript(episode):
  """An episode for people: one line per model turn and per reply, e.g.

    model: [calculator(expression="44 * 31")]
    tool:  calculator(expression='44 * 31') -> 1364
    model: <reasoning>...</reasoning><answer>1364</answer>
  """
  return '\n'.join(f'{role + ":":6} {text}' for role, text in
                   episode.segments)


def _reply_text(reply):
  """One line for an environment's reply: its calls and results, or its
  text without turn markup."""
  if reply.calls:
    return '; '.join(
        f'{c.name}({", ".join(f"{k}={v!r}" for k, v in c.arguments.items())})'
        f' -> {c.text}' for c in reply.calls)
  return ' '.join(formats.sanitize(reply.text)[0].split())


def truncate_middle(ids, cap, marker_ids):
  """`ids` cut to at most `cap` tokens by dropping the middle.

  The start and end of an insert carry its format's markers (the tool
  response opens, the next model turn opens), so those are kept and
  `marker_ids` (e.g. the tokens of ' ... ') stand in for what was dropped.
  """
  ids = list(ids)
  if len(ids) <= cap:
    return ids
  marker_ids = list(marker_ids)[:max(cap - 2, 0)]
  room = cap - len(marker_ids)
  head = (room + 1) // 2
  tail = room - head
  return ids[:head] + marker_ids + (ids[len(ids) - tail:] if tail else [])


def pause_token_ids(tokenizer, texts):
  """int32 ids of the vocabulary pieces that hold any of `texts`: a row that
  samples one pauses, and its environment's `ends_turn` says whether its
  turn is over (see `agent.environment.Environment`)."""
  if not texts:
    return np.zeros((0,), np.int32)
  ids = [i for i in range(tokenizer.get_piece_size())
         if any(t in tokenizer.id_to_piece(i) for t in texts)]
  return np.array(ids, np.int32)


@dataclasses.dataclass
class _Row:
  """One row's episode while `EpisodeRollout.generate` runs.

  After each decode call the host calls `advance` on every row: it reads
  the row's newly generated tokens and decides what the row does next (go
  on in its turn, take an insert and resume, or finish). It reads its
  `EpisodeRollout`'s private helpers: the two are one unit.
  """
  # pylint: disable=protected-access

  env: object  # The row's environment.
  turn_start: int  # Column of the current model turn's first token.
  end_col: int  # Column of the episode's last real token (so far).
  finish: str | None = None  # FINISH_* once over; None while it runs.
  turns: list = dataclasses.field(default_factory=list)  # [(start, end)].
  segments: list = dataclasses.field(default_factory=list)  # [(role, text)].
  # Set by `advance` when the turn ended with an insert: (first column,
  # token ids) to force, and (first, last) columns sampled past a stop
  # text that become pad (a hole); None otherwise.
  insert: tuple | None = None
  hole: tuple | None = None

  def advance(self, host, tokens, step, done, last_col):
    """Reads the row after a decode call: tool call -> insert its result
    and resume; final answer or a limit -> done.

    Args:
      host: the `EpisodeRollout` (turn ends and texts, caps, tokenizer).
      tokens: the row's token buffer, on the host.
      step: the last column the decode loop wrote.
      done: whether the decode loop stopped the row.
      last_col: the buffer's last column.

    Returns:
      Whether the row waits (writes pad) in the next decode call.
    """
    self.insert = self.hole = None
    if self.finish is not None:
      return done
    end, how = host._turn_end(tokens, self.turn_start, step, done)
    turn_close = ''  # What closes the turn before the reply.
    if how == 'pause':
      turn_close = self.env.ends_turn(self._text(host, tokens, end))
      if turn_close is None:  # Not complete: goes on, unless capped.
        if end + 1 - self.turn_start < host.max_turn_tokens:
          return False
        how, turn_close = 'cap', ''  # Capped: nothing closes it.
    if how is None:  # Still in its turn.
      if step < last_col:
        return done
      self.finish = FINISH_COLUMNS  # Out of columns mid-turn.
    elif how == 'cap' and not getattr(self.env, 'answers_capped_turns',
                                      False):
      self.finish = FINISH_TURN_TOKENS
    text = self._text(host, tokens, end)
    self.turns.append((self.turn_start, end + 1))
    self.end_col = end
    self.segments.append(('model', text))
    if self.finish is None:
      self._reply(host, self.env.step(text), turn_close, step, end,
                  last_col)
    return self.insert is None

  def _text(self, host, tokens, end):
    return host._turn_text(tokens[self.turn_start:end + 1])

  def _reply(self, host, reply, turn_close, step, end, last_col):
    """Takes the environment's reply to a finished turn: the episode ends,
    or its text becomes an insert (`self.insert`) after column `step`."""
    if reply.done or reply.text is None:
      self.finish = reply.finish or FINISH_ANSWER
      return
    self.segments.append(('tool', _reply_text(reply)))
    ids = truncate_middle(
        [int(t) for t in host.tokenizer.encode(turn_close + reply.text)],
        host.max_insert_tokens, host._marker_ids)
    start = step + 1  # After what the loop wrote.
    if start + len(ids) + 1 > last_col:  # No room for one sampled token.
      self.finish = FINISH_COLUMNS
      return
    self.insert = (start, ids)
    self.turn_start = start + len(ids)
    if end < step:
      self.hole = (end + 1, step)


class EpisodeRollout:
  """Samples multi-turn episodes with a `rollout.Rollout`'s sampler."""

  def __init__(self, rollout, make_environment, max_turn_tokens,
               max_insert_tokens):
    """Wraps a single-turn `Rollout` (its sampler, prefill and stops).

    Args:
      rollout: `rollout.Rollout` over the policy.
      make_environment: () -> a fresh environment (`reset(example)`,
        `step(turn_text) -> Reply`), one per row and episode.
      max_turn_tokens: a model turn longer than this ends the episode
        (finish 'turn_tokens'), unless the environment
        `answers_capped_turns`.
      max_insert_tokens: an insert longer than this is cut in the middle.
    """
    if max_turn_tokens < 1 or max_insert_tokens < 8:
      raise ValueError(
          f'max_turn_tokens={max_turn_tokens} must be >= 1 and '
          f'max_insert_tokens={max_insert_tokens} >= 8.')
    self.rollout = rollout
    self.tokenizer = rollout.tokenizer
    self.make_environment = make_environment
    self.max_turn_tokens = int(max_turn_tokens)
    self.max_insert_tokens = int(max_insert_tokens)
    self._marker_ids = [int(t) for t in self.tokenizer.encode(' ... ')]
    sampler = rollout.sampler
    self._compiled_loop = rollout_lib.compile_decode_loop(
        self._decode_loop, rollout.cpu_decode_graph)
    self._pad = sampler.tokenizer.pad_id()
    self._pause_ids = pause_token_ids(
        self.tokenizer, getattr(make_environment(), 'pause_texts', ()))
    # Host seconds spent in environments during the last `generate`.
    self.last_host_seconds = 0.0
    self.last_decode_calls = 0

  @property
  def decode_fn(self):
    """Jitted (params, state, forced_tokens, forced, turn_start, turn_cap)
    -> state: the whole multi-turn decode loop."""
    return self._compiled_loop

  @property
  def end_ids(self):
    return self.rollout.end_ids

  def close(self):
    """Stops the environments' shared tool executor, if they have one."""
    close = getattr(self.make_environment, 'close', None)
    if close is not None:
      close()

  def _decode_loop(self, params, state, forced_tokens, forced, turn_start,
                   turn_cap):
    """Decodes until a row ends a turn, every row is done, or the limit.

    Mirrors tunix's decode step (`Sampler._sample_step`) with three
    changes: positions count the real tokens before the column; a row with
    a forced token at the next column writes it instead of its sample (and
    is not ended by it, even when it is an end token: inserts hold
    `<end_of_turn>`); a row that is done writes the pad id (it waits, or
    has finished), which every later query masks out.
    """
    sampler = self.rollout.sampler
    pad = self._pad
    eos = sampler.eos_ids
    entry_done = state.done
    width = state.token_buffer.shape[1]
    columns = jnp.arange(width)[None, :]
    rows = jnp.arange(state.token_buffer.shape[0])

    def cond(s):
      return ((s.decoding_step < s.total_sampling_steps)
              & jnp.any(~s.done) & ~jnp.any(s.done & ~entry_done))

    def body(s):
      step = s.decoding_step
      real = (s.token_buffer != pad) & (columns < step)
      positions = real.sum(axis=1, dtype=jnp.int32)[:, None]
      last = s.token_buffer[rows, step][:, None]
      attention_mask = sampler_utils.compute_attention_masks(
          step, sampler.cache_config.cache_size, s.token_buffer == pad)
      transformer = nnx.merge(tunix_adapter.transformer_graphdef(sampler),
                              params)
      logits, cache = transformer(last, positions=positions, cache=s.cache,
                                  attention_mask=attention_mask)
      n = tunix_adapter.sample(sampler, logits=logits, cache=cache, eos=eos,
                               sampler_state=s)
      col = step + 1
      is_forced = forced[rows, col]
      sampled = n.token_buffer[rows, col]
      token = jnp.where(is_forced, forced_tokens[rows, col],
                        jnp.where(s.done, pad, sampled))
      logp = jnp.where(is_forced | s.done, 0.0, n.logprobs_buffer[rows, col])
      ended = jnp.isin(token, eos) | (col + 1 - turn_start >= turn_cap)
      if len(self._pause_ids):
        ended |= jnp.isin(token, self._pause_ids)
      done = (s.done | ended) & ~is_forced
      return n.replace(
          token_buffer=n.token_buffer.at[:, col].set(token),
          logprobs_buffer=n.logprobs_buffer.at[:, col].set(logp),
          done=done,
      )

    return jax.lax.while_loop(cond, body, state)

  def _put_rows(self, x, like=None):
    """A host array of per-row values, placed like the sampler's rows (or
    like the array `like` it replaces, so the loop's inputs keep one
    placement from call to call)."""
    mesh = self.rollout.mesh
    if mesh is None:
      return jnp.asarray(x)
    placement = (like.sharding if like is not None
                 else sharding.batch_sharding(mesh, np.ndim(x), rows=len(x)))
    return sharding.put_global(x, placement)

  def generate(self, prompt_tokens, max_steps, seed, temperature=0.0,
               top_k=0, top_p=1.0, rows=None, num_generations=1,
               examples=None):
    """Samples one episode per row: `Rollout.generate` with environments.

    Args:
      prompt_tokens: int32 [N, P] left-padded prompts (the global batch).
      max_steps: completion columns C: model turns and inserts together.
      seed: sampling seed.
      temperature, top_k, top_p: as `Rollout.generate`.
      rows: indices of the rows to return (of N x G), None = all.
      num_generations: G episodes per prompt (one shared prefill).
      examples: N dicts (the prompt rows' examples), each given to its G
        environments' `reset`; None gives every environment {}.

    Returns:
      `rollout.Completions` of the chosen rows with `input_mask` and
      `episodes` set; `texts` are the final turns' texts.
    """
    roll = self.rollout
    prompt_tokens = np.asarray(prompt_tokens, dtype=np.int32)
    num_prompts, num_prompt = prompt_tokens.shape
    g = int(num_generations)
    if g < 1:
      raise ValueError(f'num_generations={g} must be >= 1.')
    total_steps = num_prompt + max_steps
    last_col = total_steps - 1
    state = roll.start(prompt_tokens, total_steps, seed, g,
                       **rollout_lib.sampling_args(temperature, top_k, top_p))
    params = roll.params
    examples = [{}] * num_prompts if examples is None else list(examples)
    episode_rows = [_Row(self._environment(examples[i // g]), num_prompt,
                         last_col) for i in range(num_prompts * g)]
    forced_np = np.zeros((len(episode_rows), total_steps), bool)
    forced_tokens_np = np.zeros((len(episode_rows), total_steps), np.int32)
    forced, forced_tokens = (self._put_rows(forced_np),
                             self._put_rows(forced_tokens_np))
    host_seconds, calls = 0.0, 0
    chunk = roll.decode_chunk_steps if roll.stop_sequences else None
    while True:
      # state.decoding_step is the last column written (the prefill wrote
      # column num_prompt). Rows the prefill ended are seen here first.
      step = int(state.decoding_step)
      tokens = np.array(sharding.to_host(state.token_buffer))
      done = np.array(sharding.to_host(state.done))
      started = time.perf_counter()
      waits = np.array([row.advance(self, tokens[r], step, done[r], last_col)
                        for r, row in enumerate(episode_rows)], bool)
      host_seconds += time.perf_counter() - started
      inserts = {r: row.insert for r, row in enumerate(episode_rows)
                 if row.insert is not None}
      self._check_same_inserts(inserts)
      holes = [(r, row.hole) for r, row in enumerate(episode_rows)
               if row.hole is not None]
      if holes:
        # A stop text ended the turn before the chunk did: the columns
        # sampled after it become pad, which every later query masks out.
        for r, (first, last) in holes:
          tokens[r, first:last + 1] = self._pad
        state = state.replace(
            token_buffer=self._put_rows(tokens, state.token_buffer))
      if inserts or (waits != done).any():
        for r, (start, ids) in inserts.items():
          forced_np[r, start:start + len(ids)] = True
          forced_tokens_np[r, start:start + len(ids)] = ids
        forced, forced_tokens = (self._put_rows(forced_np),
                                 self._put_rows(forced_tokens_np))
        state = state.replace(done=self._put_rows(waits, state.done))
      if (all(row.finish is not None for row in episode_rows)
          or step >= last_col):
        break
      limit = total_steps if chunk is None else min(step + chunk,
                                                    total_steps)
      turn_start = np.array([row.turn_start for row in episode_rows],
                            np.int32)
      state = self._compiled_loop(
          params, state.replace(total_sampling_steps=limit), forced_tokens,
          forced, self._put_rows(turn_start), jnp.int32(self.max_turn_tokens))
      calls += 1
    for row in episode_rows:
      if row.finish is None:  # Defensive: the loop ends every row.
        row.finish, row.end_col = FINISH_COLUMNS, last_col
        row.turns.append((row.turn_start, total_steps))
    self.last_host_seconds = host_seconds
    self.last_decode_calls = calls
    tokens = sharding.to_host(state.token_buffer)
    logps = sharding.to_host(state.logprobs_buffer)
    chosen = range(len(episode_rows)) if rows is None else [
        int(i) for i in rows]
    return self._completions(
        [tokens[r] for r in chosen], [logps[r] for r in chosen],
        [forced_np[r] for r in chosen], [episode_rows[r] for r in chosen],
        num_prompt)

  def _environment(self, example):
    """A fresh environment, reset to `example` (a copy)."""
    env = self.make_environment()
    env.reset(dict(example))
    return env

  def _turn_end(self, row, start, step, done):
    """How and where the turn that began at column `start` ended.

    Returns (column of its last token, how): 'end' (an end token), 'stop'
    (the token completing a stop text), 'pause' (a pause token: the
    environment says whether the turn is complete), 'cap' (the decode loop
    stopped it at the per-turn cap), or (step, None) while it goes on.
    """
    turn = row[start:step + 1]
    end, how = len(turn), None
    if done:
      is_end = np.isin(turn, self.end_ids)
      if is_end.any():
        end, how = int(is_end.argmax()), 'end'
      elif np.isin(turn[-1], self._pause_ids):
        end, how = len(turn) - 1, 'pause'
      else:
        end, how = len(turn) - 1, 'cap'
    if self.rollout.stop_sequences and end > 0:
      stop = int(rollout_lib.ending_tokens(
          turn[None, :end], self.end_ids, self.tokenizer,
          self.rollout.stop_sequences)[0])
      if stop < end:
        end, how = stop, 'stop'
    return (start + end, how) if how else (step, None)

  def _turn_text(self, ids):
    """A model turn's text: its end token and any stop text left out."""
    text = self.tokenizer.decode(
        [int(t) for t in ids if int(t) not in self.end_ids])
    stop = rollout_lib._first_stop(text, self.rollout.stop_sequences)  # pylint: disable=protected-access
    return text if stop is None else text[:stop]

  def _check_same_inserts(self, inserts):
    """Refuses when processes would insert different tokens."""
    if jax.process_count() == 1:
      return
    digest = hashlib.sha256(repr(sorted(inserts.items())).encode()).digest()
    mine = np.frombuffer(digest, np.uint8)[None]
    every = np.asarray(multihost_utils.process_allgather(mine))
    if not (every == mine).all():
      raise RuntimeError(
          'The processes would insert different tool results into the '
          'same rows; tools must give the same result for the same call '
          'on every process (no randomness, clocks or host state).')

  def _completions(self, tokens, logps, forced, episode_rows, num_prompt):
    """`Completions` and `Episode`s of the chosen rows (`_Row`s)."""
    pad = pipeline.PAD_ID
    count = len(tokens)
    width = len(tokens[0]) - num_prompt if count else 0
    columns = np.arange(width)
    out_tokens = np.full((count, width), pad, np.int32)
    mask = np.zeros((count, width), np.float32)
    input_mask = np.zeros((count, width), np.float32)
    out_logps = np.zeros((count, width), np.float32)
    episodes, texts = [], []
    for i in range(count):
      row = tokens[i][num_prompt:]
      episode_row = episode_rows[i]
      kept = columns <= int(episode_row.end_col) - num_prompt
      out_tokens[i] = np.where(kept, row, pad)
      real = out_tokens[i] != pad
      model = real & ~forced[i][num_prompt:]
      input_mask[i] = real
      mask[i] = model
      out_logps[i] = np.where(model, logps[i][num_prompt:], 0.0)
      start, stop = episode_row.turns[-1]
      texts.append(self._turn_text(tokens[i][start:stop]))
      env = episode_row.env
      episodes.append(Episode(
          transcript=self.transcript(out_tokens[i][real]),
          final_text=texts[-1],
          tool_calls=list(getattr(env, 'tool_calls', [])),
          finish=episode_row.finish,
          turns=len(episode_row.turns),
          model_tokens=int(model.sum()),
          insert_tokens=int(real.sum() - model.sum()),
          stats=dict(getattr(env, 'stats', {}) or {}),
          segments=episode_row.segments,
      ))
    lengths = mask.sum(axis=1).astype(np.int32)
    truncated = np.array([e.cut for e in episodes], bool)
    return rollout_lib.Completions(
        out_tokens, mask, lengths, truncated, texts, out_logps,
        input_mask=input_mask, episodes=episodes)

  def transcript(self, ids):
    """An episode's tokens as text, end tokens spelled out (`<end_of_turn>`)
    so that turns show."""
    parts, run = [], []
    for t in (int(t) for t in ids):
      if t in self.end_ids:
        parts.append(self.tokenizer.decode(run))
        parts.append(self.tokenizer.id_to_piece(t))
        run = []
      else:
        run.append(t)
    parts.append(self.tokenizer.decode(run))
    return ''.join(parts)


def enabled(config):
  """Whether `config` samples multi-turn episodes (agent.tools or
  agent.environment set)."""
  return bool(config.agent.tools or config.agent.environment)


def from_config(config, rollout):
  """The `EpisodeRollout` of `config.agent` over a single-turn `rollout`:
  agent.environment's factory, or tool environments for agent.tools.

  Raises:
    ValueError: when the tokenizer lacks a control token the tool format
      needs as one piece (FunctionGemma's tool tokens in a Gemma 3 vocab,
      Gemma 4's in the Gemma 3 tokenizer that stands in for tiny Gemma 4s).
  """
  agent = config.agent
  if agent.environment:
    return EpisodeRollout(
        rollout, environment.resolve_factory(agent.environment),
        agent.max_turn_tokens, agent.max_tool_output_tokens)
  factory = environment.make_environment_factory(
      agent.tools, agent.format,
      tool_timeout_s=agent.tool_timeout_s,
      # A cheap bound before tokenizing; the token cap then applies.
      max_output_chars=8 * agent.max_tool_output_tokens,
      max_tool_calls=agent.max_tool_calls,
      max_calls_per_turn=agent.max_calls_per_turn,
      episode_timeout_s=agent.episode_timeout_s or None,
      answer_end=agent.answer_end)
  tokenizer = rollout.tokenizer
  missing = [p for p in factory.format.required_pieces
             if tokenizer.piece_to_id(p) == tokenizer.unk_id()]
  if missing:
    factory.close()
    fix = factory.format.missing_pieces_fix
    raise ValueError(
        f'config.agent.format={agent.format!r} needs the tokens {missing}, '
        f'which the {config.model.preset} tokenizer does not have as single '
        f'pieces; {fix}.')
  # The format's stop pieces end a call turn (FunctionGemma's
  # <start_function_response>); set before the decode loop first compiles.
  stops = [tokenizer.piece_to_id(p) for p in factory.format.stop_pieces]
  rollout.end_ids = list(dict.fromkeys(list(rollout.end_ids) + stops))
  rollout.sampler.eos_ids = np.array(rollout.end_ids, np.int32)
  return EpisodeRollout(rollout, factory, agent.max_turn_tokens,
                        agent.max_tool_output_tokens)
