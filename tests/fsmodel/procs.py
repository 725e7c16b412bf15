"""The processes of a run: workers (one per directory `w<N>`, running generated or
replayed ops through a Runner, then reading and closing every handle and comparing the
whole tree), listers (walking the same directories all the while, as `ls -l` in another
terminal would), and `run_workers`, which starts workers, collects their results and
reports a worker that died or whose op has not returned within the hang bound.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import re
import time
import json
import traceback

from .gen import Gen
from .ops import ACCEPT_LISTER, ALL_NAMES, ROOT_NAME, en, fmt_op
from .runner import SKIP, Divergence, Runner


def worker_main(spec: dict, q, prog, oprepr) -> None:
    """One worker: run `spec['ops']` (replay) or `spec['nops']` generated ops in spec['root'],
    then close every handle and compare the whole tree. Puts one result dict on `q`."""
    t0 = time.monotonic()
    res = {"wid": spec["wid"], "ops_done": 0, "failure": None, "notes": {}, "skipped": 0, "timing": {}}
    given = spec.get("ops")
    n = len(given) if given is not None else spec["nops"]
    pt = spec.get("passthrough", False)
    gen = Gen(random.Random(spec["seed"]), spec["sleep_secs"], spec.get("exclude", ()),
              big_files=spec.get("big_files", False))
    run = Runner(spec["root"], passthrough=pt)
    ops, i, op = [], -1, None
    try:
        os.mkdir(spec["root"])
        for i in range(n):
            op = given[i] if given is not None else gen.next(run.m)
            ops.append(op)
            prog[0], prog[1] = i, time.time()
            oprepr.value = fmt_op(op).encode()[:500]
            t1 = time.monotonic()
            if run.step(op) == SKIP:
                res["skipped"] += 1
                if given is not None:
                    res.setdefault("skipped_idx", []).append(i)
            c = res["timing"].setdefault(op[0], [0, 0.0])
            c[0] += 1
            c[1] += time.monotonic() - t1
            res["ops_done"] = i + 1
        i, op = n, ("final",)
        prog[0], prog[1] = n, time.time()
        oprepr.value = b"final: read and close every handle, compare the tree"
        run.close_all()
        run.compare_tree()
        res["snapshot"] = run.m.snapshot()
    except Divergence as d:
        res["failure"] = {"index": i, "op": op, "sig": f"{d.sig} in {op[0]}", "msg": d.msg,
                          "secs": time.monotonic() - t0}
    except Exception as e:  # a bug in this test, or an unexpected exception type
        res["failure"] = {"index": i, "op": op, "sig": "crash", "msg": f"{e!r}\n{traceback.format_exc()}"}
    if res["failure"]:
        res["ops"] = ops
        for fd in run.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
    if os.environ.get("FSMODEL_DUMP_OPS"):  # each worker's ops, to find a divergence's history
        with open(f"/tmp/fsmodel-ops-w{spec['wid']}.json", "w") as f:
            json.dump(ops, f)
    res["notes"] = run.notes
    res["elapsed"] = time.monotonic() - t0
    q.put(res)


# Google Drive shows the second of two items with one name as `stem~ID8.ext`
# (docs/SEMANTICS.md): a rename replacing a file there is not atomic (the replaced file is
# trashed after the move), so a listing taken in between shows both.
DRIVE_REPEAT = re.compile(r"^(?P<stem>.*)~[A-Za-z0-9_-]{8}(?P<ext>\.[^.]*)?$")


def lister_main(lid: int, mp_root: str, target, stop, q, store: str = "") -> None:
    """Walk the target subtree (os.listdir, os.scandir + lstat) until told to stop. Names
    vanishing mid-walk (ENOENT, ENOTDIR) are fine; any other error or a name no worker
    makes is reported (on gdrive a repeated name's `stem~ID8` form is counted, not
    reported: the workers' own listings must never show it)."""
    rng = random.Random(lid)
    res = {"lid": lid, "walks": 0, "entries": 0, "anomalies": [], "notes": {}}

    def anomaly(msg):
        if msg not in res["anomalies"] and len(res["anomalies"]) < 10:
            res["anomalies"].append(msg)

    def walk(d, depth):
        try:
            if rng.random() < 0.3:
                for n in os.listdir(d):
                    check(d, n)
            with os.scandir(d) as it:
                ents = list(it)
        except OSError as e:
            if e.errno not in ACCEPT_LISTER:
                anomaly(f"listing {d}: {en(e.errno)} {e.strerror}")
            return
        for e in ents:
            check(d, e.name)
            res["entries"] += 1
            try:
                e.stat(follow_symlinks=False)
                is_dir = e.is_dir(follow_symlinks=False)
            except OSError as err:
                if err.errno not in ACCEPT_LISTER:
                    anomaly(f"stat {e.path}: {en(err.errno)} {err.strerror}")
                continue
            if is_dir and depth < 6:
                walk(e.path, depth + 1)

    def check(d, n):
        if n in ALL_NAMES or ROOT_NAME.match(n):
            return
        m = DRIVE_REPEAT.match(n) if store == "gdrive" else None
        if m and m["stem"] + (m["ext"] or "") in ALL_NAMES:
            k = "a lister saw a repeated name's ~ID8 form (a rename replacing a file, midway)"
            res["notes"][k] = res["notes"].get(k, 0) + 1
            return
        anomaly(f"listing {d} shows a name no worker makes: {n!r}")

    while not stop.is_set():
        walk(os.path.join(mp_root, target.value.decode()), 0)
        res["walks"] += 1
        if rng.random() < 0.5:
            time.sleep(rng.uniform(0, 0.005))
    q.put(res)


class Listers:
    def __init__(self, ctx, mp_root: str, n: int, store: str = ""):
        self.ctx, self.q, self.stop_ev = ctx, ctx.Queue(), ctx.Event()
        self.target = ctx.Array("c", 512, lock=False)
        self.procs = [ctx.Process(target=lister_main, args=(i, mp_root, self.target, self.stop_ev, self.q, store), daemon=True)
                      for i in range(n)]
        for p in self.procs:
            p.start()

    def set_target(self, rel: str):
        self.target.value = rel.encode()

    def stop(self) -> list[dict]:
        self.stop_ev.set()
        out, deadline = [], time.monotonic() + 60
        while len(out) < len(self.procs) and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                out.append(self.q.get(timeout=1))
        got = {r["lid"] for r in out}
        for i, p in enumerate(self.procs):
            p.join(5 if i in got else 0.1)
            if p.is_alive() and i not in got:
                p.kill()
                out.append({"lid": i, "walks": 0, "entries": 0, "notes": {},
                            "anomalies": ["a lister was stuck in a file system call for 60 s (killed)"]})
        return out


def run_workers(ctx, specs: list[dict], hang_secs: float, progress_every: float = 0) -> list[dict]:
    """Start one process per spec, wait for all results. A worker whose op has not returned
    after `hang_secs` is killed and reported as hung at that op."""
    q = ctx.Queue()
    progs = [ctx.Array("d", 2, lock=False) for _ in specs]
    reprs = [ctx.Array("c", 512, lock=False) for _ in specs]
    procs = []
    for s, pg, rp in zip(specs, progs, reprs):
        pg[0], pg[1] = -1, time.time()
        procs.append(ctx.Process(target=worker_main, args=(s, q, pg, rp), daemon=True))
        procs[-1].start()
    results, gone_at, last_print = {}, {}, time.monotonic()
    t0 = time.monotonic()
    while len(results) < len(specs):
        with contextlib.suppress(queue.Empty):
            r = q.get(timeout=0.5)
            results[r["wid"]] = r
            continue
        now = time.time()
        for s, p, pg, rp in zip(specs, procs, progs, reprs):
            wid = s["wid"]
            if wid in results:
                continue
            if not p.is_alive():
                gone_at.setdefault(wid, now)
                if now - gone_at[wid] > 10:
                    results[wid] = {"wid": wid, "ops_done": int(pg[0]), "notes": {}, "skipped": 0, "elapsed": 0, "timing": {},
                                    "failure": {"index": int(pg[0]), "op": None, "sig": "crash",
                                                "msg": f"worker process died (exit code {p.exitcode}) at "
                                                       f"{rp.value.decode(errors='replace')}"}}
            elif now - pg[1] > hang_secs:
                p.kill()
                results[wid] = {"wid": wid, "ops_done": int(pg[0]), "notes": {}, "skipped": 0, "elapsed": 0, "timing": {},
                                "failure": {"index": int(pg[0]), "op": None, "sig": "hang",
                                            "msg": f"op #{int(pg[0])} {rp.value.decode(errors='replace')} had not "
                                                   f"returned after {hang_secs:.0f} s (killed)"}}
        if progress_every and time.monotonic() - last_print > progress_every:
            last_print = time.monotonic()
            done = sum(max(0, int(pg[0])) for pg in progs)
            print(f"  ... {done} ops in {last_print - t0:.0f} s ({done / (last_print - t0):.0f} ops/s)", flush=True)
    for p in procs:
        p.join(10)
    return [results[s["wid"]] for s in specs]
