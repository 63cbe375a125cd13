/* Owns growable segments (expandable_segments:true): one reserved address
 * range per pool kind, physical chunks of the device's granularity mapped in
 * as the pool grows and unmapped by trimming.
 *
 * A segment of a region is a maximal run of MAPPED granules, tiled by blocks
 * like any segment. Mapping chunks next to a segment extends it (and merges
 * it with a segment that starts right after), so a FREE block at the end of
 * one chunk coalesces with the new chunk: a growing workload gets one large
 * free block instead of many segment-sized ones. Trimming cuts the
 * granule-aligned inside of a FREE block out, which may split a segment in
 * two. FREE means every stream's work on the memory has completed (its epoch
 * events passed), so unmapping it never pulls memory from under a kernel.
 *
 * Everything here runs under the pool lock except gma__vm_unmap, which works
 * only on BUSY granules that no other thread touches. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

static uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }
static uint8_t state_of(gma__block_t *b) { return gma__load_relaxed(&b->state); }

static void region_free(gma__region_t *r) {
  if (!r) return;
  free(r->state);
  free(r->handle);
  free(r);
}

gma_status_t gma__vm_init(gma__pool_t *p) {
  const gma__device_ops_t *ops = p->dev->ops;
  if (!ops->vm_reserve)
    return gma__set_error(GMA_ERR_UNSUPPORTED,
                          "expandable_segments:true needs virtual memory management, which the "
                          "%s device does not offer; use expandable_segments:false",
                          p->dev->name);
  uint64_t gran = 0;
  gma_status_t st = ops->vm_granularity(p->dev, &gran);
  if (st != GMA_OK) return st;
  if (gran == 0 || gran % GMA__ROUND)
    return gma__set_error(GMA_ERR_DEVICE, "device granularity %" PRIu64 " is not a multiple of %u",
                          gran, GMA__ROUND);
  /* Growable segments map whole chunks: a limit below one chunk could never
   * map any (issue 13), so say so now rather than fail every allocation. */
  if (p->limit < gran)
    return gma__set_error(GMA_ERR_CONFIG,
                          "expandable_segments:true maps memory in chunks of %" PRIu64 " bytes "
                          "(the %s device's granularity), more than memory_limit (%" PRIu64
                          "); raise memory_limit to at least one chunk, or use "
                          "expandable_segments:false",
                          gran, p->dev->name, p->limit);
  /* Each kind may grow to the whole limit, so each reserves that much
   * address space (address space is cheap; memory is mapped on demand). */
  uint64_t size = round_up(p->limit, gran);
  for (int k = 0; k < GMA__NKINDS; k++) {
    gma__region_t *r = calloc(1, sizeof *r);
    if (r) {
      r->gran = gran;
      r->size = size;
      r->ngran = size / gran;
      r->kind = k;
      r->state = calloc(r->ngran, 1);
      r->handle = calloc(r->ngran, sizeof *r->handle);
    }
    if (!r || !r->state || !r->handle) {
      region_free(r);
      st = gma__set_error(GMA_ERR_OOM, "host memory for the growable segments' chunk table");
    } else if ((st = ops->vm_reserve(p->dev, size, &r->base)) != GMA_OK) {
      region_free(r);
    } else {
      p->region[k] = r;
      continue;
    }
    gma__vm_fini(p);
    return st;
  }
  return GMA_OK;
}

void gma__vm_fini(gma__pool_t *p) {
  for (int k = 0; k < GMA__NKINDS; k++) {
    gma__region_t *r = p->region[k];
    if (!r) continue;
    for (uint64_t i = 0; i < r->ngran; i++)
      if (r->state[i] != GMA__GRAN_UNMAPPED &&
          p->dev->ops->vm_unmap(p->dev, r->base + i * r->gran, r->gran, r->handle[i]) == GMA_OK)
        GMA__TRACE(p, GMA__TR_SEGMENT_UNMAP, r->base + i * r->gran, r->gran, 0, 0, 0, 0, 0);
    p->dev->ops->vm_release(p->dev, r->base, r->size);
    region_free(r);
    p->region[k] = NULL;
  }
}

/* The region segment that ends exactly at addr / starts exactly at addr. */
static gma__segment_t *seg_ending_at(gma__pool_t *p, gma__region_t *r, uintptr_t addr) {
  if (addr == r->base) return NULL;
  gma__segment_t *s = gma__seg_find(p, addr - 1);
  return s && s->region == r && s->base + s->size == addr ? s : NULL;
}
static gma__segment_t *seg_starting_at(gma__pool_t *p, gma__region_t *r, uintptr_t addr) {
  gma__segment_t *s = gma__seg_find(p, addr);
  return s && s->region == r && s->base == addr ? s : NULL;
}

/* Gives the MAPPED granules [addr, addr + size) to the pool as one FREE block:
 * appended to the segment ending at addr (or a new one), then the segment
 * starting right after is merged in; FREE neighbours coalesce. On failure
 * (host memory) nothing changed. */
static gma_status_t region_adopt(gma__pool_t *p, gma__region_t *r, uintptr_t addr,
                                 uint64_t size) {
  gma__segment_t *prev = seg_ending_at(p, r, addr);
  gma__segment_t *next = seg_starting_at(p, r, addr + size);
  gma__segment_t *seg = prev ? prev : calloc(1, sizeof *seg);
  gma__block_t *b = gma__block_new(p);
  if (!seg || !b || !gma__pagemap_set(&p->pagemap, addr, b)) {
    if (seg && seg != prev) free(seg);
    if (b) gma__block_recycle(p, b);
    return gma__set_error(GMA_ERR_OOM, "host memory for segment metadata");
  }
  b->addr = addr;
  b->size = size;
  b->seg = seg;
  if (prev) {
    b->prev = prev->last;
    prev->last->next = b;
    prev->last = b;
    prev->size += size;
  } else {
    seg->base = addr;
    seg->size = size;
    seg->kind = r->kind;
    seg->region = r;
    seg->first = seg->last = b;
    if (gma__segs_insert(p, seg) != GMA_OK) {
      gma__pagemap_set(&p->pagemap, addr, NULL);
      gma__block_recycle(p, b);
      free(seg);
      return gma__set_error(GMA_ERR_OOM, "host memory for the segment table");
    }
  }
  if (next) {
    for (gma__block_t *x = next->first; x; x = x->next) x->seg = seg;
    seg->last->next = next->first;
    next->first->prev = seg->last;
    seg->last = next->last;
    seg->size += next->size;
    gma__segs_remove(p, next);
    free(next);
  }
  gma__stat_add(&p->c.reserved, size);
  gma__block_make_free(p, b);
  return GMA_OK;
}

/* Unmaps granules [g0, g0 + n) that no segment covers, right away (undoing a
 * growth that failed half-way). A chunk the device will not unmap stays BUSY:
 * never reused, retried at destroy. */
static void unmap_now(gma__pool_t *p, gma__region_t *r, uint64_t g0, uint64_t n) {
  for (uint64_t i = g0; i < g0 + n; i++) {
    if (p->dev->ops->vm_unmap(p->dev, r->base + i * r->gran, r->gran, r->handle[i]) == GMA_OK) {
      r->state[i] = GMA__GRAN_UNMAPPED;
      continue;
    }
    r->state[i] = GMA__GRAN_BUSY;
    r->mapped += r->gran;
    r->busy += r->gran;
  }
}

/* Maps granules [g0, g0 + n) one chunk each (one physical allocation per
 * granule, so each can be unmapped on its own later). All or nothing. */
static gma_status_t map_run(gma__pool_t *p, gma__region_t *r, uint64_t g0, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    gma_status_t st = p->dev->ops->vm_map(p->dev, r->base + (g0 + i) * r->gran, r->gran,
                                          &r->handle[g0 + i]);
    if (st != GMA_OK) {
      unmap_now(p, r, g0, i);
      return st;
    }
  }
  memset(r->state + g0, GMA__GRAN_MAPPED, (size_t)n);
  r->mapped += n * r->gran;
  p->c.device_allocs += n;
  return GMA_OK;
}

static bool run_unmapped(const gma__region_t *r, uint64_t g0, uint64_t n) {
  if (g0 + n > r->ngran) return false;
  for (uint64_t i = 0; i < n; i++)
    if (r->state[g0 + i] != GMA__GRAN_UNMAPPED) return false;
  return true;
}

/* A FREE block's chunks that a trim could give back, in bytes. */
static uint64_t inside(const gma__block_t *b) {
  uint64_t g = b->seg->region->gran;
  uint64_t lo = round_up(b->addr, g), hi = (b->addr + b->size) / g * g;
  return hi > lo ? hi - lo : 0;
}

/* Where to map chunks for size bytes: *g0, *n, and the FREE block the new
 * chunks will extend (NULL for a fresh run). False when the range has no
 * room. Prefers extending a segment that ends in a FREE block: the chunks
 * coalesce with it, so fewer bytes need mapping; the largest tail wins. */
static bool plan_growth(gma__pool_t *p, gma__region_t *r, uint64_t size, uint64_t *g0,
                        uint64_t *n, gma__block_t **tail_block) {
  uint64_t g = r->gran;
  *g0 = UINT64_MAX;
  *n = 0;
  *tail_block = NULL;
  for (size_t i = 0; i < p->nsegs; i++) {
    gma__segment_t *seg = p->segs[i];
    if (seg->region != r || state_of(seg->last) != GMA__FREE) continue;
    uint64_t tail = seg->last->size;
    uint64_t need = round_up(size > tail ? size - tail : 0, g) / g;
    uint64_t end = (seg->base + seg->size - r->base) / g;
    if (need && (*g0 == UINT64_MAX || need < *n) && run_unmapped(r, end, need)) {
      *g0 = end;
      *n = need;
      *tail_block = seg->last;
    }
  }
  if (*g0 != UINT64_MAX) return true;
  *n = round_up(size, g) / g; /* first fit of a fresh run */
  for (uint64_t i = 0, run = 0; i < r->ngran; i++) {
    run = r->state[i] == GMA__GRAN_UNMAPPED ? run + 1 : 0;
    if (run == *n) {
      *g0 = i + 1 - *n;
      return true;
    }
  }
  return false;
}

/* Unmaps free chunks (inside FREE blocks other than keep) until want bytes
 * went back or none are left. Growth calls it first, so memory that is free
 * but in pieces too small for the request is given back rather than kept
 * beside the new chunks: reserved then follows what is live. */
static void release_for_growth(gma__pool_t *p, gma__region_t *r, uint64_t want,
                               const gma__block_t *keep) {
  uint64_t released = 0;
  for (size_t i = 0; i < p->nsegs && released < want;) {
    gma__segment_t *seg = p->segs[i];
    gma__block_t *b = seg->region == r ? seg->first : NULL;
    while (b && (b == keep || state_of(b) != GMA__FREE || !inside(b))) b = b->next;
    gma__vm_range_t x;
    if (b && gma__vm_detach(p, b, &x)) { /* the table changed: look at i again */
      x.unmapped = gma__vm_unmap(p, &x);
      gma__vm_finish(p, &x, x.unmapped);
      released += x.unmapped;
      if (x.unmapped < x.size) return; /* the device refuses: stop trying */
      continue;
    }
    i++;
  }
}

gma_status_t gma__vm_grow(gma__pool_t *p, int kind, uint64_t size) {
  gma__region_t *r = p->region[kind];
  uint64_t g = r->gran, g0, n;
  gma__block_t *tail;
  bool room = plan_growth(p, r, size, &g0, &n, &tail);
  if (room) { /* give back free chunks first, then plan again: the layout moved */
    release_for_growth(p, r, n * g, tail);
    room = plan_growth(p, r, size, &g0, &n, &tail);
  }
  if (!room)
    return gma__set_error(GMA_ERR_OOM,
                          "the growable segment's address range (%" PRIu64
                          " bytes) has no unmapped run of %" PRIu64 " bytes left",
                          r->size, n * g);
  if (p->c.reserved.current + n * g > p->limit)
    return gma__set_error(GMA_ERR_OOM, "memory_limit of %" PRIu64 " bytes reached", p->limit);
  gma_status_t st = map_run(p, r, g0, n);
  if (st != GMA_OK) return st;
  st = region_adopt(p, r, r->base + g0 * g, n * g);
  if (st == GMA_OK) GMA__TRACE(p, GMA__TR_SEGMENT_MAP, r->base + g0 * g, n * g, 0, 0, 0, 0, 0);
  if (st != GMA_OK) {
    r->mapped -= n * g;
    p->c.device_allocs -= n;
    unmap_now(p, r, g0, n);
  }
  return st;
}

bool gma__vm_detach(gma__pool_t *p, gma__block_t *b, gma__vm_range_t *out) {
  gma__segment_t *seg = b->seg;
  gma__region_t *r = seg->region;
  if (!r) return false;
  uint64_t g = r->gran;
  uintptr_t lo = (uintptr_t)round_up(b->addr, g), hi = (b->addr + b->size) / g * g;
  if (hi <= lo) return false;
  uintptr_t end = b->addr + b->size, seg_end = seg->base + seg->size;
  /* Get every record first, so a failure changes nothing. */
  bool right = hi < seg_end, right_block = hi < end, left_block = lo > b->addr;
  gma__segment_t *rseg = right ? calloc(1, sizeof *rseg) : NULL;
  gma__block_t *rb = right_block ? gma__block_new(p) : NULL;
  bool ok = (!right || rseg) && (!right_block || (rb && gma__pagemap_set(&p->pagemap, hi, rb)));
  if (ok && right) {
    rseg->base = hi;
    ok = gma__segs_insert(p, rseg) == GMA_OK;
    if (!ok && rb) gma__pagemap_set(&p->pagemap, hi, NULL);
  }
  if (!ok) {
    free(rseg);
    if (rb) gma__block_recycle(p, rb);
    return false;
  }
  gma__free_unlink(p, b);
  if (right) {
    gma__block_t *first = rb ? rb : b->next;
    if (rb) {
      rb->addr = hi;
      rb->size = end - hi;
      rb->next = b->next;
      if (b->next) b->next->prev = rb;
    }
    first->prev = NULL;
    rseg->size = seg_end - hi;
    rseg->kind = seg->kind;
    rseg->region = r;
    rseg->first = first;
    rseg->last = seg->last == b ? rb : seg->last;
    for (gma__block_t *x = first; x; x = x->next) x->seg = rseg;
    if (rb) gma__free_link(p, rb);
  }
  b->next = NULL;
  if (left_block) {
    b->size = lo - b->addr;
    seg->last = b;
    seg->size = lo - seg->base;
    gma__free_link(p, b);
  } else {
    gma__block_t *prev = b->prev;
    gma__pagemap_set(&p->pagemap, b->addr, NULL);
    gma__block_recycle(p, b);
    if (prev) {
      prev->next = NULL;
      seg->last = prev;
      seg->size = lo - seg->base;
    } else {
      gma__segs_remove(p, seg); /* b was all that was left of it */
      free(seg);
    }
  }
  gma__stat_sub(&p->c.reserved, hi - lo);
  memset(r->state + (lo - r->base) / g, GMA__GRAN_BUSY, (size_t)((hi - lo) / g));
  r->busy += hi - lo;
  *out = (gma__vm_range_t){.region = r, .addr = lo, .size = hi - lo};
  return true;
}

uint64_t gma__vm_unmap(gma__pool_t *p, const gma__vm_range_t *x) {
  gma__region_t *r = x->region;
  uint64_t done = 0;
  for (; done < x->size; done += r->gran) {
    uint64_t i = (x->addr + done - r->base) / r->gran;
    if (p->dev->ops->vm_unmap(p->dev, x->addr + done, r->gran, r->handle[i]) != GMA_OK) break;
  }
  return done;
}

void gma__vm_finish(gma__pool_t *p, const gma__vm_range_t *x, uint64_t unmapped) {
  gma__region_t *r = x->region;
  uint64_t g0 = (x->addr - r->base) / r->gran;
  memset(r->state + g0, GMA__GRAN_UNMAPPED, (size_t)(unmapped / r->gran));
  r->mapped -= unmapped;
  r->busy -= x->size;
  p->c.device_frees += unmapped / r->gran;
  p->c.bytes_trimmed += unmapped;
  if (unmapped) GMA__TRACE(p, GMA__TR_SEGMENT_UNMAP, x->addr, unmapped, 0, 0, 0, 0, 0);
  if (unmapped == x->size) return;
  /* The device refused: the rest is still mapped memory; use it again. If
   * even that fails (no host memory), the chunks stay BUSY: unusable but
   * never handed out, and unmapped at destroy. */
  uint64_t rest = x->size - unmapped;
  memset(r->state + g0 + unmapped / r->gran, GMA__GRAN_MAPPED, (size_t)(rest / r->gran));
  if (region_adopt(p, r, x->addr + unmapped, rest) != GMA_OK) {
    memset(r->state + g0 + unmapped / r->gran, GMA__GRAN_BUSY, (size_t)(rest / r->gran));
    r->busy += rest;
  }
}

void gma__vm_release_free(gma__pool_t *p) {
  for (int k = 0; k < GMA__NKINDS; k++) {
    gma__region_t *r = p->region[k];
    for (size_t i = 0; r && i < p->nsegs;) {
      gma__segment_t *seg = p->segs[i];
      gma__block_t *b = seg->region == r ? seg->first : NULL;
      while (b && (state_of(b) != GMA__FREE || !inside(b))) b = b->next;
      gma__vm_range_t x;
      /* A detach changes the segment table; look at the same index again. */
      if (b && gma__vm_detach(p, b, &x)) {
        gma__vm_finish(p, &x, gma__vm_unmap(p, &x));
        continue;
      }
      i++;
    }
  }
}

static int by_inside_desc(const void *a, const void *b) {
  uint64_t x = inside(*(gma__block_t *const *)a), y = inside(*(gma__block_t *const *)b);
  return x < y ? 1 : x > y ? -1 : 0;
}

size_t gma__vm_pick(gma__pool_t *p, const gma__release_t *rel, uint64_t *cached,
                    gma__vm_range_t **out, size_t *n_idle) {
  *out = NULL;
  *n_idle = 0;
  size_t nc = 0, cap = 0;
  gma__block_t **cand = NULL;
  for (size_t i = 0; i < p->nsegs; i++) {
    if (!p->segs[i]->region) continue;
    for (gma__block_t *b = p->segs[i]->first; b; b = b->next) {
      if (state_of(b) != GMA__FREE || !inside(b)) continue;
      if (!b->free_since_ns) b->free_since_ns = rel->now_ns;
      if (nc == cap) {
        cap = cap ? cap * 2 : 16;
        gma__block_t **a = realloc(cand, cap * sizeof *a);
        if (!a) break;
        cand = a;
      }
      cand[nc++] = b;
    }
  }
  gma__vm_range_t *ranges = nc ? malloc(nc * sizeof *ranges) : NULL;
  size_t n = 0;
  if (ranges) {
    /* Detaching one candidate never touches another: FREE blocks are never
     * neighbours (they are coalesced). Pass 0: idle ones; pass 1: largest
     * first until at most keep bytes of cache stay. */
    qsort(cand, nc, sizeof *cand, by_inside_desc);
    for (int pass = 0; pass < 2; pass++) {
      for (size_t i = 0; i < nc; i++) {
        gma__block_t *b = cand[i];
        if (!b) continue;
        bool idle = rel->idle_ns && rel->now_ns - b->free_since_ns >= rel->idle_ns;
        if (pass == 0 ? !idle : *cached <= rel->keep) continue;
        cand[i] = NULL;
        if (!gma__vm_detach(p, b, &ranges[n])) continue;
        *cached -= ranges[n].size < *cached ? ranges[n].size : *cached;
        n++;
        *n_idle += pass == 0;
      }
    }
  }
  free(cand);
  *out = ranges;
  return n;
}

bool gma__vm_is_valid(gma__pool_t *p) {
  for (int k = 0; k < GMA__NKINDS; k++) {
    gma__region_t *r = p->region[k];
    if (!r) continue;
    uint64_t covered = 0;
    for (size_t i = 0; i < p->nsegs; i++) {
      gma__segment_t *seg = p->segs[i];
      if (seg->region != r) continue;
      if (seg->base % r->gran || seg->size % r->gran || seg->base < r->base ||
          seg->base + seg->size > r->base + r->size) {
        gma__set_error(GMA_ERR_INTERNAL, "pool invariant: growable segment %p is not granular",
                       (void *)seg->base);
        return false;
      }
      for (uint64_t g = (seg->base - r->base) / r->gran, e = g + seg->size / r->gran; g < e; g++)
        if (r->state[g] != GMA__GRAN_MAPPED) {
          gma__set_error(GMA_ERR_INTERNAL, "pool invariant: segment covers an unmapped chunk");
          return false;
        }
      covered += seg->size;
    }
    if (covered + r->busy != r->mapped) {
      gma__set_error(GMA_ERR_INTERNAL,
                     "pool invariant: region maps %" PRIu64 " bytes, segments cover %" PRIu64
                     " and %" PRIu64 " are being unmapped",
                     r->mapped, covered, r->busy);
      return false;
    }
  }
  return true;
}
