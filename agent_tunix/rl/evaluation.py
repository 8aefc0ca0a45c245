"""Accuracy of a policy on held-out questions: greedy, format, pass@k.

* accuracy: greedy completion whose <answer> holds the true number
  (numerically equal; '72', '72.0' and '$72' all count).
* format_accuracy: greedy completion in the exact
  <reasoning>...</reasoning><answer>...</answer> format.
* pass_at_k: at least one of k sampled completions (rollout temperature) is
  correct; the fraction of questions for which that holds.

Every accuracy comes with its standard error over the n questions,
`<name>_stderr` = sqrt(p (1 - p) / n) (the binomial standard error; a 95%
interval is about p +- 1.96 stderr). It is 0 when p is 0 or 1, however few
the questions: read it beside n.

With tools (an `episodes.EpisodeRollout` sampler), every question is a
multi-turn episode: accuracy and format read its final model turn, and
tool_calls_per_episode, tool_use_rate and tool_error_rate (failed call
attempts per attempt: unreadable calls, unknown tools, bad arguments,
exceptions, timeouts) describe the greedy episodes.

Greedy batches hold `eval.batch_size` questions, padded so the sampler
compiles once. pass@k samples the k completions of a question with one
shared prefill (`Rollout.generate(num_generations=k)`), `eval.batch_size //
k` questions (at least one) per call, also padded.
"""

import json

from absl import logging
import jax
import numpy as np

from agent_tunix.data import pipeline
from agent_tunix.data import prompts
from agent_tunix.rewards import format as format_lib
from agent_tunix.rewards import math as math_lib
from agent_tunix.rl import episode_stats
from agent_tunix.rl import episodes as episodes_lib
from agent_tunix.tpu import sharding


def is_correct(completion, answer):
  """True if the <answer> block holds a number equal to `answer`."""
  extracted = format_lib.extract_answer(completion)
  if extracted is None:
    return False
  guess = math_lib.parse_number(extracted)
  truth = math_lib.parse_number(str(answer))
  return guess is not None and truth is not None and guess == truth


def with_stderr(name, hits):
  """{name: mean of the 0/1 `hits`, name_stderr: its standard error}."""
  hits = np.asarray(hits, np.float64)
  p = float(hits.mean())
  return {name: p, f'{name}_stderr': float(np.sqrt(p * (1 - p) / hits.size))}


def accuracy_by(field, examples, texts):
  """Greedy accuracy per value of an example field ('type' or 'shape').

  Returns {value: {'correct': n, 'count': m, 'accuracy': n / m}} in order
  of first appearance; examples without the field count under ''.
  """
  groups = {}
  for example, text in zip(examples, texts, strict=True):
    group = groups.setdefault(str(example.get(field, '')),
                              {'correct': 0, 'count': 0})
    group['correct'] += int(is_correct(text, example['answer']))
    group['count'] += 1
  for group in groups.values():
    group['accuracy'] = group['correct'] / group['count']
  return groups


def format_scores(metrics):
  """'accuracy 0.250 +- 0.097, ...': each accuracy beside its stderr."""
  return ', '.join(
      f'{name} {value:.3f} +- {metrics[name + "_stderr"]:.3f}'
      for name, value in metrics.items() if name + '_stderr' in metrics
  )


def encode_examples(examples, tokenizer, max_prompt_length):
  """Left-padded prompt tokens [n, P] for eval examples (all must fit)."""
  rows = []
  for example in examples:
    encoded = pipeline.encode_prompt(
        example['prompt'], tokenizer, max_prompt_length
    )
    if encoded is None:
      raise ValueError(
          f'Eval prompt longer than generation.max_prompt_length='
          f'{max_prompt_length}: {example["prompt"][:80]!r}...'
      )
    rows.append(encoded[0])
  return np.stack(rows)


def _generate_all(sampler, tokens, batch_size, max_steps, seed,
                  num_generations=1, examples=None, **sampling):
  """(Completion texts, episodes or None), `num_generations` per prompt row
  (contiguous).

  Prompts go to the sampler `batch_size` at a time; the last batch is
  padded by repeating its last row and the padding's texts are dropped.
  An episode sampler also gets each row's example (`examples`).
  """
  texts, episodes = [], []
  for start in range(0, len(tokens), batch_size):
    chunk = tokens[start:start + batch_size]
    pad = batch_size - len(chunk)
    if pad:
      chunk = np.concatenate([chunk, np.repeat(chunk[-1:], pad, axis=0)])
    extra = {}
    if examples is not None:
      rows = examples[start:start + batch_size]
      extra['examples'] = rows + [rows[-1]] * pad
    out = sampler.generate(chunk, max_steps, seed + start,
                           num_generations=num_generations, **extra,
                           **sampling)
    keep = (batch_size - pad) * num_generations
    texts.extend(out.texts[:keep])
    if examples is not None:
      episodes.extend(out.episodes[:keep])
  return texts, (episodes if examples is not None else None)


def tool_scores(episodes):
  """Tool use of greedy episodes: calls per episode, the share of episodes
  that call, and failed call attempts per attempt."""
  rows = episode_stats.row_stats(episodes)
  attempts = rows['calls'] + rows['parse_errors'] + rows['excess_calls']
  failed = rows['parse_errors'] + rows['exec_errors'] + rows['timeouts']
  return {
      'tool_calls_per_episode': float(rows['calls'].mean()),
      'tool_use_rate': float((rows['calls'] > 0).mean()),
      'tool_error_rate': float(failed.sum() / max(attempts.sum(), 1.0)),
  }


def rubric_scores(judge, examples, texts):
  """eval/rubric_score of greedy completions of rubric rows, with its
  standard error and 95% interval (failed calls masked are left out and
  counted as rubric_failed).

  Every process holds every row's completion; on several processes each
  judges the rows p, p + P, ... and the scores are gathered, so no row is
  judged twice.
  """
  count, index = jax.process_count(), jax.process_index()
  tasks = [judge.task(e['question'], e.get('reference', ''), text,
                      json.loads(e['rubric']))
           for e, text in list(zip(examples, texts))[index::count]]
  scores = judge.score(tasks)
  if count > 1:  # Process p's row j is row j * P + p (gather_rows' order).
    rows = -(-len(examples) // count)
    padded = np.full([rows], np.nan, np.float32)
    padded[:len(scores)] = scores
    scores = sharding.gather_rows(padded)[:len(examples)]
  scored = scores[np.isfinite(scores)].astype(np.float64)
  mean = float(scored.mean()) if scored.size else float('nan')
  stderr = (float(scored.std(ddof=1) / np.sqrt(scored.size))
            if scored.size > 1 else 0.0)
  return {'rubric_score': mean, 'rubric_score_stderr': stderr,
          'rubric_score_ci95_low': mean - 1.96 * stderr,
          'rubric_score_ci95_high': mean + 1.96 * stderr,
          'rubric_failed': float(scores.size - scored.size)}


def evaluate(sampler, tokenizer, examples, config, seed=0, judge=None):
  """Evaluates the sampler's current policy on `examples`.

  Args:
    sampler: a `rollout.Rollout` over the policy, or an
      `episodes.EpisodeRollout` (tools).
    tokenizer: the policy's tokenizer.
    examples: dicts with 'prompt' and 'answer' (pipeline.eval_examples).
    config: the full config (generation, eval sections).
    seed: sampling seed for pass@k.
    judge: the run's judge; with rubric rows (data.task='rubric') the
      metrics add rubric_score (`rubric_scores`).

  Returns:
    (metrics dict with accuracy, format_accuracy and, when eval.pass_at_k >
    0, pass_at_k, each with its <name>_stderr, and with tools
    tool_calls_per_episode, tool_use_rate and tool_error_rate; list of
    greedy completion texts (with tools, the final turns); list of the
    greedy episodes' transcripts, or None without tools).
  """
  if not examples:
    raise ValueError(
        'No evaluation examples: raise data.num_eval_examples or '
        'generation.max_prompt_length.'
    )
  tokens = encode_examples(
      examples, tokenizer, config.generation.max_prompt_length
  )
  batch = config.eval.batch_size
  steps = config.eval.max_generation_steps
  answers = [e['answer'] for e in examples]
  rows = None
  if isinstance(sampler, episodes_lib.EpisodeRollout):
    rows = [{k: e[k] for k in ('question', 'answer') if k in e}
            for e in examples]
  greedy, episodes = _generate_all(sampler, tokens, batch, steps, seed,
                                   examples=rows)
  greedy = prompts.scored_texts(greedy, config)
  metrics = {
      **with_stderr(
          'accuracy', [is_correct(c, a) for c, a in zip(greedy, answers)]
      ),
      **with_stderr(
          'format_accuracy', [format_lib.is_exact_format(c) for c in greedy]
      ),
  }
  k = config.eval.pass_at_k
  if k > 0:
    gen = config.generation
    sampled, _ = _generate_all(
        sampler, tokens, max(1, batch // k), steps, seed + 1,
        num_generations=k, examples=rows,
        temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p,
    )
    sampled = prompts.scored_texts(sampled, config)
    hits = np.array(
        [is_correct(c, a) for c, a in zip(sampled, np.repeat(answers, k))]
    ).reshape(len(examples), k)
    metrics.update(with_stderr('pass_at_k', hits.any(axis=1)))
  if judge is not None and config.data.task == 'rubric':
    metrics.update(rubric_scores(judge, examples, greedy))
  logging.info('Eval on %d questions: %s', len(examples),
               format_scores(metrics))
  if episodes is None:
    return metrics, greedy, None
  metrics.update(tool_scores(episodes))
  logging.info('Tool use: %s', ', '.join(
      f'{k} {v:.3f}' for k, v in tool_scores(episodes).items()))
  return metrics, greedy, [e.transcript for e in episodes]
