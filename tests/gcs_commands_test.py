"""The commands on a gs:// workdir, against the Cloud Storage emulator:
a sweep whose runs read their JSONL data from the bucket and train there,
then generate and evaluate from one of those runs' checkpoints.

(main, evaluate and plot on gs:// run in pod_rehearsal_test; export in
export_test; the 2-process job in multihost_test.)"""

import json
import os
import subprocess
import sys

import gcs_emulator
from agent_tunix import storage

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(env, module, *args):
  out = subprocess.run(
      [sys.executable, '-m', module, *args], cwd=_REPO, capture_output=True,
      text=True, timeout=600, check=False,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu', **env})
  assert out.returncode == 0, (module, out.stderr[-3000:])
  return out


def test_sweep_generate_and_evaluate_on_a_gcs_workdir(monkeypatch):
  with gcs_emulator.emulator('agent-tunix-cmds') as gcs:
    monkeypatch.setenv('STORAGE_EMULATOR_HOST', gcs.url)
    data = f'gs://{gcs.bucket}/data'
    for split, rows in (('train', range(4)), ('test', range(20, 22))):
      storage.write_text(f'{data}/{split}.jsonl', ''.join(
          json.dumps({'question': f'What is {i} + 1?', 'answer': str(i + 1)})
          + '\n' for i in rows))
    sweep = f'gs://{gcs.bucket}/sweep'
    common = ('--config=configs/tiny.py', '--config.data.source=jsonl',
              f'--config.data.path={data}/{{split}}.jsonl',
              '--config.data.num_train_examples=4')
    _run(gcs.env, 'agent_tunix.sweep', *common, f'--workdir={sweep}',
         '--config.training.num_steps=1', '--config.eval.pass_at_k=0',
         '--sweep=optimizer.learning_rate=0.001')
    summary = json.loads(storage.read_text(f'{sweep}/sweep.json'))
    runs = summary['runs'] if isinstance(summary, dict) else summary
    assert [r['status'] for r in runs] == ['finished'], runs
    run = f'{sweep}/learning_rate=0.001'
    assert storage.exists(f'{run}/checkpoints/1/commit_success.txt')
    assert storage.exists(f'{sweep}/sweep.md')

    out = _run(gcs.env, 'agent_tunix.generate', *common, f'--workdir={run}',
               '--prompt=What is 3 + 4?', '--max_new_tokens=4',
               '--temperature=0')
    assert out.stdout.strip(), out.stderr[-2000:]
    out = _run(gcs.env, 'agent_tunix.evaluate', *common, f'--workdir={run}',
               '--config.eval.pass_at_k=0')
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result['step'] == 1 and result['num_questions'] == 2
    # Nothing of the runs went to the local disk.
    assert not os.path.exists(os.path.join(_REPO, 'gs:'))
