#!/usr/bin/env bash
# Make sure the real services the test suite talks to are up, in this order:
#   PostgreSQL, Redis, a Docker engine, a registry on 127.0.0.1:5000, the busybox
#   test image in that registry, gVisor (runsc) registered with the engine, and Chromium
#   for the browser tests, and Prometheus (promtool for the alert rules, a server that
#   scrapes /metrics in the observability tests), and an S3-compatible object store on
#   127.0.0.1:9000 (moto's standalone server) for tests/storage/.
#
# Idempotent and quick when everything already runs: each step first checks, and only
# installs (Debian packages, as root) or starts what is missing. One line per service.
#
# With CI=true a service that cannot be provided is an error (exit 1): nothing real is
# skipped in CI. Otherwise it is a warning and the tests that need it fail or skip with
# their own message.
set -uo pipefail

CI="${CI:-false}"
APT_UPDATED=0
PROBLEMS=0

REGISTRY_ADDR="127.0.0.1:5000"
REGISTRY_CONFIG="/etc/docker/registry/computepool-ci.yml"
REGISTRY_STORAGE="/var/lib/docker-registry"
TEST_IMAGE_REPO="computepool/busybox"
TEST_IMAGE_TAG="test"
TEST_IMAGE="$REGISTRY_ADDR/$TEST_IMAGE_REPO:$TEST_IMAGE_TAG"
DOCKERD_LOG="/var/log/dockerd-ci.log"
DAEMON_JSON="/etc/docker/daemon.json"
DOCKERD_PIDFILE="/var/run/docker.pid"
# The two dockerd runtimes of gVisor, one per network mode (the agent maps `gvisor` and a job's
# network mode to one of them: worker_agent/runtime/docker.py). Under `none` the sandbox has no
# network at all; under a pool network runsc passes through the network namespace that Docker
# made for the container (`--network=host` means the container's namespace, not the host's).
GVISOR_RUNTIMES='{"runsc-none": ["--network=none"], "runsc-netns": ["--network=host"]}'
APT_LOG="/var/log/ensure-services-apt.log"

# --- helpers -----------------------------------------------------------------------

say() { printf '%-9s %s\n' "$1:" "${*:2}"; }

# A service is missing and cannot be provided: fatal in CI, a warning elsewhere.
missing() {
    if [ "$CI" = "true" ]; then
        printf '%-9s ERROR: %s (CI=true: nothing real is skipped)\n' "$1:" "${*:2}" >&2
        exit 1
    fi
    printf '%-9s WARNING: %s; tests that need it will fail or skip\n' "$1:" "${*:2}" >&2
    PROBLEMS=$((PROBLEMS + 1))
}

is_root() { [ "$(id -u)" -eq 0 ]; }

# wait_for SECONDS COMMAND...: retry COMMAND (quietly) until it succeeds or time runs out.
wait_for() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -ge "$deadline" ] && return 1
        sleep 0.3
    done
}

# apt_install PKG...: install Debian packages as root; `apt-get update` at most once a run.
# Package scripts must not start services (we start them ourselves, with our own flags
# and bindings), so a policy-rc.d that refuses starts is put in place if there is none.
apt_install() {
    is_root || return 1
    local policy_added=0 rc=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        policy_added=1
    fi
    if [ "$APT_UPDATED" -eq 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$APT_LOG" 2>&1 && APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
        >>"$APT_LOG" 2>&1 || rc=$?
    [ "$policy_added" -eq 1 ] && rm -f /usr/sbin/policy-rc.d
    [ "$rc" -ne 0 ] && echo "apt-get install $* failed, see $APT_LOG" >&2
    return "$rc"
}

# Start a long-running program detached from this script (it must outlive `make test`).
spawn() {
    local log="$1"
    shift
    mkdir -p "$(dirname "$log")"
    setsid nohup "$@" >>"$log" 2>&1 </dev/null &
}

# --- 1. PostgreSQL -----------------------------------------------------------------

# shellcheck disable=SC2012  # cluster versions are plain numbers such as 15
pg_cluster_version() { ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1; }

ensure_postgres() {
    if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
        say postgres "answering on 127.0.0.1:5432"
        return
    fi
    local action="started"
    if ! command -v pg_ctlcluster >/dev/null || [ -z "$(pg_cluster_version)" ]; then
        if ! apt_install postgresql; then
            missing postgres "not installed and cannot install it (need root and apt)"
            return
        fi
        action="installed and started"
        # A fresh cluster asks TCP clients for a password; the tests connect as postgres
        # without one, like on the prepared machines (trust on loopback only).
        local hba
        hba="/etc/postgresql/$(pg_cluster_version)/main/pg_hba.conf"
        sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    fi
    pg_ctlcluster --skip-systemctl-redirect "$(pg_cluster_version)" main start >/dev/null 2>&1
    if wait_for 30 pg_isready -q -h 127.0.0.1 -p 5432; then
        say postgres "$action; answering on 127.0.0.1:5432"
    else
        missing postgres "does not answer on 127.0.0.1:5432 after start"
    fi
}

# --- 2. Redis ----------------------------------------------------------------------

# PING over bash's /dev/tcp, so no redis-cli is needed for the check.
redis_pong() {
    local reply
    exec 3<>/dev/tcp/127.0.0.1/6379 || return 1
    printf 'PING\r\n' >&3
    read -r -t 2 reply <&3
    exec 3>&-
    [[ "$reply" == "+PONG"* ]]
}

ensure_redis() {
    if redis_pong 2>/dev/null; then
        say redis "answering PING on 127.0.0.1:6379"
        return
    fi
    local action="started"
    if ! command -v redis-server >/dev/null; then
        if ! apt_install redis-server; then
            missing redis "not installed and cannot install it (need root and apt)"
            return
        fi
        action="installed and started"
    fi
    mkdir -p /var/lib/redis /var/log/redis
    # Same command as the prepared machines: loopback only, nothing kept on disk.
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
        --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log >/dev/null 2>&1
    if wait_for 15 redis_pong; then
        say redis "$action; answering PING on 127.0.0.1:6379"
    else
        missing redis "does not answer on 127.0.0.1:6379 after start (see /var/log/redis/ci.log)"
    fi
}

# --- 3. Docker engine --------------------------------------------------------------

docker_up() { docker info >/dev/null 2>&1; }

# dockerd_attempt FLAGS...: start dockerd in the background; true once it answers,
# false (and nothing left running) when it exits or does not answer within 60 s.
dockerd_attempt() {
    echo "--- ensure-services: dockerd $* ($(date -Is))" >>"$DOCKERD_LOG"
    spawn "$DOCKERD_LOG" dockerd "$@"
    local pid=$! deadline=$((SECONDS + 60))
    until docker_up; do
        if ! kill -0 "$pid" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
            kill "$pid" 2>/dev/null && wait_for 15 bash -c "! kill -0 $pid"
            return 1
        fi
        sleep 0.3
    done
}

start_dockerd() {
    # No systemd here, so dockerd runs in the background and starts its own containerd.
    # On these VMs (cgroup v1, ext4 root, full capabilities) overlay2 with the default
    # bridge and iptables works. Where the kernel refuses overlay mounts or netfilter
    # (nested containers), fall back to the slow but portable vfs driver without any
    # network setup; containers then only get --network none / host.
    DOCKERD_FLAGS="--storage-driver=overlay2"
    dockerd_attempt --storage-driver=overlay2 && return 0
    DOCKERD_FLAGS="--storage-driver=vfs --iptables=false --bridge=none"
    dockerd_attempt --storage-driver=vfs --iptables=false --bridge=none
}

ensure_docker() {
    if docker_up; then
        say docker "engine answering ($(docker version -f '{{.Server.Version}}' 2>/dev/null))"
        return
    fi
    local action="started dockerd"
    if ! command -v dockerd >/dev/null; then
        if ! apt_install docker.io; then
            missing docker "docker.io not installed and cannot install it (need root and apt)"
            return
        fi
        action="installed docker.io and started dockerd"
    fi
    if ! is_root; then
        missing docker "engine not answering to this user (not running, or no access to" \
            "/var/run/docker.sock) and only root can start dockerd"
        return
    fi
    if start_dockerd; then
        local version
        version="$(docker version -f '{{.Server.Version}}' 2>/dev/null)"
        say docker "$action $version with $DOCKERD_FLAGS (log $DOCKERD_LOG)"
    else
        missing docker "dockerd did not come up (see $DOCKERD_LOG)"
    fi
}

# --- 4. Registry on 127.0.0.1:5000 -------------------------------------------------

registry_up() { curl -fsS -o /dev/null --max-time 2 "http://$REGISTRY_ADDR/v2/" 2>/dev/null; }

# True when something listens on port 5000 on all interfaces (must be loopback only).
registry_exposed() {
    command -v ss >/dev/null || return 1
    ss -Hltn 'sport = :5000' | awk '{print $4}' | grep -qvE '^(127\.[0-9.]+|\[::1\]):5000$'
}

write_registry_config() {
    mkdir -p "$(dirname "$REGISTRY_CONFIG")" "$REGISTRY_STORAGE"
    cat >"$REGISTRY_CONFIG" <<EOF
# Written by .ci/ensure-services.sh: the test registry, loopback only.
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $REGISTRY_STORAGE
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
  headers:
    X-Content-Type-Options: [nosniff]
EOF
}

ensure_registry() {
    if registry_up; then
        if registry_exposed; then
            missing registry "something on port 5000 listens beyond 127.0.0.1"
        else
            say registry "answering on http://$REGISTRY_ADDR/v2/"
        fi
        return
    fi
    local action="started"
    if ! command -v docker-registry >/dev/null; then
        if ! apt_install docker-registry; then
            missing registry "docker-registry not installed and cannot install it"
            return
        fi
        action="installed and started"
    fi
    write_registry_config
    spawn /var/log/docker-registry-ci.log docker-registry serve "$REGISTRY_CONFIG"
    if wait_for 20 registry_up; then
        say registry "$action; answering on http://$REGISTRY_ADDR/v2/ (config $REGISTRY_CONFIG)"
    else
        missing registry "does not answer on $REGISTRY_ADDR (see /var/log/docker-registry-ci.log)"
    fi
}

# --- 5. busybox test image ---------------------------------------------------------

# Digest of the test image's manifest in the registry, empty when it is not there.
registry_image_digest() {
    curl -fsS -I --max-time 5 \
        -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
        "http://$REGISTRY_ADDR/v2/$TEST_IMAGE_REPO/manifests/$TEST_IMAGE_TAG" 2>/dev/null |
        tr -d '\r' | awk 'tolower($1) == "docker-content-digest:" {print $2}'
}

# Build FROM scratch: the static busybox and a few applet links, nothing else.
build_and_push_image() {
    local ctx applet
    ctx="$(mktemp -d)"
    mkdir -p "$ctx/rootfs/bin" "$ctx/rootfs/tmp"
    chmod 1777 "$ctx/rootfs/tmp"
    cp /bin/busybox "$ctx/rootfs/bin/busybox"
    for applet in sh sleep cat echo nproc free ls; do
        ln -s busybox "$ctx/rootfs/bin/$applet"
    done
    cat >"$ctx/Dockerfile" <<'EOF'
FROM scratch
COPY rootfs/ /
ENV PATH=/bin
CMD ["/bin/sh"]
EOF
    # The classic builder: no buildx plugin is needed for a two-line Dockerfile.
    local rc=0
    { DOCKER_BUILDKIT=0 docker build -q -t "$TEST_IMAGE" "$ctx" &&
        docker push -q "$TEST_IMAGE"; } >"$ctx/log" 2>&1 || rc=$?
    [ "$rc" -ne 0 ] && cat "$ctx/log" >&2
    rm -rf "$ctx"
    return "$rc"
}

ensure_test_image() {
    local action="" digest
    if ! [ -x /bin/busybox ] || ! dpkg -s busybox-static >/dev/null 2>&1; then
        if ! apt_install busybox-static; then
            missing image "busybox-static not installed and cannot install it"
            return
        fi
        action="installed busybox-static; "
    fi
    if ! registry_up || ! docker_up; then
        missing image "needs the Docker engine and the registry to build $TEST_IMAGE"
        return
    fi
    digest="$(registry_image_digest)"
    if [ -z "$digest" ]; then
        if ! build_and_push_image; then
            missing image "could not build and push $TEST_IMAGE"
            return
        fi
        action="${action}built and pushed; "
        digest="$(registry_image_digest)"
    else
        action="${action}present; "
    fi
    if [ -n "$digest" ]; then
        say image "${action}$REGISTRY_ADDR/$TEST_IMAGE_REPO@$digest"
    else
        missing image "$TEST_IMAGE has no manifest digest in the registry"
    fi
}

# --- 6. gVisor (runsc) registered with the engine ----------------------------------

# The runtimes dockerd has loaded, as JSON ({"runc": {...}, "runsc-none": {...}}).
docker_runtimes() { docker info --format '{{json .Runtimes}}' 2>/dev/null; }

# True when the engine has loaded both gVisor runtimes.
gvisor_registered() {
    docker_runtimes | python3 -c '
import json, sys
loaded = json.load(sys.stdin)
sys.exit(0 if all(name in loaded for name in json.loads(sys.argv[1])) else 1)
' "$GVISOR_RUNTIMES"
}

# Merge the two runtimes into daemon.json, keeping everything else in it (created when missing).
# Prints "unchanged" or "written"; written atomically, so dockerd never reads half a file.
merge_daemon_json() {
    mkdir -p "$(dirname "$DAEMON_JSON")"
    python3 - "$DAEMON_JSON" "$1" "$GVISOR_RUNTIMES" <<'PY'
import json, os, sys
path, runsc, wanted = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    with open(path) as f:
        config = json.load(f)
except FileNotFoundError:
    config = {}
runtimes = config.setdefault("runtimes", {})
before = json.dumps(runtimes, sort_keys=True)
for name, args in wanted.items():
    runtimes[name] = {"path": runsc, "runtimeArgs": args}
if json.dumps(runtimes, sort_keys=True) == before:
    print("unchanged")
    sys.exit(0)
tmp = path + ".ensure-services.tmp"
with open(tmp, "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
print("written")
PY
}

# SIGHUP makes dockerd reload daemon.json, runtimes included, without touching containers.
reload_dockerd() {
    local pid
    pid="$(cat "$DOCKERD_PIDFILE" 2>/dev/null)"
    [ -n "$pid" ] && kill -HUP "$pid" 2>/dev/null && wait_for 15 gvisor_registered
}

# Restart dockerd the way start_dockerd starts it, only when that loses nothing: an engine that
# runs containers is never restarted here (it may be shared).
restart_idle_dockerd() {
    local pid
    pid="$(cat "$DOCKERD_PIDFILE" 2>/dev/null)"
    [ -n "$pid" ] && [ -z "$(docker ps -q 2>/dev/null)" ] || return 1
    kill "$pid" 2>/dev/null && wait_for 30 bash -c "! kill -0 $pid" || return 1
    start_dockerd && wait_for 15 gvisor_registered
}

# The sandbox really starts: gVisor's own kernel answers uname (4.4.0), not the host's.
gvisor_kernel() {
    docker run --rm --runtime=runsc-none --network=none "$TEST_IMAGE" busybox uname -r 2>&1 | tail -n 1
}

ensure_gvisor() {
    local action="" runsc written kernel
    if ! docker_up; then
        missing gvisor "needs the Docker engine to register runsc"
        return
    fi
    if ! command -v runsc >/dev/null; then
        if ! apt_install runsc; then
            missing gvisor "runsc not installed and cannot install Debian's runsc (need root and apt)"
            return
        fi
        action="installed runsc; "
    fi
    runsc="$(command -v runsc)"
    if ! written="$(merge_daemon_json "$runsc")"; then
        missing gvisor "could not merge the runsc runtimes into $DAEMON_JSON"
        return
    fi
    [ "$written" = "written" ] && action="${action}runtimes merged into $DAEMON_JSON; "
    # a changed file is reloaded even where the names are loaded already (a new path or args)
    if [ "$written" = "written" ] || ! gvisor_registered; then
        if reload_dockerd; then
            action="${action}dockerd reloaded (SIGHUP); "
        elif restart_idle_dockerd; then
            action="${action}dockerd restarted (it ran no containers); "
        else
            missing gvisor "dockerd did not load the runsc runtimes of $DAEMON_JSON on SIGHUP" \
                "and runs containers, so it was not restarted"
            return
        fi
    fi
    kernel="$(gvisor_kernel)"
    if [ "$kernel" = "4.4.0" ]; then
        say gvisor "${action}runtimes runsc-none, runsc-netns ($runsc); sandbox kernel $kernel"
    else
        missing gvisor "a runsc-none container did not start under gVisor: $kernel"
    fi
}

# --- 7. Chromium for the Playwright tests ------------------------------------------

ensure_chromium() {
    if [ -x /usr/bin/chromium ]; then
        say chromium "present at /usr/bin/chromium"
        return
    fi
    if apt_install chromium && [ -x /usr/bin/chromium ]; then
        say chromium "installed at /usr/bin/chromium"
    else
        missing chromium "/usr/bin/chromium missing and cannot install Debian's chromium"
    fi
}

# --- 8. Prometheus: promtool checks the shipped alert rules, a real server scrapes /metrics ---

ensure_prometheus() {
    if [ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ]; then
        say prometheus "present: $(/usr/bin/prometheus --version 2>&1 | head -n 1)"
        return
    fi
    if apt_install prometheus && [ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ]; then
        say prometheus "installed Debian's prometheus (with promtool)"
    else
        missing prometheus "/usr/bin/prometheus or promtool missing and cannot install them"
    fi
}

# --- 9. An S3-compatible object store on loopback (moto's standalone server) ---------

# moto[server] in a venv of its own (the project's .venv may not exist yet, and the product never
# imports moto: it talks to the store over HTTP, as to MinIO). Keys and buckets live in its memory.
S3_ADDR="${OBJECT_STORE_TEST_ADDR:-127.0.0.1:9000}"
S3_VENV="/opt/computepool-s3"
S3_LOG="/var/log/computepool-s3.log"
S3_MOTO="moto[server]>=5.1,<6"

s3_up() { curl -fsS -o /dev/null --max-time 2 "http://$S3_ADDR/moto-api/data.json" 2>/dev/null; }

ensure_object_store() {
    if s3_up; then
        say s3 "moto S3 server answering on $S3_ADDR"
        return
    fi
    local action="started"
    if [ ! -x "$S3_VENV/bin/moto_server" ]; then
        if ! { python3 -m venv "$S3_VENV" >/dev/null 2>&1 || { apt_install python3-venv &&
            python3 -m venv "$S3_VENV" >/dev/null 2>&1; }; } ||
            ! "$S3_VENV/bin/pip" install -q "$S3_MOTO" >>"$S3_LOG" 2>&1; then
            missing s3 "cannot install $S3_MOTO into $S3_VENV (see $S3_LOG)"
            return
        fi
        action="installed ($S3_MOTO in $S3_VENV) and started"
    fi
    spawn "$S3_LOG" "$S3_VENV/bin/moto_server" -H "${S3_ADDR%:*}" -p "${S3_ADDR##*:}"
    if wait_for 30 s3_up; then
        say s3 "$action; moto S3 server on $S3_ADDR"
    else
        missing s3 "moto_server does not answer on $S3_ADDR (see $S3_LOG)"
    fi
}

# `--for-run` (make run): only what running jobs needs — the Docker engine, the loopback registry,
# the test image and gVisor. Best effort: make run falls back to SQLite, the embedded Redis and, without
# Docker, the process runtime, so nothing here is fatal there.
if [ "${1:-}" = "--for-run" ]; then
    CI=false
    ensure_docker
    ensure_registry
    ensure_test_image
    ensure_gvisor
    exit 0
fi

ensure_postgres
ensure_redis
ensure_docker
ensure_registry
ensure_test_image
ensure_gvisor
ensure_chromium
ensure_prometheus
ensure_object_store

if [ "$PROBLEMS" -gt 0 ]; then
    echo "services: $PROBLEMS missing (warnings above); continuing because CI is not true" >&2
fi
exit 0
