"""Drive errors are errors, never empty files or one-line retries (issue 28, item 5), against
the Drive emulator: a 403 or an exhausted 5xx on a key with "416" in its name, a file Drive
flags as abusive, throttling longer than one backoff, and the token endpoint failing."""

from __future__ import annotations

import errno
import os
import time

import pytest

from conftest import mounted, new_mountpoint, run_cli
import drive_seed as ds
import test_gdrive
from test_gdrive import args, drive_env

folder = test_gdrive.folder  # a fixture


@pytest.fixture(autouse=True)
def _no_leftover_failures():
    yield
    ds.control("fail", {"clear": True})


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_403_on_a_key_named_416_is_an_error_not_empty(folder, tmp_path):
    ds.control("seed", {"name": "IMG_4160.jpg", "parent": folder, "content": "jpeg bytes"})
    with mounted(args(folder), env=drive_env(tmp_path)) as mp:
        p = os.path.join(mp, "IMG_4160.jpg")
        assert os.stat(p).st_size == len(b"jpeg bytes")
        # Several: the kernel asks again after a failed readahead.
        ds.control("fail", {"count": 10, "status": 403, "reason": "forbidden", "path": "alt=media"})
        with pytest.raises(OSError) as e:
            read(p)
        assert e.value.errno == errno.EACCES, e.value
        ds.control("fail", {"clear": True})
        assert read(p) == b"jpeg bytes"  # the next open asks again


def test_exhausted_5xx_on_a_416_key_is_an_error(folder, tmp_path):
    ds.control("seed", {"name": "IMG_4161.jpg", "parent": folder, "content": "more jpeg"})
    with mounted(args(folder), env=drive_env(tmp_path)) as mp:
        p = os.path.join(mp, "IMG_4161.jpg")
        os.stat(p)
        ds.control("fail", {"count": 100, "status": 503, "reason": "backendError", "path": "alt=media"})
        with pytest.raises(OSError) as e:
            read(p)
        assert e.value.errno in (errno.EIO, errno.ETIMEDOUT), e.value  # "unavailable"
        ds.control("fail", {"clear": True})
        assert read(p) == b"more jpeg"


def test_abusive_file_is_read_with_acknowledge_abuse(folder, tmp_path):
    ds.control("seed", {"name": "flagged.exe", "parent": folder, "content": "MZ flagged", "abusive": True})
    st, out = ds.api("GET", f"/drive/v3/files/{ds.child(folder, 'flagged.exe')['id']}", {"alt": "media"})
    assert st == 403 and out["error"]["errors"][0]["reason"] == "cannotDownloadAbusiveFile"
    with mounted(args(folder), env=drive_env(tmp_path)) as mp:
        assert read(os.path.join(mp, "flagged.exe")) == b"MZ flagged"


def cp_out(fid: str, name: str, tmp_path, **env) -> tuple[object, bytes]:
    """`bucketfs cp` of one file out of Drive: one process, one try (the kernel retries
    a failed read through a mount, which would hide a client that gives up too soon)."""
    dst = tmp_path / ("out-" + name)
    p = run_cli(["cp", f"gdrive://{fid}/{name}", str(dst), "--endpoint", ds.ENDPOINT], env=drive_env(tmp_path, **env))
    return p, dst.read_bytes() if dst.exists() else b""


def test_throttling_longer_than_one_backoff_cap(folder, tmp_path):
    ds.control("seed", {"name": "t.txt", "parent": folder, "content": "after the quota refills"})
    ds.control("throttle", {"seconds": 12, "status": 403, "reason": "userRateLimitExceeded"})
    t0 = time.monotonic()
    p, got = cp_out(folder, "t.txt", tmp_path)
    assert p.returncode == 0, p.err
    assert got == b"after the quota refills"
    assert time.monotonic() - t0 >= 11.5


def test_token_endpoint_503_once_is_retried(folder, tmp_path):
    ds.control("seed", {"name": "k.txt", "parent": folder, "content": "token came back"})
    before = ds.control("stats").get("token_failures", 0)
    ds.control("token_fail", {"count": 1, "status": 503})
    p, got = cp_out(folder, "k.txt", tmp_path)
    assert p.returncode == 0, p.err
    assert got == b"token came back"
    assert ds.control("stats").get("token_failures", 0) == before + 1


def test_refused_refresh_token_says_what_to_do(folder, tmp_path):
    env = drive_env(tmp_path, BUCKETFS_GDRIVE_REFRESH_TOKEN="revoked-token")
    p = run_cli(["mount", f"gdrive://{folder}", new_mountpoint(), "--endpoint", ds.ENDPOINT], env=env)
    assert p.returncode != 0
    assert "invalid_grant" in p.err and "bucketfs auth gdrive" in p.err and "revoked-token" not in p.err, p.err


def test_unknown_fields_selector_is_refused_and_the_mount_asks_only_known_ones(folder, tmp_path):
    # https://developers.google.com/drive/api/guides/fields-parameter: an unknown field is a 400.
    st, out = ds.api("GET", "/drive/v3/files", {"q": "trashed=false", "fields": "files(id,sizeInBytes)"})
    assert st == 400 and "sizeInBytes" in out["error"]["message"], out
    st, out = ds.api("GET", "/drive/v3/files", {"q": f"'{folder}' in parents", "fields": "files(id,name)"})
    assert st == 200 and all(set(f) <= {"id", "name"} for f in out["files"]), out
    ds.control("seed", {"name": "f.txt", "parent": folder, "content": "fields ok"})
    before = ds.control("stats")["requests"]
    with mounted(args(folder), env=drive_env(tmp_path)) as mp:
        assert open(os.path.join(mp, "f.txt"), "rb").read() == b"fields ok"
    assert ds.control("stats")["requests"] > before
