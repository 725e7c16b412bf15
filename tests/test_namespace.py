"""The write path through the kernel: namespace changes (create, mkdir, rmdir, unlink,
rename) and attributes. create/touch gives a 0-byte object, mkdir a `dir/` marker, rename
moves keys; each test checks the bucket with an independent client (writekit.Target)."""

from __future__ import annotations

import errno
import os
import random
import stat
import time

import pytest

from conftest import BIN, md5, read_file
import writekit
from writekit import expect_errno, fs_tree, make_existing, read_fd, rename_or_report, run, write_path

btgt = writekit.btgt  # a fixture
tgt = writekit.tgt  # a fixture


# --------------------------------------------------------------------------- namespace

def test_touch_creates_empty_object(tgt):
    if tgt.persistent:
        tgt.put("kept.txt", b"keep")
    with tgt.mounted() as mp:
        make_existing(tgt, mp, "kept.txt", b"keep")
        run(["touch", os.path.join(mp, "empty")])
        st = os.stat(os.path.join(mp, "empty"))
        assert stat.S_ISREG(st.st_mode) and st.st_size == 0
        assert "empty" in os.listdir(mp)
        if tgt.persistent:
            assert tgt.has("empty"), f"touch: no 'empty' object; bucket holds {tgt.keys()}"
            assert tgt.get("empty") == b""
        # touching an existing file changes its times, never its content
        run(["touch", os.path.join(mp, "kept.txt")])
        assert read_file(os.path.join(mp, "kept.txt")) == b"keep"
        if tgt.persistent:
            assert tgt.get("kept.txt") == b"keep"
        # O_CREAT|O_EXCL on an existing name
        expect_errno("O_EXCL on existing", lambda: os.open(os.path.join(mp, "empty"),
                                                          os.O_WRONLY | os.O_CREAT | os.O_EXCL), errno.EEXIST)
    if tgt.persistent:
        with tgt.mounted() as mp:
            assert os.stat(os.path.join(mp, "empty")).st_size == 0


@pytest.mark.parametrize("write_back", [False, True], ids=["default", "write-back"])
def test_a_file_beside_a_longer_directory_is_found_before_any_listing(btgt, write_back):
    """`log` beside `logs/` on a fresh mount, before anything lists the root: the listing
    that probes `log` sends `logs/` first (S3 and GCS send a page's prefixes before its
    objects). It was not found: `>>` replaced the file, `mkdir log` made a directory."""
    for k, v in [("log", b"line1\nline2\n"), ("logs/old.gz", b"z"), ("dir/x", b"x")]:
        btgt.put(k, v)
    flags = ["--write-back"] if write_back else []
    with btgt.mounted(flags) as mp:
        with open(os.path.join(mp, "log"), "ab") as f:
            f.write(b"line3\n")
        assert read_file(os.path.join(mp, "log")) == b"line1\nline2\nline3\n"
        if write_back:
            run([BIN, "sync", mp])
    assert btgt.get("log") == b"line1\nline2\nline3\n", "the append kept what the file held"
    with btgt.mounted(flags) as mp:
        expect_errno("mkdir over a file", lambda: os.mkdir(os.path.join(mp, "log")), errno.EEXIST)
        expect_errno("rename a directory over a file",
                     lambda: os.rename(os.path.join(mp, "dir"), os.path.join(mp, "log")), errno.ENOTDIR)
        assert os.path.isfile(os.path.join(mp, "log"))
    assert sorted(btgt.keys()) == ["dir/x", "log", "logs/old.gz"]


def test_mkdir_persists_and_rmdir(tgt):
    with tgt.mounted() as mp:
        os.mkdir(os.path.join(mp, "solo"))
        os.makedirs(os.path.join(mp, "a/b/c"))
        assert os.path.isdir(os.path.join(mp, "a/b/c"))
        assert sorted(os.listdir(mp)) == ["a", "solo"]
        assert os.listdir(os.path.join(mp, "a/b/c")) == []
        expect_errno("mkdir existing", lambda: os.mkdir(os.path.join(mp, "solo")), errno.EEXIST)
        if tgt.persistent:
            for d in ("solo", "a/b/c"):
                assert tgt.has_marker(d), f"mkdir {d}: no marker in the bucket; bucket holds {tgt.keys()}"
        # files inside a new directory
        write_path(os.path.join(mp, "a/b/f.txt"), b"f")
        expect_errno("rmdir a (has a/b)", lambda: os.rmdir(os.path.join(mp, "a")), errno.ENOTEMPTY, errno.EEXIST)
        expect_errno("rmdir a/b (has c and f.txt)", lambda: os.rmdir(os.path.join(mp, "a/b")),
                     errno.ENOTEMPTY, errno.EEXIST)
        os.rmdir(os.path.join(mp, "a/b/c"))
        assert not os.path.exists(os.path.join(mp, "a/b/c"))
        if tgt.persistent:
            assert not tgt.has_dir("a/b/c"), f"rmdir a/b/c: still in the bucket: {tgt.keys('a/b/c')}"
    if not tgt.persistent:
        return
    with tgt.mounted() as mp:
        assert sorted(os.listdir(mp)) == ["a", "solo"], "directories did not survive a remount"
        assert os.listdir(os.path.join(mp, "solo")) == [], "an empty directory did not survive a remount"
        assert sorted(os.listdir(os.path.join(mp, "a/b"))) == ["f.txt"]
        os.rmdir(os.path.join(mp, "solo"))
        assert "solo" not in os.listdir(mp)
    with tgt.mounted() as mp:
        assert "solo" not in os.listdir(mp), "rmdir'ed directory came back after remount"
    assert not tgt.has_dir("solo")


def test_rmdir_nonempty_fails(tgt):
    if tgt.persistent:
        tgt.put("implicit/x.txt", b"x")   # a directory with no marker, only a child key
    with tgt.mounted() as mp:
        if not tgt.persistent:
            os.mkdir(os.path.join(mp, "implicit"))
            write_path(os.path.join(mp, "implicit/x.txt"), b"x")
        expect_errno("rmdir implicit dir", lambda: os.rmdir(os.path.join(mp, "implicit")), errno.ENOTEMPTY, errno.EEXIST)
        # a directory whose only child is still being written (not yet uploaded)
        os.mkdir(os.path.join(mp, "pending"))
        fd = os.open(os.path.join(mp, "pending/open.txt"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"not closed yet")
            expect_errno("rmdir dir with an open new file", lambda: os.rmdir(os.path.join(mp, "pending")),
                         errno.ENOTEMPTY, errno.EEXIST)
        finally:
            os.close(fd)
        expect_errno("rmdir of a file", lambda: os.rmdir(os.path.join(mp, "implicit/x.txt")), errno.ENOTDIR)
        expect_errno("rmdir missing", lambda: os.rmdir(os.path.join(mp, "nope")), errno.ENOENT)
        # emptied, it goes
        os.unlink(os.path.join(mp, "pending/open.txt"))
        os.rmdir(os.path.join(mp, "pending"))
        assert not os.path.exists(os.path.join(mp, "pending"))
        assert os.path.exists(os.path.join(mp, "implicit/x.txt"))
    if tgt.persistent:
        assert tgt.keys() == ["implicit/x.txt"]


def test_unlink(tgt):
    if tgt.persistent:
        tgt.put("gone.txt", b"bye")
        tgt.put("d/inner.txt", b"in")
    with tgt.mounted() as mp:
        make_existing(tgt, mp, "gone.txt", b"bye")
        if not tgt.persistent:
            os.mkdir(os.path.join(mp, "d"))
            write_path(os.path.join(mp, "d/inner.txt"), b"in")
        os.unlink(os.path.join(mp, "gone.txt"))
        assert not os.path.exists(os.path.join(mp, "gone.txt"))
        assert "gone.txt" not in os.listdir(mp)
        if tgt.persistent:
            assert not tgt.has("gone.txt"), "unlink: the object is still in the bucket"
        expect_errno("unlink missing", lambda: os.unlink(os.path.join(mp, "gone.txt")), errno.ENOENT)
        expect_errno("unlink a directory", lambda: os.unlink(os.path.join(mp, "d")), errno.EISDIR, errno.EPERM)
        # unlink the last file of an implicit directory
        os.unlink(os.path.join(mp, "d/inner.txt"))
        if os.path.isdir(os.path.join(mp, "d")):
            assert os.listdir(os.path.join(mp, "d")) == []
        # an open file unlinked while being written: readable through its fd, never uploaded
        p = os.path.join(mp, "tmpfile")
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"scratch")
            os.fsync(fd)
            os.unlink(p)
            os.write(fd, b" more")
            assert read_fd(fd) == b"scratch more"
            assert not os.path.exists(p)
        finally:
            os.close(fd)
        assert not os.path.exists(p)
        assert "tmpfile" not in os.listdir(mp)
        if tgt.persistent:
            time.sleep(0.3)   # release runs after close returns
            assert not tgt.has("tmpfile"), "a file unlinked while open was uploaded at close"
    if tgt.persistent:
        # (file:// keeps the emptied directory `d` on disk, which lists as a marker `d/`)
        files = [k for k in tgt.keys() if not k.endswith("/")]
        assert files == [], f"bucket should hold no objects, holds {tgt.keys()}"


def test_rename_file(tgt, rng):
    a, b = rng.randbytes(100_000), rng.randbytes(5000)
    if tgt.persistent:
        tgt.put("a.bin", a)
        tgt.put("target.bin", b)
    with tgt.mounted() as mp:
        make_existing(tgt, mp, "a.bin", a)
        make_existing(tgt, mp, "target.bin", b)
        os.mkdir(os.path.join(mp, "sub"))
        os.rename(os.path.join(mp, "a.bin"), os.path.join(mp, "renamed.bin"))
        assert not os.path.exists(os.path.join(mp, "a.bin"))
        assert md5(read_file(os.path.join(mp, "renamed.bin"))) == md5(a)
        if tgt.persistent:
            assert not tgt.has("a.bin"), "rename: old key still in the bucket"
            assert md5(tgt.get("renamed.bin")) == md5(a)
        # into another directory
        os.rename(os.path.join(mp, "renamed.bin"), os.path.join(mp, "sub/moved.bin"))
        assert md5(read_file(os.path.join(mp, "sub/moved.bin"))) == md5(a)
        # over an existing file: the target now holds the source's bytes
        os.rename(os.path.join(mp, "sub/moved.bin"), os.path.join(mp, "target.bin"))
        assert md5(read_file(os.path.join(mp, "target.bin"))) == md5(a)
        assert not os.path.exists(os.path.join(mp, "sub/moved.bin"))
        assert sorted(os.listdir(mp)) == ["sub", "target.bin"]
        assert os.listdir(os.path.join(mp, "sub")) == []
        if tgt.persistent:
            assert md5(tgt.get("target.bin")) == md5(a), "rename over: the target object is not the source's"
            assert not tgt.has("sub/moved.bin") and not tgt.has("renamed.bin")
        # a file renamed while still open for writing; writes after the rename land too
        p = os.path.join(mp, "draft.txt")
        fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"part1-")
            os.rename(p, os.path.join(mp, "final.txt"))
            os.write(fd, b"part2")
        finally:
            os.close(fd)
        assert read_file(os.path.join(mp, "final.txt")) == b"part1-part2"
        assert not os.path.exists(p)
        if tgt.persistent:
            assert tgt.get("final.txt") == b"part1-part2", \
                f"renamed-while-open file: bucket holds {tgt.get('final.txt')!r}"
            assert not tgt.has("draft.txt"), "renamed-while-open file: old key appeared in the bucket"
        # errors
        expect_errno("rename missing", lambda: os.rename(os.path.join(mp, "nope"), os.path.join(mp, "x")), errno.ENOENT)
        expect_errno("rename file over dir", lambda: os.rename(os.path.join(mp, "final.txt"), os.path.join(mp, "sub")),
                     errno.EISDIR)
    if tgt.persistent:
        keys = tgt.keys()
        assert [k for k in keys if not k.endswith("/")] == ["final.txt", "target.bin"], keys
        with tgt.mounted() as mp:
            assert md5(read_file(os.path.join(mp, "target.bin"))) == md5(a)
            assert read_file(os.path.join(mp, "final.txt")) == b"part1-part2"


def test_rename_populated_directory(btgt, rng):
    """A directory of objects (implicit subdirectories, as other tools upload them), plus a
    file written through the mount and one still open for writing, renamed into another
    directory: every key moves, checksums are equal, nothing is left under the old name."""
    tree = {"d0/d1/seed.bin": rng.randbytes(1000)}
    for i in range(25):
        parts = [f"d{rng.randrange(3)}" for _ in range(rng.randrange(0, 3))]
        tree["/".join(parts + [f"f{i}.bin"])] = rng.randbytes(rng.randrange(0, 40_000))
    btgt.bucket.put_all({f"proj/{k}": v for k, v in tree.items()})
    with btgt.mounted() as mp:
        src = os.path.join(mp, "proj")
        write_path(os.path.join(src, "d0/written.txt"), b"written through the mount")
        fd = os.open(os.path.join(src, "d0/d1/open.txt"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"before rename;")
            before_files, before_dirs = fs_tree(src)
            assert len(before_files) == len(tree) + 2
            os.mkdir(os.path.join(mp, "archive"))
            rename_or_report(btgt, src, os.path.join(mp, "archive/proj2"))
            os.write(fd, b"after rename")
        finally:
            os.close(fd)
        before_files["d0/d1/open.txt"] = md5(b"before rename;after rename")
        assert not os.path.exists(src)
        after_files, after_dirs = fs_tree(os.path.join(mp, "archive/proj2"))
        assert after_files == before_files, "tree checksums differ after the directory rename"
        assert after_dirs == before_dirs
        old_keys = btgt.keys("proj/")
        assert old_keys == [], f"keys left under (or written back to) the old name: {old_keys}"
        assert btgt.tree("archive/proj2/") == before_files
    with btgt.mounted() as mp:
        assert os.listdir(mp) == ["archive"]
        assert fs_tree(os.path.join(mp, "archive/proj2")) == (before_files, before_dirs)


def test_rename_directory_errors(tgt):
    """Into itself: EINVAL; over a non-empty dir: ENOTEMPTY; over a file: ENOTDIR; a file
    over a dir: EISDIR; over an empty dir: replaces it. (Directories without subdirectories.)"""
    with tgt.mounted() as mp:
        j = lambda *a: os.path.join(mp, *a)  # noqa: E731
        os.mkdir(j("d"))
        write_path(j("d", "f.txt"), b"f")
        os.mkdir(j("other"))
        write_path(j("other", "keep.txt"), b"k")
        os.mkdir(j("emptytarget"))
        expect_errno("rename dir into itself", lambda: os.rename(j("d"), j("d", "inner")), errno.EINVAL)
        expect_errno("rename dir over non-empty dir", lambda: os.rename(j("d"), j("other")),
                     errno.ENOTEMPTY, errno.EEXIST)
        expect_errno("rename dir over file", lambda: os.rename(j("d"), j("other", "keep.txt")), errno.ENOTDIR)
        expect_errno("rename file over dir", lambda: os.rename(j("d", "f.txt"), j("emptytarget")), errno.EISDIR)
        assert read_file(j("d", "f.txt")) == b"f" and read_file(j("other", "keep.txt")) == b"k"
        os.rename(j("other"), j("emptytarget"))
        assert os.listdir(j("emptytarget")) == ["keep.txt"]
        assert sorted(os.listdir(mp)) == ["d", "emptytarget"]
        if tgt.persistent:
            assert sorted(k for k in tgt.keys() if not k.endswith("/")) == ["d/f.txt", "emptytarget/keep.txt"]
            assert tgt.keys("other/") == []
    if tgt.persistent:
        with tgt.mounted() as mp:
            assert sorted(os.listdir(mp)) == ["d", "emptytarget"]
            assert read_file(os.path.join(mp, "emptytarget/keep.txt")) == b"k"


def test_renameat2_flags_a_bucket_cannot_honour_are_einval(tgt):
    """RENAME_EXCHANGE (an atomic swap) and RENAME_WHITEOUT (overlayfs: a whiteout device
    left at the source) fail with EINVAL and change nothing; RENAME_WHITEOUT did a plain
    rename and reported success. RENAME_NOREPLACE works."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, noreplace, exchange, whiteout = -100, 1, 2, 4
    with tgt.mounted() as mp:
        a, b = os.path.join(mp, "a"), os.path.join(mp, "b")
        write_path(a, b"A")
        write_path(b, b"B")
        # (An exchange needs both names to exist, or the kernel says ENOENT itself.)
        for flag, target in ((exchange, b), (whiteout, os.path.join(mp, "c"))):
            rc = libc.renameat2(at_fdcwd, a.encode(), at_fdcwd, target.encode(), flag)
            assert rc == -1 and ctypes.get_errno() == errno.EINVAL, (flag, rc, ctypes.get_errno())
        rc = libc.renameat2(at_fdcwd, a.encode(), at_fdcwd, b.encode(), noreplace)
        assert rc == -1 and ctypes.get_errno() == errno.EEXIST, (rc, ctypes.get_errno())
        assert sorted(os.listdir(mp)) == ["a", "b"]
        assert read_file(a) == b"A" and read_file(b) == b"B"


def test_rename_directory_made_with_mkdir(tgt, rng):
    """mkdir -p makes a marker per directory; renaming the tree moves markers and files."""
    with tgt.mounted() as mp:
        os.makedirs(os.path.join(mp, "a/b/c"))
        os.mkdir(os.path.join(mp, "a/empty"))
        data = {"one.txt": rng.randbytes(10), "b/two.bin": rng.randbytes(50_000), "b/c/three.bin": rng.randbytes(3)}
        for k, v in data.items():
            write_path(os.path.join(mp, "a", k), v)
        before = fs_tree(os.path.join(mp, "a"))
        rename_or_report(tgt, os.path.join(mp, "a"), os.path.join(mp, "z"))
        assert not os.path.exists(os.path.join(mp, "a"))
        assert fs_tree(os.path.join(mp, "z")) == before
        if tgt.persistent:
            assert tgt.keys("a/") == [], f"left under a/: {tgt.keys('a/')}"
            assert tgt.tree("z/") == {k: md5(v) for k, v in data.items()}
            assert tgt.has_marker("z/empty"), f"empty subdirectory lost: {tgt.keys('z/')}"
    if tgt.persistent:
        with tgt.mounted() as mp:
            assert fs_tree(os.path.join(mp, "z")) == before
            assert not os.path.exists(os.path.join(mp, "a"))


def test_longest_file_names_are_kept_and_longer_fail_at_create(tgt):
    """The longest file name each store can write (255 bytes; 246 on a local folder, which
    writes through a temporary name 9 bytes longer) is written and read back after a
    remount; one byte more is ENAMETOOLONG at create, never an error at close with the
    bytes stuck in staging."""
    longest = 246 if tgt.store == "file" else 255
    ok, too_long = "n" * longest, "m" * (longest + 1)
    with tgt.mounted() as mp:
        with open(os.path.join(mp, ok), "wb") as f:
            f.write(b"longest")
        expect_errno("create one byte past the limit",
                     lambda: os.open(os.path.join(mp, too_long), os.O_WRONLY | os.O_CREAT, 0o644),
                     errno.ENAMETOOLONG)
        expect_errno("rename to one byte past the limit",
                     lambda: os.rename(os.path.join(mp, ok), os.path.join(mp, too_long)),
                     errno.ENAMETOOLONG)
        # A directory is made under its own name, except on MinIO, which keeps a marker
        # `d/` under a name 9 bytes longer and refuses past 246 bytes: EINVAL, not EIO.
        longest_dir = 246 if tgt.store == "s3" else 255
        os.mkdir(os.path.join(mp, "d" * longest_dir))
        if longest_dir < 255:
            expect_errno("mkdir past MinIO's limit", lambda: os.mkdir(os.path.join(mp, "e" * 255)),
                         errno.EINVAL)
        assert sorted(os.listdir(mp)) == sorted([ok, "d" * longest_dir])
    if tgt.persistent:
        assert tgt.get(ok) == b"longest"
        with tgt.mounted() as mp:
            assert read_file(os.path.join(mp, ok)) == b"longest"
            assert sorted(os.listdir(mp)) == sorted([ok, "d" * longest_dir])


def test_create_mode_and_setattr(tgt):
    """chmod/chown/utime succeed and stat shows them while mounted (not persisted: not checked)."""
    with tgt.mounted() as mp:
        p = os.path.join(mp, "f.txt")
        old = os.umask(0o022)
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o755)
        finally:
            os.umask(old)
        os.write(fd, b"x")
        os.close(fd)
        write_path(os.path.join(mp, "g.txt"), b"g")
        os.chmod(p, 0o600)
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
        os.chmod(p, 0o751)
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o751
        os.chown(p, 1234, 5678)
        st = os.stat(p)
        assert (st.st_uid, st.st_gid) == (1234, 5678)
        os.chown(p, 0, 0)
        mt = 1_500_000_000.25
        os.utime(p, (mt, mt))
        assert abs(os.stat(p).st_mtime - mt) < 1e-3, f"utime: stat shows mtime {os.stat(p).st_mtime}, set {mt}"
        os.mkdir(os.path.join(mp, "d"))
        os.chmod(os.path.join(mp, "d"), 0o700)
        assert stat.S_IMODE(os.stat(os.path.join(mp, "d")).st_mode) == 0o700
        assert read_file(p) == b"x"
        if tgt.persistent:
            assert tgt.get("f.txt") == b"x", "chmod/chown/utime changed the object"


def test_setattr_survives_attribute_ttl(tgt):
    """stat keeps showing chmod and utime after the 1 s metadata TTL expired (still mounted)."""
    with tgt.mounted() as mp:
        p = os.path.join(mp, "f.txt")
        write_path(p, b"x")
        os.chmod(p, 0o640)
        mt = 1_400_000_000.0
        os.utime(p, (mt, mt))
        time.sleep(2.5)  # --metadata-ttl 1: the kernel and bucketfs ask again
        st = os.stat(p)
        listed = {e.name: e.stat() for e in os.scandir(mp)}["f.txt"]
        assert stat.S_IMODE(st.st_mode) == 0o640, f"mode reverted to {oct(stat.S_IMODE(st.st_mode))} after the TTL"
        assert abs(st.st_mtime - mt) < 1e-3, f"utime lost after the TTL: stat shows mtime {st.st_mtime}, set {mt}"
        assert abs(listed.st_mtime - mt) < 1e-3, f"utime lost in a listing after the TTL: {listed.st_mtime}"


def test_create_mode_is_shown(tgt):
    """open(O_CREAT, 0755) under umask 022 gives a 0755 file (git checks out executables so)."""
    with tgt.mounted() as mp:
        old = os.umask(0o022)
        try:
            os.close(os.open(os.path.join(mp, "x.sh"), os.O_WRONLY | os.O_CREAT, 0o777))
            os.close(os.open(os.path.join(mp, "r.txt"), os.O_WRONLY | os.O_CREAT, 0o600))
            os.mkdir(os.path.join(mp, "priv"), 0o700)
        finally:
            os.umask(old)
        modes = {n: oct(stat.S_IMODE(os.stat(os.path.join(mp, n)).st_mode)) for n in ("x.sh", "r.txt", "priv")}
        assert modes == {"x.sh": "0o755", "r.txt": "0o600", "priv": "0o700"}, f"modes at create ignored: {modes}"


@pytest.mark.parametrize("store", ["s3", "gcs", "file"])
def test_a_write_by_another_client_during_a_directory_rename_is_never_lost(store, rng):
    """Another client overwrites files while the mount renames their directory (copy, then
    delete, key by key), one writer putting each file's earlier bytes back (on S3 the same
    ETag again): every write it was told succeeded is in the bucket afterwards, under the
    old name or the new one (but for the moment between the check and the delete on
    stores that ignore the delete's condition, below). Each source goes only while it holds
    the version that was copied."""
    from concurrent.futures import ThreadPoolExecutor
    import threading

    import conftest
    import seed

    conftest.require_store(store)
    conftest.require_bin()
    b = conftest.Bucket(store)
    try:
        n = 300
        b.put_all({f"d/f{i:03}": b"listed" for i in range(n)})
        last: dict[str, bytes] = {}
        stop = threading.Event()

        def writer(w: int) -> None:
            r = random.Random(rng.random())
            k = 0
            while not stop.is_set():
                key, k = f"d/f{r.randrange(w, n, 3):03}", k + 1
                body = f"writer {w} write {k}".encode()
                seed.put(store, b.name, key, body)
                if w == 2:
                    # Puts the earlier bytes back: on S3 the same ETag again (an MD5).
                    time.sleep(0.02)
                    body = last.get(key, b"listed")
                    seed.put(store, b.name, key, body)
                last[key] = body  # acknowledged
                time.sleep(0.01)

        with b.mounted() as mp:
            assert len(os.listdir(os.path.join(mp, "d"))) == n
            with ThreadPoolExecutor(3) as ex:
                writers = [ex.submit(writer, w) for w in range(3)]
                try:
                    time.sleep(0.2)
                    os.rename(os.path.join(mp, "d"), os.path.join(mp, "d2"))
                    time.sleep(0.2)
                finally:
                    stop.set()
                for f in writers:
                    f.result()
            assert len(os.listdir(os.path.join(mp, "d2"))) == n
        keys = set(seed.list_keys(store, b.name))
        lost = []
        for key, body in sorted(last.items()):
            moved = "d2/" + key[2:]
            held = [seed.get(store, b.name, k) for k in (key, moved) if k in keys]
            if body not in held:
                lost.append((key, body, held))
        assert last, "the other client wrote nothing"
        # MinIO, the GCS emulator and a local folder ignore or lack the delete's condition:
        # the mount checks first, and a write landing in the moment between the check and
        # the delete is lost (docs/SEMANTICS.md). The CI machine once lost 1 of 269 so.
        # Without the check, 73 to 90 of 250-300 were lost.
        assert len(lost) <= max(2, len(last) // 50), \
            f"{len(lost)} of {len(last)} acknowledged writes lost, e.g. {lost[:3]}"
        assert all(f"d2/f{i:03}" in keys for i in range(n)), "a file not written to did not move"
    finally:
        b.cleanup()
