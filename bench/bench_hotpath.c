/* gma-bench-hotpath: the cost of gma's hot path, the lock-free per-stream
 * bins, against baselines measured in the same process:
 *
 *  1. one alloc+free pair of 4 KiB on one stream, always a cache hit, one
 *     thread: median and p99 ns per pair, with glibc malloc+free of the same
 *     size timed alike (interleaved chunk by chunk) as the reference line;
 *  2. the same with bins off (config "bins:off"): every call takes the pool's
 *     lock, which is the path the bins exist to avoid;
 *  3. scaling: two threads, each on its own stream, against one thread:
 *     pairs per second and the ratio (the goal is >= 1.8x on 2 cores); bins
 *     off is measured too, as the baseline the bins improve on;
 *  4. a training-loop pattern: 4 streams, identical iterations of about 30
 *     buffers of mixed sizes spread over the streams, some used on a second
 *     stream (gma_record_stream), all freed; device allocations after the
 *     first iteration (goal 0), iterations per second and peak reserved, with
 *     bins on and off (side by side, chunks of 100 iterations interleaved).
 *
 * How pairs are timed: on x86 the time-stamp counter is read (lfence; rdtsc
 * before, rdtscp; lfence after) and converted to ns with a rate calibrated
 * against CLOCK_MONOTONIC; elsewhere clock_gettime is used. The timer's own
 * cost is the median of the same measurement around nothing, subtracted
 * (and printed). The p99 comes from single pairs, each timed on its own.
 * The counter may advance in coarse steps (10 ns on the 2-core CI VM, which
 * the bench detects and prints), which would make a single-pair median too
 * coarse for a 30 ns operation: the median comes from groups of 8 pairs
 * between two timer reads, divided by 8. The batch column divides one
 * clock_gettime interval by the 1000 pairs of a batch, with no per-pair
 * timer at all, as a cross-check of the median.
 *
 * It checks statuses only: correctness belongs to the tests. Options:
 * --samples N (timed pairs per side in 1 and 2), --duration-ms N (per
 * scaling measurement), --reps N, --iterations N (training loop), --seed N,
 * --json PATH (default bench_hotpath.json). */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BENCH_NAME "gma-bench-hotpath"
#include "benchkit.h"
#include "gma.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define BENCH_TIMER "tsc (lfence;rdtsc / rdtscp;lfence)"
static inline uint64_t tick_begin(void) {
  _mm_lfence();
  uint64_t t = __rdtsc();
  _mm_lfence();
  return t;
}
static inline uint64_t tick_end(void) {
  unsigned aux;
  uint64_t t = __rdtscp(&aux);
  _mm_lfence();
  return t;
}
#else
#define BENCH_TIMER "clock_gettime(CLOCK_MONOTONIC)"
static inline uint64_t tick_begin(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#define tick_end tick_begin
#endif

typedef struct options {
  int samples;       /* timed pairs per side, scenarios 1 and 2 */
  int duration_ms;   /* one scaling measurement */
  int reps;          /* scaling measurements per configuration */
  int iterations;    /* training-loop iterations per configuration */
  uint64_t seed;
  const char *json_path;
} options_t;

static double ns_per_tick = 1.0;
static uint32_t tick_step = UINT32_MAX; /* smallest gap between distinct samples, in ticks */

#include "rng.h" /* rnd(): xorshift64* */

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted values. */
static uint32_t pct_u32(const uint32_t *v, int n, int p) {
  long rank = ((long)p * n + 99) / 100;
  return v[rank < 1 ? 0 : rank - 1];
}
static double median_d(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void calibrate(void) {
#if defined(__x86_64__) || defined(__i386__)
  uint64_t n0 = now_ns(), t0 = __rdtsc();
  while (now_ns() - n0 < 50000000u) {
  }
  uint64_t n1 = now_ns(), t1 = __rdtsc();
  ns_per_tick = (double)(n1 - n0) / (double)(t1 - t0);
#endif
}

static gma_t *make_allocator(const char *conf) {
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1; /* the run is described by its options alone */
  if (conf) OK(gma_config_parse(&c, conf));
  gma_t *g = NULL;
  OK(gma_create(&c, &g));
  return g;
}

/* ---- 1 and 2: single-pair latency ---------------------------------------------- */

typedef struct latency {
  const char *name;
  uint32_t *ticks;   /* one per single timed pair (for the p99) */
  uint32_t *ticks8;  /* one per timed group of GROUP pairs (for the median) */
  int n, n8;
  double median_ns, p99_ns, batch_ns; /* timer cost subtracted from median and p99 */
} latency_t;

/* What the side under test does for one pair. */
typedef struct pair_side {
  gma_t *g; /* NULL: glibc malloc/free */
  gma_stream_t stream;
  size_t size;
  int mark_every; /* plan:on: pairs per iteration (gma_iteration_mark after each) */
  int pairs;      /* since the last mark */
} pair_side_t;

static void *volatile sink; /* keeps the compiler from eliding malloc+free */

static inline void one_pair(pair_side_t *s) {
  if (s->g) {
    void *p;
    gma_status_t st = gma_alloc(s->g, s->size, s->stream, &p);
    if (st != GMA_OK) die("gma_alloc", st);
    st = gma_free(s->g, p);
    if (st != GMA_OK) die("gma_free", st);
    if (s->mark_every && ++s->pairs == s->mark_every) {
      s->pairs = 0;
      st = gma_iteration_mark(s->g);
      if (st != GMA_OK) die("gma_iteration_mark", st);
    }
  } else {
    void *p = malloc(s->size);
    if (!p) die("malloc", GMA_ERR_OOM);
    sink = p;
    free(p);
  }
}

static void time_chunk(pair_side_t *s, latency_t *l, int n) {
  for (int i = 0; i < n; i++) {
    uint64_t t0 = tick_begin();
    one_pair(s);
    uint64_t t1 = tick_end();
    uint64_t d = t1 - t0;
    l->ticks[l->n++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
  }
}

/* GROUP pairs between two timer reads: the counter's coarse steps and the
 * timer's cost are spread over GROUP pairs, so the median is fine-grained. */
enum { GROUP = 8 };

static void time_groups(pair_side_t *s, latency_t *l, int n) {
  for (int i = 0; i < n; i++) {
    uint64_t t0 = tick_begin();
    for (int j = 0; j < GROUP; j++) one_pair(s);
    uint64_t t1 = tick_end();
    uint64_t d = t1 - t0;
    l->ticks8[l->n8++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
  }
}

static double time_batch_ns(pair_side_t *s, int n) {
  uint64_t t0 = now_ns();
  for (int i = 0; i < n; i++) one_pair(s);
  return (double)(now_ns() - t0) / n;
}

static double timer_overhead_ticks(int n) {
  uint32_t *v = malloc((size_t)n * sizeof *v);
  if (!v) die("out of host memory", GMA_ERR_OOM);
  for (int i = 0; i < n; i++) {
    uint64_t t0 = tick_begin();
    uint64_t t1 = tick_end();
    v[i] = (uint32_t)(t1 - t0);
  }
  qsort(v, (size_t)n, sizeof *v, cmp_u32);
  double m = v[n / 2];
  free(v);
  return m;
}

static void summarize_latency(latency_t *l, double overhead_ticks, double *batches, int nb) {
  qsort(l->ticks, (size_t)l->n, sizeof *l->ticks, cmp_u32);
  /* Some machines (virtual ones, some AMD parts) advance the counter in
   * steps of many ticks: the smallest gap between distinct samples shows
   * the step that single-pair numbers are quantized to. */
  for (int i = 1; i < l->n; i++)
    if (l->ticks[i] != l->ticks[i - 1] && l->ticks[i] - l->ticks[i - 1] < tick_step)
      tick_step = l->ticks[i] - l->ticks[i - 1];
  qsort(l->ticks8, (size_t)l->n8, sizeof *l->ticks8, cmp_u32);
  l->median_ns = ((double)pct_u32(l->ticks8, l->n8, 50) - overhead_ticks) / GROUP * ns_per_tick;
  l->p99_ns = ((double)pct_u32(l->ticks, l->n, 99) - overhead_ticks) * ns_per_tick;
  l->batch_ns = median_d(batches, nb);
}

/* Times sides[] against each other, interleaved chunk by chunk so drift in
 * the machine (frequency, neighbours) hits all sides alike. */
static void run_latency(const options_t *o, pair_side_t *sides, latency_t *out, int nsides,
                        double overhead_ticks) {
  enum { CHUNKS = 20, BATCH = 1000 };
  int per_chunk = o->samples / CHUNKS > 0 ? o->samples / CHUNKS : 1;
  double batches[CHUNKS][8]; /* nsides <= 8 */
  for (int s = 0; s < nsides; s++) {
    out[s].ticks = malloc((size_t)per_chunk * CHUNKS * sizeof *out[s].ticks);
    out[s].ticks8 = malloc((size_t)(per_chunk / GROUP + 1) * CHUNKS * sizeof *out[s].ticks8);
    if (!out[s].ticks || !out[s].ticks8) die("out of host memory", GMA_ERR_OOM);
    out[s].n = out[s].n8 = 0;
    for (int i = 0; i < 10000; i++) one_pair(&sides[s]); /* warm-up: caches filled */
  }
  for (int c = 0; c < CHUNKS; c++)
    for (int s = 0; s < nsides; s++) {
      time_chunk(&sides[s], &out[s], per_chunk);
      time_groups(&sides[s], &out[s], per_chunk / GROUP + 1);
      batches[c][s] = time_batch_ns(&sides[s], BATCH);
    }
  for (int s = 0; s < nsides; s++) {
    double b[CHUNKS];
    for (int c = 0; c < CHUNKS; c++) b[c] = batches[c][s];
    summarize_latency(&out[s], overhead_ticks, b, CHUNKS);
  }
}

/* ---- 3: scaling over threads ------------------------------------------------------- */

typedef struct scaler {
  gma_t *g;
  gma_stream_t stream;
  size_t size;
  atomic_int *go, *stop;
  uint64_t pairs;
} scaler_t;

static void *scaler_main(void *arg) {
  scaler_t *s = arg;
  while (!atomic_load_explicit(s->go, memory_order_acquire)) {
  }
  uint64_t n = 0;
  while (!atomic_load_explicit(s->stop, memory_order_relaxed)) {
    for (int i = 0; !s->g && i < 256; i++) { /* reference rows: no allocator */
      void *p = s->size ? malloc(s->size) : NULL;
      __asm__ volatile("" : : "r"(p) : "memory"); /* keep the pair */
      free(p);
    }
    for (int i = 0; s->g && i < 256; i++) {
      void *p;
      gma_status_t st = gma_alloc(s->g, s->size, s->stream, &p);
      if (st != GMA_OK) die("gma_alloc", st);
      st = gma_free(s->g, p);
      if (st != GMA_OK) die("gma_free", st);
    }
    n += 256;
  }
  s->pairs = n;
  return NULL;
}

/* Pairs per second of nthreads threads, thread i on streams[i]. */
static double measure_throughput(gma_t *g, gma_stream_t *streams, int nthreads, size_t size,
                                 int duration_ms) {
  atomic_int go = 0, stop = 0;
  scaler_t sc[8];
  pthread_t th[8];
  for (int i = 0; i < nthreads; i++) {
    sc[i] = (scaler_t){g, streams[i], size, &go, &stop, 0};
    if (pthread_create(&th[i], NULL, scaler_main, &sc[i]) != 0) die("pthread_create", GMA_ERR_INTERNAL);
  }
  uint64_t t0 = now_ns();
  atomic_store_explicit(&go, 1, memory_order_release);
  struct timespec d = {duration_ms / 1000, (long)(duration_ms % 1000) * 1000000L};
  nanosleep(&d, NULL);
  atomic_store(&stop, 1);
  uint64_t total = 0;
  for (int i = 0; i < nthreads; i++) {
    pthread_join(th[i], NULL);
    total += sc[i].pairs;
  }
  double secs = (double)(now_ns() - t0) / 1e9;
  return (double)total / secs;
}

typedef struct scaling {
  const char *name;
  double one, two, ratio; /* medians of pairs/s; two / one */
} scaling_t;

/* conf "glibc" times malloc+free pairs instead: the scaling this machine
 * gives code that shares nothing gma-specific (on a 2-vCPU VM even that
 * stays below 2x), measured in the same run as a reference. */
static void run_scaling(const options_t *o, const char *conf, scaling_t *r) {
  bool glibc = conf && strcmp(conf, "glibc") == 0;
  gma_t *g = glibc ? NULL : make_allocator(conf);
  gma_stream_t streams[2] = {NULL, NULL};
  for (int i = 0; g && i < 2; i++) OK(gma_stream_create(g, &streams[i]));
  double *one = calloc((size_t)o->reps, sizeof *one), *two = calloc((size_t)o->reps, sizeof *two);
  if (!one || !two) die("out of host memory", GMA_ERR_OOM);
  measure_throughput(g, streams, 2, 4 * KiB, 50); /* warm-up: both bins filled */
  for (int rep = 0; rep < o->reps; rep++) { /* interleaved, see run_latency */
    one[rep] = measure_throughput(g, streams, 1, 4 * KiB, o->duration_ms);
    two[rep] = measure_throughput(g, streams, 2, 4 * KiB, o->duration_ms);
  }
  r->one = median_d(one, o->reps);
  r->two = median_d(two, o->reps);
  r->ratio = r->two / r->one;
  free(one);
  free(two);
  for (int i = 0; g && i < 2; i++) OK(gma_stream_destroy(g, streams[i]));
  if (g) OK(gma_destroy(g));
}

/* ---- 4: training loop ----------------------------------------------------------------- */

enum { TL_STREAMS = 4, TL_BUFS = 30 };

typedef struct training {
  const char *name;
  double iters_per_s;      /* median over chunks of iterations */
  uint64_t device_allocs_first, device_allocs_after; /* in the first iteration, after it */
  uint64_t reserved_peak, hits_bin, num_allocs;
  uint64_t plan_hits, reserved_after_plan; /* plan:on: planned hits; reserved at the end */
  int iterations;
} training_t;

typedef struct tl_buf {
  size_t size;
  int stream;   /* allocated on */
  int recorded; /* -1, or the stream that also uses it */
} tl_buf_t;

/* A step of a model with 6 layers on 4 streams (compute, two data streams,
 * a communication stream): per layer an activation (mostly 2-12 MiB, some
 * above bin_max), a weight gradient (256 KiB - 4 MiB), a small bias-sized
 * buffer and a workspace; gradients are also used by the communication
 * stream (record_stream), as an all-reduce would. */
static void training_plan(uint64_t seed, tl_buf_t *plan) {
  uint64_t rng = seed * 0x9e3779b97f4a7c15ull | 1;
  for (int i = 0; i < TL_BUFS; i++) {
    int kind = i % 5;
    size_t size;
    switch (kind) {
      case 0: size = 2 * MiB + (size_t)(rnd(&rng) % (10 * MiB)); break; /* activation */
      case 1: size = 256 * KiB + (size_t)(rnd(&rng) % (4 * MiB - 256 * KiB)); break; /* grad */
      case 2: size = 512 + (size_t)(rnd(&rng) % (16 * KiB)); break; /* bias, norm stats */
      case 3: size = 64 * KiB + (size_t)(rnd(&rng) % MiB); break; /* workspace */
      default: size = 1 * MiB + (size_t)(rnd(&rng) % (2 * MiB)); break; /* attention scores */
    }
    plan[i].size = size;
    plan[i].stream = kind == 3 ? 1 + (int)(rnd(&rng) % 2) : 0;
    plan[i].recorded = kind == 1 ? 3 : (kind == 4 && i % 2 ? 2 : -1);
  }
}

static void training_iteration(gma_t *g, gma_stream_t *streams, const tl_buf_t *plan) {
  void *p[TL_BUFS];
  for (int i = 0; i < TL_BUFS; i++) {
    OK(gma_alloc(g, plan[i].size, streams[plan[i].stream], &p[i]));
    if (plan[i].recorded >= 0) OK(gma_record_stream(g, p[i], streams[plan[i].recorded]));
    /* The forward pass frees workspaces as soon as a layer is done. */
    if (i % 5 == 3) {
      OK(gma_free(g, p[i]));
      p[i] = NULL;
    }
  }
  for (int i = TL_BUFS; i-- > 0;) /* the backward pass frees in reverse */
    if (p[i]) OK(gma_free(g, p[i]));
}

/* Both configurations side by side, 100-iteration chunks interleaved (as in
 * run_latency), so that drift in the machine hits both alike: on the 2-core
 * VM whole minutes run at half speed, and timed one after the other the two
 * sides could land in different speeds. */
enum { TL_CONFIGS = 3 };

static void run_training(const options_t *o, const char *const conf[TL_CONFIGS],
                         training_t r[TL_CONFIGS]) {
  gma_t *g[TL_CONFIGS];
  gma_stream_t streams[TL_CONFIGS][TL_STREAMS];
  tl_buf_t plan[TL_BUFS];
  training_plan(o->seed, plan);
  gma_stats_t s = {.size = sizeof s};
  for (int k = 0; k < TL_CONFIGS; k++) {
    g[k] = make_allocator(conf[k]);
    for (int i = 0; i < TL_STREAMS; i++) OK(gma_stream_create(g[k], &streams[k][i]));
    training_iteration(g[k], streams[k], plan);
    OK(gma_iteration_mark(g[k]));
    OK(gma_stats(g[k], &s));
    r[k].device_allocs_first = s.num_device_allocs;
  }
  enum { CHUNK = 100 };
  int nchunks = o->iterations / CHUNK > 0 ? o->iterations / CHUNK : 1;
  double *rate[TL_CONFIGS];
  for (int k = 0; k < TL_CONFIGS; k++)
    if (!(rate[k] = calloc((size_t)nchunks, sizeof(double)))) die("out of host memory", GMA_ERR_OOM);
  /* Every configuration marks its iterations (a no-op without plan:on). */
  for (int c = 0; c < nchunks; c++)
    for (int k = 0; k < TL_CONFIGS; k++) {
      uint64_t t0 = now_ns();
      for (int i = 0; i < CHUNK; i++) {
        training_iteration(g[k], streams[k], plan);
        OK(gma_iteration_mark(g[k]));
      }
      rate[k][c] = CHUNK / ((double)(now_ns() - t0) / 1e9);
    }
  for (int k = 0; k < TL_CONFIGS; k++) {
    r[k].iterations = 1 + nchunks * CHUNK;
    r[k].iters_per_s = median_d(rate[k], nchunks);
    free(rate[k]);
    OK(gma_stats(g[k], &s));
    r[k].device_allocs_after = s.num_device_allocs - r[k].device_allocs_first;
    r[k].reserved_peak = s.reserved.peak;
    r[k].hits_bin = s.hits_bin;
    r[k].num_allocs = s.num_allocs;
    r[k].plan_hits = s.plan_hits;
    r[k].reserved_after_plan = s.reserved.current;
    for (int i = 0; i < TL_STREAMS; i++) OK(gma_stream_destroy(g[k], streams[k][i]));
    OK(gma_destroy(g[k]));
  }
}

/* ---- 5: trace recording ------------------------------------------------------------------- */

/* The cost of trace recording per event: 4 KiB pairs (two events each) on
 * one allocator with the trace off and on, interleaved batches, medians. */
typedef struct trace_cost {
  double off_ns, on_ns, per_event_ns; /* per pair, per pair, per event */
  uint64_t rows;
} trace_cost_t;

static double pair_batch_ns(gma_t *g, int n) {
  void *p;
  uint64_t t0 = now_ns();
  for (int i = 0; i < n; i++) {
    OK(gma_alloc(g, 4 * KiB, NULL, &p));
    OK(gma_free(g, p));
  }
  return (double)(now_ns() - t0) / n;
}

static void run_trace_cost(trace_cost_t *r) {
  enum { REPS = 9, N = 20000 };
  char path[64];
  snprintf(path, sizeof path, "/tmp/gma-bench-trace-%d.csv", (int)getpid());
  gma_t *g = make_allocator(NULL);
  double off[REPS], on[REPS];
  pair_batch_ns(g, N); /* warm */
  for (int i = 0; i < REPS; i++) {
    off[i] = pair_batch_ns(g, N);
    OK(gma_trace_start(g, path));
    on[i] = pair_batch_ns(g, N);
    OK(gma_trace_stop(g)); /* writes what is buffered: part of the cost */
    r->rows += 2 * N;
  }
  OK(gma_destroy(g));
  unlink(path);
  qsort(off, REPS, sizeof *off, cmp_double);
  qsort(on, REPS, sizeof *on, cmp_double);
  r->off_ns = off[REPS / 2];
  r->on_ns = on[REPS / 2];
  r->per_event_ns = (r->on_ns - r->off_ns) / 2;
}

/* ---- output ------------------------------------------------------------------------------ */

static void write_json(const options_t *o, double overhead_ns, const trace_cost_t *tc,
                       const latency_t *lat, int nlat,
                       const scaling_t *sc, int nsc, const training_t *tr, int ntr) {
  FILE *f = fopen(o->json_path, "w");
  if (!f) {
    perror(o->json_path);
    exit(1);
  }
  fprintf(f, "{\n  \"benchmark\": \"gma-bench-hotpath\",\n");
  fprintf(f,
          "  \"config\": {\"gma_version\": \"%s\", \"build_type\": \"%s\", \"gma_debug\": %d, "
          "\"device\": \"sim\", \"timer\": \"%s\", \"ns_per_tick\": %.6f, "
          "\"timer_resolution_ns\": %.1f, \"timer_overhead_ns\": %.1f, "
          "\"median_from_groups_of_pairs\": %d, \"p99_from\": \"single pairs\", \"samples\": %d, \"duration_ms\": %d, \"reps\": %d, "
          "\"iterations\": %d, \"seed\": %" PRIu64 "},\n",
          gma_version(), GMA_BENCH_BUILD_TYPE, GMA_DEBUG, BENCH_TIMER, ns_per_tick,
          (double)tick_step * ns_per_tick, overhead_ns, (int)GROUP,
          o->samples, o->duration_ms, o->reps, o->iterations, o->seed);
  fprintf(f, "  \"latency_4KiB_pair\": [\n");
  for (int i = 0; i < nlat; i++)
    fprintf(f,
            "    {\"name\": \"%s\", \"median_ns\": %.1f, \"p99_ns\": %.1f, "
            "\"batch_median_ns\": %.1f, \"ratio_to_malloc\": %.2f, \"samples\": %d}%s\n",
            lat[i].name, lat[i].median_ns, lat[i].p99_ns, lat[i].batch_ns,
            lat[i].median_ns / lat[2].median_ns, lat[i].n, i + 1 < nlat ? "," : "");
  fprintf(f, "  ],\n  \"scaling_4KiB_pairs_per_s\": [\n");
  for (int i = 0; i < nsc; i++)
    fprintf(f,
            "    {\"name\": \"%s\", \"one_thread\": %.0f, \"two_threads_two_streams\": %.0f, "
            "\"ratio\": %.3f, \"goal_ratio\": 1.8}%s\n",
            sc[i].name, sc[i].one, sc[i].two, sc[i].ratio, i + 1 < nsc ? "," : "");
  fprintf(f, "  ],\n  \"training_loop\": [\n");
  for (int i = 0; i < ntr; i++)
    fprintf(f,
            "    {\"name\": \"%s\", \"streams\": %d, \"buffers_per_iteration\": %d, "
            "\"iterations\": %d, \"iterations_per_s\": %.0f, \"device_allocs_first_iteration\": "
            "%" PRIu64 ", \"device_allocs_after_first\": %" PRIu64 ", \"goal_device_allocs_after_first\": 0, "
            "\"reserved_peak\": %" PRIu64 ", \"hits_bin\": %" PRIu64 ", \"num_allocs\": %" PRIu64
            ", \"plan_hits\": %" PRIu64 ", \"reserved_at_end\": %" PRIu64 "}%s\n",
            tr[i].name, TL_STREAMS, TL_BUFS, tr[i].iterations, tr[i].iters_per_s,
            tr[i].device_allocs_first, tr[i].device_allocs_after, tr[i].reserved_peak,
            tr[i].hits_bin, tr[i].num_allocs, tr[i].plan_hits, tr[i].reserved_after_plan,
            i + 1 < ntr ? "," : "");
  fprintf(f, "  ],\n  \"trace_recording\": {\"pair_ns_off\": %.1f, \"pair_ns_on\": %.1f, "
             "\"ns_per_event\": %.1f}\n}\n",
          tc->off_ns, tc->on_ns, tc->per_event_ns);
  fclose(f);
}

static void usage(void) {
  fprintf(stderr,
          "usage: gma-bench-hotpath [--samples N] [--duration-ms N] [--reps N] [--iterations N]\n"
          "                         [--seed N] [--json PATH]\n"
          "  --samples N      timed pairs per side for the 4 KiB latency (default 1000000)\n"
          "  --duration-ms N  length of one scaling measurement (default 300)\n"
          "  --reps N         scaling measurements per configuration (default 5)\n"
          "  --iterations N   training-loop iterations per configuration (default 3000)\n"
          "  --seed N         seed of the training loop's sizes (default 42)\n"
          "  --json PATH      where to write the results (default bench_hotpath.json)\n");
  exit(2);
}

static long parse_num(const char *s) {
  char *end;
  long v = strtol(s, &end, 0);
  if (*s == '\0' || *end != '\0' || v < 1) usage();
  return v;
}

int main(int argc, char **argv) {
  options_t o = {.samples = 1000000, .duration_ms = 300, .reps = 5, .iterations = 3000,
                 .seed = 42, .json_path = "bench_hotpath.json"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (i + 1 >= argc) usage();
    if (strcmp(a, "--samples") == 0)
      o.samples = (int)parse_num(argv[++i]);
    else if (strcmp(a, "--duration-ms") == 0)
      o.duration_ms = (int)parse_num(argv[++i]);
    else if (strcmp(a, "--reps") == 0)
      o.reps = (int)parse_num(argv[++i]);
    else if (strcmp(a, "--iterations") == 0)
      o.iterations = (int)parse_num(argv[++i]);
    else if (strcmp(a, "--seed") == 0)
      o.seed = (uint64_t)parse_num(argv[++i]);
    else if (strcmp(a, "--json") == 0)
      o.json_path = argv[++i];
    else
      usage();
  }

  calibrate();
  double overhead_ticks = timer_overhead_ticks(100000);
  double overhead_ns = overhead_ticks * ns_per_tick;
  printf("gma-bench-hotpath: gma %s, %s build (GMA_DEBUG=%d), simulated device\n", gma_version(),
         GMA_BENCH_BUILD_TYPE, GMA_DEBUG);
  printf("  timer %s, %.3f ns/tick, timer cost %.1f ns (subtracted from median and p99)\n",
         BENCH_TIMER, ns_per_tick, overhead_ns);
  if (GMA_DEBUG > 0)
    printf("  note: GMA_DEBUG>0 adds validation to every call; use a Release build for numbers "
           "to quote\n");

  /* 1 and 2: latency of one 4 KiB pair; the allocators live side by side. */
  /* The planned side marks an iteration every 64 pairs: its warm-up learns
   * and places the plan, and the timed pairs are planned hits. */
  gma_t *g_bins = make_allocator(NULL), *g_pool = make_allocator("bins:off");
  gma_t *g_plan = make_allocator("plan:on");
  gma_stream_t s_bins, s_pool, s_plan;
  OK(gma_stream_create(g_bins, &s_bins));
  OK(gma_stream_create(g_pool, &s_pool));
  OK(gma_stream_create(g_plan, &s_plan));
  pair_side_t sides[4] = {{g_bins, s_bins, 4 * KiB, 0, 0},
                          {g_pool, s_pool, 4 * KiB, 0, 0},
                          {NULL, NULL, 4 * KiB, 0, 0},
                          {g_plan, s_plan, 4 * KiB, 64, 0}};
  latency_t lat[4] = {{.name = "gma, bins (lock-free)"}, {.name = "gma, bins:off (pool lock)"},
                      {.name = "glibc malloc+free"}, {.name = "gma, plan:on (planned hit)"}};
  run_latency(&o, sides, lat, 4, overhead_ticks);
  gma_stats_t hs = {.size = sizeof hs};
  OK(gma_stats(g_bins, &hs));
  double bin_share = hs.num_allocs ? (double)hs.hits_bin / (double)hs.num_allocs : 0;
  OK(gma_stats(g_plan, &hs));
  double plan_share = hs.num_allocs ? (double)hs.plan_hits / (double)hs.num_allocs : 0;
  OK(gma_stream_destroy(g_bins, s_bins));
  OK(gma_stream_destroy(g_pool, s_pool));
  OK(gma_stream_destroy(g_plan, s_plan));
  OK(gma_destroy(g_bins));
  OK(gma_destroy(g_pool));
  OK(gma_destroy(g_plan));

  /* 3: scaling. */
  scaling_t sc[3] = {{.name = "gma, bins"}, {.name = "gma, bins:off"},
                     {.name = "glibc malloc+free (reference)"}};
  run_scaling(&o, NULL, &sc[0]);
  run_scaling(&o, "bins:off", &sc[1]);
  run_scaling(&o, "glibc", &sc[2]);

  /* 5: trace recording. */
  trace_cost_t tcost = {0};
  run_trace_cost(&tcost);

  /* 4: training loop. */
  training_t tr[3] = {{.name = "gma, bins"}, {.name = "gma, bins:off"}, {.name = "gma, plan:on"}};
  const char *const tr_conf[3] = {NULL, "bins:off", "plan:on"};
  run_training(&o, tr_conf, tr);

  printf("\n1-2. one 4 KiB alloc+free pair, same stream, cache hit, one thread\n");
  printf("%-28s %10s %10s %12s %14s\n", "", "median ns", "p99 ns", "batch ns", "median/malloc");
  for (int i = 0; i < 4; i++)
    printf("%-28s %10.1f %10.1f %12.1f %13.2fx\n", lat[i].name, lat[i].median_ns, lat[i].p99_ns,
           lat[i].batch_ns, lat[i].median_ns / lat[2].median_ns);
  printf("   bins:off / bins median: %.2fx; %.1f%% of the bins run's allocations were bin hits\n",
         lat[1].median_ns / lat[0].median_ns, 100 * bin_share);
  printf("   plan:on / bins median: %.2fx; %.1f%% of the plan run's allocations were planned hits "
         "(a mark every 64 pairs, its cost included)\n",
         lat[3].median_ns / lat[0].median_ns, 100 * plan_share);
  printf("   (interleaved in 20 chunks per row; median: %d groups of %d pairs, per pair; p99: %d "
         "single pairs, in steps of the\n    counter's %.1f ns resolution; batch: median of "
         "1000-pair batches timed with clock_gettime)\n",
         lat[0].n8, GROUP, lat[0].n, (double)tick_step * ns_per_tick);

  printf("\n3. 4 KiB pairs per second: two threads on two streams vs one thread (goal >= 1.8x)\n");
  printf("%-30s %14s %14s %8s\n", "", "1 thread", "2 threads", "ratio");
  for (int i = 0; i < 3; i++)
    printf("%-30s %14.0f %14.0f %7.2fx\n", sc[i].name, sc[i].one, sc[i].two, sc[i].ratio);
  printf("   (median of %d runs of %d ms each, interleaved)\n", o.reps, o.duration_ms);

  printf("\n4. training loop: %d streams, %d buffers per iteration, record_stream on some\n",
         TL_STREAMS, TL_BUFS);
  printf("%-28s %12s %16s %16s %14s %10s\n", "", "iter/s", "dev allocs 1st", "dev allocs after",
         "peak reserved", "bin hits");
  for (int i = 0; i < 3; i++)
    printf("%-28s %12.0f %16" PRIu64 " %16" PRIu64 " %11.1f MiB %9.1f%%\n", tr[i].name,
           tr[i].iters_per_s, tr[i].device_allocs_first, tr[i].device_allocs_after,
           (double)tr[i].reserved_peak / MiB,
           tr[i].num_allocs ? 100.0 * (double)(tr[i].hits_bin + tr[i].plan_hits) /
                                  (double)tr[i].num_allocs
                            : 0);
  printf("   plan:on: bin hits column counts planned hits (%" PRIu64 " of %" PRIu64 "); peak "
         "reserved after the plan was made %.1f MiB; plan:on / bins iterations per second "
         "%.2fx\n",
         tr[2].plan_hits, tr[2].num_allocs, (double)tr[2].reserved_after_plan / MiB,
         tr[2].iters_per_s / tr[0].iters_per_s);
  printf("   bins / bins:off iterations per second: %.2fx (goal: 0 device allocs after the first "
         "iteration; %d iterations, median of 100-iteration chunks, the two interleaved)\n",
         tr[0].iters_per_s / tr[1].iters_per_s, tr[0].iterations);

  printf("\n5. trace recording: one 4 KiB alloc+free pair (2 events), trace off and on\n");
  printf("%-28s %12s %12s %14s\n", "", "off ns/pair", "on ns/pair", "ns per event");
  printf("%-28s %12.1f %12.1f %14.1f\n", "gma, bins", tcost.off_ns, tcost.on_ns,
         tcost.per_event_ns);
  printf("   (median of 9 interleaved batches of 20000 pairs; %" PRIu64 " rows written, the CSV "
         "formatting and file writes included; off costs one load and branch per call)\n",
         tcost.rows);

  write_json(&o, overhead_ns, &tcost, lat, 4, sc, 3, tr, 3);
  printf("\nwrote %s\n", o.json_path);
  for (int i = 0; i < 4; i++) {
    free(lat[i].ticks);
    free(lat[i].ticks8);
  }
  return 0;
}
