/* gma on the CUDA backend, through the public API (plus drv.h to put data
 * into blocks and read it back): device count and selection; allocation and
 * free on the default stream and on gma's streams, with every block filled
 * and read back on its stream; reuse on the same stream without a new device
 * allocation; gma_record_stream across streams (a block read by a second
 * stream is not overwritten before that read); double free, foreign and
 * interior pointers; statistics and their equation; memory_limit OOM and
 * recovery; the OOM-while-busy case (the only memory that fits is freed
 * memory a held stream still uses: gma_alloc waits for it, with and without
 * gma_record_stream, and a real shortage still fails at once); batches and
 * async futures; gma_empty_cache giving every byte back
 * to the driver; gma_sim_launch refused; the calling thread's context left as
 * it was. All of it with expandable_segments false and true. On the fake
 * driver, the driver's own byte counter must equal gma's reserved bytes, and
 * be 0 after gma_destroy. Skips (77) without a CUDA device. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "drv.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* With no call in flight, the statistics are exact and balance. On the fake
 * driver, the memory gma holds is exactly what the driver has handed out. */
static void check_balanced(gma_t *g) {
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current ==
        s.allocated.current + s.stream_cached_bytes + s.pending_bytes + s.free_bytes);
  CHECK(s.cached.current == s.reserved.current - s.allocated.current);
  uint64_t used = drv_fake_used();
  CHECK(used == UINT64_MAX || used == s.reserved.current);
}

static void noop_kernel(void *arg) { (void)arg; }

static void test_devices(void) {
  int n = 0;
  CHECK_OK(gma_device_count(&n));
  CHECK(n >= 1);
  int d = -1;
  CHECK_OK(gma_select_device(1 * MiB, &d));
  CHECK(d >= 0 && d < n);
  CHECK_ST(gma_select_device(SIZE_MAX / 2, &d), GMA_ERR_OOM);
  CHECK(strstr(gma_last_error(), "bytes free") != NULL);
  CHECK_ST(gma_device_count(NULL), GMA_ERR_INVALID_ARGUMENT);
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_CUDA;
  c.ignore_env = 1;
  c.device_ordinal = n; /* one past the last */
  gma_t *g = NULL;
  CHECK_ST(gma_create(&c, &g), GMA_ERR_NO_DEVICE);
  CHECK(g == NULL && strstr(gma_last_error(), "does not exist") != NULL);
}

static void test_alloc_free(gma_t *g, gma_stream_t s1, gma_stream_t s2) {
  const size_t sizes[] = {512, 4 * KiB, 100000, 1 * MiB, 3 * MiB, 12 * MiB};
  gma_stream_t streams[] = {NULL, s1, s2};
  uint32_t v = 0x11000000u;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    for (size_t k = 0; k < 3; k++) {
      void *p = NULL;
      CHECK_OK(gma_alloc(g, sizes[i], streams[k], &p));
      CHECK(p != NULL && (uintptr_t)p % 256 == 0);
      fill_and_check(p, (sizes[i] + 511) / 512 * 512, ++v, streams[k]);
      CHECK_OK(gma_free(g, p));
    }
  }
  /* A block freed on a stream is reused on it without a device allocation. */
  void *p, *q;
  CHECK_OK(gma_alloc(g, 1 * MiB, s1, &p));
  CHECK_OK(gma_free(g, p));
  uint64_t dev_allocs = stats_of(g).num_device_allocs;
  CHECK_OK(gma_alloc(g, 1 * MiB, s1, &q));
  CHECK(stats_of(g).num_device_allocs == dev_allocs);
  fill_and_check(q, 1 * MiB, 0xabcdef01u, s1);
  CHECK_OK(gma_free(g, q));
  CHECK(drv_current() == drv.ctx); /* gma left this thread's context alone */
}

/* A block used by s2 too, freed on s1: neither stream's next allocations
 * may overwrite it before s2's read of it has run. The read goes to pinned
 * memory (asynchronous on a GPU) and s2 is held busy (cuStreamWaitValue32)
 * until the next allocations' fills are queued, so the read has surely not
 * run when the block is freed and handed out again. */
static void test_record_stream(gma_t *g, gma_stream_t s1, gma_stream_t s2) {
  const size_t n = 2 * MiB;
  uint32_t *h = drv_pinned(n);
  volatile uint32_t *flag = drv_pinned(64);
  *flag = 0;
  for (uint32_t round = 0; round < 8; round++) {
    void *p;
    CHECK_OK(gma_alloc(g, n, s1, &p));
    drv_memset32(p, 0x5eed0000u + round, n, s1);
    drv_order(s2, s1);
    bool held = drv_hold(s2, flag, round + 1);
    drv_to_host(h, p, n, s2);
    CHECK_OK(gma_record_stream(g, p, s2));
    CHECK_OK(gma_record_stream(g, p, s1)); /* its own stream: nothing to add */
    CHECK_OK(gma_free(g, p));
    void *q1, *q2;
    CHECK_OK(gma_alloc(g, n, s1, &q1));
    drv_memset32(q1, 0xdead0000u, n, s1);
    CHECK_OK(gma_alloc(g, n, s2, &q2));
    drv_memset32(q2, 0xbeef0000u, n, s2);
    if (held) drv_release(flag, round + 1);
    drv_sync(s1);
    drv_sync(s2);
    for (size_t i = 0; i < n / 4; i++) CHECK(h[i] == 0x5eed0000u + round);
    CHECK_OK(gma_free(g, q1));
    CHECK_OK(gma_free(g, q2));
  }
  drv_pinned_free((void *)flag);
  drv_pinned_free(h);
}

static void test_bad_pointers(gma_t *g, gma_stream_t s1) {
  void *p;
  CHECK_OK(gma_alloc(g, 64 * KiB, s1, &p));
  int local = 0;
  CHECK_ST(gma_free(g, &local), GMA_ERR_INVALID_POINTER);
  CHECK_ST(gma_free(g, (char *)p + 512), GMA_ERR_INVALID_POINTER);
  CHECK(strstr(gma_last_error(), "interior") != NULL);
  CHECK_ST(gma_record_stream(g, &local, s1), GMA_ERR_INVALID_POINTER);
  CHECK_OK(gma_free(g, p));
  CHECK_ST(gma_free(g, p), GMA_ERR_DOUBLE_FREE);
  CHECK_ST(gma_alloc(g, 0, s1, &p), GMA_ERR_INVALID_SIZE);
  CHECK_ST(gma_alloc(g, SIZE_MAX / 4, s1, &p), GMA_ERR_INVALID_SIZE);
  CHECK_ST(gma_sim_launch(g, s1, noop_kernel, NULL), GMA_ERR_UNSUPPORTED);
}

static void test_stats(gma_t *g, gma_stream_t s1) {
  gma_stats_t before = stats_of(g);
  void *p;
  CHECK_OK(gma_alloc(g, 1000, s1, &p));
  gma_stats_t s = stats_of(g);
  CHECK(s.allocated.current == before.allocated.current + 1024);
  CHECK(s.requested.current == before.requested.current + 1000);
  CHECK(s.num_allocs == before.num_allocs + 1);
  CHECK(s.reserved.current >= s.allocated.current && s.num_segments >= 1);
  check_balanced(g);
  gma_stream_stats_t ss = GMA_STREAM_STATS_INIT;
  CHECK_OK(gma_stream_stats(g, s1, &ss));
  CHECK(ss.allocated_bytes >= 1024);
  CHECK_OK(gma_free(g, p));
  CHECK(stats_of(g).num_frees == before.num_frees + 1);
  check_balanced(g);
}

static void test_batch_async(gma_t *g, gma_stream_t s1) {
  size_t sizes[5] = {512, 3000, 64 * KiB, 1 * MiB, 5 * MiB};
  void *ptrs[5] = {0};
  CHECK_OK(gma_alloc_batch(g, 5, sizes, s1, ptrs));
  /* Each block is device memory for its whole rounded size (the driver
   * refuses a fill that leaves device memory). */
  for (int i = 0; i < 5; i++) {
    CHECK(ptrs[i] && (uintptr_t)ptrs[i] % 256 == 0);
    drv_memset32(ptrs[i], 0xba000000u + (uint32_t)i, (sizes[i] + 511) / 512 * 512, s1);
  }
  for (int i = 0; i < 5; i++)
    fill_and_check(ptrs[i], sizes[i] / 4 * 4, 0xbb000000u + (uint32_t)i, s1);
  for (int i = 0; i < 5; i++) CHECK_OK(gma_free(g, ptrs[i]));

  /* Futures: one the worker serves (above bin_max), a batch. */
  gma_future_t *f;
  void *q = NULL;
  CHECK_OK(gma_alloc_async(g, 8 * MiB, s1, NULL, &f));
  CHECK_OK(gma_future_wait(f, UINT64_MAX, &q));
  CHECK(q != NULL);
  CHECK_OK(gma_future_release(f));
  fill_and_check(q, 8 * MiB, 0xf0f0f0f0u, s1);
  CHECK_OK(gma_free(g, q));
  void *bp[3] = {0};
  size_t bs[3] = {256 * KiB, 2 * MiB, 6 * MiB};
  CHECK_OK(gma_alloc_batch_async(g, 3, bs, s1, bp, NULL, &f));
  CHECK_OK(gma_future_wait(f, UINT64_MAX, NULL));
  CHECK_OK(gma_future_release(f));
  for (int i = 0; i < 3; i++) fill_and_check(bp[i], bs[i], 0xc0000000u + (uint32_t)i, s1);
  for (int i = 0; i < 3; i++) CHECK_OK(gma_free(g, bp[i]));
  CHECK_ST(gma_alloc_async(g, 4096, GMA_STREAM_PER_THREAD, NULL, &f), GMA_ERR_INVALID_ARGUMENT);
}

/* After everything is freed and the streams are idle, gma_empty_cache gives
 * every segment back (it never waits for the device, so the epochs' events
 * may need a moment to be seen complete). */
static void test_empty_cache(gma_t *g, gma_stream_t s1, gma_stream_t s2) {
  CHECK_OK(gma_stream_synchronize(g, s1));
  CHECK_OK(gma_stream_synchronize(g, s2));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  gma_stats_t s = stats_of(g);
  CHECK(s.allocated.current == 0 && s.reserved.current > 0);
  for (int i = 0; i < 500 && stats_of(g).reserved.current > 0; i++) {
    CHECK_OK(gma_empty_cache(g));
    if (stats_of(g).reserved.current > 0) sleep_ms(2);
  }
  s = stats_of(g);
  CHECK(s.reserved.current == 0 && s.bytes_trimmed > 0 && s.num_device_frees > 0);
  uint64_t used = drv_fake_used();
  CHECK(used == UINT64_MAX || used == 0);
}

/* memory_limit makes OOM reachable on any device; after frees it recovers. */
static void test_limit(const char *conf) {
  char c[128];
  snprintf(c, sizeof c, "%s,memory_limit:64M", conf);
  gma_t *g = drv_cuda_allocator(c);
  void *p[8];
  int n = 0;
  gma_status_t st = GMA_OK;
  while (n < 8 && (st = gma_alloc(g, 16 * MiB, NULL, &p[n])) == GMA_OK) n++;
  CHECK(st == GMA_ERR_OOM && n >= 3);
  CHECK(strstr(gma_last_error(), "memory_limit") != NULL);
  CHECK(stats_of(g).num_ooms >= 1);
  for (int i = 0; i < n; i++) CHECK_OK(gma_free(g, p[i]));
  CHECK_OK(gma_alloc(g, 16 * MiB, NULL, &p[0]));
  fill_and_check(p[0], 16 * MiB, 0x77777777u, NULL);
  CHECK_OK(gma_free(g, p[0]));
  CHECK_OK(gma_destroy(g));
}

/* Lets a held stream go after ms milliseconds, from another thread (the
 * test's own thread is inside gma_alloc, waiting for that stream). */
typedef struct releaser {
  volatile uint32_t *flag;
  uint32_t value;
  long ms;
} releaser_t;
static void *release_later(void *arg) {
  releaser_t *r = arg;
  sleep_ms(r->ms);
  drv_release(r->flag, r->value);
  return NULL;
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Under memory_limit:64M, 48 MiB is freed while a held stream still writes
 * it (round 0: its own stream; round 1: a second stream named by
 * gma_record_stream). A 48 MiB request on the other stream has no other
 * memory: it must wait for the held work (released 200 ms later from
 * another thread) and succeed, never OOM, and never get the block before the
 * held write has run (the new owner's fill is read back intact after both
 * streams finished). Then a real
 * shortage (48 MiB live, 48 MiB more asked) fails at once with a message
 * naming the limit. */
static void test_oom_busy(const char *conf) {
  char c[160];
  snprintf(c, sizeof c, "%s,memory_limit:64M", conf);
  gma_t *g = drv_cuda_allocator(c);
  gma_stream_t a, b;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &b));
  volatile uint32_t *flag = drv_pinned(64);
  *flag = 0;
  const size_t n = 48 * MiB;
  for (uint32_t round = 0; round < 2; round++) {
    gma_stream_t busy = round ? b : a, other = round ? a : b;
    void *p, *q;
    CHECK_OK(gma_alloc(g, n, a, &p));
    if (round) drv_order(b, a);
    bool held = drv_hold(busy, flag, round + 1);
    drv_memset32(p, 0xb0b00000u + round, n, busy);
    if (round) CHECK_OK(gma_record_stream(g, p, b));
    CHECK_OK(gma_free(g, p));
    pthread_t t;
    releaser_t r = {flag, round + 1, 200};
    if (held) CHECK(pthread_create(&t, NULL, release_later, &r) == 0);
    uint64_t t0 = now_ms();
    gma_status_t st = gma_alloc(g, n, other, &q);
    uint64_t waited = now_ms() - t0;
    if (st != GMA_OK) fprintf(stderr, "oom-while-busy (%s, round %u): %s\n", conf, round, gma_last_error());
    CHECK(st == GMA_OK);
    /* Round 0: the block is cached on a, and b may have it only once a's
     * held work is done: a host-side wait (reuse:wait orders b after it on
     * the device instead). Round 1: a, the owner, may also take it back
     * behind a device-side wait on b. Either way the held write must land
     * before the new owner's fill: read back after everything ran. */
    if (held && round == 0 && !strstr(conf, "reuse:wait")) CHECK(waited >= 150);
    uint32_t v = 0x0c0c0000u + round;
    drv_memset32(q, v, n, other);
    if (held) CHECK(pthread_join(t, NULL) == 0);
    drv_sync(a);
    drv_sync(b);
    uint32_t *h = drv_pinned(n);
    drv_to_host(h, q, n, other);
    drv_sync(other);
    size_t bad = 0;
    for (size_t i = 0; i < n / 4; i++) bad += h[i] != v;
    CHECK(bad == 0);
    drv_pinned_free(h);
    CHECK_OK(gma_free(g, q));
    if (!held) printf("oom-while-busy: the driver cannot hold a stream: not exercised\n");
  }
  gma_stats_t s = stats_of(g);
  CHECK(s.num_ooms == 0);
  /* A real shortage: no device work to wait for, so it fails at once. */
  void *p, *q;
  CHECK_OK(gma_alloc(g, n, a, &p));
  uint64_t t0 = now_ms();
  CHECK(gma_alloc(g, n, b, &q) == GMA_ERR_OOM);
  CHECK(now_ms() - t0 < 5000);
  CHECK(strstr(gma_last_error(), "memory_limit") != NULL);
  CHECK(stats_of(g).num_ooms == 1);
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK_OK(gma_stream_synchronize(g, b));
  drv_pinned_free((void *)flag);
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_destroy(g));
}

static void run(const char *conf) {
  gma_t *g = drv_cuda_allocator(conf);
  CHECK(strcmp(gma_device_name(g), "cuda") == 0);
  gma_stream_t s1, s2;
  CHECK_OK(gma_stream_create(g, &s1));
  CHECK_OK(gma_stream_create(g, &s2));
  test_alloc_free(g, s1, s2);
  test_record_stream(g, s1, s2);
  test_bad_pointers(g, s1);
  test_stats(g, s1);
  test_batch_async(g, s1);
  test_empty_cache(g, s1, s2);
  CHECK_OK(gma_stream_destroy(g, s1));
  CHECK_OK(gma_stream_destroy(g, s2));
  CHECK_OK(gma_destroy(g));
  uint64_t used = drv_fake_used();
  CHECK(used == UINT64_MAX || used == 0);
  test_limit(conf);
  test_oom_busy(conf);
  CHECK(drv_current() == drv.ctx);
  printf("gpu api (%s): ok\n", conf);
}

int main(void) {
  gma_t *probe = drv_cuda_allocator(NULL); /* skips without a CUDA device */
  CHECK_OK(gma_destroy(probe));
  drv_open();
  drv_bind_thread();
  test_devices();
  run("expandable_segments:false");
  run("expandable_segments:true");
  test_oom_busy("reuse:wait");
  return 0;
}
