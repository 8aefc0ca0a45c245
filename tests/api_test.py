"""The notebook flow of agent_tunix.api on the tiny model, end to end."""

import io
import json
import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# pylint: disable=g-import-not-at-top
from flax import nnx
import numpy as np
import pytest

from agent_tunix import api
from agent_tunix import generate
from agent_tunix.data import prompts
from agent_tunix.models import lora
from agent_tunix.rl import evaluation
from agent_tunix.run import lock as run_lock
from agent_tunix.configs import tiny
# pylint: enable=g-import-not-at-top


def _lora_arrays(model):
  return {path: np.asarray(var[...])
          for path, var in nnx.to_flat_state(lora.lora_state(model))}


def test_prepare_train_evaluate_ask_export(tmp_path):
  config = tiny.get_config('training.num_steps=1,eval.pass_at_k=0')
  workdir = str(tmp_path / 'run')
  session = api.prepare(config, workdir)
  before = _lora_arrays(session.model)

  # Another run holds the workdir: refused at once, nothing trained.
  other = run_lock.Lock(workdir).acquire()
  with pytest.raises(run_lock.LockedError):
    api.train(session)
  other.release()
  assert not os.path.exists(os.path.join(workdir, 'checkpoints'))

  result = api.train(session)
  assert result['step'] == 1
  assert not result['preempted']
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['1']
  after = _lora_arrays(session.model)
  assert any(not np.array_equal(after[k], before[k]) for k in before)

  # Greedy evaluation is deterministic: the same scores as the final eval.
  scores = api.evaluate(session)
  assert scores == result['eval']
  assert set(scores) == {'accuracy', 'accuracy_stderr', 'format_accuracy',
                         'format_accuracy_stderr'}

  # ask() is the greedy completion of the run's prompt for the question.
  example = session.eval_set[0]
  _, texts, _ = evaluation.evaluate(
      session.sampler, session.tokenizer, session.eval_set[:1], config)
  assert api.ask(session, example['question']) == texts[0]
  with pytest.raises(ValueError, match='max_prompt_length=224'):
    api.ask(session, 'why? ' * 200)
  with pytest.raises(ValueError, match='kv_cache_size=256'):
    api.ask(session, 'Hi', max_new_tokens=1000)

  path = api.export(session, 'peft', str(tmp_path / 'adapter'))
  with open(os.path.join(path, 'adapter_config.json')) as f:
    assert json.load(f)['r'] == config.model.lora_rank
  with open(os.path.join(path, 'README.md')) as f:
    assert 'checkpoint step 1' in f.read()



def test_interactive_loop_formats_and_stops():
  config = tiny.get_config()  # Chat turns.
  out = io.StringIO()
  count = generate.interact(
      lambda text: f'[{text}]\nsecond line', ['  What is 2 + 3?\n', '\n',
                                              'exit\n', 'never read\n'],
      out, config)
  assert count == 1
  want = '[' + prompts.format_prompt('What is 2 + 3?', config,
                                     'gemma3') + ']'
  assert out.getvalue() == want.replace('\n', '\\n') + '\\nsecond line\n'


def test_model_input_templates():
  chat = tiny.get_config()
  plain = tiny.get_config('data.template=plain')
  question = 'What is 2 + 3?'
  assert generate.model_input(question, chat, 'auto', True) == (
      prompts.chat_prompt(question, chat.data.system_prompt.strip()))
  # --prompt and pretrained (plain) configs get the text as given...
  assert generate.model_input(question, chat, 'auto', False) == question
  assert generate.model_input(question, plain, 'auto', True) == question
  # ... unless asked for the training template, or never formatted.
  assert generate.model_input(question, plain, 'train', False) == (
      prompts.plain_prompt(question, plain.data.system_prompt.strip()))
  assert generate.model_input(question, chat, 'raw', True) == question
