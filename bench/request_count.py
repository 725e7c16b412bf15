#!/usr/bin/env python3
"""Store requests of a developer's day on a mount, counted by bucketfs's own metrics.

    bench/request_count.py [--bin BIN] [--ttl SECS]

On a fresh MinIO bucket (scripts/test-env.sh running): 50 files of 4,107 bytes copied one
`cp` at a time; `tar -x` of 100 files in 4 directories; `git clone` of this repository
(from a bundle); `git status` right after, again after the TTL, and a second time within
it; `rm -rf`. Prints the requests by operation for each step (issue "One request per file").
"""
import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import conftest as c  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=c.BIN)
ap.add_argument("--ttl", default="1")
a = ap.parse_args()
c.BIN = a.bin
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
work = tempfile.mkdtemp(prefix="bucketfs-req-")
small = os.path.join(work, "small")
with open(small, "wb") as f:
    f.write(os.urandom(4107))
src = os.path.join(work, "src")
for i in range(100):
    os.makedirs(f"{src}/d{i % 4}", exist_ok=True)
    with open(f"{src}/d{i % 4}/f{i}", "wb") as f:
        f.write(os.urandom(4107))
subprocess.run(["tar", "-cf", f"{work}/t.tar", "-C", work, "src"], check=True)
subprocess.run(["git", "-C", REPO, "bundle", "create", f"{work}/repo.bundle", "HEAD"], check=True, capture_output=True)
tracked = int(subprocess.run(["git", "-C", REPO, "ls-files"], capture_output=True, text=True).stdout.count("\n"))

s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()
b = c.Bucket("s3")
mp = c.mount(b.args() + ["--metadata-ttl", a.ttl, "--metrics-addr", f"127.0.0.1:{port}"])


def counts():
    txt = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {m.group(1): int(float(m.group(2)))
            for m in re.finditer(r'^bucketfs_store_requests_total\{op="([a-z_]+)"\} (\S+)', txt, re.M)}


def step(name, fn, per=None):
    before = counts()
    t0 = time.monotonic()
    fn()
    dt = time.monotonic() - t0
    after = counts()
    diff = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    total = sum(diff.values())
    extra = f", {total / per:.2f} per file" if per else ""
    print(f"{name:<34} {total:>5} requests{extra} in {dt:.2f} s: {diff}")


sh = lambda cmd: lambda: subprocess.run(cmd, shell=True, check=True, cwd=mp, capture_output=True)  # noqa: E731
os.mkdir(os.path.join(mp, "cp"))
step("50 files, cp one by one", sh(f"for i in $(seq 50); do cp {small} cp/f$i; done"), 50)
step("tar -x of 100 files in 4 dirs", sh(f"tar -xf {work}/t.tar"), 100)
step(f"git clone ({tracked} tracked files)", sh(f"git clone -q {work}/repo.bundle repo"), tracked)
step("git status right after", sh("git -C repo status --porcelain"))
time.sleep(float(a.ttl) + 0.5)
step("git status after the TTL", sh("git -C repo status --porcelain"))
step("git status again within the TTL", sh("git -C repo status --porcelain"))
step("rm -rf", sh("rm -rf repo src cp"))
c.unmount(mp)
b.cleanup()
