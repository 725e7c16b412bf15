"""Helpers shared by the write-path tests (test_write.py, test_namespace.py, test_tools.py,
test_links.py): a write `Target` (fresh bucket or mem://) with an independent client, the
`tgt` (every store) and `btgt` (bucket-backed stores) fixtures, and small file helpers."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

import seed
from conftest import ALL_STORES, DATA_STORES, Bucket, MiB, md5, md5_file, mounted, read_file, require_bin, require_store

KiB = 1024


def read_fd(fd: int, offset: int = 0, length: int | None = None) -> bytes:
    """pread until EOF (or `length` bytes): FUSE may answer a big pread in pieces."""
    out = bytearray()
    while length is None or len(out) < length:
        want = MiB if length is None else min(MiB, length - len(out))
        b = os.pread(fd, want, offset + len(out))
        if not b:
            break
        out += b
    return bytes(out)


def write_path(path: str, data: bytes, mode: str = "wb") -> None:
    with open(path, mode) as f:
        f.write(data)


def apply_write(model: bytearray, off: int, data: bytes) -> None:
    if off > len(model):
        model.extend(b"\0" * (off - len(model)))
    model[off:off + len(data)] = data


def errname(n) -> str:
    return errno.errorcode.get(n, str(n))


def expect_errno(what: str, fn, *errnos: int) -> int:
    try:
        fn()
    except OSError as e:
        assert e.errno in errnos, \
            f"{what}: expected {'/'.join(map(errname, errnos))}, got {errname(e.errno)}: {e}"
        return e.errno
    pytest.fail(f"{what}: succeeded, expected {'/'.join(map(errname, errnos))}")


def fs_tree(root: str, skip=()) -> tuple[dict[str, str], set[str]]:
    """({relpath: md5} of files, {relpath} of dirs) below root; `skip`: top-level names."""
    files, dirs = {}, set()
    for dp, dns, fns in os.walk(root):
        rel = os.path.relpath(dp, root)
        if rel == ".":
            dns[:] = [d for d in dns if d not in skip]
            fns = [f for f in fns if f not in skip]
        for n in dns:
            dirs.add(os.path.normpath(os.path.join(rel, n)))
        for n in fns:
            files[os.path.normpath(os.path.join(rel, n))] = md5_file(os.path.join(dp, n))
    return files, dirs


def run(cmd, cwd=None, env=None, timeout=300, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    p.out = p.stdout.decode(errors="replace")
    p.err = p.stderr.decode(errors="replace")
    if check:
        assert p.returncode == 0, f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{p.err[-3000:]}\n{p.out[-2000:]}"
    return p


class Target:
    """A store to write to: a fresh bucket on s3/gcs/file, or mem:// (no second client)."""

    def __init__(self, store: str):
        require_store(store)
        require_bin()
        self.store = store
        self.bucket = Bucket(store) if store != "mem" else None

    @property
    def persistent(self) -> bool:
        return self.bucket is not None

    def args(self) -> list[str]:
        return self.bucket.args() if self.bucket else ["mem://"]

    def mounted(self, extra=()):
        return mounted(self.args() + list(extra))

    # independent client -------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        self.bucket.put(key, data)

    def get(self, key: str) -> bytes:
        return seed.get(self.store, self.bucket.name, key)

    def keys(self, prefix: str = "") -> list[str]:
        return seed.list_keys(self.store, self.bucket.name, prefix)

    def has(self, key: str) -> bool:
        return key in self.keys(key)

    def has_dir(self, key: str) -> bool:
        """A directory `key` (no trailing slash) exists in the bucket: marker or children."""
        if self.store == "file":
            return os.path.isdir(os.path.join(seed.file_root(), self.bucket.name, key))
        return bool(self.keys(key + "/"))

    def has_marker(self, key: str) -> bool:
        """An explicit `key/` marker (on file://: the directory itself)."""
        if self.store == "file":
            return self.has_dir(key)
        return self.has(key + "/")

    def tree(self, prefix: str = "", skip=()) -> dict[str, str]:
        """{key relative to prefix: md5} of every object below prefix (markers excluded)."""
        out = {}
        for k in self.keys(prefix):
            if k.endswith("/"):
                continue
            rel = k[len(prefix):]
            if rel.split("/", 1)[0] in skip:
                continue
            out[rel] = md5(self.get(k))
        return out

    def cleanup(self) -> None:
        if self.bucket:
            self.bucket.cleanup()


def rename_or_report(t: "Target", src: str, dst: str) -> None:
    """os.rename; on failure, fail with the errno and what the bucket holds then."""
    try:
        os.rename(src, dst)
    except OSError as e:
        held = t.keys() if t.persistent else "(mem: no second client)"
        pytest.fail(f"rename {os.path.basename(src)} -> {os.path.basename(dst)}: {errname(e.errno)} ({e.strerror}); "
                    f"the bucket then holds {held}")


@pytest.fixture(params=ALL_STORES)
def tgt(request):
    t = Target(request.param)
    yield t
    t.cleanup()


@pytest.fixture(params=DATA_STORES)
def btgt(request):
    t = Target(request.param)
    yield t
    t.cleanup()


def make_existing(t: Target, mp: str, key: str, data: bytes) -> None:
    """An 'existing' file: put by the independent client before mounting, or (mem) via the mount."""
    if t.persistent:
        assert read_file(os.path.join(mp, key)) == data
    else:
        write_path(os.path.join(mp, key), data)
