#!/usr/bin/env python3
"""Checks the shape of raftlock's library crate (src/, without the binaries).

1. No import circle between files: a file never reaches itself through the
   `crate::`/`super::`/`self::` paths it names (in `use` items and in code).
   A folder's mod.rs declares its children and may re-export them by their
   bare names (`pub use child::Item`): that is the folder's face, not a use
   of the child, and is not counted; test modules are not counted either.
2. No module imports a layer above it: LAYERS below lists the top-level
   modules from the bottom up; a file may name modules of its own layer or
   lower ones only.
3. openraft is named only under raft/, sled only under storage/.
4. No source file has more than 600 lines before its tests (`#[cfg(test)]`).

Prints what it finds and exits 1 when anything is wrong. `--graph` prints
the file-level import graph instead.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")

# Top-level modules of the library, bottom layer first. A module may use the
# modules of its own layer and of the layers before it.
LAYERS = [
    ["base", "proto"],
    ["storage", "config"],
    ["model"],
    ["raft"],
    ["node"],
    ["locks"],
    ["api"],
    ["client", "restore"],
    ["fuzz"],
]

# Crates that only one folder may name.
CONFINED = {"openraft": "raft", "sled": "storage"}

MAX_LINES = 600
# Files that are binaries, not part of the library's layering.
SKIP_DIRS = {os.path.join(ROOT, "bin")}
SKIP_FILES = {os.path.join(ROOT, "main.rs")}


def module_files():
    """Maps a module path (tuple) to its file, for every file of the library."""
    mods = {}
    for dirpath, dirnames, filenames in os.walk(ROOT):
        if any(dirpath.startswith(d) for d in SKIP_DIRS):
            continue
        for name in filenames:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            if path in SKIP_FILES:
                continue
            rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
            if rel == ["lib"]:
                key = ()
            elif rel[-1] == "mod":
                key = tuple(rel[:-1])
            else:
                key = tuple(rel)
            mods[key] = path
    return mods


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    # Character literals first ('"' would open a string), then strings,
    # whose escapes include a backslash before a line break.
    text = re.sub(r"'(?:\\.|[^'\\\n])'", "' '", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def expand_use(tree):
    """Expands `a::{b, c::{d, e}}` into ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    out = []

    def walk(prefix, t):
        depth = 0
        start = 0
        parts = []
        for i, ch in enumerate(t):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(t[start:i])
                start = i + 1
        parts.append(t[start:])
        for p in parts:
            if not p:
                continue
            brace = p.find("{")
            if brace >= 0 and p.endswith("}"):
                walk(prefix + p[:brace], p[brace + 1 : -1])
            else:
                out.append(prefix + p)

    walk("", tree)
    return out


def paths_named(text):
    """Every `crate::`, `super::` and `self::` path a file names."""
    found = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        found.extend(expand_use(m.group(1)))
    for m in re.finditer(r"(?<![:\w])((?:crate|super|self)(?:::\w+)+)", text):
        found.append(m.group(1))
    # `pub(crate)`/`pub(super)` are visibility, not paths; they have no `::`.
    return found


def resolve(path, here, mods):
    """The module file a path reaches, or None (an outside crate)."""
    segs = [s for s in path.split("::") if s and s != "*"]
    segs = [s.split(" as ")[0] for s in segs]
    if not segs:
        return None
    if segs[0] == "crate":
        base = []
        segs = segs[1:]
    elif segs[0] in ("super", "self"):
        base = list(here)
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    else:
        return None
    full = base + segs
    # The longest prefix that is a module file.
    for n in range(len(full), -1, -1):
        key = tuple(full[:n])
        if key in mods:
            return key
    return None


def before_tests(raw):
    """A file's text up to its `#[cfg(test)] mod ...` (test code may use anything)."""
    lines = raw.split("\n")
    for i, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]" and i + 1 < len(lines):
            nxt = lines[i + 1].strip()
            if nxt.startswith("mod ") or nxt.startswith("pub mod "):
                return "\n".join(lines[:i])
    return raw


def layer_of(key):
    if not key:
        return None
    for i, layer in enumerate(LAYERS):
        if key[0] in layer:
            return i
    return None


def tarjan(graph):
    index = {}
    low = {}
    stack = []
    on = set()
    sccs = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    for v in list(graph):
        if v not in index:
            strong(v)
    return sccs


def name(key):
    return "/".join(key) if key else "lib"


def main():
    mods = module_files()
    graph = {}
    problems = []
    for key, path in sorted(mods.items()):
        with open(path) as f:
            raw = f.read()
        if key and key[-1] == "tests":
            graph[key] = set()
            continue
        text = strip_comments(before_tests(raw))
        edges = set()
        for p in paths_named(text):
            target = resolve(p, key, mods)
            if target is None or target == key:
                continue
            # A file's own submodules (declared by it) are below it.
            if target[: len(key)] == key and key:
                edges.add(target)
                continue
            if key == ():
                continue
            edges.add(target)
        graph[key] = edges
        # Layers.
        mine = layer_of(key)
        for t in sorted(edges):
            theirs = layer_of(t)
            if mine is not None and theirs is not None and theirs > mine:
                problems.append(
                    f"{name(key)} uses {name(t)}, a layer above it "
                    f"({t[0]} over {key[0]})"
                )
        for crate_name, home in CONFINED.items():
            if re.search(rf"\b{crate_name}::", text) and (not key or key[0] != home):
                problems.append(f"{name(key)} names {crate_name}, which only {home}/ may")
    # The root's own `mod` declarations are not uses; lib.rs is the top.
    graph[()] = set()

    # Every file, the binaries' too, is under the length rule; a test
    # module's own file (`tests.rs`) is all tests.
    for dirpath, _, filenames in os.walk(ROOT):
        for fname in sorted(filenames):
            if not fname.endswith(".rs") or fname == "tests.rs":
                continue
            path = os.path.join(dirpath, fname)
            with open(path) as f:
                length = len(before_tests(f.read()).split("\n"))
            if length > MAX_LINES:
                problems.append(f"{os.path.relpath(path, ROOT)} has {length} lines before its tests (at most {MAX_LINES})")

    if "--graph" in sys.argv:
        for k in sorted(graph):
            print(name(k), "->", ", ".join(sorted(name(t) for t in graph[k])))
        return 0
    # A file and the files it declares are one room: a parent's use of its
    # child is not a circle unless the child reaches back through others.
    for comp in tarjan(graph):
        names = sorted(name(k) for k in comp)
        problems.append(f"import circle through {len(comp)} files: " + ", ".join(names))
    if "--allow-circles" in sys.argv:
        problems = [p for p in problems if not p.startswith("import circle")]
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s) in the crate's shape", file=sys.stderr)
        return 1
    print(f"crate shape: {len(mods)} files, no import circle, layers kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
