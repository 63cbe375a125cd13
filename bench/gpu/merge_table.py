#!/usr/bin/env python3
"""merge_table.py: one table from gma-bench-gpu's and torch_bench.py's JSON.

usage: merge_table.py GPU_JSON [TORCH_JSON ...]

Rows are scenarios (matched by id), columns are allocators: gma-bench-gpu's
(direct, cudaMallocAsync, CUB, gma, gma with expandable segments), then
torch_bench.py's (PyTorch's caching allocator, with expandable segments, gma
through the plug-in). Three tables:

  1. the median ns per alloc+free pair (batch wall time, kernels included;
     memory pressure: per successful allocation), followed by the ratio
     peer/gma, where gma is gma-bench-gpu's default gma in the same scenario
     (above 1: slower than gma), and "NF" when N allocations failed;
  2. the p99 of the individual calls, allocation/free (nearest rank);
  3. the peak footprint in MiB (each allocator's own statistics; the JSON
     names the source).

torch_bench.py's figures include the Python call; the first table's last
column, torch/plugin, compares PyTorch's allocator with gma through the same
Python path. A file that is missing or says "skipped" is reported and left
out. Standard library only.
"""
import json
import sys

SHORT = {
    "direct": "direct",
    "cudaMallocAsync": "mallocAsync",
    "cub": "CUB",
    "gma": "gma",
    "gma_expandable": "gma-expand",
    "gma_wait": "gma-wait",
    "torch": "torch",
    "torch_expandable": "torch-expand",
    "gma_torch_plugin": "torch+gma",
}
REFERENCE = "gma"


def load(path):
    """(data, None) or (None, why)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None, "%s: no such file" % path
    except (OSError, ValueError) as e:
        return None, "%s: unreadable (%s)" % (path, e)
    if not isinstance(data, dict) or "scenarios" not in data:
        why = data.get("skipped") if isinstance(data, dict) else None
        return None, "%s (%s): skipped: %s" % (
            path, data.get("benchmark", "?") if isinstance(data, dict) else "?",
            why or "no scenarios")
    return data, None


def number(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def median(entry):
    return number(entry.get("median_ns")) if isinstance(entry, dict) else None


def p99(entry, key):
    """The p99 of entry's alloc_ns or free_ns, None where it has none."""
    if not isinstance(entry, dict) or not isinstance(entry.get(key), dict):
        return None
    return number(entry[key].get("p99"))


def fmt_ns(v):
    if v is None:
        return "-"
    if v >= 1e7:
        return "%.0fM" % (v / 1e6)
    if v >= 1e5:
        return "%.0fk" % (v / 1e3)
    return "%.0f" % v


def fmt_ratio(r):
    return ("%.1fx" % r) if r >= 10 else ("%.2fx" % r)


def show_table(title, header, table):
    widths = [max(len(r[i]) for r in [header] + table) for i in range(len(header))]

    def show(r):
        return "  ".join([r[0].ljust(widths[0])] +
                         [c.rjust(w) for c, w in zip(r[1:], widths[1:])]).rstrip()
    print(title)
    print(show(header))
    print(show(["-" * widths[0]] + ["-" * w for w in widths[1:]]))
    for r in table:
        print(show(r))


def side_tables(rows, names, columns, cells):
    """The per-call p99 table and the peak footprint table."""
    header = ["scenario"] + [SHORT.get(a, a) for a in columns]
    calls, peaks = [], []
    for sid in rows:
        line, pline = [names[sid]], [names[sid]]
        for a in columns:
            entry = cells.get((sid, a))
            pa, pf = p99(entry, "alloc_ns"), p99(entry, "free_ns")
            line.append("-" if pa is None and pf is None else
                        "%s/%s" % (fmt_ns(pa), fmt_ns(pf)))
            peak = number(entry.get("peak_bytes")) if isinstance(entry, dict) else None
            mib = peak / (1 << 20) if peak is not None else None
            pline.append("-" if mib is None else ("%.1f" % mib) if mib < 10 else "%.0f" % mib)
        calls.append(line)
        peaks.append(pline)
    print()
    show_table("p99 ns of the individual calls, allocation/free (nearest rank)", header, calls)
    print()
    show_table("peak footprint, MiB (each allocator's own statistics; sources in the JSON)",
               header, peaks)


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip().split("\n\n")[1] if len(argv) >= 2 else
              "usage: merge_table.py GPU_JSON [TORCH_JSON ...]", file=sys.stderr)
        return 2
    sources, notes = [], []
    for path in argv[1:]:
        data, why = load(path)
        if data is None:
            notes.append(why)
        else:
            sources.append((path, data))
    if not sources:
        print("merge_table: nothing to merge:")
        for n in notes:
            print("  " + n)
        return 0

    # Columns in file order, each allocator once; rows in first-seen order.
    columns, rows, names, cells, extra = [], [], {}, {}, {}
    for path, data in sources:
        allocs = data.get("allocators", {})
        order = list(allocs) or []
        for sc in data["scenarios"]:
            for a in sc.get("results", {}):
                if a not in order:
                    order.append(a)
        for a in order:
            if a not in columns:
                columns.append(a)
            info = allocs.get(a, {})
            if info and not info.get("available", True) and info.get("reason"):
                notes.append("%s: %s" % (a, info["reason"]))
        for sc in data["scenarios"]:
            sid = sc["id"]
            if sid not in names:
                rows.append(sid)
                names[sid] = sc.get("name", sid)
            for a, entry in sc.get("results", {}).items():
                cells[(sid, a)] = entry
            if sc.get("note"):
                extra.setdefault(sid, sc["note"])

    plugin_ratio = "torch" in columns and "gma_torch_plugin" in columns
    header = ["scenario"] + [SHORT.get(a, a) for a in columns]
    if plugin_ratio:
        header.append("torch/plugin")
    table = []
    for sid in rows:
        ref = median(cells.get((sid, REFERENCE)))
        line = [names[sid]]
        for a in columns:
            m = median(cells.get((sid, a)))
            text = fmt_ns(m)
            if m is not None and ref is not None and a != REFERENCE:
                text += " (%s)" % fmt_ratio(m / ref)
            entry = cells.get((sid, a))
            if m is not None and isinstance(entry, dict) and entry.get("failures"):
                text += " %dF" % entry["failures"]
            line.append(text)
        if plugin_ratio:
            t = median(cells.get((sid, "torch")))
            g = median(cells.get((sid, "gma_torch_plugin")))
            line.append(fmt_ratio(t / g) if t and g else "-")
        table.append(line)

    gpu = next((d.get("config", {}).get("gpu") for _, d in sources
                if d.get("config", {}).get("gpu")), None)
    show_table("median ns per alloc+free pair, kernels included (peer/gma: above 1 is slower "
               "than gma)%s" % (" on %s" % gpu if gpu else ""), header, table)
    print("(gma: gma-bench-gpu's gma, default config; memory pressure: ns per successful "
          "allocation,\n NF: N allocations failed; -: not measured or not applicable; torch "
          "columns include the\n Python call%s)" % (
              "; torch/plugin: PyTorch's allocator over gma through the plug-in"
              if plugin_ratio else ""))
    side_tables(rows, names, columns, cells)
    for sid in rows:
        if sid in extra:
            print("%s: %s" % (names[sid], extra[sid]))
    if notes:
        print("not measured:")
        for n in dict.fromkeys(notes):
            print("  " + n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
