/* Growable address ranges (vmm.c), the segment source behind
 * expandable_segments:true: its ranges and their chunk tables. Only vmm.c
 * and white-box tests look inside; the pool goes through source.h. */
#ifndef GMA_VMM_H
#define GMA_VMM_H

#include "source/source.h"

/* One physical chunk of a growable range: what one vm_map mapped (one
 * physical allocation), and so the least vm_unmap can give back. */
typedef struct gma__chunk {
  uintptr_t addr;
  uint64_t size;   /* a multiple of the granularity */
  uint64_t handle; /* the device's name for its physical memory */
  uint8_t busy;    /* taken: leaving the pool, unmapped outside the lock */
} gma__chunk_t;

/* A reserved address range of a growable pool kind (expandable_segments).
 * Each kind has a list of them: one reserved at creation, several times the
 * memory limit, and another whenever no range has an unmapped run for a
 * growth, so address space never limits what memory allows. Physical chunks
 * are mapped into a range as the pool grows, a few vm_maps per growth, sized to
 * the request's shortfall or more.
 * Invariants: chunks[] is sorted by addr, disjoint, inside [base, base +
 * size), granule-aligned; the pool's segments of the range are tiled exactly
 * by its non-busy chunks (a segment starts and ends on chunk boundaries;
 * checked by gma__vm_check); mapped = sum of chunk sizes, busy = sum over
 * busy chunks; a busy chunk is touched only by the thread that took it (its
 * record is copied out, so the table may move meanwhile). */
typedef struct gma__region {
  uintptr_t base;
  uint64_t size, gran;
  int kind;
  gma__chunk_t *chunks; /* sorted by addr */
  size_t nchunks, cap;
  uint64_t mapped;      /* bytes in chunks */
  uint64_t busy;        /* bytes in busy chunks */
  struct gma__region *next; /* the kind's next range */
} gma__region_t;

/* The first range of kind, or NULL when s is not a growable source (tests). */
gma__region_t *gma__vm_ranges(const gma__source_t *s, int kind);

#endif /* GMA_VMM_H */
