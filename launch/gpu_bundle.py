r"""The wheels the GPU machine lacks, found by walking our imports.

  python launch/gpu_bundle.py --list
  python launch/gpu_bundle.py --dest=.whl/gpu_bundle --python_tag=312

A script beside launch/gpu_check.sh, which runs it (--bundle), not a part of
the package. It imports only the standard library and absl at the top, so
that the import walk's child starts from a clean interpreter; the package
(agent_tunix.cli, the tokenizer) is imported only where it is used.

`listing()` walks `TRAINING_PATH` in a child interpreter behind an import
hook (`_Hook`) and splits what it imports into what the machine has
(launch/gpu_machine_packages.txt) and what must travel; `check()` imports
the path with only the machine's packages and the bundle's visible;
`download()` writes the bundle: wheels/, pins/, tokenizer.model and
bundle.json.

Design notes: docs/benchmarks.md, the section on launch/gpu_check.sh.
"""

import ast
import dataclasses
import importlib
import importlib.abc
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
from absl import logging

LAUNCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(LAUNCH_DIR)
MACHINE_PACKAGES = os.path.join(LAUNCH_DIR, 'gpu_machine_packages.txt')
# What the GPU check imports: the trainer's command, the benchmark stages
# (ours and tunix's GRPO step, decode) and the tunix modules the tunix stage
# imports inside its function.
TRAINING_PATH = (
    'agent_tunix.main',
    'agent_tunix.bench.gpu_check',
    'tunix.rl.rl_cluster',
    'tunix.rl.grpo.grpo_learner',
    'tunix.rl.rollout.base_rollout',
)
# Packages the machine has whose version there is unknown and which our
# code or the bundle is sensitive to; their tested versions travel in pins/.
# flax <= 0.12.8 fails to import on jax >= 0.11.1, and flax >= 0.12.9 needs
# Python 3.12: a cp312 bundle pins the newest flax, any other tag the flax
# installed here. perfetto's generated protos need protobuf >= 6.31.1.
PINNED = ('flax', 'optax', 'orbax-checkpoint', 'protobuf')
PINNED_VERSIONS = {'312': {'flax': '0.12.12'}}
# Accelerator plugins: each machine brings its own (never carried).
PLATFORM_PACKAGES = frozenset((
    'libtpu', 'jax-cuda12-plugin', 'jax-cuda12-pjrt', 'jax-cuda13-plugin',
    'jax-cuda13-pjrt',
))
# A wheel larger than this could not travel with the repo (64 MiB a call).
MAX_BUNDLE_BYTES = 40 << 20
# manylinux platform tags pip matches exactly (device README).
_PLATFORMS = ('manylinux_2_17_x86_64', 'manylinux2014_x86_64',
              'manylinux_2_24_x86_64', 'manylinux_2_27_x86_64',
              'manylinux_2_28_x86_64', 'manylinux_2_31_x86_64',
              'manylinux_2_34_x86_64', 'manylinux_2_35_x86_64',
              'manylinux1_x86_64')
_CATCHES_IMPORT_ERROR = frozenset(
    ('ImportError', 'ModuleNotFoundError', 'Exception', 'BaseException')
)



def canonical(name):
  """A distribution name as pip compares them (PEP 503)."""
  return re.sub(r'[-_.]+', '-', name).lower()


def read_machine_packages(path=MACHINE_PACKAGES):
  """{canonical name: version or ''} from the machine's package list."""
  packages = {}
  with open(path) as f:
    for line in f:
      line = line.split('#', 1)[0].strip()
      if not line:
        continue
      name, _, version = line.partition('==')
      packages[canonical(name.strip())] = version.strip()
  return packages


# ------------------------------------------------------------ import walk


def module_owners():
  """{module name: set of canonical distribution names} from RECORD files.

  A file `a/b/c.py` (or `c.cpython-*.so`, or `a/b/c/__init__.py`) makes its
  distribution an owner of `a.b.c` and of its packages `a.b` and `a`; so a
  namespace package (`google`) has every distribution below it as owners.
  """
  owners = {}
  for dist in importlib.metadata.distributions():
    name = canonical(dist.metadata['Name'] or '')
    for file in dist.files or ():
      parts = file.parts
      if not parts or parts[0].endswith(('.dist-info', '.data', '..')):
        continue
      stem = parts[-1].split('.', 1)[0]
      if not parts[-1].endswith(('.py', '.so', '.pyd')):
        continue
      names = list(parts[:-1])
      if stem != '__init__':
        names.append(stem)
      for i in range(1, len(names) + 1):
        owners.setdefault('.'.join(names[:i]), set()).add(name)
  return owners


def _owners_of(module, owners):
  """Owners of `module` or, failing that, of its nearest parent package."""
  while module:
    if module in owners:
      return owners[module]
    module = module.rpartition('.')[0]
  return set()


class _TryFinder:
  """Which lines of a source file lie in a `try` catching ImportError."""

  def __init__(self):
    self._ranges = {}

  def _try_ranges(self, filename):
    if filename not in self._ranges:
      ranges = []
      try:
        with open(filename) as f:
          tree = ast.parse(f.read())
      except (OSError, SyntaxError, ValueError):
        tree = None
      for node in ast.walk(tree) if tree else ():
        if isinstance(node, ast.Try) and any(
            _catches_import_error(h.type) for h in node.handlers):
          last = node.body[-1]
          ranges.append((node.body[0].lineno,
                         getattr(last, 'end_lineno', last.lineno)))
      self._ranges[filename] = ranges
    return self._ranges[filename]

  def guarded(self, frame):
    """True when any frame from `frame` out to the walk is in such a try."""
    while frame is not None and frame.f_code is not _walk_child.__code__:
      filename = frame.f_code.co_filename
      if not filename.startswith('<'):
        line = frame.f_lineno
        if any(a <= line <= b for a, b in self._try_ranges(filename)):
          return True
      frame = frame.f_back
    return False


def _catches_import_error(node):
  if node is None:  # A bare except.
    return True
  if isinstance(node, ast.Tuple):
    return any(_catches_import_error(e) for e in node.elts)
  name = node.attr if isinstance(node, ast.Attribute) else getattr(
      node, 'id', '')
  return name in _CATCHES_IMPORT_ERROR


class _Hook(importlib.abc.MetaPathFinder):
  """Refuses or records imports of distributions outside `allowed`.

  mode 'classify': an import inside a try that catches ImportError is
  refused (recorded as optional), any other is let through (recorded as
  needed). mode 'strict': every one is refused, as on the machine.
  """

  def __init__(self, owners, allowed, mode):
    self.owners = owners
    self.allowed = allowed
    self.mode = mode
    self.needed = {}  # distribution -> first module imported
    self.optional = {}  # distribution -> first module refused
    self._tries = _TryFinder()

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    owners = _owners_of(fullname, self.owners)
    if not owners or owners & self.allowed:
      return None
    dist = sorted(owners)[0]
    if self.mode == 'classify' and not self._tries.guarded(
        sys._getframe(1)):  # pylint: disable=protected-access
      self.needed.setdefault(dist, fullname)
      return None
    self.optional.setdefault(dist, fullname)
    raise ModuleNotFoundError(
        f'No module named {fullname!r} (distribution {dist} is not on the '
        'GPU machine nor in the bundle)', name=fullname)


def _walk_child(request_path, result_path):
  """The child's side of `walk`: imports, then writes what it saw."""
  with open(request_path) as f:
    request = json.load(f)
  owners = module_owners()
  hook = _Hook(owners, set(request['allowed']), request['mode'])
  sys.meta_path.insert(0, hook)
  error = None
  for module in request['modules']:
    try:
      importlib.import_module(module)
    except Exception as e:  # pylint: disable=broad-except
      error = {'module': module, 'type': type(e).__name__, 'message': str(e),
               'missing': getattr(e, 'name', None)}
      break
  sys.meta_path.remove(hook)
  imported = {}
  for name in list(sys.modules):
    for dist in _owners_of(name, owners):
      imported.setdefault(dist, name)
  versions = {}
  for dist in imported:
    try:
      versions[dist] = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
      versions[dist] = ''
  with open(result_path, 'w') as f:
    json.dump({'imported': imported, 'versions': versions,
               'needed': hook.needed, 'optional': hook.optional,
               'error': error}, f)


def walk(modules, allowed, mode, timeout=600):
  """Imports `modules` in a child interpreter behind `_Hook`.

  Args:
    modules: module names to import, in order.
    allowed: canonical distribution names the child may import freely.
    mode: 'classify' or 'strict' (see `_Hook`).
    timeout: seconds.

  Returns:
    {'imported': {dist: a module of it}, 'versions': {dist: version},
     'needed': {dist: module}, 'optional': {dist: module}, 'error': None or
     {'module', 'type', 'message', 'missing'}}.
  """
  with tempfile.TemporaryDirectory(prefix='gpu_bundle_') as tmp:
    request, result = (os.path.join(tmp, n) for n in ('req.json', 'out.json'))
    with open(request, 'w') as f:
      json.dump({'modules': list(modules), 'allowed': sorted(allowed),
                 'mode': mode}, f)
    env = dict(os.environ, JAX_PLATFORMS='cpu')
    env['PYTHONPATH'] = os.pathsep.join(
        p for p in (REPO_ROOT, env.get('PYTHONPATH', '')) if p)
    code = (f'import sys; sys.path.insert(0, {LAUNCH_DIR!r}); '
            'import gpu_bundle; '
            'gpu_bundle._walk_child(sys.argv[1], sys.argv[2])')
    proc = subprocess.run(
        [sys.executable, '-c', code, request, result], env=env,
        capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode or not os.path.exists(result):
      raise RuntimeError(
          f'The import walk failed (exit {proc.returncode}):\n'
          f'{proc.stderr[-3000:]}')
    with open(result) as f:
      return json.load(f)


@dataclasses.dataclass
class Listing:
  """What the training path imports, split by where it comes from.

  Attributes:
    bundle: {dist: version} needed and not on the machine: carried.
    via: {dist: the first module of it imported} for the bundle's.
    machine: {dist: version here} needed and on the machine.
    optional: {dist: module} refused inside a try: not carried.
    platform: accelerator plugins the walk touched (never carried).
  """

  bundle: dict
  via: dict
  machine: dict
  optional: dict
  platform: list

  def to_json(self):
    return dataclasses.asdict(self)


def listing(machine=None, modules=TRAINING_PATH):
  """Classifies the training path's distributions (one child import walk)."""
  machine = read_machine_packages() if machine is None else machine
  result = walk(modules, set(machine) | PLATFORM_PACKAGES, 'classify')
  if result['error']:
    raise RuntimeError(
        f"Importing {result['error']['module']} failed here: "
        f"{result['error']['type']}: {result['error']['message']}")
  versions = result['versions']
  needed = set(result['needed'])
  return Listing(
      bundle={d: versions.get(d, '') for d in sorted(needed)},
      via={d: result['needed'][d] for d in sorted(needed)},
      machine={d: versions.get(d, '') for d in sorted(result['imported'])
               if d in machine},
      optional=dict(sorted(result['optional'].items())),
      platform=sorted(set(result['imported']) & PLATFORM_PACKAGES),
  )


def check(bundle, machine=None, modules=TRAINING_PATH):
  """Imports the training path seeing only the machine's packages and
  `bundle`'s; returns the walk's error (None when it imported)."""
  machine = read_machine_packages() if machine is None else machine
  allowed = set(machine) | set(bundle) | PLATFORM_PACKAGES
  return walk(modules, allowed, 'strict')['error']


# -------------------------------------------------------------- download


def _pip_download(specs, dest, python_tag):
  """Downloads wheels (no dependencies) for CPython `python_tag`, x86-64."""
  os.makedirs(dest, exist_ok=True)
  cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps',
         '--only-binary=:all:', '--python-version', python_tag,
         '--implementation', 'cp', '--dest', dest, '--quiet']
  for platform in _PLATFORMS:
    cmd += ['--platform', platform]
  logging.info('pip download %s', ' '.join(specs))
  proc = subprocess.run(cmd + list(specs), capture_output=True, text=True,
                        check=False)
  if proc.returncode:
    raise RuntimeError(f'pip download failed:\n{proc.stderr[-3000:]}')


def _installed_bytes(dist):
  try:
    files = importlib.metadata.distribution(dist).files or ()
  except importlib.metadata.PackageNotFoundError:
    return 0
  return sum(f.size or 0 for f in files)


def pinned_versions(python_tag):
  """{dist: version} of `PINNED` for a bundle of this python tag."""
  versions = {}
  for dist in PINNED:
    version = PINNED_VERSIONS.get(python_tag, {}).get(dist)
    versions[dist] = version or importlib.metadata.version(dist)
  return versions


def write_tokenizer(path):
  """Writes Gemma 3's SentencePiece model, rebuilt from the packaged GGUF."""
  # pylint: disable=g-import-not-at-top
  from agent_tunix.models import gguf as gguf_lib
  from agent_tunix.models import tokenizer as tokenizer_lib
  # pylint: enable=g-import-not-at-top
  proto = tokenizer_lib.sentencepiece_proto_from_gguf(gguf_lib.default_path())
  with open(path, 'wb') as f:
    f.write(proto)


def directory_bytes(path):
  return sum(os.path.getsize(os.path.join(root, name))
             for root, _, names in os.walk(path) for name in names)


def download(dest, python_tag, machine=None):
  """Builds the bundle in `dest` (docs/benchmarks.md); its bytes."""
  found = listing(machine)
  missing = [d for d, v in found.bundle.items() if not v]
  if missing:
    raise RuntimeError(f'No installed version here of {missing}.')
  too_big = {d: found.via[d] for d in found.bundle
             if _installed_bytes(d) > MAX_BUNDLE_BYTES}
  if too_big:
    raise RuntimeError(
        f'The training path imports {too_big} ({{distribution: first module '
        'imported}}), which the GPU machine lacks and which is larger '
        f'installed than the whole bundle may be ({MAX_BUNDLE_BYTES >> 20} '
        'MiB). Take that import off the training path.')
  error = check(found.bundle, machine)
  if error:
    raise RuntimeError(
        f"With only the machine's packages and the bundle, importing "
        f"{error['module']} fails: {error['type']}: {error['message']}")
  pins = pinned_versions(python_tag)
  os.makedirs(dest, exist_ok=True)
  for sub in ('wheels', 'pins'):
    old = os.path.join(dest, sub)
    if os.path.isdir(old):
      for name in os.listdir(old):
        os.remove(os.path.join(old, name))
  _pip_download([f'{d}=={v}' for d, v in found.bundle.items()],
                os.path.join(dest, 'wheels'), python_tag)
  _pip_download([f'{d}=={v}' for d, v in pins.items()],
                os.path.join(dest, 'pins'), python_tag)
  write_tokenizer(os.path.join(dest, 'tokenizer.model'))
  with open(os.path.join(dest, 'bundle.json'), 'w') as f:
    json.dump({'python_tag': python_tag, 'pins': pins, **found.to_json()},
              f, indent=2)
  size = directory_bytes(dest)
  if size > MAX_BUNDLE_BYTES:
    raise RuntimeError(
        f'The bundle is {size / 2**20:.1f} MiB, over '
        f'{MAX_BUNDLE_BYTES >> 20} MiB.')
  return size


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if flags.FLAGS.list:
    print(json.dumps(listing().to_json(), indent=2))
    return
  if not flags.FLAGS.dest:
    raise app.UsageError('Give --dest=DIR (or --list).')
  size = download(flags.FLAGS.dest, flags.FLAGS.python_tag)
  print(f'bundle {flags.FLAGS.dest}: {size / 2**20:.1f} MiB ({size} bytes)')


if __name__ == '__main__':
  # Run as a script, its folder is on sys.path, not the package's.
  sys.path.insert(0, REPO_ROOT)
  from agent_tunix import cli  # pylint: disable=g-import-not-at-top
  # Defined here, not at import: the import walk's child imports this module
  # before the trainer, whose commands define flags of their own.
  flags.DEFINE_bool('list', False, 'Print the listing (JSON) and exit.')
  flags.DEFINE_string('dest', '', 'Write the bundle here.')
  flags.DEFINE_string(
      'python_tag', '312',
      "CPython tag of the machine's interpreter: 312 for the GPU machine; "
      "the rehearsal passes this machine's.")
  cli.run(main)
