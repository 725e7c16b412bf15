#!/usr/bin/env python3
"""What one cold read costs (issue "A cold read stores each byte once").

    bench/cold_read.py [--mib 1024] [--stores s3,gcs] [--bin target/release/bucketfs ...]
                       [--gcsfuse PATH] [--runs 2] [--flags '--max-prefetch-mib 16']

For each store and each system (every `--bin` given, and gcsfuse on the GCS emulator when
it is installed), mounts a fresh bucket holding one object of MIB MiB with default flags
(its own empty cache directory), drops the page cache, reads the object once with
`dd bs=1M`, then waits 10 s. Prints, per run: the read's MB/s; the file system process's
CPU (utime + stime from /proc/PID/stat) during the read and in the 10 s after, as s per GB;
its peak RSS (VmHWM); and the bytes its cache directory holds on disk (allocated blocks).
Then the second read after dropping the page cache again (bucketfs passes through to the
cached file), as MB/s, beside the same read from a local file (native). All systems in one run on the same server, so compare as ratios.
scripts/test-env.sh must be running.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import conftest as c  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--mib", type=int, default=1024)
ap.add_argument("--stores", default="s3,gcs")
ap.add_argument("--bin", action="append", help="a bucketfs binary (repeat to compare builds)")
ap.add_argument("--gcsfuse", default=shutil.which("gcsfuse") or os.path.expanduser("~/go/bin/gcsfuse"))
ap.add_argument("--runs", type=int, default=2)
ap.add_argument("--flags", default="", help="extra mount flags for bucketfs (one string)")
ap.add_argument("--after", type=float, default=10.0, help="seconds counted after the read")
a = ap.parse_args()
bins = a.bin or [c.BIN]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def hwm_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def disk_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for n in files:
            try:
                total += os.lstat(os.path.join(root, n)).st_blocks * 512
            except OSError:
                pass
    return total


def drop_caches():
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def dd(path: str) -> float:
    t = time.monotonic()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], check=True, capture_output=True)
    return a.mib * 1048576 / 1e6 / (time.monotonic() - t)


def mount_bucketfs(binary, b, cache):
    c.BIN = binary
    mp = c.mount(b.args() + ["--cache-dir", cache] + a.flags.split())
    return mp, c.daemon_pids(mp)[0], lambda: c.unmount(mp)


def mount_gcsfuse(b, cache):
    mp = c.new_mountpoint()
    env = dict(os.environ)
    subprocess.run([a.gcsfuse, "--custom-endpoint", "http://127.0.0.1:4443/storage/v1/", "--anonymous-access",
                    "--implicit-dirs", "--temp-dir", cache, b.name, mp], check=True, capture_output=True, env=env)
    pid = int(subprocess.run(["pgrep", "-n", "-f", f"gcsfuse.*{mp}"], capture_output=True, text=True).stdout.split()[0])
    return mp, pid, lambda: (subprocess.run(["fusermount3", "-u", mp]), c.force_unmount(mp))


def measure(name, mount, store):
    for run in range(a.runs):
        b = c.Bucket(store)
        b.put("obj", os.urandom(1 << 20) * a.mib)
        cache = tempfile.mkdtemp(prefix="coldread-", dir="/var/tmp")
        mp, pid, unmount = mount(b, cache)
        try:
            path = os.path.join(mp, "obj")
            os.stat(path)
            drop_caches()
            c0 = cpu_s(pid)
            rate = dd(path)
            c1 = cpu_s(pid)
            time.sleep(a.after)
            c2 = cpu_s(pid)
            gb = a.mib * 1048576 / 1e9
            held = disk_bytes(cache)
            drop_caches()
            again = dd(path)
            print(f"{store:4} {name:28} run {run + 1}: first {rate:7.1f} MB/s, CPU {(c1 - c0) / gb:5.2f} s/GB "
                  f"during + {(c2 - c1) / gb:5.2f} after = {(c2 - c0) / gb:5.2f} s/GB, peak RSS "
                  f"{hwm_mib(pid):6.1f} MiB, cache {held / (a.mib << 20):4.2f}x the object; "
                  f"dropped-cache read {again:7.1f} MB/s", flush=True)
        finally:
            unmount()
            shutil.rmtree(cache, ignore_errors=True)


def native():
    """The same read from a local file (the disk the caches live on), page cache dropped."""
    path = os.path.join(tempfile.mkdtemp(prefix="coldread-native-", dir="/var/tmp"), "obj")
    with open(path, "wb") as f:
        block = os.urandom(1 << 20)
        for _ in range(a.mib):
            f.write(block)
    try:
        for run in range(a.runs):
            drop_caches()
            print(f"disk native                          run {run + 1}: read {dd(path):7.1f} MB/s", flush=True)
    finally:
        shutil.rmtree(os.path.dirname(path))


native()
for store in a.stores.split(","):
    for binary in bins:
        measure(f"bucketfs {os.path.relpath(binary)}"[:28], lambda b, d, x=binary: mount_bucketfs(x, b, d), store)
    if store == "gcs" and a.gcsfuse and os.path.exists(a.gcsfuse):
        measure("gcsfuse", mount_gcsfuse, store)
