/* The worker thread: timed trimming brings reserved memory down to the
 * release threshold within two trim intervals with no caller involved; idle
 * segments go back after idle_ms; memory pressure makes trimming harder and
 * is reported to a callback; grow_ahead keeps free memory ready so callers do
 * not grow the pool themselves; worker:off has no thread. Public API only. */
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "simkit.h"

#define MiB ((size_t)1 << 20)

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Waits (at most limit_ms) until reserved <= bytes; returns the time taken.
 * Segments leave reserved when the worker detaches them; the trim counters
 * follow once the device frees are done, so wait for a trim to be counted
 * too (any_trim returns how many were). */
static uint64_t any_trim(gma_stats_t s) {
  return s.trims_timed + s.trims_idle + s.trims_explicit;
}
static uint64_t wait_reserved_at_most(gma_t *g, uint64_t bytes, uint64_t limit_ms) {
  uint64_t t0 = now_ms(), took = 0;
  for (;;) {
    gma_stats_t s = stats_of(g);
    if (s.reserved.current <= bytes && !took) took = now_ms() - t0;
    if ((took && any_trim(s)) || now_ms() - t0 >= limit_ms) break;
    sleep_us(2000);
  }
  return took ? took : now_ms() - t0;
}

static void timed_trim_to_threshold(void) {
  gma_t *g = sim_allocator("trim_interval_ms:200,release_threshold:8M,idle_ms:3600000");
  void *p[10];
  for (int i = 0; i < 10; i++) CHECK_OK(gma_alloc(g, 30 * MiB, NULL, &p[i])); /* a burst */
  for (int i = 0; i < 10; i++) CHECK_OK(gma_free(g, p[i]));
  CHECK(stats_of(g).reserved.current == 300 * MiB);
  uint64_t took = wait_reserved_at_most(g, 8 * MiB, 5000);
  gma_stats_t s = stats_of(g);
  printf("timed trim: reserved 300 MiB -> %.1f MiB in %llu ms (interval 200 ms)\n",
         (double)s.reserved.current / MiB, (unsigned long long)took);
  CHECK(s.reserved.current <= 8 * MiB);
  CHECK(took <= 2 * 200 + 250); /* two intervals, plus scheduling slack on a busy machine */
  CHECK(s.trims_timed >= 1 && s.bytes_trimmed >= 292 * MiB && s.worker_wakeups >= 1);
  CHECK(s.trims_explicit == 0);
  CHECK_OK(gma_destroy(g));
}

static void idle_segments_released(void) {
  gma_t *g = sim_allocator("trim_interval_ms:50,release_threshold:1G,idle_ms:150");
  void *p;
  CHECK_OK(gma_alloc(g, 30 * MiB, NULL, &p));
  CHECK_OK(gma_free(g, p));
  sleep_us(100 * 1000);
  CHECK(stats_of(g).reserved.current == 30 * MiB); /* not idle long enough yet */
  wait_reserved_at_most(g, 0, 5000);
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current == 0 && s.trims_idle >= 1);
  CHECK_OK(gma_destroy(g));
}

typedef struct seen {
  atomic_int calls;
  atomic_int last;
} seen_t;

static void on_pressure(gma_t *g, gma_pressure_t level, void *user) {
  seen_t *seen = user;
  gma_stats_t s = GMA_STATS_INIT;
  CHECK_OK(gma_stats(g, &s)); /* the callback may call gma */
  atomic_store(&seen->last, (int)level);
  atomic_fetch_add(&seen->calls, 1);
}

static void wait_level(seen_t *seen, int level) {
  for (int i = 0; i < 2500 && atomic_load(&seen->last) != level; i++) sleep_us(2000);
  CHECK(atomic_load(&seen->last) == level);
}

static void pressure_levels(void) {
  gma_t *g = sim_allocator("memory_limit:100M,trim_interval_ms:20,release_threshold:64M,"
                           "idle_ms:3600000");
  seen_t seen = {0, -1};
  CHECK_OK(gma_set_pressure_callback(g, on_pressure, &seen));
  wait_level(&seen, GMA_PRESSURE_LOW);
  void *live, *cached;
  CHECK_OK(gma_alloc(g, 60 * MiB, NULL, &live));
  CHECK_OK(gma_alloc(g, 24 * MiB, NULL, &cached)); /* 84 MiB reserved: above 80% */
  CHECK_OK(gma_free(g, cached));
  /* High pressure keeps a quarter of the 64 MiB threshold: the 24 MiB cached
   * segment goes, and pressure falls to medium (60%). */
  wait_reserved_at_most(g, 60 * MiB, 5000);
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current == 60 * MiB && s.trims_pressure >= 1);
  wait_level(&seen, GMA_PRESSURE_MEDIUM);
  CHECK_OK(gma_free(g, live));
  CHECK_OK(gma_trim(g, 0));
  wait_level(&seen, GMA_PRESSURE_LOW);
  CHECK(atomic_load(&seen.calls) >= 3 && stats_of(g).pressure_level == GMA_PRESSURE_LOW);
  CHECK_OK(gma_set_pressure_callback(g, NULL, NULL));
  CHECK_OK(gma_destroy(g));
}

static void grow_ahead_serves_callers(void) {
  gma_t *g = sim_allocator("grow_ahead:64M,trim_interval_ms:20,release_threshold:1G,"
                           "idle_ms:3600000");
  for (int i = 0; i < 2500 && stats_of(g).free_bytes < 64 * MiB; i++) sleep_us(2000);
  gma_stats_t s = stats_of(g);
  CHECK(s.free_bytes >= 64 * MiB && s.grows_worker >= 1);
  void *p[3];
  for (int i = 0; i < 3; i++) CHECK_OK(gma_alloc(g, 12 * MiB, NULL, &p[i]));
  s = stats_of(g);
  CHECK(s.grows_inline == 0 && s.hits_pool == 3); /* the callers never grew the pool */
  for (int i = 0; i < 3; i++) CHECK_OK(gma_free(g, p[i]));
  CHECK_OK(gma_destroy(g));
}

static void worker_off(void) {
  gma_t *g = sim_allocator("worker:off,trim_interval_ms:10");
  CHECK_ST(gma_set_pressure_callback(g, on_pressure, NULL), GMA_ERR_UNSUPPORTED);
  sleep_us(50 * 1000);
  CHECK(stats_of(g).worker_wakeups == 0);
  CHECK_OK(gma_destroy(g));
}

int main(void) {
  timed_trim_to_threshold();
  idle_segments_released();
  pressure_levels();
  grow_ahead_serves_callers();
  worker_off();
  printf("test_worker: ok\n");
  return 0;
}
