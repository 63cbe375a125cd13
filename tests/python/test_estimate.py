"""gma.estimate_transformer (python/gma) against gma_estimate_transformer:
the dict of a small model computed by hand (tests/api/test_estimate.c has
the arithmetic), the same figures as the gma-estimate tool's JSON for a
CS336 2.7B model, names for dtypes and modes, and gma's refusals raised as
gma.InvalidArgument with its message. Standard library only.
Usage: test_estimate.py <gma_py_sizes> <gma.h> (the common arguments); the
environment's GMA_ESTIMATE names the gma-estimate tool (CTest sets it)."""
import json
import os
import subprocess
import unittest

from common import run

import gma


SMALL = dict(hidden=8, intermediate=16, layers=2, vocab=10, heads=2, seq_len=4, batch=2)


class Estimate(unittest.TestCase):
    def test_small_training_by_hand(self):
        e = gma.estimate_transformer(kv_heads=1, mode="training", **SMALL)
        self.assertEqual(e["params"], 1352)
        self.assertEqual(e["weights_bytes"], 5408)
        self.assertEqual(e["activation_bytes"], 7680)
        self.assertEqual(e["logits_bytes"], 960)
        self.assertEqual(e["gradient_bytes"], 5408)
        self.assertEqual(e["optimizer_bytes"], 10816)
        self.assertEqual(e["phase"], "backward")
        self.assertEqual(e["total_bytes"], 30272)
        parts = [k for k in e if k.endswith("_bytes") and k not in
                 ("total_bytes", "layer_activation_bytes")]
        self.assertEqual(sum(e[k] for k in parts), e["total_bytes"])

    def test_names_and_bytes_agree(self):
        a = gma.estimate_transformer(dtype="fp32", act_dtype="bf16", kv_cache_tokens=6,
                                     attention="eager_exp", kv_heads=1, **SMALL)
        b = gma.estimate_transformer(dtype=4, act_dtype=2, kv_cache_tokens=6,
                                     attention="eager_exp", kv_heads=1, **SMALL)
        self.assertEqual(a, b)
        self.assertEqual(a["phase"], "layer")
        self.assertEqual(a["total_bytes"], 5408 + 2464 + 384 + 1408)

    def test_matches_the_tool(self):
        exe = os.environ.get("GMA_ESTIMATE", "")
        if not os.path.exists(exe):
            self.skipTest("GMA_ESTIMATE does not name the gma-estimate tool")
        out = subprocess.run([exe, "--hidden", "2560", "--intermediate", "10240", "--layers",
                              "32", "--heads", "32", "--vocab", "10000", "--seq-len", "128",
                              "--batch", "4", "--mode", "training", "--json", "-"],
                             check=True, capture_output=True, text=True).stdout
        tool = json.loads(out)["estimate"]
        e = gma.estimate_transformer(2560, 32, 10000, 32, 128, intermediate=10240, batch=4,
                                     mode="training")
        for k, v in e.items():
            if k != "phase":
                self.assertEqual(tool[k], v, k)

    def test_refusals(self):
        with self.assertRaises(gma.InvalidArgument) as cm:
            gma.estimate_transformer(hidden=10, layers=2, vocab=10, heads=3, seq_len=4)
        self.assertIn("does not divide model->hidden 10", str(cm.exception))
        with self.assertRaises(gma.InvalidArgument) as cm:
            gma.estimate_transformer(hidden=8, layers=0, vocab=10, heads=2, seq_len=4)
        self.assertIn("model->layers is 0", str(cm.exception))
        with self.assertRaises(gma.InvalidArgument):
            gma.estimate_transformer(hidden=1 << 40, layers=1 << 20, vocab=10, heads=1,
                                     seq_len=4)
        with self.assertRaises(ValueError):
            gma.estimate_transformer(mode="train", **SMALL)
        with self.assertRaises(ValueError):
            gma.estimate_transformer(dtype="int3", **SMALL)
        with self.assertRaises(ValueError):
            gma.estimate_transformer(hidden=-8, layers=2, vocab=10, heads=2, seq_len=4)


if __name__ == "__main__":
    run()
