"""Concurrency on real mounts (MinIO): two clients writing one key, 16 threads of mixed I/O,
parallel namespace changes in one directory, and the daemon's memory while all that runs.

SEMANTICS.md: two clients writing the same key -> the last close wins, whole-object; a read
belongs to the version seen at open (ESTALE otherwise), never a mix; read your writes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import random
import shutil
import struct
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
import time

import pytest

import seed
from conftest import (MNT_ROOT, MiB, daemon_pids, daemon_status, mount, read_file, unmount,
                      wait_until, write_file)
HANG_LIMIT = 200
# Peak RSS the daemon may reach under the 16-thread load, from its defaults: 48 MiB memory
# cache + 96 MiB prefetch budget + 11 files uploading at once x 4 parts x 8 MiB = 496 MiB,
# plus slack for write-through copies and allocator overhead. Catches a leak or a whole-file
# buffer (10 threads x 17 MiB files, 40 s of churn).
RSS_LIMIT_MIB = 768
# a mount must show another client's change within the TTL (1 s); allow 1.5 s of slack
CONVERGE_S = 2.5


def _staging_report(staging: str) -> list[str]:
    """Each file left in staging, with the text of the small ones (key, marker)."""
    out = []
    for root, _, fs in os.walk(staging):
        for f in fs:
            p = os.path.join(root, f)
            try:
                size = os.path.getsize(p)
                text = open(p, "rb").read(200) if not f.endswith(".data") else b""
            except OSError as e:
                size, text = -1, repr(e).encode()
            out.append(f"{f} ({size} bytes) {text!r}")
    return out


@contextlib.contextmanager
def s3_mount(bucket: str, extra=()):
    work = tempfile.mkdtemp(prefix="bfs-conc-", dir=os.path.dirname(MNT_ROOT.rstrip("/")) or None)
    staging, log = os.path.join(work, "staging"), os.path.join(work, "bucketfs.log")
    os.makedirs(staging)
    mp = mount([seed.mount_url("s3", bucket), "--endpoint", seed.S3_ENDPOINT,
                "--staging-dir", staging, "--log-file", log] + list(extra))
    try:
        yield mp, staging, log
    except BaseException:
        print(f"---- bucketfs log ({mp}) ----\n" + log_problems(log))
        raise
    finally:
        unmount(mp)
        shutil.rmtree(work, ignore_errors=True)


def log_problems(log: str, n: int = 30) -> str:
    """The last WARN/ERROR lines of a bucketfs log (without fuser's 'Not Implemented')."""
    try:
        with open(log, errors="replace") as f:
            lines = [ln[:400] for ln in f if (" WARN " in ln or " ERROR " in ln) and "Not Implemented" not in ln]
    except OSError:
        return ""
    return "".join(lines[-n:])


def pattern(tag: int, size: int) -> bytes:
    """A large pattern whose every 4 KiB block names its writer (`tag`) and position, so
    a mix of two patterns, a shifted block or a hole shows up."""
    blocks = []
    for i in range((size + 4095) // 4096):
        head = struct.pack("<QQ", tag, i)
        blocks.append((head * 256)[:4096])
    return b"".join(blocks)[:size]


def block_tags(buf: bytes) -> set[int]:
    """The writer tags found in `buf`; raises AssertionError on a malformed block."""
    tags = set()
    for i in range(0, len(buf), 4096):
        blk = buf[i:i + 4096]
        tag, idx = struct.unpack("<QQ", blk[:16])
        assert idx == i // 4096, f"block at {i} claims index {idx}"
        assert blk == (blk[:16] * 256)[:len(blk)], f"block at {i} is torn"
        tags.add(tag)
    return tags


# --------------------------------------------------------------------------- two writers

def test_two_mounts_same_key_last_close_wins(s3_bucket):
    """Two mounts write the same key; the one that closes last wins, whole-object."""
    size = 20 * MiB + 12345
    a, b_ = pattern(0xA, size), pattern(0xB, size)
    with s3_mount(s3_bucket.name) as (m1, _, _), s3_mount(s3_bucket.name) as (m2, _, _):
        for first, second, want in (((m1, a), (m2, b_), b_), ((m2, b_), (m1, a), a)):
            f1 = open(os.path.join(first[0], "k.bin"), "wb")
            f2 = open(os.path.join(second[0], "k.bin"), "wb")
            for i in range(0, size, MiB):  # interleaved writes, both uploads in flight
                f1.write(first[1][i:i + MiB])
                f2.write(second[1][i:i + MiB])
            f1.close()
            time.sleep(0.2)
            f2.close()
            held = seed.get("s3", s3_bucket.name, "k.bin")
            assert len(held) == size and block_tags(held) == block_tags(want), \
                f"bucket holds tags {block_tags(held)} after the later close wrote {block_tags(want)}"
            assert held == want


def test_two_mounts_racing_reader_never_sees_a_mix(s3_bucket):
    """Two mounts replace the same 20 MiB key with distinct patterns again and again while a
    third mount reads it: every complete read is exactly one pattern (or ESTALE), and the
    final object is exactly one of the two."""
    size = 20 * MiB
    pats = {0xA: pattern(0xA, size), 0xB: pattern(0xB, size), 0xC: pattern(0xC, size)}
    s3_bucket.put("k.bin", pats[0xC])
    stop = threading.Event()
    errors: list[str] = []
    reads = {"whole": 0, "estale": 0, "partial": 0}

    def writer(mp, tag, rounds):
        try:
            for _ in range(rounds):
                write_file(os.path.join(mp, "k.bin"), pats[tag])
        except Exception as e:  # noqa: BLE001
            errors.append(f"writer {tag:x}: {e!r}")

    def is_partial(got: bytes) -> bool:
        if not got:
            return True
        p = pats.get(struct.unpack("<Q", got[:8])[0]) if len(got) >= 8 else None
        return p is not None and len(got) < size and len(got) % MiB == 0 and p.startswith(got)

    def reader(mp):
        while not stop.is_set():
            try:
                got = read_file(os.path.join(mp, "k.bin"))
            except OSError as e:
                if e.errno == errno.ESTALE:
                    reads["estale"] += 1
                    continue
                errors.append(f"reader: {e!r}")
                return
            if is_partial(got):
                # an empty object or a whole-MiB prefix of one pattern: what a release that
                # uploaded the next open's half-rewritten staged file used to publish
                errors.append(f"reader saw a partial object of {len(got)} bytes")
                return
            try:
                tags = block_tags(got)
            except AssertionError as e:
                errors.append(f"reader: malformed content: {e}")
                return
            if len(got) != size or len(tags) != 1:
                errors.append(f"reader saw a mix: {len(got)} bytes, writers {sorted(tags)}")
                return
            reads["whole"] += 1

    with s3_mount(s3_bucket.name) as (m1, _, _), s3_mount(s3_bucket.name) as (m2, _, _), \
            s3_mount(s3_bucket.name, ["--metadata-ttl", "0"]) as (m3, _, _):
        ths = [threading.Thread(target=writer, args=(m1, 0xA, 4), daemon=True),
               threading.Thread(target=writer, args=(m2, 0xB, 4), daemon=True)]
        rd = threading.Thread(target=reader, args=(m3,), daemon=True)
        rd.start()
        for t in ths:
            t.start()
        for t in ths:
            t.join(HANG_LIMIT)
            assert not t.is_alive(), "a writer is stuck"
        stop.set()
        rd.join(HANG_LIMIT)
        assert not rd.is_alive(), "the reader is stuck"
        print(f"reader: {reads['whole']} whole reads, {reads['estale']} ESTALE, {reads['partial']} empty/partial")
        assert not errors, errors
        held = seed.get("s3", s3_bucket.name, "k.bin")
        assert held in (pats[0xA], pats[0xB]), f"final object has writers {block_tags(held)}"
        # every mount converges on the bucket's object once the TTL (1 s) has passed
        t_end = time.monotonic()
        for name, mp in (("writer A's mount", m1), ("writer B's mount", m2), ("reader's mount", m3)):
            stale_for = None
            while True:
                try:
                    got = read_file(os.path.join(mp, "k.bin"))
                except OSError as e:
                    # Within the TTL an open may pin the version this mount last knew (its
                    # own upload), which the other writer's replaced: its read is ESTALE,
                    # as SEMANTICS says. Not converged yet, like a stale read.
                    if e.errno != errno.ESTALE:
                        raise
                    got = b""
                waited = time.monotonic() - t_end
                if got == held:
                    break
                stale_for = waited
                if waited > 12:
                    break
                time.sleep(0.25)
            print(f"{name}: stale for {stale_for or 0:.1f}s after the last close")
            assert got == held, (f"{name} still reads writer(s) {sorted(block_tags(got))} "
                                 f"{waited:.0f}s after the last close; the bucket holds {sorted(block_tags(held))}")
            assert stale_for is None or stale_for < CONVERGE_S, \
                (f"{name} read writer(s) other than the bucket's {sorted(block_tags(held))} for "
                 f"{stale_for:.1f}s after the last close (TTL 1 s)")


def test_open_trunc_keeps_the_old_object_until_close(s3_bucket):
    """SEMANTICS: O_TRUNC is staged; the object changes at close. Another client must keep
    seeing the old object while a writer holds the file open with O_TRUNC."""
    s3_bucket.put("k.txt", b"old content")
    with s3_mount(s3_bucket.name) as (mp, _, _):
        f = open(os.path.join(mp, "k.txt"), "wb")  # O_WRONLY|O_CREAT|O_TRUNC
        try:
            f.write(b"new")
            f.flush()
            during = seed.get("s3", s3_bucket.name, "k.txt")
        finally:
            f.close()
        assert seed.get("s3", s3_bucket.name, "k.txt") == b"new"
        assert during == b"old content", \
            f"while open(O_TRUNC) was in progress the bucket held {during!r}, not the old object"


def test_rewrite_loop_never_publishes_a_partial_object(s3_bucket):
    """One thread of one mount rewrites a key (open O_TRUNC, one write, close) in a loop while
    an independent client HEADs it: the bucket must only ever hold a complete version (close
    publishes whole objects; SEMANTICS: O_TRUNC is staged). The kernel sends RELEASE without
    waiting for it, so it races the next OPEN."""
    sizes_written = (100_000, 4 * MiB, 20 * MiB)
    s3_bucket.put("k.bin", b"C" * 100)
    complete = {100} | set(sizes_written)
    with s3_mount(s3_bucket.name) as (mp, _, _):
        path = os.path.join(mp, "k.bin")
        bad: list[str] = []
        errs: list[str] = []
        polls = [0]
        stop = threading.Event()

        def poll():
            cl = seed.s3_client()
            while not stop.is_set():
                n = cl.head_object(Bucket=s3_bucket.name, Key="k.bin")["ContentLength"]
                polls[0] += 1
                if n not in complete:
                    bad.append(f"the bucket held a {n}-byte object")
                    stop.set()

        pt = threading.Thread(target=poll, daemon=True)
        pt.start()
        t0 = time.monotonic()
        rewrites = 0
        for size in sizes_written:
            data = b"x" * size
            t_size = time.monotonic()
            while not stop.is_set() and time.monotonic() - t_size < 6:
                step = "open"
                fd = None
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                    step = "write"
                    os.write(fd, data)
                    step = "close"
                    fd, _fd = None, fd
                    os.close(_fd)
                except OSError as e:
                    errs.append(f"{step} of a {size}-byte rewrite: {e!r}")
                    if fd is not None:
                        with contextlib.suppress(OSError):
                            os.close(fd)
                    stop.set()
                rewrites += 1
        stop.set()
        pt.join(30)
        print(f"{rewrites} rewrites, {polls[0]} HEADs in {time.monotonic() - t0:.0f}s; {bad[:3]} {errs[:3]}")
        assert not errs, errs[:3]
        assert not bad, bad[:3]


def test_same_mount_reader_racing_rewrites_never_sees_zeros(s3_bucket):
    """One thread rewrites a file (O_TRUNC, one write, close) in a loop; three threads of the
    same mount read it whole. A whole-file read is several read(2) calls, so (as on a local
    disk, where this test also sees it) it may join pages of consecutive versions; but every
    page must be a page some writer wrote: never zero-filled pages nobody wrote (the kernel
    zero-fills after a short read, which an O_TRUNC applied too early used to cause).

    One exception is the kernel's own: a version's last page holds zeros past its end, and
    the generic page-cache read (filemap_read) checks the file's size only after it took its
    pages, so when the next version grows the file in between, the read returns that last
    page whole, zeros included. Such a page (a version's bytes up to its end, then only
    zeros) is accepted and counted; zeros starting anywhere else are not."""
    def size_of(g):
        return random.Random(g).choice([10_000, 700_000]) if g else 1000

    def rec(g, n):
        body = random.Random(g).randbytes(n)
        return struct.pack("<QQQ", 7, g, n) + hashlib.md5(body).digest() + body

    with s3_mount(s3_bucket.name) as (mp, _, _):
        path = os.path.join(mp, "f.bin")
        write_file(path, rec(0, 1000))
        stop = threading.Event()
        bad: list[str] = []
        nreads = [0]
        tails = [0]

        def w():
            g = 0
            while not stop.is_set():
                g += 1
                write_file(path, rec(g, size_of(g)))

        def r():
            while not stop.is_set():
                got = read_file(path)
                nreads[0] += 1
                if len(got) < 24:
                    continue
                _, g, n = struct.unpack("<QQQ", got[:24])
                if g == 0 and n == 0 and not any(got[:40]):
                    bad.append("zero header")
                    stop.set()
                    continue
                if rec(g, n).startswith(got):
                    continue
                # Joined versions: each page must be the same page of some version (a page
                # copied while a writer changed it may be torn, on a local disk too: then each
                # 8-byte word must be one some version holds at that offset).
                near = [rec(h, size_of(h)) for h in range(max(0, g - 50), g + 51)]
                for i in range(0, len(got), 4096):
                    page = got[i:i + 4096]
                    # The last page of a read may be partial (a read during a write sees
                    # the prefix written so far): compare only the bytes it has.
                    if any(v[i:i + len(page)] == page for v in near):
                        continue
                    if any(i < len(v) < i + len(page) and page == v[i:].ljust(len(page), b"\0") for v in near):
                        tails[0] += 1  # a version's last page, read as the next one grew the file
                        continue
                    words_ok = all(any(v[j:j + len(w)] == w for v in near)
                                   for j in range(i, i + len(page), 8)
                                   for w in [page[j - i:j - i + 8]])
                    if not words_ok:
                        zero = not any(page)
                        zeros_from = i + len(page.rstrip(b"\0"))
                        bad.append(f"{len(got)}-byte read, page {i // 4096} ({'all zero' if zero else 'unknown bytes'}, "
                                   f"zeros from byte {zeros_from}), header gen={g}")
                        stop.set()
                        break

        ths = [threading.Thread(target=w, daemon=True)] + [threading.Thread(target=r, daemon=True) for _ in range(3)]
        for t in ths:
            t.start()
        stop.wait(30)
        stop.set()
        for t in ths:
            t.join(HANG_LIMIT)
        print(f"{nreads[0]} reads; last pages read with the next version's size: {tails[0]}; bad: {bad[:3]}")
        assert not bad, bad[:3]


# --------------------------------------------------------------------------- 16 threads

def _rec(tag: int, gen: int, size: int) -> bytes:
    """Self-describing content: header (tag, gen, size, md5 of the body) + deterministic body."""
    body = random.Random(tag * 1_000_003 + gen).randbytes(size)
    return struct.pack("<QQQ", tag, gen, size) + hashlib.md5(body).digest() + body


def _is_rec_prefix(buf: bytes) -> bool:
    """`buf` is a proper, non-empty prefix of one whole record `_rec` makes."""
    if len(buf) < 40:
        return False
    tag, gen, size = struct.unpack("<QQQ", buf[:24])
    if size > 64 * MiB or len(buf) >= 40 + size:
        return False
    return _rec(tag, gen, size).startswith(buf)


def _check_rec(buf: bytes) -> tuple[int, int]:
    tag, gen, size = struct.unpack("<QQQ", buf[:24])
    body = buf[40:]
    assert len(body) == size and hashlib.md5(body).digest() == buf[24:40], \
        f"record tag={tag} gen={gen}: {len(body)} of {size} bytes or checksum mismatch"
    return tag, gen


def test_idle_open_handles_keep_bounded_memory(s3_bucket):
    """250 handles open at once, each after a 4 KiB read of its own 2 MiB file, then closed
    together. Each handle used to keep the first block it read (2 MiB) for as long as it
    stayed open (500 MB here), and the closes each fetched the rest of their files for the
    disk cache at once. docs/CONFIGURATION.md: open handles keep at most twice the prefetch
    budget (64 MiB), whatever their number."""
    n, size = 250, 2 * MiB + 1
    body = os.urandom(size)
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda i: s3_bucket.put(f"f{i:03}", body), range(n)))
    with s3_mount(s3_bucket.name) as (mp, _, _):
        pid = daemon_pids(mp)[0]
        fds = []
        try:
            for i in range(n):
                fds.append(os.open(os.path.join(mp, f"f{i:03}"), os.O_RDONLY))
                assert os.read(fds[-1], 4096) == body[:4096]
            held = daemon_status(pid)["VmRSS"] // 1024
        finally:
            for fd in fds:
                os.close(fd)
        assert held < 350, f"{n} idle handles: daemon RSS {held} MiB"
        with open(os.path.join(mp, "f000"), "rb") as f:
            assert f.read() == body
        peak = daemon_status(pid)["VmHWM"] // 1024
        assert peak < 350, f"{n} handles closed together: daemon peak RSS {peak} MiB"


@pytest.mark.slow
def test_sixteen_threads_mixed_io(s3_bucket):
    """16 threads for ~40 s on one mount: 10 write/read/overwrite their own files, 3 rewrite one
    shared file (serialized, as writers of one file must be), 3 read the shared file unlocked.
    No errno except ESTALE for shared-file readers; every read checks its checksum; at the end
    the mount and the bucket agree byte for byte, nothing is left staged, and the daemon's peak
    RSS stays under RSS_LIMIT_MIB."""
    duration = 40
    with s3_mount(s3_bucket.name) as (mp, staging, _):
        pids = daemon_pids(mp)
        assert len(pids) == 1, pids
        pid = pids[0]
        os.mkdir(os.path.join(mp, "own"))
        stop = threading.Event()
        errors: list[str] = []
        expected: dict[str, bytes] = {}
        shared = os.path.join(mp, "shared.bin")
        shared_lock = threading.Lock()
        last_shared = {"data": _rec(999, 0, 1000)}
        write_file(shared, last_shared["data"])
        counts = {"own": 0, "shared_w": 0, "shared_r": 0, "estale": 0, "torn": 0}
        torn_example: list[str] = []
        peak = {"rss": 0}

        def own(i):
            rng = random.Random(i)
            name = f"own/f{i:02d}.bin"
            path = os.path.join(mp, name)
            gen = 0
            try:
                while not stop.is_set():
                    gen += 1
                    size = rng.choice([0, 1, 4096, 100_000, 1_500_000, 9 * MiB]) if gen % 7 else 17 * MiB
                    data = _rec(i, gen, size)
                    write_file(path, data)
                    got = read_file(path)
                    assert got == data, f"{name} gen {gen}: read-back differs"
                    if size > 100 and gen % 3 == 0:
                        # overwrite a slice in place (read-modify-write of the object)
                        off = rng.randrange(40, len(data) - 50)
                        patch = bytes(rng.randrange(256) for _ in range(50))
                        fd = os.open(path, os.O_RDWR)
                        try:
                            os.pwrite(fd, patch, off)
                        finally:
                            os.close(fd)
                        data = data[:off] + patch + data[off + 50:]
                        assert read_file(path) == data, f"{name}: after in-place overwrite"
                    expected[name] = data
                    counts["own"] += 1
            except Exception as e:  # noqa: BLE001
                errors.append(f"own {i}: {e!r}")

        def shared_writer(i):
            rng = random.Random(100 + i)
            gen = 0
            try:
                while not stop.is_set():
                    gen += 1
                    data = _rec(100 + i, gen, rng.choice([10_000, 700_000, 3 * MiB]))
                    with shared_lock:
                        write_file(shared, data)
                        last_shared["data"] = data
                    counts["shared_w"] += 1
                    time.sleep(0.05)
            except Exception as e:  # noqa: BLE001
                errors.append(f"shared writer {i}: {e!r}")

        def shared_reader(i):
            try:
                while not stop.is_set():
                    try:
                        got = read_file(shared)
                    except OSError as e:
                        if e.errno == errno.ESTALE:
                            counts["estale"] += 1
                            continue
                        raise
                    # a reader racing a writer may see the new version partly written (as on any
                    # file system); what it sees must be a prefix of ONE record, never a mix
                    counts["shared_r"] += 1
                    if len(got) < 40:
                        continue
                    tag, gen, size = struct.unpack("<QQQ", got[:24])
                    full = _rec(tag, gen, size) if tag in range(100, 103) or tag == 999 else b""
                    if not full.startswith(got):
                        # pages of two versions joined by a whole-file read of several read(2)
                        # calls racing a rewrite (a local disk does the same); counted, and
                        # test_same_mount_reader_racing_rewrites_never_sees_zeros checks that
                        # each page is one some writer wrote
                        counts["torn"] += 1
                        if not torn_example:
                            zp = sum(1 for o in range(0, len(got), 4096) if not any(got[o:o + 4096]))
                            torn_example.append(f"{len(got)} bytes, header {tag}/{gen}/{size}, {zp} zero pages")
            except Exception as e:  # noqa: BLE001
                errors.append(f"shared reader {i}: {e!r}")

        def sampler():
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    peak["rss"] = max(peak["rss"], daemon_status(pid)["VmRSS"])
                stop.wait(0.5)

        ths = ([threading.Thread(target=own, args=(i,), daemon=True) for i in range(10)]
               + [threading.Thread(target=shared_writer, args=(i,), daemon=True) for i in range(3)]
               + [threading.Thread(target=shared_reader, args=(i,), daemon=True) for i in range(3)])
        smp = threading.Thread(target=sampler, daemon=True)
        t0 = time.monotonic()
        for t in ths:
            t.start()
        smp.start()
        stop.wait(duration)
        stop.set()
        for t in ths:
            t.join(HANG_LIMIT)
            assert not t.is_alive(), f"{t.name} stuck after {time.monotonic() - t0:.0f}s"
        smp.join(5)
        st = daemon_status(pid)
        print(f"torn shared reads (known bug): {counts['torn']} {torn_example}")
        print(f"ops: {counts}; daemon VmHWM {st['VmHWM'] // 1024} MiB, sampled RSS peak "
              f"{peak['rss'] // 1024} MiB, threads {st['Threads']}, run {time.monotonic() - t0:.0f}s")
        assert not errors, errors[:5]
        assert counts["own"] >= 10 and counts["shared_w"] >= 3 and counts["shared_r"] >= 3, counts

        # the final state: the bucket holds exactly what the mount shows
        expected["shared.bin"] = last_shared["data"]
        keys = set(seed.list_keys("s3", s3_bucket.name)) - {"own/"}
        assert keys == set(expected), f"bucket keys differ: {sorted(keys ^ set(expected))}"
        for k, v in expected.items():
            assert seed.get("s3", s3_bucket.name, k) == v, f"{k}: bucket bytes differ from the last write"
            assert read_file(os.path.join(mp, k)) == v, f"{k}: mount bytes differ"
        _check_rec(expected["shared.bin"])
        # every handle is closed and clean: nothing should stay staged
        assert wait_until(lambda: not any(fs for _, _, fs in os.walk(staging)), 10), \
            f"files left in staging: {_staging_report(staging)}"
        assert st["VmHWM"] < RSS_LIMIT_MIB * 1024, f"daemon peak RSS {st['VmHWM'] // 1024} MiB"


# --------------------------------------------------------------------------- namespace ops

# errnos SEMANTICS.md documents for each operation racing others in one directory
NS_ALLOWED = {
    "create": {errno.EEXIST, errno.EISDIR},
    "write": {errno.ENOENT},  # unlinked by another thread between create and write? (never expected)
    "mkdir": {errno.EEXIST},
    "rename": {errno.ENOENT, errno.EISDIR, errno.ENOTDIR, errno.ENOTEMPTY},
    "unlink": {errno.ENOENT, errno.EISDIR},
    "rmdir": {errno.ENOENT, errno.ENOTEMPTY, errno.ENOTDIR},
    "listdir": set(),
    # ESTALE: the object was replaced or deleted (here by another thread) since open
    "read": {errno.ENOENT, errno.EISDIR, errno.ESTALE},
}


def test_parallel_namespace_ops_one_directory(s3_bucket):
    """8 threads create, mkdir, rename, unlink and rmdir names from a small pool in one
    directory for ~20 s. Only documented errnos; afterwards the mount's view of the directory
    equals what the bucket holds, and every file's content is one whole record."""
    duration = 20
    pool = [f"n{i}" for i in range(12)]
    with s3_mount(s3_bucket.name) as (mp, _, _):
        d = os.path.join(mp, "ns")
        os.mkdir(d)
        stop = threading.Event()
        bad: list[str] = []
        seen_errs: dict[str, int] = {}
        nops = {"n": 0}
        partial = {"n": 0}

        def op(kind, fn):
            try:
                fn()
            except OSError as e:
                key = f"{kind}:{errno.errorcode.get(e.errno, e.errno)}"
                seen_errs[key] = seen_errs.get(key, 0) + 1
                if e.errno not in NS_ALLOWED[kind]:
                    bad.append(f"{kind}: {e!r}")
            nops["n"] += 1

        def worker(i):
            rng = random.Random(i)
            k = 0
            while not stop.is_set() and len(bad) < 5:
                k += 1
                a, b = rng.choice(pool), rng.choice(pool)
                pa, pb = os.path.join(d, a), os.path.join(d, b)
                r = rng.random()
                if r < 0.3:
                    def create():
                        data = _rec(i, k, rng.choice([0, 10, 5000]))
                        fd = os.open(pa, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                        try:
                            os.write(fd, data)
                        finally:
                            os.close(fd)
                    op("create", create)
                elif r < 0.45:
                    op("mkdir", lambda: os.mkdir(pa))
                elif r < 0.65:
                    op("rename", lambda: os.rename(pa, pb))
                elif r < 0.8:
                    op("unlink", lambda: os.unlink(pa))
                elif r < 0.9:
                    op("rmdir", lambda: os.rmdir(pa))
                elif r < 0.95:
                    op("listdir", lambda: os.listdir(d))
                else:
                    def rd():
                        got = read_file(pa)
                        if len(got) % 4096 == 0 and _is_rec_prefix(got):
                            # a create's write still being copied in, page by page (SEMANTICS.md:
                            # "A read racing a write"): whole pages of ONE record, never a mix
                            partial["n"] += 1
                        elif len(got) >= 40:
                            _check_rec(got)
                        elif got:
                            raise AssertionError(f"{a}: {len(got)} bytes is no record")
                    try:
                        op("read", rd)
                    except AssertionError as e:
                        bad.append(str(e))

        ths = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(8)]
        for t in ths:
            t.start()
        stop.wait(duration)
        stop.set()
        for t in ths:
            t.join(HANG_LIMIT)
            assert not t.is_alive(), "a namespace worker is stuck"
        print(f"{nops['n']} ops; {partial['n']} reads of a write in progress; "
              f"errnos seen: {dict(sorted(seen_errs.items()))}")
        assert not bad, bad[:5]

        # settle: attributes and listings expire after the TTL (1 s)
        time.sleep(1.5)
        keys = seed.list_keys("s3", s3_bucket.name, "ns/")
        b_files = {k[3:] for k in keys if not k.endswith("/") and "/" not in k[3:]}
        b_dirs = {k[3:].split("/")[0] for k in keys if k != "ns/" and (k.endswith("/") or "/" in k[3:])}
        m_files, m_dirs = set(), set()
        for e in os.scandir(d):
            (m_dirs if e.is_dir(follow_symlinks=False) else m_files).add(e.name)
        print(f"final: files {sorted(m_files)}, dirs {sorted(m_dirs)}")
        assert m_files == b_files - b_dirs, f"files: mount {sorted(m_files)} bucket {sorted(b_files)}"
        assert m_dirs == b_dirs, f"dirs: mount {sorted(m_dirs)} bucket {sorted(b_dirs)}"
        for n in m_files:
            _check_rec(read_file(os.path.join(d, n)))
            assert read_file(os.path.join(d, n)) == seed.get("s3", s3_bucket.name, f"ns/{n}")
        for n in m_dirs:
            assert os.listdir(os.path.join(d, n)) == []


@pytest.mark.parametrize("mode", ["write-back", "durable"])
def test_readers_of_a_name_replaced_by_rename_in_a_loop_find_it(bucket, tmp_path, mode):
    """The editor's save (`write a.tmp; mv a.tmp a`) in a loop while another thread opens
    and reads `a`: `a` exists all the while, so an open never fails with `ENOENT`, and each
    open that succeeds reads one whole version (or `ESTALE` once its version is gone,
    SEMANTICS.md "Freshness"). Before, with write-back, an open racing a rename reached the
    replaced inode, whose bytes were staged only and dropped: 381 opens of ~27,000 failed
    with `ENOENT` and 3,042 reads with `ESTALE` in 15 s (tester I); now the open is `ESTALE`,
    which the kernel answers by looking the name up again and opening the new file."""
    if bucket.store == "gdrive":
        pytest.skip("a whole Drive rename loop takes minutes; the rule is the store's-independent open")
    args = bucket.args() + ["--staging-dir", str(tmp_path / "staging")]
    if mode == "write-back":
        args += ["--write-back", "--write-back-delay", "5"]
    mp = mount(args)
    body = lambda i: (f"v{i:06d}\n" * (1 + i % 300)).encode()  # noqa: E731
    errs, stop, opened = [], threading.Event(), [0]
    d = os.path.join(mp, "c")
    try:
        os.mkdir(d)
        write_file(os.path.join(d, "a"), body(0))

        def writer():
            for i in range(1, 600):
                write_file(os.path.join(d, "a.tmp"), body(i))
                os.rename(os.path.join(d, "a.tmp"), os.path.join(d, "a"))
            stop.set()

        def reader():
            while not stop.is_set():
                try:
                    f = open(os.path.join(d, "a"), "rb")
                except OSError as e:
                    errs.append(f"open: {errno.errorcode[e.errno]}")
                    continue
                opened[0] += 1
                try:
                    b = f.read()
                except OSError as e:
                    if e.errno != errno.ESTALE:
                        errs.append(f"read: {errno.errorcode[e.errno]}")
                    continue
                finally:
                    f.close()
                v = int(b[1:7])
                if b != body(v):
                    errs.append(f"read {len(b)} bytes of version {v}, which has {len(body(v))}")

        ts = [threading.Thread(target=writer), threading.Thread(target=reader)]
        [t.start() for t in ts]
        [t.join(timeout=HANG_LIMIT) for t in ts]
        assert not any(t.is_alive() for t in ts), "the loop hung"
        print(f"{opened[0]} opens; failures: {errs[:5]}")
        assert not [e for e in errs if e == "open: ENOENT"], f"{errs.count('open: ENOENT')} opens of `a` said ENOENT"
        assert not [e for e in errs if not e.startswith("open")], errs[:5]
        # An open may meet a second rename while the kernel retries it once (ESTALE then).
        assert len(errs) <= max(3, opened[0] // 100), f"{len(errs)} opens failed of {opened[0]}: {errs[:5]}"
        assert read_file(os.path.join(d, "a")) == body(599)
    finally:
        unmount(mp)
