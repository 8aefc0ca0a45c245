# shellcheck shell=bash disable=SC2034
# (SC2034: the settings set here are read by the scripts that source this.)
#
# Shared code of the launch/*.sh scripts. Sourced by them, never run.
#
# Settings come from the environment and may be overridden by flags of the
# same meaning:
#   TPU_NAME         --tpu-name=NAME          TPU VM (and queued resource) name
#   ZONE             --zone=ZONE              e.g. us-west4-a
#   PROJECT          --project=PROJECT        Google Cloud project id
#   ACCELERATOR_TYPE --accelerator-type=TYPE  e.g. v5litepod-16
#   RUNTIME_VERSION  --runtime-version=VER    TPU software version, e.g.
#                                             v2-alpha-tpuv5-lite
#   RETRIES          --retries=N              attempts per gcloud step (3)
#   RETRY_DELAY      (seconds)                first wait between attempts (10),
#                                             doubled after each failure
#   EXTRA_FILES      --extra-files=A:B        setup.sh and run.sh: files or
#                                             folders to send besides the
#                                             tracked ones (colon-separated,
#                                             relative to the repository root)
# and every script takes --dry-run (print each gcloud command, one per line,
# quoted so that it can be pasted into bash, and run nothing) and --help.
#
# Exit statuses, the same as the Python commands' (agent_tunix/cli.py):
#   0 done; 1 failed (a gcloud step, a run that does not fit); 2 bad flags,
#   settings or config, or a credential the config needs is missing;
#   3 killed or interrupted (Ctrl-C; a preflight compile killed for host
#   memory); 4 refused on a worker (a run is going there: --restart).
#
# What reaches the workers: the files git tracks, as they are in the working
# tree (uncommitted edits included, deleted files left out), plus
# EXTRA_FILES; never untracked files (.venv, run folders, ...). Credentials
# for gated weights (run.sh) go as files of mode 0600, copied with scp from
# a 0600 file in a private temporary folder: never on a command line.
#
# Layout on every TPU worker (the same in all scripts):
#   ~/agent_tunix                     the repository, copied by copy_code
#   ~/agent_tunix_venv                the virtualenv made by setup.sh
#   ~/agent_tunix_logs/worker_N.log   output of worker N (appended per run)
#   ~/agent_tunix_logs/launch.sh      the worker script run.sh started
#   ~/agent_tunix_logs/pid            pid of the running trainer
#   ~/.kaggle/kaggle.json             Kaggle API key (run.sh, when needed)
#   ~/.cache/huggingface/token        Hugging Face token (run.sh, when needed)
# and the trainer runs in the detached tmux session "agent_tunix".

SCRIPT="launch/$(basename "$0")"
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY_RUN=0
RETRIES="${RETRIES:-3}"
RETRY_DELAY="${RETRY_DELAY:-10}"
EXTRA_FILES="${EXTRA_FILES:-}"
# Exit status of a remote guard that refused to go on (e.g. a run is already
# going); retry() does not repeat a step that failed with it.
readonly REFUSED_RC=4
# Exit status after Ctrl-C or SIGTERM.
readonly KILLED_RC=3
# A private temporary folder (made by make_work_dir, removed at exit): the
# code as sent, and credential files.
WORK_DIR=''
# What copy_code sends: the staged code (stage_code), and each credential
# file (add_credential) with its path on the workers.
CODE_DIR=''
CREDENTIAL_FILES=()
CREDENTIAL_TARGETS=()
EXTRA_PATHS=()
readonly SESSION=agent_tunix
# Remote paths, written unexpanded: the worker's shell expands the tilde.
# shellcheck disable=SC2088
readonly REMOTE_CODE='~/agent_tunix'
# shellcheck disable=SC2088
readonly REMOTE_VENV='~/agent_tunix_venv'
# shellcheck disable=SC2088
readonly REMOTE_LOGS='~/agent_tunix_logs'
# shellcheck disable=SC2088
readonly REMOTE_KAGGLE='~/.kaggle/kaggle.json'
# shellcheck disable=SC2088
readonly REMOTE_HF_TOKEN='~/.cache/huggingface/token'

remove_work_dir() {
  if [[ -n "$WORK_DIR" ]]; then
    rm -rf "$WORK_DIR"
  fi
}
trap remove_work_dir EXIT
trap 'exit $KILLED_RC' INT TERM

# Prints a message prefixed with the script name to stderr.
info() {
  echo "$SCRIPT: $*" >&2
}

warn() {
  echo "$SCRIPT: warning: $*" >&2
}

# Stops the script: runtime failure (exit 1).
die() {
  echo "$SCRIPT: $*" >&2
  exit 1
}

# Stops the script: bad or missing argument or setting (exit 2).
usage_error() {
  echo "$SCRIPT: $*" >&2
  echo "Run 'bash $SCRIPT --help' for usage." >&2
  exit 2
}

# Stops the script with one line: a bad config or a missing credential
# (exit 2).
config_error() {
  echo "$SCRIPT: $*" >&2
  exit 2
}

# Prints the comment block at the top of the running script.
print_usage() {
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p;}' "$0"
}

# Consumes one flag shared by all scripts. Returns 1 if it is not one.
parse_common_flag() {
  case "$1" in
    --tpu-name=*) TPU_NAME="${1#*=}" ;;
    --zone=*) ZONE="${1#*=}" ;;
    --project=*) PROJECT="${1#*=}" ;;
    --accelerator-type=*) ACCELERATOR_TYPE="${1#*=}" ;;
    --runtime-version=*) RUNTIME_VERSION="${1#*=}" ;;
    --retries=*) RETRIES="${1#*=}" ;;
    --dry-run) DRY_RUN=1 ;;
    -h | --help)
      print_usage
      exit 0
      ;;
    *) return 1 ;;
  esac
}

# Consumes one flag of the scripts that copy the code (setup.sh, run.sh).
# Returns 1 if it is not one.
parse_copy_flag() {
  case "$1" in
    --extra-files=*) EXTRA_FILES+="${EXTRA_FILES:+:}${1#*=}" ;;
    *) return 1 ;;
  esac
}

# Checks that each named setting is non-empty (and the retry settings are
# numbers); reports every missing one and exits 2 if any is.
require_settings() {
  local name flag missing=0
  for name in "$@"; do
    if [[ -z "${!name:-}" ]]; then
      flag="--$(echo "$name" | tr 'A-Z_' 'a-z-')"
      echo "$SCRIPT: $name is not set (export $name=... or pass $flag=...)" >&2
      missing=1
    fi
  done
  if ((missing)); then
    exit 2
  fi
  if [[ ! "$RETRIES" =~ ^[1-9][0-9]*$ ]]; then
    usage_error "RETRIES must be a positive integer, got '$RETRIES'"
  fi
  if [[ ! "$RETRY_DELAY" =~ ^[0-9]+$ ]]; then
    usage_error "RETRY_DELAY must be a whole number of seconds," \
      "got '$RETRY_DELAY'"
  fi
}

# Prints one word quoted for any POSIX shell: as is when it has only safe
# characters, else in single quotes (an inner ' becomes '\''); for a
# --flag=value word only the value is quoted, which reads better.
quote() {
  if [[ -n "$1" && "$1" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$1"
  elif [[ "$1" =~ ^(--?[A-Za-z0-9_.-]+=)(.*)$ ]]; then
    printf '%s' "${BASH_REMATCH[1]}"
    quote "${BASH_REMATCH[2]}"
  else
    local escaped="'\\''"
    printf "'%s'" "${1//\'/$escaped}"
  fi
}

# Prints all arguments quoted and separated by spaces (no newline).
quote_all() {
  local word sep=''
  for word in "$@"; do
    printf '%s' "$sep"
    quote "$word"
    sep=' '
  done
}

# Joins the lines of a shell snippet read from stdin into one line, so that a
# dry run prints one command per line. Blank lines and comment lines are
# dropped; a line ending in 'then', 'do', 'else', '&&', '||' or '|' is joined
# to the next with a space, any other with '; '. (In an unquoted here-document
# a backslash at the end of a line joins it to the next before this runs.)
one_line() {
  local line out='' sep=''
  while IFS= read -r line; do
    line="${line#"${line%%[![:space:]]*}"}"
    if [[ -z "$line" || "$line" == '#'* ]]; then
      continue
    fi
    out+="$sep$line"
    case "$line" in
      *'; then' | *'; do' | else | *' &&' | *' ||' | *' |') sep=' ' ;;
      *) sep='; ' ;;
    esac
  done
  printf '%s' "$out"
}

# Runs gcloud with the given arguments, or prints the command in a dry run.
gcloud_cmd() {
  if ((DRY_RUN)); then
    quote_all gcloud "$@"
    echo
    return 0
  fi
  gcloud "$@"
}

# Runs a command (or shell function) up to RETRIES times, waiting RETRY_DELAY
# seconds after the first failure and twice as long after each next one. A
# dry run tries once and never sleeps. Returns the last exit status.
retry() {
  local attempt=1 delay="$RETRY_DELAY" rc
  while true; do
    "$@" && return 0
    rc=$?
    if ((DRY_RUN)); then
      return "$rc"
    fi
    if ((rc == REFUSED_RC)); then
      info "refused on a worker (see above); not retrying"
      return "$rc"
    fi
    if ((attempt >= RETRIES)); then
      info "giving up after $attempt attempt(s): ${*:1:6} ..."
      return "$rc"
    fi
    info "attempt $attempt/$RETRIES failed (exit $rc): ${*:1:6} ...;" \
      "retrying in ${delay}s"
    sleep "$delay"
    attempt=$((attempt + 1))
    delay=$((delay * 2))
  done
}

# Runs COMMAND on WORKER ('all' or a number) of the TPU VM over ssh. Extra
# arguments go to ssh itself (after '--').
tpu_ssh() {
  local worker="$1" command="$2"
  shift 2
  local args=(compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE"
    --project="$PROJECT" --worker="$worker" --command="$command")
  if (($#)); then
    args+=(-- "$@")
  fi
  gcloud_cmd "${args[@]}"
}

# Remote snippet: exits with REFUSED_RC if a run is going on this worker.
remote_guard() {
  one_line <<EOF
if tmux has-session -t $SESSION 2>/dev/null; then
  echo "agent_tunix is running on \$(hostname): stop it with" \
    "launch/stop.sh, or pass --restart to launch/run.sh" >&2
  exit $REFUSED_RC
fi
EOF
}

# Remote snippet: stops the run on this worker. Sends SIGTERM to the trainer
# (it checkpoints on SIGTERM), waits up to GRACE seconds for it to exit, then
# kills what is left and closes the tmux session. Does nothing when no run is
# going.
remote_stop() {
  local grace="$1"
  one_line <<EOF
if tmux has-session -t $SESSION 2>/dev/null; then
  pid=\$(cat $REMOTE_LOGS/pid 2>/dev/null || true)
  if [ -n "\$pid" ] && kill -0 "\$pid" 2>/dev/null; then
    echo "stopping agent_tunix (pid \$pid) on \$(hostname)"
    kill -TERM "\$pid"
    i=0
    while kill -0 "\$pid" 2>/dev/null && [ "\$i" -lt $((grace * 5)) ]; do
      sleep 0.2
      i=\$((i + 1))
    done
    if kill -0 "\$pid" 2>/dev/null; then
      echo "pid \$pid still there after ${grace}s; killing it" >&2
      kill -KILL "\$pid" 2>/dev/null || true
    fi
  fi
  tmux kill-session -t $SESSION 2>/dev/null || true
  rm -f $REMOTE_LOGS/pid
  echo "stopped agent_tunix on \$(hostname)"
else
  echo "agent_tunix is not running on \$(hostname)"
fi
EOF
}

# Makes WORK_DIR, a private (0700) temporary folder removed at exit.
make_work_dir() {
  if [[ -z "$WORK_DIR" ]]; then
    WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/agent_tunix_launch.XXXXXX")"
    chmod 700 "$WORK_DIR"
  fi
}

# Sets EXTRA_PATHS to the paths of EXTRA_FILES relative to REPO_DIR; stops
# with exit 2 on a path that is missing or outside REPO_DIR.
collect_extra_paths() {
  local list=() path
  EXTRA_PATHS=()
  IFS=: read -r -a list <<<"$EXTRA_FILES"
  if ((!${#list[@]})); then
    return 0
  fi
  for path in "${list[@]}"; do
    if [[ -z "$path" ]]; then
      continue
    fi
    if [[ "$path" == /* ]]; then
      if [[ "$path" != "$REPO_DIR"/* ]]; then
        usage_error "--extra-files: '$path' is outside $REPO_DIR; the" \
          "workers get the repository only"
      fi
      path="${path#"$REPO_DIR"/}"
    fi
    if [[ "/$path/" == */../* ]]; then
      usage_error "--extra-files: '$path' leaves the repository (..)"
    fi
    if [[ ! -e "$REPO_DIR/$path" ]]; then
      usage_error "--extra-files: '$path' not found under $REPO_DIR" \
        "(paths are relative to the repository root)"
    fi
    EXTRA_PATHS+=("$path")
  done
}

# Puts what the workers get into CODE_DIR ($WORK_DIR/agent_tunix): the files
# git tracks, as they are in the working tree (uncommitted edits included,
# files deleted there left out), and EXTRA_FILES (folders whole). Nothing
# else: no .venv, run folders or other untracked files. Says how much that
# is. Runs in a dry run too (it only reads and writes local files).
stage_code() {
  local path tracked=() kib files extras=''
  if ! git -C "$REPO_DIR" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    die "$REPO_DIR is not a git checkout: the workers get the files git" \
      "tracks (plus --extra-files); clone the repository with git"
  fi
  while IFS= read -r -d '' path; do
    if [[ -e "$REPO_DIR/$path" || -L "$REPO_DIR/$path" ]]; then
      tracked+=("$path")
    fi
  done < <(git -C "$REPO_DIR" ls-files -z)
  collect_extra_paths
  make_work_dir
  CODE_DIR="$WORK_DIR/agent_tunix"
  rm -rf "$CODE_DIR"
  mkdir "$CODE_DIR"
  if ((${#tracked[@]})); then
    printf '%s\0' "${tracked[@]}" |
      (cd "$REPO_DIR" && tar --null --no-recursion -T - -cf -) |
      tar -xf - -C "$CODE_DIR"
  fi
  if ((${#EXTRA_PATHS[@]})); then
    (cd "$REPO_DIR" && tar -cf - -- "${EXTRA_PATHS[@]}") |
      tar -xf - -C "$CODE_DIR"
    extras=", and ${EXTRA_PATHS[*]}"
  fi
  kib="$(du -sk "$CODE_DIR" | cut -f1)"
  files="$(find "$CODE_DIR" -type f | wc -l | tr -d ' ')"
  info "code to send to every worker: $files files ($(awk -v k="$kib" \
    'BEGIN { printf "%.1f", k / 1024 }') MiB), the files git tracks$extras;" \
    "untracked files (.venv, run folders) stay here (--extra-files= adds" \
    "some)"
}

# Prints a string with JSON's escapes for backslash and double quote.
json_escape() {
  local s="$1"
  s="${s//\\/\\\\}"
  s="${s//\"/\\\"}"
  printf '%s' "$s"
}

# Queues the credential NAME (kaggle or huggingface) for copy_code: writes
# it from the user's environment or files to a 0600 file in WORK_DIR (with
# builtins only, so the secret is in no process's arguments). Kaggle:
# KAGGLE_USERNAME and KAGGLE_KEY, else ~/.kaggle/kaggle.json (or
# $KAGGLE_CONFIG_DIR/kaggle.json). Hugging Face: HF_TOKEN, else
# ${HF_HOME:-~/.cache/huggingface}/token. Returns 1 when the user has none.
add_credential() {
  local name="$1" file target from
  make_work_dir
  case "$name" in
    kaggle)
      file="$WORK_DIR/kaggle.json"
      target="$REMOTE_KAGGLE"
      from="${KAGGLE_CONFIG_DIR:-$HOME/.kaggle}/kaggle.json"
      if [[ -n "${KAGGLE_USERNAME:-}" && -n "${KAGGLE_KEY:-}" ]]; then
        (umask 077 && printf '{"username": "%s", "key": "%s"}\n' \
          "$(json_escape "$KAGGLE_USERNAME")" "$(json_escape "$KAGGLE_KEY")" \
          >"$file")
        from='KAGGLE_USERNAME and KAGGLE_KEY'
      elif [[ -f "$from" ]]; then
        (umask 077 && cat "$from" >"$file")
      else
        return 1
      fi
      ;;
    huggingface)
      file="$WORK_DIR/hf_token"
      target="$REMOTE_HF_TOKEN"
      from="${HF_HOME:-$HOME/.cache/huggingface}/token"
      if [[ -n "${HF_TOKEN:-}" ]]; then
        (umask 077 && printf '%s\n' "$HF_TOKEN" >"$file")
        from='HF_TOKEN'
      elif [[ -f "$from" ]]; then
        (umask 077 && cat "$from" >"$file")
      else
        return 1
      fi
      ;;
    *) die "unknown credential '$name'" ;;
  esac
  chmod 600 "$file"
  CREDENTIAL_FILES+=("$file")
  CREDENTIAL_TARGETS+=("$target")
  info "credential to send: your $name key (from $from), as $target" \
    "(mode 0600) on every worker"
}

# Remote snippet: gives the credential files copy_code sent mode 0600 (scp
# makes a new file with its source's mode already; this makes sure).
remote_credential_modes() {
  if ((${#CREDENTIAL_TARGETS[@]})); then
    printf 'chmod 600 %s' "${CREDENTIAL_TARGETS[*]}"
  else
    printf 'true'
  fi
}

# One attempt at copying the code (and credentials) to every worker: checks
# that no run is going (or stops it when RESTART_GRACE is set), removes the
# old copy (scp into an existing directory would nest the new one inside
# it) and old credential files, makes their folders (0700), and copies
# CODE_DIR (stage_code) to ~/agent_tunix and each credential file to its
# place. Retry it as a whole, so that a retry after a partial copy starts
# clean. Explicit returns: callers run it under retry, where `set -e` does
# not apply.
copy_code() {
  local prepare target i
  if [[ -n "${RESTART_GRACE:-}" ]]; then
    prepare="$(remote_stop "$RESTART_GRACE")"
  else
    prepare="$(remote_guard)"
  fi
  prepare+="; rm -rf $REMOTE_CODE"
  for ((i = 0; i < ${#CREDENTIAL_TARGETS[@]}; i++)); do
    target="${CREDENTIAL_TARGETS[i]}"
    prepare+="; mkdir -p ${target%/*} && chmod 700 ${target%/*} &&"
    prepare+=" rm -f $target"
  done
  tpu_ssh all "$prepare" || return
  gcloud_cmd compute tpus tpu-vm scp --recurse "$CODE_DIR" \
    "$TPU_NAME:$REMOTE_CODE" --worker=all --zone="$ZONE" \
    --project="$PROJECT" || return
  for ((i = 0; i < ${#CREDENTIAL_FILES[@]}; i++)); do
    gcloud_cmd compute tpus tpu-vm scp "${CREDENTIAL_FILES[i]}" \
      "$TPU_NAME:${CREDENTIAL_TARGETS[i]}" --worker=all --zone="$ZONE" \
      --project="$PROJECT" || return
  done
}
