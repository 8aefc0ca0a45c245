"""Side check, not run by CI: held-out rubric score judged by rules.

The shipped rubric rows quote the word each item is about ("gives the
answer '366'", "mentions 'leap'"), so a judge of rules can score them: the
tests' fake judge server (tests/judge_fixtures.py: an item is met when its
quoted word is in the response, 'at most two sentences' when the response
has at most two full stops). This starts that server on 127.0.0.1 and runs
`python -m agent_tunix.evaluate` with `judge.backend=http` against it, for
each argument: 'base' (the base model) or WORKDIR:STEP (a checkpoint).

  python tests/side/rubric_rule_eval.py base /tmp/rubrics:40

It prints each evaluation's JSON line (rubric_score with its interval).
The config is configs/gemma3_270m_rubrics.py unless RUBRIC_CONFIG says
otherwise.
"""
import os
import subprocess
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
sys.path.insert(0, os.path.dirname(_HERE))
import judge_fixtures  # pylint: disable=g-import-not-at-top,wrong-import-position

config = os.environ.get('RUBRIC_CONFIG', 'configs/gemma3_270m_rubrics.py')
with judge_fixtures.FakeJudge(max_requests=100 * len(sys.argv),
                              lifetime_s=1800) as server:
  for spec in sys.argv[1:]:
    command = [sys.executable, '-m', 'agent_tunix.evaluate',
               f'--config={config}', '--config.judge.backend=http',
               f'--config.judge.base_url={server.url}',
               '--config.judge.model=rules', '--config.judge.prompt_file=',
               '--config.judge.cache=none']
    if spec == 'base':
      command.append('--allow_base')
    else:
      workdir, step = spec.rsplit(':', 1)
      command += [f'--workdir={workdir}', f'--step={step}']
    done = subprocess.run(command, cwd=_REPO, capture_output=True, text=True,
                          env=dict(os.environ, JAX_PLATFORMS='cpu'),
                          check=False)
    lines = done.stdout.strip().splitlines()
    print(spec, lines[-1] if lines and done.returncode == 0
          else done.stderr[-2000:], flush=True)
