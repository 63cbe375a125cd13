/* Owns nothing but the device calls of the ordinary segment source
 * (expandable_segments:false, source.h): every growth is one device
 * allocation that becomes a segment of its own, and a segment goes back
 * whole, one mem_free. The pool decides the sizes and which segments go
 * back; this file only talks to the device. Under the pool lock except
 * plain_give_back. */
#include <stdlib.h>

#include "source/source.h"

static bool plain_plan(gma__source_t *s, const gma__grow_req_t *req, gma__plan_t *pl) {
  (void)s;
  *pl = (gma__plan_t){.need = req->size, .tail = -1};
  return true;
}

static gma_status_t plain_grow(gma__source_t *s, const gma__grow_req_t *req, gma__plan_t *pl,
                               gma__grown_t *out) {
  (void)pl;
  *out = (gma__grown_t){.size = req->size, .calls = 1};
  return s->dev->ops->mem_alloc(s->dev, req->size, &out->addr);
}

static void plain_ungrow(gma__source_t *s, const gma__grown_t *g) {
  s->dev->ops->mem_free(s->dev, g->addr, g->size);
}

/* Only a whole segment can go back: the pool offers only those. */
static uint64_t plain_releasable(const gma__source_t *s, const void *range, uintptr_t addr,
                                 uint64_t size, uint64_t want, uintptr_t *lo, uintptr_t *hi) {
  (void)s, (void)range, (void)want;
  *lo = addr;
  *hi = addr + size;
  return size;
}

static bool plain_take(gma__source_t *s, const void *range, uintptr_t addr, uint64_t size,
                       gma__span_t *out) {
  (void)s;
  *out = (gma__span_t){.range = range, .addr = addr, .size = size};
  return true;
}

/* One mem_free, traced where it happened (cuMemFree synchronizes, so the
 * pool calls this without its lock when it can). */
static void plain_give_back(gma__source_t *s, gma__span_t *x) {
  x->done = 0;
  x->calls = 0;
  if (s->dev->ops->mem_free(s->dev, x->addr, x->size) != GMA_OK) return;
  x->done = x->size;
  x->calls = 1;
  gma__trace_t *t = gma__trace_on(s->trace);
  if (t)
    gma__trace_emit(t, gma__trace_now(), GMA__TR_SEGMENT_FREE, x->addr, x->size, 0, 0, 0, 0, 0);
}

static void plain_settle(gma__source_t *s, gma__span_t *x) { (void)s, (void)x; }

static void plain_reuse(gma__source_t *s, const void *range, uintptr_t addr, uint64_t size) {
  (void)s, (void)range, (void)addr, (void)size;
}

static void plain_drop(gma__source_t *s, const void *range, uintptr_t addr, uint64_t size) {
  gma__span_t x = {.range = range, .addr = addr, .size = size};
  plain_give_back(s, &x);
}

static void plain_fini(gma__source_t *s) { free(s); }

static const gma__source_ops_t plain_ops = {
    .plan = plain_plan,
    .grow = plain_grow,
    .ungrow = plain_ungrow,
    .releasable = plain_releasable,
    .take = plain_take,
    .give_back = plain_give_back,
    .settle = plain_settle,
    .reuse = plain_reuse,
    .drop = plain_drop,
    .fini = plain_fini,
};

gma__source_t *gma__plain_source_new(gma__device_t *dev, gma__trace_t *_Atomic const *trace) {
  gma__source_t *s = malloc(sizeof *s);
  if (s) *s = (gma__source_t){.ops = &plain_ops, .dev = dev, .trace = trace};
  return s;
}
