/* Owns futures: the async entry points, a future's states (pending, then one
 * final status), waiting with a timeout, completion (on the worker, or at
 * once on a bin hit), cancellation by release, and who frees memory nobody
 * collected. The worker runs a future as a generic request (worker.h): the
 * future embeds it and names serve_op and cancel_op; the counters every
 * future of an allocator shares are its gma__futures_t (future.h).
 *
 * Lifetime: a future has one reference for the caller (dropped by
 * gma_future_release) and one for the worker while it holds the request; the
 * last drop frees it (or keeps it as the thread's spare: a future ready at
 * once then costs no malloc). Futures may outlive the allocator, and may be
 * waited on, polled and released while gma_destroy runs, so they reach it
 * only through a refcounted anchor (future.h: enter/exit around any pool
 * work; gma_destroy empties it and waits for those inside), and waiters sleep
 * on the future's own futex word, never on anything of the allocator's.
 * Memory a completed future got belongs to the caller once gma_future_wait
 * handed it out (collected); until then its block is marked held, so that
 * gma_destroy frees it quietly instead of calling it a leak, and whoever
 * first claims it (release, or the worker completing a released future)
 * frees it: claim is a CAS, so exactly one does. */
#include <inttypes.h>
#include <stddef.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "api/allocator.h"
#include "base/sizeclass.h"
#include "base/tsan.h"

struct gma_future {
  gma__request_t req;         /* what the worker holds: first, so both have one address */
  _Atomic int state;          /* GMA_PENDING, then the final gma_status_t */
  gma_t *g;                   /* valid while the request is pending (destroy waits) */
  gma__anchor_t *anchor;      /* reaches g later: NULL g once destroyed */
  size_t n;                   /* blocks: 1, or a batch's count */
  size_t size;                /* single request */
  size_t *sizes;              /* batch: a copy of the sizes */
  void **ptrs;                /* the result: &ptr, or the batch's n pointers */
  void *ptr;
  void **user_ptrs;           /* batch: where gma_future_wait copies the pointers */
  gma_stream_t stream;
  uint64_t submit_ns;         /* the deadline is req.deadline_ns */
  bool served_by_worker;
  gma_future_callback_t cb;
  void *user;
  char *msg;                  /* failure: its message, for the caller's last error */
  _Atomic int refs;
  _Atomic bool released, collected;
  _Atomic uint32_t done;      /* FUT_*: completion finished, callback included; a futex word */
  _Atomic int claim;          /* 0: memory unclaimed; 1: freed by someone */
  uint64_t trace_id;          /* its Id in the trace; 0: not traced */
  bool worker_only;           /* options->worker_only: no serving but the worker's */
  _Atomic int owner;          /* OWN_*: who serves a request handed to the worker */
  _Atomic uint32_t magic;     /* FUT_LIVE from submit until the caller's release, then
                                 FUT_GONE: a later call on the handle is refused while
                                 the object is still gma's (see future_gone) */
};

enum { FUT_LIVE = 0x6675744c, FUT_GONE = 0x67306e65 };

/* f->owner, for a request in the worker's ring: a thread that waits on it
 * before the worker took it serves it itself (help()), since it would block
 * anyway, rather than wait for the worker to be scheduled. Exactly one of
 * them wins the compare-and-swap from OWN_QUEUED. A helper that finds no
 * memory puts it back (OWN_QUEUED): the worker then serves it as always. */
enum { OWN_QUEUED = 0, OWN_WORKER = 1, OWN_HELPER = 2 /* a waiter is serving it */,
       OWN_HELPED = 3 /* a waiter served it */ };

/* f->done: waiters sleep on the future itself (a futex), not on anything of
 * the allocator's, so a thread may sit in gma_future_wait while another
 * destroys the allocator (the cancellation wakes it). */
enum { FUT_RUNNING = 0, FUT_SLEEPER = 1 /* running, a waiter sleeps */, FUT_DONE = 2 };

static void futex_wake_all(_Atomic uint32_t *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

/* Sleeps while *word is FUT_SLEEPER, at most rel (NULL: no limit); returns
 * early on a wake, a signal or a spurious wake-up: the caller loops. */
static void futex_sleep(_Atomic uint32_t *word, const struct timespec *rel) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, FUT_SLEEPER, rel, NULL, 0);
}

/* The future a request of the worker's is (req is its first member). */
static gma_future_t *future_of(gma__request_t *r) { return (gma_future_t *)r; }

/* A future of an allocator inherited across fork() (see future.h). */
static bool forked(const gma_future_t *f) {
  return gma__load_relaxed(&f->anchor->forked);
}

/* ---- Future objects: one spare per thread ------------------------------------------
 * Single-block futures are all the same size; each thread keeps the last one
 * it gave back, with its reference to the anchor it had: the next future of
 * the same allocator takes both over, so a future ready at once costs no
 * malloc and no shared atomic for the anchor. A key destructor frees the
 * spare and drops its reference when the thread exits (the key's value is
 * only a flag: the spare itself is in thread-local storage, which outlives
 * the key destructors). */

static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static bool spare_key_ok; /* pthread_key_create worked; never arm a key we do not own */
static __thread gma_future_t *spare;
static __thread bool spare_armed;

static void spare_exit(void *unused) {
  (void)unused;
  spare_armed = false; /* a spare kept by a later destructor arms the key again */
  gma_future_t *f = spare;
  spare = NULL;
  if (!f) return;
  if (f->anchor) gma__anchor_unref(f->anchor);
  free(f);
}

static void spare_key_make(void) { spare_key_ok = pthread_key_create(&spare_key, spare_exit) == 0; }

/* A zeroed future holding one reference to anchor a. */
static gma_future_t *future_new(size_t extra, gma__anchor_t *a) {
  gma_future_t *f;
  if (!extra && spare) {
    f = spare;
    spare = NULL;
    gma__anchor_t *had = f->anchor;
    memset(f, 0, sizeof *f);
    if (had == a) { /* the same allocator's: its reference carries over */
      f->anchor = a;
      return f;
    }
    if (had) gma__anchor_unref(had);
  } else if (!(f = calloc(1, sizeof *f + extra))) {
    return NULL;
  }
  f->anchor = a;
  gma__faa_relaxed(&a->refs, 1);
  return f;
}

static void future_delete(gma_future_t *f) {
  free(f->sizes);
  free(f->msg);
  if (!f->user_ptrs && !spare) { /* a single-block future: keep it, and its anchor */
    if (!spare_armed) {
      pthread_once(&spare_once, spare_key_make);
      if (!spare_key_ok || pthread_setspecific(spare_key, (void *)1) != 0) goto drop;
      spare_armed = true;
    }
    f->sizes = NULL;
    f->msg = NULL;
    spare = f;
    return;
  }
drop:
  if (f->anchor) gma__anchor_unref(f->anchor);
  free(f);
}

/* Drops a reference. Ours is the last when the count is 1: nobody can take a
 * new one (only submit does), and the worker drops its own with a release
 * (seq_cst) decrement, which this acquire load pairs with. */
static void unref(gma_future_t *f) {
  if (gma__load_acquire(&f->refs) == 1 ||
      gma__fas_seq_cst(&f->refs, 1) == 1)
    future_delete(f);
}

/* Frees the memory of a completed-OK future that nobody collected, once. */
static void claim_and_free(gma_future_t *f, gma_t *g) {
  int zero = 0;
  if (!g || !gma__cas_seq_cst(&f->claim, &zero, 1)) return;
  for (size_t i = 0; i < f->n; i++) {
    gma__pool_hold(&g->pool, f->ptrs[i], false); /* ours to free now (gma_free refuses held) */
    gma_free(g, f->ptrs[i]);
  }
}

/* The completion's trace rows: async_complete, then for a batch its
 * allocate rows carrying the future's Id. */
static void trace_complete(gma_future_t *f, gma_status_t st) {
  gma__trace_t *t = gma__trace_on(&f->g->pool.trace);
  if (!t) return;
  uint64_t now = gma__trace_now(), total = f->sizes ? 0 : f->size;
  for (size_t i = 0; f->sizes && i < f->n; i++) total += f->sizes[i];
  gma__trace_emit(t, now, GMA__TR_ASYNC_COMPLETE, st == GMA_OK && !f->sizes ? (uintptr_t)f->ptr : 0,
                  total, (uintptr_t)f->stream, 0, f->trace_id, f->sizes ? f->n : 0,
                  st == GMA_OK ? 0 : st);
  for (size_t i = 0; st == GMA_OK && f->sizes && i < f->n; i++)
    gma__trace_emit(t, now, GMA__TR_ALLOCATE, (uintptr_t)f->ptrs[i], f->sizes[i],
                    (uintptr_t)f->stream, 0, f->trace_id, 0, 0);
}

/* The future whose callback this thread is running (complete()): inside
 * its callback a future counts as complete already, so gma_future_status
 * there returns the status the callback got. */
static __thread gma_future_t *completing;

/* Whether f's completion finished, callback included (f->done, acquire: what
 * the callback wrote is visible after it), or this thread is inside that
 * callback. Until then poll, status and a wait that does not block say
 * GMA_PENDING, so poll's GMA_OK promises a wait that collects at once. */
static bool finished(gma_future_t *f) {
  return gma__load_acquire(&f->done) == FUT_DONE || f == completing;
}

/* Publishes the final status, wakes waiters, runs the callback, and frees
 * the memory if the caller already let the future go. */
static void complete(gma_future_t *f, gma_status_t st) {
  gma__futures_t *fs = &f->g->futures;
  if (st != GMA_OK) f->msg = strdup(gma_last_error()); /* NULL without memory: no detail */
  /* Complete at once: counted in ready_at_once alone (gma_stats adds it to
   * submitted and ready), one shared atomic instead of three. */
  if (!f->served_by_worker) gma__faa_relaxed(&fs->ready_at_once, 1);
  else if (st == GMA_OK) gma__faa_relaxed(&fs->ready, 1);
  else if (st == GMA_ERR_TIMEOUT) gma__faa_relaxed(&fs->timed_out, 1);
  else gma__faa_relaxed(&fs->failed, 1);
  if (f->served_by_worker) { /* before the state: a waiter then sees it off the queue */
    gma__fas_relaxed(&fs->queued, 1);
    uint64_t ns = gma__now_ns() - f->submit_ns + 1;
    unsigned b = gma__class_of(ns);
    if (b >= GMA__LATENCY_BUCKETS) b = GMA__LATENCY_BUCKETS - 1;
    gma__faa_relaxed(&fs->latency[b], 1);
  }
  if (st == GMA_OK)
    for (size_t i = 0; i < f->n; i++) gma__pool_hold(&f->g->pool, f->ptrs[i], true);
  if (f->trace_id) trace_complete(f, st);
  /* seq_cst: pairs with release()'s flag (Dekker). A future complete at once
   * is not handed out yet: nobody else can read it. */
  if (f->served_by_worker) gma__store_seq_cst(&f->state, (int)st);
  else gma__store_relaxed(&f->state, (int)st);
  if (f->cb) {
    gma_future_t *outer = completing; /* a callback may complete a request of its own */
    completing = f;
    f->cb(f, st, f->user);
    completing = outer;
  }
  /* Waiters return only now, so the callback has run when wait returns. A
   * future complete at once was never handed out: nobody can be waiting. */
  if (f->served_by_worker) {
    if (gma__exchange_seq_cst(&f->done, FUT_DONE) == FUT_SLEEPER) futex_wake_all(&f->done);
  } else {
    gma__store_release(&f->done, FUT_DONE); /* pairs with wait's acquire */
  }
  /* Released and never collected: nobody will free it but us. A wait that
   * collected it happened before the release (same caller), so reading
   * released first and collected second sees the collection. */
  if (st == GMA_OK && gma__load_seq_cst(&f->released) && !gma__load_seq_cst(&f->collected))
    claim_and_free(f, f->g);
}

/* Whether gma_destroy has begun (the future's memory, if any, is gone or
 * going); a hint for poll, exact for a caller that holds no enter. */
static bool destroyed(gma_future_t *f) { return !gma__load_seq_cst(&f->anchor->g); }

/* Worker thread, before it serves or cancels f: makes f the worker's (at
 * its first try, not when it leaves the ring, so that a waiter can still
 * serve it meanwhile); false when a thread waiting on it served it first:
 * the ring's reference is then dropped, and f must be forgotten. */
static bool claim(gma_future_t *f) {
  int o = gma__load_acquire(&f->owner);
  if (o == OWN_WORKER) return true; /* a later try of a request that waits for memory */
  for (o = OWN_QUEUED; !gma__cas_weak_seq_cst(&f->owner, &o, OWN_WORKER); o = OWN_QUEUED) {
    if (o == OWN_HELPED) { /* pairs with help()'s release store */
      unref(f);
      return false;
    }
    if (o == OWN_HELPER) sched_yield(); /* one allocation attempt: short */
  }
  return true;
}

/* A thread about to block on f serves it itself when the worker has not
 * taken it yet (owner OWN_QUEUED) and no request waits for memory (those go
 * first, in order): the same pool call the worker would make, growth
 * included, but no waiting for memory (a shortage goes back to the worker's
 * back-pressure). Not a future with a callback: completing it here would
 * run the callback on this thread, and a callback runs only on the worker
 * or, complete at once, on the submitting thread (gma.h). True when f
 * completed here. */
static bool help(gma_future_t *f) {
  if (!f->served_by_worker || f->worker_only || f->cb ||
      gma__load_relaxed(&f->owner) != OWN_QUEUED)
    return false;
  gma_t *g = gma__anchor_enter(f->anchor); /* pending, so g lives; destroy may be starting */
  if (!g) return false;
  int o = OWN_QUEUED;
  bool done = false, planted = g->pool.test_flags & GMA__TEST_NO_SERVE_CLAIM;
  if (!gma__load_relaxed(&g->worker.memory_wanted) &&
      (planted || gma__cas_seq_cst(&f->owner, &o, OWN_HELPER))) {
    uint64_t id;
    gma_status_t st = gma__stream_id(&g->pool, f->stream, &id);
    if (st == GMA_OK)
      st = f->n == 1 && !f->sizes
               ? gma__pool_alloc_slow(&g->pool, f->size, f->stream, id, GMA__ALLOC_ATTEMPT, &f->ptr)
               : gma__pool_alloc_batch(&g->pool, f->n, f->sizes, f->stream, id,
                                       GMA__ALLOC_ATTEMPT, f->ptrs);
    done = st == GMA_OK;
    if (done) complete(f, GMA_OK);
    /* Release: the worker's claim (acquire) sees the completion, or the
     * untouched request. */
    if (!planted)
      gma__store_release(&f->owner, done ? OWN_HELPED : OWN_QUEUED);
  }
  gma__anchor_exit(f->anchor);
  return done;
}

/* The worker's serve operation (worker.h): tries f once; true when f
 * completed (and was handed back), by this try or by a thread waiting on it
 * that served it first. */
static bool serve_op(gma__request_t *r, uint64_t now) {
  gma_future_t *f = future_of(r);
  if (!claim(f)) return true;
  if (gma__load_seq_cst(&f->released)) {
    gma__set_error(GMA_ERR_CANCELLED, "the future was released before it was served");
    complete(f, GMA_ERR_CANCELLED);
    unref(f);
    return true;
  }
  gma_t *g = f->g;
  uint64_t id;
  gma_status_t st = gma__stream_id(&g->pool, f->stream, &id);
  if (st == GMA_OK)
    st = f->n == 1 && !f->sizes
             ? gma__pool_alloc_slow(&g->pool, f->size, f->stream, id, GMA__ALLOC_ATTEMPT, &f->ptr)
             : gma__pool_alloc_batch(&g->pool, f->n, f->sizes, f->stream, id, GMA__ALLOC_ATTEMPT,
                                     f->ptrs);
  if (st == GMA_ERR_OOM && g->cfg.plan && gma__plan_reclaim(&g->plan, 0))
    return false; /* an idle plan's arena went back: the next try may fit */
  if (st == GMA_ERR_OOM) {
    if (now < f->req.deadline_ns) return false; /* back-pressure: wait for frees */
    /* One failed request, however many tries it took: counted, traced and
     * explained once, now. */
    uint64_t total = f->sizes ? 0 : f->size;
    for (size_t i = 0; f->sizes && i < f->n; i++) total += f->sizes[i];
    gma__pool_oom_report(&g->pool, total, f->stream);
    gma__set_error(GMA_ERR_TIMEOUT, "async request waited %.1f ms for memory: %s",
                   (double)(now - f->submit_ns) / 1e6, gma__error_detail(gma_last_error()));
    st = GMA_ERR_TIMEOUT;
  }
  complete(f, st);
  unref(f);
  return true;
}

/* The worker's cancel operation, at shutdown: completes f with
 * GMA_ERR_CANCELLED without serving it, unless a thread waiting on it served
 * it first; hands it back either way. */
static void cancel_op(gma__request_t *r) {
  gma_future_t *f = future_of(r);
  if (!claim(f)) return;
  gma__set_error(GMA_ERR_CANCELLED, "the allocator was destroyed before the request was served");
  complete(f, GMA_ERR_CANCELLED);
  unref(f);
}

static const gma__request_ops_t future_ops = {serve_op, cancel_op};

/* ---- Entry points --------------------------------------------------------------*/

/* Whether the pool has a live record of the stream with this device id: an
 * inline try never creates (or orphans) one, so a request the ring then
 * refuses (GMA_ERR_BUSY) changes nothing. A stream's first request goes to
 * the worker. Lock-free. */
static bool known(gma_t *g, gma_stream_t stream, uint64_t id) {
  gma__stream_t *s = gma__stream_find(&g->pool, stream);
  return s && s->id == id;
}

/* Fills the future's fields for a submission and records it in the trace. */
static void submit_init(gma_t *g, gma_future_t *f, const gma_async_options_t *o) {
  f->g = g;
  f->state = GMA_PENDING;
  f->refs = 1;
  gma__store_relaxed(&f->magic, FUT_LIVE);
  f->cb = o->callback;
  f->user = o->user;
  f->trace_id = 0;
  gma__trace_t *t = gma__trace_on(&g->pool.trace);
  if (t) {
    f->trace_id = gma__faa_relaxed(&g->pool.trace_ids, 1) + 1;
    uint64_t total = f->sizes ? 0 : f->size;
    for (size_t i = 0; f->sizes && i < f->n; i++) total += f->sizes[i];
    gma__trace_emit(t, gma__trace_now(), GMA__TR_ASYNC_SUBMIT, 0, total, (uintptr_t)f->stream, 0,
                    f->trace_id, f->sizes ? f->n : 0, 0);
  }
}

/* Serves the request here and now when it can without the worker and
 * completes the future: true then. Else *st is the stream id lookup's status
 * (a clear error now) and *id the stream's device id. */
static bool submit_at_once(gma_t *g, gma_future_t *f, const gma_async_options_t *o,
                           gma_status_t *st, uint64_t *id) {
  /* A capture gma was told of: served from its graph pool now, like
   * gma_alloc (graph.c); the future is complete at once. */
  if (gma__load_relaxed(&g->graphs.capturing)) {
    gma_status_t gst = gma__graph_alloc(&g->graphs, f->n, f->sizes, f->size, f->stream, f->ptrs);
    if (gst != GMA_PENDING) {
      complete(f, gst);
      return true;
    }
  }
  /* A bin hit needs no worker: the future is complete at once (and needs no
   * clock: the submit time and deadline are the worker's). Through this
   * thread's stream cache it needs no device call either (as gma_alloc). */
  bool binnable = !o->worker_only && !f->sizes && f->size <= g->pool.bin_max;
  if (binnable && gma__bin_alloc_cached(&g->pool, f->size, f->stream, &f->ptr) == GMA_OK) {
    complete(f, GMA_OK);
    return true;
  }
  *st = gma__stream_id(&g->pool, f->stream, id);
  if (*st == GMA_OK && binnable &&
      gma__bin_alloc(&g->pool, f->size, f->stream, *id, &f->ptr) == GMA_OK) {
    complete(f, GMA_OK);
    return true;
  }
  /* Not a bin hit: the pool may still serve it here and now, if it can
   * without waiting (GMA__ALLOC_INLINE: the lock only if free, memory it
   * already holds, no device call that allocates). Requests waiting for
   * memory are served first, in order, by the worker (memory_wanted), so
   * none is overtaken by a later one while it waits. Any failure, even a
   * real error, goes to the worker, which reports it as it always did. */
  if (*st == GMA_OK && !o->worker_only &&
      !gma__load_relaxed(&g->worker.memory_wanted) && known(g, f->stream, *id)) {
    gma_status_t ist =
        f->n == 1 && !f->sizes
            ? gma__pool_alloc_slow(&g->pool, f->size, f->stream, *id, GMA__ALLOC_INLINE, &f->ptr)
            : gma__pool_alloc_batch(&g->pool, f->n, f->sizes, f->stream, *id, GMA__ALLOC_INLINE,
                                    f->ptrs);
    if (ist == GMA_OK) {
      complete(f, GMA_OK);
      return true;
    }
  }
  return false;
}

/* o: the caller's options as this library's struct (see check_async). */
static gma_status_t submit(gma_t *g, gma_future_t *f, const gma_async_options_t *o,
                           gma_future_t **out) {
  gma__futures_t *fs = &g->futures;
  submit_init(g, f, o);
  uint64_t id;
  gma_status_t st = GMA_OK;
  if (submit_at_once(g, f, o, &st, &id)) {
    *out = f;
    return GMA_OK;
  }
  f->submit_ns = gma__now_ns();
  /* Saturating: a timeout past the end of the clock (UINT64_MAX, as for
   * gma_future_wait) means no limit. */
  uint64_t timeout = o->timeout_ns ? o->timeout_ns : fs->timeout_ns;
  f->req.ops = &future_ops;
  f->req.deadline_ns = timeout > UINT64_MAX - f->submit_ns ? UINT64_MAX : f->submit_ns + timeout;
  gma__faa_relaxed(&fs->submitted, 1);
  if (st == GMA_OK) {
    f->served_by_worker = true;
    f->worker_only = o->worker_only;
    gma__store_seq_cst(&f->refs, 2);
    /* Counted before the worker can complete it (complete() takes it off). */
    gma__faa_relaxed(&fs->queued, 1);
    gma__tsan_release(&f->req); /* pairs with the worker's acquire after the dequeue */
    st = gma__worker_submit(&g->worker, &f->req, o->nonblocking);
    if (st != GMA_OK) gma__fas_relaxed(&fs->queued, 1);
  }
  if (st != GMA_OK) {
    gma__fas_relaxed(&fs->submitted, 1);
    future_delete(f);
    return st;
  }
  *out = f;
  return GMA_OK;
}

/* Checks the arguments every async call shares and sets *copy to the
 * caller's options as this library's struct: their first o->size bytes (an
 * older gma.h's struct is shorter; nothing past them is read), the rest
 * zero, as all of it is for NULL options. */
static gma_status_t check_async(gma_t *g, gma_stream_t stream, const gma_async_options_t *o,
                                gma_future_t **out, const char *fn, gma_async_options_t *copy) {
  GMA__CHECK(g, fn);
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  *out = NULL;
  memset(copy, 0, sizeof *copy);
  if (o) {
    gma_status_t st =
        gma__struct_size_check(o->size, sizeof *o, fn, "options", "GMA_ASYNC_OPTIONS_INIT");
    if (st != GMA_OK) return st;
    memcpy(copy, o, o->size);
  }
  copy->size = sizeof *copy;
  if (stream == GMA_STREAM_PER_THREAD)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "%s: GMA_STREAM_PER_THREAD names a different stream on gma's worker "
                          "thread; pass an explicit stream",
                          fn);
  if (gma__stream_arg(g, stream) == GMA_STREAM_PER_THREAD)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "%s: under default_stream:per_thread a NULL stream is the calling "
                          "thread's default stream, a different one on gma's worker thread; "
                          "pass an explicit stream",
                          fn);
  if (!g->worker.started)
    return gma__set_error(GMA_ERR_UNSUPPORTED, "%s: the worker is off (worker:off)", fn);
  return GMA_OK;
}

gma_status_t gma_alloc_async(gma_t *g, size_t size, gma_stream_t stream,
                             const gma_async_options_t *options, gma_future_t **out) {
  gma_async_options_t o;
  gma_status_t st = check_async(g, stream, options, out, "gma_alloc_async", &o);
  if (st != GMA_OK) return st;
  if (size == 0 || size > g->cfg.memory_limit)
    return gma__set_error(GMA_ERR_INVALID_SIZE,
                          "gma_alloc_async: size %zu is 0 or more than this allocator can "
                          "ever hold (%llu bytes)",
                          size, (unsigned long long)g->cfg.memory_limit);
  gma_future_t *f = future_new(0, g->futures.anchor);
  if (!f) return gma__set_error(GMA_ERR_OOM, "gma_alloc_async: host memory for a future");
  f->n = 1;
  f->size = size;
  f->stream = stream;
  f->ptrs = &f->ptr;
  return submit(g, f, &o, out);
}

gma_status_t gma_alloc_batch_async(gma_t *g, size_t n, const size_t *sizes, gma_stream_t stream,
                                   void **ptrs, const gma_async_options_t *options,
                                   gma_future_t **out) {
  gma_async_options_t o;
  gma_status_t st = check_async(g, stream, options, out, "gma_alloc_batch_async", &o);
  if (st != GMA_OK) return st;
  if (n == 0 || !sizes || !ptrs)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "gma_alloc_batch_async: n is 0, or sizes or ptrs is NULL");
  st = gma__batch_sizes_check(g, n, sizes, "gma_alloc_batch_async");
  if (st != GMA_OK) return st;
  gma_future_t *f = future_new(n * sizeof(void *), g->futures.anchor);
  size_t *copy = malloc(n * sizeof *copy);
  if (!f || !copy) {
    if (f) future_delete(f);
    free(copy);
    return gma__set_error(GMA_ERR_OOM, "gma_alloc_batch_async: host memory for a future");
  }
  memcpy(copy, sizes, n * sizeof *copy);
  f->n = n;
  f->sizes = copy;
  f->stream = stream;
  f->ptrs = (void **)(f + 1);
  f->user_ptrs = ptrs;
  return submit(g, f, &o, out);
}

static gma_status_t gone(const char *fn) {
  return gma__set_error(GMA_ERR_CANCELLED,
                        "%s: the allocator was destroyed, and the memory this request got went "
                        "with it (collect it with gma_future_wait before gma_destroy)",
                        fn);
}

/* A handle the caller gave back (gma_future_release, or a gma_future_take
 * that did not return GMA_PENDING) and named again. Seen only while the
 * object is still gma's: a single-block future complete when released goes
 * to the releasing thread's spare until that thread's next request reuses
 * it; one the worker still held stays until the worker lets go (its next
 * look, within about a millisecond), then goes to the worker's spare or is
 * freed; a batch's is freed. A handle reused by a new request cannot be
 * told from it: best effort, for the common mistake of releasing twice in
 * a row. */
static bool future_gone(const gma_future_t *f) {
  return gma__load_relaxed(&f->magic) != FUT_LIVE;
}

static gma_status_t gone_error(const char *fn) {
  return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                        "%s: this future was already given back (gma_future_release, or a "
                        "gma_future_take that did not return GMA_PENDING); a released handle "
                        "must not be used again",
                        fn);
}

/* gma_future_poll and gma_future_status: the same, errors naming fn. */
static gma_status_t poll_as(gma_future_t *f, const char *fn) {
  if (!f) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "%s: future is NULL", fn);
  if (f != completing && future_gone(f)) /* its callback may ask, released or not */
    return gone_error(fn);
  if (forked(f)) return gma__fork_future_error(fn);
  if (!finished(f)) return GMA_PENDING;
  gma_status_t st = (gma_status_t)gma__load_acquire(&f->state);
  return st == GMA_OK && destroyed(f) ? gone(fn) : st;
}

gma_status_t gma_future_poll(gma_future_t *f) { return poll_as(f, "gma_future_poll"); }

gma_status_t gma_future_status(gma_future_t *f) { return poll_as(f, "gma_future_status"); }

/* Waits for f->done until timeout_ns (not 0) runs out: the slow part of a
 * wait, out of line, so that a wait on a complete future reads no clock. */
static __attribute__((noinline)) void wait_done(gma_future_t *f, uint64_t timeout_ns) {
  uint64_t start = gma__now_ns();
  /* The worker usually answers within microseconds: spin briefly (at most
   * 20 us, or the timeout) before sleeping, to save a thread wake-up;
   * yielding, so a worker on this CPU runs at once (gma__spin_step). */
  bool yielding = false;
  for (unsigned i = 1; gma__load_acquire(&f->done) != FUT_DONE; i++) {
    gma__spin_step(i, yielding);
    if (i % 16) continue;
    uint64_t spun = gma__now_ns() - start;
    if (spun >= (timeout_ns < 20000 ? timeout_ns : 20000)) break;
    yielding = spun >= 1000;
  }
  /* Then sleep on the future itself: nothing of the allocator's is touched,
   * so gma_destroy may run meanwhile (it cancels the request and wakes us). */
  uint64_t due = timeout_ns > UINT64_MAX - start ? UINT64_MAX : start + timeout_ns; /* saturating */
  for (;;) {
    uint32_t d = FUT_RUNNING;
    if (!gma__cas_seq_cst(&f->done, &d, FUT_SLEEPER) && d == FUT_DONE) break;
    if (due == UINT64_MAX) {
      futex_sleep(&f->done, NULL);
      continue;
    }
    uint64_t now = gma__now_ns();
    if (now >= due) break;
    struct timespec rel = {(time_t)((due - now) / 1000000000u), (long)((due - now) % 1000000000u)};
    futex_sleep(&f->done, &rel);
  }
}

/* gma_future_wait and gma_future_take (fn names the caller in messages). */
static gma_status_t wait_collect(gma_future_t *f, uint64_t timeout_ns, void **ptr, const char *fn) {
  /* A wait that may block 1 ms or more serves a request the worker has not
   * begun (help): the worker may not get a CPU for that long when the
   * machine's threads are busy. A shorter wait only waits. */
  if (timeout_ns && !finished(f) && !(timeout_ns >= 1000000u && help(f)))
    wait_done(f, timeout_ns);
  int st = finished(f) ? gma__load_acquire(&f->state) : GMA_PENDING;
  if (st == GMA_OK) {
    /* The memory exists only as long as the allocator: inside the anchor,
     * gma_destroy waits for us before its leak report and teardown. */
    gma_t *g = gma__anchor_enter(f->anchor);
    if (!g) return gone(fn);
    /* One wait collects; the exchange decides which (several
     * waiters each got GMA_OK and the same pointer, and each "owned" it). */
    bool collect = ptr || f->user_ptrs;
    if (collect && gma__exchange_seq_cst(&f->collected, true)) {
      gma__anchor_exit(f->anchor);
      return gma__set_error(GMA_ERR_ALREADY_COLLECTED,
                            "%s: an earlier wait already collected this future's memory; only "
                            "that wait got the pointer",
                            fn);
    }
    for (size_t i = 0; collect && i < f->n; i++) /* the caller's now: a leak if never freed */
      gma__pool_hold(&g->pool, f->ptrs[i], false);
    gma__anchor_exit(f->anchor);
    if (f->user_ptrs) memcpy(f->user_ptrs, f->ptrs, f->n * sizeof(void *));
    if (ptr) *ptr = f->ptrs[0];
  } else if (st != GMA_PENDING) {
    gma__set_error((gma_status_t)st, "%s",
                   f->msg ? gma__error_detail(f->msg) : "no detail (host memory ran out)");
  }
  return (gma_status_t)st;
}

gma_status_t gma_future_wait(gma_future_t *f, uint64_t timeout_ns, void **ptr) {
  if (ptr) *ptr = NULL; /* unless GMA_OK */
  if (!f) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "gma_future_wait: future is NULL");
  if (future_gone(f)) return gone_error("gma_future_wait");
  if (forked(f)) return gma__fork_future_error("gma_future_wait"); /* nothing would wake us */
  return wait_collect(f, timeout_ns, ptr, "gma_future_wait");
}

gma_status_t gma_future_release(gma_future_t *f) {
  if (!f) return GMA_OK;
  /* One release: of two racing releases of one handle the compare-and-swap
   * lets one through. A stale handle is refused without a write when the
   * object is still gma's (best effort: see future_gone). */
  uint32_t live = FUT_LIVE;
  if (!gma__cas_relaxed(&f->magic, &live, FUT_GONE))
    return gone_error("gma_future_release");
  if (forked(f)) { /* the worker's reference died with the parent's threads */
    future_delete(f);
    return GMA_OK;
  }
  /* Ours is the only reference (ready at once, or the worker is done with
   * it: see unref): nobody reads released any more, so no flag is needed. */
  bool alone = gma__load_acquire(&f->refs) == 1;
  if (!alone) gma__store_seq_cst(&f->released, true); /* seq_cst: pairs with complete()'s state store */
  if (gma__load_seq_cst(&f->state) == GMA_OK && !gma__load_seq_cst(&f->collected)) {
    gma_t *g = gma__anchor_enter(f->anchor); /* NULL: gma_destroy freed the memory */
    if (g) {
      claim_and_free(f, g);
      gma__anchor_exit(f->anchor);
    }
  }
  unref(f);
  return GMA_OK;
}

gma_status_t gma_future_take(gma_future_t *f, uint64_t timeout_ns, void **ptr) {
  if (ptr) *ptr = NULL; /* unless GMA_OK */
  if (!f) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "gma_future_take: future is NULL");
  if (future_gone(f)) return gone_error("gma_future_take");
  if (!ptr && !f->user_ptrs)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "gma_future_take: ptr is NULL; take hands the memory to the caller "
                          "(only a batch's future, whose pointers go to its ptrs, may pass NULL); "
                          "the future was not released");
  gma_status_t st = forked(f) ? gma__fork_future_error("gma_future_take")
                              : wait_collect(f, timeout_ns, ptr, "gma_future_take");
  if (st != GMA_PENDING) gma_future_release(f); /* sets no error: the wait's stays */
  return st;
}
