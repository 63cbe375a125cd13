/* Stress test of stream-ordered reuse under concurrency: several streams, two
 * (or more) host threads per stream allocating and freeing on it at once, so
 * the per-stream lock-free bins see concurrent pushes and pops, while
 * simulated kernels use the blocks and some blocks are also used on a second
 * stream (declared with gma_record_stream).
 *
 * What would show a bug:
 *  - pattern kernels: a block given a kernel is filled with a pattern unique
 *    to that kernel, held 0-50 us (100-500 us on a second stream), then
 *    verified. If gma hands the memory to
 *    another stream (or back to its own stream past a record_stream user)
 *    while the kernel may still run, the other kernel overwrites the pattern
 *    and one of the two counts a corruption;
 *  - an overlap checker on the host: every live block [p, p + size) is
 *    registered between gma_alloc's return and the gma_free call; two live
 *    blocks that overlap are counted, whatever the device does;
 *  - every gma call must return GMA_OK, and at the end the statistics must
 *    add up (accounting equation, hit levels, per-stream counts) and the
 *    memory must go back to the device.
 *
 * Cross-stream use without events (the public API has none): to use block p
 * of stream S on stream U, the test queues on S (after S's kernel on p) a
 * kernel that sets a flag, then on U a kernel that spins until the flag is
 * set, then U's pattern kernel on p. U's use is thereby ordered after S's
 * earlier work on the device side, as cudaStreamWaitEvent would order it, and
 * gma_record_stream(p, U) tells gma before the free.
 *
 * Kernels touch one 8-byte word per 256 bytes, at offsets 0, 256, 512, ...
 * gma's pointers are 256-byte aligned, so the intersection of two overlapping
 * ranges starts at a 256-byte aligned address that both kernels touch: the
 * sampling loses no overlap and keeps 32 MiB blocks cheap.
 *
 * --plant epoch|record removes one of gma's gates through the test-only
 * switch in pool.h (GMA__TEST_NO_EPOCH_GATING or GMA__TEST_NO_RECORD_GATING).
 * The same workload must then DETECT corruption: the run stops at the first
 * one and exits 0; if the planted bug went unnoticed it exits 1. That shows
 * this test can fail.
 *
 * Usage: stress_streams [seed] [ops] [streams] [threads_per_stream]
 *                       [--plant epoch|record] [--conf key:value,...] [--oom-ok]
 * (--conf configures the allocator as GMA_CONF would, e.g. "reuse:wait" or
 * "bins:off,bin_depth:2", to stress other policies by hand. --oom-ok: with a
 * memory_limit in --conf, gma_alloc may return GMA_ERR_OOM; those are counted,
 * not failures, and everything else is checked as usual.)
 * Internal test: it includes pool.h only for gma__pool_of and the switches. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/allocator.h"
#include "core/internal.h"
#include "simkit.h"
#include "stress_kernel.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

enum {
  WINDOW = 6,         /* live blocks per thread: frees happen out of order */
  KERNEL_ONE_IN = 3,  /* about one block in 3 gets a pattern kernel */
  CROSS_ONE_IN = 8,   /* one kernel-bearing block in 8 is also used on another stream */
  MAX_HOLD_US = 50,   /* pattern kernels hold 0..50 us between fill and verify */
  /* The second stream's kernel of a shared block holds longer: a record_stream
   * bug shows only if the owner stream reuses the block while that kernel
   * still holds it, and shared blocks are few (1 op in 24), so their holds
   * cost little device time. */
  CROSS_HOLD_MIN_US = 100,
  CROSS_HOLD_MAX_US = 500,
  NPOPULAR = 12,      /* sizes that recur, as tensor shapes do in a training step */
  MAX_BACKLOG = 32,   /* pattern kernels queued and unfinished per stream, at most */
  SPIN_LIMIT_US = 10 * 1000 * 1000 /* a flag-wait kernel gives up after 10 s */
};

/* ---- seeded random numbers ------------------------------------------------ */

#include "rng.h" /* rnd(): xorshift64* */

/* ---- the run's shared state --------------------------------------------------- */

typedef struct range {
  uintptr_t start, end;
  uint64_t id;
} range_t;

/* The overlap checker: the live blocks sorted by start. It is the test's own
 * structure, so a mutex is fine; it is never held across a gma call. */
typedef struct checker {
  pthread_mutex_t mu;
  range_t *v;
  size_t n, cap;
  uint64_t next_id;
  uint64_t overlaps; /* mu */
} checker_t;

typedef struct shared {
  gma_t *g;
  gma_stream_t *streams;
  int nstreams, tps;
  uint64_t seed;
  unsigned plant; /* GMA__TEST_* planted, 0 normally */
  bool oom_ok;    /* --oom-ok: a memory_limit run, where gma_alloc may fail */
  size_t popular[NPOPULAR];
  checker_t ck;
  atomic_ullong next_kernel;    /* kernel ids, for unique patterns */
  atomic_ullong corruptions;    /* kernels that found their pattern overwritten */
  atomic_ullong kernels_queued; /* pattern kernels launched */
  atomic_ullong kernels_run;    /* pattern kernels finished */
  atomic_ullong cross_uses;     /* blocks used on a second stream */
  atomic_ullong spin_timeouts;  /* flag-wait kernels that gave up */
  atomic_ullong failures;       /* gma calls that did not return GMA_OK */
  atomic_ullong ooms;           /* gma_alloc's GMA_ERR_OOM under --oom-ok */
  atomic_ullong ops_done;
  atomic_ullong *stream_allocs, *stream_frees; /* per stream, counted by the test */
  atomic_long *backlog; /* per stream: pattern kernels queued and not finished */
} shared_t;

static void note(shared_t *sh, gma_status_t st, const char *what) {
  if (st != GMA_OK) {
    atomic_fetch_add(&sh->failures, 1);
    fprintf(stderr, "%s: %s (%s)\n", what, gma_status_name(st), gma_last_error());
  }
}

/* Registers [p, p + size) and counts every live block it overlaps. */
static uint64_t checker_insert(shared_t *sh, void *p, size_t size) {
  checker_t *c = &sh->ck;
  range_t r = {(uintptr_t)p, (uintptr_t)p + size, 0};
  pthread_mutex_lock(&c->mu);
  r.id = ++c->next_id;
  size_t lo = 0, hi = c->n; /* first entry with start >= r.start */
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (c->v[mid].start < r.start)
      lo = mid + 1;
    else
      hi = mid;
  }
  /* Entries are sorted by start; an earlier one overlaps if it reaches past
   * r.start. Scan back over all of them: earlier overlaps may make the
   * nearest predecessor not the longest one. */
  for (size_t i = lo; i-- > 0;)
    if (c->v[i].end > r.start) {
      c->overlaps++;
      fprintf(stderr, "overlap: [%#" PRIxPTR ", %#" PRIxPTR ") and live [%#" PRIxPTR
                      ", %#" PRIxPTR ")\n",
              r.start, r.end, c->v[i].start, c->v[i].end);
    }
  for (size_t i = lo; i < c->n && c->v[i].start < r.end; i++) {
    c->overlaps++;
    fprintf(stderr, "overlap: [%#" PRIxPTR ", %#" PRIxPTR ") and live [%#" PRIxPTR
                    ", %#" PRIxPTR ")\n",
            r.start, r.end, c->v[i].start, c->v[i].end);
  }
  if (c->n == c->cap) {
    c->cap = c->cap ? 2 * c->cap : 64;
    c->v = realloc(c->v, c->cap * sizeof *c->v);
    CHECK(c->v != NULL);
  }
  memmove(&c->v[lo + 1], &c->v[lo], (c->n - lo) * sizeof *c->v);
  c->v[lo] = r;
  c->n++;
  pthread_mutex_unlock(&c->mu);
  return r.id;
}

/* Unregisters a block; called before gma_free, so that gma may hand the
 * memory out again as soon as the free returns. */
static void checker_remove(shared_t *sh, uint64_t id) {
  checker_t *c = &sh->ck;
  pthread_mutex_lock(&c->mu);
  size_t i = 0;
  while (i < c->n && c->v[i].id != id) i++;
  CHECK(i < c->n);
  memmove(&c->v[i], &c->v[i + 1], (c->n - i - 1) * sizeof *c->v);
  c->n--;
  pthread_mutex_unlock(&c->mu);
}

/* ---- kernels ------------------------------------------------------------------ */


/* The flag of one cross-stream use. The setter's store is its last access;
 * the waiter frees the flag once it has seen it (or leaks it on a timeout,
 * because the setter may still write). */
typedef struct xflag {
  shared_t *sh;
  atomic_int set;
} xflag_t;

static void flag_set_kernel(void *argp) {
  xflag_t *f = argp;
  atomic_store_explicit(&f->set, 1, memory_order_release); /* pairs with the waiter's acquire */
}

static void flag_wait_kernel(void *argp) {
  xflag_t *f = argp;
  for (long waited = 0; !atomic_load_explicit(&f->set, memory_order_acquire); waited += 20) {
    if (waited >= SPIN_LIMIT_US) {
      atomic_fetch_add(&f->sh->spin_timeouts, 1);
      fprintf(stderr, "flag-wait kernel gave up after %d s\n", SPIN_LIMIT_US / 1000000);
      return;
    }
    sleep_us(20);
  }
  free(f);
}

static void launch_pattern(shared_t *sh, int si, void *p, size_t len, long hold_us) {
  stress_pattern_t *a = malloc(sizeof *a);
  CHECK(a != NULL);
  *a = (stress_pattern_t){&sh->corruptions, &sh->kernels_run, &sh->backlog[si], (uintptr_t)p,
                          len, mix64(atomic_fetch_add(&sh->next_kernel, 1) ^ sh->seed), hold_us};
  atomic_fetch_add(&sh->backlog[si], 1);
  gma_status_t st = gma_sim_launch(sh->g, sh->streams[si], stress_pattern_kernel, a);
  note(sh, st, "gma_sim_launch(pattern)");
  if (st == GMA_OK) {
    atomic_fetch_add(&sh->kernels_queued, 1);
  } else {
    atomic_fetch_sub(&sh->backlog[si], 1);
    free(a);
  }
}

/* Keeps the host at most MAX_BACKLOG kernels ahead of a stream, as a GPU's
 * launch queue does. Without it the host runs far ahead, every freed block
 * waits for a long queue, and the pool grows to gigabytes of fresh pages. */
static void throttle(shared_t *sh, int si) {
  while (atomic_load_explicit(&sh->backlog[si], memory_order_relaxed) > MAX_BACKLOG) sleep_us(50);
}

/* Uses p (allocated on stream si, whose pattern kernel is already queued)
 * on stream ui, ordered after si's work by the flag, and tells gma. */
static void cross_use(shared_t *sh, int si, int ui, void *p, size_t len, long hold_us) {
  xflag_t *f = malloc(sizeof *f);
  CHECK(f != NULL);
  f->sh = sh;
  atomic_init(&f->set, 0);
  gma_status_t st = gma_sim_launch(sh->g, sh->streams[si], flag_set_kernel, f);
  note(sh, st, "gma_sim_launch(flag set)");
  if (st != GMA_OK) {
    free(f);
    return;
  }
  st = gma_sim_launch(sh->g, sh->streams[ui], flag_wait_kernel, f);
  note(sh, st, "gma_sim_launch(flag wait)");
  if (st != GMA_OK) return; /* the setter still writes f: leak it */
  launch_pattern(sh, ui, p, len, hold_us);
  note(sh, gma_record_stream(sh->g, p, sh->streams[ui]), "gma_record_stream");
  atomic_fetch_add(&sh->cross_uses, 1);
}

/* ---- the workload ---------------------------------------------------------------- */

/* Sizes: 40% from a seeded table of recurring sizes (so freed blocks are
 * wanted again soon, on their own stream and on others: that is where reuse
 * bugs live), the rest log-uniform from 64 B to 4 MiB (the bins' range by
 * default), and 1 in 16 from 4 to 32 MiB (pool only). Multiples of 8 so a
 * kernel's words stay inside the requested size. */
static size_t pick_size(shared_t *sh, uint64_t *rng) {
  uint64_t r = rnd(rng) % 80;
  size_t size;
  if (r < 5) {
    size = 4 * MiB + rnd(rng) % (28 * MiB);
  } else if (r < 37) {
    size = sh->popular[rnd(rng) % NPOPULAR];
  } else {
    unsigned bits = 6 + (unsigned)(rnd(rng) % 16); /* 2^6 .. 2^21 */
    size_t lo = (size_t)1 << bits;
    size = lo + rnd(rng) % lo;
  }
  size &= ~(size_t)7;
  return size ? size : 8;
}

typedef struct live {
  void *p;
  uint64_t id;
} live_t;

typedef struct worker {
  shared_t *sh;
  int index;
  long ops;
} worker_t;

static void release(shared_t *sh, int si, live_t *l) {
  checker_remove(sh, l->id);
  gma_status_t st = gma_free(sh->g, l->p);
  note(sh, st, "gma_free");
  if (st == GMA_OK) atomic_fetch_add(&sh->stream_frees[si], 1);
  l->p = NULL;
}

static void *worker_main(void *argp) {
  worker_t *w = argp;
  shared_t *sh = w->sh;
  uint64_t rng = mix64(sh->seed ^ mix64((uint64_t)w->index + 1)) | 1;
  int si = w->index / sh->tps; /* tps threads share each stream */
  gma_stream_t mine = sh->streams[si];
  live_t live[WINDOW] = {{0}};
  for (long op = 0; op < w->ops; op++) {
    /* A planted run stops at the first detection: that is all it must show. */
    if (sh->plant && atomic_load_explicit(&sh->corruptions, memory_order_relaxed)) break;
    size_t size = pick_size(sh, &rng);
    void *p = NULL;
    gma_status_t st = gma_alloc(sh->g, size, mine, &p);
    if (st == GMA_ERR_OOM && sh->oom_ok)
      atomic_fetch_add(&sh->ooms, 1);
    else
      note(sh, st, "gma_alloc");
    atomic_fetch_add_explicit(&sh->ops_done, 1, memory_order_relaxed);
    if (st != GMA_OK) continue;
    atomic_fetch_add(&sh->stream_allocs[si], 1);
    uint64_t id = checker_insert(sh, p, size);

    if (rnd(&rng) % KERNEL_ONE_IN == 0) {
      throttle(sh, si);
      launch_pattern(sh, si, p, size, (long)(rnd(&rng) % (MAX_HOLD_US + 1)));
      if (sh->nstreams > 1 && rnd(&rng) % CROSS_ONE_IN == 0) {
        int ui = (si + 1 + (int)(rnd(&rng) % (uint64_t)(sh->nstreams - 1))) % sh->nstreams;
        cross_use(sh, si, ui, p, size,
                  CROSS_HOLD_MIN_US +
                      (long)(rnd(&rng) % (CROSS_HOLD_MAX_US - CROSS_HOLD_MIN_US + 1)));
      }
    }

    int slot = (int)(rnd(&rng) % WINDOW);
    if (live[slot].p) release(sh, si, &live[slot]);
    live[slot] = (live_t){p, id};
  }
  for (int i = 0; i < WINDOW; i++)
    if (live[i].p) release(sh, si, &live[i]);
  return NULL;
}

static void free_run(shared_t *sh, pthread_t *threads, worker_t *workers) {
  free(sh->ck.v);
  free(sh->streams);
  free(sh->stream_allocs);
  free(sh->stream_frees);
  free(sh->backlog);
  free(threads);
  free(workers);
}

static void usage(void) {
  fprintf(stderr, "usage: stress_streams [seed] [ops] [streams] [threads_per_stream] "
                  "[--plant epoch|record] [--conf key:value,...] [--oom-ok]\n");
  exit(2);
}

int main(int argc, char **argv) {
  static shared_t sh;
  uint64_t seed = (uint64_t)time(NULL);
  long ops = 30000;
  int nstreams = 4, tps = 2;
  const char *plant_name = NULL, *conf = NULL;
  int npos = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--plant") == 0) {
      if (++i >= argc) usage();
      plant_name = argv[i];
      if (strcmp(plant_name, "epoch") == 0)
        sh.plant = GMA__TEST_NO_EPOCH_GATING;
      else if (strcmp(plant_name, "record") == 0)
        sh.plant = GMA__TEST_NO_RECORD_GATING;
      else
        usage();
    } else if (strcmp(argv[i], "--oom-ok") == 0) {
      sh.oom_ok = true;
    } else if (strcmp(argv[i], "--conf") == 0) {
      if (++i >= argc) usage();
      conf = argv[i];
    } else if (npos == 0) {
      seed = strtoull(argv[i], NULL, 0), npos++;
    } else if (npos == 1) {
      ops = atol(argv[i]), npos++;
    } else if (npos == 2) {
      nstreams = atoi(argv[i]), npos++;
    } else if (npos == 3) {
      tps = atoi(argv[i]), npos++;
    } else {
      usage();
    }
  }
  if (ops < 1 || nstreams < 1 || nstreams > 256 || tps < 1 || tps > 64) usage();
  if (sh.plant && nstreams < 2) {
    fprintf(stderr, "stress_streams: a planted run needs at least 2 streams\n");
    return 2;
  }
  int nthreads = nstreams * tps;
  printf("stress_streams: seed %" PRIu64 ", %ld ops, %d streams x %d threads%s%s%s%s\n"
         "  rerun: stress_streams %" PRIu64 " %ld %d %d%s%s%s%s\n",
         seed, ops, nstreams, tps, plant_name ? ", planted bug: " : "",
         plant_name ? plant_name : "", conf ? ", config " : "", conf ? conf : "", seed, ops,
         nstreams, tps, plant_name ? " --plant " : "", plant_name ? plant_name : "",
         conf ? " --conf " : "", conf ? conf : "");

  sh.seed = seed;
  sh.nstreams = nstreams;
  sh.tps = tps;
  uint64_t prng = mix64(seed) | 1;
  for (int i = 0; i < NPOPULAR; i++) { /* 512 B .. 4 MiB, a few odd sizes */
    unsigned bits = 9 + (unsigned)(rnd(&prng) % 14);
    sh.popular[i] = ((size_t)1 << bits) + (rnd(&prng) % 4 == 0 ? (rnd(&prng) % 4096) : 0);
  }
  pthread_mutex_init(&sh.ck.mu, NULL);
  /* A planted bug makes gma call memory free while kernels still write it;
   * the worker's timed trim could then unmap it under a running kernel and
   * turn a detected corruption into a crash. Planted runs go without it. */
  char planted_conf[512];
  if (sh.plant) {
    snprintf(planted_conf, sizeof planted_conf, "%s%sworker:off", conf ? conf : "",
             conf ? "," : "");
    conf = planted_conf;
  }
  sh.g = sim_allocator(conf);
  if (sh.plant) gma__pool_of(sh.g)->test_flags = sh.plant;
  sh.streams = calloc((size_t)nstreams, sizeof *sh.streams);
  sh.stream_allocs = calloc((size_t)nstreams, sizeof *sh.stream_allocs);
  sh.stream_frees = calloc((size_t)nstreams, sizeof *sh.stream_frees);
  sh.backlog = calloc((size_t)nstreams, sizeof *sh.backlog);
  CHECK(sh.streams && sh.stream_allocs && sh.stream_frees && sh.backlog);
  for (int i = 0; i < nstreams; i++) CHECK_OK(gma_stream_create(sh.g, &sh.streams[i]));

  pthread_t *threads = calloc((size_t)nthreads, sizeof *threads);
  worker_t *workers = calloc((size_t)nthreads, sizeof *workers);
  CHECK(threads && workers);
  uint64_t t0 = now_ns();
  for (int i = 0; i < nthreads; i++) {
    workers[i] = (worker_t){&sh, i, ops / nthreads + (i < ops % nthreads)};
    CHECK(pthread_create(&threads[i], NULL, worker_main, &workers[i]) == 0);
  }
  for (int i = 0; i < nthreads; i++) CHECK(pthread_join(threads[i], NULL) == 0);
  double host_s = (double)(now_ns() - t0) / 1e9;
  for (int i = 0; i < nstreams; i++) note(&sh, gma_stream_synchronize(sh.g, sh.streams[i]), "sync");
  double total_s = (double)(now_ns() - t0) / 1e9;

  gma_stats_t s = stats_of(sh.g);
  unsigned long long done = atomic_load(&sh.ops_done);
  printf("  %llu ops in %.2f s host (%.0f ops/s), %.2f s with the device drained\n", done,
         host_s, (double)done / host_s, total_s);
  printf("  pattern kernels %llu queued / %llu run, cross-stream uses %llu, corruptions %llu, "
         "overlaps %" PRIu64 ", failed calls %llu, flag timeouts %llu\n",
         (unsigned long long)sh.kernels_queued, (unsigned long long)sh.kernels_run,
         (unsigned long long)sh.cross_uses, (unsigned long long)sh.corruptions, sh.ck.overlaps,
         (unsigned long long)sh.failures, (unsigned long long)sh.spin_timeouts);
  printf("  allocs %" PRIu64 ", hits bin %" PRIu64 " (%.1f%%) / stream %" PRIu64 " / pool %" PRIu64
         " / device %" PRIu64 ", device allocs %" PRIu64 ",\n  peak reserved %.1f MiB (peak allocated %.1f MiB), epoch events %" PRIu64
         ", cross-stream waits %" PRIu64 "\n",
         s.num_allocs, s.hits_bin, s.num_allocs ? 100.0 * (double)s.hits_bin / (double)s.num_allocs : 0,
         s.hits_stream, s.hits_pool, s.hits_device, s.num_device_allocs,
         (double)s.reserved.peak / (double)MiB, (double)s.allocated.peak / (double)MiB,
         s.num_epoch_events, s.num_cross_stream_waits);

  if (sh.plant) {
    /* Detection is all a planted run must show; tidy up and report. Every
     * block was freed and every stream drained, so teardown must succeed. */
    for (int i = 0; i < nstreams; i++) CHECK_OK(gma_stream_destroy(sh.g, sh.streams[i]));
    CHECK_OK(gma_destroy(sh.g));
    free_run(&sh, threads, workers);
    if (atomic_load(&sh.corruptions) > 0) {
      printf("stress_streams: planted %s bug DETECTED (%llu corruption(s)): ok\n", plant_name,
             (unsigned long long)sh.corruptions);
      return 0;
    }
    printf("stress_streams: planted %s bug went UNNOTICED after %llu ops: the workload cannot "
           "catch it\n",
           plant_name, done);
    return 1;
  }

  CHECK(atomic_load(&sh.corruptions) == 0);
  CHECK(sh.ck.overlaps == 0);
  CHECK(atomic_load(&sh.failures) == 0);
  CHECK(atomic_load(&sh.spin_timeouts) == 0);
  CHECK(atomic_load(&sh.kernels_run) == atomic_load(&sh.kernels_queued));
  CHECK(done == (unsigned long long)ops);
  /* No call is in flight: the snapshot is exact. */
  uint64_t served = (uint64_t)ops - atomic_load(&sh.ooms);
  if (sh.oom_ok) printf("  gma_alloc GMA_ERR_OOM (--oom-ok): %llu\n", (unsigned long long)sh.ooms);
  /* Every chunk the handle pool kept was mapped again, freed, or is kept. */
  CHECK(s.num_device_keeps == s.num_device_remaps + s.num_kept_frees + s.kept_chunks);
  if (s.num_device_keeps)
    printf("  handle pool: %llu chunks unmapped and kept, %llu mapped again, %llu freed\n",
           (unsigned long long)s.num_device_keeps, (unsigned long long)s.num_device_remaps,
           (unsigned long long)s.num_kept_frees);
  CHECK(s.num_allocs == served && s.num_frees == served);
  CHECK(s.allocated.current == 0 && s.requested.current == 0);
  CHECK(s.reserved.current ==
        s.allocated.current + s.stream_cached_bytes + s.pending_bytes + s.free_bytes);
  CHECK(s.hits_bin + s.hits_stream + s.hits_pool + s.hits_device == s.num_allocs);
  CHECK(s.num_streams >= (uint64_t)nstreams);
  uint64_t bin_hits = 0;
  for (int i = 0; i < nstreams; i++) {
    gma_stream_stats_t ss = GMA_STREAM_STATS_INIT;
    CHECK_OK(gma_stream_stats(sh.g, sh.streams[i], &ss));
    CHECK(ss.allocs == atomic_load(&sh.stream_allocs[i]));
    CHECK(ss.frees == atomic_load(&sh.stream_frees[i]));
    CHECK(ss.hits + ss.misses == ss.allocs);
    CHECK(ss.allocated_bytes == 0);
    CHECK(ss.safe_epoch < ss.epoch);
    bin_hits += ss.hits;
  }
  CHECK(bin_hits == s.hits_bin);

  /* Everything is freed and every stream is drained: gma_empty_cache must be
   * able to give every segment back. It never waits for the device, and the
   * last epoch events may not have been seen yet, so allow it a few tries. */
  gma_stats_t e = stats_of(sh.g);
  for (int tries = 0; tries < 2000; tries++) {
    CHECK_OK(gma_empty_cache(sh.g));
    e = stats_of(sh.g);
    if (e.reserved.current == 0) break;
    sleep_us(1000);
  }
  printf("  after gma_empty_cache: allocated %" PRIu64 ", reserved %" PRIu64 ", segments %" PRIu64
         "\n",
         e.allocated.current, e.reserved.current, e.num_segments);
  CHECK(e.allocated.current == 0);
  CHECK(e.reserved.current == 0);
  CHECK(e.reserved.current ==
        e.allocated.current + e.stream_cached_bytes + e.pending_bytes + e.free_bytes);

  for (int i = 0; i < nstreams; i++) CHECK_OK(gma_stream_destroy(sh.g, sh.streams[i]));
  CHECK_OK(gma_destroy(sh.g));
  free_run(&sh, threads, workers);
  printf("stress_streams: ok\n");
  return 0;
}
