/* Owns the worker thread (see worker.h): its lifecycle, its timer, pressure
 * levels and the policy of timed trimming. The trimming itself is
 * gma__pool_release, which gives memory back to the device outside the pool
 * lock, so a tick never holds up callers for the duration of device frees. */
#include "worker/worker.h"
#include "base/lock.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/tsan.h"

/* The working set: with release_threshold "auto", memory handed out during
 * the last WORKING_SET_TICKS ticks is never trimmed by the timer (it is
 * what the workload needs; giving it back would make the next iteration
 * allocate it again). */
#define WORKING_SET_TICKS 3u
/* While freed memory waits for other streams' work (pending), the worker
 * looks at least this often, so what completed goes back to its stream's
 * cache and the statistics say so without a caller's poll. */
#define POLL_NS (10u * 1000000u)

static gma_pressure_t level_of(double use) {
  return use > 0.95 ? GMA_PRESSURE_CRITICAL
         : use > 0.80 ? GMA_PRESSURE_HIGH
         : use >= 0.60 ? GMA_PRESSURE_MEDIUM
                       : GMA_PRESSURE_LOW;
}

/* What a tick sees of memory pressure. */
typedef struct load {
  gma_pressure_t level;  /* reported: reserved against memory_limit, or the device's
                            use against its total, whichever is higher */
  gma_pressure_t device; /* the device's use alone: pressure from outside gma's cache */
  uint64_t dev_free, dev_total;
} load_t;

static load_t load_of(gma__pool_t *p) {
  uint64_t reserved = gma__pool_reserved(p);
  double use = p->limit ? (double)reserved / (double)p->limit : 0.0, dev_use = 0.0;
  load_t l = {0};
  if (p->dev->ops->mem_info(p->dev, &l.dev_free, &l.dev_total) == GMA_OK && l.dev_total &&
      l.dev_free <= l.dev_total)
    dev_use = (double)(l.dev_total - l.dev_free) / (double)l.dev_total;
  else
    l.dev_free = l.dev_total = 0;
  l.level = level_of(use > dev_use ? use : dev_use);
  l.device = level_of(dev_use);
  return l;
}

/* The timed trim's policy (README, "The worker thread"). Always: memory
 * unused for idle_ms. An explicit release_threshold: then cache above it, a
 * quarter of it at high pressure, none at critical. "auto" (the default):
 * nothing else unless the device's free memory is short (below 20% of its
 * total); then up to the shortfall, only from memory the working set did
 * not use (unused for WORKING_SET_TICKS ticks; one tick when critical). */
static gma__release_t trim_policy(const gma__worker_t *w, const load_t *l) {
  gma__release_t r = {.now_ns = gma__now_ns(), .idle_ns = w->idle_ns, .keep = UINT64_MAX,
                      .timed = true};
  if (w->release_threshold) {
    r.keep = w->release_threshold == GMA_RELEASE_ALL ? 0 : w->release_threshold;
    if (l->level == GMA_PRESSURE_HIGH) r.keep /= 4;
    if (l->level == GMA_PRESSURE_CRITICAL) r.keep = 0;
    r.pressured = l->level >= GMA_PRESSURE_HIGH;
    return r;
  }
  if (l->device < GMA_PRESSURE_HIGH) return r;
  uint64_t target = l->dev_total / 5; /* free memory at which pressure stops being high */
  r.keep = 0;
  r.want = target > l->dev_free ? target - l->dev_free : 1;
  /* Half a tick less, so a tick that comes a little early still counts. */
  uint64_t ticks = l->device == GMA_PRESSURE_CRITICAL ? 1 : WORKING_SET_TICKS;
  r.unused_ns = ticks * w->interval_ns - w->interval_ns / 2;
  r.pressured = true;
  return r;
}

/* One tick: report a level change, trim by the policy, top up the free pool
 * to grow_ahead when there is room. Worker thread only. */
static void tick(gma__worker_t *w) {
  gma__pool_t *p = w->p;
  gma__pool_tick_clock(p); /* allocation ages count in ticks */
  load_t l = load_of(p);
  gma_pressure_t level = l.level;
  gma__lock(&w->mu, GMA__RANK_WORKER);
  bool changed = (int)level != w->level || w->report;
  w->level = (int)level;
  w->report = false;
  gma_pressure_callback_t cb = changed ? w->cb : NULL;
  void *user = w->cb_user;
  w->cb_running = cb != NULL; /* gma_set_pressure_callback waits for it to clear */
  gma__unlock(&w->mu);
  if (changed) gma__pool_note_pressure(p, (int)level);
  if (cb) {
    cb(w->g, level, user); /* no gma lock held: it may call gma */
    gma__lock(&w->mu, GMA__RANK_WORKER);
    w->cb_running = false;
    pthread_cond_broadcast(&w->cb_cv);
    gma__unlock(&w->mu);
  }
  gma__release_t r = trim_policy(w, &l);
  /* The layers above give back what they hold first (an idle plan's arena),
   * then the pool releases, then they trim their own (the host pool). */
  if (w->hooks.reclaim)
    w->hooks.reclaim(w->hooks.arg, r.pressured && r.unused_ns ? r.unused_ns : r.idle_ns);
  gma__pool_release(p, &r); /* a failed device free keeps the segment: retried next tick */
  if (w->hooks.after) w->hooks.after(w->hooks.arg, (int)level);
  if (w->grow_ahead && level < GMA_PRESSURE_HIGH) gma__pool_grow_ahead(p, w->grow_ahead);
}

/* The worker of the calling thread, if it is one: set once at its start. */
static __thread gma__worker_t *self;

/* Appends r to the list from *head to *tail (linked through next). */
static void list_append(gma__request_t **head, gma__request_t **tail, gma__request_t *r) {
  r->next = NULL;
  if (*tail) (*tail)->next = r; else *head = r;
  *tail = r;
}

/* Takes new requests from the ring, then those the worker thread submitted
 * itself (in order, after those already waiting), and tries every waiting
 * request once: served or failed ones complete, the rest keep waiting for
 * memory until their deadline. An operation that submits while this runs
 * adds to w->local, taken by the next call. Worker thread. */
static unsigned serve(gma__worker_t *w) {
  void *item;
  unsigned taken = 0;
  while (ck_ring_dequeue_mpsc(&w->ring, w->ring_buf, &item)) {
    taken++;
    gma__request_t *r = item;
    gma__tsan_acquire(r); /* pairs with the submitter's release */
    list_append(&w->waiting, &w->waiting_tail, r);
  }
  if (w->local) {
    taken++;
    if (w->waiting_tail) w->waiting_tail->next = w->local; else w->waiting = w->local;
    w->waiting_tail = w->local_tail;
    w->local = w->local_tail = NULL;
  }
  uint64_t now = gma__now_ns();
  gma__request_t *prev = NULL;
  for (gma__request_t *r = w->waiting, *next; r; r = next) {
    next = r->next; /* read first: a served request is handed back */
    if (r->ops->serve(r, now)) {
      if (prev) prev->next = next; else w->waiting = next;
      if (w->waiting_tail == r) w->waiting_tail = prev;
    } else {
      prev = r;
    }
  }
  gma__store_seq_cst(&w->memory_wanted, w->waiting != NULL);
  return taken;
}

/* The earliest deadline among waiting requests, or UINT64_MAX. */
static uint64_t next_deadline(gma__worker_t *w) {
  uint64_t d = UINT64_MAX;
  for (gma__request_t *r = w->waiting; r; r = r->next)
    if (r->deadline_ns < d) d = r->deadline_ns;
  return d;
}

/* Cancels every request still queued, waiting or submitted by the worker
 * itself. Their cancel operations run here and may submit again: those
 * submits are refused (stopping), so this ends. Worker thread, at shutdown. */
static void cancel_all(gma__worker_t *w) {
  w->stopping = true;
  void *item;
  while (ck_ring_dequeue_mpsc(&w->ring, w->ring_buf, &item)) {
    gma__request_t *r = item;
    gma__tsan_acquire(r);
    r->ops->cancel(r);
  }
  gma__request_t *lists[2] = {w->waiting, w->local};
  w->waiting = w->waiting_tail = w->local = w->local_tail = NULL;
  for (int i = 0; i < 2; i++)
    for (gma__request_t *r = lists[i], *next; r; r = next) {
      next = r->next;
      r->ops->cancel(r);
    }
}

static void *worker_main(void *arg) {
  gma__worker_t *w = arg;
  self = w;
  gma__tl_background = true;
  uint64_t next_tick = gma__now_ns() + w->interval_ns, next_poll = UINT64_MAX;
  uint64_t poll_ns = w->interval_ns < POLL_NS ? w->interval_ns : POLL_NS;
  gma__lock(&w->mu, GMA__RANK_WORKER);
  while (!w->stop) {
    /* Sleep until the next tick, a waiting request's deadline, a request, or
     * a free that a waiting request may use. Memory also becomes usable when
     * device work completes (an epoch event), which nothing signals: while
     * requests wait, look again every millisecond. */
    uint64_t due = next_tick < next_deadline(w) ? next_tick : next_deadline(w);
    if (next_poll < due) due = next_poll;
    if (w->waiting && gma__now_ns() + 1000000u < due) due = gma__now_ns() + 1000000u;
    struct timespec ts = {(time_t)(due / 1000000000u), (long)(due % 1000000000u)};
    while (!w->stop && !w->kicked && pthread_cond_timedwait(&w->cv, &w->mu, &ts) == 0) {
    }
    if (w->stop) break;
    w->kicked = false;
    gma__unlock(&w->mu);
    gma__pool_note_wakeup(w->p);
    unsigned taken = serve(w);
    /* Requests tend to come in runs: after taking some, watch the ring a
     * little (at most 50 us) before sleeping, so the next one needs no
     * wake-up; yielding, so a waiter on this CPU gets it at once
     * (gma__spin_step). Timer ticks and an idle worker never spin. */
    uint64_t t0 = gma__now_ns(), spun = 0;
    for (unsigned i = 1; taken && !w->waiting && (spun = gma__now_ns() - t0) < 50000; i++) {
      if (ck_ring_size(&w->ring) || w->local) {
        serve(w);
        t0 = gma__now_ns();
        spun = 0;
      }
      gma__spin_step(i, spun >= 1000);
    }
    uint64_t now = gma__now_ns();
    if (now >= next_tick) {
      tick(w);
      next_tick = gma__now_ns() + w->interval_ns;
    }
    if (now >= next_poll || next_poll == UINT64_MAX) {
      /* Said before the look, so a free that the look misses sees it. */
      gma__store_seq_cst(&w->unwatched, true);
      next_poll = gma__pool_poll_pending(w->p) ? gma__now_ns() + poll_ns : UINT64_MAX;
      if (next_poll != UINT64_MAX) gma__store_seq_cst(&w->unwatched, false);
    }
    gma__lock(&w->mu, GMA__RANK_WORKER);
    if (w->job) {
      void (*job)(void *) = w->job;
      void *job_arg = w->job_arg;
      w->job = NULL;
      gma__unlock(&w->mu);
      job(job_arg);
      gma__lock(&w->mu, GMA__RANK_WORKER);
    }
    if (w->room_waiters) pthread_cond_broadcast(&w->room_cv);
  }
  gma__unlock(&w->mu);
  cancel_all(w); /* nothing is left hanging: every request still queued or waiting fails */
  return NULL;
}

/* A submit on the worker thread (from a request's operation or the pressure
 * callback): waiting for ring room would wait for this very thread, so r
 * joins the worker's own list instead, never refused for room; the worker
 * takes it at its next pass, before it sleeps. Refused while the worker cancels what is left at
 * shutdown: the request would only be cancelled too, and an operation that
 * submits again on cancellation would never let the shutdown end. */
static gma_status_t submit_on_worker(gma__worker_t *w, gma__request_t *r) {
  if (w->stopping)
    return gma__set_error(GMA_ERR_CANCELLED, "the allocator is being destroyed: a request "
                          "submitted from a callback while gma_destroy cancels the others "
                          "is refused");
  list_append(&w->local, &w->local_tail, r);
  gma__worker_kick(w); /* no lock of the worker is held in an operation or a callback */
  return GMA_OK;
}

gma_status_t gma__worker_submit(gma__worker_t *w, gma__request_t *r, bool nonblocking) {
  if (self == w) return submit_on_worker(w, r);
  if (!ck_ring_enqueue_mpsc(&w->ring, w->ring_buf, r)) {
    if (nonblocking)
      return gma__set_error(GMA_ERR_BUSY, "the async request ring is full: %u requests wait "
                            "for the worker (ring_size - 1); wait for one, or raise ring_size",
                            ck_ring_capacity(&w->ring) - 1);
    /* Wait for room: the worker broadcasts room_cv after each pass. */
    gma__lock(&w->mu, GMA__RANK_WORKER);
    w->room_waiters++;
    while (!ck_ring_enqueue_mpsc(&w->ring, w->ring_buf, r)) {
      w->kicked = true;
      pthread_cond_signal(&w->cv);
      pthread_cond_wait(&w->room_cv, &w->mu);
    }
    w->room_waiters--;
    gma__unlock(&w->mu);
  }
  gma__worker_kick(w);
  return GMA_OK;
}

bool gma__worker_run_job(gma__worker_t *w, void (*fn)(void *arg), void *arg) {
  if (!w->started) return false;
  gma__lock(&w->mu, GMA__RANK_WORKER);
  bool queued = !w->job && !w->stop;
  if (queued) {
    w->job = fn;
    w->job_arg = arg;
    w->kicked = true;
    pthread_cond_signal(&w->cv);
  }
  gma__unlock(&w->mu);
  return queued;
}

void gma__worker_kick(gma__worker_t *w) {
  gma__lock(&w->mu, GMA__RANK_WORKER);
  w->kicked = true;
  pthread_cond_signal(&w->cv);
  gma__unlock(&w->mu);
}

void gma__worker_forget(gma__worker_t *w) {
  if (!w->started) return;
  free(w->ring_buf);
  w->ring_buf = NULL;
  w->started = false;
}

gma_status_t gma__worker_start(gma__worker_t *w, gma_t *g, gma__pool_t *p,
                               const gma__worker_hooks_t *hooks, const gma_config_t *cfg) {
  memset(w, 0, sizeof *w);
  w->g = g;
  if (hooks) w->hooks = *hooks;
  w->p = p;
  w->interval_ns = cfg->trim_interval_ms * 1000000u;
  w->release_threshold = cfg->release_threshold;
  w->idle_ns = cfg->idle_ms * 1000000u;
  w->grow_ahead = cfg->grow_ahead;
  if (cfg->worker_off) return GMA_OK;
  w->ring_buf = calloc(cfg->ring_size, sizeof *w->ring_buf);
  if (!w->ring_buf) return gma__set_error(GMA_ERR_OOM, "no host memory for the async request ring (ring_size)");
  ck_ring_init(&w->ring, (unsigned)cfg->ring_size);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  bool ok = pthread_mutex_init(&w->mu, NULL) == 0 && pthread_cond_init(&w->cv, &attr) == 0 &&
            pthread_cond_init(&w->room_cv, NULL) == 0 && pthread_cond_init(&w->cb_cv, NULL) == 0;
  pthread_condattr_destroy(&attr);
  gma__store_seq_cst(&w->unwatched, true); /* it starts asleep until its first tick */
  if (!ok || pthread_create(&w->thread, NULL, worker_main, w) != 0) {
    gma__store_seq_cst(&w->unwatched, false);
    free(w->ring_buf);
    return gma__set_error(GMA_ERR_INTERNAL, "cannot start gma's worker thread");
  }
  w->started = true;
  return GMA_OK;
}

void gma__worker_stop(gma__worker_t *w) {
  if (!w->started) return;
  gma__lock(&w->mu, GMA__RANK_WORKER);
  w->stop = true;
  pthread_cond_signal(&w->cv);
  gma__unlock(&w->mu);
  pthread_join(w->thread, NULL);
  gma__store_seq_cst(&w->unwatched, false); /* no free kicks a worker that is gone */
  pthread_cond_destroy(&w->cv);
  pthread_cond_destroy(&w->room_cv);
  pthread_cond_destroy(&w->cb_cv);
  pthread_mutex_destroy(&w->mu);
  free(w->ring_buf);
  w->started = false;
}

gma_status_t gma__worker_set_callback(gma__worker_t *w, gma_pressure_callback_t cb, void *user) {
  if (!w->started)
    return gma__set_error(GMA_ERR_UNSUPPORTED, "gma_set_pressure_callback: the worker is off "
                                               "(worker:off), so pressure is never observed");
  gma__lock(&w->mu, GMA__RANK_WORKER);
  /* The caller may free the old callback's user data once this returns
   * (it did, while the callback still ran on the worker). So wait
   * for a running callback to return, unless this is that callback
   * changing itself: the worker would wait for itself. */
  if (!pthread_equal(pthread_self(), w->thread))
    while (w->cb_running) pthread_cond_wait(&w->cb_cv, &w->mu);
  w->cb = cb;
  w->cb_user = user;
  w->report = true; /* tell the new callback the current level at the next tick */
  gma__unlock(&w->mu);
  return GMA_OK;
}
