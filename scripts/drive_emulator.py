#!/usr/bin/env python3
"""A small in-memory Google Drive v3 API *emulator* for bucketfs's tests (stdlib only).

It is not Google Drive: it implements the subset bucketfs uses, the way Drive documents it:
  GET    /drive/v3/files                 list (q: 'ID' in parents, trashed=false, name='..'
                                         joined by `and`; pageSize/pageToken)
  GET    /drive/v3/files/ID              metadata; alt=media (Range -> 206)
  GET    /drive/v3/files/ID/export       Google Docs/Sheets/Slides export (mimeType=)
  POST   /drive/v3/files                 create metadata only (folders)
  POST   /drive/v3/files/ID/copy         copy
  GET    /drive/v3/files/generateIds     IDs for creates and copies (a used one: 409)
  PATCH  /drive/v3/files/ID              rename, trash, addParents/removeParents
  DELETE /drive/v3/files/ID              permanent delete
  POST   /upload/drive/v3/files          uploadType=media|multipart|resumable
  PATCH  /upload/drive/v3/files/ID       new content (same upload types)
  PUT    <resumable session URL>         chunk upload (Content-Range), 308 until complete
  GET    /drive/v3/changes/startPageToken, GET /drive/v3/changes
  POST   /token                          refresh_token, authorization_code and JWT-bearer
                                         (RS256 signature checked) grants
  GET    /o/oauth2/auth                  "consent": redirects to redirect_uri?code=...&state=...;
                                         PKCE (code_challenge, S256 or plain) is checked at /token;
                                         scope drive.readonly gives tokens that may only read
Every API call needs `Authorization: Bearer <token from /token>`.

Test control (no auth): POST /_control/{reset,seed,fail,expire_tokens,sa_key,throttle,token_fail,
drive_change,shared_drive,short_chunk}, GET /_control/stats.
  seed: {"name", "parent"?, "mimeType"?, "content"?(text), "content_size"?(N bytes), "trashed"?,
         "abusive"?} -> the file resource
  fail: {"count": N, "status": 403, "reason": "userRateLimitExceeded", "method"?, "path"?(regex on
         path?query), "after"?} -> the next N matching API calls fail; with "after" the call is
         done first and only its answer is the error ("do the work, then fail"); {"clear": true}
         drops the pending ones
  throttle: {"seconds", "status"?, "reason"?} -> every API call is throttled for that long
  token_fail: {"count", "status", "error"?} -> the next N token requests fail
  drive_change: {"driveId"?} -> a changeType "drive" entry in the changes feed
  shared_drive: {"name"} -> a new shared drive (its ID is its root folder's ID)
  short_chunk: {"keep": N} -> the next non-final resumable chunk stores only its first N bytes
  sa_key: {"email", "n", "e"} (hex modulus, int exponent) registers a service-account key

Where it follows Drive more strictly than a toy would, the page it follows is named next to the
code (developers.google.com/drive/api/...).

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
# https://developers.google.com/drive/api/reference/rest/v3/files/export: "the exported content
# is limited to 10MB"; above it Drive answers 403 exportSizeLimitExceeded.
EXPORT_LIMIT = 10 * 1024 * 1024
# The fields a `fields` selector may name (https://developers.google.com/drive/api/guides/fields-parameter:
# an unknown field is a 400 "Invalid field selection").
FILE_KEYS = {"kind", "id", "name", "mimeType", "parents", "size", "md5Checksum", "modifiedTime", "createdTime",
             "version", "trashed", "properties", "appProperties", "driveId", "shortcutDetails", "exportLinks",
             "capabilities", "owners", "quotaBytesUsed", "headRevisionId", "webViewLink", "description",
             "starred", "explicitlyTrashed", "ownedByMe", "fileExtension", "fullFileExtension", "originalFilename",
             "sha1Checksum", "sha256Checksum", "teamDriveId", "spaces"}
SHAPES = {
    "file": {k: None for k in FILE_KEYS},
    "list": {"kind": None, "nextPageToken": None, "incompleteSearch": None, "files": "file"},
    "change": {"kind": None, "changeType": None, "fileId": None, "removed": None, "time": None, "driveId": None,
               "file": "file", "drive": None, "teamDriveId": None, "type": None},
    "changes": {"kind": None, "nextPageToken": None, "newStartPageToken": None, "changes": "change"},
}


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
            self.changes: list[tuple] = []  # (change number, "file"|"drive", id, shared drive id)
            self.next_change = 1
            self.tokens: set[str] = set()
            self.fail: list[dict] = []
            self.throttle_until, self.throttle = 0.0, (429, "rateLimitExceeded")
            self.token_fail: list[tuple[int, str]] = []
            self.short_chunk: int | None = None
            self.drives: dict[str, str] = {}  # shared drive id -> name
            self.token_grant: dict[str, str] = {}
            self.abusive: set[str] = set()
            self.uploads: dict[str, dict] = {}
            self.codes: dict[str, dict] = {}  # code -> its consent's PKCE challenge and scope
            self.refresh_scopes: dict[str, str] = {}  # refresh tokens issued by consents, besides cfg's
            self.token_scope: dict[str, str] = {}
            self.sa_keys: dict[str, tuple[int, int]] = {}
            self.stats = {"requests": 0, "failed_injected": 0, "token_grants": {}}
            self.ids = itertools.count(1)
            self.files[ROOT_ID] = {"id": ROOT_ID, "name": "My Drive", "mimeType": FOLDER, "parents": [],
                                   "trashed": False, "createdTime": now_rfc3339(), "modifiedTime": now_rfc3339(),
                                   "version": "1"}

    def new_id(self) -> str:
        return "1" + secrets.token_hex(4) + "%08d" % next(self.ids) + "x" * 16

    def record(self, fid: str, kind: str = "file"):
        self.changes.append((self.next_change, kind, fid, self.drive_of(fid) if kind == "file" else fid))
        self.next_change += 1

    def drive_of(self, fid: str) -> str | None:
        """The shared drive an item is in (None: My Drive)."""
        f = self.files.get(fid)
        return f.get("driveId") if f else None

    def resolve(self, fid: str) -> str:
        return ROOT_ID if fid == "root" else fid

    def create(self, meta: dict, data: bytes | None) -> dict:
        with self.lock:
            fid = meta.get("id") or self.new_id()
            if fid in self.files:
                # https://developers.google.com/drive/api/reference/rest/v3/files/generateIds: an ID
                # from generateIds may be given in a create or copy; one already used is a 409.
                raise ApiError(409, "duplicate", "A file already exists with the provided ID.")
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
            if self.drive_of(parents[0]):
                f["driveId"] = self.drive_of(parents[0])
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


def compile_query(q: str):
    """A `q` as a predicate on a file, parsed once (a listing tests every file held)."""
    preds = []
    # Split on `and` outside quoted values: a name may hold " and " itself.
    parts = re.split(r"('(?:[^'\\]|\\.)*')", q)
    marked = "".join(p if i % 2 else re.sub(r"\s+and\s+", "\0", p) for i, p in enumerate(parts))
    for clause in [c.strip() for c in marked.split("\0") if c.strip()]:
        m = re.fullmatch(r"'([^']*)'\s+in\s+parents", clause)
        if m:
            pid = ROOT_ID if m.group(1) == "root" else m.group(1)
            preds.append(lambda f, pid=pid: pid in f["parents"])
            continue
        m = re.fullmatch(r"trashed\s*=\s*(true|false)", clause)
        if m:
            want = m.group(1) == "true"
            preds.append(lambda f, want=want: f["trashed"] == want)
            continue
        m = re.fullmatch(r"(name|mimeType)\s*(=|!=)\s*'((?:[^'\\]|\\.)*)'", clause)
        if m:
            val = m.group(3).replace("\\'", "'").replace("\\\\", "\\")
            field, eq = m.group(1), m.group(2) == "="
            preds.append(lambda f, field=field, val=val, eq=eq: (f.get(field) == val) == eq)
            continue
        raise ApiError(400, "invalid", f"Invalid Value: unsupported query clause {clause!r}")
    return lambda f: all(p(f) for p in preds)


def parse_fields(sel: str) -> dict:
    """A `fields` selector as a tree: `a,b(c,d/e)` -> {"a": None, "b": {"c": None, "d": {"e": None}}}."""
    out: dict = {}
    depth, start, items = 0, 0, []
    for i, ch in enumerate(sel + ","):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(sel[start:i].strip())
            start = i + 1
    if depth:
        raise ApiError(400, "invalidParameter", f"Invalid field selection {sel}")
    for it in filter(None, items):
        if "(" in it.split("/")[0]:
            name, inner = it.split("(", 1)
            out[name.strip()] = parse_fields(inner[:-1])
        elif "/" in it:
            name, rest = it.split("/", 1)
            out.setdefault(name, {}).update(parse_fields(rest))
        else:
            out[it] = None
    return out


def select(obj, sel: dict | None, shape: str):
    """Check a parsed selector against `shape` (400 for a field Drive does not have) and keep
    only the selected fields, as Drive answers (https://developers.google.com/drive/api/guides/fields-parameter).
    Without a `fields` parameter this emulator answers whole resources (Drive gives a default subset)."""
    if sel is None or "*" in sel:
        return obj
    kinds = SHAPES[shape]
    for k, sub in sel.items():
        if k not in kinds:
            raise ApiError(400, "invalidParameter", f"Invalid field selection {k}")
        if sub and kinds[k]:
            select(None, sub, kinds[k])
    if obj is None:
        return None
    out = {}
    for k, sub in sel.items():
        if k not in obj:
            continue
        v, inner = obj[k], kinds[k]
        if sub and inner:
            v = [select(x, sub, inner) for x in v] if isinstance(v, list) else select(v, sub, inner)
        out[k] = v
    return out


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


SCOPE_FULL = "https://www.googleapis.com/auth/drive"
SCOPE_READONLY = "https://www.googleapis.com/auth/drive.readonly"


def check_pkce(asked: dict, verifier: str | None):
    """The code exchange of a consent that sent a PKCE challenge must carry the verifier it was
    made from (RFC 7636 section 4.6; Google: developers.google.com/identity/protocols/oauth2/
    native-app#exchange-authorization-code, which sends `code_verifier` with the code and answers
    `invalid_grant` when it does not match)."""
    if not asked.get("challenge"):
        return
    if not verifier:
        raise ApiError(400, "invalid_grant", "Missing code verifier.")
    if asked["method"] == "S256":
        made = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    else:
        made = verifier
    if not secrets.compare_digest(made, asked["challenge"]):
        raise ApiError(400, "invalid_grant", "Invalid code verifier.")


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
        after, self.after_fail = getattr(self, "after_fail", None), None
        if after and status < 400:
            # "Do the work, then fail": the change is made, the client sees only the error
            # (a 5xx or a dropped answer after a create: https://developers.google.com/drive/api/guides/handle-errors).
            return self.error(ApiError(after[0], after[1], "Backend error after the work was done (injected)."))
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
        self.after_fail = None
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
            self.after_fail = None
            with d.lock:
                d.stats["requests"] += 1
                auth = self.headers.get("Authorization", "")
                if not auth.startswith("Bearer ") or auth[7:] not in d.tokens:
                    raise ApiError(401, "authError", "Request had invalid authentication credentials.")
                self.grant = d.token_grant.get(auth[7:], "")
                if d.token_scope.get(auth[7:]) == SCOPE_READONLY and self.command not in ("GET", "HEAD"):
                    # https://developers.google.com/drive/api/guides/api-specific-auth: drive.readonly
                    # "view and download"; a change is refused as Google does (403).
                    raise ApiError(403, "insufficientPermissions", "Request had insufficient authentication scopes.")
                if time.time() < d.throttle_until:
                    # https://developers.google.com/drive/api/guides/limits: 403 userRateLimitExceeded
                    # or 429 rateLimitExceeded until the quota refills; clients back off exponentially.
                    d.stats["failed_injected"] += 1
                    raise ApiError(d.throttle[0], d.throttle[1], "Rate limit exceeded (throttled by the emulator).")
                target = path + ("?" + url.query if url.query else "")
                hit = next((f for f in d.fail if f.get("method", self.command) == self.command
                            and re.search(f.get("path", ""), target)), None)
                if hit is not None:
                    d.fail.remove(hit)
                    d.stats["failed_injected"] += 1
                    if not hit.get("after"):
                        raise ApiError(hit["status"], hit["reason"], "Injected failure (emulator).")
                    self.after_fail = (hit["status"], hit["reason"])
            return self.api(path, qs, data)
        except ApiError as e:
            return self.error(e)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = handle_any

    # ------------------------------------------------------------------ auth
    def token(self, form: dict):
        try:
            return self.token_grant(form)
        except ApiError as e:
            # The OAuth endpoint answers RFC 6749 section 5.2 errors, not API errors:
            # {"error": "invalid_grant", "error_description": ...}
            # (https://developers.google.com/identity/protocols/oauth2/web-server#exchange-authorization-code).
            return self.send(e.status, {"error": e.reason, "error_description": e.message})

    def token_grant(self, form: dict):
        d, cfg = self.drive, self.drive.cfg
        with d.lock:
            if d.token_fail:
                status, error = d.token_fail.pop(0)
                d.stats["token_failures"] = d.stats.get("token_failures", 0) + 1
                raise ApiError(status, error, "Injected token endpoint failure (emulator).")
        grant = form.get("grant_type", "")
        scope = SCOPE_FULL
        if grant == "refresh_token":
            refresh = form.get("refresh_token")
            scope = SCOPE_FULL if refresh == cfg.refresh_token else d.refresh_scopes.get(refresh)
            if (form.get("client_id"), form.get("client_secret")) != (cfg.client_id, cfg.client_secret) or not scope:
                raise ApiError(400, "invalid_grant", "Bad client or refresh token.")
            out = {}
        elif grant == "authorization_code":
            with d.lock:
                asked = d.codes.pop(form.get("code", ""), None)  # a code is good for one exchange
            if (form.get("client_id"), form.get("client_secret")) != (cfg.client_id, cfg.client_secret) \
                    or asked is None:
                raise ApiError(400, "invalid_grant", "Bad client or code.")
            check_pkce(asked, form.get("code_verifier"))
            scope = asked["scope"]
            refresh = cfg.refresh_token
            if scope != SCOPE_FULL:
                refresh = "emu-refresh-ro-" + secrets.token_hex(8)
                with d.lock:
                    d.refresh_scopes[refresh] = scope
            out = {"refresh_token": refresh, "scope": scope}
        elif grant == "urn:ietf:params:oauth:grant-type:jwt-bearer":
            claims = verify_rs256(form.get("assertion", ""), d.sa_keys)
            scope = SCOPE_FULL if SCOPE_FULL in claims.get("scope", "").split() else SCOPE_READONLY
            out = {}
        else:
            raise ApiError(400, "unsupported_grant_type", f"grant_type {grant!r}")
        tok = "ya29.emu-" + secrets.token_hex(12)
        with d.lock:
            d.tokens.add(tok)
            d.token_grant[tok] = grant
            d.token_scope[tok] = scope
            d.stats["token_grants"][grant] = d.stats["token_grants"].get(grant, 0) + 1
        self.send(200, {"access_token": tok, "expires_in": 3599, "token_type": "Bearer", **out})

    def consent(self, qs: dict):
        if qs.get("client_id") != self.drive.cfg.client_id or qs.get("response_type") != "code":
            raise ApiError(400, "invalid_request", "unknown client_id or response_type")
        scopes = qs.get("scope", SCOPE_FULL).split()
        scope = SCOPE_FULL if SCOPE_FULL in scopes else SCOPE_READONLY if SCOPE_READONLY in scopes else None
        if scope is None:
            raise ApiError(400, "invalid_scope", "no Drive scope asked for")
        # https://developers.google.com/identity/protocols/oauth2/native-app#step1-code-verifier:
        # code_challenge_method is S256 or plain (the default when a challenge comes without one).
        method = qs.get("code_challenge_method", "plain" if qs.get("code_challenge") else None)
        if method not in (None, "S256", "plain"):
            raise ApiError(400, "invalid_request", f"code_challenge_method {method!r}")
        code = "4/emu-" + secrets.token_hex(8)
        with self.drive.lock:
            self.drive.codes[code] = {"challenge": qs.get("code_challenge"), "method": method, "scope": scope}
        # The answer carries the request's state back (native-app#handlingresponse).
        back = {"code": code, "scope": scope, **({"state": qs["state"]} if "state" in qs else {})}
        sep = "&" if "?" in qs.get("redirect_uri", "") else "?"
        self.send(302, headers={"Location": f"{qs.get('redirect_uri')}{sep}{urllib.parse.urlencode(back)}"})

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
                if "content_size" in arg:
                    n = arg.pop("content_size")
                    content = (b"0123456789abcdef" * (n // 16 + 1))[:n]
                abusive = arg.pop("abusive", False)
                f = d.create({**arg, "parents": [arg.pop("parent", ROOT_ID)]}, content)
                if abusive:
                    d.abusive.add(f["id"])
                return self.send(200, f)
            if op == "fail" and arg.get("clear"):
                d.fail = []
                return self.send(200, {})
            if op == "fail":
                one = {"status": arg.get("status", 403), "reason": arg.get("reason", "userRateLimitExceeded"),
                       **{k: arg[k] for k in ("method", "path", "after") if k in arg}}
                d.fail += [dict(one) for _ in range(arg.get("count", 1))]
                return self.send(200, {})
            if op == "throttle":
                d.throttle_until = time.time() + arg.get("seconds", 10)
                d.throttle = (arg.get("status", 429), arg.get("reason", "rateLimitExceeded"))
                return self.send(200, {})
            if op == "token_fail":
                d.token_fail += [(arg.get("status", 503), arg.get("error", "temporarily_unavailable"))] * \
                    arg.get("count", 1)
                return self.send(200, {})
            if op == "drive_change":
                d.record(arg.get("driveId", "0AOTHERDRIVExxxxxxxx"), "drive")
                return self.send(200, {})
            if op == "shared_drive":
                # A shared drive's ID is also its root folder's ID
                # (https://developers.google.com/drive/api/guides/about-shareddrives).
                sid = "0A" + secrets.token_hex(8) + "Uk9PVA"
                t = now_rfc3339()
                d.drives[sid] = arg.get("name", "Shared")
                d.files[sid] = {"id": sid, "name": d.drives[sid], "mimeType": FOLDER, "parents": [],
                                "trashed": False, "createdTime": t, "modifiedTime": t, "version": "1",
                                "driveId": sid}
                return self.send(200, d.files[sid])
            if op == "short_chunk":
                d.short_chunk = arg.get("keep", 256 * 1024)
                return self.send(200, {})
            if op == "expire_tokens":
                d.tokens.clear()
                return self.send(200, {})
            if op == "sa_key":
                d.sa_keys[arg["email"]] = (int(arg["n"], 16), int(arg.get("e", 65537)))
                return self.send(200, {})
            if op == "stats":
                return self.send(200, {**d.stats, "pending_failures": len(d.fail),
                                       "pending_short_chunk": d.short_chunk is not None})
        raise ApiError(404, "notFound", f"no control op {op}")

    # ------------------------------------------------------------------ the API
    def fields(self, qs: dict) -> dict | None:
        return parse_fields(qs["fields"]) if qs.get("fields") else None

    def file_out(self, f: dict, qs: dict):
        return self.send(200, select(f, self.fields(qs), "file"))

    def visible(self, fid: str, qs: dict) -> dict:
        """The item, if this request may see it: an item in a shared drive is "not found" to a
        request without supportsAllDrives=true
        (https://developers.google.com/drive/api/guides/enable-shareddrives)."""
        d = self.drive
        f = d.get(fid)
        if f.get("driveId") and qs.get("supportsAllDrives") != "true":
            raise ApiError(404, "notFound", f"File not found: {fid}.")
        return f

    def check_quota(self, parents: list[str]):
        """A service account owns no storage: a new file in My Drive is refused
        (https://developers.google.com/drive/api/guides/about-shareddrives; the answer Drive
        gives is below)."""
        d = self.drive
        if self.grant.endswith("jwt-bearer") and not any(d.drive_of(d.resolve(p)) for p in parents or [ROOT_ID]):
            raise ApiError(403, "storageQuotaExceeded",
                           "Service Accounts do not have storage quota. Leverage shared drives "
                           "(https://developers.google.com/workspace/drive/api/guides/about-shareddrives), "
                           "or use OAuth delegation (http://support.google.com/a/answer/7281227) instead.")

    def create(self, meta: dict, data: bytes, qs: dict) -> dict:
        for p in meta.get("parents") or [ROOT_ID]:
            self.visible(p, qs)
        if meta.get("mimeType") != FOLDER:
            self.check_quota(meta.get("parents"))
        return self.drive.create(meta, data)

    def api(self, path: str, qs: dict, data: bytes):
        d, m = self.drive, self.command
        if path == "/drive/v3/changes/startPageToken":
            if qs.get("driveId") and qs.get("supportsAllDrives") != "true":
                raise ApiError(403, "teamDrivesParameterRequired",
                               "The supportsAllDrives parameter must be true when driveId is set.")
            return self.send(200, {"startPageToken": str(d.next_change)})
        if path == "/drive/v3/changes" and m == "GET":
            return self.changes(qs)
        if path == "/drive/v3/files" and m == "GET":
            return self.list(qs)
        if path == "/drive/v3/files/generateIds" and m == "GET":
            # https://developers.google.com/drive/api/reference/rest/v3/files/generateIds
            n = max(1, min(int(qs.get("count") or 10), 1000))
            return self.send(200, {"kind": "drive#generatedIds", "space": qs.get("space", "drive"),
                                   "ids": [d.new_id() for _ in range(n)]})
        if path == "/drive/v3/files" and m == "POST":
            self.fields(qs) and select(None, self.fields(qs), "file")
            with d.lock:
                return self.file_out(self.create(json.loads(data or b"{}"), b"", qs), qs)
        if path.startswith("/upload/drive/v3/files"):
            return self.upload(path[len("/upload/drive/v3/files"):].strip("/"), qs, data)
        mm = re.fullmatch(r"/drive/v3/files/([^/]+)(/export|/copy)?", path)
        if not mm:
            raise ApiError(404, "notFound", f"no such API path {path}")
        fid, sub = mm.group(1), mm.group(2)
        self.fields(qs) and sub != "/export" and select(None, self.fields(qs), "file")
        with d.lock:
            f = self.visible(fid, qs)
            if sub == "/export":
                if f["mimeType"] not in EXPORTS or qs.get("mimeType") != EXPORTS[f["mimeType"]]:
                    raise ApiError(400, "badRequest", "Export only supports Docs Editors files (or bad mimeType).")
                if len(d.content[f["id"]]) > EXPORT_LIMIT:
                    # https://developers.google.com/drive/api/reference/rest/v3/files/export
                    raise ApiError(403, "exportSizeLimitExceeded", "This file is too large to be exported.")
                d.stats["exports"] = d.stats.get("exports", 0) + 1
                return self.send(200, body=d.content[f["id"]], headers={"Content-Type": qs["mimeType"]})
            if sub == "/copy":
                d.stats["copies"] = d.stats.get("copies", 0) + 1
                meta = json.loads(data or b"{}")
                g = self.create({"name": meta.get("name", f["name"]), "parents": meta.get("parents", f["parents"]),
                                 "mimeType": f["mimeType"], "id": meta.get("id")}, d.content.get(f["id"], b""), qs)
                return self.file_out(g, qs)
            if m == "GET" and qs.get("alt") == "media":
                d.stats["media_gets"] = d.stats.get("media_gets", 0) + 1
                return self.media(f, qs)
            if m == "GET":
                return self.file_out(f, qs)
            if m == "DELETE":
                self.delete_tree(f["id"])
                return self.send(204)
            if m == "PATCH":
                return self.file_out(self.patch(f, json.loads(data or b"{}"), qs), qs)
        raise ApiError(405, "badRequest", f"{m} {path}")

    def delete_tree(self, fid: str):
        d = self.drive
        for c in [c for c in d.files.values() if fid in c["parents"]]:
            self.delete_tree(c["id"])
        d.record(fid)
        d.files.pop(fid, None)
        d.content.pop(fid, None)

    def patch(self, f: dict, meta: dict, qs: dict) -> dict:
        d = self.drive
        removed = {d.resolve(p) for p in filter(None, qs.get("removeParents", "").split(","))}
        parents = [x for x in f["parents"] if x not in removed]
        for p in filter(None, qs.get("addParents", "").split(",")):
            if d.get(p)["id"] not in parents:
                parents.append(d.get(p)["id"])
        if len(parents) > max(1, len(f["parents"])):
            # Since 2020 an item has one parent (files.update: "Adding files to multiple
            # folders is no longer supported"); Drive answers 403 cannotAddParent.
            raise ApiError(403, "cannotAddParent", "Increasing the number of parents is not allowed")
        if "name" in meta:
            f["name"] = meta["name"]
        if "trashed" in meta:
            f["trashed"] = bool(meta["trashed"])
        set_properties(f, meta)
        f["parents"] = parents
        d.stats["updates"] = d.stats.get("updates", 0) + 1
        d.touch(f)
        return f

    def media(self, f: dict, qs: dict):
        if f["mimeType"].startswith(GOOGLE_APPS):
            raise ApiError(403, "fileNotDownloadable", "Only files with binary content can be downloaded. Use Export with Docs Editors files.")
        if f["id"] in self.drive.abusive and qs.get("acknowledgeAbuse") != "true":
            # https://developers.google.com/drive/api/reference/rest/v3/files/get (acknowledgeAbuse):
            # a file flagged as malware or spam downloads only with acknowledgeAbuse=true.
            raise ApiError(403, "cannotDownloadAbusiveFile",
                           "This file has been identified as malware or spam and cannot be downloaded.")
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
        sel = self.fields(qs)
        select(None, sel, "list")
        # https://developers.google.com/drive/api/guides/enable-shareddrives: shared-drive items
        # are listed only with includeItemsFromAllDrives=true and supportsAllDrives=true, and
        # corpora=drive (with driveId) lists one shared drive.
        all_drives = qs.get("includeItemsFromAllDrives") == "true" and qs.get("supportsAllDrives") == "true"
        corpora, drive_id = qs.get("corpora", "user"), qs.get("driveId")
        if corpora == "drive" and not (drive_id and all_drives):
            raise ApiError(400, "invalid", "corpora=drive needs driveId, includeItemsFromAllDrives=true and "
                                           "supportsAllDrives=true.")
        if drive_id and corpora != "drive":
            raise ApiError(400, "invalid", "driveId needs corpora=drive.")

        def seen(f):
            if corpora == "drive":
                return f.get("driveId") == drive_id
            return not f.get("driveId") or (all_drives and corpora == "allDrives")
        match = compile_query(q)
        with d.lock:
            hits = [f for f in d.files.values() if f["id"] != ROOT_ID and f["id"] not in d.drives
                    and seen(f) and match(f)]
        page = hits[start:start + size]
        out = {"kind": "drive#fileList", "files": page}
        if start + size < len(hits):
            out["nextPageToken"] = str(start + size)
        return self.send(200, select(out, sel, "list"))

    def changes(self, qs: dict):
        d = self.drive
        if not qs.get("pageToken"):
            raise ApiError(400, "required", "Required parameter: pageToken")
        start, size = int(qs["pageToken"]), max(1, min(int(qs.get("pageSize") or 100), 1000))
        sel = self.fields(qs)
        select(None, sel, "changes")
        # https://developers.google.com/drive/api/reference/rest/v3/changes/list and
        # https://developers.google.com/drive/api/guides/enable-shareddrives: with driveId, the
        # changes of that shared drive (supportsAllDrives/includeItemsFromAllDrives needed);
        # without, My Drive's, and shared-drive items only with both flags. A change may be
        # about a shared drive itself: changeType "drive", a driveId and no fileId
        # (https://developers.google.com/drive/api/reference/rest/v3/changes#Change).
        all_drives = qs.get("includeItemsFromAllDrives") == "true" and qs.get("supportsAllDrives") == "true"
        drive_id = qs.get("driveId")
        if drive_id and not all_drives:
            raise ApiError(403, "teamDrivesParameterRequired", "driveId needs supportsAllDrives and "
                                                               "includeItemsFromAllDrives set to true.")
        with d.lock:
            def seen(kind, drv):
                if drive_id:
                    return kind == "file" and drv == drive_id
                return kind == "drive" or not drv or all_drives
            todo = [(n, kind, fid) for n, kind, fid, drv in d.changes if n >= start and seen(kind, drv)]
            page = todo[:size]
            out = {"kind": "drive#changeList", "changes": []}
            for n, kind, fid in page:
                if kind == "drive":
                    out["changes"].append({"kind": "drive#change", "changeType": "drive", "driveId": fid,
                                           "removed": False, "time": now_rfc3339(),
                                           "drive": {"id": fid, "name": d.drives.get(fid, "a shared drive")}})
                    continue
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
        return self.send(200, select(out, sel, "changes"))

    def upload(self, fid: str, qs: dict, data: bytes):
        d, m = self.drive, self.command
        kind = qs.get("uploadType", "media")
        if kind == "resumable" and qs.get("upload_id"):
            return self.resumable_chunk(qs["upload_id"], data)
        self.fields(qs) and select(None, self.fields(qs), "file")
        if fid:
            self.visible(fid, qs)
        if kind == "resumable":
            sid = secrets.token_hex(8)
            meta = json.loads(data or b"{}")
            if not fid:
                with d.lock:
                    for p in meta.get("parents") or [ROOT_ID]:
                        self.visible(p, qs)
                    self.check_quota(meta.get("parents"))
            d.uploads[sid] = {"fid": fid, "meta": meta, "data": bytearray(), "qs": qs}
            d.stats["upload_sessions"] = d.stats.get("upload_sessions", 0) + 1
            loc = f"http://{self.headers.get('Host')}/upload/drive/v3/files{'/' + fid if fid else ''}?uploadType=resumable&upload_id={sid}"
            return self.send(200, body=b"", headers={"Location": loc})
        if kind == "multipart":
            meta, content = parse_multipart(data, self.headers.get("Content-Type", ""))
        elif kind == "media":
            meta, content = {}, data
        else:
            raise ApiError(400, "badRequest", f"uploadType {kind!r}")
        return self.file_out(self.finish_upload(fid if m == "PATCH" else "", meta, content, qs), qs)

    def finish_upload(self, fid: str, meta: dict, content: bytes, qs: dict) -> dict:
        d = self.drive
        with d.lock:
            if not fid:
                return self.create(meta, content, qs)
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
        if "done" in up:
            # A finished session answers any further PUT with the file
            # (https://developers.google.com/drive/api/guides/manage-uploads#resume-upload).
            return self.file_out(d.get(up["done"]), up["qs"])
        cr = self.headers.get("Content-Range", "")
        m = re.fullmatch(r"bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)", cr)
        if not m:
            raise ApiError(400, "badRequest", f"bad Content-Range {cr!r}")
        if m.group(1) is not None:
            if int(m.group(1)) != len(up["data"]) or int(m.group(2)) - int(m.group(1)) + 1 != len(data):
                raise ApiError(400, "badRequest", "chunk does not continue the upload")
            if m.group(3) == "*" and len(data) % (256 * 1024):
                raise ApiError(400, "badRequest", "non-final chunks must be multiples of 256 KiB")
            if m.group(3) == "*" and d.short_chunk is not None and d.short_chunk < len(data):
                # Drive may keep less than a chunk: its 308's Range says how much, and the
                # client resumes from there (https://developers.google.com/drive/api/guides/manage-uploads#resumable).
                data, d.short_chunk = data[:d.short_chunk], None
            up["data"] += data
        total = m.group(3)
        if total != "*" and int(total) == len(up["data"]):
            f = self.finish_upload(up["fid"], up["meta"], bytes(up["data"]), up["qs"])
            up["done"] = f["id"]
            return self.file_out(f, up["qs"])
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
