"""Tests for agent_tunix.rl.episodes: multi-turn rollouts that pause rows,
insert an environment's text as forced tokens and resume in the same KV
cache (tiny random Gemma 3, CPU)."""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np
import pytest

from agent_tunix import models
from agent_tunix.agent import environment
from agent_tunix.data import pipeline
from agent_tunix.rl import episode_stats
from agent_tunix.rl import episodes
from agent_tunix.rl import logprobs
from agent_tunix.rl import rollout
from agent_tunix.tpu import sharding
from agent_tunix.configs import tiny

_PROMPT_LEN = 16
_STEPS = 40
PAD = pipeline.PAD_ID


_Reply = environment.Reply


class _Scripted:
  """Answers the first `len(inserts)` turns with the given texts, then
  ends the episode; records the turns it saw."""

  def __init__(self, inserts):
    self.inserts = list(inserts)
    self.seen = []
    self.tool_calls = []

  def reset(self, example):
    self.example = example

  def step(self, turn_text):
    self.seen.append(turn_text)
    if len(self.seen) <= len(self.inserts):
      self.tool_calls.append({'name': 'scripted', 'result': 'x'})
      return _Reply(self.inserts[len(self.seen) - 1], False)
    return _Reply(None, True, 'answer')


@pytest.fixture(scope='module')
def tiny_model():
  config = tiny.get_config()
  return models.build(config, sharding.make_mesh(config.mesh))


@pytest.fixture(scope='module')
def prompts(tiny_model):
  _, tokenizer = tiny_model
  return np.stack([
      pipeline.encode_prompt(text, tokenizer, _PROMPT_LEN)[0]
      for text in ('What is 2 + 3?', 'Name a colour.')
  ])


def _with_many_end_tokens(roll):
  """The tiny random model never samples <end_of_turn>: here every eighth
  token id also ends a turn, so its turns end after ~8 tokens."""
  roll.end_ids = sorted(set(roll.end_ids) | set(range(8, 262144, 8)))
  roll.sampler.eos_ids = np.array(roll.end_ids, np.int32)
  return roll


@pytest.fixture(scope='module')
def episode_rollout(tiny_model):
  model, tokenizer = tiny_model
  roll = _with_many_end_tokens(
      rollout.Rollout(model, tokenizer, cache_size=_PROMPT_LEN + _STEPS))
  envs = []

  def make():
    envs.append(_Scripted(['\n<start_of_turn>user\nresult: 42'
                           '<end_of_turn>\n<start_of_turn>model\n']))
    return envs[-1]

  return episodes.EpisodeRollout(roll, make, max_turn_tokens=16,
                                 max_insert_tokens=32), envs


def _trainer_logps(model, prompts, out, group):
  tokens = np.concatenate([np.repeat(prompts, group, axis=0), out.tokens], 1)
  input_mask = np.concatenate(
      [np.repeat(prompts, group, axis=0) != PAD, out.attended > 0], axis=1)
  logps, _ = logprobs.per_token_logps(
      model, jnp.asarray(tokens), jnp.asarray(input_mask),
      out.tokens.shape[1], chunk_size=8, group=group)
  return np.asarray(logps)


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_episode_inserts_forced_tokens_and_trainer_agrees(
    tiny_model, prompts, episode_rollout, temperature):
  model, tokenizer = tiny_model
  sampler, envs = episode_rollout
  envs.clear()
  out = sampler.generate(prompts, _STEPS, seed=3, temperature=temperature,
                         top_k=0, top_p=1.0, num_generations=2,
                         examples=[{'q': 0}, {'q': 1}])
  assert out.tokens.shape == (4, _STEPS)
  insert = [int(t) for t in tokenizer.encode(
      '\n<start_of_turn>user\nresult: 42<end_of_turn>\n'
      '<start_of_turn>model\n')]
  inserted = 0
  for i, episode in enumerate(out.episodes):
    real = out.input_mask[i] > 0
    forced = real & (out.mask[i] == 0)
    assert envs[i].example == {'q': i // 2}
    if episode.finish == 'answer':  # Two turns: the insert sits between.
      assert episode.turns == 2 and len(envs[i].seen) == 2
      ids = out.tokens[i][forced].tolist()
      assert ids == insert
      # The inserted <end_of_turn> did not end the row: it went on after.
      last_forced = np.nonzero(forced)[0][-1]
      assert out.mask[i, last_forced + 1] == 1
      assert episode.insert_tokens == len(insert)
      assert 'result: 42<end_of_turn>' in episode.transcript
      inserted += 1
    # Only real tokens up to the end; no holes; lengths count model tokens.
    last = np.nonzero(real)[0][-1]
    assert real[:last + 1].all() and not real[last + 1:].any()
    assert out.lengths[i] == out.mask[i].sum() == episode.model_tokens
    assert (out.tokens[i][~real] == PAD).all()
    assert (out.logps[i][out.mask[i] == 0] == 0).all()
  assert inserted >= 2, [e.finish for e in out.episodes]
  # The trainer's forward over [prompt | turns and inserts] gives the
  # sampler's log-probs of the policy's tokens.
  want = _trainer_logps(model, prompts, out, group=2)
  model_tokens = out.mask > 0
  np.testing.assert_allclose(out.logps[model_tokens], want[model_tokens],
                             atol=2e-4)


def test_resumed_turn_equals_a_fresh_prefill_of_the_same_ids(
    tiny_model, prompts, episode_rollout):
  """Greedy: the second turn after an insert is what the model samples from
  a prompt that already holds turn one and the insert."""
  model, tokenizer = tiny_model
  sampler, _ = episode_rollout
  out = sampler.generate(prompts[:1], _STEPS, seed=0)
  episode = out.episodes[0]
  assert episode.turns == 2, episode
  real = out.input_mask[0] > 0
  forced = np.nonzero(real & (out.mask[0] == 0))[0]
  head = out.tokens[0][:forced[-1] + 1]  # Turn one and the insert.
  rest = out.tokens[0][forced[-1] + 1:][real[forced[-1] + 1:]]
  prompt = np.concatenate([prompts[0][prompts[0] != PAD], head])
  bucket = np.full((len(prompt) + 2,), PAD, np.int32)
  bucket[2:] = prompt
  plain = _with_many_end_tokens(rollout.Rollout(
      model, tokenizer, cache_size=len(bucket) + len(rest) + 1))
  fresh = plain.generate(bucket[None], len(rest), seed=0)
  np.testing.assert_array_equal(fresh.tokens[0][:len(rest)], rest)
  np.testing.assert_allclose(fresh.logps[0][:len(rest)],
                             out.logps[0][forced[-1] + 1:][real[forced[-1] + 1:]],
                             atol=2e-4)


def test_truncate_middle_keeps_both_ends():
  ids = list(range(100))
  got = episodes.truncate_middle(ids, 12, [-1, -2])
  assert len(got) == 12 and got[:5] == [0, 1, 2, 3, 4]
  assert got[5:7] == [-1, -2] and got[7:] == [95, 96, 97, 98, 99]
  assert episodes.truncate_middle(ids[:5], 12, [-1]) == ids[:5]


class _Pausing(_Scripted):
  """Pauses on every sampled piece holding an 'e'; every second pause of
  a turn completes it (closed by <end_of_turn>), the others let it go on."""

  pause_texts = ('e',)

  def __init__(self, inserts):
    super().__init__(inserts)
    self.pauses = []

  def ends_turn(self, partial_text):
    self.pauses.append(partial_text)
    return '<end_of_turn>' if len(self.pauses) % 2 == 0 else None


def test_pause_tokens_end_turns_the_environment_calls_complete(
    tiny_model, prompts):
  model, tokenizer = tiny_model
  roll = rollout.Rollout(model, tokenizer, cache_size=_PROMPT_LEN + _STEPS)
  envs = []

  def make():
    envs.append(_Pausing(['\n<start_of_turn>user\nok<end_of_turn>\n'
                          '<start_of_turn>model\n']))
    return envs[-1]

  sampler = episodes.EpisodeRollout(roll, make, max_turn_tokens=16,
                                    max_insert_tokens=32)
  assert tokenizer.piece_to_id('▁the') in sampler._pause_ids  # pylint: disable=protected-access
  envs.clear()
  out = sampler.generate(prompts, _STEPS, seed=0, temperature=1.0, top_k=0,
                         top_p=1.0, num_generations=2)
  closing = tokenizer.piece_to_id('<end_of_turn>')
  insert = [closing] + [int(t) for t in tokenizer.encode(
      '\n<start_of_turn>user\nok<end_of_turn>\n<start_of_turn>model\n')]
  resumed = 0
  for i, episode in enumerate(out.episodes):
    env = envs[i]
    real = out.input_mask[i] > 0
    forced = real & (out.mask[i] == 0)
    # A pause that did not complete the turn let it go on: the turn the
    # environment saw holds the text of that earlier pause.
    if len(env.seen) >= 1 and len(env.pauses) >= 2:
      assert env.seen[0].startswith(env.pauses[0])
      resumed += 1
    if episode.turns == 2 and episode.finish == 'answer':
      # The closing text is inserted before the reply.
      assert out.tokens[i][forced].tolist() == insert
    last = np.nonzero(real)[0][-1]
    assert real[:last + 1].all()  # No holes.
  assert resumed >= 2, [len(e.pauses) for e in envs]
  want = _trainer_logps(model, prompts, out, group=2)
  model_tokens = out.mask > 0
  np.testing.assert_allclose(out.logps[model_tokens], want[model_tokens],
                             atol=2e-4)



class _NeverComplete(_Pausing):
  """Pauses on pieces holding an 'e' but never completes a turn: only the
  per-turn cap ends one."""

  def ends_turn(self, partial_text):
    self.pauses.append(partial_text)
    return None


class _AnswersCappedTurns(_NeverComplete):
  """As `_NeverComplete`, and a turn the cap ended is answered."""

  answers_capped_turns = True


def test_a_pause_at_the_cap_is_answered_when_the_environment_says_so(
    tiny_model, prompts):
  """answers_capped_turns (the bench's scripted episodes): a turn that
  reached the cap on a
  pause the environment did not complete is a finished turn, answered
  with the reply alone (no closing text); it used to raise TypeError."""
  model, tokenizer = tiny_model
  roll = rollout.Rollout(model, tokenizer, cache_size=_PROMPT_LEN + _STEPS)
  reply = '\n<start_of_turn>user\nok<end_of_turn>\n<start_of_turn>model\n'
  envs = []

  def make():
    envs.append(_AnswersCappedTurns([reply]))
    return envs[-1]

  sampler = episodes.EpisodeRollout(roll, make, max_turn_tokens=2,
                                    max_insert_tokens=32)
  envs.clear()
  out = sampler.generate(prompts, _STEPS, seed=0, temperature=1.0, top_k=0,
                         top_p=1.0, num_generations=2)
  insert = [int(t) for t in tokenizer.encode(reply)]
  assert any(env.pauses for env in envs)  # Some turn paused at the cap.
  for i, episode in enumerate(out.episodes):
    forced = (out.input_mask[i] > 0) & (out.mask[i] == 0)
    assert episode.finish == 'answer' and episode.turns == 2, episode
    assert out.tokens[i][forced].tolist() == insert

def test_format_transcript_one_line_per_turn_and_reply():
  episode = episodes.Episode(
      transcript='', final_text='<answer>1364</answer>', tool_calls=[],
      finish='answer', segments=[
          ('model', '[calculator(expression="44 * 31")]'),
          ('tool', "calculator(expression='44 * 31') -> 1364"),
          ('model', '<answer>1364</answer>')])
  assert episodes.format_transcript(episode).splitlines() == [
      'model: [calculator(expression="44 * 31")]',
      "tool:  calculator(expression='44 * 31') -> 1364",
      'model: <answer>1364</answer>',
  ]


def test_generate_with_tools_prints_the_transcript(tiny_model):
  from agent_tunix import generate  # pylint: disable=g-import-not-at-top
  model, tokenizer = tiny_model
  config = tiny.get_config()
  config.agent.tools = 'calculator'
  text, ids = generate.Generator(model, tokenizer, config)(
      'What is 2 + 3?', max_new_tokens=8)
  # The random model never calls: one model turn, cut at 8 tokens.
  assert text.startswith('model: ') and '\n' not in text
  assert len(ids) == 8
  plain, _ = generate.Generator(model, tokenizer)('What is 2 + 3?', 8)
  assert text == 'model: ' + plain


def _episode(finish, calls, stats, turns=2, model=10, inserted=5):
  return episodes.Episode(transcript='', final_text='', tool_calls=calls,
                          finish=finish, turns=turns, model_tokens=model,
                          insert_tokens=inserted, stats=stats)


def test_episode_stats_scalars_and_tool_use_bonus():
  batch = [
      _episode('answer', [{'name': 'calculator', 'error': None}],
               {'tool_calls': 1, 'tool_seconds': 0.25}),
      _episode('max_tool_calls', [{'name': 'calculator', 'error': 'timeout'},
                                  {'name': 'calculator', 'error': None}],
               {'tool_calls': 2, 'timeouts': 1, 'parse_errors': 1,
                'tool_seconds': 1.0}, turns=4),
      _episode('answer', [], {}, turns=1, inserted=0),
      _episode('turn_tokens', [{'name': 'x', 'error': 'unknown_tool'}],
               {'tool_calls': 1, 'unknown_tool': 1}),
  ]
  got = episode_stats.scalars(episode_stats.row_stats(batch))
  assert got['agent/turns_mean'] == 2.25 and got['agent/turns_max'] == 4
  assert got['agent/tool_calls_per_episode'] == 1.0
  assert got['agent/tool_use_rate'] == 0.75
  # 4 calls run + 1 unreadable call turn = 5 attempts.
  assert got['agent/parse_error_rate'] == pytest.approx(1 / 5)
  assert got['agent/timeout_rate'] == pytest.approx(1 / 5)
  assert got['agent/exec_error_rate'] == pytest.approx(1 / 5)
  assert got['agent/finish/answer'] == 0.5
  assert got['agent/finish/max_tool_calls'] == 0.25
  assert got['agent/finish/turn_tokens'] == 0.25
  assert got['agent/tool_tokens_mean'] == 3.75
  assert got['time/tool_s'] == 1.25
  # The bonus goes to episodes with a call that ran without error.
  np.testing.assert_allclose(
      episode_stats.tool_use_bonus(batch, 0.2), [0.2, 0.2, 0.0, 0.0])


def test_stop_texts_end_turns_and_leave_masked_holes(tiny_model, prompts):
  """With stop texts the loop runs in chunks: a turn that a stop text ended
  mid-chunk leaves the columns sampled after it as pad (holes), which the
  model never reads again and the trainer skips too."""
  model, tokenizer = tiny_model
  roll = rollout.Rollout(model, tokenizer, cache_size=_PROMPT_LEN + _STEPS,
                         stop_sequences=('e',), decode_chunk_steps=4)
  envs = []

  def make():
    envs.append(_Scripted(['\n<start_of_turn>user\nok<end_of_turn>\n'
                           '<start_of_turn>model\n']))
    return envs[-1]

  sampler = episodes.EpisodeRollout(roll, make, max_turn_tokens=16,
                                    max_insert_tokens=32)
  envs.clear()  # The one made to read its pause texts.
  out = sampler.generate(prompts, _STEPS, seed=1, temperature=1.0, top_k=0,
                         top_p=1.0, num_generations=2)
  holes = 0
  for i, episode in enumerate(out.episodes):
    real = out.input_mask[i] > 0
    last = np.nonzero(real)[0][-1]
    holes += int((~real[:last + 1]).sum())
    assert (out.tokens[i][:last + 1][~real[:last + 1]] == PAD).all()
    if episode.turns >= 2:
      assert 'e' not in envs[i].seen[0]  # The turn text ends before 'e'.
  assert holes > 0, 'no turn ended mid-chunk: the test does not test holes'
  want = _trainer_logps(model, prompts, out, group=2)
  model_tokens = out.mask > 0
  np.testing.assert_allclose(out.logps[model_tokens], want[model_tokens],
                             atol=2e-4)
