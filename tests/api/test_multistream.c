/* API test of the safety invariant under concurrency, through gma.h alone.
 *
 * Four streams, one host thread per stream. Each thread allocates blocks of
 * random sizes on its stream and gives every block a simulated kernel that
 * fills it with a pattern unique to the allocation, sleeps 100-500 us, and
 * then checks the pattern is intact. The thread frees the block right after
 * queueing the kernel, so the allocator holds a block whose stream is still
 * using it: if it ever hands that memory to another stream before the kernel
 * finished, the other allocation's kernel overwrites the pattern and a
 * corruption is counted. Some blocks are also used on a second stream (a
 * kernel there fills, sleeps and checks its own part of the block) and
 * declared with gma_record_stream before the free, so that free must wait for
 * both streams.
 *
 * gma promises a block is safe at once only on the stream it was allocated
 * on: a block reused from that stream's cache may still be in use by work
 * queued earlier on that stream, which stream order alone protects. Before a
 * second stream may touch it, that stream must be ordered after the owner's
 * earlier work (in CUDA, cudaStreamWaitEvent); the public API has no events,
 * so the test synchronizes the owner stream first. The two kernels of a
 * shared block touch disjoint halves: they are not ordered with each other,
 * and two unordered kernels writing the same bytes would be a race in the
 * test, not in gma.
 *
 * At the end: zero corruptions, every kernel ran, every call succeeded, and
 * the accounting equation holds. Usage: test_multistream [seed] [iterations]. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "gma.h"

enum { NSTREAMS = 4, WINDOW = 6 };

typedef struct shared {
  gma_t *g;
  gma_stream_t streams[NSTREAMS];
  uint64_t seed;
  int iterations;
  atomic_ullong next_id;          /* allocation ids, for unique patterns */
  atomic_ullong corruptions;      /* words found not holding their pattern */
  atomic_ullong kernels_queued;   /* kernels launched successfully */
  atomic_ullong kernels_run;      /* kernels that finished */
  atomic_ullong failures;         /* gma calls that did not return GMA_OK */
  atomic_ullong shared_blocks;    /* blocks used on a second stream */
} shared_t;

/* One kernel's work: a region of a block and the pattern to put there. */
typedef struct kernel_arg {
  shared_t *sh;
  uint64_t *words;
  size_t nwords;
  uint64_t pattern;
  long sleep_us;
} kernel_arg_t;

static uint64_t xorshift(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

static uint64_t mix(uint64_t x) { /* splitmix64 finalizer: ids to patterns */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
  nanosleep(&ts, NULL);
}

/* Runs on a simulated stream's thread: fill, let time pass so another stream
 * could run into the block, then check every word. */
static void pattern_kernel(void *argp) {
  kernel_arg_t *a = argp;
  for (size_t i = 0; i < a->nwords; i++) a->words[i] = a->pattern ^ (i * 0x9e3779b97f4a7c15ull);
  sleep_us(a->sleep_us);
  uint64_t bad = 0;
  for (size_t i = 0; i < a->nwords; i++)
    if (a->words[i] != (a->pattern ^ (i * 0x9e3779b97f4a7c15ull))) bad++;
  if (bad) {
    atomic_fetch_add(&a->sh->corruptions, bad);
    fprintf(stderr, "corruption: %llu of %zu words at %p changed under a kernel\n",
            (unsigned long long)bad, a->nwords, (void *)a->words);
  }
  atomic_fetch_add(&a->sh->kernels_run, 1);
  free(a);
}

static void note(shared_t *sh, gma_status_t st, const char *what) {
  if (st != GMA_OK) {
    atomic_fetch_add(&sh->failures, 1);
    fprintf(stderr, "%s: %s (%s)\n", what, gma_status_name(st), gma_last_error());
  }
}

static void launch(shared_t *sh, gma_stream_t s, void *base, size_t bytes, uint64_t *rng) {
  kernel_arg_t *a = malloc(sizeof *a);
  CHECK(a != NULL);
  a->sh = sh;
  a->words = base;
  a->nwords = bytes / sizeof(uint64_t);
  a->pattern = mix(atomic_fetch_add(&sh->next_id, 1) ^ sh->seed);
  a->sleep_us = 100 + (long)(xorshift(rng) % 401);
  gma_status_t st = gma_sim_launch(sh->g, s, pattern_kernel, a);
  note(sh, st, "gma_sim_launch");
  if (st == GMA_OK)
    atomic_fetch_add(&sh->kernels_queued, 1);
  else
    free(a);
}

typedef struct worker {
  shared_t *sh;
  int index;
} worker_t;

static void *worker_main(void *argp) {
  worker_t *w = argp;
  shared_t *sh = w->sh;
  uint64_t rng = mix(sh->seed + (uint64_t)w->index) | 1;
  gma_stream_t mine = sh->streams[w->index];
  /* A few blocks stay live for a while, so frees happen out of order and
   * blocks of different ages and sizes share segments. */
  void *live[WINDOW] = {0};
  for (int it = 0; it < sh->iterations; it++) {
    /* Log-uniform sizes from 8 B to 1 MiB, now and then up to 4 MiB. */
    unsigned bits = 3 + (unsigned)(xorshift(&rng) % 18);
    if (xorshift(&rng) % 32 == 0) bits = 22;
    size_t size = 8 + (size_t)(xorshift(&rng) % ((uint64_t)1 << bits));
    size &= ~(size_t)7; /* whole words for the pattern */
    void *p = NULL;
    gma_status_t st = gma_alloc(sh->g, size, mine, &p);
    note(sh, st, "gma_alloc");
    if (st != GMA_OK) continue;

    if (size >= 1024 && xorshift(&rng) % 4 == 0) {
      /* Shared: own stream on the first half, another stream on the second. */
      size_t half = size / 2 & ~(size_t)7;
      int other = (w->index + 1 + (int)(xorshift(&rng) % (NSTREAMS - 1))) % NSTREAMS;
      /* Order the other stream after everything that used this memory before
       * (see the top of the file). */
      note(sh, gma_stream_synchronize(sh->g, mine), "gma_stream_synchronize");
      launch(sh, mine, p, half, &rng);
      launch(sh, sh->streams[other], (char *)p + half, size - half, &rng);
      note(sh, gma_record_stream(sh->g, p, sh->streams[other]), "gma_record_stream");
      atomic_fetch_add(&sh->shared_blocks, 1);
    } else {
      launch(sh, mine, p, size, &rng);
    }

    int slot = (int)(xorshift(&rng) % WINDOW);
    if (live[slot]) note(sh, gma_free(sh->g, live[slot]), "gma_free");
    live[slot] = p;
  }
  for (int i = 0; i < WINDOW; i++)
    if (live[i]) note(sh, gma_free(sh->g, live[i]), "gma_free");
  return NULL;
}

int main(int argc, char **argv) {
  static shared_t sh;
  sh.seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL);
  sh.iterations = argc > 2 ? atoi(argv[2]) : 1000;
  printf("test_multistream: seed %llu, %d iterations per stream "
         "(rerun with: test_multistream %llu %d)\n",
         (unsigned long long)sh.seed, sh.iterations, (unsigned long long)sh.seed, sh.iterations);

  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1;
  CHECK_OK(gma_create(&c, &sh.g));
  for (int i = 0; i < NSTREAMS; i++) CHECK_OK(gma_stream_create(sh.g, &sh.streams[i]));

  pthread_t threads[NSTREAMS];
  worker_t workers[NSTREAMS];
  for (int i = 0; i < NSTREAMS; i++) {
    workers[i] = (worker_t){&sh, i};
    CHECK(pthread_create(&threads[i], NULL, worker_main, &workers[i]) == 0);
  }
  for (int i = 0; i < NSTREAMS; i++) CHECK(pthread_join(threads[i], NULL) == 0);
  for (int i = 0; i < NSTREAMS; i++) CHECK_OK(gma_stream_synchronize(sh.g, sh.streams[i]));

  gma_stats_t s = GMA_STATS_INIT;
  CHECK_OK(gma_stats(sh.g, &s));
  printf("kernels %llu queued / %llu run, %llu shared blocks, corruptions %llu, failures %llu\n"
         "allocs %llu frees %llu, hits bin/stream/pool/device %llu/%llu/%llu/%llu, device allocs %llu, "
         "peak reserved %.1f MiB\n",
         (unsigned long long)sh.kernels_queued, (unsigned long long)sh.kernels_run,
         (unsigned long long)sh.shared_blocks, (unsigned long long)sh.corruptions,
         (unsigned long long)sh.failures, (unsigned long long)s.num_allocs,
         (unsigned long long)s.num_frees, (unsigned long long)s.hits_bin,
         (unsigned long long)s.hits_stream,
         (unsigned long long)s.hits_pool, (unsigned long long)s.hits_device,
         (unsigned long long)s.num_device_allocs, s.reserved.peak / 1048576.0);

  CHECK(atomic_load(&sh.corruptions) == 0);
  CHECK(atomic_load(&sh.failures) == 0);
  CHECK(atomic_load(&sh.kernels_run) == atomic_load(&sh.kernels_queued));
  CHECK(s.num_allocs == (uint64_t)NSTREAMS * (uint64_t)sh.iterations);
  CHECK(s.num_frees == s.num_allocs);
  CHECK(s.allocated.current == 0);
  CHECK(s.reserved.current ==
        s.allocated.current + s.stream_cached_bytes + s.pending_bytes + s.free_bytes);
  CHECK(s.hits_bin + s.hits_stream + s.hits_pool + s.hits_device == s.num_allocs);

  for (int i = 0; i < NSTREAMS; i++) CHECK_OK(gma_stream_destroy(sh.g, sh.streams[i]));
  CHECK_OK(gma_destroy(sh.g));
  printf("test_multistream: ok\n");
  return 0;
}
