"""Unit tests of the benchmark's bookkeeping on fixed inputs: request counting and
pricing (requests.py), --compare (compare.py), --resume (runner.py) and the report's
request rows, resume note and history (report.py, summary.py).

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

from bucketbench import compare, report, runner, summary  # noqa: E402
from bucketbench import requests as R  # noqa: E402

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


if __name__ == "__main__":
    unittest.main()
