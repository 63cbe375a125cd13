/* API test of the basics, through gma.h alone: the status table, the version,
 * creating and destroying allocators, allocating and freeing on the default
 * stream and on created streams, alignment, rounding to 512 bytes, that block
 * memory is usable for its whole size, and that a block freed on a stream is
 * reused on that stream without a new device allocation, and that a small
 * request takes a small hole of the large pool before the small pool grows,
 * draining no stream's bins while the pool holds less than half the device. */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "gma.h"

static gma_t *new_sim_with(gma_segments_t segments) {
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1; /* the test must not depend on the caller's environment */
  c.expandable_segments = segments;
  gma_t *g = NULL;
  CHECK_OK(gma_create(&c, &g));
  CHECK(g != NULL);
  return g;
}

static gma_t *new_sim(void) { return new_sim_with(GMA_SEGMENTS_AUTO); }

/* Every status of the X-macro has its own name and a non-empty text; values
 * outside the map get the documented placeholder rather than NULL, so callers
 * can print any int they were handed. */
static void test_status_table(void) {
#define CHECK_STATUS_(name, value, text)                       \
  CHECK((int)name == (value));                                 \
  CHECK(strcmp(gma_status_name(name), #name) == 0);            \
  CHECK(strcmp(gma_strerror(name), text) == 0);                \
  CHECK(strlen(gma_strerror(name)) > 0);
  GMA_STATUS_MAP(CHECK_STATUS_)
#undef CHECK_STATUS_

  /* Statuses are 0 for success, negative for errors, and positive only for
   * GMA_PENDING, a future's "not complete yet", which is not an error. */
#define CHECK_SIGN_(name, value, text) \
  CHECK((name == GMA_OK) == ((value) == 0) && ((value) <= 0 || name == GMA_PENDING));
  GMA_STATUS_MAP(CHECK_SIGN_)
#undef CHECK_SIGN_

  const gma_status_t unknown[] = {(gma_status_t)2, (gma_status_t)-99, (gma_status_t)-1000,
                                  (gma_status_t)INT32_MAX};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    CHECK(strcmp(gma_status_name(unknown[i]), "GMA_UNKNOWN_STATUS") == 0);
    CHECK(gma_strerror(unknown[i]) != NULL && gma_strerror(unknown[i])[0] != '\0');
  }
}

static void test_version(void) {
  CHECK(strcmp(gma_version(), GMA_VERSION_STRING) == 0);
  CHECK(GMA_VERSION_NUMBER ==
        GMA_VERSION_MAJOR * 10000 + GMA_VERSION_MINOR * 100 + GMA_VERSION_PATCH);
  /* "major.minor.patch": three numbers separated by two dots. */
  unsigned a, b, c;
  char tail;
  CHECK(sscanf(gma_version(), "%u.%u.%u%c", &a, &b, &c, &tail) == 3);
  CHECK(a == GMA_VERSION_MAJOR && b == GMA_VERSION_MINOR && c == GMA_VERSION_PATCH);
}

static void test_create_destroy(void) {
  /* Several allocators may live at once and are independent. */
  gma_t *g1 = new_sim();
  gma_t *g2 = new_sim();
  CHECK(g1 != g2);
  CHECK(strcmp(gma_device_name(g1), "sim") == 0);
  gma_stats_t s = stats_of(g1);
  CHECK(s.allocated.current == 0 && s.num_allocs == 0 && s.num_frees == 0);
  CHECK_OK(gma_destroy(g2));
  CHECK_OK(gma_destroy(g1));
  /* Destroying NULL is a no-op, like free(NULL). */
  CHECK_OK(gma_destroy(NULL));

  /* Create and destroy in a loop: nothing may accumulate (ASan/LSan watch). */
  for (int i = 0; i < 20; i++) {
    gma_t *g = new_sim();
    void *p = NULL;
    CHECK_OK(gma_alloc(g, 1000, NULL, &p));
    CHECK_OK(gma_free(g, p));
    CHECK_OK(gma_destroy(g));
  }
}

/* Allocates sizes from 1 byte to 8 MiB on the default stream; each pointer is
 * 256-byte aligned, distinct from the other live ones, and writable for the
 * whole size (the simulated device's memory is host memory). */
static void test_alloc_free_alignment(void) {
  gma_t *g = new_sim();
  static const size_t sizes[] = {1,      2,       255,     256,       257,       511,
                                 512,    513,     1000,    4096,      65536,     100000,
                                 1 << 20, (1 << 20) + 1, 3 << 20, (8 << 20) - 1, 8 << 20};
  enum { N = sizeof sizes / sizeof sizes[0] };
  void *ptrs[N];
  for (size_t i = 0; i < N; i++) {
    ptrs[i] = NULL;
    CHECK_OK(gma_alloc(g, sizes[i], NULL, &ptrs[i]));
    CHECK(ptrs[i] != NULL);
    CHECK((uintptr_t)ptrs[i] % 256 == 0);
    memset(ptrs[i], (int)(i + 1), sizes[i]);
  }
  /* Blocks must not overlap: every byte still holds its block's value. */
  for (size_t i = 0; i < N; i++) {
    const unsigned char *b = ptrs[i];
    for (size_t k = 0; k < sizes[i]; k++) CHECK(b[k] == (unsigned char)(i + 1));
    for (size_t j = 0; j < i; j++) CHECK(ptrs[i] != ptrs[j]);
  }
  gma_stats_t s = stats_of(g);
  CHECK(s.num_allocs == N && s.num_frees == 0);
  for (size_t i = 0; i < N; i++) CHECK_OK(gma_free(g, ptrs[i]));
  s = stats_of(g);
  CHECK(s.num_frees == N && s.allocated.current == 0 && s.requested.current == 0);
  CHECK_OK(gma_destroy(g));
}

/* Sizes up to bin_max (1 MiB) get their size class: 512-byte steps up to
 * 4 KiB, then 8 classes per doubling up to 64 KiB and 16 up to 1 MiB; larger
 * ones are rounded up to a multiple of 512. allocated counts block sizes,
 * requested what the caller asked for. */
static void test_rounding(void) {
  static const struct {
    size_t ask, rounded;
  } cases[] = {{1, 512}, {511, 512}, {512, 512}, {513, 1024}, {1536, 1536},
               {4097, 4608}, {5000, 5120}, {70000, 73728}, {(512 << 10) + 1, 557056},
               {(1 << 20) + 1, (1 << 20) + 512}, {(4 << 20) + 1, (4 << 20) + 512}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    /* A fresh allocator each time, so no cached block larger than needed can
     * serve the request and blur the rounded size. */
    gma_t *g = new_sim();
    void *p = NULL;
    CHECK_OK(gma_alloc(g, cases[i].ask, NULL, &p));
    gma_stats_t s = stats_of(g);
    if (s.allocated.current != cases[i].rounded)
      fprintf(stderr, "ask %zu: allocated %llu, expected %zu\n", cases[i].ask,
              (unsigned long long)s.allocated.current, cases[i].rounded);
    CHECK(s.allocated.current == cases[i].rounded);
    CHECK(s.requested.current == cases[i].ask);
    CHECK(s.allocated.current % 512 == 0);
    CHECK_OK(gma_free(g, p));
    CHECK_OK(gma_destroy(g));
  }
}

/* alloc, free, alloc of one size on one stream is served from that stream's
 * cache (its lock-free bin up to bin_max, its tree in the pool above): stream
 * order makes the block safe at once, so no device allocation and no waiting
 * is needed. Checked on the default stream and a created one. */
static void test_reuse_same_stream(void) {
  gma_t *g = new_sim();
  gma_stream_t created = NULL;
  CHECK_OK(gma_stream_create(g, &created));
  gma_stream_t streams[2] = {NULL, created};
  const size_t sizes[] = {4096, 2 << 20, 24 << 20};
  for (int si = 0; si < 2; si++) {
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
      void *p = NULL, *q = NULL;
      CHECK_OK(gma_alloc(g, sizes[k], streams[si], &p));
      CHECK_OK(gma_free(g, p));
      gma_stats_t before = stats_of(g);
      CHECK_OK(gma_alloc(g, sizes[k], streams[si], &q));
      gma_stats_t after = stats_of(g);
      CHECK(after.hits_bin + after.hits_stream == before.hits_bin + before.hits_stream + 1);
      CHECK(sizes[k] > (1u << 20) || after.hits_bin == before.hits_bin + 1); /* bin_max */
      CHECK(after.num_device_allocs == before.num_device_allocs);
      CHECK(after.hits_device == before.hits_device);
      /* With one cached block of exactly this size, best fit finds that one. */
      CHECK(q == p);
      CHECK_OK(gma_free(g, q));
    }
  }
  CHECK_OK(gma_stream_synchronize(g, created));
  CHECK_OK(gma_stream_destroy(g, created));
  CHECK_OK(gma_destroy(g));
}

/* A steady loop of alloc/free of a few sizes reaches a fixed footprint: after
 * the first round no new segment is taken from the device. */
static void test_steady_state(void) {
  gma_t *g = new_sim();
  const size_t sizes[] = {512, 3000, 70000, 1 << 20, 5 << 20};
  enum { NS = sizeof sizes / sizeof sizes[0] };
  void *p[NS];
  uint64_t device_allocs_after_first = 0;
  for (int round = 0; round < 50; round++) {
    for (int i = 0; i < NS; i++) CHECK_OK(gma_alloc(g, sizes[i], NULL, &p[i]));
    for (int i = NS - 1; i >= 0; i--) CHECK_OK(gma_free(g, p[i]));
    gma_stats_t s = stats_of(g);
    if (round == 0) device_allocs_after_first = s.num_device_allocs;
    CHECK(s.num_device_allocs == device_allocs_after_first);
  }
  gma_stats_t s = stats_of(g);
  CHECK(s.num_allocs == 50 * NS && s.num_frees == 50 * NS);
  CHECK(s.hits_bin + s.hits_stream + s.hits_pool + s.hits_device == s.num_allocs);
  CHECK_OK(gma_destroy(g));
}

static void test_streams(void) {
  gma_t *g = new_sim();
  gma_stream_t s[4];
  for (int i = 0; i < 4; i++) {
    CHECK_OK(gma_stream_create(g, &s[i]));
    for (int j = 0; j < i; j++) CHECK(s[i] != s[j]);
  }
  void *p[4];
  for (int i = 0; i < 4; i++) CHECK_OK(gma_alloc(g, 10000, s[i], &p[i]));
  for (int i = 0; i < 4; i++) CHECK_OK(gma_free(g, p[i]));
  for (int i = 0; i < 4; i++) CHECK_OK(gma_stream_synchronize(g, s[i]));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  for (int i = 0; i < 4; i++) CHECK_OK(gma_stream_destroy(g, s[i]));
  CHECK_OK(gma_destroy(g));
}

static void mark(void *arg) { *(int *)arg += 1; }

/* Kernels on one stream run in order, and synchronize waits for them. */
static void test_sim_launch(void) {
  gma_t *g = new_sim();
  gma_stream_t s = NULL;
  CHECK_OK(gma_stream_create(g, &s));
  int counter = 0;
  for (int i = 0; i < 100; i++) CHECK_OK(gma_sim_launch(g, s, mark, &counter));
  CHECK_OK(gma_stream_synchronize(g, s));
  CHECK(counter == 100);
  counter = 0;
  CHECK_OK(gma_sim_launch(g, NULL, mark, &counter));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK(counter == 1);
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_destroy(g));
}

/* gma_empty_cache hands segments without live blocks back once their work is
 * known done; with no work ever queued that must happen soon. */
static void test_empty_cache(void) {
  gma_t *g = new_sim();
  void *p = NULL;
  CHECK_OK(gma_alloc(g, 3 << 20, NULL, &p));
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current > 0);
  /* empty_cache never waits for the device, so the epoch of the free may need
   * a few rounds to be observed complete. */
  for (int i = 0; i < 2000 && s.reserved.current != 0; i++) {
    CHECK_OK(gma_empty_cache(g));
    s = stats_of(g);
    if (s.reserved.current != 0) {
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
  }
  CHECK(s.reserved.current == 0);
  CHECK(s.num_segments == 0);
  CHECK(s.num_device_frees == s.num_device_allocs);
  /* The allocator still works after giving everything back. */
  CHECK_OK(gma_alloc(g, 1000, NULL, &p));
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_destroy(g));
}

/* A small request that would grow the small pool takes a FREE block of the
 * large pool when less than a small segment (2 MiB) would be left of it;
 * a larger hole is left to large requests, and the small pool grows. */
static void test_small_fills_large_holes(void) {
  gma_t *g = new_sim_with(GMA_SEGMENTS_ORDINARY); /* counts ordinary segments */
  const size_t MiB = (size_t)1 << 20;
  void *a, *b, *c, *s1, *s2;
  CHECK_OK(gma_alloc(g, 9 * MiB, NULL, &a)); /* one shared 20 MiB segment */
  CHECK_OK(gma_alloc(g, 9 * MiB, NULL, &b));
  CHECK_OK(gma_alloc(g, 3 * MiB / 2, NULL, &c)); /* 0.5 MiB left at its end */
  gma_stats_t st = GMA_STATS_INIT;
  CHECK_OK(gma_stats(g, &st));
  CHECK(st.num_device_allocs == 1 && st.reserved.current == 20 * MiB);
  CHECK_OK(gma_alloc(g, 256 * 1024, NULL, &s1));
  CHECK_OK(gma_stats(g, &st));
  CHECK(st.num_device_allocs == 1 && st.reserved.current == 20 * MiB);
  CHECK((char *)s1 == (char *)c + 3 * MiB / 2); /* in the hole */
  memset(s1, 1, 256 * 1024);
  CHECK_OK(gma_free(g, a)); /* a 9 MiB hole: too large to give a small request */
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK_OK(gma_alloc(g, 512 * 1024, NULL, &s2));
  CHECK_OK(gma_stats(g, &st));
  CHECK(st.num_device_allocs == 2 && st.reserved.current == 22 * MiB); /* a small segment */
  CHECK((uintptr_t)s2 < (uintptr_t)a || (uintptr_t)s2 >= (uintptr_t)a + 20 * MiB);
  CHECK_OK(gma_free(g, s1));
  CHECK_OK(gma_free(g, s2));
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_free(g, c));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK_OK(gma_empty_cache(g)); /* the hole's block went back and coalesced */
  CHECK_OK(gma_stats(g, &st));
  CHECK(st.reserved.current == 0 && st.allocated.current == 0);
  CHECK_OK(gma_destroy(g));
}

/* While the pool holds less than half its limit, a small miss that a small
 * hole of the large pool serves leaves every stream's bins alone: another
 * stream's binned block is still a bin hit afterwards (a training loop's
 * small misses would otherwise empty the bins at every step). Above half,
 * memory comes first: the bins are drained into the pool before the hole is
 * taken, so the binned block is no longer in its bin. */
static void small_miss_bins(uint64_t limit, int want_bin_hit) {
  gma_config_t cfg = GMA_CONFIG_INIT;
  cfg.device = GMA_DEVICE_SIM;
  cfg.ignore_env = 1;
  cfg.memory_limit = limit;
  cfg.expandable_segments = GMA_SEGMENTS_ORDINARY; /* one 20 MiB segment, counted */
  gma_t *g = NULL;
  CHECK_OK(gma_create(&cfg, &g));
  const size_t MiB = (size_t)1 << 20;
  gma_stream_t sa, sb;
  CHECK_OK(gma_stream_create(g, &sa));
  CHECK_OK(gma_stream_create(g, &sb));
  void *a, *b, *c, *x, *y, *x2;
  CHECK_OK(gma_alloc(g, 9 * MiB, sa, &a)); /* one 20 MiB segment, 0.5 MiB left */
  CHECK_OK(gma_alloc(g, 9 * MiB, sa, &b));
  CHECK_OK(gma_alloc(g, 3 * MiB / 2, sa, &c));
  CHECK_OK(gma_alloc(g, 4096, sa, &x)); /* from the 0.5 MiB hole */
  CHECK_OK(gma_free(g, x));             /* into sa's bin */
  gma_stats_t st = GMA_STATS_INIT;
  CHECK_OK(gma_stats(g, &st));
  uint64_t bin_hits = st.hits_bin;
  CHECK_OK(gma_alloc(g, 256 * 1024, sb, &y)); /* a miss: the rest of the hole */
  CHECK_OK(gma_alloc(g, 4096, sa, &x2));
  CHECK_OK(gma_stats(g, &st));
  CHECK(st.num_device_allocs == 1); /* neither small request grew the pool */
  CHECK((st.hits_bin == bin_hits + 1) == want_bin_hit);
  CHECK_OK(gma_free(g, x2));
  CHECK_OK(gma_free(g, y));
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_free(g, c));
  CHECK_OK(gma_stream_destroy(g, sa));
  CHECK_OK(gma_stream_destroy(g, sb));
  CHECK_OK(gma_destroy(g));
}

static void test_small_miss_keeps_bins(void) {
  small_miss_bins((uint64_t)1 << 30, 1); /* 20 MiB of 1 GiB: roomy */
  small_miss_bins((uint64_t)32 << 20, 0); /* 20 MiB of 32 MiB: above half */
}

int main(void) {
  /* Before any gma call failed on this thread, the last error is empty. */
  CHECK(gma_last_error() != NULL && gma_last_error()[0] == '\0');
  test_status_table();
  test_version();
  test_create_destroy();
  test_alloc_free_alignment();
  test_rounding();
  test_reuse_same_stream();
  test_steady_state();
  test_streams();
  test_sim_launch();
  test_empty_cache();
  test_small_fills_large_holes();
  test_small_miss_keeps_bins();
  /* Nothing above failed, so the thread's last error is still empty. */
  CHECK(gma_last_error()[0] == '\0');
  printf("test_basic: ok (gma %s)\n", gma_version());
  return 0;
}
