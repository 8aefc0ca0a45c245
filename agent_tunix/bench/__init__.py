"""Benchmarks of this trainer against peers: `python -m agent_tunix.bench`.

One module per section (grpo_step, tunix_step, trl_step, decode_speed,
episode_speed, update_memory, tpu_preflight, checkpoint_io), the shared
workload (context), the JSON records (records), goals and table (report),
flags (options); `__main__` runs them and documents the JSON (`--help`).
packed_update (python -m agent_tunix.bench.packed_update) runs a config's
update on padded and on packed rows of its own rollout. gpu_check and
gpu_results are the check on a GPU machine
(launch/gpu_check.sh, which builds its offline bundle with
launch/gpu_bundle.py).
"""
