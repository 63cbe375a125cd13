// CUB's cub::CachingDeviceAllocator behind the C calls of cub_alloc.h, for
// gma-bench-gpu. Host code only: the header compiles with g++ (checked by
// bench/gpu/CMakeLists.txt); where it would not, CMake compiles this file
// with nvcc instead, or leaves CUB out with a printed reason.
#include "cub_alloc.h"

#include <cstdio>
#include <mutex>
#include <new>

#include <cub/util_allocator.cuh>
#include <cub/version.cuh>

struct gma_bench_cub {
  cub::CachingDeviceAllocator a;
  size_t peak = 0; // the most bytes held (cached + live) after any allocation; a.mutex
  gma_bench_cub(unsigned growth, unsigned min_bin, unsigned max_bin)
      // No cap on cached bytes, and cleanup left to gma_bench_cub_destroy
      // (which runs while the CUDA runtime is still up).
      : a(growth, min_bin, max_bin, cub::CachingDeviceAllocator::INVALID_SIZE, true) {}
};

extern "C" gma_bench_cub_t *gma_bench_cub_create(unsigned growth, unsigned min_bin,
                                                  unsigned max_bin) {
  return new (std::nothrow) gma_bench_cub(growth, min_bin, max_bin);
}

// CUB's own balance (cached_bytes: free and live bytes per device, under
// its mutex) after an allocation: held memory only grows in an allocation,
// so its peak is the highest of these.
static void note_peak(gma_bench_cub_t *c) {
  std::lock_guard<std::mutex> lock(c->a.mutex);
  size_t held = 0;
  for (const auto &d : c->a.cached_bytes) held += d.second.free + d.second.live;
  if (held > c->peak) c->peak = held;
}

// The std::map/std::set inserts inside CUB may throw std::bad_alloc; it must
// not cross into C.
extern "C" int gma_bench_cub_alloc(gma_bench_cub_t *c, size_t size, cudaStream_t stream,
                                   void **out) {
  try {
    int e = (int)c->a.DeviceAllocate(out, size, stream);
    if (e == 0) note_peak(c);
    return e;
  } catch (...) {
    return (int)cudaErrorMemoryAllocation;
  }
}

extern "C" size_t gma_bench_cub_peak(gma_bench_cub_t *c) {
  std::lock_guard<std::mutex> lock(c->a.mutex);
  return c->peak;
}

extern "C" int gma_bench_cub_free(gma_bench_cub_t *c, void *p) {
  try {
    return (int)c->a.DeviceFree(p);
  } catch (...) {
    return (int)cudaErrorMemoryAllocation;
  }
}

extern "C" int gma_bench_cub_destroy(gma_bench_cub_t *c) {
  if (!c) return 0;
  int st = 0;
  try {
    st = (int)c->a.FreeAllCached();
  } catch (...) {
    st = (int)cudaErrorMemoryAllocation;
  }
  delete c;
  return st;
}

#ifndef GMA_BENCH_CUB_COMPILER
#define GMA_BENCH_CUB_COMPILER "c++"
#endif

extern "C" const char *gma_bench_cub_version(void) {
  static char text[64];
  if (!text[0])
    std::snprintf(text, sizeof text, "CUB %d.%d.%d (%s)", CUB_VERSION / 100000,
                  CUB_VERSION / 100 % 1000, CUB_VERSION % 100, GMA_BENCH_CUB_COMPILER);
  return text;
}
