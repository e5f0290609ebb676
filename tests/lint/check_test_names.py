#!/usr/bin/env python3
"""Test and section names that Catch 2.13 can report when they fail.

    check_test_names.py SOURCE_ROOT

Catch's console reporter indents a failing test's (or section's) name after its first ": " on
every wrapped line (ConsoleReporter::printHeaderString). Past the 79-column line that indent
leaves no width, and the reporter aborts in std::string::substr -- the failure's own report is
lost. A name longer than a line must have its first ": " within the first 72 characters, or
none. The check runs on a fixture first (a bad name must be found), then on tests/.
"""
import pathlib
import re
import sys

NAME = re.compile(r'\b(TEST_CASE|SECTION)\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)')
PART = re.compile(r'"((?:[^"\\]|\\.)*)"')
LINE = 79  # CATCH_CONFIG_CONSOLE_WIDTH - 1
MOST = 72  # the first ": " past this, in a name that wraps, leaves no width


def bad_names(text):
    out = []
    for m in NAME.finditer(text):
        name = "".join(PART.findall(m.group(2)))
        colon = name.find(": ")
        if len(name) > LINE - 4 and colon > MOST:
            out.append((text.count("\n", 0, m.start()) + 1, colon, name))
    return out


FIXTURE = '''
TEST_CASE("short: fine", "[x]") {}
TEST_CASE("a long name whose first colon comes late enough that the reporter, wrapping it "
          "after the colon: aborts", "[x]") {
  SECTION("a section: with its colon early, and a name long enough to wrap over the line") {}
}
'''


def main():
    found = bad_names(FIXTURE)
    if [line for line, _, _ in found] != [3]:
        print(f"check_test_names: the fixture's bad name not found alone: {found}")
        return 1
    root = pathlib.Path(sys.argv[1]) / "tests"
    bad = 0
    files = sorted(p for p in root.rglob("*") if p.suffix in (".cc", ".cu", ".h"))
    for path in files:
        for line, colon, name in bad_names(path.read_text(errors="replace")):
            bad += 1
            print(f"{path}:{line}: the first ': ' is at column {colon} of a name Catch wraps "
                  f"(at most {MOST}): its failure report would abort: \"{name}\"")
    print(f"{len(files)} files checked, {bad} names Catch cannot report")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
