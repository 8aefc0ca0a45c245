"""The `rewards.functions` spec: 'name=weight' pairs, names to functions.

  parse_spec('format_exact=0.5,answer=1,my_pkg.mod:fn=0.5')
      -> [('format_exact', 0.5), ('answer', 1.0), ('my_pkg.mod:fn', 0.5)]
  resolve('my_pkg.mod:fn')  # Imports my_pkg.mod, returns its fn.

A name is either registered (`registry.register`) or
'package.module:function'.
"""

import difflib
import importlib
import math

from agent_tunix.rewards import registry


def _is_dotted_name(text: str) -> bool:
  return all(part.isidentifier() for part in text.split('.'))


def _check_name(name: str, entry: str) -> None:
  """Raises ValueError unless `name` is registered or 'module:function'."""
  if name == registry.LENGTH_PENALTY:
    raise ValueError(
        f'rewards.functions entry {entry!r}: the length penalty is not listed '
        'here; set rewards.length_penalty (per token) and '
        'rewards.length_penalty_target instead.'
    )
  if name == registry.OVERLONG_PENALTY:
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
  if registry.lookup(name) is None:
    names = registry.registered_names()
    close = difflib.get_close_matches(name, names, n=1)
    hint = f' Did you mean {close[0]!r}?' if close else ''
    raise ValueError(
        f'rewards.functions entry {entry!r}: unknown reward {name!r}.{hint} '
        f'Built-in rewards: {", ".join(names)}; for your own '
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
    if weight is None or not math.isfinite(weight):
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


def resolve(name: str) -> registry.RewardFn:
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
    return registry.lookup(name)
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
