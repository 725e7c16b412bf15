#!/usr/bin/env bash
# 1 GB up and down with `bucketfs cp` on MinIO and the GCS emulator, and with rclone on
# MinIO in the same run for a ratio (absolute MB/s drift on shared machines).
#
#   scripts/test-env.sh start; scripts/bench-cp.sh [BYTES] [ROUNDS]
#
# Uses the same variables as scripts/test (BUCKETFS_TEST_S3_ENDPOINT...), bucket "bench".
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BYTES="${1:-1000000000}"
ROUNDS="${2:-2}"
BIN="${BUCKETFS_BIN:-$ROOT/target/release/bucketfs}"
S3="${BUCKETFS_TEST_S3_ENDPOINT:-http://127.0.0.1:9000}"
GCS="${BUCKETFS_TEST_GCS_ENDPOINT:-http://127.0.0.1:4443}"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-bucketfs-test}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-bucketfs-test-secret}"
DIR="$(mktemp -d)"
trap 'rm -rf "$DIR"' EXIT
python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import seed; [seed.make_bucket(s, "bench") for s in ("s3", "gcs")]' "$ROOT/scripts"
head -c "$BYTES" /dev/urandom >"$DIR/src"

rate() {  # rate LABEL CMD... : run CMD, print MB/s
    local t0 t1; t0=$(date +%s.%N); "${@:2}" >/dev/null; t1=$(date +%s.%N)
    python3 -c "import sys; b,t=int(sys.argv[1]),float(sys.argv[3])-float(sys.argv[2]); print(f'{sys.argv[4]:28s} {b/1e6/t:7.1f} MB/s ({t:.1f} s)')" "$BYTES" "$t0" "$t1" "$1"
}
RCLONE="$(command -v rclone || echo "$HOME/go/bin/rclone")"
export RCLONE_CONFIG_M_TYPE=s3 RCLONE_CONFIG_M_PROVIDER=Minio RCLONE_CONFIG_M_ENDPOINT="$S3" \
    RCLONE_CONFIG_M_ACCESS_KEY_ID="$AWS_ACCESS_KEY_ID" RCLONE_CONFIG_M_SECRET_ACCESS_KEY="$AWS_SECRET_ACCESS_KEY"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; $BYTES bytes"
for r in $(seq 1 "$ROUNDS"); do
    rate "bucketfs cp s3 up" "$BIN" cp "$DIR/src" s3://bench/x --endpoint "$S3"
    rate "bucketfs cp s3 down" "$BIN" cp s3://bench/x "$DIR/dst" --endpoint "$S3"
    cmp -s "$DIR/src" "$DIR/dst" || { echo "s3: copy differs" >&2; exit 1; }
    if [ -x "$RCLONE" ]; then
        rate "rclone copyto s3 up" "$RCLONE" copyto --ignore-times "$DIR/src" m:bench/r --s3-upload-concurrency 8 --s3-chunk-size 16M
        rate "rclone copyto s3 down" "$RCLONE" copyto --ignore-times m:bench/r "$DIR/dst" --multi-thread-streams 8
    fi
    rate "bucketfs cp gcs up" "$BIN" cp "$DIR/src" gs://bench/x --endpoint "$GCS" --anonymous
    rate "bucketfs cp gcs down" "$BIN" cp gs://bench/x "$DIR/dst" --endpoint "$GCS" --anonymous
    cmp -s "$DIR/src" "$DIR/dst" || { echo "gcs: copy differs" >&2; exit 1; }
done
python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import seed; [seed.delete_bucket(s, "bench") for s in ("s3", "gcs")]' "$ROOT/scripts"
