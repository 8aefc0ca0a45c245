"""Gemma 4 export: train, export to Hugging Face / GGUF, reload, same log-probs.

The acceptance path runs the commands a user runs: configs/tiny_gemma4.py
trains 2 steps (main), the export CLI writes the merged Hugging Face
directory from the checkpoint, and the directory loads back through the
Hugging Face loader (`model.source='hf'`) with the trained policy's
log-probs. In process, both tiny configs (dense and MoE) with large random
LoRA adapters round-trip through the merged, PEFT and GGUF layouts.
"""

import json
import os
import subprocess
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# pylint: disable=g-import-not-at-top
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from agent_tunix import export
from agent_tunix import models
from agent_tunix.agent import formats
from agent_tunix.models import gemma
from agent_tunix.models import gemma3_gguf
from agent_tunix.models import lora
from agent_tunix.rl import logprobs
from agent_tunix.tpu import sharding
from agent_tunix.configs import tiny_gemma4
# pylint: enable=g-import-not-at-top

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_COMPLETION = 6


def _env():
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env['PYTHONPATH'] = os.pathsep.join(
      p for p in (_REPO, env.get('PYTHONPATH')) if p)
  return env


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """(workdir, merged export dir, export CLI stdout) of the CLI path."""
  root = tmp_path_factory.mktemp('g4')
  workdir, output = str(root / 'run'), str(root / 'hf')
  for args in (
      # pass@k off: evaluation's sampled decode is not what these check.
      ['agent_tunix.main', '--config=configs/tiny_gemma4.py',
       '--config.eval.pass_at_k=0', f'--workdir={workdir}'],
      ['agent_tunix.export', '--config=configs/tiny_gemma4.py',
       f'--workdir={workdir}', '--format=merged', f'--output={output}'],
  ):
    done = subprocess.run([sys.executable, '-m', *args], cwd=_REPO,
                          env=_env(), capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
  return workdir, output


def _tokens(tokenizer):
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 5000, (2, 14)).astype(np.int32)
  tokens[:, 0] = tokenizer.bos_id()
  return jnp.asarray(tokens), jnp.ones(tokens.shape, bool)


def _logps(model, tokens, mask, use_lora=True):
  return np.asarray(logprobs.per_token_logps(
      model, tokens, mask, _COMPLETION, 4, use_lora=use_lora)[0])


def test_trained_tiny_gemma4_reloads_from_its_export(trained):
  workdir, output = trained
  config = tiny_gemma4.get_config()
  policy, tokenizer, step = export.load_policy(config, workdir)
  assert step == 2
  tokens, mask = _tokens(tokenizer)
  want = _logps(policy, tokens, mask)
  # Two steps moved the policy away from the base model.
  assert np.abs(want - _logps(policy, tokens, mask, use_lora=False)).max() > 0
  reload_cfg = config.model.copy_and_resolve_references()
  reload_cfg.source, reload_cfg.path, reload_cfg.lora_rank = 'hf', output, 0
  reloaded = gemma.load_model(reload_cfg, sharding.make_mesh(config.mesh))
  np.testing.assert_allclose(_logps(reloaded, tokens, mask), want, atol=1e-5)
  with open(os.path.join(output, 'config.json')) as f:
    hf = json.load(f)
  assert hf['model_type'] == 'gemma4'
  text = hf['text_config']
  assert text['final_logit_softcapping'] == 30.0
  assert text['num_kv_shared_layers'] == 3
  assert text['attention_k_eq_v'] is True
  assert text['layer_types'][:3] == ['sliding_attention', 'sliding_attention',
                                     'full_attention']


@pytest.mark.parametrize('preset', ['tiny_gemma4', 'tiny_gemma4_moe',
                                    'tiny_gemma4_moe+experts'])
def test_merged_and_peft_layouts(preset, tmp_path):
  preset, _, experts = preset.partition('+')
  config = tiny_gemma4.get_config(f'model.preset={preset},model.lora_rank=3')
  config.model.lora_experts = bool(experts)
  mesh = sharding.make_mesh(config.mesh)
  model, tokenizer = models.build(config, mesh)
  state = lora.lora_state(model)
  keys = iter(jax.random.split(jax.random.key(3), 1000))
  nnx.update(model, jax.tree.map(
      lambda x: 0.1 * jax.random.normal(next(keys), x.shape, x.dtype), state))
  tokens, mask = _tokens(tokenizer)
  want = _logps(model, tokens, mask)
  base = _logps(model, tokens, mask, use_lora=False)
  assert np.abs(want - base).max() > 1e-3  # The LoRA matters.
  if experts:  # ... and so does the experts' own, alone.
    randomized = jax.tree.map(jnp.array, lora.lora_state(model))
    for path, var in nnx.to_flat_state(lora.lora_state(model)):
      if 'moe' not in path:
        var.set_value(jnp.zeros_like(var[...]))
    assert np.abs(_logps(model, tokens, mask) - base).max() > 1e-3
    nnx.update(model, randomized)
    np.testing.assert_array_equal(_logps(model, tokens, mask), want)
  merged = export.export(model, tokenizer, config, 'merged',
                         str(tmp_path / 'merged'))
  names = safetensors.numpy.load_file(
      os.path.join(merged, 'model.safetensors'))
  assert all(n.startswith('model.language_model.') for n in names)
  if preset == 'tiny_gemma4_moe':
    assert 'model.language_model.layers.0.experts.gate_up_proj' in names
  reload_cfg = config.model.copy_and_resolve_references()
  reload_cfg.source, reload_cfg.path, reload_cfg.lora_rank = 'hf', merged, 0
  reloaded = gemma.load_model(reload_cfg, mesh)
  np.testing.assert_allclose(_logps(reloaded, tokens, mask), want, atol=1e-5)
  if experts:
    # The experts' own LoRA is in the merged weights (checked above); PEFT
    # has no layout for it and says so.
    with pytest.raises(export.ExportError, match='lora_experts'):
      export.export(model, tokenizer, config, 'peft', str(tmp_path / 'peft'))
  else:
    _check_peft(model, tokenizer, config, reload_cfg, names, tmp_path)
  # GGUF ('gemma4'): the merged weights reload with the same log-probs.
  path = export.export(model, tokenizer, config, 'gguf',
                       str(tmp_path / 'model.gguf'))
  reload_cfg.source, reload_cfg.path = 'gguf', path
  reload_cfg.cache_dir = str(tmp_path / 'cache')
  for _ in range(2):  # Dequantized, then from the cache.
    reloaded = gemma.load_model(reload_cfg, mesh)
    np.testing.assert_allclose(_logps(reloaded, tokens, mask), want,
                               atol=1e-5)
  _check_gguf_layout(path, preset)


def _check_peft(model, tokenizer, config, reload_cfg, names, tmp_path):
  """PEFT: each factor pair rebuilds the merged weight's delta."""
  peft = export.export(model, tokenizer, config, 'peft',
                       str(tmp_path / 'peft'))
  adapter = safetensors.numpy.load_file(
      os.path.join(peft, 'adapter_model.safetensors'))
  base_hf = dict(export.hf_state(model, reload_cfg))  # rank 0: no LoRA.
  scale = export.lora_scale(config.model)
  checked = 0
  for name, a in adapter.items():
    if not name.endswith('.lora_A.weight'):
      continue
    module = name[len('base_model.model.'):-len('.lora_A.weight')]
    b = adapter[name.replace('lora_A', 'lora_B')]
    hf_name = module + '.weight'
    np.testing.assert_allclose(
        scale * b @ a, names[hf_name] - base_hf[hf_name], atol=1e-5,
        err_msg=hf_name)
    checked += 1
  assert checked >= 4 * config.model.lora_rank
  assert any('self_attn.k_proj.lora_A' in n for n in adapter)


def _check_gguf_layout(path, preset):
  """The metadata and tensors llama.cpp's 'gemma4' loader reads."""
  from agent_tunix.models import gguf as gguf_lib  # pylint: disable=g-import-not-at-top
  reader = gguf_lib.open_reader(path)
  meta = reader.metadata
  names = {t.name: t for t in reader.tensors}
  assert meta['general.architecture'] == 'gemma4'
  assert meta['gemma4.attention.key_length'] == 24  # global layers
  assert meta['gemma4.attention.key_length_swa'] == 16
  assert meta['gemma4.final_logit_softcapping'] == 30.0
  # Layer 2 is global with K = V: one K projection, no V.
  assert 'blk.2.attn_k.weight' in names and 'blk.2.attn_v.weight' not in names
  assert names['blk.2.attn_q.weight'].shape == (4 * 24, 32)
  # Norms as they are (no +1): a fresh model's are 0 or 1, never 2.
  assert np.asarray(names['output_norm.weight'].data).max() < 1.5
  rope = np.asarray(names['rope_freqs.weight'].data)
  assert rope.shape == (12,)  # global head dim / 2
  assert (rope == 1.0).sum() == 3  # 0.25 of the 12 pairs rotate
  if preset == 'tiny_gemma4':
    assert list(meta['gemma4.attention.sliding_window_pattern']) == [
        True, True, False] * 2
    assert meta['gemma4.attention.shared_kv_layers'] == 3
    assert list(meta['gemma4.attention.head_count_kv']) == [2, 2, 1] * 2
    assert list(meta['gemma4.feed_forward_length']) == [64] * 3 + [128] * 3
    assert meta['gemma4.embedding_length_per_layer_input'] == 4
    assert names['per_layer_token_embd.weight'].shape == (262144, 6 * 4)
    # Layers 3-5 read earlier layers' K/V: none of theirs is written.
    assert not any(n.startswith(('blk.3.attn_k', 'blk.4.attn_v',
                                 'blk.5.attn_k')) for n in names)
  else:
    assert meta['gemma4.expert_count'] == 4
    assert meta['gemma4.expert_used_count'] == 2
    assert meta['gemma4.expert_feed_forward_length'] == 16
    assert names['blk.0.ffn_gate_up_exps.weight'].shape == (4, 32, 32)
    assert names['blk.0.ffn_down_exps.weight'].shape == (4, 32, 16)
    assert names['blk.0.ffn_gate_inp.weight'].shape == (4, 32)
    assert names['blk.0.ffn_down_exps.scale'].shape == (4,)


def test_gguf_of_another_model_is_refused(tmp_path):
  config = tiny_gemma4.get_config('model.preset=tiny_gemma4_moe')
  model, tokenizer = models.build(config, sharding.make_mesh(config.mesh))
  path = export.export(model, tokenizer, config, 'gguf',
                       str(tmp_path / 'moe.gguf'), gguf_dtype='q8_0')
  other = tiny_gemma4.get_config().model
  other.source, other.path = 'gguf', path
  other.cache_dir = str(tmp_path / 'cache')
  with pytest.raises(ValueError, match=r'gemma4.block_count is 3, but the '
                     r'configured preset \(6 layers\) expects 6'):
    gemma.load_model(other, sharding.make_mesh(config.mesh))
  gemma3 = other.copy_and_resolve_references()
  gemma3.preset = 'tiny'
  with pytest.raises(ValueError, match="holds a 'gemma4' model"):
    gemma.load_model(gemma3, sharding.make_mesh(config.mesh))


def _tokenizer_json(path):
  """A small Gemma-like tokenizer.json: special pieces, turn markers, BPE."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  vocab = {'<pad>': 0, '<eos>': 1, '<bos>': 2, '<unk>': 3, '<|turn>': 4,
           '<turn|>': 5}
  for ch in 'abcdefghijklmnopqrstuvwxyz 0123456789+=?\n':
    vocab[ch] = len(vocab)
  merges = [('a', 'b'), ('ab', 'c')]
  for a, b in merges:
    vocab[a + b] = len(vocab)
  tool_pieces = list(formats.Gemma4Format.required_pieces[2:])
  for piece in tool_pieces:
    vocab[piece] = len(vocab)
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(
      vocab=vocab, merges=merges, unk_token='<unk>'))
  tok.add_special_tokens(['<pad>', '<eos>', '<bos>', '<unk>', '<|turn>',
                          '<turn|>'] + tool_pieces)
  tok.decoder = tokenizers.decoders.Fuse()
  tok.save(path)
  return vocab


def test_a_directory_with_only_tokenizer_json(tmp_path):
  from agent_tunix.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  from agent_tunix.rl import rollout  # pylint: disable=g-import-not-at-top
  vocab = _tokenizer_json(str(tmp_path / 'tokenizer.json'))
  config = tiny_gemma4.get_config()
  config.model.source, config.model.path = 'hf', str(tmp_path)
  tok = gemma.load_tokenizer(config.model)
  assert isinstance(tok, tokenizer_lib.JsonTokenizer)
  assert (tok.pad_id(), tok.eos_id(), tok.bos_id(), tok.unk_id()) == (
      0, 1, 2, 3)
  ids = tok.encode('<|turn>user\nabc 2+2=?<turn|>')
  assert ids[:2] == [vocab['<|turn>'], vocab['u']]
  assert vocab['abc'] in ids and ids[-1] == vocab['<turn|>']
  # <bos>/<eos>/<pad> are dropped by decode, turn markers kept.
  assert tok.decode([tok.bos_id()] + ids + [tok.eos_id(), 0]) == (
      '<|turn>user\nabc 2+2=?<turn|>')
  assert tok.piece_to_id('<turn|>') == 5 and tok.piece_to_id('zz') == 3
  assert tok.id_to_piece(4) == '<|turn>'
  assert tok.get_piece_size() == len(vocab)
  assert rollout.end_token_ids(tok) == [1, 5]


def test_a_tokenizer_json_becomes_a_bpe_gguf_vocabulary(tmp_path):
  import types  # pylint: disable=g-import-not-at-top
  import gguf  # pylint: disable=g-import-not-at-top
  from agent_tunix.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  vocab = _tokenizer_json(str(tmp_path / 'tokenizer.json'))
  config = tiny_gemma4.get_config()
  config.model.tokenizer_path = str(tmp_path / 'tokenizer.json')
  tok = gemma.load_tokenizer(config.model)
  assert isinstance(tok, tokenizer_lib.JsonTokenizer)
  gguf_vocab = export.gguf_vocab(config.model, tok)
  path = str(tmp_path / 'vocab.gguf')
  gemma3_gguf.write_gguf_file(
      path, types.SimpleNamespace(num_embed=len(vocab)), [], gguf_vocab,
      arch='gemma4', hparams=lambda writer: None)
  fields = gguf.GGUFReader(path).fields

  def strings(key):
    f = fields[key]
    return [bytes(f.parts[i]).decode() for i in f.data]

  assert strings('tokenizer.ggml.model') == ['gemma4']
  assert strings('tokenizer.ggml.merges') == ['a b', 'ab c']
  tokens = strings('tokenizer.ggml.tokens')
  assert tokens == sorted(vocab, key=vocab.get)
  kinds = fields['tokenizer.ggml.token_type']
  kind = {tokens[i]: int(kinds.parts[j][0]) for i, j in enumerate(kinds.data)}
  assert kind['<bos>'] == kind['<turn|>'] == gguf.TokenType.CONTROL
  assert kind['<|tool_call>'] == gguf.TokenType.USER_DEFINED
  assert kind['a'] == kind['abc'] == gguf.TokenType.NORMAL
  assert int(fields['tokenizer.ggml.bos_token_id'].parts[-1][0]) == 2
  back = tokenizer_lib.read_gguf_vocab(path)
  assert (back.model, back.merges, back.tokens) == (
      'gemma4', gguf_vocab.merges, gguf_vocab.tokens)


def _gemma_tokenizer_json(path):
  """A small tokenizer.json made as Gemma's are: spaces become U+2581
  before the merges, byte fallback to <0xNN>, control and tool pieces as
  added tokens; merges that span spaces and newlines."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, normalizers, pre_tokenizers  # pylint: disable=g-import-not-at-top,g-multiple-import
  control = ['<pad>', '<eos>', '<bos>', '<unk>', '<mask>', '<|turn>',
             '<turn|>', '<|think|>']
  tool_pieces = ['<|tool_call>', '<tool_call|>', '<|"|>']
  vocab = {p: i for i, p in enumerate(control + tool_pieces)}
  for b in range(256):
    vocab[f'<0x{b:02X}>'] = len(vocab)
  for ch in 'abcdefghijklmnopqrstuvwxyz0123456789+=?.\n\u2581':
    vocab[ch] = len(vocab)
  merges = [('\u2581', 'a'), ('\u2581a', 'b'), ('\n', '\n'), ('\u2581', '\u2581'),
            ('c', 'a'), ('ca', 't'), ('\u2581', 'cat')]
  for a, b in merges:
    vocab[a + b] = len(vocab)
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(
      vocab=vocab, merges=merges, unk_token='<unk>', fuse_unk=True,
      byte_fallback=True))
  tok.normalizer = normalizers.Replace(' ', '\u2581')
  tok.pre_tokenizer = pre_tokenizers.Split(' ', 'merged_with_previous')
  tok.decoder = decoders.Sequence([
      decoders.Replace('\u2581', ' '), decoders.ByteFallback(),
      decoders.Fuse()])
  tok.add_special_tokens(control)
  tok.add_tokens(tool_pieces)
  tok.save(path)


def test_a_gemma4_gguf_vocabulary_becomes_its_tokenizer_again(tmp_path):
  """tokenizer.json -> GGUF 'gemma4' vocabulary -> tokenizer: the same ids
  and text back, the same special ids, the same vocabulary when exported
  again. (The same rebuild gives Hugging Face's ids for llama.cpp's real
  Gemma 4 vocabulary: tests/side/gemma4_vocab_check.py.)"""
  import types  # pylint: disable=g-import-not-at-top
  from agent_tunix.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  json_path = str(tmp_path / 'tokenizer.json')
  _gemma_tokenizer_json(json_path)
  original = tokenizer_lib.JsonTokenizer(json_path)
  vocab = original.gguf_vocab()
  path = str(tmp_path / 'vocab.gguf')
  gemma3_gguf.write_gguf_file(path, types.SimpleNamespace(
      num_embed=len(vocab.tokens)), [], vocab, arch='gemma4',
                              hparams=lambda writer: None)
  config = tiny_gemma4.get_config()
  config.model.source, config.model.path = 'gguf', path
  rebuilt = gemma.load_tokenizer(config.model)
  assert isinstance(rebuilt, tokenizer_lib.JsonTokenizer)
  texts = ['a cat', ' ab  cat\n\n\nab', 'Äpfel 7+5=?', '',
           '<|turn>user\ncat<turn|>\n<|turn>model\n<|think|>',
           '<|tool_call>call:f{x:<|"|>a b<|"|>}<tool_call|>', '   \t ']
  for text in texts:
    ids = original.encode(text)
    assert rebuilt.encode(text) == ids, text
    assert rebuilt.decode(ids) == text
  # One id each for the merged words, the turn and tool pieces; bytes for
  # what the vocabulary lacks.
  assert rebuilt.encode(' cat') == [original.piece_to_id('\u2581cat')]
  assert rebuilt.encode('<|"|>') == [original.piece_to_id('<|"|>')]
  assert [rebuilt.id_to_piece(i) for i in rebuilt.encode('\t')] == ['<0x09>']
  assert [getattr(rebuilt, f'{k}_id')() for k in ('pad', 'eos', 'bos', 'unk')
          ] == [0, 1, 2, 3]
  again = rebuilt.gguf_vocab()
  assert again.tokens == vocab.tokens and again.merges == vocab.merges
  np.testing.assert_array_equal(again.token_types, vocab.token_types)
  # A 'gemma4' vocabulary without merges cannot be rebuilt: one message.
  bare = str(tmp_path / 'bare.gguf')
  gemma3_gguf.write_gguf_file(bare, types.SimpleNamespace(
      num_embed=len(vocab.tokens)), [], vocab._replace(merges=()),
                              arch='gemma4', hparams=lambda writer: None)
  with pytest.raises(ValueError, match="needs tokenizer.ggml.merges, and "
                     "the file has none; set config.model.tokenizer_path"):
    tokenizer_lib.load_gguf_tokenizer(bare)


def test_tiny_moe_trains_two_steps_and_logs_expert_load(tmp_path):
  """The MoE model with LoRA on its experts too trains and logs its load."""
  done = subprocess.run(
      [sys.executable, '-m', 'agent_tunix.main',
       '--config=configs/tiny_gemma4.py:model.preset=tiny_gemma4_moe',
       '--config.model.lora_experts=True', '--config.eval.pass_at_k=0',
       f'--workdir={tmp_path}'],
      cwd=_REPO, env=_env(), capture_output=True, text=True, timeout=600,
      check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  final = json.loads(done.stdout.strip().splitlines()[-1])
  assert final['step'] == 2
  logged = [line for line in done.stderr.splitlines()
            if '] [2] ' in line and 'moe/max_load=' in line]
  assert logged, done.stderr[-3000:]
  assert 'moe/dropped_tokens=0' in logged[0]


def test_gemma4_tool_format_needs_and_uses_its_tool_tokens(tmp_path):
  from agent_tunix.rl import episodes  # pylint: disable=g-import-not-at-top
  from agent_tunix.rl import rollout  # pylint: disable=g-import-not-at-top
  vocab = _tokenizer_json(str(tmp_path / 'tokenizer.json'))
  config = tiny_gemma4.get_config()
  config.agent.tools = 'calculator'
  assert config.agent.format == 'gemma4'
  model, stand_in = models.build(config, sharding.make_mesh(config.mesh))
  # The packaged Gemma 3 tokenizer (the tiny models' stand-in) lacks them.
  with pytest.raises(ValueError, match="Gemma 4's own tokenizer"):
    episodes.from_config(config, rollout.Rollout(model, stand_in,
                                                 cache_size=32))
  config.model.source, config.model.path = 'hf', str(tmp_path)
  tok = gemma.load_tokenizer(config.model)
  sampler = rollout.Rollout(model, tok, cache_size=32)
  episode_rollout = episodes.from_config(config, sampler)
  try:
    # A row stops when it samples <|tool_response>, as at <turn|>.
    assert vocab['<|tool_response>'] in sampler.end_ids
    assert vocab['<turn|>'] in sampler.end_ids
    # What the host inserts after a call holds the pieces as single ids.
    results = [formats.Result('calculator', '12')]
    ids = tok.encode(formats.get('gemma4').render_results(results))
    assert ids.count(vocab['<|"|>']) == 2
    assert ids[-1] == vocab['<tool_response|>']
  finally:
    episode_rollout.close()
