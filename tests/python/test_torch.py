"""gma.torch: PyTorch allocating through libgma_torch.so on a real GPU (the
three-line switch, tensors on the default and a side stream, empty tensors,
record_stream, the statistics and summary read back; a tensor larger than
the GPU raises torch.OutOfMemoryError through libgma_torch_shim.so, with
gma's message, and the allocator works afterwards). Skipped, saying why,
where torch does not import or sees no CUDA device."""
import gc
import unittest

from common import MiB, run, skip

try:
    import torch
except ImportError as e:
    skip("torch is not installed (%s)" % e)
if not torch.cuda.is_available():  # does not initialize PyTorch's allocator
    skip("torch sees no CUDA device")

import gma.torch as gt

# conf wins over the GMA_CONF=device:sim CTest sets: PyTorch needs GPU memory.
gt.use("device:cuda")


class Torch(unittest.TestCase):
    def test_tensors_come_from_gma(self):
        dev = torch.cuda.current_device()
        x = torch.ones(1 << 20, device="cuda")
        y = x * 2
        torch.cuda.synchronize()
        self.assertEqual(y.sum().item(), 2.0 * (1 << 20))
        s = gt.stats(dev)
        self.assertGreaterEqual(s["num_allocs"], 2)
        self.assertGreaterEqual(s["allocated"]["current"], 8 * MiB)
        self.assertEqual(torch.empty(0, device="cuda").numel(), 0)  # size 0: NULL is fine
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            z = x + 1
        gt.record_stream(x, side)  # Tensor.record_stream does not reach plug-ins
        del x
        side.synchronize()
        self.assertEqual(z[0].item(), 2.0)
        self.assertIn("gma memory summary: device cuda", gt.summary(dev))
        del y, z
        gc.collect()
        torch.cuda.synchronize()
        gt.empty_cache(dev)
        s = gt.stats(dev)
        self.assertLess(s["allocated"]["current"], 1 * MiB)
        self.assertGreaterEqual(s["num_frees"], 3)

    def test_out_of_memory_raises(self):
        dev = torch.cuda.current_device()
        if gt.shim_path() is None:
            self.fail("libgma_torch_shim.so was not built beside the plug-in (CMake's python3 "
                      "must import this torch): an OOM would give PyTorch address 0")
        total = torch.cuda.get_device_properties(dev).total_memory
        before = gt.stats(dev)["allocated"]["current"]
        with self.assertRaises(torch.cuda.OutOfMemoryError) as cm:
            torch.empty(2 * total, dtype=torch.uint8, device="cuda")
        self.assertIn("gma: out of memory", str(cm.exception))
        self.assertIn("GMA_ERR_", str(cm.exception))
        self.assertEqual(gt.stats(dev)["allocated"]["current"], before)
        x = torch.ones(1 << 20, device="cuda")  # usable afterwards
        self.assertEqual(x.sum().item(), float(1 << 20))


if __name__ == "__main__":
    run()
