/* Owns the pool's side of growable segments (expandable_segments:true): the
 * segments and blocks over the memory a growable source (vmm.c, through
 * source.h) maps, and the policies that decide where the pool grows and
 * which free memory goes back.
 *
 * A segment here is a run of adjacent memory of one source range, tiled by
 * blocks like any segment. Memory mapped next to a segment extends it (and
 * merges it with a segment that starts right after), so a FREE block at the
 * end of one chunk coalesces with the new memory: a growing workload gets
 * one large free block instead of many segment-sized ones, but only memory
 * of one stream's requests (its home: reuse:auto's search prefers a
 * stream's own memory, and that works only while two streams' memory never
 * coalesces). Giving memory back splits a segment around the hole. The source never sees any of
 * this: it is offered segment ends to extend (gma__tail_t) and free ranges
 * to give back, and answers in address ranges.
 *
 * Trimming gives back only what the source calls releasable (whole chunks)
 * inside FREE blocks; FREE means every stream's work on the memory has
 * completed (its epoch events passed), so it never pulls memory from under
 * a kernel. The device calls of a trim happen outside the pool lock
 * (gma__pool_release); those of a growth and of the OOM retry under it.
 *
 * Every function here runs under gma__pool_t.lock. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "source/vmm.h"

static uint8_t state_of(gma__block_t *b) { return gma__load_relaxed(&b->state); }

/* The bytes of FREE block b (of a growable segment) that its source could
 * give back: [*lo, *hi). */
static uint64_t releasable(const gma__pool_t *p, const gma__block_t *b, uint64_t want,
                           uintptr_t *lo, uintptr_t *hi) {
  return p->src->ops->releasable(p->src, b->seg->range, b->addr, b->size, want, lo, hi);
}
static uint64_t inside(const gma__pool_t *p, const gma__block_t *b) {
  uintptr_t lo, hi;
  return releasable(p, b, 0, &lo, &hi);
}

/* ---- Adopting memory --------------------------------------------------------------*/

/* The segment of range that ends exactly at addr / starts exactly at addr. */
static gma__segment_t *seg_ending_at(gma__pool_t *p, const void *range, uintptr_t addr) {
  gma__segment_t *s = addr ? gma__seg_find(p, addr - 1) : NULL;
  return s && s->range == range && s->base + s->size == addr ? s : NULL;
}
static gma__segment_t *seg_starting_at(gma__pool_t *p, const void *range, uintptr_t addr) {
  gma__segment_t *s = gma__seg_find(p, addr);
  return s && s->range == range && s->base == addr ? s : NULL;
}

/* Whether memory of homes a and b may be one segment: the same stream's,
 * or one of them nobody's (the worker's growth ahead). */
static bool homes_match(uint64_t a, uint64_t b) { return a == b || !a || !b; }

gma_status_t gma__segs_adopt(gma__pool_t *p, const void *range, int kind, uintptr_t addr,
                             uint64_t size, uint64_t home) {
  gma__segment_t *prev = seg_ending_at(p, range, addr);
  if (prev && !homes_match(prev->home, home)) prev = NULL;
  gma__segment_t *next = seg_starting_at(p, range, addr + size);
  if (next && !homes_match(next->home, prev && prev->home ? prev->home : home)) next = NULL;
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
    seg->kind = kind;
    seg->range = range;
    seg->first = seg->last = b;
    if (gma__segs_insert(p, seg) != GMA_OK) {
      gma__pagemap_set(&p->pagemap, addr, NULL);
      gma__block_recycle(p, b);
      free(seg);
      return gma__set_error(GMA_ERR_OOM, "host memory for the segment table");
    }
  }
  if (!seg->home) seg->home = home;
  if (next) {
    if (!seg->home) seg->home = next->home;
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

/* ---- Giving back ------------------------------------------------------------------*/

bool gma__segs_detach(gma__pool_t *p, gma__block_t *b, uint64_t want, gma__span_t *out) {
  gma__segment_t *seg = b->seg;
  if (!seg->range) return false;
  uintptr_t lo, hi;
  if (!releasable(p, b, want, &lo, &hi)) return false;
  uintptr_t end = b->addr + b->size, seg_end = seg->base + seg->size;
  /* Get every record first, so a failure changes nothing. */
  bool right = hi < seg_end, right_block = hi < end, left_block = lo > b->addr;
  gma__segment_t *rseg = right ? calloc(1, sizeof *rseg) : NULL;
  gma__block_t *rb = right_block ? gma__block_new(p) : NULL;
  bool ok = !right || rseg, mapped = false, inserted = false;
  if (ok && right_block) ok = mapped = rb && gma__pagemap_set(&p->pagemap, hi, rb);
  if (ok && right) {
    rseg->base = hi;
    ok = inserted = gma__segs_insert(p, rseg) == GMA_OK;
  }
  /* The source marks the chunks leaving last: it is the one step that
   * cannot be undone from here. */
  if (ok) ok = p->src->ops->take(p->src, seg->range, lo, hi - lo, out);
  if (!ok) {
    if (inserted) gma__segs_remove(p, rseg);
    if (mapped) gma__pagemap_set(&p->pagemap, hi, NULL);
    free(rseg);
    if (rb) gma__block_recycle(p, rb);
    return false;
  }
  out->kind = seg->kind;
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
    rseg->range = seg->range;
    rseg->home = seg->home;
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
  return true;
}

void gma__segs_finish(gma__pool_t *p, gma__span_t *x) {
  gma__source_t *s = p->src;
  uint64_t kept = s->kept_bytes;
  s->ops->settle(s, x);
  p->c.device_frees += x->calls;
  kept = s->kept_bytes - kept; /* what the handle pool took: still the device's */
  p->c.device_keeps += kept ? x->calls : 0;
  p->c.bytes_trimmed += x->done - kept;
  if (x->done == x->size) return;
  /* The device refused: the rest is still mapped memory; use it again. If
   * even that fails (no host memory), it stays taken: unusable but never
   * handed out, and given back at destroy. */
  uintptr_t at = x->addr + x->done;
  uint64_t rest = x->size - x->done;
  if (gma__segs_adopt(p, x->range, x->kind, at, rest, 0) == GMA_OK)
    s->ops->reuse(s, x->range, at, rest);
}

/* Takes the first FREE block of a growable segment at or after segs[*i]
 * that has releasable memory out of the pool, gives that back now (under
 * the lock; with keep, into the source's handle pool) and settles it; the
 * bytes that went back, and *refused when the device refused some. Returns
 * 0 with *i at nsegs when there was none. */
static uint64_t give_back_one(gma__pool_t *p, size_t *i, bool keep, bool *refused) {
  while (*i < p->nsegs) {
    gma__segment_t *seg = p->segs[*i];
    gma__block_t *b = seg->range ? seg->first : NULL;
    while (b && (state_of(b) != GMA__FREE || !inside(p, b))) b = b->next;
    gma__span_t x;
    /* A detach changes the segment table: the caller looks at the same
     * index again. */
    if (b && gma__segs_detach(p, b, 0, &x)) {
      x.keep = keep;
      p->src->ops->give_back(p->src, &x);
      uint64_t done = x.done, size = x.size;
      gma__segs_finish(p, &x);
      *refused = done < size;
      return done;
    }
    (*i)++;
  }
  return 0;
}

/* Every free chunk goes, not just what the request lacks: a later growth
 * maps the kept ones wherever it needs them, and on the sixteen traces
 * stopping at the request's size needed up to 1% more memory. */
void gma__segs_release_free(gma__pool_t *p) {
  bool refused = false;
  for (size_t i = 0; i < p->nsegs && !refused;) give_back_one(p, &i, true, &refused);
}

uint64_t gma__segs_free_kept(gma__pool_t *p) {
  gma__source_t *s = p->src;
  if (!s->kept_chunks) return 0;
  uint64_t calls;
  return s->ops->free_kept(s, &calls); /* counted by the source (kept_frees) */
}

/* ---- Growth -----------------------------------------------------------------------*/

/* The pool's offer to a growth of size bytes of kind for home: the growable
 * segments of kind and a matching home that end in free memory smaller
 * than size (offer: the source may extend them), in segment order, and
 * the other segments of kind whose last block is not LIVE (idle ends a
 * fresh run keeps clear of, gma__tail_t). Free memory at
 * a segment's end is its last block if FREE, plus the block before it (or
 * the last block itself) when that is cached on own: own may use its own
 * cached memory at once (stream order), so a growth for own extends it by
 * what the two lack, where a growth behind them alone would leave own's old
 * block stranded beside a new one. p->tail_blocks[i] is that cached block
 * (NULL: none). */
static void collect_tails(gma__pool_t *p, int kind, uint64_t size, uint64_t home,
                          const gma__stream_t *own, gma__grow_req_t *req) {
  req->tails = NULL;
  req->ntails = 0;
  size_t n = 0;
  for (size_t i = 0; i < p->nsegs; i++) {
    gma__segment_t *seg = p->segs[i];
    if (!seg->range || seg->kind != kind) continue;
    gma__block_t *last = seg->last;
    bool free_end = state_of(last) == GMA__FREE;
    gma__block_t *c = free_end ? last->prev : last;
    if (!own || !c || state_of(c) != GMA__CACHED || c->stream != own) c = NULL;
    uint64_t free = (free_end ? last->size : 0) + (c ? c->size : 0);
    /* offered: free memory to extend, less than the request (a search
     * serves a larger one) */
    bool offer = homes_match(seg->home, home) && free && free < size;
    if (!offer && state_of(last) == GMA__LIVE) continue;
    if (n == p->tails_cap) {
      size_t cap = p->tails_cap ? p->tails_cap * 2 : 16;
      gma__tail_t *t = realloc(p->tails, cap * sizeof *t);
      if (t) p->tails = t;
      gma__block_t **bs = t ? realloc(p->tail_blocks, cap * sizeof *bs) : NULL;
      if (bs) p->tail_blocks = bs;
      if (!t || !bs) break; /* without host memory: offer what fits (fresh runs still work) */
      p->tails_cap = cap;
    }
    p->tails[n] = (gma__tail_t){
        .range = seg->range, .end = seg->base + seg->size, .free = offer ? free : 0, .offer = offer};
    p->tail_blocks[n++] = c;
  }
  req->tails = p->tails;
  req->ntails = n;
}

/* One growth as planned: the source maps, the pool adopts (merging with the
 * segments around), or the source takes it back. */
static gma_status_t grow_once(gma__pool_t *p, const gma__grow_req_t *req, gma__plan_t *pl,
                              gma__grown_t *g, uint64_t home) {
  gma__source_t *s = p->src;
  *g = (gma__grown_t){0};
  gma_status_t st = s->ops->grow(s, req, pl, g);
  if (st != GMA_OK) return st;
  st = gma__segs_adopt(p, g->range, req->kind, g->addr, g->size, home);
  if (st != GMA_OK) {
    s->ops->ungrow(s, g);
    return st;
  }
  p->c.device_allocs += g->calls;
  p->c.device_remaps += g->remaps;
  GMA__TRACE(p, GMA__TR_SEGMENT_MAP, g->addr, g->size, 0, 0, 0, 0, 0);
  return GMA_OK;
}

static gma_status_t grow_for(gma__pool_t *p, int kind, uint64_t size, uint64_t home,
                             const gma__stream_t *own, gma__block_t **joined) {
  gma__source_t *s = p->src;
  gma__grow_req_t req = {.kind = kind, .size = size};
  gma__plan_t pl;
  collect_tails(p, kind, size, home, own, &req);
  s->ops->plan(s, &req, &pl); /* no room: grow reserves another range */
  /* A trim's bytes still on the device count as held; the handle pool's
   * are the growth's to map. */
  req.left = gma__pool_room(p) + s->kept_bytes;
  if (pl.need > req.left)
    return gma__set_error(GMA_ERR_OOM, "memory_limit of %" PRIu64 " bytes reached", p->limit);
  gma__grown_t g;
  gma_status_t st = grow_once(p, &req, &pl, &g, home);
  if (st == GMA_ERR_OOM && g.size > pl.need) {
    req.least = true;
    st = grow_once(p, &req, &pl, &g, home);
  }
  if (st == GMA_OK && joined) *joined = pl.tail >= 0 ? p->tail_blocks[pl.tail] : NULL;
  return st;
}

/* First as own's memory, extending only free ends of its segments (or of
 * nobody's); if that finds no room, as nobody's, extending any segment's
 * free end, which may need less: near the limit, memory comes first. */
gma_status_t gma__segs_grow(gma__pool_t *p, int kind, uint64_t size, const gma__stream_t *own,
                            gma__block_t **joined) {
  uint64_t home = own ? own->serial : 0;
  if (joined) *joined = NULL;
  gma_status_t st = grow_for(p, kind, size, home, own, joined);
  if (st == GMA_ERR_OOM && home) st = grow_for(p, kind, size, 0, own, joined);
  return st;
}

/* ---- Trimming ---------------------------------------------------------------------*/

/* A trim candidate: a FREE block and how much of it could go back. */
typedef struct cand {
  gma__block_t *b;
  uint64_t inside;
} cand_t;

size_t gma__segs_pick(gma__pool_t *p, const gma__release_t *rel, gma__trim_budget_t *bud,
                      gma__span_t **out, size_t *n_idle) {
  *out = NULL;
  *n_idle = 0;
  size_t nc = 0, cap = 0;
  cand_t *cand = NULL;
  for (size_t i = 0; i < p->nsegs; i++) {
    if (!p->segs[i]->range) continue;
    for (gma__block_t *b = p->segs[i]->first; b; b = b->next) {
      uint64_t in = state_of(b) == GMA__FREE ? inside(p, b) : 0;
      if (!in) continue;
      if (!b->free_since_ns) b->free_since_ns = rel->now_ns;
      if (nc == cap) {
        cap = cap ? cap * 2 : 16;
        cand_t *a = realloc(cand, cap * sizeof *a);
        if (!a) break;
        cand = a;
      }
      cand[nc++] = (cand_t){.b = b, .inside = in};
    }
  }
  gma__span_t *spans = nc ? malloc(nc * sizeof *spans) : NULL;
  size_t n = 0;
  if (spans) {
    /* Detaching one candidate never touches another: FREE blocks are never
     * neighbours (they are coalesced). The passes of gma__release_t: pass 0
     * all the idle ones; pass 1, among those unused long enough, each time
     * the one that finishes with the least beyond the budget
     * (gma__trim_prefer). */
    for (size_t i = 0; i < nc; i++) {
      gma__block_t *b = cand[i].b;
      if (!rel->idle_ns || rel->now_ns - b->free_since_ns < rel->idle_ns) continue;
      cand[i].b = NULL;
      if (!gma__segs_detach(p, b, 0, &spans[n])) continue;
      gma__trim_took(bud, spans[n].size, false);
      n++;
      (*n_idle)++;
    }
    while (!gma__trim_done(bud)) {
      size_t pick = SIZE_MAX;
      for (size_t i = 0; i < nc; i++)
        if (cand[i].b && rel->now_ns - cand[i].b->free_since_ns >= rel->unused_ns &&
            gma__trim_prefer(bud, cand[i].inside, pick == SIZE_MAX ? 0 : cand[pick].inside))
          pick = i;
      if (pick == SIZE_MAX) break;
      gma__block_t *b = cand[pick].b;
      cand[pick].b = NULL; /* only the chunks the budget needs (the last ones) */
      if (!gma__segs_detach(p, b, gma__trim_need(bud), &spans[n])) continue;
      gma__trim_took(bud, spans[n].size, true);
      n++;
    }
  }
  free(cand);
  *out = spans;
  return n;
}

/* ---- Checks -----------------------------------------------------------------------*/

bool gma__segs_is_valid(gma__pool_t *p) {
  if (!p->growable) return true;
  size_t n = 0;
  for (size_t i = 0; i < p->nsegs; i++) n += p->segs[i]->range != NULL;
  gma__seg_view_t *v = malloc((n ? n : 1) * sizeof *v);
  if (!v) return true; /* no host memory to check with: nothing learned */
  n = 0;
  for (size_t i = 0; i < p->nsegs; i++) {
    gma__segment_t *seg = p->segs[i];
    if (seg->range)
      v[n++] = (gma__seg_view_t){
          .range = seg->range, .kind = seg->kind, .addr = seg->base, .size = seg->size};
  }
  bool ok = gma__vm_check(p->src, v, n);
  free(v);
  return ok;
}
