#!/usr/bin/env python3
"""Prints the import cycles between a crate's top-level modules: the strongly connected
components of the graph of `crate::MODULE` references (test modules, `*_tests` and `testing`
left out), each with the edges inside it.

    python3 scripts/module-cycles.py crates/scheduler/src

Exits 1 when there is a cycle; `scripts/test.sh` runs it on every crate (none has one).
"""
import collections
import os
import re
import sys
root = sys.argv[1]
mods = {}
for dp, dn, fn in os.walk(root):
    for f in fn:
        if f.endswith('.rs'):
            p = os.path.join(dp, f)
            rel = os.path.relpath(p, root)[:-3]
            top = rel.split('/')[0]
            if top in ('lib', 'main'): continue
            if top.endswith('_tests') or top == 'testing' or top.endswith('tests'): continue
            mods.setdefault(top, []).append(p)
graph = collections.defaultdict(set)
for m, files in mods.items():
    for p in files:
        text = open(p).read()
        # drop test modules
        text = re.split(r'#\[cfg\(test\)\]', text)[0]
        for dep in re.findall(r'crate::([a-z_0-9]+)', text):
            if dep != m and dep in mods:
                graph[m].add(dep)
        if p.endswith('mod.rs') or '/' in os.path.relpath(p, root):
            for dep in re.findall(r'\bsuper::([a-z_0-9]+)', text):
                pass
# find SCCs
index = {}; low = {}; st = []; on = set(); sccs = []; i = [0]
def strong(v):
    index[v] = low[v] = i[0]; i[0] += 1; st.append(v); on.add(v)
    for w in graph[v]:
        if w not in index:
            strong(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: sccs.append(sorted(comp))
sys.setrecursionlimit(10000)
for v in list(mods):
    if v not in index: strong(v)
for c in sccs:
    print(len(c), c)
    for a in c:
        print('  ', a, '->', sorted(graph[a] & set(c)))
sys.exit(1 if sccs else 0)
