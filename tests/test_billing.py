"""Requester-pays S3 buckets (`--requester-pays`) and the GCS billing project
(`--billing-project`), issue 24: every request the mount and `cp` send carries
`x-amz-request-payer: requester` / `x-goog-user-project` (and the JSON API's `userProject`),
seen by a recording proxy in front of MinIO and the GCS emulator; the flags work as `-o`
options and in fstab lines; each is refused on the other store."""

from __future__ import annotations

import os
from urllib.parse import parse_qs, urlsplit

import pytest

import seed
from conftest import Bucket, is_mounted, mounted, new_mountpoint, require_bin, require_store, run_cli
from proxykit import HttpProxy
import test_ops

mount_helper = test_ops.mount_helper  # the fixture installing /sbin/mount.fuse.bucketfs


def exercise(mp: str):
    """Write, list and read back through a mount."""
    with open(os.path.join(mp, "w.txt"), "w") as f:
        f.write("written")
    assert "w.txt" in os.listdir(mp)
    with open(os.path.join(mp, "seeded.txt")) as f:
        assert f.read() == "seeded"


def test_s3_requester_pays_on_mount_cp_and_dash_o(tmp_path):
    """Every request of `cp --requester-pays` and of a mount with `-o requester_pays` carries
    the header (signed: MinIO checks the signature); a plain `cp` sends none."""
    require_store("s3")
    require_bin()
    b = Bucket("s3")
    b.put("seeded.txt", b"seeded")
    proxy = HttpProxy(seed.S3_ENDPOINT)
    src = tmp_path / "f.txt"
    src.write_text("x" * 1000)
    try:
        p = run_cli(["cp", str(src), f"s3://{b.name}/cp.txt", "--endpoint", proxy.url, "--requester-pays"])
        assert p.returncode == 0, p.err
        p = run_cli(["cp", f"s3://{b.name}/seeded.txt", str(tmp_path / "down.txt"), "--endpoint", proxy.url,
                     "--requester-pays"])
        assert p.returncode == 0, p.err
        assert (tmp_path / "down.txt").read_bytes() == b"seeded"
        with mounted([f"s3://{b.name}", "--endpoint", proxy.url, "-o", "requester_pays,disk_cache_mib=0"]) as mp:
            exercise(mp)
        sent = proxy.take()
        assert len(sent) >= 6, sent
        missing = [(m, path) for m, path, h in sent if h.get("x-amz-request-payer") != "requester"]
        assert not missing, missing
        assert all("x-amz-request-payer" in h.get("authorization", "") for _, _, h in sent), "not signed"
        assert seed.get("s3", b.name, "cp.txt") == src.read_bytes()
        assert seed.get("s3", b.name, "w.txt") == b"written"

        p = run_cli(["cp", str(src), f"s3://{b.name}/plain.txt", "--endpoint", proxy.url])
        assert p.returncode == 0, p.err
        sent = proxy.take()
        assert sent and not any("x-amz-request-payer" in h for _, _, h in sent)
    finally:
        proxy.close()
        b.cleanup()


def test_gcs_billing_project_on_mount_and_cp(tmp_path):
    """`--billing-project` names the project on every storage request: the header, and
    `userProject` on JSON API requests; the GCS emulator serves them."""
    require_store("gcs")
    require_bin()
    b = Bucket("gcs")
    b.put("seeded.txt", b"seeded")
    proxy = HttpProxy(seed.GCS_ENDPOINT)
    src = tmp_path / "f.txt"
    src.write_text("y" * 1000)
    common = ["--endpoint", proxy.url, "--anonymous", "--billing-project", "bill-me-42"]
    try:
        p = run_cli(["cp", str(src), f"gs://{b.name}/cp.txt"] + common)
        assert p.returncode == 0, p.err
        with mounted([f"gs://{b.name}", "--disk-cache-mib", "0"] + common) as mp:
            exercise(mp)
        sent = proxy.take()
        assert len(sent) >= 4, sent
        for method, path, h in sent:
            assert h.get("x-goog-user-project") == "bill-me-42", (method, path)
            assert parse_qs(urlsplit(path).query).get("userProject") == ["bill-me-42"], (method, path)
        assert seed.get("gcs", b.name, "cp.txt") == src.read_bytes()
        assert seed.get("gcs", b.name, "w.txt") == b"written"
    finally:
        proxy.close()
        b.cleanup()


def test_billing_flags_are_refused_on_the_other_store(tmp_path):
    require_bin()
    src = tmp_path / "f.txt"
    src.write_text("x")
    p = run_cli(["cp", str(src), "gs://some-bucket/f.txt", "--requester-pays"])
    assert p.returncode != 0 and "--billing-project" in p.err, p.err
    p = run_cli(["cp", str(src), "s3://some-bucket/f.txt", "--billing-project", "p"])
    assert p.returncode != 0 and "--requester-pays" in p.err, p.err
    mp = new_mountpoint()
    p = run_cli(["mount", "mem://", mp, "-o", "billing_project=p"])
    assert p.returncode != 0 and "gs://" in p.err, p.err
    assert not is_mounted(mp)


@pytest.mark.usefixtures("mount_helper")
def test_fstab_line_with_requester_pays(tmp_path):
    """`requester_pays` and `endpoint=` in an fstab line, mounted with `mount -T FILE DIR`."""
    require_store("s3")
    b = Bucket("s3")
    b.put("seeded.txt", b"seeded")
    proxy = HttpProxy(seed.S3_ENDPOINT)
    mp = new_mountpoint()
    fstab = tmp_path / "fstab"
    fstab.write_text(f"s3://{b.name} {mp} fuse.bucketfs noauto,_netdev,requester_pays,endpoint={proxy.url},"
                     "disk_cache_mib=0 0 0\n")
    try:
        with test_ops.fstab_mounted(fstab, mp):
            exercise(mp)
        sent = proxy.take()
        assert sent and all(h.get("x-amz-request-payer") == "requester" for _, _, h in sent), sent
    finally:
        proxy.close()
        b.cleanup()
