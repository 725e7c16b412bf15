"""Faults between bucketfs and the object server, injected with toxiproxy.

Each test makes its own proxy (a free loopback port -> MinIO or fake-gcs-server), mounts
through it, and checks what SEMANTICS.md promises when the network misbehaves:
  - tenet 4: every call returns (bounded time), a failure is an errno, the mount stays usable;
  - tenet 6: close/fsync return only once the bucket holds the bytes, or fail (EIO); a failed
    upload stays staged and the next close, fsync or unmount uploads it;
  - tenet 2: bytes read belong to the version opened, never a mix.
What the bucket holds is always checked with the independent client (seed.py, not the proxy).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import tempfile
import threading
import time

import pytest

import seed
from conftest import (MNT_ROOT, MiB, bounded_call, bounded_calls, daemon_pids, md5, mount, read_file, run_cli,
                      unmount, upstream_of, wait_until, write_file)
# No FUSE call may take longer than this while the server is down or black-holed
# (SEMANTICS: 30 s per request, 3 retries with backoff up to 4 s).
CALL_BOUND = 120
# Hard limit for the helper thread: past it the call is reported as hung.
HANG_LIMIT = 200
# What a call may fail with when the store cannot be reached (SEMANTICS "Errors from the store";
# flush/fsync document EIO).
DOWN_ERRNOS = {errno.EIO, errno.ETIMEDOUT}


# --------------------------------------------------------------------------- helpers

class FaultMount:
    def __init__(self, mp, staging, log, store, bucket):
        self.mp, self.staging, self.log, self.store, self.bucket = mp, staging, log, store, bucket

    def path(self, *p):
        return os.path.join(self.mp, *p)

    def log_tail(self, n=40) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


@contextlib.contextmanager
def fault_mount(store: str, bucket: str, proxy, extra=(), work: str | None = None):
    """Mount `bucket` through `proxy`, with a private staging dir and log file (under `work`,
    a fresh directory unless given; a given one is left for the caller to remove)."""
    own_work = work is None
    if own_work:
        work = tempfile.mkdtemp(prefix="bfs-fault-", dir=os.path.dirname(MNT_ROOT.rstrip("/")) or None)
    staging, log = os.path.join(work, "staging"), os.path.join(work, "bucketfs.log")
    os.makedirs(staging, exist_ok=True)
    args = [seed.mount_url(store, bucket), "--endpoint", proxy.endpoint,
            "--staging-dir", staging, "--log-file", log] + list(extra)
    if store == "gcs":
        args.append("--anonymous")
    mp = mount(args)
    fm = FaultMount(mp, staging, log, store, bucket)
    try:
        yield fm
    except BaseException:
        print("---- bucketfs log tail ----\n" + fm.log_tail())
        raise
    finally:
        pids = daemon_pids(mp)
        unmount(mp)
        # a daemon still alive here is stuck: end it (only the ones this test started)
        if pids and not wait_until(lambda: not any(_alive(p) for p in pids), 30):
            for p in pids:
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
        if own_work:
            shutil.rmtree(work, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def in_bucket(store, bucket, key):
    """The object's bytes as the independent client sees them, or None if there is none."""
    try:
        return seed.get(store, bucket, key)
    except Exception:
        return None


def read_staged(path: str):
    """Read a file whose upload is pending: open and read must work from the staged bytes
    (read your writes); close may report the retried upload failing (SEMANTICS: the next
    close retries), so its error is returned, not raised."""
    fd = os.open(path, os.O_RDONLY)
    chunks = []
    try:
        while True:
            b = os.read(fd, MiB)
            if not b:
                break
            chunks.append(b)
    finally:
        close_err = None
        try:
            os.close(fd)
        except OSError as e:
            close_err = e
    return b"".join(chunks), close_err


def check_staged_read(path: str, data: bytes, what: str) -> None:
    o = bounded_call(lambda: read_staged(path), HANG_LIMIT, what)
    assert o.error is None, f"{what}: open/read of the staged file failed: {o}"
    got, close_err = o.value
    assert got == data, f"{what}: staged bytes differ ({len(got)} vs {len(data)} bytes)"
    assert close_err is None or close_err.errno in DOWN_ERRNOS, f"{what}: close: {close_err!r}"


def read_prefix(path: str, out: bytearray, chunk: int = MiB) -> None:
    """Read the file sequentially into `out` (so a caller sees how far it got on an error)."""
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(chunk)
            if not b:
                return
            out += b


@pytest.fixture
def proxy_for(toxiproxy):
    made = []

    def make(store: str):
        p = toxiproxy.proxy(upstream_of(store))
        made.append(p)
        return p

    yield make
    for p in made:
        p.delete()


@pytest.fixture(params=["s3", "gcs"])
def net_store(request):
    from conftest import require_bin, require_store
    require_store(request.param)
    require_bin()
    return request.param


@pytest.fixture
def fresh_bucket():
    from conftest import Bucket
    made = []

    def make(store):
        b = Bucket(store)
        made.append(b)
        return b

    yield make
    for b in made:
        b.cleanup()


# --------------------------------------------------------------------------- latency

def test_latency_spikes_reads_stay_correct(net_store, proxy_for, fresh_bucket, rng):
    """Latency toxics switched on and off while files are listed and read: every byte right,
    no spurious timeout errors."""
    b = fresh_bucket(net_store)
    files = {f"lat/f{i}": rng.randbytes(n) for i, n in enumerate((0, 1, 4096, 300_000, 3 * MiB, 12 * MiB))}
    b.put_all(files)
    px = proxy_for(net_store)
    stop = threading.Event()

    def spiker():
        while not stop.is_set():
            t = px.toxic("latency", "downstream", latency=400, jitter=300)
            u = px.toxic("latency", "upstream", latency=50, jitter=50)
            stop.wait(0.7)
            px.remove(t)
            px.remove(u)
            stop.wait(0.3)

    with fault_mount(net_store, b.name, px, extra=["--metadata-ttl", "0"]) as fm:
        th = threading.Thread(target=spiker, daemon=True)
        th.start()
        t0 = time.monotonic()
        try:
            for rnd in range(2):
                o = bounded_call(lambda: sorted(os.listdir(fm.path("lat"))), HANG_LIMIT, "listdir")
                assert o.error is None, o
                assert o.value == sorted(k.split("/")[1] for k in files)
                for k, v in files.items():
                    o = bounded_call(lambda: read_file(fm.path(k)), HANG_LIMIT, f"read {k}")
                    assert o.error is None, f"round {rnd}: reading {k} under latency: {o}"
                    assert len(o.value) == len(v) and md5(o.value) == md5(v), f"{k}: wrong bytes"
                    assert os.stat(fm.path(k)).st_size == len(v)
        finally:
            stop.set()
            th.join(10)
        elapsed = time.monotonic() - t0
        print(f"{net_store}: 2 rounds of list+read under latency spikes: {elapsed:.1f}s")
        assert elapsed < CALL_BOUND


@pytest.mark.parametrize("store", ["s3", "gcs"])
def test_large_upload_under_latency(store, proxy_for, fresh_bucket, rng):
    """A 20 MiB file (several parts) written through a 50 ms-each-way link: close returns only
    once the bucket holds exactly those bytes."""
    from conftest import require_store
    require_store(store)
    b = fresh_bucket(store)
    data = rng.randbytes(20 * MiB + 3)
    px = proxy_for(store)
    px.toxic("latency", "downstream", latency=50)
    px.toxic("latency", "upstream", latency=50)
    with fault_mount(store, b.name, px) as fm:
        o = bounded_call(lambda: write_file(fm.path("big.bin"), data), HANG_LIMIT, "write+close 20 MiB")
        print(f"{store}: 20 MiB write+close under 100 ms RTT: {o}")
        assert o.error is None, o
        assert in_bucket(store, b.name, "big.bin") == data
        assert o.elapsed < CALL_BOUND


# --------------------------------------------------------------------------- resets mid-read

@pytest.mark.parametrize("fault", ["limit_data", "reset_peer"])
def test_connection_cut_mid_read(net_store, fault, proxy_for, fresh_bucket, rng):
    """Every response (limit_data) or some responses (reset_peer) are cut mid-body while a
    large file is read: whatever read() returns is the object's bytes, any failure is an errno
    from the documented set, nothing hangs; once the network heals the mount reads it fully."""
    b = fresh_bucket(net_store)
    data = rng.randbytes(24 * MiB)
    b.put("big.bin", data)
    b.put("small.txt", b"small\n")
    px = proxy_for(net_store)
    with fault_mount(net_store, b.name, px) as fm:
        assert sorted(os.listdir(fm.mp)) == ["big.bin", "small.txt"]
        if fault == "limit_data":
            # every connection dies after 600 kB of response (headers included)
            tox = px.toxic("limit_data", "downstream", bytes=600_000)
        else:
            # 40% of connections are reset 20 ms after their first response bytes
            tox = px.toxic("reset_peer", "downstream", toxicity=0.4, timeout=20)
        got = bytearray()
        o = bounded_call(lambda: read_prefix(fm.path("big.bin"), got), HANG_LIMIT, "read under resets")
        print(f"{net_store}/{fault}: read {len(got)} of {len(data)} bytes, {o}")
        assert bytes(got) == data[:len(got)], "read() returned bytes that are not the object's"
        if o.error is not None:
            assert o.errno in DOWN_ERRNOS, f"unexpected error {o.error!r}"
        else:
            assert len(got) == len(data)
        assert o.elapsed < CALL_BOUND, f"read took {o.elapsed:.1f}s"
        px.remove(tox)
        # the mount is still usable and the whole file reads right
        assert sorted(os.listdir(fm.mp)) == ["big.bin", "small.txt"]
        o = bounded_call(lambda: read_file(fm.path("big.bin")), HANG_LIMIT, "read after heal")
        assert o.error is None, o
        assert md5(o.value) == md5(data)
        assert read_file(fm.path("small.txt")) == b"small\n"


# --------------------------------------------------------------------------- resets mid-upload

@pytest.mark.parametrize("size", [1 * MiB, 24 * MiB], ids=["single-put", "multipart"])
def test_connection_cut_mid_upload(size, proxy_for, fresh_bucket, rng):
    """Every request body is cut after 256 kB while a file is written and closed: close fails
    (EIO) within a bounded time and the bucket does not hold a partial object; the staged
    bytes stay readable; after the network heals a later close uploads them."""
    store = "s3"
    from conftest import require_store
    require_store(store)
    b = fresh_bucket(store)
    data = rng.randbytes(size)
    px = proxy_for(store)
    with fault_mount(store, b.name, px) as fm:
        p = fm.path("up.bin")
        tox = px.toxic("limit_data", "upstream", bytes=256 * 1024)
        o = bounded_call(lambda: write_file(p, data), HANG_LIMIT, "write+close under upload resets")
        print(f"write+close of {size} bytes with bodies cut at 256 kB: {o}")
        held = in_bucket(store, b.name, "up.bin")
        if o.error is None:
            assert held == data, "close() succeeded but the bucket does not hold the bytes"
        else:
            assert o.errno in DOWN_ERRNOS, f"close failed with {o.error!r}, expected EIO"
            assert held is None, f"failed upload left a {len(held)}-byte object in the bucket"
        assert o.elapsed < CALL_BOUND, f"close took {o.elapsed:.1f}s"
        # read your writes, from the staged copy, while uploads still fail
        check_staged_read(p, data, "read staged while uploads fail")
        px.remove(tox)
        assert "up.bin" in os.listdir(fm.mp)
        # the next close uploads it (open for writing without O_TRUNC, close)
        o3 = bounded_call(lambda: os.close(os.open(p, os.O_WRONLY)), HANG_LIMIT, "reopen+close after heal")
        assert o3.error is None, o3
        assert in_bucket(store, b.name, "up.bin") == data, "the retried upload did not reach the bucket"


# --------------------------------------------------------------------------- server down

# Each probe works in its own directory, so the kernel's per-directory locks (mkdir holds its
# parent's exclusively) never queue one probe behind another: each time measured is one call.
PROBE_SEED = {"p1/x.bin": b"x", "p2/y.txt": b"y", "p3/r.bin": b"r" * 100_000, "p4/z": b"z"}


def prepare_probes(fm: FaultMount) -> None:
    """List the root (p1..p4 known) and look up p3/r.bin, while the server is still up."""
    assert sorted(os.listdir(fm.mp))[:4] == ["p1", "p2", "p3", "p4"]
    os.stat(fm.path("p3", "r.bin"))


# Mount options for the probes: a long TTL, and no list-ahead (listing the root would list
# the whole small tree, and no name would be left that needs the server).
PROBE_MOUNT = ["--metadata-ttl", "60", "--list-ahead-keys", "0"]


def probe_ops(fm: FaultMount) -> dict:
    """Calls that need the server (names the mount has not cached; mount with PROBE_MOUNT)."""
    return {
        "stat(unseen file)": lambda: os.stat(fm.path("p1", "x.bin")),
        "listdir(unlisted dir)": lambda: os.listdir(fm.path("p2")),
        "read(unread file)": lambda: read_file(fm.path("p3", "r.bin")),
        "mkdir": lambda: os.mkdir(fm.path("p4", "newdir")),
    }


def check_down_outcomes(outs: dict, bound: float, what: str) -> None:
    print(f"{what}: " + ", ".join(f"{k}: {v}" for k, v in outs.items()))
    for name, o in outs.items():
        assert not o.hung, f"{name}: {o} ({what})"
        assert o.error is not None, f"{name} succeeded ({what})?"
        assert o.errno in DOWN_ERRNOS, f"{name}: {o.error!r} (expected EIO/ETIMEDOUT; {what})"
        assert o.elapsed < bound, f"{name} took {o.elapsed:.1f}s ({what}; bound {bound}s)"


@pytest.mark.parametrize("store,recovery", [("s3", "reopen-close"), ("s3", "fsync"), ("s3", "unmount"),
                                            ("gcs", "reopen-close")])
def test_server_down_during_upload(store, recovery, proxy_for, fresh_bucket, rng):
    """The server goes away (proxy disabled: connections cut, new ones refused) in the middle
    of writing a file. close() must fail (EIO) or succeed with the bytes in the bucket, within
    CALL_BOUND seconds; other calls fail with an errno within CALL_BOUND; when the server comes
    back the mount works again and the next close / fsync / unmount uploads the data."""
    from conftest import require_store
    require_store(store)
    b = fresh_bucket(store)
    size = 24 * MiB
    data = rng.randbytes(size)
    b.put_all(PROBE_SEED)
    px = proxy_for(store)
    with fault_mount(store, b.name, px, extra=PROBE_MOUNT) as fm:
        prepare_probes(fm)
        p = fm.path("up.bin")
        f = open(p, "wb", buffering=0)
        half = size // 2
        f.write(data[:half])
        px.set_enabled(False)
        t_down = time.monotonic()
        f.write(data[half:])  # local (staged) write: must work without the server

        o = bounded_call(f.close, HANG_LIMIT, "close() while the server is down")
        print(f"{store}: close() of {size} bytes, server down: {o}")
        held = in_bucket(store, b.name, "up.bin")
        if o.error is None:
            assert held == data, "close() reported success but the bucket lacks the bytes"
        else:
            assert o.errno in DOWN_ERRNOS, f"close failed with {o.error!r}"
            assert held is None, f"a failed close left {len(held)} bytes in the bucket"
        assert o.elapsed < CALL_BOUND, f"close() took {o.elapsed:.1f}s with the server down"

        # other calls while down: bounded, documented errno (run together to bound the test)
        check_down_outcomes(bounded_calls(probe_ops(fm), HANG_LIMIT), CALL_BOUND, f"{store}, server down")
        # the staged file is still readable (read your writes)
        check_staged_read(p, data, "read staged while down")

        px.set_enabled(True)
        print(f"{store}: server was down {time.monotonic() - t_down:.1f}s")
        # usable again
        o = bounded_call(lambda: sorted(os.listdir(fm.path("p2"))), HANG_LIMIT, "listdir after")
        assert o.error is None and o.value == ["y.txt"], o
        assert sorted(os.listdir(fm.mp)) == ["p1", "p2", "p3", "p4", "up.bin"]

        if recovery == "reopen-close":
            o = bounded_call(lambda: os.close(os.open(p, os.O_WRONLY)), HANG_LIMIT, "reopen+close")
            assert o.error is None, o
            assert in_bucket(store, b.name, "up.bin") == data, "next close did not upload the staged data"
        elif recovery == "fsync":
            def fs():
                fd = os.open(p, os.O_RDWR)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            o = bounded_call(fs, HANG_LIMIT, "fsync")
            assert o.error is None, o
            assert in_bucket(store, b.name, "up.bin") == data, "fsync did not upload the staged data"
        else:
            r = run_cli(["unmount", fm.mp], timeout=HANG_LIMIT)
            assert r.returncode == 0, r.err
            assert in_bucket(store, b.name, "up.bin") == data, "unmount did not upload the staged data"
        if recovery != "unmount":
            assert read_file(fm.path("p3", "r.bin")) == PROBE_SEED["p3/r.bin"]
            os.mkdir(fm.path("p4", "newdir"))
            assert in_bucket(store, b.name, "p4/newdir/") == b""


def test_sync_right_after_a_failed_close_names_that_file(proxy_for, fresh_bucket):
    """Without write-back, a close whose upload failed leaves the file for `bucketfs sync`.
    A sync run right after it found the file's handle still open (the kernel sends the
    RELEASE after close returns) and left it out: exit 0 after the first failed close, and
    each later list lacked the newest file. Now each sync names every such file and exits
    1 while the store is down, and uploads them all once it is back."""
    from conftest import require_store
    require_store("s3")
    b = fresh_bucket("s3")
    px = proxy_for("s3")
    with fault_mount("s3", b.name, px) as fm:
        for i in range(3):
            write_file(fm.path(f"f{i}.txt"), b"base")
        px.set_enabled(False)
        for i in range(3):
            with pytest.raises(OSError) as e:
                with open(fm.path(f"f{i}.txt"), "wb") as f:
                    f.write(b"new%d" % i)
            assert e.value.errno in DOWN_ERRNOS, e.value
            r = run_cli(["sync", "--timeout", "60", fm.mp], timeout=HANG_LIMIT)
            assert r.returncode == 1, f"sync exit {r.returncode} with f{i}.txt not uploaded: {r.err}"
            for j in range(i + 1):
                assert f"f{j}.txt" in r.err, f"sync after the close of f{i}.txt does not name f{j}.txt: {r.err}"
        px.set_enabled(True)
        r = run_cli(["sync", fm.mp], timeout=HANG_LIMIT)
        assert r.returncode == 0, r.err
        for i in range(3):
            assert in_bucket("s3", b.name, f"f{i}.txt") == b"new%d" % i


def test_a_rename_that_fails_keeps_the_targets_unsaved_bytes(proxy_for, fresh_bucket):
    """Without write-back, a rename over a file a writer still has open dropped the writer's
    staged bytes before moving anything: with the store down the rename failed (EIO), the
    target kept its name, and the writer's close uploaded nothing (the bucket kept the old
    bytes, exit 0). A rename that fails changes nothing: the close uploads them."""
    from conftest import require_store
    require_store("s3")
    b = fresh_bucket("s3")
    px = proxy_for("s3")
    with fault_mount("s3", b.name, px) as fm:
        write_file(fm.path("src.txt"), b"source")
        write_file(fm.path("dst.txt"), b"old")
        f = open(fm.path("dst.txt"), "r+b", buffering=0)
        try:
            f.write(b"unsaved by the writer")
            px.set_enabled(False)
            o = bounded_call(lambda: os.rename(fm.path("src.txt"), fm.path("dst.txt")), HANG_LIMIT, "rename")
            assert isinstance(o.error, OSError) and o.error.errno in DOWN_ERRNOS, f"rename with the store down: {o}"
            px.set_enabled(True)
        finally:
            px.set_enabled(True)
            f.close()
        assert in_bucket("s3", b.name, "dst.txt") == b"unsaved by the writer"
        assert in_bucket("s3", b.name, "src.txt") == b"source"
        assert read_file(fm.path("dst.txt")) == b"unsaved by the writer"


def test_server_down_unmount_keeps_data(proxy_for, fresh_bucket, rng, tmp_path, monkeypatch):
    """Unmount while the server is still down: `bucketfs unmount` returns within a bounded
    time and says the upload failed (non-zero exit); the bytes are not dropped: they stay in
    the staging directory, and the next mount with that staging directory uploads them
    (SEMANTICS tenet 6: a failed upload is never dropped). Each retry meanwhile is one log
    line, also with RUST_BACKTRACE set (OpenDAL's own notice then logged a backtrace each)."""
    from conftest import require_store
    require_store("s3")
    b = fresh_bucket("s3")
    data = rng.randbytes(3 * MiB)
    px = proxy_for("s3")
    work = str(tmp_path)
    monkeypatch.setenv("RUST_BACKTRACE", "1")
    with fault_mount("s3", b.name, px, work=work) as fm:
        f = open(fm.path("kept.bin"), "wb")
        f.write(data)
        px.set_enabled(False)
        o = bounded_call(f.close, HANG_LIMIT, "close while down")
        assert o.error is not None and o.errno in DOWN_ERRNOS, o
        t0 = time.monotonic()
        r = run_cli(["unmount", fm.mp], timeout=HANG_LIMIT)
        took = time.monotonic() - t0
        print(f"unmount with the server down: exit {r.returncode} after {took:.1f}s: {r.err.strip()}")
        assert took < CALL_BOUND
        assert in_bucket("s3", b.name, "kept.bin") is None
        staged = []
        for dp, _, fns in os.walk(fm.staging):
            for fn in fns:
                with open(os.path.join(dp, fn), "rb") as fh:
                    if fh.read() == data:
                        staged.append(fn)
        assert staged, "the unuploaded bytes were dropped: not in the bucket, not in staging"
        assert r.returncode != 0, "unmount exited 0 although the upload never happened"
        assert "kept.bin" in r.err, f"unmount did not name the file it could not upload: {r.err!r}"
        with open(fm.log, errors="replace") as lf:
            log = lf.read()
        retries = [ln for ln in log.splitlines() if "retrying" in ln]
        assert retries, "no retry was logged while the server was down"
        assert "Backtrace" not in log and len(log.splitlines()) < 40 * len(retries), log[-3000:]
    px.set_enabled(True)
    # the next mount on the same staging directory uploads what was left
    with fault_mount("s3", b.name, px, work=work) as fm2:
        assert wait_until(lambda: in_bucket("s3", b.name, "kept.bin") == data, 60, 0.5), \
            "the next mount did not upload the bytes left in staging"
        assert read_file(fm2.path("kept.bin")) == data


def test_files_left_for_one_bucket_never_go_to_another(proxy_for, fresh_bucket, rng, tmp_path):
    """A file kept in staging by a failed unmount belongs to the bucket it was written for.
    A mount of another bucket with that staging directory (the default one is per mount
    point) is refused and names the first bucket; it never uploads the file over an object
    of the same key there. The first bucket, mounted again, gets its file."""
    from conftest import force_unmount, new_mountpoint, require_store
    require_store("s3")
    mine, other = fresh_bucket("s3"), fresh_bucket("s3")
    other.put_all({"report.txt": b"precious, not to be overwritten"})
    data = rng.randbytes(1000)
    px = proxy_for("s3")
    work = str(tmp_path)
    with fault_mount("s3", mine.name, px, work=work) as fm:
        f = open(fm.path("report.txt"), "wb")
        f.write(data)
        px.set_enabled(False)
        assert bounded_call(f.close, HANG_LIMIT, "close while down").error is not None
        assert run_cli(["unmount", fm.mp], timeout=HANG_LIMIT).returncode != 0
    px.set_enabled(True)
    mp = new_mountpoint()
    r = run_cli(["mount", seed.mount_url("s3", other.name), mp, "--endpoint", px.endpoint,
                 "--staging-dir", os.path.join(work, "staging")], timeout=60)
    force_unmount(mp)
    assert r.returncode != 0, "a mount of another bucket took over the files left for the first"
    assert mine.name in r.err and "--staging-dir" in r.err, r.err
    assert in_bucket("s3", other.name, "report.txt") == b"precious, not to be overwritten"
    with fault_mount("s3", mine.name, px, work=work):
        assert wait_until(lambda: in_bucket("s3", mine.name, "report.txt") == data, 60, 0.5)


def test_uploads_over_a_slow_link_finish(proxy_for, fresh_bucket, rng, tmp_path):
    """A link that sends 700 KB/s per connection (a 45 Mbit/s uplink shared by 8 parts):
    every part takes over 10 s, which was the I/O timeout of each upload call, so each part
    timed out and was retried in vain. Now an upload call may run at 128 KiB/s: `cp` into
    the mount and `bucketfs cp` both finish, and the bucket holds the bytes."""
    from conftest import require_store
    require_store("s3")
    b = fresh_bucket("s3")
    data = rng.randbytes(40 * MiB)
    src = os.path.join(str(tmp_path), "src.bin")
    with open(src, "wb") as f:
        f.write(data)
    px = proxy_for("s3")
    px.toxic("bandwidth", "upstream", rate=700)
    with fault_mount("s3", b.name, px) as fm:
        o = bounded_call(lambda: shutil.copyfile(src, fm.path("slow.bin")), HANG_LIMIT, "cp into the mount")
        assert o.error is None, o
        assert in_bucket("s3", b.name, "slow.bin") == data
    r = run_cli(["cp", "-q", src, seed.mount_url("s3", b.name) + "/cp.bin", "--endpoint", px.endpoint],
                timeout=HANG_LIMIT)
    assert r.returncode == 0, r.err
    assert in_bucket("s3", b.name, "cp.bin") == data


def test_a_second_interrupt_stops_a_cp_whose_cleanup_waits_on_a_silent_store(proxy_for, fresh_bucket, rng,
                                                                               tmp_path):
    """Ctrl-C stops `bucketfs cp` cleanly: it aborts its multipart upload, which waits for
    the store's answer. A store that stopped answering held it there for minutes, and a
    second Ctrl-C did nothing (only `kill -9` stopped it). The second now stops it at once,
    exit status 130, saying what may be left behind."""
    import subprocess
    from conftest import bucketfs_env, require_bin, require_store
    require_store("s3")
    b = fresh_bucket("s3")
    src = os.path.join(str(tmp_path), "big.bin")
    with open(src, "wb") as f:
        f.write(rng.randbytes(64 * MiB))
    px = proxy_for("s3")
    px.toxic("bandwidth", "upstream", rate=2000)  # 2 MB/s: under way for half a minute
    proc = subprocess.Popen([require_bin(), "cp", "-q", src, seed.mount_url("s3", b.name) + "/big.bin",
                             "--endpoint", px.endpoint, "--slice-size", "5M", "--parallel", "2"],
                            env=bucketfs_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        s3 = seed.s3_client()
        deadline = time.monotonic() + 60
        while not s3.list_multipart_uploads(Bucket=b.name).get("Uploads"):
            assert proc.poll() is None and time.monotonic() < deadline, "the upload never began"
            time.sleep(0.05)
        px.toxic("timeout", "downstream", timeout=0)
        px.toxic("timeout", "upstream", timeout=0)
        proc.send_signal(signal.SIGINT)
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("a second SIGINT did not stop bucketfs cp within 30 s")
        err = err.decode(errors="replace")
        assert proc.returncode == 130, (proc.returncode, err)
        assert "interrupted again" in err and "multipart" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        px.clear()


# --------------------------------------------------------------------------- black hole

# SEMANTICS: a request times out after 30 s and is retried 3 times with backoff up to 4 s:
# one store request may take 4 * 30 + 3 * 4 = 132 s before it fails.
BLACK_HOLE_BOUND = 150


@pytest.mark.slow
def test_black_hole_calls_are_bounded(proxy_for, fresh_bucket, rng):
    """The server accepts connections but never answers (toxiproxy `timeout` toxic, both
    directions): every call must still return, with an errno, within BLACK_HOLE_BOUND s."""
    from conftest import require_store
    require_store("s3")
    b = fresh_bucket("s3")
    b.put_all(PROBE_SEED)
    data = rng.randbytes(2 * MiB)
    px = proxy_for("s3")
    with fault_mount("s3", b.name, px, extra=PROBE_MOUNT) as fm:
        prepare_probes(fm)
        f = open(fm.path("up.bin"), "wb")
        f.write(data)
        t1 = px.toxic("timeout", "downstream", timeout=0)
        t2 = px.toxic("timeout", "upstream", timeout=0)
        ops = probe_ops(fm)
        ops["close(upload)"] = f.close
        outs = bounded_calls(ops, HANG_LIMIT)
        px.remove(t1)
        px.remove(t2)
        check_down_outcomes(outs, BLACK_HOLE_BOUND, "black-holed server")
        assert in_bucket("s3", b.name, "up.bin") is None
        # healed: usable, and the next close uploads
        o = bounded_call(lambda: sorted(os.listdir(fm.path("p2"))), HANG_LIMIT, "listdir after")
        assert o.error is None and o.value == ["y.txt"], o
        o = bounded_call(lambda: os.close(os.open(fm.path("up.bin"), os.O_WRONLY)), HANG_LIMIT, "reclose")
        assert o.error is None, o
        assert in_bucket("s3", b.name, "up.bin") == data


# --------------------------------------------------------------------------- bad input

def _s3_put_many(bucket: str, items: dict[str, bytes], workers: int = 32) -> None:
    """Parallel puts with a client whose connection pool fits the workers. Non-empty bodies
    only (see put_seed)."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3
    from botocore.config import Config
    assert all(items.values()), "empty objects go through put_seed"
    cl = boto3.client("s3", endpoint_url=seed.S3_ENDPOINT, aws_access_key_id=seed.S3_ACCESS_KEY,
                      aws_secret_access_key=seed.S3_SECRET_KEY, region_name=seed.S3_REGION,
                      config=Config(s3={"addressing_style": "path"}, max_pool_connections=workers,
                                    retries={"max_attempts": 3, "mode": "standard"},
                                    request_checksum_calculation="when_required",
                                    response_checksum_validation="when_required"))
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(lambda kv: cl.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), items.items()))


def put_seed(store: str, bucket: str, items: dict[str, bytes]) -> None:
    """Seed objects. On S3, empty objects go through a throwaway boto3 client: here, after a
    PUT with an empty body, the next request on that keep-alive connection stalls for 30 s
    (boto3 against this MinIO), which would slow every later call of the shared client."""
    if store != "s3":
        from conftest import upload_all
        upload_all(store, bucket, items)
        return
    _s3_put_many(bucket, {k: v for k, v in items.items() if v}, workers=8)
    empties = [k for k, v in items.items() if not v]
    if empties:
        cl = seed.s3_client(secret=seed.S3_SECRET_KEY)  # a new client, not the shared one
        for k in empties:
            cl.put_object(Bucket=bucket, Key=k, Body=b"")


def _s3_empty_bucket(bucket: str) -> None:
    """Batch delete (1,000 keys a request) so a 10,000-key bucket is gone in seconds."""
    cl = seed.s3_client()
    keys = seed.list_keys("s3", bucket)
    for i in range(0, len(keys), 1000):
        cl.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]],
                                                  "Quiet": True})


N_KEYS = int(os.environ.get("BUCKETFS_TEST_BIG_DIR_KEYS", "10000"))


@pytest.mark.slow
def test_ten_thousand_keys_in_one_directory(fresh_bucket):
    """10,000 keys under one prefix (seeded with parallel puts): one listdir returns every
    name exactly once, in a bounded time; stat of every entry gives the right size; a sample
    reads back right. (100,000 keys would take ~5 min to seed here; set
    BUCKETFS_TEST_BIG_DIR_KEYS to try it.)"""
    from conftest import require_store
    require_store("s3")
    b = fresh_bucket("s3")
    items = {f"big/k{i:06d}.txt": f"key {i}\n".encode() * (i % 5 + 1) for i in range(N_KEYS)}
    t0 = time.monotonic()
    _s3_put_many(b.name, items)
    seeded = time.monotonic() - t0
    try:
        work = tempfile.mkdtemp(prefix="bfs-big-", dir=os.path.dirname(MNT_ROOT.rstrip("/")) or None)
        mp = mount([seed.mount_url("s3", b.name), "--endpoint", seed.S3_ENDPOINT,
                    "--metadata-ttl", "120", "--staging-dir", work])
        try:
            t1 = time.monotonic()
            o = bounded_call(lambda: os.listdir(os.path.join(mp, "big")), HANG_LIMIT, "listdir of 10k")
            listed = time.monotonic() - t1
            assert o.error is None, o
            names = o.value
            assert len(names) == len(set(names)) == N_KEYS, f"{len(names)} names, {len(set(names))} distinct"
            assert set(names) == {k[4:] for k in items}
            t2 = time.monotonic()
            for n in names:
                st = os.stat(os.path.join(mp, "big", n))
                assert st.st_size == len(items["big/" + n]), n
            statted = time.monotonic() - t2
            for i in range(0, N_KEYS, max(1, N_KEYS // 50)):
                k = f"big/k{i:06d}.txt"
                assert read_file(os.path.join(mp, k)) == items[k]
            # a second, fresh listing (new opendir) agrees
            assert sorted(os.listdir(os.path.join(mp, "big"))) == sorted(names)
            print(f"{N_KEYS} keys: seeded in {seeded:.1f}s, listdir {listed:.1f}s, stat all {statted:.1f}s")
            assert listed < 60, f"listing {N_KEYS} keys took {listed:.1f}s"
        finally:
            unmount(mp)
            shutil.rmtree(work, ignore_errors=True)
    finally:
        _s3_empty_bucket(b.name)


def test_bucket_changed_behind_the_mount_mid_listing(fresh_bucket):
    """Keys are deleted and added by another client while a 2,200-entry directory (three LIST
    pages) is being read: the listing is one snapshot (SEMANTICS: one snapshot per opendir), every name once,
    sorted; after the TTL a new listing shows exactly the new state."""
    from conftest import require_store
    require_store("s3")
    b = fresh_bucket("s3")
    old = {f"chg/f{i:05d}": b"o" for i in range(2200)}
    _s3_put_many(b.name, old)
    work = tempfile.mkdtemp(prefix="bfs-chg-", dir=os.path.dirname(MNT_ROOT.rstrip("/")) or None)
    mp = mount([seed.mount_url("s3", b.name), "--endpoint", seed.S3_ENDPOINT, "--staging-dir", work])
    try:
        d = os.path.join(mp, "chg")
        names = []
        with os.scandir(d) as it:
            for e in it:
                names.append(e.name)
                if len(names) == 100:
                    # change the bucket behind the mount: drop the last 300, add 300 new
                    cl = seed.s3_client()
                    cl.delete_objects(Bucket=b.name, Delete={"Objects": [
                        {"Key": f"chg/f{i:05d}"} for i in range(1900, 2200)], "Quiet": True})
                    _s3_put_many(b.name, {f"chg/g{i:05d}": b"n" for i in range(300)})
        assert len(names) == len(set(names)), "a name was listed twice"
        assert names == sorted(names), "listing is not sorted"
        assert set(names) == {k[4:] for k in old}, \
            (f"not one snapshot: {len(set(names) - {k[4:] for k in old})} new names, "
             f"{len({k[4:] for k in old} - set(names))} missing")
        time.sleep(1.5)
        now = sorted(os.listdir(d))
        want = sorted([f"f{i:05d}" for i in range(1900)] + [f"g{i:05d}" for i in range(300)])
        assert now == want, f"after the TTL: {len(now)} names, differ from the bucket's {len(want)}"
        with pytest.raises(FileNotFoundError):
            os.stat(os.path.join(d, "f02199"))
        assert read_file(os.path.join(d, "g00299")) == b"n"
    finally:
        unmount(mp)
        shutil.rmtree(work, ignore_errors=True)
        _s3_empty_bucket(b.name)


@pytest.mark.parametrize("store,change", [
    ("s3", "truncated"), ("s3", "replaced-same-size"), ("s3", "deleted"),
    ("gcs", "truncated"), ("gcs", "replaced-same-size"),
    ("gcs", "deleted"),
])
def test_object_changed_behind_an_open_handle(store, change, fresh_bucket, rng):
    """Another client truncates, replaces or deletes an object while a handle reads it: every
    read returns the opened version's bytes or fails with ESTALE; never the new version's
    bytes, never an early EOF (a mix of the two sizes). A new open then sees the new version.
    The first read after the change is far from anything read or prefetched, so it must ask
    the store (pinned to the opened ETag / generation)."""
    from conftest import require_store
    require_store(store)
    b = fresh_bucket(store)
    size = 16 * MiB
    a = rng.randbytes(size)
    b.put("obj.bin", a)
    new = {"truncated": rng.randbytes(1000), "replaced-same-size": rng.randbytes(size), "deleted": None}[change]
    work = tempfile.mkdtemp(prefix="bfs-chg-", dir=os.path.dirname(MNT_ROOT.rstrip("/")) or None)
    mp = mount(b.args() + ["--staging-dir", work])
    try:
        p = os.path.join(mp, "obj.bin")
        fd = os.open(p, os.O_RDONLY)
        errs = []
        try:
            assert os.pread(fd, 64 * 1024, 0) == a[:64 * 1024]
            if new is None:
                seed.delete(store, b.name, "obj.bin")
            else:
                b.put("obj.bin", new)
            # 1. a random read far ahead: not cached, not prefetched
            far = size - 3 * MiB
            try:
                got = os.pread(fd, 4096, far)
                assert got == a[far:far + 4096], \
                    f"read at {far} after the change: {len(got)} bytes, not the opened version's"
            except OSError as e:
                errs.append(e)
            # 2. sequential reads from the start: old bytes or ESTALE, never new bytes or EOF
            off = 0
            while off < size:
                try:
                    chunk = os.pread(fd, MiB, off)
                except OSError as e:
                    errs.append(e)
                    break
                assert chunk, f"early EOF at {off} of {size}: the handle mixed in the new size"
                assert chunk == a[off:off + len(chunk)], f"bytes at {off} are not the opened version's"
                off += len(chunk)
            print(f"{store}/{change}: sequential reads got {off} of {size} bytes; errors {errs}")
            for e in errs:
                assert e.errno == errno.ESTALE, f"{e!r}, expected ESTALE"
        finally:
            os.close(fd)
        time.sleep(1.5)
        if new is None:
            assert not os.path.exists(p)
        else:
            assert read_file(p) == new
    finally:
        unmount(mp)
        shutil.rmtree(work, ignore_errors=True)


def test_empty_object_named_like_a_directory(net_store, fresh_bucket):
    """`d/` (empty marker) is an empty directory; `k` and `k/x` make `k` a directory (the file is
    shadowed; GCS only: MinIO accepts both puts but then lists only `k`); a marker next to real
    children does not duplicate the name; rmdir removes the marker; mkdir on it is EEXIST; a
    file cannot be created over it."""
    b = fresh_bucket(net_store)
    objs = {"d/": b"", "e/": b"", "e/f.txt": b"f", "top.txt": b"t"}
    if net_store == "gcs":
        objs.update({"k": b"shadowed file", "k/x": b"x"})
    put_seed(net_store, b.name, objs)
    with b.mounted() as mp:
        assert sorted(os.listdir(mp)) == sorted(["d", "e", "top.txt"] + (["k"] if net_store == "gcs" else []))
        assert os.path.isdir(os.path.join(mp, "d")) and os.listdir(os.path.join(mp, "d")) == []
        if net_store == "gcs":
            assert os.path.isdir(os.path.join(mp, "k")) and os.listdir(os.path.join(mp, "k")) == ["x"]
        assert os.listdir(os.path.join(mp, "e")) == ["f.txt"]
        with pytest.raises(FileExistsError):
            os.mkdir(os.path.join(mp, "d"))
        with pytest.raises(OSError) as ei:
            os.open(os.path.join(mp, "d"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        assert ei.value.errno in (errno.EISDIR, errno.EEXIST)
        with pytest.raises(OSError) as ei:
            os.rmdir(os.path.join(mp, "e"))
        assert ei.value.errno == errno.ENOTEMPTY
        os.rmdir(os.path.join(mp, "d"))
        assert "d/" not in seed.list_keys(net_store, b.name)
        assert "d" not in os.listdir(mp)
        # a new file inside the marker directory next to its marker
        with open(os.path.join(mp, "e", "g.txt"), "wb") as f:
            f.write(b"g")
        assert seed.get(net_store, b.name, "e/g.txt") == b"g"
        assert sorted(os.listdir(os.path.join(mp, "e"))) == ["f.txt", "g.txt"]
