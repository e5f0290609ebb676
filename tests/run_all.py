#!/usr/bin/env python3
"""Runs the whole test suite through `meson test` and ends with the line `N passed, N failed`.

Counts come from meson's own summary. A test that exits 77 is a skip: it printed its reason,
and the reason is repeated here (from meson's JSON log).
"""
import json
import os
import re
import subprocess
import sys

build = sys.argv[1] if len(sys.argv) > 1 else "build"
jobs = os.environ.get("CHORUS_TEST_JOBS", "2")
proc = subprocess.Popen(["meson", "test", "-C", build, "--print-errorlogs", "--num-processes", jobs] + sys.argv[2:],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
counts = {}
for line in proc.stdout:
    sys.stdout.write(line)
    m = re.match(r"^(Ok|Expected Fail|Fail|Unexpected Pass|Skipped|Timeout):\s+(\d+)\s*$", line)
    if m:
        counts[m.group(1)] = int(m.group(2))
rc = proc.wait()

try:
    with open(os.path.join(build, "meson-logs", "testlog.json"), errors="replace") as f:
        for line in f:
            try:
                t = json.loads(line.strip("\x00\n "))
            except ValueError:
                continue
            if t.get("result") == "SKIP":
                reason = [l for l in (t.get("stdout") or "").splitlines() if "skip" in l.lower()]
                print(f"skipped {t['name']}: {reason[-1] if reason else '(no reason printed)'}")
except OSError:
    pass

passed = counts.get("Ok", 0) + counts.get("Expected Fail", 0)
failed = counts.get("Fail", 0) + counts.get("Unexpected Pass", 0) + counts.get("Timeout", 0)
skipped = counts.get("Skipped", 0)
if rc != 0 and failed == 0:
    failed = 1  # meson itself failed (a build error, or no summary)
    print("meson test failed before running the suite (see above)")
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
