"""Reading through the mount: whole files, random preads, concurrent readers."""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import seed

from conftest import DATA_STORES, Bucket, mount, read_file, require_bin, require_store, run_cli, unmount

MiB = 1024 * 1024
SIZES = [0, 1, 4095, 4096, MiB + 7, 20 * MiB + 12345]


@pytest.fixture(scope="module", params=DATA_STORES)
def read_mount(request):
    """One bucket per store with files of edge-case sizes, mounted once for the module."""
    store = request.param
    require_store(store)
    require_bin()
    rng = random.Random(4242)
    data = {f"sizes/f{n}": rng.randbytes(n) for n in SIZES}
    for i in range(6):
        data[f"many/m{i}.bin"] = rng.randbytes(rng.randrange(200_000, 3 * MiB))
    b = Bucket(store)
    try:
        b.put_all(data)
        with b.mounted() as mp:
            yield store, mp, data
    finally:
        b.cleanup()


def md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


def md5_file(path: str, chunk: int = 128 * 1024) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                return h.hexdigest()
            h.update(b)


@pytest.mark.parametrize("size", SIZES)
def test_whole_file_md5(read_mount, size):
    _, mp, data = read_mount
    key = f"sizes/f{size}"
    path = os.path.join(mp, key)
    assert os.path.getsize(path) == size
    assert md5_file(path) == md5(data[key])


def test_whole_file_single_read(read_mount):
    """One big read() call of a file larger than any plausible read-ahead window."""
    _, mp, data = read_mount
    key = f"sizes/f{MiB + 7}"
    with open(os.path.join(mp, key), "rb", buffering=0) as f:
        got = b""
        while len(got) < len(data[key]):
            chunk = f.read(len(data[key]) + 100)
            if not chunk:
                break
            got += chunk
        assert f.read(10) == b""
    assert len(got) == len(data[key])
    assert got == data[key]


def _pread_cases(rng: random.Random, size: int, n: int) -> list[tuple[int, int]]:
    cases = []
    for i in range(n):
        kind = i % 8
        if kind == 0:      # size 1 anywhere
            off, ln = rng.randrange(0, size), 1
        elif kind == 1:    # spanning a 1 MiB boundary
            b = rng.randrange(1, max(2, size // MiB + 1)) * MiB
            off = max(0, b - rng.randrange(1, 70_000)) | 1
            ln = rng.randrange(2, 200_000)
        elif kind == 2:    # crossing EOF
            off = max(0, size - rng.randrange(1, 5000)) | 1
            ln = rng.randrange(5000, 20_000)
        elif kind == 3:    # entirely past EOF
            off, ln = size + rng.randrange(0, 10 * MiB) | 1, rng.randrange(1, 70_000)
        elif kind == 4:    # large read
            off, ln = rng.randrange(0, size) | 1, rng.randrange(MiB, 3 * MiB)
        else:              # small odd reads
            off, ln = rng.randrange(0, size) | 1, rng.randrange(1, 9000) | 1
        cases.append((off, ln))
    rng.shuffle(cases)
    return cases


def test_random_pread(read_mount, rng):
    _, mp, data = read_mount
    key = f"sizes/f{20 * MiB + 12345}"
    src = data[key]
    fd = os.open(os.path.join(mp, key), os.O_RDONLY)
    try:
        bad = []
        for off, ln in _pread_cases(rng, len(src), 200):
            got = os.pread(fd, ln, off)
            if got != src[off:off + ln]:
                bad.append((off, ln, len(got), len(src[off:off + ln])))
        assert not bad, f"{len(bad)} of 200 preads differ (offset, len, got_len, want_len): {bad[:10]}"
    finally:
        os.close(fd)


@pytest.mark.parametrize("size", [1, 4095, 4096, MiB + 7])
def test_pread_small_files(read_mount, rng, size):
    _, mp, data = read_mount
    key = f"sizes/f{size}"
    src = data[key]
    fd = os.open(os.path.join(mp, key), os.O_RDONLY)
    try:
        for off, ln in _pread_cases(rng, len(src), 40) + [(0, size), (size, 1), (size - 1, 1), (0, size + 1)]:
            assert os.pread(fd, ln, off) == src[off:off + ln], f"pread(len={ln}, off={off})"
    finally:
        os.close(fd)


def test_empty_file_read(read_mount):
    _, mp, _ = read_mount
    with open(os.path.join(mp, "sizes/f0"), "rb") as f:
        assert f.read() == b""
    fd = os.open(os.path.join(mp, "sizes/f0"), os.O_RDONLY)
    try:
        assert os.pread(fd, 10, 0) == b""
        assert os.pread(fd, 10, 12345) == b""
    finally:
        os.close(fd)


def test_concurrent_readers(read_mount):
    """8 threads: some read different files, some the same 20 MiB file, some share one fd."""
    _, mp, data = read_mount
    big = f"sizes/f{20 * MiB + 12345}"
    others = sorted(k for k in data if k.startswith("many/"))
    want = {k: md5(v) for k, v in data.items()}
    shared_fd = os.open(os.path.join(mp, big), os.O_RDONLY)
    start = threading.Barrier(8)

    def whole(key, chunk):
        start.wait(timeout=30)
        return key, md5_file(os.path.join(mp, key), chunk)

    def shared_preads(seed_):
        start.wait(timeout=30)
        r = random.Random(seed_)
        src = data[big]
        for _ in range(60):
            off, ln = r.randrange(0, len(src)), r.randrange(1, 300_000)
            if os.pread(shared_fd, ln, off) != src[off:off + ln]:
                return big, f"pread mismatch at off={off} len={ln}"
        return big, want[big]

    jobs = [(whole, (others[0], 65536)), (whole, (others[1], 4096)), (whole, (others[2], 1 << 20)),
            (whole, (big, 65536)), (whole, (big, 131072)), (whole, (big, 1 << 20)),
            (shared_preads, (1,)), (shared_preads, (2,))]
    try:
        with ThreadPoolExecutor(8) as ex:
            futs = [ex.submit(fn, *a) for fn, a in jobs]
            results = [f.result(timeout=300) for f in futs]
    finally:
        os.close(shared_fd)
    for key, got in results:
        assert got == want[key], f"{key}: {got}"


def _cache_files(cache: str) -> list[str]:
    """The disk cache's data files (one per object version)."""
    return sorted(glob.glob(os.path.join(cache, "*.d")))


def _cached_whole(cache: str, data: bytes, timeout: float = 10.0) -> str:
    """The data file holding all of `data`, once it does (writes are asynchronous)."""
    deadline = time.monotonic() + timeout
    while True:
        for p in _cache_files(cache):
            with open(p, "rb") as f:
                if f.read() == data:
                    return p
        assert time.monotonic() < deadline, "the disk cache did not write every block of the file"
        time.sleep(0.1)


def _disk_bytes(path: str) -> int:
    """Bytes a directory's files take on disk (allocated blocks, not lengths)."""
    return sum(os.stat(os.path.join(path, n)).st_blocks * 512 for n in os.listdir(path))


@pytest.mark.parametrize("store", ["s3", "gcs"])
def test_an_object_replaced_after_its_listing_reads_new_at_the_next_open(store, tmp_path):
    """Another client replaces an object this mount has listed (its old version known, its
    bytes never read). The open within the TTL still names the listed version, whose GET
    fails: that read may fail with ESTALE (SEMANTICS.md), but the next open reads the new
    version. Before, every open's read failed for the whole TTL (tester F: 26 reads in a
    row over 60 s in write-back mode); the TTL here is 300 s."""
    require_store(store)
    require_bin()
    b = Bucket(store)
    try:
        b.put("d/f.txt", b"version-1")
        with b.mounted(extra=["--metadata-ttl", "300", "--cache-dir", str(tmp_path / "cache")]) as mp:
            assert os.listdir(os.path.join(mp, "d")) == ["f.txt"]
            b.put("d/f.txt", b"version-2 longer")
            got = []
            for _ in range(3):
                try:
                    with open(os.path.join(mp, "d", "f.txt"), "rb") as f:
                        got.append(f.read())
                except OSError as e:
                    got.append(e.errno)
            assert got[-1] == b"version-2 longer", f"reads after the replacement: {got}"
            assert got.count(b"version-2 longer") >= 2, f"more than one read failed: {got}"
    finally:
        b.cleanup()


@pytest.mark.parametrize("store", ["s3", "gcs"])
def test_an_object_deleted_after_its_listing_is_gone_at_the_next_open(store, tmp_path):
    """Another client deletes an object this mount has listed and read from. A read of it
    may fail with ESTALE (SEMANTICS.md); the next open fails with ENOENT. Before, every open
    failed with ESTALE for the whole TTL (tester H: 60 s); the TTL here is 300 s."""
    require_store(store)
    require_bin()
    b = Bucket(store)
    try:
        data = random.Random(3).randbytes(3 * MiB)
        b.put("d/f.bin", data)
        with b.mounted(extra=["--metadata-ttl", "300", "--disk-cache-mib", "0", "--memory-cache-mib", "0"]) as mp:
            p = os.path.join(mp, "d", "f.bin")
            assert os.listdir(os.path.join(mp, "d")) == ["f.bin"]
            with open(p, "rb") as f:
                assert f.read(4096) == data[:4096]
            seed.delete(store, b.name, "d/f.bin")
            got = []
            for _ in range(3):
                try:
                    with open(p, "rb") as f:
                        f.seek(2 * MiB)
                        got.append(len(f.read(4096)))
                except OSError as e:
                    got.append(errno.errorcode.get(e.errno, e.errno))
            assert got[-1] == "ENOENT" and got.count("ESTALE") <= 1, f"opens after the delete: {got}"
    finally:
        b.cleanup()


@pytest.mark.parametrize("store", ["s3", "gcs"])
def test_a_create_over_a_name_another_client_deleted_makes_the_file(store):
    """Another client deletes a file this mount has read, within the mount's TTL; `touch`
    and `>>` (opens with `O_CREAT`, no `O_TRUNC`) then make the file anew, as on a local
    disk. They failed with ENOENT for the whole TTL (tester J: 60 s), as if the directory
    were missing; `echo > f` (`O_TRUNC`) worked at once."""
    require_store(store)
    require_bin()
    b = Bucket(store)
    try:
        b.put("f", b"payload\n")
        with b.mounted(extra=["--metadata-ttl", "300"]) as mp:
            p = os.path.join(mp, "f")
            for flags, what in ((os.O_WRONLY | os.O_CREAT, "touch"), (os.O_WRONLY | os.O_APPEND | os.O_CREAT, ">>")):
                assert read_file(p) in (b"payload\n", b"x"), what
                seed.delete(store, b.name, "f")
                try:
                    fd = os.open(p, flags)
                except OSError as e:
                    pytest.fail(f"{what} of a name deleted elsewhere: {errno.errorcode.get(e.errno, e.errno)}")
                os.write(fd, b"x")
                os.close(fd)
                assert seed.get(store, b.name, "f") == b"x", what
    finally:
        b.cleanup()


def test_random_reads_after_a_remount_come_from_the_disk_cache(bucket, tmp_path):
    """A file read once is in --cache-dir. On a new mount (an empty memory cache, no page
    cache) random preads of it, as when the kernel has dropped some of its pages, make no
    store request: every block comes from the disk cache, with the right bytes."""
    data = random.Random(78).randbytes(7 * MiB + 5)  # four blocks, the last one short
    bucket.put_all({"r.bin": data})
    cache = str(tmp_path / "cache")
    with bucket.mounted(extra=["--cache-dir", cache]) as mp:
        assert md5_file(os.path.join(mp, "r.bin")) == md5(data)
        _cached_whole(cache, data)
    rng = random.Random(5)
    with bucket.mounted(extra=["--cache-dir", cache, "--passthrough", "off"]) as mp:
        fd = os.open(os.path.join(mp, "r.bin"), os.O_RDONLY)
        try:
            before = json.loads(run_cli(["status", "--json", mp]).out)["requests"]
            for _ in range(20):
                n = rng.choice([1, 4096, 65536])
                off = rng.randrange(len(data) - n + 1)  # within the file (see SEMANTICS.md)
                assert os.pread(fd, n, off) == data[off:off + n], off
            after = json.loads(run_cli(["status", "--json", mp]).out)["requests"]
        finally:
            os.close(fd)
    assert after == before, f"{after - before} store requests for random reads of cached blocks"


def test_a_cold_read_stores_each_byte_once(bucket, tmp_path):
    """One file per object version: a cold read writes the object's bytes to the disk cache
    once (no second, whole-object copy), and the second open reads that same file. Caches
    of older formats in --cache-dir are removed at mount, never read."""
    data = random.Random(79).randbytes(48 * MiB + 4097)
    bucket.put_all({"once.bin": data})
    cache = tmp_path / "cache"
    cache.mkdir()
    old = ["0123456789abcdef0123456789abcdef.b3", "0123456789abcdef0123456789abcdef.00c0ffee.w", "7.spare"]
    for n in old:
        (cache / n).write_bytes(b"\0" * 8192)
    with bucket.mounted(extra=["--cache-dir", str(cache)]) as mp:
        assert [n for n in old if (cache / n).exists()] == [], "old-format cache files left"
        path = os.path.join(mp, "once.bin")
        assert md5_file(path) == md5(data)
        kept = _cached_whole(str(cache), data)
        time.sleep(1)  # what the close starts in the background (nothing more to write)
        assert _cache_files(str(cache)) == [kept], "more than one file for one version"
        used = _disk_bytes(str(cache))
        assert used <= len(data) * 1.02 + 64 * 1024, f"{used} bytes on disk for {len(data)} read"
        ino = os.stat(kept).st_ino
        assert md5_file(path) == md5(data)
        assert os.stat(kept).st_ino == ino and _disk_bytes(str(cache)) == used, "the second read wrote again"


def test_an_object_too_large_for_the_disk_cache_streams_uncached(bucket, tmp_path):
    """A sequential read of an object larger than the disk cache can hold writes nothing to
    it (it would only evict everything else) and reads the right bytes; a small object read
    after it is still cached."""
    big, small = random.Random(80).randbytes(24 * MiB + 1), random.Random(81).randbytes(3 * MiB)
    bucket.put_all({"big.bin": big, "small.bin": small})
    cache = str(tmp_path / "cache")
    with bucket.mounted(extra=["--cache-dir", cache, "--disk-cache-mib", "16"]) as mp:
        assert md5_file(os.path.join(mp, "big.bin")) == md5(big)
        time.sleep(1)
        assert _cache_files(cache) == [], "a part of the large object was cached"
        st = json.loads(run_cli(["status", "--json", mp]).out)
        assert st["disk_cache_bytes"] == 0, st
        assert md5_file(os.path.join(mp, "small.bin")) == md5(small)
        _cached_whole(cache, small)


def test_disk_cache_serves_a_remount_and_refetches_corrupted_blocks(bucket, tmp_path):
    """Each block read lands in the version's file in --cache-dir, its checksum in the
    sidecar. After a byte of two of its blocks is flipped, a remount still reads the right
    bytes (the checksums catch it, and the file is refetched), and the cache file is
    written again intact."""
    data = random.Random(77).randbytes(5 * MiB + 123)  # three blocks, the last one short
    bucket.put_all({"big.bin": data})
    cache = str(tmp_path / "cache")
    with bucket.mounted(extra=["--cache-dir", cache]) as mp:
        assert md5_file(os.path.join(mp, "big.bin")) == md5(data)
        kept = _cached_whole(cache, data)
    with open(kept, "r+b") as f:
        for at in (100, 2 * MiB + 100):
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0xFF]))
    for passthrough in ("on", "off"):
        with bucket.mounted(extra=["--cache-dir", cache, "--passthrough", passthrough]) as mp:
            assert md5_file(os.path.join(mp, "big.bin")) == md5(data), f"a corrupted block was served ({passthrough})"
            _cached_whole(cache, data)
        if passthrough == "on":
            with open(_cached_whole(cache, data), "r+b") as f:
                f.seek(4 * MiB + 5)
                b = f.read(1)
                f.seek(4 * MiB + 5)
                f.write(bytes([b[0] ^ 0xFF]))


def test_two_mounts_sharing_a_cache_dir_read_their_own_files(bucket, tmp_path):
    """Two mounts of one bucket (the default cache directory is per bucket) read the same
    object at once, twice each: the second mount caches in a directory of its own, so
    neither cuts the other's file, and every read (passthrough the second time) is exact."""
    data = random.Random(82).randbytes(12 * MiB + 3)
    bucket.put_all({"s.bin": data})
    cache = str(tmp_path / "cache")
    with bucket.mounted(extra=["--cache-dir", cache]) as one, \
            bucket.mounted(extra=["--cache-dir", cache]) as two:
        for _ in range(2):
            with ThreadPoolExecutor(2) as ex:
                got = list(ex.map(lambda mp: md5_file(os.path.join(mp, "s.bin")), [one, two]))
            assert got == [md5(data)] * 2
        assert os.path.isdir(os.path.join(cache, "mount-1")), "the second mount shared the first's directory"
        _cached_whole(cache, data)
        _cached_whole(os.path.join(cache, "mount-1"), data)


@pytest.mark.skipif(not os.access("/proc/sys/vm/drop_caches", os.W_OK), reason="needs root")
def test_a_new_mem_mount_never_reads_an_earlier_ones_bytes_from_the_cache(tmp_path):
    """Two `mem://` mounts one after the other, one disk cache (the default shares one for
    every `mem://` mount): each writes `x` with bytes of its own, same size, and reads it
    back from the store. The second read the first mount's bytes: every mount's first
    version of a key was `mem-1`, and the cache names a file by key and version (tester M,
    3 of 3)."""
    for mark in (b"A", b"B"):
        mp = mount(["mem://", "--staging-dir", str(tmp_path / f"st{mark.decode()}"),
                    "--cache-dir", str(tmp_path / "cache"), "--memory-cache-mib", "0"])
        try:
            with open(os.path.join(mp, "x"), "wb") as f:
                f.write(mark * 600_000)  # under passthrough's whole-file size: read through the caches
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")
            with open(os.path.join(mp, "x"), "rb") as f:
                got = f.read()
            assert got == mark * 600_000, f"mount {mark!r} read {got[:5]!r}... back"
        finally:
            unmount(mp)
