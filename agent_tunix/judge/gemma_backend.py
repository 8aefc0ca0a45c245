"""judge.backend='gemma': a frozen Gemma in this process judges each item.

No text is generated and no second cluster is needed: for every
(completion, rubric item) pair the judge reads one prompt,

  Question: ... / Reference answer: ... / Response: ... / Criterion: ...
  Does the response meet the criterion? Answer yes or no.
  Answer:

(or `judge.prompt_file`'s, with {question}, {reference}, {response} and
{criterion}) and the item's probability of being met is P(yes) / (P(yes) +
P(no)) of the next token (' yes', ' Yes' against ' no', ' No'), read from
one forward pass. Pairs go through the model `judge.batch_size` at a time,
left-padded to a power-of-two length (at least 64), so a run compiles one
program per length bucket. The score is explicit's with the
probabilities in place of verdicts, S = sum(w * p) / sum(positive w),
clipped to [-1, 1]; an item counts as met (pass rates) when p > 0.5.

The judge's weights are the policy's base weights with LoRA off (the
default), or a preset of their own (judge.preset / judge.source /
judge.path), loaded by the project's loader on the policy's mesh.
"""

import time

from absl import logging
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
from flax import nnx
import numpy as np

from agent_tunix.data import pipeline
from agent_tunix.judge import prompts
from agent_tunix.judge import verdicts as verdicts_lib
from agent_tunix.models import families
from agent_tunix.models import gemma4 as gemma4_lib
from agent_tunix.rl import grpo
from agent_tunix.rl import logprobs
from agent_tunix.tpu import sharding

_YES = (' yes', ' Yes')
_NO = (' no', ' No')
_MIN_BUCKET = 64
# The longest prompt a pair may have; longer responses are cut first.
MAX_PROMPT_TOKENS = 2048


_ITEM_PROMPT = ('Question: {question}\n'
                'Reference answer: {reference}\n'
                'Response: {response}\n'
                'Criterion: {criterion}\n'
                'Does the response meet the criterion? Answer yes or no.\n'
                'Answer:')


def item_prompt(task, item_text, template=None):
  """The prompt asking whether one item holds (ends where 'yes' goes):
  `template` (judge.prompt_file's text) or the built-in one."""
  return prompts.fill(template or _ITEM_PROMPT, dict(
      question=task['question'], reference=task['reference'] or 'none',
      response=task['response'], criterion=item_text))


def _answer_logps(graphdefs, state, tokens, mask, ids, use_lora):
  """[B, len(ids)] next-token log-probs of `ids` after each prompt row."""
  module = nnx.merge(graphdefs[0], state, copy=True)
  hidden = logprobs.final_hidden_states(module, tokens, mask,
                                        use_lora=use_lora)[:, -1]
  embedding = module.embedder.input_embedding[...]
  logits = jnp.einsum('bd,vd->bv', hidden, embedding,
                      preferred_element_type=jnp.float32)
  logits = gemma4_lib.apply_softcap(
      logits, families.of_config(module.config).final_logit_softcap)
  return jax.nn.log_softmax(logits, axis=-1)[:, ids]


_ANSWER_LOGPS = grpo.GraphJit(_answer_logps, static_argnames=('use_lora',))


def answer_logps_program(model):
  """(jitted fn, model state): fn(state, tokens [B, L], mask [B, L],
  ids [K], use_lora=) -> [B, K] log-probs of the next token. The program
  the judge runs; the preflight compiles it."""
  graphdef, state = nnx.split(model)
  return _ANSWER_LOGPS((graphdef,)), state


def bucket_length(length):
  """The padded length of a prompt of `length` tokens (power of two)."""
  size = _MIN_BUCKET
  while size < length:
    size *= 2
  return size


def _single_token_ids(tokenizer, words):
  ids = []
  for word in words:
    encoded = [int(t) for t in tokenizer.encode(word)]
    if len(encoded) == 1:
      ids.append(encoded[0])
  return sorted(set(ids))


class GemmaBackend:
  """Judges tasks with a frozen Gemma's P(yes) vs P(no) per item."""

  canary_hint = ('use a larger judge (judge.preset, judge.source, '
                 'judge.path) or judge.backend=http')

  def __init__(self, model, tokenizer, batch_size, name, use_lora=False,
               template=None):
    self._tokenizer = tokenizer
    # A file's final newline would come between 'Answer:' and ' yes'.
    self._template = template.rstrip('\n') if template else None
    self._batch_size = int(batch_size)
    self._use_lora = use_lora
    self.where = f'the in-process Gemma judge ({name})'
    self._yes = _single_token_ids(tokenizer, _YES)
    self._no = _single_token_ids(tokenizer, _NO)
    if not self._yes or not self._no:
      raise ValueError(
          f"The judge's tokenizer has no single-token ' yes' / ' no' "
          f'(yes ids {self._yes}, no ids {self._no}); use judge.backend=http.')
    self._program, self._state = answer_logps_program(model)
    # On several processes every judge call is a collective: each process
    # brings its own pairs, all of them are judged together (below).
    self.collective = jax.process_count() > 1
    mesh = sharding.model_mesh(model)
    self._replicated = (
        jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        if self.collective and mesh is not None else None)

  @classmethod
  def from_config(cls, config, model, tokenizer, template=None):
    """The policy's base weights (judge.preset '') or the judge's own;
    `template` is judge.prompt_file's text (None: the built-in prompt)."""
    j = config.judge
    if not j.preset:
      return cls(model, tokenizer, j.batch_size,
                 f'{config.model.preset}, LoRA off', template=template)
    from agent_tunix import models  # pylint: disable=g-import-not-at-top
    judge_config = config.copy_and_resolve_references()
    judge_config.model.preset = j.preset
    judge_config.model.source = j.source or config.model.source
    judge_config.model.path = j.path
    judge_config.model.lora_rank = 0
    judge_model, judge_tokenizer = models.build(
        judge_config, sharding.model_mesh(model))
    return cls(judge_model, judge_tokenizer, j.batch_size, j.preset,
               template=template)

  def _encode(self, text):
    ids = [self._tokenizer.bos_id()] + [
        int(t) for t in self._tokenizer.encode(text)]
    return ids[-MAX_PROMPT_TOKENS:]  # Keeps the question's end and 'Answer:'.

  def item_probabilities(self, pairs):
    """P(met) of each (task, item text) pair.

    On several processes each brings its own pairs (their numbers may
    differ); every process encodes all of them (`gather_uneven_texts`), so
    all run the same batches on the same replicated inputs, and each keeps
    its own pairs' results. Every process must call this as often as the
    others (the train loop and the evaluation do: once per scored batch).
    """
    everyone, own = sharding.gather_uneven_texts(
        [item_prompt(t, text, self._template) for t, text in pairs])
    return self._probabilities([self._encode(p) for p in everyone])[own]

  def _probabilities(self, encoded):
    """P(met) of each encoded prompt, `judge.batch_size` at a time."""
    ids = np.asarray(self._yes + self._no, np.int32)
    if self._replicated is not None:
      ids = jax.device_put(ids, self._replicated)
    n_yes = len(self._yes)
    out = np.zeros([len(encoded)], np.float64)
    for start in range(0, len(encoded), self._batch_size):
      rows = encoded[start:start + self._batch_size]
      length = bucket_length(max(len(r) for r in rows))
      tokens = np.full([self._batch_size, length], pipeline.PAD_ID, np.int32)
      mask = np.zeros([self._batch_size, length], bool)
      for i, row in enumerate(rows):
        tokens[i, length - len(row):] = row
        mask[i, length - len(row):] = True
      for i in range(len(rows), self._batch_size):  # Fixed batch shape.
        tokens[i], mask[i] = tokens[0], mask[0]
      if self._replicated is not None:  # Global arrays, the same everywhere.
        tokens, mask = jax.device_put((tokens, mask), self._replicated)
      logps = self._program(self._state, tokens, mask, ids,
                            use_lora=self._use_lora)
      if self.collective:  # A global array: its whole value, here.
        logps = multihost_utils.process_allgather(logps, tiled=True)
      logps = np.asarray(logps, np.float64)[:len(rows)]
      yes = np.logaddexp.reduce(logps[:, :n_yes], axis=1)
      no = np.logaddexp.reduce(logps[:, n_yes:], axis=1)
      out[start:start + len(rows)] = 1.0 / (1.0 + np.exp(no - yes))
    return out

  def judge(self, tasks):
    """One Verdict per task (explicit aggregation over item probabilities)."""
    start = time.perf_counter()
    pairs = [(t, item['text']) for t in tasks for item in t['items']]
    # Also with no pairs: on several processes the call is a collective.
    probabilities = self.item_probabilities(pairs)
    elapsed = (time.perf_counter() - start) / max(len(tasks), 1)
    out, offset = [], 0
    for task in tasks:
      p = probabilities[offset:offset + len(task['items'])]
      offset += len(task['items'])
      score = prompts.explicit_score(task['items'], list(p))
      out.append(verdicts_lib.Verdict(
          float(score), met=[bool(x > 0.5) for x in p], latency_s=elapsed))
    logging.log_first_n(logging.INFO, 'Gemma judge: %d items of %d tasks.',
                        1, len(pairs), len(tasks))
    return out
