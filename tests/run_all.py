#!/usr/bin/env python3
"""Runs the whole test suite through `meson test` and ends with the line `N passed, N failed`.

A test that exits 77 is a skip: it printed its reason, and the reason is repeated here.
"""
import json
import os
import subprocess
import sys

build = sys.argv[1] if len(sys.argv) > 1 else "build"
jobs = os.environ.get("CHORUS_TEST_JOBS", "2")
rc = subprocess.call(["meson", "test", "-C", build, "--print-errorlogs",
                      "--num-processes", jobs] + sys.argv[2:])
passed = failed = skipped = 0
log = os.path.join(build, "meson-logs", "testlog.json")
with open(log) as f:
    for line in f:
        if not line.strip():
            continue
        t = json.loads(line)
        res = t.get("result")
        if res in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif res == "SKIP":
            skipped += 1
            reason = [l for l in (t.get("stdout") or "").splitlines() if "skip" in l.lower()]
            print(f"skipped {t['name']}: {reason[-1] if reason else '(no reason printed)'}")
        else:
            failed += 1
            print(f"FAILED {t['name']} ({res})")
if rc != 0 and failed == 0:
    failed = 1  # meson itself failed (build error, no tests run)
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
