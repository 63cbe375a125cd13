/* Owns statistics: current/peak/total arithmetic, summing the per-(stream,
 * thread) counters written by the lock-free paths, sampled peaks, and the
 * snapshots handed to callers by gma_stats and gma_stream_stats. */
#include <string.h>

#include "core/internal.h"
#include "base/lock.h"

void gma__stat_add(gma_stat_t *s, uint64_t bytes) {
  s->current += bytes;
  s->total += bytes;
  if (s->current > s->peak) s->peak = s->current;
}

void gma__stat_sub(gma_stat_t *s, uint64_t bytes) {
  GMA__ASSERT(s->current >= bytes);
  s->current -= bytes;
}

/* Sums are gma__tcount_t values used as plain numbers (never shared). */
typedef gma__tcount_t sums_t;

/* t += sign * c for one counter (sign +1 or -1; unsigned arithmetic wraps
 * the way a subtraction would). */
static void add(_Atomic uint64_t *to, _Atomic uint64_t *from, uint64_t sign) {
  gma__store_relaxed(to, gma__load_relaxed(to) + sign * gma__load_relaxed(from));
}

/* Adds (sign +1) or subtracts (sign -1) one block of counters to *t. Relaxed
 * loads: each counter is exact, the set is as consistent as the calls in
 * flight allow. */
static void fold(gma__tcount_t *c, gma__tcount_t *t, uint64_t sign) {
  add(&t->allocs, &c->allocs, sign);
  add(&t->frees, &c->frees, sign);
  add(&t->hits, &c->hits, sign);
  add(&t->alloc_bytes, &c->alloc_bytes, sign);
  add(&t->free_bytes, &c->free_bytes, sign);
  add(&t->req_bytes, &c->req_bytes, sign);
  add(&t->req_freed, &c->req_freed, sign);
  add(&t->bin_in, &c->bin_in, sign);
  add(&t->bin_out, &c->bin_out, sign);
  add(&t->inner_bytes, &c->inner_bytes, sign);
  add(&t->inner_freed, &c->inner_freed, sign);
}

void gma__stats_sum(const gma__stream_t *s, gma__tcount_t *t) {
  for (gma__tcount_t *c = gma__load_acquire(&((gma__stream_t *)s)->counts); c;
       c = gma__load_acquire(&c->next))
    fold(c, t, 1);
}

/* The graveyard gains what s counted since it was last buried. */
void gma__stats_bury(gma__stream_t *s, gma__tcount_t *into) {
  gma__tcount_t now;
  memset(&now, 0, sizeof now);
  gma__stats_sum(s, &now);
  fold(&now, into, 1);
  fold(&s->buried, into, (uint64_t)-1);
  memcpy(&s->buried, &now, sizeof now);
}

static sums_t sum_all(gma__pool_t *p) {
  sums_t t;
  memset(&t, 0, sizeof t);
  fold(&p->graveyard_counts, &t, 1); /* retired streams' totals, folded in at the sweep */
  for (const gma__stream_t *s = p->stream_list; s; s = s->next_all) gma__stats_sum(s, &t);
  return t;
}

#define V(x) gma__load_relaxed(&(x))

/* A sampled peak: allocations served by the bins raise allocated without the
 * lock, so peaks are taken here, at every locked allocation and read. */
static void sample(gma_stat_t *st, uint64_t current, uint64_t total) {
  st->current = current;
  st->total = total;
  if (current > st->peak) st->peak = current;
}

/* The plan's arenas are LIVE blocks to the pool, but callers see the
 * allocations inside them (counted by plan.c like any other): the arenas
 * themselves come out of every sum here. */
static void sample_from(gma__pool_t *p, sums_t *t) {
  const gma__counters_t *c = &p->c;
  uint64_t allocated = V(t->alloc_bytes) - V(t->free_bytes) - c->arena;
  uint64_t total = V(t->alloc_bytes) - c->arena_total;
  sample(&p->c.allocated, allocated, total);
  uint64_t inner = V(t->inner_bytes) - V(t->inner_freed);
  p->c.inner_live = inner < allocated ? inner : allocated; /* sums in flight may run ahead */
  sample(&p->c.requested, V(t->req_bytes) - V(t->req_freed) - c->arena,
         V(t->req_bytes) - c->arena_total);
  sample(&p->c.active, allocated + p->c.pending, total);
  /* Cached (reserved - allocated) peaks after frees, which the bins make
   * without the lock: sampled like the others, so its peak is the highest
   * seen at a locked operation or read (a trim's look before it releases
   * included), never more than was held. */
  uint64_t reserved = c->reserved.current;
  /* Its total: what ever came into the cache, the bytes freed and the
   * bytes reserved (a new segment's memory is cache until handed out), so
   * never below current (the frees alone were: 20 MiB against 37 MiB
   * cached, the rest of new segments). */
  sample(&p->c.cached, reserved > allocated ? reserved - allocated : 0,
         V(t->free_bytes) - (c->arena_total - c->arena) + c->reserved.total);
}

void gma__stats_sample(gma__pool_t *p) {
  sums_t t = sum_all(p);
  sample_from(p, &t);
}

/* Pool lock held. gma_stats_t.fragmentation (docs/stats.md): the share of
 * the idle bytes (free, cached on a stream, binned) that lie in free regions
 * too small for a typical request. A free region is a run of adjacent idle
 * blocks in one segment (gma merges them when it needs the room); a typical
 * request is the median live block size, rounded down to a power of two (so
 * memory that could serve it is never counted as wasted). 0 with nothing
 * idle, or nothing live (no request to measure against). Arenas (planned
 * memory, graph pools) are not requests and are left out of the median. */
static double fragmentation(const gma__pool_t *p) {
  uint64_t hist[64] = {0}, nlive = 0;
  for (size_t i = 0; i < p->nsegs; i++)
    for (const gma__block_t *b = p->segs[i]->first; b; b = b->next)
      if (gma__load_relaxed(&((gma__block_t *)b)->state) == GMA__LIVE &&
          !gma__load_relaxed(&((gma__block_t *)b)->arena) && b->size) {
        hist[63 - __builtin_clzll(b->size)]++;
        nlive++;
      }
  if (!nlive) return 0.0;
  uint64_t ref = 0, seen = 0;
  for (int k = 0; k < 64 && !ref; k++)
    if ((seen += hist[k]) >= (nlive + 1) / 2) ref = (uint64_t)1 << k;
  uint64_t idle = 0, small = 0;
  for (size_t i = 0; i < p->nsegs; i++) {
    uint64_t run = 0;
    for (const gma__block_t *b = p->segs[i]->first;; b = b->next) {
      uint8_t st = b ? gma__load_relaxed(&((gma__block_t *)b)->state) : GMA__LIVE;
      if (st == GMA__FREE || st == GMA__CACHED || st == GMA__BINNED) {
        run += b->size;
        continue;
      }
      idle += run;
      if (run < ref) small += run;
      run = 0;
      if (!b) break;
    }
  }
  return idle ? (double)small / (double)idle : 0.0;
}

void gma__pool_stats(gma__pool_t *p, gma_stats_t *out) {
  gma_stats_t st;
  memset(&st, 0, sizeof st);
  gma__lock(&p->lock, GMA__RANK_POOL);
#if GMA_DEBUG >= 1
  GMA__ASSERT(gma__pool_is_valid(p));
#endif
  sums_t t = sum_all(p);
  sample_from(p, &t);
  const gma__counters_t *c = &p->c;
  st.allocated = c->allocated;
  st.requested = c->requested;
  st.reserved = c->reserved;
  st.active = c->active;
  st.cached = c->cached;
  st.stream_cached_bytes = c->stream_cached + (V(t.bin_in) - V(t.bin_out));
  st.pending_bytes = c->pending;
  st.free_bytes = c->free;
  st.num_allocs = V(t.allocs) - c->arena_allocs;
  st.num_frees = V(t.frees) - c->arena_frees;
  st.num_device_allocs = c->device_allocs;
  st.num_device_frees = c->device_frees;
  st.num_ooms = c->ooms;
  st.num_oom_retries = c->oom_retries;
  st.num_oom_waits = c->oom_waits;
  st.hits_bin = V(t.hits);
  st.hits_stream = c->hits_stream;
  st.hits_pool = c->hits_pool;
  st.hits_device = c->hits_device;
  st.num_segments = p->nsegs;
  st.largest_free_block = gma__pool_largest_idle(p);
  for (const gma__stream_t *s = p->stream_list; s; s = s->next_all)
    st.num_streams += !gma__load_relaxed(&((gma__stream_t *)s)->retired);
  st.num_cross_stream_waits = c->cross_stream_waits;
  st.num_epoch_events = c->epoch_events;
  st.num_batches = c->batches;
  st.num_batches_split = c->batches_split;
  st.bytes_trimmed = c->bytes_trimmed + p->src->kept_freed_bytes;
  st.trims_explicit = c->trims_explicit;
  st.trims_timed = c->trims_timed;
  st.trims_idle = c->trims_idle;
  st.trims_pressure = c->trims_pressure;
  st.grows_worker = c->grows_worker;
  st.grows_inline = c->grows_inline;
  st.worker_wakeups = c->worker_wakeups;
  st.pressure_level = c->pressure_level;
  st.fragmentation = fragmentation(p);
  st.address_ranges = p->src->ranges;
  st.address_reserved_bytes = p->src->range_bytes;
  st.kept_bytes = p->src->kept_bytes;
  st.kept_chunks = p->src->kept_chunks;
  st.num_device_remaps = c->device_remaps;
  st.num_device_keeps = c->device_keeps;
  st.num_kept_frees = p->src->kept_frees;
  gma__unlock(&p->lock);
  /* Copy only what the caller's (possibly older, smaller) struct holds. */
  size_t n = out->size < sizeof st ? out->size : sizeof st;
  st.size = out->size;
  memcpy(out, &st, n);
}

gma_status_t gma__pool_stream_stats(gma__pool_t *p, gma_stream_t stream, gma_stream_stats_t *out) {
  gma_stream_stats_t st;
  memset(&st, 0, sizeof st);
  gma__lock(&p->lock, GMA__RANK_POOL);
  gma__stream_t *s = gma__stream_find(p, stream);
  if (!s) {
    gma__unlock(&p->lock);
    return gma__set_error(GMA_ERR_INVALID_ARGUMENT,
                          "gma_stream_stats(%p): gma has no record of this stream (never used "
                          "with gma, or retired)",
                          stream);
  }
  sums_t t;
  memset(&t, 0, sizeof t);
  gma__stats_sum(s, &t);
  st.allocs = V(t.allocs);
  st.frees = V(t.frees);
  st.hits = V(t.hits);
  st.misses = V(t.allocs) - V(t.hits);
  st.allocated_bytes = V(t.alloc_bytes) - V(t.free_bytes);
  st.cached_bytes = s->cached_bytes + (V(t.bin_in) - V(t.bin_out));
  st.epoch = gma__load_relaxed(&s->epoch);
  st.safe_epoch = s->safe_epoch;
  gma__unlock(&p->lock);
  size_t n = out->size < sizeof st ? out->size : sizeof st;
  st.size = out->size;
  memcpy(out, &st, n);
  return GMA_OK;
}
