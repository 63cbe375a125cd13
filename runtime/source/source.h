/* The segment-source interface: where the pool's memory comes from and where
 * it goes back. A source deals only in address ranges; the pool owns every
 * segment, block, tree and the page map built over them, and does all
 * adopting, merging and splitting of segments itself (pool.c, segments.c).
 * A source never sees a block, and the pool never sees a granule or a chunk.
 *
 * Two sources implement it:
 *   - ordinary segments (source_plain.c): one device allocation per growth;
 *     a segment goes back whole, one mem_free;
 *   - growable address ranges (vmm.c, expandable_segments:true): reserved
 *     ranges into which physical chunks are mapped; a growth may extend the
 *     end of earlier memory of the same range (the pool then merges the new
 *     memory into the adjacent segment), and only whole chunks go back, so
 *     the pool asks which part of a free range can be given back.
 *
 * Memory the OOM retry takes out of holes can be kept instead (span.keep):
 * unmapped, its physical chunks held in the source's handle pool, which
 * the next growth maps first, at any address; a trim or gma_empty_cache
 * frees them (free_kept).
 *
 * A range's memory goes back in three steps, so the device call happens
 * outside the pool lock: take (lock held: the source marks it leaving),
 * give_back (no lock: the device calls), settle (lock held: the source
 * forgets what went back; what the device refused stays taken until the
 * pool adopts it again and calls reuse).
 *
 * Every operation except give_back runs under the pool lock; the source has
 * no lock of its own. Statistics stay the pool's: the source reports how
 * many device calls a give_back made and the pool counts them. */
#ifndef GMA_SOURCE_H
#define GMA_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/device.h"
#include "gma.h"
#include "base/trace.h"

/* Shared with pool.h: every block size is a multiple of GMA__ROUND, and the
 * pool has two kinds of memory, each grown by the source separately. */
#define GMA__ROUND 512u
enum { GMA__SMALL = 0, GMA__LARGE = 1, GMA__NKINDS = 2 };

typedef struct gma__source gma__source_t;

/* An idle end of a segment of a growable source: a segment of range that
 * ends at end in memory nobody holds live. offer: the pool's offer of
 * where this growth could extend (free bytes of FREE memory, or cached on
 * the growing stream, end the segment); else a hint that the segment may
 * want to extend later (its end is another stream's cache, pending, or
 * free memory of another home), so a fresh run keeps clear of end. */
typedef struct gma__tail {
  const void *range;
  uintptr_t end;
  uint64_t free;
  bool offer;
} gma__tail_t;

/* What the pool asks a growth for. */
typedef struct gma__grow_req {
  int kind;                 /* GMA__SMALL or GMA__LARGE */
  uint64_t size;            /* ordinary: bytes to allocate; growable: the pool then needs a
                               FREE block this large */
  uint64_t left;            /* bytes the memory limit still allows */
  const gma__tail_t *tails; /* growable: segments with idle ends (gma__tail_t) */
  size_t ntails;
  bool least;               /* map only what the request needs (a retry after an OOM) */
} gma__grow_req_t;

/* A source's plan for a growth; the pool reads need and tail, the rest is
 * the source's. */
typedef struct gma__plan {
  uint64_t need;  /* the least the growth maps or allocates */
  ptrdiff_t tail; /* index into req->tails of the tail it extends; -1: fresh memory */
  const void *range; /* the source's: where (NULL: a new range must be reserved) */
  uintptr_t addr;
  uint64_t room;
} gma__plan_t;

/* New memory: [addr, addr + size) in range (NULL for an ordinary source,
 * whose every growth is a segment of its own). A growable source's memory
 * may start where a segment of the same range ends or end where one starts;
 * the pool merges them. */
typedef struct gma__grown {
  uintptr_t addr;
  uint64_t size;
  const void *range;
  uint64_t calls;  /* device allocations or maps it made */
  uint64_t remaps; /* of those, maps of kept chunks (no new memory) */
  uint64_t kept;   /* the source's: bytes of kept chunks at the front */
} gma__grown_t;

/* Memory on its way back to the device. */
typedef struct gma__span {
  const void *range;
  int kind;       /* the pool's: the kind of the segment it came from */
  uintptr_t addr;
  uint64_t size;
  bool keep;      /* the pool's: keep the physical memory for the next growth (growable) */
  uint64_t done;  /* give_back: bytes from the front that went back */
  size_t calls;   /* give_back: device frees or unmaps that succeeded */
  void *priv;     /* the source's own copies (what give_back needs without the lock) */
  size_t npriv;
} gma__span_t;

typedef struct gma__source_ops {
  /* Plans a growth for req; false when a growable source has no room in any
   * range (grow then reserves another). No side effects. */
  bool (*plan)(gma__source_t *s, const gma__grow_req_t *req, gma__plan_t *pl);
  /* Allocates or maps what pl planned (out->size is set even on failure:
   * what it tried). All or nothing. */
  gma_status_t (*grow)(gma__source_t *s, const gma__grow_req_t *req, gma__plan_t *pl,
                       gma__grown_t *out);
  /* The pool could not adopt what grow returned: give it back now. */
  void (*ungrow)(gma__source_t *s, const gma__grown_t *g);
  /* The part of the free memory [addr, addr + size) of range that can go
   * back: [*lo, *hi) (growable: the whole chunks inside it; with want > 0,
   * only the last of them, the fewest that hold want bytes, or all when
   * they hold less); its length, 0 when none. */
  uint64_t (*releasable)(const gma__source_t *s, const void *range, uintptr_t addr,
                         uint64_t size, uint64_t want, uintptr_t *lo, uintptr_t *hi);
  /* Marks [addr, addr + size) (a releasable answer, or a whole ordinary
   * segment) as leaving and fills out for give_back; false without host
   * memory (nothing changed). */
  bool (*take)(gma__source_t *s, const void *range, uintptr_t addr, uint64_t size,
               gma__span_t *out);
  /* Without the lock: gives a taken span back to the device, front first,
   * stopping at the first refusal (the message is set); sets done, calls. */
  void (*give_back)(gma__source_t *s, gma__span_t *x);
  /* Lock held, after give_back: forgets what went back and frees x's copies.
   * [addr + done, addr + size) is still the source's memory, still taken:
   * the pool adopts it again and calls reuse, or leaves it taken (unusable,
   * given back at fini). */
  void (*settle)(gma__source_t *s, gma__span_t *x);
  void (*reuse)(gma__source_t *s, const void *range, uintptr_t addr, uint64_t size);
  /* At destroy, for each of the pool's segments: an ordinary source frees it
   * now; a growable one waits for fini. */
  void (*drop)(gma__source_t *s, const void *range, uintptr_t addr, uint64_t size);
  /* At destroy, after every segment was dropped: gives back all the rest and
   * frees s. */
  void (*fini)(gma__source_t *s);
  /* Gives every kept chunk (a span given back with keep) back to the device;
   * its bytes, *calls the device frees. What the device refuses stays kept.
   * NULL: the source never keeps memory. */
  uint64_t (*free_kept)(gma__source_t *s, uint64_t *calls);
} gma__source_ops_t;

/* What every source starts with. trace is the pool's trace slot: sources
 * record SEGMENT_FREE / SEGMENT_UNMAP rows where the device call happened. */
struct gma__source {
  const gma__source_ops_t *ops;
  gma__device_t *dev;
  gma__trace_t *_Atomic const *trace;
  uint64_t ranges, range_bytes; /* address ranges reserved, their bytes (growable) */
  /* The handle pool (growable, on a device that can keep memory): physical
   * chunks unmapped from holes by a span given back with keep, held for
   * the next growth, which maps them before it creates any; not in any
   * segment, so not in the pool's reserved bytes, but the device's memory
   * all the same: the pool counts kept_bytes against its limit. */
  uint64_t kept_bytes, kept_chunks;
  uint64_t kept_frees, kept_freed_bytes; /* kept chunks freed (device calls), their bytes: ever */
};

/* source_plain.c: ordinary segments; NULL without host memory. */
gma__source_t *gma__plain_source_new(gma__device_t *dev, gma__trace_t *_Atomic const *trace);

/* vmm.c: growable ranges; reserves one range per kind (several times limit). */
gma_status_t gma__vm_source_new(gma__device_t *dev, gma__trace_t *_Atomic const *trace,
                                uint64_t limit, const uint64_t segment_size[2],
                                gma__source_t **out);

/* One growable segment as the pool sees it, for gma__vm_check. */
typedef struct gma__seg_view {
  const void *range;
  int kind;
  uintptr_t addr;
  uint64_t size;
} gma__seg_view_t;
/* vmm.c: checks the ranges and their chunk tables against the pool's
 * growable segments (views sorted by addr): each segment a run of whole
 * mapped, non-taken chunks of its range, of the range's kind, and mapped
 * bytes adding up. Lock held; sets the last error on the first violation. */
bool gma__vm_check(const gma__source_t *s, const gma__seg_view_t *v, size_t n);

#endif /* GMA_SOURCE_H */
