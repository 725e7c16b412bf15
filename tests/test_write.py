"""The write path through the kernel: data and durability.

Every test writes through a real mount and, for the bucket-backed stores (s3 = MinIO,
gcs = fake-gcs-server, file, gdrive = the Drive emulator), checks what the bucket holds with
the independent clients in scripts/seed.py. mem:// joins where a check does not need a second
client or a remount. Namespace changes are in test_namespace.py, real tools in test_tools.py.

The contract (crates/core/src/write.rs, fs_write.rs, fs_rename.rs):
  - writes are staged locally; reads of a staged file see them, from any handle;
  - close (flush) and fsync upload, and return only once the store has the object;
  - truncate(2) by path uploads at once; unmount uploads whatever is still dirty.
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import subprocess
import time

import pytest

import seed
from conftest import MiB, daemon_pids, is_mounted, md5, mount, read_file, run_cli, unmount, wait_until
import writekit
from writekit import KiB, apply_write, fs_tree, make_existing, read_fd, run, write_path

btgt = writekit.btgt  # a fixture
tgt = writekit.tgt  # a fixture


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
            assert md5(read_file(p)) == md5(model)
    if tgt.persistent:
        with tgt.mounted() as mp:
            for name, model in models.items():
                got = read_file(os.path.join(mp, name))
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
        assert md5(read_file(p)) == md5(model)


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
        assert read_file(p) == first + second
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
        assert read_file(p) == base[:1000] + b"\0" * 4000
        if tgt.persistent:
            assert tgt.get("path.bin") == base[:1000] + b"\0" * 4000
        os.truncate(p, 0)
        assert os.stat(p).st_size == 0 and read_file(p) == b""
        if tgt.persistent:
            assert tgt.get("path.bin") == b""

        # O_TRUNC with new content
        p = os.path.join(mp, "otrunc.bin")
        write_path(p, b"replaced")
        assert read_file(p) == b"replaced"
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
            assert read_file(os.path.join(mp, "otrunc.bin")) == b"replaced"
            assert os.stat(os.path.join(mp, "otrunc-empty.bin")).st_size == 0
            assert md5(read_file(os.path.join(mp, "ft.bin"))) == md5(model)


def test_read_only_o_trunc_empties_a_file_but_spares_a_running_program(tgt):
    """open(O_RDONLY|O_TRUNC) empties a file, as on Linux. A running program's file fails
    with ETXTBSY and stays whole, and the program keeps running: the kernel checks that only
    after asking us, having already dropped the file's pages (fuse/src/running.rs)."""
    with open(shutil.which("sleep"), "rb") as f:
        prog = f.read()
    with tgt.mounted() as mp:
        p = os.path.join(mp, "prog")
        write_path(p, prog)
        os.chmod(p, 0o755)
        proc = subprocess.Popen([p, "30"])
        try:
            with pytest.raises(OSError) as e:
                os.close(os.open(p, os.O_RDONLY | os.O_TRUNC))
            assert e.value.errno == errno.ETXTBSY
            time.sleep(0.3)
            assert proc.poll() is None, f"the running program ended: {proc.returncode}"
        finally:
            proc.kill()
            proc.wait()
        assert os.stat(p).st_size == len(prog)
        assert md5(read_file(p)) == md5(prog)
        os.close(os.open(p, os.O_RDONLY | os.O_TRUNC))
        assert os.stat(p).st_size == 0
        if tgt.persistent:
            assert tgt.get("prog") == b"", "the emptied file reached the bucket at close"


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
        assert read_file(p) == expect
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
        assert read_file(p) == expect
        write_path(p, b"line5\n", "ab")
        expect += b"line5\n"
        assert read_file(p) == expect
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
        assert md5(read_file(p)) == md5(model)
        if tgt.persistent:
            assert md5(tgt.get("mid.bin")) == md5(model)
    if tgt.persistent:
        with tgt.mounted() as mp:
            assert read_file(os.path.join(mp, "log.txt")) == expect
            assert md5(read_file(os.path.join(mp, "mid.bin"))) == md5(model)


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
        assert md5(read_file(p)) == md5(model), "the mount does not show the mmap writes"
        p2 = run_cli(["unmount", mp], timeout=120)
        assert p2.returncode == 0, p2.err
    finally:
        unmount(mp)
    got = btgt.get("mapped.bin")
    assert len(got) == size and md5(got) == md5(model), \
        f"after unmount the bucket holds {len(got)} bytes, {'all zero' if got == bytes(len(got)) else 'not the mmap writes'}"


def _libc_map(fd: int, size: int):
    """A shared writable mapping made with libc itself: Python's mmap dups the fd, which
    keeps the file open and hides what a program that closes its fd sees."""
    import ctypes
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    return libc, addr


@pytest.mark.parametrize("mode", ["durable", "write-back"])
def test_a_mapping_written_after_its_fd_closed_reaches_the_bucket(btgt, rng, mode):
    """As a linker writes its output: open, ftruncate, mmap, close the fd, write through the
    mapping, msync, munmap. With passthrough the kernel maps the staged file itself, so the
    last release came before the writes: the bucket kept the zeros of the ftruncate."""
    import ctypes
    size = 4 * MiB
    model = rng.randbytes(size)
    extra = ["--write-back"] if mode == "write-back" else []
    mp = mount(btgt.args() + extra)
    try:
        p = os.path.join(mp, "a.out")
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o755)
        os.ftruncate(fd, size)
        libc, addr = _libc_map(fd, size)
        os.close(fd)
        time.sleep(0.5)                    # the last RELEASE is handled before the writes
        ctypes.memmove(addr, model, size)
        assert libc.msync(addr, size, 4) == 0  # MS_SYNC
        assert libc.munmap(addr, size) == 0
        assert md5(read_file(p)) == md5(model), "the mount does not show the mapped writes"
        p2 = run_cli(["unmount", mp], timeout=120)
        assert p2.returncode == 0, p2.err
    finally:
        unmount(mp)
    got = btgt.get("a.out")
    assert len(got) == size and md5(got) == md5(model), \
        f"the bucket holds {len(got)} bytes, {'all zero' if got == bytes(len(got)) else 'not the mapped writes'}"


def test_files_open_past_the_mounts_descriptor_limit_fail_with_enfile(s3_bucket):
    """Each file open for writing holds descriptors of the mount process. Past its limit an
    open for writing failed with a bare EIO (tester F, `ulimit -n 256`); it fails with
    ENFILE ("too many open files in system") now. Once they are closed, every file that
    opened is in the bucket with its bytes."""
    import conftest
    mp = conftest.new_mountpoint()
    conftest._live_mounts.add(mp)
    argv = ["prlimit", "--nofile=128:128", conftest.require_bin(), "mount", s3_bucket.args()[0], mp,
            *s3_bucket.args()[1:]]
    r = subprocess.run(argv, env=conftest.bucketfs_env(), stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    files, errs, closing = [], [], []
    try:
        for i in range(150):
            try:
                f = open(os.path.join(mp, f"f{i}"), "wb", buffering=0)
            except OSError as e:
                errs.append(e.errno)
                continue
            f.write(b"x" * (i + 1))
            files.append((i, f))
        assert errs, "150 files opened under a limit of 128 descriptors (the test needs it reached)"
        assert set(errs) == {errno.ENFILE}, f"errors past the limit: {sorted(set(errs))}"
        for _, f in files:
            try:
                f.close()
            except OSError as e:
                closing.append(e.errno)
        print(f"{len(files)} files opened, {len(errs)} refused; closes that failed: {closing}")
        assert run_cli(["sync", mp], timeout=120).returncode == 0
        for i, _ in files:
            assert seed.get("s3", s3_bucket.name, f"f{i}") == b"x" * (i + 1), f"f{i} is not in the bucket"
    finally:
        for _, f in files:
            if not f.closed:
                try:
                    f.close()
                except OSError:
                    pass
        unmount(mp)
