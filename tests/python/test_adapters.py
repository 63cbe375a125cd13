"""gma.cupy and gma.torch against stand-ins for cupy and torch, on the
simulated device, so their glue runs everywhere (test_cupy.py and
test_torch.py run the real packages where a GPU has them). The stand-ins do
what the real calls do with the allocator they are given:
cupy.cuda.set_allocator keeps the function and calls it with a size;
CUDAPluggableAllocator opens the library with ctypes and calls the two
functions through C function pointers with (size, device, stream) and
(ptr, size, device, stream)."""
import ctypes
import gc
import os
import sys
import types
import unittest

from common import KiB, MiB, c_stderr, run

import gma


class FakeCupy:
    """Just the parts of cupy that gma.cupy touches."""

    def __init__(self):
        self.allocator = None
        self.stream_ptr = 0
        cupy = types.ModuleType("cupy")
        cuda = types.ModuleType("cupy.cuda")
        cuda.runtime = types.SimpleNamespace(getDevice=lambda: 0)

        fake = self

        class UnownedMemory:
            def __init__(self, ptr, size, owner, device_id=-1):
                self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

        class MemoryPointer:
            def __init__(self, mem, offset):
                self.mem, self.ptr = mem, mem.ptr + offset

        class Pool:
            def malloc(self, size):
                raise AssertionError("the default pool was asked")

        pool = Pool()
        cuda.UnownedMemory = UnownedMemory
        cuda.MemoryPointer = MemoryPointer
        cuda.set_allocator = lambda f=None: setattr(fake, "allocator", f)
        cuda.get_current_stream = lambda: types.SimpleNamespace(ptr=fake.stream_ptr)
        cupy.cuda = cuda
        cupy.get_default_memory_pool = lambda: pool
        self.pool = pool
        self.module = cupy


class FakeTorch:
    """Just torch.cuda.memory's pluggable allocator, calling like PyTorch.
    FakeTorch(version="1.13.1") is a PyTorch before 2.0: torch.cuda.memory
    without CUDAPluggableAllocator and change_current_allocator."""

    def __init__(self, version=None):
        self.current = None
        torch = types.ModuleType("torch")
        if version is not None:
            torch.__version__ = version
        fake = self

        class CUDAPluggableAllocator:
            def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
                lib = ctypes.CDLL(path_to_so_file)
                alloc = ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value
                free = ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value
                # c10: std::function<void*(size_t, int, cudaStream_t)> and
                # std::function<void(void*, size_t, int, cudaStream_t)>.
                self.alloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                              ctypes.c_void_p)(alloc)
                self.free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t,
                                             ctypes.c_int, ctypes.c_void_p)(free)

        def change_current_allocator(a):
            fake.current = a

        memory = types.SimpleNamespace(CUDAPluggableAllocator=CUDAPluggableAllocator,
                                       change_current_allocator=change_current_allocator)
        if version is not None and version.split(".")[0] == "1":
            memory = types.SimpleNamespace(caching_allocator_alloc=lambda *a: None)
        torch.cuda = types.SimpleNamespace(memory=memory)
        self.module = torch


class CupyAdapter(unittest.TestCase):
    def setUp(self):
        self.fake = FakeCupy()
        sys.modules["cupy"] = self.fake.module
        import gma.cupy
        self.gc = gma.cupy

    def tearDown(self):
        del sys.modules["cupy"]

    def test_allocations_go_through_gma_and_free_on_collection(self):
        with gma.Allocator("device:sim") as a:
            s = a.stream_create()
            self.fake.stream_ptr = s
            self.gc.use(a)
            m = self.fake.allocator(64 * KiB)
            self.assertEqual(m.mem.size, 64 * KiB)
            self.assertEqual(m.mem.device_id, 0)
            st = a.stream_stats(s)  # allocated on CuPy's current stream
            self.assertEqual((st["allocs"], st["allocated_bytes"]), (1, 64 * KiB))
            if gma.available("gma_pointer_info"):
                self.assertEqual(a.pointer_info(m.ptr)["stream"], s)
            z = self.fake.allocator(0)  # no allocation for size 0
            self.assertEqual(z.ptr, 0)
            self.assertEqual(a.stats()["num_allocs"], 1)
            del m, z
            gc.collect()
            s2 = a.stats()
            self.assertEqual((s2["num_frees"], s2["allocated"]["current"]), (1, 0))
            with self.assertRaises(gma.InvalidSize):
                self.fake.allocator(200 * (1 << 40))  # gma's error reaches CuPy
            a.stream_destroy(s)
            self.fake.stream_ptr = 0
            late = self.fake.allocator(4 * KiB)  # an array outliving the allocator:
            with c_stderr(), self.assertRaises(gma.Leak):
                a.close()  # a leak for gma (which frees it),
        del late  # and dropped quietly afterwards
        gc.collect()
        self.gc.reset()
        self.assertEqual(self.fake.allocator, self.fake.pool.malloc)


class TorchAdapter(unittest.TestCase):
    def setUp(self):
        self.fake = FakeTorch()
        sys.modules["torch"] = self.fake.module
        import gma.torch
        self.gt = gma.torch

    def tearDown(self):
        del sys.modules["torch"]

    def test_use_installs_the_plugin(self):
        gt = self.gt
        alloc = gt.use("device:sim,sim_capacity:128M")
        self.assertIs(self.fake.current, alloc)
        self.assertEqual(os.environ["GMA_CONF"], "device:sim,sim_capacity:128M")
        p = alloc.alloc(3 * MiB, 0, None)  # as PyTorch calls it
        self.assertTrue(p)
        s = gt.stats(0)
        self.assertEqual((s["num_allocs"], s["allocated"]["current"]), (1, 3 * MiB))
        self.assertEqual(gt.allocator(0).device_name, "sim")
        self.assertIn("gma memory summary", gt.summary(0))
        self.assertIsNone(alloc.alloc(0, 0, None))

        class Tensor:  # what record_stream reads of a tensor
            device = types.SimpleNamespace(index=0)

            def untyped_storage(self):
                return types.SimpleNamespace(data_ptr=lambda: p)

        side = gt.allocator(0).stream_create()
        gt.record_stream(Tensor(), types.SimpleNamespace(cuda_stream=side))
        alloc.free(p, 3 * MiB, 0, None)
        s = gt.stats(0)
        self.assertEqual((s["num_frees"], s["allocated"]["current"]), (1, 0))
        with c_stderr() as err:
            self.assertIsNone(alloc.alloc(256 * MiB, 0, None))  # NULL on failure
        self.assertIn("GMA_ERR_INVALID_SIZE", gt.last_error())
        self.assertEqual(len(err[0].splitlines()), 1)
        gt.empty_cache(0)


class TorchTooOld(unittest.TestCase):
    """A torch before 2.0 has no pluggable-allocator interface: use() says
    which torch it found, the version it needs and what to do, instead of an
    AttributeError, and changes nothing."""

    def tearDown(self):
        del sys.modules["torch"]

    def use_with(self, fake):
        sys.modules["torch"] = fake.module
        import gma.torch
        before = os.environ.get("GMA_CONF")
        with self.assertRaises(RuntimeError) as cm:
            gma.torch.use("device:sim,sim_capacity:32M")
        self.assertNotIsInstance(cm.exception, AttributeError)
        self.assertIsNone(fake.current)
        self.assertEqual(os.environ.get("GMA_CONF"), before)  # conf not applied
        return str(cm.exception)

    def test_torch_1_13(self):
        msg = self.use_with(FakeTorch(version="1.13.1+cu117"))
        self.assertIn("gma.torch needs PyTorch 2.0 or later", msg)
        self.assertIn("this is torch 1.13.1+cu117", msg)
        self.assertIn("torch.cuda.memory.CUDAPluggableAllocator or change_current_allocator", msg)
        self.assertIn("pip install 'torch>=2.0'", msg)
        import gma.torch
        self.assertEqual(gma.torch.MIN_TORCH, (2, 0))

    def test_no_version_given(self):
        fake = FakeTorch()
        del fake.module.cuda.memory.CUDAPluggableAllocator
        msg = self.use_with(fake)
        self.assertIn("a torch that gives no __version__", msg)
        self.assertIn("no torch.cuda.memory.CUDAPluggableAllocator,", msg)


if __name__ == "__main__":
    run()
