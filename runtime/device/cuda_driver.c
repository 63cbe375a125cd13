/* Loading the CUDA driver (see cuda.c): dlopen of libcuda.so.1 or of the
 * file GMA_CUDA_DRIVER names, every entry point through cuGetProcAddress, and
 * the mapping of driver results to gma statuses. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef GMA_HAVE_CUDA

#include "device/cuda_internal.h"

cuda_driver_t gma__cuda_drv;
capture_info_v2_t gma__cuda_capture_info;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static bool drv_loaded;       /* written once inside pthread_once */
static char drv_problem[512]; /* why it did not load; written once likewise */

/* The oldest driver API gma asks entry points for: cuStreamGetId is 12.0. */
#define GMA_CUDA_API_VERSION 12000

typedef CUresult (*get_proc_v2_t)(const char *, void **, int, cuuint64_t,
                                  CUdriverProcAddressQueryResult *);
typedef CUresult (*get_proc_v1_t)(const char *, void **, int, cuuint64_t);

static void driver_load(void) {
  const char *path = getenv("GMA_CUDA_DRIVER");
  if (!path || !*path) path = "libcuda.so.1";
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(drv_problem, sizeof drv_problem, "no CUDA driver: dlopen(\"%s\") failed: %s", path,
             dlerror());
    return;
  }
  get_proc_v2_t v2 = (get_proc_v2_t)dlsym(h, "cuGetProcAddress_v2");
  get_proc_v1_t v1 = v2 ? NULL : (get_proc_v1_t)dlsym(h, "cuGetProcAddress");
  if (!v2 && !v1) {
    snprintf(drv_problem, sizeof drv_problem,
             "the CUDA driver %s has no cuGetProcAddress (it predates CUDA 11.3); update the "
             "driver",
             path);
    dlclose(h);
    return;
  }
  struct {
    const char *name;
    void **slot;
  } entries[] = {
#define X(name) {#name, (void **)&gma__cuda_drv.name},
      GMA_CUDA_ENTRIES(X)
#undef X
  };
  for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
    void *fn = NULL;
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult r = v2 ? v2(entries[i].name, &fn, GMA_CUDA_API_VERSION, CU_GET_PROC_ADDRESS_DEFAULT,
                         &found)
                    : v1(entries[i].name, &fn, GMA_CUDA_API_VERSION, CU_GET_PROC_ADDRESS_DEFAULT);
    if (r != CUDA_SUCCESS || !fn || found != CU_GET_PROC_ADDRESS_SUCCESS) {
      snprintf(drv_problem, sizeof drv_problem,
               "the CUDA driver %s lacks %s (error %d); gma needs a driver for CUDA 12.0 or "
               "newer",
               path, entries[i].name, (int)r);
      memset(&gma__cuda_drv, 0, sizeof gma__cuda_drv);
      dlclose(h);
      return;
    }
    *entries[i].slot = fn;
  }
  /* cuStreamGetCaptureInfo with the ABI of 12.0 (the _v2 signature): cuda.h
   * of 12.3 and newer declares a later one, with edge data, under that name. */
  void *fn = NULL;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SUCCESS;
  CUresult r = v2 ? v2("cuStreamGetCaptureInfo", &fn, GMA_CUDA_API_VERSION,
                       CU_GET_PROC_ADDRESS_DEFAULT, &found)
                  : v1("cuStreamGetCaptureInfo", &fn, GMA_CUDA_API_VERSION,
                       CU_GET_PROC_ADDRESS_DEFAULT);
  if (r != CUDA_SUCCESS || !fn || found != CU_GET_PROC_ADDRESS_SUCCESS) {
    snprintf(drv_problem, sizeof drv_problem,
             "the CUDA driver %s lacks cuStreamGetCaptureInfo (error %d); gma needs a driver "
             "for CUDA 12.0 or newer",
             path, (int)r);
    memset(&gma__cuda_drv, 0, sizeof gma__cuda_drv);
    dlclose(h);
    return;
  }
  gma__cuda_capture_info = (capture_info_v2_t)fn;
  drv_loaded = true; /* the handle stays open for the life of the process */
}

/* GMA_OK once the driver is loaded; GMA_ERR_NO_DEVICE with the reason. */
gma_status_t gma__cuda_driver(void) {
  pthread_once(&drv_once, driver_load);
  if (drv_loaded) return GMA_OK;
  return gma__set_error(GMA_ERR_NO_DEVICE, "%s", drv_problem);
}

/* The gma status for a driver result. Errors that say there is no usable
 * device are NO_DEVICE; out of memory is OOM; the rest are device errors. */
static gma_status_t status_of(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return GMA_OK;
    case CUDA_ERROR_OUT_OF_MEMORY: return GMA_ERR_OOM;
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    case CUDA_ERROR_DEVICE_UNAVAILABLE: return GMA_ERR_NO_DEVICE;
    case CUDA_ERROR_NOT_SUPPORTED: return GMA_ERR_UNSUPPORTED;
    default: return GMA_ERR_DEVICE;
  }
}

/* Sets the last error for a failed driver call and returns its status. */
gma_status_t gma__cuda_fail(CUresult r, const char *call) {
  const char *name = NULL, *text = NULL;
  if (gma__cuda_drv.cuGetErrorName) gma__cuda_drv.cuGetErrorName(r, &name);
  if (gma__cuda_drv.cuGetErrorString) gma__cuda_drv.cuGetErrorString(r, &text);
  return gma__set_error(status_of(r), "the CUDA driver call %s failed: %s (%s, code %d)", call,
                        text ? text : "unknown error", name ? name : "CUDA_ERROR_?", (int)r);
}

#endif /* GMA_HAVE_CUDA */
