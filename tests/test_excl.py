"""O_EXCL creates through the kernel: the first upload is create-only (docs/SEMANTICS.md,
"Exclusive create"), so another client that makes the object between our create and our
close is detected by the store: the close fails with EEXIST and their object is untouched.
"""

from __future__ import annotations

import errno
import os

import pytest

import seed
from conftest import Bucket, require_bin, require_store


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
