/* Future callbacks that submit, and the threads callbacks run on.
 *
 * A callback on the worker that submits the next request (the obvious way
 * to chain requests) must not wait for ring room: only the worker makes
 * room. Chains through a one-slot ring (ring_size:2), blocking and
 * nonblocking, single and batch; a pressure callback that submits; a chain
 * that resubmits even when cancelled, through gma_destroy. And a future's
 * callback runs on the worker, or on the submitting thread inside the
 * gma_alloc_async call that completed it at once: never on a thread that
 * waits on the future. A watchdog turns a hang into a failure. Public API
 * only. */
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "simkit.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define MS 1000000ull

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "test_async_callbacks: hang (the watchdog fired: a thread waits "
                            "for something that never comes)\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
  _exit(1);
}

/* Each case gets 20 s (CTest's limit for the whole test is 60). */
static void watchdog(void) {
  signal(SIGALRM, on_alarm);
  alarm(20);
}

/* Waits until *v reaches want, at most limit_ms; true if it did. */
static bool wait_for(atomic_int *v, int want, int limit_ms) {
  for (int i = 0; i < limit_ms * 10 && atomic_load(v) < want; i++) sleep_us(100);
  return atomic_load(v) >= want;
}

/* ---- chains: each completed request's callback submits the next ones ---- */

enum { CHAIN_MAX = 64 };

typedef struct chain {
  gma_t *g;
  int fanout;                      /* requests each callback submits */
  int limit;                       /* submits in all, the first included */
  bool resubmit_failed;            /* submit again after a failure too */
  atomic_int submitted, completed, refused;
  gma_future_t *_Atomic f[CHAIN_MAX];
  atomic_int status[CHAIN_MAX];
  void *ptrs[CHAIN_MAX][2];        /* batch results */
  gma_status_t last_refusal;
} chain_t;

static void chain_cb(gma_future_t *f, gma_status_t st, void *user);

/* Submits request number i of the chain: even ones single, odd ones a
 * batch of two; every third nonblocking (never GMA_ERR_BUSY from the
 * worker, which never waits). worker_only: the ring is used every time. */
static gma_status_t chain_submit(chain_t *c, int i) {
  gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
  o.callback = chain_cb;
  o.user = c;
  o.worker_only = 1;
  o.nonblocking = i % 3 == 2;
  o.timeout_ns = 5000 * MS;
  gma_future_t *f = NULL;
  size_t sizes[2] = {64 * KiB, 256 * KiB};
  gma_status_t st = i % 2 ? gma_alloc_batch_async(c->g, 2, sizes, NULL, c->ptrs[i], &o, &f)
                          : gma_alloc_async(c->g, 1 * MiB, NULL, &o, &f);
  if (st == GMA_OK) atomic_store(&c->f[i], f);
  return st;
}

static void chain_cb(gma_future_t *f, gma_status_t st, void *user) {
  (void)f;
  chain_t *c = user;
  atomic_fetch_add(&c->completed, 1);
  if (st != GMA_OK && !c->resubmit_failed) return;
  for (int k = 0; k < c->fanout; k++) {
    int i = atomic_fetch_add(&c->submitted, 1);
    if (i >= c->limit) return;
    gma_status_t s = chain_submit(c, i);
    if (s != GMA_OK) {
      c->last_refusal = s;
      atomic_fetch_add(&c->refused, 1);
    }
  }
}

/* Collects and frees what every request of the chain got. */
static void chain_collect(chain_t *c, int n) {
  for (int i = 0; i < n; i++) {
    gma_future_t *f = atomic_load(&c->f[i]);
    CHECK(f != NULL);
    void *p = NULL;
    CHECK_OK(gma_future_take(f, UINT64_MAX, i % 2 ? NULL : &p));
    if (i % 2) {
      CHECK_OK(gma_free(c->g, c->ptrs[i][0]));
      CHECK_OK(gma_free(c->g, c->ptrs[i][1]));
    } else {
      CHECK_OK(gma_free(c->g, p));
    }
  }
}

/* ring_size 2 holds one request. Each callback submits two: the first
 * takes the slot, the second found the ring full and waited for room only
 * the waiting worker could make. */
static void callback_submits_ring_full(void) {
  watchdog();
  gma_t *g = sim_allocator("ring_size:2,trim_interval_ms:3600000");
  chain_t *c = calloc(1, sizeof *c);
  CHECK(c != NULL);
  c->g = g;
  c->fanout = 2;
  c->limit = CHAIN_MAX;
  atomic_store(&c->submitted, 1);
  CHECK_OK(chain_submit(c, 0));
  CHECK(wait_for(&c->completed, CHAIN_MAX, 15000));
  CHECK(atomic_load(&c->refused) == 0);
  chain_collect(c, CHAIN_MAX);
  gma_stats_t s = stats_of(g);
  CHECK(s.futures_submitted == CHAIN_MAX && s.futures_ready == CHAIN_MAX);
  CHECK(s.queue_depth == 0 && s.allocated.current == 0);
  CHECK_OK(gma_destroy(g));
  free(c);
}

/* A chain that submits again whatever the outcome, cancellation included,
 * while gma_destroy runs: the requests the worker cancels at shutdown
 * resubmit from their callbacks, and those submits are refused
 * (GMA_ERR_CANCELLED), so gma_destroy returns and the chain ends. */
static void chain_through_destroy(void) {
  watchdog();
  gma_t *g = sim_allocator("ring_size:2,sim_capacity:16M,bins:off,trim_interval_ms:3600000");
  void *big;
  CHECK_OK(gma_alloc(g, 16 * MiB, NULL, &big)); /* the chain's requests wait for memory */
  chain_t *c = calloc(1, sizeof *c);
  CHECK(c != NULL);
  c->g = g;
  c->fanout = 1;
  c->limit = CHAIN_MAX;
  c->resubmit_failed = true;
  atomic_store(&c->submitted, 1);
  CHECK_OK(chain_submit(c, 0));
  sleep_us(20 * 1000);
  CHECK(atomic_load(&c->completed) == 0); /* waiting for memory */
  fprintf(stderr, "test_async_callbacks: a leak report of one allocation follows; it is expected\n");
  CHECK_ST(gma_destroy(g), GMA_ERR_LEAK);
  CHECK(atomic_load(&c->completed) == 1 && atomic_load(&c->refused) == 1);
  CHECK(c->last_refusal == GMA_ERR_CANCELLED);
  CHECK_ST(gma_future_poll(atomic_load(&c->f[0])), GMA_ERR_CANCELLED);
  CHECK_OK(gma_future_release(atomic_load(&c->f[0])));
  CHECK(atomic_load(&c->f[1]) == NULL);
  free(c);
}

/* The pressure callback runs on the worker too: submits from it do not
 * wait for ring room either. */
typedef struct pressure_submit {
  gma_t *g;
  atomic_int calls, done;
  gma_future_t *f[3];
  gma_status_t st[3];
} pressure_submit_t;

static void pressure_submits(gma_t *g, gma_pressure_t level, void *user) {
  (void)level;
  pressure_submit_t *ps = user;
  if (atomic_fetch_add(&ps->calls, 1)) return;
  gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
  o.worker_only = 1;
  for (int i = 0; i < 3; i++) ps->st[i] = gma_alloc_async(g, 2 * MiB, NULL, &o, &ps->f[i]);
  atomic_store(&ps->done, 1);
}

static void pressure_callback_submits(void) {
  watchdog();
  gma_t *g = sim_allocator("ring_size:2,trim_interval_ms:5");
  pressure_submit_t ps = {.g = g};
  CHECK_OK(gma_set_pressure_callback(g, pressure_submits, &ps));
  CHECK(wait_for(&ps.done, 1, 15000));
  for (int i = 0; i < 3; i++) {
    CHECK_OK(ps.st[i]);
    void *p;
    CHECK_OK(gma_future_take(ps.f[i], UINT64_MAX, &p));
    CHECK_OK(gma_free(g, p));
  }
  CHECK_OK(gma_set_pressure_callback(g, NULL, NULL));
  CHECK_OK(gma_destroy(g));
}

/* ---- which thread runs a future's callback ---- */

typedef struct where {
  atomic_int runs;
  pthread_t thread;      /* the thread the callback ran on */
  bool in_submit;        /* it ran inside the submitting call */
  atomic_int *gate;      /* if set, hold the worker until it opens */
} where_t;

static pthread_t submitter;
static atomic_bool submitting; /* submitter is inside gma_alloc_async */

static void where_cb(gma_future_t *f, gma_status_t st, void *user) {
  (void)f;
  (void)st;
  where_t *w = user;
  w->thread = pthread_self();
  w->in_submit = pthread_equal(w->thread, submitter) && atomic_load(&submitting);
  atomic_fetch_add(&w->runs, 1);
  if (w->gate)
    for (int i = 0; i < 50000 && !atomic_load(w->gate); i++) sleep_us(100);
}

static gma_future_t *submit_where(gma_t *g, gma_stream_t s, size_t size, where_t *w, bool worker_only) {
  gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
  o.callback = where_cb;
  o.user = w;
  o.worker_only = worker_only;
  gma_future_t *f;
  atomic_store(&submitting, true);
  CHECK_OK(gma_alloc_async(g, size, s, &o, &f));
  atomic_store(&submitting, false);
  return f;
}

/* The worker's thread, as a worker_only request's callback sees it. */
static pthread_t worker_thread(gma_t *g, gma_stream_t s) {
  where_t w = {0};
  gma_future_t *f = submit_where(g, s, 512, &w, true);
  void *p;
  CHECK_OK(gma_future_take(f, UINT64_MAX, &p));
  CHECK_OK(gma_free(g, p));
  CHECK(atomic_load(&w.runs) == 1 && !w.in_submit);
  return w.thread;
}

/* A waiter on another thread: waits on *slot once it is set. */
typedef struct waiter {
  gma_future_t *_Atomic slot;
  uint64_t timeout_ns;
  atomic_int waits;
  gma_status_t st;
  atomic_bool quit;
} waiter_t;

static void *waiter_main(void *arg) {
  waiter_t *wt = arg;
  for (;;) {
    gma_future_t *f;
    while (!(f = atomic_load(&wt->slot)) && !atomic_load(&wt->quit)) sched_yield();
    if (!f) return NULL;
    wt->st = gma_future_wait(f, wt->timeout_ns, NULL);
    atomic_store(&wt->slot, NULL);
    atomic_fetch_add(&wt->waits, 1);
  }
}

/* The worker is held inside another future's callback while a thread
 * waits on a request that has a callback: the waiter does not serve it
 * (it would run the callback on itself), so its wait runs out; the worker
 * serves it once it is free, and runs the callback. */
static void waiter_leaves_callback(void) {
  watchdog();
  gma_t *g = sim_allocator("trim_interval_ms:3600000");
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  submitter = pthread_self();
  pthread_t worker = worker_thread(g, s);
  atomic_int gate = 0;
  where_t held = {.gate = &gate}, seen = {0};
  gma_future_t *a = submit_where(g, s, 512, &held, true);
  CHECK(wait_for(&held.runs, 1, 5000)); /* the worker is inside a's callback */
  gma_future_t *b = submit_where(g, s, 64 * MiB, &seen, false); /* more than the pool holds */
  CHECK_ST(gma_future_poll(b), GMA_PENDING);
  waiter_t wt = {.timeout_ns = 50 * MS};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, waiter_main, &wt) == 0);
  atomic_store(&wt.slot, b);
  CHECK(wait_for(&wt.waits, 1, 10000));
  CHECK(wt.st == GMA_PENDING && atomic_load(&seen.runs) == 0);
  atomic_store(&wt.quit, true);
  CHECK(pthread_join(t, NULL) == 0);
  atomic_store(&gate, 1);
  void *pa, *pb;
  CHECK_OK(gma_future_take(b, UINT64_MAX, &pb));
  CHECK_OK(gma_future_take(a, UINT64_MAX, &pa));
  CHECK(atomic_load(&seen.runs) == 1 && pthread_equal(seen.thread, worker));
  CHECK_OK(gma_free(g, pa));
  CHECK_OK(gma_free(g, pb));
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_destroy(g));
}

/* Many requests, each waited on at once by another thread (the race the
 * waiter would win against the worker's wake-up): every callback runs on
 * the worker, or on this (submitting) thread inside gma_alloc_async. A
 * request without a callback may still be served by its waiter. */
static void callback_threads(void) {
  watchdog();
  gma_t *g = sim_allocator("trim_interval_ms:3600000");
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  submitter = pthread_self();
  pthread_t worker = worker_thread(g, s);
  enum { RUNS = 50 };
  static where_t seen[RUNS];
  memset(seen, 0, sizeof seen);
  waiter_t wt = {.timeout_ns = UINT64_MAX};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, waiter_main, &wt) == 0);
  gma_future_t *f[RUNS];
  int on_worker = 0, at_once = 0;
  for (int i = 0; i < RUNS; i++) {
    /* 12 MiB, never freed until the end: each request needs a new segment,
     * so none is complete at once and the worker gets every one. */
    f[i] = submit_where(g, s, 12 * MiB, &seen[i], false);
    atomic_store(&wt.slot, f[i]);
    CHECK(wait_for(&wt.waits, i + 1, 10000));
    CHECK_OK(wt.st);
    CHECK(atomic_load(&seen[i].runs) == 1);
    bool worker_ran = pthread_equal(seen[i].thread, worker);
    CHECK(worker_ran || seen[i].in_submit);
    on_worker += worker_ran;
    at_once += seen[i].in_submit;
  }
  atomic_store(&wt.quit, true);
  CHECK(pthread_join(t, NULL) == 0);
  printf("callbacks: %d on the worker, %d complete at once\n", on_worker, at_once);
  for (int i = 0; i < RUNS; i++) {
    void *p;
    CHECK_OK(gma_future_take(f[i], 0, &p));
    CHECK_OK(gma_free(g, p));
  }
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_destroy(g));
}

int main(int argc, char **argv) {
  static const test_case_t cases[] = {
      {"callback_submits_ring_full", callback_submits_ring_full},
      {"chain_through_destroy", chain_through_destroy},
      {"pressure_callback_submits", pressure_callback_submits},
      {"waiter_leaves_callback", waiter_leaves_callback},
      {"callback_threads", callback_threads},
  };
  return run_cases(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
