"""Uploads that send only what changed (issue 43), through the kernel, with the bytes sent
to the store counted outside bucketfs by a proxy in front of MinIO / the GCS emulator.

- An appender that fsyncs (a log, TensorBoard events): each fsync sends what was appended
  since the last, and every fsync is durable: another client reading the object right
  after it sees every byte written before it.
- A one-byte edit in the middle of a big file (S3: `UploadPartCopy` of the rest).
- A file replaced by another client between two fsyncs: the next upload is whole, never a
  mix of the two versions.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import threading
import time

import pytest

import seed
from conftest import Bucket, mount, mounted, require_bin, require_store, run_cli, unmount
from hangkit import kill_daemon, remount, sync
from proxykit import HttpProxy

MIB = 1024 * 1024


def endpoint(store: str) -> str:
    return seed.S3_ENDPOINT if store == "s3" else seed.GCS_ENDPOINT


def mount_args(store: str, b: Bucket, proxy: HttpProxy, *extra: str) -> list[str]:
    args = [seed.mount_url(store, b.name), "--endpoint", proxy.url, "--disk-cache-mib", "0", *extra]
    return args + (["--anonymous"] if store == "gcs" else [])


# Each fsync has the store copy the 64 MiB already there: 40 of them make the point (100
# took 45 s per store here).
APPENDS = 40


@pytest.mark.parametrize("store", ["s3", "gcs"])
def test_an_appender_that_fsyncs_sends_what_it_appended_and_each_fsync_is_durable(store):
    require_store(store)
    require_bin()
    b = Bucket(store)
    rng = random.Random(43)
    base = rng.randbytes(64 * MIB)
    proxy = HttpProxy(endpoint(store))
    try:
        with mounted(mount_args(store, b, proxy)) as mp:
            path = os.path.join(mp, "events.log")
            fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
            try:
                os.write(fd, base)
                os.fsync(fd)
                assert seed.get(store, b.name, "events.log") == base
                before = proxy.sent
                want = bytearray(base)
                for i in range(APPENDS):
                    chunk = rng.randbytes(16 * 1024)
                    assert os.write(fd, chunk) == len(chunk)
                    want += chunk
                    os.fsync(fd)
                    if i % 10 == 9:
                        got = seed.get(store, b.name, "events.log")
                        assert len(got) == len(want), f"fsync {i}: the object has {len(got)} bytes"
                        assert got == bytes(want), f"fsync {i}: the object is not what was written"
                sent = proxy.sent - before
            finally:
                os.close(fd)
            p = run_cli(["status", "--json", mp])
            assert p.returncode == 0, p.err
            kept = json.loads(p.out)["bytes_copied"]
            assert kept >= APPENDS * 64 * MIB, f"status counts {kept} bytes kept in the store"
        # 640 KiB appended; whole uploads would have sent 2.7 GB.
        assert sent <= 12 * MIB, f"the appends sent {sent / MIB:.1f} MiB"
        assert seed.get(store, b.name, "events.log") == bytes(want)
        parts = [k for k in seed.list_keys(store, b.name, ".bucketfs-parts/")]
        assert not parts, f"temporary objects left: {parts[:5]}"
    finally:
        proxy.close()
        b.cleanup()


@pytest.mark.parametrize("cached", [False, True], ids=["fetched", "from-disk-cache"])
def test_one_byte_changed_in_the_middle_of_a_big_file_sends_one_part(cached):
    """Opened for write as fetched from the store, or taken over from the disk cache's copy
    of the version (after a read; no GET at the open): either way one part goes up."""
    store = "s3"
    require_store(store)
    require_bin()
    b = Bucket(store)
    data = bytearray(os.urandom(256 * MIB))
    b.put("disk.img", bytes(data))
    proxy = HttpProxy(endpoint(store))
    args = mount_args(store, b, proxy)
    if cached:
        args = [a for a in args if a not in ("--disk-cache-mib", "0")]
    try:
        with mounted(args) as mp:
            path = os.path.join(mp, "disk.img")
            if cached:
                with open(path, "rb") as f:
                    assert hashlib.md5(f.read()).hexdigest() == hashlib.md5(data).hexdigest()
                time.sleep(2)  # the whole-object copy is built as the reader closes
            proxy.take()
            before = proxy.sent
            with open(path, "r+b") as f:
                f.seek(128 * MIB + 5)
                f.write(b"\xff")
            data[128 * MIB + 5] = 0xFF
            sent = proxy.sent - before
            gets = [p for m, p, _ in proxy.take() if m == "GET" and p.startswith(f"/{b.name}/disk.img")]
        assert sent <= 16 * MIB, f"a one-byte edit sent {sent / MIB:.1f} MiB"
        if cached:
            assert not gets, f"the open fetched the file again: {gets[:3]}"
        got = seed.get(store, b.name, "disk.img")
        assert hashlib.md5(got).hexdigest() == hashlib.md5(data).hexdigest(), "the object is not the edited file"
    finally:
        proxy.close()
        b.cleanup()


@pytest.mark.parametrize("store", ["s3", "gcs"])
def test_a_version_replaced_by_another_client_is_never_patched(store):
    require_store(store)
    require_bin()
    b = Bucket(store)
    rng = random.Random(5)
    mine = rng.randbytes(8 * MIB)
    proxy = HttpProxy(endpoint(store))
    try:
        with mounted(mount_args(store, b, proxy)) as mp:
            fd = os.open(os.path.join(mp, "f"), os.O_CREAT | os.O_WRONLY, 0o644)
            try:
                os.write(fd, mine)
                os.fsync(fd)
                b.put("f", rng.randbytes(8 * MIB))  # another client's version
                os.write(fd, b"appended")
                os.fsync(fd)
            finally:
                os.close(fd)
        assert seed.get(store, b.name, "f") == mine + b"appended", "the last upload wins, whole"
    finally:
        proxy.close()
        b.cleanup()


def appender(path: str, want: bytearray, attempted: list[int], done: list[int], rng: random.Random,
             stop: threading.Event) -> None:
    """Append 16 KiB and fsync until the mount goes away (or `stop`), noting the length each
    fsync was asked for and each one that returned."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError:
        return
    try:
        while not stop.is_set():
            chunk = rng.randbytes(16 * 1024)
            os.write(fd, chunk)
            want += chunk
            attempted.append(len(want))
            os.fsync(fd)
            done.append(len(want))
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


@pytest.mark.parametrize("store", ["s3", "gcs"])
def test_kill_9_during_appends_leaves_a_whole_version_and_no_temporary_objects(store, tmp_path):
    """An appender fsyncing a 24 MiB file while the daemon is killed at random moments: the
    object is always one whole fsync'd (or in-flight) version, never less than the last
    fsync that returned; after the remount and `bucketfs sync`, no temporary object of an
    append is left in the bucket."""
    require_store(store)
    require_bin()
    b = Bucket(store)
    rng = random.Random(99)
    args = [seed.mount_url(store, b.name), *seed.mount_extra_args(store), "--disk-cache-mib", "0",
            "--staging-dir", str(tmp_path / "staging")]
    mp = mount(args)
    path = os.path.join(mp, "train.log")
    want = bytearray(rng.randbytes(24 * MIB))
    try:
        with open(path, "wb") as f:
            f.write(want)
            f.flush()
            os.fsync(f.fileno())
        for rnd in range(6):
            attempted: list[int] = []
            done: list[int] = [len(want)]
            stop = threading.Event()
            t = threading.Thread(target=appender, args=(path, want, attempted, done, rng, stop))
            t.start()
            time.sleep(rng.uniform(0.05, 0.6))
            kill_daemon(mp)
            stop.set()
            t.join(60)
            assert not t.is_alive(), "the writer hung after the kill"
            got = seed.get(store, b.name, "train.log")
            assert got == bytes(want[:len(got)]), f"round {rnd}: the object is not a version that was written"
            assert len(got) >= done[-1], f"round {rnd}: {len(got)} bytes, less than the fsync that returned"
            assert len(got) in set(attempted) | set(done), f"round {rnd}: {len(got)} bytes, no fsync's length"
            remount(mp, args)
            r = sync(mp)
            assert r.returncode == 0, f"round {rnd}: sync: {r.err}"
            parts = seed.list_keys(store, b.name, ".bucketfs-parts/")
            assert not parts, f"round {rnd}: temporary objects left: {parts[:5]}"
            got = seed.get(store, b.name, "train.log")
            assert got == bytes(want[:len(got)]) and len(got) >= done[-1], f"round {rnd}: after recovery"
            assert os.path.getsize(path) == len(got), f"round {rnd}: the mount shows another length"
            del want[len(got):]
        print(f"{store}: the file ended at {len(want) / MIB:.2f} MiB")
    finally:
        unmount(mp)
        b.cleanup()
