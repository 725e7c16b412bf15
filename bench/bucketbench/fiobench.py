"""Experiment 3: fio writes and reads through the mount.

Writes go to a scratch directory in the mount (fio creates the files);
reads use the seeded big/ objects so a read-only mount can be measured too.
Every job uses the psync engine, group reporting and a runtime cap, and each
has a timeout. fsync "N" means one fsync at the end (fio --end_fsync=1).
For each job we record bandwidth (MB/s), IOPS, mean latency and p99
completion latency (ms); for buffered writes with one fsync at the end (fsync=N)
also the write phase before that final flush (s): the job's write calls' summed
latency per job (fio's bandwidth counts the end fsync in its runtime). A job that
fails on one system is recorded as an error for that system and the next job runs.

Durability of fsync (issue 43): fio cannot tell whether an fsync put the bytes in the
bucket, so a plain appender (16 KiB writes, fsync every 10, 16 MiB; 4 MiB in --quick)
asks the store directly after each fsync returns, through the same proxy: a ranged GET of
the last 16 KiB written, compared with what was written. Recorded: the share of fsyncs
after which another client sees every byte written before them (%), and the appender's
rate including those fsyncs (MB/s, the reads not counted).
"""

import json
import os

from .experiments import (M, Experiment, error, fresh_mount, mkdir, rmtree, wpath,
                          write_failed)
from .util import CmdError, FsCpu, drop_caches, is_mounted, log, na, run, summarize


class Job:
    def __init__(self, rw, size, bs, jobs=1, fsync="N", src=None):
        self.rw, self.size, self.bs, self.jobs, self.fsync, self.src = (
            rw, size, bs, jobs, fsync, src)

    @property
    def writes(self):
        return "write" in self.rw

    @property
    def key(self):
        k = "%s_%s_%s_j%d" % (self.rw, self.size, self.bs, self.jobs)
        return k + ("_fsync%s" % self.fsync if self.writes else "")

    @property
    def fields(self):
        """What is recorded of this job: FIELDS, and for fsync=N writes the write phase."""
        return FIELDS + ([WRITE_PHASE] if self.writes and self.fsync == "N" else [])

    @property
    def label(self):
        what = {"write": "seq write", "randwrite": "rand write", "read": "seq read",
                "randread": "rand read"}[self.rw]
        s = "%s %s bs=%s x%d" % (what, self.size, self.bs, self.jobs)
        if self.writes:
            s += " fsync=%s" % self.fsync
        return s


QUICK_JOBS = [
    Job("write", "64M", "1M"),
    Job("write", "4M", "16K", fsync="10"),
    Job("write", "4M", "16K", fsync="3"),
    Job("randwrite", "16M", "16K"),
    Job("write", "16M", "1M", jobs=4),
    Job("read", "100M", "1M", src=100),
    Job("randread", "100M", "16K", jobs=4, src=100),
]

FULL_JOBS = [
    Job("write", "256K", "16K"),
    Job("write", "16M", "1M"),
    Job("write", "256M", "1M"),
    Job("write", "1G", "1M"),
    Job("write", "16M", "16K"),
    Job("write", "16M", "16K", fsync="1"),
    Job("write", "16M", "16K", fsync="10"),
    Job("write", "16M", "16K", fsync="3"),
    Job("write", "64M", "1M", fsync="10"),
    Job("write", "64M", "1M", jobs=4),
    Job("write", "16M", "1M", jobs=16),
    Job("randwrite", "256K", "16K"),
    Job("randwrite", "16M", "16K"),
    Job("randwrite", "256M", "16K"),
    Job("randwrite", "16M", "16K", jobs=4),
    Job("randwrite", "16M", "16K", fsync="10"),
    Job("randwrite", "64M", "1M"),
    Job("read", "200M", "1M", src=200),
    Job("read", "200M", "1M", jobs=4, src=200),
    Job("randread", "200M", "16K", src=200),
    Job("randread", "200M", "16K", jobs=16, src=200),
    Job("randread", "200M", "1M", src=200),
]

# Jobs a system is not given, and why. rclone without its VFS cache answers each seek with
# a new open-ended ranged GET and drops it after a few KB; through toxiproxy that streams
# the rest of the object into the proxy's buffers (7 GB a minute with 16 readers here,
# past the machine's memory), so the figure would measure the proxy, not rclone.
NOT_RUN = {
    ("rclone-off", "randread"): "not run: without a cache every seek is a new open-ended "
                                "GET; through the proxy that exhausts the machine's memory",
}

# Extra fio options a system's write jobs get, and why (the report says so under the table).
# Without --create_on_open fio lays each file out first (creates it, closes it) and then
# reopens it O_RDWR without O_TRUNC, which mountpoint-s3 opens for reading only, so every
# write fails with EBADF; mountpoint-s3's own fio write jobs set create_on_open=1.
WRITE_EXTRA = {
    "mountpoint-s3": ["--create_on_open=1"],
}

FIELDS = [("bw", "MB/s", "higher"), ("cpu_gb", "s/GB", "lower"), ("iops", "IOPS", "higher"),
          ("lat_mean", "ms", "lower"), ("lat_p99", "ms", "lower")]
WRITE_PHASE = ("write_s", "s", "lower")
DURABLE = [("durable_fsync.pct", "appender 16K fsync=10: fsyncs after which the bucket holds every byte (%)",
            "%", "higher"),
           ("durable_fsync.bw", "appender 16K fsync=10: rate with those fsyncs (MB/s)", "MB/s", "higher"),
           ("durable_fsync.cpu_gb", "appender 16K fsync=10: file system CPU (s per GB)", "s/GB",
            "lower")]
FIELD_LABELS = {"write_s": "write phase before the final flush",
                "cpu_gb": "file system CPU per GB"}


def parse_fio(path, writes, numjobs=1):
    """bw, iops, lat_mean, lat_p99 of the job group; for writes also write_s, the
    seconds each job spent in its write calls (their summed latency ÷ jobs): with
    --end_fsync the write phase before the final flush, which fio's runtime includes."""
    with open(path) as f:
        text = f.read()
    data = json.loads(text[text.index("{"):])
    side = data["jobs"][0]["write" if writes else "read"]
    pct = side.get("clat_ns", {}).get("percentile", {})
    out = {"bw": side["bw_bytes"] / 1e6, "iops": side["iops"],
           "lat_mean": side["lat_ns"]["mean"] / 1e6,
           "lat_p99": pct.get("99.000000", 0) / 1e6,
           "bytes": sum(data["jobs"][0].get(d, {}).get("io_bytes", 0) for d in ("read", "write"))}
    if writes:
        out["write_s"] = side["lat_ns"]["mean"] * side["total_ios"] / 1e9 / max(1, numjobs)
    return out


class Fio(Experiment):
    id = 3
    title = "fio: sequential and random writes (fsync every 1, 10, N) and reads"
    writes = True

    def jobs(self, ctx):
        return QUICK_JOBS if ctx.quick else FULL_JOBS

    def metrics(self, ctx):
        ms = [M(k, label, unit, better) for k, label, unit, better in DURABLE]
        for j in self.jobs(ctx):
            for field, unit, better in j.fields:
                ms.append(M("%s.%s" % (j.key, field), "%s: %s (%s)" % (
                    j.label, FIELD_LABELS.get(field, field), unit), unit, better))
        return ms

    def charts(self, ctx):
        js = self.jobs(ctx)
        return [{"title": "fio bandwidth (MB/s, log scale)", "ylabel": "MB/s", "log": True,
                 "keys": ["%s.bw" % j.key for j in js]},
                {"title": "fio p99 latency (ms, log scale)", "ylabel": "ms", "log": True,
                 "keys": ["%s.lat_p99" % j.key for j in js]}]

    def _cmd(self, ctx, system, job, d, out):
        cap = 5 if ctx.quick else 60
        cmd = ["fio", "--name=" + job.rw, "--rw=" + job.rw, "--bs=" + job.bs,
               "--size=" + job.size, "--numjobs=%d" % job.jobs, "--ioengine=psync",
               "--group_reporting", "--output-format=json", "--output=" + out,
               "--runtime=%d" % cap, "--fallocate=none"]
        if job.writes:
            cmd.append("--directory=" + d)
            cmd += WRITE_EXTRA.get(system.name, [])
            if job.fsync == "N":
                cmd.append("--end_fsync=1")
            else:
                cmd.append("--fsync=" + job.fsync)
        else:
            cmd += ["--filename=" + os.path.join(system.root, "big/f%dM" % job.src),
                    "--readonly"]
        return cmd, cap

    def run(self, ctx, system):
        res = {}
        out = os.path.join(ctx.workdir, "fio-%s.json" % system.name)
        d = wpath(system, "fio")
        fresh_mount(ctx, system)
        try:
            for job in self.jobs(ctx):
                keys = ["%s.%s" % (job.key, f) for f, _, _ in job.fields]
                vals = {k: [] for k in keys}
                if (system.name, job.rw) in NOT_RUN:
                    res.update({k: na(NOT_RUN[(system.name, job.rw)]) for k in keys})
                    continue
                try:
                    for _ in range(ctx.runs(1)):
                        if job.writes:
                            rmtree(d)
                            mkdir(system, d)
                            # Every system starts with free memory: once earlier jobs
                            # filled the page cache, each new page costs a reclaim, and
                            # fio's 4 x 64 MiB took 0.35 s instead of 0.03 on the native
                            # disk as on a mount (the write phase measured the run's order).
                            # Pages only: the mount's dentries stay, as in a working shell.
                            drop_caches(pages_only=True)
                        else:
                            fresh_mount(ctx, system)
                        cmd, cap = self._cmd(ctx, system, job, d, out)
                        # the runtime cap bounds the I/O; closing/uploading is extra
                        with FsCpu(getattr(system, "pid", None)) as cpu:
                            run(cmd, ctx.timeout(cap + 300))
                        r = parse_fio(out, job.writes, job.jobs)
                        r["cpu_gb"] = cpu.per_gb(r.get("bytes"))
                        for f, _, _ in job.fields:
                            if r[f] is not None:
                                vals["%s.%s" % (job.key, f)].append(r[f])
                    res.update({k: summarize(v) for k, v in vals.items() if v})
                except (CmdError, ValueError, KeyError) as e:
                    log("%s: fio %s failed: %s" % (system.name, job.key, e))
                    if job.writes:
                        res.update(write_failed(system, e, keys))
                    else:
                        res.update({k: error(e) for k in keys})
                    if system.name != "native" and not is_mounted(system.mp):
                        fresh_mount(ctx, system)
            if not getattr(system, "store", None):
                res.update({k: na("the local disk has no store to ask") for k, _, _, _ in DURABLE})
            else:
                try:
                    res.update(durable_fsyncs(ctx, system, d))
                except (CmdError, OSError, RuntimeError) as e:
                    log("%s: durable fsync check failed: %s" % (system.name, e))
                    res.update({k: error(e) for k, _, _, _ in DURABLE})
        finally:
            rmtree(d)
            system.unmount()
        return res


def stored_tail(system, key, start, end):
    """Bytes start..end of `key` as another client reads them now (b"" if absent)."""
    from . import rawlink
    link = rawlink.bench_link() if system.store == "s3" else rawlink.bench_gcs_link()
    return link.get_bytes(key, start, end)


def durable_fsyncs(ctx, system, d):
    """The durability check of the module doc."""
    import time
    rmtree(d)
    mkdir(system, d)
    path = os.path.join(d, "appender.log")
    key = os.path.relpath(path, system.mp)
    total = (4 if ctx.quick else 16) << 20
    chunk, every = 16 << 10, 10
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    written, checks, durable, busy = 0, 0, 0, 0.0
    cpu = FsCpu(system.pid)
    cpu.__enter__()
    try:
        for i in range(total // chunk):
            data = os.urandom(chunk)
            t0 = time.monotonic()
            os.write(fd, data)
            written += chunk
            if (i + 1) % every:
                busy += time.monotonic() - t0
                continue
            os.fsync(fd)
            busy += time.monotonic() - t0
            checks += 1
            if stored_tail(system, key, written - chunk, written) == data:
                durable += 1
    finally:
        os.close(fd)
        cpu.__exit__(None, None, None)
    out = {"durable_fsync.pct": summarize([100.0 * durable / max(1, checks)]),
           "durable_fsync.bw": summarize([written / 1e6 / max(busy, 1e-9)])}
    # the file system's CPU over the loop (its reads of the store go around the mount)
    if cpu.per_gb(written) is not None:
        out["durable_fsync.cpu_gb"] = summarize([cpu.per_gb(written)])
    return out
