/* Stress of gma on the CUDA backend: several threads, each with its own
 * streams (one of them the thread's per-thread default stream on odd
 * threads), allocate random sizes from 512 B to 8 MiB and fill each block
 * with its own pattern on its stream; a quarter of the blocks are also read
 * by a second stream (ordered after the fill by an event) and declared with
 * gma_record_stream. Frees are stream-ordered: a sample of the block (head,
 * middle, tail) is copied to the host on its stream, then the block is freed
 * at once, without waiting; samples go to pinned host memory, so the copies
 * are asynchronous on a GPU too. A third of the frees happen while their
 * stream is held busy (cuStreamWaitValue32 on a pinned word the thread
 * releases at its next check), so the sample copy has surely not run when
 * the block is freed and other threads allocate: that is the window in
 * which an early reuse would overwrite it. Every few operations a thread
 * synchronizes its
 * streams and checks the copies: a block handed out again while earlier work
 * on any stream still used it gets overwritten by its next owner's fill
 * before that work read it, and shows up as a corruption. Live blocks are
 * also kept in one address-ordered table; two live blocks that overlap are
 * counted. Both counts must be zero, with expandable_segments false and true.
 *
 * Built with GMA_STRESS_PLANT (fakecuda_stress_planted, an internal test),
 * gma's epoch gating is switched off (GMA__TEST_NO_EPOCH_GATING: a freed
 * block is free for every stream at once) and the run passes only if it
 * finds corruption: proof that the held streams open a window this test
 * can see.
 *
 * Usage: test_gpu_stress [seed [ops_per_thread [threads [streams_per_thread]]]]
 * (defaults 1 300 4 2: a small run). Skips (77) without a CUDA device. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "drv.h"
#include "rng.h"
#ifdef GMA_STRESS_PLANT
#include "api/allocator.h"
#include "core/internal.h" /* gma__pool_of and the planted switch */
#endif

#define MAX_LIVE 24
#define MAX_STREAMS 8
#define LIVE_BUDGET ((size_t)48 << 20) /* per thread */
#define WINDOW 4096                    /* bytes per sampled window */
#define CHECK_EVERY 32                 /* ops between a thread's verifications */
/* Samples between two verifications: one per op, and the final frees. */
#define SAMPLES_MAX (CHECK_EVERY + MAX_LIVE)
#define SAMPLE_BYTES (3 * WINDOW)

static gma_t *g;
static uint64_t seed = 1;
static unsigned ops = 300, nthreads = 4, nstreams = 2;
static atomic_ullong corruptions, overlaps, allocs, recorded, checked, held;

/* Live blocks of every thread, address-ordered; overlaps means the allocator
 * handed out memory twice. */
typedef struct range {
  uintptr_t lo, hi;
} range_t;
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static range_t *live_tab; /* live_mu */
static size_t nlive_tab;  /* live_mu */

static size_t tab_upper(uintptr_t lo) {
  size_t a = 0, b = nlive_tab;
  while (a < b) {
    size_t m = a + (b - a) / 2;
    if (live_tab[m].lo <= lo) a = m + 1;
    else b = m;
  }
  return a;
}

static void live_add(uintptr_t lo, size_t size) {
  pthread_mutex_lock(&live_mu);
  size_t i = tab_upper(lo);
  bool bad = (i > 0 && live_tab[i - 1].hi > lo) || (i < nlive_tab && live_tab[i].lo < lo + size);
  if (bad) {
    atomic_fetch_add(&overlaps, 1);
    fprintf(stderr, "overlap: [%#lx, +%zu) overlaps a live block\n", (unsigned long)lo, size);
  } else {
    memmove(&live_tab[i + 1], &live_tab[i], (nlive_tab - i) * sizeof *live_tab);
    live_tab[i] = (range_t){lo, lo + size};
    nlive_tab++;
  }
  pthread_mutex_unlock(&live_mu);
}

static void live_remove(uintptr_t lo) {
  pthread_mutex_lock(&live_mu);
  size_t i = tab_upper(lo);
  if (i > 0 && live_tab[i - 1].lo == lo) {
    memmove(&live_tab[i - 1], &live_tab[i], (nlive_tab - i) * sizeof *live_tab);
    nlive_tab--;
  }
  pthread_mutex_unlock(&live_mu);
}

typedef struct block {
  char *p;
  size_t size;
  size_t bytes; /* filled bytes: the size rounded down to whole words */
  gma_stream_t s;
  uint32_t v;
} block_t;

/* A sample copied to the host, to check once its stream is synchronized. */
typedef struct sample {
  uint32_t *host;
  size_t words;
  uint32_t v;
  const char *what;
} sample_t;

typedef struct worker {
  unsigned id;
  uint64_t rng;
  gma_stream_t streams[MAX_STREAMS];
  block_t live[MAX_LIVE];
  size_t nlive, live_bytes;
  sample_t samples[SAMPLES_MAX];
  size_t nsamples;
  char *arena;             /* pinned: SAMPLES_MAX samples' host buffers */
  volatile uint32_t *flag; /* pinned: what held streams wait for */
  uint32_t hold_seq;       /* held streams wait for flag >= hold_seq + 1 */
  bool holding;
} worker_t;

/* Copies the head, middle and tail of b (all of it when small) to a host
 * buffer on stream s; the check comes later. */
static void sample(worker_t *w, const block_t *b, gma_stream_t s, const char *what) {
  size_t win = b->bytes < 3 * WINDOW ? b->bytes : WINDOW;
  size_t nwin = b->bytes < 3 * WINDOW ? 1 : 3;
  CHECK(w->nsamples < SAMPLES_MAX);
  uint32_t *host = (uint32_t *)(w->arena + w->nsamples * SAMPLE_BYTES);
  size_t offs[3] = {0, (b->bytes / 2 - win / 2) & ~(size_t)3, b->bytes - win};
  for (size_t i = 0; i < nwin; i++) drv_to_host((char *)host + i * win, b->p + offs[i], win, s);
  w->samples[w->nsamples++] = (sample_t){host, nwin * win / 4, b->v, what};
}

static void verify(worker_t *w) {
  if (w->holding) { /* let the held streams run */
    drv_release(w->flag, ++w->hold_seq);
    w->holding = false;
  }
  for (unsigned i = 0; i < nstreams; i++) drv_sync(w->streams[i]);
  for (size_t i = 0; i < w->nsamples; i++) {
    sample_t *x = &w->samples[i];
    for (size_t k = 0; k < x->words; k++) {
      if (x->host[k] != x->v) {
        atomic_fetch_add(&corruptions, 1);
        fprintf(stderr, "thread %u: corruption in a %s sample: word %zu is %08x, expected %08x\n",
                w->id, x->what, k, x->host[k], x->v);
        break;
      }
    }
    atomic_fetch_add(&checked, 1);
  }
  w->nsamples = 0;
}

static void do_alloc(worker_t *w) {
  unsigned e = 9 + (unsigned)(rnd(&w->rng) % 14); /* 512 B .. 8 MiB, log-uniform */
  size_t size = ((size_t)1 << e) + rnd(&w->rng) % ((size_t)1 << e);
  if (size > ((size_t)8 << 20)) size = (size_t)8 << 20;
  if (w->live_bytes + size > LIVE_BUDGET) return;
  unsigned si = (unsigned)(rnd(&w->rng) % nstreams);
  block_t b = {NULL, size, size & ~(size_t)3, w->streams[si], 0};
  CHECK_OK(gma_alloc(g, size, b.s, (void **)&b.p));
  CHECK((uintptr_t)b.p % 256 == 0);
  live_add((uintptr_t)b.p, size);
  b.v = (uint32_t)(rnd(&w->rng) >> 32) | 1u;
  drv_memset32(b.p, b.v, b.bytes, b.s);
  atomic_fetch_add(&allocs, 1);
  if (nstreams > 1 && rnd(&w->rng) % 4 == 0) {
    /* A second stream reads it after the fill; its read must complete
     * before anyone gets the block again. */
    gma_stream_t o = w->streams[(si + 1 + rnd(&w->rng) % (nstreams - 1)) % nstreams];
    drv_order(o, b.s);
    sample(w, &b, o, "second-stream read");
    CHECK_OK(gma_record_stream(g, b.p, o));
    atomic_fetch_add(&recorded, 1);
  }
  w->live[w->nlive++] = b;
  w->live_bytes += size;
}

static void do_free(worker_t *w, size_t i) {
  block_t b = w->live[i];
  w->live[i] = w->live[--w->nlive];
  w->live_bytes -= b.size;
  if (rnd(&w->rng) % 3 == 0 && drv_hold(b.s, w->flag, w->hold_seq + 1)) {
    w->holding = true; /* the sample below waits for the thread's next check */
    atomic_fetch_add(&held, 1);
  }
  sample(w, &b, b.s, "before-free");
  live_remove((uintptr_t)b.p);
  CHECK_OK(gma_free(g, b.p)); /* stream-ordered: the sample copy runs first */
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  drv_bind_thread();
  for (unsigned op = 0; op < ops; op++) {
    bool alloc = w->nlive == 0 || (w->nlive < MAX_LIVE && rnd(&w->rng) % 100 < 55);
    if (alloc) {
      do_alloc(w);
    } else {
      do_free(w, (size_t)(rnd(&w->rng) % w->nlive));
    }
    if (op % CHECK_EVERY == CHECK_EVERY - 1) verify(w);
  }
  while (w->nlive) do_free(w, w->nlive - 1);
  verify(w);
  return NULL;
}

static void phase(const char *conf) {
  atomic_store(&allocs, 0);
  atomic_store(&recorded, 0);
  atomic_store(&checked, 0);
  atomic_store(&held, 0);
  g = drv_cuda_allocator(conf);
#ifdef GMA_STRESS_PLANT
  gma__pool_of(g)->test_flags = GMA__TEST_NO_EPOCH_GATING;
#endif
  worker_t *ws = calloc(nthreads, sizeof *ws);
  pthread_t *th = calloc(nthreads, sizeof *th);
  CHECK(ws && th);
  /* Pinned memory is taken and given back only while no stream is held:
   * cuMemFreeHost synchronizes the device, so a thread freeing a sample
   * buffer while another thread's stream waits for that thread's next check
   * waits for ever; on an H100 it also blocked the other threads' driver
   * calls (cuMemHostAlloc, cuEventRecord) behind it. */
  for (unsigned t = 0; t < nthreads; t++) {
    ws[t].arena = drv_pinned((size_t)SAMPLES_MAX * SAMPLE_BYTES);
    ws[t].flag = drv_pinned(64);
    *ws[t].flag = 0;
  }
  for (unsigned t = 0; t < nthreads; t++) {
    ws[t].id = t;
    ws[t].rng = seed * 0x9e3779b97f4a7c15ull + t + 1;
    for (unsigned k = 0; k < nstreams; k++) {
      if (k == 0 && t % 2 == 1) {
        ws[t].streams[k] = GMA_STREAM_PER_THREAD; /* the worker thread's own */
      } else {
        CHECK_OK(gma_stream_create(g, &ws[t].streams[k]));
      }
    }
  }
  for (unsigned t = 0; t < nthreads; t++)
    CHECK(pthread_create(&th[t], NULL, worker_main, &ws[t]) == 0);
  for (unsigned t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
  for (unsigned t = 0; t < nthreads; t++) {
    drv_pinned_free(ws[t].arena);
    drv_pinned_free((void *)ws[t].flag);
  }
  CHECK(nlive_tab == 0);
  gma_stats_t s = GMA_STATS_INIT;
  CHECK_OK(gma_stats(g, &s));
  CHECK(s.allocated.current == 0);
  CHECK(s.reserved.current ==
        s.allocated.current + s.stream_cached_bytes + s.pending_bytes + s.free_bytes);
  printf("%s: %llu frees while their stream was held%s\n", conf,
         (unsigned long long)atomic_load(&held),
         __atomic_load_n(&drv.cuStreamWaitValue32, __ATOMIC_RELAXED)
             ? ""
             : " (no stream held: the driver has no usable cuStreamWaitValue32)");
  printf("%s: %llu allocations (%llu also read by a second stream), %llu samples checked; "
         "hits bin %llu stream %llu pool %llu device %llu; peak reserved %llu MiB\n",
         conf, (unsigned long long)atomic_load(&allocs), (unsigned long long)atomic_load(&recorded),
         (unsigned long long)atomic_load(&checked), (unsigned long long)s.hits_bin,
         (unsigned long long)s.hits_stream, (unsigned long long)s.hits_pool,
         (unsigned long long)s.hits_device, (unsigned long long)(s.reserved.peak >> 20));
  for (unsigned t = 0; t < nthreads; t++)
    for (unsigned k = 0; k < nstreams; k++)
      if (ws[t].streams[k] != GMA_STREAM_PER_THREAD)
        CHECK_OK(gma_stream_destroy(g, ws[t].streams[k]));
  CHECK_OK(gma_destroy(g));
  uint64_t used = drv_fake_used();
  CHECK(used == UINT64_MAX || used == 0); /* every byte went back to the driver */
  free(ws);
  free(th);
}

int main(int argc, char **argv) {
  if (argc > 1) seed = strtoull(argv[1], NULL, 0);
  if (argc > 2) ops = (unsigned)strtoul(argv[2], NULL, 0);
  if (argc > 3) nthreads = (unsigned)strtoul(argv[3], NULL, 0);
  if (argc > 4) nstreams = (unsigned)strtoul(argv[4], NULL, 0);
  CHECK(ops > 0 && nthreads > 0 && nstreams > 0 && nstreams <= MAX_STREAMS);
  printf("gpu stress: seed %llu, %u ops x %u threads x %u streams (rerun: %s %llu %u %u %u)\n",
         (unsigned long long)seed, ops, nthreads, nstreams, argv[0], (unsigned long long)seed, ops,
         nthreads, nstreams);
  gma_t *probe = drv_cuda_allocator(NULL); /* skips without a CUDA device */
  CHECK_OK(gma_destroy(probe));
  drv_open();
  drv_bind_thread(); /* the pinned buffers are taken here (phase) */
  live_tab = calloc((size_t)nthreads * MAX_LIVE + 1, sizeof *live_tab);
  CHECK(live_tab);
  phase("expandable_segments:false");
  phase("expandable_segments:true");
  free(live_tab);
  unsigned long long c = atomic_load(&corruptions), o = atomic_load(&overlaps);
  printf("corruptions %llu, overlaps %llu\n", c, o);
#ifdef GMA_STRESS_PLANT
  printf("planted (no epoch gating): %s\n", c ? "detected, as it must be" : "NOT detected");
  return c ? 0 : 1;
#else
  CHECK(c == 0 && o == 0);
  return 0;
#endif
}
