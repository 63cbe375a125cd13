#!/usr/bin/env python3
"""Tests of tools/gma-viz: it runs the tool on small generated timelines and
snapshots and checks the SVG and HTML it writes, and that bad input gives a
clear message and exit status 2.

Usage: test_viz.py [PATH/TO/gma-viz]   (default: tools/gma-viz of this checkout)
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "..", "tools", "gma-viz")
SVG_NS = "{http://www.w3.org/2000/svg}"
HEADER = "Event,Time,Allocated,Reserved,RecordedReserved\n"
MIB = 1 << 20
GIB = 1 << 30


def write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def timeline(rows):
    """rows: (event, time, allocated, reserved, recorded or None)."""
    return HEADER + "".join("%d,%.9f,%d,%d,%s\n" % (e, t, a, r, "" if rec is None else rec)
                            for e, t, a, r, rec in rows)


def sawtooth(peak_alloc, peak_res, peak_rec, n=400):
    """A training-like curve whose peaks are exactly the given values."""
    rows = []
    for i in range(n):
        phase = (i % 100) / 100.0
        a = int(peak_alloc * (0.3 + 0.7 * (phase / 0.5 if phase < 0.5 else (1 - phase) / 0.5)))
        rows.append((i * 3, i * 0.01, a, int(peak_res * min(1.0, 0.5 + i / 100.0)),
                     None if peak_rec is None else int(peak_rec * min(1.0, 0.4 + i / 100.0))))
    rows[50] = (150, 0.5, peak_alloc, rows[50][3], rows[50][4])
    return rows


def texts(root):
    return ["".join(t.itertext()) for t in root.iter(SVG_NS + "text")]


class VizTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gma-viz-test-")

    def tearDown(self):
        if os.environ.get("GMA_VIZ_KEEP"):  # keep the outputs to look at them
            print("outputs kept in", self.dir)
            return
        shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def run_viz(self, *args):
        p = subprocess.run([sys.executable, TOOL] + list(args), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
        return p.returncode, p.stderr

    def ok(self, *args):
        rc, err = self.run_viz(*args)
        self.assertEqual(rc, 0, err)
        return err

    def fails(self, *args, expect):
        rc, err = self.run_viz(*args)
        self.assertEqual(rc, 2, "expected exit status 2, got %d: %s" % (rc, err))
        self.assertIn("gma-viz: error:", err)
        self.assertNotIn("Traceback", err)
        self.assertRegex(err, expect)
        return err

    def svg(self, name):
        root = ET.parse(self.path(name)).getroot()
        self.assertEqual(root.tag, SVG_NS + "svg")
        return root

    def by_id(self, root, ident):
        for el in root.iter():
            if el.get("id") == ident:
                return el
        return None

    def snapshot(self):
        segs = []
        base = 0x7F0000000000
        # One large segment, one growable of 4 GiB, 30 small ones of 2 MiB:
        # at a linear scale the small ones are under the minimum width.
        segs.append({"address": hex(base), "size": 64 * MIB, "pool": "large", "growable": False,
                     "blocks": [
                         {"address": hex(base), "size": 40 * MIB, "state": "live",
                          "stream": "0x0", "requested": 40 * MIB - 100},
                         {"address": hex(base + 40 * MIB), "size": 8 * MIB, "state": "cached",
                          "stream": "0x0", "requested": 0},
                         {"address": hex(base + 48 * MIB), "size": 16 * MIB, "state": "free",
                          "stream": "0x0", "requested": 0}]})
        g = base + GIB
        segs.append({"address": hex(g), "size": 4 * GIB, "pool": "large", "growable": True,
                     "blocks": [
                         {"address": hex(g), "size": 256 * MIB, "state": "live",
                          "stream": "0x0", "requested": 256 * MIB},
                         {"address": hex(g + 256 * MIB), "size": 3840 * MIB, "state": "pending",
                          "stream": "0x0", "requested": 0}]})
        for i in range(30):
            a = base + 4 * GIB + i * 2 * MIB
            segs.append({"address": hex(a), "size": 2 * MIB, "pool": "small", "growable": False,
                         "blocks": [
                             {"address": hex(a), "size": MIB, "state": "live", "stream": "0x0",
                              "requested": MIB},
                             {"address": hex(a + MIB), "size": 512 * 1024, "state": "binned",
                              "stream": "0x0", "requested": 0},
                             {"address": hex(a + MIB + 512 * 1024), "size": 512 * 1024,
                              "state": "free", "stream": "0x0", "requested": 0}]})
        return {"version": 1, "device": "sim", "reserved": 64 * MIB + 4 * GIB + 60 * MIB,
                "allocated": 40 * MIB + 256 * MIB + 30 * MIB,
                "requested": 40 * MIB - 100 + 256 * MIB + 30 * MIB, "segments": segs}

    # ----------------------------------------------------------------------

    def test_full_picture(self):
        d = write(self.path("default.csv"), timeline(sawtooth(GIB, GIB * 3 // 2, 2 * GIB)))
        e = write(self.path("expandable.csv"), timeline(sawtooth(GIB, GIB * 5 // 4, 2 * GIB)))
        snap = write(self.path("peak.json"), json.dumps(self.snapshot()))
        self.ok("--title", "opt125m_zo_finetune", "--timeline", "default=" + d,
                "--timeline", "expandable=" + e, "--snapshot", snap, "--recorded-label", "PyTorch",
                "--svg", self.path("out.svg"), "--html", self.path("out.html"))
        root = self.svg("out.svg")
        all_text = texts(root)
        # One element per series, and the legend names them.
        for ident in ("series-allocated", "area-allocated", "series-reserved-0",
                      "series-reserved-1", "series-recorded"):
            self.assertIsNotNone(self.by_id(root, ident), ident)
        self.assertIn("stroke-dasharray", self.by_id(root, "series-recorded").attrib)
        legend = [t for t, el in zip(all_text, root.iter(SVG_NS + "text"))
                  if el.get("class") == "legend"]
        for name in ("allocated", "default reserved", "expandable reserved", "PyTorch reserved"):
            self.assertIn(name, legend)
        self.assertIn("opt125m_zo_finetune", all_text)
        # Peaks: exact bytes on the markers, rounded values and ratios in the labels.
        peaks = {el.get("id"): int(el.get("data-peak")) for el in root.iter(SVG_NS + "g")
                 if el.get("class") == "peak"}
        self.assertEqual(peaks, {"peak-allocated": GIB, "peak-reserved-0": GIB * 3 // 2,
                                 "peak-reserved-1": GIB * 5 // 4, "peak-recorded": 2 * GIB})
        self.assertIn("peak allocated", all_text)
        self.assertIn("1.00 GiB", all_text)
        self.assertIn("1.50 GiB · 1.50× allocated", all_text)
        self.assertIn("1.25 GiB · 1.25× allocated", all_text)
        self.assertIn("2.00 GiB · 2.00× allocated", all_text)
        self.assertIn("peak PyTorch reserved", all_text)
        # Axes: GiB ticks and a time axis.
        self.assertIn("trace time (s)", all_text)
        self.assertTrue(any(re.fullmatch(r"[\d.]+ GiB", t) for t in all_text))
        # Hover tooltips.
        self.assertGreater(len(list(root.iter(SVG_NS + "title"))), 50)
        # Segment map: states, totals, pools, and the caption on the scale.
        classes = [el.get("class") or "" for el in root.iter(SVG_NS + "rect")]
        for state in ("live", "cached", "free"):
            self.assertTrue(any(c == "block " + state for c in classes), state)
        totals = "".join(self.by_id(root, "snapshot-totals").itertext())
        self.assertIn("reserved 4.12 GiB = live 326 MiB + cached 3.77 GiB + free 31.0 MiB", totals)
        self.assertIn("32 segments", totals)
        heads = [t for t in all_text if " pool · " in t]
        self.assertEqual(len(heads), 2)
        self.assertTrue(heads[0].startswith("large pool · 2 segments"))
        self.assertTrue(heads[1].startswith("small pool · 30 segments"))
        self.assertIn("growable segment", all_text)
        self.assertTrue(any(t.startswith("30 segments smaller than") and
                            "drawn 6 px wide so that they stay visible" in t for t in all_text))
        # HTML: the SVG inline, a table of the numbers, nothing external.
        with open(self.path("out.html"), encoding="utf-8") as f:
            page = f.read()
        self.assertIn("<svg", page)
        self.assertIn("series-reserved-1", page)
        self.assertIn('<table id="peaks">', page)
        self.assertIn("1.50×", page)
        self.assertIn('<table id="snapshot">', page)
        self.assertNotIn("http:", page)
        self.assertNotIn("https:", page)
        self.assertNotRegex(page, r"\bsrc\s*=")
        self.assertNotRegex(page, r"<link\b")
        self.assertNotRegex(page, r"@import")
        self.assertNotRegex(page, r"\bhref\s*=\s*\"(?!#)")

    def test_no_recorded_reserved(self):
        t = write(self.path("t.csv"), timeline(sawtooth(3 * MIB, 4 * MIB, None)))
        self.ok("--timeline", "default=" + t, "--recorded-label", "PyTorch",
                "--svg", self.path("o.svg"), "--html", self.path("o.html"))
        root = self.svg("o.svg")
        self.assertIsNone(self.by_id(root, "series-recorded"))
        self.assertIsNotNone(self.by_id(root, "series-reserved-0"))
        all_text = texts(root)
        self.assertNotIn("PyTorch reserved", all_text)
        self.assertIn("4.00 MiB · 1.33× allocated", all_text)
        self.assertTrue(any(re.fullmatch(r"[\d.]+ MiB", t) for t in all_text))

    def test_single_row_and_label_from_file_name(self):
        t = write(self.path("only.csv"), HEADER + "0,0.5,1048576,2097152,\n")
        self.ok("--timeline", t, "--svg", self.path("o.svg"))
        all_text = texts(self.svg("o.svg"))
        self.assertIn("only reserved", all_text)
        self.assertIn("2.00 MiB · 2.00× allocated", all_text)

    def test_huge_values_and_event_axis(self):
        rows = [(i, i * 0.1, 40 * GIB * i // 99, 40 * GIB if i else 0, 45 * GIB) for i in range(100)]
        t = write(self.path("t.csv"), timeline(rows))
        self.ok("--timeline", "x=" + t, "--x", "events", "--svg", self.path("o.svg"))
        root = self.svg("o.svg")
        all_text = texts(root)
        self.assertIn("trace event", all_text)
        self.assertIn("40.0 GiB", all_text)
        self.assertIn("45.0 GiB · 1.12× allocated", all_text)
        self.assertEqual(int(self.by_id(root, "peak-recorded").get("data-peak")), 45 * GIB)

    def test_zero_allocations(self):
        rows = [(i, i * 0.01, 0, 0, None) for i in range(20)]
        t = write(self.path("t.csv"), timeline(rows))
        self.ok("--timeline", "z=" + t, "--svg", self.path("o.svg"), "--html", self.path("o.html"))
        all_text = texts(self.svg("o.svg"))
        self.assertIn("0 B · ratio n/a", all_text)

    def test_snapshot_only(self):
        snap = write(self.path("s.json"), json.dumps(self.snapshot()))
        self.ok("--snapshot", snap, "--svg", self.path("o.svg"))
        root = self.svg("o.svg")
        self.assertIsNone(self.by_id(root, "series-allocated"))
        self.assertIsNotNone(self.by_id(root, "snapshot-totals"))

    def test_bad_input(self):
        out = self.path("o.svg")
        missing = write(self.path("m.csv"), "Event,Time,Allocated,Reserved\n0,0,1,1\n")
        self.fails("--timeline", "a=" + missing, "--svg", out,
                   expect=r"missing column RecordedReserved")
        self.fails("--timeline", "a=" + self.path("nope.csv"), "--svg", out,
                   expect=r"cannot read timeline .*nope\.csv")
        self.fails("--timeline", "a=" + self.dir, "--svg", out, expect=r"cannot read timeline")
        bad = write(self.path("b.csv"), HEADER + "0,0,1,1,\n1,0.1,lots,1,\n")
        self.fails("--timeline", "a=" + bad, "--svg", out,
                   expect=r"b\.csv:3: column Allocated: 'lots' is not a number")
        empty = write(self.path("e.csv"), HEADER)
        self.fails("--timeline", "a=" + empty, "--svg", out, expect=r"no samples")
        good = write(self.path("g.csv"), HEADER + "0,0,1,1,\n")
        notjson = write(self.path("s.json"), "{not json")
        self.fails("--timeline", "a=" + good, "--snapshot", notjson, "--svg", out,
                   expect=r"not valid JSON")
        noseg = write(self.path("n.json"), '{"version": 1}')
        self.fails("--timeline", "a=" + good, "--snapshot", noseg, "--svg", out,
                   expect=r"\"segments\" list")
        self.fails("--timeline", "a=" + good, expect=r"give --svg and/or --html")
        self.fails("--timeline", "a=" + good, "--timeline", "a=" + good, "--svg", out,
                   expect=r"given twice")
        self.fails("--timeline", "a=" + good, "--svg", os.path.join(self.dir, "no", "o.svg"),
                   expect=r"cannot write")


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        TOOL = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
