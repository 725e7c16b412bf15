"""Uploads cancelled mid-way leave nothing in the bucket (write-back mode, through the kernel).

A write-back upload is cancelled when its file is renamed, removed or opened for writing
while it is in flight (log: "upload cancelled"). SEMANTICS.md "What an upload sends": a GCS
append's temporary `.bucketfs-parts/` object is deleted, and an S3 multipart upload (a
delta upload of an appended file, or a large file's parts) is completed or aborted; after
`bucketfs sync` and a clean unmount nothing of the kind is left, cancelled or not.

Each test runs rounds that cancel an upload soon after it begins, at several delays: on a
fast or slow machine some rounds finish before the cancel, which is fine; the verdict is
only that the bucket holds no temporary storage at the end. A run in which no upload was
cancelled tested nothing and is skipped.
"""

from __future__ import annotations

import os
import time

import pytest

import conftest
import seed
from conftest import Bucket, mount, run_cli, unmount, write_file

MB = 1_000_000
# Delays between the change that starts an upload and the rename that cancels it.
GCS_DELAYS = [0, 0.01, 0.02, 0.03, 0.04, 0.05]
S3_DELAYS = [0, 0.02, 0.05, 0.1, 0.2, 0.3]
ROUNDS = int(os.environ.get("BUCKETFS_TEST_CANCEL_ROUNDS", "18"))


def write_back_mount(b: Bucket, tmp_path) -> tuple[str, str]:
    log = str(tmp_path / "mount.log")
    mp = mount(b.args() + ["--write-back", "--write-back-delay", "0", "--staging-dir", str(tmp_path / "staging"),
                           "--log-file", log])
    return mp, log


def sync(mp: str) -> None:
    r = run_cli(["sync", mp], timeout=120)
    assert r.returncode == 0, r.err


def cancelled(log: str) -> int:
    with open(log, errors="replace") as f:
        return f.read().count("upload cancelled")


def rounds(mp: str, log: str, delays, start, cancel) -> int:
    """`start(i)` begins an upload of round i; `cancel(i)` cancels it after a delay. Then
    sync and a clean unmount; returns how many uploads were cancelled."""
    try:
        for i in range(ROUNDS):
            start(i)
            time.sleep(delays[i % len(delays)])
            cancel(i)
        sync(mp)
    finally:
        p = unmount(mp)
    assert p is not None and p.returncode == 0, p and p.stderr
    n = cancelled(log)
    print(f"{n} of {ROUNDS} uploads cancelled")
    return n


def test_gcs_cancelled_appends_leave_no_temporary_objects(gcs_bucket, tmp_path):
    """An append to a file over 5 MiB goes up as a temporary tail object composed into the
    key; renaming the file while that runs cancels it: no tail is left after sync+unmount."""
    mp, log = write_back_mount(gcs_bucket, tmp_path)
    d = os.path.join(mp, "D")
    os.mkdir(d)

    def start(i):
        f = os.path.join(d, "f")
        write_file(f, os.urandom(6 * MB))
        sync(mp)
        with open(f, "ab") as h:
            h.write(b"APP")

    n = rounds(mp, log, GCS_DELAYS, start, lambda i: os.rename(os.path.join(d, "f"), os.path.join(d, "g")))
    left = seed.list_keys("gcs", gcs_bucket.name, prefix=".bucketfs-parts/")
    assert left == [], f"{len(left)} temporary objects left after {n} cancelled uploads: {left[:5]}"
    if n == 0:
        pytest.skip("no upload was cancelled: nothing tested")


def in_progress_uploads(b: Bucket) -> list[str]:
    r = seed.s3_client().list_multipart_uploads(Bucket=b.name)
    return [u["Key"] for u in r.get("Uploads", [])]


def abort_all(b: Bucket) -> None:
    """So the bucket can be deleted."""
    c = seed.s3_client()
    for u in c.list_multipart_uploads(Bucket=b.name).get("Uploads", []):
        c.abort_multipart_upload(Bucket=b.name, Key=u["Key"], UploadId=u["UploadId"])


@pytest.mark.parametrize("kind", ["append", "whole"])
def test_s3_cancelled_multipart_uploads_are_aborted(s3_bucket, tmp_path, kind):
    """A 20 MB file's upload is multipart: its delta upload after an append (UploadPartCopy),
    or its first upload in parts. Renaming the file while that runs cancels it: no multipart
    upload is left in progress after sync+unmount."""
    mp, log = write_back_mount(s3_bucket, tmp_path)
    f, g = os.path.join(mp, "f"), os.path.join(mp, "g")

    def start(i):
        if kind == "append":
            write_file(f, os.urandom(20 * MB))
            sync(mp)
            with open(f, "ab") as h:
                h.write(b"APP")
        else:
            write_file(f, os.urandom(20 * MB))

    try:
        n = rounds(mp, log, S3_DELAYS, start, lambda i: os.rename(f, g))
        left = in_progress_uploads(s3_bucket)
        assert left == [], f"{len(left)} multipart uploads left after {n} cancelled uploads: {left[:5]}"
    finally:
        abort_all(s3_bucket)
    if n == 0:
        pytest.skip("no upload was cancelled: nothing tested")
