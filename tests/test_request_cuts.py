"""One request cut in the middle by the network, through the kernel, on the GCS emulator.

docs/SEMANTICS.md, tenet 4: every store request has a timeout and a bounded number of
retries. On GCS one cut connection failed the close with EIO (tester D): OpenDAL's retry
layer never sends a compose again, and it retried a create-only upload's resumable session
by asking its status, which fake-gcs-server answers by storing the bytes it holds (none: a
0-byte object under the name, then "writer got too much data"). bucketfs now sends those
requests again itself (crates/store/src/retry.rs). On S3 the same cuts were already retried.
"""

from __future__ import annotations

import os
import random

import seed
from conftest import md5, mount, unmount
from proxykit import CutProxy


def test_one_cut_request_of_an_upload_is_sent_again(gcs_bucket, tmp_path):
    """A new 3 MB file's upload cut 100 kB in, a new 20 MB file's compose cut 50 bytes in,
    an append's compose cut 50 bytes in: each close succeeds and the bucket holds exactly
    the file's bytes right after it."""
    rng = random.Random(12)
    port = int(seed.GCS_ENDPOINT.rsplit(":", 1)[1].rstrip("/"))
    with CutProxy(port) as px:
        args = [seed.mount_url("gcs", gcs_bucket.name), "--endpoint", px.url, "--anonymous",
                "--staging-dir", str(tmp_path / "st"), "--cache-dir", str(tmp_path / "ca")]
        mp = mount(args)
        try:
            base = rng.randbytes(6_000_000)
            with open(os.path.join(mp, "c.bin"), "wb") as f:
                f.write(base)
            cases = [("a.bin", "uploadType=resumable", 100_000, rng.randbytes(3_000_000), "wb"),
                     ("b.bin", "/compose", 50, rng.randbytes(20_000_000), "wb"),
                     ("c.bin", "/compose", 50, rng.randbytes(1_000_000), "ab")]
            for name, pattern, after, data, how in cases:
                px.arm(pattern, after)
                excl = os.O_EXCL if how == "wb" else 0  # a new file, as cp makes one: create-only
                with open(os.path.join(mp, name), how, opener=lambda p, fl: os.open(p, fl | excl)) as f:
                    f.write(data)
                want = base + data if how == "ab" else data
                assert px.cuts == 1, f"{name}: no request matched {pattern!r} (the test cut nothing)"
                got = seed.get("gcs", gcs_bucket.name, name)
                assert md5(got) == md5(want), f"{name}: the bucket holds {len(got)} bytes, not the file's {len(want)}"
        finally:
            unmount(mp)
