"""Tests for agent_tunix.export: PEFT, merged Hugging Face and GGUF exports.

A tiny run (configs/tiny.py, LoRA rank 3) gets LoRA B weights that change
its outputs clearly and is saved as a checkpoint. Its exports are loaded back
through this project's own Hugging Face and GGUF loaders and must give the
trained policy's logits. Tolerance (float32 exports): max |difference| <=
2e-5 * max |logit|; the difference is float32 round-off from merging
W + (alpha / r) A B before the matmul instead of after (about 2e-6 relative
here), while the LoRA itself moves the logits by more than the largest logit.
The export and generate CLIs run on the checkpoint in subprocesses, started
early so they overlap the in-process tests.

Checked by hand outside this environment (torch, peft and llama.cpp are not
dependencies): transformers 5.12.1 + torch 2.14.1 load the merged export with
max |difference| 1.4e-6 (of max |logit| 0.63), peft 0.21.2 applies the
adapter to the merged base model with 1.1e-6, llama-cpp-python 0.3.36 runs
the tiny F32 GGUF with 5e-4 (llama.cpp approximates GELU with an F16 table)
and gives the 270M Q8_0 export the same greedy continuation as this project.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys
from typing import NamedTuple

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# pylint: disable=g-import-not-at-top
from flax import nnx
import gguf
import jax.numpy as jnp
import jinja2
import numpy as np
import pytest
import safetensors.numpy
import sentencepiece as spm

import gcs_emulator
from agent_tunix import export
from agent_tunix import export_template
from agent_tunix import generate
from agent_tunix import storage
from agent_tunix.data import prompts
from agent_tunix.models import gemma
from agent_tunix.models import gemma3_gguf
from agent_tunix.models import gemma3_hf
from agent_tunix.models import gguf as gguf_lib
from agent_tunix.models import lora
from agent_tunix.models import tokenizer as tokenizer_lib
from agent_tunix.run import checkpoint
from agent_tunix.run import train
from agent_tunix.configs import tiny
# pylint: enable=g-import-not-at-top

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# An odd rank, so that alpha / r is not a round number.
_CONFIG_ARG = 'model.lora_rank=3'
_STEP = 3
_REL_TOL = 2e-5
# Longer than the tiny model's sliding window (16), so the local attention
# mask matters.
_LENGTH = 40
_QUESTION = 'What is 2 + 3?'
_CHAT_TOKENS = 4


class Run(NamedTuple):
  config: object
  workdir: str
  session: object
  tokens: np.ndarray
  reference: np.ndarray  # Logits of the trained policy.
  base: np.ndarray  # Logits of the same backbone without LoRA.
  cli: subprocess.Popen
  cli_output: str
  cli_log: str
  chat: subprocess.Popen  # generate --workdir --interactive
  chat_log: str


@nnx.jit
def _logits(model, tokens, positions, mask):
  return model(tokens, positions, None, mask)[0]


def _forward(model, tokens, base=False):
  batch, length = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
  mask = jnp.broadcast_to(jnp.tril(jnp.ones((length, length), bool)),
                          (batch, length, length))
  if base:
    return np.asarray(nnx.jit(
        lambda m, t, p, k: lora.base_call(m, t, p, None, k)[0]
    )(model, tokens, positions, mask))
  return np.asarray(_logits(model, jnp.asarray(tokens), positions, mask))


def _env():
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env['PYTHONPATH'] = os.pathsep.join(
      p for p in (_REPO, env.get('PYTHONPATH')) if p)
  return env


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  """A tiny run whose non-zero LoRA is saved as checkpoint step _STEP."""
  workdir = str(tmp_path_factory.mktemp('run'))
  config = tiny.get_config(_CONFIG_ARG)
  session = train.setup(config, workdir)
  state = lora.lora_state(session.model)
  rng = np.random.default_rng(0)
  for path, var in nnx.to_flat_state(state):
    if str(path[-1]).endswith('_lora_b'):
      var[...] = jnp.asarray(0.05 * rng.standard_normal(var[...].shape),
                             var[...].dtype)
  nnx.update(session.model, state)
  ckpt = checkpoint.Checkpointer(workdir, config.checkpoint)
  train.save(ckpt, session, _STEP, force=True)
  ckpt.close()
  cli_output = os.path.join(workdir, 'cli_peft')
  cli_log = os.path.join(workdir, 'cli.log')
  with open(cli_log, 'w') as log:
    cli = subprocess.Popen(
        [sys.executable, '-m', 'agent_tunix.export',
         f'--config=configs/tiny.py:{_CONFIG_ARG}', f'--workdir={workdir}',
         '--format=peft', f'--output={cli_output}'],
        cwd=_REPO, env=_env(), stdout=subprocess.PIPE, stderr=log, text=True)
  chat_log = os.path.join(workdir, 'chat.log')
  with open(chat_log, 'w') as log:
    chat = subprocess.Popen(
        [sys.executable, '-m', 'agent_tunix.generate',
         f'--config=configs/tiny.py:{_CONFIG_ARG}', f'--workdir={workdir}',
         '--interactive', f'--max_new_tokens={_CHAT_TOKENS}'],
        cwd=_REPO, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=log, text=True)
  chat.stdin.write(_QUESTION + '\n\nexit\nnever read\n')
  chat.stdin.close()
  tokens = rng.integers(3, 5000, (2, _LENGTH))
  tokens[:, 0] = session.tokenizer.bos_id()
  yield Run(config, workdir, session, tokens,
            _forward(session.model, tokens),
            _forward(session.model, tokens, base=True), cli, cli_output,
            cli_log, chat, chat_log)
  for proc in (cli, chat):
    if proc.poll() is None:
      proc.kill()
      proc.wait()


@pytest.fixture(scope='module')
def policy(run):
  """(model, tokenizer, step) of the run, as saved (see the CLI test for the
  same exports from the checkpoint)."""
  return run.session.model, run.session.tokenizer, _STEP


@pytest.fixture(scope='module')
def merged_dir(run, policy, tmp_path_factory):
  model, tokenizer, step = policy
  path = str(tmp_path_factory.mktemp('exports') / 'merged')
  return export.export(model, tokenizer, run.config, 'merged', path,
                       step=step)


@pytest.fixture(scope='module')
def peft_dir(run, policy, tmp_path_factory):
  model, tokenizer, step = policy
  path = str(tmp_path_factory.mktemp('exports') / 'peft')
  return export.export(model, tokenizer, run.config, 'peft', path, step=step)


def _assert_same_logits(got, run):
  scale = np.abs(run.reference).max()
  # The LoRA matters: without it the logits are far off.
  assert np.abs(run.base - run.reference).max() > 0.5 * scale
  np.testing.assert_allclose(got, run.reference, rtol=0,
                             atol=_REL_TOL * scale)


def _model_cfg(run, **overrides):
  model_cfg = run.config.model.copy_and_resolve_references()
  for key, value in overrides.items():
    model_cfg[key] = value
  return model_cfg


def _hf_base_weights(model):
  """HF-named weights of the backbone (no LoRA)."""
  out = {}
  state = nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))
  for path, var in nnx.to_flat_state(state):
    name = '.'.join(map(str, path))
    out.update(gemma3_hf.hf_tensors(name, np.asarray(var[...], np.float32)))
  return out


# ------------------------------------------------------------- checkpoint


def test_missing_run_or_checkpoint(run, tmp_path):
  empty = str(tmp_path / 'empty_run')
  os.mkdir(empty)
  with pytest.raises(export.ExportError) as e:
    export.load_policy(run.config, empty)
  assert 'has no checkpoint' in str(e.value)
  assert '--allow_base' in str(e.value)
  assert not os.listdir(empty)  # Nothing was created in it.
  missing = str(tmp_path / 'no_such_run')
  with pytest.raises(export.ExportError, match='no_such_run.*does not exist'):
    export.load_policy(run.config, missing)
  with pytest.raises(export.ExportError, match='--allow_base'):
    export.load_policy(run.config, None)
  with pytest.raises(export.ExportError, match=r'--step=9.*\[3\]'):
    export.load_policy(run.config, run.workdir, step=9)


# ----------------------------------------------------------------- merged


def test_merged_export_round_trips_through_the_hf_loader(run, merged_dir):
  assert sorted(os.listdir(merged_dir)) == [
      'README.md', 'config.json', 'generation_config.json',
      'model.safetensors', 'special_tokens_map.json', 'tokenizer.model',
      'tokenizer_config.json']
  model = gemma.load_model(_model_cfg(run, source='hf', path=merged_dir),
                           run.session.mesh)
  _assert_same_logits(_forward(model, run.tokens), run)


def test_merged_config(run, merged_dir):
  with open(os.path.join(merged_dir, 'config.json')) as f:
    config = json.load(f)
  cfg = gemma.model_config(run.config.model)
  assert config['architectures'] == ['Gemma3ForCausalLM']
  assert config['model_type'] == 'gemma3_text'
  expected = {
      'vocab_size': cfg.num_embed, 'hidden_size': cfg.embed_dim,
      'intermediate_size': cfg.hidden_dim, 'num_hidden_layers': 2,
      'num_attention_heads': 2, 'num_key_value_heads': 1, 'head_dim': 16,
      'sliding_window': 16, 'query_pre_attn_scalar': 16,
      'rope_theta': 1e6, 'rope_local_base_freq': 1e4, 'rope_scaling': None,
      'rms_norm_eps': 1e-6, 'tie_word_embeddings': True,
      'layer_types': ['sliding_attention', 'sliding_attention'],
      'bos_token_id': 2, 'eos_token_id': 1, 'pad_token_id': 0,
  }
  assert {k: config[k] for k in expected} == expected


def test_layer_types_follow_the_tunix_pattern():
  seven = gemma3_hf.layer_types(
      dataclasses.replace(gemma.tiny_config(), num_layers=7))
  assert seven == ['sliding_attention'] * 5 + ['full_attention',
                                                'sliding_attention']


def test_merged_tokenizer_files(run, merged_dir):
  tok = spm.SentencePieceProcessor(
      model_file=os.path.join(merged_dir, 'tokenizer.model'))
  text = 'The capital of France is <start_of_turn>user\nParis? 1234 ünïcode'
  assert tok.encode(text) == run.session.tokenizer.encode(text)
  with open(os.path.join(merged_dir, 'tokenizer_config.json')) as f:
    tok_config = json.load(f)
  with open(os.path.join(merged_dir, 'special_tokens_map.json')) as f:
    special = json.load(f)
  assert special == {'bos_token': '<bos>', 'eos_token': '<eos>',
                     'unk_token': '<unk>', 'pad_token': '<pad>'}
  assert tok_config['tokenizer_class'] == 'GemmaTokenizer'
  assert tok_config['add_bos_token'] and not tok_config['add_eos_token']
  # tiny uses chat turns: the Jinja template gives exactly the training
  # prompt (with BOS in front, which the encoder adds in this project).
  assert tok_config['chat_template'] == export_template.chat_template(
      run.config)
  rendered = jinja2.Environment().from_string(
      tok_config['chat_template']).render(
          messages=[{'role': 'user', 'content': 'What is 2 + 3?'}],
          add_generation_prompt=True, bos_token='<bos>')
  assert rendered == '<bos>' + prompts.format_prompt('What is 2 + 3?',
                                                     run.config, 'gemma3')
  with open(os.path.join(merged_dir, 'generation_config.json')) as f:
    assert json.load(f)['eos_token_id'] == [1, 106]


def test_merged_config_loads_in_transformers(merged_dir):
  transformers = pytest.importorskip('transformers')
  config = transformers.AutoConfig.from_pretrained(merged_dir)
  assert type(config).__name__ == 'Gemma3TextConfig'
  assert config.layer_types == ['sliding_attention', 'sliding_attention']
  assert config.sliding_window == 16
  assert config.query_pre_attn_scalar == 16


# One export per prompt shape: chat turns, the few-shot plain prompt of a
# pretrained preset, and a tool run's tool list and worked episodes.
_PROMPT_SHAPES = {
    'chat': '',
    'plain': ',data.template=plain',
    'tools': ',data.template=plain,agent.tools=calculator',
}


@pytest.fixture(scope='module')
def shape_exports(run, policy, tmp_path_factory):
  """{shape: (config, merged export directory)}."""
  model, tokenizer, step = policy
  out = {}
  for shape, arg in _PROMPT_SHAPES.items():
    config = tiny.get_config(_CONFIG_ARG + arg)
    path = str(tmp_path_factory.mktemp('shapes') / shape)
    out[shape] = config, export.export(model, tokenizer, config, 'merged',
                                       path, step=step, dtype='bfloat16')
  return out


def test_apply_chat_template_gives_the_training_prompt(run, shape_exports):
  """transformers' apply_chat_template on each exported directory: the
  prompt text and token ids the trainer builds for the question."""
  transformers = pytest.importorskip('transformers')
  # Loading converts the 262k-piece vocabulary (tens of seconds): once.
  hf_tokenizer = transformers.AutoTokenizer.from_pretrained(
      shape_exports['tools'][1])
  tokenizer = run.session.tokenizer
  messages = [{'role': 'user', 'content': _QUESTION}]
  for shape, (config, directory) in shape_exports.items():
    with open(os.path.join(directory, 'tokenizer_config.json')) as f:
      template = json.load(f)['chat_template']
    prompt = prompts.format_prompt(_QUESTION, config, 'gemma3')
    text = hf_tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=False,
        add_generation_prompt=True)
    assert text == '<bos>' + prompt, shape
    ids = hf_tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=True,
        add_generation_prompt=True)['input_ids']
    assert list(ids) == [tokenizer.bos_id(), *tokenizer.encode(prompt)], shape
  assert hf_tokenizer.chat_template == template  # The tools directory's own.


def test_merged_export_in_transformers(run, merged_dir):
  """Needs torch, which this project does not install: skipped without it.

  Checked by hand (see the module docstring).
  """
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  model = transformers.AutoModelForCausalLM.from_pretrained(
      merged_dir, dtype=torch.float32)
  with torch.no_grad():
    got = model(torch.tensor(run.tokens), use_cache=False).logits.numpy()
  _assert_same_logits(got, run)


# ------------------------------------------------------------------- PEFT


def test_peft_adapter_reconstructs_the_merged_weights(run, policy, peft_dir,
                                                      merged_dir):
  assert sorted(os.listdir(peft_dir)) == [
      'README.md', 'adapter_config.json', 'adapter_model.safetensors']
  with open(os.path.join(peft_dir, 'adapter_config.json')) as f:
    config = json.load(f)
  assert config['peft_type'] == 'LORA'
  assert config['task_type'] == 'CAUSAL_LM'
  assert config['r'] == 3
  assert config['lora_alpha'] == 8
  assert not config['use_rslora']
  assert config['target_modules'] == [
      'down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj',
      'v_proj']
  adapter = safetensors.numpy.load_file(
      os.path.join(peft_dir, 'adapter_model.safetensors'))
  merged = safetensors.numpy.load_file(
      os.path.join(merged_dir, 'model.safetensors'))
  base = _hf_base_weights(policy[0])
  scale = config['lora_alpha'] / config['r']  # PEFT's scaling.
  modules = [f'self_attn.{p}_proj' for p in 'qkvo'] + [
      f'mlp.{p}_proj' for p in ('gate', 'up', 'down')]
  expected_names = set()
  for layer in range(2):
    for module in modules:
      prefix = f'base_model.model.model.layers.{layer}.{module}'
      expected_names |= {prefix + '.lora_A.weight', prefix + '.lora_B.weight'}
      a, b = adapter[prefix + '.lora_A.weight'], adapter[prefix +
                                                         '.lora_B.weight']
      weight = f'model.layers.{layer}.{module}.weight'
      out_features, in_features = base[weight].shape
      assert a.shape == (3, in_features), prefix
      assert b.shape == (out_features, 3), prefix
      np.testing.assert_allclose(
          base[weight] + scale * b @ a, merged[weight], rtol=0, atol=1e-6,
          err_msg=prefix)
      # The adapter changes every weight it targets.
      assert np.abs(b @ a).max() > 1e-3, prefix
  assert set(adapter) == expected_names


@pytest.mark.parametrize('sub, a_shape, b_shape', [
    ('attn.q_einsum.w', (8, 3), (3, 2, 4)),
    ('attn.kv_einsum.w', (8, 3), (3, 2, 1, 4)),
    ('attn.qkv_einsum.w', (8, 3), (3, 3, 2, 4)),
    ('attn.attn_vec_einsum.w', (2, 4, 3), (3, 8)),
    ('mlp.gate_proj.kernel', (8, 3), (3, 12)),
    ('mlp.down_proj.kernel', (12, 3), (3, 8)),
])
def test_peft_factors_give_the_merged_delta(sub, a_shape, b_shape):
  """B A of every PEFT factor pair is the HF layout of the tunix delta A B.

  Covers the stacked qkv_einsum (num_heads == num_kv_heads), which no
  Gemma 3 preset uses.

  Args:
    sub: the adapted tunix weight.
    a_shape: qwix's LoRA A shape for it (D=8, N=2, K=1, H=4, F=12, r=3).
    b_shape: qwix's LoRA B shape.
  """
  rng = np.random.default_rng(2)
  a = rng.standard_normal(a_shape).astype(np.float32)
  b = rng.standard_normal(b_shape).astype(np.float32)
  weight = 'layers.5.' + sub
  hf = dict(gemma3_hf.hf_tensors(weight, export.lora_delta(weight, a, b)))
  factors = export.peft_factors(weight, a, b)
  names = [f'model.layers.5.{module}.weight' for module, _, _ in factors]
  assert sorted(names) == sorted(hf)
  for module, lora_a, lora_b in factors:
    assert lora_a.shape[0] == 3 and lora_b.shape[1] == 3
    np.testing.assert_allclose(lora_b @ lora_a,
                               hf[f'model.layers.5.{module}.weight'],
                               rtol=1e-5, atol=1e-5, err_msg=module)


def test_peft_names_of_multimodal_checkpoints():
  assert export.peft_prefix('gemma3_1b_it') == 'base_model.model.model.layers.'
  assert export.peft_prefix('gemma3_4b_it') == (
      'base_model.model.model.language_model.layers.')
  regex = export.peft_target_modules(
      'gemma3_4b_it', {'self_attn.q_proj', 'mlp.up_proj'})
  assert re.fullmatch(regex, 'model.language_model.layers.12.self_attn.q_proj')
  assert re.fullmatch(regex, 'model.language_model.layers.0.mlp.up_proj')
  assert not re.fullmatch(
      regex, 'model.vision_tower.encoder.layers.0.self_attn.q_proj')
  assert not re.fullmatch(regex, 'model.language_model.layers.0.mlp.down_proj')


def test_peft_adapter_in_peft(run, policy, peft_dir, tmp_path):
  """Needs torch and peft, which this project does not install.

  Checked by hand (see the module docstring).
  """
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  peft = pytest.importorskip('peft')
  model, tokenizer, _ = policy
  base_model = nnx.clone(model)
  state = lora.lora_state(base_model)
  for path, var in nnx.to_flat_state(state):
    if str(path[-1]).endswith('_lora_b'):
      var[...] = jnp.zeros_like(var[...])
  nnx.update(base_model, state)
  base_dir = export.export(base_model, tokenizer, run.config, 'merged',
                           str(tmp_path / 'base'))
  hf = transformers.AutoModelForCausalLM.from_pretrained(
      base_dir, dtype=torch.float32)
  adapted = peft.PeftModel.from_pretrained(hf, peft_dir)
  with torch.no_grad():
    got = adapted(input_ids=torch.tensor(run.tokens),
                  use_cache=False).logits.numpy()
  _assert_same_logits(got, run)


def test_export_to_gcs_uploads_the_same_files(run, policy, peft_dir,
                                              merged_dir, monkeypatch,
                                              tmp_path):
  model, tokenizer, step = policy
  with gcs_emulator.emulator('agent-tunix-export') as gcs:
    monkeypatch.setenv('STORAGE_EMULATOR_HOST', gcs.url)
    output = f'gs://{gcs.bucket}/exports/peft'
    assert export.export(model, tokenizer, run.config, 'peft', output,
                         step=step) == output
    for name in sorted(os.listdir(peft_dir)):
      with open(os.path.join(peft_dir, name), 'rb') as f:
        assert storage.read_bytes(f'{output}/{name}') == f.read(), name
    assert len(gcs.list('exports/peft/')) == len(os.listdir(peft_dir))
    with pytest.raises(export.ExportError, match='already exists'):
      export.export(model, tokenizer, run.config, 'peft', output, step=step)
    # A Hugging Face checkpoint on gs:// loads (copied once into the cache).
    storage.upload(merged_dir, f'gs://{gcs.bucket}/hf')
    model_cfg = _model_cfg(run, source='hf', path=f'gs://{gcs.bucket}/hf',
                           cache_dir=str(tmp_path / 'cache'))
    loaded = gemma.load_model(model_cfg, run.session.mesh)
    _assert_same_logits(_forward(loaded, run.tokens), run)
    assert gemma.load_tokenizer(model_cfg).encode('2 + 3') == (
        tokenizer.encode('2 + 3'))
    seen = len(gcs.proxy.requests)
    gemma.load_model(model_cfg, run.session.mesh)  # From the cache.
    assert len(gcs.proxy.requests) == seen


def test_peft_needs_lora(run, policy, tmp_path):
  config = tiny.get_config('model.lora_rank=0')
  with pytest.raises(export.ExportError, match='lora_rank is 0'):
    export.export(policy[0], policy[1], config, 'peft', str(tmp_path / 'p'))
  assert not os.listdir(tmp_path)  # No partial output is left behind.


# ------------------------------------------------------------------- GGUF


def test_gguf_export_round_trips_through_the_gguf_loader(run, policy,
                                                         tmp_path):
  model, tokenizer, step = policy
  path = export.export(model, tokenizer, run.config, 'gguf',
                       str(tmp_path / 'model.gguf'), step=step)
  loaded = gemma.load_model(
      _model_cfg(run, source='gguf', path=path,
                 cache_dir=str(tmp_path / 'cache')), run.session.mesh)
  _assert_same_logits(_forward(loaded, run.tokens), run)
  # The vocabulary is the source GGUF's, as llama.cpp wrote it.
  source = tokenizer_lib.read_gguf_vocab(gguf_lib.default_path())
  written = tokenizer_lib.read_gguf_vocab(path)
  assert written.tokens == source.tokens
  np.testing.assert_array_equal(written.scores, source.scores)
  np.testing.assert_array_equal(written.token_types, source.token_types)
  assert written.special_ids == source.special_ids
  meta = gguf_lib.open_reader(path).metadata
  assert meta['general.architecture'] == 'gemma3'
  assert _gguf_chat_template(path) == export_template.chat_template(
      run.config)
  assert meta['gemma3.attention.sliding_window'] == 16
  assert meta['gemma3.rope.freq_base'] == 1e6
  assert meta['gemma3.context_length'] == 32768


def _gguf_chat_template(path):
  """A GGUF file's tokenizer.chat_template, read without the vocabulary."""
  with open(path, 'rb') as f:
    buf = f.read()
  parser = gguf_lib.MetadataParser(buf, path)
  for _ in range(parser.header()):
    key = parser.string()
    (value_type,) = parser.unpack('I')
    value = parser.value(value_type, key == 'tokenizer.chat_template')
    if key == 'tokenizer.chat_template':
      return value
  return None


def test_every_gguf_export_carries_the_training_prompt(run, policy,
                                                       tmp_path):
  """The few-shot prompt of a pretrained preset too (it had none)."""
  model, tokenizer, step = policy
  config = tiny.get_config(_CONFIG_ARG + ',data.template=plain')
  path = export.export(model, tokenizer, config, 'gguf',
                       str(tmp_path / 'plain.gguf'), step=step,
                       gguf_dtype='q8_0')
  template = _gguf_chat_template(path)
  rendered = jinja2.Environment().from_string(template).render(
      messages=[{'role': 'user', 'content': _QUESTION}],
      add_generation_prompt=True, bos_token='<bos>')
  assert rendered == '<bos>' + prompts.format_prompt(_QUESTION, config,
                                                     'gemma3')
  assert rendered.endswith('Question: What is 2 + 3?\nAnswer:\n')


@pytest.mark.parametrize('gguf_dtype', gemma3_gguf.GGUF_DTYPES)
def test_gguf_writer_round_trip(tmp_path, gguf_dtype):
  """Every tensor type, read by gguf-py's GGUFReader and this project's loader.

  A 256-piece vocabulary keeps GGUFReader fast (it takes tens of seconds on
  Gemma's 262k pieces).

  Args:
    tmp_path: pytest's temporary directory.
    gguf_dtype: the tensor type written.
  """
  cfg = dataclasses.replace(gemma.tiny_config(), num_embed=256)
  rng = np.random.default_rng(1)
  flat = {
      '.'.join(map(str, path)): rng.standard_normal(
          var.shape).astype(np.float32)
      for path, var in nnx.to_flat_state(
          nnx.state(gemma.abstract_model(cfg), nnx.Param))
  }
  tensors = [(gemma3_gguf.gguf_name(hf_name), x) for name, w in flat.items()
             for hf_name, x in gemma3_hf.hf_tensors(name, w)]
  vocab = tokenizer_lib.GGUFVocab(
      tokens=['<pad>', '<eos>', '<bos>', '<unk>'] + [
          f'piece{i}' for i in range(4, 256)],
      scores=-np.arange(256, dtype=np.float32),
      token_types=np.array([3, 3, 3, 2] + [1] * 252, np.int32),
      special_ids={'pad': 0, 'eos': 1, 'bos': 2, 'unk': 3}, digest='')
  path = str(tmp_path / 'small.gguf')
  gemma3_gguf.write_gguf_file(
      path, cfg, tensors, vocab, gguf_dtype, name='small',
      chat_template=gemma3_hf.CHAT_TEMPLATE)

  reader = gguf.GGUFReader(path)
  assert reader.fields['general.architecture'].contents() == 'gemma3'
  assert reader.fields['gemma3.block_count'].contents() == 2
  assert reader.fields['tokenizer.ggml.tokens'].contents() == vocab.tokens
  assert reader.fields['tokenizer.chat_template'].contents() == (
      gemma3_hf.CHAT_TEMPLATE)
  q = gguf.GGMLQuantizationType
  types = {t.name: t.tensor_type for t in reader.tensors}
  assert len(types) == 2 + 13 * 2
  assert types['blk.1.attn_norm.weight'] == q.F32
  assert types['blk.1.ffn_down.weight'] == {
      'f32': q.F32, 'f16': q.F16, 'q8_0': q.Q8_0}[gguf_dtype]
  # llama.cpp stores 1 + w for every RMSNorm weight.
  norm = next(t for t in reader.tensors if t.name == 'output_norm.weight')
  np.testing.assert_allclose(np.asarray(norm.data),
                             flat['final_norm.scale'] + 1, rtol=1e-6)

  got = gguf_lib.load_params(path, cfg)
  assert sorted(got) == sorted(flat)
  for name, want in flat.items():
    # F16 keeps 11 significant bits; Q8_0 steps are (max of 32) / 127.
    rel = {'f32': 1e-6, 'f16': 2**-10, 'q8_0': 1 / 127}[gguf_dtype]
    np.testing.assert_allclose(got[name], want, rtol=0,
                               atol=rel * np.abs(want).max(), err_msg=name)
  assert tokenizer_lib.read_gguf_vocab(path).tokens == vocab.tokens


# ----------------------------------------------------------------- output


def test_existing_output_is_kept_without_overwrite(run, policy, merged_dir,
                                                   tmp_path):
  model, tokenizer, _ = policy
  before = {n: os.path.getmtime(os.path.join(merged_dir, n))
            for n in os.listdir(merged_dir)}
  with pytest.raises(export.ExportError) as e:
    export.export(model, tokenizer, run.config, 'merged', merged_dir)
  assert merged_dir in str(e.value) and '--overwrite' in str(e.value)
  assert {n: os.path.getmtime(os.path.join(merged_dir, n))
          for n in os.listdir(merged_dir)} == before
  # Something that is not an earlier export is not replaced either.
  other = tmp_path / 'notes'
  other.mkdir()
  (other / 'keep.txt').write_text('mine')
  with pytest.raises(export.ExportError, match='not an earlier merged'):
    export.export(model, tokenizer, run.config, 'merged', str(other),
                  overwrite=True)
  assert (other / 'keep.txt').read_text() == 'mine'
  with pytest.raises(export.ExportError, match='is a directory'):
    export.export(model, tokenizer, run.config, 'gguf', str(other),
                  overwrite=True)
  with pytest.raises(export.ExportError, match="'zip' is not one of"):
    export.export(model, tokenizer, run.config, 'zip', str(tmp_path / 'z'))


def test_overwrite_replaces_an_earlier_export(run, policy, tmp_path):
  model, tokenizer, _ = policy
  path = str(tmp_path / 'adapter')
  export.export(model, tokenizer, run.config, 'peft', path)
  with open(os.path.join(path, 'stale.txt'), 'w') as f:
    f.write('from an older export')
  export.export(model, tokenizer, run.config, 'peft', path, overwrite=True)
  assert 'stale.txt' not in os.listdir(path)
  assert not [n for n in os.listdir(tmp_path) if n.startswith('.')]


# -------------------------------------------------------------------- CLI


def test_cli_exports_the_checkpoint(run, peft_dir):
  """The CLI restores the checkpoint into a fresh model: same adapter."""
  out, _ = run.cli.communicate(timeout=900)
  with open(run.cli_log) as f:
    log = f.read()
  assert run.cli.returncode == 0, log[-3000:]
  assert out.strip().splitlines()[-1] == os.path.abspath(run.cli_output)
  got = safetensors.numpy.load_file(
      os.path.join(run.cli_output, 'adapter_model.safetensors'))
  want = safetensors.numpy.load_file(
      os.path.join(peft_dir, 'adapter_model.safetensors'))
  assert sorted(got) == sorted(want)
  for name in want:
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  with open(os.path.join(run.cli_output, 'README.md')) as f:
    assert f'step {_STEP}' in f.read()
  # A second run refuses to replace the output, before loading anything.
  again = subprocess.run(
      [sys.executable, '-m', 'agent_tunix.export',
       f'--config=configs/tiny.py:{_CONFIG_ARG}', f'--workdir={run.workdir}',
       '--format=peft', f'--output={run.cli_output}'],
      cwd=_REPO, env=_env(), capture_output=True, text=True, timeout=300,
      check=False)
  assert again.returncode != 0
  assert run.cli_output in again.stderr
  assert '--overwrite' in again.stderr


def test_generate_cli_answers_with_the_trained_lora(run):
  out = run.chat.stdout.read()  # Its stdin is already written and closed.
  run.chat.wait(timeout=900)
  with open(run.chat_log) as f:
    log = f.read()
  assert run.chat.returncode == 0, log[-3000:]
  assert f'LoRA of step {_STEP}' in log
  # One answer: the empty line is skipped, 'exit' ends the loop.
  (answer,) = out.splitlines()
  want, _ = generate.Generator(run.session.model, run.session.tokenizer)(
      prompts.format_prompt(_QUESTION, run.config, 'gemma3'), _CHAT_TOKENS)
  assert answer == want.replace('\\', '\\\\').replace('\n', '\\n')


def test_gguf_overwrite_replaces_only_a_gguf_file(tmp_path):
  notes = tmp_path / 'notes.txt'
  notes.write_text('my notes')
  with pytest.raises(export.ExportError) as e:
    export.check_output(str(notes), 'gguf', overwrite=True)
  assert str(notes) in str(e.value) and 'not an earlier gguf' in str(e.value)
  assert notes.read_text() == 'my notes'
  earlier = tmp_path / 'model.gguf'
  earlier.write_bytes(export.GGUF_MAGIC + b'\x03\x00\x00\x00rest')
  export.check_output(str(earlier), 'gguf', overwrite=True)  # Allowed.
