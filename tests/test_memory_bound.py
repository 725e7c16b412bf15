"""Memory follows the directories in use: `--max-cached-entries` (issue 42).

Past the bound, the cached listings of directories not in use (none read or listed in the
last 2 s, inode_trim.rs's MIN_IDLE) are dropped with the names nothing else holds; the
next read lists them again. What a user sees must not change: every name, size and mode,
open handles, chmods made here. The store's request counter tells whether a listing was
dropped (with a long TTL, a kept one costs no request).
"""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from conftest import Bucket, require_bin, require_store, run_cli

MIN_IDLE = 2.0  # inode_trim.rs
DIRS, FILES = 12, 40


def status(mp: str) -> dict:
    return json.loads(run_cli(["status", "--json", mp]).out)


@pytest.fixture
def tree():
    require_store("s3")
    require_bin()
    b = Bucket("s3")
    data = {f"d{i:02}/f{j:02}": f"{i}-{j}".encode() * (j + 1) for i in range(DIRS) for j in range(FILES)}
    b.put_all(data)
    yield b, data
    b.cleanup()


def listed(mp: str, data: dict, d: str) -> None:
    names = sorted(os.listdir(os.path.join(mp, d)))
    assert names == sorted(k.split("/")[1] for k in data if k.startswith(d + "/")), d
    for n in names[:3]:
        assert os.stat(os.path.join(mp, d, n)).st_size == len(data[f"{d}/{n}"])


def walk_half_then_the_rest(mp: str, data: dict) -> None:
    """List the first half of the directories, wait until they are idle, list the rest."""
    for i in range(DIRS // 2):
        listed(mp, data, f"d{i:02}")
    time.sleep(MIN_IDLE + 0.5)
    for i in range(DIRS // 2, DIRS):
        listed(mp, data, f"d{i:02}")


@pytest.mark.parametrize("bound", [200, 0])
def test_idle_listings_past_the_bound_are_dropped_and_listed_again(tree, bound):
    b, data = tree
    extra = ["--max-cached-entries", str(bound), "--metadata-ttl", "600", "--list-ahead-keys", "0"]
    with b.mounted(extra=extra) as mp:
        os.chmod(os.path.join(mp, "d00/f00"), 0o600)
        held = open(os.path.join(mp, "d01/f01"), "rb")  # noqa: SIM115 - kept open across the trim
        try:
            walk_half_then_the_rest(mp, data)
            s = status(mp)
            assert s["max_cached_entries"] == bound
            before = s["requests"]
            listed(mp, data, "d00")  # the oldest listing
            relisted = status(mp)["requests"] - before
            if bound:
                assert relisted >= 1, "d00's listing was kept past the bound"
                assert s["cached_entries"] < 2 * DIRS * FILES, s["cached_entries"]  # nodes + listings
            else:
                assert relisted == 0, "without a bound a listing within its TTL was asked again"
                assert s["cached_entries"] >= 2 * DIRS * FILES, s["cached_entries"]
            # What the mount held stays: a chmod made here, and an open handle's file.
            assert stat.S_IMODE(os.stat(os.path.join(mp, "d00/f00")).st_mode) == 0o600
            assert held.read() == data["d01/f01"]
        finally:
            held.close()
        # Every name is still there, with its bytes.
        for i in range(DIRS):
            listed(mp, data, f"d{i:02}")
        with open(os.path.join(mp, "d05/f39"), "rb") as f:
            assert f.read() == data["d05/f39"]


def test_a_walk_past_the_bound_sees_every_name_once(tree):
    """A bound far below the tree, a walk that takes longer than MIN_IDLE: listings are
    dropped under it while it runs, and it still sees each name exactly once."""
    b, data = tree
    extra = ["--max-cached-entries", "50", "--metadata-ttl", "600", "--list-ahead-keys", "0"]
    with b.mounted(extra=extra) as mp:
        seen = []
        for i in range(DIRS):
            d = f"d{i:02}"
            with os.scandir(os.path.join(mp, d)) as it:
                for e in it:
                    seen.append(f"{d}/{e.name}")
                    if e.name == "f20":
                        time.sleep(MIN_IDLE / 4)  # a slow reader, mid-directory
        assert sorted(seen) == sorted(data)
