"""`bucketfs cp` against real servers (MinIO, the GCS emulator): round trips at the slice
boundaries, a 1 GB file, stdin and stdout streaming, `-r` trees, several sources.
Objects are checked with an independent client (boto3 / the GCS JSON API, via seed.py).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import Bucket, bucketfs_env, require_bin, require_store, run_cli, seed
from proxykit import HttpProxy

MIB = 1 << 20
SLICE = 8 * MIB  # the default slice for files up to 256 MiB (see docs/CP.md)
BIG_TIMEOUT = 600


@pytest.fixture(params=["s3", "gcs"])
def cp_bucket(request):
    require_store(request.param)
    require_bin()
    b = Bucket(request.param)
    yield b
    b.cleanup()


@pytest.fixture
def tmp(tmp_path):
    return tmp_path


def url(b: Bucket, key: str = "") -> str:
    base = seed.mount_url(b.store, b.name)
    return f"{base}/{key}" if key else base + "/"


def cp(b: Bucket, *args, timeout=120, expect_ok=True):
    p = run_cli(["cp", *args, *seed.mount_extra_args(b.store), "--json"], timeout=timeout)
    if expect_ok:
        assert p.returncode == 0, f"bucketfs cp {' '.join(args)} exited {p.returncode}: {p.err[-2000:]}"
    return p


def summary(p) -> dict:
    return json.loads(p.out.strip().splitlines()[-1])


def md5_file(path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MIB):
            h.update(chunk)
    return h.hexdigest()


@pytest.mark.parametrize("size", [0, 1, SLICE, SLICE + 1], ids=["0B", "1B", "one-slice", "slice+1"])
def test_round_trip_at_slice_boundaries(cp_bucket, tmp, size):
    data = os.urandom(size)
    src = tmp / "src.bin"
    src.write_bytes(data)
    up = cp(cp_bucket, str(src), url(cp_bucket, "d/obj.bin"))
    s = summary(up)
    assert s["bytes"] == size and s["files"] == 1
    assert sum(s["verified"].values()) == 1, s
    assert seed.get(cp_bucket.store, cp_bucket.name, "d/obj.bin") == data, "the independent client reads other bytes"
    out = tmp / "back.bin"
    down = cp(cp_bucket, url(cp_bucket, "d/obj.bin"), str(out))
    assert summary(down)["bytes"] == size
    assert out.read_bytes() == data
    # A single-request object carries its MD5 on both services: no re-read was needed.
    if size <= SLICE:
        assert "reread-crc32c" not in summary(down)["verified"], summary(down)


def test_s3_uploads_are_checked_by_the_server_crc32c(tmp):
    """S3 uploads carry each request's crc32c, which MinIO checks: the object keeps the
    checksum (the whole object's crc32c for one request, COMPOSITE over the parts for a
    multipart upload), and it is the crc32c bucketfs computed. --s3-md5 goes back to the ETag."""
    require_store("s3")
    require_bin()
    b = Bucket("s3")
    try:
        s3 = seed.s3_client()
        data = os.urandom(MIB + 7)
        src = tmp / "one.bin"
        src.write_bytes(data)
        s = summary(cp(b, str(src), url(b, "one.bin")))
        assert s["verified"] == {"s3-crc32c": 1}, s
        h = s3.head_object(Bucket=b.name, Key="one.bin", ChecksumMode="ENABLED")
        ours = base64.b64encode(bytes.fromhex(s["crc32c"])).decode()
        assert h.get("ChecksumCRC32C") == ours, (h.get("ChecksumCRC32C"), ours)

        big = tmp / "three.bin"
        big.write_bytes(os.urandom(2 * SLICE + 3))
        s = summary(cp(b, str(big), url(b, "three.bin")))
        assert s["verified"] == {"s3-crc32c": 1}, s
        h = s3.head_object(Bucket=b.name, Key="three.bin", ChecksumMode="ENABLED")
        assert h.get("ChecksumType") == "COMPOSITE" and h.get("ChecksumCRC32C", "").endswith("-3"), h

        s = summary(cp(b, str(big), url(b, "md5.bin"), "--s3-md5"))
        assert s["verified"] == {"s3-etag": 1}, s
        assert "ChecksumCRC32C" not in s3.head_object(Bucket=b.name, Key="md5.bin", ChecksumMode="ENABLED")
        assert seed.get("s3", b.name, "md5.bin") == big.read_bytes()
    finally:
        b.cleanup()


def test_s3_store_that_does_not_confirm_checksums_needs_s3_md5(tmp):
    """A store that accepts x-amz-checksum-crc32c without checking it (no echo in its answer)
    fails the upload with a message naming --s3-md5, leaving no object; with --s3-md5 the
    same upload is verified by the multipart ETag."""
    require_store("s3")
    require_bin()
    b = Bucket("s3")
    proxy = HttpProxy(seed.S3_ENDPOINT, drop=["x-amz-checksum-crc32c"])
    try:
        src = tmp / "f.bin"
        src.write_bytes(os.urandom(SLICE + 5))
        args = ["cp", str(src), f"s3://{b.name}/f.bin", "--endpoint", proxy.url, "--json"]
        p = run_cli(args, timeout=120)
        assert p.returncode != 0 and "--s3-md5" in p.err, (p.returncode, p.err[-1000:])
        assert seed.list_keys("s3", b.name) == [], "an unconfirmed upload left an object"
        assert seed.s3_client().list_multipart_uploads(Bucket=b.name).get("Uploads", []) == []
        p = run_cli(args + ["--s3-md5"], timeout=120)
        assert p.returncode == 0, p.err[-1000:]
        assert summary(p)["verified"] == {"s3-etag": 1}, p.out
        assert seed.get("s3", b.name, "f.bin") == src.read_bytes()
    finally:
        proxy.close()
        b.cleanup()


def test_s3_downloads_are_verified_by_the_object_crc(tmp):
    """Objects boto3 uploaded (with its default crc32 checksum: COMPOSITE for a multipart
    upload, FULL_OBJECT for one request) download verified by that crc32, not by MD5s; one
    bucketfs uploaded, by its crc32c. A part size the guess gets wrong (or --slice-size
    sets) is found among the part sizes of whole MiB, --s3-md5 checks the ETag, and a
    damaged answer is caught and fetched again."""
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config

    require_store("s3")
    require_bin()
    b = Bucket("s3")
    # boto3's defaults (seed's client turns checksums off): uploads carry a crc32.
    s3 = boto3.client("s3", endpoint_url=seed.S3_ENDPOINT, aws_access_key_id=seed.S3_ACCESS_KEY,
                      aws_secret_access_key=seed.S3_SECRET_KEY, region_name=seed.S3_REGION,
                      config=Config(s3={"addressing_style": "path"}))
    try:
        def upload(key, size, part):
            data = os.urandom(size)
            (tmp / key).write_bytes(data)
            cfg = TransferConfig(multipart_threshold=part, multipart_chunksize=part)
            s3.upload_file(str(tmp / key), b.name, key, Config=cfg)
            return data

        def down(key, *extra, endpoint=None):
            out = tmp / f"{key}.back"
            args = ["cp", url(b, key), str(out), "--json", *extra]
            args += ["--endpoint", endpoint] if endpoint else seed.mount_extra_args("s3")
            p = run_cli(args, timeout=120)
            assert p.returncode == 0, p.err[-2000:]
            return summary(p), out.read_bytes(), p.err

        multi = upload("multi.bin", 20 * MIB + 5, SLICE)
        h = s3.head_object(Bucket=b.name, Key="multi.bin", ChecksumMode="ENABLED")
        assert h.get("ChecksumType") == "COMPOSITE" and h.get("ChecksumCRC32", "").endswith("-3"), h
        s, got, _ = down("multi.bin")
        assert s["verified"] == {"s3-crc32": 1} and got == multi, s
        one = upload("one.bin", MIB + 3, SLICE)
        assert s3.head_object(Bucket=b.name, Key="one.bin", ChecksumMode="ENABLED").get("ChecksumType") == "FULL_OBJECT"
        s, got, _ = down("one.bin")
        assert s["verified"] == {"s3-crc32": 1} and got == one, s
        ours = tmp / "ours.bin"
        ours.write_bytes(os.urandom(2 * SLICE + 9))
        cp(b, str(ours), url(b, "ours.bin"))
        s, got, _ = down("ours.bin")
        assert s["verified"] == {"s3-crc32c": 1} and got == ours.read_bytes(), s

        # 6 MiB parts: 4 of them, guessed as 5 MiB (the usual size that gives 4): wrong, but
        # every part size of whole MiB is tried, and 6 MiB rebuilds the checksum.
        odd = upload("odd.bin", 20 * MIB, 6 * MIB)
        s, got, _ = down("odd.bin")
        assert s["verified"] == {"s3-crc32": 1} and got == odd, s
        # --slice-size 7M also cuts it in 3, but not in its parts: found the same way.
        s, got, _ = down("multi.bin", "--slice-size", "7M")
        assert s["verified"] == {"s3-crc32": 1} and got == multi, s
        s, got, _ = down("multi.bin", "--s3-md5")
        assert s["verified"] == {"s3-etag": 1} and got == multi, s

        # Parts of no whole MiB (5 MiB + 12,345 bytes, as a hand-made multipart upload
        # has): the HEAD of part 1 tells their size, in whatever slices the read is cut.
        part = 5 * MIB + 12345
        uneven = os.urandom(2 * part + 777)
        up = s3.create_multipart_upload(Bucket=b.name, Key="uneven.bin", ChecksumAlgorithm="CRC32")
        done = []
        for n, at in enumerate(range(0, len(uneven), part), 1):
            r = s3.upload_part(Bucket=b.name, Key="uneven.bin", UploadId=up["UploadId"], PartNumber=n,
                               Body=uneven[at:at + part], ChecksumAlgorithm="CRC32")
            done.append({"PartNumber": n, "ETag": r["ETag"], "ChecksumCRC32": r["ChecksumCRC32"]})
        s3.complete_multipart_upload(Bucket=b.name, Key="uneven.bin", UploadId=up["UploadId"],
                                     MultipartUpload={"Parts": done})
        h = s3.head_object(Bucket=b.name, Key="uneven.bin", ChecksumMode="ENABLED")
        assert h.get("ChecksumCRC32", "").endswith("-3"), h
        for extra in [(), ("--slice-size", "700K")]:
            s, got, err = down("uneven.bin", *extra)
            assert s["verified"] == {"s3-crc32": 1} and got == uneven, (extra, s, err[-2000:])

        # One damaged answer: against the whole object's crc32, and against a COMPOSITE one
        # (no part size of whole MiB rebuilds it), a mismatch is proof: downloaded again.
        for key, want, how in [("one.bin", one, "s3-crc32"), ("multi.bin", multi, "s3-crc32")]:
            proxy = HttpProxy(seed.S3_ENDPOINT, flip_gets=1)
            try:
                s, got, err = down(key, endpoint=proxy.url)
            finally:
                proxy.close()
            assert s["verified"] == {how: 1} and got == want, (s, err)
            assert "downloading again" in err, err
    finally:
        b.cleanup()


def test_a_consistently_corrupted_multipart_download_is_a_mismatch(tmp):
    """Every answer damaged the same way (a proxy flips a byte in each GET body): the
    re-read would agree with the first read, so only the object's COMPOSITE crc32c can
    catch it. No part size rebuilds it: exit 7, and no file, nor GCS object, is left."""
    require_store("s3")
    require_store("gcs")
    require_bin()
    b, g = Bucket("s3"), Bucket("gcs")
    try:
        src = tmp / "mp.bin"
        src.write_bytes(os.urandom(SLICE + 1))  # 2 parts
        cp(b, str(src), url(b, "mp.bin"))
        proxy = HttpProxy(seed.S3_ENDPOINT, flip_gets=10**9)
        try:
            out = tmp / "mp.back"
            p = run_cli(["cp", url(b, "mp.bin"), str(out), "--json", "--retries", "1", "--endpoint", proxy.url],
                        timeout=120)
            assert p.returncode == 7, (p.returncode, p.out, p.err[-2000:])
            assert "COMPOSITE crc32c" in p.err, p.err[-2000:]
            assert not out.exists() and list(tmp.glob("*mp.back*")) == [], list(tmp.iterdir())
            # Store to store (S3 to GCS): the source read is checked the same way.
            args = ["cp", url(b, "mp.bin"), url(g, "mp.bin"), "--json", "--retries", "1",
                    "--s3-endpoint", proxy.url, "--gcs-endpoint", seed.GCS_ENDPOINT, "--anonymous"]
            p = run_cli(args, timeout=120)
            assert p.returncode == 7, (p.returncode, p.out, p.err[-2000:])
            assert seed.list_keys("gcs", g.name) == [], "a wrong copy was left in GCS"
        finally:
            proxy.close()
        # Undamaged, the same download is verified by the checksum.
        s = summary(cp(b, url(b, "mp.bin"), str(tmp / "mp.ok")))
        assert s["verified"] == {"s3-crc32c": 1} and (tmp / "mp.ok").read_bytes() == src.read_bytes(), s
    finally:
        b.cleanup()
        g.cleanup()


def test_an_upload_the_server_refuses_as_corrupted_every_time_exits_7(tmp):
    """Every upload body damaged on the way (a proxy flips a byte in each PUT body): S3
    refuses it by its crc32c on every attempt, which is a checksum mismatch (exit 7), as
    for GCS, not a store error (1)."""
    require_store("s3")
    require_bin()
    b = Bucket("s3")
    proxy = HttpProxy(seed.S3_ENDPOINT, flip_puts=True)
    try:
        src = tmp / "up.bin"
        src.write_bytes(os.urandom(5 * MIB))
        p = run_cli(["cp", str(src), url(b, "up.bin"), "--retries", "1", "--endpoint", proxy.url], timeout=180)
        assert p.returncode == 7, (p.returncode, p.err[-2000:])
        assert "crc32c mismatch" in p.err, p.err[-2000:]
        assert seed.list_keys("s3", b.name) == []
    finally:
        proxy.close()
        b.cleanup()


def test_one_gigabyte_round_trip(cp_bucket, tmp):
    size = 1000 * 1000 * 1000
    src = tmp / "big.bin"
    subprocess.run(["head", "-c", str(size), "/dev/urandom"], stdout=open(src, "wb"), check=True)
    want = md5_file(src)
    t0 = time.monotonic()
    up = cp(cp_bucket, str(src), url(cp_bucket, "big.bin"), timeout=BIG_TIMEOUT)
    t_up = time.monotonic() - t0
    assert seed.head(cp_bucket.store, cp_bucket.name, "big.bin")["size"] == size
    out = tmp / "big.back"
    t0 = time.monotonic()
    down = cp(cp_bucket, url(cp_bucket, "big.bin"), str(out), timeout=BIG_TIMEOUT)
    t_down = time.monotonic() - t0
    assert os.path.getsize(out) == size
    assert md5_file(out) == want
    print(f"\n1 GB on {cp_bucket.store}: up {size / 1e6 / t_up:.0f} MB/s ({summary(up)['verified']}), "
          f"down {size / 1e6 / t_down:.0f} MB/s ({summary(down)['verified']})")
    # Nothing but the object (no temporary parts) is in the bucket afterwards.
    assert seed.list_keys(cp_bucket.store, cp_bucket.name) == ["big.bin"]


def test_stdin_streams_into_an_object(cp_bucket):
    data = os.urandom(20 * MIB + 3)  # several parts of unknown length
    cmd = [require_bin(), "cp", "-", url(cp_bucket, "from-stdin"), *seed.mount_extra_args(cp_bucket.store), "--json"]
    p = subprocess.run(cmd, input=data, capture_output=True, env=bucketfs_env(), timeout=120)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert json.loads(p.stdout)["bytes"] == len(data)
    assert seed.get(cp_bucket.store, cp_bucket.name, "from-stdin") == data
    # Empty stdin makes an empty object.
    p = subprocess.run(cmd[:3] + [url(cp_bucket, "empty")] + cmd[4:], input=b"", capture_output=True,
                       env=bucketfs_env(), timeout=60)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert seed.get(cp_bucket.store, cp_bucket.name, "empty") == b""


def test_stdout_gets_the_object_in_order(cp_bucket):
    data = os.urandom(3 * SLICE + 5)
    cp_bucket.put("a/obj", data)  # uploaded by the independent client
    p = run_cli(["cp", url(cp_bucket, "a/obj"), "-", *seed.mount_extra_args(cp_bucket.store), "--json"], timeout=120)
    assert p.returncode == 0, p.err[-2000:]
    assert p.stdout == data
    assert json.loads(p.err.strip().splitlines()[-1])["bytes"] == len(data), "the --json summary goes to stderr"


def test_recursive_tree_both_ways(cp_bucket, tmp):
    tree = {"top.txt": b"top", "d1/a.bin": os.urandom(1000), "d1/d2/b.bin": os.urandom(SLICE + 7),
            "d1/d2/empty": b"", "d3/c.txt": b"c" * 10}
    src = tmp / "tree"
    for rel, data in tree.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    p = cp(cp_bucket, "-r", str(src), url(cp_bucket, "up/"))
    assert summary(p)["files"] == len(tree)
    keys = seed.list_keys(cp_bucket.store, cp_bucket.name, "up/")
    assert sorted(keys) == sorted(f"up/tree/{k}" for k in tree)
    for rel, data in tree.items():
        assert seed.get(cp_bucket.store, cp_bucket.name, f"up/tree/{rel}") == data
    out = tmp / "out"
    cp(cp_bucket, "-r", url(cp_bucket, "up/tree"), str(out))
    got = {os.path.relpath(os.path.join(dp, f), out): open(os.path.join(dp, f), "rb").read()
           for dp, _, fs in os.walk(out) for f in fs}
    assert got == tree


def test_keys_that_are_not_local_paths_are_skipped_and_the_rest_downloaded(cp_bucket, tmp):
    """docs/CP.md: a key with an empty, '.' or '..' segment below the prefix is named and
    skipped (exit status 2); every other key is still copied, and nothing lands outside."""
    seed.put(cp_bucket.store, cp_bucket.name, "t/ok.txt", b"ok")
    weird = []
    for k in ("t//lead", "t/x//y", "t/../evil"):
        try:
            seed.put(cp_bucket.store, cp_bucket.name, k, b"weird")
        except Exception as e:  # MinIO refuses some of them; the rest must still be skipped
            print(f"{cp_bucket.store}: {k!r} refused: {type(e).__name__}")
            continue
        if k in seed.list_keys(cp_bucket.store, cp_bucket.name):
            weird.append(k)
    out = tmp / "out"
    p = cp(cp_bucket, "-r", url(cp_bucket, "t"), str(out), expect_ok=not weird)
    got = {os.path.relpath(os.path.join(dp, f), out) for dp, _, fs in os.walk(out) for f in fs}
    assert got == {"ok.txt"}, p.err[-2000:]
    assert not (tmp / "evil").exists()
    if weird:
        assert p.returncode == 2, f"exit {p.returncode}: {p.err[-2000:]}"
        for k in weird:
            assert f"{k}: key is not a safe local path" in p.err, p.err[-2000:]
        assert sorted(s["path"].split("/", 3)[3] for s in summary(p)["skipped"]) == sorted(weird)


def test_several_sources_into_a_prefix(cp_bucket, tmp):
    for name in ("x", "y", "z"):
        (tmp / name).write_bytes(name.encode() * 100)
    cp(cp_bucket, str(tmp / "x"), str(tmp / "y"), str(tmp / "z"), url(cp_bucket, "many"))
    assert seed.list_keys(cp_bucket.store, cp_bucket.name, "many/") == ["many/x", "many/y", "many/z"]
    assert seed.get(cp_bucket.store, cp_bucket.name, "many/y") == b"y" * 100


def test_clear_errors(cp_bucket, tmp):
    # Exit statuses (see `bucketfs cp --help`): 3 not found, 1 anything else.
    p = cp(cp_bucket, url(cp_bucket, "nope"), str(tmp / "x"), expect_ok=False)
    assert p.returncode == 3 and "no such object" in p.err, (p.returncode, p.err)
    for src in ("nope", "nope/"):  # a missing prefix, with or without its slash
        p = cp(cp_bucket, "-r", url(cp_bucket, src), str(tmp / "x"), expect_ok=False)
        assert p.returncode == 3 and "no such object" in p.err, (src, p.returncode, p.err)
    p = cp(cp_bucket, str(tmp / "missing"), url(cp_bucket, "m"), expect_ok=False)
    assert p.returncode == 3 and str(tmp / "missing") in p.err, (p.returncode, p.err)
    (tmp / "dir").mkdir()
    p = cp(cp_bucket, str(tmp / "dir"), url(cp_bucket, "d/"), expect_ok=False)
    assert p.returncode == 1 and "use -r" in p.err, (p.returncode, p.err)
    assert not (tmp / "x").exists()
    # `BUCKET//victim` names the key `/victim`: refused, never written over `victim`.
    cp_bucket.put_all({"victim": b"keep"})
    (tmp / "new").write_bytes(b"new")
    p = cp(cp_bucket, str(tmp / "new"), url(cp_bucket, "/victim"), expect_ok=False)
    assert p.returncode != 0 and "starts with '/'" in p.err, (p.returncode, p.err)
    assert seed.get(cp_bucket.store, cp_bucket.name, "victim") == b"keep"


@contextlib.contextmanager
def _tmpfs(path, options):
    """A tmpfs mounted on the new directory `path` with `options` while the block runs; the
    test is skipped where it cannot be mounted (it needs root)."""
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)]).returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({options}) here (needs root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_an_unwritable_destination_exits_with_the_permission_status(cp_bucket, tmp):
    """A destination directory that cannot be written (a read-only file system: the tests run
    as root, whom mode bits do not stop) fails with exit status 4 and names the path."""
    (tmp / "small").write_bytes(b"x" * 1000)
    cp(cp_bucket, str(tmp / "small"), url(cp_bucket, "small"))
    with _tmpfs(tmp / "ro", "ro,size=1m") as ro:
        p = cp(cp_bucket, url(cp_bucket, "small"), str(ro / "small"), expect_ok=False)
        assert p.returncode == 4 and str(ro) in p.err, (p.returncode, p.err)
        assert os.listdir(ro) == [], os.listdir(ro)


def test_a_download_that_does_not_fit_fails_first_and_leaves_nothing(cp_bucket, tmp):
    """The local file's blocks are allocated before any byte is fetched: a disk too small is
    an error up front that says so, and no temp file stays behind."""
    src = tmp / "src.bin"
    src.write_bytes(os.urandom(SLICE + 1))
    cp(cp_bucket, str(src), url(cp_bucket, "big.bin"))
    with _tmpfs(tmp / "small", "size=2m") as small:
        p = cp(cp_bucket, url(cp_bucket, "big.bin"), str(small / "big.bin"), expect_ok=False)
        assert p.returncode == 6 and "no space" in p.err, (p.returncode, p.err)  # 6: disk full
        assert os.listdir(small) == [], os.listdir(small)


def _interrupt(cmd, ready, sig=signal.SIGINT):
    """Run cmd and send `sig` as soon as `ready()` says the copy is under way; return
    (returncode, stderr), or None if the copy ended before it was seen under way."""
    proc = subprocess.Popen(cmd, env=bucketfs_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.communicate()
            return None
        time.sleep(0.005)
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"bucketfs cp did not stop within 60 s of {sig!r}")
    return proc.returncode, err.decode(errors="replace")


def _parts_landed(b: Bucket) -> bool:
    """Whether an upload to `b` has sent a part: an S3 multipart upload with a part, or a
    GCS part object (the final object is composed from them)."""
    if b.store == "s3":
        s3 = seed.s3_client()
        for u in s3.list_multipart_uploads(Bucket=b.name).get("Uploads", []):
            if s3.list_parts(Bucket=b.name, Key=u["Key"], UploadId=u["UploadId"]).get("Parts"):
                return True
        return False
    return any(k != "big.bin" for k in seed.list_keys(b.store, b.name))


# SIGHUP: the terminal or SSH session went away (it left a 300 MB temp file and a
# multipart upload before it was handled as SIGINT is).
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=["SIGINT", "SIGHUP"])
def test_interrupted_copies_leave_nothing_behind(cp_bucket, tmp, sig):
    src = tmp / "big.bin"
    subprocess.run(["head", "-c", str(400 * MIB), "/dev/urandom"], stdout=open(src, "wb"), check=True)
    # Small parts (the smallest S3 allows), few in flight: the signal comes after the first.
    extra = [*seed.mount_extra_args(cp_bucket.store), "--slice-size", "5M", "--parallel", "2"]
    got = _interrupt([require_bin(), "cp", str(src), url(cp_bucket, "big.bin"), *extra],
                     lambda: _parts_landed(cp_bucket), sig)
    if got is None:
        pytest.skip("the upload finished before a part was seen")
    rc, err = got
    assert rc == 130 and "interrupted" in err, (rc, err)
    # No parts (GCS temp objects or S3 multipart uploads), and no object, unless the signal
    # came after the commit point (the final compose or complete request was already sent):
    # then the object is whole, never partial.
    left = seed.list_keys(cp_bucket.store, cp_bucket.name)
    if left == ["big.bin"]:
        got = hashlib.md5(seed.get(cp_bucket.store, cp_bucket.name, "big.bin")).hexdigest()
        assert got == md5_file(src), "an interrupted upload left a partial object"
    else:
        assert left == [], left
    if cp_bucket.store == "s3":
        ups = seed.s3_client().list_multipart_uploads(Bucket=cp_bucket.name).get("Uploads", [])
        assert ups == [], f"multipart uploads left behind: {ups}"
    # A download stopped mid-way leaves neither the file nor its temp file.
    cp(cp_bucket, str(src), url(cp_bucket, "big.bin"), timeout=BIG_TIMEOUT)
    out = tmp / "dl"
    out.mkdir()
    got = _interrupt([require_bin(), "cp", url(cp_bucket, "big.bin"), str(out / "big.bin"), *extra],
                     lambda: bool(os.listdir(out)), sig)
    if got is not None and got[0] != 0:
        assert "interrupted" in got[1], got[1]
        assert os.listdir(out) == [], os.listdir(out)


def test_a_copy_under_nohup_survives_a_hang_up(cp_bucket, tmp):
    """`nohup bucketfs cp ... &` sets SIGHUP to be ignored: a hang-up (logout) must not stop
    the copy, as it stops one not under nohup (the test above)."""
    src = tmp / "big.bin"
    subprocess.run(["head", "-c", str(200 * MIB), "/dev/urandom"], stdout=open(src, "wb"), check=True)
    extra = [*seed.mount_extra_args(cp_bucket.store), "--slice-size", "5M", "--parallel", "2"]
    proc = subprocess.Popen([require_bin(), "cp", "-q", str(src), url(cp_bucket, "big.bin"), *extra],
                            env=bucketfs_env(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    deadline = time.monotonic() + 60
    while not _parts_landed(cp_bucket) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=BIG_TIMEOUT)
    assert proc.returncode == 0, err.decode(errors="replace")
    got = hashlib.md5(seed.get(cp_bucket.store, cp_bucket.name, "big.bin")).hexdigest()
    assert got == md5_file(src)


# --------------------------------------------------------------------------- store to store
# MinIO <-> the GCS emulator in one command: each side gets its own endpoint.

def both_args() -> list[str]:
    return ["--s3-endpoint", seed.S3_ENDPOINT, "--gcs-endpoint", seed.GCS_ENDPOINT, "--anonymous"]


def cp2(*args, timeout=120, expect_ok=True, extra=None):
    p = run_cli(["cp", *args, *(both_args() if extra is None else extra), "--json"], timeout=timeout)
    if expect_ok:
        assert p.returncode == 0, f"bucketfs cp {' '.join(args)} exited {p.returncode}: {p.err[-2000:]}"
    return p


@pytest.fixture
def s3_and_gcs():
    require_store("s3")
    require_store("gcs")
    require_bin()
    made = {"s3": Bucket("s3"), "gcs": Bucket("gcs")}
    yield made
    for b in made.values():
        b.cleanup()


@pytest.mark.parametrize("direction", ["s3-to-gcs", "gcs-to-s3"])
@pytest.mark.parametrize("size", [0, 1, SLICE, SLICE + 1, 3 * SLICE + 5],
                         ids=["0B", "1B", "one-slice", "slice+1", "multipart"])
def test_store_to_store_between_services(s3_and_gcs, direction, size):
    a, b = (s3_and_gcs["s3"], s3_and_gcs["gcs"]) if direction == "s3-to-gcs" else \
        (s3_and_gcs["gcs"], s3_and_gcs["s3"])
    data = os.urandom(size)
    a.put("src/obj.bin", data)  # by the independent client (boto3 multipart above 8 MiB)
    p = cp2(url(a, "src/obj.bin"), url(b, "dst/obj.bin"))
    s = summary(p)
    assert s["bytes"] == size and s["files"] == 1, s
    # verified on both sides: "SOURCE>DESTINATION", each md5, s3-etag or reread-crc32c
    (how,) = s["verified"]
    assert ">" in how, s
    assert seed.get(b.store, b.name, "dst/obj.bin") == data, "the independent client reads other bytes"
    assert seed.list_keys(b.store, b.name) == ["dst/obj.bin"], "parts or temp objects left behind"
    if b.store == "s3":
        assert seed.s3_client().list_multipart_uploads(Bucket=b.name).get("Uploads", []) == []


def test_store_to_store_within_a_bucket_is_server_side(cp_bucket):
    data = os.urandom(2 * SLICE + 3)
    cp_bucket.put("a/obj", data)
    p = cp(cp_bucket, url(cp_bucket, "a/obj"), url(cp_bucket, "b/obj"))
    s = summary(p)
    (how,) = s["verified"]
    assert how.startswith("copy:"), f"expected the store's own copy, got {s}"
    assert seed.get(cp_bucket.store, cp_bucket.name, "b/obj") == data
    # the same object on both sides is refused, not truncated
    p = cp(cp_bucket, url(cp_bucket, "a/obj"), url(cp_bucket, "a/obj"), expect_ok=False)
    assert p.returncode != 0 and "same object" in p.err, p.err
    assert seed.get(cp_bucket.store, cp_bucket.name, "a/obj") == data


def test_store_to_store_between_buckets_of_one_store(cp_bucket):
    other = Bucket(cp_bucket.store)
    try:
        data = os.urandom(3 * SLICE + 1)
        cp_bucket.put("k", data)
        p = cp(cp_bucket, url(cp_bucket, "k"), url(other, "k2"))
        (how,) = summary(p)["verified"]
        assert ">" in how, how  # streamed, verified on both sides
        assert seed.get(other.store, other.name, "k2") == data
    finally:
        other.cleanup()


def test_store_to_store_recursive_prefix(s3_and_gcs):
    a, b = s3_and_gcs["s3"], s3_and_gcs["gcs"]
    tree = {"p/top.txt": b"top", "p/d1/a.bin": os.urandom(1000), "p/d1/d2/b.bin": os.urandom(SLICE + 7),
            "p/d1/d2/empty": b"", "other/x": b"not copied"}
    a.put_all(tree)
    p = cp2("-r", url(a, "p"), url(b, "copy/"))
    assert summary(p)["files"] == 4
    want = {f"copy/p/{k[2:]}": v for k, v in tree.items() if k.startswith("p/")}
    assert sorted(seed.list_keys(b.store, b.name)) == sorted(want)
    for k, v in want.items():
        assert seed.get(b.store, b.name, k) == v


def test_gcs_keys_with_dot_segments_are_skipped_on_the_way_to_s3(s3_and_gcs):
    """GCS keeps `a/../b` as a name; an S3 request for it goes to `b` (HTTP clients resolve
    dot segments in a URL path), signed for `a/../b`: it failed as a credentials problem
    (exit 4, tester W). It is skipped, named, with exit 2, and the rest is copied."""
    a, b = s3_and_gcs["gcs"], s3_and_gcs["s3"]
    a.put_all({"dd/a/../b": b"dots", "dd/ok": b"fine"})
    p = cp2("-r", url(a, "dd"), url(b, "copy/"), expect_ok=False)
    assert p.returncode == 2 and "a/../b" in p.err and ". or .. segment" in p.err, (p.returncode, p.err)
    assert seed.list_keys(b.store, b.name) == ["copy/dd/ok"]


def run_through_outage(px, args):
    """`bucketfs ARGS` through proxy `px` slowed to 20 ms each way and 10 MB/s per
    connection (so it takes several seconds), with the server gone for a second at 1.5 s:
    every connection cut, new ones refused. Returns (still running at the outage, process,
    stdout, stderr)."""
    px.toxic("latency", "downstream", latency=20)
    px.toxic("bandwidth", "downstream", rate=10_000)
    proc = subprocess.Popen([require_bin(), *args], env=bucketfs_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.5)
    mid = proc.poll() is None
    px.set_enabled(False)
    time.sleep(1.0)
    px.set_enabled(True)
    out, err = proc.communicate(timeout=300)
    return mid, proc, out, err


def test_store_to_store_outage_mid_transfer_is_retried(s3_and_gcs, toxiproxy):
    """The source's server goes away (every connection cut, new ones refused) for a second
    in the middle of a copy: the requests are retried and the copy is complete and right."""
    from conftest import upstream_of
    a, b = s3_and_gcs["s3"], s3_and_gcs["gcs"]
    data = os.urandom(96 * MIB)
    a.put("big", data)
    px = toxiproxy.proxy(upstream_of("s3"))
    try:
        mid, proc, out, err = run_through_outage(px, [
            "cp", url(a, "big"), url(b, "big"), "--s3-endpoint", px.endpoint,
            "--gcs-endpoint", seed.GCS_ENDPOINT, "--anonymous", "--parallel", "2", "--json"])
    finally:
        px.delete()
    assert mid, "the copy finished before the outage; nothing was tested"
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    assert json.loads(out.decode().strip().splitlines()[-1])["bytes"] == len(data)
    assert seed.get(b.store, b.name, "big") == data
    assert seed.list_keys(b.store, b.name) == ["big"], "parts left behind"


def test_download_outage_mid_transfer_is_resumed(tmp, toxiproxy):
    """S3 to a local file, with the server gone (every connection cut, new ones refused) for
    a second mid-download: the streamed ranged reads break off half way, are resumed, and
    the file is complete and right (checked against the ETag, then by md5)."""
    from conftest import upstream_of
    require_store("s3")
    require_bin()
    b = Bucket("s3")
    data = os.urandom(96 * MIB)
    b.put("big", data)
    px = toxiproxy.proxy(upstream_of("s3"))
    out = tmp / "big"
    try:
        mid, proc, stdout, err = run_through_outage(
            px, ["cp", url(b, "big"), str(out), "--endpoint", px.endpoint, "--parallel", "2", "--json"])
    finally:
        px.delete()
        b.cleanup()
    assert mid, "the copy finished before the outage; nothing was tested"
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    assert json.loads(stdout.decode().strip().splitlines()[-1])["bytes"] == len(data)
    assert md5_file(out) == hashlib.md5(data).hexdigest()
    assert [p.name for p in tmp.iterdir()] == ["big"], "temp files left behind"


# --------------------------------------------------------------------------- never lose a byte
# A local source that changes while it is read fails the copy (and leaves no object); what
# `cp -r` cannot copy is skipped out loud (exit 2), never silently.

def _read_pos(pid: int, path: str) -> int | None:
    """How far process `pid` has read `path` (the position of its descriptor), or None."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    return next(int(line.split()[1]) for line in f if line.startswith("pos:"))
        except (OSError, StopIteration):
            continue
    return None


@pytest.mark.parametrize("how", ["truncate", "rewrite-in-tree"])
def test_a_source_changed_during_upload_fails_and_leaves_no_object(cp_bucket, tmp, how):
    """A 240 MiB file (1 MiB of noise, then a hole: quick to make and read) changed once the
    upload has read 10 MiB of it and held it 50 ms (past the timestamp granularity): truncated
    to a third, or (in a `cp -r` tree) rewritten in place, same size, new bytes at both ends.
    Before: exit 0 and an object with the file's first part, or mixing old and new bytes.
    Now: a failure naming the file and saying it changed; the upload aborted (no object, no
    parts). Two 5 MiB parts in flight keep the reader near the upload."""
    size = 240 * MIB
    (tmp / "tree").mkdir()
    src = tmp / "tree" / "big.bin"
    with open(src, "wb") as f:
        f.write(os.urandom(MIB))
        f.truncate(size)

    def change():
        if how == "truncate":
            os.truncate(src, size // 3)
            return
        with open(src, "r+b") as f:
            f.write(os.urandom(8 * MIB))
            f.seek(size - 8 * MIB)
            f.write(os.urandom(8 * MIB))

    args = ["-r", str(tmp / "tree"), url(cp_bucket, "up/")] if how != "truncate" else [str(src), url(cp_bucket, "k")]
    proc = subprocess.Popen([require_bin(), "cp", *args, *seed.mount_extra_args(cp_bucket.store), "--slice-size", "5M",
                             "--parallel", "2"], env=bucketfs_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    opened, deadline = None, time.monotonic() + 60
    while True:
        pos = _read_pos(proc.pid, str(src))
        opened = opened or (pos is not None and time.monotonic())
        if pos is not None and pos >= 10 * MIB and time.monotonic() - opened >= 0.05:
            change()
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the copy ended before its source could be changed: {proc.communicate()[1][-1000:]!r}")
        time.sleep(0.001)
    err = proc.communicate(timeout=BIG_TIMEOUT)[1].decode(errors="replace")
    assert proc.returncode != 0, f"a source changed at byte {pos} was copied as a success: {err[-1000:]}"
    assert proc.returncode == 5, (proc.returncode, err[-1000:])  # 5: changed during the copy
    assert "changed during the copy" in err and str(src) in err, err
    assert seed.list_keys(cp_bucket.store, cp_bucket.name) == [], "a copy of a changing file left an object (or parts)"
    if cp_bucket.store == "s3":
        assert seed.s3_client().list_multipart_uploads(Bucket=cp_bucket.name).get("Uploads", []) == []


def _special_tree(tmp):
    """A tree with one of each kind cp -r meets; returns (tree, {path in it: reason word}) of
    the entries skipped when symlinks are followed."""
    import socket
    import stat

    (tmp / "outside").mkdir()
    (tmp / "outside" / "o.txt").write_bytes(b"outside")
    tree = tmp / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "empty").mkdir()
    (tree / "file.txt").write_bytes(b"file")
    (tree / "sub" / "inner.txt").write_bytes(b"inner")
    for target, link in [("file.txt", "link_file"), ("sub", "link_dir"), (str(tmp / "outside"), "out"),
                         ("nowhere", "dangling"), ("..", "sub/loop"), ("self", "self")]:
        os.symlink(target, tree / link)
    os.mkfifo(tree / "fifo")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tree / "sock"))
    s.close()
    # sub/loop, and the same link reached through link_dir, lead back to tree; self is ELOOP.
    skipped = {"dangling": "dangling", "sub/loop": "symlink loop", "link_dir/loop": "symlink loop",
               "self": "symlink loop", "fifo": "FIFO", "sock": "socket"}
    try:
        os.mknod(tree / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        skipped["null"] = "character device"
    except (PermissionError, AttributeError):
        pass  # not root: no device in the tree
    return tree, skipped


def test_a_download_over_a_file_keeps_its_mode_and_follows_a_link(cp_bucket, tmp):
    """As cp(1): a destination that exists keeps its mode (a private 0600 file was left 0644
    by the rename of the new bytes over it), and a symlink destination is written through."""
    src = tmp / "src"
    src.write_bytes(b"new bytes")
    cp(cp_bucket, str(src), url(cp_bucket, "obj"))
    priv = tmp / "priv"
    priv.write_bytes(b"old")
    os.chmod(priv, 0o600)
    (tmp / "target").write_bytes(b"old")
    os.symlink("target", tmp / "link")
    cp(cp_bucket, url(cp_bucket, "obj"), str(priv))
    cp(cp_bucket, url(cp_bucket, "obj"), str(tmp / "link"))
    assert priv.read_bytes() == b"new bytes" and (os.stat(priv).st_mode & 0o777) == 0o600
    assert os.path.islink(tmp / "link") and (tmp / "target").read_bytes() == b"new bytes"


def test_an_unreadable_directory_fails_alone(cp_bucket):
    """cp -r as a user who cannot read one directory of the tree: that directory's copy fails
    (exit 4, named), everything readable is copied. Before: the whole copy stopped before
    anything was copied."""
    import shutil
    import tempfile
    if os.geteuid() != 0 or not shutil.which("runuser"):
        pytest.skip("needs root to run cp as another user")
    base = tempfile.mkdtemp(prefix="bfs-unreadable-", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        tree = os.path.join(base, "tree")
        os.makedirs(os.path.join(tree, "a"))
        os.makedirs(os.path.join(tree, "locked"))
        for rel in ("a/ok", "locked/secret"):
            with open(os.path.join(tree, rel), "wb") as f:
                f.write(rel.encode())
            os.chmod(os.path.join(tree, rel), 0o644)
        os.chmod(os.path.join(tree, "locked"), 0)
        cmd = ["runuser", "-u", "nobody", "--", require_bin(), "cp", "-r", tree, url(cp_bucket, "perm/"),
               *seed.mount_extra_args(cp_bucket.store)]
        p = subprocess.run(cmd, env=bucketfs_env(HOME=base, XDG_CACHE_HOME=base), capture_output=True, timeout=120)
        err = p.stderr.decode(errors="replace")
        assert p.returncode == 4, (p.returncode, err)
        assert "locked: Permission denied" in err, err
        assert seed.list_keys(cp_bucket.store, cp_bucket.name) == ["perm/tree/a/ok"]
    finally:
        os.chmod(os.path.join(base, "tree", "locked"), 0o755)
        shutil.rmtree(base)


def test_recursive_copy_says_what_it_skips(cp_bucket, tmp):
    """cp -r of a tree with symlinks (to a file, a directory, outside the tree, dangling, a
    loop), a FIFO, a socket, a device and an empty directory: links are followed, the empty
    directory becomes a marker object, everything else is named on stderr and in --json, and
    the exit status is 2 (0 with --skip-special). Before: exit 0 and not a word."""
    tree, skipped = _special_tree(tmp)
    p = cp(cp_bucket, "-r", str(tree), url(cp_bucket, "up/"), expect_ok=False)
    assert p.returncode == 2, (p.returncode, p.err[-2000:])
    want = {"up/tree/file.txt": b"file", "up/tree/sub/inner.txt": b"inner", "up/tree/link_file": b"file",
            "up/tree/link_dir/inner.txt": b"inner", "up/tree/out/o.txt": b"outside", "up/tree/empty/": b""}
    assert sorted(seed.list_keys(cp_bucket.store, cp_bucket.name)) == sorted(want)
    for k, v in want.items():
        assert seed.get(cp_bucket.store, cp_bucket.name, k) == v, k
    s = summary(p)
    got = {os.path.relpath(e["path"], tree): e["reason"] for e in s["skipped"]}
    assert sorted(got) == sorted(skipped), s
    for name, word in skipped.items():
        assert word in got[name] and f"skipped {tree / name}: " in p.err, (name, got[name], p.err)
    assert s["files"] == 5 and s["dirs"] == 1, s

    # --skip-special: the same messages, exit 0.
    p = cp(cp_bucket, "-r", str(tree), url(cp_bucket, "ok/"), "--skip-special")
    assert len(summary(p)["skipped"]) == len(skipped) and f"skipped {tree / 'fifo'}: " in p.err, p.err

    # --no-follow-symlinks: every link is skipped, and said so.
    p = cp(cp_bucket, "-r", str(tree), url(cp_bucket, "nf/"), "--no-follow-symlinks", expect_ok=False)
    assert p.returncode == 2, (p.returncode, p.err[-2000:])
    links = {"link_file", "link_dir", "out", "dangling", "sub/loop", "self"}
    got = {os.path.relpath(e["path"], tree): e["reason"] for e in summary(p)["skipped"]}
    assert sorted(got) == sorted(links | (set(skipped) - links - {"link_dir/loop"})), got
    assert all("symlink" in got[n] for n in links), got
    assert sorted(seed.list_keys(cp_bucket.store, cp_bucket.name, "nf/")) == \
        ["nf/tree/empty/", "nf/tree/file.txt", "nf/tree/sub/inner.txt"]

    # Back down: the marker object is an empty local directory again.
    out = tmp / "back"
    cp(cp_bucket, "-r", url(cp_bucket, "up/tree"), str(out))
    assert (out / "empty").is_dir() and os.listdir(out / "empty") == []
    assert (out / "link_dir" / "inner.txt").read_bytes() == b"inner"

    # A FIFO named as the source is skipped too, not read (before: a wait for a writer).
    p = cp(cp_bucket, str(tree / "fifo"), url(cp_bucket, "f"), expect_ok=False, timeout=30)
    assert p.returncode == 2 and f"skipped {tree / 'fifo'}: " in p.err and "FIFO" in p.err, (p.returncode, p.err)
    assert seed.list_keys(cp_bucket.store, cp_bucket.name, "f") == []


def test_preserve_keeps_mode_and_mtime_of_a_file_of_several_parts(cp_bucket, tmp):
    """`cp -P` of a file over one part (8 MiB): GCS composes it from parts, and the compose
    request carried no metadata, so mode and mtime were dropped with exit 0 (tester C);
    S3 multipart kept them. Both stores, up and back down."""
    src = tmp / "big"
    src.write_bytes(os.urandom(SLICE + 1))
    os.chmod(src, 0o640)
    when = 1_273_035_905.25
    os.utime(src, (when, when))
    cp(cp_bucket, "-P", str(src), url(cp_bucket, "big"))
    back = tmp / "back"
    cp(cp_bucket, "-P", url(cp_bucket, "big"), str(back))
    st = os.stat(back)
    assert (st.st_mode & 0o777, round(st.st_mtime, 2)) == (0o640, when), \
        f"downloaded with mode {oct(st.st_mode & 0o777)} and mtime {st.st_mtime}, not 0o640 and {when}"
    assert back.read_bytes() == src.read_bytes()


# --------------------------------------------------------------------------- stored encodings

def test_a_gzip_encoded_gcs_object_is_copied_and_read_as_stored(gcs_bucket, tmp):
    """An object uploaded with `Content-Encoding: gzip` (`gsutil cp -z`): GCS serves it
    decompressed and whole unless asked for the stored bytes, while its size, CRC32C and
    MD5 are the stored bytes'. `cp` failed every check (exit 7) and a mount showed the
    first 95 bytes of the decompressed text as the file (tester Q). Both now give the
    bytes as stored, as `aws s3 cp` and rclone do."""
    import gzip
    import urllib.request
    text = b"hello gzip world\n" * 1000
    stored = gzip.compress(text)
    meta = json.dumps({"name": "gz/obj.txt", "contentEncoding": "gzip", "contentType": "text/plain"})
    body = (b"--B\r\nContent-Type: application/json\r\n\r\n" + meta.encode() +
            b"\r\n--B\r\nContent-Type: text/plain\r\n\r\n" + stored + b"\r\n--B--\r\n")
    req = urllib.request.Request(
        f"{seed.GCS_ENDPOINT}/upload/storage/v1/b/{gcs_bucket.name}/o?uploadType=multipart", data=body,
        headers={"Content-Type": "multipart/related; boundary=B"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["contentEncoding"] == "gzip"
    out = tmp / "obj.txt"
    cp(gcs_bucket, url(gcs_bucket, "gz/obj.txt"), str(out))
    assert out.read_bytes() == stored
    with gcs_bucket.mounted() as mp:
        with open(os.path.join(mp, "gz/obj.txt"), "rb") as f:
            assert f.read() == stored
        with open(os.path.join(mp, "gz/obj.txt"), "rb") as f:
            f.seek(40)
            assert f.read(20) == stored[40:60], "a range of the stored bytes"
    assert gzip.decompress(out.read_bytes()) == text
