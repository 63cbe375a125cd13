/* gma-driver-probe: what each CUDA driver call that gma (or a peer
 * allocator) makes costs on this GPU, and which calls wait for the device.
 * Its figures calibrate the simulated device's cost model (docs/gpu/).
 *
 * Pure driver API: libcuda is loaded as gma loads it (dlopen of
 * $GMA_CUDA_DRIVER, else libcuda.so.1, then cuGetProcAddress), and the one
 * kernel it needs (a spin on the global timer) is PTX text JIT-compiled by
 * the driver, so nothing here needs nvcc or the runtime.
 *
 * Groups (each row: calls timed one at a time, p50/p99/max in ns):
 *   calls     the cheap calls of an allocation's slow path (capture state,
 *             stream id, current context, event record/query, stream wait)
 *   events    how soon an event recorded on an idle or just-launched stream
 *             is seen complete
 *   malloc    cuMemAlloc / cuMemFree by size, and while the device fills
 *   waits     whether a call waits for another stream's work: the call
 *             made while an unrelated stream runs a 20 ms kernel; "waits"
 *             when it took more than half of the kernel's remaining time
 *   vmm       cuMemCreate / AddressReserve / Map / SetAccess / Unmap /
 *             Release by size, and remapping a chunk at another address
 *   pool      cuMemAllocAsync / cuMemFreeAsync on the default pool
 *   host      pinned host memory: alloc/free by size, copy bandwidth
 *   threads   one thread against four making the same calls (driver lock)
 *   ipc       export costs (legacy IPC handle, POSIX file descriptor)
 *   legacy    whether an event on the legacy stream waits for a blocking
 *             stream's kernel
 *
 * Usage: gma-driver-probe [--json PATH] [--limit S] [--groups LIST] [--quick]
 * (--groups: some of the groups above, comma-separated; --quick: fewer samples)
 * A watchdog ends the run after --limit seconds (default 150), writing what
 * was measured. Exit 0 measured, 77 no GPU, 1 a setup failure. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KiB (1024ull)
#define MiB (1024ull * KiB)
#define GiB (1024ull * MiB)
#define EXIT_SKIP 77

/* ---- the driver ----------------------------------------------------------------- */

typedef CUresult (*capture_info_v2_t)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                      const CUgraphNode **, size_t *);
static struct {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int *);
  CUresult (*cuGetErrorName)(CUresult, const char **);
  CUresult (*cuDeviceGet)(CUdevice *, int);
  CUresult (*cuDeviceGetName)(char *, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
  CUresult (*cuDeviceTotalMem)(size_t *, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetCurrent)(CUcontext *);
  CUresult (*cuCtxSynchronize)(void);
  CUresult (*cuStreamCreate)(CUstream *, unsigned);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamQuery)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuStreamGetId)(CUstream, unsigned long long *);
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned);
  CUresult (*cuStreamWriteValue64)(CUstream, CUdeviceptr, cuuint64_t, unsigned);
  CUresult (*cuEventCreate)(CUevent *, unsigned);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemGetInfo)(size_t *, size_t *);
  CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
  CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
  CUresult (*cuDeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
  CUresult (*cuMemPoolSetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
  CUresult (*cuMemPoolTrimTo)(CUmemoryPool, size_t);
  CUresult (*cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *,
                                            CUmemAllocationGranularity_flags);
  CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                          unsigned long long);
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
  CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long);
  CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
  CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*cuMemExportToShareableHandle)(void *, CUmemGenericAllocationHandle,
                                           CUmemAllocationHandleType, unsigned long long);
  CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *,
                                             CUmemAllocationHandleType);
  CUresult (*cuIpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
  CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
  CUresult (*cuMemFreeHost)(void *);
  CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned);
  CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*cuModuleLoadData)(CUmodule *, const void *);
  CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void **, void **);
  capture_info_v2_t cuStreamGetCaptureInfo;
  CUresult (*cuStreamBeginCapture)(CUstream, CUstreamCaptureMode);
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph *);
  CUresult (*cuGraphDestroy)(CUgraph);
} cu;

static const char *err_name(CUresult r) {
  const char *n = NULL;
  if (cu.cuGetErrorName) cu.cuGetErrorName(r, &n);
  return n ? n : "?";
}

typedef CUresult (*get_proc_t)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);

/* Loads every entry point; optional ones stay NULL (their rows say so). */
static int load_driver(char *why, size_t len) {
  const char *path = getenv("GMA_CUDA_DRIVER");
  if (!path || !*path) path = "libcuda.so.1";
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(why, len, "dlopen(%s): %s", path, dlerror());
    return -1;
  }
  get_proc_t gp = (get_proc_t)dlsym(h, "cuGetProcAddress_v2");
  if (!gp) {
    snprintf(why, len, "%s has no cuGetProcAddress_v2", path);
    return -1;
  }
  struct {
    const char *name;
    void **slot;
    int required;
  } e[] = {
#define R(n) {#n, (void **)&cu.n, 1},
#define O(n) {#n, (void **)&cu.n, 0},
      R(cuInit) R(cuDriverGetVersion) R(cuGetErrorName) R(cuDeviceGet) R(cuDeviceGetName)
      R(cuDeviceGetAttribute) R(cuDeviceTotalMem) R(cuDevicePrimaryCtxRetain) R(cuCtxSetCurrent)
      R(cuCtxGetCurrent) R(cuCtxSynchronize) R(cuStreamCreate) R(cuStreamDestroy)
      R(cuStreamQuery) R(cuStreamSynchronize) R(cuStreamGetId) R(cuStreamWaitEvent)
      O(cuStreamWriteValue64) R(cuEventCreate) R(cuEventDestroy) R(cuEventRecord)
      R(cuEventQuery) R(cuEventSynchronize) R(cuMemAlloc) R(cuMemFree) R(cuMemGetInfo)
      O(cuMemAllocAsync) O(cuMemFreeAsync) O(cuDeviceGetDefaultMemPool) O(cuMemPoolSetAttribute)
      O(cuMemPoolTrimTo) R(cuMemGetAllocationGranularity) R(cuMemAddressReserve)
      R(cuMemAddressFree) R(cuMemCreate) R(cuMemRelease) R(cuMemMap) R(cuMemUnmap)
      R(cuMemSetAccess) O(cuMemExportToShareableHandle) O(cuMemImportFromShareableHandle)
      O(cuIpcGetMemHandle) R(cuMemHostAlloc) R(cuMemFreeHost) R(cuMemHostGetDevicePointer)
      R(cuMemcpyDtoHAsync) R(cuMemcpyHtoDAsync) O(cuModuleLoadData) O(cuModuleGetFunction)
      O(cuLaunchKernel) R(cuStreamGetCaptureInfo) O(cuStreamBeginCapture)
      O(cuStreamEndCapture) O(cuGraphDestroy)
#undef R
#undef O
  };
  for (size_t i = 0; i < sizeof e / sizeof e[0]; i++) {
    void *fn = NULL;
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult r = gp(e[i].name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q);
    if (r == CUDA_SUCCESS && fn && q == CU_GET_PROC_ADDRESS_SUCCESS) {
      *e[i].slot = fn;
    } else if (e[i].required) {
      snprintf(why, len, "%s lacks %s (error %d)", path, e[i].name, (int)r);
      return -1;
    }
  }
  return 0;
}

/* ---- results ---------------------------------------------------------------------- */

enum { MAX_ROWS = 256, NOTE_LEN = 200 };
typedef struct row {
  char group[16], name[64];
  uint64_t size; /* bytes the call concerns (0: none) */
  int n;         /* samples */
  double p50, p99, max; /* ns */
  char note[NOTE_LEN];
} row_t;

static row_t rows[MAX_ROWS];
static int nrows;
static pthread_mutex_t rows_mu = PTHREAD_MUTEX_INITIALIZER;
static const char *json_path = "driver_probe.json";
static char device_name[128];
static int driver_version;
static size_t device_total, granularity_min, granularity_rec;
static const char *current_group = "setup";

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double rank(const double *v, int n, double q) {
  int i = (int)(q * n + 0.999999) - 1;
  if (i < 0) i = 0;
  if (i >= n) i = n - 1;
  return v[i];
}

static void add_row(const char *name, uint64_t size, double *v, int n, const char *fmt, ...) {
  pthread_mutex_lock(&rows_mu);
  if (nrows < MAX_ROWS) {
    row_t *r = &rows[nrows++];
    memset(r, 0, sizeof *r);
    snprintf(r->group, sizeof r->group, "%s", current_group);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->size = size;
    r->n = n;
    if (n > 0) {
      qsort(v, (size_t)n, sizeof *v, cmp_d);
      r->p50 = rank(v, n, 0.5);
      r->p99 = rank(v, n, 0.99);
      r->max = v[n - 1];
    }
    if (fmt) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(r->note, sizeof r->note, fmt, ap);
      va_end(ap);
    }
    printf("%-8s %-40s %9.1f MiB %6d %12.0f %12.0f %12.0f  %s\n", r->group, r->name,
           (double)size / MiB, n, r->p50, r->p99, r->max, r->note);
    fflush(stdout);
  }
  pthread_mutex_unlock(&rows_mu);
}

/* Replaces the note of the row added last. */
static void note_last(const char *fmt, ...) {
  pthread_mutex_lock(&rows_mu);
  if (nrows > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rows[nrows - 1].note, NOTE_LEN, fmt, ap);
    va_end(ap);
    printf("%8s %s\n", "", rows[nrows - 1].note);
  }
  pthread_mutex_unlock(&rows_mu);
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if ((unsigned char)*s < 0x20) continue;
    fputc(*s, f);
  }
  fputc('"', f);
}

static void write_json(const char *status) {
  pthread_mutex_lock(&rows_mu);
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", json_path);
  FILE *f = fopen(tmp, "w");
  if (f) {
    fprintf(f, "{\n  \"tool\": \"gma-driver-probe\", \"status\": ");
    json_str(f, status);
    fprintf(f, ", \"device\": ");
    json_str(f, device_name);
    fprintf(f, ", \"driver_version\": %d, \"device_total_bytes\": %zu,\n", driver_version,
            device_total);
    fprintf(f, "  \"granularity_min\": %zu, \"granularity_recommended\": %zu, \"unit\": \"ns\",\n",
            granularity_min, granularity_rec);
    fprintf(f, "  \"rows\": [\n");
    for (int i = 0; i < nrows; i++) {
      row_t *r = &rows[i];
      fprintf(f, "    {\"group\": ");
      json_str(f, r->group);
      fprintf(f, ", \"name\": ");
      json_str(f, r->name);
      fprintf(f, ", \"size\": %" PRIu64 ", \"n\": %d, \"p50\": %.0f, \"p99\": %.0f, \"max\": %.0f, "
                 "\"note\": ",
              r->size, r->n, r->p50, r->p99, r->max);
      json_str(f, r->note);
      fprintf(f, "}%s\n", i + 1 < nrows ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    fclose(f);
    rename(tmp, json_path);
  }
  pthread_mutex_unlock(&rows_mu);
}

static int limit_s = 150;
static void *watchdog(void *arg) {
  (void)arg;
  sleep((unsigned)limit_s);
  fprintf(stderr, "gma-driver-probe: stopped after %d s in group '%s'; writing what was measured\n",
          limit_s, current_group);
  write_json("stopped by the watchdog");
  _exit(3);
}

/* ---- setup ------------------------------------------------------------------------- */

static CUdevice dev;
static CUcontext ctx;
static CUstream s1, s2, sblock; /* two non-blocking streams, one blocking */
static CUevent ev;                 /* the probes' event */
static CUfunction spin_fn;      /* NULL: no kernel (the rows that need it say so) */
static int quick;

/* A failed call in a group ends that group (a row says which call failed)
 * and the probe goes on with the next; during setup it ends the run. */
static jmp_buf group_jmp;
static int in_group;

static void call_failed(const char *what, CUresult r) {
  fprintf(stderr, "gma-driver-probe: %s failed: %s (%d)\n", what, err_name(r), (int)r);
  if (in_group) {
    char name[64];
    snprintf(name, sizeof name, "%.63s", what);
    add_row(name, 0, NULL, 0, "failed: %s; the rest of the group was skipped", err_name(r));
    longjmp(group_jmp, 1);
  }
  write_json("failed");
  exit(1);
}

#define CK(call)                                    \
  do {                                              \
    CUresult r_ = (call);                           \
    if (r_ != CUDA_SUCCESS) call_failed(#call, r_); \
  } while (0)

/* A kernel that spins until the global timer has advanced by its argument
 * (ns): real device work of a chosen length, on any architecture. */
static const char spin_ptx[] =
    ".version 7.0\n"
    ".target sm_75\n"
    ".address_size 64\n"
    ".visible .entry spin(.param .u64 ns)\n"
    "{\n"
    "  .reg .pred p;\n"
    "  .reg .u64 n, t0, t, d;\n"
    "  ld.param.u64 n, [ns];\n"
    "  mov.u64 t0, %globaltimer;\n"
    "LOOP:\n"
    "  mov.u64 t, %globaltimer;\n"
    "  sub.u64 d, t, t0;\n"
    "  setp.lt.u64 p, d, n;\n"
    "  @p bra LOOP;\n"
    "  ret;\n"
    "}\n";

static char spin_why[160];

static void setup(void) {
  CK(cu.cuInit(0));
  CK(cu.cuDriverGetVersion(&driver_version));
  CK(cu.cuDeviceGet(&dev, 0));
  CK(cu.cuDeviceGetName(device_name, sizeof device_name, dev));
  CK(cu.cuDeviceTotalMem(&device_total, dev));
  CK(cu.cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cu.cuCtxSetCurrent(ctx));
  CK(cu.cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  CK(cu.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  CK(cu.cuStreamCreate(&sblock, CU_STREAM_DEFAULT));
  CK(cu.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  CK(cu.cuMemGetAllocationGranularity(&granularity_min, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CK(cu.cuMemGetAllocationGranularity(&granularity_rec, &prop,
                                      CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  CUmodule mod;
  CUresult r = CUDA_ERROR_NOT_SUPPORTED;
  if (cu.cuModuleLoadData && cu.cuModuleGetFunction && cu.cuLaunchKernel) {
    r = cu.cuModuleLoadData(&mod, spin_ptx);
    if (r == CUDA_SUCCESS) r = cu.cuModuleGetFunction(&spin_fn, mod, "spin");
  }
  if (r != CUDA_SUCCESS) {
    spin_fn = NULL;
    snprintf(spin_why, sizeof spin_why, "no spin kernel (%s)", err_name(r));
  }
  printf("gma-driver-probe: %s, driver %d, %.1f GiB, granularity %zu / %zu (min / recommended)%s%s\n",
         device_name, driver_version, (double)device_total / GiB, granularity_min,
         granularity_rec, spin_fn ? "" : "; ", spin_fn ? "" : spin_why);
  printf("%-8s %-40s %13s %6s %12s %12s %12s  %s\n", "group", "call", "size", "n", "p50 ns",
         "p99 ns", "max ns", "note");
}

static CUresult spin(CUstream s, uint64_t ns) {
  unsigned long long arg = ns;
  void *args[] = {&arg};
  return cu.cuLaunchKernel(spin_fn, 1, 1, 1, 1, 1, 1, 0, s, args, NULL);
}

/* ---- groups ------------------------------------------------------------------------ */

/* Times `call` n times into v (ns each); its first failure ends the loop. */
#define TIME_N(v, n, call, failed)         \
  do {                                     \
    failed = CUDA_SUCCESS;                 \
    for (int i_ = 0; i_ < (n); i_++) {     \
      uint64_t t0_ = now_ns();             \
      CUresult r_ = (call);                \
      (v)[i_] = (double)(now_ns() - t0_);  \
      if (r_ != CUDA_SUCCESS) {            \
        failed = r_;                       \
        break;                             \
      }                                    \
    }                                      \
  } while (0)

static void timed_row(const char *name, int n, CUresult (*fn)(void)) {
  double *v = calloc((size_t)n, sizeof *v);
  CUresult failed;
  TIME_N(v, n, fn(), failed);
  if (failed != CUDA_SUCCESS)
    add_row(name, 0, NULL, 0, "failed: %s", err_name(failed));
  else
    add_row(name, 0, v, n, NULL);
  free(v);
}

static CUresult c_capture(void) {
  CUstreamCaptureStatus st;
  cuuint64_t id;
  return cu.cuStreamGetCaptureInfo(s1, &st, &id, NULL, NULL, NULL);
}
static CUresult c_stream_id(void) {
  unsigned long long id;
  return cu.cuStreamGetId(s1, &id);
}
static CUresult c_ctx(void) {
  CUcontext c;
  return cu.cuCtxGetCurrent(&c);
}
static CUresult c_query(void) { return cu.cuStreamQuery(s1); }
static CUresult c_meminfo(void) {
  size_t f, t;
  return cu.cuMemGetInfo(&f, &t);
}
static CUresult c_record(void) { return cu.cuEventRecord(ev, s1); }
static CUresult c_evquery(void) { return cu.cuEventQuery(ev); }
static CUresult c_wait(void) { return cu.cuStreamWaitEvent(s2, ev, 0); }
static CUresult c_evpair(void) {
  CUevent e;
  CUresult r = cu.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
  return r ? r : cu.cuEventDestroy(e);
}
static CUdeviceptr counter_dev;
static uint64_t counter_val;
static CUresult c_write64(void) {
  return cu.cuStreamWriteValue64(s1, counter_dev, ++counter_val, 0);
}
static CUresult c_launch(void) { return spin(s1, 0); }

/* What gma's epoch marks do while a stream it does not write to captures:
 * one write on s1 while s2 captures in GLOBAL mode on this thread. Whether
 * the write is allowed, whether the capture stays valid, and whether the
 * word gets the value. */
static void write_beside_capture(void *host) {
  if (!cu.cuStreamBeginCapture || !cu.cuStreamEndCapture || !cu.cuGraphDestroy) {
    add_row("cuStreamWriteValue64 beside a capture", 0, NULL, 0, "no capture entry points");
    return;
  }
  CK(cu.cuStreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUresult w = cu.cuStreamWriteValue64(s1, counter_dev, ++counter_val, 0);
  CUgraph graph = NULL;
  CUresult e = cu.cuStreamEndCapture(s2, &graph);
  if (graph) cu.cuGraphDestroy(graph);
  CK(cu.cuCtxSynchronize());
  add_row("cuStreamWriteValue64 beside a capture", 0, NULL, 0,
          "write %s, capture %s, value %s (GLOBAL mode, same thread)", err_name(w),
          e == CUDA_SUCCESS ? "valid" : err_name(e),
          *(volatile uint64_t *)host == counter_val ? "landed" : "missing");
}

static void group_calls(void) {
  current_group = "calls";
  int n = quick ? 300 : 3000;
  timed_row("cuStreamGetCaptureInfo", n, c_capture);
  timed_row("cuStreamGetId", n, c_stream_id);
  timed_row("cuCtxGetCurrent", n, c_ctx);
  timed_row("cuStreamQuery (idle)", n, c_query);
  timed_row("cuMemGetInfo", n, c_meminfo);
  timed_row("cuEventRecord (idle stream)", n, c_record);
  timed_row("cuEventQuery", n, c_evquery);
  timed_row("cuStreamWaitEvent", n, c_wait);
  timed_row("cuEventCreate+cuEventDestroy", n, c_evpair);
  CK(cu.cuCtxSynchronize());
  int memops = -1;
  if (cu.cuDeviceGetAttribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev) !=
      CUDA_SUCCESS)
    memops = -1;
  add_row("64-bit stream memory operations", 0, NULL, 0, "device attribute %d (gma's epoch marks)",
          memops);
  void *host = NULL;
  if (cu.cuStreamWriteValue64 &&
      cu.cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP) ==
          CUDA_SUCCESS &&
      cu.cuMemHostGetDevicePointer(&counter_dev, host, 0) == CUDA_SUCCESS) {
    timed_row("cuStreamWriteValue64 (pinned counter)", n, c_write64);
    CK(cu.cuCtxSynchronize());
    add_row("counter read after sync", 0, NULL, 0, "value %" PRIu64 " of %" PRIu64 " written",
            *(volatile uint64_t *)host, counter_val);
    write_beside_capture(host);
  } else {
    add_row("cuStreamWriteValue64 (pinned counter)", 0, NULL, 0, "not available");
  }
  if (host) cu.cuMemFreeHost(host);
  if (spin_fn) {
    timed_row("cuLaunchKernel (empty spin)", n, c_launch);
    CK(cu.cuCtxSynchronize());
  }
}

/* Record, then poll until the host sees the event complete. */
static void event_latency(const char *name, uint64_t kernel_ns, int n) {
  double *v = calloc((size_t)n, sizeof *v);
  int at_once = 0;
  for (int i = 0; i < n; i++) {
    if (kernel_ns != UINT64_MAX && spin_fn) CK(spin(s1, kernel_ns));
    uint64_t t0 = now_ns();
    CK(cu.cuEventRecord(ev, s1));
    CUresult r = cu.cuEventQuery(ev);
    if (r == CUDA_SUCCESS) at_once++;
    while (r == CUDA_ERROR_NOT_READY) r = cu.cuEventQuery(ev);
    CK(r);
    v[i] = (double)(now_ns() - t0);
  }
  add_row(name, 0, v, n, "%.1f%% complete at the first query after record", 100.0 * at_once / n);
  free(v);
  CK(cu.cuCtxSynchronize());
}

static void group_events(void) {
  current_group = "events";
  int n = quick ? 200 : 2000;
  event_latency("record on idle stream -> complete", UINT64_MAX, n);
  if (!spin_fn) {
    add_row("record after a kernel -> complete", 0, NULL, 0, "%s", spin_why);
    return;
  }
  event_latency("record after empty kernel -> complete", 0, n);
  event_latency("record after 20 us kernel -> complete", 20000, n / 4);
}

static void alloc_free_sizes(void) {
  static const uint64_t sizes[] = {2 * MiB, 8 * MiB, 32 * MiB, 128 * MiB, 512 * MiB, 2 * GiB,
                                   8 * GiB};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    int n = sizes[k] >= 2 * GiB ? 5 : 20;
    if (quick) n = 3;
    double va[20], vf[20];
    CUresult failed = CUDA_SUCCESS;
    for (int i = 0; i < n && !failed; i++) {
      CUdeviceptr d;
      uint64_t t0 = now_ns();
      failed = cu.cuMemAlloc(&d, sizes[k]);
      va[i] = (double)(now_ns() - t0);
      if (failed) break;
      t0 = now_ns();
      failed = cu.cuMemFree(d);
      vf[i] = (double)(now_ns() - t0);
    }
    if (failed) {
      add_row("cuMemAlloc", sizes[k], NULL, 0, "failed: %s", err_name(failed));
      continue;
    }
    add_row("cuMemAlloc", sizes[k], va, n, NULL);
    add_row("cuMemFree (idle device)", sizes[k], vf, n, NULL);
  }
}

/* Filling the device: 64 blocks of 1/100 of the free memory, then freed. */
static void alloc_while_filling(void) {
  size_t fr = 0, tot = 0;
  CK(cu.cuMemGetInfo(&fr, &tot));
  uint64_t sz = (fr / 100) / (2 * MiB) * (2 * MiB);
  enum { N = 64 };
  CUdeviceptr d[N];
  double va[N], vf[N];
  int got = 0;
  for (; got < N; got++) {
    uint64_t t0 = now_ns();
    CUresult r = cu.cuMemAlloc(&d[got], sz);
    va[got] = (double)(now_ns() - t0);
    if (r) break;
  }
  for (int i = 0; i < got; i++) {
    uint64_t t0 = now_ns();
    cu.cuMemFree(d[i]);
    vf[i] = (double)(now_ns() - t0);
  }
  add_row("cuMemAlloc while filling to 64%", sz, va, got, "free at start %.1f GiB", (double)fr / GiB);
  add_row("cuMemFree after filling", sz, vf, got, NULL);
}

static void group_malloc(void) {
  current_group = "malloc";
  alloc_free_sizes();
  alloc_while_filling();
}

/* ---- waits: does a call wait for another stream's kernel? ---------------------- */

typedef CUresult (*wait_call_t)(void *state);
enum { WAIT_KERNEL_NS = 20000000 };

/* Per try: prep (untimed), a 20 ms kernel on s2 and 2 ms for it to start,
 * call (timed), then a device synchronize and tidy (untimed). */
static void wait_row(const char *name, uint64_t size, wait_call_t prep, wait_call_t call,
                     wait_call_t tidy, void *state) {
  if (!spin_fn) {
    add_row(name, size, NULL, 0, "%s", spin_why);
    return;
  }
  int n = quick ? 1 : 3;
  double v[3];
  int waited = 0;
  for (int i = 0; i < n; i++) {
    if (prep && prep(state) != CUDA_SUCCESS) {
      add_row(name, size, NULL, 0, "setup failed");
      return;
    }
    CK(cu.cuCtxSynchronize());
    CK(spin(s2, WAIT_KERNEL_NS));
    usleep(2000); /* the kernel is running: about 18 ms of it are left */
    uint64_t t0 = now_ns();
    CUresult r = call(state);
    v[i] = (double)(now_ns() - t0);
    CK(cu.cuCtxSynchronize());
    if (r != CUDA_SUCCESS) {
      add_row(name, size, NULL, 0, "failed: %s", err_name(r));
      return;
    }
    if (tidy) tidy(state);
    if (v[i] > WAIT_KERNEL_NS / 4) waited++;
  }
  add_row(name, size, v, n, "%s (%d of %d calls took > 5 ms beside a 20 ms kernel)",
          waited == n ? "waits for the device" : waited ? "sometimes waits" : "does not wait",
          waited, n);
}

typedef struct wstate {
  uint64_t size;
  CUdeviceptr d, va;
  CUmemGenericAllocationHandle h;
  void *host;
  CUevent e;
} wstate_t;

static CUmemAllocationProp chunk_prop(void) {
  CUmemAllocationProp p = {0};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  return p;
}
static CUmemAccessDesc rw_access(void) {
  CUmemAccessDesc a = {0};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = dev;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}

static CUresult w_alloc(void *s) { return cu.cuMemAlloc(&((wstate_t *)s)->d, ((wstate_t *)s)->size); }
static CUresult w_free(void *s) { return cu.cuMemFree(((wstate_t *)s)->d); }
static CUresult w_create(void *sv) {
  wstate_t *s = sv;
  CUmemAllocationProp p = chunk_prop();
  return cu.cuMemCreate(&s->h, s->size, &p, 0);
}
static CUresult w_release(void *sv) { return cu.cuMemRelease(((wstate_t *)sv)->h); }
static CUresult w_reserve(void *sv) {
  wstate_t *s = sv;
  return cu.cuMemAddressReserve(&s->va, s->size, 0, 0, 0);
}
static CUresult w_create_reserve(void *sv) {
  CUresult r = w_create(sv);
  return r ? r : w_reserve(sv);
}
static CUresult w_map_access(void *sv) {
  wstate_t *s = sv;
  CUmemAccessDesc a = rw_access();
  CUresult r = cu.cuMemMap(s->va, s->size, 0, s->h, 0);
  return r ? r : cu.cuMemSetAccess(s->va, s->size, &a, 1);
}
static CUresult w_prep_mapped(void *sv) {
  CUresult r = w_create_reserve(sv);
  return r ? r : w_map_access(sv);
}
static CUresult w_unmap(void *sv) {
  wstate_t *s = sv;
  return cu.cuMemUnmap(s->va, s->size);
}
static CUresult w_tidy_unmapped(void *sv) { /* after an unmap: the handle and the range */
  wstate_t *s = sv;
  cu.cuMemRelease(s->h);
  return cu.cuMemAddressFree(s->va, s->size);
}
static CUresult w_tidy_mapped(void *sv) {
  w_unmap(sv);
  return w_tidy_unmapped(sv);
}
static CUresult w_tidy_released(void *sv) { /* the handle was released while mapped */
  wstate_t *s = sv;
  cu.cuMemUnmap(s->va, s->size);
  return cu.cuMemAddressFree(s->va, s->size);
}
static CUresult w_host_alloc(void *sv) {
  wstate_t *s = sv;
  return cu.cuMemHostAlloc(&s->host, s->size, CU_MEMHOSTALLOC_PORTABLE);
}
static CUresult w_host_free(void *sv) { return cu.cuMemFreeHost(((wstate_t *)sv)->host); }
static CUresult w_ev_create(void *sv) {
  return cu.cuEventCreate(&((wstate_t *)sv)->e, CU_EVENT_DISABLE_TIMING);
}
static CUresult w_ev_destroy(void *sv) { return cu.cuEventDestroy(((wstate_t *)sv)->e); }
static CUresult w_alloc_async(void *sv) {
  wstate_t *s = sv;
  CUresult r = cu.cuMemAllocAsync(&s->d, s->size, s1);
  return r ? r : cu.cuStreamSynchronize(s1);
}
static CUresult w_free_async(void *sv) { return cu.cuMemFreeAsync(((wstate_t *)sv)->d, s1); }

static void group_waits(void) {
  current_group = "waits";
  wstate_t s = {.size = 64 * MiB};
  wait_row("cuMemAlloc beside a busy stream", s.size, NULL, w_alloc, w_free, &s);
  wait_row("cuMemFree beside a busy stream", s.size, w_alloc, w_free, NULL, &s);
  wait_row("cuMemCreate beside a busy stream", s.size, NULL, w_create, w_release, &s);
  wait_row("cuMemMap+SetAccess beside a busy stream", s.size, w_create_reserve, w_map_access,
           w_tidy_mapped, &s);
  wait_row("cuMemUnmap beside a busy stream", s.size, w_prep_mapped, w_unmap, w_tidy_unmapped,
           &s);
  wait_row("cuMemRelease (mapped) beside a busy stream", s.size, w_prep_mapped, w_release,
           w_tidy_released, &s);
  wait_row("cuMemHostAlloc beside a busy stream", s.size, NULL, w_host_alloc, w_host_free, &s);
  wait_row("cuMemFreeHost beside a busy stream", s.size, w_host_alloc, w_host_free, NULL, &s);
  wait_row("cuEventDestroy beside a busy stream", 0, w_ev_create, w_ev_destroy, NULL, &s);
  if (cu.cuMemAllocAsync && cu.cuMemFreeAsync)
    wait_row("cuMemFreeAsync beside a busy stream", s.size, w_alloc_async, w_free_async, NULL,
             &s);
}

/* ---- vmm ---------------------------------------------------------------------------- */

static void vmm_sizes(void) {
  static const uint64_t sizes[] = {2 * MiB, 32 * MiB, 512 * MiB, 2 * GiB};
  CUmemAllocationProp p = chunk_prop();
  CUmemAccessDesc a = rw_access();
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    uint64_t sz = sizes[k];
    int n = sz >= 2 * GiB ? 5 : 20;
    if (quick) n = 3;
    double vc[20], vr[20], vm[20], va[20], vu[20], vl[20], vf[20];
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; i < n && !r; i++) {
      CUmemGenericAllocationHandle h;
      CUdeviceptr va_ = 0;
      uint64_t t0 = now_ns();
      r = cu.cuMemCreate(&h, sz, &p, 0);
      vc[i] = (double)(now_ns() - t0);
      if (r) break;
      t0 = now_ns();
      r = cu.cuMemAddressReserve(&va_, sz, 0, 0, 0);
      vr[i] = (double)(now_ns() - t0);
      t0 = now_ns();
      if (!r) r = cu.cuMemMap(va_, sz, 0, h, 0);
      vm[i] = (double)(now_ns() - t0);
      t0 = now_ns();
      if (!r) r = cu.cuMemSetAccess(va_, sz, &a, 1);
      va[i] = (double)(now_ns() - t0);
      t0 = now_ns();
      if (!r) r = cu.cuMemUnmap(va_, sz);
      vu[i] = (double)(now_ns() - t0);
      t0 = now_ns();
      cu.cuMemRelease(h);
      vl[i] = (double)(now_ns() - t0);
      t0 = now_ns();
      if (va_) cu.cuMemAddressFree(va_, sz);
      vf[i] = (double)(now_ns() - t0);
    }
    if (r) {
      add_row("vmm sequence", sz, NULL, 0, "failed: %s", err_name(r));
      continue;
    }
    add_row("cuMemCreate", sz, vc, n, NULL);
    note_last("%.1f us per 2 MiB at p50", rows[nrows - 1].p50 / 1000.0 / (double)(sz / (2 * MiB)));
    add_row("cuMemAddressReserve", sz, vr, n, NULL);
    add_row("cuMemMap", sz, vm, n, NULL);
    add_row("cuMemSetAccess", sz, va, n, NULL);
    add_row("cuMemUnmap (idle device)", sz, vu, n, NULL);
    add_row("cuMemRelease", sz, vl, n, NULL);
    add_row("cuMemAddressFree", sz, vf, n, NULL);
  }
}

/* 16 separately created 2 MiB chunks mapped side by side: access set per
 * chunk against once for the range; then one chunk moved to another address
 * (unmap, map elsewhere, access): what reusing a physical handle costs. */
static void vmm_chunks(void) {
  enum { N = 16 };
  uint64_t g = 2 * MiB;
  CUmemAllocationProp p = chunk_prop();
  CUmemAccessDesc a = rw_access();
  CUmemGenericAllocationHandle h[N];
  CUdeviceptr base = 0, other = 0;
  CK(cu.cuMemAddressReserve(&base, N * g, 0, 0, 0));
  CK(cu.cuMemAddressReserve(&other, N * g, 0, 0, 0));
  double per[N], once[1], remap[N], reaccess[N];
  for (int i = 0; i < N; i++) CK(cu.cuMemCreate(&h[i], g, &p, 0));
  for (int i = 0; i < N; i++) CK(cu.cuMemMap(base + i * g, g, 0, h[i], 0));
  for (int i = 0; i < N; i++) {
    uint64_t t0 = now_ns();
    CK(cu.cuMemSetAccess(base + i * g, g, &a, 1));
    per[i] = (double)(now_ns() - t0);
  }
  uint64_t t0 = now_ns();
  CUresult once_r = cu.cuMemSetAccess(base, N * g, &a, 1); /* one call over 16 mappings */
  once[0] = (double)(now_ns() - t0);
  for (int i = 0; i < N; i++) {
    t0 = now_ns();
    CK(cu.cuMemUnmap(base + i * g, g));
    CK(cu.cuMemMap(other + i * g, g, 0, h[i], 0));
    remap[i] = (double)(now_ns() - t0);
    t0 = now_ns();
    CK(cu.cuMemSetAccess(other + i * g, g, &a, 1));
    reaccess[i] = (double)(now_ns() - t0);
  }
  add_row("cuMemSetAccess per 2 MiB chunk", g, per, N, NULL);
  if (once_r == CUDA_SUCCESS)
    add_row("cuMemSetAccess once over 16 chunks", N * g, once, 1, NULL);
  else
    add_row("cuMemSetAccess once over 16 chunks", N * g, NULL, 0, "refused: %s", err_name(once_r));
  add_row("remap a chunk (unmap + map elsewhere)", g, remap, N, NULL);
  add_row("cuMemSetAccess after remap", g, reaccess, N, NULL);
  for (int i = 0; i < N; i++) CK(cu.cuMemUnmap(other + i * g, g));
  for (int i = 0; i < N; i++) CK(cu.cuMemRelease(h[i]));
  CK(cu.cuMemAddressFree(base, N * g));
  CK(cu.cuMemAddressFree(other, N * g));
  /* Address space alone: how much does a large reservation cost? */
  static const uint64_t vas[] = {64 * GiB, 1024 * GiB};
  for (int k = 0; k < 2; k++) {
    double v[5];
    int n = 5, ok = 1;
    for (int i = 0; i < n && ok; i++) {
      CUdeviceptr d;
      t0 = now_ns();
      ok = cu.cuMemAddressReserve(&d, vas[k], 0, 0, 0) == CUDA_SUCCESS;
      v[i] = (double)(now_ns() - t0);
      if (ok) cu.cuMemAddressFree(d, vas[k]);
    }
    if (ok)
      add_row("cuMemAddressReserve (address space)", vas[k], v, n, NULL);
    else
      add_row("cuMemAddressReserve (address space)", vas[k], NULL, 0, "refused");
  }
}

static void group_vmm(void) {
  current_group = "vmm";
  vmm_sizes();
  vmm_chunks();
}

/* ---- pool, host, threads, ipc, legacy --------------------------------------------- */

static void group_pool(void) {
  current_group = "pool";
  if (!cu.cuMemAllocAsync || !cu.cuDeviceGetDefaultMemPool) {
    add_row("cuMemAllocAsync", 0, NULL, 0, "not available");
    return;
  }
  CUmemoryPool pool;
  CK(cu.cuDeviceGetDefaultMemPool(&pool, dev));
  cuuint64_t thr = UINT64_MAX;
  CK(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
  int n = quick ? 300 : 3000;
  double *va = calloc((size_t)n, sizeof *va), *vf = calloc((size_t)n, sizeof *vf);
  for (int i = 0; i < n; i++) {
    CUdeviceptr d;
    uint64_t t0 = now_ns();
    CK(cu.cuMemAllocAsync(&d, 2 * MiB, s1));
    va[i] = (double)(now_ns() - t0);
    t0 = now_ns();
    CK(cu.cuMemFreeAsync(d, s1));
    vf[i] = (double)(now_ns() - t0);
  }
  add_row("cuMemAllocAsync (cached)", 2 * MiB, va, n, NULL);
  add_row("cuMemFreeAsync", 2 * MiB, vf, n, NULL);
  CK(cu.cuStreamSynchronize(s1));
  /* Threshold 0: every synchronize gives the pool's memory back. */
  thr = 0;
  CK(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
  int m = quick ? 5 : 30;
  for (int i = 0; i < m; i++) {
    CUdeviceptr d;
    uint64_t t0 = now_ns();
    CK(cu.cuMemAllocAsync(&d, 64 * MiB, s1));
    va[i] = (double)(now_ns() - t0);
    CK(cu.cuMemFreeAsync(d, s1));
    t0 = now_ns();
    CK(cu.cuStreamSynchronize(s1));
    vf[i] = (double)(now_ns() - t0);
  }
  add_row("cuMemAllocAsync (threshold 0, after trim)", 64 * MiB, va, m, NULL);
  add_row("cuStreamSynchronize (pool gives back)", 64 * MiB, vf, m, NULL);
  CK(cu.cuMemPoolTrimTo(pool, 0));
  free(va);
  free(vf);
}

static void group_host(void) {
  current_group = "host";
  static const uint64_t sizes[] = {2 * MiB, 64 * MiB, 1 * GiB};
  for (int k = 0; k < 3; k++) {
    int n = sizes[k] >= GiB ? 3 : 10;
    double va[10], vf[10];
    for (int i = 0; i < n; i++) {
      void *h;
      uint64_t t0 = now_ns();
      CK(cu.cuMemHostAlloc(&h, sizes[k], CU_MEMHOSTALLOC_PORTABLE));
      va[i] = (double)(now_ns() - t0);
      t0 = now_ns();
      CK(cu.cuMemFreeHost(h));
      vf[i] = (double)(now_ns() - t0);
    }
    add_row("cuMemHostAlloc", sizes[k], va, n, NULL);
    add_row("cuMemFreeHost", sizes[k], vf, n, NULL);
  }
  uint64_t sz = quick ? 256 * MiB : 1 * GiB;
  void *h;
  CUdeviceptr d;
  CK(cu.cuMemHostAlloc(&h, sz, CU_MEMHOSTALLOC_PORTABLE));
  CK(cu.cuMemAlloc(&d, sz));
  memset(h, 1, sz);
  double vd[3], vu[3];
  for (int i = 0; i < 3; i++) {
    uint64_t t0 = now_ns();
    CK(cu.cuMemcpyDtoHAsync(h, d, sz, s1));
    CK(cu.cuStreamSynchronize(s1));
    vd[i] = (double)(now_ns() - t0);
    t0 = now_ns();
    CK(cu.cuMemcpyHtoDAsync(d, h, sz, s1));
    CK(cu.cuStreamSynchronize(s1));
    vu[i] = (double)(now_ns() - t0);
  }
  add_row("copy device -> pinned host", sz, vd, 3, NULL);
  note_last("%.1f GB/s at p50", (double)sz / rows[nrows - 1].p50);
  add_row("copy pinned host -> device", sz, vu, 3, NULL);
  note_last("%.1f GB/s at p50", (double)sz / rows[nrows - 1].p50);
  CK(cu.cuMemFree(d));
  CK(cu.cuMemFreeHost(h));
}

typedef struct tjob {
  int n, kind;
  CUstream s;
  CUevent e;
  uint64_t ns;
} tjob_t;

static void *tjob_main(void *arg) {
  tjob_t *j = arg;
  cu.cuCtxSetCurrent(ctx);
  uint64_t t0 = now_ns();
  for (int i = 0; i < j->n; i++) {
    if (j->kind == 0) {
      cu.cuEventRecord(j->e, j->s);
      cu.cuEventQuery(j->e);
    } else {
      CUdeviceptr d;
      if (cu.cuMemAlloc(&d, 2 * MiB) == CUDA_SUCCESS) cu.cuMemFree(d);
    }
  }
  j->ns = now_ns() - t0;
  return NULL;
}

/* Wall time per operation with 1 thread and with 4, each on its own stream. */
static void threads_row(const char *name, int kind, int n) {
  double per[2];
  int counts[2] = {1, 4};
  for (int c = 0; c < 2; c++) {
    tjob_t j[4];
    pthread_t t[4];
    uint64_t t0 = now_ns();
    for (int i = 0; i < counts[c]; i++) {
      j[i] = (tjob_t){.n = n, .kind = kind};
      CK(cu.cuStreamCreate(&j[i].s, CU_STREAM_NON_BLOCKING));
      CK(cu.cuEventCreate(&j[i].e, CU_EVENT_DISABLE_TIMING));
    }
    t0 = now_ns();
    for (int i = 0; i < counts[c]; i++) pthread_create(&t[i], NULL, tjob_main, &j[i]);
    for (int i = 0; i < counts[c]; i++) pthread_join(t[i], NULL);
    per[c] = (double)(now_ns() - t0) / ((double)n * counts[c]);
    for (int i = 0; i < counts[c]; i++) {
      cu.cuEventDestroy(j[i].e);
      cu.cuStreamDestroy(j[i].s);
    }
  }
  double v[1] = {per[1]};
  add_row(name, kind ? 2 * MiB : 0, v, 1,
          "wall ns per op: 1 thread %.0f, 4 threads %.0f (4 threads / 1 = %.2f; 0.25 = no lock)",
          per[0], per[1], per[1] / per[0]);
}

static void group_threads(void) {
  current_group = "threads";
  threads_row("cuEventRecord+cuEventQuery", 0, quick ? 500 : 5000);
  threads_row("cuMemAlloc+cuMemFree", 1, quick ? 20 : 200);
}

static void group_ipc(void) {
  current_group = "ipc";
  CUdeviceptr d;
  CK(cu.cuMemAlloc(&d, 2 * MiB));
  if (cu.cuIpcGetMemHandle) {
    double v[20];
    CUresult f;
    CUipcMemHandle ih;
    TIME_N(v, 20, cu.cuIpcGetMemHandle(&ih, d), f);
    if (f)
      add_row("cuIpcGetMemHandle", 2 * MiB, NULL, 0, "failed: %s", err_name(f));
    else
      add_row("cuIpcGetMemHandle", 2 * MiB, v, 20, NULL);
  }
  CK(cu.cuMemFree(d));
  int fd_ok = 0;
  cu.cuDeviceGetAttribute(&fd_ok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                          dev);
  if (!fd_ok || !cu.cuMemExportToShareableHandle) {
    add_row("cuMemExportToShareableHandle (fd)", 2 * MiB, NULL, 0, "not supported");
    return;
  }
  CUmemAllocationProp p = chunk_prop();
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h;
  double ve[20], vi[20];
  int n = 20;
  CUresult r = cu.cuMemCreate(&h, 2 * MiB, &p, 0);
  for (int i = 0; i < n && !r; i++) {
    int fd = -1;
    uint64_t t0 = now_ns();
    r = cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    ve[i] = (double)(now_ns() - t0);
    if (r) break;
    CUmemGenericAllocationHandle h2;
    t0 = now_ns();
    r = cu.cuMemImportFromShareableHandle(&h2, (void *)(uintptr_t)fd,
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    vi[i] = (double)(now_ns() - t0);
    close(fd);
    if (!r) cu.cuMemRelease(h2);
  }
  if (r) {
    add_row("cuMemExport/ImportShareableHandle (fd)", 2 * MiB, NULL, 0, "failed: %s", err_name(r));
  } else {
    add_row("cuMemExportToShareableHandle (fd)", 2 * MiB, ve, n, NULL);
    add_row("cuMemImportFromShareableHandle (fd)", 2 * MiB, vi, n, "same process");
  }
  cu.cuMemRelease(h);
}

/* An event on the legacy stream after a kernel on a blocking stream: the
 * legacy stream waits for blocking streams, so the event completes only
 * after the kernel; a non-blocking stream's kernel is not waited for. */
static void legacy_row(const char *name, CUstream busy) {
  if (!spin_fn) {
    add_row(name, 0, NULL, 0, "%s", spin_why);
    return;
  }
  CK(cu.cuCtxSynchronize());
  CK(spin(busy, WAIT_KERNEL_NS));
  uint64_t t0 = now_ns();
  CK(cu.cuEventRecord(ev, CU_STREAM_LEGACY));
  CUresult r;
  while ((r = cu.cuEventQuery(ev)) == CUDA_ERROR_NOT_READY) {
  }
  CK(r);
  double v[1] = {(double)(now_ns() - t0)};
  add_row(name, 0, v, 1, "%s", v[0] > WAIT_KERNEL_NS / 2 ? "waited for the kernel"
                                                         : "did not wait for the kernel");
  CK(cu.cuCtxSynchronize());
}

static void group_legacy(void) {
  current_group = "legacy";
  legacy_row("event on legacy stream, blocking busy", sblock);
  legacy_row("event on legacy stream, non-blocking busy", s2);
}

/* ---- main ---------------------------------------------------------------------------- */

static const struct {
  const char *name;
  void (*run)(void);
} groups[] = {{"calls", group_calls},     {"events", group_events}, {"malloc", group_malloc},
              {"waits", group_waits},     {"vmm", group_vmm},       {"pool", group_pool},
              {"host", group_host},       {"threads", group_threads}, {"ipc", group_ipc},
              {"legacy", group_legacy}};
static const char *group_list; /* --groups: comma-separated names; NULL: all */

static int group_listed(const char *name) {
  if (!group_list) return 1;
  size_t len = strlen(name);
  for (const char *p = group_list; *p;) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == len && strncmp(p, name, n) == 0) return 1;
    p += n + (end != NULL);
  }
  return 0;
}

static int groups_valid(const char *list) {
  for (const char *p = list; *p;) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    int found = 0;
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
      found |= strlen(groups[g].name) == n && strncmp(p, groups[g].name, n) == 0;
    if (!found) {
      fprintf(stderr, "gma-driver-probe: no group '%.*s' (groups: calls, events, malloc, waits, "
                      "vmm, pool, host, threads, ipc, legacy)\n", (int)n, p);
      return 0;
    }
    p += n + (end != NULL);
  }
  return 1;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else if (!strcmp(argv[i], "--limit") && i + 1 < argc) {
      limit_s = atoi(argv[++i]);
      if (limit_s <= 0) {
        fprintf(stderr, "gma-driver-probe: --limit takes a positive number of seconds\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "--groups") && i + 1 < argc) {
      group_list = argv[++i];
      if (!groups_valid(group_list)) return 2;
    } else if (!strcmp(argv[i], "--quick")) {
      quick = 1;
    } else {
      fprintf(stderr, "usage: gma-driver-probe [--json PATH] [--limit SECONDS] [--groups LIST] [--quick]\n");
      return 2;
    }
  }
  char why[512];
  if (load_driver(why, sizeof why)) {
    printf("gma-driver-probe: no GPU: %s\n", why);
    write_json(why);
    return EXIT_SKIP;
  }
  CUresult r = cu.cuInit(0);
  int count = 0;
  if (r == CUDA_SUCCESS) {
    CUdevice d0;
    r = cu.cuDeviceGet(&d0, 0);
    count = r == CUDA_SUCCESS;
  }
  if (!count) {
    printf("gma-driver-probe: no GPU: cuInit/cuDeviceGet: %s\n", err_name(r));
    write_json("no GPU");
    return EXIT_SKIP;
  }
  pthread_t wd;
  pthread_create(&wd, NULL, watchdog, NULL);
  pthread_detach(wd);
  uint64_t t0 = now_ns();
  setup();
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
    if (!group_listed(groups[g].name)) continue;
    if (setjmp(group_jmp) == 0) {
      in_group = 1;
      groups[g].run();
    }
    in_group = 0;
    cu.cuCtxSynchronize(); /* whatever a failed group left queued */
  }
  write_json("complete");
  printf("gma-driver-probe: %d rows in %.1f s; JSON: %s\n", nrows, (double)(now_ns() - t0) / 1e9,
         json_path);
  return 0;
}
