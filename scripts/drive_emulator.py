#!/usr/bin/env python3
"""A small in-memory Google Drive v3 API *emulator* for bucketfs's tests (stdlib only).

It is not Google Drive: it implements the subset bucketfs uses, the way Drive documents it:
  GET    /drive/v3/files                 list (q: 'ID' in parents, trashed=false, name='..'
                                         joined by `and`; pageSize/pageToken)
  GET    /drive/v3/files/ID              metadata; alt=media (Range -> 206)
  GET    /drive/v3/files/ID/export       Google Docs/Sheets/Slides export (mimeType=)
  POST   /drive/v3/files                 create metadata only (folders)
  POST   /drive/v3/files/ID/copy         copy
  PATCH  /drive/v3/files/ID              rename, trash, addParents/removeParents
  DELETE /drive/v3/files/ID              permanent delete
  POST   /upload/drive/v3/files          uploadType=media|multipart|resumable
  PATCH  /upload/drive/v3/files/ID       new content (same upload types)
  PUT    <resumable session URL>         chunk upload (Content-Range), 308 until complete
  GET    /drive/v3/changes/startPageToken, GET /drive/v3/changes
  POST   /token                          refresh_token, authorization_code and JWT-bearer
                                         (RS256 signature checked) grants
  GET    /o/oauth2/auth                  "consent": redirects to redirect_uri?code=...
Every API call needs `Authorization: Bearer <token from /token>`.

Test control (no auth): POST /_control/{reset,seed,fail,expire_tokens,sa_key}, GET /_control/stats.
  seed: {"name", "parent"?, "mimeType"?, "content"?(text), "trashed"?} -> the file resource
  fail: {"count": N, "status": 403, "reason": "userRateLimitExceeded"} -> next N API calls fail
  sa_key: {"email", "n", "e"} (hex modulus, int exponent) registers a service-account key

Usage: drive_emulator.py --port 4700 --client-id ID --client-secret S --refresh-token R
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import itertools
import json
import re
import secrets
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FOLDER = "application/vnd.google-apps.folder"
GOOGLE_APPS = "application/vnd.google-apps."
EXPORTS = {
    "application/vnd.google-apps.document": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "application/vnd.google-apps.spreadsheet": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "application/vnd.google-apps.presentation": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
}
ROOT_ID = "0AROOTFOLDERxxxxxxxxxxxxxxxxxxxx"


def now_rfc3339() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%03dZ" % int((t % 1) * 1000)


class Drive:
    """The state: files by id, the change log, tokens, injected failures."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.lock = threading.RLock()
        self.reset()

    def reset(self):
        with self.lock:
            self.files: dict[str, dict] = {}
            self.content: dict[str, bytes] = {}
            self.changes: list[tuple[int, str]] = []  # (change number, file id)
            self.next_change = 1
            self.tokens: set[str] = set()
            self.fail: list[tuple[int, str]] = []
            self.uploads: dict[str, dict] = {}
            self.codes: set[str] = set()
            self.sa_keys: dict[str, tuple[int, int]] = {}
            self.stats = {"requests": 0, "failed_injected": 0, "token_grants": {}}
            self.ids = itertools.count(1)
            self.files[ROOT_ID] = {"id": ROOT_ID, "name": "My Drive", "mimeType": FOLDER, "parents": [],
                                   "trashed": False, "createdTime": now_rfc3339(), "modifiedTime": now_rfc3339(),
                                   "version": "1"}

    def new_id(self) -> str:
        return "1" + secrets.token_hex(4) + "%08d" % next(self.ids) + "x" * 16

    def record(self, fid: str):
        self.changes.append((self.next_change, fid))
        self.next_change += 1

    def resolve(self, fid: str) -> str:
        return ROOT_ID if fid == "root" else fid

    def create(self, meta: dict, data: bytes | None) -> dict:
        with self.lock:
            fid = self.new_id()
            mime = meta.get("mimeType") or "application/octet-stream"
            parents = [self.resolve(p) for p in (meta.get("parents") or [ROOT_ID])]
            for p in parents:
                if p not in self.files or self.files[p]["mimeType"] != FOLDER:
                    raise ApiError(404, "notFound", f"File not found: {p}.")
            t = meta.get("createdTime") or now_rfc3339()
            f = {"id": fid, "name": meta.get("name") or "Untitled", "mimeType": mime, "parents": parents,
                 "trashed": bool(meta.get("trashed")), "createdTime": t, "modifiedTime": meta.get("modifiedTime") or t,
                 "version": "1"}
            set_properties(f, meta)
            self.files[fid] = f
            if mime != FOLDER:
                self.set_content(f, data or b"")
            self.record(fid)
            return f

    def set_content(self, f: dict, data: bytes):
        self.content[f["id"]] = data
        if not f["mimeType"].startswith(GOOGLE_APPS):
            f["size"] = str(len(data))
            f["md5Checksum"] = hashlib.md5(data).hexdigest()

    def touch(self, f: dict):
        f["version"] = str(int(f["version"]) + 1)
        f["modifiedTime"] = now_rfc3339()
        self.record(f["id"])

    def get(self, fid: str) -> dict:
        f = self.files.get(self.resolve(fid))
        if f is None:
            raise ApiError(404, "notFound", f"File not found: {fid}.")
        return f


class ApiError(Exception):
    def __init__(self, status, reason, message):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def set_properties(f: dict, meta: dict):
    """Drive's `properties`: keys in a create or update are merged in; a null value removes one."""
    for k, v in (meta.get("properties") or {}).items():
        props = f.setdefault("properties", {})
        if v is None:
            props.pop(k, None)
        else:
            props[k] = str(v)


def match_query(f: dict, q: str) -> bool:
    for clause in [c.strip() for c in re.split(r"\s+and\s+", q) if c.strip()]:
        m = re.fullmatch(r"'([^']*)'\s+in\s+parents", clause)
        if m:
            pid = ROOT_ID if m.group(1) == "root" else m.group(1)
            if pid not in f["parents"]:
                return False
            continue
        m = re.fullmatch(r"trashed\s*=\s*(true|false)", clause)
        if m:
            if f["trashed"] != (m.group(1) == "true"):
                return False
            continue
        m = re.fullmatch(r"(name|mimeType)\s*(=|!=)\s*'((?:[^'\\]|\\.)*)'", clause)
        if m:
            val = m.group(3).replace("\\'", "'").replace("\\\\", "\\")
            if (f.get(m.group(1)) == val) != (m.group(2) == "="):
                return False
            continue
        raise ApiError(400, "invalid", f"Invalid Value: unsupported query clause {clause!r}")
    return True


def parse_multipart(body: bytes, ctype: str) -> tuple[dict, bytes]:
    m = re.search(r'boundary="?([^";]+)"?', ctype)
    if not m:
        raise ApiError(400, "badContent", "multipart upload without a boundary")
    parts = body.split(b"--" + m.group(1).encode())
    out = []
    for p in parts[1:]:
        if p.startswith(b"--"):
            break
        head, _, data = p.partition(b"\r\n\r\n")
        out.append(data[:-2] if data.endswith(b"\r\n") else data)
    if len(out) != 2:
        raise ApiError(400, "badContent", "multipart upload needs a metadata part and a media part")
    return json.loads(out[0] or b"{}"), out[1]


def verify_rs256(jwt: str, keys: dict) -> dict:
    try:
        h, p, s = jwt.split(".")
        pad = lambda x: x + "=" * (-len(x) % 4)  # noqa: E731
        claims = json.loads(base64.urlsafe_b64decode(pad(p)))
        header = json.loads(base64.urlsafe_b64decode(pad(h)))
        sig = int.from_bytes(base64.urlsafe_b64decode(pad(s)), "big")
    except Exception as e:
        raise ApiError(400, "invalid_grant", f"malformed assertion: {e}")
    if header.get("alg") != "RS256" or claims.get("iss") not in keys:
        raise ApiError(400, "invalid_grant", "unknown issuer or algorithm")
    n, e = keys[claims["iss"]]
    k = (n.bit_length() + 7) // 8
    em = pow(sig, e, n).to_bytes(k, "big")
    digest_info = bytes.fromhex("3031300d060960864801650304020105000420") + hashlib.sha256(f"{h}.{p}".encode()).digest()
    expected = b"\x00\x01" + b"\xff" * (k - 3 - len(digest_info)) + b"\x00" + digest_info
    if em != expected:
        raise ApiError(400, "invalid_grant", "Invalid JWT Signature.")
    if not (claims.get("exp", 0) > time.time() - 60 and "drive" in claims.get("scope", "")):
        raise ApiError(400, "invalid_grant", "expired assertion or no drive scope")
    return claims


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    drive: Drive

    def log_message(self, fmt, *args):  # quiet; tests read /_control/stats instead
        pass

    # ------------------------------------------------------------------ plumbing
    def send(self, status: int, obj=None, body: bytes | None = None, headers: dict | None = None):
        if obj is not None:
            body = json.dumps(obj).encode()
            headers = {"Content-Type": "application/json; charset=UTF-8", **(headers or {})}
        body = body or b""
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, e: ApiError):
        self.send(e.status, {"error": {"code": e.status, "message": e.message,
                                       "errors": [{"domain": "usageLimits" if "RateLimit" in e.reason else "global",
                                                   "reason": e.reason, "message": e.message}]}})

    def body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def handle_any(self):
        d = self.drive
        url = urllib.parse.urlsplit(self.path)
        path, qs = url.path, dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        data = self.body()
        try:
            if path.startswith("/_control/"):
                return self.control(path[len("/_control/"):], data)
            if path == "/token":
                return self.token(dict(urllib.parse.parse_qsl(data.decode())))
            if path == "/o/oauth2/auth":
                return self.consent(qs)
            with d.lock:
                d.stats["requests"] += 1
                auth = self.headers.get("Authorization", "")
                if not auth.startswith("Bearer ") or auth[7:] not in d.tokens:
                    raise ApiError(401, "authError", "Request had invalid authentication credentials.")
                if d.fail:
                    status, reason = d.fail.pop(0)
                    d.stats["failed_injected"] += 1
                    raise ApiError(status, reason, "Rate limit exceeded (injected by the emulator).")
            return self.api(path, qs, data)
        except ApiError as e:
            return self.error(e)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = handle_any

    # ------------------------------------------------------------------ auth
    def token(self, form: dict):
        d, cfg = self.drive, self.drive.cfg
        grant = form.get("grant_type", "")
        if grant == "refresh_token":
            if (form.get("client_id"), form.get("client_secret"), form.get("refresh_token")) != \
                    (cfg.client_id, cfg.client_secret, cfg.refresh_token):
                raise ApiError(400, "invalid_grant", "Bad client or refresh token.")
            out = {}
        elif grant == "authorization_code":
            if (form.get("client_id"), form.get("client_secret")) != (cfg.client_id, cfg.client_secret) \
                    or form.get("code") not in d.codes:
                raise ApiError(400, "invalid_grant", "Bad client or code.")
            d.codes.discard(form["code"])
            out = {"refresh_token": cfg.refresh_token}
        elif grant == "urn:ietf:params:oauth:grant-type:jwt-bearer":
            verify_rs256(form.get("assertion", ""), d.sa_keys)
            out = {}
        else:
            raise ApiError(400, "unsupported_grant_type", f"grant_type {grant!r}")
        tok = "ya29.emu-" + secrets.token_hex(12)
        with d.lock:
            d.tokens.add(tok)
            d.stats["token_grants"][grant] = d.stats["token_grants"].get(grant, 0) + 1
        self.send(200, {"access_token": tok, "expires_in": 3599, "token_type": "Bearer", **out})

    def consent(self, qs: dict):
        if qs.get("client_id") != self.drive.cfg.client_id or qs.get("response_type") != "code":
            raise ApiError(400, "invalid_request", "unknown client_id or response_type")
        code = "4/emu-" + secrets.token_hex(8)
        self.drive.codes.add(code)
        sep = "&" if "?" in qs.get("redirect_uri", "") else "?"
        self.send(302, headers={"Location": f"{qs.get('redirect_uri')}{sep}code={code}&scope=drive"})

    # ------------------------------------------------------------------ control
    def control(self, op: str, data: bytes):
        d = self.drive
        arg = json.loads(data or b"{}")
        with d.lock:
            if op == "reset":
                d.reset()
                return self.send(200, {})
            if op == "seed":
                content = arg.pop("content", "").encode()
                f = d.create({**arg, "parents": [arg.pop("parent", ROOT_ID)]}, content)
                return self.send(200, f)
            if op == "fail":
                d.fail += [(arg.get("status", 403), arg.get("reason", "userRateLimitExceeded"))] * arg.get("count", 1)
                return self.send(200, {})
            if op == "expire_tokens":
                d.tokens.clear()
                return self.send(200, {})
            if op == "sa_key":
                d.sa_keys[arg["email"]] = (int(arg["n"], 16), int(arg.get("e", 65537)))
                return self.send(200, {})
            if op == "stats":
                return self.send(200, {**d.stats, "pending_failures": len(d.fail)})
        raise ApiError(404, "notFound", f"no control op {op}")

    # ------------------------------------------------------------------ the API
    def api(self, path: str, qs: dict, data: bytes):
        d, m = self.drive, self.command
        if path == "/drive/v3/changes/startPageToken":
            return self.send(200, {"startPageToken": str(d.next_change)})
        if path == "/drive/v3/changes" and m == "GET":
            return self.changes(qs)
        if path == "/drive/v3/files" and m == "GET":
            return self.list(qs)
        if path == "/drive/v3/files" and m == "POST":
            return self.send(200, d.create(json.loads(data or b"{}"), b""))
        if path.startswith("/upload/drive/v3/files"):
            return self.upload(path[len("/upload/drive/v3/files"):].strip("/"), qs, data)
        mm = re.fullmatch(r"/drive/v3/files/([^/]+)(/export|/copy)?", path)
        if not mm:
            raise ApiError(404, "notFound", f"no such API path {path}")
        fid, sub = mm.group(1), mm.group(2)
        with d.lock:
            f = d.get(fid)
            if sub == "/export":
                if f["mimeType"] not in EXPORTS or qs.get("mimeType") != EXPORTS[f["mimeType"]]:
                    raise ApiError(400, "badRequest", "Export only supports Docs Editors files (or bad mimeType).")
                return self.send(200, body=d.content[f["id"]], headers={"Content-Type": qs["mimeType"]})
            if sub == "/copy":
                meta = json.loads(data or b"{}")
                g = d.create({"name": meta.get("name", f["name"]), "parents": meta.get("parents", f["parents"]),
                              "mimeType": f["mimeType"]}, d.content.get(f["id"], b""))
                return self.send(200, g)
            if m == "GET" and qs.get("alt") == "media":
                return self.media(f)
            if m == "GET":
                return self.send(200, f)
            if m == "DELETE":
                self.delete_tree(f["id"])
                return self.send(204)
            if m == "PATCH":
                return self.send(200, self.patch(f, json.loads(data or b"{}"), qs))
        raise ApiError(405, "badRequest", f"{m} {path}")

    def delete_tree(self, fid: str):
        d = self.drive
        for c in [c for c in d.files.values() if fid in c["parents"]]:
            self.delete_tree(c["id"])
        d.files.pop(fid, None)
        d.content.pop(fid, None)
        d.record(fid)

    def patch(self, f: dict, meta: dict, qs: dict) -> dict:
        d = self.drive
        if "name" in meta:
            f["name"] = meta["name"]
        if "trashed" in meta:
            f["trashed"] = bool(meta["trashed"])
        set_properties(f, meta)
        for p in filter(None, qs.get("removeParents", "").split(",")):
            f["parents"] = [x for x in f["parents"] if x != d.resolve(p)]
        for p in filter(None, qs.get("addParents", "").split(",")):
            f["parents"].append(d.get(p)["id"])
        d.touch(f)
        return f

    def media(self, f: dict):
        if f["mimeType"].startswith(GOOGLE_APPS):
            raise ApiError(403, "fileNotDownloadable", "Only files with binary content can be downloaded. Use Export with Docs Editors files.")
        data = self.drive.content[f["id"]]
        rng = self.headers.get("Range")
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "")
        if not m:
            return self.send(200, body=data, headers={"Content-Type": f["mimeType"]})
        a = int(m.group(1))
        b = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
        if a >= len(data):
            return self.send(416, body=b"", headers={"Content-Range": f"bytes */{len(data)}"})
        return self.send(206, body=data[a:b + 1], headers={"Content-Range": f"bytes {a}-{b}/{len(data)}"})

    def list(self, qs: dict):
        d = self.drive
        size = max(1, min(int(qs.get("pageSize") or 100), 1000))
        start = int(qs.get("pageToken") or 0)
        q = qs.get("q", "")
        with d.lock:
            hits = [f for f in d.files.values() if f["id"] != ROOT_ID and match_query(f, q)]
        page = hits[start:start + size]
        out = {"kind": "drive#fileList", "files": page}
        if start + size < len(hits):
            out["nextPageToken"] = str(start + size)
        return self.send(200, out)

    def changes(self, qs: dict):
        d = self.drive
        if not qs.get("pageToken"):
            raise ApiError(400, "required", "Required parameter: pageToken")
        start, size = int(qs["pageToken"]), max(1, min(int(qs.get("pageSize") or 100), 1000))
        with d.lock:
            todo = [(n, fid) for n, fid in d.changes if n >= start]
            page = todo[:size]
            out = {"kind": "drive#changeList", "changes": []}
            for n, fid in page:
                f = d.files.get(fid)
                ch = {"kind": "drive#change", "changeType": "file", "fileId": fid, "removed": f is None,
                      "time": now_rfc3339()}
                if f is not None:
                    ch["file"] = f
                out["changes"].append(ch)
            if len(todo) > size:
                out["nextPageToken"] = str(page[-1][0] + 1)
            else:
                out["newStartPageToken"] = str(d.next_change)
        return self.send(200, out)

    def upload(self, fid: str, qs: dict, data: bytes):
        d, m = self.drive, self.command
        kind = qs.get("uploadType", "media")
        if kind == "resumable" and qs.get("upload_id"):
            return self.resumable_chunk(qs["upload_id"], data)
        if kind == "resumable":
            sid = secrets.token_hex(8)
            d.uploads[sid] = {"fid": fid, "meta": json.loads(data or b"{}"), "data": bytearray()}
            loc = f"http://{self.headers.get('Host')}/upload/drive/v3/files{'/' + fid if fid else ''}?uploadType=resumable&upload_id={sid}"
            return self.send(200, body=b"", headers={"Location": loc})
        if kind == "multipart":
            meta, content = parse_multipart(data, self.headers.get("Content-Type", ""))
        elif kind == "media":
            meta, content = {}, data
        else:
            raise ApiError(400, "badRequest", f"uploadType {kind!r}")
        return self.send(200, self.finish_upload(fid if m == "PATCH" else "", meta, content))

    def finish_upload(self, fid: str, meta: dict, content: bytes) -> dict:
        d = self.drive
        with d.lock:
            if not fid:
                return d.create(meta, content)
            f = d.get(fid)
            if f["mimeType"].startswith(GOOGLE_APPS):
                raise ApiError(403, "fileNotWritable", "Docs Editors files cannot take binary content here.")
            if "name" in meta:
                f["name"] = meta["name"]
            set_properties(f, meta)
            d.set_content(f, content)
            d.touch(f)
            return f

    def resumable_chunk(self, sid: str, data: bytes):
        d = self.drive
        up = d.uploads.get(sid)
        if up is None:
            raise ApiError(404, "notFound", "No such upload session.")
        if self.command == "DELETE":
            d.uploads.pop(sid, None)
            return self.send(204)
        cr = self.headers.get("Content-Range", "")
        m = re.fullmatch(r"bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)", cr)
        if not m:
            raise ApiError(400, "badRequest", f"bad Content-Range {cr!r}")
        if m.group(1) is not None:
            if int(m.group(1)) != len(up["data"]) or int(m.group(2)) - int(m.group(1)) + 1 != len(data):
                raise ApiError(400, "badRequest", "chunk does not continue the upload")
            if m.group(3) == "*" and len(data) % (256 * 1024):
                raise ApiError(400, "badRequest", "non-final chunks must be multiples of 256 KiB")
            up["data"] += data
        total = m.group(3)
        if total != "*" and int(total) == len(up["data"]):
            d.uploads.pop(sid, None)
            return self.send(200, self.finish_upload(up["fid"], up["meta"], bytes(up["data"])))
        hdr = {"Range": f"bytes=0-{len(up['data']) - 1}"} if up["data"] else {}
        return self.send(308, body=b"", headers=hdr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=4700)
    ap.add_argument("--client-id", default="emu-client")
    ap.add_argument("--client-secret", default="emu-secret")
    ap.add_argument("--refresh-token", default="emu-refresh")
    cfg = ap.parse_args()
    Handler.drive = Drive(cfg)
    srv = ThreadingHTTPServer((cfg.host, cfg.port), Handler)
    srv.daemon_threads = True
    print(f"drive emulator on http://{cfg.host}:{cfg.port}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
