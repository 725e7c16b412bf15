"""`bench/run --compare OLD.json [NEW.json]`: per metric and system, NEW's change from OLD.

Every (experiment, metric, system) with a median in both runs is one row: the two medians,
NEW ÷ OLD, and a mark: "REGRESSION" where NEW is worse than OLD by more than the threshold
(slower, fewer MB/s, more memory, more requests), "better" where it is better by as much.
The store requests per run and their cost (requests.py) are compared the same way, as
metrics where lower is better. Experiment 8's columns are tools, compared the same way.
"""

import json


def _medians(doc):
    """{(experiment, metric key, system): (label, better, median, position)}"""
    out = {}
    for eid, exp in doc.get("experiments", {}).items():
        metrics = {m["key"]: dict(m, pos=i) for i, m in enumerate(exp.get("metrics", []))}
        for system, res in exp.get("results", {}).items():
            for key, rec in res.items():
                m = metrics.get(key)
                if m and m.get("unit") != "count" and isinstance(rec, dict) and "median" in rec:
                    out[(eid, key, system)] = (m["label"], m["better"], rec["median"], m["pos"])
        for system, rec in exp.get("requests", {}).items():
            if "total" in rec and rec.get("runs"):
                out[(eid, "requests", system)] = ("store requests per run (MinIO)", "lower",
                                                 rec["total"] / rec["runs"], 1000)
                out[(eid, "cost", system)] = ("request cost per run (USD)", "lower",
                                             rec["cost_usd"] / rec["runs"], 1001)
    return out


def change(old, new, better, threshold_pct):
    """(NEW ÷ OLD, mark) for one metric; mark is "REGRESSION", "better" or ""."""
    if old == 0:
        return (None, "" if new == 0 else ("REGRESSION" if better == "lower" else "better"))
    ratio = new / old
    gain = ratio if better == "higher" else (1 / ratio if ratio else float("inf"))
    limit = 1 + threshold_pct / 100.0
    if gain < 1 / limit:
        return ratio, "REGRESSION"
    if gain > limit:
        return ratio, "better"
    return ratio, ""


def _fmt(v):
    if v is None:
        return "–"
    a = abs(v)
    if v == int(v) and a < 1e15:
        return "{:,}".format(int(v))
    if a >= 100:
        return "%.0f" % v
    if a >= 1:
        return "%.2f" % v
    return "%.3g" % v


def compare_docs(old, new, threshold_pct=10.0, names=("OLD", "NEW")):
    """Markdown lines comparing two result documents, and the number of regressions."""
    a, b = _medians(old), _medians(new)
    lines = ["# %s compared with %s" % (names[1], names[0]), ""]
    for label, doc in zip(names, (old, new)):
        m = doc.get("meta", {})
        lines.append("- %s: started %s, git %s, profile %s, %s" % (
            label, m.get("started"), m.get("commit") or _commit_of(doc), m.get("profile"),
            "--quick" if m.get("quick") else "full"))
    mo, mn = old.get("meta", {}), new.get("meta", {})
    if (mo.get("profile"), bool(mo.get("quick"))) != (mn.get("profile"), bool(mn.get("quick"))):
        lines.append("- the two runs differ in profile or mode: their numbers are not "
                     "measured alike")
    lines += ["", "Threshold: a change worse than %g%% is a REGRESSION." % threshold_pct, "",
              "| exp | metric | system | old | new | new ÷ old | |", "|---|---|---|---|---|---|---|"]
    regressions = better = 0

    def order(k):
        return (int(k[0]) if k[0].isdigit() else 99, b[k][3], k[2])
    for key in sorted(set(a) & set(b), key=order):
        label, direction, vo, _ = a[key]
        vn = b[key][2]
        ratio, mark = change(vo, vn, direction, threshold_pct)
        regressions += mark == "REGRESSION"
        better += mark == "better"
        lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            key[0], label, key[2], _fmt(vo), _fmt(vn),
            "%.2f×" % ratio if ratio is not None else "–", mark))
    only = len(set(a) ^ set(b))
    lines += ["", "%d compared, %d regressions, %d better; %d measured in only one run." % (
        len(set(a) & set(b)), regressions, better, only)]
    return lines, regressions


def _commit_of(doc):
    import re
    for e in doc.get("systems", {}).values():
        m = re.search(r"repo at git ([0-9a-f]+)", e.get("version") or "")
        if m:
            return m.group(1)
    return None


def compare_files(old_path, new_path, threshold_pct=10.0):
    with open(old_path) as f:
        old = json.load(f)
    with open(new_path) as f:
        new = json.load(f)
    return compare_docs(old, new, threshold_pct, (old_path, new_path))
