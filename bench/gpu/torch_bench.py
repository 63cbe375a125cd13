#!/usr/bin/env python3
"""torch_bench.py: gma-bench-gpu's allocation patterns on PyTorch's allocators.

Times the scenarios of gma-bench-gpu (same ids, same sizes and seeds, the same
training-loop plan) with torch.empty(n, dtype=torch.uint8) and dropping the
last reference, on:

  torch             PyTorch's CUDA caching allocator, default settings
                    (PYTORCH_CUDA_ALLOC_CONF cleared);
  torch_expandable  the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True;
  gma_torch_plugin  gma through torch.cuda.memory.CUDAPluggableAllocator, when
                    the plug-in named by $GMA_TORCH_PLUGIN (libgma_torch.so)
                    exists, installed as python/gma/torch.py's use() does:
                    through libgma_torch_shim.so beside it when that loads
                    (an OOM raises torch.OutOfMemoryError), else through
                    gma_torch_alloc (an OOM returns NULL).

The GPU work mirrors gma-bench-gpu's: every tensor is touched on its stream
(x[::256].fill_(1), one byte every 256 like the benchmark's touch kernel);
in the cross-stream scenario and for the training loop's layer gradients a
second stream waits for the first, spins --spin-us (torch.cuda._sleep,
calibrated against CUDA events) and touches the tensor, which is freed while
that stream still runs: Tensor.record_stream on PyTorch's allocator,
gma.torch.record_stream through the plug-in (Tensor.record_stream does not
reach a plug-in).

Each allocator runs in its own subprocess (a plug-in must be installed before
the process's first CUDA allocation, and no allocator's cache should weigh on
another's measurements), and every scenario starts from an empty cache:
torch.cuda.empty_cache(), or gma.torch.empty_cache() for the plug-in, which
torch.cuda.empty_cache() does not reach. Every batch is timed between two
torch.cuda.synchronize() calls. Per scenario and allocator it reports the
median across batches of ns per alloc+free pair (the training loop: iteration
time / allocations), p50/p99/max (nearest rank) of the individual allocation
and free calls, and the peak reserved memory (torch.cuda.max_memory_reserved,
reset per scenario; not available through the plug-in, which PyTorch's
statistics do not see). Under memory pressure a round's time is divided by
the allocations that succeeded; failures are counted apart with the time
spent in them. A failed allocation is a torch OutOfMemoryError or a tensor at
address 0 (a NULL from the plug-in): both count as failures, never as
successes. The figures include the Python interpreter's cost per call, which
is part of what a PyTorch program pays; compare torch with gma_torch_plugin
for the allocators alone.

Without torch, or without a CUDA device, it prints why, writes
{"skipped": reason} to the JSON file and exits 0. Python 3.8+, no other
dependency than torch itself (and python/gma for the plug-in).
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
    ("cross_stream", "cross-stream 64 KiB - 4 MiB", "cross", 0, 16, 22),
    ("training_loop", "training loop (6 layers)", "training", 0, 0, 0),
    ("streams_4x4", "4 threads x own stream, 64 KiB", "threads", 64 * KiB, 0, 0),
    ("async_4KiB", "async 4 KiB (bin hit)", "async", 4 * KiB, 0, 0),
    ("async_8MiB", "async 8 MiB (worker-served)", "async", 8 * MiB, 0, 0),
    ("memory_pressure", "memory pressure", "pressure", 0, 0, 0),
]
NTHREADS = 4
TOUCH_STRIDE = 256  # gpu_work.h's GMA_BENCH_TOUCH_STRIDE
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

ALLOCATORS = {
    "torch": ("PyTorch caching allocator",
              "torch.empty/del on the CUDA caching allocator, default settings"),
    "torch_expandable": ("PyTorch expandable_segments",
                         "torch.empty/del, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
    "gma_torch_plugin": ("gma via CUDAPluggableAllocator",
                         "torch.empty/del with change_current_allocator(CUDAPluggableAllocator("
                         "...)) on gma.torch.entry_points(): libgma_torch_shim.so beside "
                         "$GMA_TORCH_PLUGIN when it loads (an OOM raises), else "
                         "$GMA_TORCH_PLUGIN's gma_torch_alloc (an OOM returns NULL, counted "
                         "as a failure)"),
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


# The layer gradients (t_g0, t_g1): all-reduced on a second stream and
# freed cross-stream, as gma-bench-gpu's tl_cross() says.
GRADIENT_SLOTS = (TL_LAYERS * TL_KEPT + 6, TL_LAYERS * TL_KEPT + 7)

PRESS_BLOCKS = (64, 40, 96)


def median(values):
    """The median of the batches, rounded to 0.1 ns like gma-bench-gpu's JSON."""
    v = sorted(values)
    n = len(v)
    if not n:
        return None
    return round(v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2, 1)


# ---- the worker: runs in a subprocess, one allocator -------------------------------------


class Failed(Exception):
    """An allocation that failed: the allocator raised torch's OutOfMemoryError,
    or handed out NULL (libgma_torch.so without its shim does that, and
    PyTorch then makes a tensor at address 0)."""


def percentiles(values):
    """gma-bench-gpu's per-call figures: calls, p50, p99 (nearest rank), max."""
    v = sorted(values)
    n = len(v)
    if not n:
        return {"calls": 0, "p50": None, "p99": None, "max": None}

    def rank(p):
        return v[max(1, -(-p * n // 100)) - 1]
    return {"calls": n, "p50": round(rank(50), 2), "p99": round(rank(99), 2),
            "max": round(v[-1], 2)}


def load_plugin(torch, plugin):
    """Installs gma as PyTorch's allocator the way python/gma/torch.py's use()
    does (its shim, which raises torch.OutOfMemoryError, when it loads) and
    returns (gma.torch, the allocation entry point used)."""
    sys.path.insert(0, os.path.join(REPO, "python"))
    os.environ["GMA_TORCH_LIBRARY"] = plugin
    libgma = os.path.join(os.path.dirname(plugin), "libgma.so")
    if os.path.exists(libgma) and not os.environ.get("GMA_LIBRARY"):
        os.environ["GMA_LIBRARY"] = libgma
    import gma.torch as gt

    path, alloc_fn, free_fn = gt.entry_points()
    torch.cuda.memory.change_current_allocator(
        torch.cuda.memory.CUDAPluggableAllocator(path, alloc_fn, free_fn))
    return gt, alloc_fn


class Bench:
    """One allocator's scenarios, in the worker process."""

    def __init__(self, torch, args, gt):
        self.torch, self.args, self.gt = torch, args, gt
        self.dev = torch.device("cuda", args.device)
        torch.cuda.set_device(self.dev)
        self.stream = torch.cuda.Stream(device=self.dev)
        self.side = torch.cuda.Stream(device=self.dev)
        self.tstreams = [torch.cuda.Stream(device=self.dev) for _ in range(NTHREADS)]
        self.oom = (getattr(torch, "OutOfMemoryError", None) or
                    getattr(torch.cuda, "OutOfMemoryError", None) or RuntimeError)
        self.plan, self.nslots = training_plan()
        self.plan_allocs = sum(1 for _, size in self.plan if size)
        self.cycles_per_us = self.calibrate_spin()

    def calibrate_spin(self):
        """Clock cycles per microsecond of torch.cuda._sleep (a spin kernel
        counting cycles), measured with CUDA events; None without _sleep."""
        torch = self.torch
        if not hasattr(torch.cuda, "_sleep"):
            return None
        torch.cuda._sleep(1000)
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        cycles = 20000000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        return cycles / (ms * 1000) if ms > 0 else None

    def alloc(self, size, log):
        """A tensor of size bytes, timed into log (a pair of lists, or None).
        Raises Failed for an OOM or a NULL tensor."""
        t0 = time.perf_counter_ns()
        try:
            x = self.torch.empty(size, dtype=self.torch.uint8, device=self.dev)
        except self.oom as e:
            raise Failed(str(e).splitlines()[0][:300] if str(e) else "out of memory")
        t = time.perf_counter_ns() - t0
        if size and x.data_ptr() == 0:
            raise Failed("the allocator returned NULL (a tensor at address 0)")
        if log is not None:
            log[0].append(t)
        return x

    def touch(self, x):
        """gma-bench-gpu's touch kernel: one byte every TOUCH_STRIDE bytes."""
        x[::TOUCH_STRIDE].fill_(1)

    def use_on_side(self, x):
        """The side stream waits for the current one, spins --spin-us, then
        touches x: x is in use there after the host frees it."""
        self.side.wait_stream(self.torch.cuda.current_stream())
        with self.torch.cuda.stream(self.side):
            if self.cycles_per_us:
                self.torch.cuda._sleep(int(self.args.spin_us * self.cycles_per_us))
            self.touch(x)

    def record_side(self, x):
        """The cross-stream mechanism: Tensor.record_stream on PyTorch's
        allocator; gma.torch.record_stream through the plug-in, which
        Tensor.record_stream does not reach."""
        if self.gt:
            self.gt.record_stream(x, self.side)
        else:
            x.record_stream(self.side)

    def free_timed(self, slots, k, log, cross=False):
        """Drops the last reference to slots[k] (the free), timed into log."""
        t0 = time.perf_counter_ns()
        if cross:
            self.record_side(slots[k])
        slots[k] = None
        t = time.perf_counter_ns() - t0
        if log is not None:
            log[1].append(t)

    def batch_pairs(self, sizes, n, log, cross):
        torch = self.torch
        torch.cuda.synchronize()
        slot = [None]
        with torch.cuda.stream(self.stream):
            t0 = time.perf_counter_ns()
            for i in range(n):
                slot[0] = self.alloc(sizes[i], log)
                self.touch(slot[0])
                if cross:
                    self.use_on_side(slot[0])
                self.free_timed(slot, 0, log, cross)
            torch.cuda.synchronize()
            return time.perf_counter_ns() - t0

    def batch_training(self, n, log):
        torch = self.torch
        slots = [None] * self.nslots
        grads = set(GRADIENT_SLOTS)
        torch.cuda.synchronize()
        with torch.cuda.stream(self.stream):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                for slot, size in self.plan:
                    if not size:
                        self.free_timed(slots, slot, log, slot in grads)
                        continue
                    slots[slot] = self.alloc(size, log)
                    self.touch(slots[slot])
                    if slot in grads:
                        self.use_on_side(slots[slot])
            torch.cuda.synchronize()
            return time.perf_counter_ns() - t0

    def batch_threads(self, size, n, log):
        torch = self.torch
        bar = threading.Barrier(NTHREADS)
        spans, logs, errors = [None] * NTHREADS, [([], []) for _ in range(NTHREADS)], []

        def run(k):
            try:
                torch.cuda.set_device(self.dev)
                slot = [None]
                with torch.cuda.stream(self.tstreams[k]):
                    bar.wait()
                    t0 = time.perf_counter_ns()
                    for _ in range(n):
                        slot[0] = self.alloc(size, logs[k])
                        self.touch(slot[0])
                        self.free_timed(slot, 0, logs[k])
                    self.tstreams[k].synchronize()
                    spans[k] = (t0, time.perf_counter_ns())
            except Exception as e:  # reported, not raised in a thread
                errors.append(str(e) if isinstance(e, Failed) else repr(e))

        torch.cuda.synchronize()
        ts = [threading.Thread(target=run, args=(k,)) for k in range(NTHREADS)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            raise Failed(errors[0])
        if log is not None:
            for a, f in logs:
                log[0].extend(a)
                log[1].extend(f)
        return max(s[1] for s in spans) - min(s[0] for s in spans)

    def runner(self, sc):
        """(run(n, log) -> ns, most units, probe units, least units, pairs per unit)."""
        sid, name, kind, fixed, lo, hi = sc
        a = self.args
        if kind == "training":
            return self.batch_training, a.iterations, 1, 1, self.plan_allocs
        if kind == "threads":
            return (lambda n, log: self.batch_threads(fixed, n, log), a.pairs,
                    min(a.pairs, 32), min(a.pairs, 16), 1)
        sizes = pair_sizes(fixed, lo, hi, a.pairs, a.seed)
        cross = kind == "cross"
        return (lambda n, log: self.batch_pairs(sizes, n, log, cross), a.pairs,
                min(a.pairs, 32), min(a.pairs, 16), 1)

    def interleaved(self, sc):
        if sc[2] == "async":
            return {"skipped": "PyTorch has no asynchronous allocation call"}
        run, maxu, probe, minu, per_unit = self.runner(sc)
        log = ([], [])
        try:
            run(probe, None)  # warm-up: the cache fills
            per = run(probe, None) / probe
            fit = self.args.batch_ms * 1e6 / max(per, 1)
            units = maxu if fit >= maxu else minu if fit < minu else int(fit)
            ns = [run(units, log) / (units * per_unit) for _ in range(self.args.reps)]
        except (Failed, RuntimeError) as e:
            return {"error": str(e).splitlines()[0][:300] if str(e) else repr(e)}
        med = median(ns)
        return {"median_ns": med, "units_per_batch": units, "batches": len(ns), "failures": 0,
                "alloc_ns": percentiles(log[0]), "free_ns": percentiles(log[1]),
                "batches_ns": [round(x, 1) for x in ns]}

    def pressure_round(self, bsize, log, tally):
        torch = self.torch
        t0 = time.perf_counter_ns()
        for n, size in zip(PRESS_BLOCKS, bsize):
            held = []
            for _ in range(n):
                a0 = time.perf_counter_ns()
                try:
                    held.append(self.alloc(size, log))
                    self.touch(held[-1])
                except Failed as e:
                    tally["failures"] += 1
                    tally["failed_ns"] += time.perf_counter_ns() - a0
                    tally["error"] = tally["error"] or str(e)
            tally["successes"] += len(held)
            while held:
                self.free_timed(held, len(held) - 1, log)
                held.pop()
            torch.cuda.synchronize()
        return time.perf_counter_ns() - t0

    def pressure(self):
        """Round time per successful allocation; failures counted apart."""
        torch, a = self.torch, self.args
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info(self.dev)
        ws = free * a.pressure_fraction
        bsize = [max(2 * MiB, int(ws / n) // (2 * MiB) * (2 * MiB)) for n in PRESS_BLOCKS]
        log, ns = ([], []), []
        tally = {"successes": 0, "failures": 0, "failed_ns": 0, "error": None}
        start = time.perf_counter_ns()
        with torch.cuda.stream(self.stream):
            for _ in range(a.pressure_rounds):
                before = tally["successes"]
                t = self.pressure_round(bsize, log, tally)
                if tally["successes"] > before:
                    ns.append(t / (tally["successes"] - before))
        med = median(ns)
        note = ("working set %.1f GiB = %.0f%% of %.1f GiB free; per round %d x %d MiB, "
                "%d x %d MiB, %d x %d MiB" % (
                    ws / (1 << 30), a.pressure_fraction * 100, free / (1 << 30),
                    PRESS_BLOCKS[0], bsize[0] // MiB, PRESS_BLOCKS[1], bsize[1] // MiB,
                    PRESS_BLOCKS[2], bsize[2] // MiB))
        return {"median_ns": med, "units_per_batch": 1, "batches": len(ns),
                "successes": tally["successes"], "failures": tally["failures"],
                "failed_calls_ms": round(tally["failed_ns"] / 1e6, 2), "error": tally["error"],
                "alloc_ns": percentiles(log[0]), "free_ns": percentiles(log[1]),
                "total_ms": round((time.perf_counter_ns() - start) / 1e6, 1),
                "batches_ns": [round(x, 1) for x in ns], "note": note}

    def peak(self, result):
        """The scenario's peak footprint, where the allocator can say it."""
        if self.gt:
            result["peak_bytes"] = None
            result["peak_source"] = PLUGIN_PEAK_WHY
        else:
            result["peak_bytes"] = self.torch.cuda.max_memory_reserved(self.dev)
            result["peak_source"] = "torch.cuda.max_memory_reserved (reset per scenario)"

    def empty(self):
        """Every scenario starts from an empty cache: torch.cuda.empty_cache()
        does not reach a plug-in, so gma's is emptied through gma.torch."""
        self.torch.cuda.synchronize()
        if self.gt:
            self.gt.empty_cache(self.args.device)
        else:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats(self.dev)

    def scenario(self, sc):
        self.empty()
        r = self.pressure() if sc[2] == "pressure" else self.interleaved(sc)
        if "median_ns" in r:
            self.peak(r)
        return r


PLUGIN_PEAK_WHY = ("not measured: gma's reserved.peak counts since the allocator was made and "
                   "cannot be reset per scenario, and torch.cuda's statistics do not see a plug-in")


def worker(args):
    import torch  # noqa: imported here so the parent can report its absence

    gt, entry = None, None
    if args.worker == "gma_torch_plugin":
        gt, entry = load_plugin(torch, args.plugin)
    bench = Bench(torch, args, gt)
    results = {}
    for sc in SCENARIOS:
        if args.scenarios and sc[0] not in args.scenarios:
            continue
        print("torch_bench [%s]: %s" % (args.worker, sc[1]), file=sys.stderr, flush=True)
        results[sc[0]] = bench.scenario(sc)
    dev = bench.dev
    out = {"results": results, "torch_version": torch.__version__,
           "cuda_version": torch.version.cuda, "gpu": torch.cuda.get_device_name(dev),
           "total_memory": torch.cuda.get_device_properties(dev).total_memory,
           "spin_cycles_per_us": bench.cycles_per_us, "plugin_entry": entry}
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
    p.add_argument("--spin-us", type=int, default=20,
                   help="how long a buffer's second stream is held (20)")
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
                "--spin-us", str(args.spin_us),
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
                if data.get("plugin_entry"):
                    entry["entry_point"] = data["plugin_entry"]
                if data.get("spin_cycles_per_us") is None:
                    entry["note"] = ("torch.cuda._sleep is missing: the second stream is not "
                                     "held in the cross-stream scenarios")
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
        unit = {"training": "ns per alloc+free pair (iteration wall time / allocations)",
                "pressure": "ns per successful allocation (round wall time / successes)",
                "threads": "ns per alloc+free pair per thread (batch wall time)"}.get(
                    kind, "ns per alloc+free pair (batch wall time)")
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
                   "pressure_rounds": args.pressure_rounds, "spin_us": args.spin_us,
                   "touch_stride": TOUCH_STRIDE,
                   "unit": "ns per alloc+free pair (batch wall time; the Python calls, the "
                           "kernels and the synchronization included)",
                   "median": "across batches",
                   "percentiles": "nearest rank over individual torch.empty and free calls "
                                  "(the free: dropping the last reference, with record_stream "
                                  "first when cross-stream)"},
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
