/* The CUDA driver entry points gma uses, one X(name) each, in the names
 * cuGetProcAddress takes (no _v2 suffix; cuda.h's macros pick the version a
 * field is typed with). cuda.c builds its function table from this list, and
 * the test-only driver in tests/fakecuda exports exactly these (plus the few
 * the GPU tests call themselves), so the two cannot drift apart. */
#ifndef GMA_CUDA_ENTRIES
#define GMA_CUDA_ENTRIES(X)          \
  X(cuInit)                          \
  X(cuDriverGetVersion)              \
  X(cuGetErrorName)                  \
  X(cuGetErrorString)                \
  X(cuDeviceGetCount)                \
  X(cuDeviceGet)                     \
  X(cuDeviceGetAttribute)            \
  X(cuDevicePrimaryCtxRetain)        \
  X(cuDevicePrimaryCtxRelease)       \
  X(cuCtxGetCurrent)                 \
  X(cuCtxPushCurrent)                \
  X(cuCtxPopCurrent)                 \
  X(cuCtxSynchronize)                \
  X(cuMemAlloc)                      \
  X(cuMemFree)                       \
  X(cuMemGetInfo)                    \
  X(cuEventCreate)                   \
  X(cuEventDestroy)                  \
  X(cuEventRecord)                   \
  X(cuEventQuery)                    \
  X(cuEventSynchronize)              \
  X(cuStreamWaitEvent)               \
  X(cuStreamCreate)                  \
  X(cuStreamDestroy)                 \
  X(cuStreamGetId)                   \
  X(cuStreamGetCtx)                  \
  X(cuStreamSynchronize)             \
  X(cuStreamWriteValue64)            \
  X(cuThreadExchangeStreamCaptureMode) \
  X(cuMemGetAllocationGranularity)   \
  X(cuMemAddressReserve)             \
  X(cuMemAddressFree)                \
  X(cuMemCreate)                     \
  X(cuMemRelease)                    \
  X(cuMemMap)                        \
  X(cuMemUnmap)                      \
  X(cuMemSetAccess)                  \
  X(cuMemHostAlloc)                  \
  X(cuMemHostGetDevicePointer)       \
  X(cuMemFreeHost)
#endif
