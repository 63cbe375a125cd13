"""The Python binding (python/gma) end to end on the simulated device:
allocation and freeing, every error raised as the right gma.Error subclass
with gma's message, futures (ready at once, served by the worker, a wait
running out, the request timing out, release before and after completion,
batches), batches, trimming, iteration marks (plan), statistics, the
summary, snapshots, streams, record_stream gating a free behind another
stream's kernel, traces, tags, pointer_info and pinned host memory (when
libgma has them), and calls from several threads. Run by CTest with GMA_LIBRARY naming the build's libgma."""
import ctypes
import json
import os
import tempfile
import threading
import time
import unittest

from common import KiB, MiB, c_stderr, round512, run

import gma
from gma import _lib

SIM = "device:sim"


def wait_until(cond, seconds=5.0, step=0.002):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


def accounting_holds(s):
    return (s["reserved"]["current"] == s["allocated"]["current"] + s["stream_cached_bytes"]
            + s["pending_bytes"] + s["free_bytes"]
            and s["cached"]["current"] == s["reserved"]["current"] - s["allocated"]["current"]
            and s["active"]["current"] == s["allocated"]["current"] + s["pending_bytes"])


class Library(unittest.TestCase):
    def test_loaded_from_gma_library(self):
        self.assertEqual(gma.library_path(), os.environ["GMA_LIBRARY"])
        self.assertRegex(gma.version(), r"^\d+\.\d+\.\d+$")

    def test_status_table_matches_libgma(self):
        # Every status libgma knows has its own class, named after it.
        names = {}
        for v in range(-64, 64):
            n = gma.status_name(v)
            if n != "GMA_UNKNOWN_STATUS":
                names[v] = n
        self.assertEqual(names[0], "GMA_OK")
        expected = {
            -1: "InvalidArgument", -2: "InvalidSize", -3: "OutOfMemory", -4: "InvalidPointer",
            -5: "DoubleFree", -6: "ConfigError", -7: "DeviceError", -8: "NoDevice",
            -9: "Unsupported", -10: "Leak", -11: "InternalError", -12: "Timeout", -13: "Busy",
            -14: "Cancelled", -15: "AlreadyCollected", 1: "Pending",
        }
        self.assertEqual(sorted(v for v in names if v), sorted(expected),
                         "libgma's statuses and gma's exception classes differ")
        for v, cls_name in expected.items():
            cls = getattr(gma, cls_name)
            self.assertEqual(cls.status, v)
            self.assertTrue(issubclass(cls, gma.Error))
            e = gma._error(v, "f", "detail")
            self.assertIs(type(e), cls)
            self.assertEqual(e.status_name, names[v])
            self.assertEqual(e.strerror, gma.strerror(v))
        self.assertTrue(issubclass(gma.OutOfMemory, MemoryError))
        self.assertTrue(issubclass(gma.InvalidSize, ValueError))

    def test_devices(self):
        n = gma.device_count()
        self.assertIsInstance(n, int)
        self.assertGreaterEqual(n, 0)
        if n == 0:
            with self.assertRaises(gma.NoDevice) as cm:
                gma.select_device(1)
            self.assertTrue(cm.exception.detail)


class Basics(unittest.TestCase):
    def setUp(self):
        self.a = gma.Allocator(SIM)

    def tearDown(self):
        if not self.a.closed:
            self.a.close()

    def test_alloc_free_and_counts(self):
        a = self.a
        self.assertEqual(a.device_name, "sim")
        p = a.alloc(1000)
        self.assertIsInstance(p, int)
        self.assertEqual(p % 256, 0)
        s = a.stats()
        self.assertEqual(s["num_allocs"], 1)
        self.assertEqual(s["allocated"]["current"], 1024)  # rounded to 512
        self.assertEqual(s["requested"]["current"], 1000)
        a.free(p)
        a.free(None)  # a no-op, like gma_free(g, NULL)
        s = a.stats()
        self.assertEqual((s["num_frees"], s["allocated"]["current"]), (1, 0))
        self.assertEqual(s["allocated"]["peak"], 1024)
        self.assertTrue(accounting_holds(s))

    def test_errors_carry_status_and_message(self):
        a = self.a
        with self.assertRaises(gma.InvalidSize) as cm:
            a.alloc(0)
        e = cm.exception
        self.assertEqual(e.status, -2)
        self.assertEqual(e.status_name, "GMA_ERR_INVALID_SIZE")
        self.assertEqual(e.strerror, gma.strerror(-2))
        self.assertTrue(e.detail)
        self.assertIn(e.detail.split(": ", 1)[-1], str(e))
        self.assertIn("gma_alloc", str(e))
        with self.assertRaises(gma.InvalidSize):
            a.alloc(-5)
        with self.assertRaises(gma.InvalidSize):
            a.alloc(1 << 62)  # more than the device could ever hold
        self.assertEqual(a.stats()["num_allocs"], 0)

    def test_double_free_foreign_and_interior(self):
        a = self.a
        p = a.alloc(4096)
        buf = ctypes.create_string_buffer(4096)
        with self.assertRaises(gma.InvalidPointer) as cm:
            a.free(ctypes.addressof(buf))  # never came from gma
        self.assertIn("gma_free", cm.exception.detail)
        with self.assertRaises(gma.InvalidPointer) as cm:
            a.free(p + 512)  # inside a live block
        self.assertIn("interior", cm.exception.detail)
        before = a.stats()
        a.free(p)
        with self.assertRaises(gma.DoubleFree) as cm:
            a.free(p)
        self.assertIn("already freed", cm.exception.detail)
        self.assertEqual(a.stats()["num_frees"], before["num_frees"] + 1)

    def test_foreign_allocator_pointer(self):
        with gma.Allocator(SIM) as b:
            q = b.alloc(4096)
            with self.assertRaises(gma.InvalidPointer):
                self.a.free(q)
            b.free(q)

    def test_out_of_memory(self):
        with gma.Allocator("device:sim,sim_capacity:64M,bins:off") as a:
            big = a.alloc(50 * MiB)
            with self.assertRaises(gma.OutOfMemory) as cm:
                a.alloc(30 * MiB)
            e = cm.exception
            self.assertIsInstance(e, MemoryError)
            self.assertIn(str(30 * MiB), e.detail)  # gma says what was asked for
            self.assertEqual(a.stats()["num_ooms"], 1)
            a.free(big)
            a.free(a.alloc(30 * MiB))  # fits once big is gone

    def test_config_errors(self):
        with self.assertRaises(gma.ConfigError) as cm:
            gma.Allocator("device:sim,no_such_key:1")
        self.assertIn("no_such_key", cm.exception.detail)
        with self.assertRaises(gma.ConfigError):
            gma.Allocator("device:sim,bin_depth:0")
        with self.assertRaises(gma.ConfigError) as cm:  # refused when parsed
            gma.Allocator("device:sim,ring_size:1000")
        self.assertEqual(cm.exception.function, "gma_config_parse")
        old = os.environ.get("GMA_CONF")
        os.environ["GMA_CONF"] = "device:sim,bogus:1"
        try:
            with self.assertRaises(gma.ConfigError) as cm:
                gma.Allocator()
            self.assertIn("GMA_CONF", cm.exception.detail)
            self.assertEqual(str(cm.exception).count("GMA_ERR_CONFIG"), 1)  # one status name
            # use_env=False ignores the environment; conf wins over it otherwise.
            gma.Allocator(SIM, use_env=False).close()
        finally:
            os.environ["GMA_CONF"] = old if old is not None else ""

    def test_closed_and_leak(self):
        a = gma.Allocator(SIM)
        a.alloc(1 * MiB)
        with c_stderr() as err:
            with self.assertRaises(gma.Leak) as cm:
                a.close()
        self.assertIn("1 live allocation", cm.exception.detail)
        self.assertIn("live", err[0])  # gma's leak report on stderr
        self.assertTrue(a.closed)
        a.close()  # a second close does nothing
        with self.assertRaises(gma.InvalidArgument) as cm:
            a.alloc(512)
        self.assertIn("closed", str(cm.exception))
        with gma.Allocator(SIM) as b:
            b.free(b.alloc(512))
        self.assertTrue(b.closed)

    def test_leak_does_not_hide_another_exception(self):
        with self.assertRaises(KeyError):
            with c_stderr():
                with gma.Allocator(SIM) as a:
                    a.alloc(512)
                    raise KeyError("the caller's own error")

    def test_threads(self):
        a = self.a
        errors = []

        def work():
            try:
                s = a.stream_create()
                live = []
                for i in range(500):
                    live.append(a.alloc(512 * (1 + i % 8), stream=s))
                    if len(live) > 4:
                        a.free(live.pop(0))
                for p in live:
                    a.free(p)
                a.stream_destroy(s)
            except Exception as e:  # reported below
                errors.append(e)

        ts = [threading.Thread(target=work) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])
        s = a.stats()
        self.assertEqual((s["num_allocs"], s["num_frees"]), (2000, 2000))
        self.assertEqual(s["allocated"]["current"], 0)


class Streams(unittest.TestCase):
    def test_streams_and_stream_stats(self):
        with gma.Allocator(SIM) as a:
            s = a.stream_create()
            self.assertIsInstance(s, int)
            p = a.alloc(64 * KiB, stream=s)

            class CupyLike:  # anything with .ptr passes as a stream
                ptr = s

            q = a.alloc(64 * KiB, stream=CupyLike())
            ss = a.stream_stats(s)
            self.assertEqual((ss["allocs"], ss["allocated_bytes"]), (2, 128 * KiB))
            a.stream_synchronize(s)
            a.stream_synchronize()  # the default stream
            a.free(p)
            a.free(q)
            self.assertEqual(a.stream_stats(s)["frees"], 2)
            self.assertGreaterEqual(a.stats()["num_streams"], 1)
            a.stream_destroy(s)
            with self.assertRaises(gma.InvalidArgument):
                a.stream_stats(s)  # retired: gma forgot it
            with self.assertRaises(TypeError):
                a.alloc(512, stream="not a stream")

    def test_stream_wait_stream(self):
        with gma.Allocator(SIM) as a:
            s1, s2 = a.stream_create(), a.stream_create()
            seen = []
            gate = threading.Event()

            def producer():  # on s1: finishes only when the gate opens
                gate.wait(10)
                seen.append("produced")

            def consumer():  # on s2: after the producer, because s2 waits for s1
                seen.append("consumed")

            a.sim_launch(s1, producer)
            a.stream_wait_stream(s2, s1)
            a.sim_launch(s2, consumer)
            time.sleep(0.05)
            self.assertEqual(seen, [])  # the consumer waits on the device, not the host
            gate.set()
            a.stream_synchronize(s2)
            self.assertEqual(seen, ["produced", "consumed"])
            with self.assertRaises(gma.InvalidArgument) as cm:
                a.stream_wait_stream(s1, s1)
            self.assertIn("same stream", cm.exception.detail)
            a.stream_destroy(s1)
            with self.assertRaises(gma.InvalidArgument) as cm:
                a.stream_wait_stream(s2, s1)  # destroyed
            self.assertIn("not a live stream", cm.exception.detail)
            a.stream_destroy(s2)

    def test_record_stream_gates_the_free(self):
        # reuse:query: under the default (auto) s2, the stream that used p,
        # may take it behind a device-side wait (api_test_consumer_reuse).
        with gma.Allocator("device:sim,bins:off,reuse:query") as a:
            s1, s2 = a.stream_create(), a.stream_create()
            p = a.alloc(2 * MiB, stream=s1)
            gate, started = threading.Event(), threading.Event()

            def kernel():  # runs on s2's thread, "using" p until the gate opens
                started.set()
                gate.wait(10)

            a.sim_launch(s2, kernel)
            self.assertTrue(started.wait(5))
            a.record_stream(p, s2)
            a.free(p)
            s = a.stats()
            self.assertGreaterEqual(s["pending_bytes"], 2 * MiB)
            self.assertTrue(accounting_holds(s))
            # Neither stream may get p while s2's kernel runs.
            q1, q2 = a.alloc(2 * MiB, stream=s1), a.alloc(2 * MiB, stream=s2)
            self.assertNotIn(p, (q1, q2))
            a.empty_cache()
            self.assertGreaterEqual(a.stats()["pending_bytes"], 2 * MiB)  # not trimmed
            gate.set()
            a.stream_synchronize(s2)

            def drained():
                a.empty_cache()
                return a.stats()["pending_bytes"] == 0

            self.assertTrue(wait_until(drained))
            a.free(q1)
            a.free(q2)
            with self.assertRaises(gma.InvalidPointer):
                a.record_stream(p + 4096, s2)
            a.stream_destroy(s1)
            a.stream_destroy(s2)


class Futures(unittest.TestCase):
    def test_ready_at_once_and_worker(self):
        with gma.Allocator(SIM) as a:
            p = a.alloc(64 * KiB)
            a.free(p)  # now in the default stream's bin
            with a.alloc_async(64 * KiB) as f:
                self.assertTrue(f.poll())  # no worker hop
                self.assertEqual(f.wait(0), p)
                self.assertEqual(f.wait(), p)  # a second wait gives the same
            a.free(p)
            with a.alloc_async(8 * MiB) as f:  # above bin_max: the worker serves it
                q = f.wait()
                self.assertEqual(q % 256, 0)
                self.assertTrue(f.poll())
            s = a.stats()
            self.assertEqual((s["futures_submitted"], s["futures_ready"],
                              s["futures_ready_at_once"]), (2, 2, 1))
            self.assertEqual(s["allocated"]["current"], 8 * MiB)
            a.free(q)
            with self.assertRaises(gma.InvalidArgument):
                f.wait()  # released

    def test_back_pressure_wait_runs_out_and_timeout(self):
        with gma.Allocator("device:sim,sim_capacity:64M,bins:off") as a:
            big = a.alloc(50 * MiB)
            f = a.alloc_async(30 * MiB, timeout=10)  # fits only once big is freed
            time.sleep(0.05)
            self.assertFalse(f.poll())
            self.assertEqual(a.stats()["queue_depth"], 1)
            with self.assertRaises(gma.Pending):
                f.wait(0.01)  # this wait runs out; the request goes on
            a.free(big)
            q = f.wait(5)
            f.release()
            f.release()  # once only; the second does nothing
            g = a.alloc_async(50 * MiB, timeout=0.1)  # nobody frees: times out
            with self.assertRaises(gma.Timeout) as cm:
                g.wait()
            self.assertIn("waited", cm.exception.detail)
            with self.assertRaises(gma.Timeout):
                g.poll()
            g.release()
            s = a.stats()
            self.assertEqual((s["futures_timed_out"], s["futures_ready"], s["queue_depth"]),
                             (1, 1, 0))
            self.assertEqual(s["allocated"]["current"], 30 * MiB)
            a.free(q)

    def test_release_frees_what_nobody_collected(self):
        with gma.Allocator("device:sim,sim_capacity:64M,bins:off") as a:
            f = a.alloc_async(16 * MiB)
            self.assertTrue(wait_until(f.poll))
            f.release()  # completed, never collected: gma frees it
            self.assertEqual(a.stats()["allocated"]["current"], 0)
            big = a.alloc(50 * MiB)
            f = a.alloc_async(30 * MiB, timeout=10)
            time.sleep(0.02)
            f.release()  # still waiting: cancelled
            a.free(big)
            self.assertTrue(wait_until(lambda: a.stats()["queue_depth"] == 0))
            self.assertEqual(a.stats()["allocated"]["current"], 0)
            f = a.alloc_async(8 * MiB)
            del f  # collected: released by the finalizer
            self.assertTrue(wait_until(lambda: a.stats()["allocated"]["current"] == 0))

    def test_take(self):
        with gma.Allocator("device:sim,sim_capacity:64M,bins:off") as a:
            f = a.alloc_async(4 * MiB)
            p = f.take()  # waits, collects and releases
            self.assertTrue(p)
            self.assertEqual(a.stats()["allocated"]["current"], 4 * MiB)
            with self.assertRaises(gma.InvalidArgument):
                f.take()  # released
            a.free(p)
            big = a.alloc(50 * MiB)
            f = a.alloc_async(30 * MiB, timeout=10)  # fits only once big is freed
            with self.assertRaises(gma.Pending):
                f.take(0.01)  # ran out: the future stays alive
            self.assertFalse(f.poll())
            a.free(big)
            q = f.take(5)
            self.assertEqual(a.stats()["allocated"]["current"], 30 * MiB)
            g = a.alloc_async(40 * MiB, timeout=0.02)  # never fits beside q
            with self.assertRaises(gma.Timeout):
                g.take()
            with self.assertRaises(gma.InvalidArgument):
                g.poll()  # released by the failed take
            a.free(q)
            f = a.alloc_batch_async([1 * MiB, 3000])
            ptrs = f.take(5)
            self.assertEqual(len(set(ptrs)), 2)
            for x in ptrs:
                a.free(x)
            f = a.alloc_async(2 * MiB)
            r = f.wait(5)
            self.assertEqual(f.take(), r)  # collected by wait: take only releases
            a.free(r)
            self.assertEqual(a.stats()["allocated"]["current"], 0)

    def test_batch_future_and_bad_timeout(self):
        with gma.Allocator(SIM) as a:
            with a.alloc_batch_async([1 * MiB, 2 * MiB, 3000]) as f:
                ptrs = f.wait(5)
            self.assertEqual(len(ptrs), 3)
            self.assertEqual(len(set(ptrs)), 3)
            for p in ptrs:
                a.free(p)
            with self.assertRaises(gma.InvalidArgument):
                a.alloc_async(512, timeout=0)

    def test_destroy_cancels_pending(self):
        a = gma.Allocator("device:sim,sim_capacity:64M,bins:off")
        big = a.alloc(50 * MiB)
        f = a.alloc_async(30 * MiB, timeout=10)
        a.free(big)  # f may be served or not before the destroy...
        try:
            f.wait(5)
        except gma.Error:
            pass
        b = gma.Allocator("device:sim,sim_capacity:64M,bins:off")
        big = b.alloc(50 * MiB)
        g = b.alloc_async(30 * MiB, timeout=10)
        with c_stderr():
            try:
                b.close()  # big is a leak; g is still waiting
            except gma.Leak:
                pass
        with self.assertRaises(gma.Cancelled):
            g.wait(5)
        g.release()  # allowed after destroy
        with c_stderr():
            try:
                a.close()
            except gma.Leak:
                pass


class BatchesAndTrimming(unittest.TestCase):
    def test_batch(self):
        with gma.Allocator(SIM) as a:
            sizes = [1000, 2000, 3000]
            ptrs = a.alloc_batch(sizes)
            self.assertEqual(len(ptrs), 3)
            for i, p in enumerate(ptrs):  # one after another in one segment
                self.assertEqual(p % 256, 0)
                if i:
                    self.assertEqual(p, ptrs[i - 1] + round512(sizes[i - 1]))
            s = a.stats()
            self.assertEqual((s["num_batches"], s["num_allocs"]), (1, 3))
            self.assertEqual(s["requested"]["current"], 6000)
            for p in ptrs:
                a.free(p)

    def test_batch_is_all_or_nothing(self):
        with gma.Allocator("device:sim,sim_capacity:64M,bins:off") as a:
            keep = a.alloc(40 * MiB)
            with self.assertRaises(gma.OutOfMemory):
                a.alloc_batch([10 * MiB, 10 * MiB, 10 * MiB])
            s = a.stats()
            self.assertEqual((s["num_allocs"], s["allocated"]["current"]), (1, 40 * MiB))
            a.free(keep)

    def test_trim_and_empty_cache(self):
        with gma.Allocator("device:sim,bins:off") as a:
            p = [a.alloc(30 * MiB) for _ in range(4)]  # each its own segment
            for q in p[:3]:
                a.free(q)
            self.assertEqual(a.stats()["reserved"]["current"], 120 * MiB)
            a.trim(40 * MiB)  # 90 MiB cached: two segments go
            s = a.stats()
            self.assertEqual((s["reserved"]["current"], s["bytes_trimmed"], s["trims_explicit"]),
                             (60 * MiB, 60 * MiB, 1))
            a.trim()
            self.assertEqual(a.stats()["reserved"]["current"], 30 * MiB)
            a.free(p[3])
            a.empty_cache()
            s = a.stats()
            self.assertEqual((s["reserved"]["current"], s["num_segments"]), (0, 0))

    def test_iteration_mark(self):
        # plan:off (the default): a no-op, nothing planned, nothing counted.
        with gma.Allocator(SIM) as a:
            p = a.alloc(1 * MiB)
            a.iteration_mark()
            a.free(p)
            a.iteration_mark()
            s = a.stats()
            self.assertEqual({k: v for k, v in s.items() if k.startswith("plan_")},
                             {"plan_state": 0, "plan_hits": 0, "plan_misses": 0,
                              "plan_replans": 0, "plan_arena_bytes": 0, "plan_lower_bound": 0,
                              "plan_slots": 0, "plan_iterations": 0})
        closed = gma.Allocator(SIM)
        closed.close()
        with self.assertRaises(gma.InvalidArgument):
            closed.iteration_mark()
        # The config key reaches the struct the binding mirrors.
        cfg = _lib.new(_lib.Config)
        self.assertEqual(_lib.load().fn("gma_config_parse")(ctypes.byref(cfg), b"plan:on"), 0)
        self.assertEqual(cfg.plan, 1)
        with self.assertRaises(gma.ConfigError):
            gma.Allocator(SIM + ",plan:sometimes")
        # plan:on: the mark is counted (a libgma still building plan:on says
        # Unsupported; that is not the binding's failure).
        with gma.Allocator(SIM + ",plan:on") as a:
            try:
                a.iteration_mark()
            except gma.Unsupported:
                self.skipTest("this libgma does not implement plan:on yet")
            self.assertEqual(a.stats()["plan_iterations"], 1)

    def test_graph_pools(self):
        # The simulated device has no stream capture: pools work, captures
        # are refused with Unsupported; a released pool is refused after.
        with gma.Allocator(SIM) as a:
            pool = a.graph_pool()
            st = pool.stats()
            self.assertEqual((st["id"], st["reserved_bytes"], st["chunks"]), (1, 0, 0))
            self.assertEqual(a.stats()["graph_pools"], 1)
            with self.assertRaises(gma.Unsupported):
                a.capture_begin(None, pool)
            with self.assertRaises(gma.InvalidArgument):
                a.capture_end(None)
            pool.release()
            self.assertEqual(a.stats()["graph_pools"], 0)
            with self.assertRaises(gma.InvalidArgument):
                pool.stats()

    def test_reserve_warms_bins(self):
        with gma.Allocator(SIM) as a:
            s = a.stream_create()
            a.reserve([4 * KiB, 64 * KiB], [8, 4], stream=s)
            before = a.stats()
            p = a.alloc(4 * KiB, stream=s)
            after = a.stats()
            self.assertEqual(after["hits_bin"], before["hits_bin"] + 1)
            self.assertEqual(after["num_device_allocs"], before["num_device_allocs"])
            a.free(p)
            with self.assertRaises(gma.InvalidArgument):
                a.reserve([512], [1, 2])
            a.stream_destroy(s)


class Observing(unittest.TestCase):
    def test_stats_has_every_field(self):
        with gma.Allocator(SIM) as a:
            p = a.alloc(3 * MiB)
            s = a.stats()
            want = {name for name, _ in _lib.Stats._fields_} - {"size"}
            self.assertEqual(set(s), want)
            for name, ctype in _lib.Stats._fields_:
                if ctype is _lib.Stat:
                    self.assertEqual(set(s[name]), {"current", "peak", "total"}, name)
                    self.assertGreaterEqual(s[name]["peak"], s[name]["current"], name)
            self.assertIsInstance(s["fragmentation"], float)
            self.assertTrue(0.0 <= s["fragmentation"] <= 1.0)
            self.assertEqual(s["allocated"]["current"], 3 * MiB)
            self.assertEqual(s["reserved"]["current"], 20 * MiB)  # a large segment
            self.assertEqual(s["hits_device"], 1)
            self.assertEqual(s["num_segments"], 1)
            self.assertTrue(accounting_holds(s))
            a.free(p)

    def test_summary(self):
        with gma.Allocator(SIM) as a:
            p = a.alloc(1 * MiB)
            text = a.summary()
            self.assertIsInstance(text, str)
            self.assertIn("gma memory summary: device sim", text)
            self.assertRegex(text, r"allocated\s*\|\s*1\.00 MiB")
            self.assertIn("allocations / frees", text)
            a.free(p)

    def test_snapshot_has_the_live_blocks(self):
        with gma.Allocator(SIM) as a:
            s = a.stream_create()
            live = {a.alloc(1000): 1000, a.alloc(3 * MiB, stream=s): 3 * MiB}
            dead = a.alloc(4096)
            a.free(dead)
            snap = a.snapshot()
            self.assertEqual(snap["device"], "sim")
            self.assertEqual(snap["allocated"], sum(round512(n) for n in live.values()))
            blocks = {int(b["address"], 16): b for seg in snap["segments"]
                      for b in seg["blocks"]}
            for p, n in live.items():
                self.assertEqual(blocks[p]["state"], "live")
                self.assertEqual(blocks[p]["requested"], n)
            self.assertEqual(int(blocks[next(p for p, n in live.items() if n == 3 * MiB)]
                                 ["stream"], 16), s)
            self.assertNotEqual(blocks.get(dead, {}).get("state"), "live")
            self.assertEqual(sum(seg["size"] for seg in snap["segments"]), snap["reserved"])
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "snap.json")
                self.assertEqual(a.snapshot(path), path)
                with open(path) as fh:
                    self.assertEqual(len(json.load(fh)["segments"]), len(snap["segments"]))
            for p in live:
                a.free(p)
            with self.assertRaises(gma.InvalidArgument):
                a.snapshot("/nonexistent-dir/x.json")

    def test_trace(self):
        with gma.Allocator(SIM) as a, tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.csv")
            a.trace_start(path)
            p = a.alloc(4096)
            a.free(p)
            a.trace_stop()
            with open(path) as fh:
                text = fh.read()
            self.assertGreaterEqual(len(text.splitlines()), 3)  # a header, alloc, free
            self.assertIn("%x" % p, text.lower())


class NewApi(unittest.TestCase):
    """Tags, gma_pointer_info and pinned host memory: tested when libgma has them."""

    def need(self, *names):
        missing = [n for n in names if not gma.available(n)]
        if missing:
            print("  (libgma lacks %s: skipped)" % ", ".join(missing))
            self.skipTest("libgma lacks " + ", ".join(missing))

    def test_missing_function_raises_unsupported(self):
        lib = _lib.load()
        saved = lib._bound.get("gma_alloc_tagged", False)
        lib._bound["gma_alloc_tagged"] = None  # as if libgma were older
        try:
            with gma.Allocator(SIM) as a:
                with self.assertRaises(gma.Unsupported) as cm:
                    a.alloc(512, tag="x")
                self.assertIn("gma_alloc_tagged", str(cm.exception))
        finally:
            if saved is False:
                del lib._bound["gma_alloc_tagged"]
            else:
                lib._bound["gma_alloc_tagged"] = saved

    def test_tags_and_pointer_info(self):
        self.need("gma_alloc_tagged", "gma_pointer_info")
        with gma.Allocator(SIM) as a:
            s = a.stream_create()
            p = a.alloc(1000, stream=s, tag="weights")
            q = a.alloc(2000)
            info = a.pointer_info(p + 100)  # inside the block
            self.assertEqual(info, {"kind": "device", "base": p, "requested": 1000,
                                    "block_size": 1024, "stream": s, "tag": "weights"})
            self.assertEqual(a.pointer_info(q)["tag"], "untagged")
            self.assertIsNone(a.pointer_info(q)["stream"])
            self.assertIn("weights", a.summary())
            a.free(p)
            with self.assertRaises(gma.InvalidPointer):
                a.pointer_info(p)
            with self.assertRaises(gma.InvalidArgument):
                a.alloc(512, tag="")
            a.free(q)

    def test_host_memory(self):
        self.need("gma_host_alloc", "gma_host_free", "gma_pointer_info")
        with gma.Allocator(SIM) as a:
            h = a.host_alloc(10000)
            ctypes.memset(h, 0x5A, 10000)  # ordinary host memory on the sim
            self.assertEqual(ctypes.string_at(h + 9999, 1), b"\x5a")
            self.assertEqual(a.pointer_info(h)["kind"], "host_pinned")
            s = a.stats()
            self.assertEqual(s["num_host_allocs"], 1)
            self.assertGreaterEqual(s["host_allocated"]["current"], 10000)
            a.host_free(h)
            s = a.stats()
            self.assertEqual((s["num_host_frees"], s["host_allocated"]["current"]), (1, 0))
            with self.assertRaises(gma.Error):
                a.host_free(h)


if __name__ == "__main__":
    run()
