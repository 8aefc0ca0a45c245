#!/bin/bash
# Copies this repository to every worker of the TPU VM and starts training
# there, in a detached tmux session named agent_tunix.
#
# Usage:
#   bash launch/run.sh --config=configs/gemma3_1b.py --workdir=gs://BUCKET/run \
#     [--config.FIELD=VALUE ...] [--restart] [--grace=SECONDS] \
#     [--extra-files=PATH[:PATH...]] [--dry-run] \
#     [--coordinator-address=HOST:PORT --num-processes=N] \
#     [-- MORE_TRAINER_FLAGS ...]
#
# Needs TPU_NAME, ZONE and PROJECT (or --tpu-name=, --zone=, --project=); see
# launch/common.sh. Run launch/setup.sh once first.
#
# Every worker runs, from ~/agent_tunix,
#   ~/agent_tunix_venv/bin/python -m agent_tunix.main --multihost \
#     --config=... --workdir=... [--config.FIELD=VALUE ...] [MORE_TRAINER_FLAGS]
# with its output appended to ~/agent_tunix_logs/worker_N.log (N is the
# worker number), which is also copied to <workdir>/logs/worker_N.log every
# 30 seconds and when the trainer exits. Override values are passed through
# exactly, whatever characters they hold.
#
# On a Cloud TPU VM the workers find each other by themselves
# (jax.distributed.initialize() reads the pod's metadata). Where they cannot,
# e.g. the CPU rehearsal of a whole pod's life on one machine
# (tests/pod_rehearsal_test.py), --coordinator-address=HOST:PORT and
# --num-processes=N make every worker run the trainer with
#   --coordinator_address=HOST:PORT --num_processes=N --process_id=N_WORKER
# where N_WORKER is its worker number (as in its log's name).
#
# The workdir should be on gs://: all workers write the same checkpoints
# there, and a run started again with the same --workdir (after a preemption,
# say) resumes from the latest one.
#
# Refuses to start while a run is going, unless --restart: then that run is
# sent SIGTERM, given --grace seconds (default 120) to checkpoint and exit,
# and killed.
#
# What is sent: the files git tracks, as they are in your working tree, and
# --extra-files (EXTRA_FILES); the config file must be one of them. Before
# anything is copied, this machine's Python (PYTHON, the local interpreter
# with requirements.txt installed; default python3) is asked, in a second,
# which credentials the config's weights need:
#   (cd REPO && $PYTHON -m agent_tunix.credentials --config=... [overrides])
# A Kaggle handle (e.g. configs/gemma3_1b.py) needs your Kaggle API key
# (KAGGLE_USERNAME and KAGGLE_KEY, or ~/.kaggle/kaggle.json), a gated
# Hugging Face repo (the Gemma 4 presets) HF_TOKEN (or
# ~/.cache/huggingface/token); the offline GGUF default needs none. Each is
# sent to every worker as a file of mode 0600 (~/.kaggle/kaggle.json,
# ~/.cache/huggingface/token), never on a command line; a missing one is
# refused in one line (exit 2). A misspelled config field is refused there
# too (exit 2).
#
# Then the preflight compiles the run's training programs for
# ACCELERATOR_TYPE on this machine (libtpu compiles for a TPU it does not
# have; 6.5 to 14.5 minutes and up to 24 GB of host RAM for the presets
# measured in docs/tpu.md):
#   (cd REPO && $PYTHON -m agent_tunix.preflight --config=... \
#      --topology=$ACCELERATOR_TYPE [--config.FIELD=VALUE ...])
# and nothing is started unless it says the run fits. run.sh says which of
# these it was, with the exit status of agent_tunix/cli.py: 1 the run does
# not fit the chips' HBM (the preflight names the program, the bytes over
# and the fixes) or the preflight failed (a traceback above); 2 the config
# or a flag is wrong; 3 a compile was killed for host memory, or the
# preflight was interrupted. --skip-preflight starts without it.
#
# Flags:
#   --config=FILE[:ARG]      config file, relative to the repository root,
#                            or a preset's name (gemma3_1b:it is
#                            agent_tunix/configs/gemma3_1b.py:it)
#   --workdir=DIR            output directory (gs:// for a multi-host pod)
#   --config.FIELD=VALUE     config override, passed to the trainer
#   --restart                stop a running job first
#   --grace=SECONDS          how long --restart waits (120)
#   --skip-preflight         start without compiling for ACCELERATOR_TYPE
#   --extra-files=A:B        send these untracked files or folders too
#                            (relative to the repository root; EXTRA_FILES)
#   --coordinator-address=HOST:PORT, --num-processes=N
#                            both or neither: name the jax.distributed
#                            coordinator (worker 0) and the number of
#                            workers, for workers that are not on a Cloud
#                            TPU VM (see above)
#   --dry-run                print the gcloud commands, run nothing
#   --retries=N              attempts per gcloud step (RETRIES, 3)
#   -- ARGS...               further trainer flags, passed through as given

set -euo pipefail
# shellcheck source=launch/common.sh source-path=SCRIPTDIR/..
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

config=''
workdir=''
restart=0
grace=120
skip_preflight=0
coordinator=''
num_processes=''
trainer_args=()
overrides=()
while (($#)); do
  arg="$1"
  shift
  if parse_common_flag "$arg" || parse_copy_flag "$arg"; then
    continue
  fi
  case "$arg" in
    --config=*) config="${arg#*=}" ;;
    --workdir=*) workdir="${arg#*=}" ;;
    --config.*=*)
      trainer_args+=("$arg")
      overrides+=("$arg")
      ;;
    --restart) restart=1 ;;
    --skip-preflight) skip_preflight=1 ;;
    --grace=*) grace="${arg#*=}" ;;
    --coordinator-address=*) coordinator="${arg#*=}" ;;
    --num-processes=*) num_processes="${arg#*=}" ;;
    --)
      trainer_args+=("$@")
      break
      ;;
    *) usage_error "unknown argument '$arg'" ;;
  esac
done

require_settings TPU_NAME ZONE PROJECT
if [[ -z "$config" ]]; then
  usage_error "--config is required (e.g. --config=configs/gemma3_1b.py)"
fi
if [[ -z "$workdir" ]]; then
  usage_error "--workdir is required (e.g. --workdir=gs://BUCKET/runs/name)"
fi
if [[ ! "$grace" =~ ^[0-9]+$ ]]; then
  usage_error "--grace must be a whole number of seconds, got '$grace'"
fi
if [[ -n "$coordinator" || -n "$num_processes" ]]; then
  if [[ ! "$coordinator" =~ ^[^[:space:]]+:[0-9]+$ ]]; then
    usage_error "--coordinator-address must be HOST:PORT (with" \
      "--num-processes=N), got '$coordinator'"
  fi
  if [[ ! "$num_processes" =~ ^[1-9][0-9]*$ ]]; then
    usage_error "--num-processes must be a positive number (with" \
      "--coordinator-address=HOST:PORT), got '$num_processes'"
  fi
fi
if [[ "$workdir" != gs://* ]]; then
  warn "--workdir=$workdir is not a gs:// path: each worker of a" \
    "multi-host pod would write to its own disk, and checkpoints could not" \
    "be shared or resumed after a preemption"
fi
config_file="${config%%:*}"
python="${PYTHON:-python3}"

stage_code
# A preset's name: the trainer takes it as it is (agent_tunix/cli.py).
preset="agent_tunix/configs/${config_file%.py}.py"
if [[ "$config_file" != */* && ! -f "$CODE_DIR/$config_file" \
      && -f "$CODE_DIR/$preset" ]]; then
  config_file="$preset"
fi
if [[ ! -f "$CODE_DIR/$config_file" ]]; then
  if [[ -f "$REPO_DIR/$config_file" ]]; then
    config_error "not started: $config_file is not tracked by git, so the" \
      "workers would not get it; git add it, or pass" \
      "--extra-files=$config_file"
  fi
  config_error "not started: config file '$config_file' not found under" \
    "$REPO_DIR (--config is relative to the repository root, or a preset's" \
    "name: a file of agent_tunix/configs without .py)"
fi

# Which credentials the config's weights need ('NAME WHAT' lines).
check=("$python" -m agent_tunix.credentials "--config=$config")
if ((${#overrides[@]})); then
  check+=("${overrides[@]}")
fi
set +e
needs="$(cd "$REPO_DIR" && "${check[@]}")"
check_rc=$?
set -e
optional=0
if ((check_rc == 2)); then
  config_error "not started: the config or an override is wrong (the line" \
    "above says which); nothing was copied"
elif ((check_rc != 0)); then
  warn "could not ask $python which credentials the config needs (exit" \
    "$check_rc; PYTHON names an interpreter with requirements.txt" \
    "installed); sending the ones you have"
  needs=$'kaggle your Kaggle key\nhuggingface your Hugging Face token'
  optional=1
fi
while read -r name what; do
  case "$name" in
    kaggle | huggingface) ;;
    *) continue ;;
  esac
  if add_credential "$name" || ((optional)); then
    continue
  fi
  if [[ "$name" == kaggle ]]; then
    config_error "not started: the weights ($what) come from Kaggle and no" \
      "Kaggle API key was found: accept the Gemma licence on kaggle.com," \
      "then export KAGGLE_USERNAME and KAGGLE_KEY or save your kaggle.json" \
      "as ~/.kaggle/kaggle.json (docs/tpu.md, Your first pod run)"
  fi
  config_error "not started: the weights ($what) are a gated Hugging Face" \
    "repo and HF_TOKEN is not set (nor ~/.cache/huggingface/token): accept" \
    "the licence on huggingface.co/$what, then export HF_TOKEN=<a read" \
    "token> (docs/tpu.md, Your first pod run)"
done <<<"$needs"

if ((!skip_preflight)); then
  if [[ -z "${ACCELERATOR_TYPE:-}" ]]; then
    info "the preflight compiles the run for ACCELERATOR_TYPE" \
      "(--skip-preflight starts without it)"
  fi
  require_settings ACCELERATOR_TYPE
  preflight=("$python" -m agent_tunix.preflight "--config=$config"
    "--topology=$ACCELERATOR_TYPE")
  if ((${#overrides[@]})); then
    preflight+=("${overrides[@]}")
  fi
  if ((DRY_RUN)); then
    echo "(cd $(quote "$REPO_DIR") && $(quote_all "${preflight[@]}"))"
  else
    info "preflight: compiling the training programs for $ACCELERATOR_TYPE" \
      "(no TPU needed; 6.5 to 14.5 minutes and up to 24 GB of host RAM for" \
      "a 1B to 4B model)"
    # Its output is shown and kept: exit status 1 is either its verdict or
    # a crash, and only the output tells them apart.
    preflight_log="$WORK_DIR/preflight.log"
    set +e
    (cd "$REPO_DIR" && "${preflight[@]}") 2>&1 | tee "$preflight_log"
    preflight_rc=${PIPESTATUS[0]}
    set -e
    case "$preflight_rc" in
      0) ;;
      1)
        if grep -q -e '^DOES NOT FIT' -e '^preflight: .* does not fit ' \
          "$preflight_log"; then
          die "not started: the run does not fit $ACCELERATOR_TYPE (the" \
            "preflight above names what and the fixes); change the config," \
            "or pass --skip-preflight to start anyway"
        fi
        die "not started: the preflight failed (exit status 1, output" \
          "above) before it could tell whether the run fits; fix that, or" \
          "pass --skip-preflight"
        ;;
      2)
        config_error "not started: the preflight refused the config or a" \
          "flag (the line above says which); nothing was copied"
        ;;
      3)
        echo "$SCRIPT: not started: the preflight was killed or" \
          "interrupted before it could tell whether the run fits (a compile" \
          "killed for host memory says KILLED above: run it on a machine" \
          "with more RAM, docs/tpu.md), or pass --skip-preflight" >&2
        exit "$KILLED_RC"
        ;;
      *)
        die "not started: the preflight failed with exit status" \
          "$preflight_rc (output above); fix it, or pass --skip-preflight"
        ;;
    esac
  fi
fi

# The script each worker runs inside tmux. The trainer runs in a subshell
# that records its pid (launch/stop.sh signals it) and execs python; `tee -i`
# ignores Ctrl-C so the log keeps the trainer's last words.
trainer="$REMOTE_VENV/bin/python -m agent_tunix.main --multihost"
trainer+=" $(quote_all "--config=$config" "--workdir=$workdir")"
if [[ -n "$coordinator" ]]; then
  trainer+=" $(quote_all "--coordinator_address=$coordinator" \
    "--num_processes=$num_processes")"
  # shellcheck disable=SC2016  # $worker: the worker script's variable
  trainer+=' --process_id="$worker"'
fi
if ((${#trainer_args[@]})); then
  trainer+=" $(quote_all "${trainer_args[@]}")"
fi
# Beside it, the log mirror copies the worker's log to
# <workdir>/logs/worker_N.log every 30 s and, after the trainer's last line
# ("exited with status"), once more before it exits
# (agent_tunix/run/log_mirror.py): the log outlives the VM.
mirror="$REMOTE_VENV/bin/python -m agent_tunix.run.log_mirror"
mirror+=" --log=\"\$log\" $(quote "--workdir=$workdir") --worker=\"\$worker\""
mirror+=" '--done_marker=exited with status'"
# shellcheck disable=SC2016  # expanded by the worker, not here
worker_script=(
  '#!/bin/bash'
  '# Written by launch/run.sh; runs this worker of agent_tunix (in tmux).'
  'set -uo pipefail'
  'url=http://metadata.google.internal/computeMetadata/v1/instance/attributes'
  'worker="${TPU_WORKER_ID:-$(curl -sf -m 5 -H Metadata-Flavor:Google '\
'"$url/agent-worker-number" || hostname)}"'
  "log=$REMOTE_LOGS/worker_\$worker.log"
  'echo "=== $(date -u +%FT%TZ) worker $worker on $(hostname)" | tee -a "$log"'
  "( cd $REMOTE_CODE && exec $mirror ) >> \"\$log\" 2>&1 &"
  'mirror=$!'
  "( echo \"\$BASHPID\" > $REMOTE_LOGS/pid; cd $REMOTE_CODE && exec $trainer )"\
' 2>&1 | tee -ia "$log"'
  'status=${PIPESTATUS[0]}'
  'echo "=== $(date -u +%FT%TZ) exited with status $status" | tee -a "$log"'
  'wait "$mirror"'
  "rm -f $REMOTE_LOGS/pid"
  'exit "$status"'
)
# Started only where no session exists: a retry after a partial start leaves
# the workers that did start alone. The worker script's words are spliced in
# after one_line, which would break a newline inside an override.
start_head="$(
  one_line <<EOF
mkdir -p $REMOTE_LOGS
$(remote_credential_modes)
if tmux has-session -t $SESSION 2>/dev/null; then
  echo "agent_tunix already started on \$(hostname)"
else
EOF
)"
start_tail="$(
  one_line <<EOF
tmux new-session -d -s $SESSION 'bash $REMOTE_LOGS/launch.sh' &&
  echo "started agent_tunix on \$(hostname)"
fi
EOF
)"
start_command="$start_head printf '%s\n' $(quote_all "${worker_script[@]}")"
start_command+=" > $REMOTE_LOGS/launch.sh; $start_tail"

if ((restart)); then
  # shellcheck disable=SC2034  # read by copy_code
  RESTART_GRACE="$grace"
fi
info "copying $REPO_DIR to $TPU_NAME:$REMOTE_CODE on all workers"
retry copy_code
info "starting the trainer in tmux session '$SESSION' on all workers"
retry tpu_ssh all "$start_command"
if ((!DRY_RUN)); then
  info "started. Follow worker 0 with: bash launch/logs.sh" \
    "(TensorBoard: bash launch/tensorboard.sh --workdir=$workdir;" \
    "stop: bash launch/stop.sh)"
fi
