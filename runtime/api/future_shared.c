/* Owns what the futures of one allocator share (future.h): the anchor that
 * tells them whether the allocator still lives, their counters and
 * statistics, and the worker's start and stop around them. The futures
 * themselves are future.c's. */
#include <sched.h>
#include <stdlib.h>

#include "api/allocator.h"
#include "base/sizeclass.h"

/* ---- The anchor ---------------------------------------------------------------*/

static gma__anchor_t *anchor_new(gma_t *g) {
  gma__anchor_t *a = malloc(sizeof *a);
  if (!a) return NULL;
  gma__atomic_init(&a->g, g);
  gma__atomic_init(&a->refs, 1); /* the allocator's */
  gma__atomic_init(&a->inside, 0);
  gma__atomic_init(&a->forked, false);
  return a;
}

/* enter and detach are a Dekker pair (seq_cst): either enter sees NULL, or
 * detach sees the thread inside and waits for its exit. */
gma_t *gma__anchor_enter(gma__anchor_t *a) {
  gma__faa_seq_cst(&a->inside, 1);
  gma_t *g = gma__load_seq_cst(&a->g);
  if (!g) gma__fas_release(&a->inside, 1);
  return g;
}

void gma__anchor_exit(gma__anchor_t *a) {
  gma__fas_release(&a->inside, 1); /* pairs with detach */
}

void gma__anchor_unref(gma__anchor_t *a) {
  if (gma__fas_seq_cst(&a->refs, 1) == 1) free(a);
}

static void anchor_detach(gma__anchor_t *a) {
  gma__store_seq_cst(&a->g, NULL);
  while (gma__load_seq_cst(&a->inside)) sched_yield(); /* a wait or release finishing its pool work */
  gma__anchor_unref(a);
}

static void anchor_forget(gma__anchor_t *a) {
  gma__store_seq_cst(&a->g, NULL);
  gma__anchor_unref(a);
}

/* ---- An allocator's futures -------------------------------------------------------*/

gma_status_t gma__futures_start(gma_t *g, const gma__worker_hooks_t *hooks) {
  gma__futures_t *fs = &g->futures;
  fs->timeout_ns = g->cfg.future_timeout_ms * 1000000u;
  if (!g->cfg.worker_off && !(fs->anchor = anchor_new(g)))
    return gma__set_error(GMA_ERR_INTERNAL, "cannot start gma's worker thread");
  gma_status_t st = gma__worker_start(&g->worker, g, &g->pool, hooks, &g->cfg);
  if (st != GMA_OK && fs->anchor) {
    gma__anchor_unref(fs->anchor);
    fs->anchor = NULL;
  }
  return st;
}

void gma__futures_stop(gma_t *g) {
  gma__worker_stop(&g->worker); /* cancels every request it still held */
  if (!g->futures.anchor) return;
  anchor_detach(g->futures.anchor); /* futures waited on or released from now on no longer reach g */
  g->futures.anchor = NULL;
}

void gma__futures_forked(gma_t *g) {
  if (g->futures.anchor) gma__store_relaxed(&g->futures.anchor->forked, true);
}

void gma__futures_forget(gma_t *g) {
  gma__worker_forget(&g->worker);
  if (!g->futures.anchor) return;
  anchor_forget(g->futures.anchor); /* futures keep the anchor; they see forked */
  g->futures.anchor = NULL;
}

void gma__futures_stats(gma_t *g, gma_stats_t *st) {
  gma__futures_t *fs = &g->futures;
  /* Futures complete at once are counted only in ready_at_once (complete()). */
  st->futures_ready_at_once = gma__load_relaxed(&fs->ready_at_once);
  st->futures_submitted = gma__load_relaxed(&fs->submitted) + st->futures_ready_at_once;
  st->futures_ready = gma__load_relaxed(&fs->ready) + st->futures_ready_at_once;
  st->futures_failed = gma__load_relaxed(&fs->failed);
  st->futures_timed_out = gma__load_relaxed(&fs->timed_out);
  st->queue_depth = gma__load_relaxed(&fs->queued);
  uint64_t counts[GMA__LATENCY_BUCKETS], total = 0;
  for (unsigned b = 0; b < GMA__LATENCY_BUCKETS; b++)
    total += counts[b] = gma__load_relaxed(&fs->latency[b]);
  uint64_t seen = 0;
  for (unsigned b = 0; b < GMA__LATENCY_BUCKETS && total; b++) {
    seen += counts[b];
    /* A bucket's upper bound: percentiles are within 1/8 above the truth. */
    if (!st->submit_to_ready_p50_ns && seen * 2 >= total)
      st->submit_to_ready_p50_ns = gma__class_size(b);
    if (!st->submit_to_ready_p99_ns && seen * 100 >= total * 99)
      st->submit_to_ready_p99_ns = gma__class_size(b);
  }
}
