"""Config validation, run before any weight is read.

Every check names the config field, the bad value and the fix, so a typo or
an impossible combination costs seconds, not a model load.
"""

import dataclasses
import importlib.util
import math
import os
import tempfile

from agent_tunix import rewards
from agent_tunix import storage
from agent_tunix.agent import environment
from agent_tunix.agent import formats
from agent_tunix.agent import tools
from agent_tunix.data import gsm8k
from agent_tunix.data import pipeline
from agent_tunix.data import synthetic
from agent_tunix.judge import checks as judge_checks
from agent_tunix.models import families
from agent_tunix.models import gemma
from agent_tunix.models import gguf
from agent_tunix.rl import advantages
from agent_tunix.rl import objectives
from agent_tunix.rl import remat
from agent_tunix.rl import rollout
from agent_tunix.tpu import sharding

_CHOICES = {
    'model.source': gemma.SOURCES,
    'model.dtype': tuple(gemma.DTYPES),
    'model.remat': remat.REMAT_MODES,
    'model.preset': tuple(gemma.PRESETS),
    'data.template': ('auto', 'chat', 'plain'),
    'data.bad_rows': gsm8k.BAD_ROWS,
    'grpo.kl_estimator': objectives.KL_ESTIMATORS,
    'grpo.scale_rewards': objectives.SCALE_REWARDS_MODES,
    'grpo.loss_agg_mode': objectives.LOSS_AGG_MODES,
    'grpo.importance_sampling_level': objectives.IMPORTANCE_SAMPLING_LEVELS,
    'grpo.advantage_estimator': tuple(advantages.ESTIMATORS),
    'agent.format': tuple(formats.FORMATS),
    'agent.cut_episodes': ('score', 'mask'),
}



@dataclasses.dataclass(frozen=True)
class _Range:
  """A field's bounds: low <= value <= high (None: unbounded; an open end
  excludes its value); `note` ends the message (what the ends mean)."""

  low: float | None = None
  high: float | None = None
  low_open: bool = False
  note: str = ''

  def holds(self, value) -> bool:
    if self.low is not None and (
        value < self.low or (self.low_open and value == self.low)):
      return False
    return self.high is None or value <= self.high

  def rule(self) -> str:
    if self.high is None:
      return f'{">" if self.low_open else ">="} {self.low}'
    return f'in {"(" if self.low_open else "["}{self.low}, {self.high}]'


def _at_least(low, note=''):
  return _Range(low, note=note)


def _above(low, note=''):
  return _Range(low, low_open=True, note=note)


# Every field with bounds of its own, checked by its section's
# `_check_bounds` (cross-field checks stay in the sections).
_BOUNDS = {
    'model.lora_rank': _at_least(0, ' (0 disables LoRA)'),
    'rewards.overlong_penalty': _at_least(0),
    'grpo.beta': _at_least(0),
    'grpo.kl_target': _at_least(0, ' (0 = fixed beta)'),
    'grpo.init_kl_coeff': _at_least(0),
    'grpo.kl_horizon': _above(0, ' (completions)'),
    'grpo.entropy_coeff': _at_least(0, ' (0 = off)'),
    'grpo.maxent_tau': _at_least(0, ' (0 = off)'),
    'grpo.maxent_q_temperature': _above(0),
    'grpo.maxent_q_epsilon': _Range(0, 1),
    # The clip range has no "0 = off": at 0 the clipped ratio is the
    # constant 1, so every token that moved the way its advantage pushes is
    # clipped (no gradient) and the policy cannot leave the one that sampled.
    'grpo.epsilon': _above(0, ' (the clip range; 0 clips every update '
                           'away): use 0.2, or ~3e-4 with GSPO'),
    'grpo.num_iterations': _at_least(1),
    'grpo.tis_cap': _at_least(0, ' (0 = off)'),
    'grpo.max_sampling_rounds': _at_least(
        1, ' (1 = sample one batch per step)'),
    'grpo.logps_chunk_size': _at_least(1),
    'generation.max_prompt_length': _at_least(1),
    'generation.max_generation_steps': _at_least(1),
    'generation.temperature': _at_least(0),
    'generation.decode_chunk_steps': _at_least(1),
    'generation.top_p': _Range(0, 1, low_open=True),
    'generation.top_k': _at_least(0),
    'agent.max_tool_calls': _at_least(1),
    'agent.max_calls_per_turn': _at_least(1),
    'agent.max_turn_tokens': _at_least(1),
    'agent.max_tool_output_tokens': _at_least(8),
    'agent.tool_timeout_s': _above(0),
    'agent.episode_timeout_s': _at_least(0, ' (0 = no limit)'),
    'agent.tool_use_bonus': _Range(
        0, 0.5, note=': a larger bonus pays calls for their own sake'),
    'optimizer.learning_rate': _above(0),
    'optimizer.warmup_ratio': _Range(0, 1),
    'optimizer.max_grad_norm': _at_least(0, ' (0 turns clipping off)'),
    'training.num_steps': _at_least(1),
    'training.batch_size': _at_least(1),
    'training.micro_batch_size': _at_least(1),
    'checkpoint.save_interval_steps': _at_least(0),
    'checkpoint.max_to_keep': _at_least(1),
    'eval.eval_every_n_steps': _at_least(0),
    'eval.pass_at_k': _at_least(0),
    'eval.batch_size': _at_least(1),
    'alarms.zero_std_frac': _Range(0, 1, note=' (a share of the batch)'),
    'alarms.clipped_frac': _Range(0, 1, note=' (a share of the batch)'),
    'alarms.entropy_min': _at_least(0),
    'alarms.hacking_accuracy_drop': _at_least(0),
    'logging.report_every_n_steps': _at_least(1),
}


class ConfigError(ValueError):
  """An invalid or impossible config."""


def _get(config, dotted):
  value = config
  for part in dotted.split('.'):
    value = value[part]
  return value


def _require(ok, message):
  if not ok:
    raise ConfigError(message)


def validate(config, num_devices=None, process_count=1, workdir=None,
             splits=pipeline.SPLITS):
  """Raises ConfigError for the first invalid field found.

  Every float is checked to be finite first, then each section by its
  `_check_<section>`, in the order of agent_tunix/configs/base.py, then the workdir. A
  check that reads fields of other sections sits in the section it is about
  (the batch split over the mesh in `_check_mesh`, after the training and
  grpo checks). Reads only: it creates and writes nothing.

  Args:
    config: the full ml_collections config.
    num_devices: devices the mesh will span (default: jax.device_count()).
    process_count: number of JAX processes (hosts).
    workdir: the run directory a trainer will write; None skips its check.
    splits: the data splits the caller reads (evaluate: 'eval' alone);
      the local data files of the others need not exist.
  """
  _check_finite(config)
  _check_model(config)
  _check_data(config, splits)
  _check_rewards(config)
  _check_grpo(config)
  _check_generation(config)
  _check_agent(config)
  _check_optimizer(config)
  _check_training(config, process_count)
  _require(
      'train' not in splits or config.model.lora_rank >= 1,
      f'config.model.lora_rank={config.model.lora_rank}: training updates '
      'only LoRA adapters, so it needs a rank >= 1.',
  )
  _check_checkpoint(config)
  _check_eval(config)
  _check_mesh(config, num_devices)
  _check_alarms(config)
  _check_logging(config)
  if workdir is not None:
    _check_workdir(workdir)


def _check_finite(config):
  """Every float field, in any section, is finite (inf and NaN are typos)."""

  def visit(prefix, node):
    for key in node.keys():
      value = node[key]
      if hasattr(value, 'keys'):
        visit(f'{prefix}{key}.', value)
      elif isinstance(value, float):
        _require(
            math.isfinite(value),
            f'config.{prefix}{key}={value} must be a finite number.',
        )

  visit('', config)


def _check_choices(config, section):
  """The section's fields with a fixed set of values (`_CHOICES`)."""
  for field, choices in _CHOICES.items():
    if field.startswith(f'{section}.'):
      value = _get(config, field)
      _require(
          value in choices,
          f'config.{field}={value!r} is not one of {list(choices)}.',
      )


def _check_bounds(config, section):
  """The section's fields with bounds of their own (`_BOUNDS`)."""
  for field, bounds in _BOUNDS.items():
    if field.startswith(f'{section}.'):
      value = _get(config, field)
      _require(
          bounds.holds(value),
          f'config.{field}={value} must be {bounds.rule()}{bounds.note}.',
      )


def _check_model(config):
  """The model: known choices, an -it preset on -it weights, the LoRA rank."""
  _check_choices(config, 'model')
  _check_bounds(config, 'model')
  m = config.model
  _require(
      not (m.source == 'gguf' and gemma.is_instruction_tuned(m.preset)
           and gguf.is_packaged_path(m.path)),
      f'config.model.preset={m.preset!r} is instruction-tuned (chat '
      f'template), but config.model.path={m.path!r} loads the packaged '
      'pretrained Gemma 3 270M GGUF. Point config.model.path to an '
      'instruction-tuned (-it) Gemma 3 GGUF file, or use the pretrained '
      'preset (drop :it).',
  )
  _require(
      not (families.of_preset(m.preset) is not families.PACKAGED
           and m.source == 'gguf'
           and gguf.is_packaged_path(m.path)),
      f'config.model.preset={m.preset!r} is a Gemma 4 model, but '
      f'config.model.path={m.path!r} loads the packaged Gemma 3 270M GGUF. '
      "Point config.model.path to a Gemma 4 ('gemma4') GGUF file.",
  )
  _require(
      not m.get('lora_experts', False) or (
          getattr(gemma.model_config(m), 'enable_moe', False)
          and m.lora_rank > 0),
      f'config.model.lora_experts=True needs a mixture-of-experts preset '
      f'and config.model.lora_rank > 0; config.model.preset={m.preset!r} '
      f'(lora_rank {m.lora_rank}). Use gemma4_26b_a4b (or '
      'tiny_gemma4_moe), or set config.model.lora_experts=False.',
  )
  _require(
      not config.data.thinking or families.of_preset(m.preset).thinking,
      f'config.data.thinking=True needs a Gemma 4 preset (its <|think|> '
      f'switch); config.model.preset={m.preset!r} has none. Set '
      'config.data.thinking=False.',
  )


def _check_data(config, splits):
  """The data: known choices, a parsable source and its local files."""
  _check_choices(config, 'data')
  try:
    components = pipeline.parse_source(config.data.source)
  except ValueError as e:
    raise ConfigError(f'config.data.source: {e}') from e
  names = [name for name, _ in components]
  _check_synthetic_templates(config, names)
  _check_data_files(config, names, splits)


def _check_synthetic_templates(config, names):
  """Named templates exist, and a synthetic source is there to draw them."""
  chosen = pipeline.synthetic_templates(config)
  if not chosen:
    return
  try:
    synthetic.check_templates(chosen)
  except ValueError as e:
    raise ConfigError(f'config.data.synthetic_templates: {e}') from e
  _require(
      {'synthetic', 'synthetic_unseen'} & set(names),
      f'config.data.synthetic_templates={config.data.synthetic_templates!r} '
      f'names templates, but config.data.source={config.data.source!r} '
      "draws no synthetic problems; set it to '' or use a synthetic source.",
  )


def _check_data_files(config, names, splits):
  """The local data files ('jsonl', 'parquet') of `splits` must exist."""
  path = config.data.path
  for name in names:
    if name not in ('jsonl', 'parquet'):
      continue
    _require(
        bool(path),
        f"config.data.source uses '{name}', which reads config.data.path; "
        f'set it to a {name} file (local or gs://).',
    )
    files = dict.fromkeys(pipeline.split_path(path, s) for s in splits)
    for file in files:
      _require(
          storage.exists(file) and not storage.path(file).is_dir(),
          f'config.data.path: no {name} file at {file!r}; check the path.',
      )


def _check_rewards(config):
  """The overlong penalty fits the completion limit; every function loads."""
  r, gen = config.rewards, config.generation
  _check_bounds(config, 'rewards')
  _require(
      0 <= r.overlong_buffer <= gen.max_generation_steps,
      f'config.rewards.overlong_buffer={r.overlong_buffer} must be between 0 '
      '(off) and config.generation.max_generation_steps='
      f'{gen.max_generation_steps}.',
  )
  try:
    names = [name for name, _ in rewards.parse_spec(r.functions)]
    for name in names:
      rewards.resolve(name)  # Imports 'module:function' rewards.
  except ValueError as e:
    raise ConfigError(f'config.rewards.functions: {e}') from e
  # Rubric rows and the judge (data.task, judge.*).
  judge_checks.check(config, names, _require)


def _check_grpo(config):
  """GRPO: known choices, group size, KL controller, clipping, estimator."""
  _check_choices(config, 'grpo')
  _check_bounds(config, 'grpo')
  g = config.grpo
  _require(
      g.num_generations >= 2,
      f'config.grpo.num_generations={g.num_generations}: GRPO compares '
      'completions within a group, so it needs at least 2.',
  )
  _require(
      g.kl_target > 0 or g.init_kl_coeff == 0,
      f'config.grpo.init_kl_coeff={g.init_kl_coeff} applies only to the '
      'adaptive controller (grpo.kl_target > 0); for a fixed coefficient '
      'set grpo.beta instead.',
  )
  _require(
      g.kl_target == 0 or max(g.init_kl_coeff, g.beta) > 0,
      f'config.grpo.kl_target={g.kl_target} adapts the KL coefficient, '
      'which needs a start > 0: set grpo.init_kl_coeff or grpo.beta.',
  )
  _require(
      g.epsilon_high != 0,
      f'config.grpo.epsilon_high={g.epsilon_high} must be > 0, or negative '
      'for the same range as grpo.epsilon (0 clips every increase away).',
  )
  maxent = g.maxent_tau > 0
  _require(
      g.advantage_estimator in (('grpo', 'maxent') if maxent else
                                ('grpo', 'rloo')),
      f'config.grpo.advantage_estimator={g.advantage_estimator!r} with '
      f'config.grpo.maxent_tau={g.maxent_tau}: MaxEnt-GRPO is on exactly '
      "when maxent_tau > 0; set advantage_estimator='grpo' or maxent_tau.",
  )


def _check_generation(config):
  """Rollouts: lengths that fit the KV cache (evaluation's too), sampling."""
  gen = config.generation
  _check_bounds(config, 'generation')
  for name, steps in (('generation.max_generation_steps',
                       gen.max_generation_steps),
                      ('eval.max_generation_steps',
                       config.eval.max_generation_steps)):
    need = gen.max_prompt_length + steps
    _require(
        need <= gen.kv_cache_size,
        f'config.generation.max_prompt_length ({gen.max_prompt_length}) + '
        f'config.{name} ({steps}) = {need} exceeds the KV cache '
        f'(config.generation.kv_cache_size={gen.kv_cache_size}). Raise '
        'kv_cache_size or shorten the lengths.',
    )
  if gen.stop_sequences != 'auto':
    try:
      rollout.parse_stop_sequences(gen.stop_sequences)
    except ValueError as e:
      raise ConfigError(f'config.{e}') from None


def _check_agent(config):
  """Tools that import and take typed arguments; limits that can be met."""
  agent = config.agent
  _check_choices(config, 'agent')
  if not (agent.tools or agent.environment):
    return
  _require(
      not (agent.tools and agent.environment),
      f'config.agent.tools={agent.tools!r} and config.agent.environment='
      f'{agent.environment!r}: set one (agent.tools builds the tool '
      'environment).')
  try:
    if agent.tools:
      tools.resolve(agent.tools)
    else:
      environment.resolve_factory(agent.environment)
  except tools.ToolConfigError as e:
    raise ConfigError(f'config.{e}') from None
  if agent.tools:
    # Calls, results and turns are written in one family's tokens.
    model_family = families.of_preset(config.model.preset)
    family, want = model_family.title, model_family.tool_format
    writes = families.of_tool_format(agent.format).title
    _require(
        writes == family,
        f'config.agent.format={agent.format!r} writes {writes} turns, but '
        f'model.preset={config.model.preset!r} is a {family} model; set '
        f'config.agent.format={want!r}.')
  _check_bounds(config, 'agent')


def _check_optimizer(config):
  """AdamW: a positive learning rate, a warmup share, clipping >= 0."""
  _check_bounds(config, 'optimizer')


def _check_training(config, process_count):
  """Steps and a batch that splits into micro-batches and over processes."""
  t = config.training
  _check_bounds(config, 'training')
  _require(
      t.batch_size % t.micro_batch_size == 0,
      f'config.training.batch_size={t.batch_size} is not divisible by '
      f'config.training.micro_batch_size={t.micro_batch_size}; pick a '
      'micro-batch size that divides the batch size.',
  )
  _require(
      t.batch_size % process_count == 0,
      f'config.training.batch_size={t.batch_size} is not divisible by the '
      f'{process_count} processes; every host needs the same number of '
      'prompts.',
  )


def _check_checkpoint(config):
  """Save interval and checkpoints kept."""
  _check_bounds(config, 'checkpoint')


def _check_eval(config):
  """Evaluation interval, pass@k and batch (its length: _check_generation)."""
  _check_bounds(config, 'eval')


def _tp_dims(model_cfg):
  """The model dimensions tunix's Gemma 3 splits over the 'tp' axis."""
  cfg = gemma.model_config(model_cfg)
  dims = {
      'attention heads': cfg.num_heads,
      'model width': cfg.embed_dim,
      'MLP width': cfg.hidden_dim,
  }
  if cfg.num_kv_heads > 1:  # tunix does not split a single KV head.
    dims['KV heads'] = cfg.num_kv_heads
  return dims


def tp_sizes(model_cfg):
  """The 'tp' mesh axis sizes that divide every dimension split over it."""
  limit = math.gcd(*_tp_dims(model_cfg).values())
  return [d for d in range(1, limit + 1) if limit % d == 0]


def _check_tp(config, tp, resolved):
  """The 'tp' axis divides every model dimension tunix shards over it.

  A size that does not divide one of them would fail later, when weights
  are placed.
  """
  if tp == 1 or config.model.preset not in gemma.PRESETS:
    return
  dims = _tp_dims(config.model)
  bad = {name: n for name, n in dims.items() if n % tp}
  if bad:
    sizes = tp_sizes(config.model)
    raise ConfigError(
        f'config.mesh.shape={resolved}: its tp axis ({tp}) does not divide '
        f'the {config.model.preset} '
        + ', '.join(f'{name} ({n})' for name, n in bad.items())
        + f'. Use a tp size in {sizes} (fsdp takes the rest, e.g. '
        f"--config.mesh.shape='(-1, {max(d for d in sizes if d <= tp)})')."
    )


def _check_mesh(config, num_devices):
  """Mesh axes, sizes and the batch split over the data-parallel axes."""
  mesh = config.mesh
  names, shape = tuple(mesh.axis_names), tuple(mesh.shape)
  _require(
      len(names) == len(shape),
      f'config.mesh.shape={shape} and config.mesh.axis_names={names} differ '
      'in length; give one name per axis.',
  )
  _require(
      set(names) <= set(sharding.AXIS_NAMES) and len(set(names)) == len(names)
      and {'fsdp', 'tp'} <= set(names),
      f'config.mesh.axis_names={names}: use distinct names from '
      f'{sharding.AXIS_NAMES}, including fsdp and tp (the names tunix shards '
      'Gemma weights over).',
  )
  if num_devices is None:
    import jax  # pylint: disable=g-import-not-at-top
    num_devices = jax.device_count()
  try:
    resolved = sharding.resolve_shape(shape, num_devices)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  _check_tp(config, dict(zip(names, resolved))['tp'], resolved)
  parallel = math.prod(
      size for name, size in zip(names, resolved)
      if name in sharding.BATCH_AXES
  )
  t = config.training
  for field, rows in (
      ('batch_size', t.batch_size * config.grpo.num_generations),
      ('micro_batch_size', t.micro_batch_size * config.grpo.num_generations),
  ):
    _require(
        rows % parallel == 0,
        f'config.training.{field} x grpo.num_generations = {rows} '
        f'completions are not divisible by the {parallel}-way data '
        f'parallelism of config.mesh.shape={resolved} (axes '
        f'{sharding.BATCH_AXES}). Change the batch or the mesh.',
    )


def _check_alarms(config):
  """Windows are step counts; shares are in [0, 1]."""
  alarms = config.alarms
  for field in ('entropy_steps', 'zero_std_steps', 'clipped_steps'):
    _require(
        isinstance(alarms[field], int) and alarms[field] >= 0,
        f'config.alarms.{field}={alarms[field]!r} must be a whole number of '
        'steps >= 0 (0 turns the alarm off).',
    )
  _check_bounds(config, 'alarms')


def _check_logging(config):
  """A report interval >= 1; a W&B project needs the (optional) wandb."""
  _check_bounds(config, 'logging')
  project = config.logging.wandb_project
  if project:
    _require(
        importlib.util.find_spec('wandb') is not None,
        f'config.logging.wandb_project={project!r} needs the wandb package, '
        "which is not installed: run `pip install wandb`, or set "
        "--config.logging.wandb_project='' to log to TensorBoard only.",
    )


def _check_workdir(workdir):
  """A local workdir (or its nearest existing parent) must be writable."""
  if not workdir or '://' in str(workdir):
    return  # Object stores are checked when first written.
  existing = os.path.abspath(workdir)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  _require(
      os.path.isdir(existing),
      f'--workdir={workdir}: {existing} is a file, not a directory.',
  )
  writable = os.access(existing, os.W_OK | os.X_OK)
  if writable:  # access() says yes to root even where writes fail.
    try:
      with tempfile.TemporaryFile(dir=existing):
        pass  # Removed on close: nothing is left behind.
    except OSError:
      writable = False
  _require(
      writable,
      f'--workdir={workdir}: {existing} is not writable; pick a directory '
      'you can write to.',
  )
