/* gma-bench-gpu: gma on a real GPU against the allocators a CUDA program
 * would otherwise use, all in this one process and run, on the same streams:
 *
 *   direct           cuMemAlloc / cuMemFree, no caching (the baseline). The
 *                    two driver entry points come from the runtime
 *                    (cudaGetDriverEntryPointByVersion), so the binary does
 *                    not link libcuda and loads on a machine without a driver.
 *   cudaMallocAsync  cudaMallocAsync / cudaFreeAsync on the device's default
 *                    memory pool, its release threshold raised to UINT64_MAX
 *                    so the pool caches instead of returning memory at every
 *                    synchronization.
 *   cub              cub::CachingDeviceAllocator from the toolkit's CCCL
 *                    (cub_alloc.cpp), power-of-two bins 512 B .. 256 MiB, no
 *                    cap on cached bytes (the default caps the cache at 6 MB
 *                    and caches nothing above 2 MiB).
 *   gma              device:cuda, default configuration.
 *   gma_expandable   the same with expandable_segments:true.
 *
 * Scenarios (mirroring gma-bench-alloc and gma-bench-hotpath where they
 * exist): alloc+free pairs of one size (4 KiB, 2 MiB) on one stream; seeded
 * random sizes 512 B .. 8 MiB and 16 .. 256 MiB; a transformer-like training
 * loop (activations allocated layer by layer forward and freed backward, with
 * workspaces and gradients in between); 4 threads each on its own stream;
 * async allocation (gma_alloc_async's future against cudaMallocAsync's
 * stream-ordered enqueue); memory pressure (a working set of 90% of the free
 * device memory in three phases of different block sizes, so caches must give
 * memory back: failures and time). Every batch ends with a synchronization of
 * the streams it used, inside the timed region, so stream-ordered frees are
 * paid for.
 *
 * Per scenario and allocator: median and p99 (nearest rank across batches)
 * of ns per alloc+free pair (the training loop: iteration time / allocations
 * in it; memory pressure: round time / allocations attempted), and the ratios
 * direct/x and x/gma of the medians. Allocators run batch by batch
 * interleaved, except under memory pressure, where they run one after the
 * other and each gives back all its memory before the next starts. Batches are
 * sized to about --batch-ms (a probe after a warm-up batch), so slow sides
 * (direct) run fewer pairs per batch; per-pair figures stay comparable.
 *
 * Without a GPU (no driver, no device, or gma's CUDA backend missing) it says
 * so on one line, writes {"skipped": reason} to the JSON file and exits 77.
 * It checks statuses only: correctness belongs to the tests. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h> /* CUresult and CUdeviceptr only: the driver is reached through the runtime */
#include <cuda_runtime_api.h>

#include "benchkit.h"
#include "gma.h"
#ifndef GMA_BENCH_CUB_OFF
#include "cub_alloc.h"
#endif


#define EXIT_SKIP 77 /* CTest's and automake's "skipped" */

enum { NTHREADS = 4, ERRLEN = 320 };

/* ---- options -------------------------------------------------------------------- */

typedef struct options {
  int device;
  int reps;               /* timed batches per allocator */
  int pairs;              /* most pairs per batch */
  int iterations;         /* most training iterations per batch */
  int batch_ms;           /* a batch's target duration */
  uint64_t seed;
  double pressure_fraction; /* working set / free device memory */
  int pressure_rounds;
  const char *scenarios;  /* comma-separated ids, NULL: all */
  const char *gma_conf;   /* extra config for both gma allocators */
  int allow_no_gma;       /* gma's backend missing: run the peers anyway */
  const char *json_path;
} options_t;

static options_t opt = {.device = 0, .reps = 15, .pairs = 10000, .iterations = 20,
                        .batch_ms = 50, .seed = 42, .pressure_fraction = 0.9,
                        .pressure_rounds = 3, .json_path = "bench-gpu.json"};


/* The generator gma-bench-alloc uses, so "mixed" means the same sizes there. */

static void say(char *buf, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, len, fmt, ap);
  va_end(ap);
}

/* ---- the allocators ------------------------------------------------------------- */

typedef struct side side_t;
typedef int (*alloc_fn)(side_t *sd, size_t size, cudaStream_t s, void **out);

/* One allocator under test. alloc/free return 0 or the allocator's own error
 * code, which describe() turns into text on the same thread (gma's detail is
 * thread-local). open() makes a fresh allocator before a scenario, close()
 * gives every byte back to the device after it. */
struct side {
  const char *id;   /* the JSON key */
  const char *name; /* the table's label */
  char how[200];    /* how it is driven, for the header and the JSON */
  int available;
  char why[ERRLEN]; /* why not, when !available */
  int (*open)(side_t *sd, char *err, size_t errlen);
  void (*close)(side_t *sd);
  alloc_fn alloc;
  int (*free)(side_t *sd, void *p, cudaStream_t s);
  alloc_fn alloc_async; /* NULL: not part of the async scenarios */
  void (*describe)(side_t *sd, int code, char *buf, size_t len);
  /* state */
  gma_t *g;
  const char *gma_extra; /* config on top of device:cuda (NULL: none) */
  void *cub;
};

/* direct: the driver's own cuMemAlloc/cuMemFree. */
typedef CUresult (*cu_mem_alloc_fn)(CUdeviceptr *dptr, size_t bytesize);
typedef CUresult (*cu_mem_free_fn)(CUdeviceptr dptr);
typedef CUresult (*cu_error_name_fn)(CUresult error, const char **str);
static cu_mem_alloc_fn cu_mem_alloc;
static cu_mem_free_fn cu_mem_free;
static cu_error_name_fn cu_error_name;

static int direct_alloc(side_t *sd, size_t size, cudaStream_t s, void **out) {
  CUdeviceptr d = 0;
  CUresult r = cu_mem_alloc(&d, size);
  *out = (void *)(uintptr_t)d;
  return (int)r;
}
static int direct_free(side_t *sd, void *p, cudaStream_t s) {
  return (int)cu_mem_free((CUdeviceptr)(uintptr_t)p);
}
static void direct_describe(side_t *sd, int code, char *buf, size_t len) {
  const char *name = NULL;
  if (cu_error_name) cu_error_name((CUresult)code, &name);
  say(buf, len, "CUresult %d (%s)", code, name ? name : "?");
}
static int no_open(side_t *sd, char *err, size_t errlen) { return 0; }
static void sync_close(side_t *sd) { cudaDeviceSynchronize(); }

/* cudaMallocAsync on the default pool. */
static cudaMemPool_t default_pool;

static void cuda_describe(side_t *sd, int code, char *buf, size_t len) {
  say(buf, len, "%s (%s)", cudaGetErrorName((cudaError_t)code),
      cudaGetErrorString((cudaError_t)code));
}
static int async_alloc(side_t *sd, size_t size, cudaStream_t s, void **out) {
  cudaError_t e = cudaMallocAsync(out, size, s);
  if (e != cudaSuccess) cudaGetLastError(); /* not sticky; clear it for the next call */
  return (int)e;
}
static int async_free(side_t *sd, void *p, cudaStream_t s) { return (int)cudaFreeAsync(p, s); }
static void async_close(side_t *sd) {
  cudaDeviceSynchronize();
  cudaMemPoolTrimTo(default_pool, 0);
}

/* CUB */
#ifndef GMA_BENCH_CUB_OFF
static int cub_open(side_t *sd, char *err, size_t errlen) {
  /* 2^9 = 512 B .. 2^28 = 256 MiB: every size of the pair scenarios is cached. */
  sd->cub = gma_bench_cub_create(2, 9, 28);
  if (!sd->cub) say(err, errlen, "out of host memory");
  return sd->cub ? 0 : 1;
}
static void cub_close(side_t *sd) {
  cudaDeviceSynchronize();
  gma_bench_cub_destroy(sd->cub);
  sd->cub = NULL;
}
static int cub_alloc(side_t *sd, size_t size, cudaStream_t s, void **out) {
  int e = gma_bench_cub_alloc(sd->cub, size, s, out);
  if (e) cudaGetLastError();
  return e;
}
static int cub_free(side_t *sd, void *p, cudaStream_t s) { return gma_bench_cub_free(sd->cub, p); }
#endif

/* gma */
static gma_status_t gma_make(const side_t *sd, gma_t **out) {
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_CUDA;
  c.device_ordinal = opt.device;
  c.ignore_env = 1; /* the run is described by its options alone */
  gma_status_t st = GMA_OK;
  if (opt.gma_conf) st = gma_config_parse(&c, opt.gma_conf);
  if (st == GMA_OK && sd->gma_extra) st = gma_config_parse(&c, sd->gma_extra);
  if (st == GMA_OK) st = gma_create(&c, out);
  return st;
}
/* "STATUS: detail" of the last failing gma call on this thread. */
static void gma_text(gma_status_t st, char *buf, size_t len) {
  const char *name = gma_status_name(st), *detail = gma_last_error();
  if (strncmp(detail, name, strlen(name)) == 0) /* the detail may already start with it */
    say(buf, len, "%s", detail);
  else
    say(buf, len, "%s: %s", name, detail);
}
static void gma_describe(side_t *sd, int code, char *buf, size_t len) {
  gma_text((gma_status_t)code, buf, len);
}
static int gma_open(side_t *sd, char *err, size_t errlen) {
  gma_status_t st = gma_make(sd, &sd->g);
  if (st != GMA_OK) gma_describe(sd, st, err, errlen);
  return st != GMA_OK;
}
static void gma_close(side_t *sd) {
  cudaDeviceSynchronize();
  gma_status_t st = gma_destroy(sd->g);
  if (st != GMA_OK)
    fprintf(stderr, "gma-bench-gpu: %s: gma_destroy: %s (%s)\n", sd->name, gma_status_name(st),
            gma_last_error());
  sd->g = NULL;
}
static int gma_alloc_side(side_t *sd, size_t size, cudaStream_t s, void **out) {
  return (int)gma_alloc(sd->g, size, (gma_stream_t)(void *)s, out);
}
static int gma_free_side(side_t *sd, void *p, cudaStream_t s) { return (int)gma_free(sd->g, p); }
/* The whole life of a future: submit, collect, give back. */
static int gma_alloc_async_side(side_t *sd, size_t size, cudaStream_t s, void **out) {
  gma_future_t *f;
  gma_status_t st = gma_alloc_async(sd->g, size, (gma_stream_t)(void *)s, NULL, &f);
  if (st != GMA_OK) return (int)st;
  st = gma_future_wait(f, UINT64_MAX, out);
  gma_future_release(f);
  return (int)st;
}

enum { S_DIRECT, S_ASYNC, S_CUB, S_GMA, S_GMAX, NSIDES };

static side_t sides[NSIDES] = {
    [S_DIRECT] = {.id = "direct", .name = "direct (cuMemAlloc/cuMemFree)", .open = no_open,
                  .close = sync_close, .alloc = direct_alloc, .free = direct_free,
                  .describe = direct_describe},
    [S_ASYNC] = {.id = "cudaMallocAsync", .name = "cudaMallocAsync (default pool)",
                 .open = no_open, .close = async_close, .alloc = async_alloc, .free = async_free,
                 .alloc_async = async_alloc, .describe = cuda_describe},
#ifndef GMA_BENCH_CUB_OFF
    [S_CUB] = {.id = "cub", .name = "CUB CachingDeviceAllocator", .open = cub_open,
               .close = cub_close, .alloc = cub_alloc, .free = cub_free,
               .describe = cuda_describe},
#else
    [S_CUB] = {.id = "cub", .name = "CUB CachingDeviceAllocator"},
#endif
    [S_GMA] = {.id = "gma", .name = "gma", .open = gma_open, .close = gma_close,
               .alloc = gma_alloc_side, .free = gma_free_side,
               .alloc_async = gma_alloc_async_side, .describe = gma_describe},
    [S_GMAX] = {.id = "gma_expandable", .name = "gma expandable_segments", .open = gma_open,
                .close = gma_close, .alloc = gma_alloc_side, .free = gma_free_side,
                .alloc_async = gma_alloc_async_side, .describe = gma_describe,
                .gma_extra = "expandable_segments:true"},
};

/* ---- scenarios ------------------------------------------------------------------ */

typedef enum kind { K_PAIRS, K_ASYNC, K_THREADS, K_TRAINING, K_PRESSURE } kind_t;

typedef struct scenario {
  const char *id, *name;
  kind_t kind;
  size_t size;              /* fixed size; 0: seeded random in [lo, hi) */
  unsigned lo_bits, hi_bits; /* random: log-uniform 2^lo_bits .. 2^hi_bits */
} scenario_t;

static const scenario_t scenarios[] = {
    {"same_4KiB", "same size 4 KiB", K_PAIRS, 4 * KiB, 0, 0},
    {"same_2MiB", "same size 2 MiB", K_PAIRS, 2 * MiB, 0, 0},
    {"mixed_512B_8MiB", "mixed 512 B - 8 MiB", K_PAIRS, 0, 9, 23},
    {"large_16_256MiB", "large 16 - 256 MiB", K_PAIRS, 0, 24, 28},
    {"training_loop", "training loop (6 layers)", K_TRAINING, 0, 0, 0},
    {"streams_4x4", "4 threads x own stream, 64 KiB", K_THREADS, 64 * KiB, 0, 0},
    {"async_4KiB", "async 4 KiB (bin hit)", K_ASYNC, 4 * KiB, 0, 0},
    {"async_8MiB", "async 8 MiB (worker-served)", K_ASYNC, 8 * MiB, 0, 0},
    {"memory_pressure", "memory pressure", K_PRESSURE, 0, 0, 0},
};
enum { NSC = sizeof scenarios / sizeof scenarios[0] };

/* One allocator's measurements in one scenario. */
typedef struct result {
  int ran;               /* measured (else skip says why) */
  char skip[ERRLEN];
  char error[ERRLEN];    /* the first failure, if any */
  int units;             /* pairs (threads: per thread), iterations or rounds per batch */
  int nbatches;
  double *ns;            /* ns per pair, one per batch */
  double median, p99;
  uint64_t failures;     /* failed allocations (memory pressure) */
  double total_ms;       /* memory pressure: all rounds */
  double ratio_direct, ratio_gma; /* direct/this and this/gma of the medians; 0: n/a */
} result_t;

typedef struct scenario_run {
  const scenario_t *sc;
  int ran;
  char note[ERRLEN];
  result_t r[NSIDES];
} scenario_run_t;

static int dev;
static cudaStream_t stream, tstreams[NTHREADS];
static size_t *sizes; /* opt.pairs sizes of the current pair scenario */

/* -- training loop: a fixed plan of allocations and frees on one stream -- */

enum { TL_LAYERS = 6 };
enum { TL_KEPT = 8 }; /* per layer: ln, stats, qkv, scores, attn, up, act, out */
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

/* A step of a small transformer (4 x 512 tokens, hidden 1024, 16 heads, fp16):
 * forward keeps each layer's activations for the backward pass and frees
 * GEMM/attention workspaces at once; backward walks the layers in reverse,
 * allocating gradients and freeing the activations it consumed. The same plan
 * is in torch_bench.py (training_plan). */
static void tl_plan(void) {
  const size_t tok = 4 * 512, hid = 1024, e = 2;
  const size_t act = tok * hid * e;             /* 4 MiB */
  const size_t stats = tok * 8;                 /* 16 KiB: mean and rstd in fp32 */
  const size_t scores = 4 * 16 * 512 * 512 * e; /* 32 MiB */
  for (int l = 0; l < TL_LAYERS; l++) {
    int b = l * TL_KEPT;
    tl_a(b + 0, act);      /* ln */
    tl_a(b + 1, stats);    /* stats */
    tl_a(b + 2, 3 * act);  /* qkv */
    tl_a(T_WS, 2 * act);   /* GEMM workspace */
    tl_f(T_WS);
    tl_a(b + 3, scores);   /* attention scores */
    tl_a(b + 4, act);      /* attention output */
    tl_a(b + 5, 4 * act);  /* MLP up */
    tl_a(b + 6, 4 * act);  /* activation */
    tl_a(T_WS, act);       /* workspace */
    tl_f(T_WS);
    tl_a(b + 7, act);      /* layer output */
  }
  int g = T_G0;
  tl_a(g, act); /* the loss gradient */
  for (int l = TL_LAYERS - 1; l >= 0; l--) {
    int b = l * TL_KEPT;
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
    int ng = g == T_G0 ? T_G1 : T_G0;
    tl_a(ng, act); /* the gradient for the layer below */
    tl_f(T_DQKV);
    tl_f(b + 4);
    tl_f(T_DATTN);
    tl_a(T_WGRAD, 2 * KiB); /* a bias gradient */
    tl_f(T_WGRAD);
    tl_f(b + 7);
    tl_f(b + 1);
    tl_f(b + 0);
    tl_f(g);
    g = ng;
  }
  tl_f(g);
}

/* -- batches: each returns 0, or -1 with the failure in err -- */

static int sync_err(cudaError_t e, char *err, size_t len) {
  if (e == cudaSuccess) return 0;
  say(err, len, "stream synchronize: %s", cudaGetErrorString(e));
  return -1;
}

static int batch_pairs(side_t *sd, int async, int n, uint64_t *ns, char *err, size_t len) {
  alloc_fn fa = async ? sd->alloc_async : sd->alloc;
  uint64_t t0 = now_ns();
  for (int i = 0; i < n; i++) {
    void *p;
    int st = fa(sd, sizes[i], stream, &p);
    if (st) {
      sd->describe(sd, st, err, len);
      return -1;
    }
    st = sd->free(sd, p, stream);
    if (st) {
      sd->describe(sd, st, err, len);
      return -1;
    }
  }
  if (sync_err(cudaStreamSynchronize(stream), err, len)) return -1;
  *ns = now_ns() - t0;
  return 0;
}

static int batch_training(side_t *sd, int n, uint64_t *ns, char *err, size_t len) {
  void *slot[TL_SLOTS] = {NULL};
  int rc = 0;
  uint64_t t0 = now_ns();
  for (int it = 0; it < n && rc == 0; it++) {
    for (int k = 0; k < tl_nops; k++) {
      const tl_op_t *op = &tl_ops[k];
      int st;
      if (op->size) {
        st = sd->alloc(sd, op->size, stream, &slot[op->slot]);
        if (st) slot[op->slot] = NULL;
      } else {
        st = sd->free(sd, slot[op->slot], stream);
        slot[op->slot] = NULL;
      }
      if (st) {
        sd->describe(sd, st, err, len);
        rc = -1;
        break;
      }
    }
  }
  for (int k = 0; k < TL_SLOTS; k++) /* after a failure: give back what is held */
    if (slot[k]) sd->free(sd, slot[k], stream);
  if (rc == 0) rc = sync_err(cudaStreamSynchronize(stream), err, len);
  *ns = now_ns() - t0;
  return rc;
}

typedef struct thr {
  side_t *sd;
  cudaStream_t s;
  int n;
  size_t size;
  pthread_barrier_t *bar;
  uint64_t t0, t1;
  int rc;
  char err[ERRLEN];
} thr_t;

static void *thr_main(void *arg) {
  thr_t *t = arg;
  cudaSetDevice(dev); /* makes the primary context current here too (cuMemAlloc needs it) */
  pthread_barrier_wait(t->bar);
  t->t0 = now_ns();
  for (int i = 0; i < t->n && !t->rc; i++) {
    void *p;
    int st = t->sd->alloc(t->sd, t->size, t->s, &p);
    if (!st) st = t->sd->free(t->sd, p, t->s);
    if (st) {
      t->sd->describe(t->sd, st, t->err, sizeof t->err);
      t->rc = -1;
    }
  }
  if (!t->rc) t->rc = sync_err(cudaStreamSynchronize(t->s), t->err, sizeof t->err);
  t->t1 = now_ns();
  return NULL;
}

/* NTHREADS threads, each on its own stream, n pairs each; the batch lasts
 * from the first thread's start to the last one's end. */
static int batch_threads(side_t *sd, size_t size, int n, uint64_t *ns, char *err, size_t len) {
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, NTHREADS);
  thr_t t[NTHREADS];
  pthread_t tid[NTHREADS];
  int started = 0;
  for (int i = 0; i < NTHREADS; i++) {
    t[i] = (thr_t){.sd = sd, .s = tstreams[i], .n = n, .size = size, .bar = &bar};
    if (pthread_create(&tid[i], NULL, thr_main, &t[i]) != 0) break;
    started++;
  }
  if (started < NTHREADS) { /* cannot happen in practice; release the waiters */
    fprintf(stderr, "gma-bench-gpu: pthread_create failed\n");
    exit(1);
  }
  uint64_t first = UINT64_MAX, last = 0;
  int rc = 0;
  for (int i = 0; i < NTHREADS; i++) {
    pthread_join(tid[i], NULL);
    if (t[i].t0 < first) first = t[i].t0;
    if (t[i].t1 > last) last = t[i].t1;
    if (t[i].rc && !rc) {
      rc = -1;
      say(err, len, "%s", t[i].err);
    }
  }
  pthread_barrier_destroy(&bar);
  *ns = last - first;
  return rc;
}

static int run_batch(const scenario_t *sc, side_t *sd, int n, uint64_t *ns, char *err,
                     size_t len) {
  switch (sc->kind) {
    case K_PAIRS: return batch_pairs(sd, 0, n, ns, err, len);
    case K_ASYNC: return batch_pairs(sd, 1, n, ns, err, len);
    case K_THREADS: return batch_threads(sd, sc->size, n, ns, err, len);
    case K_TRAINING: return batch_training(sd, n, ns, err, len);
    case K_PRESSURE: break;
  }
  return -1;
}

/* ---- statistics ------------------------------------------------------------------ */


/* Median and nearest-rank p99 of the batches (sorts a copy). */
static void summarize(result_t *r) {
  int n = r->nbatches;
  if (n < 1) return;
  double *v = malloc((size_t)n * sizeof *v);
  if (!v) abort();
  memcpy(v, r->ns, (size_t)n * sizeof *v);
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  r->median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  int rank = (int)((99 * (long)n + 99) / 100);
  r->p99 = v[rank - 1];
  free(v);
}

/* ---- one scenario ------------------------------------------------------------------ */

static int side_in(const scenario_t *sc, const side_t *sd) {
  return sc->kind == K_ASYNC ? sd->alloc_async != NULL : 1;
}

static void fill_sizes(const scenario_t *sc) {
  uint64_t rng = opt.seed ? opt.seed : 1;
  for (int i = 0; i < opt.pairs; i++) {
    if (sc->size) {
      sizes[i] = sc->size;
    } else {
      /* Log-uniform: [2^b, 2^(b+1)) with b uniform in [lo_bits, hi_bits). */
      unsigned bits = sc->lo_bits + (unsigned)(xorshift(&rng) % (sc->hi_bits - sc->lo_bits));
      size_t lo = (size_t)1 << bits;
      sizes[i] = lo + (size_t)(xorshift(&rng) % lo);
    }
  }
}

static double pairs_per_unit(const scenario_t *sc) {
  return sc->kind == K_TRAINING ? (double)tl_nallocs : 1.0;
}

static void run_interleaved(scenario_run_t *run) {
  const scenario_t *sc = run->sc;
  int maxu = sc->kind == K_TRAINING ? opt.iterations : opt.pairs;
  int probe = sc->kind == K_TRAINING ? 1 : (maxu < 32 ? maxu : 32);
  int minu = sc->kind == K_TRAINING ? 1 : (maxu < 16 ? maxu : 16);
  if (sc->kind == K_PAIRS || sc->kind == K_ASYNC) fill_sizes(sc);
  int active[NSIDES] = {0};
  for (int i = 0; i < NSIDES; i++) {
    side_t *sd = &sides[i];
    result_t *r = &run->r[i];
    if (!sd->available) {
      say(r->skip, sizeof r->skip, "%s", sd->why);
      continue;
    }
    if (!side_in(sc, sd)) {
      say(r->skip, sizeof r->skip, "no async allocation call");
      continue;
    }
    if (sd->open(sd, r->error, sizeof r->error)) continue;
    r->ns = calloc((size_t)opt.reps, sizeof *r->ns);
    if (!r->ns) abort();
    /* Warm-up (caches fill, the device maps pages), then a probe sizes the
     * batches to about --batch-ms. */
    uint64_t ns;
    if (run_batch(sc, sd, probe, &ns, r->error, sizeof r->error) ||
        run_batch(sc, sd, probe, &ns, r->error, sizeof r->error)) {
      sd->close(sd);
      continue;
    }
    double per = (double)ns / probe;
    double fit = (double)opt.batch_ms * 1e6 / (per > 1 ? per : 1);
    r->units = fit >= maxu ? maxu : fit < minu ? minu : (int)fit;
    r->ran = 1;
    active[i] = 1;
  }
  for (int rep = 0; rep < opt.reps; rep++) {
    for (int i = 0; i < NSIDES; i++) {
      if (!active[i]) continue;
      result_t *r = &run->r[i];
      uint64_t ns;
      if (run_batch(sc, &sides[i], r->units, &ns, r->error, sizeof r->error)) {
        active[i] = 0; /* keep what it measured; the error is reported */
        continue;
      }
      r->ns[r->nbatches++] = (double)ns / ((double)r->units * pairs_per_unit(sc));
    }
  }
  for (int i = 0; i < NSIDES; i++) {
    result_t *r = &run->r[i];
    if (!r->ran) continue;
    sides[i].close(&sides[i]);
    summarize(r);
  }
}

/* Memory pressure: one allocator at a time, each starting from a device
 * whose memory every other allocator gave back. A round allocates blocks of
 * one size until the working set is reached, frees them all, and does the
 * same with a larger and then a smaller size: a cache full of the previous
 * size must give memory back (or coalesce it) for the next. */
enum { PRESS_PHASES = 3, PRESS_MAX_BLOCKS = 96 };
static const int press_blocks[PRESS_PHASES] = {64, 40, 96};

static void run_pressure(scenario_run_t *run) {
  size_t free_b = 0, total_b = 0;
  cudaDeviceSynchronize();
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    say(run->note, sizeof run->note, "cudaMemGetInfo failed");
    return;
  }
  double ws = (double)free_b * opt.pressure_fraction;
  size_t bsize[PRESS_PHASES];
  int attempts = 0;
  for (int p = 0; p < PRESS_PHASES; p++) {
    bsize[p] = (size_t)(ws / press_blocks[p]) / (2 * MiB) * (2 * MiB);
    if (bsize[p] < 2 * MiB) bsize[p] = 2 * MiB;
    attempts += press_blocks[p];
  }
  say(run->note, sizeof run->note,
      "working set %.1f GiB = %.0f%% of %.1f GiB free; per round %d x %zu MiB, %d x %zu MiB, "
      "%d x %zu MiB",
      ws / (double)(1 << 30), opt.pressure_fraction * 100, (double)free_b / (1 << 30),
      press_blocks[0], bsize[0] / MiB, press_blocks[1], bsize[1] / MiB, press_blocks[2],
      bsize[2] / MiB);
  for (int i = 0; i < NSIDES; i++) {
    side_t *sd = &sides[i];
    result_t *r = &run->r[i];
    if (!sd->available) {
      say(r->skip, sizeof r->skip, "%s", sd->why);
      continue;
    }
    if (sd->open(sd, r->error, sizeof r->error)) continue;
    r->ns = calloc((size_t)opt.pressure_rounds, sizeof *r->ns);
    if (!r->ns) abort();
    r->ran = 1;
    r->units = 1;
    uint64_t start = now_ns();
    for (int round = 0; round < opt.pressure_rounds; round++) {
      uint64_t t0 = now_ns();
      for (int p = 0; p < PRESS_PHASES; p++) {
        void *held[PRESS_MAX_BLOCKS] = {NULL};
        for (int k = 0; k < press_blocks[p]; k++) {
          int st = sd->alloc(sd, bsize[p], stream, &held[k]);
          if (st) {
            held[k] = NULL;
            if (!r->failures++) sd->describe(sd, st, r->error, sizeof r->error);
          }
        }
        for (int k = 0; k < press_blocks[p]; k++) {
          if (!held[k]) continue;
          int st = sd->free(sd, held[k], stream);
          if (st && !r->error[0]) sd->describe(sd, st, r->error, sizeof r->error);
        }
        cudaStreamSynchronize(stream);
      }
      r->ns[r->nbatches++] = (double)(now_ns() - t0) / attempts;
    }
    r->total_ms = (double)(now_ns() - start) / 1e6;
    sd->close(sd);
    summarize(r);
  }
}

/* ---- output ------------------------------------------------------------------------ */

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

static void json_num(FILE *f, double v) {
  if (v > 0 && isfinite(v))
    fprintf(f, "%.2f", v);
  else
    fputs("null", f);
}

static void json_config_common(FILE *f) {
  fprintf(f, "\"gma_version\": \"%s\", \"build_type\": \"%s\", \"gma_debug\": %d",
          gma_version(), GMA_BENCH_BUILD_TYPE, GMA_DEBUG);
}

static void write_skipped(const char *reason) {
  FILE *f = fopen(opt.json_path, "w");
  if (!f) {
    perror(opt.json_path);
    return;
  }
  fprintf(f, "{\n  \"benchmark\": \"gma-bench-gpu\",\n  \"skipped\": ");
  json_str(f, reason);
  fprintf(f, ",\n  \"config\": {");
  json_config_common(f);
  fprintf(f, "}\n}\n");
  fclose(f);
}

typedef struct gpu_info {
  char name[256];
  size_t total;
  int driver, runtime;
  int cuda_devices, gma_devices; /* cudaGetDeviceCount, gma_device_count (-1: failed) */
} gpu_info_t;

static void write_json(const gpu_info_t *gi, const scenario_run_t *runs, int n) {
  FILE *f = fopen(opt.json_path, "w");
  if (!f) {
    perror(opt.json_path);
    exit(1);
  }
  fprintf(f, "{\n  \"benchmark\": \"gma-bench-gpu\",\n  \"config\": {");
  json_config_common(f);
  fprintf(f, ", \"device\": \"cuda\", \"gpu\": ");
  json_str(f, gi->name);
  fprintf(f,
          ", \"device_ordinal\": %d, \"total_memory\": %zu, \"driver_version\": %d, "
          "\"runtime_version\": %d, \"cuda_device_count\": %d, \"gma_device_count\": %d, "
          "\"reps\": %d, \"max_pairs_per_batch\": %d, "
          "\"max_iterations_per_batch\": %d, \"batch_ms\": %d, \"seed\": %" PRIu64
          ", \"pressure_fraction\": %.2f, \"pressure_rounds\": %d, \"gma_conf\": ",
          opt.device, gi->total, gi->driver, gi->runtime, gi->cuda_devices, gi->gma_devices,
          opt.reps, opt.pairs, opt.iterations,
          opt.batch_ms, opt.seed, opt.pressure_fraction, opt.pressure_rounds);
  json_str(f, opt.gma_conf ? opt.gma_conf : "");
  fprintf(f, ", \"unit\": \"ns per alloc+free pair\", \"p99\": \"nearest rank across batches\", "
             "\"reference\": \"gma\", \"baseline\": \"direct\"},\n  \"allocators\": {\n");
  for (int i = 0; i < NSIDES; i++) {
    fprintf(f, "    \"%s\": {\"name\": ", sides[i].id);
    json_str(f, sides[i].name);
    fprintf(f, ", \"how\": ");
    json_str(f, sides[i].how);
    fprintf(f, ", \"available\": %s, \"reason\": ", sides[i].available ? "true" : "false");
    if (sides[i].available)
      fputs("null", f);
    else
      json_str(f, sides[i].why);
    fprintf(f, "}%s\n", i + 1 < NSIDES ? "," : "");
  }
  fprintf(f, "  },\n  \"scenarios\": [\n");
  for (int s = 0; s < n; s++) {
    const scenario_run_t *run = &runs[s];
    fprintf(f, "    {\"id\": \"%s\", \"name\": ", run->sc->id);
    json_str(f, run->sc->name);
    fprintf(f, ", \"unit\": \"%s\"",
            run->sc->kind == K_TRAINING   ? "ns per alloc+free pair (iteration / allocations)"
            : run->sc->kind == K_PRESSURE ? "ns per allocation attempted (round / attempts)"
            : run->sc->kind == K_THREADS  ? "ns per alloc+free pair per thread (batch wall time)"
                                          : "ns per alloc+free pair");
    if (run->sc->kind == K_TRAINING)
      fprintf(f, ", \"allocations_per_iteration\": %d, \"layers\": %d", tl_nallocs, TL_LAYERS);
    if (run->sc->kind == K_THREADS) fprintf(f, ", \"threads\": %d", NTHREADS);
    if (run->note[0]) {
      fprintf(f, ", \"note\": ");
      json_str(f, run->note);
    }
    fprintf(f, ", \"results\": {\n");
    for (int i = 0; i < NSIDES; i++) {
      const result_t *r = &run->r[i];
      fprintf(f, "      \"%s\": {", sides[i].id);
      if (!r->ran) {
        fprintf(f, "\"skipped\": ");
        json_str(f, r->skip[0] ? r->skip : r->error);
      } else {
        fprintf(f, "\"median_ns\": ");
        json_num(f, r->nbatches ? r->median : 0);
        fprintf(f, ", \"p99_ns\": ");
        json_num(f, r->nbatches ? r->p99 : 0);
        fprintf(f, ", \"units_per_batch\": %d, \"batches\": %d, \"failures\": %" PRIu64,
                r->units, r->nbatches, r->failures);
        if (run->sc->kind == K_PRESSURE) fprintf(f, ", \"total_ms\": %.1f", r->total_ms);
        fprintf(f, ", \"ratio_direct_over_this\": ");
        json_num(f, r->ratio_direct);
        fprintf(f, ", \"ratio_this_over_gma\": ");
        json_num(f, r->ratio_gma);
        fprintf(f, ", \"error\": ");
        if (r->error[0])
          json_str(f, r->error);
        else
          fputs("null", f);
        fprintf(f, ", \"batches_ns\": [");
        for (int k = 0; k < r->nbatches; k++) fprintf(f, "%s%.1f", k ? ", " : "", r->ns[k]);
        fputc(']', f);
      }
      fprintf(f, "}%s\n", i + 1 < NSIDES ? "," : "");
    }
    fprintf(f, "    }}%s\n", s + 1 < n ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  fclose(f);
}

static void print_table(const scenario_run_t *runs, int n) {
  printf("\n%-36s %12s %12s %9s %9s %8s %9s\n", "scenario / allocator (ns per pair)", "median",
         "p99", "per batch", "direct/x", "x/gma", "failed");
  for (int s = 0; s < n; s++) {
    const scenario_run_t *run = &runs[s];
    printf("%s\n", run->sc->name);
    for (int i = 0; i < NSIDES; i++) {
      const result_t *r = &run->r[i];
      if (!r->ran) {
        printf("  %-34s %.60s\n", sides[i].name,
               r->skip[0] ? r->skip : r->error[0] ? "failed to start (see below)" : "-");
        continue;
      }
      char rd[16] = "-", rg[16] = "-";
      if (r->ratio_direct > 0) say(rd, sizeof rd, "%.1fx", r->ratio_direct);
      if (r->ratio_gma > 0) say(rg, sizeof rg, "%.2fx", r->ratio_gma);
      if (r->nbatches)
        printf("  %-34s %12.0f %12.0f %9d %9s %8s %9" PRIu64 "\n", sides[i].name, r->median,
               r->p99, r->units, rd, rg, r->failures);
      else
        printf("  %-34s %12s %12s %9d %9s %8s %9" PRIu64 "\n", sides[i].name, "-", "-",
               r->units, rd, rg, r->failures);
    }
    if (run->note[0]) printf("  (%s)\n", run->note);
  }
  printf("(median and p99 across batches; per batch: pairs, per thread for the threads "
         "scenario,\n iterations for the training loop (%d allocations each), rounds under "
         "memory pressure;\n direct/x: how many times faster than cuMemAlloc/cuMemFree; x/gma: "
         "above 1 means slower than gma)\n",
         tl_nallocs);
  int any = 0;
  for (int s = 0; s < n; s++)
    for (int i = 0; i < NSIDES; i++) {
      const result_t *r = &runs[s].r[i];
      if (!r->error[0]) continue;
      if (!any++) printf("\nerrors (the first per scenario and allocator):\n");
      printf("  %s / %s: %s%s\n", runs[s].sc->name, sides[i].id, r->error,
             runs[s].sc->kind == K_PRESSURE && r->failures ? " (counted, run went on)" : "");
    }
}

/* ---- start-up -------------------------------------------------------------------- */

static void usage(void) {
  fprintf(stderr,
          "usage: gma-bench-gpu [--device N] [--reps N] [--pairs N] [--iterations N]\n"
          "                     [--batch-ms N] [--seed N] [--pressure-fraction F]\n"
          "                     [--pressure-rounds N] [--scenarios ID,ID] [--gma-conf TEXT]\n"
          "                     [--allow-no-gma] [--json PATH]\n"
          "  --device N             CUDA device ordinal (default 0)\n"
          "  --reps N               timed batches per allocator (default 15)\n"
          "  --pairs N              most alloc+free pairs per batch (default 10000)\n"
          "  --iterations N         most training-loop iterations per batch (default 20)\n"
          "  --batch-ms N           target duration of one batch (default 50)\n"
          "  --seed N               seed of the random sizes (default 42)\n"
          "  --pressure-fraction F  working set under memory pressure, of free memory (0.9)\n"
          "  --pressure-rounds N    rounds under memory pressure (default 3)\n"
          "  --scenarios LIST       run only these (ids:");
  for (int i = 0; i < NSC; i++) fprintf(stderr, " %s", scenarios[i].id);
  fprintf(stderr,
          ")\n"
          "  --gma-conf TEXT        extra gma configuration for both gma allocators\n"
          "  --allow-no-gma         without gma's CUDA backend, measure the other allocators\n"
          "  --json PATH            where to write the results (default bench-gpu.json)\n"
          "exit status: 0 measured, 77 no GPU available (JSON says \"skipped\"), 1 error\n");
  exit(2);
}

static long parse_long(const char *s, long lo, long hi) {
  char *end;
  long v = strtol(s, &end, 0);
  if (*s == '\0' || *end != '\0' || v < lo || v > hi) usage();
  return v;
}

static void parse_args(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--allow-no-gma") == 0) {
      opt.allow_no_gma = 1;
      continue;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0 || i + 1 >= argc) usage();
    const char *v = argv[++i];
    if (strcmp(a, "--device") == 0)
      opt.device = (int)parse_long(v, 0, 1023);
    else if (strcmp(a, "--reps") == 0)
      opt.reps = (int)parse_long(v, 1, 100000);
    else if (strcmp(a, "--pairs") == 0)
      opt.pairs = (int)parse_long(v, 1, 100000000);
    else if (strcmp(a, "--iterations") == 0)
      opt.iterations = (int)parse_long(v, 1, 1000000);
    else if (strcmp(a, "--batch-ms") == 0)
      opt.batch_ms = (int)parse_long(v, 1, 600000);
    else if (strcmp(a, "--seed") == 0)
      opt.seed = (uint64_t)parse_long(v, 0, INT64_MAX);
    else if (strcmp(a, "--pressure-rounds") == 0)
      opt.pressure_rounds = (int)parse_long(v, 1, 1000);
    else if (strcmp(a, "--pressure-fraction") == 0) {
      char *end;
      opt.pressure_fraction = strtod(v, &end);
      if (*end || !(opt.pressure_fraction > 0 && opt.pressure_fraction <= 1)) usage();
    } else if (strcmp(a, "--scenarios") == 0)
      opt.scenarios = v;
    else if (strcmp(a, "--gma-conf") == 0)
      opt.gma_conf = v;
    else if (strcmp(a, "--json") == 0)
      opt.json_path = v;
    else
      usage();
  }
  if (opt.scenarios) { /* every listed id must exist */
    const char *p = opt.scenarios;
    while (*p) {
      size_t len = strcspn(p, ",");
      int found = 0;
      for (int i = 0; i < NSC; i++)
        if (strlen(scenarios[i].id) == len && strncmp(scenarios[i].id, p, len) == 0) found = 1;
      if (!found) usage();
      p += len + (p[len] == ',');
    }
  }
}

static int selected(const scenario_t *sc) {
  if (!opt.scenarios) return 1;
  size_t n = strlen(sc->id);
  for (const char *p = opt.scenarios; *p;) {
    size_t len = strcspn(p, ",");
    if (len == n && strncmp(p, sc->id, n) == 0) return 1;
    p += len + (p[len] == ',');
  }
  return 0;
}

static int skip_run(const char *fmt, ...) {
  char reason[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  printf("gma-bench-gpu: no GPU available: %s; nothing measured (exit 77)\n", reason);
  write_skipped(reason);
  return EXIT_SKIP;
}

static void die_cuda(const char *what, cudaError_t e) {
  fprintf(stderr, "gma-bench-gpu: %s: %s (%s)\n", what, cudaGetErrorName(e),
          cudaGetErrorString(e));
  exit(1);
}

/* The driver's entry points through the runtime: no link against libcuda. */
static void *driver_entry(const char *symbol, char *why, size_t len) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  /* 12000: the ABI of CUDA 12 (cuMemAlloc is cuMemAlloc_v2 there). */
  cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &q);
#else
  cudaError_t e = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &q);
#endif
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) {
    say(why, len, "the driver has no %s (%s, query result %d)", symbol, cudaGetErrorName(e),
        (int)q);
    return NULL;
  }
  return fn;
}

static void setup_peers(void) {
  side_t *d = &sides[S_DIRECT];
  cu_mem_alloc = (cu_mem_alloc_fn)driver_entry("cuMemAlloc", d->why, sizeof d->why);
  cu_mem_free = cu_mem_alloc ? (cu_mem_free_fn)driver_entry("cuMemFree", d->why, sizeof d->why)
                             : NULL;
  char ignored[ERRLEN];
  cu_error_name = (cu_error_name_fn)driver_entry("cuGetErrorName", ignored, sizeof ignored);
  d->available = cu_mem_alloc && cu_mem_free;
  say(d->how, sizeof d->how,
      "cuMemAlloc_v2/cuMemFree_v2 from cudaGetDriverEntryPoint%s, no caching",
      CUDART_VERSION >= 12050 ? "ByVersion(12000)" : "");

  side_t *a = &sides[S_ASYNC];
  int pools = 0;
  cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev);
  if (!pools) {
    say(a->why, sizeof a->why, "the device does not support memory pools");
  } else if (cudaDeviceGetDefaultMemPool(&default_pool, dev) != cudaSuccess) {
    say(a->why, sizeof a->why, "cudaDeviceGetDefaultMemPool failed");
  } else {
    uint64_t threshold = UINT64_MAX;
    cudaError_t e = cudaMemPoolSetAttribute(default_pool, cudaMemPoolAttrReleaseThreshold,
                                            &threshold);
    if (e != cudaSuccess)
      say(a->why, sizeof a->why, "cudaMemPoolSetAttribute(ReleaseThreshold): %s",
          cudaGetErrorString(e));
    else
      a->available = 1;
  }
  say(a->how, sizeof a->how,
      "cudaMallocAsync/cudaFreeAsync on the default mempool, release threshold UINT64_MAX; "
      "trimmed to 0 after each scenario");

  side_t *c = &sides[S_CUB];
#ifndef GMA_BENCH_CUB_OFF
  c->available = 1;
  say(c->how, sizeof c->how,
      "%s cub::CachingDeviceAllocator(bin_growth 2, min_bin 9, max_bin 28, no cache cap): "
      "bins 512 B..256 MiB, larger blocks uncached",
      gma_bench_cub_version());
#else
  say(c->why, sizeof c->why, "not built: %s", GMA_BENCH_CUB_OFF);
  say(c->how, sizeof c->how, "not built");
#endif
}

int main(int argc, char **argv) {
  parse_args(argc, argv);
  setvbuf(stdout, NULL, _IOLBF, 0);

  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess)
    return skip_run("cudaGetDeviceCount failed with %s (%s)%s", cudaGetErrorName(e),
                    cudaGetErrorString(e),
                    e == cudaErrorInsufficientDriver
                        ? ": no CUDA driver is installed, or it is older than this runtime"
                        : "");
  if (count == 0) return skip_run("the CUDA driver reports no device");
  if (opt.device >= count)
    return skip_run("--device %d, but the driver reports %d device(s)", opt.device, count);
  dev = opt.device;
  if ((e = cudaSetDevice(dev)) != cudaSuccess) die_cuda("cudaSetDevice", e);
  if ((e = cudaFree(NULL)) != cudaSuccess) die_cuda("creating the primary context", e);

  /* gma: is its CUDA backend here? */
  for (int i = S_GMA; i <= S_GMAX; i++) {
    side_t *sd = &sides[i];
    gma_t *g = NULL;
    gma_status_t st = gma_make(sd, &g);
    if (st == GMA_OK) {
      sd->available = 1;
      gma_destroy(g);
    } else {
      char text[ERRLEN];
      gma_text(st, text, sizeof text);
      say(sd->why, sizeof sd->why, "gma_create(device:cuda%s%s): %s", sd->gma_extra ? "," : "",
          sd->gma_extra ? sd->gma_extra : "", text);
      if (i == S_GMA && st == GMA_ERR_NO_DEVICE && !opt.allow_no_gma)
        return skip_run("gma has no CUDA device (gma_create(device:cuda): %s; run with "
                        "--allow-no-gma to measure the other allocators)",
                        text);
      if (i == S_GMA && st != GMA_ERR_NO_DEVICE) {
        fprintf(stderr, "gma-bench-gpu: %s\n", sd->why);
        return 1;
      }
    }
    say(sd->how, sizeof sd->how, "gma_alloc/gma_free (async: gma_alloc_async, gma_future_wait, "
        "gma_future_release), config device:cuda%s%s%s%s",
        sd->gma_extra ? "," : "", sd->gma_extra ? sd->gma_extra : "",
        opt.gma_conf ? "," : "", opt.gma_conf ? opt.gma_conf : "");
  }
  setup_peers();

  gpu_info_t gi;
  memset(&gi, 0, sizeof gi);
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess) {
    say(gi.name, sizeof gi.name, "%s", prop.name);
    gi.total = prop.totalGlobalMem;
  }
  cudaDriverGetVersion(&gi.driver);
  cudaRuntimeGetVersion(&gi.runtime);
  gi.cuda_devices = count;
  if (gma_device_count(&gi.gma_devices) != GMA_OK) gi.gma_devices = -1;

  if ((e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess)
    die_cuda("cudaStreamCreateWithFlags", e);
  for (int i = 0; i < NTHREADS; i++)
    if ((e = cudaStreamCreateWithFlags(&tstreams[i], cudaStreamNonBlocking)) != cudaSuccess)
      die_cuda("cudaStreamCreateWithFlags", e);
  sizes = malloc((size_t)opt.pairs * sizeof *sizes);
  if (!sizes) abort();
  tl_plan();

  printf("gma-bench-gpu: gma %s, %s build (GMA_DEBUG=%d), %s (device %d of %d, %.1f GiB), "
         "driver %d.%d, runtime %d.%d\n",
         gma_version(), GMA_BENCH_BUILD_TYPE, GMA_DEBUG, gi.name, dev, count,
         (double)gi.total / (1 << 30), gi.driver / 1000, gi.driver % 1000 / 10,
         gi.runtime / 1000, gi.runtime % 1000 / 10);
  if (gi.gma_devices != count)
    printf("  note: gma_device_count reports %d device(s), the CUDA runtime %d\n",
           gi.gma_devices, count);
  printf("  %d batches per allocator of about %d ms (at most %d pairs / %d iterations), seed %"
         PRIu64 "\n", opt.reps, opt.batch_ms, opt.pairs, opt.iterations, opt.seed);
  if (GMA_DEBUG > 0)
    printf("  note: GMA_DEBUG>0 validates gma's pool on every call; use a Release build for "
           "numbers to quote\n");
  for (int i = 0; i < NSIDES; i++)
    printf("  %-16s %s\n", sides[i].id, sides[i].available ? sides[i].how : sides[i].why);

  scenario_run_t runs[NSC];
  memset(runs, 0, sizeof runs);
  int n = 0;
  for (int s = 0; s < NSC; s++) {
    if (!selected(&scenarios[s])) continue;
    scenario_run_t *run = &runs[n++];
    run->sc = &scenarios[s];
    printf("running: %s\n", run->sc->name);
    if (run->sc->kind == K_PRESSURE)
      run_pressure(run);
    else
      run_interleaved(run);
    run->ran = 1;
    const result_t *rd = &run->r[S_DIRECT], *rg = &run->r[S_GMA];
    for (int i = 0; i < NSIDES; i++) {
      result_t *r = &run->r[i];
      if (!r->nbatches) continue;
      if (rd->nbatches && r->median > 0) r->ratio_direct = rd->median / r->median;
      if (rg->nbatches && rg->median > 0) r->ratio_gma = r->median / rg->median;
    }
  }
  print_table(runs, n);
  write_json(&gi, runs, n);
  printf("\nwrote %s\n", opt.json_path);

  for (int i = 0; i < NTHREADS; i++) cudaStreamDestroy(tstreams[i]);
  cudaStreamDestroy(stream);
  for (int s = 0; s < n; s++)
    for (int i = 0; i < NSIDES; i++) free(runs[s].r[i].ns);
  free(sizes);
  return 0;
}
