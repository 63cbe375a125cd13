#!/usr/bin/env python3
"""Runs bench/gpu/torch_bench.py's measuring code on a stand-in torch, as CI
has neither torch nor a GPU:

  test_torch_bench.py REPO

The stand-in (written to a temporary directory and put first on PYTHONPATH)
keeps tensors in a byte budget: torch.empty beyond it raises
torch.OutOfMemoryError, or, with STUB_TORCH_OOM=null, returns a tensor at
address 0 the way gma's plug-in without its shim makes PyTorch do. Its
mem_get_info reports twice the budget free, so the memory pressure scenario
must fail some allocations. It logs empty_cache and record_stream calls.

Checked, for both kinds of failure: every scenario but the async ones
(PyTorch has none) is measured, with per-call percentiles over as many frees
as allocations and a peak; the cache is emptied before every scenario; the
cross-stream frees go through record_stream; under memory pressure failures
are counted apart from successes (never as successes), the percentiles cover
the successful allocations only, and the figure is per success. Figures from
the stand-in mean nothing and are not looked at. The gma plug-in's path needs
libgma_torch.so on a real CUDA device and is not run here.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

STUB = r'''
"""A stand-in torch for tests/tools/test_torch_bench.py: host bookkeeping only."""
import itertools
import os
import time

__version__ = "0.0-stub"
uint8 = "uint8"
CAP = int(os.environ.get("STUB_TORCH_CAP", str(256 << 20)))
NULL_ON_OOM = os.environ.get("STUB_TORCH_OOM") == "null"
_LOG = os.environ.get("STUB_TORCH_LOG")
_state = {"used": 0, "peak": 0}
_addr = itertools.count(1 << 20, 1 << 12)


def _log(what):
    if _LOG:
        with open(_LOG, "a") as f:
            f.write(what + "\n")


class OutOfMemoryError(RuntimeError):
    pass


class version:
    cuda = "0.0-stub"


class device:
    def __init__(self, kind, index=0):
        self.type, self.index = kind, index


class _Storage:
    def __init__(self, n, ptr):
        self.n, self.ptr = n, ptr
        _state["used"] += n
        _state["peak"] = max(_state["peak"], _state["used"])

    def __del__(self):
        _state["used"] -= self.n


class Tensor:
    def __init__(self, storage, ptr):
        self._storage, self._ptr = storage, ptr

    def data_ptr(self):
        return self._ptr

    def __getitem__(self, key):
        return Tensor(self._storage, self._ptr)

    def fill_(self, value):
        return self

    def record_stream(self, stream):
        _log("record_stream")


def empty(n, dtype=None, device=None):
    if _state["used"] + n > CAP:
        if NULL_ON_OOM:
            return Tensor(None, 0)
        raise OutOfMemoryError("stub: %d bytes over the budget" % n)
    ptr = next(_addr)
    return Tensor(_Storage(n, ptr), ptr)


class _Stream:
    def __init__(self, device=None):
        self.cuda_stream = id(self)

    def wait_stream(self, other):
        pass

    def synchronize(self):
        pass


class _StreamContext:
    def __init__(self, s):
        self.s = s

    def __enter__(self):
        cuda._current.append(self.s)

    def __exit__(self, *exc):
        cuda._current.pop()


class _Event:
    def __init__(self, enable_timing=False):
        self.t = 0

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return max((other.t - self.t) * 1000, 1e-3)


class _Props:
    total_memory = CAP
    name = "stub GPU"


class cuda:
    Stream = _Stream
    Event = _Event
    OutOfMemoryError = OutOfMemoryError
    _current = [_Stream()]

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def device_count():
        return 1

    @staticmethod
    def set_device(d):
        pass

    @staticmethod
    def stream(s):
        return _StreamContext(s)

    @staticmethod
    def current_stream():
        return cuda._current[-1]

    @staticmethod
    def synchronize():
        pass

    @staticmethod
    def _sleep(cycles):
        pass

    @staticmethod
    def mem_get_info(d=None):
        return 2 * CAP - _state["used"], 2 * CAP

    @staticmethod
    def empty_cache():
        _log("empty_cache")

    @staticmethod
    def reset_peak_memory_stats(d=None):
        _state["peak"] = _state["used"]

    @staticmethod
    def max_memory_reserved(d=None):
        return _state["peak"]

    @staticmethod
    def get_device_name(d=None):
        return "stub GPU"

    @staticmethod
    def get_device_properties(d=None):
        return _Props()
'''

fails = []


def check(cond, what):
    if not cond:
        fails.append(what)
    return cond


def run_case(repo, tmp, mode):
    stub_dir = os.path.join(tmp, mode)
    os.makedirs(os.path.join(stub_dir, "torch"))
    with open(os.path.join(stub_dir, "torch", "__init__.py"), "w") as f:
        f.write(STUB)
    log = os.path.join(stub_dir, "calls.log")
    out = os.path.join(stub_dir, "bench.json")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", STUB_TORCH_OOM=mode,
               STUB_TORCH_LOG=log, STUB_TORCH_CAP=str(1 << 30))
    env["PYTHONPATH"] = os.pathsep.join([stub_dir] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("GMA_TORCH_PLUGIN", None)
    cmd = [sys.executable, os.path.join(repo, "bench", "gpu", "torch_bench.py"), "--json", out,
           "--allocators", "torch", "--reps", "2", "--pairs", "40", "--iterations", "1",
           "--batch-ms", "1", "--pressure-rounds", "2", "--spin-us", "1"]
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=120)
    print("%s: exit %d\n%s%s" % (mode, r.returncode, r.stdout[-1500:], r.stderr[-1500:]))
    if not check(r.returncode == 0, "%s: torch_bench exited %d" % (mode, r.returncode)):
        return
    with open(out) as f:
        data = json.load(f)
    check(data.get("benchmark") == "torch-bench" and "skipped" not in data,
          "%s: JSON says %r" % (mode, data.get("skipped")))
    scenarios = {sc["id"]: sc["results"]["torch"] for sc in data.get("scenarios", [])}
    check(len(scenarios) == 10, "%s: %d scenarios, want 10" % (mode, len(scenarios)))
    for sid, res in scenarios.items():
        if sid.startswith("async"):
            check("skipped" in res, "%s/%s: not skipped: %r" % (mode, sid, res))
            continue
        if not check("median_ns" in res and res["median_ns"],
                     "%s/%s: not measured: %r" % (mode, sid, res)):
            continue
        a, fr = res["alloc_ns"], res["free_ns"]
        check(a["calls"] > 0 and a["calls"] == fr["calls"],
              "%s/%s: %d allocation and %d free calls timed" % (mode, sid, a["calls"],
                                                               fr["calls"]))
        check(a["p50"] <= a["p99"] <= a["max"], "%s/%s: percentiles %r" % (mode, sid, a))
        check(isinstance(res.get("peak_bytes"), int) and res["peak_bytes"] > 0,
              "%s/%s: peak %r" % (mode, sid, res.get("peak_bytes")))
    press = scenarios.get("memory_pressure", {})
    check(press.get("failures", 0) > 0 and press.get("successes", 0) > 0,
          "%s: memory pressure: %r successes, %r failures (want both)" % (
              mode, press.get("successes"), press.get("failures")))
    check(press.get("alloc_ns", {}).get("calls") == press.get("successes"),
          "%s: memory pressure: %r allocation calls timed, %r successes" % (
              mode, press.get("alloc_ns", {}).get("calls"), press.get("successes")))
    want = "NULL" if mode == "null" else "over the budget"
    check(want in (press.get("error") or ""),
          "%s: memory pressure error %r lacks %r" % (mode, press.get("error"), want))
    with open(log) as f:
        calls = f.read().split()
    check(calls.count("empty_cache") == 10,
          "%s: empty_cache called %d times, want once per scenario (10)" % (
              mode, calls.count("empty_cache")))
    check(calls.count("record_stream") > 0, "%s: no record_stream call" % mode)


def main():
    repo = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="test_torch_bench_")
    try:
        for mode in ("raise", "null"):
            run_case(repo, tmp, mode)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for f in fails:
        print("FAIL", f)
    print("test_torch_bench: %s" % ("FAILED" if fails else "ok"))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
