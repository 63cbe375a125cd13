/* Rounding helpers. */
#ifndef GMA_BASE_ROUND_H
#define GMA_BASE_ROUND_H

#include <stdint.h>

/* x rounded up to a multiple of to (to > 0). */
static inline uint64_t gma__round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

#endif /* GMA_BASE_ROUND_H */
