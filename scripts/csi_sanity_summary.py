"""Summarize a csi-sanity run (ginkgo -v output): the counts, each failed test, and each
skipped test grouped under the reason csi-sanity gave for skipping it."""
import collections
import re
import sys

lines = open(sys.argv[1], errors="replace").read().splitlines()
skipped = collections.defaultdict(list)
failed = []
for i, line in enumerate(lines):
    if line.startswith("S [SKIPPED]") and i + 1 < len(lines):
        name = re.sub(r" \[(BeforeEach|It)\]", "", lines[i + 1])
        reason = next((l.strip()[len("[SKIPPED] "):] for l in lines[i + 2:i + 12]
                       if l.strip().startswith("[SKIPPED] ") and " in [" not in l), "no reason given")
        skipped[reason].append(name)
    elif line.startswith("  [FAIL]"):
        failed.append(line.strip())
for line in lines:
    if line.startswith(("Ran ", "SUCCESS!", "FAIL!")):
        print(line)
for reason, names in sorted(skipped.items()):
    print(f"skipped by csi-sanity, {len(names)} tests: {reason}")
    for n in names:
        print(f"    {n}")
for f in failed:
    print(f)
