#!/usr/bin/env bash
# Bring the compose pipeline (../compose.yaml) up for real and check it; run by .ci/run.
#
#   ops/compose-test.sh            # engine: a Docker engine when one answers, else rootful podman
#
# Engines:
# - docker: `docker compose up -d --build` of compose.yaml alone (Apache Kafka, redis:7-alpine,
#   python:3.11-slim base; needs a registry). Health/metrics on localhost:9401/9402.
# - podman (a Debian machine with no Docker engine and no image registry, like CI): installs
#   podman, runc and debootstrap (apt-get, root), writes a private containers.conf (runc, cgroupfs,
#   ulimits within the machine's hard limits), makes a local base image (debootstrap minbase +
#   python3/pip/venv/redis-server, the host's CA bundle for pip) once and reuses it, builds the
#   project image on it (Dockerfile ARG BASE_IMAGE), fetches the docker compose v2 plugin from
#   Debian trixie's docker-compose .deb (private apt list dir; bookworm has only v1), serves the
#   Docker API from `podman system service` on a private socket, runs `podman healthcheck run`
#   every 2 s (podman's own health timers need systemd), and uses compose.yaml plus
#   ops/compose.local.yaml (host network on loopback, embedded broker, local base).
#   Health/metrics on 127.0.0.1:19501/19502.
# Checks: every example record of worker/demo_data/examples.jsonl gets a 200 reply (the client's
# exit status and its "N/N examples derendered OK" line), both workers' /readyz is 200, the workers'
# derender_records_processed_total sums to the number of examples, a `kill -9` of the process of the
# worker that answered them (the examples' keys are fixed: round 2 goes to its partitions) is
# restarted by `restart: unless-stopped` while a second round of records gets every reply (no
# record lost), `stop` of the other worker drains and exits 0, and `down` leaves no container.
# Everything it starts (containers, podman service, health loop) is stopped on every exit path.
# Exit 0 when every check passed, 1 with "compose-test: FAILED: <reason>" otherwise (also when
# neither engine can start: it never skips).
# Environment: COMPOSE_TEST_ENGINE=auto|docker|podman, COMPOSE_TEST_WORK (default
# /var/tmp/derender-compose-test: apt downloads, compose plugin, socket, logs), DEBIAN_MIRROR.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${COMPOSE_TEST_WORK:-/var/tmp/derender-compose-test}
ENGINE=${COMPOSE_TEST_ENGINE:-auto}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE_IMAGE=localhost/pybase:$SUITE
MINBASE=localhost/debian:$SUITE-minbase
IMAGE=derender-worker:local
PROJECT=derender-ci
T0=$(date +%s)
N_EXAMPLES=$(grep -c . "$REPO/worker/demo_data/examples.jsonl")

log() { echo "compose-test [$(( $(date +%s) - T0 ))s] $*"; }
die() { echo "compose-test: FAILED: $*" >&2; exit 1; }

SVC_PID="" HEALTH_PID="" UP=0 OK=0
COMPOSE=()
cleanup() {
  local status=$?
  set +e
  if [ "$UP" = 1 ]; then
    if [ "$OK" != 1 ]; then
      log "logs of the failed run (last 40 lines per service):"
      "${COMPOSE[@]}" logs --no-color --tail 40 2>&1 | sed 's/^/  /'
    fi
    "${COMPOSE[@]}" down --remove-orphans --timeout 10 >/dev/null 2>&1
  fi
  if [ -n "$HEALTH_PID" ]; then kill "$HEALTH_PID" 2>/dev/null; wait "$HEALTH_PID" 2>/dev/null; fi
  if [ -n "$SVC_PID" ]; then kill "$SVC_PID" 2>/dev/null; wait "$SVC_PID" 2>/dev/null; fi
  rm -f "$WORK/podman.sock"
  log "cleaned up (exit $status)"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$WORK"
APT_UPDATED=""
apt_install() {  # one apt-get update per run; root only
  [ "$(id -u)" = 0 ] || die "installing $* needs root (apt-get)"
  if [ -z "$APT_UPDATED" ]; then apt-get update -qq || die "apt-get update failed"; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null || die "apt-get install $* failed"
}

compose_plugin() {  # docker compose v2 binary from Debian trixie's docker-compose .deb -> $WORK/bin
  local bin="$WORK/bin/docker-compose"
  if [ -x "$bin" ] && "$bin" version >/dev/null 2>&1; then echo "$bin"; return; fi
  local apt="$WORK/apt"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$WORK/bin"
  echo "deb $MIRROR trixie main" > "$apt/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
              -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o "APT::Sandbox::User=root" -qq)
  apt-get "${opts[@]}" update >&2 || die "apt-get update of the private trixie list failed"
  rm -f "$apt"/docker-compose_*.deb
  (cd "$apt" && apt-get "${opts[@]}" download docker-compose >&2) || die "apt-get download docker-compose failed"
  rm -rf "$apt/x"
  dpkg-deb -x "$apt"/docker-compose_*.deb "$apt/x"
  local found
  found=$(find "$apt/x" -type f -name docker-compose -path '*cli-plugins*' | head -1)
  [ -n "$found" ] || found=$(find "$apt/x" -type f -name docker-compose | head -1)
  [ -n "$found" ] || die "no docker-compose binary in $(ls "$apt"/docker-compose_*.deb)"
  install -m 0755 "$found" "$bin"
  "$bin" version >/dev/null 2>&1 || die "$bin does not run: $("$bin" version 2>&1 | head -1)"
  echo "$bin"
}

# ---------------------------------------------------------------- engine
if [ "$ENGINE" = auto ]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then ENGINE=docker
  else
    ENGINE=podman
    why="no docker CLI"
    command -v docker >/dev/null 2>&1 && why=$( (docker info 2>&1 || :) | grep -m1 -i -E 'error|cannot' || :)
    log "no Docker engine answers (${why:-docker info fails}); using podman"
  fi
fi

if [ "$ENGINE" = docker ]; then
  if docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose)
  else plugin=$(compose_plugin); COMPOSE=("$plugin"); fi
  INSPECT=(docker inspect)
  PORT1=9401 PORT2=9402
  FILES=(-f "$REPO/compose.yaml")
  UP_ARGS=(--build)
  log "engine: Docker $(docker version -f '{{.Server.Version}}' 2>/dev/null), $("${COMPOSE[@]}" version --short 2>/dev/null)"
elif [ "$ENGINE" = podman ]; then
  [ "$(id -u)" = 0 ] || die "the podman route needs root (rootful podman, apt-get); no Docker engine answers either"
  command -v apt-get >/dev/null 2>&1 || die "no Docker engine answers and no apt-get for the podman route"
  for c in podman runc debootstrap curl; do
    command -v "$c" >/dev/null 2>&1 || { apt_install podman runc debootstrap curl; break; }
  done
  hard_nofile=$(ulimit -Hn)
  [ "$hard_nofile" = unlimited ] && hard_nofile=1048576
  cat > "$WORK/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$hard_nofile:$hard_nofile", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  export CONTAINERS_CONF="$WORK/containers.conf"
  podman info >/dev/null 2>&1 || die "podman info fails: $(podman info 2>&1 | tail -1)"

  # local base image (stands in for python:3.11-slim and redis:7-alpine), made once
  if ! podman image exists "$BASE_IMAGE"; then
    if ! podman image exists "$MINBASE"; then
      log "debootstrap --variant=minbase $SUITE (once)"
      rm -rf "$WORK/rootfs"
      debootstrap --variant=minbase "$SUITE" "$WORK/rootfs" "$MIRROR" > "$WORK/debootstrap.log" 2>&1 \
        || die "debootstrap failed: $(tail -3 "$WORK/debootstrap.log")"
      tar -C "$WORK/rootfs" -c . | podman import - "$MINBASE" >/dev/null || die "podman import failed"
      rm -rf "$WORK/rootfs"
    fi
    log "building $BASE_IMAGE (once)"
    mkdir -p "$WORK/pybase"
    cp /etc/ssl/certs/ca-certificates.crt "$WORK/pybase/host-ca-bundle.crt"
    cat > "$WORK/pybase/Containerfile" <<EOF
FROM $MINBASE
COPY host-ca-bundle.crt /etc/ssl/certs/host-ca-bundle.crt
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      python3 python3-pip python3-venv python-is-python3 redis-server ca-certificates \\
    && rm -rf /var/lib/apt/lists/* && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED
ENV PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt
EOF
    podman build -q --network host --pull=never -t "$BASE_IMAGE" "$WORK/pybase" > "$WORK/pybase.log" 2>&1 \
      || die "building $BASE_IMAGE failed: $(tail -5 "$WORK/pybase.log")"
  else
    log "reusing $BASE_IMAGE"
  fi

  log "building $IMAGE on $BASE_IMAGE"
  podman build --network host --pull=never --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "localhost/$IMAGE" \
    "$REPO" > "$WORK/build.log" 2>&1 || die "podman build failed: $(tail -15 "$WORK/build.log")"

  plugin=$(compose_plugin)
  COMPOSE=("$plugin")
  rm -f "$WORK/podman.sock"
  podman system service --time=0 "unix://$WORK/podman.sock" > "$WORK/podman-service.log" 2>&1 &
  SVC_PID=$!
  export DOCKER_HOST="unix://$WORK/podman.sock"
  for _ in $(seq 1 100); do
    curl -fsS --unix-socket "$WORK/podman.sock" http://d/_ping >/dev/null 2>&1 && break
    kill -0 "$SVC_PID" 2>/dev/null || die "podman system service exited: $(tail -3 "$WORK/podman-service.log")"
    sleep 0.1
  done
  curl -fsS --unix-socket "$WORK/podman.sock" http://d/_ping >/dev/null 2>&1 || die "podman service does not answer"
  (  # podman schedules healthchecks with systemd timers; there is no systemd here
    while sleep 2; do
      for id in $(podman ps -q --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null); do
        podman healthcheck run "$id" >/dev/null 2>&1 || :   # the outcome is recorded by podman itself
      done
    done
  ) &
  HEALTH_PID=$!
  INSPECT=(podman inspect)
  PORT1=19501 PORT2=19502
  FILES=(-f "$REPO/compose.yaml" -f "$REPO/ops/compose.local.yaml")
  UP_ARGS=(--no-build)
  export DERENDER_BASE_IMAGE="$BASE_IMAGE"
  log "engine: podman $(podman version -f '{{.Server.Version}}' 2>/dev/null) (Docker API on $DOCKER_HOST), docker compose $("${COMPOSE[0]}" version --short)"
else
  die "COMPOSE_TEST_ENGINE=$ENGINE: expected auto, docker or podman"
fi

COMPOSE=("${COMPOSE[@]}" --ansi never -p "$PROJECT" "${FILES[@]}")
cd "$REPO"
"${COMPOSE[@]}" config -q || die "docker compose config rejects the files"

# ---------------------------------------------------------------- helpers
cid() { "${COMPOSE[@]}" ps -a -q "$1" | head -1; }
state() { "${INSPECT[@]}" -f '{{.State.Status}} {{.State.ExitCode}}' "$1"; }
http_get() { curl -fsS --max-time 5 "$1"; }
wait_exit() {  # wait_exit CONTAINER SECONDS -> prints exit code
  local id=$1 s
  for _ in $(seq 1 "$2"); do
    s=$(state "$id")
    case "$s" in exited*|stopped*) echo "${s#* }"; return;; esac
    sleep 1
  done
  die "container $id still '$(state "$id")' after $2 s"
}
wait_ready() {  # wait_ready PORT SECONDS
  for _ in $(seq 1 "$2"); do
    http_get "http://127.0.0.1:$1/readyz" >/dev/null 2>&1 && return
    sleep 1
  done
  die "/readyz on port $1 not 200 after $2 s: $(curl -sS --max-time 5 "http://127.0.0.1:$1/readyz" 2>&1 | head -2)"
}
processed() {  # sum of derender_records_processed_total on a worker's /metrics
  http_get "http://127.0.0.1:$1/metrics" | awk '/^derender_records_processed_total[{ ]/ {s += $NF} END {printf "%d\n", s}'
}
check_client_output() {  # check_client_output TEXT ROUND
  local text replies
  text=$(printf '%s\n' "$1" | sed 's/\x1b\[[0-9;]*[A-Za-z]//g')   # no terminal escapes
  printf '%s\n' "$text" | grep -q "^$N_EXAMPLES/$N_EXAMPLES examples derendered OK" \
    || die "round $2: not every example derendered OK: $(printf '%s\n' "$text" | grep -E 'examples derendered|rror' | tail -3)"
  replies=$(printf '%s\n' "$text" | grep -c '^=== \[')
  [ "$replies" = "$N_EXAMPLES" ] || die "round $2: $replies replies printed, expected $N_EXAMPLES"
}

# ---------------------------------------------------------------- up
"${COMPOSE[@]}" down --remove-orphans --timeout 5 >/dev/null 2>&1 || :   # leftovers of an interrupted run
UP=1
log "docker compose up -d ${UP_ARGS[*]}"
timeout 900 "${COMPOSE[@]}" up -d "${UP_ARGS[@]}" > "$WORK/up.log" 2>&1 \
  || die "docker compose up failed: $(tail -8 "$WORK/up.log")"

client=$(cid client)
[ -n "$client" ] || die "no client container"
code=$(wait_exit "$client" 300)
out=$("${COMPOSE[@]}" logs --no-color --no-log-prefix client 2>&1)
[ "$code" = 0 ] || die "client exited $code: $(echo "$out" | tail -5)"
check_client_output "$out" 1
log "round 1: $N_EXAMPLES/$N_EXAMPLES replies (client exit 0)"

wait_ready "$PORT1" 30
wait_ready "$PORT2" 30
log "/readyz 200 on both workers ($PORT1, $PORT2)"
n1=$(processed "$PORT1") n2=$(processed "$PORT2")
[ $(( n1 + n2 )) = "$N_EXAMPLES" ] || die "/metrics: derender_records_processed_total $n1 + $n2, expected $N_EXAMPLES"
log "/metrics: derender_records_processed_total worker-1 $n1 + worker-2 $n2 = $N_EXAMPLES"

# ---------------------------------------------------------------- kill -9 + restart, no record lost
# The examples' keys are fixed, so round 2's records go to the partitions that served round 1:
# kill the worker holding them, so they must be answered after a rebalance or by its restart.
if [ "$n1" -ge "$n2" ]; then victim=worker-1 vport=$PORT1 other=worker-2
else victim=worker-2 vport=$PORT2 other=worker-1; fi
wv=$(cid "$victim")
pid=$("${INSPECT[@]}" -f '{{.State.Pid}}' "$wv")
restarts0=$("${INSPECT[@]}" -f '{{.RestartCount}}' "$wv")
[ "${pid:-0}" -gt 0 ] || die "$victim has no PID"
kill -9 "$pid"   # from the host: a kill through the engine counts as a manual stop (no restart)
log "kill -9 of $victim (pid $pid), which answered round 1; round 2 while it restarts"
out=$(timeout 300 "${COMPOSE[@]}" run --rm --no-deps -T client 2>&1) || die "round 2 client failed: $(echo "$out" | tail -5)"
check_client_output "$out" 2
log "round 2: $N_EXAMPLES/$N_EXAMPLES replies after the kill (no record lost)"
for _ in $(seq 1 120); do
  [ "$("${INSPECT[@]}" -f '{{.RestartCount}}' "$wv")" -gt "$restarts0" ] \
    && [ "$("${INSPECT[@]}" -f '{{.State.Status}}' "$wv")" = running ] && break
  sleep 1
done
[ "$("${INSPECT[@]}" -f '{{.RestartCount}}' "$wv")" -gt "$restarts0" ] || die "$victim was not restarted (restart: unless-stopped)"
wait_ready "$vport" 180
log "$victim restarted by its restart policy, /readyz 200"

# ---------------------------------------------------------------- stop (drain), down
wo=$(cid "$other")
"${COMPOSE[@]}" stop "$other" > "$WORK/stop.log" 2>&1 || die "docker compose stop $other failed: $(tail -3 "$WORK/stop.log")"
code=$(wait_exit "$wo" 60)
[ "$code" = 0 ] || die "$other exited $code after stop (expected a clean drain, 0): $("${COMPOSE[@]}" logs --tail 5 "$other")"
log "stop: $other drained and exited 0"
"${COMPOSE[@]}" down --remove-orphans --timeout 30 > "$WORK/down.log" 2>&1 || die "docker compose down failed: $(tail -3 "$WORK/down.log")"
UP=0
left=$("${COMPOSE[@]}" ps -a -q 2>/dev/null | wc -l)
[ "$left" = 0 ] || die "down left $left containers"
log "down: no container left"
OK=1
log "OK: engine $ENGINE, every check passed in $(( $(date +%s) - T0 )) s"
