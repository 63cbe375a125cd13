/* The allocator's worker thread: requests the layers above hand it (each
 * with its own {serve, cancel} operations, tried in order until served or
 * past its deadline), timed trimming (release threshold, idle segments),
 * memory-pressure levels and their callback, growth ahead of demand. It
 * sleeps on a condition variable between ticks (no CPU while idle) and is
 * joined by gma_destroy before anything else is torn down. */
#ifndef GMA_WORKER_H
#define GMA_WORKER_H

#include <ck_ring.h>
#include <pthread.h>
#include <stdbool.h>

#include "core/internal.h"

/* A request the worker runs. The layer above embeds it in its own object
 * and names the operations; the worker knows nothing else of it (as libuv's
 * thread pool runs {work, done} pointers). */
typedef struct gma__request gma__request_t;
typedef struct gma__request_ops {
  /* Worker thread: tries r once at now_ns; true when r is finished and
   * handed back (the worker forgets it), false when it waits to be tried
   * again (for memory: frees kick the worker meanwhile). */
  bool (*serve)(gma__request_t *r, uint64_t now_ns);
  /* Worker thread, at shutdown: finishes r without serving it and hands it
   * back. */
  void (*cancel)(gma__request_t *r);
} gma__request_ops_t;
struct gma__request {
  const gma__request_ops_t *ops; /* set by the submitter */
  uint64_t deadline_ns;          /* set by the submitter: the worker tries r again by then */
  gma__request_t *next;          /* worker thread only: its lists */
};

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
  gma__request_t *waiting, *waiting_tail; /* worker thread only: in FIFO order */
  /* Requests submitted on the worker thread itself (from a request's
   * operation or the pressure callback): they never wait for ring room,
   * which only this thread makes, but join this list, taken after the ring. */
  gma__request_t *local, *local_tail; /* worker thread only: in FIFO order */
  bool stopping;               /* worker thread only: it is cancelling what is left, and
                                  refuses submits from what cancelling runs */
  _Atomic bool memory_wanted;  /* a request waits to be tried again (for memory): frees kick
                                  the worker */
  _Atomic bool unwatched;      /* the worker sleeps until its tick, no freed memory having
                                  waited for device work when it last looked: a free that
                                  leaves some (the pool's slow path) kicks it */
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
/* Any thread: queues r for the worker (waits for room unless nonblocking).
 * On the worker thread (an operation or a callback) it never waits: r joins
 * the worker's own list; GMA_ERR_CANCELLED once the worker is shutting down. */
gma_status_t gma__worker_submit(gma__worker_t *w, gma__request_t *r, bool nonblocking);
/* Any thread: has the worker thread run fn(arg) soon, outside every lock;
 * false (nothing queued) when there is no thread (worker:off) or a job is
 * already pending: the caller then runs it itself or later. */
bool gma__worker_run_job(gma__worker_t *w, void (*fn)(void *arg), void *arg);
/* Any thread: wakes the worker (memory was freed while a request waits). */
void gma__worker_kick(gma__worker_t *w);
/* A child process after fork(), where the thread does not exist: frees what
 * the worker allocated, touching none of its locks, and marks it stopped. */
void gma__worker_forget(gma__worker_t *w);

#endif /* GMA_WORKER_H */
