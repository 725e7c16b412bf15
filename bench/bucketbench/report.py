"""Turns a results JSON into bench/REPORT.md and one PNG chart per experiment
(bench/results/<stem>-exp<N>.png); the store requests, cost, failure notes, history and
README.md's headline come from summary.py.

Each experiment gets a table with one column per system: the median, and
min-max when there were several runs; "n/a (...)" or "failed" where there is
no number, with the error messages listed under the table. The last column is
the ratio of bucketfs's median to the best peer's (native disk and bucketfs
itself are not peers); it is filled only where bucketfs has a number. Experiments 2, 3
and 5 also get a passthrough on/off table, and the report a table of passthrough's
figures against native disk (pairs.py).
"""

import json
import os
import re

PEER_EXCLUDE = ("native",)


def is_bucketfs(name):
    return name.startswith("bucketfs")


def fmt(v):
    if v is None:
        return "–"
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 100:
        return "%.0f" % v
    if a >= 10:
        return "%.1f" % v
    if a >= 1:
        return "%.2f" % v
    if a >= 0.01:
        return "%.3f" % v
    return "%.2g" % v


def cell(rec):
    if rec is None:
        return "–"
    if "na" in rec:
        return rec["na"]
    if "error" in rec:
        return "failed"
    s = fmt(rec["median"])
    if rec.get("n", 1) > 1:
        s += " (%s–%s)" % (fmt(rec["min"]), fmt(rec["max"]))
    return s


def not_run(res):
    """Whether a system's results in one experiment say it was not run there (a system
    limited to some experiments: systems.py's `only`); such a column is left out."""
    return bool(res) and all(isinstance(r, dict) and str(r.get("na", "")).startswith("not run")
                             for r in res.values())


def numeric(rec):
    return rec is not None and "median" in rec


def best_peer(metric, results, systems, exclude=()):
    best = None
    for s in systems:
        if is_bucketfs(s) or s in PEER_EXCLUDE or s in exclude:
            continue
        rec = results.get(s, {}).get(metric["key"])
        if not numeric(rec):
            continue
        v = rec["median"]
        if best is None or (v < best[1] if metric["better"] == "lower" else v > best[1]):
            best = (s, v)
    return best


def ratio_cells(metric, results, systems, references=()):
    """bucketfs ÷ best peer for each bucketfs column, then bucketfs ÷ each of
    `references` (columns that are limits, not peers)."""
    out = []
    best = best_peer(metric, results, systems, tuple(references))
    bfs = [s for s in systems if is_bucketfs(s)]
    for b in bfs:
        rec = results.get(b, {}).get(metric["key"])
        if not numeric(rec) or best is None or best[1] == 0:
            out.append("–")
        else:
            out.append("%.2f× (vs %s)" % (rec["median"] / best[1], best[0]))
    for reference, b in ((r, b) for r in references for b in bfs):
        rec = results.get(b, {}).get(metric["key"])
        ref = results.get(reference, {}).get(metric["key"])
        if not numeric(rec) or not numeric(ref) or ref["median"] == 0:
            out.append("–")
        else:
            out.append("%.0f%%" % (100 * rec["median"] / ref["median"]))
    return out


def short_label(label):
    label = re.sub(r"\s*\([^)]*\)\s*$", "", label)
    return re.sub(r": (bw|iops|lat_mean|lat_p99)$", "", label)


def chart(path, exp, systems):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    specs = exp.get("charts") or []
    if not specs:
        return False
    metrics = {m["key"]: m for m in exp["metrics"]}
    width_in = max(8, 1.3 * max(len(s["keys"]) for s in specs) + 2) + 1.5
    fig, axes = plt.subplots(len(specs), 1, figsize=(width_in, 4.2 * len(specs)), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    color_of = {s: colors[i % len(colors)] for i, s in enumerate(systems)}
    any_data = False
    for ax, spec in zip(axes[:, 0], specs):
        keys = [k for k in spec["keys"] if k in metrics]

        def usable(rec):
            return numeric(rec) and (rec["median"] > 0 or not spec.get("log"))
        with_data = [s for s in systems
                     if any(usable(exp["results"].get(s, {}).get(k)) for k in keys)]
        without = [s for s in systems if s not in with_data]
        width = 0.8 / max(1, len(with_data))
        for i, s in enumerate(with_data):
            xs, ys, lo, hi = [], [], [], []
            for j, k in enumerate(keys):
                rec = exp["results"].get(s, {}).get(k)
                if usable(rec):
                    xs.append(j - 0.4 + width * (i + 0.5))
                    ys.append(rec["median"])
                    lo.append(rec["median"] - rec["min"])
                    hi.append(rec["max"] - rec["median"])
            any_data = True
            ax.bar(xs, ys, width, label=s, color=color_of[s],
                   yerr=[lo, hi], capsize=2, error_kw={"elinewidth": 0.8})
        title = spec["title"]
        if without:
            title += "\n(no number: %s)" % ", ".join(without)
        ax.set_xticks(range(len(keys)))
        labels = [short_label(metrics[k]["label"]) for k in keys]
        tilt = len(keys) > 4 or max(len(x) for x in labels) > 18
        ax.set_xticklabels(labels, rotation=20 if tilt else 0, ha="right" if tilt else "center",
                           fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(spec.get("ylabel", ""))
        if spec.get("log"):
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
        if with_data:  # outside the axes, so it never hides a bar
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("Experiment %s: %s" % (exp["id"], exp["title"]), fontsize=11)
    fig.text(0.01, 0.005, "bars: median; whiskers: min–max", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return any_data


def headline(doc, systems):
    """A few key numbers from each experiment that ran."""
    picks = [("1", "find_first_s"), ("1", "find_again_s"), ("1", "mount_s"),
             ("2", "first_200M"), ("2", "again_200M"), ("4", "create_s"),
             ("5", "to_64M"), ("6", "total_s"), ("7", "peak_2")]
    rows = []
    for eid, key in picks:
        exp = doc["experiments"].get(eid)
        if not exp:
            continue
        m = next((m for m in exp["metrics"] if m["key"] == key), None)
        if not m:
            continue
        cells = []
        for s in systems:
            rec = exp["results"].get(s, {}).get(key)
            cells.append(fmt(rec["median"]) if numeric(rec) else ("n/a" if rec and "na" in rec
                                                                  else "failed" if rec else "–"))
        rows.append("| %s. %s | %s |" % (eid, m["label"], " | ".join(cells)))
    if not rows:
        return []
    return (["## Headline (medians)", "", "| metric | %s |" % " | ".join(systems),
             "|---|%s" % ("---|" * len(systems))] + rows + [""])


def write_report(json_path, bench_dir, out_path=None):
    """Write the report of one run (bench/REPORT.md unless `out_path`); returns its text."""
    from . import pairs, plan, summary
    with open(json_path) as f:
        doc = json.load(f)
    out_path = out_path or os.path.join(bench_dir, "REPORT.md")
    stem = os.path.splitext(os.path.basename(json_path))[0]
    results_dir = os.path.dirname(os.path.abspath(json_path))
    rel_results = os.path.relpath(results_dir, os.path.dirname(os.path.abspath(out_path)))
    meta = doc["meta"]
    systems = list(doc["systems"])
    commit = meta.get("commit") or summary.commit_of(doc)
    planned = meta.get("runs") is None  # repetitions from plan.py, not --runs N
    L = ["# bucketfs benchmark report", "",
         "Generated by `bench/run` from [`%s/%s.json`](%s/%s.json) (bucketfs at git %s). "
         "Only numbers measured in that run appear here; earlier runs are listed under "
         "[History](#history)." % (rel_results, stem, rel_results, stem, commit or "?"),
         ""]
    mach = meta.get("machine", {})
    phases = meta.get("phases", {})
    L += ["## Run", "",
          "| | |", "|---|---|",
          "| started (UTC) | %s |" % meta.get("started"),
          "| profile | **%s**: %s%s |" % (meta.get("profile"), meta.get("latency"),
                                          ", bandwidth cap %s MB/s" % meta["bandwidth_MBps"]
                                          if meta.get("bandwidth_MBps") else ""),
          "| mode | %s |" % mode_text(meta),
          "| command | `bench/run %s` |" % " ".join(meta.get("argv", [])),
          "| wall time | %s |" % ", ".join("%s %.0fs" % (k[:-2], v) for k, v in phases.items()),
          "| machine | %s cores (nproc), %s GiB memory, kernel %s, %s, %s; load average "
          "%s at start |" % (mach.get("nproc"), mach.get("memory_gib"), mach.get("kernel"),
                             mach.get("cpu", "?"), mach.get("os", "?"),
                             mach.get("loadavg_at_start", "?")),
          "| servers | %s |" % ", ".join("%s (%s)" % (k, v) for k, v in
                                        (meta.get("server_versions") or {}).items()),
          ""]
    for r in meta.get("resumed", []):
        L += ["**Resumed** at %s (bucketfs at git %s): the run was interrupted and continued "
              "with `bench/run --resume`; the %d (experiment, system) results measured before "
              "were kept, the rest measured in the new session." % (
                  r.get("at"), r.get("commit") or "?", r.get("kept_cells", 0)), ""]
    if meta.get("install_failures"):
        L += ["Install failures: " + "; ".join("%s: %s" % kv for kv in
                                                meta["install_failures"].items()), ""]
    L += ["## Systems", "", "| system | backend | version | status |", "|---|---|---|---|"]
    for s, e in doc["systems"].items():
        status = e["status"]
        if e.get("errors") and status == "failed":
            status += ": " + e["errors"][0].replace("|", "\\|").replace("\n", " ")[:300]
        elif e.get("errors"):
            status += "; failed in experiment(s) %s (details under each)" % ", ".join(
                sorted({x.split(":")[0].replace("exp ", "") for x in e["errors"]}))
        if e.get("earlier_version"):
            status += "; before the run was resumed: %s" % e["earlier_version"]
        L.append("| %s | %s | %s | %s |" % (s, e.get("backend"), e.get("version") or "–", status))
    notes = ["- **%s**: %s" % (s, e["note"]) for s, e in doc["systems"].items() if e.get("note")]
    if notes:
        L += [""] + notes
    L += ["", "Peers for the ratio column are every system except native disk (the floor) and "
          "bucketfs. For times a ratio above 1 means bucketfs is slower; for MB/s and IOPS a "
          "ratio above 1 means bucketfs is faster.", ""]
    L += headline(doc, systems)
    L += pairs.goals_table(doc)
    for eid in sorted(doc["experiments"], key=int):
        exp = doc["experiments"][eid]
        exp["id"] = eid
        L += ["## Experiment %s: %s" % (eid, exp["title"]), ""]
        # a standalone experiment (8) has its own columns (tools) and maybe references
        # (limits, not peers: one name, or a list in results from 2026-11-24 on)
        cols = list(exp["columns"]) if "columns" in exp else [
            s for s in systems if not not_run(exp["results"].get(s))]
        ref = exp.get("reference") if "columns" in exp else None
        refs = [ref] if isinstance(ref, str) else list(ref or [])
        for line in exp.get("description", []):
            L += [line, ""]
        if "columns" in exp and exp["columns"]:
            L += ["| tool | version |", "|---|---|"]
            L += ["| %s | %s |" % (c, (v or "–").replace("|", "\\|").replace("\n", " "))
                  for c, v in exp["columns"].items()] + [""]
        counted = {m["key"] for m in exp["metrics"] if m["unit"] != "count"}
        if "runs" in exp:  # recorded from 2026-12 on (plan.py)
            L += [plan.describe(eid, exp["runs"], planned and not meta.get("quick"),
                                2 if eid == "5" else 1), ""]
        else:
            ns = sorted({r.get("n") for res in exp["results"].values() for k, r in res.items()
                         if k in counted and numeric(r) and r.get("n")})
            if ns:
                runs = str(ns[0]) if len(ns) == 1 else "%d–%d" % (ns[0], ns[-1])
                L += ["Runs per system: %s." % runs, ""]
        skipped = [next(iter(exp["results"][s].values()))["na"][len("not run: "):]
                   for s in systems if not_run(exp["results"].get(s))]
        if skipped:
            L += ["Not run here: %s." % "; ".join(skipped), ""]
        png = "%s-exp%s.png" % (stem, eid)
        try:
            if chart(os.path.join(results_dir, png), exp, cols):
                L += ["![experiment %s](%s/%s)" % (eid, rel_results, png), ""]
        except Exception as e:  # a chart problem must not lose the tables
            L += ["(chart failed: %s)" % e, ""]
        cbfs = [c for c in cols if is_bucketfs(c)]
        head = (["metric"] + cols + ["%s ÷ best peer" % b for b in cbfs]
                + ["%s ÷ %s" % (b, r) for r in refs for b in cbfs])
        L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for m in exp["metrics"]:
            row = [m["label"]] + [cell(exp["results"].get(s, {}).get(m["key"])) for s in cols]
            row += ratio_cells(m, exp["results"], cols, refs)
            L.append("| " + " | ".join(row) + " |")
        L += summary.request_rows(exp, cols, refs, ratio_cells)
        L += pairs.pair_rows(eid, exp)
        errs = summary.failure_lines(eid, exp, cols)
        if errs:
            L += [""] + errs
        L += summary.proxy_lines(exp)
        L += summary.standing_notes(eid, exp)
        secs = exp.get("seconds", {})
        if secs:
            L += ["", "Time spent: " + ", ".join("%s %.0fs" % kv for kv in secs.items())]
        L.append("")
    L += summary.requests_section(doc)
    L += summary.history(results_dir, os.path.abspath(json_path), rel_results)
    md = "\n".join(L)
    with open(out_path, "w") as f:
        f.write(md)
    return md


def mode_text(meta):
    """The run table's mode: --quick, or full with its repetitions."""
    if meta.get("quick"):
        return "--quick (one repetition)"
    reps = meta.get("repetitions")
    if not reps:
        return "full (runs per measurement: see each experiment)"
    how = ("`--runs %d`" % meta["runs"] if meta.get("runs") else
           "plan.py: 3 where figures move between runs, 1 where they do not")
    return "full; repetitions per experiment %s (%s)" % (
        ", ".join("%s: %d" % kv for kv in reps.items()), how)


def main_json(results_dir):
    """The newest untagged run in `results_dir` (named <date>-<profile>.json)."""
    names = sorted(n for n in os.listdir(results_dir)
                   if re.fullmatch(r"\d{4}-\d\d-\d\d-(lan|cloud)\.json", n))
    if not names:
        raise SystemExit("no untagged results JSON in %s" % results_dir)
    return os.path.join(results_dir, names[-1])


def update_readme(json_path, readme_path):
    """Rewrite the headline block of README.md (between its markers) from a run."""
    from . import summary
    with open(json_path) as f:
        doc = json.load(f)
    return summary.write_readme_block(readme_path, summary.readme_headline(doc, json_path))
