/* Small helpers every benchmark shares: the clock, the seeded size generator
 * (so "mixed" means the same sizes in every benchmark), sort comparators, the
 * build description printed in each table header, and (for a benchmark that
 * defines BENCH_NAME, its program name, before including this) die and OK,
 * which end the run on a failed gma call. */
#ifndef GMA_BENCHKIT_H
#define GMA_BENCHKIT_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#ifndef GMA_BENCH_BUILD_TYPE
#define GMA_BENCH_BUILD_TYPE "unknown"
#endif
#ifndef GMA_DEBUG
#define GMA_DEBUG 0
#endif

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* xorshift64: the seeded generator of the mixed-size scenarios. */
static inline uint64_t xorshift(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static inline int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

#ifdef BENCH_NAME
#include <stdio.h>
#include <stdlib.h>

#include "gma.h"

/* Ends the benchmark: what failed, the status and gma's message. */
static inline void die(const char *what, gma_status_t st) {
  fprintf(stderr, BENCH_NAME ": %s: %s (%s)\n", what, gma_status_name(st), gma_last_error());
  exit(1);
}
#define OK(call)                        \
  do {                                  \
    gma_status_t st_ = (call);          \
    if (st_ != GMA_OK) die(#call, st_); \
  } while (0)
#endif

#endif /* GMA_BENCHKIT_H */
