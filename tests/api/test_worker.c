/* The worker thread: timed trimming brings reserved memory down to the
 * release threshold within two trim intervals with no caller involved; idle
 * segments go back after idle_ms; memory pressure makes trimming harder and
 * is reported to a callback; grow_ahead keeps free memory ready so callers do
 * not grow the pool themselves; worker:off has no thread. The default policy
 * ("auto") never takes a working set: memory a loop uses every iteration is
 * not idle however often a tick finds it free, and outside pressure takes
 * only memory the last ticks did not use; release_threshold:0 keeps nothing;
 * memory freed behind device work becomes free when the work completes,
 * without a caller's poll. Public API only. */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "simkit.h"

#define MiB ((size_t)1 << 20)

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Each test's allocator and one stream of its own: the worker closes the
 * epochs of the streams that hold freed memory by recording events there,
 * which it never does on the legacy default stream (test_worker_streams). */
static gma_stream_t S;
static gma_t *worker_g(const char *conf) {
  gma_t *g = sim_allocator_ordinary(conf);
  CHECK_OK(gma_stream_create(g, &S));
  return g;
}
static void done_g(gma_t *g) {
  CHECK_OK(gma_stream_destroy(g, S));
  CHECK_OK(gma_destroy(g));
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
  gma_t *g = worker_g("trim_interval_ms:200,release_threshold:8M,idle_ms:3600000");
  void *p[10];
  for (int i = 0; i < 10; i++) CHECK_OK(gma_alloc(g, 30 * MiB, S, &p[i])); /* a burst */
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
  done_g(g);
}

static void idle_segments_released(void) {
  gma_t *g = worker_g("trim_interval_ms:50,release_threshold:1G,idle_ms:150");
  void *p;
  CHECK_OK(gma_alloc(g, 30 * MiB, S, &p));
  CHECK_OK(gma_free(g, p));
  sleep_us(100 * 1000);
  CHECK(stats_of(g).reserved.current == 30 * MiB); /* not idle long enough yet */
  wait_reserved_at_most(g, 0, 5000);
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current == 0 && s.trims_idle >= 1);
  done_g(g);
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
  gma_t *g = worker_g("memory_limit:100M,trim_interval_ms:20,release_threshold:64M,"
                           "idle_ms:3600000");
  seen_t seen = {0, -1};
  CHECK_OK(gma_set_pressure_callback(g, on_pressure, &seen));
  wait_level(&seen, GMA_PRESSURE_LOW);
  void *live, *cached;
  CHECK_OK(gma_alloc(g, 60 * MiB, S, &live));
  CHECK_OK(gma_alloc(g, 24 * MiB, S, &cached)); /* 84 MiB reserved: above 80% */
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
  done_g(g);
}

static void grow_ahead_serves_callers(void) {
  gma_t *g = worker_g("grow_ahead:64M,trim_interval_ms:20,release_threshold:1G,"
                           "idle_ms:3600000");
  for (int i = 0; i < 2500 && stats_of(g).free_bytes < 64 * MiB; i++) sleep_us(2000);
  gma_stats_t s = stats_of(g);
  CHECK(s.free_bytes >= 64 * MiB && s.grows_worker >= 1);
  void *p[3];
  for (int i = 0; i < 3; i++) CHECK_OK(gma_alloc(g, 12 * MiB, S, &p[i]));
  s = stats_of(g);
  CHECK(s.grows_inline == 0 && s.hits_pool == 3); /* the callers never grew the pool */
  for (int i = 0; i < 3; i++) CHECK_OK(gma_free(g, p[i]));
  done_g(g);
}

/* A loop whose working set (300 MiB, above what the old fixed threshold of
 * 256 MiB kept) is freed between iterations: the default trim policy must
 * never give it back, so no iteration after the first allocates. */
static void working_set_kept(void) {
  gma_t *g = worker_g("trim_interval_ms:10");
  size_t sizes[] = {100 * MiB, 96 * MiB, 64 * MiB, 40 * MiB, 64 << 10, 4096};
  enum { N = sizeof sizes / sizeof sizes[0] };
  uint64_t after_first = 0;
  for (int it = 0; it < 40; it++) {
    void *p[N];
    for (int i = 0; i < N; i++) CHECK_OK(gma_alloc(g, sizes[i], S, &p[i]));
    for (int i = 0; i < N; i++) CHECK_OK(gma_free(g, p[i]));
    if (it == 0) after_first = stats_of(g).num_device_allocs;
    sleep_us(5000); /* ticks find the whole working set free */
  }
  gma_stats_t s = stats_of(g);
  printf("working set: %llu device allocations after the first iteration, %llu bytes trimmed, "
         "%llu wake-ups\n", (unsigned long long)(s.num_device_allocs - after_first),
         (unsigned long long)s.bytes_trimmed, (unsigned long long)s.worker_wakeups);
  CHECK(s.num_device_allocs == after_first && s.bytes_trimmed == 0);
  CHECK(s.worker_wakeups >= 10); /* the ticks did run */
  done_g(g);
}

/* A segment handed out every 5 ms is never idle, even when every tick finds
 * it free (its clock used to start at the first tick that saw it free and
 * never restart, so idle_ms later the working set went back). */
static void idle_clock_restarts_on_use(void) {
  gma_t *g = worker_g("trim_interval_ms:10,idle_ms:60,release_threshold:1G");
  for (int it = 0; it < 60; it++) {
    void *p;
    CHECK_OK(gma_alloc(g, 16 * MiB, S, &p));
    CHECK_OK(gma_free(g, p));
    sleep_us(5000);
  }
  gma_stats_t s = stats_of(g);
  CHECK(s.num_device_allocs == 1 && s.bytes_trimmed == 0 && s.trims_idle == 0);
  wait_reserved_at_most(g, 0, 5000); /* once unused, it does go after idle_ms */
  s = stats_of(g);
  CHECK(s.reserved.current == 0 && s.trims_idle >= 1);
  done_g(g);
}

/* release_threshold:0 keeps nothing; "auto" is the default; both parse. */
static void release_threshold_zero_keeps_nothing(void) {
  gma_config_t c = GMA_CONFIG_INIT;
  CHECK_OK(gma_config_parse(&c, "release_threshold:0"));
  CHECK(c.release_threshold == GMA_RELEASE_ALL);
  CHECK_OK(gma_config_parse(&c, "release_threshold:auto"));
  CHECK(c.release_threshold == 0);
  CHECK_OK(gma_config_parse(&c, "release_threshold:64M"));
  CHECK(c.release_threshold == 64 * MiB);
  CHECK_ST(gma_config_parse(&c, "release_threshold:some"), GMA_ERR_CONFIG);
  CHECK(strstr(gma_last_error(), "auto, 0 (keep nothing)") != NULL);
  CHECK_ST(gma_config_parse(&c, "release_threshold:100"), GMA_ERR_CONFIG); /* below 512 */
  gma_t *g = worker_g("trim_interval_ms:20,release_threshold:0,idle_ms:3600000");
  void *p[3];
  for (int i = 0; i < 3; i++) CHECK_OK(gma_alloc(g, (size_t)(i + 1) * 12 * MiB, S, &p[i]));
  for (int i = 0; i < 3; i++) CHECK_OK(gma_free(g, p[i]));
  wait_reserved_at_most(g, 0, 5000);
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current == 0 && s.trims_timed >= 1 && s.bytes_trimmed == 72 * MiB);
  done_g(g);
}

/* The device's free memory is short (above 80% in use): by default the
 * worker gives back memory the last ticks did not use, up to the shortfall,
 * and never the working set. 96 MiB device: 40 MiB live, a 24 MiB buffer
 * used every iteration, 16 MiB cached and never used again: 83% in use. */
static void outside_pressure_takes_only_unused(void) {
  gma_t *g = worker_g("sim_capacity:96M,trim_interval_ms:10,idle_ms:3600000");
  void *live, *old, *ws;
  CHECK_OK(gma_alloc(g, 40 * MiB, S, &live));
  CHECK_OK(gma_alloc(g, 16 * MiB, S, &old));
  CHECK_OK(gma_alloc(g, 24 * MiB, S, &ws));
  CHECK_OK(gma_free(g, ws));
  CHECK_OK(gma_free(g, old));
  CHECK(stats_of(g).reserved.current == 80 * MiB);
  uint64_t t0 = now_ms();
  while (stats_of(g).reserved.current > 64 * MiB && now_ms() - t0 < 5000) {
    CHECK_OK(gma_alloc(g, 24 * MiB, S, &ws)); /* the working set, in use every 2 ms */
    CHECK_OK(gma_free(g, ws));
    sleep_us(2000);
  }
  for (int it = 0; it < 20; it++) { /* and it stays: pressure is medium now */
    CHECK_OK(gma_alloc(g, 24 * MiB, S, &ws));
    CHECK_OK(gma_free(g, ws));
    sleep_us(2000);
  }
  gma_stats_t s = stats_of(g);
  printf("outside pressure: reserved 80 -> %.0f MiB, %llu device allocations\n",
         (double)s.reserved.current / MiB, (unsigned long long)s.num_device_allocs);
  CHECK(s.reserved.current == 64 * MiB && s.bytes_trimmed == 16 * MiB);
  CHECK(s.num_device_allocs == 3 && s.trims_pressure >= 1 && s.trims_timed >= 1);
  CHECK_OK(gma_free(g, live));
  done_g(g);
}

static void kernel_sleep(void *arg) { sleep_us((long)(intptr_t)arg); }

/* Freed memory gated by another stream's work (record_stream) becomes free
 * when that work completes, and the statistics say so, with no gma call in
 * between: the worker looks while freed memory waits, from the free on,
 * not from its next tick (the default 1 s here: it used to wait for it). */
static void pending_settles_without_a_call(void) {
  gma_t *g = worker_g(NULL);
  gma_stream_t a, b;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &b));
  void *p;
  CHECK_OK(gma_alloc(g, 8 * MiB, a, &p));
  CHECK_OK(gma_record_stream(g, p, b));
  CHECK_OK(gma_sim_launch(g, b, kernel_sleep, (void *)(intptr_t)30000));
  CHECK_OK(gma_free(g, p));
  CHECK(stats_of(g).pending_bytes == 8 * MiB);
  uint64_t t0 = now_ms();
  while (stats_of(g).pending_bytes && now_ms() - t0 < 5000) sleep_us(1000);
  gma_stats_t s = stats_of(g);
  printf("pending: free %llu ms after the free (the kernel ran 30 ms)\n",
         (unsigned long long)(now_ms() - t0));
  CHECK(s.pending_bytes == 0 && s.free_bytes + s.stream_cached_bytes >= 8 * MiB);
  CHECK(now_ms() - t0 < 30 + 10 + 400); /* the kernel, a 10 ms look, slack; the tick is 1 s */
  void *q;
  CHECK_OK(gma_alloc(g, 8 * MiB, b, &q)); /* reused on the other stream: no growth */
  CHECK(stats_of(g).num_device_allocs == 1);
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, b));
  done_g(g);
}

static void worker_off(void) {
  gma_t *g = worker_g("worker:off,trim_interval_ms:10");
  CHECK_ST(gma_set_pressure_callback(g, on_pressure, NULL), GMA_ERR_UNSUPPORTED);
  sleep_us(50 * 1000);
  CHECK(stats_of(g).worker_wakeups == 0);
  done_g(g);
}

int main(void) {
  timed_trim_to_threshold();
  idle_segments_released();
  pressure_levels();
  grow_ahead_serves_callers();
  worker_off();
  working_set_kept();
  idle_clock_restarts_on_use();
  release_threshold_zero_keeps_nothing();
  outside_pressure_takes_only_unused();
  pending_settles_without_a_call();
  printf("test_worker: ok\n");
  return 0;
}
