"""Unit tests of the full run's repetitions and the variants' experiments (plan.py).

    python3 -m pytest -q bench/tests
"""

import json
import os
import shutil
import sys
import tempfile
import unittest

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCH)

from bucketbench import plan, report, runner, systems  # noqa: E402

ALL = "1,2,3,4,5,6,7,8,9,10"


class PlanTest(unittest.TestCase):
    def reps(self, *argv):
        return runner.Context(runner.parse_args(["--experiments", ALL] + list(argv))).repetitions

    def test_three_where_figures_move_one_where_they_do_not(self):
        self.assertEqual(self.reps(), {"1": 3, "2": 3, "3": 1, "4": 1, "5": 3, "6": 1, "7": 1,
                                       "8": 3, "9": 1, "10": 1})

    def test_runs_n_sets_every_experiment_that_repeats(self):
        got = self.reps("--runs", "2")
        self.assertEqual({e for e, n in got.items() if n == 2},
                         {"1", "2", "3", "4", "5", "6", "8"})
        self.assertEqual((got["7"], got["9"], got["10"]), (1, 1, 1))  # one pass by design
        self.assertEqual(set(self.reps("--quick").values()), {1})
        with self.assertRaises(SystemExit):
            runner.parse_args(["--runs", "0"])

    def test_the_experiment_running_now_decides(self):
        ctx = runner.Context(runner.parse_args(["--experiments", "3,5,9"]))
        got = []
        for eid in (3, 5, 9):
            ctx.exp_id = eid
            got.append(ctx.runs(1))
        self.assertEqual(got, [1, 3, 1])

    def test_a_resumed_run_keeps_the_repetitions_it_began_with(self):
        old = {"runs": 3, "quick": False}  # a JSON from before the plan: --runs for all
        self.assertEqual(plan.recorded(old, [3, 9]), {"3": 3, "9": 1})
        new = {"runs": None, "repetitions": {"3": 1, "5": 3}}
        self.assertEqual(plan.recorded(new, [3, 5, 6]), {"3": 1, "5": 3})

    def test_peers_and_bucketfs_run_everywhere_variants_where_their_flags_matter(self):
        for name in systems.ALL_SYSTEMS:
            if not name.startswith("bucketfs-") or name == "bucketfs-gcs":
                self.assertIsNone(plan.only(name), name)
        ctx = runner.Context(runner.parse_args(["--experiments", ALL]))
        for name, (exps, _) in plan.VARIANTS.items():
            self.assertEqual(systems.make_system(ctx, name).only, exps)
            self.assertTrue(plan.not_run_reason(name).startswith("not run: "))
        self.assertIn("3", plan.only("bucketfs-wb"))
        self.assertNotIn("3", plan.only("bucketfs-tuned"))
        self.assertIn("10", plan.only("bucketfs-tuned"))

    def test_the_report_says_the_repetitions_and_what_did_not_run(self):
        self.assertIn("the plan's", plan.describe("3", 1, True))
        self.assertEqual(plan.describe("3", 2, False), "Repetitions per system: 2.")
        self.assertIn("6 in all", plan.describe("5", 3, True, 2))
        self.assertTrue(plan.describe("9", 1, True).startswith("One pass per system"))
        meta = {"quick": False, "runs": None, "repetitions": {"1": 3, "3": 1}}
        self.assertIn("1: 3, 3: 1 (plan.py", report.mode_text(meta))
        self.assertIn("`--runs 2`", report.mode_text(dict(meta, runs=2)))

    def test_the_report_has_them_under_the_experiment(self):
        tuned = plan.not_run_reason("bucketfs-tuned")
        rec = {"runs": [1.0, 2.0, 3.0], "n": 3, "min": 1.0, "median": 2.0, "max": 3.0}
        doc = {"meta": {"started": "2026-12-04T01:00:00+00:00", "profile": "cloud",
                        "quick": False, "runs": None, "repetitions": {"2": 3}, "argv": [],
                        "machine": {}, "phases": {}, "commit": "abc1234"},
               "systems": {s: {"backend": "MinIO (S3)", "version": "x", "status": "ok",
                               "errors": []} for s in ("bucketfs", "bucketfs-tuned", "s3fs")},
               "experiments": {"2": {"title": "Sequential reads", "runs": 3, "metrics": [
                   {"key": "first_200M", "label": "200 MB first read (MB/s)", "unit": "MB/s",
                    "better": "higher"}], "requests": {}, "results": {
                   "bucketfs": {"first_200M": rec}, "s3fs": {"first_200M": rec},
                   "bucketfs-tuned": {"first_200M": {"na": tuned}}}}}}
        d = tempfile.mkdtemp()
        try:
            os.makedirs(os.path.join(d, "results"))
            path = os.path.join(d, "results", "2026-12-04-cloud.json")
            with open(path, "w") as f:
                json.dump(doc, f)
            md = report.write_report(path, d)
        finally:
            shutil.rmtree(d)
        self.assertIn("Repetitions per system: 3; the plan's", md)
        self.assertIn("Not run here: %s." % tuned[len("not run: "):], md)
        self.assertIn("| mode | full; repetitions per experiment 2: 3 (plan.py", md)


if __name__ == "__main__":
    unittest.main()
