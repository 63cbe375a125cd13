/* Owns the page map's levels (see pagemap.h).
 *
 * Levels come from mmap'd slabs, not calloc: a dense leaf is 256 KiB (one
 * per 16 MiB of device addresses that holds small blocks), and only the
 * pages where block starts are written ever get memory. calloc may instead
 * take them from the heap and zero them, which touches every page. A slab
 * holds 64 dense leaves' worth of address space, or thousands of sparse
 * leaves and middles, so the map makes one mmap call per GiB of small
 * blocks or per ~50,000 regions of large ones. */
#include "core/pagemap.h"

#include <sys/mman.h>

#include "base/assert.h"

#define PAGE ((size_t)4096)
/* A slab: its link page, then levels. */
#define SLAB_SIZE (PAGE + 64 * sizeof(gma__pm_leaf_t))

/* size bytes (a multiple of 64) of zeroed memory from pm's slabs. */
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

/* The sparse leaf s of middle entry e is full and slot needs a pair: a dense
 * leaf takes every pair and b, and replaces s in e. */
static bool make_dense(gma__pagemap_t *pm, _Atomic(uintptr_t) *e, gma__pm_sparse_t *s,
                       unsigned slot, struct gma__block *b) {
  gma__pm_leaf_t *d = level_new(pm, sizeof *d);
  if (!d) return false;
#ifdef GMA__PM_PLANTED_EARLY_DENSE /* tests/unit/test_pagemap.c: the bug it must catch */
  gma__store_release(e, (uintptr_t)d);
#endif
  for (unsigned i = 0; i < GMA__PM_SPARSE; i++) {
    unsigned k = gma__load_relaxed(&s->key[i]);
    GMA__ASSERT(k != 0); /* called only when every pair is in use */
    gma__store_relaxed(&d->slot[k - 1], gma__load_relaxed(&s->block[i]));
  }
  gma__store_relaxed(&d->slot[slot], b);
  /* Release: the slots above are visible to a reader that finds d here
   * (get's acquire of the middle entry). */
  gma__store_release(e, (uintptr_t)d);
  pm->dense_leaves++;
  return true;
}

/* Sets or clears slot's pair in the sparse leaf s of entry e (dense when
 * full). */
static bool sparse_set(gma__pagemap_t *pm, _Atomic(uintptr_t) *e, gma__pm_sparse_t *s,
                       unsigned slot, struct gma__block *b) {
  unsigned unused = GMA__PM_SPARSE;
  for (unsigned n = 0, i = gma__pm_sparse_home(slot); n < GMA__PM_SPARSE;
       n++, i = (i + 1) % GMA__PM_SPARSE) {
    unsigned k = gma__load_relaxed(&s->key[i]);
    if (k == slot + 1) {
      gma__store_release(&s->block[i], b); /* pairs with get's acquire of the block */
      if (!b) gma__store_release(&s->key[i], 0);
      return true;
    }
    if (!k && unused == GMA__PM_SPARSE) unused = i;
  }
  if (!b) return true;
  if (unused == GMA__PM_SPARSE) return make_dense(pm, e, s, slot, b);
  gma__store_release(&s->block[unused], b);
  /* Release: the block above is visible to a reader that finds this key
   * (sparse_get's acquire). */
  gma__store_release(&s->key[unused], (uint16_t)(slot + 1));
  return true;
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
  _Atomic(uintptr_t) *e = &mid->leaf[(addr >> 24) & 0xfff];
  uintptr_t leaf = gma__load_relaxed(e);
  unsigned slot = (addr >> 9) & 0x7fff;
  if (!leaf) {
    if (!b) return true;
    gma__pm_sparse_t *s = level_new(pm, sizeof *s);
    if (!s) return false;
    pm->sparse_leaves++;
    unsigned i = gma__pm_sparse_home(slot);
    gma__store_relaxed(&s->block[i], b);
    gma__store_relaxed(&s->key[i], (uint16_t)(slot + 1));
    /* Release: the pair above is visible to a reader that finds s here. */
    gma__store_release(e, (uintptr_t)s + GMA__PM_SPARSE_TAG);
    return true;
  }
  if (leaf & GMA__PM_SPARSE_TAG)
    return sparse_set(pm, e, (gma__pm_sparse_t *)(leaf - GMA__PM_SPARSE_TAG), slot, b);
  /* Release: the block's fields (addr, size, seg) are visible to a reader
   * that finds it here (get's acquire). */
  gma__store_release(&((gma__pm_leaf_t *)leaf)->slot[slot], b);
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
