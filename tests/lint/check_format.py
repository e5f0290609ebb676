#!/usr/bin/env python3
"""Fails when a C/C++/CUDA file of the tree is not formatted by .clang-format (clang-format-14).

  check_format.py SOURCE_ROOT [CLANG_FORMAT]

Every *.cc, *.h, *.hpp, *.cu under the source folders is checked; build folders are not. The
output names each file that differs and the first line clang-format would change, and says how
to fix it: `make format` (or clang-format-14 -i FILE).
"""
import os
import shutil
import subprocess
import sys

FOLDERS = ["bench", "collectives", "common", "ddp", "examples", "fuzz", "include", "kernels",
           "tests", "tools", "transport"]
EXTS = (".cc", ".h", ".hpp", ".cu")


def sources(root):
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            dirnames[:] = sorted(d for d in dirnames if d != "corpus")
            for name in sorted(filenames):
                if name.endswith(EXTS):
                    yield os.path.join(dirpath, name)


def main():
    root = sys.argv[1]
    tool = sys.argv[2] if len(sys.argv) > 2 else "clang-format-14"
    if shutil.which(tool) is None:
        print(f"skip: {tool} not found (apt-get install clang-format-14; make test installs it)")
        return 77
    if not os.path.exists(os.path.join(root, ".clang-format")):
        print(f"no .clang-format in {root}")
        return 1
    files = list(sources(root))
    # One process for the whole tree; --dry-run prints "FILE:LINE:COL: warning: code should be
    # clang-formatted" with the offending line for every place that would change.
    out = subprocess.run([tool, "--style=file", "--dry-run", *files], capture_output=True,
                         text=True, cwd=root, check=False)
    first = {}
    for row in out.stderr.splitlines():
        if ": warning: code should be clang-formatted" in row:
            path, line = row.split(":")[0:2]
            first.setdefault(os.path.relpath(path, root), line)
        elif ": error:" in row:
            print(row)
            first.setdefault(row, "?")
    for rel, line in sorted(first.items()):
        print(f"{rel}:{line}: not formatted")
    bad = len(first)
    print(f"{len(files)} files checked, {bad} not formatted"
          + (" -- run `make format` (clang-format-14 -i FILE)" if bad else ""))
    return 1 if bad or not files or out.returncode not in (0, 1) else 0


if __name__ == "__main__":
    sys.exit(main())
