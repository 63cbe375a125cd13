/* CUDA graph capture: graph pools and the captures gma was told of.
 *
 * A graph replays, at every launch, the device work captured into it, at the
 * addresses it had at capture. Memory allocated while a stream captures must
 * therefore stay the graph's for as long as the graph may be launched, and
 * must never be handed to anyone else meanwhile: it comes from a graph pool
 * (gma_graph_pool_create), PyTorch's "private pool". A graph pool
 * sub-allocates chunks it takes from the pool below as arenas
 * (GMA__ALLOC_ARENA | GMA__ALLOC_CAPTURE: only memory no device work can
 * still use); the pool sees each chunk as one live block, so nothing of a
 * graph pool is reused outside it until the pool is released and its
 * chunks are given back (after a device synchronize: graphs launched before
 * the release may still run).
 *
 * Inside a graph pool, a block freed during a capture is reused only by the
 * same capture on the same stream (stream order inside the graph protects
 * it; another stream's nodes may run concurrently), and never if
 * gma_record_stream named another stream for it; when that capture ends it
 * becomes free for later captures into the pool. A block freed outside any
 * capture (a graph's output the program dropped) is free for later captures
 * into the pool at once. Graphs that share a pool must be launched in the
 * order they were captured, never concurrently (PyTorch's rule for a shared
 * private pool): a later graph's nodes reuse an earlier one's memory.
 *
 * Which graph pool serves a request: the captures gma was told of
 * (gma_capture_begin) are matched by the device's capture id, so a stream
 * that joined a capture through an event (a fork inside the graph) is served
 * by that capture's pool too. A capture not told of is refused by the pool
 * below (gma__pool_refuse_capture) at every request that reaches it.
 *
 * gma__graphs_t.lock comes before the pools' locks (base/lock.h's ranks):
 * graph.c calls the pool with it held; the pool never calls up. Fields are
 * guarded by the lock unless marked atomic. */
#ifndef GMA_GRAPH_H
#define GMA_GRAPH_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/atomics.h"
#include "gma.h"
#include "core/internal.h"

typedef struct gma__gchunk gma__gchunk_t;
typedef struct gma__capture gma__capture_t;

typedef struct gma__graphs {
  pthread_mutex_t lock;
  gma__pool_t *p;                  /* immutable */
  gma__device_t *dev;              /* immutable */
  _Atomic uint32_t capturing;      /* atomic: captures told of and not ended (read by the
                                      hot path: zero means "no routing") */
  _Atomic uint32_t nchunks;        /* atomic: chunks held by graph pools (zero: a free
                                      cannot be a graph pool's) */
  gma__capture_t *caps;            /* the captures underway, unordered */
  size_t ncaps, caps_cap;
  gma__gchunk_t **chunks;          /* every pool's chunks, sorted by base */
  size_t chunks_cap;
  gma_graph_pool_t *pools;         /* live pools (created, not yet given back) */
  uint64_t serial;                 /* last capture serial handed out */
  uint64_t pools_made;
} gma__graphs_t;

void gma__graphs_init(gma__graphs_t *gs, gma__pool_t *p, gma__device_t *dev);
/* gma_destroy, after a device synchronize: gives every chunk back to the
 * pool and frees every record; *leaks / *leaked: graph-pool allocations
 * still live (freed with it). One thread, nothing in flight. */
void gma__graphs_fini(gma__graphs_t *gs, uint64_t *leaks, uint64_t *leaked);

/* A fork() child's inherited allocator: frees the host records only (no
 * pool call; the device memory is the parent's). */
void gma__graphs_forget(gma__graphs_t *gs);

/* Serves n requests (sizes[i] bytes, or size when sizes is NULL) on stream
 * from the pool of the capture stream belongs to, all or none, into ptrs.
 * GMA_PENDING: stream is not capturing, the caller serves it as usual.
 * GMA_ERR_INVALID_ARGUMENT: capturing in a capture gma was not told of.
 * Any thread; called only while gs->capturing is nonzero. */
gma_status_t gma__graph_alloc(gma__graphs_t *gs, size_t n, const size_t *sizes, size_t size,
                              gma_stream_t stream, void **ptrs);
/* Frees ptr if a graph pool holds it: GMA_OK, or an error for a pointer
 * inside a chunk that is not a live allocation's start. GMA_PENDING: not a
 * graph pool's, the caller frees it as usual. Any thread. */
gma_status_t gma__graph_free(gma__graphs_t *gs, void *ptr);
/* gma_pointer_info for a graph pool's memory: 1 with r filled when ptr
 * lies in a live block of a graph pool (its start, or anywhere inside);
 * -1 when it lies in a graph pool's chunk but in no live block; 0 when no
 * graph pool holds it. Any thread. */
int gma__graph_info(gma__graphs_t *gs, const void *ptr, gma_pointer_info_t *r);
/* gma_record_stream on a graph pool's memory: GMA_PENDING if not one. */
gma_status_t gma__graph_record_stream(gma__graphs_t *gs, void *ptr, gma_stream_t stream,
                                      void **base);

gma_status_t gma__graph_pool_create(gma__graphs_t *gs, gma_graph_pool_t **out);
gma_status_t gma__graph_pool_release(gma__graphs_t *gs, gma_graph_pool_t *pool);
gma_status_t gma__capture_begin(gma__graphs_t *gs, gma_stream_t stream, gma_graph_pool_t *pool);
gma_status_t gma__capture_end(gma__graphs_t *gs, gma_stream_t stream);
gma_status_t gma__graph_pool_stats(gma__graphs_t *gs, gma_graph_pool_t *pool,
                                   gma_graph_pool_stats_t *out);
/* Totals over every graph pool, for gma_stats (lock taken). */
void gma__graphs_totals(gma__graphs_t *gs, uint64_t *pools, uint64_t *bytes, uint64_t *live);

#endif /* GMA_GRAPH_H */
