#!/bin/bash
# Shows TensorBoard for a run's workdir.
#
# Usage:
#   bash launch/tensorboard.sh --workdir=gs://BUCKET/run [--port=6006] \
#     [--tunnel] [--dry-run]
#
# Without --tunnel, runs `tensorboard --logdir=WORKDIR` here: needs a local
# TensorBoard that can read gs:// (pip install tensorboard tensorflow-cpu) and
# Google credentials (gcloud auth application-default login). Needs no
# settings.
#
# With --tunnel, runs TensorBoard from ~/agent_tunix_venv on worker 0 of the
# TPU VM (which can read the bucket with its service account) and forwards
# localhost:PORT here to it over ssh. Needs TPU_NAME, ZONE and PROJECT (or
# --tpu-name=, --zone=, --project=); see launch/common.sh.
#
# Either way, open http://localhost:PORT. Ctrl-C stops it.
#
# Where STORAGE_EMULATOR_HOST is set (a Cloud Storage emulator, docs/tpu.md
# "Cloud Storage (gs://)"; on worker 0 with --tunnel, here without),
# TensorBoard reads with --load_fast=false: its fast loader
# (tensorboard-data-server) reads gs:// with a client of its own that knows
# only the real service, while the Python loader reads through gcsfs, which
# honours the variable.
#
# Flags:
#   --workdir=DIR  the --workdir given to launch/run.sh
#   --port=PORT    local (and remote) port (6006)
#   --tunnel       run TensorBoard on worker 0, forward the port
#   --dry-run      print the command, run nothing

set -euo pipefail
# shellcheck source=launch/common.sh source-path=SCRIPTDIR/..
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

workdir=''
port=6006
tunnel=0
while (($#)); do
  arg="$1"
  shift
  if parse_common_flag "$arg"; then
    continue
  fi
  case "$arg" in
    --workdir=*) workdir="${arg#*=}" ;;
    --port=*) port="${arg#*=}" ;;
    --tunnel) tunnel=1 ;;
    *) usage_error "unknown argument '$arg'" ;;
  esac
done
if ((tunnel)); then
  require_settings TPU_NAME ZONE PROJECT
else
  require_settings
fi
if [[ -z "$workdir" ]]; then
  usage_error "--workdir is required (e.g. --workdir=gs://BUCKET/runs/name)"
fi
if [[ ! "$port" =~ ^[0-9]+$ ]]; then
  usage_error "--port must be a port number, got '$port'"
fi

if ((tunnel)); then
  tb="$REMOTE_VENV/bin/tensorboard"
  check="$(
    one_line <<EOF
if [ ! -x $tb ]; then
  echo "$tb not found on \$(hostname); install it with:" \
    "$REMOTE_VENV/bin/pip install tensorboard" >&2
  exit $REFUSED_RC
fi
EOF
  )"
  command="$check; exec $tb $(quote_all "--logdir=$workdir")"
  command+=" --port=$port --host=localhost"
  # shellcheck disable=SC2016  # expanded by the worker, not here
  command+=' ${STORAGE_EMULATOR_HOST:+--load_fast=false}'
  info "TensorBoard on worker 0 of $TPU_NAME: open http://localhost:$port"
  # Long-running: not retried (Ctrl-C would count as a failure).
  tpu_ssh 0 "$command" -L "$port:localhost:$port"
else
  tensorboard_cmd=(tensorboard "--logdir=$workdir" "--port=$port")
  if [[ -n "${STORAGE_EMULATOR_HOST:-}" ]]; then
    tensorboard_cmd+=(--load_fast=false)
  fi
  if ((DRY_RUN)); then
    quote_all "${tensorboard_cmd[@]}"
    echo
    exit 0
  fi
  if ! command -v tensorboard >/dev/null 2>&1; then
    die "tensorboard not found here; pip install tensorboard tensorflow-cpu," \
      "or pass --tunnel to run it on worker 0"
  fi
  info "open http://localhost:$port"
  exec "${tensorboard_cmd[@]}"
fi
