"""Judges for rubric rewards: an OpenAI-compatible server or a Gemma.

  judge = judge_lib.from_config(config, workdir)   # judge.Judge
  scores = judge.score(tasks)                      # one per completion

See docs/rubrics.md. Layer: below config (which checks judge.*), above
rl (the Gemma judge runs the policy's forward pass); it imports from rl,
data, models, rewards and tpu, never from config, observe or run.
"""
