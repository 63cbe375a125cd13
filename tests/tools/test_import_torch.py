#!/usr/bin/env python3
"""Tests tools/gma-import-torch: refusal of pickles that name globals, bad
inputs (each told apart: empty, not a pickle and what it looks like,
truncated, damaged, formats it cannot read), damaged numbers in a snapshot
refused by name (part 5), exact CSV rows for small
hand-made snapshots (PyTorch 2.1+ and 2.0 formats), the sixteen workloads
shipped in traces/ against the peaks their README lists, and, when the
recorded PyTorch snapshots are in TRACES_DIR (shared/traces), their import
against the same peaks and, byte for byte, against the shipped CSVs.

Usage: test_import_torch.py TOOL TRACES_DIR [SHIPPED_DIR]
Exit 0 when every part passed, 1 when one failed, 77 when every part was
skipped (only the shared traces part can be).
"""

import collections
import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

TOOL = None
TRACES = None
SHIPPED = None
FAILS = []
HEADER = "Thread,Time,Action,Pointer,Size,Stream,Block,Id,Count,Status"
MIB = 1 << 20
GIB = float(1 << 30)

# From shared/traces/README.md (and traces/README.md): events, peak allocated
# (requested, incl. pre-live), PyTorch peak reserved, both in GiB; then the
# rows of the converted CSV (traces/README.md).
SHARED = [
    ("cnn_latent_eor.pickle", 5803, 0.10, 0.12, 3900),
    ("opt125m_zo_finetune.pickle", 23105, 1.66, 1.77, 15556),
    ("transformer_ctx128_forward.pickle", 8227, 16.39, 16.65, 6084),
    ("transformer_ctx512_forward_mixed.pickle", 6765, 37.12, 37.73, 5677),
    ("llama_finetune_notebook.pickle", 10307, 5.47, 6.03, 7605),
    # The eleven added later (shared/traces/README.md, second table).
    ("wedsonlin_medium_ctx512_train.pickle", 22332, 11.57, 11.79, 15627),
    ("nothanmin_large_ctx256_train.pickle", 19464, 21.26, 22.21, 14290),
    ("silmont_small_ctx128_fwd_bf16.pickle", 2811, 0.73, 0.80, 2012),
    ("charan_small_ctx512.pickle", 9670, 0.71, 0.87, 6564),
    ("rishabh_lm_init_plus_inference.pickle", 12684, 9.89, 10.21, 8613),
    ("niu_tiny_ctx200_train_bf16.pickle", 12976, 0.91, 1.12, 8734),
    ("sidsoc12_2p7b_ctx128_fp32_train.pickle", 27358, 51.32, 62.46, 19471),
    ("kkaitlyn_2p7b_forward.pickle", 8694, 31.57, 48.29, 7516),
    ("bolongcheng_2p7b_ctx2048_fwd_expandable.pickle", 5112, 21.17, 21.25, 3703),
    ("select_n_1f2f548_bert_validate.pickle", 4496, 2.24, 2.59, 3400),
    ("octree_nca_peso_wsi_inference.pickle", 2375, 17.23, 22.69, 1674),
]


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("  FAIL: " + what)
    return cond


def run(args, cwd=None):
    p = subprocess.run([sys.executable, TOOL] + args, cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def write_pickle(path, obj_or_bytes):
    data = obj_or_bytes if isinstance(obj_or_bytes, bytes) else pickle.dumps(obj_or_bytes)
    with open(path, "wb") as f:
        f.write(data)
    return path


def read_rows(path):
    with open(path) as f:
        lines = f.read().splitlines()
    check(lines and lines[0] == HEADER, "%s: header is %r" % (path, lines[:1]))
    return lines[1:]


class Evil:
    """pickle.dumps of this calls os.system when loaded by a plain unpickler."""

    def __reduce__(self):
        return (os.system, ("echo PWNED > marker",))


def refusal_message(path, glob):
    return ("gma-import-torch: refusing %s: the pickle names the global '%s'; snapshots are "
            "plain dicts and lists, so this file is not a memory snapshot (or is malicious)"
            % (path, glob))


def part_refusal(tmp):
    print("part 1: pickles that name globals are refused, bad inputs give one clear line")
    d = os.path.join(tmp, "refuse")
    os.mkdir(d)
    evil_cases = [
        # Protocol 0 by hand: GLOBAL 'os system', MARK, STRING, TUPLE, REDUCE, STOP.
        ("handmade.pickle", b"cos\nsystem\n(S'echo PWNED > marker'\ntR.", "os.system"),
        # What pickle.dumps writes for os.system (its module is posix on Linux).
        ("reduce.pickle", pickle.dumps(Evil(), protocol=2), os.system.__module__ + ".system"),
        # The same through STACK_GLOBAL (protocol 4).
        ("reduce4.pickle", pickle.dumps(Evil(), protocol=4), os.system.__module__ + ".system"),
        # A harmless-looking global is refused too: every global is.
        ("ordereddict.pickle", pickle.dumps(collections.OrderedDict(a=1), protocol=4),
         "collections.OrderedDict"),
        # Deep inside an otherwise valid snapshot.
        ("nested.pickle", pickle.dumps({"segments": [], "device_traces": [[
            {"action": "alloc", "addr": 16, "size": 1, "stream": 0,
             "frames": [collections.OrderedDict(name="f")]}]]}), "collections.OrderedDict"),
    ]
    for name, data, glob in evil_cases:
        path = write_pickle(os.path.join(d, name), data)
        rc, out, err = run([path, "-o", os.path.join(d, name + ".csv")], cwd=d)
        check(rc == 2, "%s: exit %d, want 2" % (name, rc))
        check(err == refusal_message(path, glob) + "\n", "%s: stderr %r" % (name, err))
        check(out == "", "%s: stdout %r" % (name, out))
        check(not os.path.exists(os.path.join(d, "marker")), "%s: the marker was created" % name)
        check(not os.path.exists(os.path.join(d, name + ".csv")), "%s: wrote a CSV" % name)

    # A persistent id is another way to hand the unpickler an object: refused.
    path = write_pickle(os.path.join(d, "persid.pickle"), b"Pfoo\n.")
    rc, out, err = run([path], cwd=d)
    check(rc == 2 and err.startswith("gma-import-torch: refusing ") and "persistent id" in err,
          "persistent id: exit %d, stderr %r" % (rc, err))

    good = pickle.dumps({"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 4096, "size": 100, "stream": 0, "time_us": 5}]]})
    damaged = bytearray(good)
    damaged[good.index(b"alloc"):good.index(b"alloc") + 5] = b"\xff" * 5
    seg20 = {"device": 0, "address": 0x100000, "total_size": 1024, "stream": 0}
    bad_inputs = [
        # Not a pickle: each says what it looks like.
        ("text.pickle", b"Thread,Time,Action\nthis is not a pickle\n",
         "text.pickle is not a pickle: it looks like a gma trace CSV (first line "
         "'Thread,Time,Action'): it is already converted; replay it with tools/gma-replay"),
        ("csv.pickle", b"a,b,c\n1,2,3\n",
         "is not a pickle: it looks like a CSV file (first line 'a,b,c')"),
        ("json.pickle", b'{"segments": [], "device_traces": []}\n',
         "is not a pickle: it looks like JSON (first line '{\"segments\": []"),
        ("html.pickle", b"<!DOCTYPE html>\n<html><body>GitHub</body></html>\n",
         "is not a pickle: it looks like HTML or XML"),
        ("prose.pickle", b"hello, this is a note\nsecond line\n",
         "is not a pickle: it looks like a text file (first line 'hello, this is a note')"),
        ("words.pickle", b"just some words\n", "is not a pickle: it looks like a text file "
         "(first line 'just some words')"),
        ("gz.pickle", gzip.compress(good), "is not a pickle: it is gzip-compressed data"),
        ("zip.pickle", b"PK\x03\x04" + bytes(40), "is not a pickle: it is a zip archive "
         "(torch.save writes these"),
        ("binary.pickle", bytes(range(1, 40)), "is not a pickle: it is binary data without a "
         "pickle header (first bytes 01 02 03"),
        ("empty.pickle", b"", "empty.pickle is empty (0 bytes), not a pickle"),
        # A pickle, cut short or damaged.
        ("truncated.pickle", good[:len(good) // 2],
         "truncated.pickle is a truncated pickle: it starts as one (protocol %d) but its "
         "%d bytes end before the data does" % (good[1], len(good) // 2)),
        ("truncated2.pickle", good[:3], "is a truncated pickle"),
        ("truncated0.pickle", pickle.dumps({"a": 1}, protocol=0)[:-3],
         "is a truncated pickle: it starts as an old text pickle (protocol 0 or 1)"),
        ("damaged.pickle", bytes(damaged), "is a damaged pickle: it starts as one (protocol"),
        # Pickles, but of something it cannot read.
        ("list.pickle", pickle.dumps([1, 2, 3]), "not a memory snapshot"),
        ("segments.pickle", pickle.dumps([dict(seg20, blocks=[{"size": 1024,
                                                               "state": "inactive"}])]),
         "is a list of segments (what torch.cuda.memory_snapshot() returns, and PyTorch "
         "1.x's snapshot format) with no allocation history"),
        ("noaddress.pickle", pickle.dumps({"device_traces": [[]], "segments": [
            {"device": 0, "total_size": 1024, "blocks": [{"size": 1024, "state": "inactive"}]}]}),
         "segment 0's blocks have no 'address' and neither has the segment: an unsupported "
         "snapshot format (PyTorch 2.0 gives the segment's address, PyTorch 2.1 and later "
         "every block's)"),
        ("mixedblocks.pickle", pickle.dumps({"device_traces": [[]], "segments": [dict(
            seg20, blocks=[{"size": 512, "state": "inactive", "address": 0x100000},
                           {"size": 512, "state": "inactive"}])]}),
         "segment 0 has 1 blocks with an 'address' and 1 without"),
        ("mixedsegs.pickle", pickle.dumps({"device_traces": [[]], "segments": [
            dict(seg20, blocks=[{"size": 1024, "state": "inactive", "address": 0x100000}]),
            dict(seg20, address=0x200000, blocks=[{"size": 1024, "state": "inactive"}])]}),
         "mixes segments whose blocks carry their address (PyTorch 2.1 and later) with "
         "segments whose blocks do not (PyTorch 2.0)"),
        ("overrun.pickle", pickle.dumps({"device_traces": [[]], "segments": [dict(
            seg20, blocks=[{"size": 1024, "state": "inactive"},
                           {"size": 512, "state": "inactive"}])]}),
         "its blocks add up to 1536 bytes, more than its total_size 1024"),
        ("nosize.pickle", pickle.dumps({"device_traces": [[]], "segments": [dict(
            seg20, blocks=[{"state": "inactive", "address": 0x100000}])]}),
         "segment 0 has a block without an integer 'size'"),
        ("notrace.pickle", pickle.dumps({"segments": []}), "has no 'device_traces'"),
        ("noaddr.pickle", pickle.dumps({"segments": [], "device_traces": [[
            {"action": "alloc", "size": 1, "stream": 0}]]}), "has no 'addr' field"),
        ("badseg.pickle", pickle.dumps({"segments": [{"device": 0}], "device_traces": [[]]}),
         "no integer 'total_size'"),
        ("nothing.pickle", pickle.dumps({"segments": [], "device_traces": [[], []]}),
         "nothing to write"),
    ]
    for name, data, want in bad_inputs:
        path = write_pickle(os.path.join(d, name), data)
        rc, out, err = run([path, "-o", os.path.join(d, "bad.csv")], cwd=d)
        check(rc == 2, "%s: exit %d, want 2" % (name, rc))
        check(err.startswith("gma-import-torch: ") and err.count("\n") == 1
              and "Traceback" not in err and want in err,
              "%s: stderr %r, want it to contain %r" % (name, err, want))
    rc, out, err = run([os.path.join(d, "missing.pickle")], cwd=d)
    check(rc == 2 and "cannot read" in err and err.count("\n") == 1,
          "missing file: exit %d, stderr %r" % (rc, err))
    path = write_pickle(os.path.join(d, "ok.pickle"), good)
    rc, out, err = run([path, "-o", os.path.join(d, "no", "such", "dir.csv")], cwd=d)
    check(rc == 1 and "cannot write" in err and "Traceback" not in err,
          "unwritable output: exit %d, stderr %r" % (rc, err))
    rc, out, err = run([path, "-o", path], cwd=d)
    check(rc == 2 and "is the input" in err, "output = input: exit %d, stderr %r" % (rc, err))
    return True


def seg(device, address, total, blocks, stream=0):
    return {"device": device, "address": address, "total_size": total, "stream": stream,
            "is_expandable": False, "blocks": blocks}


def blk(address, size, state, requested=None):
    b = {"address": address, "size": size, "state": state}
    if requested is not None:
        b["requested_size"] = requested
    return b


def ev(action, addr, size, t=None, stream=0, **extra):
    e = {"action": action, "size": size, "stream": stream, "frames": []}
    if addr is not None:
        e["addr"] = addr
    if t is not None:
        e["time_us"] = t
    e.update(extra)
    return e


def convert(path, out, extra=()):
    js = out + ".json"
    rc, so, se = run([path, "-o", out, "--json", js] + list(extra))
    if not check(rc == 0, "%s: exit %d, stderr %r" % (path, rc, se)):
        return None, so
    with open(js) as f:
        return json.load(f), so


def expect_rows(path, want):
    got = read_rows(path)
    if got != want:
        check(False, "%s: rows differ" % path)
        for i in range(max(len(got), len(want))):
            g = got[i] if i < len(got) else "<none>"
            w = want[i] if i < len(want) else "<none>"
            print("    %s got  %s\n    %s want %s" % ("!" if g != w else " ", g, " ", w))


def part_small(tmp):
    print("part 2: hand-made snapshots, exact rows")
    d = os.path.join(tmp, "small")
    os.mkdir(d)

    # One device. Segment 0x1000000 (2 MiB, stream 0x5) predates the trace and
    # holds a block live at dump that the trace never names (seeded with its
    # requested_size), one the trace allocates, an inactive one, and an
    # active_pending_free one without requested_size (seeded with its size).
    # Segment 0x2000000 is reserved in the trace. Segment 0x3000000 (4 MiB)
    # predates the trace and is freed in it, after the trace frees 0x3000000
    # without having allocated it (seeded with the free's size).
    # reserved at start = (2 + 1) MiB at dump - 1 MiB reserved + 4 MiB freed = 6 MiB.
    snap = {
        "segments": [
            seg(0, 0x1000000, 2 * MIB, [
                blk(0x1000000, 1024, "active_allocated", 1000),
                blk(0x1000400, 512, "active_allocated", 500),
                blk(0x1000600, 512, "inactive", 0),
                blk(0x1000800, 512, "active_pending_free"),
                blk(0x1000a00, 2 * MIB - 0xa00, "inactive", 0),
            ], stream=0x5),
            seg(0, 0x2000000, 1 * MIB, [blk(0x2000000, 1 * MIB, "inactive", 0)]),
        ],
        "device_traces": [[
            ev("alloc", 0x1000400, 500, 1000000, stream=0x5),
            ev("free_requested", 0x3000000, 300, 1000010),
            ev("free_completed", 0x3000000, 300, 1000010),
            ev("segment_free", 0x3000000, 4 * MIB, 1000020),
            ev("segment_alloc", 0x2000000, 1 * MIB, 1000500, stream=0x7f00),
            ev("alloc", 0x2000000, 700, 1000500, stream=0x7f00),
            ev("snapshot", 0, 0, 1000600),
            ev("oom", None, 5000000, 1000700, device_free=100),
            ev("free_requested", 0x2000000, 700, 1001000, stream=0x7f00),
            ev("free_completed", 0x2000000, 700, 1001000, stream=0x7f00),
            ev("user_defined", 0, 0, 1001000),
        ]],
    }
    path = write_pickle(os.path.join(d, "one.pickle"), snap)
    out = os.path.join(d, "one.csv")
    s, stdout = convert(path, out)
    if s:
        expect_rows(out, [
            "0,0.000000000,segment_alloc,0x0,6291456,0x0,0,0,0,",
            "0,0.000000000,allocate,0x3000000,300,0x0,0,0,0,",
            "0,0.000000000,allocate,0x1000000,1000,0x5,0,0,0,",
            "0,0.000000000,allocate,0x1000800,512,0x5,0,0,0,",
            "0,0.000000000,allocate,0x1000400,500,0x5,0,0,0,",
            "0,0.000010000,free,0x3000000,300,0x0,0,0,0,",
            "0,0.000020000,segment_free,0x3000000,4194304,0x0,0,0,0,",
            "0,0.000500000,segment_alloc,0x2000000,1048576,0x7f00,0,0,0,",
            "0,0.000500000,allocate,0x2000000,700,0x7f00,0,0,0,",
            "0,0.000700000,oom,0x0,5000000,0x0,0,0,0,",
            "0,0.001000000,free,0x2000000,700,0x7f00,0,0,0,",
        ])
        dev = s["devices"][0]
        want = {"device": 0, "output": out, "seeded_allocations": 3, "seeded_bytes": 1812,
                "seeded_freed_in_trace": 1, "seeded_live_at_dump": 2,
                "reserved_at_start_bytes": 6 * MIB, "peak_allocated_bytes": 2712,
                "peak_reserved_bytes": 6 * MIB, "events_total": 11, "rows_total": 11,
                "ignored_actions": {"user_defined": 1}, "time_source": "time_us",
                "inconsistencies": {},
                "events_read": {"alloc": 2, "free_requested": 2, "free_completed": 2,
                                "segment_alloc": 1, "segment_free": 1, "snapshot": 1,
                                "oom": 1, "user_defined": 1},
                "rows_written": {"segment_alloc": 2, "allocate": 5, "free": 2,
                                 "segment_free": 1, "oom": 1}}
        for k, v in want.items():
            check(dev.get(k) == v, "one: summary %s is %r, want %r" % (k, dev.get(k), v))
        check(len(s["devices"]) == 1, "one: %d devices in the JSON" % len(s["devices"]))
        check(dev.get("snapshot_format", "").startswith("PyTorch 2.1 or later"),
              "one: snapshot_format %r" % dev.get("snapshot_format"))
        for line in ("peak allocated          0.00 GiB", "PyTorch peak reserved   0.01 GiB",
                     "ignored         user_defined 1"):
            check(line in stdout, "one: summary lacks %r:\n%s" % (line, stdout))

    # PyTorch 2.0 format: blocks have no address; each one's is the segment's
    # plus the sizes of the blocks before it (they tile the segment in address
    # order). Requested sizes come from requested_size, else the newest
    # history entry's real_size, else the block's size. 2.0 traces have no
    # time_us (Time is left empty) and an oom event carries
    # device_free instead of addr. Segment 0x5000000 (2 MiB): an allocated
    # block with history (seeded, 1000), a free one the trace allocates at its
    # derived address 0x5000400, one pending free without history (seeded,
    # 512), the rest free. Segment 0x6000000 (1 MiB): an allocated block with
    # requested_size (seeded, 4000). Reserved at start: 3 MiB.
    def blk20(size, state, real=None, requested=None):
        b = {"size": size, "state": state}
        if real is not None:
            b["history"] = [{"addr": 0, "real_size": real, "frames": []},
                            {"addr": 0, "real_size": 1, "frames": []}]
        if requested is not None:
            b["requested_size"] = requested
        return b
    snap = {"segments": [
                {"device": 0, "address": 0x5000000, "total_size": 2 * MIB, "stream": 0,
                 "segment_type": "large", "allocated_size": 1024, "active_size": 1536,
                 "blocks": [blk20(1024, "active_allocated", real=1000),
                            blk20(512, "inactive"),
                            blk20(512, "active_pending_free"),
                            blk20(2 * MIB - 2048, "inactive")]},
                {"device": 0, "address": 0x6000000, "total_size": 1 * MIB, "stream": 0,
                 "segment_type": "large", "allocated_size": 4096, "active_size": 4096,
                 "blocks": [blk20(4096, "active_allocated", requested=4000),
                            blk20(1 * MIB - 4096, "inactive")]}],
            "device_traces": [[
                ev("alloc", 0x5000400, 100),
                ev("free_requested", 0x5000400, 100),
                ev("free_completed", 0x5000400, 100),
                ev("oom", None, 5000000, device_free=100),
            ]]}
    path = write_pickle(os.path.join(d, "torch20.pickle"), pickle.dumps(snap, protocol=2))
    out = os.path.join(d, "torch20.csv")
    s, stdout = convert(path, out)
    if s:
        expect_rows(out, [
            "0,,segment_alloc,0x0,3145728,0x0,0,0,0,",
            "0,,allocate,0x5000000,1000,0x0,0,0,0,",
            "0,,allocate,0x5000600,512,0x0,0,0,0,",
            "0,,allocate,0x6000000,4000,0x0,0,0,0,",
            "0,,allocate,0x5000400,100,0x0,0,0,0,",
            "0,,free,0x5000400,100,0x0,0,0,0,",
            "0,,oom,0x0,5000000,0x0,0,0,0,",
        ])
        dev = s["devices"][0]
        check(dev["snapshot_format"].startswith("PyTorch 2.0 (block addresses derived"),
              "torch20: snapshot_format %r" % dev["snapshot_format"])
        check(dev["seeded_live_at_dump"] == 3 and dev["seeded_bytes"] == 5512
              and dev["reserved_at_start_bytes"] == 3 * MIB and not dev["inconsistencies"],
              "torch20: summary %r" % dev)
        check("format          PyTorch 2.0" in stdout, "torch20: summary lacks the format:\n"
              + stdout)

    # Older format: no time_us, so the trace has no times: Time is empty.
    snap = {"segments": [seg(0, 0x10000, 2 * MIB, [blk(0x10000, 2 * MIB, "inactive", 0)])],
            "device_traces": [[
                ev("segment_alloc", 0x10000, 2 * MIB),
                ev("alloc", 0x10000, 4000),
                ev("alloc", 0x11000, 100),
                ev("free_requested", 0x10000, 4000),
                ev("free_completed", 0x10000, 4000),
                ev("free_requested", 0x11000, 100),
                ev("oom", 0, 3 * MIB, device_free=0),
            ]]}
    path = write_pickle(os.path.join(d, "old.pickle"), snap)
    out = os.path.join(d, "old.csv")
    s, _ = convert(path, out, ["--quiet"])
    if s:
        expect_rows(out, [
            "0,,segment_alloc,0x10000,2097152,0x0,0,0,0,",
            "0,,allocate,0x10000,4000,0x0,0,0,0,",
            "0,,allocate,0x11000,100,0x0,0,0,0,",
            "0,,free,0x10000,4000,0x0,0,0,0,",
            "0,,free,0x11000,100,0x0,0,0,0,",
            "0,,oom,0x0,3145728,0x0,0,0,0,",
        ])
        dev = s["devices"][0]
        check(dev["time_source"] == "none (no time_us; Time left empty)",
              "old: time_source %r" % dev["time_source"])
        check(dev["reserved_at_start_bytes"] == 0 and dev["peak_reserved_bytes"] == 2 * MIB
              and dev["peak_allocated_bytes"] == 4100 and dev["seeded_allocations"] == 0,
              "old: summary %r" % dev)

    # Expandable segments: segment_map / segment_unmap rows keep their names
    # and count in the reserved offset: 8 MiB mapped at dump - 4 MiB mapped
    # in the trace + 2 MiB unmapped in it = 6 MiB at the start.
    snap = {"segments": [dict(seg(0, 0x40000000, 8 * MIB, [
                blk(0x40000000, 8 * MIB, "inactive", 0)]), is_expandable=True)],
            "device_traces": [[
                ev("segment_map", 0x40600000, 4 * MIB, 10),
                ev("segment_unmap", 0x40000000, 2 * MIB, 20),
            ]]}
    path = write_pickle(os.path.join(d, "expandable.pickle"), snap)
    out = os.path.join(d, "expandable.csv")
    s, _ = convert(path, out, ["--quiet"])
    if s:
        expect_rows(out, [
            "0,0.000000000,segment_alloc,0x0,6291456,0x0,0,0,0,",
            "0,0.000000000,segment_map,0x40600000,4194304,0x0,0,0,0,",
            "0,0.000010000,segment_unmap,0x40000000,2097152,0x0,0,0,0,",
        ])
        check(s["devices"][0]["peak_reserved_bytes"] == 10 * MIB,
              "expandable: peak reserved %r" % s["devices"][0]["peak_reserved_bytes"])

    # Devices: 0 has events, 1 only memory live at dump (a file of seeded
    # rows), 2 nothing (no file). Several files: .devN before the extension.
    snap = {"segments": [
                seg(0, 0xa000000, 2 * MIB, [blk(0xa000000, 2 * MIB, "inactive", 0)]),
                seg(1, 0xb000000, 2 * MIB, [blk(0xb000000, 4096, "active_allocated", 4000),
                                            blk(0xb001000, 2 * MIB - 4096, "inactive", 0)])],
            "device_traces": [
                [ev("alloc", 0xa000000, 64, 7), ev("free_requested", 0xa000000, 64, 9)],
                [], []]}
    path = write_pickle(os.path.join(d, "multi.pickle"), snap)
    out = os.path.join(d, "multi.csv")
    s, _ = convert(path, out, ["--quiet"])
    if s:
        check(not os.path.exists(out), "multi: wrote %s too" % out)
        check(not os.path.exists(os.path.join(d, "multi.dev2.csv")), "multi: wrote a dev2 file")
        check([x["device"] for x in s["devices"]] == [0, 1], "multi: devices %r" % s["devices"])
        expect_rows(os.path.join(d, "multi.dev0.csv"), [
            "0,0.000000000,segment_alloc,0x0,2097152,0x0,0,0,0,",
            "0,0.000000000,allocate,0xa000000,64,0x0,0,0,0,",
            "0,0.000002000,free,0xa000000,64,0x0,0,0,0,",
        ])
        expect_rows(os.path.join(d, "multi.dev1.csv"), [
            "0,0.000000000,segment_alloc,0x0,2097152,0x0,0,0,0,",
            "0,0.000000000,allocate,0xb000000,4000,0x0,0,0,0,",
        ])

    # Default output name; --quiet prints nothing; a snapshot that contradicts
    # itself (a double free, an alloc of a live pointer) still gives rows a
    # replayer can follow, and the summary counts what was repaired.
    snap = {"segments": [], "device_traces": [[
        ev("alloc", 0x100, 10, 0), ev("alloc", 0x100, 20, 1),
        ev("free_requested", 0x100, 20, 2), ev("free_requested", 0x100, 20, 3)]]}
    path = write_pickle(os.path.join(d, "bad.pickle"), snap)
    rc, so, se = run([path, "--quiet"])
    check(rc == 0 and so == "", "default name: exit %d, stdout %r, stderr %r" % (rc, so, se))
    out = os.path.join(d, "bad.csv")
    if check(os.path.exists(out), "default name: no %s" % out):
        expect_rows(out, [
            "0,0.000000000,allocate,0x100,10,0x0,0,0,0,",
            "0,0.000001000,free,0x100,10,0x0,0,0,0,",
            "0,0.000001000,allocate,0x100,20,0x0,0,0,0,",
            "0,0.000002000,free,0x100,20,0x0,0,0,0,",
        ])
    s, _ = convert(path, os.path.join(d, "bad2.csv"), ["--quiet"])
    if s:
        check(s["devices"][0]["inconsistencies"] == {"alloc_of_live_pointer": 1,
                                                     "free_of_dead_pointer": 1},
              "bad: inconsistencies %r" % s["devices"][0]["inconsistencies"])

    rc, so, _ = run(["--help"])
    check(rc == 0 and "0x0" in so and "segment_alloc" in so and "free_completed" in so,
          "--help: exit %d" % rc)
    with open(TOOL) as f:
        check(f.readline() == "#!/usr/bin/env python3\n", "the tool's first line is not the shebang")
    check(os.access(TOOL, os.X_OK), "the tool is not executable")
    return True


def part_damaged(tmp):
    """Damaged numbers in a snapshot: every numeric field the importer reads
    (an event's addr, size, stream and time_us; a segment's device,
    total_size, address and stream; a block's address, size, requested_size
    and history real_size) refused when it is NaN, infinite, negative, a
    float, a bool, a string, above 2^64-1 or above what gma-replay takes (a
    segment row's 2^63-1), and so are sums gma-replay would refuse: exit 2,
    one line naming the event (index, action) or segment and block, and the
    field and its value; no traceback, no CSV."""
    print("part 5: damaged numbers are refused by name (exit 2), never converted")
    d = os.path.join(tmp, "damaged")
    os.mkdir(d)
    nan, inf = float("nan"), float("inf")
    u64 = "an integer from 0 to 2^64-1"
    i63 = "an integer from 0 to 2^63-1"
    good = ev("alloc", 0x1000, 4096, 10)

    def one(e):  # a good event, then e (event 1)
        return {"segments": [], "device_traces": [[good, e]]}
    seg_ok = seg(0, 0x100000, 2 * MIB, [blk(0x100000, 2 * MIB, "inactive", 0)])

    def segs(*ss):  # the segments, and one good event so the device has rows
        return {"segments": list(ss), "device_traces": [[good]]}
    cases = [
        # time_us: NaN gave a traceback (exit 1); inf too; a bool or a string
        # was taken as "missing" without a word.
        ("time_nan", one(ev("alloc", 0x2000, 64, nan)),
         "device 0 event 1 (alloc): 'time_us' is nan (NaN), not a finite number of "
         "microseconds from -2^63 to 2^63-1"),
        ("time_inf", one(ev("free_requested", 0x1000, 4096, -inf)),
         "device 0 event 1 (free_requested): 'time_us' is -inf (infinite)"),
        ("time_huge", one(ev("alloc", 0x2000, 64, 1e300)),
         "device 0 event 1 (alloc): 'time_us' is 1e+300 (above 2^63-1)"),
        ("time_bool", one(ev("alloc", 0x2000, 64, True)),
         "device 0 event 1 (alloc): 'time_us' is True (a bool)"),
        ("time_str", one(ev("alloc", 0x2000, 64, "20")),
         "device 0 event 1 (alloc): 'time_us' is '20' (a str)"),
        # size: negative converted silently (as 2^64 - n in the replay),
        # 2^80 was written and refused only by gma-replay.
        ("size_negative", one(ev("alloc", 0x2000, -4096, 20)),
         "device 0 event 1 (alloc): 'size' is -4096 (negative), not " + u64),
        ("size_2p80", one(ev("alloc", 0x2000, 2**80, 20)),
         "device 0 event 1 (alloc): 'size' is %d (above 2^64-1), not %s" % (2**80, u64)),
        ("size_2p64", one(ev("alloc", 0x2000, 2**64, 20)), "'size' is %d (above 2^64-1)" % 2**64),
        ("size_float", one(ev("alloc", 0x2000, 4096.0, 20)),
         "device 0 event 1 (alloc): 'size' is 4096.0 (a float), not " + u64),
        ("size_half", one(ev("alloc", 0x2000, 4096.5, 20)), "'size' is 4096.5 (a float)"),
        ("size_nan", one(ev("alloc", 0x2000, nan, 20)), "'size' is nan (NaN)"),
        ("size_bool", one(ev("alloc", 0x2000, True, 20)), "'size' is True (a bool)"),
        ("size_str", one(ev("alloc", 0x2000, "4096", 20)), "'size' is '4096' (a str)"),
        ("free_size_negative", one(ev("free_requested", 0x9000, -1, 20)),
         "device 0 event 1 (free_requested): 'size' is -1 (negative)"),
        ("oom_size_negative", one(ev("oom", None, -5, 20)),
         "device 0 event 1 (oom): 'size' is -5 (negative)"),
        ("segment_size_2p63", one(ev("segment_alloc", 0x200000, 2**63, 20)),
         "device 0 event 1 (segment_alloc): 'size' is %d (above 2^63-1), not %s" % (2**63, i63)),
        ("segment_size_negative", one(ev("segment_unmap", 0x200000, -2 * MIB, 20)),
         "device 0 event 1 (segment_unmap): 'size' is -2097152 (negative)"),
        # addr: negative was masked to 2^64 - n; above 2^64-1 to its low bits.
        ("addr_negative", one(ev("alloc", -16, 64, 20)),
         "device 0 event 1 (alloc): 'addr' is -16 (negative), not " + u64),
        ("addr_2p64", one(ev("free_requested", 2**64 + 0x1000, 4096, 20)),
         "device 0 event 1 (free_requested): 'addr' is %d (above 2^64-1)" % (2**64 + 0x1000)),
        ("addr_float", one(ev("segment_free", 4096.0, 2 * MIB, 20)),
         "device 0 event 1 (segment_free): 'addr' is 4096.0 (a float)"),
        # stream: a bool was stream 1, a string stream 0, a negative one masked.
        ("stream_negative", one(ev("alloc", 0x2000, 64, 20, stream=-1)),
         "device 0 event 1 (alloc): 'stream' is -1 (negative), not " + u64),
        ("stream_bool", one(ev("alloc", 0x2000, 64, 20, stream=True)), "'stream' is True (a bool)"),
        ("stream_str", one(ev("alloc", 0x2000, 64, 20, stream="0x7f")),
         "'stream' is '0x7f' (a str)"),
        ("stream_2p64", one(ev("oom", None, 64, 20, stream=2**64)),
         "device 0 event 1 (oom): 'stream' is %d (above 2^64-1)" % 2**64),
        # An action that is not a string gave a traceback (unhashable) or a
        # summary keyed by a number.
        ("action_list", one({"action": ["alloc"], "addr": 0x2000, "size": 64}),
         "device 0 event 1: 'action' is ['alloc'] (a list), not a string"),
        ("action_int", one({"action": 7}),
         "device 0 event 1: 'action' is 7 (an int), not a string"),
        # Sums gma-replay refuses: live bytes past 2^64-1, PyTorch's reserved
        # bytes past 2^63-1 (a segment row's limit), at start or on the way.
        ("live_sum", one(ev("alloc", 0x2000, 2**64 - 4096, 20)),
         "device 0 event 1 (alloc): the live bytes pass 2^64-1 here (size %d)" % (2**64 - 4096)),
        ("reserved_sum", {"segments": [], "device_traces": [[
            ev("segment_alloc", 0x100000, 2**63 - 1, 10), ev("segment_map", 0x200000, 1, 20)]]},
         "device 0 event 1 (segment_map): PyTorch's reserved bytes pass 2^63-1 here (size 1)"),
        # Segments.
        ("seg_total_negative", segs(dict(seg_ok, total_size=-1)),
         "segment 0: 'total_size' is -1 (negative), not " + i63),
        ("seg_total_2p63", segs(dict(seg_ok, total_size=2**63)),
         "segment 0: 'total_size' is %d (above 2^63-1)" % 2**63),
        ("seg_total_nan", segs(dict(seg_ok, total_size=nan)),
         "segment 0: 'total_size' is nan (NaN)"),
        ("seg_device_negative", segs(dict(seg_ok, device=-1)),
         "segment 0: 'device' is -1 (negative), not an integer from 0 to 2^31-1"),
        ("seg_stream_negative", segs(seg(0, 0x100000, 2 * MIB, [
            blk(0x100000, 4096, "active_allocated", 4000),
            blk(0x101000, 2 * MIB - 4096, "inactive", 0)], stream=-7)),
         "segment 0: 'stream' is -7 (negative), not " + u64),
        ("reserved_at_start", segs(dict(seg_ok, total_size=2**62),
                                   dict(seg_ok, address=0x400000, total_size=2**62)),
         "PyTorch's reserved bytes at the start of the trace (%d) pass 2^63-1" % 2**63),
        ("blk_size_negative", segs(seg(0, 0x100000, 2 * MIB, [blk(0x100000, -512, "inactive", 0)])),
         "segment 0 block 0: 'size' is -512 (negative), not " + u64),
        ("blk_address_2p64", segs(seg(0, 0x100000, 2 * MIB, [
            blk(0x100000, 1 * MIB, "inactive", 0), blk(2**64, 1 * MIB, "active_allocated", 5)])),
         "segment 0 block 1: 'address' is %d (above 2^64-1)" % 2**64),
        ("blk_requested_negative", segs(seg(0, 0x100000, 2 * MIB, [
            blk(0x100000, 2 * MIB, "active_allocated", -100)])),
         "segment 0 block 0: 'requested_size' is -100 (negative)"),
        ("blk_requested_str", segs(seg(0, 0x100000, 2 * MIB, [
            blk(0x100000, 2 * MIB, "active_allocated", "100")])),
         "segment 0 block 0: 'requested_size' is '100' (a str)"),
        # PyTorch 2.0 format: the segment's address and the history's real_size.
        ("seg20_address_negative", segs({"device": 0, "address": -4096, "total_size": 2 * MIB,
                                         "blocks": [{"size": 2 * MIB, "state": "inactive"}]}),
         "segment 0: 'address' is -4096 (negative), not " + u64),
        ("seg20_derived_past_2p64", segs({"device": 0, "address": 2**64 - MIB,
                                          "total_size": 2 * MIB, "blocks": [
                                              {"size": MIB, "state": "inactive"},
                                              {"size": MIB, "state": "active_allocated"}]}),
         "segment 0 block 1: its derived address %d (the segment's address plus the sizes of "
         "the blocks before it) passes 2^64-1" % 2**64),
        ("seg20_real_size_float", segs({"device": 0, "address": 0x100000, "total_size": 2 * MIB,
                                        "blocks": [{"size": 2 * MIB, "state": "active_allocated",
                                                    "history": [{"addr": 0, "real_size": 1.5}]}]}),
         "segment 0 block 0: history[0] 'real_size' is 1.5 (a float)"),
    ]
    for name, snap, want in cases:
        path = write_pickle(os.path.join(d, name + ".pickle"), snap)
        out = os.path.join(d, name + ".csv")
        rc, so, err = run([path, "-o", out])
        check(rc == 2, "%s: exit %d, want 2 (stderr %r)" % (name, rc, err))
        check(err.startswith("gma-import-torch: %s: " % path) and err.count("\n") == 1
              and "Traceback" not in err and want in err,
              "%s: stderr %r, want it to contain %r" % (name, err, want))
        check(not os.path.exists(out), "%s: wrote %s" % (name, out))
    # None is "not given" for the optional fields (stream, time_us,
    # requested_size): the event's stream is 0; no time_us, no Time.
    snap = {"segments": [], "device_traces": [[
        ev("alloc", 0x1000, 64, None, stream=None), ev("free_requested", 0x1000, 64, None)]]}
    path = write_pickle(os.path.join(d, "none.pickle"), snap)
    s, _ = convert(path, os.path.join(d, "none.csv"), ["--quiet"])
    if s:
        expect_rows(os.path.join(d, "none.csv"), [
            "0,,allocate,0x1000,64,0x0,0,0,0,",
            "0,,free,0x1000,64,0x0,0,0,0,",
        ])
    # The largest values gma-replay takes still convert: addr 2^64-1, size
    # 2^64-1 (alone), a segment of 2^63-1 bytes, time_us at 2^63-1.
    snap = {"segments": [], "device_traces": [[
        ev("segment_alloc", 0, 2**63 - 1, 0), ev("alloc", 2**64 - 1, 2**64 - 1, 2**63 - 1,
                                                 stream=2**64 - 1)]]}
    path = write_pickle(os.path.join(d, "max.pickle"), snap)
    s, _ = convert(path, os.path.join(d, "max.csv"), ["--quiet"])
    if s:
        expect_rows(os.path.join(d, "max.csv"), [
            "0,0.000000000,segment_alloc,0x0,%d,0x0,0,0,0," % (2**63 - 1),
            "0,%s,allocate,0xffffffffffffffff,%d,0xffffffffffffffff,0,0,0,"
            % ("%d.%09d" % divmod((2**63 - 1) * 1000, 10**9), 2**64 - 1),
        ])
    return True


def csv_peaks(name, rows):
    """Recompute the peaks from the rows and check that they replay: every
    free names a live pointer, no allocate names one, time never decreases
    (Time is on every row, or on none: a trace without times).
    Returns (peak allocated, peak reserved, rows by action)."""
    alloc = peak_alloc = res = peak_res = 0
    live = {}
    last_t = 0.0
    bad = collections.Counter()
    actions = collections.Counter()
    timed = set()  # a trace has a Time on every row or on none
    for row in rows:
        f = row.split(",")
        if len(f) != 10:
            bad["fields"] += 1
            continue
        t, action, ptr, size = (float(f[1]) if f[1] else None), f[2], int(f[3], 16), int(f[4])
        actions[action] += 1
        timed.add(t is not None)
        if t is not None and t < last_t:
            bad["time"] += 1
        last_t = t if t is not None else last_t
        if action == "allocate":
            if ptr in live:
                bad["allocate_live"] += 1
            live[ptr] = size
            alloc += size
            peak_alloc = max(peak_alloc, alloc)
        elif action == "free":
            if ptr not in live:
                bad["free_dead"] += 1
            alloc -= live.pop(ptr, 0)
        elif action in ("segment_alloc", "segment_map"):
            res += size
            peak_res = max(peak_res, res)
        elif action in ("segment_free", "segment_unmap"):
            res -= size
            if res < 0:
                bad["reserved_negative"] += 1
        elif action != "oom":
            bad["action " + action] += 1
    if len(timed) > 1:
        bad["time on some rows only"] += 1
    check(not bad, "%s: CSV problems %r" % (name, dict(bad)))
    return peak_alloc, peak_res, dict(actions)


def verify_csv(name, path, summ):
    """The rows replay, and their peaks and counts are the summary's."""
    peak_alloc, peak_res, actions = csv_peaks(name, read_rows(path))
    check(peak_alloc == summ["peak_allocated_bytes"], "%s: CSV peak allocated %d, summary %d"
          % (name, peak_alloc, summ["peak_allocated_bytes"]))
    check(peak_res == summ["peak_reserved_bytes"], "%s: CSV peak reserved %d, summary %d"
          % (name, peak_res, summ["peak_reserved_bytes"]))
    check(actions == summ["rows_written"], "%s: CSV rows %r, summary %r"
          % (name, actions, summ["rows_written"]))


def shipped_bytes(name):
    """traces/NAME.csv.gz decompressed, or None (a failed check) when missing."""
    path = os.path.join(SHIPPED, name.replace(".pickle", ".csv.gz"))
    if not check(os.path.exists(path), "%s is missing" % path):
        return None
    with gzip.open(path) as f:
        return f.read()


def part_shipped(tmp):
    print("part 3: the workloads shipped in %s, against traces/README.md's figures" % SHIPPED)
    if SHIPPED is None:
        print("  skipped: no SHIPPED_DIR argument")
        return False
    got = sorted(f for f in os.listdir(SHIPPED) if f.endswith(".csv.gz"))
    want = sorted(n.replace(".pickle", ".csv.gz") for n, *_ in SHARED)
    check(got == want, "%s holds %r, want %r" % (SHIPPED, got, want))
    with open(os.path.join(SHIPPED, "README.md")) as f:
        readme = f.read()
    print("  %-40s %6s %16s %16s" % ("file", "rows", "peak alloc GiB", "peak reserved"))
    for name, events, want_alloc, want_res, want_rows in SHARED:
        data = shipped_bytes(name)
        if data is None:
            continue
        lines = data.decode().splitlines()
        check(lines[0] == HEADER, "%s: header %r" % (name, lines[0]))
        peak_alloc, peak_res, actions = csv_peaks(name, lines[1:])
        got_alloc, got_res = peak_alloc / GIB, peak_res / GIB
        print("  %-40s %6d %7.2f (%5.2f) %7.2f (%5.2f)"
              % (name, len(lines) - 1, got_alloc, want_alloc, got_res, want_res))
        check(len(lines) - 1 == want_rows, "%s: %d rows, want %d" % (name, len(lines) - 1, want_rows))
        check(abs(got_alloc - want_alloc) <= 0.01, "%s: peak allocated %.3f GiB, README %.2f"
              % (name, got_alloc, want_alloc))
        check(abs(got_res - want_res) <= 0.01, "%s: PyTorch peak reserved %.3f GiB, README %.2f"
              % (name, got_res, want_res))
        row = "| %s | " % name.replace(".pickle", ".csv.gz")
        check(row in readme and "| {:,} | {:,} | {:.2f} GiB | {:.2f} GiB |".format(
            events, want_rows, want_alloc, want_res) in readme.split(row, 1)[-1].split("\n")[0],
            "traces/README.md's row for %s does not give %d events, %d rows, %.2f and %.2f GiB"
            % (name, events, want_rows, want_alloc, want_res))
    return True


def part_shared(tmp):
    print("part 4: the shared PyTorch traces in %s: their peaks, the shipped CSVs "
          "byte for byte, and the PyTorch 2.0 format" % TRACES)
    if not os.path.isdir(TRACES):
        print("  skipped: %s is not a directory (GMA_TRACES_DIR)" % TRACES)
        return False
    d = os.path.join(tmp, "shared")
    os.mkdir(d)
    print("  %-40s %7s %6s %10s %16s %16s %6s" % ("file", "events", "rows", "seeded GiB",
          "peak alloc GiB", "peak reserved", "sec"))
    for name, events, want_alloc, want_res, _ in SHARED:
        path = os.path.join(TRACES, name)
        if not check(os.path.exists(path), "%s is missing from %s" % (name, TRACES)):
            continue
        out = os.path.join(d, name.replace(".pickle", ".csv"))
        t0 = time.monotonic()
        s, _ = convert(path, out, ["--quiet"])
        secs = time.monotonic() - t0
        if not s:
            continue
        check(len(s["devices"]) == 1, "%s: %d devices" % (name, len(s["devices"])))
        dev = s["devices"][0]
        got_alloc = dev["peak_allocated_bytes"] / GIB
        got_res = dev["peak_reserved_bytes"] / GIB
        print("  %-40s %7d %6d %10.2f %7.2f (%5.2f) %7.2f (%5.2f) %6.2f"
              % (name, dev["events_total"], dev["rows_total"], dev["seeded_bytes"] / GIB,
                 got_alloc, want_alloc, got_res, want_res, secs))
        check(dev["events_total"] == events, "%s: %d events, README says %d"
              % (name, dev["events_total"], events))
        check(abs(got_alloc - want_alloc) <= 0.01, "%s: peak allocated %.3f GiB, README %.2f"
              % (name, got_alloc, want_alloc))
        check(abs(got_res - want_res) <= 0.01, "%s: PyTorch peak reserved %.3f GiB, README %.2f"
              % (name, got_res, want_res))
        check(not dev["inconsistencies"] and not dev["ignored_actions"],
              "%s: inconsistencies %r, ignored %r" % (name, dev["inconsistencies"],
                                                       dev["ignored_actions"]))
        check(secs < 10, "%s: took %.1f s" % (name, secs))
        verify_csv(name, out, dev)
        if SHIPPED is not None:
            with open(out, "rb") as f:
                check(f.read() == shipped_bytes(name),
                      "%s: the import differs from the shipped %s.gz (re-import and "
                      "recompress them: traces/README.md)"
                      % (name, name.replace(".pickle", ".csv")))

    # The same snapshot in PyTorch 2.0's format (no block addresses, requested
    # sizes in history, no time_us in the segments) gives the same rows.
    name = "cnn_latent_eor.pickle"
    path = os.path.join(TRACES, name)
    if os.path.exists(path):
        with open(path, "rb") as f:
            snap = pickle.load(f)  # plain data: the part above refused no global in it
        for sg in snap["segments"]:
            for b in sg["blocks"]:
                del b["address"]
                b["history"] = [{"addr": 0, "real_size": b.pop("requested_size"),
                                 "frames": b.pop("frames", [])}]
        p20 = write_pickle(os.path.join(d, "cnn_torch20.pickle"), pickle.dumps(snap, protocol=2))
        s20, _ = convert(p20, os.path.join(d, "cnn_torch20.csv"), ["--quiet"])
        if s20:
            check(s20["devices"][0]["snapshot_format"].startswith("PyTorch 2.0"),
                  "cnn 2.0: format %r" % s20["devices"][0]["snapshot_format"])
            with open(os.path.join(d, "cnn_torch20.csv"), "rb") as f20, \
                    open(os.path.join(d, "cnn_latent_eor.csv"), "rb") as f21:
                check(f20.read() == f21.read(),
                      "cnn_latent_eor in the PyTorch 2.0 format gives other rows")
    return True


def main():
    global TOOL, TRACES, SHIPPED
    if len(sys.argv) not in (3, 4):
        sys.stderr.write("usage: test_import_torch.py TOOL TRACES_DIR [SHIPPED_DIR]\n")
        return 2
    TOOL, TRACES = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    SHIPPED = os.path.abspath(sys.argv[3]) if len(sys.argv) == 4 else None
    ran = 0
    parts = (part_refusal, part_small, part_shipped, part_shared, part_damaged)
    with tempfile.TemporaryDirectory(prefix="gma-import-test-") as tmp:
        for part in parts:
            ran += 1 if part(tmp) else 0
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        return 1
    if ran == 0:
        print("every part skipped")
        return 77
    print("all passed (%d of %d parts ran)" % (ran, len(parts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
