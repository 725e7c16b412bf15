"""`python3 tests/fsmodel ...`: the model test standalone (a soak, or a replay of a
shrunk sequence); see the package doc and docs/MODEL_TEST.md for the flags.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import fsmodel

from .orchestrate import Config, run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=fsmodel.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="s3", choices=["s3", "gcs", "file", "gdrive", "mem"])
    ap.add_argument("--ops", type=int, default=10000, help="ops in total, split over the workers")
    ap.add_argument("--seed", type=int, default=None, help="default: $BUCKETFS_MODEL_SEED or random")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--listers", type=int, default=2)
    ap.add_argument("--shrink-secs", type=float, default=180, help="time bound of shrinking (0: off)")
    ap.add_argument("--hang-secs", type=float, default=180, help="an op not returning this long is a hang")
    ap.add_argument("--replay", help="a JSON op list (printed by a shrink) to run as one worker")
    ap.add_argument("--exclude", default="", help="op kinds not to generate, comma-separated "
                    "(generator names: scandir,listdir,sleep,rename_dir,...; ws_names: no names with "
                    "whitespace at an end), to look past a known bug")
    ap.add_argument("--big-files", action="store_true", help="more files of a few MiB, read again after "
                    "close (what FUSE passthrough serves: run with `-- --passthrough on`)")
    ap.add_argument("--crash", action="store_true", help="end with kill -9 of the daemon, a new mount on "
                    "the same mount point (recovery) and `bucketfs sync`, then compare (with `-- --write-back`)")
    ap.add_argument("mount_args", nargs="*", help="extra `bucketfs mount` flags, after --")
    a = ap.parse_args(argv)
    replay = None
    if a.replay:
        with open(a.replay) as f:
            replay = [tuple(op) for op in json.load(f)]
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [tests, os.path.join(os.path.dirname(tests), "scripts")]
    import conftest
    cfg = Config(store=a.store, ops=a.ops, seed=a.seed, workers=a.workers, listers=a.listers,
                 mount_args=a.mount_args, shrink_secs=a.shrink_secs, hang_secs=a.hang_secs,
                 replay=replay, progress_every=10, exclude=[x for x in a.exclude.split(",") if x],
                 big_files=a.big_files, crash=a.crash)
    try:
        rep = run(cfg)
    finally:
        for m in list(conftest._live_mounts):
            conftest.unmount(m)
        shutil.rmtree(conftest.CACHE_HOME, ignore_errors=True)
    return 0 if rep.ok else 1
