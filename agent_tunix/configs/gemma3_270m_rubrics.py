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

The pretrained 270M is a weak judge: it says yes to nearly every item,
and fails the canary (it does not score a right answer above a wrong
one), so this preset skips the canary to show what GRPO does against such
a judge (docs/results.md). Asked about the response and the criterion
alone (rubrics/judge_item_prompt.txt, this preset's judge.prompt_file)
it ranks labelled answers better than with the question and reference
answer in its prompt. For a run that can learn, point judge.preset /
judge.source / judge.path at a larger Gemma (with
`--config.judge.canary=True`), or use judge.backend=http (with
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
