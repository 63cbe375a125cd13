/* The allocator object itself: what one gma_t holds. Shared by api.c (which
 * creates and destroys it) and future.c (async requests). */
#ifndef GMA_ALLOCATOR_H
#define GMA_ALLOCATOR_H

#include "device/device.h"
#include "host.h"
#include "pool.h"
#include "worker.h"

struct gma {
  gma__device_t *dev; /* immutable after gma_create */
  gma_config_t cfg;   /* resolved; immutable after gma_create */
  gma__pool_t pool;
  gma__host_t host;   /* pinned host memory and CPU fallbacks */
  gma__worker_t worker;
};

#endif /* GMA_ALLOCATOR_H */
