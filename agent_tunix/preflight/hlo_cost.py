"""Where a compiled program's flops and bytes go, read from its optimized HLO.

XLA's `cost_analysis()` gives one total per program and counts a loop body
once. `count(hlo_text)` walks the optimized HLO instead: every instruction
the program runs, a while loop's body and condition times its trip count
(the compiler's `known_trip_count`; a loop without one, such as the decode
loop that ends when every row has ended, counts `unknown_trips` times and
is named in `Count.unknown_loops`), a conditional's largest branch, a call's
callee. Each instruction is charged the bytes it moves between HBM and the
chip, as XLA's own count charges them: its operands read and its result
written, where

  * a fusion reads of a parameter only what its slices, dynamic slices or
    gathers read of it, and
  * a fusion (or instruction) whose result is a dynamic-update-slice of its
    parameter (a buffer updated in place, the KV cache) writes only the
    update and does not read the buffer;

and the flops of its dots and convolutions (2 x output x contraction) plus
one per element of its other arithmetic. Instructions are grouped by what
caused them (`category`, from the op names the trainer's code leaves in the
HLO metadata). Imports nothing of the project.
"""

import collections
import dataclasses
import math
import re

_BITS = {
    'pred': 8, 's2': 2, 's4': 4, 's8': 8, 's16': 16, 's32': 32, 's64': 64,
    'u2': 2, 'u4': 4, 'u8': 8, 'u16': 16, 'u32': 32, 'u64': 64,
    'f8e4m3fn': 8, 'f8e5m2': 8, 'f8e4m3b11fnuz': 8, 'f8e4m3fnuz': 8,
    'f8e5m2fnuz': 8, 'f8e4m3': 8, 'f8e3m4': 8, 'f4e2m1fn': 4, 'f8e8m0fnu': 8,
    'bf16': 16, 'f16': 16, 'f32': 32, 'f64': 64, 'c64': 64, 'c128': 128,
    'token': 0,
}
_ARRAY = re.compile(r'\b(' + '|'.join(sorted(_BITS, key=len, reverse=True))
                    + r')\[([\d,]*)\]')
_LAYOUT = re.compile(r'\{[^{}]*(?:\([^()]*\)[^{}]*)*\}')
_SPACE = re.compile(r'S\((\d+)\)')
_HEADER = re.compile(r'^(ENTRY\s+)?%([\w.\-]+)\s*\((.*)\)\s*->\s*(.*)\{\s*$')
_NAME = re.compile(r'%([\w.\-]+)')
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_DIMS = re.compile(r'(lhs_contracting_dims|lhs_batch_dims)=\{([\d,]*)\}')

# Instructions that move nothing: views, tuples, constants and markers.
_FREE = frozenset((
    'parameter', 'constant', 'get-tuple-element', 'tuple', 'bitcast',
    'after-all', 'partition-id', 'replica-id', 'opt-barrier',
    'optimization-barrier', 'iota', 'add-dependency', 'domain',
))
# Ops through which a fused parameter still reads only what its consumer
# reads of it.
_VIEWS = frozenset(('bitcast', 'reshape', 'broadcast'))
_SLICES = frozenset(('slice', 'dynamic-slice', 'gather'))
# Fused ops that are not arithmetic (no flop per element).
_NO_FLOPS = _FREE | _VIEWS | _SLICES | frozenset((
    'copy', 'transpose', 'concatenate', 'pad', 'dynamic-update-slice',
    'select', 'convert', 'reverse', 'scatter', 'sort',
))
_COLLECTIVES = ('all-gather', 'all-reduce', 'reduce-scatter', 'all-to-all',
                'collective-permute', 'ragged-all-to-all')

# The trainer's op names -> what caused the bytes (first match wins).
CATEGORIES = (
    ('KV-cache update', re.compile(r'cache|dynamic_update_slice')),
    ('optimizer', re.compile(r'optimizer|adam|opt_state|optax|scale_by')),
    ('logits', re.compile(r'embedder_decode|embedder\.decode|logits|'
                          r'log_softmax|logsumexp|vocab|take_along_axis|'
                          r'sample|top_k|top_p|argmax|categorical')),
    ('embedding', re.compile(r'embedder|embed')),
    ('attention', re.compile(r'attn|attention|einsum|rope|query|key|value|'
                             r'softmax|_norm')),
    ('mlp', re.compile(r'mlp|ffw|gating|linear|feed_forward')),
    ('layer', re.compile(r'layer|block')),
)


@dataclasses.dataclass
class Instruction:
  name: str
  opcode: str
  shape: str  # the result's type, as printed
  operands: list
  attrs: str
  is_root: bool = False
  args: str = ''  # the text between the parentheses (a constant's value)

  @property
  def op_name(self):
    m = _OP_NAME.search(self.attrs)
    return m.group(1) if m else ''

  def called(self, key):
    """The computations named by attribute `key` (calls=, body=, ...)."""
    m = re.search(key + r'=(\{[^}]*\}|%[\w.\-]+)', self.attrs)
    return _NAME.findall(m.group(1)) if m else []


@dataclasses.dataclass
class Computation:
  name: str
  params: dict  # name -> type
  instructions: list
  entry: bool = False

  def __post_init__(self):
    self.types = dict(self.params)
    self.by_name = {}
    for inst in self.instructions:
      self.types[inst.name] = inst.shape
      self.by_name[inst.name] = inst
    self.root = next((i for i in self.instructions if i.is_root),
                     self.instructions[-1] if self.instructions else None)


def array_bytes(type_text, hbm_only=True):
  """HBM bytes of the arrays in a printed HLO type (a tuple sums them).

  An array whose layout puts it in another memory space (`S(1)`: the
  chip's on-chip memory, where the compiler prefetches buffers; `S(2)`,
  its scalar memory) is not in HBM and counts 0.
  """
  total = 0
  for m in _ARRAY.finditer(type_text):
    dtype, dims = m.groups()
    layout = _LAYOUT.match(type_text, m.end())
    space = _SPACE.search(layout.group(0)) if layout else None
    if hbm_only and space and space.group(1) != '0':
      continue
    total += _elements(dims) * _BITS[dtype] // 8
  return total


def _elements(dims):
  return math.prod(int(d) for d in dims.split(',') if d) if dims else 1


def _dims(type_text):
  m = _ARRAY.search(type_text)
  return [int(d) for d in m.group(2).split(',') if d] if m else []


def _split_top(text):
  """(inside, rest) of text that starts with a bracket, at its match."""
  depth = 0
  for i, ch in enumerate(text):
    if ch in '({[':
      depth += 1
    elif ch in ')}]':
      depth -= 1
      if depth == 0:
        return text[1:i], text[i + 1:]
  raise ValueError(f'unbalanced HLO text: {text[:80]!r}')


def _parse_instruction(line):
  text = line.strip()
  is_root = text.startswith('ROOT ')
  if is_root:
    text = text[5:]
  name, _, rest = text.partition(' = ')
  rest = rest.strip()
  if rest.startswith('('):
    inside, rest = _split_top(rest)
    shape = '(' + inside + ')'
  else:
    shape, _, rest = rest.partition(' ')
  rest = rest.strip()
  opcode, _, rest = rest.partition('(')
  operands_text, attrs = _split_top('(' + rest)
  return Instruction(name.lstrip('%'), opcode.strip(), shape,
                     _NAME.findall(operands_text), attrs, is_root,
                     operands_text.strip())


def _parse_params(text):
  params = {}
  for part in re.split(r',\s*(?=[\w.\-]+:\s)', text):
    if ':' in part:
      key, _, value = part.partition(':')
      params[key.strip().lstrip('%')] = value.strip()
  return params


def parse(hlo_text):
  """{computation name: Computation} of an optimized HLO module's text."""
  computations, current = {}, None
  for line in hlo_text.splitlines():
    if current is None:
      m = _HEADER.match(line)
      if m:
        current = (m.group(2), _parse_params(m.group(3)), [], bool(m.group(1)))
      continue
    if line.startswith('}'):
      name, params, insts, entry = current
      computations[name] = Computation(name, params, insts, entry)
      current = None
    elif ' = ' in line:
      current[2].append(_parse_instruction(line))
  return computations


@dataclasses.dataclass
class Cost:
  """One instruction's (or category's) figures, loop trips included."""
  name: str
  opcode: str
  category: str
  op_name: str
  bytes: float = 0.0
  flops: float = 0.0
  trips: float = 1.0  # times it runs per call of the program
  # Inside a loop without a known trip count (charged unknown_trips times).
  in_open_loop: bool = False


@dataclasses.dataclass
class Count:
  """A program's figures from its HLO (`count`)."""
  flops: float
  bytes: float
  costs: list  # [Cost], one per instruction that moves or computes
  unknown_loops: list  # names of while loops without a known trip count
  custom_calls: list  # custom-call targets (kernels XLA cannot see into)

  def by_category(self):
    totals = collections.defaultdict(lambda: [0.0, 0.0])
    for c in self.costs:
      totals[c.category][0] += c.bytes
      totals[c.category][1] += c.flops
    return {k: {'bytes': b, 'flops': f} for k, (b, f) in
            sorted(totals.items(), key=lambda kv: -kv[1][0])}

  def top(self, n=12):
    return sorted(self.costs, key=lambda c: -c.bytes)[:n]

  def breakdown(self, n=12):
    """The report's `breakdown` entry: categories and the top ops."""
    return {
        'hlo_bytes': self.bytes,
        'hlo_flops': self.flops,
        'categories': self.by_category(),
        'top': [dataclasses.asdict(c) for c in self.top(n)],
        'unknown_trip_loops': self.unknown_loops,
        'custom_calls': self.custom_calls,
    }


def category(op_name, opcode):
  """What caused an instruction, from its opcode and op name."""
  if opcode.startswith('all-gather'):
    return 'weight gather'
  if opcode.startswith(_COLLECTIVES):
    return 'collective'
  if opcode in ('copy', 'copy-start', 'copy-done', 'transpose'):
    return 'copy'
  low = op_name.lower()
  for name, pattern in CATEGORIES:
    if pattern.search(low):
      return name
  return 'other'


def _users(comp):
  users = collections.defaultdict(list)
  for inst in comp.instructions:
    for op in inst.operands:
      users[op].append(inst)
  return users


def _read_bytes(comp, users, name, full, computations):
  """Bytes a fused computation reads of value `name` (of `full` bytes)."""
  consumers = users.get(name, [])
  if not consumers:
    return 0
  total = 0
  for inst in consumers:
    if inst is comp.root and inst.opcode == 'tuple':
      continue  # Passed through to the result: not read.
    if inst.opcode in _SLICES and inst.operands[0] == name:
      total += array_bytes(inst.shape)
    elif inst.opcode == 'dynamic-update-slice' and inst.operands[0] == name:
      continue  # Updated in place: not read.
    elif inst.opcode in _VIEWS:
      total += _read_bytes(comp, users, inst.name, full, computations)
    elif inst.opcode == 'fusion' and inst.called('calls')[0] in computations:
      # A fusion nested in this one: what it reads of its parameter.
      inner = computations[inst.called('calls')[0]]
      inner_users, params = _users(inner), list(inner.params)
      for j, op in enumerate(inst.operands):
        if op != name or j >= len(params):
          continue
        if _viewed_as_root(inner, inner_users, params[j]):
          # It passes through as the nested fusion's result: read by
          # whatever reads that.
          total += _read_bytes(comp, users, inst.name, full, computations)
        else:
          total += _read_bytes(inner, inner_users, params[j], full,
                               computations)
    else:
      return full
  return min(total, full)


def _viewed_as_root(comp, users, name):
  """True when value `name` of `comp` is its root through views alone."""
  while True:
    if comp.root is not None and comp.root.name == name:
      return True
    views = [u for u in users.get(name, []) if u.opcode in _VIEWS]
    if len(views) != 1 or len(users.get(name, [])) != 1:
      return False
    name = views[0].name


def _in_place_update(comp, inst):
  """Bytes written by `inst` when it is a dynamic-update-slice (through
  views) of a parameter of `comp`; None otherwise."""
  while inst.opcode in _VIEWS:
    inst = comp.by_name.get(inst.operands[0])
    if inst is None:
      return None
  if inst.opcode != 'dynamic-update-slice':
    return None
  return _update_written(comp.types, inst)


def _update_written(types, inst):
  """HBM bytes a dynamic-update-slice writes: its update, when the buffer
  it updates is in HBM."""
  if not array_bytes(inst.shape):
    return 0
  return array_bytes(types.get(inst.operands[1], ''), hbm_only=False)


def trips_from_condition(cond):
  """N for a loop condition `i < N` on a constant N (the compiler's own
  windowed loops print no known_trip_count); None otherwise."""
  root = cond.root
  if (root is None or root.opcode != 'compare' or 'direction=LT' not in
      root.attrs or len(root.operands) != 2):
    return None
  bound = cond.by_name.get(root.operands[1])
  if bound is None or bound.opcode != 'constant' or not bound.args.isdigit():
    return None
  return int(bound.args)


def _fusion_bytes(inst, fused, outer_types, channels, computations):
  users = _users(fused)
  params = list(fused.params)
  read = 0
  for i, op in enumerate(inst.operands):
    full = array_bytes(outer_types.get(op, ''))
    read += (_read_bytes(fused, users, params[i], full, computations)
             if i < len(params) else full)
  root = fused.root
  parts = ([fused.by_name.get(o) or _Param(o) for o in root.operands]
           if root.opcode == 'tuple' else [root])
  written = 0
  for part in parts:
    if part.opcode == 'parameter' or part.opcode.startswith(_COLLECTIVES):
      continue  # A buffer passed through, or a collective (below).
    update = _in_place_update(fused, part)
    written += array_bytes(part.shape) if update is None else update
  # A collective inside a fusion (the compiler's async collective fusions)
  # writes its result; one collective is split over several such fusions
  # with one channel id, and is counted once.
  for inner in fused.instructions:
    if inner.opcode.startswith(_COLLECTIVES):
      channel = re.search(r'channel_id=(\d+)', inner.attrs)
      if channel and channel.group(1) in channels:
        continue
      if channel:
        channels.add(channel.group(1))
      written += array_bytes(inner.shape)
  return read + written


class _Param:
  """A fused computation's parameter as a root tuple's part."""
  opcode = 'parameter'

  def __init__(self, name):
    self.name = name


def _dot_flops(inst, types):
  out = math.prod(_dims(inst.shape) or [1])
  lhs = _dims(types.get(inst.operands[0], ''))
  contracting = dict(_DIMS.findall(inst.attrs)).get('lhs_contracting_dims', '')
  k = math.prod(lhs[int(d)] for d in contracting.split(',') if d) or 1
  return 2.0 * out * k


def _window(attrs):
  """[(size, pad_lo, pad_hi, stride, lhs_dilation, rhs_dilation)] per
  spatial dimension of a convolution's window attribute."""
  m = re.search(r'window=\{([^}]*)\}', attrs)
  fields = dict(re.findall(r'(\w+)=([\w\-x]+)', m.group(1))) if m else {}
  sizes = [int(v) for v in fields.get('size', '').split('x') if v]
  n = len(sizes)

  def ints(key, default):
    return ([int(v) for v in fields[key].split('x')] if key in fields
            else [default] * n)

  pads = ([tuple(int(v) for v in p.split('_')) for p in
           fields['pad'].split('x')] if 'pad' in fields else [(0, 0)] * n)
  return list(zip(sizes, [p[0] for p in pads], [p[1] for p in pads],
                  ints('stride', 1), ints('lhs_dilate', 1),
                  ints('rhs_dilate', 1)))


def _valid_taps(size_in, size_out, window):
  """(output position, window tap) pairs of one spatial dimension that
  land on an input element (not padding or a dilation hole)."""
  size, lo, _, stride, lhs_dil, rhs_dil = window
  extent = (size_in - 1) * lhs_dil  # last input position, dilated
  if lhs_dil > 1:  # Holes between inputs: count the pairs one by one.
    return sum(0 <= p <= extent and p % lhs_dil == 0
               for w in range(size) for o in range(size_out)
               for p in (o * stride + w * rhs_dil - lo,))
  total = 0
  for w in range(size):  # The outputs whose tap w lands on input.
    first = max(0, -(-(lo - w * rhs_dil) // stride))
    last = min(size_out - 1, (extent + lo - w * rhs_dil) // stride)
    total += max(0, last - first + 1)
  return total


def _conv_flops(inst, types):
  """2 x the multiply-adds of a convolution, counting only the window taps
  that land on input (the TPU compiler writes many dots as convolutions
  whose windows mostly overhang padding)."""
  out = _dims(inst.shape)
  lhs = _dims(types.get(inst.operands[0], ''))
  rhs = _dims(types.get(inst.operands[1], ''))
  labels = re.search(r'dim_labels=(\w+)_(\w+)->(\w+)', inst.attrs)
  if not (out and lhs and rhs and labels):
    return 2.0 * math.prod(out or [1])
  lhs_l, rhs_l, out_l = labels.groups()
  macs = math.prod(out) * rhs[rhs_l.index('i')]
  for d, window in enumerate(_window(inst.attrs)):
    o = out[out_l.index(str(d))]
    taps = _valid_taps(lhs[lhs_l.index(str(d))], o, window)
    macs = macs / o * taps
  return 2.0 * macs


def _flops(comp, computations):
  """Flops of the instructions of a fused (or applied) computation."""
  total = 0.0
  for inst in comp.instructions:
    if inst.opcode == 'dot':
      total += _dot_flops(inst, comp.types)
    elif inst.opcode == 'convolution':
      total += _conv_flops(inst, comp.types)
    elif inst.opcode == 'fusion':
      total += sum(_flops(computations[c], computations)
                   for c in inst.called('calls') if c in computations)
    elif inst.opcode not in _NO_FLOPS:
      total += math.prod(_dims(inst.shape) or [1])
  return total


class _Counter:

  def __init__(self, computations, unknown_trips):
    self.computations = computations
    self.unknown_trips = unknown_trips
    self.costs = []
    self.unknown_loops = []
    self.custom_calls = []
    self.channels = set()

  def run(self, comp, trips, open_loop=False):
    """Charges every instruction of `comp`, run `trips` times."""
    for inst in comp.instructions:
      self.instruction(comp, inst, trips, open_loop)

  def instruction(self, comp, inst, trips, open_loop):
    op = inst.opcode
    if op in _FREE:
      return
    if op == 'while':
      m = _TRIPS.search(inst.attrs)
      cond = self.computations[inst.called('condition')[0]]
      n = int(m.group(1)) if m else trips_from_condition(cond)
      inner_open = open_loop or n is None
      if n is None:
        n = self.unknown_trips
        self.unknown_loops.append(inst.name)
      for key in ('condition', 'body'):
        for name in inst.called(key):
          self.run(self.computations[name], trips * n, inner_open)
      return
    if op == 'call' or op == 'async-start':
      for name in inst.called('calls') + inst.called('to_apply'):
        self.run(self.computations[name], trips, open_loop)
      return
    if op == 'conditional':
      self._conditional(inst, trips, open_loop)
      return
    cost = Cost(inst.name, op, category(inst.op_name, op), inst.op_name,
                trips=trips, in_open_loop=open_loop)
    cost.bytes, cost.flops = self._own(comp, inst)
    cost.bytes *= trips
    cost.flops *= trips
    if cost.bytes or cost.flops:
      self.costs.append(cost)

  def _conditional(self, inst, trips, open_loop):
    branches = (inst.called('branch_computations') or
                inst.called('true_computation') +
                inst.called('false_computation'))
    best = None
    for name in branches:
      before = len(self.costs)
      self.run(self.computations[name], trips, open_loop)
      taken = self.costs[before:]
      del self.costs[before:]
      if best is None or sum(c.bytes for c in taken) > sum(
          c.bytes for c in best):
        best = taken
    self.costs.extend(best or [])

  def _own(self, comp, inst):
    """(bytes, flops) of one run of a non-control instruction."""
    op = inst.opcode
    types = comp.types
    if op.endswith('-done'):  # The async op's result lands here.
      return array_bytes(inst.shape), 0.0
    reads = sum(array_bytes(types.get(o, '')) for o in inst.operands)
    if op in ('slice-start', 'dynamic-slice-start'):
      # ((operand), slice, sync flag): the slice is read, wherever it goes.
      arrays = list(_ARRAY.finditer(inst.shape))
      if reads and len(arrays) > 1:
        dtype, dims = arrays[1].groups()
        return _elements(dims) * _BITS[dtype] // 8, 0.0
      return 0, 0.0
    if op.endswith('-start'):
      return reads, 0.0
    if op == 'fusion':
      fused = [self.computations[c] for c in inst.called('calls')]
      if fused:
        return (_fusion_bytes(inst, fused[0], types, self.channels,
                              self.computations),
                _flops(fused[0], self.computations))
    if op == 'custom-call':
      target = re.search(r'custom_call_target="([^"]*)"', inst.attrs)
      self.custom_calls.append(target.group(1) if target else inst.name)
    if op == 'dynamic-update-slice':  # In place: the update read, written.
      return (array_bytes(types.get(inst.operands[1], ''))
              + _update_written(types, inst)), 0.0
    if op in _SLICES:
      return 2 * array_bytes(inst.shape), 0.0
    flops = 0.0
    if op == 'dot':
      flops = _dot_flops(inst, types)
    elif op == 'convolution':
      flops = _conv_flops(inst, types)
    elif op not in _NO_FLOPS and not op.startswith(_COLLECTIVES):
      flops = float(math.prod(_dims(inst.shape) or [1]))
    return reads + array_bytes(inst.shape), flops


def count(hlo_text, unknown_trips=1):
  """The program's `Count`: every instruction it runs, loops with trips.

  Args:
    hlo_text: the compiled program's optimized HLO (`compiled.as_text()`).
    unknown_trips: trips charged to a while loop whose trip count the
      compiler does not know (1: the figures are one trip's).
  """
  computations = parse(hlo_text)
  entry = next(c for c in computations.values() if c.entry)
  counter = _Counter(computations, unknown_trips)
  counter.run(entry, 1)
  return Count(
      flops=sum(c.flops for c in counter.costs),
      bytes=sum(c.bytes for c in counter.costs),
      costs=counter.costs,
      unknown_loops=counter.unknown_loops,
      custom_calls=sorted(set(counter.custom_calls)),
  )

