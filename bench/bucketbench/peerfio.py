"""Experiment 9: the peers' own published fio jobs, every system.

The job files are vendored unchanged in bucketbench/fio-jobs/ (a header names each one's
source repository, path and commit):

* mountpoint-s3's `mountpoint-s3/scripts/fio/read/*.fio` and `write/*.fio`, the jobs behind
  its published throughput results. Run as its `scripts/fs_bench.sh` runs them:
  `fio --thread --output-format=json --directory=MOUNT --eta=never JOB`, the files a read
  job needs laid out beforehand (fs_bench.sh lays them out through the mount with
  `--create_only=1`; here they are put into the bucket directly, once per run, and the
  job finds them), on a fresh mount. On S3 systems (its jobs read an S3 bucket) and the
  native disk (the floor); GCS systems are not given them.
* gcsfuse's three "Fio templated configuration" files of docs/benchmarks.md (sequential
  reads, random reads, sequential writes), with DIR, NUMJOBS, BS, FILESIZE and NRFILES in
  the environment as that page runs them, for rows of its published tables (ROWS). On every
  system. Read rows are laid out first through the mount with `fio --create_only=1`
  (untimed), then the system is mounted afresh and the job runs.

What is scaled, and only that (this machine: 2 cores, 24 GiB, about 50 GB of free disk):

* mountpoint-s3: `size=100G` of the read jobs to BIG_SIZE (a file of 100 GiB per job
  thread does not fit) and `runtime=30s` of every job to RUNTIME (19 jobs x 30 s x every
  system, 10 iterations each upstream, does not fit a sitting); one iteration per job.
  The 100 GiB of the write jobs is only a cap their runtime never reaches and stays. A
  time-based read job that reaches the end of its file starts over from its start, and
  then reads what the page cache may hold: the "passes" row says how many times each
  job's file was read (above 1: it started over).
  Also given on the command line: `--filename_format=mp-big.$jobnum.$filenum` (or
  mp-small for the 5 MiB jobs), so every read job reads the same laid-out files instead
  of its own copy per job name (the bytes and the access pattern are the job's own).
* gcsfuse: NUMJOBS (192, 144 or 96 on its 192-core machine) to at most MAX_JOBS and
  NRFILES so that a row moves at most ROW_BUDGET bytes (scale_row); FILESIZE and BS are
  the published row's.

Figures per job: MB/s (fio's bw), the file system process's CPU seconds per GB moved, IOPS
and mean latency; for mountpoint-s3's read jobs the passes over the file. A job a system
cannot do is recorded as failed with fio's error (mountpoint-s3 cannot write at random
offsets or after fsync; gcsfuse's write template fsyncs at the end only).
"""

import json
import os
import random
import re

from . import servers as S
from .experiments import (M, Experiment, add_fs_cpu, cpu_metric, fresh_mount, mkdir, rmtree,
                          run_in_dir, wpath, write_failed)
from .util import CmdError, FsCpu, error, is_mounted, log, na, run, summarize

JOBS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fio-jobs")
MP_DIR = os.path.join(JOBS_DIR, "mountpoint-s3")
GF_DIR = os.path.join(JOBS_DIR, "gcsfuse")
PREFIX = "peerfio"  # where the read jobs' files are, in the bucket and in the seed dir

# (quick, full)
BIG_SIZE = ("512M", "2G")
RUNTIME = ("5s", "10s")
MAX_JOBS = (2, 4)
ROW_BUDGET = (128 << 20, 1 << 30)
SMALL_SIZE = "5m"
MP_QUICK = ["read/seq_read", "read/seq_read_4t", "read/rand_read", "read/seq_read_small",
            "read/rand_read_small", "write/seq_write"]

# gcsfuse's published rows used here: (template, FILESIZE, BS, NUMJOBS, NRFILES, in --quick)
ROWS = [
    ("seq_read", "128K", "128K", 192, 30, False),
    ("seq_read", "1M", "1M", 192, 30, True),
    ("seq_read", "50M", "1M", 192, 20, True),
    ("seq_read", "1G", "1M", 144, 10, False),
    ("rand_read", "256K", "128K", 192, 30, False),
    ("rand_read", "50M", "1M", 192, 20, True),
    ("rand_read", "1G", "1M", 192, 10, False),
    ("write_seq", "256K", "16K", 96, 30, True),
    ("write_seq", "1M", "1M", 96, 30, False),
    ("write_seq", "50M", "1M", 96, 30, True),
    ("write_seq", "1G", "1M", 96, 10, False),
]


# ---- pure helpers (tested in bench/tests) ---------------------------------------------------
def size_bytes(text):
    """fio's size syntax (k, m, g, t suffixes, powers of 2, any case) in bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgtKMGT]?)i?[bB]?\s*", text)
    if not m:
        raise ValueError("not a fio size: %r" % text)
    return int(m.group(1)) << (10 * " kmgt".index(m.group(2).lower() or " "))


def parse_job(text):
    """{option: value} of a job file's single job, its [global] section under it (a flag
    without a value, like time_based, maps to "")."""
    sections, cur = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            cur = sections.setdefault(line.strip("[]"), {})
        elif cur is not None:
            k, _, v = line.partition("=")
            cur[k.strip()] = v.strip()
    opts = dict(sections.pop("global", {}))
    for name, sec in sections.items():
        opts.update(sec)
        opts["jobname"] = name
    return opts


def scale_job(text, changes):
    """The job file with the values of the options in `changes` ({option: {old: new}})
    replaced where they are set; nothing else touched. Returns (text, [what changed])."""
    out, done = [], []
    for line in text.splitlines(keepends=True):
        k, eq, v = line.strip().partition("=")
        new = changes.get(k.strip(), {}).get(v.strip()) if eq else None
        if new is not None:
            out.append("%s=%s\n" % (k.strip(), new))
            done.append("%s=%s -> %s" % (k.strip(), v.strip(), new))
        else:
            out.append(line)
    return "".join(out), done


def scale_row(filesize, numjobs, nrfiles, max_jobs, budget):
    """(NUMJOBS, NRFILES) of a gcsfuse row on this machine: at most max_jobs jobs, and as
    many files per job (up to the published count) as keep the row within `budget` bytes;
    at least one job of one file."""
    size = size_bytes(filesize)
    jobs = max(1, min(numjobs, max_jobs, budget // size or 1))
    files = max(1, min(nrfiles, budget // (jobs * size)))
    return jobs, files


def fio_result(path):
    """bw (MB/s), iops, lat_mean (ms), bytes of a fio JSON output (group_reporting: the
    first job is the group), from the side (read or write) that moved bytes."""
    with open(path) as f:
        text = f.read()
    data = json.loads(text[text.index("{"):])
    job = data["jobs"][0]
    side = max((job.get(d, {}) for d in ("read", "write")), key=lambda s: s.get("io_bytes", 0))
    if job.get("error"):
        raise ValueError("fio job error %s" % job["error"])
    return {"bw": side.get("bw_bytes", 0) / 1e6, "iops": side.get("iops", 0.0),
            "lat_mean": side.get("lat_ns", {}).get("mean", 0.0) / 1e6,
            "bytes": sum(job.get(d, {}).get("io_bytes", 0) for d in ("read", "write"))}


def mp_jobs(quick):
    """mountpoint-s3's job names (read/seq_read ...) run in this mode."""
    if quick:
        return list(MP_QUICK)
    out = []
    for sub in ("read", "write"):
        out += sorted("%s/%s" % (sub, n[:-4]) for n in os.listdir(os.path.join(MP_DIR, sub))
                      if n.endswith(".fio"))
    return out


def mp_file_group(opts):
    """Which laid-out files a mountpoint-s3 read job reads: "small" (its 5 MiB jobs) or
    "big" (its 100 GiB ones, scaled)."""
    return "small" if size_bytes(opts.get("size", "0")) <= 64 << 20 else "big"


def row_key(row):
    tmpl, fsize, bs = row[:3]
    return "gf.%s.%s_%s" % (tmpl, fsize, bs)


# ---- the experiment ----------------------------------------------------------------------
class PeerFio(Experiment):
    id = 9
    title = "The peers' own fio jobs: mountpoint-s3's read and write jobs, gcsfuse's tables"
    writes = True

    def _q(self, ctx, pair):
        return pair[0] if ctx.quick else pair[1]

    def rows(self, ctx):
        return [r for r in ROWS if r[5] or not ctx.quick]

    def metrics(self, ctx):
        ms = []
        for name in mp_jobs(ctx.quick):
            k = "mp." + name.split("/")[1]
            ms += [M(k + ".bw", "mountpoint-s3 %s (MB/s)" % name, "MB/s", "higher"),
                   cpu_metric(k + ".cpu_gb", "mountpoint-s3 %s" % name),
                   M(k + ".iops", "mountpoint-s3 %s: IOPS" % name, "IOPS", "higher"),
                   M(k + ".lat_mean", "mountpoint-s3 %s: mean latency (ms)" % name, "ms", "lower")]
            if name.startswith("read/"):
                ms.append(M(k + ".passes", "mountpoint-s3 %s: passes over its file(s)" % name,
                            "count", "lower"))
        for row in self.rows(ctx):
            k = row_key(row)
            what = "gcsfuse %s FILESIZE=%s BS=%s" % row[:3]
            ms += [M(k + ".bw", what + " (MB/s)", "MB/s", "higher"),
                   cpu_metric(k + ".cpu_gb", what),
                   M(k + ".iops", what + ": IOPS", "IOPS", "higher"),
                   M(k + ".lat_mean", what + ": mean latency (ms)", "ms", "lower")]
        return ms

    def charts(self, ctx):
        return [{"title": "mountpoint-s3's fio jobs (MB/s, log scale)", "ylabel": "MB/s",
                 "log": True, "keys": ["mp.%s.bw" % n.split("/")[1] for n in mp_jobs(ctx.quick)]},
                {"title": "gcsfuse's fio rows (MB/s, log scale)", "ylabel": "MB/s", "log": True,
                 "keys": [row_key(r) + ".bw" for r in self.rows(ctx)]}]

    # ---- files the mountpoint-s3 read jobs read, put into the bucket once per run ----
    def prepare(self, ctx, srv):
        """Lay out the read jobs' files: locally (the native disk reads them there) and in
        the S3 bucket directly, before any system runs (not counted as anyone's requests)."""
        local = os.path.join(ctx.seed_dir, PREFIX)
        os.makedirs(local, exist_ok=True)
        big = size_bytes(self._q(ctx, BIG_SIZE))
        s3 = srv.s3()
        for group, size in (("big", big), ("small", size_bytes(SMALL_SIZE))):
            for n in range(4):  # the 4-thread jobs read files 0..3
                name = "mp-%s.%d.0" % (group, n)
                p = os.path.join(local, name)
                if not (os.path.exists(p) and os.path.getsize(p) == size):
                    log("exp 9: laying out %s (%d MiB)" % (name, size >> 20))
                    rng = random.Random(size + n)
                    with open(p + ".tmp", "wb") as f:
                        left = size
                        while left:
                            f.write(rng.randbytes(min(left, 1 << 20)))
                            left -= min(left, 1 << 20)
                    os.replace(p + ".tmp", p)
                s3.upload_file(p, S.BUCKET, "%s/%s" % (PREFIX, name))
        return "exp 9: read jobs' files in s3://%s/%s: 4 x %s and 4 x %s" % (
            S.BUCKET, PREFIX, self._q(ctx, BIG_SIZE), SMALL_SIZE)

    def describe(self, ctx):
        q = ctx.quick
        return ["Job files: bench/bucketbench/fio-jobs/ (unchanged; each names its source). "
                "Scaled for this machine, and nothing else: mountpoint-s3's read jobs' "
                "`size=100G` to `size=%s`, every mountpoint-s3 job's `runtime=30s` to "
                "`runtime=%s`, one iteration (upstream: 10); gcsfuse's NUMJOBS to at most %d "
                "and NRFILES to keep a row within %d MiB (its FILESIZE and BS as published). "
                "mountpoint-s3's jobs run on the S3 systems and native disk; gcsfuse's on "
                "every system. \"passes\" above 1: the time-based job reached the end of its "
                "file and read it again (from the page cache where it still held it)." % (
                    BIG_SIZE[0] if q else BIG_SIZE[1], RUNTIME[0] if q else RUNTIME[1],
                    MAX_JOBS[0] if q else MAX_JOBS[1],
                    (ROW_BUDGET[0] if q else ROW_BUDGET[1]) >> 20),
                "gcsfuse rows here (FILESIZE, BS, NUMJOBS x NRFILES published -> here): " +
                "; ".join("%s %s/%s %dx%d -> %dx%d" % (
                    r[0], r[1], r[2], r[3], r[4],
                    *scale_row(r[1], r[3], r[4], self._q(ctx, MAX_JOBS),
                               self._q(ctx, ROW_BUDGET))) for r in self.rows(ctx)) + "."]

    def run(self, ctx, system):
        res = {}
        out = os.path.join(ctx.workdir, "peerfio-%s.json" % system.name)
        scratch = os.path.join(ctx.workdir, "peerfio-jobs")
        os.makedirs(scratch, exist_ok=True)
        fresh_mount(ctx, system)
        try:
            for name in mp_jobs(ctx.quick):
                keys = self._mp_keys(name)
                if system.store not in (None, "s3"):
                    res.update({k: na("mountpoint-s3's jobs run on S3 systems") for k in keys})
                    continue
                res.update(self._mp_job(ctx, system, name, out, scratch))
            for row in self.rows(ctx):
                res.update(self._gf_row(ctx, system, row, out))
        finally:
            system.unmount()
        return res

    def _mp_keys(self, name):
        k = "mp." + name.split("/")[1]
        return [k + s for s in (".bw", ".cpu_gb", ".iops", ".lat_mean")] + (
            [k + ".passes"] if name.startswith("read/") else [])

    def _mp_job(self, ctx, system, name, out, scratch):
        keys = self._mp_keys(name)
        k = "mp." + name.split("/")[1]
        with open(os.path.join(MP_DIR, name + ".fio")) as f:
            text = f.read()
        text, _ = scale_job(text, {"runtime": {"30s": self._q(ctx, RUNTIME)},
                                   "size": ({"100G": self._q(ctx, BIG_SIZE)}
                                            if name.startswith("read/") else {})})
        job = os.path.join(scratch, name.replace("/", "-") + ".fio")
        with open(job, "w") as f:
            f.write(text)
        opts = parse_job(text)
        reads = name.startswith("read/")
        d = (os.path.join(system.root, PREFIX) if reads else wpath(system, "peerfio"))
        cmd = ["fio", "--thread", "--output-format=json", "--output=" + out,
               "--directory=" + d, "--eta=never"]
        if reads:
            cmd.append("--filename_format=mp-%s.$jobnum.$filenum" % mp_file_group(opts))
        cmd.append(job)
        try:
            if reads:
                fresh_mount(ctx, system)
            else:
                rmtree(d)
                mkdir(system, d)
            with FsCpu(system.pid) as cpu:
                if reads:
                    run(cmd, ctx.timeout(300))
                else:
                    run_in_dir(system, d, cmd, ctx.timeout(300))
            r = fio_result(out)
        except (CmdError, ValueError, KeyError) as e:
            log("%s: exp 9 %s failed: %s" % (system.name, name, e))
            self._remount_if_gone(ctx, system)
            return write_failed(system, e, keys) if not reads else {x: error(e) for x in keys}
        finally:
            if not reads:
                rmtree(d)
        runs = {}
        for f in ("bw", "iops", "lat_mean"):
            runs[k + "." + f] = [r[f]]
        add_fs_cpu(runs, k + ".cpu_gb", cpu, r["bytes"])
        if reads:
            per = size_bytes(opts["size"]) * int(opts.get("numjobs", 1))
            runs[k + ".passes"] = [r["bytes"] / per]
        log("%s: exp 9 %s: %.0f MB/s" % (system.name, name, r["bw"]))
        return {x: summarize(v) for x, v in runs.items()}

    def _gf_row(self, ctx, system, row, out):
        tmpl, fsize, bs, pub_jobs, pub_files = row[:5]
        k = row_key(row)
        keys = [k + s for s in (".bw", ".cpu_gb", ".iops", ".lat_mean")]
        jobs, files = scale_row(fsize, pub_jobs, pub_files, self._q(ctx, MAX_JOBS),
                                self._q(ctx, ROW_BUDGET))
        d = wpath(system, "gcsfio")
        env = {"DIR": d, "NUMJOBS": str(jobs), "BS": bs, "FILESIZE": fsize,
               "NRFILES": str(files)}
        job = os.path.join(GF_DIR, tmpl + ".fio")
        cmd = ["fio", "--output-format=json", "--output=" + out, "--eta=never", job]
        reads = tmpl != "write_seq"
        try:
            rmtree(d)
            mkdir(system, d)
            if reads:  # laid out through the mount, untimed; then a fresh mount
                run_in_dir(system, d, ["fio", "--create_only=1", "--eta=never", job],
                           ctx.timeout(600), env=env)
                fresh_mount(ctx, system)
            with FsCpu(system.pid) as cpu:
                run(cmd, ctx.timeout(600), env=env) if reads else run_in_dir(
                    system, d, cmd, ctx.timeout(600), env=env)
            r = fio_result(out)
        except (CmdError, ValueError, KeyError) as e:
            log("%s: exp 9 gcsfuse %s %s failed: %s" % (system.name, tmpl, fsize, e))
            self._remount_if_gone(ctx, system)
            rmtree(d)
            return write_failed(system, e, keys)
        rmtree(d)
        runs = {k + "." + f: [r[f]] for f in ("bw", "iops", "lat_mean")}
        add_fs_cpu(runs, k + ".cpu_gb", cpu, r["bytes"])
        log("%s: exp 9 gcsfuse %s %s/%s %dx%d: %.0f MB/s" % (
            system.name, tmpl, fsize, bs, jobs, files, r["bw"]))
        return {x: summarize(v) for x, v in runs.items()}

    @staticmethod
    def _remount_if_gone(ctx, system):
        if system.name != "native" and not is_mounted(system.mp):
            fresh_mount(ctx, system)
