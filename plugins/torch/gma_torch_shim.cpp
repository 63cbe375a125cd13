/* libgma_torch_shim.so: the PyTorch plug-in's allocation entry point that
 * raises torch.OutOfMemoryError instead of returning NULL.
 *
 * CUDAPluggableAllocator does not check what its alloc function returns: a
 * NULL from gma_torch_alloc becomes a tensor at address 0, and the first
 * kernel that touches it fails with a sticky illegal-address error. PyTorch
 * calls the alloc function from C++ (CUDAPluggableAllocator::malloc, through
 * a std::function), inside the exception translation of its Python bindings,
 * which turns a c10::OutOfMemoryError into torch.OutOfMemoryError and any
 * other c10::Error into RuntimeError. So this file throws those, and is
 * compiled against c10/util/Exception.h:
 *
 *  - PyTorch's own (CMake finds torch through GMA_TORCH_PYTHON): the library
 *    links libc10 and throws the real c10::OutOfMemoryError;
 *  - the tests' stand-in (tests/python/standin_torch/c10/util/Exception.h),
 *    whose classes live in another namespace: the same code path, caught by
 *    a stand-in of PyTorch's translation (tests/python/test_torch_oom.*).
 *
 * Nothing else lives here: allocation, statistics, teardown and fork handling
 * stay in libgma_torch.so (linked, so both share one allocator per device),
 * and gma.torch.use() picks this library when it is present. */
#include <sys/types.h>

#include <cstdio>
#include <string>

#include <c10/util/Exception.h>

#include "gma_torch.h"

#define GMA_SHIM_API extern "C" __attribute__((visibility("default")))

/* Like gma_torch_alloc, but a failure throws: c10::OutOfMemoryError when gma
 * has no memory for the request (GMA_ERR_OOM, or GMA_ERR_INVALID_SIZE: more
 * than the device or memory_limit holds), c10::Error for anything else (no
 * device, a bad device index, after gma_torch_shutdown). The message carries
 * gma_torch_last_error(), which includes gma_last_error()'s text. Nothing is
 * allocated or logged when it throws, and the allocator stays usable. Size 0
 * gives NULL, as PyTorch expects for empty tensors. */
GMA_SHIM_API void *gma_torch_shim_alloc(ssize_t size, int device, void *stream) {
  void *p = nullptr;
  const int st = gma_torch_try_alloc(size, device, stream, &p);
  if (st == GMA_OK) return p;
  const bool oom = st == GMA_ERR_OOM || (st == GMA_ERR_INVALID_SIZE && size > 0);
  char head[160];
  if (oom)
    std::snprintf(head, sizeof head, "gma: out of memory: tried to allocate %.2f MiB on device %d",
                  (double)size / (1 << 20), device);
  else
    std::snprintf(head, sizeof head, "gma: allocating %zd bytes on device %d failed", size,
                  device);
  std::string msg = std::string(head) + " (" + gma_torch_last_error() + ")";
  if (oom) {
    msg += ". gma.torch.summary(device) shows what gma holds; freeing tensors, or "
           "gma.torch.empty_cache(device), gives cached memory back to the device";
    TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
  }
  TORCH_CHECK(false, msg);
  return nullptr; /* not reached: TORCH_CHECK(false, ...) throws */
}

/* gma_torch_free, under the name CUDAPluggableAllocator is given with this
 * library's path. Never throws. */
GMA_SHIM_API void gma_torch_shim_free(void *ptr, ssize_t size, int device, void *stream) noexcept {
  gma_torch_free(ptr, size, device, stream);
}
