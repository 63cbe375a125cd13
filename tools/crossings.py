#!/usr/bin/env python3
"""Measures how often one slow-path gma_alloc crosses between source files.

Method: builds the runtime with -finstrument-functions (functions defined in
headers and in runtime/base/ left out: the atomics wrapper, inline helpers
and error/trace utilities are leaves that every layer uses, not crossings of
the structure) into build/crossings, links tools/crossings/driver.c, and runs
it: the driver warms up (one alloc and free, so the stream record and a
segment exist), then records every function entry and exit on its own thread
during one gma_alloc of 64 MiB on the simulated device, which no bin holds
and no segment has room for (the slow path: it grows the pool). addr2line
maps each function to its source file. A crossing is a call whose callee is
defined in another file than its caller; it is upward when the callee's
folder is above the caller's in the layer order (tools/layers.py).

Usage: tools/crossings.py [--root DIR] [--conf GMA_CONF] [--verbose]
Prints the crossings (all, and those between folders) and the upward ones;
exits 1 when more than --max (default 10) cross between folders or any goes
upward.
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layers import RANK  # noqa: E402


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--conf", default="device:sim")
    ap.add_argument("--max", type=int, default=10)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    build = os.path.join(root, "build", "crossings")
    flags = ("-finstrument-functions -finstrument-functions-exclude-file-list=.h,/runtime/base/ "
             "-fno-inline -fno-omit-frame-pointer")
    sh(["cmake", "-S", root, "-B", build, "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DGMA_DEBUG=0",
        "-DGMA_BUILD_TESTS=OFF", "-DGMA_BUILD_BENCH=OFF", "-DCMAKE_C_FLAGS=" + flags])
    sh(["cmake", "--build", build, "-j", "2", "--target", "gma_static"])
    exe = os.path.join(build, "gma-crossings")
    sh(["cc", "-O1", "-g", "-o", exe, os.path.join(root, "tools", "crossings", "driver.c"),
        "-I", os.path.join(root, "include"), os.path.join(build, "libgma.a"),
        "-lck", "-lpthread", "-ldl"])
    trace = os.path.join(build, "crossings.txt")
    sh([exe, trace, args.conf])
    events = [l.split() for l in open(trace)]
    addrs = sorted({a for _, a in events})
    out = sh(["addr2line", "-f", "-e", exe] + ["0x" + a for a in addrs]).stdout.split("\n")
    where = {}
    for i, a in enumerate(addrs):
        fn, loc = out[2 * i], out[2 * i + 1]
        path = loc.split(":")[0]
        k = path.find("/runtime/")
        where[a] = (fn, path[k + len("/runtime/"):] if k >= 0 else os.path.basename(path))
    stack, crossings, upward, visits, layer = [], [], [], {}, []
    for kind, a in events:
        fn, f = where[a]
        if kind == "X":
            if stack:
                stack.pop()
            continue
        if stack and stack[-1][1] != f:
            caller_fn, caller_f = stack[-1]
            crossings.append((caller_f, caller_fn, f, fn))
            ca, cb = caller_f.split("/")[0], f.split("/")[0]
            if ca in RANK and cb in RANK and RANK[cb] < RANK[ca]:
                upward.append(crossings[-1])
            if ca != cb:
                layer.append(crossings[-1])
            visits[f] = visits.get(f, 0) + 1
        stack.append((fn, f))
    for c in crossings if args.verbose else []:
        print("  %s %s() -> %s %s()%s" % (c[0], c[1], c[2], c[3], "  UP" if c in upward else ""))
    print("crossings: one slow-path gma_alloc (%s) crosses files %d times, %d upward"
          % (args.conf, len(crossings), len(upward)))
    print("crossings: of them, %d between folders (layers), %d inside one folder"
          % (len(layer), len(crossings) - len(layer)))
    print("crossings: entries per file: " + ", ".join(
        "%s %d" % (f, n) for f, n in sorted(visits.items(), key=lambda x: -x[1])))
    return 0 if len(layer) <= args.max and not upward else 1


if __name__ == "__main__":
    sys.exit(main())
