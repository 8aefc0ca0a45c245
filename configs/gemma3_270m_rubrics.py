"""Gemma 3 270M (pretrained) trained on rubric rows, judged by itself.

The policy answers the shipped general-knowledge rubric rows
(data/rubrics: 36 train, 12 held out; four items each: the answer, a
fact, at most two sentences, a pitfall), and the `rubric_judge` reward
asks the in-process Gemma judge (the same 270M base weights with LoRA
off) for P(yes) on every item. No server, no network:

  python -m agent_tunix.main --config=configs/gemma3_270m_rubrics.py --workdir=/tmp/rubrics

The judge's agreement with the rows' labelled verdicts:

  python -m agent_tunix.judge_agreement --config=configs/gemma3_270m_rubrics.py

Measured (2-core CPU): the pretrained 270M is not a judge. It agrees
with 61.8% of the 144 labelled item verdicts of the 12 held-out rows
(saying "yes" to every item would agree with 58.3%), ranks the best
labelled answer first in 0 of 12 rows, and fails the canary (a right
answer 0.535, a wrong one 0.582). Worked examples in the judge prompt
(ranking 8 of 12, agreement 41.7%) and calibrating P(yes) against an
empty response (agreement 50.7%, ranking 0 of 12) did not make it pass.
This preset therefore skips the canary, to measure what GRPO does against
such a judge: in 40 steps (23 min) the held-out rubric score went from
0.500 [0.474, 0.525] to 0.491 [0.469, 0.514] (no change; the judge marks
nearly every item met, pitfalls too), while the small format reward was
learned (75% -> 100%). For a run that can learn, point judge.preset /
judge.source / judge.path at a larger Gemma (with
`--config.judge.canary=True`), or use judge.backend=http.
"""

import os

from configs import base
from configs import gemma3_270m

_RUBRICS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'data', 'rubrics')
_DATA = os.path.join(_RUBRICS, '{split}.jsonl')


def get_config(arg=None):
  config = gemma3_270m.get_config()
  config.data.task = 'rubric'
  config.data.source = 'jsonl'
  config.data.path = _DATA
  config.data.reference_column = 'reference_answer'
  # Every row of the small set (36 train, 12 held out).
  config.data.num_train_examples = 0
  config.data.num_eval_examples = 0
  config.data.system_prompt = (
      'Answer the question. Give your reasoning between <reasoning> and '
      '</reasoning>, then a short answer between <answer> and </answer>.')
  config.rewards.functions = 'rubric_judge=1,format_exact=0.05'
  config.judge.backend = 'gemma'
  config.judge.batch_size = 16
  # Response and criterion only (docstring): the 270M ranks answers with it.
  config.judge.prompt_file = os.path.join(_RUBRICS, 'judge_item_prompt.txt')
  # The 270M fails the canary (docstring): this preset measures what GRPO
  # does against that judge, so it skips the check (and logs that it did).
  config.judge.canary = False
  # Judge noise is amplified by per-group std scaling: centre only.
  config.grpo.scale_rewards = 'none'
  config.grpo.beta = 0.0
  config.generation.max_generation_steps = 64
  config.eval.max_generation_steps = 64
  config.eval.batch_size = 12
  config.training.num_steps = 40
  return base.apply_arg(config, arg)
