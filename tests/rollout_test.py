"""Tests for agent_tunix.rl.rollout: end-token cuts; tiny-model sampling."""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import numpy as np  # pylint: disable=g-import-not-at-top
import pytest
from tunix.models.gemma3 import model as gemma3_lib

from agent_tunix import models
from agent_tunix.data import pipeline
from agent_tunix.models import decode
from agent_tunix.models import tunix_adapter
from agent_tunix.rl import rollout
from agent_tunix.tpu import sharding
from agent_tunix.configs import tiny

EOS, END_OF_TURN = 1, 106  # Gemma 3's <eos> and <end_of_turn>.
PAD = pipeline.PAD_ID


class _IdsTokenizer:
  """decode() spells the ids out, so texts show exactly what was kept."""

  def decode(self, ids):
    return ' '.join(str(i) for i in ids)


def _cut(raw):
  return rollout.completions_from_tokens(
      np.array(raw), [EOS, END_OF_TURN], _IdsTokenizer())


def test_cut_at_first_end_token_keeps_it_in_mask_and_length():
  out = _cut([
      [5, 6, EOS, 7, 8],  # <eos> in the middle; what follows is dropped.
      [5, END_OF_TURN, EOS, 9, 9],  # The first of the two end tokens counts.
      [5, 6, 7, 8, 9],  # No end token: truncated.
      [END_OF_TURN, 3, 3, 3, 3],  # Ends at once.
      [5, 6, 7, 8, EOS],  # Ends on the last position: not truncated.
  ])
  np.testing.assert_array_equal(out.lengths, [3, 2, 5, 1, 5])
  np.testing.assert_array_equal(out.truncated,
                                [False, False, True, False, False])
  np.testing.assert_array_equal(out.mask, [
      [1, 1, 1, 0, 0],
      [1, 1, 0, 0, 0],
      [1, 1, 1, 1, 1],
      [1, 0, 0, 0, 0],
      [1, 1, 1, 1, 1],
  ])
  np.testing.assert_array_equal(out.tokens, [
      [5, 6, EOS, PAD, PAD],
      [5, END_OF_TURN, PAD, PAD, PAD],
      [5, 6, 7, 8, 9],
      [END_OF_TURN, PAD, PAD, PAD, PAD],
      [5, 6, 7, 8, EOS],
  ])
  # Texts leave the end token out.
  assert out.texts == ['5 6', '5', '5 6 7 8 9', '', '5 6 7 8']
  assert out.tokens.dtype == np.int32 and out.lengths.dtype == np.int32
  assert out.mask.dtype == np.float32
  np.testing.assert_array_equal(out.mask.sum(axis=1), out.lengths)


def test_repeat_groups_makes_contiguous_groups():
  batch = {
      'prompt': np.array(['a', 'b'], dtype=object),
      'prompt_tokens': np.array([[0, 1], [2, 3]], np.int32),
  }
  rows = rollout.repeat_groups(batch, 3)
  assert list(rows['prompt']) == ['a', 'a', 'a', 'b', 'b', 'b']
  np.testing.assert_array_equal(
      rows['prompt_tokens'], [[0, 1]] * 3 + [[2, 3]] * 3)
  assert rows['prompt_tokens'].dtype == np.int32


# ------------------------------------------------ sampling with a tiny model

_PROMPT_LEN = 16
_STEPS = 6


@pytest.fixture(scope='module')
def tiny_model():
  config = tiny.get_config()
  return models.build(config, sharding.make_mesh(config.mesh))


@pytest.fixture(scope='module')
def tiny_rollout(tiny_model):
  model, tokenizer = tiny_model
  return rollout.Rollout(model, tokenizer, cache_size=32), tokenizer


@pytest.fixture(scope='module')
def prompts(tiny_rollout):
  _, tokenizer = tiny_rollout
  rows = [
      pipeline.encode_prompt(text, tokenizer, _PROMPT_LEN)[0]
      for text in ('What is 2 + 3?', 'Name a colour.')
  ]
  return np.repeat(np.stack(rows), 2, axis=0)  # Two rows per prompt.


def test_end_token_ids_of_the_gemma_tokenizer(tiny_rollout):
  sampler, tokenizer = tiny_rollout
  assert rollout.end_token_ids(tokenizer) == [EOS, END_OF_TURN]
  assert sampler.end_ids == [EOS, END_OF_TURN]


def test_greedy_generate_is_deterministic(tiny_rollout, prompts):
  sampler, _ = tiny_rollout
  first = sampler.generate(prompts, _STEPS, seed=0)
  again = sampler.generate(prompts, _STEPS, seed=1)  # Greedy: seed unused.
  assert first.tokens.shape == (4, _STEPS)
  np.testing.assert_array_equal(first.tokens, again.tokens)
  assert first.texts == again.texts
  # The same prompt twice gives the same greedy completion.
  np.testing.assert_array_equal(first.tokens[0], first.tokens[1])
  np.testing.assert_array_equal(first.mask.sum(axis=1), first.lengths)


def test_sampling_depends_on_the_seed_only(tiny_rollout, prompts):
  sampler, _ = tiny_rollout

  def sample(seed):
    return sampler.generate(prompts, _STEPS, seed=seed, temperature=1.0,
                            top_k=0, top_p=1.0).tokens

  first = sample(7)
  np.testing.assert_array_equal(first, sample(7))
  assert not np.array_equal(first, sample(8))
  # Rows of one group share a prompt but not their random draws.
  assert not np.array_equal(first[0], first[1])


def _tunix_prefill_start(sampler):
  """A `Rollout.start` for G = 1 that runs tunix's own prefill (logits at
  every prompt position): the reference the shared prefill is held to."""

  def start(prompt_tokens, total_steps, seed, num_generations, **sampling):
    assert num_generations == 1
    state = sampler.init_state(prompt_tokens, total_steps, seed, **sampling)
    return tunix_adapter.prefill_fn(sampler.sampler)(
        sampler.params, state, None, echo=False)

  return start


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_shared_prompt_prefill_equals_repeated_rows(tiny_rollout, prompts,
                                                    temperature, monkeypatch):
  sampler, _ = tiny_rollout
  distinct = prompts[::2]  # The fixture repeats each prompt twice.
  sampling = dict(temperature=temperature, top_k=8, top_p=0.95)
  with monkeypatch.context() as patch:  # tunix's own prefill on every row.
    patch.setattr(sampler, 'start', _tunix_prefill_start(sampler))
    want = sampler.generate(prompts, _STEPS, seed=3, **sampling)
  # G = 1 runs the same last-position prefill as G > 1, not tunix's
  # all-position one.
  def all_position_prefill(*args, **kwargs):
    raise AssertionError("G = 1 ran tunix's all-position prefill")

  with monkeypatch.context() as patch:
    patch.setattr(sampler.sampler, '_compiled_prefill_fn',
                  all_position_prefill)
    single = sampler.generate(prompts, _STEPS, seed=3, **sampling)
  np.testing.assert_array_equal(single.tokens, want.tokens)
  np.testing.assert_array_equal(single.mask, want.mask)
  got = sampler.generate(distinct, _STEPS, seed=3, num_generations=2,
                         **sampling)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.mask, want.mask)
  assert got.texts == want.texts
  if temperature:  # Each row of a group draws its own tokens.
    assert not np.array_equal(got.tokens[0], got.tokens[1])
  subset = sampler.generate(distinct, _STEPS, seed=3, num_generations=2,
                            rows=[1, 2], **sampling)
  np.testing.assert_array_equal(subset.tokens, want.tokens[[1, 2]])
  with pytest.raises(ValueError, match='num_generations=0'):
    sampler.generate(distinct, _STEPS, seed=3, num_generations=0)


def test_column_decode_embedder_is_the_same_projection(tiny_rollout):
  sampler, _ = tiny_rollout
  jax = pytest.importorskip('jax')
  embedder = sampler.sampler.transformer.embedder
  assert type(embedder) is decode.ColumnDecodeEmbedder  # CPU: swapped in.
  table = embedder.input_embedding[...]
  rng = np.random.default_rng(0)
  for shape in [(1, 1), (4, 1), (2, 3), (decode.COLUMN_DECODE_MAX_ROWS, 1),
                (decode.COLUMN_DECODE_MAX_ROWS + 1, 1)]:
    x = rng.standard_normal(shape + (table.shape[1],)).astype(np.float32)
    got = np.asarray(embedder.decode(x))
    want = np.asarray(gemma3_lib.Embedder.decode(embedder, x))
    assert got.shape == shape + (table.shape[0],)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    jaxpr = str(jax.make_jaxpr(embedder.decode)(x))
    columns = (decode.COLUMN_DECODE_MIN_ROWS <= np.prod(shape) <=
               decode.COLUMN_DECODE_MAX_ROWS)
    assert ('optimization_barrier' in jaxpr) == columns, shape


def test_cpu_decode_graph_only_in_the_sampler(tiny_rollout, prompts):
  sampler, _ = tiny_rollout
  assert sampler.cpu_decode_graph
  config = tiny.get_config()
  model, tokenizer = models.build(config, sharding.make_mesh(config.mesh))
  # The caller's model keeps tunix's classes; only the sampler's graph has
  # ours (tests/decode_test.py checks that both compute the same).
  live = rollout.Rollout(model, tokenizer, cache_size=32)
  graph = live.sampler.transformer
  assert type(graph.embedder) is decode.ColumnDecodeEmbedder
  assert type(graph.layers[0].attn) is decode.DecodeStepAttention
  assert type(model.embedder) is gemma3_lib.Embedder
  assert type(model.layers[0].attn) is gemma3_lib.Attention
  plain = rollout.Rollout(model, tokenizer, cache_size=32,
                          cpu_decode_graph=False)  # The config's switch.
  assert not plain.cpu_decode_graph
  assert type(plain.sampler.transformer.embedder) is gemma3_lib.Embedder
  assert type(plain.sampler.transformer.layers[0].attn) is gemma3_lib.Attention
  for sampling in (dict(), dict(temperature=1.0, top_k=8, top_p=0.95)):
    want = plain.generate(prompts, _STEPS, seed=5, **sampling)
    got = live.generate(prompts, _STEPS, seed=5, **sampling)
    np.testing.assert_array_equal(got.tokens, want.tokens)


# ----------------------------------------------------------- stop sequences


class _PieceTokenizer:
  """decode() joins fixed pieces: stop texts can span tokens."""

  PIECES = {10: 'ab', 11: '\nQ', 12: 'uestion: 7', 13: 'x', 14: '\n',
            15: 'Question:'}

  def decode(self, ids):
    return ''.join(self.PIECES.get(i, '') for i in ids)


def test_stop_text_ends_the_completion_at_the_token_completing_it():
  stops = ('\nQuestion:',)
  raw = np.array([
      [10, 11, 12, 13, 13],  # Completed inside token 12 ('uestion: 7').
      [10, 14, 15, 13, 13],  # '\n' then 'Question:': ends at token 15.
      [10, 14, EOS, 15, 13],  # The end token comes first.
      [10, 13, 13, 13, 13],  # Neither: truncated.
      [14, 15, 14, 15, 13],  # The first occurrence counts.
  ])
  logps = -np.arange(1, 26, dtype=np.float32).reshape(5, 5) / 10
  out = rollout.completions_from_tokens(
      raw, [EOS, END_OF_TURN], _PieceTokenizer(), logps, stops)
  np.testing.assert_array_equal(out.lengths, [3, 3, 3, 5, 2])
  np.testing.assert_array_equal(out.truncated,
                                [False, False, False, True, False])
  np.testing.assert_array_equal(out.mask.sum(axis=1), out.lengths)
  np.testing.assert_array_equal(out.tokens[0], [10, 11, 12, PAD, PAD])
  np.testing.assert_array_equal(out.tokens[4], [14, 15, PAD, PAD, PAD])
  # The stop text is kept in the tokens, cut from the texts rewards score.
  assert out.texts == ['ab', 'ab', 'ab\n', 'abxxxx', '']
  np.testing.assert_array_equal(out.logps, np.where(out.mask > 0, logps, 0))
  # Without stop sequences: end tokens only.
  plain = rollout.completions_from_tokens(
      raw, [EOS, END_OF_TURN], _PieceTokenizer())
  np.testing.assert_array_equal(plain.lengths, [5, 5, 3, 5, 5])


def test_parse_stop_sequences():
  assert rollout.parse_stop_sequences('') == ()
  assert rollout.parse_stop_sequences(r'\nQuestion:|###') == (
      '\nQuestion:', '###')
  assert rollout.parse_stop_sequences(r'a\|b|c\\d\te') == ('a|b', 'c\\d\te')
  for bad, match in ((r'a||b', 'empty stop text'), ('a|', 'empty stop text'),
                     (r'a\q', 'unknown escape'), ('a\\', 'unknown escape')):
    with pytest.raises(ValueError, match=match):
      rollout.parse_stop_sequences(bad)


def test_stop_sequences_from_config():
  from agent_tunix.config import validation  # pylint: disable=g-import-not-at-top
  from agent_tunix.configs import gemma3_270m  # pylint: disable=g-import-not-at-top
  config = gemma3_270m.get_config()  # Plain few-shot template.
  assert rollout.stop_sequences_from_config(config) == ('\nQuestion:',)
  # The plain prompt's next example starts with the stop text.
  from agent_tunix.data import prompts  # pylint: disable=g-import-not-at-top
  assert '\n\nQuestion: ' in prompts.plain_prompt('q', '')
  assert rollout.stop_sequences_from_config(tiny.get_config()) == ()  # Chat.
  config.agent.tools = 'calculator'  # Tool prompts are turns: none.
  assert rollout.stop_sequences_from_config(config) == ()
  config.agent.tools = ''
  config.generation.stop_sequences = r'\n\n|END'
  assert rollout.stop_sequences_from_config(config) == ('\n\n', 'END')
  config.generation.stop_sequences = ''
  assert rollout.stop_sequences_from_config(config) == ()
  config.generation.stop_sequences = 'a||b'
  with pytest.raises(validation.ConfigError,
                     match=r"config.generation.stop_sequences='a\|\|b'"):
    validation.validate(config, num_devices=1)


def _linear_stop_end(tokenizer, row, stop):
  """Reference: the first t whose prefix's text holds `stop` (None)."""
  for t in range(len(row)):
    if stop in tokenizer.decode(row[:t + 1].tolist()):
      return t
  return None


@pytest.mark.parametrize('cpu_graph', [True, False])
def test_stop_sequences_on_the_tiny_model(tiny_model, tiny_rollout, prompts,
                                          cpu_graph):
  """Stop texts the tiny model emits end its completions at the exact token,
  and the chunked decode loop stops early without compiling again."""
  model, tokenizer = tiny_model
  sampler, _ = tiny_rollout
  steps = 12
  free = sampler.generate(prompts, steps, seed=0)  # Greedy, no stops.
  assert free.lengths.min() > 4  # No end token early: the stops end rows.
  # One stop text per distinct prompt (rows 0 and 2), from tokens 2..3.
  cut_texts = tuple(tokenizer.decode(free.tokens[r, 2:4].tolist())
                for r in (0, 2))
  assert all(cut_texts), cut_texts
  stopping = rollout.Rollout(
      model, tokenizer, cache_size=32, cpu_decode_graph=cpu_graph,
      stop_sequences=cut_texts, decode_chunk_steps=2)
  assert stopping.cpu_decode_graph == cpu_graph
  decode_loop = stopping.sampler._compiled_decode_fn  # pylint: disable=protected-access
  limits = []

  def counted(params, state):
    limits.append(int(state.total_sampling_steps))
    return decode_loop(params, state)

  stopping.sampler._compiled_decode_fn = counted  # pylint: disable=protected-access
  out = stopping.generate(prompts, steps, seed=0)
  ends = []
  for r in range(len(prompts)):
    want = min(_linear_stop_end(tokenizer, free.tokens[r], s) or steps
               for s in cut_texts)
    assert want <= 3
    ends.append(want)
    assert out.lengths[r] == want + 1, r
    np.testing.assert_array_equal(out.tokens[r, :want + 1],
                                  free.tokens[r, :want + 1])
    assert (out.tokens[r, want + 1:] == PAD).all()
    assert (out.mask[r, want + 1:] == 0).all()
    assert (out.logps[r, want + 1:] == 0).all()
    assert not any(cut in out.texts[r] for cut in cut_texts)
    text = tokenizer.decode(free.tokens[r, :want + 1].tolist())
    assert text.startswith(out.texts[r])
  assert not out.truncated.any()
  # The prefill samples token 0; chunk k (2 steps) samples up to token 2k.
  # The loop stops after the chunk in which the last row ended, not after
  # all 6, and every chunk ran the one compiled loop.
  prompt_len = prompts.shape[1]
  chunks = max(1, -(-max(ends) // 2))
  assert limits == [prompt_len + 2 * (k + 1) for k in range(chunks)]
  assert decode_loop._cache_size() == 1  # pylint: disable=protected-access
