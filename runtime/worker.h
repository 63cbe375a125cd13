/* The allocator's worker thread: timed trimming (release threshold, idle
 * segments), memory-pressure levels and their callback, growth ahead of
 * demand. It sleeps on a condition variable between ticks (no CPU while
 * idle) and is joined by gma_destroy before anything else is torn down. */
#ifndef GMA_WORKER_H
#define GMA_WORKER_H

#include <pthread.h>
#include <stdbool.h>

#include "pool.h"

typedef struct gma__worker {
  pthread_t thread;
  bool started;                /* immutable after start */
  pthread_mutex_t mu;          /* guards stop, cb, cb_user; cv's mutex */
  pthread_cond_t cv;           /* on CLOCK_MONOTONIC */
  bool stop;
  gma_pressure_callback_t cb;
  void *cb_user;
  gma_t *g;                    /* immutable: passed to the callback */
  gma__pool_t *p;              /* immutable */
  uint64_t interval_ns, release_threshold, idle_ns, grow_ahead; /* immutable */
  int level;                   /* mu: the level last reported */
  bool report;                 /* mu: report the level at the next tick even if unchanged */
} gma__worker_t;

/* Starts the thread (unless cfg->worker_off). One thread, at gma_create. */
gma_status_t gma__worker_start(gma__worker_t *w, gma_t *g, gma__pool_t *p,
                               const gma_config_t *cfg);
/* Wakes the thread, joins it, frees its resources. Idempotent. */
void gma__worker_stop(gma__worker_t *w);
/* Any thread. */
gma_status_t gma__worker_set_callback(gma__worker_t *w, gma_pressure_callback_t cb, void *user);

#endif /* GMA_WORKER_H */
