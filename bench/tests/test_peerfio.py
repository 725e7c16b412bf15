"""Unit tests of experiment 9 (peerfio.py): the vendored job files, their substitution
and scaling, and fio's output, on fixed inputs.

    python3 -m pytest -q bench/tests
"""

import json
import os
import sys
import tempfile
import unittest

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCH)

from bucketbench import peerfio as P  # noqa: E402


FIO_JSON = {"jobs": [{"jobname": "sequential_read", "error": 0,
                      "read": {"io_bytes": 3 << 30, "bw_bytes": 200_000_000, "iops": 763.0,
                               "lat_ns": {"mean": 1_300_000.0}},
                      "write": {"io_bytes": 0, "bw_bytes": 0, "iops": 0.0,
                                "lat_ns": {"mean": 0.0}}}]}


class PeerFioTest(unittest.TestCase):
    def test_every_rate_row_has_a_cpu_row(self):
        ctx = type("C", (), {"quick": True})()
        keys = {m["key"] for m in P.PeerFio().metrics(ctx)}
        for m in P.PeerFio().metrics(ctx):
            if m["unit"] == "MB/s":
                self.assertIn(m["key"][:-3] + ".cpu_gb", keys)

    def test_sizes(self):
        self.assertEqual(P.size_bytes("100G"), 100 << 30)
        self.assertEqual(P.size_bytes("5m"), 5 << 20)
        self.assertEqual(P.size_bytes("256k"), 256 << 10)
        self.assertEqual(P.size_bytes("4096"), 4096)
        with self.assertRaises(ValueError):
            P.size_bytes("lots")

    def test_parse_job_merges_global_under_the_job(self):
        with open(os.path.join(P.MP_DIR, "read", "seq_read_4t.fio")) as f:
            opts = P.parse_job(f.read())
        self.assertEqual(opts["jobname"], "sequential_read_four_threads")
        self.assertEqual(opts["numjobs"], "4")
        self.assertEqual(opts["bs"], "256k")
        self.assertEqual(opts["time_based"], "")
        self.assertEqual(P.mp_file_group(opts), "big")
        with open(os.path.join(P.MP_DIR, "read", "seq_read_small.fio")) as f:
            self.assertEqual(P.mp_file_group(P.parse_job(f.read())), "small")

    def test_scale_job_changes_only_what_it_names(self):
        with open(os.path.join(P.MP_DIR, "read", "seq_read.fio")) as f:
            text = f.read()
        new, done = P.scale_job(text, {"size": {"100G": "2G"}, "runtime": {"30s": "10s"}})
        self.assertEqual(sorted(done), ["runtime=30s -> 10s", "size=100G -> 2G"])
        old_lines, new_lines = text.splitlines(), new.splitlines()
        self.assertEqual(len(old_lines), len(new_lines))
        diff = [(a, b) for a, b in zip(old_lines, new_lines) if a != b]
        self.assertEqual(diff, [("runtime=30s", "runtime=10s"), ("size=100G", "size=2G")])
        # a value not named stays: the 5 MiB jobs keep their size
        with open(os.path.join(P.MP_DIR, "read", "seq_read_small.fio")) as f:
            small = f.read()
        self.assertEqual(P.scale_job(small, {"size": {"100G": "2G"}})[0], small)

    def test_vendored_files_name_their_source_and_parse(self):
        n = 0
        for d, _, names in os.walk(P.JOBS_DIR):
            for name in names:
                with open(os.path.join(d, name)) as f:
                    text = f.read()
                self.assertTrue(text.startswith("# Vendored unchanged below this header from "
                                                "github.com/"), name)
                self.assertIn("commit ", text.split("[global]")[0])
                self.assertIn("jobname", P.parse_job(text))
                n += 1
        self.assertEqual(n, 17 + 2 + 3)
        for name in P.MP_QUICK:
            self.assertIn(name, P.mp_jobs(False))

    def test_gcsfuse_templates_take_the_mount_from_the_environment(self):
        for t in ("seq_read", "rand_read", "write_seq"):
            with open(os.path.join(P.GF_DIR, t + ".fio")) as f:
                opts = P.parse_job(f.read())
            self.assertEqual(opts["directory"], "${DIR}")
            self.assertEqual(opts["numjobs"], "${NUMJOBS}")
            self.assertEqual(opts["jobname"], t)

    def test_scale_row(self):
        # 1 GiB files: one job of one file within a 1 GiB budget
        self.assertEqual(P.scale_row("1G", 144, 10, 4, 1 << 30), (1, 1))
        # small files: the job cap, and the published file count when it fits
        self.assertEqual(P.scale_row("128K", 192, 30, 4, 1 << 30), (4, 30))
        # 50 MiB: 4 jobs x 5 files = 1000 MiB
        self.assertEqual(P.scale_row("50M", 192, 20, 4, 1 << 30), (4, 5))
        self.assertEqual(P.scale_row("50M", 192, 20, 2, 128 << 20), (2, 1))

    def test_fio_result_takes_the_side_that_moved(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write("fio: some warning\n" + json.dumps(FIO_JSON))
        self.addCleanup(os.unlink, f.name)
        r = P.fio_result(f.name)
        self.assertEqual(r["bw"], 200.0)
        self.assertEqual(r["bytes"], 3 << 30)
        self.assertAlmostEqual(r["lat_mean"], 1.3)

    def test_each_row_and_job_has_its_metrics(self):
        ctx = type("C", (), {"quick": False})()
        keys = {m["key"] for m in P.PeerFio().metrics(ctx)}
        self.assertIn("mp.seq_read_skip_17m.passes", keys)
        self.assertIn("mp.seq_write.cpu_gb", keys)
        self.assertNotIn("mp.seq_write.passes", keys)
        self.assertIn("gf.write_seq.1G_1M.bw", keys)


if __name__ == "__main__":
    unittest.main()
