#!/usr/bin/env python3
"""The layering check: a file may include only headers of its own layer and of the layers its
layer lists as direct dependencies in the layer table (tools/lint/layers.txt).

    check_layers.py --root SRC --table TABLE [--stamp FILE --depfile FILE] [FILES...]

Without FILES it checks every C/C++ file under SRC (hidden folders and meson build folders
skipped); a file that lies in no layer is an error too, so the table covers the whole tree. Each
violation is printed as `path:line: error: ...`, naming the included header, both layers and
the rule; the exit status is 1 when there is any. With --stamp, a successful run writes that
file, and --depfile lists every file and folder read, so the build reruns the check only when
one of them changes (a new file changes its folder). Python 3, standard library only.
"""
import argparse
import os
import re
import sys

SOURCE_SUFFIXES = (".h", ".hpp", ".c", ".cc", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
PUBLIC_INCLUDE_DIR = "include"  # -Iinclude: <chorus/chorus.h> is include/chorus/chorus.h


class TableError(Exception):
    pass


def read_table(path):
    """{layer: [direct dependencies]} in file order; '*' stands for every layer."""
    table = {}
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            name, sep, deps = line.partition(":")
            name = name.strip()
            if not sep or not name:
                raise TableError(f"{path}:{number}: expected 'layer: dependencies', got '{line}'")
            if name in table:
                raise TableError(f"{path}:{number}: layer {name} is listed twice")
            table[name] = deps.split()
    for name, deps in table.items():
        for dep in deps:
            if dep == "*":
                if deps != ["*"]:
                    raise TableError(f"{path}: layer {name}: '*' must stand alone")
            elif dep not in table:
                raise TableError(f"{path}: layer {name} depends on {dep}, which is no layer")
            elif dep == name:
                raise TableError(f"{path}: layer {name} lists itself")
    cycle = find_cycle(table)
    if cycle:
        raise TableError(f"{path}: the layers depend on each other in a circle: "
                         + " -> ".join(cycle))
    return table


def find_cycle(table):
    state = {}  # layer -> 1 while on the path, 2 when done

    def visit(layer, path):
        state[layer] = 1
        for dep in table[layer]:
            if dep == "*":
                continue
            if state.get(dep) == 1:
                return path + [layer, dep]
            if dep not in state:
                found = visit(dep, path + [layer])
                if found:
                    return found
        state[layer] = 2
        return None

    for layer in table:
        if layer not in state:
            found = visit(layer, [])
            if found:
                return found[found.index(found[-1]):]
    return None


def layer_of(path, table):
    """The layer with the longest folder prefix holding path (relative, '/'-separated)."""
    best = None
    for layer in table:
        if path.startswith(layer + "/") and (best is None or len(layer) > len(best)):
            best = layer
    return best


def reaches(table, start, goal):
    """Whether layer start depends on goal, directly or through other layers."""
    seen, todo = set(), [start]
    while todo:
        layer = todo.pop()
        for dep in table.get(layer, []):
            if dep == goal:
                return True
            if dep != "*" and dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return False


def resolve(root, path, kind, name):
    """The tree path an include names, or None for a header from outside the tree."""
    bases = [os.path.dirname(path)] if kind == '"' else []
    bases += ["", PUBLIC_INCLUDE_DIR]
    for base in bases:
        candidate = os.path.normpath(os.path.join(base, name)).replace(os.sep, "/")
        if candidate.startswith("../"):
            continue
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate
    return None


def walk(root, folders_read):
    """Every C/C++ file under root, relative and sorted; records the folders it read."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__"
                         and not os.path.isdir(os.path.join(folder, d, "meson-private")))
        folders_read.append(folder)
        rel = os.path.relpath(folder, root)
        for name in files:
            if name.endswith(SOURCE_SUFFIXES):
                found.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
    return sorted(found)


def check_file(root, path, table, table_name):
    """Error lines for one file."""
    layer = layer_of(path, table)
    if layer is None:
        return [f"{path}:1: error: the file lies in no layer of {table_name}; "
                f"add its folder there with the layers it may use"]
    allowed = table[layer]
    if allowed == ["*"]:
        return []
    errors = []
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = resolve(root, path, m.group(1), m.group(2))
            if target is None:
                continue
            other = layer_of(target, table)
            if other is None or other == layer or other in allowed:
                continue
            close = ">" if m.group(1) == "<" else '"'
            shown = m.group(1) + m.group(2) + close
            rule = (f"layer {layer} may include only {', '.join([layer] + allowed)} "
                    f"({table_name})")
            if reaches(table, other, layer):
                what = f"upward include: {other} depends on {layer}"
            else:
                what = f"undeclared dependency: {layer} does not list {other}"
            errors.append(f"{path}:{number}: error: includes {shown} (layer {other}), an "
                          f"{what}; {rule}")
    return errors


def write_depfile(depfile, stamp, inputs):
    esc = lambda p: p.replace("\\", "\\\\").replace(" ", "\\ ").replace("$", "$$")
    with open(depfile, "w", encoding="utf-8") as f:
        f.write(f"{esc(stamp)}: " + " \\\n  ".join(esc(p) for p in inputs) + "\n")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="the source tree")
    ap.add_argument("--table", required=True, help="the layer table (tools/lint/layers.txt)")
    ap.add_argument("--stamp", help="file written after a clean run (the build's output)")
    ap.add_argument("--depfile", help="make-style list of what was read, for the build")
    ap.add_argument("files", nargs="*", help="files to check (relative to --root); default all")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    table_name = os.path.relpath(os.path.abspath(args.table), root)
    if table_name.startswith(".."):
        table_name = args.table
    try:
        table = read_table(args.table)
    except (OSError, TableError) as e:
        print(f"check_layers: {e}", file=sys.stderr)
        return 1
    folders = []
    if args.files:
        files = [os.path.relpath(os.path.abspath(os.path.join(root, p)), root).replace(os.sep, "/")
                 for p in args.files]
    else:
        files = walk(root, folders)
    errors = []
    for path in files:
        try:
            errors += check_file(root, path, table, table_name)
        except OSError as e:
            errors.append(f"{path}:1: error: cannot read it ({e.strerror})")
    for line in errors:
        print(line, file=sys.stderr)
    if errors:
        print(f"check_layers: {len(errors)} include(s) break the layering of {table_name} "
              f"(of {len(files)} files)", file=sys.stderr)
        return 1
    if args.depfile and args.stamp:
        write_depfile(args.depfile, args.stamp, [os.path.abspath(args.table)] + folders
                      + [os.path.join(root, p) for p in files])
    if args.stamp:
        with open(args.stamp, "w", encoding="utf-8") as f:
            f.write(f"{len(files)} files follow {table_name}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
