/* The fake CUDA driver's own semantics, through dlopen + cuGetProcAddress
 * as gma's CUDA backend reaches it (no gma involved): what must fail before
 * cuInit, the lookup rules, fault injection and call counts, devices and
 * their memory (GMA_FAKECUDA_DEVICES=2, GMA_FAKECUDA_MEM=64M,128M), primary
 * contexts and the thread-local context stack, out-of-memory and bad frees,
 * events that are not ready while their stream is held, stream-ordered
 * memset and copies, virtual memory (granularity, reserve, create, map,
 * access, unmap of adjacent mappings, release while mapped), the sticky fault
 * of a copy that outlives its memory, and the reset of a primary context
 * when its last reference goes. The fake is the oracle of the GPU tests, so
 * it gets tested before it is trusted.
 *
 * Stream capture: begin, status and capture info (the v2 ABI gma asks for
 * with cudaVersion 12000, v3 from 12030); captured work does not run and
 * runs at each launch, with an event after the launch completing only
 * after it; a replay writes to the recorded address after other memory was
 * mapped there; a fork and join through events, UNJOINED, UNMATCHED and
 * MERGE; the potentially unsafe call rule for each mode of the capture and
 * of the calling thread, from the capturing thread and another; each call
 * of the fake's unsafe list; CAPTURED_EVENT, ISOLATION, a capturing stream
 * synchronized, queried or destroyed, cuCtxSynchronize, WRONG_THREAD and
 * the legacy stream's IMPLICIT; fakecuda_capture_violations counting each.
 *
 * Strictness (fakecuda.h, FAKECUDA_STRICT_*): an event completes only after
 * the work queued before it has run (the memory shows it); a copy into
 * pageable host memory has completed when cuMemcpyDtoHAsync returns, one
 * into cuMemHostAlloc memory has not; and each misuse the fake aborts on
 * (a destroyed stream or event, a wait across devices, cuMemFree and
 * cuMemUnmap under a queued copy, and the capture rules: an unsafe call,
 * a captured event queried, ISOLATION, IMPLICIT, WRONG_THREAD, a capturing
 * stream synchronized, capture on the legacy stream) is run in a child
 * process (this program again, argv[1] naming the misuse) that must die of
 * SIGABRT with a message naming the entry point, and, with that check off
 * (GMA_FAKECUDA_STRICT=none or the other checks only), must get the error
 * code instead. The parent's own checks of those error codes turn
 * the checks off around them with fakecuda_strict. */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "child.h"
#include "fakecuda.h"

/* Function pointers typed by cuda.h's own prototypes (cuMemAlloc is the
 * macro for cuMemAlloc_v2, whose type __typeof__ takes). */
#define ENTRIES(X)                                                                    \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)              \
  X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute)                         \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxGetCurrent)        \
  X(cuCtxSetCurrent) X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuCtxSynchronize)      \
  X(cuMemAlloc) X(cuMemFree) X(cuMemGetInfo) X(cuEventCreate) X(cuEventDestroy)      \
  X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize) X(cuStreamWaitEvent)        \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamGetId) X(cuStreamSynchronize)       \
  X(cuMemGetAllocationGranularity) X(cuMemAddressReserve) X(cuMemAddressFree)        \
  X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)         \
  X(cuMemsetD32Async) X(cuMemcpyDtoHAsync) X(cuMemcpyHtoDAsync)                    \
  X(cuMemHostAlloc) X(cuMemFreeHost) X(cuStreamQuery) X(cuStreamBeginCapture)         \
  X(cuStreamEndCapture) X(cuStreamIsCapturing) X(cuThreadExchangeStreamCaptureMode)   \
  X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy)

#define DECLARE_(name) static __typeof__(&name) p_##name;
ENTRIES(DECLARE_)
#undef DECLARE_

typedef CUresult (*get_proc_v2_t)(const char *, void **, int, cuuint64_t,
                                  CUdriverProcAddressQueryResult *);
typedef CUresult (*get_proc_v1_t)(const char *, void **, int, cuuint64_t);
static get_proc_v2_t get_proc;
static fakecuda_fail_fn fc_fail;
static fakecuda_clear_faults_fn fc_clear;
static fakecuda_calls_fn fc_calls;
static fakecuda_launch_fn fc_launch;
static fakecuda_used_fn fc_used;
static fakecuda_strict_fn fc_strict;
static fakecuda_capture_violations_fn fc_violations;
/* cuStreamGetCaptureInfo as gma's runtime asks for it (cudaVersion 12000:
 * the v2 ABI) and as cuda.h declares it (12030 and newer: v3). */
typedef CUresult (*capinfo_v2_t)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                 const CUgraphNode **, size_t *);
static capinfo_v2_t capinfo_v2;
static __typeof__(&cuStreamGetCaptureInfo) capinfo_v3;

#define CU_OK(call) CU_IS(call, CUDA_SUCCESS)
#define CU_IS(call, expected)                                                              \
  do {                                                                                     \
    CUresult r_ = (call);                                                                  \
    if (r_ != (expected)) {                                                                \
      fprintf(stderr, "%s:%d: %s returned %d, expected %d (%s)\n", __FILE__, __LINE__,     \
              #call, (int)r_, (int)(expected), #expected);                                 \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

static void *sym(void *h, const char *name) {
  void *p = dlsym(h, name);
  if (!p) {
    fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
    exit(1);
  }
  return p;
}

static void load(void) {
  const char *path = getenv("GMA_CUDA_DRIVER");
  CHECK(path && *path);
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "dlopen(%s): %s\n", path, dlerror());
    exit(1);
  }
  get_proc = (get_proc_v2_t)sym(h, "cuGetProcAddress_v2");
  fc_fail = (fakecuda_fail_fn)sym(h, "fakecuda_fail");
  fc_clear = (fakecuda_clear_faults_fn)sym(h, "fakecuda_clear_faults");
  fc_calls = (fakecuda_calls_fn)sym(h, "fakecuda_calls");
  fc_launch = (fakecuda_launch_fn)sym(h, "fakecuda_launch");
  fc_used = (fakecuda_used_fn)sym(h, "fakecuda_used");
  fc_strict = (fakecuda_strict_fn)sym(h, "fakecuda_strict");
  fc_violations = (fakecuda_capture_violations_fn)sym(h, "fakecuda_capture_violations");
  CUdriverProcAddressQueryResult st;
#define LOOKUP_(name)                                                                      \
  CU_OK(get_proc(#name, (void **)&p_##name, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st)); \
  CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS && p_##name != NULL);
  ENTRIES(LOOKUP_)
#undef LOOKUP_

  /* Lookup rules: base names only; unknown names clear *pfn; a version
   * older than the variant gives VERSION_NOT_SUFFICIENT; the old 4-argument
   * symbol answers too. None of this needs cuInit. */
  void *fn = (void *)&st;
  CU_IS(get_proc("cuNoSuchThing", &fn, 12000, 0, &st), CUDA_ERROR_NOT_FOUND);
  CHECK(fn == NULL && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  CU_IS(get_proc("cuMemAlloc_v2", &fn, 12000, 0, &st), CUDA_ERROR_NOT_FOUND);
  CU_IS(get_proc("cuStreamGetId", &fn, 11080, 0, &st), CUDA_ERROR_NOT_FOUND);
  CHECK(fn == NULL && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  CU_IS(get_proc("cuMemAlloc", &fn, 12000, 1u << 7, &st), CUDA_ERROR_INVALID_VALUE);
  get_proc_v1_t v1 = (get_proc_v1_t)sym(h, "cuGetProcAddress");
  CU_OK(v1("cuMemAlloc", &fn, 12000, 0));
  CHECK(fn == (void *)p_cuMemAlloc);
  /* The per-thread-default-stream form of a stream call is another function. */
  CU_OK(get_proc("cuStreamGetId", &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st));
  CHECK(fn != NULL && fn != (void *)p_cuStreamGetId);
  CHECK(fc_calls("cuGetProcAddress") >= 40);

  /* cuStreamGetCaptureInfo: v2 below 12030, v3 from it, none before 11030;
   * cuGraphInstantiate has its WithFlags signature only from 12000. */
  CU_OK(get_proc("cuStreamGetCaptureInfo", (void **)&capinfo_v2, 12000, 0, &st));
  CU_OK(get_proc("cuStreamGetCaptureInfo", (void **)&capinfo_v3, 12030, 0, &st));
  CHECK(capinfo_v2 && capinfo_v3 && (void *)capinfo_v2 != (void *)capinfo_v3);
  CHECK((void *)capinfo_v3 == sym(h, "cuStreamGetCaptureInfo_v3"));
  CU_OK(get_proc("cuStreamGetCaptureInfo", &fn, 12020, 0, &st));
  CHECK(fn == (void *)capinfo_v2);
  CU_OK(get_proc("cuStreamGetCaptureInfo", &fn, 13000, 0, &st));
  CHECK(fn == (void *)capinfo_v3);
  CU_IS(get_proc("cuStreamGetCaptureInfo", &fn, 11020, 0, &st), CUDA_ERROR_NOT_FOUND);
  CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  CU_IS(get_proc("cuGraphInstantiate", &fn, 11080, 0, &st), CUDA_ERROR_NOT_FOUND);
  CU_OK(get_proc("cuStreamGetCaptureInfo", &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                 &st));
  CHECK(fn && fn != (void *)capinfo_v2 && fn != (void *)capinfo_v3);
}

static void test_before_init(void) {
  int n = -1;
  CU_IS(p_cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
  CUcontext c;
  CU_IS(p_cuCtxGetCurrent(&c), CUDA_ERROR_NOT_INITIALIZED);
  int v = 0;
  CU_OK(p_cuDriverGetVersion(&v));
  CHECK(v >= 12000);
  const char *s = NULL;
  CU_OK(p_cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
  CHECK(strcmp(s, "CUDA_ERROR_OUT_OF_MEMORY") == 0);
  CU_OK(p_cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
  CHECK(strcmp(s, "out of memory") == 0);
  CU_OK(p_cuGetErrorName(CUDA_ERROR_INVALID_CONTEXT, &s));
  CHECK(strcmp(s, "CUDA_ERROR_INVALID_CONTEXT") == 0);
  CU_OK(p_cuGetErrorString(CUDA_ERROR_NOT_READY, &s));
  CHECK(strcmp(s, "device not ready") == 0);
  CU_IS(p_cuGetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
  CHECK(s == NULL);

  /* An injected cuInit failure leaves the driver uninitialized; the next
   * cuInit succeeds. Faults count from the arming, one-shot. */
  CHECK(fc_fail("cuNoSuchThing", 1, CUDA_ERROR_UNKNOWN) == -1);
  CHECK(fc_fail("cuInit", 1, CUDA_ERROR_NO_DEVICE) == 0);
  unsigned long long before = fc_calls("cuInit");
  CU_IS(p_cuInit(0), CUDA_ERROR_NO_DEVICE);
  CU_IS(p_cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
  CU_IS(p_cuInit(1), CUDA_ERROR_INVALID_VALUE);
  CU_OK(p_cuInit(0));
  CU_OK(p_cuInit(0));
  CHECK(fc_calls("cuInit") == before + 4);
  CHECK(fc_calls("cuNoSuchThing") == 0);
}

static void test_devices(void) {
  int n = 0;
  CU_OK(p_cuDeviceGetCount(&n));
  CHECK(n == 2);
  CUdevice d = -1;
  CU_OK(p_cuDeviceGet(&d, 1));
  CHECK(d == 1);
  CU_IS(p_cuDeviceGet(&d, 2), CUDA_ERROR_INVALID_DEVICE);
  int v = 0;
  CU_OK(p_cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  CHECK(v == 1);
  CU_IS(p_cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 5), CUDA_ERROR_INVALID_DEVICE);
  CU_IS(p_cuDeviceGetAttribute(&v, (CUdevice_attribute)100000, 0), CUDA_ERROR_INVALID_VALUE);
}

static void *no_context_thread(void *arg) {
  CUcontext c = (CUcontext)arg;
  CU_OK(p_cuCtxGetCurrent(&c));
  CHECK(c == NULL); /* the stack is per thread */
  return NULL;
}

static CUcontext ctx0, ctx1;

static void test_contexts(void) {
  CUcontext c = (CUcontext)&c;
  CU_OK(p_cuCtxGetCurrent(&c));
  CHECK(c == NULL);
  CUdeviceptr p;
  CU_IS(p_cuMemAlloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
  size_t fr, tot;
  CU_IS(p_cuMemGetInfo(&fr, &tot), CUDA_ERROR_INVALID_CONTEXT);
  CU_IS(p_cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
  CU_IS(p_cuCtxPopCurrent(&c), CUDA_ERROR_INVALID_CONTEXT);
  CU_IS(p_cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);

  CU_OK(p_cuDevicePrimaryCtxRetain(&ctx0, 0));
  CU_OK(p_cuDevicePrimaryCtxRetain(&ctx1, 1));
  CUcontext again;
  CU_OK(p_cuDevicePrimaryCtxRetain(&again, 0));
  CHECK(again == ctx0 && ctx0 != ctx1);
  CU_OK(p_cuDevicePrimaryCtxRelease(0));

  /* Push/pop nest; SetCurrent replaces the top; SetCurrent(NULL) pops. */
  CU_OK(p_cuCtxPushCurrent(ctx0));
  CU_OK(p_cuCtxPushCurrent(ctx1));
  CU_OK(p_cuCtxGetCurrent(&c));
  CHECK(c == ctx1);
  CU_OK(p_cuMemGetInfo(&fr, &tot));
  CHECK(tot == 128ull << 20 && fr == tot);
  CU_OK(p_cuCtxPopCurrent(&c));
  CHECK(c == ctx1);
  CU_OK(p_cuMemGetInfo(&fr, &tot));
  CHECK(tot == 64ull << 20);
  CU_OK(p_cuCtxSetCurrent(ctx1));
  CU_OK(p_cuCtxGetCurrent(&c));
  CHECK(c == ctx1);
  CU_OK(p_cuCtxSetCurrent(NULL));
  CU_OK(p_cuCtxGetCurrent(&c));
  CHECK(c == NULL);
  CU_IS(p_cuCtxPushCurrent((CUcontext)&c), CUDA_ERROR_INVALID_CONTEXT);

  CU_OK(p_cuCtxSetCurrent(ctx0));
  pthread_t t;
  CHECK(pthread_create(&t, NULL, no_context_thread, NULL) == 0);
  pthread_join(t, NULL);
}

static void test_memory(void) {
  CUdeviceptr a = 0, b = 0;
  CU_IS(p_cuMemAlloc(&a, 0), CUDA_ERROR_INVALID_VALUE);
  CU_IS(p_cuMemAlloc(&a, (64ull << 20) + 1), CUDA_ERROR_OUT_OF_MEMORY);
  CU_OK(p_cuMemAlloc(&a, 32ull << 20));
  CHECK(a != 0 && a % 256 == 0);
  CHECK(fc_used(0) == 32ull << 20 && fc_used(1) == 0);
  CU_IS(p_cuMemAlloc(&b, 33ull << 20), CUDA_ERROR_OUT_OF_MEMORY);
  size_t fr, tot;
  CU_OK(p_cuMemGetInfo(&fr, &tot));
  CHECK(fr == 32ull << 20);
  CU_IS(p_cuMemFree(a + 256), CUDA_ERROR_INVALID_VALUE);
  CU_OK(p_cuMemFree(a));
  CU_IS(p_cuMemFree(a), CUDA_ERROR_INVALID_VALUE);
  CHECK(fc_used(0) == 0);

  /* An injected OOM changes nothing. */
  CHECK(fc_fail("cuMemAlloc", 2, CUDA_ERROR_OUT_OF_MEMORY) == 0);
  CU_OK(p_cuMemAlloc(&a, 1 << 20));
  CU_IS(p_cuMemAlloc(&b, 1 << 20), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(fc_used(0) == 1 << 20);
  CU_OK(p_cuMemAlloc(&b, 1 << 20));

  /* Stream-ordered memset and copies. */
  CUstream s;
  CU_OK(p_cuStreamCreate(&s, 0));
  uint32_t *host = malloc(1 << 20), *back = malloc(1 << 20);
  CHECK(host && back);
  CU_OK(p_cuMemsetD32Async(a, 0xdeadbeefu, (1 << 20) / 4, s));
  CU_OK(p_cuMemcpyDtoHAsync(back, a, 1 << 20, s));
  CU_OK(p_cuStreamSynchronize(s));
  for (size_t i = 0; i < (1 << 20) / 4; i++) CHECK(back[i] == 0xdeadbeefu);
  for (size_t i = 0; i < (1 << 20) / 4; i++) host[i] = (uint32_t)i * 2654435761u;
  CU_OK(p_cuMemcpyHtoDAsync(b, host, 1 << 20, NULL));
  CU_OK(p_cuMemcpyDtoHAsync(back, b, 1 << 20, NULL));
  CU_OK(p_cuCtxSynchronize());
  CHECK(memcmp(host, back, 1 << 20) == 0);
  /* Out of the allocation, misaligned, or another device's stream: refused at once. */
  CU_IS(p_cuMemsetD32Async(a + 4, 0, (1 << 20) / 4, s), CUDA_ERROR_INVALID_VALUE);
  CU_IS(p_cuMemsetD32Async(a + 2, 0, 1, s), CUDA_ERROR_INVALID_VALUE);
  CU_IS(p_cuMemcpyDtoHAsync(back, (CUdeviceptr)(uintptr_t)back, 16, s), CUDA_ERROR_INVALID_VALUE);
  unsigned strict = fc_strict(0); /* a made-up handle: an abort when strict */
  CU_IS(p_cuMemsetD32Async(a, 0, 1, (CUstream)(uintptr_t)0x1000), CUDA_ERROR_INVALID_HANDLE);
  fc_strict(strict);
  CU_OK(p_cuStreamDestroy(s));
  CU_OK(p_cuMemFree(a));
  CU_OK(p_cuMemFree(b));
  CHECK(fc_used(0) == 0);
  free(host);
  free(back);
}

static void gate_kernel(void *arg) {
  atomic_int *gate = arg;
  struct timespec ts = {0, 100000};
  for (int i = 0; i < 50000 && !atomic_load(gate); i++) nanosleep(&ts, NULL);
}

static void test_streams_events(void) {
  CUstream s1, s2;
  CU_OK(p_cuStreamCreate(&s1, 0));
  CU_OK(p_cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  CU_IS(p_cuStreamCreate(&s2, 0x80), CUDA_ERROR_INVALID_VALUE);
  unsigned long long id1 = 0, id2 = 0, idn = 0, idp = 0;
  CU_OK(p_cuStreamGetId(s1, &id1));
  CU_OK(p_cuStreamGetId(s2, &id2));
  CU_OK(p_cuStreamGetId(NULL, &idn));
  CU_OK(p_cuStreamGetId(CU_STREAM_PER_THREAD, &idp));
  CHECK(id1 && id2 && idn && idp && id1 != id2 && idn != idp && id1 != idn);
  /* The per-thread form reads NULL as the thread's own stream. */
  __typeof__(&cuStreamGetId) ptsz;
  CU_OK(get_proc("cuStreamGetId", (void **)&ptsz, 12000,
                 CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL));
  unsigned long long idq = 0;
  CU_OK(ptsz(NULL, &idq));
  CHECK(idq == idp);

  CUevent ev, ev2;
  CU_OK(p_cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  CU_OK(p_cuEventCreate(&ev2, 0));
  CU_IS(p_cuEventCreate(&ev2, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);
  CU_OK(p_cuEventQuery(ev)); /* never recorded: complete */
  atomic_int gate = 0;
  CU_OK(fc_launch(s1, gate_kernel, &gate));
  CU_OK(p_cuEventRecord(ev, s1));
  CU_IS(p_cuEventQuery(ev), CUDA_ERROR_NOT_READY);
  /* s2 waits for s1's work; its own record completes only after. */
  CU_OK(p_cuStreamWaitEvent(s2, ev, 0));
  CU_IS(p_cuStreamWaitEvent(s2, ev, 1), CUDA_ERROR_INVALID_VALUE);
  CU_OK(p_cuEventRecord(ev2, s2));
  CU_IS(p_cuEventQuery(ev2), CUDA_ERROR_NOT_READY);
  atomic_store(&gate, 1);
  CU_OK(p_cuEventSynchronize(ev2));
  CU_OK(p_cuEventQuery(ev));
  CU_OK(p_cuEventDestroy(ev));
  unsigned strict = fc_strict(0); /* the error codes of misuse (aborts when strict) */
  CU_IS(p_cuEventDestroy(ev), CUDA_ERROR_INVALID_HANDLE);
  CU_IS(p_cuEventQuery(ev), CUDA_ERROR_INVALID_HANDLE);
  fc_strict(strict);
  CU_OK(p_cuEventDestroy(ev2));

  /* Events and streams belong to their device. */
  CU_OK(p_cuCtxPushCurrent(ctx1));
  CUevent ev1;
  CU_OK(p_cuEventCreate(&ev1, 0));
  CU_IS(p_cuEventRecord(ev1, s1), CUDA_ERROR_INVALID_HANDLE);
  CU_OK(p_cuEventRecord(ev1, NULL));
  CU_OK(p_cuStreamSynchronize(s1)); /* an explicit stream needs no current context */
  CU_OK(p_cuEventDestroy(ev1));
  CUcontext c;
  CU_OK(p_cuCtxPopCurrent(&c));

  CU_IS(p_cuStreamDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
  CU_OK(p_cuStreamDestroy(s1));
  strict = fc_strict(0);
  CU_IS(p_cuStreamGetId(s1, &id1), CUDA_ERROR_INVALID_HANDLE);
  CU_IS(p_cuStreamSynchronize(s1), CUDA_ERROR_INVALID_HANDLE);
  fc_strict(strict);
  CU_OK(p_cuStreamDestroy(s2));
}

static void test_vmm(void) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t g = 0;
  CU_OK(p_cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CHECK(g == 2u << 20);
  CUdeviceptr base = 0;
  CU_IS(p_cuMemAddressReserve(&base, g + 4096, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CU_OK(p_cuMemAddressReserve(&base, 8 * g, 0, 0, 0));
  CHECK(base % g == 0);
  CUdeviceptr big = 0;
  CU_OK(p_cuMemAddressReserve(&big, 2 * g, 16 * g, 0, 0));
  CHECK(big % (16 * g) == 0);
  CU_OK(p_cuMemAddressFree(big, 2 * g));

  CUmemGenericAllocationHandle h1, h2, h3;
  CU_OK(p_cuMemCreate(&h1, 64u << 20, &prop, 0)); /* the whole device */
  CHECK(fc_used(0) == 64u << 20);
  CU_OK(p_cuMemRelease(h1));
  CHECK(fc_used(0) == 0);
  CU_IS(p_cuMemCreate(&h1, (64u << 20) + g, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CU_OK(p_cuMemCreate(&h1, g, &prop, 0));
  CU_OK(p_cuMemCreate(&h2, g, &prop, 0));
  CHECK(fc_used(0) == 2 * g); /* held from creation, mapped or not */
  CU_IS(p_cuMemMap(base + 8 * g, g, 0, h1, 0), CUDA_ERROR_INVALID_VALUE); /* outside */
  CU_IS(p_cuMemMap(base, g, 4096, h1, 0), CUDA_ERROR_INVALID_VALUE);
  CU_OK(p_cuMemMap(base, g, 0, h1, 0));
  CU_IS(p_cuMemMap(base, g, 0, h2, 0), CUDA_ERROR_INVALID_VALUE); /* overlap */
  CU_IS(p_cuMemMap(base + 2 * g, g, 0, h1, 0), CUDA_ERROR_NOT_SUPPORTED);
  CU_OK(p_cuMemMap(base + g, g, 0, h2, 0));

  /* Mapped memory is not accessible before cuMemSetAccess. */
  CU_IS(p_cuMemsetD32Async(base, 1, 16, NULL), CUDA_ERROR_ILLEGAL_ADDRESS);
  CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CU_IS(p_cuMemSetAccess(base, 3 * g, &acc, 1), CUDA_ERROR_INVALID_VALUE); /* a hole */
  CU_OK(p_cuMemSetAccess(base, 2 * g, &acc, 1));
  /* One memset across both adjacent mappings: a growable segment's block. */
  CU_OK(p_cuMemsetD32Async(base + g / 2, 0x5a5a5a5au, g / 4, NULL));
  uint32_t *back = malloc(g);
  CHECK(back);
  CU_OK(p_cuMemcpyDtoHAsync(back, base + g / 2, g, NULL));
  CU_OK(p_cuStreamSynchronize(NULL));
  for (size_t i = 0; i < g / 4; i++) CHECK(back[i] == 0x5a5a5a5au);
  free(back);

  /* Release while mapped keeps the memory until the unmap. */
  CU_OK(p_cuMemRelease(h1));
  CU_IS(p_cuMemRelease(h1), CUDA_ERROR_INVALID_VALUE);
  CHECK(fc_used(0) == 2 * g);
  CU_IS(p_cuMemUnmap(base, g + 4096), CUDA_ERROR_INVALID_VALUE); /* cuts a mapping */
  CU_IS(p_cuMemAddressFree(base, 8 * g), CUDA_ERROR_INVALID_VALUE); /* still mapped */
  CU_OK(p_cuMemUnmap(base, 2 * g));
  CHECK(fc_used(0) == g); /* h2 is not released yet */
  CU_IS(p_cuMemsetD32Async(base, 1, 16, NULL), CUDA_ERROR_INVALID_VALUE);
  CU_OK(p_cuMemMap(base + 4 * g, g, 0, h2, 0)); /* an unmapped handle maps again */
  CU_OK(p_cuMemCreate(&h3, g, &prop, 0));
  CU_OK(p_cuMemMap(base + 5 * g, g, 0, h3, 0));
  CU_OK(p_cuMemRelease(h3));
  CU_OK(p_cuMemUnmap(base + 4 * g, g));
  CU_OK(p_cuMemUnmap(base + 5 * g, g));
  CU_OK(p_cuMemRelease(h2));
  CHECK(fc_used(0) == 0);
  CU_OK(p_cuMemAddressFree(base, 8 * g));
  CU_IS(p_cuMemAddressFree(base, 8 * g), CUDA_ERROR_INVALID_VALUE);
}

/* ---- strictness ---------------------------------------------------------- */
static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* An event recorded behind held work stays NOT_READY while the work is
 * queued, and once it reads complete the work's effect is in memory (device
 * pointers are host addresses in the fake, so the test can look). */
static void test_event_after_work(void) {
  CUstream s;
  CU_OK(p_cuStreamCreate(&s, 0));
  const size_t bytes = 1 << 20;
  CUdeviceptr a;
  CU_OK(p_cuMemAlloc(&a, bytes));
  CU_OK(p_cuMemsetD32Async(a, 0, bytes / 4, s));
  CU_OK(p_cuStreamSynchronize(s));
  CUevent ev;
  CU_OK(p_cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  atomic_int gate = 0;
  CU_OK(fc_launch(s, gate_kernel, &gate));
  CU_OK(p_cuMemsetD32Async(a, 0x77777777u, bytes / 4, s));
  CU_OK(p_cuEventRecord(ev, s));
  const volatile uint32_t *w = (const volatile uint32_t *)(uintptr_t)a;
  for (int i = 0; i < 20; i++) {
    CU_IS(p_cuEventQuery(ev), CUDA_ERROR_NOT_READY);
    sleep_ms(1);
  }
  CHECK(w[0] == 0 && w[bytes / 4 - 1] == 0); /* the memset has not run */
  atomic_store(&gate, 1);
  CUresult r;
  for (int i = 0; i < 10000 && (r = p_cuEventQuery(ev)) == CUDA_ERROR_NOT_READY; i++) sleep_ms(1);
  CU_OK(r);
  for (size_t i = 0; i < bytes / 4; i++) CHECK(w[i] == 0x77777777u);
  /* Recorded on a stream whose work has all run: complete at once. */
  CU_OK(p_cuStreamSynchronize(s));
  CU_OK(p_cuEventRecord(ev, s));
  CU_OK(p_cuEventQuery(ev));
  CU_OK(p_cuEventDestroy(ev));
  CU_OK(p_cuStreamDestroy(s));
  CU_OK(p_cuMemFree(a));
}

static void *open_gate_later(void *arg) {
  sleep_ms(50);
  atomic_store((atomic_int *)arg, 1);
  return NULL;
}

/* cuMemcpyDtoHAsync into pageable memory returns after the copy (behind
 * held work, so only after the gate opened); into cuMemHostAlloc memory it
 * returns at once and the data arrives in stream order. */
static void test_copy_to_host(void) {
  CUstream s;
  CU_OK(p_cuStreamCreate(&s, 0));
  const size_t bytes = 1 << 20;
  CUdeviceptr a;
  CU_OK(p_cuMemAlloc(&a, bytes));
  uint32_t *page = calloc(1, bytes);
  CHECK(page);
  atomic_int gate = 0;
  CU_OK(fc_launch(s, gate_kernel, &gate));
  CU_OK(p_cuMemsetD32Async(a, 0x51515151u, bytes / 4, s));
  pthread_t t;
  CHECK(pthread_create(&t, NULL, open_gate_later, &gate) == 0);
  CU_OK(p_cuMemcpyDtoHAsync(page, a, bytes, s));
  CHECK(atomic_load(&gate) == 1); /* it waited for the held work */
  for (size_t i = 0; i < bytes / 4; i++) CHECK(page[i] == 0x51515151u); /* no sync needed */
  pthread_join(t, NULL);

  uint32_t *pinned = NULL;
  CU_OK(p_cuMemHostAlloc((void **)&pinned, bytes, 0));
  memset(pinned, 0, bytes);
  atomic_int gate2 = 0;
  CU_OK(fc_launch(s, gate_kernel, &gate2));
  CU_OK(p_cuMemsetD32Async(a, 0x62626262u, bytes / 4, s));
  CU_OK(p_cuMemcpyDtoHAsync(pinned, a, bytes, s));
  sleep_ms(5);
  CHECK(pinned[0] == 0 && pinned[bytes / 4 - 1] == 0); /* queued, not run */
  atomic_store(&gate2, 1);
  CU_OK(p_cuStreamSynchronize(s));
  for (size_t i = 0; i < bytes / 4; i++) CHECK(pinned[i] == 0x62626262u);
  CU_OK(p_cuMemFreeHost(pinned));
  free(page);
  CU_OK(p_cuStreamDestroy(s));
  CU_OK(p_cuMemFree(a));
}

/* ---- stream capture ------------------------------------------------------ */
/* The parent checks capture's error codes with the "capture" check off (a
 * strict fake aborts on them; test_misuse_aborts checks that in children). */
static unsigned capture_lenient(void) {
  return fc_strict(FAKECUDA_STRICT_ALL & ~FAKECUDA_STRICT_CAPTURE);
}

static CUstreamCaptureStatus cap_status(CUstream s) {
  CUstreamCaptureStatus st = (CUstreamCaptureStatus)-1;
  CU_OK(p_cuStreamIsCapturing(s, &st));
  return st;
}

/* The id of s's active capture, through the v2 ABI as gma asks (NULL for
 * graph, dependencies and their number). */
static cuuint64_t cap_id(CUstream s) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  CU_OK(capinfo_v2(s, &st, &id, NULL, NULL, NULL));
  CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE && id != 0);
  return id;
}

static CUstreamCaptureMode set_mode(CUstreamCaptureMode m) {
  CU_OK(p_cuThreadExchangeStreamCaptureMode(&m));
  return m;
}

/* Ends the capture on s expecting result; the graph (NULL unless success) is
 * returned, or destroyed when destroy. */
static CUgraph end_capture(CUstream s, CUresult expected, bool destroy) {
  CUgraph g = (CUgraph)&g;
  CU_IS(p_cuStreamEndCapture(s, &g), expected);
  CHECK(cap_status(s) == CU_STREAM_CAPTURE_STATUS_NONE);
  if (expected != CUDA_SUCCESS) {
    CHECK(g == NULL);
  } else {
    CHECK(g != NULL);
    if (destroy) CU_OK(p_cuGraphDestroy(g));
  }
  return g;
}

static void count_kernel(void *arg) { atomic_fetch_add((atomic_int *)arg, 1); }

/* Kernels that log their tag in the order they run. */
typedef struct order_log {
  atomic_int n;
  int seq[16];
} order_log_t;
typedef struct tagged {
  order_log_t *log;
  int tag;
} tagged_t;
static void log_kernel(void *arg) {
  tagged_t *t = arg;
  t->log->seq[atomic_fetch_add(&t->log->n, 1)] = t->tag;
}
static int log_pos(const order_log_t *log, int tag) {
  for (int i = 0; i < atomic_load(&log->n); i++)
    if (log->seq[i] == tag) return i;
  return -1;
}

static void *is_capturing_thread(void *arg) {
  CUstreamCaptureStatus *st = arg;
  CU_OK(p_cuCtxSetCurrent(ctx0)); /* a default stream needs the context */
  CU_OK(p_cuStreamIsCapturing(CU_STREAM_PER_THREAD, st));
  CU_OK(p_cuCtxSetCurrent(NULL));
  return NULL;
}

/* Begin, status, capture info (v2 and v3), end, unique ids, and the
 * lifecycle errors. */
static void test_capture_basics(void) {
  unsigned strict = capture_lenient();
  unsigned long long v0 = fc_violations();
  CUstream s;
  CU_OK(p_cuStreamCreate(&s, 0));
  CHECK(cap_status(s) == CU_STREAM_CAPTURE_STATUS_NONE);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  cuuint64_t id = 0;
  CUgraph g = NULL;
  const CUgraphNode *deps = NULL;
  size_t n = 9;
  CU_OK(capinfo_v2(s, &st, NULL, NULL, NULL, NULL));
  CHECK(st == CU_STREAM_CAPTURE_STATUS_NONE);
  CU_IS(p_cuStreamBeginCapture(s, (CUstreamCaptureMode)3), CUDA_ERROR_INVALID_VALUE);
  CU_IS(p_cuStreamEndCapture(s, &g), CUDA_ERROR_ILLEGAL_STATE);

  CU_OK(p_cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cap_status(s) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CU_OK(capinfo_v2(s, &st, &id, &g, &deps, &n));
  CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE && id != 0 && g != NULL && n == 0);
  CU_IS(p_cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE);
  atomic_int count = 0;
  CU_OK(fc_launch(s, count_kernel, &count));
  CU_OK(capinfo_v2(s, &st, NULL, NULL, &deps, &n));
  CHECK(n == 1 && deps[0] != NULL);
  CUgraphNode first = deps[0];
  CU_OK(fc_launch(s, count_kernel, &count));
  /* v3: the same capture, the next node's one dependency, default edges. */
  const CUgraphEdgeData *edges = NULL;
  cuuint64_t id3 = 0;
  CUgraph g3 = NULL;
  CU_OK(capinfo_v3(s, &st, &id3, &g3, &deps, &edges, &n));
  CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE && id3 == id && g3 == g && n == 1);
  CHECK(deps[0] != NULL && deps[0] != first && edges != NULL && edges[0].type == 0 &&
        edges[0].from_port == 0 && edges[0].to_port == 0);
  CU_IS(capinfo_v3(s, &st, NULL, NULL, NULL, &edges, NULL), CUDA_ERROR_INVALID_VALUE);
  CU_IS(capinfo_v2(s, NULL, NULL, NULL, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
  CHECK(end_capture(s, CUDA_SUCCESS, false) == g);
  CU_IS(p_cuStreamEndCapture(s, &g3), CUDA_ERROR_ILLEGAL_STATE);
  CU_OK(p_cuStreamSynchronize(s));
  CHECK(atomic_load(&count) == 0); /* captured, never run */
  CU_OK(p_cuGraphDestroy(g));

  /* Ids: nonzero, never reused. */
  cuuint64_t ids[6] = {id};
  for (int i = 1; i < 6; i++) {
    CU_OK(p_cuStreamBeginCapture(s, (CUstreamCaptureMode)(i % 3)));
    ids[i] = cap_id(s);
    for (int j = 0; j < i; j++) CHECK(ids[i] != ids[j]);
    end_capture(s, CUDA_SUCCESS, true);
  }

  /* The per-thread default stream captures; it is another stream on each
   * thread. */
  CU_OK(p_cuStreamBeginCapture(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cap_status(CU_STREAM_PER_THREAD) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  pthread_t t;
  CUstreamCaptureStatus other = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  CHECK(pthread_create(&t, NULL, is_capturing_thread, &other) == 0);
  pthread_join(t, NULL);
  CHECK(other == CU_STREAM_CAPTURE_STATUS_NONE);
  end_capture(CU_STREAM_PER_THREAD, CUDA_SUCCESS, true);

  /* No capture on the legacy stream. */
  CHECK(fc_violations() == v0);
  CU_IS(p_cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_RELAXED),
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CU_IS(p_cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_RELAXED),
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK(fc_violations() == v0 + 2);
  CHECK(cap_status(s) == CU_STREAM_CAPTURE_STATUS_NONE);

  /* The thread's mode: GLOBAL by default, swapped, invalid values refused. */
  CUstreamCaptureMode m = (CUstreamCaptureMode)7;
  CU_IS(p_cuThreadExchangeStreamCaptureMode(&m), CUDA_ERROR_INVALID_VALUE);
  CU_IS(p_cuThreadExchangeStreamCaptureMode(NULL), CUDA_ERROR_INVALID_VALUE);
  CHECK(set_mode(CU_STREAM_CAPTURE_MODE_RELAXED) == CU_STREAM_CAPTURE_MODE_GLOBAL);
  CHECK(set_mode(CU_STREAM_CAPTURE_MODE_GLOBAL) == CU_STREAM_CAPTURE_MODE_RELAXED);
  CU_OK(p_cuStreamDestroy(s));
  fc_strict(strict);
}

/* Captured work runs only at each launch, in order, with the launch stream's
 * later events after it; the graph and the executable graph may go while a
 * launch is queued; a launch on a capturing stream is captured. */
static void test_capture_replay(void) {
  CUstream s, s2;
  CU_OK(p_cuStreamCreate(&s, 0));
  CU_OK(p_cuStreamCreate(&s2, 0));
  const size_t bytes = 64 << 10;
  CUdeviceptr a;
  CU_OK(p_cuMemAlloc(&a, bytes));
  uint32_t *pinned = NULL;
  CU_OK(p_cuMemHostAlloc((void **)&pinned, 4096, 0));
  uint32_t *page = calloc(1, 4096);
  CHECK(page);
  CUevent ev;
  CU_OK(p_cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  volatile uint32_t *w = (volatile uint32_t *)(uintptr_t)a;
  CU_OK(p_cuMemsetD32Async(a, 0, bytes / 4, s));
  CU_OK(p_cuStreamSynchronize(s));

  atomic_int count = 0, gate = 1;
  CU_OK(p_cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(fc_launch(s, count_kernel, &count));
  CU_OK(p_cuMemsetD32Async(a, 0xabcd1234u, bytes / 4, s));
  CU_OK(p_cuMemcpyDtoHAsync(pinned, a, 4096, s));
  CU_OK(p_cuMemcpyDtoHAsync(page, a + 4096, 4096, s)); /* pageable: captured, not synchronous */
  CU_OK(fc_launch(s, gate_kernel, &gate));
  CU_OK(fc_launch(s, count_kernel, &count));
  CU_IS(p_cuMemsetD32Async(a + bytes, 0, 1, s), CUDA_ERROR_INVALID_VALUE); /* checked when captured */
  CUgraph g = end_capture(s, CUDA_SUCCESS, false);
  CU_OK(p_cuStreamSynchronize(s));
  CHECK(atomic_load(&count) == 0 && w[0] == 0 && page[0] == 0);

  CUgraphExec x = NULL;
  CU_IS(p_cuGraphInstantiate(&x, g, CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD), CUDA_ERROR_INVALID_VALUE);
  CU_OK(p_cuGraphInstantiate(&x, g, 0));
  CU_OK(p_cuGraphDestroy(g)); /* the executable graph does not need it */
  for (int iter = 1; iter <= 3; iter++) {
    CU_OK(p_cuMemsetD32Async(a, 0, bytes / 4, s));
    CU_OK(p_cuStreamSynchronize(s));
    memset(pinned, 0, 4096);
    memset(page, 0, 4096);
    atomic_store(&gate, 0);
    CU_OK(p_cuGraphLaunch(x, s));
    CU_OK(p_cuEventRecord(ev, s));
    sleep_ms(2);
    CU_IS(p_cuEventQuery(ev), CUDA_ERROR_NOT_READY); /* held by the graph's gate */
    CHECK(atomic_load(&count) <= 2 * iter - 1);
    atomic_store(&gate, 1);
    CU_OK(p_cuEventSynchronize(ev));
    CHECK(atomic_load(&count) == 2 * iter);
    for (size_t i = 0; i < bytes / 4; i++) CHECK(w[i] == 0xabcd1234u);
    for (size_t i = 0; i < 1024; i++) CHECK(pinned[i] == 0xabcd1234u && page[i] == 0xabcd1234u);
  }

  /* A launch on a capturing stream is captured (not run), and replays with
   * the graph that captured it. */
  CU_OK(p_cuStreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(p_cuGraphLaunch(x, s2));
  CU_OK(fc_launch(s2, count_kernel, &count));
  CUgraph g2 = end_capture(s2, CUDA_SUCCESS, false);
  CU_OK(p_cuStreamSynchronize(s2));
  CHECK(atomic_load(&count) == 6);
  CUgraphExec x2;
  CU_OK(p_cuGraphInstantiate(&x2, g2, 0));
  CU_OK(p_cuGraphLaunch(x2, s2));
  CU_OK(p_cuStreamSynchronize(s2));
  CHECK(atomic_load(&count) == 9);

  /* Both executable graphs destroyed while a launch of each waits. */
  atomic_store(&gate, 0);
  CU_OK(p_cuGraphLaunch(x, s));
  CU_OK(p_cuGraphLaunch(x2, s));
  CU_OK(p_cuGraphExecDestroy(x));
  CU_OK(p_cuGraphExecDestroy(x2));
  CU_OK(p_cuGraphDestroy(g2));
  atomic_store(&gate, 1);
  CU_OK(p_cuStreamSynchronize(s));
  CHECK(atomic_load(&count) == 14);
  unsigned strict = fc_strict(0); /* destroyed handles: an abort when strict */
  CU_IS(p_cuGraphLaunch(x, s), CUDA_ERROR_INVALID_HANDLE);
  CU_IS(p_cuGraphDestroy(g2), CUDA_ERROR_INVALID_HANDLE);
  fc_strict(strict);

  CU_OK(p_cuEventDestroy(ev));
  CU_OK(p_cuMemFreeHost(pinned));
  free(page);
  CU_OK(p_cuMemFree(a));
  CU_OK(p_cuStreamDestroy(s));
  CU_OK(p_cuStreamDestroy(s2));
}

/* A replay writes to the recorded address, whatever memory is there now: a
 * memset and a kernel captured on one mapping land in another physical
 * allocation mapped at the same address since. */
typedef struct pattern_arg {
  uint32_t *p;
  size_t words;
  uint32_t value;
} pattern_arg_t;
static void pattern_kernel(void *arg) {
  pattern_arg_t *pa = arg;
  for (size_t i = 0; i < pa->words; i++) pa->p[i] = pa->value;
}

static void test_capture_replay_reused_memory(void) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  const size_t g = 2u << 20;
  CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CUdeviceptr base;
  CU_OK(p_cuMemAddressReserve(&base, g, 0, 0, 0));
  CUmemGenericAllocationHandle h1, h2;
  CU_OK(p_cuMemCreate(&h1, g, &prop, 0));
  CU_OK(p_cuMemMap(base, g, 0, h1, 0));
  CU_OK(p_cuMemSetAccess(base, g, &acc, 1));
  CUstream s;
  CU_OK(p_cuStreamCreate(&s, 0));
  uint32_t *w = (uint32_t *)(uintptr_t)base;
  pattern_arg_t pa = {w + g / 8, g / 8, 0x5eed5eedu}; /* the second half */
  CU_OK(p_cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(p_cuMemsetD32Async(base, 0xc0ffee00u, g / 8, s)); /* the first half */
  CU_OK(fc_launch(s, pattern_kernel, &pa));
  CUgraph gr = end_capture(s, CUDA_SUCCESS, false);
  CUgraphExec x;
  CU_OK(p_cuGraphInstantiate(&x, gr, 0));
  CU_OK(p_cuGraphDestroy(gr));
  /* The memory changes under the recorded address. */
  CU_OK(p_cuMemUnmap(base, g));
  CU_OK(p_cuMemRelease(h1));
  CU_OK(p_cuMemCreate(&h2, g, &prop, 0));
  CU_OK(p_cuMemMap(base, g, 0, h2, 0));
  CU_OK(p_cuMemSetAccess(base, g, &acc, 1));
  CU_OK(p_cuMemsetD32Async(base, 0x11111111u, g / 4, s));
  CU_OK(p_cuStreamSynchronize(s));
  CHECK(w[0] == 0x11111111u && w[g / 4 - 1] == 0x11111111u);
  CU_OK(p_cuGraphLaunch(x, s));
  CU_OK(p_cuStreamSynchronize(s));
  for (size_t i = 0; i < g / 8; i++) CHECK(w[i] == 0xc0ffee00u && w[g / 8 + i] == 0x5eed5eedu);
  CU_OK(p_cuGraphExecDestroy(x));
  CU_OK(p_cuStreamDestroy(s));
  CU_OK(p_cuMemUnmap(base, g));
  CU_OK(p_cuMemRelease(h2));
  CU_OK(p_cuMemAddressFree(base, g));
  CHECK(fc_used(0) == 0);
}

/* A second stream forks from the capture through an event and joins back;
 * a fork that does not join back is UNJOINED; ending on the forked stream
 * is UNMATCHED; waiting across two captures is MERGE. */
static void test_capture_fork_join(void) {
  unsigned strict = capture_lenient();
  CUstream s1, s2, s3;
  CU_OK(p_cuStreamCreate(&s1, 0));
  CU_OK(p_cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  CU_OK(p_cuStreamCreate(&s3, 0));
  CUevent e1, e2;
  CU_OK(p_cuEventCreate(&e1, CU_EVENT_DISABLE_TIMING));
  CU_OK(p_cuEventCreate(&e2, CU_EVENT_DISABLE_TIMING));
  order_log_t log = {0};
  tagged_t t[5];
  for (int i = 0; i < 5; i++) t[i] = (tagged_t){&log, i};

  CU_OK(p_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  cuuint64_t id = cap_id(s1);
  CU_OK(fc_launch(s1, log_kernel, &t[1]));
  CU_OK(p_cuEventRecord(e1, s1));
  CHECK(cap_status(s2) == CU_STREAM_CAPTURE_STATUS_NONE);
  CU_OK(p_cuStreamWaitEvent(s2, e1, 0)); /* the fork */
  CHECK(cap_status(s2) == CU_STREAM_CAPTURE_STATUS_ACTIVE && cap_id(s2) == id);
  CUstreamCaptureStatus st;
  const CUgraphNode *deps1 = NULL, *deps2 = NULL;
  size_t n1 = 0, n2 = 0;
  CU_OK(capinfo_v2(s1, &st, NULL, NULL, &deps1, &n1));
  CUgraphNode node1 = n1 == 1 ? deps1[0] : NULL;
  CU_OK(capinfo_v2(s2, &st, NULL, NULL, &deps2, &n2));
  CHECK(n2 == 1 && node1 && deps2[0] == node1); /* s2's next work follows tag 1 */
  CU_OK(fc_launch(s2, log_kernel, &t[2]));
  CU_OK(fc_launch(s1, log_kernel, &t[3]));
  CU_OK(p_cuEventRecord(e2, s2));
  CU_OK(p_cuStreamWaitEvent(s1, e2, 0)); /* the join */
  CU_OK(capinfo_v2(s1, &st, NULL, NULL, &deps1, &n1));
  CHECK(n1 == 2); /* tag 3 and tag 2 */
  CU_OK(fc_launch(s1, log_kernel, &t[4]));
  CUgraph g = end_capture(s1, CUDA_SUCCESS, false);
  CHECK(cap_status(s2) == CU_STREAM_CAPTURE_STATUS_NONE);
  CU_OK(p_cuStreamSynchronize(s1));
  CU_OK(p_cuStreamSynchronize(s2));
  CHECK(atomic_load(&log.n) == 0);
  CUgraphExec x;
  CU_OK(p_cuGraphInstantiate(&x, g, 0));
  CU_OK(p_cuGraphLaunch(x, s3));
  CU_OK(p_cuStreamSynchronize(s3));
  CHECK(atomic_load(&log.n) == 4);
  int p1 = log_pos(&log, 1), p2 = log_pos(&log, 2), p3 = log_pos(&log, 3), p4 = log_pos(&log, 4);
  CHECK(p1 >= 0 && p2 > p1 && p3 > p1 && p4 > p2 && p4 > p3);
  CU_OK(p_cuGraphExecDestroy(x));
  CU_OK(p_cuGraphDestroy(g));

  /* Forked work never waited on by the origin: UNJOINED, no graph, and the
   * forked stream stops capturing too. So is work after the join. */
  unsigned long long v0 = fc_violations();
  for (int after_join = 0; after_join < 2; after_join++) {
    CU_OK(p_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(p_cuEventRecord(e1, s1));
    CU_OK(p_cuStreamWaitEvent(s2, e1, 0));
    CU_OK(fc_launch(s2, log_kernel, &t[2]));
    if (after_join) {
      CU_OK(p_cuEventRecord(e2, s2));
      CU_OK(p_cuStreamWaitEvent(s1, e2, 0));
      CU_OK(fc_launch(s2, log_kernel, &t[2]));
    }
    end_capture(s1, CUDA_ERROR_STREAM_CAPTURE_UNJOINED, false);
    CHECK(cap_status(s2) == CU_STREAM_CAPTURE_STATUS_NONE);
  }
  /* A fork that captured nothing needs no join. */
  CU_OK(p_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(fc_launch(s1, log_kernel, &t[1]));
  CU_OK(p_cuEventRecord(e1, s1));
  CU_OK(p_cuStreamWaitEvent(s2, e1, 0));
  CU_OK(fc_launch(s1, log_kernel, &t[3]));
  end_capture(s1, CUDA_SUCCESS, true);
  CHECK(fc_violations() == v0); /* UNJOINED is the capture's result, not a misuse */

  /* Ending on the forked stream: UNMATCHED, and the capture is invalidated. */
  CU_OK(p_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(p_cuEventRecord(e1, s1));
  CU_OK(p_cuStreamWaitEvent(s2, e1, 0));
  CUgraph none = NULL;
  CU_IS(p_cuStreamEndCapture(s2, &none), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
  CHECK(cap_status(s1) == CU_STREAM_CAPTURE_STATUS_INVALIDATED &&
        cap_status(s2) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  end_capture(s1, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, false);
  CHECK(cap_status(s2) == CU_STREAM_CAPTURE_STATUS_NONE);
  CHECK(fc_violations() == v0 + 1);

  /* Two captures joined by a wait: MERGE, both invalidated. */
  CU_OK(p_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(p_cuStreamBeginCapture(s3, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cap_id(s1) != cap_id(s3));
  CU_OK(p_cuEventRecord(e1, s1));
  CU_IS(p_cuStreamWaitEvent(s3, e1, 0), CUDA_ERROR_STREAM_CAPTURE_MERGE);
  CHECK(cap_status(s1) == CU_STREAM_CAPTURE_STATUS_INVALIDATED &&
        cap_status(s3) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  end_capture(s3, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, false);
  end_capture(s1, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, false);
  CHECK(fc_violations() == v0 + 2);
  CHECK(atomic_load(&log.n) == 4); /* nothing captured ever ran */

  CU_OK(p_cuEventRecord(e1, s1)); /* recorded outside a capture: a plain event again */
  CU_OK(p_cuEventRecord(e2, s2));
  CU_OK(p_cuEventSynchronize(e1));
  CU_OK(p_cuEventDestroy(e1));
  CU_OK(p_cuEventDestroy(e2));
  CU_OK(p_cuStreamDestroy(s1));
  CU_OK(p_cuStreamDestroy(s2));
  CU_OK(p_cuStreamDestroy(s3));
  fc_strict(strict);
}

/* The potentially unsafe call rule, with a cuMemAlloc (and its cuMemFree
 * when allowed) from the capturing thread or another one, for every mode of
 * the capture and of the caller. */
typedef struct unsafe_call {
  CUstreamCaptureMode mode; /* the calling thread's */
  CUresult result;
} unsafe_call_t;

static void *unsafe_call_run(void *arg) {
  unsafe_call_t *c = arg;
  CUcontext prev;
  CU_OK(p_cuCtxGetCurrent(&prev));
  if (!prev) CU_OK(p_cuCtxSetCurrent(ctx0)); /* another thread: no context yet */
  CUstreamCaptureMode old = set_mode(c->mode);
  CUdeviceptr p = 0;
  c->result = p_cuMemAlloc(&p, 4096);
  if (c->result == CUDA_SUCCESS) CU_OK(p_cuMemFree(p));
  set_mode(old);
  if (!prev) CU_OK(p_cuCtxSetCurrent(NULL));
  return NULL;
}

static bool prohibited(CUstreamCaptureMode began, bool same_thread, CUstreamCaptureMode caller) {
  bool own = same_thread && began != CU_STREAM_CAPTURE_MODE_RELAXED;
  if (caller == CU_STREAM_CAPTURE_MODE_GLOBAL) return own || began == CU_STREAM_CAPTURE_MODE_GLOBAL;
  if (caller == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) return own;
  return false;
}

static void test_capture_modes(void) {
  unsigned strict = capture_lenient();
  CUstream s;
  CU_OK(p_cuStreamCreate(&s, 0));
  int checked = 0;
  for (int began = 0; began < 3; began++) {
    for (int same = 0; same < 2; same++) {
      for (int caller = 0; caller < 3; caller++) {
        CU_OK(p_cuStreamBeginCapture(s, (CUstreamCaptureMode)began));
        unsigned long long v0 = fc_violations(), used = fc_used(0);
        unsafe_call_t c = {(CUstreamCaptureMode)caller, CUDA_ERROR_UNKNOWN};
        if (same) {
          unsafe_call_run(&c);
        } else {
          pthread_t t;
          CHECK(pthread_create(&t, NULL, unsafe_call_run, &c) == 0);
          pthread_join(t, NULL);
        }
        bool no = prohibited((CUstreamCaptureMode)began, same, (CUstreamCaptureMode)caller);
        if (c.result != (no ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS) ||
            fc_violations() != v0 + no || fc_used(0) != used ||
            cap_status(s) != (no ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                 : CU_STREAM_CAPTURE_STATUS_ACTIVE)) {
          fprintf(stderr, "capture begun in %s, cuMemAlloc from %s thread in %s mode: %d\n",
                  began == 0 ? "GLOBAL" : began == 1 ? "THREAD_LOCAL" : "RELAXED",
                  same ? "the same" : "another", caller == 0 ? "GLOBAL" : caller == 1 ? "THREAD_LOCAL" : "RELAXED",
                  (int)c.result);
          exit(1);
        }
        end_capture(s, no ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS, true);
        checked += no;
      }
    }
  }
  CHECK(checked == 5); /* GLOBAL capture: 3 (own: GLOBAL, THREAD_LOCAL; other: GLOBAL), THREAD_LOCAL: 2 */
  CU_OK(p_cuStreamDestroy(s));
  fc_strict(strict);
}

/* Every potentially unsafe call of the fake's list (fakecuda.h) is refused
 * during the thread's own GLOBAL capture, invalidates it, and does nothing:
 * the resources it names are still there afterwards. */
static struct unsafe_res {
  CUstream other;
  CUevent ev;
  CUdeviceptr a;
  void *host;
  CUmemGenericAllocationHandle h, mapped_h;
  CUdeviceptr resv, mapped;
  CUmemAllocationProp prop;
  CUmemAccessDesc acc;
  uint32_t page[4];
} ur;

static CUresult u_mem_alloc(void) {
  CUdeviceptr p;
  return p_cuMemAlloc(&p, 4096);
}
static CUresult u_mem_free(void) { return p_cuMemFree(ur.a); }
static CUresult u_host_alloc(void) {
  void *p;
  return p_cuMemHostAlloc(&p, 4096, 0);
}
static CUresult u_free_host(void) { return p_cuMemFreeHost(ur.host); }
static CUresult u_create(void) {
  CUmemGenericAllocationHandle h;
  return p_cuMemCreate(&h, 2u << 20, &ur.prop, 0);
}
static CUresult u_release(void) { return p_cuMemRelease(ur.h); }
static CUresult u_map(void) { return p_cuMemMap(ur.resv, 2u << 20, 0, ur.h, 0); }
static CUresult u_unmap(void) { return p_cuMemUnmap(ur.mapped, 2u << 20); }
static CUresult u_set_access(void) { return p_cuMemSetAccess(ur.mapped, 2u << 20, &ur.acc, 1); }
static CUresult u_reserve(void) {
  CUdeviceptr p;
  return p_cuMemAddressReserve(&p, 2u << 20, 0, 0, 0);
}
static CUresult u_address_free(void) { return p_cuMemAddressFree(ur.resv, 4u << 20); }
static CUresult u_ctx_sync(void) { return p_cuCtxSynchronize(); }
static CUresult u_stream_sync(void) { return p_cuStreamSynchronize(ur.other); }
static CUresult u_stream_query(void) { return p_cuStreamQuery(ur.other); }
static CUresult u_event_sync(void) { return p_cuEventSynchronize(ur.ev); }
static CUresult u_event_query(void) { return p_cuEventQuery(ur.ev); }
static CUresult u_copy_pageable(void) {
  return p_cuMemcpyDtoHAsync(ur.page, ur.a, sizeof ur.page, ur.other);
}

static const struct {
  const char *name;
  CUresult (*call)(void);
} unsafe_calls[] = {
    {"cuMemAlloc", u_mem_alloc},           {"cuMemFree", u_mem_free},
    {"cuMemHostAlloc", u_host_alloc},      {"cuMemFreeHost", u_free_host},
    {"cuMemCreate", u_create},             {"cuMemRelease", u_release},
    {"cuMemMap", u_map},                   {"cuMemUnmap", u_unmap},
    {"cuMemSetAccess", u_set_access},      {"cuMemAddressReserve", u_reserve},
    {"cuMemAddressFree", u_address_free},  {"cuCtxSynchronize", u_ctx_sync},
    {"cuStreamSynchronize", u_stream_sync}, {"cuStreamQuery", u_stream_query},
    {"cuEventSynchronize", u_event_sync},  {"cuEventQuery", u_event_query},
    {"cuMemcpyDtoHAsync (pageable)", u_copy_pageable},
};

static void test_capture_unsafe_calls(void) {
  unsigned strict = capture_lenient();
  CUstream s;
  CU_OK(p_cuStreamCreate(&s, 0));
  CU_OK(p_cuStreamCreate(&ur.other, 0));
  CU_OK(p_cuEventCreate(&ur.ev, 0));
  CU_OK(p_cuEventRecord(ur.ev, ur.other));
  CU_OK(p_cuMemAlloc(&ur.a, 4096));
  CU_OK(p_cuMemHostAlloc(&ur.host, 4096, 0));
  ur.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  ur.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ur.acc = (CUmemAccessDesc){{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CU_OK(p_cuMemAddressReserve(&ur.resv, 4u << 20, 0, 0, 0));
  ur.mapped = ur.resv + (2u << 20);
  CU_OK(p_cuMemCreate(&ur.h, 2u << 20, &ur.prop, 0));
  CU_OK(p_cuMemCreate(&ur.mapped_h, 2u << 20, &ur.prop, 0));
  CU_OK(p_cuMemMap(ur.mapped, 2u << 20, 0, ur.mapped_h, 0));
  unsigned long long used = fc_used(0);
  for (size_t i = 0; i < sizeof unsafe_calls / sizeof unsafe_calls[0]; i++) {
    CU_OK(p_cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    unsigned long long v0 = fc_violations();
    CUresult r = unsafe_calls[i].call();
    if (r != CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED || fc_violations() != v0 + 1 ||
        cap_status(s) != CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
      fprintf(stderr, "%s during a GLOBAL capture returned %d\n", unsafe_calls[i].name, (int)r);
      exit(1);
    }
    end_capture(s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, false);
  }
  CHECK(fc_used(0) == used);
  /* Not unsafe: an asynchronous copy into pinned memory on another stream,
   * and the capture queries. */
  CU_OK(p_cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(p_cuMemcpyDtoHAsync(ur.host, ur.a, 16, ur.other));
  CHECK(cap_status(s) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  end_capture(s, CUDA_SUCCESS, true);
  /* Nothing was done: everything is still there to give back. */
  CU_OK(p_cuStreamSynchronize(ur.other));
  CU_OK(p_cuMemUnmap(ur.mapped, 2u << 20));
  CU_OK(p_cuMemRelease(ur.mapped_h));
  CU_OK(p_cuMemRelease(ur.h));
  CU_OK(p_cuMemAddressFree(ur.resv, 4u << 20));
  CU_OK(p_cuMemFreeHost(ur.host));
  CU_OK(p_cuMemFree(ur.a));
  CU_OK(p_cuEventDestroy(ur.ev));
  CU_OK(p_cuStreamDestroy(ur.other));
  CU_OK(p_cuStreamDestroy(s));
  CHECK(fc_used(0) == 0);
  fc_strict(strict);
}

static void *end_capture_thread(void *arg) {
  CUstream s = *(CUstream *)arg;
  CUgraph g = NULL;
  CUresult r = p_cuStreamEndCapture(s, &g);
  if (r == CUDA_SUCCESS) CU_OK(p_cuGraphDestroy(g));
  *(CUresult *)arg = r; /* CUstream and CUresult share the slot: the stream is read first */
  return NULL;
}

/* Ends the capture on s from another thread; its result. */
static CUresult end_elsewhere(CUstream s) {
  union {
    CUstream s;
    CUresult r;
  } slot = {.s = s};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, end_capture_thread, &slot) == 0);
  pthread_join(t, NULL);
  return slot.r;
}

/* CAPTURED_EVENT, ISOLATION, a capturing stream synchronized, queried or
 * destroyed, cuCtxSynchronize during a capture of the device (and not of
 * another device), WRONG_THREAD, and the legacy stream's IMPLICIT. */
static void test_capture_errors(void) {
  unsigned strict = capture_lenient();
  CUstream s, s2, nb;
  CU_OK(p_cuStreamCreate(&s, 0));
  CU_OK(p_cuStreamCreate(&s2, 0));
  CU_OK(p_cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
  CUevent ev, plain;
  CU_OK(p_cuEventCreate(&ev, 0));
  CU_OK(p_cuEventCreate(&plain, 0));
  unsigned long long v0 = fc_violations();

  /* A captured event cannot be queried or waited for, in any mode; the
   * capture goes on. Still so after the capture ended, until recorded
   * outside one. */
  CU_OK(p_cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(p_cuEventRecord(ev, s));
  for (int m = 0; m < 3; m++) {
    CUstreamCaptureMode old = set_mode((CUstreamCaptureMode)m);
    CU_IS(p_cuEventQuery(ev), CUDA_ERROR_CAPTURED_EVENT);
    CU_IS(p_cuEventSynchronize(ev), CUDA_ERROR_CAPTURED_EVENT);
    set_mode(old);
  }
  CHECK(cap_status(s) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CHECK(fc_violations() == v0 + 6);
  end_capture(s, CUDA_SUCCESS, true);
  CU_IS(p_cuEventQuery(ev), CUDA_ERROR_CAPTURED_EVENT);
  CU_IS(p_cuStreamWaitEvent(s2, ev, 0), CUDA_ERROR_CAPTURED_EVENT);
  CU_OK(p_cuEventRecord(ev, s));
  CU_OK(p_cuEventSynchronize(ev));
  CHECK(fc_violations() == v0 + 8);

  /* A capturing stream waiting on an event recorded outside the capture:
   * ISOLATION, invalidated; its later work, records and waits say so. */
  CU_OK(p_cuEventRecord(plain, s2));
  CU_OK(p_cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(p_cuStreamWaitEvent(s, plain, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  CHECK(cap_status(s) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CU_OK(capinfo_v2(s, &st, NULL, NULL, NULL, NULL));
  CHECK(st == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  atomic_int count = 0;
  CU_IS(fc_launch(s, count_kernel, &count), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CU_IS(p_cuEventRecord(ev, s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CU_IS(p_cuMemsetD32Async(0, 0, 0, s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  end_capture(s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, false);
  CU_OK(p_cuStreamSynchronize(s)); /* an ordinary stream again */
  CHECK(atomic_load(&count) == 0 && fc_violations() == v0 + 9);

  /* Synchronizing, querying or destroying a capturing stream: refused even
   * in a RELAXED capture, and invalidating; the stream stays. */
  for (int k = 0; k < 3; k++) {
    CU_OK(p_cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CUresult r = k == 0 ? p_cuStreamSynchronize(s) : k == 1 ? p_cuStreamQuery(s)
                                                            : p_cuStreamDestroy(s);
    CU_IS(r, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK(cap_status(s) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    end_capture(s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, false);
  }
  CU_OK(p_cuStreamQuery(s));
  CHECK(fc_violations() == v0 + 12);

  /* cuCtxSynchronize waits for the whole device: refused while one of its
   * streams captures (even RELAXED), not for a capture on another device. */
  CU_OK(p_cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CU_IS(p_cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  end_capture(s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, false);
  CU_OK(p_cuCtxPushCurrent(ctx1));
  CUstream s1;
  CU_OK(p_cuStreamCreate(&s1, 0));
  CUcontext c;
  CU_OK(p_cuCtxPopCurrent(&c));
  CU_OK(p_cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
  CU_OK(p_cuCtxSynchronize()); /* device 0's */
  end_capture(s1, CUDA_SUCCESS, true);
  CU_OK(p_cuStreamDestroy(s1));
  CHECK(fc_violations() == v0 + 13);

  /* Ending from another thread: refused unless the capture is RELAXED; a
   * refused end leaves it going. */
  for (int m = 0; m < 3; m++) {
    CU_OK(p_cuStreamBeginCapture(s, (CUstreamCaptureMode)m));
    CUresult r = end_elsewhere(s);
    if (m == CU_STREAM_CAPTURE_MODE_RELAXED) {
      CU_OK(r);
      CHECK(cap_status(s) == CU_STREAM_CAPTURE_STATUS_NONE);
    } else {
      CU_IS(r, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
      CHECK(cap_status(s) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
      end_capture(s, CUDA_SUCCESS, true);
    }
  }
  CHECK(fc_violations() == v0 + 15);

  /* The legacy stream while a blocking stream captures: the queries say
   * IMPLICIT and leave the capture (no violation: asking is how a caller
   * stays off it); work on it is IMPLICIT and invalidates.
   * A non-blocking stream's capture leaves the legacy stream alone. */
  CU_OK(p_cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(p_cuStreamIsCapturing(CU_STREAM_LEGACY, &st), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  CU_IS(p_cuStreamIsCapturing(NULL, &st), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  CU_IS(capinfo_v2(NULL, &st, NULL, NULL, NULL, NULL), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  CHECK(cap_status(s) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CU_IS(fc_launch(NULL, count_kernel, &count), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  CHECK(cap_status(s) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  end_capture(s, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, false);
  CHECK(fc_violations() == v0 + 16);
  CU_OK(p_cuStreamBeginCapture(nb, CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK(cap_status(CU_STREAM_LEGACY) == CU_STREAM_CAPTURE_STATUS_NONE);
  CU_OK(fc_launch(CU_STREAM_LEGACY, count_kernel, &count));
  CU_OK(p_cuEventRecord(plain, NULL));
  CU_OK(p_cuEventSynchronize(plain));
  CHECK(atomic_load(&count) == 1 && cap_status(nb) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  end_capture(nb, CUDA_SUCCESS, true);
  CHECK(fc_violations() == v0 + 16);

  CU_OK(p_cuEventDestroy(ev));
  CU_OK(p_cuEventDestroy(plain));
  CU_OK(p_cuStreamDestroy(s));
  CU_OK(p_cuStreamDestroy(s2));
  CU_OK(p_cuStreamDestroy(nb));
  fc_strict(strict);
}

/* The misuse scenarios, each run in a child (main with argv[1]); each
 * returns the misuse call's result, which a strict fake never lets it see.
 * child_gate holds the queued work of the pending ones until the child ends. */
static atomic_int child_gate;

static CUresult misuse_stream_destroyed(void) {
  CUstream s;
  CU_OK(p_cuStreamCreate(&s, 0));
  CU_OK(p_cuStreamDestroy(s));
  return p_cuStreamSynchronize(s);
}

static CUresult misuse_event_destroyed(void) {
  CUevent ev;
  CU_OK(p_cuEventCreate(&ev, 0));
  CU_OK(p_cuEventDestroy(ev));
  return p_cuEventRecord(ev, NULL);
}

static CUresult misuse_wait_cross_device(void) {
  CUevent ev1;
  CU_OK(p_cuCtxPushCurrent(ctx1));
  CU_OK(p_cuEventCreate(&ev1, 0));
  CUcontext c;
  CU_OK(p_cuCtxPopCurrent(&c));
  CUstream s;
  CU_OK(p_cuStreamCreate(&s, 0));
  return p_cuStreamWaitEvent(s, ev1, 0);
}

static CUresult misuse_free_pending(void) {
  CUstream s;
  CU_OK(p_cuStreamCreate(&s, 0));
  CUdeviceptr a;
  CU_OK(p_cuMemAlloc(&a, 1 << 20));
  CU_OK(fc_launch(s, gate_kernel, &child_gate));
  CU_OK(p_cuMemsetD32Async(a + 4096, 1, 16, s));
  return p_cuMemFree(a);
}

static CUresult misuse_unmap_pending(void) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  size_t g = 2u << 20;
  CUdeviceptr base;
  CU_OK(p_cuMemAddressReserve(&base, 2 * g, 0, 0, 0));
  CUmemGenericAllocationHandle h;
  CU_OK(p_cuMemCreate(&h, g, &prop, 0));
  CU_OK(p_cuMemMap(base + g, g, 0, h, 0));
  CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CU_OK(p_cuMemSetAccess(base + g, g, &acc, 1));
  CUstream s;
  CU_OK(p_cuStreamCreate(&s, 0));
  CU_OK(fc_launch(s, gate_kernel, &child_gate));
  static uint32_t src[64];
  CU_OK(p_cuMemcpyHtoDAsync(base + 2 * g - sizeof src, src, sizeof src, s));
  return p_cuMemUnmap(base + g, g);
}

/* The capture misuses: each breaks one rule during a capture on a new
 * stream (blocking, so that the legacy stream conflicts with it). */
static CUstream misuse_capture(CUstreamCaptureMode mode) {
  CUstream s;
  CU_OK(p_cuStreamCreate(&s, 0));
  CU_OK(p_cuStreamBeginCapture(s, mode));
  return s;
}

static CUresult misuse_capture_unsafe(void) {
  misuse_capture(CU_STREAM_CAPTURE_MODE_GLOBAL);
  CUdeviceptr p;
  return p_cuMemAlloc(&p, 4096);
}

static CUresult misuse_captured_event(void) {
  CUevent ev;
  CU_OK(p_cuEventCreate(&ev, 0));
  CU_OK(p_cuEventRecord(ev, misuse_capture(CU_STREAM_CAPTURE_MODE_RELAXED)));
  return p_cuEventQuery(ev);
}

static CUresult misuse_capture_isolation(void) {
  CUevent ev;
  CU_OK(p_cuEventCreate(&ev, 0));
  CU_OK(p_cuEventRecord(ev, NULL));
  return p_cuStreamWaitEvent(misuse_capture(CU_STREAM_CAPTURE_MODE_GLOBAL), ev, 0);
}

static CUresult misuse_capture_implicit(void) {
  misuse_capture(CU_STREAM_CAPTURE_MODE_GLOBAL);
  static atomic_int count;
  return fc_launch(NULL, count_kernel, &count);
}

static CUresult misuse_capture_wrong_thread(void) {
  return end_elsewhere(misuse_capture(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
}

static CUresult misuse_capture_sync(void) {
  return p_cuStreamSynchronize(misuse_capture(CU_STREAM_CAPTURE_MODE_RELAXED));
}

static CUresult misuse_capture_legacy(void) {
  return p_cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_RELAXED);
}

static const struct misuse {
  const char *name;
  CUresult (*run)(void);
  const char *check;   /* the check that stops it */
  const char *says;    /* in the abort message */
  CUresult lenient;    /* the result without the check */
} misuses[] = {
    {"stream-destroyed", misuse_stream_destroyed, "handles", "cuStreamSynchronize: stream 0x",
     CUDA_ERROR_INVALID_HANDLE},
    {"event-destroyed", misuse_event_destroyed, "handles", "cuEventRecord: event 0x",
     CUDA_ERROR_INVALID_HANDLE},
    {"wait-cross-device", misuse_wait_cross_device, "handles", "cuStreamWaitEvent: stream 0x",
     CUDA_ERROR_INVALID_HANDLE},
    {"free-pending", misuse_free_pending, "pending", "cuMemsetD32Async on stream", CUDA_SUCCESS},
    {"unmap-pending", misuse_unmap_pending, "pending", "cuMemcpyHtoDAsync on stream",
     CUDA_SUCCESS},
    {"capture-unsafe", misuse_capture_unsafe, "capture",
     "cuMemAlloc: a potentially unsafe call from a thread in GLOBAL capture mode while capture 1",
     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED},
    {"capture-event", misuse_captured_event, "capture",
     "cuEventQuery: event 0x", CUDA_ERROR_CAPTURED_EVENT},
    {"capture-isolation", misuse_capture_isolation, "capture",
     "cuStreamWaitEvent: capturing stream 0x", CUDA_ERROR_STREAM_CAPTURE_ISOLATION},
    {"capture-implicit", misuse_capture_implicit, "capture",
     "fakecuda_launch: the legacy stream (NULL) used while blocking stream 0x",
     CUDA_ERROR_STREAM_CAPTURE_IMPLICIT},
    {"capture-wrong-thread", misuse_capture_wrong_thread, "capture",
     "cuStreamEndCapture: capture 1 on stream 0x", CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD},
    {"capture-sync", misuse_capture_sync, "capture", "cuStreamSynchronize: stream 0x",
     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED},
    {"capture-legacy", misuse_capture_legacy, "capture",
     "cuStreamBeginCapture: capture on the legacy stream (CU_STREAM_LEGACY)", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED},
};
#define NMISUSES (sizeof misuses / sizeof misuses[0])

/* The child: the driver up with both contexts retained and device 0's
 * current, then the misuse; reaching the end means it was not stopped. */
static int child_main(const char *name) {
  load();
  CU_OK(p_cuInit(0));
  CU_OK(p_cuDevicePrimaryCtxRetain(&ctx0, 0));
  CU_OK(p_cuDevicePrimaryCtxRetain(&ctx1, 1));
  CU_OK(p_cuCtxSetCurrent(ctx0));
  for (size_t i = 0; i < NMISUSES; i++) {
    if (strcmp(misuses[i].name, name) != 0) continue;
    CUresult r = misuses[i].run();
    atomic_store(&child_gate, 1);
    fprintf(stderr, "misuse %s returned %d\n", name, (int)r);
    return 0;
  }
  fprintf(stderr, "unknown misuse %s\n", name);
  return 2;
}

typedef struct child_exec {
  char **argv, **envp;
} child_exec_t;

static void exec_body(void *arg) {
  child_exec_t *x = arg;
  execve("/proc/self/exe", x->argv, x->envp);
  _exit(127);
}

/* Runs this program as the child for misuse name, GMA_FAKECUDA_STRICT set
 * to strict (NULL: unset); returns its wait status, its stderr in out. */
static int run_child(const char *name, const char *strict, char *out, size_t cap) {
  extern char **environ;
  size_t n = 0;
  while (environ[n]) n++;
  char **envp = calloc(n + 2, sizeof *envp);
  CHECK(envp);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "GMA_FAKECUDA_STRICT=", 20) != 0) envp[k++] = environ[i];
  char var[64];
  if (strict) {
    snprintf(var, sizeof var, "GMA_FAKECUDA_STRICT=%s", strict);
    envp[k++] = var;
  }
  char *argv[] = {"test_fakecuda_driver", (char *)name, NULL};
  child_exec_t x = {argv, envp};
  int status = child_run(exec_body, &x, out, cap);
  free(envp);
  return status;
}

static void test_misuse_aborts(void) {
  static char out[1 << 16];
  for (size_t i = 0; i < NMISUSES; i++) {
    const struct misuse *m = &misuses[i];
    int st = run_child(m->name, NULL, out, sizeof out);
    char check[64];
    snprintf(check, sizeof check, "so the fake driver aborts (check \"%s\"", m->check);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGABRT || !strstr(out, m->says) ||
        !strstr(out, check)) {
      fprintf(stderr, "misuse %s was not stopped as expected (status 0x%x); its stderr:\n%s\n",
              m->name, st, out);
      exit(1);
    }
    printf("misuse %s: aborted: %.*s\n", m->name, (int)strcspn(out, "\n"), out);
    /* Without the check (GMA_FAKECUDA_STRICT=none, or the other checks
     * only), the call returns. */
    const char *other = strcmp(m->check, "handles") == 0   ? "pending,capture"
                        : strcmp(m->check, "pending") == 0 ? "handles,capture"
                                                           : "handles,pending";
    const char *lenient[] = {other, "none"};
    /* "none" is checked with the handle and pending misuses; each capture
     * misuse runs once more only (TSan makes every child slow). */
    int nlenient = strcmp(m->check, "capture") == 0 ? 1 : 2;
    for (int j = 0; j < nlenient; j++) {
      st = run_child(m->name, lenient[j], out, sizeof out);
      char want[64];
      snprintf(want, sizeof want, "misuse %s returned %d\n", m->name, (int)m->lenient);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !strstr(out, want)) {
        fprintf(stderr, "misuse %s with GMA_FAKECUDA_STRICT=%s: status 0x%x, stderr:\n%s\n",
                m->name, lenient[j], st, out);
        exit(1);
      }
    }
  }
}

/* A copy queued behind a held kernel, whose memory is freed before it runs:
 * the device faults (sticky), every later call on it says so, and a reset of
 * the primary context clears it. */
static void test_sticky_fault_and_reset(void) {
  /* The free under a queued memset and the stream gone with the reset are
   * the misuse the strict checks abort on; the sticky fault is what the
   * fake does without them. */
  unsigned strict = fc_strict(0);
  CUstream s;
  CU_OK(p_cuStreamCreate(&s, 0));
  CUdeviceptr a;
  CU_OK(p_cuMemAlloc(&a, 1 << 20));
  atomic_int gate = 0;
  CU_OK(fc_launch(s, gate_kernel, &gate));
  CU_OK(p_cuMemsetD32Async(a, 7, 1024, s));
  CU_OK(p_cuMemFree(a)); /* the fake does not synchronize here, by design */
  atomic_store(&gate, 1);
  CU_IS(p_cuStreamSynchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS);
  CU_IS(p_cuMemAlloc(&a, 4096), CUDA_ERROR_ILLEGAL_ADDRESS);
  CU_IS(p_cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);

  /* The last release resets the device; what was left is freed (a leak
   * report on stderr), and the context, still current, is destroyed. */
  CU_OK(p_cuDevicePrimaryCtxRelease(0));
  CU_IS(p_cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
  CUcontext c;
  CU_OK(p_cuCtxGetCurrent(&c));
  CHECK(c == ctx0);
  CU_IS(p_cuMemAlloc(&a, 4096), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CU_IS(p_cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE); /* gone with the reset */
  CU_OK(p_cuDevicePrimaryCtxRetain(&c, 0));
  CHECK(c == ctx0);
  CU_OK(p_cuMemAlloc(&a, 4096));
  CU_OK(p_cuCtxSynchronize());
  CU_OK(p_cuDevicePrimaryCtxRelease(0)); /* leaks a on purpose: the reset frees it */
  CHECK(fc_used(0) == 0);
  CU_OK(p_cuDevicePrimaryCtxRelease(1));
  CU_OK(p_cuCtxSetCurrent(NULL));
  fc_strict(strict);
}

int main(int argc, char **argv) {
  if (argc > 1) return child_main(argv[1]);
  load();
  test_before_init();
  test_devices();
  test_contexts();
  test_memory();
  test_streams_events();
  test_vmm();
  test_event_after_work();
  test_copy_to_host();
  test_capture_basics();
  test_capture_replay();
  test_capture_replay_reused_memory();
  test_capture_fork_join();
  test_capture_modes();
  test_capture_unsafe_calls();
  test_capture_errors();
  test_misuse_aborts();
  test_sticky_fault_and_reset();
  fc_clear();
  printf("fakecuda driver: all checks passed\n");
  return 0;
}
