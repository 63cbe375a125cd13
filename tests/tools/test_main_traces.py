#!/usr/bin/env python3
"""Tests tools/traces.sh, the part of tools/main.sh that finds the traces to
replay, as a fresh clone sees it: the script, the importer and traces/ are
copied into an empty directory (so no ../shared lies beside them) and run
there. It must list the sixteen shipped workloads, decompressed byte for byte;
GMA_TRACES_DIR adds its snapshots (one named like a shipped trace replaces
it); an empty GMA_TRACES_DIR adds nothing and says so; a bad snapshot stops
it with exit status 2. main.sh must take its traces from tools/traces.sh.
tools/traces_regen.sh, which regenerates traces/, writes reproducible files
and its --check finds a changed one.

Usage: test_main_traces.py REPO_ROOT
"""

import gzip
import os
import pickle
import shutil
import subprocess
import sys
import tempfile

FAILS = []
# The sixteen real workloads of traces/README.md, in the order traces.sh lists them.
SHIPPED = ["bolongcheng_2p7b_ctx2048_fwd_expandable", "charan_small_ctx512", "cnn_latent_eor",
           "kkaitlyn_2p7b_forward", "llama_finetune_notebook", "niu_tiny_ctx200_train_bf16",
           "nothanmin_large_ctx256_train", "octree_nca_peso_wsi_inference",
           "opt125m_zo_finetune", "rishabh_lm_init_plus_inference",
           "select_n_1f2f548_bert_validate", "sidsoc12_2p7b_ctx128_fp32_train",
           "silmont_small_ctx128_fwd_bf16", "transformer_ctx128_forward",
           "transformer_ctx512_forward_mixed", "wedsonlin_medium_ctx512_train"]
HEADER = b"Thread,Time,Action,Pointer,Size,Stream,Block,Id,Count,Status\n"


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("  FAIL: " + what)
    return cond


def run(clone, out, traces_dir=None):
    env = dict(os.environ)
    env.pop("GMA_TRACES_DIR", None)
    if traces_dir is not None:
        env["GMA_TRACES_DIR"] = traces_dir
    p = subprocess.run(["bash", os.path.join(clone, "tools", "traces.sh"), out], env=env,
                       cwd=clone, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=120)
    return p.returncode, p.stdout.splitlines(), p.stderr


def snapshot(addr, size):
    return pickle.dumps({"segments": [], "device_traces": [[
        {"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": 1},
        {"action": "free_requested", "addr": addr, "size": size, "stream": 0, "time_us": 2}]]})


def regen(clone, tmp, snaps):
    """tools/traces_regen.sh: NAME.csv.gz per snapshot, reproducible bytes
    (gzip -n: no name, no time), --check passes on them and fails on a
    changed one; a snapshot that does not import stops it (exit 2)."""
    print("traces_regen.sh writes NAME.csv.gz per snapshot; --check compares")
    os.remove(os.path.join(snaps, "broken.pickle"))
    out = os.path.join(tmp, "regen")
    tool = os.path.join(clone, "tools", "traces_regen.sh")

    def go(*args):
        p = subprocess.run(["bash", tool] + list(args), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
        return p.returncode, p.stdout, p.stderr

    rc, so, se = go(snaps, out)
    check(rc == 0 and "2 snapshots" in so, "regen: exit %d, stdout %r, stderr %r" % (rc, so, se))
    got = sorted(os.listdir(out)) if os.path.isdir(out) else []
    check(got == ["cnn_latent_eor.csv.gz", "extra.csv.gz"], "regen wrote %r" % got)
    if got != ["cnn_latent_eor.csv.gz", "extra.csv.gz"]:
        return
    with open(os.path.join(out, "extra.csv.gz"), "rb") as f:
        first = f.read()
    check(first[3] & 0x08 == 0 and first[4:8] == b"\0\0\0\0",
          "extra.csv.gz's gzip header has a name or a time: %r" % first[:10])
    check(gzip.decompress(first) == HEADER + b"0,0.000000000,allocate,0x1000,100,0x0,0,0,0,\n"
          b"0,0.000001000,free,0x1000,100,0x0,0,0,0,\n", "extra.csv.gz: %r" % gzip.decompress(first))
    rc, so, se = go(snaps, out)
    with open(os.path.join(out, "extra.csv.gz"), "rb") as f:
        check(rc == 0 and f.read() == first, "a second run gave other bytes (exit %d)" % rc)
    rc, so, se = go("--check", snaps, out)
    check(rc == 0 and "nothing written" in so, "--check: exit %d, stdout %r" % (rc, so))
    with open(os.path.join(out, "extra.csv.gz"), "wb") as f:
        f.write(gzip.compress(HEADER))
    rc, so, se = go("--check", snaps, out)
    check(rc == 1 and "DIFFERS" in so, "--check on a changed file: exit %d, stdout %r" % (rc, so))
    with open(os.path.join(snaps, "broken.pickle"), "wb") as f:
        f.write(b"not a pickle at all\n")
    rc, so, se = go(snaps, out)
    check(rc == 2 and "broken.pickle" in se, "a bad snapshot: exit %d, stderr %r" % (rc, se))


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: test_main_traces.py REPO_ROOT\n")
        return 2
    repo = os.path.abspath(sys.argv[1])
    with open(os.path.join(repo, "tools", "main.sh")) as f:
        main_sh = f.read()
    check("bash tools/traces.sh" in main_sh, "tools/main.sh does not call tools/traces.sh")
    check("../shared" not in main_sh, "tools/main.sh still names ../shared")

    with tempfile.TemporaryDirectory(prefix="gma-main-traces-") as tmp:
        clone = os.path.join(tmp, "clone")
        os.makedirs(os.path.join(clone, "tools"))
        for f in ("traces.sh", "traces_regen.sh", "gma-import-torch"):
            shutil.copy2(os.path.join(repo, "tools", f), os.path.join(clone, "tools", f))
        shutil.copytree(os.path.join(repo, "traces"), os.path.join(clone, "traces"))
        check(not os.path.exists(os.path.join(tmp, "shared")), "%s/shared exists" % tmp)

        print("a fresh clone: the shipped traces, nothing else")
        out = os.path.join(tmp, "out1")
        rc, lines, err = run(clone, out)
        want = [os.path.join(out, n + ".csv") for n in SHIPPED]
        check(rc == 0, "exit %d, stderr %r" % (rc, err))
        check(lines == want, "listed %r, want %r" % (lines, want))
        for n in SHIPPED:
            path = os.path.join(out, n + ".csv")
            if not check(os.path.exists(path), "%s was not written" % path):
                continue
            with open(path, "rb") as f:
                got = f.read()
            with gzip.open(os.path.join(repo, "traces", n + ".csv.gz")) as f:
                shipped = f.read()
            check(got == shipped, "%s differs from traces/%s.csv.gz" % (path, n))
            check(got.startswith(HEADER), "%s: header %r" % (path, got[:80]))
            check(got.count(b"\n") > 1000, "%s has only %d lines" % (path, got.count(b"\n")))
            check(b",segment_alloc," in got, "%s has no segment_alloc row (PyTorch's reserved)" % n)
        check(not [f for f in os.listdir(out) if f.endswith(".tmp")], "left a .tmp file in %s" % out)

        print("GMA_TRACES_DIR without snapshots adds nothing and says so")
        empty = os.path.join(tmp, "empty")
        os.mkdir(empty)
        rc, lines, err = run(clone, os.path.join(tmp, "out2"), empty)
        check(rc == 0 and len(lines) == len(SHIPPED) and "has no *.pickle" in err,
              "empty dir: exit %d, %d lines, stderr %r" % (rc, len(lines), err))

        print("GMA_TRACES_DIR adds its snapshots; one named like a shipped trace replaces it")
        snaps = os.path.join(tmp, "snaps")
        os.mkdir(snaps)
        with open(os.path.join(snaps, "extra.pickle"), "wb") as f:
            f.write(snapshot(0x1000, 100))
        with open(os.path.join(snaps, "cnn_latent_eor.pickle"), "wb") as f:
            f.write(snapshot(0x2000, 200))
        out = os.path.join(tmp, "out3")
        rc, lines, err = run(clone, out, snaps)
        want = [os.path.join(out, n + ".csv") for n in SHIPPED + ["extra"]]
        check(rc == 0, "with snapshots: exit %d, stderr %r" % (rc, err))
        check(lines == want, "with snapshots: listed %r, want %r" % (lines, want))
        check("replaces the shipped trace" in err, "with snapshots: stderr %r" % err)
        for n, addr, size in (("extra", "0x1000", 100), ("cnn_latent_eor", "0x2000", 200)):
            path = os.path.join(out, n + ".csv")
            if check(os.path.exists(path), "%s was not written" % path):
                with open(path, "rb") as f:
                    got = f.read()
                check(got == HEADER + ("0,0.000000000,allocate,%s,%d,0x0,0,0,0,\n"
                                       "0,0.000001000,free,%s,%d,0x0,0,0,0,\n"
                                       % (addr, size, addr, size)).encode(),
                      "%s: %r" % (path, got))

        print("a snapshot that does not import stops it (exit 2)")
        with open(os.path.join(snaps, "broken.pickle"), "wb") as f:
            f.write(b"not a pickle at all\n")
        rc, lines, err = run(clone, os.path.join(tmp, "out4"), snaps)
        check(rc == 2 and "broken.pickle" in err and "could not import" in err,
              "broken snapshot: exit %d, stderr %r" % (rc, err))

        regen(clone, tmp, snaps)

    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
