"""Each package's docstring names every module and subpackage beside it.

An agent_tunix/<package>/__init__.py docstring is the map of its folder
(DESIGN.md: what a module holds, in a few lines). A module added without a
word there is a map with a hole, so for every agent_tunix/*/__init__.py
this checks that the name of each sibling module (`rollout` for
rollout.py, `__main__` for __main__.py) and of each subpackage appears in
the docstring as a whole word.
"""

import ast
import pathlib
import re

import pytest

# resolve(): under `bazel test` this file is a runfiles symlink; the check
# reads the source tree, where every module is.
_PACKAGE = pathlib.Path(__file__).resolve().parents[1] / 'agent_tunix'


def _packages():
  return sorted(p.parent for p in _PACKAGE.glob('*/__init__.py'))


def siblings(folder):
  """Names of the modules and subpackages in `folder`, __init__ left out."""
  names = [p.stem for p in folder.glob('*.py') if p.name != '__init__.py']
  names += [p.name for p in folder.iterdir()
            if p.is_dir() and (p / '__init__.py').is_file()]
  return sorted(names)


def missing_names(docstring, names):
  """The `names` that do not occur in `docstring` as whole words."""
  return [name for name in names
          if not re.search(rf'(?<!\w){re.escape(name)}(?!\w)',
                           docstring or '')]


def test_there_are_packages():
  names = [p.name for p in _packages()]
  assert {'rl', 'run', 'rewards', 'data', 'models'} <= set(names), names


@pytest.mark.parametrize('folder', _packages(), ids=lambda p: p.name)
def test_docstring_names_every_module(folder):
  init = folder / '__init__.py'
  docstring = ast.get_docstring(ast.parse(init.read_text()))
  assert docstring, f'{init.relative_to(_PACKAGE.parent)} has no docstring.'
  missing = missing_names(docstring, siblings(folder))
  assert not missing, (
      f'The docstring of {init.relative_to(_PACKAGE.parent)} does not name '
      f'{missing}: add a few words on what each holds.')


def test_a_missing_name_is_found():
  text = 'rollout (prompts), objectives; gemma4_hf and `__main__` too.'
  assert missing_names(text, ['rollout', 'objectives', 'gemma4_hf',
                              '__main__']) == []
  # Part of a longer name does not stand for a module; a dotted path does.
  assert missing_names(text, ['gemma', 'gemma4', 'roll', 'hf']) == [
      'gemma', 'gemma4', 'roll', 'hf']
  assert missing_names('agent_tunix.rl.grpo', ['grpo']) == []
  assert missing_names(None, ['x']) == ['x']
