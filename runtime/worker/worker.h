/* The allocator's worker thread: timed trimming (release threshold, idle
 * segments), memory-pressure levels and their callback, growth ahead of
 * demand. It sleeps on a condition variable between ticks (no CPU while
 * idle) and is joined by gma_destroy before anything else is torn down. */
#ifndef GMA_WORKER_H
#define GMA_WORKER_H

#include <ck_ring.h>
#include <pthread.h>
#include <stdbool.h>

#include "core/internal.h"

#define GMA__LATENCY_BUCKETS 512 /* size-class buckets (sizeclass.h): up to ~4 s, 1/32 above 1 ms */

/* What the layers above have the worker do on each timed tick, around the
 * pool's release (the worker names none of them): reclaim runs before it,
 * with the age past which idle memory goes (ns); after runs after it, with
 * the pressure level. Either may be NULL. */
typedef struct gma__worker_hooks {
  void (*reclaim)(void *arg, uint64_t unused_ns);
  void (*after)(void *arg, int level);
  void *arg;
} gma__worker_hooks_t;

typedef struct gma__worker {
  pthread_t thread;
  bool started;                /* immutable after start */
  pthread_mutex_t mu;          /* guards stop, cb, cb_user, cb_running; cv's mutex */
  pthread_cond_t cv;           /* on CLOCK_MONOTONIC */
  bool stop;
  gma__worker_hooks_t hooks;   /* immutable after start */
  gma_pressure_callback_t cb;
  void *cb_user;
  bool cb_running;             /* mu: the worker is inside a pressure callback */
  pthread_cond_t cb_cv;        /* mu: signalled when a callback returns */
  gma_t *g;                    /* immutable: passed to the callback */
  gma__pool_t *p;              /* immutable */
  uint64_t interval_ns, release_threshold, idle_ns, grow_ahead; /* immutable */
  int level;                   /* mu: the level last reported */
  bool report;                 /* mu: report the level at the next tick even if unchanged */
  /* Async requests. The ring is ck_ring in MPSC mode: callers enqueue
   * (multi-producer; they publish in ticket order, so keep producers at or
   * below the core count, see shared ck-notes), the worker dequeues. */
  ck_ring_t ring;
  ck_ring_buffer_t *ring_buf;
  bool kicked;                 /* mu: requests or frees since the worker last looked */
  pthread_cond_t room_cv;      /* mu: callers waiting for ring room */
  unsigned room_waiters;       /* mu */
  struct gma_future *waiting, *waiting_tail; /* worker thread only: in FIFO order */
  /* Requests submitted on the worker thread itself (from a future's or the
   * pressure callback): they never wait for ring room, which only this
   * thread makes, but join this list, taken after the ring. */
  struct gma_future *local, *local_tail; /* worker thread only: in FIFO order */
  bool stopping;               /* worker thread only: it is cancelling what is left, and
                                  refuses submits from the callbacks that cancelling runs */
  _Atomic bool memory_wanted;  /* a request waits for memory: frees kick the worker */
  _Atomic bool unwatched;      /* the worker sleeps until its tick, no freed memory having
                                  waited for device work when it last looked: a free that
                                  leaves some (the pool's slow path) kicks it */
  uint64_t timeout_ns;         /* immutable: future_timeout_ms */
  struct gma__anchor *anchor;  /* shared with every future: says whether g still lives */
  /* submitted and ready count requests handed to the worker; ready_at_once
   * those complete on the submitting thread (gma_stats adds them to both). */
  _Atomic uint64_t submitted, ready_at_once, ready, failed, timed_out, queued;
  _Atomic uint64_t latency[GMA__LATENCY_BUCKETS]; /* worker writes, stats reads */
  /* One piece of background work at a time (planned memory's placement):
   * run by the thread at its next wake-up, outside every lock. */
  void (*job)(void *arg);      /* mu: pending job, or NULL */
  void *job_arg;               /* mu */
} gma__worker_t;

/* Starts the thread (unless cfg->worker_off). One thread, at gma_create. */
gma_status_t gma__worker_start(gma__worker_t *w, gma_t *g, gma__pool_t *p,
                               const gma__worker_hooks_t *hooks,
                               const gma_config_t *cfg);
/* Wakes the thread, joins it, frees its resources. Idempotent. */
void gma__worker_stop(gma__worker_t *w);
/* Any thread. */
gma_status_t gma__worker_set_callback(gma__worker_t *w, gma_pressure_callback_t cb, void *user);
/* Any thread: queues f for the worker (waits for room unless nonblocking).
 * On the worker thread (a callback) it never waits: f joins the worker's
 * own list; GMA_ERR_CANCELLED once the worker is shutting down. */
gma_status_t gma__worker_submit(gma__worker_t *w, struct gma_future *f, bool nonblocking);
/* Any thread: has the worker thread run fn(arg) soon, outside every lock;
 * false (nothing queued) when there is no thread (worker:off) or a job is
 * already pending: the caller then runs it itself or later. */
bool gma__worker_run_job(gma__worker_t *w, void (*fn)(void *arg), void *arg);
/* Any thread: wakes the worker (memory was freed while a request waits). */
void gma__worker_kick(gma__worker_t *w);
/* Adds the worker's future counters to *st (a full-size struct). */
void gma__worker_stats(gma__worker_t *w, gma_stats_t *st);

/* future.c */
/* Worker thread: tries f once; true when f completed (and was handed back),
 * by this try or by a thread waiting on it that served it first. */
bool gma__future_serve(gma__worker_t *w, struct gma_future *f, uint64_t now_ns);
/* Worker thread: completes f with status without serving it (shutdown),
 * unless a thread waiting on it served it first; hands it back either way. */
void gma__future_cancel(gma__worker_t *w, struct gma_future *f);
/* The anchor: futures outlive their allocator (wait, poll and release are
 * allowed during and after gma_destroy), so each holds a reference to this
 * small object instead of trusting g.
 * Invariant: a future touches g's pool only between gma__anchor_enter
 * returning g and gma__anchor_exit; gma__anchor_detach (gma_destroy, before
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
gma__anchor_t *gma__anchor_new(gma_t *g);
/* g while it lives (then call gma__anchor_exit), or NULL once destroyed. */
gma_t *gma__anchor_enter(gma__anchor_t *a);
void gma__anchor_exit(gma__anchor_t *a);
/* gma_destroy, after the worker stopped: futures stop reaching g; returns
 * once no thread is between enter and exit. */
void gma__anchor_detach(gma__anchor_t *a);
/* gma_destroy of an allocator inherited across fork() (fork.c): drops the
 * allocator's reference without waiting for threads inside, which in the
 * child are parent threads that do not exist. */
void gma__anchor_forget(gma__anchor_t *a);
uint64_t gma__future_deadline(const struct gma_future *f);
struct gma_future *gma__future_wnext(struct gma_future *f);
void gma__future_set_wnext(struct gma_future *f, struct gma_future *next);

#endif /* GMA_WORKER_H */
