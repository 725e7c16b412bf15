"""The promises of write-back mode (`bucketfs mount --write-back`) that are known to break,
reproduced through the kernel on MinIO.

docs/SEMANTICS.md "Write-back mode" promises, among others:
  - `fsync` commits a version: after `kill -9` the next mount uploads it, and bytes written
    after it and never closed never reach the bucket (they go to `lost+found`);
  - a rename of a pending file (or of a directory above it) redirects its upload: no object
    is left under a name the file had only locally, even across a crash;
  - this mount's own view (lookups, listings) and, after `bucketfs sync`, the bucket agree;
  - closes, unlinks and renames of pending files take local time: the store is asked nothing
    that they wait for, so a store that hangs (not one that refuses connections) stalls none
    of them, and a name renamed away while it hung stays away;
  - `bucketfs sync` names what it could not upload and why (exit 1);
  - closing a reader never publishes (or fails on) what another handle wrote.

Each was written as a reproduction of issue 48 and failed before its fix (the fsync, the
directory rename, the hanging store, sync during a hang, a reader's close after a refused
O_EXCL upload); the rm -rf race and the two-mount test never reproduced and stay as guards.
Each asserts something that can fail, and none depends on timing beyond generous bounds (a
call "returns within 5 s" while the store hangs for 30 s).

The hanging store is a private MinIO (module fixture `private_minio`) that the tests stop
with SIGSTOP, as the bug was reported: a store that accepts connections and never answers,
not one that refuses them. It is always continued (SIGCONT) in a `finally`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import signal
import subprocess
import threading
import time
import urllib.request

import pytest

import conftest
import seed
from conftest import (BIN, Bucket, bounded_calls, bucketfs_env, daemon_pids, force_unmount, free_port,
                      implied_dirs, md5, mount, read_file, run_cli, unmount, wait_until, walk_tree,
                      write_file)

MiB = 1024 * 1024
# How long a local call may take while the store hangs (the store stays stopped far longer).
LOCAL_CALL_LIMIT = 5.0
# How long a writer may take while its file's upload hangs: the daemon waits 5 s for the
# upload (WRITER_PATIENCE), then cuts it off; an open and a write may each wait once.
WRITER_LIMIT = 30.0
# How long the store stays stopped in the hang test.
HANG_SECS = 30.0
# How long `bucketfs sync` may take to report a hung store where it has no --timeout option,
# and the --timeout given where it has.
SYNC_HANG_LIMIT = 60.0
SYNC_TIMEOUT = 15
MINIO_BIN = os.environ.get("BUCKETFS_TEST_MINIO_BIN") or os.path.expanduser("~/go/bin/minio")


# --------------------------------------------------------------------------- helpers

# wb_args(bucket, staging, *extra), status(mp) and bucket_objects(bucket) (markers included)
# are test_write_back.py's.
from test_write_back import bucket_objects, status, wb_args  # noqa: E402


def files_only(objs: dict[str, bytes]) -> dict[str, bytes]:
    """Drop the directory markers (`d/`)."""
    return {k: v for k, v in objs.items() if not k.endswith("/")}


def sync(mp: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_cli(["sync", mp], timeout=timeout)


def kill_daemon(mp: str, pids: list[int] | None = None) -> None:
    """`kill -9` every daemon of MP (PIDS if given: found beforehand, for a kill on time),
    wait for them to die, and detach the dead mount."""
    pids = pids or daemon_pids(mp)
    assert pids, f"no bucketfs daemon serves {mp}"
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    assert wait_until(lambda: not daemon_pids(mp), 30), f"daemon of {mp} survived kill -9"
    force_unmount(mp)


def remount(mp: str, args: list[str]) -> None:
    """Mount ARGS again on the same mount point (and so the same staging directory)."""
    os.makedirs(mp, exist_ok=True)
    conftest._live_mounts.add(mp)  # unmounted at session end if the test fails first
    r = run_cli(["mount", args[0], mp] + args[1:], timeout=120)
    assert r.returncode == 0, f"remount failed ({r.returncode}): {r.err[-2000:]}"


def mount_view(mp: str) -> tuple[dict[str, str], set[str]]:
    """({file: md5 of its bytes}, dirs) of the whole mount, relative to it."""
    files, dirs = walk_tree(mp)
    return {f: md5(read_file(os.path.join(mp, f))) for f in files}, dirs


def outcome_table(outs: dict) -> str:
    return "; ".join(f"{name}: {o!r}" for name, o in outs.items())


class PrivateMinio:
    """A MinIO server of this module's own on free ports, so a test can SIGSTOP it (a store
    that hangs: connections are accepted by the kernel and never answered)."""

    def __init__(self, root: str):
        self.port, self.console = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        data = os.path.join(root, "data")
        os.makedirs(data, exist_ok=True)
        self.log = open(os.path.join(root, "minio.log"), "wb")
        env = dict(os.environ, MINIO_ROOT_USER=seed.S3_ACCESS_KEY, MINIO_ROOT_PASSWORD=seed.S3_SECRET_KEY,
                   MINIO_BROWSER="off", MINIO_UPDATE="off")
        self.proc = subprocess.Popen([MINIO_BIN, "server", data, "--address", f"127.0.0.1:{self.port}",
                                      "--console-address", f"127.0.0.1:{self.console}"],
                                     env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        self.stopped = False

        def ready():
            try:
                with urllib.request.urlopen(self.endpoint + "/minio/health/live", timeout=2) as r:
                    return r.status == 200
            except Exception:
                return False
        if not wait_until(ready, 60, 0.2):
            self.close()
            pytest.fail(f"private MinIO did not start on {self.endpoint} (log {self.log.name})")
        import boto3
        from botocore.config import Config
        self.s3 = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=seed.S3_ACCESS_KEY,
                               aws_secret_access_key=seed.S3_SECRET_KEY, region_name=seed.S3_REGION,
                               config=Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=60,
                                             retries={"max_attempts": 3, "mode": "standard"},
                                             request_checksum_calculation="when_required",
                                             response_checksum_validation="when_required"))

    def new_bucket(self) -> str:
        name = conftest.new_bucket_name()
        self.s3.create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str) -> dict[str, bytes]:
        out = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for o in page.get("Contents", []):
                out[o["Key"]] = self.s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        return out

    def wb_args(self, bucket: str, staging, *extra) -> list[str]:
        return [f"s3://{bucket}", "--endpoint", self.endpoint, "--write-back",
                "--staging-dir", str(staging)] + list(extra)

    def stop(self) -> None:
        """SIGSTOP: the store hangs."""
        self.stopped = True
        os.kill(self.proc.pid, signal.SIGSTOP)

    def cont(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
        self.stopped = False

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.cont()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self.log.close()


@pytest.fixture(scope="module")
def private_minio(tmp_path_factory):
    conftest.require_bin()
    if not os.access(MINIO_BIN, os.X_OK):
        msg = f"minio binary not found at {MINIO_BIN} (BUCKETFS_TEST_MINIO_BIN)"
        if os.environ.get("BUCKETFS_TEST_S3_ENDPOINT"):
            pytest.fail(msg)
        pytest.skip(msg)
    pm = PrivateMinio(str(tmp_path_factory.mktemp("private-minio")))
    yield pm
    pm.close()


@pytest.fixture
def hung_minio(private_minio):
    """The private MinIO, continued again whatever the test did to it."""
    try:
        yield private_minio
    finally:
        private_minio.cont()


# --------------------------------------------------------------------------- 1. fsync, then kill -9

FSYNCED = b"version-1-fsynced"
MORE = b"+more-after-fsync"


@pytest.mark.parametrize("passthrough", ["on", "off"])
@pytest.mark.parametrize("variant", ["new-file", "over-an-older-object", "overwrite-inside-fsynced-range"])
def test_fsync_then_more_writes_then_kill_9_keeps_the_fsynced_version(s3_bucket, tmp_path, passthrough, variant):
    """`fsync` commits a version ("uploaded by the next mount"); bytes written after it on the
    same handle, never closed, are not a version. Write, fsync, write more (appended, or
    over the fsync'd range at offset 0), `kill -9` the daemon with the file still open,
    remount on the same staging directory, `bucketfs sync`: the bucket (and the mount)
    hold exactly the fsync'd bytes. Variant: the key already had an older object."""
    args = wb_args(s3_bucket, tmp_path / "staging", "--write-back-delay", "600", "--passthrough", passthrough)
    mp = mount(args)
    try:
        print(f"passthrough in use: {status(mp)['passthrough']}")
        path = os.path.join(mp, "f.txt")
        if variant == "over-an-older-object":
            write_file(path, b"older-object-already-in-the-bucket")
            assert sync(mp).returncode == 0
            assert seed.get("s3", s3_bucket.name, "f.txt") == b"older-object-already-in-the-bucket"
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        try:
            assert os.write(fd, FSYNCED) == len(FSYNCED)
            os.fsync(fd)
            if variant == "overwrite-inside-fsynced-range":
                assert os.pwrite(fd, b"XXXX", 0) == 4
            else:
                assert os.write(fd, MORE) == len(MORE)
            kill_daemon(mp)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        remount(mp, args)
        r = sync(mp)
        assert r.returncode == 0, f"sync after the remount: {r.err}"
        got = files_only(bucket_objects(s3_bucket))
        assert got.get("f.txt") == FSYNCED, \
            f"bucket holds {got.get('f.txt')!r} for f.txt, not the fsync'd {FSYNCED!r} (all: {got})"
        assert read_file(path) == FSYNCED, "the remounted mount reads other bytes than the fsync'd ones"
    finally:
        unmount(mp)


# --------------------------------------------------------------------------- 2. rename, then kill -9

def rename_then_kill(mp: str, src: str, dst: str, delay: float) -> tuple[bool, str]:
    """Start rename(src, dst) in a thread and `kill -9` the daemon `delay` seconds after it
    began, whether or not it has returned (so the kill may land in the middle of a directory
    move's copies and deletes). Returns (the rename returned success before the kill, what
    happened to it)."""
    done = threading.Event()
    res: dict = {}

    def run():
        try:
            os.rename(os.path.join(mp, src), os.path.join(mp, dst))
            res["ok"] = True
        except OSError as e:
            res["error"] = e
        res["at"] = time.monotonic()
        done.set()

    pids = daemon_pids(mp)
    t0 = time.monotonic()
    threading.Thread(target=run, daemon=True, name="rename").start()
    time.sleep(delay)
    killed_at = time.monotonic()
    kill_daemon(mp, pids)
    done.wait(30)
    returned = bool(res.get("ok")) and res["at"] <= killed_at
    what = (f"returned {'ok' if res.get('ok') else repr(res.get('error'))} after {res['at'] - t0:.3f}s"
            if "at" in res else "never returned") + f", kill at {killed_at - t0:.3f}s"
    return returned, what


# Delays of the kill after the rename began, 0 to 0.2 s, twice over: the short ones land in
# the middle of a directory move (ten files take a few ms), the long ones after it.
KILL_DELAYS = [0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.2] * 2


def test_directory_rename_right_before_kill_9(s3_bucket, tmp_path):
    """A directory of ten pending files renamed, and the daemon killed 0 to 0.2 s after the
    rename began (after it returned, or in the middle of it). After the remount and `bucketfs
    sync`: if the rename returned before the kill, the bucket holds the files under the new
    name only, each with its bytes, and no key under the old name; if it had not, it holds
    them whole under exactly one of the two names (never both, never some of each)."""
    args = wb_args(s3_bucket, tmp_path / "staging", "--write-back-delay", "600")
    mp = mount(args)
    done: dict[str, bytes] = {}  # files of earlier rounds
    try:
        for rnd, delay in enumerate(KILL_DELAYS):
            src, dst = f"d{rnd}", f"d{rnd}-renamed"
            os.mkdir(os.path.join(mp, src))
            files = {f"g{i}": f"round {rnd} file g{i} ".encode() * (i + 1) for i in range(10)}
            for n, v in files.items():
                write_file(os.path.join(mp, src, n), v)
            returned, what = rename_then_kill(mp, src, dst, delay)
            remount(mp, args)
            r = sync(mp)
            assert r.returncode == 0, f"round {rnd} (rename {what}): sync: {r.err}"
            objs = bucket_objects(s3_bucket)
            got = files_only(objs)
            under = {name: {k[len(name) + 1:]: v for k, v in got.items() if k.startswith(name + "/")}
                     for name in (src, dst)}
            old_keys = sorted(k for k in objs if k == src or k.startswith(src + "/"))
            if returned:
                assert not old_keys, f"round {rnd} (rename {what}): keys under the old name {old_keys}"
                assert under[dst] == files, \
                    f"round {rnd} (rename {what}): {dst}/ holds {sorted(under[dst])}, expected all of g0..g9 with their bytes"
                done.update({f"{dst}/{n}": v for n, v in files.items()})
            else:
                whole = [name for name in (src, dst) if under[name] == files]
                other = [k for k in objs for name in {src, dst} - set(whole) if k == name or k.startswith(name + "/")]
                assert len(whole) == 1 and not other, (
                    f"round {rnd} (rename {what}, cut by the kill): {src}/ holds {sorted(under[src])}, "
                    f"{dst}/ holds {sorted(under[dst])} (keys {sorted(k for k in objs if k.startswith((src + '/', dst + '/')))}): "
                    f"not all of g0..g9 under exactly one name and nothing under the other")
                done.update({f"{whole[0]}/{n}": v for n, v in files.items()})
                print(f"round {rnd}: rename {what}, cut by the kill: the files are under {whole[0]}/")
            extra = sorted(set(got) - set(done))
            assert not extra, f"round {rnd} (rename {what}): unexpected keys {extra}"
    finally:
        unmount(mp)


def test_mkdir_and_rmdir_during_a_hang_then_kill_9(hung_minio, tmp_path):
    """mkdir and rmdir in write-back mode return once journaled, with the store hanging
    (SIGSTOP), and a `kill -9` then loses neither. After the store continues, the remount
    and `bucketfs sync`, the bucket holds the markers of the directories made (nested ones
    included) and not that of the one removed."""
    pm = hung_minio
    bucket = pm.new_bucket()
    args = pm.wb_args(bucket, tmp_path / "staging", "--write-back-delay", "600")
    mp = mount(args)
    try:
        os.mkdir(os.path.join(mp, "old"))
        r = sync(mp)
        assert r.returncode == 0, r.err
        assert "old/" in pm.objects(bucket)
        os.listdir(mp)
        pm.stop()
        try:
            outs = bounded_calls({
                "mkdir -p keep/a/b": lambda: os.makedirs(os.path.join(mp, "keep", "a", "b")),
                "mkdir empty": lambda: os.mkdir(os.path.join(mp, "empty")),
                "rmdir old": lambda: os.rmdir(os.path.join(mp, "old")),
            }, LOCAL_CALL_LIMIT)
            kill_daemon(mp)
        finally:
            pm.cont()
        bad = {k: o for k, o in outs.items() if o.hung or o.error is not None}
        assert not bad, f"while the store hung: {outcome_table(outs)}"
        remount(mp, args)
        assert sorted(os.listdir(mp)) == ["empty", "keep"]
        r = sync(mp)
        assert r.returncode == 0, r.err
        markers = sorted(k for k in pm.objects(bucket) if k.endswith("/"))
        assert markers == ["empty/", "keep/", "keep/a/", "keep/a/b/"], markers
    finally:
        pm.cont()
        unmount(mp)


@pytest.mark.parametrize("mode", ["write-back", "durable"])
def test_rename_of_an_uploaded_file_right_before_kill_9(s3_bucket, tmp_path, mode):
    """A file already in the bucket (16 MiB: its server-side copy takes a while) renamed,
    and the daemon killed around the time a rename takes, so some kills land between the
    copy and the delete. After the remount (and `bucketfs sync`): if the rename
    returned before the kill, only the new name holds the bytes; if not, exactly one of the
    two names does, never both."""
    args = wb_args(s3_bucket, tmp_path / "staging", "--write-back-delay", "600")
    if mode == "durable":
        args = [a for a in args if a != "--write-back"]
    mp = mount(args)
    body = random.Random(7).randbytes(16 * MiB)
    cut = 0
    try:
        # How long a rename takes here (the copy, then a short delete): kills are aimed at
        # its end, where the copy is done and the delete not yet.
        write_file(os.path.join(mp, "probe"), body)
        assert sync(mp).returncode == 0
        t0 = time.monotonic()
        os.rename(os.path.join(mp, "probe"), os.path.join(mp, "probe2"))
        took = time.monotonic() - t0
        os.unlink(os.path.join(mp, "probe2"))
        delays = [max(0.0, took * f) for f in (0.5, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 1.0, 1.01, 1.02, 1.05, 1.2)]
        for rnd, delay in enumerate(delays):
            src, dst = f"u{rnd}", f"v{rnd}"
            write_file(os.path.join(mp, src), body)
            r = sync(mp)
            assert r.returncode == 0, r.err
            returned, what = rename_then_kill(mp, src, dst, delay)
            remount(mp, args)
            r = sync(mp)
            assert r.returncode == 0, f"round {rnd} (rename {what}): sync: {r.err}"
            objs = bucket_objects(s3_bucket)
            names = [k for k in (src, dst) if k in objs]
            if returned:
                assert names == [dst], f"round {rnd} (rename {what}): the bucket holds {names}"
            else:
                cut += 1
                assert len(names) == 1, f"round {rnd} (rename {what}, cut by the kill): the bucket holds {names}"
            assert objs[names[0]] == body, f"round {rnd}: {names[0]} does not hold the file's bytes"
            for k in names:
                del objs[k]
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(mp, names[0]))
        print(f"a rename took {took * 1000:.1f} ms; {cut} of {len(delays)} cut by the kill")
    finally:
        unmount(mp)


@pytest.mark.parametrize("mode", ["write-back", "durable"])
def test_a_file_renamed_or_removed_right_after_its_close_stays_so_after_kill_9(s3_bucket, tmp_path, mode):
    """A file written (through passthrough where the kernel offers it) and closed, then at
    once renamed or removed, then `kill -9` once that returned: after the remount, the old
    name never comes back. (The staged copy of a clean file left staging at its close, but
    its crash-recovery sidecar, still naming the old key, stayed while a background task
    held the file: recovery then uploaded it under the old name.)"""
    args = wb_args(s3_bucket, tmp_path / "staging")
    if mode == "durable":
        args = [a for a in args if a != "--write-back"]
    mp = mount(args)
    body = random.Random(11).randbytes(2 * MiB)
    try:
        for rnd in range(6):
            src, dst, gone = f"s{rnd}", f"d{rnd}", f"g{rnd}"
            write_file(os.path.join(mp, src), body)
            write_file(os.path.join(mp, gone), body)
            assert sync(mp).returncode == 0
            write_file(os.path.join(mp, src), body[::-1])  # a new version, then at once:
            os.rename(os.path.join(mp, src), os.path.join(mp, dst))
            os.unlink(os.path.join(mp, gone))
            kill_daemon(mp)
            remount(mp, args)
            r = sync(mp)
            assert r.returncode == 0, f"round {rnd}: sync: {r.err}"
            objs = bucket_objects(s3_bucket)
            assert src not in objs, f"round {rnd}: the renamed-away name came back"
            assert gone not in objs, f"round {rnd}: the removed file came back"
            assert objs.get(dst) == body[::-1], f"round {rnd}: {dst} does not hold the last version"
            os.unlink(os.path.join(mp, dst))
    finally:
        unmount(mp)


def test_editor_save_right_before_kill_9(s3_bucket, tmp_path):
    """An editor's save of a pending file (write `.f.tmp`, rename it over `f`), then the
    daemon killed 0 to 0.2 s after the rename began: if the rename returned before the kill,
    the bucket holds `f` with the temp's bytes and no `.f.tmp`; if not, either that or the
    old `f` beside the whole `.f.tmp`."""
    args = wb_args(s3_bucket, tmp_path / "staging", "--write-back-delay", "600")
    mp = mount(args)
    try:
        for rnd, delay in enumerate(KILL_DELAYS):
            f, tmp = f"f{rnd}", f".f{rnd}.tmp"
            old, new = f"round {rnd}: old".encode(), f"round {rnd}: the saved, longer version".encode()
            write_file(os.path.join(mp, f), old)
            write_file(os.path.join(mp, tmp), new)
            returned, what = rename_then_kill(mp, tmp, f, delay)
            remount(mp, args)
            r = sync(mp)
            assert r.returncode == 0, f"round {rnd}: sync: {r.err}"
            got = files_only(bucket_objects(s3_bucket))
            state = (got.get(f), got.get(tmp))
            if returned:
                assert state == (new, None), \
                    f"round {rnd} (rename {what}): {f} holds {state[0]!r}, {tmp} holds {state[1]!r}; expected {new!r} and no {tmp}"
            else:
                assert state in ((new, None), (old, new)), \
                    f"round {rnd} (rename {what}, cut by the kill): {f} holds {state[0]!r}, {tmp} holds {state[1]!r}"
    finally:
        unmount(mp)


# --------------------------------------------------------------------------- 3. rm -rf racing

def test_rm_rf_racing_creators_and_find_leaves_mount_and_bucket_agreeing(s3_bucket, tmp_path):
    """2,000 uploaded files in T/d00..d19; then at once: `rm -rf T` (errors tolerated), a
    thread creating files in T/dNN (makedirs, errors tolerated), a thread walking T. After:
    the mount agrees with itself (lookup of T vs the root's listing, of each T/dNN vs T's
    listing; every directory walked is in its parent's listing, every name listed can be
    looked up) and, after `bucketfs sync`, with the bucket (same files, same bytes; every
    directory shown is a key's prefix or marker and every key's directory is shown). Then,
    with nobody racing, `rm -rf T` removes all of it, in the mount and, after sync, the bucket."""
    args = wb_args(s3_bucket, tmp_path / "staging", "--metadata-ttl", "60")
    mp = mount(args)
    try:
        T = os.path.join(mp, "T")
        os.mkdir(T)
        t0 = time.monotonic()
        for d in range(20):
            os.mkdir(os.path.join(T, f"d{d:02}"))
            for i in range(100):
                write_file(os.path.join(T, f"d{d:02}", f"f{i:03}"), f"d{d:02}/f{i:03}".encode())
        r = sync(mp)
        assert r.returncode == 0, r.err
        print(f"2,000 files written and synced in {time.monotonic() - t0:.1f}s")

        errors: dict[str, list] = {"rmtree": [], "create": [], "walk": []}
        counts = {"created": 0, "walks": 0}
        stop = threading.Event()

        def remover():
            shutil.rmtree(T, onerror=lambda fn, p, ei: errors["rmtree"].append((fn.__name__, p, repr(ei[1]))))

        def creator():
            rng = random.Random(7)
            n = 0
            while not stop.is_set():
                n += 1
                d = os.path.join(T, f"d{rng.randrange(20):02}")
                try:
                    os.makedirs(d, exist_ok=True)
                    write_file(os.path.join(d, f"new{n:05}"), f"new {n}".encode())
                    counts["created"] += 1
                except OSError as e:
                    errors["create"].append(repr(e))

        def walker():  # as `find` does: read each directory, lstat each entry
            while not stop.is_set():
                try:
                    for dp, dns, fns in os.walk(T, onerror=lambda e: errors["walk"].append(repr(e))):
                        for n in dns + fns:
                            with contextlib.suppress(FileNotFoundError):
                                os.lstat(os.path.join(dp, n))
                    counts["walks"] += 1
                except OSError as e:
                    errors["walk"].append(repr(e))

        threads = [threading.Thread(target=f, daemon=True, name=f.__name__) for f in (creator, walker)]
        rm = threading.Thread(target=remover, daemon=True, name="remover")
        for t in threads + [rm]:
            t.start()
        rm.join(180)
        assert not rm.is_alive(), "rm -rf did not finish within 180s"
        stop.set()
        for t in threads:
            t.join(60)
            assert not t.is_alive(), f"{t.name} hung"
        print(f"created {counts['created']} files, {counts['walks']} walks; errors: "
              f"{ {k: len(v) for k, v in errors.items()} } first ones: { {k: v[:3] for k, v in errors.items()} }")

        problems = []
        exists, listed = os.path.exists(T), "T" in os.listdir(mp)
        if exists != listed:
            problems.append(f"os.path.exists(T) is {exists} but 'T' in os.listdir(mp) is {listed}")
        if exists:
            top = set(os.listdir(T))
            for d in (f"d{i:02}" for i in range(20)):
                if os.path.isdir(os.path.join(T, d)) != (d in top):
                    problems.append(f"T/{d}: isdir {os.path.isdir(os.path.join(T, d))}, in listdir(T) {d in top}")
            for dp, dns, fns in os.walk(T, onerror=lambda e: problems.append(f"walk: {e!r}")):
                parent = os.path.dirname(dp)
                if os.path.basename(dp) not in os.listdir(parent):
                    problems.append(f"{os.path.relpath(dp, mp)} (walked, {len(fns)} files) "
                                    f"not in its parent's listing")
                for n in os.listdir(dp):
                    try:
                        os.lstat(os.path.join(dp, n))
                    except OSError as e:
                        problems.append(f"{os.path.relpath(os.path.join(dp, n), mp)} listed but lstat: {e!r}")
        assert not problems, "the mount disagrees with itself after the race: " + "; ".join(problems[:20])

        r = sync(mp)
        assert r.returncode == 0, f"sync after the race: {r.err}"
        files, dirs = mount_view(mp)
        objs = bucket_objects(s3_bucket)
        got = {k: md5(v) for k, v in files_only(objs).items()}
        only_mount = sorted(set(files) - set(got))
        only_bucket = sorted(set(got) - set(files))
        differ = sorted(k for k in set(files) & set(got) if files[k] != got[k])
        bucket_dirs = implied_dirs(objs)
        dirs_only_mount = sorted(dirs - bucket_dirs)
        dirs_only_bucket = sorted(bucket_dirs - dirs)
        assert not (only_mount or only_bucket or differ or dirs_only_mount or dirs_only_bucket), (
            f"mount vs bucket after sync: files only in the mount {only_mount[:10]} ({len(only_mount)}), "
            f"only in the bucket {only_bucket[:10]} ({len(only_bucket)}), different bytes {differ[:10]}; "
            f"directories only in the mount {dirs_only_mount[:10]}, only in the bucket {dirs_only_bucket[:10]}")

        # With nobody racing, `rm -rf T` now removes everything it shows, and the bucket follows.
        if os.path.exists(T):
            left = []
            shutil.rmtree(T, onerror=lambda fn, p, ei: left.append((fn.__name__, os.path.relpath(p, mp), repr(ei[1]))))
            assert not left, f"rm -rf T with nobody racing failed: {left[:10]}"
        assert not os.path.exists(T) and "T" not in os.listdir(mp), "T is still there after rm -rf"
        r = sync(mp)
        assert r.returncode == 0, f"sync after the last rm -rf: {r.err}"
        keys = [k for k in seed.list_keys("s3", s3_bucket.name) if k == "T" or k.startswith("T/")]
        assert not keys, f"keys under T/ after rm -rf T and sync: {keys[:10]} ({len(keys)})"
    finally:
        unmount(mp)


# --------------------------------------------------------------------------- 4-6. a hanging store

def test_a_hanging_store_does_not_stall_local_calls(hung_minio, tmp_path):
    """With a 64 MiB upload in flight, the store hangs (SIGSTOP) for 30 s. Each of these
    returns within 5 s, with no error: close of a new small file (in a directory made here),
    rename of that pending file (its upload begun and hanging: --write-back-delay 0), unlink
    of an uploaded file, stat of a known file, listdir of a listed directory, mkdir, rmdir
    of a directory in the bucket, and of one made during the hang. Then the store continues: `bucketfs
    sync` exits 0 and the bucket matches the mount (unlinked and renamed-away names absent)."""
    pm = hung_minio
    bucket = pm.new_bucket()
    mp = mount(pm.wb_args(bucket, tmp_path / "staging", "--write-back-delay", "0"))
    try:
        p = lambda *a: os.path.join(mp, *a)  # noqa: E731
        for d in ("c", "u", "s", "l", "m", "m/old", "big"):
            os.mkdir(p(d))
        write_file(p("u", "up.txt"), b"uploaded, to be unlinked")
        write_file(p("s", "st.txt"), b"uploaded, to be stat'ed")
        for n in ("a", "b", "c"):
            write_file(p("l", n), n.encode() * 10)
        r = sync(mp)
        assert r.returncode == 0, r.err
        assert sorted(os.listdir(p("l"))) == ["a", "b", "c"]
        os.stat(p("s", "st.txt"))
        sent = status(mp)["bytes_written"]
        big = random.Random(4).randbytes(64 * MiB)
        write_file(p("big", "big.bin"), big)
        wait_until(lambda: status(mp)["bytes_written"] > sent, 0.5, 0.05)
        print(f"before the hang: {status(mp)['bytes_written'] - sent} bytes of big.bin sent")

        outs = {}
        pm.stop()
        t_stop = time.monotonic()
        try:
            def op(name, fn):
                outs[name] = bounded_calls({name: fn}, LOCAL_CALL_LIMIT)[name]

            op("close of a new small file", lambda: write_file(p("c", "new.txt"), b"closed while the store hangs"))
            # With --write-back-delay 0 its upload has begun (and hangs): the rename must not wait for it.
            ren = "rename of that pending file (its upload hanging)"
            if outs["close of a new small file"].hung or outs["close of a new small file"].error:
                outs[ren] = "not run: the close before it did not return"
            else:
                op(ren, lambda: os.rename(p("c", "new.txt"), p("c", "renamed.txt")))
            op("unlink of an uploaded file", lambda: os.unlink(p("u", "up.txt")))
            op("stat of a known file", lambda: os.stat(p("s", "st.txt")))
            op("listdir of a listed directory", lambda: sorted(os.listdir(p("l"))))
            op("mkdir", lambda: os.mkdir(p("m", "sub")))
            op("rmdir of a directory in the bucket", lambda: os.rmdir(p("m", "old")))
            op("mkdir, then rmdir", lambda: (os.mkdir(p("m", "brief")), os.rmdir(p("m", "brief"))))
            print("while the store hangs: " + outcome_table(outs))
            time.sleep(max(0.0, HANG_SECS - (time.monotonic() - t_stop)))
        finally:
            pm.cont()
        t_cont = time.monotonic()
        stalled = {k: o for k, o in outs.items() if isinstance(o, str) or o.hung or o.error is not None
                   or o.elapsed > LOCAL_CALL_LIMIT}
        # Let every call held by the hang finish before looking at the result.
        assert wait_until(lambda: all(getattr(o, "done", True) for o in list(outs.values())), 120), \
            f"calls still blocked 120s after the store continued: {outcome_table(outs)}"
        print("calls held by the hang returned after (s): " + ", ".join(
            f"{k} {o.elapsed:.1f}" for k, o in list(outs.items()) if not isinstance(o, str) and o.hung))
        r = sync(mp)
        print(f"sync after the hang: exit {r.returncode} in {time.monotonic() - t_cont:.1f}s {r.err.strip()[-300:]}")
        problems = []
        if stalled:
            problems.append(f"local calls stalled by the hanging store (limit {LOCAL_CALL_LIMIT}s): {outcome_table(stalled)}")
        if r.returncode != 0:
            problems.append(f"sync after the store came back exited {r.returncode}: {r.err.strip()[-500:]}")
        else:
            files, _ = mount_view(mp)
            got = {k: md5(v) for k, v in files_only(pm.objects(bucket)).items()}
            if files != got:
                problems.append(f"mount vs bucket: only in the mount {sorted(set(files) - set(got))}, only in the "
                                f"bucket {sorted(set(got) - set(files))}, different "
                                f"{sorted(k for k in set(files) & set(got) if files[k] != got[k])}")
            for gone in ("u/up.txt", "c/new.txt"):
                if gone in got:
                    problems.append(f"{gone} (unlinked or renamed away during the hang) is in the bucket")
            keys = set(pm.objects(bucket))
            if "m/sub/" not in keys:
                problems.append("m/sub/ (made during the hang) has no marker in the bucket")
            for gone in ("m/old/", "m/brief/"):
                if gone in keys:
                    problems.append(f"{gone} (removed during the hang) is in the bucket")
            if got.get("big/big.bin") != md5(big):
                problems.append("big/big.bin is not in the bucket whole")
        assert not problems, "; ".join(problems)
    finally:
        pm.cont()
        unmount(mp)


def test_a_file_whose_upload_hangs_is_read_at_once(hung_minio, tmp_path):
    """A file closed moments ago is being uploaded (--write-back-delay 0) when the store hangs
    (SIGSTOP): opening, reading and closing it returns its bytes within the local-call limit,
    twice (before, the open waited for the upload's lock: 84 s here). Once the store
    continues, `bucketfs sync` exits 0 and the bucket holds those bytes."""
    pm = hung_minio
    bucket = pm.new_bucket()
    mp = mount(pm.wb_args(bucket, tmp_path / "staging", "--write-back-delay", "0"))
    try:
        path = os.path.join(mp, "d", "f.bin")
        os.mkdir(os.path.dirname(path))
        assert sync(mp).returncode == 0
        data = random.Random(7).randbytes(MiB)

        def read_back():
            assert read_file(path) == data

        pm.stop()
        try:
            write_file(path, data)
            uploading = lambda: "d/f.bin (uploading)" in status(mp)["write_back_pending"]  # noqa: E731
            assert wait_until(uploading, 10, 0.05), status(mp)
            outs = bounded_calls({"first read": read_back, "second read": read_back}, LOCAL_CALL_LIMIT)
            print("while the store hangs: " + outcome_table(outs))
            assert uploading(), "the upload was not hanging during the reads"
        finally:
            pm.cont()
        for name, o in outs.items():
            assert not o.hung and o.error is None and o.elapsed <= LOCAL_CALL_LIMIT, (name, o)
        assert sync(mp).returncode == 0
        assert pm.objects(bucket)["d/f.bin"] == data
        read_back()
    finally:
        unmount(mp)


@pytest.mark.parametrize("passthrough", ["on", "off"])
def test_a_file_whose_upload_hangs_is_written_within_seconds(hung_minio, tmp_path, passthrough):
    """A file closed moments ago is being uploaded (--write-back-delay 0) when the store hangs
    (SIGSTOP). An append to it, and then a rewrite (O_TRUNC), each return within
    WRITER_LIMIT, reading back what they wrote: a writer waits for the upload a few seconds,
    then cuts it off (before: the open waited for the upload, up to the store's 2-minute
    timeout, and then failed). Once the store continues, `bucketfs sync` exits 0 and the
    bucket holds the last closed version."""
    pm = hung_minio
    bucket = pm.new_bucket()
    log = tmp_path / "daemon.log"
    mp = mount(pm.wb_args(bucket, tmp_path / "staging", "--write-back-delay", "0", "--passthrough", passthrough,
                          "--log-file", str(log)))
    try:
        path = os.path.join(mp, "d", "f.bin")
        os.mkdir(os.path.dirname(path))
        assert sync(mp).returncode == 0
        rng = random.Random(11)
        data, tail, new = rng.randbytes(MiB), b"appended line\n", rng.randbytes(MiB // 2 + 3)
        steps = []  # what each call got through, for a call that hangs

        def append():
            with open(path, "ab") as f:
                steps.append("append: opened")
                f.write(tail)
            steps.append("append: closed")
            assert read_file(path) == data + tail
            steps.append("append: read back")

        def rewrite():
            with open(path, "wb") as f:
                steps.append("rewrite: opened")
                f.write(new)
            steps.append("rewrite: closed")
            assert read_file(path) == new
            steps.append("rewrite: read back")

        pm.stop()
        try:
            write_file(path, data)
            uploading = lambda: "d/f.bin (uploading)" in status(mp)["write_back_pending"]  # noqa: E731
            assert wait_until(uploading, 10, 0.05), status(mp)
            outs = bounded_calls({"append": append}, WRITER_LIMIT)
            if not outs["append"].hung:
                outs.update(bounded_calls({"rewrite": rewrite}, WRITER_LIMIT))
            print(f"passthrough {passthrough}, while the store hangs: " + outcome_table(outs))
        finally:
            pm.cont()
        for name, o in outs.items():
            tail_of_log = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
            assert not o.hung and o.error is None, (name, o, steps, tail_of_log)
        assert sync(mp).returncode == 0
        assert pm.objects(bucket)["d/f.bin"] == new
        assert read_file(path) == new
    finally:
        unmount(mp)


def test_a_name_renamed_away_during_an_outage_stays_away(hung_minio, tmp_path):
    """A file closed while the store hangs (its upload in flight, then timed out in the later
    rounds) is renamed while the store still hangs. When the store continues, `bucketfs sync`
    exits 0 and the bucket holds the new name only, with the file's bytes. Three rounds
    (the rename 1 s, 5 s and 15 s into the hang)."""
    pm = hung_minio
    bucket = pm.new_bucket()
    mp = mount(pm.wb_args(bucket, tmp_path / "staging", "--write-back-delay", "0"))
    expected = {}
    try:
        # A directory made and listed here: creating a name in it asks the store nothing (a
        # new name in a directory never listed is looked up in the store, which would hang).
        os.mkdir(os.path.join(mp, "w"))
        write_file(os.path.join(mp, "w", "warm"), b"the connection pool is warm")
        assert sync(mp).returncode == 0
        assert os.listdir(os.path.join(mp, "w")) == ["warm"]
        expected["w/warm"] = b"the connection pool is warm"
        rng = random.Random(5)
        for rnd, hold in enumerate([1.0, 5.0, 15.0]):
            old, new = f"w/a{rnd}.bin", f"w/b{rnd}.bin"
            data = rng.randbytes(2 * MiB + rnd)
            pm.stop()
            try:
                c = bounded_calls({"close": lambda: write_file(os.path.join(mp, old), data)}, 60)["close"]
                assert not c.hung and c.error is None, f"round {rnd}: close while the store hangs: {c!r}"
                time.sleep(hold)
                ren = bounded_calls({"rename": lambda: os.rename(os.path.join(mp, old), os.path.join(mp, new))},
                                    LOCAL_CALL_LIMIT)["rename"]
            finally:
                pm.cont()
            assert wait_until(lambda: ren.done, 120), f"round {rnd}: rename still blocked 120s after the store continued"
            print(f"round {rnd}: rename {hold}s into the hang returned after {ren.elapsed:.1f}s "
                  f"(the store continued {LOCAL_CALL_LIMIT:.0f}s after the rename began)")
            assert ren.error is None, f"round {rnd}: rename failed: {ren.error!r}"
            expected[new] = data
            r = sync(mp)
            assert r.returncode == 0, f"round {rnd}: sync after the store continued: {r.err}"
            got = files_only(pm.objects(bucket))
            assert old not in got, f"round {rnd}: {old}, renamed away while the store hung, is in the bucket"
            assert got.get(new) == data, f"round {rnd}: {new} is not in the bucket with its bytes"
            assert set(got) == set(expected), f"round {rnd}: bucket keys {sorted(got)}, expected {sorted(expected)}"
            assert not os.path.exists(os.path.join(mp, old)), f"round {rnd}: {old} is back in the mount"
    finally:
        pm.cont()
        unmount(mp)


def test_sync_during_a_hang_names_what_is_pending_and_returns(hung_minio, tmp_path):
    """`bucketfs sync` while the store hangs with a file pending returns, exits non-zero and
    names the pending key on stderr: with `--timeout 15` (where sync has the option) within
    45 s, without it (older binaries) within 60 s. Once the store continues, `sync` exits 0
    and the file is in the bucket."""
    pm = hung_minio
    has_timeout = "--timeout" in run_cli(["sync", "--help"]).out
    cmd, limit = ([BIN, "sync", "--timeout", str(SYNC_TIMEOUT)], SYNC_TIMEOUT + 30) if has_timeout \
        else ([BIN, "sync"], SYNC_HANG_LIMIT)
    bucket = pm.new_bucket()
    mp = mount(pm.wb_args(bucket, tmp_path / "staging", "--write-back-delay", "0"))
    try:
        os.mkdir(os.path.join(mp, "w"))  # made and listed here: new names in it are local
        write_file(os.path.join(mp, "w", "warm"), b"warm")
        assert sync(mp).returncode == 0
        assert os.listdir(os.path.join(mp, "w")) == ["warm"]
        data = b"pending while the store hangs\n" * 100
        pm.stop()
        try:
            c = bounded_calls({"close": lambda: write_file(os.path.join(mp, "w", "pending.txt"), data)}, 60)["close"]
            assert not c.hung and c.error is None, f"close while the store hangs: {c!r}"
            t0 = time.monotonic()
            try:
                p = subprocess.run(cmd + [mp], env=bucketfs_env(), stdin=subprocess.DEVNULL,
                                   capture_output=True, timeout=limit)
                took, rc, err = time.monotonic() - t0, p.returncode, p.stderr.decode(errors="replace")
            except subprocess.TimeoutExpired as e:
                took, rc, err = None, None, (e.stderr or b"").decode(errors="replace")
        finally:
            pm.cont()
        what = " ".join(cmd[1:])
        print(f"`{what}` during the hang: exit {rc} after {took}s; stderr {err.strip()[-500:]!r}")
        r = sync(mp)
        assert r.returncode == 0, f"sync once the store continued: {r.err}"
        assert files_only(pm.objects(bucket)).get("w/pending.txt") == data
        assert took is not None, f"`{what}` was still blocked after {limit:.0f}s of the hang (stderr {err!r})"
        assert rc != 0, f"`{what}` exited 0 after {took:.1f}s while the store hung and w/pending.txt was not uploaded"
        assert "w/pending.txt" in err, f"`{what}` (exit {rc}) did not name w/pending.txt: {err!r}"
    finally:
        pm.cont()
        unmount(mp)


# --------------------------------------------------------------------------- 7. O_EXCL refused, then a reader

@pytest.mark.parametrize("mode", ["durable", "write-back"])
def test_a_readers_close_after_a_refused_exclusive_upload_does_not_fail(s3_bucket, tmp_path, mode):
    """An O_EXCL create whose upload the store refuses (another client made the object between
    the create and the close): the writer's close fails with EEXIST (durable) or the upload is
    refused in the background (write-back); their object is untouched. Then a plain reader's
    open, read and close through the mount must not fail: closing a reader never uploads."""
    extra = [] if mode == "durable" else ["--write-back", "--write-back-delay", "0",
                                          "--staging-dir", str(tmp_path / "staging")]
    mp = mount(s3_bucket.args() + extra)
    try:
        path = os.path.join(mp, "lock")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, b"ours")
        s3_bucket.put("lock", b"theirs")
        try:
            os.close(fd)
            close_err = None
        except OSError as e:
            close_err = e
        if mode == "durable":
            assert close_err is not None and close_err.errno == errno.EEXIST, f"writer's close: {close_err!r}"
        else:
            assert close_err is None, f"write-back close failed: {close_err!r}"
            wait_until(lambda: (lambda s: s["upload_errors"] or s["write_back_files"] == 0)(status(mp)), 30, 0.2)
            print(f"write-back status after the refused upload: "
                  f"{ {k: v for k, v in status(mp).items() if k.startswith(('write_back', 'upload'))} }")
        assert seed.get("s3", s3_bucket.name, "lock") == b"theirs", "their object was replaced"

        step, got = "open", None
        try:
            rfd = os.open(path, os.O_RDONLY)
            step = "read"
            got = os.read(rfd, 100)
            step = "close"
            os.close(rfd)
            step = None
        except OSError as e:
            pytest.fail(f"{mode}: a reader's {step} after the refused O_EXCL upload failed: {e!r} (read {got!r})")
        print(f"{mode}: the reader read {got!r}")
        assert seed.get("s3", s3_bucket.name, "lock") == b"theirs", "their object was replaced by the reader's close"
        if mode == "write-back":
            r = sync(mp)
            print(f"sync after the refused upload: exit {r.returncode}: {r.err.strip()[-300:]!r}")
    finally:
        unmount(mp)


# --------------------------------------------------------------------------- 8. two mounts, mixed modes

def test_two_mounts_of_mixed_modes_the_last_upload_wins(s3_bucket, tmp_path):
    """Mount A with `--write-back --write-back-delay 2`, mount B durable, one bucket: f written
    and closed through A, then through B. A's upload goes after its delay, after B's: the
    bucket ends with one whole version (which one is recorded: "the last upload wins"),
    never a mix, and each mount reads a whole version."""
    va = b"A" * 100_000
    vb = b"B" * 150_000
    ma = mount(wb_args(s3_bucket, tmp_path / "staging", "--write-back-delay", "2"))
    mb = mount(s3_bucket.args())
    try:
        write_file(os.path.join(ma, "f"), va)
        write_file(os.path.join(mb, "f"), vb)
        in_bucket_after_b = seed.get("s3", s3_bucket.name, "f")
        assert wait_until(lambda: status(ma)["write_back_files"] == 0, 60, 0.2), \
            f"A's upload did not go within 60s: {status(ma)}"
        r = sync(ma)
        name = lambda v: {va: "A", vb: "B"}.get(v, f"neither ({len(v)} bytes)")  # noqa: E731
        got = seed.get("s3", s3_bucket.name, "f")
        ra, rb = read_file(os.path.join(ma, "f")), read_file(os.path.join(mb, "f"))
        print(f"right after B's close the bucket held {name(in_bucket_after_b)}; after A's upload: {name(got)}; "
              f"A's sync exit {r.returncode} {r.err.strip()[-200:]!r}; A reads {name(ra)}, B reads {name(rb)}")
        assert got in (va, vb), f"the bucket holds a mix of the two versions: {name(got)}"
        assert ra in (va, vb) and rb in (va, vb), f"A reads {name(ra)}, B reads {name(rb)}"
    finally:
        unmount(ma)
        unmount(mb)
