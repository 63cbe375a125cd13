/* Owns the page map's levels (see pagemap.h).
 *
 * Levels come straight from mmap, not calloc: a level is 32 KiB (middle) or
 * 256 KiB (leaf, one per 16 MiB of device addresses), and only the pages
 * where block starts are written ever get memory. calloc may instead take
 * them from the heap and zero them, which touches every page: replaying a
 * 37 GiB trace then spent most of its time clearing leaf pages and held
 * hundreds of MiB of host memory for them. */
#include "core/pagemap.h"

#include <sys/mman.h>

static void *level_new(size_t size) {
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p; /* zero-filled by the kernel, lazily */
}

bool gma__pagemap_set(gma__pagemap_t *pm, uintptr_t addr, struct gma__block *b) {
  if ((uint64_t)addr >> 48) return false;
  gma__pm_mid_t *mid = gma__load_relaxed(&pm->top[addr >> 36]);
  if (!mid) {
    if (!b) return true;
    mid = level_new(sizeof *mid);
    if (!mid) return false;
    gma__store_release(&pm->top[addr >> 36], mid); /* pairs with get's acquire */
  }
  gma__pm_leaf_t *leaf = gma__load_relaxed(&mid->leaf[(addr >> 24) & 0xfff]);
  if (!leaf) {
    if (!b) return true;
    leaf = level_new(sizeof *leaf);
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
    for (size_t j = 0; j < (1u << GMA__PM_MID_BITS); j++) {
      gma__pm_leaf_t *leaf = gma__load_relaxed(&mid->leaf[j]);
      if (leaf) munmap(leaf, sizeof *leaf);
    }
    munmap(mid, sizeof *mid);
    gma__store_relaxed(&pm->top[i], NULL);
  }
}
