"""Shared parts of the write-back promise tests (test_write_back_promises.py: crashes,
races; test_write_back_hangs.py: a store that hangs): limits, helpers, and the private MinIO
the hang tests stop with SIGSTOP (module fixture `private_minio`, continued in a `finally`
by `hung_minio`): a store that accepts connections and never answers, as the bug was
reported, not one that refuses them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request

import pytest

import conftest
import seed
from conftest import daemon_pids, force_unmount, free_port, md5, read_file, run_cli, wait_until, walk_tree

MiB = 1024 * 1024
# How long a local call may take while the store hangs (the store stays stopped far longer).
LOCAL_CALL_LIMIT = 5.0
# How long a writer may take while its file's upload hangs: the daemon waits 5 s for the
# upload (WRITER_PATIENCE), then cuts it off; an open and a write may each wait once.
WRITER_LIMIT = 30.0
# How long the store stays stopped in the hang test.
HANG_SECS = 30.0
# How long `bucketfs sync` may take to report a hung store where it has no --timeout option,
# and the --timeout given where it has.
SYNC_HANG_LIMIT = 60.0
SYNC_TIMEOUT = 15
MINIO_BIN = os.environ.get("BUCKETFS_TEST_MINIO_BIN") or os.path.expanduser("~/go/bin/minio")


# --------------------------------------------------------------------------- helpers


def files_only(objs: dict[str, bytes]) -> dict[str, bytes]:
    """Drop the directory markers (`d/`)."""
    return {k: v for k, v in objs.items() if not k.endswith("/")}


def sync(mp: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_cli(["sync", mp], timeout=timeout)


def kill_daemon(mp: str, pids: list[int] | None = None) -> None:
    """`kill -9` every daemon of MP (PIDS if given: found beforehand, for a kill on time),
    wait for them to die, and detach the dead mount."""
    pids = pids or daemon_pids(mp)
    assert pids, f"no bucketfs daemon serves {mp}"
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    assert wait_until(lambda: not daemon_pids(mp), 30), f"daemon of {mp} survived kill -9"
    force_unmount(mp)


def remount(mp: str, args: list[str]) -> None:
    """Mount ARGS again on the same mount point (and so the same staging directory)."""
    os.makedirs(mp, exist_ok=True)
    conftest._live_mounts.add(mp)  # unmounted at session end if the test fails first
    r = run_cli(["mount", args[0], mp] + args[1:], timeout=120)
    assert r.returncode == 0, f"remount failed ({r.returncode}): {r.err[-2000:]}"


def mount_view(mp: str) -> tuple[dict[str, str], set[str]]:
    """({file: md5 of its bytes}, dirs) of the whole mount, relative to it."""
    files, dirs = walk_tree(mp)
    return {f: md5(read_file(os.path.join(mp, f))) for f in files}, dirs


def outcome_table(outs: dict) -> str:
    return "; ".join(f"{name}: {o!r}" for name, o in outs.items())


@contextlib.contextmanager
def store_hangs(pm: "PrivateMinio"):
    """The store hangs (SIGSTOP) for HANG_SECS while the body makes calls through
    `op(name, fn)`, each given LOCAL_CALL_LIMIT (a call still blocked then goes on in its
    thread); yields (op, outs: {name: Outcome, or a str saying why it was not run}). The
    store is always continued."""
    outs: dict = {}

    def op(name, fn):
        outs[name] = conftest.bounded_calls({name: fn}, LOCAL_CALL_LIMIT)[name]

    pm.stop()
    t_stop = time.monotonic()
    try:
        yield op, outs
        print("while the store hangs: " + outcome_table(outs))
        time.sleep(max(0.0, HANG_SECS - (time.monotonic() - t_stop)))
    finally:
        pm.cont()


def stalled_calls(outs: dict, settle: float) -> dict:
    """The calls of [`store_hangs`]'s `outs` that did not return within LOCAL_CALL_LIMIT
    without an error (or were not run). Then waits up to `settle` seconds for every call
    held by the hang to end, and fails if one does not."""
    stalled = {k: o for k, o in outs.items() if isinstance(o, str) or o.hung or o.error is not None
               or o.elapsed > LOCAL_CALL_LIMIT}
    assert wait_until(lambda: all(getattr(o, "done", True) for o in list(outs.values())), settle), \
        f"calls still blocked {settle:.0f}s after the store continued: {outcome_table(outs)}"
    return stalled


class PrivateMinio:
    """A MinIO server of this module's own on free ports, so a test can SIGSTOP it (a store
    that hangs: connections are accepted by the kernel and never answered)."""

    def __init__(self, root: str):
        self.port, self.console = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        data = os.path.join(root, "data")
        os.makedirs(data, exist_ok=True)
        self.log = open(os.path.join(root, "minio.log"), "wb")
        env = dict(os.environ, MINIO_ROOT_USER=seed.S3_ACCESS_KEY, MINIO_ROOT_PASSWORD=seed.S3_SECRET_KEY,
                   MINIO_BROWSER="off", MINIO_UPDATE="off")
        self.proc = subprocess.Popen([MINIO_BIN, "server", data, "--address", f"127.0.0.1:{self.port}",
                                      "--console-address", f"127.0.0.1:{self.console}"],
                                     env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        self.stopped = False

        def ready():
            try:
                with urllib.request.urlopen(self.endpoint + "/minio/health/live", timeout=2) as r:
                    return r.status == 200
            except Exception:
                return False
        if not wait_until(ready, 60, 0.2):
            self.close()
            pytest.fail(f"private MinIO did not start on {self.endpoint} (log {self.log.name})")
        import boto3
        from botocore.config import Config
        self.s3 = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=seed.S3_ACCESS_KEY,
                               aws_secret_access_key=seed.S3_SECRET_KEY, region_name=seed.S3_REGION,
                               config=Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=60,
                                             retries={"max_attempts": 3, "mode": "standard"},
                                             request_checksum_calculation="when_required",
                                             response_checksum_validation="when_required"))

    def new_bucket(self) -> str:
        name = conftest.new_bucket_name()
        self.s3.create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str) -> dict[str, bytes]:
        out = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for o in page.get("Contents", []):
                out[o["Key"]] = self.s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        return out

    def wb_args(self, bucket: str, staging, *extra) -> list[str]:
        return [f"s3://{bucket}", "--endpoint", self.endpoint, "--write-back",
                "--staging-dir", str(staging)] + list(extra)

    def stop(self) -> None:
        """SIGSTOP: the store hangs."""
        self.stopped = True
        os.kill(self.proc.pid, signal.SIGSTOP)

    def cont(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
        self.stopped = False

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.cont()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self.log.close()


@pytest.fixture(scope="module")
def private_minio(tmp_path_factory):
    conftest.require_bin()
    if not os.access(MINIO_BIN, os.X_OK):
        msg = f"minio binary not found at {MINIO_BIN} (BUCKETFS_TEST_MINIO_BIN)"
        if os.environ.get("BUCKETFS_TEST_S3_ENDPOINT"):
            pytest.fail(msg)
        pytest.skip(msg)
    pm = PrivateMinio(str(tmp_path_factory.mktemp("private-minio")))
    yield pm
    pm.close()


@pytest.fixture
def hung_minio(private_minio):
    """The private MinIO, continued again whatever the test did to it."""
    try:
        yield private_minio
    finally:
        private_minio.cont()
