/* Minimal test assertions shared by every test: a failing CHECK prints the
 * file, line, expression and gma's last error, then exits 1. */
#ifndef GMA_TEST_CHECK_H
#define GMA_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "gma.h"

#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n  last error: %s\n", __FILE__, __LINE__, \
              #cond, gma_last_error());                                               \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

/* Checks that a gma call returns the expected status. */
#define CHECK_ST(call, expected)                                                        \
  do {                                                                                  \
    gma_status_t st_ = (call);                                                          \
    if (st_ != (expected)) {                                                            \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s\n  last error: %s\n", __FILE__, \
              __LINE__, #call, gma_status_name(st_), gma_status_name(expected),         \
              gma_last_error());                                                        \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

#define CHECK_OK(call) CHECK_ST(call, GMA_OK)

/* The allocator's statistics now (fails the test if gma_stats fails). */
static inline gma_stats_t stats_of(gma_t *g) {
  gma_stats_t s = GMA_STATS_INIT;
  CHECK_OK(gma_stats(g, &s));
  return s;
}

#endif /* GMA_TEST_CHECK_H */
