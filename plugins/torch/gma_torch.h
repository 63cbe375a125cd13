/* libgma_torch.so: gma as PyTorch's CUDA allocator (CUDAPluggableAllocator)
 * and the exports for reading gma's state of each device. For C and C++
 * callers; Python uses gma.torch (python/gma/torch.py). Every function may be
 * called from any thread. Statuses are gma_status_t values; the message of a
 * failure is gma_torch_last_error() (the plug-in's own, per thread). */
#ifndef GMA_TORCH_H
#define GMA_TORCH_H

#include <sys/types.h>

#include "gma.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What CUDAPluggableAllocator(path, "gma_torch_alloc", "gma_torch_free")
 * loads. stream is a cudaStream_t. Size 0 gives NULL (no error); a failure
 * gives NULL and one line on stderr. The first call on a device creates its
 * allocator from GMA_CONF with device_id = device. */
void *gma_torch_alloc(ssize_t size, int device, void *stream);
void gma_torch_free(void *ptr, ssize_t size, int device, void *stream);
/* gma_torch_alloc that reports instead of logging: GMA_OK with *out set
 * (NULL for size 0), or the failure's status (GMA_ERR_OOM, or
 * GMA_ERR_INVALID_SIZE for more than the device or memory_limit holds;
 * GMA_ERR_CANCELLED after gma_torch_shutdown; ...) with *out NULL and
 * gma_torch_last_error() set. What the C++ shim libgma_torch_shim.so calls. */
int gma_torch_try_alloc(ssize_t size, int device, void *stream, void **out);

const char *gma_torch_last_error(void);
/* device's allocator (created if needed), to call libgma directly. */
gma_t *gma_torch_allocator(int device);
int gma_torch_stats(int device, gma_stats_t *out); /* zeros before the first allocation */
int gma_torch_summary(int device, char *buf, size_t len);
int gma_torch_snapshot(int device, const char *path);
/* gma_snapshot_write of device's allocator: format GMA_SNAPSHOT_JSON or
 * GMA_SNAPSHOT_TORCH (PyTorch's _snapshot() structure, as a pickle). */
int gma_torch_snapshot_write(int device, const char *path, int format);
int gma_torch_empty_cache(int device);
/* gma_iteration_mark of device's allocator: call it at the same point of
 * every training or inference iteration (plan:on in GMA_CONF plans the
 * memory of a repeating iteration; a no-op under plan:off). GMA_OK when the
 * device has no allocator yet. */
int gma_torch_iteration_mark(int device);
int gma_torch_record_stream(void *ptr, int device, void *stream);
/* Destroys every allocator (registered with atexit); later allocations fail
 * and later frees do nothing. */
void gma_torch_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif /* GMA_TORCH_H */
