#!/usr/bin/env python3
"""Tests tools/torch-policy-model on hand-made traces whose answers follow from
the modelled policy: a 3 MiB request takes a shared 20 MiB segment, so it needs
a 20 MiB device; a freed 12 MiB segment is released and its room reused when a
14 MiB request would not fit; the small pool's 2 MiB segments; --json.

Usage: test_torch_policy_model.py TOOL
"""
import json
import os
import subprocess
import sys
import tempfile

HEADER = "Thread,Time,Action,Pointer,Size,Stream,Block,Id,Count,Status"
MIB = 1 << 20


def trace(rows):
    f = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
    f.write(HEADER + "\n")
    for i, (action, ptr, size) in enumerate(rows):
        f.write("0,%d.0,%s,%s,%d,0x0,0,0,0,\n" % (i, action, ptr, size))
    f.close()
    return f.name


def run(tool, rows):
    path = trace(rows)
    try:
        out = subprocess.run([sys.executable, tool, "--precision", "0.01", path],
                             capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)
    cols = out.splitlines()[1].split()
    return float(cols[1]), float(cols[3]), float(cols[5])  # live, peak reserved, min capacity (MiB)


def main():
    tool = sys.argv[1]
    fails = []

    def check(name, got, want):
        if abs(got[0] - want[0]) > 0.01 or abs(got[1] - want[1]) > 0.01 or not (
                want[2] <= got[2] <= want[2] * 1.001):
            fails.append("%s: got %s, want %s" % (name, got, want))

    check("shared 20 MiB segment", run(tool, [("allocate", "0xa", 3 * MIB)]), (3.0, 20.0, 20.0))
    check("release and retry", run(tool, [
        ("allocate", "0xa", 12 * MIB), ("allocate", "0xb", 12 * MIB), ("free", "0xa", 0),
        ("allocate", "0xc", 14 * MIB)]), (26.0, 38.0, 26.0))
    check("small pool", run(tool, [("allocate", "0x%x" % i, 512 << 10) for i in range(5)]),
          (2.5, 4.0, 4.0))
    # --json: the same figures, in bytes, per trace.
    path = trace([("allocate", "0xa", 3 * MIB)])
    out = path + ".json"
    try:
        subprocess.run([sys.executable, tool, "--precision", "0.01", "--json", out, path],
                       capture_output=True, text=True, check=True)
        with open(out) as f:
            got = json.load(f)
        t = got["traces"][0] if len(got.get("traces", [])) == 1 else {}
        name = os.path.basename(path)[:-len(".csv")]
        if (t.get("trace") != name or t.get("peak_live") != 3 * MIB or
                t.get("peak_reserved") != 20 * MIB or
                not 20 * MIB <= t.get("min_capacity", 0) <= 20 * MIB * 1.001):
            fails.append("--json: %r" % got)
    finally:
        os.unlink(path)
        if os.path.exists(out):
            os.unlink(out)
    # Damaged numbers are refused by row and column, exit 2 (int() took
    # '-4096', ' 4096' and '+4096', and an empty field crashed it).
    for bad in ("-4096", " 4096", "+4096", "", "18446744073709551616", "4k"):
        f = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
        f.write(HEADER + "\n0,0.0,allocate,0xa,%s,0x0,0,0,0,\n" % bad)
        f.close()
        r = subprocess.run([sys.executable, tool, f.name], capture_output=True, text=True)
        os.unlink(f.name)
        if r.returncode != 2 or ":2: column Size is %r" % bad not in r.stderr or r.stdout:
            fails.append("size %r: rc %d, stderr %r" % (bad, r.returncode, r.stderr))
    for f in fails:
        print("FAIL", f)
    print("test_torch_policy_model: %s" % ("FAILED" if fails else "ok"))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
