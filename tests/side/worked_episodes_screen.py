"""Side check, not run by CI: the base model's accuracy under other worked
episodes in the tools prompt.

`python -m agent_tunix.evaluate --allow_base --by_type` with
`data/prompts.py`'s TOOL_FEW_SHOT_EXAMPLES replaced, for the process only,
by one of the VARIANTS below: how the base model does at step 0 when the
worked episodes show something else (docs/results.md, "Why the preset's
settings").

  python tests/side/worked_episodes_screen.py steps \
      --config=configs/gemma3_270m_tools.py --allow_base \
      --config.data.num_eval_examples=128 --by_type \
      --config.generation.max_prompt_length=560 \
      --config.generation.kv_cache_size=720 \
      --config.eval.max_generation_steps=150

The first argument names the variant; the rest are evaluate's flags. The
prompts of some variants outgrow the preset's 424 tokens, hence the larger
prompt and cache budgets (the same for every variant compared). A worked
episode with several calls is written as one call per model turn, each
result inserted before the next call, as a rollout holds a sequential
episode (`agent.formats.ToolFormat.example_turns` alone puts several calls
in one turn, for calls that do not depend on each other).
"""
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, _REPO)
# pylint: disable=g-import-not-at-top,wrong-import-position
from agent_tunix import cli
from agent_tunix import evaluate
from agent_tunix.agent import formats
from agent_tunix.data import prompts
from agent_tunix.run import errors

_C = 'calculator'
_PAREN = (
    'Sam earns $35 an hour and pays $9 an hour for lunch. He works 12 '
    'hours, then buys a $60 coat. How many dollars are left?',
    ((_C, {'expression': '(35 - 9) * 12 - 60'}),),
    ('252',), '252 dollars.', '252')
VARIANTS = {
    # The preset's three episodes, one call each.
    'v0': prompts.TOOL_FEW_SHOT_EXAMPLES,
    # The same problems in two calls: the first product (or product of
    # three), then the rest with the tool's result.
    'steps': (
        (prompts.TOOL_FEW_SHOT_EXAMPLES[0][0],
         ((_C, {'expression': '4 * 25'}),
          (_C, {'expression': '125 + 100 - 38'})),
         ('100', '187'), '187 cards.', '187'),
        (prompts.TOOL_FEW_SHOT_EXAMPLES[1][0],
         ((_C, {'expression': '64 * 3'}),
          (_C, {'expression': '192 + 58 * 9'})),
         ('192', '714'), '714 km.', '714'),
        (prompts.TOOL_FEW_SHOT_EXAMPLES[2][0],
         ((_C, {'expression': '35 * 8 * 12'}),
          (_C, {'expression': '3360 - 900'})),
         ('3360', '2460'), '2460 dollars.', '2460'),
    ),
    # The third episode (a * b * c - d) replaced by one with parentheses,
    # (a - b) * c - d: a shape neither the training nor the unseen
    # templates have.
    'paren': prompts.TOOL_FEW_SHOT_EXAMPLES[:2] + (_PAREN,),
}

_one_turn_example = formats.ToolFormat.example_turns


def _sequential_example(self, calls, results, answer, reasoning=''):
  """Several calls as one call per model turn, each result before the next."""
  if len(calls) < 2:
    return _one_turn_example(self, calls, results, answer, reasoning)
  text = ''
  for (name, arguments), result in zip(calls, results):
    call = formats.Call(name, dict(arguments))
    text += (self.render_calls([call]) + self.call_end
             + self.render_results([formats.Result(name, str(result))]))
  return text + answer


if __name__ == '__main__':
  if len(sys.argv) < 2 or sys.argv[1] not in VARIANTS:
    sys.exit(f'usage: {sys.argv[0]} {{{",".join(VARIANTS)}}} '
             '[evaluate flags]')
  prompts.TOOL_FEW_SHOT_EXAMPLES = VARIANTS[sys.argv.pop(1)]
  formats.ToolFormat.example_turns = _sequential_example
  cli.run(errors.cli(evaluate.main))
