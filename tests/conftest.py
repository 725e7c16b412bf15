"""Shared fixtures for the real-mount tests.

Environment (scripts/test exports all of these; defaults suit a manual run after
`scripts/test-env.sh start`):
  BUCKETFS_BIN                 the binary (default: target/release/bucketfs)
  BUCKETFS_TEST_S3_ENDPOINT    MinIO (default http://127.0.0.1:9000)
  BUCKETFS_TEST_GCS_ENDPOINT   fake-gcs-server (default http://127.0.0.1:4443)
  BUCKETFS_TEST_DRIVE_ENDPOINT the Drive API emulator (default http://127.0.0.1:4700)
  BUCKETFS_TEST_MNT_ROOT       where mount points are created (default: a temp dir)
  BUCKETFS_TEST_FILE_ROOT      where file:// "buckets" live (default: a temp dir)
If the endpoint variables are unset and a server does not answer, its tests are skipped;
if they are set (as scripts/test does), an unreachable server is a failure.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import seed  # noqa: E402

BIN = os.environ.get("BUCKETFS_BIN") or os.path.join(REPO, "target", "release", "bucketfs")
MNT_ROOT = os.environ.get("BUCKETFS_TEST_MNT_ROOT") or tempfile.mkdtemp(prefix="bucketfs-mnt-")
os.makedirs(MNT_ROOT, exist_ok=True)
# Block caches and staging of the mounts under test live here, not in ~/.cache (each mount's
# disk cache may grow to 2 GiB; hundreds of mounts filled the disk once). Removed at exit.
CACHE_HOME = tempfile.mkdtemp(prefix="bucketfs-test-cache-")

DATA_STORES = ["s3", "gcs", "file", "gdrive"]  # stores we can seed
ALL_STORES = DATA_STORES + ["mem"]            # mem:// starts empty
MOUNT_TIMEOUT = 60
CLI_TIMEOUT = 30
WRITE_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)

_live_mounts: set[str] = set()


# --------------------------------------------------------------------------- helpers

def _server_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return 200 <= r.status < 300
    except Exception:
        return False


_store_ok: dict[str, bool] = {}


def require_store(store: str) -> None:
    """Skip (manual run) or fail (scripts/test run) if the store's server is down."""
    if store in ("file", "mem"):
        return
    if store not in _store_ok:
        if store == "s3":
            _store_ok[store] = _server_ok(seed.S3_ENDPOINT + "/minio/health/live")
        elif store == "gdrive":
            _store_ok[store] = _server_ok(seed.drive_seed.ENDPOINT + "/_control/stats")
        else:
            _store_ok[store] = _server_ok(seed.GCS_ENDPOINT + "/storage/v1/b?project=test")
    if not _store_ok[store]:
        var = {"s3": "BUCKETFS_TEST_S3_ENDPOINT", "gdrive": "BUCKETFS_TEST_DRIVE_ENDPOINT"}.get(store, "BUCKETFS_TEST_GCS_ENDPOINT")
        msg = f"{store} server not reachable (start it with scripts/test-env.sh start)"
        if os.environ.get(var):
            pytest.fail(msg)
        pytest.skip(msg)


def require_bin() -> str:
    if not os.path.exists(BIN):
        pytest.fail(f"bucketfs binary not found at {BIN} (cargo build --release)")
    return BIN


MiB = 1024 * 1024


def md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


def md5_file(path: str) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(MiB):
            h.update(chunk)
    return h.hexdigest()


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def write_file(path: str, data: bytes, chunk: int = MiB) -> None:
    """open/write in `chunk`s/close; close's error (the upload) propagates."""
    with open(path, "wb") as f:
        for i in range(0, len(data), chunk):
            f.write(data[i:i + chunk])


def bucketfs_env(**overrides) -> dict:
    env = dict(os.environ)
    env["XDG_CACHE_HOME"] = CACHE_HOME
    for k, v in seed.s3_env().items():
        env.setdefault(k, v)
    env.pop("RUST_LOG", None)
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def free_port() -> int:
    """A loopback TCP port free right now (for --metrics-addr and the like)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def new_bucket_name() -> str:
    return "bfs-" + uuid.uuid4().hex[:20]


def new_mountpoint() -> str:
    mp = os.path.join(MNT_ROOT, "mp-" + uuid.uuid4().hex[:12])
    os.makedirs(mp)
    return mp


def run_cli(args, env=None, timeout=CLI_TIMEOUT) -> subprocess.CompletedProcess:
    """Run the bucketfs binary; fail the test (not hang) if it takes longer than `timeout`."""
    cmd = [require_bin()] + list(args)
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env or bucketfs_env(), stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout}s "
                    f"(stderr so far: {(e.stderr or b'').decode(errors='replace')[-500:]!r})")
    p.elapsed = time.monotonic() - t0
    p.err = p.stderr.decode(errors="replace")
    p.out = p.stdout.decode(errors="replace")
    return p


def store_args(store: str, bucket: str | None = None, prefix: str = "") -> list[str]:
    if store == "mem":
        return ["mem://"]
    return [seed.mount_url(store, bucket, prefix)] + seed.mount_extra_args(store)


def mount(args, env=None, timeout=MOUNT_TIMEOUT) -> str:
    """`bucketfs mount ARGS[0] MP ARGS[1:]` on a fresh mount point; returns MP (asserts success)."""
    mp = new_mountpoint()
    argv = ["mount", args[0], mp] + list(args[1:]) if args else ["mount", mp]
    _live_mounts.add(mp)
    p = run_cli(argv, env=env, timeout=timeout)
    if p.returncode != 0:
        force_unmount(mp)
        pytest.fail(f"bucketfs {' '.join(argv)} exited {p.returncode}: {p.err.strip()[-2000:]}")
    return mp


def is_mounted(mp: str) -> bool:
    """Like os.path.ismount, but reads the mount table, so it can't hang on a dead FUSE mount."""
    mp = os.path.realpath(mp)
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 1 and parts[1].encode().decode("unicode_escape") == mp:
                return True
    return False


def force_unmount(mp: str) -> None:
    if is_mounted(mp):
        subprocess.run(["fusermount3", "-u", "-z", mp], capture_output=True, timeout=30)
    if is_mounted(mp):
        subprocess.run(["umount", "-l", mp], capture_output=True, timeout=30)
    _live_mounts.discard(mp)


def unmount(mp: str) -> subprocess.CompletedProcess | None:
    """`bucketfs unmount MP`, falling back to `fusermount3 -u -z`. Never raises."""
    p = None
    if is_mounted(mp):
        try:
            p = subprocess.run([BIN, "unmount", mp], capture_output=True, timeout=CLI_TIMEOUT,
                               stdin=subprocess.DEVNULL)
        except (subprocess.TimeoutExpired, OSError):
            p = None
    force_unmount(mp)
    with contextlib.suppress(OSError):
        os.rmdir(mp)
    return p


@contextlib.contextmanager
def mounted(args, env=None):
    mp = mount(args, env=env)
    try:
        yield mp
    finally:
        unmount(mp)


def daemon_pids(mp: str) -> list[int]:
    """Live (non-zombie) bucketfs processes whose command line names MP."""
    pids = []
    mpb = os.fsencode(mp)
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{d}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if not cmd or mpb not in cmd or state == b"Z":
            continue
        try:
            exe = os.readlink(f"/proc/{d}/exe").removesuffix(" (deleted)")
        except OSError:
            exe = ""
        if os.path.basename(cmd[0]).startswith(b"bucketfs") or exe == os.path.realpath(BIN):
            pids.append(int(d))
    return pids


def wait_until(pred, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def walk_tree(mp: str) -> tuple[set[str], set[str]]:
    """(files, dirs) relative to mp, via os.walk, with symlinks not followed."""
    files, dirs = set(), set()
    for dp, dns, fns in os.walk(mp, onerror=_raise):
        rel = os.path.relpath(dp, mp)
        for n in dns:
            dirs.add(n if rel == "." else f"{rel}/{n}")
        for n in fns:
            files.add(n if rel == "." else f"{rel}/{n}")
    return files, dirs


def _raise(e):
    raise e


def implied_dirs(keys) -> set[str]:
    out = set()
    for k in keys:
        parts = k.rstrip("/").split("/")
        for i in range(1, len(parts) if not k.endswith("/") else len(parts) + 1):
            out.add("/".join(parts[:i]))
    return out


def upload_all(store: str, bucket: str, data: dict[str, bytes]) -> None:
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda kv: seed.put(store, bucket, kv[0], kv[1]), data.items()))


class Bucket:
    """A fresh bucket on one store, deleted afterwards."""

    def __init__(self, store: str):
        self.store = store
        self.name = new_bucket_name()
        seed.make_bucket(store, self.name)

    def put(self, key: str, data: bytes) -> None:
        seed.put(self.store, self.name, key, data)

    def put_all(self, data: dict[str, bytes]) -> None:
        upload_all(self.store, self.name, data)

    def args(self, prefix: str = "") -> list[str]:
        return store_args(self.store, self.name, prefix)

    def mounted(self, prefix: str = "", extra=(), env=None):
        return mounted(self.args(prefix) + list(extra), env=env)

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            seed.delete_bucket(self.store, self.name)


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session", autouse=True)
def _cleanup_mounts_at_exit():
    yield
    for mp in list(_live_mounts):
        unmount(mp)
    shutil.rmtree(CACHE_HOME, ignore_errors=True)


@pytest.fixture
def bin_path() -> str:
    return require_bin()


@pytest.fixture(params=DATA_STORES)
def data_store(request) -> str:
    require_store(request.param)
    require_bin()
    return request.param


@pytest.fixture(params=ALL_STORES)
def any_store(request) -> str:
    require_store(request.param)
    require_bin()
    return request.param


@pytest.fixture
def bucket(data_store):
    b = Bucket(data_store)
    yield b
    b.cleanup()


@pytest.fixture
def rng(request) -> random.Random:
    s = random.randrange(1 << 30)
    print(f"random seed for {request.node.name}: {s}")
    return random.Random(s)


def _fresh_bucket(store: str):
    require_store(store)
    require_bin()
    b = Bucket(store)
    yield b
    b.cleanup()


@pytest.fixture
def s3_bucket():
    yield from _fresh_bucket("s3")


@pytest.fixture
def gcs_bucket():
    yield from _fresh_bucket("gcs")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running real-mount test (git clone, 100 MB); -m 'not slow' skips")


# --------------------------------------------------------------------------- fault injection
# (toxiproxy, bounded calls, daemon memory: used by test_faults.py and test_concurrency.py)

TOXI_API = "http://127.0.0.1:" + os.environ.get("BUCKETFS_TEST_TOXI_PORT", "8474")


class Toxiproxy:
    """A tiny client for toxiproxy's HTTP API (scripts/test-env.sh starts the server)."""

    def __init__(self, api: str = TOXI_API):
        self.api = api.rstrip("/")

    def req(self, method: str, path: str, body=None):
        import json
        data = None if body is None else json.dumps(body).encode()
        r = urllib.request.Request(self.api + path, data=data, method=method,
                                   headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(r, timeout=10) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"toxiproxy {method} {path}: HTTP {e.code} {e.read()[:300]!r}") from e
        return json.loads(raw) if raw.strip() else None

    def ok(self) -> bool:
        try:
            self.req("GET", "/proxies")
            return True
        except Exception:
            return False

    def proxy(self, upstream: str) -> "ToxiProxy":
        """A fresh proxy on a free loopback port to `upstream` (host:port); delete it after."""
        name = "bfs-" + uuid.uuid4().hex[:12]
        p = self.req("POST", "/proxies", {"name": name, "listen": "127.0.0.1:0",
                                          "upstream": upstream, "enabled": True})
        return ToxiProxy(self, name, p["listen"])


class ToxiProxy:
    def __init__(self, api: Toxiproxy, name: str, listen: str):
        self.api, self.name, self.listen = api, name, listen
        self.port = int(listen.rsplit(":", 1)[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def toxic(self, type_: str, stream: str = "downstream", toxicity: float = 1.0, **attrs) -> str:
        name = f"{type_}-{stream}-{uuid.uuid4().hex[:6]}"
        self.api.req("POST", f"/proxies/{self.name}/toxics",
                     {"name": name, "type": type_, "stream": stream, "toxicity": toxicity,
                      "attributes": attrs})
        return name

    def remove(self, toxic: str) -> None:
        self.api.req("DELETE", f"/proxies/{self.name}/toxics/{toxic}")

    def clear(self) -> None:
        for t in self.api.req("GET", f"/proxies/{self.name}/toxics") or []:
            self.remove(t["name"])

    def set_enabled(self, on: bool) -> None:
        """Disabled: the listener is closed and every open connection is cut (server 'down')."""
        self.api.req("POST", f"/proxies/{self.name}", {"enabled": on})

    def delete(self) -> None:
        with contextlib.suppress(Exception):
            self.api.req("DELETE", f"/proxies/{self.name}")


@pytest.fixture(scope="session")
def toxiproxy() -> Toxiproxy:
    """The toxiproxy API; skipped on a manual run without it, a failure under scripts/test."""
    t = Toxiproxy()
    if not t.ok():
        msg = f"toxiproxy not reachable at {TOXI_API} (scripts/test-env.sh start starts it)"
        if os.environ.get("BUCKETFS_TEST_S3_ENDPOINT") and os.environ.get("BUCKETFS_TEST_TOXIPROXY", "1") != "0":
            pytest.fail(msg)
        pytest.skip(msg)
    return t


def upstream_of(store: str) -> str:
    """host:port of the real server behind a store (what a proxy forwards to)."""
    url = seed.S3_ENDPOINT if store == "s3" else seed.GCS_ENDPOINT
    return url.split("://", 1)[1].rstrip("/")


class Outcome:
    """What a bounded call did: `value` or `error` (an exception), and `elapsed` seconds."""

    def __init__(self):
        self.value = None
        self.error: BaseException | None = None
        self.elapsed = 0.0
        self.hung = False

    @property
    def errno(self):
        return getattr(self.error, "errno", None)

    def __repr__(self):
        if self.hung:
            return f"<still blocked after {self.elapsed:.0f}s>"
        what = f"error {self.error!r}" if self.error else "ok"
        return f"<{what} after {self.elapsed:.1f}s>"


def bounded_call(fn, limit: float, what: str) -> Outcome:
    """Run fn() in a thread; fail the test if it has not returned after `limit` seconds
    (a hung FUSE request). The thread is a daemon, so a hang cannot block pytest's exit."""
    import threading
    out = Outcome()

    def run():
        t0 = time.monotonic()
        try:
            out.value = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            out.error = e
        out.elapsed = time.monotonic() - t0

    th = threading.Thread(target=run, daemon=True, name=f"bounded:{what}")
    th.start()
    th.join(limit)
    if th.is_alive():
        pytest.fail(f"{what}: still blocked after {limit:.0f}s (a FUSE call that never returns)")
    return out


def bounded_calls(ops: dict, limit: float) -> dict[str, Outcome]:
    """Run every fn of {name: fn} at once, each in its own daemon thread; wait at most `limit`
    seconds in total. An Outcome whose call had not returned by then has `hung` set."""
    import threading
    outs = {name: Outcome() for name in ops}

    def run(fn, out):
        t0 = time.monotonic()
        try:
            out.value = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            out.error = e
        out.elapsed = time.monotonic() - t0
        out.done = True

    ths = []
    for name, fn in ops.items():
        outs[name].done = False
        th = threading.Thread(target=run, args=(fn, outs[name]), daemon=True, name=f"bounded:{name}")
        th.start()
        ths.append(th)
    deadline = time.monotonic() + limit
    for th in ths:
        th.join(max(0.0, deadline - time.monotonic()))
    for o in outs.values():
        o.hung = not o.done
        if o.hung:
            o.elapsed = limit
    return outs


def daemon_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM (kB) and Threads of a process, from /proc/PID/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "Threads"):
                out[k] = int(v.split()[0])
    return out
