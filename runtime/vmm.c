/* Owns growable segments (expandable_segments:true): per pool kind a list of
 * reserved address ranges, physical chunks mapped into them as the pool
 * grows (one vm_map per growth) and unmapped, whole, by trimming.
 *
 * A segment of a range is a run of adjacent mapped chunks, tiled by blocks
 * like any segment. Mapping a chunk next to a segment extends it (and merges
 * it with a segment that starts right after), so a FREE block at the end of
 * one chunk coalesces with the new chunk: a growing workload gets one large
 * free block instead of many segment-sized ones.
 *
 * Chunk sizes. A growth maps the request's shortfall (what the FREE tail of
 * the segment it extends lacks, or the whole request for a fresh run),
 * rounded to the granularity, in ONE vm_map: a 1 GiB tensor costs one map,
 * not 512. A small shortfall maps a minimum chunk instead, a fraction of
 * what the kind already maps (1/MIN_CHUNK_DIV, at most the kind's segment
 * size, capped by the memory limit), so many small requests share a chunk
 * while the unused part of the newest chunk stays a small share of the pool.
 *
 * Trimming. The device can only unmap what one vm_map mapped, so trimming
 * gives back the whole chunks that lie inside FREE blocks; a chunk partly in
 * use stays mapped (its free part is still in the free tree). FREE means
 * every stream's work on the memory has completed (its epoch events passed),
 * so unmapping it never pulls memory from under a kernel.
 *
 * Address space. The first range of a kind is RANGE_MULT times the memory
 * limit; when no range has an unmapped run for a growth, another is
 * reserved, so a request fails only when memory (the limit, the device) is
 * short, never for want of a hole in the address space.
 *
 * Everything here runs under the pool lock except gma__vm_unmap, which works
 * on copies of detached (busy) chunk records that no other thread touches. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

/* The first range of a kind spans this many times the memory limit. */
#define RANGE_MULT 4u
/* No range larger than this (the simulated device takes at most 64 TiB). */
#define RANGE_MAX ((uint64_t)16 << 40)
/* A growth maps at least 1/MIN_CHUNK_DIV of what its kind maps already. */
#define MIN_CHUNK_DIV 16u

static uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }
static uint8_t state_of(gma__block_t *b) { return gma__load_relaxed(&b->state); }

/* ---- The chunk table -------------------------------------------------------------*/

/* The index of the first chunk at or above addr. */
static size_t chunk_lb(const gma__region_t *r, uintptr_t addr) {
  size_t lo = 0, hi = r->nchunks;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (r->chunks[mid].addr < addr) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Room for one more record (so an insert after a map cannot fail). */
static bool chunks_reserve(gma__region_t *r) {
  if (r->nchunks < r->cap) return true;
  size_t cap = r->cap ? r->cap * 2 : 16;
  gma__chunk_t *a = realloc(r->chunks, cap * sizeof *a);
  if (!a) return false;
  r->chunks = a;
  r->cap = cap;
  return true;
}

static void chunks_insert(gma__region_t *r, uintptr_t addr, uint64_t size, uint64_t handle) {
  size_t i = chunk_lb(r, addr);
  memmove(r->chunks + i + 1, r->chunks + i, (r->nchunks - i) * sizeof *r->chunks);
  r->chunks[i] = (gma__chunk_t){.addr = addr, .size = size, .handle = handle};
  r->nchunks++;
  r->mapped += size;
}

static void chunks_remove(gma__region_t *r, size_t i, size_t n) {
  memmove(r->chunks + i, r->chunks + i + n, (r->nchunks - i - n) * sizeof *r->chunks);
  r->nchunks -= n;
}

/* The unmapped bytes from addr up to the next chunk or the range's end. */
static uint64_t room_at(const gma__region_t *r, uintptr_t addr) {
  size_t i = chunk_lb(r, addr);
  if (i > 0 && r->chunks[i - 1].addr + r->chunks[i - 1].size > addr) return 0;
  return (i < r->nchunks ? r->chunks[i].addr : r->base + r->size) - addr;
}

/* The whole chunks inside FREE block b: chunks [*i, *j), bytes [*lo, *hi). */
static uint64_t inside_of(const gma__block_t *b, size_t *i, size_t *j, uintptr_t *lo,
                          uintptr_t *hi) {
  const gma__region_t *r = b->seg->region;
  uintptr_t end = b->addr + b->size;
  size_t a = chunk_lb(r, b->addr), z = a;
  while (z < r->nchunks && r->chunks[z].addr + r->chunks[z].size <= end) z++;
  if (i) *i = a, *j = z;
  if (z == a) return 0;
  *lo = r->chunks[a].addr;
  *hi = r->chunks[z - 1].addr + r->chunks[z - 1].size;
  return *hi - *lo;
}

static uint64_t inside(const gma__block_t *b) {
  uintptr_t lo, hi;
  return inside_of(b, NULL, NULL, &lo, &hi);
}

/* ---- Ranges -----------------------------------------------------------------------*/

static void region_free(gma__region_t *r) {
  if (!r) return;
  free(r->chunks);
  free(r);
}

/* Reserves a range of about want bytes (at least least) and appends it to
 * the kind's list; a device that refuses a large reservation is asked for
 * half as much, down to least. */
static gma_status_t region_add(gma__pool_t *p, int kind, uint64_t gran, uint64_t want,
                               uint64_t least, gma__region_t **out) {
  gma__region_t *r = calloc(1, sizeof *r);
  if (!r) return gma__set_error(GMA_ERR_OOM, "host memory for a growable segment's range");
  r->gran = gran;
  r->kind = kind;
  gma_status_t st;
  for (uint64_t size = want;; size = round_up(size / 2, gran)) {
    if (size < least) size = least;
    st = p->dev->ops->vm_reserve(p->dev, size, &r->base);
    if (st == GMA_OK) {
      r->size = size;
      break;
    }
    if (size == least) {
      free(r);
      return st;
    }
  }
  gma__region_t **at = &p->region[kind];
  while (*at) at = &(*at)->next;
  *at = r;
  *out = r;
  return GMA_OK;
}

static uint64_t range_size(const gma__pool_t *p, uint64_t gran) {
  uint64_t size = p->limit > RANGE_MAX / RANGE_MULT ? RANGE_MAX : p->limit * RANGE_MULT;
  return round_up(size, gran);
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
  /* Each kind may grow to the whole limit and its address space fragments
   * as chunks come and go, so each reserves several times the limit
   * (address space is cheap; memory is mapped on demand), and more later
   * when that runs out. */
  for (int k = 0; k < GMA__NKINDS; k++) {
    gma__region_t *r;
    st = region_add(p, k, gran, range_size(p, gran), round_up(p->limit, gran), &r);
    if (st != GMA_OK) {
      gma__vm_fini(p);
      return st;
    }
  }
  return GMA_OK;
}

void gma__vm_fini(gma__pool_t *p) {
  for (int k = 0; k < GMA__NKINDS; k++) {
    while (p->region[k]) {
      gma__region_t *r = p->region[k];
      for (size_t i = 0; i < r->nchunks; i++) {
        gma__chunk_t *c = &r->chunks[i];
        if (p->dev->ops->vm_unmap(p->dev, c->addr, c->size, c->handle) == GMA_OK)
          GMA__TRACE(p, GMA__TR_SEGMENT_UNMAP, c->addr, c->size, 0, 0, 0, 0, 0);
      }
      p->dev->ops->vm_release(p->dev, r->base, r->size);
      p->region[k] = r->next;
      region_free(r);
    }
  }
}

/* ---- Segments over chunks ---------------------------------------------------------*/

/* The range segment that ends exactly at addr / starts exactly at addr. */
static gma__segment_t *seg_ending_at(gma__pool_t *p, gma__region_t *r, uintptr_t addr) {
  if (addr == r->base) return NULL;
  gma__segment_t *s = gma__seg_find(p, addr - 1);
  return s && s->region == r && s->base + s->size == addr ? s : NULL;
}
static gma__segment_t *seg_starting_at(gma__pool_t *p, gma__region_t *r, uintptr_t addr) {
  gma__segment_t *s = gma__seg_find(p, addr);
  return s && s->region == r && s->base == addr ? s : NULL;
}

/* Gives the mapped chunks [addr, addr + size) to the pool as one FREE block:
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

/* ---- Growth -----------------------------------------------------------------------*/

/* Where a growth maps: need bytes (the least that serves the request) at
 * addr in r, with room unmapped bytes there; tail is the FREE block the new
 * chunk extends (NULL for a fresh run). */
typedef struct plan {
  gma__region_t *r;
  uintptr_t addr;
  uint64_t need, room;
  gma__block_t *tail;
} plan_t;

/* Plans a growth for size bytes of kind; false when no range has room.
 * Prefers extending a segment that ends in a FREE block (the chunk
 * coalesces with it, so fewer bytes need mapping; the largest tail wins),
 * else the first unmapped run that holds the request. */
static bool plan_growth(gma__pool_t *p, int kind, uint64_t size, plan_t *pl) {
  uint64_t g = p->region[kind]->gran;
  *pl = (plan_t){.need = round_up(size, g)};
  for (size_t i = 0; i < p->nsegs; i++) {
    gma__segment_t *seg = p->segs[i];
    if (!seg->region || seg->kind != kind || state_of(seg->last) != GMA__FREE) continue;
    uint64_t tail = seg->last->size;
    if (tail >= size) continue; /* (the free tree would have served it) */
    uint64_t need = round_up(size - tail, g);
    if (pl->tail && need >= pl->need) continue;
    uintptr_t end = seg->base + seg->size;
    uint64_t room = room_at(seg->region, end);
    if (room < need) continue;
    *pl = (plan_t){.r = seg->region, .addr = end, .need = need, .room = room, .tail = seg->last};
  }
  if (pl->tail) return true;
  for (gma__region_t *r = p->region[kind]; r; r = r->next) {
    uintptr_t at = r->base;
    for (size_t i = 0; i <= r->nchunks; i++) {
      uintptr_t end = i < r->nchunks ? r->chunks[i].addr : r->base + r->size;
      if (end - at >= pl->need) {
        pl->r = r;
        pl->addr = at;
        pl->room = end - at;
        return true;
      }
      if (i < r->nchunks) at = r->chunks[i].addr + r->chunks[i].size;
    }
  }
  return false;
}

/* How much a growth that needs need bytes maps: at least a minimum chunk
 * (1/MIN_CHUNK_DIV of what the kind maps, at most its segment size), so
 * small growths do not map one granule each while the part of the newest
 * chunk not yet used stays a small share of the pool; never more than the
 * room at the spot or what the memory limit leaves. */
static uint64_t chunk_size(const gma__pool_t *p, int kind, const plan_t *pl) {
  uint64_t g = pl->r->gran, mapped = 0;
  for (const gma__region_t *r = p->region[kind]; r; r = r->next) mapped += r->mapped;
  uint64_t least = mapped / MIN_CHUNK_DIV / g * g, cap = round_up(p->segment_size[kind], g);
  if (least > cap) least = cap;
  if (least <= pl->need) return pl->need;
  if (least > pl->room) least = pl->room / g * g;
  uint64_t left = p->limit - p->c.reserved.current; /* >= need: checked */
  if (least > left) least = left / g * g;
  return least > pl->need ? least : pl->need;
}

/* Maps size bytes at addr in r as one chunk and gives it to the pool. All or
 * nothing (a chunk the pool cannot take is unmapped again, or, if the device
 * refuses that, kept busy: never handed out, unmapped at destroy). */
static gma_status_t map_chunk(gma__pool_t *p, gma__region_t *r, uintptr_t addr, uint64_t size) {
  if (!chunks_reserve(r)) return gma__set_error(GMA_ERR_OOM, "host memory for the chunk table");
  uint64_t h;
  gma_status_t st = p->dev->ops->vm_map(p->dev, addr, size, &h);
  if (st != GMA_OK) return st;
  chunks_insert(r, addr, size, h);
  p->c.device_allocs++;
  st = region_adopt(p, r, addr, size);
  if (st == GMA_OK) {
    GMA__TRACE(p, GMA__TR_SEGMENT_MAP, addr, size, 0, 0, 0, 0, 0);
    return GMA_OK;
  }
  size_t i = chunk_lb(r, addr);
  p->c.device_allocs--;
  if (p->dev->ops->vm_unmap(p->dev, addr, size, h) == GMA_OK) {
    chunks_remove(r, i, 1);
    r->mapped -= size;
  } else {
    r->chunks[i].busy = 1;
    r->busy += size;
  }
  return st;
}

/* Unmaps whole free chunks (inside FREE blocks other than keep) until want
 * bytes went back or none are left: first the kind's own, then the other
 * kind's (the small pool's free chunks cannot serve a large request either).
 * Growth calls it first, so memory that is free but in pieces too small for
 * the request is given back rather than kept beside the new chunk: reserved
 * then follows what is live. */
static void release_for_growth(gma__pool_t *p, int kind, uint64_t want,
                               const gma__block_t *keep) {
  uint64_t released = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < p->nsegs && released < want;) {
      gma__segment_t *seg = p->segs[i];
      gma__block_t *b =
          seg->region && (pass == 0 ? seg->kind == kind : seg->kind != kind) ? seg->first : NULL;
      while (b && (b == keep || state_of(b) != GMA__FREE || !inside(b))) b = b->next;
      gma__vm_range_t x;
      if (b && gma__vm_detach(p, b, &x)) { /* the table changed: look at i again */
        x.unmapped = gma__vm_unmap(p, &x);
        uint64_t done = x.unmapped, size = x.size;
        gma__vm_finish(p, &x, done);
        released += done;
        if (done < size) return; /* the device refuses: stop trying */
        continue;
      }
      i++;
    }
  }
}

gma_status_t gma__vm_grow(gma__pool_t *p, int kind, uint64_t size) {
  uint64_t g = p->region[kind]->gran;
  plan_t pl;
  plan_growth(p, kind, size, &pl);
  /* Give back free chunks first, then plan again: the layout moved. */
  release_for_growth(p, kind, pl.need, pl.tail);
  bool room = plan_growth(p, kind, size, &pl);
  if (p->c.reserved.current + pl.need > p->limit)
    return gma__set_error(GMA_ERR_OOM, "memory_limit of %" PRIu64 " bytes reached", p->limit);
  if (!room) { /* every range is too fragmented for this run: reserve another */
    gma_status_t st = region_add(p, kind, g, range_size(p, g), pl.need, &pl.r);
    if (st != GMA_OK) return st;
    pl.addr = pl.r->base;
    pl.room = pl.r->size;
  }
  uint64_t want = chunk_size(p, kind, &pl);
  gma_status_t st = map_chunk(p, pl.r, pl.addr, want);
  if (st == GMA_ERR_OOM && want > pl.need) st = map_chunk(p, pl.r, pl.addr, pl.need);
  return st;
}

/* ---- Trimming ---------------------------------------------------------------------*/

bool gma__vm_detach(gma__pool_t *p, gma__block_t *b, gma__vm_range_t *out) {
  gma__segment_t *seg = b->seg;
  gma__region_t *r = seg->region;
  if (!r) return false;
  size_t ci, cj;
  uintptr_t lo, hi;
  if (!inside_of(b, &ci, &cj, &lo, &hi)) return false;
  uintptr_t end = b->addr + b->size, seg_end = seg->base + seg->size;
  /* Get every record first, so a failure changes nothing. */
  bool right = hi < seg_end, right_block = hi < end, left_block = lo > b->addr;
  gma__chunk_t *copy = malloc((cj - ci) * sizeof *copy);
  gma__segment_t *rseg = right ? calloc(1, sizeof *rseg) : NULL;
  gma__block_t *rb = right_block ? gma__block_new(p) : NULL;
  bool ok = copy && (!right || rseg) &&
            (!right_block || (rb && gma__pagemap_set(&p->pagemap, hi, rb)));
  if (ok && right) {
    rseg->base = hi;
    ok = gma__segs_insert(p, rseg) == GMA_OK;
    if (!ok && rb) gma__pagemap_set(&p->pagemap, hi, NULL);
  }
  if (!ok) {
    free(copy);
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
  for (size_t i = ci; i < cj; i++) r->chunks[i].busy = 1;
  memcpy(copy, r->chunks + ci, (cj - ci) * sizeof *copy);
  r->busy += hi - lo;
  *out = (gma__vm_range_t){
      .region = r, .addr = lo, .size = hi - lo, .chunks = copy, .nchunks = cj - ci};
  return true;
}

uint64_t gma__vm_unmap(gma__pool_t *p, const gma__vm_range_t *x) {
  uint64_t done = 0;
  for (size_t i = 0; i < x->nchunks; i++) {
    const gma__chunk_t *c = &x->chunks[i];
    if (p->dev->ops->vm_unmap(p->dev, c->addr, c->size, c->handle) != GMA_OK) break;
    done += c->size;
  }
  return done;
}

void gma__vm_finish(gma__pool_t *p, gma__vm_range_t *x, uint64_t unmapped) {
  gma__region_t *r = x->region;
  size_t i = chunk_lb(r, x->addr), n = 0;
  for (uint64_t sum = 0; sum < unmapped; n++) sum += x->chunks[n].size;
  chunks_remove(r, i, n);
  r->mapped -= unmapped;
  r->busy -= x->size;
  p->c.device_frees += n;
  p->c.bytes_trimmed += unmapped;
  free(x->chunks);
  x->chunks = NULL;
  if (unmapped) GMA__TRACE(p, GMA__TR_SEGMENT_UNMAP, x->addr, unmapped, 0, 0, 0, 0, 0);
  if (unmapped == x->size) return;
  /* The device refused: the rest is still mapped memory; use it again. If
   * even that fails (no host memory), the chunks stay busy: unusable but
   * never handed out, and unmapped at destroy. */
  uint64_t rest = x->size - unmapped;
  size_t m = 0;
  for (uint64_t sum = 0; sum < rest; m++) sum += r->chunks[i + m].size;
  for (size_t k = 0; k < m; k++) r->chunks[i + k].busy = 0;
  if (region_adopt(p, r, x->addr + unmapped, rest) != GMA_OK) {
    for (size_t k = 0; k < m; k++) r->chunks[i + k].busy = 1;
    r->busy += rest;
  }
}

void gma__vm_release_free(gma__pool_t *p) {
  for (size_t i = 0; i < p->nsegs;) {
    gma__segment_t *seg = p->segs[i];
    gma__block_t *b = seg->region ? seg->first : NULL;
    while (b && (state_of(b) != GMA__FREE || !inside(b))) b = b->next;
    gma__vm_range_t x;
    /* A detach changes the segment table; look at the same index again. */
    if (b && gma__vm_detach(p, b, &x)) {
      uint64_t size = x.size, done = gma__vm_unmap(p, &x);
      gma__vm_finish(p, &x, done);
      if (done < size) return; /* the device refuses: stop trying */
      continue;
    }
    i++;
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

static bool invalid(const char *what, uintptr_t addr) {
  gma__set_error(GMA_ERR_INTERNAL, "pool invariant: %s (at %p)", what, (void *)addr);
  return false;
}

bool gma__vm_is_valid(gma__pool_t *p) {
  for (int k = 0; k < GMA__NKINDS; k++) {
    for (gma__region_t *r = p->region[k]; r; r = r->next) {
      if (r->kind != k || !r->gran || r->base % r->gran || r->size % r->gran)
        return invalid("a growable range is not granular or in the wrong list", r->base);
      uint64_t mapped = 0, busy = 0;
      for (size_t i = 0; i < r->nchunks; i++) {
        const gma__chunk_t *c = &r->chunks[i];
        if (!c->size || c->addr % r->gran || c->size % r->gran || c->addr < r->base ||
            c->addr - r->base > r->size - c->size)
          return invalid("a chunk is not granular or lies outside its range", c->addr);
        if (i && r->chunks[i - 1].addr + r->chunks[i - 1].size > c->addr)
          return invalid("chunks overlap or are out of order", c->addr);
        mapped += c->size;
        busy += c->busy ? c->size : 0;
      }
      if (mapped != r->mapped || busy != r->busy)
        return invalid("a range's mapped or busy bytes differ from its chunks", r->base);
      /* Each segment is a run of adjacent non-busy chunks, starting and
       * ending on chunk boundaries. */
      uint64_t covered = 0;
      for (size_t s = 0; s < p->nsegs; s++) {
        gma__segment_t *seg = p->segs[s];
        if (seg->region != r) continue;
        if (seg->kind != k) return invalid("a growable segment's kind differs", seg->base);
        size_t i = chunk_lb(r, seg->base);
        uintptr_t at = seg->base, end = seg->base + seg->size;
        for (; at < end && i < r->nchunks && r->chunks[i].addr == at && !r->chunks[i].busy; i++)
          at += r->chunks[i].size;
        if (at != end)
          return invalid("a growable segment is not a run of whole mapped chunks", seg->base);
        covered += seg->size;
      }
      if (covered + r->busy != r->mapped) {
        gma__set_error(GMA_ERR_INTERNAL,
                       "pool invariant: range maps %" PRIu64 " bytes, segments cover %" PRIu64
                       " and %" PRIu64 " are being unmapped",
                       r->mapped, covered, r->busy);
        return false;
      }
    }
  }
  /* Every growable segment belongs to one of its kind's ranges. */
  for (size_t s = 0; s < p->nsegs; s++) {
    gma__segment_t *seg = p->segs[s];
    if (!seg->region) continue;
    gma__region_t *r = p->region[seg->kind < GMA__NKINDS ? seg->kind : 0];
    while (r && r != seg->region) r = r->next;
    if (!r) return invalid("a growable segment's range is not in its kind's list", seg->base);
  }
  return true;
}
