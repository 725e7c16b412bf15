"""Write-back mode (`bucketfs mount --write-back`) through the kernel, on MinIO.

SEMANTICS.md "Write-back mode": `close` returns once the file is staged on local disk; uploads
run in the background; a crash loses nothing whose close returned (the next mount uploads it
before serving); `bucketfs sync` waits for the uploads or names what failed; unlink and rename of
a pending file leave no stray object; the mount reads its own writes at once.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request

import pytest

import conftest
import seed
from conftest import Bucket, daemon_pids, force_unmount, free_port, mount, read_file, run_cli, unmount

ROUNDS = int(os.environ.get("BUCKETFS_TEST_CRASH_ROUNDS", "20"))
# How long the store stays unreachable in the outage test (the issue asks for a minute).
OUTAGE_SECS = float(os.environ.get("BUCKETFS_TEST_OUTAGE_SECS", "60"))


def wb_args(b: Bucket, staging, *extra) -> list[str]:
    return b.args() + ["--write-back", "--staging-dir", str(staging)] + list(extra)


def proxied_wb_args(b: Bucket, endpoint: str, staging, *extra) -> list[str]:
    """A write-back mount of `b` through a proxy of its server at `endpoint`."""
    anonymous = ["--anonymous"] if b.store == "gcs" else []
    return [seed.mount_url(b.store, b.name), "--endpoint", endpoint, *anonymous, "--write-back",
            "--staging-dir", str(staging), *extra]


def status(mp: str) -> dict:
    r = run_cli(["status", mp, "--json"])
    assert r.returncode == 0, r.err
    return json.loads(r.out)


def bucket_objects(b: Bucket) -> dict[str, bytes]:
    return {k: seed.get("s3", b.name, k) for k in seed.list_keys("s3", b.name)}


def test_close_returns_before_upload_and_sync_waits(s3_bucket, tmp_path):
    """A long delay keeps closed files pending: the mount reads them back and lists them, the
    bucket does not have them yet, status shows them; `bucketfs sync` uploads them (exit 0)."""
    mp = mount(wb_args(s3_bucket, str(tmp_path), "--write-back-delay", "600"))
    try:
        files = {f"d/f{i}.txt": os.urandom(1000 + i * 4107) for i in range(10)}
        os.mkdir(os.path.join(mp, "d"))
        for k, v in files.items():
            with open(os.path.join(mp, k), "wb") as f:
                f.write(v)
        for k, v in files.items():
            assert read_file(os.path.join(mp, k)) == v, f"{k}: read your writes"
        assert sorted(os.listdir(os.path.join(mp, "d"))) == sorted(k[2:] for k in files)
        assert not any(k in files for k in seed.list_keys("s3", s3_bucket.name)), "uploaded before the delay"
        st = status(mp)
        assert st["write_back"] is True
        assert st["write_back_files"] == len(files), st
        assert st["write_back_bytes"] == sum(map(len, files.values())), st
        r = run_cli(["sync", mp], timeout=60)
        assert r.returncode == 0, r.err
        got = bucket_objects(s3_bucket)
        for k, v in files.items():
            assert got.get(k) == v, f"{k} not in the bucket after sync"
        assert status(mp)["write_back_files"] == 0
    finally:
        unmount(mp)


def test_a_directory_name_minio_refuses_fails_at_mkdir(s3_bucket, tmp_path):
    """MinIO keeps marker `x/` as the file `x__XLDIR__`: a directory name over 246 bytes is
    refused there. A write-back `mkdir` of one fails at once, as without write-back (before,
    it returned 0, its marker was refused in the background, and `status` said 0 failing);
    one of 246 bytes is made and reaches the bucket."""
    mp = mount(wb_args(s3_bucket, str(tmp_path / "st")))
    try:
        with pytest.raises(OSError) as e:
            os.mkdir(os.path.join(mp, "d" * 247))
        assert e.value.errno == errno.EINVAL, e.value
        assert not os.path.exists(os.path.join(mp, "d" * 247))
        os.mkdir(os.path.join(mp, "e" * 246))
        r = run_cli(["sync", mp], timeout=60)
        assert r.returncode == 0, r.err
        assert "e" * 246 + "/" in seed.list_keys("s3", s3_bucket.name)
        st = status(mp)
        assert st["write_back_refused"] == 0 and st["upload_errors"] == [], st
    finally:
        unmount(mp)


def test_rename_and_unlink_of_pending_files_leave_no_stray_object(s3_bucket, tmp_path):
    """The editor's save (write tmp, rename over) and a build's temp files, all before the
    upload: the bucket ends with exactly the final names and bytes."""
    mp = mount(wb_args(s3_bucket, str(tmp_path), "--write-back-delay", "600"))
    try:
        p = lambda n: os.path.join(mp, n)  # noqa: E731
        with open(p("doc.txt"), "wb") as f:
            f.write(b"v1")
        with open(p(".doc.txt.swp"), "wb") as f:
            f.write(b"v2 longer")
        os.rename(p(".doc.txt.swp"), p("doc.txt"))
        with open(p("tmp.o"), "wb") as f:
            f.write(b"scratch")
        os.unlink(p("tmp.o"))
        os.mkdir(p("sub"))
        with open(p("sub/x"), "wb") as f:
            f.write(b"in a dir")
        os.rename(p("sub"), p("moved"))
        assert read_file(p("doc.txt")) == b"v2 longer"
        assert read_file(p("moved/x")) == b"in a dir"
        r = run_cli(["sync", mp], timeout=60)
        assert r.returncode == 0, r.err
        got = {k: v for k, v in bucket_objects(s3_bucket).items() if not k.endswith("/")}
        assert got == {"doc.txt": b"v2 longer", "moved/x": b"in a dir"}, got
    finally:
        unmount(mp)


def test_sync_names_a_failed_upload_and_the_file_arrives_later(s3_bucket, tmp_path, toxiproxy):
    """The store unreachable for a minute: closes still return (staged), `sync` exits 1
    naming the files, status shows them pending with their errors and the backlog's age;
    readers of other files are never held. When the store is back, the retried uploads bring
    every file in and `sync` exits 0."""
    from conftest import upstream_of
    px = toxiproxy.proxy(upstream_of("s3"))
    try:
        args = [seed.mount_url("s3", s3_bucket.name), "--endpoint", px.endpoint, "--write-back",
                "--write-back-delay", "0", "--staging-dir", str(tmp_path)]
        mp = mount(args)
        try:
            s3_bucket.put("other.bin", b"already there")
            assert read_file(os.path.join(mp, "other.bin")) == b"already there"
            os.mkdir(os.path.join(mp, "burst"))  # directories are made in the store at once
            px.set_enabled(False)
            burst = {f"burst/{i}.dat": os.urandom(50_000) for i in range(20)}
            t0 = time.monotonic()
            for k, v in burst.items():
                with open(os.path.join(mp, k), "wb") as f:
                    f.write(v)
            took = time.monotonic() - t0
            assert took < 30, f"closes blocked on the unreachable store ({took:.1f}s)"
            # a cached file reads while the store is down and the backlog grows
            assert read_file(os.path.join(mp, "other.bin")) == b"already there"
            r = run_cli(["sync", mp], timeout=400)
            assert r.returncode == 1, (r.returncode, r.err)
            assert "burst/" in r.err, r.err
            st = status(mp)
            assert st["write_back_files"] == len(burst), st
            assert st["upload_errors"], st
            # The outage goes on (a minute in all, BUCKETFS_TEST_OUTAGE_SECS): writers keep
            # closing at once, readers of other files are never held, the backlog shows.
            more = 0
            while time.monotonic() - t0 < OUTAGE_SECS:
                k = f"burst/late{more}.dat"
                burst[k] = os.urandom(20_000)
                t1 = time.monotonic()
                with open(os.path.join(mp, k), "wb") as f:
                    f.write(burst[k])
                assert read_file(os.path.join(mp, "other.bin")) == b"already there"
                assert time.monotonic() - t1 < 10, "a close or a read waited on the unreachable store"
                more += 1
                time.sleep(2)
            st = status(mp)
            assert st["write_back_files"] == len(burst), st
            assert st["write_back_oldest_secs"] >= OUTAGE_SECS - 15, st
            px.set_enabled(True)
            r = run_cli(["sync", mp], timeout=400)
            assert r.returncode == 0, r.err
            got = bucket_objects(s3_bucket)
            for k, v in burst.items():
                assert got.get(k) == v, f"{k} lost after the outage"
            assert not [k for k in got if ".bucketfs" in k], got.keys()
        finally:
            px.set_enabled(True)
            unmount(mp)
    finally:
        px.delete()


def test_a_mount_whose_recovery_fails_is_refused_and_loses_nothing(s3_bucket, tmp_path):
    """A file closed, then `kill -9` before its upload. The next mount reaches the bucket but
    the store refuses every upload (500 from a proxy): the mount is refused, saying why and
    where the bytes are, rather than serve the bucket's older view (a later mount would then
    upload the old bytes over newer ones). With the store back, the mount uploads the file."""
    from proxykit import HttpProxy
    staging = str(tmp_path / "staging")
    mp = mount(wb_args(s3_bucket, staging, "--write-back-delay", "3600"))
    data = os.urandom(300_000)
    with open(os.path.join(mp, "kept.bin"), "wb") as f:
        f.write(data)
    for p in daemon_pids(mp):
        os.kill(p, signal.SIGKILL)
    force_unmount(mp)
    assert "kept.bin" not in bucket_objects(s3_bucket), "uploaded before the kill (delay 3600 s)"
    with HttpProxy(seed.S3_ENDPOINT) as px:
        px.refuse = {"PUT", "POST"}
        args = [seed.mount_url("s3", s3_bucket.name), "--endpoint", px.url, "--write-back", "--staging-dir", staging]
        os.makedirs(mp, exist_ok=True)
        r = run_cli(["mount", args[0], mp] + args[1:], timeout=300)
        assert r.returncode != 0, "mounted although the staged file could not be uploaded"
        assert "kept.bin" in r.err and staging in r.err and "cannot be uploaded" in r.err, r.err[-1500:]
        assert not os.path.ismount(mp)
        assert "kept.bin" not in bucket_objects(s3_bucket)
        px.refuse = set()
        r = run_cli(["mount", args[0], mp] + args[1:], timeout=300)
        assert r.returncode == 0, r.err[-1500:]
        try:
            assert bucket_objects(s3_bucket).get("kept.bin") == data, "recovered once the store took it"
            assert read_file(os.path.join(mp, "kept.bin")) == data
        finally:
            unmount(mp)


def test_an_end_that_leaves_a_closed_file_unsent_exits_1(s3_bucket, tmp_path):
    """Two ends that left a closed file only on local disk exited 0 (tester S), so a script
    took them for clean: `bucketfs unmount` of a mount whose process was killed, and a
    `--foreground` mount (systemd's unit) stopped by SIGTERM while the store refused
    uploads. Both exit 1 and say where the file is; the next mount sends it."""
    from proxykit import HttpProxy
    staging = tmp_path / "staging"
    mp = mount(wb_args(s3_bucket, staging, "--write-back-delay", "3600"))
    with open(os.path.join(mp, "killed.bin"), "wb") as f:
        f.write(b"closed before the kill")
    for p in daemon_pids(mp):
        os.kill(p, signal.SIGKILL)
    r = run_cli(["unmount", mp], timeout=60)
    assert r.returncode == 1 and "had ended before" in r.err and "staging directory" in r.err, r.err
    assert not os.path.ismount(mp)
    with HttpProxy(seed.S3_ENDPOINT) as px:
        args = [seed.mount_url("s3", s3_bucket.name), mp, "--endpoint", px.url, "--write-back",
                "--staging-dir", str(staging), "--foreground"]
        proc = subprocess.Popen([conftest.BIN, "mount", *args], env=conftest.bucketfs_env(),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert conftest.wait_until(lambda: os.path.ismount(mp) or proc.poll() is not None, 120)
            assert proc.poll() is None, proc.stderr.read().decode(errors="replace")[-1500:]
            assert bucket_objects(s3_bucket).get("killed.bin") == b"closed before the kill", "recovered at mount"
            px.refuse = {"PUT", "POST"}
            with open(os.path.join(mp, "stopped.bin"), "wb") as f:
                f.write(b"closed before the stop")
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=180)
            err = proc.stderr.read().decode(errors="replace")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            force_unmount(mp)
        assert rc == 1 and "stopped.bin" in err and str(staging) in err, (rc, err[-1500:])
        assert "stopped.bin" not in bucket_objects(s3_bucket)
    r = run_cli(["mount", *s3_bucket.args()[:1], mp, *s3_bucket.args()[1:], "--write-back",
                 "--staging-dir", str(staging)], timeout=300)
    assert r.returncode == 0, r.err[-1500:]
    try:
        assert bucket_objects(s3_bucket).get("stopped.bin") == b"closed before the stop"
    finally:
        unmount(mp)


def test_status_answers_while_an_unmounted_process_still_uploads(s3_bucket, tmp_path, toxiproxy):
    """An unmount that gave up waiting leaves the process sending what was closed; `status`
    and `sync` said "nothing is mounted there" meanwhile (tester S). They answer, saying it
    is unmounted, and the next `bucketfs unmount` waits until the file is in the bucket."""
    px = toxiproxy.proxy(conftest.upstream_of("s3"))
    mp = None
    try:
        args = [seed.mount_url("s3", s3_bucket.name), "--endpoint", px.endpoint, "--write-back",
                "--staging-dir", str(tmp_path / "staging")]
        mp = mount(args)
        os.listdir(mp)  # (a create in a directory never listed asks the store first)
        hole = px.toxic("timeout", "downstream", timeout=0)
        with open(os.path.join(mp, "draining.bin"), "wb") as f:
            f.write(b"sent after the unmount")
        r = run_cli(["unmount", "--wait", "2", mp], timeout=120)
        assert r.returncode == 1 and "still running" in r.err, r.err
        r = run_cli(["status", mp], timeout=60)
        assert r.returncode == 0 and "is unmounted; its process is still finishing" in r.err, (r.out, r.err)
        px.remove(hole)
        r = run_cli(["unmount", mp], timeout=300)
        assert r.returncode == 0, r.err
        assert bucket_objects(s3_bucket).get("draining.bin") == b"sent after the unmount"
    finally:
        if mp:
            unmount(mp)
        px.delete()


def test_a_rename_left_unfinished_is_finished_before_the_mount_serves(s3_bucket, tmp_path):
    """A crash in the middle of `mv d d2` leaves its journal entry beside the staging
    directory and both names in the bucket. The next mount finishes the move before it
    serves; one that cannot (the store refuses the copies) is refused, naming the rename,
    rather than serve both names. With the store back, the mount finishes it."""
    from proxykit import HttpProxy
    staging = tmp_path / "staging"
    s3_bucket.put("d/a", b"first")
    s3_bucket.put("d/b", b"second")
    s3_bucket.put("d2/a", b"first")  # copied before the crash; d/b was not
    journal = tmp_path / ".staging.moves"
    journal.mkdir()
    began = time.time_ns() - 10**9
    (journal / f"{began:032x}-1-0").write_bytes(b"d/\0d2/\0d/a\0d/b")
    with HttpProxy(seed.S3_ENDPOINT) as px:
        px.refuse = {"PUT", "POST"}
        args = [seed.mount_url("s3", s3_bucket.name), "--endpoint", px.url, "--write-back",
                "--staging-dir", str(staging)]
        mp = str(tmp_path / "mnt")
        os.makedirs(mp, exist_ok=True)
        try:
            r = run_cli(["mount", args[0], mp] + args[1:], timeout=300)
            assert r.returncode != 0, "mounted with a rename half done"
            assert "rename" in r.err and "d/ to d2/" in r.err, r.err[-1500:]
            assert not os.path.ismount(mp)
            px.refuse = set()
            r = run_cli(["mount", args[0], mp] + args[1:], timeout=300)
            assert r.returncode == 0, r.err[-1500:]
            assert sorted(os.listdir(mp)) == ["d2"]
            assert read_file(os.path.join(mp, "d2", "b")) == b"second"
            assert not list(journal.iterdir())
        finally:
            unmount(mp)
            force_unmount(mp)


def test_requests_are_one_per_file_written(s3_bucket, tmp_path):
    """Goal of the issue: a project unpacked into a new directory (a `git clone`, `tar -x`)
    costs one request per file written and one per directory made, plus the first lookup of
    the new top directory (counted by the mount's own metrics)."""
    port = free_port()
    mp = mount(wb_args(s3_bucket, str(tmp_path), "--metrics-addr", f"127.0.0.1:{port}"))

    def by_op() -> dict[str, int]:
        txt = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        return {m.group(1): int(float(m.group(2))) for m in
                re.finditer(r'^bucketfs_store_requests_total\{op="([a-z_]+)"\} (\S+)', txt, re.M)}
    try:
        before = by_op()
        top = os.path.join(mp, "proj")
        os.mkdir(top)
        dirs, files = 1, 0
        for d in range(4):
            os.mkdir(os.path.join(top, f"d{d}"))
            dirs += 1
            for i in range(25):
                p = os.path.join(top, f"d{d}", f"f{i}.c")
                assert not os.path.exists(p)
                with open(p, "wb") as f:
                    f.write(b"x" * 4107)
                os.stat(p)
                files += 1
        assert run_cli(["sync", mp], timeout=120).returncode == 0
        after = by_op()
        delta = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        used = sum(delta.values())
        print(f"{files} files in {dirs} dirs: {used} store requests {delta}")
        assert used <= files + dirs + 1, f"{used} requests for {files} files in {dirs} directories: {delta}"
    finally:
        unmount(mp)


def test_rm_returns_before_the_deletes_and_a_crash_keeps_them(s3_bucket, tmp_path):
    """`rm` of files already in the bucket returns once each delete is journaled; `ls`
    through the mount never shows them again, before or after `kill -9` of the daemon and a
    remount; `bucketfs sync` then finds the bucket without them."""
    staging = str(tmp_path / "staging")
    args = wb_args(s3_bucket, staging, "--metadata-ttl", "0")
    mp = mount(args)
    names = [f"f{i:03}" for i in range(60)]
    for n in names:
        with open(os.path.join(mp, n), "wb") as f:
            f.write(n.encode())
    assert run_cli(["sync", mp], timeout=120).returncode == 0
    assert sorted(k for k in seed.list_keys("s3", s3_bucket.name)) == names
    for n in names[:40]:
        os.unlink(os.path.join(mp, n))
    # With no metadata TTL every `ls` lists the bucket: the pending deletes go first.
    assert sorted(os.listdir(mp)) == names[40:]
    for n in names[40:]:
        os.unlink(os.path.join(mp, n))
    pids = daemon_pids(mp)
    for p in pids:
        os.kill(p, signal.SIGKILL)
    force_unmount(mp)
    os.makedirs(mp, exist_ok=True)
    r = run_cli(["mount", args[0], mp] + args[1:], timeout=120)
    assert r.returncode == 0, r.err
    try:
        assert os.listdir(mp) == [], "a file unlinked before the crash is back"
        assert run_cli(["sync", mp], timeout=120).returncode == 0
        assert list(seed.list_keys("s3", s3_bucket.name)) == []
        assert status(mp)["write_back_deletes"] == 0
    finally:
        unmount(mp)


# --------------------------------------------------------------------------- crash

def _writer(mp: str, wid: int, stop: threading.Event, closed: dict, maybe: dict, lock: threading.Lock,
            rng_seed: int):
    """Write, rewrite and rename files until the mount dies; record each close that returned
    in `closed`, and the bytes of a call cut by the kill (its outcome unknown) in `maybe`."""
    import random
    rng = random.Random(rng_seed)
    i = 0
    while not stop.is_set():
        i += 1
        name = f"w{wid}/f{rng.randrange(8)}"
        data = rng.randbytes(rng.choice([0, 100, 4107, 70_000, 600_000]))
        try:
            with open(os.path.join(mp, name), "wb") as f:
                for off in range(0, len(data), 65536):
                    f.write(data[off:off + 65536])
            with lock:
                closed[name] = data
            if rng.random() < 0.2:  # an editor's save: write a temp, rename it over a name
                name = f"w{wid}/.tmp{i}"
                data = rng.randbytes(3000)
                with open(os.path.join(mp, name), "wb") as f:
                    f.write(data)
                with lock:
                    closed[name] = data
                tmp, name = name, f"w{wid}/f{rng.randrange(8)}"
                try:
                    os.rename(os.path.join(mp, tmp), os.path.join(mp, name))
                except OSError:
                    with lock:
                        maybe.setdefault(tmp, []).append(None)  # renamed or not
                    raise
                with lock:
                    del closed[tmp]
                    closed[name] = data
        except OSError:
            with lock:
                maybe.setdefault(name, []).append(data)
            return  # the daemon is gone


def _staging_snapshot(staging: str) -> list:
    """What the killed mount left staged: (file, bytes, key it names), for failure messages."""
    out = []
    for fn in sorted(os.listdir(staging)) if os.path.isdir(staging) else []:
        p = os.path.join(staging, fn)
        if fn.endswith(".key"):
            with open(p, errors="replace") as f:
                out.append((fn, f.read(), os.stat(p).st_mtime_ns))
        elif os.path.isfile(p):
            out.append((fn, os.path.getsize(p)))
    return out


def test_kill_9_loses_nothing_closed(s3_bucket, tmp_path, rng):
    """ROUNDS times: writers closing and renaming files, `kill -9` of the daemon at a random
    moment, remount on the same staging directory, `bucketfs sync`: every file whose close
    (or rename) returned is in the bucket with its last bytes; nothing else is there (no
    object not written through the mount, no temp or part objects)."""
    staging = str(tmp_path / "staging")
    closed: dict[str, bytes] = {}
    maybe: dict[str, list] = {}
    lock = threading.Lock()
    args = wb_args(s3_bucket, staging, "--write-back-delay", "0.3", "--log-file", str(tmp_path / "bucketfs.log"))
    mp = mount(args)
    for w in range(3):
        os.makedirs(os.path.join(mp, f"w{w}"), exist_ok=True)
    checked = uncertain = 0
    try:
        for rnd in range(ROUNDS):
            stop = threading.Event()
            threads = [threading.Thread(target=_writer, args=(mp, w, stop, closed, maybe, lock,
                                                              rng.randrange(1 << 30)))
                       for w in range(3)]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.2, 1.5))
            pids = daemon_pids(mp)
            assert pids, f"round {rnd}: no daemon for {mp}"
            for p in pids:
                os.kill(p, signal.SIGKILL)
            stop.set()
            for t in threads:
                t.join(60)
                assert not t.is_alive(), f"round {rnd}: a writer hung on the dead mount"
            force_unmount(mp)
            left = _staging_snapshot(staging)
            os.makedirs(mp, exist_ok=True)
            r = run_cli(["mount", args[0], mp] + args[1:], timeout=120)
            assert r.returncode == 0, f"round {rnd}: remount failed: {r.err}"
            r = run_cli(["sync", mp], timeout=120)
            assert r.returncode == 0, f"round {rnd}: sync: {r.err}"
            got = {k: v for k, v in bucket_objects(s3_bucket).items() if not k.endswith("/")}
            bad = []
            for k in sorted(set(got) | set(closed) | set(maybe)):
                ok = [closed.get(k)] + maybe.get(k, [])  # None: absent
                if got.get(k) not in ok:
                    have = None if k not in got else len(got[k])
                    bad.append((k, have, [None if v is None else len(v) for v in ok]))
            assert not bad, f"round {rnd}: (key, bytes in bucket, acceptable) {bad}; staging after the kill: {left}"
            checked += len(closed)
            uncertain += sum(got.get(k) != closed.get(k) for k in maybe)
            for k, v in got.items():  # the mount agrees with the bucket
                assert read_file(os.path.join(mp, k)) == v, f"round {rnd}: {k} reads wrong through the mount"
            closed.clear()
            closed.update(got)
            maybe.clear()
        print(f"{ROUNDS} kill -9 rounds, {checked} file checks, {uncertain} calls cut by the kill took effect")
        lost = os.path.join(staging, "lost+found")
        if os.path.isdir(lost):
            print(f"set aside (never uploaded, never closed): {len(os.listdir(lost))} files")
    finally:
        unmount(mp)


def test_unmount_that_gave_up_waiting_is_called_again_and_waits(s3_bucket, tmp_path, toxiproxy):
    """docs/SEMANTICS.md: `bucketfs unmount` waits for the mount's process to finish what was
    closed. One that gives up (`--wait`) has unmounted already; called again, it still waits
    for that process (the CSI plugin's unstage is retried so), and returns once the upload
    is in the bucket. Before, the second call found nothing mounted and failed at once, and
    the plugin's returned success with the upload still going."""
    from conftest import upstream_of
    px = toxiproxy.proxy(upstream_of("s3"))
    try:
        args = [seed.mount_url("s3", s3_bucket.name), "--endpoint", px.endpoint, "--write-back",
                "--write-back-delay", "600", "--staging-dir", str(tmp_path)]
        mp = mount(args)
        data = os.urandom(900_000)
        try:
            with open(os.path.join(mp, "slow.bin"), "wb") as f:
                f.write(data)
            px.toxic("bandwidth", stream="upstream", rate=150)  # KB/s: about 6 s for the file
            pids = daemon_pids(mp)
            r = run_cli(["unmount", "--wait", "1", mp], timeout=120)
            assert r.returncode == 1 and "still running" in r.err, (r.returncode, r.err)
            assert all(os.path.exists(f"/proc/{p}") for p in pids), "the upload was over already"
            r = run_cli(["unmount", mp], timeout=120)
            assert r.returncode == 0, (r.returncode, r.err)
            assert not daemon_pids(mp), "returned before the process ended"
            assert seed.get("s3", s3_bucket.name, "slow.bin") == data
            r = run_cli(["unmount", mp], timeout=60)
            assert r.returncode == 1 and "not mounted" in r.err, (r.returncode, r.err)
            assert run_cli(["unmount", "--missing-ok", mp], timeout=60).returncode == 0
        finally:
            px.clear()
            force_unmount(mp)
    finally:
        px.delete()


@pytest.mark.parametrize("store", ["s3", "gcs"])
@pytest.mark.parametrize("change", ["rm", "mv", "rm-held"])
def test_a_change_whose_first_try_failed_leaves_another_clients_object(store, change, tmp_path):
    """A pending `rm` or `mv` whose first try the store refused goes late: on the condition
    that the object is still the one unlinked or moved (SEMANTICS.md, write-back). Another
    client writes the name between that try and the next: their object stays. Before, the
    store layer sent the same unconditional DELETE or copy again itself 0.2-3 s later, and
    it removed or overwrote theirs (tester N: 3 of 3 on S3, 2 of 2 on GCS, after a 1 s
    outage); only an outage outlasting those retries went late."""
    from proxykit import HttpProxy
    conftest.require_store(store)
    b = Bucket(store)
    proxy = HttpProxy(seed.S3_ENDPOINT if store == "s3" else seed.GCS_ENDPOINT)
    mp = mount(proxied_wb_args(b, proxy.url, tmp_path / "staging"))
    held = None
    try:
        with open(os.path.join(mp, "f"), "wb") as f:
            f.write(b"mine")
        if change == "rm-held":
            # Still staged at the unlink (as a file whose release comes late under load):
            # its delete sent late was not conditional (CI, rm-gcs, once).
            held = os.open(os.path.join(mp, "f"), os.O_RDWR)
            os.fsync(held)
        assert run_cli(["sync", mp], timeout=120).returncode == 0
        if held is None:
            # Released (the kernel's RELEASE comes after close(2), late under load): a file
            # still staged is renamed at once, not journaled, and the refused copy is EIO.
            assert conftest.wait_until(lambda: status(mp)["staged_files"] == 0, 60), status(mp)
        # A copy is a PUT on S3 and a POST on GCS.
        refused = {"DELETE"} if change.startswith("rm") else {"PUT", "POST", "DELETE"}
        proxy.take()
        proxy.refuse = set(refused)
        if change.startswith("rm"):
            os.unlink(os.path.join(mp, "f"))
        else:
            os.rename(os.path.join(mp, "f"), os.path.join(mp, "g"))
        assert conftest.wait_until(lambda: any(m in refused for m, _, _ in proxy.requests), 30, 0.01), \
            "the change was never sent"
        target = "f" if change.startswith("rm") else "g"
        seed.put(store, b.name, target, b"another client's")
        proxy.refuse = set()
        # Sent again in the background (a sync begun before the refusal reached the mount
        # would name it as failed, as it should).
        assert conftest.wait_until(lambda: status(mp)["write_back_deletes"] == 0, 60), status(mp)
        r = run_cli(["sync", mp], timeout=120)
        assert r.returncode == 0, r.err
        assert seed.get(store, b.name, target) == b"another client's", "another client's object was taken"
        if change == "mv":
            # Not moved over theirs: the renamed file stays under its old name.
            assert seed.get(store, b.name, "f") == b"mine"
    finally:
        if held is not None:
            os.close(held)
        unmount(mp)
        proxy.close()
        b.cleanup()


@pytest.mark.parametrize("store", ["s3", "gcs"])
@pytest.mark.parametrize("other", ["replaced", "removed"])
@pytest.mark.parametrize("how", ["outage", "crash"])
def test_a_late_rename_leaves_a_source_another_client_changed(store, other, how, tmp_path):
    """A pending `mv f g` that goes late (its first try refused) while another client
    replaces or removes `f`: the move copied whatever `f` held then and deleted it, so their
    object moved to `g` (and left `f`), or the move was dropped as done, and `sync` said all
    was well (tester V: the renamed bytes nowhere, 4 of 4). Now nothing is moved, their
    object stays, and `sync` names the rename as not made."""
    from proxykit import HttpProxy
    conftest.require_store(store)
    b = Bucket(store)
    proxy = HttpProxy(seed.S3_ENDPOINT if store == "s3" else seed.GCS_ENDPOINT)
    mp = mount(proxied_wb_args(b, proxy.url, tmp_path / "staging"))
    try:
        with open(os.path.join(mp, "f"), "wb") as f:
            f.write(b"mine")
        assert run_cli(["sync", mp], timeout=120).returncode == 0
        # Released, so the rename is journaled (see the test above).
        assert conftest.wait_until(lambda: status(mp)["staged_files"] == 0, 60), status(mp)
        refused = {"PUT", "POST", "DELETE"}
        proxy.take()
        proxy.refuse = set(refused)
        os.rename(os.path.join(mp, "f"), os.path.join(mp, "g"))
        assert conftest.wait_until(lambda: any(m in refused for m, _, _ in proxy.requests), 30, 0.01), \
            "the move was never sent"
        if how == "crash":
            # The next mount sends it, from the journal (which carries the version renamed).
            for pid in daemon_pids(mp):
                os.kill(pid, signal.SIGKILL)
            force_unmount(mp)
        if other == "replaced":
            seed.put(store, b.name, "f", b"another client's")
        else:
            seed.delete(store, b.name, "f")
        proxy.refuse = set()
        if how == "crash":
            os.makedirs(mp, exist_ok=True)
            args = proxied_wb_args(b, proxy.url, tmp_path / "staging")
            r = run_cli(["mount", args[0], mp, *args[1:]], timeout=120)
            assert r.returncode == 0, r.err
        assert conftest.wait_until(lambda: status(mp)["write_back_deletes"] == 0, 60), status(mp)
        r = run_cli(["sync", mp], timeout=120)
        assert r.returncode == 1 and "rename from f not made" in r.err, (r.returncode, r.err)
        keys = {k: seed.get(store, b.name, k) for k in seed.list_keys(store, b.name)}
        assert "g" not in keys, "another client's object (or nothing) was taken for the renamed file"
        if other == "replaced":
            assert keys.get("f") == b"another client's", "another client's object was moved"
        else:
            assert "f" not in keys
    finally:
        unmount(mp)
        proxy.close()
        b.cleanup()


@pytest.mark.parametrize("store", ["gcs", "s3"])
def test_uploads_cut_off_that_land_late_are_undone(store, tmp_path, toxiproxy):
    """An upload cut off (by a writer, a rename, an unlink) may still land: what sat in a
    proxy when it was cut off reaches the server later. Over a 100 KB/s link the GCS
    emulator completed such 2 MB uploads 13-19 s after the cut, over the newer version, and
    the renamed and unlinked names came back for good (tester B; S3 was spared). Here the
    proxy holds the bytes until the mount is done with all three names, then lets them all
    through at once: the mount watches those keys and undoes what lands (late.rs). The
    bucket ends up as the mount shows it, and stays so after `bucketfs sync`; another
    client's object with the same bytes as a cut-off upload is left alone (tester G)."""
    from conftest import upstream_of
    conftest.require_store(store)
    b = Bucket(store)
    px = toxiproxy.proxy(upstream_of(store))
    args = proxied_wb_args(b, px.endpoint, tmp_path / "staging", "--write-back-delay", "1")
    mp = mount(args)
    try:
        with open(os.path.join(mp, "warm"), "wb") as f:  # the connection pool warm
            f.write(b"warm")
        assert run_cli(["sync", mp], timeout=120).returncode == 0
        old = {k: os.urandom(2_000_000) for k in ("rewritten", "renamed", "removed")}
        slow = px.toxic("bandwidth", stream="upstream", rate=50)  # KB/s: 40 s per file
        for k, v in old.items():
            with open(os.path.join(mp, k), "wb") as f:
                f.write(v)
        time.sleep(2.5)  # all three uploads under way
        t0 = time.monotonic()
        os.rename(os.path.join(mp, "renamed"), os.path.join(mp, "moved"))
        os.unlink(os.path.join(mp, "removed"))
        with open(os.path.join(mp, "rewritten"), "wb") as f:  # cuts its upload off (patience)
            f.write(b"version 2")
        want = {"warm": b"warm", "rewritten": b"version 2", "moved": old["renamed"]}
        # The new version, the deletes and their second tries a few seconds later are done
        # (no old body has got through yet); then what the proxy still holds lands at once.
        time.sleep(max(0.0, 15 - (time.monotonic() - t0)))
        px.remove(slow)

        def bucket_now():
            return {k: seed.get(store, b.name, k) for k in seed.list_keys(store, b.name)}

        def short(d):
            return {k: (v if len(v) < 20 else f"{len(v)} bytes, old={v == old.get(k)}") for k, v in d.items()}
        # All three land within seconds now, and are undone by the check 35 s after the
        # cut-off at the latest.
        time.sleep(5)
        assert conftest.wait_until(lambda: bucket_now() == want, 150, 1.0), \
            f"the bucket holds {short(bucket_now())}, the mount shows {short(want)}"
        assert run_cli(["sync", mp], timeout=180).returncode == 0
        assert bucket_now() == want, short(bucket_now())
        assert sorted(os.listdir(mp)) == sorted(want)
        assert read_file(os.path.join(mp, "rewritten")) == b"version 2"
        # Another client puts the very bytes of a cut-off upload (a file restored): still
        # watched, the key is checked by the sync, and that object is not ours: it stays.
        seed.put(store, b.name, "removed", old["removed"])
        assert run_cli(["sync", mp], timeout=180).returncode == 0
        assert seed.get(store, b.name, "removed") == old["removed"], "another client's object was deleted"
    finally:
        px.clear()
        unmount(mp)
        px.delete()
        b.cleanup()


def test_thousands_of_closed_files_waiting_never_run_the_mount_out_of_descriptors(s3_bucket, tmp_path):
    """A closed file waiting for its upload holds up to two descriptors. A `tar -x` or
    `git clone` with `--write-back` under a limit of 1,024 open files (a common default)
    got EIO on every create from about the 500th (tester C): the names still showed, and
    `bucketfs sync` said all was well with 501 of 1,200 objects in the bucket. The mount
    raises its soft limit to the hard one, and closes wait for room past what the limit
    allows (here soft and hard are 1,024)."""
    mp = conftest.new_mountpoint()
    conftest._live_mounts.add(mp)
    argv = ["prlimit", "--nofile=1024:1024", conftest.require_bin(), "mount", s3_bucket.args()[0], mp,
            *s3_bucket.args()[1:], "--write-back", "--write-back-delay", "1",
            "--staging-dir", str(tmp_path / "staging")]
    r = subprocess.run(argv, env=conftest.bucketfs_env(), stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    try:
        n, failed = 1200, []
        os.mkdir(os.path.join(mp, "d"))
        for i in range(n):
            try:
                with open(os.path.join(mp, "d", f"f{i}"), "wb") as f:
                    f.write(b"z" * (1 + i % 700))
            except OSError as e:
                failed.append((i, e.errno))
        assert not failed, f"{len(failed)} of {n} creates failed, the first {failed[:3]}"
        r = run_cli(["sync", mp], timeout=300)
        assert r.returncode == 0, r.err
        keys = [k for k in seed.list_keys("s3", s3_bucket.name) if k.startswith("d/f")]
        assert len(keys) == n, f"{len(keys)} of {n} files in the bucket after sync"
    finally:
        unmount(mp)
