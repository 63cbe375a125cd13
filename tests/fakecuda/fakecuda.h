/* Test controls of the fake CUDA driver (libgma_fakecuda.so, tests only).
 *
 * The fake exports cuGetProcAddress (and _v2) and every entry point listed in
 * runtime/device/cuda_entries.h, plus cuCtxSetCurrent, cuMemsetD32Async,
 * cuMemcpyDtoHAsync and cuMemcpyHtoDAsync for the GPU tests, implemented on
 * gma's simulated device (one simulated device per fake GPU). gma loads it
 * when GMA_CUDA_DRIVER names it; a test reaches these controls with
 * dlopen(getenv("GMA_CUDA_DRIVER")) + dlsym (same handle as gma's).
 *
 * Environment, read at cuInit:
 *   GMA_FAKECUDA_DEVICES      number of fake GPUs (default 1)
 *   GMA_FAKECUDA_MEM          memory per GPU, comma-separated sizes with K/M/G
 *                             suffixes, the last repeated (default 8G)
 *   GMA_FAKECUDA_GRANULARITY  VMM granularity (default 2M)
 */
#ifndef GMA_FAKECUDA_H
#define GMA_FAKECUDA_H

#include <cuda.h>

/* Makes the nth call of entry (counted from this call, 1-based) return result
 * instead of doing its work. 0 on success, -1 if entry is not an entry point
 * of the fake. Several faults may be armed at once. */
typedef int (*fakecuda_fail_fn)(const char *entry, unsigned long long nth, CUresult result);
/* Disarms every fault. */
typedef void (*fakecuda_clear_faults_fn)(void);
/* Calls of entry so far (successful or failed); 0 for an unknown entry; "*"
 * sums every entry point (cuGetProcAddress included). */
typedef unsigned long long (*fakecuda_calls_fn)(const char *entry);
/* Queues fn(arg) on stream in stream order, like a kernel. CUDA_SUCCESS, or an
 * error for an invalid stream / no current context. */
typedef CUresult (*fakecuda_launch_fn)(CUstream stream, void (*fn)(void *), void *arg);
/* Bytes of physical memory in use on a fake GPU (cuMemAlloc + cuMemCreate). */
typedef unsigned long long (*fakecuda_used_fn)(int device);

#endif
