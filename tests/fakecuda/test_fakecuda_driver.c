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
 * Strictness (fakecuda.h, FAKECUDA_STRICT_*): an event completes only after
 * the work queued before it has run (the memory shows it); a copy into
 * pageable host memory has completed when cuMemcpyDtoHAsync returns, one
 * into cuMemHostAlloc memory has not; and each misuse the fake aborts on
 * (a destroyed stream or event, a wait across devices, cuMemFree and
 * cuMemUnmap under a queued copy) is run in a child process (this program
 * again, argv[1] naming the misuse) that must die of SIGABRT with a message
 * naming the entry point, and, with GMA_FAKECUDA_STRICT=none, must get the
 * error code instead. The parent's own checks of those error codes turn
 * the checks off around them with fakecuda_strict. */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
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
  X(cuMemHostAlloc) X(cuMemFreeHost)

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

static const struct misuse {
  const char *name;
  CUresult (*run)(void);
  const char *says;    /* in the abort message */
  CUresult lenient;    /* the result without the check */
} misuses[] = {
    {"stream-destroyed", misuse_stream_destroyed, "cuStreamSynchronize: stream 0x",
     CUDA_ERROR_INVALID_HANDLE},
    {"event-destroyed", misuse_event_destroyed, "cuEventRecord: event 0x", CUDA_ERROR_INVALID_HANDLE},
    {"wait-cross-device", misuse_wait_cross_device, "cuStreamWaitEvent: stream 0x",
     CUDA_ERROR_INVALID_HANDLE},
    {"free-pending", misuse_free_pending, "cuMemsetD32Async on stream", CUDA_SUCCESS},
    {"unmap-pending", misuse_unmap_pending, "cuMemcpyHtoDAsync on stream", CUDA_SUCCESS},
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
  int fds[2];
  CHECK(pipe(fds) == 0);
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    execve("/proc/self/exe", argv, envp);
    _exit(127);
  }
  close(fds[1]);
  size_t len = 0;
  ssize_t got;
  while ((got = read(fds[0], out + len, cap - 1 - len)) > 0) len += (size_t)got;
  out[len] = '\0';
  close(fds[0]);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  free(envp);
  return status;
}

static void test_misuse_aborts(void) {
  static char out[1 << 16];
  for (size_t i = 0; i < NMISUSES; i++) {
    const struct misuse *m = &misuses[i];
    int st = run_child(m->name, NULL, out, sizeof out);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGABRT || !strstr(out, m->says) ||
        !strstr(out, "undefined on a GPU")) {
      fprintf(stderr, "misuse %s was not stopped as expected (status 0x%x); its stderr:\n%s\n",
              m->name, st, out);
      exit(1);
    }
    printf("misuse %s: aborted: %.*s\n", m->name, (int)strcspn(out, "\n"), out);
    /* Without the check (GMA_FAKECUDA_STRICT=none, or the other check
     * only), the call returns. */
    const char *other = m->lenient == CUDA_SUCCESS ? "handles" : "pending";
    const char *lenient[] = {"none", other};
    for (int j = 0; j < 2; j++) {
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
  test_misuse_aborts();
  test_sticky_fault_and_reset();
  fc_clear();
  printf("fakecuda driver: all checks passed\n");
  return 0;
}
