/* Owns the slow-path free under the pool lock: finding the live block, caching or
 * pending it, record_stream's gates, and the pending poll. Every function here
 * runs under gma__pool_t.lock (core/types.h) unless it says otherwise. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/round.h"
#include "base/lock.h"
#include "base/sizeclass.h"
#include "core/internal.h"

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
  if (gma__state_of(b) == GMA__LIVE && !within_requested(b, addr) && addr != b->addr)
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "%s(%p): the pointer lies past the end of the live allocation at %p "
                          "(%" PRIu64 " bytes asked for; the %" PRIu64 " bytes after them are "
                          "gma's rounding, not part of it)",
                          op, (void *)addr, (void *)b->addr, req, b->size - req);
  if (gma__state_of(b) == GMA__LIVE && b->addr != addr)
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
  bool after_live = prev && gma__state_of(prev) == GMA__LIVE && prev->addr + prev->size == addr;
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
  return b && b->addr == addr && gma__state_of(b) == GMA__LIVE ? b : NULL;
}

static bool free_taken(gma__pool_t *p, gma__block_t *b);

gma_status_t gma__pool_free_slow(gma__pool_t *p, void *ptr, bool *pended) {
  *pended = false;
  uintptr_t addr = (uintptr_t)ptr;
  gma__lock(&p->lock, GMA__RANK_POOL);
  gma__block_t *b = live_block(p, addr);
  uint8_t live = GMA__LIVE;
  /* The CAS settles a race with a lock-free free of the same pointer. */
  if (b && gma__load_relaxed(&b->future_held)) {
    /* Memory an async request got and nobody collected: the caller cannot
     * have been handed this pointer, so it is stale (freed before and since
     * given to the request). Freeing it would free the request's memory. */
    gma__unlock(&p->lock);
    return gma__set_error(GMA_ERR_INVALID_POINTER,
                          "gma_free(%p): this memory belongs to an async request whose future "
                          "was not collected (gma_future_wait) or released; a stale pointer?",
                          ptr);
  }
  if (!b || !gma__cas_acq_rel(&b->state, &live, GMA__PENDING)) {
    gma_status_t st = bad_pointer(p, addr, "gma_free");
    gma__unlock(&p->lock);
    return st;
  }
  *pended = free_taken(p, b);
  GMA__VALIDATE(p);
  gma__unlock(&p->lock);
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
    /* Other streams used it: it waits for their open epochs. Each user's
     * epoch is closed now, so that its event follows the work queued there
     * up to this free and no later work: a stream that takes the block back
     * behind a wait on it (the owner reclaim, consumer reuse) waits for that
     * much only. With every event slot busy the newest event is recorded
     * again: the epochs it closed before are then covered up to this free
     * too. Where it cannot be closed now (another thread's per-thread
     * stream, a capture), a later close covers more, which is safe. */
    for (uint32_t i = 0; i < ngates; i++) {
      gma__stream_t *u = b->gates[i].stream;
      bool u_retired = gma__load_relaxed(&u->retired);
      b->gates[i].epoch = u_retired ? u->free_epoch : gma__load_relaxed(&u->epoch);
      if (!u_retired) {
        gma__store_relaxed(&u->dirty, true);
        gma__stream_close_epoch(p, u);
      }
    }
    gma__pending_link(p, b);
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
  gma__lock(&p->lock, GMA__RANK_POOL);
  gma__block_t *b = live_block(p, (uintptr_t)ptr);
  if (!b) { /* an interior pointer: inside the bytes asked for, not gma's rounding */
    b = block_containing(p, (uintptr_t)ptr);
    if (b && (gma__state_of(b) != GMA__LIVE || !within_requested(b, (uintptr_t)ptr))) b = NULL;
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
  gma__unlock(&p->lock);
  return st;
}

gma_status_t gma__pool_free_after(gma__pool_t *p, void *ptr, gma__stream_t *const *streams,
                                  size_t n) {
  gma__lock(&p->lock, GMA__RANK_POOL);
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
  gma__unlock(&p->lock);
  return st;
}

void gma__pool_settle(gma__pool_t *p, uint64_t deadline_ns) {
  gma__event_t evs[GMA__OOM_WAIT_EVENTS];
  for (;;) {
    gma__lock(&p->lock, GMA__RANK_POOL);
    gma__streams_poll(p, true);
    size_t n = gma__now_ns() < deadline_ns ? gma__streams_wait_begin(p, evs, GMA__OOM_WAIT_EVENTS)
                                           : 0;
    gma__unlock(&p->lock);
    if (!n) return;
    gma__streams_wait_any(p, evs, n, deadline_ns);
    gma__lock(&p->lock, GMA__RANK_POOL);
    gma__streams_wait_end(p);
    gma__unlock(&p->lock);
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
 * A block of `asking` (the stream whose slow path polls, or NULL) needs
 * only its gates: in its owner's cache it keeps its epoch, so the owner
 * reuses it in stream order, and other streams only once that epoch
 * completed. Another stream's block whose owner is still busy stays
 * pending, where a stream that consumed it may take it behind a wait
 * (pending_wait_fit).
 * Why not FREE at once: the slow path settles pending blocks before it
 * searches (gma__find_or_grow), so that a training loop's next iteration finds
 * the same places; settled into the free pool, the place went to whichever
 * request searched first. With bins on, that was another stream's request
 * whose bin a poll had just drained: the owner then missed its place,
 * polled, drained every bin again, and the loop did that once per iteration
 * for good (bench_hotpath, section 4: 6.7% bin hits, 0.74-0.83x the
 * iterations per second of bins:off). In its owner's cache the owner finds
 * it first, and any stream still gets it from the next poll. */
void gma__pending_poll(gma__pool_t *p, const gma__stream_t *asking) {
  bool planted = p->test_flags & GMA__TEST_NO_EPOCH_GATING;
  for (gma__block_t *b = p->pending_head, *next; b; b = next) {
    next = b->qnext;
    bool retired = gma__load_relaxed(&b->stream->retired);
    bool ready = (b->stream == asking && !retired) || b->stream->safe_epoch >= b->epoch;
    uint32_t n = gma__load_relaxed(&b->ngates);
    for (uint32_t i = 0; ready && i < n; i++) ready = gma__gate_passed(&b->gates[i]);
    if (!ready && !planted) continue;
    gma__pending_unlink(p, b);
    gma__store_relaxed(&b->ngates, 0);
    if (ready && !retired)
      gma__cache_block(p, b); /* its owner's again; polls release it to every stream */
    else
      gma__block_make_free(p, b); /* (a planted bug frees it unready, as before) */
  }
}
