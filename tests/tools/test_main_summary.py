#!/usr/bin/env python3
"""tools/main_summary.py (the closing summary of tools/main.sh) on made-up
inputs with known answers: the memory table from a gma-replay JSON (gma's
better configuration over PyTorch's recorded peak, the smallest device),
goals marked MET and MISSED from benchmark JSON, and the GPU part read from
a RESULTS.md (its date, commit and GPU from the file, the ratios of the
peers, the count of scenarios gma was faster in). Also runs it on the
repository's docs/gpu/RESULTS.md, which must parse.

Usage: test_main_summary.py SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

SOURCE = sys.argv[1]
TOOL = os.path.join(SOURCE, "tools", "main_summary.py")
MiB = 1 << 20
FAILS = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        FAILS.append(what)


RESULTS = """# gma on a GPU: tools/gpu_check.sh

Written by `tools/gpu_check.sh` on 2031-02-03 04:05 UTC; every figure below was
measured in that run on this GPU. Overall: **passed**,

- GPU (index, name, driver, memory): 0, Test GPU 9000, 1.0, 1 MiB
- git commit: 0123456789abcdef0123456789abcdef01234567

## GPU benchmark

```
median ns per alloc+free pair, kernels included (peer/gma: above 1 is slower than gma) on Test GPU
scenario                               direct    mallocAsync            CUB    gma             torch
------------------------------  -------------  -------------  -------------  -----  ----------------
same size 4 KiB                 98304 (23.9x)   6229 (1.51x)   5917 (1.44x)   4121     12305 (2.99x)
memory pressure                 4832k (0.97x)   477k (0.10x)  4817k (0.96x)  5006k       784k (0.16x)
(gma: the default config)
```
"""


def main():
    tmp = tempfile.mkdtemp(prefix="gma-main-summary-")
    replay = {"device": "sim", "results": [
        {"trace": "t1", "config": "default", "result": {"peak_reserved": 90 * MiB,
                                                         "recorded_peak_reserved": 100 * MiB}},
        {"trace": "t1", "config": "ordinary", "result": {"peak_reserved": 80 * MiB,
                                                            "recorded_peak_reserved": 100 * MiB}},
        {"trace": "t2", "config": "default", "result": {"peak_reserved": 120 * MiB,
                                                         "recorded_peak_reserved": 100 * MiB}},
        {"trace": "pipeline", "config": "default", "result": {"peak_reserved": 5 * MiB,
                                                               "recorded_peak_reserved": 0}}],
        "min_capacity": [{"trace": "t1", "config": "default",
                          "search": {"min_capacity": 70 * MiB, "lower_bound_peak_live": 50 * MiB,
                                     "recorded_peak_reserved": 100 * MiB}},
                         {"trace": "t1", "config": "ordinary",
                          "search": {"min_capacity": 51 * MiB, "lower_bound_peak_live": 50 * MiB,
                                     "recorded_peak_reserved": 100 * MiB}}]}
    policy = {"tool": "torch-policy-model", "traces": [
        {"trace": "t1", "peak_live": 50 * MiB, "peak_reserved": 90 * MiB,
         "min_capacity": 60 * MiB}]}
    hot = {"scaling_4KiB_pairs_per_s": [{"name": "gma, bins", "ratio": 1.51, "goal_ratio": 1.8},
                                        {"name": "glibc malloc", "ratio": 1.9, "goal_ratio": 1.8}],
           "training_loop": [{"name": "gma, bins", "device_allocs_after_first": 0,
                              "goal_device_allocs_after_first": 0}]}
    worker = {"idle_cpu_ms_per_s": {"baseline": 0.5, "worker_1000ms": 2.0, "worker_10ms": 3.0},
              "async_ns": {"submit_at_once": 50.0, "worker_p50": 30000, "worker_p99": 1000,
                           "batch64": 100.0}}
    paths = {}
    for name, obj in (("replay.json", replay), ("hot.json", hot), ("worker.json", worker),
                      ("policy.json", policy)):
        paths[name] = os.path.join(tmp, name)
        with open(paths[name], "w") as f:
            json.dump(obj, f)
    paths["RESULTS.md"] = os.path.join(tmp, "RESULTS.md")
    with open(paths["RESULTS.md"], "w") as f:
        f.write(RESULTS)
    p = subprocess.run([sys.executable, TOOL, "--replay", paths["replay.json"], "--policy-model",
                        paths["policy.json"], "--hotpath", paths["hot.json"], "--worker", paths["worker.json"], "--gpu-results",
                        paths["RESULTS.md"]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    out = p.stdout
    print(out)
    check(p.returncode == 0, "exit 0")
    lines = out.splitlines()
    t1 = [l for l in lines if l.strip().startswith("t1 ")]
    check(len(t1) == 2 and "100.0 MiB" in t1[0] and "0.800x" in t1[0] and "51.0 MiB" in t1[0]
          and "0.510x" in t1[0], "t1: PyTorch 100 MiB, best gma 0.800x, min device 51 MiB 0.510x")
    # The capacity table: peak live, PyTorch, its policy, each configuration
    # and its ratio to live, gma's best over the smaller reference (60 MiB).
    check(len(t1) == 2 and t1[1].split() == [
        "t1", "50.0", "MiB", "100.0", "MiB", "60.0", "MiB", "70.0", "MiB", "1.400x", "51.0", "MiB",
        "1.020x", "0.850x"], "t1's capacity row: %r" % (t1[1:],))
    check("within 1.02x of peak live, of the 1 real traces: default 0, ordinary 1" in out,
          "the count within 1.02x of peak live")
    t2 = [l for l in lines if l.strip().startswith("t2 ")]
    check(len(t2) == 1 and "1.200x" in t2[0], "t2: gma 1.200x of PyTorch")
    check(not any(l.strip().startswith("pipeline") for l in lines),
          "a synthetic workload (no PyTorch figure) is not listed")
    check("less than PyTorch recorded on 1 trace(s), more on 1" in out, "the count of better/worse")
    check(any("gma" in l and "1.51x" in l and "MISSED" in l for l in lines), "1.51x < 1.8x: MISSED")
    check(any("malloc" in l and "1.90x" in l and "reference" in l and "MET" not in l
              for l in lines), "a reference row is shown, not judged")
    check(any("device allocs after" in l and "MET" in l for l in lines), "0 device allocs: MET")
    check(any("idle above baseline" in l and "MISSED" in l for l in lines),
          "1.5 ms idle CPU above baseline: MISSED")
    check(any("worker-served future p50" in l and "MISSED" in l for l in lines) and
          any("worker-served future p99" in l and "MET" in l for l in lines),
          "worker p50 30000 > 20000 MISSED, p99 1000 MET")
    check("run of 2031-02-03 04:05 UTC, commit 0123456789ab, Test GPU 9000; overall passed" in out,
          "the GPU run's date, commit and GPU come from the file")
    row = [l for l in lines if l.strip().startswith("same size 4 KiB")]
    check(len(row) == 1 and "4121" in row[0] and "1.51x" in row[0] and "1.44x" in row[0]
          and "2.99x" in row[0], "a scenario row: gma's ns and the peers' ratios")
    check("gma faster than mallocAsync in 1 of 2 scenarios" in out and
          "gma faster than torch in 1 of 2 scenarios" in out, "the counts per peer")

    # Missing inputs are named, not fatal; the repository's own RESULTS.md parses.
    p = subprocess.run([sys.executable, TOOL, "--replay", paths["replay.json"], "--gpu-results",
                        os.path.join(SOURCE, "docs", "gpu", "RESULTS.md")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    check(p.returncode == 0 and "no benchmark JSON found" in p.stdout, "no benchmark JSON: said so")
    check("(date not found)" not in p.stdout and "(no benchmark table" not in p.stdout
          and "gma faster than mallocAsync in" in p.stdout,
          "docs/gpu/RESULTS.md: date, commit and the benchmark table found")
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
