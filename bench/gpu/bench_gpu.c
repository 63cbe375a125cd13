/* gma-bench-gpu: gma on a real GPU against the allocators a CUDA program
 * would otherwise use, all in this one process and run, on the same streams,
 * with real kernels between the allocations:
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
 *   gma_wait         gma's default, with the peers' cross-stream mechanism
 *                    (the allocating stream waits on an event of the using
 *                    stream, then gma_free): cross-stream scenarios only, so
 *                    gma's own mechanism (gma_record_stream) can be compared
 *                    like for like.
 *
 * GPU work (gpu_work.cu, compiled by nvcc): every buffer an allocator hands
 * out is touched by a kernel on the stream it was allocated on (one byte
 * every 256 bytes) before it is freed, so a stream-ordered allocator's
 * reuse is gated by work the device really has to run; a spin kernel holds
 * a second stream for --spin-us microseconds where a buffer is used across
 * streams.
 *
 * Scenarios: alloc, touch, free of one size (4 KiB, 2 MiB) on one stream;
 * seeded random sizes 512 B .. 8 MiB and 16 .. 256 MiB; cross-stream (64
 * KiB .. 4 MiB allocated and touched on stream A, then used on stream B
 * after a spin, and freed while B still runs: each allocator's own
 * cross-stream mechanism, see free_cross below); a transformer-like
 * training loop (activations allocated layer by layer forward and freed
 * backward, each touched; each layer's gradient also "all-reduced" on a
 * second stream, a spin and a touch there, and freed cross-stream); 4
 * threads each on its own stream; async allocation (gma_alloc_async's
 * future against cudaMallocAsync's stream-ordered enqueue); memory pressure
 * (a working set of 90% of the free device memory in three phases of
 * different block sizes, every block touched, so caches must give memory
 * back). Every batch ends with a synchronization of the streams it used,
 * inside its timed region, so stream-ordered frees and the kernels are paid
 * for.
 *
 * Measured, per scenario and allocator:
 *   - pair time: the batch's wall time / alloc+free pairs in it (training
 *     loop: / allocations in an iteration; threads: per thread), median
 *     across batches; under memory pressure, the round's wall time /
 *     allocations that succeeded (failures are counted separately, so
 *     failing fast is not rewarded);
 *   - per-call latency: every alloc and free call is timed on its own
 *     (CLOCK_MONOTONIC around the call; a cross-stream free includes the
 *     mechanism's calls); p50, p99 and max by nearest rank over all calls of
 *     the timed batches;
 *   - CPU time during the timed batches: the calling threads'
 *     (CLOCK_THREAD_CPUTIME_ID), the rest of the process
 *     (CLOCK_PROCESS_CPUTIME_ID minus the callers': gma's worker, the CUDA
 *     runtime's threads), and for gma its own threads alone (the threads
 *     that appeared in /proc/self/task while gma_create ran, read through
 *     their per-thread CPU clocks);
 *   - peak footprint: the device memory the allocator held at its peak
 *     during its turn, from its own statistics (gma_stats reserved.peak,
 *     the pool's cudaMemPoolAttrReservedMemHigh, CUB's cached_bytes balance
 *     after each allocation) or, for direct, the requested bytes live at
 *     once (what cuMemAlloc held, before the driver's rounding).
 *
 * Allocators run one at a time: for each scenario each allocator gets a
 * turn of its own (a fresh allocator, a warm-up batch, a probe that sizes
 * batches to about --batch-ms, --reps timed batches, then everything is
 * given back and, for gma, the allocator destroyed with its worker), so
 * nothing of another allocator runs while one is timed.
 *
 * Without a GPU (no driver, no device, or gma's CUDA backend missing) it says
 * so on one line, writes {"skipped": reason} to the JSON file and exits 77.
 * It checks statuses only: correctness belongs to the tests. */
#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include <cuda.h> /* CUresult and CUdeviceptr only: the driver is reached through the runtime */
#include <cuda_runtime_api.h>

#include "benchkit.h"
#include "gma.h"
#include "gpu_work.h"
#ifndef GMA_BENCH_CUB_OFF
#include "cub_alloc.h"
#endif

#define EXIT_SKIP 77 /* CTest's and automake's "skipped" */

enum { NTHREADS = 4, ERRLEN = 320, MAX_TIDS = 16 };

/* ---- options -------------------------------------------------------------------- */

typedef struct options {
  int device;
  int reps;               /* timed batches per allocator */
  int pairs;              /* most pairs per batch */
  int iterations;         /* most training iterations per batch */
  int batch_ms;           /* a batch's target duration */
  int spin_us;            /* how long the second stream is held in cross-stream use */
  uint64_t seed;
  double pressure_fraction; /* working set / free device memory */
  int pressure_rounds;
  const char *scenarios;  /* comma-separated ids, NULL: all */
  const char *gma_conf;   /* extra config for both gma allocators */
  int allow_no_gma;       /* gma's backend missing: run the peers anyway */
  const char *json_path;
} options_t;

static options_t opt = {.device = 0, .reps = 15, .pairs = 10000, .iterations = 20,
                        .batch_ms = 50, .spin_us = 20, .seed = 42, .pressure_fraction = 0.9,
                        .pressure_rounds = 3, .json_path = "bench-gpu.json"};

static void say(char *buf, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, len, fmt, ap);
  va_end(ap);
}

/* ---- samples and percentiles ----------------------------------------------------- */

/* A growing array of per-call latencies in ns. */
typedef struct samples {
  double *v;
  size_t n, cap;
} samples_t;

static void samples_reserve(samples_t *s, size_t cap) {
  if (cap <= s->cap) return;
  s->v = realloc(s->v, cap * sizeof *s->v);
  if (!s->v) abort();
  s->cap = cap;
}

static void samples_push(samples_t *s, double x) {
  if (s->n == s->cap) samples_reserve(s, s->cap ? 2 * s->cap : 1024);
  s->v[s->n++] = x;
}

static void samples_append(samples_t *to, const samples_t *from) {
  samples_reserve(to, to->n + from->n);
  if (from->n) memcpy(to->v + to->n, from->v, from->n * sizeof *from->v);
  to->n += from->n;
}

/* The alloc and free calls of a batch. NULL where a batch records nothing
 * (warm-up and probe). */
typedef struct oplog {
  samples_t alloc, free;
} oplog_t;

static void oplog_release(oplog_t *l) {
  free(l->alloc.v);
  free(l->free.v);
  memset(l, 0, sizeof *l);
}

/* Nearest rank: the smallest value with at least p% of the values at or
 * below it. v must be sorted; n > 0. */
static double rank_of(const double *v, size_t n, double p) {
  size_t rank = (size_t)ceil(p / 100.0 * (double)n);
  if (rank < 1) rank = 1;
  return v[rank - 1];
}

typedef struct pct {
  size_t n;
  double p50, p99, max;
} pct_t;

/* Sorts s in place (its order is not needed after the run). */
static pct_t percentiles(samples_t *s) {
  pct_t r = {s->n, 0, 0, 0};
  if (!s->n) return r;
  qsort(s->v, s->n, sizeof *s->v, cmp_double);
  r.p50 = rank_of(s->v, s->n, 50);
  r.p99 = rank_of(s->v, s->n, 99);
  r.max = s->v[s->n - 1];
  return r;
}

/* ---- CPU clocks ------------------------------------------------------------------ */

static uint64_t clock_ns(clockid_t c) {
  struct timespec ts;
  if (clock_gettime(c, &ts) != 0) return 0;
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The CPU clock of the thread with kernel id tid in this process: the
 * clockid pthread_getcpuclockid builds for a pthread_t (Linux's
 * MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)), built from the kernel id
 * instead, since gma does not hand out its worker's pthread_t. */
static clockid_t tid_clock(pid_t tid) {
  return (clockid_t)((~(unsigned)tid << 3) | 6u);
}

/* The kernel ids of this process's threads (at most max). */
static int list_tids(pid_t *out, int max) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && n < max) {
    char *end;
    long v = strtol(e->d_name, &end, 10);
    if (*e->d_name && !*end) out[n++] = (pid_t)v;
  }
  closedir(d);
  return n;
}

/* ---- the allocators ------------------------------------------------------------- */

typedef struct side side_t;
typedef int (*alloc_fn)(side_t *sd, size_t size, cudaStream_t s, void **out);

/* One allocator under test. alloc/free return 0 or the allocator's own error
 * code, which describe() turns into text on the same thread (gma's detail is
 * thread-local). open() makes a fresh allocator before a turn, close() gives
 * every byte back to the device after it. */
struct side {
  const char *id;   /* the JSON key */
  const char *name; /* the table's label */
  char how[320];    /* how it is driven, for the header and the JSON */
  int available;
  char why[ERRLEN]; /* why not, when !available */
  int (*open)(side_t *sd, char *err, size_t errlen);
  void (*close)(side_t *sd);
  alloc_fn alloc;
  int (*free)(side_t *sd, void *p, size_t size, cudaStream_t s);
  /* Frees p, allocated on s and used on `use` after that (work queued there
   * and not yet run), with the allocator's own cross-stream mechanism. */
  int (*free_cross)(side_t *sd, void *p, size_t size, cudaStream_t s, cudaStream_t use);
  alloc_fn alloc_async; /* NULL: not part of the async scenarios */
  void (*describe)(side_t *sd, int code, char *buf, size_t len);
  uint64_t (*peak)(side_t *sd); /* device bytes held at the peak of this turn */
  const char *peak_source;
  const char *cross_how;
  int cross_only; /* runs in the cross-stream and training scenarios only */
  /* state */
  gma_t *g;
  const char *gma_extra; /* config on top of device:cuda (NULL: none) */
  void *cub;
  pid_t tids[MAX_TIDS]; /* gma's threads: those gma_create started */
  int ntids;
};

/* The events of the cross-stream work: ev_order makes the second stream
 * wait for the first, ev_use carries the second stream's use back to the
 * allocator (cross-stream scenarios run on one thread). */
static cudaEvent_t ev_order, ev_use;

static void cuda_describe(side_t *sd, int code, char *buf, size_t len) {
  say(buf, len, "%s (%s)", cudaGetErrorName((cudaError_t)code),
      cudaGetErrorString((cudaError_t)code));
}

/* The event-wait mechanism: s waits for the work queued on `use` so far. */
static int wait_for_use(cudaStream_t s, cudaStream_t use) {
  cudaError_t e = cudaEventRecord(ev_use, use);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(s, ev_use, 0);
  return (int)e;
}

/* direct: the driver's own cuMemAlloc/cuMemFree. */
typedef CUresult (*cu_mem_alloc_fn)(CUdeviceptr *dptr, size_t bytesize);
typedef CUresult (*cu_mem_free_fn)(CUdeviceptr dptr);
typedef CUresult (*cu_error_name_fn)(CUresult error, const char **str);
static cu_mem_alloc_fn cu_mem_alloc;
static cu_mem_free_fn cu_mem_free;
static cu_error_name_fn cu_error_name;
/* Requested bytes live through cuMemAlloc, and their peak in this turn. */
static _Atomic uint64_t direct_live, direct_peak;

static int direct_open(side_t *sd, char *err, size_t errlen) {
  atomic_store(&direct_live, 0);
  atomic_store(&direct_peak, 0);
  return 0;
}
static int direct_alloc(side_t *sd, size_t size, cudaStream_t s, void **out) {
  CUdeviceptr d = 0;
  CUresult r = cu_mem_alloc(&d, size);
  *out = (void *)(uintptr_t)d;
  if (r != CUDA_SUCCESS) return (int)r;
  uint64_t live = atomic_fetch_add(&direct_live, size) + size;
  uint64_t peak = atomic_load(&direct_peak);
  while (live > peak && !atomic_compare_exchange_weak(&direct_peak, &peak, live)) {
  }
  return 0;
}
static int direct_free(side_t *sd, void *p, size_t size, cudaStream_t s) {
  CUresult r = cu_mem_free((CUdeviceptr)(uintptr_t)p);
  if (r == CUDA_SUCCESS) atomic_fetch_sub(&direct_live, size);
  return (int)r;
}
/* cuMemFree must not free memory a stream still uses: the host waits for
 * the other stream's work first, as a correct program without a caching
 * allocator has to. */
static int direct_free_cross(side_t *sd, void *p, size_t size, cudaStream_t s,
                             cudaStream_t use) {
  cudaError_t e = cudaEventRecord(ev_use, use);
  if (e == cudaSuccess) e = cudaEventSynchronize(ev_use);
  if (e != cudaSuccess) return (int)CUDA_ERROR_UNKNOWN; /* reported as a CUresult */
  return direct_free(sd, p, size, s);
}
static void direct_describe(side_t *sd, int code, char *buf, size_t len) {
  const char *name = NULL;
  if (cu_error_name) cu_error_name((CUresult)code, &name);
  say(buf, len, "CUresult %d (%s)", code, name ? name : "?");
}
static uint64_t direct_peak_bytes(side_t *sd) { return atomic_load(&direct_peak); }
static void sync_close(side_t *sd) { cudaDeviceSynchronize(); }

/* cudaMallocAsync on the default pool. */
static cudaMemPool_t default_pool;

/* The pool's high-water mark restarts with each turn (0 is the only value
 * it may be set to). */
static int async_open(side_t *sd, char *err, size_t errlen) {
  cuuint64_t zero = 0;
  cudaError_t e = cudaMemPoolSetAttribute(default_pool, cudaMemPoolAttrReservedMemHigh, &zero);
  if (e != cudaSuccess) cuda_describe(sd, (int)e, err, errlen);
  return e != cudaSuccess;
}
static int async_alloc(side_t *sd, size_t size, cudaStream_t s, void **out) {
  cudaError_t e = cudaMallocAsync(out, size, s);
  if (e != cudaSuccess) cudaGetLastError(); /* not sticky; clear it for the next call */
  return (int)e;
}
static int async_free(side_t *sd, void *p, size_t size, cudaStream_t s) {
  return (int)cudaFreeAsync(p, s);
}
static int async_free_cross(side_t *sd, void *p, size_t size, cudaStream_t s, cudaStream_t use) {
  int e = wait_for_use(s, use);
  return e ? e : async_free(sd, p, size, s);
}
static uint64_t async_peak_bytes(side_t *sd) {
  cuuint64_t v = 0;
  if (cudaMemPoolGetAttribute(default_pool, cudaMemPoolAttrReservedMemHigh, &v) != cudaSuccess)
    return 0;
  return (uint64_t)v;
}
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
static int cub_free(side_t *sd, void *p, size_t size, cudaStream_t s) {
  return gma_bench_cub_free(sd->cub, p);
}
/* DeviceFree records the block's ready event on the stream it was
 * allocated on, so that stream first waits for the other one's use. */
static int cub_free_cross(side_t *sd, void *p, size_t size, cudaStream_t s, cudaStream_t use) {
  int e = wait_for_use(s, use);
  return e ? e : cub_free(sd, p, size, s);
}
static uint64_t cub_peak_bytes(side_t *sd) { return gma_bench_cub_peak(sd->cub); }
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
/* The threads gma_create started (its worker): those in /proc/self/task
 * after it that were not there before. The runtime and the driver are
 * already initialized by then, so no thread of theirs starts in between. */
static void note_new_tids(side_t *sd, const pid_t *before, int nbefore) {
  pid_t after[256];
  int nafter = list_tids(after, 256);
  sd->ntids = 0;
  for (int i = 0; i < nafter && sd->ntids < MAX_TIDS; i++) {
    int old = 0;
    for (int k = 0; k < nbefore && !old; k++) old = before[k] == after[i];
    if (!old) sd->tids[sd->ntids++] = after[i];
  }
}
static int gma_open(side_t *sd, char *err, size_t errlen) {
  pid_t before[256];
  int nbefore = list_tids(before, 256);
  gma_status_t st = gma_make(sd, &sd->g);
  if (st != GMA_OK) {
    gma_describe(sd, st, err, errlen);
    return 1;
  }
  note_new_tids(sd, before, nbefore);
  return 0;
}
static void gma_close(side_t *sd) {
  cudaDeviceSynchronize();
  gma_status_t st = gma_destroy(sd->g);
  if (st != GMA_OK)
    fprintf(stderr, "gma-bench-gpu: %s: gma_destroy: %s (%s)\n", sd->name, gma_status_name(st),
            gma_last_error());
  sd->g = NULL;
  sd->ntids = 0;
}
static int gma_alloc_side(side_t *sd, size_t size, cudaStream_t s, void **out) {
  return (int)gma_alloc(sd->g, size, (gma_stream_t)(void *)s, out);
}
static int gma_free_side(side_t *sd, void *p, size_t size, cudaStream_t s) {
  return (int)gma_free(sd->g, p);
}
/* gma_record_stream: the block waits for `use`'s work before any stream
 * gets it again, and s is never made to wait. */
static int gma_free_cross(side_t *sd, void *p, size_t size, cudaStream_t s, cudaStream_t use) {
  gma_status_t st = gma_record_stream(sd->g, p, (gma_stream_t)(void *)use);
  return st != GMA_OK ? (int)st : (int)gma_free(sd->g, p);
}
/* The peers' mechanism: s waits for `use`, then an ordinary free on s. */
static int gma_free_waited(side_t *sd, void *p, size_t size, cudaStream_t s, cudaStream_t use) {
  int e = wait_for_use(s, use);
  return e ? (int)GMA_ERR_DEVICE : (int)gma_free(sd->g, p);
}
/* The whole life of a future: submit, collect, give back. */
static int gma_alloc_async_side(side_t *sd, size_t size, cudaStream_t s, void **out) {
  gma_future_t *f;
  gma_status_t st = gma_alloc_async(sd->g, size, (gma_stream_t)(void *)s, NULL, &f);
  if (st != GMA_OK) return (int)st;
  st = gma_future_wait(f, UINT64_MAX, out);
  gma_future_release(f);
  return (int)st;
}
static uint64_t gma_peak_bytes(side_t *sd) {
  gma_stats_t s = GMA_STATS_INIT;
  return gma_stats(sd->g, &s) == GMA_OK ? s.reserved.peak : 0;
}
/* CPU time of gma's own threads so far (0 when none was found). */
static uint64_t gma_threads_cpu_ns(const side_t *sd) {
  uint64_t sum = 0;
  for (int i = 0; i < sd->ntids; i++) sum += clock_ns(tid_clock(sd->tids[i]));
  return sum;
}

enum { S_DIRECT, S_ASYNC, S_CUB, S_GMA, S_GMAX, S_GMAW, NSIDES };

static const char *const event_wait_how =
    "event recorded on the using stream, waited on by the allocating stream, then the "
    "allocator's free on the allocating stream";

static side_t sides[NSIDES] = {
    [S_DIRECT] = {.id = "direct", .name = "direct (cuMemAlloc/cuMemFree)", .open = direct_open,
                  .close = sync_close, .alloc = direct_alloc, .free = direct_free,
                  .free_cross = direct_free_cross, .describe = direct_describe,
                  .peak = direct_peak_bytes,
                  .peak_source = "requested bytes live at once (the driver's rounding excluded)",
                  .cross_how = "cudaEventSynchronize on an event recorded on the using stream, "
                               "then cuMemFree"},
    [S_ASYNC] = {.id = "cudaMallocAsync", .name = "cudaMallocAsync (default pool)",
                 .open = async_open, .close = async_close, .alloc = async_alloc,
                 .free = async_free, .free_cross = async_free_cross, .alloc_async = async_alloc,
                 .describe = cuda_describe, .peak = async_peak_bytes,
                 .peak_source = "cudaMemPoolAttrReservedMemHigh (reset at the turn's start)"},
#ifndef GMA_BENCH_CUB_OFF
    [S_CUB] = {.id = "cub", .name = "CUB CachingDeviceAllocator", .open = cub_open,
               .close = cub_close, .alloc = cub_alloc, .free = cub_free,
               .free_cross = cub_free_cross, .describe = cuda_describe,
               .peak = cub_peak_bytes,
               .peak_source = "CUB's cached_bytes (free + live) after each allocation"},
#else
    [S_CUB] = {.id = "cub", .name = "CUB CachingDeviceAllocator"},
#endif
    [S_GMA] = {.id = "gma", .name = "gma", .open = gma_open, .close = gma_close,
               .alloc = gma_alloc_side, .free = gma_free_side, .free_cross = gma_free_cross,
               .alloc_async = gma_alloc_async_side, .describe = gma_describe,
               .peak = gma_peak_bytes, .peak_source = "gma_stats reserved.peak",
               .cross_how = "gma_record_stream(using stream), then gma_free"},
    [S_GMAX] = {.id = "gma_expandable", .name = "gma expandable_segments", .open = gma_open,
                .close = gma_close, .alloc = gma_alloc_side, .free = gma_free_side,
                .free_cross = gma_free_cross, .alloc_async = gma_alloc_async_side,
                .describe = gma_describe, .gma_extra = "expandable_segments:true",
                .peak = gma_peak_bytes, .peak_source = "gma_stats reserved.peak",
                .cross_how = "gma_record_stream(using stream), then gma_free"},
    [S_GMAW] = {.id = "gma_wait", .name = "gma, peers' cross-stream wait", .open = gma_open,
                .close = gma_close, .alloc = gma_alloc_side, .free = gma_free_side,
                .free_cross = gma_free_waited, .describe = gma_describe,
                .peak = gma_peak_bytes, .peak_source = "gma_stats reserved.peak",
                .cross_only = 1},
};

/* ---- scenarios ------------------------------------------------------------------ */

typedef enum kind { K_PAIRS, K_CROSS, K_ASYNC, K_THREADS, K_TRAINING, K_PRESSURE } kind_t;

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
    {"cross_stream", "cross-stream 64 KiB - 4 MiB", K_CROSS, 0, 16, 22},
    {"training_loop", "training loop (6 layers)", K_TRAINING, 0, 0, 0},
    {"streams_4x4", "4 threads x own stream, 64 KiB", K_THREADS, 64 * KiB, 0, 0},
    {"async_4KiB", "async 4 KiB (bin hit)", K_ASYNC, 4 * KiB, 0, 0},
    {"async_8MiB", "async 8 MiB (worker-served)", K_ASYNC, 8 * MiB, 0, 0},
    {"memory_pressure", "memory pressure", K_PRESSURE, 0, 0, 0},
};
enum { NSC = sizeof scenarios / sizeof scenarios[0] };

/* CPU time over an allocator's timed batches (ns). worker is gma's threads
 * alone, -1 for the others. */
typedef struct cpu {
  uint64_t wall, process, callers;
  int64_t worker;
} cpu_t;

/* One allocator's measurements in one scenario. */
typedef struct result {
  int ran;               /* measured (else skip says why) */
  char skip[ERRLEN];
  char error[ERRLEN];    /* the first failure, if any */
  int units;             /* pairs (threads: per thread), iterations or rounds per batch */
  int nbatches;
  double *ns;            /* per batch: ns per pair (pressure: per success) */
  double median;
  oplog_t log;           /* every timed call of the timed batches */
  pct_t alloc, free;
  uint64_t successes;    /* memory pressure: allocations that succeeded */
  uint64_t failures;     /* memory pressure: allocations that failed */
  double failed_ms;      /* memory pressure: time spent in the failed calls */
  double total_ms;       /* memory pressure: all rounds */
  cpu_t cpu;
  int gma_threads;       /* gma: its threads found at gma_create; -1 for the others */
  uint64_t peak;         /* device bytes held at the turn's peak */
  int has_gma;           /* gma: the statistics below were read */
  gma_stats_t g0, g1;    /* gma: statistics before and after the timed batches */
  double ratio_direct, ratio_gma; /* direct/this and this/gma of the medians; 0: n/a */
} result_t;

typedef struct scenario_run {
  const scenario_t *sc;
  int ran;
  char note[ERRLEN];
  result_t r[NSIDES];
} scenario_run_t;

static int dev;
static uint64_t spin_ns;
static cudaStream_t stream, side_stream, tstreams[NTHREADS];
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

/* The layer gradients are what a data-parallel step all-reduces on a
 * communication stream while the backward pass goes on. */
static int tl_cross(int slot) { return slot == T_G0 || slot == T_G1; }

/* ---- timed calls and GPU work ------------------------------------------------------ */

/* One batch: what it runs, and what it measured. */
typedef struct batch {
  const scenario_t *sc;
  side_t *sd;
  int n;                 /* units */
  oplog_t *log;          /* NULL: warm-up or probe, nothing recorded */
  uint64_t ns;           /* wall time */
  uint64_t thread_cpu;   /* CPU time of threads the batch started (threads scenario) */
  uint64_t successes, failures;
  uint64_t failed_ns;    /* memory pressure: time in failed calls */
  char err[ERRLEN];
} batch_t;

static int t_alloc(side_t *sd, alloc_fn fa, oplog_t *log, size_t size, cudaStream_t s,
                   void **p) {
  uint64_t t0 = now_ns();
  int st = fa(sd, size, s, p);
  uint64_t t = now_ns() - t0;
  if (!st && log) samples_push(&log->alloc, (double)t);
  return st;
}

static int t_free(side_t *sd, oplog_t *log, void *p, size_t size, cudaStream_t s) {
  uint64_t t0 = now_ns();
  int st = sd->free(sd, p, size, s);
  uint64_t t = now_ns() - t0;
  if (!st && log) samples_push(&log->free, (double)t);
  return st;
}

static int t_free_cross(side_t *sd, oplog_t *log, void *p, size_t size, cudaStream_t s,
                        cudaStream_t use) {
  uint64_t t0 = now_ns();
  int st = sd->free_cross(sd, p, size, s, use);
  uint64_t t = now_ns() - t0;
  if (!st && log) samples_push(&log->free, (double)t);
  return st;
}

static int side_fail(batch_t *b, int st) {
  b->sd->describe(b->sd, st, b->err, sizeof b->err);
  return -1;
}

static int cuda_fail(char *err, size_t len, const char *what, int e) {
  say(err, len, "%s: %s (%s)", what, cudaGetErrorName((cudaError_t)e),
      cudaGetErrorString((cudaError_t)e));
  return -1;
}

static int sync_streams(batch_t *b, cudaStream_t s1, cudaStream_t s2) {
  cudaError_t e = cudaStreamSynchronize(s1);
  if (e == cudaSuccess && s2) e = cudaStreamSynchronize(s2);
  return e == cudaSuccess ? 0 : cuda_fail(b->err, sizeof b->err, "stream synchronize", (int)e);
}

/* The use of p on `use` after its producer on s: `use` waits for s, is held
 * by a spin of --spin-us, then touches p. */
static int use_on(void *p, size_t size, cudaStream_t s, cudaStream_t use, char *err,
                  size_t len) {
  int e = (int)cudaEventRecord(ev_order, s);
  if (!e) e = (int)cudaStreamWaitEvent(use, ev_order, 0);
  if (!e) e = gma_bench_spin(spin_ns, use);
  if (!e) e = gma_bench_touch(p, size, use);
  return e ? cuda_fail(err, len, "second-stream work", e) : 0;
}

/* ---- batches: each returns 0, or -1 with the failure in b->err ---------------------- */

/* alloc, touch, free on one stream; K_ASYNC allocates through the future. */
static int batch_pairs(batch_t *b) {
  side_t *sd = b->sd;
  alloc_fn fa = b->sc->kind == K_ASYNC ? sd->alloc_async : sd->alloc;
  uint64_t t0 = now_ns();
  for (int i = 0; i < b->n; i++) {
    void *p;
    int st = t_alloc(sd, fa, b->log, sizes[i], stream, &p);
    if (st) return side_fail(b, st);
    int e = gma_bench_touch(p, sizes[i], stream);
    st = t_free(sd, b->log, p, sizes[i], stream);
    if (e) return cuda_fail(b->err, sizeof b->err, "touch kernel", e);
    if (st) return side_fail(b, st);
  }
  int rc = sync_streams(b, stream, NULL);
  b->ns = now_ns() - t0;
  return rc;
}

/* alloc and touch on stream, use on side_stream, free cross-stream while
 * side_stream's spin still holds the buffer. */
static int batch_cross(batch_t *b) {
  side_t *sd = b->sd;
  uint64_t t0 = now_ns();
  for (int i = 0; i < b->n; i++) {
    void *p;
    int st = t_alloc(sd, sd->alloc, b->log, sizes[i], stream, &p);
    if (st) return side_fail(b, st);
    int e = gma_bench_touch(p, sizes[i], stream);
    int rc = e ? cuda_fail(b->err, sizeof b->err, "touch kernel", e)
               : use_on(p, sizes[i], stream, side_stream, b->err, sizeof b->err);
    st = t_free_cross(sd, b->log, p, sizes[i], stream, side_stream);
    if (rc) return rc;
    if (st) return side_fail(b, st);
  }
  int rc = sync_streams(b, stream, side_stream);
  b->ns = now_ns() - t0;
  return rc;
}

/* One allocation of the training plan: touched on stream, and a gradient
 * also used on side_stream. */
static int tl_alloc(batch_t *b, const tl_op_t *op, void **slot, size_t *slot_size) {
  int st = t_alloc(b->sd, b->sd->alloc, b->log, op->size, stream, &slot[op->slot]);
  if (st) {
    slot[op->slot] = NULL;
    return side_fail(b, st);
  }
  slot_size[op->slot] = op->size;
  int e = gma_bench_touch(slot[op->slot], op->size, stream);
  if (e) return cuda_fail(b->err, sizeof b->err, "touch kernel", e);
  if (!tl_cross(op->slot)) return 0;
  return use_on(slot[op->slot], op->size, stream, side_stream, b->err, sizeof b->err);
}

static int tl_free(batch_t *b, int k, void **slot, const size_t *slot_size) {
  int st = tl_cross(k) ? t_free_cross(b->sd, b->log, slot[k], slot_size[k], stream, side_stream)
                       : t_free(b->sd, b->log, slot[k], slot_size[k], stream);
  slot[k] = NULL;
  return st ? side_fail(b, st) : 0;
}

static int batch_training(batch_t *b) {
  void *slot[TL_SLOTS] = {NULL};
  size_t slot_size[TL_SLOTS] = {0};
  int rc = 0;
  uint64_t t0 = now_ns();
  for (int it = 0; it < b->n && rc == 0; it++) {
    for (int k = 0; k < tl_nops && rc == 0; k++) {
      const tl_op_t *op = &tl_ops[k];
      rc = op->size ? tl_alloc(b, op, slot, slot_size) : tl_free(b, op->slot, slot, slot_size);
    }
  }
  for (int k = 0; k < TL_SLOTS; k++) /* after a failure: give back what is held */
    if (slot[k]) tl_free(b, k, slot, slot_size);
  if (rc == 0) rc = sync_streams(b, stream, side_stream);
  b->ns = now_ns() - t0;
  return rc;
}

typedef struct thr {
  side_t *sd;
  cudaStream_t s;
  int n;
  size_t size;
  pthread_barrier_t *bar;
  oplog_t log; /* this thread's calls, merged into the batch's after the join */
  int record;
  uint64_t t0, t1, cpu;
  int rc;
  char err[ERRLEN];
} thr_t;

static int thr_pairs(thr_t *t) {
  for (int i = 0; i < t->n; i++) {
    void *p;
    oplog_t *log = t->record ? &t->log : NULL;
    int st = t_alloc(t->sd, t->sd->alloc, log, t->size, t->s, &p);
    if (st) {
      t->sd->describe(t->sd, st, t->err, sizeof t->err);
      return -1;
    }
    int e = gma_bench_touch(p, t->size, t->s);
    st = t_free(t->sd, log, p, t->size, t->s);
    if (e) return cuda_fail(t->err, sizeof t->err, "touch kernel", e);
    if (st) {
      t->sd->describe(t->sd, st, t->err, sizeof t->err);
      return -1;
    }
  }
  cudaError_t e = cudaStreamSynchronize(t->s);
  return e == cudaSuccess ? 0 : cuda_fail(t->err, sizeof t->err, "stream synchronize", (int)e);
}

static void *thr_main(void *arg) {
  thr_t *t = arg;
  cudaSetDevice(dev); /* makes the primary context current here too (cuMemAlloc needs it) */
  uint64_t c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
  pthread_barrier_wait(t->bar);
  t->t0 = now_ns();
  t->rc = thr_pairs(t);
  t->t1 = now_ns();
  t->cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
  return NULL;
}

/* NTHREADS threads, each on its own stream, n pairs each; the batch lasts
 * from the first thread's start to the last one's end. */
static int batch_threads(batch_t *b) {
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, NTHREADS);
  thr_t t[NTHREADS];
  pthread_t tid[NTHREADS];
  for (int i = 0; i < NTHREADS; i++) {
    t[i] = (thr_t){.sd = b->sd, .s = tstreams[i], .n = b->n, .size = b->sc->size,
                   .bar = &bar, .record = b->log != NULL};
    if (t[i].record) { /* no reallocation inside the timed loop */
      samples_reserve(&t[i].log.alloc, (size_t)b->n);
      samples_reserve(&t[i].log.free, (size_t)b->n);
    }
    if (pthread_create(&tid[i], NULL, thr_main, &t[i]) != 0) {
      fprintf(stderr, "gma-bench-gpu: pthread_create failed\n"); /* the others wait forever */
      exit(1);
    }
  }
  uint64_t first = UINT64_MAX, last = 0;
  int rc = 0;
  for (int i = 0; i < NTHREADS; i++) {
    pthread_join(tid[i], NULL);
    if (t[i].t0 < first) first = t[i].t0;
    if (t[i].t1 > last) last = t[i].t1;
    b->thread_cpu += t[i].cpu;
    if (b->log) {
      samples_append(&b->log->alloc, &t[i].log.alloc);
      samples_append(&b->log->free, &t[i].log.free);
    }
    oplog_release(&t[i].log);
    if (t[i].rc && !rc) {
      rc = -1;
      say(b->err, sizeof b->err, "%s", t[i].err);
    }
  }
  pthread_barrier_destroy(&bar);
  b->ns = last - first;
  return rc;
}

/* Memory pressure: a round allocates blocks of one size until the working
 * set is reached, touches each, frees them all, and does the same with a
 * larger and then a smaller size: a cache full of the previous size must
 * give memory back (or coalesce it) for the next. A failed allocation is
 * counted and the round goes on. */
enum { PRESS_PHASES = 3, PRESS_MAX_BLOCKS = 96 };
static const int press_blocks[PRESS_PHASES] = {64, 40, 96};
static size_t press_size[PRESS_PHASES];

static void press_alloc(batch_t *b, size_t size, void **p) {
  uint64_t t0 = now_ns();
  int st = b->sd->alloc(b->sd, size, stream, p);
  uint64_t t = now_ns() - t0;
  if (!st) {
    b->successes++;
    if (b->log) samples_push(&b->log->alloc, (double)t);
    int e = gma_bench_touch(*p, size, stream);
    if (e && !b->err[0]) cuda_fail(b->err, sizeof b->err, "touch kernel", e);
    return;
  }
  *p = NULL;
  b->failures++;
  b->failed_ns += t;
  if (!b->err[0]) side_fail(b, st);
}

static int batch_pressure(batch_t *b) {
  uint64_t t0 = now_ns();
  for (int ph = 0; ph < PRESS_PHASES; ph++) {
    void *held[PRESS_MAX_BLOCKS] = {NULL};
    for (int k = 0; k < press_blocks[ph]; k++) press_alloc(b, press_size[ph], &held[k]);
    for (int k = 0; k < press_blocks[ph]; k++) {
      if (!held[k]) continue;
      int st = t_free(b->sd, b->log, held[k], press_size[ph], stream);
      if (st && !b->err[0]) side_fail(b, st);
    }
    if (sync_streams(b, stream, NULL)) return -1;
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

/* ---- one allocator's turn ------------------------------------------------------------ */

static int side_in(const scenario_t *sc, const side_t *sd) {
  if (sd->cross_only) return sc->kind == K_CROSS || sc->kind == K_TRAINING;
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

/* Pairs (allocations) in one unit of a batch. */
static double pairs_per_unit(const scenario_t *sc) {
  return sc->kind == K_TRAINING ? (double)tl_nallocs : 1.0;
}

/* A warm-up batch (caches fill, the device maps pages), then a probe sizes
 * the batches to about --batch-ms. Memory pressure runs whole rounds and
 * needs neither. Returns units per batch, or 0 with the failure in r. */
static int size_batches(const scenario_t *sc, side_t *sd, result_t *r) {
  if (sc->kind == K_PRESSURE) return 1;
  int maxu = sc->kind == K_TRAINING ? opt.iterations : opt.pairs;
  int probe = sc->kind == K_TRAINING ? 1 : (maxu < 32 ? maxu : 32);
  int minu = sc->kind == K_TRAINING ? 1 : (maxu < 16 ? maxu : 16);
  batch_t b = {.sc = sc, .sd = sd, .n = probe};
  int rc = run_batch(&b); /* the warm-up */
  if (rc == 0) {
    b = (batch_t){.sc = sc, .sd = sd, .n = probe};
    rc = run_batch(&b); /* the probe */
  }
  if (rc) {
    say(r->error, sizeof r->error, "%s", b.err);
    return 0;
  }
  double per = (double)b.ns / probe;
  double fit = (double)opt.batch_ms * 1e6 / (per > 1 ? per : 1);
  return fit >= maxu ? maxu : fit < minu ? minu : (int)fit;
}

/* Allocations in one unit of a batch, over all its threads. */
static size_t calls_per_unit(const scenario_t *sc) {
  switch (sc->kind) {
    case K_TRAINING: return (size_t)tl_nallocs;
    case K_THREADS: return NTHREADS;
    case K_PRESSURE: return (size_t)press_blocks[0] + press_blocks[1] + press_blocks[2];
    default: return 1;
  }
}

/* Divides a batch's wall time: per pair, or under memory pressure per
 * successful allocation (0 when none succeeded: nothing to divide). */
static double batch_divisor(const scenario_t *sc, const batch_t *b, int units) {
  if (sc->kind == K_PRESSURE) return (double)b->successes;
  return (double)units * pairs_per_unit(sc);
}

/* The timed batches, with the CPU clocks read around them. */
static void timed_batches(const scenario_t *sc, side_t *sd, result_t *r) {
  int nb = sc->kind == K_PRESSURE ? opt.pressure_rounds : opt.reps;
  size_t calls = (size_t)nb * (size_t)r->units * calls_per_unit(sc);
  samples_reserve(&r->log.alloc, calls);
  samples_reserve(&r->log.free, calls);
  r->ns = calloc((size_t)nb, sizeof *r->ns);
  if (!r->ns) abort();
  uint64_t w0 = now_ns(), p0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
  uint64_t c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID), g0 = gma_threads_cpu_ns(sd);
  r->g0 = (gma_stats_t)GMA_STATS_INIT;
  r->g1 = (gma_stats_t)GMA_STATS_INIT;
  r->has_gma = sd->g && gma_stats(sd->g, &r->g0) == GMA_OK;
  uint64_t threads_cpu = 0, failed_ns = 0;
  for (int rep = 0; rep < nb; rep++) {
    batch_t b = {.sc = sc, .sd = sd, .n = r->units, .log = &r->log};
    int rc = run_batch(&b);
    threads_cpu += b.thread_cpu;
    r->successes += b.successes;
    r->failures += b.failures;
    failed_ns += b.failed_ns;
    if (b.err[0] && !r->error[0]) say(r->error, sizeof r->error, "%s", b.err);
    if (rc) break; /* keep what it measured; the error is reported */
    double per = batch_divisor(sc, &b, r->units);
    if (per > 0) r->ns[r->nbatches++] = (double)b.ns / per;
  }
  r->cpu.wall = now_ns() - w0;
  if (r->has_gma) r->has_gma = gma_stats(sd->g, &r->g1) == GMA_OK;
  r->cpu.callers = clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0 + threads_cpu;
  r->cpu.process = clock_ns(CLOCK_PROCESS_CPUTIME_ID) - p0;
  r->cpu.worker = sd->ntids ? (int64_t)(gma_threads_cpu_ns(sd) - g0) : -1;
  r->gma_threads = sd->open == gma_open ? sd->ntids : -1;
  r->failed_ms = (double)failed_ns / 1e6;
  if (sc->kind == K_PRESSURE) r->total_ms = (double)r->cpu.wall / 1e6;
}

static void summarize(result_t *r) {
  if (r->nbatches > 0) {
    double *v = malloc((size_t)r->nbatches * sizeof *v);
    if (!v) abort();
    memcpy(v, r->ns, (size_t)r->nbatches * sizeof *v);
    qsort(v, (size_t)r->nbatches, sizeof *v, cmp_double);
    int n = r->nbatches;
    r->median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    free(v);
  }
  r->alloc = percentiles(&r->log.alloc);
  r->free = percentiles(&r->log.free);
  oplog_release(&r->log);
}

/* One allocator alone: open, warm up, time, read its peak, give back. */
static void run_turn(const scenario_t *sc, side_t *sd, result_t *r) {
  if (!sd->available) {
    say(r->skip, sizeof r->skip, "%s", sd->why);
    return;
  }
  if (!side_in(sc, sd)) {
    say(r->skip, sizeof r->skip, "no async allocation call");
    return;
  }
  cudaDeviceSynchronize(); /* nothing of the previous turn runs during this one */
  if (sd->open(sd, r->error, sizeof r->error)) return;
  r->units = size_batches(sc, sd, r);
  if (r->units > 0) {
    r->ran = 1;
    timed_batches(sc, sd, r);
    r->peak = sd->peak(sd);
    summarize(r);
  }
  sd->close(sd);
}

/* The three block sizes of the pressure rounds, from the free memory now. */
static int pressure_sizes(scenario_run_t *run) {
  size_t free_b = 0, total_b = 0;
  cudaDeviceSynchronize();
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    say(run->note, sizeof run->note, "cudaMemGetInfo failed");
    return -1;
  }
  double ws = (double)free_b * opt.pressure_fraction;
  for (int p = 0; p < PRESS_PHASES; p++) {
    press_size[p] = (size_t)(ws / press_blocks[p]) / (2 * MiB) * (2 * MiB);
    if (press_size[p] < 2 * MiB) press_size[p] = 2 * MiB;
  }
  say(run->note, sizeof run->note,
      "working set %.1f GiB = %.0f%% of %.1f GiB free; per round %d x %zu MiB, %d x %zu MiB, "
      "%d x %zu MiB",
      ws / (double)(1 << 30), opt.pressure_fraction * 100, (double)free_b / (1 << 30),
      press_blocks[0], press_size[0] / MiB, press_blocks[1], press_size[1] / MiB,
      press_blocks[2], press_size[2] / MiB);
  return 0;
}

static void run_scenario(scenario_run_t *run) {
  const scenario_t *sc = run->sc;
  if (sc->kind == K_PAIRS || sc->kind == K_ASYNC || sc->kind == K_CROSS) fill_sizes(sc);
  if (sc->kind == K_PRESSURE && pressure_sizes(run)) return;
  for (int i = 0; i < NSIDES; i++) run_turn(sc, &sides[i], &run->r[i]);
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

static const char *const cpu_method =
    "over the timed batches: callers = CLOCK_THREAD_CPUTIME_ID of the calling threads; "
    "others = CLOCK_PROCESS_CPUTIME_ID minus callers (gma's worker, the CUDA runtime's "
    "threads); gma_worker = the per-thread CPU clocks of the threads that appeared in "
    "/proc/self/task during gma_create";

static void write_config(FILE *f, const gpu_info_t *gi) {
  fprintf(f, "  \"config\": {");
  json_config_common(f);
  fprintf(f, ", \"device\": \"cuda\", \"gpu\": ");
  json_str(f, gi->name);
  fprintf(f,
          ", \"device_ordinal\": %d, \"total_memory\": %zu, \"driver_version\": %d, "
          "\"runtime_version\": %d, \"cuda_device_count\": %d, \"gma_device_count\": %d, "
          "\"reps\": %d, \"max_pairs_per_batch\": %d, \"max_iterations_per_batch\": %d, "
          "\"batch_ms\": %d, \"spin_us\": %d, \"touch_stride\": %d, \"kernels\": ",
          opt.device, gi->total, gi->driver, gi->runtime, gi->cuda_devices, gi->gma_devices,
          opt.reps, opt.pairs, opt.iterations, opt.batch_ms, opt.spin_us,
          GMA_BENCH_TOUCH_STRIDE);
  json_str(f, gma_bench_work_archs());
  fprintf(f, ", \"seed\": %" PRIu64 ", \"pressure_fraction\": %.2f, \"pressure_rounds\": %d, "
             "\"gma_conf\": ",
          opt.seed, opt.pressure_fraction, opt.pressure_rounds);
  json_str(f, opt.gma_conf ? opt.gma_conf : "");
  fprintf(f, ", \"order\": \"one allocator at a time, each in a turn of its own per scenario\", "
             "\"unit\": \"ns per alloc+free pair (batch wall time, kernels and synchronization "
             "included)\", \"median\": \"across batches\", \"percentiles\": \"nearest rank "
             "over individual alloc and free calls\", \"cpu\": ");
  json_str(f, cpu_method);
  fprintf(f, ", \"reference\": \"gma\", \"baseline\": \"direct\"},\n");
}

static void write_allocators(FILE *f) {
  fprintf(f, "  \"allocators\": {\n");
  for (int i = 0; i < NSIDES; i++) {
    const side_t *sd = &sides[i];
    fprintf(f, "    \"%s\": {\"name\": ", sd->id);
    json_str(f, sd->name);
    fprintf(f, ", \"how\": ");
    json_str(f, sd->how);
    fprintf(f, ", \"cross_stream_free\": ");
    json_str(f, sd->cross_how ? sd->cross_how : event_wait_how);
    fprintf(f, ", \"peak_source\": ");
    if (sd->peak_source)
      json_str(f, sd->peak_source);
    else
      fputs("null", f);
    fprintf(f, ", \"available\": %s, \"reason\": ", sd->available ? "true" : "false");
    if (sd->available)
      fputs("null", f);
    else
      json_str(f, sd->why);
    fprintf(f, "}%s\n", i + 1 < NSIDES ? "," : "");
  }
  fprintf(f, "  },\n");
}

static void json_pct(FILE *f, const char *key, const pct_t *p) {
  fprintf(f, ", \"%s\": {\"calls\": %zu, \"p50\": ", key, p->n);
  json_num(f, p->p50);
  fprintf(f, ", \"p99\": ");
  json_num(f, p->p99);
  fprintf(f, ", \"max\": ");
  json_num(f, p->max);
  fputc('}', f);
}

static void json_cpu(FILE *f, const cpu_t *c, int gma_threads) {
  fprintf(f, ", \"cpu_ms\": {\"wall\": %.2f, \"callers\": %.2f, \"others\": %.2f, "
             "\"gma_worker\": ",
          (double)c->wall / 1e6, (double)c->callers / 1e6,
          c->process > c->callers ? (double)(c->process - c->callers) / 1e6 : 0.0);
  if (c->worker >= 0)
    fprintf(f, "%.2f", (double)c->worker / 1e6);
  else
    fputs("null", f);
  fputc('}', f);
  if (gma_threads >= 0) fprintf(f, ", \"gma_threads\": %d", gma_threads);
}

static void write_result(FILE *f, const scenario_t *sc, const result_t *r) {
  if (!r->ran) {
    fprintf(f, "\"skipped\": ");
    json_str(f, r->skip[0] ? r->skip : r->error);
    return;
  }
  fprintf(f, "\"median_ns\": ");
  json_num(f, r->nbatches ? r->median : 0);
  fprintf(f, ", \"units_per_batch\": %d, \"batches\": %d", r->units, r->nbatches);
  json_pct(f, "alloc_ns", &r->alloc);
  json_pct(f, "free_ns", &r->free);
  fprintf(f, ", \"peak_bytes\": %" PRIu64, r->peak);
  json_cpu(f, &r->cpu, r->gma_threads);
  fprintf(f, ", \"failures\": %" PRIu64, r->failures);
  if (r->has_gma) {
    const gma_stats_t *a = &r->g0, *b = &r->g1;
    fprintf(f, ", \"gma_deltas\": {\"allocs\": %" PRIu64 ", \"device_allocs\": %" PRIu64
               ", \"device_frees\": %" PRIu64 ", \"epoch_events\": %" PRIu64
               ", \"cross_stream_waits\": %" PRIu64 ", \"oom_retries\": %" PRIu64
               ", \"oom_waits\": %" PRIu64 ", \"hits_bin\": %" PRIu64 ", \"hits_stream\": %" PRIu64
               ", \"hits_pool\": %" PRIu64 ", \"hits_device\": %" PRIu64
               ", \"bytes_trimmed\": %" PRIu64 "}",
            b->num_allocs - a->num_allocs, b->num_device_allocs - a->num_device_allocs,
            b->num_device_frees - a->num_device_frees, b->num_epoch_events - a->num_epoch_events,
            b->num_cross_stream_waits - a->num_cross_stream_waits,
            b->num_oom_retries - a->num_oom_retries, b->num_oom_waits - a->num_oom_waits,
            b->hits_bin - a->hits_bin, b->hits_stream - a->hits_stream, b->hits_pool - a->hits_pool,
            b->hits_device - a->hits_device, b->bytes_trimmed - a->bytes_trimmed);
  }
  if (sc->kind == K_PRESSURE)
    fprintf(f, ", \"successes\": %" PRIu64 ", \"failed_calls_ms\": %.2f, \"total_ms\": %.1f",
            r->successes, r->failed_ms, r->total_ms);
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

static const char *scenario_unit(kind_t k) {
  switch (k) {
    case K_TRAINING: return "ns per alloc+free pair (iteration wall time / allocations)";
    case K_PRESSURE: return "ns per successful allocation (round wall time / successes)";
    case K_THREADS: return "ns per alloc+free pair per thread (batch wall time)";
    default: return "ns per alloc+free pair (batch wall time)";
  }
}

static void write_scenario(FILE *f, const scenario_run_t *run) {
  fprintf(f, "    {\"id\": \"%s\", \"name\": ", run->sc->id);
  json_str(f, run->sc->name);
  fprintf(f, ", \"unit\": \"%s\"", scenario_unit(run->sc->kind));
  if (run->sc->kind == K_TRAINING)
    fprintf(f, ", \"allocations_per_iteration\": %d, \"layers\": %d", tl_nallocs, TL_LAYERS);
  if (run->sc->kind == K_THREADS) fprintf(f, ", \"threads\": %d", NTHREADS);
  if (run->note[0]) {
    fprintf(f, ", \"note\": ");
    json_str(f, run->note);
  }
  fprintf(f, ", \"results\": {\n");
  for (int i = 0; i < NSIDES; i++) {
    fprintf(f, "      \"%s\": {", sides[i].id);
    write_result(f, run->sc, &run->r[i]);
    fprintf(f, "}%s\n", i + 1 < NSIDES ? "," : "");
  }
  fprintf(f, "    }}");
}

static void write_json(const gpu_info_t *gi, const scenario_run_t *runs, int n) {
  FILE *f = fopen(opt.json_path, "w");
  if (!f) {
    perror(opt.json_path);
    exit(1);
  }
  fprintf(f, "{\n  \"benchmark\": \"gma-bench-gpu\",\n");
  write_config(f, gi);
  write_allocators(f);
  fprintf(f, "  \"scenarios\": [\n");
  for (int s = 0; s < n; s++) {
    write_scenario(f, &runs[s]);
    fprintf(f, "%s\n", s + 1 < n ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  fclose(f);
}

static void print_row(const scenario_t *sc, const side_t *sd, const result_t *r) {
  if (!r->ran) {
    printf("  %-30s %.70s\n", sd->name,
           r->skip[0] ? r->skip : r->error[0] ? "failed to start (see below)" : "-");
    return;
  }
  char rg[16] = "-", wk[16] = "-", fl[32] = "-";
  if (r->ratio_gma > 0) say(rg, sizeof rg, "%.2fx", r->ratio_gma);
  if (r->cpu.worker >= 0) say(wk, sizeof wk, "%.1f", (double)r->cpu.worker / 1e6);
  if (sc->kind == K_PRESSURE)
    say(fl, sizeof fl, "%" PRIu64 "/%" PRIu64, r->successes, r->failures);
  double others = r->cpu.process > r->cpu.callers
                      ? (double)(r->cpu.process - r->cpu.callers) / 1e6 : 0.0;
  printf("  %-30s %10.0f %9.0f %9.0f %9.0f %9.0f %9.1f %8.1f %8.1f %7s %7s %s\n", sd->name,
         r->nbatches ? r->median : 0.0, r->alloc.p50, r->alloc.p99, r->free.p50, r->free.p99,
         (double)r->peak / (double)MiB, (double)r->cpu.callers / 1e6, others, wk, rg, fl);
}

static void print_table(const scenario_run_t *runs, int n) {
  printf("\n%-32s %10s %9s %9s %9s %9s %9s %8s %8s %7s %7s %s\n", "scenario / allocator",
         "pair ns", "alloc p50", "alloc p99", "free p50", "free p99", "peak MiB", "cpu call",
         "cpu othr", "worker", "x/gma", "ok/failed");
  for (int s = 0; s < n; s++) {
    const scenario_run_t *run = &runs[s];
    printf("%s\n", run->sc->name);
    for (int i = 0; i < NSIDES; i++) print_row(run->sc, &sides[i], &run->r[i]);
    if (run->note[0]) printf("  (%s)\n", run->note);
  }
  printf("(pair ns: median across batches of batch wall time per alloc+free pair, kernels and\n"
         " synchronization included; training loop: per allocation (%d per iteration); memory\n"
         " pressure: per successful allocation, ok/failed counts the allocations. alloc/free\n"
         " p50/p99: nearest rank over every timed call. peak MiB: the allocator's held device\n"
         " memory at its peak (sources in the JSON). cpu call/othr/worker: CPU ms over the\n"
         " timed batches of the calling threads, of the rest of the process, and of gma's own\n"
         " threads. x/gma: pair ns over gma's, above 1 means slower than gma)\n",
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
          "                     [--batch-ms N] [--spin-us N] [--seed N]\n"
          "                     [--pressure-fraction F] [--pressure-rounds N]\n"
          "                     [--scenarios ID,ID] [--gma-conf TEXT] [--allow-no-gma]\n"
          "                     [--json PATH]\n"
          "  --device N             CUDA device ordinal (default 0)\n"
          "  --reps N               timed batches per allocator (default 15)\n"
          "  --pairs N              most alloc+free pairs per batch (default 10000)\n"
          "  --iterations N         most training-loop iterations per batch (default 20)\n"
          "  --batch-ms N           target duration of one batch (default 50)\n"
          "  --spin-us N            how long a buffer's second stream is held (default 20)\n"
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

static int scenario_listed(const char *list, const char *id) {
  size_t n = strlen(id);
  for (const char *p = list; *p;) {
    size_t len = strcspn(p, ",");
    if (len == n && strncmp(p, id, n) == 0) return 1;
    p += len + (p[len] == ',');
  }
  return 0;
}

/* Every id in --scenarios must exist. */
static void check_scenarios(const char *list) {
  for (const char *p = list; *p;) {
    size_t len = strcspn(p, ",");
    int found = 0;
    for (int i = 0; i < NSC; i++)
      if (strlen(scenarios[i].id) == len && strncmp(scenarios[i].id, p, len) == 0) found = 1;
    if (!found) usage();
    p += len + (p[len] == ',');
  }
}

static void parse_option(const char *a, const char *v) {
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
  else if (strcmp(a, "--spin-us") == 0)
    opt.spin_us = (int)parse_long(v, 0, 10000000);
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

static void parse_args(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--allow-no-gma") == 0) {
      opt.allow_no_gma = 1;
      continue;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0 || i + 1 >= argc) usage();
    parse_option(a, argv[++i]);
  }
  if (opt.scenarios) check_scenarios(opt.scenarios);
}

static int selected(const scenario_t *sc) {
  return !opt.scenarios || scenario_listed(opt.scenarios, sc->id);
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

static void setup_direct(void) {
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
}

static void setup_async(void) {
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
      "trimmed to 0 after each turn");
}

static void setup_cub(void) {
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

/* Is gma's CUDA backend here? Returns -1 to go on, else the exit status. */
static int setup_gma(void) {
  for (int i = S_GMA; i <= S_GMAW; i++) {
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
  return -1;
}

static void gpu_info(gpu_info_t *gi, int count) {
  memset(gi, 0, sizeof *gi);
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess) {
    say(gi->name, sizeof gi->name, "%s", prop.name);
    gi->total = prop.totalGlobalMem;
  }
  cudaDriverGetVersion(&gi->driver);
  cudaRuntimeGetVersion(&gi->runtime);
  gi->cuda_devices = count;
  if (gma_device_count(&gi->gma_devices) != GMA_OK) gi->gma_devices = -1;
}

static void make_streams(void) {
  cudaError_t e;
  cudaStream_t *all[2 + NTHREADS] = {&stream, &side_stream};
  for (int i = 0; i < NTHREADS; i++) all[2 + i] = &tstreams[i];
  for (int i = 0; i < 2 + NTHREADS; i++)
    if ((e = cudaStreamCreateWithFlags(all[i], cudaStreamNonBlocking)) != cudaSuccess)
      die_cuda("cudaStreamCreateWithFlags", e);
  if ((e = cudaEventCreateWithFlags(&ev_order, cudaEventDisableTiming)) != cudaSuccess ||
      (e = cudaEventCreateWithFlags(&ev_use, cudaEventDisableTiming)) != cudaSuccess)
    die_cuda("cudaEventCreateWithFlags", e);
}

static void destroy_streams(void) {
  cudaEventDestroy(ev_use);
  cudaEventDestroy(ev_order);
  for (int i = 0; i < NTHREADS; i++) cudaStreamDestroy(tstreams[i]);
  cudaStreamDestroy(side_stream);
  cudaStreamDestroy(stream);
}

static void print_header(const gpu_info_t *gi) {
  printf("gma-bench-gpu: gma %s, %s build (GMA_DEBUG=%d), %s (device %d of %d, %.1f GiB), "
         "driver %d.%d, runtime %d.%d\n",
         gma_version(), GMA_BENCH_BUILD_TYPE, GMA_DEBUG, gi->name, dev, gi->cuda_devices,
         (double)gi->total / (1 << 30), gi->driver / 1000, gi->driver % 1000 / 10,
         gi->runtime / 1000, gi->runtime % 1000 / 10);
  if (gi->gma_devices != gi->cuda_devices)
    printf("  note: gma_device_count reports %d device(s), the CUDA runtime %d\n",
           gi->gma_devices, gi->cuda_devices);
  printf("  one allocator at a time; %d batches each of about %d ms (at most %d pairs / %d "
         "iterations), seed %" PRIu64 "; every buffer touched by a kernel (%s), second "
         "streams held %d us\n",
         opt.reps, opt.batch_ms, opt.pairs, opt.iterations, opt.seed, gma_bench_work_archs(),
         opt.spin_us);
  if (GMA_DEBUG > 0)
    printf("  note: GMA_DEBUG>0 validates gma's pool on every call; use a Release build for "
           "numbers to quote\n");
  for (int i = 0; i < NSIDES; i++)
    printf("  %-16s %s\n", sides[i].id, sides[i].available ? sides[i].how : sides[i].why);
}

static void set_ratios(scenario_run_t *run) {
  const result_t *rd = &run->r[S_DIRECT], *rg = &run->r[S_GMA];
  for (int i = 0; i < NSIDES; i++) {
    result_t *r = &run->r[i];
    if (!r->nbatches) continue;
    if (rd->nbatches && r->median > 0) r->ratio_direct = rd->median / r->median;
    if (rg->nbatches && rg->median > 0) r->ratio_gma = r->median / rg->median;
  }
}

/* A usable device, or the exit status of a skip. Returns -1 to go on. */
static int find_device(int *count) {
  cudaError_t e = cudaGetDeviceCount(count);
  if (e != cudaSuccess)
    return skip_run("cudaGetDeviceCount failed with %s (%s)%s", cudaGetErrorName(e),
                    cudaGetErrorString(e),
                    e == cudaErrorInsufficientDriver
                        ? ": no CUDA driver is installed, or it is older than this runtime"
                        : "");
  if (*count == 0) return skip_run("the CUDA driver reports no device");
  if (opt.device >= *count)
    return skip_run("--device %d, but the driver reports %d device(s)", opt.device, *count);
  dev = opt.device;
  if ((e = cudaSetDevice(dev)) != cudaSuccess) die_cuda("cudaSetDevice", e);
  if ((e = cudaFree(NULL)) != cudaSuccess) die_cuda("creating the primary context", e);
  return -1;
}

int main(int argc, char **argv) {
  parse_args(argc, argv);
  setvbuf(stdout, NULL, _IOLBF, 0);
  int count = 0, rc;
  if ((rc = find_device(&count)) >= 0) return rc;
  if ((rc = setup_gma()) >= 0) return rc;
  setup_direct();
  setup_async();
  setup_cub();
  gpu_info_t gi;
  gpu_info(&gi, count);
  make_streams();
  spin_ns = (uint64_t)opt.spin_us * 1000u;
  sizes = malloc((size_t)opt.pairs * sizeof *sizes);
  if (!sizes) abort();
  tl_plan();
  print_header(&gi);

  scenario_run_t runs[NSC];
  memset(runs, 0, sizeof runs);
  int n = 0;
  for (int s = 0; s < NSC; s++) {
    if (!selected(&scenarios[s])) continue;
    scenario_run_t *run = &runs[n++];
    run->sc = &scenarios[s];
    printf("running: %s\n", run->sc->name);
    run_scenario(run);
    run->ran = 1;
    set_ratios(run);
  }
  print_table(runs, n);
  write_json(&gi, runs, n);
  printf("\nwrote %s\n", opt.json_path);

  destroy_streams();
  for (int s = 0; s < n; s++)
    for (int i = 0; i < NSIDES; i++) free(runs[s].r[i].ns);
  free(sizes);
  return 0;
}
