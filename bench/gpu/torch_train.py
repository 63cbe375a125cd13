#!/usr/bin/env python3
"""torch_train.py: a small PyTorch training loop on PyTorch's allocator and on gma.

The model is built in code (nothing is downloaded): a 2-block pre-norm
transformer encoder (width 256, 4 heads, attention written with matmul and
softmax, MLP 4x) with a 10-class head, trained with AdamW on random data whose
labels follow from the inputs through a fixed random projection (so the loss
falls). Batch size (8..64) and sequence length (16..256) change every step,
drawn from a seeded plan, so activations come in many sizes and the allocator
has to split, reuse and grow.

The same loop runs twice, each in its own process (a plug-in must be installed
before the process's first CUDA allocation, and one allocator's cache must not
weigh on the other):

  torch  PyTorch's CUDA caching allocator, default settings
         (PYTORCH_CUDA_ALLOC_CONF cleared);
  gma    gma through torch.cuda.memory.CUDAPluggableAllocator (python/gma/torch.py's
         gma.torch.use, GMA_CONF=device:cuda unless --gma-conf says otherwise), with
         the plug-in named by --plugin, $GMA_TORCH_PLUGIN, or build/release's.

Per run it reports the final loss, steps/s (after --warmup steps, between two
torch.cuda.synchronize() calls), and peak memory: for torch,
torch.cuda.max_memory_reserved() and max_memory_allocated(); for gma, gma's own
statistics through the Python binding (gma.torch.stats: reserved.peak and
allocated.peak), since PyTorch's memory_stats() does not see a plug-in. Both
also report the device memory in use at the end by cudaMemGetInfo
(torch.cuda.mem_get_info: total - free, which includes the CUDA context and
anything else on the GPU). Device allocations: torch's
memory_stats()["segment.all.allocated"], gma's num_device_allocs.

Loss check. Seeds, data, model and kernels are the same in both runs
(use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8, TF32 off); the
allocator only chooses addresses, so the losses should be bit-identical. The
check allows a relative difference of --tolerance (default 1e-4) at every
recorded step (every 10th and the last), as headroom for a kernel whose choice
or reduction order depends on a pointer's alignment (PyTorch aligns to 512 B,
gma to 256 B); a difference beyond it means the two runs did not compute the
same thing, e.g. memory reused while still in use, and the script exits 1.

OOM check. After the gma run's training, the worker asks for a tensor of
twice the device's memory: it must raise torch.OutOfMemoryError carrying
gma's message (libgma_torch_shim.so, which gma.torch.use() picks beside the
plug-in), leave gma's allocated bytes unchanged, and a small tensor must work
afterwards; otherwise the script exits 1 ("torch_train: gma OOM check
failed"). The result is in the JSON (runs.gma.oom) and under the table.

Output: a JSON file (--json), a markdown table (printed, and written to
--markdown). Without torch, or without a CUDA device, it prints
"torch_train: skipped: <why>", writes {"skipped": why} to the JSON file and
exits 0. Exit 1 when a run fails or the losses differ; with --strict, also when
a run could not be made (no plug-in). Python 3.8+, no dependency but torch.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torchkit

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MiB = 1 << 20

RUNS = {
    "torch": "PyTorch caching allocator (default settings)",
    "gma": "gma via CUDAPluggableAllocator (libgma_torch.so)",
}


# ---- the worker: one process, one allocator -----------------------------------------------


def plan(seed, steps):
    """(batch, seq) per step: a seeded mix, the same in every run."""
    import random

    rng = random.Random(seed)
    return [(rng.randint(1, 8) * 8, rng.randint(1, 16) * 16) for _ in range(steps)]


def worker(args):
    import torch  # noqa: imported here so the parent can report its absence

    if args.worker == "gma":
        sys.path.insert(0, os.path.join(REPO, "python"))
        os.environ["GMA_TORCH_LIBRARY"] = args.plugin
        libgma = os.path.join(os.path.dirname(args.plugin), "libgma.so")
        if os.path.exists(libgma) and not os.environ.get("GMA_LIBRARY"):
            os.environ["GMA_LIBRARY"] = libgma
        import gma.torch as gt

        gt.use(args.gma_conf)  # before the first CUDA tensor
    import torch.nn as nn
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    width, heads, blocks, classes = 256, 4, 2, 10

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.ln2 = nn.LayerNorm(width)
            self.fc1 = nn.Linear(width, 4 * width)
            self.fc2 = nn.Linear(4 * width, width)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, width // heads).unbind(2)
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # b, heads, t, d
            att = torch.softmax(q @ k.transpose(-1, -2) / (width // heads) ** 0.5, dim=-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, width))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))
            self.ln = nn.LayerNorm(width)
            self.head = nn.Linear(width, classes)

        def forward(self, x):
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x).mean(1))

    torch.manual_seed(args.seed)  # parameters are made on the CPU, then moved
    model = Model().to(dev)
    teacher = torch.randn(width, classes, generator=torch.Generator().manual_seed(args.seed + 1))
    teacher = teacher.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    shapes = plan(args.seed, args.steps)
    losses = []
    t0 = None
    for step, (b, t) in enumerate(shapes):
        if step == args.warmup:
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
        x = torch.randn(b, t, width, device=dev, generator=gen)
        y = (x.mean(1) @ teacher).argmax(-1)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            losses.append((step, loss.item()))
    torch.cuda.synchronize(dev)
    elapsed = time.perf_counter() - t0 if t0 is not None else None
    free, total = torch.cuda.mem_get_info(dev)
    out = {"losses": losses, "final_loss": losses[-1][1],
           "steps_per_s": round((args.steps - args.warmup) / elapsed, 2) if elapsed else None,
           "timed_steps": args.steps - args.warmup,
           "device_used_at_end": total - free,
           "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(dev), "total_memory": total}
    if args.worker == "gma":
        s = gt.stats(args.device)
        out.update(peak_reserved=s["reserved"]["peak"], peak_allocated=s["allocated"]["peak"],
                   device_allocs=s["num_device_allocs"],
                   peak_source="gma.torch.stats (gma_stats: reserved.peak, allocated.peak)")
        out["oom"] = oom_check(torch, gt, dev, total)
    else:
        ms = torch.cuda.memory_stats(dev)
        out.update(peak_reserved=torch.cuda.max_memory_reserved(dev),
                   peak_allocated=torch.cuda.max_memory_allocated(dev),
                   device_allocs=ms.get("segment.all.allocated"),
                   peak_source="torch.cuda.max_memory_reserved / max_memory_allocated")
    with open(args.worker_out, "w") as f:
        json.dump(out, f)


def oom_check(torch, gt, dev, total):
    """After training on gma: a tensor of twice the device's memory must raise
    torch.OutOfMemoryError (libgma_torch_shim.so) with gma's message, leave
    gma's allocated bytes as they were, and a small tensor must still work.
    Without the shim gma returns NULL and PyTorch makes a tensor at address 0
    (never touched here): reported as a failure."""
    r = {"shim": gt.shim_path(), "requested": 2 * total}
    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    before = gt.stats(dev.index)["allocated"]["current"]
    try:
        t = torch.empty(2 * total, dtype=torch.uint8, device=dev)
        r.update(ok=False, raised=None, why="no exception: PyTorch got address 0x%x"
                 % t.data_ptr())
        del t
    except oom_type as e:
        msg = str(e)
        r.update(raised=type(e).__name__, message=msg.splitlines()[0][:400])
        r["ok"] = "gma: out of memory" in msg
        if not r["ok"]:
            r["why"] = "torch.OutOfMemoryError without gma's message"
    except Exception as e:  # RuntimeError: a shim built against another c10, say
        r.update(ok=False, raised=type(e).__name__, why=str(e).splitlines()[0][:400])
    after = gt.stats(dev.index)["allocated"]["current"]
    small = torch.ones(1 << 20, device=dev)
    usable = small.sum().item() == float(1 << 20)
    r.update(allocated_unchanged=after == before, usable_after=usable)
    if r["ok"] and not (after == before and usable):
        r.update(ok=False, why="allocated %d -> %d bytes, usable after: %s"
                 % (before, after, usable))
    return r


# ---- the parent: checks, subprocesses, comparison -----------------------------------------


def skip(args, reason):
    return torchkit.skip("torch_train", "torch-train", args.json, reason)


def mib(n):
    return "%.1f" % (n / MiB) if n is not None else "-"


def markdown(result):
    lines = ["| allocator | final loss | steps/s | peak reserved (MiB) | peak allocated (MiB) "
             "| device allocations | device used at end (MiB) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in result["runs"].items():
        if "final_loss" not in r:
            lines.append("| %s | %s | | | | | |" % (
                name, (r.get("skipped") or r.get("error") or "").replace("|", "/")))
            continue
        lines.append("| %s | %.6f | %s | %s | %s | %s | %s |" % (
            name, r["final_loss"], r["steps_per_s"], mib(r["peak_reserved"]),
            mib(r["peak_allocated"]), r["device_allocs"], mib(r["device_used_at_end"])))
    oom = result["runs"].get("gma", {}).get("oom")
    if oom:
        lines.append("")
        if oom["ok"]:
            lines.append("OOM through the plug-in (%s bytes, twice the device): %s, \"%s\"; "
                         "gma's allocated bytes unchanged, a tensor allocated afterwards."
                         % (oom["requested"], oom["raised"], oom["message"].replace("|", "/")))
        else:
            lines.append("OOM through the plug-in (%s bytes): FAILED: %s (shim: %s)."
                         % (oom["requested"], oom.get("why", "").replace("|", "/"),
                            oom["shim"]))
    c = result.get("comparison")
    if c:
        lines.append("")
        lines.append("Losses %s: largest relative difference %.3g over %d recorded steps "
                     "(tolerance %.0e). gma/torch: peak reserved %s, steps/s %s." % (
                         "match" if c["losses_match"] else "DIFFER", c["max_rel_diff"],
                         c["recorded_steps"], result["config"]["tolerance"],
                         c["peak_reserved_ratio"], c["steps_per_s_ratio"]))
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default="", help="write the results here")
    p.add_argument("--markdown", default="", help="write the markdown table here")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--steps", type=int, default=300, help="training steps per run (300)")
    p.add_argument("--warmup", type=int, default=20, help="steps left out of steps/s (20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="largest relative loss difference accepted (1e-4)")
    p.add_argument("--plugin", default="", help="libgma_torch.so ($GMA_TORCH_PLUGIN, "
                   "else build/release/libgma_torch.so)")
    p.add_argument("--gma-conf", default="device:cuda", help="GMA_CONF of the gma run")
    p.add_argument("--runs", default=",".join(RUNS), help="comma-separated: torch, gma")
    p.add_argument("--timeout", type=int, default=600, help="seconds per run (600)")
    p.add_argument("--strict", action="store_true", help="a run that cannot be made is an error")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.warmup >= args.steps:
        p.error("--warmup must be less than --steps")
    if args.worker:
        worker(args)
        return 0

    why = torchkit.cuda_unavailable(args.device)
    if why:
        return skip(args, why)
    import torch  # cuda_unavailable imported it already

    wanted = torchkit.choose(p, args.runs, RUNS, "run")
    plugin = args.plugin or os.environ.get("GMA_TORCH_PLUGIN") or os.path.join(
        REPO, "build", "release", "libgma_torch.so")
    runs, info, status = {}, {}, 0
    for name in RUNS:
        if name not in wanted:
            continue
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        env.pop("PYTORCH_ALLOC_CONF", None)
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", name,
               "--device", str(args.device), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--seed", str(args.seed),
               "--gma-conf", args.gma_conf]
        if name == "gma":
            if not os.path.isfile(plugin):
                runs[name] = {"skipped": "no plug-in at %s (build the gma_torch target, or "
                              "pass --plugin)" % plugin}
                print("torch_train: gma run skipped: %s" % runs[name]["skipped"])
                status = 1 if args.strict else status
                continue
            cmd += ["--plugin", os.path.abspath(plugin)]
        fd, out = tempfile.mkstemp(prefix="torch_train_", suffix=".json")
        os.close(fd)
        cmd += ["--worker-out", out]
        print("torch_train: running %s (%d steps)" % (name, args.steps), flush=True)
        try:
            r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=True, timeout=args.timeout)
            if r.returncode != 0:
                tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
                runs[name] = {"error": "worker exited with %d: %s"
                              % (r.returncode, " | ".join(tail))}
            else:
                with open(out) as f:
                    runs[name] = json.load(f)
                if name == "gma":
                    runs[name]["plugin"] = os.path.abspath(plugin)
                    runs[name]["gma_conf"] = args.gma_conf
                info = info or runs[name]
        except subprocess.TimeoutExpired:
            runs[name] = {"error": "run took longer than --timeout %d s" % args.timeout}
        finally:
            os.unlink(out)
        if "error" in runs[name]:
            print("torch_train: %s run failed: %s" % (name, runs[name]["error"]))
            status = 1

    result = {
        "benchmark": "torch-train",
        "config": {"steps": args.steps, "warmup": args.warmup, "seed": args.seed,
                   "tolerance": args.tolerance, "device_ordinal": args.device,
                   "model": "2 pre-norm transformer blocks, width 256, 4 heads, MLP 4x, "
                            "10 classes, AdamW lr 3e-4",
                   "data": "random, batch 8..64 x sequence 16..256 per step (seeded)",
                   "torch_version": info.get("torch_version", torch.__version__),
                   "cuda_version": info.get("cuda_version", torch.version.cuda),
                   "gpu": info.get("gpu"), "total_memory": info.get("total_memory")},
        "runs": runs,
    }
    a, b = runs.get("torch", {}), runs.get("gma", {})
    if "oom" in b and not b["oom"]["ok"]:
        print("torch_train: gma OOM check failed: %s (shim: %s)"
              % (b["oom"].get("why"), b["oom"]["shim"]))
        status = 1
    if "losses" in a and "losses" in b:
        pairs = list(zip(a["losses"], b["losses"]))
        rel = max(abs(x[1] - y[1]) / max(abs(x[1]), 1e-12) for x, y in pairs)
        same_steps = all(x[0] == y[0] for x, y in pairs) and len(a["losses"]) == len(b["losses"])
        match = same_steps and rel <= args.tolerance
        result["comparison"] = {
            "losses_match": match, "max_rel_diff": rel, "recorded_steps": len(pairs),
            "peak_reserved_ratio": round(b["peak_reserved"] / a["peak_reserved"], 3)
            if a["peak_reserved"] else None,
            "steps_per_s_ratio": round(b["steps_per_s"] / a["steps_per_s"], 3)
            if a["steps_per_s"] and b["steps_per_s"] else None}
        if not match:
            print("torch_train: the losses differ beyond the tolerance: largest relative "
                  "difference %.3g > %.0e" % (rel, args.tolerance))
            status = 1
    torchkit.write_json(args.json, result)
    table = markdown(result)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    print()
    print(table, end="")
    if args.json:
        print("\nwrote %s" % args.json)
    return status


if __name__ == "__main__":
    sys.exit(main())
