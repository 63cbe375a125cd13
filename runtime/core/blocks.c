/* Owns block records and the pool's trees and lists: the size treaps of FREE and
 * CACHED blocks, the stream FIFOs, the pending list, coalescing with address
 * neighbours, and the sorted segment table. Every function here runs under
 * gma__pool_t.lock (core/types.h) unless it says otherwise. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/round.h"
#include "base/sizeclass.h"
#include "core/internal.h"

static gma__block_t *treap_insert(gma__block_t *root, gma__block_t *b) {
  if (!root) {
    b->left = b->right = NULL;
    return b;
  }
  if (gma__key_less(b, root)) {
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
  if (gma__key_less(b, root))
    root->left = treap_remove(root->left, b);
  else
    root->right = treap_remove(root->right, b);
  return root;
}

gma__block_t *gma__treap_best_fit(gma__block_t *n, uint64_t size) {
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

uint64_t gma__treap_max_size(const gma__block_t *n) {
  if (!n) return 0;
  while (n->right) n = n->right;
  return n->size;
}

gma__block_t *gma__block_new(gma__pool_t *p) {
  if (!p->spare_blocks) {
    if (p->nchunks == p->chunks_cap) {
      size_t cap = p->chunks_cap ? p->chunks_cap * 2 : 16;
      void **a = realloc(p->block_chunks, cap * sizeof *a);
      if (!a) return NULL;
      p->block_chunks = a;
      p->chunks_cap = cap;
    }
    gma__block_t *chunk = aligned_alloc(64, GMA__BLOCK_CHUNK * sizeof *chunk);
    if (!chunk) return NULL;
    memset(chunk, 0, GMA__BLOCK_CHUNK * sizeof *chunk);
    p->block_chunks[p->nchunks++] = chunk;
    for (int i = GMA__BLOCK_CHUNK - 1; i >= 0; i--) {
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
void gma__cached_link(gma__pool_t *p, gma__block_t *b, gma__block_t *after) {
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

void gma__pending_link(gma__pool_t *p, gma__block_t *b) {
  gma__store_relaxed(&b->state, GMA__PENDING);
  b->qprev = NULL;
  b->qnext = p->pending_head;
  if (p->pending_head) p->pending_head->qprev = b;
  p->pending_head = b;
  p->c.pending += b->size;
}

void gma__pending_unlink(gma__pool_t *p, gma__block_t *b) {
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
gma__block_t *gma__absorb_free_neighbours(gma__pool_t *p, gma__block_t *b) {
  if (b->prev && gma__state_of(b->prev) == GMA__FREE) {
    gma__block_t *prev = b->prev;
    gma__free_unlink(p, prev);
    absorb_next(p, prev);
    b = prev;
  }
  if (b->next && gma__state_of(b->next) == GMA__FREE) {
    gma__free_unlink(p, b->next);
    absorb_next(p, b);
  }
  return b;
}

/* Makes an unlinked block FREE, coalescing with FREE neighbours. */
void gma__block_make_free(gma__pool_t *p, gma__block_t *b) {
  b = gma__absorb_free_neighbours(p, b);
  /* Memory freed just now is not idle: the merged block's idle clock starts
   * again, or a timed trim would give back memory freed a moment before
   * because an idle neighbour's clock was older. */
  b->free_since_ns = 0;
  gma__free_link(p, b);
}

/* Caches an unlinked block on its stream (b->stream, b->epoch set), merging
 * with neighbours cached on the same stream. The merged block takes the
 * newest epoch of its parts, so it is released only when all are safe. */
gma__block_t *gma__cache_block(gma__pool_t *p, gma__block_t *b) {
  gma__stream_t *s = b->stream;
  if (b->prev && gma__state_of(b->prev) == GMA__CACHED && b->prev->stream == s) {
    gma__block_t *prev = b->prev;
    gma__cached_unlink(p, prev);
    if (b->epoch > prev->epoch) prev->epoch = b->epoch;
    absorb_next(p, prev); /* recycles b */
    b = prev;
  }
  if (b->next && gma__state_of(b->next) == GMA__CACHED && b->next->stream == s) {
    gma__block_t *next = b->next;
    gma__cached_unlink(p, next);
    if (next->epoch > b->epoch) b->epoch = next->epoch;
    absorb_next(p, b);
  }
  gma__cached_link(p, b, NULL);
  return b;
}

/* ---- Segments ----------------------------------------------------------------*/

size_t gma__seg_index_at_or_before(const gma__pool_t *p, uintptr_t addr) {
  size_t lo = 0, hi = p->nsegs; /* first segment with base > addr */
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (p->segs[mid]->base <= addr) lo = mid + 1; else hi = mid;
  }
  return lo; /* segs[lo-1] is the candidate; lo == 0 means none */
}

gma__segment_t *gma__seg_find(const gma__pool_t *p, uintptr_t addr) {
  size_t i = gma__seg_index_at_or_before(p, addr);
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
  size_t i = gma__seg_index_at_or_before(p, seg->base);
  memmove(&p->segs[i + 1], &p->segs[i], (p->nsegs - i) * sizeof *p->segs);
  p->segs[i] = seg;
  p->nsegs++;
  return GMA_OK;
}

void gma__segs_remove(gma__pool_t *p, gma__segment_t *seg) {
  size_t i = gma__seg_index_at_or_before(p, seg->base) - 1;
  GMA__ASSERT(p->segs[i] == seg);
  memmove(&p->segs[i], &p->segs[i + 1], (p->nsegs - i - 1) * sizeof *p->segs);
  p->nsegs--;
}
