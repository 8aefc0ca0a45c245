"""Environments: what a multi-turn rollout asks when a model turn ends.

The decode loop keeps one environment per row and episode. It calls
`reset(example)` once, then `step(turn_text)` each time the row's model
turn ends; the `Reply` says whether the episode is over (`done`, with a
`finish` reason) or which text to insert before the model's next turn.
Any task that answers turns with text plugs in: tools (`ToolEnvironment`),
a game, a checker that gives feedback.

`ToolEnvironment` reads each turn with a tool-call format, runs the calls
with an `executor.Executor` and answers with the rendered results, within
limits:
  * a turn without a call is the final answer: done, finish 'answer';
  * an unreadable call turn gets an error result ('parse') and the model
    may try again;
  * calls beyond `max_calls_per_turn` in one turn are not run and get an
    error result ('too_many_calls');
  * a call turn that would take the episode past `max_tool_calls` (calls
    run plus unreadable call turns) is not answered: done, finish
    'max_tool_calls';
  * a call turn after `episode_timeout_s` of wall time since `reset` is not
    answered: done, finish 'timeout'; calls never run past that time.
It counts what happened (`EpisodeStats`) and keeps each call with its
result (`tool_calls`) for reward functions.
"""

import abc
from collections.abc import Callable, Mapping, Sequence
import dataclasses
import time
from typing import Any

from agent_tunix.agent import executor as executor_lib
from agent_tunix.agent import formats
from agent_tunix.agent import tools as tools_lib

# Reply.finish values of ToolEnvironment.
FINISH_ANSWER = 'answer'
FINISH_MAX_TOOL_CALLS = 'max_tool_calls'
FINISH_TIMEOUT = 'timeout'

# CallResult.error values the environment adds to the executor's.
ERROR_PARSE = 'parse'
ERROR_TOO_MANY_CALLS = 'too_many_calls'


@dataclasses.dataclass
class Reply:
  """The environment's answer to one model turn.

  Attributes:
    text: What to insert before the model's next turn; None when done.
    done: Whether the episode is over.
    calls: The turn's call results (empty when there were none).
    finish: Why the episode ended (when done), e.g. 'answer'.
    info: Anything else worth logging about the turn.
  """

  text: str | None
  done: bool
  calls: list[executor_lib.CallResult] = dataclasses.field(
      default_factory=list)
  finish: str | None = None
  info: dict[str, Any] = dataclasses.field(default_factory=dict)


class Environment(abc.ABC):
  """One episode's counterpart: answers the model's turns.

  A turn ends at an end token (`<end_of_turn>`). A model that does not
  write one (a pretrained model copying a few-shot prompt) can still end a
  turn: when it samples a token whose text holds one of `pause_texts`, the
  rollout asks `ends_turn` whether the turn so far is complete.
  """

  # Texts whose appearance in a sampled token makes the rollout ask
  # `ends_turn`; () = only end tokens end a turn.
  pause_texts: tuple[str, ...] = ()
  # Whether a turn that reached the per-turn token cap is a finished turn
  # that `step` answers (scripted episodes whose turns end by count);
  # False: the cap ends the episode (finish 'turn_tokens').
  answers_capped_turns: bool = False

  def ends_turn(self, partial_text: str) -> str | None:
    """Whether a turn that has not met an end token is complete.

    Args:
      partial_text: The turn's text so far.

    Returns:
      None when the turn goes on; else the text that closes it (e.g.
      '<end_of_turn>', inserted before the reply to `step`, which the
      rollout calls next; '' to close it with nothing).
    """
    del partial_text
    return None

  @abc.abstractmethod
  def reset(self, example: Mapping[str, Any]) -> None:
    """Starts an episode.

    Args:
      example: The dataset example the prompt came from (may be empty).
    """

  @abc.abstractmethod
  def step(self, turn_text: str) -> Reply:
    """Answers a finished model turn.

    Args:
      turn_text: The turn's text, without the piece that ended it.

    Returns:
      The reply.
    """

  @property
  def stats(self) -> dict[str, Any]:
    """Per-episode counters for metrics (none by default)."""
    return {}

  @property
  def tool_calls(self) -> list[dict[str, Any]]:
    """The episode's calls for rewards: {name, arguments, result, error}."""
    return []


@dataclasses.dataclass
class EpisodeStats:
  """What happened in one tool episode.

  Attributes:
    turns: Model turns seen by `step`.
    tool_calls: Calls passed to the executor (whatever their outcome).
    parse_errors: Call turns that could not be read.
    exec_errors: Calls that raised, or were refused as busy.
    timeouts: Calls that ran past their deadline.
    unknown_tool: Calls of a tool that does not exist.
    argument_errors: Calls whose arguments did not fit the tool.
    excess_calls: Calls beyond max_calls_per_turn, not run.
    tool_seconds: Wall time spent in calls.
    injected_markers: Control tokens removed from tool output.
    finish: Why the episode ended; None while it goes on.
  """

  turns: int = 0
  tool_calls: int = 0
  parse_errors: int = 0
  exec_errors: int = 0
  timeouts: int = 0
  unknown_tool: int = 0
  argument_errors: int = 0
  excess_calls: int = 0
  tool_seconds: float = 0.0
  injected_markers: int = 0
  finish: str | None = None

  def as_dict(self) -> dict[str, Any]:
    """The counters as a plain dict."""
    return dataclasses.asdict(self)


# Which EpisodeStats counter each error kind adds to.
_ERROR_COUNTERS = {
    executor_lib.ERROR_EXCEPTION: 'exec_errors',
    executor_lib.ERROR_BUSY: 'exec_errors',
    executor_lib.ERROR_TIMEOUT: 'timeouts',
    executor_lib.ERROR_UNKNOWN_TOOL: 'unknown_tool',
    executor_lib.ERROR_ARGUMENTS: 'argument_errors',
    ERROR_PARSE: 'parse_errors',
    ERROR_TOO_MANY_CALLS: 'excess_calls',
}


class ToolEnvironment(Environment):
  """Answers call turns with tool results (see the module docstring)."""

  def __init__(self, tools: Sequence[tools_lib.Tool],
               tool_format: formats.ToolFormat | str,
               executor: executor_lib.Executor,
               max_tool_calls: int = 3, max_calls_per_turn: int = 2,
               episode_timeout_s: float | None = None,
               answer_end: str = '',
               clock: Callable[[], float] = time.monotonic):
    """Sets the limits.

    Args:
      tools: The tools this episode may call; a call of any other name is
        an 'unknown_tool' error.
      tool_format: A `formats.ToolFormat` or its name.
      executor: Runs the calls (shared by many environments).
      max_tool_calls: Calls (plus unreadable call turns) per episode.
      max_calls_per_turn: Calls run per turn; the rest get an error.
      episode_timeout_s: Wall-time limit from `reset`; None: none.
      answer_end: Text that completes a final answer (e.g. '</answer>'):
        a turn ending with it is over without an end token. '' = none.
      clock: Seconds, monotonic (tests pass a fake).

    Raises:
      ValueError: for a limit below 1 or a non-positive timeout.
    """
    if max_tool_calls < 1 or max_calls_per_turn < 1:
      raise ValueError(
          f'max_tool_calls={max_tool_calls!r} and max_calls_per_turn='
          f'{max_calls_per_turn!r} must be >= 1.')
    if episode_timeout_s is not None and not episode_timeout_s > 0:
      raise ValueError(
          f'episode_timeout_s={episode_timeout_s!r} must be > 0 seconds, or '
          'None for no limit.')
    self.tools = tuple(tools)
    self.format = (formats.get(tool_format) if isinstance(tool_format, str)
                   else tool_format)
    self.executor = executor
    self.max_tool_calls = int(max_tool_calls)
    self.max_calls_per_turn = int(max_calls_per_turn)
    self.episode_timeout_s = episode_timeout_s
    self.answer_end = answer_end
    # A call list closes with ']'; an answer with answer_end's last
    # character.
    self.pause_texts = (']',) + ((answer_end[-1],) if answer_end else ())
    self._clock = clock
    self._names = {t.name for t in self.tools}
    self.example: dict[str, Any] = {}
    self._stats = EpisodeStats()
    self._calls: list[dict[str, Any]] = []
    self._started = clock()

  def reset(self, example: Mapping[str, Any]) -> None:
    self.example = dict(example)
    self._stats = EpisodeStats()
    self._calls = []
    self._started = self._clock()

  @property
  def episode_stats(self) -> EpisodeStats:
    """This episode's counters (the live object)."""
    return self._stats

  @property
  def stats(self) -> dict[str, Any]:
    return self._stats.as_dict()

  @property
  def tool_calls(self) -> list[dict[str, Any]]:
    return [dict(c) for c in self._calls]

  def instructions(self, example: formats.Call | None = None) -> str:
    """The prompt text that lists this environment's tools."""
    return self.format.instructions(self.tools, example)

  def ends_turn(self, partial_text: str) -> str | None:
    """A turn is complete once it ends with a well-formed call list (closed
    by the format's call end) or holds `answer_end` (closed by nothing)."""
    # `in`, not endswith: a token may join answer_end's last character to
    # the next one ('</answer><' is '</', 'answer', '><' in Gemma's vocab).
    if self.answer_end and self.answer_end in partial_text:
      return ''
    try:
      calls = self.format.parse(partial_text)
    except formats.ToolParseError:
      return None  # Maybe not finished yet: the turn goes on.
    return self.format.call_end if calls else None

  def step(self, turn_text: str) -> Reply:
    if self._stats.finish is not None:
      raise RuntimeError(
          f'step() after the episode ended ({self._stats.finish}); call '
          'reset() first.')
    self._stats.turns += 1
    try:
      calls = self.format.parse(turn_text)
    except formats.ToolParseError as e:
      return self._unreadable(str(e))
    if calls is None:
      return self._end(FINISH_ANSWER)
    run, excess = (calls[:self.max_calls_per_turn],
                   calls[self.max_calls_per_turn:])
    if self._budget_used() + len(run) > self.max_tool_calls:
      return self._end(FINISH_MAX_TOOL_CALLS, calls=len(calls))
    left = self._time_left()
    if left is not None and left <= 0:
      return self._end(FINISH_TIMEOUT, calls=len(calls))
    known = [c for c in run if c.name in self._names]
    ran = iter(self.executor.run(known, timeout_s=left) if known else [])
    results = []
    for call in run:
      if call.name in self._names:
        results.append(next(ran))
      else:
        results.append(self._error(
            call.name, call.arguments, executor_lib.ERROR_UNKNOWN_TOOL,
            f'unknown tool {call.name!r} (tools: '
            f'{", ".join(sorted(self._names)) or "none"})'))
    self._stats.tool_calls += len(run)
    for call in excess:
      results.append(self._error(
          call.name, call.arguments, ERROR_TOO_MANY_CALLS,
          f'at most {self.max_calls_per_turn} calls per turn; this call was '
          'not run'))
    self._record(results)
    return Reply(text=self.format.render_results(results), done=False,
                 calls=results,
                 info={'calls': len(calls), 'excess_calls': len(excess)})

  def _unreadable(self, message: str) -> Reply:
    """Answers a malformed call turn with an error, within the limits."""
    if self._budget_used() + 1 > self.max_tool_calls:
      self._stats.parse_errors += 1
      return self._end(FINISH_MAX_TOOL_CALLS, parse_error=True)
    left = self._time_left()
    if left is not None and left <= 0:
      self._stats.parse_errors += 1
      return self._end(FINISH_TIMEOUT, parse_error=True)
    result = self._error(None, {}, ERROR_PARSE, message)
    self._record([result])
    return Reply(text=self.format.render_results([result]), done=False,
                 calls=[result], info={'parse_error': True})

  def _budget_used(self) -> int:
    return self._stats.tool_calls + self._stats.parse_errors

  def _time_left(self) -> float | None:
    if self.episode_timeout_s is None:
      return None
    return self.episode_timeout_s - (self._clock() - self._started)

  def _error(self, name: str | None, arguments: Mapping[str, Any],
             error: str, message: str) -> executor_lib.CallResult:
    """An error result made here (never run), its text sanitized."""
    text, markers = self.format.sanitize(f'error: {message}')
    return executor_lib.CallResult(name, arguments, text, error, 0.0,
                                   markers)

  def _record(self, results: Sequence[executor_lib.CallResult]) -> None:
    for result in results:
      if result.error is not None:
        counter = _ERROR_COUNTERS.get(result.error, 'exec_errors')
        setattr(self._stats, counter, getattr(self._stats, counter) + 1)
      self._stats.tool_seconds += result.seconds
      self._stats.injected_markers += result.injected_markers
      self._calls.append({'name': result.name,
                          'arguments': dict(result.arguments),
                          'result': result.text, 'error': result.error})

  def _end(self, finish: str, **info: Any) -> Reply:
    self._stats.finish = finish
    return Reply(text=None, done=True, finish=finish, info=info)


class EnvironmentFactory:
  """Makes one `ToolEnvironment` per row; they share one executor.

  Attributes:
    tools: The tools.
    format: The tool-call format.
    executor: The shared executor; `close` closes it.
  """

  def __init__(self, tools: str | Sequence[tools_lib.Tool],
               tool_format: formats.ToolFormat | str = 'gemma3',
               *, tool_timeout_s: float = 5.0, max_output_chars: int = 1000,
               max_tool_calls: int = 3, max_calls_per_turn: int = 2,
               episode_timeout_s: float | None = None, max_workers: int = 4,
               max_abandoned: int = 16, answer_end: str = ''):
    """Resolves the tools and format and starts the executor.

    Args:
      tools: A config spec for `tools.resolve` ('calculator,pkg.mod:fn') or
        the tools themselves; at least one.
      tool_format: A `formats.ToolFormat` or its name.
      tool_timeout_s: Per-call time limit.
      max_output_chars: Characters of a tool result kept.
      max_tool_calls: See `ToolEnvironment`.
      max_calls_per_turn: See `ToolEnvironment`.
      episode_timeout_s: See `ToolEnvironment`.
      max_workers: See `executor.Executor`.
      max_abandoned: See `executor.Executor`.
      answer_end: See `ToolEnvironment`.

    Raises:
      tools.ToolConfigError: for a bad tool spec or no tools.
      ValueError: for an unknown format or a bad limit.
    """
    self.tools = (tools_lib.resolve(tools) if isinstance(tools, str)
                  else tuple(tools))
    if not self.tools:
      raise tools_lib.ToolConfigError(
          f'{tools_lib.CONFIG_FIELD} names no tools; list at least one, '
          f'e.g. "calculator".')
    self.format = (formats.get(tool_format) if isinstance(tool_format, str)
                   else tool_format)
    self.executor = executor_lib.Executor(
        self.tools, timeout_s=tool_timeout_s,
        max_output_chars=max_output_chars, sanitize=self.format.sanitize,
        max_workers=max_workers, max_abandoned=max_abandoned)
    self._limits = dict(max_tool_calls=max_tool_calls,
                        max_calls_per_turn=max_calls_per_turn,
                        episode_timeout_s=episode_timeout_s,
                        answer_end=answer_end)
    self()  # Checks the limits now rather than at the first row.

  def __call__(self) -> ToolEnvironment:
    return ToolEnvironment(self.tools, self.format, self.executor,
                           **self._limits)

  def instructions(self, example: formats.Call | None = None) -> str:
    """The prompt text that lists the tools and says how to call them."""
    return self.format.instructions(self.tools, example)

  def close(self) -> None:
    self.executor.close()


def make_environment_factory(tools: str | Sequence[tools_lib.Tool],
                             tool_format: formats.ToolFormat | str = 'gemma3',
                             **limits: Any) -> EnvironmentFactory:
  """An `EnvironmentFactory`: () -> a fresh `ToolEnvironment`.

  Args:
    tools: A tool spec string or the tools.
    tool_format: A format or its name.
    **limits: Keyword settings of `EnvironmentFactory`.
  """
  return EnvironmentFactory(tools, tool_format, **limits)


ENVIRONMENT_FIELD = 'agent.environment'


def resolve_factory(spec: str) -> Callable[[], Environment]:
  """The environment factory named by `agent.environment`.

  Args:
    spec: 'package.module:name' of a callable that takes no arguments and
      returns a fresh `Environment` (a class, or a function).

  Returns:
    That callable, after one call checked that it makes an `Environment`.

  Raises:
    tools.ToolConfigError: naming the entry and the fix.
  """
  factory = tools_lib.import_callable(spec.strip(), ENVIRONMENT_FIELD,
                                      tools_lib.ToolConfigError)
  try:
    made = factory()
  except Exception as e:  # pylint: disable=broad-exception-caught
    raise tools_lib.ToolConfigError(
        f'{ENVIRONMENT_FIELD}: {spec!r}() raised {type(e).__name__}: {e}; it '
        'must take no arguments and return an Environment.') from None
  if not isinstance(made, Environment):
    raise tools_lib.ToolConfigError(
        f'{ENVIRONMENT_FIELD}: {spec!r}() returned a {type(made).__name__}, '
        'not an agent_tunix.agent.environment.Environment subclass.')
  return factory

