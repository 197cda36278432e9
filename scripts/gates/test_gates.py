#!/usr/bin/env python3
"""Feeds each gate script its violation (issue 51, item 8): a long function and an import cycle
planted after a `#[cfg(test)] use` line, a cycle between nested sibling modules, and test-only
code that must not count. Run by `scripts/test.sh`."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LONG = os.path.join(HERE, "..", "long-functions.py")
CYCLES = os.path.join(HERE, "..", "module-cycles.py")


def tree(files):
    root = tempfile.mkdtemp(prefix="gates-")
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return root


def run(script, root, **env):
    e = dict(os.environ, **env)
    p = subprocess.run([sys.executable, script, root], capture_output=True, text=True, env=e)
    return p.returncode, p.stdout


def long_fn(name, n, indent=""):
    body = "".join(f"{indent}    let x{i} = {i};\n" for i in range(n))
    return f"{indent}pub fn {name}() {{\n{body}{indent}}}\n"


failures = []


def check(what, cond, out):
    if not cond:
        failures.append(f"{what}:\n{out}")


# 1. a long function after a `#[cfg(test)] use` line (the old script stopped reading there)
root = tree({
    "lib.rs": "mod a;\n",
    "a.rs": "#[cfg(test)]\nuse std::collections::HashMap;\n\n" + long_fn("planted", 120)
    + "\n#[cfg(test)]\nmod tests {\n" + long_fn("test_only", 200, "    ") + "}\n",
})
rc, out = run(LONG, root)
check("long function after #[cfg(test)] use", rc == 1 and "planted" in out and "test_only" not in out, out)
rc, out = run(LONG, root, LONG_FUNCTION_LINES="130")
check("bound respected", rc == 0, out)
rc, out = run(LONG, root, LONG_FUNCTION_LINES="70", MAX_FOUND="1")
check("MAX_FOUND allows that many", rc == 0 and "planted" in out, out)

# 2. a multi-line signature still counts from its first line
root = tree({"lib.rs": "pub fn wide(\n    a: u32,\n    b: u32,\n) -> u32 {\n" + "    let _ = a;\n" * 100 + "    b\n}\n"})
rc, out = run(LONG, root)
check("multi-line signature", rc == 1 and "wide" in out, out)

# 3. a cycle between top-level modules, its edge planted after a `#[cfg(test)] use` line
root = tree({
    "lib.rs": "mod a;\nmod b;\n",
    "a.rs": "#[cfg(test)]\nuse crate::b::Helper;\n\npub fn f() -> u32 {\n    crate::b::g()\n}\n",
    "b.rs": "use crate::{a::f, other};\n\npub fn g() -> u32 {\n    1\n}\n",
})
rc, out = run(CYCLES, root)
check("top-level cycle after #[cfg(test)] use", rc == 1 and "['a', 'b']" in out, out)

# 4. a cycle between nested siblings through `super::`
root = tree({
    "lib.rs": "mod state;\n",
    "state/mod.rs": "mod x;\nmod y;\npub struct Shared;\n",
    "state/x.rs": "use super::{y::Y, Shared};\npub struct X;\n",
    "state/y.rs": "use super::x::X;\npub struct Y;\n",
})
rc, out = run(CYCLES, root)
check("nested cycle", rc == 1 and "crate::state" in out and "['x', 'y']" in out, out)

# 5. an edge that exists only in test code is no cycle
root = tree({
    "lib.rs": "mod a;\nmod b;\n",
    "a.rs": "use crate::b::g;\npub fn f() -> u32 {\n    g()\n}\n",
    "b.rs": "pub fn g() -> u32 {\n    1\n}\n\n#[cfg(test)]\nmod tests {\n    use crate::a::f;\n}\n",
    "b_tests.rs": "use crate::a::f;\n",
})
rc, out = run(CYCLES, root)
check("test-only edge ignored", rc == 0, out)

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("gate scripts: 6 planted cases caught, 2 clean cases passed")
