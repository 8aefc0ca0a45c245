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
  # row. An evaluation batch of 32 took ~22 s, not ~43 s, with the same
  # greedy episodes (docs/results.md).
  config.generation.shared_prefix = True
  # The update's log-prob passes take the whole completion as one chunk:
  # no recomputed logits in the backward pass, at [4 rows, 88, 262144]
  # float32 logits (369 MB) a micro-batch. The reference pass and train
  # step took 59.7 s against 66.5 s at the default 64 (2 x 44) on a 2-core
  # CPU (docs/results.md).
  config.grpo.logps_chunk_size = config.generation.max_generation_steps
  # Sampled closer to the greedy episodes that evaluation scores
  # (docs/results.md, "Tools": the runs behind this preset's settings).
  config.generation.temperature = 0.7
  # A small bonus for a call that ran, so that the policy keeps calling.
  config.agent.tool_use_bonus = 0.5
  # A KL anchor to the base model, which copies the tool's result into its
  # answer. Without it (4 prompts x 8 episodes with an entropy bonus, the
  # preset before), at training seeds 7 and 1 the answers left the result
  # while no episode was right (the entropy bonus and the format rewards
  # alone moving the policy) and both runs ended at 0.0%; with it they
  # gained +20.0 and +5.9 points (docs/results.md, "A KL anchor"). It
  # costs a reference log-prob pass (a forward over every episode) a step.
  config.grpo.beta = 0.04
  # 8 prompts x 4 episodes a step, without an entropy bonus: the same 32
  # episodes as 4 x 8, from twice the problems, so that each update sees
  # more of the six problem types. At training seeds 42, 7 and 1 it gained
  # +13.7, +14.5 and +23.5 points (seed 1 before the one-chunk update
  # above; 4 x 8 with a bonus of 0.01: +14.1, +20.0 and +5.9). With
  # the bonus, 8 x 4 at seed 7 drifted (entropy 0.18 to 0.42 nats per
  # token) and gained +0.8 (docs/results.md, "More problems a step").
  config.training.batch_size = 8
  config.grpo.num_generations = 4
  config.grpo.entropy_coeff = 0.0
  # 36 steps and two 256-problem evaluations. The CPU decides the time: on
  # a 2-core AMD EPYC with AVX-512 the whole run took 64 min 19 s (79-111 s
  # between steps, an evaluation about 6 min; 77 min 21 s before the
  # one-chunk update); 8 x 4 steps took 215-238 s on an AVX2-only 2-core
  # one before it (docs/results.md, "Seeds, threads and machines").
  config.training.num_steps = 36
  # A checkpoint every 6 steps (39 MB each; 3 kept): the run is over an
  # hour on CPU, and one killed without SIGTERM (out of memory) would
  # otherwise lose every step since its start. Orbax writes in the
  # background, but each save first checks the state (a forward over the
  # step's batch, so that no diverged state is saved) and checksums it:
  # 24 s a save alone on 2 cores, about 2 minutes over the 5 mid-run saves
  # (docs/results.md).
  config.checkpoint.save_interval_steps = 6
  return base.apply_arg(config, arg)
