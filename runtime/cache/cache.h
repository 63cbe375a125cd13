/* The lock-free hot path (cache/stream_cache.c): the bins and the per-thread
 * cache in front of the stream table. */
#ifndef GMA_CACHE_CACHE_H
#define GMA_CACHE_CACHE_H

#include "core/table.h"

/* Serves size from the stream's bin without a lock; GMA_OK with *out set, or
 * GMA_ERR_OOM meaning "miss: take the slow path" (never reported as such).
 * id is the device's id of the stream (the caller asked once, for both paths);
 * a record found with that id goes into the calling thread's stream cache.
 * Any thread; lock-free. */
gma_status_t gma__bin_alloc(gma__pool_t *p, size_t size, gma_stream_t stream, uint64_t id,
                           void **out);
/* The live record of the stream handle names, whose device id is id (the
 * caller asked the device), put in the calling thread's stream cache; NULL
 * when gma has none yet (the slow path makes it) or it was retired. Any
 * thread; lock-free. */
gma__stream_t *gma__stream_live(gma__pool_t *p, gma_stream_t stream, uint64_t id);
/* The same without the device's id: only through the calling thread's stream
 * cache (stream_cache.c), so it makes no device call; a miss when the cache
 * has no live entry for the stream (ask the device, then gma__bin_alloc).
 * Relies on streams being retired before they are destroyed. Any thread;
 * wait-free apart from the ck_stack pop. */
gma_status_t gma__bin_alloc_cached(gma__pool_t *p, size_t size, gma_stream_t stream,
                                   void **out);
/* The device's id of stream: from the calling thread's stream cache when it
 * holds a live record of it (no device call, relying on streams being
 * retired before they are destroyed, as a bin hit does), else asked of the
 * device (which, on CUDA, asks whether it captures first). The slow path's
 * capture check (gma__pool_refuse_capture) does not depend on it. Any
 * thread; wait-free on a cache hit. */
gma_status_t gma__stream_id(gma__pool_t *p, gma_stream_t stream, uint64_t *id);
/* The record the calling thread's stream cache holds for handle in p, or
 * NULL when it has none that may be used (for tests: what a bin hit would
 * pop from, without popping). */
gma__stream_t *gma__stream_cached(gma__pool_t *p, gma_stream_t handle);
gma_status_t gma__bin_free(gma__pool_t *p, void *ptr);

#endif /* GMA_CACHE_CACHE_H */
