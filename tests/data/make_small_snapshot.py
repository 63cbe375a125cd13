#!/usr/bin/env python3
"""Writes small_snapshot.pickle: a small PyTorch-format memory snapshot
(PyTorch 2.1+ layout: every block has its address) that the install test
(tests/install/test_install_prefix.sh) imports with gma-import-torch. Plain
dicts, lists, strings and ints, pickle protocol 2, so the file is the same on
every Python. Run it to regenerate the file; it is committed as written."""
import os
import pickle

MIB = 1 << 20
BASE = 0x7F0000000000


def main():
    events, t = [], 1000

    def ev(action, addr, size):
        nonlocal t
        events.append({"action": action, "addr": addr, "size": size, "stream": 0,
                       "time_us": t, "frames": []})
        t += 250

    ev("segment_alloc", BASE, 20 * MIB)
    live = []
    for i in range(12):  # a few layers' activations, freed in reverse
        a = BASE + i * (MIB + MIB // 2)
        ev("alloc", a, MIB + (i % 3) * 4096)
        live.append((a, MIB + (i % 3) * 4096))
        if i % 4 == 3:
            ev("alloc", BASE + 18 * MIB, 512)  # a small scratch buffer
            ev("free_requested", BASE + 18 * MIB, 512)
            ev("free_completed", BASE + 18 * MIB, 512)
    ev("segment_alloc", BASE + 32 * MIB, 12 * MIB)
    ev("alloc", BASE + 32 * MIB, 10 * MIB)
    for a, size in reversed(live[4:]):
        ev("free_requested", a, size)
        ev("free_completed", a, size)
    ev("free_requested", BASE + 32 * MIB, 10 * MIB)
    ev("free_completed", BASE + 32 * MIB, 10 * MIB)
    ev("segment_free", BASE + 32 * MIB, 12 * MIB)
    blocks, addr = [], BASE
    for a, size in live[:4]:
        blocks.append({"address": a, "size": MIB + MIB // 2, "requested_size": size,
                       "state": "active_allocated", "frames": []})
    used = 4 * (MIB + MIB // 2)
    blocks.append({"address": BASE + used, "size": 20 * MIB - used, "requested_size": 0,
                   "state": "inactive", "frames": []})
    snap = {
        "segments": [{"device": 0, "address": BASE, "total_size": 20 * MIB,
                      "allocated_size": used, "active_size": used,
                      "requested_size": sum(s for _, s in live[:4]), "stream": 0,
                      "segment_type": "large", "is_expandable": False, "frames": [],
                      "blocks": blocks}],
        "device_traces": [events],
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "small_snapshot.pickle")
    with open(out, "wb") as f:
        pickle.dump(snap, f, protocol=2)


if __name__ == "__main__":
    main()
