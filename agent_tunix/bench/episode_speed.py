"""Section episodes: a multi-turn rollout's tokens/s against a single-turn one.

Layer: commands (bench); may import any layer of agent_tunix.

`episode_measurement(ctx, steps)` samples the bench's prompts for the same
C completion columns twice: in one turn (`rollout.Rollout.generate`) and
as scripted episodes of K + 1 model turns with K inserts between them
(`episodes.EpisodeRollout.generate`, environment `Scripted`, turn cap from
`layout`). It returns the bench's measurement record `NAME`: tokens/s of
each side, host seconds, decode-loop calls and compiles.

Design notes: docs/benchmarks.md, 'How the episodes section measures'.
"""

import collections
import contextlib
import dataclasses
import gc

from absl import logging
import jax
import numpy as np

from agent_tunix.agent import environment
from agent_tunix.agent import formats
from agent_tunix.bench import context
from agent_tunix.bench import options
from agent_tunix.bench import records
from agent_tunix.rl import episodes
from agent_tunix.rl import rollout

NAME = 'episode_rollout'
# The tool result every insert carries.
RESULT_NAME, RESULT_TEXT = 'calculator', '1364'
# jax.monitoring's event for each XLA compile (its fun_name: 'jit(<name>)').
_COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'


@dataclasses.dataclass
class _Result:
  name: str
  text: str


class Scripted(environment.Environment):
  """Answers the first `inserts` turns with `text`, then ends the episode.

  Its turns end by count on any model: a turn that reached the per-turn
  cap is answered, not cut."""

  answers_capped_turns = True

  def __init__(self, text, inserts):
    self.text = text
    self.inserts = int(inserts)
    self.turns = 0

  def reset(self, example):
    del example
    self.turns = 0

  def step(self, turn_text):
    del turn_text
    self.turns += 1
    if self.turns <= self.inserts:
      return environment.Reply(text=self.text, done=False)
    return environment.Reply(text=None, done=True,
                             finish=environment.FINISH_ANSWER)


def insert_text(config):
  """The text each insert carries: the format's call end and one result."""
  fmt = formats.get(config.agent.format or 'gemma3')
  return fmt.call_end + fmt.render_results([_Result(RESULT_NAME,
                                                    RESULT_TEXT)])


def layout(columns, insert_tokens, inserts):
  """How K turns of T tokens, K inserts and a last turn fill `columns`.

  Args:
    columns: C.
    insert_tokens: I, tokens per insert.
    inserts: K wanted; fewer when C is too short for them.

  Returns:
    (T, K, tokens of the last turn): the smallest T with which the last
    turn, C - K (T + I), is at most T (it runs to the end of the columns);
    every turn has at least 2 tokens.

  Raises:
    records.Skipped: C is too short for one insert.
  """
  for k in range(int(inserts), 0, -1):
    rest = columns - k * insert_tokens
    turn = -(-rest // (k + 1))
    last = rest - k * turn
    if turn >= 2 and last >= 2:
      return turn, k, last
  raise records.Skipped(
      f'{columns} completion columns are too short for one insert of '
      f'{insert_tokens} tokens between two turns of 2 or more; raise '
      '--episode_steps.')


@contextlib.contextmanager
def _counting_compiles():
  """Yields a Counter of backend compiles by jitted function name."""
  counts = collections.Counter()

  def listen(event, seconds, **kwargs):
    del seconds
    if event == _COMPILE_EVENT:
      counts[kwargs.get('fun_name', '?')] += 1

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    yield counts
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)


def _timed(fn, *args, **kwargs):
  """(seconds, result) of one call."""
  start = records.now()
  out = fn(*args, **kwargs)
  return records.now() - start, out


@dataclasses.dataclass
class _Timings:
  """What the warm-up and timed calls of both sides measured.

  times, tokens: {side: per timed call}; warmup: {side: seconds}; host_s,
  calls: the multi-turn side's host seconds and decode-loop calls per timed
  call; episodes: its last call's episodes; compiles: XLA compiles by
  jitted name over all calls, timed_compiles those of the timed calls.
  """

  times: dict
  warmup: dict
  tokens: dict
  host_s: list
  calls: list
  episodes: list
  compiles: collections.Counter
  timed_compiles: int


def episode_measurement(ctx, steps=0):
  """The multi-turn rollout against the single-turn one (docs/benchmarks.md).

  Args:
    ctx: the bench's `Context`.
    steps: C, completion columns; 0 = generation.max_generation_steps.

  Returns:
    A measurement record: ours the multi-turn rollout, peer the single-turn.
  """
  config = ctx.config
  gen = config.generation
  columns = int(steps or gen.max_generation_steps)
  prompts = ctx.prompt_tokens
  text = insert_text(config)
  insert_ids = [int(t) for t in ctx.tokenizer.encode(text)]
  turn, inserts, last = layout(columns, len(insert_ids),
                               config.agent.max_tool_calls)
  sampler = rollout.Rollout(
      ctx.session.model, ctx.tokenizer, prompts.shape[1] + columns,
      cpu_decode_graph=gen.cpu_decode_graph,
  )
  context.disable_end_tokens(sampler)
  multi = episodes.EpisodeRollout(
      sampler, lambda: Scripted(text, inserts), max_turn_tokens=turn,
      max_insert_tokens=max(8, len(insert_ids)))
  sampling = dict(temperature=gen.temperature, top_k=gen.top_k,
                  top_p=gen.top_p, num_generations=config.grpo.num_generations)
  decode_name = f'jit({getattr(multi.decode_fn, "__name__", "?")})'
  timings = _time_sides(sampler, multi, prompts, columns, sampling)
  ours, single = _summaries(timings, inserts, decode_name)
  settings = {
      'batch_size': len(prompts),
      'num_generations': sampling['num_generations'],
      'rows': len(prompts) * sampling['num_generations'],
      'prompt_length': int(prompts.shape[1]),
      'columns': columns,
      'kv_cache_size': int(prompts.shape[1]) + columns,
      'inserts': inserts,
      'insert_tokens': len(insert_ids),
      'insert_text': text,
      'turn_tokens': turn,
      'last_turn_tokens': last,
      'tool_format': config.agent.format or 'gemma3',
      'temperature': gen.temperature,
      'top_k': gen.top_k,
      'top_p': gen.top_p,
      'end_tokens': 'disabled: turns end at turn_tokens',
      'cpu_decode_graph': sampler.cpu_decode_graph,
      'backend': jax.default_backend(),
  }
  logging.info(
      'episodes: %.1f tok/s over %d turns vs %.1f tok/s in one (x%.3f); '
      '%d decode calls, host %.4f s, %d compile(s) of %s', ours['tokens_per_s'],
      inserts + 1, single['tokens_per_s'], ours['slowdown'],
      timings.calls[-1], ours['host_median_s'], ours['decode_compiles'],
      decode_name)
  multi.close()
  del multi, sampler
  gc.collect()
  return records.measurement(NAME, ['episodes'], settings, ours, single)


def _time_sides(sampler, multi, prompts, columns, sampling):
  """One warm-up call (compiles) of each side, then --steps timed calls of
  each, alternating; a `_Timings`."""
  sides = (('single', sampler), ('multi', multi))
  times = {'single': [], 'multi': []}
  warmup = {}
  tokens = {'single': [], 'multi': []}
  host_s, calls = [], []
  with _counting_compiles() as compiles:
    for side, generator in sides:  # Warm-up: compiles.
      warmup[side], _ = _timed(generator.generate, prompts, columns, 0,
                               **sampling)
    warm_compiles = sum(compiles.values())
    for rep in range(options.STEPS.value):
      for side, generator in sides:
        seconds, out = _timed(generator.generate, prompts, columns, rep + 1,
                              **sampling)
        times[side].append(seconds)
        tokens[side].append(int(out.attended.sum()))
        if side == 'multi':
          host_s.append(multi.last_host_seconds)
          calls.append(multi.last_decode_calls)
          episode_out = out
    timed_compiles = sum(compiles.values()) - warm_compiles
  return _Timings(times=times, warmup=warmup, tokens=tokens, host_s=host_s,
                  calls=calls, episodes=episode_out.episodes,
                  compiles=compiles, timed_compiles=timed_compiles)


def _summaries(timings, inserts, decode_name):
  """(ours, single): the multi-turn and single-turn sides' records."""
  t = timings
  eps = t.episodes
  single = records.step_summary(
      'rollout.Rollout.generate (one turn)', t.times['single'],
      [t.warmup['single']], records.median(t.tokens['single']),
      note='tokens: every completion column (all sampled)')
  ours = records.step_summary(
      f'episodes.EpisodeRollout.generate ({inserts + 1} turns, {inserts} '
      'inserts)', t.times['multi'], [t.warmup['multi']],
      records.median(t.tokens['multi']), breakdown={'host': t.host_s},
      note='tokens: every completion column, sampled and inserted')
  ours.update(
      # Seconds per column over the single-turn rollout's: the ratio of
      # the two measured rates.
      slowdown=single['tokens_per_s'] / ours['tokens_per_s'],
      columns_per_step=records.median(t.tokens['multi']),
      host_median_s=records.median(t.host_s),
      host_steps_s=[round(s, 6) for s in t.host_s],
      decode_calls=t.calls[-1],
      decode_calls_steps=t.calls,
      decode_program=decode_name,
      decode_compiles=t.compiles[decode_name],
      compiles_during_timed_steps=t.timed_compiles,
      turns_mean=float(np.mean([e.turns for e in eps])),
      model_tokens_mean=float(np.mean([e.model_tokens for e in eps])),
      insert_tokens_mean=float(np.mean([e.insert_tokens for e in eps])),
      finish=dict(collections.Counter(e.finish for e in eps)),
  )
  single['columns_per_step'] = records.median(t.tokens['single'])
  return ours, single
