/* Owns starting and stopping a trace (gma_trace_start and gma_trace_stop,
 * whose arguments api/observe.c checks): a trace's first rows (what is live
 * when it starts), then the pool publishes it (core/inspect.c). The recorder
 * itself is base/trace.c. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "api/allocator.h"
#include "base/trace.h"
#include "observe/observe.h"

/* gma__plan_each_live's callback: one allocate row for a live planned block. */
typedef struct start_rows {
  gma__trace_t *t;
  uint64_t now;
} start_rows_t;
static bool planned_row(void *arg, const gma_allocation_info_t *info, uint64_t born) {
  (void)born;
  start_rows_t *r = arg;
  gma__trace_emit(r->t, r->now, GMA__TR_ALLOCATE, (uintptr_t)info->ptr, info->requested,
                  (uintptr_t)info->stream, info->block_size, 0, 0, 0);
  return true;
}

/* Lock held: a trace that starts on an allocator already in use begins
 * with its state, so that a replay starts where the program was: a
 * segment_alloc row per ordinary segment (segment_map per growable one)
 * and an allocate row per live allocation (a plan's arena as its live
 * planned blocks), all at the start time. Without them a trace begun
 * mid-run replayed with frees of unknown pointers, its peak live bytes too
 * low and no recorded reserved bytes. An allocation a lock-free bin hit
 * makes while this runs may be missed (its later free then counts as
 * unmatched in the replay); memory reserved is exact. */
static void start_rows(void *arg, gma__trace_t *t) {
  gma_t *g = arg;
  gma__pool_t *p = &g->pool;
  start_rows_t r = {t, gma__trace_now()};
  for (size_t i = 0; i < p->nsegs; i++) {
    const gma__segment_t *seg = p->segs[i];
    gma__trace_emit(t, r.now, seg->range ? GMA__TR_SEGMENT_MAP : GMA__TR_SEGMENT_ALLOC, seg->base,
                    seg->size, 0, 0, 0, 0, 0);
  }
  for (size_t i = 0; i < p->nsegs; i++)
    for (gma__block_t *b = p->segs[i]->first; b; b = b->next) {
      if (gma__load_relaxed(&b->state) != GMA__LIVE) continue;
      if (g->cfg.plan && gma__plan_each_live(&g->plan, b->addr, planned_row, &r)) continue;
      gma__trace_emit(t, r.now, GMA__TR_ALLOCATE, b->addr, gma__load_relaxed(&b->requested),
                      b->stream ? (uintptr_t)b->stream->handle : 0, b->size, 0, 0, 0);
    }
}

gma_status_t gma__trace_start(gma_t *g, const char *path) {
  gma__trace_t *t;
  gma_status_t st = gma__trace_open(path, &t);
  if (st != GMA_OK) return st;
  gma__trace_t *old = gma__pool_trace_publish(&g->pool, t, start_rows, g);
  return old ? gma__trace_close(old) : GMA_OK;
}

gma_status_t gma__trace_stop(gma_t *g) {
  gma__trace_t *t = gma__pool_trace_withdraw(&g->pool);
  return t ? gma__trace_close(t) : GMA_OK;
}
