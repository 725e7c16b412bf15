"""Unit tests of CPU per GB (util.py, experiments.py) on fixed inputs.

    python3 -m pytest -q bench/tests
"""

import os
import sys
import unittest

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCH)

from bucketbench import experiments, report, util  # noqa: E402


class CpuPerGbTest(unittest.TestCase):
    def test_seconds_over_gigabytes(self):
        self.assertAlmostEqual(util.cpu_per_gb(0.5, 250_000_000), 2.0)
        self.assertAlmostEqual(util.cpu_per_gb(1.0, 1 << 30), 1e9 / (1 << 30))

    def test_no_figure_without_bytes_or_cpu(self):
        self.assertIsNone(util.cpu_per_gb(1.0, 0))
        self.assertIsNone(util.cpu_per_gb(None, 1000))
        self.assertEqual(util.cpu_per_gb(-0.01, 1000), 0.0)  # never negative

    def test_fs_cpu_of_no_process_is_none_and_of_this_one_counts(self):
        with util.FsCpu(None) as m:
            pass
        self.assertIsNone(m.per_gb(1 << 30))
        with util.FsCpu(lambda: os.getpid()) as m:
            x = 0
            for i in range(3_000_000):
                x += i
        self.assertIsNotNone(m.seconds)
        self.assertGreaterEqual(m.seconds, 0.0)

    def test_add_fs_cpu_leaves_native_without_a_figure(self):
        runs = {}
        experiments.add_fs_cpu(runs, "cpu_fs_to_4M", util.FsCpu(None).__enter__(), 4 << 20)
        self.assertEqual(runs, {})
        m = util.FsCpu(None)
        m.seconds = 0.2
        experiments.add_fs_cpu(runs, "cpu_fs_to_4M", m, 100_000_000)
        self.assertAlmostEqual(runs["cpu_fs_to_4M"][0], 2.0)

    def test_every_rate_row_has_a_cpu_row(self):
        ctx = type("C", (), {"quick": True, "read_sizes": [1, 10, 200],
                             "copy_sizes": [4, 8], "args": None})()
        for exp in (experiments.Reads(), experiments.CopySweep()):
            keys = [m["key"] for m in exp.metrics(ctx)]
            for m in exp.metrics(ctx):
                if m["unit"] != "MB/s" or m["key"].startswith("link_"):
                    continue
                k = m["key"]
                want = ({"cpu_fs_" + k} if not k.endswith(".bw")
                        else {k[:-3] + ".cpu_gb"})
                self.assertTrue(want & set(keys), "%s has no CPU row" % k)

    def test_native_cpu_cell_is_a_dash(self):
        self.assertEqual(report.cell(None), "–")


if __name__ == "__main__":
    unittest.main()
