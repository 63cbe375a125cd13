/* Pool mechanics: best fit, splitting, coalescing (on a stream and in the
 * free pool), small/large segment sizing, the OOM retry and wait, the lock-free bins
 * (size classes, hits, overflow, draining), and the accounting invariant after
 * a seeded random workload checked by gma__pool_is_valid. The tree tests run
 * with bins off, so that every call reaches the pool's trees. */
#include <inttypes.h>

#include "api/allocator.h"
#include "core/internal.h"
#include "base/sizeclass.h"
#include "simkit.h"

/* The size of the block a request gets (its class size when bins serve it). */
static uint64_t block_size(gma_t *g, size_t size) {
  gma__pool_t *p = gma__pool_of(g);
  return size <= p->bin_max ? gma__class_size(gma__class_of(size)) : (size + 511) / 512 * 512;
}

static void check_valid(gma_t *g) {
  gma__pool_t *p = gma__pool_of(g);
  pthread_mutex_lock(&p->lock);
  bool ok = gma__pool_is_valid(p);
  pthread_mutex_unlock(&p->lock);
  CHECK(ok);
}

static void best_fit_prefers_smallest(void) {
  gma_t *g = sim_allocator_ordinary("bins:off");
  void *p[6];
  size_t sizes[6] = {4096, 8192, 4096, 16384, 4096, 6144};
  for (int i = 0; i < 6; i++) CHECK_OK(gma_alloc(g, sizes[i], NULL, &p[i]));
  /* One small segment, blocks laid out in order. */
  for (int i = 1; i < 6; i++) CHECK((char *)p[i] == (char *)p[i - 1] + sizes[i - 1]);
  CHECK_OK(gma_free(g, p[1])); /* 8K hole */
  CHECK_OK(gma_free(g, p[3])); /* 16K hole */
  void *q;
  CHECK_OK(gma_alloc(g, 7000, NULL, &q)); /* rounds to 7168: best fit is the 8K hole */
  CHECK(q == p[1]);
  void *r;
  CHECK_OK(gma_alloc(g, 1024, NULL, &r)); /* the 1K rest of the 8K hole, not the 16K one */
  CHECK((char *)r == (char *)p[1] + 7168);
  void *t;
  CHECK_OK(gma_alloc(g, 16384, NULL, &t));
  CHECK(t == p[3]);
  gma_stats_t s = stats_of(g);
  CHECK(s.hits_stream == 3 && s.hits_device == 1 && s.num_device_allocs == 1);
  CHECK(s.allocated.current == 4096 + 7168 + 1024 + 4096 + 16384 + 4096 + 6144);
  check_valid(g);
  void *all[] = {p[0], q, r, p[2], t, p[4], p[5]};
  for (int i = 0; i < 7; i++) CHECK_OK(gma_free(g, all[i]));
  CHECK_OK(gma_destroy(g));
}

static void coalesce_then_release(void) {
  gma_t *g = sim_allocator_ordinary("bins:off");
  void *a, *b, *c;
  CHECK_OK(gma_alloc(g, 512, NULL, &a));
  CHECK_OK(gma_alloc(g, 1000, NULL, &b)); /* 1024 */
  CHECK_OK(gma_alloc(g, 512, NULL, &c));
  CHECK(a != NULL && (uintptr_t)a % 256 == 0 && (uintptr_t)b % 256 == 0);
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current == 2u << 20 && s.allocated.current == 2048);
  CHECK(s.requested.current == 512 + 1000 + 512);
  CHECK(s.free_bytes == (2u << 20) - 2048);
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_free(g, c));
  CHECK_OK(gma_free(g, b)); /* joins a and c: one cached block of 2048 */
  s = stats_of(g);
  CHECK(s.stream_cached_bytes == 2048 && s.largest_free_block == (2u << 20) - 2048);
  check_valid(g);
  void *d;
  CHECK_OK(gma_alloc(g, 2048, NULL, &d)); /* exactly the merged block */
  CHECK(d == a);
  CHECK_OK(gma_free(g, d));
  /* empty_cache: the epoch completes (idle stream), the cached block joins the
   * free rest of its segment, and the whole segment goes back. */
  CHECK_OK(gma_empty_cache(g));
  s = stats_of(g);
  CHECK(s.reserved.current == 0 && s.num_segments == 0 && s.num_device_frees == 1);
  CHECK(s.reserved.peak == 2u << 20 && s.allocated.total == 2048 + 2048);
  check_valid(g);
  CHECK_OK(gma_destroy(g));
}

static void segment_sizes(void) {
  gma_t *g = sim_allocator_ordinary("bins:off");
  void *s1, *l1, *l2, *l3;
  CHECK_OK(gma_alloc(g, 1 << 20, NULL, &s1));        /* small pool: 2 MiB segment */
  CHECK_OK(gma_alloc(g, (1 << 20) + 1, NULL, &l1));  /* large: shared 20 MiB segment */
  CHECK_OK(gma_alloc(g, 5 << 20, NULL, &l2));        /* fits in the same segment */
  CHECK_OK(gma_alloc(g, 33 << 20, NULL, &l3));       /* own segment, 34 MiB */
  gma_stats_t s = stats_of(g);
  CHECK(s.num_segments == 3);
  CHECK(s.reserved.current == (2ull << 20) + (20ull << 20) + (34ull << 20));
  CHECK((char *)l2 == (char *)l1 + (1 << 20) + 512);
  CHECK_OK(gma_free(g, s1));
  CHECK_OK(gma_free(g, l1));
  CHECK_OK(gma_free(g, l2));
  CHECK_OK(gma_free(g, l3));
  CHECK_OK(gma_destroy(g));
}

static void oom_retry_releases_cache(void) {
  gma_t *g = sim_allocator_ordinary("sim_capacity:64M,bins:off");
  void *a, *b;
  CHECK_OK(gma_alloc(g, 40 << 20, NULL, &a));
  CHECK_OK(gma_free(g, a)); /* cached on the default stream */
  CHECK_OK(gma_alloc(g, 50 << 20, NULL, &b)); /* needs the 40 MiB back first */
  gma_stats_t s = stats_of(g);
  CHECK(s.num_oom_retries == 1 && s.num_device_frees == 1 && s.num_ooms == 0);
  CHECK(s.reserved.current == 50ull << 20);
  /* Now a real OOM: a clear message with the numbers, nothing lost. */
  void *c;
  CHECK_ST(gma_alloc(g, 20 << 20, NULL, &c), GMA_ERR_OOM);
  CHECK(strstr(gma_last_error(), "allocated 52428800") != NULL);
  CHECK(strstr(gma_last_error(), "reserved 52428800") != NULL);
  s = stats_of(g);
  CHECK(s.num_ooms == 1 && s.allocated.current == 50ull << 20);
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_alloc(g, 20 << 20, NULL, &c)); /* usable again */
  CHECK_OK(gma_free(g, c));
  check_valid(g);
  CHECK_OK(gma_destroy(g));
}

/* Memory pressure with changing sizes: two 48 MiB blocks, freed, then five
 * of 19 MiB in a 100 MiB device. Splitting the whole free 48 MiB segments
 * (two 19s each, 10 MiB left in each that no segment can give back while a
 * 19 lives there) fails the fifth; a fresh 20 MiB segment per request, the
 * free 48s given back when the device is full, serves all five. */
static void oversize_segments_stay_whole(void) {
  gma_t *g = sim_allocator_ordinary("sim_capacity:100M,bins:off");
  const size_t M = (size_t)1 << 20;
  void *a[2], *b[5];
  for (int i = 0; i < 2; i++) CHECK_OK(gma_alloc(g, 48 * M, NULL, &a[i]));
  for (int i = 0; i < 2; i++) CHECK_OK(gma_free(g, a[i]));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  for (int i = 0; i < 5; i++) CHECK_OK(gma_alloc(g, 19 * M, NULL, &b[i]));
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current == 100 * M && s.num_ooms == 0);
  CHECK(s.num_oom_retries >= 1 && s.num_device_frees == 2); /* the 48s went back */
  check_valid(g);
  for (int i = 0; i < 5; i++) CHECK_OK(gma_free(g, b[i]));
  /* With room on the device and the pool above half of it, a whole 60
   * stays cached beside a new segment... */
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK_OK(gma_empty_cache(g));
  CHECK_OK(gma_alloc(g, 60 * M, NULL, &a[0]));
  CHECK_OK(gma_free(g, a[0]));
  CHECK_OK(gma_alloc(g, 19 * M, NULL, &b[0]));
  s = stats_of(g);
  CHECK(b[0] != a[0] && s.reserved.current == 80 * M);
  CHECK_OK(gma_alloc(g, 40 * M, NULL, &b[1])); /* and serves what fits it */
  CHECK(b[1] == a[0]);
  CHECK_OK(gma_free(g, b[0]));
  CHECK_OK(gma_free(g, b[1]));
  /* ...while below half a split costs nothing: a whole 48 is split. */
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK_OK(gma_empty_cache(g));
  CHECK_OK(gma_alloc(g, 48 * M, NULL, &a[0]));
  CHECK_OK(gma_free(g, a[0]));
  CHECK_OK(gma_alloc(g, 19 * M, NULL, &b[0]));
  CHECK(b[0] == a[0] && stats_of(g).reserved.current == 48 * M);
  CHECK_OK(gma_alloc(g, 19 * M, NULL, &b[1]));
  CHECK_OK(gma_free(g, b[0]));
  CHECK_OK(gma_free(g, b[1]));
  check_valid(g);
  CHECK_OK(gma_destroy(g));
}

static void memory_limit_is_honoured(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:8M,bins:off");
  void *a, *b;
  CHECK_ST(gma_alloc(g, 9 << 20, NULL, &a), GMA_ERR_INVALID_SIZE);
  CHECK_OK(gma_alloc(g, 6 << 20, NULL, &a)); /* 20 MiB segment won't fit: 6 MiB one */
  CHECK_ST(gma_alloc(g, 3 << 20, NULL, &b), GMA_ERR_OOM);
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current <= 8u << 20);
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_destroy(g));
}

/* Seeded random alloc/free/record_stream over 3 streams; the full structural
 * check runs throughout and stats must balance at the end. */
static void random_workload(uint64_t seed, const char *bins) {
  char conf[160];
  snprintf(conf, sizeof conf, "small_size:256K,small_segment:1M,large_segment:4M,"
           "sim_capacity:512M,bin_max:256K,bin_depth:4,%s", bins);
  gma_t *g = sim_allocator_ordinary(conf);
  gma_stream_t st[3] = {NULL};
  CHECK_OK(gma_stream_create(g, &st[1]));
  CHECK_OK(gma_stream_create(g, &st[2]));
  enum { N = 256 };
  void *ptr[N] = {0};
  size_t size[N] = {0};
  uint64_t x = seed, live_bytes = 0;
  for (int step = 0; step < 20000; step++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int i = (int)(x % N);
    if (ptr[i]) {
      if ((x >> 20) % 4 == 0) CHECK_OK(gma_record_stream(g, ptr[i], st[(x >> 24) % 3]));
      CHECK_OK(gma_free(g, ptr[i]));
      live_bytes -= block_size(g, size[i]);
      ptr[i] = NULL;
    } else {
      size[i] = (x >> 8) % 4 == 0 ? 1 + (x >> 32) % (2 << 20) : 1 + (x >> 32) % 65536;
      CHECK_OK(gma_alloc(g, size[i], st[(x >> 40) % 3], &ptr[i]));
      live_bytes += block_size(g, size[i]);
    }
    if (step % 997 == 0) {
      check_valid(g);
      if (step % 5 == 0) CHECK_OK(gma_empty_cache(g));
    }
  }
  gma_stats_t s = stats_of(g);
  CHECK(s.allocated.current == live_bytes);
  CHECK(s.reserved.current == s.allocated.current + s.stream_cached_bytes + s.pending_bytes +
                                  s.free_bytes);
  CHECK(s.hits_bin + s.hits_stream + s.hits_pool + s.hits_device == s.num_allocs);
  for (int i = 0; i < N; i++)
    if (ptr[i]) CHECK_OK(gma_free(g, ptr[i]));
  CHECK_OK(gma_stream_destroy(g, st[1]));
  CHECK_OK(gma_stream_destroy(g, st[2]));
  CHECK_OK(gma_empty_cache(g));
  s = stats_of(g);
  CHECK(s.allocated.current == 0 && s.reserved.current == 0 && s.pending_bytes == 0);
  printf("random workload seed %" PRIu64 " (%s): %" PRIu64 " allocs, hits bin/stream/pool/device "
         "%" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64 ", peak reserved %" PRIu64 "\n",
         seed, bins, s.num_allocs, s.hits_bin, s.hits_stream, s.hits_pool, s.hits_device,
         s.reserved.peak);
  CHECK_OK(gma_destroy(g));
}

/* Size classes: <= 4 KiB in 512 B steps; above, 8 steps per doubling up to
 * 64 KiB, 16 up to 1 MiB, 32 above (waste < 1/8, 1/16, 1/32). */
static void size_classes(void) {
  for (uint64_t size = 1; size <= (64u << 20); size += 1 + size / 37) {
    unsigned c = gma__class_of(size);
    uint64_t cs = gma__class_size(c);
    CHECK(cs >= size && cs % 512 == 0);
    CHECK(c == 0 || gma__class_size(c - 1) < size); /* the smallest class that fits */
    if (size > 4096) CHECK((cs - size) * 8 < cs);
    if (size > (64u << 10)) CHECK((cs - size) * 16 < cs);
    if (size > (1u << 20)) CHECK((cs - size) * 32 < cs);
    CHECK(gma__class_floor(cs) == c);
    if (cs > 512) CHECK(gma__class_floor(cs - 512) == c - 1 || gma__class_size(c - 1) <= cs - 512);
  }
  CHECK(gma__class_size(gma__class_of(4096)) == 4096);
  CHECK(gma__class_size(gma__class_of(4097)) == 4608);
  CHECK(gma__class_size(gma__class_of(1000000)) == 1015808); /* 512 KiB + 15 x 32 KiB */
  CHECK(gma__class_size(gma__class_of(1100000)) == 1114112); /* 1 MiB + 2 x 32 KiB */
  CHECK(gma__class_size(gma__class_of(70000)) == 73728);      /* 64 KiB + 2 x 4 KiB */
}

/* The bins: a free goes into the stream's bin and the next alloc of the same
 * class takes it without the lock; a full bin overflows into the stream's
 * tree; a poll drains bins into the pool. */
static void bins(void) {
  gma_t *g = sim_allocator_ordinary("bin_depth:2");
  void *a, *b, *c, *d;
  CHECK_OK(gma_alloc(g, 5000, NULL, &a)); /* class 5120 */
  gma_stats_t s = stats_of(g);
  CHECK(s.allocated.current == 5120 && s.requested.current == 5000 && s.hits_device == 1);
  CHECK_OK(gma_free(g, a));
  s = stats_of(g);
  CHECK(s.stream_cached_bytes == 5120 && s.allocated.current == 0);
  CHECK_OK(gma_alloc(g, 4700, NULL, &b)); /* same class: the bin serves it */
  CHECK(b == a);
  s = stats_of(g);
  CHECK(s.hits_bin == 1 && s.num_allocs == 2 && s.num_device_allocs == 1);
  CHECK(s.allocated.current == 5120 && s.requested.current == 4700);
  /* Three frees into a bin of depth 2: the third overflows to the tree. */
  CHECK_OK(gma_alloc(g, 5000, NULL, &c));
  CHECK_OK(gma_alloc(g, 5000, NULL, &d));
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_free(g, c));
  CHECK_OK(gma_free(g, d));
  gma__pool_t *p = gma__pool_of(g);
  CHECK(p->c.stream_cached == 5120); /* the overflow, in the tree */
  s = stats_of(g);
  CHECK(s.stream_cached_bytes == 3 * 5120);
  /* Double free is caught on the lock-free path too. */
  CHECK_ST(gma_free(g, d), GMA_ERR_DOUBLE_FREE);
  CHECK_ST(gma_free(g, b), GMA_ERR_DOUBLE_FREE);
  gma_stream_stats_t ss = GMA_STREAM_STATS_INIT;
  CHECK_OK(gma_stream_stats(g, NULL, &ss));
  CHECK(ss.allocs == 4 && ss.frees == 4 && ss.hits == 1 && ss.misses == 3);
  CHECK(ss.cached_bytes == 3 * 5120 && ss.allocated_bytes == 0);
  /* empty_cache drains the bins, the epoch completes, the segment goes back. */
  CHECK_OK(gma_empty_cache(g));
  s = stats_of(g);
  CHECK(s.reserved.current == 0 && s.stream_cached_bytes == 0 && s.num_epoch_events >= 1);
  check_valid(g);
  CHECK_OK(gma_destroy(g));
}

/* A stream's cached block joined with the FREE memory beside it serves a
 * request that neither fits alone, when the union is smaller than the best
 * FREE block: the stream takes its own old place again instead of splitting
 * another stream's larger block (which that stream would then have to grow
 * for). */
static void cached_joins_free_neighbour(void) {
  gma_t *g = sim_allocator_ordinary("bins:off");
  gma_stream_t a, b;
  CHECK_OK(gma_stream_create(g, &a));
  CHECK_OK(gma_stream_create(g, &b));
  const size_t M = (size_t)1 << 20;
  void *z, *y, *x, *q, *r;
  CHECK_OK(gma_alloc(g, 26 * M, b, &z)); /* b's block: a 26 MiB segment */
  CHECK_OK(gma_alloc(g, 16 * M, a, &y)); /* a's: a 16 MiB segment */
  CHECK_OK(gma_free(g, z));
  CHECK_OK(gma_free(g, y));
  CHECK_OK(gma_stream_synchronize(g, b)); /* both FREE now */
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK_OK(gma_alloc(g, 10 * M + M / 2, a, &x)); /* best fit: y's 16 MiB, split */
  CHECK(x == y);
  CHECK_OK(gma_free(g, x)); /* cached on a: 10.5 MiB beside 5.5 MiB FREE */
  gma_stats_t s0 = stats_of(g);
  CHECK(s0.num_device_allocs == 2 && s0.stream_cached_bytes == 10 * M + M / 2);
  CHECK_OK(gma_alloc(g, 14 * M, a, &q)); /* the join (16 MiB), not z's 26 MiB */
  CHECK(q == y);
  CHECK_OK(gma_alloc(g, 25 * M, b, &r)); /* so b finds its place again */
  CHECK(r == z);
  gma_stats_t s = stats_of(g);
  CHECK(s.num_device_allocs == 2 && s.hits_stream == s0.hits_stream + 1);
  check_valid(g);
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_free(g, r));
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK_OK(gma_stream_synchronize(g, b));
  check_valid(g);
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_destroy(g));
}

/* The OOM wait under a sticky device error: every event query fails (as a
 * CUDA context does after an illegal address), so no completion can ever
 * be seen. After 64 rounds in a row that end on a failed query the call
 * fails instead of repeating the same round forever (it did, once the cap
 * on all rounds was lifted). */
static void oom_wait_ends_on_sticky_errors(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:64M,worker:off");
  gma_stream_t a;
  CHECK_OK(gma_stream_create(g, &a));
  atomic_int gate = 0, corruptions = 0;
  void *p, *q;
  CHECK_OK(gma_alloc(g, 48 << 20, a, &p));
  pattern_kernel_t k = {p, 1 << 20, 0x3c, &gate, 0, &corruptions, 0};
  CHECK_OK(gma_sim_launch(g, a, pattern_kernel_run, &k));
  pattern_kernel_wait_started(&k);
  CHECK_OK(gma_free(g, p));
  gma__sim_fault(gma__pool_of(g)->dev, GMA__SIM_EVENT_QUERY, 1 | GMA__SIM_STICKY, GMA_ERR_DEVICE);
  CHECK_ST(gma_alloc(g, 48 << 20, NULL, &q), GMA_ERR_OOM);
  /* The message cites the failure, not only the work it could not see end. */
  CHECK(strstr(gma_last_error(), "A device call failed meanwhile") != NULL);
  CHECK(strstr(gma_last_error(), "injected failure of event_query") != NULL);
  gma_stats_t s = stats_of(g);
  CHECK(s.num_oom_waits == 1 && s.num_ooms == 1);
  gma__sim_fault(gma__pool_of(g)->dev, GMA__SIM_EVENT_QUERY, 0, GMA_OK);
  atomic_store(&gate, 1);
  CHECK_OK(gma_stream_synchronize(g, a));
  CHECK(atomic_load(&corruptions) == 0);
  CHECK_OK(gma_alloc(g, 48 << 20, NULL, &q)); /* the device well again: served */
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_destroy(g));
}

/* The OOM wait's race: the work that gated a freed block completed after
 * the caller's last search, so when the wait looks, no event is left to
 * wait for, yet the block is free to settle. The wait must settle it and
 * send the caller back to its search, not report that nothing can come
 * back. Built deterministically: the block's epoch is closed behind a held
 * kernel (its event recorded, seen incomplete), then the stream runs to
 * its end on the device alone, so gma has not seen the event complete. */
static void oom_wait_settles_completed_work(void) {
  gma_t *g = sim_allocator_ordinary("memory_limit:64M,worker:off,bins:off");
  gma__pool_t *pl = gma__pool_of(g);
  gma_stream_t a;
  CHECK_OK(gma_stream_create(g, &a));
  atomic_int gate = 0, corruptions = 0;
  void *p;
  CHECK_OK(gma_alloc(g, 48 << 20, a, &p));
  pattern_kernel_t k = {p, 1 << 20, 0x3d, &gate, 0, &corruptions, 0};
  CHECK_OK(gma_sim_launch(g, a, pattern_kernel_run, &k));
  pattern_kernel_wait_started(&k);
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_empty_cache(g)); /* closes the epoch: its event waits behind k */
  gma_stats_t s = stats_of(g);
  CHECK(s.stream_cached_bytes == 48 << 20);
  atomic_store(&gate, 1);
  CHECK_OK(pl->dev->ops->stream_synchronize(pl->dev, a)); /* not through gma */
  pthread_mutex_lock(&pl->lock);
  gma__oom_waiting_t w = {0};
  bool again = gma__oom_wait(pl, &w, 48 << 20);
  uint64_t cached = pl->c.stream_cached;
  pthread_mutex_unlock(&pl->lock);
  printf("OOM wait with the gating work already complete: search again %d, stop %d, "
         "stream-cached %" PRIu64 " MiB after\n", again, w.stop, cached >> 20);
  CHECK(again && cached == 0);
  void *q;
  CHECK_OK(gma_alloc(g, 48 << 20, NULL, &q));
  CHECK(q == p && atomic_load(&corruptions) == 0);
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_stream_destroy(g, a));
  CHECK_OK(gma_destroy(g));
}

int main(void) {
  oom_wait_settles_completed_work();
  cached_joins_free_neighbour();
  size_classes();
  bins();
  best_fit_prefers_smallest();
  coalesce_then_release();
  segment_sizes();
  oom_retry_releases_cache();
  oom_wait_ends_on_sticky_errors();
  oversize_segments_stay_whole();
  memory_limit_is_honoured();
  random_workload(0x5eed1234, "bins:on");
  random_workload(42, "bins:on");
  random_workload(7, "bins:off");
  printf("ok\n");
  return 0;
}
