/* The C face of CUB's cub::CachingDeviceAllocator for gma-bench-gpu: the
 * allocator is a C++ template-heavy header (CCCL), so it lives in its own
 * translation unit (cub_alloc.cpp, C++17) and the benchmark, written in C
 * like the others, reaches it through these calls. Built only when
 * CMake found CUB and a compiler that takes its header (bench/gpu/
 * CMakeLists.txt); otherwise GMA_BENCH_CUB_OFF names the reason and none of
 * these exists. Every call but gma_bench_cub_peak returns a cudaError_t
 * (cudaSuccess = 0). */
#ifndef GMA_BENCH_CUB_ALLOC_H
#define GMA_BENCH_CUB_ALLOC_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gma_bench_cub gma_bench_cub_t;

/* A caching allocator with bins of growth^min_bin .. growth^max_bin bytes and
 * no cap on cached bytes (requests above the largest bin are allocated
 * exactly and not cached, as CUB does). One thread; NULL on host OOM. */
gma_bench_cub_t *gma_bench_cub_create(unsigned growth, unsigned min_bin, unsigned max_bin);
/* DeviceAllocate on the current device, associated with stream. Any thread. */
int gma_bench_cub_alloc(gma_bench_cub_t *c, size_t size, cudaStream_t stream, void **out);
/* The most device memory the allocator held (cached + live, by CUB's own
 * balance) after any of its allocations so far. Any thread. */
size_t gma_bench_cub_peak(gma_bench_cub_t *c);
/* DeviceFree: the block is cached for its stream (or freed if above the bins). */
int gma_bench_cub_free(gma_bench_cub_t *c, void *p);
/* FreeAllCached, then the allocator itself. One thread, no call in flight. */
int gma_bench_cub_destroy(gma_bench_cub_t *c);
/* Where CUB came from, e.g. "CCCL 3.0.1 (g++)". */
const char *gma_bench_cub_version(void);

#ifdef __cplusplus
}
#endif

#endif /* GMA_BENCH_CUB_ALLOC_H */
