"""The write path through the kernel: data, durability and namespace changes.

Every test writes through a real mount and, for the bucket-backed stores (s3 = MinIO,
gcs = fake-gcs-server, file), checks what the bucket holds with the independent clients in
scripts/seed.py. mem:// joins where a check does not need a second client or a remount.

The contract (crates/core/src/write.rs, fs_write.rs, fs_rename.rs):
  - writes are staged locally; reads of a staged file see them, from any handle;
  - close (flush) and fsync upload, and return only once the store has the object;
  - truncate(2) by path uploads at once; unmount uploads whatever is still dirty;
  - create/touch gives a 0-byte object, mkdir a `dir/` marker, rename moves keys.

Slow tests (git clone, 100 MB) carry @pytest.mark.slow: `-m "not slow"` skips them.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import shutil
import stat
import subprocess
import tarfile
import time

import pytest

import seed
from conftest import ALL_STORES, DATA_STORES, Bucket, mounted, require_bin, require_store, run_cli, \
    daemon_pids, is_mounted, mount, unmount, wait_until

KiB = 1024
MiB = 1024 * 1024


# --------------------------------------------------------------------------- helpers

def md5(b) -> str:
    return hashlib.md5(b).hexdigest()


def file_md5(path: str) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(MiB):
            h.update(chunk)
    return h.hexdigest()


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


def read_path(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


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
            files[os.path.normpath(os.path.join(rel, n))] = file_md5(os.path.join(dp, n))
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
        assert read_path(os.path.join(mp, key)) == data
    else:
        write_path(os.path.join(mp, key), data)


# --------------------------------------------------------------------------- data

def test_pwrite_random_offsets(tgt, rng):
    """Random pwrites into a new and an existing file; reads through the same fd and a
    second fd agree with a model at every step; the bucket and a remount agree after close."""
    existing = rng.randbytes(300_001)
    if tgt.persistent:
        tgt.put("old.bin", existing)
    models = {}
    with tgt.mounted() as mp:
        make_existing(tgt, mp, "old.bin", existing)
        for name, model in (("new.bin", bytearray()), ("old.bin", bytearray(existing))):
            p = os.path.join(mp, name)
            fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                for i in range(40):
                    off = rng.randrange(0, len(model) + 70_000)
                    n = rng.choice([1, 3, 511, 4095, 4097, 65_537, rng.randrange(1, 150_000)])
                    data = rng.randbytes(n)
                    assert os.pwrite(fd, data, off) == n
                    apply_write(model, off, data)
                    if i % 5 == 4:
                        # same fd: whole file, and a random range
                        got = read_fd(fd)
                        assert len(got) == len(model), f"{name} step {i}: same-fd read {len(got)} bytes, model {len(model)}"
                        assert md5(got) == md5(model), f"{name} step {i}: same-fd read differs from what was written"
                        a = rng.randrange(0, len(model))
                        b = min(len(model), a + rng.randrange(1, 9000))
                        assert read_fd(fd, a, b - a) == bytes(model[a:b]), f"{name} step {i}: pread [{a},{b}) wrong"
                        assert os.fstat(fd).st_size == len(model)
                        # a second, independent fd (its close flushes; the writer keeps writing)
                        fd2 = os.open(p, os.O_RDONLY)
                        try:
                            got2 = read_fd(fd2)
                        finally:
                            os.close(fd2)
                        assert md5(got2) == md5(model), f"{name} step {i}: second-fd read differs ({len(got2)} vs {len(model)} bytes)"
            finally:
                os.close(fd)
            models[name] = bytes(model)
            assert os.stat(p).st_size == len(model)
            if tgt.persistent:
                inb = tgt.get(name)
                assert len(inb) == len(model) and md5(inb) == md5(model), \
                    f"{name}: bucket holds {len(inb)} bytes md5 {md5(inb)}, wrote {len(model)} md5 {md5(model)}"
            assert md5(read_path(p)) == md5(model)
    if tgt.persistent:
        with tgt.mounted() as mp:
            for name, model in models.items():
                got = read_path(os.path.join(mp, name))
                assert md5(got) == md5(model), f"{name} after remount: {len(got)} bytes, expected {len(model)}"


def test_random_write_after_eager_upload(btgt, rng):
    """A sequential writer past one part (eager multipart upload started), then writes
    elsewhere and a shrinking ftruncate: the object must be exactly the final bytes."""
    with btgt.mounted() as mp:
        # 1. sequential 18 MiB in 1 MiB writes, then a write near the start, one in the
        #    second part, and more appends
        model = bytearray()
        p = os.path.join(mp, "seq-then-random.bin")
        with open(p, "wb", buffering=0) as f:
            for _ in range(18):
                chunk = rng.randbytes(MiB)
                f.write(chunk)
                model += chunk
            for off in (3, 9 * MiB + 5):
                d = rng.randbytes(7777)
                os.pwrite(f.fileno(), d, off)
                apply_write(model, off, d)
            f.seek(0, os.SEEK_END)
            tail = rng.randbytes(2 * MiB + 11)
            f.write(tail)
            model += tail
        got = btgt.get("seq-then-random.bin")
        assert len(got) == len(model) and md5(got) == md5(model), \
            f"bucket holds {len(got)} bytes md5 {md5(got)}, expected {len(model)} md5 {md5(model)}"

        # 2. sequential 17 MiB, then shrink below the first part and append a little
        p = os.path.join(mp, "seq-then-shrink.bin")
        model = bytearray()
        with open(p, "wb", buffering=0) as f:
            for _ in range(17):
                chunk = rng.randbytes(MiB)
                f.write(chunk)
                model += chunk
            os.ftruncate(f.fileno(), 5 * MiB + 3)
            del model[5 * MiB + 3:]
            f.seek(0, os.SEEK_END)
            f.write(b"end")
            model += b"end"
        got = btgt.get("seq-then-shrink.bin")
        assert len(got) == len(model) and md5(got) == md5(model), \
            f"bucket holds {len(got)} bytes, expected {len(model)}"
        assert md5(read_path(p)) == md5(model)


def test_eager_multipart_upload_starts_before_close(s3_bucket, rng):
    """write.rs: a sequential writer's full parts go up before close. On MinIO an
    in-progress multipart upload for the key is visible while the file is still open."""
    key = "eager.bin"
    with s3_bucket.mounted() as mp:
        model = bytearray()
        with open(os.path.join(mp, key), "wb", buffering=0) as f:
            for _ in range(24):
                chunk = rng.randbytes(MiB)
                f.write(chunk)
                model += chunk
            c = seed.s3_client()
            ups = wait_until(lambda: any(u["Key"] == key for u in
                                         c.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads", [])), 10)
            assert ups, "no multipart upload in progress after 24 MiB of sequential writes (eager upload not started)"
        got = seed.get("s3", s3_bucket.name, key)
        assert md5(got) == md5(model)
        left = [u["Key"] for u in seed.s3_client().list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads", [])]
        assert left == [], f"multipart uploads left open after close: {left}"


def test_read_after_write_across_handles(tgt, rng):
    """A second handle sees a first handle's writes before the writer closes."""
    old = rng.randbytes(MiB)
    if tgt.persistent:
        tgt.put("shared.bin", old)
    with tgt.mounted() as mp:
        make_existing(tgt, mp, "shared.bin", old)
        p = os.path.join(mp, "shared.bin")
        model = bytearray(old)
        r = os.open(p, os.O_RDONLY)            # reader first, reading the stored version
        w = None
        try:
            assert read_fd(r, 0, 4096) == old[:4096]
            w = os.open(p, os.O_WRONLY)
            d = rng.randbytes(10_000)
            os.pwrite(w, d, 100_000)
            apply_write(model, 100_000, d)
            assert read_fd(r, 100_000, 10_000) == d, "reader opened before the write does not see it"
            d = rng.randbytes(123_457)
            os.pwrite(w, d, len(model))           # extend
            apply_write(model, len(model), d)
            assert os.fstat(r).st_size == len(model), "reader's fstat does not show the writer's extension"
            assert md5(read_fd(r)) == md5(model), "reader's full read differs before the writer closed"
            r2 = os.open(p, os.O_RDONLY)           # a handle opened after the writes
            try:
                assert md5(read_fd(r2)) == md5(model)
            finally:
                os.close(r2)
        finally:
            if w is not None:
                os.close(w)
            os.close(r)
        if tgt.persistent:
            assert md5(tgt.get("shared.bin")) == md5(model)

        # a brand-new file: the reader opens it while the creator still writes
        p = os.path.join(mp, "fresh.bin")
        w = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            first = rng.randbytes(70_001)
            os.write(w, first)
            r = os.open(p, os.O_RDONLY)
            try:
                assert read_fd(r) == first
                second = rng.randbytes(5)
                os.write(w, second)
                assert read_fd(r) == first + second
            finally:
                os.close(r)
        finally:
            os.close(w)
        assert read_path(p) == first + second
        if tgt.persistent:
            assert tgt.get("fresh.bin") == first + second


def test_truncate_and_extend(tgt, rng):
    base = rng.randbytes(200_000)
    if tgt.persistent:
        for k in ("ft.bin", "path.bin", "otrunc.bin", "otrunc-empty.bin"):
            tgt.put(k, base)
    with tgt.mounted() as mp:
        for k in ("ft.bin", "path.bin", "otrunc.bin", "otrunc-empty.bin"):
            make_existing(tgt, mp, k, base)

        # ftruncate: shrink, extend (zero fill), write past, shrink again
        p = os.path.join(mp, "ft.bin")
        model = bytearray(base)
        fd = os.open(p, os.O_RDWR)
        try:
            os.ftruncate(fd, 12_345)
            del model[12_345:]
            assert os.fstat(fd).st_size == 12_345
            assert read_fd(fd) == model
            os.ftruncate(fd, 300_000)
            model.extend(b"\0" * (300_000 - len(model)))
            assert read_fd(fd) == model, "ftruncate extension is not zero-filled"
            os.pwrite(fd, b"Z" * 100, 250_000)
            apply_write(model, 250_000, b"Z" * 100)
            os.ftruncate(fd, 250_050)
            del model[250_050:]
            assert read_fd(fd) == model
        finally:
            os.close(fd)
        assert os.stat(p).st_size == len(model)
        if tgt.persistent:
            assert md5(tgt.get("ft.bin")) == md5(model)

        # truncate(2) by path, with no open handle: uploaded at once (fs_rename.rs setattr)
        p = os.path.join(mp, "path.bin")
        os.truncate(p, 1000)
        assert os.stat(p).st_size == 1000
        if tgt.persistent:
            got = tgt.get("path.bin")
            assert got == base[:1000], f"after truncate(path, 1000) the bucket holds {len(got)} bytes"
        os.truncate(p, 5000)
        assert read_path(p) == base[:1000] + b"\0" * 4000
        if tgt.persistent:
            assert tgt.get("path.bin") == base[:1000] + b"\0" * 4000
        os.truncate(p, 0)
        assert os.stat(p).st_size == 0 and read_path(p) == b""
        if tgt.persistent:
            assert tgt.get("path.bin") == b""

        # O_TRUNC with new content
        p = os.path.join(mp, "otrunc.bin")
        write_path(p, b"replaced")
        assert read_path(p) == b"replaced"
        if tgt.persistent:
            assert tgt.get("otrunc.bin") == b"replaced"

        # O_TRUNC and close without writing (`: > file`): the file is now empty
        p = os.path.join(mp, "otrunc-empty.bin")
        os.close(os.open(p, os.O_WRONLY | os.O_TRUNC))
        assert os.stat(p).st_size == 0
        if tgt.persistent:
            got = tgt.get("otrunc-empty.bin")
            assert got == b"", f"open(O_TRUNC)+close left {len(got)} bytes in the bucket"

    if tgt.persistent:
        with tgt.mounted() as mp:
            assert os.stat(os.path.join(mp, "path.bin")).st_size == 0
            assert read_path(os.path.join(mp, "otrunc.bin")) == b"replaced"
            assert os.stat(os.path.join(mp, "otrunc-empty.bin")).st_size == 0
            assert md5(read_path(os.path.join(mp, "ft.bin"))) == md5(model)


def test_append_and_overwrite_middle(tgt, rng):
    mid = rng.randbytes(200_000)
    if tgt.persistent:
        tgt.put("log.txt", b"line0\n")
        tgt.put("mid.bin", mid)
    with tgt.mounted() as mp:
        make_existing(tgt, mp, "log.txt", b"line0\n")
        make_existing(tgt, mp, "mid.bin", mid)
        p = os.path.join(mp, "log.txt")
        run(["sh", "-c", 'echo line1 >> "$1"; echo line2 >> "$1"', "sh", p])
        expect = b"line0\nline1\nline2\n"
        assert read_path(p) == expect
        if tgt.persistent:
            assert tgt.get("log.txt") == expect
        fd = os.open(p, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b"line3\n")
            os.lseek(fd, 0, os.SEEK_SET)       # O_APPEND ignores the position
            os.write(fd, b"line4\n")
        finally:
            os.close(fd)
        expect += b"line3\nline4\n"
        assert read_path(p) == expect
        write_path(p, b"line5\n", "ab")
        expect += b"line5\n"
        assert read_path(p) == expect
        if tgt.persistent:
            assert tgt.get("log.txt") == expect

        # overwrite in the middle: size unchanged, only those bytes differ
        p = os.path.join(mp, "mid.bin")
        model = bytearray(mid)
        patch = rng.randbytes(5000)
        with open(p, "r+b") as f:
            f.seek(100_003)
            f.write(patch)
        apply_write(model, 100_003, patch)
        assert os.stat(p).st_size == len(mid)
        assert md5(read_path(p)) == md5(model)
        if tgt.persistent:
            assert md5(tgt.get("mid.bin")) == md5(model)
    if tgt.persistent:
        with tgt.mounted() as mp:
            assert read_path(os.path.join(mp, "log.txt")) == expect
            assert md5(read_path(os.path.join(mp, "mid.bin"))) == md5(model)


# --------------------------------------------------------------------------- durability

def test_close_to_open_durability(btgt, rng):
    """After close() returns, the independent client sees the object at once."""
    with btgt.mounted() as mp:
        for name, size in (("one.txt", 1), ("small.bin", 70_000), ("multi.bin", 9 * MiB + 17)):
            data = rng.randbytes(size)
            write_path(os.path.join(mp, name), data)
            got = btgt.get(name)   # no sleep, no retry
            assert len(got) == size and md5(got) == md5(data), \
                f"{name}: right after close the bucket holds {len(got)} bytes, wrote {size}"
            assert seed.head(btgt.store, btgt.bucket.name, name)["size"] == size
        # overwrite an existing object: the new version is there at close
        data = rng.randbytes(1234)
        write_path(os.path.join(mp, "small.bin"), data)
        assert btgt.get("small.bin") == data


def test_fsync_uploads_before_close(btgt, rng):
    with btgt.mounted() as mp:
        p = os.path.join(mp, "synced.bin")
        a, b, c = rng.randbytes(3000), rng.randbytes(9 * MiB), rng.randbytes(17)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, a)
            os.fsync(fd)
            assert btgt.get("synced.bin") == a, "fsync returned but the object is not in the bucket"
            os.write(fd, b)
            os.fdatasync(fd)
            got = btgt.get("synced.bin")
            assert md5(got) == md5(a + b), f"after fdatasync the bucket holds {len(got)} bytes, wrote {len(a + b)}"
            os.pwrite(fd, c, 10)
            os.fsync(fd)
            model = bytearray(a + b)
            apply_write(model, 10, c)
            assert md5(btgt.get("synced.bin")) == md5(model)
        finally:
            os.close(fd)
        assert md5(btgt.get("synced.bin")) == md5(model)


def test_parallel_writers(tgt, rng):
    """Eight threads each create, write and close files at once; every one lands intact."""
    from concurrent.futures import ThreadPoolExecutor
    blobs = {f"par/t{t}/f{i}.bin": rng.randbytes(rng.randrange(1, 300_000)) for t in range(8) for i in range(6)}
    with tgt.mounted() as mp:
        for t in range(8):
            os.makedirs(os.path.join(mp, f"par/t{t}"))

        def writer(t):
            for k, v in blobs.items():
                if k.startswith(f"par/t{t}/"):
                    with open(os.path.join(mp, k), "wb") as f:
                        for off in range(0, len(v), 65_536):
                            f.write(v[off:off + 65_536])
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(writer, range(8)))
        got, _ = fs_tree(os.path.join(mp, "par"))
        assert got == {k[4:]: md5(v) for k, v in blobs.items()}
        if tgt.persistent:
            assert tgt.tree("par/") == {k[4:]: md5(v) for k, v in blobs.items()}


def test_unmount_right_after_writing(btgt, rng):
    """`bucketfs unmount` straight after writing: everything is in the bucket afterwards."""
    expect = {}
    mp = mount(btgt.args())
    try:
        os.mkdir(os.path.join(mp, "many"))
        for i in range(40):
            d = rng.randbytes(rng.randrange(0, 20_000))
            write_path(os.path.join(mp, f"many/f{i:02}.bin"), d)
            expect[f"many/f{i:02}.bin"] = md5(d)
        big = rng.randbytes(12 * MiB + 3)
        src = os.path.join(os.path.dirname(mp), f"src-{os.path.basename(mp)}.bin")
        write_path(src, big)
        try:
            dd = run(["dd", f"if={src}", f"of={os.path.join(mp, 'big.bin')}", "bs=1M", "status=none"], check=False)
        finally:
            os.unlink(src)
        expect["big.bin"] = md5(big)
        run(["sh", "-c", 'printf tail > "$1/tail.txt"', "sh", mp])
        expect["tail.txt"] = md5(b"tail")
        assert daemon_pids(mp), "no bucketfs process found for the mount"
        p = run_cli(["unmount", mp], timeout=120)
        assert p.returncode == 0, f"bucketfs unmount exited {p.returncode}: {p.err}"
        assert not is_mounted(mp)
        assert daemon_pids(mp) == [], "bucketfs unmount returned before the mount process exited"
    finally:
        unmount(mp)
    got = btgt.tree()
    assert dd.returncode == 0, f"dd of 12 MiB exited {dd.returncode}: {dd.err.strip()}; " \
                               f"bucket has big.bin: {'big.bin' in got} (right bytes: {got.get('big.bin') == expect['big.bin']}), small files all there: " \
                               f"{all(got.get(k) == v for k, v in expect.items() if k != 'big.bin')}"
    assert got == expect, f"after unmount: missing {sorted(set(expect) - set(got))}, " \
                          f"wrong {sorted(k for k in expect if k in got and got[k] != expect[k])}, " \
                          f"extra {sorted(set(got) - set(expect))}"


def test_mmap_writes_reach_bucket_by_unmount(btgt, rng):
    """Writes through a shared mapping that outlives the fd (as linkers do) are written
    back after the last flush; release or unmount must still upload them."""
    size = 256 * KiB
    model = bytearray(rng.randbytes(size))
    mp = mount(btgt.args())
    try:
        p = os.path.join(mp, "mapped.bin")
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
        os.ftruncate(fd, size)
        m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        os.close(fd)                       # flush: nothing dirty through write() yet
        m[:] = bytes(model)
        m.flush()                          # msync
        m.close()
        assert md5(read_path(p)) == md5(model), "the mount does not show the mmap writes"
        p2 = run_cli(["unmount", mp], timeout=120)
        assert p2.returncode == 0, p2.err
    finally:
        unmount(mp)
    got = btgt.get("mapped.bin")
    assert len(got) == size and md5(got) == md5(model), \
        f"after unmount the bucket holds {len(got)} bytes, {'all zero' if got == bytes(len(got)) else 'not the mmap writes'}"


# --------------------------------------------------------------------------- namespace

def test_touch_creates_empty_object(tgt):
    if tgt.persistent:
        tgt.put("kept.txt", b"keep")
    with tgt.mounted() as mp:
        make_existing(tgt, mp, "kept.txt", b"keep")
        run(["touch", os.path.join(mp, "empty")])
        st = os.stat(os.path.join(mp, "empty"))
        assert stat.S_ISREG(st.st_mode) and st.st_size == 0
        assert "empty" in os.listdir(mp)
        if tgt.persistent:
            assert tgt.has("empty"), f"touch: no 'empty' object; bucket holds {tgt.keys()}"
            assert tgt.get("empty") == b""
        # touching an existing file changes its times, never its content
        run(["touch", os.path.join(mp, "kept.txt")])
        assert read_path(os.path.join(mp, "kept.txt")) == b"keep"
        if tgt.persistent:
            assert tgt.get("kept.txt") == b"keep"
        # O_CREAT|O_EXCL on an existing name
        expect_errno("O_EXCL on existing", lambda: os.open(os.path.join(mp, "empty"),
                                                          os.O_WRONLY | os.O_CREAT | os.O_EXCL), errno.EEXIST)
    if tgt.persistent:
        with tgt.mounted() as mp:
            assert os.stat(os.path.join(mp, "empty")).st_size == 0


def test_mkdir_persists_and_rmdir(tgt):
    with tgt.mounted() as mp:
        os.mkdir(os.path.join(mp, "solo"))
        os.makedirs(os.path.join(mp, "a/b/c"))
        assert os.path.isdir(os.path.join(mp, "a/b/c"))
        assert sorted(os.listdir(mp)) == ["a", "solo"]
        assert os.listdir(os.path.join(mp, "a/b/c")) == []
        expect_errno("mkdir existing", lambda: os.mkdir(os.path.join(mp, "solo")), errno.EEXIST)
        if tgt.persistent:
            for d in ("solo", "a/b/c"):
                assert tgt.has_marker(d), f"mkdir {d}: no marker in the bucket; bucket holds {tgt.keys()}"
        # files inside a new directory
        write_path(os.path.join(mp, "a/b/f.txt"), b"f")
        expect_errno("rmdir a (has a/b)", lambda: os.rmdir(os.path.join(mp, "a")), errno.ENOTEMPTY, errno.EEXIST)
        expect_errno("rmdir a/b (has c and f.txt)", lambda: os.rmdir(os.path.join(mp, "a/b")),
                     errno.ENOTEMPTY, errno.EEXIST)
        os.rmdir(os.path.join(mp, "a/b/c"))
        assert not os.path.exists(os.path.join(mp, "a/b/c"))
        if tgt.persistent:
            assert not tgt.has_dir("a/b/c"), f"rmdir a/b/c: still in the bucket: {tgt.keys('a/b/c')}"
    if not tgt.persistent:
        return
    with tgt.mounted() as mp:
        assert sorted(os.listdir(mp)) == ["a", "solo"], "directories did not survive a remount"
        assert os.listdir(os.path.join(mp, "solo")) == [], "an empty directory did not survive a remount"
        assert sorted(os.listdir(os.path.join(mp, "a/b"))) == ["f.txt"]
        os.rmdir(os.path.join(mp, "solo"))
        assert "solo" not in os.listdir(mp)
    with tgt.mounted() as mp:
        assert "solo" not in os.listdir(mp), "rmdir'ed directory came back after remount"
    assert not tgt.has_dir("solo")


def test_rmdir_nonempty_fails(tgt):
    if tgt.persistent:
        tgt.put("implicit/x.txt", b"x")   # a directory with no marker, only a child key
    with tgt.mounted() as mp:
        if not tgt.persistent:
            os.mkdir(os.path.join(mp, "implicit"))
            write_path(os.path.join(mp, "implicit/x.txt"), b"x")
        expect_errno("rmdir implicit dir", lambda: os.rmdir(os.path.join(mp, "implicit")), errno.ENOTEMPTY, errno.EEXIST)
        # a directory whose only child is still being written (not yet uploaded)
        os.mkdir(os.path.join(mp, "pending"))
        fd = os.open(os.path.join(mp, "pending/open.txt"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"not closed yet")
            expect_errno("rmdir dir with an open new file", lambda: os.rmdir(os.path.join(mp, "pending")),
                         errno.ENOTEMPTY, errno.EEXIST)
        finally:
            os.close(fd)
        expect_errno("rmdir of a file", lambda: os.rmdir(os.path.join(mp, "implicit/x.txt")), errno.ENOTDIR)
        expect_errno("rmdir missing", lambda: os.rmdir(os.path.join(mp, "nope")), errno.ENOENT)
        # emptied, it goes
        os.unlink(os.path.join(mp, "pending/open.txt"))
        os.rmdir(os.path.join(mp, "pending"))
        assert not os.path.exists(os.path.join(mp, "pending"))
        assert os.path.exists(os.path.join(mp, "implicit/x.txt"))
    if tgt.persistent:
        assert tgt.keys() == ["implicit/x.txt"]


def test_unlink(tgt):
    if tgt.persistent:
        tgt.put("gone.txt", b"bye")
        tgt.put("d/inner.txt", b"in")
    with tgt.mounted() as mp:
        make_existing(tgt, mp, "gone.txt", b"bye")
        if not tgt.persistent:
            os.mkdir(os.path.join(mp, "d"))
            write_path(os.path.join(mp, "d/inner.txt"), b"in")
        os.unlink(os.path.join(mp, "gone.txt"))
        assert not os.path.exists(os.path.join(mp, "gone.txt"))
        assert "gone.txt" not in os.listdir(mp)
        if tgt.persistent:
            assert not tgt.has("gone.txt"), "unlink: the object is still in the bucket"
        expect_errno("unlink missing", lambda: os.unlink(os.path.join(mp, "gone.txt")), errno.ENOENT)
        expect_errno("unlink a directory", lambda: os.unlink(os.path.join(mp, "d")), errno.EISDIR, errno.EPERM)
        # unlink the last file of an implicit directory
        os.unlink(os.path.join(mp, "d/inner.txt"))
        if os.path.isdir(os.path.join(mp, "d")):
            assert os.listdir(os.path.join(mp, "d")) == []
        # an open file unlinked while being written: readable through its fd, never uploaded
        p = os.path.join(mp, "tmpfile")
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"scratch")
            os.fsync(fd)
            os.unlink(p)
            os.write(fd, b" more")
            assert read_fd(fd) == b"scratch more"
            assert not os.path.exists(p)
        finally:
            os.close(fd)
        assert not os.path.exists(p)
        assert "tmpfile" not in os.listdir(mp)
        if tgt.persistent:
            time.sleep(0.3)   # release runs after close returns
            assert not tgt.has("tmpfile"), "a file unlinked while open was uploaded at close"
    if tgt.persistent:
        # (file:// keeps the emptied directory `d` on disk, which lists as a marker `d/`)
        files = [k for k in tgt.keys() if not k.endswith("/")]
        assert files == [], f"bucket should hold no objects, holds {tgt.keys()}"


def test_rename_file(tgt, rng):
    a, b = rng.randbytes(100_000), rng.randbytes(5000)
    if tgt.persistent:
        tgt.put("a.bin", a)
        tgt.put("target.bin", b)
    with tgt.mounted() as mp:
        make_existing(tgt, mp, "a.bin", a)
        make_existing(tgt, mp, "target.bin", b)
        os.mkdir(os.path.join(mp, "sub"))
        os.rename(os.path.join(mp, "a.bin"), os.path.join(mp, "renamed.bin"))
        assert not os.path.exists(os.path.join(mp, "a.bin"))
        assert md5(read_path(os.path.join(mp, "renamed.bin"))) == md5(a)
        if tgt.persistent:
            assert not tgt.has("a.bin"), "rename: old key still in the bucket"
            assert md5(tgt.get("renamed.bin")) == md5(a)
        # into another directory
        os.rename(os.path.join(mp, "renamed.bin"), os.path.join(mp, "sub/moved.bin"))
        assert md5(read_path(os.path.join(mp, "sub/moved.bin"))) == md5(a)
        # over an existing file: the target now holds the source's bytes
        os.rename(os.path.join(mp, "sub/moved.bin"), os.path.join(mp, "target.bin"))
        assert md5(read_path(os.path.join(mp, "target.bin"))) == md5(a)
        assert not os.path.exists(os.path.join(mp, "sub/moved.bin"))
        assert sorted(os.listdir(mp)) == ["sub", "target.bin"]
        assert os.listdir(os.path.join(mp, "sub")) == []
        if tgt.persistent:
            assert md5(tgt.get("target.bin")) == md5(a), "rename over: the target object is not the source's"
            assert not tgt.has("sub/moved.bin") and not tgt.has("renamed.bin")
        # a file renamed while still open for writing; writes after the rename land too
        p = os.path.join(mp, "draft.txt")
        fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"part1-")
            os.rename(p, os.path.join(mp, "final.txt"))
            os.write(fd, b"part2")
        finally:
            os.close(fd)
        assert read_path(os.path.join(mp, "final.txt")) == b"part1-part2"
        assert not os.path.exists(p)
        if tgt.persistent:
            assert tgt.get("final.txt") == b"part1-part2", \
                f"renamed-while-open file: bucket holds {tgt.get('final.txt')!r}"
            assert not tgt.has("draft.txt"), "renamed-while-open file: old key appeared in the bucket"
        # errors
        expect_errno("rename missing", lambda: os.rename(os.path.join(mp, "nope"), os.path.join(mp, "x")), errno.ENOENT)
        expect_errno("rename file over dir", lambda: os.rename(os.path.join(mp, "final.txt"), os.path.join(mp, "sub")),
                     errno.EISDIR)
    if tgt.persistent:
        keys = tgt.keys()
        assert [k for k in keys if not k.endswith("/")] == ["final.txt", "target.bin"], keys
        with tgt.mounted() as mp:
            assert md5(read_path(os.path.join(mp, "target.bin"))) == md5(a)
            assert read_path(os.path.join(mp, "final.txt")) == b"part1-part2"


def test_rename_populated_directory(btgt, rng):
    """A directory of objects (implicit subdirectories, as other tools upload them), plus a
    file written through the mount and one still open for writing, renamed into another
    directory: every key moves, checksums are equal, nothing is left under the old name."""
    tree = {"d0/d1/seed.bin": rng.randbytes(1000)}
    for i in range(25):
        parts = [f"d{rng.randrange(3)}" for _ in range(rng.randrange(0, 3))]
        tree["/".join(parts + [f"f{i}.bin"])] = rng.randbytes(rng.randrange(0, 40_000))
    btgt.bucket.put_all({f"proj/{k}": v for k, v in tree.items()})
    with btgt.mounted() as mp:
        src = os.path.join(mp, "proj")
        write_path(os.path.join(src, "d0/written.txt"), b"written through the mount")
        fd = os.open(os.path.join(src, "d0/d1/open.txt"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"before rename;")
            before_files, before_dirs = fs_tree(src)
            assert len(before_files) == len(tree) + 2
            os.mkdir(os.path.join(mp, "archive"))
            rename_or_report(btgt, src, os.path.join(mp, "archive/proj2"))
            os.write(fd, b"after rename")
        finally:
            os.close(fd)
        before_files["d0/d1/open.txt"] = md5(b"before rename;after rename")
        assert not os.path.exists(src)
        after_files, after_dirs = fs_tree(os.path.join(mp, "archive/proj2"))
        assert after_files == before_files, "tree checksums differ after the directory rename"
        assert after_dirs == before_dirs
        old_keys = btgt.keys("proj/")
        assert old_keys == [], f"keys left under (or written back to) the old name: {old_keys}"
        assert btgt.tree("archive/proj2/") == before_files
    with btgt.mounted() as mp:
        assert os.listdir(mp) == ["archive"]
        assert fs_tree(os.path.join(mp, "archive/proj2")) == (before_files, before_dirs)


def test_rename_directory_errors(tgt):
    """Into itself: EINVAL; over a non-empty dir: ENOTEMPTY; over a file: ENOTDIR; a file
    over a dir: EISDIR; over an empty dir: replaces it. (Directories without subdirectories.)"""
    with tgt.mounted() as mp:
        j = lambda *a: os.path.join(mp, *a)  # noqa: E731
        os.mkdir(j("d"))
        write_path(j("d", "f.txt"), b"f")
        os.mkdir(j("other"))
        write_path(j("other", "keep.txt"), b"k")
        os.mkdir(j("emptytarget"))
        expect_errno("rename dir into itself", lambda: os.rename(j("d"), j("d", "inner")), errno.EINVAL)
        expect_errno("rename dir over non-empty dir", lambda: os.rename(j("d"), j("other")),
                     errno.ENOTEMPTY, errno.EEXIST)
        expect_errno("rename dir over file", lambda: os.rename(j("d"), j("other", "keep.txt")), errno.ENOTDIR)
        expect_errno("rename file over dir", lambda: os.rename(j("d", "f.txt"), j("emptytarget")), errno.EISDIR)
        assert read_path(j("d", "f.txt")) == b"f" and read_path(j("other", "keep.txt")) == b"k"
        os.rename(j("other"), j("emptytarget"))
        assert os.listdir(j("emptytarget")) == ["keep.txt"]
        assert sorted(os.listdir(mp)) == ["d", "emptytarget"]
        if tgt.persistent:
            assert sorted(k for k in tgt.keys() if not k.endswith("/")) == ["d/f.txt", "emptytarget/keep.txt"]
            assert tgt.keys("other/") == []
    if tgt.persistent:
        with tgt.mounted() as mp:
            assert sorted(os.listdir(mp)) == ["d", "emptytarget"]
            assert read_path(os.path.join(mp, "emptytarget/keep.txt")) == b"k"


def test_rename_directory_made_with_mkdir(tgt, rng):
    """mkdir -p makes a marker per directory; renaming the tree moves markers and files."""
    with tgt.mounted() as mp:
        os.makedirs(os.path.join(mp, "a/b/c"))
        os.mkdir(os.path.join(mp, "a/empty"))
        data = {"one.txt": rng.randbytes(10), "b/two.bin": rng.randbytes(50_000), "b/c/three.bin": rng.randbytes(3)}
        for k, v in data.items():
            write_path(os.path.join(mp, "a", k), v)
        before = fs_tree(os.path.join(mp, "a"))
        rename_or_report(tgt, os.path.join(mp, "a"), os.path.join(mp, "z"))
        assert not os.path.exists(os.path.join(mp, "a"))
        assert fs_tree(os.path.join(mp, "z")) == before
        if tgt.persistent:
            assert tgt.keys("a/") == [], f"left under a/: {tgt.keys('a/')}"
            assert tgt.tree("z/") == {k: md5(v) for k, v in data.items()}
            assert tgt.has_marker("z/empty"), f"empty subdirectory lost: {tgt.keys('z/')}"
    if tgt.persistent:
        with tgt.mounted() as mp:
            assert fs_tree(os.path.join(mp, "z")) == before
            assert not os.path.exists(os.path.join(mp, "a"))


def test_create_mode_and_setattr(tgt):
    """chmod/chown/utime succeed and stat shows them while mounted (not persisted: not checked)."""
    with tgt.mounted() as mp:
        p = os.path.join(mp, "f.txt")
        old = os.umask(0o022)
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o755)
        finally:
            os.umask(old)
        os.write(fd, b"x")
        os.close(fd)
        write_path(os.path.join(mp, "g.txt"), b"g")
        os.chmod(p, 0o600)
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
        os.chmod(p, 0o751)
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o751
        os.chown(p, 1234, 5678)
        st = os.stat(p)
        assert (st.st_uid, st.st_gid) == (1234, 5678)
        os.chown(p, 0, 0)
        mt = 1_500_000_000.25
        os.utime(p, (mt, mt))
        assert abs(os.stat(p).st_mtime - mt) < 1e-3, f"utime: stat shows mtime {os.stat(p).st_mtime}, set {mt}"
        os.mkdir(os.path.join(mp, "d"))
        os.chmod(os.path.join(mp, "d"), 0o700)
        assert stat.S_IMODE(os.stat(os.path.join(mp, "d")).st_mode) == 0o700
        assert read_path(p) == b"x"
        if tgt.persistent:
            assert tgt.get("f.txt") == b"x", "chmod/chown/utime changed the object"


def test_setattr_survives_attribute_ttl(tgt):
    """stat keeps showing chmod and utime after the 1 s metadata TTL expired (still mounted)."""
    with tgt.mounted() as mp:
        p = os.path.join(mp, "f.txt")
        write_path(p, b"x")
        os.chmod(p, 0o640)
        mt = 1_400_000_000.0
        os.utime(p, (mt, mt))
        time.sleep(2.5)  # --metadata-ttl 1: the kernel and bucketfs ask again
        st = os.stat(p)
        listed = {e.name: e.stat() for e in os.scandir(mp)}["f.txt"]
        assert stat.S_IMODE(st.st_mode) == 0o640, f"mode reverted to {oct(stat.S_IMODE(st.st_mode))} after the TTL"
        assert abs(st.st_mtime - mt) < 1e-3, f"utime lost after the TTL: stat shows mtime {st.st_mtime}, set {mt}"
        assert abs(listed.st_mtime - mt) < 1e-3, f"utime lost in a listing after the TTL: {listed.st_mtime}"


def test_create_mode_is_shown(tgt):
    """open(O_CREAT, 0755) under umask 022 gives a 0755 file (git checks out executables so)."""
    with tgt.mounted() as mp:
        old = os.umask(0o022)
        try:
            os.close(os.open(os.path.join(mp, "x.sh"), os.O_WRONLY | os.O_CREAT, 0o777))
            os.close(os.open(os.path.join(mp, "r.txt"), os.O_WRONLY | os.O_CREAT, 0o600))
            os.mkdir(os.path.join(mp, "priv"), 0o700)
        finally:
            os.umask(old)
        modes = {n: oct(stat.S_IMODE(os.stat(os.path.join(mp, n)).st_mode)) for n in ("x.sh", "r.txt", "priv")}
        assert modes == {"x.sh": "0o755", "r.txt": "0o600", "priv": "0o700"}, f"modes at create ignored: {modes}"


# --------------------------------------------------------------------------- tools

@pytest.fixture(scope="module")
def src_tree(tmp_path_factory):
    """~200 files in nested dirs, an empty dir, an executable, a 20 MB file, old mtimes."""
    import random
    rng = random.Random(20240601)
    root = tmp_path_factory.mktemp("srctree") / "tree"
    root.mkdir()
    for i in range(199):
        d = root / f"lvl{i % 4}" / f"sub{i % 7}" / ("deep" if i % 3 == 0 else "")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"file{i:03}.dat").write_bytes(rng.randbytes(rng.choice([0, 1, 100, 4096, rng.randrange(0, 60_000)])))
    (root / "empty-dir").mkdir()
    (root / "run.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "big.bin").write_bytes(rng.randbytes(20 * MiB))
    for dp, dns, fns in os.walk(root):
        for n in fns:
            os.utime(os.path.join(dp, n), (1_600_000_000, 1_600_000_000 + len(n)))
    return str(root)


def test_cp_a_tree_and_tar_x(btgt, src_tree, tmp_path):
    files, dirs = fs_tree(src_tree)
    with btgt.mounted() as mp:
        p = run(["cp", "-a", src_tree, os.path.join(mp, "copy")], check=False)
        assert p.returncode == 0 and not p.err, f"cp -a exited {p.returncode}: {p.err[-3000:]}"
        d = run(["diff", "-r", src_tree, os.path.join(mp, "copy")], check=False)
        assert d.returncode == 0, f"diff -r after cp -a:\n{d.out[-3000:]}{d.err[-1000:]}"
        assert fs_tree(os.path.join(mp, "copy")) == (files, dirs)
        assert os.stat(os.path.join(mp, "copy/big.bin")).st_size == 20 * MiB
        bt = btgt.tree("copy/")
        assert bt == files, f"bucket after cp -a: missing {sorted(set(files) - set(bt))[:10]}, " \
                            f"wrong {sorted(k for k in files if k in bt and bt[k] != files[k])[:10]}"
        assert btgt.has_marker("copy/empty-dir")

        # tar -x of a tarball (everything but the 20 MB file), with its modes and mtimes
        tb = tmp_path / "t.tar"
        with tarfile.open(tb, "w") as t:
            for n in sorted(os.listdir(src_tree)):
                if n != "big.bin":
                    t.add(os.path.join(src_tree, n), arcname=n)
        os.mkdir(os.path.join(mp, "untar"))
        p = run(["tar", "-xf", str(tb), "-C", os.path.join(mp, "untar")], check=False)
        assert p.returncode == 0 and not p.err, f"tar -x exited {p.returncode}: {p.err[-3000:]}"
        d = run(["diff", "-r", "-x", "big.bin", src_tree, os.path.join(mp, "untar")], check=False)
        assert d.returncode == 0, f"diff -r after tar -x:\n{d.out[-3000:]}"
        bt = btgt.tree("untar/")
        assert bt == {k: v for k, v in files.items() if k != "big.bin"}

        # cp -p of a single file (its chmod/chown/utimens must not fail)
        src = os.path.join(src_tree, "run.sh")
        p = run(["cp", "-p", src, os.path.join(mp, "run-copy.sh")], check=False)
        assert p.returncode == 0 and not p.err, f"cp -p: {p.err}"
        assert read_path(os.path.join(mp, "run-copy.sh")) == read_path(src)
        assert btgt.get("run-copy.sh") == read_path(src)

        # rsync -a (only if installed; tests never install anything)
        if shutil.which("rsync"):
            p = run(["rsync", "-a", src_tree + "/", os.path.join(mp, "rsynced")], check=False)
            assert p.returncode == 0, f"rsync -a exited {p.returncode}: {p.err[-3000:]}"
            d = run(["diff", "-r", src_tree, os.path.join(mp, "rsynced")], check=False)
            assert d.returncode == 0, d.out[-3000:]
        else:
            print("rsync not installed: rsync -a not tested")
    # everything is still there after a remount
    with btgt.mounted() as mp:
        d = run(["diff", "-r", src_tree, os.path.join(mp, "copy")], check=False)
        assert d.returncode == 0, f"diff -r after remount:\n{d.out[-3000:]}"


def test_tools_keep_mtime(tgt, tmp_path):
    """cp -p, cp -a, tar -x and touch -d set a file's mtime (utimensat, often on the open fd
    before close); stat on the mount shows it, also once the 1 s attribute TTL is over
    (right after the tool, the kernel's attribute cache would hide a lost mtime)."""
    want = 1_600_000_000
    src = tmp_path / "s.txt"
    src.write_bytes(b"payload\n")
    os.utime(src, (want, want))
    tb = tmp_path / "t.tar"
    with tarfile.open(tb, "w") as t:
        t.add(src, arcname="from-tar.txt")
    with tgt.mounted() as mp:
        run(["cp", "-p", str(src), os.path.join(mp, "cp-p.txt")])
        run(["cp", "-a", str(src), os.path.join(mp, "cp-a.txt")])
        run(["tar", "-xf", str(tb), "-C", mp])
        run(["touch", "-d", f"@{want}", os.path.join(mp, "touched-new.txt")])
        write_path(os.path.join(mp, "touched-old.txt"), b"x")
        run(["touch", "-d", f"@{want}", os.path.join(mp, "touched-old.txt")])
        names = ["cp-p.txt", "cp-a.txt", "from-tar.txt", "touched-new.txt", "touched-old.txt"]
        time.sleep(2.5)   # past --metadata-ttl 1
        got = {n: int(os.stat(os.path.join(mp, n)).st_mtime) for n in names}
        assert got == dict.fromkeys(names, want), f"mtime shown after each tool (want {want}): {got}"
        assert read_path(os.path.join(mp, "from-tar.txt")) == b"payload\n"


@pytest.mark.slow
def test_large_sequential_dd(btgt, tmp_path):
    """~100 MB written with dd bs=1M (eager multipart upload); md5 via mount and bucket match."""
    src = tmp_path / "big.src"
    with open(src, "wb") as f:
        f.write(os.urandom(100 * MiB + 12345))
    want = file_md5(str(src))
    with btgt.mounted() as mp:
        dst = os.path.join(mp, "big.bin")
        t0 = time.monotonic()
        run(["dd", f"if={src}", f"of={dst}", "bs=1M", "status=none"], timeout=600)
        print(f"{btgt.store}: dd 100 MB in {time.monotonic() - t0:.1f}s")
        assert os.stat(dst).st_size == 100 * MiB + 12345
        got_bucket = btgt.get("big.bin")
        assert len(got_bucket) == 100 * MiB + 12345 and md5(got_bucket) == want, \
            f"bucket holds {len(got_bucket)} bytes md5 {md5(got_bucket)}; wrote md5 {want}"
        del got_bucket
        assert file_md5(dst) == want, "md5 through the mount differs"
        if btgt.store == "s3":
            left = seed.s3_client().list_multipart_uploads(Bucket=btgt.bucket.name).get("Uploads", [])
            assert not left, f"multipart uploads left open: {[u['Key'] for u in left]}"
    with btgt.mounted() as mp:
        assert file_md5(os.path.join(mp, "big.bin")) == want, "md5 after remount differs"


def _git_env(home: str) -> dict:
    env = dict(os.environ)
    env.update(HOME=home, GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.invalid", GIT_TERMINAL_PROMPT="0")
    return env


@pytest.fixture(scope="module")
def git_source(tmp_path_factory):
    """A repository with ~300 files, 4 commits, a binary file and an executable script."""
    if not shutil.which("git"):
        pytest.skip("git not installed")
    import random
    rng = random.Random(99)
    base = tmp_path_factory.mktemp("gitsrc")
    home = base / "home"
    home.mkdir()
    env = _git_env(str(home))
    repo = base / "repo"
    repo.mkdir()
    g = lambda *a: run(["git", "-C", str(repo)] + list(a), env=env)  # noqa: E731
    g("init", "-q", "-b", "main")
    for i in range(280):
        d = repo / "src" / f"mod{i % 12}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"unit{i:03}.txt").write_text("".join(f"line {j} of unit {i} {rng.random()}\n"
                                                   for j in range(rng.randrange(1, 60))))
    (repo / "assets").mkdir()
    (repo / "assets/blob.bin").write_bytes(rng.randbytes(300_000))
    (repo / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    os.chmod(repo / "tool.sh", 0o755)
    g("add", "-A")
    g("commit", "-q", "-m", "one")
    for i in range(0, 280, 6):
        with open(repo / "src" / f"mod{i % 12}" / f"unit{i:03}.txt", "a") as f:
            f.write("changed in two\n")
    for i in range(5, 60, 11):
        (repo / "src" / f"mod{i % 12}" / f"unit{i:03}.txt").unlink()
    for i in range(20):
        (repo / "new").mkdir(exist_ok=True)
        (repo / "new" / f"n{i}.txt").write_text(f"new {i}\n")
    g("add", "-A")
    g("commit", "-q", "-m", "two")
    g("mv", "src/mod3", "src/moved3")
    g("commit", "-q", "-m", "three")
    (repo / "assets/blob.bin").write_bytes(rng.randbytes(310_000))
    g("commit", "-q", "-am", "four")
    commits = g("rev-list", "--reverse", "HEAD").out.split()
    assert len(commits) == 4
    return str(repo), commits, env


@pytest.mark.slow
def test_git_clone_into_mount(btgt, git_source, tmp_path):
    """git clone (300 files, 4 commits, a binary and an executable) into the mount; fsck,
    checkout of an older commit, a clean status, files equal to the source and the bucket."""
    repo, commits, env = git_source
    statuses = {}
    with btgt.mounted() as mp:
        clone = os.path.join(mp, "clone")
        t0 = time.monotonic()
        run(["git", "clone", "-q", "--no-hardlinks", "file://" + repo, clone], env=env, timeout=600)
        print(f"{btgt.store}: git clone in {time.monotonic() - t0:.1f}s")
        run(["git", "-C", clone, "fsck", "--full", "--strict"], env=env, timeout=600)
        head_src, _ = fs_tree(repo, skip={".git"})
        head_clone, _ = fs_tree(clone, skip={".git"})
        assert head_clone == head_src, "checked-out files differ from the source"
        statuses["after clone"] = run(["git", "-C", clone, "status", "--porcelain"], env=env).out

        old = tmp_path / "old"
        old.mkdir()
        arch = run(["git", "-C", repo, "archive", "--format=tar", commits[1]], env=env)
        with open(tmp_path / "old.tar", "wb") as f:
            f.write(arch.stdout)
        run(["tar", "-xf", str(tmp_path / "old.tar"), "-C", str(old)])
        run(["git", "-C", clone, "checkout", "-q", commits[1]], env=env, timeout=600)
        statuses[f"after checkout {commits[1][:8]}"] = run(["git", "-C", clone, "status", "--porcelain"], env=env).out
        old_tree, _ = fs_tree(str(old))
        assert fs_tree(clone, skip={".git"})[0] == old_tree, "older checkout differs from git archive"
        run(["git", "-C", clone, "fsck", "--full"], env=env, timeout=600)
        # the bucket holds the older commit's working tree exactly
        bt = btgt.tree("clone/", skip={".git"})
        assert bt == old_tree, f"bucket worktree: missing {sorted(set(old_tree) - set(bt))[:5]}, " \
                               f"extra {sorted(set(bt) - set(old_tree))[:5]}"
    # a remount sees a sound repository at the same commit
    with btgt.mounted() as mp:
        clone = os.path.join(mp, "clone")
        run(["git", "-C", clone, "fsck", "--full"], env=env, timeout=600)
        assert run(["git", "-C", clone, "rev-parse", "HEAD"], env=env).out.strip() == commits[1]
        assert fs_tree(clone, skip={".git"})[0] == old_tree
    # last, as it depends on file modes (tool.sh is executable in the source)
    assert all(v == "" for v in statuses.values()), f"git status --porcelain not clean: {statuses}"
