#!/usr/bin/env bash
# Start / stop / report the local object servers the tests run against.
#
#   scripts/test-env.sh start    # MinIO on 127.0.0.1:9000 (console :9001), fake-gcs-server on :4443
#   scripts/test-env.sh stop     # kills exactly the processes `start` launched (pid files)
#   scripts/test-env.sh status
#
# Ports can be moved (e.g. when another checkout's servers already hold the defaults):
#   BUCKETFS_TEST_MINIO_PORT (9000), BUCKETFS_TEST_MINIO_CONSOLE_PORT (9001), BUCKETFS_TEST_GCS_PORT (4443)
#
# State, data and logs live under .test-env/ in the repo root (gitignored).
# Binaries are looked up on PATH, then in $GOBIN, $(go env GOPATH)/bin and $HOME/go/bin.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${BUCKETFS_TEST_ENV_DIR:-$ROOT/.test-env}"
WAIT_SECS="${BUCKETFS_TEST_ENV_WAIT:-60}"

MINIO_USER="bucketfs-test"
MINIO_PASSWORD="bucketfs-test-secret"
MINIO_PORT="${BUCKETFS_TEST_MINIO_PORT:-9000}"
MINIO_CONSOLE_PORT="${BUCKETFS_TEST_MINIO_CONSOLE_PORT:-9001}"
MINIO_ADDR="127.0.0.1:$MINIO_PORT"
MINIO_CONSOLE="127.0.0.1:$MINIO_CONSOLE_PORT"
GCS_HOST="127.0.0.1"
GCS_PORT="${BUCKETFS_TEST_GCS_PORT:-4443}"

log() { echo "test-env: $*" >&2; }
die() { echo "test-env: error: $*" >&2; exit 1; }

find_bin() {
    local name="$1" dir
    if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return 0; fi
    for dir in "${GOBIN:-}" "$(go env GOPATH 2>/dev/null || true)/bin" "$HOME/go/bin"; do
        [ -n "$dir" ] && [ -x "$dir/$name" ] && { echo "$dir/$name"; return 0; }
    done
    return 1
}

# pid_alive NAME -> 0 if the pid in $STATE/NAME.pid is alive and is still that program
pid_alive() {
    local name="$1" pidf="$STATE/$1.pid" pid exe
    [ -f "$pidf" ] || return 1
    pid="$(cat "$pidf" 2>/dev/null || true)"
    [ -n "$pid" ] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    # guard against pid reuse: the process must still be the binary we launched
    exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
    case "$exe" in
        *"/$name"|*"/$name (deleted)") return 0 ;;
        *) return 1 ;;
    esac
}

# port_open PORT -> 0 if something is listening on 127.0.0.1:PORT
port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# http_ok URL -> 0 if GET URL answers with HTTP 2xx
http_ok() {
    python3 - "$1" <<'EOF' 2>/dev/null
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
        sys.exit(0 if 200 <= r.status < 300 else 1)
except Exception:
    sys.exit(1)
EOF
}

wait_ready() {
    local name="$1" url="$2" logf="$STATE/$1.log" deadline=$((SECONDS + WAIT_SECS))
    while (( SECONDS < deadline )); do
        if http_ok "$url"; then log "$name ready ($url)"; return 0; fi
        if ! pid_alive "$name"; then
            echo "---- last lines of $logf ----" >&2; tail -n 20 "$logf" >&2 || true
            die "$name exited during startup; see $logf"
        fi
        sleep 0.5
    done
    echo "---- last lines of $logf ----" >&2; tail -n 20 "$logf" >&2 || true
    die "$name did not answer $url within ${WAIT_SECS}s; see $logf"
}

start_minio() {
    if pid_alive minio; then log "minio already running (pid $(cat "$STATE/minio.pid"))"; return 0; fi
    local bin; bin="$(find_bin minio)" || die "minio binary not found (go install github.com/minio/minio@...)"
    port_open "$MINIO_PORT" && die "port $MINIO_PORT is already in use by a process this script did not start"
    port_open "$MINIO_CONSOLE_PORT" && die "port $MINIO_CONSOLE_PORT is already in use by a process this script did not start"
    rm -rf "$STATE/minio-data"; mkdir -p "$STATE/minio-data"
    MINIO_ROOT_USER="$MINIO_USER" MINIO_ROOT_PASSWORD="$MINIO_PASSWORD" \
    MINIO_BROWSER=off MINIO_UPDATE=off \
        nohup "$bin" server "$STATE/minio-data" --address "$MINIO_ADDR" --console-address "$MINIO_CONSOLE" \
        >"$STATE/minio.log" 2>&1 </dev/null &
    echo $! >"$STATE/minio.pid"
    wait_ready minio "http://$MINIO_ADDR/minio/health/live"
}

start_gcs() {
    if pid_alive fake-gcs-server; then log "fake-gcs-server already running (pid $(cat "$STATE/fake-gcs-server.pid"))"; return 0; fi
    local bin; bin="$(find_bin fake-gcs-server)" || die "fake-gcs-server binary not found (go install github.com/fsouza/fake-gcs-server@...)"
    port_open "$GCS_PORT" && die "port $GCS_PORT is already in use by a process this script did not start"
    nohup "$bin" -scheme http -host "$GCS_HOST" -port "$GCS_PORT" -public-host "$GCS_HOST:$GCS_PORT" \
        -backend memory -log-level warn \
        >"$STATE/fake-gcs-server.log" 2>&1 </dev/null &
    echo $! >"$STATE/fake-gcs-server.pid"
    wait_ready fake-gcs-server "http://$GCS_HOST:$GCS_PORT/storage/v1/b?project=test"
}

stop_one() {
    local name="$1" pidf="$STATE/$1.pid" pid i
    if ! pid_alive "$name"; then rm -f "$pidf"; return 0; fi
    pid="$(cat "$pidf")"
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pidf"
    log "stopped $name (pid $pid)"
}

status_one() {
    if pid_alive "$1"; then echo "$1: running (pid $(cat "$STATE/$1.pid")), log $STATE/$1.log"
    else echo "$1: stopped"; return 1; fi
}

cmd="${1:-}"
case "$cmd" in
    start)
        mkdir -p "$STATE"
        # if one of them fails to come up, do not leave the other one behind
        trap 'rc=$?; if [ $rc -ne 0 ]; then stop_one minio; stop_one fake-gcs-server; fi' EXIT
        start_gcs
        start_minio
        ;;
    stop)
        stop_one minio
        stop_one fake-gcs-server
        ;;
    status)
        rc=0
        status_one minio || rc=1
        status_one fake-gcs-server || rc=1
        exit $rc
        ;;
    *)
        echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
