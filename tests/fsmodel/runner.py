"""The executor: `Runner` runs one op on the mount and on the model and compares them.

One `op_*` method per op kind: it works out the errno the model expects, runs the call,
compares (errno, bytes, sizes, types, names), then applies the op to the model. A
difference raises `Divergence`, whose `sig` groups divergences of one kind (shrinking keeps
a candidate only if it fails the same way). Alternatives the contract allows (an EINVAL
for a name with whitespace at an end, ESTALE/ENOENT reading an unlinked file through a
read-only handle) are accepted and counted in `notes`. An op that does not apply (a slot
that is empty, or busy for an open) returns SKIP, so any sub-sequence still runs.

With `passthrough` (the mount has `--passthrough on`), the EBUSY docs/SEMANTICS.md gives
while a file is open for passthrough reads is accepted where it may happen (`busy_ok`): a
read-only open of a file a read-only handle holds at an older version. The open then does
nothing. Opens for writing and truncates are never refused.
"""

from __future__ import annotations

import errno
import os
import stat as st_mod
import time

from .model import Handle, Inode, Model
from .ops import ACCEPT_RO_UNLINKED, MiB, en, gen_bytes, is_ws_odd, join, md5, parse_mode


class Divergence(Exception):
    """The mount differs from the model. `sig` groups divergences of one kind (for shrinking)."""

    def __init__(self, sig: str, msg: str):
        super().__init__(msg)
        self.sig, self.msg = sig, msg


SKIP = "skip"


def pread_all(fd, off, length) -> bytes:
    out = bytearray()
    while len(out) < length:
        b = os.pread(fd, min(length - len(out), 4 * MiB), off + len(out))
        if not b:
            break
        out += b
    return bytes(out)


def pwrite_all(fd, data: bytes, off: int, append: bool) -> None:
    mv = memoryview(data)
    while mv:
        n = os.write(fd, mv) if append else os.pwrite(fd, mv, off)
        mv, off = mv[n:], off + n


def call(fn, *a):
    try:
        return fn(*a), None
    except OSError as e:
        return None, e.errno


def describe_mismatch(exp: bytes, got: bytes, off: int, whole, others=None) -> str:
    """Where two byte strings differ, and, when the seen bytes are the model's from elsewhere,
    by how much they are shifted."""
    out = [f"expected {len(exp)} bytes (md5 {md5(exp)[:8]}), seen {len(got)} (md5 {md5(got)[:8]})"]
    n = min(len(exp), len(got))
    i = next((k for k in range(0, n, 4096) if exp[k:min(k + 4096, n)] != got[k:min(k + 4096, n)]), None)
    if i is not None:
        i = next(k for k in range(i, min(i + 4096, n)) if exp[k] != got[k])
        out.append(f"first difference at file offset {off + i}: expected {exp[i:i + 12].hex()} "
                   f"seen {got[i:i + 12].hex()}")
        chunk = got[i:i + 32]
        if chunk.count(0) == len(chunk):
            out.append("(seen zeros there)")
        elif len(chunk) >= 8:
            at = bytes(whole).find(chunk)
            if at >= 0:
                out.append(f"(the seen bytes are the model's bytes at offset {at}: shifted by {at - off - i})")
            for name, data in (others or {}).items():
                at = bytes(data).find(chunk)
                if at >= 0:
                    out.append(f"(the seen bytes are those of {name} at offset {at})")
                    break
    elif len(got) < len(exp):
        out.append(f"seen is a prefix: cut short at file offset {off + len(got)}")
    else:
        out.append(f"seen has {len(got) - len(exp)} bytes more than the model after file offset {off + len(exp)}")
    return "; ".join(out)


class Runner:
    """Runs ops on the mount (below `root`) and on the model, and compares each result."""

    def __init__(self, root: str, passthrough: bool = False):
        self.root, self.m, self.fds = root, Model(), {}
        self.notes: dict[str, int] = {}
        self.passthrough = passthrough

    def p(self, path):
        return os.path.join(self.root, path) if path else self.root

    def note(self, what):
        self.notes[what] = self.notes.get(what, 0) + 1

    def step(self, op):
        return getattr(self, "op_" + op[0])(*op[1:])

    def expect_errno(self, what, exp, got, ws_ok=False):
        """Compare errnos; True if the op was refused with an accepted EINVAL (a name with
        whitespace at an end): then the model does not apply it."""
        if got == exp:
            return False
        if ws_ok and exp is None and got == errno.EINVAL:
            self.note("whitespace name refused with EINVAL")
            return True
        raise Divergence(f"errno {what.split('(')[0]}: {en(exp)}->{en(got)}",
                         f"{what}: expected {en(exp)}, seen {en(got)}")

    def busy_ok(self, ino, changes: bool) -> bool:
        """May an open of `ino` get EBUSY (passthrough reads of it in progress)? Only a
        read-only open while a read-only handle holds an older version of it. An open for
        writing or truncating (`changes`) never: the writer takes the readers' file over."""
        return self.passthrough and not changes and ino is not None and any(
            h.inode is ino and not h.writable and h.version != ino.version
            for h in self.m.handles.values())

    def accept_busy(self, what, ino, changes, got) -> bool:
        """True if `got` is an EBUSY that `busy_ok` allows (noted; the op does nothing)."""
        if got != errno.EBUSY or not self.busy_ok(ino, changes):
            return False
        self.note(f"{what} refused with EBUSY: the file is open for passthrough reads")
        return True

    def hdesc(self, slot):
        h = self.m.handles[slot]
        return f"slot {slot} ({h.mode}) of {self.m.path_of(h.inode)}"

    # ---- handle ops
    def op_open(self, slot, path, mode):
        m = self.m
        if slot in m.handles:
            return SKIP
        flags, _, writable, extra = parse_mode(mode)
        k = m.kind(path)
        if k == "dir" and not writable and "c" not in extra:
            return SKIP  # reading a directory through open() is out of scope
        exp = m.parent_err(path)
        if exp is None:
            if k == "dir":
                exp = errno.EEXIST if ("c" in extra and "x" in extra) else errno.EISDIR
            elif k == "file":
                exp = errno.EEXIST if ("c" in extra and "x" in extra) else None
            else:
                exp = None if "c" in extra else errno.ENOENT
        creating = exp is None and k is None
        fd, got = call(os.open, self.p(path), flags | os.O_CLOEXEC, 0o644)
        if got is None and exp is not None:
            os.close(fd)
        if exp is None and k == "file" and self.accept_busy(
                "an open for writing" if writable or "t" in extra else "a read-only open",
                m.files.get(path), writable or "t" in extra, got):
            return
        if self.expect_errno(f"open({path!r}, {mode!r})", exp, got, ws_ok=creating and is_ws_odd(path)):
            return
        if exp is not None:
            return
        if creating:
            m.files[path] = Inode()
        ino = m.files[path]
        if "t" in extra and writable:
            ino.data.clear()
            ino.version += 1
        self.fds[slot] = fd
        m.handles[slot] = Handle(ino, mode)
        self.check_fstat(slot, "after open")

    def op_close(self, slot):
        if slot not in self.m.handles:
            return SKIP
        desc = self.hdesc(slot)
        self.m.handles.pop(slot)
        _, got = call(os.close, self.fds.pop(slot))
        self.expect_errno(f"close({desc})", None, got)

    def op_write(self, slot, off, length, dseed):
        h = self.m.handles.get(slot)
        if h is None:
            return SKIP
        data = gen_bytes(dseed, length)
        _, got = call(pwrite_all, self.fds[slot], data, off, h.append)
        self.expect_errno(f"write({self.hdesc(slot)})", None if h.writable else errno.EBADF, got)
        if not h.writable:
            return
        d = h.inode.data
        if h.append:
            off = len(d)
        if off > len(d):
            d.extend(bytes(off - len(d)))
        d[off:off + length] = data
        h.inode.version += 1
        try:
            self.check_fstat(slot, f"after write at {off}")
        except Divergence as e:
            if h.append:
                e.msg += self.where_landed(h.inode, data, off)
            raise

    def where_landed(self, ino, data, off) -> str:
        """For an O_APPEND write gone wrong: where the file (read afresh) holds its bytes."""
        path = next((p for p, i in self.m.files.items() if i is ino), None)
        if path is None:
            return ""
        try:
            with open(self.p(path), "rb") as f:
                now = f.read()
        except OSError as e:
            return f"; (reading it back: {en(e.errno)})"
        at = now.find(data[:64]) if len(data) >= 8 else -1
        return (f"; the file now holds {len(now)} bytes, the appended bytes "
                + (f"at offset {at} (expected at {off})" if at >= 0 else "nowhere"))

    def op_read(self, slot, off, length):
        h = self.m.handles.get(slot)
        if h is None:
            return SKIP
        got, err = call(pread_all, self.fds[slot], off, length)
        exp_err = None if h.readable else errno.EBADF
        if err in ACCEPT_RO_UNLINKED and exp_err is None and not h.writable and not h.inode.linked:
            self.note(f"read of an unlinked file via a read-only handle gave {en(err)}")
            return
        self.expect_errno(f"read({self.hdesc(slot)}, off={off}, len={length})", exp_err, err)
        if err is None and h.readable:
            exp = bytes(h.inode.data[off:off + length])
            if got != exp:
                others = {repr(p): i.data for p, i in self.m.files.items() if i is not h.inode}
                raise Divergence("data", f"read({self.hdesc(slot)}, off={off}, len={length}): "
                                 + describe_mismatch(exp, got, off, h.inode.data, others))

    def check_fstat(self, slot, when=""):
        h = self.m.handles[slot]
        st, err = call(os.fstat, self.fds[slot])
        what = f"fstat({self.hdesc(slot)}){' ' + when if when else ''}"
        self.expect_errno(what, None, err)
        if st.st_size != len(h.inode.data):
            raise Divergence("size", f"{what}: expected size {len(h.inode.data)}, seen {st.st_size}")
        nlink = 1 if h.inode.linked else 0
        if st.st_nlink != nlink:
            raise Divergence("nlink", f"{what}: expected st_nlink {nlink}, seen {st.st_nlink}")

    def op_fstat(self, slot):
        if slot not in self.m.handles:
            return SKIP
        self.check_fstat(slot)

    def op_fsync(self, slot):
        if slot not in self.m.handles:
            return SKIP
        _, got = call(os.fsync, self.fds[slot])
        self.expect_errno(f"fsync({self.hdesc(slot)})", None, got)

    def op_ftruncate(self, slot, size):
        h = self.m.handles.get(slot)
        if h is None:
            return SKIP
        _, got = call(os.ftruncate, self.fds[slot], size)
        self.expect_errno(f"ftruncate({self.hdesc(slot)}, {size})", None if h.writable else errno.EINVAL, got)
        if h.writable:
            resize(h.inode.data, size)
            h.inode.version += 1
            self.check_fstat(slot, f"after ftruncate to {size}")

    # ---- path ops
    def op_stat(self, path):
        st, got = call(os.stat, self.p(path))
        self.expect_errno(f"stat({path!r})", self.m.lookup_err(path), got)
        if got is None:
            self.compare_stat(path, st, "stat")

    def compare_stat(self, path, st, what):
        k = self.m.kind(path)
        seen = "dir" if st_mod.S_ISDIR(st.st_mode) else "file" if st_mod.S_ISREG(st.st_mode) else oct(st.st_mode)
        if seen != k:
            raise Divergence("type", f"{what}({path!r}): expected a {k}, seen a {seen}")
        if k == "file" and st.st_size != len(self.m.files[path].data):
            raise Divergence("size", f"{what}({path!r}): expected size {len(self.m.files[path].data)}, seen {st.st_size}")

    def op_truncate(self, path, size):
        m = self.m
        exp = m.lookup_err(path) or (errno.EISDIR if m.kind(path) == "dir" else None)
        _, got = call(os.truncate, self.p(path), size)
        if exp is None and self.accept_busy(f"truncate({path!r})", m.files.get(path), True, got):
            return
        self.expect_errno(f"truncate({path!r}, {size})", exp, got)
        if exp is None:
            resize(m.files[path].data, size)
            m.files[path].version += 1
            self.op_stat(path)

    def op_rename(self, src, dst):
        m = self.m
        exp = m.rename_err(src, dst)
        _, got = call(os.rename, self.p(src), self.p(dst))
        if self.expect_errno(f"rename({src!r}, {dst!r})", exp, got, ws_ok=is_ws_odd(dst) and src != dst):
            return
        if exp is None:
            m.rename(src, dst)
            if src != dst:
                self.op_stat(src)
            self.op_stat(dst)

    def op_unlink(self, path):
        m = self.m
        exp = m.lookup_err(path) or (errno.EISDIR if m.kind(path) == "dir" else None)
        _, got = call(os.unlink, self.p(path))
        self.expect_errno(f"unlink({path!r})", exp, got)
        if exp is None:
            m.files.pop(path).linked = False
            self.op_stat(path)

    def op_mkdir(self, path):
        m = self.m
        exp = m.parent_err(path) or (errno.EEXIST if m.kind(path) else None)
        _, got = call(os.mkdir, self.p(path))
        if self.expect_errno(f"mkdir({path!r})", exp, got, ws_ok=is_ws_odd(path)):
            return
        if exp is None:
            m.dirs.add(path)
            self.op_stat(path)

    def op_rmdir(self, path):
        m = self.m
        exp = m.lookup_err(path)
        if exp is None:
            exp = errno.ENOTDIR if m.kind(path) == "file" else errno.ENOTEMPTY if m.children(path) else None
        _, got = call(os.rmdir, self.p(path))
        self.expect_errno(f"rmdir({path!r})", exp, got)
        if exp is None:
            m.dirs.remove(path)
            self.op_stat(path)

    def dir_err(self, path):
        return self.m.lookup_err(path) or (errno.ENOTDIR if self.m.kind(path) == "file" else None)

    def op_listdir(self, path):
        names, got = call(os.listdir, self.p(path))
        self.expect_errno(f"listdir({path!r})", self.dir_err(path), got)
        if got is None:
            self.compare_names(path, set(names), "listdir")

    def compare_names(self, path, seen, what):
        exp = set(self.m.children(path))
        if seen != exp:
            raise Divergence("listing", f"{what}({path!r}): missing {sorted(exp - seen)}, "
                             f"unexpected {sorted(seen - exp)} (expected {sorted(exp)})")

    def op_scandir(self, path):
        def scan():
            out = {}
            with os.scandir(self.p(path)) as it:
                for e in it:
                    out[e.name] = (e.is_dir(follow_symlinks=False), e.stat(follow_symlinks=False))
            return out
        ents, got = call(scan)
        self.expect_errno(f"scandir({path!r})", self.dir_err(path), got)
        if got is not None:
            return
        self.compare_names(path, set(ents), "scandir")
        for name, (is_dir, st) in sorted(ents.items()):
            p = join(path, name)
            if is_dir != (self.m.kind(p) == "dir"):
                raise Divergence("type", f"scandir({path!r}): d_type of {name!r} says dir={is_dir}")
            self.compare_stat(p, st, "scandir+stat")

    def op_cat(self, path):
        m = self.m
        k = m.kind(path)
        if k == "dir":
            return SKIP

        def cat():
            fd = os.open(self.p(path), os.O_RDONLY | os.O_CLOEXEC)
            try:
                return pread_all(fd, 0, 1 << 40)
            finally:
                os.close(fd)
        got, err = call(cat)
        if m.lookup_err(path) is None and self.accept_busy("a read-only open", m.files.get(path), False, err):
            return
        self.expect_errno(f"cat({path!r})", m.lookup_err(path), err)
        if err is None:
            exp = bytes(m.files[path].data)
            if got != exp:
                others = {repr(p): i.data for p, i in m.files.items() if p != path}
                raise Divergence("data", f"cat({path!r}): " + describe_mismatch(exp, got, 0, exp, others))

    def op_sleep(self, secs):
        time.sleep(secs)

    # ---- end of a run
    def close_all(self):
        """Read each readable handle whole, then close every handle."""
        for slot in sorted(self.m.handles):
            if self.m.handles[slot].readable:
                self.op_read(slot, 0, len(self.m.handles[slot].inode.data) + 1)
        for slot in sorted(self.m.handles):
            self.op_close(slot)

    def compare_tree(self):
        for d in sorted(self.m.dirs):
            self.op_scandir(d)
        for p in sorted(self.m.files):
            self.op_cat(p)


def resize(d: bytearray, size: int) -> None:
    if size < len(d):
        del d[size:]
    else:
        d.extend(bytes(size - len(d)))
