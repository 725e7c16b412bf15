"""Operations: Prometheus metrics, `bucketfs status`, the mount(8)/fstab helper, systemd
readiness (NOTIFY_SOCKET), and credentials kept out of logs."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request

import pytest

import seed
from conftest import (BIN, bucketfs_env, force_unmount, free_port, is_mounted, new_mountpoint, require_bin, run_cli,
                      unmount, wait_until)


def scrape(port: int) -> dict[str, float]:
    """`name{labels}` -> value of every sample line."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


# --------------------------------------------------------------------------- metrics

def test_metrics_grow_during_reads(s3_bucket, rng):
    size = 6 * 1024 * 1024  # three 2 MiB blocks: several GETs
    data = rng.randbytes(size)
    s3_bucket.put("big.bin", data)
    port = free_port()
    with s3_bucket.mounted(extra=["--metrics-addr", f"127.0.0.1:{port}", "--disk-cache-mib", "0"]) as mp:
        before = scrape(port)
        with open(os.path.join(mp, "big.bin"), "rb") as f:
            assert f.read(1024 * 1024) == data[:1024 * 1024]
            middle = scrape(port)
            assert f.read() == data[1024 * 1024:]
        after = scrape(port)
        get = 'bucketfs_store_requests_total{op="get"}'
        assert before[get] < middle[get] <= after[get], (before[get], middle[get], after[get])
        assert after["bucketfs_store_read_bytes_total"] - before["bucketfs_store_read_bytes_total"] >= size
        assert after["bucketfs_memory_cache_bytes"] > 0
        assert after['bucketfs_store_request_duration_seconds_count{op="get"}'] == after[get]
        assert after["bucketfs_pending_uploads"] == 0
        # writes show up as written bytes once closed
        with open(os.path.join(mp, "w.txt"), "wb") as f:
            f.write(b"x" * 1000)
        assert scrape(port)["bucketfs_store_written_bytes_total"] >= 1000
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10):
            pass
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
        assert e.value.code == 404


def test_metrics_port_taken_fails_the_mount():
    require_bin()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        mp = new_mountpoint()
        try:
            p = run_cli(["mount", "mem://", mp, "--metrics-addr", f"127.0.0.1:{s.getsockname()[1]}"])
            assert p.returncode != 0 and "metrics" in p.err, p.err
            assert not is_mounted(mp)
        finally:
            unmount(mp)


# --------------------------------------------------------------------------- status

def test_status_shows_pending_uploads(s3_bucket):
    # The writer is another process: every close of a descriptor of the file (even the copy
    # a fork makes when this process runs `bucketfs status`) is a FUSE flush, which uploads.
    writer_code = ("import sys; f = open(sys.argv[1], 'wb', buffering=0); f.write(b'not yet uploaded'); "
                   "print('written', flush=True); sys.stdin.read(); f.close()")
    with s3_bucket.mounted() as mp:
        w = subprocess.Popen([sys.executable, "-c", writer_code, os.path.join(mp, "pending.txt")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert w.stdout.readline() == b"written\n"
            p = run_cli(["status", mp])
            assert p.returncode == 0, p.err
            print(p.out)
            assert "pending uploads:  1 " in p.out
            assert f"s3://{s3_bucket.name}/" in p.out
            j = json.loads(run_cli(["status", "--json", mp]).out)
            assert j["pending_uploads"] == 1 and j["store"] == f"s3://{s3_bucket.name}/"
            assert j["endpoint"] == seed.S3_ENDPOINT
        finally:
            w.stdin.close()
            assert w.wait(timeout=60) == 0
        j = json.loads(run_cli(["status", "--json", mp]).out)
        assert j["pending_uploads"] == 0
        assert j["requests"] > 0 and j["bytes_written"] >= len(b"not yet uploaded")
        out = run_cli(["status", mp]).out + run_cli(["status", "--json", mp]).out
        for secret in (seed.S3_SECRET_KEY, seed.S3_ACCESS_KEY + "/"):
            assert secret not in out


def test_status_of_something_else_is_a_clear_error(tmp_path):
    require_bin()
    p = run_cli(["status", str(tmp_path)])
    assert p.returncode != 0 and "not a bucketfs mount" in p.err, p.err
    p = run_cli(["status", "/proc"])
    assert p.returncode != 0 and "not a bucketfs one" in p.err, p.err


# --------------------------------------------------------------------------- mount(8), fstab

HELPER = "/sbin/mount.fuse.bucketfs"


@pytest.fixture
def mount_helper():
    require_bin()
    if os.geteuid() != 0:
        pytest.skip("installing /sbin/mount.fuse.bucketfs needs root")
    if not shutil.which("mount"):
        pytest.skip("no mount(8)")
    existing = os.path.lexists(HELPER)
    if existing and os.path.realpath(HELPER) != os.path.realpath(BIN):
        pytest.skip(f"{HELPER} exists and is not this build; not replacing it")
    if not existing:
        os.symlink(os.path.realpath(BIN), HELPER)
    try:
        yield HELPER
    finally:
        if not existing:
            os.unlink(HELPER)


@contextlib.contextmanager
def fstab_mounted(fstab, mp: str):
    """`mount -T FSTAB MP` (through the mount_helper fixture's /sbin/mount.fuse.bucketfs);
    on leaving, `umount MP` must succeed and the mount go (else it is forced off)."""
    try:
        p = subprocess.run(["mount", "-T", str(fstab), mp], capture_output=True, timeout=60, env=bucketfs_env())
        assert p.returncode == 0, p.stderr.decode()
        assert is_mounted(mp)
        yield mp
        p = subprocess.run(["umount", mp], capture_output=True, timeout=60)
        assert p.returncode == 0, p.stderr.decode()
        assert wait_until(lambda: not is_mounted(mp), 10)
    finally:
        unmount(mp)


def test_mount_t_fuse_bucketfs(mount_helper, tmp_path):
    mp = new_mountpoint()
    try:
        p = subprocess.run(["mount", "-t", "fuse.bucketfs", "mem://", mp,
                            "-o", "rw,noauto,_netdev,nofail,defaults,metadata_ttl=2,disk_cache_mib=0"],
                           capture_output=True, timeout=60, env=bucketfs_env())
        assert p.returncode == 0, p.stderr.decode()
        assert is_mounted(mp)
        with open(os.path.join(mp, "via-mount8"), "w") as f:
            f.write("hello")
        assert os.listdir(mp) == ["via-mount8"]
        st = json.loads(run_cli(["status", "--json", mp]).out)
        assert st["store"] == "mem://"
        p = run_cli(["unmount", mp])
        assert p.returncode == 0, p.err
        assert not is_mounted(mp)
    finally:
        unmount(mp)


def test_fstab_line_read_only(mount_helper, tmp_path):
    """A real fstab line (in a private fstab file via `mount -T`): file:// store, read_only."""
    root = seed.file_root()
    data_dir = tempfile.mkdtemp(prefix="fstab-", dir=root)
    with open(os.path.join(data_dir, "hello.txt"), "w") as f:
        f.write("from fstab")
    mp = new_mountpoint()
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# test\nfile://{data_dir} {mp} fuse.bucketfs "
                     f"noauto,_netdev,user,nofail,read_only,allow_other,metadata_ttl=2 0 0\n")
    try:
        with fstab_mounted(fstab, mp):
            with open(os.path.join(mp, "hello.txt")) as f:
                assert f.read() == "from fstab"
            with pytest.raises(OSError) as e:
                open(os.path.join(mp, "new.txt"), "w")
            assert e.value.errno == errno.EROFS
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


# --------------------------------------------------------------------------- systemd

@contextlib.contextmanager
def notified_mount(sock: str):
    """A foreground `mem://` mount told to report to the datagram socket SOCK (systemd's
    NOTIFY_SOCKET): yields (receiving socket, mount point, process); always cleaned up."""
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(sock)
    rx.settimeout(60)
    mp = new_mountpoint()
    proc = subprocess.Popen([BIN, "mount", "mem://", mp, "--foreground"], env=bucketfs_env(NOTIFY_SOCKET=sock),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield rx, mp, proc
    finally:
        rx.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        force_unmount(mp)
        unmount(mp)


def test_notify_socket_ready_and_stopping(tmp_path):
    require_bin()
    with notified_mount(str(tmp_path / "notify.sock")) as (rx, mp, proc):
        msg = rx.recv(256)
        assert msg == b"READY=1", msg
        assert is_mounted(mp), "READY=1 before the mount existed"
        os.listdir(mp)
        proc.send_signal(signal.SIGTERM)
        assert rx.recv(256) == b"STOPPING=1"
        assert proc.wait(timeout=30) == 0
        assert not is_mounted(mp)


def test_sigterm_the_moment_ready_arrives_still_unmounts_cleanly(tmp_path):
    """The signal handlers exist before READY=1 is sent: a service manager may stop the
    mount at once, and a SIGTERM that beat the handler would kill it with the default action."""
    require_bin()
    for i in range(8):
        with notified_mount(str(tmp_path / f"notify{i}.sock")) as (rx, mp, proc):
            assert rx.recv(256) == b"READY=1"
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=30)
            assert rc == 0, f"round {i}: exit {rc}; a negative code means SIGTERM beat the handler"
            assert rx.recv(256) == b"STOPPING=1"
            assert not is_mounted(mp)


# --------------------------------------------------------------------------- logs

def temporary_credentials() -> dict:
    """Distinctive short-lived credentials from MinIO's STS (AssumeRole with the root user)."""
    import boto3
    sts = boto3.client("sts", endpoint_url=seed.S3_ENDPOINT, region_name="us-east-1",
                       aws_access_key_id=seed.S3_ACCESS_KEY, aws_secret_access_key=seed.S3_SECRET_KEY)
    c = sts.assume_role(RoleArn="arn:minio:iam:::role/bucketfs-test", RoleSessionName="bucketfs-log-test",
                        DurationSeconds=900)["Credentials"]
    return {"AWS_ACCESS_KEY_ID": c["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": c["SecretAccessKey"],
            "AWS_SESSION_TOKEN": c["SessionToken"]}


def test_credentials_never_in_logs(s3_bucket, tmp_path):
    s3_bucket.put("dir/a.txt", b"a" * 5000)
    creds = temporary_credentials()
    log = tmp_path / "bucketfs.log"
    # -vv, and everything at trace level (BUCKETFS_LOG overrides -v)
    for extra_env in ({}, {"BUCKETFS_LOG": "trace"}):
        env = bucketfs_env(**creds, **extra_env)
        with s3_bucket.mounted(extra=["-vv", "--log-file", str(log)], env=env) as mp:
            assert sorted(os.listdir(mp)) == ["dir"]
            with open(os.path.join(mp, "dir/a.txt"), "rb") as f:
                assert f.read() == b"a" * 5000
            with open(os.path.join(mp, "dir/b.txt"), "wb") as f:
                f.write(b"b" * 100)
            os.rename(os.path.join(mp, "dir/b.txt"), os.path.join(mp, "dir/c.txt"))
            os.unlink(os.path.join(mp, "dir/c.txt"))
    # and a mount that fails: a wrong, distinctive secret
    bad = dict(creds, AWS_SECRET_ACCESS_KEY="bfsWRONGsecret" + creds["AWS_SECRET_ACCESS_KEY"][14:])
    mp = new_mountpoint()
    try:
        p = run_cli(["mount"] + s3_bucket.args()[:1] + [mp] + s3_bucket.args()[1:] + ["-vv", "--log-file", str(log)],
                    env=bucketfs_env(**bad))
        assert p.returncode != 0
        assert bad["AWS_SECRET_ACCESS_KEY"] not in p.err
    finally:
        unmount(mp)
    # an endpoint with `user:password@` in it: cut from every message (mount and cp) and log
    args = s3_bucket.args()
    i = args.index("--endpoint") + 1
    args[i] = args[i].replace("://", "://bfsuser:bfsEpSeCrEt@", 1)
    mp = new_mountpoint()
    try:
        p = run_cli(["mount"] + args[:1] + [mp] + args[1:] + ["-vv", "--log-file", str(log)],
                    env=bucketfs_env(**creds))
        out = p.out + p.err
        if p.returncode == 0:
            assert sorted(os.listdir(mp)) == ["dir"]
    finally:
        unmount(mp)
    c = run_cli(["cp", "-q", args[0] + "/dir/none.txt", str(tmp_path / "x")] + args[1:], env=bucketfs_env(**creds))
    assert c.returncode != 0
    for what, text in [("mount", out), ("cp", c.out + c.err)]:
        assert "bfsEpSeCrEt" not in text, f"the endpoint's password in {what}'s output: {text}"
    text = log.read_text(errors="replace")
    assert len(text) > 10_000, "-vv should log a lot"
    for name, value in list(creds.items()) + [("wrong secret", bad["AWS_SECRET_ACCESS_KEY"]),
                                              ("endpoint password", "bfsEpSeCrEt")]:
        assert value not in text, f"{name} appears in the log"
