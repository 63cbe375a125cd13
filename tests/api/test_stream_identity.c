/* API test of stream identity and the per-stream caches, through gma.h alone:
 *
 *  (a) handle recycling: a destroyed stream's handle value goes to the next
 *      stream created (as CUDA does) while the old stream's kernels still run.
 *      The new stream must start clean: it must not be given a block the old
 *      stream freed while that block's kernel is still held, nor one that
 *      was live on the old stream and is freed after the handle was reused;
 *      and a block whose record_stream user was the old stream stays gated
 *      on the old stream's work, not the new one's;
 *  (b) the per-thread default stream has one handle value (0x2) on every
 *      thread, but is a different stream on each: thread 2 must not be given
 *      thread 1's freed block while thread 1's kernel holds it;
 *  (c) gma_stream_retire: a retired stream is forgotten, and its cached
 *      blocks serve another stream once its work is done (no device growth);
 *      retiring a stream that had many epochs closed while busy succeeds and
 *      strands nothing;
 *  (d) gma_stream_stats: allocs/frees/hits/misses/bytes for a known sequence,
 *      with bins on and off; unknown streams are GMA_ERR_INVALID_ARGUMENT;
 *  (e) reuse policies: reuse:none never gives a block freed on S to another
 *      stream (until S is retired); reuse:wait may give U a block S (or a
 *      record_stream user of it) still uses, and then U's work starts only
 *      after that work finished (num_cross_stream_waits > 0); reuse:query
 *      (the default) does not.
 *
 * "Held" kernels fill a block with a pattern and wait on a gate the test
 * opens; a block handed out while held is caught twice: the addresses
 * overlap (checked on the host) and the holder's pattern check fails.
 * Usage: test_stream_identity (no arguments: the scenarios are fixed). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "gma.h"
#include "simkit.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* A pattern kernel that also says when it has finished. */
typedef struct held {
  pattern_kernel_t k;
  atomic_int done;
} held_t;

static void held_run(void *arg) {
  held_t *h = arg;
  pattern_kernel_run(&h->k);
  atomic_store(&h->done, 1);
}

static void held_wait_done(held_t *h) {
  for (int i = 0; i < 50000 && !atomic_load(&h->done); i++) sleep_us(100);
  CHECK(atomic_load(&h->done));
}

static int overlaps(const void *a, size_t alen, const void *b, size_t blen) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + blen && y < x + alen;
}

/* ---- (a) handle recycling ----------------------------------------------- */

static void test_handle_recycling(void) {
  gma_t *g = sim_allocator_ordinary(NULL);
  const size_t len = 256 * KiB;
  atomic_int gate = 0, corruptions = 0;

  gma_stream_t a, b;
  CHECK_OK(gma_stream_create(g, &a));
  void *x;
  CHECK_OK(gma_alloc(g, len, a, &x));
  held_t hx = {{x, len, 0xA5, &gate, 0, &corruptions, 0}, 0};
  CHECK_OK(gma_sim_launch(g, a, held_run, &hx));
  pattern_kernel_wait_started(&hx.k);
  CHECK_OK(gma_free(g, x)); /* X is cached on A, still in use by A's kernel */
  CHECK_OK(gma_stream_destroy(g, a)); /* returns at once: A's kernel still runs */
  CHECK(!atomic_load(&hx.done));

  CHECK_OK(gma_stream_create(g, &b));
  if (b == a)
    printf("(a) the new stream got the destroyed stream's handle %p\n", b);
  else
    printf("(a) note: the device did not recycle the handle (%p, then %p): the recycled case "
           "is not exercised\n",
           a, b);

  /* Same size on B, again and again: B's first miss must not find A's cache
   * (which would hand X over at once, with no device-side ordering), and
   * neither may anything later while A's kernel holds X. */
  enum { NLIVE = 8 };
  void *ys[NLIVE];
  pattern_kernel_t ky[NLIVE];
  for (int i = 0; i < NLIVE; i++) {
    CHECK_OK(gma_alloc(g, len, b, &ys[i]));
    CHECK(!overlaps(ys[i], len, x, len));
    ky[i] = (pattern_kernel_t){ys[i], len, (uint8_t)(0xB0 + i), NULL, 0, &corruptions, 0};
    CHECK_OK(gma_sim_launch(g, b, pattern_kernel_run, &ky[i]));
  }
  for (int i = 0; i < 200; i++) { /* the hot path: B's own bin */
    void *y;
    CHECK_OK(gma_alloc(g, len, b, &y));
    CHECK(!overlaps(y, len, x, len));
    CHECK_OK(gma_free(g, y));
  }
  CHECK_OK(gma_stream_synchronize(g, b)); /* B's kernels wrote their blocks while X was held */
  for (int i = 0; i < NLIVE; i++) CHECK_OK(gma_free(g, ys[i]));
  CHECK(!atomic_load(&hx.done));
  atomic_store(&gate, 1);
  held_wait_done(&hx);
  CHECK(atomic_load(&corruptions) == 0);
  CHECK_OK(gma_stream_synchronize(g, b));

  /* A's work is done: X may now be reused anywhere. On a fresh stream (empty
   * bins) gma goes to the pool, whose best fit takes existing free blocks
   * before growing; so if X went back to the pool, it is among the blocks
   * handed out before the first new segment. The retirement event may take
   * a moment to be seen, hence the retries. */
  int found = 0;
  for (int attempt = 0; attempt < 50 && !found; attempt++) {
    gma_stream_t c;
    CHECK_OK(gma_stream_create(g, &c));
    uint64_t grown = stats_of(g).num_device_allocs;
    void *zs[64];
    int n = 0;
    while (n < 64) {
      CHECK_OK(gma_alloc(g, len, c, &zs[n]));
      n++;
      if (zs[n - 1] == x) {
        found = 1;
        break;
      }
      if (stats_of(g).num_device_allocs != grown) break;
    }
    for (int i = 0; i < n; i++) CHECK_OK(gma_free(g, zs[i]));
    CHECK_OK(gma_stream_destroy(g, c));
    if (!found) sleep_us(2000);
  }
  CHECK(found); /* X is not stranded in the old stream's record */
  printf("(a) recycled handle: B never got X while held; X reused once A's work was done\n");

  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_destroy(g));
}

/* A block still live when its stream is destroyed, freed only after a new
 * stream got the same handle value: the free is ordered on the OLD stream
 * (gma_free's contract), whose kernel still holds the block. gma must not
 * put it into the new stream's cache just because the handle matches. */
static void test_free_after_recycling(void) {
  gma_t *g = sim_allocator_ordinary(NULL);
  const size_t len = 256 * KiB;
  atomic_int gate = 0, corruptions = 0;
  gma_stream_t a, b;
  CHECK_OK(gma_stream_create(g, &a));
  void *x;
  CHECK_OK(gma_alloc(g, len, a, &x));
  held_t hx = {{x, len, 0xC3, &gate, 0, &corruptions, 0}, 0};
  CHECK_OK(gma_sim_launch(g, a, held_run, &hx));
  pattern_kernel_wait_started(&hx.k);
  CHECK_OK(gma_stream_destroy(g, a)); /* X stays valid: live allocations survive retirement */
  CHECK_OK(gma_stream_create(g, &b));
  int recycled = b == a;
  CHECK_OK(gma_free(g, x)); /* ordered on A, which is gone but still running */
  for (int i = 0; i < 200; i++) {
    void *y;
    CHECK_OK(gma_alloc(g, len, b, &y));
    CHECK(!overlaps(y, len, x, len));
    pattern_kernel_t ky = {y, len, 0xD4, NULL, 0, &corruptions, 0};
    CHECK_OK(gma_sim_launch(g, b, pattern_kernel_run, &ky));
    CHECK_OK(gma_stream_synchronize(g, b)); /* ky lives on this stack frame */
    CHECK_OK(gma_free(g, y));
  }
  CHECK(!atomic_load(&hx.done));
  atomic_store(&gate, 1);
  held_wait_done(&hx);
  CHECK(atomic_load(&corruptions) == 0);
  CHECK_OK(gma_stream_destroy(g, b));
  CHECK_OK(gma_destroy(g));
  printf("(a) block freed after its stream's handle was %s: not handed to the new stream while "
         "held\n",
         recycled ? "recycled" : "destroyed (not recycled)");
}

/* X of stream S is used by a held kernel on U (declared with
 * gma_record_stream); U is destroyed and its handle goes to a new, idle
 * stream V; then X is freed. X's gate is U's work, not V's: S must not get X
 * back while U's kernel holds it, however idle V is. */
static void test_record_on_recycled_stream(void) {
  gma_t *g = sim_allocator_ordinary(NULL);
  const size_t len = 256 * KiB;
  atomic_int gate = 0, corruptions = 0;
  gma_stream_t s, u, v;
  CHECK_OK(gma_stream_create(g, &s));
  CHECK_OK(gma_stream_create(g, &u));
  void *x;
  CHECK_OK(gma_alloc(g, len, s, &x)); /* fresh memory: no earlier work to order after */
  held_t hu = {{x, len, 0xE5, &gate, 0, &corruptions, 0}, 0};
  CHECK_OK(gma_sim_launch(g, u, held_run, &hu));
  pattern_kernel_wait_started(&hu.k);
  CHECK_OK(gma_record_stream(g, x, u));
  CHECK_OK(gma_stream_destroy(g, u));
  CHECK_OK(gma_stream_create(g, &v));
  int recycled = v == u;
  CHECK_OK(gma_stream_synchronize(g, v)); /* V is idle: any epoch of V completes at once */
  CHECK_OK(gma_free(g, x));
  for (int i = 0; i < 200; i++) {
    void *y, *w;
    CHECK_OK(gma_alloc(g, len, s, &y));
    CHECK(!overlaps(y, len, x, len));
    CHECK_OK(gma_alloc(g, len, v, &w));
    CHECK(!overlaps(w, len, x, len));
    pattern_kernel_t ky = {y, len, 0xF6, NULL, 0, &corruptions, 0};
    CHECK_OK(gma_sim_launch(g, s, pattern_kernel_run, &ky));
    CHECK_OK(gma_stream_synchronize(g, s)); /* ky lives on this stack frame */
    CHECK_OK(gma_free(g, y));
    CHECK_OK(gma_free(g, w));
    CHECK_OK(gma_stream_synchronize(g, v));
  }
  CHECK(!atomic_load(&hu.done));
  atomic_store(&gate, 1);
  held_wait_done(&hu);
  CHECK(atomic_load(&corruptions) == 0);
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_stream_destroy(g, v));
  CHECK_OK(gma_destroy(g));
  printf("(a) record_stream on a stream whose handle was then %s: X stayed gated on the old "
         "stream's work\n",
         recycled ? "recycled" : "destroyed (not recycled)");
}

/* ---- (b) per-thread default stream -------------------------------------- */

typedef struct ptds_shared {
  gma_t *g;
  gma_stream_t s; /* GMA_STREAM_PER_THREAD, or NULL under default_stream:per_thread */
  size_t len;
  atomic_int phase; /* 1: thread 1 freed its held block; 2: thread 2 is done */
  atomic_int gate, corruptions, violations;
  void *y1;
} ptds_shared_t;

static void wait_phase(atomic_int *phase, int want) {
  for (int i = 0; i < 100000 && atomic_load(phase) < want; i++) sleep_us(100);
  CHECK(atomic_load(phase) >= want);
}

static void *ptds_thread1(void *arg) {
  ptds_shared_t *sh = arg;
  gma_t *g = sh->g;
  CHECK_OK(gma_alloc(g, sh->len, sh->s, &sh->y1));
  held_t h = {{sh->y1, sh->len, 0x11, &sh->gate, 0, &sh->corruptions, 0}, 0};
  CHECK_OK(gma_sim_launch(g, sh->s, held_run, &h));
  pattern_kernel_wait_started(&h.k);
  CHECK_OK(gma_free(g, sh->y1)); /* cached on thread 1's stream, still held */
  atomic_store(&sh->phase, 1);
  wait_phase(&sh->phase, 2);
  CHECK(!atomic_load(&h.done));
  atomic_store(&sh->gate, 1);
  /* This thread stays alive until its stream is drained: h lives on its stack. */
  CHECK_OK(gma_stream_synchronize(g, sh->s));
  CHECK(atomic_load(&h.done));
  return NULL;
}

static void *ptds_thread2(void *arg) {
  ptds_shared_t *sh = arg;
  gma_t *g = sh->g;
  wait_phase(&sh->phase, 1);
  enum { NLIVE = 6 };
  void *ys[NLIVE];
  pattern_kernel_t k[NLIVE];
  for (int i = 0; i < NLIVE; i++) {
    CHECK_OK(gma_alloc(g, sh->len, sh->s, &ys[i]));
    if (overlaps(ys[i], sh->len, sh->y1, sh->len)) atomic_fetch_add(&sh->violations, 1);
    k[i] = (pattern_kernel_t){ys[i], sh->len, (uint8_t)(0x20 + i), NULL, 0, &sh->corruptions, 0};
    CHECK_OK(gma_sim_launch(g, sh->s, pattern_kernel_run, &k[i]));
  }
  for (int i = 0; i < 200; i++) {
    void *y;
    CHECK_OK(gma_alloc(g, sh->len, sh->s, &y));
    if (overlaps(y, sh->len, sh->y1, sh->len)) atomic_fetch_add(&sh->violations, 1);
    CHECK_OK(gma_free(g, y));
  }
  CHECK_OK(gma_stream_synchronize(g, sh->s));
  for (int i = 0; i < NLIVE; i++) CHECK_OK(gma_free(g, ys[i]));
  CHECK_OK(gma_stream_synchronize(g, sh->s));
  atomic_store(&sh->phase, 2);
  return NULL;
}

/* conf NULL: the threads name GMA_STREAM_PER_THREAD; else they pass NULL
 * under default_stream:per_thread, which must mean the same. */
static void test_per_thread_stream(const char *conf) {
  static ptds_shared_t sh;
  memset(&sh, 0, sizeof sh);
  sh.g = sim_allocator_ordinary(conf);
  sh.s = conf ? NULL : GMA_STREAM_PER_THREAD;
  sh.len = 128 * KiB;
  pthread_t t1, t2;
  CHECK(pthread_create(&t1, NULL, ptds_thread1, &sh) == 0);
  CHECK(pthread_create(&t2, NULL, ptds_thread2, &sh) == 0);
  CHECK(pthread_join(t2, NULL) == 0);
  CHECK(pthread_join(t1, NULL) == 0);
  CHECK(atomic_load(&sh.violations) == 0);
  CHECK(atomic_load(&sh.corruptions) == 0);
  gma_stats_t s = stats_of(sh.g);
  CHECK(s.num_allocs == 1 + 6 + 200 && s.num_frees == s.num_allocs);
  CHECK(s.hits_bin + s.hits_stream + s.hits_pool + s.hits_device == s.num_allocs);
  if (conf) { /* async requests cannot name the caller's default stream */
    gma_future_t *f = NULL;
    CHECK_ST(gma_alloc_async(sh.g, 4096, NULL, NULL, &f), GMA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(gma_last_error(), "default_stream:per_thread") != NULL && f == NULL);
  }
  CHECK_OK(gma_destroy(sh.g));
  printf("(b) per-thread default streams kept apart (%s): thread 2 never got thread 1's held "
         "block\n", conf ? "NULL under default_stream:per_thread" : "GMA_STREAM_PER_THREAD");
}

/* ---- (c) gma_stream_retire ------------------------------------------------- */

static void test_retire(void) {
  gma_t *g = sim_allocator_ordinary(NULL);
  enum { N = 8 };
  const size_t len = 1 * MiB; /* in the bins' range; 2 per small segment */
  atomic_int corruptions = 0;
  gma_stream_t s, u;
  CHECK_OK(gma_stream_create(g, &s));
  CHECK_OK(gma_stream_create(g, &u));

  void *xs[N];
  pattern_kernel_t k[N];
  for (int i = 0; i < N; i++) {
    CHECK_OK(gma_alloc(g, len, s, &xs[i]));
    k[i] = (pattern_kernel_t){xs[i], len, (uint8_t)(0x30 + i), NULL, 2000, &corruptions, 0};
    CHECK_OK(gma_sim_launch(g, s, pattern_kernel_run, &k[i]));
  }
  for (int i = 0; i < N; i++) CHECK_OK(gma_free(g, xs[i]));
  gma_stats_t s0 = stats_of(g);
  gma_stream_stats_t ss = GMA_STREAM_STATS_INIT;
  CHECK_OK(gma_stream_stats(g, s, &ss));
  CHECK(ss.cached_bytes == N * len);
  CHECK(s0.stream_cached_bytes >= N * len);
  uint64_t streams_before = s0.num_streams;

  CHECK_OK(gma_stream_retire(g, s));
  ss = (gma_stream_stats_t)GMA_STREAM_STATS_INIT;
  CHECK_ST(gma_stream_stats(g, s, &ss), GMA_ERR_INVALID_ARGUMENT); /* forgotten */
  CHECK(stats_of(g).num_streams == streams_before - 1);
  /* The retirement event was recorded on S after its kernels; once S is
   * drained, that event is complete and S's blocks belong to the pool. */
  CHECK_OK(gma_stream_synchronize(g, s));

  void *ys[N];
  for (int i = 0; i < N; i++) {
    CHECK_OK(gma_alloc(g, len, u, &ys[i]));
    int from_s = 0;
    for (int j = 0; j < N; j++) from_s |= ys[i] == xs[j];
    CHECK(from_s); /* exactly S's former blocks: nothing else of that size is free */
  }
  gma_stats_t s1 = stats_of(g);
  CHECK(s1.num_device_allocs == s0.num_device_allocs); /* reused, not grown */
  CHECK(s1.stream_cached_bytes + N * len <= s0.stream_cached_bytes);
  CHECK(atomic_load(&corruptions) == 0);

  CHECK_OK(gma_stream_destroy(g, s)); /* destroying a retired stream is fine */
  for (int i = 0; i < N; i++) CHECK_OK(gma_free(g, ys[i]));
  CHECK_OK(gma_stream_destroy(g, u));
  CHECK_OK(gma_destroy(g));
  printf("(c) retire: S forgotten, its %d cached MiB served U once its work was done\n",
         (int)(N * len / MiB));
}

/* Retiring a stream that has had many epochs closed while it was busy: gma
 * closes a dirty epoch with an event at every pool visit (here forced with
 * gma_empty_cache), so a stream whose work is held back accumulates events
 * nobody has seen complete yet. Retirement must still succeed (it never
 * blocks and no device call fails), and once the work is done every byte
 * must be releasable. Variant 1 retires while the kernel is still held;
 * variant 2 drains the stream first, then destroys it. */
static void test_retire_busy(int drain_first) {
  gma_t *g = sim_allocator_ordinary(NULL);
  atomic_int gate = 0, corruptions = 0;
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  void *x;
  CHECK_OK(gma_alloc(g, 4 * KiB, s, &x));
  pattern_kernel_t k = {x, 4 * KiB, 0x77, &gate, 0, &corruptions, 0};
  CHECK_OK(gma_sim_launch(g, s, pattern_kernel_run, &k));
  pattern_kernel_wait_started(&k);
  for (int i = 0; i < 64; i++) {
    void *p;
    CHECK_OK(gma_alloc(g, 64 * KiB, s, &p));
    CHECK_OK(gma_free(g, p));     /* the epoch is dirty again */
    CHECK_OK(gma_empty_cache(g)); /* a pool visit: closes it with an event */
  }
  if (drain_first) {
    atomic_store(&gate, 1);
    CHECK_OK(gma_stream_synchronize(g, s));
    CHECK_OK(gma_stream_destroy(g, s));
  } else {
    CHECK_OK(gma_stream_retire(g, s));
    atomic_store(&gate, 1);
    CHECK_OK(gma_stream_synchronize(g, s));
    CHECK_OK(gma_stream_destroy(g, s));
  }
  CHECK_OK(gma_free(g, x)); /* live across retirement: still valid */
  gma_stats_t st = stats_of(g);
  for (int tries = 0; tries < 2000 && st.reserved.current != 0; tries++) {
    CHECK_OK(gma_empty_cache(g));
    st = stats_of(g);
    if (st.reserved.current) sleep_us(1000);
  }
  CHECK(st.reserved.current == 0); /* nothing stranded in the retired record */
  CHECK(atomic_load(&corruptions) == 0);
  CHECK_OK(gma_destroy(g));
  printf("(c) retire after %d busy epochs (%s): OK, every byte released afterwards\n", 64,
         drain_first ? "drained, then destroyed" : "retired while busy");
}

/* ---- (d) gma_stream_stats ----------------------------------------------------- */

static gma_stream_stats_t sstats(gma_t *g, gma_stream_t s) {
  gma_stream_stats_t ss = GMA_STREAM_STATS_INIT;
  CHECK_OK(gma_stream_stats(g, s, &ss));
  CHECK(ss.hits + ss.misses == ss.allocs);
  CHECK(ss.safe_epoch < ss.epoch); /* the open epoch has not completed */
  return ss;
}

/* allocs, frees, hits, misses and allocated bytes follow from the sequence
 * exactly. Cached bytes only within a range: a block freed in the stream's
 * open epoch stays cached for the stream, but once a later pool visit has
 * closed that epoch and seen its event complete (on an idle stream, soon),
 * the block belongs to the shared free pool and is no longer the stream's. */
static int in_range(uint64_t v, uint64_t lo, uint64_t hi) { return lo <= v && v <= hi; }

#define CHECK_SS(ss, allocs_, frees_, hits_, misses_, allocated_, cached_min_, cached_max_)   \
  do {                                                                                     \
    if ((ss).allocs != (allocs_) || (ss).frees != (frees_) || (ss).hits != (hits_) ||      \
        (ss).misses != (misses_) || (ss).allocated_bytes != (allocated_) ||                \
        !in_range((ss).cached_bytes, (cached_min_), (cached_max_))) {                      \
      fprintf(stderr,                                                                      \
              "%s:%d: stream stats allocs %llu frees %llu hits %llu misses %llu allocated " \
              "%llu cached %llu; expected %llu %llu %llu %llu %llu %llu..%llu\n",          \
              __FILE__, __LINE__, (unsigned long long)(ss).allocs,                         \
              (unsigned long long)(ss).frees, (unsigned long long)(ss).hits,               \
              (unsigned long long)(ss).misses, (unsigned long long)(ss).allocated_bytes,   \
              (unsigned long long)(ss).cached_bytes, (unsigned long long)(allocs_),        \
              (unsigned long long)(frees_), (unsigned long long)(hits_),                   \
              (unsigned long long)(misses_), (unsigned long long)(allocated_),             \
              (unsigned long long)(cached_min_), (unsigned long long)(cached_max_));       \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

/* The same sequence with bins on and off. With bins, an allocation right
 * after a free of the same size on the same stream is a bin hit (the block
 * was freed in the open epoch, so it cannot have left the stream); a second
 * one finds the bin empty and misses; 8 MiB (above bin_max) always misses
 * but comes back from the stream's cache in the pool, or from the free pool
 * once the stream's epoch has completed. */
static void stream_stats_sequence(const char *conf, int bins) {
  gma_t *g = sim_allocator_ordinary(conf);
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  const uint64_t k64 = 64 * KiB, m8 = 8 * MiB;
  const uint64_t h = bins ? 1 : 0; /* bin hits after the third allocation */
  void *a, *b, *c, *d, *e;

  CHECK_OK(gma_alloc(g, k64, s, &a));
  CHECK_SS(sstats(g, s), 1, 0, 0, 1, k64, 0, 0);
  CHECK_OK(gma_free(g, a));
  CHECK_SS(sstats(g, s), 1, 1, 0, 1, 0, k64, k64);
  CHECK_OK(gma_alloc(g, k64, s, &b));
  CHECK(b == a); /* same stream, same size: its own cache */
  CHECK_SS(sstats(g, s), 2, 1, h, 2 - h, k64, 0, 0);
  CHECK_OK(gma_alloc(g, k64, s, &c));
  CHECK_SS(sstats(g, s), 3, 1, h, 3 - h, 2 * k64, 0, 0);
  CHECK_OK(gma_free(g, b));
  CHECK_OK(gma_free(g, c));
  CHECK_SS(sstats(g, s), 3, 3, h, 3 - h, 0, k64, 2 * k64);
  CHECK_OK(gma_alloc(g, m8, s, &d));
  CHECK_OK(gma_free(g, d));
  CHECK_OK(gma_alloc(g, m8, s, &e));
  CHECK(e == d); /* the best fit, whether still S's or already in the free pool */
  CHECK_SS(sstats(g, s), 5, 4, h, 5 - h, m8, 0, 2 * k64);
  CHECK_OK(gma_free(g, e));
  CHECK_SS(sstats(g, s), 5, 5, h, 5 - h, 0, m8, 2 * k64 + m8);

  gma_stats_t st = stats_of(g);
  CHECK(st.num_allocs == 5 && st.num_frees == 5);
  CHECK(st.hits_bin == h);
  CHECK(st.hits_bin + st.hits_stream + st.hits_pool + st.hits_device == st.num_allocs);
  CHECK(st.hits_stream + st.hits_pool >= 1); /* e reused d's memory */
  CHECK(st.num_streams == 1);

  /* Unknown streams and bad arguments. */
  gma_stream_stats_t ss = GMA_STREAM_STATS_INIT;
  CHECK_ST(gma_stream_stats(g, (gma_stream_t)(uintptr_t)0xdead0000, &ss),
           GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_stream_stats(g, s, NULL), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_stream_stats(NULL, s, &ss), GMA_ERR_INVALID_ARGUMENT);
  CHECK_OK(gma_stream_retire(g, s));
  CHECK_ST(gma_stream_stats(g, s, &ss), GMA_ERR_INVALID_ARGUMENT);
  CHECK(stats_of(g).num_streams == 0);

  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_destroy(g));
}

static void test_stream_stats(void) {
  stream_stats_sequence(NULL, 1);
  stream_stats_sequence("bins:off", 0);
  printf("(d) stream stats match the sequence with bins on and off; unknown streams rejected\n");
}

/* ---- (e) reuse policies ----------------------------------------------------------- */

/* reuse:none: a block freed on S never serves U, even once S is idle; after
 * S is retired (and its work done) it goes to the pool. */
static void test_reuse_none(void) {
  gma_t *g = sim_allocator_ordinary("reuse:none");
  gma_stream_t s, u, v;
  CHECK_OK(gma_stream_create(g, &s));
  CHECK_OK(gma_stream_create(g, &u));
  CHECK_OK(gma_stream_create(g, &v));
  /* 64 KiB goes through the bins; 12 MiB (above bin_max and above the
   * shared large segments' 10 MiB) has a segment of its own. */
  const size_t sizes[2] = {64 * KiB, 12 * MiB};
  void *xs[2];
  for (int k = 0; k < 2; k++) {
    CHECK_OK(gma_alloc(g, sizes[k], s, &xs[k]));
    CHECK_OK(gma_free(g, xs[k]));
  }
  CHECK_OK(gma_stream_synchronize(g, s));
  sleep_us(5000); /* S's work is long done: only the policy keeps X from U */
  enum { NU = 6 };
  for (int k = 0; k < 2; k++) {
    void *ys[NU];
    uint64_t grown = stats_of(g).num_device_allocs;
    for (int i = 0; i < NU; i++) {
      CHECK_OK(gma_alloc(g, sizes[k], u, &ys[i]));
      CHECK(!overlaps(ys[i], sizes[k], xs[k], sizes[k]));
    }
    if (k == 1) CHECK(stats_of(g).num_device_allocs == grown + NU); /* grew instead */
    for (int i = 0; i < NU; i++) CHECK_OK(gma_free(g, ys[i]));
  }
  /* U's freed blocks stay U's too. Once S is retired and drained, its 12 MiB
   * block is the only free one of that size: a fresh stream V gets it. */
  CHECK_OK(gma_stream_retire(g, s));
  CHECK_OK(gma_stream_synchronize(g, s));
  uint64_t grown = stats_of(g).num_device_allocs;
  void *z;
  CHECK_OK(gma_alloc(g, sizes[1], v, &z));
  CHECK(z == xs[1]);
  CHECK(stats_of(g).num_device_allocs == grown);
  CHECK(stats_of(g).num_cross_stream_waits == 0);
  CHECK_OK(gma_free(g, z));
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_stream_destroy(g, u));
  CHECK_OK(gma_stream_destroy(g, v));
  CHECK_OK(gma_destroy(g));
}

/* A kernel on U that notes, when it starts, whether S's held kernel had
 * finished, then writes the block. */
typedef struct probe {
  held_t *other, *other2; /* other2: NULL, or a second holder it must follow too */
  atomic_int started, saw_other_done;
  pattern_kernel_t k;
} probe_t;

static void probe_run(void *arg) {
  probe_t *p = arg;
  atomic_store(&p->saw_other_done,
               atomic_load(&p->other->done) && (!p->other2 || atomic_load(&p->other2->done)));
  atomic_store(&p->started, 1);
  pattern_kernel_run(&p->k);
}

/* Opens the gate after 3 s in case gma_alloc blocked the host waiting for
 * the held kernel (it must not): the test then fails instead of hanging. */
typedef struct watchdog {
  atomic_int *gate;
  atomic_int stop;
  atomic_int *gate2; /* NULL, or a second gate it opens too */
} watchdog_t;

static void *watchdog_main(void *arg) {
  watchdog_t *w = arg;
  for (int i = 0; i < 3000 && !atomic_load(&w->stop); i++) sleep_us(1000);
  atomic_store(w->gate, 1);
  if (w->gate2) atomic_store(w->gate2, 1);
  return NULL;
}

/* X (12 MiB, a segment of its own) is freed on S while a kernel holds it:
 * S's own kernel (holders 0); a kernel on a third stream R declared with
 * gma_record_stream while S is idle (1); or both, each on half of X (2). U
 * asks for 12 MiB. Under reuse:wait, handing X to U (with U made to wait on
 * the device for every holder's event) saves growing the pool; under
 * reuse:query it must not. */
static void reuse_held_block(const char *conf, int wait_policy, int holders) {
  gma_t *g = sim_allocator_ordinary(conf);
  const size_t len = 12 * MiB;
  atomic_int gate = 0, gate2 = 0, corruptions = 0;
  gma_stream_t s, u, r;
  CHECK_OK(gma_stream_create(g, &s));
  CHECK_OK(gma_stream_create(g, &u));
  CHECK_OK(gma_stream_create(g, &r));
  void *x, *y;
  CHECK_OK(gma_alloc(g, len, s, &x));
  int via_record = holders > 0, both = holders == 2;
  size_t half = both ? len / 2 : 0;
  held_t hx = {{(char *)x + half, len - half, 0x5A, &gate, 0, &corruptions, 0}, 0};
  held_t hs = {{x, half, 0x5C, &gate2, 0, &corruptions, 0}, 0}; /* ends after hx */
  /* Fresh memory: R needs no ordering after earlier work to use it. */
  CHECK_OK(gma_sim_launch(g, via_record ? r : s, held_run, &hx));
  pattern_kernel_wait_started(&hx.k);
  if (both) {
    CHECK_OK(gma_sim_launch(g, s, held_run, &hs));
    pattern_kernel_wait_started(&hs.k);
  }
  if (via_record) CHECK_OK(gma_record_stream(g, x, r));
  CHECK_OK(gma_free(g, x));

  watchdog_t wd = {&gate, 0, &gate2};
  pthread_t wt;
  CHECK(pthread_create(&wt, NULL, watchdog_main, &wd) == 0);
  uint64_t t0 = now_ns();
  CHECK_OK(gma_alloc(g, len, u, &y));
  uint64_t alloc_ns = now_ns() - t0;
  CHECK(!atomic_load(&hx.done)); /* gma_alloc returned without waiting for the holders */
  CHECK(!atomic_load(&hs.done));
  CHECK(alloc_ns < 1000000000u);

  probe_t pr = {&hx, both ? &hs : NULL, 0, 0, {y, len, 0x6B, NULL, 0, &corruptions, 0}};
  CHECK_OK(gma_sim_launch(g, u, probe_run, &pr));
  sleep_us(20000);
  gma_stats_t st = stats_of(g);
  /* Under reuse:wait X must come back to U, whoever holds it: it is the
   * only fit without growing. A block freed after gma_record_stream waits
   * for its owner's and every recorded stream's events. */
  int handed = y == x;
  if (wait_policy) {
    CHECK(handed);
    CHECK(st.num_cross_stream_waits > 0);
    CHECK(st.reserved.current == len); /* no second segment */
    CHECK(!atomic_load(&pr.started)); /* U waits on the device for the holders' events */
  } else {
    CHECK(!overlaps(y, len, x, len));
    CHECK(st.num_cross_stream_waits == 0);
  }
  atomic_store(&gate, 1);
  if (both && wait_policy) { /* R's holder is done; S's (X's owner) is not: U still waits */
    held_wait_done(&hx);
    sleep_us(20000);
    CHECK(!atomic_load(&pr.started));
  }
  atomic_store(&gate2, 1);
  CHECK_OK(gma_stream_synchronize(g, u));
  CHECK_OK(gma_stream_synchronize(g, s));
  CHECK_OK(gma_stream_synchronize(g, r));
  atomic_store(&wd.stop, 1);
  CHECK(pthread_join(wt, NULL) == 0);
  CHECK(atomic_load(&pr.started));
  if (wait_policy) CHECK(atomic_load(&pr.saw_other_done)); /* after every holder */
  CHECK(atomic_load(&corruptions) == 0);
  CHECK_OK(gma_free(g, y));
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_stream_destroy(g, u));
  CHECK_OK(gma_stream_destroy(g, r));
  CHECK_OK(gma_destroy(g));
}

static void test_reuse_policies(void) {
  test_reuse_none();
  printf("(e) reuse:none: S's freed blocks never served U; after retire they did\n");
  reuse_held_block("reuse:wait", 1, 0);
  printf("(e) reuse:wait: U got S's held block and its kernel ran only after S's finished\n");
  reuse_held_block("reuse:wait", 1, 1);
  printf("(e) reuse:wait: U got a block a record_stream user held, after that user's work\n");
  reuse_held_block("reuse:wait", 1, 2);
  printf("(e) reuse:wait: U got a block S and a record_stream user held, after both\n");
  reuse_held_block(NULL, 0, 0);
  reuse_held_block(NULL, 0, 1);
  reuse_held_block(NULL, 0, 2);
  printf("(e) reuse:query: U did not get a held block (S's own or a record_stream user's)\n");
}

/* The busy-retirement cases run last: a failure there stops the program, and
 * the other sections are independent of them. */
int main(void) {
  test_handle_recycling();
  test_free_after_recycling();
  test_record_on_recycled_stream();
  test_per_thread_stream(NULL);
  test_per_thread_stream("default_stream:per_thread");
  test_retire();
  test_stream_stats();
  test_reuse_policies();
  test_retire_busy(1);
  test_retire_busy(0);
  printf("test_stream_identity: ok\n");
  return 0;
}
