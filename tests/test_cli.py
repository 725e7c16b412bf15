"""CLI errors and the mount/unmount lifecycle."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

import seed
from conftest import (BIN, CLI_TIMEOUT, Bucket, bucketfs_env, daemon_pids, force_unmount,
                      is_mounted, mount, mounted, new_mountpoint, require_bin, require_store, run_cli,
                      unmount, wait_until)

# --------------------------------------------------------------------------- errors


def assert_cli_error(p, words, mp=None):
    """Non-zero exit, exactly one line on stderr, and that line names the problem with one of
    `words` -- looked for with the command's own arguments (URLs, paths) cut out, so a bucket
    called "no-such-bucket" does not count as the message saying "bucket"."""
    lines = [l for l in p.err.splitlines() if l.strip()]
    print(f"exit {p.returncode} after {p.elapsed:.1f}s, stderr: {p.err.strip()!r}")
    assert p.returncode != 0, f"expected failure, got exit 0 (stderr {p.err!r})"
    assert len(lines) == 1, f"expected a one-line error on stderr, got {len(lines)} lines: {p.err!r}"
    low = lines[0].lower()
    for a in sorted(p.args[2:], key=len, reverse=True):   # skip the binary and the subcommand
        a = os.fsdecode(a).lower()
        for part in (a.rstrip("/"), a.split("://", 1)[-1].split("/")[0] if "://" in a else ""):
            if len(part) > 3:
                low = low.replace(part, " ")
    if len(lines[0]) > 300:
        print(f"note: error line is {len(lines[0])} characters long")
    assert any(w in low for w in words), f"error {lines[0]!r} mentions none of {words}"
    assert p.elapsed < CLI_TIMEOUT
    if mp is not None:
        assert not is_mounted(mp), "a failed mount left something mounted"
        # the background child may still be exiting for a moment after the parent reported
        assert wait_until(lambda: not daemon_pids(mp), 5), f"a failed mount left a daemon running: {daemon_pids(mp)}"


@pytest.fixture
def mp():
    m = new_mountpoint()
    yield m
    unmount(m)


def test_error_bad_flag_is_one_line_and_exit_1(mp, tmp_path):
    """A bad flag or value: one line, exit 1 (not the argument parser's 2, which `cp` uses
    for "skipped"). A slice past 1G was an aborted allocation before (exit 134)."""
    p = run_cli(["mount", "mem://", mp, "--no-such-flag"])
    assert_cli_error(p, ["unexpected argument", "--no-such-flag"], mp)
    assert p.returncode == 1
    src = tmp_path / "f"
    src.write_bytes(b"x")
    p = run_cli(["cp", "--slice-size", "100G", str(src), "mem://b/f"])
    assert_cli_error(p, ["at most 1g"])
    assert p.returncode == 1
    assert run_cli(["cp", "--help"]).returncode == 0


def test_a_dead_mount_says_how_to_recover(mp):
    """The mount's process killed (-9): the kernel mount stays, answering ENOTCONN. status
    and mount on it name what happened and the command that recovers; that command does."""
    p = run_cli(["mount", "mem://", mp])
    assert p.returncode == 0, p.err
    for pid in daemon_pids(mp):
        os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not daemon_pids(mp), 10)
    for cmd in (["status", mp], ["mount", "mem://", mp]):
        p = run_cli(cmd)
        assert p.returncode == 1 and f"bucketfs unmount {mp}" in p.err, (cmd, p.err)
    assert run_cli(["unmount", mp]).returncode == 0
    assert run_cli(["mount", "mem://", mp]).returncode == 0 and os.listdir(mp) == []


def test_error_unknown_scheme(mp):
    require_bin()
    assert_cli_error(run_cli(["mount", "foo://x", mp]), ["scheme", "unsupported"], mp)


def test_error_malformed_url(mp):
    require_bin()
    assert_cli_error(run_cli(["mount", "s3://", mp]), ["bucket", "url", "invalid", "malformed", "empty"], mp)


def test_error_missing_bucket(mp):
    require_store("s3")
    p = run_cli(["mount", "s3://no-such-bucket-xyz", mp] + seed.mount_extra_args("s3"))
    assert_cli_error(p, ["not found", "nosuchbucket", "no such", "exist"], mp)


def test_error_missing_gcs_bucket(mp):
    require_store("gcs")
    p = run_cli(["mount", "gs://no-such-bucket-xyz", mp] + seed.mount_extra_args("gcs"))
    assert_cli_error(p, ["not found", "no such", "exist"], mp)


def test_error_wrong_credentials(mp, s3_bucket):
    s3_bucket.put("f", b"f")
    p = run_cli(["mount"] + s3_bucket.args()[:1] + [mp] + s3_bucket.args()[1:],
                env=bucketfs_env(AWS_SECRET_ACCESS_KEY="wrong"))
    assert_cli_error(p, ["credential", "signature", "access denied", "denied", "forbidden", "auth",
                         "secret", "permission"], mp)


def test_error_no_credentials(mp, s3_bucket, tmp_path):
    """No AWS credentials anywhere: the error says so, and does not blame the network."""
    env = bucketfs_env(AWS_ACCESS_KEY_ID=None, AWS_SECRET_ACCESS_KEY=None, AWS_SESSION_TOKEN=None,
                       AWS_PROFILE=None, HOME=str(tmp_path),
                       AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
                       AWS_CONFIG_FILE=str(tmp_path / "none"))
    p = run_cli(["mount"] + s3_bucket.args()[:1] + [mp] + s3_bucket.args()[1:], env=env)
    assert_cli_error(p, ["credential"], mp)
    low = p.err.lower()
    assert "cannot reach" not in low and "network" not in low, \
        f"missing credentials reported as a connectivity problem: {p.err.strip()!r}"


def test_error_unreachable_endpoint(mp):
    require_bin()
    p = run_cli(["mount", "s3://some-bucket", mp, "--endpoint", "http://127.0.0.1:1"])
    assert_cli_error(p, ["connect", "reach", "refused", "endpoint", "timed out", "timeout", "network"], mp)


def test_error_unreachable_endpoint_gcs(mp):
    require_bin()
    p = run_cli(["mount", "gs://some-bucket", mp, "--endpoint", "http://127.0.0.1:1", "--anonymous"])
    assert_cli_error(p, ["connect", "reach", "refused", "endpoint", "timed out", "timeout", "network"], mp)


def test_error_mountpoint_missing():
    require_bin()
    missing = os.path.join(tempfile.gettempdir(), "bucketfs-no-such-dir-" + os.urandom(6).hex())
    p = run_cli(["mount", "mem://", missing])
    assert_cli_error(p, ["exist", "no such", "not found", "missing"])
    assert not os.path.exists(missing), "mount must not create a missing mount point"


def test_error_url_without_mountpoint():
    """`bucketfs mount s3://my-bucket`: the mount point was forgotten; say so, not `mkdir -p s3:`."""
    require_bin()
    p = run_cli(["mount", "s3://my-bucket"])
    assert_cli_error(p, ["mount point is missing"])
    assert "mkdir" not in p.err and "usage" in p.err.lower(), p.err
    p = run_cli(["mount", "/mnt", "s3://my-bucket"])
    assert_cli_error(p, ["comes first"])
    assert "bucketfs mount s3://my-bucket /mnt" in p.err, p.err


def test_error_mountpoint_is_file():
    require_bin()
    with tempfile.NamedTemporaryFile(prefix="bucketfs-file-mp-") as f:
        p = run_cli(["mount", "mem://", f.name])
        assert_cli_error(p, ["directory", "not a dir"], f.name)


def test_error_already_mounted():
    with mounted(["mem://"]) as mp:
        p = run_cli(["mount", "mem://", mp])
        assert_cli_error(p, ["already", "mounted", "busy", "in use"])
        # the first mount is still alive and working
        assert is_mounted(mp)
        assert os.listdir(mp) == []
    assert not is_mounted(mp)


def test_error_file_url_missing_dir(mp):
    require_bin()
    p = run_cli(["mount", "file:///no/such/bucketfs/dir-" + os.urandom(4).hex(), mp])
    assert_cli_error(p, ["exist", "no such", "not found", "missing", "directory"], mp)


@pytest.mark.parametrize("flag", ["--staging-dir", "--cache-dir", "file-store"])
def test_error_a_directory_the_mount_needs_inside_its_mount_point(mp, flag):
    """The staging or cache directory (or a local folder store) inside the mount point: the
    daemon wrote it through its own mount, and the first write hung in D state for good."""
    require_bin()
    inner = os.path.join(mp, "inner")
    if flag == "file-store":
        os.makedirs(inner)
        args = ["mount", "file://" + inner, mp]
    else:
        args = ["mount", "mem://", mp, flag, inner]
    p = run_cli(args)
    assert_cli_error(p, ["inside the mount point"], inner)
    assert not is_mounted(mp)


def test_error_unmount_not_mounted(mp):
    require_bin()
    p = run_cli(["unmount", mp])
    assert_cli_error(p, ["not mounted", "not a bucketfs", "no mount", "not a mount", "not found",
                         "invalid"])


# The "no /dev/fuse" error cannot be provoked as root without hiding the device from the
# whole machine; the CLI has no documented override for the device path, so it is not tested.


def test_help_and_usage_errors():
    require_bin()
    p = run_cli(["--help"])
    assert p.returncode == 0 and "mount" in p.out.lower()
    p = run_cli(["mount"])
    assert p.returncode != 0 and p.err.strip(), "mount without a mount point must fail with a message"
    p = run_cli(["frobnicate"])
    assert p.returncode != 0 and p.err.strip()



def test_man_pages_one_per_subcommand(tmp_path):
    """`bucketfs man --dir DIR` writes bucketfs.1 and bucketfs-SUBCOMMAND.1 pages that man(1)
    renders with that subcommand's own options; `bucketfs man cp` prints one of them."""
    require_bin()
    d = tmp_path / "man1"
    p = run_cli(["man", "--dir", str(d)])
    assert p.returncode == 0, p.err
    listed = sorted(os.path.basename(x) for x in p.out.split())
    assert listed == sorted(os.listdir(d)), (listed, os.listdir(d))
    for want in ("bucketfs.1", "bucketfs-mount.1", "bucketfs-cp.1", "bucketfs-unmount.1", "bucketfs-auth-gdrive.1"):
        assert want in listed, listed
    one = run_cli(["man", "cp"])
    assert one.returncode == 0 and one.out == (d / "bucketfs-cp.1").read_text()
    if shutil.which("man"):
        env = {**os.environ, "MANWIDTH": "100", "MANPAGER": "cat", "PAGER": "cat"}
        text = subprocess.run(["man", "-l", str(d / "bucketfs-mount.1")], capture_output=True, text=True,
                              env=env, timeout=60).stdout
        assert "bucketfs-mount" in text and "--read-only" in text and "--parallel" not in text, text[:2000]
    p = run_cli(["man", "frobnicate"])
    assert p.returncode != 0 and "mount" in p.err, p.err


# --------------------------------------------------------------------------- lifecycle


@pytest.fixture
def lifecycle_args(any_store):
    if any_store == "mem":
        yield ["mem://"], None
        return
    b = Bucket(any_store)
    b.put("ready.txt", b"ready")
    yield b.args(), b
    b.cleanup()


def test_mount_returns_only_when_ready(lifecycle_args):
    args, b = lifecycle_args
    mp = mount(args)
    try:
        # no sleeps: the very next syscalls must see a working mount
        assert os.path.ismount(mp)
        names = os.listdir(mp)
        assert names == ([] if b is None else ["ready.txt"])
        if b is not None:
            with open(os.path.join(mp, "ready.txt"), "rb") as f:
                assert f.read() == b"ready"
        assert len(daemon_pids(mp)) >= 1, "no bucketfs daemon process serves the mount"
    finally:
        unmount(mp)


def test_unmount_cli_stops_daemon(lifecycle_args):
    args, _ = lifecycle_args
    mp = mount(args)
    try:
        pids = daemon_pids(mp)
        assert pids, "no daemon found for the mount"
        p = run_cli(["unmount", mp])
        assert p.returncode == 0, f"unmount exited {p.returncode}: {p.err!r}"
        assert not os.path.ismount(mp)
        # docs/SEMANTICS.md: `bucketfs unmount` also waits for the mount's process to exit
        left = daemon_pids(mp)
        assert wait_until(lambda: not daemon_pids(mp), 15), f"daemon {pids} still running after unmount"
        assert not left, f"unmount returned before the daemon {left} exited (it did exit later)"
    finally:
        unmount(mp)


def test_a_clean_unmount_logs_no_warning(lifecycle_args, tmp_path):
    """An unmount that went well says so and nothing else: the FUSE library's own try to
    unmount again (EINVAL, the mount being gone) logged a WARN an operator took for a
    failure (tester A), and so did its note on each request it does not implement."""
    args, _ = lifecycle_args
    log = tmp_path / "mount.log"
    mp = mount(args + ["--log-file", str(log)])
    try:
        os.listdir(mp)
        src = os.path.join(mp, "src")
        with open(src, "wb") as f:
            f.write(b"x" * 4096)
        with open(src, "rb") as a, open(os.path.join(mp, "dst"), "wb") as b:
            try:  # not implemented: the caller falls back to read and write, as cp does
                os.copy_file_range(a.fileno(), b.fileno(), 4096)
            except OSError:
                pass
        p = run_cli(["unmount", mp])
        assert p.returncode == 0, p.err
        assert wait_until(lambda: not daemon_pids(mp), 15)
    finally:
        unmount(mp)
    text = log.read_text()
    assert "unmounted" in text, text[-2000:]
    assert not [line for line in text.splitlines() if " WARN " in line or " ERROR " in line], text[-2000:]


def test_fusermount_unmount(lifecycle_args):
    args, _ = lifecycle_args
    mp = mount(args)
    try:
        pids = daemon_pids(mp)
        p = subprocess.run(["fusermount3", "-u", mp], capture_output=True, timeout=30)
        assert p.returncode == 0, p.stderr
        assert not os.path.ismount(mp)
        assert wait_until(lambda: not daemon_pids(mp), 15), f"daemon {pids} still running after fusermount3 -u"
    finally:
        unmount(mp)


def test_unmount_while_file_open_then_retry():
    """Unmounting a busy mount fails cleanly (or lazily detaches); it never hangs."""
    with mounted(["mem://"]) as mp:
        fd = os.open(mp, os.O_RDONLY)
        try:
            p = run_cli(["unmount", mp])
            print(f"unmount of a busy mount: exit {p.returncode}, stderr {p.err.strip()!r}")
            if p.returncode != 0:
                assert p.err.strip(), "failed unmount must say why"
                assert is_mounted(mp)
        finally:
            os.close(fd)
        if is_mounted(mp):
            p = run_cli(["unmount", mp])
            assert p.returncode == 0, p.err
        assert not is_mounted(mp)


def test_unmount_of_a_busy_mount_whose_daemon_is_stopped_names_the_daemon():
    """A caller waiting on a stopped (SIGSTOP) daemon keeps the mount busy: the unmount
    said "a process still uses it" (tester S) where the daemon is the one to resume."""
    with mounted(["mem://"]) as mp:
        with open(os.path.join(mp, "f"), "w") as f:
            f.write("x")
        pids = daemon_pids(mp)
        assert pids
        real = os.path.realpath(mp)  # (a path lookup of the mount point would wait on the daemon)
        for p in pids:
            os.kill(p, signal.SIGSTOP)
        waiter = subprocess.Popen(["stat", os.path.join(mp, "f")], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            r = run_cli(["unmount", mp])
            assert r.returncode == 1 and "does not answer" in r.err and f"kill -CONT {pids[0]}" in r.err, r.err
            with open("/proc/self/mounts") as f:
                assert any(line.split()[1] == real for line in f), "unmounted although busy"
        finally:
            for p in pids:
                os.kill(p, signal.SIGCONT)
            waiter.wait(timeout=60)


# SIGHUP: the terminal of a foreground mount closed (it killed the process: a dead mount).
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
@pytest.mark.parametrize("store", ["mem", "s3"])
def test_foreground_signal_unmounts(sig, store):
    require_bin()
    require_store(store)
    b = None
    if store == "mem":
        args = ["mem://"]
    else:
        b = Bucket(store)
        b.put("fg.txt", b"foreground")
        args = b.args()
    mp = new_mountpoint()
    # (SIGHUP as a terminal's sessions have it, even when this run itself ignores it: nohup)
    proc = subprocess.Popen([BIN, "mount", args[0], mp] + args[1:] + ["--foreground"],
                            env=bucketfs_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        assert wait_until(lambda: is_mounted(mp) or proc.poll() is not None, 60), "foreground mount never appeared"
        assert proc.poll() is None, f"--foreground exited early ({proc.returncode}): {proc.stderr.read()!r}"
        assert os.path.ismount(mp)
        if b is not None:
            with open(os.path.join(mp, "fg.txt"), "rb") as f:
                assert f.read() == b"foreground"
        time.sleep(0.5)
        assert proc.poll() is None, "--foreground must stay attached while mounted"
        proc.send_signal(sig)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"bucketfs --foreground ignored {sig.name} for 30 s")
        err = proc.stderr.read().decode(errors="replace")
        assert not is_mounted(mp), f"still mounted after {sig.name}"
        assert rc == 0, f"exit code {rc} after {sig.name}; stderr {err[-1000:]!r}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        force_unmount(mp)
        unmount(mp)
        if b is not None:
            b.cleanup()


def test_s3_endpoint_from_env(s3_bucket):
    """AWS_ENDPOINT_URL instead of --endpoint."""
    s3_bucket.put("env.txt", b"via env")
    env = bucketfs_env(AWS_ENDPOINT_URL=seed.S3_ENDPOINT)
    with mounted([f"s3://{s3_bucket.name}"], env=env) as mp:
        with open(os.path.join(mp, "env.txt"), "rb") as f:
            assert f.read() == b"via env"


def test_default_store_without_url(tmp_path):
    """`bucketfs mount MP` mounts the embedded default store under $HOME/.local/share/bucketfs/default."""
    home = tmp_path / "home"
    home.mkdir()
    env = bucketfs_env(HOME=str(home), XDG_DATA_HOME=None)
    mp = mount([], env=env)
    try:
        assert os.path.ismount(mp)
        os.listdir(mp)
        assert (home / ".local/share/bucketfs/default").exists(), \
            "the default store should live under ~/.local/share/bucketfs/default"
    finally:
        unmount(mp)


def test_a_mount_waits_for_the_process_still_in_its_staging_dir(s3_bucket, tmp_path):
    """Two processes never share a staging directory (docs/SEMANTICS.md, "Unmount"): an
    unmount by fusermount3 returns while the process still uploads, and a mount started
    then waits for it instead of taking its spare files and staged uploads."""
    staging = str(tmp_path / "staging")
    s3_bucket.put("one.txt", b"1")
    mp1 = mount(s3_bucket.args() + ["--staging-dir", staging])
    mp2 = new_mountpoint()
    second = subprocess.Popen([BIN, "mount"] + s3_bucket.args()[:1] + [mp2] + s3_bucket.args()[1:]
                              + ["--staging-dir", staging], env=bucketfs_env(),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(3)
        assert second.poll() is None and not is_mounted(mp2), \
            "a second process mounted with the staging directory of a live mount"
        subprocess.run(["fusermount3", "-u", mp1], capture_output=True, timeout=30)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 0, f"the waiting mount failed: {err.decode(errors='replace')!r}"
        assert is_mounted(mp2)
        with open(os.path.join(mp2, "one.txt"), "rb") as f:
            assert f.read() == b"1"
    finally:
        if second.poll() is None:
            second.kill()
        unmount(mp1)
        unmount(mp2)


def test_two_mounts_side_by_side(s3_bucket):
    """Two daemons at once; unmounting one leaves the other working."""
    s3_bucket.put("one.txt", b"1")
    mp1 = mount(s3_bucket.args())
    mp2 = mount(["mem://"])
    try:
        assert os.listdir(mp1) == ["one.txt"] and os.listdir(mp2) == []
        assert run_cli(["unmount", mp2]).returncode == 0
        assert not is_mounted(mp2)
        with open(os.path.join(mp1, "one.txt"), "rb") as f:
            assert f.read() == b"1"
    finally:
        unmount(mp1)
        unmount(mp2)


def test_error_a_staging_dir_that_cannot_be_written(mp, s3_bucket, tmp_path):
    """A staging directory that exists but takes no files (here on a read-only file
    system) is refused at mount, naming it; every create failed with a bare EIO before
    (tester E). A read-only mount needs no staging, and mounts."""
    ro = tmp_path / "ro"
    ro.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        args = s3_bucket.args()[:1] + [mp] + s3_bucket.args()[1:] + ["--staging-dir", str(ro)]
        assert_cli_error(run_cli(["mount"] + args), ["staging", "writ"], mp)
        s3_bucket.put("one.txt", b"1")
        r = run_cli(["mount"] + args + ["--read-only"])
        assert r.returncode == 0, r.err
        with open(os.path.join(mp, "one.txt"), "rb") as f:
            assert f.read() == b"1"
        unmount(mp)
    finally:
        force_unmount(mp)
        subprocess.run(["umount", str(ro)], capture_output=True)


def test_a_read_only_mount_sends_nothing_an_earlier_mount_left(s3_bucket, tmp_path):
    """A write-back mount killed with a file closed and not uploaded leaves it in its
    staging directory. The next mount of the mount point with `--read-only` changes nothing
    in the bucket (it uploaded the file before: tester E) and shows the bucket as it is;
    the next read-write mount uploads it."""
    from hangkit import kill_daemon, remount
    staging = str(tmp_path / "staging")
    s3_bucket.put("f.txt", b"OLD")
    args = s3_bucket.args() + ["--staging-dir", staging, "--write-back", "--write-back-delay", "600"]
    mp = mount(args)
    try:
        with open(os.path.join(mp, "f.txt"), "wb") as f:
            f.write(b"NEW")
        kill_daemon(mp)
        remount(mp, args[:1] + args[1:] + ["--read-only"])
        with open(os.path.join(mp, "f.txt"), "rb") as f:
            assert f.read() == b"OLD", "a read-only mount shows what the bucket holds"
        assert seed.get("s3", s3_bucket.name, "f.txt") == b"OLD", "the read-only mount uploaded"
        unmount(mp)
        remount(mp, args)
        assert run_cli(["sync", mp], timeout=120).returncode == 0
        assert seed.get("s3", s3_bucket.name, "f.txt") == b"NEW", "the read-write mount did not upload"
    finally:
        unmount(mp)


def test_two_mounts_started_at_once_on_one_mount_point_never_stack(s3_bucket, tmp_path):
    """Two `bucketfs mount` of two buckets started at the same moment on one mount point:
    one mounts, the other fails naming the mount point; both exited 0 and stacked before,
    and writes went to the bucket of the mount on top (tester E: 9 of 9)."""
    other = Bucket("s3")
    try:
        for rnd in range(3):
            mp = new_mountpoint()
            procs = [subprocess.Popen([BIN, "mount"] + b.args()[:1] + [mp] + b.args()[1:]
                                      + ["--staging-dir", str(tmp_path / f"st{rnd}{i}")],
                                      env=bucketfs_env(), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                     for i, b in enumerate((s3_bucket, other))]
            try:
                codes = [p.wait(timeout=120) for p in procs]
                with open("/proc/mounts") as f:
                    stacked = [l for l in f if l.split()[1] == mp]
                assert len(stacked) == 1 and sorted(codes) == [0, 1], \
                    f"round {rnd}: exit codes {codes}, mounts at the mount point {stacked}"
            finally:
                while is_mounted(mp):
                    unmount(mp)
    finally:
        other.cleanup()


def test_an_interrupted_mount_command_never_mounts_later(s3_bucket, tmp_path, toxiproxy):
    """`timeout 3 bucketfs mount` while the store does not answer: the command is killed,
    and the process it started must not mount once the store answers (it did, 20 s later,
    over whatever was mounted there meanwhile: tester E)."""
    from conftest import upstream_of
    px = toxiproxy.proxy(upstream_of("s3"))
    mp = new_mountpoint()
    try:
        hole = px.toxic("timeout", stream="downstream", timeout=0)
        args = [s3_bucket.args()[0], mp, "--endpoint", px.endpoint, "--staging-dir", str(tmp_path / "st")]
        cmd = subprocess.Popen([BIN, "mount"] + args, env=bucketfs_env(), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(3)
        assert cmd.poll() is None, "the mount did not wait for the store"
        children = daemon_pids(mp)
        assert children, "no mount process found"
        cmd.send_signal(signal.SIGINT)  # Ctrl-C: to the command only (the daemon has its own session)
        cmd.wait(timeout=30)
        px.remove(hole)
        mounted_at = []
        gone = wait_until(lambda: is_mounted(mp) and mounted_at.append(1) or
                          not any(os.path.exists(f"/proc/{p}") for p in children), 90)
        assert not mounted_at and not is_mounted(mp), "the interrupted mount's process mounted later"
        assert gone, f"the interrupted mount's process is still running: {children}"
    finally:
        px.clear()
        force_unmount(mp)
        px.delete()


def test_sync_timeout_holds_when_the_mount_process_does_not_answer(s3_bucket, tmp_path):
    """`bucketfs sync --timeout 5` against a mount process that answers nothing (stopped)
    returns within a second or two of its timeout, exit 1, and says how long it waited; it
    took 20 s before and said "after 10s" (tester E)."""
    mp = mount(s3_bucket.args() + ["--staging-dir", str(tmp_path / "st"), "--write-back"])
    pids = daemon_pids(mp)
    try:
        for p in pids:
            os.kill(p, signal.SIGSTOP)
        r = run_cli(["sync", mp, "--timeout", "5"], timeout=60)
        assert r.returncode == 1 and "timed out after" in r.err, (r.returncode, r.err)
        said = int(r.err.split("timed out after ", 1)[1].split("s", 1)[0])
        assert r.elapsed < 15 and said <= r.elapsed + 1, f"took {r.elapsed:.1f}s: {r.err.strip()}"
    finally:
        for p in pids:
            os.kill(p, signal.SIGCONT)
        unmount(mp)


def test_a_mount_over_a_stopped_mount_says_so_at_once(s3_bucket, tmp_path):
    """A second `bucketfs mount` on a mount point whose mount process is stopped (or hung)
    says it is already a mount point; it waited for good in a `stat` of it (tester H)."""
    mp = mount(s3_bucket.args() + ["--staging-dir", str(tmp_path / "st")])
    pids = daemon_pids(mp)
    try:
        for p in pids:
            os.kill(p, signal.SIGSTOP)
        r = run_cli(["mount"] + s3_bucket.args()[:1] + [mp] + s3_bucket.args()[1:]
                    + ["--staging-dir", str(tmp_path / "st2")], timeout=60)
        assert_cli_error(r, ["already a mount point"])
    finally:
        for p in pids:
            os.kill(p, signal.SIGCONT)
        unmount(mp)


def test_more_fuse_threads_than_the_open_files_limit_allows_is_refused(tmp_path):
    """Under `ulimit -n 100`, `--fuse-threads 150` mounted, said so, and its FUSE session
    died at once ("Too many open files"): `mount` exited 0 over a dead mount point. It is
    refused with what to change; 30 threads under the same limit mount and serve."""
    import resource

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))

    mp = new_mountpoint()
    args = [require_bin(), "mount", f"file://{tmp_path / 'store'}", mp,
            "--staging-dir", str(tmp_path / "st"), "--cache-dir", str(tmp_path / "ca")]
    (tmp_path / "store").mkdir()
    try:
        p = subprocess.run(args + ["--fuse-threads", "150"], env=bucketfs_env(), stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=CLI_TIMEOUT, preexec_fn=low_limit)
        assert p.returncode != 0 and not is_mounted(mp), f"mounted with 150 threads under 100 files: {p.stderr}"
        assert "--fuse-threads 150" in p.stderr and "ulimit -n" in p.stderr, p.stderr
        p = subprocess.run(args + ["--fuse-threads", "30"], env=bucketfs_env(), stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=CLI_TIMEOUT, preexec_fn=low_limit)
        assert p.returncode == 0, p.stderr
        with open(os.path.join(mp, "a"), "w") as f:
            f.write("served")
        assert open(os.path.join(mp, "a")).read() == "served"
    finally:
        unmount(mp)
