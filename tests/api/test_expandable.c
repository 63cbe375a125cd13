/* Growable segments (expandable_segments:true) on the simulated device, whose
 * chunks are real mappings of a reserved host range: growth in granularity
 * steps, blocks coalescing across chunks, trimming that unmaps the inside of
 * free blocks (never a chunk whose stream work is still running: an unmapped
 * page under a kernel would crash this test), memory_limit, injected map
 * failures, and a growing workload that does not fragment. Public API only. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "simkit.h"

#define MiB ((size_t)1 << 20)
#define GRAN (2 * MiB) /* the simulated device's granularity */

static gma_t *expandable(const char *extra) {
  char conf[256];
  /* A key may appear once per string: the default capacity unless extra names one. */
  bool own_capacity = extra && strstr(extra, "sim_capacity:");
  snprintf(conf, sizeof conf, "expandable_segments:true,worker:off%s%s%s",
           own_capacity ? "" : ",sim_capacity:1G", extra ? "," : "", extra ? extra : "");
  return sim_allocator(conf);
}

static void *alloc_on(gma_t *g, size_t size, gma_stream_t s) {
  void *p = NULL;
  CHECK_OK(gma_alloc(g, size, s, &p));
  memset(p, 0x5a, size); /* the memory is really mapped */
  return p;
}

/* Frees become reusable elsewhere once the stream's work is done. */
static void settle(gma_t *g, gma_stream_t s) { CHECK_OK(gma_stream_synchronize(g, s)); }

static void grows_by_chunks_and_coalesces(void) {
  gma_t *g = expandable(NULL);
  void *a = alloc_on(g, 3 * MiB, NULL);
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current == 2 * GRAN && s.num_device_allocs == 2);
  /* The second 3 MiB starts in the first's last chunk and needs one more. */
  void *b = alloc_on(g, 3 * MiB, NULL);
  s = stats_of(g);
  CHECK(s.reserved.current == 3 * GRAN && s.num_device_allocs == 3);
  CHECK((char *)b == (char *)a + 3 * MiB);
  CHECK(s.reserved.current == s.allocated.current); /* nothing wasted */
  CHECK(s.num_segments == 1);
  /* Freed, the two coalesce into one block spanning three chunks. */
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_free(g, b));
  settle(g, NULL);
  CHECK_OK(gma_empty_cache(g)); /* drains and trims: everything unmaps */
  s = stats_of(g);
  CHECK(s.reserved.current == 0 && s.num_device_frees == 3 && s.num_segments == 0);
  a = alloc_on(g, 3 * MiB, NULL);
  b = alloc_on(g, 3 * MiB, NULL);
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_free(g, b));
  settle(g, NULL);
  uint64_t maps = stats_of(g).num_device_allocs;
  void *c = alloc_on(g, 6 * MiB, NULL); /* spans all three chunks: no new mapping */
  s = stats_of(g);
  CHECK(s.num_device_allocs == maps && s.reserved.current == 3 * GRAN);
  CHECK(c == a);
  CHECK_OK(gma_free(g, c));
  CHECK_OK(gma_destroy(g));
}

/* Trimming cuts the chunks inside a free block out, splitting the segment;
 * the live neighbours keep their memory and contents. */
static void trim_splits_segments(void) {
  gma_t *g = expandable(NULL);
  char *a = alloc_on(g, 3 * MiB, NULL), *b = alloc_on(g, 4 * MiB, NULL),
       *c = alloc_on(g, 3 * MiB, NULL);
  memset(a, 1, 3 * MiB);
  memset(c, 3, 3 * MiB);
  CHECK(stats_of(g).reserved.current == 5 * GRAN);
  CHECK_OK(gma_free(g, b)); /* [3, 7) MiB: the chunk [4, 6) lies wholly inside */
  settle(g, NULL);
  CHECK_OK(gma_trim(g, 0));
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current == 4 * GRAN && s.num_segments == 2);
  for (size_t i = 0; i < 3 * MiB; i += 4096) CHECK(a[i] == 1 && c[i] == 3);
  /* The hole is used again, and the pieces around it are usable too. */
  void *d = alloc_on(g, 1 * MiB + 512 * 1024, NULL);
  void *e = alloc_on(g, 4 * MiB, NULL);
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_free(g, c));
  CHECK_OK(gma_free(g, d));
  CHECK_OK(gma_free(g, e));
  settle(g, NULL);
  CHECK_OK(gma_trim(g, 0));
  s = stats_of(g);
  CHECK(s.reserved.current == 0 && s.num_segments == 0 && s.allocated.current == 0);
  CHECK_OK(gma_destroy(g));
}

/* A block freed while its stream's kernel still runs stays mapped through a
 * trim; the kernel finds its pattern intact (an unmap would have crashed it).
 * A block whose work finished is unmapped by the same trim. */
static void trim_waits_for_stream_work(void) {
  gma_t *g = expandable(NULL);
  gma_stream_t s1, s2;
  CHECK_OK(gma_stream_create(g, &s1));
  CHECK_OK(gma_stream_create(g, &s2));
  void *busy = alloc_on(g, 4 * MiB, s1);
  atomic_int gate = 0, corruptions = 0;
  pattern_kernel_t k = {.buf = busy, .len = 4 * MiB, .value = 7, .gate = &gate,
                        .corruptions = &corruptions};
  CHECK_OK(gma_sim_launch(g, s1, pattern_kernel_run, &k));
  pattern_kernel_wait_started(&k);
  CHECK_OK(gma_free(g, busy)); /* stream-ordered: the kernel still owns it */
  void *done = alloc_on(g, 4 * MiB, s2);
  CHECK_OK(gma_free(g, done));
  settle(g, s2);
  CHECK_OK(gma_trim(g, 0));
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current == 2 * GRAN); /* only the idle block's chunks went */
  atomic_store(&gate, 1);
  settle(g, s1);
  CHECK(atomic_load(&corruptions) == 0);
  CHECK_OK(gma_trim(g, 0));
  CHECK(stats_of(g).reserved.current == 0);
  CHECK_OK(gma_stream_destroy(g, s1));
  CHECK_OK(gma_stream_destroy(g, s2));
  CHECK_OK(gma_destroy(g));
}

/* Growth gives back free chunks that are too scattered for the request
 * first, so reserved memory follows what is live instead of keeping the
 * holes beside the new chunks. */
static void growth_releases_scattered_chunks(void) {
  gma_t *g = expandable(NULL);
  void *a = alloc_on(g, 4 * MiB, NULL), *b = alloc_on(g, 4 * MiB, NULL),
       *c = alloc_on(g, 4 * MiB, NULL), *d = alloc_on(g, 4 * MiB, NULL);
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_free(g, c)); /* two 4 MiB holes: no room for 10 MiB */
  settle(g, NULL);
  CHECK(stats_of(g).reserved.current == 16 * MiB);
  void *e = alloc_on(g, 10 * MiB, NULL);
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current == 18 * MiB); /* b + d + e: the holes went back */
  CHECK(s.num_device_frees == 4);
  memset(b, 1, 4 * MiB);
  memset(d, 2, 4 * MiB);
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_free(g, d));
  CHECK_OK(gma_free(g, e));
  CHECK_OK(gma_destroy(g));
}

static void limit_and_faults(void) {
  gma_t *g = expandable("memory_limit:8M");
  void *a = alloc_on(g, 6 * MiB, NULL), *b = NULL;
  CHECK_ST(gma_alloc(g, 4 * MiB, NULL, &b), GMA_ERR_OOM);
  CHECK(strstr(gma_last_error(), "memory_limit") != NULL);
  CHECK_OK(gma_free(g, a));
  settle(g, NULL);
  b = alloc_on(g, 8 * MiB, NULL); /* the free 6 MiB grow by one chunk */
  CHECK(b == a && stats_of(g).reserved.current == 8 * MiB);
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_destroy(g));

  /* The third chunk map fails: the allocation fails whole, nothing stays
   * mapped, and the next attempt works. */
  g = expandable("sim_fail_alloc:3");
  CHECK_ST(gma_alloc(g, 6 * MiB, NULL, &a), GMA_ERR_DEVICE);
  CHECK(strstr(gma_last_error(), "injected") != NULL);
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current == 0 && s.num_device_allocs == 0);
  a = alloc_on(g, 6 * MiB, NULL);
  CHECK(stats_of(g).reserved.current == 6 * MiB);
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_destroy(g));

  /* Real device OOM: cached free chunks are unmapped and the request retried. */
  g = expandable("sim_capacity:16M");
  a = alloc_on(g, 10 * MiB, NULL);
  CHECK_OK(gma_free(g, a));
  settle(g, NULL);
  void *small = alloc_on(g, 2 * MiB, NULL); /* takes the first chunk of the free block */
  b = alloc_on(g, 12 * MiB, NULL); /* needs the 8 free MiB unmapped and mapped again */
  s = stats_of(g);
  CHECK(s.num_oom_retries >= 1 || s.reserved.current <= 16 * MiB);
  CHECK(s.reserved.current <= 16 * MiB);
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_free(g, small));
  CHECK_OK(gma_destroy(g));
}

/* A workload whose requests keep growing (as a sequence length does):
 * ordinary segments leave the earlier, smaller ones behind, growable ones
 * extend the same free block. */
static uint64_t growing_workload(const char *conf) {
  gma_t *g = sim_allocator(conf);
  for (size_t mb = 11; mb <= 40; mb += 3) {
    void *p = alloc_on(g, mb * MiB, NULL);
    CHECK_OK(gma_free(g, p));
    settle(g, NULL);
  }
  uint64_t peak = stats_of(g).reserved.peak;
  CHECK_OK(gma_destroy(g));
  return peak;
}

static void growing_does_not_fragment(void) {
  uint64_t plain = growing_workload("worker:off,sim_capacity:1G");
  uint64_t grow = growing_workload("worker:off,sim_capacity:1G,expandable_segments:true");
  printf("growing workload: peak reserved %llu MiB with ordinary segments, %llu MiB growable\n",
         (unsigned long long)(plain / MiB), (unsigned long long)(grow / MiB));
  CHECK(grow == 38 * MiB); /* exactly the largest request (11, 14, ... 38 MiB) */
  CHECK(plain > grow);
}

static void batch_and_async(void) {
  gma_t *g = sim_allocator("expandable_segments:true,sim_capacity:1G");
  size_t sizes[8];
  void *ptrs[8];
  for (int i = 0; i < 8; i++) sizes[i] = (size_t)(i + 1) * MiB;
  CHECK_OK(gma_alloc_batch(g, 8, sizes, NULL, ptrs));
  for (int i = 0; i < 8; i++) memset(ptrs[i], i, sizes[i]);
  CHECK(stats_of(g).reserved.current == 36 * MiB);
  gma_future_t *f = NULL;
  CHECK_OK(gma_alloc_async(g, 5 * MiB, NULL, NULL, &f));
  void *p = NULL;
  CHECK_OK(gma_future_wait(f, 1000000000ull, &p));
  memset(p, 1, 5 * MiB);
  CHECK_OK(gma_future_release(f));
  CHECK_OK(gma_free(g, p));
  for (int i = 0; i < 8; i++) CHECK_OK(gma_free(g, ptrs[i]));
  settle(g, NULL);
  CHECK_OK(gma_empty_cache(g));
  CHECK(stats_of(g).reserved.current == 0);
  CHECK_OK(gma_destroy(g));
}

int main(void) {
  grows_by_chunks_and_coalesces();
  trim_splits_segments();
  trim_waits_for_stream_work();
  growth_releases_scattered_chunks();
  limit_and_faults();
  growing_does_not_fragment();
  batch_and_async();
  printf("test_expandable: ok\n");
  return 0;
}
