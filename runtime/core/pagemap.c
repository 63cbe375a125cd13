/* Owns the page map's levels (see pagemap.h).
 *
 * Levels come from mmap'd slabs, not calloc: a level is 32 KiB (middle) or
 * 256 KiB (leaf, one per 16 MiB of device addresses), and only the pages
 * where block starts are written ever get memory. calloc may instead take
 * them from the heap and zero them, which touches every page: replaying a
 * 37 GiB trace then spent most of its time clearing leaf pages and held
 * hundreds of MiB of host memory for them. A slab holds 64 leaves' worth
 * of address space, so a pool that spreads over GiB of device addresses
 * makes one mmap call per GiB, not one per 16 MiB, on its allocation path. */
#include "core/pagemap.h"

#include <sys/mman.h>

#define PAGE ((size_t)4096)
/* A slab: its link page, then levels. */
#define SLAB_SIZE (PAGE + 64 * sizeof(gma__pm_leaf_t))

/* size bytes (a multiple of PAGE) of zeroed memory from pm's slabs. */
static void *level_new(gma__pagemap_t *pm, size_t size) {
  if (!pm->slab || SLAB_SIZE - pm->slab_used < size) {
    unsigned char *s = mmap(NULL, SLAB_SIZE, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s == MAP_FAILED) return NULL; /* zero-filled by the kernel, lazily */
    *(unsigned char **)s = pm->slab; /* the link to the previous slab */
    pm->slab = s;
    pm->slab_used = PAGE;
  }
  void *p = pm->slab + pm->slab_used;
  pm->slab_used += size;
  return p;
}

bool gma__pagemap_set(gma__pagemap_t *pm, uintptr_t addr, struct gma__block *b) {
  if ((uint64_t)addr >> 48) return false;
  gma__pm_mid_t *mid = gma__load_relaxed(&pm->top[addr >> 36]);
  if (!mid) {
    if (!b) return true;
    mid = level_new(pm, sizeof *mid);
    if (!mid) return false;
    gma__store_release(&pm->top[addr >> 36], mid); /* pairs with get's acquire */
  }
  gma__pm_leaf_t *leaf = gma__load_relaxed(&mid->leaf[(addr >> 24) & 0xfff]);
  if (!leaf) {
    if (!b) return true;
    leaf = level_new(pm, sizeof *leaf);
    if (!leaf) return false;
    gma__store_release(&mid->leaf[(addr >> 24) & 0xfff], leaf); /* pairs with get's acquire */
  }
  /* Release: the block's fields (addr, size, seg) are visible to a reader
   * that finds it here (get's acquire). */
  gma__store_release(&leaf->slot[(addr >> 9) & 0x7fff], b);
  return true;
}

void gma__pagemap_free(gma__pagemap_t *pm) {
  for (size_t i = 0; i < (1u << GMA__PM_TOP_BITS); i++) gma__store_relaxed(&pm->top[i], NULL);
  while (pm->slab) {
    unsigned char *prev = *(unsigned char **)pm->slab;
    munmap(pm->slab, SLAB_SIZE);
    pm->slab = prev;
  }
  pm->slab_used = 0;
}
