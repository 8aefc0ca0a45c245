"""Tests for rubric rows, the judge and the rubric rewards (all offline:
the HTTP judge is tests/judge_fixtures.py's fake on 127.0.0.1)."""

import json
import pathlib
import socket
import time

import ml_collections
import numpy as np
import pytest

from agent_tunix import rewards
from agent_tunix.data import rubrics
from agent_tunix.judge import judge as judge_lib
from agent_tunix.judge import prompts
from agent_tunix.rewards import rubric as rubric_rewards
from agent_tunix.configs import base
from tests import judge_fixtures

_REPO = pathlib.Path(__file__).resolve().parents[1]

_ITEMS = [
    {'text': "The response gives the answer 'paris'.", 'weight': 5.0,
     'category': 'essential'},
    {'text': "The response mentions 'france'.", 'weight': 3.0,
     'category': 'important'},
    {'text': "The response gives 'lyon' as the answer.", 'weight': -2.0,
     'category': 'pitfall'},
]


# ------------------------------------------------------------ normaliser


def test_rar_items_keep_weights_and_take_categories_from_prefixes():
  items = rubrics.normalise([
      {'title': 'Names gas', 'description': 'Essential Criteria: Names '
       'carbon dioxide.', 'weight': 5},
      {'title': 'Wrong gas', 'description': 'Pitfall Criteria: Says oxygen.',
       'weight': -1},
  ])
  assert items == [
      {'text': 'Names carbon dioxide.', 'weight': 5.0,
       'category': 'essential'},
      {'text': 'Says oxygen.', 'weight': -1.0, 'category': 'pitfall'}]


def test_openrubrics_numbered_string_with_tags():
  items = rubrics.normalise(
      '1. The response is in French. [Hard Rule]\n'
      '2. The response is concise and\n   well organised. [Principle]\n')
  assert items == [
      {'text': 'The response is in French.', 'weight': 1.0,
       'category': 'hard_rule'},
      {'text': 'The response is concise and well organised.', 'weight': 1.0,
       'category': 'principle'}]


@pytest.mark.parametrize('rubric', [
    ['Mentions Paris', 'Is short'],
    'Mentions Paris\nIs short\n',
    json.dumps([{'text': 'Mentions Paris'}, {'criterion': 'Is short'}]),
])
def test_plain_rubrics(rubric):
  items = rubrics.normalise(rubric)
  assert [i['text'] for i in items] == ['Mentions Paris', 'Is short']
  assert [i['weight'] for i in items] == [1.0, 1.0]


@pytest.mark.parametrize('rubric, message', [
    ([], 'no items'),
    ('', 'no items'),
    (None, 'no items'),
    ([{'weight': 3}], 'item 1 has no text'),
    ([{'text': 'a', 'weight': 'heavy'}], "weight 'heavy', not a number"),
    ([{'text': 'a', 'weight': float('nan')}], 'not finite'),
    (['x'] * 65, '65 items'),
    (7, 'is a int'),
])
def test_bad_rubrics_say_why(rubric, message):
  with pytest.raises(rubrics.RubricError, match=message):
    rubrics.normalise(rubric)


# ----------------------------------------------------- prompts / parsing


def test_explicit_prompt_lists_items_and_wraps_the_response():
  task = {'question': 'Capital?', 'reference': '', 'response': 'Paris.',
          'items': _ITEMS}
  system, user = prompts.messages(task, 'explicit')
  assert '{"verdicts": [{"id": 1, "met": true}' in system['content']
  assert '<response>\nParis.\n</response>' in user['content']
  assert "1. The response gives the answer 'paris'.\n2. " in user['content']
  assert '<reference_answer>\nnone\n' in user['content']


@pytest.mark.parametrize('reply, message', [
    ('not json', 'not JSON'),
    ('[1, 2]', 'not an object'),
    ('{"verdicts": [{"id": 1, "met": true}]}', '1 verdicts for 3 items'),
    ('{"verdicts": [{"id": 1, "met": true}, {"id": 1, "met": true}, '
     '{"id": 3, "met": false}]}', 'once each'),
    ('{"verdicts": [{"id": 1, "met": "yes"}, {"id": 2, "met": true}, '
     '{"id": 3, "met": false}]}', 'not true/false'),
])
def test_bad_verdicts_are_unparseable(reply, message):
  with pytest.raises(prompts.Unparseable, match=message):
    prompts.parse_verdicts(reply, 3)


def test_verdicts_in_any_order_and_in_a_fence():
  reply = ('```json\n{"verdicts": [{"id": 2, "met": false}, '
           '{"id": 1, "met": true}]}\n```')
  assert prompts.parse_verdicts(reply, 2) == [True, False]


@pytest.mark.parametrize('reply', ['{"rating": 11}', '{"rating": 0}',
                                   '{"rating": true}', '{"rating": "7"}'])
def test_ratings_out_of_range_are_unparseable_not_clipped(reply):
  with pytest.raises(prompts.Unparseable):
    prompts.parse_rating(reply)


def test_scores():
  assert prompts.explicit_score(_ITEMS, [True, True, False]) == 1.0
  assert prompts.explicit_score(_ITEMS, [True, False, True]) == 3 / 8
  assert prompts.explicit_score(_ITEMS, [False, False, True]) == -0.25
  only_pitfall = [_ITEMS[2]]
  assert prompts.explicit_score(only_pitfall, [True]) == -1.0
  assert prompts.implicit_score(prompts.parse_rating('{"rating": 10}')) == 1.0
  assert prompts.implicit_score(1) == 0.0


# ----------------------------------------------------- the HTTP judge


def _judge_config(url, **overrides):
  c = base.get_config().judge
  c.base_url = url
  c.model = 'rule-judge'
  c.timeout_s = 2.0
  c.max_retries = 1
  c.max_concurrency = 4
  c.update(overrides)
  return c


def _make(url, **overrides):
  from agent_tunix.judge import openai_backend  # pylint: disable=g-import-not-at-top
  c = _judge_config(url, **overrides)
  return judge_lib.Judge(c, openai_backend.OpenAIBackend(c))


def _tasks(judge, responses, items=_ITEMS):
  return [judge.task('What is the capital of France?', '', r, items)
          for r in responses]


def test_http_judge_scores_by_the_rules_and_logs_metrics():
  with judge_fixtures.FakeJudge() as server:
    judge = _make(server.url)
    scores = judge.score(_tasks(judge, [
        'Paris, in France.', 'Lyon.', 'Paris.', 'lyon is in france']))
    np.testing.assert_allclose(scores, [1.0, -0.25, 5 / 8, 1 / 8])
    metrics = judge.take_metrics()
    judge.close()
  assert server.requests == 4
  assert metrics['judge/requests'] == 4 and metrics['judge/failed'] == 0
  assert metrics['judge/pass_rate/essential'] == 0.5
  assert metrics['judge/pass_rate/pitfall'] == 0.5
  assert metrics['judge/latency_s/p95'] >= metrics['judge/latency_s/p50'] > 0
  assert server.bodies[0]['model'] == 'rule-judge'
  assert server.bodies[0]['temperature'] == 0.0


def test_implicit_rating():
  with judge_fixtures.FakeJudge(default='rating') as server:
    judge = _make(server.url, aggregation='implicit')
    scores = judge.score(_tasks(judge, ['Paris, France', 'Nothing']))
    judge.close()
  # Met 2 of 3 -> rating 7 -> 6/9; met none -> rating 1 -> 0.
  np.testing.assert_allclose(scores, [6 / 9, 0.0])


def test_cache_asks_once_for_identical_completions():
  with judge_fixtures.FakeJudge() as server:
    judge = _make(server.url)
    judge.score(_tasks(judge, ['Paris.', 'Paris.', 'Lyon.']))
    judge.score(_tasks(judge, ['Paris.']))
    metrics = judge.take_metrics()
    judge.close()
  assert server.requests == 2
  assert metrics['judge/cache_hit_rate'] == 2 / 4


def test_disk_cache_survives_a_restart(tmp_path):
  path = str(tmp_path / judge_lib.CACHE_FILE)
  from agent_tunix.judge import openai_backend  # pylint: disable=g-import-not-at-top
  with judge_fixtures.FakeJudge() as server:
    for _ in range(2):
      c = _judge_config(server.url, cache='disk')
      judge = judge_lib.Judge(c, openai_backend.OpenAIBackend(c), path)
      assert judge.score(_tasks(judge, ['Paris.']))[0] == 5 / 8
      judge.close()
  assert server.requests == 1



def test_disk_cache_on_gcs_survives_a_restart_and_reads_every_process(
    monkeypatch):
  """A gs:// workdir: the cache object is rewritten after each batch (no
  append on Cloud Storage); another process's object is read too."""
  import gcs_emulator  # pylint: disable=g-import-not-at-top
  from agent_tunix import storage  # pylint: disable=g-import-not-at-top
  from agent_tunix.judge import openai_backend  # pylint: disable=g-import-not-at-top
  with gcs_emulator.emulator('agent-tunix-judge') as gcs, \
      judge_fixtures.FakeJudge() as server:
    monkeypatch.setenv('STORAGE_EMULATOR_HOST', gcs.url)
    workdir = f'gs://{gcs.bucket}/run'
    path = f'{workdir}/{judge_lib.CACHE_FILE}'
    for answers in (['Paris.'], ['Paris.', 'Lyon.'], ['Lyon.', 'Paris.']):
      c = _judge_config(server.url, cache='disk')
      judge = judge_lib.Judge(c, openai_backend.OpenAIBackend(c), path)
      judge.score(_tasks(judge, answers))
      judge.close()
    assert server.requests == 2  # Paris once, Lyon once.
    assert len(storage.read_text(path).splitlines()) == 2
    # Process 1 of a pod keeps its own object; process 0 reads it.
    storage.write_text(f'{workdir}/judge_cache.1.jsonl',
                       storage.read_text(path))
    storage.write_text(path, '')
    c = _judge_config(server.url, cache='disk')
    judge = judge_lib.Judge(c, openai_backend.OpenAIBackend(c), path)
    judge.score(_tasks(judge, ['Lyon.', 'Paris.']))
    judge.close()
    assert server.requests == 2

def test_concurrency_is_capped_and_order_kept():
  with judge_fixtures.FakeJudge(default='slow') as server:
    judge = _make(server.url, max_concurrency=2)
    responses = [f'Paris {i}.' if i % 2 else f'Lyon {i}.' for i in range(8)]
    scores = judge.score(_tasks(judge, responses))
    judge.close()
  assert server.peak_in_flight == 2
  np.testing.assert_allclose(scores, [-0.25, 5 / 8] * 4)


@pytest.mark.parametrize('script, kind, detail', [
    (['bad_json', 'bad_json'], 'unparseable', "reply 'Sure! Here"),
    (['wrong_count', 'wrong_count'], 'unparseable', '1 verdicts for 3 items'),
    ([500, 500], 'http', 'HTTP 500'),
])
def test_failures_stop_with_one_message(script, kind, detail):
  with judge_fixtures.FakeJudge(script=script) as server:
    judge = _make(server.url)
    with pytest.raises(judge_lib.JudgeError) as error:
      judge.score(_tasks(judge, ['Paris.']))
    judge.close()
  message = str(error.value)
  assert '\n' not in message
  assert f'Judge {kind} on completion 0' in message and detail in message
  assert server.url in message and "'rule-judge'" in message
  assert 'judge.on_failure=mask' in message


def test_unparseable_then_good_reply_is_a_counted_retry():
  with judge_fixtures.FakeJudge(script=['bad_json']) as server:
    judge = _make(server.url)
    assert judge.score(_tasks(judge, ['Paris.']))[0] == 5 / 8
    metrics = judge.take_metrics()
    judge.close()
  assert server.requests == 2 and metrics['judge/retries'] == 1


def test_429_with_retry_after_is_retried():
  with judge_fixtures.FakeJudge(script=[429]) as server:
    judge = _make(server.url)
    assert judge.score(_tasks(judge, ['Paris.']))[0] == 5 / 8
    metrics = judge.take_metrics()
    judge.close()
  assert server.requests == 2 and metrics['judge/retries'] == 1


def test_a_hang_past_the_timeout_is_a_timeout():
  with judge_fixtures.FakeJudge(default='hang', hang_s=5) as server:
    judge = _make(server.url, timeout_s=0.5, max_retries=0)
    start = time.perf_counter()
    with pytest.raises(judge_lib.JudgeError, match='Judge timeout'):
      judge.score(_tasks(judge, ['Paris.']))
    elapsed = time.perf_counter() - start
    judge.close()
  assert elapsed < 4


def test_a_dead_port_fails_the_canary_naming_the_url():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  judge = _make(f'http://127.0.0.1:{port}/v1', max_retries=0)
  with pytest.raises(judge_lib.JudgeError,
                     match=f'127.0.0.1:{port}/v1 .* failed its canary'):
    judge.canary()
  judge.close()


def test_canary_passes_a_rule_judge_and_refuses_a_yes_man():
  with judge_fixtures.FakeJudge() as server:
    judge = _make(server.url)
    judge.canary()
    judge.close()
  assert server.requests == 2
  with judge_fixtures.FakeJudge(default='all_met') as server:
    judge = _make(server.url)
    with pytest.raises(judge_lib.JudgeError, match='must score higher'):
      judge.canary()
    judge.close()


def test_mask_gives_nan_and_counts_until_too_many_fail():
  with judge_fixtures.FakeJudge(script=[500, 500]) as server:
    judge = _make(server.url, on_failure='mask', max_failure_fraction=0.5,
                  max_concurrency=1)
    scores = judge.score(_tasks(judge, ['Paris.', 'Lyon.', 'Paris!', 'x']))
    metrics = judge.take_metrics()
    judge.close()
  assert np.isnan(scores[0]) and np.isfinite(scores[1:]).all()
  assert metrics['judge/failed/http'] == 1
  with judge_fixtures.FakeJudge(default=500) as server:
    judge = _make(server.url, on_failure='mask', max_failure_fraction=0.5,
                  max_retries=0)
    with pytest.raises(judge_lib.JudgeError, match='more than judge.max_fa'):
      judge.score(_tasks(judge, ['Paris.', 'Lyon.']))
    judge.close()


def test_a_failing_judge_is_not_re_called_per_completion():
  """The reward set's blame loop re-calls a raising reward once per
  completion; a judge names its culprit itself."""
  with judge_fixtures.FakeJudge(default=500) as server:
    judge = _make(server.url, max_retries=0)
    reward_set = rewards.RewardSet('rubric_judge=1', judge=judge)
    with pytest.raises(rewards.RewardError, match='Judge http'):
      reward_set(['p'] * 3, ['a', 'b', 'c'], question=['q'] * 3,
                 rubric=[_ITEMS] * 3, reference=[''] * 3)
    judge.close()
  assert server.requests == 3


def test_reward_set_lets_masked_nan_through_only_from_the_judge():
  with judge_fixtures.FakeJudge(script=[500]) as server:
    judge = _make(server.url, on_failure='mask', max_retries=0,
                  max_concurrency=1, max_failure_fraction=0.5)
    reward_set = rewards.RewardSet('rubric_judge=1,format_exact=0.5',
                                   judge=judge)
    total, per_fn = reward_set(
        ['p'] * 2, ['Paris.', 'Lyon.'], question=['q'] * 2,
        rubric=[_ITEMS] * 2, reference=[''] * 2)
    judge.close()
  assert np.isnan(total[0]) and np.isnan(per_fn['rubric_judge'][0])
  assert total[1] == pytest.approx(-0.25)


# ------------------------------------------------------ rubric_overlap


def test_rubric_overlap_is_hackable_by_copying_the_rubric():
  """Why rubric_overlap with data.rubric_in_prompt is not a default: a
  completion that repeats the rubric shown in its prompt beats a right
  answer."""
  items = rubrics.normalise([
      'The response names carbon dioxide as the gas plants take in.',
      'The response mentions photosynthesis.'])
  copied = rubrics.rubric_text(items)
  right = 'Carbon dioxide, which plants use in photosynthesis.'
  scores = rubric_rewards.rubric_overlap(
      ['p'] * 2, [copied, right], rubric=[items] * 2)
  assert scores[0] == 1.0 and scores[1] < scores[0]
  # A reference answer adds difflib similarity (10:5, as rar_reward).
  with_ref = rubric_rewards.rubric_overlap(
      ['p'], [right], rubric=[items], reference=['Carbon dioxide.'])
  assert 0 < with_ref[0] < 1


def test_rubric_rewards_are_registered():
  assert rewards.resolve('rubric_judge') is rubric_rewards.rubric_judge
  assert rewards.resolve('rubric_overlap') is rubric_rewards.rubric_overlap


def test_agreement_of_the_rule_judge_with_the_shipped_labels():
  """The shipped rows' labels follow the rule the fake judge applies, so
  it agrees on every verdict; a yes-man agrees only where labels say
  met."""
  from agent_tunix.judge import agreement  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  config.data.path = str(_REPO / 'agent_tunix/configs/rubrics/{split}.jsonl')
  config.data.reference_column = 'reference_answer'
  rows = agreement.labelled_rows(config, 'eval')
  assert len(rows) == 12
  with judge_fixtures.FakeJudge() as server:
    report = agreement.agreement(_make(server.url), rows)
  assert report['item_agreement'] == 1.0 and report['ranking_accuracy'] == 1
  assert report['num_verdicts'] == 12 * 3 * 4
  with judge_fixtures.FakeJudge(default='all_met') as server:
    report = agreement.agreement(_make(server.url), rows)
  # Met labels: 2 of 4 items, 3 of 4, 2 of 4 per row -> 7 of 12.
  assert report['item_agreement'] == pytest.approx(7 / 12)
  assert report['ranking_accuracy'] == 0


# -------------------------------------------------------- rubric data


def _rubric_data_config(**data):
  config = base.get_config()
  config.data.task = 'rubric'
  config.data.source = 'jsonl'
  config.data.path = str(_REPO / 'agent_tunix/configs/rubrics/{split}.jsonl')
  config.data.reference_column = 'reference_answer'
  config.data.num_train_examples = 0
  config.data.num_eval_examples = 0
  config.rewards.functions = 'rubric_overlap=1'
  config.data.update(data)
  return config


def test_shipped_rubric_rows_load_as_items():
  from agent_tunix.data import pipeline  # pylint: disable=g-import-not-at-top
  config = _rubric_data_config()
  train = pipeline.load_examples(config, 'train')
  evals = pipeline.load_examples(config, 'eval')
  assert (len(train), len(evals)) == (36, 12)
  row = train[0]
  assert row['answer'] == '' and row['reference'] == 'Carbon dioxide.'
  assert [i['category'] for i in row['rubric']] == [
      'essential', 'important', 'optional', 'pitfall']
  assert [i['weight'] for i in row['rubric']] == [5.0, 2.0, 1.0, -2.0]


def test_bad_rubric_rows_are_named_or_skipped(tmp_path):
  from agent_tunix.data import gsm8k  # pylint: disable=g-import-not-at-top
  from agent_tunix.data import pipeline  # pylint: disable=g-import-not-at-top
  rows = [{'question': 'Q1', 'rubric': ['a']}, {'question': 'Q2', 'rubric': []},
          {'question': '', 'rubric': ['b']}, {'question': 'Q4', 'rubric': 'c'}]
  (tmp_path / 'rows.jsonl').write_text(
      ''.join(json.dumps(r) + '\n' for r in rows))
  config = _rubric_data_config(path=str(tmp_path / 'rows.jsonl'),
                               num_eval_examples=1, reference_column='')
  with pytest.raises(gsm8k.DataError,
                     match=r'line 2: its rubric cannot be read: the rubric '
                           'has no items'):
    pipeline.load_examples(config, 'train')
  config.data.bad_rows = 'skip'
  pipeline._cached_file.cache_clear()  # pylint: disable=protected-access
  assert [e['question'] for e in pipeline.load_examples(config, 'train')] == [
      'Q1']


def test_rubric_in_prompt_shows_the_items_before_the_question():
  from agent_tunix.data import pipeline  # pylint: disable=g-import-not-at-top
  items = rubrics.normalise(['Says Paris', 'Is short'])
  config = _rubric_data_config(rubric_in_prompt=True)
  assert pipeline.rubric_question('Q?', items, config) == (
      'Rubric:\n1. Says Paris\n2. Is short\n\nQ?')
  config.data.rubric_in_prompt = False
  assert pipeline.rubric_question('Q?', items, config) == 'Q?'


def test_hf_rubrics_load_through_datasets_and_errors_are_errors(monkeypatch):
  import datasets  # pylint: disable=g-import-not-at-top
  rows = [{'question': 'Q', 'reference_answer': 'A', 'rubric': [
      {'title': 't', 'description': 'Essential Criteria: Says A.',
       'weight': 5}]}]
  asked = []

  def fake_load(dataset_id, split):
    asked.append((dataset_id, split))
    if split != 'test':
      raise ValueError(f'no split {split}')
    return datasets.Dataset.from_list(rows)

  monkeypatch.setattr(datasets, 'load_dataset', fake_load)
  examples = rubrics.load_hf('ScaleAI/RaR-Science', 'eval',
                             reference_column='reference_answer')
  assert examples == [{'question': 'Q', 'answer': '', 'reference': 'A',
                       'rubric': [{'text': 'Says A.', 'weight': 5.0,
                                   'category': 'essential'}]}]
  assert asked == [('ScaleAI/RaR-Science', 'test')]
  with pytest.raises(RuntimeError, match='tried .*train.*: train: no split'):
    rubrics.load_hf('ScaleAI/RaR-Science', 'train')


@pytest.mark.parametrize('fields, message', [
    ({'rewards.functions': 'answer=1'}, "lists \\['answer'\\], which score"),
    ({'data.source': 'synthetic'}, "data.source \\['synthetic'\\] does not"),
    ({'data.task': 'math'}, "rubric_overlap'\\], which need rubric rows"),
    ({'data.task': 'essay'}, "data.task='essay' is not one of"),
    ({'rewards.functions': 'rubric_judge=1'}, 'judge.base_url is empty'),
    ({'rewards.functions': 'rubric_judge=1', 'judge.base_url': 'x:1',
      'judge.model': 'm'}, 'must start with http'),
    ({'rewards.functions': 'rubric_judge=1', 'judge.backend': 'gemma',
      'judge.aggregation': 'implicit'}, 'set judge.aggregation'),
    ({'rewards.functions': 'rubric_judge=1', 'judge.backend': 'gemma',
      'judge.max_failure_fraction': 2.0}, 'between 0 and 1'),
])
def test_config_refuses_mismatched_rows_rewards_and_judges(fields, message):
  from agent_tunix.config import validation  # pylint: disable=g-import-not-at-top
  config = _rubric_data_config()
  for dotted, value in fields.items():
    section, name = dotted.split('.')
    config[section][name] = value
  with pytest.raises(validation.ConfigError, match=message):
    validation.validate(config, num_devices=1)


def test_a_gemma_judge_prompt_file_must_ask_about_one_item(tmp_path):
  from agent_tunix.config import validation  # pylint: disable=g-import-not-at-top
  config = _rubric_data_config()
  config.rewards.functions = 'rubric_judge=1'
  config.judge.backend = 'gemma'
  path = tmp_path / 'prompt.txt'
  path.write_text('{question}\n{response}\nThe criteria:\n{criteria}\n')
  config.judge.prompt_file = str(path)
  with pytest.raises(validation.ConfigError,
                     match=r'lacks \{criterion\}: .*one item at a time'):
    validation.validate(config, num_devices=1)
  path.write_text('{response}\n{criterion}\nAnswer:')
  validation.validate(config, num_devices=1)
  config.judge.prompt_file = str(tmp_path / 'missing.txt')
  with pytest.raises(validation.ConfigError, match='no such file'):
    validation.validate(config, num_devices=1)
  # The http judge reads all items at once: a gemma item prompt is refused.
  config.judge.prompt_file = str(path)
  config.judge.backend, config.judge.base_url = 'http', 'http://127.0.0.1:9'
  config.judge.model = 'm'
  with pytest.raises(validation.ConfigError,
                     match=r'lacks \{criteria\}: .*set judge.prompt_file= '):
    validation.validate(config, num_devices=1)
  path.write_text('{response}\n{criteria}')
  validation.validate(config, num_devices=1)


def test_a_run_without_the_canary_says_so(caplog):
  """judging.build skips the canary only when told, and logs that it did."""
  from agent_tunix.run import judging  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  config.rewards.functions = 'rubric_judge=1'
  config.judge = _judge_config('')
  config.judge.backend = 'http'
  with judge_fixtures.FakeJudge(default='all_met') as server:
    config.judge.base_url = server.url
    with pytest.raises(judge_lib.JudgeError, match='must score higher'):
      judging.build(config, None, None, None)
    asked = server.requests
    config.judge.canary = False
    with caplog.at_level('WARNING'):
      judge = judging.build(config, None, None, None)
    judge.close()
  assert asked == 2 and server.requests == 2  # No canary calls this time.
  assert any('judge.canary=False' in r.getMessage() and server.url in
             r.getMessage() for r in caplog.records)
