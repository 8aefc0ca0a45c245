"""A Cloud Storage API on loopback for the tests: gcp-storage-emulator, and a
proxy in front of it that enforces generation preconditions and injects
faults.

  with gcs_emulator.emulator() as gcs:
    os.environ.update(gcs.env)          # STORAGE_EMULATOR_HOST=<the proxy>
    gcs.proxy.fail(503, times=2)        # the next 2 requests get a 503
    ... gs://{gcs.bucket}/run ...

The emulator (pure Python, from PyPI) serves the JSON API but ignores the
preconditions Cloud Storage documents (ifGenerationMatch /
ifGenerationNotMatch: 412 when not met; checked on 2026.7.19: no handler
reads them). The proxy, the product's own emulator bridge
(agent_tunix/storage/emulator_bridge.py), applies them atomically with the
write they guard, as the service does, so the lock's exclusive create is
tested against the service's semantics; the product's fallback for an
emulator without them is tested against the bare emulator. The proxy also
answers Objects: move (a rename within a bucket, which gcsfs tries first),
which the emulator answers 501: gcsfs retried that for half a minute before
copying and deleting. Both listen on 127.0.0.1, pick free ports and stop
with the block.
"""

import contextlib
import dataclasses
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse

import portpicker

from agent_tunix.storage import emulator_bridge

@dataclasses.dataclass
class _Rule:
  status: int | str  # 'drop': close the connection without answering.
  times: int
  method: str | None
  path: re.Pattern | None


class Proxy(emulator_bridge.Bridge):
  """The product's emulator bridge (preconditions, the generation header)
  plus injected faults and a log of the requests seen."""

  def __init__(self, upstream_port):
    super().__init__('127.0.0.1', upstream_port)
    self._rules = []
    self._rules_lock = threading.Lock()
    self.requests = []  # (method, path) of every request seen.

  def fail(self, status, times=1, method=None, path=None):
    """The next `times` matching requests get `status` ('drop': the
    connection is closed unanswered). `path`: a regex searched in the
    request's path and query."""
    with self._rules_lock:
      self._rules.append(_Rule(status, times, method,
                               re.compile(path) if path else None))

  def clear(self):
    with self._rules_lock:
      self._rules.clear()

  def intercept(self, method, path):
    self.requests.append((method, path))
    with self._rules_lock:
      for rule in self._rules:
        if rule.times > 0 and rule.method in (None, method) and (
            rule.path is None or rule.path.search(path)):
          rule.times -= 1
          return rule.status
    return None

  def forward(self, method, path, headers, body):
    """Also answers Objects: move, which the emulator lacks (501)."""
    url = urllib.parse.urlsplit(path)
    found = _MOVE.match(url.path)
    if method != 'POST' or not found:
      return super().forward(method, path, headers, body)
    return self._move(*found.groups())

  def _move(self, bucket, source, target):
    """Objects: move as the service does it within a bucket: the object
    is there under its new name and gone under the old one."""
    status, headers, data = self._call(
        'POST', f'/storage/v1/b/{bucket}/o/{source}/rewriteTo/b/{bucket}/o/'
        f'{target}', {'Content-Type': 'application/json'}, b'{}')
    if status != 200:
      return status, headers, data
    self._call('DELETE', f'/storage/v1/b/{bucket}/o/{source}', {}, b'')
    return 200, [('Content-Type', 'application/json')], json.dumps(
        json.loads(data)['resource']).encode()


# Objects: move (POST .../b/BUCKET/o/SOURCE/moveTo/o/TARGET), names quoted.
_MOVE = re.compile(r'/storage/v1/b/([^/]+)/o/([^/]+)/moveTo/o/([^/]+)$')


@dataclasses.dataclass
class Emulator:
  url: str  # The proxy's URL: what clients are pointed at.
  bucket: str
  proxy: Proxy
  emulator_port: int

  @property
  def bare_url(self):
    """The emulator itself, without the proxy (no preconditions)."""
    return f'http://127.0.0.1:{self.emulator_port}'

  @property
  def env(self):
    """Variables a client process needs (only the standard one)."""
    return {'STORAGE_EMULATOR_HOST': self.url}

  def make_bucket(self, name):
    conn = http.client.HTTPConnection('127.0.0.1', self.emulator_port,
                                      timeout=30)
    conn.request('POST', '/storage/v1/b?project=test',
                 body=json.dumps({'name': name}),
                 headers={'Content-Type': 'application/json'})
    response = conn.getresponse()
    response.read()
    conn.close()
    assert response.status in (200, 409), response.status

  def delete(self, name):
    """Deletes one object straight at the emulator (as another client)."""
    conn = http.client.HTTPConnection('127.0.0.1', self.emulator_port,
                                      timeout=30)
    conn.request('DELETE', f'/storage/v1/b/{self.bucket}/o/'
                 + urllib.parse.quote(name, safe=''))
    response = conn.getresponse()
    response.read()
    conn.close()
    assert response.status in (200, 204), (name, response.status)

  def list(self, prefix=''):
    """Object names in the bucket under `prefix` (straight from the
    emulator, not through the proxy)."""
    names, token = [], None
    while True:
      query = {'prefix': prefix, 'maxResults': 1000}
      if token:
        query['pageToken'] = token
      conn = http.client.HTTPConnection('127.0.0.1', self.emulator_port,
                                        timeout=30)
      conn.request('GET', f'/storage/v1/b/{self.bucket}/o?'
                   + urllib.parse.urlencode(query))
      data = json.loads(conn.getresponse().read())
      conn.close()
      names += [item['name'] for item in data.get('items', [])]
      token = data.get('nextPageToken')
      if not token:
        return names


def _wait_ready(port, process, deadline_s=30.0):
  end = time.monotonic() + deadline_s
  while time.monotonic() < end:
    if process.poll() is not None:
      raise RuntimeError(f'the emulator exited with {process.returncode}')
    try:
      conn = http.client.HTTPConnection('127.0.0.1', port, timeout=2)
      conn.request('GET', '/storage/v1/b?project=test')
      conn.getresponse().read()
      conn.close()
      return
    except OSError:
      time.sleep(0.1)
  raise RuntimeError(f'the emulator did not answer on port {port} in '
                     f'{deadline_s:.0f} s')


@contextlib.contextmanager
def emulator(bucket='test-bucket'):
  """Starts the emulator and the proxy; yields an Emulator; stops both."""
  port = portpicker.pick_unused_port()
  process = subprocess.Popen(
      [sys.executable, '-m', 'gcp_storage_emulator', 'start', '--host',
       '127.0.0.1', '--port', str(port), '--default-bucket', bucket, '-q',
       '--in-memory'],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
      env={k: v for k, v in os.environ.items()
           if k != 'STORAGE_EMULATOR_HOST'})
  proxy = None
  try:
    _wait_ready(port, process)
    proxy = Proxy(port)
    yield Emulator(f'http://127.0.0.1:{proxy.port}', bucket, proxy, port)
  finally:
    if proxy is not None:
      proxy.close()
    process.terminate()
    try:
      process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()
