#!/usr/bin/env python3
"""Compares gma-estimate with the peak live bytes of recorded traces whose
model is known: the CS336 transformer traces of ../shared/traces (their
configurations below, read from each trace's tensor sizes and stack frames;
docs/estimate.md). Python 3 standard library only.

Usage: tools/estimate_traces.py GMA_ESTIMATE DIR [--only NAME ...] [--json PATH]
  GMA_ESTIMATE: the gma-estimate binary. DIR holds the traces, as gma trace
  CSV (NAME.csv or NAME.csv.gz) or as PyTorch snapshots (NAME.pickle, which
  tools/gma-import-torch converts into a temporary directory). Traces not in
  DIR are skipped, saying so.
Prints a table: trace, estimate, peak live, error. The peak live bytes are the
trace's own (every request it records as served, memory live before
recording began included), as gma-replay's "trace peak live".
Exit status: 0 done; 1 a tool failed; 2 bad usage.
"""
import csv
import gzip
import io
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# The CS336 models (assignment 2's table; vocabulary 10,000; SwiGLU unless said).
XL27 = ["--hidden", "2560", "--intermediate", "10240", "--layers", "32", "--heads", "32",
        "--vocab", "10000"]
SMALL = ["--hidden", "768", "--intermediate", "3072", "--layers", "12", "--heads", "12",
         "--vocab", "10000"]
MEDIUM = ["--hidden", "1024", "--intermediate", "4096", "--layers", "24", "--heads", "16",
          "--vocab", "10000"]
LARGE = ["--hidden", "1280", "--intermediate", "5120", "--layers", "36", "--heads", "20",
         "--vocab", "10000"]
TINY = ["--hidden", "512", "--intermediate", "1344", "--layers", "4", "--heads", "16",
        "--vocab", "10000"]

# name -> (gma-estimate options, what the trace runs)
TRACES = {
    "transformer_ctx128_forward": (
        XL27 + ["--batch", "4", "--seq-len", "128", "--mode", "forward",
                "--attention", "eager-exp"],
        "2.7B, batch 4, ctx 128, fp32 forward with autograd"),
    "transformer_ctx512_forward_mixed": (
        XL27 + ["--batch", "4", "--seq-len", "512", "--mode", "forward",
                "--attention", "eager-exp", "--act-dtype", "bf16"],
        "2.7B, batch 4, ctx 512, bf16 autocast forward with autograd"),
    "kkaitlyn_2p7b_forward": (
        XL27 + ["--batch", "4", "--seq-len", "128", "--mode", "forward",
                "--attention", "eager-exp"],
        "2.7B, batch 4, ctx 128, fp32 forward with autograd"),
    "bolongcheng_2p7b_ctx2048_fwd_expandable": (
        XL27 + ["--batch", "4", "--seq-len", "2048", "--mode", "inference",
                "--attention", "eager-exp"],
        "2.7B, batch 4, ctx 2048, fp32 forward without autograd"),
    "rishabh_lm_init_plus_inference": (
        XL27 + ["--batch", "16", "--seq-len", "128", "--mode", "inference",
                "--attention", "eager-exp", "--plain-ffn", "--tied"],
        "2.7B (GELU, tied head), batch 16, ctx 128, fp32 no_grad inference"),
    "silmont_small_ctx128_fwd_bf16": (
        SMALL + ["--batch", "4", "--seq-len", "128", "--mode", "inference",
                 "--act-dtype", "bf16"],
        "small, batch 4, ctx 128, bf16 autocast forward without autograd"),
    "charan_small_ctx512": (
        SMALL + ["--batch", "4", "--seq-len", "512", "--mode", "inference",
                 "--attention", "eager-exp"],
        "small, batch 4, ctx 512, fp32 forward without autograd"),
    "wedsonlin_medium_ctx512_train": (
        MEDIUM + ["--batch", "4", "--seq-len", "512", "--mode", "training"],
        "medium, batch 4, ctx 512, fp32 training, AdamW"),
    "nothanmin_large_ctx256_train": (
        LARGE + ["--batch", "4", "--seq-len", "256", "--mode", "training",
                 "--attention", "eager-exp"],
        "large, batch 4, ctx 256, fp32 training, AdamW"),
    "sidsoc12_2p7b_ctx128_fp32_train": (
        XL27 + ["--batch", "4", "--seq-len", "128", "--mode", "training",
                "--attention", "eager-exp", "--grads-released"],
        "2.7B, batch 4, ctx 128, fp32 training, AdamW"),
    "niu_tiny_ctx200_train_bf16": (
        TINY + ["--batch", "10", "--seq-len", "200", "--mode", "training",
                "--attention", "eager-exp", "--act-dtype", "bf16", "--grads-released"],
        "512/4 layers, batch 10, ctx 200, bf16 autocast training, AdamW"),
}


def peak_live(lines):
    """The trace's peak of live requested bytes, as gma-replay's peak_live."""
    live, cur, peak = {}, 0, 0
    for r in csv.DictReader(lines):
        a, ok, p = r["Action"], not r.get("Status"), r["Pointer"]
        if a == "allocate" and ok:
            cur += int(r["Size"]) - live.get(p, 0)
            live[p] = int(r["Size"])
            peak = max(peak, cur)
        elif a == "free" and ok and p in live:
            cur -= live.pop(p)
    return peak


def load_trace(d, name, tmp):
    """The trace's CSV lines, or None when DIR has no form of it."""
    p = os.path.join(d, name)
    if os.path.exists(p + ".csv"):
        return open(p + ".csv", newline="")
    if os.path.exists(p + ".csv.gz"):
        return io.TextIOWrapper(gzip.open(p + ".csv.gz"), newline="")
    if os.path.exists(p + ".pickle"):
        out = os.path.join(tmp, name + ".csv")
        subprocess.run([sys.executable, os.path.join(HERE, "gma-import-torch"), "-q", "-o", out,
                        p + ".pickle"], check=True)
        return open(out, newline="")
    return None


def main(argv):
    if len(argv) < 3 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) > 1 and argv[1] in ("-h", "--help") else 2
    exe, d, rest = argv[1], argv[2], argv[3:]
    only, json_path = [], None
    while rest:
        if rest[0] == "--only" and len(rest) > 1:
            only.append(rest[1])
        elif rest[0] == "--json" and len(rest) > 1:
            json_path = rest[1]
        else:
            print("estimate_traces.py: bad option %s" % rest[0], file=sys.stderr)
            return 2
        rest = rest[2:]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (opts, what) in TRACES.items():
            if only and name not in only:
                continue
            f = load_trace(d, name, tmp)
            if f is None:
                print("%s: not in %s, skipped" % (name, d), file=sys.stderr)
                continue
            with f:
                live = peak_live(f)
            out = subprocess.run([exe] + opts + ["--json", "-"], check=True,
                                 capture_output=True, text=True).stdout
            est = json.loads(out)["estimate"]
            err = (est["total_bytes"] - live) / live
            rows.append({"trace": name, "workload": what, "estimate_bytes": est["total_bytes"],
                         "peak_live_bytes": live, "error": err, "phase": est["phase"],
                         "options": " ".join(opts)})
    g = float(1 << 30)
    print("| trace | workload | estimate GiB | peak live GiB | error |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print("| %s | %s | %.2f | %.2f | %+.1f%% |" % (r["trace"], r["workload"],
                                                      r["estimate_bytes"] / g,
                                                      r["peak_live_bytes"] / g, 100 * r["error"]))
    if json_path:
        with open(json_path, "w") as jf:
            json.dump(rows, jf, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
