/* Owns growable address ranges, the segment source behind
 * expandable_segments:true (source.h): per pool kind a list of reserved
 * address ranges, the table of physical chunks mapped into each, and the
 * device's vm_* calls. It deals only in address ranges: the pool (pool.c,
 * segments.c) turns what it maps into segments and blocks, merges a chunk
 * mapped next to a segment into it, and splits segments around what goes
 * back; nothing here touches a segment, a block or a tree.
 *
 * Chunk sizes. A growth maps the request's shortfall (what the FREE tail of
 * the segment it extends lacks, or the whole request for a fresh run),
 * rounded to the granularity, in up to GROWTH_PIECES vm_maps of equal
 * size, none smaller than the granularity or 1/256 of the memory limit
 * (pieces_of): a 1 GiB tensor costs at most 64 maps, not 512 (and 3 on an
 * 80 GiB device), and when a later, smaller block takes part of its place,
 * the free rest spans whole chunks that can go back. A smaller
 * shortfall maps the kind's minimum chunk instead (chunk[kind]: the large
 * kind's segment size, 20 MiB by default, as PyTorch's expandable segments
 * map for their large pool; four small segments, 8 MiB, for the small
 * kind, whose blocks are at most 1 MiB), so many growths share one map.
 * While a kind has mapped less than CHUNK_SHARE of those chunks, its
 * minimum chunk is a quarter of what it has mapped, at least one segment:
 * a program with a few small tensors maps 2 MiB for them, not 8. Near the
 * memory limit a chunk would strand
 * memory the other kind may need: a minimum chunk larger than a sixteenth of
 * what the limit still allows (NEAR_LIMIT_DIV) maps just the shortfall.
 * The pool offers the segment ends it could extend (gma__tail_t); the plan
 * picks one, so the pool can merge the new chunk into that segment.
 *
 * Giving back. The device can only unmap what one vm_map mapped, so only
 * whole chunks go back: releasable says which chunks lie wholly inside a
 * free range the pool offers; a chunk partly in use stays mapped. A span
 * given back with keep (the OOM retry) keeps its chunks' physical memory
 * in the handle pool (kept[]): the next growth maps kept chunks first, at
 * its own address (map_kept), and frees those too large for it when new
 * chunks do not fit beside them; free_kept (a trim) frees them all.
 *
 * Address space. The first range of a kind is RANGE_MULT times the memory
 * limit; when no range has an unmapped run for a growth, another is
 * reserved, so a request fails only when memory (the limit, the device) is
 * short, never for want of a hole in the address space. A fresh run goes
 * to the first unmapped run that holds it, right behind the memory before
 * (so the two merge into one segment), unless a segment ends there in
 * memory nobody holds live (the pool's idle ends, gma__tail_t): then it
 * starts halfway into the run, leaving that segment room to grow in place
 * (another stream's cached or pending end, which this growth may not use,
 * may be extended by its own stream later).
 *
 * Everything here runs under the pool lock except vm_give_back, which works
 * on copies of taken (busy) chunk records that no other thread touches. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/round.h"
#include "source/vmm.h"

/* The first range of a kind spans this many times the memory limit. */
#define RANGE_MULT 4u
/* No range larger than this (the simulated device takes at most 64 TiB). */
#define RANGE_MAX ((uint64_t)16 << 40)
/* A minimum chunk larger than 1/NEAR_LIMIT_DIV of what the memory limit
 * still allows maps just the shortfall. */
#define NEAR_LIMIT_DIV 16u
/* The small kind's minimum chunk, once its pool is large, in small
 * segments. */
#define SMALL_CHUNK_SEGMENTS 4u
/* A kind's minimum chunk is at most 1/CHUNK_SHARE of what it has mapped
 * (but at least one segment). */
#define CHUNK_SHARE 4u

/* The growable source: what source.h's base needs, plus the ranges. */
typedef struct vm_source {
  gma__source_t base;
  uint64_t limit;                       /* the pool's memory limit */
  uint64_t chunk[GMA__NKINDS];          /* each kind's minimum chunk (granular) */
  uint64_t first[GMA__NKINDS];          /* ... while little is mapped: one segment */
  gma__region_t *region[GMA__NKINDS];   /* each kind's ranges (a list) */
  /* The handle pool: kept chunks (addr 0), base.kept_chunks of them, of
   * base.kept_bytes; room for kept_cap (take reserves it, so settle cannot
   * fail). */
  gma__chunk_t *kept;
  size_t kept_cap;
} vm_source_t;

static const gma__source_ops_t vm_ops;

static vm_source_t *vm_of(gma__source_t *s) { return (vm_source_t *)s; }

gma__region_t *gma__vm_ranges(const gma__source_t *s, int kind) {
  return s && s->ops == &vm_ops ? ((const vm_source_t *)s)->region[kind] : NULL;
}


#define VM_TRACE(s, action, addr, size)                                                      \
  do {                                                                                       \
    gma__trace_t *t_ = gma__trace_on((s)->trace);                                            \
    if (t_) gma__trace_emit(t_, gma__trace_now(), (action), (addr), (size), 0, 0, 0, 0, 0);  \
  } while (0)

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

/* The whole chunks inside [addr, addr + size) of r: chunks [*i, *j),
 * bytes [*lo, *hi). */
static uint64_t inside_of(const gma__region_t *r, uintptr_t addr, uint64_t size, size_t *i,
                          size_t *j, uintptr_t *lo, uintptr_t *hi) {
  uintptr_t end = addr + size;
  size_t a = chunk_lb(r, addr), z = a;
  while (z < r->nchunks && r->chunks[z].addr + r->chunks[z].size <= end) z++;
  if (i) *i = a, *j = z;
  if (z == a) return 0;
  *lo = r->chunks[a].addr;
  *hi = r->chunks[z - 1].addr + r->chunks[z - 1].size;
  return *hi - *lo;
}

static uint64_t vm_releasable(const gma__source_t *s, const void *range, uintptr_t addr,
                              uint64_t size, uint64_t want, uintptr_t *lo, uintptr_t *hi) {
  (void)s;
  const gma__region_t *r = range;
  size_t a, z;
  uint64_t n = inside_of(r, addr, size, &a, &z, lo, hi);
  if (!want || n <= want) return n;
  /* The last chunks only: while the ones after a still hold want, a moves up. */
  while (a + 1 < z && *hi - r->chunks[a + 1].addr >= want) a++;
  *lo = r->chunks[a].addr;
  return *hi - *lo;
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
static gma_status_t region_add(vm_source_t *v, int kind, uint64_t gran, uint64_t want,
                               uint64_t least, gma__region_t **out) {
  gma__device_t *dev = v->base.dev;
  gma__region_t *r = calloc(1, sizeof *r);
  if (!r) return gma__set_error(GMA_ERR_OOM, "host memory for a growable segment's range");
  r->gran = gran;
  r->kind = kind;
  gma_status_t st;
  for (uint64_t size = want;; size = gma__round_up(size / 2, gran)) {
    if (size < least) size = least;
    st = dev->ops->vm_reserve(dev, size, &r->base);
    if (st == GMA_OK) {
      r->size = size;
      break;
    }
    if (size == least) {
      free(r);
      return st;
    }
  }
  gma__region_t **at = &v->region[kind];
  while (*at) at = &(*at)->next;
  *at = r;
  v->base.ranges++;
  v->base.range_bytes += r->size;
  *out = r;
  return GMA_OK;
}

static uint64_t range_size(const vm_source_t *v, uint64_t gran) {
  uint64_t size = v->limit > RANGE_MAX / RANGE_MULT ? RANGE_MAX : v->limit * RANGE_MULT;
  return gma__round_up(size, gran);
}

static uint64_t vm_free_kept(gma__source_t *s, uint64_t *calls);

static void vm_fini(gma__source_t *s) {
  vm_source_t *v = vm_of(s);
  gma__device_t *dev = s->dev;
  uint64_t calls;
  vm_free_kept(s, &calls);
  free(v->kept);
  for (int k = 0; k < GMA__NKINDS; k++) {
    while (v->region[k]) {
      gma__region_t *r = v->region[k];
      for (size_t i = 0; i < r->nchunks; i++) {
        gma__chunk_t *c = &r->chunks[i];
        if (dev->ops->vm_unmap(dev, c->addr, c->size, c->handle) == GMA_OK)
          VM_TRACE(s, GMA__TR_SEGMENT_UNMAP, c->addr, c->size);
      }
      dev->ops->vm_release(dev, r->base, r->size);
      v->region[k] = r->next;
      region_free(r);
    }
  }
  free(v);
}

gma_status_t gma__vm_source_new(gma__device_t *dev, gma__trace_t *_Atomic const *trace,
                                uint64_t limit, const uint64_t segment_size[2],
                                gma__source_t **out) {
  const gma__device_ops_t *ops = dev->ops;
  if (!ops->vm_reserve)
    return gma__set_error(GMA_ERR_UNSUPPORTED,
                          "expandable_segments:true needs virtual memory management, which the "
                          "%s device does not offer; use expandable_segments:false",
                          dev->name);
  uint64_t gran = 0;
  gma_status_t st = ops->vm_granularity(dev, &gran);
  if (st != GMA_OK) return st;
  if (gran == 0 || gran % GMA__ROUND)
    return gma__set_error(GMA_ERR_DEVICE, "device granularity %" PRIu64 " is not a multiple of %u",
                          gran, GMA__ROUND);
  /* Growable segments map whole chunks: a limit below one chunk could never
   * map any, so say so now rather than fail every allocation. */
  if (limit < gran)
    return gma__set_error(GMA_ERR_CONFIG,
                          "expandable_segments:true maps memory in chunks of %" PRIu64 " bytes "
                          "(the %s device's granularity), more than memory_limit (%" PRIu64
                          "); raise memory_limit to at least one chunk, or use "
                          "expandable_segments:false",
                          gran, dev->name, limit);
  vm_source_t *v = calloc(1, sizeof *v);
  if (!v) return gma__set_error(GMA_ERR_OOM, "host memory for a growable segment source");
  v->base = (gma__source_t){.ops = &vm_ops, .dev = dev, .trace = trace};
  v->limit = limit;
  v->chunk[GMA__SMALL] = gma__round_up(segment_size[GMA__SMALL] * SMALL_CHUNK_SEGMENTS, gran);
  v->chunk[GMA__LARGE] = gma__round_up(segment_size[GMA__LARGE], gran);
  for (int k = 0; k < GMA__NKINDS; k++) v->first[k] = gma__round_up(segment_size[k], gran);
  /* Each kind may grow to the whole limit and its address space fragments
   * as chunks come and go, so each reserves several times the limit
   * (address space is cheap; memory is mapped on demand), and more later
   * when that runs out. */
  for (int k = 0; k < GMA__NKINDS; k++) {
    gma__region_t *r;
    /* At least as large as the limit, where the address space allows (a
     * later growth reserves another range when this one is full). */
    uint64_t least = gma__round_up(limit < RANGE_MAX ? limit : RANGE_MAX, gran);
    st = region_add(v, k, gran, range_size(v, gran), least, &r);
    if (st != GMA_OK) {
      vm_fini(&v->base);
      return st;
    }
  }
  *out = &v->base;
  return GMA_OK;
}

/* ---- Growth -----------------------------------------------------------------------*/

/* Does a segment of r with an idle end end at addr? */
static bool idle_end(const gma__grow_req_t *req, const gma__region_t *r, uintptr_t addr) {
  for (size_t i = 0; i < req->ntails; i++)
    if (req->tails[i].range == r && req->tails[i].end == addr) return true;
  return false;
}

/* Plans a growth for req->size bytes of req->kind; false when no range has
 * room. Prefers extending one of the segment ends the pool offers
 * (req->tails with offer: the chunk merges with its free block, so fewer
 * bytes need mapping; the one that needs least wins), else the first
 * unmapped run that holds the request, starting halfway into it when it
 * begins at an idle end. */
static bool vm_plan(gma__source_t *s, const gma__grow_req_t *req, gma__plan_t *pl) {
  vm_source_t *v = vm_of(s);
  uint64_t g = v->region[req->kind]->gran, size = req->size;
  *pl = (gma__plan_t){.need = gma__round_up(size, g), .tail = -1};
  for (size_t i = 0; i < req->ntails; i++) {
    const gma__tail_t *t = &req->tails[i];
    if (!t->offer) continue;
    uint64_t need = gma__round_up(size - t->free, g);
    if (pl->tail >= 0 && need >= pl->need) continue;
    uint64_t room = room_at(t->range, t->end);
    if (room < need) continue;
    *pl = (gma__plan_t){
        .range = t->range, .addr = t->end, .need = need, .room = room, .tail = (ptrdiff_t)i};
  }
  if (pl->tail >= 0) return true;
  for (gma__region_t *r = v->region[req->kind]; r; r = r->next) {
    uintptr_t at = r->base;
    for (size_t i = 0; i <= r->nchunks; i++) {
      uintptr_t end = i < r->nchunks ? r->chunks[i].addr : r->base + r->size;
      if (end - at >= pl->need) {
        /* Right behind an idle end, the run starts halfway into the gap,
         * so that segment can still grow in place. */
        uint64_t slack = idle_end(req, r, at) ? (end - at - pl->need) / 2 / g * g : 0;
        pl->range = r;
        pl->addr = at + slack;
        pl->room = end - at - slack;
        return true;
      }
      if (i < r->nchunks) at = r->chunks[i].addr + r->chunks[i].size;
    }
  }
  return false;
}

/* The kind's minimum chunk now: one segment while the kind has little
 * mapped, growing with what it has (1/CHUNK_SHARE of it) up to chunk[kind],
 * so a small pool stays small and a large one maps few chunks. */
static uint64_t least_chunk(const vm_source_t *v, int kind, uint64_t gran) {
  uint64_t mapped = 0;
  for (const gma__region_t *r = v->region[kind]; r; r = r->next) mapped += r->mapped;
  uint64_t least = mapped / CHUNK_SHARE / gran * gran;
  if (least < v->first[kind]) least = v->first[kind];
  return least < v->chunk[kind] ? least : v->chunk[kind];
}

/* How much a growth that needs pl->need bytes maps: the kind's minimum
 * chunk when that is more, unless it would take more than 1/NEAR_LIMIT_DIV
 * of what the memory limit still allows; never more than the room at the
 * spot. */
static uint64_t chunk_size(const vm_source_t *v, const gma__grow_req_t *req,
                           const gma__plan_t *pl) {
  uint64_t g = ((const gma__region_t *)pl->range)->gran;
  uint64_t least = least_chunk(v, req->kind, g);
  if (least <= pl->need || least > req->left / NEAR_LIMIT_DIV) return pl->need;
  if (least > pl->room) least = pl->room / g * g;
  return least > pl->need ? least : pl->need;
}

/* How many equal chunks a growth of size bytes is mapped in: so that memory
 * a later free leaves in the middle of a growth spans whole chunks and can
 * go back, up to GROWTH_PIECES, none smaller than the granularity or
 * 1/PIECE_LIMIT_DIV of the memory limit. A chunk partly in use strands at
 * most its free part, so a hole strands less than 0.4% of the limit; each
 * map costs a device call (tens of us, hundreds beside running work), so a
 * growth of 1% of the limit is two maps: on an 80 GiB device a 1 GiB growth
 * is three maps of 320 MiB, and a 20 MiB minimum chunk one; under a 1 GiB
 * limit a 20 MiB chunk is five maps of 4 MiB, which an OOM can give back
 * one by one. (1/256 of what the limit still allows instead needed 0.2% less
 * memory on the sixteen traces, but a 1 GiB growth near a full 80 GiB
 * device took 41 maps.) */
#define GROWTH_PIECES 64u
#define PIECE_LIMIT_DIV 256u
static uint64_t pieces_of(uint64_t gran, uint64_t size, uint64_t limit) {
  uint64_t least = limit / PIECE_LIMIT_DIV / gran * gran;
  if (least < gran) least = gran;
  uint64_t n = size / least;
  return n < 1 ? 1 : n > GROWTH_PIECES ? GROWTH_PIECES : n;
}

/* Unmaps the chunks mapped at [addr, addr + size) of r by a growth that
 * failed part way with status failed (or that the pool could not adopt:
 * GMA_OK); one the device refuses stays, busy (unmapped at fini). The
 * failure's message is kept. */
static void unmap_pieces(gma__source_t *s, gma__region_t *r, uintptr_t addr, uint64_t size,
                         gma_status_t failed) {
  char why[512] = "";
  if (failed != GMA_OK) snprintf(why, sizeof why, "%s", gma__error_detail(gma_last_error()));
  size_t i = chunk_lb(r, addr);
  while (i < r->nchunks && r->chunks[i].addr < addr + size) {
    gma__chunk_t *c = &r->chunks[i];
    if (s->dev->ops->vm_unmap(s->dev, c->addr, c->size, c->handle) == GMA_OK) {
      r->mapped -= c->size;
      chunks_remove(r, i, 1);
    } else {
      c->busy = 1;
      r->busy += c->size;
      i++;
    }
  }
  if (failed != GMA_OK) gma__set_error(failed, "%s", why);
}

/* Maps [addr, addr + size) of r in n equal chunks (the last takes the
 * rest); all or nothing. */
static gma_status_t map_pieces(gma__source_t *s, gma__region_t *r, uintptr_t addr, uint64_t size,
                               uint64_t n, gma__grown_t *out) {
  uint64_t piece = gma__round_up((size + n - 1) / n, r->gran), done = 0;
  while (done < size) {
    uint64_t len = size - done < piece ? size - done : piece;
    gma_status_t st = chunks_reserve(r) ? GMA_OK
                                        : gma__set_error(GMA_ERR_OOM, "host memory for the chunk table");
    uint64_t h;
    if (st == GMA_OK) st = s->dev->ops->vm_map(s->dev, addr + done, len, &h);
    if (st != GMA_OK) {
      unmap_pieces(s, r, addr, done, st);
      return st;
    }
    chunks_insert(r, addr + done, len, h);
    done += len;
    out->calls++;
  }
  return GMA_OK;
}

/* Maps kept chunks at addr, one after another, the largest that fits in
 * what is left of size bytes first; the bytes they cover. A kept chunk the
 * device will not map stays kept, and the growth goes on with new memory. */
static uint64_t map_kept(gma__source_t *s, gma__region_t *r, uintptr_t addr, uint64_t size,
                         gma__grown_t *out) {
  vm_source_t *v = vm_of(s);
  uint64_t done = 0;
  while (s->kept_chunks && chunks_reserve(r)) {
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < s->kept_chunks; i++) {
      uint64_t k = v->kept[i].size;
      if (k <= size - done && (best == SIZE_MAX || k > v->kept[best].size)) best = i;
    }
    if (best == SIZE_MAX) break;
    gma__chunk_t k = v->kept[best];
    if (s->dev->ops->vm_map_kept(s->dev, addr + done, k.size, k.handle) != GMA_OK) break;
    v->kept[best] = v->kept[--s->kept_chunks];
    s->kept_bytes -= k.size;
    chunks_insert(r, addr + done, k.size, k.handle);
    done += k.size;
    out->calls++;
    out->remaps++;
  }
  return done;
}

/* Unmaps the kept chunks a growth mapped at [addr, addr + size) of r, which
 * frees them (counted as kept chunks freed); failed as for unmap_pieces. */
static void unmap_kept(gma__source_t *s, gma__region_t *r, uintptr_t addr, uint64_t size,
                       gma_status_t failed) {
  uint64_t mapped = r->mapped, n = r->nchunks;
  unmap_pieces(s, r, addr, size, failed);
  s->kept_frees += n - r->nchunks;
  s->kept_freed_bytes += mapped - r->mapped;
}

/* Maps size bytes of new memory at addr in pieces_of chunks. Before a
 * growth of more than CHECKED_PIECES chunks the device is asked for its
 * free memory, so that one it cannot hold is refused before any map (a map
 * failing part way unmaps the pieces before it, under the pool lock). */
#define CHECKED_PIECES 3u
static gma_status_t map_new(gma__source_t *s, gma__region_t *r, uintptr_t addr, uint64_t size,
                            gma__grown_t *out) {
  uint64_t n = pieces_of(r->gran, size, vm_of(s)->limit), dev_free = 0, dev_total = 0;
  if (n > CHECKED_PIECES && s->dev->ops->mem_info(s->dev, &dev_free, &dev_total) == GMA_OK &&
      dev_free < size)
    return gma__set_error(GMA_ERR_OOM,
                          "the device has %" PRIu64 " bytes free; a growth of %" PRIu64
                          " bytes does not fit",
                          dev_free, size);
  return map_pieces(s, r, addr, size, n, out);
}

/* Maps a growth where pl says (reserving another range first when pl
 * found no room): chunk_size bytes, or pl->need with req->least; kept
 * chunks first (map_kept), then new memory for the rest. Kept chunks too
 * large for what is left hold memory the new chunks may need: when those
 * do not fit, the kept ones go back to the device and the new ones are
 * tried again. All or nothing. */
static gma_status_t vm_grow(gma__source_t *s, const gma__grow_req_t *req, gma__plan_t *pl,
                            gma__grown_t *out) {
  vm_source_t *v = vm_of(s);
  if (!pl->range) { /* every range is too fragmented for this run: reserve another */
    uint64_t g = v->region[req->kind]->gran;
    gma__region_t *r;
    gma_status_t st = region_add(v, req->kind, g, range_size(v, g), pl->need, &r);
    if (st != GMA_OK) return st;
    pl->range = r;
    pl->addr = r->base;
    pl->room = r->size;
  }
  gma__region_t *r = (gma__region_t *)pl->range;
  uint64_t size = req->least ? pl->need : chunk_size(v, req, pl);
  *out = (gma__grown_t){.addr = pl->addr, .size = size, .range = r};
  uint64_t done = map_kept(s, r, pl->addr, size, out);
  out->kept = done;
  if (done == size) return GMA_OK;
  gma_status_t st = map_new(s, r, pl->addr + done, size - done, out);
  if (st == GMA_ERR_OOM && s->kept_chunks) {
    uint64_t calls;
    vm_free_kept(s, &calls);
    st = map_new(s, r, pl->addr + done, size - done, out);
  }
  if (st != GMA_OK) unmap_kept(s, r, pl->addr, done, st);
  return st;
}

/* The pool could not take the chunks just mapped: unmap them again, or,
 * where the device refuses that, keep them busy (never handed out,
 * unmapped at fini). */
static void vm_ungrow(gma__source_t *s, const gma__grown_t *g) {
  unmap_kept(s, (gma__region_t *)g->range, g->addr, g->kept, GMA_OK);
  unmap_pieces(s, (gma__region_t *)g->range, g->addr + g->kept, g->size - g->kept, GMA_OK);
}

/* ---- Giving back ------------------------------------------------------------------*/

static bool vm_take(gma__source_t *s, const void *range, uintptr_t addr, uint64_t size,
                    gma__span_t *out) {
  vm_source_t *v = vm_of(s);
  gma__region_t *r = (gma__region_t *)range;
  size_t ci = chunk_lb(r, addr), cj = ci;
  while (cj < r->nchunks && r->chunks[cj].addr < addr + size) cj++;
  /* Room in the handle pool for every chunk, should the pool keep them. */
  if (s->kept_chunks + (cj - ci) > v->kept_cap) {
    size_t cap = (s->kept_chunks + (cj - ci)) * 2;
    gma__chunk_t *k = realloc(v->kept, cap * sizeof *k);
    if (!k) return false;
    v->kept = k;
    v->kept_cap = cap;
  }
  gma__chunk_t *copy = malloc((cj - ci) * sizeof *copy);
  if (!copy) return false;
  for (size_t i = ci; i < cj; i++) r->chunks[i].busy = 1;
  memcpy(copy, r->chunks + ci, (cj - ci) * sizeof *copy);
  r->busy += size;
  *out = (gma__span_t){
      .range = r, .addr = addr, .size = size, .priv = copy, .npriv = cj - ci};
  return true;
}

/* Unmaps the taken chunks, front first; with x->keep (and a device that can)
 * their physical memory stays, marked busy 2 in the copies for settle. */
static void vm_give_back(gma__source_t *s, gma__span_t *x) {
  gma__chunk_t *chunks = x->priv;
  const gma__device_ops_t *ops = s->dev->ops;
  bool keep = x->keep && ops->vm_unmap_keep;
  x->done = 0;
  x->calls = 0;
  for (size_t i = 0; i < x->npriv; i++) {
    gma__chunk_t *c = &chunks[i];
    gma_status_t st = keep ? ops->vm_unmap_keep(s->dev, c->addr, c->size, c->handle)
                           : ops->vm_unmap(s->dev, c->addr, c->size, c->handle);
    if (st != GMA_OK) break;
    c->busy = keep ? 2 : 1;
    x->done += c->size;
    x->calls++;
  }
}

static void vm_settle(gma__source_t *s, gma__span_t *x) {
  vm_source_t *v = vm_of(s);
  gma__region_t *r = (gma__region_t *)x->range;
  const gma__chunk_t *copies = x->priv;
  for (size_t k = 0; k < x->calls; k++) /* take made room for them */
    if (copies[k].busy == 2) {
      v->kept[s->kept_chunks++] =
          (gma__chunk_t){.size = copies[k].size, .handle = copies[k].handle};
      s->kept_bytes += copies[k].size;
    }
  size_t i = chunk_lb(r, x->addr);
  chunks_remove(r, i, x->calls);
  r->mapped -= x->done;
  r->busy -= x->done;
  free(x->priv);
  x->priv = NULL;
  if (x->done) VM_TRACE(s, GMA__TR_SEGMENT_UNMAP, x->addr, x->done);
}

/* What the device refused to unmap is in the pool's use again. */
static void vm_reuse(gma__source_t *s, const void *range, uintptr_t addr, uint64_t size) {
  (void)s;
  gma__region_t *r = (gma__region_t *)range;
  for (size_t i = chunk_lb(r, addr); i < r->nchunks && r->chunks[i].addr < addr + size; i++)
    r->chunks[i].busy = 0;
  r->busy -= size;
}

static void vm_drop(gma__source_t *s, const void *range, uintptr_t addr, uint64_t size) {
  (void)s, (void)range, (void)addr, (void)size; /* vm_fini unmaps every chunk */
}

/* Frees every kept chunk the device will free; the rest stay kept. */
static uint64_t vm_free_kept(gma__source_t *s, uint64_t *calls) {
  vm_source_t *v = vm_of(s);
  uint64_t freed = 0;
  size_t left = 0;
  *calls = 0;
  for (size_t i = 0; i < s->kept_chunks; i++) {
    gma__chunk_t k = v->kept[i];
    if (s->dev->ops->vm_free_kept(s->dev, k.handle, k.size) == GMA_OK) {
      freed += k.size;
      (*calls)++;
    } else {
      v->kept[left++] = k;
    }
  }
  s->kept_chunks = left;
  s->kept_bytes -= freed;
  s->kept_frees += *calls;
  s->kept_freed_bytes += freed;
  return freed;
}

/* ---- Checks -----------------------------------------------------------------------*/

static bool invalid(const char *what, uintptr_t addr) {
  gma__set_error(GMA_ERR_INTERNAL, "pool invariant: %s (at %p)", what, (void *)addr);
  return false;
}

bool gma__vm_check(const gma__source_t *s, const gma__seg_view_t *v, size_t n) {
  const vm_source_t *vs = (const vm_source_t *)s;
  for (int k = 0; k < GMA__NKINDS; k++) {
    for (gma__region_t *r = vs->region[k]; r; r = r->next) {
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
      for (size_t j = 0; j < n; j++) {
        if (v[j].range != r) continue;
        if (v[j].kind != k) return invalid("a growable segment's kind differs", v[j].addr);
        size_t i = chunk_lb(r, v[j].addr);
        uintptr_t at = v[j].addr, end = v[j].addr + v[j].size;
        for (; at < end && i < r->nchunks && r->chunks[i].addr == at && !r->chunks[i].busy; i++)
          at += r->chunks[i].size;
        if (at != end)
          return invalid("a growable segment is not a run of whole mapped chunks", v[j].addr);
        covered += v[j].size;
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
  uint64_t kept = 0;
  for (size_t i = 0; i < s->kept_chunks; i++) kept += vs->kept[i].size;
  if (kept != s->kept_bytes || s->kept_chunks > vs->kept_cap)
    return invalid("the handle pool's bytes differ from its chunks", 0);
  /* Every growable segment belongs to one of its kind's ranges. */
  for (size_t j = 0; j < n; j++) {
    const gma__region_t *r = vs->region[v[j].kind < GMA__NKINDS ? v[j].kind : 0];
    while (r && r != v[j].range) r = r->next;
    if (!r) return invalid("a growable segment's range is not in its kind's list", v[j].addr);
  }
  return true;
}

static const gma__source_ops_t vm_ops = {
    .plan = vm_plan,
    .grow = vm_grow,
    .ungrow = vm_ungrow,
    .releasable = vm_releasable,
    .take = vm_take,
    .give_back = vm_give_back,
    .settle = vm_settle,
    .reuse = vm_reuse,
    .drop = vm_drop,
    .fini = vm_fini,
    .free_kept = vm_free_kept,
};
