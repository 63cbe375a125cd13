/* Growable segments against the worker's two jobs, found by review of the
 * chunk rewrite: growth ahead of demand must keep the free chunks it grows
 * for (it gave them back and mapped new ones at every tick, never reaching
 * its target), and memory freed just now must not inherit an idle
 * neighbour's idle clock (a timed trim gave it back at once). Internal: it
 * drives gma__pool_grow_ahead and gma__pool_release with a chosen clock. */
#include <stdio.h>

#include "api/allocator.h"
#include "core/internal.h"
#include "simkit.h"

#define MiB ((uint64_t)1 << 20)

static uint64_t pool_free(gma__pool_t *p) {
  pthread_mutex_lock(&p->lock);
  uint64_t f = p->c.free;
  pthread_mutex_unlock(&p->lock);
  return f;
}

static void grow_ahead_keeps(void) {
  gma_t *g = sim_allocator("expandable_segments:true,worker:off,sim_capacity:8G,memory_limit:4G");
  gma__pool_t *p = gma__pool_of(g);
  const uint64_t want = 512 * MiB;
  void *a1, *a2, *a3, *a4;
  CHECK_OK(gma__pool_grow_ahead(p, want));
  CHECK_OK(gma_alloc(g, 512 * MiB, NULL, &a1));
  CHECK_OK(gma_alloc(g, 188 * MiB, NULL, &a2));
  CHECK_OK(gma__pool_grow_ahead(p, want));
  CHECK_OK(gma_alloc(g, 512 * MiB, NULL, &a3));
  CHECK_OK(gma__pool_grow_ahead(p, want));
  CHECK_OK(gma_alloc(g, 512 * MiB, NULL, &a4));
  CHECK_OK(gma_free(g, a2));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK_OK(gma__pool_grow_ahead(p, want)); /* tops up to the target */
  gma_stats_t s0 = stats_of(g);
  CHECK(pool_free(p) >= want);
  for (int tick = 0; tick < 8; tick++) CHECK_OK(gma__pool_grow_ahead(p, want));
  gma_stats_t s1 = stats_of(g);
  CHECK(pool_free(p) >= want);
  CHECK(s1.num_device_allocs == s0.num_device_allocs); /* no churn: nothing mapped again */
  CHECK(s1.num_device_frees == s0.num_device_frees);
  CHECK_OK(gma_free(g, a1));
  CHECK_OK(gma_free(g, a3));
  CHECK_OK(gma_free(g, a4));
  CHECK_OK(gma_destroy(g));
}

static void fresh_free_not_idle(void) {
  gma_t *g = sim_allocator("expandable_segments:true,worker:off,sim_capacity:1G,memory_limit:512M");
  gma__pool_t *p = gma__pool_of(g);
  void *a, *b;
  CHECK_OK(gma_alloc(g, 128 * MiB, NULL, &a));
  CHECK_OK(gma_alloc(g, 128 * MiB, NULL, &b));
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  const uint64_t sec = 1000000000ull;
  gma__release_t r = {.keep = UINT64_MAX, .idle_ns = 10 * sec, .now_ns = 100 * sec, .timed = true};
  CHECK_OK(gma__pool_release(p, &r)); /* a's idle clock starts at 100 s */
  CHECK_OK(gma_free(g, b));            /* b freed at 109 s, merging with a */
  CHECK_OK(gma_stream_synchronize(g, NULL));
  r.now_ns = 109 * sec;
  CHECK_OK(gma__pool_release(p, &r));
  r.now_ns = 110 * sec; /* a idle for 10 s, but b for 1 s: b's memory stays */
  CHECK_OK(gma__pool_release(p, &r));
  CHECK(stats_of(g).reserved.current >= 128 * MiB);
  r.now_ns = 120 * sec; /* now all of it was idle 10 s or more */
  CHECK_OK(gma__pool_release(p, &r));
  CHECK(stats_of(g).reserved.current == 0);
  CHECK_OK(gma_destroy(g));
}

static const test_case_t cases[] = {{"grow_ahead_keeps", grow_ahead_keeps},
                                    {"fresh_free_not_idle", fresh_free_not_idle}};

int main(int argc, char **argv) {
  return run_cases(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
