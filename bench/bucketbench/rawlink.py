"""The link's limit for experiment 8: how fast a minimal client moves 1 GB
through the same toxiproxy proxy to MinIO, with no verification and nothing
else to do. Also the server's limit for experiment 1: how fast the same client
lists a prefix's keys. And of experiment 2: the same download through the GCS
proxy (`GcsLink`), so a mount's first read of the largest file is compared with
the link of its own store, measured right after it.

* download: the object cut into N equal byte ranges, one GET per range, each on
  its own connection, all at once; the bytes are counted and dropped.
* download to a file (`download_to_file`): the same N ranged GETs, each range read
  into 1 MiB page-aligned buffers and written in place with O_DIRECT into a file whose
  blocks were allocated first: the floor of any download that lands on this disk.
* upload: the file cut into N equal pieces, each PUT as its own object over its
  own connection, all at once (plain PUTs: no multipart bookkeeping, no
  assembly at the end), read from the file in 1 MiB chunks; the objects are
  deleted afterwards.

Requests are signed with AWS Signature V4 and an unsigned payload (what S3
clients do over TLS; MinIO accepts it over plain HTTP too). Python's
http.client releases the GIL in socket calls, so N threads move bytes
concurrently. The best N of a run is that run's limit.
"""

import collections
import concurrent.futures
import datetime
import hashlib
import hmac
import http.client
import mmap
import os
import threading
import time
import urllib.parse
from xml.etree import ElementTree

CHUNK = 1 << 20

# Requests this client sent, by MinIO's API name: requests.py takes them out of the counts
# of the system whose experiment they ran in (experiment 2's paired download).
SENT = collections.Counter()
_SENT_LOCK = threading.Lock()


def _api_name(method, obj, query):
    if obj is None:
        if "list-type=2" in query:
            return "listobjectsv2"
        if query.startswith("tagging"):
            return "getbuckettagging"
        return "bucket:" + method.lower()
    return {"GET": "getobject", "PUT": "putobject", "DELETE": "deleteobject",
            "HEAD": "headobject"}.get(method, method.lower())


def _sign(method, host, path, key, secret, region, extra=None, query=""):
    """Headers of a SigV4-signed S3 request with UNSIGNED-PAYLOAD; `query` is the
    canonical (sorted, encoded) query string."""
    now = datetime.datetime.now(datetime.timezone.utc)
    amzdate = now.strftime("%Y%m%dT%H%M%SZ")
    day = now.strftime("%Y%m%d")
    headers = {"host": host, "x-amz-date": amzdate, "x-amz-content-sha256": "UNSIGNED-PAYLOAD"}
    headers.update({k.lower(): v for k, v in (extra or {}).items()})
    names = sorted(headers)
    canonical = "\n".join([method, urllib.parse.quote(path), query,
                           "".join("%s:%s\n" % (n, headers[n]) for n in names),
                           ";".join(names), "UNSIGNED-PAYLOAD"])
    scope = "%s/%s/s3/aws4_request" % (day, region)
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amzdate, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    k = ("AWS4" + secret).encode()
    for part in (day, region, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = ("AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, "
                                "Signature=%s" % (key, scope, ";".join(names), sig))
    return headers


class Link:
    def __init__(self, endpoint, bucket, key, secret, region):
        u = urllib.parse.urlparse(endpoint)
        self.host, self.port = u.hostname, u.port
        self.hostport = "%s:%d" % (self.host, self.port)
        self.bucket, self.key, self.secret, self.region = bucket, key, secret, region

    def _request(self, method, obj, extra=None, body=None, length=None, query=""):
        """Send a signed request for `obj` (None: the bucket itself) with the canonical
        `query` string; returns (connection, response)."""
        with _SENT_LOCK:
            SENT[_api_name(method, obj, query)] += 1
        path = "/%s/%s" % (self.bucket, obj) if obj is not None else "/%s" % self.bucket
        h = _sign(method, self.hostport, path, self.key, self.secret, self.region, extra, query)
        if length is not None:
            h["content-length"] = str(length)
        conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
        target = urllib.parse.quote(path) + ("?" + query if query else "")
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        for k, v in h.items():
            conn.putheader(k, v)
        conn.endheaders()
        if body is not None:
            body(conn)
        resp = conn.getresponse()
        return conn, resp

    def list_page(self, prefix, delimiter=None, token=None):
        """One ListObjectsV2 page (up to 1,000 keys): (keys, common prefixes, next token)."""
        params = {"list-type": "2", "prefix": prefix, "max-keys": "1000"}
        if delimiter:
            params["delimiter"] = delimiter
        if token:
            params["continuation-token"] = token
        query = "&".join("%s=%s" % (urllib.parse.quote(k, safe="-_.~"),
                                    urllib.parse.quote(v, safe="-_.~"))
                         for k, v in sorted(params.items()))
        conn, resp = self._request("GET", None, query=query)
        body = resp.read()
        conn.close()
        if resp.status != 200:
            raise RuntimeError("LIST %s: HTTP %d %s" % (prefix, resp.status, body[:200]))
        root = ElementTree.fromstring(body)
        ns = root.tag[:root.tag.index("}") + 1] if root.tag.startswith("{") else ""
        keys = [e.text for e in root.iter(ns + "Key")]
        prefixes = [e.text for c in root.iter(ns + "CommonPrefixes") for e in c.iter(ns + "Prefix")]
        nxt = root.find(ns + "NextContinuationToken")
        return keys, prefixes, (nxt.text if nxt is not None else None)

    def marker(self):
        """One GetBucketTagging (no mount sends it): requests.py's marker request."""
        conn, resp = self._request("GET", None, query="tagging=")
        resp.read()
        conn.close()

    def list_recursive(self, prefix):
        """Seconds to list every key under `prefix` page by page; and the key count."""
        t0, n, token = time.monotonic(), 0, None
        while True:
            keys, _, token = self.list_page(prefix, None, token)
            n += len(keys)
            if not token:
                return time.monotonic() - t0, n

    def list_walk(self, prefix, n):
        """Seconds to list every directory under `prefix` with delimited listings, n at a
        time, each directory's listing started as soon as its parent's is done (the
        fastest walk a client that lists per directory can make); and the key count."""
        t0, keys = time.monotonic(), 0

        def one(p):
            count, subs, token = 0, [], None
            while True:
                k, s, token = self.list_page(p, "/", token)
                count += len(k)
                subs += s
                if not token:
                    return count, subs

        with concurrent.futures.ThreadPoolExecutor(n) as ex:
            pending = {ex.submit(one, prefix)}
            while pending:
                done, pending = concurrent.futures.wait(
                    pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for f in done:
                    k, subs = f.result()
                    keys += k
                    pending |= {ex.submit(one, s) for s in subs}
        return time.monotonic() - t0, keys

    def _get_range(self, obj, start, end):
        conn, resp = self._request("GET", obj, {"range": "bytes=%d-%d" % (start, end - 1)})
        return _drain(conn, resp, obj, end - start)

    def _put_piece(self, obj, path, start, end):
        def body(conn):
            with open(path, "rb") as f:
                off = start
                while off < end:
                    data = os.pread(f.fileno(), min(CHUNK, end - off), off)
                    conn.send(data)
                    off += len(data)
        conn, resp = self._request("PUT", obj, body=body, length=end - start)
        out = resp.read()
        conn.close()
        if resp.status != 200:
            raise RuntimeError("PUT %s: HTTP %d %s" % (obj, resp.status, out[:200]))
        return end - start

    def get_bytes(self, obj, start, end):
        """Bytes start..end of `obj` (b"" if it is absent or shorter)."""
        conn, resp = self._request("GET", obj, extra={"range": "bytes=%d-%d" % (start, end - 1)})
        body = resp.read()
        conn.close()
        return body if resp.status in (200, 206) else b""

    def delete(self, obj):
        conn, resp = self._request("DELETE", obj)
        resp.read()
        conn.close()

    def download(self, obj, size, n):
        """Seconds to GET `size` bytes of `obj` as n parallel ranges."""
        return _parallel_ranges(self._get_range, obj, size, n)

    def download_to_file(self, obj, size, n, path):
        """Seconds to GET `size` bytes of `obj` as n parallel ranges into the file `path`
        (created, allocated, then written in place with O_DIRECT)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if size:
                os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)

        def get(o, start, end):
            conn, resp = self._request("GET", o, {"range": "bytes=%d-%d" % (start, end - 1)})
            return _drain(conn, resp, o, end - start, path, start)
        t0 = time.monotonic()
        _parallel_ranges(get, obj, size, n)
        return time.monotonic() - t0

    def upload(self, path, prefix, n):
        """Seconds to PUT the file as n parallel objects prefix.0 .. prefix.(n-1)."""
        size = os.path.getsize(path)
        cuts = [size * i // n for i in range(n + 1)]
        names = ["%s.%d" % (prefix, i) for i in range(n)]
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(n) as ex:
            total = sum(ex.map(lambda i: self._put_piece(names[i], path, cuts[i], cuts[i + 1]),
                               range(n)))
        dt = time.monotonic() - t0
        assert total == size
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            list(ex.map(self.delete, names))
        return dt


def _drain(conn, resp, obj, want, path=None, at=0):
    """Read a ranged GET's body into one reused buffer; the byte count must be `want`.
    The bytes are dropped, or with `path` written at `at` onwards with O_DIRECT (each
    1 MiB filled before its write; the buffer is mmap'ed, so page-aligned, and freed by
    the garbage collector: closing it could fail while an error's traceback holds a
    slice of it)."""
    if resp.status not in (200, 206):
        raise RuntimeError("GET %s: HTTP %d %s" % (obj, resp.status, resp.read()[:200]))
    if path is None:
        view = memoryview(bytearray(CHUNK))
        got = 0
        while True:
            n = resp.readinto(view)
            if not n:
                break
            got += n
    else:
        view = memoryview(mmap.mmap(-1, CHUNK))
        fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        got = fill = 0
        try:
            while True:
                n = resp.readinto(view[fill:])
                fill += n
                if fill == CHUNK or (not n and fill):
                    _write_at(path, fd, view[:fill], at + got)
                    got, fill = got + fill, 0
                if not n:
                    break
        finally:
            os.close(fd)
    conn.close()
    if got != want:
        raise RuntimeError("GET %s: %d bytes, expected %d" % (obj, got, want))
    return got


def _write_at(path, direct_fd, data, at):
    """pwrite through the O_DIRECT descriptor, or for an unaligned piece (a range's
    tail) through a plain one."""
    if at % 4096 == 0 and len(data) % 4096 == 0:
        n = os.pwrite(direct_fd, data, at)
    else:
        fd = os.open(path, os.O_WRONLY)
        try:
            n = os.pwrite(fd, data, at)
        finally:
            os.close(fd)
    if n != len(data):
        raise OSError("short write at %d: %d of %d bytes" % (at, n, len(data)))


def _parallel_ranges(get_range, obj, size, n):
    """Seconds to fetch `size` bytes of `obj` as n equal ranges at once."""
    cuts = [size * i // n for i in range(n + 1)]
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        total = sum(ex.map(lambda i: get_range(obj, cuts[i], cuts[i + 1]), range(n)))
    dt = time.monotonic() - t0
    assert total == size
    return dt


class GcsLink:
    """The same parallel ranged download through the GCS proxy: the JSON API's media
    download (`alt=media`) with a Range header, unauthenticated (fake-gcs-server)."""

    def __init__(self, endpoint, bucket):
        u = urllib.parse.urlparse(endpoint)
        self.host, self.port, self.bucket = u.hostname, u.port, bucket

    def _get_range(self, obj, start, end):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
        conn.request("GET", "/download/storage/v1/b/%s/o/%s?alt=media" % (
            self.bucket, urllib.parse.quote(obj, safe="")),
            headers={"range": "bytes=%d-%d" % (start, end - 1)})
        return _drain(conn, conn.getresponse(), obj, end - start)

    def download(self, obj, size, n):
        """Seconds to GET `size` bytes of `obj` as n parallel ranges."""
        return _parallel_ranges(self._get_range, obj, size, n)

    def get_bytes(self, obj, start, end):
        """Bytes start..end of `obj` (b"" if it is absent or shorter)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        conn.request("GET", "/download/storage/v1/b/%s/o/%s?alt=media" % (
            self.bucket, urllib.parse.quote(obj, safe="")),
            headers={"range": "bytes=%d-%d" % (start, end - 1)})
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        return body if resp.status in (200, 206) else b""


def bench_link():
    """A Link through the bench's own S3 proxy, to its bucket, with its keys."""
    from . import servers as S
    return Link(S.S3_ENDPOINT, S.BUCKET, S.ACCESS_KEY, S.SECRET_KEY, S.REGION)


def bench_gcs_link():
    """A GcsLink through the bench's own GCS proxy, to its bucket."""
    from . import servers as S
    return GcsLink(S.GCS_ENDPOINT, S.BUCKET)
