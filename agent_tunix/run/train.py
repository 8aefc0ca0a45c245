"""The GRPO train loop: mesh -> models -> data -> restore -> steps.

Each step: a batch of prompts -> one call into the rollout
(`step_rollout.StepRollout`: G sampled completions each, rewards, the
update batch staged on the mesh) -> num_iterations jitted LoRA updates (each
computes the advantages first, `rl/advantages.py`) -> then, each when it is time, evaluation, checkpoint, metrics
and alarms. The math lives in rl/; this module only wires the pieces and
keeps the books. It trusts its config: each command checks it first.

Reproducibility: the sampling seed of step s is derived from
(training.seed, s) (`step_rollout.step_seed`) and everything else that
changes between steps (LoRA params, optimizer state, data iterator) is
checkpointed, so a run resumed from step k repeats the uninterrupted run
step for step.

Several processes (multi-host): every process runs this same loop on global
arrays and reads its own share of every batch; the rollout gathers what it
needs (step_rollout.py). Only process 0 writes metric files and logs sample
texts; checkpoints are written by all processes together (Orbax).
"""

import contextlib
import dataclasses
import functools
import time

from absl import logging
from flax import nnx
import grain
import jax
import ml_collections
import optax
import sentencepiece as spm

from agent_tunix import models
from agent_tunix import rewards
from agent_tunix.data import pipeline
from agent_tunix.models import families
from agent_tunix.models import gemma4 as gemma4_lib
from agent_tunix.models import tokenizer as tokenizer_lib
from agent_tunix.observe import machine
from agent_tunix.observe import metrics as metrics_lib
from agent_tunix.rl import episodes
from agent_tunix.rl import evaluation
from agent_tunix.rl import grpo
from agent_tunix.rl import objectives
from agent_tunix.rl import optimizer as optimizer_lib
from agent_tunix.rl import rollout
from agent_tunix.rl import staging
from agent_tunix.rl import step_rollout
from agent_tunix.run import alarms as alarms_lib
from agent_tunix.run import checkpoint
from agent_tunix.run import divergence
from agent_tunix.run import full_disk
from agent_tunix.run import judging
from agent_tunix.run import lock as run_lock
from agent_tunix.run import preemption
from agent_tunix.run import resolved_config
from agent_tunix.run import schedule as schedule_lib
from agent_tunix.storage import retries as storage_retries
from agent_tunix.tpu import sharding

# The sampling seed of a step (and round); see step_rollout.
step_seed = step_rollout.step_seed


@dataclasses.dataclass
class RunState:
  """What a run reassigns as it goes; the rest of its `Session` stays.

  Attributes:
    kl_coeff: the KL coefficient the next update uses (grpo.kl_target > 0
      adapts it; checkpointed in the step's meta).
    schedule: the learning-rate schedule; a resumed run keeps the span it
      started with (`resume_schedule`).
    span: the schedule's span (schedule_lib; saved in each step's meta);
      None: schedule_lib.first_span(config), which `setup` builds.
    alarms: made by `run`; its state is saved.
    last_batch: the last update batch on the mesh (for divergence checks).
  """

  kl_coeff: float
  schedule: optax.Schedule
  span: schedule_lib.Span | None = None
  alarms: alarms_lib.Monitor | None = None
  last_batch: grpo.UpdateBatch | None = None


@dataclasses.dataclass(frozen=True)
class Session:
  """What a run builds once: model, tokenizer, data, optimizer, rewards.

  The fields stay for the run (the model's and optimizer's arrays, the data
  iterator's position and the reward set's caches change inside them); what
  the run reassigns is its `state`.
  """

  config: ml_collections.ConfigDict
  workdir: str
  mesh: jax.sharding.Mesh
  model: nnx.Module
  tokenizer: spm.SentencePieceProcessor | tokenizer_lib.JsonTokenizer
  sampler: rollout.Rollout | episodes.EpisodeRollout
  # The reward functions (`judging.reward_set`).
  reward_set: rewards.RewardSet
  optimizer: nnx.Optimizer
  hp: grpo.StepHParams  # The update's static hyperparameters.
  eval_set: list[dict]
  state: RunState
  # A step's rollout: sampler, rewards and staging on the mesh.
  rollout: step_rollout.StepRollout | None = None
  # The train batches (`setup` with_data) and their counts.
  train_iter: grain.DatasetIterator | None = None
  data_stats: dict | None = None


def setup(config, workdir, with_data=True):
  """Builds the session of a checked config (no training).

  Without `with_data` only the eval split is read (evaluate scores a test
  file with no train file beside it).
  """
  if with_data and workdir:
    resolved_config.check_and_store(config, workdir, checkpoint.has_steps(workdir))
  mesh = sharding.make_mesh(config.mesh)
  model, tokenizer = models.build(config, mesh)
  sampler = step_rollout.make_sampler(config, model, tokenizer)
  tx, schedule = optimizer_lib.optimizer_from_config(config)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.LoRAParam)
  sharding.place_optimizer(optimizer, mesh)
  hparams = grpo.hparams_from_config(config)
  # The prompts are written in the tool format of the model's family.
  tool_format = families.of_preset(config.model.preset).tool_format
  eval_set = pipeline.eval_examples(config, tokenizer, turns=tool_format)
  reward_set = judging.reward_set(config, workdir, model, tokenizer)
  stage = functools.partial(staging.stage, model, mesh, hparams,
                            num_iterations=config.grpo.num_iterations,
                            pack=config.grpo.pack_sequences)
  session = Session(
      config=config, workdir=workdir, mesh=mesh, model=model,
      tokenizer=tokenizer, sampler=sampler, reward_set=reward_set,
      optimizer=optimizer, hp=hparams, eval_set=eval_set,
      state=RunState(kl_coeff=grpo.initial_kl_coeff(config),
                     schedule=schedule),
      rollout=step_rollout.StepRollout.from_config(config, sampler,
                                                   reward_set, stage),
  )
  if with_data:
    train_iter, data_stats = pipeline.make_train_iterator(
        config, tokenizer, jax.process_index(), jax.process_count(),
        turns=tool_format,
    )
    session = dataclasses.replace(session, train_iter=train_iter,
                                  data_stats=data_stats)
  return session


# Tokens per expert of a Gemma 4 mixture of experts on the update batch
# (one more forward; MoE presets only).
_ROUTER_STATS = nnx.jit(gemma4_lib.router_stats)


def update_policy(session, update, staged):
  """num_iterations updates of the policy on one rollout's batch.

  Args:
    session: the run's `Session`.
    update: the host `grpo.UpdateBatch` (a `step_rollout.RolloutBatch`'s).
    staged: its `staging.StagedBatch` (sequences and log-prob passes on
      the mesh).

  Returns:
    The update's scalars.
  """
  config = session.config
  per_row = sharding.shard_batch(
      {'advantages': update.advantages, 'rewards': update.rewards,
       'kl_coeff': update.kl_coeff}, session.mesh)
  batch = grpo.UpdateBatch.of(staged.sequences, ref_logps=staged.ref_logps,
                              old_logps=staged.old_logps, **per_row)
  session.state.last_batch = batch
  for _ in range(config.grpo.num_iterations):
    step_metrics = grpo.train_step(
        session.model, session.optimizer, batch, session.hp
    )
  scalars = {k: float(sharding.to_host(v)) for k, v in step_metrics.items()}
  if getattr(session.model.config, 'enable_moe', False):
    counts = _ROUTER_STATS(session.model, batch.tokens, batch.input_mask)
    scalars.update(gemma4_lib.load_scalars(sharding.to_host(counts)))
  if session.hp.beta > 0:
    scalars['kl_coeff'] = session.state.kl_coeff
  if config.grpo.kl_target > 0:
    # Every process sees the same global KL, so they all agree.
    session.state.kl_coeff = objectives.adaptive_kl_coeff(
        session.state.kl_coeff, scalars['kl'], config.grpo.kl_target,
        config.grpo.kl_horizon,
        config.training.batch_size * config.grpo.num_generations,
    )
  return scalars


def last_learning_rate(session):
  """The learning rate of the optimizer's latest update.

  Read from the optimizer's own update counter (checkpointed), so it is the
  rate the update actually used, whatever grpo.num_iterations is.
  """
  updates = int(sharding.to_host(session.optimizer.step.get_value()))
  return float(session.state.schedule(max(updates - 1, 0)))


def resume_schedule(session, meta):
  """Keeps the learning-rate schedule of the run resumed from (or starts a
  new one: training.reset_schedule), and logs the rate change in one line.

  Raises:
    ConfigError: training.num_steps goes past the schedule's end.
  """
  config = session.config
  updates = int(sharding.to_host(session.optimizer.step.get_value()))
  stored = None
  if schedule_lib.META_KEY not in meta:
    stored = resolved_config.load(session.workdir)
  old, _ = schedule_lib.saved_span(config, meta, stored)
  new, _ = schedule_lib.resumed_span(config, meta, updates, stored)
  old_schedule = optimizer_lib.optimizer_from_config(
      config, (old.start, old.length))[1]
  if new != schedule_lib.first_span(config):  # Not what `setup` built.
    tx, session.state.schedule = optimizer_lib.optimizer_from_config(
        config, (new.start, new.length))
    session.optimizer.tx = tx
  session.state.span = new
  logging.info('%s', schedule_lib.describe(
      config, old, new, float(old_schedule(max(updates - 1, 0))),
      float(session.state.schedule(updates)), updates))


def save(ckpt, session, step, force=False):
  """Saves `step` when due (or forced), never a diverged state."""
  if not ckpt.will_save(step, force):
    return
  state = session.state
  divergence.check_state(step, session.model, session.optimizer,
                         state.last_batch, session.hp, session.config, ckpt)
  span = state.span or schedule_lib.first_span(session.config)
  meta = {'kl_coeff': state.kl_coeff,
          schedule_lib.META_KEY: span.to_meta()}
  if state.alarms is not None:
    meta['alarms'] = state.alarms.state()
  ckpt.save(step, checkpoint.lora_state(session.model),
            checkpoint.optimizer_state(session.optimizer),
            session.train_iter, meta, force=force)


def restore_lora(session, workdir, step=None):
  """Loads a run's LoRA params (latest or `step`); returns the step or None."""
  return checkpoint.restore_lora(
      session.model, workdir, session.config.checkpoint, step
  )


def run_eval(session, writer, step):
  """Scores the policy on the eval set; writes eval/* and sample texts."""
  scores, texts, transcripts = evaluation.evaluate(
      session.sampler, session.tokenizer, session.eval_set, session.config,
      seed=step_seed(session.config.training.seed + 1, step),
      judge=session.reward_set.judge,
  )
  scalars = {f'eval/{k}': v for k, v in scores.items()}
  # The reward functions' own metrics of the evaluation (a rubric's calls).
  scalars.update({f'eval/{k}': v
                  for k, v in session.reward_set.take_metrics().items()})
  if session.state.alarms is not None:
    scalars.update(session.state.alarms.after_eval(step, scores))
  writer.write_scalars(step, scalars)
  if texts and jax.process_index() == 0:
    metrics_lib.write_samples(
        writer, step, [e['prompt'] for e in session.eval_set],
        transcripts or texts,
        [float(evaluation.is_correct(t, e['answer']))
         for t, e in zip(texts, session.eval_set)],
        session.config.logging.num_sample_texts,
    )
  return scores


def train_and_evaluate(config, workdir):
  """Trains (resuming from workdir's latest checkpoint) and evaluates.

  Returns:
    Dict with the final step, the last step's scalars, the final eval scores
    (None when stopped early), 'preempted' (SIGTERM/SIGINT ended it) and
    'alarms' (the alarms that stopped the run under
    training.stop_on_alarm; empty otherwise).
  """
  with run_lock.hold(workdir):  # One run per workdir.
    return run(setup(config, workdir))


def run(session):
  """`train_and_evaluate` on a session already built by `setup`."""
  ckpt = checkpoint.Checkpointer(session.workdir, session.config.checkpoint)
  # However the loop ends (an error included), the checkpoint being written
  # in the background and the queued metrics are finished before this
  # returns or raises.
  with ckpt, contextlib.ExitStack() as on_exit:
    on_exit.callback(session.sampler.close)
    start = _restore(session, ckpt)
    writer = on_exit.enter_context(metrics_lib.closing(
        metrics_lib.create_writer(session.workdir, config=session.config)))
    _open_books(session, writer, start)
    return _train(session, ckpt, writer, start)


def _train(session, ckpt, writer, start):
  """The loop: a step, then evaluation, checkpoint, metrics and alarms,
  each when it is time."""
  config = session.config
  num_steps = config.training.num_steps
  report = metrics_lib.progress_hook(config, num_steps, writer)
  stop_signal = preemption.PreemptionGuard()
  save_on_error = preemption.SaveOnError(
      functools.partial(_save_now, ckpt, session), session.train_iter, start,
      skip=_unsaved_reason)
  scalars, step = {}, start
  with stop_signal, save_on_error:
    for step in range(start + 1, num_steps + 1):
      save_on_error.begin(step)
      try:
        batch = next(session.train_iter)
      except StopIteration:
        logging.info('Data exhausted after step %d.', step - 1)
        step -= 1
        break
      scalars, samples = _step(session, batch, step, save_on_error)
      divergence.check_scalars(step, scalars, config, ckpt)
      scalars.update(session.state.alarms.update(step, scalars))
      writer.write_scalars(step, scalars)
      if jax.process_index() == 0:
        metrics_lib.write_samples(writer, step, *samples,
                                  config.logging.num_sample_texts)
      report(step)
      every = config.eval.eval_every_n_steps
      if every and step % every == 0 and step < num_steps:
        run_eval(session, writer, step)
      # After the evaluation, so that the checkpoint's alarm state has seen
      # it (reward_hacking compares consecutive evaluations).
      save(ckpt, session, step)
      preempted = stop_signal.should_stop(step)
      alarmed = (session.state.alarms.fired(step)
                 if config.training.stop_on_alarm else [])
      if preempted or alarmed:
        return _stop(ckpt, session, step, scalars, preempted, alarmed)
  if step > start:
    save(ckpt, session, step, force=True)
  final = run_eval(session, writer, step)
  return {'step': step, 'scalars': scalars, 'eval': final,
          'preempted': False, 'alarms': []}


def _step(session, batch, step, save_on_error):
  """One step: the rollout of `batch`, then the update; (scalars, samples)."""
  started = time.perf_counter()
  rolled = session.rollout(batch, step, session.state.kl_coeff,
                           session.train_iter)
  sampled = time.perf_counter()
  save_on_error.updating()
  scalars = dict(rolled.scalars)
  scalars.update({f'reward/{metrics_lib.sanitize_name(name)}/mean': mean
                  for name, mean in rolled.reward_means.items()})
  scalars.update(update_policy(session, rolled.update, rolled.staged))
  save_on_error.done(step)
  updated = time.perf_counter()
  scalars['learning_rate'] = last_learning_rate(session)
  scalars['time/rollout_s'] = sampled - started
  scalars['time/update_s'] = updated - sampled
  scalars['tokens_per_s'] = rolled.gen_tokens / (updated - started)
  # Retries of the storage clients so far (429/5xx/lost connections).
  scalars['storage/retries'] = float(storage_retries.count())
  scalars.update(session.reward_set.take_metrics(updated - started))
  return scalars, rolled.samples


def _restore(session, ckpt):
  """Restores the latest good checkpoint into the session; its step, or 0."""
  config, state = session.config, session.state
  state.alarms = alarms_lib.Monitor(config)
  restored = ckpt.restore_into(session.model, session.optimizer,
                               session.train_iter)
  ckpt.set_aside_damaged()
  if restored is None:
    return 0
  meta, start = restored
  if config.grpo.kl_target > 0 and 'kl_coeff' in meta:
    state.kl_coeff = float(meta['kl_coeff'])
  state.alarms.load(meta.get('alarms'))
  logging.info('Resumed from step %d in %s', start, session.workdir)
  resume_schedule(session, meta)
  return start


def _open_books(session, writer, start):
  """What a run logs as it starts: hparams, the machine, and on a fresh
  run the data counts and the evaluation of step 0."""
  config = session.config
  if start == 0:
    metrics_lib.write_hparams(writer, config)
  logging.info(
      'Training %s for %d steps (%d prompts x %d generations); data: %s',
      config.model.preset, config.training.num_steps,
      config.training.batch_size, config.grpo.num_generations,
      session.data_stats,
  )
  # At every start: a resumed run may be on another kind of machine.
  machine_line = machine.summary(machine.describe())
  logging.info('Machine: %s', machine_line)
  if jax.process_index() == 0:  # Texts, like samples, from process 0 only.
    writer.write_texts(start, {'machine': machine_line})
  if start == 0:
    writer.write_scalars(0, {
        'data/dropped_long_prompts':
            session.data_stats['dropped_long_prompts']
    })
    run_eval(session, writer, 0)


def _save_now(ckpt, session, step):
  """Saves `step` and waits for it (a failing step's save: the error goes
  on once the checkpoint is written)."""
  save(ckpt, session, step, force=True)
  ckpt.wait()


def _unsaved_reason(error):
  """Why a step that raised `error` must not be saved, or None."""
  if isinstance(error, divergence.DivergenceError):
    return 'the diverged state is not known to be good'
  if full_disk.no_space_error(error) is not None:
    return 'the disk is full'
  return None


def _stop(ckpt, session, step, scalars, preempted, alarmed):
  """Saves and closes after a signal or an alarm; the run's result."""
  save(ckpt, session, step, force=True)
  if alarmed:
    logging.warning(
        'Stopped after step %s by alarm %s (training.stop_on_alarm); '
        'saved in %s. %s', step, ', '.join(alarmed), ckpt.directory,
        ' '.join(session.state.alarms.message(a) for a in alarmed))
  else:
    logging.warning('Stopped after step %s, saved in %s; rerun the '
                    'same command to resume.', step, ckpt.directory)
  ckpt.close()
  return {'step': step, 'scalars': scalars, 'eval': None,
          'preempted': preempted, 'alarms': alarmed}
