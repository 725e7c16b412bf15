"""Listing: directory trees, implicit dirs, markers, stat, weird keys, file/prefix clashes."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
import time

import pytest

import seed
from conftest import implied_dirs, walk_tree

LIBC = ctypes.CDLL(None, use_errno=True)

# --------------------------------------------------------------------------- tree


def make_tree(rng, n=300) -> dict[str, bytes]:
    data = {}
    for i in range(n):
        depth = rng.randrange(0, 5)
        parts = [f"d{rng.randrange(4)}" if j == 0 else f"s{j}_{rng.randrange(3)}" for j in range(depth)]
        parts.append(f"file{i:03d}.{rng.choice(['txt', 'bin', 'dat'])}")
        data["/".join(parts)] = rng.randbytes(rng.randrange(0, 5000))
    return data


def test_walk_equals_key_set(bucket, rng):
    data = make_tree(rng)
    bucket.put_all(data)
    assert seed.list_keys(bucket.store, bucket.name) == sorted(data)
    with bucket.mounted() as mp:
        files, dirs = walk_tree(mp)
        assert files == set(data), (
            f"missing {sorted(set(data) - files)[:10]}, extra {sorted(files - set(data))[:10]}")
        assert dirs == implied_dirs(data)
        # listdir of every directory equals the direct children implied by the keys
        for d in sorted(dirs | {""}):
            pre = d + "/" if d else ""
            want = {k[len(pre):].split("/", 1)[0] for k in data if k.startswith(pre)}
            got = os.listdir(os.path.join(mp, d))
            assert len(got) == len(set(got)), f"duplicate names in {d!r}: {sorted(got)}"
            assert set(got) == want, f"listdir({d!r})"
        # spot-check content and sizes of a few files found through the walk
        for k in sorted(data)[:: 37]:
            p = os.path.join(mp, k)
            assert os.stat(p).st_size == len(data[k])
            with open(p, "rb") as f:
                assert f.read() == data[k]


def test_prefix_mount_shows_only_prefix(bucket, rng):
    data = {"inside/a.txt": b"A", "inside/sub/b.txt": b"BB", "outside/c.txt": b"C", "insider.txt": b"no"}
    bucket.put_all(data)
    with bucket.mounted(prefix="inside") as mp:
        files, dirs = walk_tree(mp)
        assert files == {"a.txt", "sub/b.txt"}
        assert dirs == {"sub"}
        with open(os.path.join(mp, "sub/b.txt"), "rb") as f:
            assert f.read() == b"BB"


def test_implicit_dirs(bucket):
    bucket.put_all({"a/b/c.txt": b"c", "top.txt": b"t"})
    with bucket.mounted() as mp:
        assert sorted(os.listdir(mp)) == ["a", "top.txt"]
        assert os.path.isdir(os.path.join(mp, "a"))
        assert os.listdir(os.path.join(mp, "a")) == ["b"]
        assert stat.S_ISDIR(os.stat(os.path.join(mp, "a/b")).st_mode)
        assert os.listdir(os.path.join(mp, "a/b")) == ["c.txt"]
        assert stat.S_ISREG(os.stat(os.path.join(mp, "a/b/c.txt")).st_mode)
        # a prefix that does not exist is ENOENT, not an empty dir
        assert not os.path.exists(os.path.join(mp, "a/nope"))
        assert not os.path.exists(os.path.join(mp, "nope"))


def test_marker_objects_are_empty_dirs(bucket):
    bucket.put_all({"d/": b"", "e/f/": b"", "g.txt": b"g"})
    with bucket.mounted() as mp:
        assert sorted(os.listdir(mp)) == ["d", "e", "g.txt"]
        assert os.path.isdir(os.path.join(mp, "d"))
        assert os.listdir(os.path.join(mp, "d")) == []
        assert os.listdir(os.path.join(mp, "e")) == ["f"]
        assert os.path.isdir(os.path.join(mp, "e/f"))
        assert os.listdir(os.path.join(mp, "e/f")) == []
        files, dirs = walk_tree(mp)
        assert files == {"g.txt"}, "a marker object must not show up as a file"
        assert dirs == {"d", "e", "e/f"}


def test_marker_plus_children(bucket):
    """A marker `m/` next to real children `m/x`: one dir `m`, containing only `x`."""
    bucket.put_all({"m/": b"", "m/x": b"xx"})
    with bucket.mounted() as mp:
        assert os.listdir(mp) == ["m"]
        assert os.listdir(os.path.join(mp, "m")) == ["x"]


def test_file_plus_empty_marker_of_the_same_name(bucket):
    """Key `a` (a file) and a zero-byte marker `a/` with no children: one directory `a`,
    empty; the file is shadowed (SEMANTICS: Keys, names and directories)."""
    if bucket.store == "file":
        pytest.skip("a plain directory cannot hold both a file and a dir named a")
    if bucket.store == "gdrive":
        pytest.skip("Drive holds a file and a folder named a side by side; both are shown (test_gdrive.py)")
    bucket.put_all({"a": b"i am a file", "a/": b"", "b": b"b"})
    stored = seed.list_keys(bucket.store, bucket.name)
    if not {"a", "a/"} <= set(stored):
        pytest.skip(f"{bucket.store} server cannot hold both `a` and `a/` (lists {stored})")
    with bucket.mounted() as mp:
        assert sorted(os.listdir(mp)) == ["a", "b"], "a must appear exactly once"
        assert os.path.isdir(os.path.join(mp, "a"))
        assert os.listdir(os.path.join(mp, "a")) == []


def test_a_marker_holding_bytes_is_never_deleted_or_moved(bucket):
    """Another client can put bytes at a marker `d/`. No name shows them: `d` is an empty
    directory, and the mount never deletes or re-creates that marker (`rmdir` ENOTEMPTY, a
    rename EXDEV), in either write mode (SEMANTICS: Keys, names and directories)."""
    if bucket.store in ("file", "gdrive"):
        pytest.skip(f"{bucket.store} has no directory markers to put bytes in")
    keys = {"d/": b"payload", "p/e/": b"more", "p/f": b"1"}
    bucket.put_all(keys)
    if not set(keys) <= set(seed.list_keys(bucket.store, bucket.name)):
        pytest.skip(f"{bucket.store} server cannot hold bytes at a marker")
    for extra in ([], ["--write-back"]):
        bucket.put("m/", b"")
        with bucket.mounted(extra=extra) as mp:
            assert sorted(os.listdir(mp)) == ["d", "m", "p"]
            assert os.listdir(os.path.join(mp, "d")) == []
            assert os.listdir(os.path.join(mp, "p/e")) == []
            for path in ("d", "p/e"):
                with pytest.raises(OSError) as ei:
                    os.rmdir(os.path.join(mp, path))
                assert ei.value.errno == errno.ENOTEMPTY, f"{extra}: rmdir {path}: {ei.value}"
            for path in ("d", "p"):
                with pytest.raises(OSError) as ei:
                    os.rename(os.path.join(mp, path), os.path.join(mp, path + "2"))
                assert ei.value.errno == errno.EXDEV, f"{extra}: rename {path}: {ei.value}"
            os.rmdir(os.path.join(mp, "m"))  # an empty marker goes as before
            os.sync()
        for k, v in keys.items():
            assert seed.get(bucket.store, bucket.name, k) == v, f"{extra}: {k} lost its bytes"
        assert "m/" not in seed.list_keys(bucket.store, bucket.name), f"{extra}: the empty marker stayed"


def test_bucket_changed_mid_listing(bucket):
    """Keys added and deleted by another client while `readdir` pages through a directory:
    the listing is the snapshot taken at `opendir` (no duplicates, nothing missing, nothing
    new); the next listing after the TTL shows the change (SEMANTICS: opendir/readdir)."""
    n = 2000
    initial = {f"d/f{i:05d}": b"" for i in range(n)}
    bucket.put_all(initial)
    added = {f"d/g{i:05d}": b"" for i in range(300)}
    removed = [f"d/f{i:05d}" for i in range(0, n, 4)]
    with bucket.mounted() as mp:
        d = os.path.join(mp, "d")
        seen = []
        with os.scandir(d) as it:  # getdents in 32 KiB pages: several round trips here
            for i, e in enumerate(it):
                seen.append(e.name)
                if i == 100:
                    bucket.put_all(added)
                    for k in removed:
                        seed.delete(bucket.store, bucket.name, k)
        assert len(seen) == len(set(seen)), "duplicate names in one listing"
        assert sorted(seen) == sorted(k[2:] for k in initial), "one listing must be one snapshot"
        time.sleep(2.5)  # past the 1 s metadata TTL
        want = sorted(k[2:] for k in (set(initial) - set(removed)) | set(added))
        # Drive learns of changes from its changes feed (polled each second): allow a few.
        limit = 10 if bucket.store == "gdrive" else 0
        deadline = time.monotonic() + limit
        while sorted(os.listdir(d)) != want and time.monotonic() < deadline:
            time.sleep(0.5)
        assert sorted(os.listdir(d)) == want


def test_a_change_through_the_mount_mid_listing_skips_and_repeats_nothing(bucket):
    """One process pages through a directory while another creates and deletes names in it
    through the mount and lists it anew: the first read goes on in the snapshot it began
    with (no name repeated or skipped); a new listing shows the changes. Without opendir
    the kernel sends later offsets to whatever snapshot the newest read took: each create
    (sorted first) repeated a name, each unlink skipped one."""
    n = 1500
    bucket.put_all({f"d/f{i:05d}": b"" for i in range(n)})
    with bucket.mounted() as mp:
        d = os.path.join(mp, "d")
        seen = []
        with os.scandir(d) as it:  # getdents in 32 KiB pages: several round trips
            for i, e in enumerate(it):
                seen.append(e.name)
                if i in (100, 600):
                    open(os.path.join(d, f"a{i}"), "w").close()
                    os.unlink(os.path.join(d, f"f{i + 300:05d}"))
                    assert f"a{i}" in os.listdir(d)  # a new read: a new snapshot
        assert len(seen) == len(set(seen)), "a name came twice in one listing"
        assert sorted(seen) == [f"f{i:05d}" for i in range(n)], "one listing must be one snapshot"
        now = set(os.listdir(d))
        assert {"a100", "a600"} <= now and not {"f00400", "f00900"} & now


def test_a_read_outlasting_many_newer_snapshots_skips_and_repeats_nothing(bucket):
    """A read goes on in its snapshot while a few are kept; past that (here 20 listings
    after changes while it paused) it goes on after the last name it was given, not at its
    index in the newest snapshot, where each name made since (sorted first) repeated one:
    202 duplicates of 5,000."""
    n = 1500
    bucket.put_all({f"d/f{i:05d}": b"" for i in range(n)})
    with bucket.mounted() as mp:
        d = os.path.join(mp, "d")
        seen = []
        with os.scandir(d) as it:
            seen += [next(it).name for _ in range(10)]  # one page read, more to come
            for k in range(20):
                for j in range(5):
                    open(os.path.join(d, f"a{k:02d}_{j}"), "w").close()
                assert len(os.listdir(d)) == n + 5 * (k + 1)
            seen += [e.name for e in it]
        assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} names came twice in one listing"
        assert {f"f{i:05d}" for i in range(n)} <= set(seen), "a name there all along was skipped"


def getdents(fd: int, size: int = 2048) -> list[str]:
    """One getdents64 call with a small buffer (a reader part-way through a directory)."""
    buf = ctypes.create_string_buffer(size)
    n = LIBC.syscall(217, fd, buf, size)  # SYS_getdents64 on x86_64
    if n < 0:
        raise OSError(ctypes.get_errno(), "getdents64")
    names, off = [], 0
    while off < n:
        reclen = struct.unpack_from("H", buf.raw, off + 16)[0]
        names.append(buf.raw[off + 19:off + reclen].split(b"\0")[0].decode())
        off += reclen
    return [x for x in names if x not in (".", "..")]


def read_rest(fd: int) -> list[str]:
    names = []
    while batch := getdents(fd):
        names += batch
    return names


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="getdents64's syscall number")
def test_a_reader_paused_while_another_fills_a_page_aligned_kernel_cache_gets_every_name(bucket):
    """254 names of 8 bytes and `.`, `..`: 256 entries of 32 bytes, so the kernel's readdir
    cache of the directory ends exactly on a page edge. A reader pauses part-way; past the
    TTL another process lists the directory (a new snapshot fills that cache). The kernel
    then told the first reader the directory had ended (62 names of 254): a reader whose
    offset is not in its cache gets end-of-directory there instead of asking the mount."""
    names = [f"f{i:07d}" for i in range(254)]
    bucket.put_all({f"d/{n}": b"" for n in names})
    with bucket.mounted(extra=["--metadata-ttl", "1"]) as mp:
        d = os.path.join(mp, "d")
        assert sorted(os.listdir(d)) == names
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            got = getdents(fd)
            assert 0 < len(got) < len(names)
            time.sleep(2.5)  # past the TTL: the next listing is a new snapshot
            assert sorted(os.listdir(d)) == names
            got += read_rest(fd)
        finally:
            os.close(fd)
        assert len(got) == len(set(got)), "a name came twice"
        assert sorted(got) == names, f"{len(got)} names of {len(names)}"


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="getdents64's syscall number")
def test_with_a_ttl_of_0_a_reader_part_way_is_not_continued_in_another_snapshot(bucket):
    """With `--metadata-ttl 0` every opendir takes its own snapshot. A reader part-way
    through one, while a name sorting first is made and another process lists the
    directory, must go on in its own: the kernel had cached the other's entries under the
    same offsets and went on there, one name off (a name twice, or one missing)."""
    names = [f"b{i:07d}xxxxxxxx" for i in range(300)]
    bucket.put_all({f"d/{n}": b"" for n in names})
    with bucket.mounted(extra=["--metadata-ttl", "0"]) as mp:
        d = os.path.join(mp, "d")
        for change in ("create", "remove"):
            os.listdir(d)
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                got = getdents(fd)
                extra = os.path.join(d, "a-extra")
                if change == "create":
                    open(extra, "w").close()
                else:
                    os.unlink(extra)
                os.listdir(d)  # another process's read: a new snapshot, cached by the kernel
                got += read_rest(fd)
            finally:
                os.close(fd)
            got = [n for n in got if n != "a-extra"]
            assert len(got) == len(set(got)), f"{change}: a name came twice"
            assert sorted(got) == names, f"{change}: {len(got)} names of {len(names)}"


@pytest.mark.slow
@pytest.mark.parametrize("store", ["file", pytest.param("s3", marks=pytest.mark.skipif(
    not os.environ.get("BUCKETFS_TEST_100K_S3"),
    reason="seeding 100,000 MinIO objects takes ~9 min here; set BUCKETFS_TEST_100K_S3=1"))])
def test_100k_keys_in_one_directory(store):
    """100,000 keys under one prefix (S3 lists them in pages of 1,000): `ls` shows each
    exactly once, and a lookup in the listed directory works."""
    from concurrent.futures import ThreadPoolExecutor

    from conftest import Bucket

    n = 100_000
    b = Bucket(store)
    try:
        keys = [f"big/k{i:06d}" for i in range(n)]
        if store == "file":
            os.makedirs(os.path.join(seed.file_root(), b.name, "big"))
            for k in keys:
                open(os.path.join(seed.file_root(), b.name, k), "wb").close()
        else:
            c = seed.s3_client()
            with ThreadPoolExecutor(32) as ex:
                list(ex.map(lambda k: c.put_object(Bucket=b.name, Key=k, Body=b""), keys))
        with b.mounted() as mp:
            names = os.listdir(os.path.join(mp, "big"))
            assert len(names) == n
            assert sorted(names) == [k[4:] for k in keys]
            assert os.stat(os.path.join(mp, "big", "k054321")).st_size == 0
    finally:
        if store == "file":
            import shutil

            shutil.rmtree(os.path.join(seed.file_root(), b.name), ignore_errors=True)
        b.cleanup()


@pytest.mark.skipif(not os.access("/proc/sys/vm/drop_caches", os.W_OK), reason="needs root")
def test_a_directory_whose_files_the_kernel_forgot_lists_whole(bucket):
    """The kernel forgets a directory's files (memory pressure; here drop_caches) while a
    process keeps the directory itself open: the next readdirplus pages through the
    snapshot taken before, whose files have no inode any more. Each was left out of that
    page, so the kernel cached the directory as its last page only (98 of 300 names,
    for the TTL)."""
    n = 300
    bucket.put_all({f"d/f{i:03d}": b"x" for i in range(n)})
    with bucket.mounted(extra=["--metadata-ttl", "60"]) as mp:
        d = os.path.join(mp, "d")
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)  # the directory stays known
        try:
            assert len(os.listdir(d)) == n
            for _ in range(3):
                os.sync()
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("3")
                assert sorted(os.listdir(d)) == [f"f{i:03d}" for i in range(n)]
        finally:
            os.close(fd)


def test_stat_sizes_and_mtime(bucket, rng):
    sizes = [0, 1, 4095, 4096, 100_000]
    t0 = time.time()
    data = {f"s/f{n}": rng.randbytes(n) for n in sizes}
    bucket.put_all(data)
    t1 = time.time()
    with bucket.mounted() as mp:
        for k, v in data.items():
            st = os.stat(os.path.join(mp, k))
            assert stat.S_ISREG(st.st_mode), k
            assert st.st_size == len(v), k
            assert t0 - 5 <= st.st_mtime <= t1 + 5, f"{k}: mtime {st.st_mtime} not near upload {t0}..{t1}"
            # and it agrees with what the store itself reports
            assert abs(st.st_mtime - seed.head(bucket.store, bucket.name, k)["mtime"]) <= 2, k
            assert st.st_nlink >= 1
        st = os.stat(os.path.join(mp, "s"))
        assert stat.S_ISDIR(st.st_mode)
        # lstat agrees with stat for regular files (no symlinks invented)
        lst = os.lstat(os.path.join(mp, "s/f1"))
        assert stat.S_ISREG(lst.st_mode) and lst.st_size == 1


def test_file_and_prefix_same_name(bucket):
    """Key `k` and keys under `k/`: the directory wins, the file is shadowed."""
    if bucket.store == "file":
        pytest.skip("a plain directory cannot hold both a file and a dir named k")
    if bucket.store == "gdrive":
        pytest.skip("Drive holds a file and a folder named k side by side; both are shown (test_gdrive.py)")
    bucket.put_all({"k": b"i am a file", "k/inner.txt": b"inner", "k2": b"plain"})
    stored = seed.list_keys(bucket.store, bucket.name)
    if not {"k", "k/inner.txt"} <= set(stored):
        # MinIO on a disk backend keeps one of the two and lists only `k`
        pytest.skip(f"{bucket.store} server cannot hold both `k` and `k/inner.txt` (lists {stored})")
    with bucket.mounted() as mp:
        names = os.listdir(mp)
        assert sorted(names) == ["k", "k2"], f"k must appear exactly once: {sorted(names)}"
        assert os.path.isdir(os.path.join(mp, "k"))
        assert os.listdir(os.path.join(mp, "k")) == ["inner.txt"]
        with open(os.path.join(mp, "k/inner.txt"), "rb") as f:
            assert f.read() == b"inner"
        assert os.path.isfile(os.path.join(mp, "k2"))


# --------------------------------------------------------------------------- weird keys

WEIRD = ["x//y", "../evil", "./dot", "a/../b", "long/" + "L" * 300, "/lead", "dots/./mid",
         "trail/..", "sl/./", "e//"]
NORMAL = {"x/y": b"real x/y", "dot": b"real dot", "b": b"real b", "long/ok.txt": b"long ok",
          "a/ok.txt": b"a ok", "normal.txt": b"normal", "dots/ok": b"dots ok"}


def _normalize(key: str) -> str:
    out: list[str] = []
    for s in key.split("/"):
        if s in ("", "."):
            continue
        if s == "..":
            if out:
                out.pop()
            continue
        out.append(s)
    return "/".join(out)


def _valid_prefix_dirs(key: str) -> set[str]:
    """Directories a weird key still implies: its leading segments up to the first invalid one."""
    out, segs = set(), key.split("/")[:-1]
    for i, sg in enumerate(segs):
        if sg in ("", ".", "..") or len(sg.encode()) > 255:
            break
        out.add("/".join(segs[: i + 1]))
    return out


def test_weird_keys_never_escape_or_collide(bucket):
    if bucket.store == "file":
        pytest.skip("a plain directory cannot hold keys like '../evil' or 'x//y'")
    bucket.put_all(NORMAL)
    accepted, rejected = [], []
    for k in WEIRD:
        try:
            bucket.put(k, b"WEIRD:" + k.encode())
            accepted.append(k)
        except seed.KeyRejected:
            rejected.append(k)
        except Exception as e:  # any other refusal by the server counts as rejected too
            rejected.append(k)
            print(f"{bucket.store}: upload of {k!r} failed: {type(e).__name__}: {e}"[:300])
    stored = set(seed.list_keys(bucket.store, bucket.name))
    # a server may store a key under another name (MinIO turns '/lead' into 'lead'):
    # that key was not really stored, and the renamed copy is removed again
    for k in [k for k in accepted if k not in stored]:
        accepted.remove(k)
        rejected.append(k)
    for k in stored - set(NORMAL) - set(accepted):
        print(f"{bucket.store}: server stored a weird key as {k!r}; removing it")
        seed.delete(bucket.store, bucket.name, k)
    print(f"{bucket.store}: weird keys accepted by the server: {accepted}; rejected: {rejected}")
    assert set(NORMAL) <= stored

    # Each way a directory gets listed: per directory, with list-ahead (the default: one
    # recursive page with each listing), and the whole tree at mount.
    for extra in (["--list-ahead-keys", "0"], [], ["--preload-tree"]):
        _check_weird_mount(bucket, accepted, extra)


def _check_weird_mount(bucket, accepted, extra):
    with bucket.mounted(extra=extra) as mp:
        real_mp = os.path.realpath(mp)
        seen_files = {}
        for dp, dns, fns in os.walk(mp):
            for n in dns + fns:
                assert n not in ("", ".", ".."), f"bad name {n!r} in {dp}"
                assert "/" not in n and "\0" not in n
                assert len(os.fsencode(n)) <= 255, f"name longer than NAME_MAX in {dp}"
                p = os.path.join(dp, n)
                rp = os.path.realpath(p)
                assert rp == real_mp or rp.startswith(real_mp + "/"), f"{p} resolves outside the mount: {rp}"
            names = dns + fns
            assert len(names) == len(set(names)), f"duplicate names in {dp}: {sorted(names)}"
            for n in fns:
                rel = os.path.relpath(os.path.join(dp, n), mp)
                with open(os.path.join(dp, n), "rb") as f:
                    seen_files[rel] = f.read()
        # the normal siblings are all there with their own content (weird keys did not win)
        for k, v in NORMAL.items():
            assert seen_files.get(k) == v, f"{k!r}: expected the real object, got {seen_files.get(k)!r}"
        # no weird key shows up under its normalized path ('../evil' as 'evil', 'a/../b' as 'b', ...)
        for k in accepted:
            norm = _normalize(k)
            if norm in NORMAL:
                continue  # checked above: the real object is what is shown there
            assert norm not in seen_files, f"weird key {k!r} exposed as normalized path {norm!r}"
        # docs/SEMANTICS.md: keys with an invalid segment are not shown at all
        extra = {p: v for p, v in seen_files.items() if p not in NORMAL}
        for p, v in extra.items():
            assert p != _normalize(v[6:].decode()), f"{p!r} is the normalized form of a weird key"
        assert not extra, f"{bucket.store}: keys with invalid segments are shown as {sorted(extra)}"
        # ... but their valid leading segments still appear as (possibly empty) directories
        _, dirs = walk_tree(mp)
        want_dirs = implied_dirs(NORMAL) | {d for k in accepted for d in _valid_prefix_dirs(k)}
        assert dirs == want_dirs, f"dirs: missing {sorted(want_dirs - dirs)}, extra {sorted(dirs - want_dirs)}"
        # nothing outside the mount was created or is reachable through it
        assert not os.path.exists(os.path.join(os.path.dirname(mp), "evil"))
        assert "ok.txt" in os.listdir(os.path.join(mp, "long"))  # a 300-byte sibling must not break listing
        if "long/" + "L" * 300 in accepted:
            with pytest.raises(OSError) as ei:
                os.stat(os.path.join(mp, "long", "L" * 300))
            assert ei.value.errno == errno.ENAMETOOLONG, f"lookup of a 300-byte name: {ei.value}"
        assert os.path.realpath(os.path.join(mp, "..")) == os.path.dirname(real_mp)


def test_other_clients_changes_become_visible(bucket):
    """docs/SEMANTICS.md: listings and attributes are trusted for --metadata-ttl (default 1 s)."""
    from conftest import wait_until
    bucket.put_all({"old.txt": b"old", "grow.txt": b"12"})
    with bucket.mounted() as mp:
        assert sorted(os.listdir(mp)) == ["grow.txt", "old.txt"]
        assert os.stat(os.path.join(mp, "grow.txt")).st_size == 2
        bucket.put("new.txt", b"new!")
        bucket.put("grow.txt", b"123456")
        seed.delete(bucket.store, bucket.name, "old.txt")
        assert wait_until(lambda: sorted(os.listdir(mp)) == ["grow.txt", "new.txt"], 10, 0.25), \
            f"listing after changes by another client: {sorted(os.listdir(mp))}"
        assert wait_until(lambda: os.stat(os.path.join(mp, "grow.txt")).st_size == 6, 10, 0.25)
        with open(os.path.join(mp, "grow.txt"), "rb") as f:
            assert f.read() == b"123456"
        with open(os.path.join(mp, "new.txt"), "rb") as f:
            assert f.read() == b"new!"
        # the kernel may keep a dentry for up to the TTL after the listing changed
        assert wait_until(lambda: not os.path.exists(os.path.join(mp, "old.txt")), 10, 0.25), \
            "a deleted object stays reachable by name"


def test_a_local_name_that_is_not_utf8_is_not_shown_nor_taken_for_another():
    """A file:// folder holding a name that is not UTF-8: the store lists it with U+FFFD in
    place of its bytes. It was shown under that name (`stat`: ESTALE), and once a real
    file of that very name existed, the name showed the other file's size (1 byte of 17)."""
    from conftest import Bucket, require_bin, require_store
    require_store("file")
    require_bin()
    b = Bucket("file")
    try:
        folder = os.path.join(seed.file_root(), b.name).encode()
        with open(os.path.join(folder, b"\xff\xfebad"), "wb") as f:
            f.write(b"x")
        lossy = "\ufffd\ufffdbad"
        with b.mounted(extra=["--metadata-ttl", "0.3"]) as mp:
            assert os.listdir(mp) == [], "a name that is not UTF-8 was shown"
            with open(os.path.join(folder, lossy.encode()), "wb") as f:
                f.write(b"REAL-UTF8-CONTENT")
            time.sleep(1)
            assert os.listdir(mp) == [lossy]
            assert os.stat(os.path.join(mp, lossy)).st_size == 17
            with open(os.path.join(mp, lossy), "rb") as f:
                assert f.read() == b"REAL-UTF8-CONTENT"
    finally:
        b.cleanup()


def test_keys_with_control_characters_an_s3_listing_cannot_carry_are_not_shown():
    """An S3 listing is XML 1.0, which cannot carry most control characters: MinIO lists
    `a\\x1fb` as `a\\uFFFDb`. The mount took that for the key: the name read ESTALE, a
    real file `n\\uFFFDz` beside `n\\x1fz` was listed twice or could not be read, a
    directory holding such a key was renamed with `mv` exit 0 while the key stayed behind,
    and a file created here under such a name vanished from its listing. Now such keys are
    not shown (the directory above is renamed EXDEV and is not empty) and not created
    (EINVAL), and a real U+FFFD name is shown once, with its own bytes."""
    from conftest import Bucket, require_bin, require_store
    require_store("s3")
    require_bin()
    b = Bucket("s3")
    try:
        b.put("cdir/a\x1fb", b"precious")
        b.put("cdir/ok", b"ok")
        b.put("n\ufffdz", b"real-file-bytes")
        b.put("n\x1fz", b"other")
        b.put("n\x1ez", b"third")
        with b.mounted(extra=["--metadata-ttl", "0.5"]) as mp:
            names = os.listdir(mp)
            assert sorted(names) == ["cdir", "n\ufffdz"], names
            with open(os.path.join(mp, "n\ufffdz"), "rb") as f:
                assert f.read() == b"real-file-bytes"
            assert os.listdir(os.path.join(mp, "cdir")) == ["ok"]
            with pytest.raises(OSError) as e:
                os.rename(os.path.join(mp, "cdir"), os.path.join(mp, "moved"))
            assert e.value.errno == errno.EXDEV, e.value
            os.unlink(os.path.join(mp, "cdir", "ok"))
            with pytest.raises(OSError) as e:
                os.rmdir(os.path.join(mp, "cdir"))
            assert e.value.errno == errno.ENOTEMPTY, e.value
            with pytest.raises(OSError) as e:
                open(os.path.join(mp, "u\x1fv"), "wb").close()
            assert e.value.errno == errno.EINVAL, e.value
            # A directory made here with U+FFFD in its name, empty: still listed.
            os.mkdir(os.path.join(mp, "e\ufffd"))
            time.sleep(1.5)
            assert "e\ufffd" in os.listdir(mp), os.listdir(mp)
        keys = set(seed.list_keys("s3", b.name))
        assert {"cdir/a\x1fb", "n\ufffdz", "n\x1fz", "n\x1ez"} <= keys, keys
        assert seed.get("s3", b.name, "cdir/a\x1fb") == b"precious"
    finally:
        b.cleanup()
