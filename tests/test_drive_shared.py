"""Shared drives on a Drive mount (issue 28, item 1), against the Drive emulator, which hides
shared-drive items from calls without supportsAllDrives / includeItemsFromAllDrives /
corpora=drive&driveId as Drive does, and refuses a service account's uploads to My Drive
(403 storageQuotaExceeded: service accounts have no storage quota)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

from conftest import mounted, run_cli, wait_until
import drive_seed as ds
import test_gdrive
from test_gdrive import NO_CREDS, args, drive_env

folder = test_gdrive.folder  # a fixture


def seed(name: str, parent: str, content: str | None = None) -> dict:
    if content is None:
        return ds.control("seed", {"name": name, "parent": parent, "mimeType": ds.FOLDER})
    return ds.control("seed", {"name": name, "parent": parent, "content": content})


def shared_names(fid: str) -> list[str]:
    st, out = ds.api("GET", "/drive/v3/files", {"q": f"'{fid}' in parents and trashed=false", "corpora": "allDrives",
                                                "includeItemsFromAllDrives": "true", "supportsAllDrives": "true"})
    assert st == 200, out
    return sorted(f["name"] for f in out["files"])


def test_shared_drive_lists_reads_writes_and_follows_changes(tmp_path):
    sd = ds.control("shared_drive", {"name": "Team " + uuid.uuid4().hex[:6]})["id"]
    seed("a.txt", sd, "in the shared drive")
    sub = seed("sub", sd)
    seed("b.txt", sub["id"], "deeper")
    # What a client without the shared-drive flags sees: nothing.
    st, out = ds.api("GET", "/drive/v3/files", {"q": f"'{sd}' in parents"})
    assert st == 200 and out["files"] == []
    env = drive_env(tmp_path, BUCKETFS_GDRIVE_POLL_SECS="0.3")
    with mounted(args(sd, "--metadata-ttl", "0.3"), env=env) as mp:
        assert sorted(os.listdir(mp)) == ["a.txt", "sub"]
        assert open(os.path.join(mp, "a.txt"), "rb").read() == b"in the shared drive"
        assert open(os.path.join(mp, "sub", "b.txt"), "rb").read() == b"deeper"
        with open(os.path.join(mp, "sub", "new.txt"), "wb") as f:
            f.write(b"written into the shared drive")
        seed("c.txt", sd, "made elsewhere")
        assert wait_until(lambda: "c.txt" in os.listdir(mp), 10), os.listdir(mp)
    assert shared_names(sub["id"]) == ["b.txt", "new.txt"]
    # A folder inside a shared drive mounts too.
    with mounted(args(sub["id"]), env=drive_env(tmp_path)) as mp:
        assert sorted(os.listdir(mp)) == ["b.txt", "new.txt"]


def service_account_env(tmp_path) -> dict:
    key = tmp_path / "key.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(key)],
                   check=True, capture_output=True)
    modulus = subprocess.run(["openssl", "rsa", "-in", str(key), "-noout", "-modulus"], check=True,
                             capture_output=True, text=True).stdout.strip().split("=", 1)[1]
    email = f"sa-{uuid.uuid4().hex[:6]}@test.iam.gserviceaccount.com"
    ds.control("sa_key", {"email": email, "n": modulus})
    sa = tmp_path / "sa.json"
    sa.write_text(json.dumps({"type": "service_account", "client_email": email, "private_key": key.read_text()}))
    return drive_env(tmp_path, **{**NO_CREDS, "GOOGLE_APPLICATION_CREDENTIALS": str(sa)})


def test_service_account_write_to_my_drive_says_use_a_shared_drive(folder, tmp_path):
    env = service_account_env(tmp_path)
    src = tmp_path / "f.txt"
    src.write_bytes(b"from a service account")
    p = run_cli(["cp", str(src), f"gdrive://{folder}/f.txt", "--endpoint", ds.ENDPOINT], env=env)
    assert p.returncode != 0
    assert "storageQuotaExceeded" in p.err and "gdrive://SHARED-DRIVE-ID" in p.err, p.err
    sd = ds.control("shared_drive", {"name": "SA drive"})["id"]
    p = run_cli(["cp", str(src), f"gdrive://{sd}/f.txt", "--endpoint", ds.ENDPOINT], env=env)
    assert p.returncode == 0, p.err
    assert shared_names(sd) == ["f.txt"]
