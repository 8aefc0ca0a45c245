"""judge.backend='http': any OpenAI-compatible chat-completions server.

Requests go through the `openai` client library: its per-request timeout,
its retries with exponential backoff that honour Retry-After (on timeouts,
connection errors, 408/409/429 and 5xx) are what users of vLLM, SGLang,
llama.cpp's server and hosted APIs already run. A thread pool of
judge.max_concurrency workers sends a step's requests at once; results
keep the tasks' order. A reply that is not the JSON asked for is asked
again, up to judge.max_retries times.

The API key is read from the environment variable named by
judge.api_key_env at start-up; it never enters the config or the logs.
"""

import concurrent.futures
import os
import threading
import time

from agent_tunix.judge import prompts
from agent_tunix.judge import verdicts

# Sent when judge.api_key_env is unset (local servers ignore it).
_NO_KEY = 'EMPTY'


class OpenAIBackend:
  """Judges tasks through an OpenAI-compatible server."""

  canary_hint = 'check judge.model and the prompt (judge.prompt_file)'
  # Each process sends its own requests: no call needs the others.
  collective = False

  def __init__(self, judge_config, template=None):
    import openai  # pylint: disable=g-import-not-at-top
    import httpx2  # pylint: disable=g-import-not-at-top  # openai's HTTP.
    self._openai = openai
    c = judge_config
    self.base_url = c.base_url
    self.model = c.model
    self._aggregation = c.aggregation
    self._template = template
    self._temperature = float(c.temperature)
    self._max_tokens = int(c.max_tokens)
    self._max_retries = int(c.max_retries)
    self._lock = threading.Lock()
    self._sent = 0
    # Counts every HTTP request the client sends, retries included.
    http_client = httpx2.Client(
        event_hooks={'request': [self._count_request]},
        timeout=float(c.timeout_s))
    self._client = openai.OpenAI(
        base_url=c.base_url,
        api_key=os.environ.get(c.api_key_env or '', '') or _NO_KEY,
        timeout=float(c.timeout_s), max_retries=self._max_retries,
        http_client=http_client)
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=int(c.max_concurrency), thread_name_prefix='judge')

  def _count_request(self, request):
    del request
    with self._lock:
      self._sent += 1

  @property
  def where(self):
    return f'{self.base_url} (model {self.model!r})'

  def take_http_requests(self):
    """HTTP requests sent since the last call (retries included)."""
    with self._lock:
      sent, self._sent = self._sent, 0
    return sent

  def judge(self, tasks):
    """One `verdicts.Verdict` per task, in order."""
    return list(self._pool.map(self._judge_one, tasks))

  def _judge_one(self, task):
    start = time.perf_counter()
    messages = prompts.messages(task, self._aggregation, self._template)
    reply, retries = '', 0
    for attempt in range(self._max_retries + 1):
      try:
        response = self._client.chat.completions.create(
            model=self.model, messages=messages,
            temperature=self._temperature, max_tokens=self._max_tokens)
      except self._openai.APITimeoutError:
        return verdicts.failed('timeout', 'no reply within judge.timeout_s',
                               start, retries)
      except self._openai.APIStatusError as e:
        body = str(getattr(e, 'body', '') or e.message)[:200]
        return verdicts.failed('http', f'HTTP {e.status_code}: {body!r}',
                               start, retries)
      except self._openai.APIConnectionError as e:
        return verdicts.failed('connection', f'{type(e).__name__}: {e}',
                               start, retries)
      except self._openai.OpenAIError as e:
        return verdicts.failed('http', f'{type(e).__name__}: {e}', start,
                               retries)
      choices = getattr(response, 'choices', None) or []
      reply = (choices[0].message.content or '') if choices else ''
      try:
        return verdicts.read(task, reply, self._aggregation, start, retries)
      except prompts.Unparseable as e:
        problem = str(e)
        if attempt < self._max_retries:
          retries += 1
    return verdicts.failed(
        'unparseable', f'{problem}; reply {reply[:200]!r}', start, retries)

  def close(self):
    self._pool.shutdown(wait=False, cancel_futures=True)
    self._client.close()
