/* Size classes of the per-stream bins. Blocks in one bin are interchangeable,
 * so a request served by the bins gets a block of its class's size.
 *
 * Classes: 512 B steps up to 4 KiB (8 classes, waste < 512 B), then 8 classes
 * per power of two: (2^k, 2^(k+1)] in steps of 2^k / 8. The waste of a request
 * above 4 KiB is below one step, so below 1/8 of the block (12.5%, 6% on
 * average). jemalloc and mimalloc use the same 4-per-doubling idea; 8 per
 * doubling halves the worst-case waste, and device memory is dearer than host
 * memory. Pure functions; any thread. */
#ifndef GMA_SIZECLASS_H
#define GMA_SIZECLASS_H

#include <stdint.h>

/* Index of the smallest class whose size is >= size (size > 0). */
static inline unsigned gma__class_of(uint64_t size) {
  if (size <= 4096) return (unsigned)((size + 511) / 512) - 1;
  unsigned k = 63u - (unsigned)__builtin_clzll(size - 1); /* 2^k < size <= 2^(k+1) */
  uint64_t step = 1ull << (k - 3);
  uint64_t j = (size - (1ull << k) + step - 1) / step; /* 1..8 */
  return 8 + (k - 12) * 8 + (unsigned)(j - 1);
}

static inline uint64_t gma__class_size(unsigned c) {
  if (c < 8) return (uint64_t)(c + 1) * 512;
  unsigned k = 12 + (c - 8) / 8, j = (c - 8) % 8 + 1;
  return (1ull << k) + (uint64_t)j * (1ull << (k - 3));
}

/* Index of the largest class whose size is <= size (size >= 512): the bin a
 * block of this size can serve without being too small. */
static inline unsigned gma__class_floor(uint64_t size) {
  unsigned c = gma__class_of(size);
  return gma__class_size(c) > size ? c - 1 : c;
}

#endif /* GMA_SIZECLASS_H */
