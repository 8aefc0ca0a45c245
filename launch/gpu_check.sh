#!/usr/bin/env bash
# The accelerator check: measures the trainer on a GPU machine in one command.
#
#   bash launch/gpu_check.sh --bundle=.whl/gpu_bundle    # here: the wheels
#   bash launch/gpu_check.sh --out=DIR                   # there: the check
#   bash launch/gpu_check.sh --rehearse --out=DIR        # here, on the CPU
#
# --bundle=B (alone) builds, on a machine with PyPI, the folder the GPU
#   machine needs (launch/gpu_bundle.py): the wheels it lacks
#   for the training path (read off the import graph), pinned fallbacks and
#   the SentencePiece model; at most 40 MiB; prints its size.
#   --python_tag=312 (default) is the GPU machine's CPython.
# --out=DIR runs there, from the repo root, with B carried (default
#   .whl/gpu_bundle): installs B's wheels with pip --no-index --no-deps
#   --target, prints versions and devices, runs an import smoke test (with
#   B's pins installed over the machine's flax/optax/orbax/protobuf if the
#   machine's own fail it; failing again it stops, naming the versions),
#   then the stages of agent_tunix/bench/gpu_check.py, each under its own
#   time limit, all before a deadline --budget_s seconds after the start
#   (default 510; with the backstop's grace, under 9 minutes in all; 540
#   with --rehearse, whose venv counts too). DIR/results.json and
#   DIR/results.md are rewritten after each stage; DIR/check.log holds
#   the output.
# --rehearse --out=DIR does the same here on the CPU at tiny shapes: a bundle
#   for this Python (DIR/bundle), a fresh virtualenv DIR/venv holding only
#   the packages the GPU machine has that the training path imports (the
#   versions installed here), the bundle installed on top with --no-deps
#   --target, then --out. Under 10 minutes on 2 cores.
#
# --stages=a,b runs only those stages (a second call on a warm machine);
# --shapes=tiny runs the rehearsal's workloads with --out.
#
# Exit status: 0 when no stage failed (a stage stopped at its limit or
# skipped for lack of time is not a failure), 1 when one did or the smoke
# test failed, 2 for bad arguments.
set -euo pipefail

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON_SET="${PYTHON:-}"
PYTHON="${PYTHON:-python3}"
BUNDLE=""
OUT=""
REHEARSE=0
PYTHON_TAG=312
BUDGET_S=""
SHAPES=gpu
STAGES=grpo,mfu,decode,tunix,grpo_tools,big
# Where the bundle is installed and JAX keeps compiled programs: outside
# DIR, so that DIR holds only the few files a device call brings back, and
# kept between calls on a warm machine (a rerun loads, not compiles).
SITE_DIR="${GPU_CHECK_SITE:-/tmp/agent_tunix_gpu_site}"
CACHE_DIR="${GPU_CHECK_JAX_CACHE:-/tmp/agent_tunix_jax_cache}"
START_S=$(date +%s)

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

for arg in "$@"; do
  case "$arg" in
    --bundle=*) BUNDLE="${arg#*=}" ;;
    --out=*) OUT="${arg#*=}" ;;
    --rehearse) REHEARSE=1 ;;
    --python_tag=*) PYTHON_TAG="${arg#*=}" ;;
    --budget_s=*) BUDGET_S="${arg#*=}" ;;
    --stages=*) STAGES="${arg#*=}" ;;
    --shapes=*) SHAPES="${arg#*=}" ;;
    -h|--help) usage ;;
    *) echo "gpu_check.sh: unknown argument $arg" >&2; usage ;;
  esac
done

log() { echo "[gpu_check $(( $(date +%s) - START_S ))s] $*" >&2; }

# The project's Python here (--bundle, --rehearse): $PYTHON, else the
# README's .venv, else python3; it must import the training path.
dev_python() {
  if [[ -z "${PYTHON_SET:-}" && -x "$REPO_DIR/.venv/bin/python" ]]; then
    PYTHON="$REPO_DIR/.venv/bin/python"
  fi
  "$PYTHON" -c 'import jax, tunix, qwix' 2>/dev/null || {
    echo "gpu_check.sh: $PYTHON cannot import jax, tunix and qwix: run it" \
         "in the project's virtualenv (README) or set PYTHON=" >&2; exit 2; }
}

# Builds the bundle B for CPython tag T with the project's Python.
build_bundle() {
  local dest tag="$2"
  mkdir -p "$1"
  dest="$(cd "$1" && pwd)"
  (cd "$REPO_DIR" && "$PYTHON" launch/gpu_bundle.py \
      --dest="$dest" --python_tag="$tag")
  du -sh "$dest"
}

# Records a stage the Python process could not: $1 stage, $2 status, $3 why.
record() {
  "$PY" -m agent_tunix.bench.gpu_results --out="$OUT" --stage="$1" \
      --status="$2" --reason="$3" || true
}

# Reads one field of DIR/results.json (empty when absent).
result_field() {
  "$PY" -c 'import json, sys
r = json.load(open(sys.argv[1]))
v = r
for k in sys.argv[2].split("."):
  v = (v or {}).get(k)
print("" if v is None else v)' "$OUT/results.json" "$1" 2>/dev/null || true
}

install_bundle() {
  log "installing $BUNDLE/wheels into $SITE_DIR"
  rm -rf "$SITE_DIR" "$SITE_DIR.pins"
  "$PY" -m pip install -q --no-index --no-deps --no-cache-dir --upgrade \
      --target "$SITE_DIR" "$BUNDLE"/wheels/*.whl
  export PYTHONPATH="$SITE_DIR:$REPO_DIR"
}

smoke() {
  local deadline=$(( START_S + BUDGET_S ))
  timeout --kill-after=10 "${SMOKE_S:-120}" \
      "$PY" -m agent_tunix.bench.gpu_check --out="$OUT" --shapes="$SHAPES" \
      --tokenizer="$BUNDLE/tokenizer.model" --stages=smoke --rerun \
      --deadline="$deadline"
}

run_check() {
  : "${OUT:?}"
  [[ -d "$BUNDLE/wheels" && -f "$BUNDLE/tokenizer.model" ]] || {
    echo "gpu_check.sh: no bundle at $BUNDLE (build it with --bundle=$BUNDLE" \
         "and carry it)" >&2; exit 2; }
  mkdir -p "$OUT"
  OUT="$(cd "$OUT" && pwd)"
  BUNDLE="$(cd "$BUNDLE" && pwd)"
  cd "$REPO_DIR"
  local py_tag bundle_tag
  py_tag="$("$PY" -c 'import sys; print("%d%d" % sys.version_info[:2])')"
  bundle_tag="$("$PY" -c 'import json, sys
print(json.load(open(sys.argv[1]))["python_tag"])' "$BUNDLE/bundle.json")"
  [[ "$py_tag" == "$bundle_tag" ]] || {
    echo "gpu_check.sh: $BUNDLE holds cp$bundle_tag wheels but $PY is" \
         "cp$py_tag: rebuild it with --python_tag=$py_tag" >&2; exit 2; }
  export JAX_COMPILATION_CACHE_DIR="$CACHE_DIR"
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
  export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
  export PYTHONUNBUFFERED=1
  log "python: $("$PY" -c 'import sys; print(sys.version, sys.executable)')"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
    # The machine is ours alone: let JAX take more than its default 75%.
    : "${XLA_PYTHON_CLIENT_MEM_FRACTION:=.9}"
    export XLA_PYTHON_CLIENT_MEM_FRACTION
  fi
  install_bundle
  log "import smoke test with the machine's packages"
  if ! smoke; then
    log "smoke test failed; retrying with the bundle's pins over the machine's"
    "$PY" -m pip install -q --no-index --no-deps --no-cache-dir --upgrade \
        --target "$SITE_DIR.pins" "$BUNDLE"/pins/*.whl
    export PYTHONPATH="$SITE_DIR.pins:$SITE_DIR:$REPO_DIR"
    if ! smoke; then
      log "smoke test failed with the pins too: see the error above"
      "$PY" - <<'EOF' >&2 || true
import importlib.metadata as md
for n in ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'protobuf',
          'tensorstore', 'google-tunix', 'qwix', 'numpy'):
  try:
    print(f'{n}=={md.version(n)}')
  except md.PackageNotFoundError:
    print(f'{n}: not installed')
EOF
      exit 1
    fi
  fi
  local deadline=$(( START_S + BUDGET_S )) left rc running
  while :; do
    left=$(( deadline - $(date +%s) ))
    (( left > 20 )) || break
    rc=0
    # The stages stop themselves at the deadline; this is the backstop.
    timeout --kill-after=10 "$(( left + 15 ))" \
        "$PY" -m agent_tunix.bench.gpu_check --out="$OUT" --shapes="$SHAPES" \
        --tokenizer="$BUNDLE/tokenizer.model" --stages="$STAGES" \
        --deadline="$deadline" || rc=$?
    (( rc == 0 )) && break
    running="$(result_field running)"
    if [[ -n "$running" ]]; then
      # The process died in a stage without recording it (the watchdog
      # records its own timeouts): killed at the deadline, or a crash.
      if (( rc == 124 || rc == 137 )); then
        record "$running" timeout "the process was stopped at the deadline"
      else
        record "$running" error "the process exited with status $rc"
      fi
    elif (( rc != 124 )); then
      log "the check exited with status $rc outside any stage"; break
    fi
  done
  "$PY" -m agent_tunix.bench.gpu_results --out="$OUT" --finish="$STAGES"
  cat "$OUT/results.md"
  log "done in $(( $(date +%s) - START_S )) s; results in $OUT"
  grep -q '| error |' "$OUT/results.md" && exit 1
  exit 0
}

rehearse() {
  : "${OUT:?--rehearse needs --out=DIR}"
  mkdir -p "$OUT"
  OUT="$(cd "$OUT" && pwd)"
  local tag venv="$OUT/venv"
  tag="$("$PYTHON" -c 'import sys; print("%d%d" % sys.version_info[:2])')"
  log "bundle for cp$tag in $OUT/bundle"
  BUNDLE="$OUT/bundle"
  build_bundle "$BUNDLE" "$tag"
  log "fresh virtualenv $venv with the machine's packages only"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$PYTHON" -c 'import json, sys
b = json.load(open(sys.argv[1]))
print("\n".join(f"{k}=={v}" for k, v in b["machine"].items()))' \
      "$BUNDLE/bundle.json" > "$OUT/machine_requirements.txt"
  "$venv/bin/python" -m pip install -q --no-deps \
      -r "$OUT/machine_requirements.txt"
  if "$venv/bin/python" -c 'import tensorflow' 2>/dev/null; then
    echo "gpu_check.sh: tensorflow is importable in $venv" >&2; exit 1
  fi
  PY="$venv/bin/python"
  SHAPES=tiny
  export JAX_PLATFORMS=cpu
  CACHE_DIR="$OUT/jax_cache"
  SITE_DIR="$OUT/site"
  run_check
}

if (( REHEARSE )); then
  BUDGET_S="${BUDGET_S:-540}"
  dev_python
  PY="$PYTHON"
  mkdir -p "${OUT:?--rehearse needs --out=DIR}"
  rehearse 2>&1 | tee "$OUT/check.log"
  exit "${PIPESTATUS[0]}"
elif [[ -n "$OUT" ]]; then
  BUDGET_S="${BUDGET_S:-510}"
  PY="$PYTHON"
  BUNDLE="${BUNDLE:-$REPO_DIR/.whl/gpu_bundle}"
  mkdir -p "$OUT"
  run_check 2>&1 | tee "$OUT/check.log"
  exit "${PIPESTATUS[0]}"
elif [[ -n "$BUNDLE" ]]; then
  dev_python
  build_bundle "$BUNDLE" "$PYTHON_TAG"
else
  usage
fi
