#!/usr/bin/env python3
"""torch_bench.py: gma-bench-gpu's allocation patterns on PyTorch's allocators.

Times the scenarios of gma-bench-gpu (same ids, same sizes and seeds, the same
training-loop plan) with torch.empty(n, dtype=torch.uint8) and del, on:

  torch             PyTorch's CUDA caching allocator, default settings
                    (PYTORCH_CUDA_ALLOC_CONF cleared);
  torch_expandable  the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True;
  gma_torch_plugin  gma through torch.cuda.memory.CUDAPluggableAllocator, when
                    the shared library named by $GMA_TORCH_PLUGIN exists (issue 7;
                    it exports, with CUDAPluggableAllocator's signatures,
                    void *gma_torch_alloc(ssize_t size, int device, cudaStream_t s)
                    and void gma_torch_free(void *p, ssize_t size, int device,
                    cudaStream_t s)).

Each allocator runs in its own subprocess (a plug-in must be installed before
the process's first CUDA allocation, and no allocator's cache should weigh on
another's measurements). Every batch is timed between two
torch.cuda.synchronize() calls; per scenario and allocator it reports the
median and p99 (nearest rank across batches) of ns per alloc+free pair, as
gma-bench-gpu does (the training loop: iteration time / allocations; memory
pressure: round time / allocations attempted, and failures). The figures
include the Python interpreter's cost per call, which is part of what a
PyTorch program pays; compare torch with gma_torch_plugin for the allocators
alone.

Without torch, or without a CUDA device, it prints why, writes
{"skipped": reason} to the JSON file and exits 0. Python 3.8+, no other
dependency than torch itself.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import torchkit

KiB = 1 << 10
MiB = 1 << 20
MASK64 = (1 << 64) - 1

# (id, name, kind, fixed size, lo_bits, hi_bits): gma-bench-gpu's list.
SCENARIOS = [
    ("same_4KiB", "same size 4 KiB", "pairs", 4 * KiB, 0, 0),
    ("same_2MiB", "same size 2 MiB", "pairs", 2 * MiB, 0, 0),
    ("mixed_512B_8MiB", "mixed 512 B - 8 MiB", "pairs", 0, 9, 23),
    ("large_16_256MiB", "large 16 - 256 MiB", "pairs", 0, 24, 28),
    ("training_loop", "training loop (6 layers)", "training", 0, 0, 0),
    ("streams_4x4", "4 threads x own stream, 64 KiB", "threads", 64 * KiB, 0, 0),
    ("async_4KiB", "async 4 KiB (bin hit)", "async", 4 * KiB, 0, 0),
    ("async_8MiB", "async 8 MiB (worker-served)", "async", 8 * MiB, 0, 0),
    ("memory_pressure", "memory pressure", "pressure", 0, 0, 0),
]
NTHREADS = 4

ALLOCATORS = {
    "torch": ("PyTorch caching allocator",
              "torch.empty/del on the CUDA caching allocator, default settings"),
    "torch_expandable": ("PyTorch expandable_segments",
                         "torch.empty/del, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
    "gma_torch_plugin": ("gma via CUDAPluggableAllocator",
                         "torch.empty/del with change_current_allocator(CUDAPluggableAllocator("
                         "$GMA_TORCH_PLUGIN, 'gma_torch_alloc', 'gma_torch_free'))"),
}


def xorshift(s):
    """gma-bench-gpu's (and gma-bench-alloc's) xorshift, on 64-bit words."""
    s ^= (s << 13) & MASK64
    s ^= s >> 7
    s ^= (s << 17) & MASK64
    return s


def pair_sizes(fixed, lo_bits, hi_bits, n, seed):
    if fixed:
        return [fixed] * n
    rng = seed or 1
    out = []
    for _ in range(n):
        rng = xorshift(rng)
        bits = lo_bits + rng % (hi_bits - lo_bits)
        lo = 1 << bits
        rng = xorshift(rng)
        out.append(lo + rng % lo)
    return out


TL_LAYERS = 6
TL_KEPT = 8


def training_plan():
    """gma-bench-gpu's tl_plan(): (slot, size) pairs, size 0 = free the slot."""
    ops = []
    tok, hid, e = 4 * 512, 1024, 2
    act = tok * hid * e
    stats = tok * 8
    scores = 4 * 16 * 512 * 512 * e
    t_ws = TL_LAYERS * TL_KEPT
    t_dup, t_dattn, t_dscores, t_dqkv, t_wgrad, t_g0, t_g1 = range(t_ws + 1, t_ws + 8)
    for layer in range(TL_LAYERS):
        b = layer * TL_KEPT
        ops += [(b + 0, act), (b + 1, stats), (b + 2, 3 * act), (t_ws, 2 * act), (t_ws, 0),
                (b + 3, scores), (b + 4, act), (b + 5, 4 * act), (b + 6, 4 * act),
                (t_ws, act), (t_ws, 0), (b + 7, act)]
    g = t_g0
    ops.append((g, act))
    for layer in reversed(range(TL_LAYERS)):
        b = layer * TL_KEPT
        ng = t_g1 if g == t_g0 else t_g0
        ops += [(t_dup, 4 * act), (b + 6, 0), (b + 5, 0), (t_dattn, act), (t_dup, 0),
                (t_dscores, scores), (b + 3, 0), (t_dqkv, 3 * act), (t_dscores, 0), (b + 2, 0),
                (ng, act), (t_dqkv, 0), (b + 4, 0), (t_dattn, 0), (t_wgrad, 2 * KiB),
                (t_wgrad, 0), (b + 7, 0), (b + 1, 0), (b + 0, 0), (g, 0)]
        g = ng
    ops.append((g, 0))
    return ops, t_g1 + 1


PRESS_BLOCKS = (64, 40, 96)


def summarize(values):
    """Median and nearest-rank p99, rounded to 0.1 ns like gma-bench-gpu's JSON."""
    v = sorted(values)
    n = len(v)
    if not n:
        return None, None
    median = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    rank = (99 * n + 99) // 100
    return round(median, 1), round(v[rank - 1], 1)


# ---- the worker: runs in a subprocess, one allocator -------------------------------------


def worker(args):
    import torch  # noqa: imported here so the parent can report its absence

    if args.worker == "gma_torch_plugin":
        alloc = torch.cuda.memory.CUDAPluggableAllocator(args.plugin, "gma_torch_alloc",
                                                        "gma_torch_free")
        torch.cuda.memory.change_current_allocator(alloc)
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    stream = torch.cuda.Stream(device=dev)
    tstreams = [torch.cuda.Stream(device=dev) for _ in range(NTHREADS)]
    sync = torch.cuda.synchronize
    u8 = torch.uint8
    empty = torch.empty
    plan, nslots = training_plan()
    plan_allocs = sum(1 for _, size in plan if size)
    results = {}

    def batch_pairs(sizes, n):
        sync()
        with torch.cuda.stream(stream):
            t0 = time.perf_counter_ns()
            for i in range(n):
                x = empty(sizes[i], dtype=u8, device=dev)
                del x
            sync()
            return time.perf_counter_ns() - t0

    def batch_training(n):
        slots = [None] * nslots
        sync()
        with torch.cuda.stream(stream):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                for slot, size in plan:
                    slots[slot] = empty(size, dtype=u8, device=dev) if size else None
            sync()
            return time.perf_counter_ns() - t0

    def batch_threads(size, n):
        bar = threading.Barrier(NTHREADS)
        spans = [None] * NTHREADS
        errors = []

        def run(k):
            try:
                torch.cuda.set_device(dev)
                with torch.cuda.stream(tstreams[k]):
                    bar.wait()
                    t0 = time.perf_counter_ns()
                    for _ in range(n):
                        x = empty(size, dtype=u8, device=dev)
                        del x
                    tstreams[k].synchronize()
                    spans[k] = (t0, time.perf_counter_ns())
            except Exception as e:  # reported, not raised in a thread
                errors.append(repr(e))

        sync()
        ts = [threading.Thread(target=run, args=(k,)) for k in range(NTHREADS)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            raise RuntimeError(errors[0])
        return max(s[1] for s in spans) - min(s[0] for s in spans)

    def interleaved(sc):
        sid, name, kind, fixed, lo, hi = sc
        if kind == "async":
            return {"skipped": "PyTorch has no asynchronous allocation call"}
        if kind == "training":
            maxu, probe, minu, per_unit = args.iterations, 1, 1, plan_allocs
            run = batch_training
        else:
            maxu = args.pairs
            probe, minu, per_unit = min(maxu, 32), min(maxu, 16), 1
            if kind == "threads":
                def run(n):
                    return batch_threads(fixed, n)
            else:
                sizes = pair_sizes(fixed, lo, hi, args.pairs, args.seed)

                def run(n):
                    return batch_pairs(sizes, n)
        try:
            run(probe)  # warm-up: the cache fills
            per = run(probe) / probe
            fit = args.batch_ms * 1e6 / max(per, 1)
            units = maxu if fit >= maxu else minu if fit < minu else int(fit)
            ns = [run(units) / (units * per_unit) for _ in range(args.reps)]
        except RuntimeError as e:
            return {"error": str(e).splitlines()[0][:300]}
        med, p99 = summarize(ns)
        return {"median_ns": med, "p99_ns": p99, "units_per_batch": units, "batches": len(ns),
                "failures": 0, "batches_ns": [round(x, 1) for x in ns]}

    def pressure():
        sync()
        free, total = torch.cuda.mem_get_info(dev)
        ws = free * args.pressure_fraction
        bsize = [max(2 * MiB, int(ws / n) // (2 * MiB) * (2 * MiB)) for n in PRESS_BLOCKS]
        attempts = sum(PRESS_BLOCKS)
        failures, first_error, ns = 0, None, []
        start = time.perf_counter_ns()
        with torch.cuda.stream(stream):
            for _ in range(args.pressure_rounds):
                t0 = time.perf_counter_ns()
                for n, size in zip(PRESS_BLOCKS, bsize):
                    held = []
                    for _ in range(n):
                        try:
                            held.append(empty(size, dtype=u8, device=dev))
                        except RuntimeError as e:  # torch.cuda.OutOfMemoryError and kin
                            failures += 1
                            if first_error is None:
                                first_error = str(e).splitlines()[0][:300]
                    del held
                    sync()
                ns.append((time.perf_counter_ns() - t0) / attempts)
        med, p99 = summarize(ns)
        note = ("working set %.1f GiB = %.0f%% of %.1f GiB free; per round %d x %d MiB, "
                "%d x %d MiB, %d x %d MiB" % (
                    ws / (1 << 30), args.pressure_fraction * 100, free / (1 << 30),
                    PRESS_BLOCKS[0], bsize[0] // MiB, PRESS_BLOCKS[1], bsize[1] // MiB,
                    PRESS_BLOCKS[2], bsize[2] // MiB))
        return {"median_ns": med, "p99_ns": p99, "units_per_batch": 1, "batches": len(ns),
                "failures": failures, "error": first_error,
                "total_ms": round((time.perf_counter_ns() - start) / 1e6, 1),
                "batches_ns": [round(x, 1) for x in ns], "note": note}

    for sc in SCENARIOS:
        if args.scenarios and sc[0] not in args.scenarios:
            continue
        print("torch_bench [%s]: %s" % (args.worker, sc[1]), file=sys.stderr, flush=True)
        if sc[2] == "pressure":
            results[sc[0]] = pressure()
        else:
            results[sc[0]] = interleaved(sc)
        if args.worker != "gma_torch_plugin":
            torch.cuda.empty_cache()  # the next scenario starts from an empty cache
    out = {"results": results, "torch_version": torch.__version__,
           "cuda_version": torch.version.cuda, "gpu": torch.cuda.get_device_name(dev),
           "total_memory": torch.cuda.get_device_properties(dev).total_memory}
    with open(args.worker_out, "w") as f:
        json.dump(out, f)


# ---- the parent: checks, subprocesses, JSON ---------------------------------------------


def skip(args, reason):
    return torchkit.skip("torch_bench", "torch-bench", args.json, reason)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default="bench-gpu-torch.json", help="output (bench-gpu-torch.json)")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--reps", type=int, default=15, help="timed batches per allocator (15)")
    p.add_argument("--pairs", type=int, default=10000, help="most pairs per batch (10000)")
    p.add_argument("--iterations", type=int, default=20,
                   help="most training iterations per batch (20)")
    p.add_argument("--batch-ms", type=int, default=50, help="target batch duration (50)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--pressure-fraction", type=float, default=0.9)
    p.add_argument("--pressure-rounds", type=int, default=3)
    p.add_argument("--scenarios", default="", help="comma-separated scenario ids (all)")
    p.add_argument("--allocators", default=",".join(ALLOCATORS),
                   help="comma-separated: " + ", ".join(ALLOCATORS))
    p.add_argument("--timeout", type=int, default=1800, help="seconds per allocator (1800)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    p.add_argument("--plugin", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.scenarios = torchkit.choose(p, args.scenarios, [s[0] for s in SCENARIOS], "scenario")
    if args.worker:
        worker(args)
        return 0

    why = torchkit.cuda_unavailable(args.device)
    if why:
        return skip(args, why)
    import torch  # cuda_unavailable imported it already

    wanted = torchkit.choose(p, args.allocators, ALLOCATORS, "allocator")
    allocators, per_alloc, info = {}, {}, {}
    for a in ALLOCATORS:
        name, how = ALLOCATORS[a]
        entry = {"name": name, "how": how, "available": False, "reason": None}
        allocators[a] = entry
        if a not in wanted:
            entry["reason"] = "not selected (--allocators)"
            continue
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        env.pop("PYTORCH_ALLOC_CONF", None)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", a]
        if a == "torch_expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        if a == "gma_torch_plugin":
            plugin = os.environ.get("GMA_TORCH_PLUGIN", "")
            if not plugin:
                entry["reason"] = "GMA_TORCH_PLUGIN is not set (the gma PyTorch plug-in is issue 7)"
                continue
            if not os.path.isfile(plugin):
                entry["reason"] = "GMA_TORCH_PLUGIN=%s: no such file" % plugin
                continue
            cmd += ["--plugin", os.path.abspath(plugin)]
            entry["plugin"] = os.path.abspath(plugin)
        fd, out = tempfile.mkstemp(prefix="torch_bench_", suffix=".json")
        os.close(fd)
        cmd += ["--worker-out", out, "--device", str(args.device), "--reps", str(args.reps),
                "--pairs", str(args.pairs), "--iterations", str(args.iterations),
                "--batch-ms", str(args.batch_ms), "--seed", str(args.seed),
                "--pressure-fraction", str(args.pressure_fraction),
                "--pressure-rounds", str(args.pressure_rounds),
                "--scenarios", ",".join(args.scenarios)]
        print("torch_bench: running %s" % a, flush=True)
        try:
            r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=True, timeout=args.timeout)
            if r.returncode != 0:
                tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
                entry["reason"] = "worker exited with %d: %s" % (r.returncode, " | ".join(tail))
            else:
                with open(out) as f:
                    data = json.load(f)
                per_alloc[a] = data["results"]
                info = info or data
                entry["available"] = True
        except subprocess.TimeoutExpired:
            entry["reason"] = "worker ran longer than --timeout %d s" % args.timeout
        finally:
            os.unlink(out)
    for a, entry in allocators.items():
        if entry["reason"] and a in wanted:
            print("torch_bench: %s not measured: %s" % (a, entry["reason"]))

    scenarios = []
    for sid, name, kind, _, _, _ in SCENARIOS:
        if args.scenarios and sid not in args.scenarios:
            continue
        res, note = {}, None
        for a, entry in allocators.items():
            r = per_alloc.get(a, {}).get(sid)
            if r is None:
                r = {"skipped": entry["reason"] or "not run"}
            note = note or r.pop("note", None)
            res[a] = r
        unit = {"training": "ns per alloc+free pair (iteration / allocations)",
                "pressure": "ns per allocation attempted (round / attempts)",
                "threads": "ns per alloc+free pair per thread (batch wall time)"}.get(
                    kind, "ns per alloc+free pair")
        sc = {"id": sid, "name": name, "unit": unit, "results": res}
        if note:
            sc["note"] = note
        scenarios.append(sc)

    result = {
        "benchmark": "torch-bench",
        "config": {"torch_version": info.get("torch_version", torch.__version__),
                   "cuda_version": info.get("cuda_version", torch.version.cuda),
                   "gpu": info.get("gpu"), "total_memory": info.get("total_memory"),
                   "device_ordinal": args.device, "reps": args.reps,
                   "max_pairs_per_batch": args.pairs, "max_iterations_per_batch": args.iterations,
                   "batch_ms": args.batch_ms, "seed": args.seed,
                   "pressure_fraction": args.pressure_fraction,
                   "pressure_rounds": args.pressure_rounds,
                   "unit": "ns per alloc+free pair (Python call included)",
                   "p99": "nearest rank across batches"},
        "allocators": allocators,
        "scenarios": scenarios,
    }
    if not per_alloc:
        result["skipped"] = "no allocator could be measured: " + "; ".join(
            "%s: %s" % (a, e["reason"]) for a, e in allocators.items())
    torchkit.write_json(args.json, result)

    print("\n%-34s %12s %12s %12s" % ("torch_bench (median ns per pair)", *[a[:12] for a in ALLOCATORS]))
    for sc in scenarios:
        cells = []
        for a in ALLOCATORS:
            m = sc["results"][a].get("median_ns")
            cells.append("%12.0f" % m if m else "%12s" % "-")
        print("%-34s %s" % (sc["name"], " ".join(cells)))
    print("\nwrote %s" % args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
