"""`bucketfs cp --no-clobber` against real servers (MinIO, the GCS emulator): a destination
that already holds the same content is not copied and is named; one of another size or
another MD5 (same size) is copied over, both ways. Objects are read back with an
independent client (seed.py).
"""

from __future__ import annotations

import os

import test_cp
from test_cp import cp, summary, url
from conftest import seed

cp_bucket = test_cp.cp_bucket  # a fixture
tmp = test_cp.tmp  # a fixture

UNCHANGED = "unchanged-no-clobber"


def test_no_clobber_skips_only_identical_destinations(cp_bucket, tmp):
    same, edited, resized = os.urandom(100_000), os.urandom(100_000), os.urandom(5000)
    local = {"same.bin": same, "edited.bin": edited, "resized.bin": resized, "new.bin": b"new"}
    for name, data in local.items():
        (tmp / name).write_bytes(data)
    for name, data in [("same.bin", same), ("edited.bin", os.urandom(100_000)), ("resized.bin", b"short")]:
        seed.put(cp_bucket.store, cp_bucket.name, f"nc/{name}", data)

    up = cp(cp_bucket, "--no-clobber", *[str(tmp / n) for n in sorted(local)], url(cp_bucket, "nc/"))
    s = summary(up)
    assert s["verified"].get(UNCHANGED) == 1, s
    named = [line for line in up.err.splitlines() if "unchanged, not copied (--no-clobber)" in line]
    assert len(named) == 1 and "same.bin" in named[0], up.err
    assert "1 of 4 already at the destination" in up.err, up.err
    for name, data in local.items():
        assert seed.get(cp_bucket.store, cp_bucket.name, f"nc/{name}") == data, name

    # Downloads: the same rule against local files.
    down_dir = tmp / "down"
    down_dir.mkdir()
    (down_dir / "same.bin").write_bytes(same)
    (down_dir / "edited.bin").write_bytes(os.urandom(100_000))
    (down_dir / "resized.bin").write_bytes(b"x")
    down = cp(cp_bucket, "--no-clobber", *[url(cp_bucket, f"nc/{n}") for n in sorted(local)], str(down_dir) + "/")
    s = summary(down)
    assert s["verified"].get(UNCHANGED) == 1, s
    named = [line for line in down.err.splitlines() if "unchanged, not copied (--no-clobber)" in line]
    assert len(named) == 1 and "same.bin" in named[0], down.err
    for name, data in local.items():
        assert (down_dir / name).read_bytes() == data, name

    # Without the flag, the identical one is copied again.
    again = cp(cp_bucket, str(tmp / "same.bin"), url(cp_bucket, "nc/same.bin"))
    assert UNCHANGED not in summary(again)["verified"], summary(again)
