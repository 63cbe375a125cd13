/* The per-thread stream cache in front of the stream table (stream_cache.c,
 * issue 16), looked at directly through gma__stream_cached, since what it
 * saves (a device call per bin hit) is only countable on the fake CUDA
 * driver (fakecuda_backend_hotpath) and a stale entry is mostly harmless
 * in one thread (a retire drains the bins an entry would pop from):
 *   - filled by the second allocation on a stream (the first makes the
 *     record), for a created stream, the NULL / legacy stream (one record)
 *     and the per-thread stream;
 *   - invalidated by a retire: gma_stream_retire of a live stream, and
 *     gma_stream_destroy followed by a new stream that gets the same handle
 *     value (the simulated device recycles them): no entry until the next
 *     allocation looks the stream up again, which caches the new record;
 *   - another thread's entries are its own: a thread that never allocated
 *     on a stream has none, and its per-thread stream is another record;
 *   - a pool torn down and made again at the same address (as a gma_t
 *     whose memory malloc hands out again) has no entry from the old one;
 *   - more streams than entries: each still gets its bin hits, right.
 * Internal test (pool.h for gma__pool_of and gma__stream_cached). */
#include <pthread.h>
#include <stdio.h>

#include "base/config.h"
#include "api/allocator.h"
#include "core/internal.h"
#include "simkit.h"

static void pair(gma_t *g, size_t size, gma_stream_t s) {
  void *p = NULL;
  CHECK_OK(gma_alloc(g, size, s, &p));
  CHECK_OK(gma_free(g, p));
}

static gma_stream_stats_t sstats(gma_t *g, gma_stream_t s) {
  gma_stream_stats_t ss = GMA_STREAM_STATS_INIT;
  CHECK_OK(gma_stream_stats(g, s, &ss));
  return ss;
}

static void fills_and_retire_invalidates(void) {
  gma_t *g = sim_allocator(NULL);
  gma__pool_t *p = gma__pool_of(g);
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  gma_stream_t handles[] = {s, NULL, GMA_STREAM_PER_THREAD};
  for (int i = 0; i < 3; i++) {
    CHECK(gma__stream_cached(p, handles[i]) == NULL);
    pair(g, 4096, handles[i]); /* makes the record (slow path) */
    pair(g, 4096, handles[i]); /* looks it up with the device's id: cached */
    gma__stream_t *rec = gma__stream_cached(p, handles[i]);
    CHECK(rec != NULL && rec == gma__stream_find(p, handles[i]));
  }
  CHECK(gma__stream_cached(p, GMA_STREAM_LEGACY) == gma__stream_cached(p, NULL));

  /* Retired, still alive. */
  gma__stream_t *old = gma__stream_cached(p, s);
  CHECK_OK(gma_stream_retire(g, s));
  CHECK(gma__stream_cached(p, s) == NULL);
  pair(g, 4096, s);
  pair(g, 4096, s);
  gma__stream_t *now = gma__stream_cached(p, s);
  CHECK(now != NULL && now != old && now->id == old->id); /* the same stream, a new record */

  /* Destroyed through gma, the handle value recycled. */
  CHECK_OK(gma_stream_destroy(g, s));
  gma_stream_t s2;
  CHECK_OK(gma_stream_create(g, &s2));
  CHECK(s2 == s); /* the simulated device hands the value out again (LIFO) */
  CHECK(gma__stream_cached(p, s2) == NULL);
  pair(g, 4096, s2);
  CHECK(gma__stream_cached(p, s2) == NULL); /* made the record; not looked up yet */
  pair(g, 4096, s2);
  gma__stream_t *rec2 = gma__stream_cached(p, s2);
  CHECK(rec2 != NULL && rec2 != now && rec2->id != now->id);
  gma_stream_stats_t ss = sstats(g, s2);
  CHECK(ss.allocs == 2 && ss.hits == 1 && ss.misses == 1);

  /* The per-thread stream, retired from its thread. */
  CHECK_OK(gma_stream_retire(g, GMA_STREAM_PER_THREAD));
  CHECK(gma__stream_cached(p, GMA_STREAM_PER_THREAD) == NULL);
  CHECK(gma__stream_cached(p, NULL) != NULL); /* others' entries stay */
  CHECK_OK(gma_stream_destroy(g, s2));
  CHECK_OK(gma_destroy(g));
  printf("fills and retire invalidates: ok\n");
}

typedef struct other {
  gma_t *g;
  gma_stream_t s;
  gma__stream_t *main_ptds;
} other_t;

static void *other_thread(void *arg) {
  other_t *o = arg;
  gma__pool_t *p = gma__pool_of(o->g);
  CHECK(gma__stream_cached(p, o->s) == NULL); /* the main thread's entry is not ours */
  CHECK(gma__stream_cached(p, GMA_STREAM_PER_THREAD) == NULL);
  pair(o->g, 4096, o->s);
  CHECK(gma__stream_cached(p, o->s) == gma__stream_find(p, o->s)); /* looked up: cached */
  pair(o->g, 4096, GMA_STREAM_PER_THREAD);
  pair(o->g, 4096, GMA_STREAM_PER_THREAD);
  gma__stream_t *mine = gma__stream_cached(p, GMA_STREAM_PER_THREAD);
  CHECK(mine != NULL && mine != o->main_ptds);
  return NULL;
}

static void per_thread(void) {
  gma_t *g = sim_allocator(NULL);
  gma__pool_t *p = gma__pool_of(g);
  other_t o = {g, NULL, NULL};
  CHECK_OK(gma_stream_create(g, &o.s));
  pair(g, 4096, o.s);
  pair(g, 4096, o.s);
  pair(g, 4096, GMA_STREAM_PER_THREAD);
  pair(g, 4096, GMA_STREAM_PER_THREAD);
  o.main_ptds = gma__stream_cached(p, GMA_STREAM_PER_THREAD);
  CHECK(o.main_ptds != NULL);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, other_thread, &o) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(gma__stream_cached(p, GMA_STREAM_PER_THREAD) == o.main_ptds);
  CHECK_OK(gma_stream_destroy(g, o.s));
  CHECK_OK(gma_destroy(g));
  printf("per thread: ok\n");
}

/* A pool torn down and made again at the same address (as an allocator
 * struct whose memory malloc hands out again) must not see the old pool's
 * entries, whose records are freed: pool serials tell them apart. Done on a
 * pool of our own, since gma_t addresses recur only by chance. */
static void pool_remade_at_same_address(void) {
  gma_config_t cfg;
  gma_config_t in = GMA_CONFIG_INIT;
  in.device = GMA_DEVICE_SIM;
  in.ignore_env = 1;
  in.worker_off = 1;
  CHECK_OK(gma__config_resolve(&in, &cfg));
  gma__device_t *dev;
  CHECK_OK(gma__sim_create(&cfg, &dev));
  uint64_t id, total;
  CHECK_OK(dev->ops->mem_info(dev, &id, &total));
  if (!cfg.memory_limit || cfg.memory_limit > total) cfg.memory_limit = total;
  CHECK_OK(dev->ops->stream_id(dev, NULL, &id));
  static gma__pool_t pool; /* one address for both lives */
  uint64_t serials[2];
  for (int life = 0; life < 2; life++) {
    gma__pool_t *p = &pool;
    CHECK_OK(gma__pool_init(p, dev, &cfg));
    serials[life] = p->serial;
    CHECK(gma__stream_cached(p, NULL) == NULL);
    void *x;
    if (gma__bin_alloc(p, 4096, NULL, id, &x) != GMA_OK) /* no record yet: the slow path */
      CHECK_OK(gma__pool_alloc_slow(p, 4096, NULL, id, GMA__ALLOC_WAIT, &x));
    CHECK_OK(gma__bin_free(p, x));
    CHECK_OK(gma__bin_alloc(p, 4096, NULL, id, &x)); /* looked up, cached, a hit */
    CHECK(gma__stream_cached(p, NULL) == gma__stream_find(p, NULL));
    CHECK_OK(gma__bin_free(p, x));
    CHECK_OK(gma__pool_fini(p));
  }
  CHECK(serials[0] != serials[1]);
  dev->ops->destroy(dev);
  printf("pool remade at the same address: no stale entry (serials %llu, %llu)\n",
         (unsigned long long)serials[0], (unsigned long long)serials[1]);
}

/* Twice as many streams as entries, used in turn: evictions, never a wrong
 * record (each stream's hits and allocations stay its own). */
static void more_streams_than_entries(void) {
  gma_t *g = sim_allocator(NULL);
  enum { N = 2 * GMA__TL_STREAMS };
  gma_stream_t s[N];
  for (int i = 0; i < N; i++) CHECK_OK(gma_stream_create(g, &s[i]));
  for (int round = 0; round < 50; round++)
    for (int i = 0; i < N; i++) pair(g, 4096, s[i]);
  for (int i = 0; i < N; i++) {
    gma_stream_stats_t ss = sstats(g, s[i]);
    CHECK(ss.allocs == 50 && ss.frees == 50 && ss.misses == 1 && ss.hits == 49);
    CHECK_OK(gma_stream_destroy(g, s[i]));
  }
  CHECK_OK(gma_destroy(g));
  printf("more streams than entries: ok\n");
}

int main(void) {
  fills_and_retire_invalidates();
  per_thread();
  more_streams_than_entries();
  pool_remade_at_same_address();
  printf("test_stream_cache: ok\n");
  return 0;
}
