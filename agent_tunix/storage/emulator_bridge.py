"""A loopback bridge between tensorstore and a Cloud Storage emulator.

gcp-storage-emulator (the emulator the tests and the docs use) serves the
JSON API but leaves out two things the service does and tensorstore (Orbax's
array writer) relies on: the x-goog-generation header on an object's bytes
(without it tensorstore fails with "Malformed StorageGeneration") and the
generation preconditions (ifGenerationMatch / ifGenerationNotMatch), which
it ignores. With STORAGE_EMULATOR_HOST set, `endpoint.configure` starts
this bridge in the process and points tensorstore at it: requests are
forwarded as they are, the header is added from the object's metadata, and
preconditions are checked before the request they guard, atomically within
this process (the service makes them atomic across processes; the run lock
does not rely on this bridge for that). Never used on the real service.
"""

import http.client
import http.server
import json
import re
import socket
import threading
import urllib.parse

_HOP = frozenset(('connection', 'keep-alive', 'transfer-encoding', 'te',
                  'trailer', 'upgrade', 'proxy-connection', 'content-length',
                  'host'))


def error_body(status, message):
  """A JSON API error body."""
  return json.dumps({'error': {'code': status, 'message': message,
                               'errors': [{'message': message}]}}).encode()


def _object_of(path, query, headers, body):
  """(bucket, object name) a JSON API request is about."""
  found = re.match(r'(?:/upload|/download)?/storage/v1/b/([^/]+)/o(?:/(.+))?$',
                   path)
  if not found:
    raise ValueError(f'no object in {path}')
  bucket, name = found.group(1), found.group(2)
  if name:
    return bucket, urllib.parse.unquote(name)
  if 'name' in query:
    return bucket, query['name'][0]
  # A multipart upload names the object in its JSON part.
  kind = {k.lower(): v for k, v in headers.items()}.get('content-type', '')
  if 'multipart' in kind:
    start = body.find(b'{')
    end = body.find(b'}', start)
    return bucket, json.loads(body[start:end + 1])['name']
  raise ValueError(f'no object name in {path}')


class Bridge:
  """Forwards HTTP to `upstream` (host, port), as the module docstring says.

  Subclasses may answer a request themselves by overriding `intercept`.
  """

  def __init__(self, upstream_host, upstream_port):
    self._upstream = (upstream_host, upstream_port)
    self._write_lock = threading.Lock()
    bridge = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = 'HTTP/1.1'

      def log_message(self, *args):
        del args

      def _body(self):
        if self.headers.get('Transfer-Encoding', '').lower() == 'chunked':
          chunks = []
          while True:
            size = int(self.rfile.readline().strip().split(b';')[0], 16)
            if size == 0:
              self.rfile.readline()
              return b''.join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
        length = int(self.headers.get('Content-Length') or 0)
        return self.rfile.read(length) if length else b''

      def _handle(self):
        try:
          body = self._body()
          answer = bridge.intercept(self.command, self.path)
          if answer == 'drop':
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
          if answer is not None:
            self._reply(answer, error_body(
                answer, http.client.responses.get(answer, 'error')))
            return
          status, headers, data = bridge.forward(
              self.command, self.path, dict(self.headers), body)
          self._reply(status, data, headers)
        except (BrokenPipeError, ConnectionResetError):
          self.close_connection = True

      def _reply(self, status, data, headers=()):
        self.send_response(status)
        sent_type = False
        for key, value in headers:
          if key.lower() in _HOP:
            continue
          sent_type |= key.lower() == 'content-type'
          self.send_header(key, value)
        if not sent_type:
          self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        if self.command != 'HEAD':
          self.wfile.write(data)

      do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle

    self._server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self._server.daemon_threads = True
    self.port = self._server.server_address[1]
    self.url = f'http://127.0.0.1:{self.port}'
    self._thread = threading.Thread(target=self._server.serve_forever,
                                    daemon=True, name='gcs_emulator_bridge')
    self._thread.start()

  def close(self):
    self._server.shutdown()
    self._server.server_close()

  def intercept(self, method, path):
    """None to forward; else a status to answer with, or 'drop'."""
    del method, path
    return None

  def _call(self, method, path, headers, body):
    conn = http.client.HTTPConnection(*self._upstream, timeout=120)
    try:
      conn.request(method, path, body=body or None, headers={
          k: v for k, v in headers.items() if k.lower() not in _HOP})
      response = conn.getresponse()
      return response.status, response.getheaders(), response.read()
    finally:
      conn.close()

  def _generation(self, bucket, name):
    status, _, data = self._call(
        'GET', f'/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe="")}',
        {}, b'')
    if status == 404:
      return 0
    return int(json.loads(data)['generation'])

  def forward(self, method, path, headers, body):
    """(status, headers, body) for one request, preconditions applied."""
    url = urllib.parse.urlsplit(path)
    query = urllib.parse.parse_qs(url.query)
    match = query.get('ifGenerationMatch')
    no_match = query.get('ifGenerationNotMatch')
    if not (match or no_match):
      return self._with_generation(
          method, url, *self._call(method, path, headers, body))
    bucket, name = _object_of(url.path, query, headers, body)
    with self._write_lock:  # The check and the write are one step.
      current = self._generation(bucket, name)
      reading = method in ('GET', 'HEAD')
      if no_match and current == int(no_match[0]) and reading:
        return 304, [], b''  # What the service answers a read.
      if (match and current != int(match[0])) or (
          no_match and current == int(no_match[0])):
        return 412, [], error_body(412, 'At least one of the pre-conditions '
                                   'you specified did not hold.')
      if current == 0 and (reading or method == 'DELETE'):
        return 404, [], error_body(404, 'No such object.')
      return self._with_generation(
          method, url, *self._call(method, path, headers, body))

  def _with_generation(self, method, url, status, headers, data):
    """Adds the x-goog-generation header the service sends with an
    object's bytes."""
    if (method not in ('GET', 'HEAD') or status != 200
        or 'alt=media' not in url.query
        or any(k.lower() == 'x-goog-generation' for k, _ in headers)):
      return status, headers, data
    found = re.match(r'/(?:download/)?storage/v1/b/([^/]+)/o/(.+)$', url.path)
    if not found:
      return status, headers, data
    generation = self._generation(found.group(1),
                                  urllib.parse.unquote(found.group(2)))
    return status, list(headers) + [
        ('x-goog-generation', str(generation)),
        ('x-goog-metageneration', '1')], data


def start(emulator_url):
  """Starts a Bridge to `emulator_url` ('http://host:port'); returns it."""
  parts = urllib.parse.urlsplit(emulator_url)
  return Bridge(parts.hostname, parts.port or 80)
