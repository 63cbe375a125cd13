/* Owns fit and grow: the best-fit searches (home segments, joined neighbours,
 * other streams' memory under reuse:wait), the segment size a request gets, and
 * growth from the pool's segment source. Every function here runs under
 * gma__pool_t.lock (core/types.h) unless it says otherwise. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/round.h"
#include "base/sizeclass.h"
#include "core/internal.h"

/* Large requests below this share segments of segment_size[LARGE]; from it
 * up, each gets a segment of its own rounded to 2 MiB (PyTorch's rule too;
 * docs/near-the-limit.md has the measurements behind it). */
#define LARGE_OWN_MIN (10ull << 20)

gma_status_t gma__seg_adopt(gma__pool_t *p, int kind, uintptr_t base, uint64_t size,
                            uint64_t home, gma__block_t **out) {
  gma__segment_t *seg = calloc(1, sizeof *seg);
  gma__block_t *b = gma__block_new(p);
  if (!seg || !b || !gma__pagemap_set(&p->pagemap, base, b)) {
    free(seg);
    if (b) gma__block_recycle(p, b);
    return gma__set_error(GMA_ERR_OOM, "host memory for segment metadata");
  }
  seg->base = base;
  seg->size = size;
  seg->kind = kind;
  seg->home = home;
  seg->first = seg->last = b;
  b->seg = seg;
  b->addr = base;
  b->size = size;
  gma_status_t st = gma__segs_insert(p, seg);
  if (st != GMA_OK) {
    gma__pagemap_set(&p->pagemap, base, NULL);
    gma__block_recycle(p, b);
    free(seg);
    return st;
  }
  gma__stat_add(&p->c.reserved, size);
  gma__free_link(p, b);
  if (out) *out = b;
  return GMA_OK;
}

/* An ordinary segment of size bytes from the source (one device allocation),
 * made for the stream of serial home (0: none). */
gma_status_t gma__seg_create(gma__pool_t *p, int kind, uint64_t size, uint64_t home,
                             gma__block_t **out) {
  if (size > gma__pool_room(p))
    return gma__set_error(GMA_ERR_OOM, "memory_limit of %" PRIu64 " bytes reached", p->limit);
  gma__source_t *src = p->src;
  gma__grow_req_t req = {.kind = kind, .size = size, .left = gma__pool_room(p)};
  gma__plan_t pl;
  gma__grown_t g;
  src->ops->plan(src, &req, &pl);
  gma_status_t st = src->ops->grow(src, &req, &pl, &g);
  if (st != GMA_OK) return st;
  st = gma__seg_adopt(p, kind, g.addr, g.size, home, out);
  if (st != GMA_OK) {
    src->ops->ungrow(src, &g);
    return st;
  }
  p->c.device_allocs++;
  GMA__TRACE(p, GMA__TR_SEGMENT_ALLOC, g.addr, g.size, 0, 0, 0, 0, 0);
  return GMA_OK;
}

/* A cached block's size with its FREE address neighbours (FREE blocks
 * coalesce, so there is at most one on each side). */
static uint64_t joined_size(gma__block_t *b) {
  uint64_t t = b->size;
  if (b->prev && gma__state_of(b->prev) == GMA__FREE) t += b->prev->size;
  if (b->next && gma__state_of(b->next) == GMA__FREE) t += b->next->size;
  return t;
}

/* How many of a stream's cached blocks one search for a join looks at. */
#define JOIN_SCAN 16

/* The cached block (of a tree keyed by size) below size whose join with its
 * FREE neighbours holds size bytes in the fewest bytes under *best_total;
 * the largest blocks are looked at first, at most *budget of them. */
static void join_search(gma__block_t *n, uint64_t size, uint64_t *best_total,
                        gma__block_t **best, int *budget) {
  if (!n || *budget <= 0) return;
  if (n->size >= size) { /* a fit by itself: find_fit saw it; the right side is larger */
    join_search(n->left, size, best_total, best, budget);
    return;
  }
  join_search(n->right, size, best_total, best, budget);
  if (*budget <= 0) return;
  (*budget)--;
  uint64_t t = joined_size(n);
  if (t >= size && t < *best_total) {
    *best_total = t;
    *best = n;
  }
  join_search(n->left, size, best_total, best, budget);
}

/* Joins cached block b (on stream s) with its FREE neighbours: the result
 * is cached on s with b's epoch. Safe: FREE memory has no device work to
 * wait for, so s may use it as soon as it may use b; other streams get the
 * whole block back when b's epoch completes (or it is taken and freed). */
static gma__block_t *join_free(gma__pool_t *p, gma__block_t *b) {
  gma__stream_t *s = b->stream;
  uint64_t epoch = b->epoch;
  gma__cached_unlink(p, b);
  b = gma__absorb_free_neighbours(p, b);
  b->stream = s;
  b->epoch = epoch;
  gma__cached_link(p, b, NULL);
  return b;
}

/* The smallest block of tree n that holds size bytes and lies in a segment
 * of stream `home` (or of none), looking at *budget fits at most. */
static gma__block_t *home_best_fit(gma__block_t *n, uint64_t size, uint64_t home, int *budget) {
  if (!n || *budget <= 0) return NULL;
  if (n->size >= size) {
    gma__block_t *b = home_best_fit(n->left, size, home, budget);
    if (b || *budget <= 0) return b;
    (*budget)--;
    if (!n->seg->home || n->seg->home == home) return n;
  }
  return home_best_fit(n->right, size, home, budget);
}

/* How many FREE fits home_best_fit looks at before it gives up (the search
 * then goes on as if no FREE block fitted, and later takes any). */
#define HOME_SCAN 32

/* Best fit for size among the stream's cached blocks and the shared free
 * tree; the smaller candidate wins, the stream's own on a tie (its memory is
 * warm). A cached block too small by itself may fit joined with the FREE
 * memory beside it (what the stream freed last next to what became free
 * earlier, the two halves of one old block): when that union is smaller
 * than the best candidate, it is joined and taken instead. Without it a
 * steady loop's request could split another stream's larger block (a block
 * that stream needs again at the same point of the next iteration) while
 * its own old place sits in two halves, and that stream would grow.
 * Lock held. passed_by NULL: any FREE block; else only FREE blocks of
 * segments s made (or of none), as reuse:auto searches first (see
 * gma__find_or_grow), and *passed_by says whether a fitting FREE block of
 * another stream's segment was passed by (else a search for any block
 * would find nothing more). */
static gma__block_t *find_fit(gma__pool_t *p, gma__stream_t *s, int kind, uint64_t size,
                              bool *passed_by) {
  gma__block_t *c = gma__treap_best_fit(s->cached_tree[kind], size);
  gma__block_t *f = gma__treap_best_fit(p->free_tree[kind], size);
  if (passed_by) *passed_by = f && f->seg->home && f->seg->home != s->serial;
  if (passed_by && *passed_by) {
    int budget = HOME_SCAN;
    f = home_best_fit(p->free_tree[kind], size, s->serial, &budget);
  }
  if (c && (!f || c->size <= f->size)) return c;
  uint64_t total = f ? f->size : UINT64_MAX;
  gma__block_t *j = NULL;
  int budget = JOIN_SCAN;
  join_search(s->cached_tree[kind], size, &total, &j, &budget);
  return j ? join_free(p, j) : f;
}

/* Segment size for a request: small requests share small segments, mid-size
 * large ones share large segments, big ones get their own rounded to 2 MiB. */
static uint64_t segment_size_for(const gma__pool_t *p, int kind, uint64_t size) {
  if (kind == GMA__SMALL) return p->segment_size[GMA__SMALL];
  uint64_t own = gma__round_up(size, GMA__SEGMENT_ROUND);
  if (size < LARGE_OWN_MIN && own < p->segment_size[GMA__LARGE])
    return p->segment_size[GMA__LARGE];
  /* Near a memory_limit that is not a multiple of 2 MiB, rounding up would
   * make a request that fits the limit unservable: round less there. */
  uint64_t room = p->limit / GMA__ROUND * GMA__ROUND;
  return own > room && size <= room ? room : own;
}

/* Growable segments: maps just enough chunks (segments.c), with the same
 * retry after releasing safe cached memory. The fit is the FREE memory the
 * growth made, joined with own's cached block where the growth extended it
 * (own then takes its old place and the new memory as one block). */
static gma_status_t grow_region(gma__pool_t *p, int kind, uint64_t size, gma__stream_t *own,
                                gma__block_t **out) {
  gma__block_t *c;
  gma_status_t st = gma__segs_grow(p, kind, size, own, &c);
  if (st == GMA_ERR_OOM) {
    gma__oom_release(p, size);
    if ((*out = gma__treap_best_fit(p->free_tree[kind], size))) return GMA_OK;
    st = gma__segs_grow(p, kind, size, own, &c);
  }
  if (st != GMA_OK) return st;
  if (c && joined_size(c) >= size) {
    *out = join_free(p, c);
    return GMA_OK;
  }
  if (!(*out = gma__treap_best_fit(p->free_tree[kind], size)))
    st = gma__set_error(GMA_ERR_INTERNAL, "growable segment grew but holds no fit for %" PRIu64,
                        size);
  return st;
}

/* Grows the pool by one segment that can hold size bytes, the memory of
 * stream own (its serial is the segment's home, gma__segment_t.home). On device OOM it
 * releases cached memory that is already safe (never waiting for the device)
 * and retries, the second time with the smallest segment that fits. */
static gma_status_t grow(gma__pool_t *p, int kind, uint64_t size, gma__stream_t *own,
                         gma__block_t **out) {
  if (p->growable) return grow_region(p, kind, size, own, out);
  uint64_t home = own->serial;
  uint64_t seg_size = segment_size_for(p, kind, size);
  gma_status_t st = gma__seg_create(p, kind, seg_size, home, out);
  if (st != GMA_ERR_OOM) return st;
  uint64_t least = kind == GMA__LARGE ? gma__round_up(size, GMA__SEGMENT_ROUND) : seg_size;
  gma__oom_release(p, least);
  *out = gma__treap_best_fit(p->free_tree[kind], size); /* polling may have freed a fit */
  if (*out) return GMA_OK;
  st = gma__seg_create(p, kind, seg_size, home, out);
  if (st == GMA_ERR_OOM && least < seg_size) st = gma__seg_create(p, kind, least, home, out);
  /* Right below memory_limit: only what the request needs, or what is left
   * of the limit for a small segment (a 512-byte request must not fail with
   * a megabyte left below the limit). */
  uint64_t room = gma__pool_room(p);
  uint64_t need = kind == GMA__SMALL ? (room < seg_size ? room : seg_size) : gma__round_up(size, GMA__ROUND);
  if (st == GMA_ERR_OOM && need >= size && need < least)
    st = gma__seg_create(p, kind, need, home, out);
  return st;
}

/* Lock held, the device full even after the OOM retry's release: the best
 * FREE fit in the other kind's segments, whatever it leaves (a small request
 * in a large hole, or a large one in a small segment's or chunk's free
 * part). Each pool keeps its own segments so that neither fragments the
 * other, but when a request would fail, a free block that holds it must
 * serve it: a 1 MiB request failed on a 64 MiB device with a 12 MiB hole in
 * the large pool, and with growable segments a 4 MiB request failed beside
 * 7.5 MiB free in a small chunk. (The block stays in its segment: freed, it
 * goes back to that segment's trees.) */
static gma__block_t *other_kind_fit(gma__pool_t *p, int kind, uint64_t size) {
  return gma__treap_best_fit(p->free_tree[kind == GMA__SMALL ? GMA__LARGE : GMA__SMALL], size);
}

/* Lock held. The small pool of ordinary segments would grow: a FREE block
 * of the large pool serves a small request instead when what it leaves is
 * less than a small segment. A hole that small serves few large requests,
 * and growing would reserve a whole small segment beside it. (The block
 * stays in its large segment: freed, it goes back to the large trees.) Not
 * with growable segments: there the small pool grows by a chunk as small
 * as one segment while it is small, and a small block in a large hole
 * keeps the large chunk under it mapped and its neighbours from merging. */
static gma__block_t *small_in_large_hole(gma__pool_t *p, int kind, uint64_t size) {
  if (p->growable) return NULL;
  gma__block_t *b = kind == GMA__SMALL ? other_kind_fit(p, kind, size) : NULL;
  return b && b->size - size < p->segment_size[GMA__SMALL] ? b : NULL;
}

/* Lock held. A block of at least size bytes for s: the stream's cache or the
 * free pool (after settling pending blocks, then after observing completed
 * epochs, then after a poll that drains the bins), a device-side wait under
 * reuse:wait, a small hole of the large pool (ordinary segments), or a new
 * segment. *level says which hit counter it is; nothing is counted here.
 * GMA_ERR_OOM leaves the message to the caller. */
/* A graph pool's chunk (GMA__ALLOC_CAPTURE): FREE memory only, never a
 * block cached on the stream (see the flag). */
static gma__block_t *find_fit_in(gma__pool_t *p, gma__stream_t *s, int kind, uint64_t size,
                                 bool capture) {
  return capture ? gma__treap_best_fit(p->free_tree[kind], size) : find_fit(p, s, kind, size, NULL);
}

/* Lock held. Whether b, the fit found for a request of size bytes that
 * gets a segment of its own (LARGE_OWN_MIN or more), is a whole ordinary
 * segment made for a bigger request (FREE, or cached on s, the requesting
 * stream), which the request would split leaving more of it unused than it
 * uses. Only while the pool holds half its limit or more: with room to
 * spare a split loses nothing, and a new segment instead would grow the
 * pool. Requests that share segments split them by design and are not
 * counted. */
static bool splits_whole_oversize(const gma__pool_t *p, gma__stream_t *s, gma__block_t *b,
                                  int kind, uint64_t size) {
  if (kind != GMA__LARGE || p->growable || size < LARGE_OWN_MIN ||
      p->c.reserved.current < p->limit / 2 || b->prev || b->next || b->seg->range ||
      b->seg->size <= p->segment_size[GMA__LARGE])
    return false;
  int st = gma__state_of(b);
  return (st == GMA__FREE || (st == GMA__CACHED && b->stream == s)) && b->size - size >= size;
}

/* Lock held. Instead of that split (splits_whole_oversize): a segment with
 * a live block in it cannot go back to the device, so the unused part of a
 * split oversize segment is lost to every other size until the block is
 * freed, and under a device limit rounds of changing large sizes then fail
 * where direct device allocation serves them all (docs/near-the-limit.md).
 * So a segment of the request's own size is made while the
 * device has room, and *b stays whole: it serves a request its size later.
 * Without room, a FREE *b's segment goes back to the device and the new one
 * is made from it (a swap: the pool holds less, and *b's rest is not left
 * unused beside the block); a cached *b may still be in use, so then the
 * OOM retry's release makes room from other free segments. Returns the new segment's block, or NULL: split *b when it is
 * still set, else search again (the lock was dropped meanwhile). */
static gma__block_t *fresh_for_oversize(gma__pool_t *p, int kind, uint64_t size,
                                        uint64_t home, gma__block_t **b) {
  uint64_t own = gma__round_up(size, GMA__SEGMENT_ROUND);
  gma__block_t *f = NULL;
  if (gma__seg_create(p, kind, own, home, &f) == GMA_OK) return f;
  if (gma__state_of(*b) == GMA__FREE && (*b)->size == (*b)->seg->size && !(*b)->seg->range) {
    p->c.oom_retries++;
    gma__stats_sample(p); /* cached's peak, before the cache goes */
    gma__release_whole(p, (*b)->seg); /* a swap: one device free, one allocation */
  } else if (!gma__oom_release(p, own)) {
    return NULL; /* nothing went back and the lock was held: split *b */
  }
  *b = NULL; /* the lock was dropped: search again if this fails */
  return gma__seg_create(p, kind, own, home, &f) == GMA_OK ? f : NULL;
}

/* Whether s is the one stream besides its own that used pending block b
 * (gma_record_stream): s consumed what b's stream made, so the program
 * already made s wait for that stream's work on b. */
static bool consumed_by(const gma__block_t *b, const gma__stream_t *s) {
  return b->stream != s && gma__load_relaxed(&b->ngates) == 1 && b->gates[0].stream == s;
}

/* Lock held, reuse:wait (consumer false) or reuse:auto (consumer true: only
 * blocks consumed_by s): the best fit for size among PENDING blocks (freed
 * after gma_record_stream, their work not yet seen to complete), made safe
 * for s on the device: s waits for the event of every stream that used it
 * (gma__gate_settle closes an open epoch first). The block then belongs to
 * s, cached in s's open epoch: s's stream order covers it, and every other
 * stream gets it only once that epoch's event, recorded after the waits,
 * completes. NULL when none fits or a wait could not be made. */
static gma__block_t *pending_wait_fit(gma__pool_t *p, gma__stream_t *s, int kind,
                                      uint64_t size, bool consumer) {
  gma__block_t *best = NULL;
  for (gma__block_t *b = p->pending_head; b; b = b->qnext)
    if (b->seg->kind == kind && b->size >= size && (!best || b->size < best->size) &&
        (!consumer || consumed_by(b, s)))
      best = b;
  if (!best) return NULL;
  bool planted = consumer && (p->test_flags & GMA__TEST_NO_CONSUMER_WAIT);
  if (best->stream != s && !planted) {
    gma__gate_t owner = {best->stream, best->epoch};
    if (!gma__gate_settle(p, &owner, s, true)) return NULL;
  }
  uint32_t n = gma__load_relaxed(&best->ngates);
  for (uint32_t i = 0; i < n; i++)
    if (best->gates[i].stream != s && !gma__gate_settle(p, &best->gates[i], s, true)) return NULL;
  gma__pending_unlink(p, best);
  gma__store_relaxed(&best->ngates, 0);
  best->stream = s;
  best->epoch = gma__load_relaxed(&s->epoch);
  gma__store_relaxed(&s->dirty, true);
  return gma__cache_block(p, best);
}

/* Lock held, reuse:auto or wait, nothing known to be reusable fits s: first
 * the oldest of s's pending blocks that holds the request alone
 * (reclaim_oldest_fit). Else, when
 * s's own PENDING blocks of this kind (freed on s after gma_record_stream,
 * the other streams' work on them not yet seen to complete) hold at least
 * the request and at least the bytes allocated now, the host has run that
 * far ahead of the device; then s takes them back behind one device-side
 * wait per stream that gates them (the event closing the newest gated epoch
 * covers every older one), instead of making new memory. They become s's,
 * cached in s's open epoch (as in pending_wait_fit), where adjacent ones
 * coalesce with each other and with s's cached neighbours; the pool may
 * still grow when no run fits. Blocks gated by a stream past the first
 * RECLAIM_STREAMS, or by one with no event to wait on, stay pending. Below
 * the bound s grows: a short lead keeps its overlap. Without it, a stream
 * that hands every buffer to a slower stream grows by the whole lead the
 * host has over the device. s's wait on its consumers is a dependency the
 * program never made: a consumer whose work waits on the host for s's
 * thread (a stream held until s's next buffer is served) while that thread
 * synchronizes s hangs the program (docs/streams.md#the-one-hazard;
 * api_test_reclaim_hazard); such programs use reuse:query. True when
 * anything came back. */
#define RECLAIM_STREAMS 16 /* distinct gating streams handled in one call */
/* The slot of gating stream u among newest[0..n), or n. */
static size_t gate_slot(const gma__gate_t *newest, size_t n, const gma__stream_t *u) {
  size_t j = 0;
  while (j < n && newest[j].stream != u) j++;
  return j;
}

/* s's live bytes (allocated on s, not yet freed), both kinds. The
 * per-thread counters are summed without their writers' lock: a free seen
 * before its allocation wraps the difference to a huge value, which only
 * keeps reclaim_oldest_fit from firing this once. */
static uint64_t stream_live(const gma__stream_t *s) {
  gma__tcount_t t;
  memset(&t, 0, sizeof t);
  gma__stats_sum(s, &t);
  return gma__load_relaxed(&t.alloc_bytes) - gma__load_relaxed(&t.free_bytes);
}

/* The oldest-freed of s's own PENDING blocks of kind that holds size bytes
 * alone, when they hold more than s has live (the host is a working set
 * ahead of s's consumers), taken back behind waits on that block's gates
 * only: they cover the consumers' work up to its free, long queued, not
 * their newest, so the consumers keep running beside s. True when it came
 * back. */
static bool reclaim_oldest_fit(gma__pool_t *p, gma__stream_t *s, int kind, uint64_t size) {
  uint64_t own = 0;
  gma__block_t *fit = NULL;
  for (gma__block_t *b = p->pending_head; b; b = b->qnext) /* newest first */
    if (b->stream == s && b->seg->kind == kind) {
      own += b->size;
      if (b->size >= size) fit = b;
    }
  if (!fit || own < stream_live(s)) return false;
  bool planted = p->test_flags & GMA__TEST_NO_CONSUMER_WAIT;
  uint32_t n = gma__load_relaxed(&fit->ngates);
  for (uint32_t i = 0; i < n; i++)
    if (!planted && fit->gates[i].stream != s && !gma__gate_settle(p, &fit->gates[i], s, true))
      return false;
  gma__pending_unlink(p, fit);
  gma__store_relaxed(&fit->ngates, 0);
  fit->epoch = gma__load_relaxed(&s->epoch);
  gma__cache_block(p, fit);
  gma__store_relaxed(&s->dirty, true);
  return true;
}

static bool reclaim_own_pending(gma__pool_t *p, gma__stream_t *s, int kind, uint64_t size) {
  if (reclaim_oldest_fit(p, s, kind, size)) return true;
  uint64_t own = 0;
  gma__gate_t newest[RECLAIM_STREAMS]; /* per gating stream, its newest gated epoch */
  bool ok[RECLAIM_STREAMS];
  size_t n = 0;
  for (gma__block_t *b = p->pending_head; b; b = b->qnext) {
    if (b->stream != s || b->seg->kind != kind) continue;
    own += b->size;
    uint32_t ng = gma__load_relaxed(&b->ngates);
    for (uint32_t i = 0; i < ng; i++) {
      size_t j = gate_slot(newest, n, b->gates[i].stream);
      if (j < n) {
        if (b->gates[i].epoch > newest[j].epoch) newest[j].epoch = b->gates[i].epoch;
      } else if (n < RECLAIM_STREAMS) { /* beyond that, its blocks stay pending */
        newest[n++] = b->gates[i];
      }
    }
  }
  if (own < size) return false;
  gma__stats_sample(p); /* allocated.current, with the bins' and locked frees' traffic */
  if (own < p->c.allocated.current) return false;
  bool planted = p->test_flags & GMA__TEST_NO_CONSUMER_WAIT;
  for (size_t j = 0; j < n; j++)
    ok[j] = planted || newest[j].stream == s || gma__gate_settle(p, &newest[j], s, true);
  bool any = false;
  for (gma__block_t *b = p->pending_head, *next; b; b = next) {
    next = b->qnext;
    if (b->stream != s || b->seg->kind != kind) continue;
    uint32_t ng = gma__load_relaxed(&b->ngates);
    bool covered = true;
    for (uint32_t i = 0; i < ng && covered; i++) {
      size_t j = gate_slot(newest, n, b->gates[i].stream);
      covered = j < n && ok[j];
    }
    if (!covered) continue;
    gma__pending_unlink(p, b);
    gma__store_relaxed(&b->ngates, 0);
    b->epoch = gma__load_relaxed(&s->epoch);
    gma__cache_block(p, b); /* may absorb a CACHED neighbour, never a pending one */
    any = true;
  }
  if (any) gma__store_relaxed(&s->dirty, true);
  return any;
}

/* Lock held, reuse:wait, after gma__streams_wait_fit found no single
 * cached block of another stream that holds size bytes: the cached block of
 * another stream whose join with its FREE address neighbours holds size
 * bytes in the fewest (join_search, JOIN_SCAN blocks per stream). u waits on
 * the device for that stream's epoch (gma__gate_settle); the joined block
 * stays cached on its stream with its epoch until take_block takes it for
 * u (FREE memory has no work to wait for, so the join asks no more of u
 * than the block alone). The joined FREE memory, and the rest a split
 * leaves, then waits behind that epoch too (as does all of it when the
 * caller takes a fresh segment instead: fresh_for_oversize): safe, and
 * FREE again once the epoch is seen complete. Without it, the comm stream
 * of the training scenario grew a segment while the compute stream's 7.9
 * MiB cached block sat beside 12.1 MiB FREE in one 20 MiB segment. NULL
 * when none fits or no wait could be made. */
static gma__block_t *wait_join_fit(gma__pool_t *p, gma__stream_t *u, int kind, uint64_t size) {
  uint64_t total = UINT64_MAX;
  gma__block_t *j = NULL;
  for (gma__stream_t *o = p->stream_list; o; o = o->next_all) {
    if (o == u) continue;
    int budget = JOIN_SCAN;
    join_search(o->cached_tree[kind], size, &total, &j, &budget);
  }
  if (!j) return NULL;
  gma__gate_t g = {j->stream, j->epoch};
  bool planted = p->test_flags & GMA__TEST_NO_CONSUMER_WAIT;
  if (!planted && !gma__gate_settle(p, &g, u, true)) return NULL;
  return join_free(p, j);
}

/* Lock held, nothing cached fits: grows (new memory is s's), and when the
 * device is full even after the OOM retry's release, takes the other kind's
 * best FREE fit. */
static gma_status_t grow_or_other(gma__pool_t *p, gma__stream_t *s, int kind, uint64_t size,
                                  gma__block_t **out, uint64_t **level, bool may_grow) {
  *level = &p->c.hits_device;
  if (!may_grow) return GMA_ERR_OOM; /* the caller has another plan; no message */
  gma_status_t st = grow(p, kind, size, s, out);
  p->c.grows_inline += st == GMA_OK;
  if (st == GMA_ERR_OOM && (*out = other_kind_fit(p, kind, size))) {
    *level = &p->c.hits_pool;
    return GMA_OK;
  }
  return st;
}

/* Lock held, no fit found yet: searches again after making what it can
 * reusable, cheapest first: what completed device work freed, the bins
 * left alone (they serve the hot path); then, while the pool holds less
 * than half the device, a small request in a small hole of the large pool
 * (ordinary segments);
 * only then every stream's bins drained (no device call), and then, before
 * the pool grows, every stream's epochs closed and observed. A training loop's
 * small misses would otherwise drain the bins at every step. Above half,
 * memory comes first: the drain puts binned small blocks (any stream's,
 * once their work completed) back in the small pool before a small
 * request eats into a hole that a large request may need. */
static gma__block_t *fit_after_settling(gma__pool_t *p, gma__stream_t *s, int kind, uint64_t size,
                                        bool capture) {
  gma__block_t *b = NULL;
  if (p->c.reserved.current < p->limit / 2) {
    gma__streams_observe(p);
    b = find_fit_in(p, s, kind, size, capture);
    if (!b) b = small_in_large_hole(p, kind, size);
  }
  if (!b) {
    gma__streams_drain(p);
    b = find_fit_in(p, s, kind, size, capture);
  }
  if (!b) {
    gma__streams_poll(p, false);
    b = find_fit_in(p, s, kind, size, capture);
  }
  return b;
}

gma_status_t gma__find_or_grow(gma__pool_t *p, gma__stream_t *s, int kind, uint64_t size,
                               gma__block_t **out, uint64_t **level, bool may_grow,
                               bool capture) {
  /* Blocks freed after record_stream wait in the pending list; if their
   * gates passed, put them back first, so a request of the same size finds
   * the same place and the layout does not drift from one iteration of a
   * training loop to the next. With epoch marks that asks the device
   * nothing. */
  if (p->pending_head) gma__streams_settle_pending(p, s);
  gma__block_t *b = NULL;
  bool waited = false; /* reached through a device-side wait: counts as pool */
  /* reuse:auto and reuse:wait: first s's own cache and the FREE blocks of
   * segments s made, then what s consumed from another stream
   * (pending_wait_fit: a device-side wait on work s already waited for),
   * and only then FREE memory of other streams' segments (and, under
   * reuse:wait, the other streams' cached memory behind waits). Taking
   * another stream's FREE segment costs nothing now, but that stream grows
   * when it comes back to it at the same point of the next iteration; this
   * order gives a training loop's iterations the places its first one
   * found. */
  bool passed_by = true; /* whether a search for any block may find more */
  if ((p->reuse == GMA_REUSE_AUTO || p->reuse == GMA_REUSE_WAIT) && !capture) {
    b = find_fit(p, s, kind, size, &passed_by);
    if (!b && p->pending_head) waited = (b = pending_wait_fit(p, s, kind, size, true)) != NULL;
  }
  if (!b && passed_by) b = find_fit_in(p, s, kind, size, capture);
  /* The host ran ahead of the device: s takes its own pending blocks back
   * behind device-side waits (reclaim_own_pending's bound), which no query
   * needs to precede. Not under reuse:query or none: the owner's wait on
   * its consumers is a dependency the program never made. */
  if (!b && (p->reuse == GMA_REUSE_AUTO || p->reuse == GMA_REUSE_WAIT) && !capture &&
      p->pending_head && reclaim_own_pending(p, s, kind, size)) {
    b = find_fit_in(p, s, kind, size, capture);
    waited = b != NULL;
  }
  if (!b) b = fit_after_settling(p, s, kind, size, capture);
  if (!b && p->reuse == GMA_REUSE_WAIT && !capture) {
    b = gma__streams_wait_fit(p, s, kind, size);
    if (!b) b = wait_join_fit(p, s, kind, size);
    if (!b) b = pending_wait_fit(p, s, kind, size, false);
    waited = b != NULL;
  }
  if (!b) b = small_in_large_hole(p, kind, size);
  if (b && may_grow && !capture && splits_whole_oversize(p, s, b, kind, size)) {
    gma__block_t *f = fresh_for_oversize(p, kind, size, s->serial, &b);
    if (f) {
      *level = &p->c.hits_device;
      p->c.grows_inline++;
      *out = f;
      return GMA_OK;
    }
    if (!b) b = find_fit_in(p, s, kind, size, capture); /* the lock was dropped: again */
  }
  if (b) {
    *level = !waited && gma__state_of(b) == GMA__CACHED && b->stream == s ? &p->c.hits_stream
                                                                        : &p->c.hits_pool;
    *out = b;
    return GMA_OK;
  }
  return grow_or_other(p, s, kind, size, out, level, may_grow);
}
