"""A fake OpenAI-compatible judge server for tests (127.0.0.1, port 0).

It judges by rules: an item is met when the word it quotes ('...') is in
the response, and 'at most two sentences' when the response has at most
two full stops. A script (a list, consumed per request; then `default`)
says how to answer each request: 'ok', 'rating', 'bad_json',
'wrong_count', 'out_of_range', 'all_met', an HTTP status (500, 429) or
'hang' (sleeps past the client's timeout). The server counts requests and
the peak in flight, refuses more than `max_requests` (HTTP 503) and stops
by itself after `lifetime_s`.
"""

import http.server
import json
import re
import threading
import time

_QUOTED = re.compile(r"'([^']+)'")


def rule_verdicts(user_text):
  """[met, ...] for the numbered criteria of a built-in explicit prompt."""
  response = re.search(r'<response>\n(.*?)\n</response>', user_text,
                       re.S).group(1).lower()
  criteria = re.search(r'<criteria>\n(.*?)\n</criteria>', user_text,
                       re.S).group(1)
  met = []
  for line in criteria.splitlines():
    text = re.sub(r'^\d+\.\s*', '', line)
    quoted = _QUOTED.search(text)
    if quoted:
      met.append(quoted.group(1).lower() in response)
    elif 'two sentences' in text or 'one short sentence' in text:
      met.append(response.count('.') <= (2 if 'two' in text else 1))
    elif 'capital of france is paris' in text.lower():
      met.append('paris' in response)
    else:
      met.append(False)
  return met


class FakeJudge:
  """The server; use as a context manager."""

  def __init__(self, script=(), default='ok', max_requests=200,
               lifetime_s=120.0, hang_s=3.0, retry_after='0'):
    self.script = list(script)
    self.default = default
    self.max_requests = max_requests
    self.hang_s = hang_s
    self.retry_after = retry_after
    self.requests = 0
    self.in_flight = 0
    self.peak_in_flight = 0
    self.bodies = []
    self._lock = threading.Lock()
    self._stop = threading.Event()
    fake = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def log_message(self, *args):
        del args

      def do_POST(self):  # pylint: disable=invalid-name
        fake._handle(self)

    self._server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self._server.daemon_threads = True
    self.url = f'http://127.0.0.1:{self._server.server_address[1]}/v1'
    self._thread = threading.Thread(target=self._server.serve_forever,
                                    daemon=True)
    self._timer = threading.Timer(lifetime_s, self.close)
    self._timer.daemon = True

  def __enter__(self):
    self._thread.start()
    self._timer.start()
    return self

  def __exit__(self, *exc):
    self.close()

  def close(self):
    if not self._stop.is_set():
      self._stop.set()
      self._timer.cancel()
      self._server.shutdown()
      self._server.server_close()

  def _handle(self, handler):
    length = int(handler.headers.get('Content-Length', 0))
    body = json.loads(handler.rfile.read(length) or b'{}')
    with self._lock:
      self.requests += 1
      over = self.requests > self.max_requests
      mode = self.script.pop(0) if self.script else self.default
      self.in_flight += 1
      self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
      self.bodies.append(body)
    headers = None
    try:
      if over:
        status, payload = 503, {'error': 'too many requests in this test'}
      elif isinstance(mode, int):
        headers = {'Retry-After': self.retry_after} if mode == 429 else {}
        status, payload = mode, {'error': {'message': f'status {mode}'}}
      else:
        if mode == 'hang':
          self._stop.wait(self.hang_s)
        elif mode == 'slow':
          time.sleep(0.2)
        status, payload = 200, self._completion(body, mode)
    finally:
      # Before the reply goes out: a client that has its answer may send
      # the next request at once, which must not count as a third in flight.
      with self._lock:
        self.in_flight -= 1
    self._send(handler, status, payload, headers)

  def _completion(self, body, mode):
    user = body['messages'][-1]['content']
    met = rule_verdicts(user)
    if mode == 'all_met':
      met = [True] * len(met)
    if mode in ('ok', 'hang', 'slow', 'all_met'):
      content = json.dumps({'verdicts': [
          {'id': i + 1, 'met': m} for i, m in enumerate(met)]})
    elif mode == 'wrong_count':
      content = json.dumps({'verdicts': [{'id': 1, 'met': True}]})
    elif mode == 'bad_json':
      content = 'Sure! Here are my verdicts: item 1 is met.'
    elif mode == 'rating':
      content = json.dumps({'rating': 1 + round(9 * sum(met) / len(met))})
    elif mode == 'out_of_range':
      content = json.dumps({'rating': 11})
    else:
      raise ValueError(mode)
    return {'id': 'x', 'object': 'chat.completion', 'created': 0,
            'model': body.get('model', ''),
            'choices': [{'index': 0, 'finish_reason': 'stop',
                         'message': {'role': 'assistant',
                                     'content': content}}],
            'usage': {'prompt_tokens': 1, 'completion_tokens': 1,
                      'total_tokens': 2}}

  def _send(self, handler, status, payload, headers=None):
    data = json.dumps(payload).encode()
    try:
      handler.send_response(status)
      handler.send_header('Content-Type', 'application/json')
      handler.send_header('Content-Length', str(len(data)))
      for key, value in (headers or {}).items():
        handler.send_header(key, value)
      handler.end_headers()
      handler.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):
      pass  # The client gave up (a timeout test).
