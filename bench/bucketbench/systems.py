"""The filesystems under test, each able to mount, report its process and
version, and unmount.

| name         | what                                   | server        |
| ------------ | -------------------------------------- | ------------- |
| native       | a plain directory on local disk        | -             |
| bucketfs     | target/release/bucketfs, s3:// mount (passthrough on where possible, the default) | MinIO |
| bucketfs-gcs | target/release/bucketfs, gs:// mount   | fake-gcs      |
| bucketfs-tuned | s3:// with --preload-tree --metadata-ttl 10 (experiments 1, 4, 6, 7, 10) | MinIO |
| bucketfs-wb  | s3:// with --write-back: close returns once staged (experiments 2-7, 9) | MinIO |
| bucketfs-nopt | s3:// with --passthrough off (experiments 2, 3, 5 only: the on/off pairs) | MinIO |
| s3fs         | s3fs-fuse (Debian)                     | MinIO         |
| mountpoint-s3 | bench/mountpoint: mount-s3's defaults over the published mountpoint-s3-fs crate, with --allow-delete --allow-overwrite | MinIO |
| rclone-full  | rclone mount --vfs-cache-mode full     | MinIO         |
| rclone-off   | rclone mount --vfs-cache-mode off      | MinIO         |
| gcsfuse      | gcsfuse --implicit-dirs                | fake-gcs      |

Peers run in the foreground under a process we start, so their PID is known
for RSS sampling; bucketfs may daemonize, in which case its PID is found by the
mount point in /proc/*/cmdline. Mount time is measured from spawn until the
mount point is listed in /proc/self/mountinfo and a `stat` of it succeeds.
"""

import os
import shutil
import subprocess
import time

from . import plan
from . import servers as S
from .install import MOUNTPOINT_SRC, go_binary, mountpoint_binary
from .util import CmdError, end_process, is_mounted, log, run, tail

ALL_SYSTEMS = ["native", "bucketfs", "bucketfs-nopt", "bucketfs-wb", "bucketfs-tuned",
               "bucketfs-gcs", "s3fs", "mountpoint-s3", "rclone-full", "rclone-off", "gcsfuse"]
DEFAULT_SYSTEMS = ALL_SYSTEMS
MOUNT_TIMEOUT = 60


class MountError(Exception):
    pass


BACKENDS = {"s3": "MinIO (S3)", "gcs": "fake-gcs-server (GCS)", None: "local disk"}


class System:
    """Base: a filesystem that exposes the bucket's contents at `self.root`."""

    name = "?"
    # The store it reads: "s3" (MinIO), "gcs" (fake-gcs-server), or None (the local disk).
    store = None

    @property
    def backend(self):
        return BACKENDS[self.store]

    def __init__(self, ctx):
        self.ctx = ctx
        self.mp = os.path.join(ctx.workdir, "mnt", self.name)
        self.proc = None
        self.logpath = os.path.join(ctx.workdir, "logs", "%s.log" % self.name)
        self._pid = None

    @property
    def root(self):
        return self.mp

    def available(self):
        """None if the system can run here, else the reason it cannot."""
        return None

    def version(self):
        return None

    def pid(self):
        return None

    def mount(self):
        return 0.0

    def unmount(self):
        pass

    def prepare_fresh(self):
        """Called before a fresh mount: clear local caches of the system."""

    # What a mount reaches: the bench bucket through the proxies, unless `target` says
    # otherwise ({"bucket", "s3", "gcs"}: experiment 10 mounts its own bucket and MinIO).
    target = None

    def bucket(self):
        return (self.target or {}).get("bucket", S.BUCKET)

    def s3_endpoint(self):
        return (self.target or {}).get("s3", S.S3_ENDPOINT)

    def gcs_endpoint(self):
        return (self.target or {}).get("gcs", S.GCS_ENDPOINT)


class Native(System):
    name = "native"

    @property
    def root(self):
        return self.ctx.seed_dir

    def version(self):
        return "kernel %s" % os.uname().release


class FuseSystem(System):
    """A FUSE filesystem run as a child process in the foreground."""

    env = None

    def command(self):
        raise NotImplementedError

    def command_binary(self):
        return self.binary

    def _find_pid(self):
        """A process whose command line mentions our mount point."""
        mp = os.path.abspath(self.mp).encode()
        exe = os.path.basename(self.command_binary()).encode()
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == os.getpid():
                continue
            try:
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if mp in args and os.path.basename(args[0]) == exe:
                return int(d)
        return None

    def pid(self):
        if self.proc and self.proc.poll() is None:
            return self.proc.pid
        if self._pid and os.path.exists("/proc/%d" % self._pid):
            return self._pid
        self._pid = self._find_pid() if is_mounted(self.mp) else None
        return self._pid

    def mount(self):
        if is_mounted(self.mp):
            self.unmount()
        os.makedirs(self.mp, exist_ok=True)
        cmd = self.command()
        logf = open(self.logpath, "ab")
        logf.write(("\n=== %s\n" % " ".join(cmd)).encode())
        logf.flush()
        env = dict(os.environ)
        env.update(self.env or {})
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        logf.close()
        exited_at = None
        while True:
            if is_mounted(self.mp):
                break
            now = time.monotonic()
            if self.proc.poll() is not None:
                if self.proc.returncode != 0:
                    raise MountError("%s exited with %d before mounting: %s"
                                     % (self.name, self.proc.returncode, self._log_tail()))
                exited_at = exited_at or now
                if now - exited_at > 5:  # daemonized parent, but no mount appeared
                    raise MountError("%s exited (code 0) without mounting: %s"
                                     % (self.name, self._log_tail() or "no output"))
            if now - t0 > MOUNT_TIMEOUT:
                self._kill()
                raise MountError("%s did not mount within %ds: %s"
                                 % (self.name, MOUNT_TIMEOUT, self._log_tail()))
            time.sleep(0.005)
        try:
            run(["stat", self.mp], 30)
        except CmdError as e:
            self.unmount()
            raise MountError("%s mounted but stat of the mount point failed: %s"
                             % (self.name, e))
        dt = time.monotonic() - t0
        self._pid = None
        return dt

    def _log_tail(self):
        try:
            with open(self.logpath, "rb") as f:
                f.seek(max(0, os.path.getsize(self.logpath) - 600))
                return tail(f.read().decode("utf-8", "replace"), 500)
        except OSError:
            return ""

    def _unmount_cmd(self):
        return ["fusermount3", "-u", self.mp]

    def unmount(self):
        pid = self.pid()
        if is_mounted(self.mp):
            for attempt in range(3):
                try:
                    run(self._unmount_cmd(), 60)
                    break
                except (CmdError, OSError) as e:
                    if attempt < 2 and "busy" in str(e).lower():
                        time.sleep(1)  # a killed reader may still be on its way out
                        continue
                    log("%s: unmount failed (%s); lazy unmount" % (self.name, e))
                    try:
                        run(["fusermount3", "-uz", self.mp], 30)
                    except (CmdError, OSError) as e2:
                        log("%s: lazy unmount failed too: %s" % (self.name, e2))
                    break
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self._kill()
        elif pid:
            # a daemon we started that has lost its mount: ask it to stop
            for _ in range(100):
                if not os.path.exists("/proc/%d" % pid):
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, 15)
                except OSError:
                    pass
        self.proc = None
        self._pid = None

    def _kill(self):
        end_process(self.proc, 10)


S3_ENV = {"AWS_ACCESS_KEY_ID": S.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S.SECRET_KEY,
          "AWS_REGION": S.REGION, "AWS_DEFAULT_REGION": S.REGION}


class Bucketfs(FuseSystem):
    """bucketfs as its users run it (it daemonizes). The binary is copied to
    the work directory at the start, so a rebuild during the run does not mix
    two versions in one set of results."""

    def __init__(self, ctx, backend, extra=(), name=None, only=None):
        self.store = backend
        # the experiments (ids as strings) this system runs in; None: all
        self.only = only
        self.name = name or ("bucketfs" if backend == "s3" else "bucketfs-gcs")
        # Options a user can opt into (the tree loaded at mount, a longer metadata TTL).
        self.extra = list(extra)
        super().__init__(ctx)
        self.built = getattr(ctx, "bucketfs_bin", None) or os.path.join(
            ctx.repo, "target", "release", "bucketfs")
        self.binary = os.path.join(ctx.workdir, "bin", "bucketfs")
        self.env = S3_ENV if backend == "s3" else None
        self.snapshot = None
        # bucketfs's own store-request counters, summed over the mounts of one experiment
        # (each mount is a new process whose counters start at 0); read before each unmount
        self.metrics_url = None
        self.own_requests = {}
        # opens the kernel served from a local file itself (FUSE passthrough), summed the
        # same way; stays 0 with --passthrough off, or where it fell back off
        self.passthrough_opens = 0

    def available(self):
        if not os.path.exists(self.binary) or self.snapshot is None:
            if not os.access(self.built, os.X_OK):
                return "binary %s not built (cargo build --release)" % self.built
            self.snapshot = snapshot_binary(self.built, self.binary)
        return None

    def version(self):
        try:
            out = run([self.binary, "--version"], 10, check=False)[1].strip()
        except (CmdError, OSError):
            out = ""
        rev = ""
        try:
            rev = run(["git", "-C", self.ctx.repo, "rev-parse", "--short", "HEAD"], 10)[1].strip()
        except (CmdError, OSError):
            pass
        return (out or "bucketfs") + " (repo at git %s, binary built %s, sha256 %s)" % (
            rev, self.snapshot["built"], self.snapshot["sha256"][:12])

    def command(self):
        # A fresh block cache per system and run: a "first read" must never find blocks
        # that another system or an earlier run (same bucket URL) left on disk.
        cache = os.path.join(self.ctx.workdir, "cache-%s-%d" % (self.name, time.time_ns()))
        self.cache = cache
        port = free_port()
        self.metrics_url = "http://127.0.0.1:%d/metrics" % port
        common = ["--cache-dir", cache, "--metrics-addr", "127.0.0.1:%d" % port] + self.extra
        if self.store == "s3":
            return [self.binary, "mount", "s3://%s" % self.bucket(), self.mp,
                    "--endpoint", self.s3_endpoint()] + common
        return [self.binary, "mount", "gs://%s" % self.bucket(), self.mp,
                "--endpoint", self.gcs_endpoint(), "--anonymous"] + common

    def _unmount_cmd(self):
        return [self.binary, "unmount", self.mp]

    def unmount(self):
        """Unmount, then delete the mount's block cache: no later mount uses it (each has
        its own), and a run's caches filled the disk (1.4 GB each). Its request counters
        are read first and added to `own_requests`."""
        if self.metrics_url and is_mounted(self.mp):
            from .requests import bucketfs_metrics
            got = bucketfs_metrics(self.metrics_url)
            if got is not None:
                for op, n in got["requests"].items():
                    self.own_requests[op] = self.own_requests.get(op, 0) + n
                self.passthrough_opens += got["passthrough_opens"]
        self.metrics_url = None
        super().unmount()
        cache = getattr(self, "cache", None)
        if cache and not is_mounted(self.mp):
            shutil.rmtree(cache, ignore_errors=True)
            self.cache = None


class S3fs(FuseSystem):
    name = "s3fs"
    store = "s3"
    binary = "s3fs"

    def available(self):
        return None if shutil.which("s3fs") else "s3fs not installed"

    def version(self):
        try:
            out = run(["s3fs", "--version"], 10, check=False)[1]
            return out.splitlines()[0].strip()
        except (CmdError, OSError, IndexError):
            return None

    def command(self):
        pw = os.path.join(self.ctx.workdir, "s3fs.passwd")
        with open(pw, "w") as f:
            f.write("%s:%s\n" % (S.ACCESS_KEY, S.SECRET_KEY))
        os.chmod(pw, 0o600)
        return ["s3fs", self.bucket(), self.mp, "-f", "-o", "passwd_file=" + pw,
                "-o", "url=" + self.s3_endpoint(), "-o", "use_path_request_style",
                "-o", "endpoint=" + S.REGION, "-o", "dbglevel=warn"]


class Mountpoint(FuseSystem):
    """mountpoint-s3 (AWS's Rust FUSE client): bench/mountpoint's binary, our own `main`
    over the published mountpoint-s3-fs and mountpoint-s3-client crates with mount-s3's
    defaults (bench/README.md says how it differs from a released mount-s3). Mounted as
    mountpoint-s3's own benchmark script mounts it: with --allow-delete and
    --allow-overwrite (the harness deletes its scratch files and some tools replace
    files); nothing else changed from the defaults. It runs in the foreground and
    stops when unmounted."""

    name = "mountpoint-s3"
    store = "s3"
    # The report's line on it under the systems table (runner.py records it): how it is
    # mounted and what it refuses on a general purpose bucket (its doc/SEMANTICS.md), the
    # reasons behind its failures in experiments 3 and 6 (summary.KNOWN_FAILURES).
    note = ("bench/mountpoint's build of mountpoint-s3 (bench/README.md says how it differs "
            "from a released mount-s3), mounted with `--allow-delete --allow-overwrite` as "
            "mountpoint-s3's own benchmark mounts it. It cannot rename (MinIO: the rename "
            "\"succeeds\" with an empty new file, see experiment 6), append to a file, write out "
            "of order, overwrite a file without `--allow-overwrite` (with it, only when opened "
            "with `O_TRUNC`), or write to a file after `fsync`; a directory goes once its last "
            "file is deleted (experiments 4 and 5 make their scratch directory again when it "
            "has gone).")

    def __init__(self, ctx):
        super().__init__(ctx)
        self.binary = mountpoint_binary(ctx.workdir)
        self.env = dict(S3_ENV, AWS_EC2_METADATA_DISABLED="true")

    def available(self):
        if not os.access(self.binary, os.X_OK):
            return ("%s not built (bench/run builds it unless --no-install; see "
                    "logs/mountpoint-build.log)" % self.binary)
        return None

    def version(self):
        try:
            out = run([self.binary, "--version"], 10, check=False)[1].strip()
        except (CmdError, OSError):
            out = "bucketbench-mount-s3"
        pins = mountpoint_crate_versions()
        return "%s (%s)" % (out, ", ".join("%s %s" % kv for kv in pins.items())) if pins else out

    def command(self):
        return [self.binary, self.bucket(), self.mp, "--endpoint-url", self.s3_endpoint(),
                "--force-path-style", "--region", S.REGION,
                "--allow-delete", "--allow-overwrite", "--foreground"]


def mountpoint_crate_versions():
    """The mountpoint-s3 crates bench/mountpoint/Cargo.lock pins: {name: version}."""
    want = ("mountpoint-s3-fs", "mountpoint-s3-client", "mountpoint-s3-crt",
            "mountpoint-s3-crt-sys", "mountpoint-s3-fuser")
    found, name = {}, None
    try:
        with open(os.path.join(MOUNTPOINT_SRC, "Cargo.lock")) as f:
            for line in f:
                if line.startswith("name = "):
                    name = line.split('"')[1]
                elif line.startswith("version = ") and name in want:
                    found[name] = line.split('"')[1]
    except OSError:
        return {}
    return {n: found[n] for n in want if n in found}


class Rclone(FuseSystem):
    store = "s3"

    def __init__(self, ctx, mode):
        self.mode = mode
        self.name = "rclone-" + mode
        super().__init__(ctx)
        self.cache_dir = os.path.join(ctx.workdir, "rclone-cache", mode)
        self.binary = go_binary("rclone") or "rclone"

    def available(self):
        return None if go_binary("rclone") else "rclone not installed"

    def version(self):
        return go_version_string("rclone")

    def prepare_fresh(self):
        shutil.rmtree(self.cache_dir, ignore_errors=True)

    def command(self):
        conf = os.path.join(self.ctx.workdir, "rclone.conf")
        with open(conf, "w") as f:
            f.write("[minio]\ntype = s3\nprovider = Minio\naccess_key_id = %s\n"
                    "secret_access_key = %s\nendpoint = %s\nregion = %s\n"
                    % (S.ACCESS_KEY, S.SECRET_KEY, self.s3_endpoint(), S.REGION))
        os.makedirs(self.cache_dir, exist_ok=True)
        return [go_binary("rclone"), "mount", "minio:" + self.bucket(), self.mp,
                "--config", conf, "--vfs-cache-mode", self.mode,
                "--cache-dir", self.cache_dir, "--log-level", "NOTICE"]


class Gcsfuse(FuseSystem):
    name = "gcsfuse"
    store = "gcs"
    binary = "gcsfuse"

    def available(self):
        return None if go_binary("gcsfuse") else "gcsfuse not installed"

    def version(self):
        return go_version_string("gcsfuse")

    def command(self):
        # fake-gcs-server rejects the moveObject call gcsfuse uses for atomic
        # renames ("Metadata in the request couldn't decode"), which breaks
        # git; the hidden flag makes gcsfuse rename by copy + delete instead.
        return [go_binary("gcsfuse"), "--foreground",
                "--custom-endpoint", self.gcs_endpoint() + "/storage/v1/",
                "--anonymous-access", "--implicit-dirs",
                "--enable-atomic-rename-object=false", "--log-severity=warning",
                self.bucket(), self.mp]


_SNAPSHOTS = {}


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def snapshot_binary(src, dst):
    """Copy src to dst once per run; returns {built, sha256}."""
    if dst not in _SNAPSHOTS:
        import hashlib
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = dst + ".tmp"
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)
        with open(dst, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        _SNAPSHOTS[dst] = {"sha256": digest, "built": time.strftime(
            "%Y-%m-%d %H:%M UTC", time.gmtime(os.path.getmtime(src)))}
    return _SNAPSHOTS[dst]


def go_version_string(binary):
    """Module path and version the Go binary was built from."""
    return S.go_module_version(binary)


def make_system(ctx, name):
    if name == "native":
        return Native(ctx)
    if name == "bucketfs":
        return Bucketfs(ctx, "s3")
    if name == "bucketfs-gcs":
        return Bucketfs(ctx, "gcs")
    if name == "bucketfs-wb":
        # Write-back, as rclone's full cache: close returns once the file is on local disk
        # and uploads follow; unmount (timed by the harness only for mount) drains them.
        return Bucketfs(ctx, "s3", ["--write-back"], "bucketfs-wb", only=plan.only(name))
    if name == "bucketfs-nopt":
        # FUSE passthrough off (it is on by default): every read and write goes through
        # bucketfs, for the report's on/off pairs; those experiments only (pairs.py). Each
        # variant runs only where its flags change what is measured (plan.py).
        return Bucketfs(ctx, "s3", ["--passthrough", "off"], "bucketfs-nopt", only=plan.only(name))
    if name == "bucketfs-tuned":
        return Bucketfs(ctx, "s3", ["--preload-tree", "--metadata-ttl", "10"], "bucketfs-tuned",
                        only=plan.only(name))
    if name == "s3fs":
        return S3fs(ctx)
    if name == "mountpoint-s3":
        return Mountpoint(ctx)
    if name in ("rclone-full", "rclone-off"):
        return Rclone(ctx, name.split("-", 1)[1])
    if name == "gcsfuse":
        return Gcsfuse(ctx)
    raise ValueError("unknown system %r (known: %s)" % (name, ", ".join(ALL_SYSTEMS)))
