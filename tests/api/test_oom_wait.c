/* The OOM path waits before it fails (issue 14): when the only memory that
 * could serve a request is freed memory still used by device work, a
 * synchronous gma_alloc / gma_alloc_batch waits on the host for that work
 * (at most oom_wait_ms), releases what it gated and retries. Memory that is
 * genuinely exhausted still fails at once, and every OOM message names its
 * cause. num_ooms counts failed calls only. Public API only. */
#include <inttypes.h>
#include <pthread.h>
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

/* A kernel on `on` that uses p for hold_us, checking its pattern survives. */
static pattern_kernel_t *busy(gma_t *g, gma_stream_t on, void *p, long hold_us,
                              atomic_int *corruptions) {
  pattern_kernel_t *k = calloc(1, sizeof *k);
  *k = (pattern_kernel_t){.buf = p, .len = 1 * MiB, .value = 0x5a, .hold_us = hold_us,
                          .corruptions = corruptions};
  CHECK_OK(gma_sim_launch(g, on, pattern_kernel_run, k));
  pattern_kernel_wait_started(k);
  return k;
}

/* size bytes allocated on `on`, a kernel there using them for hold_us,
 * then freed: memory cached behind device work. */
static pattern_kernel_t *busy_freed(gma_t *g, gma_stream_t on, size_t size, long hold_us,
                                    atomic_int *corruptions) {
  void *p;
  CHECK_OK(gma_alloc(g, size, on, &p));
  pattern_kernel_t *k = busy(g, on, p, hold_us, corruptions);
  CHECK_OK(gma_free(g, p));
  return k;
}

/* The case: 48 MiB on A under a 64 MiB limit, A runs a 200 ms
 * kernel on it, the block is freed, then B asks for 48 MiB. */
static void busy_own_stream(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:64M,worker:off");
  gma_stream_t a, b;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &b));
  atomic_int corruptions = 0;
  void *q;
  pattern_kernel_t *k = busy_freed(g, a, 48 * MiB, 200000, &corruptions);
  uint64_t t0 = now_ms();
  CHECK_OK(gma_alloc(g, 48 * MiB, b, &q)); /* before: GMA_ERR_OOM */
  uint64_t waited = now_ms() - t0;
  CHECK(waited >= 100); /* it really waited for the kernel */
  CHECK(atomic_load(&k->started) && atomic_load(&corruptions) == 0);
  gma_stats_t s = stats_of(g);
  CHECK(s.num_oom_waits >= 1 && s.num_ooms == 0);
  memset(q, 1, 48 * MiB); /* the kernel is done with it */
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK(atomic_load(&corruptions) == 0);
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_destroy(g));
  free(k);
}

/* The same with the work on another stream, named by gma_record_stream:
 * the block is pending on that stream's work; a batch has to wait too. */
static void busy_record_stream(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:64M,worker:off");
  gma_stream_t a, b, c;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &b));
  CHECK_OK(gma_stream_create(g, &c));
  atomic_int corruptions = 0;
  void *p;
  CHECK_OK(gma_alloc(g, 48 * MiB, a, &p));
  pattern_kernel_t *k = busy(g, b, p, 200000, &corruptions);
  CHECK_OK(gma_record_stream(g, p, b));
  CHECK_OK(gma_free(g, p));
  CHECK(stats_of(g).pending_bytes == 48 * MiB);
  void *ptrs[2];
  CHECK_OK(gma_alloc_batch(g, 2, (size_t[]){24 * MiB, 24 * MiB}, c, ptrs));
  CHECK(atomic_load(&corruptions) == 0);
  memset(ptrs[0], 1, 24 * MiB);
  memset(ptrs[1], 1, 24 * MiB);
  CHECK_OK(gma_stream_synchronize(g, b));
  CHECK(atomic_load(&corruptions) == 0);
  CHECK(stats_of(g).num_ooms == 0);
  CHECK_OK(gma_free(g, ptrs[0]));
  CHECK_OK(gma_free(g, ptrs[1]));
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_stream_destroy(g, c));
  CHECK_OK(gma_destroy(g));
  free(k);
}

/* Memory that is genuinely exhausted: no wait, a prompt failure that says
 * it is a real shortage, with the live bytes when the call looked (the
 * cause is the one the wait decided on: a guess from the figures at the end
 * once blamed device work and oom_wait_ms, when two threads took the last
 * memory while a third waited and then freed it under running kernels);
 * counted once. */
static void real_shortage(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:64M,worker:off");
  void *p, *q;
  CHECK_OK(gma_alloc(g, 48 * MiB, NULL, &p));
  uint64_t t0 = now_ms();
  CHECK_ST(gma_alloc(g, 48 * MiB, NULL, &q), GMA_ERR_OOM);
  CHECK(now_ms() - t0 < 2000); /* no device work to wait for: at once, even on a busy machine */
  CHECK(strstr(gma_last_error(), "a real shortage: live allocations held 50331648 bytes of "
                                 "memory_limit / device capacity 67108864 when this call "
                                 "looked") != NULL);
  CHECK(strstr(gma_last_error(), "raise memory_limit") != NULL);
  CHECK(strstr(gma_last_error(), "oom_wait_ms") == NULL);
  gma_stats_t s = stats_of(g);
  CHECK(s.num_ooms == 1 && s.num_oom_waits == 0);
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_destroy(g));
}

/* oom_wait_ms bounds the wait: work longer than it gives an OOM that says
 * memory is still in use by device work, not a shortage. */
static void bounded_wait(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:64M,worker:off,oom_wait_ms:20");
  gma_stream_t a;
  CHECK_OK(gma_stream_create(g, &a));
  atomic_int corruptions = 0;
  void *q;
  pattern_kernel_t *k = busy_freed(g, a, 48 * MiB, 400000, &corruptions);
  uint64_t t0 = now_ms();
  CHECK_ST(gma_alloc(g, 48 * MiB, NULL, &q), GMA_ERR_OOM);
  uint64_t waited = now_ms() - t0;
  CHECK(waited >= 15 && waited < 300);
  CHECK(strstr(gma_last_error(), "still in use by device work") != NULL);
  CHECK(strstr(gma_last_error(), "oom_wait_ms") != NULL);
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK(atomic_load(&corruptions) == 0);
  CHECK_OK(gma_alloc(g, 48 * MiB, NULL, &q)); /* done now */
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_destroy(g));
  free(k);
}

/* Free memory in pieces too small for the request, no room to grow: the
 * message says fragmentation, with the figures. */
static void fragmentation_message(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:40M,worker:off");
  void *p[6];
  for (int i = 0; i < 6; i++) CHECK_OK(gma_alloc(g, 6 * MiB, NULL, &p[i])); /* two 20 MiB segments */
  CHECK(stats_of(g).reserved.current == 40 * MiB);
  CHECK_OK(gma_free(g, p[1]));
  CHECK_OK(gma_free(g, p[4]));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  void *q;
  CHECK_ST(gma_alloc(g, 10 * MiB, NULL, &q), GMA_ERR_OOM);
  CHECK(strstr(gma_last_error(), "fragmentation") != NULL);
  CHECK(strstr(gma_last_error(), "largest free block is 6291456") != NULL);
  CHECK(strstr(gma_last_error(), "expandable_segments:true lets") != NULL);
  for (int i = 0; i < 6; i++)
    if (i != 1 && i != 4) CHECK_OK(gma_free(g, p[i]));
  CHECK_OK(gma_destroy(g));

  /* Growable segments coalesce already: the advice is not to turn them on.
   * Near the limit each growth maps what it lacks, one granule (2 MiB) per
   * chunk, so 1.5 MiB blocks lie across chunks; a freed one leaves a piece
   * that holds no whole chunk, so none of it can go back. */
  g = sim_allocator_ordinary("memory_limit:40M,worker:off,expandable_segments:true,sim_capacity:1G");
  void *r[26];
  for (int i = 0; i < 26; i++) CHECK_OK(gma_alloc(g, 3 * MiB / 2, NULL, &r[i]));
  for (int i = 1; i < 26; i += 3) CHECK_OK(gma_free(g, r[i]));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK_ST(gma_alloc(g, 8 * MiB, NULL, &q), GMA_ERR_OOM);
  CHECK(strstr(gma_last_error(), "fragmentation") != NULL);
  CHECK(strstr(gma_last_error(), "largest free block is 1572864") != NULL);
  CHECK(strstr(gma_last_error(), "expandable_segments:true") == NULL);
  CHECK(strstr(gma_last_error(), "smaller minimum chunk") != NULL);
  for (int i = 0; i < 26; i++)
    if (i % 3 != 1) CHECK_OK(gma_free(g, r[i]));
  CHECK_OK(gma_destroy(g));

  /* With 3 MiB blocks each freed one holds a whole chunk: those go back and
   * an 8 MiB request takes them at a new address. */
  g = sim_allocator_ordinary("memory_limit:40M,worker:off,expandable_segments:true,sim_capacity:1G");
  for (int i = 0; i < 13; i++) CHECK_OK(gma_alloc(g, 3 * MiB, NULL, &r[i]));
  for (int i = 1; i < 13; i += 3) CHECK_OK(gma_free(g, r[i]));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK_OK(gma_alloc(g, 8 * MiB, NULL, &q));
  CHECK(stats_of(g).reserved.current <= 40 * MiB);
  CHECK_OK(gma_free(g, q));
  for (int i = 0; i < 13; i++)
    if (i % 3 != 1) CHECK_OK(gma_free(g, r[i]));
  CHECK_OK(gma_destroy(g));
}

/* An async request that waits for memory and then gets it is not an OOM;
 * one that times out counts once (before: once per retry, hundreds). */
static void async_counts_once(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:64M");
  void *p;
  CHECK_OK(gma_alloc(g, 48 * MiB, NULL, &p));
  gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
  o.timeout_ns = 2000000000ull;
  gma_future_t *f;
  CHECK_OK(gma_alloc_async(g, 32 * MiB, NULL, &o, &f));
  sleep_us(100000); /* the worker retries every millisecond meanwhile */
  CHECK_OK(gma_free(g, p));
  void *q;
  CHECK_OK(gma_future_wait(f, UINT64_MAX, &q));
  CHECK_OK(gma_future_release(f));
  CHECK(stats_of(g).num_ooms == 0);
  o.timeout_ns = 50000000ull;
  CHECK_OK(gma_alloc_async(g, 48 * MiB, NULL, &o, &f));
  CHECK_ST(gma_future_wait(f, UINT64_MAX, &p), GMA_ERR_TIMEOUT);
  CHECK_OK(gma_future_release(f));
  CHECK(stats_of(g).num_ooms == 1);
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_destroy(g));
}

/* The wait drops the pool lock: while one thread waits for device work,
 * other threads' locked calls go on (before: they all waited with it), and
 * a kernel that itself waits for such a call to return is no deadlock. */
typedef struct waiter_arg {
  gma_t *g;
  gma_stream_t s;
  gma_status_t st;
  uint64_t ms;
} waiter_arg_t;

static void *oom_waiter(void *arg) {
  waiter_arg_t *w = arg;
  void *q = NULL;
  uint64_t t0 = now_ms();
  w->st = gma_alloc(w->g, 48 * MiB, w->s, &q);
  w->ms = now_ms() - t0;
  if (w->st == GMA_OK) CHECK_OK(gma_free(w->g, q));
  return NULL;
}

static void others_go_on(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:80M,worker:off"); /* 20 MiB segment + 48 MiB */
  gma_stream_t a, b;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &b));
  atomic_int corruptions = 0, gate = 0;
  void *p, *small;
  CHECK_OK(gma_alloc(g, 8 * MiB, NULL, &small)); /* freed later: a slow-path free */
  CHECK_OK(gma_alloc(g, 48 * MiB, a, &p));
  /* The kernel holds p until the host opens its gate, which it does only
   * after the slow-path free below returned. */
  pattern_kernel_t k = {.buf = p, .len = 1 * MiB, .value = 7, .gate = &gate,
                        .corruptions = &corruptions};
  CHECK_OK(gma_sim_launch(g, a, pattern_kernel_run, &k));
  pattern_kernel_wait_started(&k);
  CHECK_OK(gma_free(g, p));
  waiter_arg_t w = {g, b, GMA_PENDING, 0};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, oom_waiter, &w) == 0);
  /* Until the waiter is in its wait (10 s at most, on a busy machine). */
  for (int i = 0; i < 10000 && stats_of(g).num_oom_waits == 0; i++) sleep_us(1000);
  gma_stats_t s = stats_of(g);
  CHECK(s.num_oom_waits == 1);
  /* Not held up by the waiter, whose wait ends only when the gate opens
   * below: a free held up would hang here until the test's timeout. */
  CHECK_OK(gma_free(g, small));
  sleep_us(50000);
  atomic_store(&gate, 1); /* only now may the kernel finish */
  pthread_join(t, NULL);
  CHECK_OK(w.st);
  CHECK(w.ms >= 40 && atomic_load(&corruptions) == 0);
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_destroy(g));
}

/* Right below memory_limit a small request gets a segment of what is left
 * (before: it failed with a megabyte of the limit left). */
static void small_room_left(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:65M,worker:off");
  void *big, *p;
  CHECK_OK(gma_alloc(g, 64 * MiB, NULL, &big));
  CHECK_OK(gma_alloc(g, 512, NULL, &p));
  CHECK(stats_of(g).reserved.current <= 65 * MiB);
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_free(g, big));
  CHECK_OK(gma_destroy(g));
}

/* A trim gives memory back to the device outside the pool lock; an
 * allocation that needs that memory meanwhile waits for the give-back
 * instead of failing (found by review: it got GMA_ERR_OOM with "reserved 0"),
 * with ordinary and with growable segments. */
static gma_t *trim_g;
static void *trim_all(void *arg) {
  (void)arg;
  CHECK_OK(gma_trim(trim_g, 0));
  return NULL;
}

static void trim_in_flight(void) {
  for (int growable = 0; growable < 2; growable++) {
    trim_g = sim_allocator_ordinary(growable ? "expandable_segments:true,worker:off,sim_capacity:64M,"
                                      "sim_free_ns:200000000"
                                    : "worker:off,sim_capacity:64M,sim_free_ns:200000000");
    void *a, *b;
    CHECK_OK(gma_alloc(trim_g, 48 * MiB, NULL, &a));
    CHECK_OK(gma_free(trim_g, a));
    CHECK_OK(gma_stream_synchronize(trim_g, NULL));
    pthread_t t;
    CHECK(pthread_create(&t, NULL, trim_all, NULL) == 0);
    sleep_us(50000); /* the trim is inside its device free now (200 ms) */
    CHECK_OK(gma_alloc(trim_g, 48 * MiB, NULL, &b));
    pthread_join(t, NULL);
    CHECK(stats_of(trim_g).reserved.current <= 64 * MiB);
    CHECK_OK(gma_free(trim_g, b));
    CHECK_OK(gma_destroy(trim_g));
  }
}

/* A real shortage while unrelated memory is busy: 40 MiB live, 16 MiB
 * freed under a 300 ms kernel, 32 MiB asked under a 64 MiB limit. Even
 * once the kernel is done only 24 MiB could be had, so it fails at once
 * (before: it waited for the kernel, then failed). */
static void shortage_under_busy_work(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:64M,worker:off");
  gma_stream_t a;
  CHECK_OK(gma_stream_create(g, &a));
  atomic_int corruptions = 0;
  void *live, *q;
  CHECK_OK(gma_alloc(g, 40 * MiB, NULL, &live));
  pattern_kernel_t *k = busy_freed(g, a, 16 * MiB, 1000000, &corruptions);
  uint64_t t0 = now_ms();
  CHECK_ST(gma_alloc(g, 32 * MiB, NULL, &q), GMA_ERR_OOM);
  CHECK(now_ms() - t0 < 700); /* did not wait for the 1 s kernel */
  CHECK(strstr(gma_last_error(), "a real shortage") != NULL);
  gma_stats_t s = stats_of(g);
  CHECK(s.num_oom_waits == 0 && s.num_ooms == 1);
  /* 24 MiB does fit once the kernel is done: that one waits. */
  CHECK_OK(gma_alloc(g, 24 * MiB, NULL, &q));
  CHECK(stats_of(g).num_oom_waits == 1);
  CHECK(atomic_load(&corruptions) == 0);
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_free(g, live));
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK(atomic_load(&corruptions) == 0);
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_destroy(g));
  free(k);
}

/* An async request whose memory is still busy at its deadline: the
 * message names the deadline, not oom_wait_ms (which bounds only the
 * synchronous calls' wait). */
static void async_deadline_message(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:64M");
  gma_stream_t a;
  CHECK_OK(gma_stream_create(g, &a));
  atomic_int corruptions = 0;
  void *q;
  pattern_kernel_t *k = busy_freed(g, a, 48 * MiB, 300000, &corruptions);
  gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
  o.timeout_ns = 50000000ull;
  gma_future_t *f;
  CHECK_OK(gma_alloc_async(g, 48 * MiB, NULL, &o, &f));
  CHECK_ST(gma_future_wait(f, UINT64_MAX, &q), GMA_ERR_TIMEOUT);
  CHECK(strstr(gma_last_error(), "still in use by device work") != NULL);
  CHECK(strstr(gma_last_error(), "longer deadline") != NULL);
  CHECK(strstr(gma_last_error(), "oom_wait_ms") == NULL);
  CHECK_OK(gma_future_release(f));
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK(atomic_load(&corruptions) == 0);
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_destroy(g));
  free(k);
}

/* The device full, a request of one pool kind fits a FREE block of the
 * other: it gets it instead of failing. A small request in a large hole
 * (12 MiB free in a split 24 MiB segment, the small segments filled), and
 * with growable segments a large request in a small chunk's free part. */
static void other_pool_holds_it(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:64M,worker:off");
  void *x, *y, *p[64];
  CHECK_OK(gma_alloc(g, 24 * MiB, NULL, &x));
  CHECK_OK(gma_free(g, x));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK_OK(gma_alloc(g, 12 * MiB, NULL, &y));
  int n = 0;
  while (n < 64 && gma_alloc(g, 1 * MiB, NULL, &p[n]) == GMA_OK) n++;
  /* 40 MiB of small segments, then the 12 MiB left in the large one. */
  CHECK(n == 52);
  CHECK(strstr(gma_last_error(), "a real shortage") != NULL);
  for (int i = 0; i < n; i++) CHECK_OK(gma_free(g, p[i]));
  CHECK_OK(gma_free(g, y));
  gma_stats_t s = stats_of(g);
  CHECK(s.allocated.current == 0);
  CHECK_OK(gma_destroy(g));

  g = sim_allocator_ordinary("expandable_segments:true,worker:off,sim_capacity:256M");
  void *small, *big, *q;
  CHECK_OK(gma_alloc(g, 512 * 1024, NULL, &small)); /* maps the small kind's chunk */
  CHECK_OK(gma_alloc(g, 248 * MiB, NULL, &big));
  CHECK_OK(gma_alloc(g, 4 * MiB, NULL, &q)); /* in the small chunk's free part */
  memset(q, 7, 4 * MiB);
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_alloc(g, 4 * MiB, NULL, &q)); /* and again, once freed */
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_free(g, big));
  CHECK_OK(gma_free(g, small));
  CHECK_OK(gma_destroy(g));
}

/* Three threads take turns at memory that device work frees: each
 * allocates on its stream under a 24 MiB limit (512 B to 512 KiB, every
 * 32nd block 3 MiB), hands it to the two other threads' streams (a kernel
 * on each, every 13th holding 2 ms; gma_record_stream) and frees it.
 * Every allocation can be served once some of that work is done, so none
 * may fail, however often other threads take what completed first: with
 * the old cap of 64 wait rounds planted back, 1-3 of the 2400 calls failed
 * in each of 4 runs (a 3 MiB block waits for many small ones to coalesce). */
enum { TURN_THREADS = 3, TURN_ITERS = 800 };
typedef struct turn_arg {
  gma_t *g;
  gma_stream_t *streams;
  int me, failed;
  atomic_int *corruptions;
} turn_arg_t;

static void *take_turns(void *arg) {
  turn_arg_t *t = arg;
  gma_stream_t own = t->streams[t->me];
  pattern_kernel_t *ks = calloc(3 * TURN_ITERS, sizeof *ks);
  for (int i = 0; i < TURN_ITERS; i++) {
    /* Mostly small blocks, every 32nd 3 MiB: the large one needs many
     * small ones to complete and coalesce, round after round. */
    uint64_t r = (uint64_t)(t->me + 1) * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xBF58476D1CE4E5B9ull;
    r ^= r >> 29;
    size_t size = i % 32 == 31 ? 3 * MiB : 512u * (1 + r % 1024);
    void *p;
    if (gma_alloc(t->g, size, own, &p) != GMA_OK) {
      fprintf(stderr, "thread %d, iteration %d: %s\n", t->me, i, gma_last_error());
      t->failed++;
      continue;
    }
    pattern_kernel_t *w = &ks[3 * i + 2]; /* written on its own stream first */
    *w = (pattern_kernel_t){.buf = p, .len = size, .value = (uint8_t)(t->me * 64 + i),
                            .corruptions = t->corruptions};
    CHECK_OK(gma_sim_launch(t->g, own, pattern_kernel_run, w));
    for (int c = 0; c < 2; c++) { /* the two other threads' streams use it */
      gma_stream_t user = t->streams[(t->me + 1 + c) % TURN_THREADS];
      pattern_kernel_t *k = &ks[3 * i + c];
      *k = (pattern_kernel_t){.buf = p, .len = size, .value = (uint8_t)(t->me * 64 + i),
                              .hold_us = i % 13 ? 0 : 2000, .corruptions = t->corruptions};
      CHECK_OK(gma_stream_wait_stream(t->g, user, own));
      CHECK_OK(gma_sim_launch(t->g, user, pattern_kernel_run, k));
      CHECK_OK(gma_record_stream(t->g, p, user));
    }
    CHECK_OK(gma_free(t->g, p));
  }
  for (int c = 0; c < TURN_THREADS; c++) CHECK_OK(gma_stream_synchronize(t->g, t->streams[c]));
  free(ks);
  return NULL;
}

static void threads_take_turns(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:24M,reuse:query,oom_wait_ms:60000");
  gma_stream_t streams[TURN_THREADS];
  for (int i = 0; i < TURN_THREADS; i++) CHECK_OK(gma_stream_create(g, &streams[i]));
  atomic_int corruptions = 0;
  turn_arg_t args[TURN_THREADS];
  pthread_t th[TURN_THREADS];
  for (int i = 0; i < TURN_THREADS; i++) {
    args[i] = (turn_arg_t){g, streams, i, 0, &corruptions};
    CHECK(pthread_create(&th[i], NULL, take_turns, &args[i]) == 0);
  }
  for (int i = 0; i < TURN_THREADS; i++) pthread_join(th[i], NULL);
  int failed = 0;
  for (int i = 0; i < TURN_THREADS; i++) failed += args[i].failed;
  gma_stats_t s = stats_of(g);
  printf("threads_take_turns: %d failed, %" PRIu64 " calls waited\n", failed, s.num_oom_waits);
  CHECK(failed == 0 && s.num_ooms == 0 && atomic_load(&corruptions) == 0);
  for (int i = 0; i < TURN_THREADS; i++) CHECK_OK(gma_stream_destroy(g, streams[i]));
  CHECK_OK(gma_destroy(g));
}


/* The memory is freed on A while A's kernel runs, and another thread is
 * inside gma_stream_synchronize(A) when B asks for it: B must wait for A's
 * work and get it. Before, the synchronize closed A's epoch without an
 * event, so B's OOM wait found nothing to wait on and failed at once with
 * "device work gma could not wait for". */
static gma_t *sync_g;
static gma_stream_t sync_a;
static void *sync_stream(void *arg) {
  (void)arg;
  CHECK_OK(gma_stream_synchronize(sync_g, sync_a));
  return NULL;
}

static void waits_during_synchronize(void) {
  gma_t *g = sync_g = sim_allocator_ordinary("memory_limit:64M,worker:off");
  gma_stream_t b;
  CHECK_OK(gma_stream_create(g, &sync_a));
  CHECK_OK(gma_stream_create(g, &b));
  atomic_int corruptions = 0;
  pattern_kernel_t *k = busy_freed(g, sync_a, 48 * MiB, 200000, &corruptions);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, sync_stream, NULL) == 0);
  sleep_us(20000); /* the synchronize has begun */
  void *q;
  uint64_t t0 = now_ms();
  CHECK_OK(gma_alloc(g, 48 * MiB, b, &q));
  uint64_t waited = now_ms() - t0;
  printf("waits_during_synchronize: waited %" PRIu64 " ms\n", waited);
  CHECK(waited >= 100 && atomic_load(&corruptions) == 0);
  pthread_join(t, NULL);
  CHECK(stats_of(g).num_ooms == 0);
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_stream_destroy(g, sync_a));
  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_destroy(g));
  free(k);
}

static const test_case_t cases[] = {{"others_go_on", others_go_on},
                                    {"waits_during_synchronize", waits_during_synchronize},
                                    {"trim_in_flight", trim_in_flight},
                                    {"small_room_left", small_room_left},
                                    {"busy_own_stream", busy_own_stream},
                                    {"busy_record_stream", busy_record_stream},
                                    {"real_shortage", real_shortage},
                                    {"bounded_wait", bounded_wait},
                                    {"fragmentation_message", fragmentation_message},
                                    {"async_counts_once", async_counts_once},
                                    {"shortage_under_busy_work", shortage_under_busy_work},
                                    {"async_deadline_message", async_deadline_message},
                                    {"other_pool_holds_it", other_pool_holds_it},
                                    {"threads_take_turns", threads_take_turns}};

int main(int argc, char **argv) {
  return run_cases(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
