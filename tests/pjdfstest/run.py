#!/usr/bin/env python3
"""Run pjdfstest (the Rust rewrite, `cargo install pjdfstest`) against bucketfs mounts and
compare the failures with tests/pjdfstest/expected-failures.txt.

    python3 tests/pjdfstest/run.py [--stores s3[,file,gcs,mem]] [--pjdfstest PATH] [--record]

For each store it makes a fresh bucket (seed.py), mounts it with bucketfs (--allow-other:
pjdfstest switches to the unprivileged users of pjdfstest.toml), runs the whole suite in the
mount point, unmounts, and deletes the bucket. Exit status 1 if a test that is NOT listed
for that store fails (or pjdfstest itself breaks); listed tests that pass are reported as
"now passing" (delete their lines) but do not fail the run; reasons starting "(flaky)" mark
tests that pass on some runs and are not reported.

expected-failures.txt: one test a line, `STORES  TEST  REASON`; STORES is `*` or a
comma-separated list (s3, gcs, file, mem); `#` starts a comment line.
Environment: as for pytest (BUCKETFS_BIN, BUCKETFS_TEST_S3_ENDPOINT, BUCKETFS_TEST_MNT_ROOT ...).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import seed  # noqa: E402

BIN = os.environ.get("BUCKETFS_BIN") or os.path.join(REPO, "target", "release", "bucketfs")
RESULT_RE = re.compile(r"^(\S+::\S+)\s{2,}(ok|FAILED|skipped)\s*$")


def load_expected(path: str) -> dict[str, dict[str, str]]:
    """{store: {test: reason}}; store '*' applies to all."""
    out: dict[str, dict[str, str]] = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 2)
            if len(parts) < 3:
                sys.exit(f"{path}:{n}: want `STORES TEST REASON`, got {line!r}")
            stores, test, reason = parts
            for s in stores.split(","):
                out.setdefault(s, {})[test] = reason
    return out


def expected_for(exp: dict, store: str) -> dict[str, str]:
    d = dict(exp.get("*", {}))
    d.update(exp.get(store, {}))
    return d


def parse(output: str) -> dict[str, tuple[str, str]]:
    """{test: (status, first line of the failure message)}."""
    lines = output.splitlines()
    res = {}
    for i, line in enumerate(lines):
        m = RESULT_RE.match(line)
        if m:
            msg = lines[i + 1].strip() if m.group(2) == "FAILED" and i + 1 < len(lines) else ""
            res[m.group(1)] = (m.group(2), msg)
    return res


def is_mounted(mp: str) -> bool:
    mp = os.path.realpath(mp)
    with open("/proc/self/mounts") as f:
        return any(len(p) > 1 and p[1] == mp for p in (ln.split() for ln in f))


def unmount(mp: str) -> None:
    if is_mounted(mp):
        try:
            subprocess.run([BIN, "unmount", mp], capture_output=True, timeout=60)
        except subprocess.TimeoutExpired:
            pass
    if is_mounted(mp):
        subprocess.run(["fusermount3", "-u", "-z", mp], capture_output=True, timeout=30)


def run_store(store: str, pjd: str, conf: str, timeout: int, keep_output: str | None):
    bucket = "pjd-" + uuid.uuid4().hex[:16]
    mnt_root = os.environ.get("BUCKETFS_TEST_MNT_ROOT") or tempfile.gettempdir()
    os.makedirs(mnt_root, exist_ok=True)
    work = tempfile.mkdtemp(prefix="pjdfstest-", dir=mnt_root)
    mp = os.path.join(work, "mnt")
    os.makedirs(mp)
    if store != "mem":
        seed.make_bucket(store, bucket)
    url = "mem://" if store == "mem" else seed.mount_url(store, bucket)
    args = [BIN, "mount", url, mp, "--allow-other", "--staging-dir", os.path.join(work, "staging"),
            "--log-file", os.path.join(work, "bucketfs.log")]
    if store != "mem":
        args += seed.mount_extra_args(store)
    env = dict(os.environ)
    env.update({k: v for k, v in seed.s3_env().items() if k not in env})
    t0 = time.monotonic()
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=90, env=env)
        if p.returncode != 0:
            raise RuntimeError(f"bucketfs mount {url} failed: {p.stderr.strip()[-500:]}")
        os.chmod(mp, 0o777)  # pjdfstest also works as unprivileged users in here
        try:
            r = subprocess.run([pjd, "-c", conf, "-p", mp], capture_output=True, text=True,
                               timeout=timeout, cwd=mp, stdin=subprocess.DEVNULL)
            out, rc = r.stdout + r.stderr, r.returncode
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            raise RuntimeError(f"pjdfstest on {store} did not finish within {timeout}s "
                               f"(last lines: {out.splitlines()[-3:]})")
    finally:
        unmount(mp)
        if not is_mounted(mp):
            shutil.rmtree(work, ignore_errors=True)
        if store != "mem":
            try:
                seed.delete_bucket(store, bucket)
            except Exception as e:  # noqa: BLE001
                print(f"pjdfstest: warning: could not delete bucket {bucket}: {e}", file=sys.stderr)
    if keep_output:
        with open(keep_output, "w") as f:
            f.write(out)
    return parse(out), rc, time.monotonic() - t0, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stores", default=os.environ.get("BUCKETFS_PJDFSTEST_STORES", "s3"))
    ap.add_argument("--pjdfstest", default=shutil.which("pjdfstest")
                    or os.path.expanduser("~/.cargo/bin/pjdfstest"))
    ap.add_argument("--config", default=os.path.join(HERE, "pjdfstest.toml"))
    ap.add_argument("--expected", default=os.path.join(HERE, "expected-failures.txt"))
    ap.add_argument("--timeout", type=int, default=420, help="seconds per store")
    ap.add_argument("--record", action="store_true",
                    help="print every failing test as an expected-failures line (reason: the message)")
    ap.add_argument("--output-dir", help="keep pjdfstest's full output here, one file per store")
    a = ap.parse_args()

    if not os.path.exists(a.pjdfstest):
        print(f"pjdfstest: binary not found ({a.pjdfstest}); cargo install pjdfstest", file=sys.stderr)
        return 1
    exp = load_expected(a.expected)
    bad = 0
    totals = {"ok": 0, "FAILED": 0, "skipped": 0, "expected": 0, "unexpected": 0}
    for store in [s.strip() for s in a.stores.split(",") if s.strip()]:
        keep = os.path.join(a.output_dir, f"pjdfstest-{store}.txt") if a.output_dir else None
        try:
            res, rc, took, out = run_store(store, a.pjdfstest, a.config, a.timeout, keep)
        except Exception as e:  # noqa: BLE001
            print(f"pjdfstest [{store}]: ERROR: {e}", file=sys.stderr)
            bad += 1
            continue
        if not res:
            print(f"pjdfstest [{store}]: no results parsed (exit {rc}); output tail:\n"
                  + "\n".join(out.splitlines()[-20:]), file=sys.stderr)
            bad += 1
            continue
        want = expected_for(exp, store)
        failed = {t: m for t, (st, m) in res.items() if st == "FAILED"}
        unexpected = {t: m for t, m in failed.items() if t not in want}
        fixed = sorted(t for t in want if t in res and res[t][0] == "ok" and not want[t].startswith("(flaky)"))
        counts = {k: sum(1 for st, _ in res.values() if st == k) for k in ("ok", "FAILED", "skipped")}
        print(f"pjdfstest [{store}]: {len(res)} tests in {took:.0f}s: {counts['ok']} passed, "
              f"{counts['FAILED']} failed ({counts['FAILED'] - len(unexpected)} expected, "
              f"{len(unexpected)} unexpected), {counts['skipped']} skipped")
        for k in ("ok", "FAILED", "skipped"):
            totals[k] += counts[k]
        totals["expected"] += counts["FAILED"] - len(unexpected)
        totals["unexpected"] += len(unexpected)
        for t, m in sorted(unexpected.items()):
            print(f"  UNEXPECTED FAILURE [{store}] {t}: {m}")
        if fixed:
            print(f"  now passing on {store} (remove from {os.path.basename(a.expected)} if it stays so): "
                  + ", ".join(fixed))
        if a.record:
            for t, m in sorted(failed.items()):
                print(f"RECORD {store} {t} {m}")
        if unexpected:
            bad += 1
    print(f"pjdfstest: total {totals['ok']} passed, {totals['FAILED']} failed "
          f"({totals['expected']} expected, {totals['unexpected']} unexpected), {totals['skipped']} skipped")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
