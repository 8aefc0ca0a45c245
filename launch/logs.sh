#!/bin/bash
# Shows the training log of one worker of the TPU VM (by default the last 100
# lines, then follows it; Ctrl-C to stop watching: the run goes on).
#
# Usage:
#   bash launch/logs.sh [--worker=N] [--lines=N] [--no-follow] [--dry-run]
#
# Needs TPU_NAME, ZONE and PROJECT (or --tpu-name=, --zone=, --project=); see
# launch/common.sh.
#
# Flags:
#   --worker=N    worker number, 0 (the default) to number of hosts - 1, or
#                 'all' for every worker's log interleaved
#   --lines=N     lines of history to show first (100)
#   --no-follow   print them and exit instead of following the log
#   --dry-run     print the gcloud command, run nothing

set -euo pipefail
# shellcheck source=launch/common.sh source-path=SCRIPTDIR/..
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

worker=0
lines=100
follow=1
while (($#)); do
  arg="$1"
  shift
  if parse_common_flag "$arg"; then
    continue
  fi
  case "$arg" in
    --worker=*) worker="${arg#*=}" ;;
    --lines=*) lines="${arg#*=}" ;;
    --no-follow) follow=0 ;;
    *) usage_error "unknown argument '$arg'" ;;
  esac
done
require_settings TPU_NAME ZONE PROJECT
if [[ ! "$worker" =~ ^([0-9]+|all)$ ]]; then
  usage_error "--worker must be a worker number or 'all', got '$worker'"
fi
if [[ ! "$lines" =~ ^[0-9]+$ ]]; then
  usage_error "--lines must be a whole number, got '$lines'"
fi

# Each worker has one log file, named after its worker number.
if ((follow)); then
  command="tail -n $lines -F $REMOTE_LOGS/worker_*.log"
else
  command="tail -n $lines $REMOTE_LOGS/worker_*.log"
fi
# Interactive and long-running: not retried (Ctrl-C would count as a failure).
tpu_ssh "$worker" "$command"
