"""Tests for agent_tunix.rl.evaluation (a scripted sampler) and the evaluate CLI."""

import os
import re
import subprocess
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import json  # pylint: disable=g-import-not-at-top

import ml_collections
import numpy as np
import pytest

from agent_tunix.config import validation
from agent_tunix.rl import evaluation
from agent_tunix.rl import rollout
from agent_tunix.configs import tiny

_GOOD = '<reasoning>adds up</reasoning>\n<answer>{}</answer>'


@pytest.mark.parametrize(
    'completion, answer, expected',
    [
        ('<answer>72</answer>', '72', True),
        ('<reasoning>r</reasoning><answer>72</answer>', 72, True),
        ('<answer> 72.0 </answer>', '72', True),
        ('<answer>$72</answer>', '72', True),
        ('<answer>72.</answer>', '72', True),
        ('<answer>1,234</answer>', '1234', True),
        ('<answer>-3</answer>', '-3', True),
        ('<answer>1/2</answer>', '0.5', True),
        ('<answer>12%</answer>', '12', True),
        ('<answer>72</answer>', '73', False),
        ('<answer>-72</answer>', '72', False),
        ('72', '72', False),  # No answer block.
        ('<answer>72', '72', False),  # Cut off before </answer>.
        ('<answer>about 72</answer>', '72', False),
        ('<answer>72 or 73</answer>', '72', False),
        ('<answer></answer>', '0', False),
        ('<answer>5</answer> <answer>72</answer>', '72', False),  # First.
        ('<answer>72</answer>', 'seventy-two', False),  # Truth not a number.
    ],
)
def test_is_correct(completion, answer, expected):
  assert evaluation.is_correct(completion, answer) is expected


class _FakeTokenizer:
  """Prompt 'q<i>' -> token ids [BOS, 10 + i]."""

  def bos_id(self):
    return 2

  def encode(self, text):
    return [10 + int(text[1:])] if text.startswith('q') else [7] * len(text)


class _ScriptedSampler:
  """Stands in for rollout.Rollout: texts looked up per question.

  The question of a row is its last prompt token. Greedy calls (temperature
  0) return `greedy[i]`; sampled calls return `sampled[i][j]` for the j-th
  time question i is seen, and a correct answer once its script runs out
  (only padding rows get there, and their texts must not be counted).
  """

  def __init__(self, greedy, sampled, answers):
    self.greedy = greedy
    self.sampled = sampled
    self.answers = answers
    self.calls = []
    self._seen = {}

  def generate(self, prompt_tokens, max_steps, seed, temperature=0.0,
               top_k=0, top_p=1.0, num_generations=1):
    prompt_tokens = np.asarray(prompt_tokens)
    self.calls.append(dict(tokens=prompt_tokens.copy(), max_steps=max_steps,
                           seed=seed, temperature=temperature, top_k=top_k,
                           top_p=top_p, num_generations=num_generations))
    texts = []
    # Like Rollout: rows i*G .. i*G + G - 1 are prompt i's G samples.
    for row in np.repeat(prompt_tokens, num_generations, axis=0):
      i = int(row[-1]) - 10
      if temperature <= 0:
        texts.append(self.greedy[i])
        continue
      j = self._seen.get(i, 0)
      self._seen[i] = j + 1
      script = self.sampled[i]
      texts.append(script[j] if j < len(script)
                   else _GOOD.format(self.answers[i]))
    n = len(texts)
    return rollout.Completions(
        tokens=np.zeros((n, max_steps), np.int32),
        mask=np.zeros((n, max_steps), np.float32),
        lengths=np.zeros((n,), np.int32),
        truncated=np.ones((n,), bool),
        texts=texts,
    )


def _config(batch_size, pass_at_k):
  config = ml_collections.ConfigDict()
  config.generation = ml_collections.ConfigDict(dict(
      max_prompt_length=4, temperature=0.7, top_k=5, top_p=0.9))
  config.eval = ml_collections.ConfigDict(dict(
      batch_size=batch_size, max_generation_steps=6, pass_at_k=pass_at_k))
  config.data = ml_collections.ConfigDict(dict(thinking=False))
  return config


def _examples(answers):
  return [{'prompt': f'q{i}', 'answer': a} for i, a in enumerate(answers)]


def test_evaluate_scores_and_padded_batches():
  answers = ['4', '10', '7']
  greedy = [
      _GOOD.format(4),  # Correct, exact format.
      '<answer>10</answer>',  # Correct, not the exact format.
      _GOOD.format(8),  # Wrong, exact format.
  ]
  sampled = [
      ['no tags', 'no tags'],  # No sample correct.
      ['<answer>3</answer>', '<answer>10</answer>'],  # Second one correct.
      ['<answer>7</answer>', 'x'],  # First one correct.
  ]
  sampler = _ScriptedSampler(greedy, sampled, answers)
  config = _config(batch_size=4, pass_at_k=2)

  scores, texts, transcripts = evaluation.evaluate(
      sampler, _FakeTokenizer(), _examples(answers), config, seed=5)

  assert texts == greedy and transcripts is None
  # Standard error of 2/3 over 3 questions: sqrt(2/3 * 1/3 / 3) = 0.272.
  stderr = pytest.approx((2 / 3 * 1 / 3 / 3) ** 0.5)
  assert scores == {
      'accuracy': pytest.approx(2 / 3), 'accuracy_stderr': stderr,
      'format_accuracy': pytest.approx(2 / 3),
      'format_accuracy_stderr': stderr,
      'pass_at_k': pytest.approx(2 / 3), 'pass_at_k_stderr': stderr,
  }
  # 3 greedy questions -> one batch of 4 (1 pad). pass@2: 4 // 2 = 2
  # questions per call, each sampled twice with a shared prefill -> two
  # calls of 2 prompts (the second padded), 4 sampled rows each.
  greedy_call, *sampled_calls = sampler.calls
  assert greedy_call['tokens'].shape == (4, 4)
  assert greedy_call['num_generations'] == 1
  assert greedy_call['temperature'] == 0
  np.testing.assert_array_equal(greedy_call['tokens'][:, -1], [10, 11, 12, 12])
  assert [c['tokens'].shape for c in sampled_calls] == [(2, 4)] * 2
  np.testing.assert_array_equal(
      np.concatenate([c['tokens'][:, -1] for c in sampled_calls]),
      [10, 11, 12, 12])
  for call in sampled_calls:
    assert call['num_generations'] == 2
    assert (call['temperature'], call['top_k'], call['top_p']) == (
        0.7, 5, 0.9)
  # Two sampled batches must not share a seed (or they would repeat the
  # same random draws).
  assert sampled_calls[0]['seed'] != sampled_calls[1]['seed']
  assert all(c['max_steps'] == 6 for c in sampler.calls)
  # Prompts are BOS + ids, left padded with 0 to max_prompt_length.
  np.testing.assert_array_equal(greedy_call['tokens'][0], [0, 0, 2, 10])


def test_evaluate_pass_at_k_counts_questions_not_samples():
  answers = ['1', '2']
  # Question 0: every sample correct; question 1: none.
  sampled = [[_GOOD.format(1)] * 3, ['<answer>5</answer>'] * 3]
  sampler = _ScriptedSampler(['', ''], sampled, answers)
  scores, _, _ = evaluation.evaluate(
      sampler, _FakeTokenizer(), _examples(answers), _config(2, 3))
  assert scores == {'accuracy': 0.0, 'accuracy_stderr': 0.0,
                    'format_accuracy': 0.0, 'format_accuracy_stderr': 0.0,
                    'pass_at_k': 0.5,
                    'pass_at_k_stderr': pytest.approx(0.5 / 2 ** 0.5)}
  # k = 3 > eval.batch_size = 2: one question (3 samples) per call.
  sampled_calls = sampler.calls[1:]
  assert [(c['tokens'].shape, c['num_generations']) for c in sampled_calls
         ] == [((1, 4), 3)] * 2


def test_evaluate_without_pass_at_k_samples_greedily_only():
  sampler = _ScriptedSampler([_GOOD.format(3)], [[]], ['3'])
  scores, _, _ = evaluation.evaluate(
      sampler, _FakeTokenizer(), _examples(['3']), _config(8, 0))
  assert scores == {'accuracy': 1.0, 'accuracy_stderr': 0.0,
                    'format_accuracy': 1.0, 'format_accuracy_stderr': 0.0}
  assert len(sampler.calls) == 1
  assert sampler.calls[0]['tokens'].shape == (8, 4)


def test_evaluate_rejects_empty_and_too_long():
  sampler = _ScriptedSampler([], [], [])
  with pytest.raises(ValueError, match='num_eval_examples'):
    evaluation.evaluate(sampler, _FakeTokenizer(), [], _config(2, 0))
  long_prompt = [{'prompt': 'far too long', 'answer': '1'}]
  with pytest.raises(ValueError, match='max_prompt_length=4'):
    evaluation.evaluate(sampler, _FakeTokenizer(), long_prompt, _config(2, 0))


@pytest.mark.parametrize('hits, mean, stderr', [
    ([1, 0, 0, 0], 0.25, (0.25 * 0.75 / 4) ** 0.5),
    ([True] * 10, 1.0, 0.0),
    ([1, 0] * 128, 0.5, 0.5 / 16),  # 256 questions: +- 3.1%.
])
def test_with_stderr(hits, mean, stderr):
  assert evaluation.with_stderr('accuracy', hits) == {
      'accuracy': pytest.approx(mean), 'accuracy_stderr': pytest.approx(stderr)}


def test_format_scores_puts_each_stderr_beside_its_accuracy():
  assert evaluation.format_scores({
      'accuracy': 0.25, 'accuracy_stderr': 0.2166,
      'format_accuracy': 1.0, 'format_accuracy_stderr': 0.0,
  }) == 'accuracy 0.250 +- 0.217, format_accuracy 1.000 +- 0.000'


def test_evaluate_cli_json_has_a_stderr_for_every_accuracy():
  # The CLI on the tiny random model (the base model: --allow_base). In a
  # subprocess: the suite imports other CLIs that define --config too.
  repo = os.path.join(os.path.dirname(__file__), '..')
  out = subprocess.run(
      [sys.executable, '-m', 'agent_tunix.evaluate',
       '--config=configs/tiny.py', '--config.data.num_eval_examples=3',
       '--allow_base'],
      cwd=repo, capture_output=True, text=True, timeout=600, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result['step'] is None and result['num_questions'] == 3
  for name in ('accuracy', 'format_accuracy', 'pass_at_k'):
    p = result[name]
    assert p in (0, 1 / 3, 2 / 3, 1)
    assert result[f'{name}_stderr'] == pytest.approx((p * (1 - p) / 3) ** 0.5)
  assert len(result) == 8


def test_evaluate_cli_reads_only_the_eval_file(tmp_path):
  # A user's own test set: data.path's '{split}' names test.jsonl, and no
  # train.jsonl exists; evaluate reads only the eval split, here in tool
  # episodes and per type (the rows' 'type' field). Training still refuses
  # the missing train file up front.
  (tmp_path / 'test.jsonl').write_text(''.join(
      json.dumps({'question': f'What is {i} + 1?', 'answer': str(i + 1),
                  'type': 'sum' if i else 'first'})
      + '\n' for i in range(3)))
  path = str(tmp_path / '{split}.jsonl')
  config = tiny.get_config()
  config.data.source, config.data.path = 'jsonl', path
  with pytest.raises(validation.ConfigError, match='train.jsonl'):
    validation.validate(config)
  validation.validate(config, splits=('eval',))
  repo = os.path.join(os.path.dirname(__file__), '..')
  out = subprocess.run(
      [sys.executable, '-m', 'agent_tunix.evaluate',
       '--config=configs/tiny.py', '--config.data.source=jsonl',
       f'--config.data.path={path}', '--config.eval.pass_at_k=0',
       '--config.data.num_eval_examples=3', '--config.agent.tools=calculator', '--allow_base', '--by_type'],
      cwd=repo, capture_output=True, text=True, timeout=600, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result['num_questions'] == 3
  assert 'tool_use_rate' in result  # Scored as tool episodes.
  assert [(name, group['count']) for name, group in
          result['by_type'].items()] == [('first', 1), ('sum', 2)]
  for group in result['by_type'].values():
    assert group['accuracy'] == group['correct'] / group['count']
  assert result['by_shape'] == {'': {
      'correct': sum(g['correct'] for g in result['by_type'].values()),
      'count': 3, 'accuracy': result['accuracy']}}
  # The same counts as a table on stderr.
  assert re.search(r'^sum +\d / 2 ', out.stderr, re.M), out.stderr[-500:]
  assert re.search(r'^\(none\) +\d / 3 ', out.stderr, re.M)


def test_accuracy_by_counts_each_group_in_order_of_appearance():
  examples = [{'answer': '3', 'type': 'b'}, {'answer': '4', 'type': 'a'},
              {'answer': '5', 'type': 'b'}, {'answer': '6'}]
  texts = ['<answer>3</answer>', '<answer>4</answer>', '<answer>9</answer>',
           'no answer']
  assert evaluation.accuracy_by('type', examples, texts) == {
      'b': {'correct': 1, 'count': 2, 'accuracy': 0.5},
      'a': {'correct': 1, 'count': 1, 'accuracy': 1.0},
      '': {'correct': 0, 'count': 1, 'accuracy': 0.0},
  }
  with pytest.raises(ValueError):  # One text per example.
    evaluation.accuracy_by('type', examples, texts[:3])
