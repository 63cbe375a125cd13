#!/usr/bin/env python3
"""Writes the seed corpus of the gma fuzzer (tests/fuzz/corpus/) in the input
encoding that tests/fuzz/fuzz_gma.c documents. The operation codes are read
from OP_LIST in fuzz_gma.c, so the two stay in step. Each seed is a small,
readable scenario; together they reach every operation and configuration bit.

Usage: python3 tests/fuzz/make_corpus.py [OUT_DIR]   (default: tests/fuzz/corpus)
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load_ops():
    src = open(os.path.join(HERE, "fuzz_gma.c")).read()
    m = re.search(r"#define OP_LIST\(X\)(.*?)\nenum", src, re.S)
    return re.findall(r"X\((\w+)\)", m.group(1))


OPS = load_ops()


def op(name, t=0, *args):
    """One operation of logical thread t (0-2 user streams, 3 default)."""
    return bytes([(t << 6) | OPS.index(name)] + [a & 255 for a in args])


# Sizes: two bytes (see pick_size). range r 0..5 with position v 0..8191,
# 6 the popular table, 7 the edges.
def size(r, v=4096):
    return [(r << 5) | ((v >> 8) & 31), v & 255]


def popular(i):
    return [(6 << 5) | i, 0]


def edge(i):
    return [(7 << 5) | i, 0]


TINY, SMALL, MID, LARGE, HUGE, GIANT = 0, 1, 2, 3, 4, 5
# edges: 0 size 0, 1 one byte, 2 bin_max, 3 bin_max+1, 4 2M, 5 10M, 6 10M+1, 7 20M,
# 8 limit, 9 limit+1, 10 capacity/2, 11 4097, 12 4096, 13 511, 14 SIZE_MAX, 15 SIZE_MAX-511


def config(worker=True, expandable=False, bins_off=False, reuse=0, fallback=False, trace=False,
           faults=False, cap=1, tick=0, rel8m=False, idle_long=False, grow=False, small=False,
           fail_alloc=0, fail_event=0, limit34=False, smallseg=False, end=0, pressure=False,
           plan=False):
    b0 = (worker | expandable << 1 | bins_off << 2 | reuse << 3 | fallback << 5 | trace << 6 |
          faults << 7)
    b1 = cap | tick << 2 | rel8m << 4 | idle_long << 5 | grow << 6 | small << 7
    b2 = fail_alloc | fail_event << 3 | limit34 << 6 | smallseg << 7
    b3 = end | (16 if pressure else 0) | (64 if plan else 0)
    return bytes([b0, b1, b2, b3])


def alloc(t, sz, tag=None):
    if tag is None:
        return op("ALLOC", t, *sz)
    return op("ALLOC_TAGGED", t, tag, *sz)


def free(t, which=0):
    return op("FREE", t, which)


def hold(t, which=0, gate=None, us=20):
    return op("K_HOLD", t, which, (0x80 | gate) if gate is not None else us)


def fill(t, which=0):
    return op("K_FILL", t, which, 0)


def check(t, which=0):
    return op("K_CHECK", t, which, 0)


def record(t, which, other, kernel=True, gated=False):
    mode = (1 if kernel else 0) | (2 if gated else 0) | (5 << 2)
    return op("RECORD", t, which, other, mode)


def gate_open(g):
    return op("GATE_OPEN", 0, g)


def async_(t, sz, timeout=2, nonblocking=False, any_stream=None):
    sel = [1, any_stream] if any_stream is not None else [0]
    return op("ASYNC", t, *sel, timeout | (4 if nonblocking else 0), *sz)


def async_chain(t, sz, child=8, timeout=2, nonblocking=False, child_worker_only=False,
                child_nonblocking=False):
    """A chain (fuzz_gma.c, chain_reserve): the request's callback submits a
    second one of 512 * child bytes (1..64) when it completes with GMA_OK."""
    ob = timeout | (4 if nonblocking else 0) | 0xB8
    arg = ((child - 1) & 63) | (64 if child_worker_only else 0) | (128 if child_nonblocking else 0)
    return op("ASYNC", t, 0, ob, *sz, arg)


def async_batch(t, sizes, timeout=2):
    out = [0, timeout | 0x40, len(sizes) - 1]
    for s in sizes:
        out += s
    return op("ASYNC_BATCH", t, *out)


def poll(i=0):
    return op("F_POLL", 0, i)


def wait(i=0, how=3):  # how: 0 no wait, 1 100us, 2 5ms, 3 unlimited; +4 without ptr
    return op("F_WAIT", 0, i, how)


def release(i=0):
    return op("F_RELEASE", 0, i)


def batch(t, sizes, small=True):
    out = [len(sizes) - 1, 1 if small else 0]
    for s in sizes:
        out += s
    return op("BATCH", t, *out)


def trim(keep_sel=0):
    return op("TRIM", 0, keep_sel)


def empty():
    return op("EMPTY_CACHE", 0, 0)


def sync(t):
    return op("SYNC", t)


def retire(t):
    return op("RETIRE", t)


def destroy(t):
    return op("DESTROY", t)


def host_alloc(t, sz):
    return op("HOST_ALLOC", t, *sz)


def host_free(i=0):
    return op("HOST_FREE", 0, i)


def host_kernel(i=0, arg=10):
    return op("HOST_KERNEL", 0, i, arg)


def pinfo(which=0, off=3):
    return op("PINFO", 0, which, off)


def reserve(t, items):  # items: [(size_bytes2, count)]
    out = [len(items) - 1]
    for sz, cnt in items:
        out += sz + [cnt]
    return op("RESERVE", t, *out)


def reserve_bad(t, variant, x=0):
    """RESERVE with a first byte 0xE0-0xEF: adversarial arguments (op_reserve_bad):
    0 counts {SIZE_MAX, 2}, 1 a count SIZE_MAX, 2 {2^63, 2^63}, 3 {2, SIZE_MAX-1, 1},
    4 a count whose pointer array overflows, 5 a count >= 2^32, 6-8 NULL sizes/counts/both
    (n = 1 + x % 3), 9 a valid entry (x % 3 blocks) then an impossible size
    ((x >> 2) & 3: 0, SIZE_MAX, limit + 1, SIZE_MAX - 511)."""
    return op("RESERVE", t, 0xE0 | variant, x)


# The operations with a helper thread: INTROSPECT with v = 8e + 3, kind (e - 1) % 4.
RACE_DESTROY, PTDS_THREAD, PRESSURE_CB, REPORTERS = range(4)


def threaded(kind, t, *args):
    return op("INTROSPECT", t, ((1 + kind) << 3) | 3, *args)


def race_destroy(t, blocks=8, rounds=1, hold=False, main_spins=False, size_sel=0, hold_us=0,
                 spin=0):
    """Frees of `blocks` blocks on a helper racing gma_stream_destroy (op_race_destroy);
    size_sel: 4 KiB, 512, 8 KiB, 64 KiB; logical thread 3 takes slot spin % 3."""
    a = (blocks - 1) | (rounds - 1) << 4 | hold << 6 | main_spins << 7
    return threaded(RACE_DESTROY, t, a, size_sel | hold_us << 2, spin)


def ptds_thread(blocks=4, rounds=1, kernels=True, sync_exit=False, one_size=False, size_sel=2,
                hold4us=2):
    """A thread allocates and frees on GMA_STREAM_PER_THREAD and exits (op_ptds_thread);
    sizes from 512, 1000, 4 KiB, 8292, 64 KiB, 200000, 1 MiB, 3 MiB."""
    a = (blocks - 1) | ((rounds - 1) % 3) << 3 | kernels << 5 | sync_exit << 6 | one_size << 7
    return threaded(PTDS_THREAD, 0, a, size_sel | hold4us << 3)


PCB_SET, PCB_UNSET, PCB_PLAIN, PCB_SET_WAIT_UNSET = range(4)


def pressure_cb(mode, wait_current=False, hold100us=0):
    """Sets/replaces/removes the pressure callback (op_pressure)."""
    return threaded(PRESSURE_CB, 0, mode | wait_current << 2 | hold100us << 3)


def reporters(t, pairs=8, which=7, quiet_cap1=False, cap_sel=1, size_sel=1, len_sel=2, rows_sel=2):
    """Reports on a helper beside alloc/free pairs, then checked quiet (op_reporters);
    which: bit0 live report, bit1 find_old, bit2 snapshot (1..7)."""
    a = (pairs - 1) | (which - 1) << 4 | quiet_cap1 << 7
    return threaded(REPORTERS, t, a, cap_sel | size_sel << 2 | len_sel << 4 | rows_sel << 6)


def misuse(variant, arg=0, extra=0):
    return op("MISUSE", 0, variant, arg, extra)


def introspect(v):
    return op("INTROSPECT", 0, v)


# gma_config_parse text (op_config in fuzz_gma.c: its key and value tables, by index)
CFG_KEYS = ["device", "device_id", "memory_limit", "small_size", "small_segment", "large_segment",
            "reuse", "bin_max", "bin_depth", "bins", "sim_capacity", "trim_interval_ms",
            "release_threshold", "idle_ms", "grow_ahead", "worker", "ring_size", "future_timeout_ms",
            "expandable_segments", "trace", "fallback", "host_release_threshold", "sim_alloc_ns",
            "sim_free_ns", "sim_event_ns", "sim_fail_alloc", "sim_fail_event", "no_such_key", "",
            "DEVICE"]
CFG_VALUES = ["0", "1", "2", "on", "off", "true", "false", "sim", "cuda", "auto", "query", "wait",
              "none", "host", "512", "1K", "2M", "64M", "1G", "3T", "2048T", "7", "65536", "1048577",
              "-1", "", "18446744073709551615", "18446744073709551616", "1.5", "0x10", "/dev/null",
              "12abc"]


def config_parse(pairs):
    """INTROSPECT variant 7: gma_config_parse of "key:value,..." (and gma_create of it)."""
    out = [len(pairs)]
    for k, v in pairs:
        out += [CFG_KEYS.index(k), CFG_VALUES.index(v)]
    return op("INTROSPECT", 0, 7, *out)


def sleep(units):  # 8 us each
    return op("SLEEP", 0, units)


# Planned memory (plan=True in config): SLEEP's argument by its top two bits.
def plan_mark():
    return op("SLEEP", 0, 0x40)


def plan_loop(n=8, reps=10, threads=0, sizes=0):
    # n allocations (2..17) a loop, reps 4/6/8/10 iterations with a mark after each;
    # threads: 2 bits per allocation, cycled; sizes: a seed of sizes and temporaries
    return op("SLEEP", 0, 0x80 | (n - 2) | ((reps - 4) // 2) << 4, threads, sizes)


def plan_repeat(k=4, reps=9):  # the last k operations (1..15), reps 3/5/7/9 rounds
    return op("SLEEP", 0, 0xC0 | (k - 1) | ((reps - 3) // 2) << 4)


# Issue 35: PLAN_MARK's argument 0x7C-0x7E (fuzz_gma.c, op_plan_race_free and below).
def plan_race_free(rounds=4, streams=1, helper_spins=False, kernel=False, which=0, c=0):
    """A live planned block (the model's, or the last plan_loop's first request after a
    mark) used on 1-4 more streams, then freed by two threads at once; rounds 1-4, each
    naming one more stream; c: spin (c * 8), first stream named, kernel hold, stream."""
    b = (rounds - 1) | ((streams - 1) % 3) << 2 | helper_spins << 4 | kernel << 5 | which << 6
    return op("SLEEP", 0, 0x7C, b, c)


IDLE_REQUEST, IDLE_TRIM0, IDLE_EMPTY, IDLE_ASYNC = range(4)


def plan_idle(t=0, how=IDLE_REQUEST, legacy_block=False, legacy_fill=False, free_all=False,
              on_legacy=False, slack_mib=0, legacy_mib=6, legacy_less_4k=0):
    """Nothing planned live, optionally a block of the legacy stream cached beside the
    arena, then the idle arena is needed: a request that fits only without it (sync or
    async), gma_trim(g, 0) or gma_empty_cache."""
    b = (how | legacy_block << 2 | legacy_fill << 3 | free_all << 4 | on_legacy << 5 |
         slack_mib << 6)
    return op("SLEEP", t, 0x7D, b, (legacy_mib - 1) | legacy_less_4k << 3)


def plan_oom_busy(y_slot=0, gated=True, on_planned=False, slack_mib=0, c=0):
    """A planned block live; the rest of the room freed on another stream behind a kernel
    (gated: gate c & 3; else held (c >> 2) & 63 us); a request of that size elsewhere."""
    b = y_slot | gated << 3 | on_planned << 4 | slack_mib << 5
    return op("SLEEP", 0, 0x7E, b, c)


def sync_all():
    return op("SYNC_ALL", 0)


def default_mode():
    return op("DEFAULT_MODE", 3)


SEEDS = {}


def seed(name, cfg, *ops):
    SEEDS[name] = cfg + b"".join(ops)


# 1. allocation and free on every logical thread, sizes tiny to large
seed("basic_alloc_free", config(worker=False),
     alloc(0, size(TINY, 100)), alloc(1, size(SMALL, 2000)), alloc(2, size(MID, 5000)),
     alloc(3, size(LARGE, 3000)), alloc(0, size(HUGE, 100)), alloc(1, size(GIANT, 10)),
     free(0, 0), free(1, 1), alloc(0, size(TINY, 100)), free(2), free(3), free(0), free(1),
     alloc(2, popular(1)), free(2), alloc(2, popular(1)), free(2))
# 2. same-stream reuse under running kernels
seed("kernel_same_stream", config(worker=False),
     alloc(0, popular(3)), fill(0), check(0), hold(0, us=40), free(0),
     alloc(0, popular(3)), fill(0), hold(0, us=10), check(0), sync(0), free(0))
# 3. a gated kernel holds a block; freed; other streams allocate the same size
seed("gated_cross_stream", config(worker=False),
     alloc(0, popular(4)), hold(0, gate=0), free(0), alloc(1, popular(4)), fill(1),
     alloc(2, popular(4)), hold(2, us=5), alloc(3, popular(4)), fill(3), gate_open(0),
     sync(0), alloc(1, popular(4)), fill(1), check(1), free(1), free(1), free(2), free(3))
# 4. record_stream with a kernel on the other stream, then reuse on the owner
seed("record_stream_kernels", config(worker=False),
     alloc(0, popular(5)), fill(0), record(0, 0, 1, kernel=True, gated=True), free(0),
     alloc(0, popular(5)), fill(0), hold(0, us=30), alloc(1, popular(5)), fill(1),
     gate_open(0), sync_all(), free(0), free(1), alloc(2, size(MID, 100)),
     record(2, 0, 3, kernel=False), record(2, 0, 0, kernel=True), free(2))
# 5. futures: wait, poll, release with and without waiting
seed("async_basic", config(worker=True, tick=3),
     async_(0, popular(2)), poll(0), wait(0, 3), async_(1, popular(6), timeout=3), poll(0),
     wait(0, 1), wait(0, 3), release(0), async_(2, size(LARGE, 10)), release(0),
     async_(3, size(HUGE, 10)), wait(0, 7), release(0), free(0), free(1), free(2), free(3))
# 6. a tiny ring: nonblocking requests may be refused with BUSY
seed("async_busy_ring", config(worker=True, small=True, tick=3),
     async_(0, size(GIANT, 100), nonblocking=True), async_(1, size(GIANT, 200), nonblocking=True),
     async_(2, size(GIANT, 300), nonblocking=True), async_(0, size(GIANT, 400), nonblocking=True),
     poll(0), poll(1), wait(0, 3), wait(1, 3), release(0), release(0), release(0), release(0))
# 6b. chains through a tiny ring: callbacks on the worker submit the next
# request (worker_only and nonblocking ones too); first three chains wait for
# memory until one free lets the worker serve them in one pass, so their
# callbacks submit three requests into a ring that holds one; one chain starts
# complete at once (a bin hit), its callback on the fuzzer's thread
seed("async_chain_ring", config(worker=True, small=True, tick=3),
     alloc(0, edge(8)), async_chain(1, size(MID, 10), timeout=3, child=9),
     async_chain(2, size(MID, 20), timeout=3, child=10, child_nonblocking=True),
     async_chain(3, size(MID, 30), timeout=3, child=11, child_worker_only=True), free(0),
     wait(0, 3), release(0), wait(0, 3), release(0), wait(0, 3), release(0),
     wait(0, 3), release(0), wait(0, 3), release(0), wait(0, 3), release(0),
     async_chain(0, size(GIANT, 100), child=64, child_worker_only=True),
     async_chain(1, size(GIANT, 200), child=2, child_nonblocking=True),
     async_chain(2, size(GIANT, 300), child=3, child_worker_only=True, child_nonblocking=True),
     wait(0, 3), release(0), wait(0, 3), release(0), wait(0, 7), release(0), poll(0),
     release(0), release(0), release(0),
     alloc(3, size(TINY, 100)), free(3), async_chain(3, size(TINY, 100), child=1),
     async_chain(0, size(GIANT, 400), child=4, nonblocking=True, child_nonblocking=True),
     poll(0), wait(0, 3), wait(1, 3), wait(2, 3), poll(3), release(0), release(1), wait(1, 7))
# 6c. chains still waiting for memory when gma_destroy runs (end mode 8: futures
# kept across it): cancelled requests submit nothing, the rest is cancelled
seed("async_chain_destroy", config(worker=True, small=True, tick=3, end=8),
     alloc(0, size(GIANT, 8000)), async_chain(1, size(GIANT, 8000), timeout=0, child=5),
     async_chain(2, size(TINY, 10), child=6, child_worker_only=True),
     async_chain(3, size(MID, 10), child=7), poll(0), poll(1))
# 7. async batches, collected and released
seed("async_batch", config(worker=True),
     async_batch(0, [size(SMALL, 10), size(MID, 10), size(TINY, 1)]), wait(0, 3),
     async_batch(1, [popular(0), popular(1)]), release(0), release(0),
     free(0), free(0), free(0), async_batch(2, [size(HUGE, 1), size(HUGE, 2)], timeout=1),
     poll(0), wait(0, 2))
# 8. synchronous batches: contiguous, split, failing
seed("batch", config(worker=False),
     batch(0, [size(SMALL, 1), size(SMALL, 2), size(MID, 3)]),
     batch(1, [popular(5), popular(5), popular(6)], small=False),
     free(0), free(0), batch(2, [edge(0), size(SMALL, 2)]),
     batch(3, [size(GIANT, 8000), size(GIANT, 8000)], small=False),
     free(1), free(0), free(1), free(1))
# 9. trims and empty_cache with memory cached on streams
seed("trim_empty", config(worker=False),
     alloc(0, popular(7)), alloc(1, popular(6)), alloc(2, size(MID, 9)), free(0), free(1),
     trim(2), trim(1), empty(), sync_all(), empty(), trim(0), trim(3), free(2), empty())
# 10. streams retired and destroyed with live blocks; recycled handles
seed("stream_churn", config(worker=False),
     alloc(0, popular(4)), hold(0, us=30), alloc(1, popular(2)), retire(0), alloc(0, popular(4)),
     destroy(1), destroy(1), alloc(1, popular(2)), destroy(0), destroy(0), free(0), free(0),
     free(1), free(1), retire(3), alloc(3, popular(1)), free(3), misuse(7, 0))
# 11. pinned host memory: host writes, copies (kernels), reuse
seed("host_pool", config(worker=False),
     host_alloc(0, size(MID, 10)), host_kernel(0, 0x80), host_free(0),
     host_alloc(1, size(MID, 10)), host_alloc(2, popular(3)), host_kernel(1, 5), host_kernel(1, 0x40),
     gate_open(0), sync_all(), host_free(0), host_free(0), empty(),
     host_alloc(3, size(SMALL, 3)), host_free(0))
# 12. every misuse variant on a populated allocator
seed("misuse_all", config(worker=True, tick=3),
     alloc(0, popular(4)), alloc(1, popular(0)), host_alloc(2, popular(1)), free(1),
     *[misuse(v, 0, 1) for v in range(16)], free(0), host_free(0), *[misuse(v, 1, 2) for v in (0, 4, 11, 13)])
# 13. pointer info, warm-up reserve, introspection
seed("introspect_reserve", config(worker=True, trace=True),
     alloc(0, size(LARGE, 100), tag=1), pinfo(0, 7), reserve(1, [(popular(1), 3), (popular(3), 2)]),
     alloc(1, popular(1)), introspect(0), introspect(12), introspect(1), introspect(6),
     introspect(2), introspect(3), free(0), free(1))
# 14. out of memory on a 32 MiB device
seed("oom_small_device", config(worker=False, cap=0),
     alloc(0, size(GIANT, 6000)), alloc(1, size(GIANT, 6000)), alloc(2, edge(8)), alloc(3, edge(9)),
     hold(0, gate=1), free(0), alloc(1, size(GIANT, 6000)), gate_open(1), sync_all(),
     alloc(1, size(GIANT, 6000)), free(1), free(1))
# 15. the CPU fallback after OOM
seed("fallback_host", config(worker=False, cap=0, fallback=True),
     alloc(0, size(GIANT, 7000)), alloc(1, size(GIANT, 7000)), alloc(2, size(GIANT, 7000)),
     fill(2), check(2), record(2, 0, 1), pinfo(0, 1), misuse(12, 0), free(2), free(1), free(0))
# 16. growable segments with a worker trimming every millisecond
seed("expandable_worker_trim", config(worker=True, expandable=True, tick=0),
     alloc(0, size(GIANT, 500)), alloc(1, size(HUGE, 500)), hold(0, gate=2), free(0),
     sleep(200), alloc(2, size(GIANT, 500)), fill(2), gate_open(2), sleep(250), free(1),
     free(2), alloc(0, popular(6)), sleep(100), free(0))
# 17. injected device faults (an allocation, an event)
seed("faults", config(worker=False, faults=True, fail_alloc=2, fail_event=1),
     alloc(0, size(GIANT, 10)), alloc(1, size(GIANT, 10)), alloc(2, size(GIANT, 10)), free(0),
     free(1), free(2), retire(0), alloc(0, popular(2)), host_alloc(1, popular(2)), host_free(0),
     free(0), destroy(2))
# 18. reuse:wait, many streams sharing sizes
seed("reuse_wait", config(worker=False, reuse=1),
     alloc(0, popular(5)), fill(0), free(0), alloc(1, popular(5)), fill(1), free(1),
     alloc(2, popular(5)), hold(2, us=50), free(2), alloc(3, popular(5)), free(3), sync_all())
# 19. reuse:none: blocks stay with their streams
seed("reuse_none", config(worker=True, reuse=2, tick=1),
     alloc(0, popular(4)), free(0), alloc(1, popular(4)), free(1), empty(), retire(0),
     alloc(0, popular(4)), free(0))
# 20. bins off
seed("bins_off", config(worker=False, bins_off=True),
     alloc(0, size(TINY, 50)), free(0), alloc(0, size(TINY, 50)), alloc(1, popular(2)), fill(1),
     free(1), free(0))
# 21. end mode: futures released without waiting
seed("end_release_futures", config(worker=True, end=6),
     alloc(0, size(GIANT, 7000)), async_(1, size(GIANT, 7000), timeout=3),
     async_(2, size(GIANT, 7000), timeout=3), async_(3, popular(3)))
# 22. end mode: a leaked block (gma_destroy must say GMA_ERR_LEAK)
seed("end_leak", config(worker=False, end=7), alloc(0, popular(2), tag=2), alloc(1, popular(3)))
# 23. end mode: futures kept across gma_destroy
seed("end_keep_futures", config(worker=True, end=8),
     async_(0, size(GIANT, 8000), timeout=3), async_(1, popular(1)), wait(0, 7))
# 24. the per-thread default stream
seed("per_thread_stream", config(worker=True),
     default_mode(), alloc(3, popular(2)), fill(3), hold(3, us=10), async_(0, popular(2), any_stream=4),
     retire(3), alloc(3, popular(2)), destroy(3), free(3), free(3), default_mode(), alloc(3, popular(2)),
     free(3))
# 25. small knobs: bin depth 2, 64 KiB bins, small segments, 3/4 memory limit
seed("small_knobs", config(worker=True, small=True, smallseg=True, limit34=True, tick=2),
     *[alloc(i % 3, size(MID, 100 * i)) for i in range(8)], *[free(i % 3) for i in range(8)],
     alloc(0, edge(2)), alloc(1, edge(3)), alloc(2, edge(8)), free(0), free(1), free(2))
# 26. memory pressure with the callback and growth ahead
seed("pressure_grow_ahead", config(worker=True, cap=0, grow=True, tick=0, pressure=True),
     alloc(0, size(GIANT, 5000)), sleep(250), alloc(1, size(GIANT, 2000)), sleep(250), free(0),
     sleep(250), free(1))
# 27. tags, valid and invalid
seed("tags", config(worker=False),
     alloc(0, popular(1), tag=0), alloc(1, popular(1), tag=3), alloc(2, popular(1), tag=6),
     alloc(3, popular(1), tag=7), pinfo(0), pinfo(1), free(0), free(1), alloc(0, popular(1)), pinfo(2))
# 28. mixed workload across threads with syncs
seed("mixed_workload", config(worker=True, tick=1, rel8m=True),
     *[b for i in range(12) for b in (alloc(i % 4, size(i % 6, 300 * i)), fill(i % 4, i),
                                      hold(i % 4, i, us=i), free((i + 1) % 4, i))],
     sync_all(), *[free(i % 4) for i in range(12)])
# 29. sizes at the edges
seed("edge_sizes", config(worker=False),
     *[alloc(i % 4, edge(i)) for i in range(16)], *[free(i % 4) for i in range(16)],
     batch(0, [edge(1), edge(11), edge(12), edge(13)]), free(0), free(0), free(0), free(0))
# 30. destroying a stream while its gated kernels still run
seed("destroy_busy_stream", config(worker=True, tick=0),
     alloc(0, popular(4)), hold(0, gate=3), alloc(0, popular(5)), free(0), destroy(0), destroy(0),
     alloc(1, popular(4)), fill(1), gate_open(3), sleep(100), free(0), free(1), empty())

# 31. GMA_CONF text: accepted, refused, and allocators made from it
seed("config_parse", config(worker=True),
     config_parse([("reuse", "wait"), ("bin_max", "64M"), ("expandable_segments", "true")]),
     config_parse([("memory_limit", "1K")]), config_parse([("no_such_key", "1")]),
     config_parse([("ring_size", "7"), ("worker", "off")]),
     config_parse([("sim_capacity", "2M"), ("fallback", "host"), ("trace", "/dev/null")]),
     alloc(0, popular(1)), free(0))

# --- issue 13: the operations the outside probe needed ---
# 32. gma_reserve with counts that wrap, huge counts, NULL arrays, impossible sizes
seed("reserve_adversarial", config(worker=True),
     alloc(0, popular(1)), reserve(0, [(popular(1), 2)]),
     reserve_bad(0, 6, 1), reserve_bad(1, 7, 2), reserve_bad(2, 8, 0),
     reserve_bad(0, 9, 0x01), reserve_bad(1, 9, 0x06), reserve_bad(2, 9, 0x1a), reserve_bad(3, 9, 0x0e),
     reserve_bad(0, 0), reserve_bad(1, 1), reserve_bad(2, 2), reserve_bad(3, 3),
     reserve_bad(0, 4), reserve_bad(1, 5, 3), free(0))
# 33. frees on a helper thread racing gma_stream_destroy of their stream
seed("race_free_stream_destroy", config(worker=False),
     race_destroy(0, blocks=16, rounds=4, spin=64), race_destroy(1, blocks=8, rounds=4, main_spins=True, spin=4),
     alloc(2, popular(1)), race_destroy(2, blocks=4, rounds=2, hold=True, hold_us=20, size_sel=1),
     free(2), race_destroy(3, blocks=16, rounds=4, size_sel=3, spin=5))
seed("race_free_stream_destroy_worker", config(worker=True, tick=0),
     race_destroy(0, blocks=16, rounds=4, spin=60), race_destroy(1, blocks=16, rounds=4, main_spins=True),
     race_destroy(2, blocks=8, rounds=4, hold=True, hold_us=5, size_sel=2))
# 34. threads that use their per-thread default stream and exit
seed("per_thread_stream_exit", config(worker=True),
     ptds_thread(blocks=4, rounds=2), alloc(0, popular(1)), ptds_thread(blocks=8, rounds=3, sync_exit=True),
     free(0), ptds_thread(blocks=2, kernels=False, one_size=True, size_sel=6))
seed("per_thread_stream_exit_no_worker", config(worker=False, cap=0),
     ptds_thread(blocks=3, rounds=1, size_sel=0), ptds_thread(blocks=8, rounds=2, size_sel=4))
# 35. the pressure callback set, replaced and removed while it runs
seed("pressure_callback_swap", config(worker=True, cap=0, tick=0, pressure=True),
     pressure_cb(PCB_SET, hold100us=5), pressure_cb(PCB_SET, wait_current=True, hold100us=10),
     alloc(0, size(GIANT, 6000)), sleep(100), pressure_cb(PCB_UNSET, wait_current=True),
     pressure_cb(PCB_SET_WAIT_UNSET, hold100us=20), pressure_cb(PCB_PLAIN), free(0),
     pressure_cb(PCB_SET, hold100us=1), sleep(200))
seed("pressure_callback_no_worker", config(worker=False), pressure_cb(PCB_SET), pressure_cb(PCB_UNSET))
# 36. the reports on a helper thread beside bin-hit alloc/free pairs; then with nothing live
seed("reporters_concurrent", config(worker=True),
     alloc(0, popular(1), tag=1), alloc(1, popular(3)), reporters(0, pairs=16, which=7),
     reporters(1, pairs=4, which=2, cap_sel=3, len_sel=0, rows_sel=3), free(0), free(1),
     reporters(3, pairs=8, which=3, quiet_cap1=True, len_sel=1, rows_sel=1))

# 37-41. planned memory (plan:on, issue 18): a loop gets a plan and is served
# from it; a new shape re-plans; planned blocks used on other streams behind
# gated kernels; ordinary operations repeated with marks; faults at activation;
# a planned block leaked at the end.
seed("plan_loop", config(worker=True, plan=True),
     plan_loop(10, 10, threads=0x00, sizes=1), plan_loop(10, 6, threads=0x00, sizes=1),
     plan_loop(6, 10, threads=0x00, sizes=2), alloc(0, popular(1)), free(0))
seed("plan_streams_gated", config(worker=False, plan=True),
     plan_loop(8, 10, threads=0xE4, sizes=3),
     alloc(0, popular(5)), hold(0, 0, gate=1), record(0, 0, 1, kernel=True, gated=True), free(0),
     plan_loop(8, 6, threads=0xE4, sizes=3), gate_open(1), sync_all(),
     plan_loop(8, 4, threads=0xE4, sizes=3), misuse(0, 0), misuse(1, 0))
seed("plan_repeat", config(worker=True, plan=True, tick=1),
     alloc(0, popular(3)), alloc(1, popular(1)), free(0), free(1), alloc(0, size(SMALL, 100)),
     free(0), plan_repeat(6, 9), plan_repeat(6, 5), pinfo(0), plan_mark())
seed("plan_faults", config(worker=False, plan=True, faults=True, fail_alloc=5, fail_event=1),
     plan_loop(6, 10, threads=0x55, sizes=4), plan_loop(9, 10, threads=0x00, sizes=5))
seed("plan_leak", config(worker=True, plan=True, end=7),
     plan_loop(4, 10, threads=0x00, sizes=6), plan_mark(), alloc(0, popular(0)))

# 42-45. issue 35: racing frees of a planned block; an idle plan's arena needed by a
# request, gma_trim(g, 0), gma_empty_cache and an async request, with a block of the
# legacy stream cached beside it; a request that fits once a kernel completes while a
# planned block is live. Traced to a temporary file: the rows of planned blocks are
# checked too.
seed("plan_race_free", config(worker=False, plan=True, trace=True),
     plan_loop(8, 10, threads=0x00, sizes=1),
     plan_race_free(rounds=4, streams=1, c=0), plan_race_free(rounds=4, streams=1, c=1,
                                                            helper_spins=True),
     plan_race_free(rounds=4, streams=2, kernel=True, c=3), plan_race_free(rounds=4, c=64),
     plan_race_free(rounds=4, streams=3, helper_spins=True, c=9))
seed("plan_race_free_worker", config(worker=True, plan=True, idle_long=True, trace=True),
     plan_loop(6, 10, threads=0xE4, sizes=3),
     *[plan_race_free(rounds=4, streams=1 + i % 3, helper_spins=bool(i & 1), c=i * 5)
       for i in range(6)])
# an idle plan's arena beside a block cached on its (the legacy) stream, dropped by
# gma_empty_cache: the counts stay exact (the plan's blocks on the legacy stream
# too, so that the arena goes back cached there, beside the block)
seed("plan_idle_empty_beside", config(worker=False, plan=True, trace=True),
     plan_loop(12, 10, threads=0xFF, sizes=0), plan_idle(t=3, how=IDLE_EMPTY, legacy_block=True),
     plan_loop(12, 10, threads=0xFF, sizes=2), plan_idle(t=3, how=IDLE_EMPTY, legacy_block=True,
                                                        legacy_fill=True, legacy_mib=3))
# gma_trim(g, 0) gives an idle arena back (a trim that can keep it keeps the plan)
seed("plan_idle_trim0", config(worker=False, plan=True, trace=True),
     plan_loop(12, 10, threads=0xFF, sizes=5), trim(3),
     plan_idle(t=3, how=IDLE_TRIM0, legacy_block=True),
     plan_loop(8, 10, threads=0x00, sizes=1), plan_idle(how=IDLE_TRIM0))
# requests that fit only once the idle arena goes back: synchronous, async, and with
# nothing else live (then it must succeed)
seed("plan_idle_request", config(worker=False, plan=True, limit34=True, trace=True),
     plan_loop(12, 10, threads=0xFF, sizes=6), plan_idle(t=3, how=IDLE_REQUEST, legacy_block=True),
     plan_loop(8, 10, threads=0x00, sizes=1), alloc(1, popular(3)),
     plan_idle(how=IDLE_REQUEST, free_all=True, on_legacy=True),
     plan_loop(6, 10, threads=0x00, sizes=2), plan_idle(t=1, how=IDLE_REQUEST, slack_mib=2))
seed("plan_idle_request_worker", config(worker=True, plan=True, cap=0, trace=True),
     plan_loop(6, 10, threads=0x00, sizes=2), plan_idle(how=IDLE_REQUEST, legacy_block=True,
                                                       on_legacy=True),
     plan_loop(6, 10, threads=0x00, sizes=2), plan_idle(how=IDLE_REQUEST, free_all=True))
seed("plan_idle_async", config(worker=True, plan=True, limit34=True, idle_long=True, trace=True),
     plan_loop(8, 10, threads=0x00, sizes=1), plan_idle(how=IDLE_ASYNC, slack_mib=1),
     plan_loop(8, 10, threads=0x00, sizes=1), plan_idle(how=IDLE_ASYNC, free_all=True))
seed("plan_oom_busy", config(worker=True, plan=True, limit34=True, idle_long=True, trace=True),
     plan_loop(8, 10, threads=0x00, sizes=1), plan_oom_busy(y_slot=1, gated=True, c=0),
     gate_open(0), sync_all(), plan_oom_busy(y_slot=2, gated=False, on_planned=True, c=0xFC),
     plan_oom_busy(y_slot=3, gated=True, c=1), gate_open(1), sync_all(),
     plan_oom_busy(y_slot=1, gated=True, on_planned=True, c=2))

# Minimal inputs of the issue-13 findings (written to ../regressions/; they fail
# until the fixes land): name -> bytes.
REGRESSIONS = {
    # ASan heap-buffer-overflow in gma_reserve: counts {SIZE_MAX, 2} sum to 1
    "issue13_reserve_count_wraps": config(worker=False) + reserve_bad(0, 0),
    # memory freed into the bin of a stream being destroyed stays stranded
    "issue13_race_destroy_strands": config(worker=False) + b"".join(
        race_destroy(t % 3, blocks=16, rounds=4, spin=spin)
        for t, spin in enumerate([64, 60, 68, 64, 56, 72, 64, 64])),
    # an exited thread's per-thread stream keeps its cached memory
    "issue13_ptds_exit_strands": config(worker=True) + ptds_thread(blocks=2, kernels=False),
    # the unset returns while the callback runs; the fuzzer frees its context
    "issue13_pressure_unset_uaf": config(worker=True, tick=0) + pressure_cb(PCB_SET_WAIT_UNSET),
    # gma_find_old_allocations with cap > 0 when nothing is live: memcpy(out, NULL, 0)
    "issue13_find_old_none_live": config(worker=False) + reporters(0, pairs=1, which=4),
    # report.c reads a block's requested while the lock-free bin path writes it (TSan)
    # (a block stays live throughout: n > 0, so the memcpy above is not reached)
    "issue13_report_requested_race": config(worker=False) + alloc(0, popular(1)) +
        reporters(0, pairs=16, which=3) * 6,
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "corpus")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"{len(SEEDS)} seeds, {sum(len(d) for d in SEEDS.values())} bytes in {out}")
    if len(sys.argv) <= 1:  # the default layout: the regression inputs too
        reg = os.path.join(HERE, "regressions")
        for name, data in REGRESSIONS.items():
            with open(os.path.join(reg, name), "wb") as f:
                f.write(data)
        print(f"{len(REGRESSIONS)} issue-13 inputs in {reg}")


if __name__ == "__main__":
    main()
