#!/usr/bin/env python3
"""Peak memory of a mount under many writers and readers (issue "Never lose a byte", item 8).

    bench/memory_stress.py [--bin target/release/bucketfs] [--secs 60] [--writers 16] [--readers 8]

Mounts a fresh MinIO bucket (scripts/test-env.sh must be running) with default flags,
seeds 8 files of 48 MiB, then runs WRITERS threads that each write files of 48 MiB in
1 MiB writes and close them, and READERS threads that md5 the seeded files, for SECS
seconds. Prints the daemon's VmHWM (peak RSS) and the bytes moved; exit 0.
"""
import argparse
import hashlib
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import conftest as c  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=c.BIN)
ap.add_argument("--secs", type=float, default=60)
ap.add_argument("--writers", type=int, default=16)
ap.add_argument("--readers", type=int, default=8)
ap.add_argument("--size-mib", type=int, default=48)
a = ap.parse_args()
c.BIN = a.bin
b = c.Bucket("s3")
size = a.size_mib << 20
block = os.urandom(1 << 20)
for i in range(8):
    b.put(f"seed/{i}", block * a.size_mib)
mp = c.mount(b.args())
pid = c.daemon_pids(mp)[0]
stop = threading.Event()
moved = {"w": 0, "r": 0}
errors = []


def writer(i):
    n = 0
    try:
        while not stop.is_set():
            with open(os.path.join(mp, f"w{i}-{n % 2}"), "wb") as f:
                for _ in range(a.size_mib):
                    f.write(block)
            moved["w"] += size
            n += 1
    except OSError as e:
        errors.append(repr(e))


def reader(i):
    try:
        while not stop.is_set():
            h = hashlib.md5()
            with open(os.path.join(mp, "seed", str(i % 8)), "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            moved["r"] += size
    except OSError as e:
        errors.append(repr(e))


ths = [threading.Thread(target=writer, args=(i,)) for i in range(a.writers)]
ths += [threading.Thread(target=reader, args=(i,)) for i in range(a.readers)]
t0 = time.monotonic()
for t in ths:
    t.start()
stop.wait(a.secs)
stop.set()
for t in ths:
    t.join(300)
st = c.daemon_status(pid)
print(f"{a.bin}: {a.writers} writers + {a.readers} readers for {time.monotonic() - t0:.0f} s: "
      f"VmHWM {st['VmHWM'] // 1024} MiB; written {moved['w'] >> 20} MiB, read {moved['r'] >> 20} MiB; "
      f"errors {errors[:3]}")
c.unmount(mp)
b.cleanup()
