"""The million-key bucket of experiment 10: its layout, its own MinIO (data kept in the work
directory between runs) and its seeding.

Layout `DxK+B`: D directories `d0000/` ... of K keys each (`d0000/k000000` ...) and one
directory `big/` of B keys; the default, 1000x1000+100000, is 1,100,000 keys. Each key is
an object of a few bytes. The bucket is named after its layout (`keys-1000x1000-100000`),
so scaled-down layouts (`bench/run --keys 1000x10+10000`) live beside the full one.

The bench's main MinIO is wiped at every start; this bucket is not. It lives in a second
MinIO (127.0.0.1:19002, console 19003, data in <workdir>/keys-minio) reached through its own
toxiproxy proxy (29002). A seed is complete when its marker object is in the
`bucketbench-meta` bucket: `<bucket>.seeded`, written last, holding the seeding's figures.
Seeding sends the keys as tar archives that MinIO unpacks into objects (its
`snowball-auto-extract` upload: a few requests instead of a million), several at once; a
server that stores an archive as one object instead gets many concurrent PUTs (several
processes, each with a thread pool and its own boto3 client). The bucket's key count is
checked before the seed is marked complete. A trial of 10,000 keys (the layout's first) gives the rate and an estimate
for the whole, before the rest is seeded.

Standalone (seeds without running the bench; stops its MinIO when done):

    python3 -m bucketbench.keyseed --workdir /tmp/bucketbench --keys 1000x10+10000 [--trial-only]
"""

import json
import os
import random
import re
import subprocess
import sys
import time

META_BUCKET = "bucketbench-meta"
TRIAL_KEYS = 10000
BODY = b"bucketfs\n"
FULL_LAYOUT = "1000x1000+100000"
PROCESSES, THREADS = 4, 16
# Seeding by archives: keys per archive, archives unpacked at once.
SEED_WITH_ARCHIVES = True
ARCHIVE_KEYS, ARCHIVES_AT_ONCE = 5000, 4


# ---- layout (pure) ------------------------------------------------------------------------
def parse_layout(text):
    """(dirs, keys per dir, keys in big/) from "DxK+B" (also "DxK" or "+B")."""
    m = re.fullmatch(r"\s*(?:(\d+)x(\d+))?\s*(?:\+\s*(\d+))?\s*", text or "")
    if not m or not (m.group(1) or m.group(3)):
        raise ValueError("--keys takes DIRSxKEYS+BIG, like 1000x1000+100000, not %r" % text)
    d, k, b = int(m.group(1) or 0), int(m.group(2) or 0), int(m.group(3) or 0)
    if d > 10000 or k > 1000000 or b > 1000000:
        raise ValueError("--keys: at most 10,000 directories of 1,000,000 keys, big/ 1,000,000")
    return d, k, b


def layout_text(layout):
    d, k, b = layout
    return "%dx%d+%d" % (d, k, b)


def total_keys(layout):
    d, k, b = layout
    return d * k + b


def bucket_name(layout):
    d, k, b = layout
    return "keys-%dx%d-%d" % (d, k, b)


def dir_name(i):
    return "d%04d" % i


def key_name(i):
    return "k%06d" % i


def keys_of(layout):
    """Every key of the layout, big/ first (the trial seeds its first 10,000)."""
    d, k, b = layout
    for i in range(b):
        yield "big/" + key_name(i)
    for a in range(d):
        for i in range(k):
            yield "%s/%s" % (dir_name(a), key_name(i))


def key_at(layout, n):
    """The n-th key of keys_of(layout), without walking it."""
    d, k, b = layout
    if n < b:
        return "big/" + key_name(n)
    a, i = divmod(n - b, k)
    return "%s/%s" % (dir_name(a), key_name(i))


def find_entries(layout):
    """What `find MOUNT` prints for the layout: the root, each directory and each key."""
    d, k, b = layout
    return 1 + d + (1 if b else 0) + total_keys(layout)


def sample_keys(layout, n, seed=46):
    """n distinct keys of the layout, drawn with a fixed seed (the same paths every run)."""
    total = total_keys(layout)
    rng = random.Random(seed)
    return [key_at(layout, i) for i in rng.sample(range(total), min(n, total))]


def capped_layout(layout, budget):
    """The layout cut to at most `budget` keys, big/ first, then whole directories: what
    the GCS emulator is seeded with (it holds every object in memory)."""
    d, k, b = layout
    big = min(b, budget)
    dirs = min(d, (budget - big) // k) if k else 0
    return (dirs, k if dirs else 0, big)


def estimate_s(trial_keys, trial_s, total):
    """Seconds to seed `total` keys at the trial's rate."""
    return total * trial_s / max(1, trial_keys)


# ---- the keys' MinIO -----------------------------------------------------------------------
class KeysMinio:
    """A MinIO of its own whose data dir survives runs (see the module doc)."""

    def __init__(self, workdir, port, console_port, access_key, secret_key, region):
        self.data = os.path.join(workdir, "keys-minio")
        self.logpath = os.path.join(workdir, "logs", "keys-minio.log")
        self.port, self.console_port = port, console_port
        self.ak, self.sk, self.region = access_key, secret_key, region
        self.proc = None

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def start(self):
        from .install import go_binary
        from .util import log, port_free, wait_for
        import urllib.request
        for p in (self.port, self.console_port):
            if not port_free(p):
                raise RuntimeError("port %d is taken (the keys' MinIO); try --port-offset" % p)
        os.makedirs(self.data, exist_ok=True)
        os.makedirs(os.path.dirname(self.logpath), exist_ok=True)
        logf = open(self.logpath, "ab")
        env = dict(os.environ, MINIO_ROOT_USER=self.ak, MINIO_ROOT_PASSWORD=self.sk,
                   MINIO_BROWSER="off", MINIO_PROMETHEUS_AUTH_TYPE="public")
        self.proc = subprocess.Popen(
            [go_binary("minio"), "server", self.data, "--address", "127.0.0.1:%d" % self.port,
             "--console-address", "127.0.0.1:%d" % self.console_port],
            stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)
        logf.close()
        log("started the keys' MinIO (pid %d, data %s)" % (self.proc.pid, self.data))
        ok = wait_for(lambda: urllib.request.urlopen(
            self.url + "/minio/health/live", timeout=2).status == 200, 120, 0.3)
        if not ok:
            self.stop()
            raise RuntimeError("the keys' MinIO did not become ready (%s)" % self.logpath)
        for b in (META_BUCKET,):
            self.ensure_bucket(b)

    def stop(self):
        from .util import end_process

        end_process(self.proc, 30)
        self.proc = None

    def client(self, pool=16):
        return _client(self.url, self.ak, self.sk, self.region, pool)

    def ensure_bucket(self, name):
        s3 = self.client()
        try:
            s3.head_bucket(Bucket=name)
        except Exception:
            s3.create_bucket(Bucket=name)

    def seed_record(self, layout):
        """The marker of a complete seed of `layout` (its figures), or None."""
        s3 = self.client()
        try:
            body = s3.get_object(Bucket=META_BUCKET, Key=bucket_name(layout) + ".seeded")["Body"]
            return json.loads(body.read())
        except Exception:
            return None

    def counter(self):
        """MinIO's request counters of this server (requests.py), settled with a marker
        request to its meta bucket."""
        from .rawlink import Link
        from .requests import MinioCounter
        link = Link(self.url, META_BUCKET, self.ak, self.sk, self.region)
        return MinioCounter(self.url + "/minio/v2/metrics/node", link.marker)


def _client(url, ak, sk, region, pool):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=url, aws_access_key_id=ak,
                        aws_secret_access_key=sk, region_name=region,
                        config=Config(max_pool_connections=pool,
                                      retries={"max_attempts": 8, "mode": "standard"}))


def _put_range(args):
    """A worker process: PUT keys [start, end) of the layout with THREADS threads."""
    import concurrent.futures
    url, ak, sk, region, bucket, layout, start, end = args
    s3 = _client(url, ak, sk, region, THREADS)

    def put(i):
        s3.put_object(Bucket=bucket, Key=key_at(layout, i), Body=BODY)

    with concurrent.futures.ThreadPoolExecutor(THREADS) as ex:
        for f in [ex.submit(put, i) for i in range(start, end)]:
            f.result()
    return end - start


def _tar_of(layout, start, end):
    """A tar archive of keys [start, end) of the layout, each holding BODY."""
    import io
    import tarfile
    buf, now = io.BytesIO(), int(time.time())
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(start, end):
            info = tarfile.TarInfo(key_at(layout, i))
            info.size, info.mtime = len(BODY), now
            tf.addfile(info, io.BytesIO(BODY))
    return buf.getvalue()


def _put_archive(args):
    """A worker process: keys [start, end) as one archive MinIO unpacks into objects."""
    url, ak, sk, region, bucket, layout, start, end = args
    s3 = _client(url, ak, sk, region, 2)
    s3.put_object(Bucket=bucket, Key="seed-%09d.tar" % start, Body=_tar_of(layout, start, end),
                  Metadata={"snowball-auto-extract": "true"})
    return end - start


def put_keys(server, layout, start, end, processes=PROCESSES):
    """PUT keys [start, end) of the layout into its bucket; returns the seconds taken.
    As archives MinIO unpacks into objects (its `snowball-auto-extract` upload, one
    request per ARCHIVE_KEYS keys, several at once) where it takes them; else one PUT
    per key."""
    if end <= start:
        return 0.0
    if SEED_WITH_ARCHIVES:
        try:
            return _put_keys_with(_put_archive, server, layout, start, end, ARCHIVE_KEYS, ARCHIVES_AT_ONCE)
        except Exception as e:  # an S3 server that does not unpack archives
            print("keys: archives refused (%s); one PUT per key instead" % e, file=sys.stderr)
    return _put_keys_with(_put_range, server, layout, start, end, 2000, processes)


def _put_keys_with(worker, server, layout, start, end, step, processes):
    import concurrent.futures
    bucket = bucket_name(layout)
    chunks = [(server.url, server.ak, server.sk, server.region, bucket, layout, a,
               min(end, a + step)) for a in range(start, end, step)]
    t0 = time.monotonic()
    with concurrent.futures.ProcessPoolExecutor(processes) as ex:
        for _ in ex.map(worker, chunks):
            pass
    return time.monotonic() - t0


def count_keys(server, layout):
    """How many keys the layout's bucket lists."""
    pages = server.client().get_paginator("list_objects_v2").paginate(
        Bucket=bucket_name(layout), PaginationConfig={"PageSize": 1000})
    return sum(p.get("KeyCount", 0) for p in pages)


def ensure_seed(server, layout, limit_s=None, trial_only=False, log=print):
    """Seed `layout` unless its marker says it is complete. Returns the seeding record:
    {layout, keys, trial_keys, trial_s, trial_rate, estimate_s, seed_s, rate, seeded_at,
    reused}. With `limit_s`, stops after the trial (record["stopped"]) when the estimate
    for the whole is above it; with `trial_only` always stops there."""
    rec = server.seed_record(layout)
    if rec:
        rec["reused"] = True
        return rec
    server.ensure_bucket(bucket_name(layout))
    total = total_keys(layout)
    n = min(TRIAL_KEYS, total)
    trial_s = put_keys(server, layout, 0, n)
    global SEED_WITH_ARCHIVES
    if SEED_WITH_ARCHIVES and count_keys(server, layout) != n:
        # Stored as an object instead of unpacked: one PUT per key from here on.
        log("keys: the archive was not unpacked into %d keys; one PUT per key instead" % n)
        SEED_WITH_ARCHIVES = False
        server.client().delete_object(Bucket=bucket_name(layout), Key="seed-%09d.tar" % 0)
        trial_s = put_keys(server, layout, 0, n)
    est = estimate_s(n, trial_s, total)
    rec = {"layout": layout_text(layout), "bucket": bucket_name(layout), "keys": total,
           "trial_keys": n, "trial_s": round(trial_s, 2), "trial_rate": round(n / trial_s, 1),
           "estimate_s": round(est, 1), "processes": PROCESSES, "threads": THREADS}
    log("keys: trial of %d PUTs took %.1f s (%.0f keys/s): the %d keys of %s would take "
        "about %.0f s (%.1f min)" % (n, trial_s, n / trial_s, total, layout_text(layout),
                                      est, est / 60))
    if trial_only or (limit_s and est > limit_s):
        rec["stopped"] = ("trial only" if trial_only else
                          "estimate %.0f s is above the limit of %.0f s" % (est, limit_s))
        return rec
    rest_s = put_keys(server, layout, n, total)
    rec["seed_s"] = round(trial_s + rest_s, 1)
    rec["archives"] = SEED_WITH_ARCHIVES
    listed = count_keys(server, layout)
    if listed != total:
        raise RuntimeError("keys: seeded %d keys but the bucket lists %d; the seed is not marked "
                           "complete (run again to redo it)" % (total, listed))
    rec["rate"] = round(total / (trial_s + rest_s), 1)
    rec["seeded_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    server.client().put_object(Bucket=META_BUCKET, Key=bucket_name(layout) + ".seeded",
                               Body=json.dumps(rec).encode())
    log("keys: seeded %d keys in %.0f s (%.0f keys/s)" % (total, rec["seed_s"], rec["rate"]))
    rec["reused"] = False
    return rec


def main(argv=None):
    import argparse
    from . import servers as S
    p = argparse.ArgumentParser(prog="python3 -m bucketbench.keyseed")
    p.add_argument("--workdir", default="/tmp/bucketbench")
    p.add_argument("--keys", default=FULL_LAYOUT)
    p.add_argument("--port-offset", type=int, default=0)
    p.add_argument("--trial-only", action="store_true")
    p.add_argument("--limit-min", type=float, help="stop after the trial if the estimate is "
                   "above this many minutes")
    a = p.parse_args(argv)
    S.set_port_offset(a.port_offset)
    layout = parse_layout(a.keys)
    srv = KeysMinio(os.path.abspath(a.workdir), S.KEYS_MINIO_PORT, S.KEYS_CONSOLE_PORT,
                    S.ACCESS_KEY, S.SECRET_KEY, S.REGION)
    srv.start()
    try:
        rec = ensure_seed(srv, layout, a.limit_min and a.limit_min * 60, a.trial_only)
        print(json.dumps(rec, indent=1))
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
