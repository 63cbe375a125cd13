#!/usr/bin/env python3
"""gma-estimate (tools/estimate) from the outside: a model's table and its
JSON (every part of the peak, summing to the total), a refused model's
message and exit status, bad usage, --select-device without a GPU, the
--trace mode on a small trace written here (the smallest capacity under
the default and growable configurations, never below the peak live bytes),
and tools/estimate_traces.py on the shipped CS336 trace
transformer_ctx128_forward, whose estimate must be within 10% of its peak
live bytes. Standard library only.
Usage: test_estimate.py GMA_ESTIMATE REPO"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

EXE, REPO = sys.argv[1], sys.argv[2]
MODEL = ["--hidden", "2560", "--intermediate", "10240", "--layers", "32", "--heads", "32",
         "--vocab", "10000", "--seq-len", "128", "--batch", "4"]
PARTS = ("weights_bytes", "weight_copy_bytes", "kv_cache_bytes", "activation_bytes",
         "logits_bytes", "gradient_bytes", "optimizer_bytes", "step_temp_bytes")


def tool(*args):
    return subprocess.run([EXE] + list(args), capture_output=True, text=True, timeout=120)


class Tool(unittest.TestCase):
    def test_table_and_json(self):
        r = tool(*MODEL, "--mode", "training")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("total (peak)", r.stdout)
        self.assertIn("optimizer state", r.stdout)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "e.json")
            r = tool(*MODEL, "--mode", "training", "--json", path)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(path) as f:
                j = json.load(f)
        e = j["estimate"]
        self.assertEqual(sum(e[k] for k in PARTS), e["total_bytes"])
        self.assertEqual(j["model"]["mode"], "training")
        self.assertEqual(e["params"], 3406809600)
        r = tool(*MODEL, "--json", "-")
        self.assertEqual(json.loads(r.stdout)["estimate"]["phase"], "inside a layer")

    def test_refused_and_usage(self):
        r = tool("--hidden", "100", "--layers", "2", "--vocab", "10", "--heads", "3",
                 "--seq-len", "4")
        self.assertEqual(r.returncode, 1)
        self.assertIn("does not divide model->hidden 100", r.stderr)
        self.assertEqual(tool("--hidden", "x").returncode, 2)
        self.assertEqual(tool("--mode", "train", *MODEL).returncode, 2)
        self.assertEqual(tool().returncode, 2)
        self.assertEqual(tool("--help").returncode, 0)

    def test_select_device(self):
        r = tool(*MODEL, "--select-device", "--json", "-")
        self.assertEqual(r.returncode, 0, r.stderr)
        j = json.loads(r.stdout)
        self.assertIn(j["device_status"], ("GMA_OK", "GMA_ERR_NO_DEVICE", "GMA_ERR_OOM"))

    def test_trace_min_capacity(self):
        rows = ["Thread,Time,Action,Pointer,Size,Stream,Block,Id,Count,Status"]
        t = 0.0
        for i in range(40):  # a growing, then steady working set: peak 21 x 3 MiB
            t += 0.001
            rows.append("0,%.3f,allocate,0x%x,%d,0x0,0,0,0," % (t, 0x100000 * (i + 1), 3 << 20))
            if i >= 20:
                t += 0.001
                rows.append("0,%.3f,free,0x%x,0,0x0,0,0,0," % (t, 0x100000 * (i - 19)))
        with tempfile.TemporaryDirectory() as d:
            path, out = os.path.join(d, "small.csv"), os.path.join(d, "cap.json")
            with open(path, "w") as f:
                f.write("\n".join(rows) + "\n")
            r = tool("--trace", path, "--precision", "2", "--json", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("ordinary", r.stdout)
            with open(out) as f:
                j = json.load(f)
        tr = j["traces"][0]
        self.assertEqual(tr["peak_live_bytes"], 21 * (3 << 20))
        self.assertEqual([c["config"] for c in tr["configs"]], ["default", "ordinary"])
        for c in tr["configs"]:
            self.assertGreaterEqual(c["search"]["min_capacity"], tr["peak_live_bytes"])

    def test_cs336_trace_within_ten_percent(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "rows.json")
            r = subprocess.run([sys.executable, os.path.join(REPO, "tools", "estimate_traces.py"),
                                EXE, os.path.join(REPO, "traces"), "--only",
                                "transformer_ctx128_forward", "--json", out],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out) as f:
                rows = json.load(f)
        self.assertEqual(len(rows), 1)
        self.assertEqual(rows[0]["peak_live_bytes"], 17602723840)
        self.assertLess(abs(rows[0]["error"]), 0.10)


if __name__ == "__main__":
    del sys.argv[1:3]
    unittest.main(verbosity=2)
