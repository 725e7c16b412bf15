"""`bucketfs mount --notify minio`: other clients' changes reach a mount through MinIO's
bucket notifications, with no LIST or HEAD spent on freshness, and a source that stops is
reported (docs/SEMANTICS.md, "Freshness from store events").

The MinIO built for these tests holds its notification stream in a buffer of a few KB (its
listen handler's writer drops Flush), so events arrive in bursts of about five: the tests
make enough events for each burst and wait seconds, not the sub-second a flushing server
gives. What they assert does not depend on that."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import seed
from conftest import mount, read_file, run_cli, unmount, upstream_of, wait_until, write_file

WAIT = 20  # seconds for a burst of events to arrive (see the module doc)


def status(mp: str) -> dict:
    p = run_cli(["status", "--json", mp])
    assert p.returncode == 0, p.err
    return json.loads(p.stdout)


def notify_mount(bucket: str, endpoint: str = seed.S3_ENDPOINT, ttl: str = "3600") -> str:
    mp = mount([seed.mount_url("s3", bucket), "--endpoint", endpoint, "--notify", "minio", "--metadata-ttl", ttl])
    assert wait_until(lambda: status(mp)["notify_up"], 10), status(mp)
    return mp


def flush_events(bucket: str, tag: str, n: int = 6) -> None:
    """Changes elsewhere in the bucket, so MinIO's buffered stream delivers what came before."""
    for i in range(n):
        seed.put("s3", bucket, f"zz-flush/{tag}-{i}", b"x")


def test_another_clients_changes_reach_a_watching_mount_with_no_request(s3_bucket):
    seed.put("s3", s3_bucket.name, "old.txt", b"old")
    watcher = notify_mount(s3_bucket.name)
    writer = mount([seed.mount_url("s3", s3_bucket.name), "--endpoint", seed.S3_ENDPOINT])
    try:
        assert sorted(os.listdir(watcher)) == ["old.txt"]
        assert os.stat(os.path.join(watcher, "old.txt")).st_size == 3
        before = status(watcher)["requests"]

        # Created through another mount and by a plain S3 client.
        for i in range(4):
            write_file(os.path.join(writer, f"m{i}.txt"), b"m" * (i + 1))
        seed.put("s3", s3_bucket.name, "boto.txt", b"from boto3")
        flush_events(s3_bucket.name, "a")
        want = {"old.txt", "boto.txt", "zz-flush"} | {f"m{i}.txt" for i in range(4)}
        assert wait_until(lambda: set(os.listdir(watcher)) == want, WAIT), sorted(os.listdir(watcher))
        for i in range(4):
            assert os.stat(os.path.join(watcher, f"m{i}.txt")).st_size == i + 1

        # Replaced, and removed.
        seed.put("s3", s3_bucket.name, "old.txt", b"replaced, longer")
        seed.delete("s3", s3_bucket.name, "boto.txt")
        flush_events(s3_bucket.name, "b")
        assert wait_until(lambda: not os.path.exists(os.path.join(watcher, "boto.txt")), WAIT)
        assert wait_until(lambda: os.stat(os.path.join(watcher, "old.txt")).st_size == 16, WAIT)

        st = status(watcher)
        assert st["requests"] == before, f"{st['requests'] - before} store requests for freshness"
        assert st["notify_applied"] >= 8, st
        # The bytes are the new version's (this read is a GET: data, not freshness).
        assert read_file(os.path.join(watcher, "old.txt")) == b"replaced, longer"
        text = run_cli(["status", watcher]).out
        assert "store events:     minio, flowing" in text, text
    finally:
        unmount(writer)
        unmount(watcher)


def test_own_changes_told_late_never_undo_newer_ones(s3_bucket):
    mp = notify_mount(s3_bucket.name)
    try:
        path = os.path.join(mp, "x.bin")
        versions = [bytes([v]) * (1000 * v) for v in range(1, 5)]
        for data in versions:  # each upload's event arrives after the next upload
            write_file(path, data)
        write_file(os.path.join(mp, "gone.txt"), b"soon gone")
        os.unlink(os.path.join(mp, "gone.txt"))
        flush_events(s3_bucket.name, "own")
        # The flush keys' events come after the mount's own in the stream: once they show,
        # every own event was handled.
        assert wait_until(lambda: "zz-flush" in os.listdir(mp), WAIT), status(mp)
        print("events:", {k: v for k, v in status(mp).items() if k.startswith("notify")})
        assert os.stat(path).st_size == len(versions[-1])
        assert read_file(path) == versions[-1]
        assert not os.path.exists(os.path.join(mp, "gone.txt"))
        assert "gone.txt" not in os.listdir(mp)
    finally:
        unmount(mp)


def test_a_source_that_stops_is_reported_and_recovers(s3_bucket, toxiproxy):
    proxy = toxiproxy.proxy(upstream_of("s3"))
    mp = notify_mount(s3_bucket.name, endpoint=proxy.endpoint, ttl="2")
    try:
        proxy.set_enabled(False)  # the event stream's connection is cut
        assert wait_until(lambda: not status(mp)["notify_up"], 15), status(mp)
        st = status(mp)
        assert st["notify_down_reason"], st
        assert "DOWN" in run_cli(["status", mp]).out
        proxy.set_enabled(True)
        assert wait_until(lambda: status(mp)["notify_up"], 30), status(mp)
        assert status(mp)["notify_downs"] >= 1
        # Flowing again: a change is told.
        seed.put("s3", s3_bucket.name, "after.txt", b"after the break")
        flush_events(s3_bucket.name, "c")
        assert wait_until(lambda: os.path.exists(os.path.join(mp, "after.txt")), WAIT)
    finally:
        unmount(mp)
        proxy.delete()


def test_an_unknown_source_is_refused_before_mounting(s3_bucket):
    mp_args = [seed.mount_url("s3", s3_bucket.name), "--endpoint", seed.S3_ENDPOINT, "--notify", "kafka://x"]
    from conftest import new_mountpoint
    target = new_mountpoint()
    p = run_cli(["mount", mp_args[0], target] + mp_args[1:])
    assert p.returncode != 0
    assert "unknown source" in p.err and "minio" in p.err, p.err


def test_a_flood_of_events_leaves_the_mount_answering_and_current(s3_bucket):
    """Another client rewrites and fills a tree watched by a mount (800 changes from 8
    threads, as a fleet would) while a user lists and stats it: every call answers with no
    errno but ENOENT for a name removed meanwhile, and once the events are through the
    mount shows what the bucket holds, sizes included (notices past the kernel-notice
    queue are dropped and counted; the kernel's entries expire within 1 s)."""
    dirs = [f"d{i:02d}" for i in range(20)]
    for d in dirs:
        for j in range(10):
            seed.put("s3", s3_bucket.name, f"{d}/f{j}.bin", b"v1")
    # A TTL as a floor: MinIO drops events for a listener that falls behind, unannounced.
    mp = notify_mount(s3_bucket.name, ttl="10")
    stop = threading.Event()
    trouble: list[str] = []
    slowest = [0.0]

    def user():
        while not stop.is_set():
            for d in dirs:
                t0 = time.monotonic()
                try:
                    for name in os.listdir(os.path.join(mp, d)):
                        os.stat(os.path.join(mp, d, name))
                except OSError as e:
                    if e.errno != errno.ENOENT:
                        trouble.append(f"{d}: {e!r}")
                slowest[0] = max(slowest[0], time.monotonic() - t0)

    s3 = seed.s3_client()

    def change(i: int) -> None:
        d = dirs[i % len(dirs)]
        if i < 200:  # every first file rewritten, longer
            s3.put_object(Bucket=s3_bucket.name, Key=f"{d}/f{i // len(dirs)}.bin", Body=b"v2" * (i + 1))
        elif i < 240:  # some removed
            s3.delete_object(Bucket=s3_bucket.name, Key=f"{d}/f{(i - 200) // len(dirs)}.bin")
        else:  # and many made
            s3.put_object(Bucket=s3_bucket.name, Key=f"{d}/new{i}.bin", Body=b"n" * (i % 97))

    try:
        for d in dirs:  # the kernel and the mount hold every entry
            for name in os.listdir(os.path.join(mp, d)):
                os.stat(os.path.join(mp, d, name))
        readers = [threading.Thread(target=user, daemon=True) for _ in range(2)]
        for r in readers:
            r.start()
        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(change, range(800)))
        print(f"flood made in {time.monotonic() - t0:.1f}s")
        flush_events(s3_bucket.name, "flood")
        stop.set()
        for r in readers:
            r.join(120)
            assert not r.is_alive(), "a lister is stuck in the mount"
        assert not trouble, trouble[:5]

        want = {}
        for o in (p for page in s3.get_paginator("list_objects_v2").paginate(Bucket=s3_bucket.name)
                  for p in page.get("Contents", [])):
            if not o["Key"].startswith("zz-flush/"):
                want[o["Key"]] = o["Size"]

        def seen() -> dict:
            got = {}
            for d in dirs:
                for name in os.listdir(os.path.join(mp, d)):
                    with contextlib.suppress(FileNotFoundError):
                        got[f"{d}/{name}"] = os.stat(os.path.join(mp, d, name)).st_size
            return got

        t0 = time.monotonic()
        assert wait_until(lambda: seen() == want, 90), \
            sorted(set(seen().items()) ^ set(want.items()))[:10]
        st = status(mp)
        assert st["notify_up"], st
        print(f"converged in {time.monotonic() - t0:.1f}s")
        print(f"flood: slowest listing pass {slowest[0]:.1f}s; events:",
              {k: v for k, v in st.items() if k.startswith("notify")})
    finally:
        stop.set()
        unmount(mp)
