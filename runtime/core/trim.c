/* Owns trimming: what a release gives back (idle memory first, then the largest
 * while the budget allows), ordinary segments' release, and growth ahead of demand
 * for the worker. Every function here runs under gma__pool_t.lock (core/types.h)
 * unless it says otherwise. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/round.h"
#include "base/lock.h"
#include "base/sizeclass.h"
#include "core/internal.h"

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
  return !seg->range && gma__state_of(seg->first) == GMA__FREE && seg->first->size == seg->size;
}

/* Gives detached ordinary segments back to the device with the lock dropped
 * (cuMemFree waits for the whole device: no other caller waits behind it;
 * but not while p->keep_lock: a batch holds taken blocks),
 * then settles them: what the device would not take goes back to the pool.
 * Meanwhile their bytes are p->leaving, so growth counts them against the
 * limit and an allocation that finds no room waits for them (gma__oom_wait).
 * Returns the bytes the device took. */
static uint64_t give_back_unlocked(gma__pool_t *p, gma__span_t *out, size_t n) {
  uint64_t leaving = 0, freed = 0;
  for (size_t i = 0; i < n; i++) leaving += out[i].size;
  if (!n) return 0;
  p->leaving += leaving;
  GMA__VALIDATE(p);
  bool unlock = !p->keep_lock;
  if (unlock) p->uncaptured = NULL; /* a capture may begin while the lock is dropped */
  if (unlock) gma__unlock(&p->lock);
  for (size_t i = 0; i < n; i++) p->src->ops->give_back(p->src, &out[i]);
  if (unlock) gma__lock(&p->lock, GMA__RANK_POOL);
  for (size_t i = 0; i < n; i++) {
    p->src->ops->settle(p->src, &out[i]);
    p->c.device_frees += out[i].calls;
    if (out[i].done == out[i].size) freed += out[i].size;
    else gma__seg_adopt(p, out[i].kind, out[i].addr, out[i].size, 0, NULL);
  }
  p->c.bytes_trimmed += freed;
  p->leaving -= leaving;
  pthread_cond_broadcast(&p->settled);
  return freed;
}

static uint64_t sizeof_spans(const gma__span_t *x, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; i++) sum += x[i].size;
  return sum;
}

/* Lock held: what growth can get now, the device's free memory or the room
 * below memory_limit, whichever is less (0 when the device cannot say). */
static uint64_t available(gma__pool_t *p) {
  uint64_t dev_free = 0, dev_total = 0;
  if (p->dev->ops->mem_info(p->dev, &dev_free, &dev_total) != GMA_OK) return 0;
  uint64_t room = gma__pool_room(p);
  return dev_free < room ? dev_free : room;
}

static int by_size_desc(const void *a, const void *b) {
  uint64_t x = (*(gma__segment_t *const *)a)->size, y = (*(gma__segment_t *const *)b)->size;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* Lock held (dropped while the device frees): the OOM retry's release of
 * ordinary segments, only what growth of need bytes lacks. Candidates are
 * the whole FREE segments (one that could hold the request was not found
 * for it: another kind's); the largest go first, so that the fewest device
 * frees (each waits for the whole device) cover the shortfall. When the device says it has room and still refused, need
 * bytes are released as if it had none; when the candidates cannot cover
 * the shortfall, all of them go. Returns how many went (0: the lock was
 * never dropped). */
static size_t release_for(gma__pool_t *p, uint64_t need) {
  size_t n = 0;
  gma__segment_t **cand = malloc((p->nsegs ? p->nsegs : 1) * sizeof *cand);
  if (!cand) return 0;
  for (size_t i = 0; i < p->nsegs; i++)
    if (seg_is_free(p->segs[i])) cand[n++] = p->segs[i];
  qsort(cand, n, sizeof *cand, by_size_desc);
  uint64_t avail = available(p), shortfall = need > avail ? need - avail : need, sum = 0;
  size_t take = 0;
  while (take < n && sum < shortfall) sum += cand[take++]->size;
  gma__span_t *out = take ? malloc(take * sizeof *out) : NULL;
  size_t k = 0;
  for (size_t t = 0; out && t < take; t++) {
    size_t i = gma__seg_index_at_or_before(p, cand[t]->base) - 1;
    GMA__ASSERT(p->segs[i] == cand[t]);
    seg_detach(p, i, &out[k++]);
  }
  free(cand);
  give_back_unlocked(p, out, k);
  free(out);
  return k;
}

/* Lock held (dropped while the device frees): gives ordinary segment seg,
 * one FREE block, back to the device. */
void gma__release_whole(gma__pool_t *p, gma__segment_t *seg) {
  size_t i = gma__seg_index_at_or_before(p, seg->base) - 1;
  GMA__ASSERT(p->segs[i] == seg && seg_is_free(seg));
  gma__span_t x;
  seg_detach(p, i, &x);
  give_back_unlocked(p, &x, 1);
}

/* The OOM retry's release for growth of need bytes: growable ranges unmap
 * their free chunks into the handle pool, which the retry's growth maps
 * where it needs them; ordinary segments give back only what is missing
 * (release_for). True when the lock was dropped meanwhile. */
bool gma__release_free_segments(gma__pool_t *p, uint64_t need) {
  if (p->growable) gma__segs_release_free(p);
  return release_for(p, need) > 0;
}

/* Lock held: segment i is free; has it been unused at least idle_ns (0:
 * any time)? A segment's clock starts when a trim pass first sees it wholly
 * free, and stops whenever a block of it is handed out (take_block). */
static bool seg_unused(gma__segment_t *seg, uint64_t now_ns, uint64_t idle_ns) {
  if (!seg->free_since_ns) seg->free_since_ns = now_ns;
  return now_ns - seg->free_since_ns >= idle_ns;
}

/* Lock held: the ordinary segment a trim pass takes next (SIZE_MAX: none).
 * Pass 0: one idle longer than idle_ns; pass 1: the one that brings the
 * cache nearest the budget's keep (gma__trim_prefer). */
static size_t trim_pick(gma__pool_t *p, const gma__release_t *r, gma__trim_budget_t *bud,
                        int pass) {
  size_t pick = SIZE_MAX;
  for (size_t i = 0; i < p->nsegs; i++) {
    gma__segment_t *seg = p->segs[i];
    if (!seg_is_free(seg)) {
      seg->free_since_ns = 0;
      continue;
    }
    bool ok = pass == 0 ? r->idle_ns && seg_unused(seg, r->now_ns, r->idle_ns)
                        : seg_unused(seg, r->now_ns, r->unused_ns) &&
                              gma__trim_prefer(bud, seg->size,
                                               pick == SIZE_MAX ? 0 : p->segs[pick]->size);
    if (ok) {
      pick = i;
      if (pass == 0) break;
    }
  }
  return pick;
}

/* Lock held: detaches what a release takes from the ordinary segments, the
 * idle ones first (the first *n_idle of *out). Returns how many. */
static size_t trim_detach(gma__pool_t *p, const gma__release_t *r, gma__trim_budget_t *bud,
                          gma__span_t **out, size_t *n_idle) {
  size_t n = 0, cap = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (;;) {
      if (pass == 1 && gma__trim_done(bud)) break;
      size_t pick = trim_pick(p, r, bud, pass);
      if (pick == SIZE_MAX) break;
      if (n == cap) {
        cap = cap ? cap * 2 : 16;
        gma__span_t *a = realloc(*out, cap * sizeof *a);
        if (!a) break;
        *out = a;
      }
      seg_detach(p, pick, &(*out)[n]);
      gma__trim_took(bud, (*out)[n].size, pass == 1);
      n++;
      *n_idle += pass == 0;
    }
  }
  return n;
}

/* Lock held: counts a release that gave back freed bytes (freed_idle of them
 * idle) and traces it: explicit trims are replayed (they also settle
 * streams), timed ones only shown; Count carries an explicit trim's keep. */
static void trim_count(gma__pool_t *p, const gma__release_t *r, uint64_t freed,
                       uint64_t freed_idle) {
  if (r->timed) {
    p->c.trims_idle += freed_idle > 0;
    p->c.trims_timed += freed > freed_idle;
    p->c.trims_pressure += freed > 0 && r->pressured;
  } else {
    p->c.trims_explicit += freed > 0;
  }
  if (!r->timed || freed)
    GMA__TRACE(p, GMA__TR_TRIM, 0, freed, 0, 0, 0, r->timed ? 0 : r->keep,
               !r->timed ? GMA__TRIM_EXPLICIT : r->pressured ? GMA__TRIM_PRESSURE
                                                              : GMA__TRIM_TIMED);
}

gma_status_t gma__pool_release(gma__pool_t *p, const gma__release_t *r) {
  gma__lock(&p->lock, GMA__RANK_POOL);
  gma__streams_poll(p, true);
  gma__stats_sample(p);
  /* The handle pool first: kept chunks are memory no segment uses; what
   * the device refuses stays kept (the trim says so). */
  uint64_t kept = p->growable ? gma__segs_free_kept(p) : 0;
  bool kept_refused = p->src->kept_chunks > 0;
  /* Detach the chosen free segments under the lock; give them back after
   * unlocking, so a slow device free (cuMemFree synchronizes) never holds up
   * other callers. First those idle too long, then until at most keep bytes
   * of cache (reserved - allocated) stay. */
  gma__trim_budget_t bud = {
      .keep = r->keep, .want = r->want, .cached = p->c.reserved.current - p->c.allocated.current};
  gma__span_t *out = NULL, *spans = NULL;
  size_t n_idle = 0, nr = 0, nr_idle = 0;
  size_t n = trim_detach(p, r, &bud, &out, &n_idle);
  /* Growable segments: the chunks inside FREE blocks, by the same rules. */
  if (p->growable) nr = gma__segs_pick(p, r, &bud, &spans, &nr_idle);
  /* Out of reserved now, but the device still holds it until the calls
   * below return: growth counts it against the limit meanwhile, and an
   * allocation that finds no room waits for it (gma__oom_wait). */
  uint64_t leaving = sizeof_spans(spans, nr), ordinary = sizeof_spans(out, n);
  p->leaving += leaving + ordinary;
  GMA__VALIDATE(p);
  gma__unlock(&p->lock);
  gma_status_t st = kept_refused ? GMA_ERR_DEVICE : GMA_OK; /* message kept */
  uint64_t freed = kept, freed_idle = 0;
  for (size_t i = 0; i < nr; i++) {
    p->src->ops->give_back(p->src, &spans[i]);
    if (spans[i].done < spans[i].size) st = GMA_ERR_DEVICE; /* message kept */
    if (i < nr_idle) freed_idle += spans[i].done;
  }
  gma__lock(&p->lock, GMA__RANK_POOL);
  /* The ordinary segments (give_back_unlocked counts them as leaving while
   * the lock is dropped again); the first n_idle were taken as idle. */
  p->leaving -= ordinary;
  uint64_t took = give_back_unlocked(p, out, n);
  if (took < ordinary) st = GMA_ERR_DEVICE; /* kept, back in the pool */
  freed += took;
  for (size_t i = 0; i < n_idle; i++) freed_idle += out[i].done == out[i].size ? out[i].size : 0;
  for (size_t i = 0; i < nr; i++) {
    uint64_t done = spans[i].done;
    gma__segs_finish(p, &spans[i]); /* counts frees and bytes itself */
    freed += done;
  }
  free(spans);
  p->leaving -= leaving;
  if (leaving) pthread_cond_broadcast(&p->settled);
  trim_count(p, r, freed, freed_idle);
  gma__unlock(&p->lock);
  free(out);
  return st;
}

gma_status_t gma__pool_trim(gma__pool_t *p, uint64_t keep) {
  gma__release_t r = {.keep = keep};
  return gma__pool_release(p, &r);
}

gma_status_t gma__pool_grow_ahead(gma__pool_t *p, uint64_t want_free) {
  gma_status_t st = GMA_OK;
  gma__lock(&p->lock, GMA__RANK_POOL);
  if (p->c.free < want_free) {
    gma__block_t *b;
    uint64_t size = p->segment_size[GMA__LARGE];
    if (want_free - p->c.free > size) size = gma__round_up(want_free - p->c.free, GMA__SEGMENT_ROUND);
    st = p->growable ? gma__segs_grow(p, GMA__LARGE, want_free - p->c.free, NULL, NULL)
                     : gma__seg_create(p, GMA__LARGE, size, 0, &b);
    if (st == GMA_OK) p->c.grows_worker++;
  }
  GMA__VALIDATE(p);
  gma__unlock(&p->lock);
  return st;
}

/* Largest idle block in the stream trees and free trees (bins not included:
 * their blocks have class sizes and are reused as they are); lock held. */
uint64_t gma__pool_largest_idle(const gma__pool_t *p) {
  uint64_t best = 0;
  for (int k = 0; k < GMA__NKINDS; k++) {
    uint64_t m = gma__treap_max_size(p->free_tree[k]);
    if (m > best) best = m;
    for (const gma__stream_t *s = p->stream_list; s; s = s->next_all) {
      m = gma__treap_max_size(s->cached_tree[k]);
      if (m > best) best = m;
    }
  }
  return best;
}
