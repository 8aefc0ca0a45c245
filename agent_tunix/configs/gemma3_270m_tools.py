"""Gemma 3 270M (pretrained) learning to use a calculator, on CPU.

The default preset (configs/gemma3_270m.py) with tools: every problem is a
multi-turn episode in which the model may call `calculator` (Gemma 3's
Python-style call list; the result comes back as a <tool_response> turn)
before it answers. The problems need arithmetic a 270M model gets wrong in
its head (data.difficulty=4: two or three operations on 2- to 4-digit
numbers). The prompt shows three worked episodes, each one call and the
answer, after a short tool list. Training samples 4 episodes for each of 8
prompts a step, with a KL anchor to the base model.

  python -m agent_tunix.main --config=configs/gemma3_270m_tools.py --workdir=/tmp/tools

Base model with and without tools, on the same held-out problems:

  python -m agent_tunix.evaluate --config=configs/gemma3_270m_tools.py --allow_base
  python -m agent_tunix.evaluate --config=configs/gemma3_270m_tools.py --allow_base --config.agent.tools=
"""

from agent_tunix.configs import base
from agent_tunix.configs import gemma3_270m


def get_config(arg=None):
  config = gemma3_270m.get_config()
  config.agent.tools = 'calculator'
  # Two or three operations on 2- to 4-digit numbers.
  config.data.difficulty = 4
  # The tool list and three worked episodes: 388-422 tokens. Prompt and
  # episode stay within the model's 512-token sliding window, so the update
  # runs each prompt once per group (grpo.share_prompts).
  config.generation.max_prompt_length = 424
  # A call turn (~20 tokens), its result (~26 with the turn markers) and a
  # terse answer (~20).
  config.generation.max_generation_steps = 88
  config.eval.max_generation_steps = 88
  config.agent.max_turn_tokens = 64
  config.agent.max_tool_output_tokens = 32
  config.generation.kv_cache_size = 512
  # Every prompt opens with the same tool list and worked episodes (the
  # first 344 columns, rounded down): prefilled once a batch, not once a
  # row, which about halves an evaluation batch's time and leaves the
  # episodes the same.
  config.generation.shared_prefix = True
  # The update's log-prob passes take the whole completion as one chunk:
  # no recomputed logits in the backward pass, at [4 rows, 88, 262144]
  # float32 logits (369 MB) a micro-batch; faster than the default 64 (two
  # chunks of 44), for memory a CPU has.
  config.grpo.logps_chunk_size = config.generation.max_generation_steps
  # Sampled closer to the greedy episodes that evaluation scores: hotter
  # rollouts call the tool far less often than greedy decoding does.
  config.generation.temperature = 0.7
  # A small bonus for a call that ran, so that the policy keeps calling.
  config.agent.tool_use_bonus = 0.5
  # A KL anchor to the base model, which copies the tool's result into its
  # answer. Without it, while no episode of a batch is right only the
  # format rewards move the policy, and its answers can drift away from
  # the tool's result until none is right. It costs a reference log-prob
  # pass (a forward over every episode) a step.
  config.grpo.beta = 0.04
  # 8 prompts x 4 episodes a step, without an entropy bonus: the same 32
  # episodes as 4 x 8, from twice the problems, so that each update sees
  # more of the six problem types. An entropy bonus lets entropy climb in
  # steps without a right episode, the start of the drift above.
  config.training.batch_size = 8
  config.grpo.num_generations = 4
  config.grpo.entropy_coeff = 0.0
  # 36 steps and two 256-problem evaluations: about an hour on a small
  # CPU, which decides the time.
  config.training.num_steps = 36
  # A checkpoint every 6 steps (39 MB each; 3 kept): a run killed without
  # SIGTERM (out of memory) would otherwise lose every step since its
  # start. Orbax writes in the background, but each save first checks the
  # state (a forward over the step's batch, so that no diverged state is
  # saved) and checksums it, which holds the training loop meanwhile.
  config.checkpoint.save_interval_steps = 6
  return base.apply_arg(config, arg)
