"""Symbolic links on real mounts (issue 3): stored as `<name>.rclonelink` objects whose
content is the target (rclone's --links convention; SEMANTICS.md, crates/core/src/links.rs)."""

from __future__ import annotations

import errno
import os
import stat
import tarfile
import io

import pytest

from conftest import DATA_STORES
from writekit import Target, expect_errno, run


@pytest.fixture(params=DATA_STORES)
def lt(request):
    t = Target(request.param)
    yield t
    t.cleanup()


def test_symlinks_persist_and_read_like_rclone_links(lt):
    lt.put("data/real.txt", b"payload")
    lt.put("made-by-rclone.rclonelink", b"data/real.txt")
    with lt.mounted() as mp:
        # one made elsewhere reads as a link
        p = os.path.join(mp, "made-by-rclone")
        assert stat.S_ISLNK(os.lstat(p).st_mode)
        assert os.readlink(p) == "data/real.txt"
        with open(p, "rb") as f:
            assert f.read() == b"payload"
        # one made here: relative, absolute, dangling, to a directory
        os.symlink("real.txt", os.path.join(mp, "data", "rel"))
        os.symlink("/etc/hostname", os.path.join(mp, "abs"))
        os.symlink("nowhere", os.path.join(mp, "dangling"))
        os.symlink("data", os.path.join(mp, "dirlink"))
        with open(os.path.join(mp, "data", "rel"), "rb") as f:
            assert f.read() == b"payload"
        assert sorted(os.listdir(os.path.join(mp, "dirlink"))) == ["real.txt", "rel"]
        expect_errno("open a dangling link", lambda: open(os.path.join(mp, "dangling")), errno.ENOENT)
        expect_errno("symlink over an existing name",
                     lambda: os.symlink("x", os.path.join(mp, "abs")), errno.EEXIST)
        st = os.lstat(os.path.join(mp, "abs"))
        assert st.st_size == len("/etc/hostname")
        # rename and unlink act on the link, not on its target
        os.rename(os.path.join(mp, "data", "rel"), os.path.join(mp, "rel2"))
        os.unlink(os.path.join(mp, "dirlink"))
        assert os.path.isdir(os.path.join(mp, "data"))
    assert lt.get("data/real.txt") == b"payload"
    assert lt.get("rel2.rclonelink") == b"real.txt"
    assert lt.get("abs.rclonelink") == b"/etc/hostname"
    assert not lt.has("dirlink.rclonelink") and not lt.has("data/rel.rclonelink")
    with lt.mounted() as mp:  # a new mount sees them, listed and looked up
        entries = {e.name: e.is_symlink() for e in os.scandir(mp)}
        assert entries["rel2"] and entries["abs"] and entries["dangling"] and not entries["data"]
        assert os.readlink(os.path.join(mp, "dangling")) == "nowhere"


def test_tar_cp_and_git_keep_symlinks(lt, tmp_path):
    src = tmp_path / "src"
    (src / "lib").mkdir(parents=True)
    (src / "lib" / "libx.so.1.2").write_bytes(b"\x7fELF" + b"x" * 5000)
    os.symlink("libx.so.1.2", src / "lib" / "libx.so.1")
    os.symlink("libx.so.1", src / "lib" / "libx.so")
    os.symlink("../lib", src / "up")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tf.add(src, arcname="t")
    (tmp_path / "t.tar").write_bytes(buf.getvalue())
    repo = tmp_path / "repo"
    run(["git", "init", "-q", str(repo)])
    (repo / "a").write_text("a\n")
    os.symlink("a", repo / "link-to-a")
    run(["git", "-C", str(repo), "add", "."])
    run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "c"])
    with lt.mounted() as mp:
        run(["tar", "-xf", str(tmp_path / "t.tar"), "-C", mp])
        run(["cp", "-a", str(src), os.path.join(mp, "c")])
        run(["git", "clone", "-q", str(repo), os.path.join(mp, "g")])
        for root in ("t", "c"):
            lib = os.path.join(mp, root, "lib")
            assert os.readlink(os.path.join(lib, "libx.so")) == "libx.so.1"
            assert os.readlink(os.path.join(mp, root, "up")) == "../lib"
            with open(os.path.join(lib, "libx.so"), "rb") as f:
                assert f.read(4) == b"\x7fELF"
        assert os.readlink(os.path.join(mp, "g", "link-to-a")) == "a"
        assert run(["git", "-C", os.path.join(mp, "g"), "status", "--porcelain"]).out == ""
        run(["git", "-C", os.path.join(mp, "g"), "fsck", "--no-progress"])
    assert lt.get("t/lib/libx.so.rclonelink") == b"libx.so.1"


def test_mode_owner_and_mtime_persist_across_mounts(lt, tmp_path):
    """chmod/chown/utime (and cp -p, tar -x) are kept as object metadata (SEMANTICS.md);
    on Drive as the file's `properties`."""
    when = 1_000_000_000
    src = tmp_path / "src"
    src.mkdir()
    (src / "tool").write_bytes(b"#!/bin/sh\necho hi\n")
    os.chmod(src / "tool", 0o750)
    os.utime(src / "tool", (when, when))
    with lt.mounted() as mp:
        f = os.path.join(mp, "f")
        with open(f, "wb") as fh:
            fh.write(b"x" * 1000)
        os.chmod(f, 0o640)
        os.chown(f, 1234, 5678)
        os.utime(f, (when + 5, when + 5))
        run(["cp", "-p", str(src / "tool"), os.path.join(mp, "tool")])
        run(["tar", "-cf", str(tmp_path / "a.tar"), "-C", str(src), "tool"])
        os.mkdir(os.path.join(mp, "x"))
        run(["tar", "-xpf", str(tmp_path / "a.tar"), "-C", os.path.join(mp, "x")])
    with lt.mounted() as mp:
        st = os.stat(os.path.join(mp, "f"))
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, int(st.st_mtime)) == (0o640, 1234, 5678, when + 5)
        for p in ("tool", "x/tool"):
            st = os.stat(os.path.join(mp, p))
            assert (stat.S_IMODE(st.st_mode), int(st.st_mtime)) == (0o750, when), p
        assert run([os.path.join(mp, "tool")]).out == "hi\n"
    assert lt.get("f") == b"x" * 1000


def test_an_edit_of_a_file_first_seen_in_a_listing_keeps_its_mode(lt):
    """A file's mode lives in its object's metadata, which a listing does not carry. An
    append to a file the mount knows only from `ls` (within the TTL, no HEAD yet) uploaded
    it without that metadata: an edited script lost its x bit for good."""
    with lt.mounted() as mp:
        f = os.path.join(mp, "script")
        with open(f, "wb") as fh:
            fh.write(b"#!/bin/sh\necho one\n")
        os.chmod(f, 0o750)
    with lt.mounted() as mp:
        os.listdir(mp)
        run(["ls", "-l", mp])  # the attributes from the listing
        with open(os.path.join(mp, "script"), "ab") as fh:
            fh.write(b"echo two\n")
        os.truncate(os.path.join(mp, "script"), 28)
    with lt.mounted() as mp:
        st = os.stat(os.path.join(mp, "script"))
        assert stat.S_IMODE(st.st_mode) == 0o750
        assert run([os.path.join(mp, "script")]).out == "one\ntwo\n"
