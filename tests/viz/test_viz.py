#!/usr/bin/env python3
"""Tests of tools/gma-viz: it runs the tool on small generated timelines and
snapshots and checks the SVG, HTML and PNG it writes (the PNG: the signature,
the SVG's size in IHDR, and the picture's colours in its pixels), that the
axis titles name what they measure and its unit (time in s or ms, events for
a trace without times, memory in bytes' units), and that bad input gives a
clear message and exit status 2, a missing rsvg-convert exit status 3 with
the SVG written.

Usage: test_viz.py [PATH/TO/gma-viz]   (default: tools/gma-viz of this checkout)
"""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
import zlib

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


def read_png(path):
    """(width, height, rows of (r, g, b) pixels) of an 8-bit RGB or RGBA,
    non-interlaced PNG (what rsvg-convert writes), with its chunks' CRCs
    checked and its scanline filters undone."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "no PNG signature: %r" % data[:8]
    pos, chunks = 8, []
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        crc, = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert zlib.crc32(kind + body) & 0xffffffff == crc, "bad CRC in %r" % kind
        chunks.append((kind, body))
        pos += 12 + n
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND", [k for k, _ in chunks]
    w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        ftype, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 255
            elif ftype == 2:
                line[i] = (line[i] + b) & 255
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ftype == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(w)])
        prev = line
    return w, h, rows


def rgb(hexcolor):
    return tuple(int(hexcolor[i:i + 2], 16) for i in (1, 3, 5))


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

    def run_viz(self, *args, env=None):
        p = subprocess.run([sys.executable, TOOL] + list(args), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=60, env=env)
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
        # Axes: GiB ticks and a time axis, each titled with its unit.
        self.assertIn("trace time (s)", all_text)
        self.assertIn("memory (GiB)", all_text)
        self.assertTrue(any(re.fullmatch(r"[\d.]+ GiB", t) for t in all_text))
        self.assertIn("3.99 s of trace time", all_text[1])
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
        self.assertIn("trace position (events)", all_text)
        self.assertIn("memory (GiB)", all_text)
        self.assertIn("9.9 s of trace time", all_text[1])  # the trace has times
        self.assertIn("40.0 GiB", all_text)
        self.assertIn("45.0 GiB · 1.12× allocated", all_text)
        self.assertEqual(int(self.by_id(root, "peak-recorded").get("data-peak")), 45 * GIB)

    def test_trace_without_times(self):
        # An imported snapshot without time_us: the timeline's Time column is
        # empty, so the x axis counts events and nothing claims a time (it
        # said "10.3 ms of trace time", the event count read as
        # microseconds).
        rows = HEADER + "".join("%d,,%d,%d,%d\n" % (i * 103, (i % 10) * MIB, 12 * MIB, 16 * MIB)
                                for i in range(101))
        t = write(self.path("t.csv"), rows)
        self.ok("--timeline", "default=" + t, "--svg", self.path("o.svg"),
                "--html", self.path("o.html"))
        root = self.svg("o.svg")
        all_text = texts(root)
        self.assertEqual("".join(self.by_id(root, "x-axis-title").itertext()),
                         "trace position (events)")
        self.assertEqual("".join(self.by_id(root, "y-axis-title").itertext()), "memory (MiB)")
        self.assertIn("trace events 0–10300 · no times in the trace: the x axis counts events",
                      all_text[1])
        self.assertFalse([t for t in all_text if re.search(r"\b(ms|µs|s) of trace time|t = ", t)])
        self.assertIn("10000", all_text)  # an event tick
        titles = ["".join(el.itertext()) for el in root.iter(SVG_NS + "title")]
        self.assertTrue(any(t.startswith("event 5150\n") for t in titles))
        self.assertFalse([t for t in titles if "t = " in t])
        with open(self.path("o.html"), encoding="utf-8") as f:
            self.assertIn("<td>–</td>", f.read())

    def test_times_that_do_not_advance(self):
        rows = [(i, 0.0, i * MIB, 16 * MIB, None) for i in range(10)]
        t = write(self.path("t.csv"), timeline(rows))
        self.ok("--timeline", "d=" + t, "--svg", self.path("o.svg"))
        root = self.svg("o.svg")
        self.assertEqual("".join(self.by_id(root, "x-axis-title").itertext()),
                         "trace position (events)")
        self.assertIn("the trace's times do not advance: the x axis counts events",
                      texts(root)[1])

    def test_milliseconds_axis(self):
        rows = [(i * 3, i * 1e-4, (i % 10) * MIB, 12 * MIB, None) for i in range(104)]
        t = write(self.path("t.csv"), timeline(rows))
        self.ok("--timeline", "d=" + t, "--svg", self.path("o.svg"))
        root = self.svg("o.svg")
        all_text = texts(root)
        self.assertEqual("".join(self.by_id(root, "x-axis-title").itertext()), "trace time (ms)")
        self.assertIn("10.3 ms of trace time", all_text[1])
        self.assertIn("10", all_text)  # ticks in milliseconds, not 0.01 (seconds)
        self.assertNotIn("0.01", all_text)

    @unittest.skipUnless(shutil.which("rsvg-convert"),
                         "rsvg-convert is not installed (librsvg2-bin; tools/bootstrap.sh)")
    def test_png(self):
        d = write(self.path("default.csv"), timeline(sawtooth(GIB, GIB * 3 // 2, 2 * GIB)))
        snap = write(self.path("peak.json"), json.dumps(self.snapshot()))
        self.ok("--timeline", "default=" + d, "--snapshot", snap, "--width", "900",
                "--svg", self.path("o.svg"), "--png", self.path("o.png"))
        root = self.svg("o.svg")
        w, h, px = read_png(self.path("o.png"))
        self.assertEqual((w, h), (900, int(root.get("height"))))
        colours = {}
        for row in px:
            for c in row:
                colours[c] = colours.get(c, 0) + 1
        white = colours.get((255, 255, 255), 0)
        self.assertLess(white, 0.95 * w * h, "the PNG is blank")
        self.assertGreater(len(colours), 20)  # lines, areas, text, anti-aliasing
        # The picture's own colours, each over a real area: the allocated
        # area, the reserved line, the live and cached blocks of the map.
        for name, colour, least in (("allocated area", "#c6dbef", 2000),
                                    ("default reserved line", "#e15759", 300),
                                    ("live block", "#4a7fb5", 300),
                                    ("cached block", "#f2b447", 300)):
            self.assertGreater(colours.get(rgb(colour), 0), least, name)
        # The chart is above the segment map: the allocated area's colour is
        # in the top half, the cached blocks' in the bottom part.
        top = sum(row.count(rgb("#c6dbef")) for row in px[:h // 2])
        self.assertGreater(top, 2000)
        low = sum(row.count(rgb("#f2b447")) for row in px[h // 2:])
        self.assertGreater(low, 300)
        # Only the PNG: the SVG goes through rsvg-convert without a file.
        self.ok("--timeline", "default=" + d, "--png", self.path("only.png"))
        self.assertEqual(read_png(self.path("only.png"))[0], 1200)

    def test_png_without_rsvg_convert(self):
        # No rsvg-convert on PATH: exit status 3 saying what to install; the
        # SVG and HTML are written all the same, and no PNG.
        d = write(self.path("d.csv"), timeline(sawtooth(GIB, GIB * 3 // 2, None)))
        empty = os.path.join(self.dir, "bin")
        os.mkdir(empty)
        rc, err = self.run_viz("--timeline", "d=" + d, "--svg", self.path("o.svg"),
                               "--html", self.path("o.html"), "--png", self.path("o.png"),
                               env=dict(os.environ, PATH=empty))
        self.assertEqual(rc, 3, err)
        self.assertIn("gma-viz: error: cannot write %s: the PNG is drawn by rsvg-convert, "
                      "which is not on PATH" % self.path("o.png"), err)
        self.assertIn("apt-get install librsvg2-bin", err)
        self.assertIn("(written: %s, %s)" % (self.path("o.svg"), self.path("o.html")), err)
        self.assertNotIn("Traceback", err)
        self.svg("o.svg")
        self.assertTrue(os.path.exists(self.path("o.html")))
        self.assertFalse(os.path.exists(self.path("o.png")))

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

    def test_unmapped_holes(self):
        # Three growable segments of one range with gaps between them, one of
        # another range right after: two holes, marked between the first
        # three only; the kept bytes are in the totals.
        base, segs = 0x7f0000000000, []
        for i, (off, rng) in enumerate(((0, "0x1"), (6 * MIB, "0x1"), (16 * MIB, "0x1"),
                                        (20 * MIB, "0x2"))):
            segs.append({"address": hex(base + off), "size": 4 * MIB, "pool": "large",
                         "growable": True, "range": rng,
                         "blocks": [{"address": hex(base + off), "size": 4 * MIB,
                                     "state": "live", "stream": "0x0", "requested": 4 * MIB}]})
        snap = write(self.path("h.json"), json.dumps({"version": 1, "device": "sim",
                                                      "kept": 2 * MIB, "segments": segs}))
        self.ok("--snapshot", snap, "--svg", self.path("o.svg"))
        root = self.svg("o.svg")
        holes = [el for el in root.iter() if el.get("class") == "hole"]
        titles = ["".join(h.itertext()) for h in holes]
        self.assertEqual(sorted(t for t in titles if t),
                         ["unmapped hole · 2.00 MiB of address space, no memory",
                          "unmapped hole · 6.00 MiB of address space, no memory"])
        self.assertEqual(len(holes), 3)  # and the legend's
        all_text = texts(root)
        self.assertTrue(any(t.endswith("· 2 unmapped holes") for t in all_text), all_text)
        self.assertIn("kept (unmapped, held for the next growth) 2.00 MiB",
                      "".join(self.by_id(root, "snapshot-totals").itertext()))

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
        self.fails("--timeline", "a=" + good, expect=r"give --svg, --html and/or --png")
        mixed = write(self.path("x.csv"), HEADER + "0,0,1,1,\n1,,2,2,\n")
        self.fails("--timeline", "a=" + mixed, "--svg", out,
                   expect=r"x\.csv:3: column Time is empty here but set on the first row")
        self.fails("--timeline", "a=" + good, "--timeline", "a=" + good, "--svg", out,
                   expect=r"given twice")
        self.fails("--timeline", "a=" + good, "--svg", os.path.join(self.dir, "no", "o.svg"),
                   expect=r"cannot write")


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        TOOL = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
