/* Private to runtime/device/cuda*.c: the CUDA driver's entry points, loaded
 * once by cuda_driver.c, and how a driver result becomes a gma status. */
#ifndef GMA_DEVICE_CUDA_INTERNAL_H
#define GMA_DEVICE_CUDA_INTERNAL_H

#include <cuda.h>

#include "device/cuda_entries.h"
#include "device/device.h"

/* The driver's entry points; filled once (driver_load), then read-only. The
 * X-macro names expand through cuda.h's versioning macros (cuMemAlloc is
 * cuMemAlloc_v2), so each field has the type of the version we ask for. */
typedef struct cuda_driver {
#define X(name) __typeof__(name) *name;
  GMA_CUDA_ENTRIES(X)
#undef X
} cuda_driver_t;

/* Filled once (gma__cuda_driver), then read-only. */
extern cuda_driver_t gma__cuda_drv;
/* cuStreamGetCaptureInfo as of CUDA 12.0 (status, id, graph, dependencies,
 * their count); loaded with the table, then read-only. */
typedef CUresult (*capture_info_v2_t)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                      const CUgraphNode **, size_t *);
extern capture_info_v2_t gma__cuda_capture_info;

/* GMA_OK once the driver is loaded; GMA_ERR_NO_DEVICE with the reason. Any
 * thread; the first call loads it. */
gma_status_t gma__cuda_driver(void);
/* Sets the last error for a failed driver call and returns its status. Any thread. */
gma_status_t gma__cuda_fail(CUresult r, const char *call);

#endif /* GMA_DEVICE_CUDA_INTERNAL_H */
