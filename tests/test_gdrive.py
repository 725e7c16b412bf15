"""Google Drive (gdrive://) behaviour on a real mount, against the Drive API emulator
(scripts/drive_emulator.py, started by scripts/test-env.sh): repeated names, Docs shown as
read-only exports (or hidden), trash hidden, throttling retried, the changes feed, and the
three ways to authenticate (refresh token, service-account key, headless consent flow)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import pytest

from conftest import bucketfs_env, mounted, new_mountpoint, require_bin, require_store, run_cli, wait_until
import drive_seed as ds

DOC = "application/vnd.google-apps.document"
SHEET = "application/vnd.google-apps.spreadsheet"
NO_CREDS = {"BUCKETFS_GDRIVE_CLIENT_ID": None, "BUCKETFS_GDRIVE_CLIENT_SECRET": None,
            "BUCKETFS_GDRIVE_REFRESH_TOKEN": None, "BUCKETFS_GDRIVE_TOKEN_FILE": None,
            "GOOGLE_APPLICATION_CREDENTIALS": None}


@pytest.fixture
def folder(tmp_path):
    require_store("gdrive")
    require_bin()
    fid = ds.create("t-" + uuid.uuid4().hex[:10], "root")["id"]
    yield fid
    ds.api("DELETE", f"/drive/v3/files/{fid}")


def args(fid: str, *extra: str) -> list[str]:
    return [f"gdrive://{fid}", "--endpoint", ds.ENDPOINT, *extra]


def drive_env(tmp_path, **overrides) -> dict:
    # A private staging dir: a refused write stays staged there, not in ~/.cache.
    return bucketfs_env(**{**ds.env(), "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
                           "XDG_CACHE_HOME": str(tmp_path / "cache"), **overrides})


def export_of(fid: str) -> bytes:
    st, out = ds.api("GET", f"/drive/v3/files/{fid}/export",
                     {"mimeType": "application/vnd.openxmlformats-officedocument.wordprocessingml.document"}, raw=True)
    assert st == 200, out
    return out


def test_duplicates_docs_trash_and_folders(folder, tmp_path):
    first = ds.control("seed", {"name": "a.txt", "parent": folder, "content": "first",
                                "createdTime": "2024-01-01T00:00:00.000Z"})
    second = ds.control("seed", {"name": "a.txt", "parent": folder, "content": "second",
                                 "createdTime": "2024-01-02T00:00:00.000Z"})
    doc = ds.control("seed", {"name": "Notes", "parent": folder, "content": "PK doc export", "mimeType": DOC})
    ds.control("seed", {"name": "Budget", "parent": folder, "content": "PK sheet", "mimeType": SHEET})
    ds.control("seed", {"name": "gone.txt", "parent": folder, "content": "x", "trashed": True})
    ds.control("seed", {"name": "form", "parent": folder, "mimeType": "application/vnd.google-apps.form"})
    sub = ds.create("sub", folder)
    ds.create("x/y.txt", sub["id"], b"slash")
    with mounted(args(folder), env=drive_env(tmp_path)) as mp:
        dup = f"a~{second['id'][:8]}.txt"
        assert sorted(os.listdir(mp)) == sorted(["a.txt", dup, "Notes.docx", "Budget.xlsx", "sub"])
        assert open(os.path.join(mp, "a.txt"), "rb").read() == b"first"  # the oldest keeps the name
        assert open(os.path.join(mp, dup), "rb").read() == b"second"
        assert os.listdir(os.path.join(mp, "sub")) == ["x／y.txt"]
        assert open(os.path.join(mp, "sub", "x／y.txt"), "rb").read() == b"slash"
        assert not os.path.exists(os.path.join(mp, "gone.txt"))
        p = os.path.join(mp, "Notes.docx")
        assert os.stat(p).st_size == 0  # not exported yet: a listing never exports
        assert open(p, "rb").read() == b"PK doc export"
        assert os.stat(p).st_size == len(b"PK doc export")
        # Exports are read-only: the write is refused when it is uploaded (at close).
        with pytest.raises(OSError):
            with open(p, "wb") as f:
                f.write(b"overwritten")
        assert export_of(doc["id"]) == b"PK doc export"
        # Writing a new file through the mount lands in the same folder on Drive.
        with open(os.path.join(mp, "sub", "new.bin"), "wb") as f:
            f.write(b"n" * 1000)
        got = [f for f in ds.children(sub["id"]) if f["name"] == "new.bin"]
        assert len(got) == 1 and got[0]["size"] == "1000"
        assert first["id"] != second["id"]


def test_hide_docs_flag(folder, tmp_path):
    ds.control("seed", {"name": "Notes", "parent": folder, "content": "d", "mimeType": DOC})
    ds.control("seed", {"name": "plain.txt", "parent": folder, "content": "p"})
    with mounted(args(folder, "--gdrive-hide-docs"), env=drive_env(tmp_path)) as mp:
        assert os.listdir(mp) == ["plain.txt"]


def test_rate_limits_are_retried(folder, tmp_path):
    ds.control("seed", {"name": "r.txt", "parent": folder, "content": "read me"})
    with mounted(args(folder), env=drive_env(tmp_path)) as mp:
        before = ds.control("stats")["failed_injected"]
        for status, reason in [(403, "userRateLimitExceeded"), (403, "rateLimitExceeded"), (429, "rateLimitExceeded"),
                               (503, "backendError")]:
            ds.control("fail", {"count": 1, "status": status, "reason": reason})
        with open(os.path.join(mp, "w.txt"), "wb") as f:
            f.write(b"written through throttling")
        assert open(os.path.join(mp, "r.txt"), "rb").read() == b"read me"
        assert ds.control("stats")["failed_injected"] - before == 4
        assert ds.control("stats")["pending_failures"] == 0
    w = [f for f in ds.children(folder) if f["name"] == "w.txt"]
    assert len(w) == 1
    st, body = ds.api("GET", f"/drive/v3/files/{w[0]['id']}", {"alt": "media"}, raw=True)
    assert body == b"written through throttling"


def test_changes_made_elsewhere_show_up(folder, tmp_path):
    keep = ds.create("keep.txt", folder, b"v1")
    old = ds.create("old.txt", folder, b"o")
    env = drive_env(tmp_path, BUCKETFS_GDRIVE_POLL_SECS="0.5")
    with mounted(args(folder, "--metadata-ttl", "0.5"), env=env) as mp:
        assert sorted(os.listdir(mp)) == ["keep.txt", "old.txt"]
        ds.create("added.txt", folder, b"added elsewhere")
        ds.api("PATCH", f"/drive/v3/files/{old['id']}", body={"trashed": True})
        ds.api("PATCH", f"/upload/drive/v3/files/{keep['id']}", {"uploadType": "media"}, b"version two")
        assert wait_until(lambda: sorted(os.listdir(mp)) == ["added.txt", "keep.txt"], 10), os.listdir(mp)
        assert open(os.path.join(mp, "added.txt"), "rb").read() == b"added elsewhere"
        assert wait_until(lambda: open(os.path.join(mp, "keep.txt"), "rb").read() == b"version two", 10)


def media_gets() -> int:
    st, out = ds.api("GET", "/_control/stats")
    assert st == 200, out
    return out.get("media_gets", 0)


def test_a_change_of_metadata_elsewhere_keeps_what_is_cached(folder, tmp_path):
    """Drive raises a file's `version` on every change, its properties included; the mount
    knows content by its MD5, so a file whose bytes did not change is not downloaded again."""
    data = os.urandom(3 * 1024 * 1024)
    f = ds.create("big.bin", folder, data)
    env = drive_env(tmp_path, BUCKETFS_GDRIVE_POLL_SECS="0.3")
    with mounted(args(folder, "--metadata-ttl", "0.3"), env=env) as mp:
        p = os.path.join(mp, "big.bin")
        with open(p, "rb") as fh:
            assert fh.read() == data
        before = media_gets()
        st, out = ds.api("PATCH", f"/drive/v3/files/{f['id']}", body={"properties": {"note": "x"}},
                         raw=True)
        assert st == 200, out
        time.sleep(1.2)  # past the TTL and a changes poll: the mount sees the new version
        os.stat(p)
        with open(p, "rb") as fh:
            assert fh.read() == data
        assert media_gets() == before, "downloaded again after a change of its properties"


def read_uncached(p: str) -> bytes:
    """The file's bytes with the kernel's page cache of it dropped first, so the mount
    serves them (from its own cache or the store)."""
    fd = os.open(p, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
    finally:
        os.close(fd)


def test_a_rename_keeps_the_drive_file(folder, tmp_path):
    """A rename on Drive is one files.update: the file keeps its ID (so its sharing, links
    and revisions), a folder moves with everything in it in one request, bytes already
    read are not downloaded again, and a file renamed over another replaces it."""
    data = os.urandom(2 * 1024 * 1024)
    f = ds.create("a.bin", folder, data)
    d = ds.create("d", folder)
    for i in range(30):
        ds.create(f"f{i}", d["id"], b"x%d" % i)
    with mounted(args(folder), env=drive_env(tmp_path)) as mp:
        assert read_uncached(os.path.join(mp, "a.bin")) == data
        os.mkdir(os.path.join(mp, "sub"))
        before = ds.control("stats")
        os.rename(os.path.join(mp, "a.bin"), os.path.join(mp, "sub", "b.bin"))
        os.rename(os.path.join(mp, "d"), os.path.join(mp, "e"))
        after = ds.control("stats")
        sub = ds.child(folder, "sub", folder_only=True)
        assert ds.child(sub["id"], "b.bin")["id"] == f["id"], "the same Drive file"
        assert ds.child(folder, "e", folder_only=True)["id"] == d["id"]
        assert ds.child(folder, "a.bin") is None and ds.child(folder, "d") is None
        assert after.get("updates", 0) - before.get("updates", 0) == 2, "one files.update each"
        assert after.get("copies", 0) == before.get("copies", 0), "nothing copied"
        assert read_uncached(os.path.join(mp, "sub", "b.bin")) == data
        assert ds.control("stats").get("media_gets", 0) == before.get("media_gets", 0), "downloaded again"
        assert sorted(os.listdir(os.path.join(mp, "e"))) == sorted(f"f{i}" for i in range(30))
        assert open(os.path.join(mp, "e", "f7"), "rb").read() == b"x7"
        # Over an existing file: it is replaced (to the trash), one name in the folder.
        with open(os.path.join(mp, "c.txt"), "wb") as out:
            out.write(b"old c")
        os.rename(os.path.join(mp, "e", "f0"), os.path.join(mp, "c.txt"))
        assert open(os.path.join(mp, "c.txt"), "rb").read() == b"x0"
        assert [c["name"] for c in ds.children(folder)].count("c.txt") == 1
        assert sorted(os.listdir(mp)) == ["c.txt", "e", "sub"]
    with mounted(args(folder), env=drive_env(tmp_path)) as mp:
        assert sorted(os.listdir(mp)) == ["c.txt", "e", "sub"]
        assert open(os.path.join(mp, "sub", "b.bin"), "rb").read() == data
        assert len(os.listdir(os.path.join(mp, "e"))) == 29


def test_the_emulator_keeps_one_parent_as_drive_does(folder):
    """files.update may move an item but not give it a second parent (Drive answers 403
    cannotAddParent since 2020), so a client that forgets removeParents is caught here."""
    f = ds.create("one.txt", folder, b"1")
    other = ds.create("other", folder)
    st, out = ds.api("PATCH", f"/drive/v3/files/{f['id']}", {"addParents": other["id"]}, body={}, raw=True)
    assert st == 403 and b"cannotAddParent" in out, (st, out)
    st, out = ds.api("PATCH", f"/drive/v3/files/{f['id']}",
                     {"addParents": other["id"], "removeParents": folder, "fields": "id,parents"}, body={})
    assert st == 200 and out["parents"] == [other["id"]], out


def test_no_credentials_is_one_clear_line(folder, tmp_path):
    p = run_cli(["mount", f"gdrive://{folder}", new_mountpoint(), "--endpoint", ds.ENDPOINT],
                env=drive_env(tmp_path, **NO_CREDS))
    assert p.returncode != 0
    assert "no Google Drive credentials" in p.err and "bucketfs auth gdrive" in p.err, p.err
    assert len(p.err.strip().splitlines()) == 1


def test_service_account_key(folder, tmp_path):
    ds.control("seed", {"name": "sa.txt", "parent": folder, "content": "via service account"})
    key = tmp_path / "key.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(key)],
                   check=True, capture_output=True)
    modulus = subprocess.run(["openssl", "rsa", "-in", str(key), "-noout", "-modulus"], check=True,
                             capture_output=True, text=True).stdout.strip().split("=", 1)[1]
    email = f"sa-{uuid.uuid4().hex[:6]}@test.iam.gserviceaccount.com"
    sa = tmp_path / "sa.json"
    sa.write_text(json.dumps({"type": "service_account", "client_email": email, "private_key": key.read_text(),
                              "token_uri": "https://oauth2.googleapis.com/token"}))
    env = drive_env(tmp_path, **{**NO_CREDS, "GOOGLE_APPLICATION_CREDENTIALS": str(sa)})
    # Not registered with the server yet: the signed assertion is refused.
    p = run_cli(["mount", f"gdrive://{folder}", new_mountpoint(), "--endpoint", ds.ENDPOINT], env=env)
    assert p.returncode != 0 and "refused" in p.err, p.err
    ds.control("sa_key", {"email": email, "n": modulus})
    grants = ds.control("stats")["token_grants"].get("urn:ietf:params:oauth:grant-type:jwt-bearer", 0)
    with mounted(args(folder), env=env) as mp:
        assert open(os.path.join(mp, "sa.txt"), "rb").read() == b"via service account"
    assert ds.control("stats")["token_grants"]["urn:ietf:params:oauth:grant-type:jwt-bearer"] > grants


def consent(url: str) -> str:
    """What a browser on another machine does: open the consent page, end on the redirect."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None
    try:
        urllib.request.build_opener(NoRedirect).open(url, timeout=10)
    except urllib.error.HTTPError as e:
        assert e.code == 302
        return e.headers["Location"]
    raise AssertionError("the consent page did not redirect")


def consent_env(tmp_path) -> dict:
    """The environment of `bucketfs auth gdrive`: the emulator's client, no other credentials."""
    return drive_env(tmp_path, **{**NO_CREDS, "BUCKETFS_GDRIVE_CLIENT_ID": ds.CLIENT["client_id"],
                                  "BUCKETFS_GDRIVE_CLIENT_SECRET": ds.CLIENT["client_secret"]})


def auth_flow(tmp_path, *extra: str, tamper=lambda u: u):
    """Run `bucketfs auth gdrive`, consent as a browser would, paste `tamper(address)`.
    Returns (the consent address, the finished process, its stderr)."""
    proc = subprocess.Popen([require_bin(), "auth", "gdrive", "--endpoint", ds.ENDPOINT, *extra],
                            env=consent_env(tmp_path), stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        url = ""
        while not url:
            line = proc.stderr.readline()
            assert line, "bucketfs auth gdrive printed no consent address"
            if line.strip().startswith("http"):
                url = line.strip()
        _, err = proc.communicate(tamper(consent(url)) + "\n", timeout=30)
    finally:
        proc.kill()
    return url, proc, err


def test_headless_auth_flow(folder, tmp_path):
    ds.control("seed", {"name": "h.txt", "parent": folder, "content": "after consent"})
    token_file = tmp_path / "cfg" / "bucketfs" / "gdrive-token.json"
    env = consent_env(tmp_path)
    # The user pastes the whole redirected address (http://localhost?code=...).
    url, proc, err = auth_flow(tmp_path)
    assert "client_id=" in url and "access_type=offline" in url
    assert proc.returncode == 0, err
    assert ds.CLIENT["refresh_token"] not in err and ds.CLIENT["client_secret"] not in err
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    saved = json.loads(token_file.read_text())
    assert saved["type"] == "authorized_user" and saved["refresh_token"] == ds.CLIENT["refresh_token"]
    # The saved file is found by default: no other credentials in the environment.
    with mounted(args(folder), env=drive_env(tmp_path, **NO_CREDS)) as mp:
        assert open(os.path.join(mp, "h.txt"), "rb").read() == b"after consent"
    # A wrong code: refused, one line, exit 1.
    bad = subprocess.run([require_bin(), "auth", "gdrive", "--endpoint", ds.ENDPOINT], env=env, input="4/not-a-code\n",
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "refused" in bad.stderr.strip().splitlines()[-1], bad.stderr


def test_unmount_leaves_nothing(folder, tmp_path):
    with mounted(args(folder), env=drive_env(tmp_path)) as mp:
        os.makedirs(os.path.join(mp, "d1", "d2"))
        with open(os.path.join(mp, "d1", "d2", "f"), "wb") as f:
            f.write(b"x")
        os.rename(os.path.join(mp, "d1", "d2", "f"), os.path.join(mp, "d1", "g"))
        os.rmdir(os.path.join(mp, "d1", "d2"))
        assert os.listdir(os.path.join(mp, "d1")) == ["g"]
    d1 = [f for f in ds.children(folder) if f["name"] == "d1"]
    assert len(d1) == 1 and [f["name"] for f in ds.children(d1[0]["id"])] == ["g"]


def test_cp_to_and_from_drive(folder, tmp_path):
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(20 * 1024 * 1024 + 17))  # more than one 8 MiB part: a resumable upload
    env = drive_env(tmp_path)
    p = run_cli(["cp", str(src), f"gdrive://{folder}/x/big.bin", "--endpoint", ds.ENDPOINT], env=env)
    assert p.returncode == 0, p.err
    x = [f for f in ds.children(folder) if f["name"] == "x"]
    assert len(x) == 1 and [f["name"] for f in ds.children(x[0]["id"])] == ["big.bin"]
    back = tmp_path / "back.bin"
    p = run_cli(["cp", f"gdrive://{folder}/x/big.bin", str(back), "--endpoint", ds.ENDPOINT], env=env)
    assert p.returncode == 0, p.err
    assert back.read_bytes() == src.read_bytes()
