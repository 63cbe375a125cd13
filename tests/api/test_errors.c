/* API test of every documented error, through gma.h alone: each failing call
 * returns its status, leaves a non-empty gma_last_error(), changes no
 * statistic it has no business changing, and leaves the allocator working.
 * Covers NULL arguments, zero and oversized requests, OOM and recovery from
 * it, injected device failures, foreign, interior and double frees,
 * record_stream misuse, a pointer of another allocator, and leaks at
 * destroy. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "gma.h"

#define MiB ((size_t)1 << 20)

static gma_t *new_sim_cfg(gma_config_t *c) {
  c->device = GMA_DEVICE_SIM;
  c->ignore_env = 1; /* the test must not depend on the caller's environment */
  gma_t *g = NULL;
  CHECK_OK(gma_create(c, &g));
  CHECK(g != NULL);
  return g;
}

static gma_t *new_sim(uint64_t capacity) {
  gma_config_t c = GMA_CONFIG_INIT;
  c.sim_capacity = capacity;
  return new_sim_cfg(&c);
}

/* The statistics a failed call must not touch. Byte counts that move between
 * stream_cached, pending and free as streams progress are left out: their
 * movement is the allocator's background business, not the failed call's. */
static void check_unchanged(const gma_stats_t *a, const gma_stats_t *b, int line) {
  int same = a->allocated.current == b->allocated.current &&
             a->allocated.total == b->allocated.total &&
             a->requested.current == b->requested.current &&
             a->requested.total == b->requested.total && a->num_allocs == b->num_allocs &&
             a->num_frees == b->num_frees && a->hits_bin == b->hits_bin && a->hits_stream == b->hits_stream &&
             a->hits_pool == b->hits_pool && a->hits_device == b->hits_device &&
             a->num_device_allocs == b->num_device_allocs;
  if (!same) {
    fprintf(stderr, "line %d: a failed call changed the stats\n", line);
    exit(1);
  }
}

/* Checks that the failing call left a message naming the problem. */
static void check_last_error(int line) {
  const char *e = gma_last_error();
  if (e == NULL || e[0] == '\0') {
    fprintf(stderr, "line %d: gma_last_error() is empty after a failing call\n", line);
    exit(1);
  }
}

/* A failing call: the status, then a message, then no stat change. */
#define CHECK_FAILS(g, call, status)        \
  do {                                      \
    gma_stats_t before_ = stats_of(g);      \
    CHECK_ST(call, status);                 \
    check_last_error(__LINE__);             \
    gma_stats_t after_ = stats_of(g);       \
    check_unchanged(&before_, &after_, __LINE__); \
  } while (0)

/* The allocator still serves a request and frees it. */
static void check_works(gma_t *g) {
  void *p = NULL;
  CHECK_OK(gma_alloc(g, 4096, NULL, &p));
  CHECK(p != NULL);
  memset(p, 0x5a, 4096);
  CHECK_OK(gma_free(g, p));
}

static void test_null_arguments(void) {
  gma_t *g = new_sim(0);
  void *p = NULL;
  gma_stream_t s = NULL;
  gma_stats_t st = GMA_STATS_INIT;

  CHECK_ST(gma_create(NULL, NULL), GMA_ERR_INVALID_ARGUMENT);
  check_last_error(__LINE__);
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1;
  CHECK_ST(gma_create(&c, NULL), GMA_ERR_INVALID_ARGUMENT);
  check_last_error(__LINE__);

  CHECK_ST(gma_alloc(NULL, 4096, NULL, &p), GMA_ERR_INVALID_ARGUMENT);
  check_last_error(__LINE__);
  CHECK(p == NULL);
  CHECK_FAILS(g, gma_alloc(g, 4096, NULL, NULL), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_free(NULL, &p), GMA_ERR_INVALID_ARGUMENT);
  check_last_error(__LINE__);
  CHECK_ST(gma_record_stream(NULL, &p, NULL), GMA_ERR_INVALID_ARGUMENT);
  check_last_error(__LINE__);
  CHECK_ST(gma_stats(NULL, &st), GMA_ERR_INVALID_ARGUMENT);
  check_last_error(__LINE__);
  CHECK_ST(gma_stats(g, NULL), GMA_ERR_INVALID_ARGUMENT);
  check_last_error(__LINE__);
  CHECK_ST(gma_empty_cache(NULL), GMA_ERR_INVALID_ARGUMENT);
  check_last_error(__LINE__);
  CHECK_ST(gma_stream_create(NULL, &s), GMA_ERR_INVALID_ARGUMENT);
  check_last_error(__LINE__);
  CHECK_FAILS(g, gma_stream_create(g, NULL), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_stream_synchronize(NULL, NULL), GMA_ERR_INVALID_ARGUMENT);
  check_last_error(__LINE__);
  CHECK_FAILS(g, gma_sim_launch(g, NULL, NULL, NULL), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_config_parse(NULL, "device:sim"), GMA_ERR_INVALID_ARGUMENT);
  check_last_error(__LINE__);

  /* Freeing NULL is a successful no-op, as with cudaFree and free. */
  gma_stats_t before = stats_of(g);
  CHECK_OK(gma_free(g, NULL));
  gma_stats_t after = stats_of(g);
  check_unchanged(&before, &after, __LINE__);
  CHECK(after.num_frees == before.num_frees);

  check_works(g);
  CHECK_OK(gma_destroy(g));
}

static void test_invalid_sizes(void) {
  gma_t *g = new_sim(64 * MiB);
  void *p = (void *)&p; /* a sentinel that must not be mistaken for a result */
  CHECK_FAILS(g, gma_alloc(g, 0, NULL, &p), GMA_ERR_INVALID_SIZE);
  /* Above the capacity: no amount of freeing could serve it, so it is not OOM. */
  CHECK_FAILS(g, gma_alloc(g, 64 * MiB + 1, NULL, &p), GMA_ERR_INVALID_SIZE);
  CHECK_FAILS(g, gma_alloc(g, 1ull << 40, NULL, &p), GMA_ERR_INVALID_SIZE);
  /* Sizes near SIZE_MAX must not overflow in rounding and come out small. */
  CHECK_FAILS(g, gma_alloc(g, SIZE_MAX, NULL, &p), GMA_ERR_INVALID_SIZE);
  CHECK_FAILS(g, gma_alloc(g, SIZE_MAX - 100, NULL, &p), GMA_ERR_INVALID_SIZE);
  CHECK_FAILS(g, gma_alloc(g, SIZE_MAX / 2 + 1, NULL, &p), GMA_ERR_INVALID_SIZE);
  gma_stats_t s = stats_of(g);
  CHECK(s.num_ooms == 0); /* invalid sizes are not out-of-memory events */
  check_works(g);
  CHECK_OK(gma_destroy(g));

  /* memory_limit caps what one request may ask for, below the capacity. */
  gma_config_t c = GMA_CONFIG_INIT;
  c.sim_capacity = 256 * MiB;
  c.memory_limit = 32 * MiB;
  g = new_sim_cfg(&c);
  CHECK_FAILS(g, gma_alloc(g, 33 * MiB, NULL, &p), GMA_ERR_INVALID_SIZE);
  CHECK_OK(gma_alloc(g, 20 * MiB, NULL, &p));
  void *q = NULL;
  /* Two 20 MiB blocks exceed the limit of 32 MiB although the device has room. */
  gma_stats_t before = stats_of(g);
  CHECK_ST(gma_alloc(g, 20 * MiB, NULL, &q), GMA_ERR_OOM);
  check_last_error(__LINE__);
  gma_stats_t after = stats_of(g);
  CHECK(after.num_ooms == before.num_ooms + 1);
  CHECK(after.reserved.current <= 32 * MiB);
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_destroy(g));
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Memory that would fit the device but is held by live allocations gives OOM;
 * once freed, the same request succeeds. */
static void test_oom_and_recovery(void) {
  gma_t *g = new_sim(64 * MiB);
  void *a = NULL, *b = NULL;
  CHECK_OK(gma_alloc(g, 40 * MiB, NULL, &a));
  gma_stats_t before = stats_of(g);
  CHECK_ST(gma_alloc(g, 40 * MiB, NULL, &b), GMA_ERR_OOM);
  check_last_error(__LINE__);
  gma_stats_t after = stats_of(g);
  check_unchanged(&before, &after, __LINE__);
  CHECK(after.num_ooms == before.num_ooms + 1);
  CHECK(after.reserved.current <= 64 * MiB);

  /* Small requests still fit beside the live 40 MiB. */
  check_works(g);

  /* Freed on the default stream, the block is reusable there at once. */
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_alloc(g, 40 * MiB, NULL, &b));
  CHECK_OK(gma_free(g, b));

  /* A larger request than the cached block needs the cache released to the
   * device first. Once the stream's work is done that must succeed, though
   * the allocator may need a few calls to observe the completion. */
  CHECK_OK(gma_stream_synchronize(g, NULL));
  gma_status_t st = GMA_ERR_OOM;
  for (int i = 0; i < 1000 && st == GMA_ERR_OOM; i++) {
    st = gma_alloc(g, 60 * MiB, NULL, &b);
    if (st == GMA_ERR_OOM) sleep_ms(1);
  }
  CHECK_OK(st);
  CHECK_OK(gma_free(g, b));

  /* The same on another stream: the cached block of the default stream must
   * be released for it, not kept forever. */
  gma_stream_t s = NULL;
  CHECK_OK(gma_stream_create(g, &s));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  st = GMA_ERR_OOM;
  for (int i = 0; i < 1000 && st == GMA_ERR_OOM; i++) {
    st = gma_alloc(g, 50 * MiB, s, &b);
    if (st == GMA_ERR_OOM) sleep_ms(1);
  }
  CHECK_OK(st);
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_stream_synchronize(g, s));
  CHECK_OK(gma_stream_destroy(g, s));

  gma_stats_t end = stats_of(g);
  CHECK(end.allocated.current == 0);
  CHECK(end.num_allocs == end.num_frees);
  CHECK_OK(gma_destroy(g));
}

/* Many small blocks fill the device; OOM comes, then everything is freed and
 * the allocator serves a request as large as the device again. */
static void test_oom_many_small(void) {
  gma_t *g = new_sim(64 * MiB);
  enum { MAXN = 1024 };
  void **ptrs = calloc(MAXN, sizeof *ptrs);
  CHECK(ptrs != NULL);
  int n = 0;
  gma_status_t st = GMA_OK;
  while (n < MAXN) {
    st = gma_alloc(g, 512 * 1024, NULL, &ptrs[n]);
    if (st != GMA_OK) break;
    n++;
  }
  CHECK_ST(st, GMA_ERR_OOM);
  check_last_error(__LINE__);
  CHECK(n > 0 && n < MAXN);
  for (int i = 0; i < n; i++) CHECK_OK(gma_free(g, ptrs[i]));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  void *big = NULL;
  st = GMA_ERR_OOM;
  for (int i = 0; i < 1000 && st == GMA_ERR_OOM; i++) {
    st = gma_alloc(g, 48 * MiB, NULL, &big);
    if (st == GMA_ERR_OOM) sleep_ms(1);
  }
  CHECK_OK(st);
  CHECK_OK(gma_free(g, big));
  free(ptrs);
  CHECK_OK(gma_destroy(g));
}

/* sim_fail_alloc:1 fails the first device allocation: the request that needed
 * it gets GMA_ERR_DEVICE with the device's message, and the next succeeds. */
static void test_injected_device_failure(void) {
  gma_config_t c = GMA_CONFIG_INIT;
  c.sim_fail_alloc = 1;
  gma_t *g = new_sim_cfg(&c);
  void *p = NULL;
  gma_stats_t before = stats_of(g);
  CHECK_ST(gma_alloc(g, 4096, NULL, &p), GMA_ERR_DEVICE);
  check_last_error(__LINE__);
  gma_stats_t after = stats_of(g);
  check_unchanged(&before, &after, __LINE__);
  CHECK(after.num_ooms == before.num_ooms); /* a device failure is not an OOM */
  CHECK(after.reserved.current == 0);
  check_works(g);
  CHECK_OK(gma_destroy(g));

  /* Failing a later allocation, with memory already held. */
  gma_config_t c2 = GMA_CONFIG_INIT;
  c2.sim_fail_alloc = 2;
  g = new_sim_cfg(&c2);
  void *a = NULL;
  CHECK_OK(gma_alloc(g, 4096, NULL, &a));
  /* 30 MiB cannot come from the small pool's segment: a second device call. */
  CHECK_ST(gma_alloc(g, 30 * MiB, NULL, &p), GMA_ERR_DEVICE);
  check_last_error(__LINE__);
  CHECK_OK(gma_alloc(g, 30 * MiB, NULL, &p));
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_destroy(g));
}

/* Foreign, interior and freed pointers: statuses as documented and no change. */
static void test_bad_frees(void) {
  gma_t *g = new_sim(0);
  int on_stack = 0;
  CHECK_FAILS(g, gma_free(g, &on_stack), GMA_ERR_INVALID_POINTER);
  void *heap = malloc(4096);
  CHECK(heap != NULL);
  CHECK_FAILS(g, gma_free(g, heap), GMA_ERR_INVALID_POINTER);
  CHECK_FAILS(g, gma_free(g, (void *)(uintptr_t)0x1000), GMA_ERR_INVALID_POINTER);

  void *p = NULL, *keep = NULL;
  CHECK_OK(gma_alloc(g, 8192, NULL, &p));
  CHECK_OK(gma_alloc(g, 8192, NULL, &keep));
  CHECK_FAILS(g, gma_free(g, (char *)p + 256), GMA_ERR_INVALID_POINTER);
  CHECK_FAILS(g, gma_free(g, (char *)p + 1), GMA_ERR_INVALID_POINTER);
  CHECK_FAILS(g, gma_free(g, (char *)p + 8191), GMA_ERR_INVALID_POINTER);
  /* The interior frees did not free p: its free still works, once. */
  CHECK_OK(gma_free(g, p));
  CHECK_FAILS(g, gma_free(g, p), GMA_ERR_DOUBLE_FREE);
  CHECK_FAILS(g, gma_free(g, p), GMA_ERR_DOUBLE_FREE);

  /* A large block too (the large pool may track blocks differently). */
  void *big = NULL;
  CHECK_OK(gma_alloc(g, 25 * MiB, NULL, &big));
  CHECK_FAILS(g, gma_free(g, (char *)big + 256), GMA_ERR_INVALID_POINTER);
  CHECK_OK(gma_free(g, big));
  CHECK_FAILS(g, gma_free(g, big), GMA_ERR_DOUBLE_FREE);

  /* The live neighbour is untouched by all of it. */
  memset(keep, 1, 8192);
  CHECK_OK(gma_free(g, keep));
  CHECK_FAILS(g, gma_free(g, keep), GMA_ERR_DOUBLE_FREE);

  gma_stats_t s = stats_of(g);
  CHECK(s.num_allocs == 3 && s.num_frees == 3 && s.allocated.current == 0);
  CHECK(s.reserved.current ==
        s.allocated.current + s.stream_cached_bytes + s.pending_bytes + s.free_bytes);
  check_works(g);
  free(heap);
  CHECK_OK(gma_destroy(g));
}

/* A pointer of one allocator is foreign to another. */
static void test_other_allocator(void) {
  gma_t *g1 = new_sim(0), *g2 = new_sim(0);
  void *p = NULL;
  CHECK_OK(gma_alloc(g1, 4096, NULL, &p));
  CHECK_FAILS(g2, gma_free(g2, p), GMA_ERR_INVALID_POINTER);
  CHECK_FAILS(g2, gma_record_stream(g2, p, NULL), GMA_ERR_INVALID_POINTER);
  CHECK_OK(gma_free(g1, p));
  CHECK_OK(gma_destroy(g2));
  CHECK_OK(gma_destroy(g1));
}

static void test_record_stream_errors(void) {
  gma_t *g = new_sim(0);
  gma_stream_t s = NULL;
  CHECK_OK(gma_stream_create(g, &s));
  int on_stack = 0;
  CHECK_FAILS(g, gma_record_stream(g, &on_stack, s), GMA_ERR_INVALID_POINTER);
  void *p = NULL;
  CHECK_OK(gma_alloc(g, 4096, NULL, &p));
  /* Any pointer inside a live allocation names the whole allocation. */
  CHECK_OK(gma_record_stream(g, (char *)p + 512, s));
  CHECK_OK(gma_record_stream(g, (char *)p + 4095, s));
  CHECK_FAILS(g, gma_record_stream(g, (char *)p + 8192, s), GMA_ERR_INVALID_POINTER); /* past it */
  CHECK_OK(gma_record_stream(g, p, s));
  /* Recording the allocation's own stream, or the same stream twice, is harmless. */
  CHECK_OK(gma_record_stream(g, p, NULL));
  CHECK_OK(gma_record_stream(g, p, s));
  CHECK_OK(gma_free(g, p));
  CHECK_FAILS(g, gma_record_stream(g, p, s), GMA_ERR_INVALID_POINTER);
  CHECK_FAILS(g, gma_record_stream(g, (char *)p + 512, s), GMA_ERR_INVALID_POINTER); /* freed */
  CHECK_FAILS(g, gma_record_stream(NULL, p, s), GMA_ERR_INVALID_ARGUMENT);
  CHECK_OK(gma_stream_synchronize(g, s));
  CHECK_OK(gma_stream_destroy(g, s));
  check_works(g);
  CHECK_OK(gma_destroy(g));
}

/* Destroying with live allocations frees them and reports the leak; the
 * sanitizers then check that nothing really leaked. */
static void test_leak_at_destroy(void) {
  gma_t *g = new_sim(0);
  void *p = NULL, *q = NULL, *r = NULL;
  CHECK_OK(gma_alloc(g, 4096, NULL, &p));
  CHECK_OK(gma_alloc(g, 30 * MiB, NULL, &q));
  gma_stream_t s = NULL;
  CHECK_OK(gma_stream_create(g, &s));
  CHECK_OK(gma_alloc(g, 100000, s, &r));
  CHECK_OK(gma_free(g, p));
  fprintf(stderr, "test_errors: a leak report from gma follows; it is expected\n");
  CHECK_ST(gma_destroy(g), GMA_ERR_LEAK);
  check_last_error(__LINE__);
}

/* The last error is per thread: another thread's failure does not replace
 * this thread's message, and a new thread starts with "". */
static void *fail_on_other_thread(void *arg) {
  gma_t *g = arg;
  if (gma_last_error()[0] != '\0') return (void *)"a new thread's last error is not empty";
  void *p = NULL;
  if (gma_alloc(g, 0, NULL, &p) != GMA_ERR_INVALID_SIZE) return (void *)"size 0 did not fail";
  if (gma_last_error()[0] == '\0') return (void *)"no message after a failure";
  return NULL;
}

static void test_last_error_per_thread(void) {
  gma_t *g = new_sim(0);
  int on_stack = 0;
  CHECK_ST(gma_free(g, &on_stack), GMA_ERR_INVALID_POINTER);
  char mine[1024];
  snprintf(mine, sizeof mine, "%s", gma_last_error());
  CHECK(mine[0] != '\0');
  pthread_t t;
  void *res = NULL;
  CHECK(pthread_create(&t, NULL, fail_on_other_thread, g) == 0);
  CHECK(pthread_join(t, &res) == 0);
  if (res) {
    fprintf(stderr, "other thread: %s\n", (const char *)res);
    exit(1);
  }
  CHECK(strcmp(gma_last_error(), mine) == 0);
  /* A successful call leaves the message of the last failure in place. */
  check_works(g);
  CHECK(strcmp(gma_last_error(), mine) == 0);
  CHECK_OK(gma_destroy(g));
}

static void no_op_kernel(void *arg) { (void)arg; }

/* Streams that no longer exist are refused with a message, not a crash. */
static void test_destroyed_stream(void) {
  gma_t *g = new_sim(0);
  gma_stream_t s = NULL;
  CHECK_OK(gma_stream_create(g, &s));
  CHECK_OK(gma_stream_destroy(g, s));
  gma_stats_t before = stats_of(g);
  CHECK(gma_stream_destroy(g, s) != GMA_OK);
  check_last_error(__LINE__);
  CHECK(gma_stream_synchronize(g, s) != GMA_OK);
  check_last_error(__LINE__);
  CHECK(gma_sim_launch(g, s, no_op_kernel, NULL) != GMA_OK);
  check_last_error(__LINE__);
  gma_stats_t after = stats_of(g);
  check_unchanged(&before, &after, __LINE__);
  check_works(g);
  CHECK_OK(gma_destroy(g));
}

int main(void) {
  test_null_arguments();
  test_invalid_sizes();
  test_oom_and_recovery();
  test_oom_many_small();
  test_injected_device_failure();
  test_bad_frees();
  test_other_allocator();
  test_record_stream_errors();
  test_last_error_per_thread();
  test_destroyed_stream();
  test_leak_at_destroy();
  printf("test_errors: ok\n");
  return 0;
}
