/* The stress tests' pattern kernel (stress_streams.c, stress_async.c): it
 * fills one word per STRESS_GRID bytes of a block with a pattern unique to
 * the kernel, holds, then verifies, and counts what it found in the run's
 * counters. Relaxed atomic words: under a planted bug two kernels touch the
 * same words on purpose, and the pattern check (not TSan) is the detector. */
#ifndef GMA_TEST_STRESS_KERNEL_H
#define GMA_TEST_STRESS_KERNEL_H

#include <inttypes.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "simkit.h" /* sleep_us */

enum { STRESS_GRID = 256 }; /* kernels touch one word per STRESS_GRID bytes */

/* One launch; malloc'd by the launcher, freed by the kernel. */
typedef struct stress_pattern {
  atomic_ullong *corruptions; /* the run's: kernels that found their pattern overwritten */
  atomic_ullong *kernels_run; /* the run's: pattern kernels finished */
  atomic_long *backlog;       /* its stream's: pattern kernels queued and not finished */
  uintptr_t base;
  size_t len;
  uint64_t pattern;
  long hold_us;
} stress_pattern_t;

static inline uint64_t stress_word(uint64_t pattern, size_t off) {
  return pattern ^ (off * 0x9e3779b97f4a7c15ull);
}

static inline void stress_pattern_kernel(void *argp) {
  stress_pattern_t *a = argp;
  for (size_t off = 0; off + 8 <= a->len; off += STRESS_GRID)
    __atomic_store_n((uint64_t *)(a->base + off), stress_word(a->pattern, off), __ATOMIC_RELAXED);
  if (a->hold_us) sleep_us(a->hold_us);
  uint64_t bad = 0;
  for (size_t off = 0; off + 8 <= a->len; off += STRESS_GRID)
    if (__atomic_load_n((uint64_t *)(a->base + off), __ATOMIC_RELAXED) !=
        stress_word(a->pattern, off))
      bad++;
  if (bad) {
    atomic_fetch_add(a->corruptions, 1);
    fprintf(stderr, "corruption: %" PRIu64 " of %zu sampled words of [%#" PRIxPTR
                    ", +%zu) changed while a kernel held them\n",
            bad, (a->len + STRESS_GRID - 1) / STRESS_GRID, a->base, a->len);
  }
  atomic_fetch_add(a->kernels_run, 1);
  atomic_fetch_sub(a->backlog, 1);
  free(a);
}

#endif /* GMA_TEST_STRESS_KERNEL_H */
