"""What every command shares: absl's `app.run` and one set of exit statuses.

Every command (`python -m agent_tunix.main`, `evaluate`, `generate`,
`sweep`, `preflight`, `export`, `plot`, `bench`, ...) ends with one of:

  0  OK         it did what was asked (also after `--help`);
  1  FAILED     the run's own failure: a run that does not fit (preflight),
                diverged, was stopped by an alarm, a judge that kept
                failing, a full disk, a missing file; or a bug (traceback);
  2  USAGE      bad flags or config: an unknown flag, a misspelled config
                field, a value of the wrong type, a config that validation
                refuses; one line, `error: ...`, with a did-you-mean where
                there is one;
  3  KILLED     killed or interrupted: Ctrl-C, a SIGTERM the trainer
                checkpointed and stopped on (rerun to resume), a compile
                the kernel killed for host memory (preflight).

The launch/*.sh scripts use the same numbers (README.md, Exit statuses,
says it once for users). `run(main)` is
`app.run(main)` with absl's behaviours that break this turned around: its
flag parser prints a traceback for a misspelled config field and exits 1;
`app.UsageError` prints the whole usage text and exits 1; `--help` exits 1,
as if the command had failed.

`--config` takes a preset by name from any directory: `--config=NAME[:ARG]`
whose NAME is no existing file but a module of agent_tunix/configs (the
installed package's presets) stands for that module's file, so
`--config=gemma3_270m:quick` is `--config=configs/gemma3_270m.py:quick`
run in a checkout. A bare name that is neither exits USAGE with the
presets' names.
"""

import os
import re
import sys

from absl import app
from absl import flags

OK = 0
FAILED = 1
USAGE = 2
KILLED = 3

_HELP = frozenset(('help', '?', 'helpshort', 'helpfull', 'helpxml'))
# ml_collections' suggestion in a KeyError/AttributeError of a config field.
_DID_YOU_MEAN = re.compile(r'Did you mean "([^"]+)" instead of "([^"]+)"')


def asked_for_help(argv):
  """Whether `argv` (program name first) asks absl for its usage text."""
  for arg in argv[1:]:
    if arg == '--':  # What follows is not flags.
      return False
    if arg.startswith('-') and arg.lstrip('-').split('=', 1)[0] in _HELP:
      return True
  return False


def usage_exit(message):
  """Prints `error: <message>` (one line) on stderr and exits USAGE."""
  one_line = ' '.join(str(message).split())
  sys.stderr.write(f'error: {one_line}\n')
  sys.stderr.flush()
  sys.exit(USAGE)


# The presets' folder, found beside this file: cli imports nothing of
# agent_tunix (it is the lowest layer).
_PRESETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'configs')


def preset_names():
  """The presets' names: the modules of agent_tunix/configs, sorted."""
  return sorted(
      name[:-3] for name in os.listdir(_PRESETS)
      if name.endswith('.py') and name[:-3].isidentifier()
      and not name.startswith('_'))


def preset_path(name):
  """The file of preset `name` (`NAME` or `NAME.py`), or None if none.

  Relative to the working directory when the file is under it (a checkout's
  own presets, as `--config=agent_tunix/configs/NAME.py` would name them),
  else absolute.
  """
  name = name[:-3] if name.endswith('.py') else name
  if name not in preset_names():
    return None
  path = os.path.join(_PRESETS, f'{name}.py')
  relative = os.path.relpath(path)
  return path if relative.startswith(os.pardir) else relative


def unknown_preset_message(value):
  """'no preset NAME; the presets: ...' for `value`, `NAME[:ARG]`."""
  return (f'no preset {value.split(":", 1)[0]!r}; the presets: '
          f'{", ".join(preset_names())} (NAME[:ARG])')


def resolve_config(value):
  """`value` of `--config`, a preset's name made its file (module doc).

  Returns `value` itself when its file part exists or is a path (has a
  '/': ml_collections reports a missing file); the preset's path (and
  `:ARG`) for a preset's name; exits USAGE for any other bare name.
  """
  head, colon, arg = value.partition(':')
  if not head or head.startswith('-') or '/' in head or os.path.exists(head):
    return value
  path = preset_path(head)
  if path is None:
    usage_exit(f'--config={value}: no such config file and '
               f'{unknown_preset_message(value)}; or give the path of a '
               'get_config() file')
  return f'{path}{colon}{arg}'


def resolve_presets(argv):
  """`argv` with every `--config=NAME[:ARG]` (or `--config NAME`) resolved."""
  out = list(argv[:1])
  words = iter(argv[1:])
  for arg in words:
    if arg == '--':
      out.append(arg)
      out.extend(words)
      break
    flag, equals, value = arg.partition('=')
    if flag in ('--config', '-config') and equals:
      arg = f'{flag}={resolve_config(value)}'
    elif flag in ('--config', '-config'):
      out.append(arg)
      arg = next(words, None)
      if arg is None:
        break
      arg = resolve_config(arg)
    out.append(arg)
  return out


def _overrides(argv):
  """The `--NAME.a.b=VALUE` words of `argv` (config field overrides)."""
  found = []
  for arg in argv[1:]:
    if arg == '--':
      break
    match = re.match(r'^--?([A-Za-z_]\w*(?:\.\w+)+)(?:=|$)', arg)
    if match:
      found.append((arg, match.group(1).split('.')))
  return found


def unknown_field_message(error, argv):
  """One line for a KeyError/AttributeError ml_collections raised, or None.

  ml_collections raises them (multi-line, with a did-you-mean) while it
  applies an override such as `--config.traning.num_steps=5` whose path
  names no field. Returns None when no override in `argv` names the field
  the error is about (then it is not a misspelled field).
  """
  # AttributeError wraps the KeyError; a KeyError's str() is a repr.
  while error.args and isinstance(error.args[0], BaseException):
    error = error.args[0]
  text = str(error.args[0]) if error.args else ''
  name = text.splitlines()[0].strip().strip('\'"') if text else ''
  suggestion = _DID_YOU_MEAN.search(text)
  for arg, path in _overrides(argv):
    if name not in path[1:]:
      continue
    at = path.index(name, 1)
    parent = 'the config' if at == 1 else '.'.join(path[:at])
    line = (f'{arg.split("=", 1)[0]}: {parent} has no field {name!r}')
    if suggestion:
      fixed = '.'.join(path[:at] + [suggestion.group(1)] + path[at + 1:])
      line += f'; did you mean {suggestion.group(1)!r} (--{fixed})?'
    return line
  return None


def _flag_error_line(error):
  """One line for an absl flags.Error (its first and last lines)."""
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  if not lines:
    return type(error).__name__
  if len(lines) == 1:
    return lines[0]
  # A config file whose get_config() raised: the message holds its
  # traceback; its first line names the flag, its last the error.
  return f'{lines[0]} {lines[-1]}'


def _check_config_files(flag_values):
  """Exits USAGE when a --config file could not be loaded.

  ml_collections keeps a config file that failed to load (not found, or an
  IOError inside it) as a stand-in that raises IOError on first use (of any
  attribute): use each flag's value here, while the error can be one line.
  """
  for name in flag_values:
    flag = flag_values[name]
    if not flag.present:
      continue
    try:
      hasattr(flag.value, 'lock')
    except OSError as e:
      last = [l.strip() for l in str(e).splitlines() if l.strip()][-1]
      hint = ''
      if isinstance(e, FileNotFoundError) or 'No such file' in last:
        hint = (f' (a path is relative to the working directory; a preset '
                f'goes by name from anywhere: --config=NAME[:ARG], one of '
                f'{", ".join(preset_names())})')
      usage_exit(f'--{name}: cannot load the config file: {last}{hint}')


def parse_flags(argv):
  """absl's flag parsing with one-line errors and exit status USAGE.

  Used as `app.run`'s `flags_parser`. `--help` still prints the usage.

  Args:
    argv: the command line, program name first.

  Returns:
    The arguments that are not flags, program name first.
  """
  argv = resolve_presets(argv)
  try:
    args = flags.FLAGS(argv)
  except flags.Error as e:
    usage_exit(_flag_error_line(e))
  except (KeyError, AttributeError) as e:
    line = unknown_field_message(e, argv)
    if line is None:
      raise
    usage_exit(line)
  _check_config_files(flags.FLAGS)
  return args


def _one_line_usage_errors(main):
  """Wraps `main` so that an app.UsageError is one line and exit USAGE."""

  def wrapped(argv):
    try:
      return main(argv)
    except app.UsageError as e:
      usage_exit(f'{e} (--help lists the flags)')

  return wrapped


def run(main, argv=None):
  """`app.run(main, argv)` with the exit statuses of the module docstring."""
  try:
    app.run(_one_line_usage_errors(main), argv=argv, flags_parser=parse_flags)
  except SystemExit as e:
    if e.code == 1 and asked_for_help(sys.argv if argv is None else argv):
      sys.exit(OK)
    raise
  except KeyboardInterrupt:
    sys.stderr.write('error: interrupted (Ctrl-C)\n')
    sys.exit(KILLED)
