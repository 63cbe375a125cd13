#!/usr/bin/env python3
"""The closing summary of tools/main.sh: what gma did better or worse than
PyTorch, from figures computed in this run and from the last GPU run.

1. Memory on the traces (this run's gma-replay --json): per trace, the
   reserved memory PyTorch recorded at its peak against gma's peak reserved
   (the default, growable segments, and ordinary segments) on the simulated device, and the
   smallest device each fits in (--min-capacity), when measured: per trace
   and configuration, against the peak live bytes (the floor), PyTorch's
   recorded peak reserved and tools/torch-policy-model's answer (its JSON,
   --policy-model).
2. Goals of the benchmarks (their JSON, when present): each goal, the
   measured figure, met or missed.
3. On a GPU (docs/gpu/RESULTS.md, written by tools/gpu_check.sh): the date,
   GPU and commit of that run, read from the file, and per scenario gma's
   time per alloc+free pair against cudaMallocAsync, CUB and PyTorch's
   allocator; how many scenarios gma was faster in.

Usage: main_summary.py --replay REPLAY.json [--policy-model JSON] [--hotpath JSON]
                       [--worker JSON] [--gpu-results RESULTS.md]
Missing inputs are named and skipped; exit 0 unless an input is unreadable.
"""
import argparse
import json
import os
import re
import sys

MiB = float(1 << 20)


def mib(b):
    return "%.1f MiB" % (b / MiB) if b < 10 * 1024 * MiB else "%.2f GiB" % (b / MiB / 1024)


def memory(path):
    print("1. memory on the traces (this run, simulated device): peak reserved, "
          "gma against what PyTorch recorded")
    with open(path) as f:
        data = json.load(f)
    rows = {}
    for r in data.get("results", []):
        res = r["result"]
        rows.setdefault(r["trace"], {})[r["config"]] = res
    caps = {}
    for c in data.get("min_capacity", []):
        caps.setdefault(c["trace"], {})[c["config"]] = c["search"]["min_capacity"]
    print("   %-40s %12s %12s %12s %9s %12s %9s" % ("trace", "PyTorch", "gma", "gma ordinary",
                                                  "best/PT", "min device", "min/PT"))
    better = worse = 0
    for trace, cfgs in rows.items():
        recorded = max((c.get("recorded_peak_reserved", 0) for c in cfgs.values()), default=0)
        d, e = cfgs.get("default"), cfgs.get("ordinary")
        if not recorded or not d:
            continue
        best = min(x["peak_reserved"] for x in (d, e) if x)
        cap = min(caps.get(trace, {}).values(), default=0)
        ratio = best / recorded
        better += ratio < 1
        worse += ratio > 1
        print("   %-40s %12s %12s %12s %8.3fx %12s %9s" % (
            trace[:40], mib(recorded), mib(d["peak_reserved"]),
            mib(e["peak_reserved"]) if e else "-", ratio, mib(cap) if cap else "-",
            "%.3fx" % (cap / recorded) if cap else "-"))
    print("   gma reserved less than PyTorch recorded on %d trace(s), more on %d "
          "(best/PT: gma's better configuration / PyTorch; below 1: gma needed less)"
          % (better, worse))
    print("   (synthetic workloads have no PyTorch figure and are not listed)")


def capacity(path, policy_path):
    """The smallest device each trace fits in: gma's configurations (this run's
    --min-capacity) against the peak live bytes, PyTorch's recorded peak
    reserved and tools/torch-policy-model's answer (its --json)."""
    with open(path) as f:
        data = json.load(f)
    caps, order = {}, []
    for c in data.get("min_capacity", []):
        if c["trace"] not in caps:
            order.append(c["trace"])
        caps.setdefault(c["trace"], {})[c["config"]] = c["search"]
    if not caps:
        return
    model = {}
    if policy_path and os.path.exists(policy_path):
        with open(policy_path) as f:
            model = {t["trace"]: t["min_capacity"] for t in json.load(f).get("traces", [])}
    configs = [k for k in ("default", "ordinary")
               if any(k in v for v in caps.values())]
    print("\n   the smallest simulated device each trace replays in with no failed allocation "
          "(--min-capacity),\n   against the floor (peak live), PyTorch's recorded peak reserved "
          "and PyTorch's policy (torch-policy-model)")
    head = "   %-40s %11s %11s %11s" % ("trace", "peak live", "PyTorch", "PT policy")
    for k in configs:
        head += " %11s %7s" % (k, "/live")
    print(head + " %9s" % "best/ref")
    within = {k: 0 for k in configs}
    real = 0  # traces with PyTorch's figure (not the synthetic workloads)
    for trace in order:
        s = caps[trace]
        any_s = next(iter(s.values()))
        live, rec = any_s.get("lower_bound_peak_live", 0), any_s.get("recorded_peak_reserved", 0)
        pol = model.get(trace, 0)
        line = "   %-40s %11s %11s %11s" % (trace[:40], mib(live) if live else "-",
                                            mib(rec) if rec else "-", mib(pol) if pol else "-")
        best = 0
        real += rec > 0
        for k in configs:
            m = s.get(k, {}).get("min_capacity", 0)
            line += " %11s %7s" % (mib(m) if m else "-",
                                   "%.3fx" % (m / live) if m and live else "-")
            if m:
                best = m if not best else min(best, m)
                within[k] += rec > 0 and live > 0 and m <= 1.02 * live
        refs = [x for x in (rec, pol) if x]
        line += " %9s" % ("%.3fx" % (best / min(refs)) if best and refs else "-")
        print(line)
    print("   best/ref: gma's smaller capacity over the smaller of PyTorch's recorded peak and "
          "its policy's answer\n   (below 1: gma fits in less); within 1.02x of peak live, of the "
          "%d real traces: " % real + ", ".join("%s %d" % (k, within[k]) for k in configs))


def goals(hotpath, worker):
    print("\n2. benchmark goals (this run)")
    found = False
    if hotpath and os.path.exists(hotpath):
        found = True
        with open(hotpath) as f:
            h = json.load(f)
        # The scaling goal is the lock-free bins' (the other rows are what
        # they are compared with); plan:on allocates its arena once the plan
        # is learned, after the first iteration, by design.
        for s in h.get("scaling_4KiB_pairs_per_s", []):
            verdict = ("MET" if s["ratio"] >= s["goal_ratio"] else "MISSED") \
                if s["name"] == "gma, bins" else "(reference, not a goal)"
            print("   %-66s %7.2fx  goal >= %.1fx  %s" % (
                "2 threads / 1 thread, 4 KiB pairs: " + s["name"], s["ratio"], s["goal_ratio"],
                verdict))
        for t in h.get("training_loop", []):
            verdict = ("MET" if t["device_allocs_after_first"] <= t["goal_device_allocs_after_first"]
                       else "MISSED") if "plan:on" not in t["name"] \
                else "(the plan's arena, allocated once after iteration 1)"
            print("   %-66s %8d  goal %d      %s" % (
                "device allocs after the 1st iteration: " + t["name"],
                t["device_allocs_after_first"], t["goal_device_allocs_after_first"], verdict))
    if worker and os.path.exists(worker):
        found = True
        with open(worker) as f:
            w = json.load(f)
        idle = w.get("idle_cpu_ms_per_s", {})
        rows = []
        if "baseline" in idle and "worker_1000ms" in idle:
            rows.append(("CPU ms over 1 s idle above baseline (tick 1000 ms)",
                         idle["worker_1000ms"] - idle["baseline"], 1.0))
        # gma-bench-worker's section 3 goals, the [N] in its rows (ns).
        a = w.get("async_ns", {})
        for key, label, goal in (("submit_at_once", "future ready on a bin hit, ns", 100),
                                 ("worker_p50", "worker-served future p50, ns", 20000),
                                 ("worker_p99", "worker-served future p99, ns", 200000),
                                 ("batch64", "batch of 64 x 4 KiB, ns", 5000)):
            if isinstance(a.get(key), (int, float)):
                rows.append((label, a[key], goal))
        for label, v, goal in rows:
            print("   %-66s %8.3f  goal <= %-6g %s" % (label, v, goal,
                                                      "MET" if v <= goal else "MISSED"))
    if not found:
        print("   (no benchmark JSON found)")


def costs(path):
    """gma-bench-costs' goals (issue 37): gma's default against the other sides."""
    if not path or not os.path.exists(path):
        return
    with open(path) as f:
        rows = json.load(f).get("scenarios", [])
    side = {(r["name"], r["side"]): r for r in rows}
    print("\n   the GPU benchmark's scenarios on the simulated device (gma-bench-costs, h100 costs)")

    def line(label, v, goal, ok):
        print("   %-66s %8s  goal %-8s %s" % (label, v, goal, "MET" if ok else "MISSED"))
    g, m = side.get(("memory_pressure", "gma")), side.get(("memory_pressure", "pool-model"))
    d = side.get(("memory_pressure", "direct"))
    if g and m:
        r = g["ns_per_pair"] / m["ns_per_pair"]
        line("memory pressure: time per allocation / pool model's", "%.2fx" % r, "<= 1.0x",
             r <= 1.0 and (not d or g["failed_allocs"] <= d["failed_allocs"]))
    g, m = side.get(("large_16_256MiB", "gma")), side.get(("large_16_256MiB", "pool-model"))
    if g and m:
        r = g["footprint_bytes"] / m["footprint_bytes"]
        line("large 16-256 MiB: footprint / pool model's", "%.2fx" % r, "<= 1.1x", r <= 1.1)
    g = side.get(("cross_stream", "gma"))
    if g:
        bound = 1.5 * g["peak_live_bytes"] + 20 * 2**20
        line("cross-stream: footprint, MiB (1.5 x peak live + a 20 MiB segment)",
             "%.0f" % (g["footprint_bytes"] / MiB), "<= %.0f" % (bound / MiB),
             g["footprint_bytes"] <= bound)
    worst = [r for r in rows if r["side"] == "gma"]
    if worst:
        p50 = max(r["driver_calls_p50"] for r in worst)
        p99 = max(r["driver_calls_p99"] for r in worst)
        line("driver calls per gma_alloc, worst scenario's p50 / p99", "%.0f / %.0f" % (p50, p99),
             "1 / 4", p50 <= 1 and p99 <= 4)


def gpu(path):
    print("\n3. on a GPU: gma against cudaMallocAsync, CUB and PyTorch (from %s)" % path)
    if not path or not os.path.exists(path):
        print("   no GPU results file: run tools/gpu_check.sh on a machine with a GPU")
        return
    with open(path) as f:
        text = f.read()
    when = re.search(r"on (\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?: UTC)?)", text)
    commit = re.search(r"git commit: ([0-9a-f]{7,40})", text)
    gpu_line = re.search(r"GPU \(index, name, driver, memory\): ([^\n]+)", text)
    overall = re.search(r"Overall: \*\*(\w+)\*\*", text)
    print("   run of %s, commit %s, %s; overall %s" % (
        when.group(1) if when else "(date not found)",
        commit.group(1)[:12] if commit else "(commit not found)",
        gpu_line.group(1).split(",")[1].strip() if gpu_line else "(GPU not found)",
        overall.group(1) if overall else "(not found)"))
    m = re.search(r"median ns per alloc\+free pair[^\n]*\n(scenario[^\n]*)\n-[-\s]*\n(.*?)\n\(", text,
                  re.S)
    if not m:
        print("   (no benchmark table in the file)")
        return
    header = m.group(1)
    cols = re.split(r"\s{2,}", header.strip())
    want = [c for c in ("mallocAsync", "CUB", "torch") if c in cols]
    print("   %-32s %8s  %s" % ("scenario (ns per alloc+free)", "gma ns",
                                 "  ".join("%13s" % c for c in want)))
    faster = {c: 0 for c in want}
    counted = {c: 0 for c in want}
    for line in m.group(2).splitlines():
        name = line[:32].strip()
        cells = re.split(r"\s{2,}", line[32:].strip())
        if len(cells) < len(cols) - 1:
            continue
        row = dict(zip(cols[1:], cells))
        out = []
        for c in want:
            cell = row.get(c, "-")
            r = re.search(r"\(([\d.]+)x\)", cell)
            if r:
                ratio = float(r.group(1))
                counted[c] += 1
                faster[c] += ratio > 1.0
                out.append("%13s" % ("%.2fx" % ratio))
            else:
                out.append("%13s" % "-")
        print("   %-32s %8s  %s" % (name[:32], row.get("gma", "-"), "  ".join(out)))
    print("   (each peer column: the peer's time / gma's; above 1 the peer was slower than gma;"
          "\n    memory pressure: ns per successful allocation)")
    for c in want:
        print("   gma faster than %s in %d of %d scenarios" % (c, faster[c], counted[c]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replay", required=True)
    ap.add_argument("--policy-model", help="tools/torch-policy-model --json output")
    ap.add_argument("--hotpath")
    ap.add_argument("--worker")
    ap.add_argument("--costs", help="gma-bench-costs --json output")
    ap.add_argument("--gpu-results")
    a = ap.parse_args()
    memory(a.replay)
    capacity(a.replay, a.policy_model)
    goals(a.hotpath, a.worker)
    costs(a.costs)
    gpu(a.gpu_results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
