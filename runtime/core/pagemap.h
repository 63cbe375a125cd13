/* The page map: device address -> the block starting there, for every block
 * of every segment (any state). It answers gma_free's "which block is this?"
 * without a lock.
 *
 * A three-level radix over address bits 9..47 (blocks start on 512-byte
 * boundaries): 4096 top entries -> 4096-entry middles -> 32768-entry leaves.
 * Levels are created on demand and freed only at destroy, so a reader never
 * follows a dangling pointer; they come from mmap'd slabs, so the pages of a
 * leaf cost memory only where block starts are written (8 bytes per block
 * start).
 *
 * Threads: gma__pagemap_set runs under the pool lock (one writer);
 * gma__pagemap_get from any thread, wait-free. */
#ifndef GMA_PAGEMAP_H
#define GMA_PAGEMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/atomics.h"

struct gma__block;

#define GMA__PM_TOP_BITS 12
#define GMA__PM_MID_BITS 12
#define GMA__PM_LEAF_BITS 15

typedef struct gma__pm_leaf {
  _Atomic(struct gma__block *) slot[1u << GMA__PM_LEAF_BITS];
} gma__pm_leaf_t;

typedef struct gma__pm_mid {
  _Atomic(gma__pm_leaf_t *) leaf[1u << GMA__PM_MID_BITS];
} gma__pm_mid_t;

typedef struct gma__pagemap {
  _Atomic(gma__pm_mid_t *) top[1u << GMA__PM_TOP_BITS];
  /* Where new levels come from (writer only, under the pool lock): the
   * newest slab and its unused bytes; each slab's first page links the
   * previous one, for gma__pagemap_free. */
  unsigned char *slab;
  size_t slab_used;
} gma__pagemap_t;

/* The block starting at addr, or NULL. Pairs its acquire loads with the
 * release stores of gma__pagemap_set. */
static inline struct gma__block *gma__pagemap_get(gma__pagemap_t *pm, uintptr_t addr) {
  if ((uint64_t)addr >> 48 || addr % 512) return NULL;
  gma__pm_mid_t *mid = gma__load_acquire(&pm->top[addr >> 36]);
  if (!mid) return NULL;
  gma__pm_leaf_t *leaf = gma__load_acquire(&mid->leaf[(addr >> 24) & 0xfff]);
  if (!leaf) return NULL;
  return gma__load_acquire(&leaf->slot[(addr >> 9) & 0x7fff]);
}

/* Sets (or, with NULL, clears) the entry for addr; false when host memory for
 * a new level is lacking. Pool lock held. */
bool gma__pagemap_set(gma__pagemap_t *pm, uintptr_t addr, struct gma__block *b);
void gma__pagemap_free(gma__pagemap_t *pm);

#endif /* GMA_PAGEMAP_H */
