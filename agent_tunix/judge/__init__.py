"""Judges for rubric rewards: an OpenAI-compatible server or a Gemma.

  judge = judge_lib.from_config(config, workdir)   # judge.Judge
  scores = judge.score(tasks)                      # one per completion

See docs/rubrics.md.
"""
