#!/usr/bin/env python3
"""Proves check_format.py can fail: in a scratch tree with the repo's .clang-format, a badly
formatted file must be reported (exit 1, naming it) and the same file formatted must pass.

  selftest_format.py SOURCE_ROOT
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BAD = "int  f( int x ){return x+1;}\n"
GOOD = "int f(int x) {\n  return x + 1;\n}\n"


def check(tree):
    out = subprocess.run([sys.executable, os.path.join(HERE, "check_format.py"), tree],
                         capture_output=True, text=True, check=False)
    return out.returncode, out.stdout


def main():
    root = sys.argv[1]
    if shutil.which("clang-format-14") is None:
        print("skip: clang-format-14 not found")
        return 77
    with tempfile.TemporaryDirectory() as tree:
        shutil.copy(os.path.join(root, ".clang-format"), tree)
        os.makedirs(os.path.join(tree, "common"))
        path = os.path.join(tree, "common", "x.cc")
        with open(path, "w", encoding="utf-8") as f:
            f.write(BAD)
        rc, text = check(tree)
        print(text)
        if rc != 1 or "common/x.cc:1: not formatted" not in text:
            print(f"FAIL: an unformatted file passed (exit {rc})")
            return 1
        with open(path, "w", encoding="utf-8") as f:
            f.write(GOOD)
        rc, text = check(tree)
        print(text)
        if rc != 0:
            print(f"FAIL: a formatted file was refused (exit {rc})")
            return 1
    print("ok: the format check refuses an unformatted file and accepts it formatted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
