/* Minimal test assertions shared by every test: a failing CHECK prints the
 * file, line, expression and gma's last error, then exits 1. */
#ifndef GMA_TEST_CHECK_H
#define GMA_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* A test made of named cases: `test NAME` runs one, no argument runs all;
 * ends with the plain "N passed, 0 failed" line (a failed CHECK exits). */
typedef struct test_case {
  const char *name;
  void (*fn)(void);
} test_case_t;

static inline int run_cases(int argc, char **argv, const test_case_t *cases, size_t n) {
  int ran = 0;
  for (size_t i = 0; i < n; i++) {
    if (argc > 1 && strcmp(argv[1], cases[i].name) != 0) continue;
    printf("%s\n", cases[i].name);
    fflush(stdout);
    cases[i].fn();
    ran++;
  }
  CHECK(ran > 0);
  printf("%d passed, 0 failed\n", ran);
  return 0;
}

#endif /* GMA_TEST_CHECK_H */
