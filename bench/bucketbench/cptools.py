"""Experiment 8: copy tools. A 1 GiB upload (local file -> object) and download
(object -> local file) with `bucketfs cp`, `rclone copyto` (the engine of
`rclone copy`, naming the destination file) and `aws s3 cp` (Debian's awscli),
all against MinIO through the same toxiproxy proxy as the mounts, plus the
link's limit measured in the same run, and the floor of a download to a file:
the link's client writing what it receives into the file (see rawlink.py).

Unlike experiments 1-7 this one does not use the mounted systems: it runs once
and its columns are the tools. Every tool runs with its defaults. Each run
goes through the tools in a rotated order, so no tool always goes first.

Checks: every upload is read back from MinIO directly (not through the proxy)
and its MD5 compared with the source's; every download is md5sum'ed. A
mismatch makes that run a failure. Rates are bytes / wall time of the
command (process start to exit), in MB/s (10^6 bytes).
"""

import hashlib
import os
import statistics

from . import servers as S
from .install import go_binary
from .rawlink import bench_link
from .systems import S3_ENV, snapshot_binary
from .util import CmdError, CpuMeter, cpu_per_gb, error, log, run, summarize

AWS = "/usr/bin/aws"  # Debian's awscli, not any other `aws` on PATH
SIZE_MB = 1024  # MiB, from ctx.copy_source
PREFIX = "cp8"
SEED_KEY = PREFIX + "/seed"
LINK_WAYS = (4, 8, 16, 32)

BUCKETFS, RCLONE, AWSCLI, LINK = "bucketfs cp", "rclone copy", "aws s3 cp", "link limit"
LINK_FILE = "link to file"
COLUMNS = [BUCKETFS, RCLONE, AWSCLI, LINK, LINK_FILE]


def M(key, label, unit, better):
    return {"key": key, "label": label, "unit": unit, "better": better}


class CopyTools:
    id = 8
    title = "cp tools: 1 GiB upload and download, bucketfs cp vs rclone vs aws s3 cp"
    standalone = True  # runs once; columns are tools, not mounted systems
    reference = (LINK, LINK_FILE)  # limits, not peers: a ratio column against each

    def metrics(self, ctx):
        return [M("up_MBps", "upload 1 GiB (MB/s)", "MB/s", "higher"),
                M("down_MBps", "download 1 GiB (MB/s)", "MB/s", "higher"),
                M("up_cpu_s", "upload: CPU seconds (user+sys) of the tool", "s", "lower"),
                M("down_cpu_s", "download: CPU seconds (user+sys) of the tool", "s", "lower"),
                M("up_cpu_gb", "upload: the tool's CPU (s per GB)", "s/GB", "lower"),
                M("down_cpu_gb", "download: the tool's CPU (s per GB)", "s/GB", "lower"),
                M("up_busy", "upload: machine CPU busy (% of all cores)", "%", "higher"),
                M("down_busy", "download: machine CPU busy (% of all cores)", "%", "higher"),
                M("checksum_failures", "MD5 mismatches", "count", "lower")]

    def charts(self, ctx):
        return [{"title": "1 GiB through the proxy (MB/s)", "ylabel": "MB/s", "log": False,
                 "keys": ["up_MBps", "down_MBps"]}]

    def describe(self, ctx):
        return describe(ctx)

    # ---- setup -------------------------------------------------------
    def _tools(self, ctx):
        """{column: (version or None, why unavailable or None)}."""
        out = {}
        built = getattr(ctx, "bucketfs_bin", None) or os.path.join(
            ctx.repo, "target", "release", "bucketfs")
        self.bfs = os.path.join(ctx.workdir, "bin", "bucketfs")
        if os.access(built, os.X_OK):
            snap = snapshot_binary(built, self.bfs)
            v = run([self.bfs, "--version"], 10, check=False)[1].strip()
            out[BUCKETFS] = ("%s (sha256 %s)" % (v, snap["sha256"][:12]), None)
        else:
            out[BUCKETFS] = (None, "bucketfs not built")
        rc = go_binary("rclone")
        out[RCLONE] = ((S.go_module_version("rclone"), None) if rc
                       else (None, "rclone not installed"))
        if os.access(AWS, os.X_OK):
            r = run([AWS, "--version"], 60, check=False, env=self._aws_env(ctx))
            out[AWSCLI] = ((r[1] or r[2]).strip(), None)
        else:
            out[AWSCLI] = (None, "%s missing (apt-get install awscli)" % AWS)
        out[LINK] = ("Python http.client, N-way parallel, N the best of %s" %
                     "/".join(map(str, LINK_WAYS)), None)
        out[LINK_FILE] = ("the link's client and download N, writing the file in place "
                          "(O_DIRECT, blocks allocated first)", None)
        return out

    def _aws_env(self, ctx):
        env = dict(S3_ENV)
        # no user config or credentials file may change what is measured
        env["AWS_CONFIG_FILE"] = os.path.join(ctx.workdir, "aws-config-none")
        env["AWS_SHARED_CREDENTIALS_FILE"] = env["AWS_CONFIG_FILE"]
        env["AWS_PAGER"] = ""
        return env

    def _rclone_conf(self, ctx):
        conf = os.path.join(ctx.workdir, "rclone-cp.conf")
        with open(conf, "w") as f:
            f.write("[minio]\ntype = s3\nprovider = Minio\naccess_key_id = %s\n"
                    "secret_access_key = %s\nendpoint = %s\nregion = %s\n"
                    % (S.ACCESS_KEY, S.SECRET_KEY, S.S3_ENDPOINT, S.REGION))
        return conf

    def _commands(self, ctx, src, dst_file, key):
        """{column: (upload argv, download argv, env)}."""
        conf = self._rclone_conf(ctx)
        url = "s3://%s/%s" % (S.BUCKET, key)
        return {
            BUCKETFS: ([self.bfs, "cp", "-q", src, url, "--endpoint", S.S3_ENDPOINT],
                       [self.bfs, "cp", "-q", "s3://%s/%s" % (S.BUCKET, SEED_KEY), dst_file,
                        "--endpoint", S.S3_ENDPOINT], S3_ENV),
            RCLONE: ([go_binary("rclone") or "rclone", "copyto", src,
                      "minio:%s/%s" % (S.BUCKET, key), "--config", conf],
                     [go_binary("rclone") or "rclone", "copyto",
                      "minio:%s/%s" % (S.BUCKET, SEED_KEY), dst_file, "--config", conf], None),
            AWSCLI: ([AWS, "s3", "cp", "--only-show-errors", src, url,
                      "--endpoint-url", S.S3_ENDPOINT],
                     [AWS, "s3", "cp", "--only-show-errors",
                      "s3://%s/%s" % (S.BUCKET, SEED_KEY), dst_file,
                      "--endpoint-url", S.S3_ENDPOINT], self._aws_env(ctx)),
        }

    # ---- checks --------------------------------------------------------
    def _object_md5(self, s3, key):
        h = hashlib.md5()
        body = s3.get_object(Bucket=S.BUCKET, Key=key)["Body"]
        for chunk in iter(lambda: body.read(1 << 20), b""):
            h.update(chunk)
        return h.hexdigest()

    def _timed(self, cmd, timeout, env):
        """(wall seconds, CPU seconds user+sys of the command and its children, the
        machine's busy %% of all cores meanwhile)."""
        with CpuMeter() as m:
            dt = run(cmd, timeout, env=env)[3]
        return dt, m.result["children_s"], 100 * m.result["busy"]

    def _file_md5(self, path):
        return run(["md5sum", path], 300)[1].split()[0]

    # ---- the run -------------------------------------------------------
    def run_all(self, ctx, servers):
        """{column: {metric: record}} and {column: version}."""
        tools = self._tools(ctx)
        versions = {c: v for c, (v, _) in tools.items()}
        src = ctx.copy_source(SIZE_MB)
        want = ctx.copy_md5[SIZE_MB]
        size = os.path.getsize(src)
        s3 = servers.s3()  # straight to MinIO, not through the proxy
        log("exp 8: seeding %s (%d bytes) directly into MinIO" % (SEED_KEY, size))
        s3.upload_file(src, S.BUCKET, SEED_KEY)
        dst_file = os.path.join(ctx.workdir, "cp8-download")
        link = bench_link()
        rates = {c: {"up_MBps": [], "down_MBps": [], "up_cpu_s": [], "down_cpu_s": [],
                     "up_busy": [], "down_busy": []} for c in COLUMNS}
        failures = {c: 0 for c in COLUMNS}
        errors = {c: None for c in COLUMNS}
        ways = self._calibrate(link, src, size)
        tool_cols = [c for c in (BUCKETFS, RCLONE, AWSCLI) if tools[c][1] is None]
        self.requests = {}
        counter = _ToolRequests(servers)
        for i in range(ctx.runs(1)):
            order = tool_cols[i % len(tool_cols):] + tool_cols[:i % len(tool_cols)]
            for col in order:
                key = "%s/up-%s-%d" % (PREFIX, col.split()[0], i)
                up, down, env = self._commands(ctx, src, dst_file, key)[col]
                count = counter if i == 0 else None  # the first run only: settling takes ~10 s
                try:
                    with _counted(count, col, "up"):
                        dt, cpu_up, busy_up = self._timed(up, ctx.timeout(900), env)
                    got = self._object_md5(s3, key)
                    s3.delete_object(Bucket=S.BUCKET, Key=key)
                    if got != want:
                        failures[col] += 1
                        raise RuntimeError("upload MD5 %s, source %s" % (got, want))
                    rates[col]["up_MBps"].append(size / 1e6 / dt)
                    rates[col]["up_cpu_s"].append(cpu_up)
                    rates[col]["up_busy"].append(busy_up)
                    if os.path.exists(dst_file):
                        os.unlink(dst_file)
                    with _counted(count, col, "down"):
                        dt, cpu_down, busy_down = self._timed(down, ctx.timeout(900), env)
                    got = self._file_md5(dst_file)
                    os.unlink(dst_file)
                    if got != want:
                        failures[col] += 1
                        raise RuntimeError("download MD5 %s, object %s" % (got, want))
                    rates[col]["down_MBps"].append(size / 1e6 / dt)
                    rates[col]["down_cpu_s"].append(cpu_down)
                    rates[col]["down_busy"].append(busy_down)
                    log("exp 8 run %d %s: up %.0f, down %.0f MB/s; CPU up %.1f s, down %.1f s" % (
                        i, col, rates[col]["up_MBps"][-1], rates[col]["down_MBps"][-1],
                        cpu_up, cpu_down))
                except (CmdError, RuntimeError, OSError) as e:
                    log("exp 8 %s failed: %s" % (col, e))
                    errors[col] = str(e)
                    continue
                if col == BUCKETFS:
                    # the link right after bucketfs cp: the pair sees the same machine
                    try:
                        self._link_pair(link, src, size, i, ways, rates[LINK])
                    except (RuntimeError, OSError, AssertionError) as e:
                        log("exp 8 link failed: %s" % e)
                        errors[LINK] = str(e)
                    try:
                        self._link_to_file(link, size, dst_file, want, i, ways, rates[LINK_FILE],
                                           failures)
                    except (RuntimeError, OSError, AssertionError) as e:
                        log("exp 8 link to file failed: %s" % e)
                        errors[LINK_FILE] = str(e)
        s3.delete_object(Bucket=S.BUCKET, Key=SEED_KEY)
        self.requests = counter.records()
        results = {}
        for col in COLUMNS:
            for way in ("up", "down"):  # the rate rows' CPU per GB moved
                rates[col][way + "_cpu_gb"] = [cpu_per_gb(c, size)
                                               for c in rates[col][way + "_cpu_s"]]
            why = tools[col][1]
            res = {}
            for k, runs in rates[col].items():
                res[k] = (summarize(runs) if runs else
                          {"na": "a download only"} if col == LINK_FILE and k.startswith("up_")
                          else error(why or errors[col] or "no successful run"))
            res["checksum_failures"] = (summarize([failures[col]]) if col != LINK
                                        else {"na": "not checked"})
            results[col] = res
        notes = [self._calibration_note(ways), _paired_note(rates[BUCKETFS], rates[LINK]),
                 _paired_note(rates[BUCKETFS], rates[LINK_FILE], ("down",), LINK_FILE)]
        return results, versions, [n for n in notes if n]

    # ---- the link --------------------------------------------------------
    def _calibrate(self, link, src, size):
        """Try every N once each way before the runs: {way: (best N, {N: MB/s})}. The
        runs then measure the link at that N only, once each, paired with bucketfs cp
        (the best of four tries in every run would pick each run's luckiest moment on
        machines whose rate moves by 2x within minutes)."""
        tried = {"up": {}, "down": {}}
        for n in LINK_WAYS:
            try:
                tried["up"][n] = size / 1e6 / link.upload(src, "%s/cal-%d" % (PREFIX, n), n)
                tried["down"][n] = size / 1e6 / link.download(SEED_KEY, size, n)
            except (RuntimeError, OSError, AssertionError) as e:
                log("exp 8 link calibration N=%d failed: %s" % (n, e))
                continue
            log("exp 8 link calibration N=%d: up %.0f, down %.0f MB/s" % (
                n, tried["up"][n], tried["down"][n]))
        return {way: (max(t, key=t.get) if t else LINK_WAYS[-1], t) for way, t in tried.items()}

    def _link_pair(self, link, src, size, i, ways, into):
        """One upload and one download at the calibrated N, with the client's CPU (this
        process's threads) and the machine's busy share, appended to `into`."""
        with CpuMeter() as mu:
            r_up = size / 1e6 / link.upload(src, "%s/link-%d" % (PREFIX, i), ways["up"][0])
        with CpuMeter() as md:
            r_down = size / 1e6 / link.download(SEED_KEY, size, ways["down"][0])
        log("exp 8 run %d link: up %.0f, down %.0f MB/s" % (i, r_up, r_down))
        for way, r, m in (("up", r_up, mu), ("down", r_down, md)):
            into[way + "_MBps"].append(r)
            into[way + "_cpu_s"].append(m.result["self_s"])
            into[way + "_busy"].append(100 * m.result["busy"])

    def _link_to_file(self, link, size, dst_file, want, i, ways, into, failures):
        """The link's download at its N again, into `dst_file` (then md5sum'ed): the
        floor of a download that lands on this machine's disk."""
        with CpuMeter() as m:
            r = size / 1e6 / link.download_to_file(SEED_KEY, size, ways["down"][0], dst_file)
        got = self._file_md5(dst_file)
        os.unlink(dst_file)
        if got != want:
            failures[LINK_FILE] += 1
            raise RuntimeError("link to file: MD5 %s, object %s" % (got, want))
        log("exp 8 run %d link to file: down %.0f MB/s" % (i, r))
        into["down_MBps"].append(r)
        into["down_cpu_s"].append(m.result["self_s"])
        into["down_busy"].append(100 * m.result["busy"])

    @staticmethod
    def _calibration_note(ways):
        def one(way):
            n, t = ways[way]
            return "%s N=%d (%s)" % (way + "load", n, ", ".join(
                "%d: %.0f" % (k, v) for k, v in sorted(t.items())))
        return "The link's N, from one try of each before the runs (MB/s): %s; %s." % (
            one("up"), one("down"))


class _ToolRequests:
    """MinIO's requests of each tool's upload and download in the first run (requests.py):
    one settled snapshot before and after each command, so the harness's MD5 check and
    delete between the commands are not counted."""

    def __init__(self, servers):
        self.minio = servers.request_counter()
        self.apis = {}  # column -> {api: n}, upload and download together
        self.failed = None

    def snapshot(self):
        try:
            return None if self.failed else self.minio.settle()[0]
        except (OSError, RuntimeError) as e:
            self.failed = str(e)
            return None

    def add(self, col, before):
        from . import requests as R
        after = self.snapshot()
        if before is None or after is None:
            return
        got = R.diff(after, before)
        got[R.MARKER_API] = got.get(R.MARKER_API, 0) - 1  # the second snapshot's marker
        acc = self.apis.setdefault(col, {})
        for api, n in got.items():
            acc[api] = acc.get(api, 0) + n

    def records(self):
        """{column: record as requests.cell_record makes it}, or {} if counting failed."""
        from . import requests as R
        if self.failed:
            log("exp 8 request counters: %s" % self.failed)
            return {}
        return {col: R.cell_record(apis, 0, 1) for col, apis in self.apis.items()}


class _counted:
    """`with _counted(counter or None, column):` adds the block's requests to the column
    (only when the block succeeds)."""

    def __init__(self, counter, col, way):
        self.counter, self.col = counter, col

    def __enter__(self):
        self.before = self.counter.snapshot() if self.counter else None
        return self

    def __exit__(self, *exc):
        if self.counter and exc[0] is None:
            self.counter.add(self.col, self.before)
        return False


def _paired_note(bfs, link, ways=("up", "down"), what="the link"):
    """bucketfs cp ÷ `what` measured right after it, run by run."""
    parts = []
    for way in ways:
        a, b = bfs[way + "_MBps"], link[way + "_MBps"]
        if len(a) != len(b) or not a:
            return None  # a failed run broke the pairing; the medians still stand
        ratios = [x / y for x, y in zip(a, b)]
        parts.append("%sload %s, median %.0f%%" % (
            way, ", ".join("%.0f%%" % (100 * r) for r in ratios), 100 * statistics.median(ratios)))
    return "bucketfs cp ÷ %s measured right after it, run by run: %s." % (what, "; ".join(parts))


def describe(ctx):
    """Lines for REPORT.md under experiment 8's title."""
    return [
        "Each tool with its defaults; bucketfs cp: `bucketfs cp SRC s3://bench/KEY "
        "--endpoint PROXY` and back; rclone: `rclone copyto` (what `rclone copy` does for one "
        "file); aws: `aws s3 cp` from Debian's awscli. All through the toxiproxy S3 proxy "
        "(the profile's latency applies). Rate = 1,073,741,824 bytes / wall time of the "
        "command. Uploads are read back from MinIO directly and MD5-compared; downloads are "
        "md5sum'ed. The download source is one object uploaded with boto3 (8 MiB parts). "
        "CPU seconds are the tool process's user+sys time (getrusage of children), the "
        "machine being shared, a tool that needs more CPU also waits longer for it; the "
        "link's are its client's threads (getrusage of the harness, which does nothing else "
        "meanwhile). Busy is the machine's busy share of all cores meanwhile (/proc/stat): "
        "near 100%, the proxy, MinIO and the tool are sharing every core, and a tool that "
        "spends less CPU per byte leaves more of the machine to moving bytes.",
        "**Link limit**: a minimal client (Python http.client, SigV4, no checksums, bytes "
        "dropped on arrival) moving the same 1 GiB through the same proxy: download = N "
        "ranged GETs of the object at once, one connection each; upload = N plain PUTs of "
        "1/N of the file at once (no multipart bookkeeping). Before the runs every N in %s "
        "is tried once each way and the best N kept; in every run the link is then measured "
        "once each way at that N right after bucketfs cp, so each pair sees the same "
        "machine. Ratios `÷ link limit` are bucketfs cp's median over the link's median; the "
        "notes also give the ratio run by run." % ", ".join(map(str, LINK_WAYS)),
        "**Link to file**: the same client and download N, but each range is read into "
        "page-aligned 1 MiB buffers and written in place with O_DIRECT into a file whose "
        "blocks were allocated first (no hashing), then md5sum'ed; measured right after the "
        "link in every run. It is the floor of a download that lands on this disk, which here "
        "is the same virtual disk MinIO reads from.",
    ]
