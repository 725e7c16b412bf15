"""Orchestration: parse the flags, install, build bucketfs, start the servers,
seed, run every selected experiment on every selected system, always clean
up, and write the JSON results and the report.

Experiments are the outer loop and systems the inner one, so the numbers of
one experiment are taken close together in time. Results are written to the
JSON file after every (experiment, system) pair, so an interrupted run keeps
what it measured.
"""

import argparse
import datetime
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

from . import install, report, util
from . import servers as S
from .experiments import all_experiments
from .systems import ALL_SYSTEMS, DEFAULT_SYSTEMS, MountError, make_system
from .util import CmdError, error, log, run

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(BENCH_DIR)


class Context:
    """Settings and shared state handed to every experiment."""

    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.profile = args.profile
        self.workdir = os.path.abspath(args.workdir)
        self.seed_dir = os.path.join(self.workdir, "seed")
        self.repo = REPO
        self.full_runs = args.runs
        self.read_sizes = [1, 10, 50, 100, 200] + ([] if args.quick else [1024])
        self.copy_sizes = ([4, 8, 16, 32, 64] if args.quick else
                           [4 << i for i in range(9)])  # 4 MB .. 1 GB
        self.small_files = 50 if args.quick else 1000
        self.dev_project = "bzip2" if args.quick else "lz4"
        # build only: running what was built needs exec permission, which not
        # every peer gives by default
        self.dev_make_targets = (["libbz2.a", "bzip2", "bzip2recover"] if args.quick else [])
        self.timeout_scale = 1.0
        if args.bandwidth:
            self.timeout_scale = max(1.0, 100.0 / args.bandwidth)
        self.memory = {}
        self.manifest = {}
        self.copy_md5 = {}
        self.experiment_ids = []

    def runs(self, quick_n):
        return quick_n if self.quick else self.full_runs

    def timeout(self, seconds):
        return seconds * self.timeout_scale

    def copy_source(self, size_mb):
        d = os.path.join(self.workdir, "copy-src")
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "c%dM" % size_mb)
        if size_mb not in self.copy_md5 or not os.path.exists(p):
            rng = random.Random(size_mb * 31)
            h = hashlib.md5()
            with open(p, "wb") as f:
                for _ in range(size_mb):
                    b = rng.randbytes(1 << 20)
                    f.write(b)
                    h.update(b)
            self.copy_md5[size_mb] = h.hexdigest()
        return p

    def dev_repo(self):
        """A local git repository holding the C project; returns its path."""
        repo = os.path.join(self.workdir, "devrepo-" + self.dev_project)
        if os.path.isdir(os.path.join(repo, ".git")):
            return repo
        src = install.ensure_c_source(self.dev_project,
                                      os.path.join(self.workdir, "csrc-" + self.dev_project))
        shutil.rmtree(repo, ignore_errors=True)
        keep = install.C_KEEP.get(self.dev_project)
        shutil.copytree(src, repo, ignore=(lambda d, names: [n for n in names if n not in keep])
                        if keep else None)
        g = ["git", "-C", repo, "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
        run(g[:3] + ["init", "-q"], 60)
        run(g + ["add", "-A"], 60)
        run(g + ["commit", "-q", "-m", "import " + self.dev_project], 60)
        return repo


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="bench/run", description="bucketfs benchmark suite: mounts bucketfs and peer "
        "FUSE filesystems over local MinIO and fake-gcs-server and compares them.")
    p.add_argument("--quick", action="store_true", help="small subset, under 10 minutes")
    p.add_argument("--profile", choices=["lan", "cloud"], default="lan",
                   help="cloud adds 10 ms latency each way through toxiproxy")
    p.add_argument("--bandwidth", type=float, metavar="MBPS",
                   help="cap each proxied connection at MBPS megabytes per second, "
                   "each direction (toxiproxy caps per connection, not in total)")
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                   help="comma-separated, from: " + ",".join(ALL_SYSTEMS))
    p.add_argument("--experiments", default="1,2,3,4,5,6,7",
                   help="comma-separated experiment numbers 1-8 (8, copy tools, runs only "
                   "when named)")
    p.add_argument("--runs", type=int, default=3, help="repeats per measurement (full mode)")
    p.add_argument("--workdir", default="/tmp/bucketbench", help="scratch space (data, mounts)")
    p.add_argument("--port-offset", type=int, default=0,
                   help="add this to every port (MinIO 19000/19001, GCS 14443, toxiproxy "
                   "18474, proxies 29000/24443) when they are taken")
    p.add_argument("--no-install", action="store_true", help="do not install anything")
    p.add_argument("--build", choices=["auto", "always", "never"], default="auto",
                   help="cargo build --release: if the binary is missing (auto), always, never")
    p.add_argument("--tag", help="name this run: results/<date>-<profile>-TAG.json and "
                   "REPORT-TAG.md, leaving REPORT.md alone (for a run of a few experiments)")
    p.add_argument("--report-only", metavar="JSON", help="only rebuild REPORT.md from a JSON")
    a = p.parse_args(argv)
    a.system_list = [s.strip() for s in a.systems.split(",") if s.strip()]
    for s in a.system_list:
        if s not in ALL_SYSTEMS:
            p.error("unknown system %r" % s)
    try:
        a.experiment_list = sorted({int(x) for x in a.experiments.split(",") if x.strip()})
    except ValueError:
        p.error("--experiments takes numbers like 1,2,5")
    if not all(1 <= e <= 8 for e in a.experiment_list):
        p.error("experiments are numbered 1 to 8")
    return a


def build_bucketfs(mode):
    binary = os.path.join(REPO, "target", "release", "bucketfs")
    if mode == "never" or (mode == "auto" and os.access(binary, os.X_OK)):
        return None
    log("cargo build --release (bucketfs)")
    try:
        run(["cargo", "build", "--release", "-p", "bucketfs"], 1800, cwd=REPO)
    except (CmdError, OSError) as e:
        log("bucketfs build failed: %s" % e)
        return "build failed: %s" % e
    return None


def _on_signal(signum, frame):
    # ignore repeats so that the cleanup in `finally` is not cut short
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    raise SystemExit("stopped by signal %d" % signum)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.report_only:
        md = report.write_report(args.report_only, BENCH_DIR, args.tag)
        print(md)
        return 0
    S.set_port_offset(args.port_offset)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    ctx = Context(args)
    os.makedirs(os.path.join(ctx.workdir, "logs"), exist_ok=True)
    util.LOG_FILE = os.path.join(ctx.workdir, "logs", "run.log")
    t_start = time.monotonic()
    started = datetime.datetime.now(datetime.timezone.utc)
    phases = {}

    install_failures = {}
    if not args.no_install:
        t = time.monotonic()
        install_failures = install.ensure_all(args.system_list, args.experiment_list)
        phases["install_s"] = time.monotonic() - t
    build_error = None
    if any(s.startswith("bucketfs") for s in args.system_list) or 8 in args.experiment_list:
        t = time.monotonic()
        build_error = build_bucketfs(args.build)
        phases["build_s"] = time.monotonic() - t

    results_dir = os.path.join(BENCH_DIR, "results")
    os.makedirs(results_dir, exist_ok=True)
    stem = "%s-%s" % (started.strftime("%Y-%m-%d"), args.profile)
    if args.tag:
        stem += "-" + args.tag
    json_path = os.path.join(results_dir, stem + ".json")
    doc = {"meta": {"started": started.isoformat(timespec="seconds"),
                    "profile": args.profile, "bandwidth_MBps": args.bandwidth,
                    "latency": "10 ms each direction (toxiproxy)" if args.profile == "cloud"
                    else "none (loopback through toxiproxy)",
                    "quick": args.quick, "runs": 1 if args.quick else args.runs,
                    "argv": sys.argv[1:] if argv is None else argv,
                    "machine": util.machine_info(), "install_failures": install_failures,
                    "phases": phases,
                    "ports": {"minio": S.MINIO_PORT, "fake-gcs-server": S.GCS_PORT,
                              "toxiproxy-api": S.TOXI_API_PORT, "s3-proxy": S.S3_PROXY_PORT,
                              "gcs-proxy": S.GCS_PROXY_PORT}},
           "systems": {}, "experiments": {}}

    def save():
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=False)

    systems = []
    exps = all_experiments()
    if all(getattr(exps[e], "standalone", False) for e in args.experiment_list):
        args.system_list = []  # nothing to mount
    for name in args.system_list:
        sysobj = make_system(ctx, name)
        why = sysobj.available()
        if name.startswith("bucketfs") and build_error and why:
            why = build_error
        entry = {"backend": sysobj.backend, "version": sysobj.version() if not why else None,
                 "status": "ok" if not why else "failed", "errors": []}
        if why:
            entry["errors"].append(why)
            log("%s unavailable: %s" % (name, why))
        doc["systems"][name] = entry
        systems.append(sysobj)

    srv = S.Servers(ctx.workdir, args.profile, args.bandwidth)
    ctx.experiment_ids = args.experiment_list
    try:
        t = time.monotonic()
        sizes = ctx.read_sizes if any(e in (2, 3) for e in args.experiment_list) else []
        ctx.manifest = S.make_seed(ctx.seed_dir, sizes)
        phases["seed_data_s"] = time.monotonic() - t
        t = time.monotonic()
        srv.start()
        mounts = any(not getattr(exps[e], "standalone", False) for e in args.experiment_list)
        prefixes = (["tree"] if mounts else []) + (["big/f%dM" % s for s in sizes])
        _seed(srv, ctx, prefixes)
        doc["meta"]["toxics"] = srv.apply_profile()
        doc["meta"]["server_versions"] = srv.versions()
        phases["servers_s"] = time.monotonic() - t
        save()
        t_exp = time.monotonic()
        for eid in args.experiment_list:
            exp = exps[eid]
            entry = {"title": exp.title, "metrics": exp.metrics(ctx),
                     "charts": exp.charts(ctx), "results": {}, "seconds": {}}
            doc["experiments"][str(eid)] = entry
            if getattr(exp, "standalone", False):
                _run_standalone(exp, entry, ctx, srv, phases, t_exp)
                save()
                continue
            for sysobj in systems:
                st = doc["systems"][sysobj.name]
                if st["status"] == "failed" and sysobj.available():
                    entry["results"][sysobj.name] = {
                        m["key"]: error("unavailable: " + st["errors"][0]) for m in entry["metrics"]}
                    continue
                log("experiment %d on %s" % (eid, sysobj.name))
                t = time.monotonic()
                try:
                    res = exp.run(ctx, sysobj)
                except MountError as e:
                    log("%s: mount failed: %s" % (sysobj.name, e))
                    res = {m["key"]: error("mount failed: %s" % e) for m in entry["metrics"]}
                    st["status"] = "failed"
                    if len(st["errors"]) < 10:
                        st["errors"].append("exp %d: mount failed: %s" % (eid, e))
                except (CmdError, RuntimeError, OSError, ValueError, KeyError) as e:
                    log("%s: experiment %d failed: %s" % (sysobj.name, eid, e))
                    res = {m["key"]: error(e) for m in entry["metrics"]}
                    if len(st["errors"]) < 10:
                        st["errors"].append("exp %d: %s" % (eid, str(e)[:300]))
                finally:
                    _safe_unmount(sysobj)
                entry["results"][sysobj.name] = res
                entry["seconds"][sysobj.name] = round(time.monotonic() - t, 1)
                phases["experiments_s"] = time.monotonic() - t_exp
                save()
            if hasattr(exp, "notes"):  # a reference measured once, after every system
                try:
                    entry["description"] = exp.notes(ctx, entry["results"])
                except (CmdError, RuntimeError, OSError, ValueError, KeyError, AssertionError) as e:
                    entry["description"] = ["The reference measurement failed: %s" % e]
                save()
    finally:
        for sysobj in systems:
            _safe_unmount(sysobj)
        srv.stop()
        phases["total_s"] = time.monotonic() - t_start
        doc["meta"]["finished"] = datetime.datetime.now(
            datetime.timezone.utc).isoformat(timespec="seconds")
        doc["meta"]["server_versions"] = doc["meta"].get("server_versions") or srv.versions()
        save()
        log("results: %s" % json_path)
        try:
            name = report.write_report(json_path, BENCH_DIR, args.tag, return_name=True)
            log("report: %s (run took %.0fs)" % (os.path.join(BENCH_DIR, name),
                                                 phases["total_s"]))
        except Exception as e:
            log("writing the report failed: %s" % e)
    return 0


def _run_standalone(exp, entry, ctx, srv, phases, t_exp):
    """An experiment whose columns are its own (experiment 8's tools), run once."""
    log("experiment %d (standalone)" % exp.id)
    t = time.monotonic()
    entry["reference"] = exp.reference
    entry["description"] = exp.describe(ctx)
    try:
        res, versions, notes = exp.run_all(ctx, srv)
        entry["results"], entry["columns"] = res, versions
        entry["description"] += notes
    except (CmdError, RuntimeError, OSError, ValueError, KeyError) as e:
        log("experiment %d failed: %s" % (exp.id, e))
        entry["columns"] = {}
        entry["description"].append("The experiment failed: %s" % e)
    entry["seconds"] = {"all": round(time.monotonic() - t, 1)}
    phases["experiments_s"] = time.monotonic() - t_exp


def _seed(srv, ctx, prefixes):
    srv.seed(ctx.seed_dir, prefixes)


def _safe_unmount(sysobj):
    try:
        sysobj.unmount()
    except Exception as e:  # cleanup must go on
        log("%s: unmount error: %s" % (sysobj.name, e))


if __name__ == "__main__":
    sys.exit(main())
