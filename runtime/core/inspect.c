/* Owns the pool's locked steps that the layers above ask for: the
 * observers' walks of segments and blocks, one pointer's live block, the
 * worker's reads and notes (reserved bytes, pressure level, wake-ups,
 * pending memory), publishing and withdrawing a trace, and whether the
 * pool's locks were free at fork(). The pool lock is taken only in core/;
 * these are the ways in for everything else. */
#include "core/internal.h"
#include "base/lock.h"

void gma__pool_with_lock(gma__pool_t *p, void (*fn)(void *arg), void *arg) {
  gma__lock(&p->lock, GMA__RANK_POOL);
  fn(arg);
  gma__unlock(&p->lock);
}

bool gma__pool_owns(gma__pool_t *p, const void *ptr) {
  gma__lock(&p->lock, GMA__RANK_POOL);
  bool owns = gma__seg_find(p, (uintptr_t)ptr) != NULL;
  gma__unlock(&p->lock);
  return owns;
}

bool gma__pool_live_info(gma__pool_t *p, const void *ptr, gma_pointer_info_t *r) {
  uintptr_t a = (uintptr_t)ptr;
  bool found = false;
  gma__lock(&p->lock, GMA__RANK_POOL);
  gma__segment_t *seg = gma__seg_find(p, a);
  gma__block_t *b = seg ? seg->first : NULL;
  while (b && a >= b->addr + b->size) b = b->next; /* one segment's blocks */
  if (b && gma__load_relaxed(&b->state) == GMA__LIVE) {
    r->kind = GMA_MEMORY_DEVICE;
    r->base = (void *)b->addr;
    r->requested = gma__load_relaxed(&b->requested);
    r->block_size = b->size;
    r->stream = b->stream ? b->stream->handle : NULL;
    r->tag = gma__tag_name(p, gma__load_relaxed(&b->tag));
    found = true;
  }
  gma__unlock(&p->lock);
  return found;
}

bool gma__pool_block_facts(gma__pool_t *p, const void *ptr, uint64_t *size,
                           uint64_t *requested, gma_stream_t *stream) {
  bool found = false;
  gma__lock(&p->lock, GMA__RANK_POOL);
  gma__block_t *b = gma__pagemap_get(&p->pagemap, (uintptr_t)ptr);
  if (b && b->addr == (uintptr_t)ptr && gma__load_relaxed(&b->state) == GMA__LIVE &&
      !gma__load_relaxed(&b->arena)) {
    *size = b->size;
    *requested = gma__load_relaxed(&b->requested);
    *stream = b->stream ? b->stream->handle : NULL;
    found = true;
  }
  gma__unlock(&p->lock);
  return found;
}

uint64_t gma__pool_reserved(gma__pool_t *p) {
  gma__lock(&p->lock, GMA__RANK_POOL);
  uint64_t reserved = p->c.reserved.current;
  gma__unlock(&p->lock);
  return reserved;
}

void gma__pool_note_pressure(gma__pool_t *p, int level) {
  gma__lock(&p->lock, GMA__RANK_POOL);
  p->c.pressure_level = level;
  gma__unlock(&p->lock);
}

void gma__pool_note_wakeup(gma__pool_t *p) {
  gma__lock(&p->lock, GMA__RANK_POOL);
  p->c.worker_wakeups++;
  gma__unlock(&p->lock);
}

bool gma__pool_poll_pending(gma__pool_t *p) {
  gma__lock(&p->lock, GMA__RANK_POOL);
  if (p->c.pending) {
    gma__streams_settle_pending(p, NULL);
    gma__stats_sample(p);
  }
  bool gated = p->c.pending != 0;
  gma__unlock(&p->lock);
  return gated;
}

gma__trace_t *gma__pool_trace_publish(gma__pool_t *p, gma__trace_t *t,
                                      void (*rows)(void *arg, gma__trace_t *t), void *arg) {
  /* Lock order (types.h): the pool's lock, then trace_mu, then the trace's
   * own locks (taken by each row). */
  gma__lock(&p->lock, GMA__RANK_POOL);
  rows(arg, t);
  gma__lock(&p->trace_mu, GMA__RANK_POOL_TRACE);
  gma__trace_t *old = gma__load_relaxed(&p->trace);
  t->older = p->traces;
  p->traces = t;
  gma__store_release(&p->trace, t);
  gma__unlock(&p->trace_mu);
  gma__unlock(&p->lock);
  return old;
}

gma__trace_t *gma__pool_trace_withdraw(gma__pool_t *p) {
  gma__lock(&p->trace_mu, GMA__RANK_POOL_TRACE);
  gma__trace_t *t = gma__load_relaxed(&p->trace);
  gma__store_release(&p->trace, NULL);
  gma__unlock(&p->trace_mu);
  return t;
}

bool gma__pool_fork_unlocked(gma__pool_t *p) {
  pthread_mutex_t *const mus[] = {&p->lock, &p->count_lock, &p->trace_mu};
  size_t n = sizeof mus / sizeof *mus;
  for (size_t i = 0; i < n; i++)
    if (pthread_mutex_trylock(mus[i]) != 0) {
      while (i-- > 0) pthread_mutex_unlock(mus[i]);
      return false;
    }
  for (size_t i = 0; i < n; i++) pthread_mutex_unlock(mus[i]);
  return true;
}
