"""The disk cache under churn: readers and writers of more files than a small cache holds.

Each file's cache file is written, evicted, passed to the kernel (passthrough), taken over
by writers and given back after their uploads, over and over, from several threads at
once. Every read must give the file's bytes, no call may fail, and at the end the mount
and the bucket must hold each file's last version.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import threading
import time

import pytest

import seed
from conftest import Bucket, require_bin, require_store

MiB = 1024 * 1024
SECS = 12


@pytest.fixture(params=["s3", "gcs"])
def cbucket(request):
    require_store(request.param)
    require_bin()
    b = Bucket(request.param)
    yield b
    b.cleanup()


def test_readers_of_more_files_than_the_cache_holds_get_exact_bytes(cbucket, tmp_path):
    files = {f"f{i}.bin": random.Random(i).randbytes(3 * MiB + i * 4097) for i in range(8)}
    cbucket.put_all(files)
    # 8 MiB holds two of these at once: every few reads evict a file.
    extra = ["--cache-dir", str(tmp_path / "cache"), "--disk-cache-mib", "8", "--memory-cache-mib", "4"]
    errors, done = [], [0]
    with cbucket.mounted(extra=extra) as mp:
        stop = time.monotonic() + SECS

        def reader(seed_: int):
            r = random.Random(seed_)
            while time.monotonic() < stop and len(errors) < 10:
                k = r.choice(list(files))
                path = os.path.join(mp, k)
                try:
                    if r.random() < 0.5:
                        with open(path, "rb") as f:
                            if f.read() != files[k]:
                                errors.append(("whole read differs", k))
                    else:
                        fd = os.open(path, os.O_RDONLY)
                        try:
                            for _ in range(20):
                                off, n = r.randrange(len(files[k])), r.choice([1, 4096, 100_000])
                                if os.pread(fd, n, off) != files[k][off:off + n]:
                                    errors.append(("pread differs", k, off, n))
                        finally:
                            os.close(fd)
                    done[0] += 1
                except OSError as e:
                    errors.append(("error", k, repr(e)))

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    used = sum(os.stat(os.path.join(dp, n)).st_blocks * 512
               for dp, _, names in os.walk(tmp_path / "cache") for n in names)
    assert errors == [], errors
    assert done[0] > 50, f"only {done[0]} reads in {SECS} s"
    # The bound, plus at most the 4 blocks of 2 MiB a put may be writing before it is
    # counted (and evicts).
    assert used <= 16 * MiB, f"{used} bytes on disk for a cache of 8 MiB"


def test_writers_and_readers_of_more_files_than_the_cache_holds(cbucket, tmp_path):
    versions = {f"f{i}.bin": [random.Random(i * 10 + j).randbytes(3 * MiB + j * 4097 + i) for j in range(4)]
                for i in range(6)}
    cbucket.put_all({k: v[0] for k, v in versions.items()})
    last = {k: 0 for k in versions}
    locks = {k: threading.Lock() for k in versions}
    extra = ["--cache-dir", str(tmp_path / "cache"), "--disk-cache-mib", "12", "--memory-cache-mib", "4"]
    errors, done = [], [0]
    with cbucket.mounted(extra=extra) as mp:
        stop = time.monotonic() + SECS

        def reader(seed_: int):
            r = random.Random(seed_)
            while time.monotonic() < stop and len(errors) < 10:
                k = r.choice(list(versions))
                try:
                    with open(os.path.join(mp, k), "rb") as f:
                        f.read()  # a writer may be mid-write: only errors count here
                    done[0] += 1
                except OSError as e:
                    errors.append(("read", k, repr(e)))

        def writer(seed_: int):
            r = random.Random(seed_)
            while time.monotonic() < stop and len(errors) < 10:
                k, j = r.choice(list(versions)), r.randrange(4)
                with locks[k]:
                    try:
                        if r.random() < 0.5:
                            with open(os.path.join(mp, k), "wb") as f:
                                f.write(versions[k][j])
                        else:  # over the cached version: the writer takes its file over
                            with open(os.path.join(mp, k), "r+b") as f:
                                f.write(versions[k][j])
                                f.truncate(len(versions[k][j]))
                        last[k] = j
                        done[0] += 1
                    except OSError as e:
                        errors.append(("write", k, repr(e)))
                time.sleep(0.05)

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
        threads += [threading.Thread(target=writer, args=(100 + i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [], errors
        for k, v in versions.items():
            with open(os.path.join(mp, k), "rb") as f:
                got = f.read()
            assert hashlib.md5(got).hexdigest() == hashlib.md5(v[last[k]]).hexdigest(), f"{k} in the mount"
    for k, v in versions.items():
        assert seed.get(cbucket.store, cbucket.name, k) == v[last[k]], f"{k} in the bucket"
    assert done[0] > 50, f"only {done[0]} operations in {SECS} s"


def test_the_disk_cache_leaves_room_on_its_file_system(s3_bucket, tmp_path):
    """Staging and the disk cache on one 64 MiB file system, as the default layout puts
    both under ~/.cache/bucketfs: reading a 100 MB object filled it to the last block with
    cache (under the 2 GiB bound), and every create then failed with ENOSPC, at every later
    mount too (tester I). The cache now leaves a tenth of its file system free."""
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        big = random.Random(7).randbytes(100 * MiB)
        s3_bucket.put_all({"big": big})
        extra = ["--staging-dir", str(small / "st"), "--cache-dir", str(small / "ca")]
        for mount_no in range(2):  # the second mount finds the cache the first left
            with s3_bucket.mounted(extra=extra) as mp:
                if mount_no == 0:
                    with open(os.path.join(mp, "big"), "rb") as f:
                        assert hashlib.md5(f.read()).digest() == hashlib.md5(big).digest()
                free = shutil.disk_usage(small).free
                assert free >= 6 * MiB, f"mount {mount_no}: {free} bytes left free on a 64 MiB disk"
                data = os.urandom(4 * MiB)
                with open(os.path.join(mp, f"w{mount_no}"), "wb") as f:
                    f.write(data)  # ENOSPC before
                assert seed.get("s3", s3_bucket.name, f"w{mount_no}") == data
    finally:
        subprocess.run(["umount", "-l", str(small)])
