"""The experiments. Each one measures every metric on one system and returns
{metric key: record}, where a record is a summary of repeated runs
({runs, n, min, median, max}), {"na": reason} or {"error": message}.

1  mount time; `find` over 2,000 files in 100 directories, first and again
2  sequential reads of 1-200 MB (1 GB in full) via dd to /dev/null, first and again;
   the md5 of each checked by an untimed read after it; the 200 MB file also read once
   more after the page cache is dropped (from the system's own cache), with the file
   system process's CPU per GB of its cached reads; the largest file then fetched
   by a minimal parallel client through the system's own store's proxy (its link)
3  fio (see fiobench.py)
4  1,000 small files (50 in --quick): create+write 4,107 bytes+close, stat, delete
5  cp sweep, local -> mount and back, 4 MB doubling to 1 GB (4-64 MB in --quick)
6  developer workload: git clone of a local C repository, make, stat every file
7  memory: peak and steady RSS of the filesystem process during 2 and 6
8  copy tools, 1 GiB up and down, against the link's limit (see cptools.py)
9  the peers' own fio job files: mountpoint-s3's and gcsfuse's (see peerfio.py)
10 the million-key bucket: mount, ls -l, find, stat, RSS, requests (see keysexp.py)

A write that fails with EROFS ("Read-only file system", as on a read-only
bucketfs mount) is recorded as "n/a (read-only)" rather than an error.
"""

import contextlib
import os
import re
import shlex
import sys
import time

from .util import (CmdError, CpuMeter, FsCpu, MemSampler, cpu_per_gb, drop_caches, error, log,
                   na, wait_idle, pids_by_comm, run, summarize, timed)

RO = "n/a (read-only)"
MB = 1e6
GB = 1e9
# the file experiment 2 reads from the mount's own caches (issue 27's figures)
CACHED_MB = 200
# Seconds after a first read in which the file system process's CPU still counts (issue 47:
# a cold read that caches its bytes may keep working after the reader is done).
AFTER_S = 10


def fresh_mount(ctx, system):
    """Unmount, clear the system's caches and the page cache, mount again.
    Returns the mount time in seconds (0 for native)."""
    system.unmount()
    system.prepare_fresh()
    drop_caches()
    return system.mount()


def cpu_groups(fs_pid):
    """The process groups a read's CPU is split into: the file system (if it has a
    process), the latency proxy (toxiproxy's binary is `server`) and the store's server."""
    groups = {"proxy": pids_by_comm({"server"}),
              "server": pids_by_comm({"minio", "fake-gcs-server"})}
    if fs_pid:
        groups["fs"] = [fs_pid]
    return groups


def record_cpu(runs, suffix, res, nbytes, roles):
    """Append one measured block's CPU to `runs`: busy_SUFFIX (%% of all cores),
    cpu_SUFFIX (machine CPU s per GB moved) and cpu_ROLE_SUFFIX for the proxy, the server
    and each of `roles` (row name -> CpuMeter field)."""
    if not res:
        return
    per = GB / nbytes
    runs.setdefault("busy_" + suffix, []).append(100 * res["busy"])
    runs.setdefault("cpu_" + suffix, []).append(res["machine_s"] * per)
    for role, field in dict(roles, proxy="proxy", server="server").items():
        if field + "_s" in res:
            runs.setdefault("cpu_%s_%s" % (role, suffix), []).append(res[field + "_s"] * per)


def wpath(system, tag):
    """A scratch directory for writes, inside the mount."""
    return os.path.join(system.root, "w-%s-%s" % (system.name, tag))


def mkdir(system, path):
    run(["mkdir", "-p", path], 60)


def rmtree(path, timeout=600):
    try:
        run(["rm", "-rf", path], timeout)
    except CmdError as e:
        log("cleanup of %s failed: %s" % (path, e))


def run_in_dir(system, d, cmd, timeout, **kw):
    """run(cmd) that writes into the scratch directory `d`, made again if it has gone.
    mountpoint-s3's directories are its keys' prefixes: once the last file in `d` is
    deleted, `d` goes too (when its metadata expires, a second or so later), and a command
    creating a file in it fails at once with ENOENT. Then `d` is made again and the command
    repeated: that run is the one measured. Other systems never take that path."""
    if not os.path.isdir(d):
        mkdir(system, d)
    try:
        return run(cmd, timeout, **kw)
    except CmdError:
        if os.path.isdir(d):
            raise
    log("%s: %s had gone; made again" % (system.name, d))
    mkdir(system, d)
    return run(cmd, timeout, **kw)


def write_failed(system, exc, keys):
    """Records for all `keys` after a write failure: "n/a (read-only)" when
    the mount refused with EROFS, an error otherwise."""
    if "read-only file system" in str(exc).lower():
        return {k: dict(na(RO), detail=str(exc)[:300]) for k in keys}
    return {k: error(exc) for k in keys}


class Experiment:
    id = 0
    title = ""
    writes = False

    def metrics(self, ctx):
        """[{key, label, unit, better: 'lower'|'higher'}]"""
        raise NotImplementedError

    def charts(self, ctx):
        """[{title, keys, ylabel, log}] - which metrics each chart panel shows."""
        return []

    def run(self, ctx, system):
        raise NotImplementedError


def M(key, label, unit, better):
    return {"key": key, "label": label, "unit": unit, "better": better}


def cpu_metric(key, what):
    """The CPU row under a rate row: the file system process's CPU seconds per GB moved."""
    return M(key, "%s: file system CPU (s per GB)" % what, "s/GB", "lower")


def add_fs_cpu(runs, key, meter, nbytes):
    """Append the file system process's CPU per GB of one measured block (an FsCpu) to
    runs[key]; nothing when there is no process (native disk: the report shows "–")."""
    v = meter.per_gb(nbytes) if meter is not None else None
    if v is not None:
        runs.setdefault(key, []).append(v)


# ---------------------------------------------------------------- 1
class MountFind(Experiment):
    id = 1
    title = "Mount time and find over 2,000 files in 100 directories"

    def metrics(self, ctx):
        return [M("mount_s", "mount (s)", "s", "lower"),
                M("find_first_s", "find, first time (s)", "s", "lower"),
                M("find_again_s", "find, again (s)", "s", "lower")]

    def charts(self, ctx):
        return [{"title": "mount and find (s, log scale)",
                 "keys": ["mount_s", "find_first_s", "find_again_s"], "ylabel": "seconds",
                 "log": True}]

    def run(self, ctx, system):
        runs = {"mount_s": [], "find_first_s": [], "find_again_s": []}
        expected = 2000 + 100 + 1
        tree = os.path.join(system.root, "tree")
        for _ in range(ctx.runs(1)):
            runs["mount_s"].append(fresh_mount(ctx, system))
            for key in ("find_first_s", "find_again_s"):
                rc, out, err, dt = run(["find", tree], ctx.timeout(300))
                n = len(out.splitlines())
                if n != expected:
                    raise RuntimeError("find listed %d entries, expected %d" % (n, expected))
                runs[key].append(dt)
            system.unmount()
        res = {k: summarize(v) for k, v in runs.items()}
        if system.name == "native":
            res["mount_s"] = na("no mount")
        return res

    def notes(self, ctx, results):
        """The first find's floor on S3: the tree's keys listed by a minimal client
        (rawlink.py) through the same S3 proxy after the page cache is dropped, as MinIO
        is before each first find: one recursive listing, and a walk of delimited
        listings 8 at a time; best of 3 each, measured once after every system."""
        from .rawlink import bench_link
        link = bench_link()
        best = {}
        for name, f in (("one recursive listing", lambda: link.list_recursive("tree/")),
                        ("delimited walk, 8 at a time", lambda: link.list_walk("tree/", 8))):
            for _ in range(3):
                drop_caches()
                dt, n = f()
                if n != 2000:
                    return ["S3 listing reference failed: %d keys listed, expected 2000" % n]
                best[name] = min(best.get(name, dt), dt)
        floor = min(best.values())
        line = ("**S3 listing reference** (the floor for a first find on MinIO): the tree's "
                "2,000 keys listed through the same S3 proxy by a minimal client (Python "
                "http.client) after the page cache is dropped, best of 3: %s." % "; ".join(
                    "%s %.3f s" % kv for kv in best.items()))
        first = (results.get("bucketfs") or {}).get("find_first_s") or {}
        if "median" in first:
            line += " bucketfs's first find on S3 (median %.3f s) is %.2fx that floor." % (
                first["median"], first["median"] / floor)
        return [line]


# ---------------------------------------------------------------- 2
class Reads(Experiment):
    id = 2
    title = "Sequential reads: dd bs=1M of=/dev/null, first time and again; md5 checked each time"

    def metrics(self, ctx):
        ms = []
        for s in ctx.read_sizes:
            ms.append(M("first_%dM" % s, "%d MB first read (MB/s)" % s, "MB/s", "higher"))
            ms.append(cpu_metric("cpu_fs_first_%dM" % s, "%d MB first read" % s))
            ms.append(M("again_%dM" % s, "%d MB read again (MB/s)" % s, "MB/s", "higher"))
            ms.append(cpu_metric("cpu_fs_again_%dM" % s, "%d MB read again" % s))
        s = max(ctx.read_sizes)
        ms.append(M("link_%dM" % s, "%d MB parallel ranged download after it, same store (MB/s)"
                    % s, "MB/s", "higher"))
        ms.append(M("share_%dM" % s, "%d MB first read ÷ that download (%%)" % s, "%", "higher"))
        ms.append(M("busy_first_%dM" % s, "%d MB first read: machine CPU busy (%% of all cores)"
                    % s, "%", "higher"))
        ms.append(M("cpu_first_%dM" % s, "%d MB first read: machine CPU s per GB" % s, "s/GB",
                    "lower"))
        ms.append(M("cpu_fs_after_first_%dM" % s, "%d MB first read: the file system process's "
                    "CPU in the %d s after it (caching it on disk), s per GB" % (s, AFTER_S), "s/GB",
                    "lower"))
        ms.append(M("cpu_fs_total_first_%dM" % s, "%d MB first read: the file system process's "
                    "CPU during it and in the %d s after, s per GB" % (s, AFTER_S), "s/GB", "lower"))
        ms.append(M("busy_link_%dM" % s, "%d MB download after it: machine CPU busy (%% of all "
                    "cores)" % s, "%", "higher"))
        ms.append(M("cpu_link_%dM" % s, "%d MB download after it: machine CPU s per GB" % s,
                    "s/GB", "lower"))
        if CACHED_MB in ctx.read_sizes:
            c = CACHED_MB
            ms.append(M("dropped_%dM" % c, "%d MB read again after the page cache is dropped "
                        "(MB/s)" % c, "MB/s", "higher"))
            ms.append(cpu_metric("cpu_fs_dropped_%dM" % c, "%d MB read after the page cache "
                                 "is dropped" % c))
        ms.append(M("checksum_failures", "md5 mismatches (count)", "count", "lower"))
        return ms

    def charts(self, ctx):
        return [{"title": "first read (MB/s)", "ylabel": "MB/s", "log": False,
                 "keys": ["first_%dM" % s for s in ctx.read_sizes]},
                {"title": "read again (MB/s)", "ylabel": "MB/s", "log": False,
                 "keys": ["again_%dM" % s for s in ctx.read_sizes]}]

    def _read(self, ctx, path, size_mb, want_md5, meter=None, after=None):
        """MB/s of `dd bs=1M of=/dev/null` by dd's own timer (it starts after open), then
        the md5 of the file read once more, untimed. md5sum runs at about 400-500 MB/s
        on this machine's cores, so in the timed pipe it capped every system's rate; the
        second read is served by whatever the timed read left in the mount's caches.
        `meter` (a CpuMeter), if given, measures the dd alone; `after`, if given, the
        AFTER_S seconds right after it (what the read left running: caching it on disk)."""
        with meter or contextlib.nullcontext():
            rc, out, err, dt = run(["dd", "if=" + path, "bs=1M", "of=/dev/null"],
                                   ctx.timeout(60 + size_mb / 2), env={"LC_ALL": "C"})
        if after:
            with after:
                time.sleep(AFTER_S)
        m = re.search(r"copied, ([0-9.e+-]+) s", err)
        secs = float(m.group(1)) if m else dt
        out = run(["md5sum", path], ctx.timeout(60 + size_mb / 2))[1]
        got = out.split()[0] if out.split() else ""
        return (size_mb * (1 << 20) / MB) / max(secs, 1e-6), got == want_md5

    def run(self, ctx, system):
        runs = {}
        failures = 0
        with MemSampler(system.pid) as sampler:
            for _ in range(ctx.runs(1)):
                fresh_mount(ctx, system)
                for s in ctx.read_sizes:
                    rel = "big/f%dM" % s
                    # "dropped": the page cache dropped first, so the bytes come from the
                    # system's own caches (bucketfs's disk cache; native: the disk)
                    phases = ("first", "again") + (("dropped",) if s == CACHED_MB else ())
                    for phase in phases:
                        meter = None
                        if (phase == "first" and s == max(ctx.read_sizes)
                                or phase != "first" and s == CACHED_MB):
                            meter = CpuMeter(cpu_groups(system.pid()))
                        elif system.pid():
                            # every other read: the file system process's CPU alone
                            meter = CpuMeter({"fs": [system.pid()]})
                        if meter and phase != "first" and s == CACHED_MB and system.pid():
                            # a cached read's own cost: not the work still running from
                            # the first read (building the file passthrough serves)
                            if not wait_idle(system.pid()):
                                log("%s: still busy 20 s after the first read" % system.name)
                        if phase == "dropped":
                            drop_caches()
                        after = None
                        if phase == "first" and s == max(ctx.read_sizes) and system.pid():
                            after = CpuMeter({"fs": [system.pid()]})
                        mbps, ok = self._read(ctx, os.path.join(system.root, rel), s,
                                              ctx.manifest[rel], meter, after)
                        runs.setdefault("%s_%dM" % (phase, s), []).append(mbps)
                        if meter and meter.result and "proxy" in meter.groups:
                            record_cpu(runs, "%s_%dM" % (phase, s), meter.result, s << 20,
                                       {"fs": "fs", "reader": "children"})
                        elif meter and meter.result and "fs_s" in meter.result:
                            runs.setdefault("cpu_fs_%s_%dM" % (phase, s), []).append(
                                cpu_per_gb(meter.result["fs_s"], s << 20))
                        if after and after.result:
                            per = GB / (s << 20)
                            late = after.result["fs_s"] * per
                            runs.setdefault("cpu_fs_after_first_%dM" % s, []).append(late)
                            during = runs["cpu_fs_first_%dM" % s][-1]
                            runs.setdefault("cpu_fs_total_first_%dM" % s, []).append(during + late)
                        if not ok:
                            failures += 1
                            log("%s: md5 mismatch on %s (%s)" % (system.name, rel, phase))
                self._paired_link(ctx, system, runs)
            ctx.memory.setdefault(system.name, {})["2"] = sampler.result()
        system.unmount()
        res = {k: summarize(v) for k, v in runs.items()}
        res["checksum_failures"] = summarize([failures])
        return res

    def _paired_link(self, ctx, system, runs):
        """The largest file fetched by a minimal client as parallel ranged GETs (best of
        N = 16, 32) through the proxy of the system's own store, right after the
        system's reads of it, with the page cache dropped as before its first read; and
        the first read as a share of it. One run's machine for both: on these shared
        machines the link's rate drifts by 2x between runs minutes apart."""
        from .rawlink import bench_gcs_link, bench_link
        if system.store is None:
            return
        link = {"s3": bench_link, "gcs": bench_gcs_link}[system.store]()
        s = max(ctx.read_sizes)
        rel, size = "big/f%dM" % s, s << 20
        rate, cpu = 0.0, None
        try:
            for n in (16, 32):
                drop_caches()
                with CpuMeter(cpu_groups(None)) as meter:
                    r = size / MB / link.download(rel, size, n)
                if r > rate:
                    rate, cpu = r, meter.result
        except (RuntimeError, OSError, AssertionError) as e:
            log("%s: the paired link download failed: %s" % (system.name, e))
            return
        runs.setdefault("link_%dM" % s, []).append(rate)
        record_cpu(runs, "link_%dM" % s, cpu, size, {"client": "self"})
        runs.setdefault("share_%dM" % s, []).append(100 * runs["first_%dM" % s][-1] / rate)

    def notes(self, ctx, results):
        """The cold read's limit: a plain parallel ranged download of the largest object
        through the same S3 proxy (rawlink.py), best of N = 8, 16, 32, measured once after
        every system's reads; and bucketfs's first read as a share of it."""
        from .rawlink import bench_link
        s = max(ctx.read_sizes)
        rel, size = "big/f%dM" % s, s << 20
        link = bench_link()
        rates = {}
        for n in (8, 16, 32):
            drop_caches()
            rates[n] = size / MB / link.download(rel, size, n)
        best = max(rates, key=rates.get)
        line = ("**Parallel download reference** (the limit for a first read): %s fetched as N "
                "ranged GETs at once through the same S3 proxy by a minimal client (Python "
                "http.client, bytes dropped, no checksum): %s MB/s; best N = %d." % (
                    rel, ", ".join("N=%d %.1f" % (n, r) for n, r in rates.items()), best))
        first = (results.get("bucketfs") or {}).get("first_%dM" % s) or {}
        if "median" in first:
            line += " bucketfs's first read (median %.1f MB/s) is %.0f%% of it." % (
                first["median"], 100 * first["median"] / rates[best])
        shares = ["%s %.0f%% (runs %s)" % (name, r["share_%dM" % s]["median"], ", ".join(
                      "%.0f%%" % v for v in r["share_%dM" % s].get("runs", [])))
                  for name, r in results.items() if "median" in (r.get("share_%dM" % s) or {})]
        out = [line]
        if shares:
            out.append("**Paired with the link** (rows \"after it, same store\"): after each "
                       "run's reads, %s was fetched the same way through the proxy of the "
                       "system's own store (S3 or GCS), best of N = 16, 32, page cache dropped "
                       "first; each first read as a share of the download that followed it, "
                       "median: %s." % (rel, "; ".join(shares)))
        return out + self._cpu_notes(ctx, results)

    def _cpu_notes(self, ctx, results):
        """Where each system's first read of the largest file spent the machine's CPU, and
        where its paired download did: the cold read's rate is bounded by the cores over
        that cost once the machine is busy."""
        s = max(ctx.read_sizes)
        cores = os.cpu_count() or 1

        def med(r, key):
            rec = r.get(key) or {}
            return rec.get("median")

        def split(r, suffix, roles):
            total = med(r, "cpu_" + suffix)
            parts = [(role, med(r, "cpu_%s_%s" % (role, suffix))) for role in roles]
            parts = [(k, v) for k, v in parts if v is not None]
            other = total - sum(v for _, v in parts)
            return "%.2f (%s, other %.2f; busy %.0f%%, bound %.0f MB/s)" % (
                total, ", ".join("%s %.2f" % kv for kv in parts), max(0.0, other),
                med(r, "busy_" + suffix) or 0, cores / total * 1000)

        rows = []
        for name, r in results.items():
            if med(r, "cpu_first_%dM" % s) is None:
                continue
            row = "%s: first read %s" % (name, split(r, "first_%dM" % s,
                                                     ("fs", "reader", "proxy", "server")))
            if med(r, "cpu_link_%dM" % s) is not None:
                row += "; the download after it %s" % split(r, "link_%dM" % s,
                                                            ("client", "proxy", "server"))
            rows.append(row)
        if not rows:
            return []
        return ["**Where the CPU went** (medians, machine CPU seconds per GB of the %d MB file, "
                "split by process: fs = the file system's process, reader = dd, client = the "
                "download's in-process client, proxy = toxiproxy, server = MinIO or the GCS "
                "emulator, other = the kernel's threads and the rest; bound = %d cores ÷ that "
                "cost, the most the rate can be once every core is busy): %s." % (
                    s, cores, "; ".join(rows))]


# ---------------------------------------------------------------- 4
SMALL_SIZE = 4107


class SmallFiles(Experiment):
    id = 4
    title = "Small files: create+write 4,107 bytes+close, then stat, then delete"
    writes = True

    def metrics(self, ctx):
        n = ctx.small_files
        return [M("create_s", "create %d files (s)" % n, "s", "lower"),
                M("stat_s", "stat %d files (s)" % n, "s", "lower"),
                M("delete_s", "delete %d files (s)" % n, "s", "lower")]

    def charts(self, ctx):
        return [{"title": "%d small files (s, log scale)" % ctx.small_files,
                 "keys": ["create_s", "stat_s", "delete_s"], "ylabel": "seconds", "log": True}]

    def run(self, ctx, system):
        helper = os.path.join(os.path.dirname(__file__), "smallfiles.py")
        runs = {"create_s": [], "stat_s": [], "delete_s": []}
        fresh_mount(ctx, system)
        d = wpath(system, "small")
        try:
            for _ in range(ctx.runs(1)):
                try:
                    mkdir(system, d)
                    for phase in ("create", "stat", "delete"):
                        cmd = [sys.executable, helper, phase, d, str(ctx.small_files),
                               str(SMALL_SIZE)]
                        tmo = ctx.timeout(60 + 3 * ctx.small_files)
                        rc, out, err, dt = (run_in_dir(system, d, cmd, tmo) if phase == "create"
                                            else run(cmd, tmo))
                        runs[phase + "_s"].append(float(out.strip().split()[-1]))
                except CmdError as e:
                    return write_failed(system, e, runs.keys())
        finally:
            rmtree(d)
            system.unmount()
        return {k: summarize(v) for k, v in runs.items()}


# ---------------------------------------------------------------- 5
class CopySweep(Experiment):
    id = 5
    title = "cp sweep: local disk -> mount and back, ascending then descending sizes"
    writes = True

    def metrics(self, ctx):
        ms = []
        for s in ctx.copy_sizes:
            ms.append(M("to_%dM" % s, "cp %d MB local -> mount (MB/s)" % s, "MB/s", "higher"))
            ms.append(cpu_metric("cpu_fs_to_%dM" % s, "cp %d MB local -> mount" % s))
        for s in ctx.copy_sizes:
            ms.append(M("from_%dM" % s, "cp %d MB mount -> local (MB/s)" % s, "MB/s", "higher"))
            ms.append(cpu_metric("cpu_fs_from_%dM" % s, "cp %d MB mount -> local" % s))
        ms.append(M("checksum_failures", "md5 mismatches after round trip", "count", "lower"))
        return ms

    def charts(self, ctx):
        return [{"title": "cp local -> mount (MB/s)", "ylabel": "MB/s", "log": False,
                 "keys": ["to_%dM" % s for s in ctx.copy_sizes]},
                {"title": "cp mount -> local (MB/s)", "ylabel": "MB/s", "log": False,
                 "keys": ["from_%dM" % s for s in ctx.copy_sizes]}]

    def run(self, ctx, system):
        runs = {}
        failures = 0
        fresh_mount(ctx, system)
        d = wpath(system, "copy")
        back = os.path.join(ctx.workdir, "copy-back")
        os.makedirs(back, exist_ok=True)
        order = list(ctx.copy_sizes) + list(reversed(ctx.copy_sizes))
        try:
            try:
                mkdir(system, d)
            except CmdError as e:
                return write_failed(system, e, [m["key"] for m in self.metrics(ctx)])
            for _ in range(ctx.runs(1)):
                for s in order:
                    src = ctx.copy_source(s)
                    dst = os.path.join(d, "c%dM" % s)
                    tmo = ctx.timeout(60 + s)
                    # Each system copies with free memory and the source in the page
                    # cache: the writing side decides the speed, not what the run's
                    # earlier copies left in memory (see fiobench.py's drop_caches).
                    drop_caches(pages_only=True)
                    read_through(src)
                    try:
                        with FsCpu(system.pid) as cpu:
                            dt = run_in_dir(system, d, ["cp", src, dst], tmo)[3]
                    except CmdError as e:
                        return write_failed(system, e, [m["key"] for m in self.metrics(ctx)])
                    runs.setdefault("to_%dM" % s, []).append(s * (1 << 20) / MB / dt)
                    add_fs_cpu(runs, "cpu_fs_to_%dM" % s, cpu, s << 20)
                    local = os.path.join(back, "c%dM" % s)
                    with FsCpu(system.pid) as cpu:
                        dt = timed(["cp", dst, local], tmo)
                    runs.setdefault("from_%dM" % s, []).append(s * (1 << 20) / MB / dt)
                    add_fs_cpu(runs, "cpu_fs_from_%dM" % s, cpu, s << 20)
                    got = run(["md5sum", local], tmo)[1].split()[0]
                    if got != ctx.copy_md5[s]:
                        failures += 1
                    os.unlink(local)
                    run(["rm", "-f", dst], tmo)
        finally:
            rmtree(d)
            system.unmount()
        res = {k: summarize(v) for k, v in runs.items()}
        res["checksum_failures"] = summarize([failures])
        return res


def read_through(path):
    """Read a local file once, into the page cache."""
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass


# ---------------------------------------------------------------- 6
class DevWorkload(Experiment):
    id = 6
    writes = True

    @property
    def title(self):
        return "Developer workload: git clone a C project into the mount, make, stat every file"

    def metrics(self, ctx):
        return [M("clone_s", "git clone (s)", "s", "lower"),
                M("make_s", "make -j2 %s (s)" % ctx.dev_project, "s", "lower"),
                M("stat_s", "stat every file (s)", "s", "lower"),
                M("total_s", "total (s)", "s", "lower"),
                M("clone_self_s", "git clone of bucketfs's own repository (s)", "s", "lower")]

    def charts(self, ctx):
        return [{"title": "developer workload: %s (s)" % ctx.dev_project,
                 "keys": ["clone_s", "make_s", "stat_s", "total_s"], "ylabel": "seconds",
                 "log": True}]

    def run(self, ctx, system):
        repo = ctx.dev_repo()
        runs = {"clone_s": [], "make_s": [], "stat_s": [], "total_s": [], "clone_self_s": []}
        failures = {}
        d = wpath(system, "dev")
        # This repository at HEAD (a few hundred tracked files: the issue's "git clone of
        # this repository"), cloned beside the C project.
        self_repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        done = False
        with MemSampler(system.pid) as sampler:
            fresh_mount(ctx, system)
            try:
                for _ in range(ctx.runs(1)):
                    rmtree(d)
                    try:
                        mkdir(system, d)
                        dest = os.path.join(d, "src")
                        # file:// makes git use its pack protocol, as a remote clone does
                        t_clone = timed(["git", "clone", "-q", "file://" + repo, dest],
                                        ctx.timeout(600))
                    except CmdError as e:
                        return write_failed(system, e, runs.keys())
                    # A failed step fails its own figures only: a peer whose `make` breaks
                    # (rclone's symlinks) still has its clone times measured.
                    try:
                        t_make = timed(["make", "-j2"] + ctx.dev_make_targets,
                                       ctx.timeout(900), cwd=dest)
                        rc, out, err, t_stat = run(
                            "find %s -printf '%%s\\n' | wc -l" % shlex.quote(dest),
                            ctx.timeout(300), shell=True)
                        log("%s: dev workload stat saw %s entries" % (system.name, out.strip()))
                        for k, v in (("make_s", t_make), ("stat_s", t_stat),
                                     ("total_s", t_clone + t_make + t_stat)):
                            runs[k].append(v)
                    except CmdError as e:
                        for k in ("make_s", "stat_s", "total_s"):
                            failures.setdefault(k, e)
                    try:
                        runs["clone_self_s"].append(timed(
                            ["git", "clone", "-q", "file://" + self_repo,
                             os.path.join(d, "bucketfs")], ctx.timeout(600)))
                    except CmdError as e:
                        failures.setdefault("clone_self_s", e)
                    runs["clone_s"].append(t_clone)
                done = True
            finally:
                rmtree(d)
                if done:  # memory of a workload that did not run means nothing
                    ctx.memory.setdefault(system.name, {})["6"] = sampler.result()
                system.unmount()
        return {k: error(failures[k]) if k in failures else summarize(v)
                for k, v in runs.items()}


# ---------------------------------------------------------------- 7
class Memory(Experiment):
    id = 7
    counts_requests = False  # mounts nothing: its numbers come from 2 and 6
    title = "Memory: RSS of the filesystem process during experiments 2 and 6"

    def metrics(self, ctx):
        return [M("peak_2", "peak RSS during reads, exp 2 (MiB)", "MiB", "lower"),
                M("steady_2", "median RSS during reads, exp 2 (MiB)", "MiB", "lower"),
                M("peak_6", "peak RSS during dev workload, exp 6 (MiB)", "MiB", "lower"),
                M("steady_6", "median RSS during dev workload, exp 6 (MiB)", "MiB", "lower")]

    def charts(self, ctx):
        return [{"title": "RSS (MiB)", "ylabel": "MiB", "log": False,
                 "keys": ["peak_2", "steady_2", "peak_6", "steady_6"]}]

    def run(self, ctx, system):
        if system.name == "native":
            return {m["key"]: na("no filesystem process") for m in self.metrics(ctx)}
        res = {}
        mem = ctx.memory.get(system.name, {})
        only = getattr(system, "only", None)
        for exp in ("2", "6"):
            r = mem.get(exp)
            if exp not in mem:
                why = (na("experiment %s not run" % exp) if int(exp) not in ctx.experiment_ids
                       else na("%s does not run experiment %s" % (system.name, exp))
                       if only and exp not in only
                       else na("experiment %s failed for this system" % exp))
                res["peak_" + exp] = res["steady_" + exp] = why
            elif r is None:
                res["peak_" + exp] = res["steady_" + exp] = na("no process sampled")
            else:
                res["peak_" + exp] = summarize([r["peak_mb"]])
                res["steady_" + exp] = summarize([r["steady_mb"]])
        return res


def all_experiments():
    from .cptools import CopyTools
    from .fiobench import Fio
    from .keysexp import ManyKeys
    from .peerfio import PeerFio
    return {e.id: e for e in (MountFind(), Reads(), Fio(), SmallFiles(), CopySweep(),
                              DevWorkload(), Memory(), CopyTools(), PeerFio(), ManyKeys())}
