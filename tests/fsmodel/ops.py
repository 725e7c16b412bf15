"""Names, paths and ops of the model test: the constants the generator draws from, small
path and byte helpers, and ops themselves. An op is a tuple (name, *args): it pickles (to
the worker processes, into replay files) and prints as a Python-like call (`fmt_op`).
Handle ops name a *slot* (0..SLOTS-1), path ops a path relative to the worker's directory;
an open's mode is a string such as 'rw+act' (`parse_mode`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import re


KiB, MiB = 1024, 1024 * 1024
SLOTS = 8
FILE_NAMES = ["f0", "f1", "f2", "f3", "f4", "f5"]
DIR_NAMES = ["d0", "d1", "d2", "e0"]
# unicode and whitespace at the ends (bucketfs must keep them exactly or refuse with EINVAL);
# "dé" twice (NFC, NFD: two names, two objects), and characters that URL encodings (S3's
# "+" for a space, "%2F", "?", "#") or a path join (a backslash, a tab) could confuse
ODD_NAMES = ["a ", " b", " c ", "ü.txt", "日本語", "sp ace", "dé", "de\u0301", "sp+ace",
             "p%2Fq", "q?r#s", "x\\y", "t\tab"]
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
