"""Runs tool calls on host threads, with a timeout and an output cap.

The calls of one turn run concurrently, at most `max_workers` at a time,
each on its own daemon thread with its own deadline. A call still running
at its deadline gives a 'timeout' result and is abandoned: Python cannot
stop a thread, so it runs on, but as a daemon thread it blocks neither
later calls nor the interpreter's exit (a `ThreadPoolExecutor`'s workers
would be joined at exit). Abandoned threads still running are counted; at
`max_abandoned` of them, new calls are refused with a 'busy' result rather
than leaking threads without bound.

Every outcome is a `CallResult` whose `text` is what the model sees: the
tool's return value as str, cut in the middle to `max_output_chars`
(`truncate_middle`) and stripped of control tokens (the `sanitize`
callable), or 'error: ...'. Nothing here raises on a failing tool.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
import dataclasses
import queue
import threading
import time
from typing import Any

from absl import logging

from agent_tunix.agent import formats
from agent_tunix.agent import tools as tools_lib

# CallResult.error values.
ERROR_UNKNOWN_TOOL = 'unknown_tool'  # No tool of that name.
ERROR_ARGUMENTS = 'arguments'  # The arguments do not fit the tool.
ERROR_EXCEPTION = 'exception'  # The tool raised.
ERROR_TIMEOUT = 'timeout'  # The tool ran past its deadline.
ERROR_BUSY = 'busy'  # Refused: too many abandoned calls still running.
ERRORS = (ERROR_UNKNOWN_TOOL, ERROR_ARGUMENTS, ERROR_EXCEPTION, ERROR_TIMEOUT,
          ERROR_BUSY)

# The longest exception message kept, in characters.
MAX_ERROR_CHARS = 300


@dataclasses.dataclass(frozen=True)
class CallResult:
  """The outcome of one call.

  Attributes:
    name: The tool called, as written by the model.
    arguments: The arguments as written by the model.
    text: What the model sees: the output, or 'error: ...'.
    error: None on success, else one of `ERRORS` (or a caller's own kind,
      e.g. the environment's 'parse').
    seconds: Wall time of the call (0 when it never ran).
    injected_markers: Control tokens removed from the output.
  """

  name: str | None
  arguments: Mapping[str, Any]
  text: str
  error: str | None
  seconds: float = 0.0
  injected_markers: int = 0


def truncate_middle(text: str, max_chars: int) -> str:
  """`text` with its middle replaced by a marker when over `max_chars`.

  The start and end are kept (a result's head and its last line, such as a
  traceback's error, are the informative parts): `max_chars` characters of
  `text` in all, plus the marker ' …[truncated N chars]… '.

  Args:
    text: Any text.
    max_chars: How many of its characters to keep (>= 0).

  Returns:
    The text, or its head, the marker and its tail.
  """
  if len(text) <= max_chars:
    return text
  head = (max_chars + 1) // 2
  tail = max_chars - head
  dropped = len(text) - max_chars
  return (text[:head] + f' …[truncated {dropped} chars]… '
          + (text[len(text) - tail:] if tail else ''))


@dataclasses.dataclass
class _Job:
  """One running call."""

  index: int
  call: Any
  tool: tools_lib.Tool
  arguments: dict
  started: float
  deadline: float
  thread: threading.Thread | None = None
  text: str = ''
  markers: int = 0
  error: str | None = None
  seconds: float = 0.0


class Executor:
  """Runs calls against a fixed set of tools."""

  def __init__(self, tools: Iterable[tools_lib.Tool], timeout_s: float,
               max_output_chars: int,
               sanitize: Callable[[str], tuple[str, int]] = formats.sanitize,
               max_workers: int = 4, max_abandoned: int = 16):
    """Checks the settings.

    Args:
      tools: The tools (unique names).
      timeout_s: Per-call wall-time limit in seconds (> 0).
      max_output_chars: Characters of a result kept (>= 16); longer ones are
        cut in the middle.
      sanitize: text -> (clean text, markers removed); applied to every
        result text.
      max_workers: Calls of one `run` running at once (>= 1).
      max_abandoned: Abandoned (timed-out, still running) threads tolerated
        before new calls are refused (>= 1).

    Raises:
      ValueError: for a bad setting or two tools with one name.
    """
    self.tools = {}
    for tool in tools:
      if tool.name in self.tools:
        raise ValueError(f'Two tools are named {tool.name!r}.')
      self.tools[tool.name] = tool
    if not timeout_s > 0:
      raise ValueError(f'timeout_s={timeout_s!r} must be > 0 seconds.')
    if max_output_chars < 16:
      raise ValueError(
          f'max_output_chars={max_output_chars!r} must be >= 16.')
    if max_workers < 1 or max_abandoned < 1:
      raise ValueError(
          f'max_workers={max_workers!r} and max_abandoned={max_abandoned!r} '
          'must be >= 1.')
    self.timeout_s = float(timeout_s)
    self.max_output_chars = int(max_output_chars)
    self.max_workers = int(max_workers)
    self.max_abandoned = int(max_abandoned)
    self._sanitize = sanitize
    self._abandoned: list[threading.Thread] = []
    self._lock = threading.Lock()
    self._closed = False

  @property
  def abandoned(self) -> int:
    """Timed-out calls whose threads are still running."""
    with self._lock:
      self._abandoned = [t for t in self._abandoned if t.is_alive()]
      return len(self._abandoned)

  def close(self) -> None:
    """Refuses further calls. Abandoned threads are left to finish."""
    self._closed = True
    if self.abandoned:
      logging.warning('Tool executor closed with %d timed-out calls still '
                      'running (daemon threads).', self.abandoned)

  def __enter__(self) -> 'Executor':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def run(self, calls: Sequence[Any],
          timeout_s: float | None = None) -> list[CallResult]:
    """Runs the calls of one turn and returns their results in order.

    Args:
      calls: Objects with `name` and `arguments` (`formats.Call`).
      timeout_s: This run's per-call limit when lower than the executor's
        (e.g. what is left of an episode's time).

    Returns:
      One `CallResult` per call, in the calls' order.

    Raises:
      RuntimeError: after `close`.
    """
    if self._closed:
      raise RuntimeError('Executor.run after close().')
    limit = self.timeout_s if timeout_s is None else max(
        0.0, min(self.timeout_s, float(timeout_s)))
    results: list[CallResult | None] = [None] * len(calls)
    pending = []
    for index, call in enumerate(calls):
      tool = self.tools.get(call.name)
      if tool is None:
        known = ', '.join(sorted(self.tools)) or 'none'
        results[index] = self._failure(
            call, ERROR_UNKNOWN_TOOL,
            f'unknown tool {call.name!r} (tools: {known})')
        continue
      try:
        arguments = tools_lib.check_arguments(tool, call.arguments)
      except tools_lib.ToolArgumentError as e:
        results[index] = self._failure(call, ERROR_ARGUMENTS, str(e))
        continue
      pending.append((index, call, tool, arguments))
    done: queue.Queue[_Job] = queue.Queue()
    running: dict[int, _Job] = {}
    pending.reverse()
    while pending or running:
      while pending and len(running) < self.max_workers:
        index, call, tool, arguments = pending.pop()
        if self.abandoned >= self.max_abandoned:
          results[index] = self._failure(
              call, ERROR_BUSY,
              'tool unavailable: too many earlier calls timed out')
          continue
        now = time.monotonic()
        job = _Job(index, call, tool, arguments, now, now + limit)
        job.thread = threading.Thread(
            target=self._work, args=(job, done), daemon=True,
            name=f'tool-{tool.name}')
        running[index] = job
        job.thread.start()
      if not running:
        continue
      wait = min(j.deadline for j in running.values()) - time.monotonic()
      try:
        finished = done.get(timeout=max(wait, 0.0))
        # A job may finish just after it was timed out: its result stays.
        if running.pop(finished.index, None) is finished:
          results[finished.index] = self._finished(finished)
      except queue.Empty:
        pass
      now = time.monotonic()
      for index, job in list(running.items()):
        if now >= job.deadline:
          del running[index]
          results[index] = self._timed_out(job, limit, now)
    return results

  def _work(self, job: _Job, done: queue.Queue) -> None:
    """Thread body: calls the tool and prepares its text."""
    try:
      value = job.tool.fn(**job.arguments)
      job.text, job.markers = self._clean(str(value))
    except BaseException as e:  # pylint: disable=broad-exception-caught
      # BaseException too: a tool's sys.exit() must not end the thread
      # without a result.
      job.error = ERROR_EXCEPTION
      job.text, job.markers = self._clean(_exception_text(e))
    finally:
      job.seconds = time.monotonic() - job.started
      done.put(job)

  def _finished(self, job: _Job) -> CallResult:
    return CallResult(job.call.name, job.call.arguments, job.text, job.error,
                      job.seconds, job.markers)

  def _timed_out(self, job: _Job, limit: float, now: float) -> CallResult:
    with self._lock:
      self._abandoned.append(job.thread)
    logging.log_every_n_seconds(
        logging.WARNING, 'Tool %r timed out after %.3g s; its thread is '
        'abandoned (%d abandoned threads running).', 60, job.tool.name, limit,
        self.abandoned)
    return CallResult(job.call.name, job.call.arguments,
                      f'error: {job.tool.name} timed out after {limit:.3g} s',
                      ERROR_TIMEOUT, now - job.started)

  def _failure(self, call: Any, error: str, message: str) -> CallResult:
    text, markers = self._clean(f'error: {message}')
    return CallResult(call.name, call.arguments, text, error, 0.0, markers)

  def _clean(self, text: str) -> tuple[str, int]:
    return self._sanitize(truncate_middle(text, self.max_output_chars))


def _exception_text(error: BaseException) -> str:
  """'error: Type: last line of the message', the message cut short."""
  lines = str(error).strip().splitlines()
  message = truncate_middle(lines[-1].strip() if lines else '',
                            MAX_ERROR_CHARS)
  name = type(error).__name__
  return f'error: {name}: {message}' if message else f'error: {name}'
