"""The run's judge: cache, failure policy, canary and metrics over a backend.

  judge = judge_lib.from_config(config, workdir)
  scores = judge.score(tasks)   # float per task; NaN = masked failure
  judge.take_metrics()          # judge/* scalars since the last call

A task is one completion to judge: {'question', 'reference', 'response',
'items'} (items as `data.rubrics.normalise` makes them). Never a silent 0:
with judge.on_failure='error' a call that failed after its retries raises
`JudgeError` naming the row, the server and the failure; with 'mask' it
scores NaN (training gives its group advantage 0 and counts it) unless more
than judge.max_failure_fraction of the batch failed.
"""

import collections
import hashlib
import json
import os
import time

from absl import logging
import jax
import numpy as np

from agent_tunix.data import rubrics
from agent_tunix.judge import prompts
from agent_tunix.judge import verdicts as verdicts_lib
from agent_tunix import storage
from agent_tunix.rewards import blame
from agent_tunix.tpu import sharding

BACKENDS = ('http', 'gemma')
CACHES = ('none', 'memory', 'disk')
ON_FAILURE = ('error', 'mask')
CACHE_FILE = 'judge_cache.jsonl'
# What to change, by failure kind.
_HINTS = {
    'timeout': 'raise judge.timeout_s or check the server load',
    'http': 'check judge.base_url, judge.model and the server log',
    'connection': 'check that a server listens at judge.base_url',
    'unparseable': ('use a judge model that follows the JSON-only prompt, '
                    'or set judge.prompt_file'),
}
# The canary: a question with a known-good and a known-bad answer.
CANARY = {
    'question': 'What is the capital of France?',
    'reference': 'Paris.',
    'items': [
        {'text': 'The response states that the capital of France is Paris.',
         'weight': 5.0, 'category': 'essential'},
        {'text': 'The response answers the question in one short sentence.',
         'weight': 1.0, 'category': 'optional'},
    ],
}
CANARY_GOOD = 'The capital of France is Paris.'
CANARY_BAD = ('I am not sure. Maybe Lyon, which is known for its food, '
              'its silk trade and its long history on two rivers.')


class JudgeError(blame.RewardError):
  """The judge failed (one message: row, server, failure kind)."""

  def __init__(self, message, index=None, completion=None):
    super().__init__(' '.join(message.split()), fn_name='rubric_judge',
                     index=index, completion=completion)


def _one_line(text, limit=200):
  text = ' '.join(str(text).split())
  return text if len(text) <= limit else text[:limit] + '...'


class Judge:
  """Scores completions against rubrics through a backend."""

  def __init__(self, judge_config, backend, cache_path=None, template=None):
    self.config = judge_config
    self.backend = backend
    self._template_hash = hashlib.sha256(
        (template or '').encode()).hexdigest()[:16]
    self._cache = {} if judge_config.cache != 'none' else None
    self._cache_path = cache_path if judge_config.cache == 'disk' else None
    # gs:// cannot append: the object is rewritten whole after each batch
    # that added verdicts (its lines kept here).
    self._remote_lines = ([] if self._cache_path
                          and storage.is_remote(self._cache_path) else None)
    self._unsaved = False
    if self._cache_path:
      self._load_cache()
    self._reset_metrics()
    self.last_verdicts = []

  # ----------------------------------------------------------------- cache
  def _key(self, task):
    blob = json.dumps(
        [self.backend.where, self.config.aggregation, self._template_hash,
         task['question'], task['reference'], task['response'],
         [[i['text'], i['weight']] for i in task['items']]],
        sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()

  def _load_cache(self):
    """Reads the cache file (on gs://, every process's object)."""
    if self._remote_lines is None:
      if not os.path.exists(self._cache_path):
        return
      with open(self._cache_path, encoding='utf-8') as f:
        lines = f.read().splitlines()
    else:
      base = self._cache_path.rsplit('/', 1)[0]
      lines = []
      for found in storage.glob(base, CACHE_FILE.replace('.jsonl', '*.jsonl')):
        found_lines = storage.read_text(found).splitlines()
        lines += found_lines
        if found == self._cache_path:  # This process's own object.
          self._remote_lines = found_lines
    for line in lines:
      try:
        entry = json.loads(line)
        self._cache[entry['key']] = (float(entry['score']), entry['met'])
      except (ValueError, KeyError, TypeError):
        continue  # A line cut by a crash: its verdict is asked again.
    logging.info('Judge cache: %s verdicts from %s.', len(self._cache),
                 self._cache_path)

  def _store(self, key, verdict):
    if self._cache is None:
      return
    self._cache[key] = (verdict.score, verdict.met)
    if not self._cache_path:
      return
    line = json.dumps({'key': key, 'score': verdict.score,
                       'met': verdict.met})
    if self._remote_lines is not None:
      self._remote_lines.append(line)
      self._unsaved = True
      return
    with open(self._cache_path, 'a', encoding='utf-8') as f:
      f.write(line + '\n')

  def _save_remote_cache(self):
    if self._unsaved:
      storage.write_text(self._cache_path,
                         ''.join(f'{line}\n' for line in self._remote_lines))
      self._unsaved = False

  # --------------------------------------------------------------- scoring
  def task(self, question, reference, response, items):
    """A task; the response is cut to judge.max_response_chars."""
    limit = int(self.config.max_response_chars)
    if len(response) > limit:
      self._metrics['truncated'] += 1
      response = response[:limit]
    return {'question': question, 'reference': reference,
            'response': response, 'items': items}

  def verdicts(self, tasks):
    """One Verdict per task (cached ones without a call)."""
    start = time.perf_counter()
    out = [None] * len(tasks)
    keys = [self._key(t) for t in tasks]
    todo = []
    for i, key in enumerate(keys):
      if self._cache is not None and key in self._cache:
        score, met = self._cache[key]
        out[i] = verdicts_lib.Verdict(score, met=met)
      else:
        todo.append(i)
    # Identical requests in a batch (a group's equal completions) go once.
    first = {}
    for i in todo:
      first.setdefault(keys[i], i)
    unique = list(first.values())
    # A collective backend (the Gemma judge on several processes) is called
    # on every process each time, with or without work of its own.
    answers = (self.backend.judge([tasks[i] for i in unique])
               if unique or self.backend.collective else [])
    by_key = {}
    for i, verdict in zip(unique, answers):
      by_key[keys[i]] = verdict
      if verdict.failure is None:
        self._store(keys[i], verdict)
    for i in todo:
      out[i] = by_key[keys[i]]
    self._save_remote_cache()
    m = self._metrics
    m['requests'] += len(unique)
    m['cache_hits'] += len(tasks) - len(unique)
    m['completions'] += len(tasks)
    m['wall_s'] += time.perf_counter() - start
    for i in unique:
      verdict = by_key[keys[i]]
      m['latencies'].append(verdict.latency_s)
      m['retries'] += verdict.retries
      if verdict.failure:
        m['failed'][verdict.failure] += 1
    for task, verdict in zip(tasks, out):
      if verdict.met is None:
        continue
      for item, met in zip(task['items'], verdict.met):
        for name in (item['category'] or 'uncategorised', 'overall'):
          m['items'][name] += 1
          m['met'][name] += int(met)
    return out

  def score(self, tasks):
    """float32 [N] scores; NaN where a call failed and on_failure='mask'.

    Raises:
      JudgeError: a call failed and on_failure='error', or more than
        judge.max_failure_fraction of the calls failed.
    """
    verdict_list = self.verdicts(tasks)
    self.last_verdicts = verdict_list  # For the sample texts.
    failed = [i for i, v in enumerate(verdict_list) if v.failure]
    if failed:
      index = failed[0]
      verdict = verdict_list[index]
      share = len(failed) / len(tasks)
      policy = self.config.on_failure
      if policy == 'error' or share > self.config.max_failure_fraction:
        why = ('judge.on_failure=error' if policy == 'error' else
               f'{len(failed)} of {len(tasks)} completions failed, more than '
               f'judge.max_failure_fraction={self.config.max_failure_fraction}')
        instead = ('set judge.on_failure=mask to train on without failed '
                   'groups' if policy == 'error' else
                   'raise judge.max_failure_fraction')
        raise JudgeError(
            f'Judge {verdict.failure} on completion {index} (question '
            f'{_one_line(tasks[index]["question"], 60)!r}) at '
            f'{self.backend.where}: {_one_line(verdict.detail)} ({why}); '
            f'{_HINTS[verdict.failure]}, or {instead}.',
            index=index, completion=tasks[index]['response'])
      logging.warning('Judge: %s of %s completions failed (%s); their groups '
                      'get advantage 0.', len(failed), len(tasks),
                      _one_line(verdict.detail, 120))
    return np.asarray(
        [np.nan if v.failure else v.score for v in verdict_list], np.float32)

  def describe(self, index):
    """The last scored batch's verdicts on completion `index`, as text
    ('judge 0.62: 1 met, 2 not met, ...'), or '' when there is none."""
    if not 0 <= index < len(self.last_verdicts):
      return ''
    verdict = self.last_verdicts[index]
    if verdict.failure:
      return f'judge failed ({verdict.failure}): {_one_line(verdict.detail)}'
    marks = ', '.join(f'{i} {"met" if m else "not met"}'
                      for i, m in enumerate(verdict.met or [], 1))
    return f'judge {verdict.score:.3g}' + (f': {marks}' if marks else '')

  def canary(self):
    """Refuses a judge that cannot tell a good answer from a bad one.

    Raises:
      JudgeError: when a canary call fails or good does not beat bad.
    """
    tasks = [dict(CANARY, response=r) for r in (CANARY_GOOD, CANARY_BAD)]
    saved, self._cache = self._cache, None  # Always ask the server.
    try:
      good, bad = self.backend.judge(tasks)
    finally:
      self._cache = saved
      if hasattr(self.backend, 'take_http_requests'):
        self.backend.take_http_requests()  # Not the run's requests.
    for name, verdict in (('good', good), ('bad', bad)):
      if verdict.failure:
        raise JudgeError(
            f'The judge at {self.backend.where} failed its canary ({name} '
            f'answer): {verdict.failure}: {_one_line(verdict.detail)}; '
            f'{_HINTS[verdict.failure]} (judge.canary=False skips this '
            'check).')
    if not good.score > bad.score:
      raise JudgeError(
          f'The judge at {self.backend.where} failed its canary: it scored a '
          f'right answer {good.score:.3g} and a wrong one {bad.score:.3g} '
          f'(the right one must score higher); {self.backend.canary_hint} '
          '(judge.canary=False skips this check).')
    logging.info('Judge canary passed at %s: good %.3g > bad %.3g.',
                 self.backend.where, good.score, bad.score)

  # --------------------------------------------------------------- metrics
  def _reset_metrics(self):
    self._metrics = {
        'requests': 0, 'cache_hits': 0, 'completions': 0, 'retries': 0,
        'wall_s': 0.0, 'truncated': 0, 'latencies': [],
        'failed': collections.Counter(), 'items': collections.Counter(),
        'met': collections.Counter()}

  def take_metrics(self):
    """judge/* scalars since the last call (then starts counting anew).

    Counts and pass rates are over every process's calls (a collective on
    several processes: every process calls this as often as the others);
    wall time and latencies are this process's.
    """
    m = self._metrics
    http_sent = 0
    if hasattr(self.backend, 'take_http_requests'):
      http_sent = self.backend.take_http_requests()
    counts = {
        'requests': m['requests'],
        'retries': m['retries'] + max(
            0, http_sent - m['requests'] - m['retries']),
        'cache_hits': m['cache_hits'],
        'completions': m['completions'],
        'truncated': m['truncated'],
    }
    for kind in verdicts_lib.FAILURE_KINDS:
      counts[f'failed/{kind}'] = m['failed'][kind]
    for name in _PASS_RATE_NAMES:
      counts[f'items/{name}'] = m['items'][name]
      counts[f'met/{name}'] = m['met'][name]
    counts = _summed_over_processes(counts)
    out = {
        'judge/requests': counts['requests'],
        'judge/retries': counts['retries'],
        'judge/cache_hit_rate': (counts['cache_hits'] / counts['completions']
                                 if counts['completions'] else 0.0),
        'judge/wall_s': m['wall_s'],
        'judge/truncated': counts['truncated'],
        'judge/failed': float(sum(counts[f'failed/{kind}']
                                  for kind in verdicts_lib.FAILURE_KINDS)),
    }
    for kind in verdicts_lib.FAILURE_KINDS:
      out[f'judge/failed/{kind}'] = counts[f'failed/{kind}']
    if m['latencies']:
      out['judge/latency_s/p50'] = float(np.percentile(m['latencies'], 50))
      out['judge/latency_s/p95'] = float(np.percentile(m['latencies'], 95))
    for name in _PASS_RATE_NAMES:
      if counts[f'items/{name}']:
        out[f'judge/pass_rate/{name}'] = (counts[f'met/{name}']
                                          / counts[f'items/{name}'])
    self._reset_metrics()
    return out

  def close(self):
    close = getattr(self.backend, 'close', None)
    if close:
      close()


# Item categories counted for judge/pass_rate/* (rubrics' own, then the
# rest and all items).
_PASS_RATE_NAMES = tuple(c for c in rubrics.CATEGORIES if c) + (
    'uncategorised', 'overall')


def _summed_over_processes(counts):
  """{name: float} of `counts` summed over every process (a collective)."""
  names = sorted(counts)
  summed = sharding.sum_over_processes([counts[n] for n in names])
  return {n: float(v) for n, v in zip(names, summed)}


def _template(judge_config):
  if not judge_config.prompt_file:
    return None
  with open(judge_config.prompt_file, encoding='utf-8') as f:
    return f.read()


def from_config(config, workdir=None, model=None, tokenizer=None):
  """The run's judge (backend per judge.backend).

  Args:
    config: the full config.
    workdir: the run directory (judge.cache='disk' keeps its file there).
    model, tokenizer: the policy's, for judge.backend='gemma' without its
      own weights (LoRA is switched off while it judges).
  """
  c = config.judge
  template = _template(c)
  if c.backend == 'http':
    from agent_tunix.judge import openai_backend  # pylint: disable=g-import-not-at-top
    backend = openai_backend.OpenAIBackend(c, template)
  else:
    from agent_tunix.judge import gemma_backend  # pylint: disable=g-import-not-at-top
    backend = gemma_backend.GemmaBackend.from_config(config, model, tokenizer,
                                                     template)
  cache_path = None
  if workdir:
    # Processes judge their own rows: on gs:// (a pod's shared workdir)
    # each keeps its own object, and every process reads them all.
    name = CACHE_FILE
    index = jax.process_index()
    if storage.is_remote(workdir) and index:
      name = CACHE_FILE.replace('.jsonl', f'.{index}.jsonl')
    cache_path = f'{workdir.rstrip("/")}/{name}'
  return Judge(c, backend, cache_path, template)


def uses_judge(config):
  """True when a listed reward needs the judge."""
  from agent_tunix import rewards  # pylint: disable=g-import-not-at-top
  return any(name == 'rubric_judge'
             for name, _ in rewards.parse_spec(config.rewards.functions))


__all__ = ['Judge', 'JudgeError', 'from_config', 'uses_judge', 'prompts']
