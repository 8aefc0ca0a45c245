"""Judges for rubric rewards: an OpenAI-compatible server or a Gemma.

  judge = judge_lib.from_config(config, workdir)   # judge.Judge
  scores = judge.score(tasks)                      # one per completion

judge (the run's judge: cache, failure policy, canary and metrics over a
backend), openai_backend (judge.backend='http'), gemma_backend
(judge.backend='gemma', P(yes) vs P(no) per item), prompts (the judge's
prompts and the strict reading of its replies), verdicts (`Verdict`, one
completion's answer), checks (the judge.* config checks validation calls)
and agreement (a judge against labelled verdicts, for
`python -m agent_tunix.judge_agreement`).

See docs/rubrics.md. Layer: below config (which checks judge.*), above
rl (the Gemma judge runs the policy's forward pass); it imports from rl,
data, models, rewards and tpu, never from config, observe or run.
"""
