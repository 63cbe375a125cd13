/* Owns segments and blocks: best-fit lookup in size trees, splitting,
 * coalescing, growth from the pool's segment source (source.h; ordinary
 * segments here, growable ones with segments.c), the OOM retry, and the
 * structural check. Every function here runs under gma__pool_t.lock (see
 * pool.h) unless it says otherwise. */
#include "core/pool.h"
#include "base/sizeclass.h"

#include <inttypes.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Large requests below this share segments of segment_size[LARGE]; from it
 * up, each gets a segment of its own rounded to 2 MiB (PyTorch's rule too). A
 * request of exactly 10 MiB shared before: two filled a 20 MiB segment, but
 * such segments then took part-splits of whole free oversize segments, and
 * a transformer trace needed 0.2% more device memory. */
#define LARGE_OWN_MIN (10ull << 20)
#define SEGMENT_ROUND (2ull << 20)

static uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

/* ---- Size trees: treaps keyed by (size, addr) -------------------------------
 * A best fit is the lowest key with size >= request: the smallest block that
 * fits, lowest address first, which keeps memory packed toward segment starts. */

static bool key_less(const gma__block_t *a, const gma__block_t *b) {
  return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

static gma__block_t *treap_insert(gma__block_t *root, gma__block_t *b) {
  if (!root) {
    b->left = b->right = NULL;
    return b;
  }
  if (key_less(b, root)) {
    root->left = treap_insert(root->left, b);
    if (root->left->prio > root->prio) { /* rotate right */
      gma__block_t *l = root->left;
      root->left = l->right;
      l->right = root;
      return l;
    }
  } else {
    root->right = treap_insert(root->right, b);
    if (root->right->prio > root->prio) { /* rotate left */
      gma__block_t *r = root->right;
      root->right = r->left;
      r->left = root;
      return r;
    }
  }
  return root;
}

static gma__block_t *treap_merge(gma__block_t *a, gma__block_t *b) {
  if (!a) return b;
  if (!b) return a;
  if (a->prio > b->prio) {
    a->right = treap_merge(a->right, b);
    return a;
  }
  b->left = treap_merge(a, b->left);
  return b;
}

static gma__block_t *treap_remove(gma__block_t *root, gma__block_t *b) {
  GMA__ASSERT(root != NULL);
  if (root == b) return treap_merge(b->left, b->right);
  if (key_less(b, root))
    root->left = treap_remove(root->left, b);
  else
    root->right = treap_remove(root->right, b);
  return root;
}

static gma__block_t *treap_best_fit(gma__block_t *n, uint64_t size) {
  gma__block_t *best = NULL;
  while (n) {
    if (n->size >= size) {
      best = n;
      n = n->left;
    } else {
      n = n->right;
    }
  }
  return best;
}

static uint64_t treap_max_size(const gma__block_t *n) {
  if (!n) return 0;
  while (n->right) n = n->right;
  return n->size;
}

/* ---- Block records -------------------------------------------------------------
 * Records come from chunks and are recycled, never freed before destroy: the
 * lock-free free path and ck_stack's pop may still read a record that was just
 * recycled, and must find mapped memory there. */

#define BLOCK_CHUNK 256

gma__block_t *gma__block_new(gma__pool_t *p) {
  if (!p->spare_blocks) {
    if (p->nchunks == p->chunks_cap) {
      size_t cap = p->chunks_cap ? p->chunks_cap * 2 : 16;
      void **a = realloc(p->block_chunks, cap * sizeof *a);
      if (!a) return NULL;
      p->block_chunks = a;
      p->chunks_cap = cap;
    }
    gma__block_t *chunk = aligned_alloc(64, BLOCK_CHUNK * sizeof *chunk);
    if (!chunk) return NULL;
    memset(chunk, 0, BLOCK_CHUNK * sizeof *chunk);
    p->block_chunks[p->nchunks++] = chunk;
    for (int i = BLOCK_CHUNK - 1; i >= 0; i--) {
      chunk[i].next = p->spare_blocks;
      p->spare_blocks = &chunk[i];
    }
  }
  gma__block_t *b = p->spare_blocks;
  p->spare_blocks = b->next;
  gma__gate_t *gates = b->gates;
  uint32_t gates_cap = b->gates_cap;
  memset(b, 0, sizeof *b); /* no other thread can reach a spare record */
  b->gates = gates; /* keep the gate array: record_stream reuses it */
  b->gates_cap = gates_cap;
  p->rng ^= p->rng << 13; /* xorshift32 */
  p->rng ^= p->rng >> 17;
  p->rng ^= p->rng << 5;
  b->prio = p->rng;
  return b;
}

void gma__block_recycle(gma__pool_t *p, gma__block_t *b) {
  gma__store_relaxed(&b->state, GMA__FREE);
  b->addr = 0;
  b->next = p->spare_blocks;
  p->spare_blocks = b;
}

static uint8_t state_of(gma__block_t *b) { return gma__load_relaxed(&b->state); }

/* ---- Block containers -------------------------------------------------------
 * Each idle state has its container and byte counter; these keep them in step. */

void gma__free_link(gma__pool_t *p, gma__block_t *b) {
  gma__store_relaxed(&b->state, GMA__FREE);
  b->stream = NULL;
  gma__store_relaxed(&b->ngates, 0);
  p->free_tree[b->seg->kind] = treap_insert(p->free_tree[b->seg->kind], b);
  p->c.free += b->size;
}

void gma__free_unlink(gma__pool_t *p, gma__block_t *b) {
  p->free_tree[b->seg->kind] = treap_remove(p->free_tree[b->seg->kind], b);
  p->c.free -= b->size;
}

/* Links a CACHED block into its stream's tree and FIFO. The FIFO stays ordered
 * by epoch: b goes after `after` when given (a split keeps its place), else
 * after the last block whose epoch is not newer than b's (drained bins bring
 * older epochs than the tail's). */
static void cached_link(gma__pool_t *p, gma__block_t *b, gma__block_t *after) {
  gma__stream_t *s = b->stream;
  gma__store_relaxed(&b->state, GMA__CACHED);
  s->cached_tree[b->seg->kind] = treap_insert(s->cached_tree[b->seg->kind], b);
  if (!after) {
    after = s->fifo_tail;
    while (after && after->epoch > b->epoch) after = after->qprev;
  }
  b->qprev = after;
  b->qnext = after ? after->qnext : s->fifo_head;
  if (b->qprev) b->qprev->qnext = b; else s->fifo_head = b;
  if (b->qnext) b->qnext->qprev = b; else s->fifo_tail = b;
  s->cached_bytes += b->size;
  p->c.stream_cached += b->size;
}

void gma__cached_unlink(gma__pool_t *p, gma__block_t *b) {
  gma__stream_t *s = b->stream;
  s->cached_tree[b->seg->kind] = treap_remove(s->cached_tree[b->seg->kind], b);
  if (b->qprev) b->qprev->qnext = b->qnext; else s->fifo_head = b->qnext;
  if (b->qnext) b->qnext->qprev = b->qprev; else s->fifo_tail = b->qprev;
  b->qprev = b->qnext = NULL;
  s->cached_bytes -= b->size;
  p->c.stream_cached -= b->size;
}

static void pending_link(gma__pool_t *p, gma__block_t *b) {
  gma__store_relaxed(&b->state, GMA__PENDING);
  b->qprev = NULL;
  b->qnext = p->pending_head;
  if (p->pending_head) p->pending_head->qprev = b;
  p->pending_head = b;
  p->c.pending += b->size;
}

static void pending_unlink(gma__pool_t *p, gma__block_t *b) {
  if (b->qprev) b->qprev->qnext = b->qnext; else p->pending_head = b->qnext;
  if (b->qnext) b->qnext->qprev = b->qprev;
  b->qprev = b->qnext = NULL;
  p->c.pending -= b->size;
}

/* Absorbs next into b (address neighbours, same segment); recycles next. */
static void absorb_next(gma__pool_t *p, gma__block_t *b) {
  gma__block_t *n = b->next;
  b->size += n->size;
  b->next = n->next;
  if (b->next) b->next->prev = b;
  if (b->seg->last == n) b->seg->last = b;
  gma__pagemap_set(&p->pagemap, n->addr, NULL); /* clearing never allocates */
  gma__block_recycle(p, n);
}

/* Absorbs the FREE address neighbours of unlinked block b; returns the
 * merged block (b, or its former left neighbour, whose fields other than
 * the size and links the caller sets). */
static gma__block_t *absorb_free_neighbours(gma__pool_t *p, gma__block_t *b) {
  if (b->prev && state_of(b->prev) == GMA__FREE) {
    gma__block_t *prev = b->prev;
    gma__free_unlink(p, prev);
    absorb_next(p, prev);
    b = prev;
  }
  if (b->next && state_of(b->next) == GMA__FREE) {
    gma__free_unlink(p, b->next);
    absorb_next(p, b);
  }
  return b;
}

/* Makes an unlinked block FREE, coalescing with FREE neighbours. */
void gma__block_make_free(gma__pool_t *p, gma__block_t *b) {
  b = absorb_free_neighbours(p, b);
  /* Memory freed just now is not idle: the merged block's idle clock starts
   * again (it used to keep an idle neighbour's, so a timed trim gave back
   * memory freed a moment before). */
  b->free_since_ns = 0;
  gma__free_link(p, b);
}

/* Caches an unlinked block on its stream (b->stream, b->epoch set), merging
 * with neighbours cached on the same stream. The merged block takes the
 * newest epoch of its parts, so it is released only when all are safe. */
gma__block_t *gma__cache_block(gma__pool_t *p, gma__block_t *b) {
  gma__stream_t *s = b->stream;
  if (b->prev && state_of(b->prev) == GMA__CACHED && b->prev->stream == s) {
    gma__block_t *prev = b->prev;
    gma__cached_unlink(p, prev);
    if (b->epoch > prev->epoch) prev->epoch = b->epoch;
    absorb_next(p, prev); /* recycles b */
    b = prev;
  }
  if (b->next && state_of(b->next) == GMA__CACHED && b->next->stream == s) {
    gma__block_t *next = b->next;
    gma__cached_unlink(p, next);
    if (next->epoch > b->epoch) b->epoch = next->epoch;
    absorb_next(p, b);
  }
  cached_link(p, b, NULL);
  return b;
}

/* ---- Segments ----------------------------------------------------------------*/

static size_t seg_index_at_or_before(const gma__pool_t *p, uintptr_t addr) {
  size_t lo = 0, hi = p->nsegs; /* first segment with base > addr */
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (p->segs[mid]->base <= addr) lo = mid + 1; else hi = mid;
  }
  return lo; /* segs[lo-1] is the candidate; lo == 0 means none */
}

gma__segment_t *gma__seg_find(const gma__pool_t *p, uintptr_t addr) {
  size_t i = seg_index_at_or_before(p, addr);
  if (i == 0) return NULL;
  gma__segment_t *s = p->segs[i - 1];
  return addr < s->base + s->size ? s : NULL;
}

/* Makes device memory [base, base+size) a segment of one FREE block. */
gma_status_t gma__segs_insert(gma__pool_t *p, gma__segment_t *seg) {
  if (p->nsegs == p->segs_cap) {
    size_t cap = p->segs_cap ? p->segs_cap * 2 : 64;
    gma__segment_t **segs = realloc(p->segs, cap * sizeof *segs);
    if (!segs) return gma__set_error(GMA_ERR_OOM, "host memory for the segment table");
    p->segs = segs;
    p->segs_cap = cap;
  }
  size_t i = seg_index_at_or_before(p, seg->base);
  memmove(&p->segs[i + 1], &p->segs[i], (p->nsegs - i) * sizeof *p->segs);
  p->segs[i] = seg;
  p->nsegs++;
  return GMA_OK;
}

void gma__segs_remove(gma__pool_t *p, gma__segment_t *seg) {
  size_t i = seg_index_at_or_before(p, seg->base) - 1;
  GMA__ASSERT(p->segs[i] == seg);
  memmove(&p->segs[i], &p->segs[i + 1], (p->nsegs - i - 1) * sizeof *p->segs);
  p->nsegs--;
}

static gma_status_t seg_adopt(gma__pool_t *p, int kind, uintptr_t base, uint64_t size,
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
static gma_status_t seg_create(gma__pool_t *p, int kind, uint64_t size, uint64_t home,
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
  st = seg_adopt(p, kind, g.addr, g.size, home, out);
  if (st != GMA_OK) {
    src->ops->ungrow(src, &g);
    return st;
  }
  p->c.device_allocs++;
  GMA__TRACE(p, GMA__TR_SEGMENT_ALLOC, g.addr, g.size, 0, 0, 0, 0, 0);
  return GMA_OK;
}

/* Takes ordinary segment i (one FREE block) out of the pool and frees its
 * record; the source takes its memory (out), which the caller gives back. */
static void seg_detach(gma__pool_t *p, size_t i, gma__span_t *out) {
  gma__segment_t *seg = p->segs[i];
  gma__block_t *b = seg->first;
  gma__free_unlink(p, b);
  gma__pagemap_set(&p->pagemap, b->addr, NULL);
  gma__block_recycle(p, b);
  gma__stat_sub(&p->c.reserved, seg->size);
  gma__segs_remove(p, seg);
  p->src->ops->take(p->src, NULL, seg->base, seg->size, out); /* (ordinary: cannot fail) */
  out->kind = seg->kind;
  free(seg);
}

/* An ordinary segment that is one FREE block (growable segments give their
 * free chunks back through segments.c instead). */
static bool seg_is_free(gma__segment_t *seg) {
  return !seg->range && state_of(seg->first) == GMA__FREE && seg->first->size == seg->size;
}

/* Returns p->segs[i], one FREE block, to the device. */
static void release_segment(gma__pool_t *p, size_t i) {
  gma__span_t x;
  seg_detach(p, i, &x);
  p->src->ops->give_back(p->src, &x);
  p->src->ops->settle(p->src, &x);
  p->c.device_frees += x.calls;
  p->c.bytes_trimmed += x.done; /* as growable chunks given back here count */
  if (x.done < x.size) /* keep what the device would not take back */
    seg_adopt(p, x.kind, x.addr, x.size, 0, NULL);
}

/* Returns every segment that is one FREE block to the device (the OOM
 * retry: the caller is waiting for this memory anyway, so under the lock). */
static void release_free_segments(gma__pool_t *p) {
  if (p->growable) gma__segs_release_free(p);
  for (size_t i = p->nsegs; i-- > 0;)
    if (seg_is_free(p->segs[i])) release_segment(p, i);
}

/* The OOM retry's release, counted: completed work polled (its blocks FREE),
 * then every whole FREE segment given back. Never waits for the device. */
static void oom_release(gma__pool_t *p) {
  p->c.oom_retries++;
  gma__streams_poll(p, true);
  gma__stats_sample(p); /* cached's peak, before the cache goes */
  release_free_segments(p);
}

/* ---- Allocation ----------------------------------------------------------------*/

/* Pool serials: never reused in a process (nor across fork(): a child's
 * counter goes on from the parent's value), so a thread's cached entry of a
 * destroyed pool never matches a new one made at the same address. */
static _Atomic uint64_t next_pool_serial = 1;

gma_status_t gma__pool_init(gma__pool_t *p, gma__device_t *dev, const gma_config_t *cfg) {
  memset(p, 0, sizeof *p);
  p->serial = gma__faa_relaxed(&next_pool_serial, 1);
  if (pthread_mutex_init(&p->lock, NULL) != 0 || pthread_mutex_init(&p->count_lock, NULL) != 0 ||
      pthread_mutex_init(&p->trace_mu, NULL) != 0 || pthread_cond_init(&p->settled, NULL) != 0)
    return gma__set_error(GMA_ERR_INTERNAL, "pthread_mutex_init failed");
  p->dev = dev;
  p->small_size = cfg->small_size;
  p->segment_size[GMA__SMALL] = cfg->small_segment_size;
  p->segment_size[GMA__LARGE] = cfg->large_segment_size;
  p->limit = cfg->memory_limit;
  /* Segments no larger than the limit (here the device's capacity too): a
   * 2 MiB small segment under memory_limit:1M could never be made, so no
   * allocation could ever succeed (issue 13). The parser rejects a segment
   * size set explicitly above an explicit memory_limit. */
  uint64_t room = p->limit / GMA__ROUND * GMA__ROUND;
  for (int k = 0; k < GMA__NKINDS; k++)
    if (p->segment_size[k] > room) p->segment_size[k] = room;
  p->reuse = cfg->reuse;
  p->oom_wait_ns = cfg->oom_wait_ms ? cfg->oom_wait_ms * 1000000u : UINT64_MAX;
  if (!cfg->bins_off) {
    p->nbins = gma__class_of(cfg->bin_max) + 1;
    p->bin_max = gma__class_size(p->nbins - 1);
    p->bin_depth = (uint32_t)cfg->bin_depth;
  }
  p->rng = 0x9E3779B9u;
  p->sweep_at = 64;
  p->clock_in_slow_path = cfg->worker_off;
  gma__pool_tick_clock(p);
  gma_status_t st = GMA_OK;
  p->growable = cfg->expandable_segments;
  if (p->growable)
    st = gma__vm_source_new(dev, &p->trace, p->limit, p->segment_size, &p->src);
  else if (!(p->src = gma__plain_source_new(dev, &p->trace)))
    st = gma__set_error(GMA_ERR_OOM, "host memory for the segment source");
  if (st == GMA_OK) gma__pools_add(p); /* exiting threads retire their per-thread streams */
  return st;
}

/* Takes b (FREE, or CACHED on s) for a LIVE allocation of size bytes on s,
 * splitting off the rest, which stays in b's state and FIFO place. */
static void take_block(gma__pool_t *p, gma__block_t *b, uint64_t size, size_t requested,
                       gma__stream_t *s) {
  gma__block_t *rest = b->size - size >= GMA__MIN_SPLIT ? gma__block_new(p) : NULL;
  if (rest && !gma__pagemap_set(&p->pagemap, b->addr + size, rest)) {
    gma__block_recycle(p, rest);
    rest = NULL; /* no host memory for the map: hand out the whole block */
  }
  bool cached = state_of(b) == GMA__CACHED;
  if (rest) {
    rest->seg = b->seg;
    rest->addr = b->addr + size;
    rest->size = b->size - size;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    if (b->seg->last == b) b->seg->last = rest;
    if (cached) {
      rest->stream = b->stream;
      rest->epoch = b->epoch;
      cached_link(p, rest, b); /* right after b, while b is still linked */
    }
  }
  if (cached) gma__cached_unlink(p, b); else gma__free_unlink(p, b);
  if (rest) {
    b->size = size;
    if (!cached) gma__free_link(p, rest);
  }
  b->stream = s;
  gma__store_relaxed(&b->requested, requested);
  b->free_since_ns = 0;
  b->seg->free_since_ns = 0; /* in use again: the segment's unused clock restarts */
  gma__store_relaxed(&b->ngates, 0);
  gma__store_relaxed(&b->future_held, 0);
  gma__store_relaxed(&b->tag, 0);
  gma__store_relaxed(&b->born_ns, gma__load_relaxed(&p->clock_ns));
  gma__store_release(&b->state, GMA__LIVE); /* pairs with gma__bin_free's acquire */
  gma__tcount_t *c = gma__tcount(p, s);
  gma__counter_add_owner(&c->allocs, 1);
  gma__counter_add_owner(&c->alloc_bytes, b->size);
  gma__counter_add_owner(&c->req_bytes, requested);
}

/* A cached block's size with its FREE address neighbours (FREE blocks
 * coalesce, so there is at most one on each side). */
static uint64_t joined_size(gma__block_t *b) {
  uint64_t t = b->size;
  if (b->prev && state_of(b->prev) == GMA__FREE) t += b->prev->size;
  if (b->next && state_of(b->next) == GMA__FREE) t += b->next->size;
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
  b = absorb_free_neighbours(p, b);
  b->stream = s;
  b->epoch = epoch;
  cached_link(p, b, NULL);
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
 * find_or_grow), and *passed_by says whether a fitting FREE block of
 * another stream's segment was passed by (else a search for any block
 * would find nothing more). */
static gma__block_t *find_fit(gma__pool_t *p, gma__stream_t *s, int kind, uint64_t size,
                              bool *passed_by) {
  gma__block_t *c = treap_best_fit(s->cached_tree[kind], size);
  gma__block_t *f = treap_best_fit(p->free_tree[kind], size);
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
  uint64_t own = round_up(size, SEGMENT_ROUND);
  if (size < LARGE_OWN_MIN && own < p->segment_size[GMA__LARGE])
    return p->segment_size[GMA__LARGE];
  /* Near a memory_limit that is not a multiple of 2 MiB, rounding up would
   * make a request that fits the limit unservable: round less there. */
  uint64_t room = p->limit / GMA__ROUND * GMA__ROUND;
  return own > room && size <= room ? room : own;
}

/* Why oom_wait stopped: what the OOM message then says. */
enum { OOM_GOING = 0, OOM_SHORT /* live + need above the limit */, OOM_DEADLINE /* oom_wait_ms */,
       OOM_NOTHING /* no event to wait on */, OOM_ERRORS /* OOM_ERROR_ROUNDS failed queries */ };
typedef struct oom_waiting {
  uint64_t start_ns; /* when the first round began (0: none yet) */
  uint64_t rounds;
  unsigned errors;   /* rounds in a row that ended on a failed event query */
  uint64_t device_errors; /* p->c.device_errors when the call began */
  int stop;          /* OOM_*: why the last oom_wait returned false */
  uint64_t live;     /* OOM_SHORT: the bytes that stayed in use then (arenas whole) */
} oom_waiting_t;

/* What the OOM message cites: the last device failure, if one happened
 * during this call. */
static const char *failed_meanwhile(const gma__pool_t *p, const oom_waiting_t *w) {
  return p->c.device_errors > w->device_errors ? p->last_device_error : NULL;
}

static uint64_t oom_waited_ns(const oom_waiting_t *w) {
  return w->start_ns ? gma__now_ns() - w->start_ns : 0;
}

/* The OOM message: what was asked, where the memory is, and which of three
 * causes it is, with advice that fits it; counted in num_ooms and traced
 * (not under GMA__ALLOC_UNCOUNTED: the caller has another plan). Under
 * GMA__ALLOC_ATTEMPT, an async request's attempt, which waits and tries
 * again (every millisecond): a short message, no trace row, no device call;
 * the request's final failure is reported by gma__pool_oom_report. */
/* Lock held: one failed call, counted in num_ooms and traced. */
static void count_oom(gma__pool_t *p, size_t requested, gma_stream_t stream, uint64_t size) {
  p->c.ooms++;
  GMA__TRACE(p, GMA__TR_OOM, 0, requested, stream, size, 0, 0, 0);
}

static gma_status_t oom_error(gma__pool_t *p, uint64_t size, size_t requested,
                              gma_stream_t stream, unsigned flags, const oom_waiting_t *w) {
  uint64_t waited_ns = w ? oom_waited_ns(w) : 0;
  const char *device_failure = w ? failed_meanwhile(p, w) : NULL;
  int stop = w ? w->stop : OOM_GOING;
  if (flags & GMA__ALLOC_ATTEMPT)
    return gma__set_error(GMA_ERR_OOM, "cannot allocate %zu bytes on stream %p yet (the "
                          "request waits for memory)", requested, stream);
  uint64_t dev_free = 0, dev_total = 0;
  p->dev->ops->mem_info(p->dev, &dev_free, &dev_total);
  if (!(flags & GMA__ALLOC_UNCOUNTED)) count_oom(p, requested, stream, size);
  gma__stats_sample(p);
  uint64_t gated = p->c.stream_cached + p->c.pending, largest = gma__pool_largest_idle(p);
  uint64_t room = gma__pool_room(p);
  if (room > dev_free) room = dev_free;
  char cause[400];
  if (stop == OOM_SHORT)
    /* Decided when the wait stopped: what is gated now (another thread's
     * free since) is not why. */
    snprintf(cause, sizeof cause,
             "a real shortage: live allocations held %" PRIu64 " bytes of memory_limit / device "
             "capacity %" PRIu64 " when this call looked, so %" PRIu64 " more could not fit "
             "even once all device work finished; free memory, ask for less, or raise "
             "memory_limit",
             w->live, p->limit, size);
  else if (gated >= size && (flags & GMA__ALLOC_FUTURE))
    snprintf(cause, sizeof cause,
             "%" PRIu64 " bytes are freed but still in use by device work that has not finished "
             "by the request's deadline (its timeout_ns, or future_timeout_ms); synchronize "
             "the streams, or give the request a longer deadline", gated);
  else if (gated >= size && stop == OOM_DEADLINE)
    snprintf(cause, sizeof cause,
             "%" PRIu64 " bytes are freed but still in use by device work that has not finished "
             "(waited %.1f ms; oom_wait_ms bounds it); synchronize the streams, or raise "
             "oom_wait_ms", gated, (double)waited_ns / 1e6);
  else if (gated >= size)
    snprintf(cause, sizeof cause,
             "%" PRIu64 " bytes are freed but still in use by device work gma could not wait "
             "for (waited %.1f ms; %s); synchronize the streams that used them", gated,
             (double)waited_ns / 1e6,
             stop == OOM_ERRORS ? "the device failed every event query"
             : stop == OOM_NOTHING ? "no event covers that work: another thread's per-thread "
                                     "stream, or a capture"
                                   : "this call does not wait");
  else if (p->c.free + room >= size)
    /* Growable segments coalesce already: what is left is free memory
     * between live blocks, in chunks that can only go back whole. */
    snprintf(cause, sizeof cause,
             "fragmentation: %" PRIu64 " bytes are free in the pool, but the largest free "
             "block is %" PRIu64 " bytes and only %" PRIu64 " more can be reserved; %s",
             p->c.free, largest, room,
             p->growable ? "the free pieces lie between live blocks, in chunks that go back "
                           "to the device only whole: a smaller minimum chunk (large_segment, "
                           "small_segment) lets more of them go back, or free or shrink "
                           "long-lived allocations"
                         : "expandable_segments:true lets free chunks coalesce");
  else
    snprintf(cause, sizeof cause,
             "a real shortage: live allocations hold %" PRIu64 " bytes; free memory, ask for "
             "less, or raise memory_limit", p->c.allocated.current);
  return gma__set_error(
      GMA_ERR_OOM,
      "cannot allocate %zu bytes (%" PRIu64 " rounded) on stream %p: %s. In the pool: allocated %" PRIu64
      ", reserved %" PRIu64 " (%" PRIu64 " cached in stream trees, %" PRIu64
      " pending other streams' work, %" PRIu64 " free), device free %" PRIu64 " of %" PRIu64
      ", memory_limit %" PRIu64 "%s%s",
      requested, size, stream, cause, p->c.allocated.current, p->c.reserved.current,
      p->c.stream_cached, p->c.pending, p->c.free, dev_free, dev_total, p->limit,
      device_failure ? ". A device call failed meanwhile, so completed work may not have been "
                       "seen: "
                     : "",
      device_failure ? device_failure : "");
}

/* Before an OOM, wait (called and returning with the lock held, which it
 * drops while the host waits): until some device work that still uses freed
 * memory finishes, then what it gated is released, whole free segments go
 * back, and the caller searches again. True when something completed, so a
 * retry may succeed; false when nothing freed waits for device work, or the
 * oom_wait_ms deadline passed, or when need bytes cannot fit even once all
 * that work is done: the limit less the bytes allocated now is less than
 * need, so a real shortage fails at once instead of waiting for unrelated
 * kernels. Each round needs some work to complete. Rounds in which work
 * completed have no cap (a cap of 64 rounds in all made a call fail after
 * 0.2 s under oom_wait_ms:60000 with everything reserved pending, three
 * threads taking turns at what completed; a round may free nothing while a
 * block still waits for a second stream). OOM_ERROR_ROUNDS rounds in a row
 * that ended on a failed event query end it: after a sticky device error
 * the same round would otherwise repeat forever. */
#define OOM_ERROR_ROUNDS 64
static bool oom_wait(gma__pool_t *p, oom_waiting_t *w, uint64_t need) {
  gma__stats_sample(p); /* allocated.current, with the bins' traffic */
  /* What stays in use whatever device work completes: the allocations
   * outside arenas, and the arenas whole (their allocations are in them). */
  uint64_t live = p->c.allocated.current - p->c.inner_live + p->c.arena;
  if (live >= p->limit || p->limit - live < need) {
    w->stop = OOM_SHORT;
    w->live = live;
    return false;
  }
  if (w->errors >= OOM_ERROR_ROUNDS) {
    w->stop = OOM_ERRORS;
    return false;
  }
  if (!w->start_ns) w->start_ns = gma__now_ns();
  if (p->leaving) { /* a trim is giving memory back to the device right now */
    p->c.oom_waits += w->rounds++ == 0;
    while (p->leaving) pthread_cond_wait(&p->settled, &p->lock);
    return true;
  }
  uint64_t deadline = p->oom_wait_ns == UINT64_MAX ? UINT64_MAX : w->start_ns + p->oom_wait_ns;
  if (deadline != UINT64_MAX && gma__now_ns() >= deadline) {
    w->stop = OOM_DEADLINE;
    return false;
  }
  gma__event_t evs[GMA__OOM_WAIT_EVENTS];
  size_t n = gma__streams_wait_begin(p, evs, GMA__OOM_WAIT_EVENTS);
  if (!n) {
    w->stop = OOM_NOTHING;
    return false;
  }
  p->c.oom_waits += w->rounds++ == 0; /* one per call that waited */
  pthread_mutex_unlock(&p->lock);
  /* 0: the deadline; the next call says so. */
  int got = gma__streams_wait_any(p, evs, n, deadline);
  char why[sizeof p->last_device_error];
  if (got < 0) snprintf(why, sizeof why, "%s", gma__error_detail(gma_last_error()));
  pthread_mutex_lock(&p->lock);
  if (got < 0) gma__pool_device_error(p, why);
  gma__streams_wait_end(p);
  release_free_segments(p);
  w->errors = got < 0 ? w->errors + 1 : 0;
  return true; /* search once more: work may have completed even at the deadline */
}

/* Growable segments: maps just enough chunks (segments.c), with the same
 * retry after releasing safe cached memory; the fit then comes from the
 * free tree. */
static gma_status_t grow_region(gma__pool_t *p, int kind, uint64_t size, uint64_t home,
                                gma__block_t **out) {
  gma_status_t st = gma__segs_grow(p, kind, size, home);
  if (st == GMA_ERR_OOM) {
    oom_release(p);
    if ((*out = treap_best_fit(p->free_tree[kind], size))) return GMA_OK;
    st = gma__segs_grow(p, kind, size, home);
  }
  if (st == GMA_OK && !(*out = treap_best_fit(p->free_tree[kind], size)))
    st = gma__set_error(GMA_ERR_INTERNAL, "growable segment grew but holds no fit for %" PRIu64,
                        size);
  return st;
}

/* Grows the pool by one segment that can hold size bytes, the memory of the
 * stream of serial home (gma__segment_t.home). On device OOM it
 * releases cached memory that is already safe (never waiting for the device)
 * and retries, the second time with the smallest segment that fits. */
static gma_status_t grow(gma__pool_t *p, int kind, uint64_t size, uint64_t home,
                         gma__block_t **out) {
  if (p->growable) return grow_region(p, kind, size, home, out);
  uint64_t seg_size = segment_size_for(p, kind, size);
  gma_status_t st = seg_create(p, kind, seg_size, home, out);
  if (st != GMA_ERR_OOM) return st;
  oom_release(p);
  *out = treap_best_fit(p->free_tree[kind], size); /* polling may have freed a fit */
  if (*out) return GMA_OK;
  st = seg_create(p, kind, seg_size, home, out);
  uint64_t least = kind == GMA__LARGE ? round_up(size, SEGMENT_ROUND) : seg_size;
  if (st == GMA_ERR_OOM && least < seg_size) st = seg_create(p, kind, least, home, out);
  /* Right below memory_limit: only what the request needs, or what is left
   * of the limit for a small segment (a 512-byte request must not fail with
   * a megabyte left below the limit). */
  uint64_t room = gma__pool_room(p);
  uint64_t need = kind == GMA__SMALL ? (room < seg_size ? room : seg_size) : round_up(size, GMA__ROUND);
  if (st == GMA_ERR_OOM && need >= size && need < least)
    st = seg_create(p, kind, need, home, out);
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
  return treap_best_fit(p->free_tree[kind == GMA__SMALL ? GMA__LARGE : GMA__SMALL], size);
}

/* Lock held. The small pool would grow: a FREE block of the large pool
 * serves a small request instead when what it leaves is less than a small
 * segment. A hole that small serves few large requests, and growing would
 * reserve a whole small segment (a chunk, growable) beside it. (The block
 * stays in its large segment: freed, it goes back to the large trees.) */
static gma__block_t *small_in_large_hole(gma__pool_t *p, int kind, uint64_t size) {
  gma__block_t *b = kind == GMA__SMALL ? other_kind_fit(p, kind, size) : NULL;
  return b && b->size - size < p->segment_size[GMA__SMALL] ? b : NULL;
}

/* Lock held. A block of at least size bytes for s: the stream's cache or the
 * free pool (after settling pending blocks, then after observing completed
 * epochs, then after a poll that drains the bins), a device-side wait under
 * reuse:wait, a small hole of the large pool, or a new segment. *level says which hit counter it
 * is; nothing is counted here. GMA_ERR_OOM leaves the message to the caller. */
/* A graph pool's chunk (GMA__ALLOC_CAPTURE): FREE memory only, never a
 * block cached on the stream (see the flag). */
static gma__block_t *find_fit_in(gma__pool_t *p, gma__stream_t *s, int kind, uint64_t size,
                                 bool capture) {
  return capture ? treap_best_fit(p->free_tree[kind], size) : find_fit(p, s, kind, size, NULL);
}

/* Lock held. Whether b, the fit found for a request of size bytes that
 * gets a segment of its own (LARGE_OWN_MIN or more), is a whole ordinary
 * segment made for a bigger request (FREE, or cached on s, the requesting
 * stream), which the request would split leaving more of it unused than it
 * uses. Only while the pool holds half its limit or more: with room to
 * spare a split loses nothing, and a new segment instead made a PyTorch
 * training loop on an H100 reserve 19% more. (Requests that share segments
 * split them by design; counting them too made a trace need 0.7% more
 * device memory.) */
static bool splits_whole_oversize(const gma__pool_t *p, gma__stream_t *s, gma__block_t *b,
                                  int kind, uint64_t size) {
  if (kind != GMA__LARGE || p->growable || size < LARGE_OWN_MIN ||
      p->c.reserved.current < p->limit / 2 || b->prev || b->next || b->seg->range ||
      b->seg->size <= p->segment_size[GMA__LARGE])
    return false;
  int st = state_of(b);
  return (st == GMA__FREE || (st == GMA__CACHED && b->stream == s)) && b->size - size >= size;
}

/* Lock held. Instead of that split (splits_whole_oversize): a segment with
 * a live block in it cannot go back to the device, so the unused part of a
 * split oversize segment is lost to every other size until the block is
 * freed. Under a device limit that loses allocations: three rounds of 64 x
 * 1132, 40 x 1812 and 96 x 754 MiB in 78.7 GiB failed 58 of them on an
 * H100, as PyTorch's allocator did, while cuMemAlloc and cudaMallocAsync
 * failed none. So a segment of the request's own size is made while the
 * device has room, and *b stays whole: it serves a request its size later,
 * or goes back to the device at an OOM retry. Without room, a FREE *b's
 * segment goes back to the device and the new one is made from it (a swap:
 * the pool holds less than before); a cached *b may still be in use, so
 * then the OOM retry's release comes first (completed work polled, every
 * whole FREE segment given back). Returns the new segment's block, or NULL:
 * split *b as before, or grow as before when *b is NULL (it went back). */
static gma__block_t *fresh_for_oversize(gma__pool_t *p, int kind, uint64_t size,
                                        uint64_t home, gma__block_t **b) {
  uint64_t own = round_up(size, SEGMENT_ROUND);
  gma__block_t *f = NULL;
  if (seg_create(p, kind, own, home, &f) == GMA_OK) return f;
  if (state_of(*b) == GMA__FREE) {
    size_t i = seg_index_at_or_before(p, (*b)->seg->base) - 1;
    GMA__ASSERT(p->segs[i] == (*b)->seg);
    p->c.oom_retries++;
    gma__stats_sample(p); /* cached's peak, before the cache goes */
    release_segment(p, i);
  } else {
    oom_release(p);
  }
  *b = NULL; /* released, or perhaps merged by the poll */
  return seg_create(p, kind, own, home, &f) == GMA_OK ? f : NULL;
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
  pending_unlink(p, best);
  gma__store_relaxed(&best->ngates, 0);
  best->stream = s;
  best->epoch = gma__load_relaxed(&s->epoch);
  gma__store_relaxed(&s->dirty, true);
  return gma__cache_block(p, best);
}

/* Lock held, reuse:wait, the pool about to grow for s: when
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
 * that hands every buffer to a slower stream grows by the whole lead (554
 * MiB against 4 MiB live on the simulated device; 352-506 MiB on an H100,
 * where CUB's event-wait held 7.9 MiB at the same speed). Not under
 * reuse:auto: s's wait on its consumers is a dependency the program never
 * made. A consumer's work may itself wait on the host for s's thread (the
 * GPU pipeline test holds each consumer stream until its stage's next
 * buffer is served); with the reclaim on by default, a stage synchronizing
 * its own stream then waited for a consumer that waited for it, and
 * fakecuda_pipeline hung under ASan. True when anything came back. */
#define RECLAIM_STREAMS 16 /* distinct gating streams handled in one call */
/* The slot of gating stream u among newest[0..n), or n. */
static size_t gate_slot(const gma__gate_t *newest, size_t n, const gma__stream_t *u) {
  size_t j = 0;
  while (j < n && newest[j].stream != u) j++;
  return j;
}

static bool reclaim_own_pending(gma__pool_t *p, gma__stream_t *s, int kind, uint64_t size) {
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
    pending_unlink(p, b);
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

static gma_status_t find_or_grow(gma__pool_t *p, gma__stream_t *s, int kind, uint64_t size,
                                 gma__block_t **out, uint64_t **level, bool may_grow,
                                 bool capture) {
  /* Blocks freed after record_stream wait in the pending list; if their
   * gates passed, put them back first, so a request of the same size finds
   * the same place and the layout does not drift from one iteration of a
   * training loop to the next. */
  if (p->pending_head) gma__streams_settle_pending(p);
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
  /* Cheapest first: what completed device work freed, the bins left alone
   * (they serve the hot path); then, while the pool holds less than half the
   * device, a small request in a small hole of the large pool; only then
   * every stream's bins drained, before the pool grows. A training loop's
   * small misses would otherwise drain the bins at every step. Above half,
   * memory comes first: the drain puts binned small blocks (any stream's,
   * once their work completed) back in the small pool before a small
   * request eats into a hole that a large request may need. */
  if (!b && p->c.reserved.current < p->limit / 2) {
    gma__streams_observe(p);
    b = find_fit_in(p, s, kind, size, capture);
    if (!b) b = small_in_large_hole(p, kind, size);
  }
  if (!b) {
    gma__streams_poll(p, false);
    b = find_fit_in(p, s, kind, size, capture);
  }
  if (!b && p->reuse == GMA_REUSE_WAIT && !capture) {
    b = gma__streams_wait_fit(p, s, kind, size);
    if (!b) b = wait_join_fit(p, s, kind, size);
    if (!b) b = pending_wait_fit(p, s, kind, size, false);
    waited = b != NULL;
  }
  if (!b) b = small_in_large_hole(p, kind, size);
  /* Only under reuse:wait: the owner's wait on its consumers is a dependency
   * the program never made (see reclaim_own_pending). */
  if (!b && p->reuse == GMA_REUSE_WAIT && !capture && p->pending_head &&
      reclaim_own_pending(p, s, kind, size)) {
    b = find_fit_in(p, s, kind, size, capture);
    waited = b != NULL;
  }
  if (b && may_grow && !capture && splits_whole_oversize(p, s, b, kind, size)) {
    gma__block_t *f = fresh_for_oversize(p, kind, size, s->serial, &b);
    if (f) {
      *level = &p->c.hits_device;
      p->c.grows_inline++;
      *out = f;
      return GMA_OK;
    }
  }
  if (b) {
    *level = !waited && state_of(b) == GMA__CACHED && b->stream == s ? &p->c.hits_stream
                                                                        : &p->c.hits_pool;
    *out = b;
    return GMA_OK;
  }
  *level = &p->c.hits_device;
  if (!may_grow) return GMA_ERR_OOM; /* the caller has another plan; no message */
  gma_status_t st = grow(p, kind, size, s->serial, out); /* new memory is s's */
  p->c.grows_inline += st == GMA_OK;
  if (st == GMA_ERR_OOM && (*out = other_kind_fit(p, kind, size))) {
    *level = &p->c.hits_pool;
    return GMA_OK;
  }
  return st;
}

uint64_t gma__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void gma__pool_tick_clock(gma__pool_t *p) { gma__store_relaxed(&p->clock_ns, gma__now_ns()); }

uint64_t gma__pool_room(const gma__pool_t *p) {
  uint64_t held = p->c.reserved.current + p->leaving;
  return p->limit > held ? (p->limit - held) / GMA__ROUND * GMA__ROUND : 0;
}

gma_status_t gma__pool_alloc_slow(gma__pool_t *p, size_t requested, gma_stream_t stream,
                                  uint64_t stream_id, unsigned flags, void **out) {
  if (p->clock_in_slow_path) gma__pool_tick_clock(p);
  bool capture = flags & GMA__ALLOC_CAPTURE;
  if (!capture) {
    gma_status_t refused = gma__pool_refuse_capture(p, stream, "gma_alloc");
    if (refused != GMA_OK) return refused;
  }
  /* Requests the bins serve get their class's size, so the block can go
   * into a bin when freed; an arena is served at its own size. */
  uint64_t size = requested <= p->bin_max && !(flags & GMA__ALLOC_ARENA)
                      ? gma__class_size(gma__class_of(requested))
                      : round_up(requested, GMA__ROUND);
  int kind = size <= p->small_size ? GMA__SMALL : GMA__LARGE;
  bool inline_try = flags & GMA__ALLOC_INLINE;
  gma_status_t st;
  if (!inline_try) pthread_mutex_lock(&p->lock);
  else if (pthread_mutex_trylock(&p->lock) != 0) return GMA_ERR_BUSY; /* the worker serves it */
  unsigned kept = gma__error_keep(); /* a failure inside a call that succeeds is not said */
  gma__stream_t *s = gma__stream_resolve(p, stream, stream_id);
  gma__block_t *b = NULL;
  uint64_t *level = NULL;
  oom_waiting_t w = {.device_errors = p->c.device_errors};
  if (!s) {
    st = gma__set_error(GMA_ERR_OOM, "host memory for a stream record");
  } else {
    st = find_or_grow(p, s, kind, size, &b, &level, !inline_try, capture);
    while (st == GMA_ERR_OOM && (flags & GMA__ALLOC_WAIT) && oom_wait(p, &w, size))
      st = find_or_grow(p, s, kind, size, &b, &level, true, capture);
    if (st == GMA_ERR_OOM && !inline_try)
      st = oom_error(p, size, requested, stream, flags, &w);
  }
  if (st == GMA_OK) {
    if (!(flags & GMA__ALLOC_ARENA)) (*level)++; /* an arena is no gma_alloc call: no hit level */
    take_block(p, b, size, requested, s);
    *out = (void *)b->addr;
    if (flags & GMA__ALLOC_ARENA) { /* counted out of the stats before any sample sees it */
      gma__store_relaxed(&b->arena, 1);
      GMA__ASSERT(b->size == requested);
      p->c.arena += b->size;
      p->c.arena_total += b->size;
      p->c.arena_allocs++;
    }
    gma__stats_sample(p);
  }
  GMA__VALIDATE(p);
  pthread_mutex_unlock(&p->lock);
  gma__error_done(kept, st);
  return st;
}

/* Where a block taken for a batch came from, so a failed batch puts it back. */
typedef struct gma__taken {
  gma__block_t *b;
  gma__stream_t *owner; /* CACHED: the stream whose cache it was in; NULL: FREE */
  uint64_t epoch;       /* CACHED: its epoch there */
} gma__taken_t;

/* Lock held: notes where b is before take_block takes it. */
static gma__taken_t taken_from(gma__block_t *b) {
  bool cached = state_of(b) == GMA__CACHED;
  return (gma__taken_t){b, cached ? b->stream : NULL, cached ? b->epoch : 0};
}

/* Lock held. Undoes take_block for a block of a batch that failed part-way
 * (the caller never saw it), its counts taken back: it goes back where it
 * came from. A block from the free pool is FREE again; one from a stream's
 * cache (the batch's own stream, or another's under reuse:wait) is cached
 * there again with its epoch, because device work queued before its free may
 * still use it: making it FREE would hand it to any stream, and to trimming. */
static void untake_block(gma__pool_t *p, const gma__taken_t *t) {
  gma__block_t *b = t->b;
  gma__tcount_t *c = gma__tcount(p, b->stream);
  gma__counter_add_owner(&c->allocs, (uint64_t)-1);
  gma__counter_add_owner(&c->alloc_bytes, (uint64_t)0 - b->size);
  gma__counter_add_owner(&c->req_bytes, (uint64_t)0 - gma__load_relaxed(&b->requested));
  if (!t->owner) {
    gma__block_make_free(p, b);
    return;
  }
  b->stream = t->owner;
  b->epoch = t->epoch;
  gma__cache_block(p, b);
}

gma_status_t gma__pool_alloc_batch(gma__pool_t *p, size_t n, const size_t *sizes,
                                   gma_stream_t stream, uint64_t stream_id, unsigned flags,
                                   void **ptrs) {
  gma_status_t refused = gma__pool_refuse_capture(p, stream, "gma_alloc_batch");
  if (refused != GMA_OK) return refused;
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) total += round_up(sizes[i], GMA__ROUND);
  int kind = total <= p->small_size ? GMA__SMALL : GMA__LARGE;
  gma_status_t st = GMA_OK;
  gma__taken_t *taken = calloc(n, sizeof *taken);
  uint64_t **levels = calloc(n, sizeof *levels); /* hit counters, counted on success */
  if (!taken || !levels) {
    free(taken);
    free(levels);
    return gma__set_error(GMA_ERR_OOM, "host memory for a batch of %zu", n);
  }
  bool inline_try = flags & GMA__ALLOC_INLINE;
  if (!inline_try) {
    pthread_mutex_lock(&p->lock);
  } else if (pthread_mutex_trylock(&p->lock) != 0) { /* the worker serves it */
    free(taken);
    free(levels);
    return GMA_ERR_BUSY;
  }
  unsigned kept = gma__error_keep(); /* a failure inside a call that succeeds is not said */
  gma__stream_t *s = gma__stream_resolve(p, stream, stream_id);
  gma__block_t *b = NULL;
  uint64_t *level = NULL;
  size_t got = 0;
  if (!s) {
    st = gma__set_error(GMA_ERR_OOM, "host memory for a stream record");
    goto out;
  }
  /* Where the memory comes from, cheapest first: one contiguous block of the
   * memory already held; the blocks one by one in memory already held; one
   * contiguous block of a new segment; one by one, growing as needed. A
   * batch never takes a new segment while the memory it needs is already
   * free in pieces: a training step's gradient batch would otherwise leave
   * a segment behind each step, split up by other requests in between. */
  bool split = false;
  oom_waiting_t w = {.device_errors = p->c.device_errors};
  bool host_short = false;
again:
  for (int plan = 0; plan < (inline_try ? 2 : 4) && got < n; plan++) { /* inline: held memory */
    bool grow_ok = plan >= 2;
    if (plan % 2 == 0) {
      st = find_or_grow(p, s, kind, total, &b, &level, grow_ok, false);
      if (st == GMA_ERR_OOM) continue; /* no room that way: the next plan */
      if (st != GMA_OK) break;         /* a device error: the batch fails */
      /* One block of the total, cut front to back: each take splits off the
       * rest right after it, in the same container (free pool, or one
       * stream's cache), to take next. A rest in any other state means the
       * split could not happen (no host memory for a record): roll back. */
      uint8_t from = state_of(b);
      gma__stream_t *owner = b->stream;
      for (; got < n; got++) {
        uint64_t size = round_up(sizes[got], GMA__ROUND);
        if (!b || state_of(b) != from || b->stream != owner || b->size < size) break;
        taken[got] = taken_from(b);
        take_block(p, b, size, sizes[got], s);
        b = b->next;
      }
      if (got == n) {
        (*level) += n;
      } else {
        st = gma__set_error(GMA_ERR_OOM, "host memory for block records");
        host_short = true;
        break;
      }
    } else {
      for (; got < n; got++) {
        uint64_t size = round_up(sizes[got], GMA__ROUND);
        int k = size <= p->small_size ? GMA__SMALL : GMA__LARGE;
        if ((st = find_or_grow(p, s, k, size, &b, &levels[got], grow_ok, false)) != GMA_OK) break;
        taken[got] = taken_from(b);
        take_block(p, b, size, sizes[got], s);
      }
      split = got == n;
      for (size_t i = 0; split && i < n; i++) (*levels[i])++;
      if (got < n && st == GMA_ERR_OOM && plan == 1) { /* not enough held: undo, grow */
        for (size_t i = got; i-- > 0;) untake_block(p, &taken[i]);
        got = 0;
      }
    }
  }
  if (got < n) {
    /* All or nothing: nothing of a failed batch stays allocated. */
    for (size_t i = got; i-- > 0;) untake_block(p, &taken[i]);
    /* Host memory ran out (no record for a split): no device work can help. */
    host_short = host_short || st == GMA_OK;
    if (st == GMA_ERR_OOM && !host_short && (flags & GMA__ALLOC_WAIT) && oom_wait(p, &w, total)) {
      got = 0;
      st = GMA_OK;
      goto again; /* device work finished and freed memory: every plan again */
    }
    if (host_short) st = gma__set_error(GMA_ERR_OOM, "gma_alloc_batch: no host memory for block records");
    else if (st == GMA_ERR_OOM && !inline_try) /* inline: no message, the worker goes on */
      st = oom_error(p, total, (size_t)total, stream, flags, &w);
    goto out;
  }
  for (size_t i = 0; i < n; i++) ptrs[i] = (void *)taken[i].b->addr;
  p->c.batches++;
  p->c.batches_split += split;
  gma__stats_sample(p);
out:
  GMA__VALIDATE(p);
  pthread_mutex_unlock(&p->lock);
  free(taken);
  free(levels);
  gma__error_done(kept, st);
  return st;
}

/* ---- Free and record_stream -----------------------------------------------------*/

/* Finds the block containing addr, or NULL (walks one segment: error path only). */
static gma__block_t *block_containing(const gma__pool_t *p, uintptr_t addr) {
  gma__segment_t *seg = gma__seg_find(p, addr);
  if (!seg) return NULL;
  gma__block_t *b = seg->first;
  while (b && addr >= b->addr + b->size) b = b->next;
  return b;
}

/* Whether addr lies in the bytes asked for of b (not in gma's rounding after
 * them): where an interior pointer may name b. */
static bool within_requested(const gma__block_t *b, uintptr_t addr) {
  return addr - b->addr < gma__load_relaxed(&b->requested);
}

/* Says why addr is not a live allocation: foreign, interior, or already freed. */
static gma_status_t bad_pointer(const gma__pool_t *p, uintptr_t addr, const char *op) {
  gma__block_t *b = block_containing(p, addr);
  if (!b)
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "%s(%p): the pointer was not allocated by this allocator (it lies in "
                          "none of its %zu segments)",
                          op, (void *)addr, p->nsegs);
  uint64_t req = gma__load_relaxed(&b->requested);
  if (state_of(b) == GMA__LIVE && !within_requested(b, addr) && addr != b->addr)
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "%s(%p): the pointer lies past the end of the live allocation at %p "
                          "(%" PRIu64 " bytes asked for; the %" PRIu64 " bytes after them are "
                          "gma's rounding, not part of it)",
                          op, (void *)addr, (void *)b->addr, req, b->size - req);
  if (state_of(b) == GMA__LIVE && b->addr != addr)
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "%s(%p): interior pointer, %" PRIu64
                          " bytes into the live allocation at %p; pass the pointer gma_alloc "
                          "returned",
                          op, (void *)addr, (uint64_t)(addr - b->addr), (void *)b->addr);
  /* Every pointer gma returns is GMA__ROUND-aligned: one that is not was
   * never returned. Of an aligned one gma cannot tell a block freed twice
   * (perhaps merged since with free memory before it) from a pointer it
   * never returned into free memory; the first is by far the likelier. */
  if (addr % GMA__ROUND)
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "%s(%p): gma never returned this pointer (its pointers are %u-byte "
                          "aligned); it lies in free memory of a segment",
                          op, (void *)addr, GMA__ROUND);
  /* Right after a live allocation that fills its block: the end pointer of
   * that allocation as likely as a stale one. */
  gma__block_t *prev = b->addr == addr ? b->prev : NULL;
  bool after_live = prev && state_of(prev) == GMA__LIVE && prev->addr + prev->size == addr;
  char hint[96] = "";
  if (after_live)
    snprintf(hint, sizeof hint, "; it is also the end of the live allocation at %p",
             (void *)prev->addr);
  return gma__set_error(strcmp(op, "gma_free") == 0 ? GMA_ERR_DOUBLE_FREE
                                                    : GMA_ERR_INVALID_POINTER,
                        "%s(%p): the pointer is not live: %s (double free or use after free?)%s",
                        op, (void *)addr,
                        b->addr == addr ? "the block that starts there was already freed (or "
                                          "never handed out)"
                                        : "it lies in memory already freed, where no "
                                          "allocation starts now (or gma never returned it)",
                        hint);
}

/* The LIVE block starting at addr, or NULL. Lock held. */
static gma__block_t *live_block(gma__pool_t *p, uintptr_t addr) {
  gma__block_t *b = gma__pagemap_get(&p->pagemap, addr);
  return b && b->addr == addr && state_of(b) == GMA__LIVE ? b : NULL;
}

static bool free_taken(gma__pool_t *p, gma__block_t *b);

gma_status_t gma__pool_free_slow(gma__pool_t *p, void *ptr, bool *pended) {
  *pended = false;
  uintptr_t addr = (uintptr_t)ptr;
  pthread_mutex_lock(&p->lock);
  gma__block_t *b = live_block(p, addr);
  uint8_t live = GMA__LIVE;
  /* The CAS settles a race with a lock-free free of the same pointer. */
  if (b && gma__load_relaxed(&b->future_held)) {
    /* Memory an async request got and nobody collected: the caller cannot
     * have been handed this pointer, so it is stale (freed before and since
     * given to the request). Freeing it would free the request's memory. */
    pthread_mutex_unlock(&p->lock);
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_free(%p): this memory belongs to an async request whose future "
                          "was not collected (gma_future_wait) or released; a stale pointer?",
                          ptr);
  }
  if (!b || !gma__cas_acq_rel(&b->state, &live, GMA__PENDING)) {
    gma_status_t st = bad_pointer(p, addr, "gma_free");
    pthread_mutex_unlock(&p->lock);
    return st;
  }
  *pended = free_taken(p, b);
  GMA__VALIDATE(p);
  pthread_mutex_unlock(&p->lock);
  return GMA_OK;
}

/* Lock held: b was LIVE and its state is now PENDING (the caller's CAS):
 * counts the free and caches b on its stream, or, used by other streams,
 * leaves it pending behind their open epochs (then true). */
static bool free_taken(gma__pool_t *p, gma__block_t *b) {
  gma__stream_t *s = b->stream;
  gma__tcount_t *c = gma__tcount(p, s);
  gma__counter_add_owner(&c->frees, 1);
  gma__counter_add_owner(&c->free_bytes, b->size);
  gma__counter_add_owner(&c->req_freed, gma__load_relaxed(&b->requested));
  bool retired = gma__load_relaxed(&s->retired);
  b->epoch = retired ? s->free_epoch : gma__load_relaxed(&s->epoch);
  if (!retired) gma__store_relaxed(&s->dirty, true);
  uint32_t ngates = gma__load_relaxed(&b->ngates);
  if (ngates && !(p->test_flags & GMA__TEST_NO_RECORD_GATING)) {
    /* Other streams used it: it waits for the owner's and their open epochs. */
    for (uint32_t i = 0; i < ngates; i++) {
      gma__stream_t *u = b->gates[i].stream;
      bool u_retired = gma__load_relaxed(&u->retired);
      b->gates[i].epoch = u_retired ? u->free_epoch : gma__load_relaxed(&u->epoch);
      if (!u_retired) gma__store_relaxed(&u->dirty, true);
    }
    pending_link(p, b);
    return true;
  }
  gma__store_relaxed(&b->ngates, 0);
  if (p->test_flags & GMA__TEST_NO_EPOCH_GATING)
    gma__block_make_free(p, b);
  else
    gma__cache_block(p, b);
  return false;
}

/* Lock held: stream u used live block b too (record_stream): its free
 * waits for u's epoch then. False without host memory for the gate. */
static bool add_gate(gma__block_t *b, gma__stream_t *u) {
  if (u == b->stream) return true;
  uint32_t n = gma__load_relaxed(&b->ngates), i = 0;
  while (i < n && b->gates[i].stream != u) i++;
  if (i < n) return true;
  if (n == b->gates_cap) {
    uint32_t cap = b->gates_cap ? b->gates_cap * 2 : 2;
    gma__gate_t *g = realloc(b->gates, cap * sizeof *g);
    if (!g) return false;
    b->gates = g;
    b->gates_cap = cap;
  }
  b->gates[n] = (gma__gate_t){u, 0};
  gma__store_relaxed(&b->ngates, n + 1);
  return true;
}

/* Anywhere inside a live allocation names the whole allocation (PyTorch's
 * record_stream names a tensor's whole storage; a view's pointer is often
 * inside it): a block's start is found in the page map, an interior pointer
 * by walking its segment's blocks. *base gets the allocation's start. */
gma_status_t gma__pool_record_stream(gma__pool_t *p, void *ptr, gma_stream_t stream,
                                     void **base) {
  uint64_t id;
  gma_status_t st = p->dev->ops->stream_id(p->dev, stream, &id);
  if (st != GMA_OK) return st;
  pthread_mutex_lock(&p->lock);
  gma__block_t *b = live_block(p, (uintptr_t)ptr);
  if (!b) { /* an interior pointer: inside the bytes asked for, not gma's rounding */
    b = block_containing(p, (uintptr_t)ptr);
    if (b && (state_of(b) != GMA__LIVE || !within_requested(b, (uintptr_t)ptr))) b = NULL;
  }
  if (b) *base = (void *)b->addr;
  gma__stream_t *u = b ? gma__stream_resolve(p, stream, id) : NULL;
  if (!b) {
    st = bad_pointer(p, (uintptr_t)ptr, "gma_record_stream");
  } else if (!u) {
    st = gma__set_error(GMA_ERR_OOM, "host memory for a stream record");
  } else if (!add_gate(b, u)) {
    st = gma__set_error(GMA_ERR_OOM, "host memory for record_stream");
  }
  pthread_mutex_unlock(&p->lock);
  return st;
}

gma_status_t gma__pool_free_after(gma__pool_t *p, void *ptr, gma__stream_t *const *streams,
                                  size_t n) {
  pthread_mutex_lock(&p->lock);
  gma__block_t *b = live_block(p, (uintptr_t)ptr);
  uint8_t live = GMA__LIVE;
  gma_status_t st = GMA_OK;
  for (size_t i = 0; b && i < n && st == GMA_OK; i++)
    if (!add_gate(b, streams[i])) st = gma__set_error(GMA_ERR_OOM, "host memory for a gate");
  if (st == GMA_OK && (!b || !gma__cas_acq_rel(&b->state, &live, GMA__PENDING)))
    st = bad_pointer(p, (uintptr_t)ptr, "gma_free");
  if (st == GMA_OK) {
    /* Its size before the free: caching it may merge it with free neighbours. */
    uint64_t size = b->size;
    gma__store_relaxed(&b->arena, 0);
    free_taken(p, b);
    p->c.arena -= size; /* in the same locked step as the free's counts */
    p->c.arena_frees++;
  }
  GMA__VALIDATE(p);
  pthread_mutex_unlock(&p->lock);
  return st;
}

void gma__pool_settle(gma__pool_t *p, uint64_t deadline_ns) {
  gma__event_t evs[GMA__OOM_WAIT_EVENTS];
  for (;;) {
    pthread_mutex_lock(&p->lock);
    gma__streams_poll(p, true);
    size_t n = gma__now_ns() < deadline_ns ? gma__streams_wait_begin(p, evs, GMA__OOM_WAIT_EVENTS)
                                           : 0;
    pthread_mutex_unlock(&p->lock);
    if (!n) return;
    gma__streams_wait_any(p, evs, n, deadline_ns);
    pthread_mutex_lock(&p->lock);
    gma__streams_wait_end(p);
    pthread_mutex_unlock(&p->lock);
  }
}

void gma__pool_hold(gma__pool_t *p, void *ptr, bool held) {
  gma__block_t *b = gma__pagemap_get(&p->pagemap, (uintptr_t)ptr);
  /* Not an arena: a graph pool's allocation may start where its chunk does. */
  if (b && b->addr == (uintptr_t)ptr && !gma__load_relaxed(&b->arena))
    gma__store_relaxed(&b->future_held, held);
}

/* PENDING -> back to the owner's cache for every block whose owner epoch and
 * gates have passed (FREE if the owner is retired). The block is safe for
 * every stream now: a poll's release moves it to the free pool with the
 * owner's other completed blocks (under reuse:none it stays the owner's).
 * Why not FREE at once: the slow path settles pending blocks before it
 * searches (find_or_grow), so that a training loop's next iteration finds
 * the same places; settled into the free pool, the place went to whichever
 * request searched first. With bins on, that was another stream's request
 * whose bin a poll had just drained: the owner then missed its place,
 * polled, drained every bin again, and the loop did that once per iteration
 * for good (bench_hotpath, section 4: 6.7% bin hits, 0.74-0.83x the
 * iterations per second of bins:off). In its owner's cache the owner finds
 * it first, and any stream still gets it from the next poll. */
void gma__pending_poll(gma__pool_t *p) {
  gma__block_t *b = p->pending_head;
  while (b) {
    gma__block_t *next = b->qnext;
    bool ready = b->stream->safe_epoch >= b->epoch;
    uint32_t n = gma__load_relaxed(&b->ngates);
    for (uint32_t i = 0; ready && i < n; i++) ready = gma__gate_passed(&b->gates[i]);
    if (ready || (p->test_flags & GMA__TEST_NO_EPOCH_GATING)) {
      pending_unlink(p, b);
      gma__store_relaxed(&b->ngates, 0);
      if (ready && !gma__load_relaxed(&b->stream->retired))
        gma__cache_block(p, b); /* its owner's again; polls release it to every stream */
      else
        gma__block_make_free(p, b); /* (a planted bug frees it unready, as before) */
    }
    b = next;
  }
}

/* Lock held: segment i is free; has it been unused at least idle_ns (0:
 * any time)? A segment's clock starts when a trim pass first sees it wholly
 * free, and stops whenever a block of it is handed out (take_block). */
static bool seg_unused(gma__segment_t *seg, uint64_t now_ns, uint64_t idle_ns) {
  if (!seg->free_since_ns) seg->free_since_ns = now_ns;
  return now_ns - seg->free_since_ns >= idle_ns;
}

gma_status_t gma__pool_release(gma__pool_t *p, const gma__release_t *r) {
  pthread_mutex_lock(&p->lock);
  gma__streams_poll(p, true);
  gma__stats_sample(p);
  /* Detach the chosen free segments under the lock; give them back after
   * unlocking, so a slow device free (cuMemFree synchronizes) never holds up
   * other callers. First those idle too long, then until at most keep bytes
   * of cache (reserved - allocated) stay, each time the one that gets there
   * with the least beyond it (gma__trim_prefer). */
  gma__trim_budget_t bud = {
      .keep = r->keep, .want = r->want, .cached = p->c.reserved.current - p->c.allocated.current};
  size_t n = 0, cap = 0, n_idle = 0;
  gma__span_t *out = NULL;
  for (int pass = 0; pass < 2; pass++) {
    for (;;) {
      if (pass == 1 && gma__trim_done(&bud)) break;
      size_t pick = SIZE_MAX;
      for (size_t i = 0; i < p->nsegs; i++) {
        gma__segment_t *seg = p->segs[i];
        if (!seg_is_free(seg)) {
          seg->free_since_ns = 0;
          continue;
        }
        bool ok = pass == 0 ? r->idle_ns && seg_unused(seg, r->now_ns, r->idle_ns)
                            : seg_unused(seg, r->now_ns, r->unused_ns) &&
                                  gma__trim_prefer(&bud, seg->size,
                                                   pick == SIZE_MAX ? 0 : p->segs[pick]->size);
        if (ok) {
          pick = i;
          if (pass == 0) break;
        }
      }
      if (pick == SIZE_MAX) break;
      if (n == cap) {
        cap = cap ? cap * 2 : 16;
        gma__span_t *a = realloc(out, cap * sizeof *a);
        if (!a) break;
        out = a;
      }
      seg_detach(p, pick, &out[n]);
      gma__trim_took(&bud, out[n].size, pass == 1);
      n++;
      n_idle += pass == 0;
    }
  }
  /* Growable segments: the chunks inside FREE blocks, by the same rules. */
  gma__span_t *spans = NULL;
  size_t nr = 0, nr_idle = 0;
  if (p->growable) nr = gma__segs_pick(p, r, &bud, &spans, &nr_idle);
  /* Out of reserved now, but the device still holds it until the calls
   * below return: growth counts it against the limit meanwhile, and an
   * allocation that finds no room waits for it (oom_wait). */
  uint64_t leaving = 0;
  for (size_t i = 0; i < n; i++) leaving += out[i].size;
  for (size_t i = 0; i < nr; i++) leaving += spans[i].size;
  p->leaving += leaving;
  GMA__VALIDATE(p);
  pthread_mutex_unlock(&p->lock);

  gma_status_t st = GMA_OK;
  uint64_t freed = 0, freed_idle = 0;
  for (size_t i = 0; i < nr; i++) {
    p->src->ops->give_back(p->src, &spans[i]);
    if (spans[i].done < spans[i].size) st = GMA_ERR_DEVICE; /* message kept */
    if (i < nr_idle) freed_idle += spans[i].done;
  }
  for (size_t i = 0; i < n; i++) {
    p->src->ops->give_back(p->src, &out[i]);
    if (out[i].done == out[i].size) {
      freed += out[i].size;
      if (i < n_idle) freed_idle += out[i].size;
    } else {
      st = GMA_ERR_DEVICE; /* keep the message; the segment goes back to the pool */
    }
  }
  pthread_mutex_lock(&p->lock);
  for (size_t i = 0; i < n; i++) {
    p->src->ops->settle(p->src, &out[i]);
    p->c.device_frees += out[i].calls;
    if (out[i].done < out[i].size) seg_adopt(p, out[i].kind, out[i].addr, out[i].size, 0, NULL);
  }
  p->c.bytes_trimmed += freed;
  for (size_t i = 0; i < nr; i++) {
    uint64_t done = spans[i].done;
    gma__segs_finish(p, &spans[i]); /* counts frees and bytes itself */
    freed += done;
  }
  free(spans);
  p->leaving -= leaving;
  if (leaving) pthread_cond_broadcast(&p->settled);
  if (r->timed) {
    p->c.trims_idle += freed_idle > 0;
    p->c.trims_timed += freed > freed_idle;
    p->c.trims_pressure += freed > 0 && r->pressured;
  } else {
    p->c.trims_explicit += freed > 0;
  }
  /* Explicit trims are replayed (they also settle streams), timed ones only
   * shown; Count carries an explicit trim's keep_bytes. */
  if (!r->timed || freed)
    GMA__TRACE(p, GMA__TR_TRIM, 0, freed, 0, 0, 0, r->timed ? 0 : r->keep,
               !r->timed ? GMA__TRIM_EXPLICIT : r->pressured ? GMA__TRIM_PRESSURE
                                                              : GMA__TRIM_TIMED);
  pthread_mutex_unlock(&p->lock);
  free(out);
  return st;
}

gma_status_t gma__pool_trim(gma__pool_t *p, uint64_t keep) {
  gma__release_t r = {.keep = keep};
  return gma__pool_release(p, &r);
}

gma_status_t gma__pool_grow_ahead(gma__pool_t *p, uint64_t want_free) {
  gma_status_t st = GMA_OK;
  pthread_mutex_lock(&p->lock);
  if (p->c.free < want_free) {
    gma__block_t *b;
    uint64_t size = p->segment_size[GMA__LARGE];
    if (want_free - p->c.free > size) size = round_up(want_free - p->c.free, SEGMENT_ROUND);
    st = p->growable ? gma__segs_grow(p, GMA__LARGE, want_free - p->c.free, 0)
                     : seg_create(p, GMA__LARGE, size, 0, &b);
    if (st == GMA_OK) p->c.grows_worker++;
  }
  GMA__VALIDATE(p);
  pthread_mutex_unlock(&p->lock);
  return st;
}

gma_status_t gma__pool_refuse_capture(gma__pool_t *p, gma_stream_t stream, const char *fn) {
  if (!p->dev->ops->stream_capture) return GMA_OK;
  bool capturing = false;
  uint64_t id = 0;
  gma_status_t st = p->dev->ops->stream_capture(p->dev, stream, &capturing, &id);
  if (st != GMA_OK || !capturing) return st;
  if (!id)
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "%s: stream %p is the legacy default stream while a blocking stream "
                          "captures a CUDA graph: its work would join that capture; use another "
                          "stream, or allocate before or after the capture",
                          fn, stream);
  return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                        "%s: stream %p is capturing a CUDA graph (capture id %" PRIu64
                        ") that gma was not told of: memory gma handed out here would be "
                        "reused while the graph still uses it; call gma_capture_begin(g, "
                        "stream, pool) before cuStreamBeginCapture (gma.torch does this for "
                        "torch.cuda.graph)",
                        fn, stream, id);
}

gma_status_t gma__pool_capture_mark(gma__pool_t *p, gma_stream_t stream, uint64_t stream_id,
                                    int delta, gma__stream_t **rec) {
  pthread_mutex_lock(&p->lock);
  gma__stream_t *s = gma__stream_resolve(p, stream, stream_id);
  gma_status_t st = GMA_OK;
  if (!s) {
    st = gma__set_error(GMA_ERR_OOM, "host memory for a stream record");
  } else if (delta > 0) {
    /* Before the capture: its frees so far get an event outside it (a
     * stream already capturing is skipped by close_epoch itself). */
    if (!s->captures) gma__stream_close_epoch(p, s);
    s->captures++;
  } else if (delta < 0 && s->captures) {
    s->captures--;
  }
  if (rec) *rec = s;
  GMA__VALIDATE(p);
  pthread_mutex_unlock(&p->lock);
  return st;
}

gma_status_t gma__pool_stream_retire(gma__pool_t *p, gma_stream_t stream) {
  gma_status_t st = GMA_OK;
  pthread_mutex_lock(&p->lock);
  gma__stream_t *s = gma__stream_find(p, stream);
  if (s) st = gma__stream_retire(p, s, false);
  GMA__VALIDATE(p);
  pthread_mutex_unlock(&p->lock);
  return st;
}

void gma__pool_device_error(gma__pool_t *p, const char *said) {
  p->c.device_errors++;
  snprintf(p->last_device_error, sizeof p->last_device_error, "%s",
           said ? said : gma__error_detail(gma_last_error()));
}

void gma__pool_oom_count(gma__pool_t *p, size_t requested, gma_stream_t stream) {
  pthread_mutex_lock(&p->lock);
  count_oom(p, requested, stream, round_up(requested, GMA__ROUND));
  pthread_mutex_unlock(&p->lock);
}

gma_status_t gma__pool_oom_report(gma__pool_t *p, uint64_t bytes, gma_stream_t stream) {
  pthread_mutex_lock(&p->lock);
  gma_status_t st =
      oom_error(p, round_up(bytes, GMA__ROUND), (size_t)bytes, stream, GMA__ALLOC_FUTURE, NULL);
  pthread_mutex_unlock(&p->lock);
  return st;
}

gma_status_t gma__pool_stream_synchronize(gma__pool_t *p, gma_stream_t stream) {
  uint64_t id;
  gma_status_t st = p->dev->ops->stream_id(p->dev, stream, &id);
  if (st != GMA_OK) return st;
  pthread_mutex_lock(&p->lock);
  gma__stream_t *s = gma__stream_find(p, stream);
  if (s && s->id != id) s = NULL; /* a recycled handle: the record names a stream that is gone */
  uint64_t closed = s ? gma__stream_sync_begin(p, s) : 0;
  pthread_mutex_unlock(&p->lock);
  /* Outside the lock: the wait may be long, and nobody else waits for it. */
  st = p->dev->ops->stream_synchronize(p->dev, stream);
  if (s) { /* records are never freed, so s is still readable */
    pthread_mutex_lock(&p->lock);
    if (st == GMA_OK)
      gma__stream_sync_end(p, s, closed);
    else /* the closed epoch has no event: the next poll must record one */
      gma__store_relaxed(&s->dirty, true);
    GMA__VALIDATE(p);
    pthread_mutex_unlock(&p->lock);
  }
  return st;
}

gma_status_t gma__pool_fini(gma__pool_t *p) {
  if (p->listed) gma__pools_remove(p); /* first: an exiting thread's hook may be inside */
  uint64_t leaked_bytes = 0, leaked = 0;
  uint64_t tag_bytes[GMA__MAX_TAGS] = {0}, tag_count[GMA__MAX_TAGS] = {0};
  for (size_t i = 0; i < p->nsegs; i++) {
    gma__segment_t *seg = p->segs[i];
    for (gma__block_t *b = seg->first; b; b = b->next) {
      if (state_of(b) == GMA__LIVE && !gma__load_relaxed(&b->future_held)) {
        leaked++;
        leaked_bytes += b->size;
        tag_bytes[gma__load_relaxed(&b->tag)] += b->size;
        tag_count[gma__load_relaxed(&b->tag)]++;
      }
    }
    p->src->ops->drop(p->src, seg->range, seg->base, seg->size);
    free(seg);
  }
  free(p->segs);
  free(p->tails);
  free(p->tail_blocks);
  p->src->ops->fini(p->src);
  p->src = NULL;
  for (size_t i = 0; i < p->nchunks; i++) {
    gma__block_t *chunk = p->block_chunks[i];
    for (int j = 0; j < BLOCK_CHUNK; j++) free(chunk[j].gates);
    free(chunk);
  }
  free(p->block_chunks);
  gma__stream_t **tail = &p->stream_list; /* the graveyard is freed with the rest */
  while (*tail) tail = &(*tail)->next_all;
  *tail = p->graveyard;
  p->graveyard = NULL;
  gma__stream_cache_fini(p);
  gma__streams_fini(p);
  gma__pagemap_free(&p->pagemap);
  pthread_mutex_destroy(&p->count_lock);
  pthread_mutex_destroy(&p->lock);
  pthread_mutex_destroy(&p->trace_mu);
  /* In a fork() child a parent thread may have been waiting on it: then
   * destroying it could wait forever (fork.c); its memory goes anyway. */
  if (!p->inherited) pthread_cond_destroy(&p->settled);
  if (leaked == 0) return GMA_OK;
  /* The status's message, by tag (gma_destroy printed the full report). */
  char by_tag[512] = "";
  size_t at = 0;
  for (unsigned t = 0; t < GMA__MAX_TAGS && at < sizeof by_tag; t++)
    if (tag_count[t]) {
      int n = snprintf(by_tag + at, sizeof by_tag - at, "%s%s: %" PRIu64 " (%" PRIu64 " bytes)",
                       at ? ", " : "", gma__tag_name(p, t), tag_count[t], tag_bytes[t]);
      if (n > 0) at += (size_t)n;
    }
  return gma__set_error(GMA_ERR_LEAK,
                        "gma_destroy: %" PRIu64 " live allocations (%" PRIu64
                        " bytes) were never freed (by tag: %s); gma freed them",
                        leaked, leaked_bytes, by_tag);
}

/* ---- Validation --------------------------------------------------------------*/

static uint64_t tree_check(const gma__block_t *n, int state, uint64_t *bytes) {
  if (!n) return 0;
  if (gma__load_relaxed(&((gma__block_t *)n)->state) != state) return UINT64_MAX / 4;
  if (n->left && !key_less(n->left, n)) return UINT64_MAX / 4;
  if (n->right && !key_less(n, n->right)) return UINT64_MAX / 4;
  *bytes += n->size;
  return 1 + tree_check(n->left, state, bytes) + tree_check(n->right, state, bytes);
}

#define VALID_OR(cond, ...)                                             \
  do {                                                                  \
    if (!(cond)) {                                                      \
      gma__set_error(GMA_ERR_INTERNAL, "pool invariant: " __VA_ARGS__); \
      return false;                                                     \
    }                                                                   \
  } while (0)

/* Lock held. LIVE and BINNED blocks change into each other without the lock,
 * so they are checked together: the pool side is exact even while other
 * threads hit their bins. */
bool gma__pool_is_valid(gma__pool_t *p) {
  uint64_t by_state[5] = {0}, count[5] = {0}, reserved = 0;
  for (size_t i = 0; i < p->nsegs; i++) {
    gma__segment_t *seg = p->segs[i];
    VALID_OR(i == 0 || p->segs[i - 1]->base + p->segs[i - 1]->size <= seg->base,
             "segments overlap or are unsorted at %zu", i);
    uintptr_t at = seg->base;
    VALID_OR(seg->first && !seg->first->prev, "segment %zu has no first block", i);
    VALID_OR(seg->last && !seg->last->next && seg->last->seg == seg,
             "segment %zu has no last block", i);
    for (gma__block_t *b = seg->first; b; b = b->next) {
      uint8_t st = state_of(b);
      VALID_OR(b->seg == seg && b->addr == at, "block at %p does not tile its segment",
               (void *)b->addr);
      VALID_OR(b->size > 0 && b->size % GMA__ROUND == 0 && b->addr % 512 == 0,
               "block %p has size %" PRIu64, (void *)b->addr, b->size);
      VALID_OR(!b->next || b->next->prev == b, "broken neighbour links at %p", (void *)b->addr);
      VALID_OR(!(st == GMA__FREE && b->next && state_of(b->next) == GMA__FREE),
               "uncoalesced free neighbours at %p", (void *)b->addr);
      VALID_OR(st <= GMA__BINNED, "bad state %d", st);
      VALID_OR(gma__pagemap_get(&p->pagemap, b->addr) == b, "block %p missing from the page map",
               (void *)b->addr);
      by_state[st] += b->size;
      count[st]++;
      at += b->size;
    }
    VALID_OR(at == seg->base + seg->size, "blocks of segment %zu do not cover it", i);
    reserved += seg->size;
  }
  const gma__counters_t *c = &p->c;
  VALID_OR(reserved == c->reserved.current, "reserved %" PRIu64 " != segments %" PRIu64,
           c->reserved.current, reserved);
  VALID_OR(by_state[GMA__FREE] == c->free && by_state[GMA__CACHED] == c->stream_cached &&
               by_state[GMA__PENDING] == c->pending,
           "byte counters disagree with blocks");
  VALID_OR(reserved == by_state[GMA__LIVE] + by_state[GMA__BINNED] + c->stream_cached +
                           c->pending + c->free,
           "reserved != live + binned + stream_cached + pending + free");
  uint64_t free_bytes = 0, free_count = 0;
  for (int k = 0; k < GMA__NKINDS; k++)
    free_count += tree_check(p->free_tree[k], GMA__FREE, &free_bytes);
  VALID_OR(free_count == count[GMA__FREE] && free_bytes == c->free, "free trees disagree");
  uint64_t cached_count = 0;
  for (gma__stream_t *s = p->stream_list; s; s = s->next_all) {
    uint64_t bytes = 0, n = 0, fifo = 0, last_epoch = 0;
    for (int k = 0; k < GMA__NKINDS; k++) n += tree_check(s->cached_tree[k], GMA__CACHED, &bytes);
    for (gma__block_t *b = s->fifo_head; b; b = b->qnext, fifo++) {
      VALID_OR(b->stream == s && b->epoch >= last_epoch, "stream FIFO out of order");
      last_epoch = b->epoch;
    }
    VALID_OR(n == fifo && bytes == s->cached_bytes, "stream cache tree and FIFO disagree");
    VALID_OR(s->safe_epoch < gma__load_relaxed(&s->epoch) || gma__load_relaxed(&s->retired),
             "safe epoch ahead of open epoch");
    cached_count += n;
  }
  VALID_OR(cached_count == count[GMA__CACHED], "cached blocks outside stream caches");
  uint64_t pending = 0;
  for (gma__block_t *b = p->pending_head; b; b = b->qnext) pending += state_of(b) == GMA__PENDING;
  VALID_OR(pending == count[GMA__PENDING], "pending list disagrees");
  return gma__segs_is_valid(p);
}

/* Largest idle block in the stream trees and free trees (bins not included:
 * their blocks have class sizes and are reused as they are); lock held. */
uint64_t gma__pool_largest_idle(const gma__pool_t *p) {
  uint64_t best = 0;
  for (int k = 0; k < GMA__NKINDS; k++) {
    uint64_t m = treap_max_size(p->free_tree[k]);
    if (m > best) best = m;
    for (const gma__stream_t *s = p->stream_list; s; s = s->next_all) {
      m = treap_max_size(s->cached_tree[k]);
      if (m > best) best = m;
    }
  }
  return best;
}
