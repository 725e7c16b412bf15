"""The op generator: picks the next op from the model's state, mostly valid ops, some
meant to fail (`invalid`), with weights per kind; sizes and offsets favour the mount's
boundaries (2 MiB blocks, 8 MiB parts) and keep big files from growing without bound.
Seeded, so a seed gives the same sequence as long as the mount answers the same way.

Knobs (off by default, so a seed's sequence stays what it was): `big_files` writes more
files of a few MiB and reads closed ones of 1 MiB or more again (`reread`: what FUSE
passthrough serves, files whole in the disk cache); when there is none, and now and then,
it writes one whole, closes it and reads it back (`make_big`: ops queued in `plan`).
"""

from __future__ import annotations

import random

from .model import Model
from .ops import DIR_NAMES, FILE_NAMES, KiB, MiB, ODD_NAMES, SLOTS, join


class Gen:
    """Picks the next op from the model's state: mostly valid, sometimes meant to fail."""

    def __init__(self, rng: random.Random, sleep_secs: float, exclude=(), big_files=False):
        self.rng, self.sleep_secs, self.exclude = rng, sleep_secs, set(exclude)
        self.big_files = big_files
        self.reread_lately: list[str] = []  # paths `reread` picked lately, newest first
        self.plan: list[tuple] = []  # ops to give next, in order (`reread` making a big file)

    def name(self, pool):
        r = self.rng
        odd = ODD_NAMES if "ws_names" not in self.exclude else [n for n in ODD_NAMES if n == n.strip()]
        return r.choice(odd) if r.random() < 0.07 else r.choice(pool)

    def next(self, m: Model):
        if self.plan:
            return self.plan.pop(0)
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
        if self.big_files:
            choices.append((10, self.reread))
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
        if x < (0.15 if self.big_files else 0.06):  # an occasional big write: a file of a few MiB
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

    def reread(self):
        """Read a closed file of at least 1 MiB again (whole, or through a read-only handle).
        Half the time one read again lately: the first read of a version may go to the
        store, and its close makes the file the next open can pass through to."""
        busy = {id(h.inode) for h in self.m.handles.values()}
        big = [p for p in self.files if len(self.m.files[p].data) >= MiB and id(self.m.files[p]) not in busy]
        if not big or self.rng.random() < 0.25:
            return self.make_big()
        again = [p for p in self.reread_lately if p in big]
        p = self.rng.choice(again if again and self.rng.random() < 0.5 else big)
        self.reread_lately = ([p] + [q for q in self.reread_lately if q != p])[:3]
        s = self.free_slot()
        return ("cat", p) if s is None or self.rng.random() < 0.5 else ("open", s, p, "r")

    def make_big(self):
        """Write a file of 1-3 MiB whole, close it and read it back (as the next ops)."""
        s, r = self.free_slot(), self.rng
        if s is None:
            return None
        p = self.new_path(FILE_NAMES)
        self.plan = [("write", s, 0, r.randint(MiB, 3 * MiB), r.randrange(1 << 30)), ("close", s), ("cat", p)]
        return ("open", s, p, "w+ct")

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
