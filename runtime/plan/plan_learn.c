/* Learning (plan.h): recording one iteration's allocations, per stream, with
 * their lifetimes in the iteration's event order, under the planner's mu. */
#include "plan/plan_internal.h"
#include "base/lock.h"

/* ---- Learning ----------------------------------------------------------------------- */

static size_t ptr_hash(uintptr_t k, size_t cap) {
  return (size_t)(((uint64_t)k * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}
#define MAP_EMPTY ((uintptr_t)0)
#define MAP_TOMB ((uintptr_t)1)

static bool map_put(gma__planner_t *pl, uintptr_t k, uint32_t v);

static bool map_rebuild(gma__planner_t *pl, size_t cap) {
  uintptr_t *ok = pl->map_key;
  uint32_t *ov = pl->map_val;
  size_t ocap = pl->map_cap;
  pl->map_key = calloc(cap, sizeof *pl->map_key);
  pl->map_val = malloc(cap * sizeof *pl->map_val);
  if (!pl->map_key || !pl->map_val) {
    free(pl->map_key);
    free(pl->map_val);
    pl->map_key = ok, pl->map_val = ov;
    return false;
  }
  pl->map_cap = cap;
  pl->map_used = 0;
  for (size_t i = 0; i < ocap; i++)
    if (ok[i] != MAP_EMPTY && ok[i] != MAP_TOMB) map_put(pl, ok[i], ov[i]);
  free(ok);
  free(ov);
  return true;
}

static bool map_put(gma__planner_t *pl, uintptr_t k, uint32_t v) {
  if ((pl->map_used + 1) * 2 > pl->map_cap && !map_rebuild(pl, pl->map_cap ? pl->map_cap * 2 : 1024))
    return false;
  size_t m = pl->map_cap - 1;
  for (size_t i = ptr_hash(k, pl->map_cap);; i = (i + 1) & m) {
    if (pl->map_key[i] == MAP_EMPTY || pl->map_key[i] == MAP_TOMB || pl->map_key[i] == k) {
      if (pl->map_key[i] == MAP_EMPTY) pl->map_used++;
      pl->map_key[i] = k;
      pl->map_val[i] = v;
      return true;
    }
  }
}

/* Removes k; its value, or UINT32_MAX when absent. */
static uint32_t map_take(gma__planner_t *pl, uintptr_t k) {
  if (!pl->map_cap) return UINT32_MAX;
  size_t m = pl->map_cap - 1;
  for (size_t i = ptr_hash(k, pl->map_cap);; i = (i + 1) & m) {
    if (pl->map_key[i] == MAP_EMPTY) return UINT32_MAX;
    if (pl->map_key[i] == k) {
      pl->map_key[i] = MAP_TOMB;
      return pl->map_val[i];
    }
  }
}

void gma__plan_learn_reset(gma__planner_t *pl) {
  pl->learn.n = 0;
  pl->clock = 0;
  pl->nseqs = 0;
  if (pl->map_cap) memset(pl->map_key, 0, pl->map_cap * sizeof *pl->map_key);
  pl->map_used = 0;
}

/* Drops what learning holds (mu). */
void gma__plan_learn_free(gma__planner_t *pl) {
  free(pl->learn.v);
  free(pl->prev.v);
  free(pl->map_key);
  free(pl->map_val);
  memset(&pl->learn, 0, sizeof pl->learn);
  memset(&pl->prev, 0, sizeof pl->prev);
  pl->map_key = NULL, pl->map_val = NULL;
  pl->map_cap = pl->map_used = 0;
  pl->clock = 0;
  free(pl->seq_key);
  free(pl->seq_next);
  pl->seq_key = NULL, pl->seq_next = NULL;
  pl->nseqs = pl->seqs_cap = 0;
}

/* Stops learning for a while (mu): the workload does not repeat, is too
 * large to learn, or its plan could not be made. */
void gma__plan_back_off(gma__planner_t *pl) {
  gma__plan_learn_reset(pl); /* the buffers stay for the next attempt */
  pl->prev.n = 0;
  pl->skip = pl->backoff;
  pl->matches = 0;
  pl->backoff = pl->backoff * 2 > MAX_BACKOFF ? MAX_BACKOFF : pl->backoff * 2;
  pl->failures = 0;
  gma__store_relaxed(&pl->state, GMA__PLAN_OFF);
}

void gma__plan_note_alloc(gma__planner_t *pl, void *ptr, size_t size, gma_stream_t stream) {
  int st = gma__load_relaxed(&pl->state);
  if (st != GMA__PLAN_LEARNING && st != GMA__PLAN_VERIFYING) return;
  uint64_t owner;
  uintptr_t key = gma__stream_key(stream, &owner);
  gma__lock(&pl->mu, GMA__RANK_PLAN);
  st = gma__load_relaxed(&pl->state);
  if (st == GMA__PLAN_LEARNING || st == GMA__PLAN_VERIFYING) {
    gma__plan_iter_t *it = &pl->learn;
    if (it->n == it->cap) {
      size_t cap = it->cap ? it->cap * 2 : 1024;
      gma__plan_rec_t *v = cap <= MAX_RECS ? realloc(it->v, cap * sizeof *v) : NULL;
      if (!v) {
        gma__plan_back_off(pl); /* too many to learn, or no host memory: try later */
        gma__unlock(&pl->mu);
        return;
      }
      it->v = v, it->cap = cap;
    }
    uint32_t k = 0; /* this stream's requests so far (a handful of streams: a scan) */
    while (k < pl->nseqs && pl->seq_key[k] != key) k++;
    if (k == pl->nseqs) {
      if (k == pl->seqs_cap) {
        uint32_t cap = k ? 2 * k : 8;
        uintptr_t *a = realloc(pl->seq_key, cap * sizeof *a);
        uint32_t *b = a ? realloc(pl->seq_next, cap * sizeof *b) : NULL;
        if (a) pl->seq_key = a;
        if (!b) {
          gma__plan_back_off(pl);
          gma__unlock(&pl->mu);
          return;
        }
        pl->seq_next = b, pl->seqs_cap = cap;
      }
      pl->seq_key[k] = key, pl->seq_next[k] = 0, pl->nseqs++;
    }
    uint32_t seq = pl->seq_next[k]++;
    it->v[it->n] =
        (gma__plan_rec_t){key, round512(size), pl->clock++, UINT32_MAX, seq, gma__thread_id()};
    if (!map_put(pl, (uintptr_t)ptr, (uint32_t)it->n)) gma__plan_back_off(pl);
    else it->n++;
  }
  gma__unlock(&pl->mu);
}

void gma__plan_note_free(gma__planner_t *pl, void *ptr) {
  int st = gma__load_relaxed(&pl->state);
  if (st != GMA__PLAN_LEARNING && st != GMA__PLAN_VERIFYING) return;
  gma__lock(&pl->mu, GMA__RANK_PLAN);
  st = gma__load_relaxed(&pl->state);
  if (st == GMA__PLAN_LEARNING || st == GMA__PLAN_VERIFYING) {
    uint32_t i = map_take(pl, (uintptr_t)ptr);
    if (i != UINT32_MAX) pl->learn.v[i].end = pl->clock++;
  }
  gma__unlock(&pl->mu);
}

