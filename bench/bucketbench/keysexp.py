"""Experiment 10: the million-key bucket (keyseed.py has its layout, MinIO and seeding).

Per system, on a fresh mount of the keys' bucket (through its own toxiproxy proxy, with the
profile's latency): the mount time; `ls -l` of big/ (100,000 keys at full scale); then on
a second fresh mount (so it is cold, as the listing it is compared with) `find` over the
whole bucket and `stat` of 10,000 paths drawn with a fixed seed; the file system
process's peak RSS (the higher VmHWM of the two mounts); and the store requests of each step, counted by the
keys' MinIO (requests.py's settled snapshots between the steps). Every step is checked
(the entries listed, every stat answered) and has a timeout; a system that exceeds it is
recorded as failed at that step and the next step still runs.

The floor for `find`: a raw paged listing of the same keys (boto3 ListObjectsV2, pages of
1,000, no delimiter) through the same proxy after the page cache is dropped, measured once
after every system; each system's `find` is given as a multiple of it (the issue's goal:
bucketfs within 1.2x).

GCS: the emulator keeps every object in memory and is empty at each start, so its bucket is
seeded at each run, capped at `--gcs-keys` keys (default 100,000; big/ first, then whole
directories: keyseed.capped_layout), for at most `--gcs-seed-limit` seconds (it slows as it
fills); the GCS systems run on the keys that went in. Where it stops, the report says so.
Native disk gets the same layout as files in <workdir>/keys-native (made once).
"""

import concurrent.futures
import http.client
import json
import os
import sys
import time
import urllib.parse

from . import keyseed as K
from . import servers as S
from .experiments import M, Experiment, fresh_mount
from .util import (CmdError, drop_caches, error, log, na, read_status, run, summarize)

STAT_SAMPLE = 10000
STEPS = ("mount", "ls", "find", "stat")
# stat each path; past the deadline (argv[2] seconds) stop and say how many were done
STAT_CODE = ("import os, sys, time\n"
             "paths = open(sys.argv[1]).read().split('\\n')\n"
             "t, n = time.monotonic(), 0\n"
             "for p in paths:\n"
             "    os.stat(p)\n"
             "    n += 1\n"
             "    if time.monotonic() - t > float(sys.argv[2]):\n"
             "        break\n"
             "print('%.6f %d' % (time.monotonic() - t, n))\n")


def step_timeout(keys):
    """Seconds each step may take: at least 5 minutes, and 2 ms per key of the bucket."""
    return max(300.0, 0.002 * keys)


class ManyKeys(Experiment):
    id = 10
    title = "The million-key bucket: mount, ls -l of 100,000 entries, find, stat, RSS, requests"
    counts_requests = False  # its own MinIO, counted step by step here

    def __init__(self):
        self.server = None
        self.seed = None
        self.gcs = None  # {layout, seeded, seconds, error, complete}
        self.stores = {}  # system -> its store, for the listing it is compared with

    def layout(self, ctx):
        return K.parse_layout(getattr(ctx.args, "keys", None) or K.FULL_LAYOUT)

    def metrics(self, ctx):
        d, k, b = self.layout(ctx)
        ms = [M("mount_s", "mount (s)", "s", "lower"),
              M("ls_s", "ls -l of big/ (%s entries at S3 scale) (s)" % "{:,}".format(b), "s",
                "lower"),
              M("find_s", "find over the bucket (s)", "s", "lower"),
              M("find_vs_list", "find ÷ raw paged listing of the same store (x)", "x", "lower"),
              M("stat_s", "stat of %s random paths (s)" % "{:,}".format(
                  min(STAT_SAMPLE, K.total_keys((d, k, b)))), "s", "lower"),
              M("peak_rss", "peak RSS of the file system process, VmHWM (MiB)", "MiB", "lower"),
              M("keys", "keys in the bucket mounted", "count", "higher")]
        for step in STEPS:
            ms.append(M("req_" + step, "store requests: %s" % step, "count", "lower"))
        return ms

    def charts(self, ctx):
        return [{"title": "million-key bucket (s, log scale)", "ylabel": "seconds", "log": True,
                 "keys": ["mount_s", "ls_s", "find_s", "stat_s"]}]

    # ---- setup, once per run ----------------------------------------------------------------
    def prepare(self, ctx, srv):
        layout = self.layout(ctx)
        self.server = K.KeysMinio(ctx.workdir, S.KEYS_MINIO_PORT, S.KEYS_CONSOLE_PORT,
                                  S.ACCESS_KEY, S.SECRET_KEY, S.REGION)
        srv.on_stop.append(self.server.stop)
        self.server.start()
        limit = getattr(ctx.args, "seed_limit", 25.0) * 60
        self.seed = K.ensure_seed(self.server, layout, limit, log=log)
        if self.seed.get("stopped"):
            return "exp 10: not seeded: %s" % self.seed["stopped"]
        _native_tree(ctx, layout)
        if any(n.endswith("gcs") or n == "gcsfuse" for n in ctx.args.system_list):
            self.gcs = seed_gcs(K.capped_layout(layout, getattr(ctx.args, "gcs_keys", 100000)),
                                getattr(ctx.args, "gcs_seed_limit", 300.0))
        return "exp 10: %s keys ready (%s)" % ("{:,}".format(K.total_keys(layout)),
                                              "kept from an earlier run" if self.seed.get("reused")
                                              else "seeded in %.0f s" % self.seed["seed_s"])

    def describe(self, ctx):
        layout = self.layout(ctx)
        L = ["Layout %s: %s directories of %s keys and big/ of %s, %s keys of %d bytes each, "
             "in a MinIO of their own whose data is kept between runs (keyseed.py)." % (
                 K.layout_text(layout), "{:,}".format(layout[0]), "{:,}".format(layout[1]),
                 "{:,}".format(layout[2]), "{:,}".format(K.total_keys(layout)), len(K.BODY))]
        if self.seed:
            s = self.seed
            L.append("Seeding (outside the measurements): a trial of %s PUTs took %.1f s "
                     "(%.0f keys/s, %d processes x %d threads), an estimate of %.0f s for all; "
                     % (s["trial_keys"], s["trial_s"], s["trial_rate"], s["processes"],
                        s["threads"], s["estimate_s"]) +
                     (("not seeded: %s." % s["stopped"]) if s.get("stopped") else
                      "all seeded in %.0f s (%.0f keys/s) on %s%s." % (
                          s["seed_s"], s["rate"], s.get("seeded_at", "?"),
                          ", kept since and reused by this run" if s.get("reused") else "")))
        if self.gcs:
            g = self.gcs
            curve = g.get("rates") or []
            picks = [curve[i] for i in sorted({0, len(curve) // 2, len(curve) - 1})] if curve else []
            L.append("GCS emulator (in memory, seeded at every run): the target was %s keys "
                     "(%s); %s keys went in in %.0f s%s%s. The GCS systems ran on those: %s." % (
                         "{:,}".format(K.total_keys(g["target"])), K.layout_text(g["target"]),
                         "{:,}".format(g["seeded"]), g["seconds"],
                         "; it stopped there: %s" % g["error"] if g.get("error") else "",
                         " (upload rate as it filled: %s)" % ", ".join(
                             "%.0f keys/s at %s keys" % (r, "{:,}".format(n)) for n, r in picks)
                         if picks else "",
                         K.layout_text(g["layout"]) if g.get("complete") else "none"))
        return L

    # ---- one system ---------------------------------------------------------------------------
    def run(self, ctx, system):
        keys = [m["key"] for m in self.metrics(ctx)]
        if not self.seed or self.seed.get("stopped"):
            why = (self.seed or {}).get("stopped", "the bucket was not seeded")
            return {k: error("not seeded: %s" % why) for k in keys}
        layout = self.layout(ctx)
        if system.store == "gcs":
            if not self.gcs or not self.gcs.get("complete"):
                return {k: error("GCS emulator not seeded: %s" % (self.gcs or {}).get("error"))
                        for k in keys}
            layout = self.gcs["layout"]
        res, counter = {}, None
        self.stores[system.name] = system.store
        total = K.total_keys(layout)
        tmo = ctx.timeout(step_timeout(total))
        if system.store == "s3":
            counter = self.server.counter()
        self._uncounted = ("no store" if system.store is None else
                           "not counted: the GCS emulator has no counters")
        bucket = self.gcs["bucket"] if system.store == "gcs" else K.bucket_name(layout)
        system.target = {"bucket": bucket, "s3": S.KEYS_ENDPOINT, "gcs": S.GCS_ENDPOINT}
        snap = [_settle(counter)]
        try:
            system.unmount()
            if system.store is None:
                root = _native_tree(ctx, layout)
                res["mount_s"] = na("no mount")
            else:
                res["mount_s"] = summarize([fresh_mount(ctx, system)])
                root = system.mp
            if system.store is None:
                drop_caches()  # as fresh_mount does for the others
            self._count(res, counter, snap, "mount")
            big = os.path.join(root, "big")
            steps = [("ls_s", ["ls", "-l", big], layout[2] + 1 if layout[2] else None, "ls"),
                     ("find_s", ["find", root], K.find_entries(layout), "find")]
            peak = 0.0
            for key, cmd, want, step in steps:
                if key == "ls_s" and not layout[2]:
                    res[key] = na("no big/ directory in this layout")
                    continue
                if step == "find":
                    # a cold find, as the raw listing it is compared with: not served by
                    # what `ls -l` left in the mount's caches (a new process: keep its peak)
                    peak = max(peak, _hwm(system))
                    if system.store is None:
                        drop_caches()
                    else:
                        fresh_mount(ctx, system)
                        snap.append(_settle(counter))
                try:
                    rc, out, err, dt = run(cmd, tmo)
                    n = out.count("\n")
                    if want is not None and n != want:
                        raise RuntimeError("%s listed %d lines, expected %d" % (cmd[0], n, want))
                    res[key] = summarize([dt])
                    log("%s: exp 10 %s %.2f s" % (system.name, step, dt))
                except (CmdError, RuntimeError) as e:
                    log("%s: exp 10 %s failed: %s" % (system.name, step, e))
                    res[key] = error(e)
                self._count(res, counter, snap, step)
            try:
                res["stat_s"] = summarize([self._stat(ctx, root, layout, tmo)])
            except (CmdError, RuntimeError, ValueError) as e:
                log("%s: exp 10 stat failed: %s" % (system.name, e))
                res["stat_s"] = error(e)
            self._count(res, counter, snap, "stat")
            peak = max(peak, _hwm(system))
            res["peak_rss"] = summarize([peak]) if peak else na("no file system process")
            res["keys"] = summarize([total])
        finally:
            system.unmount()
            system.target = None
        return res

    def _count(self, res, counter, snap, step):
        if counter is None:
            res["req_" + step] = na(self._uncounted)
            return
        cur = _settle(counter)
        if snap[-1] is None or cur is None:
            res["req_" + step] = error("MinIO's counters did not settle")
        else:
            from . import requests as R
            d = R.diff(cur, snap[-1])
            d[R.MARKER_API] = d.get(R.MARKER_API, 0) - 1
            res["req_" + step] = dict(summarize([sum(v for v in d.values())]),
                                      by_api={k: v for k, v in d.items() if v})
        snap.append(cur)

    def _stat(self, ctx, root, layout, tmo):
        paths = [os.path.join(root, k) for k in K.sample_keys(layout, STAT_SAMPLE)]
        listf = os.path.join(ctx.workdir, "keys-stat-paths.txt")
        with open(listf, "w") as f:
            f.write("\n".join(paths))
        rc, out, err, dt = run([sys.executable, "-c", STAT_CODE, listf, str(tmo)], tmo + 60)
        secs, n = out.split()
        if int(n) != len(paths):
            raise RuntimeError("timeout: %s of %d paths stat'ed in %.0f s (%.1f ms each)" % (
                n, len(paths), float(secs), 1000 * float(secs) / max(1, int(n))))
        return float(secs)

    # ---- the floor, once after every system --------------------------------------------------
    def notes(self, ctx, results):
        if not self.seed or self.seed.get("stopped"):
            return self.describe(ctx)
        layout = self.layout(ctx)
        out = self.describe(ctx)
        refs = {}
        try:
            t, n, pages = s3_listing(K.bucket_name(layout))
            refs["s3"] = t
            out.append("**Raw paged listing** (the floor for `find`): the %s keys listed by "
                       "boto3 as ListObjectsV2 pages of 1,000 (%d pages, no delimiter) through "
                       "the same proxy, after the page cache was dropped: %.2f s." % (
                           "{:,}".format(n), pages, t))
        except Exception as e:  # a reference failing must not lose the table
            out.append("The raw paged listing failed: %s" % e)
        if self.gcs and self.gcs.get("complete"):
            try:
                drop_caches()
                t, n, pages = gcs_listing(self.gcs["bucket"])
                refs["gcs"] = t
                out.append("On the GCS emulator the same listing (JSON API, pages of 1,000): "
                           "%s keys in %d pages, %.2f s." % ("{:,}".format(n), pages, t))
            except Exception as e:
                out.append("The GCS emulator's paged listing failed (where it stops): %s" % e)
        for name, r in results.items():
            f = r.get("find_s") or {}
            store = self.stores.get(name, None if name == "native" else
                                    "gcs" if name in ("gcsfuse", "bucketfs-gcs") else "s3")
            if "median" in f and refs.get(store):
                r["find_vs_list"] = summarize([f["median"] / refs[store]])
            elif store is None:
                r["find_vs_list"] = na("no store")
        return out


def _hwm(system):
    """VmHWM (MiB) of the file system's process now, 0 without one."""
    pid = system.pid()
    st = read_status(pid) if pid else None
    return st.get("VmHWM", 0.0) if st else 0.0


def _settle(counter):
    if counter is None:
        return None
    try:
        return counter.settle()[0]
    except (OSError, RuntimeError) as e:
        log("exp 10: counters: %s" % e)
        return None


def _native_tree(ctx, layout):
    """The layout as local files (made once, kept): native disk's copy of the bucket."""
    root = os.path.join(ctx.workdir, "keys-native", K.bucket_name(layout))
    done = root + ".complete"
    if not os.path.exists(done):
        log("exp 10: writing %s local files for native disk" % "{:,}".format(K.total_keys(layout)))
        made = set()
        for key in K.keys_of(layout):
            d = os.path.join(root, os.path.dirname(key))
            if d not in made:
                os.makedirs(d, exist_ok=True)
                made.add(d)
            with open(os.path.join(root, key), "wb") as f:
                f.write(K.BODY)
        open(done, "w").close()
    return root


def s3_listing(bucket):
    """(seconds, keys, pages) of a paged ListObjectsV2 of the whole bucket through the
    keys' proxy."""
    s3 = K._client(S.KEYS_ENDPOINT, S.ACCESS_KEY, S.SECRET_KEY, S.REGION, 4)
    pager = s3.get_paginator("list_objects_v2")
    drop_caches()  # the client is made first: its setup is not the listing's
    t0, n, pages = time.monotonic(), 0, 0
    for page in pager.paginate(Bucket=bucket, PaginationConfig={"PageSize": 1000}):
        n += len(page.get("Contents", []))
        pages += 1
    return time.monotonic() - t0, n, pages


def gcs_listing(bucket):
    """The same through the GCS proxy with the JSON API (maxResults=1000)."""
    u = urllib.parse.urlparse(S.GCS_ENDPOINT)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0, n, pages, token = time.monotonic(), 0, 0, None
    while True:
        q = {"maxResults": "1000", "fields": "items(name),nextPageToken"}
        if token:
            q["pageToken"] = token
        conn.request("GET", "/storage/v1/b/%s/o?%s" % (bucket, urllib.parse.urlencode(q)))
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError("GCS list: HTTP %d %s" % (resp.status, body[:200]))
        doc = json.loads(body)
        n += len(doc.get("items", []))
        pages += 1
        token = doc.get("nextPageToken")
        if not token:
            return time.monotonic() - t0, n, pages


def seed_gcs(layout, limit_s=300.0, threads=16, stage=1000):
    """Upload the layout to the GCS emulator (directly, not through the proxy), in stages of
    `stage` keys in key order (16 threads each), until all are in or `limit_s` seconds have
    passed: the emulator slows down as it fills (here: about 250 keys/s into an empty one,
    under 30 keys/s at 16,000). Returns {layout (what is complete: big/ first), bucket,
    seeded, seconds, rates [(keys done, keys/s of the stage)], error, complete}."""
    bucket = K.bucket_name(layout)
    total = K.total_keys(layout)
    rec = {"target": layout, "bucket": bucket, "seeded": 0, "seconds": 0.0, "rates": [],
           "error": None}
    t0 = time.monotonic()

    def upload(rng):
        c = http.client.HTTPConnection("127.0.0.1", S.GCS_PORT, timeout=120)
        for i in rng:
            c.request("POST", "/upload/storage/v1/b/%s/o?uploadType=media&name=%s" % (
                bucket, urllib.parse.quote(K.key_at(layout, i), safe="")), body=K.BODY,
                headers={"Content-Type": "application/octet-stream"})
            r = c.getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError("GCS upload: HTTP %d" % r.status)
        return len(rng)

    try:
        conn = http.client.HTTPConnection("127.0.0.1", S.GCS_PORT, timeout=60)
        conn.request("POST", "/storage/v1/b", body=json.dumps({"name": bucket}),
                     headers={"Content-Type": "application/json"})
        conn.getresponse().read()
        with concurrent.futures.ThreadPoolExecutor(threads) as ex:
            while rec["seeded"] < total:
                if time.monotonic() - t0 > limit_s:
                    rec["error"] = ("stopped after %.0f s (the limit, --gcs-seed-limit): %s of "
                                    "%s keys in" % (time.monotonic() - t0, "{:,}".format(
                                        rec["seeded"]), "{:,}".format(total)))
                    break
                a, b = rec["seeded"], min(total, rec["seeded"] + stage)
                per = max(1, (b - a) // threads)
                ts = time.monotonic()
                for got in ex.map(upload, [range(x, min(b, x + per)) for x in range(a, b, per)]):
                    rec["seeded"] += got
                rec["rates"].append((rec["seeded"], round((b - a) / (time.monotonic() - ts), 1)))
    except Exception as e:
        rec["error"] = "after %d keys: %s" % (rec["seeded"], e)
    rec["seconds"] = round(time.monotonic() - t0, 1)
    rec["layout"] = K.capped_layout(layout, rec["seeded"])
    rec["complete"] = K.total_keys(rec["layout"]) == rec["seeded"] and rec["seeded"] > 0
    log("exp 10: GCS emulator seeded with %d keys in %.0f s%s" % (
        rec["seeded"], rec["seconds"], "; " + rec["error"] if rec["error"] else ""))
    return rec
