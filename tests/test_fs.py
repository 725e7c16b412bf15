"""statfs, the read-only contract, and the empty mem:// mount."""

from __future__ import annotations

import errno
import os

import pytest

import seed
from conftest import WRITE_ERRNOS, mounted, store_args


def _expect_write_error(what, fn):
    with pytest.raises(OSError) as ei:
        fn()
    e = ei.value
    print(f"{what}: {errno.errorcode.get(e.errno, e.errno)}")
    assert e.errno in WRITE_ERRNOS, f"{what}: expected EROFS/EACCES/EPERM, got {errno.errorcode.get(e.errno)}: {e}"
    return e.errno


def test_statvfs(any_store):
    b = None
    if any_store == "mem":
        ctx = mounted(["mem://"])
    else:
        from conftest import Bucket
        b = Bucket(any_store)
        b.put("f.txt", b"x" * 10)
        ctx = b.mounted()
    try:
        with ctx as mp:
            sv = os.statvfs(mp)
            print(f"{any_store}: statvfs {sv}")
            assert sv.f_bsize > 0
            assert sv.f_namemax == 255  # docs/SEMANTICS.md: namelen 255
            assert sv.f_bavail > 0 and sv.f_ffree > 0, "statfs should report free space and inodes"
            assert sv.f_blocks >= sv.f_bfree >= 0 or sv.f_blocks == 0
            # statvfs on a path inside the mount works too
            if b is not None:
                assert os.statvfs(os.path.join(mp, "f.txt")).f_bsize == sv.f_bsize
    finally:
        if b is not None:
            b.cleanup()


def test_read_only_mount_refuses_writes(bucket):
    bucket.put_all({"keep.txt": b"keep me", "dir/inner.txt": b"inner"})
    before = seed.list_keys(bucket.store, bucket.name)
    with bucket.mounted(extra=["--read-only"]) as mp:
        def create():
            with open(os.path.join(mp, "new.txt"), "w") as f:
                f.write("nope")

        def overwrite():
            with open(os.path.join(mp, "keep.txt"), "w") as f:
                f.write("clobbered")

        def append():
            with open(os.path.join(mp, "keep.txt"), "ab") as f:
                f.write(b"more")

        _expect_write_error("create new file", create)
        _expect_write_error("open existing for write", overwrite)
        _expect_write_error("open existing for append", append)
        _expect_write_error("mkdir", lambda: os.mkdir(os.path.join(mp, "newdir")))
        _expect_write_error("unlink", lambda: os.unlink(os.path.join(mp, "keep.txt")))
        _expect_write_error("rmdir", lambda: os.rmdir(os.path.join(mp, "dir")))
        _expect_write_error("rename", lambda: os.rename(os.path.join(mp, "keep.txt"),
                                                        os.path.join(mp, "moved.txt")))
        _expect_write_error("truncate", lambda: os.truncate(os.path.join(mp, "keep.txt"), 0))
        # the mount still shows the original data
        with open(os.path.join(mp, "keep.txt"), "rb") as f:
            assert f.read() == b"keep me"
        assert sorted(os.listdir(mp)) == ["dir", "keep.txt"]
    # and the store, seen through an independent client, is untouched
    assert seed.list_keys(bucket.store, bucket.name) == before
    assert seed.get(bucket.store, bucket.name, "keep.txt") == b"keep me"


def test_read_only_flag(bucket):
    bucket.put("a.txt", b"a")
    with bucket.mounted(extra=["--read-only"]) as mp:
        with open(os.path.join(mp, "a.txt"), "rb") as f:
            assert f.read() == b"a"
        en = _expect_write_error("--read-only create", lambda: open(os.path.join(mp, "b.txt"), "w"))
        if en != errno.EROFS:
            print(f"note: --read-only mount refused a write with {errno.errorcode[en]}, not EROFS")
        _expect_write_error("--read-only mkdir", lambda: os.mkdir(os.path.join(mp, "d")))
    assert seed.list_keys(bucket.store, bucket.name) == ["a.txt"]


def test_mem_mount_is_empty():
    with mounted(store_args("mem")) as mp:
        assert os.listdir(mp) == []
        assert os.path.isdir(mp)
        assert not os.path.exists(os.path.join(mp, "anything"))
        with pytest.raises(FileNotFoundError):
            open(os.path.join(mp, "missing.txt"), "rb")
        with pytest.raises(FileNotFoundError):
            os.stat(os.path.join(mp, "a/b/c"))


def test_mem_mount_refuses_writes_when_read_only():
    with mounted(["mem://", "--read-only"]) as mp:
        _expect_write_error("mem create", lambda: open(os.path.join(mp, "new.txt"), "w"))
        _expect_write_error("mem mkdir", lambda: os.mkdir(os.path.join(mp, "d")))
        assert os.listdir(mp) == []


def test_missing_file_is_enoent(bucket):
    bucket.put("present.txt", b"p")
    with bucket.mounted() as mp:
        with pytest.raises(FileNotFoundError):
            open(os.path.join(mp, "absent.txt"), "rb")
        with pytest.raises(FileNotFoundError):
            os.listdir(os.path.join(mp, "absent-dir"))
        with pytest.raises(NotADirectoryError):
            os.listdir(os.path.join(mp, "present.txt"))
        with pytest.raises(NotADirectoryError):
            os.stat(os.path.join(mp, "present.txt/child"))
