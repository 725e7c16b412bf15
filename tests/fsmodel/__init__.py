"""fsx-style randomized model test of a bucketfs mount, through the kernel.

Several worker processes run seeded random sequences of file system operations, each in
its own subdirectory `w<N>` of one mount, and check every result against an in-memory
reference model (inodes holding bytearrays, a namespace path -> inode, directories, open
handle slots -> inode + flags). Meanwhile lister processes walk the same directories
(os.listdir, os.scandir + stat) all the while, as `ls -l` in another terminal would.

Ops name handle *slots* (0..7) and *paths* relative to the worker's directory; the model
decides when an op runs whether it applies: an op on an empty slot (or opening an occupied
one) is skipped, an op on a path is run and its errno compared with the model's. So any
sub-sequence of a recorded sequence is still a meaningful test, which is what shrinking
needs. Divergences the contract (docs/SEMANTICS.md) allows are accepted:
  - create/mkdir/rename to a name with leading/trailing whitespace may fail with EINVAL
    (else the name must round-trip exactly);
  - a read through a read-only handle of a file unlinked (or replaced) since may give
    ESTALE or ENOENT (else the right bytes);
  - mtime, permissions, directory sizes and link counts are not compared; no hard links
    or symlinks are made.

At the end each worker reads every handle whole, closes it and compares its whole tree;
the orchestrator then unmounts, compares the bucket itself (s3, gcs, file; not mem:// or
gdrive://), remounts and compares the tree again (not mem://). On a divergence it prints
the seed, the op index, expected vs seen, and shrinks the failing worker's sequence on
fresh directories of a fresh mount (same number of listers), within a time bound: the ops
related to the failing one (a backward slice), the shortest failing prefix, then chunks
and single ops removed while it still fails the same way.

Modules: ops (names, paths, op tuples and their formatting), model (the reference),
gen (the generator), runner (the executor: one op_* method per op, each running the call,
comparing, updating the model), procs (the worker and lister processes), orchestrate
(Config, Report, run), shrink (Shrinker, the backward slice), cli (main).

Standalone (a soak):
    python3 tests/fsmodel --store s3 --ops 100000 --seed N --workers 4 --listers 2
    python3 tests/fsmodel --store s3 --replay /tmp/fsmodel-....json   # re-run a saved sequence
Extra mount flags go after `--`: `... --store s3 -- --metadata-ttl 0`; `--exclude scandir,listdir`
stops generating some op kinds (to look past a known bug).
BUCKETFS_MODEL_SEED fixes the seed (else random, printed). Exit status 1 on a divergence.
tests/test_model.py runs bounded runs of it on every store. See docs/MODEL_TEST.md.
"""

from .orchestrate import Config, Report, run

__all__ = ["Config", "Report", "run", "main"]


def main(argv=None) -> int:
    from .cli import main as cli_main
    return cli_main(argv)
