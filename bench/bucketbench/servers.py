"""The object servers, the network shaper and the seed data.

MinIO (S3 API) listens on 127.0.0.1:19000 (console 19001) and fake-gcs-server
on 127.0.0.1:14443. Clients never talk to them directly: toxiproxy (API on
18474) forwards 29000 -> MinIO and 24443 -> fake-gcs-server, and in the
`cloud` profile adds 10 ms of latency in each direction (about 20 ms per round
trip) and optionally a bandwidth cap. Seeding goes to the servers directly,
before any toxic is added. These ports differ from the test suite's 9000/4443.

Every process started here is remembered and stopped by `stop()`, which the
runner calls in a `finally` block.
"""

import concurrent.futures
import hashlib
import http.client
import json
import os
import random
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request

from .install import go_binary
from .util import end_process, log, port_free, wait_for

MINIO_PORT, MINIO_CONSOLE_PORT = 19000, 19001
GCS_PORT = 14443
TOXI_API_PORT = 18474
S3_PROXY_PORT, GCS_PROXY_PORT = 29000, 24443
# experiment 10's MinIO of its own (keyseed.py: its data is kept between runs) and its proxy
KEYS_MINIO_PORT, KEYS_CONSOLE_PORT, KEYS_PROXY_PORT = 19002, 19003, 29002
BUCKET = "bench"
ACCESS_KEY = "bucketbench"
SECRET_KEY = "bucketbench-secret-key"
REGION = "us-east-1"

S3_ENDPOINT = "http://127.0.0.1:%d" % S3_PROXY_PORT
GCS_ENDPOINT = "http://127.0.0.1:%d" % GCS_PROXY_PORT
KEYS_ENDPOINT = "http://127.0.0.1:%d" % KEYS_PROXY_PORT

TREE_FILES, TREE_DIRS = 2000, 100


def set_port_offset(offset):
    """Shift every port by `offset` (bench/run --port-offset), for when another
    process already holds the default ones."""
    global MINIO_PORT, MINIO_CONSOLE_PORT, GCS_PORT, TOXI_API_PORT
    global S3_PROXY_PORT, GCS_PROXY_PORT, S3_ENDPOINT, GCS_ENDPOINT
    global KEYS_MINIO_PORT, KEYS_CONSOLE_PORT, KEYS_PROXY_PORT, KEYS_ENDPOINT
    MINIO_PORT, MINIO_CONSOLE_PORT = 19000 + offset, 19001 + offset
    KEYS_MINIO_PORT, KEYS_CONSOLE_PORT = 19002 + offset, 19003 + offset
    KEYS_PROXY_PORT = 29002 + offset
    KEYS_ENDPOINT = "http://127.0.0.1:%d" % KEYS_PROXY_PORT
    GCS_PORT, TOXI_API_PORT = 14443 + offset, 18474 + offset
    S3_PROXY_PORT, GCS_PROXY_PORT = 29000 + offset, 24443 + offset
    S3_ENDPOINT = "http://127.0.0.1:%d" % S3_PROXY_PORT
    GCS_ENDPOINT = "http://127.0.0.1:%d" % GCS_PROXY_PORT


def tree_dirs():
    """100 directories up to four levels deep: 5 top, 4 under each, 3 under
    each of those, and 15 at the fourth level."""
    dirs = []
    for a in range(5):
        dirs.append("d%d" % a)
    for a in range(5):
        for b in range(4):
            dirs.append("d%d/e%d" % (a, b))
    for a in range(5):
        for b in range(4):
            for c in range(3):
                dirs.append("d%d/e%d/f%d" % (a, b, c))
    for i in range(15):
        a, b = divmod(i, 4)
        dirs.append("d%d/e%d/f0/g%d" % (a, b, i))
    assert len(dirs) == TREE_DIRS
    return dirs


class Servers:
    """Starts, seeds, shapes and stops the servers for one run."""

    def __init__(self, workdir, profile, bandwidth=None):
        self.workdir = workdir
        self.profile = profile
        self.bandwidth = bandwidth
        self.procs = []  # (name, Popen, logfile)
        self.on_stop = []  # more to stop at the end (experiment 10's MinIO)
        self.logdir = os.path.join(workdir, "logs")
        os.makedirs(self.logdir, exist_ok=True)

    # ---- processes -------------------------------------------------
    def _spawn(self, name, cmd, env=None):
        logf = open(os.path.join(self.logdir, name + ".log"), "ab")
        full_env = dict(os.environ)
        full_env.update(env or {})
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=full_env,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append((name, p, logf))
        log("started %s (pid %d)" % (name, p.pid))
        return p

    def start(self):
        for port in (MINIO_PORT, MINIO_CONSOLE_PORT, GCS_PORT, TOXI_API_PORT,
                     S3_PROXY_PORT, GCS_PROXY_PORT, KEYS_PROXY_PORT):
            if not port_free(port):
                raise RuntimeError("port %d on 127.0.0.1 is already in use by a process "
                                   "this run did not start; try --port-offset" % port)
        for b in ("minio", "fake-gcs-server", "server"):
            if not go_binary(b):
                raise RuntimeError("%s is not installed" % b)
        data = os.path.join(self.workdir, "minio-data")
        shutil.rmtree(data, ignore_errors=True)
        os.makedirs(data)
        self._spawn("minio", [go_binary("minio"), "server", data, "--address",
                              "127.0.0.1:%d" % MINIO_PORT, "--console-address",
                              "127.0.0.1:%d" % MINIO_CONSOLE_PORT],
                    env={"MINIO_ROOT_USER": ACCESS_KEY, "MINIO_ROOT_PASSWORD": SECRET_KEY,
                         "MINIO_BROWSER": "off",
                         # per-API request counters without a token (requests.py)
                         "MINIO_PROMETHEUS_AUTH_TYPE": "public"})
        self._spawn("fake-gcs-server", [
            go_binary("fake-gcs-server"), "-scheme", "http", "-host", "127.0.0.1",
            "-port", str(GCS_PORT), "-public-host", "127.0.0.1:%d" % GCS_PROXY_PORT,
            "-backend", "memory", "-log-level", "warn"])
        cfg = os.path.join(self.workdir, "toxiproxy.json")
        with open(cfg, "w") as f:
            json.dump([
                {"name": "minio", "listen": "127.0.0.1:%d" % S3_PROXY_PORT,
                 "upstream": "127.0.0.1:%d" % MINIO_PORT, "enabled": True},
                {"name": "gcs", "listen": "127.0.0.1:%d" % GCS_PROXY_PORT,
                 "upstream": "127.0.0.1:%d" % GCS_PORT, "enabled": True},
                # experiment 10's MinIO (keyseed.py), started only when it runs
                {"name": "keys", "listen": "127.0.0.1:%d" % KEYS_PROXY_PORT,
                 "upstream": "127.0.0.1:%d" % KEYS_MINIO_PORT, "enabled": True},
            ], f)
        self._spawn_proxy(cfg)
        checks = [
            ("minio", "http://127.0.0.1:%d/minio/health/live" % MINIO_PORT),
            ("fake-gcs-server", "http://127.0.0.1:%d/storage/v1/b" % GCS_PORT),
            ("toxiproxy", "http://127.0.0.1:%d/version" % TOXI_API_PORT),
        ]
        for name, url in checks:
            self._wait_ready(name, url)
            self._check_alive()
        self._create_buckets()

    def _wait_ready(self, name, url):
        if not wait_for(lambda: urllib.request.urlopen(url, timeout=2).status == 200, 60, 0.2):
            raise RuntimeError("%s did not become ready (see %s)" % (name, self.logdir))

    @staticmethod
    def _end(p):
        """Stop process `p`: SIGTERM, then SIGKILL after 15 s."""
        end_process(p, 15)

    def _spawn_proxy(self, cfg):
        self._spawn("toxiproxy", [go_binary("server"), "-host", "127.0.0.1",
                                  "-port", str(TOXI_API_PORT), "-config", cfg])

    def fresh_proxy(self):
        """Restart toxiproxy (its proxies come from its config; the profile's toxics are
        added again). Under hours of load its memory grows without bound (20 GB after an
        hour of experiment 3 here, then the machine ran out of memory), so the suite gives
        every (experiment, system) a fresh one. Returns its RSS in MB before the restart."""
        rss = self.proxy_rss_mb()
        for i, (name, p, logf) in enumerate(self.procs):
            if name != "toxiproxy":
                continue
            self._end(p)
            logf.close()
            del self.procs[i]
            break
        if not wait_for(lambda: port_free(TOXI_API_PORT) and port_free(S3_PROXY_PORT)
                        and port_free(GCS_PROXY_PORT) and port_free(KEYS_PROXY_PORT), 30, 0.2):
            raise RuntimeError("toxiproxy's ports stayed busy after it stopped")
        self._spawn_proxy(os.path.join(self.workdir, "toxiproxy.json"))
        self._wait_ready("toxiproxy", "http://127.0.0.1:%d/version" % TOXI_API_PORT)
        self.apply_profile(quiet=True)
        return rss

    def proxy_rss_mb(self):
        """toxiproxy's resident memory in MB (0 if it is not running)."""
        for name, p, _ in self.procs:
            if name == "toxiproxy":
                try:
                    with open("/proc/%d/status" % p.pid) as f:
                        return next((int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS:")), 0)
                except OSError:
                    return 0
        return 0

    def _check_alive(self):
        for name, p, _ in self.procs:
            if p.poll() is not None:
                raise RuntimeError("%s exited with %s; see %s/%s.log"
                                   % (name, p.returncode, self.logdir, name))

    def stop(self):
        for f in self.on_stop:
            try:
                f()
            except Exception as e:  # the rest must still stop
                log("stopping: %s" % e)
        for name, p, logf in reversed(self.procs):
            self._end(p)
            logf.close()
            log("stopped %s" % name)
        self.procs = []
        # The next start wipes it anyway; MinIO's trash of deleted uploads (experiment 8)
        # reached 23 GB here.
        shutil.rmtree(os.path.join(self.workdir, "minio-data"), ignore_errors=True)

    def request_counter(self):
        """MinIO's own per-API request counters (requests.py), read and marked directly,
        not through the proxy."""
        from .rawlink import Link
        from .requests import MinioCounter
        direct = Link("http://127.0.0.1:%d" % MINIO_PORT, BUCKET, ACCESS_KEY, SECRET_KEY, REGION)
        return MinioCounter("http://127.0.0.1:%d/minio/v2/metrics/node" % MINIO_PORT,
                            direct.marker)

    # ---- buckets and seeding ----------------------------------------
    def s3(self, direct=True):
        import boto3
        from botocore.config import Config
        port = MINIO_PORT if direct else S3_PROXY_PORT
        return boto3.client("s3", endpoint_url="http://127.0.0.1:%d" % port,
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                            region_name=REGION,
                            config=Config(max_pool_connections=16,
                                          retries={"max_attempts": 5}))

    def _create_buckets(self):
        self.s3().create_bucket(Bucket=BUCKET)
        req = urllib.request.Request(
            "http://127.0.0.1:%d/storage/v1/b" % GCS_PORT, method="POST",
            data=json.dumps({"name": BUCKET}).encode(),
            headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=30).read()

    def _gcs_upload(self, key, path):
        conn = http.client.HTTPConnection("127.0.0.1", GCS_PORT, timeout=300)
        size = os.path.getsize(path)
        url = "/upload/storage/v1/b/%s/o?uploadType=media&name=%s" % (
            BUCKET, urllib.parse.quote(key, safe=""))
        with open(path, "rb") as f:
            conn.request("POST", url, body=f, headers={
                "Content-Type": "application/octet-stream", "Content-Length": str(size)})
            resp = conn.getresponse()
            body = resp.read()
        conn.close()
        if resp.status != 200:
            raise RuntimeError("GCS upload %s: %s %s" % (key, resp.status, body[:200]))

    def seed(self, seed_dir, prefixes):
        """Upload the files under seed_dir/<prefix> to both buckets."""
        files = []
        for prefix in prefixes:
            root = os.path.join(seed_dir, prefix)
            if os.path.isfile(root):
                files.append((prefix, root))
            for dp, _, fns in os.walk(root):
                for fn in fns:
                    p = os.path.join(dp, fn)
                    files.append((os.path.relpath(p, seed_dir), p))
        t0 = time.monotonic()
        s3 = self.s3()
        jobs = [(s3.upload_file, (p, BUCKET, k)) for k, p in files]
        jobs += [(self._gcs_upload, (k, p)) for k, p in files]
        jobs.sort(key=lambda j: -os.path.getsize(j[1][0] if j[0] == s3.upload_file
                                                  else j[1][1]))
        with concurrent.futures.ThreadPoolExecutor(12) as ex:
            for fut in [ex.submit(fn, *a) for fn, a in jobs]:
                fut.result()
        log("seeded %d objects into both buckets in %.1fs" % (len(files), time.monotonic() - t0))

    # ---- network shaping ---------------------------------------------
    def _toxi(self, method, path, body=None):
        req = urllib.request.Request(
            "http://127.0.0.1:%d%s" % (TOXI_API_PORT, path), method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json"})
        return urllib.request.urlopen(req, timeout=10).read()

    def apply_profile(self, quiet=False):
        """Add the toxics of the profile to both proxies."""
        toxics = []
        if self.profile == "cloud":
            for stream in ("upstream", "downstream"):
                toxics.append({"name": "latency_" + stream, "type": "latency",
                               "stream": stream, "attributes": {"latency": 10, "jitter": 0}})
        if self.bandwidth:
            rate_kb = int(self.bandwidth * 1000)  # toxiproxy's rate is in KB/s
            for stream in ("upstream", "downstream"):
                toxics.append({"name": "bandwidth_" + stream, "type": "bandwidth",
                               "stream": stream, "attributes": {"rate": rate_kb}})
        for proxy in ("minio", "gcs", "keys"):
            for t in toxics:
                self._toxi("POST", "/proxies/%s/toxics" % proxy, t)
        if toxics and not quiet:
            log("toxics on both proxies: " + ", ".join(t["name"] for t in toxics))
        return toxics

    def versions(self):
        return {"minio": go_module_version("minio"),
                "fake-gcs-server": go_module_version("fake-gcs-server"),
                "toxiproxy": go_module_version("server")}


def go_module_version(binary):
    """`mod` line of `go version -m` for an installed Go binary."""
    path = go_binary(binary)
    if not path:
        return None
    try:
        out = subprocess.run(["go", "version", "-m", path], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == "mod" and len(parts) >= 3:
            return "%s %s" % (parts[1], parts[2])
    return None


# ---- seed data on local disk ------------------------------------------------
def _write_random(path, size, rng):
    h = hashlib.md5()
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 1 << 20)
            chunk = rng.randbytes(n)
            f.write(chunk)
            h.update(chunk)
            left -= n
    return h.hexdigest()


def make_seed(seed_dir, big_sizes_mb):
    """Create (or reuse) the seed data; returns the manifest {relpath: md5}.

    tree/: 2,000 small files (1-8 KiB) in 100 directories up to four deep.
    big/: one file per size in big_sizes_mb, named f<size>M.
    """
    manifest_path = os.path.join(seed_dir, "manifest.json")
    manifest = {}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
    rng = random.Random(20260101)
    tree = os.path.join(seed_dir, "tree")
    if not os.path.isdir(tree):
        tmp = tree + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        dirs = tree_dirs()
        for d in dirs:
            os.makedirs(os.path.join(tmp, d))
        for i in range(TREE_FILES):
            d = dirs[i % TREE_DIRS]
            with open(os.path.join(tmp, d, "file%04d.txt" % i), "wb") as f:
                f.write(rng.randbytes(rng.randint(1024, 8192)))
        os.rename(tmp, tree)
    os.makedirs(os.path.join(seed_dir, "big"), exist_ok=True)
    for mb in big_sizes_mb:
        rel = "big/f%dM" % mb
        p = os.path.join(seed_dir, rel)
        if rel in manifest and os.path.exists(p) and os.path.getsize(p) == mb << 20:
            continue
        log("creating seed file %s" % rel)
        manifest[rel] = _write_random(p, mb << 20, random.Random(mb))
        with open(manifest_path, "w") as f:
            json.dump(manifest, f, indent=1)
    return manifest


class ProxyGuard:
    """Watches toxiproxy's memory while one system runs one experiment. Some loads make it
    buffer without bound (rclone without a cache, 16 random readers of a 200 MB file: 16 GB
    in two minutes here); past `limit_mb` it is restarted at once, cutting the connections
    in flight, before it takes the machine down. `restarts` says how often (the report
    marks that system's figures for the experiment). A restart that fails (a new proxy
    not configured in time, under load) is tried again once; `failed` counts those that
    failed twice, after which the link may be down for the rest of the experiment."""

    def __init__(self, srv, limit_mb=6144, every=1.0):
        self.srv, self.limit_mb, self.every = srv, limit_mb, every
        self.restarts, self.failed, self.peak_mb = 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(60)

    def _watch(self):
        while not self._stop.wait(self.every):
            mb = self.srv.proxy_rss_mb()
            self.peak_mb = max(self.peak_mb, mb)
            if mb > self.limit_mb:
                log("toxiproxy holds %d MB (limit %d): restarted mid-experiment" % (mb, self.limit_mb))
                self.restarts += 1
                for attempt in (1, 2):
                    try:
                        self.srv.fresh_proxy()
                        break
                    except (RuntimeError, OSError) as e:
                        log("toxiproxy restart failed (attempt %d): %s" % (attempt, e))
                        if attempt == 2:
                            self.failed += 1
                        else:
                            self._stop.wait(2)
