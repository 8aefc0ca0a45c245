"""The whole flow as functions, for notebooks: prepare, train, evaluate, ask.

  from agent_tunix import api

  session = api.prepare('gemma3_270m:quick', '/tmp/run')
  api.train(session)
  print(api.evaluate(session))
  print(api.ask(session, 'Ann has 3 pens and buys 4 more. How many pens?'))
  api.export(session, 'merged', '/tmp/run/hf')

A preset goes by name with its argument, as `--config=gemma3_270m:quick`
does for the commands; `preset('gemma3_270m:quick')` returns the config to
edit before `prepare` (or pass any config: `gemma3_270m.get_config()` of
`agent_tunix.configs`, your own).

Rubric rows train the same way: a config with data.task='rubric', its
rubric data and a judge (docs/rubrics.md), then `api.ask(session,
question, rubric=...)`.

Every function works on the `train.Session` that `prepare` builds. The
workdir holds checkpoints and TensorBoard metrics exactly as
`python -m agent_tunix.main` writes them: `prepare` on the workdir of an
earlier run loads its latest LoRA, and `train` resumes it from its latest
checkpoint (so after a crash, the same two calls continue the run).
"""

import importlib
import tempfile

from absl import logging
import jax
import numpy as np

from agent_tunix import cli
from agent_tunix import export as export_lib
from agent_tunix import storage
from agent_tunix.config import validation
from agent_tunix.data import pipeline
from agent_tunix.data import prompts
from agent_tunix.data import rubrics
from agent_tunix.models import families
from agent_tunix.rl import episodes
from agent_tunix.rl import evaluation
from agent_tunix.run import lock as run_lock
from agent_tunix.run import train as train_lib


def preset(name):
  """The config of a preset by name: `preset('gemma3_270m:quick')`.

  Args:
    name: `NAME[:ARG]`, NAME a module of agent_tunix/configs (what
      `--config=NAME[:ARG]` takes), ARG its get_config argument.

  Raises:
    ValueError: no preset has that name (the message lists the presets).
  """
  module_name, colon, arg = name.partition(':')
  if cli.preset_path(module_name) is None:
    raise ValueError(cli.unknown_preset_message(name))
  module_name = module_name.removesuffix('.py')
  module = importlib.import_module(f'agent_tunix.configs.{module_name}')
  return module.get_config(arg) if colon else module.get_config()


def prepare(config, workdir=None):
  """Validates `config` and builds the model, tokenizer, data and optimizer.

  Args:
    config: a full config (e.g. `configs.gemma3_270m.get_config()`), or a
      preset's name (`'gemma3_270m:quick'`, see `preset`).
    workdir: run directory for checkpoints and metrics; None makes a new
      temporary one (logged; see `session.workdir`).

  Returns:
    The `train.Session`. If `workdir` has checkpoints, its model carries the
    latest one's LoRA.
  """
  if isinstance(config, str):
    config = preset(config)
  validation.validate(config, process_count=jax.process_count())
  if workdir is None:
    workdir = tempfile.mkdtemp(prefix='agent_tunix_')
    logging.info('Run directory: %s', workdir)
  session = train_lib.setup(config, workdir)
  if _checkpoint_steps(session):
    step = train_lib.restore_lora(session, workdir)
    logging.info('Loaded the LoRA of step %s from %s', step, workdir)
  return session


def _checkpoint_steps(session):
  if not storage.path(session.workdir).exists():
    return []
  return export_lib.checkpoint_steps(session.config, session.workdir)


def train(session):
  """Runs (or resumes) training to config.training.num_steps, then evaluates.

  Returns:
    {'step', 'scalars' (of the last step), 'eval' (final scores),
    'preempted', 'alarms'}, as `train.train_and_evaluate` returns.

  Raises:
    run_lock.LockedError: another run (a CLI or another notebook) is
      training in the same workdir; it holds the lock until it ends.
  """
  with run_lock.hold(session.workdir):
    return train_lib.run(session)


def evaluate(session):
  """Scores the current policy on the held-out questions.

  Returns:
    {'accuracy', 'format_accuracy', and 'pass_at_k' if eval.pass_at_k > 0},
    each with its standard error ('accuracy_stderr', ...); on rubric rows
    with a judge also 'rubric_score' (its stderr and 95% interval).
  """
  scores, _, _ = evaluation.evaluate(
      session.sampler, session.tokenizer, session.eval_set, session.config,
      judge=session.reward_set.judge,
  )
  return scores


def export(session, fmt, path, overwrite=False, **kwargs):
  """Writes the current policy as 'peft', 'merged' or 'gguf' to `path`.

  Args:
    session: from `prepare`.
    fmt: the format, one of export.FORMATS.
    path: output directory (peft, merged) or file (gguf).
    overwrite: replace an earlier export at `path`.
    **kwargs: `dtype` ('merged') or `gguf_dtype` ('gguf'), see export.export.

  Returns:
    The absolute output path.
  """
  steps = _checkpoint_steps(session)
  return export_lib.export(
      session.model, session.tokenizer, session.config, fmt, path,
      overwrite=overwrite, step=steps[-1] if steps else None, **kwargs
  )


def ask(session, question, max_new_tokens=None, rubric=None):
  """Answers one question greedily with the current policy.

  The question is formatted with the run's prompt template
  (`data.prompts.format_prompt`: chat turns or the few-shot prompt, with the
  system prompt), as in training and evaluation.

  Args:
    session: from `prepare`.
    question: the question text.
    max_new_tokens: completion length; default eval.max_generation_steps.
    rubric: a rubric in any shape `data.rubrics.normalise` reads; shown
      before the question when data.rubric_in_prompt is on (as in
      training), else ignored.

  Returns:
    The completion text (up to, without, the end token); with tools
    (agent.tools), the episode's transcript (`episodes.format_transcript`:
    a 'model:' line per turn, a 'tool:' line per reply).

  Raises:
    ValueError: the formatted prompt is longer than
      generation.max_prompt_length, or the lengths exceed the KV cache.
  """
  config = session.config
  gen = config.generation
  steps = max_new_tokens or config.eval.max_generation_steps
  if gen.max_prompt_length + steps > gen.kv_cache_size:
    raise ValueError(
        f'max_new_tokens={steps} plus generation.max_prompt_length='
        f'{gen.max_prompt_length} exceeds generation.kv_cache_size='
        f'{gen.kv_cache_size}; ask for fewer tokens or raise kv_cache_size.'
    )
  items = rubrics.normalise(rubric) if rubric is not None else None
  prompt = prompts.format_prompt(
      pipeline.rubric_question(question, items, config), config,
      families.of_preset(config.model.preset).tool_format)
  encoded = pipeline.encode_prompt(
      prompt, session.tokenizer, gen.max_prompt_length
  )
  if encoded is None:
    raise ValueError(
        f'The prompt for {question[:60]!r}... is longer than '
        f'generation.max_prompt_length={gen.max_prompt_length} tokens; '
        'shorten the question or raise the limit.'
    )
  # As many rows as an evaluation batch, so that the sampler compiled for
  # evaluation is reused.
  rows = np.repeat(encoded[0][None], config.eval.batch_size, axis=0)
  out = session.sampler.generate(rows, steps, seed=0)
  if out.episodes is not None:  # Tools: the whole episode, turn by turn.
    return episodes.format_transcript(out.episodes[0])
  return out.texts[0]

