/* The PyTorch plug-in's teardown (plugins/torch): calls racing with
 * gma_torch_shutdown, and calls made after its atexit handler ran. PyTorch
 * can free tensors after the plug-in destroyed its allocators (static
 * tensors, daemon threads): such late frees must be harmless, late
 * allocations must fail cleanly, and nothing may touch a destroyed allocator
 * (ASan and TSan builds check that). Runs on the simulated device.
 *   test_torch_exit threads   threads allocate and free while the main thread
 *                             calls gma_torch_shutdown
 *   test_torch_exit atexit    frees and allocates from an atexit handler that
 *                             runs after the plug-in's own */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "gma_torch.h"

#define THREADS 4
#define SLOTS 16

static atomic_int stop;
static atomic_long ops_before, ops_after;
static atomic_int shut;

static void *hammer(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
  void *live[SLOTS] = {0};
  int failed = 0;
  while (!atomic_load(&stop)) {
    unsigned i = (seed = seed * 1103515245u + 12345u) >> 16;
    i %= SLOTS;
    int after = atomic_load(&shut);
    if (live[i]) {
      gma_torch_free(live[i], 4096, 0, NULL); /* after shutdown: a no-op */
      live[i] = NULL;
    } else {
      live[i] = gma_torch_alloc(512 + 512 * (ssize_t)i, 0, NULL);
      /* Allocations that started after shutdown returned must fail. */
      if (after) CHECK(live[i] == NULL);
      if (!live[i]) failed++;
    }
    atomic_fetch_add(after ? &ops_after : &ops_before, 1);
    if (failed >= 3) break; /* each failure logs a line: a few show the point */
  }
  for (int i = 0; i < SLOTS; i++) gma_torch_free(live[i], 0, 0, NULL);
  return NULL;
}

static void threads(void) {
  pthread_t t[THREADS];
  for (long i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, hammer, (void *)i) == 0);
  while (atomic_load(&ops_before) < 4000) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  gma_torch_shutdown(); /* destroys device 0's allocator under the threads' feet */
  clock_gettime(CLOCK_MONOTONIC, &t1);
  atomic_store(&shut, 1);
  gma_torch_shutdown(); /* idempotent */
  struct timespec ts = {0, 50 * 1000000};
  nanosleep(&ts, NULL);
  atomic_store(&stop, 1);
  for (int i = 0; i < THREADS; i++) CHECK(pthread_join(t[i], NULL) == 0);
  CHECK(gma_torch_alloc(4096, 0, NULL) == NULL);
  CHECK(strstr(gma_torch_last_error(), "shutdown") != NULL);
  gma_stats_t s = GMA_STATS_INIT;
  CHECK(gma_torch_stats(0, &s) == GMA_ERR_CANCELLED);
  CHECK(gma_torch_allocator(0) == NULL);
  printf("threads: %ld operations before shutdown, %ld after; shutdown took %.1f ms\n",
         atomic_load(&ops_before), atomic_load(&ops_after),
         (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
}

static void *late_ptr;

/* Registered before the plug-in's first allocation, so it runs after the
 * plug-in's atexit handler destroyed the allocators. */
static void late_calls(void) {
  gma_torch_free(late_ptr, 1 << 20, 0, NULL); /* the tensor PyTorch frees late */
  void *p = gma_torch_alloc(1 << 20, 0, NULL);
  gma_torch_free(p, 1 << 20, 0, NULL);
  if (p != NULL) {
    fprintf(stderr, "FAILED: an allocation after exit succeeded\n");
    _exit(1);
  }
  printf("late calls after the plug-in's atexit handler: harmless\n");
  fflush(stdout);
}

static void at_exit(void) {
  CHECK(atexit(late_calls) == 0);
  late_ptr = gma_torch_alloc(1 << 20, 0, NULL);
  CHECK(late_ptr != NULL);
  void *q = gma_torch_alloc(4096, 0, NULL);
  CHECK(q != NULL);
  gma_torch_free(q, 4096, 0, NULL);
  gma_stats_t s = GMA_STATS_INIT;
  CHECK(gma_torch_stats(0, &s) == GMA_OK);
  CHECK(s.num_allocs == 2 && s.num_frees == 1 && s.allocated.current == 1 << 20);
  /* late_ptr stays live: the plug-in's handler reports and frees it. */
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "threads") == 0) {
    /* bins:off keeps this test on the plug-in's teardown: TSan cannot see
     * ck's atomics, and with bins on it occasionally reports (in about 1 of
     * 300 runs) the worker draining a bin in runtime/core/streams.c against a
     * push, with the pushing stack lost. */
    setenv("GMA_CONF", "device:sim,bins:off", 1);
    threads();
  } else {
    setenv("GMA_CONF", "device:sim", 1);
    at_exit();
  }
  return 0;
}
