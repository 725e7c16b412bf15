"""Request economy through the kernel: store requests counted by the mount's own metrics
(issue "One request per file"; bench/request_count.py measures a whole developer's day).

- new small files cost one request each (the upload), also in a directory never listed;
- a `stat` of every file of a directory past the TTL is one listing, not a HEAD per file;
- a name that does not exist is asked about once per TTL (the kernel caches the answer).
"""

from __future__ import annotations

import os
import re
import time
import urllib.request

import pytest

from conftest import Bucket, free_port, require_bin, require_store

TTL = 1.0


@pytest.fixture
def metered(request):
    """A mount on a fresh bucket with its request counter; its TTL is TTL unless the test
    gives another (`indirect` parametrize): one that does not wait for the TTL takes a long
    one, so a slow, busy machine passing the TTL mid-test changes no count."""
    require_store("s3")
    require_bin()
    ttl = getattr(request, "param", TTL)
    b = Bucket("s3")
    port = free_port()
    try:
        with b.mounted(extra=["--metadata-ttl", str(ttl), "--metrics-addr", f"127.0.0.1:{port}"]) as mp:
            def requests() -> dict[str, int]:
                txt = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
                return {m.group(1): int(float(m.group(2))) for m in
                        re.finditer(r'^bucketfs_store_requests_total\{op="([a-z_]+)"\} (\S+)', txt, re.M)}
            yield b, mp, requests
    finally:
        b.cleanup()


def _delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def _write_new_files(d: str, names: list[str], data: bytes) -> None:
    """Write each file new, as `cp` does: a lookup that finds nothing, then the file."""
    for n in names:
        p = os.path.join(d, n)
        assert not os.path.exists(p)
        with open(p, "wb") as f:
            f.write(data)


@pytest.mark.parametrize("metered", [60.0], indirect=True)
def test_new_small_files_cost_one_request_each(metered):
    _, mp, requests = metered
    os.mkdir(os.path.join(mp, "d"))
    before = requests()
    _write_new_files(os.path.join(mp, "d"), [f"f{i}.o" for i in range(40)], b"x" * 4107)
    d = _delta(before, requests())
    assert sum(d.values()) <= 44, d  # 40 PUTs, and a LIST should the TTL pass mid-way
    assert d.get("put") == 40, d


@pytest.mark.parametrize("metered", [60.0], indirect=True)
def test_files_copied_into_a_directory_never_listed_cost_their_uploads(metered):
    """A directory of the bucket the mount has not read: the second name found absent lists
    it, and that listing answers every later lookup (no probe per new file)."""
    b, mp, requests = metered
    b.put_all({f"dst/old{i}.bin": b"o" for i in range(30)})
    before = requests()
    _write_new_files(os.path.join(mp, "dst"), [f"new{i}.bin" for i in range(40)], b"n" * 4107)
    d = _delta(before, requests())
    assert d.get("put") == 40, d
    # 'dst' by a prefix LIST, a probe, the listing; one more should the TTL pass mid-way.
    assert sum(d.values()) <= 44, d
    assert len(os.listdir(os.path.join(mp, "dst"))) == 70


def test_stat_of_a_directory_past_the_ttl_is_one_listing(metered):
    b, mp, requests = metered
    b.put_all({f"src/f{i}.c": b"int x;" * (i + 1) for i in range(60)})
    names = sorted(os.listdir(os.path.join(mp, "src")))
    assert len(names) == 60
    time.sleep(TTL + 0.3)
    before = requests()
    sizes = [os.lstat(os.path.join(mp, "src", n)).st_size for n in names]
    d = _delta(before, requests())
    assert sorted(sizes) == sorted(6 * (i + 1) for i in range(60))
    assert d.get("head", 0) == 0 and sum(d.values()) <= 3, d  # 'src' by a prefix LIST, then src listed


def test_a_missing_name_is_asked_about_once_per_ttl(metered):
    b, mp, requests = metered
    b.put("inc/a.h", b"a")
    assert os.listdir(os.path.join(mp, "inc")) == ["a.h"]
    time.sleep(TTL + 0.3)
    before = requests()
    for _ in range(50):
        assert not os.path.exists(os.path.join(mp, "inc", "missing.h"))
    d = _delta(before, requests())
    # The parent's entry (one LIST of the prefix 'inc'), then 'inc' listed again (its own
    # listing and a page of the recursive one): then 50 lookups cost nothing more.
    assert sum(d.values()) <= 3 and d.get("head", 0) == 0, d
    # Another client's new file shows up once the TTL has passed.
    b.put("inc/missing.h", b"now here")
    time.sleep(TTL + 0.3)
    assert os.path.exists(os.path.join(mp, "inc", "missing.h"))


@pytest.mark.parametrize("metered", [60.0], indirect=True)
def test_a_link_read_again_costs_no_request(metered):
    """Every path walk through a link asks readlink: a link made here (and one read once)
    is answered again from what the mount knows, within the TTL."""
    b, mp, requests = metered
    b.put("lib/real.so", b"\x7fELF")
    os.symlink("real.so", os.path.join(mp, "lib", "made.so"))
    assert os.listdir(os.path.join(mp, "lib")) == sorted(["made.so", "real.so"])
    before = requests()
    for _ in range(20):
        assert os.readlink(os.path.join(mp, "lib", "made.so")) == "real.so"
        with open(os.path.join(mp, "lib", "made.so"), "rb") as f:
            assert f.read() == b"\x7fELF"
    d = _delta(before, requests())
    # The first read of real.so's bytes; the link, made here, costs nothing (the kernel keeps
    # a target it read once; before, the first readlink asked the store with a HEAD and a GET).
    assert sum(d.values()) <= 1 and d.get("head", 0) == 0, d
