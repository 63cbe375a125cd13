/* Size classes of the per-stream bins. Blocks in one bin are interchangeable,
 * so a request served by the bins gets a block of its class's size.
 *
 * Classes: 512 B steps up to 4 KiB (8 classes, waste < 512 B), then each
 * power of two (2^k, 2^(k+1)] is cut into equal steps: 8 up to 64 KiB, 16 up
 * to 1 MiB, 32 above. The waste of a request is below one step: under 1/8 of
 * the block up to 64 KiB, 1/16 up to 1 MiB, 1/32 (3%) above. jemalloc and
 * mimalloc cut each doubling in 4; device memory is dearer than host memory,
 * and large blocks dominate it: with 8 steps above 1 MiB, the replay of a
 * real fine-tuning trace (opt125m_zo_finetune) reserved 8% more than PyTorch,
 * with 32 it reserves the same. Pure functions; any thread. */
#ifndef GMA_SIZECLASS_H
#define GMA_SIZECLASS_H

#include <stdint.h>

/* log2 of the steps in (2^k, 2^(k+1)], k >= 12. */
static inline unsigned gma__class_bits(unsigned k) { return k < 16 ? 3 : k < 20 ? 4 : 5; }

/* Index of the first class of (2^k, 2^(k+1)], k >= 12. */
static inline unsigned gma__class_base(unsigned k) {
  if (k < 16) return 8 + (k - 12) * 8;
  if (k < 20) return 40 + (k - 16) * 16;
  return 104 + (k - 20) * 32;
}

/* Index of the smallest class whose size is >= size (size > 0). */
static inline unsigned gma__class_of(uint64_t size) {
  if (size <= 4096) return (unsigned)((size + 511) / 512) - 1;
  unsigned k = 63u - (unsigned)__builtin_clzll(size - 1); /* 2^k < size <= 2^(k+1) */
  uint64_t step = 1ull << (k - gma__class_bits(k));
  uint64_t j = (size - (1ull << k) + step - 1) / step; /* 1..steps */
  return gma__class_base(k) + (unsigned)(j - 1);
}

static inline uint64_t gma__class_size(unsigned c) {
  if (c < 8) return (uint64_t)(c + 1) * 512;
  unsigned k = c < 40 ? 12 + (c - 8) / 8 : c < 104 ? 16 + (c - 40) / 16 : 20 + (c - 104) / 32;
  unsigned j = c - gma__class_base(k) + 1;
  return (1ull << k) + (uint64_t)j * (1ull << (k - gma__class_bits(k)));
}

/* Index of the largest class whose size is <= size (size >= 512): the bin a
 * block of this size can serve without being too small. */
static inline unsigned gma__class_floor(uint64_t size) {
  unsigned c = gma__class_of(size);
  return gma__class_size(c) > size ? c - 1 : c;
}

#endif /* GMA_SIZECLASS_H */
