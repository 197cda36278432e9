#!/usr/bin/env python3
"""Prints the functions longer than a bound (default 100 lines, signature to closing brace) in
the production code of the given source directories: test modules (`#[cfg(test)]` to the end
of a file), `*_tests.rs`, `tests.rs` and `testing/` are left out.

    python3 scripts/long-functions.py crates/*/src

Exits 1 when there is one (issue 33: none); `scripts/test.sh` runs it on every crate. A
function ends at the first line that is a `}` at its own indentation (rustfmt's layout).
"""
import os
import re
import sys

bound = int(os.environ.get("LONG_FUNCTION_LINES", "100"))
found = []
for root in sys.argv[1:]:
    for dirpath, _, files in os.walk(root):
        if "/testing" in dirpath or "/target" in dirpath:
            continue
        for name in files:
            if not name.endswith(".rs") or name.endswith("_tests.rs") or name == "tests.rs":
                continue
            path = os.path.join(dirpath, name)
            lines = open(path, encoding="utf-8").read().split("\n")
            for k, line in enumerate(lines):
                if line.startswith("#[cfg(test)]"):
                    lines = lines[:k]
                    break
            for i, line in enumerate(lines):
                m = re.match(r"^(\s*)(pub(\([^)]*\))? )?(async )?(const )?(unsafe )?fn (\w+)", line)
                if not m or line.rstrip().endswith(";"):
                    continue
                indent = m.group(1)
                j = i + 1
                while j < len(lines) and not (
                    lines[j].startswith(indent + "}") and len(lines[j]) - len(lines[j].lstrip()) == len(indent)
                ):
                    j += 1
                if j - i + 1 > bound:
                    found.append((j - i + 1, path, i + 1, m.group(7)))
for n, path, line, fn in sorted(found, reverse=True):
    print(f"{path}:{line}: {fn} is {n} lines (at most {bound})")
sys.exit(1 if found else 0)
