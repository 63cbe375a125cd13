/* The one clock: CLOCK_MONOTONIC in nanoseconds. */
#ifndef GMA_BASE_CLOCK_H
#define GMA_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in ns; any thread, wait-free. */
static inline uint64_t gma__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif /* GMA_BASE_CLOCK_H */
