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

/* splitmix64's finalizer: spreads a counter or a seed over 64 bits. */
static inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

#endif /* GMA_TEST_RNG_H */
