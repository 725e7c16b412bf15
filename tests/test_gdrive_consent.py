"""`bucketfs auth gdrive` (issue 24): the consent request carries PKCE (S256) and a random
`state`; the Drive emulator, like Google, refuses a code exchanged without the right verifier;
a pasted address whose state is not this request's is refused; `--gdrive-scope readonly` asks
for drive.readonly, and mounts with that token are read-only."""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import urllib.error
import urllib.parse
import urllib.request

import pytest

from conftest import is_mounted, new_mountpoint, run_cli, unmount
import drive_seed as ds
import test_gdrive
from test_gdrive import NO_CREDS, args, auth_flow, consent, drive_env

folder = test_gdrive.folder  # the fixture: a fresh folder on the emulator

RO = "https://www.googleapis.com/auth/drive.readonly"


def query(url: str) -> dict:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))


def exchange(code: str, **extra) -> tuple[int, dict]:
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": "http://localhost",
            "client_id": ds.CLIENT["client_id"], "client_secret": ds.CLIENT["client_secret"], **extra}
    req = urllib.request.Request(f"{ds.ENDPOINT}/token", urllib.parse.urlencode(form).encode(),
                                 {"Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_emulator_checks_the_pkce_verifier(folder):
    """The emulator's token endpoint, as Google's: a code from a consent with an S256
    challenge is exchanged only with the verifier it was made from."""
    verifier = base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()

    def code() -> str:
        q = urllib.parse.urlencode({"client_id": ds.CLIENT["client_id"], "redirect_uri": "http://localhost",
                                    "response_type": "code", "scope": "https://www.googleapis.com/auth/drive",
                                    "code_challenge": challenge, "code_challenge_method": "S256", "state": "s1"})
        back = query(consent(f"{ds.ENDPOINT}/o/oauth2/auth?{q}"))
        assert back["state"] == "s1"
        return back["code"]

    st, out = exchange(code())
    assert (st, out["error"]) == (400, "invalid_grant") and "verifier" in out["error_description"], out
    st, out = exchange(code(), code_verifier=verifier[:-1] + ("A" if verifier[-1] != "A" else "B"))
    assert (st, out["error"]) == (400, "invalid_grant"), out
    c = code()
    st, out = exchange(c, code_verifier=verifier)
    assert st == 200 and out["refresh_token"], out
    st, out = exchange(c, code_verifier=verifier)
    assert st == 400, "a code is good for one exchange"


def test_consent_carries_pkce_and_state(folder, tmp_path):
    """The CLI's consent address has an S256 challenge and a state; the exchange (checked by
    the emulator) succeeds; an address carrying another state is refused before any exchange."""
    url, proc, err = auth_flow(tmp_path)
    assert proc.returncode == 0, err
    q = query(url)
    assert q["code_challenge_method"] == "S256" and len(q["code_challenge"]) == 43, q
    assert len(q["state"]) >= 32 and q["scope"] == "https://www.googleapis.com/auth/drive", q
    url2, proc, err = auth_flow(tmp_path, tamper=lambda u: u.replace("state=", "state=x"))
    assert query(url2)["state"] != q["state"] and query(url2)["code_challenge"] != q["code_challenge"]
    assert proc.returncode == 1 and "state" in err.strip().splitlines()[-1], err


def test_readonly_scope_makes_a_read_only_mount(folder, tmp_path):
    """`--gdrive-scope readonly`: the consent asks for drive.readonly, the token file records
    it, a mount with it says it is read-only and refuses writes with EROFS while reads work;
    asking that mount for full access is refused; the emulator refuses writes by such a token."""
    ds.control("seed", {"name": "r.txt", "parent": folder, "content": "readable"})
    url, proc, err = auth_flow(tmp_path, "--gdrive-scope", "readonly")
    assert proc.returncode == 0, err
    assert query(url)["scope"] == RO
    saved = json.loads((tmp_path / "cfg" / "bucketfs" / "gdrive-token.json").read_text())
    assert saved["scope"] == RO and saved["refresh_token"] != ds.CLIENT["refresh_token"]

    env = drive_env(tmp_path, **NO_CREDS)
    mp = new_mountpoint()
    try:
        p = run_cli(["mount", *args(folder)[:1], mp, *args(folder)[1:]], env=env)
        assert p.returncode == 0, p.err
        assert "read-only" in p.err and "--gdrive-scope full" in p.err, p.err
        assert open(os.path.join(mp, "r.txt")).read() == "readable"
        with pytest.raises(OSError) as e:
            open(os.path.join(mp, "new.txt"), "w").close()
        assert e.value.errno == errno.EROFS
    finally:
        unmount(mp)
    assert not is_mounted(mp)
    mp = new_mountpoint()
    p = run_cli(["mount", *args(folder)[:1], mp, *args(folder)[1:], "--gdrive-scope", "full"], env=env)
    assert p.returncode != 0 and "read-only access" in p.err, p.err
    assert not is_mounted(mp)

    form = urllib.parse.urlencode({"grant_type": "refresh_token", "refresh_token": saved["refresh_token"],
                                   "client_id": ds.CLIENT["client_id"], "client_secret": ds.CLIENT["client_secret"]})
    with urllib.request.urlopen(f"{ds.ENDPOINT}/token", form.encode(), timeout=10) as r:
        tok = json.loads(r.read())["access_token"]
    req = urllib.request.Request(f"{ds.ENDPOINT}/drive/v3/files", json.dumps({"name": "x", "parents": [folder]}).encode(),
                                 {"Authorization": f"Bearer {tok}", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 403
