"""Gemma 3 270M (pretrained) trained on rubric rows, judged by itself.

The policy answers the shipped general-knowledge rubric rows
(agent_tunix/configs/rubrics, installed with the package: 36 train, 12
held out; four items each: the answer, a fact, at most two sentences, a
pitfall), and the `rubric_judge` reward asks the in-process Gemma judge
(the same 270M base weights with LoRA off) for P(yes) on every item. No
server, no network:

  python -m agent_tunix.main --config=configs/gemma3_270m_rubrics.py --workdir=/tmp/rubrics

The judge's agreement with the rows' labelled verdicts:

  python -m agent_tunix.judge_agreement --config=configs/gemma3_270m_rubrics.py

Measured (2-core CPU). With the question and reference answer in its
prompt the pretrained 270M is no judge: it agrees with 61.8% of the 144
labelled item verdicts of the 12 held-out rows (saying "yes" to every item
would agree with 58.3%) and ranks the best labelled answer first in 0 of
12 rows. Asked about the response and the criterion alone
(rubrics/judge_item_prompt.txt, this preset's judge.prompt_file,
chosen on the 36 training rows, where it ranks 29 of 36 first against 3
of 36) it ranks 7 of the 12 held-out rows right (chance: 4), with 58.3%
agreement (still yes to nearly every item). Both prompts fail the canary
(right answer 0.609, wrong 0.672 with this one), so this preset skips it,
to measure what GRPO does against such a judge. In 40 steps (15 min) the
held-out rubric score by this judge went from 0.500 [0.476, 0.523] to
0.499 [0.471, 0.526]: its scores differ between answers by 0.01-0.1
where the labels differ by 1.1, too little to learn from here. Judged by
the rubric rules instead (a rule judge over HTTP), the held-out score
went from 0.417 [0.248, 0.585] to 0.646 [0.460, 0.831] (0.625 with the
old prompt): a rise, with intervals that overlap. For a run that can
learn, point judge.preset / judge.source / judge.path at a larger Gemma
(with `--config.judge.canary=True`), or use judge.backend=http (with
`--config.judge.prompt_file=`: this preset's file asks about one item, as
only the gemma judge does).
"""

import os

from agent_tunix.configs import base
from agent_tunix.configs import gemma3_270m

# Package data next to this file (installed with the package).
_RUBRICS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'rubrics')
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
