#!/usr/bin/env python3
"""Seed and inspect test buckets through clients that are independent of bucketfs.

Stores:
  s3    MinIO via boto3 (path-style), endpoint $BUCKETFS_TEST_S3_ENDPOINT (default http://127.0.0.1:9000)
  gcs   fake-gcs-server via its GCS JSON API over plain HTTP (urllib),
        endpoint $BUCKETFS_TEST_GCS_ENDPOINT (default http://127.0.0.1:4443)
  gdrive  a folder in the Drive API emulator, through scripts/drive_seed.py
  file  a directory per bucket under $BUCKETFS_TEST_FILE_ROOT (default: a temp dir)
        (keys must be plain relative paths there; weird keys raise KeyRejected)

As a module (tests import it):
    import seed
    seed.make_bucket("s3", "b1")
    seed.put("s3", "b1", "a/b.txt", b"hello")
    seed.get("s3", "b1", "a/b.txt") -> b"hello"
    seed.list_keys("s3", "b1", prefix="") -> sorted list of keys
    seed.head("s3", "b1", "a/b.txt") -> {"size": int, "mtime": float epoch}
    seed.delete("s3", "b1", "a/b.txt"); seed.delete_bucket("s3", "b1")
    seed.mount_url("s3", "b1") -> "s3://b1" ; seed.mount_extra_args("gcs") -> [...]

As a script:
    python3 scripts/seed.py [--store s3|gcs|file|all] [--bucket NAME]
creates the bucket, uploads a known dataset (seed.known_dataset()), lists it back and
verifies every object's content; exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

S3_ENDPOINT = os.environ.get("BUCKETFS_TEST_S3_ENDPOINT", "http://127.0.0.1:9000")
GCS_ENDPOINT = os.environ.get("BUCKETFS_TEST_GCS_ENDPOINT", "http://127.0.0.1:4443").rstrip("/")
S3_ACCESS_KEY = os.environ.get("AWS_ACCESS_KEY_ID", "bucketfs-test")
S3_SECRET_KEY = os.environ.get("AWS_SECRET_ACCESS_KEY", "bucketfs-test-secret")
S3_REGION = os.environ.get("AWS_REGION", "us-east-1")

STORES = ("s3", "gcs", "file")


class KeyRejected(Exception):
    """The store (or this client) refused the key itself, e.g. '../evil' on MinIO."""


class StoreError(Exception):
    pass


# --------------------------------------------------------------------------- s3 (boto3)

_s3_client = None


def s3_client(secret: str | None = None):
    """A boto3 S3 client for MinIO. `secret` overrides the secret key (for negative tests)."""
    global _s3_client
    import boto3
    from botocore.config import Config

    if secret is None and _s3_client is not None:
        return _s3_client
    c = boto3.client(
        "s3",
        endpoint_url=S3_ENDPOINT,
        aws_access_key_id=S3_ACCESS_KEY,
        aws_secret_access_key=secret or S3_SECRET_KEY,
        region_name=S3_REGION,
        config=Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=5,
            read_timeout=60,
            # plain checksums: keep uploads simple for any S3 implementation
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )
    if secret is None:
        _s3_client = c
    return c


def _s3_rejected(e) -> bool:
    code = getattr(e, "response", {}).get("Error", {}).get("Code", "")
    return code in ("XMinioInvalidObjectName", "InvalidObjectName", "KeyTooLongError",
                    "InvalidArgument", "InvalidRequest", "XMinioInvalidResourceName")


# --------------------------------------------------------------------------- gcs (JSON API)

def _gcs_req(method: str, path: str, data: bytes | None = None, query: dict | None = None,
             content_type: str | None = None, timeout: float = 60):
    url = GCS_ENDPOINT + path
    if query:
        url += "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
    req = urllib.request.Request(url, data=data, method=method)
    if content_type:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


# --------------------------------------------------------------------------- file

_file_root: str | None = None


def file_root() -> str:
    global _file_root
    if _file_root is None:
        _file_root = os.environ.get("BUCKETFS_TEST_FILE_ROOT") or tempfile.mkdtemp(prefix="bucketfs-file-store-")
        os.makedirs(_file_root, exist_ok=True)
    return _file_root


def _file_path(bucket: str, key: str) -> str:
    segs = key.split("/")
    trailing_slash = key.endswith("/")
    if trailing_slash:
        segs = segs[:-1]
    if not key or key.startswith("/") or any(s in ("", ".", "..") for s in segs):
        raise KeyRejected(f"key {key!r} is not representable in a plain directory")
    if any(len(s.encode()) > 255 for s in segs):
        raise KeyRejected(f"key {key!r} has a segment longer than 255 bytes")
    return os.path.join(file_root(), bucket, *segs) + ("/" if trailing_slash else "")


# --------------------------------------------------------------------------- API

import drive_seed  # noqa: E402  (a Drive v3 client; the "gdrive" store)

def make_bucket(store: str, name: str) -> None:
    if store == "gdrive":
        return drive_seed.make_bucket(name)
    if store == "s3":
        c = s3_client()
        try:
            c.create_bucket(Bucket=name)
        except c.exceptions.BucketAlreadyOwnedByYou:
            pass
    elif store == "gcs":
        st, body = _gcs_req("POST", "/storage/v1/b", json.dumps({"name": name}).encode(),
                            {"project": "test"}, "application/json")
        if st not in (200, 409):
            raise StoreError(f"gcs create bucket {name}: HTTP {st} {body[:200]!r}")
    elif store == "file":
        os.makedirs(os.path.join(file_root(), name), exist_ok=True)
    else:
        raise ValueError(f"unknown store {store}")


def put(store: str, bucket: str, key: str, data: bytes) -> None:
    """Upload one object. Raises KeyRejected if the server refuses the key name."""
    if store == "gdrive":
        _file_path(bucket, key)  # the file store's key rules: Drive paths have no empty or dot segments
        return drive_seed.put(bucket, key, data)
    if store == "s3":
        from botocore.exceptions import ClientError
        try:
            s3_client().put_object(Bucket=bucket, Key=key, Body=data)
        except ClientError as e:
            if _s3_rejected(e):
                raise KeyRejected(f"s3 rejected key {key!r}: {e}") from e
            raise
    elif store == "gcs":
        st, body = _gcs_req("POST", f"/upload/storage/v1/b/{_q(bucket)}/o", data,
                            {"uploadType": "media", "name": key}, "application/octet-stream")
        if st in (400, 403, 404) and b"bucket" not in body.lower()[:200]:
            raise KeyRejected(f"gcs rejected key {key!r}: HTTP {st} {body[:200]!r}")
        if st != 200:
            raise StoreError(f"gcs upload {bucket}/{key}: HTTP {st} {body[:200]!r}")
        # make sure the emulator stored it under exactly this name
        got = json.loads(body).get("name")
        if got != key:
            raise KeyRejected(f"gcs stored key {key!r} as {got!r}")
    elif store == "file":
        p = _file_path(bucket, key)
        if p.endswith("/"):
            os.makedirs(p, exist_ok=True)
            if data:
                raise KeyRejected("file store: a directory marker cannot hold data")
            return
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    else:
        raise ValueError(f"unknown store {store}")


def get(store: str, bucket: str, key: str) -> bytes:
    if store == "gdrive":
        return drive_seed.get(bucket, key)
    if store == "s3":
        return s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()
    if store == "gcs":
        st, body = _gcs_req("GET", f"/storage/v1/b/{_q(bucket)}/o/{_q(key)}", query={"alt": "media"})
        if st != 200:
            raise StoreError(f"gcs get {bucket}/{key}: HTTP {st} {body[:200]!r}")
        return body
    if store == "file":
        with open(_file_path(bucket, key), "rb") as f:
            return f.read()
    raise ValueError(f"unknown store {store}")


def head(store: str, bucket: str, key: str) -> dict:
    """{'size': int, 'mtime': float (epoch seconds)} as the store reports them."""
    if store == "gdrive":
        return drive_seed.head(bucket, key)
    if store == "s3":
        r = s3_client().head_object(Bucket=bucket, Key=key)
        return {"size": r["ContentLength"], "mtime": r["LastModified"].timestamp()}
    if store == "gcs":
        st, body = _gcs_req("GET", f"/storage/v1/b/{_q(bucket)}/o/{_q(key)}")
        if st != 200:
            raise StoreError(f"gcs head {bucket}/{key}: HTTP {st} {body[:200]!r}")
        o = json.loads(body)
        ts = o.get("updated") or o.get("timeCreated")
        return {"size": int(o["size"]), "mtime": datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()}
    if store == "file":
        st = os.stat(_file_path(bucket, key))
        return {"size": st.st_size, "mtime": st.st_mtime}
    raise ValueError(f"unknown store {store}")


def list_keys(store: str, bucket: str, prefix: str = "") -> list[str]:
    if store == "gdrive":
        return drive_seed.list_keys(bucket, prefix)
    keys: list[str] = []
    if store == "s3":
        pag = s3_client().get_paginator("list_objects_v2")
        for page in pag.paginate(Bucket=bucket, Prefix=prefix):
            keys.extend(o["Key"] for o in page.get("Contents", []))
    elif store == "gcs":
        token = None
        while True:
            q = {"prefix": prefix, "maxResults": "1000"}
            if token:
                q["pageToken"] = token
            st, body = _gcs_req("GET", f"/storage/v1/b/{_q(bucket)}/o", query=q)
            if st != 200:
                raise StoreError(f"gcs list {bucket}: HTTP {st} {body[:200]!r}")
            d = json.loads(body)
            keys.extend(o["name"] for o in d.get("items", []))
            token = d.get("nextPageToken")
            if not token:
                break
    elif store == "file":
        root = os.path.join(file_root(), bucket)
        for dp, dns, fns in os.walk(root):
            rel = os.path.relpath(dp, root)
            rel = "" if rel == "." else rel + "/"
            for fn in fns:
                keys.append(rel + fn)
            if not dns and not fns and rel:
                keys.append(rel)  # an empty dir stands for a marker object
        keys = [k for k in keys if k.startswith(prefix)]
    else:
        raise ValueError(f"unknown store {store}")
    return sorted(keys)


def delete(store: str, bucket: str, key: str) -> None:
    if store == "gdrive":
        return drive_seed.delete(bucket, key)
    if store == "s3":
        s3_client().delete_object(Bucket=bucket, Key=key)
    elif store == "gcs":
        st, body = _gcs_req("DELETE", f"/storage/v1/b/{_q(bucket)}/o/{_q(key)}")
        if st not in (200, 204, 404):
            raise StoreError(f"gcs delete {bucket}/{key}: HTTP {st} {body[:200]!r}")
    elif store == "file":
        p = _file_path(bucket, key)
        if p.endswith("/"):
            os.rmdir(p)
        else:
            os.unlink(p)
    else:
        raise ValueError(f"unknown store {store}")


def delete_bucket(store: str, bucket: str) -> None:
    """Delete every object, then the bucket. Best effort on leftovers."""
    if store == "gdrive":
        return drive_seed.delete_bucket(bucket)
    if store == "file":
        shutil.rmtree(os.path.join(file_root(), bucket), ignore_errors=True)
        return
    # Eight at a time: one by one, a test's 2,000 keys took over 10 s to clean up.
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda k: delete(store, bucket, k), list_keys(store, bucket)))
    if store == "s3":
        s3_client().delete_bucket(Bucket=bucket)
    elif store == "gcs":
        st, body = _gcs_req("DELETE", f"/storage/v1/b/{_q(bucket)}")
        if st not in (200, 204, 404):
            raise StoreError(f"gcs delete bucket {bucket}: HTTP {st} {body[:200]!r}")


def mount_url(store: str, bucket: str, prefix: str = "") -> str:
    """The URL bucketfs mounts for this bucket."""
    if store == "gdrive":
        return drive_seed.mount_url(bucket, prefix)
    p = ("/" + prefix.strip("/")) if prefix.strip("/") else ""
    if store == "s3":
        return f"s3://{bucket}{p}"
    if store == "gcs":
        return f"gs://{bucket}{p}"
    if store == "file":
        return "file://" + os.path.join(file_root(), bucket) + p
    raise ValueError(f"unknown store {store}")


def mount_extra_args(store: str) -> list[str]:
    """Extra CLI args bucketfs needs for this store in the test environment."""
    if store == "s3":
        return ["--endpoint", S3_ENDPOINT]
    if store == "gcs":
        return ["--endpoint", GCS_ENDPOINT, "--anonymous"]
    if store == "gdrive":
        return ["--endpoint", drive_seed.ENDPOINT]
    return []


def s3_env() -> dict:
    """Environment variables for the S3 side (what scripts/test exports)."""
    return {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
            "AWS_REGION": S3_REGION, **drive_seed.env()}


# --------------------------------------------------------------------------- datasets

def random_bytes(n: int, rng: random.Random) -> bytes:
    return rng.randbytes(n)


def known_dataset(seed: int = 1234) -> dict[str, bytes]:
    """A small deterministic dataset: files of edge-case sizes, a nested tree, a marker."""
    rng = random.Random(seed)
    d: dict[str, bytes] = {}
    for n in (0, 1, 4095, 4096, 1024 * 1024 + 7):
        d[f"sizes/f{n}"] = rng.randbytes(n)
    for i in range(3):
        for j in range(4):
            d[f"tree/d{i}/e{j}/file{i}{j}.bin"] = rng.randbytes(rng.randrange(0, 3000))
    d["implicit/a/b/c.txt"] = b"implicit dirs\n"
    d["marker/"] = b""
    d["hello.txt"] = b"hello, bucketfs\n"
    return d


def md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


def seed_and_verify(store: str, bucket: str) -> int:
    data = known_dataset()
    make_bucket(store, bucket)
    for k, v in data.items():
        put(store, bucket, k, v)
    keys = list_keys(store, bucket)
    bad = 0
    if keys != sorted(data):
        print(f"{store}: listed keys differ: extra={sorted(set(keys) - set(data))} "
              f"missing={sorted(set(data) - set(keys))}", file=sys.stderr)
        bad += 1
    for k, v in data.items():
        if k.endswith("/"):
            continue
        got = get(store, bucket, k)
        if md5(got) != md5(v):
            print(f"{store}: {k}: content mismatch ({len(got)} vs {len(v)} bytes)", file=sys.stderr)
            bad += 1
        h = head(store, bucket, k)
        if h["size"] != len(v):
            print(f"{store}: {k}: head size {h['size']} != {len(v)}", file=sys.stderr)
            bad += 1
    print(f"{store}: bucket {bucket}: {len(keys)} keys, {bad} problems -> {mount_url(store, bucket)}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", choices=STORES + ("all",), default="all")
    ap.add_argument("--bucket", default="bucketfs-seed")
    a = ap.parse_args()
    stores = ("s3", "gcs") if a.store == "all" else (a.store,)
    return 1 if sum(seed_and_verify(s, a.bucket) for s in stores) else 0


if __name__ == "__main__":
    sys.exit(main())
