"""The PyTorch plug-in's C ABI (libgma_torch.so), called through ctypes the
way CUDAPluggableAllocator calls it, on the simulated device (no torch
needed): allocation on a stream and a free on another stream after
gma_torch_record_stream, size 0, invalid devices, out of memory and foreign
frees (NULL or nothing, one line on stderr each), the statistics, summary,
snapshot, empty_cache and iteration_mark exports and gma.torch's wrappers of them, one
allocator per device created once under concurrent first use, and the
plug-in's shutdown making later calls harmless. Run by CTest with
GMA_LIBRARY, GMA_TORCH_LIBRARY and GMA_CONF=device:sim."""
import ctypes
import os
import subprocess
import sys
import threading
import time
import tempfile
import unittest

from common import KiB, MiB, c_stderr, run

# Read by the plug-in when it creates each device's allocator (first use).
os.environ["GMA_CONF"] = "device:sim,sim_capacity:256M"

import gma
import gma.torch as gt

P = gt.plugin()


def alloc(size, device=0, stream=None):
    return P.gma_torch_alloc(size, device, stream)


def free(ptr, size=0, device=0, stream=None):
    P.gma_torch_free(ptr, size, device, stream)


class Plugin(unittest.TestCase):
    # unittest runs these in name order; test_z_shutdown must be last.

    def test_a_nothing_before_first_use(self):
        s = gt.stats(3)  # no allocator on device 3 yet: zeros, none created
        self.assertEqual((s["num_allocs"], s["reserved"]["current"]), (0, 0))
        gt.empty_cache(3)  # a no-op
        gt.iteration_mark(3)  # a no-op too: no allocator to mark
        self.assertEqual(gt.stats(3)["num_allocs"], 0)

    def test_alloc_on_a_stream_free_on_another(self):
        a = gt.allocator(0)  # the plug-in's allocator, to make sim streams
        self.assertEqual(a.device_name, "sim")
        s1, s2 = a.stream_create(), a.stream_create()
        base = gt.stats(0)
        with c_stderr() as err:
            p = alloc(1 * MiB, 0, s1)
            self.assertTrue(p)
            self.assertEqual(p % 256, 0)
            if gma.available("gma_pointer_info"):
                self.assertEqual(a.pointer_info(p)["stream"], s1)
            s = gt.stats(0)
            self.assertEqual(s["num_allocs"], base["num_allocs"] + 1)
            self.assertEqual(s["allocated"]["current"], base["allocated"]["current"] + 1 * MiB)
            gate, started = threading.Event(), threading.Event()
            a.sim_launch(s2, lambda: (started.set(), gate.wait(10)))
            self.assertTrue(started.wait(5))
            gt.record_stream(p, s2, device=0)  # the int-pointer form
            free(p, 1 * MiB, 0, s2)
            s = gt.stats(0)
            self.assertEqual(s["num_frees"], base["num_frees"] + 1)
            self.assertEqual(s["allocated"]["current"], base["allocated"]["current"])
            self.assertGreaterEqual(s["pending_bytes"], 1 * MiB)  # s2 still "uses" it
            gate.set()
            a.stream_synchronize(s2)
        self.assertEqual(err[0], "")  # nothing logged on success
        a.stream_destroy(s1)
        a.stream_destroy(s2)
        a.close()  # does not destroy the plug-in's allocator
        self.assertTrue(gt.allocator(0).handle)

    def test_size_zero(self):
        base = gt.stats(0)["num_allocs"]
        with c_stderr() as err:
            self.assertIsNone(alloc(0))
            free(None, 0)
        self.assertEqual(err[0], "")
        self.assertEqual(gt.stats(0)["num_allocs"], base)

    def test_invalid_device(self):
        for dev in (-1, 1024, 5000):
            with c_stderr() as err:
                self.assertIsNone(alloc(4096, dev))
            self.assertIn("device %d" % dev, gt.last_error())
            lines = err[0].splitlines()
            self.assertEqual(len(lines), 1, err[0])
            self.assertTrue(lines[0].startswith("gma_torch: "))
            with self.assertRaises(gma.InvalidArgument):
                gt.stats(dev)

    def test_out_of_memory_returns_null_and_logs_once(self):
        with c_stderr() as err:
            self.assertIsNone(alloc(300 * MiB))  # more than sim_capacity
            p = alloc(200 * MiB)
            self.assertTrue(p)
            self.assertIsNone(alloc(100 * MiB))  # fits the device, not now
        lines = err[0].splitlines()
        self.assertEqual(len(lines), 2, err[0])
        self.assertIn("GMA_ERR_INVALID_SIZE", lines[0])
        self.assertIn("GMA_ERR_OOM", lines[1])
        self.assertIn("GMA_ERR_OOM", gt.last_error())
        self.assertGreaterEqual(gt.stats(0)["num_ooms"], 1)
        free(p, 200 * MiB)

    def test_out_of_memory_observer_frees_and_retries(self):
        held = alloc(200 * MiB)
        self.assertTrue(held)
        seen = []

        def observer(device, requested, allocated, device_free):
            seen.append((device, requested, allocated))
            nonlocal held
            if held:  # the program's own cache: given up, then a retry
                free(held, 200 * MiB)
                held = None
                return True
            return False

        gt.attach_out_of_memory_observer(observer)
        try:
            before = gt.stats(0)["num_ooms"]
            p = alloc(100 * MiB)  # fits only once the observer freed its 200 MiB
            self.assertTrue(p)
            self.assertEqual(seen, [(0, 100 * MiB, 200 * MiB)])
            self.assertEqual(gt.stats(0)["num_ooms"], before)
            with c_stderr():
                self.assertIsNone(alloc(300 * MiB - 100 * MiB + 1))  # declined: OOM
            self.assertEqual(len(seen), 2)
            self.assertEqual(gt.stats(0)["num_ooms"], before + 1)
            free(p, 100 * MiB)
        finally:
            gt.detach_out_of_memory_observers()
        with c_stderr():
            q = alloc(200 * MiB)
            self.assertIsNone(alloc(100 * MiB))  # no observer any more
        self.assertEqual(len(seen), 2)
        free(q, 200 * MiB)

    def test_foreign_and_double_free_are_logged(self):
        buf = ctypes.create_string_buffer(4096)
        p = alloc(4096)
        free(p)
        with c_stderr() as err:
            free(ctypes.addressof(buf))
            free(p)
        lines = err[0].splitlines()
        self.assertEqual(len(lines), 2, err[0])
        self.assertIn("GMA_ERR_INVALID_POINTER", lines[0])
        self.assertIn("GMA_ERR_DOUBLE_FREE", lines[1])

    def test_devices_have_their_own_allocators(self):
        # The sim accepts any device_id: device 1 is a second allocator.
        p0, p1 = alloc(64 * KiB, 0), alloc(128 * KiB, 1)
        self.assertTrue(p0 and p1)
        self.assertNotEqual(gt.allocator(0).handle, gt.allocator(1).handle)
        self.assertEqual(gt.stats(1)["allocated"]["current"], 128 * KiB)
        free(p1, 0, 0)  # the wrong device: found in device 1's allocator anyway
        self.assertEqual(gt.stats(1)["allocated"]["current"], 0)
        free(p0, 0, 0)

    def test_concurrent_first_use_creates_one_allocator(self):
        dev, n, per = 2, 8, 300
        errors, barrier = [], threading.Barrier(n)

        def work():
            try:
                barrier.wait()
                live = []
                for i in range(per):
                    p = alloc(512 * (1 + i % 16), dev)
                    if not p:
                        raise AssertionError(gt.last_error())
                    live.append(p)
                    if len(live) > 8:
                        free(live.pop(0), 0, dev)
                for p in live:
                    free(p, 0, dev)
            except Exception as e:
                errors.append(e)

        ts = [threading.Thread(target=work) for _ in range(n)]
        with c_stderr() as err:
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        self.assertEqual(errors, [])
        self.assertEqual(err[0], "")
        s = gt.stats(dev)
        self.assertEqual((s["num_allocs"], s["num_frees"]), (n * per, n * per))

    def test_summary_snapshot_empty_cache(self):
        p = alloc(3 * MiB)
        text = gt.summary(0)
        self.assertIn("gma memory summary: device sim", text)
        snap = gt.snapshot(0)
        live = [b for seg in snap["segments"] for b in seg["blocks"]
                if int(b["address"], 16) == p]
        self.assertEqual(len(live), 1)
        self.assertEqual((live[0]["state"], live[0]["requested"]), ("live", 3 * MiB))
        # PyTorch's format: gma.torch.dump_snapshot (gma_torch_snapshot_write), and as a dict.
        with tempfile.TemporaryDirectory() as d:
            path = gt.dump_snapshot(os.path.join(d, "snap.pickle"), device=0)
            tsnap = gma.load_torch_snapshot(path)
        self.assertEqual(set(tsnap), {"segments", "device_traces"})
        live = [b for seg in tsnap["segments"] for b in seg["blocks"] if b["address"] == p]
        self.assertEqual((live[0]["state"], live[0]["requested_size"]),
                         ("active_allocated", 3 * MiB))
        self.assertEqual(gt.snapshot(0, format="torch")["segments"], tsnap["segments"])
        with self.assertRaises(gma.InvalidArgument):
            gt.dump_snapshot("/nonexistent-gma-dir/snap.pickle", device=0)
        free(p)
        gt.iteration_mark(0)  # plan:off (GMA_CONF above): a no-op
        self.assertEqual(gt.stats(0)["plan_iterations"], 0)
        with self.assertRaises(gma.InvalidArgument):
            gt.iteration_mark(-1)
        gt.empty_cache(0)
        self.assertEqual(gt.stats(0)["allocated"]["current"], 0)
        with self.assertRaises(gma.InvalidPointer):
            gt.record_stream(p, None, device=0)  # freed: not live

    def test_device_is_cuda_unless_named(self):
        # GMA_CONF without a device: the plug-in asks for CUDA, so a machine
        # whose driver does not load gets NULL and a line saying so, never
        # simulated host memory passed off as CUDA memory.
        code = ("import os, sys; sys.path.insert(0, %r); import gma.torch as gt; "
                "P = gt.plugin(); print('ptr', P.gma_torch_alloc(4096, 0, None))"
                % os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "..", "python"))
        env = dict(os.environ, GMA_CONF="sim_capacity:256M",
                   GMA_CUDA_DRIVER="/nonexistent/libcuda.so.1")
        r = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ptr None", r.stdout)
        self.assertIn("gma_torch: creating the allocator of device 0 failed", r.stderr)
        self.assertIn("GMA_ERR_NO_DEVICE", r.stderr)

    def test_fork_child_gets_its_own_allocator(self):
        p = alloc(1 * MiB)  # the parent's allocator exists
        self.assertTrue(p)
        hold = threading.Event()
        # Another parent thread inside the plug-in around the fork must not
        # leave the child a held lock or an in-flight count.
        t = threading.Thread(target=lambda: [free(alloc(4096)) for _ in range(2000)]
                             if not hold.is_set() else None)
        t.start()
        pid = os.fork()
        if pid == 0:  # the child: only this thread
            ok = 0
            try:
                q = alloc(64 * KiB)
                ok = 1 if q else 0
                free(q, 64 * KiB)
                P.gma_torch_shutdown()  # what its exit handler runs: must not wait
            finally:
                os._exit(0 if ok else 3)
        t0 = time.monotonic()
        _, status = os.waitpid(pid, 0)
        t.join()
        self.assertTrue(os.WIFEXITED(status))
        self.assertEqual(os.WEXITSTATUS(status), 0)
        self.assertLess(time.monotonic() - t0, 1.5)  # shutdown waited for no one
        free(p, 1 * MiB)  # the parent's allocator is untouched

    def test_z_shutdown(self):
        p = alloc(1 * MiB)  # a tensor still alive at exit
        a = gt.allocator(0)
        s = a.stream_create()
        gate, started = threading.Event(), threading.Event()
        a.sim_launch(s, lambda: (started.set(), gate.wait(10)))  # work that never ends
        self.assertTrue(started.wait(5))
        with c_stderr() as err:
            t0 = time.monotonic()
            P.gma_torch_shutdown()  # what the atexit handler runs: gma_abandon
            self.assertLess(time.monotonic() - t0, 2.0)  # nothing waits for the work
            P.gma_torch_shutdown()
            free(p, 1 * MiB)  # a late free: harmless, silent
            self.assertIsNone(alloc(4096))  # a late allocation fails
        gate.set()
        self.assertNotIn("leak", err[0])  # tensors alive at exit are not leaks
        self.assertIn("shutdown", err[0].splitlines()[-1])
        with self.assertRaises(gma.Cancelled):
            gt.stats(0)
        self.assertIsNone(P.gma_torch_allocator(0))


if __name__ == "__main__":
    run()
