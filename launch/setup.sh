#!/bin/bash
# Prepares every worker of the TPU VM for launch/run.sh. Safe to run again:
# each step is skipped when its result is already there.
#
# Usage:
#   bash launch/setup.sh [--extra-files=PATH[:PATH...]] [--dry-run]
#     [--retries=N]
#
# Needs TPU_NAME, ZONE and PROJECT (or --tpu-name=, --zone=, --project=); see
# launch/common.sh.
#
# Steps:
#   1. Copies this repository to ~/agent_tunix on all workers (the same copy
#      run.sh makes: the files git tracks, plus --extra-files; refused while
#      a run is going). Says how much it sends.
#   2. On each worker: installs tmux if missing; finds a Python >= 3.11, and
#      when there is none (TPU VM images ship an older python3) installs
#      python3.11 and python3.11-venv from the deadsnakes PPA
#      (ppa:deadsnakes/ppa) with apt (which waits up to 10 minutes for the
#      dpkg lock that a fresh VM's unattended upgrades hold for a while
#      after boot); makes the virtualenv ~/agent_tunix_venv
#      unless it exists; pip-installs ~/agent_tunix/requirements.txt and then
#      jax[tpu] at the jax version that requirements.txt installed (this
#      brings libtpu). pip leaves what is already satisfied alone.

set -euo pipefail
# shellcheck source=launch/common.sh source-path=SCRIPTDIR/..
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

while (($#)); do
  arg="$1"
  shift
  if parse_common_flag "$arg" || parse_copy_flag "$arg"; then
    continue
  fi
  usage_error "unknown argument '$arg'"
done
require_settings TPU_NAME ZONE PROJECT

python="$REMOTE_VENV/bin/python"
# A fresh TPU VM runs unattended upgrades for a while after boot: apt waits
# for their dpkg lock (up to 10 minutes) instead of failing at once.
apt_get='sudo DEBIAN_FRONTEND=noninteractive apt-get'
apt_get+=' -o DPkg::Lock::Timeout=600'
apt_install="$apt_get install -y -q"
# shellcheck disable=SC2016  # expanded by the worker, not here
setup_command="$(
  one_line <<EOF
set -e
if ! command -v tmux >/dev/null 2>&1; then
  echo "installing tmux on \$(hostname)"
  $apt_get update -q && $apt_install tmux
fi
py=''
for c in python3.13 python3.12 python3.11 python3; do
  if command -v "\$c" >/dev/null 2>&1 &&
    "\$c" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    py="\$c"
    break
  fi
done
if [ -z "\$py" ]; then
  echo "installing python3.11 from ppa:deadsnakes/ppa on \$(hostname)"
  $apt_get update -q
  $apt_install software-properties-common
  sudo add-apt-repository -y -n ppa:deadsnakes/ppa
  $apt_get update -q
  $apt_install python3.11 python3.11-venv
  py=python3.11
fi
if [ ! -x $python ]; then
  if ! "\$py" -c 'import ensurepip' 2>/dev/null; then
    ver=\$("\$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    $apt_install "python\$ver-venv"
  fi
  echo "creating $REMOTE_VENV with \$py on \$(hostname)"
  "\$py" -m venv $REMOTE_VENV
fi
if [ ! -f $REMOTE_CODE/requirements.txt ]; then
  echo "$REMOTE_CODE/requirements.txt not found on \$(hostname)" >&2
  exit $REFUSED_RC
fi
$python -m pip install -q -r $REMOTE_CODE/requirements.txt
jax_version=\$($python -c \
  'import importlib.metadata as m; print(m.version("jax"))')
$python -m pip install -q "jax[tpu]==\$jax_version"
echo "setup done on \$(hostname): \$($python --version), jax \$jax_version"
EOF
)"

stage_code
info "copying $REPO_DIR to $TPU_NAME:$REMOTE_CODE on all workers"
retry copy_code
info "installing Python, the virtualenv and requirements on all workers"
retry tpu_ssh all "$setup_command"
if ((!DRY_RUN)); then
  info "done. Start training with:" \
    "bash launch/run.sh --config=... --workdir=gs://..."
fi
