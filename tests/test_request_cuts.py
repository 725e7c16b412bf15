"""One request cut in the middle by the network, or held and delivered late, through the
kernel, on the GCS emulator (and MinIO).

docs/SEMANTICS.md, tenet 4: every store request has a timeout and a bounded number of
retries. On GCS one cut connection failed the close with EIO (tester D): OpenDAL's retry
layer never sends a compose again, and it retried a create-only upload's resumable session
by asking its status, which fake-gcs-server answers by storing the bytes it holds (none: a
0-byte object under the name, then "writer got too much data"). bucketfs now sends those
requests again itself (crates/store/src/retry.rs). On S3 the same cuts were already retried.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

import seed
from conftest import md5, mount, read_file, run_cli, unmount, wait_until
from hangkit import kill_daemon, remount
from proxykit import CutProxy


def test_one_cut_request_of_an_upload_is_sent_again(gcs_bucket, tmp_path):
    """A new 3 MB file's upload cut 100 kB in, a new 20 MB file's compose cut 50 bytes in,
    an append's compose cut 50 bytes in: each close succeeds and the bucket holds exactly
    the file's bytes right after it."""
    rng = random.Random(12)
    port = int(seed.GCS_ENDPOINT.rsplit(":", 1)[1].rstrip("/"))
    with CutProxy(port) as px:
        args = [seed.mount_url("gcs", gcs_bucket.name), "--endpoint", px.url, "--anonymous",
                "--staging-dir", str(tmp_path / "st"), "--cache-dir", str(tmp_path / "ca")]
        mp = mount(args)
        try:
            base = rng.randbytes(6_000_000)
            with open(os.path.join(mp, "c.bin"), "wb") as f:
                f.write(base)
            cases = [("a.bin", "uploadType=resumable", 100_000, rng.randbytes(3_000_000), "wb"),
                     ("b.bin", "/compose", 50, rng.randbytes(20_000_000), "wb"),
                     ("c.bin", "/compose", 50, rng.randbytes(1_000_000), "ab")]
            for name, pattern, after, data, how in cases:
                px.arm(pattern, after)
                excl = os.O_EXCL if how == "wb" else 0  # a new file, as cp makes one: create-only
                with open(os.path.join(mp, name), how, opener=lambda p, fl: os.open(p, fl | excl)) as f:
                    f.write(data)
                want = base + data if how == "ab" else data
                assert px.cuts == 1, f"{name}: no request matched {pattern!r} (the test cut nothing)"
                got = seed.get("gcs", gcs_bucket.name, name)
                assert md5(got) == md5(want), f"{name}: the bucket holds {len(got)} bytes, not the file's {len(want)}"
        finally:
            unmount(mp)


def _get_or_none(store: str, bucket: str, key: str) -> bytes | None:
    try:
        return seed.get(store, bucket, key)
    except Exception:
        return None


@pytest.mark.parametrize("store", ["s3", "gcs"])
def test_a_try_sent_again_after_a_timeout_that_lands_later_is_undone(store, request, tmp_path):
    """Durable (default) mode: a close's first PUT is held by the network past the 10 s
    I/O timeout; bucketfs sends it again, and the close succeeds. The held try reaches the
    store later: after the next close of newer bytes, or after an `rm` of the name (tester
    G, GCS with 45 s of latency: the older bytes stayed, the removed name came back).
    `bucketfs sync` finds it and puts the newer version back, or deletes the name again."""
    b = request.getfixturevalue(f"{store}_bucket")
    endpoint = seed.S3_ENDPOINT if store == "s3" else seed.GCS_ENDPOINT
    port = int(endpoint.rsplit(":", 1)[1].rstrip("/"))
    upload = (lambda key: f"PUT /{b.name}/{key} ") if store == "s3" else (lambda key: f"name={key}")
    rng = random.Random(16)
    with CutProxy(port) as px:
        args = [seed.mount_url(store, b.name), "--endpoint", px.url,
                "--staging-dir", str(tmp_path / "st"), "--cache-dir", str(tmp_path / "ca")]
        if store == "gcs":
            args.append("--anonymous")
        mp = mount(args)
        try:
            for name, then in (("late.bin", "rewrite"), ("gone.bin", "rm")):
                older, newer = rng.randbytes(300_000), rng.randbytes(200_000)
                px.hold(upload(name))
                with open(os.path.join(mp, name), "wb") as f:
                    f.write(older)
                assert px.held == 1, f"{name}: no upload matched {upload(name)!r} (the test held nothing)"
                if then == "rewrite":
                    with open(os.path.join(mp, name), "wb") as f:
                        f.write(newer)
                else:
                    os.unlink(os.path.join(mp, name))
                px.release()
                assert px.landed.wait(60), f"{name}: the held try never reached the store"
                landed = _get_or_none(store, b.name, name)
                assert landed is not None and md5(landed) == md5(older), \
                    f"{name}: the held try did not land (the test tried nothing)"
                r = run_cli(["sync", mp], timeout=120)
                assert r.returncode == 0, r.stderr
                got = _get_or_none(store, b.name, name)
                size = None if got is None else len(got)
                if then == "rewrite":
                    assert got is not None and md5(got) == md5(newer), \
                        f"{name}: the bucket holds {size} bytes, not the newer close's {len(newer)}"
                    assert md5(read_file(os.path.join(mp, name))) == md5(newer)
                else:
                    assert got is None, f"{name}: a removed name came back with {size} bytes"
                    assert name not in os.listdir(mp)
        finally:
            unmount(mp)


_WRITER = """
import sys, time
f = open(sys.argv[1], "r+b", buffering=0)
print("open", flush=True)
sys.stdin.readline()
f.write(bytes.fromhex(sys.argv[2]))
print("written", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("store,mode,then,writer_opens", [
    ("s3", "durable", "sync", "after"), ("s3", "write-back", "kill-9", "after"),
    ("gcs", "durable", "kill-9", "after"), ("gcs", "write-back", "sync", "after"),
    ("s3", "durable", "kill-9", "before"), ("gcs", "durable", "sync", "before")])
def test_a_late_landing_while_a_writer_has_the_file_open_is_undone(store, mode, then, writer_opens, request,
                                                                   tmp_path):
    """A close's PUT held past the timeout and sent again; the file closed again with
    newer bytes, then opened by another process that writes its start and keeps it open.
    The held try lands now, over the newer close. `bucketfs sync` puts the newer close's
    bytes back at once, not at the writer's close (before, only at it: hours, for a log);
    a `kill -9` of the mount right after the landing, the writer still in the file, cannot
    leave the older bytes: the remount's recovery sends the newer close's (tester K: the
    older ones stayed for good). Also when the writer opened the file before that close
    (tester L: no copy was kept then)."""
    b = request.getfixturevalue(f"{store}_bucket")
    endpoint = seed.S3_ENDPOINT if store == "s3" else seed.GCS_ENDPOINT
    port = int(endpoint.rsplit(":", 1)[1].rstrip("/"))
    held = f"PUT /{b.name}/x.bin " if store == "s3" else "name=x.bin"
    rng = random.Random(17)
    older, newer, change = rng.randbytes(300_000), rng.randbytes(300_000), rng.randbytes(1000)
    with CutProxy(port) as px:
        args = [seed.mount_url(store, b.name), "--endpoint", px.url,
                "--staging-dir", str(tmp_path / "st"), "--cache-dir", str(tmp_path / "ca")]
        args += ["--anonymous"] if store == "gcs" else []
        args += ["--write-back", "--write-back-delay", "0"] if mode == "write-back" else []
        mp = mount(args)
        path = os.path.join(mp, "x.bin")
        writer = None
        try:
            px.hold(held)
            with open(path, "wb") as f:
                f.write(older)
            assert wait_until(lambda: px.held == 1, 60), f"no upload matched {held!r} (the test held nothing)"
            assert wait_until(lambda: _get_or_none(store, b.name, "x.bin") == older, 60), \
                "the try sent again after the held one never landed"
            def open_writer():
                # Another process, so that no fork of this one closes (flushes) its handle.
                w = subprocess.Popen([sys.executable, "-c", _WRITER, path, change.hex()],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                assert w.stdout.readline().strip() == "open"
                return w
            if writer_opens == "before":
                writer = open_writer()
            with open(path, "wb") as f:
                f.write(newer)
            assert wait_until(lambda: _get_or_none(store, b.name, "x.bin") == newer, 60), \
                "the newer close never reached the bucket"
            writer = writer or open_writer()
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "written"
            px.release()
            assert px.landed.wait(60), "the held try never reached the store"
            if then == "sync":
                r = run_cli(["sync", mp], timeout=120)
                got = _get_or_none(store, b.name, "x.bin")
                assert got == newer, (f"after sync (rc {r.returncode}, {r.err.strip()[-300:]!r}), the bucket holds "
                                      f"{'the older close' if got == older else repr(got and len(got))}")
                assert r.returncode == 0, r.err
                assert md5(read_file(path)) == md5(change + newer[1000:]), "the writer's change is not shown"
            else:
                kill_daemon(mp)
                remount(mp, args)
                got = _get_or_none(store, b.name, "x.bin")
                assert got == newer, ("after kill -9 and remount, the bucket holds "
                                      f"{'the older close' if got == older else repr(got and len(got))}")
                assert md5(read_file(path)) == md5(newer)
        finally:
            if writer:
                writer.kill()
                writer.wait()
            unmount(mp)


@pytest.mark.parametrize("store", ["s3", "gcs"])
@pytest.mark.parametrize("other", ["rewrites", "deletes"])
def test_a_crash_during_a_watch_leaves_what_another_client_did_since(store, other, request, tmp_path):
    """A close's PUT held past the timeout and sent again: the key is watched, the file
    kept staged to go up again over a late landing. Another client then rewrites or
    deletes the key, and the mount is killed (the held try never lands). The remount must
    not send the kept copy over what the other client did (tester L: it did, 4 of 4)."""
    b = request.getfixturevalue(f"{store}_bucket")
    endpoint = seed.S3_ENDPOINT if store == "s3" else seed.GCS_ENDPOINT
    port = int(endpoint.rsplit(":", 1)[1].rstrip("/"))
    held = f"PUT /{b.name}/x.bin " if store == "s3" else "name=x.bin"
    rng = random.Random(18)
    mine, theirs = rng.randbytes(300_000), rng.randbytes(200_000)
    with CutProxy(port) as px:
        args = [seed.mount_url(store, b.name), "--endpoint", px.url,
                "--staging-dir", str(tmp_path / "st"), "--cache-dir", str(tmp_path / "ca")]
        args += ["--anonymous"] if store == "gcs" else []
        mp = mount(args)
        try:
            px.hold(held)
            with open(os.path.join(mp, "x.bin"), "wb") as f:
                f.write(mine)
            assert px.held == 1, f"no upload matched {held!r} (the test held nothing)"
            assert _get_or_none(store, b.name, "x.bin") == mine
            if other == "rewrites":
                seed.put(store, b.name, "x.bin", theirs)
            else:
                seed.delete(store, b.name, "x.bin")
            kill_daemon(mp)
            remount(mp, args)
            got = _get_or_none(store, b.name, "x.bin")
            want = theirs if other == "rewrites" else None
            seen = "the mount's copy" if got == mine else repr(got and len(got))
            assert got == want, f"after the remount the bucket holds {seen}, not what the other client left"
        finally:
            unmount(mp)
