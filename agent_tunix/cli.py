"""What every command shares: absl's `app.run`, with `--help` exiting 0.

absl prints the usage for --help (also -?, --helpshort, --helpfull and
--helpxml) and then exits with status 1, as if the command had failed; a
script that checks `python -m agent_tunix.main --help` would take that for a
broken install. `run(main)` is `app.run(main)` with that one case turned
into status 0: help was asked for and given.
"""

import sys

from absl import app

_HELP = frozenset(('help', '?', 'helpshort', 'helpfull', 'helpxml'))


def asked_for_help(argv):
  """Whether `argv` (program name first) asks absl for its usage text."""
  for arg in argv[1:]:
    if arg == '--':  # What follows is not flags.
      return False
    if arg.startswith('-') and arg.lstrip('-').split('=', 1)[0] in _HELP:
      return True
  return False


def run(main, argv=None):
  """`app.run(main, argv)`, exiting 0 after printing help that was asked for."""
  try:
    app.run(main, argv=argv)
  except SystemExit as e:
    if e.code == 1 and asked_for_help(sys.argv if argv is None else argv):
      sys.exit(0)
    raise
