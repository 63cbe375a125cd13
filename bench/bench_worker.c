/* gma-bench-worker: what the worker thread costs while nothing happens, and
 * how quickly timed trimming gives a burst's cache back.
 *
 * 1. Idle CPU: an allocator (with its worker and the simulated device's
 *    default stream thread) sits idle for a second; CPU time of the whole
 *    process over that second, from getrusage, against the same second with
 *    no allocator at all (the baseline, measured in the same run). Goal: at
 *    most 1 ms per second of idleness.
 * 2. Timed trim: after a burst of 300 MiB is freed, the time until reserved
 *    memory is at most the release threshold, with no caller call, for a few
 *    trim intervals.
 * 3. Async: a future ready at once on a bin hit (gma_alloc_async + wait +
 *    release, and the free that refills the bin) against the same pair
 *    through gma_alloc; the taking side alone on such a future (wait +
 *    release, or gma_future_take, waiting without a limit) against a bin hit
 *    timed the same way; an 8 MiB future (above bin_max), submit to ready,
 *    p50 and p99, as served by default (on the submitting thread, from the
 *    pool) and with options.worker_only (the worker serves it: the hop's
 *    cost); a batch of 64 blocks from the
 *    pool against 64 single allocations.
 * 4. Memory pressure: 4 pipeline stages on 4 streams, each holding its
 *    current buffer while it gets the next one, under a device (and limit)
 *    of 90% of the peak demand. gma's async requests wait for other stages'
 *    frees and the run completes; direct device allocation (the device's own
 *    allocate/free, no caching, no waiting: cudaMalloc's behaviour) runs the
 *    same schedule and fails with out-of-memory. Time and peak reserved.
 * 5. Pipeline one micro-batch ahead: 4 stages on 4 streams, 32 micro-batches
 *    of 8 buffers (256 KiB - 4 MiB); each stage asks gma_alloc_batch_async
 *    for the next micro-batch's buffers, launches the current one's kernel
 *    (200 us on the device) and does 100 us of host work, then waits for the
 *    future and frees the current buffers. Time blocked in gma_future_wait per
 *    stage against the same loop with gma_alloc_batch (the time inside it),
 *    and how many waits found the future ready. Stages keep their threads
 *    busy on the host, as a framework's would: 4 busy threads on 2 cores.
 * Prints a table, writes JSON (--json PATH, default bench_worker.json). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "device/device.h"
#include "benchkit.h"
#include "gma.h"


static double cpu_ms(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
         (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static gma_t *make(const char *conf) {
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1;
  gma_status_t st = conf ? gma_config_parse(&c, conf) : GMA_OK;
  gma_t *g = NULL;
  if (st == GMA_OK) st = gma_create(&c, &g);
  if (st != GMA_OK) {
    fprintf(stderr, "gma-bench-worker: %s\n", gma_last_error());
    exit(1);
  }
  return g;
}

/* CPU ms the process uses over one idle second, with an allocator made from
 * conf (NULL: no allocator, the baseline). */
static double idle_cpu(const char *conf, int with_allocator) {
  gma_t *g = with_allocator ? make(conf) : NULL;
  sleep_ms(50); /* let start-up work finish */
  double c0 = cpu_ms();
  sleep_ms(1000);
  double used = cpu_ms() - c0;
  if (g) gma_destroy(g);
  return used;
}

static double trim_ms(int interval_ms) {
  char conf[128];
  snprintf(conf, sizeof conf, "trim_interval_ms:%d,release_threshold:8M,idle_ms:3600000",
           interval_ms);
  gma_t *g = make(conf);
  void *p[10];
  for (int i = 0; i < 10; i++) gma_alloc(g, 30u << 20, NULL, &p[i]);
  for (int i = 0; i < 10; i++) gma_free(g, p[i]);
  uint64_t t0 = now_ns();
  gma_stats_t s = GMA_STATS_INIT;
  do {
    sleep_ms(1);
    gma_stats(g, &s);
  } while (s.reserved.current > (8u << 20) && now_ns() - t0 < 10000000000ull);
  double ms = (double)(now_ns() - t0) / 1e6;
  gma_destroy(g);
  return ms;
}

enum { REPS = 31 };


static double median_d(double *v) {
  qsort(v, REPS, sizeof *v, cmp_double);
  return v[REPS / 2];
}


static uint64_t pct(uint64_t *v, size_t n, double q) {
  qsort(v, n, sizeof *v, cmp_u64);
  size_t i = (size_t)(q * (double)(n - 1) + 0.5);
  return v[i];
}

typedef struct async_result {
  double submit_ns;                      /* gma_alloc_async alone, ready at once */
  double wait_release_ns, take_ns;       /* on a future ready at once, each timed alone */
  double bin_hit_ns;                     /* gma_alloc alone on a bin hit, the same way */
  double take_cycle_ns;                  /* gma_alloc_async + gma_future_take + gma_free */
  double at_once_ns, sync_ns;            /* medians per cycle, batches of 1000 */
  uint64_t worker_p50_ns, worker_p99_ns; /* submit to ready, per request, worker_only */
  uint64_t pool_p50_ns, pool_p99_ns;     /* the same by default: served at once from the pool */
  double batch64_ns, singles64_ns;       /* medians */
} async_result_t;

/* ns per call: time spent minus the clock reads' own cost, over n calls; 0
 * when the clock reads cost more (the call is below the timer's resolution),
 * never a wrapped unsigned difference. */
static double net_ns(uint64_t spent, uint64_t empty, int n) {
  return spent > empty ? (double)(spent - empty) / n : 0.0;
}

static async_result_t run_async(void) {
  async_result_t r;
  gma_t *g = make(NULL);
  double at_once[REPS], sync[REPS];
  void *p;
  gma_future_t *f;
  gma_alloc(g, 4096, NULL, &p);
  gma_free(g, p);
  for (int rep = 0; rep < REPS; rep++) {
    uint64_t t0 = now_ns();
    for (int i = 0; i < 1000; i++) {
      gma_alloc_async(g, 4096, NULL, NULL, &f);
      gma_future_wait(f, 0, &p);
      gma_future_release(f);
      gma_free(g, p);
    }
    uint64_t t1 = now_ns();
    for (int i = 0; i < 1000; i++) {
      gma_alloc(g, 4096, NULL, &p);
      gma_free(g, p);
    }
    uint64_t t2 = now_ns();
    at_once[rep] = (double)(t1 - t0) / 1000;
    sync[rep] = (double)(t2 - t1) / 1000;
  }
  /* The submit alone (the future is ready when it returns): each call timed,
   * minus the cost of the clock reads measured the same way. */
  double submit[REPS];
  for (int rep = 0; rep < REPS; rep++) {
    uint64_t spent = 0, empty = 0;
    for (int i = 0; i < 1000; i++) {
      uint64_t t0 = now_ns();
      gma_alloc_async(g, 4096, NULL, NULL, &f);
      uint64_t t1 = now_ns();
      uint64_t t2 = now_ns();
      spent += t1 - t0;
      empty += t2 - t1;
      gma_future_wait(f, 0, &p);
      gma_future_release(f);
      gma_free(g, p);
    }
    submit[rep] = net_ns(spent, empty, 1000);
  }
  r.submit_ns = median_d(submit);
  /* The taking side alone, on a future ready at once, waited on without a
   * limit (UINT64_MAX) as a pipeline would: wait + release, and take; and a
   * bin hit (gma_alloc alone) timed the same way, the cost to compare with. */
  double waitrel[REPS], take[REPS], hit[REPS], take_cycle[REPS];
  for (int rep = 0; rep < REPS; rep++) {
    uint64_t spent[3] = {0, 0, 0}, empty[3] = {0, 0, 0};
    for (int i = 0; i < 1000; i++) {
      gma_alloc_async(g, 4096, NULL, NULL, &f);
      uint64_t t0 = now_ns();
      gma_future_wait(f, UINT64_MAX, &p);
      gma_future_release(f);
      uint64_t t1 = now_ns();
      uint64_t t2 = now_ns();
      spent[0] += t1 - t0;
      empty[0] += t2 - t1;
      gma_free(g, p);
      gma_alloc_async(g, 4096, NULL, NULL, &f);
      t0 = now_ns();
      gma_future_take(f, UINT64_MAX, &p);
      t1 = now_ns();
      t2 = now_ns();
      spent[1] += t1 - t0;
      empty[1] += t2 - t1;
      gma_free(g, p);
      t0 = now_ns();
      gma_alloc(g, 4096, NULL, &p);
      t1 = now_ns();
      t2 = now_ns();
      spent[2] += t1 - t0;
      empty[2] += t2 - t1;
      gma_free(g, p);
    }
    waitrel[rep] = net_ns(spent[0], empty[0], 1000);
    take[rep] = net_ns(spent[1], empty[1], 1000);
    hit[rep] = net_ns(spent[2], empty[2], 1000);
    uint64_t t0 = now_ns();
    for (int i = 0; i < 1000; i++) {
      gma_alloc_async(g, 4096, NULL, NULL, &f);
      gma_future_take(f, UINT64_MAX, &p);
      gma_free(g, p);
    }
    take_cycle[rep] = (double)(now_ns() - t0) / 1000;
  }
  r.wait_release_ns = median_d(waitrel);
  r.take_ns = median_d(take);
  r.bin_hit_ns = median_d(hit);
  r.take_cycle_ns = median_d(take_cycle);
  /* 8 MiB is above bin_max: the pool serves it, on this thread when it
   * holds the memory and its lock is free (the default), or on the worker
   * (worker_only: every request takes the hop). */
  enum { NW = 2000 };
  uint64_t *lat = malloc(NW * sizeof *lat);
  for (int mode = 0; mode < 2; mode++) {
    gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
    o.worker_only = mode;
    for (int i = 0; i < NW; i++) {
      uint64_t t0 = now_ns();
      gma_alloc_async(g, 8u << 20, NULL, &o, &f);
      gma_future_wait(f, UINT64_MAX, &p);
      lat[i] = now_ns() - t0;
      gma_future_release(f);
      gma_free(g, p);
    }
    *(mode ? &r.worker_p50_ns : &r.pool_p50_ns) = pct(lat, NW, 0.50);
    *(mode ? &r.worker_p99_ns : &r.pool_p99_ns) = pct(lat, NW, 0.99);
  }
  free(lat);
  /* A batch of 64 x 4 KiB from the pool (bins off: every block from the pool)
   * against 64 single allocations. */
  gma_destroy(g);
  g = make("bins:off");
  size_t sizes[64];
  void *ptrs[64];
  for (int i = 0; i < 64; i++) sizes[i] = 4096;
  gma_alloc_batch(g, 64, sizes, NULL, ptrs); /* warm: the segment exists */
  for (int i = 0; i < 64; i++) gma_free(g, ptrs[i]);
  gma_empty_cache(g);
  gma_alloc(g, 4096, NULL, &p); /* keep one segment */
  double batch[REPS], singles[REPS];
  for (int rep = 0; rep < REPS; rep++) {
    gma_empty_cache(g); /* freed blocks back into the free pool */
    uint64_t t0 = now_ns();
    gma_alloc_batch(g, 64, sizes, NULL, ptrs);
    batch[rep] = (double)(now_ns() - t0);
    for (int i = 0; i < 64; i++) gma_free(g, ptrs[i]);
    gma_empty_cache(g);
    t0 = now_ns();
    for (int i = 0; i < 64; i++) gma_alloc(g, 4096, NULL, &ptrs[i]);
    singles[rep] = (double)(now_ns() - t0);
    for (int i = 0; i < 64; i++) gma_free(g, ptrs[i]);
  }
  gma_free(g, p);
  gma_destroy(g);
  r.at_once_ns = median_d(at_once);
  r.sync_ns = median_d(sync);
  r.batch64_ns = median_d(batch);
  r.singles64_ns = median_d(singles);
  return r;
}

/* ---- 4: memory pressure -------------------------------------------------------- */

enum { PSTAGES = 4, PSTEPS = 50 };
static const size_t stage_mib[PSTAGES] = {6, 7, 8, 9}; /* peak demand: 2 buffers each */

typedef struct pstage {
  gma_t *g;           /* the gma run */
  gma__device_t *dev; /* the direct run */
  gma_stream_t stream;
  int index;
  int failures;
} pstage_t;

static _Atomic uint64_t direct_held, direct_peak;

/* A simulated kernel that keeps its stream (and buffer) busy for 200 us. */
static void hold_kernel(void *arg) {
  (void)arg;
  struct timespec ts = {0, 200000};
  nanosleep(&ts, NULL);
}

static void *pstage_gma(void *arg) {
  pstage_t *st = arg;
  size_t size = stage_mib[st->index] << 20;
  gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
  o.timeout_ns = 30000000000ull;
  gma_future_t *f;
  void *cur = NULL;
  if (gma_alloc_async(st->g, size, st->stream, &o, &f) != GMA_OK) return NULL;
  if (gma_future_wait(f, UINT64_MAX, &cur) != GMA_OK) st->failures++;
  gma_future_release(f);
  for (int i = 0; i < PSTEPS && cur; i++) {
    if (gma_alloc_async(st->g, size, st->stream, &o, &f) != GMA_OK) {
      st->failures++;
      break;
    }
    gma_sim_launch(st->g, st->stream, hold_kernel, NULL);
    gma_free(st->g, cur); /* stream-ordered: usable elsewhere once the kernel is done */
    cur = NULL;
    if (gma_future_wait(f, UINT64_MAX, &cur) != GMA_OK) st->failures++;
    gma_future_release(f);
  }
  if (cur) gma_free(st->g, cur);
  gma_stream_synchronize(st->g, st->stream);
  return NULL;
}

static void note_held(uint64_t held) {
  uint64_t peak = atomic_load(&direct_peak);
  while (held > peak && !atomic_compare_exchange_weak(&direct_peak, &peak, held)) {
  }
}

static void *pstage_direct(void *arg) {
  pstage_t *st = arg;
  gma__device_t *d = st->dev;
  uint64_t size = stage_mib[st->index] << 20;
  uintptr_t cur = 0, next = 0;
  if (d->ops->mem_alloc(d, size, &cur) != GMA_OK) {
    st->failures++;
    return NULL;
  }
  note_held(atomic_fetch_add(&direct_held, size) + size);
  for (int i = 0; i < PSTEPS; i++) {
    /* The next buffer while the current one is still in use: no waiting. */
    if (d->ops->mem_alloc(d, size, &next) != GMA_OK) {
      st->failures++;
      break;
    }
    note_held(atomic_fetch_add(&direct_held, size) + size);
    d->ops->sim_launch(d, st->stream, hold_kernel, NULL);
    d->ops->stream_synchronize(d, st->stream); /* cudaFree waits for the device */
    d->ops->mem_free(d, cur, size);
    atomic_fetch_sub(&direct_held, size);
    cur = next;
  }
  d->ops->stream_synchronize(d, st->stream);
  d->ops->mem_free(d, cur, size);
  atomic_fetch_sub(&direct_held, size);
  return NULL;
}

typedef struct pressure_result {
  uint64_t demand, limit, gma_peak_reserved, gma_waits, direct_failures;
  int gma_failures;
  double gma_ms, direct_ms;
} pressure_result_t;

static pressure_result_t run_pressure(void) {
  pressure_result_t r = {0};
  for (int i = 0; i < PSTAGES; i++) r.demand += 2 * (stage_mib[i] << 20);
  r.limit = r.demand / 10 * 9 / (1u << 20) * (1u << 20);
  char conf[160];
  snprintf(conf, sizeof conf, "sim_capacity:%llu,bins:off,large_segment:2M",
           (unsigned long long)r.limit);
  gma_t *g = make(conf);
  pstage_t st[PSTAGES];
  pthread_t t[PSTAGES];
  uint64_t t0 = now_ns();
  for (int i = 0; i < PSTAGES; i++) {
    st[i] = (pstage_t){.g = g, .index = i};
    gma_stream_create(g, &st[i].stream);
    pthread_create(&t[i], NULL, pstage_gma, &st[i]);
  }
  for (int i = 0; i < PSTAGES; i++) {
    pthread_join(t[i], NULL);
    r.gma_failures += st[i].failures;
  }
  r.gma_ms = (double)(now_ns() - t0) / 1e6;
  gma_stats_t s = GMA_STATS_INIT;
  gma_stats(g, &s);
  r.gma_peak_reserved = s.reserved.peak;
  r.gma_waits = s.num_ooms;
  for (int i = 0; i < PSTAGES; i++) gma_stream_destroy(g, st[i].stream);
  gma_destroy(g);

  gma_config_t c = GMA_CONFIG_INIT;
  c.sim_capacity = r.limit;
  gma__device_t *dev;
  if (gma__sim_create(&c, &dev) != GMA_OK) return r;
  t0 = now_ns();
  for (int i = 0; i < PSTAGES; i++) {
    st[i] = (pstage_t){.dev = dev, .index = i};
    dev->ops->stream_create(dev, &st[i].stream);
    pthread_create(&t[i], NULL, pstage_direct, &st[i]);
  }
  for (int i = 0; i < PSTAGES; i++) {
    pthread_join(t[i], NULL);
    r.direct_failures += (uint64_t)st[i].failures;
  }
  r.direct_ms = (double)(now_ns() - t0) / 1e6;
  for (int i = 0; i < PSTAGES; i++) dev->ops->stream_destroy(dev, st[i].stream);
  dev->ops->destroy(dev);
  return r;
}

/* ---- 5: pipeline one micro-batch ahead ------------------------------------------ */

enum { PL_STAGES = 4, PL_MB = 32, PL_BUFS = 8, PL_REPS = 7 };

typedef struct plstage {
  gma_t *g;
  gma_stream_t stream;
  int index, async;
  uint64_t blocked_ns, submit_ns; /* in the wait (async) or the call (sync); in the submit */
  int ready, failures;            /* waits that found the future complete */
} plstage_t;

static void pl_kernel(void *arg) {
  (void)arg;
  struct timespec ts = {0, 200000};
  nanosleep(&ts, NULL);
}

static void *plstage_main(void *arg) {
  plstage_t *st = arg;
  size_t sizes[PL_BUFS];
  for (int i = 0; i < PL_BUFS; i++) /* 256 KiB - 4 MiB, different per stage */
    sizes[i] = (size_t)(256 + (i * 977 + st->index * 131) % 3840) << 10;
  void *cur[PL_BUFS], *next[PL_BUFS];
  if (gma_alloc_batch(st->g, PL_BUFS, sizes, st->stream, cur) != GMA_OK) {
    st->failures++;
    return NULL;
  }
  for (int k = 0; k < PL_MB; k++) {
    gma_future_t *f = NULL;
    uint64_t t0 = now_ns();
    gma_status_t rc = st->async ? gma_alloc_batch_async(st->g, PL_BUFS, sizes, st->stream, next,
                                                         NULL, &f)
                                : gma_alloc_batch(st->g, PL_BUFS, sizes, st->stream, next);
    uint64_t t1 = now_ns();
    if (rc != GMA_OK) {
      st->failures++;
      break;
    }
    if (st->async) st->submit_ns += t1 - t0; else st->blocked_ns += t1 - t0;
    gma_sim_launch(st->g, st->stream, pl_kernel, NULL); /* the current micro-batch */
    while (now_ns() - t1 < 100000) { /* host work: the framework's side of the step */
    }
    if (st->async) {
      st->ready += gma_future_poll(f) != GMA_PENDING;
      t0 = now_ns();
      if (gma_future_wait(f, UINT64_MAX, NULL) != GMA_OK) st->failures++;
      st->blocked_ns += now_ns() - t0;
      gma_future_release(f);
    }
    for (int i = 0; i < PL_BUFS; i++) gma_free(st->g, cur[i]); /* stream-ordered */
    memcpy(cur, next, sizeof cur);
  }
  for (int i = 0; i < PL_BUFS; i++) gma_free(st->g, cur[i]);
  gma_stream_synchronize(st->g, st->stream);
  return NULL;
}

typedef struct pipeline_result {
  double blocked_ms[2][PL_REPS];  /* [sync, async]: the median stage's total, per run */
  double worst_ms[2][PL_REPS];    /* the slowest stage's */
  double submit_ms[PL_REPS];      /* async: the median stage's total time in submits */
  int ready[PL_REPS], failures;   /* async waits that found the future complete (of 128) */
  double blocked_med[2], worst_med[2], submit_med, ready_med;
} pipeline_result_t;

static int cmp_u64ns(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static void run_pipeline_once(int async, int rep, pipeline_result_t *r) {
  gma_t *g = make(NULL);
  plstage_t st[PL_STAGES];
  pthread_t t[PL_STAGES];
  for (int i = 0; i < PL_STAGES; i++) {
    st[i] = (plstage_t){.g = g, .index = i, .async = async};
    gma_stream_create(g, &st[i].stream);
    pthread_create(&t[i], NULL, plstage_main, &st[i]);
  }
  uint64_t blocked[PL_STAGES], submit[PL_STAGES];
  int ready = 0;
  for (int i = 0; i < PL_STAGES; i++) {
    pthread_join(t[i], NULL);
    blocked[i] = st[i].blocked_ns;
    submit[i] = st[i].submit_ns;
    ready += st[i].ready;
    r->failures += st[i].failures;
    gma_stream_destroy(g, st[i].stream);
  }
  gma_destroy(g);
  qsort(blocked, PL_STAGES, sizeof *blocked, cmp_u64ns);
  qsort(submit, PL_STAGES, sizeof *submit, cmp_u64ns);
  r->blocked_ms[async][rep] = (double)(blocked[1] + blocked[2]) / 2 / 1e6;
  r->worst_ms[async][rep] = (double)blocked[PL_STAGES - 1] / 1e6;
  if (async) {
    r->submit_ms[rep] = (double)(submit[1] + submit[2]) / 2 / 1e6;
    r->ready[rep] = ready;
  }
}

static double median_n(const double *v, int n) {
  double c[PL_REPS];
  memcpy(c, v, (size_t)n * sizeof *c);
  qsort(c, (size_t)n, sizeof *c, cmp_double);
  return n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
}

static pipeline_result_t run_pipeline(void) {
  pipeline_result_t r = {0};
  for (int rep = 0; rep < PL_REPS; rep++) /* interleaved: drift hits both alike */
    for (int async = 0; async < 2; async++) run_pipeline_once(async, rep, &r);
  double ready[PL_REPS];
  for (int rep = 0; rep < PL_REPS; rep++) ready[rep] = r.ready[rep];
  for (int a = 0; a < 2; a++) {
    r.blocked_med[a] = median_n(r.blocked_ms[a], PL_REPS);
    r.worst_med[a] = median_n(r.worst_ms[a], PL_REPS);
  }
  r.submit_med = median_n(r.submit_ms, PL_REPS);
  r.ready_med = median_n(ready, PL_REPS);
  return r;
}

int main(int argc, char **argv) {
  const char *json = "bench_worker.json";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else {
      fprintf(stderr, "usage: gma-bench-worker [--json PATH]\n");
      return 2;
    }
  }
  printf("gma-bench-worker: gma %s, simulated device\n\n", gma_version());
  double base = idle_cpu(NULL, 0);
  double idle_default = idle_cpu(NULL, 1);
  double idle_fast = idle_cpu("trim_interval_ms:10", 1);
  printf("1. CPU time over 1 s of idleness (getrusage, whole process; goal <= 1 ms above baseline)\n");
  printf("%-44s %10s %12s\n", "", "CPU ms", "above base");
  printf("%-44s %10.3f %12s\n", "no allocator (baseline)", base, "-");
  printf("%-44s %10.3f %12.3f\n", "allocator, worker tick 1000 ms (default)", idle_default,
         idle_default - base);
  printf("%-44s %10.3f %12.3f\n", "allocator, worker tick 10 ms", idle_fast, idle_fast - base);

  int intervals[3] = {50, 200, 1000};
  double took[3];
  printf("\n2. timed trim: 300 MiB freed, time until reserved <= release_threshold (8 MiB)\n");
  printf("%-20s %12s %16s\n", "trim interval ms", "took ms", "took / interval");
  for (int i = 0; i < 3; i++) {
    took[i] = trim_ms(intervals[i]);
    printf("%-20d %12.1f %15.2fx\n", intervals[i], took[i], took[i] / intervals[i]);
  }

  async_result_t a = run_async();
  printf("\n3. async allocation and batches (medians; goal in brackets)\n");
  printf("%-52s %12s\n", "", "ns");
  printf("%-52s %12.1f\n", "future ready on a bin hit: gma_alloc_async [100]", a.submit_ns);
  printf("%-52s %12.1f\n", "  gma_future_wait + gma_future_release on it", a.wait_release_ns);
  printf("%-52s %12.1f\n", "  gma_future_take on it", a.take_ns);
  printf("%-52s %12.1f\n", "  a bin hit alone (gma_alloc), timed the same way", a.bin_hit_ns);
  printf("%-52s %12.1f\n", "  full cycle with wait, release and free", a.at_once_ns);
  printf("%-52s %12.1f\n", "  full cycle with gma_future_take and free", a.take_cycle_ns);
  printf("%-52s %12.1f\n", "  the same with gma_alloc + gma_free (baseline)", a.sync_ns);
  printf("%-52s %12llu\n", "8 MiB future from the pool, submit to ready, p50",
         (unsigned long long)a.pool_p50_ns);
  printf("%-52s %12llu\n", "  p99", (unsigned long long)a.pool_p99_ns);
  printf("%-52s %12llu\n", "worker-served future, submit to ready, p50 [20000]",
         (unsigned long long)a.worker_p50_ns);
  printf("%-52s %12llu\n", "worker-served future, submit to ready, p99 [200000]",
         (unsigned long long)a.worker_p99_ns);
  printf("%-52s %12.1f\n", "batch of 64 x 4 KiB from the pool [5000]", a.batch64_ns);
  printf("%-52s %12.1f\n", "  64 single gma_alloc from the pool (baseline)", a.singles64_ns);
  printf("   (full cycle: gma_alloc_async, gma_future_wait, gma_future_release and the\n"
         "    gma_free that refills the bin; 8 MiB from the pool: served on the submitting\n"
         "    thread; worker-served: the same with options.worker_only, one at a time)\n");

  pressure_result_t pr = run_pressure();
  printf("\n4. memory pressure: 4 stages x %d steps, device and limit %.0f MiB = 90%% of the "
         "peak demand %.0f MiB\n", PSTEPS, (double)pr.limit / 1048576, (double)pr.demand / 1048576);
  printf("%-36s %10s %14s %10s\n", "", "ms", "peak MiB", "failed");
  printf("%-36s %10.1f %14.1f %10d\n", "gma (async, waits for frees)", pr.gma_ms,
         (double)pr.gma_peak_reserved / 1048576, pr.gma_failures);
  printf("%-36s %10.1f %14.1f %10llu\n", "direct device allocation", pr.direct_ms,
         (double)atomic_load(&direct_peak) / 1048576, (unsigned long long)pr.direct_failures);
  printf("   gma: %s, %llu allocation attempts found no memory and waited; direct: %s\n",
         pr.gma_failures ? "FAILED" : "completed", (unsigned long long)pr.gma_waits,
         pr.direct_failures ? "stages failed with out-of-memory" : "completed");

  pipeline_result_t pl = run_pipeline();
  printf("\n5. pipeline one micro-batch ahead: %d stages on %d streams, %d micro-batches of %d "
         "buffers,\n   200 us kernel and 100 us of host work each (medians of %d runs, "
         "interleaved)\n", PL_STAGES, PL_STAGES, PL_MB, PL_BUFS, PL_REPS);
  printf("%-44s %12s %12s %12s %10s\n", "", "blocked ms", "worst stage", "submits ms",
         "ready");
  printf("%-44s %12.3f %12.3f %12s %10s\n", "gma_alloc_batch (the call itself)",
         pl.blocked_med[0], pl.worst_med[0], "-", "-");
  printf("%-44s %12.3f %12.3f %12.3f %6.0f/%d\n", "gma_alloc_batch_async + gma_future_wait",
         pl.blocked_med[1], pl.worst_med[1], pl.submit_med, pl.ready_med,
         PL_STAGES * PL_MB);
  printf("   (blocked: a stage's total over its %d micro-batches, the median stage; worst: the "
         "slowest stage;\n    ready: waits that found the future complete, of %d; async/sync "
         "blocked: %.1fx%s)\n", PL_MB, PL_STAGES * PL_MB,
         pl.blocked_med[0] > 0 ? pl.blocked_med[1] / pl.blocked_med[0] : 0.0,
         pl.failures ? "; FAILURES" : "");

  FILE *f = fopen(json, "w");
  if (!f) {
    perror(json);
    return 1;
  }
  fprintf(f, "{\"benchmark\": \"gma-bench-worker\", \"gma_version\": \"%s\",\n", gma_version());
  fprintf(f, " \"idle_cpu_ms_per_s\": {\"baseline\": %.3f, \"worker_1000ms\": %.3f, "
             "\"worker_10ms\": %.3f},\n", base, idle_default, idle_fast);
  fprintf(f, " \"timed_trim_ms\": [");
  for (int i = 0; i < 3; i++)
    fprintf(f, "%s{\"interval_ms\": %d, \"took_ms\": %.1f}", i ? ", " : "", intervals[i], took[i]);
  fprintf(f, "],\n \"async_ns\": {\"submit_at_once\": %.1f, \"wait_release_ready\": %.1f, "
             "\"take_ready\": %.1f, \"bin_hit\": %.1f, \"take_cycle\": %.1f, "
             "\"at_once_cycle\": %.1f, \"sync_cycle\": %.1f, "
             "\"pool_p50\": %llu, \"pool_p99\": %llu, "
             "\"worker_p50\": %llu, \"worker_p99\": %llu, \"batch64\": %.1f, "
             "\"singles64\": %.1f},\n \"pressure\": {\"demand\": %llu, \"limit\": %llu, "
             "\"gma_ms\": %.1f, \"gma_peak_reserved\": %llu, \"gma_failures\": %d, "
             "\"gma_waits\": %llu, \"direct_ms\": %.1f, \"direct_failures\": %llu},\n",
          a.submit_ns, a.wait_release_ns, a.take_ns, a.bin_hit_ns, a.take_cycle_ns, a.at_once_ns,
          a.sync_ns, (unsigned long long)a.pool_p50_ns, (unsigned long long)a.pool_p99_ns,
          (unsigned long long)a.worker_p50_ns,
          (unsigned long long)a.worker_p99_ns, a.batch64_ns, a.singles64_ns,
          (unsigned long long)pr.demand, (unsigned long long)pr.limit, pr.gma_ms,
          (unsigned long long)pr.gma_peak_reserved, pr.gma_failures,
          (unsigned long long)pr.gma_waits, pr.direct_ms, (unsigned long long)pr.direct_failures);
  fprintf(f, " \"pipeline\": {\"stages\": %d, \"micro_batches\": %d, \"buffers\": %d, "
             "\"sync_blocked_ms\": %.3f, \"sync_worst_ms\": %.3f, \"async_blocked_ms\": %.3f, "
             "\"async_worst_ms\": %.3f, \"async_submit_ms\": %.3f, \"async_ready\": %.0f, "
             "\"failures\": %d}}\n",
          PL_STAGES, PL_MB, PL_BUFS, pl.blocked_med[0], pl.worst_med[0], pl.blocked_med[1],
          pl.worst_med[1], pl.submit_med, pl.ready_med, pl.failures);
  fclose(f);
  printf("\nwrote %s\n", json);
  return 0;
}
