#!/usr/bin/env python3
"""PyTorch-format snapshots (gma_snapshot_write GMA_SNAPSHOT_TORCH):

1. gma-replay --torch-snapshot on a shipped trace (traces/cnn_latent_eor):
   the pickle loads with an unpickler that refuses every global, has
   PyTorch's keys (segments with their blocks, device_traces), only
   PyTorch's actions, and an entry per replayed allocation and free;
2. round trip: the pickle through tools/gma-import-torch and gma-replay
   gives the same peaks (requested, allocated, reserved) as the original
   trace, and the importer's recorded peak reserved is gma's own;
3. the Python binding (gma.Allocator.snapshot(format="torch")) and its
   error path (a bad path raises gma.InvalidArgument naming the file);
4. where torch is installed, torch.cuda._memory_viz's own functions read
   the pickle (skipped otherwise, saying so).

Usage: test_torch_snapshot.py GMA_REPLAY SOURCE_DIR
Exit 0 when every part passed, 1 when one failed.
"""
import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile

REPLAY, SOURCE = sys.argv[1], sys.argv[2]
IMPORTER = os.path.join(SOURCE, "tools", "gma-import-torch")
FAILS = []
SEG_KEYS = {"device", "address", "total_size", "allocated_size", "active_size",
            "requested_size", "stream", "segment_type", "segment_pool_id", "is_expandable",
            "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
ENTRY_KEYS = {"action", "addr", "size", "stream", "time_us", "frames"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot"}


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        FAILS.append(what)
    return cond


class Plain(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("names the global %s.%s" % (module, name))


def load(path):
    with open(path, "rb") as f:
        return Plain(f).load()


def run(*args):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    if p.returncode != 0:
        raise SystemExit("FAIL  %s exited %d:\n%s" % (" ".join(args), p.returncode, p.stdout))
    return p.stdout


def peaks(json_path):
    with open(json_path) as f:
        r = json.load(f)["results"][0]["result"]
    return {k: r[k] for k in ("peak_requested", "peak_allocated", "peak_reserved",
                              "recorded_peak_reserved", "trace_peak_live")}


def check_structure(snap, where):
    check(isinstance(snap, dict) and {"segments", "device_traces"} <= set(snap),
          "%s: a dict with segments and device_traces" % where)
    segs = snap["segments"]
    check(all(SEG_KEYS <= set(s) for s in segs), "%s: every segment has %s" % (where, sorted(SEG_KEYS)))
    check(all(BLOCK_KEYS <= set(b) for s in segs for b in s["blocks"]),
          "%s: every block has %s" % (where, sorted(BLOCK_KEYS)))
    check(all(sum(b["size"] for b in s["blocks"]) == s["total_size"] for s in segs),
          "%s: blocks tile their segment" % where)
    check(all(s["allocated_size"] == sum(b["size"] for b in s["blocks"]
                                         if b["state"] == "active_allocated") for s in segs),
          "%s: allocated_size is the active_allocated blocks' bytes" % where)
    states = {b["state"] for s in segs for b in s["blocks"]}
    check(states <= {"active_allocated", "active_pending_free", "inactive"},
          "%s: block states are PyTorch's (%s)" % (where, sorted(states)))
    traces = snap["device_traces"]
    check(isinstance(traces, list) and all(isinstance(t, list) for t in traces),
          "%s: device_traces is a list per device" % where)
    entries = [e for t in traces for e in t]
    check(all(ENTRY_KEYS <= set(e) or (e.get("action") == "oom" and "device_free" in e)
              for e in entries), "%s: every entry has %s" % (where, sorted(ENTRY_KEYS)))
    acts = {e["action"] for e in entries}
    check(acts <= ACTIONS, "%s: actions are PyTorch's (%s)" % (where, sorted(acts)))
    return entries


def main():
    tmp = tempfile.mkdtemp(prefix="gma-torch-snapshot-")
    trace = os.path.join(tmp, "cnn.csv")
    with gzip.open(os.path.join(SOURCE, "traces", "cnn_latent_eor.csv.gz"), "rt") as f, \
            open(trace, "w") as out:
        out.write(f.read())
    n_alloc = n_free = 0
    with open(trace) as f:
        next(f)
        for row in f:
            action = row.split(",")[2]
            n_alloc += action == "allocate"
            n_free += action == "free"

    # 1. The replay's pickle.
    snap = os.path.join(tmp, "cnn.pickle")
    a_json = os.path.join(tmp, "a.json")
    run(REPLAY, "--quiet", "--config", "default=", "--json", a_json,
        "--torch-snapshot", snap, trace)
    check(not os.path.exists(snap + ".trace.tmp"), "the replay's temporary trace is removed")
    data = load(snap)
    entries = check_structure(data, "gma-replay --torch-snapshot")
    count = {a: sum(e["action"] == a for e in entries) for a in ACTIONS}
    check(count["alloc"] >= n_alloc and count["alloc"] > 0,
          "an alloc entry per replayed allocation (%d entries, %d allocate rows; the trace's "
          "pre-live seeds included)" % (count["alloc"], n_alloc))
    check(count["free_requested"] == count["free_completed"] > 0,
          "free_requested and free_completed pair up (%d)" % count["free_requested"])
    # The default config grows by mapping chunks (segment_map), as PyTorch's
    # expandable segments do; ordinary segments would write segment_alloc.
    check(count["segment_map"] > 0 and count["segment_alloc"] == 0,
          "segment_map entries (%d), no segment_alloc (%d)" % (count["segment_map"],
                                                               count["segment_alloc"]))
    times = [e["time_us"] for e in entries]
    check(all(isinstance(t, int) and t >= 0 for t in times), "time_us are integers from 0")

    # 2. Round trip: importer, then gma-replay: the same peaks.
    csv2 = os.path.join(tmp, "cnn2.csv")
    run(sys.executable, IMPORTER, "-q", "-o", csv2, snap)
    b_json = os.path.join(tmp, "b.json")
    run(REPLAY, "--quiet", "--config", "default=", "--json", b_json, csv2)
    pa, pb = peaks(a_json), peaks(b_json)
    for k in ("peak_requested", "peak_allocated", "peak_reserved", "trace_peak_live"):
        check(pa[k] == pb[k], "round trip: %s %d == %d" % (k, pa[k], pb[k]))
    check(pb["recorded_peak_reserved"] == pa["peak_reserved"],
          "round trip: the re-imported trace records gma's peak reserved (%d == %d)"
          % (pb["recorded_peak_reserved"], pa["peak_reserved"]))

    # Refusals: one trace only.
    p = subprocess.run([REPLAY, "--torch-snapshot", snap, trace, trace], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    check(p.returncode == 2 and "one TRACE" in p.stderr,
          "--torch-snapshot with two traces: exit 2, saying why (%d: %s)"
          % (p.returncode, p.stderr.strip()))
    p = subprocess.run([REPLAY, "--quiet", "--config", "default=", "--torch-snapshot",
                        os.path.join(tmp, "no-such-dir", "x.pickle"), trace],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    check(p.returncode == 1 and "no-such-dir" in p.stderr,
          "--torch-snapshot into a missing directory: exit 1 naming it (%d: %s)"
          % (p.returncode, p.stderr.strip()[-200:]))

    # 3. The Python binding.
    sys.path.insert(0, os.path.join(SOURCE, "python"))
    import gma
    with gma.Allocator("device:sim", use_env=False) as al:
        al.trace_start(os.path.join(tmp, "py.csv"))
        p1 = al.alloc(5 << 20)
        p2 = al.alloc(4096)
        al.free(p2)
        d = al.snapshot(format="torch")
        entries = check_structure(d, "gma.Allocator.snapshot(format='torch')")
        check([e["action"] for e in entries if e["action"] in ("alloc", "free_requested")]
              == ["alloc", "alloc", "free_requested"], "binding: the events in order")
        live = [b for s in d["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
        check(len(live) == 1 and live[0]["address"] == p1 and live[0]["requested_size"] == 5 << 20,
              "binding: the one live block, at its address, with its requested size")
        path = al.snapshot(os.path.join(tmp, "py.pickle"), format="torch")
        check(gma.load_torch_snapshot(path) == load(path), "binding: written to a path")
        bad = os.path.join(tmp, "no-such-dir", "y.pickle")
        try:
            al.snapshot(bad, format="torch")
            check(False, "binding: a bad path raises")
        except gma.InvalidArgument as e:
            check(bad in str(e), "binding: a bad path raises gma.InvalidArgument naming it")
        try:
            al.snapshot(format="yaml")
            check(False, "binding: an unknown format raises")
        except ValueError:
            check(True, "binding: an unknown format raises ValueError")
        al.free(p1)
        al.trace_stop()

    # 4. PyTorch's own reader.
    try:
        import torch.cuda._memory_viz as mv
    except Exception as e:  # noqa: BLE001 - any import failure means no torch here
        print("skip  torch.cuda._memory_viz: torch is not importable here (%s: %s)"
              % (type(e).__name__, e))
    else:
        for name in ("segments", "memory", "trace_plot", "segment_plot"):
            fn = getattr(mv, name, None)
            if fn is None:
                print("skip  torch.cuda._memory_viz.%s: not in this torch" % name)
                continue
            try:
                out = fn(data)
                check(bool(out), "torch.cuda._memory_viz.%s reads the pickle" % name)
            except Exception as e:  # noqa: BLE001
                check(False, "torch.cuda._memory_viz.%s: %s: %s" % (name, type(e).__name__, e))

    shutil.rmtree(tmp, ignore_errors=True)
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
