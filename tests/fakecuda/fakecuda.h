/* Test controls of the fake CUDA driver (libgma_fakecuda.so, tests only).
 *
 * The fake exports cuGetProcAddress (and _v2) and every entry point listed in
 * runtime/device/cuda_entries.h, plus cuCtxSetCurrent, cuCtxCreate,
 * cuCtxDestroy, cuMemsetD32Async, cuMemcpyDtoHAsync, cuMemcpyHtoDAsync,
 * cuStreamWaitValue32 and cuStreamQuery for the GPU tests, and stream capture
 * (see "Stream capture" below), implemented on gma's simulated device (one
 * simulated device per fake GPU). gma loads it
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
 *                             CUDA_ERROR_NOT_SUPPORTED); off: no virtual
 *                             memory management at all (the attribute says 0)
 *   GMA_FAKECUDA_STREAM_MEM_OPS on (default) or off: whether the devices have
 *                             64-bit stream memory operations
 *                             (cuStreamWriteValue64; off: the attribute says
 *                             0 and the call fails with NOT_SUPPORTED)
 *
 * Environment, read when the library is loaded:
 *   GMA_FAKECUDA_STRICT       the misuse checks that abort the process (see
 *                             FAKECUDA_STRICT_* below): unset, "1" or "all":
 *                             every check (the default); "0" or "none": no
 *                             check, the misuse gets the error code instead;
 *                             or a comma-separated list of "handles",
 *                             "pending" and "capture". Anything else is
 *                             reported on stderr and leaves every check on.
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
 *            it runs, sets the sticky CUDA_ERROR_ILLEGAL_ADDRESS.
 *   CAPTURE  a call that breaks a stream capture rule (below): one that
 *            invalidates a capture or returns CUDA_ERROR_CAPTURED_EVENT,
 *            _STREAM_CAPTURE_UNSUPPORTED, _ISOLATION, _IMPLICIT, _MERGE,
 *            _UNMATCHED or _WRONG_THREAD (a capture query's _IMPLICIT is
 *            an answer, not a misuse). Not undefined on a GPU, but gma
 *            must never make such a call, so it is a failure rather than an
 *            error code to handle. Without the check the call returns that
 *            code (and invalidates what CUDA invalidates). */
#define FAKECUDA_STRICT_HANDLES 1u
#define FAKECUDA_STRICT_PENDING 2u
#define FAKECUDA_STRICT_CAPTURE 4u
#define FAKECUDA_STRICT_ALL \
  (FAKECUDA_STRICT_HANDLES | FAKECUDA_STRICT_PENDING | FAKECUDA_STRICT_CAPTURE)
/* Sets the checks in force (FAKECUDA_STRICT_* bits) and returns the previous
 * set; for a test that checks the error return of a misuse on purpose. */
typedef unsigned (*fakecuda_strict_fn)(unsigned flags);

/* What the last successful cuMemCreate asked for: FAKECUDA_CREATE_* bits. */
#define FAKECUDA_CREATE_RDMA 1u     /* allocFlags.gpuDirectRDMACapable */
#define FAKECUDA_CREATE_POSIX_FD 2u /* requestedHandleTypes POSIX file descriptor */
typedef unsigned (*fakecuda_last_create_fn)(void);

/* Stream capture (CUDA 13's driver API, as cuda.h documents it; entry points
 * cuStreamBeginCapture (_v2), cuStreamEndCapture, cuStreamIsCapturing,
 * cuStreamGetCaptureInfo (v2 ABI for a cuGetProcAddress cudaVersion below
 * 12030, v3 from it), cuThreadExchangeStreamCaptureMode, cuGraphInstantiate
 * (WithFlags), cuGraphLaunch, cuGraphExecDestroy, cuGraphDestroy):
 * - Work queued on a capturing stream (fakecuda_launch kernels,
 *   cuMemsetD32Async, cuMemcpyDtoHAsync, cuMemcpyHtoDAsync,
 *   cuStreamWaitValue32, cuGraphLaunch) becomes a node of the capture's
 *   graph and does not run. cuEventRecord on it makes a captured event; a
 *   stream that waits on a captured event joins that capture (the fork), and
 *   the origin waiting on an event of the forked stream joins it back.
 * - cuGraphLaunch runs the graph's work in capture order on the launch
 *   stream, as one piece of stream work; device pointers are the recorded
 *   ones, so a replay touches whatever memory is there now.
 * - Errors: cuEventQuery / cuEventSynchronize on a captured event,
 *   CUDA_ERROR_CAPTURED_EVENT (also cuStreamWaitEvent on one whose capture
 *   ended); cuStreamSynchronize / cuStreamQuery / cuStreamDestroy /
 *   cuStreamGetId (refused so on an H100, docs/gpu/capture_rules.txt) on a
 *   capturing stream, and cuCtxSynchronize while a stream of the device
 *   captures, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating; a
 *   capturing stream waiting on an event not captured in its capture,
 *   CUDA_ERROR_STREAM_CAPTURE_ISOLATION (another live capture's: _MERGE),
 *   invalidating; any use of the legacy stream (NULL, CU_STREAM_LEGACY)
 *   while a blocking stream of the device captures,
 *   CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, invalidating except for the capture
 *   queries; work, records and waits on a stream of an invalidated capture,
 *   CUDA_ERROR_STREAM_CAPTURE_INVALIDATED; cuStreamBeginCapture on the legacy
 *   stream, _UNSUPPORTED, on a capturing stream, CUDA_ERROR_ILLEGAL_STATE;
 *   cuStreamEndCapture on a stream not capturing, CUDA_ERROR_ILLEGAL_STATE,
 *   on a stream that joined but did not begin the capture, _UNMATCHED
 *   (invalidating), from another thread than the one that began a capture
 *   not begun in RELAXED mode, _WRONG_THREAD (the capture goes on), and for
 *   an invalidated capture _INVALIDATED, for one with a forked stream whose
 *   last captured work the origin does not wait on, _UNJOINED (no graph in
 *   either case, and the capture ends for all its streams).
 * - Potentially unsafe calls, as cuThreadExchangeStreamCaptureMode
 *   documents (CUDA gives no exhaustive list; the fake's is): cuMemAlloc,
 *   cuMemFree, cuMemHostAlloc, cuMemFreeHost, cuMemCreate, cuMemRelease,
 *   cuMemMap, cuMemUnmap, cuMemSetAccess, cuMemAddressReserve,
 *   cuMemAddressFree, cuCtxSynchronize, cuStreamSynchronize, cuStreamQuery,
 *   cuEventSynchronize, cuEventQuery (any event), and cuMemcpyDtoHAsync into
 *   pageable host memory on a stream that does not capture (it waits for the
 *   copy like a synchronous cuMemcpy). One is prohibited from a thread in
 *   GLOBAL mode (the default) while the thread has a capture underway not
 *   begun in RELAXED mode or any thread has one begun in GLOBAL mode; in
 *   THREAD_LOCAL mode only by the thread's own captures not begun in
 *   RELAXED mode; in RELAXED mode never. A prohibited call returns
 *   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, does nothing else, and
 *   invalidates the captures that prohibited it.
 * - Capture ids are unique over the process lifetime, from 1.
 * Every call that breaks a rule counts in fakecuda_capture_violations, and
 * aborts the process when FAKECUDA_STRICT_CAPTURE is on. */
/* Calls so far that broke a stream capture rule (counted whether or not the
 * "capture" check is on). */
typedef unsigned long long (*fakecuda_capture_violations_fn)(void);

#endif
