/* Owns the page map's levels (see pagemap.h). */
#include "pagemap.h"

#include <stdlib.h>

bool gma__pagemap_set(gma__pagemap_t *pm, uintptr_t addr, struct gma__block *b) {
  if ((uint64_t)addr >> 48) return false;
  gma__pm_mid_t *mid = gma__load_relaxed(&pm->top[addr >> 36]);
  if (!mid) {
    if (!b) return true;
    mid = calloc(1, sizeof *mid);
    if (!mid) return false;
    gma__store_release(&pm->top[addr >> 36], mid); /* pairs with get's acquire */
  }
  gma__pm_leaf_t *leaf = gma__load_relaxed(&mid->leaf[(addr >> 24) & 0xfff]);
  if (!leaf) {
    if (!b) return true;
    leaf = calloc(1, sizeof *leaf);
    if (!leaf) return false;
    gma__store_release(&mid->leaf[(addr >> 24) & 0xfff], leaf); /* pairs with get's acquire */
  }
  /* Release: the block's fields (addr, size, seg) are visible to a reader
   * that finds it here (get's acquire). */
  gma__store_release(&leaf->slot[(addr >> 9) & 0x7fff], b);
  return true;
}

void gma__pagemap_free(gma__pagemap_t *pm) {
  for (size_t i = 0; i < (1u << GMA__PM_TOP_BITS); i++) {
    gma__pm_mid_t *mid = gma__load_relaxed(&pm->top[i]);
    if (!mid) continue;
    for (size_t j = 0; j < (1u << GMA__PM_MID_BITS); j++) free(gma__load_relaxed(&mid->leaf[j]));
    free(mid);
    gma__store_relaxed(&pm->top[i], NULL);
  }
}
