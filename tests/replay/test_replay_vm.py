#!/usr/bin/env python3
"""Tests the physical-memory fields of gma-replay's JSON: every replay result
has mapped_peak (peak bytes backed by device memory), vm_maps, vm_unmaps and
vm_creates (the growable ranges' map, unmap and chunk-create calls) and
growable. On a small trace that grows, frees, trims and grows again:
under the default config (growable segments on the simulated device) at
least one chunk is mapped and one unmapped, creates never outnumber maps, unmaps never outnumber maps and the
mapped peak lies between the peak allocated and the peak reserved; under
ordinary segments (expandable_segments:false) the three counts are 0 and the mapped peak is the peak
reserved. --min-capacity's search object keeps exactly its fields.

Usage: test_replay_vm.py PATH/TO/gma-replay
"""

import json
import os
import subprocess
import sys
import tempfile

MIB = 1 << 20
HEADER = "Thread,Time,Action,Pointer,Size,Stream,Block,Id,Count,Status\n"
ROWS = [
    ("allocate", "0x1000", 1000, ""),
    ("allocate", "0x100000", 30 * MIB, ""),
    ("allocate", "0x4000000", 6 * MIB, ""),
    ("allocate", "0x8000000", 64 * MIB, ""),
    ("free", "0x100000", 30 * MIB, ""),
    ("free", "0x8000000", 64 * MIB, ""),
    ("trim", "0x0", 0, "explicit"),
    ("allocate", "0xc000000", 40 * MIB, ""),
    ("free", "0xc000000", 40 * MIB, ""),
    ("free", "0x4000000", 6 * MIB, ""),
    ("free", "0x1000", 1000, ""),
]
TRACE = HEADER + "".join("0,0.%06d,%s,%s,%d,0x0,0,0,0,%s\n" % (i + 1, a, p, s, st)
                         for i, (a, p, s, st) in enumerate(ROWS))
# --min-capacity's "search" object: its fields, unchanged.
SEARCH_KEYS = {"min_capacity", "failing_capacity", "lower_bound_peak_live",
               "recorded_peak_reserved", "min_over_recorded", "min_over_peak_live", "width",
               "replays", "unstable", "budget_hit", "wall_s", "at_min", "steps"}
AT_MIN_KEYS = {"peak_reserved", "peak_allocated", "recorded_failed", "oom_served", "oom_failed"}
FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("  FAIL: " + what)
    return cond


def replay(tool, trace, out, extra):
    cmd = [tool, "--quiet", "--json", out, "--config", "ordinary=expandable_segments:false",
           "--config", "default="] + extra + [trace]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=120)
    check(p.returncode == 0, "%s: exit %d, stderr %r" % (" ".join(cmd), p.returncode, p.stderr))
    with open(out) as f:
        return json.load(f)


def check_result(config, r):
    print("  %-10s mapped_peak %d, vm_maps %d, vm_unmaps %d, vm_creates %d, peak_reserved %d, "
          "device_allocs %d, device_frees %d" % (
              config, r.get("mapped_peak", -1), r.get("vm_maps", -1), r.get("vm_unmaps", -1),
              r.get("vm_creates", -1), r["peak_reserved"], r["device_allocs"],
              r["device_frees"]))
    for k in ("mapped_peak", "vm_maps", "vm_unmaps", "vm_creates"):
        if not check(isinstance(r.get(k), int) and r[k] >= 0, "%s: %s is %r" % (config, k, r.get(k))):
            return
    check(r["failed_allocs"] == 0, "%s: %d failed allocations" % (config, r["failed_allocs"]))
    check(r["peak_allocated"] <= r["mapped_peak"] <= r["peak_reserved"],
          "%s: mapped_peak %d not between peak_allocated %d and peak_reserved %d"
          % (config, r["mapped_peak"], r["peak_allocated"], r["peak_reserved"]))
    if config == "ordinary":
        check(r.get("growable") is False, "ordinary: growable is %r" % r.get("growable"))
        check(r["vm_maps"] == r["vm_unmaps"] == r["vm_creates"] == 0,
              "ordinary: vm counts %d/%d/%d, want 0" % (r["vm_maps"], r["vm_unmaps"],
                                                       r["vm_creates"]))
        check(r["mapped_peak"] == r["peak_reserved"], "ordinary: mapped_peak %d != peak_reserved %d"
              % (r["mapped_peak"], r["peak_reserved"]))
        check(r["device_allocs"] >= 1, "ordinary: no device allocation")
    else:  # the default: growable on the simulated device
        check(r.get("growable") is True, "default: growable is %r" % r.get("growable"))
        check(r["vm_maps"] >= 1, "default: vm_maps %d, want >= 1" % r["vm_maps"])
        check(1 <= r["vm_creates"] <= r["vm_maps"], "default: vm_creates %d, vm_maps %d"
              % (r["vm_creates"], r["vm_maps"]))
        check(1 <= r["vm_unmaps"] <= r["vm_maps"],
              "default: vm_unmaps %d after an explicit trim (vm_maps %d), want 1..maps"
              % (r["vm_unmaps"], r["vm_maps"]))
        check(r["vm_maps"] == r["device_allocs"] and r["vm_unmaps"] == r["device_frees"],
              "default: vm counts %d/%d, device calls %d/%d" % (
                  r["vm_maps"], r["vm_unmaps"], r["device_allocs"], r["device_frees"]))


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: test_replay_vm.py PATH/TO/gma-replay\n")
        return 2
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="gma-replay-vm-") as tmp:
        trace = os.path.join(tmp, "grow_trim.csv")
        with open(trace, "w") as f:
            f.write(TRACE)
        print("a replay's JSON: mapped_peak and the vm counts")
        data = replay(tool, trace, os.path.join(tmp, "r.json"), [])
        results = {r["config"]: r["result"] for r in data.get("results", [])}
        check(set(results) == {"ordinary", "default"}, "results for %r" % sorted(results))
        for config in sorted(results):
            check_result(config, results[config])

        print("--min-capacity: the search keeps its fields; the replays carry the new ones")
        data = replay(tool, trace, os.path.join(tmp, "m.json"), ["--min-capacity"])
        searches = data.get("min_capacity", [])
        check(len(searches) == 2, "%d searches, want 2" % len(searches))
        for s in searches:
            got = s["search"]
            check(set(got) == SEARCH_KEYS, "%s: search fields %r" % (s["config"], sorted(got)))
            check(set(got.get("at_min", {})) == AT_MIN_KEYS,
                  "%s: at_min fields %r" % (s["config"], sorted(got.get("at_min", {}))))
        for r in data.get("results", []):
            check("mapped_peak" in r["result"], "%s: no mapped_peak with --min-capacity"
                  % r["config"])
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
