/* Owns the structural and accounting check (gma__pool_is_valid). Every function
 * here runs under gma__pool_t.lock (core/types.h) unless it says otherwise. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/round.h"
#include "base/sizeclass.h"
#include "core/internal.h"

/* ---- Validation --------------------------------------------------------------*/

static uint64_t tree_check(const gma__block_t *n, int state, uint64_t *bytes) {
  if (!n) return 0;
  if (gma__load_relaxed(&((gma__block_t *)n)->state) != state) return UINT64_MAX / 4;
  if (n->left && !gma__key_less(n->left, n)) return UINT64_MAX / 4;
  if (n->right && !gma__key_less(n, n->right)) return UINT64_MAX / 4;
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
      uint8_t st = gma__state_of(b);
      VALID_OR(b->seg == seg && b->addr == at, "block at %p does not tile its segment",
               (void *)b->addr);
      VALID_OR(b->size > 0 && b->size % GMA__ROUND == 0 && b->addr % 512 == 0,
               "block %p has size %" PRIu64, (void *)b->addr, b->size);
      VALID_OR(!b->next || b->next->prev == b, "broken neighbour links at %p", (void *)b->addr);
      VALID_OR(!(st == GMA__FREE && b->next && gma__state_of(b->next) == GMA__FREE),
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
  for (gma__block_t *b = p->pending_head; b; b = b->qnext) pending += gma__state_of(b) == GMA__PENDING;
  VALID_OR(pending == count[GMA__PENDING], "pending list disagrees");
  return gma__segs_is_valid(p);
}
