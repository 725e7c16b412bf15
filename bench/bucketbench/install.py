"""Installs what the benchmark needs, skipping whatever is already there.

* Debian packages: fuse3, s3fs, fio, hyperfine, tree, git, make, gcc, awscli; for the
  mountpoint-s3 system also what its build needs (libclang-dev, cmake, g++,
  pkg-config, libfuse3-dev).
* Go binaries at pinned versions (into `go env GOPATH`/bin): MinIO,
  fake-gcs-server, toxiproxy's `server`, rclone and gcsfuse.
* The mountpoint-s3 system's mount binary: bench/mountpoint (our own `main` over the
  published mountpoint-s3-fs and mountpoint-s3-client crates, pinned in its
  Cargo.toml and Cargo.lock), built with `cargo build --release --locked` into the
  work directory when that system is asked for and the binary is older than its
  sources.
* C sources for the developer workload, taken from crates that vendor a C
  library (fetched with cargo, the ordinary client of the crate registry).
* matplotlib for the charts (pip).

A failed install is reported and the systems that need it are recorded as
failed later; it never stops the run.
"""

import glob
import importlib
import os
import shutil
import tarfile

from .util import CmdError, log, run

APT_PACKAGES = {  # package -> a binary it provides
    "fuse3": "fusermount3", "s3fs": "s3fs", "fio": "fio",
    "hyperfine": "hyperfine", "tree": "tree", "git": "git", "make": "make",
    "gcc": "gcc",
    # experiment 8 compares with Debian's own awscli (a path: another `aws` on PATH,
    # from pip or pyenv, does not count)
    "awscli": "/usr/bin/aws",
}

# What building bench/mountpoint needs, asked for only with the mountpoint-s3 system
# (package -> a binary it provides, or a glob of a file it installs): bindgen loads
# libclang to generate the AWS CRT's bindings, cmake builds the CRT's C sources, and
# mountpoint-s3's FUSE crate links libfuse3 (found with pkg-config).
MOUNTPOINT_APT = {
    "libclang-dev": "/usr/lib/llvm-*/lib/libclang.so", "cmake": "cmake", "g++": "g++",
    "pkg-config": "pkg-config", "libfuse3-dev": "/usr/lib/*/pkgconfig/fuse3.pc",
}
MOUNTPOINT_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "mountpoint")
MOUNTPOINT_BIN = "bucketbench-mount-s3"
# The build compiles the AWS CRT (C, with cmake) and links with LTO and one codegen unit,
# as mount-s3's release profile does: tens of minutes on 2 cores.
MOUNTPOINT_BUILD_TIMEOUT = 7200

# binary name -> (module@version, needs newer Go toolchain)
GO_BINARIES = {
    "minio": ("github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c", None),
    "fake-gcs-server": ("github.com/fsouza/fake-gcs-server@v1.56.1", None),
    "server": ("github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0", None),
    "rclone": ("github.com/rclone/rclone@v1.76.0", "go1.27.2"),
    "gcsfuse": ("github.com/googlecloudplatform/gcsfuse/v3@v3.13.0", "go1.27.2"),
}

# project -> (crate, version, directory in the crate holding the C project)
C_SOURCES = {
    "bzip2": ("bzip2-sys", "0.1.13+1.0.8", "bzip2-1.0.8"),
    "lz4": ("lz4-sys", "1.11.1+lz4-1.10.0", "liblz4"),
}
# --quick keeps only what `make libbz2.a bzip2 bzip2recover` needs (18 files
# instead of 55), so that the slowest peers finish in time
C_KEEP = {
    "bzip2": ["Makefile", "LICENSE", "README", "blocksort.c", "huffman.c", "crctable.c",
              "randtable.c", "compress.c", "decompress.c", "bzlib.c", "bzip2.c",
              "bzip2recover.c", "bzlib.h", "bzlib_private.h", "words0", "words1", "words2",
              "words3"],
}


def gobin():
    """Where `go install` puts binaries: GOBIN if set, else the first GOPATH's bin
    (~/go/bin by default)."""
    try:
        out = run(["go", "env", "GOBIN", "GOPATH"], 30)[1].splitlines()
        gobin_, gopath = (out + ["", ""])[:2]
        if gobin_.strip():
            return gobin_.strip()
        return os.path.join(gopath.strip().split(":")[0], "bin")
    except (CmdError, OSError):
        return os.path.expanduser("~/go/bin")


def go_binary(name):
    """Absolute path of an installed Go binary, or None."""
    p = os.path.join(gobin(), name)
    return p if os.access(p, os.X_OK) else None


def _present(what):
    """Whether a package's marker is here: a binary on PATH, or a file (glob) if it
    starts with /."""
    if what.startswith("/"):
        return bool(glob.glob(what))
    return bool(shutil.which(what))


def ensure_apt(extra=None):
    wanted = dict(APT_PACKAGES, **(extra or {}))
    missing = [p for p, b in wanted.items() if not _present(b)]
    if not missing:
        return {}
    log("apt: installing " + " ".join(missing))
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    try:
        run(["apt-get", "install", "-y", "-q"] + missing, 900, env=env)
    except CmdError:
        try:
            run(["apt-get", "update", "-q"], 600, env=env)
            run(["apt-get", "install", "-y", "-q"] + missing, 900, env=env)
        except CmdError as e:
            log("apt install failed: %s" % e)
            return {p: str(e) for p in missing if not _present(wanted[p])}
    return {}


def ensure_go(names):
    """Install the wanted Go binaries that are missing, one after another."""
    failures = {}
    for name in names:
        if go_binary(name):
            continue
        mod, toolchain = GO_BINARIES[name]
        env = {"GOTOOLCHAIN": toolchain} if toolchain else None
        log("go install %s (this can take several minutes on 2 cores)" % mod)
        try:
            run(["go", "install", mod], 3600, env=env)
        except (CmdError, OSError) as e:
            log("go install %s failed: %s" % (mod, e))
            failures[name] = str(e)
    return failures


def ensure_matplotlib():
    try:
        importlib.import_module("matplotlib")
        return None
    except ImportError:
        pass
    import sys
    log("pip install matplotlib")
    try:
        run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], 900)
    except CmdError as e:
        return str(e)
    return None


def ensure_c_source(name, dest):
    """Put the C project `name` (see C_SOURCES) into `dest`; return dest."""
    if os.path.isdir(dest):
        return dest
    crate, version, subdir = C_SOURCES[name]
    cargo_home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
    pattern = os.path.join(cargo_home, "registry", "cache", "*",
                           "%s-%s.crate" % (crate, version))
    found = glob.glob(pattern)
    if not found:
        proj = dest + ".fetch"
        os.makedirs(os.path.join(proj, "src"), exist_ok=True)
        with open(os.path.join(proj, "Cargo.toml"), "w") as f:
            f.write('[package]\nname = "bucketbench-fetch"\nversion = "0.0.0"\n'
                    'edition = "2021"\n[dependencies]\n%s = "=%s"\n' % (crate, version))
        with open(os.path.join(proj, "src", "lib.rs"), "w") as f:
            f.write("")
        log("cargo fetch %s %s" % (crate, version))
        run(["cargo", "fetch", "--manifest-path", os.path.join(proj, "Cargo.toml")], 600)
        found = glob.glob(pattern)
        if not found:
            raise RuntimeError("crate %s-%s not in the cargo cache after fetch" % (crate, version))
    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with tarfile.open(found[0]) as t:
        prefix = "%s-%s/%s/" % (crate, version, subdir)
        members = [m for m in t.getmembers() if m.name.startswith(prefix)]
        if hasattr(tarfile, "data_filter"):
            t.extractall(tmp, members=members, filter="data")
        else:
            t.extractall(tmp, members=members)
    os.rename(os.path.join(tmp, "%s-%s" % (crate, version), subdir), dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return dest


def mountpoint_binary(workdir):
    """Where the mountpoint-s3 system's binary is built (whether or not it is yet)."""
    return os.path.join(workdir, "mountpoint-target", "release", MOUNTPOINT_BIN)


def _newest_source_mtime():
    paths = [os.path.join(MOUNTPOINT_SRC, n) for n in ("Cargo.toml", "Cargo.lock")]
    for d, _, names in os.walk(os.path.join(MOUNTPOINT_SRC, "src")):
        paths += [os.path.join(d, n) for n in names]
    return max(os.path.getmtime(p) for p in paths)


def ensure_mountpoint(workdir):
    """Build bench/mountpoint unless its binary is newer than every source file of it.
    `nice -n 10`: other builds share these 2 cores. The output goes to
    logs/mountpoint-build.log. Returns None or the error."""
    binary = mountpoint_binary(workdir)
    if os.access(binary, os.X_OK) and os.path.getmtime(binary) >= _newest_source_mtime():
        return None
    logdir = os.path.join(workdir, "logs")
    os.makedirs(logdir, exist_ok=True)
    cmd = ["nice", "-n", "10", "cargo", "build", "--release", "--locked",
           "--manifest-path", os.path.join(MOUNTPOINT_SRC, "Cargo.toml"),
           "--target-dir", os.path.join(workdir, "mountpoint-target")]
    log("building the mountpoint-s3 mount binary: %s (the AWS CRT included: tens of "
        "minutes on 2 cores the first time)" % " ".join(cmd))
    try:
        rc, out, err, dt = run(cmd, MOUNTPOINT_BUILD_TIMEOUT, check=False)
    except (CmdError, OSError) as e:
        log("mountpoint-s3 build failed: %s" % e)
        return "build failed: %s" % e
    with open(os.path.join(logdir, "mountpoint-build.log"), "a") as f:
        f.write("=== %s\n%s%s\n=== exit %d after %.0f s\n" % (" ".join(cmd), out, err, rc, dt))
    if rc != 0 or not os.access(binary, os.X_OK):
        log("mountpoint-s3 build failed (exit %d), see logs/mountpoint-build.log" % rc)
        return "build failed (exit %d): %s" % (rc, (err or out)[-400:])
    # cargo leaves the binary's mtime alone when nothing changed; mark it up to date
    os.utime(binary)
    log("mountpoint-s3 mount binary built in %.0f s" % dt)
    return None


def ensure_all(systems, experiments=(), workdir=None):
    """Install everything the selected systems and experiments need; returns
    {what: error}. `workdir` is where the mountpoint-s3 binary is built."""
    failures = {}
    want_mountpoint = "mountpoint-s3" in systems and workdir
    failures.update(ensure_apt(MOUNTPOINT_APT if want_mountpoint else None))
    want = ["minio", "fake-gcs-server", "server"]
    if any(s.startswith("rclone") for s in systems) or 8 in experiments:
        want.append("rclone")
    if "gcsfuse" in systems:
        want.append("gcsfuse")
    failures.update(ensure_go(want))
    if want_mountpoint:
        if any(p in failures for p in MOUNTPOINT_APT):
            failures["mountpoint-s3"] = "not built: its build packages failed to install"
        else:
            err = ensure_mountpoint(workdir)
            if err:
                failures["mountpoint-s3"] = err
    err = ensure_matplotlib()
    if err:
        failures["matplotlib"] = err
    return failures
