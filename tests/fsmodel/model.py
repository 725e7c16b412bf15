"""The reference the mount is compared with: what a local POSIX file system would hold.

Inodes hold bytearrays (an unlinked inode keeps its bytes for the handles still open on
it), the namespace maps worker-relative paths to inodes, `dirs` is the set of directories
("" is the worker's own), and `handles` maps slots to open handles (inode + mode).
`rename_err` and friends give the errno Linux gives for an op, before the op is run.
Each inode counts its changes (`version`) and each handle remembers the count at its open:
with FUSE passthrough, whether a handle may still read an older version decides which
EBUSY the mount may answer (runner.py, `busy_ok`).
"""

from __future__ import annotations

import errno

from .ops import md5, parent, parse_mode


class Inode:
    __slots__ = ("data", "linked", "version")

    def __init__(self):
        self.data = bytearray()
        self.linked = True
        self.version = 0  # changes of `data` so far


class Handle:
    __slots__ = ("inode", "mode", "readable", "writable", "append", "version")

    def __init__(self, inode, mode):
        _, self.readable, self.writable, extra = parse_mode(mode)
        self.inode, self.mode, self.append = inode, mode, "a" in extra
        self.version = inode.version  # the inode's version when this handle opened it


class Model:
    """What a local POSIX file system would hold: the reference the mount is compared with."""

    def __init__(self):
        self.files: dict[str, Inode] = {}
        self.dirs: set[str] = {""}  # "" is the worker's own directory
        self.handles: dict[int, Handle] = {}

    def kind(self, p):
        return "file" if p in self.files else "dir" if p in self.dirs else None

    def parent_err(self, p):
        parts = p.split("/")
        for i in range(1, len(parts)):
            q = "/".join(parts[:i])
            if q in self.files:
                return errno.ENOTDIR
            if q not in self.dirs:
                return errno.ENOENT
        return None

    def lookup_err(self, p):
        return self.parent_err(p) or (None if self.kind(p) else errno.ENOENT)

    def children(self, d) -> dict[str, str]:
        out = {p.rsplit("/", 1)[-1]: "file" for p in self.files if parent(p) == d}
        out.update({p.rsplit("/", 1)[-1]: "dir" for p in self.dirs if p and parent(p) == d})
        return out

    def path_of(self, ino) -> str:
        for p, i in self.files.items():
            if i is ino:
                return repr(p)
        return "(unlinked)"

    def rename_err(self, s, d):
        e = self.parent_err(s) or self.parent_err(d)
        if e:
            return e
        ks, kd = self.kind(s), self.kind(d)
        if ks is None:
            return errno.ENOENT
        if s == d:
            return None
        if parent(s) != parent(d):
            if ks == "dir" and d.startswith(s + "/"):
                return errno.EINVAL     # into itself
            if s.startswith(d + "/"):
                return errno.ENOTEMPTY  # onto its own ancestor
        if kd == "dir" and ks == "file":
            return errno.EISDIR
        if kd == "file" and ks == "dir":
            return errno.ENOTDIR
        if kd == "dir" and self.children(d):
            return errno.ENOTEMPTY
        return None

    def rename(self, s, d):
        if s == d:
            return
        if s in self.files:
            if d in self.files:
                self.files[d].linked = False
            self.dirs.discard(d)
            self.files[d] = self.files.pop(s)
            return
        self.dirs.discard(d)  # an empty directory is replaced
        pre = s + "/"
        moved = [p for p in self.files if p.startswith(pre)]
        for p in moved:
            self.files[d + p[len(s):]] = self.files.pop(p)
        for p in [p for p in self.dirs if p == s or p.startswith(pre)]:
            self.dirs.remove(p)
            self.dirs.add(d + p[len(s):])

    def snapshot(self) -> dict:
        return {"files": {p: [len(i.data), md5(i.data)] for p, i in self.files.items()},
                "dirs": sorted(self.dirs)}
