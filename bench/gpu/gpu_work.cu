// The kernels of gma-bench-gpu behind the C calls of gpu_work.h. nvcc
// compiles this file as a plain custom command (bench/gpu/CMakeLists.txt),
// so none of the C build's warning or sanitizer flags reaches it.
#include "gpu_work.h"

namespace {

// One byte every GMA_BENCH_TOUCH_STRIDE bytes, in a grid-stride loop, so
// one launch covers a buffer of any size.
__global__ void touch_kernel(unsigned char *p, size_t n) {
  size_t step = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
    p[i * GMA_BENCH_TOUCH_STRIDE] = (unsigned char)i;
}

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The global timer counts nanoseconds on every architecture (the SM clock
// would need the clock rate, which CUDA 13's cudaDeviceProp no longer has).
__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long t0 = global_ns();
  while (global_ns() - t0 < ns) {
  }
}

}  // namespace

extern "C" int gma_bench_touch(void *p, size_t bytes, cudaStream_t s) {
  size_t n = (bytes + GMA_BENCH_TOUCH_STRIDE - 1) / GMA_BENCH_TOUCH_STRIDE;
  if (n == 0) return (int)cudaSuccess;
  const unsigned threads = 256;
  size_t blocks = (n + threads - 1) / threads;
  if (blocks > 1024) blocks = 1024;
  touch_kernel<<<(unsigned)blocks, threads, 0, s>>>((unsigned char *)p, n);
  return (int)cudaGetLastError();
}

extern "C" int gma_bench_spin(uint64_t ns, cudaStream_t s) {
  spin_kernel<<<1, 1, 0, s>>>((unsigned long long)ns);
  return (int)cudaGetLastError();
}

#ifndef GMA_BENCH_WORK_ARCHS
#define GMA_BENCH_WORK_ARCHS "?"
#endif

extern "C" const char *gma_bench_work_archs(void) { return GMA_BENCH_WORK_ARCHS; }
