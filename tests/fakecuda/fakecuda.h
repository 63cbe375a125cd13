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
 *   GMA_FAKECUDA_VMM_FEATURES all (default) or none: whether the devices
 *                             support GPUDirect RDMA with VMM memory and POSIX
 *                             file descriptor handles (their attributes; a
 *                             cuMemCreate asking for an unsupported one gets
 *                             CUDA_ERROR_NOT_SUPPORTED)
 *
 * Environment, read when the library is loaded:
 *   GMA_FAKECUDA_STRICT       the misuse checks that abort the process (see
 *                             FAKECUDA_STRICT_* below): unset, "1" or "all":
 *                             every check (the default); "0" or "none": no
 *                             check, the misuse gets the error code instead;
 *                             or a comma-separated list of "handles" and
 *                             "pending". Anything else is reported on stderr
 *                             and leaves every check on.
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

/* Misuse the fake stops the process for (abort() with a message naming the
 * entry point and the handle or range), because a real GPU's behaviour is
 * undefined there or cannot be simulated:
 *   HANDLES  a stream or event handle that is not live (destroyed by
 *            cuStreamDestroy / cuEventDestroy or by the reset of its primary
 *            context, or never created), and cuStreamWaitEvent across
 *            devices (legal on a GPU, not simulated). Without the check the
 *            call returns CUDA_ERROR_INVALID_HANDLE.
 *   PENDING  cuMemFree or cuMemUnmap of device memory that a queued or
 *            running memset/copy of the fake (cuMemsetD32Async,
 *            cuMemcpyDtoHAsync, cuMemcpyHtoDAsync) on some stream still
 *            touches. Without the check the call succeeds and the copy, when
 *            it runs, sets the sticky CUDA_ERROR_ILLEGAL_ADDRESS. */
#define FAKECUDA_STRICT_HANDLES 1u
#define FAKECUDA_STRICT_PENDING 2u
#define FAKECUDA_STRICT_ALL (FAKECUDA_STRICT_HANDLES | FAKECUDA_STRICT_PENDING)
/* Sets the checks in force (FAKECUDA_STRICT_* bits) and returns the previous
 * set; for a test that checks the error return of a misuse on purpose. */
typedef unsigned (*fakecuda_strict_fn)(unsigned flags);

/* What the last successful cuMemCreate asked for: FAKECUDA_CREATE_* bits. */
#define FAKECUDA_CREATE_RDMA 1u     /* allocFlags.gpuDirectRDMACapable */
#define FAKECUDA_CREATE_POSIX_FD 2u /* requestedHandleTypes POSIX file descriptor */
typedef unsigned (*fakecuda_last_create_fn)(void);

#endif
