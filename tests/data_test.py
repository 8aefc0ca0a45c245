"""Tests for agent_tunix.data: synthetic, gsm8k, prompts and pipeline."""

import json
import logging
import re
import zlib

import grain
import numpy as np
import orbax.checkpoint as ocp
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent_tunix.agent import calculator
from agent_tunix.data import gsm8k
from agent_tunix.data import pipeline
from agent_tunix.data import prompts
from agent_tunix.data import synthetic
from agent_tunix.configs import base

_EQUATION = re.compile(r'(\d+) ([-+*/]) (\d+) = (\d+)')


class WordTokenizer:
  """One id per whitespace-separated word; BOS is 2, pad is 0."""

  def encode(self, text):
    return [3 + zlib.crc32(w.encode()) % 5000 for w in text.split()]

  def bos_id(self):
    return 2


def _train_iterator(config, *args):
  """The train iterator of `config` (a Gemma 3 preset: its turns)."""
  return pipeline.make_train_iterator(config, WordTokenizer(), *args,
                                      turns='gemma3')


def _config(**data):
  config = base.get_config()
  config.data.num_train_examples = 64
  config.data.num_eval_examples = 16
  config.data.num_epochs = 1
  config.training.batch_size = 4
  for key, value in data.items():
    setattr(config.data, key, value)
  return config


def test_tool_prompts_are_turns_with_instructions_and_worked_calls():
  config = _config(template='plain')
  config.agent.tools = 'calculator'
  question = 'A van carries 312 crates of 24 cans. How many cans?'
  prompt = prompts.format_prompt(question, config, 'gemma3')
  # A short tool list opens the first user turn (the worked episodes show
  # the answer format: no system prompt).
  assert prompt.startswith('<start_of_turn>user\nTools (each result comes '
                           'back in the next turn):\ncalculator(')
  assert 'calculator(expression): Evaluates' in prompt
  assert config.data.system_prompt not in prompt
  # Three worked episodes (a call, its result, the answer), then the
  # question and the opened model turn.
  assert prompt.count('[calculator(expression="') == 3
  assert prompt.count('<tool_response>\n') == 3
  assert prompt.count('<start_of_turn>model\n') == 7
  assert prompt.endswith(
      f'<start_of_turn>user\n{question}<end_of_turn>\n<start_of_turn>model\n')
  for shot in prompts.TOOL_FEW_SHOT_EXAMPLES:  # The results are right.
    expression = shot[1][0][1]['expression']
    assert calculator.calculator(expression) == shot[2][0] == shot[4]
  # 'chat' (instruction-tuned presets): the system prompt and the format's
  # instructions, no worked calls.
  config.data.template = 'chat'
  prompt = prompts.format_prompt(question, config, 'gemma3')
  assert prompt.startswith('<start_of_turn>user\n' + config.data.system_prompt)
  assert 'calculator(expression: str)' in prompt
  assert prompt.count('[calculator(expression="') == 1  # The example only.
  assert prompt.count('<start_of_turn>user\n') == 1


def test_gemma4_tool_prompts_use_its_turns_and_tool_tokens():
  config = _config(template='chat')
  config.model.preset = 'gemma4_e2b_it'
  config.agent.tools, config.agent.format = 'calculator', 'gemma4'
  question = 'A van carries 312 crates of 24 cans. How many cans?'
  prompt = prompts.format_prompt(question, config, 'gemma4')
  # A system turn with the system prompt and, right after it, the
  # declarations; then the question, and the model turn opens with an empty
  # thought block (thinking off), as Gemma 4's chat template writes it
  # (tests/side/gemma4_vocab_check.py); nothing of Gemma 3's turns.
  assert prompt.startswith('<|turn>system\n' + config.data.system_prompt
                           + '<|tool>declaration:calculator{description:<|"|>')
  assert prompt.endswith(
      f'<tool|><turn|>\n<|turn>user\n{question}<turn|>\n<|turn>model\n'
      '<|channel>thought\n<channel|>')
  assert '<start_of_turn>' not in prompt and '<end_of_turn>' not in prompt
  config.data.thinking = True
  thinking = prompts.format_prompt(question, config, 'gemma4')
  assert thinking.startswith(
      '<|turn>system\n<|think|>\n' + config.data.system_prompt)
  assert thinking.endswith(f'{question}<turn|>\n<|turn>model\n')
  # 'plain' (pretrained): the worked episodes in Gemma 4's tokens.
  config.data.template, config.data.thinking = 'plain', False
  prompt = prompts.format_prompt(question, config, 'gemma4')
  assert prompt.startswith('<|turn>system\nTools (each result comes back')
  assert prompt.count('<|tool_call>call:calculator{expression:<|"|>') == 3
  assert ('<tool_call|><|tool_response>response:calculator{value:<|"|>187'
          '<|"|>}<tool_response|><reasoning>187 cards.</reasoning>'
          '<answer>187</answer><turn|>\n') in prompt
  assert '<start_of_turn>' not in prompt

def _questions(batch):
  return list(batch['question'])


def _check_equations(reasoning):
  """Checks every 'a op b = c' in a worked solution; returns the last c."""
  equations = _EQUATION.findall(reasoning)
  assert equations, reasoning
  for a, op, b, c in equations:
    a, b, c = int(a), int(b), int(c)
    expected = {'+': a + b, '-': a - b, '*': a * b, '/': a / b}[op]
    assert expected == c, reasoning
  return int(equations[-1][3])


# ------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic_by_seed():
  first = synthetic.generate('train', 200, difficulty=2, seed=3)
  again = synthetic.generate('train', 200, difficulty=2, seed=3)
  other = synthetic.generate('train', 200, difficulty=2, seed=4)
  assert first == again
  assert [e['question'] for e in first] != [e['question'] for e in other]


@pytest.mark.parametrize('difficulty', [1, 2, 3, 4])
def test_synthetic_splits_are_disjoint_and_unique(difficulty):
  train = {
      e['question']
      for seed in (0, 1)
      for e in synthetic.generate('train', 1500, difficulty, seed)
  }
  evals = [e['question'] for e in synthetic.generate('eval', 300, difficulty)]
  assert len(train) > 2900  # Two seeds give mostly different problems.
  assert len(set(evals)) == len(evals)
  assert not train & set(evals)


@pytest.mark.parametrize('difficulty', [1, 2, 3, 4])
def test_synthetic_answers_follow_the_worked_solution(difficulty):
  for example in synthetic.generate('train', 300, difficulty, seed=7):
    answer = int(example['answer'])
    assert example['answer'] == str(answer) and answer >= 0
    assert _check_equations(example['reasoning']) == answer
    assert example['reasoning'].endswith(f'The answer is {answer}.')


def test_synthetic_templates_rederived_from_question():
  rng = np.random.default_rng(0)
  for _ in range(50):
    for level in (1, 2, 3, 4):
      ex, _ = synthetic.make_example(rng, 'price_quantity', level)
      q, p = map(int, re.search(r'buys (\d+) .* \$(\d+) each', ex['question'])
                 .groups())
      assert int(ex['answer']) == q * p

      ex, _ = synthetic.make_example(rng, 'share', level)
      total, k = map(int, re.search(r'has (\d+) .* among (\d+) friends',
                                    ex['question']).groups())
      assert total % k == 0 and int(ex['answer']) == total // k

      ex, _ = synthetic.make_example(rng, 'change', level)
      q, p, bill = map(int, re.search(
          r'buys (\d+) .* at \$(\d+) each .* \$(\d+) bill', ex['question']
      ).groups())
      assert bill > q * p and int(ex['answer']) == bill - q * p

      ex, _ = synthetic.make_example(rng, 'trip', level)
      legs = re.findall(r'at (\d+) kilometers per hour for (\d+)',
                        ex['question'])
      assert len(legs) == 2
      assert int(ex['answer']) == sum(int(s) * int(t) for s, t in legs)


def test_calculator_difficulty_needs_big_multi_step_arithmetic():
  examples = synthetic.generate('train', 300, difficulty=4, seed=1)
  for example in examples:
    steps = re.findall(r'(\d+) [-+*/] (\d+) =', example['reasoning'])
    assert 2 <= len(steps) <= 3, example
    # Every problem multiplies a 2-digit number by at least a 2-digit one
    # and has a 3- or 4-digit operand somewhere.
    assert any(len(a) >= 3 or len(b) >= 3 for a, b in steps), example
    assert any(min(len(a), len(b)) >= 2 for a, b in steps), example


def test_distractors_add_numbers_but_keep_the_answer():
  plain, key = synthetic.make_example(np.random.default_rng(5), 'wage', 3, 0)
  noisy, key2 = synthetic.make_example(np.random.default_rng(5), 'wage', 3, 2)
  assert key == key2 and plain['answer'] == noisy['answer']
  numbers = lambda text: len(re.findall(r'\d+', text))
  assert numbers(noisy['question']) == numbers(plain['question']) + 2



def _letters(expression):
  """'(286 * 12) - 4' -> '(a * b) - c': numbers become letters in order."""
  names = iter('abcdefgh')
  return re.sub(r'\d+', lambda _: next(names), expression)


def test_unseen_shapes_are_new_to_training_and_to_the_worked_episodes():
  trained = {t for level in synthetic.LEVEL_TEMPLATES.values() for t in level}
  assert not trained & set(synthetic.UNSEEN_TEMPLATES)
  shown = {_letters(shot[1][0][1]['expression'])
           for shot in prompts.TOOL_FEW_SHOT_EXAMPLES}
  assert shown == {'a + b * c - d', 'a * b + c * d', 'a * b * c - d'}
  unseen = {synthetic.SHAPES[t] for t in synthetic.UNSEEN_TEMPLATES}
  assert len(unseen) == len(synthetic.UNSEEN_TEMPLATES)
  assert not unseen & (shown | {synthetic.SHAPES[t] for t in trained})
  evals = synthetic.generate('eval', 300, 4, unseen=True)
  assert {e['type'] for e in evals} == set(synthetic.UNSEEN_TEMPLATES)
  train = synthetic.generate('train', 1500, 4, unseen=True)
  assert not {e['question'] for e in train} & {e['question'] for e in evals}
  for example in evals + train:
    answer = int(example['answer'])
    assert answer >= 0 and _check_equations(example['reasoning']) == answer
    assert example['shape'] == synthetic.SHAPES[example['type']]


@pytest.mark.parametrize('template', synthetic.UNSEEN_TEMPLATES)
def test_unseen_shape_with_the_question_numbers_gives_the_answer(template):
  rng = np.random.default_rng(11)
  for level in (2, 3, 4):
    for _ in range(30):
      example, _ = synthetic.make_example(rng, template, level)
      numbers = iter(re.findall(r'\d+', example['question']))
      expression = re.sub(r'[a-d]', lambda _: next(numbers),
                          example['shape'])
      assert next(numbers, None) is None, example
      assert calculator.calculator(expression) == example['answer'], (
          expression, example)


def test_synthetic_examples_name_their_type_and_shape():
  for example in synthetic.generate('eval', 50, 4):
    assert example['type'] in synthetic.LEVEL_TEMPLATES[4]
    assert example['shape'] == synthetic.SHAPES[example['type']]
  config = _config(source='synthetic_unseen', difficulty=4)
  records = pipeline.eval_examples(config, WordTokenizer(), turns='gemma3')
  assert len(records) == 16
  for record in records:
    assert record['type'] in synthetic.UNSEEN_TEMPLATES
    assert record['shape'] == synthetic.SHAPES[record['type']]

def test_synthetic_templates_choose_what_both_splits_draw():
  config = _config(difficulty=4, synthetic_templates='total, bake_share')
  train = pipeline.load_examples(config, 'train')
  evals = pipeline.load_examples(config, 'eval')
  assert {e['type'] for e in train} == {'total', 'bake_share'}
  assert {e['type'] for e in evals} == {'total', 'bake_share'}
  assert not {e['question'] for e in train} & {e['question'] for e in evals}
  # The unseen source keeps its own templates.
  config.data.source = 'synthetic_unseen'
  unseen = pipeline.load_examples(config, 'eval')
  assert {e['type'] for e in unseen} <= set(synthetic.UNSEEN_TEMPLATES)
  # Empty means the difficulty's own.
  config = _config(difficulty=4, synthetic_templates='')
  assert {e['type'] for e in pipeline.load_examples(config, 'eval')} <= set(
      synthetic.LEVEL_TEMPLATES[4])
  with pytest.raises(ValueError, match=r"\['totals'\].*synthetic_templates"):
    pipeline.load_examples(_config(synthetic_templates='total,totals'), 'eval')
  with pytest.raises(ValueError, match='synthetic_unseen'):
    synthetic.generate('eval', 4, 4, unseen=True, templates=('total',))


def test_synthetic_rejects_bad_arguments():
  with pytest.raises(ValueError, match='difficulty'):
    synthetic.generate('train', 10, difficulty=5)
  with pytest.raises(ValueError, match='split'):
    synthetic.generate('valid', 10)
  with pytest.raises(ValueError, match='num_train_examples'):
    synthetic.generate('train', 0)


# ----------------------------------------------------------------- gsm8k


@pytest.mark.parametrize('raw, expected', [
    ('Half of 2,468 is 1,234.\n#### 1,234', '1234'),
    ('#### 72 ', '72'),
    ('a #### b\n####  -5', '-5'),
    ('  42\n', '42'),
    (7, '7'),
    (7.0, '7'),
    (b'x #### 9', '9'),
])
def test_parse_answer(raw, expected):
  assert gsm8k.parse_answer(raw) == expected


def test_gsm8k_rows_keep_their_worked_solution():
  row = gsm8k.example('Q?', 'Half is <<48/2=24>>24.\n#### 24')
  assert row == {'question': 'Q?', 'answer': '24',
                 'reasoning': 'Half is <<48/2=24>>24.'}
  # No solution before '####' (or no '####'): no 'reasoning' key.
  assert gsm8k.example('Q?', '#### 24') == {'question': 'Q?', 'answer': '24'}
  assert gsm8k.example('Q?', '24') == {'question': 'Q?', 'answer': '24'}


def _rows(n, prefix='Q'):
  return [{'problem': f'{prefix}{i} how many?',
           'solution': f'work\n#### {i * 1234:,}', 'other': i}
          for i in range(n)]


def _write_jsonl(path, rows):
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))


def _write_parquet(path, rows):
  pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.mark.parametrize('fmt, writer', [('jsonl', _write_jsonl),
                                         ('parquet', _write_parquet)])
def test_local_files_with_custom_columns(tmp_path, fmt, writer):
  writer(tmp_path / f'train.{fmt}', _rows(30, 'T'))
  writer(tmp_path / f'test.{fmt}', _rows(5, 'E'))
  config = _config(source=fmt, path=str(tmp_path / ('{split}.' + fmt)),
                   prompt_column='problem', answer_column='solution',
                   num_train_examples=20, num_eval_examples=0)
  train = pipeline.load_examples(config, 'train')
  evals = pipeline.load_examples(config, 'eval')
  assert [e['question'] for e in train] == [
      f'T{i} how many?' for i in range(20)
  ]
  assert [e['answer'] for e in train[:3]] == ['0', '1234', '2468']
  assert [e['question'] for e in evals] == [f'E{i} how many?' for i in range(5)]


def test_single_file_holds_out_its_last_rows(tmp_path):
  _write_jsonl(tmp_path / 'all.jsonl', _rows(10))
  config = _config(source='jsonl', path=str(tmp_path / 'all.jsonl'),
                   prompt_column='problem', answer_column='solution',
                   num_train_examples=0, num_eval_examples=3)
  train = [e['question'] for e in pipeline.load_examples(config, 'train')]
  evals = [e['question'] for e in pipeline.load_examples(config, 'eval')]
  assert train == [f'Q{i} how many?' for i in range(7)]
  assert evals == [f'Q{i} how many?' for i in range(7, 10)]


class _Warnings(logging.Handler):
  """Collects the absl logger's warnings (it may not propagate to caplog)."""

  def __init__(self):
    super().__init__(logging.WARNING)
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())


def test_a_file_serving_both_splits_is_read_and_reported_once(tmp_path,
                                                               monkeypatch):
  path = tmp_path / 'all.jsonl'
  rows = _rows(10) + [{'problem': '', 'solution': '#### 1'}]
  _write_jsonl(path, rows)
  config = _config(source='jsonl', path=str(path), prompt_column='problem',
                   answer_column='solution', bad_rows='skip',
                   num_train_examples=0, num_eval_examples=3)
  reads = []
  read_jsonl = gsm8k.read_jsonl
  monkeypatch.setattr(gsm8k, 'read_jsonl',
                      lambda p: reads.append(p) or read_jsonl(p))
  handler = _Warnings()
  absl_logger = logging.getLogger('absl')
  absl_logger.addHandler(handler)
  try:
    # As training reads it: the eval split, then the train split.
    evals = pipeline.load_examples(config, 'eval')
    train = pipeline.load_examples(config, 'train')
  finally:
    absl_logger.removeHandler(handler)
  assert len(evals) == 3 and len(train) == 7
  skipped = [m for m in handler.messages if m.startswith('Skipped')]
  assert skipped == [f'Skipped 1 of 11 rows of {path} with an empty '
                     'question or an answer without a number '
                     "(data.bad_rows='skip')."]
  assert reads == [str(path)]
  # A changed file is read again.
  _write_jsonl(path, rows[:5] + rows[-1:] + rows[:1])
  assert len(pipeline.load_examples(config, 'train')) == 3
  assert len(reads) == 2


def test_plain_answers_and_missing_columns(tmp_path):
  path = tmp_path / 'plain.jsonl'
  _write_jsonl(path, [{'q': 'one?', 'a': ' 1 '}, {'q': 'two?', 'a': 2}])
  rows = gsm8k.load_file(str(path), 'jsonl', prompt_column='q',
                         answer_column='a')
  assert rows == [{'question': 'one?', 'answer': '1'},
                  {'question': 'two?', 'answer': '2'}]
  with pytest.raises(ValueError,
                     match=r"\['question', 'answer'\].*prompt_column"):
    gsm8k.load_file(str(path), 'jsonl')
  with pytest.raises(FileNotFoundError, match='data.path'):
    gsm8k.load_file(str(tmp_path / 'missing.jsonl'), 'jsonl')


def test_network_source_failure_names_offline_fix(monkeypatch):
  datasets = pytest.importorskip('datasets')

  def offline(*args, **kwargs):
    raise ConnectionError('no route to host')

  monkeypatch.setattr(datasets, 'load_dataset', offline)
  with pytest.raises(RuntimeError, match=r"(?s)openai/gsm8k.*no route.*"
                     r"data.source='jsonl'.*'synthetic'"):
    pipeline.load_examples(_config(source='gsm8k_hf'), 'train')


# ---------------------------------------------------------------- mixture


def test_proportional_counts_sum_exactly():
  assert pipeline.proportional_counts([0.7, 0.3], 10) == [7, 3]
  assert pipeline.proportional_counts([1, 1, 1], 10) == [4, 3, 3]
  assert pipeline.proportional_counts([2, 1], 7) == [5, 2]


def test_mixture_proportions(tmp_path):
  _write_jsonl(tmp_path / 'train.jsonl', _rows(50, 'F'))
  _write_jsonl(tmp_path / 'test.jsonl', _rows(50, 'G'))
  config = _config(source='synthetic:0.75, jsonl:0.25',
                   path=str(tmp_path / '{split}.jsonl'),
                   prompt_column='problem', answer_column='solution',
                   num_train_examples=40, num_eval_examples=8)
  train = pipeline.load_examples(config, 'train')
  from_file = [e for e in train if e['question'].startswith('F')]
  assert len(train) == 40 and len(from_file) == 10
  assert pipeline.load_examples(config, 'train') == train  # Deterministic.
  evals = pipeline.load_examples(config, 'eval')
  assert sum(e['question'].startswith('G') for e in evals) == 2
  assert len(evals) == 8


def test_mixture_too_small_and_bad_sources(tmp_path):
  _write_jsonl(tmp_path / 'train.jsonl', _rows(3))
  config = _config(source='synthetic:1,jsonl:1',
                   path=str(tmp_path / '{split}.jsonl'),
                   prompt_column='problem', answer_column='solution')
  with pytest.raises(ValueError, match=r"'jsonl' has 3 train examples"):
    pipeline.load_examples(config, 'train')
  for bad in ('nope', 'synthetic:-1', 'synthetic:x', 'synthetic,synthetic'):
    with pytest.raises(ValueError, match='data.source|twice'):
      pipeline.parse_source(bad)


# ---------------------------------------------------------------- prompts


def test_template_selection():
  config = _config(template='auto', system_prompt='Be brief.')
  config.model.preset = 'gemma3_1b_it'
  assert prompts.resolve_template(config) == 'chat'
  assert prompts.format_prompt('What is 2 + 2?', config, 'gemma3') == (
      '<start_of_turn>user\nBe brief.\n\nWhat is 2 + 2?<end_of_turn>\n'
      '<start_of_turn>model\n'
  )
  for preset in ('gemma3_1b_pt', 'gemma3_270m', 'tiny'):
    config.model.preset = preset
    assert prompts.resolve_template(config) == 'plain'
  config.data.template = 'chat'
  assert prompts.resolve_template(config) == 'chat'
  config.data.template = 'fancy'
  with pytest.raises(ValueError, match='data.template'):
    prompts.resolve_template(config)


def test_plain_template_is_few_shot_in_answer_format():
  config = _config(template='plain', system_prompt='Be brief.')
  text = prompts.format_prompt('What is 2 + 2?', config, 'gemma3')
  assert text.startswith('Be brief.\n\nQuestion: ')
  assert text.endswith('\n\nQuestion: What is 2 + 2?\nAnswer:\n')
  shots = re.findall(r'<reasoning>(.+?)</reasoning><answer>(\d+)</answer>',
                     text)
  assert len(shots) == 2
  for reasoning, answer in shots:
    assert _check_equations(reasoning) == int(answer)


# --------------------------------------------------------------- pipeline


def test_batches_are_left_padded_token_arrays():
  config = _config()
  iterator, stats = _train_iterator(config)
  assert stats['num_train_examples'] == 64
  assert stats['steps_per_epoch'] == 16 and stats['num_batches'] == 16
  batch = next(iterator)
  length = config.generation.max_prompt_length
  assert batch['prompt_tokens'].dtype == np.int32
  assert batch['prompt_tokens'].shape == (4, length)
  assert batch['prompt_mask'].dtype == bool
  for key in ('prompt', 'question', 'answer', 'reasoning'):
    assert batch[key].dtype == object and batch[key].shape == (4,)
  for row in range(4):
    # The synthetic problems' worked solutions ride along (tool_steps
    # reads them).
    assert batch['reasoning'][row].endswith(
        f'The answer is {batch["answer"][row]}.')
    tokens, mask = batch['prompt_tokens'][row], batch['prompt_mask'][row]
    n = int(mask.sum())
    assert mask[length - n:].all() and not mask[:length - n].any()
    assert (tokens[:length - n] == 0).all()
    expected = [2] + WordTokenizer().encode(batch['prompt'][row])
    assert tokens[length - n:].tolist() == expected
    assert batch['question'][row] in batch['prompt'][row]


def test_long_prompts_are_dropped_and_counted(caplog):
  config = _config(template='chat', difficulty=3)
  config.generation.max_prompt_length = 70
  examples = pipeline.load_examples(config, 'train')
  lengths = [len(prompts.format_prompt(e['question'], config,
                                       'gemma3').split()) + 1
             for e in examples]
  expected = sum(n > 70 for n in lengths)
  assert 0 < expected < len(examples) - 4
  with caplog.at_level(logging.WARNING):
    iterator, stats = _train_iterator(config)
  assert stats['dropped_long_prompts'] == expected
  assert stats['num_train_examples'] == len(examples) - expected
  assert 'Dropped %d of 64 train prompts' % expected in caplog.text
  for batch in iterator:
    assert batch['prompt_mask'].sum(axis=1).max() <= 70
  evals = pipeline.eval_examples(config, WordTokenizer(), turns='gemma3')
  assert all(len(e['prompt'].split()) + 1 <= 70 for e in evals)
  config.generation.max_prompt_length = 10
  with pytest.raises(ValueError, match='max_prompt_length=10'):
    _train_iterator(config)


def test_process_shards_are_disjoint_and_cover_the_data():
  config = _config(num_train_examples=32, num_epochs=2)
  config.training.batch_size = 8
  single = [_questions(b) for b in
            _train_iterator(config)[0]]
  shards = [[_questions(b) for b in
             _train_iterator(config, p, 2)[0]]
            for p in range(2)]
  assert len(single) == 8 and [len(s) for s in shards] == [8, 8]
  everything = {e['question'] for e in pipeline.load_examples(config, 'train')}
  for step in range(8):
    first, second = shards[0][step], shards[1][step]
    assert len(first) == len(second) == 4
    assert set(first + second) == set(single[step])
  for epoch in range(2):  # Each pass: disjoint shards, together everything.
    first = sum(shards[0][epoch * 4:(epoch + 1) * 4], [])
    second = sum(shards[1][epoch * 4:(epoch + 1) * 4], [])
    assert not set(first) & set(second)
    assert set(first) | set(second) == everything
  assert sum(single[:4], []) != sum(single[4:], [])  # Reshuffled per epoch.
  with pytest.raises(ValueError, match='batch_size=8.*process count 3'):
    _train_iterator(config, 0, 3)


def _assert_same_batches(got, want):
  assert len(got) == len(want)
  for a, b in zip(got, want):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])


def test_iterator_state_restores_exactly():
  config = _config(num_epochs=3)
  iterator, _ = _train_iterator(config)
  for _ in range(14):  # Into the second epoch.
    next(iterator)
  state = iterator.get_state()
  want = [next(iterator) for _ in range(5)]
  fresh, _ = _train_iterator(config)
  first = next(fresh)
  fresh.set_state(state)
  got = [next(fresh) for _ in range(5)]
  _assert_same_batches(got, want)
  assert _questions(first) != _questions(got[0])


def test_iterator_restores_through_orbax(tmp_path):
  config = _config()
  iterator, _ = _train_iterator(config)
  for _ in range(3):
    next(iterator)
  with ocp.CheckpointManager(tmp_path / 'ckpt') as manager:
    manager.save(3, args=ocp.args.Composite(
        data=grain.checkpoint.CheckpointSave(iterator)))
    manager.wait_until_finished()
  want = [next(iterator) for _ in range(4)]
  fresh, _ = _train_iterator(config)
  with ocp.CheckpointManager(tmp_path / 'ckpt') as manager:
    restored = manager.restore(3, args=ocp.args.Composite(
        data=grain.checkpoint.CheckpointRestore(fresh)))
  got = [next(restored.data) for _ in range(4)]
  _assert_same_batches(got, want)


def test_eval_examples_are_held_out():
  config = _config(num_train_examples=300, num_eval_examples=40)
  config.model.preset = 'gemma3_1b_it'
  evals = pipeline.eval_examples(config, WordTokenizer(), turns='gemma3')
  assert len(evals) == 40
  assert set(evals[0]) == {'prompt', 'question', 'answer', 'type', 'shape'}
  assert evals[0]['prompt'].startswith('<start_of_turn>user\n')
  train = {e['question'] for e in pipeline.load_examples(config, 'train')}
  assert not train & {e['question'] for e in evals}


def test_bad_rows_are_refused_by_default_or_skipped_and_counted(tmp_path,
                                                                 caplog):
  path = tmp_path / 'rows.jsonl'
  path.write_text('\n'.join([
      '{"question": "What is 2+2?", "answer": "4"}',
      '',
      '{"question": null, "answer": null}',
      '{"question": "How many?", "answer": "seven"}',
      '{"question": "  ", "answer": "3"}',
      '{"question": "What is 3+3?", "answer": "#### 6"}',
  ]) + '\n')
  with pytest.raises(ValueError) as error:
    gsm8k.load_file(str(path))
  message = str(error.value)
  assert f'{path} line 3: its question is empty' in message
  assert "data.bad_rows='skip'" in message
  rows = gsm8k.load_file(str(path), bad_rows='skip')
  assert rows == [{'question': 'What is 2+2?', 'answer': '4'},
                  {'question': 'What is 3+3?', 'answer': '6'}]
  assert 'Skipped 3 of 5 rows' in caplog.text
  path.write_text('{"question": "How many?", "answer": "seven"}\n')
  with pytest.raises(ValueError, match="line 1: its answer 'seven' has no"):
    gsm8k.load_file(str(path))
