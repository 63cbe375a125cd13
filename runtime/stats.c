/* Owns the statistics arithmetic (current/peak/total updates) and the
 * snapshot handed to callers by gma_stats. */
#include <string.h>

#include "pool.h"

void gma__stat_add(gma_stat_t *s, uint64_t bytes) {
  s->current += bytes;
  s->total += bytes;
  if (s->current > s->peak) s->peak = s->current;
}

void gma__stat_sub(gma_stat_t *s, uint64_t bytes) {
  GMA__ASSERT(s->current >= bytes);
  s->current -= bytes;
}

void gma__pool_stats(gma__pool_t *p, gma_stats_t *out) {
  gma_stats_t st;
  memset(&st, 0, sizeof st);
  pthread_mutex_lock(&p->lock);
#if GMA_DEBUG >= 1
  GMA__ASSERT(gma__pool_is_valid(p));
#endif
  const gma__counters_t *c = &p->c;
  st.allocated = c->allocated;
  st.requested = c->requested;
  st.reserved = c->reserved;
  st.active = c->active;
  st.cached = c->cached;
  st.stream_cached_bytes = c->stream_cached;
  st.pending_bytes = c->pending;
  st.free_bytes = c->free;
  st.num_allocs = c->allocs;
  st.num_frees = c->frees;
  st.num_device_allocs = c->device_allocs;
  st.num_device_frees = c->device_frees;
  st.num_ooms = c->ooms;
  st.num_oom_retries = c->oom_retries;
  st.hits_stream = c->hits_stream;
  st.hits_pool = c->hits_pool;
  st.hits_device = c->hits_device;
  st.num_segments = p->nsegs;
  st.largest_free_block = gma__pool_largest_idle(p);
  pthread_mutex_unlock(&p->lock);
  uint64_t idle = st.stream_cached_bytes + st.free_bytes;
  st.fragmentation = idle ? 1.0 - (double)st.largest_free_block / (double)idle : 0.0;
  /* Copy only what the caller's (possibly older, smaller) struct holds. */
  size_t n = out->size < sizeof st ? out->size : sizeof st;
  st.size = out->size;
  memcpy(out, &st, n);
}
