#!/usr/bin/env python3
"""Runs one libFuzzer target for CHORUS_FUZZ_SECONDS (default 5) and fails on any finding.

usage: run_fuzz.py FUZZER SEED_DIR

The seeds in SEED_DIR (in git) are read, never written: new inputs go to a temporary corpus that
is deleted afterwards. Any crash, sanitizer report, leak, slow input (-timeout) or memory blow-up
(-rss_limit_mb, -malloc_limit_mb) fails the run; the input that caused it is kept under
<build>/fuzz-artifacts/<target>/ and the command that replays it is printed. libFuzzer's own exit
code for findings is 77, which meson would read as "skipped", so findings exit 1 here.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

PER_INPUT_SECONDS = 10   # an input taking longer is a hang (-timeout)
RSS_LIMIT_MB = 2048      # and a process above this, or one malloc above it, a blow-up

fuzzer, seeds = sys.argv[1], sys.argv[2]
name = os.path.basename(fuzzer).removeprefix("fuzz_")
seconds = int(os.environ.get("CHORUS_FUZZ_SECONDS", "5"))
if not os.path.isdir(seeds) or not os.listdir(seeds):
    sys.exit(f"fuzz/{name}: no seed inputs in {seeds} (each target needs at least one, in git)")
artifacts = os.path.join(os.path.dirname(os.path.abspath(fuzzer)), "..", "fuzz-artifacts", name)
artifacts = os.path.normpath(artifacts)
shutil.rmtree(artifacts, ignore_errors=True)  # findings of an earlier run were reported then
os.makedirs(artifacts)

env = dict(os.environ)
env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
with tempfile.TemporaryDirectory(prefix=f"chorus-fuzz-{name}-") as corpus:
    cmd = [fuzzer, f"-max_total_time={seconds}", f"-timeout={PER_INPUT_SECONDS}",
           f"-rss_limit_mb={RSS_LIMIT_MB}", f"-malloc_limit_mb={RSS_LIMIT_MB}", "-detect_leaks=1",
           "-error_exitcode=1", "-timeout_exitcode=1", "-print_final_stats=1",
           f"-artifact_prefix={artifacts}/", corpus, seeds]
    print(" ".join(cmd), flush=True)
    try:
        # The run ends itself at -max_total_time; this bound catches a fuzzer that does not.
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", timeout=seconds + 120)
        out, rc = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
        rc = "timeout"
    runs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", out)
    found = sorted(os.listdir(artifacts))
    print(out[-20000:])
    if rc != 0 or found:
        print(f"fuzz/{name}: FAILED (exit {rc}); inputs kept in {artifacts}: {found}")
        for f in found:
            print(f"  replay: {fuzzer} {os.path.join(artifacts, f)}")
        sys.exit(1)
    if not runs or int(runs[-1]) == 0:
        sys.exit(f"fuzz/{name}: the fuzzer ran no inputs")
    print(f"fuzz/{name}: {runs[-1]} inputs in {seconds} s, no findings")
