"""models.tunix_adapter: the tested tunix version, the refusal of another,
and no reach into tunix's private names anywhere else."""

import ast
import inspect
import os
import pathlib
import subprocess
import sys

import pytest
from tunix.generate import sampler as sampler_lib

from agent_tunix.models import tunix_adapter

_REPO = pathlib.Path(__file__).resolve().parents[1]
_PACKAGE = _REPO / 'agent_tunix'
_ADAPTER = _PACKAGE / 'models' / 'tunix_adapter.py'


def test_the_installed_tunix_is_a_tested_one():
  assert tunix_adapter.VERSION in tunix_adapter.TESTED_VERSIONS
  assert tunix_adapter.check_version() == tunix_adapter.VERSION


@pytest.mark.parametrize('installed', ['0.1.6', '0.2.0', 'none'])
def test_another_tunix_is_refused_in_one_line_with_the_fix(installed):
  with pytest.raises(tunix_adapter.TunixVersionError) as error:
    tunix_adapter.check_version(installed)
  message = str(error.value)
  assert f'google-tunix {installed} is installed' in message
  assert message.endswith('fix: pip install google-tunix==0.1.7')
  assert '\n' not in message


def test_importing_the_models_refuses_an_untested_tunix():
  """The check runs when anything that uses tunix starts: importing
  agent_tunix.models (as every command does) fails with the message."""
  code = '\n'.join([
      'import importlib.metadata as m',
      'real = m.version',
      "m.version = lambda name: '0.2.0' if name == 'google-tunix' "
      'else real(name)',
      'import agent_tunix.models',
  ])
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, '-c', code], cwd=_REPO, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode != 0
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith('agent_tunix.models.tunix_adapter.TunixVersionError')
  assert 'google-tunix 0.2.0 is installed' in last
  assert 'pip install google-tunix==0.1.7' in last


def _sampler_private_names():
  """The private attributes of tunix's Sampler: its methods and what its
  methods assign to self."""
  names = {n for n in vars(sampler_lib.Sampler) if n.startswith('_')
           and not n.startswith('__')}
  tree = ast.parse(inspect.getsource(sampler_lib))
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id == 'self' and node.attr.startswith('_')
        and not node.attr.startswith('__')):
      names.add(node.attr)
  return names


def _own_private_names(trees):
  """Private names agent_tunix defines itself (methods, self attributes)."""
  own = set()
  for tree in trees.values():
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        own.add(node.name)
      elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ('self', 'cls')):
        own.add(node.attr)
  return own


def test_only_the_adapter_reaches_into_tunix_private_names():
  trees = {path: ast.parse(path.read_text(), str(path))
           for path in _PACKAGE.rglob('*.py')}
  sampler_private = _sampler_private_names() - _own_private_names(trees)
  found = []
  for path, tree in trees.items():
    if path == _ADAPTER:
      continue
    tunix_aliases = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and (node.module or '').startswith(
          'tunix'):
        tunix_aliases.update(a.asname or a.name for a in node.names)
      elif isinstance(node, ast.Import):
        tunix_aliases.update(a.asname or a.name for a in node.names
                             if a.name.startswith('tunix'))
    for node in ast.walk(tree):
      if not (isinstance(node, ast.Attribute) and node.attr.startswith('_')
              and not node.attr.startswith('__')):
        continue
      of_module = (isinstance(node.value, ast.Name)
                   and node.value.id in tunix_aliases)
      if of_module or node.attr in sampler_private:
        found.append(f'{path.relative_to(_REPO)}:{node.lineno} .{node.attr}')
  assert not found, (
      'tunix private names outside models/tunix_adapter.py (add a function '
      f'there): {found}')
