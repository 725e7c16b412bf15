"""Write-back mode while the store hangs (`bucketfs mount --write-back`), through the kernel
on a private MinIO stopped with SIGSTOP (hangkit.py): a store that accepts connections and
never answers, as the bug was reported, not one that refuses them. It is always continued
(SIGCONT) in a `finally`.

docs/SEMANTICS.md "Write-back mode" promises:
  - closes, unlinks and renames of pending files take local time: the store is asked nothing
    that they wait for, so a store that hangs stalls none of them, and a name renamed away
    while it hung stays away;
  - a file whose upload hangs is read at once, and written within a writer's patience;
  - `bucketfs sync` names what it could not upload and why (exit 1).

Each asserts something that can fail, and none depends on timing beyond generous bounds (a
call "returns within 5 s" while the store hangs for 30 s).
"""

from __future__ import annotations

import os
import random
import subprocess
import time

import pytest

from conftest import (BIN, bounded_calls, bucketfs_env, md5, mount, read_file, run_cli, unmount, wait_until,
                      write_file)
from hangkit import (LOCAL_CALL_LIMIT, MiB, SYNC_HANG_LIMIT, SYNC_TIMEOUT, WRITER_LIMIT, files_only, mount_view,
                     outcome_table, stalled_calls, store_hangs, sync, hung_minio, private_minio)  # noqa: F401 - fixtures
from test_write_back import status


# --------------------------------------------------------------------------- 4-6. a hanging store


def append(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_a_hanging_store_does_not_stall_local_calls(hung_minio, tmp_path):
    """With a 64 MiB upload in flight, the store hangs (SIGSTOP) for 30 s. Each of these
    returns within 5 s, with no error: close of a new small file (in a directory made here),
    rename of that pending file (its upload begun and hanging: --write-back-delay 0), unlink
    of an uploaded file, stat of a known file, listdir of a listed directory, mkdir, rmdir
    of a directory in the bucket, and of one made during the hang, a directory made, written
    and renamed (a checkpoint), symlink, readlink of that link
    and a lookup beside it, an append to and a chmod of files uploaded before it. Then the store
    continues: `bucketfs
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

        with store_hangs(pm) as (op, outs):
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

            def checkpoint():  # a training job's: written under a temporary name, then renamed
                os.makedirs(p("m", "tmp", "shard"))
                write_file(p("m", "tmp", "model.bin"), b"weights")
                write_file(p("m", "tmp", "shard", "0.bin"), b"shard 0")
                os.rename(p("m", "tmp"), p("m", "ckpt"))
            op("mkdir, write, rename of the directory", checkpoint)
            op("listdir of the directory renamed", lambda: sorted(os.listdir(p("m", "ckpt"))))
            op("mkdir, rename of it, listdir",
               lambda: (os.mkdir(p("m", "e")), os.rename(p("m", "e"), p("m", "e2")), os.listdir(p("m", "e2"))))
            # The kernel holds the directory locked during a symlink: one waiting for the
            # store stalled every lookup of a new name there.
            op("symlink in a listed directory", lambda: os.symlink("../s/st.txt", p("l", "link")))
            op("readlink of it", lambda: os.readlink(p("l", "link")))
            op("lookup of a missing name beside it", lambda: os.path.lexists(p("l", "missing")))
            # Files uploaded by this mount are staged again from its read caches: no GET.
            op("append to a file uploaded before", lambda: append(p("l", "b"), b"+appended"))
            op("chmod of a file uploaded before", lambda: os.chmod(p("l", "c"), 0o600))
        t_cont = time.monotonic()
        # Every call held by the hang finishes before the result is looked at.
        stalled = stalled_calls(outs, 120)
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
            files.pop("l/link", None)  # read through the link: st.txt's bytes
            got = {k: md5(v) for k, v in files_only(pm.objects(bucket)).items()}
            if got.pop("l/link.rclonelink", None) != md5(b"../s/st.txt"):
                problems.append("the symlink made during the hang is not in the bucket as l/link.rclonelink")
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
            if {"m/ckpt/", "m/ckpt/shard/"} - keys or any(k.startswith("m/tmp/") for k in keys):
                problems.append(f"a directory renamed during the hang: {sorted(k for k in keys if '/tmp/' in k or '/ckpt/' in k)}")
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
        if has_timeout:
            assert "have not finished" in err, f"`{what}` did not say its uploads are still waiting: {err!r}"
    finally:
        pm.cont()
        unmount(mp)


def test_names_known_past_their_ttl_answer_while_the_store_hangs(hung_minio, tmp_path):
    """With --metadata-ttl 1, what the mount knows answers once the TTL ran out and the store
    hangs (SIGSTOP): each call returns within 5 s, with what the mount knew: stat of a file,
    listdir of a listed directory (and of a subdirectory listed with it), a walk of four
    listed directories (the first listing overdue shows the store hangs: the next ones do
    not wait again), unlink of a file, a rename of a file in the bucket and a second rename
    of it (their moves are journaled and sent in order once the store answers), a new file
    in a listed directory, a read of a file read before. When the store
    continues, `bucketfs sync` exits 0 and the bucket matches the mount."""
    pm = hung_minio
    bucket = pm.new_bucket()
    mp = mount(pm.wb_args(bucket, tmp_path / "staging", "--write-back-delay", "0", "--metadata-ttl", "1"))
    try:
        p = lambda *a: os.path.join(mp, *a)  # noqa: E731
        os.makedirs(p("d", "sub"))
        names = {"st": b"to be stat'ed", "un": b"to be unlinked", "rd": b"read before and after",
                 "mv": b"renamed during the hang", "ap": b"appended to", "tr": b"truncated to 5",
                 "rw": b"written over in place"}
        for n, data in names.items():
            write_file(p("d", n), data)
        write_file(p("d", "sub", "inner"), b"inner")
        walk = [p("w"), p("w", "x"), p("w", "x", "y"), p("w", "x", "y", "z")]
        os.makedirs(walk[-1])
        write_file(p("w", "x", "y", "z", "leaf"), b"leaf")
        assert sync(mp).returncode == 0
        assert [os.listdir(d) for d in walk] == [["x"], ["y"], ["z"], ["leaf"]]
        assert sorted(os.listdir(p("d"))) == sorted(list(names) + ["sub"])
        assert os.listdir(p("d", "sub")) == ["inner"]
        for n in ("rd", "ap", "tr", "rw"):
            assert read_file(p("d", n)) == names[n]
        time.sleep(2.5)  # every name and listing is past its TTL

        def write_over():
            with open(p("d", "rw"), "r+b") as f:
                f.write(b"W")
        with store_hangs(pm) as (op, outs):
            # First: a HEAD overdue would spare the walk its waits (it shows the store hangs too).
            op("a walk of four listed directories", lambda: [os.listdir(d) for d in walk])
            op("stat of a known file", lambda: os.stat(p("d", "st")).st_size)
            op("listdir of a listed directory", lambda: sorted(os.listdir(p("d"))))
            op("listdir of its subdirectory", lambda: os.listdir(p("d", "sub")))
            op("unlink of a known file", lambda: os.unlink(p("d", "un")))
            op("rename of a file in the bucket", lambda: os.rename(p("d", "mv"), p("d", "moved")))
            op("a second rename of it", lambda: os.rename(p("d", "moved"), p("d", "moved2")))
            op("a new file in a listed directory", lambda: write_file(p("d", "new"), b"made during the hang"))
            op("read of a file read before", lambda: read_file(p("d", "rd")))
            # Its whole version in the read caches: no store needed (these waited 2 minutes).
            op("append to a file read before", lambda: append(p("d", "ap"), b"+"))
            op("truncate of a file read before", lambda: os.truncate(p("d", "tr"), 5))
            op("a write in place to a file read before", write_over)
        stalled = stalled_calls(outs, 150)
        r = sync(mp)
        problems = []
        if stalled:
            problems.append(f"calls stalled by the hanging store (limit {LOCAL_CALL_LIMIT}s): {outcome_table(stalled)}")
        wrong = {k: outs[k].value for k, want in [("stat of a known file", len(names["st"])),
                                                  ("listdir of its subdirectory", ["inner"]),
                                                  ("a walk of four listed directories",
                                                   [["x"], ["y"], ["z"], ["leaf"]]),
                                                  ("read of a file read before", names["rd"])]
                 if outs[k].done and outs[k].error is None and outs[k].value != want}
        if wrong:
            problems.append(f"wrong answers during the hang: {wrong}")
        if r.returncode != 0:
            problems.append(f"sync after the store came back exited {r.returncode}: {r.err.strip()[-500:]}")
        else:
            files, _ = mount_view(mp)
            got = {k: md5(v) for k, v in files_only(pm.objects(bucket)).items()}
            want = {f"d/{n}": md5(v) for n, v in names.items() if n not in ("un", "mv")}
            want["d/moved2"] = md5(names["mv"])
            want.update({"d/ap": md5(names["ap"] + b"+"), "d/tr": md5(names["tr"][:5]),
                         "d/rw": md5(b"W" + names["rw"][1:])})
            want.update({"d/new": md5(b"made during the hang"), "d/sub/inner": md5(b"inner"),
                         "w/x/y/z/leaf": md5(b"leaf")})
            if got != want or files != want:
                problems.append(f"after the hang: bucket {sorted(got.items())}, mount {sorted(files.items())}, "
                                f"expected {sorted(want.items())}")
        assert not problems, "; ".join(problems)
    finally:
        pm.cont()
        unmount(mp)
