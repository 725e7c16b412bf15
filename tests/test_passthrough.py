"""FUSE passthrough: files whole in the disk cache are read by the kernel directly.

Needs Linux 6.9+ and root (the mount says so in its log and status otherwise: these tests
skip then). Each checks the bytes, and the status counter of opens that passed through.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import random
import time

import pytest

from conftest import Bucket, md5, md5_file, require_bin, require_store, run_cli

MiB = 1024 * 1024
TTL = 1.0  # --metadata-ttl of these mounts


@pytest.fixture(params=["s3", "gcs"])
def pbucket(request):
    require_store(request.param)
    require_bin()
    b = Bucket(request.param)
    yield b
    b.cleanup()


def status(mp: str) -> dict:
    return json.loads(run_cli(["status", "--json", mp]).out)


def through(mp: str) -> int:
    return status(mp)["passthrough_opens"]


def mount(b: Bucket, tmp_path, mode: str = "on"):
    cache = str(tmp_path / "cache")
    return b.mounted(extra=["--cache-dir", cache, "--metadata-ttl", str(TTL), "--passthrough", mode])


def require_passthrough(mp: str) -> None:
    if not status(mp)["passthrough"]:
        pytest.skip("FUSE passthrough unavailable here (needs Linux 6.9+ and root; see the mount's log)")


def test_second_open_passes_through_with_the_same_bytes(pbucket, tmp_path):
    data = random.Random(27).randbytes(9 * MiB + 77)  # five blocks, the last one short
    pbucket.put_all({"p.bin": data})
    with mount(pbucket, tmp_path) as mp:
        require_passthrough(mp)
        path = os.path.join(mp, "p.bin")
        assert md5_file(path) == md5(data)
        assert through(mp) == 0, "nothing was on local disk at the first open"
        assert md5_file(path) == md5(data)
        assert through(mp) == 1, "the second open did not pass through"
        assert list((tmp_path / "cache").glob("*.w")), "no whole-object file in the cache"
        # Random reads and a mapping of a passthrough handle.
        fd = os.open(path, os.O_RDONLY)
        try:
            assert through(mp) == 2
            rng = random.Random(3)
            for _ in range(50):
                off, n = rng.randrange(len(data)), rng.choice([1, 4096, 100_000])
                assert os.pread(fd, n, off) == data[off:off + n], off
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
                assert m[5 * MiB:5 * MiB + 4096] == data[5 * MiB:5 * MiB + 4096]
            # A second reader of the same version shares the backing file.
            with open(path, "rb") as f:
                assert f.read() == data
            assert through(mp) == 3
            # Writing while the kernel passes reads through is refused, and changes nothing.
            with pytest.raises(OSError) as e:
                open(path, "r+b")
            assert e.value.errno == errno.EBUSY
        finally:
            os.close(fd)
        assert md5_file(path) == md5(data)
        # An ordinary open (for writing) held: readers go through bucketfs, as without.
        with open(path, "r+b") as w:
            n = through(mp)
            with open(path, "rb") as f:
                assert f.read() == data
            assert through(mp) == n, "a reader passed through beside an open for writing"
            w.seek(0)
            w.write(b"X")
        data = b"X" + data[1:]
        with open(path, "rb") as f:
            assert md5(f.read()) == md5(data), "read-your-writes after the writer closed"


def test_an_object_changed_in_the_bucket_is_not_read_from_the_old_file(pbucket, tmp_path):
    rng = random.Random(28)
    old, new = rng.randbytes(6 * MiB + 1), rng.randbytes(6 * MiB + 1)  # the same size
    pbucket.put_all({"c.bin": old})
    with mount(pbucket, tmp_path) as mp:
        require_passthrough(mp)
        path = os.path.join(mp, "c.bin")
        assert md5_file(path) == md5(old)
        assert md5_file(path) == md5(old)
        assert through(mp) == 1
        held = open(path, "rb")  # passes through to the old version
        try:
            assert through(mp) == 2
            pbucket.put("c.bin", new)  # another client
            time.sleep(TTL + 0.5)
            # An open now pins the new version; the kernel can only pass it through to the
            # old version's file the held handle uses: refused, never served stale.
            with pytest.raises(OSError) as e:
                open(path, "rb")
            assert e.value.errno == errno.EBUSY
            assert held.read() == old, "the held handle keeps the version it pinned"
        finally:
            held.close()
        assert md5_file(path) == md5(new), "the old backing file was served after the TTL"
        assert through(mp) == 2, "the new version is not whole on disk yet"
        assert md5_file(path) == md5(new)
        assert through(mp) == 3


def test_passthrough_off_gives_the_same_bytes(pbucket, tmp_path):
    data = random.Random(29).randbytes(5 * MiB + 3)
    pbucket.put_all({"o.bin": data})
    with mount(pbucket, tmp_path, "off") as mp:
        path = os.path.join(mp, "o.bin")
        for _ in range(3):
            assert md5_file(path) == md5(data)
        st = status(mp)
        assert (st["passthrough"], st["passthrough_opens"]) == (False, 0)
        assert not list((tmp_path / "cache").glob("*.w")), "whole files built with passthrough off"


def test_files_written_here_read_back_through_passthrough(pbucket, tmp_path):
    rng = random.Random(30)
    with mount(pbucket, tmp_path) as mp:
        require_passthrough(mp)
        path = os.path.join(mp, "w.bin")
        for i in range(3):
            data = rng.randbytes(3 * MiB + i)
            with open(path, "wb") as f:
                f.write(data)
            for _ in range(2):
                with open(path, "rb") as f:
                    assert md5(f.read()) == md5(data), f"round {i}: read-your-writes"
        assert through(mp) >= 1, "a file uploaded here (blocks kept on disk) never passed through"


@pytest.mark.xfail(strict=True, reason="truncate(path) while a read-only handle passes through: the handle "
                   "still reads the old bytes (setattr does not consult the passthrough state); found by "
                   "the model test, which keeps truncate(path) off such files for now")
def test_truncate_by_path_is_seen_by_a_passthrough_reader(pbucket, tmp_path):
    """POSIX, and bucketfs without passthrough: a handle open for reading sees a truncation
    made by path. With passthrough either the truncate must be refused (EBUSY, as an open
    for writing is) or the handle must read the new size."""
    data = random.Random(31).randbytes(3 * MiB)
    pbucket.put_all({"t.bin": data})
    with mount(pbucket, tmp_path) as mp:
        require_passthrough(mp)
        path = os.path.join(mp, "t.bin")
        assert md5_file(path) == md5(data)
        assert md5_file(path) == md5(data)
        fd = os.open(path, os.O_RDONLY)
        try:
            assert through(mp) >= 2, "the held handle did not pass through"
            try:
                os.truncate(path, 100)
            except OSError as e:
                assert e.errno == errno.EBUSY, e
                assert os.pread(fd, 200, 0) == data[:200]
                return
            assert os.fstat(fd).st_size == 100
            assert os.pread(fd, 200, 0) == data[:100], "the passthrough handle read past the new end"
        finally:
            os.close(fd)
