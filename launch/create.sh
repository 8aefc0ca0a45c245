#!/bin/bash
# Creates the TPU VM: directly, or with --queued as a queued resource (of the
# same name, holding one node named TPU_NAME) that Cloud TPU provisions when
# capacity is free.
#
# Usage:
#   bash launch/create.sh [--queued [--wait]] [--spot | --preemptible] \
#     [--dry-run] [--retries=N] [-- MORE_GCLOUD_FLAGS ...]
#
# Needs TPU_NAME, ZONE, PROJECT, ACCELERATOR_TYPE and RUNTIME_VERSION (or
# --tpu-name=, --zone=, --project=, --accelerator-type=, --runtime-version=);
# see launch/common.sh.
#
# Flags:
#   --queued       create a queued resource instead of the VM itself
#   --wait         with --queued: poll every 60 s until the node is ACTIVE
#   --spot         spot capacity: much cheaper, may be preempted at any time
#   --preemptible  preemptible TPU VM (not with --queued; use --spot there)
#   --dry-run      print the gcloud commands, run nothing
#   -- FLAGS...    appended to the gcloud create command as given (e.g.
#                  --reserved, --network=..., --labels=...)

set -euo pipefail
# shellcheck source=launch/common.sh source-path=SCRIPTDIR/..
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

queued=0
wait=0
capacity=()
extra=()
while (($#)); do
  arg="$1"
  shift
  if parse_common_flag "$arg"; then
    continue
  fi
  case "$arg" in
    --queued) queued=1 ;;
    --wait) wait=1 ;;
    --spot | --preemptible) capacity+=("$arg") ;;
    --)
      extra+=("$@")
      break
      ;;
    *) usage_error "unknown argument '$arg'" ;;
  esac
done
require_settings TPU_NAME ZONE PROJECT ACCELERATOR_TYPE RUNTIME_VERSION
if ((${#capacity[@]} > 1)); then
  usage_error "pass at most one of --spot and --preemptible"
fi
if ((queued)) && [[ "${capacity[*]}" == --preemptible ]]; then
  usage_error "queued resources have no --preemptible; use --spot"
fi
if ((wait && !queued)); then
  usage_error "--wait only applies to --queued (a direct create waits anyway)"
fi

if ((queued)); then
  info "requesting queued resource $TPU_NAME ($ACCELERATOR_TYPE in $ZONE)"
  retry gcloud_cmd compute tpus queued-resources create "$TPU_NAME" \
    --node-id="$TPU_NAME" --zone="$ZONE" --project="$PROJECT" \
    --accelerator-type="$ACCELERATOR_TYPE" \
    --runtime-version="$RUNTIME_VERSION" \
    ${capacity[@]+"${capacity[@]}"} ${extra[@]+"${extra[@]}"}
  describe=(compute tpus queued-resources describe "$TPU_NAME"
    --zone="$ZONE" --project="$PROJECT" --format='value(state.state)')
  if ((!wait)); then
    info "queued. Check its state with:"
    quote_all gcloud "${describe[@]}" >&2
    echo >&2
    info "then run launch/setup.sh once it is ACTIVE"
    exit 0
  fi
  while true; do
    if ((DRY_RUN)); then
      gcloud_cmd "${describe[@]}"
      break
    fi
    state="$(retry gcloud_cmd "${describe[@]}")"
    case "$state" in
      ACTIVE)
        info "$TPU_NAME is ACTIVE"
        break
        ;;
      FAILED | SUSPENDED | SUSPENDING | DELETING)
        die "queued resource $TPU_NAME is $state; details:" \
          "gcloud compute tpus queued-resources describe $TPU_NAME" \
          "--zone=$ZONE --project=$PROJECT"
        ;;
      *)
        info "$TPU_NAME is ${state:-in an unknown state}; checking again in 60s"
        sleep 60
        ;;
    esac
  done
else
  info "creating TPU VM $TPU_NAME ($ACCELERATOR_TYPE in $ZONE)"
  retry gcloud_cmd compute tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" \
    --project="$PROJECT" --accelerator-type="$ACCELERATOR_TYPE" \
    --version="$RUNTIME_VERSION" \
    ${capacity[@]+"${capacity[@]}"} ${extra[@]+"${extra[@]}"}
fi
