/* Growable segments (expandable_segments:true) on the simulated device, whose
 * chunks are real mappings of a reserved host range: one map per growth
 * (the shortfall rounded to the granularity, or the kind's minimum chunk),
 * blocks coalescing across chunks, trimming that unmaps the whole chunks
 * inside free blocks (never a chunk partly in use, nor one whose stream work
 * is still running: an unmapped page under a kernel would crash this test),
 * memory_limit, injected map failures, a growing workload that does not
 * fragment, and map calls per GiB on a synthetic training-like workload.
 * Public API only. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "simkit.h"

#define MiB ((size_t)1 << 20)
#define GRAN (2 * MiB) /* the simulated device's granularity */

/* Most tests look at the mapping mechanics one granule at a time: their
 * large minimum chunk is one granule (large_segment:2M), so a growth
 * maps exactly what it lacks. minimum_chunks tests the default. */
static gma_t *expandable(const char *extra) {
  char conf[256];
  /* A key may appear once per string: the default capacity unless extra names one. */
  bool own_capacity = extra && strstr(extra, "sim_capacity:");
  bool own_chunk = extra && strstr(extra, "large_segment:");
  snprintf(conf, sizeof conf, "expandable_segments:true,worker:off%s%s%s%s",
           own_capacity ? "" : ",sim_capacity:32G", own_chunk ? "" : ",large_segment:2M",
           extra ? "," : "", extra ? extra : "");
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

/* A block of size bytes on s, a pattern kernel held on it (*k, *gate and
 * *corruptions stay the caller's until the kernel ends: store 1 to *gate),
 * then freed: stream-ordered, the kernel still owns it. */
static void *freed_under_kernel(gma_t *g, gma_stream_t s, size_t size, pattern_kernel_t *k,
                                atomic_int *gate, atomic_int *corruptions) {
  void *p = alloc_on(g, size, s);
  *k = (pattern_kernel_t){.buf = p, .len = size, .value = 7, .gate = gate,
                          .corruptions = corruptions};
  CHECK_OK(gma_sim_launch(g, s, pattern_kernel_run, k));
  pattern_kernel_wait_started(k);
  CHECK_OK(gma_free(g, p));
  return p;
}

static void grows_by_chunks_and_coalesces(void) {
  gma_t *g = expandable(NULL);
  void *a = alloc_on(g, 3 * MiB, NULL); /* one map of two granules */
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current == 2 * GRAN && s.num_device_allocs == 1);
  /* The second 3 MiB starts in the first's free tail and maps the 2 MiB it
   * lacks, right after. */
  void *b = alloc_on(g, 3 * MiB, NULL);
  s = stats_of(g);
  CHECK(s.reserved.current == 3 * GRAN && s.num_device_allocs == 2);
  CHECK((char *)b == (char *)a + 3 * MiB);
  CHECK(s.reserved.current == s.allocated.current); /* nothing wasted */
  CHECK(s.num_segments == 1);
  /* Freed, the two coalesce into one block spanning three chunks. */
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_free(g, b));
  settle(g, NULL);
  CHECK_OK(gma_empty_cache(g)); /* drains and trims: everything unmaps */
  s = stats_of(g);
  CHECK(s.reserved.current == 0 && s.num_device_frees == 2 && s.num_segments == 0);
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

/* Trimming cuts the whole chunks inside a free block out, splitting the
 * segment; the live neighbours keep their memory and contents. */
static void trim_splits_segments(void) {
  gma_t *g = expandable(NULL);
  /* Three chunks, one per block, adjacent: one segment. */
  char *a = alloc_on(g, 4 * MiB, NULL), *b = alloc_on(g, 4 * MiB, NULL),
       *c = alloc_on(g, 4 * MiB, NULL);
  memset(a, 1, 4 * MiB);
  memset(c, 3, 4 * MiB);
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current == 12 * MiB && s.num_device_allocs == 3 && s.num_segments == 1);
  CHECK_OK(gma_free(g, b)); /* b's chunk is wholly free */
  settle(g, NULL);
  CHECK_OK(gma_trim(g, 0));
  s = stats_of(g);
  CHECK(s.reserved.current == 8 * MiB && s.num_segments == 2 && s.num_device_frees == 1);
  for (size_t i = 0; i < 4 * MiB; i += 4096) CHECK(a[i] == 1 && c[i] == 3);
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
  atomic_int gate = 0, corruptions = 0;
  pattern_kernel_t k;
  freed_under_kernel(g, s1, 4 * MiB, &k, &gate, &corruptions);
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

/* Growth maps new memory and leaves free chunks elsewhere mapped (a later
 * request may fit them; unmapping and mapping again would cost two device
 * calls each); when the device is short, the OOM retry gives the scattered
 * free chunks back and the growth succeeds. */
static void free_chunks_go_back_at_oom(void) {
  for (int tight = 0; tight < 2; tight++) {
    gma_t *g = expandable(tight ? "sim_capacity:20M" : NULL);
    void *a = alloc_on(g, 4 * MiB, NULL), *b = alloc_on(g, 4 * MiB, NULL),
         *c = alloc_on(g, 4 * MiB, NULL), *d = alloc_on(g, 4 * MiB, NULL);
    CHECK_OK(gma_free(g, a));
    CHECK_OK(gma_free(g, c)); /* two 4 MiB holes: no room for 10 MiB */
    settle(g, NULL);
    CHECK(stats_of(g).reserved.current == 16 * MiB);
    void *e = alloc_on(g, 10 * MiB, NULL);
    gma_stats_t s = stats_of(g);
    if (tight) {
      CHECK(s.reserved.current == 18 * MiB); /* b + d + e: the holes went back */
      CHECK(s.num_device_frees == 4);        /* a's two 2 MiB chunks and c's, whole */
      CHECK(s.num_oom_retries == 1 && s.num_ooms == 0);
    } else {
      CHECK(s.reserved.current == 26 * MiB && s.num_device_frees == 0);
      CHECK(s.num_oom_retries == 0);
    }
    memset(b, 1, 4 * MiB);
    memset(d, 2, 4 * MiB);
    CHECK_OK(gma_free(g, b));
    CHECK_OK(gma_free(g, d));
    CHECK_OK(gma_free(g, e));
    CHECK_OK(gma_destroy(g));
  }
}

/* With the default sizes a growth maps at least the kind's minimum chunk:
 * large_segment_size (20 MiB) for the large kind; for the small one a
 * quarter of what it has mapped, from one small segment (2 MiB) up to four
 * (8 MiB), so many growths share a map and a few small tensors map 2 MiB;
 * near the limit (a chunk more than 1/16 of what is left) a growth maps
 * only what it lacks. Under a 32 GiB limit every growth here is one map. */
static void minimum_chunks(void) {
  gma_t *g = sim_allocator("expandable_segments:true,worker:off,sim_capacity:32G");
  void *p[7];
  for (int i = 0; i < 6; i++) p[i] = alloc_on(g, 3 * MiB, NULL);
  gma_stats_t s = stats_of(g);
  CHECK(s.num_device_allocs == 1 && s.reserved.current == 20 * MiB);
  p[6] = alloc_on(g, 3 * MiB, NULL); /* 2 MiB left in the chunk: the next one extends it */
  s = stats_of(g);
  CHECK(s.num_device_allocs == 2 && s.reserved.current == 40 * MiB && s.num_segments == 1);
  CHECK((char *)p[6] == (char *)p[5] + 3 * MiB); /* across the chunk boundary */
  void *tiny = alloc_on(g, 512, NULL);
  s = stats_of(g);
  CHECK(s.num_device_allocs == 3 && s.reserved.current == 42 * MiB);
  /* More than a chunk: the 19 free MiB after p[6] and just the 82 MiB it
   * lacks, in one map (a piece is at least 1/256 of the 32 GiB limit). */
  void *big = alloc_on(g, 100 * MiB, NULL);
  s = stats_of(g);
  CHECK(s.num_device_allocs == 4 && s.reserved.current == 124 * MiB);
  CHECK((char *)big == (char *)p[6] + 3 * MiB);
  CHECK_OK(gma_free(g, big));
  CHECK_OK(gma_free(g, tiny));
  for (int i = 0; i < 7; i++) CHECK_OK(gma_free(g, p[i]));
  CHECK_OK(gma_destroy(g));

  /* 64 MiB device: 20 MiB is more than 1/16 of what is left, so growths map
   * their shortfall, one map per granule (1/256 of the limit is less), and
   * the workload fits to the granule. */
  g = sim_allocator("expandable_segments:true,worker:off,sim_capacity:64M");
  for (int i = 0; i < 7; i++) p[i] = alloc_on(g, 3 * MiB, NULL);
  /* 21 MiB in granules; the 512 bytes get a small chunk of their own, not
   * the 1 MiB free at the large pool's end (a small block there would pin
   * the large chunk under it). */
  tiny = alloc_on(g, 512, NULL);
  s = stats_of(g);
  CHECK(s.reserved.current == 24 * MiB && s.num_device_allocs == 12);
  CHECK((char *)tiny != (char *)p[6] + 3 * MiB);
  CHECK_OK(gma_free(g, tiny));
  for (int i = 0; i < 7; i++) CHECK_OK(gma_free(g, p[i]));
  CHECK_OK(gma_destroy(g));

  /* The small kind's chunk grows with it: 2 MiB while it holds less than
   * 16 MiB (a quarter of that is two granules), then 4, 6, 8 and no more. */
  g = sim_allocator("expandable_segments:true,worker:off,sim_capacity:32G");
  void *q[60];
  const uint64_t maps_at[] = {2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 30, 36, 44, 52, 60};
  size_t k = 0;
  uint64_t reserved = 0;
  for (size_t i = 0; i < 60; i++) {
    q[i] = alloc_on(g, 1 * MiB, NULL); /* the small pool's largest request */
    s = stats_of(g);
    if (s.reserved.current == reserved) continue;
    reserved = s.reserved.current; /* a growth: the next size in maps_at */
    CHECK(k < sizeof maps_at / sizeof maps_at[0] && reserved == maps_at[k] * MiB &&
          s.num_device_allocs == k + 1);
    k++;
  }
  CHECK(k == sizeof maps_at / sizeof maps_at[0]);
  for (size_t i = 0; i < 60; i++) CHECK_OK(gma_free(g, q[i]));
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

  /* The map fails: the allocation fails whole, nothing stays mapped, and
   * the next attempt works. */
  g = expandable("sim_fail_alloc:1");
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
  uint64_t plain = growing_workload("worker:off,sim_capacity:1G,expandable_segments:false");
  uint64_t grow = growing_workload("worker:off,sim_capacity:1G,expandable_segments:true");
  uint64_t exact = growing_workload(
      "worker:off,sim_capacity:1G,expandable_segments:true,large_segment:2M");
  printf("growing workload: peak reserved %llu MiB with ordinary segments, %llu MiB growable "
         "(%llu MiB with 2 MiB chunks)\n",
         (unsigned long long)(plain / MiB), (unsigned long long)(grow / MiB),
         (unsigned long long)(exact / MiB));
  CHECK(exact == 38 * MiB); /* exactly the largest request (11, 14, ... 38 MiB) */
  CHECK(grow == 40 * MiB);  /* two 20 MiB chunks */
  CHECK(plain > grow);
}

static void batch_and_async(void) {
  gma_t *g = sim_allocator("expandable_segments:true,sim_capacity:1G,large_segment:2M");
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

/* A trim gives back whole chunks only: a chunk with a live block in it stays
 * mapped (the device cannot unmap part of a mapping), a wholly free one goes. */
static void trim_keeps_partly_used_chunks(void) {
  gma_t *g = expandable(NULL);
  const size_t half = MiB / 2;
  char *a = alloc_on(g, 8 * MiB, NULL);        /* chunk A: [0, 8) */
  char *b = alloc_on(g, 4 * MiB + half, NULL); /* chunk B: [8, 14), b at [8, 12.5) */
  char *c = alloc_on(g, 4 * MiB, NULL);        /* B's free tail and chunk C [14, 18) */
  CHECK(b == a + 8 * MiB && c == b + 4 * MiB + half);
  gma_stats_t s = stats_of(g);
  CHECK(s.num_device_allocs == 3 && s.reserved.current == 18 * MiB);
  memset(b, 2, 4 * MiB + half);
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_free(g, c)); /* free: [0, 8) and [12.5, 18) */
  settle(g, NULL);
  CHECK_OK(gma_trim(g, 0));
  s = stats_of(g);
  /* A and C went back; B holds b and 1.5 free MiB, and stays. */
  CHECK(s.num_device_frees == 2 && s.reserved.current == 6 * MiB && s.num_segments == 1);
  for (size_t i = 0; i < 4 * MiB + half; i += 4096) CHECK(b[i] == 2);
  void *d = alloc_on(g, MiB + half, NULL); /* B's free part serves it: no map */
  CHECK(d == b + 4 * MiB + half && stats_of(g).num_device_allocs == 3);
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_free(g, d));
  settle(g, NULL);
  CHECK_OK(gma_trim(g, 0));
  CHECK(stats_of(g).reserved.current == 0);
  CHECK_OK(gma_destroy(g));
}

/* A large request is a few map calls (none under 1/256 of the limit, here
 * 64 MiB), not one per granule; one under two pieces'
 * worth is one map. */
static void large_request_few_maps(void) {
  gma_t *g = expandable("sim_capacity:16G,large_segment:64M");
  void *p = NULL;
  CHECK_OK(gma_alloc(g, 700 * MiB + 123, NULL, &p));
  gma_stats_t s = stats_of(g);
  CHECK(s.num_device_allocs == 10 && s.reserved.current == 702 * MiB); /* 10 of 64+ MiB */
  void *q = NULL; /* under two pieces' worth: one map */
  CHECK_OK(gma_alloc(g, 100 * MiB, NULL, &q));
  CHECK(stats_of(g).num_device_allocs == 11);
  CHECK_OK(gma_free(g, q));
  memset(p, 1, 4096);
  memset((char *)p + 700 * MiB - 4096, 1, 4096);
  CHECK_OK(gma_free(g, p));
  settle(g, NULL);
  CHECK_OK(gma_empty_cache(g));
  s = stats_of(g);
  CHECK(s.num_device_frees == 11 && s.reserved.current == 0);
  CHECK_OK(gma_destroy(g));
}

/* A growth for a stream whose own cached block ends a segment extends that
 * block: the stream may use it at once (stream order), so the new chunk
 * maps only what it lacks, and the request takes the old place. Another
 * stream gets none of it while the kernel that used it still runs: on a
 * roomy device it gets new memory, on one too small for both it fails
 * (oom_wait_ms bounds the wait for the held kernel) and succeeds once the
 * kernel is done. Offering the block to any stream's growth fails the
 * tight case (planted and checked by hand). */
static void growth_extends_own_cached_block(void) {
  for (int tight = 0; tight < 2; tight++) {
    gma_t *g = expandable(tight ? "sim_capacity:200M,oom_wait_ms:1" : NULL);
    gma_stream_t s1, s2;
    CHECK_OK(gma_stream_create(g, &s1));
    CHECK_OK(gma_stream_create(g, &s2));
    atomic_int gate = 0, corruptions = 0;
    pattern_kernel_t k;
    void *p = freed_under_kernel(g, s1, 64 * MiB, &k, &gate, &corruptions);
    void *q = NULL, *r = NULL;
    CHECK_OK(gma_alloc(g, 126 * MiB, s1, &q)); /* no host write: s1's kernel owns p */
    CHECK(q == p);
    CHECK(stats_of(g).reserved.current == 126 * MiB);
    CHECK_OK(gma_free(g, q));
    /* Larger than q: a growth that extended q's block would fit. */
    if (tight) {
      CHECK_ST(gma_alloc(g, 130 * MiB, s2, &r), GMA_ERR_OOM);
    } else {
      CHECK_OK(gma_alloc(g, 130 * MiB, s2, &r));
      CHECK((char *)r >= (char *)p + 126 * MiB || (char *)r + 130 * MiB <= (char *)p);
    }
    atomic_store(&gate, 1);
    settle(g, s1);
    CHECK(atomic_load(&corruptions) == 0);
    if (tight) CHECK_OK(gma_alloc(g, 130 * MiB, s2, &r)); /* the kernel is done now */
    CHECK_OK(gma_free(g, r));
    CHECK_OK(gma_stream_destroy(g, s1));
    CHECK_OK(gma_stream_destroy(g, s2));
    CHECK_OK(gma_destroy(g));
  }
}

/* A training-like loop (a few long-lived weights, activations of varied
 * sizes allocated in a forward pass and freed in reverse, repeated): map
 * calls per GiB of peak reserved stay low, and reserved follows allocated. */
static void maps_per_gib(void) {
  gma_t *g = expandable("sim_capacity:8G");
  uint32_t rng = 12345;
  void *weights[16], *acts[64];
  for (int i = 0; i < 16; i++) {
    rng = rng * 1664525u + 1013904223u;
    CHECK_OK(gma_alloc(g, (1 + rng % 32) * MiB + (rng >> 8) % 4096, NULL, &weights[i]));
  }
  for (int it = 0; it < 20; it++) {
    int n = 32 + it % 32;
    for (int i = 0; i < n; i++) {
      rng = rng * 1664525u + 1013904223u;
      size_t size = (rng >> 4) % 4 == 0 ? (rng >> 8) % MiB + 512   /* small */
                                         : (1 + (rng >> 8) % 48) * MiB + (rng >> 20) % 8192;
      CHECK_OK(gma_alloc(g, size, NULL, &acts[i]));
    }
    for (int i = n; i-- > 0;) CHECK_OK(gma_free(g, acts[i]));
  }
  gma_stats_t s = stats_of(g);
  double gib = (double)s.reserved.peak / (1u << 30);
  double per_gib = (double)s.num_device_allocs / gib;
  printf("synthetic loop: peak allocated %.1f MiB, peak reserved %.1f MiB (%.3fx), %llu maps, "
         "%.1f maps per GiB\n",
         (double)s.allocated.peak / MiB, (double)s.reserved.peak / MiB,
         (double)s.reserved.peak / (double)s.allocated.peak,
         (unsigned long long)s.num_device_allocs, per_gib);
  CHECK(per_gib <= 64);
  CHECK(s.reserved.peak <= s.allocated.peak + s.allocated.peak / 10);
  for (int i = 0; i < 16; i++) CHECK_OK(gma_free(g, weights[i]));
  CHECK_OK(gma_destroy(g));
}

int main(void) {
  grows_by_chunks_and_coalesces();
  trim_splits_segments();
  trim_waits_for_stream_work();
  free_chunks_go_back_at_oom();
  minimum_chunks();
  limit_and_faults();
  growing_does_not_fragment();
  batch_and_async();
  trim_keeps_partly_used_chunks();
  large_request_few_maps();
  growth_extends_own_cached_block();
  maps_per_gib();
  printf("test_expandable: ok\n");
  return 0;
}
