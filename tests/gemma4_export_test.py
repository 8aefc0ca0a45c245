"""Gemma 4 export: train, export to Hugging Face, reload, same log-probs.

The acceptance path runs the commands a user runs: configs/tiny_gemma4.py
trains 2 steps (main), the export CLI writes the merged Hugging Face
directory from the checkpoint, and the directory loads back through the
Hugging Face loader (`model.source='hf'`) with the trained policy's
log-probs. In process, both tiny configs (dense and MoE) with large random
LoRA adapters round-trip through the merged and PEFT layouts.
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
from agent_tunix.models import lora
from agent_tunix.rl import logprobs
from agent_tunix.tpu import sharding
from configs import tiny_gemma4
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
      ['agent_tunix.main', '--config=configs/tiny_gemma4.py',
       f'--workdir={workdir}'],
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


@pytest.mark.parametrize('preset', ['tiny_gemma4', 'tiny_gemma4_moe'])
def test_merged_and_peft_layouts(preset, tmp_path):
  config = tiny_gemma4.get_config(f'model.preset={preset},model.lora_rank=3')
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
  # PEFT: each factor pair rebuilds the merged weight's delta.
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
  with pytest.raises(export.ExportError, match='Gemma 4'):
    export.export(model, tokenizer, config, 'gguf', str(tmp_path / 'x.gguf'))


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


def test_tiny_moe_trains_two_steps_and_logs_expert_load(tmp_path):
  done = subprocess.run(
      [sys.executable, '-m', 'agent_tunix.main',
       '--config=configs/tiny_gemma4.py:model.preset=tiny_gemma4_moe',
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
