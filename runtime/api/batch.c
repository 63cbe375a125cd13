/* Owns gma_alloc_batch: the sizes' check (shared with the async batch), the
 * graph pool or the pool, and the OOM observer's retry. */
#include <inttypes.h>

#include "api/allocator.h"
#include "core/internal.h"

#define CHECK_ARG(cond, ...) \
  do {                       \
    if (!(cond)) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)

static gma_status_t batch_pool(gma_t *g, size_t n, const size_t *sizes, gma_stream_t stream,
                               void **ptrs);

gma_status_t gma__batch_sizes_check(gma_t *g, size_t n, const size_t *sizes, const char *fn) {
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (sizes[i] == 0) return gma__set_error(GMA_ERR_INVALID_SIZE, "%s: sizes[%zu] is 0", fn, i);
    if (!gma__blocks_fit(&total, sizes[i], 1, g->cfg.memory_limit))
      return gma__set_error(GMA_ERR_INVALID_SIZE,
                            "%s: the batch needs more than this allocator can ever hold "
                            "(memory_limit / device capacity %" PRIu64 " bytes) by block %zu",
                            fn, g->cfg.memory_limit, i);
  }
  return GMA_OK;
}

gma_status_t gma_alloc_batch(gma_t *g, size_t n, const size_t *sizes, gma_stream_t stream,
                             void **ptrs) {
  GMA__CHECK(g, "gma_alloc_batch");
  stream = gma__stream_arg(g, stream);
  CHECK_ARG(n > 0 && sizes && ptrs, "gma_alloc_batch: n is 0, or sizes or ptrs is NULL");
  gma_status_t st = gma__batch_sizes_check(g, n, sizes, "gma_alloc_batch");
  if (st != GMA_OK) return st;
  st = gma__load_relaxed(&g->graphs.capturing)
                        ? gma__graph_alloc(&g->graphs, n, sizes, 0, stream, ptrs)
                        : GMA_PENDING;
  if (st == GMA_PENDING) /* not capturing: the pool's, as always */
    st = batch_pool(g, n, sizes, stream, ptrs);
  gma__trace_t *t = gma__trace_on(&g->pool.trace);
  if (t) gma__trace_batch(g, t, st, n, sizes, stream, ptrs);
  return st;
}

/* gma_alloc_batch from the pool, with the OOM observer's retry. */
static gma_status_t batch_pool(gma_t *g, size_t n, const size_t *sizes, gma_stream_t stream,
                               void **ptrs) {
  uint64_t id;
  gma_status_t st = gma__stream_id(&g->pool, stream, &id);
  if (st != GMA_OK) return st;
  bool observed = gma__oom_observed(g);
  unsigned kept = observed ? gma__error_keep() : 0;
  unsigned flags = GMA__ALLOC_WAIT | (observed ? GMA__ALLOC_UNCOUNTED : 0);
  st = gma__pool_alloc_batch(&g->pool, n, sizes, stream, id, flags, ptrs);
  if (observed) {
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += sizes[i];
    if (st == GMA_ERR_OOM && gma__oom_observe(g, total, stream))
      st = gma__pool_alloc_batch(&g->pool, n, sizes, stream, id, GMA__ALLOC_WAIT, ptrs);
    else if (st == GMA_ERR_OOM)
      gma__pool_oom_count(&g->pool, total, stream);
    gma__error_done(kept, st);
  }
  return st;
}

