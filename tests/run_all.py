#!/usr/bin/env python3
"""Runs the test suite of one or more builds through `meson test`; ends with `N passed, N failed`.

    run_all.py BUILD [MESON_TEST_ARGS...]        every test of one build
    run_all.py --stage BUILD[=PATTERNS] ...      several builds in turn, one total

A stage runs the tests of BUILD whose names match PATTERNS (comma-separated fnmatch patterns,
"!pattern" excludes; all tests when absent). It first builds only what those tests need (ninja on their targets), so
a build configured for a few tests (TSan, fuzzing) compiles nothing else. Stages run one after
the other even when one fails; the last lines give each stage's build and test time (wall and
CPU seconds, children included) and the total over all stages.

Counts come from meson's own summary. A test that exits 77 is a skip: it printed its reason,
and the reason is repeated here (from meson's JSON log).
"""
import fnmatch
import json
import os
import re
import resource
import subprocess
import sys
import time

JOBS = os.environ.get("CHORUS_TEST_JOBS", "2")


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Timer:
    def __enter__(self):
        self.wall, self.cpu = time.monotonic(), cpu_seconds()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.monotonic() - self.wall, cpu_seconds() - self.cpu


def introspect(build, what):
    out = subprocess.run(["meson", "introspect", build, what], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    return json.loads(out)


def needed_outputs(build, tests):
    """Build-relative paths of the targets the tests run, depend on, or name in their arguments."""
    targets = introspect(build, "--targets")
    by_id = {t["id"]: t["filename"] for t in targets}
    outputs = {os.path.realpath(f) for t in targets for f in t["filename"]}
    root = os.path.realpath(build)
    paths = set()
    for t in tests:
        files = [f for dep in t.get("depends", []) for f in by_id.get(dep, [])]
        files += t["cmd"] + list((t.get("env") or {}).values())  # programs passed as arguments
        for f in files:
            real = os.path.realpath(f)
            if real in outputs:
                paths.add(os.path.relpath(real, root))
    return sorted(paths)


def select(build, patterns):
    """Tests matching a pattern and no "!pattern"."""
    tests = introspect(build, "--tests")
    if not patterns:
        return tests
    take = [p for p in patterns if not p.startswith("!")]
    drop = [p[1:] for p in patterns if p.startswith("!")]
    match = lambda name, pats: any(fnmatch.fnmatchcase(name, p) for p in pats)
    return [t for t in tests if match(t["name"], take) and not match(t["name"], drop)]


def run_meson_test(build, args):
    """Runs meson test, echoing its output; returns (counts, rc)."""
    cmd = ["meson", "test", "-C", build, "--print-errorlogs", "--num-processes", JOBS] + args
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace")
    counts = {}
    for line in proc.stdout:
        sys.stdout.write(line)
        m = re.match(r"^(Ok|Expected Fail|Fail|Unexpected Pass|Skipped|Timeout):\s+(\d+)\s*$", line)
        if m:
            counts[m.group(1)] = int(m.group(2))
    return counts, proc.wait()


def test_log(build):
    """meson's JSON log of the last `meson test` in BUILD, one dict per test."""
    try:
        with open(os.path.join(build, "meson-logs", "testlog.json"), errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line.strip("\x00\n ")))
        except ValueError:
            continue
    return out


def print_skips(build):
    for t in test_log(build):
        if t.get("result") == "SKIP":
            reason = [l for l in (t.get("stdout") or "").splitlines() if "skip" in l.lower()]
            print(f"skipped {t['name']}: {reason[-1] if reason else '(no reason printed)'}")


SANITIZER_REPORT = re.compile(r"ERROR: (Address|Thread|Leak|Memory)Sanitizer|runtime error:|"
                              r"WARNING: ThreadSanitizer")
# Where a sanitizer report's parts begin: its stack frames and the headers between them (a race's
# two accesses, the block and the threads; a bad access, its allocation and free).
REPORT_PART = re.compile(r"\s(?=#\d+\s|Previous |(?:Read|Write|Atomic \w+) of size|Location is|"
                         r"Thread T\d+|Mutex M\d+|SUMMARY:|freed by thread|previously allocated|"
                         r"(?:READ|WRITE) of size|0x[0-9a-f]+ is located)")
FRAME = re.compile(r"#(\d+)(?:\s|$)")
NOISE = re.compile(r"\s*\((?:BuildId: [0-9a-f]+|[\w./+-]+\+0x[0-9a-f]+)\)|<null>|=====+|"
                   r"ThreadSanitizer: reported.*")
DIRS = re.compile(r"(?<=\s)/\S*/(?=[^/\s]+:\d)")  # a frame's file: its name and line
FRAMES_KEPT = 4


def condense_report(lines):
    """A sanitizer report (lines wrapped anywhere, as a test's message holds them) in short: every
    header, and the first FRAMES_KEPT frames of each stack outside the standard library, without
    addresses and build ids, up to its SUMMARY line."""
    text = DIRS.sub("", NOISE.sub("", " ".join(lines)))
    parts, kept = [], 0
    for part in REPORT_PART.split(text):
        part = part.strip()
        frame = FRAME.match(part)
        if frame is None:
            parts.append(part)
            kept = 0
            if part.startswith("SUMMARY:"):
                break
        elif (kept < FRAMES_KEPT and part[frame.end():].strip() and
              not re.match(r"#\d+\s+(?:\S+\s+)?std::", part)):
            parts.append(part)
            kept += 1
    return " | ".join(parts)


def failures(build):
    """'BUILD/TEST (RESULT): the first line of its output that says what failed', per failure."""
    out = []
    for t in test_log(build):
        if t.get("result") not in ("FAIL", "TIMEOUT", "UNEXPECTEDPASS", "ERROR"):
            continue
        text = (t.get("stdout") or "") + (t.get("stderr") or "")
        lines = [l.strip() for l in text.splitlines() if l.strip()]
        at = next((i for i, l in enumerate(lines) if "FAILED" in l), None)
        if at is None:
            at = next((i for i, l in enumerate(lines)
                       if re.search(r"FAIL|error|lacks|timed out", l)), 0)
        # Enough to hold a failed rank's own output (the CI run shows only the log's tail, and a
        # 6-line hint once ended at "rank 2 (exit 1) output:"), and a sanitizer's report first.
        hint = " | ".join(lines[at:at + 40])[:2500] or "(no output)"
        san = next((i for i, l in enumerate(lines) if SANITIZER_REPORT.search(l)), None)
        if san is not None:
            hint = condense_report(lines[san:san + 200])[:3000] + " || " + hint
        out.append(f"{build}/{t['name']} ({t['result']}): {hint}")
    return out


def run_stage(build, patterns, extra_args):
    """Returns (passed, failed, skipped, build Timer or None, test Timer)."""
    build_time = None
    args = list(extra_args)
    if patterns:
        # Reconfigure first if meson.build files changed, so the list of tests is current.
        if subprocess.call(["ninja", "-C", build, "build.ninja"]) != 0:
            print(f"{build}: meson could not reconfigure it (see above)")
            return 0, 1, 0, None, None
        try:
            tests = select(build, patterns)
        except (subprocess.CalledProcessError, ValueError) as e:
            print(f"{build}: cannot list its tests ({e})")
            return 0, 1, 0, None, None
        if not tests:
            print(f"{build}: no test matches {','.join(patterns)}")
            return 0, 1, 0, None, None
        with Timer() as build_time:
            rc = subprocess.call(["ninja", "-C", build, f"-j{JOBS}"] + needed_outputs(build, tests))
        if rc != 0:
            print(f"{build}: the build failed (see above)")
            return 0, 1, 0, build_time, None
        args = ["--no-rebuild"] + args + [t["name"] for t in tests]
    with Timer() as test_time:
        counts, rc = run_meson_test(build, args)
    print_skips(build)
    passed = counts.get("Ok", 0) + counts.get("Expected Fail", 0)
    failed = counts.get("Fail", 0) + counts.get("Unexpected Pass", 0) + counts.get("Timeout", 0)
    skipped = counts.get("Skipped", 0)
    if rc != 0 and failed == 0:
        failed = 1  # meson itself failed (a build error, or no summary)
        print("meson test failed before running the suite (see above)")
    return passed, failed, skipped, build_time, test_time


def parse_args(argv):
    """[(build, patterns, extra meson test args)]"""
    if not argv or argv[0] != "--stage":
        return [(argv[0] if argv else "build", [], argv[1:])]
    stages = []
    for flag, spec in zip(argv[0::2], argv[1::2]):
        if flag != "--stage":
            sys.exit(f"run_all.py: expected --stage BUILD[=PATTERNS], got {flag}")
        build, _, pats = spec.partition("=")
        stages.append((build, [p.strip() for p in pats.split(",") if p.strip()], []))
    return stages


def main():
    stages = parse_args(sys.argv[1:])
    totals = [0, 0, 0]
    report = []
    for i, (build, patterns, extra) in enumerate(stages):
        if len(stages) > 1:
            what = ",".join(patterns) if patterns else "every test"
            print(f"\n==== stage {i + 1}/{len(stages)}: {build} ({what})", flush=True)
        p, f, s, bt, tt = run_stage(build, patterns, extra)
        totals = [totals[0] + p, totals[1] + f, totals[2] + s]
        report.append((build, p, f, s, bt, tt))
    if len(stages) > 1 or sys.argv[1:2] == ["--stage"]:
        print("\nstage                 passed failed skipped   build wall/cpu s"
              "   tests wall/cpu s")
        fmt = lambda t: f"{t.wall:7.0f} /{t.cpu:6.0f}" if t else "      - /     -"
        for build, p, f, s, bt, tt in report:
            print(f"{build:<20} {p:7} {f:6} {s:7}   {fmt(bt):>16}   {fmt(tt):>16}")
    # The names of what failed come last, where a log's tail shows them.
    for build, _, f, _, _, _ in report:
        if f:
            for line in failures(build):
                print("failed: " + line)
    print(f"{totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    sys.exit(1 if totals[1] else 0)


if __name__ == "__main__":
    main()
