"""O_EXCL creates through the kernel: the first upload is create-only (docs/SEMANTICS.md,
"Exclusive create"), so another client that makes the object between our create and our
close is detected by the store: the close fails with EEXIST and their object is untouched.
"""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest

import seed
from conftest import Bucket, require_bin, require_store, run_cli
from test_faults import fault_mount, fresh_bucket, proxy_for  # noqa: F401 (fixtures)


@pytest.mark.parametrize("store", ["s3", "gcs"])
def test_exclusive_create_never_replaces_an_object_made_meanwhile(store):
    require_store(store)
    require_bin()
    b = Bucket(store)
    try:
        with b.mounted() as mp:
            path = os.path.join(mp, "lock")
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            os.write(fd, b"ours")
            # Another client makes the object between the create and the close.
            seed.put(store, b.name, "lock", b"theirs")
            with pytest.raises(OSError) as e:
                os.close(fd)
            assert e.value.errno == errno.EEXIST, e.value
            assert seed.get(store, b.name, "lock") == b"theirs", "their object was replaced"
            # Nobody racing: an O_EXCL create goes up as always.
            fd = os.open(os.path.join(mp, "free"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            os.write(fd, b"x")
            os.close(fd)
            assert seed.get(store, b.name, "free") == b"x"
    finally:
        b.cleanup()


@pytest.mark.parametrize("mode", ["default", "write-back"])
def test_a_create_only_upload_whose_answer_was_lost_is_known_as_ours(mode, proxy_for, fresh_bucket):
    """The first upload of an O_EXCL file (`cp` to a new name) lands, but its answer never
    comes back; the retry is refused (the key exists). That object carries the file's own
    tag (metadata `bucketfs-create`), not another client's: the close succeeds, and the
    file's later versions go up. Before, the close failed with EEXIST, so did every later
    one, and the unmount put the newest closed version in lost+found."""
    require_store("s3")
    require_bin()
    b = fresh_bucket("s3")
    px = proxy_for("s3")
    extra = ["--write-back", "--write-back-delay", "0"] if mode == "write-back" else []
    with fault_mount("s3", b.name, px, extra=extra) as fm:
        os.listdir(fm.mp)
        lost = px.toxic("timeout", "downstream", timeout=0)  # answers held, never sent
        threading.Timer(4, px.remove, (lost,)).start()
        fd = os.open(fm.path("n.txt"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, b"v1-contents\n")
        os.close(fd)
        if mode == "write-back":
            time.sleep(5)  # the toxic is gone: the queued upload meets it or its refusal
            r = run_cli(["sync", fm.mp], timeout=120)
            assert r.returncode == 0, r.err
        assert seed.get("s3", b.name, "n.txt") == b"v1-contents\n"
        with open(fm.path("n.txt"), "wb") as f:
            f.write(b"v2-contents-longer\n")
        if mode == "write-back":
            r = run_cli(["sync", fm.mp], timeout=120)
            assert r.returncode == 0, r.err
        assert seed.get("s3", b.name, "n.txt") == b"v2-contents-longer\n", "a later version never went up"
