/* The page map: device address -> the block starting there, for every block
 * of every segment (any state). It answers gma_free's "which block is this?"
 * without a lock.
 *
 * A radix over address bits 9..47 (blocks start on 512-byte boundaries):
 * 4096 top entries -> 4096-entry middles, one entry per 16 MiB region ->
 * that region's leaf. A region's leaf starts sparse: the slot numbers and
 * blocks of up to GMA__PM_SPARSE block starts, 320 bytes, which is all a
 * region of large blocks ever needs. The start that finds it full turns the
 * region dense: a 32768-slot leaf, one slot per 512 bytes, for regions of
 * small blocks. Levels come from mmap'd slabs, one after another, so the
 * host pages the map touches are about its bytes in use: a dense leaf's
 * pages cost memory only where block starts are written, and sparse leaves
 * share pages. (With dense leaves only, every large block started a host
 * page of its own: a page fault, ~10 us on a virtual machine, per block
 * start the first time.)
 *
 * Levels are never freed before destroy, and a sparse leaf that turned
 * dense stays readable, so a reader never follows a dangling pointer. A
 * block that starts at addr since before the lookup (happens-before) is
 * always found. A lookup racing with the removal of addr's entry may find
 * NULL, that block, or (a sparse pair reused in between) another block of
 * the region: gma_free's paths check the block's address and state, and
 * the other callers (a graph pool's test, tags, pointer info) only take a
 * wrong answer to an error path or a report of a pointer being freed
 * meanwhile, which only a racing double free makes.
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
#define GMA__PM_SPARSE 32

typedef struct gma__pm_leaf {
  _Atomic(struct gma__block *) slot[1u << GMA__PM_LEAF_BITS];
} gma__pm_leaf_t;

/* A sparse leaf: key[i] is 1 + the slot number of block[i]'s start, 0 for
 * an unused pair. The writer stores a pair's block before its key and
 * clears the block before the key. */
typedef struct gma__pm_sparse {
  _Atomic(uint16_t) key[GMA__PM_SPARSE];
  _Atomic(struct gma__block *) block[GMA__PM_SPARSE];
} gma__pm_sparse_t;

/* A middle's entry: 0, a dense leaf, or a sparse leaf's address + 1. */
#define GMA__PM_SPARSE_TAG ((uintptr_t)1)
typedef struct gma__pm_mid {
  _Atomic(uintptr_t) leaf[1u << GMA__PM_MID_BITS];
} gma__pm_mid_t;

typedef struct gma__pagemap {
  _Atomic(gma__pm_mid_t *) top[1u << GMA__PM_TOP_BITS];
  /* Where new levels come from (writer only, under the pool lock): the
   * newest slab and its unused bytes; each slab's first page links the
   * previous one, for gma__pagemap_free. */
  unsigned char *slab;
  size_t slab_used;
  uint64_t dense_leaves, sparse_leaves; /* made so far (writer only; tests read them) */
} gma__pagemap_t;

/* Where slot's pair is looked for first: the writer puts it there when
 * that pair is unused, else in the next unused one after it (wrapping). */
static inline unsigned gma__pm_sparse_home(unsigned slot) {
  return (slot ^ slot >> 5 ^ slot >> 10) % GMA__PM_SPARSE;
}

static inline struct gma__block *gma__pm_sparse_get(gma__pm_sparse_t *s, unsigned slot) {
  for (unsigned n = 0, i = gma__pm_sparse_home(slot); n < GMA__PM_SPARSE;
       n++, i = (i + 1) % GMA__PM_SPARSE)
    if (gma__load_acquire(&s->key[i]) == slot + 1) /* pairs with the key's release store */
      return gma__load_acquire(&s->block[i]);
  return NULL;
}

/* The block starting at addr, or NULL. Pairs its acquire loads with the
 * release stores of gma__pagemap_set. */
static inline struct gma__block *gma__pagemap_get(gma__pagemap_t *pm, uintptr_t addr) {
  if ((uint64_t)addr >> 48 || addr % 512) return NULL;
  gma__pm_mid_t *mid = gma__load_acquire(&pm->top[addr >> 36]);
  if (!mid) return NULL;
  uintptr_t leaf = gma__load_acquire(&mid->leaf[(addr >> 24) & 0xfff]);
  unsigned slot = (addr >> 9) & 0x7fff;
  if (leaf & GMA__PM_SPARSE_TAG) return gma__pm_sparse_get((gma__pm_sparse_t *)(leaf - 1), slot);
  if (!leaf) return NULL;
  return gma__load_acquire(&((gma__pm_leaf_t *)leaf)->slot[slot]);
}

/* Sets (or, with NULL, clears) the entry for addr; false when host memory for
 * a new level is lacking. Pool lock held. */
bool gma__pagemap_set(gma__pagemap_t *pm, uintptr_t addr, struct gma__block *b);
void gma__pagemap_free(gma__pagemap_t *pm);

#endif /* GMA_PAGEMAP_H */
