"""Store requests per experiment, counted by MinIO itself, and what they would cost on S3.

MinIO serves its per-API counters (`minio_s3_requests_total{api="getobject"}` ...) at
/minio/v2/metrics/node without a token when started with MINIO_PROMETHEUS_AUTH_TYPE=public
(servers.py does). It refreshes them from a cache, so a request shows up a few seconds
(up to about 10 s here) after it was served. `settle()` therefore sends a marker request of
an API no mount uses (GetBucketTagging) and waits until MinIO's counters include it, then
reads again until two reads agree: every request served before the marker is then in the
snapshot. The marker is subtracted from the difference of two snapshots.

`bucketfs` also counts its own store calls (`bucketfs_store_requests_total{op=...}` at
`--metrics-addr`); those are kept beside MinIO's as a cross-check. They count calls of its
store layer, so a multipart upload is one `upload` call but several HTTP requests.

Prices: S3 Standard in us-east-1, per 1,000 requests, as published on the public Amazon S3
pricing page ("Requests & data retrievals"); recorded here on PRICES_DATE.
"""

import re
import time
import urllib.request

PRICES_DATE = "2026-11-26"
PRICE_SOURCE = ("Amazon S3 pricing page, S3 Standard, US East (N. Virginia): PUT, COPY, POST, "
                "LIST requests $0.005 per 1,000; GET, SELECT and all other requests $0.0004 per "
                "1,000; DELETE and CANCEL (abort multipart) requests free")
PRICE_PER_1000 = {"tier1": 0.005, "tier2": 0.0004, "free": 0.0}

# Display kinds, in report order.
KINDS = ["PUT", "GET", "HEAD", "LIST", "DELETE", "COPY", "multipart", "other"]

# MinIO API name -> (kind, price class). Anything not here: by its prefix (see classify).
_APIS = {
    "putobject": ("PUT", "tier1"),
    "getobject": ("GET", "tier2"),
    "headobject": ("HEAD", "tier2"),
    "headbucket": ("HEAD", "tier2"),
    "listobjectsv1": ("LIST", "tier1"),
    "listobjectsv2": ("LIST", "tier1"),
    "listobjectversions": ("LIST", "tier1"),
    "listbuckets": ("LIST", "tier1"),
    "deleteobject": ("DELETE", "free"),
    "deletemultipleobjects": ("DELETE", "free"),
    "copyobject": ("COPY", "tier1"),
    "copyobjectpart": ("COPY", "tier1"),
    "newmultipartupload": ("multipart", "tier1"),
    "putobjectpart": ("multipart", "tier1"),
    "completemultipartupload": ("multipart", "tier1"),
    "listobjectparts": ("multipart", "tier1"),
    "listmultipartuploads": ("multipart", "tier1"),
    "abortmultipartupload": ("multipart", "free"),
}

MARKER_API = "getbuckettagging"
_COUNTER = re.compile(r'^minio_s3_requests_total\{([^}]*)\}\s+(\S+)', re.M)
_API = re.compile(r'api="([^"]+)"')
_BFS = re.compile(r'^bucketfs_store_requests_total\{op="([a-z_]+)"\}\s+(\S+)', re.M)


def classify(api):
    """(kind, price class) of a MinIO API name."""
    if api in _APIS:
        return _APIS[api]
    if api.startswith(("put", "post")):
        return ("other", "tier1")
    if api.startswith("list"):
        return ("LIST", "tier1")
    if api.startswith("delete"):
        return ("DELETE", "free")
    return ("other", "tier2")


def parse_minio(text):
    """{api: count} from MinIO's Prometheus text (summed over servers)."""
    out = {}
    for labels, val in _COUNTER.findall(text):
        m = _API.search(labels)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0) + int(float(val))
    return out


def parse_bucketfs(text):
    return {op: int(float(v)) for op, v in _BFS.findall(text)}


def diff(after, before):
    """Counters that moved between two snapshots."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    return {k: v for k, v in sorted(d.items()) if v}


def by_kind(apis):
    """{kind: count} over KINDS (zeros kept, so every table has the same rows)."""
    out = {k: 0 for k in KINDS}
    for api, n in apis.items():
        out[classify(api)[0]] += n
    return out


def cost_usd(apis):
    """What `apis` ({api: count}) would cost at PRICE_PER_1000."""
    return sum(n * PRICE_PER_1000[classify(api)[1]] / 1000.0 for api, n in apis.items())


def _fetch(url, timeout=10):
    return urllib.request.urlopen(url, timeout=timeout).read().decode("utf-8", "replace")


class MinioCounter:
    """Snapshots of MinIO's per-API request counters, settled with a marker request."""

    def __init__(self, metrics_url, marker, poll=1.0, limit=60.0):
        self.url = metrics_url
        self.marker = marker  # a callable sending one MARKER_API request
        self.poll, self.limit = poll, limit

    def read(self):
        return parse_minio(_fetch(self.url))

    def settle(self):
        """A snapshot that holds every request served before the call. Returns
        (counters, seconds waited)."""
        t0 = time.monotonic()
        before = self.read().get(MARKER_API, 0)
        self.marker()
        prev = None
        while time.monotonic() - t0 < self.limit:
            cur = self.read()
            if cur.get(MARKER_API, 0) > before and cur == prev:
                return cur, time.monotonic() - t0
            prev = cur if cur.get(MARKER_API, 0) > before else None
            time.sleep(self.poll)
        raise RuntimeError("MinIO's request counters did not settle within %.0f s" % self.limit)


_PT_OPENS = re.compile(r"^bucketfs_passthrough_opens(?:\{[^}]*\})?\s+(\S+)", re.M)


def parse_passthrough_opens(text):
    """bucketfs_passthrough_opens from bucketfs's metrics text (0 if it has none)."""
    m = _PT_OPENS.search(text)
    return int(float(m.group(1))) if m else 0


def bucketfs_metrics(metrics_url):
    """{"requests": {op: n}, "passthrough_opens": n} from one read of bucketfs's metrics
    endpoint, or None if it does not answer."""
    try:
        text = _fetch(metrics_url, 5)
    except OSError:
        return None
    return {"requests": parse_bucketfs(text), "passthrough_opens": parse_passthrough_opens(text)}


def cell_record(minio_apis, markers, runs, bucketfs_ops=None, excluded=None, settle_s=None):
    """The JSON record of one (experiment, system) cell: MinIO's counts by API with the
    marker requests and the harness's own requests (`excluded`, {api: n}) taken out."""
    apis = dict(minio_apis)
    if markers:
        apis[MARKER_API] = apis.get(MARKER_API, 0) - markers
    for api, n in (excluded or {}).items():
        apis[api] = apis.get(api, 0) - n
    apis = {k: v for k, v in sorted(apis.items()) if v}
    rec = {"minio": apis, "runs": runs, "kinds": by_kind(apis), "total": sum(apis.values()),
           "cost_usd": cost_usd(apis)}
    if excluded:
        rec["excluded"] = excluded
    if bucketfs_ops is not None:
        rec["bucketfs"] = bucketfs_ops
    if settle_s is not None:
        rec["settle_s"] = round(settle_s, 1)
    return rec
