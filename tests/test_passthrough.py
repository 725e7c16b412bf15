"""FUSE passthrough: the kernel reads files whole in the disk cache, and reads and writes
staged files, directly.

Needs Linux 6.9+ and root (the mount says so in its log and status otherwise: these tests
skip then). Each checks the bytes (through the mount and in the bucket), and the status
counter of opens that passed through.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import random
import subprocess
import time

import pytest

import seed
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


def in_bucket(b: Bucket, key: str) -> bytes:
    return seed.get(b.store, b.name, key)


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
        cached = list((tmp_path / "cache").glob("*.d"))
        assert [f.read_bytes() == data for f in cached] == [True], "not one cache file holding the object"
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
            # A writer beside readers passing through to a cached version takes that very
            # file over as its staged file (the kernel allows one backing file per inode):
            # the writer passes through too, the readers see its bytes at once, no EBUSY.
            n = through(mp)
            with open(path, "r+b") as w:
                assert through(mp) == n + 1, "the writer did not pass through"
                assert not list((tmp_path / "cache").glob("*.d")), "the taken-over file is still cached"
                w.seek(3 * MiB)
                w.write(b"adopted")
                w.flush()
                assert os.pread(fd, 9, 3 * MiB - 1) == data[3 * MiB - 1:3 * MiB] + b"adopted" + data[
                    3 * MiB + 7:3 * MiB + 8], "a reader did not see the write"
            data = data[:3 * MiB] + b"adopted" + data[3 * MiB + 7:]
            assert md5(in_bucket(pbucket, "p.bin")) == md5(data), "the write was not uploaded at close"
            assert os.pread(fd, 7, 3 * MiB) == b"adopted"
            # O_TRUNC beside a reader that opened the old bytes: it sees the new ones.
            with open(path, "wb") as w:
                w.write(b"new bytes")
            assert os.pread(fd, 100, 0) == b"new bytes"
            assert os.fstat(fd).st_size == 9
            data = b"new bytes"
        finally:
            os.close(fd)
        assert md5_file(path) == md5(data)
        assert md5(in_bucket(pbucket, "p.bin")) == md5(data)
        # Once the readers closed, a writer passes through to its staged file, and a reader
        # opened beside it shares that file (and sees the writer's bytes).
        n = through(mp)
        with open(path, "r+b") as w:
            assert through(mp) == n + 1, "the writer did not pass through"
            with open(path, "rb") as f:
                assert f.read() == data
                assert through(mp) == n + 2, "a reader beside a writer did not share its file"
                w.seek(0)
                w.write(b"X")
                w.flush()
                f.seek(0)
                assert f.read(2) == b"X" + data[1:2], "a reader did not see a write"
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
            # Another client's version is a new inode (docs/SEMANTICS.md, Freshness): an
            # open now reads it through the store, never the old version's backing file,
            # while the held handle keeps the version it pinned, and its size.
            assert os.stat(path).st_ino != os.fstat(held.fileno()).st_ino
            assert md5_file(path) == md5(new), "the old backing file was served after the TTL"
            assert through(mp) == 2, "the new version was not whole on disk before"
            assert held.read() == old, "the held handle keeps the version it pinned"
            assert os.fstat(held.fileno()).st_nlink == 0
        finally:
            held.close()
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
        cached = list((tmp_path / "cache").glob("*.d"))
        assert [f.read_bytes() == data for f in cached] == [True], "one file per version, passthrough or not"


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


# ------------------------------------------------------------------ writes (staged files)

def ls_l(path: str) -> None:
    """List a directory from another process (readdirplus: the kernel takes sizes from it)."""
    subprocess.run(["ls", "-l", path], check=True, capture_output=True)


def test_writes_pass_through_and_reach_the_bucket(pbucket, tmp_path):
    rng = random.Random(31)
    with mount(pbucket, tmp_path) as mp:
        require_passthrough(mp)
        path = os.path.join(mp, "new.bin")
        chunks = [rng.randbytes(4107) for _ in range(300)]  # git's write size
        with open(path, "wb") as f:
            assert through(mp) == 1, "a created file did not pass through"
            for i, c in enumerate(chunks):
                f.write(c)
                if i % 100 == 50:
                    f.flush()
                    # Listing while the file is open for writing must not cut it short.
                    ls_l(mp)
                    assert os.stat(path).st_size == 4107 * (i + 1)
        data = b"".join(chunks)
        assert os.stat(path).st_size == len(data)
        assert md5(in_bucket(pbucket, "new.bin")) == md5(data), "close did not upload what the kernel wrote"
        assert md5_file(path) == md5(data)
        # Overwrite in place (same size: only the mtime tells), through another open.
        with open(path, "r+b") as f:
            f.seek(4107 * 10)
            f.write(b"Z" * 100)
        data = data[:41070] + b"Z" * 100 + data[41170:]
        assert md5(in_bucket(pbucket, "new.bin")) == md5(data), "an in-place overwrite was not uploaded"
        # fsync is a durability point for what the kernel wrote; later writes go up at close.
        with open(path, "ab") as f:
            f.write(b"tail-1")
            f.flush()
            os.fsync(f.fileno())
            assert in_bucket(pbucket, "new.bin").endswith(b"tail-1"), "fsync did not upload"
            f.write(b"tail-2")
        data += b"tail-1tail-2"
        assert md5(in_bucket(pbucket, "new.bin")) == md5(data)
        # Truncate through a passthrough handle, then a mapping that writes.
        with open(path, "r+b") as f:
            f.truncate(5000)
            with mmap.mmap(f.fileno(), 5000) as m:
                m[0:4] = b"MMAP"
                m.flush()
        data = b"MMAP" + data[4:5000]
        assert md5(in_bucket(pbucket, "new.bin")) == md5(data), "truncate or mmap write lost"
        assert md5_file(path) == md5(data)
        assert through(mp) >= 5
    # A fresh mount reads what the bucket holds.
    with mount(pbucket, tmp_path, "off") as mp:
        assert md5_file(os.path.join(mp, "new.bin")) == md5(data)


def test_dd_oflag_direct_writes_a_file_of_any_length(pbucket, tmp_path):
    """GNU `dd oflag=direct` clears O_DIRECT with `fcntl` before its short last block. A
    passed-through handle's backing file keeps the flags of its open, so that write failed
    with EINVAL and the bucket got the file cut at the last whole block (tester D). An
    O_DIRECT writer goes through bucketfs instead; its readers still pass through."""
    data = random.Random(41).randbytes(4 * MiB + 123_457)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    with mount(pbucket, tmp_path) as mp:
        require_passthrough(mp)
        for name in ("new.bin", "new.bin"):  # a create, then an open of the file
            dst = os.path.join(mp, name)
            r = subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=1M", "oflag=direct"], capture_output=True)
            assert r.returncode == 0, r.stderr.decode()
            assert os.stat(dst).st_size == len(data)
            assert md5(in_bucket(pbucket, name)) == md5(data)
        assert md5_file(dst) == md5(data)
        # Whole on local disk now: an unaligned O_DIRECT read got EINVAL there (tester H).
        r = subprocess.run(["dd", f"if={dst}", "of=/dev/null", "bs=1000", "iflag=direct"], capture_output=True)
        assert r.returncode == 0, r.stderr.decode()
        # An O_DIRECT writer beside a reader that passes through was refused with EBUSY.
        with open(dst, "rb") as reader:
            r = subprocess.run(["dd", "if=/dev/zero", f"of={dst}", "bs=4096", "count=1", "seek=10",
                                "conv=notrunc", "oflag=direct"], capture_output=True)
            assert r.returncode == 0, r.stderr.decode()
            reader.seek(40960)
            assert reader.read(4096) == bytes(4096), "the reader does not see the O_DIRECT write"
        data = data[:40960] + bytes(4096) + data[45056:]
        assert md5(in_bucket(pbucket, "new.bin")) == md5(data)


def test_readers_share_a_writers_staged_file(pbucket, tmp_path):
    with mount(pbucket, tmp_path) as mp:
        require_passthrough(mp)
        path = os.path.join(mp, "shared.txt")
        with open(path, "wb") as w:
            w.write(b"first ")
            w.flush()
            with open(path, "rb") as r:  # passes through to the same staged file
                assert r.read() == b"first "
                w.write(b"second")
                w.flush()
                assert r.read() == b"second", "a reader did not see a write made after its open"
            # O_TRUNC by another open while the writer holds the file: empty at once.
            with open(path, "wb") as t:
                assert os.fstat(t.fileno()).st_size == 0
                t.write(b"third")
        assert in_bucket(pbucket, "shared.txt") == b"third"
        assert through(mp) >= 3


def test_a_rename_after_a_kernel_write_never_serves_the_older_version(pbucket, tmp_path):
    """Found by the model (seed 316308028): a file uploaded at a close keeps its blocks in
    the disk cache; the kernel then writes the still-staged file through another handle, and
    a rename uploads those bytes. The cached blocks of the older version must not follow
    the name as the new version's, or a later open passes through to the older bytes."""
    rng = random.Random(33)
    data = bytearray(rng.randbytes(2 * MiB + 123))
    patch = rng.randbytes(3488)
    with mount(pbucket, tmp_path) as mp:
        require_passthrough(mp)
        a, b = os.path.join(mp, "a.bin"), os.path.join(mp, "b.bin")
        open(a, "wb").close()
        with open(a, "r+b") as early:  # open before the file is staged again
            with open(a, "wb") as w:
                w.write(data)
            assert md5(in_bucket(pbucket, "a.bin")) == md5(bytes(data))
            early.seek(153344)
            early.write(patch)
            early.flush()
            os.rename(a, b)
            data[153344:153344 + len(patch)] = patch
            with open(b, "rb") as r:
                assert md5(r.read()) == md5(bytes(data)), "read the version before the write"
        assert md5(in_bucket(pbucket, "b.bin")) == md5(bytes(data))
        with open(b, "rb") as r:
            assert md5(r.read()) == md5(bytes(data)), "read the version before the write"


@pytest.mark.parametrize("size", [100_000, 8 * MiB])
@pytest.mark.parametrize("reader", [False, True], ids=["closed", "reader-open"])
def test_an_edit_never_goes_up_over_another_clients_newer_version(pbucket, tmp_path, size, reader):
    """A version written here stays on disk for passthrough; another client replaces it
    within the TTL: an edit here fails with ESTALE, as a fill pinned to the old version
    does (SEMANTICS.md, open), and never uploads the old bytes over the new. Also while a
    reader holds the file open here (its staged file then stays: the edit took it over
    without asking, 3 runs of 3)."""
    rng = random.Random(41)
    cache = str(tmp_path / "cache")
    with pbucket.mounted(extra=["--cache-dir", cache, "--metadata-ttl", "60", "--passthrough", "on"]) as mp:
        require_passthrough(mp)

        def pwrite(path):
            fd = os.open(path, os.O_RDWR)
            try:
                os.pwrite(fd, b"!", 0)
            finally:
                os.close(fd)

        def append(path):
            with open(path, "ab") as f:
                f.write(b"tail")

        def truncate(path):
            os.truncate(path, 8192)

        for edit in (truncate, pwrite, append):
            old, new = rng.randbytes(size), rng.randbytes(size)
            path = os.path.join(mp, edit.__name__)
            with open(path, "wb") as f:
                f.write(old)
            held = open(path, "rb") if reader else None
            try:
                pbucket.put(edit.__name__, new)  # another client, within the TTL
                try:
                    edit(path)
                except OSError as e:
                    assert e.errno == errno.ESTALE, e
            finally:
                if held:
                    held.close()
            assert in_bucket(pbucket, edit.__name__) == new, f"{edit.__name__}: the old version went up over the new"


@pytest.mark.parametrize("mode", ["durable", "write-back"])
def test_a_handle_that_wrote_nothing_never_publishes_anothers_writes(pbucket, tmp_path, mode):
    """Both handles pass through (the kernel writes without us): the close of an O_RDWR
    handle that only read must not publish what the other handle is still writing."""
    rng = random.Random(42)
    data = rng.randbytes(3 * MiB)
    extra = ["--write-back"] if mode == "write-back" else []
    with pbucket.mounted(extra=["--cache-dir", str(tmp_path / "cache"), "--passthrough", "on", *extra]) as mp:
        require_passthrough(mp)
        path = os.path.join(mp, "f")
        with open(path, "wb") as f:
            f.write(data)
        run_cli(["sync", mp])
        w = os.open(path, os.O_RDWR)
        try:
            os.pwrite(w, b"P" * 1000, 100)  # unfinished: this handle is still open
            other = os.open(path, os.O_RDWR)
            assert os.pread(other, 10, 0) == data[:10]
            os.close(other)
            time.sleep(2)  # (not `bucketfs sync`: it publishes every open file, as sync(1) would)
            assert in_bucket(pbucket, "f") == data, "a close that wrote nothing published another handle's writes"
        finally:
            os.close(w)
        run_cli(["sync", mp])
        assert in_bucket(pbucket, "f") == data[:100] + b"P" * 1000 + data[1100:], "the writer's close did not publish"


def test_write_back_passthrough_writes_are_uploaded_by_sync(pbucket, tmp_path):
    rng = random.Random(32)
    data = rng.randbytes(2 * MiB + 5)
    cache = str(tmp_path / "cache")
    with pbucket.mounted(extra=["--cache-dir", cache, "--passthrough", "on", "--write-back"]) as mp:
        require_passthrough(mp)
        path = os.path.join(mp, "wb.bin")
        with open(path, "wb") as f:
            f.write(data)
        assert md5_file(path) == md5(data)
        run_cli(["sync", mp])
        assert md5(in_bucket(pbucket, "wb.bin")) == md5(data), "bucketfs sync did not upload a passthrough write"
        assert through(mp) >= 1


def test_truncate_by_path_is_seen_by_a_passthrough_reader(pbucket, tmp_path):
    """POSIX, and bucketfs without passthrough: a handle open for reading sees a truncation
    made by path. With passthrough too: the truncate takes the file the handle passes
    through to over, and the handle reads the new size."""
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
            os.truncate(path, 100)
            assert os.fstat(fd).st_size == 100
            assert os.pread(fd, 200, 0) == data[:100], "the passthrough handle read past the new end"
        finally:
            os.close(fd)
        assert in_bucket(pbucket, "t.bin") == data[:100]


def test_a_part_changed_after_its_eager_upload_goes_up_again(pbucket, tmp_path):
    """The kernel writes a passthrough writer's staged file; bucketfs still hands the parts
    of a growing file to an eager upload before close. A part may change after it was sent:
    the close must publish the final bytes (the part is checked, the file goes up whole)."""
    rng = random.Random(41)
    data = bytearray(rng.randbytes(30 * MiB))
    key = "eager-pt.bin"
    with mount(pbucket, tmp_path) as mp:
        require_passthrough(mp)
        with open(os.path.join(mp, key), "wb", buffering=0) as f:
            for off in range(0, len(data), MiB):
                f.write(data[off:off + MiB])
            if pbucket.store == "s3":
                c = seed.s3_client()
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and not any(
                        u["Key"] == key for u in c.list_multipart_uploads(Bucket=pbucket.name).get("Uploads", [])):
                    time.sleep(0.1)
                assert time.monotonic() < deadline, "no eager upload of the passthrough writer's parts"
            time.sleep(0.5)  # the first parts went up
            f.seek(1000)
            f.write(b"changed after it was sent")
            data[1000:1025] = b"changed after it was sent"
        assert md5(in_bucket(pbucket, key)) == md5(bytes(data)), "a part changed after it was sent is stale"
        with open(os.path.join(mp, key), "rb") as f:
            assert md5(f.read()) == md5(bytes(data))
    if pbucket.store == "s3":
        left = [u["Key"] for u in seed.s3_client().list_multipart_uploads(Bucket=pbucket.name).get("Uploads", [])]
        assert left == [], f"multipart uploads left open: {left}"
