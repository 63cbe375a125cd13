/* The seeded PRNG shared by tests and benchmarks (xorshift64*): fast,
 * reproducible from a printed seed, good enough to pick sizes and streams. */
#ifndef GMA_TEST_RNG_H
#define GMA_TEST_RNG_H

#include <stdint.h>

static inline uint64_t rnd(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545f4914f6cdd1dull;
}

#endif /* GMA_TEST_RNG_H */
