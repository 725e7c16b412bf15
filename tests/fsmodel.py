#!/usr/bin/env python3
"""fsx-style randomized model test of a bucketfs mount, through the kernel.

Several worker processes run seeded random sequences of file system operations, each in
its own subdirectory `w<N>` of one mount, and check every result against an in-memory
reference model (inodes holding bytearrays, a namespace path -> inode, directories, open
handle slots -> inode + flags). Meanwhile lister processes walk the same directories
(os.listdir, os.scandir + stat) all the while, as `ls -l` in another terminal would.

Ops name handle *slots* (0..7) and *paths* relative to the worker's directory; the model
decides when an op runs whether it applies: an op on an empty slot (or opening an occupied
one) is skipped, an op on a path is run and its errno compared with the model's. So any
sub-sequence of a recorded sequence is still a meaningful test, which is what shrinking
needs. Divergences the contract (docs/SEMANTICS.md) allows are accepted:
  - create/mkdir/rename to a name with leading/trailing whitespace may fail with EINVAL
    (else the name must round-trip exactly);
  - a read through a read-only handle of a file unlinked (or replaced) since may give
    ESTALE or ENOENT (else the right bytes);
  - mtime, permissions, directory sizes and link counts are not compared; no hard links
    or symlinks are made.

At the end each worker reads every handle whole, closes it and compares its whole tree;
the orchestrator then unmounts, compares the bucket itself (s3, gcs, file; not mem:// or
gdrive://), remounts and compares the tree again (not mem://). On a divergence it prints
the seed, the op index, expected vs seen, and shrinks the failing worker's sequence on
fresh directories of a fresh mount (same number of listers), within a time bound: the ops
related to the failing one (a backward slice), the shortest failing prefix, then chunks
and single ops removed while it still fails the same way.

Layout: ops and their formatting; the model; the generator (Gen); the executor (Runner:
one op_* method per op, each running the call, comparing, updating the model); the worker
and lister processes; the orchestration (run); shrinking (Shrinker); main.

Standalone (a soak):
    python3 tests/fsmodel.py --store s3 --ops 100000 --seed N --workers 4 --listers 2
    python3 tests/fsmodel.py --store s3 --replay /tmp/fsmodel-....json   # re-run a saved sequence
Extra mount flags go after `--`: `... --store s3 -- --metadata-ttl 0`; `--exclude scandir,listdir`
stops generating some op kinds (to look past a known bug).
BUCKETFS_MODEL_SEED fixes the seed (else random, printed). Exit status 1 on a divergence.
tests/test_model.py runs bounded runs of it on every store. See docs/MODEL_TEST.md.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import multiprocessing
import os
import queue
import random
import re
import stat as st_mod
import sys
import tempfile
import time
import traceback

KiB, MiB = 1024, 1024 * 1024
SLOTS = 8
FILE_NAMES = ["f0", "f1", "f2", "f3", "f4", "f5"]
DIR_NAMES = ["d0", "d1", "d2", "e0"]
# unicode and whitespace at the ends (bucketfs must keep them exactly or refuse with EINVAL)
ODD_NAMES = ["a ", " b", " c ", "ü.txt", "日本語", "sp ace", "dé"]
ALL_NAMES = set(FILE_NAMES + DIR_NAMES + ODD_NAMES)
ROOT_NAME = re.compile(r"^(w\d+|s\d+)$")  # worker and shrink-trial directories
ACCEPT_RO_UNLINKED = (errno.ESTALE, errno.ENOENT)
ACCEPT_LISTER = (errno.ENOENT, errno.ENOTDIR)  # a name vanishing between readdir and stat


def en(e) -> str:
    return "success" if e is None else errno.errorcode.get(e, str(e))


def is_ws_odd(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name != name.strip()


def parent(p: str) -> str:
    return p.rpartition("/")[0]


def join(d: str, n: str) -> str:
    return f"{d}/{n}" if d else n


def md5(b) -> str:
    return hashlib.md5(b).hexdigest()


def gen_bytes(dseed: int, n: int) -> bytes:
    return random.Random(dseed).randbytes(n)


# =============================================================================== ops
# An op is a tuple (name, *args); it pickles, and prints as a Python-like call.
OP_FORMAT = {
    "open": "open({}, {!r}, {!r})", "close": "close({})",
    "write": "write({}, off={}, len={}, seed={})", "read": "read({}, off={}, len={})",
    "fstat": "fstat({})", "ftruncate": "ftruncate({}, {})", "fsync": "fsync({})",
    "stat": "stat({!r})", "truncate": "truncate({!r}, {})", "rename": "rename({!r}, {!r})",
    "unlink": "unlink({!r})", "mkdir": "mkdir({!r})", "rmdir": "rmdir({!r})",
    "listdir": "listdir({!r})", "scandir": "scandir({!r})", "cat": "cat({!r})",
    "sleep": "sleep({})",
}


def fmt_op(op) -> str:
    return OP_FORMAT[op[0]].format(*op[1:])


def parse_mode(mode: str):
    """'rw+act' -> (flags, readable, writable, extra letters). a=O_APPEND c=O_CREAT t=O_TRUNC x=O_EXCL."""
    acc, _, extra = mode.partition("+")
    flags = {"r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR}[acc]
    for ch, f in (("a", os.O_APPEND), ("c", os.O_CREAT), ("t", os.O_TRUNC), ("x", os.O_EXCL)):
        if ch in extra:
            flags |= f
    return flags, acc != "w", acc != "r", extra


# =============================================================================== model

class Inode:
    __slots__ = ("data", "linked")

    def __init__(self):
        self.data = bytearray()
        self.linked = True


class Handle:
    __slots__ = ("inode", "mode", "readable", "writable", "append")

    def __init__(self, inode, mode):
        _, self.readable, self.writable, extra = parse_mode(mode)
        self.inode, self.mode, self.append = inode, mode, "a" in extra


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


# =============================================================================== generator

class Gen:
    """Picks the next op from the model's state: mostly valid, sometimes meant to fail."""

    def __init__(self, rng: random.Random, sleep_secs: float, exclude=()):
        self.rng, self.sleep_secs, self.exclude = rng, sleep_secs, set(exclude)

    def name(self, pool):
        r = self.rng
        odd = ODD_NAMES if "ws_names" not in self.exclude else [n for n in ODD_NAMES if n == n.strip()]
        return r.choice(odd) if r.random() < 0.07 else r.choice(pool)

    def next(self, m: Model):
        r = self.rng
        self.m = m
        self.files = sorted(m.files)
        self.dirs = sorted(m.dirs)
        self.slots = sorted(m.handles)
        open_inos = {id(h.inode) for h in m.handles.values()}
        self.open_files = [p for p in self.files if id(m.files[p]) in open_inos]
        unlinked_open = any(not h.inode.linked for h in m.handles.values())
        choices = [
            (10, self.open_existing), (5, self.create), (7, self.close), (22, self.write),
            (12, self.read), (4, self.fstat), (2, self.fsync), (3, self.ftruncate),
            (2, self.truncate), (4, self.stat), (3, self.rename_file), (2, self.rename_dir),
            (3, self.unlink), (3, self.mkdir), (2, self.rmdir), (4, self.listdir),
            (3, self.scandir), (2, self.cat), (2, self.invalid),
            (1 if unlinked_open else 0.2, self.sleep),
        ]
        if len(self.files) > 14:
            choices.append((8, self.unlink))
        if len(self.dirs) > 9:
            choices.append((6, self.rmdir))
        choices = [(w, fn) for w, fn in choices if fn.__name__ not in self.exclude]
        total = sum(w for w, _ in choices)
        for _ in range(20):
            x = r.uniform(0, total)
            for w, fn in choices:
                x -= w
                if x <= 0:
                    break
            op = fn()
            if op and op[0] not in self.exclude:
                return op
        return ("listdir", "")

    # ---- helpers
    def pick_file(self, opened_bias=0.4):
        r = self.rng
        if self.open_files and r.random() < opened_bias:
            return r.choice(self.open_files)
        return r.choice(self.files) if self.files else None

    def free_slot(self):
        free = [s for s in range(SLOTS) if s not in self.m.handles]
        return self.rng.choice(free) if free else None

    def slot_where(self, pred):
        s = [k for k in self.slots if pred(self.m.handles[k])]
        return self.rng.choice(s) if s else None

    def new_path(self, pool, max_depth=3):
        dirs = [d for d in self.dirs if d.count("/") + 1 < max_depth or d == ""] or [""]
        return join(self.rng.choice(dirs), self.name(pool))

    def write_range(self, size):
        r = self.rng
        x = r.random()
        if x < 0.03:  # across a 2 MiB block (or, rarely, an 8 MiB part) boundary
            b = 8 * MiB if r.random() < 0.15 else 2 * MiB * r.choice([1, 1, 2])
            ln = r.randint(2, 128 * KiB)
            return max(0, b - r.randint(1, ln - 1)), ln
        if x < 0.06:  # an occasional big write: a file of a few MiB
            return r.randint(0, size), r.randint(256 * KiB, 3 * MiB)
        ln = r.randint(1, 4 * KiB) if r.random() < 0.5 else r.randint(1, 64 * KiB)
        y = r.random()
        if size > MiB:
            y *= 0.6  # keep big files from growing
        if y < 0.55:
            return r.randint(0, size), ln
        if y < 0.8:
            return size, ln
        return size + r.randint(1, 256 * KiB), ln  # leaves a hole

    def size_of_slot(self, s):
        return len(self.m.handles[s].inode.data)

    # ---- ops
    def open_existing(self):
        p = self.pick_file()
        s = self.free_slot()
        if p is None:
            return self.create()
        if s is None:
            return self.close()
        mode = self.rng.choices(["r", "rw", "w", "w+a", "rw+a", "w+t", "rw+t", "r+c"],
                                [35, 25, 8, 10, 10, 4, 4, 4])[0]
        return ("open", s, p, mode)

    def create(self):
        s = self.free_slot()
        if s is None:
            return self.close()
        mode = self.rng.choice(["rw+c", "w+c", "rw+cx", "w+ca", "rw+ct", "rw+ca"])
        return ("open", s, self.new_path(FILE_NAMES), mode)

    def close(self):
        return ("close", self.rng.choice(self.slots)) if self.slots else None

    def write(self):
        s = self.slot_where(lambda h: h.writable)
        if s is None:
            return self.open_existing() if self.files and self.rng.random() < 0.7 else self.create()
        off, ln = self.write_range(self.size_of_slot(s))
        return ("write", s, off, ln, self.rng.randrange(1 << 30))

    def read(self):
        r = self.rng
        s = self.slot_where(lambda h: h.readable)
        if s is None:
            return self.open_existing()
        size = self.size_of_slot(s)
        x = r.random()
        if x < 0.1:
            return ("read", s, 0, size + 10)
        if x < 0.2 and size > 2 * MiB:
            return ("read", s, 2 * MiB - r.randint(1, 64 * KiB), 128 * KiB)
        return ("read", s, r.randint(0, size + 100), r.randint(1, 128 * KiB))

    def fstat(self):
        return ("fstat", self.rng.choice(self.slots)) if self.slots else None

    def fsync(self):
        return ("fsync", self.rng.choice(self.slots)) if self.slots else None

    def trunc_size(self, size):
        r = self.rng
        x = r.random() * (0.5 if size > 2 * MiB else 1.0)
        if x < 0.5:
            return r.randint(0, size)
        if x < 0.8:
            return size + r.randint(1, 128 * KiB)
        if x < 0.85:
            return 2 * MiB + r.randint(-4096, 4096)
        return 0

    def ftruncate(self):
        s = self.slot_where(lambda h: h.writable)
        return ("ftruncate", s, self.trunc_size(self.size_of_slot(s))) if s is not None else None

    def truncate(self):
        p = self.pick_file()
        return ("truncate", p, self.trunc_size(len(self.m.files[p].data))) if p else None

    def stat(self):
        r = self.rng
        p = self.pick_file(0.3) if r.random() < 0.7 else r.choice(self.dirs[1:] or [self.new_path(FILE_NAMES)])
        return ("stat", p) if p else None

    def rename_file(self):
        r = self.rng
        p = self.pick_file(0.5)
        if p is None:
            return None
        d = r.choice(self.files) if r.random() < 0.25 else self.new_path(FILE_NAMES)
        return ("rename", p, d)

    def rename_dir(self):
        r = self.rng
        cands = [d for d in self.dirs if d]
        if not cands:
            return self.mkdir()
        with_open = [d for d in cands if any(f.startswith(d + "/") for f in self.open_files)]
        src = r.choice(with_open) if with_open and r.random() < 0.6 else r.choice(cands)
        dirs = [d for d in self.dirs if d != src and not d.startswith(src + "/") and d.count("/") < 2]
        dst = join(r.choice(dirs or [""]), self.name(DIR_NAMES))
        if r.random() < 0.1:  # onto an existing (maybe empty) directory
            dst = r.choice(cands)
        return ("rename", src, dst)

    def unlink(self):
        p = self.pick_file(0.5)
        return ("unlink", p) if p else None

    def mkdir(self):
        if len(self.dirs) > 9:
            return None
        return ("mkdir", self.new_path(DIR_NAMES, max_depth=3))

    def rmdir(self):
        r = self.rng
        cands = [d for d in self.dirs if d]
        empty = [d for d in cands if not self.m.children(d)]
        if empty and r.random() < 0.8:
            return ("rmdir", r.choice(empty))
        return ("rmdir", r.choice(cands)) if cands else None

    def listdir(self):
        return ("listdir", self.rng.choice(self.dirs))

    def scandir(self):
        return ("scandir", self.rng.choice(self.dirs))

    def cat(self):
        p = self.pick_file(0.5)
        return ("cat", p) if p else None

    def sleep(self):
        return ("sleep", self.sleep_secs)

    def invalid(self):
        """An op that must fail, with the errno Linux gives."""
        r, m = self.rng, self.m
        dirs = [d for d in self.dirs if d]
        kinds = ["open-missing", "stat-missing", "through-file", "mkdir-exists", "create-excl",
                 "unlink-dir", "rmdir-file", "rmdir-nonempty", "open-dir-write", "rename-into-self",
                 "rename-file-onto-dir", "rename-dir-onto-file", "listdir-file", "bad-fd"]
        k = r.choice(kinds)
        f = r.choice(self.files) if self.files else None
        d = r.choice(dirs) if dirs else None
        s = self.free_slot()
        if k == "open-missing" and s is not None:
            p = self.new_path(FILE_NAMES)
            return ("open", s, p, "r") if p not in m.files else None
        if k == "stat-missing":
            return ("stat", join(r.choice(self.dirs), "missing"))
        if k == "through-file" and f:
            return ("stat", f + "/x") if r.random() < 0.5 else ("mkdir", f + "/x")
        if k == "mkdir-exists" and (f or d):
            return ("mkdir", r.choice([x for x in (f, d) if x]))
        if k == "create-excl" and f and s is not None:
            return ("open", s, f, "rw+cx")
        if k == "unlink-dir" and d:
            return ("unlink", d)
        if k == "rmdir-file" and f:
            return ("rmdir", f)
        if k == "rmdir-nonempty":
            ne = [x for x in dirs if m.children(x)]
            return ("rmdir", r.choice(ne)) if ne else None
        if k == "open-dir-write" and d and s is not None:
            return ("open", s, d, r.choice(["w", "rw", "rw+c"]))
        if k == "rename-into-self" and d:
            return ("rename", d, join(d, "x"))
        if k == "rename-file-onto-dir" and f and d:
            return ("rename", f, d)
        if k == "rename-dir-onto-file" and f and d:
            return ("rename", d, f)
        if k == "listdir-file" and f:
            return ("listdir", f)
        if k == "bad-fd":
            s2 = self.slot_where(lambda h: not h.writable)
            if s2 is not None:
                return ("write", s2, 0, 10, r.randrange(1 << 30))
            s2 = self.slot_where(lambda h: not h.readable)
            if s2 is not None:
                return ("read", s2, 0, 10)
        return None


# =============================================================================== executor

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

    def __init__(self, root: str):
        self.root, self.m, self.fds = root, Model(), {}
        self.notes: dict[str, int] = {}

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
        if self.expect_errno(f"open({path!r}, {mode!r})", exp, got, ws_ok=creating and is_ws_odd(path)):
            return
        if exp is not None:
            return
        if creating:
            m.files[path] = Inode()
        ino = m.files[path]
        if "t" in extra and writable:
            ino.data.clear()
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
        self.expect_errno(f"truncate({path!r}, {size})", exp, got)
        if exp is None:
            resize(m.files[path].data, size)
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


# =============================================================================== processes

def worker_main(spec: dict, q, prog, oprepr) -> None:
    """One worker: run `spec['ops']` (replay) or `spec['nops']` generated ops in spec['root'],
    then close every handle and compare the whole tree. Puts one result dict on `q`."""
    t0 = time.monotonic()
    res = {"wid": spec["wid"], "ops_done": 0, "failure": None, "notes": {}, "skipped": 0, "timing": {}}
    given = spec.get("ops")
    n = len(given) if given is not None else spec["nops"]
    gen = Gen(random.Random(spec["seed"]), spec["sleep_secs"], spec.get("exclude", ()))
    run = Runner(spec["root"])
    ops, i, op = [], -1, None
    try:
        os.mkdir(spec["root"])
        for i in range(n):
            op = given[i] if given is not None else gen.next(run.m)
            ops.append(op)
            prog[0], prog[1] = i, time.time()
            oprepr.value = fmt_op(op).encode()[:500]
            t1 = time.monotonic()
            if run.step(op) == SKIP:
                res["skipped"] += 1
                if given is not None:
                    res.setdefault("skipped_idx", []).append(i)
            c = res["timing"].setdefault(op[0], [0, 0.0])
            c[0] += 1
            c[1] += time.monotonic() - t1
            res["ops_done"] = i + 1
        i, op = n, ("final",)
        prog[0], prog[1] = n, time.time()
        oprepr.value = b"final: read and close every handle, compare the tree"
        run.close_all()
        run.compare_tree()
        res["snapshot"] = run.m.snapshot()
    except Divergence as d:
        res["failure"] = {"index": i, "op": op, "sig": f"{d.sig} in {op[0]}", "msg": d.msg,
                          "secs": time.monotonic() - t0}
    except Exception as e:  # a bug in this test, or an unexpected exception type
        res["failure"] = {"index": i, "op": op, "sig": "crash", "msg": f"{e!r}\n{traceback.format_exc()}"}
    if res["failure"]:
        res["ops"] = ops
        for fd in run.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
    res["notes"] = run.notes
    res["elapsed"] = time.monotonic() - t0
    q.put(res)


# Google Drive shows the second of two items with one name as `stem~ID8.ext`
# (docs/SEMANTICS.md): a rename replacing a file there is not atomic (the replaced file is
# trashed after the move), so a listing taken in between shows both.
DRIVE_REPEAT = re.compile(r"^(?P<stem>.*)~[A-Za-z0-9_-]{8}(?P<ext>\.[^.]*)?$")


def lister_main(lid: int, mp_root: str, target, stop, q, store: str = "") -> None:
    """Walk the target subtree (os.listdir, os.scandir + lstat) until told to stop. Names
    vanishing mid-walk (ENOENT, ENOTDIR) are fine; any other error or a name no worker
    makes is reported (on gdrive a repeated name's `stem~ID8` form is counted, not
    reported: the workers' own listings must never show it)."""
    rng = random.Random(lid)
    res = {"lid": lid, "walks": 0, "entries": 0, "anomalies": [], "notes": {}}

    def anomaly(msg):
        if msg not in res["anomalies"] and len(res["anomalies"]) < 10:
            res["anomalies"].append(msg)

    def walk(d, depth):
        try:
            if rng.random() < 0.3:
                for n in os.listdir(d):
                    check(d, n)
            with os.scandir(d) as it:
                ents = list(it)
        except OSError as e:
            if e.errno not in ACCEPT_LISTER:
                anomaly(f"listing {d}: {en(e.errno)} {e.strerror}")
            return
        for e in ents:
            check(d, e.name)
            res["entries"] += 1
            try:
                e.stat(follow_symlinks=False)
                is_dir = e.is_dir(follow_symlinks=False)
            except OSError as err:
                if err.errno not in ACCEPT_LISTER:
                    anomaly(f"stat {e.path}: {en(err.errno)} {err.strerror}")
                continue
            if is_dir and depth < 6:
                walk(e.path, depth + 1)

    def check(d, n):
        if n in ALL_NAMES or ROOT_NAME.match(n):
            return
        m = DRIVE_REPEAT.match(n) if store == "gdrive" else None
        if m and m["stem"] + (m["ext"] or "") in ALL_NAMES:
            k = "a lister saw a repeated name's ~ID8 form (a rename replacing a file, midway)"
            res["notes"][k] = res["notes"].get(k, 0) + 1
            return
        anomaly(f"listing {d} shows a name no worker makes: {n!r}")

    while not stop.is_set():
        walk(os.path.join(mp_root, target.value.decode()), 0)
        res["walks"] += 1
        if rng.random() < 0.5:
            time.sleep(rng.uniform(0, 0.005))
    q.put(res)


class Listers:
    def __init__(self, ctx, mp_root: str, n: int, store: str = ""):
        self.ctx, self.q, self.stop_ev = ctx, ctx.Queue(), ctx.Event()
        self.target = ctx.Array("c", 512, lock=False)
        self.procs = [ctx.Process(target=lister_main, args=(i, mp_root, self.target, self.stop_ev, self.q, store), daemon=True)
                      for i in range(n)]
        for p in self.procs:
            p.start()

    def set_target(self, rel: str):
        self.target.value = rel.encode()

    def stop(self) -> list[dict]:
        self.stop_ev.set()
        out, deadline = [], time.monotonic() + 60
        while len(out) < len(self.procs) and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                out.append(self.q.get(timeout=1))
        got = {r["lid"] for r in out}
        for i, p in enumerate(self.procs):
            p.join(5 if i in got else 0.1)
            if p.is_alive() and i not in got:
                p.kill()
                out.append({"lid": i, "walks": 0, "entries": 0, "notes": {},
                            "anomalies": ["a lister was stuck in a file system call for 60 s (killed)"]})
        return out


def run_workers(ctx, specs: list[dict], hang_secs: float, progress_every: float = 0) -> list[dict]:
    """Start one process per spec, wait for all results. A worker whose op has not returned
    after `hang_secs` is killed and reported as hung at that op."""
    q = ctx.Queue()
    progs = [ctx.Array("d", 2, lock=False) for _ in specs]
    reprs = [ctx.Array("c", 512, lock=False) for _ in specs]
    procs = []
    for s, pg, rp in zip(specs, progs, reprs):
        pg[0], pg[1] = -1, time.time()
        procs.append(ctx.Process(target=worker_main, args=(s, q, pg, rp), daemon=True))
        procs[-1].start()
    results, gone_at, last_print = {}, {}, time.monotonic()
    t0 = time.monotonic()
    while len(results) < len(specs):
        with contextlib.suppress(queue.Empty):
            r = q.get(timeout=0.5)
            results[r["wid"]] = r
            continue
        now = time.time()
        for s, p, pg, rp in zip(specs, procs, progs, reprs):
            wid = s["wid"]
            if wid in results:
                continue
            if not p.is_alive():
                gone_at.setdefault(wid, now)
                if now - gone_at[wid] > 10:
                    results[wid] = {"wid": wid, "ops_done": int(pg[0]), "notes": {}, "skipped": 0, "elapsed": 0, "timing": {},
                                    "failure": {"index": int(pg[0]), "op": None, "sig": "crash",
                                                "msg": f"worker process died (exit code {p.exitcode}) at "
                                                       f"{rp.value.decode(errors='replace')}"}}
            elif now - pg[1] > hang_secs:
                p.kill()
                results[wid] = {"wid": wid, "ops_done": int(pg[0]), "notes": {}, "skipped": 0, "elapsed": 0, "timing": {},
                                "failure": {"index": int(pg[0]), "op": None, "sig": "hang",
                                            "msg": f"op #{int(pg[0])} {rp.value.decode(errors='replace')} had not "
                                                   f"returned after {hang_secs:.0f} s (killed)"}}
        if progress_every and time.monotonic() - last_print > progress_every:
            last_print = time.monotonic()
            done = sum(max(0, int(pg[0])) for pg in progs)
            print(f"  ... {done} ops in {last_print - t0:.0f} s ({done / (last_print - t0):.0f} ops/s)", flush=True)
    for p in procs:
        p.join(10)
    return [results[s["wid"]] for s in specs]


# =============================================================================== orchestration

class Config:
    def __init__(self, store="s3", ops=2000, seed=None, workers=3, listers=2, mount_args=(),
                 shrink_secs=180.0, hang_secs=180.0, replay=None, progress_every=0.0, verbose=True,
                 exclude=()):
        self.store, self.ops, self.workers, self.listers = store, ops, workers, listers
        self.mount_args = list(mount_args)
        if seed is None:
            env = os.environ.get("BUCKETFS_MODEL_SEED")
            seed = int(env) if env else random.randrange(1 << 31)
        self.seed, self.shrink_secs, self.hang_secs = seed, shrink_secs, hang_secs
        self.replay, self.progress_every, self.verbose = replay, progress_every, verbose
        self.exclude = list(exclude)
        ttl = 1.0
        if "--metadata-ttl" in self.mount_args:
            ttl = float(self.mount_args[self.mount_args.index("--metadata-ttl") + 1])
        self.sleep_secs = round(ttl + 0.3, 2) if ttl > 0 else 0.1

    def command(self) -> str:
        extra = (" -- " + " ".join(self.mount_args)) if self.mount_args else ""
        if self.replay is not None:
            return f"python3 tests/fsmodel.py --store {self.store} --listers {self.listers} --replay FILE{extra}"
        excl = f" --exclude {','.join(self.exclude)}" if self.exclude else ""
        return (f"python3 tests/fsmodel.py --store {self.store} --ops {self.ops} --seed {self.seed} "
                f"--workers {self.workers} --listers {self.listers}{excl}{extra}")


class Report:
    def __init__(self, cfg: Config):
        self.cfg, self.lines, self.problems = cfg, [], []
        self.ops = 0
        self.elapsed = 0.0

    def say(self, line=""):
        self.lines.append(line)
        if self.cfg.verbose:
            print(line, flush=True)

    def problem(self, line):
        self.problems.append(line)
        self.say("DIVERGENCE " + line)

    @property
    def ok(self) -> bool:
        return not self.problems

    def text(self) -> str:
        return "\n".join(self.lines)


def worker_specs(cfg: Config, mp: str) -> list[dict]:
    if cfg.replay is not None:
        return [{"wid": 0, "root": os.path.join(mp, "w0"), "seed": 0, "ops": cfg.replay,
                 "sleep_secs": cfg.sleep_secs}]
    per = [cfg.ops // cfg.workers + (1 if i < cfg.ops % cfg.workers else 0) for i in range(cfg.workers)]
    return [{"wid": i, "root": os.path.join(mp, f"w{i}"), "seed": f"{cfg.seed}/w{i}", "nops": per[i],
             "sleep_secs": cfg.sleep_secs, "exclude": cfg.exclude} for i in range(cfg.workers)]


def describe_failure(r: dict, n_ops) -> str:
    f = r["failure"]
    where = "the final check (handles read and closed, whole tree compared)" if f["op"] == ("final",) else \
        f"op #{f['index']} of {n_ops}" + (f": {fmt_op(f['op'])}" if f["op"] else "")
    secs = f" ({f['secs']:.1f} s into the run)" if f.get("secs") is not None else ""
    lines = [f"worker w{r['wid']} at {where}{secs} [{f['sig']}]", f"    {f['msg']}"]
    ops = r.get("ops") or []
    if ops:
        lines.append("    last ops before it:")
        lines += [f"      #{k}: {fmt_op(o)}" for k, o in list(enumerate(ops))[max(0, f['index'] - 8):f['index']]]
    return "\n".join(lines)


def compare_bucket(store: str, bucket: str, prefix: str, snap: dict) -> list[str]:
    """The bucket's own keys under `prefix` against a worker's final model."""
    import seed as seedmod
    keys = seedmod.list_keys(store, bucket, prefix + "/")
    exp_files = {f"{prefix}/{p}": v for p, v in snap["files"].items()}
    exp_dirs = {prefix} | {f"{prefix}/{d}" for d in snap["dirs"] if d}
    out = []
    for k in keys:
        if k.endswith("/"):
            if k[:-1] not in exp_dirs:
                out.append(f"bucket holds a marker {k!r} for a directory the model does not have")
        elif k not in exp_files:
            out.append(f"bucket holds {k!r}, which the model does not have")
        else:
            data = seedmod.get(store, bucket, k)
            size, digest = exp_files[k]
            if md5(data) != digest:
                out.append(f"bucket object {k!r}: {len(data)} bytes md5 {md5(data)[:8]}, expected {size} md5 {digest[:8]}")
    for k in sorted(set(exp_files) - set(keys)):
        out.append(f"bucket lacks {k!r} ({exp_files[k][0]} bytes)")
    for d in sorted(exp_dirs):
        if d + "/" not in keys and not any(k.startswith(d + "/") for k in keys):
            out.append(f"bucket lacks directory {d!r} (no marker, no key below it)")
    return out


def compare_mount(root: str, snap: dict) -> list[str]:
    """A mounted tree against a worker's final model (names, types, sizes, contents)."""
    files, dirs, out = {}, set(), []
    for dp, dns, fns in os.walk(root, onerror=lambda e: out.append(f"walk: {e}")):
        rel = os.path.relpath(dp, root)
        rel = "" if rel == "." else rel
        dirs.update(join(rel, n) for n in dns)
        for n in fns:
            with open(os.path.join(dp, n), "rb") as f:
                b = f.read()
            files[join(rel, n)] = [len(b), md5(b)]
    exp_dirs = set(snap["dirs"]) - {""}
    for p in sorted(set(files) | set(snap["files"])):
        if files.get(p) != snap["files"].get(p):
            out.append(f"{p!r}: seen {files.get(p)}, expected {snap['files'].get(p)} ([size, md5])")
    for d in sorted(dirs ^ exp_dirs):
        out.append(f"directory {d!r}: {'unexpected' if d in dirs else 'missing'}")
    return out


def run(cfg: Config) -> Report:
    """Bucket, mount, workers + listers, final checks, unmount, bucket and remount checks,
    shrinking. Returns a Report (`.ok`, `.text()`)."""
    import conftest
    rep = Report(cfg)
    ctx = multiprocessing.get_context("fork")
    try:
        bucket = conftest.Bucket(cfg.store) if cfg.store != "mem" else None
    except Exception as e:  # the store's server is down
        rep.problem(f"cannot create a bucket on {cfg.store}: {e!r}")
        return rep
    args = (bucket.args() if bucket else ["mem://"]) + cfg.mount_args
    n_ops = len(cfg.replay) if cfg.replay is not None else cfg.ops
    rep.say(f"fsmodel: store {cfg.store}, seed {cfg.seed}, {n_ops} ops, {cfg.workers if cfg.replay is None else 1} "
            f"workers, {cfg.listers} listers, mount args {' '.join(args)}")
    rep.say(f"  reproduce: {cfg.command()}  (BUCKETFS_MODEL_SEED={cfg.seed})")
    failed = []
    try:
        mp = conftest.mount(args)
        try:
            listers = Listers(ctx, mp, cfg.listers, cfg.store)
            t0 = time.monotonic()
            specs = worker_specs(cfg, mp)
            results = run_workers(ctx, specs, cfg.hang_secs, cfg.progress_every)
            rep.elapsed = time.monotonic() - t0
            lres = listers.stop()
        finally:
            up = conftest.unmount(mp)
        rep.ops = sum(r["ops_done"] for r in results)
        rep.say(f"  {rep.ops} ops in {rep.elapsed:.1f} s: {rep.ops / max(rep.elapsed, 1e-9):.0f} ops/s; listers walked "
                f"{sum(x['walks'] for x in lres)} times ({sum(x['entries'] for x in lres)} entries)")
        notes = {}
        for r in results + lres:
            for k, v in r["notes"].items():
                notes[k] = notes.get(k, 0) + v
        for k, v in sorted(notes.items()):
            rep.say(f"  accepted: {k} ({v}x)")
        timing = {}
        for r in results:
            for k, (c, t) in r["timing"].items():
                timing[k] = [timing.get(k, [0, 0])[0] + c, timing.get(k, [0, 0])[1] + t]
        rep.say("  time per op: " + ", ".join(f"{k} {c}x {1000 * t / c:.1f} ms" for k, (c, t) in
                                               sorted(timing.items(), key=lambda kv: -kv[1][1])))
        for r in results:
            if r["failure"]:
                failed.append(r)
                n = len(r["ops"]) if r.get("ops") else r["ops_done"]
                rep.problem(describe_failure(r, n if cfg.replay is not None else specs[r["wid"]].get("nops", n)))
        for a in sorted({a for x in lres for a in x["anomalies"]}):
            rep.problem(f"lister: {a}")
        if up is not None and up.returncode != 0:
            rep.problem(f"bucketfs unmount exited {up.returncode}: {up.stderr.decode(errors='replace').strip()[-800:]}")
        good = [r for r in results if not r["failure"]]
        if bucket and cfg.store != "gdrive":
            for r in good:
                for line in compare_bucket(cfg.store, bucket.name, f"w{r['wid']}", r["snapshot"]):
                    rep.problem(f"after unmount, w{r['wid']}: {line}")
        if bucket:
            with conftest.mounted(args) as mp2:
                for r in good:
                    for line in compare_mount(os.path.join(mp2, f"w{r['wid']}"), r["snapshot"]):
                        rep.problem(f"after remount, w{r['wid']}: {line}")
        if failed and cfg.shrink_secs > 0:
            shrink_all(cfg, ctx, args, failed, rep)
    except BaseException as e:  # pytest.fail from a failed mount, Ctrl-C
        if type(e).__name__ in ("Failed", "KeyboardInterrupt"):
            rep.problem(f"run aborted: {e}")
            if isinstance(e, KeyboardInterrupt):
                raise
        else:
            raise
    finally:
        if bucket:
            bucket.cleanup()
    rep.say(f"fsmodel: {'OK' if rep.ok else f'{len(rep.problems)} divergence(s)'} (store {cfg.store}, seed {cfg.seed})")
    return rep


# =============================================================================== shrinking

def shrink_all(cfg: Config, ctx, args, failed: list[dict], rep: Report) -> None:
    """Shrink one failing sequence per distinct kind of divergence, sharing the time bound."""
    import conftest
    todo, seen = [], set()
    for r in failed:
        sig = r["failure"]["sig"]
        if sig in ("crash", "hang") or sig in seen or not r.get("ops"):
            continue
        seen.add(sig)
        todo.append(r)
    if not todo:
        return
    deadline = time.monotonic() + cfg.shrink_secs
    with conftest.mounted(args) as mp:
        listers = Listers(ctx, mp, cfg.listers, cfg.store)
        try:
            for k, r in enumerate(todo):
                budget = (deadline - time.monotonic()) / (len(todo) - k)
                Shrinker(cfg, ctx, mp, listers, r, rep).run(time.monotonic() + budget)
        finally:
            listers.stop()


def same_kind(sig: str, orig: str) -> bool:
    """A trial fails "the same way": an errno divergence of the same op and errnos, or a
    state divergence (data, size, listing...) of the same kind, seen by any op."""
    kind, _, op = orig.rpartition(" in ")
    return sig == orig or (not kind.startswith("errno") and sig.rpartition(" in ")[0] == kind)


class Shrinker:
    trial_no = 0

    def __init__(self, cfg, ctx, mp, listers, r, rep):
        self.cfg, self.ctx, self.mp, self.listers, self.rep = cfg, ctx, mp, listers, rep
        f = r["failure"]
        self.sig, self.wid = f["sig"], r["wid"]
        self.ops = r["ops"][:f["index"] + 1] if f["op"] != ("final",) else list(r["ops"])
        self.trials, self.tries = 0, 1
        self.last, self.skipped = None, set()

    def fails(self, ops, tries=None):
        """Run `ops` on a fresh directory; the index of the failing op if it fails the same
        way (within `tries` runs), else None."""
        for _ in range(tries or self.tries):
            Shrinker.trial_no += 1
            self.trials += 1
            name = f"s{Shrinker.trial_no}"
            self.listers.set_target(name)
            spec = {"wid": 0, "root": os.path.join(self.mp, name), "seed": 0, "ops": ops,
                    "sleep_secs": self.cfg.sleep_secs}
            r = run_workers(self.ctx, [spec], self.cfg.hang_secs)[0]
            f = r["failure"]
            if f and same_kind(f["sig"], self.sig):
                self.last = f
                self.skipped = set(r.get("skipped_idx", ()))
                return min(f["index"], len(ops) - 1)
        return None

    def cut(self, ops, j):
        """A failing candidate cut after its failing op `j`, without the ops it skipped
        (an op on an empty slot does nothing: dropping it changes nothing)."""
        return [op for k, op in enumerate(ops[:j + 1]) if k not in self.skipped]

    def run(self, deadline):
        rep = self.rep
        t0 = time.monotonic()
        rep.say(f"shrinking w{self.wid}'s {len(self.ops)} ops ({self.sig}) on fresh directories, "
                f"within {deadline - t0:.0f} s ...")
        # 1. the cheapest candidates first: the ops that touch the failing op's handles and
        #    paths (a backward slice) without and with the sleeps between them, all the ops
        #    without sleeps, then all of them (three times, for a timing-dependent failure)
        ops = self.ops
        cands = []
        if ops[-1][0] != "final":
            cands += [("a slice", backward_slice(ops, sleeps=False)), ("a slice", backward_slice(ops, sleeps=True))]
        if any(op[0] == "sleep" for op in ops):
            cands.append(("no sleeps", [op for op in ops if op[0] != "sleep"]))
        cands.append(("all", ops))
        found, seen = None, set()
        for what, cand in cands:
            if len(cand) in seen or (time.monotonic() > deadline and what != "all"):
                continue
            seen.add(len(cand))
            j = self.fails(cand, tries=1)
            if j is not None:
                found = (what, self.cut(cand, j))
                break
        if found is None:  # flaky: 2 more tries, and 3 tries per candidate from now on
            self.tries = 3
            j = self.fails(ops, tries=2)
            if j is not None:
                found = ("all", self.cut(ops, j))
        if found is None:
            rep.say("  did not fail again in 3 runs on a fresh directory (timing-dependent); not shrunk")
            return
        what, ops = found
        rep.say(f"  fails again{' (not every time)' if self.tries > 1 else ''}: {len(ops)} ops ({what})")
        # 2. the shortest failing prefix (binary search; the failing op's index cuts it at once).
        #    Only a state divergence can show earlier (in a trial's final check), not an errno.
        lo, hi = (0, len(ops)) if not self.sig.startswith("errno") else (len(ops) - 1, len(ops))
        while hi - lo > 1 and time.monotonic() < deadline:
            mid = (lo + hi) // 2
            j = self.fails(ops[:mid])
            if j is None:
                lo = mid
            else:
                ops = self.cut(ops[:mid], j)
                lo, hi = min(lo, len(ops) - 1), len(ops)
        ops = ops[:hi]
        rep.say(f"  shortest failing prefix: {len(ops)} ops ({time.monotonic() - t0:.0f} s)")
        # 3. remove chunks, then single ops, while it still fails
        chunk = max(1, len(ops) // 4)
        while time.monotonic() < deadline:
            changed, k = False, len(ops) - chunk
            while k >= 0 and time.monotonic() < deadline:
                cand = ops[:k] + ops[k + chunk:]
                j = self.fails(cand) if cand else None
                if j is not None:
                    ops, changed = self.cut(cand, j), True
                    k = min(k, len(ops)) - chunk
                else:
                    k -= chunk
            if chunk == 1 and not changed:
                break
            chunk = max(1, chunk // 2)
        done = "" if time.monotonic() < deadline else " (time bound reached: may not be minimal)"
        rep.say(f"  shortest sequence found: {len(ops)} ops after {self.trials} trials, "
                f"{time.monotonic() - t0:.0f} s{done}; it fails with:")
        rep.say(f"    {self.last['msg'] if self.last else '?'}")
        shown = ops if len(ops) <= 60 else ops[-40:]
        if len(shown) < len(ops):
            rep.say(f"    # ... {len(ops) - len(shown)} earlier ops: see the replay file")
        for op in shown:
            rep.say(f"    {fmt_op(op)}")
        path = os.path.join(tempfile.gettempdir(), f"fsmodel-{self.cfg.store}-{self.cfg.seed}-w{self.wid}.json")
        with open(path, "w") as f:
            json.dump(ops, f)
        extra = (" -- " + " ".join(self.cfg.mount_args)) if self.cfg.mount_args else ""
        rep.say(f"  replay: python3 tests/fsmodel.py --store {self.cfg.store} --listers {self.cfg.listers} "
                f"--replay {path}{extra}")


OBSERVERS = {"read", "fstat", "stat", "listdir", "scandir", "cat", "fsync"}
SLOT_OPS = {"open", "close", "write", "read", "fstat", "ftruncate", "fsync"}


def op_refs(op):
    """(slots, paths) an op names."""
    if op[0] in SLOT_OPS:
        return {op[1]}, ({op[2]} if op[0] == "open" else set())
    if op[0] == "rename":
        return set(), {op[1], op[2]}
    if op[0] == "sleep":
        return set(), set()
    return set(), {op[1]}


def is_above(q: str, p: str) -> bool:
    """q is p or a directory above it."""
    return q == p or q == "" or p.startswith(q + "/")


def handle_ids(ops) -> list:
    """For each op on a slot, the index of the `open` that made the handle it uses (opens
    on a busy slot are skipped, as the executor does; an open that fails is taken to
    succeed: this only guides the slice)."""
    cur, out = {}, []
    for i, op in enumerate(ops):
        h = None
        if op[0] == "open":
            if op[1] not in cur:
                cur[op[1]] = i
            h = cur[op[1]]
        elif op[0] in SLOT_OPS:
            h = cur.get(op[1])
            if op[0] == "close":
                cur.pop(op[1], None)
        out.append(h)
    return out


def backward_slice(ops, sleeps: bool):
    """The last op and, going back, every op using a handle, or naming a path or a directory
    above it, that a kept op changing something uses or names (for a failing listing: also
    the paths below the listed directory); repeated until nothing is added (a handle's path
    is learnt only at its open, earlier in the walk than the renames after it). Observers
    (reads, stats, listings) are kept when related but add nothing to follow: they change
    no state of the model (they may change the mount's caches, which is why they are kept).
    Every close is kept, so handles live as long as they did; sleeps only if `sleeps`."""
    hid = handle_ids(ops)
    last = ops[-1]
    below = op_refs(last)[1] if last[0] in ("listdir", "scandir") else set()
    handles, paths = {hid[-1]} - {None}, op_refs(last)[1]

    def wanted(i, p):
        return ((hid[i] is not None and hid[i] in found_h)
                or any(is_above(q, x) for q in p for x in found_p)
                or any(is_above(x, q) for q in p for x in below))

    while True:
        found_h, found_p = set(handles), set(paths)
        keep = [len(ops) - 1]
        for i in range(len(ops) - 2, -1, -1):
            op = ops[i]
            if op[0] in ("sleep", "close"):
                if sleeps or op[0] == "close":
                    keep.append(i)
                continue
            p = op_refs(op)[1]
            if wanted(i, p):
                keep.append(i)
                if op[0] not in OBSERVERS:
                    if hid[i] is not None:
                        found_h.add(hid[i])
                    found_p |= p
        if found_h == handles and found_p == paths:
            break
        handles, paths = found_h, found_p
    first = min(i for i in keep if ops[i][0] not in ("sleep", "close"))
    return [ops[i] for i in sorted(keep) if i >= first]


# =============================================================================== main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="s3", choices=["s3", "gcs", "file", "gdrive", "mem"])
    ap.add_argument("--ops", type=int, default=10000, help="ops in total, split over the workers")
    ap.add_argument("--seed", type=int, default=None, help="default: $BUCKETFS_MODEL_SEED or random")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--listers", type=int, default=2)
    ap.add_argument("--shrink-secs", type=float, default=180, help="time bound of shrinking (0: off)")
    ap.add_argument("--hang-secs", type=float, default=180, help="an op not returning this long is a hang")
    ap.add_argument("--replay", help="a JSON op list (printed by a shrink) to run as one worker")
    ap.add_argument("--exclude", default="", help="op kinds not to generate, comma-separated "
                    "(generator names: scandir,listdir,sleep,rename_dir,...; ws_names: no names with "
                    "whitespace at an end), to look past a known bug")
    ap.add_argument("mount_args", nargs="*", help="extra `bucketfs mount` flags, after --")
    a = ap.parse_args(argv)
    replay = None
    if a.replay:
        with open(a.replay) as f:
            replay = [tuple(op) for op in json.load(f)]
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.join(os.path.dirname(here), "scripts")]
    import conftest
    cfg = Config(store=a.store, ops=a.ops, seed=a.seed, workers=a.workers, listers=a.listers,
                 mount_args=a.mount_args, shrink_secs=a.shrink_secs, hang_secs=a.hang_secs,
                 replay=replay, progress_every=10, exclude=[x for x in a.exclude.split(",") if x])
    try:
        rep = run(cfg)
    finally:
        for m in list(conftest._live_mounts):
            conftest.unmount(m)
        import shutil
        shutil.rmtree(conftest.CACHE_HOME, ignore_errors=True)
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
