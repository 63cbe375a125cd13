/* The GPU tests' own line to the CUDA driver: the few calls a test needs to
 * put data into gma's blocks and read it back (stream-ordered memset and
 * copy to host, events to order one stream after another), loaded the way
 * gma loads the driver: dlopen of GMA_CUDA_DRIVER, else libcuda.so.1, then
 * cuGetProcAddress. With the fake driver the dlopen returns gma's own handle,
 * so both see one driver.
 *
 * Self-contained on purpose: the driver ABI types are spelled out here
 * instead of coming from cuda.h, so the gpu_* tests build (and skip) on
 * machines without the CUDA Toolkit too.
 *
 * Usage: create the allocator first (a test skips when that gives
 * GMA_ERR_NO_DEVICE), then drv_open(), then drv_bind_thread() on every
 * thread that calls a drv_* function: it makes device 0's primary context
 * current there, as a CUDA program's threads would have it. Every drv_*
 * call that fails prints the driver's error and exits 1. */
#ifndef GMA_TEST_DRV_H
#define GMA_TEST_DRV_H

#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"
#include "gma.h"

typedef int drv_result_t; /* CUresult (an enum, int-sized) */
typedef unsigned long long drv_ptr_t; /* CUdeviceptr */
typedef void *drv_context_t, *drv_event_t;

#define DRV_SUCCESS 0
#define DRV_ERROR_NOT_READY 600
#define DRV_EVENT_DISABLE_TIMING 0x2

typedef struct drv {
  void *lib;
  drv_context_t ctx; /* device 0's primary context, retained until exit */
  drv_result_t (*cuInit)(unsigned);
  drv_result_t (*cuDeviceGet)(int *, int);
  drv_result_t (*cuDevicePrimaryCtxRetain)(drv_context_t *, int);
  drv_result_t (*cuCtxSetCurrent)(drv_context_t);
  drv_result_t (*cuCtxGetCurrent)(drv_context_t *);
  drv_result_t (*cuMemsetD32Async)(drv_ptr_t, unsigned, size_t, void *);
  drv_result_t (*cuMemcpyDtoHAsync)(void *, drv_ptr_t, size_t, void *);
  drv_result_t (*cuStreamSynchronize)(void *);
  drv_result_t (*cuEventCreate)(drv_event_t *, unsigned);
  drv_result_t (*cuEventRecord)(drv_event_t, void *);
  drv_result_t (*cuEventDestroy)(drv_event_t);
  drv_result_t (*cuStreamWaitEvent)(void *, drv_event_t, unsigned);
  drv_result_t (*cuGetErrorName)(drv_result_t, const char **);
  drv_result_t (*cuMemHostAlloc)(void **, size_t, unsigned);
  drv_result_t (*cuMemFreeHost)(void *);
  drv_result_t (*cuMemHostGetDevicePointer)(drv_ptr_t *, void *, unsigned);
  /* NULL when the driver has no stream memory operations: then drv_hold
   * holds nothing (and says so once). */
  drv_result_t (*cuStreamWaitValue32)(void *, drv_ptr_t, uint32_t, unsigned);
  /* The fake driver's byte counter (fakecuda_used), NULL on a real driver. */
  unsigned long long (*fake_used)(int);
} drv_t;

static drv_t drv;

static inline void drv_check(drv_result_t r, const char *what, const char *file, int line) {
  if (r == DRV_SUCCESS) return;
  const char *name = NULL;
  if (drv.cuGetErrorName) drv.cuGetErrorName(r, &name);
  fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", file, line, what, name ? name : "?", r);
  exit(1);
}
#define DRV_CHECK(call) drv_check((call), #call, __FILE__, __LINE__)

static inline void *drv_proc(void *get_proc, const char *name) {
  typedef drv_result_t (*get_proc_t)(const char *, void **, int, unsigned long long, int *);
  void *fn = NULL;
  int status = -1;
  drv_result_t r = ((get_proc_t)get_proc)(name, &fn, 12000, 0 /* DEFAULT */, &status);
  if (r != DRV_SUCCESS || !fn || status != 0) {
    fprintf(stderr, "drv: cuGetProcAddress(%s) failed (%d, status %d)\n", name, r, status);
    exit(1);
  }
  return fn;
}

/* Loads the driver and retains device 0's primary context. Call once, after
 * gma_create succeeded with device:cuda (so a driver is there). */
static inline void drv_open(void) {
  const char *path = getenv("GMA_CUDA_DRIVER");
  if (!path || !*path) path = "libcuda.so.1";
  drv.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!drv.lib) {
    fprintf(stderr, "drv: dlopen(%s): %s\n", path, dlerror());
    exit(1);
  }
  void *gp = dlsym(drv.lib, "cuGetProcAddress_v2");
  if (!gp) {
    fprintf(stderr, "drv: %s has no cuGetProcAddress_v2\n", path);
    exit(1);
  }
#define DRV_LOAD_(name) drv.name = (__typeof__(drv.name))drv_proc(gp, #name)
  DRV_LOAD_(cuGetErrorName);
  DRV_LOAD_(cuInit);
  DRV_LOAD_(cuDeviceGet);
  DRV_LOAD_(cuDevicePrimaryCtxRetain);
  DRV_LOAD_(cuCtxSetCurrent);
  DRV_LOAD_(cuCtxGetCurrent);
  DRV_LOAD_(cuMemsetD32Async);
  DRV_LOAD_(cuMemcpyDtoHAsync);
  DRV_LOAD_(cuStreamSynchronize);
  DRV_LOAD_(cuEventCreate);
  DRV_LOAD_(cuEventRecord);
  DRV_LOAD_(cuEventDestroy);
  DRV_LOAD_(cuStreamWaitEvent);
  DRV_LOAD_(cuMemHostAlloc);
  DRV_LOAD_(cuMemFreeHost);
  DRV_LOAD_(cuMemHostGetDevicePointer);
#undef DRV_LOAD_
  {
    typedef drv_result_t (*get_proc_t)(const char *, void **, int, unsigned long long, int *);
    void *fn = NULL;
    int status = -1;
    if (((get_proc_t)gp)("cuStreamWaitValue32", &fn, 12000, 0, &status) == DRV_SUCCESS &&
        status == 0)
      drv.cuStreamWaitValue32 = (__typeof__(drv.cuStreamWaitValue32))fn;
  }
  drv.fake_used = (unsigned long long (*)(int))dlsym(drv.lib, "fakecuda_used");
  DRV_CHECK(drv.cuInit(0));
  int dev = 0;
  DRV_CHECK(drv.cuDeviceGet(&dev, 0));
  DRV_CHECK(drv.cuDevicePrimaryCtxRetain(&drv.ctx, dev));
}

/* Makes device 0's primary context current on the calling thread. */
static inline void drv_bind_thread(void) { DRV_CHECK(drv.cuCtxSetCurrent(drv.ctx)); }

/* The calling thread's current context (NULL: none). */
static inline drv_context_t drv_current(void) {
  drv_context_t c = NULL;
  DRV_CHECK(drv.cuCtxGetCurrent(&c));
  return c;
}

/* Fills bytes (a multiple of 4) at p with the 32-bit value v, on stream s. */
static inline void drv_memset32(void *p, uint32_t v, size_t bytes, gma_stream_t s) {
  DRV_CHECK(drv.cuMemsetD32Async((drv_ptr_t)(uintptr_t)p, v, bytes / 4, s));
}

/* Queues a copy of bytes at device address p into host, on stream s; host
 * must stay valid until s is synchronized. */
static inline void drv_to_host(void *host, const void *p, size_t bytes, gma_stream_t s) {
  DRV_CHECK(drv.cuMemcpyDtoHAsync(host, (drv_ptr_t)(uintptr_t)p, bytes, s));
}

static inline void drv_sync(gma_stream_t s) { DRV_CHECK(drv.cuStreamSynchronize(s)); }

/* Pinned (page-locked) host memory: a device-to-host copy into it runs
 * asynchronously on a GPU, as the race a test looks for needs (a copy into
 * pageable malloc memory is synchronous, so the work it orders against has
 * always finished). */
static inline void *drv_pinned(size_t bytes) {
  void *p = NULL;
  DRV_CHECK(drv.cuMemHostAlloc(&p, bytes, 0x1 /* CU_MEMHOSTALLOC_PORTABLE */ | 0x2 /* DEVICEMAP */));
  return p;
}

static inline void drv_pinned_free(void *p) { DRV_CHECK(drv.cuMemFreeHost(p)); }

/* Holding a stream busy: drv_hold queues on s a wait until the pinned word
 * *flag reaches value (cuStreamWaitValue32, GEQ), so everything queued on s
 * afterwards waits too, while the host goes on; drv_release writes value
 * and lets it run. No kernel is needed. False when the driver cannot hold. */
static inline bool drv_hold(gma_stream_t s, volatile uint32_t *flag, uint32_t value) {
  __typeof__(drv.cuStreamWaitValue32) wait = __atomic_load_n(&drv.cuStreamWaitValue32, __ATOMIC_RELAXED);
  if (!wait) return false;
  drv_ptr_t d = 0;
  DRV_CHECK(drv.cuMemHostGetDevicePointer(&d, (void *)flag, 0));
  drv_result_t r = wait(s, d, value, 0x0 /* CU_STREAM_WAIT_VALUE_GEQ */);
  if (r != DRV_SUCCESS) { /* a GPU without stream memory operations: hold nothing */
    if (__atomic_exchange_n(&drv.cuStreamWaitValue32, NULL, __ATOMIC_RELAXED))
      fprintf(stderr, "drv: cuStreamWaitValue32 failed (%d): streams are not held\n", r);
    return false;
  }
  return true;
}

static inline void drv_release(volatile uint32_t *flag, uint32_t value) {
  __atomic_store_n(flag, value, __ATOMIC_RELEASE);
}

/* Makes later work on `waiter` wait for the work queued on `after` so far
 * (an event recorded on one stream and waited on by the other). */
static inline void drv_order(gma_stream_t waiter, gma_stream_t after) {
  drv_event_t e = NULL;
  DRV_CHECK(drv.cuEventCreate(&e, DRV_EVENT_DISABLE_TIMING));
  DRV_CHECK(drv.cuEventRecord(e, after));
  DRV_CHECK(drv.cuStreamWaitEvent(waiter, e, 0));
  DRV_CHECK(drv.cuEventDestroy(e)); /* the wait keeps what it needs, as in CUDA */
}

/* Bytes of device memory in use on device 0 when the driver is the fake,
 * UINT64_MAX on a real driver (which has no exact counter to compare). */
static inline uint64_t drv_fake_used(void) { return drv.fake_used ? drv.fake_used(0) : UINT64_MAX; }

/* Creates an allocator on the CUDA device with conf applied (GMA_CONF is
 * ignored), or exits 77 (CTest: skipped) when there is no CUDA device. */
static inline gma_t *drv_cuda_allocator(const char *conf) {
  gma_config_t c = GMA_CONFIG_INIT;
  c.device = GMA_DEVICE_CUDA;
  c.ignore_env = 1;
  if (conf && gma_config_parse(&c, conf) != GMA_OK) {
    fprintf(stderr, "bad test config '%s': %s\n", conf, gma_last_error());
    exit(1);
  }
  gma_t *g = NULL;
  gma_status_t st = gma_create(&c, &g);
  if (st == GMA_ERR_NO_DEVICE) {
    printf("skipped: no CUDA device: %s\n", gma_last_error());
    exit(77);
  }
  if (st != GMA_OK) {
    fprintf(stderr, "gma_create(device:cuda, %s) failed: %s\n", conf ? conf : "",
            gma_last_error());
    exit(1);
  }
  return g;
}

/* Shared by the GPU tests: a sleep, and a fill-and-verify of a block
 * through the device. */

static inline void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

/* Fills p with v on s, reads it back on s and checks every word. */
static inline void fill_and_check(void *p, size_t bytes, uint32_t v, gma_stream_t s) {
  uint32_t *h = malloc(bytes);
  CHECK(h);
  drv_memset32(p, v, bytes, s);
  drv_to_host(h, p, bytes, s);
  drv_sync(s);
  for (size_t i = 0; i < bytes / 4; i++) {
    if (h[i] != v) {
      fprintf(stderr, "word %zu of %p (%zu bytes) is %08x, expected %08x\n", i, p, bytes, h[i], v);
      exit(1);
    }
  }
  free(h);
}

#endif /* GMA_TEST_DRV_H */
