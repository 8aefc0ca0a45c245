"""The GRPO algorithm: what turns prompts into a better policy.

rollout (prompts -> G completions each, with the sampler's log-probs),
shared_prefix (the prompts' common leading tokens prefilled once),
episodes (multi-turn rows that pause for tools or an environment and resume
in the same KV cache), episode_stats (the agent/* metrics of a batch of
episodes and the tool-use bonus), step_rollout (a training step's rollout:
prompts -> scored, masked groups -> the update batch), staging (the update
batch on the mesh with its log-prob passes dispatched), dynamic_sampling
(groups with a reward spread), objectives (the pure array
math of GRPO and its variants), advantages (the advantage estimators by
name), losses (the policy losses, correction and terms by name), logprobs (model passes that score tokens),
packing (those passes on packed rows, padding-free),
remat, optimizer, grpo (the jitted update) and evaluation (the accuracy of a
policy on a split). Modules here may import each other and the layers below
(agent_tunix.data, models, rewards, tpu); never config, observe, run or a
command.
"""
