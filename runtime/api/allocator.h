/* The allocator object itself: what one gma_t holds. Shared by api/'s files
 * (api.c creates and destroys it) and read by observe/'s. */
#ifndef GMA_ALLOCATOR_H
#define GMA_ALLOCATOR_H

#include "device/device.h"
#include "api/fork.h"
#include "graph/graph.h"
#include "host/host.h"
#include "plan/plan.h"
#include "cache/cache.h"
#include "core/internal.h"
#include "worker/worker.h"
#include "api/future.h"
#include "api/oom_observer.h"

/* magic: LIVE from gma_create until gma_destroy, then DEAD. The structs of
 * the last 64 destroyed allocators are kept (on a process-wide list, so leak
 * checkers see them reachable) so that a call on such a stale handle finds
 * DEAD and fails with a clear error instead of reading freed memory. Calls
 * racing with gma_destroy are not allowed and not detected. In a child
 * process after fork(), every allocator that was LIVE in the parent is
 * FORKED (fork.c's atfork handler): a third value, so the hot path stays one
 * compare and only the slow path below tells the cases apart. */
#define GMA__MAGIC_LIVE 0x6c6976655f616d67ull /* "gma_live" */
#define GMA__MAGIC_DEAD 0x646165645f616d67ull /* "gma_dead" */
#define GMA__MAGIC_FORKED 0x6b726f665f616d67ull /* "gma_fork" */
#define GMA__MAGIC_ABANDONED 0x646e62615f616d67ull /* "gma_abnd": gma_abandon, at exit */

struct gma {
  uint64_t magic;
  struct gma *next_dead; /* the list of destroyed allocators (api.c) */
  struct gma *fork_prev, *fork_next; /* the registry of live allocators (fork.c's lock) */
  gma__device_t *dev; /* immutable after gma_create */
  gma_config_t cfg;   /* resolved; immutable after gma_create */
  gma__pool_t pool;
  gma__host_t host;   /* pinned host memory and CPU fallbacks */
  gma__worker_t worker;
  gma__futures_t futures; /* what its futures share: anchor, counters (future.h) */
  gma__planner_t plan; /* planned memory (plan:on); inert otherwise */
  gma__graphs_t graphs; /* graph pools and captures (CUDA graphs); inert until used */
  gma__oom_observer_t oom; /* gma_set_oom_observer */
};

/* GMA_OK for a live allocator; GMA_ERR_INVALID_ARGUMENT naming fn for NULL,
 * a destroyed one, or one inherited across fork(). One load and compare:
 * every entry point calls it. */
static inline gma_status_t gma__check(const gma_t *g, const char *fn) {
  if (__builtin_expect(g != NULL && g->magic == GMA__MAGIC_LIVE, 1)) return GMA_OK;
  if (!g) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "%s: allocator is NULL", fn);
  if (g->magic == GMA__MAGIC_DEAD)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "%s: the allocator was destroyed (gma_destroy); its handle must not be "
                          "used any more", fn);
  if (g->magic == GMA__MAGIC_ABANDONED)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "%s: the allocator was abandoned (gma_abandon, for process exit); its "
                          "handle must not be used any more", fn);
  if (g->magic == GMA__MAGIC_FORKED)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "%s: this allocator was created by the parent process before fork(); "
                          "create a new allocator in the child (gma_destroy releases the "
                          "inherited one's host memory)", fn);
  return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "%s: %p is not an allocator gma_create made",
                        fn, (const void *)g);
}
/* The stream a caller's handle names: under default_stream:per_thread a NULL
 * stream is the calling thread's default stream, GMA_STREAM_PER_THREAD (for
 * programs built with nvcc --default-stream per-thread). Every entry point
 * taking a stream maps it first, after checking g. */
static inline gma_stream_t gma__stream_arg(const gma_t *g, gma_stream_t stream) {
  return stream == NULL && g->cfg.per_thread_default_stream ? GMA_STREAM_PER_THREAD : stream;
}

/* Adds count blocks of size bytes (each rounded up to 512) to *total, the
 * bytes a request of several blocks needs; false, *total unchanged, when a
 * size is 0 or above limit or the total would pass limit. Each size is
 * checked before rounding and the sum without wrapping: a size near
 * SIZE_MAX must not round to a small block (a fuzzer finding), nor counts
 * wrap. gma_alloc_batch, its async form and gma_reserve. */
static inline bool gma__blocks_fit(uint64_t *total, size_t size, size_t count, uint64_t limit) {
  if (size == 0 || size > limit) return false;
  uint64_t rounded = ((uint64_t)size + 511) / 512 * 512;
  if (count > (limit - *total) / rounded) return false;
  *total += count * rounded; /* at most limit */
  return true;
}

/* The sizes of a batch of n blocks (gma_alloc_batch and its async form):
 * GMA_ERR_INVALID_SIZE naming the first size that is 0, or the block by
 * which the batch needs more than the allocator can ever hold; errors name
 * fn. */
gma_status_t gma__batch_sizes_check(gma_t *g, size_t n, const size_t *sizes, const char *fn);
/* The trace rows of a gma_alloc_batch call (api.c). */
void gma__trace_batch(gma_t *g, gma__trace_t *t, gma_status_t st, size_t n, const size_t *sizes,
                      gma_stream_t stream, void *const *ptrs);

#define GMA__CHECK(g, fn)                      \
  do {                                         \
    gma_status_t chk_ = gma__check((g), (fn)); \
    if (chk_ != GMA_OK) return chk_;           \
  } while (0)

/* The pool behind an allocator, for internal tests. */
gma__pool_t *gma__pool_of(gma_t *g);

#endif /* GMA_ALLOCATOR_H */
