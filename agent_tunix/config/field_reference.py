r"""Generates docs/configuration.md, the reference of every config field.

  python -m agent_tunix.config.field_reference        # print the page
  python -m agent_tunix.config.field_reference \
      --output=docs/configuration.md                  # write it

A field's description is the comment block written directly above its
`config.section.field = ...` line in agent_tunix/configs/base.py (in its
section's `_add_<section>(config)` function); a field assigned on the
line right after another one, with no comment of its own, shares that field's
description (as the AdamW betas do). A comment line `# -- Title` standing
alone (a blank line below it) starts a group of fields within a section:
the page gives it a `### Title` heading and a table of its own. The default
is the value that `base.get_config()` returns. tests/config_test.py checks that
docs/configuration.md is exactly what this module renders.
"""

import ast
import inspect
import io
import re
import tokenize

from absl import app
from absl import flags

from agent_tunix import cli
from agent_tunix.configs import base


HEADING = '# Configuration'
# Where the page lives, from the repository root.
PAGE = 'docs/configuration.md'

_OUTPUT = flags.DEFINE_string(
    'output', None,
    f'Write the page to this file (the repository keeps it at {PAGE}) '
    'instead of printing it.',
)

_INTRO = """\
Every field of `agent_tunix/configs/base.py` with its default there; the
presets beside it change some of them. Override a field on the command line
(`--config.grpo.num_generations=8`) or after the config file
(`--config=configs/gemma3_270m.py:model.lora_rank=8,quick`). The config is
locked, so a misspelled field name is an error.

This page is generated from the comments in `agent_tunix/configs/base.py`;
edit those and regenerate it with

```sh
python -m agent_tunix.config.field_reference --output=docs/configuration.md
```"""


def _field_name(target):
  """'section.field' for an assignment target `config.section.field`."""
  parts = []
  node = target
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if isinstance(node, ast.Name) and node.id == 'config' and len(parts) == 2:
    return '.'.join(reversed(parts))
  return None


def _section_statements(source):
  """The statements of base.py's `_add_<section>(config)` functions, in order."""
  for node in ast.parse(source).body:
    if isinstance(node, ast.FunctionDef) and node.name.startswith('_add_'):
      yield from node.body


def field_comments(source):
  """{'section.field': description} in the order fields appear in `source`.

  Args:
    source: the text of agent_tunix/configs/base.py.

  Returns:
    An ordered dict from dotted field name to its comment text (comment lines
    joined by spaces, '#' removed).

  Raises:
    ValueError: a field without a comment above it (or above the field
      assigned on the line before it).
  """
  lines = source.splitlines()
  comment_lines = {
      tok.start[0]: tok.string[1:].strip()
      for tok in tokenize.generate_tokens(io.StringIO(source).readline)
      if tok.type == tokenize.COMMENT
      and lines[tok.start[0] - 1].lstrip().startswith('#')
  }
  fields = {}
  previous_name, previous_end = None, -1
  for node in _section_statements(source):
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
      continue
    name = _field_name(node.targets[0])
    if name is None:
      previous_name = None
      continue
    block = []
    line = node.lineno - 1
    while line in comment_lines:
      block.insert(0, comment_lines[line])
      line -= 1
    if block:
      fields[name] = ' '.join(block)
    elif previous_name and previous_end == node.lineno - 1:
      fields[name] = fields[previous_name]
    else:
      raise ValueError(
          f'agent_tunix/configs/base.py line {node.lineno}: config.{name} has no comment '
          'above it. Add one line saying what the field does.'
      )
    previous_name, previous_end = name, node.end_lineno
  return fields


_GROUP = re.compile(r'--\s+(\S.*)')


def field_groups(source):
  """{'section.field': title} for the first field after each `# -- Title`.

  Args:
    source: the text of agent_tunix/configs/base.py.
  """
  titles = {}
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT:
      match = _GROUP.fullmatch(tok.string[1:].strip())
      if match:
        titles[tok.start[0]] = match.group(1)
  groups, pending = {}, None
  for node in _section_statements(source):
    while titles and min(titles) < node.lineno:
      pending = titles.pop(min(titles))
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
      continue
    name = _field_name(node.targets[0])
    if name is not None and pending is not None:
      groups[name] = pending
      pending = None
  return groups


_TABLE_HEAD = ['| Field | Default | Description |', '| --- | --- | --- |']


def _cell(text):
  return text.replace('|', r'\|')


def render_markdown():
  """The whole page (Markdown, ending with a newline)."""
  source = inspect.getsource(base)
  comments = field_comments(source)
  groups = field_groups(source)
  config = base.get_config()
  documented = set(comments)
  actual = {
      f'{section}.{field}'
      for section, fields in config.items() for field in fields.keys()
  }
  if documented != actual:
    raise ValueError(
        'agent_tunix/configs/base.py: fields set outside the plain '
        '`config.section.field = value` form cannot be documented: '
        f'{sorted(actual ^ documented)}.'
    )
  out = [HEADING, '', _INTRO]
  section = None
  for name, comment in comments.items():
    head, field = name.split('.')
    if head != section:
      section = head
      out += ['', f'## {section}']
      if name not in groups:
        out += [''] + _TABLE_HEAD
    if name in groups:
      out += ['', f'### {groups[name]}', ''] + _TABLE_HEAD
    default = repr(config[head][field])
    out.append(f'| `{name}` | `{_cell(default)}` | {_cell(comment)} |')
  return '\n'.join(out) + '\n'


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  page = render_markdown()
  if not _OUTPUT.value:
    print(page, end='')
    return
  with open(_OUTPUT.value, 'w') as f:
    f.write(page)


if __name__ == '__main__':
  cli.run(main)
