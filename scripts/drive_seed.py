"""A small Google Drive v3 client over urllib, independent of bucketfs, for the tests.

It talks to the Drive emulator (scripts/drive_emulator.py) at $BUCKETFS_TEST_DRIVE_ENDPOINT
(default http://127.0.0.1:4700) with the OAuth client in $BUCKETFS_GDRIVE_CLIENT_ID /
_CLIENT_SECRET / _REFRESH_TOKEN (the emulator's defaults otherwise). A test "bucket" is a
folder in My Drive; keys with `/` are paths through sub-folders. seed.py uses it for the
store name "gdrive"; tests/test_gdrive.py also uses its emulator controls.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request

ENDPOINT = os.environ.get("BUCKETFS_TEST_DRIVE_ENDPOINT", "http://127.0.0.1:4700").rstrip("/")
CLIENT = {
    "client_id": os.environ.get("BUCKETFS_GDRIVE_CLIENT_ID", "emu-client"),
    "client_secret": os.environ.get("BUCKETFS_GDRIVE_CLIENT_SECRET", "emu-secret"),
    "refresh_token": os.environ.get("BUCKETFS_GDRIVE_REFRESH_TOKEN", "emu-refresh"),
}
FOLDER = "application/vnd.google-apps.folder"
_lock = threading.Lock()
# Drive allows two folders of one name: seeding in parallel must not create a path twice.
_put_lock = threading.Lock()
_token: list[str] = []
_buckets: dict[str, str] = {}  # bucket name -> folder id


def env() -> dict:
    """The environment variables bucketfs needs to reach the emulator."""
    return {"BUCKETFS_GDRIVE_CLIENT_ID": CLIENT["client_id"], "BUCKETFS_GDRIVE_CLIENT_SECRET": CLIENT["client_secret"],
            "BUCKETFS_GDRIVE_REFRESH_TOKEN": CLIENT["refresh_token"]}


def _raw(method: str, url: str, data: bytes | None = None, headers: dict | None = None):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def control(op: str, body: dict | None = None) -> dict:
    st, out, _ = _raw("POST" if op != "stats" else "GET", f"{ENDPOINT}/_control/{op}",
                      json.dumps(body or {}).encode() if op != "stats" else None)
    assert st == 200, (op, st, out)
    return json.loads(out or b"{}")


def token() -> str:
    with _lock:
        if not _token:
            form = urllib.parse.urlencode({"grant_type": "refresh_token", **CLIENT}).encode()
            st, out, _ = _raw("POST", f"{ENDPOINT}/token", form, {"Content-Type": "application/x-www-form-urlencoded"})
            assert st == 200, f"emulator token: {st} {out[:200]!r}"
            _token.append(json.loads(out)["access_token"])
        return _token[0]


def api(method: str, path: str, query: dict | None = None, body=None, headers: dict | None = None, raw: bool = False):
    """(status, parsed JSON or bytes). Retries once with a new token after a 401."""
    url = ENDPOINT + path + ("?" + urllib.parse.urlencode(query) if query else "")
    if isinstance(body, (dict, list)):
        body, headers = json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
    for _ in range(2):
        st, out, _ = _raw(method, url, body, {"Authorization": f"Bearer {token()}", **(headers or {})})
        if st != 401:
            break
        with _lock:
            _token.clear()
    return st, (out if raw or not out else json.loads(out))


def find_files(q: str) -> list[dict]:
    """Every file matching a Drive query, page after page (a folder may hold more than one
    page of 1,000)."""
    files, page = [], None
    while True:
        args = {"q": q, "pageSize": "1000"}
        if page:
            args["pageToken"] = page
        st, out = api("GET", "/drive/v3/files", args)
        assert st == 200, out
        files += out["files"]
        page = out.get("nextPageToken")
        if not page:
            return files


def children(folder: str) -> list[dict]:
    return find_files(f"'{folder}' in parents and trashed=false")


def child(folder: str, name: str, folder_only: bool = False) -> dict | None:
    # Asked by name: listing the whole folder for each put made seeding quadratic.
    quoted = name.replace("\\", "\\\\").replace("'", "\\'")
    hits = find_files(f"'{folder}' in parents and name = '{quoted}' and trashed=false")
    hits = [f for f in hits if f["name"] == name and (not folder_only or f["mimeType"] == FOLDER)]
    return hits[0] if hits else None


def create(name: str, parent: str, data: bytes | None = None, mime: str | None = None) -> dict:
    """A new file (multipart upload) or, with data None and mime unset, a folder."""
    meta = {"name": name, "parents": [parent]}
    if data is None:
        st, out = api("POST", "/drive/v3/files", body={**meta, "mimeType": mime or FOLDER})
    else:
        b = "seedboundary"
        if mime:
            meta["mimeType"] = mime
        payload = (f"--{b}\r\nContent-Type: application/json\r\n\r\n{json.dumps(meta)}\r\n--{b}\r\n"
                   f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{b}--\r\n".encode()
        st, out = api("POST", "/upload/drive/v3/files", {"uploadType": "multipart"}, payload,
                      {"Content-Type": f"multipart/related; boundary={b}"})
    assert st == 200, out
    return out


def folder_of(bucket: str, path: str, create_missing: bool = True) -> str | None:
    fid = _buckets[bucket]
    for seg in [s for s in path.split("/") if s]:
        f = child(fid, seg, folder_only=True)
        if f is None:
            if not create_missing:
                return None
            f = create(seg, fid)
        fid = f["id"]
    return fid


def _split(key: str) -> tuple[str, str]:
    d, _, n = key.rpartition("/")
    return d, n


def make_bucket(name: str) -> None:
    _buckets[name] = create(name, "root")["id"]


def put(bucket: str, key: str, data: bytes) -> None:
    if key.endswith("/"):  # a directory marker: a folder
        with _put_lock:
            folder_of(bucket, key)
        return
    d, n = _split(key)
    with _put_lock:
        parent = folder_of(bucket, d)
        old = child(parent, n)
        if not old:
            create(n, parent, data)
            return
    st, out = api("PATCH", f"/upload/drive/v3/files/{old['id']}", {"uploadType": "media"}, data)
    assert st == 200, out


def lookup(bucket: str, key: str) -> dict | None:
    d, n = _split(key)
    parent = folder_of(bucket, d, create_missing=False)
    return child(parent, n) if parent else None


def get(bucket: str, key: str) -> bytes:
    f = lookup(bucket, key)
    if f is None:
        raise FileNotFoundError(key)
    st, out = api("GET", f"/drive/v3/files/{f['id']}", {"alt": "media"}, raw=True)
    assert st == 200, out
    return out


def head(bucket: str, key: str) -> dict:
    from datetime import datetime
    f = lookup(bucket, key)
    if f is None:
        raise FileNotFoundError(key)
    t = datetime.fromisoformat(f["modifiedTime"].replace("Z", "+00:00")).timestamp()
    return {"size": int(f.get("size", 0)), "mtime": t}


def list_keys(bucket: str, prefix: str = "") -> list[str]:
    out, todo = [], [(_buckets[bucket], "")]
    while todo:
        fid, at = todo.pop()
        kids = children(fid)
        if not kids and at:
            out.append(at)  # an empty folder stands for a marker object, as on the file store
        for f in kids:
            if f["mimeType"] == FOLDER:
                todo.append((f["id"], f"{at}{f['name']}/"))
            else:
                out.append(at + f["name"])
    return sorted(k for k in out if k.startswith(prefix))


def delete(bucket: str, key: str) -> None:
    f = lookup(bucket, key)
    if f:
        api("DELETE", f"/drive/v3/files/{f['id']}")


def delete_bucket(bucket: str) -> None:
    fid = _buckets.pop(bucket, None)
    if fid:
        api("DELETE", f"/drive/v3/files/{fid}")


def mount_url(bucket: str, prefix: str = "") -> str:
    fid = folder_of(bucket, prefix) if prefix.strip("/") else _buckets[bucket]
    return f"gdrive://{fid}"
