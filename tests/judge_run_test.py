"""A tiny-model GRPO run on the shipped rubric rows, judged by the fake
OpenAI-compatible server (tests/judge_fixtures.py), in process and through
the CLI."""

import os
import pathlib
import subprocess
import sys

import pytest

from agent_tunix.run import train
from agent_tunix.configs import tiny
from tests import judge_fixtures
from tests import tb_events

_REPO = pathlib.Path(__file__).resolve().parents[1]
_DATA = str(_REPO / 'agent_tunix/configs/rubrics/{split}.jsonl')


def _rubric_config(url, **judge):
  config = tiny.get_config()
  config.data.task = 'rubric'
  config.data.source = 'jsonl'
  config.data.path = _DATA
  config.data.reference_column = 'reference_answer'
  config.rewards.functions = 'rubric_judge=1'
  config.judge.base_url = url
  config.judge.model = 'rule-judge'
  config.judge.timeout_s = 10.0
  config.judge.update(judge)
  return config


def test_masked_failures_train_on_and_are_counted(tmp_path):
  # The canary's two calls and step 0's evaluation (2 rows) pass; then
  # one completion of step 1 fails.
  with judge_fixtures.FakeJudge(script=['ok'] * 4 + [500]) as server:
    config = _rubric_config(server.url, on_failure='mask', max_retries=0,
                            max_concurrency=1, max_failure_fraction=0.5)
    result = train.train_and_evaluate(config, str(tmp_path))
  assert result['step'] == 2
  events = tb_events.read_events(tmp_path)
  masked = {s: float(v[0]) for s, v in events['judge/masked_groups'].items()}
  assert masked == {1: 1.0, 2: 0.0}
  assert events['judge/failed/http'][1][0] == 1
  # 4 completions a step: 2 groups of 2.
  assert events['judge/requests'][2][0] + (
      events['judge/cache_hit_rate'][2][0] * 4) == pytest.approx(4)
  for tag in ('judge/latency_s/p50', 'judge/time_share',
              'judge/pass_rate/essential', 'reward/rubric_judge/mean'):
    assert set(events[tag]) == {1, 2}, tag
  assert 0 < events['judge/time_share'][1][0] < 1
  assert 'rubric_score' in result['eval']
  assert -1 <= result['eval']['rubric_score'] <= 1
  assert sorted(events['eval/rubric_score']) == [0, 2]
  assert sorted(events['eval/judge/requests']) == [0, 2]
  # The canary's two calls are not counted as the evaluation's retries.
  assert events['eval/judge/retries'][0][0] == 0
  # Sample texts show the judge's verdicts.
  sample = events['samples'][1][0].item().decode()
  assert '[judge failed (http): HTTP 500' in sample  # Step 1's row 0.


def test_cli_a_judge_that_always_fails_exits_with_one_line(tmp_path):
  with judge_fixtures.FakeJudge(default=500) as server:
    run = subprocess.run(
        [sys.executable, '-m', 'agent_tunix.main', '--config=configs/tiny.py',
         f'--workdir={tmp_path / "w"}', '--config.training.num_steps=2',
         '--config.data.task=rubric', '--config.data.source=jsonl',
         f'--config.data.path={_DATA}',
         '--config.rewards.functions=rubric_judge=1',
         '--config.judge.backend=http', f'--config.judge.base_url={server.url}',
         '--config.judge.model=M', '--config.judge.max_retries=1'],
        cwd=_REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, check=False)
  assert run.returncode == 1, run.stderr[-2000:]
  assert 'Traceback' not in run.stderr
  last = run.stderr.strip().splitlines()[-1]
  assert last.startswith('error: The judge at ' + server.url), last
  assert 'HTTP 500' in last


# ------------------------------------------------- the in-process judge


def test_gemma_judge_reads_yes_no_probabilities_from_the_tiny_model():
  from agent_tunix import models  # pylint: disable=g-import-not-at-top
  from agent_tunix.judge import gemma_backend  # pylint: disable=g-import-not-at-top
  from agent_tunix.judge import judge as judge_lib  # pylint: disable=g-import-not-at-top
  from agent_tunix.rl import logprobs  # pylint: disable=g-import-not-at-top
  from agent_tunix.tpu import sharding  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  config = tiny.get_config()
  model, tokenizer = models.build(config, sharding.make_mesh(config.mesh))
  items = [{'text': "Mentions 'paris'.", 'weight': 2.0, 'category': ''},
           {'text': 'Gives a wrong city.', 'weight': -1.0,
            'category': 'pitfall'}]
  tasks = [{'question': 'Capital of France?', 'reference': '',
            'response': r, 'items': items} for r in ('Paris.', 'Lyon, I think')]
  pairs = [(t, i['text']) for t in tasks for i in items]
  one = gemma_backend.GemmaBackend(model, tokenizer, 1, 'tiny')
  four = gemma_backend.GemmaBackend(model, tokenizer, 4, 'tiny')
  p1, p4 = one.item_probabilities(pairs), four.item_probabilities(pairs)
  # Padding rows and batch size do not change a pair's probability.
  np.testing.assert_allclose(p1, p4, atol=1e-5)
  assert ((p1 > 0) & (p1 < 1)).all()
  # Against a plain forward of the first pair (no padding, no jit).
  ids = [tokenizer.bos_id()] + list(tokenizer.encode(
      gemma_backend.item_prompt(tasks[0], items[0]['text'])))
  tokens = np.asarray([ids], np.int32)
  hidden = logprobs.final_hidden_states(
      model, tokens, np.ones_like(tokens, bool), use_lora=False)[:, -1]
  logits = np.asarray(hidden @ model.embedder.input_embedding[...].T,
                      np.float64)[0]
  yes = np.logaddexp.reduce(logits[one._yes])  # pylint: disable=protected-access
  no = np.logaddexp.reduce(logits[one._no])  # pylint: disable=protected-access
  assert p1[0] == pytest.approx(1 / (1 + np.exp(no - yes)), abs=1e-4)
  # The judge's score is the explicit aggregation of the probabilities.
  judge = judge_lib.Judge(config.judge, four)
  scores = judge.score([judge.task(t['question'], '', t['response'], items)
                        for t in tasks])
  np.testing.assert_allclose(
      scores, [(2 * p1[0] - p1[1]) / 2, (2 * p1[2] - p1[3]) / 2], atol=1e-5)
  metrics = judge.take_metrics()
  assert metrics['judge/requests'] == 2 and 'judge/pass_rate/overall' in metrics


def test_gemma_judge_asks_with_the_prompt_file(tmp_path):
  """judge.prompt_file is the per-item prompt: its fields filled, its final
  newline dropped (so ' yes' follows 'Answer:'), and the probabilities are
  those of that prompt."""
  from agent_tunix import models  # pylint: disable=g-import-not-at-top
  from agent_tunix.judge import gemma_backend  # pylint: disable=g-import-not-at-top
  from agent_tunix.judge import judge as judge_lib  # pylint: disable=g-import-not-at-top
  from agent_tunix.tpu import sharding  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  config = tiny.get_config()
  model, tokenizer = models.build(config, sharding.make_mesh(config.mesh))
  path = tmp_path / 'item.txt'
  path.write_text('Q {question} R {reference}\nResponse: {response}\n'
                  'Criterion: {criterion} {"json": true}\nAnswer:\n')
  config.judge.backend, config.judge.prompt_file = 'gemma', str(path)
  judge = judge_lib.from_config(config, None, model, tokenizer)
  task = {'question': 'Capital?', 'reference': '', 'response': 'Paris.',
          'items': [{'text': "Mentions 'paris'.", 'weight': 1.0,
                     'category': ''}]}
  backend = judge.backend
  expected = ('Q Capital? R none\nResponse: Paris.\n'
              "Criterion: Mentions 'paris'. {\"json\": true}\nAnswer:")
  assert gemma_backend.item_prompt(
      task, "Mentions 'paris'.", backend._template) == expected  # pylint: disable=protected-access
  built_in = gemma_backend.GemmaBackend(model, tokenizer, 4, 'tiny')
  direct = built_in._probabilities(  # pylint: disable=protected-access
      [[tokenizer.bos_id()] + list(tokenizer.encode(expected))])
  np.testing.assert_allclose(
      backend.item_probabilities([(task, "Mentions 'paris'.")]), direct,
      atol=1e-6)
  assert abs(direct[0] - built_in.item_probabilities(
      [(task, "Mentions 'paris'.")])[0]) > 1e-6  # The prompt mattered.
  judge.close()


def test_notebook_api_with_rubric_rows(tmp_path):
  """The original Colab pipeline's shape: a config with rubric data (the
  rubric in the prompt), train, evaluate, export, ask."""
  from agent_tunix import api  # pylint: disable=g-import-not-at-top
  with judge_fixtures.FakeJudge() as server:
    config = _rubric_config(server.url)
    config.data.rubric_in_prompt = True
    config.training.num_steps = 1
    config.generation.max_prompt_length = 192
    session = api.prepare(config, str(tmp_path / 'run'))
    assert 'Rubric:\n1. ' in session.eval_set[0]['prompt']
    api.train(session)
    scores = api.evaluate(session)
    assert -1 <= scores['rubric_score'] <= 1
    api.export(session, 'peft', str(tmp_path / 'peft'))
    text = api.ask(session, 'What is the capital of Japan?',
                   rubric=["The response gives the answer 'tokyo'."])
  assert isinstance(text, str)
  assert (tmp_path / 'peft').exists()
