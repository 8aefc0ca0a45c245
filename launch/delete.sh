#!/bin/bash
# Deletes the TPU VM, or with --queued the queued resource together with its
# node. Asks for confirmation unless --yes. Checkpoints and metrics in the
# gs:// workdir are kept; the worker disks (logs included) are not.
#
# Usage:
#   bash launch/delete.sh [--queued] [--yes] [--dry-run] [--retries=N]
#
# Needs TPU_NAME, ZONE and PROJECT (or --tpu-name=, --zone=, --project=); see
# launch/common.sh.
#
# Flags:
#   --queued   the TPU was made with create.sh --queued: delete the queued
#              resource TPU_NAME and its node
#   --yes      do not ask
#   --dry-run  print the gcloud command, run nothing (and do not ask)

set -euo pipefail
# shellcheck source=launch/common.sh source-path=SCRIPTDIR/..
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

queued=0
yes=0
while (($#)); do
  arg="$1"
  shift
  if parse_common_flag "$arg"; then
    continue
  fi
  case "$arg" in
    --queued) queued=1 ;;
    --yes | -y) yes=1 ;;
    *) usage_error "unknown argument '$arg'" ;;
  esac
done
require_settings TPU_NAME ZONE PROJECT

if ((queued)); then
  what="queued resource $TPU_NAME and its TPU node"
else
  what="TPU VM $TPU_NAME"
fi
if ((!yes && !DRY_RUN)); then
  read -r -p "Delete $what in $ZONE (project $PROJECT)? [y/N] " answer ||
    answer=''
  if [[ ! "$answer" =~ ^[Yy]([Ee][Ss])?$ ]]; then
    die "not deleted (answer y, or pass --yes)"
  fi
fi

info "deleting $what"
# --quiet: we asked already; gcloud would ask again.
if ((queued)); then
  retry gcloud_cmd compute tpus queued-resources delete "$TPU_NAME" \
    --zone="$ZONE" --project="$PROJECT" --force --quiet
else
  retry gcloud_cmd compute tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" \
    --project="$PROJECT" --quiet
fi
