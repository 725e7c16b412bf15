"""Real tools on the mount: cp -a, tar -x, dd of 100 MB, git clone + fsck + checkout, and
that tools keep mtimes. Slow tests carry @pytest.mark.slow: `-m "not slow"` skips them."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tarfile
import time

import pytest

import seed
from conftest import MiB, md5, md5_file, read_file
import writekit
from writekit import fs_tree, run, write_path

btgt = writekit.btgt  # a fixture
tgt = writekit.tgt  # a fixture


# --------------------------------------------------------------------------- tools

@pytest.fixture(scope="module")
def src_tree(tmp_path_factory):
    """~200 files in nested dirs, an empty dir, an executable, a 20 MB file, old mtimes."""
    import random
    rng = random.Random(20240601)
    root = tmp_path_factory.mktemp("srctree") / "tree"
    root.mkdir()
    for i in range(199):
        d = root / f"lvl{i % 4}" / f"sub{i % 7}" / ("deep" if i % 3 == 0 else "")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"file{i:03}.dat").write_bytes(rng.randbytes(rng.choice([0, 1, 100, 4096, rng.randrange(0, 60_000)])))
    (root / "empty-dir").mkdir()
    (root / "run.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "big.bin").write_bytes(rng.randbytes(20 * MiB))
    for dp, dns, fns in os.walk(root):
        for n in fns:
            os.utime(os.path.join(dp, n), (1_600_000_000, 1_600_000_000 + len(n)))
    return str(root)


def test_cp_a_tree_and_tar_x(btgt, src_tree, tmp_path):
    files, dirs = fs_tree(src_tree)
    with btgt.mounted() as mp:
        p = run(["cp", "-a", src_tree, os.path.join(mp, "copy")], check=False)
        assert p.returncode == 0 and not p.err, f"cp -a exited {p.returncode}: {p.err[-3000:]}"
        d = run(["diff", "-r", src_tree, os.path.join(mp, "copy")], check=False)
        assert d.returncode == 0, f"diff -r after cp -a:\n{d.out[-3000:]}{d.err[-1000:]}"
        assert fs_tree(os.path.join(mp, "copy")) == (files, dirs)
        assert os.stat(os.path.join(mp, "copy/big.bin")).st_size == 20 * MiB
        bt = btgt.tree("copy/")
        assert bt == files, f"bucket after cp -a: missing {sorted(set(files) - set(bt))[:10]}, " \
                            f"wrong {sorted(k for k in files if k in bt and bt[k] != files[k])[:10]}"
        assert btgt.has_marker("copy/empty-dir")

        # tar -x of a tarball (everything but the 20 MB file), with its modes and mtimes
        tb = tmp_path / "t.tar"
        with tarfile.open(tb, "w") as t:
            for n in sorted(os.listdir(src_tree)):
                if n != "big.bin":
                    t.add(os.path.join(src_tree, n), arcname=n)
        os.mkdir(os.path.join(mp, "untar"))
        p = run(["tar", "-xf", str(tb), "-C", os.path.join(mp, "untar")], check=False)
        assert p.returncode == 0 and not p.err, f"tar -x exited {p.returncode}: {p.err[-3000:]}"
        d = run(["diff", "-r", "-x", "big.bin", src_tree, os.path.join(mp, "untar")], check=False)
        assert d.returncode == 0, f"diff -r after tar -x:\n{d.out[-3000:]}"
        bt = btgt.tree("untar/")
        assert bt == {k: v for k, v in files.items() if k != "big.bin"}

        # cp -p of a single file (its chmod/chown/utimens must not fail)
        src = os.path.join(src_tree, "run.sh")
        p = run(["cp", "-p", src, os.path.join(mp, "run-copy.sh")], check=False)
        assert p.returncode == 0 and not p.err, f"cp -p: {p.err}"
        assert read_file(os.path.join(mp, "run-copy.sh")) == read_file(src)
        assert btgt.get("run-copy.sh") == read_file(src)

        # rsync -a (only if installed; tests never install anything)
        if shutil.which("rsync"):
            p = run(["rsync", "-a", src_tree + "/", os.path.join(mp, "rsynced")], check=False)
            assert p.returncode == 0, f"rsync -a exited {p.returncode}: {p.err[-3000:]}"
            d = run(["diff", "-r", src_tree, os.path.join(mp, "rsynced")], check=False)
            assert d.returncode == 0, d.out[-3000:]
        else:
            print("rsync not installed: rsync -a not tested")
    # everything is still there after a remount
    with btgt.mounted() as mp:
        d = run(["diff", "-r", src_tree, os.path.join(mp, "copy")], check=False)
        assert d.returncode == 0, f"diff -r after remount:\n{d.out[-3000:]}"


def test_tools_keep_mtime(tgt, tmp_path):
    """cp -p, cp -a, tar -x and touch -d set a file's mtime (utimensat, often on the open fd
    before close); stat on the mount shows it, also once the 1 s attribute TTL is over
    (right after the tool, the kernel's attribute cache would hide a lost mtime)."""
    want = 1_600_000_000
    src = tmp_path / "s.txt"
    src.write_bytes(b"payload\n")
    os.utime(src, (want, want))
    tb = tmp_path / "t.tar"
    with tarfile.open(tb, "w") as t:
        t.add(src, arcname="from-tar.txt")
    with tgt.mounted() as mp:
        run(["cp", "-p", str(src), os.path.join(mp, "cp-p.txt")])
        run(["cp", "-a", str(src), os.path.join(mp, "cp-a.txt")])
        run(["tar", "-xf", str(tb), "-C", mp])
        run(["touch", "-d", f"@{want}", os.path.join(mp, "touched-new.txt")])
        write_path(os.path.join(mp, "touched-old.txt"), b"x")
        run(["touch", "-d", f"@{want}", os.path.join(mp, "touched-old.txt")])
        names = ["cp-p.txt", "cp-a.txt", "from-tar.txt", "touched-new.txt", "touched-old.txt"]
        time.sleep(2.5)   # past --metadata-ttl 1
        got = {n: int(os.stat(os.path.join(mp, n)).st_mtime) for n in names}
        assert got == dict.fromkeys(names, want), f"mtime shown after each tool (want {want}): {got}"
        assert read_file(os.path.join(mp, "from-tar.txt")) == b"payload\n"


@pytest.mark.parametrize("mode", ["durable", "write-back"])
def test_an_mtime_moves_only_when_the_file_is_written(tgt, mode):
    """A file's mtime is its last write's, as on a local disk: past the TTL it is not
    replaced by the store's time of the upload (S3 keeps milliseconds: vim then refused
    to save, "changed since reading it"), nor moved by the upload a chmod makes (make
    rebuilt), nor by a write-back upload seconds later."""
    if tgt.store == "file":
        pytest.skip("a local folder's file is the version, named by size and mtime: its mtime is the upload's")
    extra = ["--write-back", "--write-back-delay", "1", "--metadata-ttl", "1"] if mode == "write-back" else []
    with tgt.mounted(extra=extra) as mp:
        path = os.path.join(mp, "f.txt")
        write_path(path, b"line1\n")
        written = os.stat(path).st_mtime_ns
        time.sleep(2.5)  # past --metadata-ttl 1 (and the write-back delay)
        assert os.stat(path).st_mtime_ns == written, "the mtime moved with nobody writing"
        os.chmod(path, 0o600)
        time.sleep(2.5)
        st = os.stat(path)
        assert (st.st_mtime_ns, st.st_mode & 0o777) == (written, 0o600), "a chmod moved the mtime"


@pytest.mark.parametrize("mode", ["durable", "write-back"])
def test_a_write_moves_an_mtime_that_was_set(tgt, mode):
    """After `touch -d`, `cp -p`, `tar x` or `rsync -a` set a file's mtime, a later write,
    append or truncate sets it to that moment, in the mount and in the bucket (a remount).
    Before, the set mtime stayed for good: an `rsync -a` backup skipped the edit, `make`
    built from a stale header."""
    extra = ["--write-back", "--write-back-delay", "1"] if mode == "write-back" else []
    old = 1_000_000_000
    changes = {
        "written": lambda p: write_path(p, b"9876543210"),
        "appended": lambda p: open(p, "ab").write(b"more"),
        "truncated": lambda p: os.truncate(p, 4),
    }
    with tgt.mounted(extra=extra + ["--metadata-ttl", "1"]) as mp:
        for name in changes:
            write_path(os.path.join(mp, name), b"0123456789")
            os.utime(os.path.join(mp, name), (old, old))
        time.sleep(2.5)  # past the TTL
        assert {n: int(os.stat(os.path.join(mp, n)).st_mtime) for n in changes} == dict.fromkeys(changes, old)
        started = time.time() - 2  # (the clock's granularity)
        for name, change in changes.items():
            change(os.path.join(mp, name))
        time.sleep(2.5)
        got = {n: os.stat(os.path.join(mp, n)).st_mtime for n in changes}
        assert all(t >= started for t in got.values()), f"mtime after the change (started {started}): {got}"
    if tgt.store == "mem":
        return  # nothing outlives a mount of memory
    with tgt.mounted() as mp:
        got = {n: os.stat(os.path.join(mp, n)).st_mtime for n in changes}
        assert all(t >= started for t in got.values()), f"mtime after a remount (started {started}): {got}"


def test_mknod_of_a_regular_file_and_tar_xattrs(tgt, tmp_path):
    """GNU tar --xattrs makes each file with mknod(S_IFREG): an empty file, made exclusively
    (before, ENOSYS: the file and its data were left out, tar exited 2). Other kinds stay
    unsupported."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"payload\n")
    tb = tmp_path / "x.tar"
    try:
        os.setxattr(src / "f", "user.k", b"v")
        run(["tar", "--xattrs", "-cf", str(tb), "-C", str(src), "f"])
    except (OSError, AssertionError) as e:
        tb = None
        print(f"tar --xattrs not tried: {e}")
    with tgt.mounted() as mp:
        node = os.path.join(mp, "node")
        os.mknod(node, 0o600 | stat.S_IFREG)
        st = os.stat(node)
        assert (stat.S_ISREG(st.st_mode), st.st_mode & 0o777, st.st_size) == (True, 0o600, 0)
        with pytest.raises(FileExistsError):
            os.mknod(node, 0o600 | stat.S_IFREG)
        with pytest.raises(OSError) as e:
            os.mkfifo(os.path.join(mp, "fifo"))
        assert e.value.errno == errno.ENOSYS
        if tb:
            os.mkdir(os.path.join(mp, "x"))
            p = run(["tar", "--xattrs", "-xf", str(tb), "-C", os.path.join(mp, "x")], check=False)
            assert p.returncode == 0, f"tar --xattrs -x exited {p.returncode}: {p.err}"
            assert read_file(os.path.join(mp, "x", "f")) == b"payload\n"


@pytest.mark.slow
def test_large_sequential_dd(btgt, tmp_path):
    """~100 MB written with dd bs=1M (eager multipart upload); md5 via mount and bucket match."""
    src = tmp_path / "big.src"
    with open(src, "wb") as f:
        f.write(os.urandom(100 * MiB + 12345))
    want = md5_file(str(src))
    with btgt.mounted() as mp:
        dst = os.path.join(mp, "big.bin")
        t0 = time.monotonic()
        run(["dd", f"if={src}", f"of={dst}", "bs=1M", "status=none"], timeout=600)
        print(f"{btgt.store}: dd 100 MB in {time.monotonic() - t0:.1f}s")
        assert os.stat(dst).st_size == 100 * MiB + 12345
        got_bucket = btgt.get("big.bin")
        assert len(got_bucket) == 100 * MiB + 12345 and md5(got_bucket) == want, \
            f"bucket holds {len(got_bucket)} bytes md5 {md5(got_bucket)}; wrote md5 {want}"
        del got_bucket
        assert md5_file(dst) == want, "md5 through the mount differs"
        if btgt.store == "s3":
            left = seed.s3_client().list_multipart_uploads(Bucket=btgt.bucket.name).get("Uploads", [])
            assert not left, f"multipart uploads left open: {[u['Key'] for u in left]}"
    with btgt.mounted() as mp:
        assert md5_file(os.path.join(mp, "big.bin")) == want, "md5 after remount differs"


def _git_env(home: str) -> dict:
    env = dict(os.environ)
    env.update(HOME=home, GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.invalid", GIT_TERMINAL_PROMPT="0")
    return env


@pytest.fixture(scope="module")
def git_source(tmp_path_factory):
    """A repository with ~300 files, 4 commits, a binary file and an executable script."""
    if not shutil.which("git"):
        pytest.skip("git not installed")
    import random
    rng = random.Random(99)
    base = tmp_path_factory.mktemp("gitsrc")
    home = base / "home"
    home.mkdir()
    env = _git_env(str(home))
    repo = base / "repo"
    repo.mkdir()
    g = lambda *a: run(["git", "-C", str(repo)] + list(a), env=env)  # noqa: E731
    g("init", "-q", "-b", "main")
    for i in range(280):
        d = repo / "src" / f"mod{i % 12}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"unit{i:03}.txt").write_text("".join(f"line {j} of unit {i} {rng.random()}\n"
                                                   for j in range(rng.randrange(1, 60))))
    (repo / "assets").mkdir()
    (repo / "assets/blob.bin").write_bytes(rng.randbytes(300_000))
    (repo / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    os.chmod(repo / "tool.sh", 0o755)
    g("add", "-A")
    g("commit", "-q", "-m", "one")
    for i in range(0, 280, 6):
        with open(repo / "src" / f"mod{i % 12}" / f"unit{i:03}.txt", "a") as f:
            f.write("changed in two\n")
    for i in range(5, 60, 11):
        (repo / "src" / f"mod{i % 12}" / f"unit{i:03}.txt").unlink()
    for i in range(20):
        (repo / "new").mkdir(exist_ok=True)
        (repo / "new" / f"n{i}.txt").write_text(f"new {i}\n")
    g("add", "-A")
    g("commit", "-q", "-m", "two")
    g("mv", "src/mod3", "src/moved3")
    g("commit", "-q", "-m", "three")
    (repo / "assets/blob.bin").write_bytes(rng.randbytes(310_000))
    g("commit", "-q", "-am", "four")
    commits = g("rev-list", "--reverse", "HEAD").out.split()
    assert len(commits) == 4
    return str(repo), commits, env


@pytest.mark.slow
def test_git_clone_into_mount(btgt, git_source, tmp_path):
    """git clone (300 files, 4 commits, a binary and an executable) into the mount; fsck,
    checkout of an older commit, a clean status, files equal to the source and the bucket."""
    repo, commits, env = git_source
    statuses = {}
    with btgt.mounted() as mp:
        clone = os.path.join(mp, "clone")
        t0 = time.monotonic()
        run(["git", "clone", "-q", "--no-hardlinks", "file://" + repo, clone], env=env, timeout=600)
        print(f"{btgt.store}: git clone in {time.monotonic() - t0:.1f}s")
        run(["git", "-C", clone, "fsck", "--full", "--strict"], env=env, timeout=600)
        head_src, _ = fs_tree(repo, skip={".git"})
        head_clone, _ = fs_tree(clone, skip={".git"})
        assert head_clone == head_src, "checked-out files differ from the source"
        statuses["after clone"] = run(["git", "-C", clone, "status", "--porcelain"], env=env).out

        old = tmp_path / "old"
        old.mkdir()
        arch = run(["git", "-C", repo, "archive", "--format=tar", commits[1]], env=env)
        with open(tmp_path / "old.tar", "wb") as f:
            f.write(arch.stdout)
        run(["tar", "-xf", str(tmp_path / "old.tar"), "-C", str(old)])
        run(["git", "-C", clone, "checkout", "-q", commits[1]], env=env, timeout=600)
        statuses[f"after checkout {commits[1][:8]}"] = run(["git", "-C", clone, "status", "--porcelain"], env=env).out
        old_tree, _ = fs_tree(str(old))
        assert fs_tree(clone, skip={".git"})[0] == old_tree, "older checkout differs from git archive"
        run(["git", "-C", clone, "fsck", "--full"], env=env, timeout=600)
        # the bucket holds the older commit's working tree exactly
        bt = btgt.tree("clone/", skip={".git"})
        assert bt == old_tree, f"bucket worktree: missing {sorted(set(old_tree) - set(bt))[:5]}, " \
                               f"extra {sorted(set(bt) - set(old_tree))[:5]}"
    # a remount sees a sound repository at the same commit
    with btgt.mounted() as mp:
        clone = os.path.join(mp, "clone")
        run(["git", "-C", clone, "fsck", "--full"], env=env, timeout=600)
        assert run(["git", "-C", clone, "rev-parse", "HEAD"], env=env).out.strip() == commits[1]
        assert fs_tree(clone, skip={".git"})[0] == old_tree
    # last, as it depends on file modes (tool.sh is executable in the source)
    assert all(v == "" for v in statuses.values()), f"git status --porcelain not clean: {statuses}"
