"""The GPU check's cheap parts: the bundle listing and the results files.

The listing test imports the training path twice in child interpreters
(seconds): once to classify what it needs, once seeing only the GPU
machine's packages and the bundle's. The bundler is a script,
launch/gpu_bundle.py, loaded here from its path.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import textwrap

from agent_tunix.bench import gpu_results


def _load_bundler():
  path = pathlib.Path(__file__).resolve().parents[1] / 'launch/gpu_bundle.py'
  spec = importlib.util.spec_from_file_location('gpu_bundle', path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up
  spec.loader.exec_module(module)
  return module


gpu_bundle = _load_bundler()


def test_training_path_imports_only_machine_and_bundle_packages():
  machine = gpu_bundle.read_machine_packages()
  found = gpu_bundle.listing(machine)
  # What is carried is not on the machine, and what the machine has that
  # the path imports is on its list.
  assert not set(found.bundle) & set(machine)
  assert set(found.machine) <= set(machine)
  # Packages the training path needs and the machine lacks are carried.
  for name in ('google-tunix', 'qwix', 'grain', 'ml-collections'):
    assert name in found.bundle, found.bundle
  assert all(found.bundle.values()), found.bundle
  assert 'tensorflow' not in found.bundle
  # Seeing only the machine's packages and the bundle's, every module of
  # the training path imports.
  assert gpu_bundle.check(found.bundle, machine) is None


def test_a_package_missing_from_both_fails_the_check():
  machine = gpu_bundle.read_machine_packages()
  found = gpu_bundle.listing(machine)
  bundle = dict(found.bundle)
  del bundle['qwix']
  error = gpu_bundle.check(bundle, machine)
  assert error is not None
  assert error['type'] == 'ModuleNotFoundError'
  assert 'qwix' in error['message']


def test_machine_list_names_the_image_packages():
  machine = gpu_bundle.read_machine_packages()
  assert machine['jax'] == '0.11.2'
  assert machine['flax'] == ''  # Version unknown: the check prints it.
  assert 'tensorflow' not in machine
  assert 'google-tunix' not in machine
  assert gpu_bundle.canonical('ml_collections') == 'ml-collections'


def test_pins_for_the_machine_python_take_a_flax_that_runs_on_jax_011():
  pins = gpu_bundle.pinned_versions('312')
  assert pins['flax'] == '0.12.12'
  assert set(pins) == set(gpu_bundle.PINNED)


def test_imports_inside_a_try_catching_import_error_are_optional(tmp_path):
  source = tmp_path / 'mod.py'
  source.write_text(textwrap.dedent("""\
      import os
      try:
        import optional_thing
      except ImportError:
        optional_thing = None
      try:
        import other
      except (ValueError, ModuleNotFoundError):
        pass
      try:
        import needed
      except ValueError:
        pass
      """))
  finder = gpu_bundle._TryFinder()  # pylint: disable=protected-access
  ranges = finder._try_ranges(str(source))  # pylint: disable=protected-access
  assert ranges == [(3, 3), (7, 7)]


def test_results_are_written_after_each_stage(tmp_path):
  out = str(tmp_path)
  gpu_results.start(out, 'grpo')
  assert gpu_results.load(out)['running'] == 'grpo'
  gpu_results.record(out, 'grpo', 'ok', 12.5,
                     fields={'grpo_step_s': 1.25, 'rollout_s': 0.75})
  gpu_results.start(out, 'decode')
  results = gpu_results.finish(out, ['grpo', 'decode', 'tunix'])
  assert results['running'] is None
  assert results['grpo_step_s'] == 1.25
  assert results['tunix_step_s'] is None
  assert results['stages']['grpo']['status'] == 'ok'
  assert results['stages']['decode']['status'] == 'skipped'
  assert results['stages']['tunix']['reason'] == (
      'not reached before the deadline')
  with open(os.path.join(out, 'results.json')) as f:
    assert json.load(f) == results
  with open(os.path.join(out, 'results.md')) as f:
    table = f.read()
  assert '| grpo_step_s | 1.25 |' in table
  assert '| grpo | ok | 12.5 |  |' in table
  assert '| tunix_step_s | - |' in table


def test_results_command_records_a_stage_it_was_told_of(tmp_path):
  out = str(tmp_path)
  assert gpu_results.main(
      ['x', f'--out={out}', '--stage=smoke', '--status=error',
       '--reason=flax failed to import']) == 0
  results = gpu_results.load(out)
  assert results['stages']['smoke']['status'] == 'error'
  assert results['stages']['smoke']['reason'] == 'flax failed to import'
  assert gpu_results.main(['x', f'--out={out}', '--stage=smoke']) == 2


def test_tools_workload_follows_the_tools_preset():
  # pylint: disable=g-import-not-at-top
  from agent_tunix.bench import gpu_check
  from agent_tunix.configs import gemma3_270m_tools
  preset = gemma3_270m_tools.get_config()
  config = gpu_check.workload_config(gpu_check.WORKLOADS['gpu']['tools'],
                                     'tok.model')
  for field in ('training.batch_size', 'training.micro_batch_size',
                'grpo.num_generations', 'generation.max_prompt_length',
                'generation.max_generation_steps'):
    section, name = field.split('.')
    assert config[section][name] == preset[section][name], field
  gen = config.generation
  assert gen.kv_cache_size == gen.max_prompt_length + gen.max_generation_steps
  assert (config.model.source, config.model.dtype) == ('random', 'bfloat16')
  # A workload that names its shapes gets them.
  main = gpu_check.workload_config(gpu_check.WORKLOADS['gpu']['main'],
                                   'tok.model')
  assert (main.training.batch_size, main.grpo.num_generations,
          main.generation.max_generation_steps) == (64, 8, 256)


def test_bundler_runs_as_a_script_from_any_folder(tmp_path):
  script = pathlib.Path(gpu_bundle.__file__)
  proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path,
                        capture_output=True, text=True, check=False)
  # It got as far as its flags: the package imported, the usage refused.
  assert proc.returncode == 2, proc.stderr
  assert '--dest=DIR' in proc.stderr
