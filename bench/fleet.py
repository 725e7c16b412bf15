#!/usr/bin/env python3
"""A fleet of mounts of one bucket (issue "Fleets that see each other's changes at once").

    bench/fleet.py [--mounts 8] [--files 20] [--every 2] [--stores gcs,s3] [--ttl 1]

For each store, mounts the same bucket MOUNTS times, twice: with `--notify` and
`--metadata-ttl 3600` (gcs: Cloud Storage notifications through Pub/Sub, a subscription per
mount; s3: MinIO's own notification stream), and without it at `--metadata-ttl TTL` (the
default, 1 s). One writer (another client, straight to the store) creates FILES files, one
every EVERY seconds, in a directory every mount watches: a thread per mount lists that
directory every 50 ms, as a user or a job waiting for a file would. Prints, per store and
mode: the time from a file's upload until every mount shows it (median and worst over the
files) and the store requests per minute per mount while it runs (the watchers only list
and stat, so these are all LIST and HEAD).

gcs: a fake-gcs-server and Google's Pub/Sub fake of the script's own (as in
tests/test_notify_pubsub.py; scripts/test builds the fake). s3: the MinIO of
scripts/test-env.sh, which must be running. MinIO as built here sends its notification
stream in bursts of a few KB (its listen handler does not flush), so on s3 a file may wait
for the next events: the gcs row is the one that shows what the source allows.
"""
import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import conftest as c  # noqa: E402
import seed  # noqa: E402
import test_notify_pubsub as ps  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--mounts", type=int, default=8)
ap.add_argument("--files", type=int, default=20)
ap.add_argument("--every", type=float, default=2.0, help="seconds between two new files")
ap.add_argument("--stores", default="gcs,s3")
ap.add_argument("--ttl", type=float, default=1.0, help="--metadata-ttl of the mounts without --notify")
a = ap.parse_args()


class Watchers:
    """A thread per mount listing `dir` every 50 ms; when each mount first showed each name."""

    def __init__(self, dirs):
        self.dirs = dirs
        self.seen = [dict() for _ in dirs]
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.watch, args=(i,), daemon=True) for i in range(len(dirs))]
        for t in self.threads:
            t.start()

    def watch(self, i):
        while not self.stop.is_set():
            try:
                names = os.listdir(self.dirs[i])
            except OSError:
                names = []
            now = time.monotonic()
            for n in names:
                self.seen[i].setdefault(n, now)
            time.sleep(0.05)

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def run(store, mode, mount, put, bucket):
    """One fleet: mount, watch, write; the figures."""
    put("w/.keep", b"")
    mps = [mount(i) for i in range(a.mounts)]
    try:
        dirs = [os.path.join(mp, "w") for mp in mps]
        for d in dirs:
            os.listdir(d)
        if mode == "notify":
            time.sleep(ps.SETTLE)  # events from right after a source comes up are checked, not believed
        watchers = Watchers(dirs)
        before = [ps.status(mp)["requests"] for mp in mps]
        t0 = time.monotonic()
        uploaded = {}
        for n in range(a.files):
            name = f"f{n:03}"
            put(f"w/{name}", b"x" * 100)
            uploaded[name] = time.monotonic()
            time.sleep(a.every)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(all(n in s for n in uploaded) for s in watchers.seen):
            time.sleep(0.1)
        elapsed = time.monotonic() - t0
        watchers.close()
        reqs = [ps.status(mp)["requests"] - b for mp, b in zip(mps, before)]
        lags = []
        missing = 0
        for name, t in uploaded.items():
            times = [s.get(name) for s in watchers.seen]
            if None in times:
                missing += 1
                continue
            lags.append(max(times) - t)
        per_min = statistics.mean(reqs) * 60 / elapsed
        lag = f"median {statistics.median(lags):5.2f} s, worst {max(lags):5.2f} s" if lags else "never"
        print(f"{store:4} {mode:22} {a.mounts} mounts: all see a new file: {lag}"
              f"{f' ({missing} files never seen by all)' if missing else ''}; "
              f"{per_min:7.1f} store requests/min per mount", flush=True)
    finally:
        for mp in mps:
            c.unmount(mp)


def gcs():
    tmp = Path(tempfile.mkdtemp(prefix="fleet-"))
    ps.SUBS[:] = [f"m{i}" for i in range(a.mounts)]
    p = ps.PubSub(tmp)
    try:
        for mode in ("notify", f"ttl {a.ttl:g} s"):
            bucket = f"fleet-{mode.split()[0]}"
            p.make_bucket(bucket)
            sub = (lambda i: f"m{i}") if mode == "notify" else (lambda i: None)
            ttl = "3600" if mode == "notify" else f"{a.ttl:g}"
            run("gcs", mode, lambda i: p.mount(bucket, sub(i), settle=False, ttl=ttl),
                lambda k, d: p.put(bucket, k, d), bucket)
    finally:
        p.close()


def s3():
    for mode in ("notify", f"ttl {a.ttl:g} s"):
        b = c.Bucket("s3")
        flags = ["--endpoint", seed.S3_ENDPOINT]
        flags += ["--notify", "minio", "--metadata-ttl", "3600"] if mode == "notify" else ["--metadata-ttl", f"{a.ttl:g}"]

        def mount(i):
            mp = c.mount([seed.mount_url("s3", b.name)] + flags)
            if mode == "notify":
                assert c.wait_until(lambda: ps.status(mp)["notify_up"], 10)
            return mp

        try:
            run("s3", mode, mount, lambda k, d: seed.put("s3", b.name, k, d), b.name)
        finally:
            b.cleanup()


for s in a.stores.split(","):
    {"gcs": gcs, "s3": s3}[s]()
