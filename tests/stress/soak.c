/* Soak test: a time-bounded random workload over many streams on the
 * simulated device, reporting throughput, memory and latency at intervals and
 * checking at the end that gma stayed correct, bounded and stable.
 *
 * The workload. T threads (--threads, default 4) each own two streams, and
 * all share two more. Each thread keeps a working set of live blocks whose
 * byte target follows phases that every thread shares: rise, hold high, fall,
 * hold low (period --phase-ms, default half the report interval), from an
 * eighth of its share up to its share (30% of memory_limit split over the
 * threads), so cached memory piles up as the working set falls and timed
 * trimming has something to do. Below its target a thread allocates (70%) or
 * frees (30%); above it, or when the block picked would not fit under the
 * target, it frees. One operation (counted in ops/s) is one free or one
 * allocation of the kinds below:
 *   - gma_alloc (50%) or gma_alloc_tagged (12%; six tags, and one in 16 is
 *     checked with gma_pointer_info: base, size, stream and tag);
 *   - gma_alloc_async (14%): then waited on at once, polled while the thread
 *     goes on working (collected later), or released without a wait (gma
 *     frees what it got, or cancels it);
 *   - gma_alloc_batch (6%, 2..12 blocks) or gma_alloc_batch_async (3%, waited
 *     on or released), each block freed on its own later;
 *   - gma_host_alloc (5%; 4 KiB..2 MiB, at most 16 MiB live per thread), which
 *     the host fills at once, as a staging buffer would be;
 *   - the rest gma_alloc again (a batch counts as one operation).
 * Streams: 65% the thread's first stream, 15% its second, 20% a shared one.
 * Sizes: 30% from a seeded table of recurring sizes (512 B..32 MiB), 40%
 * 64 B..64 KiB, 18% 64 KiB..1 MiB, 9% 1..16 MiB, 3% 16..48 MiB.
 *
 * Premature reuse shows as corruption: one block in three gets a pattern
 * kernel on its stream (gma_sim_launch) that writes a pattern unique to it,
 * holds 0..100 us, then verifies it; the block is freed while that kernel may
 * still be queued or running (stream-ordered free). One such block in six is
 * also used on another stream by a kernel held 50..300 us, ordered after
 * the owner stream's earlier work (the owner's kernel queues it when it
 * finishes, as cudaStreamWaitEvent would order it), and gma_record_stream
 * tells gma before the free. Host blocks get a kernel on their stream too
 * (the "copy"), and a host block handed out again too early is overwritten by
 * the new owner's fill while that kernel still holds it. Kernels touch one
 * 8-byte word per 256 bytes (gma's pointers are 256-byte aligned, so any
 * overlap shares a sampled word). The host stays at most 32 kernels ahead of
 * a stream, as a GPU's launch queue would. Word i of writer n holds
 * n << 32 | i, so a corruption report names the writer of the first word
 * found changed (its kind of block, stream, block and start time) next to
 * the victim: two blocks handed out over each other show up as a pair.
 *
 * Also: one iteration in 2500 calls gma_trim (keep 0..48 MiB) or
 * gma_empty_cache; the worker trims on its own every 20 ms (release
 * threshold 32 MiB, idle segments after 200 ms); a pressure callback counts
 * level changes. Config: memory_limit 512M and those worker keys, then
 * GMA_CONF from the environment, then --conf (later keys win).
 *
 * Every --report-s seconds one line: elapsed time, operations per second,
 * allocated and reserved MiB (now / this interval's peak, sampled every
 * 20 ms / gma's peak since the start), device allocations and frees, futures
 * completed ready / failed / timed out (this interval, gma_stats), gma_alloc
 * latency p50/p99/p999 in ns (every gma_alloc and gma_alloc_tagged call timed
 * into per-thread log-linear histograms, 8 buckets per doubling), errors by
 * status this interval, corruptions so far, the host's resident memory and
 * the 1-minute load average.
 *
 * Pass criteria (exit 0; otherwise exit 1 naming each failed one):
 *   1. corruptions == 0 and pointer-info mismatches == 0;
 *   2. no unexpected status: GMA_ERR_OOM from gma_alloc/batch/host alloc is
 *      allowed and counted (the limit makes it possible at a high phase),
 *      GMA_ERR_TIMEOUT of a future is allowed and counted, GMA_ERR_CANCELLED
 *      at most once per future released without a wait; anything else fails;
 *   3. reserved memory bounded: gma's peak reserved <= memory_limit, and the
 *      peak reserved sampled in the last third of the run <= 1.25x the peak
 *      sampled in the first third (judged when a third holds 20 phases or
 *      more: the peaks of a few phases vary at random);
 *   4. latency stable: with P the p99 of each full interval (intervals with
 *      at least 200 timed allocations), the median of the last three P (the
 *      last one alone when there are fewer) <= 3x the median of all P. The
 *      median of three keeps one preempted interval on a loaded machine from
 *      failing the run while a lasting slow-down still does;
 *   5. the worker's timed trimming released memory at least once (runs of
 *      two phase periods or more);
 *   6. at the end, with everything freed and the streams synchronized,
 *      gma_empty_cache brings reserved (device and pinned host) to 0, and
 *      gma_destroy returns GMA_OK.
 *
 * Usage: soak [--seconds S] [--threads T] [--seed N] [--report-s R]
 *             [--phase-ms P] [--conf key:value,...] [--skip LIST]
 * --skip leaves kinds of work out, to narrow a failure down: async (futures),
 * batch (both kinds of batch), host (host memory), cross (second-stream
 * uses) become plain gma_alloc calls; trim drops the test's own gma_trim and
 * gma_empty_cache calls (the worker still trims: see --conf release_threshold
 * and idle_ms).
 * Public API only. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "rng.h"
#include "simkit.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

enum {
  GRID = 256,          /* kernels touch one word per GRID bytes (see the top) */
  MAX_BACKLOG = 32,    /* pattern kernels queued and unfinished per stream, at most */
  MAX_LIVE = 1024,     /* live blocks per thread, at most */
  MAX_PEND = 8,        /* futures a thread polls while it works, at most */
  NPOPULAR = 16,
  NBUCKETS = 320,      /* latency histogram: 8 per doubling up to 2^40 ns */
  SAMPLE_MS = 20,      /* the monitor samples gma_stats this often */
  MIN_TIMED = 200,     /* an interval's p99 counts with at least this many allocs */
  MAX_INTERVALS = 100000,
  SPIN_LIMIT_US = 10 * 1000 * 1000, /* a free waits this long for a second-stream launch */
  ST_OFF = 16          /* status s is counted at index s + ST_OFF */
};

static const char *const tags[] = {"weights", "activations", "kv-cache",
                                   "gradients", "workspace", "comm"};
#define NTAGS ((int)(sizeof tags / sizeof tags[0]))

/* ---- time, random numbers ---------------------------------------------------------- */

/* A value log-uniform in [lo, hi). */
static size_t log_uniform(uint64_t *rng, size_t lo, size_t hi) {
  unsigned a = 63u - (unsigned)__builtin_clzll(lo), b = 63u - (unsigned)__builtin_clzll(hi);
  unsigned bits = a + (unsigned)(rnd(rng) % (b - a ? b - a : 1));
  size_t base = (size_t)1 << bits;
  size_t v = base + rnd(rng) % base;
  return v < lo ? lo : v >= hi ? hi - 1 : v;
}

/* ---- latency histograms -------------------------------------------------------------- */

/* Log-linear buckets: values below 8 exactly, then 8 buckets per doubling,
 * so a bucket is at most 1/8 of its value wide. */
static unsigned bucket_of(uint64_t v) {
  if (v < 8) return (unsigned)v;
  unsigned msb = 63u - (unsigned)__builtin_clzll(v);
  unsigned b = (msb - 2) * 8 + (unsigned)((v >> (msb - 3)) & 7);
  return b < NBUCKETS ? b : NBUCKETS - 1;
}

/* The middle of bucket b. */
static uint64_t bucket_value(unsigned b) {
  if (b < 8) return b;
  unsigned msb = b / 8 + 2, sub = b % 8;
  uint64_t width = (uint64_t)1 << (msb - 3);
  return ((uint64_t)(8 + sub) << (msb - 3)) + width / 2;
}

static uint64_t percentile(const uint64_t *h, uint64_t total, double q) {
  if (!total) return 0;
  uint64_t rank = (uint64_t)(q * (double)total + 0.999999), seen = 0;
  if (rank < 1) rank = 1;
  for (unsigned b = 0; b < NBUCKETS; b++) {
    seen += h[b];
    if (seen >= rank) return bucket_value(b);
  }
  return bucket_value(NBUCKETS - 1);
}

/* ---- the run's shared state ---------------------------------------------------------- */

typedef struct xuse xuse_t;

typedef struct blk {
  void *p;
  size_t size;
  int host;  /* gma_host_alloc's block */
  xuse_t *x; /* its use on a second stream, if any */
} blk_t;

typedef struct pend {
  gma_future_t *f;
  size_t size;
  int si;
} pend_t;

typedef struct tstate {
  int index;
  pthread_t th;
  uint64_t rng;
  int own[2]; /* stream indices */
  blk_t live[MAX_LIVE];
  int nlive;
  size_t live_bytes, host_bytes;
  size_t target; /* the working-set target now */
  pend_t pend[MAX_PEND];
  int npend;
  /* Read by the monitor while the thread runs: relaxed atomics, each written
   * by this thread only. */
  atomic_ullong ops;
  atomic_ullong hist[NBUCKETS];
} tstate_t;

static struct run {
  gma_t *g;
  gma_stream_t *streams;
  atomic_long *backlog; /* per stream: pattern kernels queued and not finished */
  int nstreams, nthreads;
  uint64_t seed, t0_ns, phase_ms;
  size_t hi_bytes, lo_bytes; /* a thread's working-set target range */
  size_t popular[NPOPULAR];
  atomic_int stop;
  atomic_ullong next_kernel;
  atomic_ullong corruptions, info_mismatches;
  atomic_ullong kernels_queued, kernels_run, cross_uses, host_fills, spin_timeouts;
  atomic_ullong status[32];    /* non-OK statuses by value (+ST_OFF), calls and futures */
  atomic_ullong fut_status[32]; /* every future completion (callback), by status */
  atomic_ullong unexpected;     /* statuses the criteria do not allow */
  atomic_ullong released_nowait, async_waited, async_polled, batches, batch_async;
  atomic_ullong host_allocs, tagged, trims_called, pressure_changes;
  atomic_int pressure_level;
  bool skip_async, skip_batch, skip_host, skip_cross, skip_trim; /* --skip */
} R;

/* Counts a status; reports and counts it as unexpected unless allowed. */
static void note(gma_status_t st, const char *what, int allow_oom) {
  if (st == GMA_OK) return;
  if (st + ST_OFF >= 0 && st + ST_OFF < 32) atomic_fetch_add(&R.status[st + ST_OFF], 1);
  if (st == GMA_ERR_OOM && allow_oom) return;
  if (atomic_fetch_add(&R.unexpected, 1) < 20)
    fprintf(stderr, "soak: unexpected %s from %s: %s\n", gma_status_name(st), what,
            gma_last_error());
}

static void future_done(gma_future_t *f, gma_status_t st, void *user) {
  (void)f, (void)user;
  if (st + ST_OFF >= 0 && st + ST_OFF < 32) {
    atomic_fetch_add(&R.fut_status[st + ST_OFF], 1);
    if (st != GMA_OK) atomic_fetch_add(&R.status[st + ST_OFF], 1);
  }
}

static void pressure_changed(gma_t *g, gma_pressure_t level, void *user) {
  (void)g, (void)user;
  atomic_store(&R.pressure_level, (int)level);
  atomic_fetch_add(&R.pressure_changes, 1);
}

/* ---- kernels ---------------------------------------------------------------------------- */

/* A block's use on a second stream (see use_block): launched by the owner
 * stream's kernel, then recorded with gma_record_stream by the host before
 * the free. */
struct xuse {
  atomic_int launched; /* set (release) by the owner's kernel once U's is queued */
  int ui;              /* the second stream */
  long hold_us;
};

typedef struct pattern_arg {
  const char *what; /* where the block came from, for the report */
  int si;
  uintptr_t base;
  size_t len;
  uint64_t id; /* the kernel's number: its words carry it */
  long hold_us;
  xuse_t *fwd; /* if set: queue the second stream's kernel when done */
} pattern_arg_t;

/* Word i (at offset i * GRID) of kernel id holds id << 32 | i, so a word
 * found overwritten names its writer and where that writer's block starts;
 * host fills take numbers from the same counter. The last META writers are
 * remembered (relaxed atomics: read only to explain a corruption). */
enum { META = 1 << 18 };
typedef struct meta {
  atomic_ullong id, base, len, t_ns;
  atomic_int si;
  _Atomic(const char *) what;
} meta_t;
static meta_t *metas;

static uint64_t word_value(uint64_t id, size_t off) { return id << 32 | (uint32_t)(off / GRID); }

static uint64_t new_writer(const char *what, int si, uintptr_t base, size_t len) {
  uint64_t id = atomic_fetch_add(&R.next_kernel, 1) + 1;
  meta_t *m = &metas[id % META];
  atomic_store_explicit(&m->base, base, memory_order_relaxed);
  atomic_store_explicit(&m->len, len, memory_order_relaxed);
  atomic_store_explicit(&m->si, si, memory_order_relaxed);
  atomic_store_explicit(&m->what, what, memory_order_relaxed);
  atomic_store_explicit(&m->t_ns, now_ns() - R.t0_ns, memory_order_relaxed);
  atomic_store_explicit(&m->id, id, memory_order_release);
  return id;
}

/* Says who wrote value v found at address a, if it can tell. */
static void explain(uintptr_t a, uint64_t v) {
  uint64_t id = v >> 32;
  uintptr_t base = a - (uintptr_t)(uint32_t)v * GRID;
  meta_t *m = &metas[id % META];
  if (id && atomic_load_explicit(&m->id, memory_order_acquire) == id &&
      atomic_load_explicit(&m->base, memory_order_relaxed) == base)
    fprintf(stderr, "  word at %#" PRIxPTR " holds %#" PRIx64 ": written by #%" PRIu64
                    " (%s, stream %d, [%#" PRIxPTR ", +%llu), started at %.6f s)\n",
            a, v, id, atomic_load_explicit(&m->what, memory_order_relaxed),
            atomic_load_explicit(&m->si, memory_order_relaxed), base,
            (unsigned long long)atomic_load_explicit(&m->len, memory_order_relaxed),
            (double)atomic_load_explicit(&m->t_ns, memory_order_relaxed) / 1e9);
  else
    fprintf(stderr, "  word at %#" PRIxPTR " holds %#" PRIx64 ": writer unknown\n", a, v);
}

static int queue_pattern(const char *what, int si, uintptr_t base, size_t len, long hold_us,
                         xuse_t *fwd);

/* Fill the sampled words with a pattern unique to this kernel, hold, verify.
 * Relaxed atomic words: a reuse bug makes two writers touch the same words,
 * and the pattern check is then the detector, not a data race report. */
static void pattern_kernel(void *argp) {
  pattern_arg_t *a = argp;
  for (size_t off = 0; off + 8 <= a->len; off += GRID)
    __atomic_store_n((uint64_t *)(a->base + off), word_value(a->id, off), __ATOMIC_RELAXED);
  if (a->hold_us) sleep_us(a->hold_us);
  uint64_t bad = 0, first = 0;
  size_t first_off = 0;
  for (size_t off = 0; off + 8 <= a->len; off += GRID) {
    uint64_t v = __atomic_load_n((uint64_t *)(a->base + off), __ATOMIC_RELAXED);
    if (v != word_value(a->id, off) && !bad++) first = v, first_off = off;
  }
  if (bad && atomic_fetch_add(&R.corruptions, 1) < 20) {
    meta_t *m = &metas[a->id % META];
    fprintf(stderr, "soak: corruption: %" PRIu64 " of %zu sampled words of [%#" PRIxPTR
                    ", +%zu) changed while kernel #%" PRIu64 " on stream %d held them (%s, "
                    "queued at %.6f s, checked at %.6f s)\n",
            bad, (a->len + GRID - 1) / GRID, a->base, a->len, a->id, a->si, a->what,
            (double)atomic_load_explicit(&m->t_ns, memory_order_relaxed) / 1e9,
            (double)(now_ns() - R.t0_ns) / 1e9);
    explain(a->base + first_off, first);
  }
  if (a->fwd) {
    queue_pattern("second stream", a->fwd->ui, a->base, a->len, a->fwd->hold_us, NULL);
    atomic_store_explicit(&a->fwd->launched, 1, memory_order_release); /* our last access */
  }
  atomic_fetch_add(&R.kernels_run, 1);
  atomic_fetch_sub(&R.backlog[a->si], 1);
  free(a);
}

/* Queues a pattern kernel; 0 if the launch failed (counted). */
static int queue_pattern(const char *what, int si, uintptr_t base, size_t len, long hold_us,
                         xuse_t *fwd) {
  pattern_arg_t *a = malloc(sizeof *a);
  CHECK(a != NULL);
  *a = (pattern_arg_t){what, si, base, len, new_writer(what, si, base, len), hold_us, fwd};
  atomic_fetch_add(&R.backlog[si], 1);
  gma_status_t st = gma_sim_launch(R.g, R.streams[si], pattern_kernel, a);
  note(st, "gma_sim_launch", 0);
  if (st != GMA_OK) {
    atomic_fetch_sub(&R.backlog[si], 1);
    free(a);
    return 0;
  }
  atomic_fetch_add(&R.kernels_queued, 1);
  return 1;
}

/* Keeps the host at most MAX_BACKLOG kernels ahead of a stream. */
static void throttle(int si) {
  while (atomic_load_explicit(&R.backlog[si], memory_order_relaxed) > MAX_BACKLOG) sleep_us(50);
}

/* One block in three gets a kernel on its stream. One of those in six is
 * then also used on another stream U, ordered after all of the owner
 * stream's earlier work: gma promises only that the block is safe on its own
 * stream, where an earlier owner's kernel may still be queued, so a program
 * must order U after it (cudaStreamWaitEvent). Here the owner's kernel
 * queues U's kernel when it finishes, which orders it without blocking U;
 * the host calls gma_record_stream once that kernel is queued (the contract:
 * after queueing the work, before the free), so the free waits for it. */
static xuse_t *use_block(tstate_t *t, const char *what, void *p, size_t size, int si) {
  if (size < 8 || rnd(&t->rng) % 3) return NULL;
  xuse_t *x = NULL;
  if (rnd(&t->rng) % 6 == 0 && !R.skip_cross) {
    x = malloc(sizeof *x);
    CHECK(x != NULL);
    atomic_init(&x->launched, 0);
    x->ui = (si + 1 + (int)(rnd(&t->rng) % (uint64_t)(R.nstreams - 1))) % R.nstreams;
    x->hold_us = 50 + (long)(rnd(&t->rng) % 251);
  }
  throttle(si);
  if (!queue_pattern(what, si, (uintptr_t)p, size, (long)(rnd(&t->rng) % 101), x)) {
    free(x);
    return NULL;
  }
  return x;
}

/* ---- the workload ---------------------------------------------------------------------- */

static size_t pick_size(tstate_t *t) {
  uint64_t r = rnd(&t->rng) % 100;
  size_t size;
  if (r < 30)
    size = R.popular[rnd(&t->rng) % NPOPULAR];
  else if (r < 70)
    size = log_uniform(&t->rng, 64, 64 * KiB);
  else if (r < 88)
    size = log_uniform(&t->rng, 64 * KiB, MiB);
  else if (r < 97)
    size = log_uniform(&t->rng, MiB, 16 * MiB);
  else
    size = 16 * MiB + rnd(&t->rng) % (32 * MiB);
  size &= ~(size_t)7;
  return size ? size : 8;
}

static size_t pick_small(tstate_t *t) {
  size_t size = rnd(&t->rng) % 2 ? R.popular[rnd(&t->rng) % 8] : log_uniform(&t->rng, 512, 2 * MiB);
  size &= ~(size_t)7;
  return size ? size : 8;
}

static int pick_stream(tstate_t *t) {
  uint64_t r = rnd(&t->rng) % 100;
  if (r < 65) return t->own[0];
  if (r < 80) return t->own[1];
  return R.nstreams - 1 - (int)(rnd(&t->rng) % 2); /* the shared ones are last */
}

/* Takes a new block into the working set; device blocks may get kernels. */
static void add_live(tstate_t *t, const char *what, void *p, size_t size, int si, int host) {
  CHECK(t->nlive < MAX_LIVE);
  xuse_t *x = NULL;
  if (host) {
    t->host_bytes += size;
    throttle(si);
    queue_pattern(what, si, (uintptr_t)p, size, (long)(rnd(&t->rng) % 101), NULL);
  } else {
    t->live_bytes += size;
    x = use_block(t, what, p, size, si);
  }
  t->live[t->nlive++] = (blk_t){p, size, host, x};
}

static void free_one(tstate_t *t, int i) {
  blk_t b = t->live[i];
  t->live[i] = t->live[--t->nlive];
  if (b.host) {
    t->host_bytes -= b.size;
    note(gma_host_free(R.g, b.p), "gma_host_free", 0);
    return;
  }
  t->live_bytes -= b.size;
  if (b.x) { /* record the second stream's use once its kernel is queued */
    long waited = 0;
    while (!atomic_load_explicit(&b.x->launched, memory_order_acquire) &&
           waited < SPIN_LIMIT_US) {
      sleep_us(20);
      waited += 20;
    }
    if (waited >= SPIN_LIMIT_US) {
      atomic_fetch_add(&R.spin_timeouts, 1);
      fprintf(stderr, "soak: a second-stream kernel was not queued within %d s\n",
              SPIN_LIMIT_US / 1000000);
      return; /* leak the block and the record: the kernel may still come */
    }
    note(gma_record_stream(R.g, b.p, R.streams[b.x->ui]), "gma_record_stream", 0);
    atomic_fetch_add(&R.cross_uses, 1);
    free(b.x);
  }
  note(gma_free(R.g, b.p), "gma_free", 0);
}

static void hist_add(tstate_t *t, uint64_t ns) {
  atomic_ullong *c = &t->hist[bucket_of(ns)];
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
                        memory_order_relaxed); /* one writer: no locked instruction */
}

/* Each do_* returns 0 when it did nothing: the size did not fit the target. */
static int do_alloc(tstate_t *t, int tagged) {
  size_t size = pick_size(t);
  if (t->live_bytes + size > t->target) return 0;
  int si = pick_stream(t);
  void *p = NULL;
  int tag = (int)(rnd(&t->rng) % NTAGS);
  uint64_t t0 = now_ns();
  gma_status_t st = tagged ? gma_alloc_tagged(R.g, size, R.streams[si], tags[tag], &p)
                           : gma_alloc(R.g, size, R.streams[si], &p);
  hist_add(t, now_ns() - t0);
  note(st, tagged ? "gma_alloc_tagged" : "gma_alloc", 1);
  if (st != GMA_OK) return 1;
  if (tagged) {
    atomic_fetch_add(&R.tagged, 1);
    if (rnd(&t->rng) % 16 == 0) {
      gma_pointer_info_t info = GMA_POINTER_INFO_INIT;
      gma_status_t is = gma_pointer_info(R.g, (char *)p + size / 2, &info);
      note(is, "gma_pointer_info", 0);
      if (is == GMA_OK &&
          (info.kind != GMA_MEMORY_DEVICE || info.base != p || info.requested != size ||
           info.block_size < size || info.stream != R.streams[si] || !info.tag ||
           strcmp(info.tag, tags[tag]) != 0)) {
        atomic_fetch_add(&R.info_mismatches, 1);
        fprintf(stderr, "soak: gma_pointer_info(%p + %zu) says base %p, %zu of %zu bytes, tag %s\n",
                p, size / 2, info.base, info.requested, info.block_size,
                info.tag ? info.tag : "(null)");
      }
    }
  }
  add_live(t, tagged ? "gma_alloc_tagged" : "gma_alloc", p, size, si, 0);
  return 1;
}

static int do_async(tstate_t *t) {
  size_t size = pick_size(t);
  if (t->live_bytes + size > t->target) return 0;
  int si = pick_stream(t);
  gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
  o.timeout_ns = (100 + rnd(&t->rng) % 201) * 1000000ull; /* 100..300 ms */
  o.callback = future_done;
  gma_future_t *f = NULL;
  gma_status_t st = gma_alloc_async(R.g, size, R.streams[si], &o, &f);
  note(st, "gma_alloc_async", 0);
  if (st != GMA_OK) return 1;
  uint64_t mode = rnd(&t->rng) % 20;
  if (mode < 5 || (mode < 13 && t->npend == MAX_PEND)) { /* release without a wait */
    atomic_fetch_add(&R.released_nowait, 1);
    note(gma_future_release(f), "gma_future_release", 0);
  } else if (mode < 13) { /* poll it while working; collected later */
    t->pend[t->npend++] = (pend_t){f, size, si};
    atomic_fetch_add(&R.async_polled, 1);
  } else { /* wait */
    void *p = NULL;
    st = gma_future_wait(f, UINT64_MAX, &p);
    atomic_fetch_add(&R.async_waited, 1);
    if (st == GMA_OK) {
      add_live(t, "async, waited", p, size, si, 0);
    }
    note(gma_future_release(f), "gma_future_release", 0);
  }
  return 1;
}

/* Collects the polled futures that completed; with all set, waits for each. */
static void poll_pending(tstate_t *t, int all) {
  for (int i = 0; i < t->npend;) {
    pend_t *q = &t->pend[i];
    if (!all && gma_future_poll(q->f) == GMA_PENDING) {
      i++;
      continue;
    }
    void *p = NULL;
    gma_status_t st = gma_future_wait(q->f, all ? UINT64_MAX : 0, &p);
    if (st == GMA_PENDING) { /* its callback is still running */
      i++;
      continue;
    }
    if (st == GMA_OK) {
      add_live(t, "async, polled", p, q->size, q->si, 0);
    }
    note(gma_future_release(q->f), "gma_future_release", 0);
    *q = t->pend[--t->npend];
  }
}

static int do_batch(tstate_t *t, int async) {
  size_t n = 2 + rnd(&t->rng) % 11, sizes[12];
  void *ptrs[12] = {0};
  for (size_t i = 0; i < n; i++) sizes[i] = pick_small(t);
  int si = pick_stream(t);
  gma_status_t st;
  if (!async) {
    st = gma_alloc_batch(R.g, n, sizes, R.streams[si], ptrs);
    note(st, "gma_alloc_batch", 1);
    atomic_fetch_add(&R.batches, 1);
  } else {
    gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
    o.timeout_ns = 200 * 1000000ull;
    o.callback = future_done;
    gma_future_t *f = NULL;
    st = gma_alloc_batch_async(R.g, n, sizes, R.streams[si], ptrs, &o, &f);
    note(st, "gma_alloc_batch_async", 0);
    if (st != GMA_OK) return 1;
    atomic_fetch_add(&R.batch_async, 1);
    if (rnd(&t->rng) % 4 == 0) { /* let it go: gma frees the blocks or cancels */
      atomic_fetch_add(&R.released_nowait, 1);
      note(gma_future_release(f), "gma_future_release", 0);
      return 1;
    }
    st = gma_future_wait(f, UINT64_MAX, NULL);
    note(gma_future_release(f), "gma_future_release", 0);
  }
  if (st != GMA_OK) return 1;
  for (size_t i = 0; i < n; i++) add_live(t, async ? "batch async" : "batch", ptrs[i], sizes[i], si, 0);
  return 1;
}

/* A staging buffer: the host fills it at once (overwriting the pattern of a
 * kernel that still held it, if gma handed it out too early), then a kernel
 * on its stream "copies" it. */
static int do_host(tstate_t *t) {
  size_t size = log_uniform(&t->rng, 4 * KiB, 2 * MiB) & ~(size_t)7;
  int si = pick_stream(t);
  void *p = NULL;
  gma_status_t st = gma_host_alloc(R.g, size, R.streams[si], &p);
  note(st, "gma_host_alloc", 1);
  if (st != GMA_OK) return 1;
  atomic_fetch_add(&R.host_allocs, 1);
  uint64_t id = new_writer("host fill", -1, (uintptr_t)p, size);
  for (size_t off = 0; off + 8 <= size; off += GRID)
    __atomic_store_n((uint64_t *)((uintptr_t)p + off), word_value(id, off), __ATOMIC_RELAXED);
  atomic_fetch_add(&R.host_fills, 1);
  add_live(t, "host", p, size, si, 1);
  return 1;
}

/* The working-set target: rise, hold high, fall, hold low. */
static size_t target_bytes(uint64_t now) {
  uint64_t period = R.phase_ms * 1000000ull;
  double x = (double)((now - R.t0_ns) % period) / (double)period, shape;
  if (x < 0.25)
    shape = x / 0.25;
  else if (x < 0.5)
    shape = 1;
  else if (x < 0.75)
    shape = 1 - (x - 0.5) / 0.25;
  else
    shape = 0;
  return R.lo_bytes + (size_t)((double)(R.hi_bytes - R.lo_bytes) * shape);
}

static void *thread_main(void *argp) {
  tstate_t *t = argp;
  while (!atomic_load_explicit(&R.stop, memory_order_relaxed)) {
    if (t->npend) poll_pending(t, 0);
    size_t target = t->target = target_bytes(now_ns());
    uint64_t r = rnd(&t->rng) % 100;
    int room = t->nlive + 12 + MAX_PEND < MAX_LIVE, did = 0;
    if (!t->nlive || (t->live_bytes <= target && room && r >= 30)) {
      uint64_t k = rnd(&t->rng) % 100;
      if ((k >= 62 && k < 76 && R.skip_async) || (k >= 76 && k < 85 && R.skip_batch) ||
          (k >= 85 && k < 90 && R.skip_host))
        k = 0; /* --skip: a plain gma_alloc instead */
      if (k < 50)
        did = do_alloc(t, 0);
      else if (k < 62)
        did = do_alloc(t, 1);
      else if (k < 76)
        did = do_async(t);
      else if (k < 82)
        did = do_batch(t, 0);
      else if (k < 85)
        did = do_batch(t, 1);
      else if (k < 90 && t->host_bytes < 16 * MiB)
        did = do_host(t);
      else
        did = do_alloc(t, 0);
    }
    if (!did && t->nlive) { /* above the target, or the size did not fit: free */
      free_one(t, (int)(rnd(&t->rng) % (uint64_t)t->nlive));
      did = 1;
    }
    if (rnd(&t->rng) % 2500 == 0 && !R.skip_trim) {
      atomic_fetch_add(&R.trims_called, 1);
      if (rnd(&t->rng) % 4 == 0)
        note(gma_empty_cache(R.g), "gma_empty_cache", 0);
      else
        note(gma_trim(R.g, (rnd(&t->rng) % 4) * 16 * MiB), "gma_trim", 0);
    }
    if (did) atomic_fetch_add_explicit(&t->ops, 1, memory_order_relaxed);
  }
  poll_pending(t, 1);
  while (t->nlive) free_one(t, t->nlive - 1);
  return NULL;
}

/* ---- the monitor ------------------------------------------------------------------------- */

static double mib(uint64_t b) { return (double)b / (double)MiB; }

static double load1(void) {
  double l = -1;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &l) != 1) l = -1;
    fclose(f);
  }
  return l;
}

static double rss_mib(void) {
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  return (double)resident * 4096.0 / (double)MiB;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static uint64_t median(const uint64_t *v, size_t n) {
  if (!n) return 0;
  uint64_t *c = malloc(n * sizeof *c);
  CHECK(c != NULL);
  memcpy(c, v, n * sizeof *c);
  qsort(c, n, sizeof *c, cmp_u64);
  uint64_t m = n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
  free(c);
  return m;
}

typedef struct snap {
  uint64_t ops, dev_allocs, dev_frees, fut_ready, fut_failed, fut_timed_out;
  uint64_t status[32];
  uint64_t hist[NBUCKETS];
} snap_t;

static void take_snap(tstate_t *ts, const gma_stats_t *s, snap_t *out) {
  memset(out, 0, sizeof *out);
  for (int i = 0; i < R.nthreads; i++) {
    out->ops += atomic_load_explicit(&ts[i].ops, memory_order_relaxed);
    for (int b = 0; b < NBUCKETS; b++)
      out->hist[b] += atomic_load_explicit(&ts[i].hist[b], memory_order_relaxed);
  }
  out->dev_allocs = s->num_device_allocs;
  out->dev_frees = s->num_device_frees;
  out->fut_ready = s->futures_ready;
  out->fut_failed = s->futures_failed;
  out->fut_timed_out = s->futures_timed_out;
  for (int i = 0; i < 32; i++) out->status[i] = atomic_load(&R.status[i]);
}

static void usage(void) {
  fprintf(stderr, "usage: soak [--seconds S] [--threads T] [--seed N] [--report-s R] "
                  "[--phase-ms P] [--conf key:value,...] [--skip async,batch,host,cross,trim]\n");
  exit(2);
}

int main(int argc, char **argv) {
  double seconds = 600, report_s = 10;
  int nthreads = 4;
  uint64_t seed = (uint64_t)time(NULL), phase_ms = 0;
  const char *conf = NULL, *skip = "";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (i + 1 >= argc) usage();
    const char *v = argv[++i];
    if (strcmp(a, "--seconds") == 0)
      seconds = atof(v);
    else if (strcmp(a, "--threads") == 0)
      nthreads = atoi(v);
    else if (strcmp(a, "--seed") == 0)
      seed = strtoull(v, NULL, 0);
    else if (strcmp(a, "--report-s") == 0)
      report_s = atof(v);
    else if (strcmp(a, "--phase-ms") == 0)
      phase_ms = strtoull(v, NULL, 0);
    else if (strcmp(a, "--conf") == 0)
      conf = v;
    else if (strcmp(a, "--skip") == 0)
      skip = v;
    else
      usage();
  }
  if (!(seconds > 0) || !(report_s > 0) || nthreads < 1 || nthreads > 64) usage();
  for (const char *w = skip; *w;) { /* a comma-separated list */
    size_t n = strcspn(w, ",");
    if (n == 5 && strncmp(w, "async", 5) == 0) R.skip_async = true;
    else if (n == 5 && strncmp(w, "batch", 5) == 0) R.skip_batch = true;
    else if (n == 4 && strncmp(w, "host", 4) == 0) R.skip_host = true;
    else if (n == 5 && strncmp(w, "cross", 5) == 0) R.skip_cross = true;
    else if (n == 4 && strncmp(w, "trim", 4) == 0) R.skip_trim = true;
    else usage();
    w += n + (w[n] == ',');
  }
  if (!phase_ms) phase_ms = (uint64_t)(report_s * 500);
  if (phase_ms < 100) phase_ms = 100;

  /* The configuration: the soak's base, then GMA_CONF, then --conf. */
  const char *base = "memory_limit:512M,trim_interval_ms:20,release_threshold:32M,idle_ms:200,"
                     "future_timeout_ms:250";
  gma_config_t cfg = GMA_CONFIG_INIT;
  cfg.device = GMA_DEVICE_SIM;
  cfg.ignore_env = 1;
  CHECK_OK(gma_config_parse(&cfg, base));
  const char *env = getenv("GMA_CONF");
  if (env && *env) CHECK_OK(gma_config_parse(&cfg, env));
  if (conf) CHECK_OK(gma_config_parse(&cfg, conf));
  CHECK(cfg.device == GMA_DEVICE_SIM);
  CHECK(cfg.memory_limit > 0);

  R.seed = seed;
  R.nthreads = nthreads;
  R.nstreams = 2 * nthreads + 2;
  R.phase_ms = phase_ms;
  R.hi_bytes = (size_t)(cfg.memory_limit * 3 / 10 / (uint64_t)nthreads);
  R.lo_bytes = R.hi_bytes / 8;
  uint64_t prng = mix64(seed) | 1;
  for (int i = 0; i < NPOPULAR; i++) { /* 12 sizes 512 B..4 MiB, 4 of 4..32 MiB */
    size_t s = i < 12 ? log_uniform(&prng, 512, 4 * MiB) : 4 * MiB + rnd(&prng) % (28 * MiB);
    R.popular[i] = s & ~(size_t)7;
  }
  int nslots = (int)(seconds / report_s + 2);
  if (nslots > MAX_INTERVALS) nslots = MAX_INTERVALS;

  printf("soak: seed %" PRIu64 ", %d threads, %d streams (2 per thread + 2 shared), %.0f s, "
         "report every %.1f s, phase period %" PRIu64 " ms\n",
         seed, nthreads, R.nstreams, seconds, report_s, phase_ms);
  printf("  config: %s%s%s%s%s; memory_limit %.0f MiB, working set per thread %.1f..%.1f MiB\n",
         base, env && *env ? "," : "", env && *env ? env : "", conf ? "," : "", conf ? conf : "",
         mib(cfg.memory_limit), mib(R.lo_bytes), mib(R.hi_bytes));
  printf("  rerun: soak --seconds %g --threads %d --seed %" PRIu64 " --report-s %g --phase-ms %" PRIu64
         "%s%s%s%s\n",
         seconds, nthreads, seed, report_s, phase_ms, conf ? " --conf " : "", conf ? conf : "",
         *skip ? " --skip " : "", skip);
  printf("  load average at start %.2f on %ld CPUs\n", load1(), (long)sysconf(_SC_NPROCESSORS_ONLN));
  printf("  each line: ops/s; allocated and reserved MiB now/interval peak/peak since start; "
         "device allocs/frees, futures ready/failed/timed out and errors in the interval; "
         "gma_alloc ns p50/p99/p999; corruptions so far; RSS; load\n");
  fflush(stdout);

  CHECK_OK(gma_create(&cfg, &R.g));
  CHECK_OK(gma_set_pressure_callback(R.g, pressure_changed, NULL));
  metas = calloc(META, sizeof *metas);
  CHECK(metas != NULL);
  R.streams = calloc((size_t)R.nstreams, sizeof *R.streams);
  R.backlog = calloc((size_t)R.nstreams, sizeof *R.backlog);
  tstate_t *ts = calloc((size_t)nthreads, sizeof *ts);
  uint64_t *p99s = calloc((size_t)nslots, sizeof *p99s);
  uint64_t *p999s = calloc((size_t)nslots, sizeof *p999s);
  snap_t *prev = calloc(1, sizeof *prev), *cur = calloc(1, sizeof *cur);
  uint64_t *dh = calloc(NBUCKETS, sizeof *dh);
  CHECK(R.streams && R.backlog && ts && p99s && p999s && prev && cur && dh);
  for (int i = 0; i < R.nstreams; i++) CHECK_OK(gma_stream_create(R.g, &R.streams[i]));

  R.t0_ns = now_ns();
  for (int i = 0; i < nthreads; i++) {
    ts[i].index = i;
    ts[i].rng = mix64(seed ^ mix64((uint64_t)i + 1)) | 1;
    ts[i].own[0] = 2 * i;
    ts[i].own[1] = 2 * i + 1;
    CHECK(pthread_create(&ts[i].th, NULL, thread_main, &ts[i]) == 0);
  }

  /* Monitor: sample every SAMPLE_MS, report every report_s. */
  uint64_t end_ns = R.t0_ns + (uint64_t)(seconds * 1e9);
  uint64_t third_ns = (uint64_t)(seconds * 1e9 / 3);
  uint64_t report_ns = (uint64_t)(report_s * 1e9);
  uint64_t next_report = R.t0_ns + report_ns, last_report = R.t0_ns;
  uint64_t first_third_peak = 0, last_third_peak = 0, ipk_alloc = 0, ipk_resv = 0;
  size_t nfull = 0;
  gma_stats_t s = stats_of(R.g), at_peak = s;
  take_snap(ts, &s, prev);
  for (;;) {
    uint64_t now = now_ns();
    uint64_t wake = next_report < end_ns ? next_report : end_ns;
    uint64_t nap = now + SAMPLE_MS * 1000000ull < wake ? SAMPLE_MS * 1000000ull
                                                       : (wake > now ? wake - now : 0);
    if (nap) sleep_us((long)(nap / 1000));
    now = now_ns();
    s = stats_of(R.g);
    if (s.allocated.current > ipk_alloc) ipk_alloc = s.allocated.current;
    if (s.reserved.current > ipk_resv) ipk_resv = s.reserved.current;
    if (s.reserved.current > at_peak.reserved.current) at_peak = s;
    uint64_t el = now - R.t0_ns;
    if (el < third_ns && s.reserved.current > first_third_peak) first_third_peak = s.reserved.current;
    if (el >= 2 * third_ns && s.reserved.current > last_third_peak)
      last_third_peak = s.reserved.current;
    int at_end = now >= end_ns;
    if (now < next_report && !at_end) continue;
    int full = now >= next_report;
    take_snap(ts, &s, cur);
    double dt = (double)(now - last_report) / 1e9;
    uint64_t timed = 0;
    for (int b = 0; b < NBUCKETS; b++) timed += dh[b] = cur->hist[b] - prev->hist[b];
    uint64_t p50 = percentile(dh, timed, 0.50), p99 = percentile(dh, timed, 0.99),
             p999 = percentile(dh, timed, 0.999);
    if (full && timed >= MIN_TIMED && nfull < (size_t)nslots) {
      p99s[nfull] = p99;
      p999s[nfull] = p999;
      nfull++;
    }
    char errs[256] = "none";
    size_t len = 0;
    for (int i = 0; i < 32; i++) {
      uint64_t d = cur->status[i] - prev->status[i];
      if (d && len < sizeof errs - 40)
        len += (size_t)snprintf(errs + len, sizeof errs - len, "%s%s:%" PRIu64, len ? "," : "",
                                gma_status_name((gma_status_t)(i - ST_OFF)) + 4, d);
    }
    printf("[%7.1fs] ops/s %8.0f | alloc MiB %6.1f/%6.1f/%6.1f | resv MiB %6.1f/%6.1f/%6.1f | "
           "dev +%" PRIu64 " -%" PRIu64 " | fut %" PRIu64 "/%" PRIu64 "/%" PRIu64
           " | ns %" PRIu64 "/%" PRIu64 "/%" PRIu64 " | err %s | corrupt %llu | rss %.0f | "
           "load %.1f%s\n",
           (double)el / 1e9, (double)(cur->ops - prev->ops) / dt, mib(s.allocated.current),
           mib(ipk_alloc), mib(s.allocated.peak), mib(s.reserved.current), mib(ipk_resv),
           mib(s.reserved.peak), cur->dev_allocs - prev->dev_allocs,
           cur->dev_frees - prev->dev_frees, cur->fut_ready - prev->fut_ready,
           cur->fut_failed - prev->fut_failed, cur->fut_timed_out - prev->fut_timed_out, p50, p99,
           p999, errs, (unsigned long long)atomic_load(&R.corruptions), rss_mib(), load1(),
           full ? "" : " (partial)");
    fflush(stdout);
    snap_t *tmp = prev;
    prev = cur;
    cur = tmp;
    last_report = now;
    ipk_alloc = s.allocated.current;
    ipk_resv = s.reserved.current;
    while (next_report <= now) next_report += report_ns;
    if (at_end) break;
  }

  /* Stop, let every thread free what it holds, drain the device. */
  atomic_store(&R.stop, 1);
  for (int i = 0; i < nthreads; i++) CHECK(pthread_join(ts[i].th, NULL) == 0);
  double run_s = (double)(now_ns() - R.t0_ns) / 1e9;
  for (int i = 0; i < R.nstreams; i++)
    note(gma_stream_synchronize(R.g, R.streams[i]), "gma_stream_synchronize", 0);
  gma_stats_t fin = stats_of(R.g);

  uint64_t ops = 0;
  for (int i = 0; i < nthreads; i++) ops += atomic_load(&ts[i].ops);
  uint64_t oom = atomic_load(&R.status[GMA_ERR_OOM + ST_OFF]);
  uint64_t fut_tmo = atomic_load(&R.fut_status[GMA_ERR_TIMEOUT + ST_OFF]);
  uint64_t fut_cancel = atomic_load(&R.fut_status[GMA_ERR_CANCELLED + ST_OFF]);
  uint64_t fut_ok = atomic_load(&R.fut_status[GMA_OK + ST_OFF]);
  uint64_t fut_other = 0;
  for (int i = 0; i < 32; i++)
    if (i != GMA_OK + ST_OFF && i != GMA_ERR_TIMEOUT + ST_OFF && i != GMA_ERR_CANCELLED + ST_OFF)
      fut_other += atomic_load(&R.fut_status[i]);
  uint64_t released = atomic_load(&R.released_nowait);
  uint64_t unexpected_calls = atomic_load(&R.unexpected);
  uint64_t unexpected = unexpected_calls + fut_other +
                        (fut_cancel > released ? fut_cancel - released : 0);

  printf("soak: %.1f s, %" PRIu64 " ops (%.0f ops/s); allocs %" PRIu64 " (tagged %llu), frees %" PRIu64
         ", batches %llu + async %llu, host allocs %llu\n",
         run_s, ops, (double)ops / run_s, fin.num_allocs, (unsigned long long)R.tagged,
         fin.num_frees, (unsigned long long)R.batches, (unsigned long long)R.batch_async,
         (unsigned long long)R.host_allocs);
  printf("  futures: submitted %" PRIu64 " (ready at once %" PRIu64 "), waited %llu, polled %llu, "
         "released unwaited %llu; completions ok %" PRIu64 ", timed out %" PRIu64
         ", cancelled %" PRIu64 ", other %" PRIu64 "; worker submit->ready p50 %" PRIu64
         " p99 %" PRIu64 " ns\n",
         fin.futures_submitted, fin.futures_ready_at_once, (unsigned long long)R.async_waited,
         (unsigned long long)R.async_polled, (unsigned long long)released, fut_ok, fut_tmo,
         fut_cancel, fut_other, fin.submit_to_ready_p50_ns, fin.submit_to_ready_p99_ns);
  printf("  kernels %llu queued / %llu run, cross-stream uses %llu, host fills %llu; hits bin %" PRIu64
         " stream %" PRIu64 " pool %" PRIu64 " device %" PRIu64 "\n",
         (unsigned long long)R.kernels_queued, (unsigned long long)R.kernels_run,
         (unsigned long long)R.cross_uses, (unsigned long long)R.host_fills, fin.hits_bin,
         fin.hits_stream, fin.hits_pool, fin.hits_device);
  printf("  device allocs %" PRIu64 ", frees %" PRIu64 "; trims: called %llu, explicit %" PRIu64
         ", timed %" PRIu64 ", idle %" PRIu64 ", pressure %" PRIu64 ", %.1f GiB trimmed; "
         "pressure level changes %llu; OOM retries %" PRIu64 "\n",
         fin.num_device_allocs, fin.num_device_frees, (unsigned long long)R.trims_called,
         fin.trims_explicit, fin.trims_timed, fin.trims_idle, fin.trims_pressure,
         (double)fin.bytes_trimmed / (double)(1 << 30), (unsigned long long)R.pressure_changes,
         fin.num_oom_retries);

  char why[1024] = "";
  size_t wl = 0;
#define FAIL(...) (wl += (size_t)snprintf(why + wl, wl < sizeof why ? sizeof why - wl : 0, __VA_ARGS__))

  /* 1. corruption */
  uint64_t corr = atomic_load(&R.corruptions), mism = atomic_load(&R.info_mismatches);
  printf("  corruptions %" PRIu64 ", pointer-info mismatches %" PRIu64 "\n", corr, mism);
  if (corr || mism) FAIL("  corruptions %" PRIu64 ", pointer-info mismatches %" PRIu64 "\n", corr, mism);
  if (R.spin_timeouts) FAIL("  %llu second-stream kernels not queued in time\n", (unsigned long long)R.spin_timeouts);
  if (R.kernels_run != R.kernels_queued)
    FAIL("  %llu kernels queued but %llu ran\n", (unsigned long long)R.kernels_queued,
         (unsigned long long)R.kernels_run);

  /* 2. errors */
  printf("  errors: OOM %" PRIu64 " (allowed), future timeouts %" PRIu64 " (allowed), "
         "cancelled %" PRIu64 " (allowed up to %" PRIu64 " released unwaited), unexpected %" PRIu64
         "\n",
         oom, fut_tmo, fut_cancel, released, unexpected);
  if (unexpected) FAIL("  %" PRIu64 " unexpected error statuses (first ones on stderr)\n", unexpected);

  /* 3. reserved memory bounded */
  double ratio = first_third_peak ? (double)last_third_peak / (double)first_third_peak : 0;
  printf("  reserved: peak %.1f MiB (limit %.0f MiB); sampled peak first third %.1f MiB, last "
         "third %.1f MiB, ratio %.2f (must be <= 1.25)\n",
         mib(fin.reserved.peak), mib(cfg.memory_limit), mib(first_third_peak),
         mib(last_third_peak), ratio);
  printf("  at the highest sample of reserved (%.1f MiB): allocated %.1f, stream-cached %.1f, "
         "pending %.1f, free %.1f MiB in %" PRIu64 " segments, largest free block %.1f MiB, "
         "pressure level %d\n",
         mib(at_peak.reserved.current), mib(at_peak.allocated.current),
         mib(at_peak.stream_cached_bytes), mib(at_peak.pending_bytes), mib(at_peak.free_bytes),
         at_peak.num_segments, mib(at_peak.largest_free_block), at_peak.pressure_level);
  if (fin.reserved.peak > cfg.memory_limit)
    FAIL("  peak reserved %.1f MiB above memory_limit %.0f MiB\n", mib(fin.reserved.peak),
         mib(cfg.memory_limit));
  /* The peaks of a few phases vary at random (up to 1.2x between thirds of
   * an 8 s run): judge growth only when each third holds 20 phases or more. */
  int judge_growth = seconds * 1000 / 3 >= 20.0 * (double)phase_ms;
  if (!judge_growth) printf("  (growth not judged: a third of the run holds fewer than 20 phases)\n");
  if (judge_growth && ratio > 1.25)
    FAIL("  reserved grew: last third's peak %.1f MiB > 1.25 x first third's %.1f MiB\n",
         mib(last_third_peak), mib(first_third_peak));

  /* 4. latency stable */
  if (nfull >= 2) {
    uint64_t m = median(p99s, nfull);
    size_t k = nfull < 3 ? 1 : 3;
    uint64_t last = median(p99s + nfull - k, k);
    uint64_t m999 = median(p999s, nfull), last999 = median(p999s + nfull - k, k);
    printf("  latency: %zu full intervals; gma_alloc p99 median %" PRIu64 " ns, last %zu "
           "intervals' median %" PRIu64 " ns, ratio %.2f (must be <= 3); p999 median %" PRIu64
           " ns, last %" PRIu64 " ns (not judged)\n",
           nfull, m, k, last, m ? (double)last / (double)m : 0, m999, last999);
    if (last > 3 * m)
      FAIL("  latency grew: p99 of the last %zu interval(s) %" PRIu64 " ns > 3 x median %" PRIu64
           " ns\n",
           k, last, m);
  } else {
    printf("  latency: fewer than 2 full intervals with %d timed allocations: not judged\n",
           MIN_TIMED);
  }

  /* 5. the worker trimmed on its own */
  if (seconds * 1000 >= 2.0 * (double)phase_ms && fin.trims_timed + fin.trims_idle == 0)
    FAIL("  the worker's timed trimming never released memory\n");

  /* 6. everything goes back */
  gma_stats_t e = fin;
  for (int tries = 0; tries < 5000; tries++) {
    note(gma_empty_cache(R.g), "gma_empty_cache", 0);
    e = stats_of(R.g);
    if (e.reserved.current == 0 && e.host_reserved.current == 0) break;
    sleep_us(1000);
  }
  printf("  after gma_empty_cache: allocated %" PRIu64 ", reserved %" PRIu64 ", segments %" PRIu64
         ", host allocated %" PRIu64 ", host reserved %" PRIu64 "\n",
         e.allocated.current, e.reserved.current, e.num_segments, e.host_allocated.current,
         e.host_reserved.current);
  if (e.allocated.current || e.reserved.current || e.host_allocated.current ||
      e.host_reserved.current)
    FAIL("  memory left after freeing everything and gma_empty_cache\n");
  for (int i = 0; i < R.nstreams; i++) {
    gma_status_t st = gma_stream_destroy(R.g, R.streams[i]);
    if (st != GMA_OK) FAIL("  gma_stream_destroy: %s (%s)\n", gma_status_name(st), gma_last_error());
  }
  gma_status_t dst = gma_destroy(R.g);
  printf("  gma_destroy: %s\n", gma_status_name(dst));
  if (dst != GMA_OK) FAIL("  gma_destroy returned %s (%s)\n", gma_status_name(dst), gma_last_error());
  uint64_t late = atomic_load(&R.unexpected) - unexpected_calls;
  if (late) FAIL("  %" PRIu64 " unexpected error statuses during teardown\n", late);
  printf("  load average at end %.2f\n", load1());

  free(metas);
  free(R.streams);
  free(R.backlog);
  free(ts);
  free(p99s);
  free(p999s);
  free(prev);
  free(cur);
  free(dh);
  if (wl) {
    printf("soak: FAILED (seed %" PRIu64 "):\n%s", seed, why);
    fprintf(stderr, "soak: FAILED (seed %" PRIu64 "):\n%s", seed, why);
    return 1;
  }
  printf("soak: ok\n");
  return 0;
}
