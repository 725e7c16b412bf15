"""One run of the model test: `Config` (store, op count, seed, mount flags, bounds),
`Report` (lines said, divergences found), and `run`: make a bucket, mount, start listers
and workers, then unmount (or `kill -9` the daemon and mount again: `Config.crash`) and compare the bucket itself and a remount with each worker's
final model; shrink what failed. The mount's `bucketfs status --json`, taken just before
its unmount, is kept in `Report.status` (a test checks passthrough opens with it).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time

from .ops import fmt_op, join, md5
from .procs import Listers, run_workers
from .shrink import shrink_all


class Config:
    """A run's parameters. `big_files`: the generator's knob for files of a few MiB read
    again after close (what FUSE passthrough serves; gen.py). `passthrough` follows the
    mount flags (on unless `--passthrough off`): the runner then accepts the EBUSY it documents."""

    def __init__(self, store="s3", ops=2000, seed=None, workers=3, listers=2, mount_args=(),
                 shrink_secs=180.0, hang_secs=180.0, replay=None, progress_every=0.0, verbose=True,
                 exclude=(), big_files=False, crash=False):
        self.store, self.ops, self.workers, self.listers = store, ops, workers, listers
        self.mount_args = list(mount_args)
        if seed is None:
            env = os.environ.get("BUCKETFS_MODEL_SEED")
            seed = int(env) if env else random.randrange(1 << 31)
        self.seed, self.shrink_secs, self.hang_secs = seed, shrink_secs, hang_secs
        self.replay, self.progress_every, self.verbose = replay, progress_every, verbose
        self.exclude, self.big_files = list(exclude), big_files
        # End with `kill -9` of the daemon instead of an unmount, then mount again on the
        # same mount point (its staging directory: recovery) and `bucketfs sync`.
        self.crash = crash
        a = self.mount_args
        # On by default (the mount falls back off without root or Linux 6.9+).
        self.passthrough = "--passthrough" not in a or a[a.index("--passthrough") + 1:][:1] != ["off"]
        ttl = 1.0
        if "--metadata-ttl" in self.mount_args:
            ttl = float(self.mount_args[self.mount_args.index("--metadata-ttl") + 1])
        self.sleep_secs = round(ttl + 0.3, 2) if ttl > 0 else 0.1

    def command(self) -> str:
        extra = (" -- " + " ".join(self.mount_args)) if self.mount_args else ""
        if self.replay is not None:
            return f"python3 tests/fsmodel --store {self.store} --listers {self.listers} --replay FILE{extra}"
        excl = f" --exclude {','.join(self.exclude)}" if self.exclude else ""
        big = " --big-files" if self.big_files else ""
        crash = " --crash" if self.crash else ""
        return (f"python3 tests/fsmodel --store {self.store} --ops {self.ops} --seed {self.seed} "
                f"--workers {self.workers} --listers {self.listers}{excl}{big}{crash}{extra}")


class Report:
    def __init__(self, cfg: Config):
        self.cfg, self.lines, self.problems = cfg, [], []
        self.ops = 0
        self.elapsed = 0.0
        self.status: dict | None = None  # `bucketfs status --json` of the mount, before unmount

    def say(self, line=""):
        self.lines.append(line)
        if self.cfg.verbose:
            print(line, flush=True)

    def problem(self, line):
        self.problems.append(line)
        self.say("DIVERGENCE " + line)

    @property
    def ok(self) -> bool:
        return not self.problems

    def text(self) -> str:
        return "\n".join(self.lines)


def worker_specs(cfg: Config, mp: str) -> list[dict]:
    if cfg.replay is not None:
        return [{"wid": 0, "root": os.path.join(mp, "w0"), "seed": 0, "ops": cfg.replay,
                 "sleep_secs": cfg.sleep_secs, "passthrough": cfg.passthrough}]
    per = [cfg.ops // cfg.workers + (1 if i < cfg.ops % cfg.workers else 0) for i in range(cfg.workers)]
    return [{"wid": i, "root": os.path.join(mp, f"w{i}"), "seed": f"{cfg.seed}/w{i}", "nops": per[i],
             "sleep_secs": cfg.sleep_secs, "exclude": cfg.exclude, "big_files": cfg.big_files,
             "passthrough": cfg.passthrough} for i in range(cfg.workers)]


def mount_status(mp: str) -> dict | None:
    """`bucketfs status --json MP`, or None if it did not answer."""
    import conftest
    p = conftest.run_cli(["status", "--json", mp])
    try:
        return json.loads(p.out) if p.returncode == 0 else None
    except ValueError:
        return None


def crash_and_recover(rep: Report, mp: str, args: list[str]) -> None:
    """`kill -9` the daemon of MP (its uploads, deletes, markers and moves still pending),
    mount ARGS again on MP (the same staging directory: the new mount recovers what the
    dead one left) and `bucketfs sync` it. What goes wrong is a problem of the run."""
    import signal
    import conftest
    pids = conftest.daemon_pids(mp)
    st = rep.status or {}
    rep.say(f"  crash: kill -9 of the daemon with {st.get('write_back_files', '?')} files to upload and "
            f"{st.get('write_back_deletes', '?')} deletes or markers pending")
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 30
    while conftest.daemon_pids(mp) and time.monotonic() < deadline:
        time.sleep(0.05)
    conftest.force_unmount(mp)
    os.makedirs(mp, exist_ok=True)
    conftest._live_mounts.add(mp)
    r = conftest.run_cli(["mount", args[0], mp] + list(args[1:]), timeout=300)
    if r.returncode != 0:
        rep.problem(f"the mount after kill -9 exited {r.returncode}: {r.err.strip()[-800:]}")
        return
    s = conftest.run_cli(["sync", mp], timeout=300)
    if s.returncode != 0:
        rep.problem(f"bucketfs sync after the recovery exited {s.returncode}: {s.err.strip()[-800:]}")


def describe_failure(r: dict, n_ops) -> str:
    f = r["failure"]
    where = "the final check (handles read and closed, whole tree compared)" if f["op"] == ("final",) else \
        f"op #{f['index']} of {n_ops}" + (f": {fmt_op(f['op'])}" if f["op"] else "")
    secs = f" ({f['secs']:.1f} s into the run)" if f.get("secs") is not None else ""
    lines = [f"worker w{r['wid']} at {where}{secs} [{f['sig']}]", f"    {f['msg']}"]
    ops = r.get("ops") or []
    if ops:
        lines.append("    last ops before it:")
        lines += [f"      #{k}: {fmt_op(o)}" for k, o in list(enumerate(ops))[max(0, f['index'] - 8):f['index']]]
    return "\n".join(lines)


def compare_bucket(store: str, bucket: str, prefix: str, snap: dict) -> list[str]:
    """The bucket's own keys under `prefix` against a worker's final model."""
    import seed as seedmod
    keys = seedmod.list_keys(store, bucket, prefix + "/")
    exp_files = {f"{prefix}/{p}": v for p, v in snap["files"].items()}
    exp_dirs = {prefix} | {f"{prefix}/{d}" for d in snap["dirs"] if d}
    out = []
    for k in keys:
        if k.endswith("/"):
            if k[:-1] not in exp_dirs:
                out.append(f"bucket holds a marker {k!r} for a directory the model does not have")
        elif k not in exp_files:
            out.append(f"bucket holds {k!r}, which the model does not have")
        else:
            data = seedmod.get(store, bucket, k)
            size, digest = exp_files[k]
            if md5(data) != digest:
                out.append(f"bucket object {k!r}: {len(data)} bytes md5 {md5(data)[:8]}, expected {size} md5 {digest[:8]}")
    for k in sorted(set(exp_files) - set(keys)):
        out.append(f"bucket lacks {k!r} ({exp_files[k][0]} bytes)")
    for d in sorted(exp_dirs):
        if d + "/" not in keys and not any(k.startswith(d + "/") for k in keys):
            out.append(f"bucket lacks directory {d!r} (no marker, no key below it)")
    return out


def compare_mount(root: str, snap: dict) -> list[str]:
    """A mounted tree against a worker's final model (names, types, sizes, contents)."""
    files, dirs, out = {}, set(), []
    for dp, dns, fns in os.walk(root, onerror=lambda e: out.append(f"walk: {e}")):
        rel = os.path.relpath(dp, root)
        rel = "" if rel == "." else rel
        dirs.update(join(rel, n) for n in dns)
        for n in fns:
            with open(os.path.join(dp, n), "rb") as f:
                b = f.read()
            files[join(rel, n)] = [len(b), md5(b)]
    exp_dirs = set(snap["dirs"]) - {""}
    for p in sorted(set(files) | set(snap["files"])):
        if files.get(p) != snap["files"].get(p):
            out.append(f"{p!r}: seen {files.get(p)}, expected {snap['files'].get(p)} ([size, md5])")
    for d in sorted(dirs ^ exp_dirs):
        out.append(f"directory {d!r}: {'unexpected' if d in dirs else 'missing'}")
    return out


def run(cfg: Config) -> Report:
    """Bucket, mount, workers + listers, final checks, unmount, bucket and remount checks,
    shrinking. Returns a Report (`.ok`, `.text()`)."""
    import conftest
    rep = Report(cfg)
    ctx = multiprocessing.get_context("fork")
    try:
        bucket = conftest.Bucket(cfg.store) if cfg.store != "mem" else None
    except Exception as e:  # the store's server is down
        rep.problem(f"cannot create a bucket on {cfg.store}: {e!r}")
        return rep
    args = (bucket.args() if bucket else ["mem://"]) + cfg.mount_args
    n_ops = len(cfg.replay) if cfg.replay is not None else cfg.ops
    rep.say(f"fsmodel: store {cfg.store}, seed {cfg.seed}, {n_ops} ops, {cfg.workers if cfg.replay is None else 1} "
            f"workers, {cfg.listers} listers, mount args {' '.join(args)}")
    rep.say(f"  reproduce: {cfg.command()}  (BUCKETFS_MODEL_SEED={cfg.seed})")
    failed = []
    try:
        mp = conftest.mount(args)
        try:
            listers = Listers(ctx, mp, cfg.listers, cfg.store)
            t0 = time.monotonic()
            specs = worker_specs(cfg, mp)
            results = run_workers(ctx, specs, cfg.hang_secs, cfg.progress_every)
            rep.elapsed = time.monotonic() - t0
            lres = listers.stop()
        finally:
            rep.status = mount_status(mp)
            if cfg.crash:
                crash_and_recover(rep, mp, args)
            up = conftest.unmount(mp)
        rep.ops = sum(r["ops_done"] for r in results)
        rep.say(f"  {rep.ops} ops in {rep.elapsed:.1f} s: {rep.ops / max(rep.elapsed, 1e-9):.0f} ops/s; listers walked "
                f"{sum(x['walks'] for x in lres)} times ({sum(x['entries'] for x in lres)} entries)")
        notes = {}
        for r in results + lres:
            for k, v in r["notes"].items():
                notes[k] = notes.get(k, 0) + v
        if cfg.passthrough:
            st = rep.status or {}
            rep.say(f"  passthrough: {'on' if st.get('passthrough') else 'off'}, "
                    f"{st.get('passthrough_opens', '?')} opens served by the kernel from local files")
        for k, v in sorted(notes.items()):
            rep.say(f"  accepted: {k} ({v}x)")
        timing = {}
        for r in results:
            for k, (c, t) in r["timing"].items():
                timing[k] = [timing.get(k, [0, 0])[0] + c, timing.get(k, [0, 0])[1] + t]
        rep.say("  time per op: " + ", ".join(f"{k} {c}x {1000 * t / c:.1f} ms" for k, (c, t) in
                                               sorted(timing.items(), key=lambda kv: -kv[1][1])))
        for r in results:
            if r["failure"]:
                failed.append(r)
                n = len(r["ops"]) if r.get("ops") else r["ops_done"]
                rep.problem(describe_failure(r, n if cfg.replay is not None else specs[r["wid"]].get("nops", n)))
        for a in sorted({a for x in lres for a in x["anomalies"]}):
            rep.problem(f"lister: {a}")
        if up is not None and up.returncode != 0:
            rep.problem(f"bucketfs unmount exited {up.returncode}: {up.stderr.decode(errors='replace').strip()[-800:]}")
        good = [r for r in results if not r["failure"]]
        if bucket and cfg.store != "gdrive":
            for r in good:
                for line in compare_bucket(cfg.store, bucket.name, f"w{r['wid']}", r["snapshot"]):
                    rep.problem(f"after unmount, w{r['wid']}: {line}")
        if bucket:
            with conftest.mounted(args) as mp2:
                for r in good:
                    for line in compare_mount(os.path.join(mp2, f"w{r['wid']}"), r["snapshot"]):
                        rep.problem(f"after remount, w{r['wid']}: {line}")
        if failed and cfg.shrink_secs > 0:
            shrink_all(cfg, ctx, args, failed, rep)
    except BaseException as e:  # pytest.fail from a failed mount, Ctrl-C
        if type(e).__name__ in ("Failed", "KeyboardInterrupt"):
            rep.problem(f"run aborted: {e}")
            if isinstance(e, KeyboardInterrupt):
                raise
        else:
            raise
    finally:
        if bucket:
            bucket.cleanup()
    rep.say(f"fsmodel: {'OK' if rep.ok else f'{len(rep.problems)} divergence(s)'} (store {cfg.store}, seed {cfg.seed})")
    return rep
