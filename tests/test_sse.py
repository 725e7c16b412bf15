"""Server-side encryption (`--sse AES256`, `--sse aws:kms`, `--sse-kms-key-id`), issue 24:
objects written by a mount and by `bucketfs cp`, in one request and multipart, are what
boto3's head_object reports as encrypted (SSE-S3 or SSE-KMS with the key), and read back
intact through a fresh mount, `cp` and boto3. MinIO runs with a static KMS key
(scripts/test-env.sh: MINIO_KMS_SECRET_KEY, key ID bucketfs-test-key)."""

from __future__ import annotations

import os

import pytest

import seed
from conftest import Bucket, require_bin, require_store, run_cli

KEY = "bucketfs-test-key"
MIB = 1 << 20
SMALL = b"encrypted at rest\n" * 100
BIG = os.urandom(17 * MIB + 3)  # several slices for cp (8 MiB) and parts for the mount (5 MiB)


@pytest.fixture
def sse_bucket():
    require_store("s3")
    require_bin()
    c = seed.s3_client()
    try:
        c.put_object(Bucket="conformance", Key="kms-probe", Body=b"x", ServerSideEncryption="aws:kms",
                     SSEKMSKeyId=KEY)
        c.delete_object(Bucket="conformance", Key="kms-probe")
    except Exception as e:  # an older test-env.sh without the KMS key
        pytest.skip(f"MinIO has no KMS key {KEY} (restart it with scripts/test-env.sh): {e}")
    b = Bucket("s3")
    yield b
    b.cleanup()


def encryption(bucket: str, key: str) -> tuple[str | None, str | None]:
    h = seed.s3_client().head_object(Bucket=bucket, Key=key)
    return h.get("ServerSideEncryption"), h.get("SSEKMSKeyId")


def assert_sse(bucket: str, key: str, flags: list[str]):
    algo, key_id = encryption(bucket, key)
    if "AES256" in flags:
        assert algo == "AES256", (key, algo)
    else:
        assert algo == "aws:kms", (key, algo)
        assert key_id is not None and key_id.split(":")[-1].split("/")[-1] == KEY, (key, key_id)


CASES = {
    "sse-s3": ["--sse", "AES256"],
    "sse-kms-key": ["--sse-kms-key-id", KEY],
    "sse-kms-both": ["--sse", "aws:kms", "--sse-kms-key-id", KEY],
}


@pytest.mark.parametrize("flags", CASES.values(), ids=CASES.keys())
def test_cp_uploads_are_encrypted(sse_bucket, tmp_path, flags):
    b = sse_bucket
    ep = ["--endpoint", seed.S3_ENDPOINT]
    (tmp_path / "small.txt").write_bytes(SMALL)
    (tmp_path / "big.bin").write_bytes(BIG)
    for name in ("small.txt", "big.bin"):
        p = run_cli(["cp", str(tmp_path / name), f"s3://{b.name}/{name}", *flags, *ep], timeout=180)
        assert p.returncode == 0, p.err
        assert_sse(b.name, name, flags)
        assert seed.get("s3", b.name, name) == (tmp_path / name).read_bytes()
    # Downloads of encrypted objects (whose ETag is no MD5 under SSE-KMS) are verified and intact.
    p = run_cli(["cp", "-r", f"s3://{b.name}/", str(tmp_path / "down"), *ep], timeout=180)
    assert p.returncode == 0, p.err
    assert (tmp_path / "down" / "small.txt").read_bytes() == SMALL
    assert (tmp_path / "down" / "big.bin").read_bytes() == BIG
    p = run_cli(["cp", str(tmp_path / "small.txt"), f"s3://{b.name}/plain.txt", *ep])
    assert p.returncode == 0, p.err
    assert encryption(b.name, "plain.txt") == (None, None)


@pytest.mark.parametrize("flags", [CASES["sse-s3"], ["-o", f"sse_kms_key_id={KEY}"]], ids=["sse-s3", "-o-kms"])
def test_mount_writes_are_encrypted(sse_bucket, tmp_path, flags):
    b = sse_bucket
    with b.mounted(extra=["--disk-cache-mib", "0", *flags]) as mp:
        with open(os.path.join(mp, "small.txt"), "wb") as f:
            f.write(SMALL)
        with open(os.path.join(mp, "big.bin"), "wb") as f:
            f.write(BIG)
        os.makedirs(os.path.join(mp, "d"))
        with open(os.path.join(mp, "d", "later.txt"), "wb") as f:
            f.write(b"second")
    want = {"small.txt": SMALL, "big.bin": BIG, "d/later.txt": b"second"}
    for key, data in want.items():
        assert_sse(b.name, key, ["AES256"] if "AES256" in flags else ["aws:kms"])
        assert seed.get("s3", b.name, key) == data
    # A fresh mount (no flags needed to read) reads them back.
    with b.mounted(extra=["--disk-cache-mib", "0"]) as mp:
        for key, data in want.items():
            with open(os.path.join(mp, key), "rb") as f:
                assert f.read() == data, key
    p = run_cli(["cp", f"s3://{b.name}/big.bin", str(tmp_path / "big.bin"), "--endpoint", seed.S3_ENDPOINT],
                timeout=180)
    assert p.returncode == 0, p.err
    assert (tmp_path / "big.bin").read_bytes() == BIG
