#!/usr/bin/env bash
# Install (only if missing) and start the services the conduit test suite uses:
#   - a Docker daemon on the default socket (unix:///var/run/docker.sock)
#   - the PostgreSQL "main" cluster on /var/run/postgresql, with a superuser
#     role for the current user (tests use postgresql://root@/postgres?host=/var/run/postgresql)
#   - the local image conduit-test-busybox:latest (busybox-static, no network needed)
#   - Debian's chromium and chromium-driver, for the web console's browser tests (tests/console)
#
# Idempotent: on a machine where everything is already up it only checks and
# returns in about a second. Under CI (scripts/ci.sh) any service that fails to come up is
# a hard failure; otherwise a warning is printed and the tests skip it.
# Must run as root (it installs Debian packages and starts daemons).
set -euo pipefail

IMAGE="conduit-test-busybox:latest"
# Bump when the image recipe below changes: an image with another value is rebuilt.
IMAGE_RECIPE="1"
DOCKER_SOCK="/var/run/docker.sock"
DOCKER_HOST_URI="unix://${DOCKER_SOCK}"
DOCKER_LOG="/var/log/conduit-dockerd.log"
PG_SOCKET_DIR="/var/run/postgresql"
DEADLINE_S=60
LOCK_FILE="/var/lock/conduit-services.lock"

START_TS=$(date +%s.%N)

log() { echo "[setup] $*"; }
warn() { echo "[setup] WARNING: $*" >&2; }

# shellcheck source=scripts/ci.sh
source "$(dirname "${BASH_SOURCE[0]}")/ci.sh"

FAILED_SERVICES=()
# service_failed NAME MESSAGE: hard failure under CI, warning otherwise.
service_failed() {
  local name=$1 msg=$2
  if is_ci; then
    echo "[setup] ERROR: ${name}: ${msg}" >&2
    echo "[setup] ERROR: this is a CI run (scripts/ci.sh), so a service that does not come up is fatal." >&2
    exit 1
  fi
  warn "${name}: ${msg} -- continuing; tests that need ${name} will be skipped."
  FAILED_SERVICES+=("$name")
}

elapsed() { awk -v s="$START_TS" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }'; }

if [[ $(id -u) -ne 0 ]]; then
  service_failed "services" "scripts/services.sh must run as root (apt-get, dockerd, pg_ctlcluster)"
  exit 0
fi

# Serialise concurrent runs (e.g. test.sh and demo.sh started together).
mkdir -p "$(dirname "$LOCK_FILE")"
# Daemons started below get `9>&-` so that they do not inherit (and hold) the lock.
exec 9>"$LOCK_FILE"
if ! flock -n 9; then
  log "waiting for another scripts/services.sh run (${LOCK_FILE})..."
  if ! flock -w 300 9; then
    service_failed "services" "could not take ${LOCK_FILE} within 300 s"
    exit 0
  fi
fi

# ---------------------------------------------------------------- packages --

pg_server_versions() {
  # Installed PostgreSQL server versions, highest last.
  local d
  for d in /usr/lib/postgresql/*/bin/postgres; do
    if [[ -x $d ]]; then basename "$(dirname "$(dirname "$d")")"; fi
  done | sort -V
  return 0
}

pg_have_cluster() {
  command -v pg_lsclusters >/dev/null 2>&1 && [[ -n $(pg_lsclusters -h 2>/dev/null) ]]
}

wait_for_apt() {
  # Another apt/dpkg (e.g. a background install) may hold the lock: wait for it.
  local waited=0
  while pgrep -x apt-get >/dev/null 2>&1 || pgrep -x apt >/dev/null 2>&1 || pgrep -x dpkg >/dev/null 2>&1; do
    if ((waited == 0)); then log "waiting for another apt-get/dpkg to finish..."; fi
    if ((waited >= 900)); then
      warn "apt-get/dpkg still running after ${waited} s; trying anyway"
      break
    fi
    sleep 2
    waited=$((waited + 2))
  done
}

packages_missing() {
  MISSING_PKGS=()
  command -v dockerd >/dev/null 2>&1 || MISSING_PKGS+=(docker.io)
  if ! dpkg -s busybox-static >/dev/null 2>&1 || [[ ! -x /bin/busybox ]]; then
    MISSING_PKGS+=(busybox-static)
  fi
  if ! command -v pg_ctlcluster >/dev/null 2>&1 || { [[ -z $(pg_server_versions) ]] && ! pg_have_cluster; }; then
    MISSING_PKGS+=(postgresql)
  fi
  # The console's browser tests drive Debian's Chromium through its chromedriver (no browser is
  # ever downloaded).
  command -v chromium >/dev/null 2>&1 || MISSING_PKGS+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || MISSING_PKGS+=(chromium-driver)
}

packages_missing
if ((${#MISSING_PKGS[@]} > 0)); then
  wait_for_apt
  packages_missing # the other apt run may have installed them meanwhile
fi
if ((${#MISSING_PKGS[@]} > 0)); then
  log "installing Debian packages: ${MISSING_PKGS[*]} (apt-get update first)"
  export DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=l
  t0=$(date +%s)
  if apt-get -o DPkg::Lock::Timeout=600 update -q \
    && apt-get -o DPkg::Lock::Timeout=600 install -y -q "${MISSING_PKGS[@]}"; then
    log "packages installed in $(($(date +%s) - t0)) s"
  else
    # Keep going: whatever did get installed is still started below.
    service_failed "apt" "apt-get install ${MISSING_PKGS[*]} failed"
  fi
else
  log "Debian packages present (docker.io, busybox-static, postgresql, chromium, chromium-driver)"
fi

# ------------------------------------------------------------------ docker --

docker_ok() { timeout 15 docker --host "$DOCKER_HOST_URI" info >/dev/null 2>&1; }

DOCKERD_PID=""
start_dockerd() {
  log "starting dockerd $* (log: ${DOCKER_LOG})"
  echo "==== $(date -u +%FT%TZ) conduit services.sh: dockerd --host ${DOCKER_HOST_URI} $*" >>"$DOCKER_LOG"
  # setsid + nohup + all fds redirected: the daemon outlives this script and
  # holds no pipe of the caller (CI would otherwise wait on it).
  setsid nohup dockerd --host "$DOCKER_HOST_URI" "$@" </dev/null >>"$DOCKER_LOG" 2>&1 9>&- &
  DOCKERD_PID=$!
}

# wait_dockerd DEADLINE_EPOCH: 0 when docker answers, 1 when dockerd died, 2 on timeout.
wait_dockerd() {
  local deadline=$1
  while (($(date +%s) < deadline)); do
    if docker_ok; then return 0; fi
    if [[ -n $DOCKERD_PID ]] && ! kill -0 "$DOCKERD_PID" 2>/dev/null; then return 1; fi
    sleep 0.5
  done
  docker_ok && return 0
  return 2
}

stop_our_dockerd() {
  [[ -n $DOCKERD_PID ]] || return 0
  if kill -0 "$DOCKERD_PID" 2>/dev/null; then
    kill "$DOCKERD_PID" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$DOCKERD_PID" 2>/dev/null || true
  fi
  DOCKERD_PID=""
}

DOCKER_UP=0
if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
  service_failed "docker" "dockerd/docker not installed"
elif docker_ok; then
  log "docker: daemon already answering on ${DOCKER_SOCK}"
  DOCKER_UP=1
else
  deadline=$(($(date +%s) + DEADLINE_S))
  if pgrep -x dockerd >/dev/null 2>&1; then
    # Someone else's dockerd (still starting?): wait for it, do not start a second one.
    log "docker: a dockerd is already running but not answering yet; waiting up to ${DEADLINE_S} s"
    if wait_dockerd "$deadline"; then
      DOCKER_UP=1
    else
      DOCKER_WHY="the running dockerd did not answer within ${DEADLINE_S} s"
    fi
  else
    # A dockerd killed without cleanup leaves its pid file, which blocks a new start.
    rm -f /var/run/docker.pid
    mkdir -p "$(dirname "$DOCKER_LOG")"
    start_dockerd
    rc=0
    wait_dockerd "$deadline" || rc=$?
    if ((rc == 0)); then
      DOCKER_UP=1
    else
      if ((rc == 1)); then
        warn "dockerd exited during start-up; last log lines:"
      else
        warn "dockerd did not answer in time; last log lines:"
      fi
      tail -n 5 "$DOCKER_LOG" >&2 || true
      stop_our_dockerd
      rm -f /var/run/docker.pid
      # Typical cause in containers/VMs: no iptables/nat or bridge support.
      fb_deadline=$(($(date +%s) + DEADLINE_S / 2))
      if ((fb_deadline > deadline)); then deadline=$fb_deadline; fi
      start_dockerd --iptables=false --bridge=none
      if wait_dockerd "$deadline"; then
        DOCKER_UP=1
        warn "docker runs without iptables and bridge: containers only get --network none/host"
      else
        tail -n 5 "$DOCKER_LOG" >&2 || true
        stop_our_dockerd
        DOCKER_WHY="dockerd did not come up, with default flags nor with --iptables=false --bridge=none"
      fi
    fi
  fi
  if ((DOCKER_UP)); then
    log "docker: daemon answering on ${DOCKER_SOCK} ($(elapsed) s)"
  else
    service_failed "docker" "${DOCKER_WHY:-docker info does not answer} (see ${DOCKER_LOG})"
  fi
fi

# -------------------------------------------------------------- postgresql --

pg_role_exists() {
  local role=$1
  [[ $(cd / && su postgres -s /bin/sh -c "psql -h '$PG_SOCKET_DIR' -p '$2' -d postgres -tAc \"select 1 from pg_roles where rolname = '$role'\"" 2>/dev/null) == 1 ]]
}

setup_postgres() {
  if ! command -v pg_lsclusters >/dev/null 2>&1 || ! command -v pg_ctlcluster >/dev/null 2>&1; then
    service_failed "postgresql" "postgresql-common (pg_lsclusters/pg_ctlcluster) not installed"
    return
  fi
  local ver port status line
  line=$(pg_lsclusters -h 2>/dev/null | awk '$2 == "main"' | sort -V -k1,1 | tail -n 1 || true)
  if [[ -z $line ]]; then
    ver=$(pg_server_versions | tail -n 1)
    if [[ -z $ver ]]; then
      service_failed "postgresql" "no PostgreSQL server version installed"
      return
    fi
    log "postgresql: creating cluster ${ver}/main"
    if ! pg_createcluster "$ver" main >/dev/null; then
      service_failed "postgresql" "pg_createcluster ${ver} main failed"
      return
    fi
    line=$(pg_lsclusters -h | awk -v v="$ver" '$1 == v && $2 == "main"' || true)
  fi
  read -r ver _ port status _ <<<"$line"
  if [[ $port != 5432 ]]; then
    warn "postgresql: cluster ${ver}/main listens on port ${port}, tests expect 5432"
  fi
  # /var/run is a tmpfs on many machines: the socket dir may be gone after a reboot.
  install -d -o postgres -g postgres -m 2775 "$PG_SOCKET_DIR"
  if [[ $status == online* ]]; then
    log "postgresql: cluster ${ver}/main already running"
  else
    log "postgresql: starting cluster ${ver}/main"
    if ! pg_ctlcluster --skip-systemctl-redirect "$ver" main start 9>&-; then
      service_failed "postgresql" "pg_ctlcluster ${ver} main start failed (see /var/log/postgresql/postgresql-${ver}-main.log)"
      return
    fi
  fi
  local deadline=$(($(date +%s) + DEADLINE_S))
  until pg_isready -q -h "$PG_SOCKET_DIR" -p "$port"; do
    if (($(date +%s) >= deadline)); then
      service_failed "postgresql" "pg_isready -h ${PG_SOCKET_DIR} not ready within ${DEADLINE_S} s"
      return
    fi
    sleep 0.5
  done
  local role
  role=$(id -un)
  if pg_role_exists "$role" "$port"; then
    log "postgresql: role ${role} exists"
  else
    log "postgresql: creating superuser role ${role}"
    if ! (cd / && su postgres -s /bin/sh -c "createuser -h '$PG_SOCKET_DIR' -p '$port' -s '$role'"); then
      service_failed "postgresql" "createuser -s ${role} failed"
      return
    fi
  fi
  if ! psql -h "$PG_SOCKET_DIR" -p "$port" -d postgres -tAc 'select 1' >/dev/null; then
    service_failed "postgresql" "psql -h ${PG_SOCKET_DIR} -d postgres -c 'select 1' failed as ${role}"
    return
  fi
  log "postgresql: ready (postgresql://${role}@/postgres?host=${PG_SOCKET_DIR}) ($(elapsed) s)"
}
setup_postgres

# ------------------------------------------------------------- test image --

build_image() {
  # Called from an `if`, where `set -e` is off: every step is checked by hand.
  # The subshell's EXIT trap always removes the temporary root filesystem.
  (
    root=$(mktemp -d /tmp/conduit-busybox-rootfs.XXXXXX) || exit 1
    trap 'rm -rf "$root"' EXIT
    build_rootfs "$root" || exit 1
    tar -C "$root" --numeric-owner --owner=0 --group=0 -c . \
      | docker --host "$DOCKER_HOST_URI" import \
        --change 'ENV PATH=/bin' \
        --change 'CMD ["/bin/sh"]' \
        --change "LABEL org.conduit.test-image.recipe=${IMAGE_RECIPE}" \
        - "$IMAGE" >/dev/null
  )
}

build_rootfs() {
  local root=${1:?}
  # Never write outside a fresh temp dir (an empty $root would mean /etc/passwd).
  [[ -d $root && $root == /tmp/conduit-busybox-rootfs.* ]] || return 1
  mkdir -p "$root"/{bin,etc,root,tmp,proc,sys,dev,home} || return 1
  chmod 1777 "$root/tmp" && chmod 700 "$root/root" || return 1
  cp /bin/busybox "$root/bin/busybox" || return 1
  local applets applet
  applets=$("$root/bin/busybox" --list) && [[ -n $applets ]] || return 1
  for applet in $applets; do
    [[ $applet == busybox ]] || ln -s busybox "$root/bin/$applet" || return 1
  done
  # Everything lives in /bin; /sbin, /usr/bin, /usr/sbin point there too so
  # scripts with #!/usr/bin/env keep working.
  mkdir -p "$root/usr" || return 1
  ln -s bin "$root/sbin" && ln -s ../bin "$root/usr/bin" && ln -s ../bin "$root/usr/sbin" || return 1
  printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' \
    'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' >"$root/etc/passwd" || return 1
  printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$root/etc/group" || return 1
}

setup_image() {
  if ((!DOCKER_UP)); then
    service_failed "test image" "${IMAGE} not checked: docker is not up"
    return
  fi
  if [[ ! -x /bin/busybox ]]; then
    service_failed "test image" "/bin/busybox missing (package busybox-static)"
    return
  fi
  local recipe
  recipe=$(docker --host "$DOCKER_HOST_URI" image inspect \
    --format '{{ index .Config.Labels "org.conduit.test-image.recipe" }}' "$IMAGE" 2>/dev/null || true)
  if [[ $recipe == "$IMAGE_RECIPE" ]]; then
    log "image: ${IMAGE} present"
  else
    log "image: building ${IMAGE} from /bin/busybox"
    if ! build_image; then
      service_failed "test image" "docker import of ${IMAGE} failed"
      return
    fi
  fi
  local out
  out=$(timeout 60 docker --host "$DOCKER_HOST_URI" run --rm --network none "$IMAGE" /bin/sh -c 'echo ok' 2>&1 || true)
  if [[ $out == ok ]]; then
    log "image: ${IMAGE} runs (docker run --network none ... echo ok) ($(elapsed) s)"
  else
    service_failed "test image" "docker run --rm --network none ${IMAGE} /bin/sh -c 'echo ok' printed: ${out}"
  fi
}
setup_image

# ---------------------------------------------------------------- summary --

if ((${#FAILED_SERVICES[@]} > 0)); then
  warn "services not available: ${FAILED_SERVICES[*]} ($(elapsed) s)"
else
  log "services ready: docker, postgresql, ${IMAGE} ($(elapsed) s)"
fi
