"""The parts of REPORT.md around the tables: store-request and cost rows, failure notes
that say why, the standing CPU note on cold reads, the history of earlier runs (from
bench/results/*.json) and README.md's headline block.
"""

import json
import math
import os
import re

from . import requests as R

README_START = "<!-- bench-headline:start"
README_END = "<!-- bench-headline:end -->"

# Why a peer fails an experiment, where the error alone does not say it. (system prefix,
# experiment, text); the error itself is quoted beside it.
KNOWN_FAILURES = [
    ("rclone-off", "3", "rclone's `--vfs-cache-mode off` refuses a file opened for reading and "
     "writing, and writes that are not sequential (rclone's VFS documentation); fio opens its "
     "files read-write"),
    ("rclone-off", "6", "git reopens the pack it is writing to read it back, which rclone "
     "without its VFS cache refuses (files open for writing cannot be read)"),
    ("mountpoint-s3", "3", "mountpoint-s3 writes a file once, in order: a random write is "
     "refused (EINVAL, out-of-order write) and after an fsync the file is uploaded, so the "
     "next write fails (EIO, upload already completed); only S3 Express One Zone buckets "
     "lift that (--incremental-upload); its sequential writes with one fsync at the end do run"),
    ("mountpoint-s3", "6", "git renames lock files into place (.git/config.lock to config). "
     "mountpoint-s3 renames with S3 Express One Zone's RenameObject call, which MinIO does not "
     "implement: it answers 200 and stores an empty object under the new name, leaving the old "
     "one, so git finds its lock file still there"),
]

# Standing notes on a system's runs of one experiment: (system, experiment, text).
SYSTEM_NOTES = [
    ("mountpoint-s3", "3", "mountpoint-s3's write jobs run with fio's `--create_on_open=1`, as "
     "its own fio write jobs do: without it fio creates each file, closes it and reopens it "
     "`O_RDWR` without `O_TRUNC`, which mountpoint-s3 opens for reading only (every write "
     "then fails with EBADF). Every other system runs the jobs without it."),
]

CPU_NOTE = ("**The machine bounds cold reads.** The proxy, the store's server and the file "
            "system share this machine's cores, and a FUSE read also pays the kernel's copy of "
            "every reply into the page cache and dd's copy out of it (at least 0.9 CPU s per GB "
            "together, measured from bucketfs's memory store). On 2 cores that caps a cold read "
            "at about 74% of a minimal client's parallel download, whatever the network allows; "
            "see bench/README.md, \"What that means for a cold read\".")


def commit_of(doc):
    """The git commit bucketfs was built at, from meta or a bucketfs system's version."""
    if doc.get("meta", {}).get("commit"):
        return doc["meta"]["commit"]
    for e in doc.get("systems", {}).values():
        m = re.search(r"repo at git ([0-9a-f]+)", e.get("version") or "")
        if m:
            return m.group(1)
    return None


def _per_run(rec, value):
    return {"median": value / max(1, rec.get("runs") or 1)}


def request_rows(exp, cols, refs, ratio_cells):
    """Table rows of one experiment's store requests per run: MinIO's total, by kind, the
    cost, and bucketfs's own count; a ratio column as for the metrics."""
    reqs = exp.get("requests") or {}
    if not reqs:
        return []
    rows = []

    def row(label, key, value_of):
        res, cells = {}, []
        for s in cols:
            rec = reqs.get(s)
            v = value_of(rec) if rec and "error" not in rec else None
            if rec and "error" in rec:
                cells.append("failed")
            elif v is None:
                cells.append("–")
            else:
                res[s] = {key: _per_run(rec, v)}
                cells.append(_fmt(res[s][key]["median"], key == "cost"))
        if not res:
            return
        m = {"key": key, "better": "lower"}
        rows.append("| " + " | ".join([label] + cells + ratio_cells(m, res, cols, refs)) + " |")

    row("store requests per run, MinIO's count", "total", lambda r: r.get("total"))
    kinds = [k for k in R.KINDS if any((r.get("kinds") or {}).get(k) for r in reqs.values())]
    for k in kinds:
        row("&nbsp;&nbsp;of which %s" % k, k, lambda r, k=k: (r.get("kinds") or {}).get(k))
    row("bucketfs's own count per run (store calls)", "own",
        lambda r: sum(r["bucketfs"].values()) if r.get("bucketfs") is not None else None)
    row("request cost per run, S3 Standard (USD)", "cost", lambda r: r.get("cost_usd"))
    return rows


def _fmt(v, money=False):
    if money:  # three significant digits, never in exponent form: $0.000315
        if not v:
            return "$0"
        decimals = max(2, 2 - math.floor(math.log10(abs(v))))
        return "$" + ("%.*f" % (decimals, v))
    if v == int(v):
        return "{:,}".format(int(v))
    return "%.1f" % v


def failure_lines(eid, exp, cols):
    """One line per system that failed (or had no number) in this experiment: the error
    and, where known, why."""
    out = []
    for s in cols:
        res = exp.get("results", {}).get(s, {})
        msgs = sorted({r["error"] for r in res.values() if "error" in r})
        if msgs:
            why = next((w for p, e, w in KNOWN_FAILURES if s.startswith(p) and e == eid), None)
            line = "- **%s** failed in %d of %d metrics: `%s`" % (
                s, sum("error" in r for r in res.values()), len(res),
                msgs[0].replace("`", "'").replace("\n", " ")[:300])
            if len(msgs) > 1:
                line += " (and %d other errors)" % (len(msgs) - 1)
            if why:
                line += ". Why: " + why + "."
            out.append(line)
        details = sorted({r.get("detail", "") for r in res.values()
                          if "na" in r and r.get("detail")})
        if details:
            out.append("- **%s** n/a because: `%s`" % (s, details[0].replace("`", "'")
                                                      .replace("\n", " ")[:300]))
    return out


WRITE_BACK_NOTE = ("Systems that upload after `close` returns (bucketfs-wb; rclone-full, whose "
                   "cache uploads 5 s later) may never upload a file deleted soon after it was "
                   "written: their low PUT and DELETE counts here are that, not a lost write.")


def proxy_lines(exp):
    """Systems whose load made toxiproxy (the link's latency) grow past its limit: it was
    restarted mid-experiment, cutting their connections, so their figures are affected."""
    L = []
    for name, r in sorted((exp.get("proxy_restarts") or {}).items()):
        failed = (" (%d restart(s) failed: the link was down for the rest of the experiment, "
                  "so jobs after it timed out)" % r["failed"]) if r.get("failed") else ""
        L.append("- %s: under its load toxiproxy grew past %d MB (peak seen %d MB) and was "
                 "restarted %d time(s) mid-experiment%s, cutting its connections; its figures "
                 "here are affected." % (name, r["limit_mb"], r["peak_mb"], r["restarts"], failed))
    return [""] + L if L else []


def standing_notes(eid, exp):
    """Notes that hold for every run of an experiment."""
    out = []
    for s, e, text in SYSTEM_NOTES:
        if e == eid and s in (exp.get("results") or {}):
            out += ["", text]
    if eid == "2":
        return out + ["", CPU_NOTE]
    if eid in ("4", "5", "6") and any(s in (exp.get("requests") or {})
                                      for s in ("bucketfs-wb", "rclone-full")):
        return out + ["", WRITE_BACK_NOTE]
    return out


def requests_section(doc):
    """How the requests were counted and priced, and one table over all experiments."""
    exps = {e: x for e, x in doc.get("experiments", {}).items() if x.get("requests")}
    L = ["## Store requests and their cost", ""]
    if not exps:
        return L + ["This run predates request counting (bench/run counts MinIO's requests "
                    "per experiment from 2026-11-26 on).", ""]
    L += ["Counted by MinIO itself (`minio_s3_requests_total` by API at "
          "`/minio/v2/metrics/node`): before and after each experiment on each S3 system a "
          "marker request is sent and the counters are read until they include it and two "
          "reads agree (they lag by up to about 10 s). The markers and the harness's own "
          "requests (experiment 2's paired download) are taken out. Per run = the "
          "experiment's total over all its runs ÷ runs, including its mounts and unmounts. "
          "GCS systems are not counted (the emulator has no counters). bucketfs's own count "
          "(`bucketfs_store_requests_total` at `--metrics-addr`, read just before each "
          "unmount) is a cross-check: it counts calls of its store layer (a multipart upload "
          "is one call) and misses what an unmount sends (write-back's last uploads).", "",
          "Priced at %s, as recorded on %s. The cost is of the requests only (no storage or "
          "transfer)." % (R.PRICE_SOURCE, R.PRICES_DATE), ""]
    names = list(doc["systems"]) + [c for x in exps.values() for c in x.get("columns") or {}]
    systems = [s for i, s in enumerate(names) if s not in names[:i]
               and any(s in x["requests"] for x in exps.values())]
    L += ["| experiment | " + " | ".join(systems) + " |", "|---|" + "---|" * len(systems)]
    for eid in sorted(exps, key=int):
        cells = []
        for s in systems:
            rec = exps[eid]["requests"].get(s) or {}
            if "total" in rec:
                n = max(1, rec.get("runs") or 1)
                cells.append("%s req, %s" % (_fmt(rec["total"] / n),
                                            _fmt(rec["cost_usd"] / n, True)))
            elif "bucketfs" in rec:
                cells.append("%s calls (own count)" % _fmt(
                    sum(rec["bucketfs"].values()) / max(1, rec.get("runs") or 1)))
            else:
                cells.append("–")
        L.append("| %s. %s | %s |" % (eid, exps[eid]["title"].split(":")[0], " | ".join(cells)))
    return L + [""]


# ---- headline numbers ------------------------------------------------------------------
def _median(doc, eid, key, system):
    rec = doc.get("experiments", {}).get(eid, {}).get("results", {}).get(system, {}).get(key)
    return rec.get("median") if isinstance(rec, dict) else None


def _metric(doc, eid, key):
    exp = doc.get("experiments", {}).get(eid, {})
    return next((m for m in exp.get("metrics", []) if m["key"] == key), None)


def _best_peer(doc, eid, key, better):
    best = None
    for s, res in doc.get("experiments", {}).get(eid, {}).get("results", {}).items():
        if s.startswith("bucketfs") or s == "native" or s.startswith("link"):
            continue
        rec = res.get(key)
        if isinstance(rec, dict) and "median" in rec:
            v = rec["median"]
            if best is None or (v < best[1] if better == "lower" else v > best[1]):
                best = (s, v)
    return best


def _largest(doc, eid, prefix):
    keys = [m["key"] for m in doc.get("experiments", {}).get(eid, {}).get("metrics", [])
            if re.fullmatch(prefix + r"\d+M", m["key"])]
    keys = [k for k in keys if _median(doc, eid, k, "bucketfs") is not None]
    return max(keys, key=lambda k: int(re.search(r"(\d+)M$", k).group(1))) if keys else None


def headline_items(doc, bucketfs="bucketfs"):
    """[(title, [(what, value text, comparison text)])] for the headline's metrics this
    run has: bucketfs's median against the best peer's."""
    cold, warm = _largest(doc, "2", "first_"), _largest(doc, "2", "again_")
    size = re.search(r"(\d+)M$", cold or warm or "0M").group(1)
    create = _metric(doc, "4", "create_s")
    nfiles = re.search(r"\d[\d,]*", create["label"]).group(0) if create else "?"
    groups = [("listing, `find` over 2,000 files", [("first", "1", "find_first_s", " s"),
                                                    ("again", "1", "find_again_s", " s")]),
              ("reading %s MB" % size, [("cold", "2", cold, " MB/s"),
                                        ("warm", "2", warm, " MB/s")]),
              ("%s small files" % nfiles, [("create", "4", "create_s", " s"),
                                           ("stat", "4", "stat_s", " s")]),
              ("git clone", [("", "6", "clone_s", " s")]),
              ("cp 64 MB into the mount", [("", "5", "to_64M", " MB/s")]),
              ("peak memory during reads", [("", "7", "peak_2", " MiB")]),
              ("`bucketfs cp` of 1 GiB", [("down", "8", "down_MBps", " MB/s"),
                                          ("up", "8", "up_MBps", " MB/s")]),
              # the same mount with `--write-back` (uploads after close): bucketfs-wb
              ("with `--write-back`", [("create %s small files" % nfiles, "4", "create_s",
                                        " s", "bucketfs-wb"),
                                       ("git clone", "6", "clone_s", " s", "bucketfs-wb"),
                                       ("cp 64 MB in", "5", "to_64M", " MB/s",
                                        "bucketfs-wb")])]
    out = []
    for title, picks in groups:
        items = []
        for what, eid, key, unit, *column in picks:
            col = "bucketfs cp" if eid == "8" else (column[0] if column else bucketfs)
            v = _median(doc, eid, key, col) if key else None
            m = _metric(doc, eid, key) if key else None
            if v is None or m is None:
                continue
            best = _best_peer(doc, eid, key, m["better"])
            cmp_ = ""
            if best and best[1] and v:
                gain = best[1] / v if m["better"] == "lower" else v / best[1]
                word = ("faster", "slower") if unit != " MiB" else ("less", "more")
                cmp_ = "%.1f× %s than %s" % (max(gain, 1 / gain), word[gain < 1], best[0])
            items.append((what, _num(v) + unit, cmp_))
        if items:
            out.append((title, items))
    return out


def _num(v):
    return "%.3g" % v if v < 100 else "{:,}".format(round(v))


def _group_text(items):
    return ", ".join("%s%s%s" % (w + " " if w else "", v, " (%s)" % c if c else "")
                     for w, v, c in items)


def readme_headline(doc, json_path):
    meta = doc["meta"]
    rel = "bench/results/" + os.path.basename(json_path)
    items = headline_items(doc)
    L = ["%s (generated by `bench/run --report-only` from %s; do not edit) -->" % (
            README_START, rel),
         "**Benchmark** ([bench/REPORT.md](bench/REPORT.md); run of %s at git %s, %s, %s "
         "profile%s; medians; bucketfs against the best of its peers in the same run):" % (
             (meta.get("started") or "?")[:10], commit_of(doc) or "?",
             "`--quick`" if meta.get("quick") else "full suite", meta.get("profile"),
             ": MinIO and the GCS emulator behind 10 ms each way"
             if meta.get("profile") == "cloud" else "")]
    for title, group in items:
        L.append("- %s: %s" % (title, _group_text(group)))
    return L + [README_END]


def write_readme_block(readme_path, lines):
    """Replace the text between the markers; False if README.md has no markers."""
    try:
        with open(readme_path) as f:
            text = f.read()
    except OSError:
        return False
    a, b = text.find(README_START), text.find(README_END)
    if a < 0 or b < a:
        return False
    new = text[:a] + "\n".join(lines) + text[b + len(README_END):]
    if new != text:
        with open(readme_path, "w") as f:
            f.write(new)
    return True


# ---- history ---------------------------------------------------------------------------
def history(results_dir, current, rel_results):
    """A table of every run in results_dir: date, commit, what ran, headline."""
    rows = []
    for name in sorted(os.listdir(results_dir)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(results_dir, name)
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue
        meta = doc.get("meta", {})
        what = "%s %s, exp %s, %d systems" % (
            "quick" if meta.get("quick") else "full", meta.get("profile"),
            ",".join(sorted(doc.get("experiments", {}), key=int)), len(doc.get("systems", {})))
        if meta.get("resumed"):
            what += ", resumed"
        head = "; ".join("%s: %s" % (t, _group_text(g))
                         for t, g in headline_items(doc)[:2]) or "–"
        this = " (this report)" if os.path.abspath(path) == current else ""
        rows.append((meta.get("started") or "", "| %s | %s | [%s](%s/%s)%s | %s | %s |" % (
            (meta.get("started") or "?")[:16].replace("T", " "), commit_of(doc) or "?",
            name, rel_results, name, this, what, head)))
    if not rows:
        return []
    return (["## History", "",
             "Every run kept in %s/, oldest first (headline: bucketfs's first numbers, against "
             "the best peer of that run; `bench/run --compare OLD.json NEW.json` compares two "
             "runs metric by metric)." % rel_results, "",
             "| started (UTC) | commit | results | run | headline |", "|---|---|---|---|---|"]
            + [r for _, r in sorted(rows)] + [""])
