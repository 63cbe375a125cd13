#!/usr/bin/env python3
"""Tests of the gma-replay command's capacity output: failed allocations in
the per-trace table, the summary and the JSON; the trace's oom rows attempted
and reported ("PyTorch failed N, gma failed M"); --min-capacity's tables and
JSON, on small traces whose answers are known (the same traces as
test_capacity.c, which checks the engine).

Usage: test_replay_cli.py PATH/TO/gma-replay
"""

import json
import os
import re
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

CONF = "trim_interval_ms:3600000"


class ReplayCli(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gma-replay-cli-")
        self.known = os.path.join(self.dir, "known.csv")
        self.oom = os.path.join(self.dir, "with_oom.csv")
        with open(self.known, "w") as f:
            f.write(KNOWN)
        with open(self.oom, "w") as f:
            f.write(WITH_OOM)

    def tearDown(self):
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)

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
