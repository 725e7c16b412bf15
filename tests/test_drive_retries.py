"""Retries that cannot duplicate (issue 28, item 4), against the Drive emulator's "do the
work, then fail" switch: a mkdir, a new file, a rename (files.update) whose answer is lost
after Drive made the change are retried without a second item, and a resumable upload resumes
from what Drive says it holds (a chunk stored but answered 503; a chunk only partly kept, 308 +
Range)."""

from __future__ import annotations

import os

from conftest import mounted, run_cli
import drive_seed as ds
import test_gdrive
from test_gdrive import args, drive_env

folder = test_gdrive.folder  # a fixture


def lost_answer(method: str, path: str) -> None:
    ds.control("fail", {"count": 1, "status": 503, "reason": "backendError", "method": method, "path": path,
                        "after": True})


def names(fid: str) -> list[str]:
    return sorted(f["name"] for f in ds.children(fid))


def test_mkdir_write_and_rename_are_not_duplicated(folder, tmp_path):
    a = ds.create("a.txt", folder, b"to be renamed")
    with mounted(args(folder), env=drive_env(tmp_path)) as mp:
        before = ds.control("stats")["failed_injected"]
        lost_answer("POST", r"^/drive/v3/files\?")
        os.mkdir(os.path.join(mp, "d"))
        lost_answer("POST", r"^/upload/drive/v3/files\?uploadType=multipart")
        with open(os.path.join(mp, "d", "new.txt"), "wb") as f:
            f.write(b"once")
        lost_answer("PATCH", r"^/drive/v3/files/[^/?]+\?")
        os.rename(os.path.join(mp, "a.txt"), os.path.join(mp, "b.txt"))
        assert ds.control("stats")["failed_injected"] - before == 3
        assert sorted(os.listdir(mp)) == ["b.txt", "d"]
        assert os.listdir(os.path.join(mp, "d")) == ["new.txt"]
    assert names(folder) == ["b.txt", "d"]
    d = ds.child(folder, "d")
    assert names(d["id"]) == ["new.txt"]
    st, body = ds.api("GET", f"/drive/v3/files/{ds.child(folder, 'b.txt')['id']}", {"alt": "media"}, raw=True)
    assert body == b"to be renamed"
    assert ds.child(folder, "b.txt")["id"] == a["id"], "renamed in place, not copied"


def test_resumable_upload_resumes_from_what_drive_holds(folder, tmp_path):
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(20 * 1024 * 1024 + 5))  # three 8 MiB parts: a resumable upload
    before = ds.control("stats")["failed_injected"]
    sessions = ds.control("stats").get("upload_sessions", 0)
    lost_answer("PUT", r"upload_id=")  # the first chunk is stored, its answer is a 503
    ds.control("short_chunk", {"keep": 768 * 1024})  # a later chunk is only partly kept
    p = run_cli(["cp", str(src), f"gdrive://{folder}/big.bin", "--endpoint", ds.ENDPOINT], env=drive_env(tmp_path))
    assert p.returncode == 0, p.err
    assert ds.control("stats")["failed_injected"] - before == 1
    assert not ds.control("stats")["pending_short_chunk"]
    # Resumed in the one session, not started over.
    assert ds.control("stats")["upload_sessions"] - sessions == 1
    got = [f for f in ds.children(folder) if f["name"] == "big.bin"]
    assert len(got) == 1 and int(got[0]["size"]) == src.stat().st_size
    st, body = ds.api("GET", f"/drive/v3/files/{got[0]['id']}", {"alt": "media"}, raw=True)
    assert body == src.read_bytes()
