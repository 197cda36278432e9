"""The production source of a crate as the gate scripts read it (issue 51, item 8).

Test code is left out item by item, not from the first `#[cfg(test)]` to the end of a file:
an item under `#[cfg(test)]` (a `mod`, `use`, `fn`, `impl`) is dropped with its body, and
reading goes on after it. Files and directories named `tests.rs`, `*_tests.rs`, `*_tests/`,
`tests/` and `testing/` are test code. An item ends at its first line that is a `}` at its own
indentation, or on its own line when that line ends in `;` (rustfmt's layout).
"""
import os
import re

ATTR = re.compile(r"^\s*#\[cfg\((test|all\(test.*|any\(test.*)\)\]\s*$")


def is_test_path(rel):
    parts = rel.split(os.sep)
    for part in parts[:-1]:
        if part in ("tests", "testing") or part.endswith("_tests"):
            return True
    name = parts[-1]
    return name == "tests.rs" or name.endswith("_tests.rs")


def item_end(lines, start):
    """Index of the last line of the item that starts at `start`."""
    line = lines[start]
    if line.rstrip().endswith(";"):
        return start
    indent = len(line) - len(line.lstrip())
    j = start + 1
    while j < len(lines):
        cur = lines[j]
        if cur.strip() and len(cur) - len(cur.lstrip()) == indent and cur.lstrip().startswith("}"):
            return j
        j += 1
    return len(lines) - 1


def production_lines(text):
    """The file's lines with test items blanked (kept as empty lines: numbers stay right)."""
    lines = text.split("\n")
    out = list(lines)
    i = 0
    while i < len(lines):
        if ATTR.match(lines[i]):
            j = i + 1
            while j < len(lines) and (lines[j].lstrip().startswith("#[") or lines[j].lstrip().startswith("//")):
                j += 1
            if j >= len(lines):
                break
            end = item_end(lines, j)
            for k in range(i, end + 1):
                out[k] = ""
            i = end + 1
            continue
        i += 1
    return out


def sources(root):
    """(path relative to root, production lines) of every production .rs file under root."""
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "target")
        for name in sorted(files):
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if is_test_path(rel):
                continue
            with open(path, encoding="utf-8") as f:
                yield path, rel, production_lines(f.read())
