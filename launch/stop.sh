#!/bin/bash
# Stops the training run on every worker of the TPU VM: sends the trainer
# SIGTERM (it saves a checkpoint on SIGTERM), waits up to --grace seconds for
# it to exit, kills whatever is left and closes the tmux session agent_tunix.
# The TPU VM keeps running (and costing): delete it with launch/delete.sh.
#
# Usage:
#   bash launch/stop.sh [--grace=SECONDS] [--dry-run] [--retries=N]
#
# Needs TPU_NAME, ZONE and PROJECT (or --tpu-name=, --zone=, --project=); see
# launch/common.sh.
#
# Flags:
#   --grace=SECONDS  how long to wait for the trainer to exit (120)
#   --dry-run        print the gcloud command, run nothing

set -euo pipefail
# shellcheck source=launch/common.sh source-path=SCRIPTDIR/..
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

grace=120
while (($#)); do
  arg="$1"
  shift
  if parse_common_flag "$arg"; then
    continue
  fi
  case "$arg" in
    --grace=*) grace="${arg#*=}" ;;
    *) usage_error "unknown argument '$arg'" ;;
  esac
done
require_settings TPU_NAME ZONE PROJECT
if [[ ! "$grace" =~ ^[0-9]+$ ]]; then
  usage_error "--grace must be a whole number of seconds, got '$grace'"
fi

info "stopping tmux session '$SESSION' on all workers of $TPU_NAME"
retry tpu_ssh all "$(remote_stop "$grace")"
