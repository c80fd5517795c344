# Timed, stamped, idempotent setup steps, sourced by the venv setup scripts.
#
#   VENV=...; STAMPS="$VENV/.stamps"; TAG=my-setup.sh; . scripts/lib/steps.sh
#   step NAME COMMAND...    run once (a stamp marks success), print its time either way
#
# A failed step prints its log's tail and fails loudly, saying so when the package
# registry could not be reached.

fail() {
  echo "$TAG: FAILED: $*" >&2
  exit 1
}

T0=$EPOCHREALTIME
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

step() {
  local name="$1"
  shift
  local t0
  t0=$EPOCHREALTIME
  if [[ -f "$STAMPS/$name" ]]; then
    printf '%s: %-22s reused\n' "$TAG" "$name"
    return 0
  fi
  local log="$VENV/.setup-$name.log"
  if ! "$@" >"$log" 2>&1; then
    tail -n 15 "$log" >&2 || true
    if grep -qiE "Could not find a version|No matching distribution|Connection|Max retries|Name or service|Temporary failure|timed out|NewConnectionError" "$log"; then
      fail "step $name: the package registry could not be reached or lacks a package (log: $log)"
    fi
    fail "step $name failed (log: $log)"
  fi
  touch "$STAMPS/$name"
  printf '%s: %-22s done in %s s\n' "$TAG" "$name" "$(elapsed "$t0")"
}

# new_venv: (re)create $VENV with $PYTHON_BIN unless a finished one is there.
new_venv() {
  if [[ ! -x "$VENV/bin/python" || ! -f "$STAMPS/venv" ]]; then
    rm -rf "$VENV"
    mkdir -p "$VENV"
    "${PYTHON_BIN:-python3}" -m venv "$VENV" || fail "python3 -m venv $VENV failed"
    mkdir -p "$STAMPS"
  fi
}
