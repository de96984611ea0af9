#!/usr/bin/env bash
# Prepare this machine for conduit development:
#   1. scripts/services.sh (Docker, PostgreSQL, test image) unless CONDUIT_SKIP_SERVICES=1
#   2. a virtualenv at .venv (Python >= 3.11), created if absent
#   3. one `pip install` of every distribution folder that has a pyproject.toml
#      (editable, with all its optional extras) plus requirements-dev.txt
#
# CONDUIT_SETUP_DRY_RUN=1 only says what step 3 would install and remove (an existing venv).
# CONDUIT_TEST_PLUGINS=1 also installs the test-only plugins under tests/plugins/ (scripts/test.sh
# does, into its own venv .venv-test); CONDUIT_TEST_PLUGINS=0 (scripts/demo.sh) also removes them
# from a venv an earlier set-up put them in.
#
# Step 3 is skipped when nothing it depends on changed since the last install
# (a stamp in the venv hashes the pyproject.toml files, requirements-dev.txt and
# the Python version). CONDUIT_FORCE_INSTALL=1 reinstalls anyway.
# CONDUIT_VENV overrides the venv location; CONDUIT_PYTHON the interpreter.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${CONDUIT_VENV:-$ROOT/.venv}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { echo "[setup] $*"; }
die() {
  echo "[setup] ERROR: $*" >&2
  exit 1
}

START_S=$SECONDS

# ---------------------------------------------------------------- services --
if [[ ${CONDUIT_SKIP_SERVICES:-0} == 1 ]]; then
  log "CONDUIT_SKIP_SERVICES=1: not starting Docker/PostgreSQL"
else
  bash "$ROOT/scripts/services.sh"
fi

# ------------------------------------------------------------------ python --
py_ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' >/dev/null 2>&1; }

if [[ -x $VENV/bin/python ]] && py_ok "$VENV/bin/python"; then
  log "venv: ${VENV} ($("$VENV/bin/python" -V 2>&1))"
else
  if [[ -e $VENV ]]; then
    [[ -f $VENV/pyvenv.cfg ]] || die "${VENV} exists but is not a virtualenv; move it away"
    log "venv: ${VENV} is broken or older than Python 3.11; recreating it"
    rm -rf "$VENV"
  fi
  PYTHON=""
  for candidate in ${CONDUIT_PYTHON:-} python3 python3.13 python3.12 python3.11; do
    if command -v "$candidate" >/dev/null 2>&1 && py_ok "$candidate"; then
      PYTHON=$(command -v "$candidate")
      break
    fi
  done
  [[ -n $PYTHON ]] || die "Python >= 3.11 is required; found: $(python3 -V 2>&1 || echo 'no python3'). Set CONDUIT_PYTHON=/path/to/python3.11+"
  log "venv: creating ${VENV} with ${PYTHON} ($("$PYTHON" -V 2>&1))"
  if ! "$PYTHON" -m venv "$VENV"; then
    # Debian's system Python ships venv without ensurepip: install it once, as root, and retry.
    rm -rf "$VENV"
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
      ver=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
      log "venv failed: installing python${ver}-venv (Debian)"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python${ver}-venv" python3-venv \
        || die "could not install python${ver}-venv"
      "$PYTHON" -m venv "$VENV" || die "'${PYTHON} -m venv ${VENV}' failed"
    else
      die "'${PYTHON} -m venv ${VENV}' failed (Debian's system Python needs: apt-get install python3-venv)"
    fi
  fi
fi
VPY="$VENV/bin/python"

# ------------------------------------------------------------ distributions --
# Every distribution folder that exists and has a pyproject.toml, core first,
# then the test-only plugin distributions under tests/plugins/ and the example packages under
# examples/ (whose own tests run the executor conformance suite).
DIST_DIRS=()
for d in conduit_core conduit_executors_shell conduit_executors_python conduit_executors_container conduit_gate_human; do
  if [[ -f $ROOT/$d/pyproject.toml ]]; then
    DIST_DIRS+=("$ROOT/$d")
  else
    log "distribution ${d}/ has no pyproject.toml yet; skipped"
  fi
done
# The test-only plugins (a test executor, a test gate) go into the test environment only
# (scripts/test.sh sets CONDUIT_TEST_PLUGINS=1 and its own venv), never into a user's venv.
if [[ ${CONDUIT_TEST_PLUGINS:-0} == 1 ]]; then
  for f in "$ROOT"/tests/plugins/*/pyproject.toml "$ROOT"/examples/*/pyproject.toml; do
    if [[ -f $f ]]; then DIST_DIRS+=("$(dirname "$f")"); fi
  done
fi

# One `-e DIR[extra,...]` per distribution (all optional extras, e.g. conduit_core[postgres]),
# and the names to check for the fast path. Printed as: name<TAB>requirement.
DIST_LINES=$("$VPY" - "${DIST_DIRS[@]}" <<'PY'
import sys, tomllib
for d in sys.argv[1:]:
    with open(f"{d}/pyproject.toml", "rb") as f:
        project = tomllib.load(f).get("project", {})
    extras = sorted(project.get("optional-dependencies", {}))
    req = d + (f"[{','.join(extras)}]" if extras else "")
    print(f"{project.get('name', d)}\t{req}")
PY
) || die "could not read the pyproject.toml files"

PIP_ARGS=()
DIST_NAMES=()
while IFS=$'\t' read -r name req; do
  [[ -n $name ]] || continue
  DIST_NAMES+=("$name")
  PIP_ARGS+=(-e "$req")
done <<<"$DIST_LINES"
[[ -f $ROOT/requirements-dev.txt ]] || die "requirements-dev.txt missing at ${ROOT}"
PIP_ARGS+=(-r "$ROOT/requirements-dev.txt")

# Names from requirements-dev.txt ("pytest-xdist>=3.6" -> "pytest-xdist").
DEV_NAMES=()
while read -r line; do
  line=${line%%#*}
  name=$(sed -E 's/^[[:space:]]*([A-Za-z0-9._-]+).*/\1/' <<<"$line")
  if [[ -n $name && $name != -* ]]; then DEV_NAMES+=("$name"); fi
done <"$ROOT/requirements-dev.txt"

STAMP="$VENV/.conduit-setup.sha256"
stamp_value() {
  {
    "$VPY" -V 2>&1
    printf '%s\n' "${PIP_ARGS[@]}"
    cat "$ROOT/requirements-dev.txt"
    for d in "${DIST_DIRS[@]}"; do
      echo "== $d"
      cat "$d/pyproject.toml"
    done
  } | sha256sum | cut -d' ' -f1
}

all_installed() {
  "$VPY" - "${DIST_NAMES[@]}" "${DEV_NAMES[@]}" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import PackageNotFoundError, distribution
try:
    for name in sys.argv[1:]:
        distribution(name)
except PackageNotFoundError:
    sys.exit(1)
PY
}

WANT=$(stamp_value)
if [[ ${CONDUIT_TEST_PLUGINS:-} == 0 ]]; then
  # A user's venv (scripts/demo.sh says 0) never keeps a test plugin an earlier set-up installed.
  stale=$("$VPY" - "$ROOT"/tests/plugins/*/pyproject.toml <<'PY'
import sys, tomllib
from importlib.metadata import PackageNotFoundError, distribution
for f in sys.argv[1:]:
    try:
        with open(f, "rb") as fh:
            name = tomllib.load(fh)["project"]["name"]
        distribution(name)
        print(name)
    except (OSError, KeyError, PackageNotFoundError):
        pass
PY
  )
  if [[ -n $stale && ${CONDUIT_SETUP_DRY_RUN:-0} == 1 ]]; then
    log "would remove test-only plugins from ${VENV}: ${stale//$'\n'/ }"
  elif [[ -n $stale ]]; then
    log "removing test-only plugins from ${VENV}: ${stale//$'\n'/ }"
    # shellcheck disable=SC2086
    "$VPY" -m pip uninstall --quiet -y $stale || die "could not remove ${stale}"
  fi
fi
if [[ ${CONDUIT_SETUP_DRY_RUN:-0} == 1 ]]; then
  log "dry run: would install ${DIST_NAMES[*]}"
  exit 0
elif [[ ${CONDUIT_FORCE_INSTALL:-0} != 1 && -f $STAMP && $(<"$STAMP") == "$WANT" ]] && all_installed; then
  log "python packages up to date (${#DIST_NAMES[@]} distributions + requirements-dev.txt); CONDUIT_FORCE_INSTALL=1 reinstalls"
else
  rm -f "$STAMP"
  log "upgrading pip"
  "$VPY" -m pip install --quiet --upgrade pip || die "pip upgrade failed"
  log "pip install ${PIP_ARGS[*]}"
  "$VPY" -m pip install --progress-bar off "${PIP_ARGS[@]}" || die "pip install failed"
  echo "$WANT" >"$STAMP"
  log "installed ${#DIST_NAMES[@]} distributions: ${DIST_NAMES[*]:-none}"
fi

log "setup done in $((SECONDS - START_S)) s (venv: ${VENV})"
