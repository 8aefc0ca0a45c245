"""Tests for where data comes from and what a prompt shows before it.

GSM8K from a local copy of the Hugging Face dataset's files (offline), the
data opened before a model loads (agent_tunix.data.opening) in every
command, data.few_shot, and `main --print_prompts`.
"""

import importlib
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent_tunix.configs import base
from agent_tunix.data import few_shot
from agent_tunix.data import opening
from agent_tunix.data import pipeline
from agent_tunix.data import prompts
from agent_tunix.run import preview

_REPO = pathlib.Path(__file__).resolve().parents[1]
_NO_TENSORFLOW = importlib.util.find_spec('tensorflow') is None
# Non-arithmetic questions with numeric answers (a user's own data).
_GEOGRAPHY = (
    ('How many countries border Germany?', '9'),
    ('How many states does Australia have?', '6'),
    ('In what year did the Berlin Wall fall?', '1989'),
    ('How many time zones does Russia span?', '11'),
)


class WordTokenizer:
  """One id per whitespace-separated word; BOS is 2."""

  def encode(self, text):
    return [3 + zlib.crc32(w.encode()) % 5000 for w in text.split()]

  def bos_id(self):
    return 2


def _config(**data):
  config = base.get_config()
  config.data.num_train_examples = 0
  config.data.num_eval_examples = 0
  config.data.num_epochs = 1
  config.training.batch_size = 2
  for key, value in data.items():
    setattr(config.data, key, value)
  return config


def _write_jsonl(path, rows):
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))


def _geography(directory, count=12):
  for split in ('train', 'test'):
    _write_jsonl(directory / f'{split}.jsonl', [
        {'question': f'{q} ({split} {i})', 'answer': a}
        for i, (q, a) in enumerate(_GEOGRAPHY * (count // len(_GEOGRAPHY)))])
  return str(directory / '{split}.jsonl')


def _gsm8k_copy(directory, rows_per_split=6):
  """A copy of openai/gsm8k as the Hub lays out its files."""
  (directory / 'main').mkdir(parents=True)
  for split in ('train', 'test'):
    pq.write_table(pa.table({
        'question': [f'{split} problem {i}: what is {i} + 2?'
                     for i in range(rows_per_split)],
        'answer': [f'{i} + 2 = <<{i}+2={i + 2}>>{i + 2}\n#### {i + 2:,}'
                   for i in range(rows_per_split)],
    }), directory / 'main' / f'{split}-00000-of-00001.parquet')
  return str(directory)


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
  for name in ('HF_DATASETS_OFFLINE', 'HF_HUB_OFFLINE'):
    monkeypatch.setenv(name, '1')
  monkeypatch.setenv('HF_DATASETS_CACHE', str(tmp_path / 'hf_cache'))


# -------------------------------------------------------------- sources


def test_gsm8k_hf_reads_a_local_copy_of_the_dataset_offline(tmp_path,
                                                            offline_hub):
  config = _config(source='gsm8k_hf', path=_gsm8k_copy(tmp_path / 'gsm8k'))
  train = pipeline.load_examples(config, 'train')
  assert [r['question'] for r in train] == [
      f'train problem {i}: what is {i} + 2?' for i in range(6)]
  assert train[3]['answer'] == '5'
  assert train[3]['reasoning'] == '3 + 2 = <<3+2=5>>5'
  config.data.num_eval_examples = 2
  assert [r['answer'] for r in pipeline.load_examples(config, 'eval')] == [
      '2', '3']
  opening.check(config)


def test_no_preset_reads_a_source_requirements_do_not_install():
  required = (_REPO / 'requirements.txt').read_text()
  package_of = {'gsm8k_tfds': 'tensorflow==', 'gsm8k_hf': 'datasets==',
                'hf_rubrics': 'datasets==', 'parquet': 'pyarrow=='}
  presets = sorted(p.stem for p in (_REPO / 'agent_tunix/configs').glob(
      '*.py') if p.stem not in ('__init__', 'base'))
  assert 'gemma3_1b' in presets and 'gemma4_31b' in presets
  for name in presets:
    module = importlib.import_module(f'agent_tunix.configs.{name}')
    for arg in (None, 'it'):
      try:
        config = module.get_config(arg)
      except ValueError:  # A preset without ':it'.
        continue
      for source, _ in pipeline.parse_source(config.data.source):
        package = package_of.get(source)
        assert package is None or re.search(
            rf'^{re.escape(package)}', required, re.M), (name, source)


def test_gsm8k_presets_read_hugging_face():
  for name in ('gemma3_1b', 'gemma3_4b', 'gemma3_12b', 'gemma3_27b',
               'gemma4_e2b', 'gemma4_31b'):
    config = importlib.import_module(f'agent_tunix.configs.{name}').get_config()
    assert config.data.source == 'gsm8k_hf', name
    assert few_shot.kind(config) == 'arithmetic', name


# -------------------------------------------------------------- opening


@pytest.mark.skipif(not _NO_TENSORFLOW, reason='TensorFlow is installed')
def test_gsm8k_tfds_without_tensorflow_is_refused():
  with pytest.raises(opening.DataUnavailable,
                     match=r"gsm8k_tfds.*needs TensorFlow.*'gsm8k_hf'"):
    opening.check(_config(source='gsm8k_tfds'))


def test_missing_data_and_columns_are_refused(tmp_path, offline_hub):
  with pytest.raises(opening.DataUnavailable,
                     match=r'holds no GSM8K train files.*hf download'):
    opening.check(_config(source='gsm8k_hf', path=str(tmp_path / 'none')))
  (tmp_path / 'bad' / 'main').mkdir(parents=True)
  for split in ('train', 'test'):
    pq.write_table(pa.table({'problem': ['1 + 1?'], 'solution': ['2']}),
                   tmp_path / 'bad' / 'main' / f'{split}-0.parquet')
  with pytest.raises(opening.DataUnavailable,
                     match=r"no column\(s\) \['question', 'answer'\]"):
    opening.check(_config(source='gsm8k_hf', path=str(tmp_path / 'bad')))
  pq.write_table(pa.table({'problem': ['1 + 1?'], 'answer': ['2']}),
                 tmp_path / 'rows.parquet')
  with pytest.raises(opening.DataUnavailable,
                     match=r"no column\(s\) \['question'\].*prompt_column"):
    opening.check(_config(source='parquet', num_eval_examples=1,
                          path=str(tmp_path / 'rows.parquet')))
  # Synthetic data is generated: nothing to open, nothing refused.
  opening.check(_config(source='synthetic', num_train_examples=8,
                        num_eval_examples=4))


def _run(module, *args, timeout=240):
  return subprocess.run(
      [sys.executable, '-m', module, *args], cwd=_REPO,
      env=dict(os.environ, JAX_PLATFORMS='cpu', HF_DATASETS_OFFLINE='1',
               HF_HUB_OFFLINE='1'),
      capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.skipif(not _NO_TENSORFLOW, reason='TensorFlow is installed')
@pytest.mark.parametrize('module, args', [
    ('agent_tunix.main', ['--config=configs/gemma3_270m.py']),
    ('agent_tunix.evaluate', ['--config=configs/gemma3_270m.py',
                              '--allow_base']),
    ('agent_tunix.sweep', ['--config=configs/tiny.py',
                           '--sweep=optimizer.learning_rate=1e-4,1e-5']),
    ('agent_tunix.preflight', ['--config=configs/gemma3_1b.py',
                               '--topology=v5litepod-8']),
])
def test_commands_refuse_unopenable_data_in_one_line_before_a_model(
    tmp_path, module, args):
  workdir = [] if module.endswith(('evaluate', 'preflight')) else [
      f'--workdir={tmp_path / "run"}']
  out = _run(module, *args, *workdir, '--config.data.source=gsm8k_tfds')
  lines = [l for l in out.stderr.splitlines() if l.strip()]
  if module.endswith('preflight'):  # libtpu's start-up notes come first.
    lines = lines[-1:]
  assert out.returncode == 2, out.stderr[-3000:]
  # One line, and nothing logged before it: no weight was read.
  assert len(lines) == 1, out.stderr[-3000:]
  assert re.match(r"error: data.source='gsm8k_tfds' .*needs TensorFlow",
                  lines[0])


# ------------------------------------------------------------- few-shot


def test_few_shot_defaults_follow_the_data():
  assert few_shot.kind(_config(source='synthetic')) == 'arithmetic'
  assert few_shot.kind(_config(source='gsm8k_hf')) == 'arithmetic'
  for source in ('jsonl', 'parquet', 'synthetic:1,jsonl:1'):
    assert few_shot.kind(_config(source=source)) == 'none', source
  rubric = importlib.import_module(
      'agent_tunix.configs.gemma3_270m_rubrics').get_config()
  assert few_shot.kind(rubric) == 'none'
  assert 'Ann has 3 bags' not in prompts.format_prompt('Why?', rubric,
                                                       'gemma3')


def test_jsonl_default_prompt_has_no_arithmetic_examples(tmp_path):
  config = _config(source='jsonl', path=_geography(tmp_path),
                   template='plain', system_prompt='Be brief.')
  text = prompts.format_prompt('How many moons has Mars?', config, 'gemma3')
  assert text == 'Be brief.\n\nQuestion: How many moons has Mars?\nAnswer:\n'
  config.data.few_shot = 'arithmetic'
  text = prompts.format_prompt('How many moons has Mars?', config, 'gemma3')
  assert text == prompts.plain_prompt('How many moons has Mars?', 'Be brief.')
  assert text.count('Question: ') == 3 and 'Ann has 3 bags' in text


def test_few_shot_train_rows_are_shown_and_held_out(tmp_path):
  config = _config(source='jsonl', path=_geography(tmp_path),
                   few_shot='train:2', seed=3)
  every = pipeline.load_split(config, 'train')
  train = pipeline.load_examples(config, 'train')
  shown = [r for r in every if r not in train]
  assert len(every) == 12 and len(train) == 10 and len(shown) == 2
  text = prompts.format_prompt('How many moons has Mars?', config, 'gemma3')
  for row in shown:
    assert (f"Question: {row['question']}\nAnswer:\n<reasoning></reasoning>"
            f"<answer>{row['answer']}</answer>") in text
  assert text.endswith('Question: How many moons has Mars?\nAnswer:\n')
  assert 'Ann has 3 bags' not in text
  opening.check(config)
  config.data.few_shot = 'train:12'
  with pytest.raises(opening.DataUnavailable, match='leaving none to train'):
    opening.check(config)


def test_few_shot_from_a_jsonl_file(tmp_path):
  shots = tmp_path / 'shots.jsonl'
  _write_jsonl(shots, [
      {'question': 'How many legs has a spider?', 'answer': '8',
       'reasoning': 'Spiders are arachnids: 8 legs.'},
      {'question': 'How many sides has a hexagon?',
       'answer': 'Hexa means six.\n#### 6'},
  ])
  config = _config(source='jsonl', path=_geography(tmp_path),
                   few_shot=str(shots), system_prompt='')
  assert prompts.format_prompt('How many moons has Mars?', config,
                               'gemma3') == (
      'Question: How many legs has a spider?\nAnswer:\n<reasoning>Spiders '
      'are arachnids: 8 legs.</reasoning><answer>8</answer>\n\n'
      'Question: How many sides has a hexagon?\nAnswer:\n<reasoning>Hexa '
      'means six.</reasoning><answer>6</answer>\n\n'
      'Question: How many moons has Mars?\nAnswer:\n')
  _write_jsonl(shots, [{'q': 'x', 'answer': '1'}])
  config.data.few_shot = str(shots)
  with pytest.raises(opening.DataUnavailable,
                     match=r"example 1 has no column\(s\) \['question'\]"):
    opening.check(config)
  config.data.few_shot = str(tmp_path / 'missing.jsonl')
  with pytest.raises(opening.DataUnavailable, match='no JSONL file'):
    opening.check(config)


def test_few_shot_choices_that_cannot_apply_are_refused(tmp_path):
  config = _config(source='jsonl', path=_geography(tmp_path))
  for bad in ('some', 'train:0', 'train:x'):
    config.data.few_shot = bad
    with pytest.raises(opening.DataUnavailable, match='data.few_shot'):
      opening.check(config)
  config.data.few_shot = 'train:2'
  config.data.template = 'chat'
  with pytest.raises(opening.DataUnavailable, match='plain template only'):
    opening.check(config)
  config.data.template = 'plain'
  config.agent.tools = 'calculator'
  with pytest.raises(opening.DataUnavailable, match='tool episodes'):
    opening.check(config)


# ---------------------------------------------------------- print_prompts


def test_print_prompts_counts_tokens_as_training_does(tmp_path):
  config = _config(source='jsonl', path=_geography(tmp_path))
  config.generation.max_prompt_length = 80
  out = io.StringIO()
  preview.print_prompts(config, 3, out=out, tokenizer=WordTokenizer())
  blocks = re.split(r'^--- ', out.getvalue(), flags=re.M)[1:]
  assert len(blocks) == 3
  batch = next(pipeline.make_train_iterator(
      config, WordTokenizer(), turns='gemma3')[0])
  for number, (block, prompt) in enumerate(zip(blocks, batch['prompt']), 1):
    header, text = block.split('\n', 1)
    count = 1 + len(WordTokenizer().encode(prompt))
    assert header == (f'train prompt {number} of 12: '
                      f'{count} of generation.max_prompt_length=80 tokens '
                      '(BOS included) ---')
    assert text == prompt


def test_main_print_prompts_shows_a_users_prompt_without_weights(tmp_path):
  out = _run('agent_tunix.main', '--config=configs/gemma3_270m.py',
             '--config.data.source=jsonl',
             f'--config.data.path={_geography(tmp_path)}', '--print_prompts=1')
  assert out.returncode == 0, out.stderr[-3000:]
  header, prompt = out.stdout.split('\n', 1)
  assert re.fullmatch(r'--- train prompt 1 of 12: \d+ of generation.'
                      r'max_prompt_length=320 tokens \(BOS included\) ---',
                      header)
  assert prompt.count('Question: ') == 1 and 'Ann has' not in prompt
  assert 'Loading GGUF weights' not in out.stderr


def test_every_row_shows_the_runs_prompts_in_its_order(tmp_path):
  config = _config(source='jsonl', path=_geography(tmp_path))
  run_batch = next(pipeline.make_train_iterator(
      config, WordTokenizer(), turns='gemma3')[0])
  out = io.StringIO()
  preview.print_prompts(preview.every_row(config), 2, out=out,
                        tokenizer=WordTokenizer())
  blocks = re.split(r'^--- ', out.getvalue(), flags=re.M)[1:]
  assert [b.split('\n', 1)[1] for b in blocks] == list(run_batch['prompt'])
  assert config.training.batch_size == 2  # The run's config is untouched.


def test_main_print_prompts_shows_rows_a_run_refuses(tmp_path):
  # Answers without a number, and fewer rows than a batch: a run refuses
  # both; their prompts are still shown.
  for split in ('train', 'test'):
    _write_jsonl(tmp_path / f'{split}.jsonl', [
        {'question': 'What is the capital of Peru?', 'answer': 'Lima'},
        {'question': 'Which river flows through Cairo?', 'answer': 'Nile'}])
  path = str(tmp_path / '{split}.jsonl')
  out = _run('agent_tunix.main', '--config=configs/gemma3_270m.py',
             '--config.data.source=jsonl', f'--config.data.path={path}',
             '--print_prompts=2')
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.count('--- train prompt ') == 2
  assert 'capital of Peru' in out.stdout and 'Ann has' not in out.stdout
  refused = _run('agent_tunix.main', '--config=configs/gemma3_270m.py',
                 '--config.data.source=jsonl', f'--config.data.path={path}',
                 f'--workdir={tmp_path / "w"}')
  assert refused.returncode == 2, refused.stderr[-3000:]
  assert "'Lima' has no number" in refused.stderr


def test_every_row_shows_a_single_file_too_small_to_hold_out(tmp_path):
  path = tmp_path / 'geo.jsonl'
  _write_jsonl(path, [{'question': 'Which ocean is the largest?',
                       'answer': 'the Pacific, 1'},
                      {'question': 'Which planet is red?',
                       'answer': 'Mars, 4'}])
  config = _config(source='jsonl', path=str(path))
  config.data.num_eval_examples = 256
  with pytest.raises(ValueError, match='has 2 rows; to hold out'):
    pipeline.load_examples(config, 'train')
  out = io.StringIO()
  preview.print_prompts(preview.every_row(config), 2, out=out,
                        tokenizer=WordTokenizer())
  assert out.getvalue().count('--- train prompt ') == 2
  assert 'largest?' in out.getvalue() and 'planet is red' in out.getvalue()
