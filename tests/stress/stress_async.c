/* Stress test of async requests served three ways at once: complete at once
 * on the submitting thread (a bin hit, or the pool's memory when its lock is
 * free), by a thread waiting on it before the worker took it (help), or by
 * the worker. Several threads per stream work as pipeline stages one request
 * ahead: each asks gma_alloc_async or gma_alloc_batch_async for the next
 * buffers while simulated kernels use the current ones (some also on a
 * second stream, declared with gma_record_stream), then collects the next
 * ones with gma_future_take (without a limit, or with short timeouts that
 * run out and retry), gma_future_wait + gma_future_release, or polls, and
 * frees the current ones.
 *
 * What would show a bug:
 *  - pattern kernels and the overlap checker, as in stress_streams.c: memory
 *    handed out while device work may still use it, or handed out twice;
 *  - every callback must run exactly once, with the status its taker got:
 *    a request served twice (waiter and worker both) or never completed
 *    shows here. Half the requests have one; a waiter never serves those
 *    (their callbacks run on the worker), so the other half is what waiters
 *    serve, and a request of theirs served twice shows in the statistics
 *    (completions counted twice: submitted != ready + failed + timed out);
 *  - every call returns GMA_OK (or, under a memory limit, GMA_ERR_TIMEOUT
 *    when --timeouts-ok), and at the end the statistics add up (nothing
 *    allocated or queued, submitted = ready + failed + timed out) and
 *    gma_destroy reports no leak.
 *
 * --plant claim removes the compare-and-swap that makes a waiter and the
 * worker agree on who serves a request (GMA__TEST_NO_SERVE_CLAIM): both then
 * serve some requests, and the run must DETECT it (exit 0), else exit 1.
 *
 * Usage: stress_async [seed] [ops] [streams] [threads_per_stream]
 *                     [--plant claim] [--conf key:value,...] [--timeouts-ok]
 * Internal test: it includes pool.h only for gma__pool_of and the switch. */
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
#include "rng.h"
#include "simkit.h"
#include "stress_kernel.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

enum {
  MAX_BATCH = 6,
  KERNEL_ONE_IN = 2, /* blocks of the current request that get a pattern kernel */
  CROSS_ONE_IN = 8,  /* of those, also used on a second stream */
  MAX_HOLD_US = 60
};

/* One request: what its callback saw, and what its taker got. */
typedef struct record {
  atomic_int calls, status;
  bool has_cb; /* the request has a callback (on_complete) */
  bool submitted;
  int taken; /* the status the taker got */
} record_t;

typedef struct range {
  uintptr_t start, end;
} range_t;

typedef struct shared {
  gma_t *g;
  gma_stream_t *streams;
  int nstreams, tps;
  uint64_t seed;
  bool plant, timeouts_ok;
  pthread_mutex_t mu; /* the overlap checker: live ranges, unsorted (few) */
  range_t *live;
  size_t nlive, cap;
  atomic_ullong overlaps, corruptions, kernels_queued, kernels_run, cross_uses;
  atomic_ullong failures, timeouts, pending_retries, at_submit;
  atomic_long *backlog;
} shared_t;

static void note(shared_t *sh, gma_status_t st, const char *what) {
  if (st == GMA_OK) return;
  if (st == GMA_ERR_TIMEOUT && sh->timeouts_ok) {
    atomic_fetch_add(&sh->timeouts, 1);
    return;
  }
  atomic_fetch_add(&sh->failures, 1);
  fprintf(stderr, "%s: %s (%s)\n", what, gma_status_name(st), gma_last_error());
}

static void live_add(shared_t *sh, void *p, size_t size) {
  range_t r = {(uintptr_t)p, (uintptr_t)p + size};
  pthread_mutex_lock(&sh->mu);
  for (size_t i = 0; i < sh->nlive; i++)
    if (sh->live[i].start < r.end && r.start < sh->live[i].end) {
      atomic_fetch_add(&sh->overlaps, 1);
      fprintf(stderr, "overlap: [%#" PRIxPTR ", %#" PRIxPTR ") and live [%#" PRIxPTR
                      ", %#" PRIxPTR ")\n", r.start, r.end, sh->live[i].start, sh->live[i].end);
    }
  if (sh->nlive == sh->cap) {
    sh->cap = sh->cap ? 2 * sh->cap : 64;
    sh->live = realloc(sh->live, sh->cap * sizeof *sh->live);
    CHECK(sh->live != NULL);
  }
  sh->live[sh->nlive++] = r;
  pthread_mutex_unlock(&sh->mu);
}

/* Before gma_free: the memory may be handed out again as soon as it returns. */
static void live_remove(shared_t *sh, void *p) {
  pthread_mutex_lock(&sh->mu);
  size_t i = 0;
  while (i < sh->nlive && sh->live[i].start != (uintptr_t)p) i++;
  CHECK(i < sh->nlive);
  sh->live[i] = sh->live[--sh->nlive];
  pthread_mutex_unlock(&sh->mu);
}

/* ---- kernels (the pattern kernel: stress_kernel.h) ------------------------------ */

typedef struct xflag {
  atomic_int set;
} xflag_t;

static void flag_set_kernel(void *argp) {
  atomic_store_explicit(&((xflag_t *)argp)->set, 1, memory_order_release);
}

static void flag_wait_kernel(void *argp) {
  xflag_t *f = argp;
  while (!atomic_load_explicit(&f->set, memory_order_acquire)) sleep_us(20);
  free(f);
}

static void launch_pattern(shared_t *sh, int si, void *p, size_t len, long hold_us, uint64_t *rng) {
  stress_pattern_t *a = malloc(sizeof *a);
  CHECK(a != NULL);
  *a = (stress_pattern_t){&sh->corruptions, &sh->kernels_run, &sh->backlog[si], (uintptr_t)p,
                          len, mix64(rnd(rng) ^ sh->seed), hold_us};
  atomic_fetch_add(&sh->backlog[si], 1);
  atomic_fetch_add(&sh->kernels_queued, 1);
  gma_status_t st = gma_sim_launch(sh->g, sh->streams[si], stress_pattern_kernel, a);
  note(sh, st, "gma_sim_launch");
  if (st != GMA_OK) {
    atomic_fetch_sub(&sh->backlog[si], 1);
    atomic_fetch_sub(&sh->kernels_queued, 1);
    free(a);
  }
}

/* p, in use on si, is used on ui after si's work (a flag between the two
 * streams, as an event would order them); gma is told. */
static void cross_use(shared_t *sh, int si, int ui, void *p, size_t len, uint64_t *rng) {
  xflag_t *f = malloc(sizeof *f);
  CHECK(f != NULL);
  atomic_init(&f->set, 0);
  CHECK_OK(gma_sim_launch(sh->g, sh->streams[si], flag_set_kernel, f));
  CHECK_OK(gma_sim_launch(sh->g, sh->streams[ui], flag_wait_kernel, f));
  launch_pattern(sh, ui, p, len, 100 + (long)(rnd(rng) % 300), rng);
  note(sh, gma_record_stream(sh->g, p, sh->streams[ui]), "gma_record_stream");
  atomic_fetch_add(&sh->cross_uses, 1);
}

/* ---- the stages ------------------------------------------------------------------- */

static void on_complete(gma_future_t *f, gma_status_t st, void *user) {
  record_t *r = user;
  if (gma_future_status(f) != st) atomic_store(&r->status, 1000); /* never a status */
  else atomic_store(&r->status, (int)st);
  atomic_fetch_add(&r->calls, 1);
}

/* 256 B .. 4 MiB log-uniform, 1 in 16 from 4 to 24 MiB; multiples of 8. */
static size_t pick_size(uint64_t *rng) {
  size_t size;
  if (rnd(rng) % 16 == 0) {
    size = 4 * MiB + rnd(rng) % (20 * MiB);
  } else {
    unsigned bits = 8 + (unsigned)(rnd(rng) % 14);
    size = ((size_t)1 << bits) + rnd(rng) % ((size_t)1 << bits);
  }
  return size & ~(size_t)7;
}

typedef struct batch {
  size_t n, sizes[MAX_BATCH];
  void *ptrs[MAX_BATCH];
} batch_t;

typedef struct stage {
  shared_t *sh;
  int index;
  long ops;
  record_t *records;
} stage_t;

/* Collects f into b (its ptrs filled for a batch) one of four ways. */
static gma_status_t collect(shared_t *sh, gma_future_t *f, batch_t *b, int how) {
  gma_status_t st;
  void *p = NULL, **out = b->n == 1 ? &p : NULL;
  switch (how) {
    case 0: /* take without a limit: may serve it on this thread */
      st = gma_future_take(f, UINT64_MAX, out);
      break;
    case 1: /* wait without a limit, then release */
      st = gma_future_wait(f, UINT64_MAX, out);
      gma_future_release(f);
      break;
    case 2: /* short takes that run out (the future stays alive) until one does not */
      while ((st = gma_future_take(f, 100000, out)) == GMA_PENDING)
        atomic_fetch_add(&sh->pending_retries, 1);
      break;
    default: /* poll, then a take that does not wait (poll says complete as soon as
                the status is set; take(0) may still say pending while the callback
                runs, which a wait waits for) */
      do
        while (gma_future_poll(f) == GMA_PENDING) sleep_us(20);
      while ((st = gma_future_take(f, 0, out)) == GMA_PENDING);
      break;
  }
  if (st == GMA_OK && b->n == 1) b->ptrs[0] = p;
  return st;
}

static void free_batch(shared_t *sh, batch_t *b) {
  for (size_t i = 0; i < b->n; i++) {
    if (!b->ptrs[i]) continue;
    live_remove(sh, b->ptrs[i]);
    note(sh, gma_free(sh->g, b->ptrs[i]), "gma_free");
    b->ptrs[i] = NULL;
  }
  b->n = 0;
}

static void *stage_main(void *argp) {
  stage_t *w = argp;
  shared_t *sh = w->sh;
  uint64_t rng = mix64(sh->seed ^ mix64((uint64_t)w->index + 1)) | 1;
  int si = w->index / sh->tps;
  batch_t cur = {0}, next;
  for (long op = 0; op < w->ops; op++) {
    record_t *r = &w->records[op];
    memset(&next, 0, sizeof next);
    next.n = rnd(&rng) % 3 == 0 ? 2 + rnd(&rng) % (MAX_BATCH - 1) : 1;
    for (size_t i = 0; i < next.n; i++) next.sizes[i] = pick_size(&rng);
    gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
    o.timeout_ns = 30000000000ull;
    r->has_cb = rnd(&rng) % 2;
    o.callback = r->has_cb ? on_complete : NULL;
    o.user = r;
    o.worker_only = rnd(&rng) % 4 == 0;
    gma_future_t *f = NULL;
    gma_status_t st = next.n == 1 ? gma_alloc_async(sh->g, next.sizes[0], sh->streams[si], &o, &f)
                                  : gma_alloc_batch_async(sh->g, next.n, next.sizes,
                                                          sh->streams[si], next.ptrs, &o, &f);
    note(sh, st, "gma_alloc_async");
    if (st != GMA_OK) continue;
    r->submitted = true;
    if (gma_future_poll(f) == GMA_OK) atomic_fetch_add(&sh->at_submit, 1);
    /* The current buffers at work; then either freed before the next ones
     * are collected (as a stage that needs no overlap would), or after. */
    while (atomic_load_explicit(&sh->backlog[si], memory_order_relaxed) > 32) sleep_us(50);
    for (size_t i = 0; i < cur.n; i++) {
      if (rnd(&rng) % KERNEL_ONE_IN) continue;
      launch_pattern(sh, si, cur.ptrs[i], cur.sizes[i], (long)(rnd(&rng) % MAX_HOLD_US), &rng);
      if (sh->nstreams > 1 && rnd(&rng) % CROSS_ONE_IN == 0)
        cross_use(sh, si, (si + 1 + (int)(rnd(&rng) % (uint64_t)(sh->nstreams - 1))) % sh->nstreams,
                  cur.ptrs[i], cur.sizes[i], &rng);
    }
    bool free_first = sh->timeouts_ok || rnd(&rng) % 2;
    if (free_first) free_batch(sh, &cur);
    st = collect(sh, f, &next, (int)(rnd(&rng) % 4));
    r->taken = st;
    note(sh, st, "collecting a future");
    if (!free_first) free_batch(sh, &cur);
    if (st != GMA_OK) continue;
    for (size_t i = 0; i < next.n; i++) live_add(sh, next.ptrs[i], next.sizes[i]);
    cur = next;
  }
  free_batch(sh, &cur);
  return NULL;
}

static void usage(void) {
  fprintf(stderr, "usage: stress_async [seed] [ops] [streams] [threads_per_stream] "
                  "[--plant claim] [--conf key:value,...] [--timeouts-ok]\n");
  exit(2);
}

int main(int argc, char **argv) {
  static shared_t sh;
  uint64_t seed = (uint64_t)time(NULL);
  long ops = 20000;
  int nstreams = 4, tps = 2, npos = 0;
  const char *conf = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--plant") == 0) {
      if (++i >= argc || strcmp(argv[i], "claim") != 0) usage();
      sh.plant = true;
    } else if (strcmp(argv[i], "--conf") == 0) {
      if (++i >= argc) usage();
      conf = argv[i];
    } else if (strcmp(argv[i], "--timeouts-ok") == 0) {
      sh.timeouts_ok = true;
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
  if (ops < 1 || nstreams < 1 || nstreams > 64 || tps < 1 || tps > 16) usage();
  int nthreads = nstreams * tps;
  printf("stress_async: seed %" PRIu64 ", %ld ops, %d streams x %d threads%s%s%s\n"
         "  rerun: stress_async %" PRIu64 " %ld %d %d%s%s%s%s\n",
         seed, ops, nstreams, tps, sh.plant ? ", planted bug: claim" : "",
         conf ? ", config " : "", conf ? conf : "", seed, ops, nstreams, tps,
         sh.plant ? " --plant claim" : "", conf ? " --conf " : "", conf ? conf : "",
         sh.timeouts_ok ? " --timeouts-ok" : "");
  sh.seed = seed;
  sh.nstreams = nstreams;
  sh.tps = tps;
  pthread_mutex_init(&sh.mu, NULL);
  sh.g = sim_allocator(conf);
  if (sh.plant) gma__pool_of(sh.g)->test_flags = GMA__TEST_NO_SERVE_CLAIM;
  sh.streams = calloc((size_t)nstreams, sizeof *sh.streams);
  sh.backlog = calloc((size_t)nstreams, sizeof *sh.backlog);
  CHECK(sh.streams && sh.backlog);
  for (int i = 0; i < nstreams; i++) CHECK_OK(gma_stream_create(sh.g, &sh.streams[i]));
  /* Each stream's first request goes to the worker (the pool has no record
   * of the stream yet); one synchronous pair per stream starts them alike. */
  for (int i = 0; i < nstreams; i++) {
    void *p;
    CHECK_OK(gma_alloc(sh.g, 4096, sh.streams[i], &p));
    CHECK_OK(gma_free(sh.g, p));
  }

  pthread_t *threads = calloc((size_t)nthreads, sizeof *threads);
  stage_t *stages = calloc((size_t)nthreads, sizeof *stages);
  CHECK(threads && stages);
  uint64_t t0 = now_ns();
  for (int i = 0; i < nthreads; i++) {
    long n = ops / nthreads + (i < ops % nthreads);
    stages[i] = (stage_t){&sh, i, n, calloc((size_t)n + 1, sizeof(record_t))};
    CHECK(stages[i].records != NULL);
    CHECK(pthread_create(&threads[i], NULL, stage_main, &stages[i]) == 0);
  }
  for (int i = 0; i < nthreads; i++) CHECK(pthread_join(threads[i], NULL) == 0);
  for (int i = 0; i < nstreams; i++) note(&sh, gma_stream_synchronize(sh.g, sh.streams[i]), "sync");
  double secs = (double)(now_ns() - t0) / 1e9;
  /* The worker drops requests their waiters served when it reaches them. */
  for (int i = 0; i < 2000 && stats_of(sh.g).queue_depth; i++) sleep_us(1000);

  /* Every request that was submitted completed exactly once, with the
   * status its taker saw. */
  uint64_t bad_calls = 0, bad_status = 0, taken = 0;
  for (int i = 0; i < nthreads; i++)
    for (long k = 0; k < stages[i].ops; k++) {
      record_t *r = &stages[i].records[k];
      if (!r->submitted) continue;
      taken++;
      if (!r->has_cb) continue;
      int calls = atomic_load(&r->calls);
      if (calls != 1) {
        if (bad_calls++ < 5)
          fprintf(stderr, "stage %d request %ld: callback ran %d times\n", i, k, calls);
      } else if (atomic_load(&r->status) != r->taken) {
        if (bad_status++ < 5)
          fprintf(stderr, "stage %d request %ld: callback saw %d, the taker got %d\n", i, k,
                  atomic_load(&r->status), r->taken);
      }
    }
  gma_stats_t s = stats_of(sh.g);
  printf("  %" PRIu64 " requests in %.2f s: %llu complete when the submit returned, %" PRIu64
         " at once by gma's count (bins or pool), %" PRIu64 " handed over (to the worker or "
         "served by their waiter)\n  kernels %llu queued / %llu run, cross-stream uses %llu, "
         "corruptions %llu, overlaps %llu, failed calls %llu, timeouts %llu, short takes that ran "
         "out %llu\n  callbacks not run exactly once %" PRIu64 ", with another status %" PRIu64
         "; peak reserved %.1f MiB\n",
         taken, secs, (unsigned long long)sh.at_submit, s.futures_ready_at_once,
         s.futures_submitted - s.futures_ready_at_once, (unsigned long long)sh.kernels_queued,
         (unsigned long long)sh.kernels_run, (unsigned long long)sh.cross_uses,
         (unsigned long long)sh.corruptions, (unsigned long long)sh.overlaps,
         (unsigned long long)sh.failures, (unsigned long long)sh.timeouts,
         (unsigned long long)sh.pending_retries, bad_calls, bad_status,
         (double)s.reserved.peak / (double)MiB);

  if (sh.plant) {
    for (int i = 0; i < nstreams; i++) gma_stream_destroy(sh.g, sh.streams[i]);
    gma_destroy(sh.g); /* blocks the bug served twice are reported and freed here */
    for (int i = 0; i < nthreads; i++) free(stages[i].records);
    free(stages);
    free(threads);
    free(sh.streams);
    free(sh.backlog);
    free(sh.live);
    uint64_t completions = s.futures_ready + s.futures_failed + s.futures_timed_out;
    if (bad_calls || bad_status || sh.overlaps || completions != s.futures_submitted) {
      printf("stress_async: planted claim bug DETECTED (%" PRIu64 " callbacks ran more than "
             "once; %" PRIu64 " completions of %" PRIu64 " requests): ok\n",
             bad_calls, completions, s.futures_submitted);
      return 0;
    }
    printf("stress_async: planted claim bug went UNNOTICED: the workload cannot catch it\n");
    return 1;
  }
  CHECK(bad_calls == 0 && bad_status == 0);
  CHECK(atomic_load(&sh.corruptions) == 0 && atomic_load(&sh.overlaps) == 0);
  CHECK(atomic_load(&sh.failures) == 0);
  CHECK(atomic_load(&sh.kernels_run) == atomic_load(&sh.kernels_queued));
  CHECK(s.allocated.current == 0 && s.queue_depth == 0);
  CHECK(s.futures_submitted == s.futures_ready + s.futures_failed + s.futures_timed_out);
  CHECK(s.futures_submitted == taken);
  for (int i = 0; i < nstreams; i++) CHECK_OK(gma_stream_destroy(sh.g, sh.streams[i]));
  CHECK_OK(gma_destroy(sh.g)); /* GMA_ERR_LEAK if any block was left */
  for (int i = 0; i < nthreads; i++) free(stages[i].records);
  free(stages);
  free(threads);
  free(sh.streams);
  free(sh.backlog);
  free(sh.live);
  printf("stress_async: ok\n");
  return 0;
}
