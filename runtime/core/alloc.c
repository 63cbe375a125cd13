/* Owns the slow-path allocation under the pool lock: taking a block (split,
 * counters, trace), single requests and all-or-nothing batches. Every function
 * here runs under gma__pool_t.lock (core/types.h) unless it says otherwise. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/round.h"
#include "base/lock.h"
#include "base/sizeclass.h"
#include "core/internal.h"

/* Takes b (FREE, or CACHED on s) for a LIVE allocation of size bytes on s,
 * splitting off the rest, which stays in b's state and FIFO place. */
static void take_block(gma__pool_t *p, gma__block_t *b, uint64_t size, size_t requested,
                       gma__stream_t *s) {
  gma__block_t *rest = b->size - size >= GMA__MIN_SPLIT ? gma__block_new(p) : NULL;
  if (rest && !gma__pagemap_set(&p->pagemap, b->addr + size, rest)) {
    gma__block_recycle(p, rest);
    rest = NULL; /* no host memory for the map: hand out the whole block */
  }
  bool cached = gma__state_of(b) == GMA__CACHED;
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
      gma__cached_link(p, rest, b); /* right after b, while b is still linked */
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

gma_status_t gma__pool_alloc_slow(gma__pool_t *p, size_t requested, gma_stream_t stream,
                                  uint64_t stream_id, unsigned flags, void **out) {
  if (p->clock_in_slow_path) gma__pool_tick_clock(p);
  bool capture = flags & GMA__ALLOC_CAPTURE;
  if (!capture) {
    gma_status_t refused = gma__pool_refuse_capture(p, stream, "gma_alloc");
    if (refused != GMA_OK) return refused;
  }
  bool asked = !capture && p->dev->ops->stream_capture;
  /* Requests the bins serve get their class's size, so the block can go
   * into a bin when freed; an arena is served at its own size. */
  uint64_t size = requested <= p->bin_max && !(flags & GMA__ALLOC_ARENA)
                      ? gma__class_size(gma__class_of(requested))
                      : gma__round_up(requested, GMA__ROUND);
  int kind = size <= p->small_size ? GMA__SMALL : GMA__LARGE;
  bool inline_try = flags & GMA__ALLOC_INLINE;
  gma_status_t st;
  if (!inline_try) gma__lock(&p->lock, GMA__RANK_POOL);
  else if (!gma__trylock(&p->lock, GMA__RANK_POOL)) return GMA_ERR_BUSY; /* the worker serves it */
  unsigned kept = gma__error_keep(); /* a failure inside a call that succeeds is not said */
  gma__stream_t *s = gma__stream_resolve(p, stream, stream_id);
  if (asked) p->uncaptured = s; /* not capturing when asked above */
  gma__block_t *b = NULL;
  uint64_t *level = NULL;
  gma__oom_waiting_t w = {.device_errors = p->c.device_errors};
  if (!s) {
    st = gma__set_error(GMA_ERR_OOM, "host memory for a stream record");
  } else {
    st = gma__find_or_grow(p, s, kind, size, &b, &level, !inline_try, capture);
    while (st == GMA_ERR_OOM && (flags & GMA__ALLOC_WAIT) && gma__oom_wait(p, &w, size))
      st = gma__find_or_grow(p, s, kind, size, &b, &level, true, capture);
    if (st == GMA_ERR_OOM && !inline_try)
      st = gma__oom_error(p, size, requested, stream, flags, &w);
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
  if (!(p->test_flags & GMA__TEST_KEEP_UNCAPTURED)) p->uncaptured = NULL;
  GMA__VALIDATE(p);
  gma__unlock(&p->lock);
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
  bool cached = gma__state_of(b) == GMA__CACHED;
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

/* Lock held: a batch's blocks as one block of total bytes cut front to back
 * (each take splits off the rest right after it, in the same container:
 * the free pool, or one stream's cache). *got: the blocks taken, SIZE_MAX
 * when nothing of total size was found (GMA_ERR_OOM: try the next plan).
 * A rest in any other state means the split could not happen (no host
 * memory for a record): GMA_ERR_OOM with *got < n, which the caller rolls
 * back. */
static gma_status_t take_contiguous(gma__pool_t *p, gma__stream_t *s, int kind, uint64_t total,
                                    size_t n, const size_t *sizes, gma__taken_t *taken,
                                    size_t *got, bool grow_ok) {
  gma__block_t *b = NULL;
  uint64_t *level = NULL;
  gma_status_t st = gma__find_or_grow(p, s, kind, total, &b, &level, grow_ok, false);
  if (st == GMA_ERR_OOM) *got = SIZE_MAX;
  if (st != GMA_OK) return st;
  uint8_t from = gma__state_of(b);
  gma__stream_t *owner = b->stream;
  for (; *got < n; (*got)++) {
    uint64_t size = gma__round_up(sizes[*got], GMA__ROUND);
    if (!b || gma__state_of(b) != from || b->stream != owner || b->size < size) break;
    taken[*got] = taken_from(b);
    take_block(p, b, size, sizes[*got], s);
    b = b->next;
  }
  if (*got < n) return gma__set_error(GMA_ERR_OOM, "host memory for block records");
  (*level) += n;
  return GMA_OK;
}

/* Lock held: a batch's blocks one by one, from *got on; each level counted
 * once all are taken. */
static gma_status_t take_each(gma__pool_t *p, gma__stream_t *s, size_t n, const size_t *sizes,
                              gma__taken_t *taken, uint64_t **levels, size_t *got, bool grow_ok) {
  gma_status_t st = GMA_OK;
  gma__block_t *b = NULL;
  for (; *got < n; (*got)++) {
    uint64_t size = gma__round_up(sizes[*got], GMA__ROUND);
    int k = size <= p->small_size ? GMA__SMALL : GMA__LARGE;
    if ((st = gma__find_or_grow(p, s, k, size, &b, &levels[*got], grow_ok, false)) != GMA_OK)
      return st;
    taken[*got] = taken_from(b);
    take_block(p, b, size, sizes[*got], s);
  }
  for (size_t i = 0; i < n; i++) (*levels[i])++;
  return GMA_OK;
}

/* Lock held: gma__pool_alloc_batch's plans, all or nothing (see there). */
static gma_status_t batch_locked(gma__pool_t *p, gma__stream_t *s, size_t n, const size_t *sizes,
                                 gma_stream_t stream, unsigned flags, gma__taken_t *taken,
                                 uint64_t **levels, void **ptrs) {
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) total += gma__round_up(sizes[i], GMA__ROUND);
  int kind = total <= p->small_size ? GMA__SMALL : GMA__LARGE;
  bool inline_try = flags & GMA__ALLOC_INLINE;
  gma_status_t st = GMA_OK;
  size_t got = 0;
  /* Where the memory comes from, cheapest first: one contiguous block of the
   * memory already held; the blocks one by one in memory already held; one
   * contiguous block of a new segment; one by one, growing as needed. A
   * batch never takes a new segment while the memory it needs is already
   * free in pieces: a training step's gradient batch would otherwise leave
   * a segment behind each step, split up by other requests in between. */
  bool split = false;
  p->keep_lock = true; /* taken blocks may go back where they came from */
  gma__oom_waiting_t w = {.device_errors = p->c.device_errors};
  bool host_short = false;
again:
  for (int plan = 0; plan < (inline_try ? 2 : 4) && got < n; plan++) { /* inline: held memory */
    bool grow_ok = plan >= 2;
    if (plan % 2 == 0) {
      st = take_contiguous(p, s, kind, total, n, sizes, taken, &got, grow_ok);
      if (st == GMA_ERR_OOM && got == SIZE_MAX) { /* no room that way: the next plan */
        got = 0;
        continue;
      }
      if (st != GMA_OK) {
        host_short = got < n && st == GMA_ERR_OOM;
        break;
      }
    } else {
      st = take_each(p, s, n, sizes, taken, levels, &got, grow_ok);
      split = got == n;
      if (got < n && st == GMA_ERR_OOM && plan == 1) { /* not enough held: undo, grow */
        for (size_t i = got; i-- > 0;) untake_block(p, &taken[i]);
        got = 0;
      }
    }
  }
  if (got < n) {
    /* All or nothing: nothing of a failed batch stays allocated. */
    for (size_t i = got; i-- > 0;) untake_block(p, &taken[i]);
    p->keep_lock = false; /* nothing taken: the wait drops the lock anyway */
    /* Host memory ran out (no record for a split): no device work can help. */
    host_short = host_short || st == GMA_OK;
    if (st == GMA_ERR_OOM && !host_short && (flags & GMA__ALLOC_WAIT) && gma__oom_wait(p, &w, total)) {
      got = 0;
      st = GMA_OK;
      p->keep_lock = true;
      goto again; /* device work finished and freed memory: every plan again */
    }
    if (host_short) st = gma__set_error(GMA_ERR_OOM, "gma_alloc_batch: no host memory for block records");
    else if (st == GMA_ERR_OOM && !inline_try) /* inline: no message, the worker goes on */
      st = gma__oom_error(p, total, (size_t)total, stream, flags, &w);
    return st;
  }
  for (size_t i = 0; i < n; i++) ptrs[i] = (void *)taken[i].b->addr;
  p->c.batches++;
  p->c.batches_split += split;
  gma__stats_sample(p);
  return st;
}

gma_status_t gma__pool_alloc_batch(gma__pool_t *p, size_t n, const size_t *sizes,
                                   gma_stream_t stream, uint64_t stream_id, unsigned flags,
                                   void **ptrs) {
  gma_status_t refused = gma__pool_refuse_capture(p, stream, "gma_alloc_batch");
  if (refused != GMA_OK) return refused;
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
    gma__lock(&p->lock, GMA__RANK_POOL);
  } else if (!gma__trylock(&p->lock, GMA__RANK_POOL)) { /* the worker serves it */
    free(taken);
    free(levels);
    return GMA_ERR_BUSY;
  }
  unsigned kept = gma__error_keep(); /* a failure inside a call that succeeds is not said */
  gma__stream_t *s = gma__stream_resolve(p, stream, stream_id);
  if (!s) {
    st = gma__set_error(GMA_ERR_OOM, "host memory for a stream record");
    goto out;
  }
  if (p->dev->ops->stream_capture) p->uncaptured = s; /* not capturing when asked above */
  st = batch_locked(p, s, n, sizes, stream, flags, taken, levels, ptrs);
out:
  p->uncaptured = NULL;
  p->keep_lock = false;
  GMA__VALIDATE(p);
  gma__unlock(&p->lock);
  free(taken);
  free(levels);
  gma__error_done(kept, st);
  return st;
}
