"""Checks README.md and docs/*.md against the tree and the code.

* Every relative link (`[text](path#anchor)`, images too) names a file that
  exists and, with an anchor into a Markdown file, a heading of that file
  (GitHub's heading ids).
* Every `python -m agent_tunix...` command quoted in the docs (in a code
  block, backslash continuations joined, or in an inline code span) names a
  module that runs as a program, and each of its `--flags` is one that the
  command defines: `--config.a.b` a field of agent_tunix/configs/base.py's get_config(),
  `--config=FILE` an existing config file, any other flag one that the
  module, or a module of agent_tunix it imports, defines with
  `flags.DEFINE_*` (read from the source, nothing is run), or one of absl's
  own flags (--helpfull, --verbosity, ...).
* Every `--config.a.b` written anywhere in the docs' code (launch/run.sh
  commands too) is a field, unless it is one of the placeholders listed in
  `_PLACEHOLDER_FIELDS`.
* Every repository path quoted as code (`agent_tunix/rl/objectives.py`,
  `tests/resume_test.py`, ...) exists.

The checkers are plain functions of text, and the last tests feed them a
planted broken link, module and flag, so a checker that finds nothing fails.
"""

import ast
import functools
import os
import re
import shlex

import pytest

from agent_tunix.configs import base

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = 'agent_tunix'

# `--config.<placeholder>` spellings the prose uses to mean "any field".
_PLACEHOLDER_FIELDS = frozenset({'*', 'x', 'FIELD'})

# Shell words that end a command's arguments.
_SHELL_ENDS = frozenset({'&&', '||', '|', ';', '&', '>', '>>', '2>', '<',
                         '2>&1'})


def _doc_files():
  files = [os.path.join(_REPO, 'README.md')]
  docs = os.path.join(_REPO, 'docs')
  files += sorted(os.path.join(docs, name) for name in os.listdir(docs)
                  if name.endswith('.md'))
  return files


def _rel(path):
  return os.path.relpath(path, _REPO)


def _read(path):
  with open(path, encoding='utf-8') as f:
    return f.read()


# ------------------------------------------------------------ Markdown parts


def _split_fences(text):
  """(prose lines, code blocks) of Markdown `text`.

  Prose lines are (line number, text) outside fenced code blocks; a code
  block is (line number of its first line, its lines).
  """
  prose, blocks = [], []
  fence, block, start = None, [], 0
  for number, line in enumerate(text.splitlines(), 1):
    stripped = line.lstrip()
    if fence is None:
      match = re.match(r'(`{3,}|~{3,})', stripped)
      if match:
        fence, block, start = match.group(1), [], number + 1
      else:
        prose.append((number, line))
    elif stripped.startswith(fence) and not stripped[len(fence):].strip():
      blocks.append((start, block))
      fence = None
    else:
      block.append(line)
  if fence is not None:
    blocks.append((start, block))
  return prose, blocks


def _paragraphs(prose):
  """Runs of consecutive non-blank prose lines: (first line number, text)."""
  out, current, first = [], [], 0
  for number, line in prose + [(0, '')]:
    if line.strip():
      if not current:
        first = number
      current.append(line)
    elif current:
      out.append((first, '\n'.join(current)))
      current = []
  return out


_CODE_SPAN = re.compile(r'(`+)(.+?)(?<!`)\1(?!`)', re.S)


def _code_spans(first, paragraph):
  """(line number, text) of a paragraph's inline code spans, whitespace
  collapsed; `first` is the paragraph's first line number."""
  return [(first + paragraph.count('\n', 0, m.start()),
           ' '.join(m.group(2).split()))
          for m in _CODE_SPAN.finditer(paragraph)]


def _without_code_spans(paragraph):
  return _CODE_SPAN.sub(lambda m: ' ' * len(m.group(0)), paragraph)


def _code_lines(start, block):
  """(line number, line) of a code block starting at line `start`, lines
  ending in a backslash joined with the next."""
  lines, current, first = [], '', start
  for number, line in enumerate(block, start):
    if not current:
      first = number
    if line.rstrip().endswith('\\'):
      current += line.rstrip()[:-1] + ' '
    else:
      lines.append((first, current + line))
      current = ''
  if current:
    lines.append((first, current))
  return lines


def _code_pieces(text):
  """(line number, code) of every code line (continuations joined) and
  inline code span of Markdown `text`."""
  prose, blocks = _split_fences(text)
  pieces = [piece for start, block in blocks
            for piece in _code_lines(start, block)]
  pieces += [piece for first, paragraph in _paragraphs(prose)
             for piece in _code_spans(first, paragraph)]
  return pieces


# ------------------------------------------------------------ links, anchors


def github_slug(heading):
  """The id GitHub gives a heading: rendered text, lower case, punctuation
  dropped (letters, digits, '_', '-' and spaces stay), spaces to '-'."""
  text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', heading)  # Links.
  text = re.sub(r'<[^>]+>', '', text)  # Inline HTML.
  text = text.strip().lower()
  text = re.sub(r'[^\w\- ]', '', text)
  return text.replace(' ', '-')


def anchors(text):
  """The heading ids of Markdown `text`, with GitHub's -1, -2 for repeats."""
  prose, _ = _split_fences(text)
  seen, out = {}, set()
  for _, line in prose:
    match = re.match(r' {0,3}(#{1,6})\s+(.*?)\s*#*\s*$', line)
    if not match:
      continue
    slug = github_slug(match.group(2))
    if slug in seen:
      seen[slug] += 1
      slug = f'{slug}-{seen[slug]}'
    else:
      seen[slug] = 0
    out.add(slug)
  return out


_LINK = re.compile(r'!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?'
                   r'\s*\)')


def links(text):
  """(line number, target) of every inline link and image outside code."""
  prose, _ = _split_fences(text)
  out = []
  for first, paragraph in _paragraphs(prose):
    plain = _without_code_spans(paragraph)
    for match in _LINK.finditer(plain):
      line = first + plain.count('\n', 0, match.start())
      out.append((line, match.group(1)))
  return out


def link_problems(path, text, read=_read):
  """Broken relative links of the Markdown file `path` with text `text`."""
  problems = []
  for line, target in links(text):
    if re.match(r'[a-z][a-z0-9+.-]*:', target, re.I):  # http:, mailto:, ...
      continue
    file_part, _, anchor = target.partition('#')
    where = f'{_rel(path)}:{line}: link {target!r}'
    if file_part:
      resolved = os.path.normpath(
          os.path.join(os.path.dirname(path), file_part))
      if not os.path.exists(resolved):
        problems.append(f'{where}: no file {_rel(resolved)}')
        continue
    else:
      resolved = path
    if anchor and resolved.endswith('.md'):
      if anchor not in anchors(read(resolved)):
        problems.append(
            f'{where}: {_rel(resolved)} has no heading with id {anchor!r}')
  return problems


# ------------------------------------------------------------ commands


def commands(text):
  """(line number, words) of every `python -m agent_tunix...` command.

  Words start at the module name and end before a shell operator or
  comment; in code blocks backslash continuations are joined first.
  """
  found = []
  for line, piece in _code_pieces(text):
    for match in re.finditer(r'python3? -m (agent_tunix[\w.]*)', piece):
      rest = piece[match.start(1):]
      try:
        words = shlex.split(rest, comments=True)
      except ValueError:  # An unclosed quote: the span stops mid-command.
        words = rest.split()
      end = next((i for i, w in enumerate(words) if w in _SHELL_ENDS
                  or w.startswith(('>', '2>'))), len(words))
      found.append((line, words[:end]))
  return found


def _module_file(module):
  """The file that `python -m module` runs, or None."""
  parts = module.split('.')
  path = os.path.join(_REPO, *parts)
  for candidate in (path + '.py', os.path.join(path, '__main__.py')):
    if os.path.isfile(candidate):
      return candidate
  return None


def _is_main_guard(node):
  return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
          and isinstance(node.test.left, ast.Name)
          and node.test.left.id == '__name__'
          and any(isinstance(c, ast.Constant) and c.value == '__main__'
                  for c in node.test.comparators))


@functools.lru_cache(maxsize=None)
def _tree(path):
  return ast.parse(_read(path), path)


def _module_or_package(module):
  """The file of agent_tunix module or package `module`, or None."""
  path = os.path.join(_REPO, *module.split('.'))
  for candidate in (path + '.py', os.path.join(path, '__init__.py')):
    if os.path.isfile(candidate):
      return candidate
  return None


def _imports(node, path):
  """(files, {local name: file}) of the agent_tunix modules an import
  statement loads, and the names it binds to modules."""
  files, bound = [], {}
  if isinstance(node, ast.Import):
    for alias in node.names:
      target = _module_or_package(alias.name)
      if alias.name.split('.')[0] == _PACKAGE and target:
        files.append(target)
        if alias.asname:
          bound[alias.asname] = target
  elif isinstance(node, ast.ImportFrom):
    module = node.module or ''
    if node.level:  # Relative: resolved against this file's package.
      package = os.path.relpath(os.path.dirname(path), _REPO).split(os.sep)
      package = package[:len(package) - node.level + 1]
      module = '.'.join(package + ([module] if module else []))
    if module.split('.')[0] != _PACKAGE:
      return files, bound
    for alias in node.names:
      target = _module_or_package(f'{module}.{alias.name}')
      if target:  # A module: bound to its name.
        bound[alias.asname or alias.name] = target
      else:  # A name from inside the module.
        target = _module_or_package(module)
      if target:
        files.append(target)
  return files, bound


def _define_name(call):
  """'name' of a `*.DEFINE_*('name', ...)` call, or None."""
  func = call.func
  if not (isinstance(func, ast.Attribute) and func.attr.startswith('DEFINE')):
    return None
  if call.args and isinstance(call.args[0], ast.Constant):
    name = call.args[0].value
  else:
    name = next((k.value.value for k in call.keywords
                 if k.arg == 'name' and isinstance(k.value, ast.Constant)),
                None)
  if not isinstance(name, str):
    return None
  if func.attr in ('DEFINE_bool', 'DEFINE_boolean'):
    return (name, f'no{name}')
  return (name,)


def _executed_nodes(statements):
  """The nodes of `statements` that run when they run: function bodies are
  left out (they run when called; class bodies run)."""
  functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
  stack = [node for node in statements if not isinstance(node, functions)]
  while stack:
    node = stack.pop()
    yield node
    stack.extend(child for child in ast.iter_child_nodes(node)
                 if not isinstance(child, functions))


def _flags_run(path, statements, seen):
  """Flags defined when `statements` of the module `path` run.

  Follows calls to functions of the same module (`_define_flags()`) and of
  imported agent_tunix modules (`options.define_flags()`), and the
  module-level code of every agent_tunix module imported on the way.

  Args:
    path: the module's file.
    statements: the statements that run.
    seen: modules and functions already followed (updated).

  Returns:
    The set of flag names, `noNAME` included for booleans.
  """
  names = set()
  functions = {node.name: node for node in _tree(path).body
               if isinstance(node, ast.FunctionDef)}
  bound = {}
  for node in ast.walk(_tree(path)):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      bound.update(_imports(node, path)[1])
  for node in _executed_nodes(statements):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      for target in _imports(node, path)[0]:
        names |= _module_flags(target, seen)
    if not isinstance(node, ast.Call):
      continue
    names.update(_define_name(node) or ())
    func = node.func
    if isinstance(func, ast.Name) and func.id in functions:
      target, body = path, functions[func.id].body
    elif (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
          and func.value.id in bound):
      target = bound[func.value.id]
      body = next((n.body for n in _tree(target).body
                   if isinstance(n, ast.FunctionDef)
                   and n.name == func.attr), None)
    else:
      continue
    key = (target, ast.unparse(func))
    if body is not None and key not in seen:
      seen.add(key)
      names |= _flags_run(target, body, seen)
  return names


def _package_init(path):
  """The __init__.py of the package that holds `path` (a module or a
  package's own __init__.py), or None at the top."""
  folder = os.path.dirname(path)
  if os.path.basename(path) == '__init__.py':
    folder = os.path.dirname(folder)
  init = os.path.join(folder, '__init__.py')
  return init if os.path.isfile(init) else None


def _module_flags(path, seen):
  """Flags defined by importing the module `path`: its packages' __init__
  code, then its own module-level code (not its __main__ block)."""
  if path in seen:
    return set()
  seen.add(path)
  names = set()
  init = _package_init(path)
  if init:
    names |= _module_flags(init, seen)
  body = [n for n in _tree(path).body if not _is_main_guard(n)]
  return names | _flags_run(path, body, seen)


@functools.lru_cache(maxsize=None)
def _absl_flags():
  """absl's own flags (logging, help, debugging) and their short names."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top,unused-import
  app.define_help_flags()
  names = {'flagfile', 'undefok'}
  by_module = flags.FLAGS.flags_by_module_dict()
  for module in ('absl.app', 'absl.logging', 'absl.flags'):
    for flag in by_module.get(module, []):
      names.add(flag.name)
      if flag.short_name:
        names.add(flag.short_name)
      if flag.boolean:
        names.add(f'no{flag.name}')
  return frozenset(names)


@functools.lru_cache(maxsize=None)
def command_flags(module):
  """The flags `python -m module` accepts (absl's included), or None when
  there is no such program."""
  path = _module_file(module)
  if path is None or not any(_is_main_guard(n) for n in _tree(path).body):
    return None
  seen = {path}
  init = _package_init(path)
  names = _module_flags(init, seen) if init else set()
  return frozenset(names | _flags_run(path, _tree(path).body, seen)
                   | _absl_flags())


@functools.lru_cache(maxsize=None)
def _base_config():
  return base.get_config()


def is_config_field(dotted):
  """Whether `a.b` names a field of agent_tunix/configs/base.py's get_config()."""
  node = _base_config()
  for part in dotted.split('.'):
    if not hasattr(node, 'keys') or part not in node.keys():
      return False
    node = node[part]
  return not hasattr(node, 'keys')


def _has_placeholder(value):
  return any(c in value for c in '<>$*{}') or value in ('...', '')


def command_problems(path, text):
  """What is wrong with the `python -m agent_tunix...` commands of a file."""
  problems = []
  for line, words in commands(text):
    module = words[0]
    where = f'{_rel(path)}:{line}: `python -m {" ".join(words)}`'
    known = command_flags(module)
    if known is None:
      problems.append(f'{where}: no program {module} (no '
                      f'{module.replace(".", "/")}.py or __main__.py with an '
                      "`if __name__ == '__main__':` block)")
      continue
    for word in words[1:]:
      if word == '--':
        break
      if not word.startswith('-') or word == '-':
        continue
      name, _, value = word.lstrip('-').partition('=')
      if name.startswith('config.') and 'config' in known:
        field = name[len('config.'):]
        if field not in _PLACEHOLDER_FIELDS and not is_config_field(field):
          problems.append(f'{where}: --{name} is not a field of '
                          'agent_tunix/configs/base.py')
      elif name not in known:
        problems.append(f'{where}: {module} defines no flag --{name}')
      elif name == 'config' and value and not _has_placeholder(value):
        config_file = value.split(':', 1)[0]
        # A preset goes by name too (agent_tunix/cli.py).
        preset = os.path.join('agent_tunix', 'configs', f'{config_file}.py')
        if not any(os.path.isfile(os.path.join(_REPO, f))
                   for f in (config_file, preset)):
          problems.append(f'{where}: no config file {config_file}')
  return problems


def config_override_problems(path, text):
  """`--config.a.b` anywhere in the code of a file that is not a field."""
  problems = []
  for line, piece in _code_pieces(text):
    for match in re.finditer(r'--config\.([\w.*]+)', piece):
      field = match.group(1).rstrip('.')
      if field in _PLACEHOLDER_FIELDS or is_config_field(field):
        continue
      problems.append(f'{_rel(path)}:{line}: --config.{field} is not a field '
                      f'of agent_tunix/configs/base.py (nor a placeholder: '
                      f'{sorted(_PLACEHOLDER_FIELDS)})')
  return problems


_REPO_PATH = re.compile(
    r'^(?:agent_tunix|configs|docs|launch|tests)(?:/[\w.-]+)*/?$')


def path_problems(path, text):
  """Repository paths quoted as code in a file that do not exist."""
  problems = []
  for line, piece in _code_pieces(text):
    if _REPO_PATH.match(piece) and not os.path.exists(
        os.path.join(_REPO, piece)):
      problems.append(f'{_rel(path)}:{line}: no file or folder {piece}')
  return problems


# ------------------------------------------------------------ tests


@pytest.fixture(scope='module', name='docs')
def _docs():
  return [(path, _read(path)) for path in _doc_files()]


def test_the_docs_are_there(docs):
  names = {_rel(path) for path, _ in docs}
  assert 'README.md' in names
  assert os.path.join('docs', 'configuration.md') in names
  assert len(names) > 2, names


def test_relative_links_resolve(docs):
  problems = [p for path, text in docs for p in link_problems(path, text)]
  assert not problems, '\n'.join(problems)


def test_quoted_commands_name_real_programs_and_flags(docs):
  found = [c for _, text in docs for c in commands(text)]
  assert len(found) > 20, found  # The parser still sees the commands.
  problems = [p for path, text in docs for p in command_problems(path, text)]
  assert not problems, '\n'.join(problems)


def test_config_overrides_name_real_fields(docs):
  problems = [p for path, text in docs
              for p in config_override_problems(path, text)]
  assert not problems, '\n'.join(problems)


def test_quoted_repository_paths_exist(docs):
  if 'TEST_SRCDIR' in os.environ:
    pytest.skip('under `bazel test` the runfiles hold only the declared '
                'files; the paths are checked in the source tree.')
  problems = [p for path, text in docs for p in path_problems(path, text)]
  assert not problems, '\n'.join(problems)


# The front page stays a front page: what it is, requirements, set-up and
# the quick start near the top; run histories and grids live in docs/.
_README_MAX_CHARS = 12000
_QUICK_START_BY_LINE = 80


def test_readme_is_a_front_page():
  text = _read(os.path.join(_REPO, 'README.md'))
  assert len(text) <= _README_MAX_CHARS, (
      f'README.md has {len(text)} characters, more than '
      f'{_README_MAX_CHARS}: move detail to a page in docs/ and link it.')
  headings = [number for number, line in _split_fences(text)[0]
              if re.match(r'#{1,6}\s+Quick start\s*$', line)]
  assert headings and headings[0] <= _QUICK_START_BY_LINE, (
      f'README.md: the "Quick start" heading is at line {headings}, not '
      f'within the first {_QUICK_START_BY_LINE}.')
  targets = {target.partition('#')[0] for _, target in links(text)}
  for page in ('docs/data.md', 'docs/serving.md', 'docs/results.md',
               'docs/configuration.md'):
    assert page in targets, f'README.md does not link {page}.'


def test_readme_names_every_preset():
  text = ' '.join(_read(os.path.join(_REPO, 'README.md')).split())
  presets = sorted(name for name in os.listdir(os.path.join(_REPO, 'configs'))
                   if name.endswith('.py') and name != '__init__.py')
  missing = [p for p in presets if f'`configs/{p}`' not in text]
  assert not missing, f'README.md does not name the presets {missing}.'


def test_command_flags_are_read_from_the_source():
  main = command_flags('agent_tunix.main')
  # Its own, the one run/errors.py defines on import, config_flags', absl's.
  for name in ('workdir', 'print_config', 'multihost', 'traceback', 'config',
               'helpfull', 'verbosity', 'v', 'notraceback'):
    assert name in main, name
  # Defined in functions that run only when the module is the program.
  assert {'topology', 'keep_going', 'summarize'} <= command_flags(
      'agent_tunix.preflight')
  assert {'quick', 'skip', 'preflight_topology'} <= command_flags(
      'agent_tunix.bench')
  assert {'format', 'gguf_dtype'} <= command_flags('agent_tunix.export')
  # generate imports export, whose flags are defined only when export runs.
  assert 'gguf_dtype' not in command_flags('agent_tunix.generate')
  assert command_flags('agent_tunix.rl.grpo') is None  # Not a program.
  assert command_flags('agent_tunix.nothing') is None


def test_slugs_follow_github():
  assert github_slug('Will it fit? Compile for the TPU first (preflight)') == (
      'will-it-fit-compile-for-the-tpu-first-preflight')
  assert github_slug('Alarms, and Weights & Biases') == (
      'alarms-and-weights--biases')
  assert github_slug('`model.remat` and [remat](x.md)') == (
      'modelremat-and-remat')
  assert anchors('# A\n## A\n```\n# not a heading\n```\n') == {'a', 'a-1'}


def test_a_broken_link_is_found(tmp_path):
  page = tmp_path / 'page.md'
  (tmp_path / 'other.md').write_text('# Other\n\n## Real part\n')
  page.write_text(
      '# Page\n\nSee [other](other.md#real-part), [here](#page) and\n'
      '[gone](missing.md), [bad](other.md#no-such-part), [self](#nope).\n'
      '`[not a link](missing.md)` and [web](https://example.com/x).\n'
      '```\n[in code](missing.md)\n```\n')
  problems = link_problems(str(page), page.read_text())
  assert len(problems) == 3, problems
  assert "'missing.md'" in problems[0] and 'page.md:4' in problems[0]
  assert 'no-such-part' in problems[1]
  assert "'#nope'" in problems[2]


def test_a_bad_module_or_flag_is_found():
  text = (
      '```sh\n'
      'python -m agent_tunix.main --config=configs/tiny.py \\\n'
      '    --workdir=/tmp/x --no_such_flag=1  # --comment_flag\n'
      'python -m agent_tunix.trainer --config=configs/tiny.py\n'
      'python -m agent_tunix.evaluate --config=configs/nope.py \\\n'
      '    --config.grpo.num_generationz=8 --config.grpo.beta=0 && ls --all\n'
      '```\n'
      'Run `python -m agent_tunix.sweep --workdir=W\n'
      '--sweep=grpo.beta=0,1 --print_pointz`.\n'
  )
  problems = command_problems('x.md', text)
  assert len(problems) == 5, '\n'.join(problems)
  assert '--no_such_flag' in problems[0]
  assert 'no program agent_tunix.trainer' in problems[1]
  assert 'no config file configs/nope.py' in problems[2]
  assert 'num_generationz' in problems[3]
  assert '--print_pointz' in problems[4]
  assert not command_problems('x.md', (
      '`python -m agent_tunix.preflight --config=configs/<preset>.py '
      '--topology=<slice>`'))


def test_a_preset_by_name_is_a_config_and_a_wrong_name_is_found():
  problems = command_problems('x.md', (
      '```sh\n'
      'python -m agent_tunix.main --config=gemma3_270m:quick --workdir=W\n'
      'python -m agent_tunix.main --config=gemma3_270n:quick --workdir=W\n'
      '```\n'))
  assert len(problems) == 1, problems
  assert 'no config file gemma3_270n' in problems[0]


def test_a_stale_path_is_found():
  text = ('`agent_tunix/rl/objectives.py`, `agent_tunix/objectives.py`, '
          '`configs/<preset>.py`, `launch/`, `agent_tunix.rl`\n')
  problems = path_problems('x.md', text)
  assert len(problems) == 1, problems
  assert 'agent_tunix/objectives.py' in problems[0]


def test_a_bad_config_override_is_found():
  text = ('`--config.grpo.num_generations=8`, `--config.x=y`, '
          '`--config.*`, `--config.grpo.nope=1`\n\n'
          '```sh\nbash launch/run.sh --config.training.num_stepz=2\n```\n')
  problems = config_override_problems('x.md', text)
  assert len(problems) == 2, problems
  assert 'grpo.nope' in problems[1] and 'num_stepz' in problems[0]
