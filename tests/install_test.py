"""The package installs with pip, and presets go by name from anywhere.

`pip install --target` puts the package built from pyproject.toml in a
temporary folder; the commands then run from another temporary folder, the
checkout nowhere on their path, with the environment's other packages.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from agent_tunix import api
from agent_tunix import cli
from agent_tunix.configs import gemma3_270m

_REPO = pathlib.Path(__file__).resolve().parents[1]
_PRESETS = _REPO / 'agent_tunix' / 'configs'


def _can_build_wheels_here():
  """Whether this environment's setuptools builds a wheel by itself
  (70.1 and later, or an older one with the `wheel` package)."""
  try:
    import setuptools  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  major, minor = (int(p) for p in setuptools.__version__.split('.')[:2])
  if (major, minor) >= (70, 1):
    return True
  try:
    import wheel  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True


@pytest.fixture(scope='module', name='installed')
def _installed(tmp_path_factory):
  """The folder `pip install --no-deps --target` filled from a copy of the
  checkout (pip writes build/ and *.egg-info beside the sources)."""
  source = tmp_path_factory.mktemp('source')
  for name in ('pyproject.toml', 'README.md'):
    shutil.copy(_REPO / name, source / name)
  shutil.copytree(_REPO / 'agent_tunix', source / 'agent_tunix',
                  ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
  target = tmp_path_factory.mktemp('site')
  command = [sys.executable, '-m', 'pip', 'install', '--no-deps', '-q',
             '--target', str(target), str(source)]
  if _can_build_wheels_here():  # Else pip fetches setuptools to build.
    command.insert(4, '--no-build-isolation')
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return target


def _run(installed, cwd, *args):
  """`python ARGS` in `cwd`, the installed package first on the path."""
  env = dict(os.environ, PYTHONPATH=str(installed), JAX_PLATFORMS='cpu')
  return subprocess.run([sys.executable, *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=600,
                        check=False)


def test_the_package_holds_every_module_and_the_presets_files(installed):
  def files(root):
    return {p.relative_to(root).as_posix() for p in root.rglob('*')
            if p.is_file() and '__pycache__' not in p.parts}
  wanted = files(_REPO / 'agent_tunix')
  assert 'agent_tunix/configs/rubrics/test.jsonl' in {
      f'agent_tunix/{f}' for f in wanted}
  missing = sorted(wanted - files(installed / 'agent_tunix'))
  assert not missing, f'Not installed (pyproject.toml packages/data): {missing}'


@pytest.mark.parametrize('preset, model, steps', [
    ('gemma3_270m:quick', 'gemma3_270m',
     gemma3_270m.get_config('quick').training.num_steps),
    ('tiny', 'tiny', None),
])
def test_acceptance_a_preset_by_name_outside_the_checkout(
    installed, tmp_path, preset, model, steps):
  result = _run(installed, tmp_path, '-m', 'agent_tunix.main',
                f'--config={preset}', '--print_config')
  assert result.returncode == 0, result.stderr[-3000:]
  printed = json.loads(result.stdout[result.stdout.index('{'):])
  assert printed['model']['preset'] == model
  if steps is not None:
    assert printed['training']['num_steps'] == steps


def test_the_installed_rubric_preset_reads_the_installed_rows(
    installed, tmp_path):
  script = ('import json\n'
            'import agent_tunix\n'
            'from agent_tunix.configs import gemma3_270m_rubrics as p\n'
            'c = p.get_config()\n'
            "print(json.dumps([agent_tunix.__file__,\n"
            "                  c.data.path.format(split='train'),\n"
            "                  c.data.path.format(split='test'),\n"
            '                  c.judge.prompt_file]))\n')
  result = _run(installed, tmp_path, '-c', script)
  assert result.returncode == 0, result.stderr[-3000:]
  package, *paths = json.loads(result.stdout)
  assert package == str(installed / 'agent_tunix' / '__init__.py')
  for path in paths:
    assert path.startswith(str(installed)), path
    assert os.path.getsize(path) > 0, path


def test_an_unknown_preset_is_one_line_with_the_presets(installed, tmp_path):
  result = _run(installed, tmp_path, '-m', 'agent_tunix.credentials',
                '--config=gemma3_270:quick')
  assert result.returncode == cli.USAGE
  (line,) = result.stderr.strip().splitlines()
  assert "no preset 'gemma3_270'" in line
  assert 'gemma3_270m, gemma3_270m_rubrics' in line and 'tiny' in line


def test_a_missing_path_names_the_presets_too(installed, tmp_path):
  result = _run(installed, tmp_path, '-m', 'agent_tunix.credentials',
                '--config=configs/gemma3_270m.py')
  assert result.returncode == cli.USAGE
  (line,) = result.stderr.strip().splitlines()
  assert 'configs/gemma3_270m.py' in line and 'gemma3_270m,' in line


def test_sweep_prints_runs_of_a_preset_by_name(installed, tmp_path):
  result = _run(installed, tmp_path, '-m', 'agent_tunix.sweep',
                '--config=tiny', f'--workdir={tmp_path / "sweep"}',
                '--sweep=training.num_steps=1,2', '--print_points')
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.strip().splitlines()
  assert len(lines) == 2
  preset = installed / 'agent_tunix' / 'configs' / 'tiny.py'
  assert all(f'--config={preset}' in line for line in lines), lines


@pytest.mark.parametrize('value, want', [
    ('tiny', 'agent_tunix/configs/tiny.py'),
    ('gemma3_270m:quick,model.lora_rank=8',
     'agent_tunix/configs/gemma3_270m.py:quick,model.lora_rank=8'),
    ('tiny.py', 'agent_tunix/configs/tiny.py'),
    # Paths stay paths, existing or not (ml_collections says which is
    # missing).
    ('configs/tiny.py:x', 'configs/tiny.py:x'),
    ('./tiny', './tiny'),
    ('', ''),
])
def test_resolve_config_in_the_checkout(monkeypatch, value, want):
  monkeypatch.chdir(_REPO)
  assert cli.resolve_config(value) == want


def test_resolve_config_outside_is_the_absolute_file(monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  assert cli.resolve_config('tiny:a') == f'{_PRESETS / "tiny.py"}:a'
  (tmp_path / 'tiny').write_text('')  # A file of that name wins.
  assert cli.resolve_config('tiny') == 'tiny'


def test_resolve_presets_reads_both_flag_forms_and_stops_at_dashes(
    monkeypatch):
  monkeypatch.chdir(_REPO)
  argv = ['prog', '--config', 'tiny', '-config=tiny:x', '--workdir=tiny',
          '--', '--config=tiny']
  assert cli.resolve_presets(argv) == [
      'prog', '--config', 'agent_tunix/configs/tiny.py',
      '-config=agent_tunix/configs/tiny.py:x', '--workdir=tiny', '--',
      '--config=tiny']


def test_preset_names_are_the_modules_of_the_configs_package():
  names = cli.preset_names()
  assert names == sorted(p.stem for p in _PRESETS.glob('*.py')
                         if p.stem != '__init__')
  assert {'gemma3_270m', 'tiny', 'gemma3_270m_rubrics'} <= set(names)


def test_the_notebook_api_takes_a_preset_by_name():
  by_name = api.preset('gemma3_270m:quick')
  assert by_name.to_dict() == gemma3_270m.get_config('quick').to_dict()
  assert api.preset('gemma3_270m').to_dict() == (
      gemma3_270m.get_config().to_dict())
  with pytest.raises(ValueError, match=r"no preset 'gemma'.*tiny"):
    api.preset('gemma:quick')
