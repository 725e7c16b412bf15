"""Passthrough in REPORT.md: under experiments 2, 3 and 5 a "passthrough on/off" table,
bucketfs-nopt (`--passthrough off`) beside bucketfs (passthrough on, the default) with their
ratio; and one
table of the figures issue 27 sets its goals by (reads from the mount's own caches, fio's
buffered write phase, `cp` into the mount, the daemon's CPU per GB of cached reads), each
system against native disk, all from the same run.
"""

import re

OFF, ON = "bucketfs-nopt", "bucketfs"
PAIR_EXPERIMENTS = ("2", "3", "5")
# experiment 3 has four or five figures per fio job; its pair keeps bandwidth and write phase
PAIR_FIELDS = {"3": (".bw", ".write_s")}
# the columns of the goals table beside native disk, where the run has them
GOAL_SYSTEMS = (OFF, ON, "bucketfs-wb")


def _rec(exp, system, key):
    return (exp.get("results") or {}).get(system, {}).get(key)


def _median(exp, system, key):
    rec = _rec(exp, system, key)
    return rec["median"] if isinstance(rec, dict) and "median" in rec else None


def ratio_text(a, b, better):
    """a ÷ b, and whether that makes a better or worse than b ("higher" or "lower" is
    better); "–" without two numbers."""
    if a is None or not b:
        return "–"
    r = a / b
    num = ("%.2f" if r >= 0.095 else "%.2g") % r
    if abs(r - 1) < 0.005:
        return num + "×"
    good = r > 1 if better == "higher" else r < 1
    return "%s× (%s)" % (num, "better" if good else "worse")


def time_ratio(value, native, better):
    """The time a system took over native disk's for the same work, from two medians
    of a rate ("higher": MB/s) or of a time ("lower": s); None without both."""
    if value is None or native is None or value == 0 or native == 0:
        return None
    return native / value if better == "higher" else value / native


def pair_rows(eid, exp):
    """The passthrough on/off table of one experiment (lines of markdown), or [] unless
    both bucketfs-nopt and bucketfs have numbers in it."""
    from .report import cell
    if eid not in PAIR_EXPERIMENTS:
        return []
    fields = PAIR_FIELDS.get(eid)
    rows = []
    for m in exp.get("metrics", []):
        if m["unit"] == "count" or (fields and not m["key"].endswith(fields)):
            continue
        off, on = _median(exp, OFF, m["key"]), _median(exp, ON, m["key"])
        if off is None or on is None:
            continue
        rows.append("| %s | %s | %s | %s |" % (
            m["label"], cell(_rec(exp, OFF, m["key"])), cell(_rec(exp, ON, m["key"])),
            ratio_text(on, off, m["better"])))
    if not rows:
        return []
    opens = (exp.get("passthrough_opens") or {}).get(ON)
    said = ("" if opens is None else
            " Opens the kernel served from a local file itself on %s in this experiment "
            "(bucketfs's `bucketfs_passthrough_opens`): %d%s." % (
                ON, opens, " (no open found its file whole in the disk cache, or passthrough "
                "is off: the mount's log says why), so the pair differs by noise only"
                if not opens else ""))
    return ["", "**Passthrough on/off**: %s (`--passthrough off`) beside %s (passthrough on, "
            "the default; else the same flags), same run; the ratio is %s ÷ %s, \"better\" when passthrough "
            "helped.%s" % (OFF, ON, ON, OFF, said), "",
            "| metric | %s | %s | %s ÷ %s |" % (OFF, ON, ON, OFF), "|---|---|---|---|"] + rows


def goal_figures(doc):
    """[(experiment, metric)] of issue 27's figures this run has: the 200 MB read after the
    page cache is dropped and with it warm, fio's fsync=N write phases, `cp` of 64 MB into
    the mount, and the file system process's CPU per GB of the two cached reads."""
    exps = doc.get("experiments", {})
    want = [("2", "dropped_200M"), ("2", "again_200M"), ("3", re.compile(r".*\.write_s$")),
            ("5", "to_64M"), ("2", "cpu_fs_again_200M"), ("2", "cpu_fs_dropped_200M")]
    out = []
    for eid, key in want:
        for m in exps.get(eid, {}).get("metrics", []):
            if (m["key"] == key if isinstance(key, str) else key.match(m["key"])):
                out.append((eid, m))
    return out


def goals_table(doc):
    """The figures issue 27 sets goals by, one row each: native's median, each of
    GOAL_SYSTEMS's, each one's time ÷ native's, and bucketfs ÷ bucketfs-nopt. [] when the
    run has native and none of GOAL_SYSTEMS, or none of the figures."""
    from .report import cell, fmt
    systems = doc.get("systems", {})
    cols = [s for s in GOAL_SYSTEMS if s in systems]
    if "native" not in systems or not cols:
        return []
    exps = doc.get("experiments", {})
    rows = []
    for eid, m in goal_figures(doc):
        exp = exps[eid]
        vals = {s: _median(exp, s, m["key"]) for s in ("native",) + tuple(cols)}
        if all(v is None for v in vals.values()):
            continue
        cells = [cell(_rec(exp, s, m["key"])) for s in ("native",) + tuple(cols)]
        for s in cols:
            r = time_ratio(vals[s], vals["native"], m["better"])
            cells.append("–" if r is None else "%s×" % fmt(r))
        if OFF in cols and ON in cols:
            cells.append(ratio_text(vals[ON], vals[OFF], m["better"]))
        rows.append("| %s. %s | %s |" % (eid, m["label"], " | ".join(cells)))
    if not rows:
        return []
    head = (["figure", "native"] + cols + ["%s time ÷ native's" % s for s in cols]
            + (["%s ÷ %s" % (ON, OFF)] if OFF in cols and ON in cols else []))
    return ["## Against native disk: passthrough's figures (issue 27)", "",
            "Medians of this run. \"time ÷ native's\" is how much longer the system took than "
            "the native disk for the same work (from MB/s or seconds; 1.00× = as fast); CPU "
            "rows have no native figure (no file system process). The last column is %s ÷ %s "
            "of the figure itself, \"better\" when passthrough helped. The 200 MB reads come "
            "after experiment 2's first read of the file: \"again\" with the page cache warm, "
            "\"after the page cache is dropped\" from the mount's own cache (native: from its "
            "disk). fio's write phase is the time in its write calls before the final fsync; "
            "CPU per GB is utime+stime of the file system's process (/proc/PID/stat) around "
            "the read, over the GB read, the read starting once that process is idle (work "
            "it does in the background after the first read, such as building the file it "
            "passes through to, is not a cached read's cost)." % (ON, OFF), "",
            "| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + rows + [""]
