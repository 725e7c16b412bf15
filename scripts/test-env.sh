#!/usr/bin/env bash
# Start / stop / report the local object servers the tests run against.
#
#   scripts/test-env.sh start    # MinIO on 127.0.0.1:9000 (console :9001), fake-gcs-server on :4443,
#                                # toxiproxy (API 127.0.0.1:8474; proxies :29100 -> MinIO, :24100 -> GCS),
#                                # the Drive API emulator scripts/drive_emulator.py on :4700
#   scripts/test-env.sh stop     # kills exactly the processes `start` launched (pid files)
#   scripts/test-env.sh status
#
# toxiproxy (fault injection for tests/test_faults.py) is installed with `go install` if
# missing. Its ports can be moved with BUCKETFS_TEST_TOXI_PORT, BUCKETFS_TEST_TOXI_S3_PORT and
# BUCKETFS_TEST_TOXI_GCS_PORT (e.g. when another toxiproxy already holds them);
# BUCKETFS_TEST_TOXIPROXY=0 skips it.
# Ports can be moved (e.g. when another checkout's servers already hold the defaults):
#   BUCKETFS_TEST_MINIO_PORT (9000), BUCKETFS_TEST_MINIO_CONSOLE_PORT (9001), BUCKETFS_TEST_GCS_PORT (4443),
#   BUCKETFS_TEST_DRIVE_PORT (4700)
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
# A static KMS key (name:base64 of 32 bytes) so MinIO does SSE-S3 and SSE-KMS (key ID
# bucketfs-test-key) for tests/test_sse.py. A fixed, public test key: nothing is secret here.
# Objects are encrypted only when a request asks (no auto-encryption), so other tests see
# plain objects as before.
MINIO_KMS_KEY_NAME="bucketfs-test-key"
MINIO_KMS_KEY="$MINIO_KMS_KEY_NAME:YnVja2V0ZnMtdGVzdC1vbmx5LWttcy1rZXktMzJieXQ="
GCS_HOST="127.0.0.1"
GCS_PORT="${BUCKETFS_TEST_GCS_PORT:-4443}"
DRIVE_PORT="${BUCKETFS_TEST_DRIVE_PORT:-4700}"
# The emulator's OAuth client; scripts/test hands the same values to bucketfs.
DRIVE_CLIENT_ID="${BUCKETFS_GDRIVE_CLIENT_ID:-emu-client}"
DRIVE_CLIENT_SECRET="${BUCKETFS_GDRIVE_CLIENT_SECRET:-emu-secret}"
DRIVE_REFRESH_TOKEN="${BUCKETFS_GDRIVE_REFRESH_TOKEN:-emu-refresh}"
TOXI_PKG="github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0"
TOXI_PORT="${BUCKETFS_TEST_TOXI_PORT:-8474}"
TOXI_S3_PORT="${BUCKETFS_TEST_TOXI_S3_PORT:-29100}"
TOXI_GCS_PORT="${BUCKETFS_TEST_TOXI_GCS_PORT:-24100}"

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
    # the Drive emulator is a Python script: match its command line instead
    if [ "$name" = drive-emulator ]; then tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q drive_emulator.py; return; fi
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
    MINIO_BROWSER=off MINIO_UPDATE=off MINIO_KMS_SECRET_KEY="$MINIO_KMS_KEY" \
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

start_drive() {
    if pid_alive drive-emulator; then log "drive emulator already running (pid $(cat "$STATE/drive-emulator.pid"))"; return 0; fi
    port_open "$DRIVE_PORT" && die "port $DRIVE_PORT is already in use by a process this script did not start (move it with BUCKETFS_TEST_DRIVE_PORT)"
    nohup python3 "$ROOT/scripts/drive_emulator.py" --port "$DRIVE_PORT" --client-id "$DRIVE_CLIENT_ID" \
        --client-secret "$DRIVE_CLIENT_SECRET" --refresh-token "$DRIVE_REFRESH_TOKEN" \
        >"$STATE/drive-emulator.log" 2>&1 </dev/null &
    echo $! >"$STATE/drive-emulator.pid"
    wait_ready drive-emulator "http://127.0.0.1:$DRIVE_PORT/_control/stats"
}

# ---------------------------------------------------------------- toxiproxy
# `go install .../toxiproxy/v2/cmd/server` names its binary `server`; only accept a `server`
# that says it is toxiproxy.
find_toxiproxy() {
    local c dir
    command -v toxiproxy-server >/dev/null 2>&1 && { command -v toxiproxy-server; return 0; }
    for dir in "${GOBIN:-}" "$(go env GOPATH 2>/dev/null || true)/bin" "$HOME/go/bin"; do
        [ -n "$dir" ] || continue
        for c in toxiproxy-server server; do
            if [ -x "$dir/$c" ] && "$dir/$c" -version 2>&1 | grep -qi toxiproxy; then echo "$dir/$c"; return 0; fi
        done
    done
    return 1
}

toxi_alive() {
    local pidf="$STATE/toxiproxy.pid" pid exe
    [ -f "$pidf" ] || return 1
    pid="$(cat "$pidf" 2>/dev/null || true)"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    # guard against pid reuse: still the binary we launched
    exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
    [ "${exe% (deleted)}" = "$(cat "$STATE/toxiproxy.exe" 2>/dev/null)" ]
}

start_toxiproxy() {
    [ "${BUCKETFS_TEST_TOXIPROXY:-1}" = "0" ] && { log "toxiproxy skipped (BUCKETFS_TEST_TOXIPROXY=0)"; return 0; }
    if toxi_alive; then log "toxiproxy already running (pid $(cat "$STATE/toxiproxy.pid"))"; return 0; fi
    local bin p pid deadline
    if ! bin="$(find_toxiproxy)"; then
        log "go install $TOXI_PKG"
        GOBIN="${GOBIN:-$HOME/go/bin}" go install "$TOXI_PKG" >"$STATE/go-install-toxiproxy.log" 2>&1 \
            || { tail -n 20 "$STATE/go-install-toxiproxy.log" >&2; die "go install $TOXI_PKG failed"; }
        bin="$(find_toxiproxy)" || die "toxiproxy server binary not found after go install"
    fi
    for p in "$TOXI_PORT" "$TOXI_S3_PORT" "$TOXI_GCS_PORT"; do
        port_open "$p" && die "port $p is already in use by a process this script did not start (move it with BUCKETFS_TEST_TOXI_PORT / _S3_PORT / _GCS_PORT)"
    done
    printf '[{"name": "minio", "listen": "127.0.0.1:%s", "upstream": "%s", "enabled": true},\n {"name": "gcs", "listen": "127.0.0.1:%s", "upstream": "%s:%s", "enabled": true}]\n' \
        "$TOXI_S3_PORT" "$MINIO_ADDR" "$TOXI_GCS_PORT" "$GCS_HOST" "$GCS_PORT" >"$STATE/toxiproxy.json"
    nohup "$bin" -host 127.0.0.1 -port "$TOXI_PORT" -config "$STATE/toxiproxy.json" \
        >"$STATE/toxiproxy.log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$STATE/toxiproxy.pid"
    readlink -f "$bin" >"$STATE/toxiproxy.exe"
    deadline=$((SECONDS + WAIT_SECS))
    while (( SECONDS < deadline )); do
        if http_ok "http://127.0.0.1:$TOXI_PORT/version" && port_open "$TOXI_S3_PORT" && port_open "$TOXI_GCS_PORT"; then
            log "toxiproxy ready (api 127.0.0.1:$TOXI_PORT; 127.0.0.1:$TOXI_S3_PORT -> minio, 127.0.0.1:$TOXI_GCS_PORT -> gcs)"
            return 0
        fi
        if ! toxi_alive; then
            tail -n 20 "$STATE/toxiproxy.log" >&2 || true
            die "toxiproxy exited during startup; see $STATE/toxiproxy.log"
        fi
        sleep 0.3
    done
    tail -n 20 "$STATE/toxiproxy.log" >&2 || true
    die "toxiproxy did not come up within ${WAIT_SECS}s; see $STATE/toxiproxy.log"
}

stop_toxiproxy() {
    local pidf="$STATE/toxiproxy.pid" pid i
    if ! toxi_alive; then rm -f "$pidf" "$STATE/toxiproxy.exe"; return 0; fi
    pid="$(cat "$pidf")"
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    rm -f "$pidf" "$STATE/toxiproxy.exe"
    log "stopped toxiproxy (pid $pid)"
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
        trap 'rc=$?; if [ $rc -ne 0 ]; then stop_one minio; stop_one fake-gcs-server; stop_one drive-emulator; stop_toxiproxy; fi' EXIT
        start_gcs
        start_drive
        start_minio
        start_toxiproxy
        ;;
    stop)
        stop_toxiproxy
        stop_one minio
        stop_one fake-gcs-server
        stop_one drive-emulator
        ;;
    status)
        rc=0
        status_one minio || rc=1
        status_one fake-gcs-server || rc=1
        status_one drive-emulator || rc=1
        if [ "${BUCKETFS_TEST_TOXIPROXY:-1}" != "0" ]; then
            if toxi_alive; then echo "toxiproxy: running (pid $(cat "$STATE/toxiproxy.pid")), api 127.0.0.1:$TOXI_PORT, log $STATE/toxiproxy.log"
            else echo "toxiproxy: stopped"; rc=1; fi
        fi
        exit $rc
        ;;
    *)
        echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
