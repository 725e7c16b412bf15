"""How often each experiment is repeated in full mode, and where the bucketfs variants run
(issue 46: the full run in one sitting; bench/README.md has the time it takes).

A repetition is the whole measurement once more on every system; the report gives the
median and min-max over them. Three where a figure moves between runs, one where it does
not, judged from the full cloud runs that kept three (results/2026-11-26-cloud.json and
2026-12-03-cloud-cut.json): for every system and main figure (CPU shares, p99 latencies and
the few-millisecond stats aside), how far each run's figure lay from the median of its
three; FULL_RUNS gives the median / 90th percentile of that over both runs. `--runs N`
gives N to every experiment that repeats; --quick runs one. Experiments 7, 9 and 10 are
one pass whatever is asked.

The bucketfs variants are the same binary with other flags: each runs where its flags
change what is measured, with that experiment's repetitions; bucketfs, bucketfs-gcs and
every peer run in every experiment.
"""

from .pairs import PAIR_EXPERIMENTS

# experiment -> (repetitions in full mode, how far one run's figures lay from their
# three-run median (median / 90th percentile), a note)
FULL_RUNS = {
    1: (3, "1-3% / 13-19%", "all three take 4 minutes"),
    2: (3, "3-6% / 25-30%", None),
    3: (1, "2-3% / 14-22%", "three would take 75 minutes"),
    4: (1, "under 1% / 4-17%", None),
    5: (3, "5-8% / 22-29%", None),
    6: (1, "1% / 8%", "2026-11-26's run only"),
    8: (3, "9% / 26%", "in the ten runs of 2026-11-24-cloud-cp.json"),
}
# one pass by design, whatever --runs says
ONE_PASS = {7: "its figures come from experiments 2 and 6",
            9: "each job once, as the peers' scripts run it",
            10: "each step once"}
UNPLANNED = 3  # an experiment not in FULL_RUNS: three until its spread is known

# variant -> (experiments it runs in, what its flags change)
VARIANTS = {
    "bucketfs-nopt": (PAIR_EXPERIMENTS, "passthrough off: the on/off pairs"),
    "bucketfs-wb": (("2", "3", "4", "5", "6", "7", "9"),
                    "write-back changes writes; 2 for the table against native disk"),
    "bucketfs-tuned": (("1", "4", "6", "7", "10"),
                       "--preload-tree and --metadata-ttl 10 change listings and lookups, "
                       "not data"),
}


def runs(eid, override=None):
    """Repetitions of experiment `eid` in full mode: `override` (--runs N) or the plan's."""
    if eid in ONE_PASS:
        return 1
    return override or FULL_RUNS.get(eid, (UNPLANNED,))[0]


def repetitions(experiments, override=None, quick=False):
    """{experiment id (str): repetitions} of a run."""
    return {str(e): 1 if quick else runs(e, override) for e in experiments}


def recorded(meta, experiments):
    """The repetitions a run recorded when it began (for --resume): its "repetitions", or
    for a run from before the plan its single `runs` for every experiment."""
    if meta.get("repetitions"):
        return {str(e): meta["repetitions"][str(e)] for e in experiments
                if str(e) in meta["repetitions"]}
    n = 1 if meta.get("quick") else meta.get("runs")
    return {str(e): runs(e, n) for e in experiments} if isinstance(n, int) else {}


def only(name):
    """The experiments (ids as strings) a system runs in; None: all."""
    return VARIANTS[name][0] if name in VARIANTS else None


def not_run_reason(name):
    exps, why = VARIANTS[name]
    return "not run: %s runs in experiments %s only (%s)" % (name, ", ".join(exps), why)


def describe(eid, n, planned, samples=1):
    """The report's line on an experiment's repetitions. `planned`: the plan chose `n`
    (no --runs); `samples`: figures each repetition adds per system (experiment 5: 2)."""
    eid = int(eid)
    if eid in ONE_PASS:
        return "One pass per system: %s." % ONE_PASS[eid]
    s = "Repetitions per system: %d" % n
    if samples > 1:
        s += " (%d figures a repetition: %d in all)" % (samples, samples * n)
    if planned and eid in FULL_RUNS:
        _, spread, note = FULL_RUNS[eid]
        s += "; the plan's (bucketbench/plan.py): in earlier cloud runs one run's figures " \
             "lay %s (median / 90th percentile) from their three-run median%s" % (
                 spread, "; " + note if note else "")
    return s + "."
