#!/usr/bin/env python3
"""Prints the import cycles between sibling modules at every level of a crate: for each module,
the strongly connected components of the graph of references among its child modules
(`crate::a::b`, `super::b`, `use crate::{a, b::c}` groups), each with the edges inside it.
Test items are left out one by one (`gates/rustsrc.py`), so code after a `#[cfg(test)] use`
line is still read.

    python3 scripts/module-cycles.py crates/scheduler/src

Exits 1 when there is a cycle; `scripts/test.sh` runs it on every crate (none has one).
"""
import collections
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gates"))
from rustsrc import sources  # noqa: E402

root = sys.argv[1]


def module_of(rel):
    parts = rel[:-3].split(os.sep)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


files = {}
for _, rel, lines in sources(root):
    if rel in ("lib.rs", "main.rs") or rel.startswith("bin" + os.sep):
        if rel.startswith("bin" + os.sep):
            continue
    files[module_of(rel)] = "\n".join(lines)
modules = set(files)


def strip_comments(text):
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', text)


def expand(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] (as lists of names)."""
    tree = tree.strip()
    depth = 0
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                head = tree[:i].rstrip(":").strip()
                body = tree[i + 1 : tree.rindex("}")]
                parts, cur, d = [], "", 0
                for c in body:
                    if c == "," and d == 0:
                        parts.append(cur)
                        cur = ""
                        continue
                    d += c == "{"
                    d -= c == "}"
                    cur += c
                parts.append(cur)
                out = []
                for p in parts:
                    if p.strip():
                        for rest in expand(p):
                            out.append(([h for h in head.split("::") if h]) + rest)
                return out
            depth += 1
    name = tree.split(" as ")[0].strip()
    return [[n for n in name.split("::") if n]]


def references(module, text):
    """Absolute module paths this file refers to."""
    text = strip_comments(text)
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        paths.extend(expand(m.group(1)))
    for m in re.finditer(r"\b((?:crate|super|self)(?:::[A-Za-z_0-9]+)+)", text):
        paths.append(m.group(1).split("::"))
    out = []
    for p in paths:
        if not p:
            continue
        if p[0] == "crate":
            out.append(tuple(p[1:]))
        elif p[0] in ("super", "self"):
            base = list(module)
            rest = list(p)
            while rest and rest[0] in ("super", "self"):
                if rest[0] == "super" and base:
                    base.pop()
                rest.pop(0)
            out.append(tuple(base + rest))
    return out


graphs = collections.defaultdict(lambda: collections.defaultdict(set))
for module, text in files.items():
    for target in references(module, text):
        # the first level where the two paths part: an edge between siblings there
        level = 0
        while level < len(module) and level < len(target) and module[level] == target[level]:
            level += 1
        if level >= len(module) or level >= len(target):
            continue  # a reference to an ancestor's items or to a child
        parent = module[:level]
        a, b = module[level], target[level]
        if parent + (b,) in modules or any(m[: level + 1] == parent + (b,) for m in modules):
            graphs[parent][a].add(b)

found = []
for parent, graph in sorted(graphs.items()):
    index, low, st, on, i = {}, {}, [], set(), [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = i[0]
        i[0] += 1
        st.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = st.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append((parent, sorted(comp), graph))

    for v in list(graph):
        if v not in index:
            strong(v)
for parent, comp, graph in found:
    where = "::".join(("crate",) + parent)
    print(f"{root}: cycle among the modules of {where}: {comp}")
    for a in comp:
        print("  ", a, "->", sorted(graph[a] & set(comp)))
sys.exit(1 if found else 0)
