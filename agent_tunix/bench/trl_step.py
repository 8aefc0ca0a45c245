"""Section trl: the same GRPO step with TRL's GRPOTrainer (torch, optional)."""

import dataclasses
import gc
import importlib.util
import os

import jax

from agent_tunix.bench import context
from agent_tunix.bench import options
from agent_tunix.bench import records
from agent_tunix.models import gemma


def trl_grpo(ctx):
  """Times TRL's GRPOTrainer on the same weights (GGUF); a measurement side."""
  config = ctx.config
  needed = ('torch', 'trl', 'peft', 'transformers', 'datasets')
  missing = [n for n in needed if importlib.util.find_spec(n) is None]
  if missing:
    raise records.Skipped(
        f'needs {", ".join(needed)} importable (torch, trl and peft are '
        f'optional, not in requirements.txt); missing: {", ".join(missing)}'
    )
  # pylint: disable=g-import-not-at-top
  import datasets
  import peft
  import torch
  import transformers
  import trl
  # pylint: enable=g-import-not-at-top
  if config.model.source != 'gguf':
    raise records.Skipped(
        f"TRL reads the same weights from the GGUF file, so it needs "
        f"model.source='gguf' (got {config.model.source!r})."
    )
  gen, g, t, m = (config.generation, config.grpo, config.training,
                  config.model)
  hp = context.peer_hparams(ctx, "TRL's GRPOTrainer")
  path = gemma.resolve_path(config.model)
  directory, filename = os.path.split(path)
  dtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16}[m.dtype]
  tokenizer = trl_tokenizer(ctx, transformers)
  model = transformers.AutoModelForCausalLM.from_pretrained(
      directory, gguf_file=filename, dtype=dtype
  )
  total_steps = context.WARMUP_STEPS + options.STEPS.value
  args, dropped = _grpo_args(ctx, trl, hp.beta, total_steps)
  lora_config = _lora_config(m, peft)
  begins, ends = [], []
  dataset = datasets.Dataset.from_dict(
      {'prompt': ctx.prompts * total_steps}
  )
  trainer = trl.GRPOTrainer(
      model=model, reward_funcs=[context.toy_reward], args=args,
      train_dataset=dataset, processing_class=tokenizer,
      peft_config=lora_config,
      callbacks=[_step_timer(transformers, begins, ends)],
  )
  trainer.train()
  times = [e - b for b, e in zip(begins, ends)]
  if len(times) < total_steps:
    raise RuntimeError(f'TRL ran {len(times)} of {total_steps} steps.')
  tokens = t.batch_size * g.num_generations * gen.max_generation_steps
  note = ('step = TrainerCallback on_step_begin to on_step_end (generation, '
          'reference and update inside); total only. Tokenizer: ours (the '
          'same prompt token ids), as a transformers GemmaTokenizer; '
          f'gradient_checkpointing={getattr(args, "gradient_checkpointing", None)}'
          f', torch threads {torch.get_num_threads()}.')
  if dropped:
    note += f' GRPOConfig of this TRL has no {", ".join(dropped)}.'
  side = records.step_summary(
      f'TRL GRPOTrainer {trl.__version__} (torch {torch.__version__})',
      times[context.WARMUP_STEPS:], times[:context.WARMUP_STEPS], tokens,
      note=note,
  )
  del trainer, model
  gc.collect()
  return side


def _grpo_args(ctx, trl, beta, total_steps):
  """TRL's GRPOConfig at the workload's settings.

  Returns:
    (the config, the sorted settings this TRL's GRPOConfig has no field for
    and so were left out).
  """
  config = ctx.config
  gen, g, t, m = (config.generation, config.grpo, config.training,
                  config.model)
  loss_types = {'token-mean': 'bnpo', 'sequence-mean-token-mean': 'grpo',
                'sequence-mean-token-sum-norm': 'dr_grpo'}
  wanted = {
      'output_dir': os.path.join(ctx.session.workdir, 'trl'),
      'per_device_train_batch_size': t.micro_batch_size * g.num_generations,
      'gradient_accumulation_steps': t.batch_size // t.micro_batch_size,
      'num_generations': g.num_generations,
      'max_prompt_length': gen.max_prompt_length,
      'max_completion_length': gen.max_generation_steps,
      'beta': beta,
      'epsilon': g.epsilon,
      'num_iterations': 1,
      'loss_type': loss_types[g.loss_agg_mode],
      'temperature': gen.temperature,
      'top_k': gen.top_k or None,
      'top_p': gen.top_p,
      'learning_rate': config.optimizer.learning_rate,
      'max_steps': total_steps,
      'logging_steps': 1,
      'report_to': 'none',
      'save_strategy': 'no',
      'use_cpu': jax.default_backend() == 'cpu',
      'bf16': m.dtype == 'bfloat16',
      'seed': config.training.seed,
      'disable_tqdm': True,
      # Same fixed completion length as the other sides.
      'generation_kwargs': {'min_new_tokens': gen.max_generation_steps},
  }
  known = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
  dropped = sorted(set(wanted) - known)
  args = trl.GRPOConfig(**{k: v for k, v in wanted.items() if k in known})
  return args, dropped


def _lora_config(model_config, peft):
  """peft's LoRA on every projection at our rank and alpha; None at rank 0."""
  if model_config.lora_rank <= 0:
    return None
  return peft.LoraConfig(
      r=model_config.lora_rank, lora_alpha=model_config.lora_alpha,
      task_type='CAUSAL_LM',
      target_modules=['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj',
                      'up_proj', 'down_proj'],
  )


def _step_timer(transformers, begins, ends):
  """A TrainerCallback appending each step's begin and end times."""

  class StepTimer(transformers.TrainerCallback):

    def on_step_begin(self, *args, **kwargs):
      begins.append(records.now())

    def on_step_end(self, *args, **kwargs):
      ends.append(records.now())

  return StepTimer()


def trl_tokenizer(ctx, transformers):
  """Our SentencePiece model as a transformers GemmaTokenizer (adds BOS).

  transformers' own tokenizer from the GGUF file splits text into about
  twice as many tokens as the SentencePiece model (196 against 104 for the
  bench prompt at bucket 128), so TRL would prefill longer prompts than the
  other sides. This one gives the prompt token ids our side uses; checked.
  """
  directory = os.path.join(ctx.session.workdir, 'trl_tokenizer')
  os.makedirs(directory)
  with open(os.path.join(directory, 'tokenizer.model'), 'wb') as f:
    f.write(ctx.tokenizer.serialized_model_proto())
  tokenizer = transformers.GemmaTokenizer.from_pretrained(
      directory, add_bos_token=True
  )
  for text, tokens, mask in zip(ctx.prompts, ctx.prompt_tokens,
                                ctx.prompt_mask):
    ids = tokenizer(text=[text])['input_ids'][0]
    if list(ids) != [int(x) for x in tokens[mask]]:
      raise RuntimeError(
          f'TRL side: the transformers tokenizer built from our SentencePiece '
          f'model gives {len(ids)} ids for a bench prompt where ours gives '
          f'{int(mask.sum())}; the workloads would differ.'
      )
  return tokenizer
