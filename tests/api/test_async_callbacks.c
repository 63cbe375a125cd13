/* The threads callbacks run on: a future's callback runs on the worker, or
 * on the submitting thread inside the gma_alloc_async call that completed
 * it at once; never on a thread that waits on the future. A watchdog turns
 * a hang into a failure. Public API only. */
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
      {"waiter_leaves_callback", waiter_leaves_callback},
      {"callback_threads", callback_threads},
  };
  return run_cases(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
