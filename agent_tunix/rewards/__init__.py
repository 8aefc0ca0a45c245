"""Reward functions by name, and their weighted sum over a batch.

Every reward function has the signature

  fn(prompts: list[str], completions: list[str], **example_fields)
      -> list[float]

and returns one score per completion. `example_fields` holds one list per
field, aligned with `completions`: at least `answer` (the true final answer as
text), possibly `question`, `completion_lengths` (token counts),
`completion_tokens` (the sampled token ids, end token included) and others. A
function takes the fields it needs as keyword arguments and must accept and
ignore the rest through `**kwargs`.

The config picks the functions and their weights (`config.rewards`):

  functions = 'format_exact=0.5,format_approx=0.25,answer=1,numbers=3'
  functions = 'answer=1,my_project.rewards:brevity=0.5'

Built-in names are registered with `register`; any other function is named
`package.module:function` and imported when the reward set is built.

  reward_set = rewards.RewardSet.from_config(config.rewards)
  total, per_fn = reward_set(prompts, completions, answer=answers,
                             completion_lengths=lengths)
"""

from collections.abc import Callable, Mapping, Sequence
import difflib
import functools
import importlib
import math as std_math
from typing import Any

from absl import logging
import numpy as np

from agent_tunix.rewards import format as format_lib
from agent_tunix.rewards import math as math_lib

RewardFn = Callable[..., Sequence[float]]

# Name under which the length penalty is reported; set through
# rewards.length_penalty, never listed in rewards.functions.
LENGTH_PENALTY = 'length_penalty'
# Name under which DAPO's overlong penalty is reported; set through
# rewards.overlong_buffer and rewards.overlong_penalty.
OVERLONG_PENALTY = 'overlong_penalty'
# Names set by their own config fields, never listed in rewards.functions.
_RESERVED = {
    LENGTH_PENALTY: 'rewards.length_penalty',
    OVERLONG_PENALTY: 'rewards.overlong_buffer',
}

# Longest piece of a completion quoted in an error message.
_QUOTE_CHARS = 200

_REGISTRY: dict[str, RewardFn] = {}


class RewardError(RuntimeError):
  """A reward function failed or returned unusable scores.

  Attributes:
    fn_name: Name of the reward function, as written in the config.
    index: Position of the offending completion in the batch, or None when no
      single completion could be blamed.
    completion: The offending completion, or None.
  """

  def __init__(
      self,
      message: str,
      fn_name: str,
      index: int | None = None,
      completion: str | None = None,
  ):
    super().__init__(message)
    self.fn_name = fn_name
    self.index = index
    self.completion = completion


def register(name: str) -> Callable[[RewardFn], RewardFn]:
  """Decorator that makes a reward function available under `name`.

  Args:
    name: The name used in `config.rewards.functions`.

  Returns:
    A decorator that registers the function and returns it unchanged.

  Raises:
    ValueError: if the name is malformed, reserved, or already taken by
      another function.
  """
  if not name or not name.isidentifier():
    raise ValueError(
        f'Reward name {name!r} is not a Python identifier; use letters, '
        'digits and underscores, e.g. "my_reward".'
    )
  if name in _RESERVED:
    raise ValueError(
        f'Reward name {name!r} is reserved for {_RESERVED[name]}; pick '
        'another name.'
    )

  def decorator(fn: RewardFn) -> RewardFn:
    if not callable(fn):
      raise ValueError(f'register({name!r}) was given {fn!r}, not a function.')
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not fn:
      raise ValueError(
          f'Reward name {name!r} is already registered for {existing!r}; '
          'pick another name.'
      )
    _REGISTRY[name] = fn
    return fn

  return decorator


def registered_names() -> list[str]:
  """The built-in (registered) reward names, sorted."""
  return sorted(_REGISTRY)


register('format_exact')(format_lib.format_exact)
register('format_approx')(format_lib.format_approx)
register('answer')(math_lib.answer_match)
register('numbers')(math_lib.number_match)


def _is_dotted_name(text: str) -> bool:
  return all(part.isidentifier() for part in text.split('.'))


def _check_name(name: str, entry: str) -> None:
  """Raises ValueError unless `name` is registered or 'module:function'."""
  if name == LENGTH_PENALTY:
    raise ValueError(
        f'rewards.functions entry {entry!r}: the length penalty is not listed '
        'here; set rewards.length_penalty (per token) and '
        'rewards.length_penalty_target instead.'
    )
  if name == OVERLONG_PENALTY:
    raise ValueError(
        f'rewards.functions entry {entry!r}: the overlong penalty is not '
        'listed here; set rewards.overlong_buffer (tokens) and '
        'rewards.overlong_penalty instead.'
    )
  if ':' in name:
    module_name, _, attr = name.partition(':')
    if not (_is_dotted_name(module_name) and _is_dotted_name(attr)):
      raise ValueError(
          f'rewards.functions entry {entry!r}: {name!r} is not of the form '
          '"package.module:function".'
      )
    return
  if name not in _REGISTRY:
    close = difflib.get_close_matches(name, _REGISTRY, n=1)
    hint = f' Did you mean {close[0]!r}?' if close else ''
    raise ValueError(
        f'rewards.functions entry {entry!r}: unknown reward {name!r}.{hint} '
        f'Built-in rewards: {", ".join(registered_names())}; for your own '
        'function write "package.module:function=weight".'
    )


def parse_spec(spec: str) -> list[tuple[str, float]]:
  """Parses a 'name=weight,name=weight' list (`config.rewards.functions`).

  Whitespace around names and weights is ignored. A bare name means weight
  1.0. Weights may be zero (the reward is computed and reported but does not
  count) or negative; they must be finite.

  Args:
    spec: For example 'format_exact=1,answer=2,my.module:fn=0.5'.

  Returns:
    (name, weight) pairs in the order given.

  Raises:
    ValueError: naming the bad entry, for an empty list or entry, an unknown
      name, a malformed 'module:function', a weight that is not a finite
      number, or a name given twice.
  """
  if not isinstance(spec, str) or not spec.strip():
    raise ValueError(
        f'rewards.functions is empty ({spec!r}); list at least one reward, '
        'e.g. "format_exact=0.5,format_approx=0.25,answer=1,numbers=3".'
    )
  pairs = []
  seen = set()
  for position, raw_entry in enumerate(spec.split(','), start=1):
    entry = raw_entry.strip()
    if not entry:
      raise ValueError(
          f'rewards.functions {spec!r}: entry {position} is empty; remove the '
          'extra comma.'
      )
    name, has_weight, weight_text = entry.rpartition('=')
    if not has_weight:
      name, weight_text = entry, '1'
    name = name.strip()
    if not name:
      raise ValueError(
          f'rewards.functions entry {entry!r} has no name; write "name=weight".'
      )
    _check_name(name, entry)
    try:
      weight = float(weight_text)
    except ValueError:
      weight = None
    if weight is None or not std_math.isfinite(weight):
      raise ValueError(
          f'rewards.functions entry {entry!r}: weight {weight_text.strip()!r} '
          'is not a finite number; write e.g. "answer=1.5".'
      )
    if name in seen:
      raise ValueError(
          f'rewards.functions {spec!r}: {name!r} is listed twice; give each '
          'reward once with its total weight.'
      )
    seen.add(name)
    pairs.append((name, weight))
  return pairs


def resolve(name: str) -> RewardFn:
  """Returns the reward function called `name`.

  Args:
    name: A registered name, or 'package.module:function' (the function may
      be a dotted attribute path, e.g. 'pkg.mod:Class.method').

  Returns:
    The callable.

  Raises:
    ValueError: if the name is unknown, the module cannot be imported, or it
      has no such callable attribute.
  """
  _check_name(name, name)
  if ':' not in name:
    return _REGISTRY[name]
  module_name, _, attr_path = name.partition(':')
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    missing = e.name or ''
    if module_name == missing or module_name.startswith(missing + '.'):
      raise ValueError(
          f'Reward {name!r}: no module named {missing!r}. Check the spelling '
          'and that its directory is on PYTHONPATH.'
      ) from e
    raise ValueError(
        f'Reward {name!r}: importing {module_name!r} failed: {e}'
    ) from e
  except Exception as e:  # pylint: disable=broad-exception-caught
    raise ValueError(
        f'Reward {name!r}: importing {module_name!r} failed with '
        f'{type(e).__name__}: {e}'
    ) from e
  target = module
  for attr in attr_path.split('.'):
    if not hasattr(target, attr):
      raise ValueError(
          f'Reward {name!r}: {module_name!r} has no attribute {attr_path!r}; '
          'check the function name after the colon.'
      )
    target = getattr(target, attr)
  if not callable(target):
    raise ValueError(
        f'Reward {name!r}: {attr_path!r} in {module_name!r} is a '
        f'{type(target).__name__}, not a function.'
    )
  return target


def _quote(completion: Any) -> str:
  """`completion` as a repr, cut to about `_QUOTE_CHARS` characters."""
  text = str(completion)
  if len(text) > _QUOTE_CHARS:
    text = text[:_QUOTE_CHARS] + f'... [{len(text)} chars]'
  return repr(text)


def _slice_fields(
    fields: Mapping[str, Any], index: int, size: int
) -> dict[str, Any]:
  """The fields of one completion: per-completion sequences cut to [index]."""
  one = {}
  for key, value in fields.items():
    if _is_per_completion(value, size):
      value = value[index : index + 1]
    one[key] = value
  return one


def _is_per_completion(value: Any, size: int) -> bool:
  return isinstance(value, (list, tuple, np.ndarray)) and len(value) == size


class RewardSet:
  """Weighted reward functions, applied to a batch of completions.

  Calling the set returns the weighted total per completion and each
  function's unweighted scores. Any failure of a reward function raises
  `RewardError`, which stops training: a silently wrong reward would train the
  model on garbage.
  """

  def __init__(
      self,
      functions: str | Sequence[tuple[str, float]],
      length_penalty: float = 0.0,
      length_penalty_target: int = 256,
      overlong_buffer: int = 0,
      overlong_penalty: float = 1.0,
      max_completion_length: int | None = None,
  ):
    """Builds the set and imports any 'module:function' rewards.

    Args:
      functions: A spec string for `parse_spec`, or (name, weight) pairs.
      length_penalty: Penalty per completion token beyond
        `length_penalty_target`; 0 turns it off.
      length_penalty_target: Token count up to which there is no penalty.
      overlong_buffer: Tokens before `max_completion_length` over which
        DAPO's overlong penalty (`format.overlong_penalty`) falls linearly
        from 0 to -`overlong_penalty`; 0 turns it off.
      overlong_penalty: The overlong penalty at the length limit (>= 0).
      max_completion_length: The completion length limit in tokens
        (generation.max_generation_steps); needed when overlong_buffer > 0.

    Raises:
      ValueError: for a bad spec, an unresolvable function, a negative
        length penalty setting, or an overlong buffer that is negative or
        longer than the limit (or given without the limit).
    """
    if isinstance(functions, str):
      pairs = parse_spec(functions)
    else:
      pairs = [(str(n), float(w)) for n, w in functions]
      if not pairs:
        raise ValueError('RewardSet needs at least one reward function.')
      parse_spec(','.join(f'{n}={w!r}' for n, w in pairs))
    if not std_math.isfinite(length_penalty) or length_penalty < 0:
      raise ValueError(
          f'rewards.length_penalty={length_penalty!r} must be a finite number '
          '>= 0 (0 turns the penalty off).'
      )
    if length_penalty_target < 0:
      raise ValueError(
          f'rewards.length_penalty_target={length_penalty_target!r} must be '
          '>= 0 tokens.'
      )
    _check_overlong(overlong_buffer, overlong_penalty, max_completion_length)
    self._fns: dict[str, RewardFn] = {}
    self._weights: dict[str, float] = {}
    for name, weight in pairs:
      self._fns[name] = resolve(name)
      self._weights[name] = weight
    self._length_penalty = float(length_penalty)
    if self._length_penalty > 0:
      self._fns[LENGTH_PENALTY] = functools.partial(
          format_lib.length_penalty,
          coef=self._length_penalty,
          target=length_penalty_target,
      )
      self._weights[LENGTH_PENALTY] = 1.0
    if overlong_buffer > 0:
      self._fns[OVERLONG_PENALTY] = functools.partial(
          format_lib.overlong_penalty,
          max_length=int(max_completion_length),
          buffer=int(overlong_buffer),
          factor=float(overlong_penalty),
      )
      self._weights[OVERLONG_PENALTY] = 1.0
    logging.info(
        'Rewards: %s',
        ', '.join(f'{n} x {w:g}' for n, w in self._weights.items()),
    )

  @classmethod
  def from_config(
      cls, rewards_config: Any, max_completion_length: int | None = None
  ) -> 'RewardSet':
    """Builds the set from the config's rewards section (`config.rewards`).

    Args:
      rewards_config: `config.rewards`.
      max_completion_length: the rollouts' completion limit in tokens
        (`config.generation.max_generation_steps`); the overlong penalty
        needs it.
    """
    return cls(
        rewards_config.functions,
        length_penalty=rewards_config.length_penalty,
        length_penalty_target=rewards_config.length_penalty_target,
        overlong_buffer=rewards_config.overlong_buffer,
        overlong_penalty=rewards_config.overlong_penalty,
        max_completion_length=max_completion_length,
    )

  @property
  def names(self) -> list[str]:
    """Reward names in order; `length_penalty`, then `overlong_penalty`,
    last when they are on."""
    return list(self._fns)

  @property
  def weights(self) -> dict[str, float]:
    """Weight of each reward in the total."""
    return dict(self._weights)

  def __call__(
      self,
      prompts: Sequence[str],
      completions: Sequence[str],
      **fields: Any,
  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Scores a batch.

    Args:
      prompts: One prompt per completion (repeated G times for a group).
      completions: The generated texts.
      **fields: Per-completion example fields, each a sequence as long as
        `completions` (`answer`, `completion_lengths`, ...). Other values are
        passed through unchanged.

    Returns:
      (total, per_fn): `total` is float32 [N], the sum of weight * scores;
      `per_fn` maps each reward name to its unweighted float32 [N] scores.

    Raises:
      ValueError: if prompts or a list field does not have one entry per
        completion, or the length penalty is on without `completion_lengths`.
      RewardError: if a reward function raises, or returns the wrong number
        of scores or a non-finite score.
    """
    size = len(completions)
    if len(prompts) != size:
      raise ValueError(
          f'Got {len(prompts)} prompts for {size} completions; repeat each '
          'prompt once per completion.'
      )
    for key, value in fields.items():
      if isinstance(value, (list, tuple, np.ndarray)) and len(value) != size:
        raise ValueError(
            f'Reward field {key!r} has {len(value)} values for {size} '
            'completions; repeat each example field once per completion.'
        )
    if LENGTH_PENALTY in self._fns and 'completion_lengths' not in fields:
      raise ValueError(
          'rewards.length_penalty > 0 needs the completion_lengths field '
          '(token count per completion); pass it, or set '
          'rewards.length_penalty=0.'
      )
    if OVERLONG_PENALTY in self._fns and 'completion_lengths' not in fields:
      raise ValueError(
          'rewards.overlong_buffer > 0 needs the completion_lengths field '
          '(token count per completion); pass it, or set '
          'rewards.overlong_buffer=0.'
      )
    total = np.zeros([size], np.float32)
    per_fn = {}
    for name, fn in self._fns.items():
      scores = self._run_one(name, fn, prompts, completions, fields)
      per_fn[name] = scores
      total += np.float32(self._weights[name]) * scores
    if not np.all(np.isfinite(total)):
      index = int(np.flatnonzero(~np.isfinite(total))[0])
      raise RewardError(
          f'The weighted reward total is not finite at completion {index}: '
          f'{_quote(completions[index])}; lower the reward weights.',
          fn_name='total',
          index=index,
          completion=completions[index],
      )
    return total, per_fn

  def _run_one(
      self,
      name: str,
      fn: RewardFn,
      prompts: Sequence[str],
      completions: Sequence[str],
      fields: Mapping[str, Any],
  ) -> np.ndarray:
    """Calls one reward function and checks its scores."""
    size = len(completions)
    try:
      raw = fn(list(prompts), list(completions), **fields)
    except Exception as batch_error:  # pylint: disable=broad-exception-caught
      error, cause = _blame_completion(
          name, fn, prompts, completions, fields, batch_error
      )
      raise error from cause
    try:
      with np.errstate(over='ignore'):
        scores = np.asarray(raw, dtype=np.float32)
    except (TypeError, ValueError) as e:
      raise RewardError(
          f'Reward {name!r} returned {type(raw).__name__} that is not a list '
          f'of numbers: {e}',
          fn_name=name,
      ) from e
    if scores.shape != (size,):
      raise RewardError(
          f'Reward {name!r} returned scores of shape {scores.shape} for '
          f'{size} completions; return one float per completion.',
          fn_name=name,
      )
    bad = np.flatnonzero(~np.isfinite(scores))
    if bad.size:
      index = int(bad[0])
      raise RewardError(
          f'Reward {name!r} returned a non-finite score '
          f'({raw[index]!r}, or too large for float32) for completion '
          f'{index}: {_quote(completions[index])}',
          fn_name=name,
          index=index,
          completion=completions[index],
      )
    return scores


def _check_overlong(buffer, penalty, max_length):
  """Raises ValueError for unusable overlong-penalty settings."""
  if buffer < 0:
    raise ValueError(
        f'rewards.overlong_buffer={buffer!r} must be >= 0 tokens (0 turns '
        'the overlong penalty off).'
    )
  if not std_math.isfinite(penalty) or penalty < 0:
    raise ValueError(
        f'rewards.overlong_penalty={penalty!r} must be a finite number >= 0.'
    )
  if buffer == 0:
    return
  if max_length is None:
    raise ValueError(
        f'rewards.overlong_buffer={buffer} needs the completion length limit '
        '(max_completion_length, generation.max_generation_steps).'
    )
  if buffer > max_length:
    raise ValueError(
        f'rewards.overlong_buffer={buffer} is longer than the completion '
        f'limit generation.max_generation_steps={max_length}; use a buffer '
        f'of at most {max_length} tokens.'
    )


def _blame_completion(
    name: str,
    fn: RewardFn,
    prompts: Sequence[str],
    completions: Sequence[str],
    fields: Mapping[str, Any],
    batch_error: Exception,
) -> tuple[RewardError, Exception]:
  """Finds a completion on which `fn` fails alone, after the batch failed.

  Args:
    name: The reward's name.
    fn: The reward function.
    prompts: The batch's prompts.
    completions: The batch's completions.
    fields: The batch's example fields.
    batch_error: What the call on the whole batch raised.

  Returns:
    (error to raise, its cause): a RewardError naming the first completion
    that fails on its own, or the batch when none does.
  """
  size = len(completions)
  for index in range(size):
    try:
      fn(
          list(prompts[index : index + 1]),
          list(completions[index : index + 1]),
          **_slice_fields(fields, index, size),
      )
    except Exception as error:  # pylint: disable=broad-exception-caught
      return (
          RewardError(
              f'Reward {name!r} raised {type(error).__name__}: {error} on '
              f'completion {index}: {_quote(completions[index])}',
              fn_name=name,
              index=index,
              completion=completions[index],
          ),
          error,
      )
  return (
      RewardError(
          f'Reward {name!r} raised {type(batch_error).__name__}: '
          f'{batch_error} on the batch of {size} completions, but not on any '
          'single one.',
          fn_name=name,
      ),
      batch_error,
  )
