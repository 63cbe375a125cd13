#!/usr/bin/env python3
"""Checks the runtime's layers: calls go down, never up.

Reads runtime/*/*.c and runtime/*/*.h, finds every function definition (a
name followed by a parameter list and a body at file scope, static inline
ones in headers included) and every call inside a function body (a name
followed by "(", not after "." or "->": calls through function pointers are
how a layer reaches up, and they are allowed). A call names the function of
its own file when that file defines one of that name (file-static
duplicates), else the one non-static definition elsewhere. From that it
builds a file -> file call graph and fails when:

  - a .c file calls a function defined in a folder above its own
    (api > observe > {plan, graph, host} > worker > cache > core > source >
    device > base), or a feature folder calls another feature folder;
  - files that call each other in a loop lie in more than one folder;
  - a function in runtime/ is longer than 80 lines, or a .c file longer
    than 800.

A violation listed in tools/layers_known.txt (one a line, as printed, '#'
comments) is reported as known and does not fail the check; a listed one that
no longer occurs does fail it, so the list only shrinks.

Usage: tools/layers.py [--root DIR] [--known FILE] [--graph]
  DIR: the repository root (default: this script's); FILE: the known list
  (default DIR/tools/layers_known.txt; "none" for no list).
Exit status 0 when every rule holds, 1 otherwise (each violation printed).
"""
import argparse
import os
import re
import sys

# Top layer first. Folders of one rank are features beside each other.
LAYERS = [["api"], ["observe"], ["plan", "graph", "host"], ["worker"], ["cache"],
          ["core"], ["source"], ["device"], ["base"]]
RANK = {folder: i for i, group in enumerate(LAYERS) for folder in group}
MAX_FUNCTION_LINES = 80
MAX_C_FILE_LINES = 800
# Names a call may use that are not calls of runtime functions.
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "_Alignof", "_Alignas",
            "_Static_assert", "defined", "_Generic", "do", "else", "case", "alignof"}

IDENT_CALL = re.compile(r"(->|\.)?\s*\b([A-Za-z_]\w*)\s*\(")
MACRO = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)\(([^\n]*)", re.M)


def strip(text):
    """Comments, strings and character literals blanked (newlines kept), and
    preprocessor lines removed, so braces and names in them do not count."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + "".join(ch if ch == "\n" else " " for ch in text[i + 1:j]) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    lines = "".join(out).split("\n")
    keep, cont = [], False
    for line in lines:
        pre = cont or line.lstrip().startswith("#")
        cont = pre and line.rstrip().endswith("\\")
        keep.append("" if pre else line)
    return "\n".join(keep)


def functions(text):
    """(name, first line, last line, body start offset, body end offset,
    static) of each function defined at file scope."""
    out = []
    depth, i, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == "{":
            if depth == 0:
                head = text[max(0, i - 600):i]
                m = re.search(r"\b([A-Za-z_]\w*)\s*\(([^()]|\([^()]*\))*\)\s*$", head)
                if m and m.group(1) not in KEYWORDS:
                    # the body: from here to the matching brace
                    d, j = 0, i
                    while j < n:
                        if text[j] == "{":
                            d += 1
                        elif text[j] == "}":
                            d -= 1
                            if d == 0:
                                break
                        j += 1
                    start_off = i - len(head) + m.start(1)
                    line_start = text.rfind("\n", 0, start_off) + 1
                    decl = text[line_start:start_off]
                    prev = text[:line_start].rstrip().split("\n")[-1] if line_start else ""
                    static = "static" in decl or ("static" in prev and not prev.rstrip().endswith((";", "}")))
                    out.append((m.group(1), text.count("\n", 0, start_off) + 1,
                                text.count("\n", 0, j) + 1, i, j, static))
                    i = j + 1
                    continue
            depth += 1
        elif c == "}":
            depth -= 1
        i += 1
    return out


def load(root):
    files = {}
    base = os.path.join(root, "runtime")
    for folder in sorted(os.listdir(base)):
        d = os.path.join(base, folder)
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            if name.endswith((".c", ".h")):
                rel = folder + "/" + name
                with open(os.path.join(d, name), encoding="utf-8", errors="replace") as f:
                    raw = f.read()
                files[rel] = (raw, strip(raw))
    return files


def folder_of(rel):
    return rel.split("/", 1)[0]


def build(files):
    defs = {}          # file -> {name: (first, last, static)}
    bodies = {}        # file -> [(name, body text)]
    for rel, (_, text) in files.items():
        defs[rel] = {}
        bodies[rel] = []
        for name, first, last, b0, b1, static in functions(text):
            defs[rel][name] = (first, last, static)
            bodies[rel].append((name, text[b0:b1 + 1]))
    exported = {}      # name -> defining files (non-static .c, or any header)
    for rel, d in defs.items():
        for name, (_, _, static) in d.items():
            if rel.endswith(".h") or not static:
                exported.setdefault(name, []).append(rel)
    macros = {}        # function-like macro -> names called in its body
    for rel, (raw, _) in files.items():
        for m in MACRO.finditer(raw.replace("\\\n", " ")):
            macros[m.group(1)] = {c.group(2) for c in IDENT_CALL.finditer(m.group(2))
                                  if not c.group(1)}
    calls = {}         # (caller file, callee file) -> [(caller fn, callee fn)]
    for rel, fns in bodies.items():
        for fn, body in fns:
            names = []
            for m in IDENT_CALL.finditer(body):
                if not m.group(1):
                    names.append(m.group(2))
                    names.extend(sorted(macros.get(m.group(2), ())))  # a macro's calls count
            for callee in names:
                if callee in KEYWORDS or callee in defs[rel]:
                    continue
                targets = exported.get(callee, [])
                if len(targets) != 1:
                    continue
                calls.setdefault((rel, targets[0]), []).append((fn, callee))
    return defs, calls


def sccs(nodes, edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
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
            out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def check(root, show_graph=False):
    files = load(root)
    defs, calls = build(files)
    problems = []
    unknown = sorted({folder_of(r) for r in files} - set(RANK))
    for f in unknown:
        problems.append("runtime/%s/: a folder that is in no layer (tools/layers.py LAYERS)" % f)
    edges = {}
    for (a, b), pairs in sorted(calls.items()):
        if a == b:
            continue
        edges.setdefault(a, set()).add(b)
        fa, fb = folder_of(a), folder_of(b)
        if fa == fb or fa not in RANK or fb not in RANK:
            continue
        if RANK[fb] < RANK[fa] or (RANK[fb] == RANK[fa] and fa != fb):
            kind = "up" if RANK[fb] < RANK[fa] else "sideways (feature to feature)"
            for fn, callee in sorted(set(pairs)):
                problems.append("call %s: runtime/%s %s() -> runtime/%s %s()" % (kind, a, fn, b, callee))
    for comp in sccs(files.keys(), edges):
        if len({folder_of(f) for f in comp}) > 1:
            problems.append("loop across folders: " + " <-> ".join("runtime/" + f for f in comp))
    for rel, d in sorted(defs.items()):
        for name, (first, last, _) in sorted(d.items()):
            if last - first + 1 > MAX_FUNCTION_LINES:
                problems.append("function of %d lines (> %d): runtime/%s:%d %s()"
                                % (last - first + 1, MAX_FUNCTION_LINES, rel, first, name))
        if rel.endswith(".c"):
            lines = files[rel][0].count("\n")
            if lines > MAX_C_FILE_LINES:
                problems.append("file of %d lines (> %d): runtime/%s" % (lines, MAX_C_FILE_LINES, rel))
    if show_graph:
        for a in sorted(edges):
            print("%s -> %s" % (a, ", ".join(sorted(edges[a]))))
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--known", default=None, help="known violations (default tools/layers_known.txt)")
    ap.add_argument("--graph", action="store_true", help="print the file -> file call graph")
    args = ap.parse_args()
    problems = check(args.root, args.graph)
    known_path = args.known or os.path.join(args.root, "tools", "layers_known.txt")

    def key(line):
        """A violation without its line number and measured size, so that an
        edit elsewhere in the file does not make a known one new."""
        line = re.sub(r"^(function|file) of \d+ lines", r"\1 of N lines", line)
        return re.sub(r":\d+ ", " ", line)
    known = []
    if args.known != "none" and os.path.exists(known_path):
        with open(known_path, encoding="utf-8") as f:
            known = [l.strip() for l in f if l.strip() and not l.lstrip().startswith("#")]
    known_keys = {key(k) for k in known}
    for p in problems:
        print("layers: %s%s" % ("known: " if key(p) in known_keys else "", p))
    new = [p for p in problems if key(p) not in known_keys]
    problem_keys = {key(p) for p in problems}
    stale = [k for k in known if key(k) not in problem_keys]
    for k in stale:
        print("layers: listed as known but gone (remove it from %s): %s" % (known_path, k))
    if new or stale:
        print("layers: %d violation(s), %d known, %d stale entries" % (len(new), len(problems) - len(new), len(stale)))
        return 1
    if problems:
        print("layers: ok but for %d known violation(s) (%s)" % (len(problems), known_path))
        return 0
    print("layers: ok (calls go down; no loop spans folders; functions <= %d lines, .c files <= %d)"
          % (MAX_FUNCTION_LINES, MAX_C_FILE_LINES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
