"""Shrinking a failing sequence to a short one that fails the same way, on fresh
directories of a fresh mount (with the same number of listers), within a time bound:
first the ops related to the failing one (`backward_slice`: handles and paths it uses,
followed back through the ops that changed them), then the shortest failing prefix, then
chunks and single ops removed while it still fails. Prints the result and saves it as a
replay file (`python3 tests/fsmodel --replay FILE`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import TYPE_CHECKING

from .ops import fmt_op
from .procs import Listers, run_workers

if TYPE_CHECKING:
    from .orchestrate import Config, Report


def shrink_all(cfg: Config, ctx, args, failed: list[dict], rep: Report) -> None:
    """Shrink one failing sequence per distinct kind of divergence, sharing the time bound."""
    import conftest
    todo, seen = [], set()
    for r in failed:
        sig = r["failure"]["sig"]
        if sig in ("crash", "hang") or sig in seen or not r.get("ops"):
            continue
        seen.add(sig)
        todo.append(r)
    if not todo:
        return
    deadline = time.monotonic() + cfg.shrink_secs
    with conftest.mounted(args) as mp:
        listers = Listers(ctx, mp, cfg.listers, cfg.store)
        try:
            for k, r in enumerate(todo):
                budget = (deadline - time.monotonic()) / (len(todo) - k)
                Shrinker(cfg, ctx, mp, listers, r, rep).run(time.monotonic() + budget)
        finally:
            listers.stop()


def same_kind(sig: str, orig: str) -> bool:
    """A trial fails "the same way": an errno divergence of the same op and errnos, or a
    state divergence (data, size, listing...) of the same kind, seen by any op."""
    kind, _, op = orig.rpartition(" in ")
    return sig == orig or (not kind.startswith("errno") and sig.rpartition(" in ")[0] == kind)


class Shrinker:
    trial_no = 0

    def __init__(self, cfg, ctx, mp, listers, r, rep):
        self.cfg, self.ctx, self.mp, self.listers, self.rep = cfg, ctx, mp, listers, rep
        f = r["failure"]
        self.sig, self.wid = f["sig"], r["wid"]
        self.ops = r["ops"][:f["index"] + 1] if f["op"] != ("final",) else list(r["ops"])
        self.trials, self.tries = 0, 1
        self.last, self.skipped = None, set()

    def fails(self, ops, tries=None):
        """Run `ops` on a fresh directory; the index of the failing op if it fails the same
        way (within `tries` runs), else None."""
        for _ in range(tries or self.tries):
            Shrinker.trial_no += 1
            self.trials += 1
            name = f"s{Shrinker.trial_no}"
            self.listers.set_target(name)
            spec = {"wid": 0, "root": os.path.join(self.mp, name), "seed": 0, "ops": ops,
                    "sleep_secs": self.cfg.sleep_secs, "passthrough": self.cfg.passthrough}
            r = run_workers(self.ctx, [spec], self.cfg.hang_secs)[0]
            f = r["failure"]
            if f and same_kind(f["sig"], self.sig):
                self.last = f
                self.skipped = set(r.get("skipped_idx", ()))
                return min(f["index"], len(ops) - 1)
        return None

    def cut(self, ops, j):
        """A failing candidate cut after its failing op `j`, without the ops it skipped
        (an op on an empty slot does nothing: dropping it changes nothing)."""
        return [op for k, op in enumerate(ops[:j + 1]) if k not in self.skipped]

    def run(self, deadline):
        rep = self.rep
        t0 = time.monotonic()
        rep.say(f"shrinking w{self.wid}'s {len(self.ops)} ops ({self.sig}) on fresh directories, "
                f"within {deadline - t0:.0f} s ...")
        # 1. the cheapest candidates first: the ops that touch the failing op's handles and
        #    paths (a backward slice) without and with the sleeps between them, all the ops
        #    without sleeps, then all of them (three times, for a timing-dependent failure)
        ops = self.ops
        cands = []
        if ops[-1][0] != "final":
            cands += [("a slice", backward_slice(ops, sleeps=False)), ("a slice", backward_slice(ops, sleeps=True))]
        if any(op[0] == "sleep" for op in ops):
            cands.append(("no sleeps", [op for op in ops if op[0] != "sleep"]))
        cands.append(("all", ops))
        found, seen = None, set()
        for what, cand in cands:
            if len(cand) in seen or (time.monotonic() > deadline and what != "all"):
                continue
            seen.add(len(cand))
            j = self.fails(cand, tries=1)
            if j is not None:
                found = (what, self.cut(cand, j))
                break
        if found is None:  # flaky: 2 more tries, and 3 tries per candidate from now on
            self.tries = 3
            j = self.fails(ops, tries=2)
            if j is not None:
                found = ("all", self.cut(ops, j))
        if found is None:
            rep.say("  did not fail again in 3 runs on a fresh directory (timing-dependent); not shrunk")
            return
        what, ops = found
        rep.say(f"  fails again{' (not every time)' if self.tries > 1 else ''}: {len(ops)} ops ({what})")
        # 2. the shortest failing prefix (binary search; the failing op's index cuts it at once).
        #    Only a state divergence can show earlier (in a trial's final check), not an errno.
        lo, hi = (0, len(ops)) if not self.sig.startswith("errno") else (len(ops) - 1, len(ops))
        while hi - lo > 1 and time.monotonic() < deadline:
            mid = (lo + hi) // 2
            j = self.fails(ops[:mid])
            if j is None:
                lo = mid
            else:
                ops = self.cut(ops[:mid], j)
                lo, hi = min(lo, len(ops) - 1), len(ops)
        ops = ops[:hi]
        rep.say(f"  shortest failing prefix: {len(ops)} ops ({time.monotonic() - t0:.0f} s)")
        # 3. remove chunks, then single ops, while it still fails
        chunk = max(1, len(ops) // 4)
        while time.monotonic() < deadline:
            changed, k = False, len(ops) - chunk
            while k >= 0 and time.monotonic() < deadline:
                cand = ops[:k] + ops[k + chunk:]
                j = self.fails(cand) if cand else None
                if j is not None:
                    ops, changed = self.cut(cand, j), True
                    k = min(k, len(ops)) - chunk
                else:
                    k -= chunk
            if chunk == 1 and not changed:
                break
            chunk = max(1, chunk // 2)
        done = "" if time.monotonic() < deadline else " (time bound reached: may not be minimal)"
        rep.say(f"  shortest sequence found: {len(ops)} ops after {self.trials} trials, "
                f"{time.monotonic() - t0:.0f} s{done}; it fails with:")
        rep.say(f"    {self.last['msg'] if self.last else '?'}")
        shown = ops if len(ops) <= 60 else ops[-40:]
        if len(shown) < len(ops):
            rep.say(f"    # ... {len(ops) - len(shown)} earlier ops: see the replay file")
        for op in shown:
            rep.say(f"    {fmt_op(op)}")
        path = os.path.join(tempfile.gettempdir(), f"fsmodel-{self.cfg.store}-{self.cfg.seed}-w{self.wid}.json")
        with open(path, "w") as f:
            json.dump(ops, f)
        extra = (" -- " + " ".join(self.cfg.mount_args)) if self.cfg.mount_args else ""
        rep.say(f"  replay: python3 tests/fsmodel --store {self.cfg.store} --listers {self.cfg.listers} "
                f"--replay {path}{extra}")


OBSERVERS = {"read", "fstat", "stat", "listdir", "scandir", "cat", "fsync"}
SLOT_OPS = {"open", "close", "write", "read", "fstat", "ftruncate", "fsync"}


def op_refs(op):
    """(slots, paths) an op names."""
    if op[0] in SLOT_OPS:
        return {op[1]}, ({op[2]} if op[0] == "open" else set())
    if op[0] == "rename":
        return set(), {op[1], op[2]}
    if op[0] == "sleep":
        return set(), set()
    return set(), {op[1]}


def is_above(q: str, p: str) -> bool:
    """q is p or a directory above it."""
    return q == p or q == "" or p.startswith(q + "/")


def handle_ids(ops) -> list:
    """For each op on a slot, the index of the `open` that made the handle it uses (opens
    on a busy slot are skipped, as the executor does; an open that fails is taken to
    succeed: this only guides the slice)."""
    cur, out = {}, []
    for i, op in enumerate(ops):
        h = None
        if op[0] == "open":
            if op[1] not in cur:
                cur[op[1]] = i
            h = cur[op[1]]
        elif op[0] in SLOT_OPS:
            h = cur.get(op[1])
            if op[0] == "close":
                cur.pop(op[1], None)
        out.append(h)
    return out


def backward_slice(ops, sleeps: bool):
    """The last op and, going back, every op using a handle, or naming a path or a directory
    above it, that a kept op changing something uses or names (for a failing listing: also
    the paths below the listed directory); repeated until nothing is added (a handle's path
    is learnt only at its open, earlier in the walk than the renames after it). Observers
    (reads, stats, listings) are kept when related but add nothing to follow: they change
    no state of the model (they may change the mount's caches, which is why they are kept).
    Every close is kept, so handles live as long as they did; sleeps only if `sleeps`."""
    hid = handle_ids(ops)
    last = ops[-1]
    below = op_refs(last)[1] if last[0] in ("listdir", "scandir") else set()
    handles, paths = {hid[-1]} - {None}, op_refs(last)[1]

    def wanted(i, p):
        return ((hid[i] is not None and hid[i] in found_h)
                or any(is_above(q, x) for q in p for x in found_p)
                or any(is_above(x, q) for q in p for x in below))

    while True:
        found_h, found_p = set(handles), set(paths)
        keep = [len(ops) - 1]
        for i in range(len(ops) - 2, -1, -1):
            op = ops[i]
            if op[0] in ("sleep", "close"):
                if sleeps or op[0] == "close":
                    keep.append(i)
                continue
            p = op_refs(op)[1]
            if wanted(i, p):
                keep.append(i)
                if op[0] not in OBSERVERS:
                    if hid[i] is not None:
                        found_h.add(hid[i])
                    found_p |= p
        if found_h == handles and found_p == paths:
            break
        handles, paths = found_h, found_p
    first = min(i for i in keep if ops[i][0] not in ("sleep", "close"))
    return [ops[i] for i in sorted(keep) if i >= first]
