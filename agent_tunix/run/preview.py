"""The first training prompts of a run, as the model sees them, no weights.

`print_prompts(config, count)` (`python -m agent_tunix.main
--print_prompts=N`) writes the first `count` prompts of the train batches
(the order of a one-process run), each verbatim after a header line with its
token count against generation.max_prompt_length, and how many longer
prompts are dropped.

The count needs the tokenizer, not the weights (`load_tokenizer`): a GGUF's
vocabulary is read from the file's metadata (a gs:// GGUF is first copied
whole into model.cache_dir, as a run does); a Hugging Face repo id or a
Kaggle handle downloads only the tokenizer file; local directories,
model.tokenizer_path and Orbax checkpoints read the tokenizer file beside the
weights.
"""

import os
import sys

from agent_tunix import storage
from agent_tunix.data import gsm8k
from agent_tunix.data import pipeline
from agent_tunix.models import families
from agent_tunix.models import gemma
from agent_tunix.models import tokenizer as tokenizer_lib

# Tokenizer files of a Hugging Face repo, in the order tried (Gemma 4's
# repos ship only tokenizer.json).
_HF_TOKENIZER_FILES = ('tokenizer.model', 'tokenizer.json')


def _hf_tokenizer(repo_id):
  # pylint: disable=g-import-not-at-top
  import huggingface_hub
  from huggingface_hub import errors as hub_errors
  # pylint: enable=g-import-not-at-top
  for name in _HF_TOKENIZER_FILES:
    try:
      local = huggingface_hub.hf_hub_download(repo_id, name)
    except hub_errors.EntryNotFoundError:
      continue
    if name.endswith('.json'):
      return tokenizer_lib.JsonTokenizer(local)
    return tokenizer_lib.load_sentencepiece(local)
  raise FileNotFoundError(
      f'Hugging Face repo {repo_id!r} has none of {_HF_TOKENIZER_FILES}; set '
      'model.tokenizer_path.')


def load_tokenizer(model_cfg):
  """The tokenizer of `config.model`, without reading its weights."""
  source, path = model_cfg.source, model_cfg.path
  hub_id = not (os.path.exists(path) or storage.is_remote(path)
                or path.startswith(('/', '.')))
  if model_cfg.tokenizer_path or not hub_id:
    return gemma.load_tokenizer(model_cfg)
  if source == 'hf':
    return _hf_tokenizer(path)
  if source == 'kaggle':
    import kagglehub  # pylint: disable=g-import-not-at-top
    return tokenizer_lib.load_sentencepiece(
        kagglehub.model_download(path, path='tokenizer.model'))
  return gemma.load_tokenizer(model_cfg)


def every_row(config):
  """`config` that shows the prompts also of data a run would refuse.

  A question whose answer has no number cannot train on the math rewards,
  so a run refuses (or skips) it; its prompt is still worth seeing. A file
  with fewer prompts than a batch is refused by a run, not here: batches of
  one give the same prompts in the same order (the shuffle is of the rows).
  A single file too small to hold out data.num_eval_examples rows shows
  every row.
  """
  shown = config.copy_and_resolve_references()
  with shown.unlocked():
    shown.data.bad_rows = gsm8k.KEEP_BAD_ROWS
    shown.training.batch_size = 1
  return shown


def _header(number, total, length, limit):
  return (f'--- train prompt {number} of {total}: {length} of '
          f'generation.max_prompt_length={limit} tokens (BOS included) ---')


def print_prompts(config, count, out=sys.stdout, tokenizer=None):
  """Writes the first `count` train prompts and their token counts.

  Args:
    config: the run's config.
    count: how many prompts (>= 1).
    out: where to write.
    tokenizer: the model's tokenizer (None: `load_tokenizer`).
  """
  tokenizer = tokenizer or load_tokenizer(config.model)
  turns = families.of_preset(config.model.preset).tool_format
  local = config.copy_and_resolve_references()
  local.data.worker_count = 0  # Read in this process: a few batches only.
  batches, stats = pipeline.make_train_iterator(local, tokenizer, turns=turns)
  limit = config.generation.max_prompt_length
  total, shown = stats['num_train_examples'], 0
  for batch in batches:
    for prompt, mask in zip(batch['prompt'], batch['prompt_mask']):
      if shown == count:
        break
      shown += 1
      out.write(_header(shown, total, int(mask.sum()), limit) + '\n')
      # Verbatim: a final newline of the prompt is the one before the next
      # header; a prompt without one gets a marked line break.
      out.write(prompt if prompt.endswith('\n') else
                prompt + '\n(no newline at the end of the prompt)\n')
    if shown == count:
      break
  if stats['dropped_long_prompts']:
    out.write(
        f"--- {stats['dropped_long_prompts']} of {stats['num_examples']} "
        f'train prompts are longer than generation.max_prompt_length={limit} '
        'tokens and are left out of training ---\n')
  out.flush()
