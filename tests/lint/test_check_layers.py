#!/usr/bin/env python3
"""Tests the layering check (tools/lint/check_layers.py) on small trees it writes itself, and
that the build runs it.

    test_check_layers.py CHECK_LAYERS_PY BUILD_DIR

A tree with an upward include, an undeclared sideways include, an include of a dependency's
dependency (only direct ones count), an undeclared public header and a file in no layer must
give exactly those five errors, each naming the file and line; the same tree without them must
pass; a table whose layers depend on each other in a circle is refused. Last, the build in
BUILD_DIR must have the check as a target built by default, so `ninja` fails on a bad include.
"""
import json
import os
import subprocess
import sys
import tempfile

TABLE = """\
# a fixture table
low:
include:
mid:    low
side:
top:    mid include
tests:  *
"""

GOOD = {
    "low/a.h": "#pragma once\n// #include \"top/t.h\" is a comment, not an include\n",
    "mid/b_local.h": "#pragma once\n",
    "mid/b.h": "#pragma once\n#include <vector>\n#include \"b_local.h\"\n#include \"low/a.h\"\n",
    "side/s.h": "#pragma once\n",
    "include/pub/p.h": "#pragma once\n",
    "top/t.h": "#pragma once\n#include \"mid/b.h\"\n#include <pub/p.h>\n",
    "tests/x.cc": "#include \"top/t.h\"\n#include \"side/s.h\"\n#include \"low/a.h\"\n",
}

BAD = {
    "mid/up.cc": "// upward\n#include \"mid/b.h\"\n#include \"top/t.h\"\n",
    "mid/side.cc": "// sideways\n  #  include \"side/s.h\"\n",
    "top/deep.cc": "#include \"low/a.h\"\n",
    "low/pub.cc": "#include <pub/p.h>\n",
    "stray/z.cc": "int z;\n",
}

EXPECTED = [
    ("mid/up.cc:3: error: includes \"top/t.h\" (layer top), an upward include: top depends on "
     "mid; layer mid may include only mid, low"),
    ("mid/side.cc:2: error: includes \"side/s.h\" (layer side), an undeclared dependency: mid "
     "does not list side"),
    ("top/deep.cc:1: error: includes \"low/a.h\" (layer low), an undeclared dependency: top "
     "does not list low"),
    ("low/pub.cc:1: error: includes <pub/p.h> (layer include), an undeclared dependency: low "
     "does not list include"),
    "stray/z.cc:1: error: the file lies in no layer",
]

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def write_tree(root, files, table=TABLE):
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)
    with open(os.path.join(root, "layers.txt"), "w") as f:
        f.write(table)


def run(checker, root, *extra):
    cmd = [sys.executable, checker, "--root", root, "--table", os.path.join(root, "layers.txt")]
    proc = subprocess.run(cmd + list(extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=60)
    print(f"$ {' '.join(cmd + list(extra))}\n{proc.stdout}(exit {proc.returncode})")
    return proc.returncode, proc.stdout


def test_bad_tree(checker):
    with tempfile.TemporaryDirectory() as root:
        write_tree(root, {**GOOD, **BAD})
        rc, out = run(checker, root, "--stamp", os.path.join(root, "stamp"))
        expect(rc == 1, f"a tree with {len(BAD)} bad files: exit 1, got {rc}")
        for line in EXPECTED:
            expect(line in out, f"the checker names the violation: {line}")
        errors = [l for l in out.splitlines() if ": error: " in l]
        expect(len(errors) == len(EXPECTED), f"{len(EXPECTED)} errors, got {len(errors)}")
        expect(not os.path.exists(os.path.join(root, "stamp")), "no stamp after a failed check")
        # One file named on the command line: only its errors.
        rc, out = run(checker, root, "mid/side.cc")
        expect(rc == 1 and EXPECTED[1] in out and out.count(": error: ") == 1,
               "a file given on the command line is checked alone")


def test_good_tree(checker):
    with tempfile.TemporaryDirectory() as root:
        write_tree(root, GOOD)
        stamp, depfile = os.path.join(root, "stamp"), os.path.join(root, "stamp.d")
        rc, out = run(checker, root, "--stamp", stamp, "--depfile", depfile)
        expect(rc == 0, f"a tree that follows its table passes, got exit {rc}")
        expect(os.path.exists(stamp), "a clean check writes the stamp")
        deps = open(depfile).read() if os.path.exists(depfile) else ""
        expect(os.path.join(root, "mid", "b.h") in deps and os.path.join(root, "mid") in deps,
               "the depfile lists the files and folders read")


def test_bad_table(checker):
    with tempfile.TemporaryDirectory() as root:
        write_tree(root, {"low/a.h": ""}, "low: high\nhigh: low\n")
        rc, out = run(checker, root)
        expect(rc == 1 and "circle" in out, "layers depending on each other are refused")
        write_tree(root, {"low/a.h": ""}, "low: nowhere\n")
        rc, out = run(checker, root)
        expect(rc == 1 and "nowhere, which is no layer" in out, "an unknown layer is refused")


def test_build_runs_it(build):
    path = os.path.join(build, "meson-info", "intro-targets.json")
    with open(path) as f:
        targets = json.load(f)
    runs = [t for t in targets if t["type"] == "custom" and any(
        "check_layers.py" in " ".join(s.get("compiler", []) + s.get("parameters", []))
        for s in t.get("target_sources", []))]
    expect(len(runs) == 1, f"one custom target of {build} runs check_layers.py, got {len(runs)}")
    expect(all(t["build_by_default"] for t in runs), "the layering check is built by default")


def main():
    checker, build = sys.argv[1], sys.argv[2]
    test_bad_tree(checker)
    test_good_tree(checker)
    test_bad_table(checker)
    test_build_runs_it(build)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
