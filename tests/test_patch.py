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

import hashlib
import os
import random

import pytest

import seed
from conftest import Bucket, mounted, require_bin, require_store
from proxykit import HttpProxy

MIB = 1024 * 1024


def endpoint(store: str) -> str:
    return seed.S3_ENDPOINT if store == "s3" else seed.GCS_ENDPOINT


def mount_args(store: str, b: Bucket, proxy: HttpProxy, *extra: str) -> list[str]:
    args = [seed.mount_url(store, b.name), "--endpoint", proxy.url, "--disk-cache-mib", "0", *extra]
    return args + (["--anonymous"] if store == "gcs" else [])


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
                for i in range(100):
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
        # 1.6 MiB appended; whole uploads would have sent 6.5 GB.
        assert sent <= 12 * MIB, f"the appends sent {sent / MIB:.1f} MiB"
        assert seed.get(store, b.name, "events.log") == bytes(want)
        parts = [k for k in seed.list_keys(store, b.name, ".bucketfs-parts/")]
        assert not parts, f"temporary objects left: {parts[:5]}"
    finally:
        proxy.close()
        b.cleanup()


def test_one_byte_changed_in_the_middle_of_a_big_file_sends_one_part():
    store = "s3"
    require_store(store)
    require_bin()
    b = Bucket(store)
    data = bytearray(os.urandom(256 * MIB))
    b.put("disk.img", bytes(data))
    proxy = HttpProxy(endpoint(store))
    try:
        with mounted(mount_args(store, b, proxy)) as mp:
            before = proxy.sent
            with open(os.path.join(mp, "disk.img"), "r+b") as f:
                f.seek(128 * MIB + 5)
                f.write(b"\xff")
            data[128 * MIB + 5] = 0xFF
            sent = proxy.sent - before
        assert sent <= 16 * MIB, f"a one-byte edit sent {sent / MIB:.1f} MiB"
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
