/* gma's CUDA backend (runtime/device/cuda.c) against the fake driver, using
 * the fake's controls (fault injection, call counters, stream holds, byte
 * counter) to reach what a real GPU cannot show on demand. One scenario per
 * process (argv[1]), since some need their own driver environment or must
 * come before the driver's once-only initialization:
 *
 *   errors    driver errors become clear statuses carrying the driver's error
 *             name, and the allocator stays usable: cuInit failing
 *             (NOT_INITIALIZED, NO_DEVICE) gives GMA_ERR_NO_DEVICE and
 *             device:auto falls back to the simulated device; cuMemAlloc out
 *             of memory once is retried, always is GMA_ERR_OOM; another
 *             cuMemAlloc error is GMA_ERR_DEVICE; cuEventRecord
 *             INVALID_HANDLE makes gma_stream_retire GMA_ERR_DEVICE;
 *             cuStreamCreate OOM; cuEventQuery failing is survived; failed
 *             cuMemMap / cuMemSetAccess leave no chunk behind.
 *   events    event pooling: over hundreds of epochs, cuEventCreate is
 *             called a bounded number of times.
 *   growable  expandable_segments:true: reserved grows in granularity steps
 *             and matches the driver's bytes; a large request is one
 *             cuMemCreate + cuMemMap + cuMemSetAccess (and one cuMemUnmap); freed blocks in adjacent chunks
 *             coalesce, so an allocation spanning them needs no new chunk and
 *             no new reservation; trimming unmaps chunks (the driver's bytes
 *             drop) but never one under a block whose stream work is still
 *             queued (held with fakecuda_launch; the fake would fault);
 *             chunks ask for GPUDirect RDMA and POSIX fd handles exactly when
 *             the device supports them (growable_plain: a device without).
 *   reuse     a block freed on s1 while s1's work on it is held by a kernel
 *             is not handed to s2 until that work ran (the fake's epoch
 *             event is NOT_READY until then), and becomes free after.
 *   retired   a stream retired, then destroyed by the driver: gma makes no
 *             call on its dead handle (the strict fake aborts on one), also
 *             when a host block used on it is freed after the destroy; a
 *             host block used on another thread's per-thread stream is
 *             freed with a device synchronize.
 *   devices   GMA_FAKECUDA_DEVICES=2, GMA_FAKECUDA_MEM=1G,4G: count and
 *             selection (the most free memory wins, OOM when none fits),
 *             allocators on device 1 use device 1's memory.
 *   context   context hygiene: after every gma call the calling thread's
 *             current context is what it was: none, device 0's, or another
 *             device's context pushed by the caller.
 *   hotpath   a bin hit makes no driver call (issue 16): after warming the
 *             bins of a created stream, the NULL stream and the per-thread
 *             stream, 1000 alloc+free pairs on each (and on a second size
 *             class) make 0 calls of any entry point, on a thread with no
 *             current context, where a stream-id probe of the default
 *             handles costs a context push and pop as well. And the
 *             per-thread stream cache behind it is invalidated by a retire:
 *             after gma_stream_destroy and a new stream that gets the same
 *             handle value, and after gma_stream_retire of a live stream,
 *             the next allocation asks the driver for the stream's id again
 *             and starts a new record; the one after that is a bin hit with
 *             0 calls again.
 *   contexts  a stream of a context made with cuCtxCreate: the events gma
 *             records on it (epochs, a pinned host block, wait_stream) are
 *             made in its context (the strict fake aborts on a mismatch), and
 *             a block freed there behind a held kernel is not reused early.
 *   waitstream gma_stream_wait_stream: one cuEventCreate, cuEventRecord on
 *             the waitee, cuStreamWaitEvent on the waiter and cuEventDestroy
 *             per call; a kernel queued on the waiter after the call runs
 *             only after the waitee's held kernel, and not after work queued
 *             on the waitee later; the default streams from a thread with no
 *             current context; a failing cuEventRecord or cuStreamWaitEvent is
 *             GMA_ERR_DEVICE naming the entry point, and the call's event is
 *             destroyed all the same; one stream twice is refused before any
 *             driver call that queues work. */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "drv.h"
#include "fakecuda.h"

#define MiB ((size_t)1 << 20)

static fakecuda_fail_fn fc_fail;
static fakecuda_clear_faults_fn fc_clear;
static fakecuda_calls_fn fc_calls;
static fakecuda_launch_fn fc_launch;
static fakecuda_used_fn fc_used;
static fakecuda_last_create_fn fc_last_create;

/* The fake's controls, without initializing the driver. */
static void controls(void) {
  const char *path = getenv("GMA_CUDA_DRIVER");
  CHECK(path && *path);
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK(h);
  fc_fail = (fakecuda_fail_fn)dlsym(h, "fakecuda_fail");
  fc_clear = (fakecuda_clear_faults_fn)dlsym(h, "fakecuda_clear_faults");
  fc_calls = (fakecuda_calls_fn)dlsym(h, "fakecuda_calls");
  fc_launch = (fakecuda_launch_fn)dlsym(h, "fakecuda_launch");
  fc_used = (fakecuda_used_fn)dlsym(h, "fakecuda_used");
  fc_last_create = (fakecuda_last_create_fn)dlsym(h, "fakecuda_last_create");
  CHECK(fc_fail && fc_clear && fc_calls && fc_launch && fc_used && fc_last_create);
}

/* An allocator on the fake GPU with conf, and the driver opened for this
 * thread's own calls (device 0's primary context current). */
static gma_t *bound_allocator(const char *conf) {
  gma_t *g = drv_cuda_allocator(conf);
  drv_open();
  drv_bind_thread();
  return g;
}

static void fail(const char *entry, unsigned long long nth, CUresult r) {
  CHECK(fc_fail(entry, nth, r) == 0);
}


/* Ordinary segments unless conf says otherwise: most checks here inject
 * cuMemAlloc failures; the growable path's calls have checks of their own
 * (expandable_segments:true). */
static gma_config_t cuda_config(const char *conf) {
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_CUDA;
  c.ignore_env = 1;
  c.expandable_segments = GMA_SEGMENTS_ORDINARY;
  if (conf) CHECK_OK(gma_config_parse(&c, conf));
  return c;
}

static bool has(const char *needle) { return strstr(gma_last_error(), needle) != NULL; }

/* Gives back every cached segment; the epochs' events may need a moment to
 * be seen complete, since trimming never waits for the device. */
static void drain(gma_t *g) {
  for (int i = 0; i < 500 && stats_of(g).reserved.current > stats_of(g).allocated.current; i++) {
    CHECK_OK(gma_empty_cache(g));
    sleep_ms(2);
  }
  gma_stats_t s = stats_of(g);
  CHECK(s.reserved.current == s.allocated.current);
}

/* ---- errors ------------------------------------------------------------ */
static void scenario_errors(void) {
  gma_t *g = NULL;
  gma_config_t c = cuda_config(NULL);
  fail("cuInit", 1, CUDA_ERROR_NOT_INITIALIZED);
  CHECK_ST(gma_create(&c, &g), GMA_ERR_NO_DEVICE);
  CHECK(g == NULL && has("CUDA_ERROR_NOT_INITIALIZED"));
  fail("cuInit", 1, CUDA_ERROR_NO_DEVICE);
  CHECK_ST(gma_create(&c, &g), GMA_ERR_NO_DEVICE);
  CHECK(has("CUDA_ERROR_NO_DEVICE"));
  int n = -1;
  fail("cuInit", 1, CUDA_ERROR_NO_DEVICE);
  CHECK_ST(gma_device_count(&n), GMA_ERR_NO_DEVICE);
  CHECK(n == 0);
  /* device:auto falls back to the simulated device. */
  gma_config_t a = GMA_CONFIG_INIT;
  a.ignore_env = 1;
  fail("cuInit", 1, CUDA_ERROR_NO_DEVICE);
  CHECK_OK(gma_create(&a, &g));
  CHECK(strcmp(gma_device_name(g), "sim") == 0);
  CHECK_OK(gma_destroy(g));
  /* The driver comes up once cuInit works. */
  CHECK_OK(gma_create(&a, &g));
  CHECK(strcmp(gma_device_name(g), "cuda") == 0);
  CHECK_OK(gma_destroy(g));
  drv_open();
  drv_bind_thread();

  /* The worker is off so no timed trim consumes an armed fault. */
  c = cuda_config("worker:off");
  CHECK_OK(gma_create(&c, &g));
  void *p, *q;
  fail("cuMemAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_OK(gma_alloc(g, 12 * MiB, NULL, &p)); /* retried after releasing cache */
  CHECK(stats_of(g).num_oom_retries == 1);
  fill_and_check(p, 12 * MiB, 0x01010101u, NULL);
  for (unsigned long long i = 1; i <= 4; i++) fail("cuMemAlloc", i, CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_ST(gma_alloc(g, 40 * MiB, NULL, &q), GMA_ERR_OOM);
  CHECK(stats_of(g).num_ooms == 1 && has("cannot allocate"));
  fc_clear();
  CHECK_OK(gma_alloc(g, 40 * MiB, NULL, &q));
  fill_and_check(q, 40 * MiB, 0x02020202u, NULL);
  CHECK_OK(gma_free(g, q));
  fail("cuMemAlloc", 1, CUDA_ERROR_UNKNOWN);
  CHECK_ST(gma_alloc(g, 64 * MiB, NULL, &q), GMA_ERR_DEVICE);
  CHECK(has("CUDA_ERROR_UNKNOWN") && has("cuMemAlloc"));
  CHECK_OK(gma_alloc(g, 64 * MiB, NULL, &q));
  CHECK_OK(gma_free(g, q));

  /* A failed epoch event: retire says so with the driver's name. */
  gma_stream_t s, s2;
  CHECK_OK(gma_stream_create(g, &s));
  CHECK_OK(gma_stream_create(g, &s2));
  CHECK_OK(gma_alloc(g, 1 * MiB, s, &q));
  CHECK_OK(gma_free(g, q));
  fail("cuEventRecord", 1, CUDA_ERROR_INVALID_HANDLE);
  CHECK_ST(gma_stream_retire(g, s), GMA_ERR_DEVICE);
  CHECK(has("CUDA_ERROR_INVALID_HANDLE"));
  fail("cuStreamCreate", 1, CUDA_ERROR_OUT_OF_MEMORY);
  gma_stream_t s3;
  CHECK_ST(gma_stream_create(g, &s3), GMA_ERR_OOM);
  CHECK(has("CUDA_ERROR_OUT_OF_MEMORY"));
  /* Failed event queries are survived: blocks stay cached until a query works. */
  CHECK_OK(gma_alloc(g, 2 * MiB, s2, &q));
  fill_and_check(q, 2 * MiB, 0x03030303u, s2);
  CHECK_OK(gma_free(g, q));
  for (unsigned long long i = 1; i <= 3; i++) fail("cuEventQuery", i, CUDA_ERROR_LAUNCH_FAILED);
  CHECK_OK(gma_trim(g, 0));
  fc_clear();
  CHECK_OK(gma_alloc(g, 2 * MiB, s2, &q)); /* still usable */
  fill_and_check(q, 2 * MiB, 0x04040404u, s2);
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_stream_destroy(g, s2));
  CHECK_OK(gma_stream_destroy(g, s)); /* retired already: only the driver's stream goes */
  CHECK_OK(gma_destroy(g));
  CHECK(fc_used(0) == 0);

  /* Growable segments: a failed map or access grant leaves nothing behind. */
  c = cuda_config("worker:off,expandable_segments:true");
  CHECK_OK(gma_create(&c, &g));
  CHECK(fc_used(0) == 0);
  fail("cuMemMap", 1, CUDA_ERROR_INVALID_VALUE);
  CHECK_ST(gma_alloc(g, 4 * MiB, NULL, &p), GMA_ERR_DEVICE);
  CHECK(has("CUDA_ERROR_INVALID_VALUE") && has("cuMemMap"));
  CHECK(fc_used(0) == stats_of(g).reserved.current);
  fail("cuMemSetAccess", 1, CUDA_ERROR_INVALID_VALUE);
  CHECK_ST(gma_alloc(g, 4 * MiB, NULL, &p), GMA_ERR_DEVICE);
  CHECK(has("cuMemSetAccess"));
  CHECK(fc_used(0) == stats_of(g).reserved.current);
  fail("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY); /* retried */
  CHECK_OK(gma_alloc(g, 4 * MiB, NULL, &p));
  fill_and_check(p, 4 * MiB, 0x05050505u, NULL);
  CHECK(fc_used(0) == stats_of(g).reserved.current);
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_destroy(g));
  CHECK(fc_used(0) == 0);
  CHECK(drv_current() == drv.ctx);
}

/* ---- events ------------------------------------------------------------ */
static void epoch_round(gma_t *g, gma_stream_t s1, gma_stream_t s2, int i) {
  void *p, *q;
  CHECK_OK(gma_alloc(g, 256 << 10, s1, &p));
  drv_memset32(p, (uint32_t)i, 256 << 10, s1);
  CHECK_OK(gma_record_stream(g, p, s2));
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_alloc(g, 64 << 10, s2, &q));
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_trim(g, UINT64_MAX)); /* polls: closes both streams' epochs */
  if (i % 16 == 15) {
    drv_sync(s1);
    drv_sync(s2);
  }
}

static void scenario_events(void) {
  gma_t *g = bound_allocator("worker:off");
  gma_stream_t s1, s2;
  CHECK_OK(gma_stream_create(g, &s1));
  CHECK_OK(gma_stream_create(g, &s2));
  for (int i = 0; i < 32; i++) epoch_round(g, s1, s2, i);
  unsigned long long created0 = fc_calls("cuEventCreate"), records0 = fc_calls("cuEventRecord");
  uint64_t epochs0 = stats_of(g).num_epoch_events;
  const int rounds = 600;
  for (int i = 0; i < rounds; i++) epoch_round(g, s1, s2, i);
  unsigned long long created = fc_calls("cuEventCreate") - created0;
  unsigned long long records = fc_calls("cuEventRecord") - records0;
  uint64_t epochs = stats_of(g).num_epoch_events - epochs0;
  printf("events: %d rounds closed %llu epochs with %llu records and %llu new events\n", rounds,
         (unsigned long long)epochs, records, created);
  CHECK(epochs >= (uint64_t)rounds && records >= epochs);
  /* At most the outstanding events of two streams (16 each) ever exist. */
  CHECK(created <= 32);
  CHECK_OK(gma_stream_destroy(g, s1));
  CHECK_OK(gma_stream_destroy(g, s2));
  CHECK_OK(gma_destroy(g));
  CHECK(fc_calls("cuEventDestroy") == fc_calls("cuEventCreate")); /* none leaked */
  CHECK(fc_used(0) == 0);
}

/* ---- growable ---------------------------------------------------------- */
/* Holds its stream until *gate is set (at most 10 s), like a long kernel. */
static void gate_kernel(void *arg) {
  atomic_int *gate = arg;
  for (int i = 0; i < 5000 && !atomic_load(gate); i++) sleep_ms(2);
}

static void scenario_growable(void) {
  const uint64_t gran = 2 * MiB; /* GMA_FAKECUDA_GRANULARITY */
  /* Minimum chunk one granule (large_segment:2M): each growth maps
   * what it lacks, so chunks and trims can be counted one by one. */
  gma_t *g = bound_allocator("expandable_segments:true,worker:off,large_segment:2M");
  unsigned long long reserves = fc_calls("cuMemAddressReserve");
  gma_stream_t s, s2;
  CHECK_OK(gma_stream_create(g, &s));
  CHECK_OK(gma_stream_create(g, &s2));

  /* Reserved memory grows by whole chunks, and is what the driver holds. */
  void *small, *mid;
  CHECK_OK(gma_alloc(g, 1 * MiB, s, &small));
  gma_stats_t st = stats_of(g);
  CHECK(st.reserved.current > 0 && st.reserved.current % gran == 0);
  CHECK(fc_used(0) == st.reserved.current);
  /* Chunks are RDMA capable and exportable where the device supports it
   * (GMA_FAKECUDA_VMM_FEATURES=none: a device that supports neither). */
  const char *features = getenv("GMA_FAKECUDA_VMM_FEATURES");
  bool plain = features && strcmp(features, "none") == 0;
  CHECK(fc_last_create() == (plain ? 0u : FAKECUDA_CREATE_RDMA | FAKECUDA_CREATE_POSIX_FD));
  uint64_t before = st.reserved.current;
  CHECK_OK(gma_alloc(g, 3 * MiB, s, &mid));
  st = stats_of(g);
  CHECK(st.reserved.current > before && (st.reserved.current - before) % gran == 0);
  CHECK(fc_used(0) == st.reserved.current);

  /* Two 6 MiB blocks in adjacent chunks, freed, coalesce: a 12 MiB request
   * fits the merged run, with no new chunk and no new reservation. */
  void *a, *b, *c;
  CHECK_OK(gma_alloc(g, 6 * MiB, s, &a));
  CHECK_OK(gma_alloc(g, 6 * MiB, s, &b));
  CHECK_OK(gma_free(g, a));
  CHECK_OK(gma_free(g, b));
  drv_sync(s);
  for (int i = 0; i < 500 && stats_of(g).free_bytes < 12 * MiB; i++) {
    CHECK_OK(gma_trim(g, UINT64_MAX)); /* polls the epochs, releases nothing */
    sleep_ms(2);
  }
  CHECK(stats_of(g).free_bytes >= 12 * MiB);
  unsigned long long creates = fc_calls("cuMemCreate");
  CHECK_OK(gma_alloc(g, 12 * MiB, s2, &c));
  CHECK(fc_calls("cuMemCreate") == creates);
  CHECK(fc_calls("cuMemAddressReserve") == reserves);
  fill_and_check(c, 12 * MiB, 0x0c0c0c0cu, s2); /* one fill across several chunks */
  CHECK_OK(gma_free(g, c));
  CHECK_OK(gma_free(g, small));
  CHECK_OK(gma_free(g, mid));
  drv_sync(s);
  drv_sync(s2);
  drain(g);
  CHECK(fc_used(0) == 0);

  /* A large request is a few physical chunks (none under 1/256 of the
   * limit: 32 MiB of the 8 GiB device), each one cuMemCreate,
   * one cuMemMap and one cuMemSetAccess for its whole run (not one per
   * granule), and each goes back with one cuMemUnmap. */
  unsigned long long cr = fc_calls("cuMemCreate"), mp = fc_calls("cuMemMap"),
                     ac = fc_calls("cuMemSetAccess"), um = fc_calls("cuMemUnmap");
  uint64_t maps = stats_of(g).num_device_allocs;
  void *big;
  CHECK_OK(gma_alloc(g, 64 * MiB + 4096, s, &big));
  unsigned long long n = stats_of(g).num_device_allocs - maps;
  CHECK(n >= 1 && n <= 2);
  CHECK(fc_calls("cuMemCreate") == cr + n && fc_calls("cuMemMap") == mp + n &&
        fc_calls("cuMemSetAccess") == ac + n);
  CHECK(fc_used(0) == 66 * MiB && stats_of(g).reserved.current == 66 * MiB);
  fill_and_check(big, 64 * MiB, 0x0e0e0e0eu, s);
  CHECK_OK(gma_free(g, big));
  drv_sync(s);
  drain(g);
  CHECK(fc_used(0) == 0 && fc_calls("cuMemUnmap") == um + n);

  /* Trimming unmaps free chunks, never one under queued stream work: x's
   * fill waits behind a held kernel when x is freed, y is idle. */
  atomic_int gate = 0;
  void *x, *y;
  CHECK_OK(gma_alloc(g, 4 * MiB, s, &x));
  CHECK_OK(gma_alloc(g, 8 * MiB, s2, &y));
  CHECK(fc_launch(s, gate_kernel, &gate) == CUDA_SUCCESS);
  drv_memset32(x, 0x0d0d0d0du, 4 * MiB, s);
  CHECK_OK(gma_free(g, x));
  CHECK_OK(gma_free(g, y));
  drv_sync(s2);
  uint64_t held = fc_used(0);
  CHECK(held >= 12 * MiB);
  for (int i = 0; i < 50; i++) {
    CHECK_OK(gma_empty_cache(g)); /* never waits for s */
    sleep_ms(2);
  }
  uint64_t trimmed = fc_used(0);
  CHECK(trimmed < held);       /* y's chunks went back */
  CHECK(trimmed >= 4 * MiB);   /* x's did not */
  CHECK(stats_of(g).reserved.current == trimmed);
  atomic_store(&gate, 1);
  /* Had x's chunks been unmapped, its fill would have faulted the context. */
  CHECK_OK(gma_stream_synchronize(g, s));
  drain(g);
  CHECK(fc_used(0) == 0);
  CHECK(fc_calls("cuMemAddressReserve") == reserves);

  /* A feature the device reports but then refuses: the chunk is made plain
   * (one more cuMemCreate); out of memory is not retried that way. */
  if (!plain) {
    unsigned long long made = fc_calls("cuMemCreate");
    CHECK(fc_fail("cuMemCreate", 1, CUDA_ERROR_NOT_PERMITTED) == 0);
    void *z;
    CHECK_OK(gma_alloc(g, 40 * MiB, s, &z));
    CHECK(fc_calls("cuMemCreate") == made + 2 && fc_last_create() == 0);
    CHECK_OK(gma_free(g, z));
    fc_clear();
  }
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_stream_destroy(g, s2));
  CHECK_OK(gma_destroy(g));
  CHECK(fc_calls("cuMemAddressFree") == reserves);
}

/* The handle pool on the driver: with no room below the limit, the OOM
 * retry unmaps the free chunks between live blocks (cuMemUnmap, no
 * cuMemRelease) and the growth maps them again elsewhere (cuMemMap and
 * cuMemSetAccess, no cuMemCreate); a trim releases the one left over. */
static void growable_kept_chunks(void) {
  gma_t *g = bound_allocator("expandable_segments:true,worker:off,memory_limit:40M,"
                             "oom_wait_ms:0");
  char *r[13];
  for (int i = 0; i < 13; i++) CHECK_OK(gma_alloc(g, 3 * MiB, NULL, (void **)&r[i]));
  for (int i = 1; i < 13; i += 3) CHECK_OK(gma_free(g, r[i]));
  CHECK_OK(gma_free(g, r[12]));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  unsigned long long cr = fc_calls("cuMemCreate"), rel = fc_calls("cuMemRelease"),
                     mp = fc_calls("cuMemMap"), um = fc_calls("cuMemUnmap");
  gma_stats_t s0 = stats_of(g);
  void *big;
  CHECK_OK(gma_alloc(g, 8 * MiB, NULL, &big));
  gma_stats_t st = stats_of(g);
  unsigned long long unmaps = fc_calls("cuMemUnmap") - um, maps = fc_calls("cuMemMap") - mp;
  CHECK(fc_calls("cuMemCreate") == cr && fc_calls("cuMemRelease") == rel);
  CHECK(maps == 4 && unmaps >= 5 && st.num_device_keeps - s0.num_device_keeps == unmaps &&
        st.num_device_remaps - s0.num_device_remaps == maps);
  CHECK(st.kept_chunks == unmaps - maps && fc_used(0) == st.reserved.current + st.kept_bytes);
  CHECK_OK(gma_trim(g, 0));
  CHECK(fc_calls("cuMemRelease") == rel + st.kept_chunks && stats_of(g).kept_bytes == 0);
  CHECK_OK(gma_free(g, big));
  for (int i = 0; i < 12; i++)
    if (i % 3 != 1) CHECK_OK(gma_free(g, r[i]));
  drain(g);
  CHECK_OK(gma_destroy(g));
  CHECK(fc_used(0) == 0);
  printf("growable: 8 MiB with no room mapped 4 kept chunks, created none\n");
}

/* ---- reuse ------------------------------------------------------------- */
static bool overlaps(const void *a, size_t na, const void *b, size_t nb) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + nb && y < x + na;
}

/* A block freed on s1 while s1's work on it is held is not handed to s2
 * until that work ran: the epoch event recorded behind it stays NOT_READY
 * in the fake until the held kernel and the memset after it have run. Once
 * they did, the memory becomes free for every stream. */
static void scenario_reuse(void) {
  gma_t *g = bound_allocator("worker:off,reuse:query");
  gma_stream_t s1, s2;
  CHECK_OK(gma_stream_create(g, &s1));
  CHECK_OK(gma_stream_create(g, &s2));
  const size_t sz = 4 * MiB;
  void *p;
  CHECK_OK(gma_alloc(g, sz, s1, &p));
  atomic_int gate = 0;
  CHECK(fc_launch(s1, gate_kernel, &gate) == CUDA_SUCCESS);
  drv_memset32(p, 0x0f0f0f0fu, sz, s1);
  CHECK_OK(gma_free(g, p));
  enum { N = 8 };
  void *q[N];
  for (int i = 0; i < N; i++) {
    CHECK_OK(gma_trim(g, UINT64_MAX)); /* polls: closes s1's epoch, queries its event */
    CHECK_OK(gma_alloc(g, sz, s2, &q[i]));
    CHECK(!overlaps(q[i], sz, p, sz)); /* s1's memset may still write there */
    sleep_ms(1);
  }
  /* The epoch event completes after the held work ran: p's bytes become
   * free for any stream, without synchronizing through gma. */
  uint64_t free0 = stats_of(g).free_bytes;
  atomic_store(&gate, 1);
  for (int i = 0; i < 5000 && stats_of(g).free_bytes < free0 + sz; i++) {
    CHECK_OK(gma_trim(g, UINT64_MAX));
    sleep_ms(1);
  }
  CHECK(stats_of(g).free_bytes >= free0 + sz);
  for (int i = 0; i < N; i++) CHECK_OK(gma_free(g, q[i]));
  drv_sync(s1);
  drv_sync(s2);
  drain(g);
  CHECK(fc_used(0) == 0);
  CHECK_OK(gma_stream_destroy(g, s1));
  CHECK_OK(gma_stream_destroy(g, s2));
  CHECK_OK(gma_destroy(g));
}

/* ---- outside ----------------------------------------------------------- */
/* Memory another allocator holds is not waited for as if gma's device work
 * could give it back: with 6 GiB of the 8 GiB device held outside, 1 GiB
 * free and 1 GiB of gma's own freed behind a held kernel, 2.5 GiB fails at
 * once, saying the rest is used outside; a watchdog opens the kernel's gate
 * after 3 s, so a call that waited shows as a 3 s call, not a hang. */
static atomic_int outside_gate;
static void *open_gate_later(void *arg) {
  (void)arg;
  for (int i = 0; i < 1500 && !atomic_load(&outside_gate); i++) sleep_ms(2);
  atomic_store(&outside_gate, 1);
  return NULL;
}

static void scenario_outside(void) {
  gma_t *other = bound_allocator("worker:off");
  gma_t *g = drv_cuda_allocator("worker:off,reuse:query");
  void *held, *p, *q;
  CHECK_OK(gma_alloc(other, 6ull << 30, NULL, &held));
  gma_stream_t s, t;
  CHECK_OK(gma_stream_create(g, &s));
  CHECK_OK(gma_stream_create(g, &t));
  CHECK_OK(gma_alloc(g, 1ull << 30, s, &p));
  atomic_store(&outside_gate, 0);
  CHECK(fc_launch(s, gate_kernel, &outside_gate) == CUDA_SUCCESS);
  CHECK_OK(gma_free(g, p));
  pthread_t dog;
  CHECK(pthread_create(&dog, NULL, open_gate_later, NULL) == 0);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  CHECK_ST(gma_alloc(g, (5ull << 30) / 2, t, &q), GMA_ERR_OOM);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  CHECK(!atomic_load(&outside_gate) && ms < 2000); /* did not wait for the kernel */
  CHECK(has("in use outside this allocator"));
  CHECK(stats_of(g).num_oom_waits == 0);
  atomic_store(&outside_gate, 1);
  pthread_join(dog, NULL);
  drv_sync(s);
  drain(g);
  CHECK_OK(gma_free(other, held));
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_stream_destroy(g, t));
  CHECK_OK(gma_destroy(g));
  CHECK_OK(gma_destroy(other));
}

/* ---- waitstream -------------------------------------------------------- */
typedef struct tagged {
  atomic_int *log, *n;
  int tag;
} tagged_t;

static void tag_kernel(void *arg) {
  tagged_t *t = arg;
  t->log[atomic_fetch_add(t->n, 1)] = t->tag;
}

static unsigned long long wait_calls[4];
static const char *const wait_entries[4] = {"cuEventCreate", "cuEventRecord", "cuStreamWaitEvent",
                                            "cuEventDestroy"};
static void wait_calls_mark(void) {
  for (int i = 0; i < 4; i++) wait_calls[i] = fc_calls(wait_entries[i]);
}
/* Each of the four entry points was called n more times since the mark. */
static void wait_calls_check(unsigned long long n) {
  for (int i = 0; i < 4; i++)
    if (fc_calls(wait_entries[i]) - wait_calls[i] != n) {
      fprintf(stderr, "%s: %llu calls, expected %llu\n", wait_entries[i],
              fc_calls(wait_entries[i]) - wait_calls[i], n);
      exit(1);
    }
}

static void *wait_from_unbound_thread(void *arg) {
  gma_t *g = arg;
  CHECK(drv_current() == NULL); /* no context: gma pushes its own for the default stream */
  CHECK_OK(gma_stream_wait_stream(g, NULL, GMA_STREAM_PER_THREAD));
  CHECK(drv_current() == NULL);
  return NULL;
}

static void scenario_waitstream(void) {
  gma_t *g = bound_allocator("worker:off");
  gma_stream_t s1, s2;
  CHECK_OK(gma_stream_create(g, &s1));
  CHECK_OK(gma_stream_create(g, &s2));
  atomic_int gate = 0, gate2 = 0, log[8], n = 0;
  tagged_t first = {log, &n, 1}, consumer = {log, &n, 2}, later = {log, &n, 3};
  CHECK(fc_launch(s1, gate_kernel, &gate) == CUDA_SUCCESS);
  CHECK(fc_launch(s1, tag_kernel, &first) == CUDA_SUCCESS);
  wait_calls_mark();
  CHECK_OK(gma_stream_wait_stream(g, s2, s1));
  wait_calls_check(1);
  CHECK(fc_launch(s1, gate_kernel, &gate2) == CUDA_SUCCESS); /* after the call */
  CHECK(fc_launch(s1, tag_kernel, &later) == CUDA_SUCCESS);
  CHECK(fc_launch(s2, tag_kernel, &consumer) == CUDA_SUCCESS);
  sleep_ms(20);
  CHECK(atomic_load(&n) == 0); /* s2 waits on the device, the host went on */
  atomic_store(&gate, 1);
  drv_sync(s2); /* while gate2 still holds s1 */
  CHECK(atomic_load(&n) == 2 && log[0] == 1 && log[1] == 2);
  atomic_store(&gate2, 1);
  drv_sync(s1);
  CHECK(atomic_load(&n) == 3 && log[2] == 3);
  /* The default streams, also from a thread without a current context. */
  CHECK_OK(gma_stream_wait_stream(g, NULL, s1));
  CHECK_OK(gma_stream_wait_stream(g, s2, GMA_STREAM_LEGACY));
  pthread_t t;
  CHECK(pthread_create(&t, NULL, wait_from_unbound_thread, g) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  /* Driver failures: the entry point is named, the event is not leaked. */
  fail("cuStreamWaitEvent", 1, CUDA_ERROR_UNKNOWN);
  wait_calls_mark();
  CHECK_ST(gma_stream_wait_stream(g, s2, s1), GMA_ERR_DEVICE);
  CHECK(has("cuStreamWaitEvent") && has("CUDA_ERROR_UNKNOWN") && has("CUDA driver"));
  wait_calls_check(1);
  fc_clear();
  fail("cuEventRecord", 1, CUDA_ERROR_INVALID_HANDLE);
  unsigned long long destroys = fc_calls("cuEventDestroy"), waits = fc_calls("cuStreamWaitEvent");
  CHECK_ST(gma_stream_wait_stream(g, s2, s1), GMA_ERR_DEVICE);
  CHECK(has("cuEventRecord") && has("CUDA_ERROR_INVALID_HANDLE"));
  CHECK(fc_calls("cuEventDestroy") == destroys + 1 && fc_calls("cuStreamWaitEvent") == waits);
  fc_clear();
  /* One stream twice: refused with no event made. */
  wait_calls_mark();
  CHECK_ST(gma_stream_wait_stream(g, s1, s1), GMA_ERR_INVALID_ARGUMENT);
  CHECK_ST(gma_stream_wait_stream(g, NULL, GMA_STREAM_LEGACY), GMA_ERR_INVALID_ARGUMENT);
  CHECK(has("same stream"));
  wait_calls_check(0);
  CHECK_OK(gma_stream_wait_stream(g, s2, s1)); /* and the allocator goes on */
  drv_sync(s2);
  CHECK_OK(gma_stream_destroy(g, s1));
  CHECK_OK(gma_stream_destroy(g, s2));
  CHECK_OK(gma_destroy(g));
}

/* The driver's cuGetProcAddress_v2, for entry points drv.h does not load
 * (after bound_allocator opened the driver). */
static void *drv_get_proc(void) {
  void *gp = dlsym(drv.lib, "cuGetProcAddress_v2");
  CHECK(gp);
  return gp;
}

/* ---- contexts ---------------------------------------------------------- */
/* A stream of a context other than the primary one (cuCtxCreate; green
 * contexts are the same case on a GPU): gma's epoch events, a pinned host
 * block's event and gma_stream_wait_stream's event are made in the stream's
 * context, which the strict fake checks on every cuEventRecord (an event of
 * the primary context recorded there aborts). The epochs still gate reuse:
 * a block freed on the stream while a held kernel runs there is not handed
 * to the default stream until the kernel ran. */
static void *proc_at(void *gp, const char *name, int version) {
  typedef CUresult (*get_proc_t)(const char *, void **, int, cuuint64_t,
                                 CUdriverProcAddressQueryResult *);
  void *fn = NULL;
  CUdriverProcAddressQueryResult st;
  CHECK(((get_proc_t)gp)(name, &fn, version, 0, &st) == CUDA_SUCCESS && fn);
  return fn;
}

static void scenario_contexts(void) {
  gma_t *g = bound_allocator("worker:off");
  void *gp = drv_get_proc();
  __typeof__(&cuCtxCreate) ctx_create = proc_at(gp, "cuCtxCreate", 13000);
  __typeof__(&cuCtxDestroy) ctx_destroy = proc_at(gp, "cuCtxDestroy", 13000);
  __typeof__(&cuCtxPopCurrent) ctx_pop = proc_at(gp, "cuCtxPopCurrent", 13000);
  __typeof__(&cuStreamCreate) create = proc_at(gp, "cuStreamCreate", 13000);
  __typeof__(&cuStreamDestroy) destroy = proc_at(gp, "cuStreamDestroy", 13000);
  CUcontext mine, popped;
  CHECK(ctx_create(&mine, NULL, 0, 0) == CUDA_SUCCESS); /* current now */
  CUstream cs;
  CHECK(create(&cs, 0) == CUDA_SUCCESS);
  CHECK(ctx_pop(&popped) == CUDA_SUCCESS && popped == mine); /* back to the primary */
  gma_stream_t s = (gma_stream_t)cs;
  for (int round = 0; round < 3; round++) {
    void *p, *h;
    CHECK_OK(gma_alloc(g, 1 * MiB, s, &p));
    CHECK_OK(gma_host_alloc(g, 4096, s, &h));
    atomic_int gate = 0;
    CHECK(fc_launch(cs, gate_kernel, &gate) == CUDA_SUCCESS);
    drv_memset32(p, 0x0c0c0c0cu, 1 * MiB, s);
    CHECK_OK(gma_free(g, p));
    CHECK_OK(gma_host_free(g, h)); /* its event: made in the stream's context */
    CHECK_OK(gma_stream_wait_stream(g, NULL, s)); /* the waitee's context makes the event */
    for (int i = 0; i < 20; i++) { /* polls record epoch events on s */
      void *q;
      CHECK_OK(gma_trim(g, UINT64_MAX));
      CHECK_OK(gma_alloc(g, 1 * MiB, NULL, &q));
      CHECK(q != p); /* s's work on p is still held */
      CHECK_OK(gma_free(g, q));
    }
    atomic_store(&gate, 1);
    CHECK_OK(gma_stream_synchronize(g, s));
    CHECK_OK(gma_stream_synchronize(g, NULL));
  }
  CHECK_OK(gma_stream_retire(g, s));
  CHECK(destroy(cs) == CUDA_SUCCESS);
  CHECK(ctx_destroy(mine) == CUDA_SUCCESS);
  drain(g);
  CHECK_OK(gma_destroy(g));
}

/* ---- retired ----------------------------------------------------------- */
/* The rule (README "Streams"): retire a stream before destroying it yourself.
 * Then gma never names the dead handle to the driver, which the strict fake
 * aborts on (undefined on a GPU): a host block used on the stream is freed
 * after the destroy (its free was ordered at the retire), a trim closes no
 * epoch on it, and a new stream that may get the same handle value starts
 * clean. The per-thread default stream is the one handle that names another
 * stream on another thread: a host block used on a helper thread's
 * GMA_STREAM_PER_THREAD and freed on this thread is ordered by a device
 * synchronize (the free cannot name that stream), with no abort either. */
typedef struct pt_host {
  gma_t *g;
  void *h;
} pt_host_t;

static void *pt_host_alloc(void *arg) {
  pt_host_t *a = arg;
  drv_bind_thread();
  CHECK_OK(gma_host_alloc(a->g, 4096, GMA_STREAM_PER_THREAD, &a->h));
  return NULL;
}

static void scenario_retired(void) {
  gma_t *g = bound_allocator("worker:off");
  void *gp = drv_get_proc();
  __typeof__(&cuStreamCreate) create = drv_proc(gp, "cuStreamCreate");
  __typeof__(&cuStreamDestroy) destroy = drv_proc(gp, "cuStreamDestroy");
  for (int round = 0; round < 3; round++) { /* handle values may be recycled */
    CUstream s;
    CHECK(create(&s, 0) == CUDA_SUCCESS);
    void *p, *h;
    CHECK_OK(gma_alloc(g, 1 * MiB, (gma_stream_t)s, &p));
    CHECK_OK(gma_host_alloc(g, 4096, (gma_stream_t)s, &h));
    drv_memset32(p, 0x0a0a0a0au, 1 * MiB, (gma_stream_t)s);
    CHECK_OK(gma_free(g, p));
    CHECK_OK(gma_stream_retire(g, (gma_stream_t)s));
    CHECK(destroy(s) == CUDA_SUCCESS);
    CHECK_OK(gma_host_free(g, h)); /* ordered at the retire: no call on s */
    CHECK_OK(gma_trim(g, UINT64_MAX)); /* s's epoch was closed at the retire */
    void *q;
    CHECK_OK(gma_alloc(g, 1 * MiB, NULL, &q));
    CHECK_OK(gma_free(g, q));
  }
  pt_host_t a = {g, NULL};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, pt_host_alloc, &a) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(a.h != NULL);
  CHECK_OK(gma_host_free(g, a.h)); /* another thread's per-thread stream: a device sync */
  CHECK_OK(gma_destroy(g));
}

/* ---- devices ----------------------------------------------------------- */
static void scenario_devices(void) {
  int n = 0, d = -1;
  CHECK_OK(gma_device_count(&n));
  CHECK(n == 2);
  CHECK_OK(gma_select_device(1, &d));
  CHECK(d == 1); /* 4 GiB free against 1 GiB */
  CHECK_OK(gma_select_device((size_t)2 << 30, &d));
  CHECK(d == 1);
  CHECK_ST(gma_select_device((size_t)5 << 30, &d), GMA_ERR_OOM);
  CHECK(d == -1 && has("none of the 2"));

  gma_config_t c = cuda_config(NULL);
  c.device_ordinal = 2;
  gma_t *g = NULL;
  CHECK_ST(gma_create(&c, &g), GMA_ERR_NO_DEVICE);
  c.device_ordinal = 1;
  CHECK_OK(gma_create(&c, &g));
  void *p;
  CHECK_OK(gma_alloc(g, 3500 * MiB, NULL, &p)); /* only device 1 has room */
  CHECK(fc_used(1) >= 3500 * MiB && fc_used(0) == 0);
  CHECK_OK(gma_select_device(1, &d));
  CHECK(d == 0); /* now device 0 has the most free */
  gma_t *g0 = NULL;
  c.device_ordinal = 0;
  CHECK_OK(gma_create(&c, &g0));
  void *none;
  CHECK_ST(gma_alloc(g0, 2048 * MiB, NULL, &none), GMA_ERR_INVALID_SIZE); /* > 1 GiB device */
  CHECK_OK(gma_destroy(g0));
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_destroy(g));
  CHECK(fc_used(1) == 0);
}

/* ---- context ----------------------------------------------------------- */
static CUcontext current(void) { return (CUcontext)drv_current(); }

/* Every kind of gma call, each followed by a look at the current context. */
static void calls_keep_context(CUcontext expected, int ordinal) {
  gma_config_t c = cuda_config(NULL);
  c.device_ordinal = ordinal;
  gma_t *g = NULL;
  CHECK_OK(gma_create(&c, &g));
  CHECK(current() == expected);
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  void *p, *q, *r;
  CHECK_OK(gma_alloc(g, 1 * MiB, NULL, &p));
  CHECK_OK(gma_alloc(g, 30 * MiB, s, &q));
  CHECK_OK(gma_alloc(g, 4096, GMA_STREAM_PER_THREAD, &r));
  CHECK(current() == expected);
  CHECK_OK(gma_record_stream(g, q, NULL));
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_free(g, q));
  CHECK_OK(gma_free(g, r));
  CHECK(current() == expected);
  gma_future_t *f;
  CHECK_OK(gma_alloc_async(g, 16 * MiB, s, NULL, &f));
  CHECK_OK(gma_future_wait(f, UINT64_MAX, &p));
  CHECK_OK(gma_future_release(f));
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_stream_synchronize(g, s));
  CHECK_OK(gma_stream_synchronize(g, NULL));
  CHECK_OK(gma_trim(g, 0));
  CHECK_OK(gma_empty_cache(g));
  gma_stats_t st = GMA_STATS_INIT;
  CHECK_OK(gma_stats(g, &st));
  CHECK(current() == expected);
  int n, d;
  CHECK_OK(gma_device_count(&n));
  CHECK_OK(gma_select_device(1, &d));
  CHECK(current() == expected);
  CHECK_OK(gma_stream_retire(g, GMA_STREAM_PER_THREAD));
  CHECK_OK(gma_stream_destroy(g, s));
  CHECK_OK(gma_destroy(g));
  CHECK(current() == expected);
}

static void *no_context_thread(void *arg) {
  (void)arg;
  CHECK(current() == NULL);
  calls_keep_context(NULL, 0);
  return NULL;
}

static void scenario_context(void) {
  gma_t *probe = drv_cuda_allocator(NULL);
  CHECK_OK(gma_destroy(probe));
  drv_open(); /* retains device 0's primary context, makes nothing current */
  CHECK(current() == NULL);
  calls_keep_context(NULL, 0); /* a thread without a context keeps none */
  calls_keep_context(NULL, 1);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, no_context_thread, NULL) == 0);
  pthread_join(t, NULL);

  /* A thread working in device 1's context, using gma on device 0: the
   * memory lands on device 0 and the thread stays in device 1's context. */
  __typeof__(&cuDevicePrimaryCtxRetain) retain;
  __typeof__(&cuDevicePrimaryCtxRelease) release;
  __typeof__(&cuCtxPushCurrent) push;
  __typeof__(&cuCtxPopCurrent) pop;
  void *gp = dlsym(drv.lib, "cuGetProcAddress_v2");
  CHECK(gp);
  retain = drv_proc(gp, "cuDevicePrimaryCtxRetain");
  release = drv_proc(gp, "cuDevicePrimaryCtxRelease");
  push = drv_proc(gp, "cuCtxPushCurrent");
  pop = drv_proc(gp, "cuCtxPopCurrent");
  CUcontext ctx1 = NULL, popped = NULL;
  CHECK(retain(&ctx1, 1) == CUDA_SUCCESS && ctx1 != (CUcontext)drv.ctx);
  CHECK(push(ctx1) == CUDA_SUCCESS);
  calls_keep_context(ctx1, 0);
  calls_keep_context(ctx1, 1);
  CHECK(pop(&popped) == CUDA_SUCCESS && popped == ctx1);
  CHECK(current() == NULL); /* the stack is as it was before the push */

  /* A thread already in device 0's context keeps it. */
  drv_bind_thread();
  calls_keep_context((CUcontext)drv.ctx, 0);
  CHECK(release(1) == CUDA_SUCCESS);
  CHECK(fc_used(0) == 0 && fc_used(1) == 0);
}

/* ---- hotpath ----------------------------------------------------------- */
static gma_stream_stats_t sstats(gma_t *g, gma_stream_t s) {
  gma_stream_stats_t ss = GMA_STREAM_STATS_INIT;
  CHECK_OK(gma_stream_stats(g, s, &ss)); /* asks the driver: never inside a counted window */
  return ss;
}

/* One alloc+free pair of size on s. */
static void pair(gma_t *g, size_t size, gma_stream_t s) {
  void *p = NULL;
  CHECK_OK(gma_alloc(g, size, s, &p));
  CHECK(p != NULL);
  CHECK_OK(gma_free(g, p));
}

static void scenario_hotpath(void) {
  /* The worker on, as by default, with its timer out of the way: a tick
   * asks the driver for memory info, which is not the hot path's doing. */
  gma_t *g = drv_cuda_allocator("trim_interval_ms:3600000");
  /* No drv_bind_thread: this thread has no current context, so probing
   * the NULL and per-thread handles would push and pop one. */
  gma_stream_t s;
  CHECK_OK(gma_stream_create(g, &s));
  gma_stream_t streams[] = {s, NULL, GMA_STREAM_PER_THREAD};
  const char *names[] = {"created", "NULL", "per-thread"};
  const size_t small = 4 << 10, mid = 96 << 10;
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 2; k++) { /* the first makes the record, the second fills the cache */
      pair(g, small, streams[i]);
      pair(g, mid, streams[i]);
    }
  gma_stream_stats_t before[3];
  for (int i = 0; i < 3; i++) before[i] = sstats(g, streams[i]);
  const int pairs = 1000;
  unsigned long long calls0 = fc_calls("*"), ids0 = fc_calls("cuStreamGetId");
  for (int n = 0; n < pairs; n++)
    for (int i = 0; i < 3; i++) pair(g, small, streams[i]);
  for (int n = 0; n < pairs; n++) pair(g, mid, s);
  unsigned long long calls = fc_calls("*") - calls0, ids = fc_calls("cuStreamGetId") - ids0;
  printf("hotpath: %d bin-hit pairs on 3 streams and %d of a second size: %llu driver calls "
         "(%llu cuStreamGetId)\n", 3 * pairs, pairs, calls, ids);
  for (int i = 0; i < 3; i++) { /* they were bin hits */
    gma_stream_stats_t after = sstats(g, streams[i]);
    uint64_t want = (uint64_t)pairs * (i == 0 ? 2 : 1);
    if (after.hits - before[i].hits != want || after.misses != before[i].misses)
      fprintf(stderr, "%s stream: %llu hits, %llu misses in the loop (want %llu, 0)\n", names[i],
              (unsigned long long)(after.hits - before[i].hits),
              (unsigned long long)(after.misses - before[i].misses), (unsigned long long)want);
    CHECK(after.hits - before[i].hits == want && after.misses == before[i].misses);
  }
  CHECK(calls == 0);

  /* Destroyed through gma (retired first), and the handle value recycled:
   * the cached record must not serve the new stream. */
  CHECK_OK(gma_stream_destroy(g, s));
  gma_stream_t s2;
  CHECK_OK(gma_stream_create(g, &s2));
  printf("hotpath: the new stream %s the destroyed one's handle value\n",
         s2 == s ? "got" : "did not get");
  ids0 = fc_calls("cuStreamGetId");
  pair(g, small, s2); /* a cache miss: asks for the id, makes a new record */
  CHECK(fc_calls("cuStreamGetId") - ids0 >= 1);
  gma_stream_stats_t fresh = sstats(g, s2);
  CHECK(fresh.allocs == 1 && fresh.hits == 0 && fresh.misses == 1 && fresh.frees == 1);
  pair(g, small, s2); /* fills the cache for the new record */
  calls0 = fc_calls("*");
  for (int n = 0; n < 10; n++) pair(g, small, s2);
  CHECK(fc_calls("*") == calls0);
  fresh = sstats(g, s2);
  CHECK(fresh.allocs == 12 && fresh.hits == 11 && fresh.misses == 1);

  /* Retired but still alive (the same stream, the same handle): forgotten,
   * so the next allocation looks it up again and starts a new record. */
  CHECK_OK(gma_stream_retire(g, s2));
  ids0 = fc_calls("cuStreamGetId");
  pair(g, small, s2);
  CHECK(fc_calls("cuStreamGetId") - ids0 >= 1);
  fresh = sstats(g, s2);
  CHECK(fresh.allocs == 1 && fresh.hits == 0 && fresh.misses == 1);
  pair(g, small, s2);
  calls0 = fc_calls("*");
  pair(g, small, s2);
  CHECK(fc_calls("*") == calls0);

  /* The per-thread stream retired from its own thread: the same. */
  CHECK_OK(gma_stream_retire(g, GMA_STREAM_PER_THREAD));
  ids0 = fc_calls("cuStreamGetId");
  pair(g, small, GMA_STREAM_PER_THREAD);
  CHECK(fc_calls("cuStreamGetId") - ids0 >= 1);
  fresh = sstats(g, GMA_STREAM_PER_THREAD);
  CHECK(fresh.allocs == 1 && fresh.hits == 0 && fresh.misses == 1);

  CHECK_OK(gma_stream_destroy(g, s2));
  CHECK_OK(gma_destroy(g));
  CHECK(fc_used(0) == 0);
}

/* The default segments follow the device: growable where it reports
 * virtual memory management, ordinary where it does not
 * (GMA_FAKECUDA_VMM_FEATURES=off), and there expandable_segments:true is
 * refused at gma_create, saying what to use instead. */
static void scenario_segments(void) {
  const char *features = getenv("GMA_FAKECUDA_VMM_FEATURES");
  bool vmm = !(features && strcmp(features, "off") == 0);
  gma_t *g = bound_allocator("worker:off");
  void *p;
  CHECK_OK(gma_alloc(g, 3 * MiB, NULL, &p));
  gma_stats_t st = stats_of(g);
  CHECK((st.address_ranges != 0) == vmm);
  CHECK((fc_calls("cuMemCreate") > 0) == vmm && (fc_calls("cuMemAlloc") > 0) == !vmm);
  CHECK_OK(gma_free(g, p));
  CHECK_OK(gma_destroy(g));
  gma_config_t c = cuda_config("expandable_segments:true");
  g = NULL;
  gma_status_t s = gma_create(&c, &g);
  if (vmm) {
    CHECK_OK(s);
    CHECK_OK(gma_destroy(g));
  } else {
    CHECK(s == GMA_ERR_UNSUPPORTED && g == NULL);
    CHECK(has("virtual memory management") && has("expandable_segments:false"));
  }
  printf("segments: %s by default\n", vmm ? "growable" : "ordinary");
}

int main(int argc, char **argv) {
  const char *scenario = argc > 1 ? argv[1] : "";
  controls();
  if (strcmp(scenario, "errors") == 0) {
    scenario_errors();
  } else if (strcmp(scenario, "events") == 0) {
    scenario_events();
  } else if (strcmp(scenario, "growable") == 0) {
    scenario_growable();
    growable_kept_chunks();
  } else if (strcmp(scenario, "reuse") == 0) {
    scenario_reuse();
  } else if (strcmp(scenario, "retired") == 0) {
    scenario_retired();
  } else if (strcmp(scenario, "devices") == 0) {
    scenario_devices();
  } else if (strcmp(scenario, "context") == 0) {
    scenario_context();
  } else if (strcmp(scenario, "hotpath") == 0) {
    scenario_hotpath();
  } else if (strcmp(scenario, "waitstream") == 0) {
    scenario_waitstream();
  } else if (strcmp(scenario, "contexts") == 0) {
    scenario_contexts();
  } else if (strcmp(scenario, "outside") == 0) {
    scenario_outside();
  } else if (strcmp(scenario, "segments") == 0) {
    scenario_segments();
  } else {
    fprintf(stderr, "usage: %s errors|events|growable|reuse|retired|devices|context|hotpath|"
            "waitstream|contexts|outside|segments\n",
            argv[0]);
    return 2;
  }
  printf("fakecuda backend %s: ok\n", scenario);
  return 0;
}
