/* gma-bench-scenarios: five workloads as users run them, each against a
 * baseline measured in the same run, on the simulated device through the
 * public API only (gma.h). Simulated kernels (gma_sim_launch) stamp a tag
 * into every buffer they are given (a few words at its start, middle and
 * end, so a 64 MiB buffer costs three page touches, not a memset) and later
 * kernels check it: a block handed out while device work still used it
 * shows up as a corruption. Corruptions are counted and reported, and any
 * makes the program exit 3 (a benchmark of an allocator that hands out
 * memory in use measures nothing).
 *
 * 1. training: one training step repeated, on three streams (data, compute,
 *    comm): 40 buffers per iteration, 512 B to 64 MiB, 344 MiB requested,
 *    sizes fixed per slot by a seeded generator; data-stream buffers are
 *    read on compute and gradients on comm (gma_record_stream before their
 *    free); one host synchronization per iteration (gma_stream_synchronize
 *    on each stream), then gma_iteration_mark at the iteration boundary (a
 *    no-op under plan:off; --config plan:on plans the default column's
 *    memory, and the gma_stats plan fields are reported for every column).
 *    50 iterations under the DEFAULT config, against
 *    bins:off and release_threshold:1T in the same run. Then the same loop
 *    scaled to a 2 GiB working set on a simulated 4 GiB device.
 * 2. pipeline: four stages on four streams, one thread each, 32
 *    micro-batches; a stage holds micro-batch k's buffers while it asks
 *    gma_alloc_batch_async for k+1's, launches its kernel (1.5 ms), hands
 *    its output to the next stage (whose kernel waits on a flag the
 *    producer's kernel sets, like cudaStreamWaitEvent; the consumer calls
 *    gma_record_stream before its free), then waits on the future. The
 *    baseline is the identical loop with gma_alloc_batch in place of the
 *    async call. Time blocked getting buffers.
 * 3. service: two threads serve five bursts of requests of mixed sizes under
 *    memory_limit:1G, trim_interval_ms:50, release_threshold:64M, each burst
 *    followed by an idle period; the time from the burst's last free until
 *    reserved <= release_threshold (gma_stats every ms), failures, and the
 *    pressure levels gma_set_pressure_callback was called with. Baseline:
 *    the same, with the program calling gma_empty_cache right after each
 *    burst (gma has no knob that turns timed trimming off alone).
 * 4. varying: the training step of 1, but the batch, activations,
 *    workspaces and output gradients scale with a sequence length drawn per
 *    iteration (4a: seeded, uniform 128..2048 in steps of 64; 4b: 512, 1024,
 *    512, 2048 cycled; 4c: drawn from 256, 512, 1024, 2048, so a quarter of
 *    consecutive iterations match and plans are made and dropped), 50
 *    iterations (issue 18: no regression against plan off).
 *    Columns plan:off (the default config) and plan:on, one after the other
 *    in alternating order; host time inside gma's calls is measured too.
 * 5. cross: a stream that hands every buffer to a slower one, the host far
 *    ahead of the device: 10 batches of 500 allocations on stream A (seeded,
 *    log-uniform 64 KiB - 4 MiB), each written by a kernel on A, then B waits
 *    for A (gma_stream_wait_stream) and a 20 us kernel on B checks it;
 *    gma_record_stream(ptr, B) and gma_free; both streams synchronized after
 *    each batch. Peak reserved and allocated, device allocations,
 *    device-side cross-stream waits, allocations/s, under the default config
 *    (reuse:auto) and reuse:wait (the owner takes its pending blocks back
 *    behind device-side waits), against reuse:query (never a device-side
 *    wait: the pool grows instead) in the same run.
 *
 * Every figure is the median of --runs runs (default 5); each run creates
 * its allocators afresh. Options: --runs N, --quick (small sizes, for the
 * smoke test), --json PATH (default bench_scenarios.json), --scenario
 * training|pipeline|service|varying|cross, --config TEXT (appended to the
 * gma side's config: the training loop's default column, both sides of the
 * pipeline, the service, the varying scenario's plan:off column and the
 * cross scenario's default column). One
 * progress line per run goes to stderr. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_NAME "gma-bench-scenarios"
#include "benchkit.h"
#include "gma.h"

/* ---- Every config string in one place ---------------------------------------
 * release_threshold's meaning is being changed (0 may come to mean "keep
 * nothing"), so the service scenario spells its values out; the training
 * loop's first column is the default config on purpose: it is what users
 * run. */
#define TRAIN_DEFAULT_CONF ""                /* column 1: no keys at all */
#define TRAIN_BINS_OFF_CONF "bins:off"        /* column 2 */
#define TRAIN_KEEP_ALL_CONF "release_threshold:1T" /* column 3: timed trim never trims */
#define TRAIN_BIG_DEVICE_CONF "sim_capacity:4G"         /* 2 GiB working set */
#define TRAIN_BIG_DEVICE_CONF_QUICK "sim_capacity:512M" /* --quick: 256 MiB */
#define PIPELINE_CONF ""
#define SERVICE_CONF "memory_limit:1G,trim_interval_ms:50,release_threshold:64M"
#define SERVICE_CONF_QUICK "memory_limit:128M,trim_interval_ms:20,release_threshold:8M"
#define CROSS_DEFAULT_CONF ""                 /* reuse:auto */
#define CROSS_BASE_CONF "reuse:query"         /* the baseline: never a device-side wait */
#define CROSS_WAIT_CONF "reuse:wait"          /* the owner takes its blocks back behind waits */

enum { MAX_RUNS = 101 };

typedef struct options {
  int runs, quick;
  const char *json, *scenario, *extra; /* extra: --config, "" if none */
} options_t;

static options_t opt = {.runs = 5, .json = "bench_scenarios.json", .scenario = NULL, .extra = ""};
static FILE *js;   /* the JSON document, written to opt.json at the end */
static atomic_long corruptions, order_timeouts;

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* Creates a simulated-device allocator from up to three config strings,
 * parsed one after another (a later string may set a key again). */
static gma_t *make(const char *a, const char *b, const char *c, gma_config_t *out_cfg) {
  gma_config_t cfg = GMA_CONFIG_INIT;
  cfg.device = GMA_DEVICE_SIM;
  cfg.ignore_env = 1; /* the run is described by its options alone */
  const char *parts[3] = {a, b, c};
  for (int i = 0; i < 3; i++)
    if (parts[i] && *parts[i]) OK(gma_config_parse(&cfg, parts[i]));
  gma_t *g = NULL;
  OK(gma_create(&cfg, &g));
  if (out_cfg) *out_cfg = cfg;
  return g;
}

/* ---- Figures: one value per run, the median reported ------------------------ */

typedef struct series {
  double v[MAX_RUNS];
  int n;
} series_t;

static void put(series_t *s, double x) {
  if (s->n < MAX_RUNS) s->v[s->n++] = x;
}

/* The median; INFINITY ("never") sorts last. */
static double med(const series_t *s) {
  if (s->n == 0) return NAN;
  double v[MAX_RUNS];
  memcpy(v, s->v, (size_t)s->n * sizeof *v);
  qsort(v, (size_t)s->n, sizeof *v, cmp_double);
  if (s->n % 2) return v[s->n / 2];
  double a = v[s->n / 2 - 1], b = v[s->n / 2];
  return isinf(a) || isinf(b) ? INFINITY : (a + b) / 2;
}

static void json_num(double x) {
  if (isfinite(x)) fprintf(js, "%.6g", x);
  else fprintf(js, "null");
}

/* "key": {"median": m, "runs": [...]} */
static void json_series(const char *key, const series_t *s, int comma) {
  fprintf(js, "\"%s\": {\"median\": ", key);
  json_num(med(s));
  fprintf(js, ", \"runs\": [");
  for (int i = 0; i < s->n; i++) {
    if (i) fprintf(js, ", ");
    json_num(s->v[i]);
  }
  fprintf(js, "]}%s", comma ? ", " : "");
}

/* "key": "a,b,c" (the non-empty parts joined by commas: config strings),
 * with quotes and backslashes escaped. */
static void json_conf(const char *key, const char *a, const char *b, const char *c) {
  const char *parts[3] = {a, b, c};
  int first = 1;
  fprintf(js, "\"%s\": \"", key);
  for (int i = 0; i < 3; i++) {
    if (!parts[i] || !*parts[i]) continue;
    if (!first) fputc(',', js);
    first = 0;
    for (const char *q = parts[i]; *q; q++) {
      if (*q == '"' || *q == '\\') fputc('\\', js);
      fputc(*q, js);
    }
  }
  fprintf(js, "\", ");
}

static void print_cell(const char *fmt, double x) {
  if (isinf(x)) printf("%*s", atoi(fmt + 1), "never");
  else if (isnan(x)) printf("%*s", atoi(fmt + 1), "-");
  else printf(fmt, x);
}

static void progress(const char *what, int run, uint64_t t0) {
  fprintf(stderr, "gma-bench-scenarios: %s: run %d/%d done (%.2f s)\n", what, run + 1, opt.runs,
          (double)(now_ns() - t0) / 1e9);
}

/* ---- Simulated kernels: stamp and check tags ----------------------------------- */

enum { KMAX = 6 };

typedef struct kbuf {
  void *p; /* NULL: the allocation failed, nothing to do */
  size_t size;
  uint64_t tag;
} kbuf_t;

/* One kernel: waits until *after is set (device-side ordering after another
 * stream's kernel), checks the tags of check[], stamps write[], holds for
 * hold_us (its "compute"), checks write[] again, and sets done. */
typedef struct kern {
  kbuf_t check[KMAX], write[KMAX];
  int ncheck, nwrite;
  atomic_int *after;
  long hold_us;
  atomic_int done;
} kern_t;

static size_t tag_offset(size_t size, int i) {
  size_t off = i == 0 ? 0 : i == 1 ? size / 2 : size - 8;
  return off & ~(size_t)7;
}

static void stamp(const kbuf_t *b) {
  if (!b->p) return;
  for (int i = 0; i < 3; i++)
    __atomic_store_n((uint64_t *)((char *)b->p + tag_offset(b->size, i)), b->tag, __ATOMIC_RELAXED);
}

static void check(const kbuf_t *b) {
  if (!b->p) return;
  for (int i = 0; i < 3; i++) {
    uint64_t got =
        __atomic_load_n((uint64_t *)((char *)b->p + tag_offset(b->size, i)), __ATOMIC_RELAXED);
    if (got != b->tag) {
      if (atomic_fetch_add(&corruptions, 1) < 10)
        fprintf(stderr,
                "gma-bench-scenarios: CORRUPTION: buffer %p (%zu bytes) word %d holds %#" PRIx64
                ", expected %#" PRIx64 "\n",
                b->p, b->size, i, got, b->tag);
      return;
    }
  }
}

static void kern_run(void *arg) {
  kern_t *k = arg;
  if (k->after) {
    int waited = 0;
    while (!atomic_load_explicit(k->after, memory_order_acquire)) {
      if (++waited > 500000) { /* 10 s: the producer never ran */
        atomic_fetch_add(&order_timeouts, 1);
        break;
      }
      sleep_us(20);
    }
  }
  for (int i = 0; i < k->ncheck; i++) check(&k->check[i]);
  for (int i = 0; i < k->nwrite; i++) stamp(&k->write[i]);
  if (k->hold_us) sleep_us(k->hold_us);
  for (int i = 0; i < k->nwrite; i++) check(&k->write[i]);
  atomic_store_explicit(&k->done, 1, memory_order_release);
}

static void kern_init(kern_t *k, atomic_int *after, long hold_us) {
  memset(k, 0, sizeof *k);
  k->after = after;
  k->hold_us = hold_us;
}

static void kern_add(kbuf_t *list, int *n, void *p, size_t size, uint64_t tag) {
  if (*n >= KMAX) {
    fprintf(stderr, "gma-bench-scenarios: kernel with more than %d buffers\n", KMAX);
    exit(1);
  }
  list[(*n)++] = (kbuf_t){p, size, tag};
}

/* A tag no two live buffers share: scenario, run, iteration, slot. */
static uint64_t mktag(int scen, int run, int iter, int slot) {
  return 0x9e00000000000000ull ^ ((uint64_t)scen << 52) ^ ((uint64_t)run << 40) ^
         ((uint64_t)iter << 16) ^ (uint64_t)slot;
}

/* Log-uniform size in [lo, hi]. */
static size_t log_uniform(uint64_t *rng, double lo, double hi) {
  double u = (double)(xorshift(rng) >> 11) / 9007199254740992.0;
  return (size_t)exp(log(lo) + u * (log(hi) - log(lo)));
}

/* ==== 1. Training loop ======================================================== */

enum { TR_LAYERS = 8, TR_SLOTS = 40, TR_WARMUP = 3 };
/* Slots: 0 input, 1 labels, 2 mask (data stream); 3..10 activations, 11..18
 * workspaces, 19 loss, 20..27 grads of the layer outputs, 28..35 weight
 * grads (compute stream); 36..39 all-reduce buckets (comm stream). */
enum { SL_INPUT = 0, SL_LABELS = 1, SL_MASK = 2, SL_ACT = 3, SL_WS = 11, SL_LOSS = 19,
       SL_GIN = 20, SL_WG = 28, SL_BUCKET = 36 };
enum { ST_DATA = 0, ST_COMPUTE = 1, ST_COMM = 2, TR_STREAMS = 3 };

typedef struct train_plan {
  size_t size[TR_SLOTS];
  size_t total, smallest, largest;
  uint64_t target;
} train_plan_t;

/* Raw sizes from seeded draws (about 290 MiB besides the batch), then
 * scaled so the total is target: the batch (input) is 64 MiB * target /
 * 344 MiB, the largest buffer; labels and loss stay tiny; the rest share
 * what is left, at least 512 B each. */
static void train_plan(train_plan_t *pl, uint64_t target) {
  uint64_t rng = 0x5eed0001;
  double raw[TR_SLOTS];
  raw[SL_INPUT] = 64.0 * MiB;
  raw[SL_LABELS] = (double)log_uniform(&rng, 512, 4096);
  raw[SL_MASK] = (double)log_uniform(&rng, 1.0 * MiB, 4.0 * MiB);
  for (int l = 0; l < TR_LAYERS; l++) {
    raw[SL_ACT + l] = (double)(4 * MiB + xorshift(&rng) % (12 * MiB));
    raw[SL_WS + l] = (double)log_uniform(&rng, 256.0 * KiB, 8.0 * MiB);
    raw[SL_GIN + l] = raw[SL_ACT + l];
    raw[SL_WG + l] = (double)log_uniform(&rng, 512, 16.0 * MiB);
  }
  raw[SL_LOSS] = 512;
  for (int b = 0; b < 4; b++) raw[SL_BUCKET + b] = (double)(16 * MiB + xorshift(&rng) % (16 * MiB));
  double fixed = 64.0 * MiB * (double)target / (344.0 * MiB) + raw[SL_LABELS] + raw[SL_LOSS];
  double sum = 0;
  for (int i = 0; i < TR_SLOTS; i++)
    if (i != SL_INPUT && i != SL_LABELS && i != SL_LOSS) sum += raw[i];
  double scale = ((double)target - fixed) / sum;
  double hi = 64.0 * MiB * (double)target / (344.0 * MiB);
  pl->total = 0;
  pl->smallest = SIZE_MAX;
  pl->largest = 0;
  pl->target = target;
  for (int i = 0; i < TR_SLOTS; i++) {
    double s = i == SL_INPUT ? hi : i == SL_LABELS || i == SL_LOSS ? raw[i] : raw[i] * scale;
    if (s < 512) s = 512;
    if (s > hi) s = hi;
    pl->size[i] = (size_t)s;
    pl->total += pl->size[i];
    if (pl->size[i] < pl->smallest) pl->smallest = pl->size[i];
    if (pl->size[i] > pl->largest) pl->largest = pl->size[i];
  }
}

enum { TF_DEV_AFTER, TF_DEV_FIRST, TF_DEV_WARMUP, TF_DEV_FREES, TF_TRIMS, TF_PEAK_RESERVED, TF_PEAK_ALLOCATED, TF_PEAK_ACTIVE, TF_RATIO,
       TF_ACTIVE_RATIO, TF_FLOOR, TF_FLOOR_RATIO,
       TF_HIT_BIN, TF_HIT_STREAM, TF_HIT_POOL, TF_HIT_DEVICE, TF_ITERS, TF_FAILED,
       /* Planned memory: gma_stats' plan fields at the end of the run (all 0
        * under plan:off), the iteration whose mark made the plan active, the
        * device allocations after it, and marks that did not return GMA_OK. */
       TF_PLAN_STATE, TF_PLAN_HITS, TF_PLAN_MISSES, TF_PLAN_REPLANS, TF_PLAN_ARENA, TF_PLAN_LOWER,
       TF_PLAN_SLOTS, TF_PLAN_ITERS, TF_PLAN_ACTIVE_AT, TF_DEV_AFTER_PLAN, TF_RES_AFTER_PLAN, TF_MARK_FAILED, TF_N };
/* The first of the plan figures: the table prints them only when some column
 * has one that is not 0 (the JSON always has them). */
enum { TF_PLAN_FIRST = TF_PLAN_STATE };
static const struct {
  const char *key, *label, *fmt;
} tr_fig[TF_N] = {
    {"device_allocs_after_warmup", "device allocs after iteration 3", "%22.0f"},
    {"device_allocs_iteration_1", "device allocs in iteration 1", "%22.0f"},
    {"device_allocs_iterations_2_3", "device allocs in iterations 2-3", "%22.0f"},
    {"device_frees_after_warmup", "device frees after iteration 3", "%22.0f"},
    {"timed_trims_after_warmup", "timed trims after iteration 3", "%22.0f"},
    {"peak_reserved_mib", "peak reserved MiB", "%22.1f"},
    {"peak_allocated_mib", "peak allocated MiB", "%22.1f"},
    {"peak_active_mib", "peak active MiB", "%22.1f"},
    {"peak_reserved_over_peak_allocated", "peak reserved / peak allocated", "%22.3f"},
    {"peak_reserved_over_peak_active", "peak reserved / peak active", "%22.3f"},
    {"no_wait_floor_mib", "floor without waits MiB (see below)", "%22.1f"},
    {"no_wait_floor_over_peak_active", "floor without waits / peak active", "%22.3f"},
    {"hit_rate_bin", "hits: bin % (after warm-up)", "%22.1f"},
    {"hit_rate_stream", "hits: stream cache %", "%22.1f"},
    {"hit_rate_pool", "hits: shared pool %", "%22.1f"},
    {"hit_rate_device", "hits: new segment %", "%22.1f"},
    {"iterations_per_s", "iterations/s (after warm-up)", "%22.1f"},
    {"failed_allocs", "failed allocations", "%22.0f"},
    {"plan_state", "plan: state (4 active)", "%22.0f"},
    {"plan_hits", "plan: hits", "%22.0f"},
    {"plan_misses", "plan: misses", "%22.0f"},
    {"plan_replans", "plan: re-plans", "%22.0f"},
    {"plan_arena_mib", "plan: arena MiB", "%22.1f"},
    {"plan_lower_bound_mib", "plan: lower bound MiB", "%22.1f"},
    {"plan_slots", "plan: slots", "%22.0f"},
    {"plan_iterations", "plan: iterations marked", "%22.0f"},
    {"plan_active_after_iteration", "plan: active after iteration", "%22.0f"},
    {"device_allocs_after_plan_active", "device allocs after that", "%22.0f"},
    {"reserved_after_plan_active_mib", "reserved after that MiB", "%22.1f"},
    {"iteration_mark_failures", "gma_iteration_mark failures", "%22.0f"},
};

enum { TR_COLS = 3 };
typedef struct train_col {
  const char *name, *conf;
  series_t f[TF_N];
} train_col_t;

typedef struct train_ctx {
  gma_t *g;
  gma_stream_t s[TR_STREAMS];
  const train_plan_t *pl;
  long hold_us;
  int run, col;
  uint64_t failed;
  int plan;                /* the allocator's config has plan:on */
  uint64_t mark_failed;    /* gma_iteration_mark calls that did not return GMA_OK */
  int plan_active_at;      /* the iteration (1-based) whose mark made the plan active; 0: none */
  uint64_t dev_at_active;  /* num_device_allocs right after that mark */
  uint64_t res_at_active;  /* reserved right after that mark */
  int tagscen;             /* mktag's scenario number: 1 + column (training), 14..19 (varying) */
  /* The varying-sequence scenario (4) only: host time in gma calls, and one
   * gma_stats after every mark in every column (not only while a plan:on
   * column's plan is not active), so both columns pay for the same calls. */
  int timed;
  uint64_t gma_ns;         /* gma_alloc, gma_free, gma_record_stream of the iteration */
  uint64_t mark_ns;        /* gma_iteration_mark of the iteration */
  int state_after;         /* plan_state after the iteration's mark (timed only) */
  uint64_t arena_after;    /* plan_arena_bytes then */
  kern_t k[32]; /* one iteration's kernels; reused once the host synchronized */
  int nk;
  /* The floor without waits (floor_note), from iteration 1's requests: bytes
   * live on the data and compute streams and on comm, the most data and
   * compute had live so far, the bytes of theirs comm consumed (recorded on
   * comm, then freed), the floor so far, and when the iteration's first
   * request and its last free were made. */
  int counting;
  bool to_comm[TR_SLOTS];
  uint64_t live_dc, live_comm, peak_dc, given, floor;
  uint64_t first_ns, last_ns;
} train_ctx_t;

/* The floor without waits. In iteration 1 no device work completes while
 * the host queues the step (the data stream's copy takes 2 * hold_us and
 * every compute kernel runs after it; tr_put_figures checks that the host
 * was quicker). So an allocator that neither waits on the host nor makes a
 * stream wait for another stream's work, except to take a block the program
 * recorded on it (gma_record_stream: the program orders that stream after
 * the block's producer), can reuse memory freed on a stream only on that
 * stream or on a stream the block was recorded on. Compute consumes the
 * data stream's batch, so the two count as one; comm gets only the weight
 * gradients recorded on it. What data and compute had live at their peak
 * stays theirs until the host synchronizes, less what they gave comm, and
 * comm needs its own live bytes besides: reserved >= peak_dc - given +
 * live_comm at every moment. Block rounding and segment sizes come on top. */
static void floor_note(train_ctx_t *c) {
  if (!c->counting) return;
  if (c->live_dc > c->peak_dc) c->peak_dc = c->live_dc;
  uint64_t f = c->peak_dc - c->given + c->live_comm;
  if (f > c->floor) c->floor = f;
  c->last_ns = now_ns();
}

static bool on_comm(int slot) { return slot >= SL_BUCKET; }

static void *tr_alloc(train_ctx_t *c, int slot, int stream) {
  void *p = NULL;
  uint64_t t0 = c->timed ? now_ns() : 0;
  gma_status_t st = gma_alloc(c->g, c->pl->size[slot], c->s[stream], &p);
  if (c->timed) c->gma_ns += now_ns() - t0;
  if (st == GMA_ERR_OOM) {
    c->failed++;
    return NULL;
  }
  if (st != GMA_OK) die("gma_alloc", st);
  if (c->counting) {
    if (!c->first_ns) c->first_ns = t0 ? t0 : now_ns();
    *(on_comm(slot) ? &c->live_comm : &c->live_dc) += c->pl->size[slot];
    floor_note(c);
  }
  return p;
}

static void tr_free(train_ctx_t *c, void *p, int slot) {
  if (!p) return;
  uint64_t t0 = c->timed ? now_ns() : 0;
  OK(gma_free(c->g, p));
  if (c->timed) c->gma_ns += now_ns() - t0;
  if (c->counting) {
    *(on_comm(slot) ? &c->live_comm : &c->live_dc) -= c->pl->size[slot];
    if (c->to_comm[slot]) c->given += c->pl->size[slot];
    floor_note(c);
  }
}

static void tr_record(train_ctx_t *c, void *p, int slot, int stream) {
  if (!p) return;
  uint64_t t0 = c->timed ? now_ns() : 0;
  OK(gma_record_stream(c->g, p, c->s[stream]));
  if (c->timed) c->gma_ns += now_ns() - t0;
  if (stream == ST_COMM && !on_comm(slot)) c->to_comm[slot] = true;
}

static kern_t *tr_kern(train_ctx_t *c, atomic_int *after, long hold_us) {
  kern_t *k = &c->k[c->nk++];
  kern_init(k, after, hold_us);
  return k;
}

static void tr_launch(train_ctx_t *c, int stream, kern_t *k) {
  OK(gma_sim_launch(c->g, c->s[stream], kern_run, k));
}

/* One training step; the host synchronizes every stream at its end. */
static void train_iteration(train_ctx_t *c, int iter) {
  const train_plan_t *pl = c->pl;
  void *p[TR_SLOTS] = {0};
  uint64_t tag[TR_SLOTS];
  for (int i = 0; i < TR_SLOTS; i++) tag[i] = mktag(c->tagscen, c->run, iter, i);
#define TB(slot) p[slot], pl->size[slot], tag[slot]
  c->nk = 0;
  /* The data loader's copies, on the data stream. */
  p[SL_INPUT] = tr_alloc(c, SL_INPUT, ST_DATA);
  p[SL_LABELS] = tr_alloc(c, SL_LABELS, ST_DATA);
  p[SL_MASK] = tr_alloc(c, SL_MASK, ST_DATA);
  kern_t *kd = tr_kern(c, NULL, 2 * c->hold_us);
  for (int i = SL_INPUT; i <= SL_MASK; i++) kern_add(kd->write, &kd->nwrite, TB(i));
  tr_launch(c, ST_DATA, kd);
  /* Forward: layer l reads the batch (l = 0) or layer l-1's activation. */
  for (int l = 0; l < TR_LAYERS; l++) {
    p[SL_ACT + l] = tr_alloc(c, SL_ACT + l, ST_COMPUTE);
    p[SL_WS + l] = tr_alloc(c, SL_WS + l, ST_COMPUTE);
    kern_t *k = tr_kern(c, l == 0 ? &kd->done : NULL, c->hold_us);
    if (l == 0)
      for (int i = SL_INPUT; i <= SL_MASK; i++) kern_add(k->check, &k->ncheck, TB(i));
    else
      kern_add(k->check, &k->ncheck, TB(SL_ACT + l - 1));
    kern_add(k->write, &k->nwrite, TB(SL_ACT + l));
    kern_add(k->write, &k->nwrite, TB(SL_WS + l));
    tr_launch(c, ST_COMPUTE, k);
    tr_free(c, p[SL_WS + l], SL_WS + l);
    if (l == 0) /* the batch was used on compute: its free waits for that */
      for (int i = SL_INPUT; i <= SL_MASK; i++) {
        tr_record(c, p[i], i, ST_COMPUTE);
        tr_free(c, p[i], i);
      }
  }
  p[SL_LOSS] = tr_alloc(c, SL_LOSS, ST_COMPUTE);
  kern_t *kl = tr_kern(c, NULL, c->hold_us);
  kern_add(kl->check, &kl->ncheck, TB(SL_ACT + TR_LAYERS - 1));
  kern_add(kl->write, &kl->nwrite, TB(SL_LOSS));
  tr_launch(c, ST_COMPUTE, kl);
  /* Backward, last layer first; every two layers an all-reduce on comm
   * reads their weight gradients into a bucket. */
  for (int l = TR_LAYERS - 1; l >= 0; l--) {
    int upstream = l == TR_LAYERS - 1 ? SL_LOSS : SL_GIN + l + 1;
    p[SL_GIN + l] = tr_alloc(c, SL_GIN + l, ST_COMPUTE);
    p[SL_WG + l] = tr_alloc(c, SL_WG + l, ST_COMPUTE);
    kern_t *k = tr_kern(c, NULL, c->hold_us);
    kern_add(k->check, &k->ncheck, TB(SL_ACT + l));
    kern_add(k->check, &k->ncheck, TB(upstream));
    kern_add(k->write, &k->nwrite, TB(SL_GIN + l));
    kern_add(k->write, &k->nwrite, TB(SL_WG + l));
    tr_launch(c, ST_COMPUTE, k);
    tr_free(c, p[SL_ACT + l], SL_ACT + l);
    tr_free(c, p[upstream], upstream);
    if (l % 2 == 0) {
      int b = SL_BUCKET + l / 2;
      p[b] = tr_alloc(c, b, ST_COMM);
      kern_t *kc = tr_kern(c, &k->done, 2 * c->hold_us);
      kern_add(kc->check, &kc->ncheck, TB(SL_WG + l + 1));
      kern_add(kc->check, &kc->ncheck, TB(SL_WG + l));
      kern_add(kc->write, &kc->nwrite, TB(b));
      tr_launch(c, ST_COMM, kc);
      for (int w = SL_WG + l; w <= SL_WG + l + 1; w++) {
        tr_record(c, p[w], w, ST_COMM);
        tr_free(c, p[w], w);
      }
      tr_free(c, p[b], b);
    }
  }
  tr_free(c, p[SL_GIN], SL_GIN);
#undef TB
  /* The host's one synchronization per step (loss.item()), through gma. */
  for (int s = 0; s < TR_STREAMS; s++) OK(gma_stream_synchronize(c->g, c->s[s]));
  /* The iteration boundary, as a training loop marks it: a no-op under
   * plan:off. A failing mark is counted, and said once per process, not
   * fatal: plan:on may be unfinished in the libgma measured. */
  static atomic_int mark_said;
  uint64_t m0 = c->timed ? now_ns() : 0;
  gma_status_t st = gma_iteration_mark(c->g);
  if (c->timed) c->mark_ns += now_ns() - m0;
  if (st != GMA_OK && !c->mark_failed++ && !atomic_exchange(&mark_said, 1))
    fprintf(stderr, "gma-bench-scenarios: gma_iteration_mark: %s (counted as "
                    "iteration_mark_failures)\n", gma_last_error());
  if (c->timed || (c->plan && !c->plan_active_at)) { /* one gma_stats per step while the plan
                                                       * is not active (every step: timed) */
    gma_stats_t s = GMA_STATS_INIT;
    OK(gma_stats(c->g, &s));
    c->state_after = s.plan_state;
    c->arena_after = s.plan_arena_bytes;
    if (s.plan_state == 4 && !c->plan_active_at) {
      c->plan_active_at = iter + 1;
      c->dev_at_active = s.num_device_allocs;
      c->res_at_active = s.reserved.current;
    }
  }
}

static void tr_put_figures(train_ctx_t *c, series_t *f, const gma_stats_t *op,
                           const gma_stats_t *wp, const gma_stats_t *ep, int iterations,
                           double secs);

typedef struct train_job {
  const train_plan_t *pl;
  const char *device_conf;
  train_col_t *col;
  int colno, run, iterations;
  long hold_us;
} train_job_t;

static void *train_once(void *arg) {
  train_job_t *j = arg;
  train_ctx_t *c = calloc(1, sizeof *c);
  if (!c) die("out of host memory", GMA_ERR_OOM);
  gma_config_t cfg;
  c->g = make(j->device_conf, j->col->conf, j->colno == 0 ? opt.extra : NULL, &cfg);
  c->plan = cfg.plan;
  c->pl = j->pl;
  c->hold_us = j->hold_us;
  c->run = j->run;
  c->col = j->colno;
  c->tagscen = 1 + j->colno;
  int iterations = j->iterations;
  for (int s = 0; s < TR_STREAMS; s++) OK(gma_stream_create(c->g, &c->s[s]));
  gma_stats_t one = GMA_STATS_INIT, w = GMA_STATS_INIT, e = GMA_STATS_INIT;
  for (int i = 0; i < TR_WARMUP; i++) {
    c->counting = i == 0;
    train_iteration(c, i);
    if (i == 0) OK(gma_stats(c->g, &one));
  }
  c->counting = 0;
  OK(gma_stats(c->g, &w));
  uint64_t t0 = now_ns();
  for (int i = TR_WARMUP; i < iterations; i++) train_iteration(c, i);
  double secs = (double)(now_ns() - t0) / 1e9;
  OK(gma_stats(c->g, &e));
  tr_put_figures(c, j->col->f, &one, &w, &e, iterations, secs);
  for (int s = 0; s < TR_STREAMS; s++) OK(gma_stream_destroy(c->g, c->s[s]));
  OK(gma_destroy(c->g));
  free(c);
  return NULL;
}

/* The training figures of one run: one, w and e are gma_stats after
 * iteration 1, after the warm-up and at the end; secs the time after the
 * warm-up. */
static void tr_put_figures(train_ctx_t *c, series_t *f, const gma_stats_t *op,
                           const gma_stats_t *wp, const gma_stats_t *ep, int iterations,
                           double secs) {
  gma_stats_t one = *op, w = *wp, e = *ep;
  double allocs = (double)(e.num_allocs - w.num_allocs);
  put(&f[TF_DEV_AFTER], (double)(e.num_device_allocs - w.num_device_allocs));
  put(&f[TF_DEV_FIRST], (double)one.num_device_allocs);
  put(&f[TF_DEV_WARMUP], (double)(w.num_device_allocs - one.num_device_allocs));
  put(&f[TF_DEV_FREES], (double)(e.num_device_frees - w.num_device_frees));
  put(&f[TF_TRIMS], (double)(e.trims_timed + e.trims_idle - w.trims_timed - w.trims_idle));
  put(&f[TF_PEAK_RESERVED], (double)e.reserved.peak / MiB);
  put(&f[TF_PEAK_ALLOCATED], (double)e.allocated.peak / MiB);
  put(&f[TF_PEAK_ACTIVE], (double)e.active.peak / MiB);
  put(&f[TF_RATIO], e.allocated.peak ? (double)e.reserved.peak / (double)e.allocated.peak : NAN);
  put(&f[TF_ACTIVE_RATIO], e.active.peak ? (double)e.reserved.peak / (double)e.active.peak : NAN);
  /* Only where no device work can have completed before the host queued
   * all of iteration 1 (floor_note): else NAN. */
  bool ahead = c->last_ns - c->first_ns < (uint64_t)c->hold_us * 2000;
  put(&f[TF_FLOOR], ahead ? (double)c->floor / MiB : NAN);
  put(&f[TF_FLOOR_RATIO], ahead && e.active.peak ? (double)c->floor / (double)e.active.peak : NAN);
  put(&f[TF_HIT_BIN], allocs ? 100.0 * (double)(e.hits_bin - w.hits_bin) / allocs : NAN);
  put(&f[TF_HIT_STREAM], allocs ? 100.0 * (double)(e.hits_stream - w.hits_stream) / allocs : NAN);
  put(&f[TF_HIT_POOL], allocs ? 100.0 * (double)(e.hits_pool - w.hits_pool) / allocs : NAN);
  put(&f[TF_HIT_DEVICE], allocs ? 100.0 * (double)(e.hits_device - w.hits_device) / allocs : NAN);
  put(&f[TF_ITERS], (double)(iterations - TR_WARMUP) / secs);
  put(&f[TF_FAILED], (double)c->failed);
  put(&f[TF_PLAN_STATE], (double)e.plan_state);
  put(&f[TF_PLAN_HITS], (double)e.plan_hits);
  put(&f[TF_PLAN_MISSES], (double)e.plan_misses);
  put(&f[TF_PLAN_REPLANS], (double)e.plan_replans);
  put(&f[TF_PLAN_ARENA], (double)e.plan_arena_bytes / MiB);
  put(&f[TF_PLAN_LOWER], (double)e.plan_lower_bound / MiB);
  put(&f[TF_PLAN_SLOTS], (double)e.plan_slots);
  put(&f[TF_PLAN_ITERS], (double)e.plan_iterations);
  /* Never active: "never" in the table, null in the JSON. */
  put(&f[TF_PLAN_ACTIVE_AT], c->plan_active_at ? (double)c->plan_active_at : INFINITY);
  put(&f[TF_DEV_AFTER_PLAN],
      c->plan_active_at ? (double)(e.num_device_allocs - c->dev_at_active) : NAN);
  /* Reserved grows only by device allocations: with none after the plan
   * became active, the larger of reserved then and at the end is the most
   * it held since. */
  put(&f[TF_RES_AFTER_PLAN],
      !c->plan_active_at ? NAN
      : (double)(c->res_at_active > e.reserved.current ? c->res_at_active : e.reserved.current) /
            MiB);
  put(&f[TF_MARK_FAILED], (double)c->mark_failed);
}

static void run_training_variant(const char *key, const char *title, uint64_t target,
                                 const char *device_conf) {
  int iterations = opt.quick ? 8 : 50;
  /* Compute kernels take 3 ms (data and comm twice that): about 60 ms per
   * step, so 50 steps (3 s) span two or three of the worker's default 1000 ms
   * ticks, whose timed trim is part of what the default config does to a
   * training loop (a real step of this size takes longer still). */
  long hold_us = opt.quick ? 20 : 3000;
  train_plan_t pl;
  train_plan(&pl, target);
  train_col_t cols[TR_COLS] = {{.name = "default", .conf = TRAIN_DEFAULT_CONF},
                               {.name = "bins:off", .conf = TRAIN_BINS_OFF_CONF},
                               {.name = "release_threshold:1T", .conf = TRAIN_KEEP_ALL_CONF}};
  long corr0 = atomic_load(&corruptions);
  for (int run = 0; run < opt.runs; run++) {
    uint64_t t0 = now_ns();
    /* The columns run side by side, each with its own allocator, device and
     * streams: the loop sleeps in its kernels most of the time (the
     * process uses a few % of one core), so they hardly compete, and drift
     * in the machine hits them alike. */
    train_job_t jobs[TR_COLS];
    pthread_t th[TR_COLS];
    for (int ci = 0; ci < TR_COLS; ci++) {
      jobs[ci] = (train_job_t){&pl, device_conf, &cols[ci], ci, run, iterations, hold_us};
      if (pthread_create(&th[ci], NULL, train_once, &jobs[ci]) != 0) die("pthread_create", GMA_ERR_INTERNAL);
    }
    for (int ci = 0; ci < TR_COLS; ci++) pthread_join(th[ci], NULL);
    progress(key, run, t0);
  }
  long corr = atomic_load(&corruptions) - corr0;
  printf("\n%s\n", title);
  printf("   3 streams (data, compute, comm), %d buffers per iteration, %zu B .. %.1f MiB, "
         "%.1f MiB requested per iteration;\n   %d iterations, record_stream on %d buffers, one "
         "host synchronization per iteration%s%s\n",
         TR_SLOTS, pl.smallest, (double)pl.largest / MiB, (double)pl.total / MiB, iterations,
         3 + TR_LAYERS, *device_conf ? "; " : "", device_conf);
  if (*opt.extra) printf("   --config %s applies to the default column\n", opt.extra);
  printf("%-36s", "(median of runs)");
  for (int i = 0; i < TR_COLS; i++) printf("%22s", cols[i].name);
  printf("\n");
  int plan_rows = 0; /* any plan figure that is not 0 in some column */
  for (int fi = TF_PLAN_FIRST; fi < TF_N; fi++)
    for (int i = 0; i < TR_COLS; i++) {
      double m = med(&cols[i].f[fi]);
      plan_rows |= !isnan(m) && !isinf(m) && m != 0;
    }
  for (int fi = 0; fi < TF_N; fi++) {
    if (fi >= TF_PLAN_FIRST && !plan_rows) break;
    printf("%-36s", tr_fig[fi].label);
    for (int i = 0; i < TR_COLS; i++) print_cell(tr_fig[fi].fmt, med(&cols[i].f[fi]));
    printf("\n");
  }
  printf("   corruptions: %ld\n", corr);
  printf("   floor without waits: the least any allocator can reserve in iteration 1 if it neither\n"
         "   waits on the host nor makes a stream wait for another's work, except behind a block the\n"
         "   program recorded on it (gma_record_stream); no device work completes while the host\n"
         "   queues the step. It is what data and compute had live at their peak, less what they\n"
         "   handed to comm, plus comm's own live bytes (bench_scenarios.c, floor_note)\n");

  fprintf(js, "  \"%s\": {\"streams\": 3, \"buffers_per_iteration\": %d, \"iterations\": %d, "
              "\"warmup_iterations\": %d, \"requested_per_iteration\": %zu, \"smallest\": %zu, "
              "\"largest\": %zu, \"corruptions\": %ld, ",
          key, TR_SLOTS, iterations, TR_WARMUP, pl.total, pl.smallest, pl.largest, corr);
  json_conf("device_config", device_conf, NULL, NULL);
  fprintf(js, "\n   \"columns\": [\n");
  for (int i = 0; i < TR_COLS; i++) {
    fprintf(js, "    {\"name\": \"%s\", ", cols[i].name);
    json_conf("config", device_conf, cols[i].conf, i == 0 ? opt.extra : NULL);
    for (int fi = 0; fi < TF_N; fi++) json_series(tr_fig[fi].key, &cols[i].f[fi], fi + 1 < TF_N);
    fprintf(js, "}%s\n", i + 1 < TR_COLS ? "," : "");
  }
  fprintf(js, "   ]},\n");
}

static void run_training(void) {
  uint64_t div = opt.quick ? 8 : 1;
  run_training_variant("training", "1a. training loop, default config against bins:off and "
                       "release_threshold:1T", 344 * MiB / div, "");
  run_training_variant("training_2g", "1b. training loop, 2 GiB working set on a simulated "
                       "4 GiB device", 2048 * MiB / div,
                       opt.quick ? TRAIN_BIG_DEVICE_CONF_QUICK : TRAIN_BIG_DEVICE_CONF);
}

/* ==== 2. Pipeline ============================================================= */

enum { P_STAGES = 4, P_BUFS = 4, P_MAX_MB = 64, CH_CAP = 2 };

typedef struct handoff {
  void *ptr;
  size_t size;
  uint64_t tag;
  kern_t *producer; /* its done flag orders the consumer's kernel */
} handoff_t;

typedef struct chan {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  handoff_t item[CH_CAP];
  int head, count;
} chan_t;

static void chan_push(chan_t *c, handoff_t h) {
  pthread_mutex_lock(&c->mu);
  while (c->count == CH_CAP) pthread_cond_wait(&c->cv, &c->mu);
  c->item[(c->head + c->count) % CH_CAP] = h;
  c->count++;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

static handoff_t chan_pop(chan_t *c) {
  pthread_mutex_lock(&c->mu);
  while (c->count == 0) pthread_cond_wait(&c->cv, &c->mu);
  handoff_t h = c->item[c->head];
  c->head = (c->head + 1) % CH_CAP;
  c->count--;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return h;
}

typedef struct pipe_run pipe_run_t;
typedef struct stage {
  pipe_run_t *r;
  int index;
  gma_stream_t stream;
  size_t size[P_BUFS];
  uint64_t blocked_ns, submit_ns;
  uint64_t waits[P_MAX_MB];
  int nwaits, failed;
  kern_t k[P_MAX_MB];
} stage_t;

struct pipe_run {
  gma_t *g;
  int async, micro, run;
  long hold_us;
  chan_t ch[P_STAGES - 1];
  stage_t st[P_STAGES];
};

/* The next micro-batch's buffers: async (submit now, wait later) or sync. */
static void stage_get(stage_t *s, void **ptrs, gma_future_t **fut) {
  pipe_run_t *r = s->r;
  if (r->async) {
    gma_async_options_t o = GMA_ASYNC_OPTIONS_INIT;
    o.timeout_ns = 30000000000ull;
    uint64_t t0 = now_ns();
    OK(gma_alloc_batch_async(r->g, P_BUFS, s->size, s->stream, ptrs, &o, fut));
    s->submit_ns += now_ns() - t0;
  } else {
    uint64_t t0 = now_ns();
    gma_status_t st = gma_alloc_batch(r->g, P_BUFS, s->size, s->stream, ptrs);
    uint64_t dt = now_ns() - t0;
    s->blocked_ns += dt;
    s->waits[s->nwaits++] = dt;
    if (st != GMA_OK) die("gma_alloc_batch", st);
  }
}

static void stage_collect(stage_t *s, gma_future_t *f) {
  if (!f) return;
  void *first;
  uint64_t t0 = now_ns();
  gma_status_t st = gma_future_wait(f, UINT64_MAX, &first);
  uint64_t dt = now_ns() - t0;
  s->blocked_ns += dt;
  s->waits[s->nwaits++] = dt;
  if (st != GMA_OK) die("gma_future_wait", st);
  OK(gma_future_release(f));
}

static void *stage_main(void *arg) {
  stage_t *s = arg;
  pipe_run_t *r = s->r;
  void *cur[P_BUFS], *next[P_BUFS];
  gma_future_t *f = NULL;
  stage_get(s, cur, &f);
  stage_collect(s, f);
  for (int k = 0; k < r->micro; k++) {
    handoff_t in = {0};
    if (s->index > 0) in = chan_pop(&r->ch[s->index - 1]);
    f = NULL;
    if (k + 1 < r->micro) stage_get(s, next, &f); /* while k's buffers are held */
    kern_t *kk = &s->k[k];
    kern_init(kk, in.producer ? &in.producer->done : NULL, r->hold_us);
    if (in.ptr) kern_add(kk->check, &kk->ncheck, in.ptr, in.size, in.tag);
    for (int b = 0; b < P_BUFS; b++)
      kern_add(kk->write, &kk->nwrite, cur[b], s->size[b], mktag(8 + r->async, r->run, k, s->index * 8 + b));
    OK(gma_sim_launch(r->g, s->stream, kern_run, kk));
    if (in.ptr) { /* the producer's buffer was read here: its free waits for it */
      OK(gma_record_stream(r->g, in.ptr, s->stream));
      OK(gma_free(r->g, in.ptr));
    }
    for (int b = 1; b < P_BUFS; b++) OK(gma_free(r->g, cur[b]));
    if (s->index + 1 < P_STAGES)
      chan_push(&r->ch[s->index], (handoff_t){cur[0], s->size[0], kk->write[0].tag, kk});
    else
      OK(gma_free(r->g, cur[0]));
    stage_collect(s, f);
    if (k + 1 < r->micro) memcpy(cur, next, sizeof cur);
  }
  OK(gma_stream_synchronize(r->g, s->stream));
  return NULL;
}

enum { PF_BLOCKED_MS, PF_WAIT_P50_US, PF_WAIT_P99_US, PF_WAIT_MAX_US, PF_MB_PER_S, PF_SUBMIT_MS,
       PF_PEAK_RESERVED, PF_PEAK_ALLOCATED, PF_RES_OVER_ALLOC, PF_XWAITS, PF_N };
static const struct {
  const char *key, *label, *fmt;
} p_fig[PF_N] = {
    {"blocked_ms", "blocked getting buffers, ms (sum)", "%16.2f"},
    {"wait_p50_us", "one wait p50, us", "%16.1f"},
    {"wait_p99_us", "one wait p99, us", "%16.1f"},
    {"wait_max_us", "one wait max, us", "%16.1f"},
    {"micro_batches_per_s", "micro-batches/s", "%16.1f"},
    {"submit_ms", "in gma_alloc_batch_async, ms (sum)", "%16.2f"},
    {"peak_reserved_mib", "peak reserved MiB", "%16.1f"},
    {"peak_allocated_mib", "peak allocated MiB", "%16.1f"},
    {"peak_reserved_over_peak_allocated", "peak reserved / peak allocated", "%16.3f"},
    {"cross_stream_waits", "device-side cross-stream waits", "%16.0f"},
};

static int cmp_u64v(const void *a, const void *b) { return cmp_u64(a, b); }

static void pipe_once(int async, int run, series_t *f, const size_t sizes[P_STAGES][P_BUFS]) {
  pipe_run_t *r = calloc(1, sizeof *r);
  if (!r) die("out of host memory", GMA_ERR_OOM);
  r->g = make(PIPELINE_CONF, opt.extra, NULL, NULL);
  r->async = async;
  r->run = run;
  r->micro = opt.quick ? 8 : 32;
  r->hold_us = opt.quick ? 300 : 1500;
  for (int i = 0; i < P_STAGES - 1; i++) {
    pthread_mutex_init(&r->ch[i].mu, NULL);
    pthread_cond_init(&r->ch[i].cv, NULL);
  }
  for (int i = 0; i < P_STAGES; i++) {
    stage_t *s = &r->st[i];
    s->r = r;
    s->index = i;
    memcpy(s->size, sizes[i], sizeof s->size);
    OK(gma_stream_create(r->g, &s->stream));
  }
  pthread_t th[P_STAGES];
  uint64_t t0 = now_ns();
  for (int i = 0; i < P_STAGES; i++)
    if (pthread_create(&th[i], NULL, stage_main, &r->st[i]) != 0) die("pthread_create", GMA_ERR_INTERNAL);
  for (int i = 0; i < P_STAGES; i++) pthread_join(th[i], NULL);
  double secs = (double)(now_ns() - t0) / 1e9;
  uint64_t all[P_STAGES * (P_MAX_MB + 1)];
  int n = 0;
  uint64_t blocked = 0, submit = 0;
  for (int i = 0; i < P_STAGES; i++) {
    blocked += r->st[i].blocked_ns;
    submit += r->st[i].submit_ns;
    for (int j = 0; j < r->st[i].nwaits; j++) all[n++] = r->st[i].waits[j];
  }
  qsort(all, (size_t)n, sizeof *all, cmp_u64v);
  put(&f[PF_BLOCKED_MS], (double)blocked / 1e6);
  put(&f[PF_WAIT_P50_US], (double)all[(n - 1) / 2] / 1e3);
  put(&f[PF_WAIT_P99_US], (double)all[(int)ceil(0.99 * n) - 1] / 1e3);
  put(&f[PF_WAIT_MAX_US], (double)all[n - 1] / 1e3);
  put(&f[PF_MB_PER_S], r->micro / secs);
  put(&f[PF_SUBMIT_MS], async ? (double)submit / 1e6 : NAN);
  gma_stats_t gs = GMA_STATS_INIT;
  OK(gma_stats(r->g, &gs));
  put(&f[PF_PEAK_RESERVED], (double)gs.reserved.peak / MiB);
  put(&f[PF_PEAK_ALLOCATED], (double)gs.allocated.peak / MiB);
  put(&f[PF_RES_OVER_ALLOC], (double)gs.reserved.peak / (double)gs.allocated.peak);
  put(&f[PF_XWAITS], (double)gs.num_cross_stream_waits);
  for (int i = 0; i < P_STAGES; i++) OK(gma_stream_destroy(r->g, r->st[i].stream));
  for (int i = 0; i < P_STAGES - 1; i++) {
    pthread_mutex_destroy(&r->ch[i].mu);
    pthread_cond_destroy(&r->ch[i].cv);
  }
  OK(gma_destroy(r->g));
  free(r);
}

static void run_pipeline(void) {
  size_t sizes[P_STAGES][P_BUFS];
  uint64_t rng = 0x5eed0002;
  double div = opt.quick ? 4 : 1;
  size_t per_mb = 0;
  for (int i = 0; i < P_STAGES; i++)
    for (int b = 0; b < P_BUFS; b++) {
      /* buffer 0 is the stage's output (4-16 MiB), the rest its own (2-32 MiB) */
      sizes[i][b] = b == 0 ? log_uniform(&rng, 4.0 * MiB / div, 16.0 * MiB / div)
                           : log_uniform(&rng, 2.0 * MiB / div, 32.0 * MiB / div);
      per_mb += sizes[i][b];
    }
  series_t fa[PF_N] = {0}, fs[PF_N] = {0}, ratio = {0};
  long corr0 = atomic_load(&corruptions);
  for (int run = 0; run < opt.runs; run++) {
    uint64_t t0 = now_ns();
    for (int j = 0; j < 2; j++) { /* alternate which goes first */
      int async = (j + run) % 2 == 0;
      pipe_once(async, run, async ? fa : fs, (const size_t(*)[P_BUFS])sizes);
    }
    put(&ratio, fa[PF_BLOCKED_MS].v[run] / fs[PF_BLOCKED_MS].v[run]);
    progress("pipeline", run, t0);
  }
  long corr = atomic_load(&corruptions) - corr0;
  int micro = opt.quick ? 8 : 32;
  printf("\n2. pipeline: %d stages on %d streams, one thread each, %d micro-batches, %d buffers "
         "per stage and micro-batch\n   (%.1f MiB per micro-batch over all stages), kernels %.1f ms; "
         "async: gma_alloc_batch_async + gma_future_wait,\n   sync (baseline): gma_alloc_batch "
         "at the same place\n",
         P_STAGES, P_STAGES, micro, P_BUFS, (double)per_mb / MiB, (opt.quick ? 300 : 1500) / 1e3);
  if (*opt.extra) printf("   --config %s applies to both\n", opt.extra);
  printf("%-40s%16s%16s\n", "(median of runs)", "async", "sync");
  for (int fi = 0; fi < PF_N; fi++) {
    printf("%-40s", p_fig[fi].label);
    print_cell(p_fig[fi].fmt, med(&fa[fi]));
    print_cell(p_fig[fi].fmt, med(&fs[fi]));
    printf("\n");
  }
  printf("%-40s%16.2f\n", "blocked time async / sync", med(&ratio));
  printf("   (blocked: inside gma_future_wait for async, inside gma_alloc_batch for sync, summed "
         "over the stage threads;\n    the ratio is the median of each run's own ratio) "
         "corruptions: %ld\n", corr);
  fprintf(js, "  \"pipeline\": {\"stages\": %d, \"micro_batches\": %d, \"buffers_per_stage\": %d, "
              "\"bytes_per_micro_batch\": %zu, \"kernel_us\": %d, \"corruptions\": %ld, ",
          P_STAGES, micro, P_BUFS, per_mb, opt.quick ? 300 : 1500, corr);
  json_conf("config", PIPELINE_CONF, opt.extra, NULL);
  fprintf(js, "\n   ");
  json_series("blocked_async_over_sync", &ratio, 1);
  fprintf(js, "\n   \"async\": {");
  for (int fi = 0; fi < PF_N; fi++) json_series(p_fig[fi].key, &fa[fi], fi + 1 < PF_N);
  fprintf(js, "},\n   \"sync\": {");
  for (int fi = 0, sep = 0; fi < PF_N; fi++) /* the sync side has no submit time */
    if (fi != PF_SUBMIT_MS) {
      if (sep++) fprintf(js, ", ");
      json_series(p_fig[fi].key, &fs[fi], 0);
    }
  fprintf(js, "}},\n");
}

/* ==== 3. Service under pressure ================================================ */

enum { SV_THREADS = 2, SV_MAX_BURSTS = 5, SV_MAX_REQ = 4096, SV_REQ_BUFS = 4 };
static const int sv_burst_mib[SV_MAX_BURSTS] = {256, 384, 200, 400, 320}; /* peak live */

typedef struct pressure_log {
  atomic_int burst;            /* the burst (with its idle period) now running */
  atomic_uint mask[SV_MAX_BURSTS]; /* 1 << level for every level cb was called with */
  atomic_int calls;
} pressure_log_t;

static void on_pressure(gma_t *g, gma_pressure_t level, void *user) {
  pressure_log_t *l = user;
  int b = atomic_load(&l->burst);
  if (b >= 0 && b < SV_MAX_BURSTS) atomic_fetch_or(&l->mask[b], 1u << level);
  atomic_fetch_add(&l->calls, 1);
}

typedef struct sv_req {
  void *p[SV_REQ_BUFS];
  size_t size[SV_REQ_BUFS];
  int n;
  size_t bytes;
  kern_t w, v; /* stamp when served, check when the response is done */
} sv_req_t;

typedef struct sv_thread {
  gma_t *g;
  gma_stream_t stream;
  int index, burst, run, base;
  uint64_t window, volume, seed;
  int failed, nreq;
  uint64_t last_free_ns;
  sv_req_t *req; /* SV_MAX_REQ */
} sv_thread_t;

static void sv_retire(sv_thread_t *t, sv_req_t *q) {
  kern_init(&q->v, NULL, 0);
  for (int i = 0; i < q->n; i++) kern_add(q->v.check, &q->v.ncheck, q->w.write[i].p, q->size[i], q->w.write[i].tag);
  OK(gma_sim_launch(t->g, t->stream, kern_run, &q->v));
  for (int i = 0; i < q->n; i++)
    if (q->p[i]) OK(gma_free(t->g, q->p[i]));
  t->last_free_ns = now_ns();
}

/* One burst on one thread: requests of 1-4 buffers (a third of them small,
 * 4 KiB - 1 MiB; the rest 1-32 MiB) until volume bytes were served, the
 * oldest retired whenever more than window bytes are live; then the rest,
 * and the stream is synchronized (responses go back to clients). */
static void *sv_main(void *arg) {
  sv_thread_t *t = arg;
  uint64_t rng = t->seed;
  uint64_t live = 0, served = 0;
  int oldest = 0;
  t->nreq = 0;
  long hold = opt.quick ? 20 : 100;
  while (served < t->volume && t->nreq < SV_MAX_REQ) {
    sv_req_t *q = &t->req[t->nreq];
    memset(q, 0, sizeof *q);
    q->n = 1 + (int)(xorshift(&rng) % SV_REQ_BUFS);
    kern_init(&q->w, NULL, hold);
    double div = opt.quick ? 8 : 1;
    for (int i = 0; i < q->n; i++) {
      q->size[i] = xorshift(&rng) % 3 == 0 ? log_uniform(&rng, 4.0 * KiB, 1.0 * MiB)
                                           : log_uniform(&rng, 1.0 * MiB / div, 32.0 * MiB / div);
      gma_status_t st = gma_alloc(t->g, q->size[i], t->stream, &q->p[i]);
      if (st == GMA_ERR_OOM) {
        t->failed++;
        q->p[i] = NULL;
      } else if (st != GMA_OK) {
        die("gma_alloc", st);
      } else {
        q->bytes += q->size[i];
      }
      kern_add(q->w.write, &q->w.nwrite, q->p[i], q->size[i],
               mktag(12 + t->base, t->run, t->burst * SV_MAX_REQ + t->nreq, t->index * 8 + i));
    }
    OK(gma_sim_launch(t->g, t->stream, kern_run, &q->w));
    t->nreq++;
    live += q->bytes;
    served += q->bytes + (q->bytes == 0 ? 1 * MiB : 0); /* failures still count as progress */
    while (live > t->window && oldest < t->nreq) {
      live -= t->req[oldest].bytes;
      sv_retire(t, &t->req[oldest++]);
    }
  }
  while (oldest < t->nreq) sv_retire(t, &t->req[oldest++]);
  OK(gma_stream_synchronize(t->g, t->stream));
  return NULL;
}

enum { SF_MS, SF_INTERVALS, SF_FAILED, SF_RESERVED_MIB, SF_N };
static const struct {
  const char *key;
} sv_fig[SF_N] = {{"to_threshold_ms"}, {"to_threshold_intervals"}, {"failed_allocs"},
                  {"reserved_at_burst_end_mib"}};

typedef struct sv_side {
  series_t f[SV_MAX_BURSTS][SF_N];
  unsigned levels[SV_MAX_BURSTS]; /* union over runs */
  series_t calls;
} sv_side_t;

static void service_once(int base, int run, int bursts, sv_side_t *side) {
  const char *conf = opt.quick ? SERVICE_CONF_QUICK : SERVICE_CONF;
  gma_config_t cfg;
  gma_t *g = make(conf, opt.extra, NULL, &cfg);
  uint64_t threshold = cfg.release_threshold;
  double interval_ms = (double)cfg.trim_interval_ms;
  pressure_log_t *log = calloc(1, sizeof *log);
  if (!log) die("out of host memory", GMA_ERR_OOM);
  OK(gma_set_pressure_callback(g, on_pressure, log));
  sv_thread_t t[SV_THREADS];
  for (int i = 0; i < SV_THREADS; i++) {
    memset(&t[i], 0, sizeof t[i]);
    t[i].g = g;
    t[i].index = i;
    t[i].run = run;
    t[i].base = base;
    t[i].req = malloc(SV_MAX_REQ * sizeof *t[i].req);
    if (!t[i].req) die("out of host memory", GMA_ERR_OOM);
    OK(gma_stream_create(g, &t[i].stream));
  }
  uint64_t div = opt.quick ? 8 : 1;
  for (int b = 0; b < bursts; b++) {
    atomic_store(&log->burst, b);
    pthread_t th[SV_THREADS];
    for (int i = 0; i < SV_THREADS; i++) {
      t[i].burst = b;
      t[i].window = (uint64_t)sv_burst_mib[b] * MiB / div / SV_THREADS;
      t[i].volume = 2 * t[i].window;
      t[i].seed = 0x5eed0003 + (uint64_t)b * 16 + (uint64_t)i; /* the same bursts every run */
      t[i].failed = 0;
      if (pthread_create(&th[i], NULL, sv_main, &t[i]) != 0) die("pthread_create", GMA_ERR_INTERNAL);
    }
    int failed = 0;
    uint64_t end = 0;
    for (int i = 0; i < SV_THREADS; i++) {
      pthread_join(th[i], NULL);
      failed += t[i].failed;
      if (t[i].last_free_ns > end) end = t[i].last_free_ns;
    }
    gma_stats_t s = GMA_STATS_INIT;
    OK(gma_stats(g, &s));
    double reserved_end = (double)s.reserved.current / MiB;
    if (base) OK(gma_empty_cache(g));
    /* Poll every ms until reserved <= threshold, for at least 4 intervals
     * of idleness (plus a seeded 0-1 interval, so that bursts end at any
     * point of the worker's tick, not at one phase of it every time) and at
     * most 20. */
    uint64_t jr = 0x5eed0004 + (uint64_t)run * 64 + (uint64_t)b;
    double idle_ms = (4 + (double)(xorshift(&jr) % 1000) / 1000) * interval_ms;
    double took = INFINITY;
    for (;;) {
      OK(gma_stats(g, &s));
      double el = (double)(now_ns() - end) / 1e6;
      if (isinf(took) && s.reserved.current <= threshold) took = el;
      if (el >= 20 * interval_ms || (!isinf(took) && el >= idle_ms)) break;
      sleep_us(1000);
    }
    put(&side->f[b][SF_MS], took);
    put(&side->f[b][SF_INTERVALS], took / interval_ms);
    put(&side->f[b][SF_FAILED], failed);
    put(&side->f[b][SF_RESERVED_MIB], reserved_end);
  }
  OK(gma_set_pressure_callback(g, NULL, NULL));
  for (int b = 0; b < bursts; b++) side->levels[b] |= atomic_load(&log->mask[b]);
  put(&side->calls, atomic_load(&log->calls));
  for (int i = 0; i < SV_THREADS; i++) {
    OK(gma_stream_destroy(g, t[i].stream));
    free(t[i].req);
  }
  OK(gma_destroy(g));
  free(log);
}

static const char *levels_str(unsigned m, char *buf, size_t len) {
  static const char *const names[4] = {"low", "medium", "high", "critical"};
  buf[0] = '\0';
  for (int l = 0; l < 4; l++)
    if (m & (1u << l)) {
      if (buf[0]) strncat(buf, ",", len - strlen(buf) - 1);
      strncat(buf, names[l], len - strlen(buf) - 1);
    }
  if (!buf[0]) snprintf(buf, len, "none");
  return buf;
}

static void run_service(void) {
  int bursts = opt.quick ? 2 : SV_MAX_BURSTS;
  const char *conf = opt.quick ? SERVICE_CONF_QUICK : SERVICE_CONF;
  gma_config_t cfg = GMA_CONFIG_INIT;
  OK(gma_config_parse(&cfg, conf));
  if (*opt.extra) OK(gma_config_parse(&cfg, opt.extra));
  static sv_side_t side[2]; /* 0: timed trim, 1: gma_empty_cache after each burst */
  memset(side, 0, sizeof side);
  long corr0 = atomic_load(&corruptions);
  for (int run = 0; run < opt.runs; run++) {
    uint64_t t0 = now_ns();
    for (int j = 0; j < 2; j++) {
      int base = (j + run) % 2;
      service_once(base, run, bursts, &side[base]);
    }
    progress("service", run, t0);
  }
  long corr = atomic_load(&corruptions) - corr0;
  uint64_t div = opt.quick ? 8 : 1;
  printf("\n3. service under pressure: %d threads on their own streams, %d bursts, each serving "
         "twice its peak in\n   requests of 1-%d buffers (4 KiB - 32 MiB), then idle (4-5 trim "
         "intervals); config %s%s%s\n   baseline: the same, and the program calls gma_empty_cache "
         "right after each burst\n",
         SV_THREADS, bursts, SV_REQ_BUFS, conf, *opt.extra ? "," : "", opt.extra);
  printf("   time from the burst's last free until reserved <= release_threshold (%.0f MiB), "
         "trim interval %llu ms\n",
         (double)cfg.release_threshold / MiB, (unsigned long long)cfg.trim_interval_ms);
  printf("%-6s%10s%14s%12s%12s%14s%10s%10s  %s\n", "burst", "peak MiB", "reserved MiB",
         "timed ms", "intervals", "empty_cache", "failed", "failed", "pressure levels seen");
  printf("%-6s%10s%14s%12s%12s%14s%10s%10s  %s\n", "", "(live)", "(at end)", "", "", "ms",
         "timed", "base", "(timed / baseline, all runs)");
  for (int b = 0; b < bursts; b++) {
    char l0[64], l1[64];
    printf("%-6d%10llu", b + 1, (unsigned long long)(sv_burst_mib[b] / div));
    print_cell("%14.1f", med(&side[0].f[b][SF_RESERVED_MIB]));
    print_cell("%12.1f", med(&side[0].f[b][SF_MS]));
    print_cell("%12.2f", med(&side[0].f[b][SF_INTERVALS]));
    print_cell("%14.1f", med(&side[1].f[b][SF_MS]));
    print_cell("%10.0f", med(&side[0].f[b][SF_FAILED]));
    print_cell("%10.0f", med(&side[1].f[b][SF_FAILED]));
    printf("  %s / %s\n", levels_str(side[0].levels[b], l0, sizeof l0),
           levels_str(side[1].levels[b], l1, sizeof l1));
  }
  printf("   (never: not within 20 intervals; pressure levels: every level the callback was "
         "called with during the burst\n    and its idle period) corruptions: %ld\n", corr);
  fprintf(js, "  \"service\": {\"threads\": %d, \"bursts\": %d, \"release_threshold\": %llu, "
              "\"trim_interval_ms\": %llu, \"corruptions\": %ld, ",
          SV_THREADS, bursts, (unsigned long long)cfg.release_threshold,
          (unsigned long long)cfg.trim_interval_ms, corr);
  json_conf("config", conf, opt.extra, NULL);
  fprintf(js, "\n");
  for (int sd = 0; sd < 2; sd++) {
    fprintf(js, "   \"%s\": {", sd == 0 ? "timed_trim" : "empty_cache_baseline");
    json_series("pressure_callback_calls", &side[sd].calls, 1);
    fprintf(js, "\"bursts\": [\n");
    for (int b = 0; b < bursts; b++) {
      char l[64];
      fprintf(js, "     {\"burst\": %d, \"peak_live_mib\": %llu, \"pressure_levels\": \"%s\", ",
              b + 1, (unsigned long long)(sv_burst_mib[b] / div),
              levels_str(side[sd].levels[b], l, sizeof l));
      for (int fi = 0; fi < SF_N; fi++) json_series(sv_fig[fi].key, &side[sd].f[b][fi], fi + 1 < SF_N);
      fprintf(js, "}%s\n", b + 1 < bursts ? "," : "");
    }
    fprintf(js, "   ]}%s\n", sd == 0 ? "," : "");
  }
  fprintf(js, "  },\n");
}

/* ==== 4. Iterations that differ: a varying sequence length ==================== */

/* The training step of scenario 1, but every iteration's sequence length
 * (seeded) scales its batch (input, labels, mask), activations, workspaces
 * and output gradients by seq / 2048; the weight gradients, all-reduce
 * buckets and loss keep their size. At 2048 the step is scenario 1's (344
 * MiB requested; 43 MiB under --quick). Two columns, plan:off (the default
 * config) and plan:on, run one after the other in each run, in alternating
 * order, so drift in the machine hits both alike; --config applies to the
 * plan:off column, as to the training loop's default column. Issue 18's
 * criterion: plan:on must not cost memory or time where no plan can be
 * made (the planner keeps learning, verifying and backing off). */

enum { VS_MAX_ITERS = 64, VS_MIN = 128, VS_MAX = 2048, VS_STEP = 64, VS_COLS = 2, VS_VARIANTS = 3 };
#define VARY_OFF_CONF "" /* column 1: the default config */
#define VARY_ON_CONF "plan:on"
static const int vs_buckets[4] = {512, 1024, 512, 2048}; /* 4b: cycled in this order */
static const int vs_random_buckets[4] = {256, 512, 1024, 2048}; /* 4c: drawn (seeded) */
static const char *const vs_key[VS_VARIANTS] = {"varying", "varying_buckets", "varying_buckets_random"};
static const char *const vs_seq[VS_VARIANTS] = {"uniform 128..2048 step 64, seeded per run",
                                                "512,1024,512,2048 cycled",
                                                "uniform from 256,512,1024,2048, seeded per run"};

/* Extra figures of the varying scenario (besides tr_fig's). */
enum { VF_GMA_US, VF_GMA_US_LEARN, VF_GMA_US_IDLE, VF_MARK_US, VF_LEARN_ITERS, VF_ACTIVATIONS,
       VF_ACT_MARK_US, VF_ACT_NEXT_US, VF_ARENA_MAX, VF_PLANNED_ITERS, VF_MS_PLANNED, VF_MS_OTHER,
       VF_XWAITS, VF_EQUAL_PAIRS, VF_CORRUPTIONS, VF_N };
static const struct {
  const char *key, *label, *fmt;
} vs_fig[VF_N] = {
    {"gma_us_per_iteration", "host us in alloc/free/record, mean/it", "%16.1f"},
    {"gma_us_learning_iteration_median", "  median it., recorded by the planner", "%16.1f"},
    {"gma_us_other_iteration_median", "  median it., not recorded", "%16.1f"},
    {"mark_us_per_iteration", "host us in gma_iteration_mark, mean", "%16.1f"},
    {"learning_iterations", "iterations recorded by the planner", "%16.0f"},
    {"plan_activations", "plans made active", "%16.0f"},
    {"activating_mark_us", "  us in the mark that activated it", "%16.1f"},
    {"first_planned_iteration_gma_us", "  host us in gma calls, next iter.", "%16.1f"},
    {"plan_arena_max_mib", "plan: largest arena held, MiB", "%16.1f"},
    {"planned_iterations", "iterations served by an active plan", "%16.0f"},
    {"iteration_ms_planned_median", "  ms per iteration, median: those", "%16.1f"},
    {"iteration_ms_other_median", "  ms per iteration, median: others", "%16.1f"},
    {"cross_stream_waits_after_warmup", "device-side cross-stream waits", "%16.0f"},
    {"equal_consecutive_lengths", "consecutive equal lengths", "%16.0f"},
    {"corruptions", "corruptions", "%16.0f"},
};
/* tr_fig rows the table prints, in this order (the JSON has them all). */
static const int vs_rows[] = {TF_PEAK_RESERVED, TF_PEAK_ALLOCATED, TF_RATIO, TF_ITERS,
                              TF_DEV_AFTER, TF_DEV_FIRST, TF_PLAN_STATE, TF_PLAN_ARENA,
                              TF_PLAN_HITS, TF_PLAN_MISSES, TF_PLAN_REPLANS, TF_MARK_FAILED};

typedef struct vary_col {
  const char *name, *conf;
  series_t f[TF_N], x[VF_N];
} vary_col_t;

/* Scenario 1's sizes at sequence length seq. */
static void vary_plan(train_plan_t *out, const train_plan_t *base, int seq) {
  *out = *base;
  out->total = 0;
  out->smallest = SIZE_MAX;
  out->largest = 0;
  for (int i = 0; i < TR_SLOTS; i++) {
    int scales = i <= SL_MASK || (i >= SL_ACT && i < SL_LOSS) || (i >= SL_GIN && i < SL_WG);
    if (scales) {
      size_t v = (size_t)((double)base->size[i] * seq / VS_MAX);
      out->size[i] = v < 512 ? 512 : v;
    }
    out->total += out->size[i];
    if (out->size[i] < out->smallest) out->smallest = out->size[i];
    if (out->size[i] > out->largest) out->largest = out->size[i];
  }
}

/* The sequence lengths of one run: variant 0 (4a) draws each uniformly
 * from 128..2048 in steps of 64 (seeded per run; two consecutive lengths
 * are equal now and then, 1 in 31, as in a real loader); variant 1 (4b)
 * cycles vs_buckets (never two equal in a row); variant 2 (4c) draws from
 * vs_random_buckets (a quarter of consecutive pairs equal: a plan gets made
 * and dropped again and again). Returns the equal consecutive pairs. */
static int vary_lengths(int variant, int run, int n, int *seq) {
  uint64_t rng = 0x5eed0005 + (uint64_t)run * 0x9e3779b9ull;
  int eq = 0;
  for (int i = 0; i < n; i++) {
    seq[i] = variant == 0   ? VS_MIN + VS_STEP * (int)(xorshift(&rng) % ((VS_MAX - VS_MIN) / VS_STEP + 1))
             : variant == 1 ? vs_buckets[i % 4]
                            : vs_random_buckets[xorshift(&rng) % 4];
    if (i && seq[i] == seq[i - 1]) eq++;
  }
  return eq;
}

static void vary_once(int variant, vary_col_t *col, int colno, int run, const int *seq,
                      int iterations, int equal_pairs, const train_plan_t *base, long hold_us) {
  long corr0 = atomic_load(&corruptions);
  train_ctx_t *c = calloc(1, sizeof *c);
  if (!c) die("out of host memory", GMA_ERR_OOM);
  gma_config_t cfg;
  c->g = make(col->conf, colno == 0 ? opt.extra : NULL, NULL, &cfg);
  c->plan = cfg.plan;
  c->hold_us = hold_us;
  c->run = run;
  c->col = colno;
  c->tagscen = 14 + variant * 2 + colno; /* 14..19: no other scenario's */
  c->timed = 1;
  for (int s = 0; s < TR_STREAMS; s++) OK(gma_stream_create(c->g, &c->s[s]));
  gma_stats_t one = GMA_STATS_INIT, w = GMA_STATS_INIT, e = GMA_STATS_INIT;
  train_plan_t cur;
  uint64_t gma_all = 0, mark_all = 0;
  double learn_us[VS_MAX_ITERS], idle_us[VS_MAX_ITERS], planned_ms[VS_MAX_ITERS],
      other_ms[VS_MAX_ITERS];
  int n_learn = 0, n_idle = 0, n_planned = 0, n_other = 0, activations = 0, act_next = 0;
  uint64_t arena_max = 0;
  uint64_t t0 = 0;
  for (int i = 0; i < iterations; i++) {
    if (i == TR_WARMUP) {
      OK(gma_stats(c->g, &w));
      t0 = now_ns();
    }
    vary_plan(&cur, base, seq[i]);
    c->pl = &cur;
    int before = c->state_after; /* the state this iteration's requests meet */
    c->gma_ns = c->mark_ns = 0;
    uint64_t i0 = now_ns();
    train_iteration(c, i);
    double ms = (double)(now_ns() - i0) / 1e6;
    if (i == 0) OK(gma_stats(c->g, &one));
    if (act_next) /* the first iteration a new plan serves (only the first plan's) */
      put(&col->x[VF_ACT_NEXT_US], (double)c->gma_ns / 1e3);
    act_next = 0;
    if (c->arena_after > arena_max) arena_max = c->arena_after;
    if (c->state_after == 4 && before != 4 && !activations++) {
      put(&col->x[VF_ACT_MARK_US], (double)c->mark_ns / 1e3);
      act_next = 1;
    }
    if (i < TR_WARMUP) continue;
    gma_all += c->gma_ns;
    mark_all += c->mark_ns;
    if (before == 1 || before == 2) learn_us[n_learn++] = (double)c->gma_ns / 1e3;
    else idle_us[n_idle++] = (double)c->gma_ns / 1e3;
    if (before == 4) planned_ms[n_planned++] = ms;
    else other_ms[n_other++] = ms;
  }
  /* The timed loop includes the per-iteration gma_stats and the clock reads
   * (both columns alike). */
  double secs = (double)(now_ns() - t0) / 1e9;
  OK(gma_stats(c->g, &e));
  tr_put_figures(c, col->f, &one, &w, &e, iterations, secs);
  int timed_iters = iterations - TR_WARMUP;
  put(&col->x[VF_GMA_US], (double)gma_all / 1e3 / timed_iters);
  /* Medians over the iterations: one descheduled iteration of the 2-core VM
   * (milliseconds) would swamp a mean of tens of us. Runs with none of a
   * kind add nothing to the series (its JSON "runs" may be shorter). */
  series_t it = {0};
  for (int i = 0; i < n_learn; i++) put(&it, learn_us[i]);
  if (n_learn) put(&col->x[VF_GMA_US_LEARN], med(&it));
  it.n = 0;
  for (int i = 0; i < n_idle; i++) put(&it, idle_us[i]);
  if (n_idle) put(&col->x[VF_GMA_US_IDLE], med(&it));
  it.n = 0;
  for (int i = 0; i < n_planned; i++) put(&it, planned_ms[i]);
  if (n_planned) put(&col->x[VF_MS_PLANNED], med(&it));
  it.n = 0;
  for (int i = 0; i < n_other; i++) put(&it, other_ms[i]);
  if (n_other) put(&col->x[VF_MS_OTHER], med(&it));
  put(&col->x[VF_PLANNED_ITERS], n_planned);
  put(&col->x[VF_XWAITS], (double)(e.num_cross_stream_waits - w.num_cross_stream_waits));
  put(&col->x[VF_MARK_US], (double)mark_all / 1e3 / timed_iters);
  put(&col->x[VF_LEARN_ITERS], n_learn);
  put(&col->x[VF_ARENA_MAX], (double)arena_max / MiB);
  put(&col->x[VF_ACTIVATIONS], activations);
  put(&col->x[VF_EQUAL_PAIRS], equal_pairs);
  for (int s = 0; s < TR_STREAMS; s++) OK(gma_stream_destroy(c->g, c->s[s]));
  OK(gma_destroy(c->g));
  free(c);
  put(&col->x[VF_CORRUPTIONS], (double)(atomic_load(&corruptions) - corr0));
}

static double ratio_of(double a, double b) { return b ? a / b : NAN; }

static void run_varying_variant(int variant) {
  const char *key = vs_key[variant];
  int iterations = opt.quick ? 8 : 50;
  long hold_us = opt.quick ? 20 : 3000; /* as the training loop */
  uint64_t div = opt.quick ? 8 : 1;
  train_plan_t base;
  train_plan(&base, 344 * MiB / div);
  train_plan_t lo, hi;
  vary_plan(&lo, &base, variant == 0 ? VS_MIN : variant == 1 ? 512 : 256);
  vary_plan(&hi, &base, VS_MAX);
  vary_col_t cols[VS_COLS] = {{.name = "plan:off", .conf = VARY_OFF_CONF},
                              {.name = "plan:on", .conf = VARY_ON_CONF}};
  series_t r_res = {0}, r_ips = {0}; /* per-run ratios, plan:on / plan:off */
  long corr0 = atomic_load(&corruptions);
  for (int run = 0; run < opt.runs; run++) {
    uint64_t t0 = now_ns();
    int seq[VS_MAX_ITERS];
    int eq = vary_lengths(variant, run, iterations, seq);
    for (int j = 0; j < VS_COLS; j++) { /* alternating order: off first in even runs */
      int ci = (j + run) % VS_COLS;
      vary_once(variant, &cols[ci], ci, run, seq, iterations, eq, &base, hold_us);
    }
    int n0 = cols[0].f[TF_PEAK_RESERVED].n - 1, n1 = cols[1].f[TF_PEAK_RESERVED].n - 1;
    put(&r_res, ratio_of(cols[1].f[TF_PEAK_RESERVED].v[n1], cols[0].f[TF_PEAK_RESERVED].v[n0]));
    put(&r_ips, ratio_of(cols[1].f[TF_ITERS].v[n1], cols[0].f[TF_ITERS].v[n0]));
    progress(key, run, t0);
  }
  long corr = atomic_load(&corruptions) - corr0;
  if (variant == 0)
    printf("\n4a. varying sequence length: the training step with batch, activations, workspaces "
           "and output\n    gradients scaled by seq/%d, seq drawn per iteration from %d..%d in "
           "steps of %d (seeded per run)\n", VS_MAX, VS_MIN, VS_MAX, VS_STEP);
  else if (variant == 1)
    printf("\n4b. bucketed sequence length: the same step, seq cycling %d,%d,%d,%d (never two "
           "equal in a row)\n", vs_buckets[0], vs_buckets[1], vs_buckets[2], vs_buckets[3]);
  else
    printf("\n4c. bucketed sequence length drawn at random: the same step, seq drawn from "
           "%d,%d,%d,%d (seeded per run;\n    a quarter of consecutive pairs equal, so plans "
           "are made and dropped)\n", vs_random_buckets[0], vs_random_buckets[1],
           vs_random_buckets[2], vs_random_buckets[3]);
  printf("   %d iterations, %.1f .. %.1f MiB requested per iteration, one host synchronization "
         "per iteration,\n   gma_iteration_mark and gma_stats after each; plan:off and plan:on "
         "run one after the other\n",
         iterations, (double)lo.total / MiB, (double)hi.total / MiB);
  if (*opt.extra) printf("   --config %s applies to the plan:off column\n", opt.extra);
  printf("%-38s%16s%16s\n", "(median of runs)", cols[0].name, cols[1].name);
  for (size_t ri = 0; ri < sizeof vs_rows / sizeof vs_rows[0]; ri++) {
    int fi = vs_rows[ri];
    char fmt[16];
    snprintf(fmt, sizeof fmt, "%%16%s", strchr(tr_fig[fi].fmt, '.'));
    printf("%-38s", tr_fig[fi].label);
    for (int i = 0; i < VS_COLS; i++) print_cell(fmt, med(&cols[i].f[fi]));
    printf("\n");
  }
  for (int xi = 0; xi < VF_N; xi++) {
    if (xi == VF_EQUAL_PAIRS && variant == 1) continue;
    printf("%-38s", vs_fig[xi].label);
    for (int i = 0; i < VS_COLS; i++) print_cell(vs_fig[xi].fmt, med(&cols[i].x[xi]));
    printf("\n");
  }
  double res = ratio_of(med(&cols[1].f[TF_PEAK_RESERVED]), med(&cols[0].f[TF_PEAK_RESERVED]));
  double ips = ratio_of(med(&cols[1].f[TF_ITERS]), med(&cols[0].f[TF_ITERS]));
  double rlo = INFINITY, rhi = -INFINITY, ilo = INFINITY, ihi = -INFINITY;
  for (int i = 0; i < r_res.n; i++) {
    rlo = fmin(rlo, r_res.v[i]), rhi = fmax(rhi, r_res.v[i]);
    ilo = fmin(ilo, r_ips.v[i]), ihi = fmax(ihi, r_ips.v[i]);
  }
  printf("   plan:on / plan:off: peak reserved %.3fx, iterations/s %.3fx (ratios of the medians; "
         "per-run ratios %.3f-%.3f and %.3f-%.3f)\n   corruptions: %ld\n",
         res, ips, rlo, rhi, ilo, ihi, corr);

  fprintf(js, "  \"%s\": {\"streams\": 3, \"buffers_per_iteration\": %d, \"iterations\": %d, "
              "\"warmup_iterations\": %d, \"sequence\": \"%s\", \"requested_per_iteration_min\": "
              "%zu, \"requested_per_iteration_max\": %zu, \"corruptions\": %ld,\n",
          key, TR_SLOTS, iterations, TR_WARMUP,
          vs_seq[variant],
          lo.total, hi.total, corr);
  fprintf(js, "   \"plan_on_over_off\": {\"peak_reserved\": ");
  json_num(res);
  fprintf(js, ", \"iterations_per_s\": ");
  json_num(ips);
  fprintf(js, ", ");
  json_series("peak_reserved_per_run", &r_res, 1);
  json_series("iterations_per_s_per_run", &r_ips, 0);
  fprintf(js, "},\n   \"columns\": [\n");
  for (int i = 0; i < VS_COLS; i++) {
    fprintf(js, "    {\"name\": \"%s\", ", cols[i].name);
    json_conf("config", cols[i].conf, i == 0 ? opt.extra : NULL, NULL);
    for (int fi = 0; fi < TF_N; fi++) json_series(tr_fig[fi].key, &cols[i].f[fi], 1);
    for (int xi = 0; xi < VF_N; xi++) json_series(vs_fig[xi].key, &cols[i].x[xi], xi + 1 < VF_N);
    fprintf(js, "}%s\n", i + 1 < VS_COLS ? "," : "");
  }
  fprintf(js, "   ]},\n");
}

static void run_varying(void) {
  for (int v = 0; v < VS_VARIANTS; v++) run_varying_variant(v);
}

/* ==== 5. Cross-stream hand-off, the host far ahead ============================ */

/* Every buffer allocated on stream A is written there and read by a slower
 * kernel on stream B (ordered by gma_stream_wait_stream), then recorded on B
 * and freed: its memory may serve A again only once B is done with it. The
 * host queues a whole batch before it synchronizes. B's kernel checks the
 * tag, holds, and checks again: a block reused while B held it shows. */
enum { CX_BATCHES = 10, CX_PER_BATCH = 500, CX_HOLD_US = 20, CX_COLS = 3 };
enum { CF_PEAK_RESERVED, CF_PEAK_ALLOCATED, CF_RATIO, CF_DEV, CF_XWAITS, CF_ALLOCS_PER_S,
       CF_FAILED, CF_CORRUPTIONS, CF_N };
static const struct {
  const char *key, *label, *fmt;
} cx_fig[CF_N] = {
    {"peak_reserved_mib", "peak reserved MiB", "%26.1f"},
    {"peak_allocated_mib", "peak allocated MiB", "%26.1f"},
    {"peak_reserved_over_peak_allocated", "peak reserved / peak allocated", "%26.2f"},
    {"device_allocs", "device allocations", "%26.0f"},
    {"cross_stream_waits", "device-side cross-stream waits", "%26.0f"},
    {"allocs_per_s", "allocations/s", "%26.0f"},
    {"failed_allocs", "failed allocations", "%26.0f"},
    {"corruptions", "corruptions", "%26.0f"},
};

typedef struct cross_col {
  const char *name, *conf;
  series_t f[CF_N];
} cross_col_t;

static void kern_read_hold(void *arg) { /* check, hold, check again */
  kern_t *k = arg;
  kern_run(k);
  for (int i = 0; i < k->ncheck; i++) check(&k->check[i]);
}

static void cross_once(cross_col_t *col, int colno, int run, int batches, int per_batch,
                       kern_t *k) {
  long corr0 = atomic_load(&corruptions);
  gma_t *g = make(col->conf, colno == 0 ? opt.extra : NULL, NULL, NULL);
  gma_stream_t a, b;
  OK(gma_stream_create(g, &a));
  OK(gma_stream_create(g, &b));
  uint64_t rng = 0x5eed0006, failed = 0; /* the same sizes in every run and column */
  uint64_t t0 = now_ns();
  for (int bt = 0; bt < batches; bt++) {
    for (int i = 0; i < per_batch; i++) {
      size_t size = log_uniform(&rng, 64.0 * KiB, 4.0 * MiB);
      void *p = NULL;
      gma_status_t st = gma_alloc(g, size, a, &p);
      if (st == GMA_ERR_OOM) {
        failed++;
        continue;
      }
      if (st != GMA_OK) die("gma_alloc", st);
      uint64_t tag = mktag(20 + colno, run, bt, i);
      kern_t *kw = &k[2 * i], *kr = &k[2 * i + 1];
      kern_init(kw, NULL, 0);
      kern_add(kw->write, &kw->nwrite, p, size, tag);
      OK(gma_sim_launch(g, a, kern_run, kw));
      OK(gma_stream_wait_stream(g, b, a));
      kern_init(kr, NULL, CX_HOLD_US);
      kern_add(kr->check, &kr->ncheck, p, size, tag);
      OK(gma_sim_launch(g, b, kern_read_hold, kr));
      OK(gma_record_stream(g, p, b));
      OK(gma_free(g, p));
    }
    OK(gma_stream_synchronize(g, a));
    OK(gma_stream_synchronize(g, b));
  }
  double secs = (double)(now_ns() - t0) / 1e9;
  gma_stats_t s = GMA_STATS_INIT;
  OK(gma_stats(g, &s));
  series_t *f = col->f;
  put(&f[CF_PEAK_RESERVED], (double)s.reserved.peak / MiB);
  put(&f[CF_PEAK_ALLOCATED], (double)s.allocated.peak / MiB);
  put(&f[CF_RATIO], s.allocated.peak ? (double)s.reserved.peak / (double)s.allocated.peak : NAN);
  put(&f[CF_DEV], (double)s.num_device_allocs);
  put(&f[CF_XWAITS], (double)s.num_cross_stream_waits);
  put(&f[CF_ALLOCS_PER_S], (double)batches * per_batch / secs);
  put(&f[CF_FAILED], (double)failed);
  OK(gma_stream_destroy(g, a));
  OK(gma_stream_destroy(g, b));
  OK(gma_destroy(g));
  put(&f[CF_CORRUPTIONS], (double)(atomic_load(&corruptions) - corr0));
}

static void run_cross(void) {
  int batches = opt.quick ? 2 : CX_BATCHES, per_batch = opt.quick ? 100 : CX_PER_BATCH;
  cross_col_t cols[CX_COLS] = {{.name = "default (reuse:auto)", .conf = CROSS_DEFAULT_CONF},
                               {.name = "reuse:query (baseline)", .conf = CROSS_BASE_CONF},
                               {.name = CROSS_WAIT_CONF, .conf = CROSS_WAIT_CONF}};
  kern_t *k = calloc(2 * (size_t)per_batch, sizeof *k); /* one batch's; reused after the sync */
  if (!k) die("out of host memory", GMA_ERR_OOM);
  long corr0 = atomic_load(&corruptions);
  for (int run = 0; run < opt.runs; run++) {
    uint64_t t0 = now_ns();
    for (int j = 0; j < CX_COLS; j++) { /* rotate which goes first */
      int ci = (j + run) % CX_COLS;
      cross_once(&cols[ci], ci, run, batches, per_batch, k);
    }
    progress("cross", run, t0);
  }
  free(k);
  long corr = atomic_load(&corruptions) - corr0;
  printf("\n5. cross-stream hand-off: stream A allocates and writes, stream B waits for A "
         "(gma_stream_wait_stream) and\n   reads in %d us kernels, then gma_record_stream(ptr, B) "
         "and gma_free; %d batches of %d allocations\n   (64 KiB - 4 MiB, log-uniform, seeded), "
         "both streams synchronized after each batch\n   baseline: reuse:query (never a "
         "device-side wait)\n",
         CX_HOLD_US, batches, per_batch);
  if (*opt.extra) printf("   --config %s applies to the default column\n", opt.extra);
  printf("%-32s", "(median of runs)");
  for (int i = 0; i < CX_COLS; i++) printf("%26s", cols[i].name);
  printf("\n");
  for (int fi = 0; fi < CF_N; fi++) {
    printf("%-32s", cx_fig[fi].label);
    for (int i = 0; i < CX_COLS; i++) print_cell(cx_fig[fi].fmt, med(&cols[i].f[fi]));
    printf("\n");
  }
  printf("   corruptions: %ld\n", corr);
  fprintf(js, "  \"cross\": {\"batches\": %d, \"allocations_per_batch\": %d, \"smallest\": %zu, "
              "\"largest\": %zu, \"b_kernel_us\": %d, \"corruptions\": %ld,\n   \"columns\": [\n",
          batches, per_batch, 64 * KiB, 4 * MiB, CX_HOLD_US, corr);
  for (int i = 0; i < CX_COLS; i++) {
    fprintf(js, "    {\"name\": \"%s\", ", cols[i].name);
    json_conf("config", cols[i].conf, i == 0 ? opt.extra : NULL, NULL);
    for (int fi = 0; fi < CF_N; fi++) json_series(cx_fig[fi].key, &cols[i].f[fi], fi + 1 < CF_N);
    fprintf(js, "}%s\n", i + 1 < CX_COLS ? "," : "");
  }
  fprintf(js, "   ]},\n");
}

/* ==== main ===================================================================== */

static void usage(void) {
  fprintf(stderr,
          "usage: gma-bench-scenarios [--runs N] [--quick] [--json PATH] [--scenario NAME]\n"
          "                           [--config TEXT]\n"
          "  --runs N         runs per figure; every figure is the median (default 5)\n"
          "  --quick          small sizes and few iterations (the CI smoke test)\n"
          "  --json PATH      where to write the results (default bench_scenarios.json)\n"
          "  --scenario NAME  run one: training, pipeline, service, varying or cross\n"
          "  --config TEXT    gma config appended to the gma side's (for A/B runs)\n");
  exit(2);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--quick")) {
      opt.quick = 1;
      continue;
    }
    if (i + 1 >= argc) usage();
    if (!strcmp(a, "--runs")) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > MAX_RUNS) usage();
      opt.runs = (int)v;
    } else if (!strcmp(a, "--json")) {
      opt.json = argv[++i];
    } else if (!strcmp(a, "--scenario")) {
      opt.scenario = argv[++i];
      if (strcmp(opt.scenario, "training") && strcmp(opt.scenario, "pipeline") &&
          strcmp(opt.scenario, "service") && strcmp(opt.scenario, "varying") &&
          strcmp(opt.scenario, "cross"))
        usage();
    } else if (!strcmp(a, "--config")) {
      opt.extra = argv[++i];
      gma_config_t probe = GMA_CONFIG_INIT; /* a bad string fails here, before any run */
      if (gma_config_parse(&probe, opt.extra) != GMA_OK) {
        fprintf(stderr, "gma-bench-scenarios: --config: %s\n", gma_last_error());
        return 2;
      }
    } else {
      usage();
    }
  }
  char *jbuf = NULL;
  size_t jlen = 0;
  js = open_memstream(&jbuf, &jlen);
  if (!js) die("open_memstream", GMA_ERR_OOM);
  printf("gma-bench-scenarios: gma %s, %s build (GMA_DEBUG=%d), simulated device, median of %d "
         "run%s%s\n",
         gma_version(), GMA_BENCH_BUILD_TYPE, GMA_DEBUG, opt.runs, opt.runs == 1 ? "" : "s",
         opt.quick ? ", --quick sizes" : "");
  if (GMA_DEBUG > 0)
    printf("  note: GMA_DEBUG>0 validates the pool after operations; use a Release build for "
           "numbers to quote\n");
  fprintf(js, "{\n  \"benchmark\": \"gma-bench-scenarios\", \"gma_version\": \"%s\", "
              "\"build_type\": \"%s\", \"gma_debug\": %d, \"device\": \"sim\", \"runs\": %d, "
              "\"quick\": %s, ",
          gma_version(), GMA_BENCH_BUILD_TYPE, GMA_DEBUG, opt.runs, opt.quick ? "true" : "false");
  json_conf("extra_config", opt.extra, NULL, NULL);
  fprintf(js, "\n");
  int want_t = !opt.scenario || !strcmp(opt.scenario, "training");
  int want_p = !opt.scenario || !strcmp(opt.scenario, "pipeline");
  int want_s = !opt.scenario || !strcmp(opt.scenario, "service");
  int want_v = !opt.scenario || !strcmp(opt.scenario, "varying");
  int want_x = !opt.scenario || !strcmp(opt.scenario, "cross");
  if (want_t) run_training();
  if (want_p) run_pipeline();
  if (want_s) run_service();
  if (want_v) run_varying();
  if (want_x) run_cross();
  long corr = atomic_load(&corruptions), late = atomic_load(&order_timeouts);
  fprintf(js, "  \"corruptions\": %ld, \"ordering_timeouts\": %ld\n}\n", corr, late);
  fclose(js);
  FILE *f = fopen(opt.json, "w");
  if (!f || fwrite(jbuf, 1, jlen, f) != jlen || fclose(f) != 0) {
    perror(opt.json);
    return 1;
  }
  free(jbuf);
  printf("\nwrote %s\n", opt.json);
  if (corr || late) {
    printf("FAILED: %ld corruptions (a block handed out while device work still used it), %ld "
           "kernels whose producer never ran\n", corr, late);
    return 3;
  }
  return 0;
}
