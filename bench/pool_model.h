/* A model of a driver's stream-ordered memory pool (cudaMallocAsync's
 * default pool), built on the device boundary so that the simulated device's
 * cost model prices it like the real thing. gma-bench-costs compares gma
 * with it.
 *
 * What it models, from CUDA's documentation of memory pools and from what
 * the GPU benchmark measured of cudaMallocAsync (docs/gpu/RESULTS.md):
 *   - one reserved address range; physical memory is mapped into it in
 *     chunks of POOL_MODEL_CHUNK (32 MiB: the footprint cudaMallocAsync
 *     showed for small blocks), grown at the end of what is mapped;
 *   - a request that no free range holds maps a new range of its own size
 *     (in chunks), even where a free range ends the pool: the large
 *     scenario's footprint on an H100 (416 MiB for at most 256 MiB live,
 *     the sum of two such growths) needs this; extending the free end in
 *     place gave 256 MiB;
 *   - a free is stream-ordered: the block becomes a free range tagged with
 *     an event recorded on its stream; adjacent free ranges merge (carrying
 *     both gates), so freed memory is reused whatever the next size is;
 *   - an allocation takes the best-fitting free range: on the freeing stream
 *     at once, on another stream once its event completed, or behind a
 *     device-side wait on it (cudaMemPoolReuseAllowInternalDependencies, on
 *     by default);
 *   - the release threshold: memory above it goes back at a synchronize
 *     (UINT64_MAX keeps it all, as the GPU benchmark configured it);
 *   - when a chunk cannot be mapped (the device is full), the pool unmaps
 *     the chunks that lie wholly in free ranges, after the work that used
 *     them, and tries again.
 * The host costs of the pool's own calls (cuMemAllocAsync, cuMemFreeAsync)
 * are paid through gma__sim_cost_pay when a cost preset is given.
 *
 * One thread at a time (the benchmark's scenarios call it from one thread,
 * or serialize with the mutex inside). */
#ifndef GMA_BENCH_POOL_MODEL_H
#define GMA_BENCH_POOL_MODEL_H

#include <stdint.h>

#include "device/device.h"
#include "device/sim_cost.h"

#define POOL_MODEL_CHUNK ((uint64_t)32 << 20)

typedef struct pool_model pool_model_t;

typedef struct pool_model_stats {
  uint64_t mapped, mapped_peak;      /* physical bytes mapped now / at the peak */
  uint64_t live, live_peak;          /* bytes handed out */
  uint64_t maps, unmaps;             /* chunks mapped and unmapped */
  uint64_t waits;                    /* device-side waits inserted for reuse across streams */
  uint64_t allocs, frees, failures;
} pool_model_stats_t;

/* va_bytes of address space (at least the device's capacity), chunks of
 * POOL_MODEL_CHUNK; release_threshold as cudaMemPoolAttrReleaseThreshold;
 * costs prices the pool's own calls (the device prices its own). */
gma_status_t pool_model_create(gma__device_t *dev, const gma__sim_costs_t *costs, uint64_t va_bytes,
                               uint64_t release_threshold, pool_model_t **out);
void pool_model_destroy(pool_model_t *m);
gma_status_t pool_model_alloc(pool_model_t *m, uint64_t size, gma_stream_t stream, void **out);
gma_status_t pool_model_free(pool_model_t *m, void *ptr, gma_stream_t stream);
/* The pool's side of a stream synchronize: trims above the threshold. */
void pool_model_synchronized(pool_model_t *m);
void pool_model_stats(const pool_model_t *m, pool_model_stats_t *out);

#endif /* GMA_BENCH_POOL_MODEL_H */
