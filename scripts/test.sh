#!/usr/bin/env bash
# Full check, as CI runs it (.ci/run): setup (services + venv), then
#   ruff check, ruff format --check (only when pyproject.toml configures [tool.ruff.format]),
#   mypy (files from [tool.mypy] in pyproject.toml), pytest -n auto [extra args].
# Every step runs even if an earlier one failed; the exit code is non-zero if any
# failed. pytest's exit code 5 (no tests collected) counts as a failure.
# Usage: scripts/test.sh [pytest args...]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { echo "[setup] $*"; }

# The tests get their own venv with the test-only plugins; a user's .venv never has them.
export CONDUIT_VENV="${CONDUIT_VENV:-$ROOT/.venv-test}"
export CONDUIT_TEST_PLUGINS=1
bash "$ROOT/scripts/setup.sh"

VENV="$CONDUIT_VENV"
BIN="$VENV/bin"
FAILED=()

# step NAME CMD...: run CMD, record a failure instead of stopping.
step() {
  local name=$1 rc=0 t0=$SECONDS
  shift
  log "==> ${name}: $*"
  "$@" || rc=$?
  if ((rc == 0)); then
    log "<== ${name}: ok ($((SECONDS - t0)) s)"
  else
    log "<== ${name}: FAILED (exit ${rc}, $((SECONDS - t0)) s)"
    FAILED+=("${name} (exit ${rc})")
  fi
  return 0
}

# ruff format runs only when the root configuration asks for it.
ruff_format_configured() {
  "$BIN/python" - <<'PY'
import pathlib, sys, tomllib
root = pathlib.Path(".")
pp = root / "pyproject.toml"
if pp.is_file() and "format" in tomllib.loads(pp.read_text()).get("tool", {}).get("ruff", {}):
    sys.exit(0)
for name in ("ruff.toml", ".ruff.toml"):
    p = root / name
    if p.is_file() and "format" in tomllib.loads(p.read_text()):
        sys.exit(0)
sys.exit(1)
PY
}

step "ruff check" "$BIN/ruff" check .

if ruff_format_configured; then
  step "ruff format" "$BIN/ruff" format --check .
else
  log "ruff format: skipped ([tool.ruff.format] not configured in pyproject.toml)"
fi

step "mypy" "$BIN/mypy"

log "==> pytest: pytest -n auto $*"
t0=$SECONDS
rc=0
"$BIN/pytest" -n auto "$@" || rc=$?
if ((rc == 0)); then
  log "<== pytest: ok ($((SECONDS - t0)) s)"
elif ((rc == 5)); then
  log "<== pytest: FAILED: no tests were collected (exit 5)"
  FAILED+=("pytest (no tests collected)")
else
  log "<== pytest: FAILED (exit ${rc}, $((SECONDS - t0)) s)"
  FAILED+=("pytest (exit ${rc})")
fi

if ((${#FAILED[@]} > 0)); then
  log "FAILED steps: ${FAILED[*]}"
  exit 1
fi
log "all checks passed"
