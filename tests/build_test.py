"""Checks that the Bazel BUILD file at the repository root matches the tree.

BUILD lists its files explicitly, so a module, config, CLI or test added
without a target would silently be left out of Bazel builds. These tests parse
BUILD with Python's ast module (the BUILD dialect used here is valid Python)
and compare it with the files on disk; they need no Bazel. One more test runs
`bazel query //...` when a `bazel` binary is on PATH.
"""

import ast
import os
import pathlib
import shutil
import subprocess

import pytest

# resolve(): under `bazel test` this file is a runfiles symlink; the checks
# must look at the source tree.
_REPO = pathlib.Path(__file__).resolve().parents[1]
_RULES = ('py_library', 'py_binary', 'py_test', 'genrule', 'filegroup')
# Attributes whose values the checks read; they must be literals.
_LITERAL_ATTRS = ('name', 'srcs', 'data', 'deps', 'main', 'args', 'outs')
_LIBRARY = 'agent_tunix'
_CONFIGS = 'configs'
_FIX = 'Edit BUILD at the repository root (see its header comment).'


def _parse_build():
  """Returns {target name: {'rule': rule, attr: value}} from BUILD."""
  path = _REPO / 'BUILD'
  tree = ast.parse(path.read_text(), filename=str(path))
  targets = {}
  duplicate_names = []
  not_literal = []
  for node in tree.body:
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id in _RULES):
      continue
    call = node.value
    attrs = {'rule': call.func.id}
    for keyword in call.keywords:
      if keyword.arg not in _LITERAL_ATTRS:
        continue
      try:
        attrs[keyword.arg] = ast.literal_eval(keyword.value)
      except ValueError:
        not_literal.append(f'line {keyword.value.lineno}: {keyword.arg}')
    name = attrs.get('name')
    assert name, f'BUILD line {call.lineno}: {call.func.id} has no name.'
    if name in targets:
      duplicate_names.append(name)
    targets[name] = attrs
  assert not not_literal, (
      f'BUILD attributes that are not literals (glob() or a variable?): '
      f'{not_literal}. List the files explicitly so that '
      'tests/build_test.py can check them.')
  assert not duplicate_names, (
      f'BUILD defines these target names more than once: {duplicate_names}. '
      + _FIX)
  return targets


@pytest.fixture(scope='module', name='targets')
def _targets():
  return _parse_build()


def _rel(paths):
  return sorted(p.relative_to(_REPO).as_posix() for p in paths)


def _package_modules():
  return _rel((_REPO / 'agent_tunix').rglob('*.py'))


def _config_modules():
  """The checkout paths of the presets (configs/*.py, one-line modules)."""
  return _rel((_REPO / 'configs').glob('*.py'))


def _package_data():
  """Files under agent_tunix/ that are not modules: what the presets read,
  installed with the package (pyproject.toml) and data of the library."""
  return _rel(p for p in (_REPO / 'agent_tunix').rglob('*')
              if p.is_file() and p.suffix not in ('.py', '.pyc')
              and '__pycache__' not in p.parts)


def _test_files():
  return _rel((_REPO / 'tests').glob('*_test.py'))


def _is_main_guard(node):
  """True for a top-level `if __name__ == '__main__':`."""
  if not isinstance(node, ast.If):
    return False
  test = node.test
  if not (isinstance(test, ast.Compare) and len(test.ops) == 1
          and isinstance(test.ops[0], ast.Eq)):
    return False
  sides = [test.left, test.comparators[0]]
  names = {s.id for s in sides if isinstance(s, ast.Name)}
  strings = {s.value for s in sides if isinstance(s, ast.Constant)}
  return names == {'__name__'} and strings == {'__main__'}


def _cli_modules():
  """Package modules that run as programs (have a __main__ guard)."""
  clis = []
  for rel in _package_modules():
    tree = ast.parse((_REPO / rel).read_text(), filename=rel)
    if any(_is_main_guard(node) for node in tree.body):
      clis.append(rel)
  return clis


def _of_rule(targets, rule):
  return {n: a for n, a in targets.items() if a['rule'] == rule}


def _files(values):
  """The source-file labels (no ':', '//' or '@' prefix) in a label list."""
  return [v for v in values if not v.startswith((':', '//', '@'))]


def _assert_same_files(kind, listed, on_disk):
  missing = sorted(set(on_disk) - set(listed))
  extra = sorted(set(listed) - set(on_disk))
  assert not missing and not extra, (
      f'BUILD {kind} is out of date. Add: {missing}. Remove (no such file): '
      f'{extra}. {_FIX}')


def test_library_lists_every_package_module(targets):
  assert _LIBRARY in targets, f'BUILD has no py_library {_LIBRARY!r}. {_FIX}'
  assert targets[_LIBRARY]['rule'] == 'py_library'
  _assert_same_files(f'py_library {_LIBRARY!r} srcs',
                     targets[_LIBRARY].get('srcs', []), _package_modules())


def test_configs_library_lists_every_config(targets):
  assert _CONFIGS in targets, f'BUILD has no py_library {_CONFIGS!r}. {_FIX}'
  assert targets[_CONFIGS]['rule'] == 'py_library'
  _assert_same_files(f'py_library {_CONFIGS!r} srcs',
                     targets[_CONFIGS].get('srcs', []), _config_modules())


def _owners(targets, rule, attr='srcs'):
  """{file: [names of the `rule` targets that list it in `attr`]}."""
  owners = {}
  for name, attrs in sorted(_of_rule(targets, rule).items()):
    for label in set(_files(attrs.get(attr, []))):
      owners.setdefault(label, []).append(name)
  return owners


def _not_exactly_one(files, owners, kind):
  problems = []
  for f in files:
    found = owners.get(f, [])
    if len(found) != 1:
      problems.append(f'{f} is in {len(found)} {kind} targets {found}')
  return problems


def test_every_module_and_test_file_is_in_exactly_one_target(targets):
  """A module in one py_library; a test file in its own py_test only
  (helpers a test imports are not *_test.py files)."""
  problems = _not_exactly_one(_package_modules() + _config_modules(),
                              _owners(targets, 'py_library'), 'py_library')
  problems += _not_exactly_one(_test_files(), _owners(targets, 'py_test'),
                               'py_test')
  assert not problems, '; '.join(problems) + f'. {_FIX}'


def test_presets_are_package_modules_and_configs_their_checkout_paths(
    targets):
  """agent_tunix/configs holds the presets (installed with the package);
  configs/NAME.py is the checkout path of agent_tunix/configs/NAME.py."""
  presets = [m for m in _package_modules()
             if m.startswith('agent_tunix/configs/')]
  assert 'agent_tunix/configs/base.py' in presets, presets
  assert set(presets) <= set(targets[_LIBRARY].get('srcs', []))
  shims = {pathlib.PurePosixPath(c).name for c in _config_modules()}
  names = {pathlib.PurePosixPath(p).name for p in presets}
  assert shims == names, (
      f'configs/ and agent_tunix/configs/ differ: only in configs/: '
      f'{sorted(shims - names)}, only in agent_tunix/configs/: '
      f'{sorted(names - shims)}. Add the one-line checkout path (or remove '
      'it) with its BUILD entry.')


def test_package_data_is_in_one_filegroup_that_the_library_carries(
    targets):
  data = _package_data()
  assert 'agent_tunix/configs/rubrics/train.jsonl' in data, data
  owners = _owners(targets, 'filegroup')
  problems = _not_exactly_one(data, owners, 'filegroup')
  carried = targets[_LIBRARY].get('data', [])
  problems += [f'{f}: py_library {_LIBRARY!r} data lack ":{owners[f][0]}"'
               for f in data
               if len(owners.get(f, [])) == 1 and f':{owners[f][0]}'
               not in carried]
  assert not problems, '; '.join(problems) + f'. {_FIX}'


def test_every_cli_has_a_binary_with_the_configs(targets):
  binaries = _of_rule(targets, 'py_binary')
  by_main = {a.get('main'): n for n, a in binaries.items()}
  clis = _cli_modules()
  assert 'agent_tunix/main.py' in clis, (
      f'Found no __main__ guard in agent_tunix/main.py; CLIs found: {clis}.')
  missing = [m for m in clis if m not in by_main]
  assert not missing, (
      f'These modules have an `if __name__ == "__main__":` block but no '
      f'py_binary with main = the module: {missing}. {_FIX}')
  not_cli = sorted(m for m in by_main if m not in clis)
  assert not not_cli, (
      f'These py_binary mains are not CLI modules (missing file or no '
      f'__main__ guard): {not_cli}. {_FIX}')
  for name, attrs in sorted(binaries.items()):
    main = attrs['main']
    assert main in attrs.get('srcs', []), (
        f'py_binary {name!r}: main {main!r} is not in its srcs. {_FIX}')
    assert f':{_LIBRARY}' in attrs.get('deps', []), (
        f'py_binary {name!r}: deps lack ":{_LIBRARY}". {_FIX}')
    assert f':{_CONFIGS}' in attrs.get('data', []), (
        f'py_binary {name!r}: data lack ":{_CONFIGS}" (the CLIs load config '
        f'files by path). {_FIX}')


def test_every_test_file_has_a_py_test(targets):
  tests = _of_rule(targets, 'py_test')
  expected = {pathlib.PurePosixPath(f).stem: f for f in _test_files()}
  missing = sorted(f for n, f in expected.items() if n not in tests)
  assert not missing, (
      f'These test files have no py_test (name = the file name without '
      f'.py): {missing}. {_FIX}')
  stale = sorted(n for n in tests if n not in expected)
  assert not stale, (
      f'These py_tests have no tests/<name>.py file: {stale}. {_FIX}')
  conftest = (_REPO / 'tests' / 'conftest.py').exists()
  for name, test_file in sorted(expected.items()):
    attrs = tests[name]
    srcs = attrs.get('srcs', [])
    assert test_file in srcs, (
        f'py_test {name!r}: srcs lack {test_file!r}. {_FIX}')
    assert attrs.get('args') == [f'$(rootpath {test_file})'], (
        f'py_test {name!r}: args are {attrs.get("args")}, want '
        f'["$(rootpath {test_file})"] (the file that pytest runs). {_FIX}')
    main = attrs.get('main')
    assert main in srcs, f'py_test {name!r}: main {main!r} not in srcs. {_FIX}'
    if conftest:
      assert 'tests/conftest.py' in srcs, (
          f'py_test {name!r}: srcs lack "tests/conftest.py". {_FIX}')


def _string_constants(path):
  tree = ast.parse((_REPO / path).read_text(), filename=path)
  return {node.value for node in ast.walk(tree)
          if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def test_tests_declare_the_files_they_read(targets):
  """Tests that read README.md or launch/*.sh must have them as data."""
  launch_scripts = _rel((_REPO / 'launch').glob('*.sh'))
  this_file = pathlib.Path(__file__).resolve().relative_to(_REPO).as_posix()
  problems = []
  for test_file in _test_files():
    name = pathlib.PurePosixPath(test_file).stem
    # A test without a target is reported by
    # test_every_test_file_has_a_py_test. This file names those paths without
    # reading them, and its py_test cannot list the whole tree (see _REPO).
    if name not in targets or test_file == this_file:
      continue
    strings = _string_constants(test_file)
    data = targets[name].get('data', [])
    needed = []
    if any(s == 'README.md' or s.endswith('/README.md') for s in strings):
      needed.append('README.md')
    if any(s == 'launch' or s.startswith('launch/') for s in strings):
      needed.extend(launch_scripts)
    missing = [f for f in needed if f not in data]
    if missing:
      problems.append(f'py_test {name!r} data lack {missing}')
  assert not problems, '; '.join(problems) + f'. {_FIX}'


def test_listed_files_exist_and_labels_resolve(targets):
  generated = {out for a in targets.values() for out in a.get('outs', [])}
  missing_files = []
  bad_labels = []
  for name, attrs in sorted(targets.items()):
    for attr in ('srcs', 'data', 'deps'):
      for label in attrs.get(attr, []):
        if label.startswith(':'):
          if label[1:] not in targets and label[1:] not in generated:
            bad_labels.append(f'{name}.{attr}: {label}')
        elif not label.startswith(('//', '@')):
          if not (_REPO / label).is_file():
            missing_files.append(f'{name}.{attr}: {label}')
  assert not missing_files, (
      f'BUILD lists files that do not exist: {missing_files}. {_FIX}')
  assert not bad_labels, (
      f'BUILD refers to targets it does not define: {bad_labels}. {_FIX}')


def test_no_duplicates(targets):
  problems = []
  for name, attrs in sorted(targets.items()):
    for attr in ('srcs', 'data', 'deps', 'outs'):
      values = attrs.get(attr, [])
      dups = sorted({v for v in values if values.count(v) > 1})
      if dups:
        problems.append(f'{name}.{attr} repeats {dups}')
  # A module must belong to exactly one library.
  owner = {}
  for name, attrs in sorted(_of_rule(targets, 'py_library').items()):
    for src in sorted(set(_files(attrs.get('srcs', [])))):
      if src in owner:
        problems.append(f'{src} is in py_library {owner[src]!r} and {name!r}')
      owner[src] = name
  assert not problems, '; '.join(problems) + f'. {_FIX}'


def test_bazel_query_lists_every_target(targets, tmp_path):
  """`bazel query //...` loads BUILD offline and sees every rule in it."""
  bazel = shutil.which('bazel')
  if bazel is None:
    pytest.skip('bazel is not on PATH (Debian: apt-get install '
                'bazel-bootstrap); the ast checks above still ran.')
  if 'TEST_SRCDIR' in os.environ:
    pytest.skip('running under `bazel test`; not starting a nested Bazel.')
  # --batch: no server process outlives the test. A private output root
  # keeps the developer's Bazel cache untouched.
  command = [bazel, '--batch', f'--output_user_root={tmp_path / "bazel"}',
             'query', '//...', '--noshow_progress']
  result = subprocess.run(command, cwd=_REPO, capture_output=True, text=True,
                          timeout=600, check=False)
  assert result.returncode == 0, (
      f'{" ".join(command)} failed with exit code {result.returncode}:\n'
      f'{result.stderr[-3000:]}')
  listed = set(result.stdout.split())
  expected = {f'//:{name}' for name in targets}
  assert listed == expected, (
      f'bazel query //... differs from BUILD as parsed here. Missing from '
      f'the query: {sorted(expected - listed)}. Only in the query: '
      f'{sorted(listed - expected)}.')
