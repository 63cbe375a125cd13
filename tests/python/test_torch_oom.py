"""An OOM through the PyTorch plug-in raises torch.OutOfMemoryError, with a
stand-in torch (no PyTorch in CI), on the simulated device.

The stand-in is what PyTorch does with a pluggable allocator, in two parts:
torch.cuda.memory.CUDAPluggableAllocator in Python, as PyTorch writes it
(ctypes.CDLL of the path, the two functions' addresses handed to
torch._C._cuda_customAllocator), and torch._C, a C++ extension module
(standin_torch/torch_C.cpp) that keeps the functions in std::function, calls
the alloc function from C++ as CUDAPluggableAllocator::malloc does, and
translates C++ exceptions as PyTorch's bindings do: c10::OutOfMemoryError to
torch.OutOfMemoryError (a RuntimeError subclass, also torch.cuda's), other
c10::Error to RuntimeError. gma.torch.use() picks the shim named by
GMA_TORCH_SHIM_LIBRARY: plugins/torch/gma_torch_shim.cpp built against the
stand-in c10 header (CTest sets both paths).

What this cannot show, and only a GPU with real PyTorch can: the real
c10::OutOfMemoryError crossing from libgma_torch_shim.so into libtorch (one
C++ runtime, the ABI CMake read from torch) and PyTorch's real translation;
bench/gpu/torch_train.py and test_torch.py check that on a GPU.

Skips (77), saying why, where the stand-in could not be built (no C++
compiler, no Python headers)."""
import importlib.machinery
import importlib.util
import os
import sys
import types
import unittest

from common import MiB, c_stderr, run, skip

missing = os.environ.get("GMA_STANDIN_TORCH_MISSING")
if missing:
    skip("the stand-in torch could not be built: %s" % missing)
if not os.environ.get("GMA_STANDIN_TORCH_C") or not os.environ.get("GMA_TORCH_SHIM_LIBRARY"):
    skip("GMA_STANDIN_TORCH_C and GMA_TORCH_SHIM_LIBRARY are not set (run it through CTest)")

os.environ["GMA_CONF"] = "device:sim,sim_capacity:64M"


def standin_torch():
    """A module named torch with just what gma.torch.use() and the test touch."""
    loader = importlib.machinery.ExtensionFileLoader("torch._C", os.environ["GMA_STANDIN_TORCH_C"])
    spec = importlib.util.spec_from_file_location("torch._C", loader.path, loader=loader)
    C = importlib.util.module_from_spec(spec)
    loader.exec_module(C)

    class OutOfMemoryError(RuntimeError):
        """torch.OutOfMemoryError (torch.cuda.OutOfMemoryError is the same class)."""

    C._set_out_of_memory_error(OutOfMemoryError)

    class CUDAPluggableAllocator:  # torch/cuda/memory.py, as PyTorch writes it
        def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
            import ctypes
            allocator = ctypes.CDLL(path_to_so_file)
            alloc_fn = ctypes.cast(getattr(allocator, alloc_fn_name), ctypes.c_void_p).value
            free_fn = ctypes.cast(getattr(allocator, free_fn_name), ctypes.c_void_p).value
            assert alloc_fn is not None and free_fn is not None
            self._allocator = C._cuda_customAllocator(alloc_fn, free_fn)

    def change_current_allocator(allocator):
        C._cuda_changeCurrentAllocator(allocator._allocator)

    torch = types.ModuleType("torch")
    torch._C = C
    torch.OutOfMemoryError = OutOfMemoryError
    torch.cuda = types.SimpleNamespace(
        OutOfMemoryError=OutOfMemoryError,
        memory=types.SimpleNamespace(CUDAPluggableAllocator=CUDAPluggableAllocator,
                                     change_current_allocator=change_current_allocator))
    return torch


torch = standin_torch()
sys.modules["torch"] = torch
sys.modules["torch._C"] = torch._C

import gma.torch as gt  # noqa: E402

with c_stderr() as _err:
    gt.use()  # the shim, from GMA_TORCH_SHIM_LIBRARY
USE_STDERR = _err[0]


def empty(nbytes, device=0, stream=0):
    """torch.empty(nbytes, dtype=torch.uint8, device="cuda"): its address."""
    return torch._C._alloc(nbytes, device, stream)


class TorchOOM(unittest.TestCase):
    def test_a_use_picked_the_shim(self):
        self.assertEqual(gt.shim_path(), os.environ["GMA_TORCH_SHIM_LIBRARY"])
        self.assertNotIn("warning", USE_STDERR.lower())  # no "shim missing" warning
        p = empty(1 * MiB)
        self.assertTrue(p)
        self.assertEqual(gt.stats(0)["allocated"]["current"], 1 * MiB)  # libgma_torch's allocator
        torch._C._free(p)
        self.assertEqual(gt.stats(0)["allocated"]["current"], 0)
        self.assertEqual(empty(0), 0)  # empty tensors: NULL, no error (PyTorch records it
        # and never frees it: a DataPtr without context calls no deleter)

    def test_bigger_than_the_device(self):
        live = torch._C._live_count()
        with c_stderr() as err, self.assertRaises(torch.OutOfMemoryError) as cm:
            empty(128 * MiB)
        msg = str(cm.exception)
        self.assertIsInstance(cm.exception, RuntimeError)  # as PyTorch's is
        self.assertIn("gma: out of memory: tried to allocate 128.00 MiB on device 0", msg)
        self.assertIn(gt.last_error(), msg)  # gma_last_error()'s text is in it
        self.assertIn("GMA_ERR_INVALID_SIZE", msg)
        self.assertEqual(err[0], "")  # raised, not logged
        self.assertEqual(torch._C._live_count(), live)  # PyTorch recorded nothing

    def test_fits_the_device_but_not_now(self):
        base, live = gt.stats(0), torch._C._live_count()
        hold = empty(48 * MiB)
        with self.assertRaises(torch.cuda.OutOfMemoryError) as cm:
            empty(32 * MiB)
        self.assertIn("GMA_ERR_OOM", str(cm.exception))
        # Many OOMs later nothing was allocated, counted as allocated, or kept.
        for _ in range(500):
            with self.assertRaises(torch.OutOfMemoryError):
                empty(32 * MiB)
        s = gt.stats(0)
        self.assertEqual(s["num_allocs"], base["num_allocs"] + 1)
        self.assertEqual(s["allocated"]["current"], 48 * MiB)
        self.assertLessEqual(s["reserved"]["current"], 64 * MiB)
        self.assertGreaterEqual(s["num_ooms"], base["num_ooms"] + 501)
        self.assertEqual(torch._C._live_count(), live + 1)
        # The allocator is usable: the same request succeeds once memory is freed.
        torch._C._free(hold)
        p = empty(32 * MiB)
        self.assertTrue(p)
        torch._C._free(p)
        self.assertEqual(gt.stats(0)["allocated"]["current"], 0)
        self.assertEqual(torch._C._live_count(), live)

    def test_other_failures_are_runtime_errors(self):
        with self.assertRaises(RuntimeError) as cm:
            empty(4096, device=-1)
        self.assertNotIsInstance(cm.exception, torch.OutOfMemoryError)
        self.assertIn("gma: allocating 4096 bytes on device -1 failed", str(cm.exception))


if __name__ == "__main__":
    run()
