"""Stand-in tokenizers: the special ids the compiled programs need, no text.

The preflight reads no tokenizer file; the sampler it compiles asks these
for its padding and end ids, and the episode sampler for its control
pieces. Imports no other part of agent_tunix.
"""


class GemmaSpecialTokens:
  """The Gemma 3 vocabulary's special ids, for building the sampler.

  The compiled programs need only these ids (padding, end tokens); the
  preflight reads no tokenizer file. The ids are those of every Gemma 3
  SentencePiece model (models/tokenizer.py rebuilds the same from GGUF).
  """

  _PIECES = {'<pad>': 0, '<eos>': 1, '<bos>': 2, '<unk>': 3,
             '<start_of_turn>': 105, '<end_of_turn>': 106}

  def pad_id(self):
    return 0

  def eos_id(self):
    return 1

  def bos_id(self):
    return 2

  def unk_id(self):
    return 3

  def piece_to_id(self, piece):
    return self._PIECES.get(piece, self.unk_id())

  def encode(self, text, **kwargs):
    raise NotImplementedError('The preflight compiles programs; no text.')

  def decode(self, ids, **kwargs):
    raise NotImplementedError('The preflight compiles programs; no text.')


class EpisodeSpecialTokens(GemmaSpecialTokens):
  """What `episodes.from_config` reads of a tokenizer, still without text.

  The episode sampler looks up its format's control pieces, lists the
  pieces that hold a pause text and tokenizes the marker it puts in cut
  inserts. Only the special pieces are known here, so no id holds a pause
  text (the compiled loop has no pause-token check), and the marker, used
  on the host only, is empty.
  """

  def __init__(self, vocab_size):
    self._size = int(vocab_size)
    self._pieces = {i: p for p, i in self._PIECES.items()}

  def get_piece_size(self):
    return self._size

  def id_to_piece(self, i):
    return self._pieces.get(int(i), '')

  def encode(self, text, **kwargs):
    del text, kwargs
    return []
