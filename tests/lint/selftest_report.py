#!/usr/bin/env python3
"""Proves run_all.py's failure summary holds a sanitizer report's substance: a real
ThreadSanitizer report (tsan_report.txt, from a racy program), wrapped at 79 columns and
indented as a test's message holds it, must condense to both accesses with their own frames, the
block, the thread's creation and the SUMMARY line, without build ids, addresses or standard
library frames, in under 1500 characters.

  selftest_report.py
"""
import os
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import run_all  # noqa: E402


def main():
    with open(os.path.join(HERE, "tsan_report.txt")) as f:
        report = f.read()
    lines = ["rank 1:", "chorus rank 1 INFO: bootstrap: rank 1 of 3"]
    for line in report.splitlines():
        lines += ["  " + w for w in textwrap.wrap(line, 79)]
    lines += ["chorus rank 1 INFO: links: rank 1: 1 shm peer(s)"]
    start = next(i for i, l in enumerate(lines) if run_all.SANITIZER_REPORT.search(l))
    short = run_all.condense_report([l.strip() for l in lines[start:]])
    print(short)
    want = ["WARNING: ThreadSanitizer: data race", "Read of size 1", "#0 main race.cc:9:21",
            "write of size 8", "#1 writer()::$_0::operator()() const race.cc:5:48",
            "Location is heap block of size 64", "#1 main race.cc:7:9",
            "Thread T1", "#2 main race.cc:8:15", "SUMMARY: ThreadSanitizer: data race"]
    unwanted = ["BuildId", "+0x", "__invoke", "_M_start_thread", "=====", "links:", "/src/"]
    missing = [w for w in want if w not in short]
    present = [u for u in unwanted if u in short]
    if missing or present or len(short) > 1500:
        print(f"FAILED: missing {missing}, present {present}, {len(short)} characters")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
