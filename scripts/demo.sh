#!/usr/bin/env bash
# One command to see conduit work: prepares the venv (no Docker or PostgreSQL
# needed) and runs the demo. Extra arguments go to the demo module.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { echo "[setup] $*"; }

# A user's venv: no test-only plugins (removed if an earlier set-up put them there).
CONDUIT_TEST_PLUGINS=0 CONDUIT_SKIP_SERVICES=1 bash "$ROOT/scripts/setup.sh"

BIN="${CONDUIT_VENV:-$ROOT/.venv}/bin"

has_demo_module() {
  "$BIN/python" - <<'PY' 2>/dev/null
import importlib.util, sys
try:
    found = importlib.util.find_spec("conduit_core.demo") is not None
except ImportError:
    found = False
sys.exit(0 if found else 1)
PY
}

if has_demo_module; then
  log "running: python -m conduit_core.demo $*"
  exec "$BIN/python" -m conduit_core.demo "$@"
fi

log "conduit_core.demo not there yet; showing the CLI instead"
log "running: conduit plugins list"
"$BIN/conduit" plugins list
log "running: conduit config check examples/conduit.toml"
"$BIN/conduit" config check examples/conduit.toml
