"""Unit tests of experiment 10's layout (keyseed.py) on fixed inputs.

    python3 -m pytest -q bench/tests
"""

import os
import sys
import unittest

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCH)

from bucketbench import keyseed as K  # noqa: E402


class LayoutTest(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(K.parse_layout("1000x1000+100000"), (1000, 1000, 100000))
        self.assertEqual(K.parse_layout("1000x10+10000"), (1000, 10, 10000))
        self.assertEqual(K.parse_layout("+500"), (0, 0, 500))
        self.assertEqual(K.parse_layout("10x5"), (10, 5, 0))
        for bad in ("", "x+", "1000", "a x b"):
            with self.assertRaises(ValueError):
                K.parse_layout(bad)

    def test_keys_and_counts(self):
        lay = (3, 4, 5)
        keys = list(K.keys_of(lay))
        self.assertEqual(len(keys), K.total_keys(lay))
        self.assertEqual(len(set(keys)), 17)
        self.assertEqual([K.key_at(lay, i) for i in range(17)], keys)
        self.assertEqual(keys[0], "big/k000000")
        self.assertEqual(keys[5], "d0000/k000000")
        # find prints the root, 3 directories, big/ and 17 keys
        self.assertEqual(K.find_entries(lay), 1 + 3 + 1 + 17)
        self.assertEqual(K.find_entries((2, 2, 0)), 1 + 2 + 4)
        self.assertEqual(K.bucket_name((1000, 1000, 100000)), "keys-1000x1000-100000")
        self.assertEqual(K.total_keys(K.parse_layout(K.FULL_LAYOUT)), 1_100_000)

    def test_sample_is_fixed_and_distinct(self):
        lay = (1000, 10, 10000)
        a, b = K.sample_keys(lay, 500), K.sample_keys(lay, 500)
        self.assertEqual(a, b)
        self.assertEqual(len(set(a)), 500)
        self.assertEqual(len(K.sample_keys((1, 3, 0), 10)), 3)

    def test_capped_layout_for_the_emulator(self):
        self.assertEqual(K.capped_layout((1000, 1000, 100000), 100000), (0, 0, 100000))
        self.assertEqual(K.capped_layout((1000, 10, 10000), 100000), (1000, 10, 10000))
        self.assertEqual(K.capped_layout((100, 100, 10000), 15000), (50, 100, 10000))

    def test_estimate(self):
        self.assertAlmostEqual(K.estimate_s(10000, 50.0, 1_100_000), 5500.0)


if __name__ == "__main__":
    unittest.main()
