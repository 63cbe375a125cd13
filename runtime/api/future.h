/* What the futures of one allocator share (future_shared.c), and the calls
 * api.c and fork.c make on them. The futures themselves, and the async entry
 * points, are future.c's; the worker runs them as generic requests. */
#ifndef GMA_FUTURE_H
#define GMA_FUTURE_H

#include "worker/worker.h"

#define GMA__LATENCY_BUCKETS 512 /* size-class buckets (sizeclass.h): up to ~4 s, 1/32 above 1 ms */

/* The anchor: futures outlive their allocator (wait, poll and release are
 * allowed during and after gma_destroy), so each holds a reference to this
 * small object instead of trusting g.
 * Invariant: a future touches g's pool only between gma__anchor_enter
 * returning g and gma__anchor_exit; gma__futures_stop (gma_destroy, before
 * the leak report and the pool's teardown) sets g to NULL and then waits
 * until no thread is inside, so whatever a future did to the pool happened
 * before the teardown, and nothing happens after it. */
typedef struct gma__anchor {
  gma_t *_Atomic g;
  _Atomic uint64_t refs;
  _Atomic uint32_t inside; /* threads between enter and exit */
  /* Set in a child process after fork() (fork.c), where the worker that
   * would complete these futures does not exist: wait, poll and release
   * answer at once and never touch g. Relaxed: set before any other code
   * runs in the child. */
  _Atomic bool forked;
} gma__anchor_t;
/* g while it lives (then call gma__anchor_exit), or NULL once destroyed. */
gma_t *gma__anchor_enter(gma__anchor_t *a);
void gma__anchor_exit(gma__anchor_t *a);
/* Drops one reference (a future's or the allocator's); the last frees it. */
void gma__anchor_unref(gma__anchor_t *a);

/* One allocator's futures. */
typedef struct gma__futures {
  gma__anchor_t *anchor;       /* shared with every future; NULL without a worker */
  uint64_t timeout_ns;         /* immutable: future_timeout_ms */
  /* submitted and ready count requests handed to the worker; ready_at_once
   * those complete on the submitting thread (gma_stats adds them to both). */
  _Atomic uint64_t submitted, ready_at_once, ready, failed, timed_out, queued;
  _Atomic uint64_t latency[GMA__LATENCY_BUCKETS]; /* completions write, stats reads */
} gma__futures_t;

/* gma_create: the anchor, then the worker thread (unless worker:off) with
 * the tick hooks given. */
gma_status_t gma__futures_start(gma_t *g, const gma__worker_hooks_t *hooks);
/* gma_destroy and gma_abandon: stops the worker (it cancels every request
 * it still holds), then futures stop reaching g; returns once no thread is
 * between enter and exit. Idempotent. */
void gma__futures_stop(gma_t *g);
/* fork()'s child handler: the futures of g answer at once from now on. */
void gma__futures_forked(gma_t *g);
/* gma_destroy of an allocator inherited across fork() (fork.c): drops the
 * allocator's reference without waiting for threads inside, which in the
 * child are parent threads that do not exist, and frees the worker's ring. */
void gma__futures_forget(gma_t *g);
/* Adds the futures' counters to *st (a full-size struct). */
void gma__futures_stats(gma_t *g, gma_stats_t *st);

#endif /* GMA_FUTURE_H */
