/* The outside probe of issue 13, one case per finding, each failing on the
 * code before its fix: gma_reserve's count overflow, frees racing
 * gma_stream_destroy, per-thread streams of exited threads, unsetting the
 * pressure callback while it runs, the reporters against the lock-free path
 * (a TSan finding), async timeouts of UINT64_MAX, a memory_limit below the
 * segment size, gma_find_old_allocations with nothing live (a UBSan
 * finding), gma_host_alloc(SIZE_MAX), several waiters on one future,
 * reuse:none with record_stream, and the smaller decisions (duplicate
 * config keys, size spellings, retiring an unknown stream). fork() has its
 * own test (test_fork.c). Public API only. `test_probe NAME` runs one case. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "simkit.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

#ifndef GMA_TEST_SCALE
#define GMA_TEST_SCALE 1
#endif

/* Under TSan everything runs several times slower: fewer rounds. */
#if defined(__SANITIZE_THREAD__)
#define ROUNDS_DIV 8
#else
#define ROUNDS_DIV 1
#endif

/* Calls gma_empty_cache until reserved is 0 or 3 s passed; the closing
 * events of retired streams complete on the device's own threads. */
static uint64_t settle_reserved(gma_t *g) {
  for (int i = 0; i < 300; i++) {
    CHECK_OK(gma_empty_cache(g));
    uint64_t r = stats_of(g).reserved.current;
    if (r == 0) return 0;
    sleep_us(10000);
  }
  return stats_of(g).reserved.current;
}

/* 1. Counts that wrap, and counts no allocator could hold: a clear error,
 * nothing allocated (before: a heap overflow in gma_reserve). */
static void reserve_overflow(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:64M");
  size_t sizes[2] = {4096, 4096};
  CHECK_ST(gma_reserve(g, NULL, 2, sizes, (size_t[]){SIZE_MAX, 2}), GMA_ERR_INVALID_SIZE);
  CHECK(strstr(gma_last_error(), "memory_limit") != NULL);
  CHECK_ST(gma_reserve(g, NULL, 1, sizes, (size_t[]){SIZE_MAX}), GMA_ERR_INVALID_SIZE);
  CHECK_ST(gma_reserve(g, NULL, 1, sizes, (size_t[]){(64 * MiB) / 4096 + 1}), GMA_ERR_INVALID_SIZE);
  CHECK_ST(gma_reserve(g, NULL, 1, (size_t[]){SIZE_MAX}, (size_t[]){1}), GMA_ERR_INVALID_SIZE);
  CHECK_ST(gma_reserve(g, NULL, 1, (size_t[]){0}, (size_t[]){3}), GMA_ERR_INVALID_SIZE);
  CHECK_ST(gma_reserve(g, NULL, 2, NULL, (size_t[]){1, 1}), GMA_ERR_INVALID_ARGUMENT);
  gma_stats_t s = stats_of(g);
  CHECK(s.allocated.current == 0 && s.num_allocs == 0 && s.reserved.current == 0);
  /* A zero count with any size is nothing to do; a fitting request works. */
  CHECK_OK(gma_reserve(g, NULL, 2, (size_t[]){SIZE_MAX, 4096}, (size_t[]){0, 8}));
  CHECK(stats_of(g).hits_bin == 0 && stats_of(g).num_allocs == 8);
  void *p;
  CHECK_OK(gma_alloc(g, 4096, NULL, &p));
  CHECK(stats_of(g).hits_bin == 1);
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_destroy(g));
}

/* 2. One thread frees 32 bin-sized blocks while another destroys their
 * stream. Afterwards nothing is live and no stream remains: everything must
 * go back (before: a free pushing into the bin between the retire's drain
 * and its retired flag stranded the block until gma_destroy). */
typedef struct race_arg {
  gma_t *g;
  void **ptrs;
  int n;
  atomic_int *go;
} race_arg_t;

static void *free_all(void *arg) {
  race_arg_t *a = arg;
  while (!atomic_load(a->go)) {
  }
  for (int i = 0; i < a->n; i++) CHECK_OK(gma_free(a->g, a->ptrs[i]));
  return NULL;
}

static void free_vs_stream_destroy(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:1G");
  int rounds = 4000 / ROUNDS_DIV;
  void *ptrs[32];
  for (int r = 0; r < rounds; r++) {
    gma_stream_t s;
    CHECK_OK(gma_stream_create(g, &s));
    for (int i = 0; i < 32; i++) CHECK_OK(gma_alloc(g, 4 * KiB, s, &ptrs[i]));
    atomic_int go = 0;
    race_arg_t a = {g, ptrs, 32, &go};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, free_all, &a) == 0);
    atomic_store(&go, 1);
    for (int spin = r % 64; spin > 0; spin--) __asm__ __volatile__("" ::: "memory");
    CHECK_OK(gma_stream_destroy(g, s));
    pthread_join(t, NULL);
  }
  gma_stats_t s = stats_of(g);
  CHECK(s.allocated.current == 0 && s.num_streams == 0);
  uint64_t left = settle_reserved(g);
  if (left) fprintf(stderr, "free_vs_stream_destroy: %llu bytes stranded\n", (unsigned long long)left);
  CHECK(left == 0);
  CHECK_OK(gma_destroy(g));
}

/* 3. Threads allocate and free on their per-thread default streams and
 * exit. Their memory must come back (before: it stayed cached on streams
 * only the dead threads could close, until gma_destroy), and a later
 * allocation on another stream must fit. */
static void *ptds_worker(void *arg) {
  gma_t *g = arg;
  void *p[6];
  size_t sizes[6] = {4 * KiB, 64 * KiB, 1 * MiB, 3 * MiB, 6 * MiB, 8 * MiB};
  for (int i = 0; i < 6; i++) CHECK_OK(gma_alloc(g, sizes[i], GMA_STREAM_PER_THREAD, &p[i]));
  for (int i = 0; i < 6; i++) CHECK_OK(gma_free(g, p[i]));
  return NULL;
}

static void ptds_thread_exit(void) {
  /* Room for all eight threads at once (about 18 MiB each, segments
   * rounded), so none of them can run out while the others still hold. */
  gma_t *g = sim_allocator_ordinary("memory_limit:400M,worker:off");
  pthread_t t[8];
  for (int i = 0; i < 8; i++) CHECK(pthread_create(&t[i], NULL, ptds_worker, g) == 0);
  for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
  CHECK(stats_of(g).num_streams == 0); /* retired as each thread exited */
  CHECK(settle_reserved(g) == 0);
  /* The memory serves another stream now. */
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  void *p;
  CHECK_OK(gma_alloc(g, 390 * MiB, s, &p));
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_destroy(g));
}

/* 4. Unsetting (or replacing) the pressure callback waits for a running one
 * to return, so the caller may free its user data at once; a callback may
 * unset itself without waiting for itself. */
typedef struct cb_ctx {
  uint64_t magic;
  atomic_int *running, *calls;
  int unset_self;
} cb_ctx_t;

static void slow_cb(gma_t *g, gma_pressure_t level, void *user) {
  (void)level;
  cb_ctx_t *c = user;
  atomic_store(c->running, 1);
  atomic_fetch_add(c->calls, 1);
  sleep_us(100000);
  CHECK(c->magic == 0x600dull); /* reads the user data after the sleep */
  if (c->unset_self) CHECK_OK(gma_set_pressure_callback(g, NULL, NULL));
  atomic_store(c->running, 0);
}

static void pressure_callback_unset(void) {
  gma_t *g = sim_allocator_ordinary("trim_interval_ms:1");
  atomic_int running = 0, calls = 0;
  for (int round = 0; round < 3; round++) {
    cb_ctx_t *c = malloc(sizeof *c);
    *c = (cb_ctx_t){0x600dull, &running, &calls, 0};
    int before = atomic_load(&calls);
    CHECK_OK(gma_set_pressure_callback(g, slow_cb, c));
    for (int i = 0; i < 5000 && atomic_load(&calls) == before; i++) sleep_us(200);
    CHECK(atomic_load(&calls) > before); /* it runs now, for 100 ms */
    /* Unset (round 0, 2) or replace (round 1) while it runs. */
    CHECK_OK(gma_set_pressure_callback(g, round == 1 ? slow_cb : NULL, round == 1 ? c : NULL));
    if (round != 1) {
      CHECK(atomic_load(&running) == 0); /* it returned before the unset did */
      c->magic = 0xdeadull;
      free(c);
    } else {
      CHECK_OK(gma_set_pressure_callback(g, NULL, NULL));
      CHECK(atomic_load(&running) == 0);
      free(c);
    }
  }
  /* A callback that unsets itself. */
  cb_ctx_t self = {0x600dull, &running, &calls, 1};
  int before = atomic_load(&calls);
  CHECK_OK(gma_set_pressure_callback(g, slow_cb, &self));
  for (int i = 0; i < 5000 && (atomic_load(&calls) == before || atomic_load(&running)); i++)
    sleep_us(200);
  CHECK(atomic_load(&calls) == before + 1 && atomic_load(&running) == 0);
  sleep_us(20000);
  CHECK(atomic_load(&calls) == before + 1); /* it unset itself: never called again */
  CHECK_OK(gma_destroy(g));
}

/* 5. The reporters read blocks under the pool lock while the lock-free bin
 * path hands them out: every field they read must be atomic there (TSan
 * reported requested). In other builds this checks they stay consistent. */
typedef struct rep_arg {
  gma_t *g;
  atomic_int *stop;
} rep_arg_t;

static void *report_loop(void *arg) {
  rep_arg_t *a = arg;
  char buf[8192];
  gma_allocation_info_t info[16];
  while (!atomic_load(a->stop)) {
    gma_status_t st = gma_live_report(a->g, 4, buf, sizeof buf);
    CHECK(st == GMA_OK || st == GMA_ERR_INVALID_SIZE);
    size_t n = 0;
    CHECK_OK(gma_find_old_allocations(a->g, 0, info, 16, &n));
    CHECK_OK(gma_snapshot_json(a->g, "/dev/null"));
    st = gma_memory_summary(a->g, buf, sizeof buf);
    CHECK(st == GMA_OK || st == GMA_ERR_INVALID_SIZE);
  }
  return NULL;
}

static void reporters_concurrent(void) {
  gma_t *g = sim_allocator_ordinary(NULL);
  void *keep;
  CHECK_OK(gma_alloc(g, 4 * KiB, NULL, &keep)); /* one block stays live throughout */
  atomic_int stop = 0;
  rep_arg_t a = {g, &stop};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, report_loop, &a) == 0);
  for (int i = 0; i < 20000 / ROUNDS_DIV; i++) {
    void *p;
    CHECK_OK(gma_alloc(g, 512 + (size_t)(i % 8) * 512, NULL, &p)); /* bin hits after the first */
    CHECK_OK(gma_free(g, p));
  }
  atomic_store(&stop, 1);
  pthread_join(t, NULL);
  size_t n = 0;
  gma_allocation_info_t info[4];
  CHECK_OK(gma_find_old_allocations(g, 0, info, 4, &n));
  CHECK(n == 1 && info[0].ptr == keep && info[0].requested == 4 * KiB);
  CHECK_OK(gma_free(g, keep));
  CHECK_OK(gma_destroy(g));
}

/* 6. timeout_ns = UINT64_MAX means no limit, as for gma_future_wait (before:
 * the deadline wrapped and the request timed out at once). */
static void async_timeout_max(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:16M");
  void *big;
  CHECK_OK(gma_alloc(g, 12 * MiB, NULL, &big));
  gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
  o.timeout_ns = UINT64_MAX;
  gma_future_t *f;
  CHECK_OK(gma_alloc_async(g, 8 * MiB, NULL, &o, &f));
  sleep_us(50000);
  CHECK_ST(gma_future_poll(f), GMA_PENDING); /* still waiting for memory */
  CHECK_OK(gma_free(g, big));
  void *p;
  CHECK_OK(gma_future_wait(f, UINT64_MAX, &p));
  CHECK(p != NULL);
  CHECK_OK(gma_future_release(f));
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_destroy(g));
}

/* 7. A memory_limit below the default segment sizes: the segments shrink to
 * fit (before: memory_limit:1M was accepted and no allocation could ever
 * succeed); explicit segment sizes above an explicit limit are an error. */
static void limit_below_segment(void) {
  const char *confs[] = {"memory_limit:1M", "sim_capacity:1M", "memory_limit:3M"};
  for (int i = 0; i < 3; i++) {
    gma_t *g = sim_allocator_ordinary(confs[i]);
    void *a, *b;
    CHECK_OK(gma_alloc(g, 4 * KiB, NULL, &a));
    CHECK_OK(gma_alloc(g, 512 * KiB, NULL, &b));
    CHECK_OK(gma_free(g, a));
    CHECK_OK(gma_free(g, b));
    CHECK_OK(gma_empty_cache(g));
    size_t most = i == 2 ? 3 * MiB - 4096 : 1 * MiB; /* a large request up to the limit */
    CHECK_OK(gma_alloc(g, most, NULL, &a));
    CHECK(stats_of(g).reserved.current <= (i == 2 ? 3 : 1) * MiB);
    CHECK_OK(gma_free(g, a));
    CHECK_OK(gma_destroy(g));
  }
  /* Growable segments map whole chunks (2 MiB on the simulated device, as on
   * GPUs): a limit below one chunk is refused at gma_create, saying why. */
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1;
  CHECK_OK(gma_config_parse(&c, "memory_limit:1M,expandable_segments:true"));
  gma_t *x = NULL;
  CHECK_ST(gma_create(&c, &x), GMA_ERR_CONFIG);
  CHECK(x == NULL && strstr(gma_last_error(), "chunks of") != NULL);
  c = (gma_config_t)GMA_CONFIG_INIT;
  CHECK_ST(gma_config_parse(&c, "memory_limit:1M,small_segment:2M"), GMA_ERR_CONFIG);
  CHECK(strstr(gma_last_error(), "small_segment") != NULL &&
        strstr(gma_last_error(), "memory_limit") != NULL);
  CHECK_ST(gma_config_parse(&c, "large_segment:20M,memory_limit:8M"), GMA_ERR_CONFIG);
  CHECK(strstr(gma_last_error(), "large_segment") != NULL);
  c = (gma_config_t)GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1;
  c.memory_limit = 4 * MiB;
  c.small_segment_size = 8 * MiB; /* set in the struct, without the parser */
  gma_t *g = NULL;
  CHECK_ST(gma_create(&c, &g), GMA_ERR_CONFIG);
  CHECK(g == NULL);
}

/* 8. gma_find_old_allocations with room but nothing live (before: memcpy
 * from NULL, which UBSan halts on). */
static void old_allocations_none(void) {
  gma_t *g = sim_allocator_ordinary(NULL);
  gma_allocation_info_t info[4];
  size_t n = 99;
  CHECK_OK(gma_find_old_allocations(g, 0, info, 4, &n));
  CHECK(n == 0);
  CHECK_OK(gma_find_old_allocations(g, 0, NULL, 0, &n));
  CHECK(n == 0);
  CHECK_OK(gma_destroy(g));
}

/* 9. Host sizes that would wrap when rounded to pages (before: SIZE_MAX
 * became a 0-byte block, stopped only by the simulated device). */
static void host_alloc_huge(void) {
  gma_t *g = sim_allocator_ordinary(NULL);
  void *p = (void *)1;
  size_t bad[3] = {SIZE_MAX, SIZE_MAX - 4000, (SIZE_MAX >> 1) + 1};
  for (int i = 0; i < 3; i++) {
    CHECK_ST(gma_host_alloc(g, bad[i], NULL, &p), GMA_ERR_INVALID_SIZE);
    CHECK(p == NULL);
  }
  CHECK(stats_of(g).host_reserved.current == 0);
  CHECK_OK(gma_host_alloc(g, 5000, NULL, &p));
  CHECK_OK(gma_host_free(g, p));
  CHECK_OK(gma_destroy(g));
}

/* 11. Several threads wait on one future: exactly one collects the pointer,
 * the others are told it was collected (before: all got GMA_OK and the same
 * pointer, and each "owned" it). */
typedef struct waiter {
  gma_future_t *f;
  atomic_int *go;
  gma_status_t st;
  void *p;
} waiter_t;

static void *wait_one(void *arg) {
  waiter_t *w = arg;
  while (!atomic_load(w->go)) {
  }
  w->st = gma_future_wait(w->f, UINT64_MAX, &w->p);
  return NULL;
}

static void many_waiters(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:64M");
  for (int round = 0; round < 20; round++) {
    gma_future_t *f;
    CHECK_OK(gma_alloc_async(g, 8 * MiB, NULL, NULL, &f)); /* above bin_max: the worker serves */
    atomic_int go = 0;
    waiter_t w[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
      w[i] = (waiter_t){f, &go, GMA_PENDING, NULL};
      CHECK(pthread_create(&t[i], NULL, wait_one, &w[i]) == 0);
    }
    atomic_store(&go, 1);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    int ok = 0;
    void *p = NULL;
    for (int i = 0; i < 4; i++) {
      if (w[i].st == GMA_OK) {
        ok++;
        p = w[i].p;
      } else {
        CHECK(w[i].st == GMA_ERR_ALREADY_COLLECTED && w[i].p == NULL);
      }
    }
    CHECK(ok == 1 && p != NULL);
    void *again = (void *)1;
    CHECK_ST(gma_future_wait(f, 0, &again), GMA_ERR_ALREADY_COLLECTED);
    CHECK(again == NULL);
    CHECK(strstr(gma_last_error(), "already collected") != NULL);
    CHECK_OK(gma_future_poll(f)); /* it did complete */
    CHECK_OK(gma_future_wait(f, 0, NULL)); /* a wait that collects nothing */
    CHECK_OK(gma_future_release(f)); /* must not free the collected memory */
    CHECK(stats_of(g).allocated.current == 8 * MiB);
    CHECK_OK(gma_free(g, p));
  }
  CHECK_OK(gma_destroy(g));
}

/* 12. reuse:none with gma_record_stream: after both streams were
 * synchronized through gma, one gma_empty_cache gives everything back
 * (before: it took two calls). */
static void reuse_none_record_stream(void) {
  gma_t *g = sim_allocator_ordinary("reuse:none");
  gma_stream_t a, b;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &b));
  atomic_int corruptions = 0;
  for (int round = 0; round < 5; round++) {
    void *p[4];
    pattern_kernel_t k[4];
    for (int i = 0; i < 4; i++) {
      CHECK_OK(gma_alloc(g, (size_t)(i + 1) * 3 * MiB, a, &p[i]));
      k[i] = (pattern_kernel_t){.buf = p[i], .len = 64 * KiB, .value = (uint8_t)(i + 1),
                                .hold_us = 2000, .corruptions = &corruptions};
      CHECK_OK(gma_sim_launch(g, b, pattern_kernel_run, &k[i]));
      CHECK_OK(gma_record_stream(g, p[i], b));
      CHECK_OK(gma_free(g, p[i]));
    }
    CHECK(stats_of(g).pending_bytes > 0);
    CHECK_OK(gma_stream_synchronize(g, a));
    CHECK_OK(gma_stream_synchronize(g, b));
    CHECK_OK(gma_empty_cache(g)); /* once */
    gma_stats_t s = stats_of(g);
    CHECK(s.reserved.current == 0 && s.pending_bytes == 0);
  }
  CHECK(atomic_load(&corruptions) == 0);
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_destroy(g));
}

/* 13. The smaller decisions. */
static void small_points(void) {
  gma_config_t c = GMA_CONFIG_INIT;
  /* A key given twice in one string is an error; across strings the later wins. */
  CHECK_ST(gma_config_parse(&c, "bin_depth:8,bin_depth:16"), GMA_ERR_CONFIG);
  CHECK(strstr(gma_last_error(), "'bin_depth' appears twice") != NULL);
  CHECK(c.bin_depth == 0); /* nothing applied */
  CHECK_OK(gma_config_parse(&c, "bin_depth:8"));
  CHECK_OK(gma_config_parse(&c, "bin_depth:16"));
  CHECK(c.bin_depth == 16);
  /* Sizes: K/M/G/T in either case, optionally followed by B or iB, all
   * powers of 1024; spaces around keys and values are ignored. */
  const char *spell[] = {"memory_limit:1GB", "memory_limit:1g", "memory_limit:1GiB",
                         " memory_limit : 1G ", "memory_limit:1073741824", "memory_limit:1048576K"};
  for (int i = 0; i < 6; i++) {
    gma_config_t d = GMA_CONFIG_INIT;
    CHECK_OK(gma_config_parse(&d, spell[i]));
    CHECK(d.memory_limit == 1024 * MiB);
  }
  const char *bad[] = {"memory_limit:1 G", "memory_limit:1GG", "memory_limit:1.5G",
                       "memory_limit:-1G", "memory_limit:1Gb2"};
  for (int i = 0; i < 5; i++) {
    gma_config_t d = GMA_CONFIG_INIT;
    CHECK_ST(gma_config_parse(&d, bad[i]), GMA_ERR_CONFIG);
  }
  /* Retiring a stream gma has no record of does nothing and succeeds (so a
   * framework may retire every stream it destroys); it makes no device call
   * with the handle, which may not be a live stream. */
  gma_t *g = sim_allocator_ordinary(NULL);
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  CHECK_OK(gma_stream_retire(g, s)); /* never used with gma */
  CHECK_OK(gma_stream_retire(g, (gma_stream_t)(uintptr_t)0x7777000)); /* not a stream at all */
  void *p;
  CHECK_OK(gma_alloc(g, 4096, s, &p));
  CHECK(stats_of(g).num_streams == 1);
  CHECK_OK(gma_stream_retire(g, s));
  CHECK_OK(gma_stream_retire(g, s)); /* twice */
  CHECK(stats_of(g).num_streams == 0);
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_destroy(g));
}

static const test_case_t cases[] = {
    {"reserve_overflow", reserve_overflow},
    {"free_vs_stream_destroy", free_vs_stream_destroy},
    {"ptds_thread_exit", ptds_thread_exit},
    {"pressure_callback_unset", pressure_callback_unset},
    {"reporters_concurrent", reporters_concurrent},
    {"async_timeout_max", async_timeout_max},
    {"limit_below_segment", limit_below_segment},
    {"old_allocations_none", old_allocations_none},
    {"host_alloc_huge", host_alloc_huge},
    {"many_waiters", many_waiters},
    {"reuse_none_record_stream", reuse_none_record_stream},
    {"small_points", small_points},
};

int main(int argc, char **argv) {
  return run_cases(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
