#!/usr/bin/env python3
"""Prints the functions longer than a bound (default 100 lines, signature to closing brace) in
the production code of the given source directories (test items are left out one by one, see
`gates/rustsrc.py`: code after a `#[cfg(test)] use` line is still read).

    python3 scripts/long-functions.py crates/*/src
    LONG_FUNCTION_LINES=70 MAX_FOUND=10 python3 scripts/long-functions.py crates/*/src

Exits 1 when more than MAX_FOUND (default 0) functions are over the bound; `scripts/test.sh`
runs it at 100 lines (none may be over) and at 70 (TIGER_STYLE's limit: at most 10 over).
A function ends at the first line that is a `}` at its own indentation (rustfmt's layout).
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gates"))
from rustsrc import sources  # noqa: E402

FN = re.compile(r"^(\s*)(pub(\([^)]*\))? )?(async )?(const )?(unsafe )?(extern \"C\" )?fn (\w+)")
bound = int(os.environ.get("LONG_FUNCTION_LINES", "100"))
allowed = int(os.environ.get("MAX_FOUND", "0"))
found = []
for root in sys.argv[1:]:
    for path, _, lines in sources(root):
        for i, line in enumerate(lines):
            m = FN.match(line)
            if not m or line.rstrip().endswith(";"):
                continue
            # a signature over several lines: the body starts at the first line ending in `{`
            j = i
            while j < len(lines) and not lines[j].rstrip().endswith("{"):
                if lines[j].rstrip().endswith(";"):
                    break
                j += 1
            if j >= len(lines) or lines[j].rstrip().endswith(";"):
                continue
            indent = len(m.group(1))
            k = j + 1
            while k < len(lines) and not (
                lines[k].strip().startswith("}") and len(lines[k]) - len(lines[k].lstrip()) == indent
            ):
                k += 1
            n = k - i + 1
            if n > bound:
                found.append((n, path, i + 1, m.group(8)))
for n, path, line, fn in sorted(found, reverse=True):
    print(f"{path}:{line}: {fn} is {n} lines (at most {bound})")
if found:
    print(f"{len(found)} production functions over {bound} lines (at most {allowed} allowed)")
sys.exit(1 if len(found) > allowed else 0)
