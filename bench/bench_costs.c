/* gma-bench-costs: the GPU benchmark's scenarios (bench/gpu/bench_gpu.c) on
 * the simulated device with a GPU cost preset (sim_costs, docs/gpu/
 * cost-model.md), so that what a policy costs on a GPU shows without one.
 *
 * Sides, each in a turn of its own per scenario on a fresh simulated device:
 *   gma           gma, default configuration (growable segments);
 *   gma-growable  gma with expandable_segments:true (the same on the sim);
 *   gma-ordinary  gma with expandable_segments:false (one device allocation
 *                 per segment, the default before growable segments);
 *   gma-wait      gma's default with the peers' cross-stream mechanism (the
 *                 allocating stream waits for the using stream, then an
 *                 ordinary free): cross-stream scenarios only, the like-for-
 *                 like comparison with the other sides;
 *   direct        one device allocation per request (cuMemAlloc/cuMemFree:
 *                 a free waits for the device under the preset);
 *   pool-model    a model of a driver's stream-ordered pool
 *                 (cudaMallocAsync's default pool, bench/pool_model.h).
 *
 * Kernels: every buffer is "touched" by a simulated kernel on its stream
 * that takes the time gma-bench-gpu's kernel touching one byte every 256
 * took (2 us plus 257 ns per MiB on the H100, 223 on the H200: the large
 * scenario's time per pair on the GPU, where pool hits leave only the
 * kernel) without touching memory, so that a working set of
 * tens of GiB replays on a small machine; a spin of --spin-us holds a
 * second stream where a buffer is used across streams. Every batch ends
 * with a synchronization of its streams, inside its timed region.
 *
 * Per side and scenario: ns per pair (median of the batches; memory
 * pressure: per successful allocation), p50/p99/max of the alloc and free
 * calls, the footprint (gma: reserved peak; direct: requested bytes live at
 * once; pool-model: mapped peak), the peak live bytes, device allocations,
 * frees and maps, failed allocations, driver calls per allocation call
 * (p50/p99 of the priced calls the calling thread made inside it) and epoch
 * events recorded per allocation.
 *
 * Output: a table and --json (bench_costs.json): {"scenarios": [{"name",
 * "side", "ns_per_pair", "footprint_bytes", "peak_live_bytes",
 * "device_allocs", "device_frees", "failed_allocs", "driver_calls_p50",
 * "driver_calls_p99", ...}, ...]}. */
#define BENCH_NAME "gma-bench-costs"
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchkit.h"
#include "device/device.h"
#include "device/sim_cost.h"
#include "gma.h"
#include "pool_model.h"

enum { NTHREADS = 4, ERRLEN = 320 };

/* ---- options ---------------------------------------------------------------------- */

static struct {
  const char *preset;
  int reps, pairs, iterations, rounds;
  uint64_t spin_us, seed;
  double pressure_fraction;
  const char *scenarios, *json, *gma_conf;
  int quick;
} opt = {"h100", 7, 2000, 5, 2, 20, 42, 0.9, NULL, "bench_costs.json", NULL, 0};

static uint64_t capacity; /* the simulated device's, from the preset */
static const gma__sim_costs_t *costs;

/* ---- samples ------------------------------------------------------------------------ */

typedef struct samples {
  double *v;
  size_t n, cap;
} samples_t;

static void push(samples_t *s, double x) {
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 1024;
    s->v = realloc(s->v, s->cap * sizeof *s->v);
    if (!s->v) abort();
  }
  s->v[s->n++] = x;
}

static double rank_of(samples_t *s, double p) {
  if (!s->n) return 0;
  qsort(s->v, s->n, sizeof *s->v, cmp_double);
  size_t r = (size_t)ceil(p / 100.0 * (double)s->n);
  return s->v[(r ? r : 1) - 1];
}

/* ---- kernels --------------------------------------------------------------------------- */

/* A kernel's duration rides in its argument: nothing to free. */
static void kernel_wait(void *arg) { gma__sim_spin_ns((uint64_t)(uintptr_t)arg); }

static double touch_ns_per_mib = 257.0; /* the preset's GPU (parse) */

static uint64_t touch_ns(size_t bytes) {
  return 2000 + (uint64_t)(touch_ns_per_mib * (double)bytes / MiB);
}

/* ---- sides -------------------------------------------------------------------------------- */

typedef struct side side_t;
struct side {
  const char *id;
  const char *gma_extra; /* gma sides: config beyond device:sim and the preset */
  int cross_only;
  int raw;               /* direct and pool-model: the device boundary, no gma */
  int pool;              /* pool-model */
  /* state of a turn */
  gma_t *g;
  gma__device_t *dev;
  pool_model_t *pm;
  _Atomic uint64_t live, live_peak, allocs, frees, failures; /* raw sides' own counts */
  gma_stats_t s0;
};

static side_t sides[] = {
    {.id = "gma"},
    {.id = "gma-growable", .gma_extra = "expandable_segments:true"},
    {.id = "gma-ordinary", .gma_extra = "expandable_segments:false"},
    {.id = "gma-wait", .cross_only = 1},
    {.id = "direct", .raw = 1},
    {.id = "pool-model", .raw = 1, .pool = 1},
};
enum { NSIDES = sizeof sides / sizeof sides[0] };

static gma_config_t sim_config(void) {
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_SIM;
  c.ignore_env = 1;
  char text[160];
  snprintf(text, sizeof text, "sim_capacity:%" PRIu64 ",sim_costs:%s", capacity, opt.preset);
  OK(gma_config_parse(&c, text));
  return c;
}

static int side_open(side_t *sd, char *err) {
  atomic_store(&sd->live, 0);
  atomic_store(&sd->live_peak, 0);
  atomic_store(&sd->allocs, 0);
  atomic_store(&sd->frees, 0);
  atomic_store(&sd->failures, 0);
  gma_config_t c = sim_config();
  gma_status_t st;
  if (!sd->raw) {
    if (opt.gma_conf) OK(gma_config_parse(&c, opt.gma_conf));
    if (sd->gma_extra) OK(gma_config_parse(&c, sd->gma_extra));
    st = gma_create(&c, &sd->g);
  } else {
    st = gma__sim_create(&c, &sd->dev);
    if (st == GMA_OK && sd->pool) st = pool_model_create(sd->dev, costs, 2 * capacity, UINT64_MAX,
                                                         &sd->pm);
  }
  if (st != GMA_OK) snprintf(err, ERRLEN, "%s: %s", gma_status_name(st), gma_last_error());
  return st != GMA_OK;
}

static void side_close(side_t *sd) {
  if (sd->g) {
    gma_destroy(sd->g);
    sd->g = NULL;
  }
  if (sd->pm) pool_model_destroy(sd->pm);
  sd->pm = NULL;
  if (sd->dev) sd->dev->ops->destroy(sd->dev);
  sd->dev = NULL;
}

static gma_status_t stream_new(side_t *sd, gma_stream_t *s) {
  return sd->g ? gma_stream_create(sd->g, s) : sd->dev->ops->stream_create(sd->dev, s);
}
static void stream_gone(side_t *sd, gma_stream_t s) {
  if (sd->g) gma_stream_destroy(sd->g, s); else sd->dev->ops->stream_destroy(sd->dev, s);
}
static gma_status_t launch(side_t *sd, gma_stream_t s, uint64_t ns) {
  void *arg = (void *)(uintptr_t)ns;
  return sd->g ? gma_sim_launch(sd->g, s, kernel_wait, arg)
               : sd->dev->ops->sim_launch(sd->dev, s, kernel_wait, arg);
}
static gma_status_t sync_stream(side_t *sd, gma_stream_t s) {
  gma_status_t st = sd->g ? gma_stream_synchronize(sd->g, s)
                          : sd->dev->ops->stream_synchronize(sd->dev, s);
  if (st == GMA_OK && sd->pm) pool_model_synchronized(sd->pm);
  return st;
}
/* waiter's later work waits for the work queued on waitee so far. */
static gma_status_t order(side_t *sd, gma_stream_t waiter, gma_stream_t waitee) {
  return sd->g ? gma_stream_wait_stream(sd->g, waiter, waitee)
               : sd->dev->ops->stream_wait_stream(sd->dev, waiter, waitee);
}

static void count_live(side_t *sd, int64_t delta) {
  uint64_t live = atomic_fetch_add(&sd->live, (uint64_t)delta) + (uint64_t)delta;
  uint64_t peak = atomic_load(&sd->live_peak);
  while (live > peak && !atomic_compare_exchange_weak(&sd->live_peak, &peak, live)) {
  }
}

static gma_status_t side_alloc(side_t *sd, size_t size, gma_stream_t s, void **p) {
  gma_status_t st;
  if (sd->g) {
    st = gma_alloc(sd->g, size, s, p);
  } else if (sd->pm) {
    st = pool_model_alloc(sd->pm, size, s, p);
  } else {
    uintptr_t a = 0;
    st = sd->dev->ops->mem_alloc(sd->dev, size, &a);
    *p = (void *)a;
  }
  if (st == GMA_OK) {
    count_live(sd, (int64_t)size);
    atomic_fetch_add(&sd->allocs, 1);
  } else {
    atomic_fetch_add(&sd->failures, 1);
  }
  return st;
}

static gma_status_t side_free(side_t *sd, void *p, size_t size, gma_stream_t s) {
  gma_status_t st = sd->g ? gma_free(sd->g, p)
                    : sd->pm ? pool_model_free(sd->pm, p, s)
                             : sd->dev->ops->mem_free(sd->dev, (uintptr_t)p, size);
  if (st == GMA_OK) {
    count_live(sd, -(int64_t)size);
    atomic_fetch_add(&sd->frees, 1);
  }
  return st;
}

/* p was allocated on s and is used on use (queued, not yet run): each
 * side's own cross-stream mechanism. gma: gma_record_stream; the others
 * (and gma-wait): s waits for use, then the free is ordered on s. direct:
 * the host waits for use, since cuMemFree must not free memory in use. */
static gma_status_t side_free_cross(side_t *sd, void *p, size_t size, gma_stream_t s,
                                    gma_stream_t use) {
  gma_status_t st = GMA_OK;
  if (sd->g && !sd->cross_only)
    st = gma_record_stream(sd->g, p, use);
  else if (!sd->g && !sd->pm)
    st = sd->dev->ops->stream_synchronize(sd->dev, use);
  else
    st = order(sd, s, use);
  return st == GMA_OK ? side_free(sd, p, size, s) : st;
}

/* ---- timed calls ----------------------------------------------------------------------- */

typedef struct logs {
  samples_t alloc, free, calls;
  samples_t overhead; /* per allocation: its calls less the device memory calls */
  /* the calls those allocations made, by kind; [GMA__SIM_COST_NOPS]: more
   * in one call than the thread's log keeps */
  uint64_t by_kind[GMA__SIM_COST_NOPS + 1];
} logs_t;

/* Device memory: what growth and release cost (allocations and frees,
 * mappings, the free memory an OOM path asks), counted apart from the
 * calls an allocation makes around them. */
static int memory_call(gma__sim_cost_op_t op) {
  switch (op) {
    case GMA__SIM_COST_MEM_ALLOC: case GMA__SIM_COST_MEM_FREE: case GMA__SIM_COST_MEM_INFO:
    case GMA__SIM_COST_VM_RESERVE: case GMA__SIM_COST_VM_RELEASE: case GMA__SIM_COST_VM_MAP:
    case GMA__SIM_COST_VM_UNMAP: case GMA__SIM_COST_POOL_ALLOC: return 1;
    default: return 0;
  }
}

/* Counts the calling thread's calls c0 .. c0 + n - 1 by kind, after the
 * timed region, and the allocation's calls less its memory calls (a call
 * older than the thread's log counts as not one). */
static void log_kinds(logs_t *lg, uint64_t c0, uint64_t n) {
  uint64_t overhead = 0;
  for (uint64_t k = c0; k < c0 + n; k++) {
    gma__sim_cost_op_t op = gma__sim_cost_thread_op(k);
    lg->by_kind[op]++;
    overhead += !memory_call(op);
  }
  push(&lg->overhead, (double)overhead);
}

static gma_status_t t_alloc(side_t *sd, logs_t *lg, size_t size, gma_stream_t s, void **p) {
  uint64_t c0 = gma__sim_cost_thread_calls(), t0 = now_ns();
  gma_status_t st = side_alloc(sd, size, s, p);
  uint64_t t = now_ns() - t0, c = gma__sim_cost_thread_calls() - c0;
  if (lg && st == GMA_OK) {
    push(&lg->alloc, (double)t);
    push(&lg->calls, (double)c);
    if (c) log_kinds(lg, c0, c); else push(&lg->overhead, 0);
  }
  return st;
}

static gma_status_t t_free(side_t *sd, logs_t *lg, void *p, size_t size, gma_stream_t s,
                           gma_stream_t use) {
  uint64_t t0 = now_ns();
  gma_status_t st = use ? side_free_cross(sd, p, size, s, use) : side_free(sd, p, size, s);
  if (lg && st == GMA_OK) push(&lg->free, (double)(now_ns() - t0));
  return st;
}

static gma_status_t t_alloc_async(side_t *sd, logs_t *lg, size_t size, gma_stream_t s, void **p) {
  if (!sd->g) return t_alloc(sd, lg, size, s, p); /* a driver pool's alloc is already async */
  uint64_t c0 = gma__sim_cost_thread_calls(), t0 = now_ns();
  gma_future_t *f = NULL;
  gma_status_t st = gma_alloc_async(sd->g, size, s, NULL, &f);
  if (st == GMA_OK) {
    st = gma_future_wait(f, UINT64_MAX, p);
    gma_future_release(f);
  }
  uint64_t t = now_ns() - t0, c = gma__sim_cost_thread_calls() - c0;
  if (st == GMA_OK) {
    count_live(sd, (int64_t)size);
    atomic_fetch_add(&sd->allocs, 1);
    if (lg) {
      push(&lg->alloc, (double)t);
      push(&lg->calls, (double)c);
      if (c) log_kinds(lg, c0, c); else push(&lg->overhead, 0);
    }
  }
  return st;
}

/* ---- scenarios --------------------------------------------------------------------------- */

typedef enum kind { K_PAIRS, K_CROSS, K_ASYNC, K_THREADS, K_TRAINING, K_PRESSURE } kind_t;

typedef struct scenario {
  const char *id, *name;
  kind_t kind;
  size_t size;               /* fixed size; 0: seeded random in [2^lo, 2^hi) */
  unsigned lo_bits, hi_bits; /* log-uniform */
} scenario_t;

static const scenario_t scenarios[] = {
    {"same_4KiB", "same size 4 KiB", K_PAIRS, 4 * KiB, 0, 0},
    {"same_2MiB", "same size 2 MiB", K_PAIRS, 2 * MiB, 0, 0},
    {"mixed_512B_8MiB", "mixed 512 B - 8 MiB", K_PAIRS, 0, 9, 23},
    {"large_16_256MiB", "large 16 - 256 MiB", K_PAIRS, 0, 24, 28},
    {"cross_stream", "cross-stream 64 KiB - 4 MiB", K_CROSS, 0, 16, 22},
    {"training_loop", "training loop (6 layers)", K_TRAINING, 0, 0, 0},
    {"streams_4x4", "4 threads x own stream, 64 KiB", K_THREADS, 64 * KiB, 0, 0},
    {"async_4KiB", "async 4 KiB (bin hit)", K_ASYNC, 4 * KiB, 0, 0},
    {"async_8MiB", "async 8 MiB (worker-served)", K_ASYNC, 8 * MiB, 0, 0},
    {"memory_pressure", "memory pressure", K_PRESSURE, 0, 0, 0},
};
enum { NSC = sizeof scenarios / sizeof scenarios[0] };

static size_t *sizes; /* opt.pairs sizes of the current pair scenario */

static void fill_sizes(const scenario_t *sc) {
  uint64_t rng = opt.seed ? opt.seed : 1;
  for (int i = 0; i < opt.pairs; i++) {
    if (sc->size || sc->hi_bits <= sc->lo_bits) { /* fixed, or a scenario of its own sizes */
      sizes[i] = sc->size;
      continue;
    }
    unsigned bits = sc->lo_bits + (unsigned)(xorshift(&rng) % (sc->hi_bits - sc->lo_bits));
    size_t lo = (size_t)1 << bits;
    sizes[i] = lo + (size_t)(xorshift(&rng) % lo);
  }
}

/* The training loop of bench_gpu.c: a 6-layer transformer step (4 x 512
 * tokens, hidden 1024, fp16), activations kept for the backward pass,
 * workspaces freed at once, each layer's gradient also used on a second
 * stream (an all-reduce) and freed across streams. */
enum { TL_LAYERS = 6, TL_KEPT = 8 };
enum { T_WS = TL_LAYERS * TL_KEPT, T_DUP, T_DATTN, T_DSCORES, T_DQKV, T_WGRAD, T_G0, T_G1,
       TL_SLOTS };
typedef struct tl_op {
  int slot;
  size_t size; /* 0: free the slot */
} tl_op_t;
static tl_op_t tl_ops[64 * TL_LAYERS];
static int tl_nops, tl_nallocs;

static void tl_a(int slot, size_t size) {
  tl_ops[tl_nops++] = (tl_op_t){slot, size};
  tl_nallocs++;
}
static void tl_f(int slot) { tl_ops[tl_nops++] = (tl_op_t){slot, 0}; }

static void tl_forward(size_t act, size_t stats, size_t scores) {
  for (int l = 0; l < TL_LAYERS; l++) {
    int b = l * TL_KEPT;
    tl_a(b + 0, act);
    tl_a(b + 1, stats);
    tl_a(b + 2, 3 * act);
    tl_a(T_WS, 2 * act);
    tl_f(T_WS);
    tl_a(b + 3, scores);
    tl_a(b + 4, act);
    tl_a(b + 5, 4 * act);
    tl_a(b + 6, 4 * act);
    tl_a(T_WS, act);
    tl_f(T_WS);
    tl_a(b + 7, act);
  }
}

static void tl_plan(void) {
  const size_t tok = 4 * 512, hid = 1024, e = 2;
  const size_t act = tok * hid * e, stats = tok * 8, scores = 4 * 16 * 512 * 512 * e;
  tl_forward(act, stats, scores);
  int g = T_G0;
  tl_a(g, act);
  for (int l = TL_LAYERS - 1; l >= 0; l--) {
    int b = l * TL_KEPT, ng = g == T_G0 ? T_G1 : T_G0;
    tl_a(T_DUP, 4 * act);
    tl_f(b + 6);
    tl_f(b + 5);
    tl_a(T_DATTN, act);
    tl_f(T_DUP);
    tl_a(T_DSCORES, scores);
    tl_f(b + 3);
    tl_a(T_DQKV, 3 * act);
    tl_f(T_DSCORES);
    tl_f(b + 2);
    tl_a(ng, act);
    tl_f(T_DQKV);
    tl_f(b + 4);
    tl_f(T_DATTN);
    tl_a(T_WGRAD, 2 * KiB);
    tl_f(T_WGRAD);
    tl_f(b + 7);
    tl_f(b + 1);
    tl_f(b + 0);
    tl_f(g);
    g = ng;
  }
  tl_f(g);
}

static int tl_cross(int slot) { return slot == T_G0 || slot == T_G1; }

/* Memory pressure: blocks of one size up to the working set, touched, all
 * freed; then a larger size, then a smaller one. */
enum { PRESS_PHASES = 3, PRESS_MAX = 96 };
static const int press_blocks[PRESS_PHASES] = {64, 40, 96};
static size_t press_size[PRESS_PHASES];

/* ---- batches ------------------------------------------------------------------------------ */

typedef struct batch {
  const scenario_t *sc;
  side_t *sd;
  int n;
  logs_t *lg; /* NULL: warm-up */
  gma_stream_t s, use;
  uint64_t ns, successes, failures;
  char err[ERRLEN];
} batch_t;

static int fail(batch_t *b, const char *what, gma_status_t st) {
  snprintf(b->err, sizeof b->err, "%s: %s: %s", what, gma_status_name(st), gma_last_error());
  return -1;
}

static int batch_pairs(batch_t *b) {
  uint64_t t0 = now_ns();
  for (int i = 0; i < b->n; i++) {
    void *p;
    size_t sz = sizes[i % opt.pairs];
    gma_status_t st = b->sc->kind == K_ASYNC ? t_alloc_async(b->sd, b->lg, sz, b->s, &p)
                                             : t_alloc(b->sd, b->lg, sz, b->s, &p);
    if (st != GMA_OK) return fail(b, "alloc", st);
    launch(b->sd, b->s, touch_ns(sz));
    if ((st = t_free(b->sd, b->lg, p, sz, b->s, NULL)) != GMA_OK) return fail(b, "free", st);
  }
  gma_status_t st = sync_stream(b->sd, b->s);
  b->ns = now_ns() - t0;
  return st == GMA_OK ? 0 : fail(b, "synchronize", st);
}

/* The use of p on `use` after its producer on s: use waits for s, spins,
 * touches p. */
static void use_on(batch_t *b, size_t sz) {
  order(b->sd, b->use, b->s);
  launch(b->sd, b->use, opt.spin_us * 1000);
  launch(b->sd, b->use, touch_ns(sz));
}

static int batch_cross(batch_t *b) {
  uint64_t t0 = now_ns();
  for (int i = 0; i < b->n; i++) {
    void *p;
    size_t sz = sizes[i % opt.pairs];
    gma_status_t st = t_alloc(b->sd, b->lg, sz, b->s, &p);
    if (st != GMA_OK) return fail(b, "alloc", st);
    launch(b->sd, b->s, touch_ns(sz));
    use_on(b, sz);
    if ((st = t_free(b->sd, b->lg, p, sz, b->s, b->use)) != GMA_OK) return fail(b, "free", st);
  }
  gma_status_t st = sync_stream(b->sd, b->s);
  if (st == GMA_OK) st = sync_stream(b->sd, b->use);
  b->ns = now_ns() - t0;
  return st == GMA_OK ? 0 : fail(b, "synchronize", st);
}

static int batch_training(batch_t *b) {
  void *slot[TL_SLOTS] = {NULL};
  size_t ssz[TL_SLOTS] = {0};
  uint64_t t0 = now_ns();
  int rc = 0;
  for (int it = 0; it < b->n && !rc; it++) {
    for (int k = 0; k < tl_nops && !rc; k++) {
      const tl_op_t *op = &tl_ops[k];
      gma_status_t st;
      if (op->size) {
        st = t_alloc(b->sd, b->lg, op->size, b->s, &slot[op->slot]);
        if (st != GMA_OK) {
          rc = fail(b, "alloc", st);
          break;
        }
        ssz[op->slot] = op->size;
        launch(b->sd, b->s, touch_ns(op->size));
        if (tl_cross(op->slot)) use_on(b, op->size);
      } else {
        st = t_free(b->sd, b->lg, slot[op->slot], ssz[op->slot], b->s,
                    tl_cross(op->slot) ? b->use : NULL);
        slot[op->slot] = NULL;
        if (st != GMA_OK) rc = fail(b, "free", st);
      }
    }
  }
  for (int k = 0; k < TL_SLOTS; k++)
    if (slot[k]) side_free(b->sd, slot[k], ssz[k], b->s);
  gma_status_t st = sync_stream(b->sd, b->s);
  if (st == GMA_OK) st = sync_stream(b->sd, b->use);
  b->ns = now_ns() - t0;
  return rc ? rc : st == GMA_OK ? 0 : fail(b, "synchronize", st);
}

typedef struct thr {
  batch_t *b;
  gma_stream_t s;
  logs_t lg;
  pthread_barrier_t *bar;
  int rc;
  char err[ERRLEN];
} thr_t;

static void *thr_main(void *arg) {
  thr_t *t = arg;
  batch_t *b = t->b;
  pthread_barrier_wait(t->bar);
  for (int i = 0; i < b->n && !t->rc; i++) {
    void *p;
    gma_status_t st = t_alloc(b->sd, b->lg ? &t->lg : NULL, b->sc->size, t->s, &p);
    if (st == GMA_OK) {
      launch(b->sd, t->s, touch_ns(b->sc->size));
      st = t_free(b->sd, b->lg ? &t->lg : NULL, p, b->sc->size, t->s, NULL);
    }
    if (st != GMA_OK) {
      t->rc = -1;
      snprintf(t->err, sizeof t->err, "%s: %s", gma_status_name(st), gma_last_error());
    }
  }
  sync_stream(b->sd, t->s);
  return NULL;
}

static void append(samples_t *to, samples_t *from) {
  for (size_t i = 0; i < from->n; i++) push(to, from->v[i]);
  free(from->v);
  memset(from, 0, sizeof *from);
}

static int batch_threads(batch_t *b) {
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, NTHREADS + 1);
  thr_t t[NTHREADS];
  pthread_t tid[NTHREADS];
  for (int i = 0; i < NTHREADS; i++) {
    t[i] = (thr_t){.b = b, .bar = &bar};
    if (stream_new(b->sd, &t[i].s) != GMA_OK) abort();
    pthread_create(&tid[i], NULL, thr_main, &t[i]);
  }
  uint64_t t0 = now_ns();
  pthread_barrier_wait(&bar);
  int rc = 0;
  for (int i = 0; i < NTHREADS; i++) {
    pthread_join(tid[i], NULL);
    if (t[i].rc && !rc) {
      rc = -1;
      snprintf(b->err, sizeof b->err, "%s", t[i].err);
    }
  }
  b->ns = now_ns() - t0;
  for (int i = 0; i < NTHREADS; i++) {
    if (b->lg) {
      append(&b->lg->alloc, &t[i].lg.alloc);
      append(&b->lg->free, &t[i].lg.free);
      append(&b->lg->calls, &t[i].lg.calls);
      append(&b->lg->overhead, &t[i].lg.overhead);
      for (int k = 0; k <= GMA__SIM_COST_NOPS; k++) b->lg->by_kind[k] += t[i].lg.by_kind[k];
    }
    stream_gone(b->sd, t[i].s);
  }
  pthread_barrier_destroy(&bar);
  return rc;
}

static int batch_pressure(batch_t *b) {
  uint64_t t0 = now_ns();
  for (int ph = 0; ph < PRESS_PHASES; ph++) {
    void *held[PRESS_MAX] = {NULL};
    for (int k = 0; k < press_blocks[ph]; k++) {
      if (t_alloc(b->sd, b->lg, press_size[ph], b->s, &held[k]) != GMA_OK) {
        held[k] = NULL;
        b->failures++;
        if (!b->err[0]) fail(b, "alloc (counted, the round goes on)", GMA_ERR_OOM);
        continue;
      }
      b->successes++;
      launch(b->sd, b->s, touch_ns(press_size[ph]));
    }
    for (int k = 0; k < press_blocks[ph]; k++)
      if (held[k]) t_free(b->sd, b->lg, held[k], press_size[ph], b->s, NULL);
    sync_stream(b->sd, b->s);
  }
  b->ns = now_ns() - t0;
  return 0;
}

static int run_batch(batch_t *b) {
  switch (b->sc->kind) {
    case K_PAIRS:
    case K_ASYNC: return batch_pairs(b);
    case K_CROSS: return batch_cross(b);
    case K_THREADS: return batch_threads(b);
    case K_TRAINING: return batch_training(b);
    case K_PRESSURE: return batch_pressure(b);
  }
  return -1;
}

/* ---- one side's turn ----------------------------------------------------------------------- */

typedef struct result {
  int ran;
  char skip[ERRLEN], error[ERRLEN];
  double ns_per_pair;
  double alloc_p50, alloc_p99, alloc_max, free_p50, free_p99, free_max;
  double calls_p50, calls_p99, events_per_alloc;
  double overhead_p50, overhead_p99; /* calls less the device memory calls */
  uint64_t footprint, peak_live, device_allocs, device_frees, device_maps, failed, allocs;
  uint64_t slow_allocs; /* gma sides: timed allocations no bin served */
  uint64_t by_kind[GMA__SIM_COST_NOPS + 1];
} result_t;

static double units_of(const scenario_t *sc, const batch_t *b) {
  if (sc->kind == K_PRESSURE) return (double)b->successes;
  if (sc->kind == K_TRAINING) return (double)b->n * tl_nallocs;
  return (double)b->n;
}

static int units_per_batch(const scenario_t *sc) {
  switch (sc->kind) {
    case K_TRAINING: return opt.iterations;
    case K_PRESSURE: return 1;
    case K_THREADS: return opt.pairs / NTHREADS;
    default: return opt.pairs;
  }
}

/* What the device did during the turn, side by side. */
static void device_counts(side_t *sd, result_t *r) {
  if (sd->g) {
    gma_stats_t s = GMA_STATS_INIT;
    gma_stats(sd->g, &s);
    r->footprint = s.reserved.peak;
    r->device_allocs = s.num_device_allocs - sd->s0.num_device_allocs;
    r->device_frees = s.num_device_frees - sd->s0.num_device_frees;
    r->device_maps = s.address_ranges ? r->device_allocs : 0;
    r->slow_allocs = (s.num_allocs - sd->s0.num_allocs) - (s.hits_bin - sd->s0.hits_bin);
  } else if (sd->pm) {
    pool_model_stats_t s;
    pool_model_stats(sd->pm, &s);
    r->footprint = s.mapped_peak;
    r->device_allocs = r->device_maps = s.maps;
    r->device_frees = s.unmaps;
  } else {
    r->footprint = atomic_load(&sd->live_peak);
    r->device_allocs = atomic_load(&sd->allocs);
    r->device_frees = atomic_load(&sd->frees);
  }
  r->peak_live = atomic_load(&sd->live_peak);
}

static void timed(const scenario_t *sc, side_t *sd, result_t *r, gma_stream_t s, gma_stream_t use) {
  logs_t lg = {{0}, {0}, {0}, {0}, {0}};
  int nb = sc->kind == K_PRESSURE ? opt.rounds : opt.reps;
  double *per = calloc((size_t)nb, sizeof *per);
  int ok = 0;
  uint64_t ev0 = gma__sim_cost_total(GMA__SIM_COST_EVENT_RECORD), allocs0 = atomic_load(&sd->allocs);
  if (sd->g) gma_stats(sd->g, &sd->s0);
  for (int rep = 0; rep < nb; rep++) {
    batch_t b = {.sc = sc, .sd = sd, .n = units_per_batch(sc), .lg = &lg, .s = s, .use = use};
    int rc = run_batch(&b);
    r->failed += b.failures;
    if (b.err[0] && !r->error[0]) snprintf(r->error, sizeof r->error, "%s", b.err);
    if (rc) break;
    double u = units_of(sc, &b);
    if (u > 0) per[ok++] = (double)b.ns / u;
  }
  qsort(per, (size_t)ok, sizeof *per, cmp_double);
  r->ns_per_pair = ok ? (ok % 2 ? per[ok / 2] : (per[ok / 2 - 1] + per[ok / 2]) / 2) : 0;
  free(per);
  r->allocs = atomic_load(&sd->allocs) - allocs0;
  r->events_per_alloc = r->allocs ? (double)(gma__sim_cost_total(GMA__SIM_COST_EVENT_RECORD) - ev0) /
                                        (double)r->allocs
                                  : 0;
  r->alloc_max = lg.alloc.n ? (rank_of(&lg.alloc, 100)) : 0;
  r->alloc_p50 = rank_of(&lg.alloc, 50);
  r->alloc_p99 = rank_of(&lg.alloc, 99);
  r->free_max = lg.free.n ? rank_of(&lg.free, 100) : 0;
  r->free_p50 = rank_of(&lg.free, 50);
  r->free_p99 = rank_of(&lg.free, 99);
  r->calls_p50 = rank_of(&lg.calls, 50);
  r->calls_p99 = rank_of(&lg.calls, 99);
  r->overhead_p50 = rank_of(&lg.overhead, 50);
  r->overhead_p99 = rank_of(&lg.overhead, 99);
  free(lg.overhead.v);
  memcpy(r->by_kind, lg.by_kind, sizeof r->by_kind);
  free(lg.alloc.v), free(lg.free.v), free(lg.calls.v);
  r->ran = ok > 0;
}

static void run_turn(const scenario_t *sc, side_t *sd, result_t *r) {
  if (sd->cross_only && sc->kind != K_CROSS && sc->kind != K_TRAINING) {
    snprintf(r->skip, sizeof r->skip, "cross-stream scenarios only");
    return;
  }
  if (sc->kind == K_ASYNC && sd->raw && !sd->pool) {
    snprintf(r->skip, sizeof r->skip, "no async allocation call");
    return;
  }
  if (side_open(sd, r->error)) return;
  gma_stream_t s = NULL, use = NULL;
  if (stream_new(sd, &s) != GMA_OK || stream_new(sd, &use) != GMA_OK) {
    snprintf(r->error, sizeof r->error, "stream create: %s", gma_last_error());
  } else {
    batch_t warm = {.sc = sc, .sd = sd, .n = sc->kind == K_PRESSURE ? 1 : 16, .s = s, .use = use};
    if (sc->kind == K_TRAINING) warm.n = 1;
    if (sc->kind != K_PRESSURE) run_batch(&warm);
    timed(sc, sd, r, s, use);
    device_counts(sd, r);
  }
  if (s) stream_gone(sd, s);
  if (use) stream_gone(sd, use);
  side_close(sd);
}

static void pressure_sizes(void) {
  double ws = (double)capacity * opt.pressure_fraction;
  for (int p = 0; p < PRESS_PHASES; p++) {
    press_size[p] = (size_t)(ws / press_blocks[p]) / (2 * MiB) * (2 * MiB);
    if (press_size[p] < 2 * MiB) press_size[p] = 2 * MiB;
  }
}

/* ---- output ------------------------------------------------------------------------------ */

static void print_header(void) {
  printf("%-30s %-13s %10s %9s %9s %9s %9s %10s %10s %7s %7s %6s %5s %5s\n", "scenario", "side",
         "ns/pair", "alloc p50", "alloc p99", "free p50", "free p99", "footprint", "peak live",
         "dev+", "dev-", "fail", "calls", "p99");
}

static void print_row(const scenario_t *sc, const side_t *sd, const result_t *r) {
  if (!r->ran) {
    printf("%-30s %-13s %s\n", sc->name, sd->id, r->skip[0] ? r->skip : r->error);
    return;
  }
  printf("%-30s %-13s %10.0f %9.0f %9.0f %9.0f %9.0f %8.1fMi %8.1fMi %7" PRIu64 " %7" PRIu64
         " %6" PRIu64 " %5.0f %5.0f\n",
         sc->name, sd->id, r->ns_per_pair, r->alloc_p50, r->alloc_p99, r->free_p50, r->free_p99,
         (double)r->footprint / MiB, (double)r->peak_live / MiB, r->device_allocs,
         r->device_frees, r->failed, r->calls_p50, r->calls_p99);
}

/* Allocations that could call the driver: gma's bin hits make no call. */
static uint64_t slow_of(const side_t *sd, const result_t *r) {
  return sd->raw || r->slow_allocs > r->allocs ? r->allocs : r->slow_allocs;
}

/* The timed allocations' calls by kind, per allocation a bin did not serve. */
static void print_kinds(result_t (*res)[NSIDES], const int *ran_sc) {
  printf("\ndriver calls per slow-path allocation, by kind (slow: allocations no bin served;\n"
         " a bin hit makes no driver call); excl. mem p50/p99: calls per allocation less the\n"
         " device memory calls (allocations, frees, maps, memory info)\n");
  printf("%-30s %-13s %9s %9s %5s %5s  %s\n", "scenario", "side", "allocs", "slow", "p50", "p99",
         "calls by kind");
  for (int s = 0; s < NSC; s++)
    for (int i = 0; ran_sc[s] && i < NSIDES; i++) {
      const result_t *r = &res[s][i];
      if (!r->ran) continue;
      uint64_t slow = slow_of(&sides[i], r);
      printf("%-30s %-13s %9" PRIu64 " %9" PRIu64 " %5.0f %5.0f ", scenarios[s].name, sides[i].id,
             r->allocs, slow, r->overhead_p50, r->overhead_p99);
      for (int k = 0; k <= GMA__SIM_COST_NOPS; k++)
        if (r->by_kind[k])
          printf(" %s %.2f", k < GMA__SIM_COST_NOPS ? gma__sim_cost_op_name(k) : "(unlogged)",
                 slow ? (double)r->by_kind[k] / (double)slow : 0.0);
      printf("\n");
    }
}

static void json_kinds(FILE *f, const side_t *sd, const result_t *r) {
  fprintf(f, ", \"overhead_calls_p50\": %.0f, \"overhead_calls_p99\": %.0f",
          r->overhead_p50, r->overhead_p99);
  fprintf(f, ", \"slow_allocs\": %" PRIu64 ", \"calls_by_kind\": {", slow_of(sd, r));
  int first = 1;
  for (int k = 0; k <= GMA__SIM_COST_NOPS; k++) {
    if (!r->by_kind[k]) continue;
    fprintf(f, "%s\"%s\": %" PRIu64, first ? "" : ", ",
            k < GMA__SIM_COST_NOPS ? gma__sim_cost_op_name(k) : "unlogged", r->by_kind[k]);
    first = 0;
  }
  fprintf(f, "}");
}

static void write_json(result_t (*res)[NSIDES], const int *ran_sc) {
  FILE *f = fopen(opt.json, "w");
  if (!f) {
    fprintf(stderr, BENCH_NAME ": cannot write %s\n", opt.json);
    exit(1);
  }
  fprintf(f, "{\"benchmark\": \"gma-bench-costs\", \"preset\": \"%s\", \"capacity_bytes\": %" PRIu64
             ", \"build\": \"%s\", \"scenarios\": [\n",
          opt.preset, capacity, GMA_BENCH_BUILD_TYPE);
  int first = 1;
  for (int s = 0; s < NSC; s++) {
    if (!ran_sc[s]) continue;
    for (int i = 0; i < NSIDES; i++) {
      const result_t *r = &res[s][i];
      if (!r->ran) continue;
      fprintf(f,
              "%s  {\"name\": \"%s\", \"side\": \"%s\", \"ns_per_pair\": %.1f, "
              "\"footprint_bytes\": %" PRIu64 ", \"peak_live_bytes\": %" PRIu64
              ", \"device_allocs\": %" PRIu64 ", \"device_frees\": %" PRIu64
              ", \"device_maps\": %" PRIu64 ", \"failed_allocs\": %" PRIu64
              ", \"driver_calls_p50\": %.0f, \"driver_calls_p99\": %.0f, "
              "\"events_per_alloc\": %.3f, \"alloc_ns\": {\"p50\": %.0f, \"p99\": %.0f, \"max\": "
              "%.0f}, \"free_ns\": {\"p50\": %.0f, \"p99\": %.0f, \"max\": %.0f}",
              first ? "" : ",\n", scenarios[s].id, sides[i].id, r->ns_per_pair, r->footprint,
              r->peak_live, r->device_allocs, r->device_frees, r->device_maps, r->failed,
              r->calls_p50, r->calls_p99, r->events_per_alloc, r->alloc_p50, r->alloc_p99,
              r->alloc_max, r->free_p50, r->free_p99, r->free_max);
      json_kinds(f, &sides[i], r);
      fprintf(f, "}");
      first = 0;
    }
  }
  fprintf(f, "\n]}\n");
  fclose(f);
}

/* ---- main ----------------------------------------------------------------------------------- */

static void usage(void) {
  fprintf(stderr,
          "usage: gma-bench-costs [--preset h100|h200] [--reps N] [--pairs N] [--rounds N]\n"
          "                       [--spin-us N] [--seed N] [--scenarios ID,ID] [--gma-conf TEXT]\n"
          "                       [--quick] [--json PATH]\n"
          "  --preset P      the cost preset (sim_costs) and its device's capacity (h100: 78.7 GiB\n"
          "                  free, as the H100 run had; h200: 139.3 GiB)\n"
          "  --reps N        timed batches per side (7); --pairs N pairs per batch (2000)\n"
          "  --rounds N      memory pressure rounds (2); --spin-us N the second stream's hold (20)\n"
          "  --scenarios L   run only these (");
  for (int i = 0; i < NSC; i++) fprintf(stderr, "%s%s", i ? ", " : "", scenarios[i].id);
  fprintf(stderr, ")\n  --gma-conf T    extra configuration for the gma sides\n"
                  "  --quick         few pairs and reps (the smoke test)\n"
                  "  --json PATH     where to write the results (bench_costs.json)\n");
  exit(2);
}

static int listed(const char *id) {
  if (!opt.scenarios) return 1;
  size_t n = strlen(id);
  for (const char *p = opt.scenarios; *p;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && !strncmp(p, id, n)) return 1;
    p += len + (e != NULL);
  }
  return 0;
}

static long number(const char *s, const char *what) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end || v <= 0) {
    fprintf(stderr, BENCH_NAME ": %s takes a positive number, not '%s'\n", what, s);
    exit(2);
  }
  return v;
}

static void parse(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--quick")) {
      opt.quick = 1, opt.pairs = 200, opt.reps = 3, opt.rounds = 1, opt.iterations = 2;
      continue;
    }
    if (!v) usage();
    i++;
    if (!strcmp(a, "--preset")) opt.preset = v;
    else if (!strcmp(a, "--reps")) opt.reps = (int)number(v, a);
    else if (!strcmp(a, "--pairs")) opt.pairs = (int)number(v, a);
    else if (!strcmp(a, "--rounds")) opt.rounds = (int)number(v, a);
    else if (!strcmp(a, "--spin-us")) opt.spin_us = (uint64_t)number(v, a);
    else if (!strcmp(a, "--seed")) opt.seed = (uint64_t)number(v, a);
    else if (!strcmp(a, "--scenarios")) opt.scenarios = v;
    else if (!strcmp(a, "--gma-conf")) opt.gma_conf = v;
    else if (!strcmp(a, "--json")) opt.json = v;
    else usage();
  }
  costs = gma__sim_costs_find(opt.preset);
  if (!costs) {
    fprintf(stderr, BENCH_NAME ": no cost preset '%s' (presets: %s)\n", opt.preset,
            gma__sim_costs_names());
    exit(2);
  }
  capacity = !strcmp(opt.preset, "h200") ? (uint64_t)(139.3 * 1024) * MiB
                                         : (uint64_t)(78.7 * 1024) * MiB;
  touch_ns_per_mib = !strcmp(opt.preset, "h200") ? 223.0 : 257.0;
}

int main(int argc, char **argv) {
  parse(argc, argv);
  tl_plan();
  sizes = calloc((size_t)opt.pairs, sizeof *sizes);
  pressure_sizes();
  static result_t res[NSC][NSIDES];
  int ran_sc[NSC] = {0};
  printf("gma-bench-costs: the GPU benchmark's scenarios on the simulated device, cost preset %s, "
         "capacity %.1f GiB (%s build)\n\n",
         opt.preset, (double)capacity / (1024.0 * MiB), GMA_BENCH_BUILD_TYPE);
  print_header();
  for (int s = 0; s < NSC; s++) {
    if (!listed(scenarios[s].id)) continue;
    ran_sc[s] = 1;
    fill_sizes(&scenarios[s]);
    for (int i = 0; i < NSIDES; i++) {
      fprintf(stderr, BENCH_NAME ": %s / %s\n", scenarios[s].id, sides[i].id);
      run_turn(&scenarios[s], &sides[i], &res[s][i]);
      print_row(&scenarios[s], &sides[i], &res[s][i]);
      fflush(stdout);
    }
  }
  printf("\n(ns/pair: median over batches of batch wall time per alloc+free pair, kernels and\n"
         " synchronization included; memory pressure: per successful allocation. footprint: gma's\n"
         " reserved peak, direct's live bytes peak, pool-model's mapped peak. dev+/dev-: device\n"
         " allocations (growable: chunks mapped) and frees. calls/p99: priced driver calls made\n"
         " inside one allocation call, median and p99)\n");
  print_kinds(res, ran_sc);
  write_json(res, ran_sc);
  printf("wrote %s\n", opt.json);
  free(sizes);
  return 0;
}
