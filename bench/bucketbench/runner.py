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
import sys
import time

from . import install, plan, report, util
from . import servers as S
from .experiments import all_experiments
from .systems import ALL_SYSTEMS, DEFAULT_SYSTEMS, MountError, make_system
from .util import CmdError, error, log, na, run

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(BENCH_DIR)
DEFAULT_BIN = os.path.join(REPO, "target", "release", "bucketfs")
LAST_EXPERIMENT = 10


class Context:
    """Settings and shared state handed to every experiment."""

    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.profile = args.profile
        self.workdir = os.path.abspath(args.workdir)
        self.seed_dir = os.path.join(self.workdir, "seed")
        self.repo = REPO
        self.bucketfs_bin = os.path.abspath(getattr(args, "bucketfs_bin", None) or DEFAULT_BIN)
        # {experiment id (str): repetitions} (plan.py); which experiment is running now
        self.repetitions = plan.repetitions(args.experiment_list, args.runs, args.quick)
        self.exp_id = None
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
        """Repetitions of the experiment running now: quick_n in --quick, else the plan's
        or --runs N (plan.py)."""
        return quick_n if self.quick else self.repetitions.get(str(self.exp_id), 1)

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
    p.add_argument("--experiments", default="1,2,3,4,5,6,7,9",
                   help="comma-separated experiment numbers 1-%d (8, copy tools, and 10, the "
                   "million-key bucket, run only when named)" % LAST_EXPERIMENT)
    p.add_argument("--runs", type=int, metavar="N",
                   help="repetitions of every experiment that repeats (full mode; 7, 9 and 10 "
                   "are one pass); default: bucketbench/plan.py's, 3 where figures move between "
                   "runs and 1 where they do not")
    p.add_argument("--keys", default="1000x1000+100000", metavar="DxK+B",
                   help="experiment 10's bucket: D directories of K keys and big/ of B keys "
                   "(default 1000x1000+100000: 1,100,000 keys; e.g. 1000x10+10000 to test)")
    p.add_argument("--gcs-keys", type=int, default=100000, metavar="N",
                   help="experiment 10: seed the GCS emulator (in memory) with at most N keys")
    p.add_argument("--gcs-seed-limit", type=float, default=300.0, metavar="S",
                   help="experiment 10: stop seeding the GCS emulator after S seconds (it slows "
                   "as it fills) and run its systems on the keys that went in")
    p.add_argument("--seed-limit", type=float, default=25.0, metavar="MIN",
                   help="experiment 10: seed only if the trial's estimate is under MIN minutes")
    p.add_argument("--workdir", default="/tmp/bucketbench", help="scratch space (data, mounts)")
    p.add_argument("--port-offset", type=int, default=0,
                   help="add this to every port (MinIO 19000/19001, GCS 14443, toxiproxy "
                   "18474, proxies 29000/24443) when they are taken")
    p.add_argument("--no-install", action="store_true", help="do not install anything")
    p.add_argument("--build", choices=["auto", "always", "never"], default="auto",
                   help="cargo build --release: if the binary is missing (auto), always, never")
    p.add_argument("--bucketfs-bin", metavar="PATH", default=DEFAULT_BIN,
                   help="the bucketfs binary to run (default target/release/bucketfs; another "
                   "path is never built, e.g. a copy that a rebuild of target/ cannot change)")
    p.add_argument("--tag", help="name this run: results/<date>-<profile>-TAG.json, its "
                   "report in the work directory, leaving REPORT.md alone (for a run of a few "
                   "experiments)")
    p.add_argument("--report-only", metavar="JSON", nargs="?", const="",
                   help="only rebuild bench/REPORT.md and README.md's headline from a JSON "
                   "(default: the newest untagged one in bench/results)")
    p.add_argument("--resume", metavar="JSON",
                   help="continue an interrupted run: its flags are taken from the JSON and "
                   "every (experiment, system) already in it is kept, not run again")
    p.add_argument("--compare", metavar="JSON", nargs="+",
                   help="OLD [NEW]: per metric, NEW's change from OLD (NEW defaults to the run "
                   "this command makes); exit status 2 if a regression passes --threshold")
    p.add_argument("--threshold", type=float, default=10.0, metavar="PCT",
                   help="--compare marks a change worse than PCT %% as a regression")
    a = p.parse_args(argv)
    if a.compare and len(a.compare) > 2:
        p.error("--compare takes OLD.json and at most one NEW.json")
    a.system_list = [s.strip() for s in a.systems.split(",") if s.strip()]
    for s in a.system_list:
        if s not in ALL_SYSTEMS:
            p.error("unknown system %r" % s)
    try:
        a.experiment_list = sorted({int(x) for x in a.experiments.split(",") if x.strip()})
    except ValueError:
        p.error("--experiments takes numbers like 1,2,5")
    if not all(1 <= e <= LAST_EXPERIMENT for e in a.experiment_list):
        p.error("experiments are numbered 1 to %d" % LAST_EXPERIMENT)
    if a.runs is not None and a.runs < 1:
        p.error("--runs takes a number from 1")
    try:
        from .keyseed import parse_layout
        parse_layout(a.keys)
    except ValueError as e:
        p.error(str(e))
    return a


def build_bucketfs(mode, binary=None):
    binary = os.path.abspath(binary or DEFAULT_BIN)
    if binary != DEFAULT_BIN:  # a copy given with --bucketfs-bin: used as it is
        return None if os.access(binary, os.X_OK) else "%s is not an executable" % binary
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
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.report_only is not None:
        path = args.report_only or report.main_json(os.path.join(BENCH_DIR, "results"))
        md = report.write_report(path, BENCH_DIR)
        report.update_readme(path, os.path.join(REPO, "README.md"))
        print(md)
        return 0
    if args.compare and len(args.compare) == 2:
        return _print_compare(args.compare[0], args.compare[1], args.threshold)
    prior = None
    if args.resume:
        with open(args.resume) as f:
            prior = json.load(f)
        # the interrupted run's flags, then any given now (a later flag wins: --port-offset,
        # --workdir, --no-install ...)
        flags = {"--resume": 1, "--compare": -1, "--threshold": 1}
        mine = (args.resume, args.compare, args.threshold)
        args = parse_args(_strip_flags(prior["meta"]["argv"], flags) + _strip_flags(argv, flags))
        args.resume, args.compare, args.threshold = mine
    S.set_port_offset(args.port_offset)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    ctx = Context(args)
    if prior is not None and not any(a.split("=")[0] == "--runs" for a in argv):
        # a resumed run goes on with the repetitions it began with
        ctx.repetitions.update(plan.recorded(prior["meta"], args.experiment_list))
    os.makedirs(os.path.join(ctx.workdir, "logs"), exist_ok=True)
    util.LOG_FILE = os.path.join(ctx.workdir, "logs", "run.log")
    t_start = time.monotonic()
    started = datetime.datetime.now(datetime.timezone.utc)
    phases = {}

    install_failures = {}
    if not args.no_install:
        t = time.monotonic()
        install_failures = install.ensure_all(args.system_list, args.experiment_list,
                                              ctx.workdir)
        phases["install_s"] = time.monotonic() - t
    build_error = None
    if any(s.startswith("bucketfs") for s in args.system_list) or 8 in args.experiment_list:
        t = time.monotonic()
        build_error = build_bucketfs(args.build, args.bucketfs_bin)
        phases["build_s"] = time.monotonic() - t

    results_dir = os.path.join(BENCH_DIR, "results")
    os.makedirs(results_dir, exist_ok=True)
    stem = "%s-%s" % (started.strftime("%Y-%m-%d"), args.profile)
    if args.tag:
        stem += "-" + args.tag
    json_path = os.path.join(results_dir, stem + ".json")
    if prior is not None:
        json_path = os.path.abspath(args.resume)
    doc = {"meta": {"started": started.isoformat(timespec="seconds"),
                    "profile": args.profile, "bandwidth_MBps": args.bandwidth,
                    "latency": "10 ms each direction (toxiproxy)" if args.profile == "cloud"
                    else "none (loopback through toxiproxy)",
                    "quick": args.quick, "runs": 1 if args.quick else args.runs,
                    "repetitions": ctx.repetitions,
                    "argv": sys.argv[1:] if argv is None else argv,
                    "machine": util.machine_info(), "install_failures": install_failures,
                    "phases": phases,
                    "ports": {"minio": S.MINIO_PORT, "fake-gcs-server": S.GCS_PORT,
                              "toxiproxy-api": S.TOXI_API_PORT, "s3-proxy": S.S3_PROXY_PORT,
                              "gcs-proxy": S.GCS_PROXY_PORT}},
           "systems": {}, "experiments": {}}

    doc["meta"]["commit"] = git_commit()
    if prior is not None:
        doc = _resumed_doc(prior, doc, started)
        doc["meta"]["repetitions"] = ctx.repetitions
        ctx.memory = doc.get("memory", {})
    doc["memory"] = ctx.memory

    def save():
        tmp = json_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=False)
        os.replace(tmp, json_path)

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
        if getattr(sysobj, "note", None):
            entry["note"] = sysobj.note
        if why:
            entry["errors"].append(why)
            log("%s unavailable: %s" % (name, why))
        old = doc["systems"].get(name)
        if old:  # resumed: keep what the earlier session saw
            entry["errors"] = old.get("errors", []) + entry["errors"]
            if old.get("version") and old.get("version") != entry["version"]:
                entry["earlier_version"] = old["version"]
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
        for eid in args.experiment_list:  # what an experiment lays out before any system
            if hasattr(exps[eid], "prepare"):
                phases["prepare_%d_s" % eid] = -time.monotonic()
                log(exps[eid].prepare(ctx, srv) or "experiment %d prepared" % eid)
                phases["prepare_%d_s" % eid] += time.monotonic()
        doc["meta"]["toxics"] = srv.apply_profile()
        doc["meta"]["server_versions"] = srv.versions()
        phases["servers_s"] = time.monotonic() - t
        save()
        t_exp = time.monotonic()
        counter = Counting(srv)
        for eid in args.experiment_list:
            exp = exps[eid]
            ctx.exp_id = eid
            entry = doc["experiments"].get(str(eid)) or {}
            entry.update({"title": exp.title, "metrics": exp.metrics(ctx),
                          "charts": exp.charts(ctx), "runs": ctx.runs(1)})
            for k in ("results", "seconds", "requests"):
                entry.setdefault(k, {})
            if hasattr(exp, "describe") and not getattr(exp, "standalone", False):
                entry["description"] = exp.describe(ctx)
            doc["experiments"][str(eid)] = entry
            ran = False
            if getattr(exp, "standalone", False):
                if entry.get("columns"):
                    log("experiment %d: kept from the interrupted run" % eid)
                    continue
                _run_standalone(exp, entry, ctx, srv, phases, t_exp)
                counter.invalidate()
                save()
                continue
            for sysobj in systems:
                if sysobj.name in entry["results"]:
                    log("experiment %d on %s: kept from the interrupted run" % (eid, sysobj.name))
                    continue
                if getattr(sysobj, "only", None) and str(eid) not in sysobj.only:
                    entry["results"][sysobj.name] = {m["key"]: na(plan.not_run_reason(sysobj.name))
                                                     for m in entry["metrics"]}
                    continue
                ran = True
                st = doc["systems"][sysobj.name]
                if st["status"] == "failed" and sysobj.available():
                    entry["results"][sysobj.name] = {
                        m["key"]: error("unavailable: " + st["errors"][0]) for m in entry["metrics"]}
                    continue
                rss = srv.fresh_proxy()
                log("experiment %d on %s (toxiproxy restarted; it held %d MB)" % (eid, sysobj.name, rss))
                counter.start(exp, sysobj)
                if hasattr(sysobj, "passthrough_opens"):
                    sysobj.passthrough_opens = 0
                t = time.monotonic()
                guard = S.ProxyGuard(srv)
                try:
                    with guard:
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
                rec = counter.finish(exp, sysobj, ctx)
                if rec:
                    entry["requests"][sysobj.name] = rec
                entry["results"][sysobj.name] = res
                if guard.restarts:
                    entry.setdefault("proxy_restarts", {})[sysobj.name] = {
                        "restarts": guard.restarts, "failed": guard.failed, "limit_mb": guard.limit_mb,
                        "peak_mb": guard.peak_mb}
                if hasattr(sysobj, "passthrough_opens"):
                    # did the kernel serve opens itself? (it falls back off, and says why
                    # in the mount's log, below Linux 6.9 or without root)
                    entry.setdefault("passthrough_opens", {})[sysobj.name] = \
                        sysobj.passthrough_opens
                entry["seconds"][sysobj.name] = round(time.monotonic() - t, 1)
                phases["experiments_s"] = time.monotonic() - t_exp
                save()
            if hasattr(exp, "notes") and (ran or "description" not in entry):
                # a reference measured once, after every system
                counter.invalidate()
                try:
                    entry["description"] = exp.notes(ctx, entry["results"])
                except (CmdError, RuntimeError, OSError, ValueError, KeyError, AssertionError) as e:
                    entry["description"] = ["The reference measurement failed: %s" % e]
                save()
    finally:
        for sysobj in systems:
            _safe_unmount(sysobj)
        srv.stop()
        phases["total_s"] = time.monotonic() - t_start + phases.get("earlier_sessions_s", 0)
        doc["meta"]["finished"] = datetime.datetime.now(
            datetime.timezone.utc).isoformat(timespec="seconds")
        doc["meta"]["server_versions"] = doc["meta"].get("server_versions") or srv.versions()
        save()
        log("results: %s" % json_path)
        try:
            if args.tag:  # a partial run: REPORT.md stays the main run's
                out = os.path.join(ctx.workdir, "REPORT-%s.md" % args.tag)
                report.write_report(json_path, BENCH_DIR, out)
            else:
                out = os.path.join(BENCH_DIR, "REPORT.md")
                report.write_report(json_path, BENCH_DIR)
                report.update_readme(json_path, os.path.join(REPO, "README.md"))
            log("report: %s (run took %.0fs)" % (out, phases["total_s"]))
        except Exception as e:
            log("writing the report failed: %s" % e)
    if args.compare:
        return _print_compare(args.compare[0], json_path, args.threshold)
    return 0


class Counting:
    """Store requests of one (experiment, system) cell: MinIO's counters settled before and
    after it (see requests.py), minus the markers and the harness's own requests; and
    bucketfs's own counts. A settled snapshot taken after one cell serves as the next
    cell's start while nothing else has touched MinIO in between."""

    def __init__(self, srv):
        self.minio = srv.request_counter()
        self.last = None  # (counters, markers sent since) of the newest settled snapshot
        self.begin = None

    def invalidate(self):
        self.last = None

    def wanted(self, exp, sysobj):
        return getattr(exp, "counts_requests", True) and sysobj.store is not None

    def start(self, exp, sysobj):
        self.begin = None
        if not self.wanted(exp, sysobj):
            return
        from . import rawlink
        if hasattr(sysobj, "own_requests"):
            sysobj.own_requests = {}
        try:
            if sysobj.store == "s3" and self.last is None:
                self.last = self.minio.settle()
        except (OSError, RuntimeError) as e:
            log("request counters: %s" % e)
            self.last = None
        self.begin = (self.last[0] if self.last and sysobj.store == "s3" else None,
                      dict(rawlink.SENT), time.monotonic())

    def finish(self, exp, sysobj, ctx):
        from . import rawlink
        from . import requests as R
        if self.begin is None:
            return None
        before, sent0, t0 = self.begin
        own = getattr(sysobj, "own_requests", None)
        rec = {"runs": ctx.runs(1)}
        if before is not None:
            try:
                self.last = self.minio.settle()
            except (OSError, RuntimeError) as e:
                log("request counters: %s" % e)
                self.last = None
                return {"error": str(e), "runs": ctx.runs(1)}
            excluded = R.diff(dict(rawlink.SENT), sent0)
            excluded.pop(R.MARKER_API, None)  # the markers are taken out on their own
            rec = R.cell_record(R.diff(self.last[0], before), 1, ctx.runs(1), own or None,
                                excluded, self.last[1])
        elif own:
            rec["bucketfs"] = own
        else:
            return None
        return rec


def git_commit():
    try:
        return run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], 10)[1].strip()
    except (CmdError, OSError):
        return None


def _strip_flags(argv, flags):
    """argv without `flags` ({flag: number of values, -1: all up to the next flag})."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        name = a.split("=", 1)[0]
        if name in flags:
            i += 1
            if "=" not in a:
                n = flags[name]
                while i < len(argv) and (n < 0 and not argv[i].startswith("--") or n > 0):
                    i += 1
                    n -= 1
            continue
        out.append(a)
        i += 1
    return out


def _resumed_doc(prior, fresh, started):
    """The interrupted run's document, ready to go on: its results kept, this session
    recorded under meta.resumed, its phases continuing the earlier sessions' time."""
    meta = prior["meta"]
    phases = fresh["meta"]["phases"]  # the dict this session keeps filling in
    phases["earlier_sessions_s"] = meta.get("phases", {}).get("total_s", 0)
    meta["phases"] = phases
    kept = sum(len(e.get("results", {})) for e in prior["experiments"].values())
    meta.setdefault("resumed", []).append({
        "at": started.isoformat(timespec="seconds"), "commit": fresh["meta"].get("commit"),
        "kept_cells": kept, "loadavg_at_start": fresh["meta"]["machine"].get("loadavg_at_start")})
    meta["commit"] = meta.get("commit") or fresh["meta"].get("commit")
    return prior


def _print_compare(old, new, threshold):
    from .compare import compare_files
    lines, regressions = compare_files(old, new, threshold)
    print("\n".join(lines))
    return 2 if regressions else 0


def _run_standalone(exp, entry, ctx, srv, phases, t_exp):
    """An experiment whose columns are its own (experiment 8's tools), run once."""
    log("experiment %d (standalone)" % exp.id)
    t = time.monotonic()
    entry["reference"] = exp.reference
    entry["description"] = exp.describe(ctx)
    try:
        res, versions, notes = exp.run_all(ctx, srv)
        entry["results"], entry["columns"] = res, versions
        entry["requests"] = getattr(exp, "requests", None) or {}
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
