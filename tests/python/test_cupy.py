"""gma.cupy: CuPy allocating through a gma allocator on a real GPU. Skipped,
saying why, where cupy does not import or sees no CUDA device."""
import gc
import unittest

from common import MiB, run, skip

try:
    import cupy
except ImportError as e:
    skip("cupy is not installed (%s)" % e)
try:
    if cupy.cuda.runtime.getDeviceCount() < 1:
        skip("cupy sees no CUDA device")
except Exception as e:  # cupy's CUDARuntimeError when there is no driver
    skip("cupy sees no CUDA device (%s)" % e)

import gma
import gma.cupy


class CuPy(unittest.TestCase):
    def test_arrays_come_from_gma(self):
        # conf wins over the GMA_CONF=device:sim CTest sets.
        with gma.Allocator("device:cuda,device_id:%d" % cupy.cuda.Device().id) as a:
            gma.cupy.use(a)
            try:
                x = cupy.arange(1 << 20, dtype=cupy.int64)
                y = x * 2
                self.assertEqual(int(y[:1000].sum()), 999000)
                s = a.stats()
                self.assertGreaterEqual(s["num_allocs"], 2)
                self.assertGreaterEqual(s["allocated"]["current"], 16 * MiB)
                st = cupy.cuda.Stream(non_blocking=True)
                with st:  # allocated on CuPy's current stream
                    z = cupy.ones(1000)
                    if gma.available("gma_pointer_info"):
                        self.assertEqual(a.pointer_info(z.data.ptr)["stream"], st.ptr)
                st.synchronize()
                e = cupy.empty(0)
                self.assertEqual(e.size, 0)
                del x, y, z, e
                gc.collect()
                cupy.cuda.Device().synchronize()
                s = a.stats()
                self.assertLess(s["allocated"]["current"], 1 * MiB)  # freed through gma
                self.assertGreaterEqual(s["num_frees"], 3)
            finally:
                gma.cupy.reset()


if __name__ == "__main__":
    run()
