#!/usr/bin/env python3
"""Tests of the gma-replay command's capacity output: failed allocations in
the per-trace table, the summary and the JSON; the trace's oom rows attempted
and reported ("PyTorch failed N, gma failed M"); --min-capacity's tables and
JSON, on small traces whose answers are known (the same traces as
test_capacity.c, which checks the engine); --repeat N: N repetitions in one
allocator, what a repetition leaves live freed at its end, gma_iteration_mark
after each, the per-repetition figures in the tables and the JSON, and
--min-capacity replaying every repetition; bad rows, files and option values named
in the error (and the exit status 1 or 2), never a silent success: hostile rows
(signs, spaces, empty fields and values past 2^64-1 in the number columns, a
NaN time, async Id 0, a Count past the rows after it, sums that overflow)
refused with the line, action, column and value; pointers and Ids 0 and
2^64-1 replayed like any other; a gzip file and a pickle (a PyTorch snapshot
not yet converted) named as what they are.

Usage: test_replay_cli.py PATH/TO/gma-replay
"""

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

MIB = 1 << 20
HEADER = "Thread,Time,Action,Pointer,Size,Stream,Block,Id,Count,Status\n"
TOOL = None

# Peak live 48 MiB + 1000; the smallest capacity is 50 MiB (see test_capacity.c).
KNOWN = HEADER + "".join(
    "0,0.%06d,%s,%s,%d,0x0,0,0,0,\n" % (i + 1, a, p, s) for i, (a, p, s) in enumerate([
        ("allocate", "0x1000", 1000),
        ("allocate", "0x100000", 16 * MIB),
        ("allocate", "0x2000000", 16 * MIB),
        ("allocate", "0x4000000", 16 * MIB),
        ("free", "0x100000", 16 * MIB),
        ("free", "0x2000000", 16 * MIB),
        ("free", "0x4000000", 16 * MIB),
        ("allocate", "0x6000000", 40 * MIB),
        ("free", "0x6000000", 40 * MIB),
        ("free", "0x1000", 1000),
    ]))

# A 64 MiB request the recording allocator failed between two of 8 MiB.
WITH_OOM = HEADER + "".join(
    "0,0.%06d,%s,%s,%d,0x0,0,0,0,\n" % (i + 1, a, p, s) for i, (a, p, s) in enumerate([
        ("allocate", "0x1000000", 8 * MIB),
        ("oom", "0x0", 64 * MIB),
        ("allocate", "0x2000000", 8 * MIB),
        ("free", "0x1000000", 8 * MIB),
        ("free", "0x2000000", 8 * MIB),
    ]))

# KNOWN with a 1 MiB allocation the trace never frees (weights loaded before
# the loop, say): --repeat frees it at the end of each repetition.
LEAKY = KNOWN + "0,0.000011,allocate,0x9000000,%d,0x0,0,0,0,\n" % MIB

CONF = "trim_interval_ms:3600000"


class ReplayCli(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gma-replay-cli-")
        self.known = os.path.join(self.dir, "known.csv")
        self.leaky = os.path.join(self.dir, "leaky.csv")
        with open(self.leaky, "w") as f:
            f.write(LEAKY)
        self.oom = os.path.join(self.dir, "with_oom.csv")
        with open(self.known, "w") as f:
            f.write(KNOWN)
        with open(self.oom, "w") as f:
            f.write(WITH_OOM)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def replay(self, *args):
        p = subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, GMA_CONF=""))
        self.assertEqual(p.returncode, 0, p.stderr + p.stdout)
        return p.stdout

    def test_failures_in_every_table(self):
        js = os.path.join(self.dir, "r.json")
        out = self.replay("--config", "small=%s,sim_capacity:44M" % CONF, "--config",
                          "big=" + CONF, "--json", js, self.known)
        # The per-trace table: its own row, and the star on the allocated figures.
        row = re.search(r"^  failed allocations\s+(\d+)\s+(\d+)\s*$", out, re.M)
        self.assertIsNotNone(row, out)
        self.assertEqual(row.groups(), ("1", "0"))
        self.assertRegex(out, r"peak requested\s+40\.0 MiB\*\s+48\.0 MiB")
        self.assertIn("leaves out the failed allocations", out)
        # The summary: a failed column, and the star.
        summary = out[out.index("summary"):]
        self.assertRegex(summary, r"\bfailed\b")
        self.assertRegex(summary, r"known\s+small\s+\S+ MiB\*.*\s1\s+-\s+\S+\n")
        self.assertRegex(summary, r"known\s+big\s+\S+ MiB .*\s0\s+-\s+")
        with open(js) as f:
            res = {r["config"]: r["result"] for r in json.load(f)["results"]}
        self.assertEqual(res["small"]["failed_allocs"], 1)
        self.assertTrue(res["small"]["allocated_excludes_failed"])
        self.assertEqual(res["small"]["capacity"], 44 * MIB)
        self.assertEqual(res["small"]["trace_peak_live"], 48 * MIB + 1000)
        self.assertEqual(res["big"]["failed_allocs"], 0)
        # --quiet keeps the failed column.
        quiet = self.replay("--quiet", "--config", "small=%s,sim_capacity:44M" % CONF, self.known)
        self.assertRegex(quiet, r"known\s+small\s+\S+ MiB\*.*\s1\s+-\s+")

    def test_oom_rows(self):
        js = os.path.join(self.dir, "r.json")
        out = self.replay("--recorded-label", "PyTorch", "--config", "roomy=%s,sim_capacity:1G" % CONF,
                          "--config", "tight=%s,sim_capacity:40M" % CONF, "--json", js, self.oom)
        self.assertIn("roomy: PyTorch failed 1 request (oom rows), gma failed 0 of them", out)
        self.assertIn("tight: PyTorch failed 1 request (oom rows), gma failed 1 of them", out)
        self.assertRegex(out, r"with_oom\s+roomy\s.*\s0\s+1/0\s")
        self.assertRegex(out, r"with_oom\s+tight\s.*\s0\s+1/1\s")
        with open(js) as f:
            res = {r["config"]: r["result"] for r in json.load(f)["results"]}
        self.assertEqual((res["roomy"]["recorded_failed"], res["roomy"]["oom_served"],
                          res["roomy"]["oom_failed"], res["roomy"]["failed_allocs"]), (1, 1, 0, 0))
        self.assertEqual((res["tight"]["oom_served"], res["tight"]["oom_failed"],
                          res["tight"]["failed_allocs"]), (0, 1, 0))

    def test_min_capacity(self):
        js = os.path.join(self.dir, "r.json")
        # A sim_capacity in CONF is overridden by the bisection, not an error.
        out = self.replay("--min-capacity", "--config", "default=%s,sim_capacity:44M" % CONF,
                          "--config", "expandable=%s,expandable_segments:true" % CONF,
                          "--json", js, self.known, self.oom)
        self.assertIn("known: smallest simulated capacity with no failed allocation", out)
        self.assertRegex(out, r"(?m)^  default\s+50\.\d MiB\s+-\s+1\.04\dx\s+\S+ MiB\s+\d+ ")
        self.assertIn("smallest simulated capacity with no failed allocation (bisection to 0.2%)", out)
        self.assertIn("at it: recorded failed 1 request (oom rows), gma failed 1", out)
        with open(js) as f:
            caps = json.load(f)["min_capacity"]
        self.assertEqual(len(caps), 4)
        for c in caps:
            s = c["search"]
            floor = 48 * MIB + 1000 if c["trace"] == "known" else 16 * MIB
            want = 50 * MIB if c["trace"] == "known" else 16 * MIB
            self.assertEqual(s["lower_bound_peak_live"], floor)
            self.assertGreaterEqual(s["min_capacity"], want, c)
            self.assertLessEqual(s["min_capacity"], want / 0.998 + 1, c)
            self.assertLessEqual(s["min_capacity"] - s["failing_capacity"],
                                 0.002 * s["min_capacity"])
            self.assertEqual(len(s["steps"]), s["replays"])
            self.assertFalse(s["unstable"])
            self.assertTrue(s["steps"][-1]["confirm"])
        # The time budget: stops at once and says so.
        out = self.replay("--min-capacity", "--budget", "0.000000001", "--quiet", self.known)
        self.assertRegex(out, r"known\s+default\s.*\s+budget")

    def run_json(self, *args):
        js = os.path.join(self.dir, "r.json")
        out = self.replay("--json", js, *args)
        with open(js) as f:
            return out, json.load(f)

    def test_repeat(self):
        _, once = self.run_json("--quiet", "--config", "default=" + CONF, self.leaky)
        out, three = self.run_json("--repeat", "3", "--config", "default=" + CONF, "--config",
                                   "plan=%s,plan:on" % CONF, self.leaky)
        one = once["results"][0]["result"]
        res = {r["config"]: r["result"] for r in three["results"]}
        r = res["default"]
        # Three times the rows and the calls, in one allocator.
        self.assertEqual(one["repeat"], 0)
        self.assertNotIn("repetitions", one)
        self.assertEqual(r["repeat"], 3)
        self.assertEqual(r["trace_events"], one["events"])
        self.assertEqual(r["events"], 3 * one["events"])
        self.assertEqual(r["replayed_calls"], 3 * one["replayed_calls"])
        # What a repetition leaves live is freed at its end: live bytes never
        # pile up, and the peaks are those of one replay.
        self.assertEqual(r["peak_requested"], one["peak_requested"])
        self.assertEqual(r["trace_peak_live"], one["trace_peak_live"])
        self.assertEqual(r["peak_allocated"], one["peak_allocated"])
        self.assertEqual(r["failed_allocs"], 0)
        reps = r["repetitions"]
        self.assertEqual((reps["completed"], reps["marks"], reps["mark_failures"]), (3, 3, 0))
        self.assertEqual(reps["rep_end_frees"], 3)  # the 1 MiB the trace never frees
        self.assertEqual(reps["peak_sampling"], "after every allocation call")
        self.assertEqual([p["rep"] for p in reps["reps"]], [1, 2, 3])
        self.assertEqual(reps["peak_reserved_first_rep"], one["peak_reserved"])
        self.assertEqual(reps["peak_reserved_first_rep"], reps["reps"][0]["peak_reserved"])
        self.assertTrue(reps["reps"][0]["peak_reserved_exact"])
        self.assertEqual(reps["peak_reserved_last_rep"], reps["reps"][2]["peak_reserved"])
        self.assertEqual(reps["peak_reserved_max_after_first_rep"],
                         max(p["peak_reserved"] for p in reps["reps"][1:]))
        self.assertLessEqual(reps["peak_reserved_last_rep"], r["peak_reserved"])
        self.assertEqual(max(p["peak_reserved"] for p in reps["reps"]), r["peak_reserved"])
        self.assertEqual(reps["device_allocs_first_rep"] + reps["device_allocs_after_first_rep"],
                         r["device_allocs"])
        self.assertEqual(sum(p["device_allocs"] for p in reps["reps"]), r["device_allocs"])
        self.assertEqual(reps["device_allocs_after_first_rep"], 0)  # the cache serves 2 and 3
        # Under plan:off nothing is planned and the mark is a no-op.
        self.assertIsNone(reps["plan_active_after_rep"])
        self.assertIsNone(reps["device_allocs_after_plan_active"])
        for k in ("plan_state", "plan_hits", "plan_misses", "plan_replans", "plan_arena_bytes",
                  "plan_lower_bound", "plan_slots", "plan_iterations"):
            self.assertEqual(r[k], 0, k)
        # plan:on: every mark reaches gma; while plan:on is being built it
        # answers GMA_ERR_UNSUPPORTED, counted and named, and the replay goes on.
        p = res["plan"]
        self.assertEqual((p["repetitions"]["completed"], p["repetitions"]["marks"]), (3, 3))
        self.assertEqual(p["failed_allocs"], 0)
        if p["repetitions"]["mark_failures"]:
            self.assertEqual(p["repetitions"]["mark_failures"], 3)
            self.assertIn("gma_iteration_mark", p["repetitions"]["mark_error"])
            self.assertRegex(out, r"leaky \[plan\]: gma_iteration_mark failed 3 of 3 times: ")
        else:
            self.assertEqual(p["plan_iterations"], 3)
        # The tables: per trace, and the repetitions summary (in --quiet too).
        self.assertIn("leaky.csv: 11 events (6 allocations, 5 frees, 0 oom), replayed 3 times in "
                      "one allocator", out)
        self.assertRegex(out, r"(?m)^  repetitions completed\s+3\s+3\s*$")
        self.assertRegex(out, r"(?m)^  device allocs after rep 1\s+0\s")
        self.assertRegex(out, r"(?m)^  plan active after rep\s+never\s")
        row = r"(?m)^leaky\s+default\s+3\s+(\S+ MiB)\s+(\S+ MiB)\s+(\S+ MiB)\s+\S+x\s+(\d+)\s+0\s+-\s+-\s+0\s+0\s+-\s+0$"
        quiet = self.replay("--quiet", "--repeat", "3", "--config", "default=" + CONF, self.leaky)
        self.assertNotIn("repetitions completed", quiet)  # no per-trace table
        for text in (out, quiet):
            self.assertIn("repetitions (--repeat 3, one allocator", text)
            self.assertRegex(text, row)

    def test_repeat_min_capacity(self):
        _, d = self.run_json("--quiet", "--min-capacity", "--repeat", "3", "--config",
                             "default=" + CONF, self.known)
        s = d["min_capacity"][0]["search"]
        r = d["results"][0]["result"]
        self.assertEqual(r["repetitions"]["completed"], 3)
        self.assertEqual(s["replays"], len(s["steps"]))
        # Every capacity replays the three repetitions, in what one replay
        # needs (50 MiB): repetition 2 finds the 40 MiB block of repetition 1
        # cached as a whole segment; splitting it for two 16 MiB requests
        # would need a third segment beside it (2 MiB small + 40 + 16 = 58
        # MiB, as before the oversize-segment rule), so without room the 40
        # goes back to the device and the 16s get segments of their own.
        self.assertGreaterEqual(s["min_capacity"], 50 * MIB)
        self.assertLessEqual(s["min_capacity"], 50 * MIB / 0.998 + 1)
        self.assertFalse(s["unstable"])

    def test_repeat_needs_a_count(self):
        for bad in ("0", "x", "-1", "2x"):
            p = subprocess.run([TOOL, "--repeat", bad, self.known], capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(p.returncode, 2, bad)
            self.assertIn("--repeat wants a count", p.stderr)

    def run_bad(self, *args, timeout=60):
        p = subprocess.run([TOOL, "--quiet", *args], capture_output=True, text=True,
                           timeout=timeout,
                           env=dict(os.environ, GMA_CONF=""))
        return p.returncode, p.stderr

    def test_bad_input_is_named(self):
        bad = os.path.join(self.dir, "bad.csv")
        with open(bad, "w") as f:
            f.write(HEADER + "0,0.000001,alocate,0x1000,4096,0x0,0,0,0,\n")
        rc, err = self.run_bad(bad)
        # The row's own text, not bytes of a freed line buffer.
        self.assertEqual(rc, 1)
        self.assertIn("bad.csv:2: unknown action 'alocate'", err)
        rc, err = self.run_bad(self.dir)
        self.assertEqual(rc, 1)
        self.assertIn("is a directory, not a trace file", err)
        gz = os.path.join(self.dir, "known.csv.gz")
        with open(gz, "wb") as f:
            f.write(bytes([0x1f, 0x8b, 8, 0]) + b"\0" * 16)
        rc, err = self.run_bad(gz)
        self.assertEqual(rc, 1)
        self.assertIn("gzip-compressed", err)
        # A PyTorch memory snapshot given as it is: a pickle (protocol 2 and
        # later start with 0x80 and the protocol), named as one, with the
        # command that converts it.
        for proto in (2, 4, 5):
            snap = os.path.join(self.dir, "snapshot%d.pickle" % proto)
            with open(snap, "wb") as f:
                pickle.dump({"segments": [], "device_traces": [[]]}, f, protocol=proto)
            rc, err = self.run_bad(snap)
            self.assertEqual(rc, 1, err)
            self.assertIn("snapshot%d.pickle is a Python pickle (protocol %d), not a trace CSV"
                          % (proto, proto), err)
            self.assertIn("tools/gma-import-torch %s -o TRACE.csv" % snap, err)
            self.assertNotIn("not a trace header", err)
        empty = os.path.join(self.dir, "empty.csv")
        with open(empty, "w") as f:
            f.write(HEADER)
        rc, err = self.run_bad("--min-capacity", "--config", "e=expandable_segments:true", empty)
        self.assertEqual(rc, 1)
        self.assertIn("has a header but no events", err)
        self.assertIn("allocates nothing", err)
        self.assertNotIn("GMA_ERR_CONFIG", err)

    def test_timeline_without_times(self):
        # A trace whose Time column is empty (a snapshot without time_us,
        # imported) has no times: its timeline's Time column is empty too,
        # rather than the row index as microseconds, which would be drawn as
        # time. A trace with times keeps them.
        untimed = os.path.join(self.dir, "untimed.csv")
        with open(untimed, "w") as f:
            f.write(HEADER + "".join(re.sub(r"^0,[^,]*,", "0,,", r) + "\n"
                                     for r in KNOWN.splitlines()[1:]))
        out = os.path.join(self.dir, "tl")
        os.mkdir(out)
        self.replay("--config", "d=" + CONF, "--timeline-dir", out, untimed, self.known)
        for name, timed in (("untimed", False), ("known", True)):
            with open(os.path.join(out, name + ".d.timeline.csv")) as f:
                rows = [r.split(",") for r in f.read().splitlines()]
            self.assertEqual(rows[0], ["Event", "Time", "Allocated", "Reserved",
                                       "RecordedReserved"])
            self.assertGreater(len(rows), 5)
            times = [r[1] for r in rows[1:]]
            if timed:
                self.assertTrue(all(re.fullmatch(r"0\.\d{9}", t) for t in times), times)
                self.assertEqual(times[-1], "0.000010000")
            else:
                self.assertEqual(set(times), {""}, times)
            self.assertEqual(max(int(r[2]) for r in rows[1:]), 48 * MIB + 1000)

    def write_trace(self, name, rows):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(HEADER + "".join(r + "\n" for r in rows))
        return path

    def test_hostile_rows_refused(self):
        # Each trace has one bad row (line 3, after a good one); the error names
        # the file and line, the row's action, the column and the value, and
        # the replay exits 1 (a trace it cannot load) having freed everything.
        ok = "0,0.000001,allocate,0x1000,4096,0x0,0,0,0,"
        u64 = str(2**64 - 1)
        num = "a decimal number from 0 to 18446744073709551615"
        hexn = "a hex number from 0x0 to 0xffffffffffffffff"
        cases = [
            # An async row's Id names its future; 0 is none (the empty slot of
            # the futures map: async_complete dereferenced NULL, async_submit
            # leaked its future).
            ("0,0.000002,async_complete,0x2000,4096,0x0,0,0,0,",
             "async_complete row: column Id is 0"),
            ("0,0.000002,async_submit,0x0,4096,0x0,0,0,0,", "async_submit row: column Id is 0"),
            ("0,0.000002,async_submit,0x0,4096,0x0", "async_submit row: column Id is 0"),
            # strtoull took a sign (-n as 2^64 - n), '+', spaces, and an empty field as 0.
            ("0,0.000002,allocate,0x2000,-4096,0x0,0,0,0,",
             "allocate row: column Size is '-4096', not " + num),
            ("0,0.000002,allocate,0x2000,+4096,0x0,0,0,0,",
             "allocate row: column Size is '+4096', not " + num),
            ("0,0.000002,allocate,0x2000, 4096,0x0,0,0,0,",
             "allocate row: column Size is ' 4096', not " + num),
            ("0,0.000002,allocate,0x2000,4096 ,0x0,0,0,0,",
             "allocate row: column Size is '4096 ', not " + num),
            ("0,0.000002,allocate,0x2000,,0x0,0,0,0,",
             "allocate row: column Size is empty, not " + num),
            ("0,0.000002,allocate,0x2000,18446744073709551616,0x0,0,0,0,",
             "allocate row: column Size is '18446744073709551616', not " + num),
            ("0,0.000002,allocate,0x2000,4k,0x0,0,0,0,",
             "allocate row: column Size is '4k', not " + num),
            ("0,0.000002,free,-0x1000,4096,0x0,0,0,0,",
             "free row: column Pointer is '-0x1000', not " + hexn),
            ("0,0.000002,free, 0x1000,4096,0x0,0,0,0,",
             "free row: column Pointer is ' 0x1000', not " + hexn),
            ("0,0.000002,free,,4096,0x0,0,0,0,",
             "free row: column Pointer is empty, not " + hexn),
            ("0,0.000002,free,0x,4096,0x0,0,0,0,",
             "free row: column Pointer is '0x', not " + hexn),
            ("0,0.000002,free,0x10000000000000000,4096,0x0,0,0,0,",
             "free row: column Pointer is '0x10000000000000000', not " + hexn),
            ("0,0.000002,allocate,0x2000,4096,-0x1,0,0,0,",
             "allocate row: column Stream is '-0x1', not " + hexn),
            ("0,0.000002,allocate,0x2000,4096,,0,0,0,",
             "allocate row: column Stream is empty, not " + hexn),
            ("0,0.000002,allocate,0x2000,4096,0x0,-1,0,0,",
             "allocate row: column Block is '-1', not " + num),
            ("0,0.000002,allocate,0x2000,4096,0x0,0,+1,0,",
             "allocate row: column Id is '+1', not " + num),
            ("0,0.000002,allocate,0x2000,4096,0x0,0,,0,",
             "allocate row: column Id is empty, not " + num),
            ("0,0.000002,trim,0x0,0,0x0,0,0,-1,explicit",
             "trim row: column Count is '-1', not " + num),
            ("0,0.000002,trim,0x0,0,0x0,0,0,,explicit",
             "trim row: column Count is empty, not " + num),
            # A time that is not a finite number breaks the sort by time.
            ("0,nan,allocate,0x2000,4096,0x0,0,0,0,",
             "allocate row: column Time is 'nan', not a finite number of seconds"),
            ("0,-inf,allocate,0x2000,4096,0x0,0,0,0,",
             "allocate row: column Time is '-inf', not a finite"),
            # A Count beyond the rows after it: a batch's members and a served
            # async batch's rows follow it (async_complete with Count 2^64-1
            # looped for ever: i += Count wrapped around).
            ("0,0.000002,batch,0x0,4096,0x0,0,5,3,",
             "batch row: its Count 3 is more than the 0 rows after it"),
            ("0,0.000002,async_complete,0x0,4096,0x0,0,5,%s," % u64,
             "async_complete row: its Count %s is more than the 0 rows after it" % u64),
        ]
        for k, (row, want) in enumerate(cases):
            with self.subTest(row=row):
                path = self.write_trace("hostile%d.csv" % k, [ok, row])
                rc, err = self.run_bad(path, timeout=20)
                self.assertEqual(rc, 1, err)
                self.assertIn("hostile%d.csv:3: %s" % (k, want), err)
                self.assertEqual(err.count("\n"), 1, err)
        # Sums: the segment rows' reserved bytes past 2^63-1 (a signed
        # overflow), and the trace's live bytes past 2^64-1 (they wrapped).
        half = str(2**63)
        path = self.write_trace("segsum.csv", [
            "0,0.000001,segment_alloc,0x1000,%d,0x0,0,0,0," % (2**63 - 1),
            "0,0.000002,segment_alloc,0x2000,1,0x0,0,0,0,"])
        rc, err = self.run_bad(path)
        self.assertEqual(rc, 1, err)
        self.assertIn("segsum.csv:3: segment_alloc row: the segment rows' bytes pass 2^63-1 "
                      "here (Size 1)", err)
        path = self.write_trace("segbig.csv",
                                ["0,0.000001,segment_free,0x1000,%s,0x0,0,0,0," % half])
        rc, err = self.run_bad(path)
        self.assertEqual(rc, 1, err)
        self.assertIn("segbig.csv:2: segment_free row: column Size is %s, more than a segment "
                      "row's 2^63-1" % half, err)
        path = self.write_trace("livesum.csv", [
            "0,0.000001,allocate,0x1000,%s,0x0,0,0,0," % half,
            "0,0.000002,allocate,0x2000,%s,0x0,0,0,0," % half])
        rc, err = self.run_bad(path)
        self.assertEqual(rc, 1, err)
        self.assertIn("livesum.csv:3: allocate row: the trace's live bytes pass 2^64-1 here "
                      "(Size %s)" % half, err)

    def test_every_key_value(self):
        # The maps from trace pointers and future ids take every value, 0 and
        # 2^64-1 included (0 was the empty slot, 2^64-1 the deleted one: a
        # free of 0x0 freed nothing twice, and a second async_complete of Id
        # 2^64-1 used the freed future).
        u64 = str(2**64 - 1)
        path = self.write_trace("keys.csv", [
            "0,0.000001,allocate,0x0,4096,0x0,0,0,0,",
            "0,0.000002,allocate,0xffffffffffffffff,8192,0x0,0,0,0,",
            "0,0.000003,free,0xffffffffffffffff,8192,0x0,0,0,0,",
            "0,0.000004,free,0xffffffffffffffff,8192,0x0,0,0,0,",
            "0,0.000005,free,0x0,4096,0x0,0,0,0,",
            "0,0.000006,free,0x0,4096,0x0,0,0,0,",
            "0,0.000007,async_submit,0x0,1024,0x0,0,%s,0," % u64,
            "0,0.000008,async_complete,0x3000,1024,0x0,0,%s,0," % u64,
            "0,0.000009,async_complete,0x3000,1024,0x0,0,%s,0," % u64,
            "0,0.000010,free,0x3000,1024,0x0,0,0,0,",
            "0,0.000011,async_submit,0x0,512,0x0,0,1,0,",
        ])
        _, d = self.run_json("--quiet", "--config", "default=" + CONF, path)
        r = d["results"][0]["result"]
        # 2 allocations and 2 submits served, 3 frees matched, 2 frees of dead
        # pointers; the uncollected future (Id 1) released at the end.
        self.assertEqual((r["failed_allocs"], r["unmatched"]), (0, 2), r)
        self.assertEqual(r["replayed_calls"], 2 + 2 + 3, r)
        self.assertEqual(r["peak_requested"], 4096 + 8192, r)
        self.assertEqual(r["trace_peak_live"], 4096 + 8192, r)

    def test_min_capacity_past_2p63(self):
        # A trace whose peak live bytes pass 2^63: twice them wrapped, so the
        # search began at 2 MiB, below its own lower bound, and doubled 29
        # times up to the 1024 TiB cap. Now it starts at the cap: one replay.
        path = self.write_trace("huge.csv",
                                ["0,0.000001,allocate,0x1000,%d,0x0,0,0,0," % (2**63 + 1)])
        _, d = self.run_json("--quiet", "--min-capacity", "--config", "default=" + CONF, path)
        s = d["min_capacity"][0]["search"]
        self.assertEqual(s["lower_bound_peak_live"], 2**63 + 1)
        self.assertEqual([st["capacity"] for st in s["steps"]], [1024 << 40], s)
        self.assertEqual((s["min_capacity"], s["failing_capacity"]), (0, 1024 << 40), s)

    def test_bad_option_values(self):
        for opt, v, want in (("--budget", "-1", "--budget wants"), ("--budget", "abc", "--budget wants"),
                             ("--confirm", "-1", "--confirm wants"), ("--confirm", "x", "--confirm wants"),
                             ("--confirm", "1.5", "--confirm wants"), ("--seed", "1x", "--seed wants"),
                             ("--seed", " -1", "--seed wants"),
                             ("--precision", "0.2x", "--precision is")):
            rc, err = self.run_bad(opt, v, self.known)
            self.assertEqual(rc, 2, (opt, v, err))
            self.assertIn(want, err)
        afile = os.path.join(self.dir, "afile")
        with open(afile, "w") as f:
            f.write("x")
        for opt in ("--timeline-dir", "--snapshot-dir"):
            rc, err = self.run_bad(opt, os.path.join(self.dir, "no", "such"), self.known)
            self.assertEqual(rc, 1)
            self.assertIn(opt + ": cannot create", err)
            rc, err = self.run_bad(opt, afile, self.known)
            self.assertEqual(rc, 1)
            self.assertIn("is not a directory", err)
        # --confirm 0 (no confirmation) and a budget are still accepted.
        self.replay("--quiet", "--min-capacity", "--confirm", "0", "--budget", "30", self.known)

    def test_min_capacity_needs_sim(self):
        p = subprocess.run([TOOL, "--min-capacity", "--device", "cuda", self.known],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--device sim", p.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_replay_cli.py PATH/TO/gma-replay")
    TOOL = sys.argv.pop(1)
    unittest.main(verbosity=2)
