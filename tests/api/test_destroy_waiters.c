/* What may run while gma_destroy runs: threads waiting on, polling and
 * releasing futures (nothing else may call into the allocator then).
 *
 *  1. Threads asleep in gma_future_wait (no timeout, and with a timeout) on
 *     requests that cannot be served wake with GMA_ERR_CANCELLED when another
 *     thread destroys the allocator; a thread polling sees it too.
 *  2. A served future never collected: after gma_destroy, wait and poll say
 *     GMA_ERR_CANCELLED and hand out no pointer (its memory went with the
 *     allocator); release is still allowed.
 *  3. Race rounds: threads wait (collecting the pointer) or release while the
 *     main thread destroys the allocator at a random moment. A wait either
 *     returns GMA_OK with a pointer collected before the teardown (a live
 *     allocation, so gma_destroy frees it and reports it as a leak) or
 *     GMA_ERR_CANCELLED; so the leak count gma_destroy reports must equal the
 *     number of waits that returned GMA_OK. ASan catches a wait or release
 *     touching the torn-down pool, TSan a missing order with the teardown.
 * Public API only. */
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "simkit.h"

#define MiB ((size_t)1 << 20)
#define MS 1000000ull

typedef struct waiter {
  gma_future_t *f;
  uint64_t timeout_ns; /* UINT64_MAX: none; 0: poll until final */
  bool release_only;   /* release instead of waiting */
  gma_status_t st;
  void *ptr;
  char msg[256];
  atomic_int *started;
} waiter_t;

static void *waiter_main(void *arg) {
  waiter_t *w = arg;
  atomic_fetch_add(w->started, 1);
  if (w->release_only) {
    w->st = gma_future_release(w->f);
    w->f = NULL;
    return NULL;
  }
  if (w->timeout_ns == 0) { /* poll */
    while ((w->st = gma_future_poll(w->f)) == GMA_PENDING) sleep_us(100);
  } else {
    do w->st = gma_future_wait(w->f, w->timeout_ns, &w->ptr);
    while (w->st == GMA_PENDING); /* a timed wait ran out: wait again */
  }
  snprintf(w->msg, sizeof w->msg, "%s", gma_last_error());
  return NULL;
}

/* 1: waiters asleep on unservable requests are woken by gma_destroy. */
static void sleepers_woken(void) {
  gma_t *g = sim_allocator("sim_capacity:64M,bins:off,future_timeout_ms:600000");
  void *big;
  CHECK_OK(gma_alloc(g, 48 * MiB, NULL, &big)); /* stays live: no request fits */
  enum { N = 4 };
  waiter_t w[N];
  pthread_t t[N];
  atomic_int started = 0;
  const uint64_t timeouts[N] = {UINT64_MAX, UINT64_MAX, 200 * MS, 0};
  for (int i = 0; i < N; i++) {
    memset(&w[i], 0, sizeof w[i]);
    CHECK_OK(gma_alloc_async(g, 32 * MiB, NULL, NULL, &w[i].f));
    w[i].timeout_ns = timeouts[i];
    w[i].started = &started;
    CHECK(pthread_create(&t[i], NULL, waiter_main, &w[i]) == 0);
  }
  while (atomic_load(&started) < N) sleep_us(100);
  sleep_us(50 * 1000); /* past the spin: asleep on their futures */
  for (int i = 0; i < N; i++) CHECK_ST(gma_future_poll(w[i].f), GMA_PENDING);
  fprintf(stderr, "test_destroy_waiters: a leak report of one allocation follows; expected\n");
  CHECK_ST(gma_destroy(g), GMA_ERR_LEAK);
  for (int i = 0; i < N; i++) {
    CHECK(pthread_join(t[i], NULL) == 0);
    CHECK_ST(w[i].st, GMA_ERR_CANCELLED);
    CHECK(w[i].ptr == NULL);
    if (timeouts[i]) CHECK(strstr(w[i].msg, "destroyed before the request was served") != NULL);
    CHECK_OK(gma_future_release(w[i].f));
  }
}

/* 2: a served, uncollected future after gma_destroy hands out nothing. */
static void served_then_destroyed(void) {
  gma_t *g = sim_allocator("bins:off");
  gma_future_t *one, *batch;
  CHECK_OK(gma_alloc_async(g, 4 * MiB, NULL, NULL, &one));
  size_t sizes[3] = {1 * MiB, 2 * MiB, 3 * MiB};
  void *ptrs[3] = {NULL, NULL, NULL};
  CHECK_OK(gma_alloc_batch_async(g, 3, sizes, NULL, ptrs, NULL, &batch));
  CHECK_OK(gma_future_wait(one, UINT64_MAX, NULL)); /* served; not collected (no pointer) */
  while (gma_future_poll(batch) == GMA_PENDING) sleep_us(100);
  CHECK_OK(gma_destroy(g)); /* uncollected memory is freed quietly: no leak */
  void *p = (void *)&p;
  CHECK_ST(gma_future_wait(one, UINT64_MAX, &p), GMA_ERR_CANCELLED);
  CHECK(p == NULL);
  CHECK(strstr(gma_last_error(), "the allocator was destroyed") != NULL);
  CHECK_ST(gma_future_poll(one), GMA_ERR_CANCELLED);
  CHECK_ST(gma_future_wait(batch, 0, NULL), GMA_ERR_CANCELLED);
  for (int i = 0; i < 3; i++) CHECK(ptrs[i] == NULL); /* never filled */
  CHECK_OK(gma_future_release(one));
  CHECK_OK(gma_future_release(batch));
}

/* The number in gma_destroy's "N live allocations" message (0 if none). */
static unsigned leak_count(gma_status_t st) {
  if (st == GMA_OK) return 0;
  CHECK_ST(st, GMA_ERR_LEAK);
  const char *m = strstr(gma_last_error(), "gma_destroy: ");
  CHECK(m != NULL);
  return (unsigned)strtoul(m + strlen("gma_destroy: "), NULL, 10);
}

/* 3: waits and releases racing gma_destroy. */
static void race_rounds(void) {
  enum { ROUNDS = 150, N = 6 };
  uint64_t rng = 0x2545f4914f6cdd1dull;
  unsigned ok_total = 0, cancelled_total = 0;
  /* Each round that collects memory prints a leak report: keep stderr quiet. */
  fflush(stderr);
  int saved = dup(2), devnull = open("/dev/null", O_WRONLY);
  CHECK(saved >= 0 && devnull >= 0);
  dup2(devnull, 2);
  for (int r = 0; r < ROUNDS; r++) {
    gma_t *g = sim_allocator("bins:off,sim_capacity:256M");
    waiter_t w[N];
    pthread_t t[N];
    atomic_int started = 0;
    for (int i = 0; i < N; i++) {
      memset(&w[i], 0, sizeof w[i]);
      /* Above bin_max: the worker serves each, racing the destroy. */
      CHECK_OK(gma_alloc_async(g, (size_t)(2 + i) * MiB, NULL, NULL, &w[i].f));
      w[i].timeout_ns = i % 3 == 2 ? 50 * MS : UINT64_MAX;
      w[i].release_only = i % 3 == 1;
      w[i].started = &started;
      CHECK(pthread_create(&t[i], NULL, waiter_main, &w[i]) == 0);
    }
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    while (atomic_load(&started) < N) sched_yield();
    if (rng % 2) sleep_us((long)(rng % 100));
    unsigned leaks = leak_count(gma_destroy(g));
    unsigned ok = 0;
    for (int i = 0; i < N; i++) {
      CHECK(pthread_join(t[i], NULL) == 0);
      if (w[i].release_only) {
        CHECK_OK(w[i].st);
        continue;
      }
      if (w[i].st == GMA_OK) {
        CHECK(w[i].ptr != NULL);
        ok++;
      } else {
        CHECK_ST(w[i].st, GMA_ERR_CANCELLED);
        CHECK(w[i].ptr == NULL);
        cancelled_total++;
      }
      CHECK_OK(gma_future_release(w[i].f));
    }
    if (leaks != ok) {
      dup2(saved, 2);
      fprintf(stderr, "round %d: %u waits got memory but gma_destroy reported %u leaks\n", r, ok,
              leaks);
    }
    CHECK(leaks == ok); /* every pointer handed out was a live allocation at the teardown */
    ok_total += ok;
  }
  dup2(saved, 2);
  close(saved);
  close(devnull);
  printf("race rounds: %d, waits that collected memory: %u, cancelled: %u\n", ROUNDS, ok_total,
         cancelled_total);
  CHECK(ok_total > 0); /* both outcomes happened: the race was exercised */
}

int main(void) {
  sleepers_woken();
  served_then_destroyed();
  race_rounds();
  printf("test_destroy_waiters: ok\n");
  return 0;
}
