"""The package's import direction: a module imports only from its own layer
or the layers below it (docs/architecture.md)."""

import ast
import os

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = os.path.join(_REPO, 'agent_tunix')

# Top to bottom. A module may import from its own layer and any layer after
# it. Top-level modules (the commands and the notebook API), bench and
# preflight are the command layer; cli is the lowest.
LAYERS = (
    ('commands', ('', 'bench', 'preflight')),
    ('run', ('run',)),
    ('observe', ('observe',)),
    ('config', ('config',)),
    ('judge', ('judge',)),
    ('rl', ('rl',)),
    ('bottom', ('agent', 'data', 'models', 'rewards', 'tpu')),
    ('storage', ('storage',)),
    # cli.py: the exit statuses and the absl wrapper every program uses
    # (the trainer's error reporting and the worker log mirror included);
    # it imports nothing of agent_tunix, which this layer enforces.
    ('process', ('cli',)),
    # configs: the presets, ml_collections only; every layer may read them.
    ('presets', ('configs',)),
)
_RANK = {pkg: rank for rank, (_, pkgs) in enumerate(LAYERS) for pkg in pkgs}


def _package_of(module):
  """'agent_tunix.rl.grpo' -> 'rl'; 'agent_tunix.main' -> ''."""
  parts = module.split('.')
  assert parts[0] == 'agent_tunix', module
  if module == 'agent_tunix.cli':
    return 'cli'
  if len(parts) >= 3:
    return parts[1]
  # agent_tunix.X: a subpackage if X is a folder, else a top-level module.
  return parts[1] if len(parts) == 2 and os.path.isdir(
      os.path.join(_PACKAGE, parts[1])) else ''


def _modules():
  for root, _, files in os.walk(_PACKAGE):
    for name in sorted(files):
      if name.endswith('.py'):
        path = os.path.join(root, name)
        rel = os.path.relpath(path, _REPO)[:-3].replace(os.sep, '.')
        yield rel.removesuffix('.__init__'), path


def _imports(path):
  """Every agent_tunix module that `path` imports, at any depth."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith('agent_tunix.'):
          yield alias.name, node.lineno
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and (
        node.module == 'agent_tunix'
        or (node.module or '').startswith('agent_tunix.')):
      for alias in node.names:
        if node.module == 'agent_tunix':
          yield f'agent_tunix.{alias.name}', node.lineno
        else:
          yield f'{node.module}.{alias.name}', node.lineno


def _upward_imports(modules):
  found = []
  for module, path in modules:
    if module == 'agent_tunix':
      continue
    own = _package_of(module)
    for target, line in _imports(path):
      other = _package_of(target)
      if _RANK[other] < _RANK[own]:
        found.append(f'{os.path.relpath(path, _REPO)}:{line} imports '
                     f'{target} (layer {LAYERS[_RANK[other]][0]}, above '
                     f'{LAYERS[_RANK[own]][0]})')
  return found


def test_every_subpackage_has_a_layer():
  for name in sorted(os.listdir(_PACKAGE)):
    if os.path.isfile(os.path.join(_PACKAGE, name, '__init__.py')):
      assert name in _RANK, (
          f'agent_tunix/{name}/ is in no layer of tests/layers_test.py: '
          'add it to LAYERS and to docs/architecture.md.')


def test_no_module_imports_from_a_layer_above_it():
  upward = _upward_imports(_modules())
  assert not upward, 'Imports that go up the layers:\n' + '\n'.join(upward)


def test_an_upward_import_is_found(tmp_path):
  # The check itself: a reward module importing the trainer inside a function.
  bad = tmp_path / 'bad.py'
  bad.write_text('def f():\n  from agent_tunix.run import train\n')
  found = _upward_imports([('agent_tunix.rewards.bad', str(bad))])
  assert len(found) == 1 and 'imports agent_tunix.run.train (layer run, ' \
      'above bottom)' in found[0], found


def test_top_level_holds_at_most_12_modules():
  top = [n for n in os.listdir(_PACKAGE) if n.endswith('.py')]
  assert len(top) <= 12, sorted(top)
