"""Gemma tokenizers: SentencePiece (Gemma 3), BPE (Gemma 4), also from GGUF.

A GGUF file made by llama.cpp from a Gemma checkpoint keeps the whole
SentencePiece vocabulary (pieces, scores and piece types) in its metadata but
not the `tokenizer.model` file itself. `sentencepiece_proto_from_gguf` turns
that metadata back into a serialized SentencePiece `ModelProto`:

* BPE model with byte fallback, so any Unicode text round-trips through
  encode/decode (unknown characters become `<0xNN>` byte pieces). The one
  exception is inherent to SentencePiece and shared by Gemma's own tokenizer:
  spaces are written as U+2581, so a literal U+2581 decodes as a space;
* identity normalizer: no dummy prefix, no whitespace folding, spaces escaped
  as U+2581, as Gemma's tokenizer does;
* the trainer spec names the pad/eos/bos/unk pieces and ids. SentencePiece
  looks these up at run time; without them `bos_id()` is -1 and prompts lose
  their BOS token, which silently ruins generation.

Piece types. llama.cpp marks every special token as CONTROL (type 3), but in
SentencePiece a CONTROL piece is never produced from text, whereas Gemma's
tokenizer turns the chat markup written in a prompt into its special ids. So
here `<pad>`, `<eos>` and `<bos>` stay CONTROL, `<unk>` becomes UNKNOWN, and
every other CONTROL piece (`<start_of_turn>`, `<end_of_turn>`, `<mask>` and the
`<unusedN>` pieces) becomes USER_DEFINED: '<start_of_turn>' and
'<end_of_turn>' in a string encode to ids 105 and 106, as with the Hugging
Face Gemma tokenizer, and decode back to their text.

The user-defined whitespace pieces that llama.cpp stored with plain spaces
('  ', '   ', ...) get their spaces escaped back to U+2581 so they can match.

Building the proto for the 262k-piece vocabulary takes a few seconds, so
`load_gguf_tokenizer` caches the model file on disk, keyed by a hash of the
file's `tokenizer.*` metadata. The metadata is read by a small parser here
rather than `gguf.GGUFReader`, which takes tens of seconds on this vocabulary
because it builds numpy views for every one of its strings.

Gemma 4 ships a Hugging Face `tokenizer.json` (a BPE model), read by the
`tokenizers` library (`JsonTokenizer`). A Gemma 4 GGUF (tokenizer.ggml.model
'gemma4') keeps its pieces, merges and token types but not the rest of that
file, which is the same for every Gemma: spaces become U+2581 before the
merges, no splitting into words, byte fallback to `<0xNN>` pieces, and a
decoder that undoes both. `JsonTokenizer.from_gguf_vocab` rebuilds it from
those; control pieces become special added tokens and user-defined ones
(the tool and thought-channel pieces) plain added tokens, so both are
matched as one id in text. Checked against llama.cpp's Gemma 4 vocabulary
file and the ids Hugging Face's tokenizer gives its test texts
(tests/side/gemma4_vocab_check.py; docs/gemma4.md has the result).
"""

import hashlib
import json
import mmap
import os
import tempfile
from typing import NamedTuple

from absl import logging
import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from agent_tunix.models import gemma4_gguf
from agent_tunix.models import gguf as gguf_lib

# Bump when the recipe in `_build_proto` changes, so stale caches are ignored.
_CACHE_FORMAT = 1
_DEFAULT_CACHE_DIR = os.path.join('~', '.cache', 'agent_tunix')
_EXPECTED_TOKENIZER_MODEL = 'llama'  # llama.cpp's name for SentencePiece.
_BPE_TOKENIZER_MODEL = gemma4_gguf.TOKENIZER_MODEL  # Gemma 4's BPE.

# Gemma's special ids, used when a GGUF does not say.
_DEFAULT_SPECIAL_IDS = {'pad': 0, 'eos': 1, 'bos': 2, 'unk': 3}


_Piece = sentencepiece_model_pb2.ModelProto.SentencePiece
# GGUF token_type values use the same numbers as SentencePiece piece types:
# 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
_KNOWN_TYPES = frozenset(
    (_Piece.NORMAL, _Piece.UNKNOWN, _Piece.CONTROL, _Piece.USER_DEFINED,
     _Piece.UNUSED, _Piece.BYTE)
)


class GGUFVocab(NamedTuple):
  """The tokenizer part of a GGUF file's metadata."""

  tokens: list[str]
  scores: np.ndarray  # float32 [vocab]
  token_types: np.ndarray  # int32 [vocab]
  special_ids: dict[str, int]  # keys 'pad', 'eos', 'bos', 'unk'
  digest: str  # sha256 of the raw tokenizer.* metadata and _CACHE_FORMAT
  # tokenizer.ggml.model: 'llama' (SentencePiece) or 'gemma4' (BPE).
  model: str = 'llama'
  merges: tuple[str, ...] = ()  # BPE merges, 'a b' each


def read_gguf_vocab(path):
  """Reads the tokenizer metadata of a GGUF file.

  Args:
    path: a GGUF file.

  Returns:
    A `GGUFVocab`.

  Raises:
    FileNotFoundError: `path` does not exist.
    ValueError: not a GGUF file, no SentencePiece ('llama') or Gemma 4 BPE
      ('gemma4', with merges) vocabulary, or inconsistent tokenizer arrays.
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f'GGUF file not found: {path!r}. Set config.model.path to a Gemma '
        'GGUF file, or leave it empty for the packaged Gemma 3 270M.'
    )
  meta, digest = _tokenizer_metadata(path)
  model = meta.get('tokenizer.ggml.model')
  if model not in (_EXPECTED_TOKENIZER_MODEL, _BPE_TOKENIZER_MODEL):
    raise ValueError(
        f'{path!r}: tokenizer.ggml.model is {model!r}, expected '
        f"{_EXPECTED_TOKENIZER_MODEL!r} (Gemma 3's SentencePiece vocabulary) "
        f"or {_BPE_TOKENIZER_MODEL!r} (Gemma 4's BPE). Point "
        'config.model.path at a Gemma GGUF.'
    )
  tokens = meta.get('tokenizer.ggml.tokens')
  if not tokens:
    raise ValueError(
        f'{path!r}: expected a tokenizer.ggml.tokens array, found '
        f'{"an empty one" if tokens is not None else "none"}. The file has '
        'no vocabulary; set config.model.tokenizer_path to a tokenizer.model.'
    )
  merges = ()
  if model == _BPE_TOKENIZER_MODEL:
    merges = tuple(meta.get('tokenizer.ggml.merges') or ())
    if not merges:
      raise ValueError(
          f"{path!r}: a {_BPE_TOKENIZER_MODEL!r} (BPE) vocabulary needs "
          'tokenizer.ggml.merges, and the file has none; set '
          "config.model.tokenizer_path to the model's tokenizer.json.")
    if 'tokenizer.ggml.scores' not in meta:  # BPE files may leave them out.
      meta['tokenizer.ggml.scores'] = np.full(len(tokens), -1000.0)
  arrays = _per_token_arrays(path, meta, len(tokens))
  return GGUFVocab(
      tokens=tokens,
      scores=arrays['scores'].astype(np.float32),
      token_types=arrays['token_type'].astype(np.int32),
      special_ids=_special_ids(path, meta, len(tokens)),
      digest=digest,
      model=model,
      merges=merges,
  )


def _tokenizer_metadata(path):
  """({key: value} of a GGUF file's tokenizer.* metadata, digest).

  The digest is the sha256 of those entries' raw bytes and _CACHE_FORMAT.
  """
  hasher = hashlib.sha256(f'agent_tunix-spm-{_CACHE_FORMAT}'.encode())
  meta = {}
  with open(path, 'rb') as f:
    if os.fstat(f.fileno()).st_size < 24:
      raise ValueError(
          f'{path!r} is not a GGUF file: it is shorter than a GGUF header.'
      )
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
      parser = gguf_lib.MetadataParser(buf, path)
      for _ in range(parser.header()):
        start = parser.offset
        key = parser.string()
        (value_type,) = parser.unpack('I')
        keep = key.startswith('tokenizer.')
        value = parser.value(value_type, keep)
        if keep:
          meta[key] = value
          hasher.update(buf[start:parser.offset])
  return meta, hasher.hexdigest()


def _per_token_arrays(path, meta, vocab_size):
  """{'scores', 'token_type': np.ndarray}, checked one entry per token."""
  arrays = {}
  for name in ('scores', 'token_type'):
    key = f'tokenizer.ggml.{name}'
    array = meta.get(key)
    found = 'none' if array is None else f'{len(array)} entries'
    if array is None or len(array) != vocab_size:
      raise ValueError(
          f'{path!r}: expected {key} with {vocab_size} entries (one per '
          f'token), found {found}.'
      )
    arrays[name] = np.asarray(array)
  return arrays


def _special_ids(path, meta, vocab_size):
  """{'pad', 'eos', 'bos', 'unk': id}, Gemma's where the file says none."""
  special_ids = {}
  for name, key in (('pad', 'padding'), ('eos', 'eos'), ('bos', 'bos'),
                    ('unk', 'unknown')):
    value = meta.get(f'tokenizer.ggml.{key}_token_id')
    special_ids[name] = int(
        _DEFAULT_SPECIAL_IDS[name] if value is None else value
    )
    if not 0 <= special_ids[name] < vocab_size:
      raise ValueError(
          f'{path!r}: tokenizer.ggml.{key}_token_id is {special_ids[name]}, '
          f'expected an id below the vocabulary size {vocab_size}.'
      )
  return special_ids


def _build_proto(vocab, path):
  """Builds the SentencePiece ModelProto for `vocab` (see module docstring)."""
  proto = sentencepiece_model_pb2.ModelProto()
  ids = vocab.special_ids
  by_id = {ids['pad']: _Piece.CONTROL, ids['eos']: _Piece.CONTROL,
           ids['bos']: _Piece.CONTROL, ids['unk']: _Piece.UNKNOWN}
  types = vocab.token_types.tolist()
  scores = vocab.scores.tolist()
  pieces = []
  seen = {}
  for i, (text, kind) in enumerate(zip(vocab.tokens, types)):
    if i in by_id:
      kind = by_id[i]
    elif kind == _Piece.CONTROL or kind == _Piece.UNKNOWN:
      kind = _Piece.USER_DEFINED
    elif kind not in _KNOWN_TYPES:
      raise ValueError(
          f'{path!r}: token {i} ({text!r}) has token_type {kind}, expected '
          'one of 1..6.'
      )
    if kind == _Piece.USER_DEFINED:
      text = text.replace(' ', '\u2581')
    if text in seen:
      raise ValueError(
          f'{path!r}: piece {text!r} appears twice (ids {seen[text]} and '
          f'{i}); SentencePiece needs unique pieces.'
      )
    seen[text] = i
    pieces.append(_Piece(piece=text, score=scores[i], type=kind))
  proto.pieces.extend(pieces)

  spec = proto.trainer_spec
  spec.model_type = sentencepiece_model_pb2.TrainerSpec.BPE
  spec.vocab_size = len(vocab.tokens)
  spec.byte_fallback = True
  spec.split_digits = True
  spec.allow_whitespace_only_pieces = True
  spec.split_by_whitespace = True
  spec.split_by_unicode_script = True
  spec.split_by_number = True
  spec.treat_whitespace_as_suffix = False
  for name in ('pad', 'eos', 'bos', 'unk'):
    setattr(spec, f'{name}_id', ids[name])
    setattr(spec, f'{name}_piece', vocab.tokens[ids[name]])

  normalizer = proto.normalizer_spec
  normalizer.name = 'identity'
  normalizer.add_dummy_prefix = False
  normalizer.remove_extra_whitespaces = False
  normalizer.escape_whitespaces = True
  proto.denormalizer_spec.add_dummy_prefix = False
  proto.denormalizer_spec.remove_extra_whitespaces = False
  proto.denormalizer_spec.escape_whitespaces = True
  return proto.SerializeToString()


def sentencepiece_proto_from_gguf(path):
  """Builds a serialized SentencePiece ModelProto from a GGUF vocabulary.

  Args:
    path: a GGUF file with a SentencePiece ('llama') vocabulary.

  Returns:
    The serialized `ModelProto`; load it with
    `spm.SentencePieceProcessor(model_proto=...)`.

  Raises:
    FileNotFoundError: `path` does not exist.
    ValueError: the file has no usable SentencePiece vocabulary.
  """
  vocab = read_gguf_vocab(path)
  if vocab.model != _EXPECTED_TOKENIZER_MODEL:
    raise ValueError(
        f"{path!r} holds a {vocab.model!r} (BPE) vocabulary, not "
        'SentencePiece; load it with load_gguf_tokenizer.')
  return _build_proto(vocab, path)


def _write_atomically(path, data):
  """Writes `data` to `path` so that readers see all of it or nothing."""
  directory = os.path.dirname(path)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix='.tmp-', suffix='.model')
  try:
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o644)  # mkstemp makes it owner-only.
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def load_gguf_tokenizer(gguf_path, cache_dir=''):
  """Loads the tokenizer of a Gemma GGUF file.

  Gemma 3's SentencePiece model goes through an on-disk cache: the cached
  model file is named after a hash of the GGUF's `tokenizer.*` metadata, so
  a changed vocabulary gets a new file and copies of one GGUF share one. It
  is written to a temporary file and renamed into place, so processes
  loading in parallel never read a partial file. Gemma 4's BPE vocabulary is
  rebuilt in memory (a few seconds for 262k pieces and 515k merges).

  Args:
    gguf_path: a GGUF file with a SentencePiece ('llama') or Gemma 4 BPE
      ('gemma4') vocabulary.
    cache_dir: where the rebuilt `.model` file is kept; '' means
      ~/.cache/agent_tunix (config.model.cache_dir).

  Returns:
    A `spm.SentencePieceProcessor`, or a `JsonTokenizer` for 'gemma4'.

  Raises:
    FileNotFoundError: `gguf_path` does not exist.
    ValueError: the file has no usable vocabulary.
  """
  vocab = read_gguf_vocab(gguf_path)
  if vocab.model == _BPE_TOKENIZER_MODEL:
    logging.info('Building the Gemma 4 BPE tokenizer of %s (%d pieces, %d '
                 'merges)', gguf_path, len(vocab.tokens), len(vocab.merges))
    return JsonTokenizer.from_gguf_vocab(vocab, gguf_path)
  cache_dir = os.path.expanduser(cache_dir or _DEFAULT_CACHE_DIR)
  os.makedirs(cache_dir, exist_ok=True)
  cached = os.path.join(cache_dir, f'gguf-spm-{vocab.digest[:24]}.model')
  if os.path.isfile(cached):
    try:
      tok = spm.SentencePieceProcessor(model_file=cached)
      logging.info('Loaded tokenizer for %s from cache %s', gguf_path, cached)
      return tok
    except (OSError, RuntimeError) as e:
      logging.warning('Rebuilding unreadable tokenizer cache %s: %s', cached,
                      e)
  logging.info('Building SentencePiece model from %s (%d pieces) into %s',
               gguf_path, len(vocab.tokens), cached)
  proto = _build_proto(vocab, gguf_path)
  _write_atomically(cached, proto)
  return spm.SentencePieceProcessor(model_proto=proto)


def load_sentencepiece(path):
  """Loads a SentencePiece `tokenizer.model` file.

  Args:
    path: the `tokenizer.model` file, or a directory holding one (as a Hugging
      Face checkpoint directory does).

  Returns:
    A `spm.SentencePieceProcessor`.

  Raises:
    FileNotFoundError: no such file.
    ValueError: the file is not a SentencePiece model.
  """
  if path and os.path.isdir(path):
    path = os.path.join(path, 'tokenizer.model')
  if not path or not os.path.isfile(path):
    raise FileNotFoundError(
        f'SentencePiece tokenizer model not found: {path!r}. Set '
        'config.model.tokenizer_path to the tokenizer.model file that comes '
        'with the checkpoint.'
    )
  try:
    return spm.SentencePieceProcessor(model_file=path)
  except (OSError, RuntimeError) as e:
    raise ValueError(
        f'{path!r} is not a SentencePiece model file ({e}). Set '
        'config.model.tokenizer_path to a tokenizer.model file.'
    ) from e


def encode_with_bos(tok, text):
  """Encodes `text` to ids with the BOS id in front.

  Args:
    tok: a `spm.SentencePieceProcessor`.
    text: the string to encode.

  Returns:
    A list of ints starting with `tok.bos_id()`.

  Raises:
    ValueError: the tokenizer has no BOS piece.
  """
  bos = tok.bos_id()
  if bos < 0:
    raise ValueError(
        'The tokenizer has no BOS piece (bos_id() is -1); its model file '
        'lacks trainer_spec.bos_piece. Gemma needs BOS at the start of every '
        'prompt.'
    )
  return [bos] + tok.encode(text)


class JsonTokenizer:
  """A Hugging Face `tokenizer.json`, read by the `tokenizers` library.

  Gemma 4's Hugging Face repos ship their tokenizer as tokenizer.json; a
  Gemma 4 GGUF's vocabulary is rebuilt into the same (`from_gguf_vocab`,
  `path` then names the GGUF; its special ids are looked up by piece, as
  for a tokenizer.json, which gives the file's own in Gemma 4's). This
  class gives it the SentencePiece methods agent_tunix and tunix's sampler
  call (encode, decode, the special ids, piece lookups). As SentencePiece
  does with Gemma's control pieces, `decode` leaves out <pad>, <bos> and
  <eos> and keeps every other token's text (turn markers included); `encode`
  adds no special token (callers put <bos> in front themselves).
  """

  SPECIAL = {'pad': '<pad>', 'eos': '<eos>', 'bos': '<bos>', 'unk': '<unk>'}

  def __init__(self, path, tokenizer=None):
    """Reads the tokenizer.json at `path` (or takes `tokenizer`, a
    `tokenizers.Tokenizer` read from `path` some other way)."""
    import tokenizers  # pylint: disable=g-import-not-at-top
    self.path = path
    self._tok = tokenizer or tokenizers.Tokenizer.from_file(path)
    self._ids = {}
    for role, piece in self.SPECIAL.items():
      token = self._tok.token_to_id(piece)
      if token is None and role != 'unk':
        raise ValueError(
            f'{path}: the tokenizer has no {piece} token; expected a Gemma '
            'tokenizer.json.')
      self._ids[role] = -1 if token is None else token
    self._hidden = {self._ids[r] for r in ('pad', 'bos', 'eos')}

  @classmethod
  def from_gguf_vocab(cls, vocab, path):
    """Gemma's BPE tokenizer rebuilt from a 'gemma4' `GGUFVocab` (see the
    module docstring); `path` names the file in messages."""
    import tokenizers  # pylint: disable=g-import-not-at-top
    from tokenizers import decoders, normalizers, pre_tokenizers  # pylint: disable=g-import-not-at-top,g-multiple-import
    merges = []
    for merge in vocab.merges:
      cut = merge.find(' ', 1)  # As llama.cpp splits them.
      if cut < 0:
        raise ValueError(f'{path!r}: BPE merge {merge!r} has no space.')
      merges.append((merge[:cut], merge[cut + 1:]))
    pieces = {piece: i for i, piece in enumerate(vocab.tokens)}
    if len(pieces) != len(vocab.tokens):
      raise ValueError(f'{path!r}: the vocabulary repeats a piece.')
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(
        vocab=pieces, merges=merges, unk_token=cls.SPECIAL['unk'],
        fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(' ', '\u2581')
    tok.pre_tokenizer = pre_tokenizers.Split(
        pattern=' ', behavior='merged_with_previous')
    tok.decoder = decoders.Sequence([
        decoders.Replace('\u2581', ' '), decoders.ByteFallback(),
        decoders.Fuse()])
    types = vocab.token_types.tolist()
    tok.add_tokens([
        tokenizers.AddedToken(piece, special=kind == _Piece.CONTROL,
                              normalized=False)
        for piece, kind in zip(vocab.tokens, types)
        if kind in (_Piece.CONTROL, _Piece.USER_DEFINED)])
    return cls(path, tok)

  def encode(self, text, **unused):
    return list(self._tok.encode(text, add_special_tokens=False).ids)

  def decode(self, ids, **unused):
    ids = [int(i) for i in ids if int(i) not in self._hidden]
    return self._tok.decode(ids, skip_special_tokens=False)

  def pad_id(self):
    return self._ids['pad']

  def eos_id(self):
    return self._ids['eos']

  def bos_id(self):
    return self._ids['bos']

  def unk_id(self):
    return self._ids['unk']

  def piece_to_id(self, piece):
    token = self._tok.token_to_id(piece)
    return self.unk_id() if token is None else token

  def id_to_piece(self, token):
    return self._tok.id_to_token(int(token))

  def get_piece_size(self):
    return self._tok.get_vocab_size()

  def to_json(self):
    """The tokenizer.json text (what an export writes)."""
    return self._tok.to_str()

  def gguf_vocab(self):
    """The vocabulary as a GGUF BPE ('gemma4') tokenizer: pieces by id,
    merges, token types (control for special added tokens, user-defined for
    the other added ones, byte for <0xNN>)."""
    spec = json.loads(self.to_json())
    model = spec.get('model') or {}
    if model.get('type') != 'BPE':
      raise ValueError(
          f'{self.path}: a {model.get("type")!r} tokenizer.json; GGUF export '
          'writes BPE vocabularies (Gemma 4\'s) only.')
    size = self.get_piece_size()
    tokens = [self.id_to_piece(i) for i in range(size)]
    if None in tokens:
      raise ValueError(f'{self.path}: token ids are not contiguous.')
    added = spec.get('added_tokens') or []
    merges = tuple(m if isinstance(m, str) else ' '.join(m)
                   for m in model.get('merges') or ())
    return GGUFVocab(
        tokens=tokens,
        scores=np.full(size, -1000.0, np.float32),
        token_types=gemma4_gguf.token_types(
            tokens, [t['id'] for t in added if t.get('special')],
            [t['id'] for t in added if not t.get('special')]),
        special_ids={k: v for k, v in self._ids.items() if v >= 0},
        digest='',
        model=_BPE_TOKENIZER_MODEL,
        merges=merges,
    )
