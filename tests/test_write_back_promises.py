"""The promises of write-back mode (`bucketfs mount --write-back`) that are known to break,
reproduced through the kernel on MinIO.

docs/SEMANTICS.md "Write-back mode" promises, among others:
  - `fsync` commits a version: after `kill -9` the next mount uploads it, and bytes written
    after it and never closed never reach the bucket (they go to `lost+found`);
  - a rename of a pending file (or of a directory above it) redirects its upload: no object
    is left under a name the file had only locally, even across a crash;
  - this mount's own view (lookups, listings) and, after `bucketfs sync`, the bucket agree;
  - closing a reader never publishes (or fails on) what another handle wrote.

Each was written as a reproduction of issue 48 and failed before its fix (the fsync, the
directory rename, the hanging store, sync during a hang, a reader's close after a refused
O_EXCL upload); the rm -rf race and the two-mount test never reproduced and stay as guards.
Each asserts something that can fail, and none depends on timing beyond generous bounds (a
call "returns within 5 s" while the store hangs for 30 s).

A store that hangs: test_write_back_hangs.py (and one crash during a hang here); the shared
parts, the private MinIO those tests stop included, are in hangkit.py.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import subprocess
import threading
import time

import pytest

import seed
from conftest import (BIN, bounded_calls, bucketfs_env, daemon_pids, implied_dirs, md5, mount, read_file, unmount,
                      wait_until, write_file)
from hangkit import (LOCAL_CALL_LIMIT, MiB, files_only, kill_daemon, mount_view, outcome_table, remount, sync,
                     hung_minio, private_minio)  # noqa: F401 - fixtures
# wb_args(bucket, staging, *extra), status(mp) and bucket_objects(bucket) (markers included)
# are test_write_back.py's.
from test_write_back import bucket_objects, status, wb_args


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


def test_unmount_after_a_recovery_set_bytes_aside_exits_1_naming_them(s3_bucket, tmp_path):
    """docs/SEMANTICS.md: bytes a crash left never closed go to `lost+found`, and
    `bucketfs unmount` of the mount that recovered them exits 1 naming each file and where
    it is kept (before, it exited 0: a script took the set-aside bytes for a clean unmount).
    A later clean mount and unmount exit 0 again."""
    args = wb_args(s3_bucket, tmp_path / "staging", "--write-back-delay", "600")
    mp = mount(args)
    try:
        path = os.path.join(mp, "half.txt")
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            os.write(fd, b"written, never closed")
            kill_daemon(mp)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        remount(mp, args)
        kept = os.listdir(tmp_path / "staging" / "lost+found")
        data = [n for n in kept if not n.endswith(".key")]
        assert len(data) == 1, f"lost+found holds {kept}"
        r = unmount(mp)
        assert r is not None and r.returncode == 1, f"unmount: {r and (r.returncode, r.stderr)}"
        err = r.stderr.decode()
        assert "half.txt" in err and "lost+found" in err and data[0] in err, err
        remount(mp, args)
        r = unmount(mp)
        assert r is not None and r.returncode == 0, f"a clean unmount after: {r and r.stderr}"
    finally:
        unmount(mp)


def test_unmount_whose_mount_process_dies_mid_drain_exits_1(hung_minio, tmp_path):
    """`bucketfs unmount` waits for the mount's process to upload what was closed; a process
    killed meanwhile (here while the store hangs) never finished. The unmount said nothing and
    exited 0 though closed files were not in the bucket (tester B: 7 of 7 runs). It exits 1
    saying so; the next mount uploads them."""
    pm = hung_minio
    bucket = pm.new_bucket()
    args = pm.wb_args(bucket, tmp_path / "staging", "--write-back-delay", "600")
    mp = mount(args)
    try:
        write_file(os.path.join(mp, "closed.txt"), b"closed before the unmount")
        pids = daemon_pids(mp)
        pm.stop()
        try:
            um = subprocess.Popen([BIN, "unmount", mp], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=bucketfs_env())
            assert wait_until(lambda: not os.path.ismount(mp), 30), "the kernel kept the mount"
            time.sleep(0.5)  # the process drains its uploads to a store that hangs
            kill_daemon(mp, pids)
            _, err = um.communicate(timeout=60)
        finally:
            pm.cont()
        assert um.returncode == 1, f"unmount exited {um.returncode}: {err.decode()[-500:]}"
        assert "ended before it finished" in err.decode(), err.decode()
        remount(mp, args)
        r = sync(mp)
        assert r.returncode == 0, r.err
        assert pm.objects(bucket).get("closed.txt") == b"closed before the unmount"
    finally:
        pm.cont()
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


@pytest.mark.parametrize("mode", ["write-back", "durable"])
@pytest.mark.parametrize("then", ["nothing", "rm-ftruncate", "rm-write-fsync", "rm-fchmod"])
def test_an_open_file_of_a_renamed_directory_keeps_its_new_name_after_kill_9(s3_bucket, tmp_path, mode, then):
    """A file written and fsync'd through a handle, its directory renamed while the handle
    stays open, then (`then`) nothing, or the file removed and changed through the handle
    (`ftruncate`, a write and `fsync`, `fchmod`), and the daemon killed. After the remount:
    the old name never comes back, a removed file is neither uploaded again nor set aside
    in `lost+found` (unmount exiting 1). Before, without write-back, the staged file's
    crash-recovery sidecar kept the key from before the directory's rename: recovery
    uploaded it there; and a change after the unlink named the key again (model test,
    seed 547028787)."""
    args = wb_args(s3_bucket, tmp_path / "staging")
    if mode == "durable":
        args = [a for a in args if a != "--write-back"]
    mp = mount(args)
    body = b"first version, written through the handle"
    try:
        os.mkdir(os.path.join(mp, "d"))
        fd = os.open(os.path.join(mp, "d", "f"), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            os.write(fd, body)
            os.fsync(fd)
            assert sync(mp).returncode == 0
            os.rename(os.path.join(mp, "d"), os.path.join(mp, "e"))
            if then != "nothing":
                os.unlink(os.path.join(mp, "e", "f"))
            if then == "rm-ftruncate":
                os.ftruncate(fd, 100)
            elif then == "rm-write-fsync":
                assert os.pwrite(fd, b"written after the unlink", 0) == 24
                os.fsync(fd)
            elif then == "rm-fchmod":
                os.fchmod(fd, 0o600)
            kill_daemon(mp)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        remount(mp, args)
        r = sync(mp)
        assert r.returncode == 0, f"sync after the remount: {r.err}"
        got = files_only(bucket_objects(s3_bucket))
        assert got == ({"e/f": body} if then == "nothing" else {}), f"the bucket holds {sorted(got)}"
        found = tmp_path / "staging" / "lost+found"
        assert not found.exists() or not os.listdir(found), f"set aside: {os.listdir(found)}"
        r = unmount(mp)
        assert r is not None and r.returncode == 0, f"unmount: {r and r.stderr}"
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


def test_mode_and_mtime_of_pending_files_survive_kill_9(s3_bucket, tmp_path):
    """`chmod +x` and `touch -d` (as `tar -x` and `make` rely on) of files not uploaded yet,
    then `kill -9`: the next mount uploads them with that mode and mtime."""
    args = wb_args(s3_bucket, tmp_path / "staging", "--write-back-delay", "600")
    mp = mount(args)
    try:
        old = 1_600_000_000.25
        write_file(os.path.join(mp, "run.sh"), b"#!/bin/sh\necho hi\n")
        os.chmod(os.path.join(mp, "run.sh"), 0o755)
        write_file(os.path.join(mp, "dated.txt"), b"extracted")
        os.utime(os.path.join(mp, "dated.txt"), (old, old))
        kill_daemon(mp)
        remount(mp, args)
        assert sync(mp).returncode == 0
        s3 = seed.s3_client()
        meta = {k: s3.head_object(Bucket=s3_bucket.name, Key=k)["Metadata"] for k in ("run.sh", "dated.txt")}
        assert meta["run.sh"].get("mode") == "100755", meta
        assert float(meta["dated.txt"].get("mtime", "0")) == pytest.approx(old, abs=1e-3), meta
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


# --------------------------------------------------------------------------- a full staging disk


@pytest.mark.parametrize("passthrough", ["on", "off"])
def test_a_write_refused_for_a_full_staging_disk_is_never_uploaded(hung_minio, tmp_path, passthrough):
    """A closed file waits for its upload; the staging disk fills; an append to it fails
    with `ENOSPC` (was EIO without passthrough). The part of the append that got in before
    the disk filled stayed in the staged file past its end, and after a `kill -9` the next
    mount uploaded it: an object longer than any version a close returned for, ending in
    bytes the writer was told were not written (tester B: 7 of 7 runs). Then, the store
    hanging, a write inside the file needs room to keep the closed version: `ENOSPC`
    (with passthrough the open for writing failed with EBUSY)."""
    pm = hung_minio
    small = _small_tmpfs(tmp_path, "12m")
    bucket, mp = pm.new_bucket(), None
    try:
        args = pm.wb_args(bucket, small / "staging", "--write-back-delay", "600", "--passthrough", passthrough,
                          "--cache-dir", str(tmp_path / "cache"))
        mp = mount(args)
        committed = os.urandom(2 * MiB)
        path = os.path.join(mp, "A")
        write_file(path, committed)
        # Fill the staging disk but for half a MiB: the first write through FUSE (1 MiB
        # requests) gets half in, then fails.
        free = shutil.disk_usage(small).free
        with open(small / "filler", "wb") as f:
            f.write(b"\0" * max(0, free - MiB // 2))
        # The store hangs: the closed version stays here (the open for writing waits 5 s
        # for its upload, then goes ahead).
        pm.stop()
        # Appends until one is refused; a short count says how much of one got in.
        expected, refused = committed, None
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            for _ in range(16):
                data = os.urandom(2 * MiB)
                expected += data[:os.write(fd, data)]
        except OSError as e:
            refused = e.errno
        finally:
            os.close(fd)
        assert refused == errno.ENOSPC, f"an append past the staging disk's room: errno {refused}, not ENOSPC"
        assert os.stat(path).st_size == len(expected), "the refused append shows in the file's size"
        assert read_file(path) == expected, "the refused append changed the file's bytes"
        # A write inside the file must keep the closed version first, for which there may
        # be no room: refused with ENOSPC, or done and then closed as a version of its own;
        # never EBUSY (was, with passthrough; a reader holds the file meanwhile).
        refused, fd = None, -1
        reader = os.open(path, os.O_RDONLY)
        try:
            fd = os.open(path, os.O_RDWR)
            os.pwrite(fd, b"Z" * 4096, 4096)
        except OSError as e:
            refused = e.errno
        else:
            expected = expected[:4096] + b"Z" * 4096 + expected[8192:]
        finally:
            if fd >= 0:
                os.close(fd)
            os.close(reader)
        assert refused in (None, errno.ENOSPC), f"a write inside the file on a full staging disk: errno {refused}"
        assert read_file(path) == expected, "the mount reads other bytes than the last close left"
        kill_daemon(mp)
        pm.cont()
        os.remove(small / "filler")
        remount(mp, args)
        r = sync(mp)
        assert r.returncode == 0, f"sync after the remount: {r.err}"
        got = pm.objects(bucket).get("A")
        assert got is not None and len(got) == len(expected), \
            f"the bucket holds {None if got is None else len(got)} bytes for A, not the {len(expected)} closed"
        assert got == expected, "the bucket's A is not the version the close returned for"
    finally:
        pm.cont()
        if mp:
            unmount(mp)
        subprocess.run(["umount", "-l", str(small)])


def _small_tmpfs(tmp_path, size: str):
    """A tmpfs of `size` at tmp_path/small, for a staging or cache disk that fills (the test
    is skipped where it cannot be mounted); the caller unmounts it (`umount -l`)."""
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    return small


def _write_until_full(path: str, data: bytes, flush_first: bool = False) -> tuple[int, OSError | None]:
    """Write `data` as a new file at `path`, 1 MiB at a time, until done or `ENOSPC` (any
    other error fails the test), then close it: (bytes written, the close's error). With
    `flush_first` the empty file is flushed first (a `dup`'s close, as `dd` or `cmd > f`)."""
    written, close_err = 0, None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    if flush_first:
        os.close(os.dup(fd))
    try:
        while written < len(data):
            written += os.write(fd, data[written:written + MiB])
    except OSError as e:
        assert e.errno == errno.ENOSPC, f"a write past the staging disk's room: {e!r}"
    try:
        os.close(fd)
    except OSError as e:
        close_err = e
    return written, close_err


def test_a_close_refused_for_a_full_staging_disk_is_named_and_synced_later(s3_bucket, tmp_path):
    """A new file's writes fill the staging disk (`ENOSPC`) and its close cannot commit it
    either (`ENOSPC`). The mount shows what got in; `status` must name the file, and once
    there is room `sync` must upload it (tester X: status said 0 files, sync exited 0 with
    no object in the bucket, and a `kill -9` then set the bytes aside in lost+found)."""
    small = _small_tmpfs(tmp_path, "64m")
    mp = None
    try:
        mp = mount(wb_args(s3_bucket, small / "staging", "--write-back-delay", "600",
                           "--cache-dir", str(tmp_path / "cache")))
        path = os.path.join(mp, "f")
        free = shutil.disk_usage(small).free
        with open(small / "filler", "wb") as f:
            f.write(b"\0" * max(0, free - 1536 * 1024))
        data = os.urandom(4 * MiB)
        written, close_err = _write_until_full(path, data)
        print(f"{written} bytes written; close: {close_err!r}; status: {status(mp)}")
        assert os.stat(path).st_size == written
        if close_err is not None:
            s = status(mp)
            named = [e for e in s["upload_errors"] if e["key"] == "f"]
            assert s["write_back_files"] >= 1 and named, f"status does not name the file its close left: {s}"
        os.remove(small / "filler")
        r = sync(mp)
        assert r.returncode == 0, f"sync after room was freed: {r.err}"
        assert seed.get("s3", s3_bucket.name, "f") == data[:written], "the bucket lacks what the mount shows"
        assert status(mp)["write_back_files"] == 0
    finally:
        if mp:
            unmount(mp)
        subprocess.run(["umount", "-l", str(small)])


def test_a_read_right_after_a_close_that_filled_the_staging_disk_opens(s3_bucket, tmp_path):
    """`cat big > f` fills the staging disk; `f` is read at once. Its close returned, but
    the kernel's RELEASE comes after: the read-only open found the file staged, waited, saw
    it dropped, and staged it again, on a disk still full: `ENOSPC` for about a second
    (tester K). A reader of a file no longer staged reads it through the store instead."""
    small = _small_tmpfs(tmp_path, "24m")
    mp = None
    try:
        args = [seed.mount_url("s3", s3_bucket.name), *seed.mount_extra_args("s3"),
                "--staging-dir", str(small / "staging"), "--cache-dir", str(tmp_path / "cache")]
        mp = mount(args)
        data = os.urandom(40 * MiB)
        filled = 0
        for i in range(4):
            path = os.path.join(mp, f"f{i}")
            written, close_err = _write_until_full(path, data)
            print(f"round {i}: {written} bytes written; close: {close_err!r}")
            filled += written < len(data)
            try:
                got = read_file(path)
            except OSError as e:
                pytest.fail(f"round {i}: a read-only open right after the close: {e!r} (close: {close_err!r})")
            assert got == data[:written], f"round {i}: read {len(got)} bytes, not the {written} written"
            assert seed.get("s3", s3_bucket.name, f"f{i}") == got, f"round {i}: the bucket lacks what the mount shows"
            os.unlink(path)
        assert filled, "the staging disk never filled (the test tried nothing)"
        temporaries = [f for _, _, fs in os.walk(small / "staging") for f in fs if f.endswith(".tmp")]
        assert not temporaries, f"writes the full disk refused left temporaries in staging: {temporaries}"
    finally:
        if mp:
            unmount(mp)
        subprocess.run(["umount", "-l", str(small)])


@pytest.mark.parametrize("write_back", [False, True])
def test_the_kernels_writes_after_a_flush_that_fill_the_staging_disk_are_kept(s3_bucket, tmp_path, write_back):
    """`dd` or a shell redirect: the file is created, flushed empty (a `dup`'s close), then
    written by the kernel directly (passthrough) until the staging disk is full. The close
    could not write the change's marker: the change went unseen, the staged file was
    dropped as clean, and the bucket and the mount kept the empty file (durable), or the
    mount showed a size it could not read (write-back); `sync` exited 0, the log said
    nothing (tester I, 5 of 5). Now what the writes put in is kept and goes up, the disk
    still full."""
    small = _small_tmpfs(tmp_path, "24m")
    mp = None
    try:
        args = [seed.mount_url("s3", s3_bucket.name), *seed.mount_extra_args("s3"),
                "--staging-dir", str(small / "staging"), "--cache-dir", str(tmp_path / "cache")]
        mp = mount(args + (["--write-back"] if write_back else []))
        path = os.path.join(mp, "f")
        data = os.urandom(40 * MiB)
        written, close_err = _write_until_full(path, data, flush_first=True)
        print(f"{written} bytes written; close: {close_err!r}")
        assert 0 < written < len(data), "the staging disk never filled (the test tried nothing)"
        r = sync(mp)
        assert r.returncode == 0, f"sync: {r.err}"
        got = seed.get("s3", s3_bucket.name, "f")
        assert len(got) == written and got == data[:written], \
            f"the bucket holds {len(got)} bytes, not the {written} the writes put in"
        assert os.stat(path).st_size == written
        assert read_file(path) == data[:written]
    finally:
        if mp:
            unmount(mp)
        subprocess.run(["umount", "-l", str(small)])
