"""Conventions users bring from gcsfuse, mountpoint-s3, s3fs, rclone and the cloud CLIs
(issue 24): `-o` mount options, ownership and modes, fstab lines, runtime paths, Content-Type,
cp filters."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess

import pytest

import seed
from conftest import (Bucket, bucketfs_env, is_mounted, mounted, new_mountpoint, require_bin,
                      require_store, run_cli, unmount, wait_until)
import test_ops

mount_helper = test_ops.mount_helper  # the fixture installing /sbin/mount.fuse.bucketfs

# What a store reports for an object uploaded with no Content-Type.
NO_TYPE = (None, "", "application/octet-stream", "binary/octet-stream")


@pytest.fixture
def fresh(request):
    """A fresh bucket on the store `request.param` (`@pytest.mark.parametrize("fresh",
    [...], indirect=True)`), removed after the test."""
    require_store(request.param)
    require_bin()
    b = Bucket(request.param)
    yield b
    b.cleanup()


def on(*stores):
    """Run the test once per store, each with a `fresh` bucket."""
    return pytest.mark.parametrize("fresh", stores, indirect=True)


def ok(args, **kw):
    """`bucketfs ARGS`, which must succeed."""
    p = run_cli(args, **kw)
    assert p.returncode == 0, f"bucketfs {' '.join(args)}: {p.err}"
    return p


def owner_and_mode(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


# --------------------------------------------------------------------------- -o, uid, modes

ME = (os.getuid(), os.getgid())


@on("file", "s3", "gcs")
@pytest.mark.parametrize("extra, owner, file_mode, dir_mode, writable", [
    # `-o uid=,gid=,file_mode=,dir_mode=` (with fstab noise) is what stat shows.
    pytest.param(["-o", "rw,_netdev,nofail,x-systemd.automount,default_permissions,uid=1234,gid=2345,"
                  "file_mode=0640,dir_mode=0710"], (1234, 2345), 0o640, 0o710, True, id="dash-o"),
    # `--umask 077` (rclone, s3fs) masks the defaults; `-o ro` is read-only.
    pytest.param(["--umask", "077", "-o", "ro"], ME, 0o600, 0o700, False, id="umask-ro"),
])
def test_owner_and_modes_from_flags(fresh, extra, owner, file_mode, dir_mode, writable):
    fresh.put("d/f.txt", b"hello")
    with fresh.mounted(extra=extra) as mp:
        assert owner_and_mode(os.path.join(mp, "d", "f.txt")) == (*owner, file_mode)
        assert owner_and_mode(os.path.join(mp, "d")) == (*owner, dir_mode)
        assert owner_and_mode(mp) == (*owner, dir_mode)
        with open(os.path.join(mp, "d", "f.txt"), "rb") as f:
            assert f.read() == b"hello"
        if writable:
            with open(os.path.join(mp, "new.txt"), "w") as f:
                f.write("new")
        else:
            with pytest.raises(OSError):
                open(os.path.join(mp, "new.txt"), "w").close()


def test_bad_mount_options_fail_clearly(tmp_path):
    require_bin()
    mp = new_mountpoint()
    p = run_cli(["mount", "mem://", mp, "-o", "file_mode=0999"])
    assert p.returncode != 0 and "octal" in p.err, p.err
    p = run_cli(["mount", "mem://", mp, "-o", "auto_unmount"])
    assert p.returncode != 0 and "allow_root" in p.err, p.err
    assert not is_mounted(mp)


def test_allow_root_and_auto_unmount(tmp_path):
    """allow_root with auto_unmount mounts (through fusermount3) and unmounts."""
    require_bin()
    with mounted(["mem://", "-o", "allow_root,auto_unmount"]) as mp:
        with open(os.path.join(mp, "x"), "w") as f:
            f.write("x")
        assert os.listdir(mp) == ["x"]
        assert "allow_other" in open("/proc/self/mounts").read().split(mp, 1)[1].split("\n", 1)[0]
    assert not is_mounted(mp)


def test_fstab_line_with_owner_modes(mount_helper, tmp_path):
    """An fstab line with uid/gid/umask/allow_root/x-systemd options, mounted with
    `mount -T FILE DIR` and unmounted with umount(8)."""
    data_dir = os.path.join(seed.file_root(), "fstab-" + os.urandom(4).hex())
    os.makedirs(os.path.join(data_dir, "sub"))
    with open(os.path.join(data_dir, "sub", "a.txt"), "w") as f:
        f.write("from fstab")
    mp = new_mountpoint()
    fstab = tmp_path / "fstab"
    fstab.write_text(
        f"file://{data_dir} {mp} fuse.bucketfs "
        "noauto,_netdev,nofail,x-systemd.automount,x-systemd.idle-timeout=60,"
        "uid=4321,gid=4322,umask=027,allow_root,default_permissions,disk_cache_mib=0 0 0\n")
    with test_ops.fstab_mounted(fstab, mp):
        assert owner_and_mode(os.path.join(mp, "sub", "a.txt")) == (4321, 4322, 0o640)
        assert owner_and_mode(os.path.join(mp, "sub")) == (4321, 4322, 0o750)
        with open(os.path.join(mp, "sub", "a.txt")) as f:
            assert f.read() == "from fstab"


# --------------------------------------------------------------------------- runtime paths

def mount_id(mp: str) -> str:
    """paths::mount_id: the canonical path, `%` and `/` percent-escaped (one-to-one)."""
    return os.path.realpath(mp).lstrip("/").replace("%", "%25").replace("/", "%2F")


def test_root_runtime_dir_is_private_and_ids_do_not_collide(tmp_path):
    """Root without XDG_RUNTIME_DIR keeps pid and socket in /run/bucketfs (0700, root's);
    `.../x_y` and `.../x/y` get distinct pid files; a symlink planted at the pid file's place
    is replaced, not written through."""
    require_bin()
    if os.geteuid() != 0:
        pytest.skip("the /run/bucketfs case is root's")
    env = bucketfs_env(XDG_RUNTIME_DIR=None)
    base = new_mountpoint()
    mp1, mp2 = os.path.join(base, "x_y"), os.path.join(base, "x", "y")
    os.makedirs(mp1)
    os.makedirs(mp2)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    pid1 = os.path.join("/run/bucketfs", mount_id(mp1) + ".pid")
    pid2 = os.path.join("/run/bucketfs", mount_id(mp2) + ".pid")
    assert pid1 != pid2
    os.makedirs("/run/bucketfs", mode=0o700, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pid1)
    os.symlink(victim, pid1)
    try:
        for mp in (mp1, mp2):
            ok(["mount", "mem://", mp, "--disk-cache-mib", "0"], env=env)
        st = os.lstat("/run/bucketfs")
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
        assert victim.read_text() == "keep me"
        pids = []
        for pidf in (pid1, pid2):
            assert wait_until(lambda: os.path.isfile(pidf) and not os.path.islink(pidf), 5), pidf
            assert stat.S_IMODE(os.lstat(pidf).st_mode) == 0o600
            pids.append(int(open(pidf).read()))
        assert pids[0] != pids[1]
        assert os.path.exists(os.path.join("/run/bucketfs", mount_id(mp1) + ".sock"))
        # `bucketfs status` finds each mount's own socket.
        with open(os.path.join(mp2, "only-in-2"), "w") as f:
            f.write("2")
        for mp in (mp1, mp2):
            p = run_cli(["status", "--json", mp], env=env)
            assert p.returncode == 0 and json.loads(p.out)["mountpoint"] == os.path.realpath(mp), p.err
    finally:
        for mp in (mp1, mp2):
            unmount(mp)
    assert not os.path.lexists(pid1) and not os.path.lexists(pid2)


def test_unmount_after_a_crash_trusts_no_stale_pid_or_note():
    """A mount killed by SIGKILL leaves its pid file (the pid may be another process's by
    then) and the note of changes an earlier mount left pending (done since by the next
    mount). The next mount clears that note, and `bucketfs unmount` waits for no process
    that is not the mount (it waited 60 s for the other process, then failed)."""
    require_bin()
    if os.geteuid() != 0:
        pytest.skip("the /run/bucketfs case is root's")
    env = bucketfs_env(XDG_RUNTIME_DIR=None)
    mp = new_mountpoint()
    pidf = os.path.join("/run/bucketfs", mount_id(mp) + ".pid")
    note = os.path.join("/run/bucketfs", mount_id(mp) + ".pending")
    os.makedirs("/run/bucketfs", mode=0o700, exist_ok=True)
    with open(note, "w") as f:
        f.write("/var/lib/staging\nold/key\n")
    ok(["mount", "mem://", mp, "--disk-cache-mib", "0"], env=env)
    other = subprocess.Popen(["sleep", "300"])
    try:
        assert not os.path.exists(note), "an earlier mount's note outlived the changes it named"
        assert wait_until(lambda: os.path.isfile(pidf), 5), pidf
        # As if the mount's pid had been reused: the file, written long ago, names a
        # process started after it.
        written = os.stat(pidf).st_mtime - 10
        with open(pidf, "w") as f:
            f.write(str(other.pid))
        os.utime(pidf, (written, written))
        p = run_cli(["unmount", mp], env=env)
        assert p.returncode == 0, p.err
        assert not is_mounted(mp)
    finally:
        other.kill()
        other.wait()
        unmount(mp)


# --------------------------------------------------------------------------- Content-Type

def content_type(store: str, bucket: str, key: str) -> str | None:
    """The Content-Type the store reports: boto3's head_object, or GCS's JSON API metadata."""
    if store == "s3":
        return seed.s3_client().head_object(Bucket=bucket, Key=key).get("ContentType")
    st, body = seed._gcs_req("GET", f"/storage/v1/b/{seed._q(bucket)}/o/{seed._q(key)}")
    assert st == 200, body
    return json.loads(body).get("contentType")


@on("s3", "gcs")
def test_content_type_of_files_written_through_the_mount(fresh):
    big = os.urandom(11 * 1024 * 1024)   # three 5 MiB parts: S3 multipart, GCS compose
    with fresh.mounted(extra=["--part-size-mib", "5"]) as mp:
        for name, data in (("index.html", b"<p>hi</p>"), ("d/data.json", b"{}"), ("big.json", big),
                           ("notes", b"no extension")):
            os.makedirs(os.path.dirname(os.path.join(mp, name)), exist_ok=True)
            with open(os.path.join(mp, name), "wb") as f:
                f.write(data)
    types = {k: content_type(fresh.store, fresh.name, k) for k in ("index.html", "d/data.json", "big.json")}
    assert types == {"index.html": "text/html", "d/data.json": "application/json", "big.json": "application/json"}
    assert content_type(fresh.store, fresh.name, "notes") in NO_TYPE


@on("s3", "gcs")
def test_content_type_of_cp_uploads(fresh, tmp_path):
    src = tmp_path / "site"
    src.mkdir()
    (src / "page.html").write_text("<p>x</p>")
    (src / "style.css").write_text("p{}")
    extra = seed.mount_extra_args(fresh.store)
    url = seed.mount_url(fresh.store, fresh.name)
    ok(["cp", "-r", str(src), url + "/guess"] + extra)
    keys = seed.list_keys(fresh.store, fresh.name, "guess/")
    html = next(k for k in keys if k.endswith("page.html"))
    css = next(k for k in keys if k.endswith("style.css"))
    assert content_type(fresh.store, fresh.name, html) == "text/html"
    assert content_type(fresh.store, fresh.name, css) == "text/css"
    ok(["cp", str(src / "page.html"), url + "/fixed.html", "--content-type", "text/plain"] + extra)
    assert content_type(fresh.store, fresh.name, "fixed.html") == "text/plain"
    ok(["cp", str(src / "page.html"), url + "/off.html", "--no-content-type"] + extra)
    assert content_type(fresh.store, fresh.name, "off.html") in NO_TYPE


def put_with_headers(store: str, bucket: str, key: str, data: bytes) -> None:
    """Upload as another client that sets a Content-Type, Cache-Control, Content-Disposition
    and user metadata of its own (`aws s3 cp --cache-control ...`, a site's deploy tool)."""
    if store == "s3":
        seed.s3_client().put_object(Bucket=bucket, Key=key, Body=data, ContentType="text/x-site",
                                    CacheControl="max-age=600", ContentDisposition="inline",
                                    Metadata={"team": "ml"})
        return
    meta = {"name": key, "contentType": "text/x-site", "cacheControl": "max-age=600",
            "metadata": {"team": "ml"}}
    body = (b"--b\r\nContent-Type: application/json\r\n\r\n" + json.dumps(meta).encode()
            + b"\r\n--b\r\nContent-Type: text/x-site\r\n\r\n" + data + b"\r\n--b--\r\n")
    st, out = seed._gcs_req("POST", f"/upload/storage/v1/b/{seed._q(bucket)}/o", body,
                            {"uploadType": "multipart"}, "multipart/related; boundary=b")
    assert st == 200, out


def object_headers(store: str, bucket: str, key: str) -> dict:
    """What the store reports the object carries beside its bytes."""
    if store == "s3":
        h = seed.s3_client().head_object(Bucket=bucket, Key=key)
        return {"type": h.get("ContentType"), "cache": h.get("CacheControl"),
                "disposition": h.get("ContentDisposition"), "meta": h.get("Metadata", {})}
    st, body = seed._gcs_req("GET", f"/storage/v1/b/{seed._q(bucket)}/o/{seed._q(key)}")
    assert st == 200, body
    o = json.loads(body)
    return {"type": o.get("contentType"), "cache": o.get("cacheControl"), "disposition": None,
            "meta": o.get("metadata", {})}


@on("s3", "gcs")
@pytest.mark.parametrize("mode", ["durable", "write-back"])
def test_a_chmod_and_an_edit_keep_what_another_client_stored_with_the_object(fresh, mode):
    """A chmod uploads a closed file again, and an edit uploads it: both dropped the
    Content-Type, Cache-Control and user metadata another client gave it (tester W)."""
    put_with_headers(fresh.store, fresh.name, "site/page", b"<p>v1</p>")
    extra = ["--write-back"] if mode == "write-back" else []
    want = {"type": "text/x-site", "cache": "max-age=600",
            "disposition": "inline" if fresh.store == "s3" else None}

    def check(mp, mode_bits):
        if extra:
            r = run_cli(["sync", mp], timeout=120)
            assert r.returncode == 0, r.err
        h = object_headers(fresh.store, fresh.name, "site/page")
        assert {k: h[k] for k in want} == want
        assert h["meta"].get("team") == "ml", h["meta"]
        assert h["meta"].get("mode") == mode_bits, h["meta"]

    with fresh.mounted(extra=extra) as mp:
        page = os.path.join(mp, "site", "page")
        assert os.listdir(os.path.join(mp, "site")) == ["page"]  # known from a listing only
        os.chmod(page, 0o600)
        check(mp, "100600")
        with open(page, "ab") as f:
            f.write(b"v2")
        check(mp, "100600")
        with open(page, "rb") as f:
            assert f.read() == b"<p>v1</p>v2"


# --------------------------------------------------------------------------- S3 region

@pytest.fixture
def regional_minio(tmp_path):
    """A second MinIO, started with MINIO_REGION=eu-west-3, with one bucket holding a.txt."""
    import shutil
    import socket
    import urllib.request
    exe = shutil.which("minio") or os.path.expanduser("~/go/bin/minio")
    if not os.path.exists(exe):
        pytest.skip("no minio binary")
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    env = dict(os.environ, MINIO_ROOT_USER=seed.S3_ACCESS_KEY, MINIO_ROOT_PASSWORD=seed.S3_SECRET_KEY,
               MINIO_REGION="eu-west-3")
    proc = subprocess.Popen([exe, "server", str(tmp_path / "data"), "--address", f"127.0.0.1:{ports[0]}",
                             "--console-address", f"127.0.0.1:{ports[1]}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{ports[0]}"

    def live():
        try:
            with urllib.request.urlopen(endpoint + "/minio/health/live", timeout=1) as r:
                return r.status == 200
        except Exception:
            return False
    try:
        assert wait_until(live, 30), "regional MinIO did not start"
        import boto3
        from botocore.config import Config
        c = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=seed.S3_ACCESS_KEY,
                         aws_secret_access_key=seed.S3_SECRET_KEY, region_name="eu-west-3",
                         config=Config(s3={"addressing_style": "path"}))
        c.create_bucket(Bucket="regional", CreateBucketConfiguration={"LocationConstraint": "eu-west-3"})
        c.put_object(Bucket="regional", Key="a.txt", Body=b"from eu-west-3")
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_region_flag_and_profile_against_minio_with_a_region(regional_minio, tmp_path):
    """MinIO started with a region refuses requests signed for us-east-1 (AWS_REGION); with
    nothing configured the region is detected from the bucket; `--region` beats AWS_REGION,
    AWS_REGION beats the profile's `region` in the AWS config file, which is read."""
    require_bin()
    base = bucketfs_env(AWS_REGION=None, AWS_DEFAULT_REGION=None, AWS_PROFILE=None)
    base["AWS_CONFIG_FILE"] = str(tmp_path / "none")
    args = ["cp", "s3://regional/a.txt", "-", "--endpoint", regional_minio]
    wrong = dict(base, AWS_REGION="us-east-1")
    cfg = tmp_path / "config"
    cfg.write_text("[default]\nregion = ap-south-1\n[profile paris]\nregion = eu-west-3\n")
    with_cfg = dict(base, AWS_CONFIG_FILE=str(cfg))
    cases = [  # (env, extra flags, the copy works, why)
        (wrong, [], False, "us-east-1 signing should be refused by a MinIO in eu-west-3"),
        (wrong, ["--region", "eu-west-3"], True, "--region beats AWS_REGION"),
        (base, [], True, "nothing configured: detected (x-amz-bucket-region)"),
        (with_cfg, [], False, "the default profile's region (ap-south-1) should have been used"),
        (dict(with_cfg, AWS_PROFILE="paris"), [], True, "AWS_PROFILE's region"),
        (dict(with_cfg, AWS_PROFILE="paris", AWS_REGION="us-east-1"), [], False,
         "AWS_REGION comes before the profile's region"),
    ]
    for env, extra, works, why in cases:
        p = run_cli(args + extra, env=env)
        if works:
            assert p.returncode == 0 and p.out == "from eu-west-3", (why, p.err)
        else:
            assert p.returncode != 0, why
    mp = new_mountpoint()
    p = run_cli(["mount", "s3://regional", mp, "--endpoint", regional_minio, "--region", "eu-west-3"], env=base)
    try:
        assert p.returncode == 0, p.err
        with open(os.path.join(mp, "a.txt")) as f:
            assert f.read() == "from eu-west-3"
    finally:
        unmount(mp)


# --------------------------------------------------------------------------- logs

@on("s3")
def test_cp_logs_its_retries_as_json(fresh, tmp_path, toxiproxy):
    """`bucketfs cp --log-format json` through a store that is down until cp logs its first
    retry (not for a fixed time: how soon cp asks depends on how busy the machine is): the
    copy succeeds, and stderr holds JSON log lines saying it retried."""
    import subprocess
    from conftest import require_bin, upstream_of
    b = fresh
    src = tmp_path / "f.txt"
    src.write_bytes(b"retry me")
    px = toxiproxy.proxy(upstream_of("s3"))
    px.set_enabled(False)
    cmd = [require_bin(), "cp", str(src), f"s3://{b.name}/f.txt", "--endpoint", px.endpoint, "--log-format", "json"]
    try:
        proc = subprocess.Popen(cmd, env=bucketfs_env(BUCKETFS_LOG=None), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        err = []
        for line in proc.stderr:
            err.append(line)
            if "retry" in line.lower():
                px.set_enabled(True)  # the store is back for the next try
        proc.wait(timeout=120)
    finally:
        px.delete()
    p = subprocess.CompletedProcess(cmd, proc.returncode)
    p.err = "".join(err)
    assert p.returncode == 0, p.err
    assert seed.get("s3", b.name, "f.txt") == b"retry me"
    lines = [json.loads(l) for l in p.err.splitlines() if l.startswith("{")]
    retries = [l for l in lines if "retry" in json.dumps(l).lower()]
    assert retries, f"no JSON retry line on stderr: {p.err[-2000:]!r}"
    assert all({"timestamp", "level", "fields"} <= set(l) for l in retries), retries[0]


# --------------------------------------------------------------------------- cp filters

@on("s3")
def test_cp_exclude_include_and_dry_run(fresh, tmp_path):
    b = fresh
    src = tmp_path / "tree"
    (src / "cache").mkdir(parents=True)
    for name in ("a.txt", "b.tmp", "c.bin", "cache/d.txt"):
        (src / name).write_text(name)
    url = f"s3://{b.name}"
    extra = ["--endpoint", seed.S3_ENDPOINT]
    p = ok(["cp", "-r", str(src), url + "/dry/", "--dry-run", "--exclude", "*.tmp"] + extra)
    lines = p.out.strip().splitlines()
    assert len(lines) == 3 and all(l.startswith("(dry run) ") and " -> s3://" in l for l in lines), p.out
    assert not any("b.tmp" in l for l in lines)
    assert seed.list_keys("s3", b.name) == [], "a dry run copied something"
    ok(["cp", "-r", str(src), url + "/ex", "--exclude", "*.tmp", "--exclude", "cache/*"] + extra)
    assert sorted(seed.list_keys("s3", b.name)) == ["ex/a.txt", "ex/c.bin"]
    ok(["cp", "-r", str(src), url + "/only", "--exclude", "*", "--include", "*.txt"] + extra)
    assert sorted(seed.list_keys("s3", b.name, "only/")) == ["only/a.txt", "only/cache/d.txt"]
    p = run_cli(["cp", "-r", str(src), url + "/bad", "--exclude", "a["] + extra)
    assert p.returncode != 0 and "pattern" in p.err, p.err


@on("s3")
def test_cp_preserve_keeps_mode_and_mtime(fresh, tmp_path):
    """`cp -P` up: mode and mtime in the object's metadata, shown by a mount; `cp -P` down:
    set on the local file."""
    b = fresh
    f = tmp_path / "script.sh"
    f.write_text("#!/bin/sh\n")
    os.chmod(f, 0o750)
    os.utime(f, (1_000_000_000.5, 1_000_000_000.5))
    extra = ["--endpoint", seed.S3_ENDPOINT]
    ok(["cp", "-P", str(f), f"s3://{b.name}/script.sh"] + extra)
    meta = seed.s3_client().head_object(Bucket=b.name, Key="script.sh")["Metadata"]
    assert meta.get("mode") == "100750" and meta.get("mtime", "").startswith("1000000000.5"), meta
    ok(["cp", str(f), f"s3://{b.name}/plain.sh"] + extra)
    assert "mode" not in seed.s3_client().head_object(Bucket=b.name, Key="plain.sh")["Metadata"]
    with b.mounted() as mp:
        st = os.stat(os.path.join(mp, "script.sh"))
        assert stat.S_IMODE(st.st_mode) == 0o750 and int(st.st_mtime) == 1_000_000_000
    out = tmp_path / "back.sh"
    ok(["cp", "-P", f"s3://{b.name}/script.sh", str(out)] + extra)
    st = os.stat(out)
    assert stat.S_IMODE(st.st_mode) == 0o750 and abs(st.st_mtime - 1_000_000_000.5) < 0.01


# --------------------------------------------------------------------------- storage class, SSE

@on("s3")
def test_storage_class_on_mount_and_cp_uploads(fresh, tmp_path):
    """`--storage-class` reaches the store (MinIO keeps REDUCED_REDUNDANCY); a bad --sse is
    refused before anything is sent."""
    b = fresh
    f = tmp_path / "f.txt"
    f.write_text("x")
    extra = ["--endpoint", seed.S3_ENDPOINT]
    ok(["cp", str(f), f"s3://{b.name}/cp.txt", "--storage-class", "REDUCED_REDUNDANCY"] + extra)
    with b.mounted(extra=["--storage-class", "REDUCED_REDUNDANCY"]) as mp:
        with open(os.path.join(mp, "mount.txt"), "w") as out:
            out.write("y")
    ok(["cp", str(f), f"s3://{b.name}/plain.txt"] + extra)
    head = lambda k: seed.s3_client().head_object(Bucket=b.name, Key=k).get("StorageClass")  # noqa: E731
    assert head("cp.txt") == "REDUCED_REDUNDANCY"
    assert head("mount.txt") == "REDUCED_REDUNDANCY"
    assert head("plain.txt") in (None, "STANDARD")
    p = run_cli(["cp", str(f), f"s3://{b.name}/x.txt", "--sse", "rot13"] + extra)
    assert p.returncode != 0 and "AES256" in p.err, p.err


# --------------------------------------------------------------------------- GCS upload method

@on("gcs")
def test_gcs_upload_method_is_chosen_by_flag(fresh, tmp_path):
    """`--gcs-upload`: on the emulator (a custom endpoint) `auto` composes parts; `xml`
    really takes OpenDAL's XML multipart path, which fake-gcs-server lacks, so it fails
    there and leaves no object."""
    b = fresh
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(11 * 1024 * 1024))
    with b.mounted(extra=["--part-size-mib", "5", "--gcs-upload", "auto"]) as mp:
        with open(os.path.join(mp, "auto.bin"), "wb") as f:
            f.write(src.read_bytes())
    assert seed.get("gcs", b.name, "auto.bin") == src.read_bytes()
    with b.mounted(extra=["--part-size-mib", "5", "--gcs-upload", "xml"]) as mp:
        with pytest.raises(OSError):
            with open(os.path.join(mp, "xml.bin"), "wb") as f:
                f.write(src.read_bytes())
    assert "xml.bin" not in seed.list_keys("gcs", b.name)
    p = run_cli(["mount", "mem://", new_mountpoint(), "--gcs-upload", "json"])
    assert p.returncode != 0 and "compose" in p.err, p.err
