"""Unit tests of the benchmark's bookkeeping on fixed inputs: request counting and
pricing (requests.py), --compare (compare.py), --resume (runner.py), the report's
request rows, resume note and history (report.py, summary.py), the passthrough on/off
and native-disk tables (pairs.py), CPU per GB (util.py, experiments.py), fio's write
phase (fiobench.py) and the mountpoint-s3 peer's fio option and failure notes.

    python3 -m pytest -q bench/tests        # or: python3 -m unittest discover bench/tests
"""

import copy
import datetime
import json
import os
import shutil
import sys
import tempfile
import unittest

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCH)

from bucketbench import compare, experiments, fiobench, pairs, report, runner, summary  # noqa: E402,E501
from bucketbench import requests as R  # noqa: E402
from bucketbench import util  # noqa: E402

RESULTS = os.path.join(BENCH, "results")

MINIO_TEXT = """# HELP minio_s3_requests_total Total number of S3 requests
minio_s3_requests_total{api="getobject",server="127.0.0.1:19000"} 7
minio_s3_requests_total{api="putobject",server="127.0.0.1:19000"} 3
minio_s3_requests_inflight_total{api="putobject",server="127.0.0.1:19000"} 1
minio_s3_requests_total{api="listobjectsv2",server="127.0.0.1:19000"} 2e+00
"""


def doc_with(results, requests=None, started="2026-11-26T01:00:00+00:00", quick=True):
    """A minimal results document: experiment 1 (find) and 4 (create) on three systems."""
    exps = {
        "1": {"title": "Mount time and find", "metrics": [
            {"key": "find_first_s", "label": "find, first time (s)", "unit": "s",
             "better": "lower"}], "results": {}, "requests": {}},
        "2": {"title": "Sequential reads", "metrics": [
            {"key": "first_200M", "label": "200 MB first read (MB/s)", "unit": "MB/s",
             "better": "higher"}], "results": {}, "requests": {}},
    }
    for (eid, system, key), v in results.items():
        exps[eid]["results"].setdefault(system, {})[key] = {
            "runs": [v], "n": 1, "min": v, "median": v, "max": v}
    for (eid, system), rec in (requests or {}).items():
        exps[eid]["requests"][system] = rec
    return {"meta": {"started": started, "profile": "cloud", "quick": quick, "commit": "abc1234",
                     "argv": ["--quick", "--profile", "cloud"], "machine": {}, "phases": {}},
            "systems": {s: {"backend": "MinIO (S3)", "version": "x", "status": "ok", "errors": []}
                        for s in ("bucketfs", "s3fs", "rclone-full")},
            "experiments": exps}


class RequestsTest(unittest.TestCase):
    def test_parse_minio_counts_requests_not_inflight(self):
        self.assertEqual(R.parse_minio(MINIO_TEXT),
                         {"getobject": 7, "putobject": 3, "listobjectsv2": 2})

    def test_classify_and_price(self):
        self.assertEqual(R.classify("putobject"), ("PUT", "tier1"))
        self.assertEqual(R.classify("listobjectsv2"), ("LIST", "tier1"))
        self.assertEqual(R.classify("deletemultipleobjects"), ("DELETE", "free"))
        self.assertEqual(R.classify("getbucketlocation"), ("other", "tier2"))
        self.assertEqual(R.classify("putbuckettagging"), ("other", "tier1"))
        # 1,000 PUTs $0.005 + 2,000 GETs 2 x $0.0004 + 1,000 DELETEs free
        cost = R.cost_usd({"putobject": 1000, "getobject": 2000, "deleteobject": 1000})
        self.assertAlmostEqual(cost, 0.0058)

    def test_cell_record_takes_out_markers_and_harness_requests(self):
        rec = R.cell_record({"getobject": 60, "headobject": 5, R.MARKER_API: 1}, 1, 2,
                            {"head": 5, "get": 12}, {"getobject": 48}, 3.2)
        self.assertEqual(rec["minio"], {"getobject": 12, "headobject": 5})
        self.assertEqual(rec["total"], 17)
        self.assertEqual(rec["kinds"]["GET"], 12)
        self.assertEqual(rec["kinds"]["HEAD"], 5)
        self.assertEqual(rec["kinds"]["PUT"], 0)
        self.assertAlmostEqual(rec["cost_usd"], 17 * 0.0004 / 1000)
        self.assertEqual(rec["runs"], 2)
        self.assertEqual(rec["bucketfs"], {"head": 5, "get": 12})

    def test_settle_waits_for_the_marker_and_two_equal_reads(self):
        # a counter that shows the marker only on the third read after it was sent, and
        # a late request on the fourth: the snapshot must hold both
        reads = []
        seq = [{"getobject": 1}, {"getobject": 1}, {"getobject": 1},
               {"getobject": 2, R.MARKER_API: 1}, {"getobject": 3, R.MARKER_API: 1},
               {"getobject": 3, R.MARKER_API: 1}]
        c = R.MinioCounter("http://unused", lambda: reads.append("marker"), poll=0, limit=5)
        c.read = lambda: seq.pop(0)
        got, _ = c.settle()
        self.assertEqual(got, {"getobject": 3, R.MARKER_API: 1})
        self.assertEqual(reads, ["marker"])

    def test_settle_gives_up(self):
        c = R.MinioCounter("http://unused", lambda: None, poll=0.01, limit=0.05)
        c.read = lambda: {"getobject": 1}
        with self.assertRaises(RuntimeError):
            c.settle()


class CompareTest(unittest.TestCase):
    def test_change_marks(self):
        self.assertEqual(compare.change(1.0, 1.5, "lower", 10)[1], "REGRESSION")
        self.assertEqual(compare.change(1.0, 1.05, "lower", 10)[1], "")
        self.assertEqual(compare.change(100, 80, "higher", 10)[1], "REGRESSION")
        self.assertEqual(compare.change(100, 130, "higher", 10)[1], "better")
        self.assertEqual(compare.change(2.0, 1.0, "lower", 10), (0.5, "better"))

    def test_compare_docs_finds_the_regression_and_the_requests(self):
        old = doc_with({("1", "bucketfs", "find_first_s"): 1.0,
                        ("2", "bucketfs", "first_200M"): 200.0,
                        ("1", "s3fs", "find_first_s"): 5.0},
                       {("1", "bucketfs"): R.cell_record({"listobjectsv2": 100}, 0, 1)})
        new = doc_with({("1", "bucketfs", "find_first_s"): 2.0,
                        ("2", "bucketfs", "first_200M"): 210.0,
                        ("1", "s3fs", "find_first_s"): 5.0},
                       {("1", "bucketfs"): R.cell_record({"listobjectsv2": 50}, 0, 1)})
        lines, regressions = compare.compare_docs(old, new, 10)
        self.assertEqual(regressions, 1)
        text = "\n".join(lines)
        self.assertIn("| 1 | find, first time (s) | bucketfs | 1 | 2 | 2.00× | REGRESSION |",
                      text)
        self.assertIn("| 1 | store requests per run (MinIO) | bucketfs | 100 | 50 | 0.50× | better |",
                      text)
        self.assertIn("5 compared, 1 regressions, 2 better", text)

    def test_compare_two_committed_runs(self):
        old = os.path.join(RESULTS, "2026-11-21-cloud-read.json")
        new = os.path.join(RESULTS, "2026-11-22-cloud-read.json")
        lines, _ = compare.compare_files(old, new, 10)
        rows = [ln for ln in lines if ln.startswith("| 2 | 1024 MB first read")]
        self.assertTrue(any("| bucketfs |" in r for r in rows), rows)

    def test_cli_exit_status(self):
        d = tempfile.mkdtemp()
        try:
            a, b = os.path.join(d, "a.json"), os.path.join(d, "b.json")
            with open(a, "w") as f:
                json.dump(doc_with({("1", "bucketfs", "find_first_s"): 1.0}), f)
            with open(b, "w") as f:
                json.dump(doc_with({("1", "bucketfs", "find_first_s"): 3.0}), f)
            self.assertEqual(runner.main(["--compare", a, b]), 2)
            self.assertEqual(runner.main(["--compare", a, a]), 0)
        finally:
            shutil.rmtree(d)


class ResumeTest(unittest.TestCase):
    def test_strip_flags(self):
        argv = ["--quick", "--resume", "x.json", "--compare", "a.json", "b.json",
                "--threshold=5", "--systems", "bucketfs"]
        self.assertEqual(runner._strip_flags(argv, {"--resume": 1, "--compare": -1,
                                                    "--threshold": 1}),
                         ["--quick", "--systems", "bucketfs"])

    def test_resume_takes_the_runs_flags_and_later_ones_win(self):
        flags = {"--resume": 1, "--compare": -1, "--threshold": 1}
        prior = ["--quick", "--profile", "cloud", "--experiments", "1,4", "--port-offset", "300"]
        now = ["--resume", "x.json", "--port-offset", "400", "--no-install"]
        a = runner.parse_args(runner._strip_flags(prior, flags) + runner._strip_flags(now, flags))
        self.assertEqual((a.quick, a.profile, a.experiment_list, a.port_offset, a.no_install),
                         (True, "cloud", [1, 4], 400, True))
        self.assertIsNone(a.resume)

    def test_resumed_doc_keeps_cells_and_says_so(self):
        prior = doc_with({("1", "bucketfs", "find_first_s"): 1.0,
                          ("1", "s3fs", "find_first_s"): 5.0})
        prior["meta"]["phases"] = {"total_s": 100.0}
        fresh = {"meta": {"commit": "def5678", "phases": {"install_s": 1.0},
                          "machine": {"loadavg_at_start": 0.5}}}
        at = datetime.datetime(2026, 11, 26, 2, 0, tzinfo=datetime.timezone.utc)
        doc = runner._resumed_doc(copy.deepcopy(prior), fresh, at)
        self.assertEqual(doc["experiments"]["1"]["results"], prior["experiments"]["1"]["results"])
        self.assertEqual(doc["meta"]["resumed"][0]["kept_cells"], 2)
        self.assertEqual(doc["meta"]["resumed"][0]["commit"], "def5678")
        self.assertIs(doc["meta"]["phases"], fresh["meta"]["phases"])
        self.assertEqual(doc["meta"]["phases"]["earlier_sessions_s"], 100.0)
        self.assertEqual(doc["meta"]["commit"], "abc1234")  # the run's first commit


class ReportTest(unittest.TestCase):
    def test_report_has_requests_cost_resume_and_history(self):
        d = tempfile.mkdtemp()
        try:
            results = os.path.join(d, "results")
            os.makedirs(results)
            doc = doc_with({("1", "bucketfs", "find_first_s"): 1.0,
                            ("1", "s3fs", "find_first_s"): 4.0},
                           {("1", "bucketfs"): R.cell_record(
                               {"listobjectsv2": 200, "headobject": 20}, 0, 2, {"list": 180}),
                            ("1", "s3fs"): R.cell_record({"headobject": 4000}, 0, 2)})
            doc["meta"]["resumed"] = [{"at": "2026-11-26T02:00:00+00:00", "commit": "def5678",
                                       "kept_cells": 3}]
            path = os.path.join(results, "2026-11-26-cloud.json")
            with open(path, "w") as f:
                json.dump(doc, f)
            older = doc_with({("1", "bucketfs", "find_first_s"): 2.0}, None,
                             "2026-11-20T01:00:00+00:00")
            with open(os.path.join(results, "2026-11-20-cloud.json"), "w") as f:
                json.dump(older, f)
            self.assertEqual(report.main_json(results), path)
            md = report.write_report(path, d)
            with open(os.path.join(d, "REPORT.md")) as f:
                self.assertEqual(f.read(), md)
            self.assertIn("**Resumed** at 2026-11-26T02:00:00+00:00", md)
            # per run = total / 2 runs; bucketfs 110 vs s3fs 2,000 requests
            self.assertIn("| store requests per run, MinIO's count | 110 | 2,000 | – | "
                          "0.06× (vs s3fs) |", md)
            self.assertIn("| &nbsp;&nbsp;of which LIST | 100 | 0 | – | – |", md)
            self.assertIn("| bucketfs's own count per run (store calls) | 90 | – | – |", md)
            self.assertIn("| request cost per run, S3 Standard (USD) | $0.000504 | $0.000800 |", md)
            self.assertIn(R.PRICES_DATE, md)
            self.assertIn("## History", md)
            self.assertIn("[2026-11-20-cloud.json](results/2026-11-20-cloud.json) |", md)
            self.assertIn("[2026-11-26-cloud.json](results/2026-11-26-cloud.json) (this report)",
                          md)
        finally:
            shutil.rmtree(d)

    def test_failure_line_says_why(self):
        exp = {"results": {"rclone-off": {"clone_s": {"error": "exit 128: git clone: fatal"},
                                          "make_s": {"error": "exit 128: git clone: fatal"}}}}
        lines = summary.failure_lines("6", exp, ["rclone-off"])
        self.assertEqual(len(lines), 1)
        self.assertIn("failed in 2 of 2 metrics", lines[0])
        self.assertIn("Why: git reopens the pack", lines[0])

    def test_readme_block(self):
        d = tempfile.mkdtemp()
        try:
            readme = os.path.join(d, "README.md")
            with open(readme, "w") as f:
                f.write("# x\n\n%s -->\nSTALE-LINE\n%s\nrest\n" % (summary.README_START,
                                                          summary.README_END))
            doc = doc_with({("1", "bucketfs", "find_first_s"): 1.0,
                            ("1", "s3fs", "find_first_s"): 4.0,
                            ("2", "bucketfs", "first_200M"): 100.0,
                            ("2", "rclone-full", "first_200M"): 50.0})
            lines = summary.readme_headline(doc, "/x/2026-11-26-cloud.json")
            self.assertTrue(summary.write_readme_block(readme, lines))
            with open(readme) as f:
                text = f.read()
            self.assertNotIn("STALE-LINE", text)
            self.assertTrue(text.endswith("\nrest\n"))
            self.assertIn("- listing, `find` over 2,000 files: first 1 s (4.0× faster than s3fs)",
                          text)
            self.assertIn("- reading 200 MB: cold 100 MB/s (2.0× faster than rclone-full)", text)
        finally:
            shutil.rmtree(d)


def metric(key, label, unit, better):
    return {"key": key, "label": label, "unit": unit, "better": better}


def pt_doc():
    """A run with native, bucketfs-nopt, bucketfs (passthrough on) and bucketfs-wb in experiments 2, 3, 5."""
    exps = {
        "2": {"title": "Sequential reads", "metrics": [
            metric("first_200M", "200 MB first read (MB/s)", "MB/s", "higher"),
            metric("again_200M", "200 MB read again (MB/s)", "MB/s", "higher"),
            metric("dropped_200M", "200 MB read again after the page cache is dropped (MB/s)",
                   "MB/s", "higher"),
            metric("cpu_fs_dropped_200M", "200 MB dropped: fs CPU s per GB", "s/GB", "lower"),
            metric("checksum_failures", "md5 mismatches (count)", "count", "lower")],
            "results": {}, "passthrough_opens": {"bucketfs": 4}},
        "3": {"title": "fio", "metrics": [
            metric("write_16M_1M_j1_fsyncN.bw", "seq write: bw (MB/s)", "MB/s", "higher"),
            metric("write_16M_1M_j1_fsyncN.iops", "seq write: iops (IOPS)", "IOPS", "higher"),
            metric("write_16M_1M_j1_fsyncN.write_s", "seq write: write phase (s)", "s",
                   "lower")], "results": {}},
        "5": {"title": "cp sweep", "metrics": [
            metric("to_64M", "cp 64 MB local -> mount (MB/s)", "MB/s", "higher")],
            "results": {}},
    }
    values = {
        ("2", "first_200M"): {"native": 800, "bucketfs-nopt": 100, "bucketfs": 110},
        ("2", "again_200M"): {"native": 4000, "bucketfs-nopt": 2000, "bucketfs": 4000},
        ("2", "dropped_200M"): {"native": 800, "bucketfs-nopt": 400, "bucketfs": 800},
        ("2", "cpu_fs_dropped_200M"): {"bucketfs-nopt": 0.8, "bucketfs": 0.02},
        ("2", "checksum_failures"): {"bucketfs-nopt": 0, "bucketfs": 0},
        ("3", "write_16M_1M_j1_fsyncN.bw"): {"native": 500, "bucketfs-nopt": 50, "bucketfs": 40},
        ("3", "write_16M_1M_j1_fsyncN.iops"): {"native": 500, "bucketfs-nopt": 50,
                                                "bucketfs": 40},
        ("3", "write_16M_1M_j1_fsyncN.write_s"): {"native": 0.02, "bucketfs-nopt": 0.1,
                                                   "bucketfs": 0.05},
        ("5", "to_64M"): {"native": 400, "bucketfs-nopt": 50, "bucketfs": 50,
                          "bucketfs-wb": 200},
    }
    for (eid, key), per in values.items():
        for system, v in per.items():
            exps[eid]["results"].setdefault(system, {})[key] = {
                "runs": [v], "n": 1, "min": v, "median": v, "max": v}
    exps["2"]["results"]["native"]["cpu_fs_dropped_200M"] = {"na": "no file system process"}
    names = ("native", "bucketfs-nopt", "bucketfs", "bucketfs-wb")
    return {"meta": {"started": "2026-11-26T05:00:00+00:00", "profile": "cloud", "quick": True,
                     "argv": [], "machine": {}, "phases": {}},
            "systems": {s: {"backend": "x", "version": "x", "status": "ok", "errors": []}
                        for s in names},
            "experiments": exps}


class PassthroughReportTest(unittest.TestCase):
    def test_pair_table_of_reads(self):
        rows = pairs.pair_rows("2", pt_doc()["experiments"]["2"])
        text = "\n".join(rows)
        self.assertIn("| metric | bucketfs-nopt | bucketfs | bucketfs ÷ bucketfs-nopt |", text)
        self.assertIn("| 200 MB read again after the page cache is dropped (MB/s) | 400 | 800 | "
                      "2.00× (better) |", text)
        # lower is better for CPU: a smaller figure with passthrough is better
        self.assertIn("| 200 MB dropped: fs CPU s per GB | 0.800 | 0.020 | 0.025× (better) |",
                      text)
        self.assertIn("| 200 MB read again (MB/s) | 2000 | 4000 | 2.00× (better) |", text)
        self.assertNotIn("md5 mismatches", text)  # counts are not paired
        self.assertIn("bucketfs in this experiment (bucketfs's `bucketfs_passthrough_opens`):"
                      " 4.", text)

    def test_pair_table_says_when_passthrough_did_not_engage(self):
        exp = pt_doc()["experiments"]["2"]
        exp["passthrough_opens"]["bucketfs"] = 0
        self.assertIn("): 0 (no open found its file whole in the disk cache",
                      "\n".join(pairs.pair_rows("2", exp)))

    def test_pair_table_of_fio_keeps_bandwidth_and_write_phase(self):
        text = "\n".join(pairs.pair_rows("3", pt_doc()["experiments"]["3"]))
        self.assertIn("| seq write: bw (MB/s) | 50.0 | 40.0 | 0.80× (worse) |", text)
        self.assertIn("| seq write: write phase (s) | 0.100 | 0.050 | 0.50× (better) |", text)
        self.assertNotIn("iops", text)

    def test_no_pair_without_both_systems_or_outside_2_3_5(self):
        doc = pt_doc()
        del doc["experiments"]["5"]["results"]["bucketfs"]
        self.assertEqual(pairs.pair_rows("5", doc["experiments"]["5"]), [])
        self.assertEqual(pairs.pair_rows("4", pt_doc()["experiments"]["2"]), [])

    def test_goals_table_against_native(self):
        text = "\n".join(pairs.goals_table(pt_doc()))
        self.assertIn("| figure | native | bucketfs-nopt | bucketfs | bucketfs-wb | bucketfs-nopt time "
                      "÷ native's | bucketfs time ÷ native's | bucketfs-wb time ÷ native's | "
                      "bucketfs ÷ bucketfs-nopt |", text)
        # MB/s: native 800, bucketfs-nopt 400 takes twice native's time, bucketfs as long
        self.assertIn("| 2. 200 MB read again after the page cache is dropped (MB/s) | 800 | 400 "
                      "| 800 | – | 2.00× | 1.00× | – | 2.00× (better) |", text)
        # seconds: 0.1 s against native's 0.02 s is 5x its time
        self.assertIn("| 3. seq write: write phase (s) | 0.020 | 0.100 | 0.050 | – | 5.00× | "
                      "2.50× | – | 0.50× (better) |", text)
        self.assertIn("| 5. cp 64 MB local -> mount (MB/s) | 400 | 50.0 | 50.0 | 200 | 8.00× | "
                      "8.00× | 2.00× | 1.00× |", text)
        self.assertIn("| 2. 200 MB dropped: fs CPU s per GB | no file system process | 0.800 | "
                      "0.020 | – | – | – | – | 0.025× (better) |", text)
        order = [r.split(" | ")[0] for r in text.splitlines() if r.startswith("| 2.")
                 or r.startswith("| 3.") or r.startswith("| 5.")]
        self.assertEqual(order[:2], ["| 2. 200 MB read again after the page cache is dropped "
                                     "(MB/s)", "| 2. 200 MB read again (MB/s)"])
        self.assertNotIn("| 2. 200 MB first read", text)  # not one of the figures

    def test_goals_table_needs_native_and_a_bucketfs(self):
        doc = pt_doc()
        del doc["systems"]["native"]
        self.assertEqual(pairs.goals_table(doc), [])

    def test_report_has_the_goals_and_pair_tables(self):
        d = tempfile.mkdtemp()
        try:
            results = os.path.join(d, "results")
            os.makedirs(results)
            path = os.path.join(results, "2026-11-26-cloud-pt.json")
            with open(path, "w") as f:
                json.dump(pt_doc(), f)
            md = report.write_report(path, d, os.path.join(d, "REPORT-pt.md"))
            self.assertIn("## Against native disk: passthrough's figures (issue 27)", md)
            self.assertEqual(md.count("**Passthrough on/off**"), 3)  # experiments 2, 3, 5
            # the pair of experiment 5 is under experiment 5's own table
            self.assertLess(md.index("## Experiment 5"), md.rindex("**Passthrough on/off**"))
        finally:
            shutil.rmtree(d)


class CpuPerGbTest(unittest.TestCase):
    def test_record_cpu_per_gb(self):
        runs = {}
        res = {"busy": 0.5, "machine_s": 2.0, "children_s": 0.1, "self_s": 0.0, "fs_s": 0.05,
               "proxy_s": 0.0, "server_s": 0.0}
        experiments.record_cpu(runs, "dropped_200M", res, 200 << 20,
                               {"fs": "fs", "reader": "children"})
        per_gb = 1e9 / (200 << 20)
        self.assertAlmostEqual(runs["cpu_fs_dropped_200M"][0], 0.05 * per_gb)
        self.assertAlmostEqual(runs["cpu_reader_dropped_200M"][0], 0.1 * per_gb)
        self.assertAlmostEqual(runs["cpu_dropped_200M"][0], 2.0 * per_gb)
        self.assertEqual(runs["busy_dropped_200M"], [50.0])
        experiments.record_cpu(runs, "dropped_200M", None, 200 << 20, {"fs": "fs"})
        self.assertEqual(len(runs["cpu_fs_dropped_200M"]), 1)  # no measurement, no figure

    def test_cpu_meter_reads_a_process_utime_and_stime(self):
        # a child that burns 0.3 s of CPU, then sleeps until it is killed
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time\n"
                                  "while time.process_time() < 0.3: pass\n"
                                  "print('done', flush=True)\ntime.sleep(60)"],
                                 stdout=subprocess.PIPE, text=True)
        try:
            with util.CpuMeter({"fs": [child.pid]}) as meter:
                self.assertEqual(child.stdout.readline().strip(), "done")
            self.assertGreaterEqual(meter.result["fs_s"], 0.25)
            self.assertLess(meter.result["fs_s"], 5)
            self.assertAlmostEqual(util.proc_cpu(child.pid), util.proc_cpu(child.pid), 1)
        finally:
            child.kill()
            child.wait()
        self.assertIsNone(util.proc_cpu(child.pid))  # gone: no figure, not a crash

    def test_passthrough_opens_from_metrics_text(self):
        text = ("# HELP bucketfs_passthrough_opens Opens the kernel served.\n"
                "# TYPE bucketfs_passthrough_opens counter\n"
                "bucketfs_passthrough_opens 12\n"
                'bucketfs_store_requests_total{op="get"} 3\n')
        self.assertEqual(R.parse_passthrough_opens(text), 12)
        self.assertEqual(R.parse_bucketfs(text), {"get": 3})
        self.assertEqual(R.parse_passthrough_opens("bucketfs_uptime_seconds 4\n"), 0)


class FioWritePhaseTest(unittest.TestCase):
    def fio_json(self, mean_ns, total_ios):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        path = os.path.join(d, "fio.json")
        side = {"bw_bytes": 200e6, "iops": 200, "total_ios": total_ios,
                "lat_ns": {"mean": mean_ns}, "clat_ns": {"percentile": {"99.000000": 5e6}}}
        with open(path, "w") as f:
            f.write("fio: a note before the JSON\n" + json.dumps({"jobs": [{"write": side}]}))
        return path

    def test_write_phase_is_the_summed_write_latency_per_job(self):
        path = self.fio_json(2e6, 256)  # 256 writes of 2 ms: 0.512 s
        self.assertAlmostEqual(fiobench.parse_fio(path, True)["write_s"], 0.512)
        self.assertAlmostEqual(fiobench.parse_fio(path, True, 4)["write_s"], 0.128)

    def test_only_fsync_n_writes_record_the_write_phase(self):
        keys = {j.key: [f for f, _, _ in j.fields] for j in fiobench.FULL_JOBS}
        self.assertIn("write_s", keys["write_256M_1M_j1_fsyncN"])
        self.assertNotIn("write_s", keys["write_16M_16K_j1_fsync10"])
        self.assertNotIn("write_s", keys["read_200M_1M_j1"])
        labels = [m["label"] for m in fiobench.Fio().metrics(type("C", (), {"quick": True})())]
        self.assertIn("seq write 64M bs=1M x1 fsync=N: write phase before the final flush (s)",
                      labels)

    def test_a_job_not_given_to_a_system_is_recorded_with_its_reason(self):
        ran = []
        saved = {n: getattr(fiobench, n) for n in ("fresh_mount", "rmtree", "mkdir", "run",
                                                   "parse_fio", "wpath")}
        self.addCleanup(lambda: [setattr(fiobench, n, f) for n, f in saved.items()])
        fiobench.fresh_mount = fiobench.rmtree = fiobench.mkdir = lambda *a: None
        fiobench.wpath = lambda system, name: "/nonexistent/" + name
        fiobench.run = lambda cmd, timeout: ran.append(cmd[1])
        fiobench.parse_fio = lambda *a: {"bw": 1.0, "iops": 1.0, "lat_mean": 1.0,
                                         "lat_p99": 1.0, "write_s": 1.0}
        ctx = type("C", (), {"quick": True, "workdir": "/nonexistent",
                             "runs": lambda self, n: 1, "timeout": lambda self, s: s})()
        system = type("S", (), {"name": "rclone-off", "root": "/nonexistent",
                                "mp": "/nonexistent", "unmount": lambda self: None})()
        res = fiobench.Fio().run(ctx, system)
        reads = [k for k in res if k.startswith("randread_")]
        self.assertTrue(reads)
        for k in reads:
            self.assertTrue(res[k]["na"].startswith("not run: "), res[k])
        self.assertNotIn("--name=randread", ran)
        self.assertIn("--name=write", ran)
        self.assertIn("median", res[[k for k in res if k.startswith("write_")][0]])


class MountpointTest(unittest.TestCase):
    """The mountpoint-s3 peer: its fio write jobs get --create_on_open=1 (no other system's
    do), its failures in experiments 3 and 6 say why, and the report prints its note."""

    def cmd(self, name, job):
        ctx = type("C", (), {"quick": True})()
        system = type("S", (), {"name": name, "root": "/nonexistent"})()
        return fiobench.Fio()._cmd(ctx, system, job, "/nonexistent/d", "/nonexistent/o")[0]

    def test_only_its_write_jobs_create_on_open(self):
        write, read = fiobench.Job("write", "64M", "1M"), fiobench.Job("read", "100M", "1M", src=100)
        self.assertIn("--create_on_open=1", self.cmd("mountpoint-s3", write))
        self.assertNotIn("--create_on_open=1", self.cmd("mountpoint-s3", read))
        for other in ("bucketfs", "s3fs", "rclone-full", "native"):
            self.assertNotIn("--create_on_open=1", self.cmd(other, write))

    def test_failures_say_why_and_the_fio_note_is_there(self):
        err = {"error": "exit 1: fio: Invalid argument"}
        exp = {"results": {"mountpoint-s3": {"randwrite_16M_16K_j1_fsyncN.bw": err}}}
        line = summary.failure_lines("3", exp, ["mountpoint-s3"])[0]
        self.assertIn("Why: mountpoint-s3 writes a file once, in order", line)
        self.assertTrue(any("--create_on_open=1" in x for x in summary.standing_notes("3", exp)))
        self.assertFalse(any("create_on_open" in x for x in summary.standing_notes("4", exp)))
        exp6 = {"results": {"mountpoint-s3": {"clone_s": {"error": "exit 128: File exists"}}}}
        self.assertIn("RenameObject", summary.failure_lines("6", exp6, ["mountpoint-s3"])[0])

    def test_a_vanished_scratch_directory_is_made_again(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        scratch = os.path.join(d, "w")
        calls = []
        saved = experiments.run
        self.addCleanup(setattr, experiments, "run", saved)

        def fake_run(cmd, timeout):
            calls.append(cmd)
            if cmd[0] == "mkdir":
                os.makedirs(cmd[-1], exist_ok=True)
                return 0, "", "", 0.0
            if len(calls) == 1:  # the directory goes just before the first copy
                os.rmdir(scratch)
                raise util.CmdError("exit 1: cp: No such file or directory")
            return 0, "", "", 1.5
        os.makedirs(scratch)
        experiments.run = fake_run
        system = type("S", (), {"name": "mountpoint-s3"})()
        self.assertEqual(experiments.run_in_dir(system, scratch, ["cp", "a", "b"], 9)[3], 1.5)
        self.assertEqual([c[0] for c in calls], ["cp", "mkdir", "cp"])
        calls.clear()  # a failure with the directory still there is a failure
        experiments.run = lambda cmd, timeout: (_ for _ in ()).throw(util.CmdError("exit 1"))
        with self.assertRaises(util.CmdError):
            experiments.run_in_dir(system, scratch, ["cp", "a", "b"], 9)

    def test_report_prints_the_system_note(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        os.makedirs(os.path.join(d, "results"))
        doc = doc_with({("1", "mountpoint-s3", "find_first_s"): 2.0})
        doc["systems"]["mountpoint-s3"] = {"backend": "MinIO (S3)", "version": "x",
                                           "status": "ok", "errors": [], "note": "cannot rename"}
        path = os.path.join(d, "results", "2026-11-30-lan.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        self.assertIn("- **mountpoint-s3**: cannot rename", report.write_report(path, d))


class ProxyGuardTest(unittest.TestCase):
    """A toxiproxy past its memory limit is restarted while the experiment runs, and the
    report marks that system's figures."""

    def test_restarts_past_the_limit_and_the_report_says_so(self):
        import time
        from bucketbench import servers

        class FakeServers:
            def __init__(self):
                self.rss = [100, 9000, 200]
                self.fresh = 0

            def proxy_rss_mb(self):
                return self.rss.pop(0) if len(self.rss) > 1 else self.rss[0]

            def fresh_proxy(self):
                self.fresh += 1
                return 9000

        srv = FakeServers()
        with servers.ProxyGuard(srv, limit_mb=6000, every=0.01) as g:
            time.sleep(0.2)
        self.assertEqual((g.restarts, srv.fresh, g.peak_mb), (1, 1, 9000))
        exp = {"proxy_restarts": {"rclone-off": {"restarts": 1, "limit_mb": 6000, "peak_mb": 9000}}}
        lines = summary.proxy_lines(exp)
        self.assertTrue(any("rclone-off" in x and "restarted 1 time" in x for x in lines), lines)
        self.assertEqual(summary.proxy_lines({}), [])

    def test_a_failed_restart_is_tried_again_and_counted(self):
        import time
        from bucketbench import servers

        class FlakyServers:
            def __init__(self, failures):
                self.failures, self.fresh = failures, 0

            def proxy_rss_mb(self):
                return 9000 if self.fresh == 0 and self.failures >= 0 else 100

            def fresh_proxy(self):
                self.fresh += 1
                if self.failures > 0:
                    self.failures -= 1
                    raise RuntimeError("timed out")
                self.failures = -1
                return 9000

        srv = FlakyServers(1)  # the first attempt fails, the second works
        with servers.ProxyGuard(srv, limit_mb=6000, every=0.01) as g:
            time.sleep(2.5)
        self.assertEqual((g.restarts, g.failed, srv.fresh), (1, 0, 2))
        exp = {"proxy_restarts": {"gcsfuse": {"restarts": 1, "failed": 1, "limit_mb": 6000, "peak_mb": 9000}}}
        self.assertTrue(any("1 restart(s) failed" in x for x in summary.proxy_lines(exp)))


if __name__ == "__main__":
    unittest.main()
